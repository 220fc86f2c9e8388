"""Database faults in the middle of a poll or a run (docs/design.md#delivery-modes-and-crashes).

A fault is injected where the database would fail (``OperationalError`` from a store call);
the tests then check what a worker that lives through the outage does: it keeps what it
knows, writes it once the database is back, never hands a row twice, and never leaves a
delivered row DEAD.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import OperationalError

from jobs_engine import conf, store
from jobs_engine.enqueueing import enqueue
from jobs_engine.job import Job
from jobs_engine.lanes import outcomes
from jobs_engine.lanes.long import LongLane
from jobs_engine.lanes.outage import Outages, backoff_s, is_database_fault
from jobs_engine.lanes.pauses import PauseGate
from jobs_engine.models import Job as JobModel
from jobs_engine.models import Worker
from jobs_engine.states import DeliveryMode, JobStatus, Lane
from jobs_engine.store.connection import fetch
from tests.db.test_fast_lane import keys_in, make_worker
from tests.helpers import FakeMonotonic, in_flight

pytestmark = pytest.mark.django_db

SECOND = timedelta(seconds=1)


def fail_once(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, *, after: bool = False,
              times: int = 1) -> list[int]:
    """Make ``module.name`` raise ``OperationalError`` ``times`` times; ``after``: only
    once the real call has run (its statement committed, the answer lost)."""
    real = getattr(module, name)
    failures: list[int] = []

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if len(failures) < times:
            failures.append(1)
            if after:
                real(*args, **kwargs)
            raise OperationalError("server closed the connection unexpectedly")
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, flaky)
    return failures


def put(target: str, at: datetime, key: str) -> int:
    result = enqueue(target, {"k": key}, key=key, run_at=at)
    assert result.job_id is not None
    return result.job_id


def recorder(calls: list[int]) -> Callable[[Job], None]:
    def handler(job: Job) -> None:
        assert job.id is not None
        calls.append(job.id)

    return handler


# -- the fast lane -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [DeliveryMode.AT_MOST_ONCE, DeliveryMode.AT_LEAST_ONCE])
def test_outcomes_a_fault_kept_are_written_first_and_no_row_is_sent_twice(
        targets: Any, now: datetime, monkeypatch: pytest.MonkeyPatch, mode: DeliveryMode) -> None:
    calls: list[int] = []
    targets("fault.fast", handler=recorder(calls), delivery_mode=mode)
    ids = [put("fault.fast", now, key) for key in keys_in({5}, 3, "ff")]
    worker = make_worker("A")
    fail_once(monkeypatch, outcomes, "write", times=2)

    with pytest.raises(OperationalError):
        worker.run(now)  # sent, outcome write failed
    assert sorted(calls) == sorted(ids)
    assert worker.lane.unwritten_tokens()
    with pytest.raises(OperationalError):
        worker.run(now + SECOND)  # the write fails again: nothing is polled meanwhile
    assert sorted(calls) == sorted(ids)

    assert worker.run(now + 2 * SECOND) == 0  # written, then a poll that finds nothing
    assert sorted(calls) == sorted(ids)
    assert not JobModel.objects.filter(id__in=ids).exists()
    assert in_flight(5) == []
    assert not worker.lane.unwritten_tokens()


def test_marks_a_failed_read_may_have_made_are_cleared_before_the_next_poll(
        targets: Any, now: datetime, monkeypatch: pytest.MonkeyPatch) -> None:
    """The poll's read-and-mark committed but its answer was lost: the rows were never
    handed, so the marks are cleared (a takeover must not judge them) and they go out."""
    calls: list[int] = []
    targets("fault.read", handler=recorder(calls), delivery_mode=DeliveryMode.AT_LEAST_ONCE)
    job_id = put("fault.read", now, keys_in({6}, 1, "fr")[0])
    worker = make_worker("A")
    fail_once(monkeypatch, store, "jobs_fast_poll", after=True)

    with pytest.raises(OperationalError):
        worker.run(now)
    assert calls == []
    if store.is_postgres():  # the read marks in the same statement only on PostgreSQL
        assert in_flight(6) == [job_id]

    assert worker.run(now + SECOND) == 1
    assert calls == [job_id]
    assert in_flight(6) == []


def test_a_partition_taken_back_with_its_own_unwritten_mark_is_not_judged(
        targets: Any, now: datetime, monkeypatch: pytest.MonkeyPatch,
        dead_signals: list[dict[str, Any]]) -> None:
    """An outage longer than the lease: the worker takes its own partition back; its
    in-flight at-most-once row is not presumed DEAD, its real outcome is written."""
    calls: list[int] = []
    targets("fault.own", handler=recorder(calls))
    job_id = put("fault.own", now, keys_in({7}, 1, "fo")[0])
    worker = make_worker("A")
    fail_once(monkeypatch, outcomes, "write")
    with pytest.raises(OperationalError):
        worker.run(now)

    later = now + 31 * SECOND  # every lease of A has expired
    worker.clock.advance(31)
    counts = worker.leases.heartbeat(later)
    assert 7 in counts.taken and counts.closed == 0
    assert JobModel.objects.get(id=job_id).status == JobStatus.PENDING
    assert worker.lane.run_once(later) == 0
    assert calls == [job_id]
    assert not JobModel.objects.filter(id=job_id).exists()
    assert dead_signals == []


def test_a_late_outcome_replaces_a_takeover_presumed_dead(
        targets: Any, now: datetime, monkeypatch: pytest.MonkeyPatch) -> None:
    """B took A's partition while A could not reach the database and presumed A's
    in-flight at-most-once row DEAD; A, back, writes that it was delivered."""
    calls: list[int] = []
    targets("fault.late", handler=recorder(calls))
    job_id = put("fault.late", now, keys_in({8}, 1, "fl")[0])
    a = make_worker("A")
    fail_once(monkeypatch, outcomes, "write")
    with pytest.raises(OperationalError):
        a.run(now)

    make_worker("B").leases.heartbeat(now + 31 * SECOND)
    presumed = JobModel.objects.get(id=job_id)
    assert presumed.status == JobStatus.DEAD and "taken over" in presumed.last_error

    assert a.lane.write_unwritten(now + 32 * SECOND) == 1
    assert not JobModel.objects.filter(id=job_id).exists()  # delivered, recorded as such
    assert calls == [job_id]


def test_a_late_failure_outcome_reopens_a_presumed_dead_row(
        targets: Any, now: datetime, monkeypatch: pytest.MonkeyPatch) -> None:
    """What really happened wins over the presumption: an answered failure is retried."""
    def answered(job: Job) -> None:
        raise ValueError("answered 500")

    targets("fault.late-retry", handler=answered)
    job_id = put("fault.late-retry", now, keys_in({9}, 1, "flr")[0])
    a = make_worker("A")
    fail_once(monkeypatch, outcomes, "write")
    with pytest.raises(OperationalError):
        a.run(now)
    make_worker("B").leases.heartbeat(now + 31 * SECOND)
    assert JobModel.objects.get(id=job_id).status == JobStatus.DEAD

    a.lane.write_unwritten(now + 32 * SECOND)
    reopened = JobModel.objects.get(id=job_id)
    assert (reopened.status, reopened.attempts, reopened.closed_at) == (
        JobStatus.PENDING, 1, None)
    assert reopened.claim_token is None


# -- the long lane -------------------------------------------------------------------------


def long_lane(name: str, monotonic: FakeMonotonic, sleeps: list[float]) -> LongLane:
    settings = conf.jobs_settings()
    worker_id = f"{name}-{uuid.uuid4().hex[:6]}"
    return LongLane(worker_id, settings, PauseGate(worker_id, settings), threads=False,
                    monotonic=monotonic, sleep=sleeps.append,
                    outages=Outages(worker_id, monotonic, drop_connection=lambda: None))


def test_long_lane_writes_its_outcome_again_after_a_fault(
        targets: Any, now: datetime, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    targets("fault.long", handler=recorder(calls), lane="long")
    job_id = enqueue("fault.long", {}, run_at=now).job_id
    sleeps: list[float] = []
    lane = long_lane("A", FakeMonotonic(), sleeps)
    failures = fail_once(monkeypatch, outcomes, "write", times=3)

    assert lane.run_once(now) == 1
    assert calls == [job_id]
    assert len(failures) == 3 and sleeps == [backoff_s(1), backoff_s(2), backoff_s(3)]
    assert not JobModel.objects.filter(id=job_id).exists()
    assert lane.outages.record().count == 1 and not lane.outages.ongoing


def test_a_late_long_lane_outcome_replaces_a_rescue_presumed_dead(
        targets: Any, now: datetime) -> None:
    """A's handler finished during an outage longer than the lease; B's rescue presumed
    the at-most-once row DEAD; A's outcome, written once the database is back, wins."""
    calls: list[int] = []
    targets("fault.long-late", handler=recorder(calls), lane="long")
    job_id = enqueue("fault.long-late", {}, run_at=now).job_id
    settings = conf.jobs_settings()
    [reserved] = store.jobs_long_reserve("A", "tok-a", now, settings.LONG_LEASE_S, 1,
                                         targets=["fault.long-late"])
    assert store.jobs_long_mark_started([job_id], "tok-a", now) == {job_id: []}

    closed, _ = store.jobs_long_rescue_expired(now + 301 * SECOND)
    assert [c.id for c in closed] == [job_id]
    result = outcomes.RunResult(reserved.job, outcomes.Outcome.ok(), 5.0)
    written = outcomes.record(store.Guard(Lane.LONG, "tok-a"), [result],
                              now + 302 * SECOND, settings)
    assert written == [result]
    assert not JobModel.objects.filter(id=job_id).exists()


# -- outages as the worker sees them -------------------------------------------------------


def test_an_outage_is_logged_once_and_recorded_on_the_worker_row(
        now: datetime, caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeMonotonic()
    outages = Outages("w-outage", clock, drop_connection=lambda: None)
    for _ in range(5):
        outages.failed(OperationalError("connection refused"), "poll")
    clock.advance(12)
    outages.succeeded()
    outages.succeeded()
    lines = [r.getMessage() for r in caplog.records if "database" in r.getMessage()]
    assert len(lines) == 2
    assert "unreachable" in lines[0] and "connection refused" in lines[0]
    assert "reachable again" in lines[1] and "12.0 s" in lines[1]

    store.worker_beat("w-outage", now, hostname="h", pid=1, lanes="fast",
                      outages=outages.record())
    row = Worker.objects.get(worker_id="w-outage")
    assert (row.db_outages, row.last_db_outage_s) == (1, 12.0)
    assert row.last_db_error == "connection refused" and row.last_db_outage_at is not None


def test_database_faults_are_told_from_bugs() -> None:
    import psycopg
    from django.db import IntegrityError, InterfaceError

    assert is_database_fault(OperationalError("x"))
    assert is_database_fault(InterfaceError("connection already closed"))
    assert is_database_fault(psycopg.OperationalError("consuming input failed"))
    assert not is_database_fault(IntegrityError("duplicate key"))
    assert not is_database_fault(ValueError("a bug"))
    assert [backoff_s(n) for n in range(1, 7)] == [0.5, 1, 2, 4, 5, 5]


@pytest.mark.django_db(transaction=True)  # autocommit, as in a worker
def test_prepared_statements_share_the_sessions_cursor_and_a_new_session_gets_its_own() -> None:
    """``fetch(prepare=True)`` keeps one cursor per session (made once: its adapters
    and timestamptz loader); Django's wrapper still turns an error into Django's, the
    cursor serves on after it, and a reconnect gets a cursor of its new session."""
    from django.db import DataError, connection

    if connection.vendor != "postgresql":
        return  # SQLite statements are never prepared: nothing is kept
    assert fetch("SELECT clock_timestamp()", prepare=True)[0][0].tzinfo is not None
    kept = connection._jobs_engine_cursor
    assert fetch("SELECT %s::int + 1", [1], prepare=True) == [(2,)]
    assert connection._jobs_engine_cursor is kept and not kept.closed
    with pytest.raises(DataError):
        fetch("SELECT 1 / %s::int", [0], prepare=True)
    assert fetch("SELECT %s::int", [3], prepare=True) == [(3,)]
    connection.close()
    assert fetch("SELECT %s::int", [4], prepare=True) == [(4,)]
    assert connection._jobs_engine_cursor is not kept
    assert connection._jobs_engine_cursor.connection is connection.connection
