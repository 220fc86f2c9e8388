"""The fast lane against a real database, with an injected clock (docs/design.md#lanes).

Time never passes for real: every poll gets an explicit decision time (``t0`` and later
times made from it), and the lane's monotonic clock is a fake that moves only when a test
moves it, so lease trust is decided by the test.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs_engine import JobPolicy, conf, registry, store
from jobs_engine.conf import JobsSettings, load_settings
from jobs_engine.enqueueing import enqueue, enqueue_many, partition_for
from jobs_engine.errors import DeadNow, TargetUnreachable
from jobs_engine.job import Job
from jobs_engine.lanes.fast import FastLane
from jobs_engine.lanes.partitions import PartitionLeases
from jobs_engine.lanes.pauses import PauseGate
from jobs_engine.models import CompletedJob, Partition, TargetPause
from jobs_engine.models import Job as JobModel
from jobs_engine.states import DeliveryMode, JobStatus, Lane
from jobs_engine.store.planning import REPLAN_S
from tests.helpers import CLEAR_SQL, MARK_SQL, FakeMonotonic, in_flight, race, statements

pytestmark = pytest.mark.django_db

SECOND = timedelta(seconds=1)
MILLISECOND = timedelta(milliseconds=1)


class Crash(BaseException):
    """Aborts a poll the way a killed process would: the fast lane catches only
    ``Exception``, so nothing after the handler call runs."""


@dataclass
class Worker:
    """One fast-lane worker: its leases, its lane and its fake clock."""

    lane: FastLane
    leases: PartitionLeases
    clock: FakeMonotonic = field(default_factory=FakeMonotonic)

    def run(self, at: datetime, *, woken: bool = False) -> int:
        """Heartbeat at ``at`` (so the lease is live at that time), then poll."""
        self.leases.heartbeat(at)
        return self.lane.run_once(at, woken=woken)


def make_worker(name: str, settings: JobsSettings | None = None,
                clock: FakeMonotonic | None = None) -> Worker:
    settings = settings or conf.jobs_settings()
    clock = clock or FakeMonotonic()
    worker_id = f"{name}-{uuid.uuid4().hex[:6]}"
    leases = PartitionLeases(worker_id, settings, monotonic=clock)
    lane = FastLane(worker_id, settings, leases, PauseGate(worker_id, settings), monotonic=clock)
    store.partitions_seed(settings.PARTITIONS)
    return Worker(lane, leases, clock)


def keys_in(partitions: Collection[int], count: int, prefix: str) -> list[str]:
    """``count`` keys whose partition is in ``partitions``."""
    found: list[str] = []
    number = 0
    while len(found) < count:
        key = f"{prefix}-{number}"
        if partition_for(key, key, conf.jobs_settings().PARTITIONS) in partitions:
            found.append(key)
        number += 1
    return found


def put(target: str, at: datetime, *, key: str | None = None, version: int | None = None,
        payload: Any = None, dedupe_key: str | None = None) -> int:
    result = enqueue(target, payload, key=key, version=version, run_at=at, dedupe_key=dedupe_key)
    assert result.job_id is not None
    return result.job_id


def row(job_id: int) -> JobModel:
    return JobModel.objects.get(id=job_id)


def raising(exc: BaseException, calls: list[Job]) -> Callable[[Job], None]:
    def handler(job: Job) -> None:
        calls.append(job)
        raise exc

    return handler



@pytest.fixture
def t0(now: datetime) -> datetime:
    return now




# -- batches -----------------------------------------------------------------------------------


def test_a_woken_poll_reads_a_few_rows_of_each_target_and_the_next_poll_the_rest(
        targets: Any, t0: datetime) -> None:
    """A poll answering a wake-up runs on plans that may predate the rows it finds (made
    while the table was empty, they walk the whole table once per row read), so it reads
    at most ``WOKEN_POLL_ROWS`` of each target; the poll after it reads a whole batch."""
    sent: list[int] = []
    for name in ("fl.woken-a", "fl.woken-b"):
        targets(name, batch_handler=lambda jobs: sent.append(len(jobs)) or [None] * len(jobs))
        enqueue_many([{"target": name, "payload": i, "run_at": t0} for i in range(50)])
    worker = make_worker("A")
    woken_rows = store.WOKEN_POLL_ROWS
    assert worker.run(t0, woken=True) == 2 * woken_rows
    assert worker.run(t0) == 2 * (50 - woken_rows)
    assert sent == [woken_rows, woken_rows, 50 - woken_rows, 50 - woken_rows]


def test_250_rows_go_out_100_100_50_and_success_deletes(targets: Any, t0: datetime) -> None:
    """A poll reads at most FAST_BATCH rows; every successful send deletes its row."""
    target = targets("fl.bulk")
    enqueue_many([{"target": "fl.bulk", "payload": i, "run_at": t0} for i in range(250)])
    worker = make_worker("A")
    assert [worker.run(t0) for _ in range(4)] == [100, 100, 50, 0]
    assert sorted(job.payload for job in target.extra["calls"]) == list(range(250))
    assert JobModel.objects.count() == 0


@pytest.mark.parametrize("keep", [0, 5])  # deleted, or the newest 5 kept as DONE
@pytest.mark.parametrize("count", [3, 40])  # ids inlined, and as one array parameter
def test_success_write_matches_each_row_on_the_attempts_it_was_read_with(
        targets: Any, t0: datetime, count: int, keep: int) -> None:
    """A send's success write is guarded per row on the attempts it was read with,
    whatever mix of attempts the send holds: a row changed since (a takeover wrote its
    outcome) stays, and is neither deleted nor kept as DONE."""
    targets("fl.guard")
    ids = [put("fl.guard", t0) for _ in range(count)]
    for index, job_id in enumerate(ids):
        JobModel.objects.filter(id=job_id).update(attempts=index % 3)
    changed = ids[1]
    JobModel.objects.filter(id=changed).update(attempts=5)
    done = [store.Done(job_id, index % 3, None, t0, 1.0) for index, job_id in enumerate(ids)]
    assert store.jobs_done(store.Guard(Lane.FAST, "token"), done, t0, keep=keep) == count - 1
    assert list(JobModel.objects.values_list("id", flat=True)) == [changed]
    newest = ids[-keep:] if keep else []
    assert sorted(CompletedJob.objects.values_list("id", flat=True)) == sorted(
        job_id for job_id in newest if job_id != changed)


def prepared_counts(counted: str, text_start: str) -> list[int]:
    """``counted`` (an expression over ``pg_prepared_statements``) for each statement this
    session prepared whose text starts with ``text_start``, in ascending order."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {counted} FROM pg_prepared_statements WHERE statement LIKE %s",
                       [text_start + "%"])
        return sorted(count for (count,) in cursor.fetchall())


@pytest.mark.django_db(transaction=True)  # autocommit, as in a worker
def test_the_success_write_is_prepared_once_for_sends_of_any_size(targets: Any, t0: datetime
                                                                  ) -> None:
    """A send's success write has one text whatever its size (arrays), and one more for a
    send that mixes attempts, so the worker's session prepares each once: parsing and
    planning it was a third of a 100-row write's time on the server."""
    targets("fl.write", delivery_mode=DeliveryMode.AT_LEAST_ONCE, batch_size=50)
    worker = make_worker("A")
    for count, mixed in ((3, False), (40, False), (3, True), (40, True)):
        ids = [put("fl.write", t0) for _ in range(count)]
        for index, job_id in enumerate(ids):
            JobModel.objects.filter(id=job_id).update(attempts=index % 3 if mixed else 1)
        assert worker.run(t0) == count
    assert JobModel.objects.count() == 0
    assert CompletedJob.objects.count() == 86
    if connection.vendor != "postgresql":
        return
    assert prepared_counts("generic_plans", "WITH r(id, result") == [2, 2]


def test_the_mark_of_a_send_is_prepared_once_for_sends_of_any_size(
        targets: Any, t0: datetime, jobs_settings: Any) -> None:
    """An at-most-once per-row target's rows after the read's are marked by a statement of
    their own, once a row or once per ``FAST_MARK_ROWS``: one text whatever the send's
    size and partitions (arrays), and one more for a send that mixes attempts, so the
    worker's session prepares each once; the server planned every mark before."""
    targets("fl.mark")
    ids = [put("fl.mark", t0 + i * SECOND / 10, key=key)
           for i, key in enumerate(keys_in({11, 12, 13}, 9, "mark-prep"))]
    JobModel.objects.filter(id__in=ids[4:6]).update(attempts=2)  # the second send mixes
    worker = make_worker("A", jobs_settings(FAST_MARK_ROWS=3))
    assert worker.run(t0 + SECOND) == 9  # marks: the read's 3, then 3 mixed, 3
    for i, key in enumerate(keys_in({11, 12, 13}, 7, "mark-prep-2")):
        put("fl.mark", t0 + i * SECOND / 10, key=key)
    assert worker.run(t0 + SECOND) == 7  # the read's 3, then 3, 1
    assert JobModel.objects.count() == 0
    if connection.vendor != "postgresql":
        return
    assert prepared_counts("generic_plans + custom_plans", "WITH mark(partition") == [1, 3]


def test_fast_batch_comes_from_settings(targets: Any, t0: datetime, jobs_settings: Any) -> None:
    """FAST_BATCH from settings.JOBS and from the JOBS_FAST_BATCH environment variable."""
    targets("fl.small")
    from_settings = jobs_settings(FAST_BATCH=7)
    enqueue_many([{"target": "fl.small", "payload": i, "run_at": t0} for i in range(10)])
    worker = make_worker("A", from_settings)
    assert [worker.run(t0) for _ in range(3)] == [7, 3, 0]

    from_env = load_settings({}, environ={"JOBS_FAST_BATCH": "4"})
    assert from_env.FAST_BATCH == 4
    enqueue_many([{"target": "fl.small", "payload": i, "run_at": t0} for i in range(10)])
    other = make_worker("B", from_env)
    worker.leases.release_all()
    assert [other.run(t0) for _ in range(4)] == [4, 4, 2, 0]


def test_a_target_batch_size_sets_its_rows_per_poll(targets: Any, t0: datetime,
                                                  jobs_settings: Any) -> None:
    """A target's own batch_size wins over FAST_BATCH for its rows; other targets keep
    FAST_BATCH."""
    sends: list[int] = []

    def batch_handler(jobs: Any) -> list[BaseException | None]:
        sends.append(len(jobs))
        return [None] * len(jobs)

    targets("fl.wide", handler=lambda job: None, batch_handler=batch_handler, batch_size=8)
    targets("fl.narrow")
    enqueue_many([{"target": "fl.wide", "payload": i, "run_at": t0} for i in range(20)])
    worker = make_worker("A", jobs_settings(FAST_BATCH=3))
    assert [worker.run(t0) for _ in range(4)] == [8, 8, 4, 0]
    assert sends == [8, 8, 4]

    enqueue_many([{"target": "fl.narrow", "payload": i, "run_at": t0} for i in range(5)])
    enqueue_many([{"target": "fl.wide", "payload": i, "run_at": t0 + SECOND}
                  for i in range(8)])
    assert worker.run(t0 + SECOND) == 3 + 8
    assert JobModel.objects.filter(target="fl.narrow").count() == 2
    assert not JobModel.objects.filter(target="fl.wide").exists()


# -- answered failures: backoff, DEAD ---------------------------------------------------------


def test_answered_failure_backs_off_then_dead_at_the_third(
        targets: Any, t0: datetime, dead_signals: list[dict[str, Any]],
        caplog: pytest.LogCaptureFixture) -> None:
    """DEFAULT_POLICY: waits of 1 s, then 2 s, then DEAD at the 3rd failed try with
    closed_at, last_error cut to 2000 characters, one job_dead signal and one "job dead
    alert" error line."""
    caplog.set_level(logging.INFO, logger="jobs_engine")
    calls: list[Job] = []
    targets("fl.fail", handler=raising(ValueError("E" * 5000), calls))
    job_id = put("fl.fail", t0, key="order-1", version=1)
    worker = make_worker("A")
    at = t0
    for attempt, delay in enumerate((1, 2), start=1):
        assert worker.run(at) == 1
        failed = row(job_id)
        assert (failed.status, failed.attempts) == (JobStatus.PENDING, attempt)
        assert failed.next_run_at == at + timedelta(seconds=delay)
        assert failed.last_error.startswith("ValueError: EEE")
        assert worker.run(at + timedelta(seconds=delay) - MILLISECOND) == 0  # not due yet
        at += timedelta(seconds=delay)
    assert dead_signals == []
    assert worker.run(at) == 1
    dead = row(job_id)
    assert (dead.status, dead.attempts, dead.closed_at) == (JobStatus.DEAD, 3, at)
    assert len(dead.last_error) == 2000
    assert [s["job_id"] for s in dead_signals] == [job_id]
    alerts = [r for r in caplog.records if r.getMessage().startswith("job dead alert")]
    assert len(alerts) == 1
    assert alerts[0].levelno == logging.ERROR
    assert f"id={job_id}" in alerts[0].getMessage()
    assert len(calls) == 3
    assert worker.run(at + timedelta(days=1)) == 0  # DEAD rows are never sent again


def test_the_targets_policy_sets_tries_and_doubling_waits(targets: Any, t0: datetime) -> None:
    """The target's JobPolicy: four tries, waits of 5 s doubling before each later one."""
    calls: list[Job] = []
    targets("fl.custom", handler=raising(ValueError("no"), calls),
            policy=JobPolicy(attempts=4, backoff_s=5))
    job_id = put("fl.custom", t0)
    worker = make_worker("A")
    at = t0
    for attempt, delay in enumerate((5, 10, 20), start=1):
        assert worker.run(at) == 1
        assert (row(job_id).attempts, row(job_id).next_run_at) == (
            attempt, at + timedelta(seconds=delay))
        at += timedelta(seconds=delay)
    assert worker.run(at) == 1
    assert (row(job_id).status, row(job_id).attempts) == (JobStatus.DEAD, 4)


# -- key order and holds ----------------------------------------------------------------------


@pytest.fixture
def versioned(targets: Any) -> tuple[list[int], dict[int, BaseException]]:
    """Target ``fl.keyed``: records versions sent; ``failures[v]`` fails version v once."""
    sent: list[int] = []
    failures: dict[int, BaseException] = {}

    def handler(job: Job) -> None:
        sent.append(job.version)
        exc = failures.pop(job.version, None)
        if exc is not None:
            raise exc

    targets("fl.keyed", handler=handler)
    return sent, failures


def test_failed_row_holds_later_versions_until_retried(
        versioned: tuple[list[int], dict[int, BaseException]], t0: datetime) -> None:
    sent, failures = versioned
    ids = [put("fl.keyed", t0, key="order-1", version=v) for v in (1, 2, 3)]
    failures[1] = ValueError("answered failure")
    worker = make_worker("A")
    assert worker.run(t0) == 1
    assert worker.run(t0) == 0
    assert worker.run(t0 + SECOND - MILLISECOND) == 0  # v2, v3 wait behind v1's retry
    assert sent == [1]
    assert [row(i).status for i in ids[1:]] == [JobStatus.PENDING] * 2
    later = t0 + SECOND
    polls = [worker.run(later) for _ in range(4)]
    assert sent == [1, 1, 2, 3]
    assert sum(polls) == 3
    assert JobModel.objects.count() == 0


def test_dead_row_holds_nothing(versioned: tuple[list[int], dict[int, BaseException]],
                                t0: datetime) -> None:
    sent, failures = versioned
    first = put("fl.keyed", t0, key="order-1", version=1)
    for version in (2, 3):
        put("fl.keyed", t0, key="order-1", version=version)
    failures[1] = DeadNow("invalid record")
    worker = make_worker("A")
    polls = [worker.run(t0) for _ in range(4)]
    assert row(first).status == JobStatus.DEAD
    assert sent == [1, 2, 3]
    assert sum(polls) == 3
    assert JobModel.objects.exclude(id=first).count() == 0


def test_versions_committed_out_of_order_are_sent_in_order(
        versioned: tuple[list[int], dict[int, BaseException]], t0: datetime) -> None:
    sent, _ = versioned
    for version in (3, 1, 2):  # v3 committed first
        put("fl.keyed", t0, key="order-1", version=version)
    worker = make_worker("A")
    for _ in range(4):
        worker.run(t0)
    assert sent == [1, 2, 3]


def test_a_poll_keeps_the_heads_of_a_window_of_batch_rows(targets: Any, t0: datetime,
                                                          jobs_settings: Any) -> None:
    """With fewer keys than FAST_BATCH, a poll keeps the heads among the target's first
    FAST_BATCH due rows instead of reading the whole backlog for more: a deep backlog on
    few keys costs a poll that many rows. Later rows (a keyless one here) wait for a later
    poll; every key keeps its order."""
    target = targets("fl.window")
    step = 0
    for version in (1, 2, 3):
        for key in ("a", "b"):
            step += 1
            put("fl.window", t0 - (10 - step) * SECOND, key=key, version=version)
    put("fl.window", t0, payload="keyless")
    worker = make_worker("A", jobs_settings(FAST_BATCH=4))
    assert [worker.run(t0) for _ in range(4)] == [2, 2, 3, 0]
    assert [(job.key, job.version) for job in target.extra["calls"]] == [
        ("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3), ("b", 3), (None, 0)]


def test_a_window_without_a_head_falls_back_to_the_whole_backlog(
        targets: Any, t0: datetime, jobs_settings: Any) -> None:
    """When every row of a target's window waits for an earlier version due later
    (versions committed out of order), the lane walks that target's whole due backlog for
    heads, so it never stalls behind them, even while another target's rows (here a
    batch, marked by the read) go out in the same polls."""
    target = targets("fl.held")
    for version, seconds_ago in ((2, 3), (3, 2), (1, 1)):  # v1 committed last, due last
        put("fl.held", t0 - seconds_ago * SECOND, key="k", version=version)
    batches: list[int] = []
    targets("fl.busy", batch_handler=lambda jobs: batches.append(len(jobs)) or [None] * len(jobs))
    enqueue_many([{"target": "fl.busy", "payload": i, "run_at": t0} for i in range(4)])
    worker = make_worker("A", jobs_settings(FAST_BATCH=2))
    assert [worker.run(t0) for _ in range(4)] == [3, 3, 1, 0]
    assert [job.version for job in target.extra["calls"]] == [1, 2, 3]
    assert batches == [2, 2]
    # The walk reads a whole backlog, so it runs at most once per POLL_S.
    for version, seconds_ago in ((2, 3), (3, 2), (1, 1)):
        put("fl.held", t0 - seconds_ago * SECOND, key="k2", version=version)
    assert worker.run(t0) == 0
    worker.clock.advance(conf.jobs_settings().POLL_S)
    assert worker.run(t0, woken=True) == 0  # a wake-up's poll leaves the walk to the next
    assert worker.run(t0) == 1


def test_a_poll_never_walks_another_targets_backlog(targets: Any, t0: datetime) -> None:
    """A target's poll reads its own due rows only: another target's backlog due earlier
    (say one paused for an hour) is never walked. No index orders fast-lane rows by run
    time across targets, so the planner cannot choose to walk one; on PostgreSQL the plan
    shows it: every scan of the jobs table is an index scan, and none filters rows away."""
    for index in JobModel._meta.indexes:
        if "next_run_at" in index.fields and index.fields[0] != "target":
            terms = dict(term for term in index.condition.children if isinstance(term, tuple))
            assert terms.get("lane") == Lane.LONG, index.name
    targets("fl.earlier")
    targets("fl.later")
    hour_ago = t0 - timedelta(hours=1)
    enqueue_many([{"target": "fl.earlier", "payload": i, "run_at": hour_ago + i * SECOND / 10}
                  for i in range(3000)])
    enqueue_many([{"target": "fl.later", "payload": i, "run_at": t0 - SECOND}
                  for i in range(3000)])
    partitions = list(range(conf.jobs_settings().PARTITIONS))
    with CaptureQueriesContext(connection) as captured:
        rows = store.jobs_fast_due(partitions, t0, {"fl.later": 100}).jobs
    assert len(rows) == 100 and {row.target for row in rows} == {"fl.later"}
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs_engine_job")
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + captured.captured_queries[-1]["sql"])
        plan = cursor.fetchone()[0]
    plan = plan if isinstance(plan, list) else json.loads(plan)
    nodes, scans = [plan[0]["Plan"]], []
    while nodes:
        node = nodes.pop()
        nodes += node.get("Plans", [])
        if node.get("Relation Name") == "jobs_engine_job":
            scans.append(node)
    assert scans and all(node["Node Type"] in {"Index Scan", "Index Only Scan"}
                         for node in scans), scans
    assert {node["Index Name"] for node in scans} <= {"jobs_fast_pending_due",
                                                      "jobs_pending_key_order"}
    assert sum(node.get("Rows Removed by Filter", 0) for node in scans) == 0


def test_rows_without_key_are_not_held(targets: Any, t0: datetime) -> None:
    calls: list[Job] = []
    failed: list[int] = []

    def handler(job: Job) -> None:
        calls.append(job)
        if not failed:
            failed.append(job.id)  # type: ignore[arg-type]
            raise ValueError("first one fails")

    targets("fl.nokey", handler=handler)
    ids = [put("fl.nokey", t0) for _ in range(3)]
    worker = make_worker("A")
    assert worker.run(t0) == 3
    assert {job.id for job in calls} == set(ids)
    assert list(JobModel.objects.values_list("id", flat=True)) == failed


def test_future_dated_row_holds_later_versions(
        versioned: tuple[list[int], dict[int, BaseException]], t0: datetime) -> None:
    sent, _ = versioned
    put("fl.keyed", t0 + timedelta(hours=1), key="order-1", version=1)
    put("fl.keyed", t0, key="order-1", version=2)
    worker = make_worker("A")
    assert worker.run(t0) == 0
    assert worker.run(t0 + timedelta(minutes=59)) == 0
    later = t0 + timedelta(hours=1)
    assert [worker.run(later) for _ in range(3)] == [1, 1, 0]
    assert sent == [1, 2]


# -- unreachable targets, pauses and probes ---------------------------------------------------


def test_unreachable_pauses_target_and_skips_rest_of_its_batch(targets: Any,
                                                              t0: datetime) -> None:
    """No attempt spent, the target paused, none of its other rows handed in that poll
    (same partition or not), other targets keep running."""
    down_calls: list[Job] = []
    targets("fl.down", handler=raising(TargetUnreachable("connection refused"), down_calls))
    up = targets("fl.up")
    same = keys_in({5}, 5, "same")
    other = keys_in({9}, 2, "other")
    down_ids = [put("fl.down", t0, key=key) for key in same[:3] + other]
    up_ids = [put("fl.up", t0, key=key) for key in same[3:]]
    worker = make_worker("A")
    assert worker.run(t0) == 3
    assert len(down_calls) == 1
    assert [(row(i).status, row(i).attempts) for i in down_ids] == [(JobStatus.PENDING, 0)] * 5
    pause = TargetPause.objects.get(target="fl.down")
    assert pause.paused_until == t0 + 30 * SECOND
    assert "connection refused" in pause.reason
    assert {job.id for job in up.extra["calls"]} == set(up_ids)
    assert not JobModel.objects.filter(id__in=up_ids).exists()
    assert worker.run(t0 + 29 * SECOND) == 0
    assert len(down_calls) == 1


def test_unreachable_at_least_once_target_hands_no_more_rows(targets: Any,
                                                             t0: datetime) -> None:
    """An at-least-once target sends a partition's rows in one send; once one of them
    finds the target unreachable, the rest of that send is not handed either."""
    calls: list[Job] = []
    targets("fl.down_alo", handler=raising(TargetUnreachable("no broker"), calls),
            delivery_mode=DeliveryMode.AT_LEAST_ONCE)
    ids = [put("fl.down_alo", t0, key=key) for key in keys_in({3}, 4, "alo")]
    worker = make_worker("A")
    worker.run(t0)
    assert len(calls) == 1
    assert [(row(i).status, row(i).attempts) for i in ids] == [(JobStatus.PENDING, 0)] * 4
    assert TargetPause.objects.filter(target="fl.down_alo").exists()


def test_paused_target_gets_one_probe_per_probe_period(targets: Any, t0: datetime) -> None:
    """After PROBE_S exactly one row is read through; an unreachable probe extends the
    pause, a probe that gets through clears it and the rest drains."""
    state = {"down": True}
    calls: list[Job] = []

    def handler(job: Job) -> None:
        calls.append(job)
        if state["down"]:
            raise TargetUnreachable("refused")

    targets("fl.flaky", handler=handler)
    ids = [put("fl.flaky", t0, key=key) for key in keys_in(set(range(64)), 4, "probe")]
    worker = make_worker("A")
    assert worker.run(t0) == 1
    probe_at = t0 + 31 * SECOND
    assert worker.run(probe_at) == 1  # exactly one probe row
    assert len(calls) == 2
    assert TargetPause.objects.get(target="fl.flaky").paused_until == probe_at + 30 * SECOND
    assert worker.run(probe_at + 29 * SECOND) == 0
    state["down"] = False
    back_at = probe_at + 31 * SECOND
    assert worker.run(back_at) == 1  # the probe gets through ...
    assert not TargetPause.objects.filter(target="fl.flaky").exists()  # ... and resumes
    assert worker.run(back_at) == 3
    assert not JobModel.objects.filter(id__in=ids).exists()


def test_unreachable_for_two_days_keeps_attempts_then_drains_in_key_order(
        targets: Any, t0: datetime) -> None:
    state = {"down": True}
    sent: list[int] = []

    def handler(job: Job) -> None:
        if state["down"]:
            raise TargetUnreachable("broker down")
        sent.append(job.version)

    targets("fl.outage", handler=handler)
    ids = [put("fl.outage", t0, key="order-1", version=v) for v in (1, 2, 3)]
    worker = make_worker("A")
    for at in (t0, t0 + 31 * SECOND, t0 + timedelta(days=1), t0 + timedelta(days=2)):
        assert worker.run(at) == 1  # the first poll, then one probe each time
    assert [(row(i).status, row(i).attempts) for i in ids] == [(JobStatus.PENDING, 0)] * 3
    assert TargetPause.objects.filter(target="fl.outage").exists()
    state["down"] = False
    back = t0 + timedelta(days=2, seconds=31)
    assert [worker.run(back) for _ in range(4)] == [1, 1, 1, 0]
    assert sent == [1, 2, 3]


def test_one_probe_cluster_wide_between_two_workers(targets: Any, t0: datetime) -> None:
    """Two workers holding the paused target's rows in different partitions: only one of
    them sends a probe per PROBE_S (the target is still down, so the pause goes on)."""
    calls: list[Job] = []
    targets("fl.shared", handler=raising(TargetUnreachable("still down"), calls))
    first, second = make_worker("A"), make_worker("B")
    first.leases.heartbeat(t0)
    second.leases.heartbeat(t0)
    first.leases.heartbeat(t0)
    second.leases.heartbeat(t0)
    held_a, held_b = set(first.leases.held()), set(second.leases.held())
    assert held_a and held_b and not held_a & held_b
    put("fl.shared", t0, key=keys_in(held_a, 1, "a")[0])
    put("fl.shared", t0, key=keys_in(held_b, 1, "b")[0])
    store.pause_set("fl.shared", t0 - 31 * SECOND, 30, "down")  # its pause ran out at t0
    handed = [first.lane.run_once(t0), second.lane.run_once(t0)]
    assert handed == [1, 0]
    assert len(calls) == 1
    assert TargetPause.objects.get(target="fl.shared").paused_until == t0 + 30 * SECOND


def test_probe_is_claimed_only_by_a_worker_holding_a_row_of_the_target(
        targets: Any, t0: datetime) -> None:
    """A worker with no due row of the paused target leaves the probe to one that has:
    otherwise the pause would be extended with no probe sent."""
    calls: list[Job] = []
    targets("fl.probe-owner", handler=calls.append)
    first, second = make_worker("A"), make_worker("B")
    for _ in range(2):
        first.leases.heartbeat(t0)
        second.leases.heartbeat(t0)
    put("fl.probe-owner", t0, key=keys_in(set(second.leases.held()), 1, "b")[0])
    store.pause_set("fl.probe-owner", t0 - 31 * SECOND, 30, "down")
    assert first.lane.run_once(t0) == 0
    assert TargetPause.objects.get(target="fl.probe-owner").probe_by is None
    assert second.lane.run_once(t0) == 1
    assert len(calls) == 1
    assert not TargetPause.objects.filter(target="fl.probe-owner").exists()


@pytest.mark.django_db(transaction=True)
def test_racing_pause_gates_give_exactly_one_probe(targets: Any, now: datetime) -> None:
    """Two workers claim the same expired pause at the same moment (threads on
    PostgreSQL): one wins the probe, the other skips the target."""
    targets("fl.race")
    put("fl.race", now - SECOND)
    store.pause_set("fl.race", now - 31 * SECOND, 30, "down")
    gates = [PauseGate(name, conf.jobs_settings()) for name in ("A", "B")]
    partitions = list(range(conf.jobs_settings().PARTITIONS))
    assert store.jobs_fast_due(partitions, now, {"fl.race": 10}).probing == {"fl.race"}
    won = race(*[lambda gate=gate: gate.claim_probe("fl.race", now) for gate in gates])
    assert sorted(won) == [False, True]
    pause = TargetPause.objects.get(target="fl.race")
    assert (pause.paused_until, pause.probe_by) == (now + 30 * SECOND, "A" if won[0] else "B")


# -- the run log line, batch handlers ---------------------------------------------------------


def test_every_run_logs_one_line(targets: Any, t0: datetime,
                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="jobs_engine")
    targets("fl.ok")
    targets("fl.bad", handler=raising(ValueError("nope"), []))
    put("fl.ok", t0, dedupe_key="ok-1")
    put("fl.bad", t0, dedupe_key="bad-1")
    make_worker("A").run(t0)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("job run ")]
    assert len(lines) == 2
    pattern = (r"job run code={0} target={0} dedupe_key={1} attempts={2} "
               r"duration_ms=\d+\.\d result={3}$")
    assert any(re.match(pattern.format("fl.ok", "ok-1", 0, "ok"), line) for line in lines)
    assert any(re.match(pattern.format("fl.bad", "bad-1", 1, "retried"), line) for line in lines)


def test_batch_handler_gets_all_rows_of_a_poll_in_one_call(targets: Any, t0: datetime) -> None:
    """One send spans partitions: one in-flight statement marks them all, the handler
    gets every row of the poll at once, and each row's own result is its outcome."""
    batches: list[list[int | None]] = []

    def batch_handler(jobs: Any) -> list[BaseException | None]:
        batches.append([job.id for job in jobs])
        return [ValueError("second fails") if i == 1 else None for i in range(len(jobs))]

    targets("fl.batched", handler=lambda job: None, batch_handler=batch_handler,
            delivery_mode=DeliveryMode.AT_MOST_ONCE)
    in_p = [put("fl.batched", t0, key=key) for key in keys_in({11}, 5, "p")]
    in_q = [put("fl.batched", t0, key=key) for key in keys_in({12}, 2, "q")]
    with CaptureQueriesContext(connection) as queries:
        assert make_worker("A").run(t0) == 7
    assert [sorted(batch) for batch in batches] == [sorted(in_p + in_q)]
    # One statement marks the whole send (on PostgreSQL the poll's read itself).
    marks = [q["sql"] for q in queries if MARK_SQL in q["sql"]]
    assert len(marks) == 1
    if connection.vendor == "postgresql":
        assert "FROM due ORDER BY next_run_at, id" in marks[0]  # the poll's read
    failed = {batch[1] for batch in batches}
    assert set(JobModel.objects.values_list("id", flat=True)) == failed
    assert all(row(i).attempts == 1 for i in failed)  # type: ignore[arg-type]


def hand_in_one_poll(targets: Any, t0: datetime, worker: Worker, keys: list[str]
                     ) -> tuple[list[int], list[list[str]]]:
    """An at-most-once per-row row on each of ``keys``, all handed by ``worker`` in one
    poll, in key order; their ids and, for each, the statements run before its handler."""
    seen: list[tuple[int | None, list[str]]] = []
    start = len(connection.queries_log)

    def handler(job: Job) -> None:
        seen.append((job.id, [q["sql"] for q in list(connection.queries_log)[start:]]))

    targets("fl.per-row", handler=handler)
    ids = [put("fl.per-row", t0 + i * SECOND / 10, key=key) for i, key in enumerate(keys)]
    with CaptureQueriesContext(connection):
        start = len(connection.queries_log)
        assert worker.run(t0 + SECOND) == len(ids)
    assert [job_id for job_id, _ in seen] == ids
    assert not JobModel.objects.filter(id__in=ids).exists()
    return ids, [statements for _, statements in seen]


def marks_in(statements: list[str]) -> list[str]:
    return [sql for sql in statements if MARK_SQL in sql]


def test_the_read_marks_the_first_row_of_a_per_row_target(targets: Any, t0: datetime
                                                        ) -> None:
    """At-most-once, one row per send: on PostgreSQL the poll's read marks the first row
    in flight, so a worker woken for one row hands it after one statement; each later row
    is marked by a statement of its own just before it is handed. SQLite marks the first
    row right after the read. The pauses are read by the read itself."""
    _, seen = hand_in_one_poll(targets, t0, make_worker("A"), keys_in({11}, 3, "per-row"))
    marks = [marks_in(statements) for statements in seen]
    assert [len(m) for m in marks] == [1, 2, 3]
    pause_reads = [sql for sql in seen[0] if "targetpause" in sql]
    assert pause_reads and all("jobs_engine_job" in sql for sql in pause_reads)
    if connection.vendor == "postgresql":
        assert "FROM due ORDER BY next_run_at, id" in marks[0][0]  # the read itself


def test_fast_mark_rows_marks_a_per_row_targets_rows_that_many_at_a_time(
        targets: Any, t0: datetime, jobs_settings: Any) -> None:
    """``FAST_MARK_ROWS`` 3: the read marks the first three rows of an at-most-once per-row
    target, one statement marks the next three, another the last; each row is still
    handed alone, in key order, once."""
    worker = make_worker("A", jobs_settings(FAST_MARK_ROWS=3))
    _, seen = hand_in_one_poll(targets, t0, worker, keys_in({11, 12}, 7, "mark-rows"))
    assert [len(marks_in(statements)) for statements in seen] == [1, 1, 1, 2, 2, 2, 3]


def test_a_crash_presumes_the_rows_marked_with_the_row_in_hand_dead_never_sent_twice(
        targets: Any, t0: datetime, jobs_settings: Any) -> None:
    """``FAST_MARK_ROWS`` 3, A dies handing the second row: the three rows marked together
    go DEAD on takeover, the third never handed (at most once: possibly never); the fourth,
    not marked, stays PENDING and B sends it. No row is handed twice."""
    calls: list[Job] = []

    def handler(job: Job) -> None:
        calls.append(job)
        if len(calls) == 2:
            raise Crash

    targets("fl.crash", handler=handler)
    ids = [put("fl.crash", t0 + i * SECOND / 10, key=key)
           for i, key in enumerate(keys_in({21}, 4, "mark-crash"))]
    settings = jobs_settings(FAST_MARK_ROWS=3)
    with pytest.raises(Crash):
        make_worker("A", settings).run(t0 + SECOND)
    assert in_flight(21) == sorted(ids[:3])
    later = t0 + 31 * SECOND
    b = make_worker("B", settings)
    b.leases.heartbeat(later)
    assert [row(i).status for i in ids] == [JobStatus.DEAD] * 3 + [JobStatus.PENDING]
    assert {row(i).last_error for i in ids[:3]} == {"in flight when its partition was taken over"}
    assert b.lane.run_once(later) == 1
    assert [job.id for job in calls] == [ids[0], ids[1], ids[3]]
    assert not JobModel.objects.filter(status=JobStatus.PENDING).exists()


def test_a_stop_request_ends_a_marked_group_between_rows(
        targets: Any, t0: datetime, jobs_settings: Any) -> None:
    """SIGTERM during the first row of three marked together: the other two are not
    handed, and the write clears their marks, so they stay PENDING and no takeover judges
    them."""
    stop = threading.Event()
    sent: list[int | None] = []

    def handler(job: Job) -> None:
        sent.append(job.id)
        stop.set()

    targets("fl.stop", handler=handler)
    ids = [put("fl.stop", t0, payload=n) for n in range(3)]
    worker = make_worker("A", jobs_settings(FAST_MARK_ROWS=3))
    worker.lane.should_stop = stop.is_set
    assert worker.run(t0) == 1
    assert sorted(JobModel.objects.values_list("id", flat=True)) == sorted(set(ids) - set(sent))
    assert JobModel.objects.filter(status=JobStatus.PENDING).count() == 2
    assert in_flight() == []


def test_the_send_the_read_marked_goes_first(targets: Any, t0: datetime,
                                             jobs_settings: Any) -> None:
    """A head found by the walk of a whole backlog may be of a target earlier in name
    order than the one whose row the read marked; the marked row is still handed first, so
    no row sits marked in flight (judged sent, were the worker to die) while another send
    runs."""
    order: list[str] = []
    targets("fl.a-held", handler=lambda job: order.append(job.target))
    targets("fl.b-marked", handler=lambda job: order.append(job.target))
    for version, seconds_ago in ((2, 3), (1, 1)):  # v1 committed last, due last
        put("fl.a-held", t0 - seconds_ago * SECOND, key="k", version=version)
    put("fl.b-marked", t0 - 2 * SECOND, key="b")
    worker = make_worker("A", jobs_settings(FAST_BATCH=1))
    assert worker.run(t0) == 2
    assert order == ["fl.b-marked", "fl.a-held"]


def test_a_poll_of_successes_is_written_and_its_marks_cleared_in_one_statement(
        targets: Any, t0: datetime) -> None:
    """PostgreSQL: the outcomes of a poll whose rows all succeeded, their statistics and
    the clear of the poll's in-flight marks are one statement, atomic without a
    transaction. SQLite writes them in one transaction. The result is the same."""
    targets("fl.one_write", handler=lambda job: None, delivery_mode=DeliveryMode.AT_LEAST_ONCE)
    ids = [put("fl.one_write", t0, key=f"k{i}") for i in range(6)]
    with CaptureQueriesContext(connection) as queries:
        assert make_worker("A").run(t0) == 6
    writes = [q["sql"] for q in queries if "DELETE FROM jobs_engine_job" in q["sql"]]
    clears = [q["sql"] for q in queries if CLEAR_SQL in q["sql"]]
    assert len(writes) == 1
    if connection.vendor == "postgresql":
        assert clears == writes, "the clear is part of the write"
    else:
        assert len(clears) == 1 and clears != writes
    assert not JobModel.objects.filter(id__in=ids).exists()
    assert set(CompletedJob.objects.values_list("id", flat=True)) == set(ids)
    assert in_flight() == []
    assert ("fl.one_write", "ok", 6) in store.job_stats_totals()


# -- lost leases and takeovers -----------------------------------------------------------------


def test_worker_whose_lease_expired_sends_nothing(targets: Any, t0: datetime) -> None:
    """A's lease runs out (its own clock says so too); B takes every partition and sends."""
    target = targets("fl.lease")
    a = make_worker("A")
    a.leases.heartbeat(t0)
    ids = [put("fl.lease", t0, key=f"k{i}") for i in range(3)]
    later = t0 + 31 * SECOND
    a.clock.advance(31)
    b = make_worker("B")
    assert len(b.leases.heartbeat(later).taken) == 64
    assert a.leases.held() == []
    assert a.lane.run_once(later) == 0
    assert target.extra["calls"] == []
    assert b.lane.run_once(later) == 3
    assert {job.id for job in target.extra["calls"]} == set(ids)


@pytest.mark.parametrize("kind", [
    {},  # at-most-once per row: marked by its own statement before the send
    # Sends that take the whole poll: marked by the poll's read itself (on PostgreSQL),
    # under the same lease guard.
    {"batch_handler": lambda jobs: [None] * len(jobs)},
    {"delivery_mode": DeliveryMode.AT_LEAST_ONCE},
], ids=["per-row", "batch-handler", "at-least-once"])
def test_db_lease_guard_stops_a_worker_that_still_trusts_its_lease(
        targets: Any, t0: datetime, kind: dict[str, Any]) -> None:
    """A's monotonic clock says "trusted" but B took the partition: the in-flight mark is
    refused, A sends nothing, drops the partition and leaves the row as it was."""
    target = targets("fl.stall", **kind)
    a = make_worker("A")
    a.leases.heartbeat(t0)
    job_id = put("fl.stall", t0, key="k1")
    partition = row(job_id).partition
    later = t0 + 31 * SECOND
    make_worker("B").leases.heartbeat(later)
    assert partition in a.leases.held()
    assert a.lane.run_once(later) == 0
    assert target.extra["calls"] == []
    assert partition not in a.leases.held()
    assert (row(job_id).status, row(job_id).attempts) == (JobStatus.PENDING, 0)
    assert in_flight(partition) == []


def test_lease_lost_between_rows_sends_no_further_row(targets: Any, t0: datetime) -> None:
    """Self-fencing: after a send that outlived the worker's trust in its lease (lease
    minus a margin), it sends no further row, even though the database lease has not run
    out yet."""
    a = make_worker("A")
    calls: list[Job] = []

    def slow(job: Job) -> None:
        calls.append(job)
        a.clock.advance(29.5)  # past the 29 s of trust, inside the 30 s database lease

    targets("fl.slow", handler=slow)
    first, second = (put("fl.slow", t0, key=key) for key in keys_in({7}, 2, "slow"))
    assert a.run(t0) == 1
    assert [job.id for job in calls] == [first]
    assert not JobModel.objects.filter(id=first).exists()
    assert (row(second).status, row(second).attempts) == (JobStatus.PENDING, 0)


@pytest.mark.parametrize("kind", ["per-row", "per-row, second send", "batch-handler",
                                  "at-least-once"])
def test_a_stall_between_the_mark_and_the_hand_off_hands_nothing(
        targets: Any, t0: datetime, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """A stalls (SIGSTOP, a GC pause) right after marking, long enough to lose its lease:
    it hands nothing of that partition (its new owner may have sent later versions by
    now), and leaves the row as it was, its mark cleared, for the next owner. The poll's
    first send is marked by the read (PostgreSQL) or right after it (SQLite); a later
    per-row send (here after a row of a target first in name order) by a statement of its
    own."""
    handed: list[Job] = []

    def batch(jobs: Any) -> list[None]:
        handed.extend(jobs)
        return [None] * len(jobs)

    target = targets("fl.stalled-mark", handler=handed.append, **{
        "per-row": {}, "per-row, second send": {}, "batch-handler": {"batch_handler": batch},
        "at-least-once": {"delivery_mode": DeliveryMode.AT_LEAST_ONCE}}[kind])
    a = make_worker("A")
    job_id = put("fl.stalled-mark", t0, key=keys_in({11}, 1, "stalled")[0])
    if kind == "per-row, second send":
        first = targets("fl.a-first")
        put("fl.a-first", t0, key=keys_in({12}, 1, "first")[0])

    def stall(real: Callable[..., Any], marks_row: Callable[..., bool]) -> Callable[..., Any]:
        def marked_then_stalled(*args: Any, **kwargs: Any) -> Any:
            result = real(*args, **kwargs)
            if marks_row(result, *args):
                a.clock.advance(31)
            return result
        return marked_then_stalled

    monkeypatch.setattr(store, "jobs_fast_poll", stall(
        store.jobs_fast_poll,
        lambda poll, *_: any(job_id in ids for ids in poll.marked.values())))
    monkeypatch.setattr(store, "inflight_mark_if_leased", stall(
        store.inflight_mark_if_leased,
        lambda marked, *args: 11 in marked and any(row[1] == job_id for row in args[3])))
    assert a.run(t0) == (1 if kind == "per-row, second send" else 0)
    assert handed == [] and target.extra["calls"] == []
    if kind == "per-row, second send":
        assert len(first.extra["calls"]) == 1
    assert (row(job_id).status, row(job_id).attempts) == (JobStatus.PENDING, 0)
    assert in_flight(11) == []


@pytest.mark.parametrize("mode", [DeliveryMode.AT_MOST_ONCE, DeliveryMode.AT_LEAST_ONCE])
def test_takeover_judges_the_row_in_flight(targets: Any, t0: datetime, mode: DeliveryMode,
                                           dead_signals: list[dict[str, Any]]) -> None:
    """A dies while sending its first row. At-most-once: that row goes DEAD, the row it
    never handed stays PENDING. At-least-once: both stay PENDING and B sends them."""
    calls: list[Job] = []

    def handler(job: Job) -> None:
        calls.append(job)
        if len(calls) == 1:
            raise Crash

    targets("fl.crash", handler=handler, delivery_mode=mode)
    first, second = (put("fl.crash", t0, key=key) for key in keys_in({21}, 2, "crash"))
    a = make_worker("A")
    with pytest.raises(Crash):
        a.run(t0)
    assert first in in_flight(21)
    later = t0 + 31 * SECOND
    b = make_worker("B")
    b.leases.heartbeat(later)
    assert (Partition.objects.get(partition=21).owner, in_flight(21)) == (b.lane.worker_id, [])
    if mode is DeliveryMode.AT_MOST_ONCE:
        dead = row(first)
        assert (dead.status, dead.closed_at) == (JobStatus.DEAD, later)
        assert dead.last_error == "in flight when its partition was taken over"
        assert [s["job_id"] for s in dead_signals] == [first]
        assert (row(second).status, row(second).attempts) == (JobStatus.PENDING, 0)
        assert b.lane.run_once(later) == 1
        assert [job.id for job in calls] == [first, second]
    else:
        assert [row(i).status for i in (first, second)] == [JobStatus.PENDING] * 2
        assert dead_signals == []
        assert b.lane.run_once(later) == 2
        assert [job.id for job in calls] == [first, first, second]
    assert not JobModel.objects.filter(status=JobStatus.PENDING).exists()


def test_a_poll_marks_and_clears_without_updating_a_partition_row(targets: Any,
                                                                  t0: datetime) -> None:
    """In-flight marks are rows of their own, inserted and deleted: an update of the
    partition's row at every mark and clear left a version behind while another session
    held an old snapshot, and every later read of the partitions walked past them."""
    targets("fl.no-update")
    targets("fl.no-update-alo", delivery_mode=DeliveryMode.AT_LEAST_ONCE)
    for key in keys_in({3, 4}, 4, "nu"):
        put("fl.no-update", t0, key=key)
        put("fl.no-update-alo", t0, key=f"{key}-alo")
    worker = make_worker("A")
    worker.leases.heartbeat(t0)
    with CaptureQueriesContext(connection) as queries:
        assert worker.lane.run_once(t0) == 8
    sql = [q["sql"] for q in queries]
    assert any(MARK_SQL in s for s in sql) and any(CLEAR_SQL in s for s in sql)
    assert not [s for s in sql if re.search(r"UPDATE\s+jobs_engine_partition", s)]
    assert in_flight() == []


def test_outcome_written_under_the_inflight_token_stays_as_written(
        targets: Any, t0: datetime, dead_signals: list[dict[str, Any]]) -> None:
    """A's outcomes are written under its token but its mark is still there (a crash
    between the two in an engine that did not write them together): B's takeover leaves
    the written rows alone and clears the mark."""
    from jobs_engine.lanes import outcomes
    from jobs_engine.lanes.outcomes import Outcome, RunResult

    targets("fl.written")
    keys = keys_in({30}, 2, "written")
    retried = put("fl.written", t0, key=keys[0], dedupe_key="retried")
    closed = put("fl.written", t0, key=keys[1], dedupe_key="closed")
    a = make_worker("A")
    a.leases.heartbeat(t0)
    rows = {r.id: r for r in store.jobs_fast_due(a.leases.held(), t0, {"fl.written": 10}).jobs}
    token = "a-token"
    assert store.inflight_mark_if_leased(
        a.leases.worker_id, t0, token, [(30, retried, 0), (30, closed, 0)]) == {30}
    outcomes.write(store.Guard(Lane.FAST, token), [
        RunResult(rows[retried], Outcome.retried(t0 + 60 * SECOND, "answered"), 1.0),
        RunResult(rows[closed], Outcome.dead("DeadNow: invalid"), 1.0)], t0, conf.jobs_settings())

    later = t0 + 31 * SECOND
    make_worker("B").leases.heartbeat(later)
    kept = row(retried)
    assert (kept.status, kept.attempts, kept.next_run_at) == (
        JobStatus.PENDING, 1, t0 + 60 * SECOND)
    assert row(closed).last_error == "DeadNow: invalid"
    assert in_flight(30) == []
    assert dead_signals == []  # none from the takeover


def test_outcomes_and_the_mark_clear_commit_together(targets: Any, t0: datetime,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure while clearing the marks rolls the outcomes back too: the poll's rows
    are either in flight with no outcome (judged by delivery mode on takeover) or written
    and unmarked, never written and still marked."""
    calls: list[Job] = []
    targets("fl.atomic", handler=raising(ValueError("answered"), calls))
    job_id = put("fl.atomic", t0, key=keys_in({31}, 1, "atomic")[0])

    def failing_clear(token: str) -> None:
        raise RuntimeError("clear failed")

    monkeypatch.setattr(store, "inflight_clear", failing_clear)
    with pytest.raises(RuntimeError):
        make_worker("A").run(t0)
    assert len(calls) == 1
    assert (row(job_id).status, row(job_id).attempts) == (JobStatus.PENDING, 0)
    assert in_flight(31) == [job_id]


# -- rows closed mid-batch, stop requests ---------------------------------------------------


def test_a_row_closed_mid_batch_is_not_sent_while_the_lease_holds(targets: Any,
                                                                    t0: datetime) -> None:
    """Seed: "a row was closed by a takeover while this pod still holds the lease → not
    send it". Here an admin closes the second row while the first is being sent."""
    sent: list[int] = []
    closed: list[int] = []

    def handler(job: Job) -> None:
        sent.append(job.id)
        if not closed:  # while the batch is under way, another row of it goes DEAD
            closed.append(next(i for i in ids if i != job.id))
            JobModel.objects.filter(id=closed[0]).update(status="DEAD")

    targets("fl.closed", handler=handler)  # at-most-once, per row: one row per send
    ids = [put("fl.closed", t0, payload=n) for n in range(3)]
    worker = make_worker("A")
    assert worker.run(t0) == 2
    assert sorted(sent) == sorted(set(ids) - set(closed))
    assert row(closed[0]).status == "DEAD"
    assert worker.leases.held(), "the lease was not lost: only the closed row was left out"


def test_a_stop_request_ends_the_batch_between_sends(targets: Any, t0: datetime) -> None:
    """SIGTERM finishes the row in hand, not the whole batch: rows not handed stay
    PENDING and out of the in-flight mark, so a takeover never judges them."""
    stop = threading.Event()
    sent: list[int] = []

    def handler(job: Job) -> None:
        sent.append(job.id)
        stop.set()  # the signal arrives during the first send

    targets("fl.stop", handler=handler)
    ids = [put("fl.stop", t0, payload=n) for n in range(3)]
    worker = make_worker("A")
    worker.lane.should_stop = stop.is_set
    assert worker.run(t0) == 1
    assert len(sent) == 1
    assert sorted(JobModel.objects.values_list("id", flat=True)) == sorted(set(ids) - set(sent))
    assert in_flight() == []


def test_one_send_over_partitions_skips_only_the_partition_whose_lease_is_gone(
        targets: Any, t0: datetime) -> None:
    """A send spanning partitions is marked in one statement; a partition taken over
    meanwhile refuses its part, its rows are not handed, and the rest go out."""
    target = targets("fl.split", delivery_mode=DeliveryMode.AT_LEAST_ONCE)
    worker = make_worker("A")
    worker.leases.heartbeat(t0)
    kept = [put("fl.split", t0, key=key) for key in keys_in({3}, 2, "kept")]
    lost = [put("fl.split", t0, key=key) for key in keys_in({4}, 2, "lost")]
    Partition.objects.filter(partition=4).update(owner="B-elsewhere")  # A still trusts it
    assert worker.lane.run_once(t0) == 2
    assert sorted(job.id for job in target.extra["calls"]) == sorted(kept)
    assert sorted(JobModel.objects.values_list("id", flat=True)) == sorted(lost)
    assert 4 not in worker.leases.held() and 3 in worker.leases.held()


def test_a_retry_moves_the_later_versions_of_its_key_to_its_retry_time(
        targets: Any, t0: datetime) -> None:
    """Held rows leave the front of the run order, so polls do not walk them again and
    again; they follow the head as soon as it is sent."""
    failures = [ValueError("once")]
    sent: list[int | None] = []

    def handler(job: Job) -> None:
        if job.key == "another-key":
            return
        sent.append(job.version)
        if failures:
            raise failures.pop()

    targets("fl.push", handler=handler)
    key = keys_in(range(64), 1, "push")[0]
    ids = [put("fl.push", t0, key=key, version=v) for v in (1, 2, 3)]
    other = put("fl.push", t0, key="another-key", version=1)
    worker = make_worker("A")
    assert worker.run(t0) == 2  # v1 fails, the other key goes
    retry_at = row(ids[0]).next_run_at
    assert retry_at == t0 + SECOND
    assert [row(i).next_run_at for i in ids[1:]] == [retry_at, retry_at]
    assert not JobModel.objects.filter(id=other).exists()
    assert worker.run(retry_at - MILLISECOND) == 0
    assert [worker.run(retry_at) for _ in range(3)] == [1, 1, 1]
    assert sent == [1, 1, 2, 3]


def test_rows_of_a_target_not_registered_here_are_left_for_its_own_workers(
        targets: Any, t0: datetime) -> None:
    """During a rolling deploy a new target's rows wait for workers that know it, instead
    of burning their attempts on workers that do not."""
    target = targets("fl.known")
    targets("fl.new-release")
    unknown = put("fl.new-release", t0)
    registry.unregister_target("fl.new-release")  # this worker runs the older release
    known = put("fl.known", t0)
    assert make_worker("A").run(t0) == 1
    assert [job.id for job in target.extra["calls"]] == [known]
    assert (row(unknown).status, row(unknown).attempts) == ("PENDING", 0)


def test_a_row_enqueued_behind_a_retrying_head_starts_at_the_heads_retry_time(
        targets: Any, t0: datetime) -> None:
    """New versions of a key whose head waits for a retry are held anyway; they are born
    at the head's run time so they never crowd the front of the poll's scan."""
    failures = [ValueError("once")]

    def handler(job: Job) -> None:
        if failures:
            raise failures.pop()

    targets("fl.born-held", handler=handler)
    head = put("fl.born-held", t0, key="k", version=1)
    assert make_worker("A").run(t0) == 1
    retry_at = row(head).next_run_at
    later = enqueue("fl.born-held", None, key="k", version=2).job_id
    unrelated = enqueue("fl.born-held", None, key="other", version=1).job_id
    assert row(later).next_run_at == retry_at  # type: ignore[arg-type]
    assert row(unrelated).next_run_at < retry_at  # type: ignore[arg-type]


@pytest.mark.django_db(transaction=True)  # autocommit, as in a worker
def test_the_poll_keeps_its_plan_on_postgresql(targets: Any, t0: datetime) -> None:
    """The poll's statement is prepared on the worker's connection and keeps a generic
    plan (PostgreSQL plans it once a ``REPLAN_S`` instead of at every poll, 1-2 ms of a
    ~2 ms poll); the rows it reads are the same."""
    delivered: list[int | None] = []
    targets("fl.prepared", handler=lambda job: delivered.append(job.id))
    worker = make_worker("A")
    ids = []
    for n in range(8):
        ids.append(put("fl.prepared", t0))
        assert worker.run(t0 + n * timedelta(milliseconds=1)) == 1
    assert delivered == ids
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                           "WHERE statement LIKE %s", ["WITH due AS MATERIALIZED%"])
            assert cursor.fetchall() == [(8, 0)]


@pytest.mark.django_db(transaction=True)  # autocommit, as in a worker
def test_after_a_burst_into_a_queue_analysed_empty_the_poll_reads_its_index(
        targets: Any, t0: datetime, planner_clock: FakeMonotonic) -> None:
    """A queue analysed busy, then drained and vacuumed (no pages, no rows, the busy
    column statistics kept), takes a burst: until autovacuum analyses it again, up to a
    minute later, the poll's generic plan is made for those statistics. With the window's
    limit a parameter it reads the ordered index; a limit written into the text, larger
    than the rows the plan expects, was read by a bitmap scan and a sort of every due row
    (three workers drained a 50,000-row burst at half one worker's rate)."""
    targets("fl.burst", handler=lambda job: None, delivery_mode=DeliveryMode.AT_LEAST_ONCE,
            batch_size=200)
    worker = make_worker("A")
    burst = [{"target": "fl.burst", "key": f"k{n}", "run_at": t0} for n in range(3000)]
    if connection.vendor == "postgresql":  # analysed busy, then drained and vacuumed
        enqueue_many(burst)
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {store.JOBS}")
            cursor.execute(f"DELETE FROM {store.JOBS}")
            cursor.execute(f"VACUUM ANALYZE {store.JOBS}")
    with statements("WITH due AS MATERIALIZED") as polls:
        assert worker.run(t0) == 0
        enqueue_many(burst)
        planner_clock.advance(REPLAN_S)  # the session makes its plans again, for 3,000 rows
        assert worker.run(t0) == 200
    if connection.vendor != "postgresql":  # no plans kept: nothing more to see
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements WHERE statement LIKE %s "
                       "ORDER BY prepare_time DESC LIMIT 1", ["WITH due AS MATERIALIZED%"])
        (name,) = cursor.fetchone()
        cursor.execute(f"EXPLAIN EXECUTE {name}({', '.join(['%s'] * len(polls[-1][1]))})",
                       polls[-1][1])
        plan = "\n".join(line for (line,) in cursor.fetchall())
    assert "Index Scan using jobs_fast_pending_due" in plan
    assert "Seq Scan on jobs_engine_job" not in plan
    assert "Sort Key: j.next_run_at" not in plan, plan  # the index's own order


def test_a_target_whose_window_was_handed_is_read_after_it_next_time(
        targets: Any, t0: datetime, jobs_settings: Any) -> None:
    """A cursor: after a full window of a target was handed, its next reads start after
    that window's last row (and the lag band before it), not at the first due row: rows
    before it were handed and deleted, and walking their dead index entries again made
    every poll of a drain slower while another session held an old snapshot. The cursor
    stays when a later window is not full. A row committed behind it, by more than the
    lag (its transaction began long before), is read by the next deep read, a POLL_S
    later; a wake-up does not read from the start."""
    from jobs_engine.store import CURSOR_LAG, dialect

    target = targets("fl.cursor", delivery_mode=DeliveryMode.AT_LEAST_ONCE)
    worker = make_worker("A", jobs_settings(FAST_BATCH=10))
    at = t0 + 60 * SECOND  # every row below is due by then
    first = [put("fl.cursor", t0 + i * MILLISECOND) for i in range(25)]
    cursor_at = t0 + 9 * MILLISECOND
    marker = (cursor_at.isoformat() if connection.vendor == "postgresql"
              else dialect.dt(cursor_at - CURSOR_LAG))

    def reads_after_cursor(params: Any) -> bool:
        return any(isinstance(p, str) and marker in p for p in params or ())

    with statements("") as seen:
        assert worker.run(at) == 10  # a deep read, from the first row
        assert worker.run(at) == 10  # after the first window
    reads = [params for sql, params in seen if "AND j.target = " in sql]
    assert not reads_after_cursor(reads[0]) and reads_after_cursor(reads[-1])
    late = put("fl.cursor", t0 - SECOND)  # committed now, its transaction began long before
    assert worker.run(at) == 5  # the window's last rows: not full, the cursor stays
    assert worker.run(at) == 0
    assert worker.lane.run_once(at, woken=True) == 0  # a wake-up reads after the cursor too
    in_band = put("fl.cursor", t0 + 24 * MILLISECOND - CURSOR_LAG / 2)
    assert worker.run(at) == 1  # within the lag band before the cursor: read
    worker.clock.advance(1)  # POLL_S later: a deep read
    assert worker.run(at) == 1
    assert [job.id for job in target.extra["calls"]] == [*first, in_band, late]
    more = [put("fl.cursor", t0 + 10 * SECOND + i * MILLISECOND) for i in range(20)]
    assert worker.run(at) == 10
    behind = put("fl.cursor", t0 + 5 * SECOND)  # behind the cursor, by more than the lag
    assert worker.run(at) == 10
    assert worker.run(at) == 0
    assert behind not in [job.id for job in target.extra["calls"]]
    worker.clock.advance(1)
    assert worker.run(at) == 1
    assert target.extra["calls"][-1].id == behind and not JobModel.objects.exists()
    assert sorted(job.id for job in target.extra["calls"]) == sorted(
        [*first, in_band, late, *more, behind])


def test_polls_ask_the_database_for_the_time_once_a_second(targets: Any, now: datetime
                                                           ) -> None:
    """A worker's polls (no decision time given, as in a worker) read the database's clock
    once and move it on with the monotonic clock; a second later they read it again."""
    targets("fl.clock", handler=lambda job: None)
    worker = make_worker("A")
    worker.leases.heartbeat(store.db_now())
    reads: list[str] = []

    def count(execute: Any, sql: str, *args: Any) -> Any:
        if sql == "SELECT clock_timestamp()":
            reads.append(sql)
        return execute(sql, *args)

    with connection.execute_wrapper(count):
        for _ in range(3):
            put("fl.clock", now - 60 * SECOND)
            assert worker.lane.run_once() == 1
            worker.clock.advance(0.3)
        assert len(reads) == (1 if connection.vendor == "postgresql" else 0)
        worker.clock.advance(0.2)
        put("fl.clock", now - 60 * SECOND)
        assert worker.lane.run_once() == 1
    assert len(reads) == (2 if connection.vendor == "postgresql" else 0)


# -- which targets a poll reads ---------------------------------------------------------------


def unannounced(target: str, at: datetime) -> int:
    """A row the enqueue count does not announce (as if enqueued by a process that died
    between its commit and the count): the count is put back. SQLite has no count."""
    if connection.vendor != "postgresql":
        return put(target, at)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT pg_sequence_last_value('{store.ENQUEUES_FAST}')")
        (count,) = cursor.fetchone()
        job_id = put(target, at)
        cursor.execute(f"SELECT setval('{store.ENQUEUES_FAST}', %s)", [count])
    return job_id


def test_a_busy_worker_reads_an_idle_target_once_rows_may_have_come_for_it(
        targets: Any, t0: datetime, jobs_settings: Any) -> None:
    """Registered targets that receive nothing cost a poll nothing: a poll reads the
    targets it found rows of lately, and the others only when the enqueue count moved since
    two polls before, or at the deep read once a POLL_S. SQLite reads every target."""
    busy = targets("fl.busy", delivery_mode=DeliveryMode.AT_LEAST_ONCE)
    idle = [targets(f"fl.idle-{n}", delivery_mode=DeliveryMode.AT_LEAST_ONCE)
            for n in range(20)]
    worker = make_worker("A", jobs_settings(FAST_BATCH=10))
    for i in range(100):
        put("fl.busy", t0 + i * MILLISECOND)
    at = t0 + 60 * SECOND
    assert [worker.run(at) for _ in range(3)] == [10, 10, 10]  # the count settles
    quiet = unannounced("fl.idle-3", t0)
    assert worker.run(at) == (10 if connection.vendor == "postgresql" else 11)
    if connection.vendor == "postgresql":
        assert not idle[3].extra["calls"], "an idle target was read though nothing came"
        with connection.cursor() as cursor:  # a count: rows may have come
            cursor.execute(f"SELECT nextval('{store.ENQUEUES_FAST}')")
        assert worker.run(at) == 11
    assert [job.id for job in idle[3].extra["calls"]] == [quiet]
    assert [worker.run(at) for _ in range(2)] == [10, 10]  # the count settles again
    deep = unannounced("fl.idle-4", t0)
    ran = [worker.run(at) for _ in range(2)]
    if connection.vendor == "postgresql":
        assert ran == [10, 10] and not idle[4].extra["calls"]
        worker.clock.advance(1)  # POLL_S: the deep read reads every target
        assert worker.run(at) == 11
    assert [job.id for job in idle[4].extra["calls"]] == [deep]
    assert len(busy.extra["calls"]) == (100 if connection.vendor == "postgresql" else 80)


def test_a_wake_up_reads_the_targets_its_notifications_named(
        targets: Any, t0: datetime) -> None:
    """The poll answering a NOTIFY reads the targets it named (and those it found rows of
    lately), not every registered one; a notification naming none reads every target."""
    named = targets("fl.named", delivery_mode=DeliveryMode.AT_LEAST_ONCE)
    other = targets("fl.other", delivery_mode=DeliveryMode.AT_LEAST_ONCE)
    worker = make_worker("A")
    at = t0 + SECOND
    assert worker.run(at) == 0  # the deep read of a worker's first poll
    unannounced("fl.named", t0)
    unannounced("fl.other", t0)
    assert worker.lane.run_once(at, woken=True, named=frozenset({"fl.named"})) == 1
    assert len(named.extra["calls"]) == 1 and not other.extra["calls"]
    assert worker.lane.run_once(at, woken=True, named=None) == 1
    assert len(other.extra["calls"]) == 1


class WalkCounting(dict[str, int]):
    """A worker's limits that count the walks over every target."""

    walks = 0

    def __iter__(self) -> Any:
        WalkCounting.walks += 1
        return super().__iter__()

    def items(self) -> Any:
        WalkCounting.walks += 1
        return super().items()


def test_a_wake_up_walks_neither_every_target_nor_sends_every_per_row_name(
        targets: Any, t0: datetime, monkeypatch: Any) -> None:
    """A wake-up's poll reads the few targets named, and its path is not walked once per
    registered target: with 500, two walks of the limits were 0.1 ms of it, and the
    worker's whole list of per-row targets an array the server parsed (0.07 ms)."""
    named = targets("fl.woken-named")  # at most once: sent per row
    idle = [targets(f"fl.woken-idle-{i:02}") for i in range(30)]
    worker = make_worker("A")
    at = t0 + SECOND
    assert worker.run(at) == 0
    unannounced("fl.woken-named", t0)
    limits, per_row = worker.lane._limits(registry.lane_targets(Lane.FAST))
    assert {t.name for t in idle} <= set(per_row)
    monkeypatch.setattr(worker.lane, "_limits", lambda fast: (WalkCounting(limits), per_row))
    WalkCounting.walks = 0
    with statements("WITH due AS MATERIALIZED") as polls:
        assert worker.lane.run_once(at, woken=True, named=frozenset({"fl.woken-named"})) == 1
    assert WalkCounting.walks == 0
    assert len(named.extra["calls"]) == 1
    if connection.vendor == "postgresql":
        (_, params), = polls
        # The statement's per-row names are the one target read, not the worker's list.
        assert '{"fl.woken-named"}' in params
        assert not [p for p in params if isinstance(p, str) and "fl.woken-idle" in p]


@pytest.mark.django_db(transaction=True)  # another connection commits a row
def test_a_count_read_before_its_rows_were_committed_still_gets_them_read(
        targets: Any, t0: datetime, jobs_settings: Any) -> None:
    """An enqueue counts its rows at the insert, before its commit: a poll can read the
    count moved and still not see the rows, and the polls after it read the same count
    for as long as the enqueue stays open. The enqueue holds the lane's lock until its
    commit, and a count read while it is held is none to compare with: the polls keep
    reading every target, and the first after the commit finds the rows."""
    if connection.vendor != "postgresql":  # no count: every poll reads every target
        return
    from tests.db.test_enqueue import pg_connect

    targets("fl.busy", delivery_mode=DeliveryMode.AT_LEAST_ONCE)
    late = targets("fl.late", delivery_mode=DeliveryMode.AT_LEAST_ONCE)
    worker = make_worker("A", jobs_settings(FAST_BATCH=10))
    for i in range(100):
        put("fl.busy", t0 + i * MILLISECOND)
    at = t0 + 60 * SECOND
    assert [worker.run(at) for _ in range(3)] == [10, 10, 10]
    with pg_connect() as web:  # a transaction of its own: counted at the insert, not committed
        web.execute(f"SELECT * FROM {store.INSERT_PAYLOADS_FUNCTION}('fl.late', 'fl.late', "
                    "'fast', 'at_least_once', 64, NULL, NULL, '[1]'::jsonb, NULL) AS r, "
                    f"{store.ENQUEUING_FUNCTION}(ARRAY['fast'])")
        # the count moved once, then stood; the row is not there yet
        assert [worker.run(at) for _ in range(4)] == [10, 10, 10, 10]
        web.commit()  # nobody waited: nothing counts after it
    assert worker.run(at) == 11
    assert len(late.extra["calls"]) == 1


def test_targets_named_with_quotes_and_placeholders_are_read(targets: Any, t0: datetime,
                                                             jobs_settings: Any) -> None:
    """A worker's targets are constants of its statements' text on PostgreSQL (quoted
    there, their ``%`` doubled for the driver): any name a target may have is read, by
    the deep read, the poll between two and the backlog walk."""
    names = ["fl.it's 100%s {a,b}", 'fl.quote"back\\slash', "fl.plain"]
    for name in names:
        targets(name, delivery_mode=DeliveryMode.AT_LEAST_ONCE)
    worker = make_worker("A", jobs_settings(FAST_BATCH=10))
    first = [put(name, t0) for name in names]
    assert worker.run(t0) == 3  # the deep read
    later = [put(name, t0) for name in names]
    assert [worker.run(t0) for _ in range(3)] == [3, 0, 0]  # after the count moved
    for name, ids in zip(names, zip(first, later, strict=True), strict=True):
        assert [job.id for job in registry.get_target(name).extra["calls"]] == list(ids)
