"""Job policies on both lanes, with an injected clock: tries, waits and the end state
(DONE with the result, or DEAD with the error), the completed jobs kept by policy and
pruned to the newest N, jobs no handler takes, and ``get_job``.

Every test runs the real lanes against the database (PostgreSQL in CI, SQLite too); the
real worker processes are in tests/process/test_policies_processes.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from jobs_engine import (
    DEFAULT_POLICY,
    RUN_ONCE_POLICY,
    DeadNow,
    InvalidJob,
    JobPolicy,
    JobStatus,
    get_job,
    registry,
)
from jobs_engine.conf import load_settings
from jobs_engine.enqueueing import enqueue, enqueue_many
from jobs_engine.job import Job
from jobs_engine.lanes.long import LongLane
from jobs_engine.lanes.pauses import PauseGate
from jobs_engine.lanes.retention import RetentionService
from jobs_engine.models import CompletedJob
from jobs_engine.models import Job as JobRow
from tests.helpers import FakeMonotonic, fast_poller

pytestmark = pytest.mark.django_db

SECOND = timedelta(seconds=1)
LANES = ["fast", "long"]


def poller(lane: str) -> Callable[[datetime], int]:
    """One worker of ``lane``: a function that polls (reserves) once at a given time."""
    if lane == "fast":
        return fast_poller("pol")
    worker_id = f"pol-{uuid.uuid4().hex[:6]}"
    settings = load_settings({}, environ={})
    long = LongLane(worker_id, settings, PauseGate(worker_id, settings), threads=False,
                    monotonic=FakeMonotonic())
    return long.run_once


def put(target: str, at: datetime, payload: Any = None) -> int:
    result = enqueue(target, payload, run_at=at)
    assert result.job_id is not None
    return result.job_id


def failing_then(results: list[Any]) -> tuple[Callable[[Job], Any], list[Job]]:
    """A handler that raises each exception of ``results`` in turn and returns the
    first value that is not one."""
    calls: list[Job] = []

    def handler(job: Job) -> Any:
        calls.append(job)
        value = results.pop(0)
        if isinstance(value, BaseException):
            raise value
        return value

    return handler, calls


# -- tries, waits, end states -----------------------------------------------------------------


@pytest.mark.parametrize("lane", LANES)
def test_run_once_target_that_fails_runs_exactly_once_and_is_dead(
        targets: Any, now: datetime, lane: str) -> None:
    handler, calls = failing_then([ValueError("card declined")] * 5)
    targets("po.charge", handler=handler, lane=lane, policy=RUN_ONCE_POLICY)
    job_id = put("po.charge", now)
    poll = poller(lane)
    assert poll(now) == 1
    for later in (1, 2, 60, 3600):
        poll(now + later * SECOND)
    assert len(calls) == 1
    dead = JobRow.objects.get(id=job_id)
    assert (dead.status, dead.attempts) == (JobStatus.DEAD, 1)
    assert dead.last_error == "ValueError: card declined (attempt 1 of 1)"
    info = get_job(job_id)
    assert info is not None
    assert (info.status, info.attempts, info.result) == (JobStatus.DEAD, 1, None)
    assert info.last_error == dead.last_error and info.finished_at == dead.closed_at


@pytest.mark.parametrize("lane", LANES)
def test_default_policy_fails_twice_then_succeeds_waiting_1_s_then_2_s_and_is_done(
        targets: Any, now: datetime, lane: str) -> None:
    handler, calls = failing_then([ConnectionError("reset"), ConnectionError("reset"),
                                   {"message_id": "m-1", "accepted": True}])
    targets("po.mail", handler=handler, lane=lane)  # no policy: DEFAULT_POLICY
    job_id = put("po.mail", now, {"to": "a@example.com"})
    poll = poller(lane)
    assert poll(now) == 1
    first = JobRow.objects.get(id=job_id)
    assert (first.attempts, first.next_run_at) == (1, now + SECOND)  # waits 1 s
    assert poll(now + SECOND - timedelta(milliseconds=1)) == 0  # not due yet
    assert poll(now + SECOND) == 1
    second = JobRow.objects.get(id=job_id)
    assert (second.attempts, second.next_run_at) == (2, now + 3 * SECOND)  # then 2 s
    assert poll(now + 3 * SECOND) == 1
    assert len(calls) == 3
    assert [job.attempts for job in calls] == [0, 1, 2]  # tries made before each
    assert not JobRow.objects.filter(id=job_id).exists()
    done = CompletedJob.objects.get(id=job_id)
    assert (done.status, done.attempts, done.result) == (
        "DONE", 3, {"message_id": "m-1", "accepted": True})
    assert (done.target, done.payload, done.finished_at) == ("po.mail", {"to": "a@example.com"},
                                                             now + 3 * SECOND)
    assert done.started_at is not None and done.duration_ms >= 0
    info = get_job(job_id)
    assert info is not None
    assert (info.status, info.attempts, info.result, info.last_error) == (
        JobStatus.DONE, 3, {"message_id": "m-1", "accepted": True}, "")
    assert info.finished_at == now + 3 * SECOND and info.created_at <= now


@pytest.mark.parametrize("lane", LANES)
def test_two_attempts_stop_after_two(targets: Any, now: datetime, lane: str) -> None:
    handler, calls = failing_then([RuntimeError("no")] * 5)
    targets("po.twice", handler=handler, lane=lane,
            policy=JobPolicy(attempts=2, backoff_s=5))
    job_id = put("po.twice", now)
    poll = poller(lane)
    poll(now)
    poll(now + 5 * SECOND)
    poll(now + 3600 * SECOND)
    assert len(calls) == 2
    dead = JobRow.objects.get(id=job_id)
    assert (dead.status, dead.attempts) == (JobStatus.DEAD, 2)
    assert dead.last_error.endswith("(attempt 2 of 2)")


@pytest.mark.parametrize("lane", LANES)
def test_dead_now_spends_the_attempt_it_made(targets: Any, now: datetime, lane: str) -> None:
    handler, _ = failing_then([DeadNow("invalid address")])
    targets("po.deadnow", handler=handler, lane=lane)
    job_id = put("po.deadnow", now)
    poller(lane)(now)
    assert JobRow.objects.values_list("status", "attempts").get(id=job_id) == (
        JobStatus.DEAD, 1)


@pytest.mark.parametrize("lane", LANES)
def test_keep_completed_0_deletes_the_row_and_keeps_nothing(targets: Any, now: datetime,
                                                            lane: str) -> None:
    targets("po.nokeep", handler=lambda job: {"ignored": True}, lane=lane,
            policy=JobPolicy(keep_completed=0))
    job_id = put("po.nokeep", now)
    assert poller(lane)(now) == 1
    assert not JobRow.objects.filter(id=job_id).exists()
    assert not CompletedJob.objects.filter(id=job_id).exists()
    assert get_job(job_id) is None


# -- results ----------------------------------------------------------------------------------


@pytest.mark.parametrize("lane", LANES)
@pytest.mark.parametrize(("value", "problem"), [
    (Decimal("1.5"), "is not JSON-serialisable"),
    ({"set": {1, 2}}, "is not JSON-serialisable"),
    ("nul \x00 inside", "NUL"),
    ({"text": "\ud800"}, "surrogate"),
], ids=["decimal", "set", "nul", "surrogate"])
def test_a_result_that_cannot_be_kept_fails_the_try_and_is_never_dropped(
        targets: Any, now: datetime, lane: str, value: Any, problem: str) -> None:
    """The handler's bug: the try fails (retried under the policy), nothing is DONE."""
    targets("po.badresult", handler=lambda job: value, lane=lane)
    job_id = put("po.badresult", now)
    assert poller(lane)(now) == 1
    failed = JobRow.objects.get(id=job_id)
    assert (failed.status, failed.attempts) == (JobStatus.PENDING, 1)
    assert failed.last_error.startswith(
        "InvalidResult: the handler of po.badresult returned a result that cannot be kept")
    assert problem in failed.last_error
    assert not CompletedJob.objects.filter(id=job_id).exists()


def test_a_batch_handler_returns_a_result_or_an_exception_per_job(targets: Any,
                                                                  now: datetime) -> None:
    def send(jobs: list[Job]) -> list[Any]:
        return [ValueError("odd") if job.payload % 2 else {"sent": job.payload}
                for job in jobs]

    targets("po.batch", handler=lambda job: None, batch_handler=send,
            delivery_mode="at_least_once")
    ids = [put("po.batch", now, n) for n in range(4)]
    assert poller("fast")(now) == 4
    kept = dict(CompletedJob.objects.values_list("id", "result"))
    assert kept == {ids[0]: {"sent": 0}, ids[2]: {"sent": 2}}
    assert list(JobRow.objects.filter(id__in=ids).values_list("attempts", flat=True)) == [1, 1]


def test_results_keep_their_json_types(targets: Any, now: datetime) -> None:
    values = [0, "text", [1, "two", None], {"nested": {"deep": [True, 1.5]}}, False]
    iterator = iter(values)
    targets("po.types", handler=lambda job: next(iterator), lane="long")
    ids = [put("po.types", now) for _ in values]
    poll = poller("long")
    while poll(now):
        pass
    results = [get_job(job_id) for job_id in ids]
    assert [info.result for info in results if info] == values


# -- kept by policy, pruned to the newest N --------------------------------------------------


@pytest.mark.parametrize("lane", LANES)
def test_retention_keeps_exactly_the_newest_n_done_and_dead_of_each_target(
        targets: Any, now: datetime, lane: str) -> None:
    policy = JobPolicy(attempts=1, keep_completed=3, keep_failed=2)
    targets("po.keep-a", handler=lambda job: {"n": job.payload}, lane=lane, policy=policy)
    targets("po.keep-b", handler=lambda job: {"n": job.payload}, lane=lane, policy=policy)
    targets("po.fail", handler=failing_then([ValueError("x")] * 9)[0], lane=lane,
            policy=policy)
    poll = poller(lane)
    done_a, done_b, dead = [], [], []
    for n in range(7):  # one job per poll: each completes at its own time
        at = now + n * SECOND
        done_a.append(put("po.keep-a", at, n))
        done_b.append(put("po.keep-b", at, n))
        dead.append(put("po.fail", at, n))
        while poll(at):
            pass
    assert CompletedJob.objects.filter(target="po.keep-a").count() == 7
    assert JobRow.objects.filter(target="po.fail", status=JobStatus.DEAD).count() == 7
    counts = RetentionService(load_settings({}, environ={}), batch=2).run_once(now)
    assert (counts.completed, counts.failed) == (8, 5)
    for target, ids in (("po.keep-a", done_a), ("po.keep-b", done_b)):
        kept = sorted(CompletedJob.objects.filter(target=target).values_list("id", flat=True))
        assert kept == sorted(ids[-3:])
    kept_dead = sorted(JobRow.objects.filter(target="po.fail").values_list("id", flat=True))
    assert kept_dead == sorted(dead[-2:])
    again = RetentionService(load_settings({}, environ={})).run_once(now)
    assert (again.completed, again.failed) == (0, 0)


def test_one_send_moves_no_more_rows_than_its_target_keeps(targets: Any, now: datetime
                                                           ) -> None:
    """A send of 50 completed jobs of a target that keeps 5: the newest 5 are kept, the
    other 45 are deleted at once (never copied only to be pruned)."""
    targets("po.bulk", policy=JobPolicy(keep_completed=5), delivery_mode="at_least_once",
            batch_handler=lambda jobs: [None] * len(jobs))
    result = enqueue_many([{"target": "po.bulk", "payload": n, "run_at": now}
                           for n in range(50)])
    ids = [r.job_id for r in result]
    assert poller("fast")(now) == 50
    assert sorted(CompletedJob.objects.values_list("id", flat=True)) == sorted(ids)[-5:]
    assert not JobRow.objects.filter(id__in=ids).exists()


# -- jobs no handler takes -------------------------------------------------------------------


@pytest.mark.parametrize("lane", LANES)
def test_a_job_of_an_unregistered_target_goes_dead_while_others_flow(
        targets: Any, now: datetime, lane: str, dead_signals: list[dict[str, Any]]) -> None:
    """A deploy removed ``po.gone``: its rows wait out UNHANDLED_GRACE_S (another release's
    workers may still take them), then the retention pass makes them DEAD with the reason.
    They never spin, and never hold ``po.alive``'s rows."""
    targets("po.gone", lane=lane)
    targets("po.alive", lane=lane)
    gone = [put("po.gone", now) for _ in range(3)]
    registry.unregister_target("po.gone")
    alive = [put("po.alive", now) for _ in range(3)]
    poll = poller(lane)
    while poll(now):
        pass
    assert not JobRow.objects.filter(id__in=alive).exists()  # completed, flowed past
    assert CompletedJob.objects.filter(id__in=alive).count() == 3
    waiting = JobRow.objects.filter(id__in=gone)
    assert set(waiting.values_list("status", "attempts")) == {(JobStatus.PENDING, 0)}
    settings = load_settings({"UNHANDLED_GRACE_S": 60}, environ={})
    assert RetentionService(settings).run_once(now + 30 * SECOND).unhandled == 0  # in grace
    assert RetentionService(settings).run_once(now + 61 * SECOND).unhandled == 3
    assert set(waiting.values_list("status", "last_error")) == {
        (JobStatus.DEAD, "no handler registered for po.gone")}
    assert sorted(s["job_id"] for s in dead_signals) == sorted(gone)
    for later in (62, 120, 3600):
        assert poll(now + later * SECOND) == 0  # DEAD: never taken again


# -- get_job -----------------------------------------------------------------------------------


def test_get_job_of_a_waiting_job_and_of_none(targets: Any, now: datetime) -> None:
    targets("po.wait")
    job_id = put("po.wait", now + 60 * SECOND)
    info = get_job(job_id)
    assert info is not None
    assert (info.id, info.target, info.status, info.attempts, info.result) == (
        job_id, "po.wait", JobStatus.PENDING, 0, None)
    assert (info.started_at, info.finished_at) == (None, None)
    assert get_job(job_id + 1_000_000) is None


@pytest.mark.parametrize("bad", ["12", 1.0, True, 0, -5, 2**63, None],
                         ids=["text", "float", "bool", "zero", "negative", "too-large", "none"])
def test_get_job_with_a_malformed_id_names_it(bad: Any) -> None:
    with pytest.raises(InvalidJob) as info:
        get_job(bad)
    assert info.value.field == "job_id"


def test_the_policy_knobs_are_the_shipped_ones_when_none_is_given(targets: Any) -> None:
    assert targets("po.plain").policy is DEFAULT_POLICY
