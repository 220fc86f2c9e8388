"""The outcome table (docs/design.md#outcomes), on both lanes: one code path decides what
a handler's result does to its row.

Each test runs on the fast lane and on the long lane, with a fixed decision time and a
fake monotonic clock so written times are exact.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction

from jobs_engine import RUN_ONCE_POLICY, JobPolicy, conf, store
from jobs_engine.enqueueing import enqueue
from jobs_engine.errors import DeadNow, TargetOutcomeUnknown, TargetUnreachable
from jobs_engine.job import Job
from jobs_engine.lanes.fast import FastLane
from jobs_engine.lanes.long import LongLane
from jobs_engine.lanes.partitions import PartitionLeases
from jobs_engine.lanes.pauses import PauseGate
from jobs_engine.models import CompletedJob, JobStatShard, TargetPause
from jobs_engine.models import Job as JobModel
from jobs_engine.states import DeliveryMode, JobStatus, Lane
from tests.helpers import FakeMonotonic

pytestmark = pytest.mark.django_db

SECOND = timedelta(seconds=1)
LANES = ["fast", "long"]
MODES = [DeliveryMode.AT_MOST_ONCE, DeliveryMode.AT_LEAST_ONCE]


def poller(lane: str) -> Callable[[datetime], int]:
    """One worker of ``lane``: a function that polls once at the given time."""
    settings = conf.jobs_settings()
    worker_id = f"{lane}-{uuid.uuid4().hex[:6]}"
    clock = FakeMonotonic()
    pauses = PauseGate(worker_id, settings)
    if lane == "long":
        return LongLane(worker_id, settings, pauses, threads=False, monotonic=clock).run_once
    leases = PartitionLeases(worker_id, settings, monotonic=clock)
    fast = FastLane(worker_id, settings, leases, pauses, monotonic=clock)
    store.partitions_seed(settings.PARTITIONS)

    def poll(at: datetime) -> int:
        leases.heartbeat(at)
        return fast.run_once(at)

    return poll


@pytest.fixture
def t0(now: datetime) -> datetime:
    return now




@pytest.fixture
def run_one(targets: Any, t0: datetime) -> Callable[..., JobModel | None]:
    """``run_one(lane, handler, **target_kwargs)``: register a target, enqueue one row due
    at ``t0``, poll once at ``t0`` and return the row afterwards (None once deleted)."""

    def run(lane: str, handler: Callable[[Job], None], **kwargs: Any) -> JobModel | None:
        name = f"oc.{lane}.{uuid.uuid4().hex[:6]}"
        targets(name, handler=handler, lane=lane, **kwargs)
        result = enqueue(name, {"n": 1}, dedupe_key=f"{name}:1", run_at=t0)
        assert poller(lane)(t0) == 1
        return JobModel.objects.filter(id=result.job_id).first()

    return run


def raises(exc: BaseException) -> Callable[[Job], None]:
    def handler(job: Job) -> None:
        raise exc

    return handler


def paused(target: str) -> TargetPause | None:
    return TargetPause.objects.filter(target=target).first()


@pytest.mark.parametrize("lane", LANES)
def test_returns_deletes_the_row_when_the_policy_keeps_none(run_one: Any, lane: str) -> None:
    assert run_one(lane, lambda job: None, policy=JobPolicy(keep_completed=0)) is None


@pytest.mark.django_db(transaction=True)  # autocommit, as in a worker
@pytest.mark.parametrize("keep", [0, 5])
def test_successes_of_one_target_are_written_in_one_statement_with_their_statistics(
        targets: Any, t0: datetime, keep: int) -> None:
    """PostgreSQL: the move (or delete) and the hourly statistics are one statement, with
    no transaction around it; SQLite: one transaction. Either way the counts are right."""
    name = f"oc.one.{keep}"
    targets(name, handler=lambda job: None, lane="long", policy=JobPolicy(keep_completed=keep))
    ids = [enqueue(name, {"n": n}, run_at=t0).job_id for n in range(3)]
    lane = LongLane("one-statement", conf.jobs_settings(), PauseGate("one-statement",
                    conf.jobs_settings()), threads=False, monotonic=FakeMonotonic())
    writes: list[tuple[str, bool]] = []

    def count(execute: Any, sql: str, *args: Any) -> Any:
        if store.JOB_STAT_SHARDS in sql:  # the outcome write: stats join it on PostgreSQL
            writes.append((sql.split()[0], transaction.get_autocommit()))
        return execute(sql, *args)

    with connection.execute_wrapper(count):
        assert lane.run_once(t0) == 3
    assert not JobModel.objects.filter(id__in=ids).exists()
    assert (name, "ok", 3) in store.job_stats_totals()
    # Without threads each job's outcome is written as its handler returns: three writes.
    if connection.vendor == "postgresql":
        assert writes == [("WITH", True)] * 3
    else:
        assert writes == [("INSERT", False)] * 3
    assert CompletedJob.objects.filter(target=name).count() == min(keep, 3)


def _kind(sql: str) -> str:
    """The lanes' statements a test of the lazy flush tells apart."""
    for prefix, kind in (("WITH due", "poll"), ("WITH mark(", "mark"),
                         ("WITH locked", "reserve")):
        if sql.startswith(prefix):
            return kind
    return "write" if "DELETE FROM" in sql else "other"


def _run_observing_flushes(run_once: Callable[[datetime], int], t0: datetime
                           ) -> list[tuple[str, bool]]:
    """Run a lane until idle; returns (kind, lazy) for every statement that wrote, lazy
    when its transaction committed without waiting for its WAL flush.

    Observed on the server, not read from the text, and blind to other sessions (their WAL
    moves the positions any time): each statement run outside a transaction runs in one
    opened here, which asks whether it wrote (an id was assigned) and which
    ``synchronous_commit`` its commit obeys. A commit that waits must then find the flush
    position past the insert position read before it. SQLite has no such setting: every
    statement, lazy when its text asks."""
    postgres = connection.vendor == "postgresql"
    raw = connection.connection
    seen: list[tuple[str, bool]] = []

    def observe(execute: Any, sql: str, *args: Any) -> Any:
        if not postgres:
            seen.append((_kind(sql), "synchronous_commit" in sql))
            return execute(sql, *args)
        own = transaction.get_autocommit() and not connection.in_atomic_block
        if own:
            raw.execute("BEGIN")
        try:
            result = execute(sql, *args)
        except BaseException:
            if own:
                raw.execute("ROLLBACK")
            raise
        wrote, lazy, before_commit = raw.execute(
            "SELECT pg_current_xact_id_if_assigned() IS NOT NULL, "
            "current_setting('synchronous_commit') = 'off', "
            "pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')").fetchone()
        if own:
            raw.execute("COMMIT")
            flushed = raw.execute(
                "SELECT pg_wal_lsn_diff(pg_current_wal_flush_lsn(), '0/0')").fetchone()[0]
            assert lazy or not wrote or flushed > before_commit, sql
        if wrote:
            seen.append((_kind(sql), lazy))
        return result

    with connection.execute_wrapper(observe):
        while run_once(t0):
            pass
    return seen


@pytest.mark.django_db(transaction=True)  # autocommit, as in a worker
@pytest.mark.parametrize(("lane", "mode", "exclusive", "setting", "lazy"), [
    ("fast", DeliveryMode.AT_LEAST_ONCE, False, True, {"poll", "write"}),
    ("long", DeliveryMode.AT_LEAST_ONCE, False, True, {"reserve", "write"}),
    ("long", DeliveryMode.AT_LEAST_ONCE, True, True, {"write"}),
    ("fast", DeliveryMode.AT_MOST_ONCE, False, True, set()),
    ("long", DeliveryMode.AT_MOST_ONCE, False, True, set()),
    ("fast", DeliveryMode.AT_LEAST_ONCE, False, False, set()),
    ("long", DeliveryMode.AT_LEAST_ONCE, False, False, set()),
])
def test_at_least_once_marks_reserves_and_successes_commit_without_waiting_for_the_flush(
        targets: Any, t0: datetime, lane: str, mode: DeliveryMode, exclusive: bool,
        setting: bool, lazy: set[str]) -> None:
    """The fast poll's mark, the long reserve and the write of successes of at-least-once
    rows commit without waiting for their WAL flush, for their own transaction only (the
    session's setting is untouched). Rows at most once, a reserve of an exclusive target's
    rows (its running code must outlive a crash), any other statement, and every one with
    the setting off, wait."""
    settings = dataclasses.replace(conf.jobs_settings(), LAZY_FLUSH_AT_LEAST_ONCE=setting)
    name = f"oc.flush.{lane}.{mode.value}.{exclusive}"
    extra = {"exclusive": True} if exclusive else {}
    targets(name, handler=lambda job: None, lane=lane, delivery_mode=mode,
            policy=JobPolicy(keep_completed=5), **extra)
    ids = [enqueue(name, {"n": n}, run_at=t0, code=f"c{n}").job_id for n in range(3)]
    clock = FakeMonotonic()
    pauses = PauseGate("flush", settings)
    if lane == "long":
        run_once = LongLane("flush", settings, pauses, threads=False, monotonic=clock).run_once
    else:
        leases = PartitionLeases("flush", settings, monotonic=clock)
        run_once = FastLane("flush", settings, leases, pauses, monotonic=clock).run_once
        store.partitions_seed(settings.PARTITIONS)
        leases.heartbeat(t0)
    postgres = connection.vendor == "postgresql"
    session_value = connection.cursor().execute("SHOW synchronous_commit").fetchone()[0] \
        if postgres else None
    seen = _run_observing_flushes(run_once, t0)
    assert not JobModel.objects.filter(id__in=ids).exists()
    assert CompletedJob.objects.filter(target=name).count() == 3
    if not postgres:  # SQLite: no statement asks
        assert seen and not any(was_lazy for _, was_lazy in seen)
        return
    expected = {"poll", "write"} if lane == "fast" else {"reserve", "write"}
    assert expected <= {kind for kind, _ in seen}
    assert {kind for kind, was_lazy in seen if was_lazy} == lazy
    assert all(was_lazy for kind, was_lazy in seen if kind in lazy)
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == session_value


@pytest.mark.django_db(transaction=True)
def test_a_polls_later_sends_mark_lazily_only_rows_at_least_once(
        targets: Any, t0: datetime) -> None:
    """A poll of three targets: its read marks the first target's rows, each later send
    marks its own. The marks of at-least-once rows (targets a and c) commit lazily, the
    at-most-once row's mark (target b), which a takeover judges, waits for its flush."""
    settings = conf.jobs_settings()
    for suffix, mode in (("a", DeliveryMode.AT_LEAST_ONCE), ("b", DeliveryMode.AT_MOST_ONCE),
                         ("c", DeliveryMode.AT_LEAST_ONCE)):
        targets(f"oc.marks.{suffix}", handler=lambda job: None, delivery_mode=mode)
        enqueue(f"oc.marks.{suffix}", {"n": 1}, run_at=t0)
    clock = FakeMonotonic()
    leases = PartitionLeases("marks", settings, monotonic=clock)
    fast = FastLane("marks", settings, leases, PauseGate("marks", settings), monotonic=clock)
    store.partitions_seed(settings.PARTITIONS)
    leases.heartbeat(t0)
    seen = _run_observing_flushes(fast.run_once, t0)
    marks = [was_lazy for kind, was_lazy in seen if kind in ("poll", "mark")]
    if connection.vendor == "postgresql":
        assert marks == [True, False, True]
    else:  # SQLite: a read, then a mark per send, none lazy
        assert marks == [False, False, False]
    assert not JobModel.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_no_statement_inside_a_callers_transaction_turns_its_flush_wait_off(
        targets: Any, t0: datetime) -> None:
    """The setting would reach the caller's own commit: inside one, a write of successes,
    a reserve and a poll's mark all wait."""
    targets("oc.flush.caller", handler=lambda job: None, lane="long",
            delivery_mode=DeliveryMode.AT_LEAST_ONCE)
    job_id = enqueue("oc.flush.caller", {"n": 1}, run_at=t0).job_id
    assert job_id is not None
    statements: list[str] = []

    def capture(execute: Any, sql: str, *args: Any) -> Any:
        statements.append(sql)
        return execute(sql, *args)

    guard = store.Guard(Lane.LONG, "no-claim")  # matches nothing: only the text matters
    with connection.execute_wrapper(capture), transaction.atomic():
        store.write_successes(guard, [store.Done(job_id, 0, None, t0, 1.0)], t0, keep=0,
                              count_as=(t0, "ok"), flush_lazily=True)
        reserved = store.jobs_long_reserve("caller", "caller-token", t0, 60, 10,
                                           targets=["oc.flush.caller"], flush_lazily=True)
        store.partitions_seed(8)
        store.jobs_fast_poll(range(8), t0, {"oc.flush.caller": 10}, owner="caller",
                             token="caller-token", flush_lazily=True)
    assert [r.job.id for r in reserved] == [job_id]
    assert statements and not any("synchronous_commit" in sql for sql in statements)


def test_a_fast_sends_kept_jobs_start_at_their_finish_less_their_share_of_the_send(
        targets: Any, t0: datetime) -> None:
    """The rows of one send share its duration, so one start time, made once for all of
    them: each kept job shows the send's finish less its share."""
    settings = conf.jobs_settings()
    clock = FakeMonotonic()
    name = "oc.fast.send"
    targets(name, handler=lambda job: clock.advance(0.004), lane="fast",
            delivery_mode=DeliveryMode.AT_LEAST_ONCE, policy=JobPolicy(keep_completed=5))
    for n in range(4):
        enqueue(name, {"n": n}, run_at=t0)
    leases = PartitionLeases("fast-send", settings, monotonic=clock)
    fast = FastLane("fast-send", settings, leases, PauseGate("fast-send", settings),
                    monotonic=clock)
    store.partitions_seed(settings.PARTITIONS)
    leases.heartbeat(t0)
    assert fast.run_once(t0) == 4
    kept = list(CompletedJob.objects.filter(target=name).values_list(
        "started_at", "finished_at", "duration_ms"))
    assert len(kept) == 4
    # Four rows in 16 ms: 4 ms each, started 4 ms before the write's time (t0 + 16 ms).
    assert [row[2] for row in kept] == pytest.approx([4.0] * 4)
    finished = t0 + timedelta(milliseconds=16)
    assert {(row[0], row[1]) for row in kept} == {(finished - timedelta(milliseconds=4),
                                                    finished)}


@pytest.mark.parametrize("keep", [0, 5])
def test_successes_whose_row_another_holder_changed_are_lost_and_the_rest_written_and_counted(
        targets: Any, t0: datetime, keep: int, caplog: pytest.LogCaptureFixture) -> None:
    """Successes alone are written as one statement (or, where the database cannot, one
    transaction of the store's) that reports a count. A row it did not match (changed
    meanwhile: another holder's now) is still in the table: that one is reported lost and
    left as it is; the others are written, counted in the statistics, and the poll's
    in-flight marks cleared with them."""
    from tests.helpers import in_flight

    caplog.set_level(logging.INFO, logger="jobs_engine")
    changed: list[int] = []

    def batch(jobs: list[Job]) -> list[None]:
        assert jobs[0].id is not None
        changed.append(jobs[0].id)
        JobModel.objects.filter(id=jobs[0].id).update(attempts=7)
        return [None] * len(jobs)

    name = f"oc.short.{keep}"
    targets(name, batch_handler=batch, policy=JobPolicy(keep_completed=keep))
    ids = [enqueue(name, {"n": n}, run_at=t0).job_id for n in range(4)]
    assert poller("fast")(t0) == 4
    assert list(JobModel.objects.filter(id__in=ids).values_list("id", "status", "attempts")
                ) == [(changed[0], JobStatus.PENDING, 7)]
    assert CompletedJob.objects.filter(target=name).count() == min(keep, 3)
    assert [row for row in store.job_stats_totals() if row[0] == name] == [(name, "ok", 3)]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("job run ")]
    assert sorted(line.rsplit("result=", 1)[1] for line in lines) == ["lost", "ok", "ok", "ok"]
    assert [line for line in lines if line.endswith("result=lost")] == [
        line for line in lines
        if f"dedupe_key={JobModel.objects.get(id=changed[0]).dedupe_key} " in line]
    assert in_flight() == []


def test_the_statistics_readers_sum_the_shards_of_a_bucket(t0: datetime) -> None:
    """A bucket's runs are in its shards, folded or not: the readers add them up."""
    hour = t0.replace(minute=0, second=0, microsecond=0)
    JobStatShard.objects.bulk_create([
        JobStatShard(hour=hour, target="oc.sum", outcome="ok", shard=JobStatShard.FOLDED,
                     count=3),
        JobStatShard(hour=hour, target="oc.sum", outcome="ok", shard=7, count=4),
        JobStatShard(hour=hour, target="oc.sum", outcome="dead", shard=7, count=1)])
    assert [row for row in store.job_stats_since(hour) if row[1] == "oc.sum"] == [
        (hour, "oc.sum", "dead", 1), (hour, "oc.sum", "ok", 7)]
    assert [row for row in store.job_stats_totals() if row[0] == "oc.sum"] == [
        ("oc.sum", "dead", 1), ("oc.sum", "ok", 7)]


@pytest.mark.django_db(transaction=True)
def test_two_sessions_count_one_bucket_without_waiting_for_each_other(t0: datetime) -> None:
    """Each session counts into its own shard of an hourly bucket: the upsert locks its row
    until the outcome's transaction commits, and with one row per bucket every worker's
    outcome writes waited for the others' commits. The readers sum the shards."""
    from jobs_engine.store import dialect, rows

    bucket = store.StatBucket(t0.replace(minute=0, second=0, microsecond=0), "oc.shared",
                              "ok", "")
    mine = dialect.session_shard(rows.STATS_SHARDS)
    if connection.vendor != "postgresql":  # one writer at a time holds the whole database
        assert mine == 0
        return
    other: list[int] = []

    errors: list[BaseException] = []

    def count_elsewhere() -> None:
        """In a session of another shard (a new session until its shard differs), with
        a lock timeout: waiting on this session's row fails the test."""
        try:
            for _ in range(20):
                shard = dialect.session_shard(rows.STATS_SHARDS)
                if shard != mine:
                    break
                connection.close()
            other.append(shard)
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL lock_timeout = '2s'")
                store.job_stats_add({bucket: 2})
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    with transaction.atomic():  # a worker's outcome write, not committed yet
        store.job_stats_add({bucket: 3})
        worker = threading.Thread(target=count_elsewhere)
        worker.start()
        worker.join(timeout=10)
        assert not worker.is_alive() and not errors, errors
    assert other and other[0] != mine
    assert sorted(JobStatShard.objects.filter(target="oc.shared").values_list("shard", "count")
                  ) == sorted([(mine, 3), (other[0], 2)])
    assert (bucket[0], "oc.shared", "ok", 5) in store.job_stats_since(bucket[0])
    assert ("oc.shared", "ok", 5) in store.job_stats_totals()



@pytest.mark.parametrize("lane", LANES)
def test_answered_failure_spends_an_attempt_and_waits(run_one: Any, lane: str,
                                                      t0: datetime) -> None:
    after = run_one(lane, raises(ValueError("boom")))
    assert (after.status, after.attempts, after.next_run_at, after.last_error) == (
        JobStatus.PENDING, 1, t0 + SECOND, "ValueError: boom")
    assert (after.claim_token, after.lease_until) == (None, None)
    assert paused(after.target) is None


@pytest.mark.parametrize("lane", LANES)
@pytest.mark.parametrize("mode", MODES)
def test_unreachable_keeps_the_row_and_pauses_the_target(run_one: Any, lane: str,
                                                         mode: DeliveryMode,
                                                         t0: datetime) -> None:
    after = run_one(lane, raises(TargetUnreachable("refused")), delivery_mode=mode)
    assert (after.status, after.attempts, after.next_run_at) == (JobStatus.PENDING, 0, t0)
    assert (after.claim_token, after.lease_until, after.closed_at) == (None, None, None)
    pause = paused(after.target)
    assert pause is not None and pause.paused_until == t0 + 30 * SECOND


@pytest.mark.parametrize("lane", LANES)
def test_outcome_unknown_at_most_once_is_dead_at_once_and_pauses(
        run_one: Any, lane: str, t0: datetime, dead_signals: list[dict[str, Any]]) -> None:
    after = run_one(lane, raises(TargetOutcomeUnknown("no answer")))
    assert (after.status, after.attempts, after.closed_at) == (JobStatus.DEAD, 1, t0)
    assert after.last_error == "TargetOutcomeUnknown: no answer"
    assert paused(after.target) is not None
    assert [s["job_id"] for s in dead_signals] == [after.id]


@pytest.mark.parametrize("lane", LANES)
def test_outcome_unknown_with_target_up_is_dead_without_pause(
        run_one: Any, lane: str, dead_signals: list[dict[str, Any]]) -> None:
    after = run_one(lane, raises(TargetOutcomeUnknown("request timed out", target_up=True)))
    assert (after.status, after.attempts) == (JobStatus.DEAD, 1)
    assert paused(after.target) is None
    assert [s["job_id"] for s in dead_signals] == [after.id]


@pytest.mark.parametrize("lane", LANES)
@pytest.mark.parametrize("target_up", [False, True])
def test_outcome_unknown_at_least_once_is_kept_and_pauses(
        run_one: Any, lane: str, target_up: bool, t0: datetime,
        dead_signals: list[dict[str, Any]]) -> None:
    after = run_one(lane, raises(TargetOutcomeUnknown("no answer", target_up=target_up)),
                    delivery_mode=DeliveryMode.AT_LEAST_ONCE)
    assert (after.status, after.attempts, after.next_run_at) == (JobStatus.PENDING, 0, t0)
    assert paused(after.target) is not None
    assert dead_signals == []


@pytest.mark.parametrize("lane", LANES)
@pytest.mark.parametrize("mode", MODES)
def test_dead_now_is_dead_at_once_and_counts_the_try_it_made(
        run_one: Any, lane: str, mode: DeliveryMode, t0: datetime,
        dead_signals: list[dict[str, Any]]) -> None:
    after = run_one(lane, raises(DeadNow("invalid record")), delivery_mode=mode)
    assert (after.status, after.attempts, after.closed_at) == (JobStatus.DEAD, 1, t0)
    assert after.last_error == "DeadNow: invalid record"
    assert paused(after.target) is None
    assert [s["job_id"] for s in dead_signals] == [after.id]


@pytest.mark.parametrize("lane", LANES)
def test_dead_at_the_last_attempt_cuts_error_signals_once_and_alerts(
        run_one: Any, lane: str, t0: datetime, dead_signals: list[dict[str, Any]],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="jobs_engine")
    after = run_one(lane, raises(RuntimeError("x" * 5000)), policy=RUN_ONCE_POLICY)
    assert (after.status, after.attempts, after.closed_at) == (JobStatus.DEAD, 1, t0)
    assert len(after.last_error) == store.LAST_ERROR_LIMIT == 2000
    assert after.last_error.startswith("RuntimeError: xxx")
    assert len(dead_signals) == 1
    assert dead_signals[0]["job_id"] == after.id
    assert dead_signals[0]["target"] == after.target
    alerts = [r for r in caplog.records if r.getMessage().startswith("job dead alert")]
    assert [r.levelno for r in alerts] == [logging.ERROR]
    assert f"id={after.id}" in alerts[0].getMessage()


@pytest.mark.parametrize("lane", LANES)
def test_every_run_logs_one_line_with_its_fields(run_one: Any, lane: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="jobs_engine")
    after = run_one(lane, raises(ValueError("boom")))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("job run ")]
    assert len(lines) == 1
    name = after.target
    assert re.fullmatch(rf"job run code={name} target={name} dedupe_key={name}:1 attempts=1 "
                        r"duration_ms=\d+\.\d result=retried", lines[0])


@pytest.mark.parametrize("lane", LANES)
def test_write_that_matches_nothing_is_logged_lost_and_raises_no_alert(
        run_one: Any, lane: str, dead_signals: list[dict[str, Any]],
        caplog: pytest.LogCaptureFixture) -> None:
    """The row changed under the handler (an admin cancelled it): the outcome is not
    written, and no DEAD alert is raised for a row this run no longer owns."""
    caplog.set_level(logging.INFO, logger="jobs_engine")

    def cancelled_meanwhile(job: Job) -> None:
        JobModel.objects.filter(id=job.id).delete()
        raise DeadNow("too late")

    assert run_one(lane, cancelled_meanwhile) is None
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("job run ")]
    assert len(lines) == 1 and lines[0].endswith("result=lost")
    assert dead_signals == []
    assert not [r for r in caplog.records if r.getMessage().startswith("job dead alert")]


@pytest.mark.parametrize("lane", LANES)
def test_error_text_with_nul_is_stored_cleaned_and_the_row_goes_dead(
        targets: Any, lane: str, t0: datetime, dead_signals: list[dict[str, Any]]) -> None:
    """A handler's error may carry anything (a response body): NUL, which PostgreSQL text
    refuses, and a lone surrogate, which UTF-8 cannot encode. The outcome must still be
    written, or the row would be run again at every poll: exactly the policy's attempts."""
    calls: list[Job] = []

    def handler(job: Job) -> None:
        calls.append(job)
        raise RuntimeError("bad\x00body\ud800")

    name = f"oc.{lane}.{uuid.uuid4().hex[:6]}"
    targets(name, handler=handler, lane=lane, delivery_mode=DeliveryMode.AT_MOST_ONCE,
            policy=JobPolicy(attempts=3, backoff_s=60))
    job_id = enqueue(name, {"n": 1}, dedupe_key=f"{name}:1", run_at=t0).job_id
    poll = poller(lane)
    # Each poll just past the row's retry time (60 s, then 120 s).
    for n, at in enumerate((t0, t0 + 61 * SECOND, t0 + 182 * SECOND), start=1):
        assert poll(at) == 1
        assert len(calls) == n
        row = JobModel.objects.get(id=job_id)
        assert row.attempts == n
        assert "\x00" not in row.last_error
    assert (row.status, row.closed_at) == (JobStatus.DEAD, t0 + 182 * SECOND)
    assert row.last_error == "RuntimeError: bad\\x00body? (attempt 3 of 3)"
    assert [s["job_id"] for s in dead_signals] == [job_id]
    assert poll(t0 + 3600 * SECOND) == 0
    assert len(calls) == 3
