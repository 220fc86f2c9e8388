"""The long lane against a real database (docs/design.md#lanes).

Lanes run with ``threads=False`` and a fake monotonic clock, and every poll gets an
explicit decision time. "A handler runs while time passes" is played out inside the
handler itself: it renews, or lets another worker poll, at later times before returning.
Concurrent reservations run in real threads on PostgreSQL and in turn on SQLite.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction

from jobs_engine import JobPolicy, registry, store
from jobs_engine.conf import JobsSettings, load_settings
from jobs_engine.enqueueing import enqueue, enqueue_many
from jobs_engine.errors import TargetUnreachable
from jobs_engine.job import Job
from jobs_engine.lanes.long import LongLane
from jobs_engine.lanes.outage import is_database_fault
from jobs_engine.lanes.pauses import PauseGate
from jobs_engine.lanes.worker import WorkerProcess
from jobs_engine.models import Job as JobModel
from jobs_engine.models import TargetPause
from jobs_engine.states import DeliveryMode, JobStatus, Lane
from jobs_engine.store.planning import ANALYZE_EVERY_S, BEHIND_FROM_ROWS, REPLAN_S
from tests.helpers import FakeMonotonic, race, statements

pytestmark = pytest.mark.django_db

SECOND = timedelta(seconds=1)
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
MILLISECOND = timedelta(milliseconds=1)
SETTINGS = load_settings({}, environ={})


class Crash(BaseException):
    """Stands for the worker process dying mid-run: nothing after the handler runs."""


def long_worker(name: str, settings: JobsSettings = SETTINGS,
                clock: FakeMonotonic | None = None) -> LongLane:
    worker_id = f"{name}-{uuid.uuid4().hex[:6]}"
    return LongLane(worker_id, settings, PauseGate(worker_id, settings), threads=False,
                    monotonic=clock or FakeMonotonic())


def put(target: str, at: datetime, *, code: str | None = None) -> int:
    result = enqueue(target, None, code=code, run_at=at)
    assert result.job_id is not None
    return result.job_id


def row(job_id: int) -> JobModel:
    return JobModel.objects.get(id=job_id)



@pytest.fixture
def t0(now: datetime) -> datetime:
    return now




# -- reserve and renew -------------------------------------------------------------------------


def test_reserve_takes_at_most_long_batch_under_one_token_and_lease(targets: Any,
                                                                    t0: datetime) -> None:
    seen: list[list[tuple[Any, ...]]] = []

    def handler(job: Job) -> None:
        if not seen:
            seen.append(list(JobModel.objects.filter(status=JobStatus.RUNNING).values_list(
                "claim_token", "claimed_by", "lease_until")))

    targets("ll.reserve", handler=handler, lane="long")
    for _ in range(12):
        put("ll.reserve", t0)
    lane = long_worker("A")
    assert lane.run_once(t0) == 10
    running = seen[0]
    assert len(running) == 10
    assert len({token for token, _, _ in running}) == 1
    assert {(owner, lease) for _, owner, lease in running} == {
        (lane.worker_id, t0 + timedelta(seconds=300))}
    assert JobModel.objects.count() == 2
    assert lane.run_once(t0) == 2
    assert JobModel.objects.count() == 0


def test_a_woken_reserve_takes_a_few_rows_and_the_next_reserve_the_rest(
        targets: Any, t0: datetime) -> None:
    """A reserve answering a wake-up runs on plans that may predate the rows it finds, so
    it takes at most ``WOKEN_POLL_ROWS`` rows, whatever the free slots; the reserve after
    it fills them."""
    targets("ll.woken", handler=lambda job: None, lane="long")
    for _ in range(40):
        put("ll.woken", t0)
    lane = long_worker("W", load_settings({"LONG_BATCH": 30, "LONG_PREFETCH": 1},
                                          environ={}))
    assert lane.free_slots().rows == 30
    assert lane.run_once(t0, woken=True) == store.WOKEN_POLL_ROWS
    assert lane.run_once(t0) == 30
    assert JobModel.objects.count() == 0


def test_a_poll_passes_the_names_the_registry_made_once(targets: Any, t0: datetime,
                                                      monkeypatch: Any) -> None:
    """The reserve and the read of the next due row get the lists the registry keeps
    (``registry.lane_names``): with 500 targets, making them at each poll held the thread
    a woken row's handler waits for."""
    targets("ll.names", handler=lambda job: None, lane="long")
    targets("ll.names-x", handler=lambda job: None, lane="long", exclusive=True)
    passed: list[tuple[Any, ...]] = []
    reserve, next_due = store.jobs_long_reserve, store.jobs_long_next_due

    def spy_reserve(*args: Any, **kwargs: Any) -> Any:
        passed.append((kwargs["targets"], kwargs["exclusive_targets"]))
        return reserve(*args, **kwargs)

    def spy_next_due(names: Any, now: datetime) -> Any:
        passed.append((names,))
        return next_due(names, now)

    monkeypatch.setattr(store, "jobs_long_reserve", spy_reserve)
    monkeypatch.setattr(store, "jobs_long_next_due", spy_next_due)
    put("ll.names", t0)
    lane = long_worker("N")
    assert lane.run_once(t0) == 1
    assert lane.run_once(t0) == 0
    made = registry.lane_names(Lane.LONG)
    assert "ll.names-x" in made.exclusive_names
    assert len(passed) == 3
    for names, *exclusive in passed:
        # The reserve's are the targets without limits (those have their admission).
        assert names is (made.free_names if exclusive else made.names)
        assert all(given is made.exclusive_names for given in exclusive)


def test_short_handlers_get_long_prefetch_rows_per_thread_and_slow_ones_one(
        targets: Any, t0: datetime) -> None:
    """The first poll knows no handler yet: one row per thread. Handlers under
    ``SHORT_HANDLER_MS`` on average: ``LONG_PREFETCH`` rows per thread in one reserve. Once
    the average is slow again: one per thread."""
    clock = FakeMonotonic()
    took = {"s": 0.0}

    def handler(job: Job) -> None:
        clock.advance(took["s"])

    targets("ll.prefetch", handler=handler, lane="long")
    for _ in range(40):
        put("ll.prefetch", t0)
    settings = load_settings({"LONG_BATCH": 2, "LONG_PREFETCH": 3}, environ={})
    lane = LongLane("P", settings, PauseGate("P", settings), threads=False, monotonic=clock)
    took["s"] = 0.001
    assert [lane.free_slots().rows, lane.run_once(t0)] == [2, 2]  # no handler timed yet
    assert [lane.free_slots().rows, lane.run_once(t0)] == [6, 6]  # 1 ms each: 3 per thread
    took["s"] = 0.5  # the average passes 10 ms after the first of these
    assert lane.run_once(t0) == 6  # reserved while the average was still short
    assert [lane.free_slots().rows, lane.run_once(t0)] == [2, 2]
    assert JobModel.objects.count() == 40 - 16


def test_a_reserve_takes_no_more_at_most_once_rows_than_its_bound(targets: Any,
                                                                    t0: datetime) -> None:
    """An at-most-once row past the bound stays PENDING, in its place; the at-least-once
    rows after it are still taken, within ``limit``."""
    targets("ll.bound.amo", lane="long")
    targets("ll.bound.alo", lane="long", delivery_mode=DeliveryMode.AT_LEAST_ONCE)
    ids = [put("ll.bound.amo" if n % 2 else "ll.bound.alo", t0 + n * SECOND)
           for n in range(10)]  # at-least-once, at-most-once, ... in run order
    names = ["ll.bound.amo", "ll.bound.alo"]
    got = store.jobs_long_reserve("A", "tok", t0 + MINUTE, 300, 8, targets=names, start=True,
                                  at_most_once_limit=2)
    assert [r.job.id for r in got] == [ids[0], ids[1], ids[2], ids[3], ids[4], ids[6]]
    assert set(JobModel.objects.filter(status=JobStatus.PENDING).values_list(
        "id", flat=True)) == {ids[5], ids[7], ids[8], ids[9]}
    got = store.jobs_long_reserve("B", "tok2", t0 + MINUTE, 300, 8, targets=names, start=True,
                                  at_most_once_limit=0)
    assert [r.job.id for r in got] == [ids[8]]


def mixed_backlog_lane(targets: Any, t0: datetime, name: str, rows: int,
                       handler: Callable[[Job], None], **prefetch: int) -> LongLane:
    """A lane (``LONG_BATCH`` 2, handlers run in the caller) facing ``rows`` rows due in turn of
    targets ``<name>.alo`` (at least once, first) and ``<name>.amo`` (at most once)."""
    targets(f"{name}.amo", handler=handler, lane="long")
    targets(f"{name}.alo", handler=handler, lane="long",
            delivery_mode=DeliveryMode.AT_LEAST_ONCE)
    for n in range(rows):
        put(f"{name}.amo" if n % 2 else f"{name}.alo", t0 + n * SECOND)
    settings = load_settings({"LONG_BATCH": 2, **prefetch}, environ={})
    return LongLane(name, settings, PauseGate(name, settings), threads=False,
                    monotonic=FakeMonotonic())


def test_short_handlers_queue_at_most_once_rows_less_deep(targets: Any, t0: datetime) -> None:
    """While handlers are short a reserve takes ``LONG_PREFETCH`` rows per thread, of which
    at most ``LONG_PREFETCH_AT_MOST_ONCE`` at most once: those a crash presumes DEAD."""
    lane = mixed_backlog_lane(targets, t0, "ll.depth", 60, lambda job: None,
                              LONG_PREFETCH=5, LONG_PREFETCH_AT_MOST_ONCE=2)
    assert lane.free_slots() == (2, 2)  # no handler timed yet: one row per thread
    assert lane.run_once(t0 + MINUTE) == 2
    assert lane.free_slots() == (10, 4)
    # Half the rows it took were at most once: it takes the next 8, 4 of them at most once.
    assert lane.run_once(t0 + MINUTE) == 8
    assert JobModel.objects.filter(target="ll.depth.amo").count() == 30 - 1 - 4
    assert JobModel.objects.filter(target="ll.depth.alo").count() == 30 - 1 - 4
    for n in range(60, 80):  # at least once only from here on, after 40 mixed rows
        put("ll.depth.alo", t0 + n * SECOND)
    JobModel.objects.filter(target="ll.depth.amo").delete()
    assert lane.run_once(t0 + 2 * MINUTE) == 8  # half were at most once the last time
    assert lane.run_once(t0 + 2 * MINUTE) == 10  # none were: every free slot


def test_a_crash_presumes_no_more_at_most_once_rows_dead_than_their_prefetch(
        targets: Any, t0: datetime) -> None:
    """The worker dies in the handler of the first row of a deep reserve: of the rows it
    had started, the at-most-once ones go DEAD, at most ``LONG_BATCH`` x
    ``LONG_PREFETCH_AT_MOST_ONCE``; the at-least-once ones run again."""
    timing = {"crash": False}

    def handler(job: Job) -> None:
        if timing["crash"]:
            raise Crash

    lane = mixed_backlog_lane(targets, t0, "ll.exposed", 80, handler,
                              LONG_PREFETCH=8, LONG_PREFETCH_AT_MOST_ONCE=3)
    assert lane.run_once(t0 + MINUTE) == 2  # times the handlers: short
    timing["crash"] = True
    with pytest.raises(Crash):
        lane.run_once(t0 + MINUTE)
    started = JobModel.objects.filter(status=JobStatus.RUNNING)
    assert started.count() == 12  # half at most once, as the first reserve's rows
    assert started.filter(target="ll.exposed.amo").count() == 2 * 3
    timing["crash"] = False
    assert long_worker("B").run_once(t0 + 10 * MINUTE) > 0
    dead = JobModel.objects.filter(status=JobStatus.DEAD)
    assert dead.count() == 6 and {job.target for job in dead} == {"ll.exposed.amo"}


@pytest.mark.django_db(transaction=True)  # the pool threads write on connections of their own
def test_prefetched_rows_wait_for_a_free_thread(targets: Any, t0: datetime) -> None:
    """A deeper queue, not more threads: no more than ``LONG_BATCH`` handlers ever run at
    once, and every queued row runs, once."""
    lock, running, most, ran = threading.Lock(), [0], [0], []

    def handler(job: Job) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.002)
        with lock:
            running[0] -= 1
            ran.append(job.id)

    targets("ll.prefetch-threads", handler=handler, lane="long")
    ids = [put("ll.prefetch-threads", t0) for _ in range(30)]
    settings = load_settings({"LONG_BATCH": 3, "LONG_PREFETCH": 4}, environ={})
    lane = LongLane("Q", settings, PauseGate("Q", settings))
    try:
        reserved = [lane.run_once(t0)]
        deadline = time.monotonic() + 20
        while len(ran) < 30 and time.monotonic() < deadline:
            time.sleep(0.005)
            if not lane.in_hand():  # SQLite: one writer at a time, the lane's or this one
                reserved.append(lane.run_once(t0))
    finally:
        lane.shutdown(wait=True)
    assert reserved[0] == 3 and max(reserved) == 12  # 3 threads, then 4 rows each
    assert most[0] == 3
    assert sorted(ran) == sorted(ids)
    assert not JobModel.objects.filter(id__in=ids).exists()


@pytest.mark.django_db(transaction=True)  # autocommit, as in a worker
def test_the_reserve_and_the_write_of_successes_keep_their_plans_on_postgresql(
        targets: Any, t0: datetime) -> None:
    """Both are prepared on the worker's connection, each one text whatever the number of
    rows, with a generic plan: PostgreSQL plans them once a ``REPLAN_S``, not at every
    call (the planning of the reserve took longer than its run)."""
    ran: list[int | None] = []
    targets("ll.planned", handler=lambda job: ran.append(job.id), lane="long",
            policy=JobPolicy(keep_completed=100))
    lane = long_worker("P")
    ids = []
    for n in range(1, 5):  # 1, 2, 3 and 4 rows a poll
        ids += [put("ll.planned", t0) for _ in range(n)]
        assert lane.run_once(t0) == n
    assert sorted(ran) == sorted(ids)
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT split_part(statement, ' ', 2), generic_plans, custom_plans "
                       "FROM pg_prepared_statements WHERE statement LIKE 'WITH locked%' "
                       "OR statement LIKE 'WITH r(id%' ORDER BY 1")
        # Without threads each row's outcome is its own write: 10 writes, one text.
        assert cursor.fetchall() == [("locked_above", 4, 0), ("r(id,", 10, 0)]


@pytest.mark.django_db(transaction=True)  # autocommit, as in a worker
def test_a_plan_made_on_an_empty_queue_is_made_again_within_replan_s(
        targets: Any, t0: datetime, planner_clock: FakeMonotonic) -> None:
    """A worker session keeps a generic plan per prepared statement, made for the table's
    size at the time: the reserve's plan made on an empty queue walks the whole table.
    ``REPLAN_S`` later the session makes its plans again, for the table as it is (at the
    poll after the one answering a wake-up, which goes straight to the woken rows)."""
    targets("ll.replan", handler=lambda job: None, lane="long")
    lane = long_worker("R", load_settings({"LONG_PREFETCH": 1}, environ={}))
    analyse_empty_queue()
    with statements("WITH locked") as reserves:
        assert lane.run_once(t0) == 0
    enqueue_many([{"target": "ll.replan", "run_at": t0} for _ in range(3000)])
    if connection.vendor != "postgresql":  # no plans kept: nothing more to see
        assert lane.run_once(t0) == 10
        return

    assert "Seq Scan on jobs_engine_job j" in reserve_plan(reserves)  # kept, made for no rows
    planner_clock.advance(REPLAN_S / 2)
    assert lane.run_once(t0) == 10
    assert "Seq Scan on jobs_engine_job j" in reserve_plan(reserves)
    planner_clock.advance(REPLAN_S / 2)
    store.planner.poll_woken(True)  # a wake-up's poll runs with the plans the session has
    assert lane.run_once(t0, woken=True) == 10
    assert "Seq Scan on jobs_engine_job j" in reserve_plan(reserves)
    store.planner.poll_woken(False)  # and the poll after it makes them again
    assert lane.run_once(t0) == 10
    plan = reserve_plan(reserves)
    assert "Seq Scan on jobs_engine_job j" not in plan
    assert "Index Scan using jobs_long_pending_due" in plan


@pytest.mark.django_db(transaction=True)  # autocommit, as in a worker
def test_a_reserve_planned_on_an_empty_queue_reads_the_running_codes_once(
        targets: Any, t0: datetime) -> None:
    """With an exclusive target registered the reserve skips candidates whose code runs.
    Tested per candidate, a plan made on an empty queue read the whole table for each
    one (a 10,000-row burst: 0.6 s a reserve, a million: hours); the running codes are
    read once per statement, whatever the plan."""
    targets("ll.plain", handler=lambda job: None, lane="long")
    targets("ll.excl", handler=lambda job: None, lane="long", exclusive=True)
    lane = long_worker("E", load_settings({"LONG_PREFETCH": 1}, environ={}))
    analyse_empty_queue()
    with statements("WITH locked") as reserves:
        assert lane.run_once(t0) == 0
        enqueue_many([{"target": "ll.plain", "run_at": t0} for _ in range(2000)]
                     + [{"target": "ll.excl", "code": "same", "run_at": t0}
                        for _ in range(5)])
        assert lane.run_once(t0) == 10
    if connection.vendor != "postgresql":  # no plans kept: nothing more to see
        return
    plan = reserve_plan(reserves)
    assert "Seq Scan on jobs_engine_job j" in plan  # made for no rows, still kept
    assert "NOT (hashed SubPlan" in plan  # one read of the running codes, hashed


@pytest.mark.django_db(transaction=True)  # autocommit, as in a worker
def test_a_burst_the_statistics_do_not_know_of_has_the_table_analysed(
        targets: Any, t0: datetime, planner_clock: FakeMonotonic) -> None:
    """Statistics that describe the table before a burst (analysed empty) make every plan
    read the burst as a handful of rows, until autovacuum analyses it, a minute later.
    A worker pass that handed more rows than the planner believes the table holds has it
    analysed at once (``Planner.analyze_when_behind``), and the plans made again for the
    rows there are; at most once an ``ANALYZE_EVERY_S``, and not for a few rows. The
    planner is not busy: the plans are made again by the analyse only."""
    analyze_when_behind = store.planner.analyze_when_behind
    targets("ll.behind", handler=lambda job: None, lane="long")
    lane = long_worker("S", load_settings({"LONG_PREFETCH": 1}, environ={}))
    analyse_empty_queue()
    with statements("WITH locked") as reserves:
        assert lane.run_once(t0) == 0
        enqueue_many([{"target": "ll.behind", "run_at": t0} for _ in range(3000)])
        assert lane.run_once(t0) == 10
        if connection.vendor != "postgresql":  # no statistics, no plans kept
            assert not analyze_when_behind(3000)
            return
        assert not analyze_when_behind(BEHIND_FROM_ROWS - 1)
        assert store.table_row_estimate(store.JOBS) == 0
        assert analyze_when_behind(2990)
        assert (store.table_row_estimate(store.JOBS) or 0) >= 2900
        assert lane.run_once(t0) == 10
        plan = reserve_plan(reserves)
        assert "Seq Scan on jobs_engine_job j" not in plan
        assert "Index Scan using jobs_long_pending_due" in plan
    assert not analyze_when_behind(5000)  # analysed a moment ago
    planner_clock.advance(ANALYZE_EVERY_S)
    assert not analyze_when_behind(2000)  # the planner knows of them
    assert analyze_when_behind(5000)


def analyse_empty_queue() -> None:
    """The statistics of a drained queue: empty, and known to be."""
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {store.JOBS}")


def reserve_plan(reserves: list[tuple[str, Any]]) -> str:
    """The plan the session keeps for the reserve, run with the last reserve's parameters."""
    text, params = reserves[-1]
    with connection.cursor() as cursor:
        # This text's (the session keeps the reserves of earlier tests' targets too), the
        # last prepared: the driver prepares a text again when an integer's type grows
        # (a cursor's id past a smallint), and the older one takes no larger value.
        cursor.execute("SELECT name FROM pg_prepared_statements WHERE statement = %s "
                       "ORDER BY prepare_time DESC LIMIT 1", [text])
        (name,) = cursor.fetchone()
        cursor.execute(f"EXPLAIN EXECUTE {name}({', '.join(['%s'] * len(params))})", params)
        return "\n".join(line for (line,) in cursor.fetchall())


@pytest.mark.django_db(transaction=True)  # autocommit, as in a worker
def test_the_writes_find_their_running_rows_by_id_and_the_rescue_by_lease(
        targets: Any, t0: datetime) -> None:
    """Few rows are RUNNING, so an index on the status looks selective for them; but under
    an old snapshot it holds an entry for every RUNNING version that snapshot still sees,
    and a write read through it visited each one (2-3 ms a long-lane write after a few
    thousand jobs). The write of successes, kept as a generic plan, and the heartbeat's
    renewal read the rows by their ids; the rescue of expired leases reads
    ``jobs_running_lease``."""
    renewals: list[int] = []
    targets("ll.by_id", handler=lambda job: renewals.append(lane.renew(t0)), lane="long",
            policy=JobPolicy(keep_completed=100))
    enqueue_many([{"target": "ll.by_id", "run_at": t0} for _ in range(3000)])
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {store.JOBS}")  # every row PENDING: RUNNING looks rare
    lane = long_worker("I", load_settings({"LONG_PREFETCH": 1}, environ={}))
    with statements("WITH r(id") as writes, statements("UPDATE") as renews:
        for _ in range(8):  # a generic plan from the sixth run of a prepared statement
            assert lane.run_once(t0) == 10
    assert renewals == [1] * 80  # each handler's claim renewed (one token a reserve)
    with statements("UPDATE") as rescues:
        assert store.jobs_long_rescue_expired(t0) == ([], 0)
    with statements("UPDATE") as marks:  # a paused target's probe
        assert store.jobs_long_mark_started([1, 2], "no-such-claim", t0) == {}
    if connection.vendor != "postgresql":  # no plans to read
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, generic_plans FROM pg_prepared_statements "
                       "WHERE statement LIKE 'WITH r(id%'")
        (name, generic_plans), = cursor.fetchall()
        assert generic_plans > 0
        params = writes[-1][1]
        cursor.execute(f"EXPLAIN EXECUTE {name}({', '.join(['%s'] * len(params))})", params)
        write = "\n".join(line for (line,) in cursor.fetchall())
        assert "Index Scan using jobs_engine_job_pkey on jobs_engine_job" in write
        for query, params in rescues:
            cursor.execute(f"EXPLAIN {query}", params)
            plan = "\n".join(line for (line,) in cursor.fetchall())
            assert "using jobs_running_lease" in plan, plan
        by_id = [next((q, p) for q, p in renews if "SET lease_until" in q), *marks]
        for query, params in by_id:
            cursor.execute(f"EXPLAIN {query}", params)
            plan = "\n".join(line for (line,) in cursor.fetchall())
            assert "Index Scan using jobs_engine_job_pkey" in plan, plan
    assert len(rescues) == 2


@pytest.mark.django_db(transaction=True)  # autocommit, as in a worker
def test_a_backlog_makes_the_plans_made_on_an_idle_queue_again(
        targets: Any, t0: datetime, planner_clock: FakeMonotonic) -> None:
    """When the worker finds a backlog (``Planner.queue_busy``), plans made while it had
    none are made again at the session's next statement, not ``REPLAN_S`` later: a burst is
    not read with the plan made for an empty queue. While the backlog lasts, they are
    kept."""
    planner = store.planner
    if connection.vendor == "postgresql":  # ids past a smallint, as late in a long suite
        with connection.cursor() as cursor:
            cursor.execute("SELECT setval(pg_get_serial_sequence('jobs_engine_job', 'id'), "
                           "70000)")
    targets("ll.busy", handler=lambda job: None, lane="long")
    lane = long_worker("B", load_settings({"LONG_PREFETCH": 1}, environ={}))
    analyse_empty_queue()
    with statements("WITH locked") as reserves:
        planner.queue_busy(False)
        assert lane.run_once(t0) == 0
        enqueue_many([{"target": "ll.busy", "run_at": t0} for _ in range(3000)])
        assert lane.run_once(t0) == 10
        if connection.vendor != "postgresql":  # no plans kept: nothing more to see
            planner.queue_busy(True)
            assert lane.run_once(t0) == 10
            return
        assert "Seq Scan on jobs_engine_job j" in reserve_plan(reserves)  # made for no rows
        planner.queue_busy(True)  # two polls in a row handed rows
        assert lane.run_once(t0) == 10
        plan = reserve_plan(reserves)
        assert "Seq Scan on jobs_engine_job j" not in plan
        assert "Index Scan using jobs_long_pending_due" in plan
        made = planner.plans_made_at(connection.connection)
        planner.queue_busy(True)
        assert lane.run_once(t0) == 10
        assert planner.plans_made_at(connection.connection) == made  # kept while busy


@pytest.mark.django_db(transaction=True)  # autocommit, as in a worker
def test_with_the_planner_policy_off_worker_sessions_keep_postgresqls_defaults(
        targets: Any, t0: datetime, planner_clock: FakeMonotonic) -> None:
    """``PLANNER_POLICY`` off: the worker hands the switch to the planner, and its sessions
    keep PostgreSQL's plan cache mode and JIT setting, and a burst the statistics do not
    know of is left to autovacuum's analyse. On, the same reserve sets the session up, and
    the same pass has the table analysed."""
    targets("ll.policy", handler=lambda job: None, lane="long")
    analyse_empty_queue()
    enqueue_many([{"target": "ll.policy", "run_at": t0} for _ in range(3000)])
    for on in (False, True):
        connection.close()  # a new session, with the server's defaults
        settings = load_settings({"PLANNER_POLICY": on, "LONG_PREFETCH": 1}, environ={})
        worker = WorkerProcess({"fast"}, settings)
        assert worker.planner is store.planner
        assert store.planner.enabled is on
        defaults = session_settings()
        with statements("ANALYZE") as analyses:
            assert long_worker("O", settings).run_once(t0) == 10  # a prepared reserve
            analysed = store.planner.analyze_when_behind(2990)
        if connection.vendor != "postgresql":  # no plans, no statistics
            assert not analysed and analyses == []
            continue
        if on:
            assert session_settings() == ("force_generic_plan", "off")
            assert analysed and len(analyses) == 1
            assert (store.table_row_estimate(store.JOBS) or 0) >= 2900
        else:
            assert defaults[0] == "auto"
            assert session_settings() == defaults
            assert not analysed and analyses == []
            assert store.table_row_estimate(store.JOBS) == 0


def session_settings() -> tuple[str, str] | None:
    """This session's plan cache mode and JIT setting (PostgreSQL)."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('plan_cache_mode'), current_setting('jit')")
        mode, jit = cursor.fetchone()
        return mode, jit


def test_renewed_row_is_never_reclaimed_during_a_7_minute_run(targets: Any,
                                                             t0: datetime) -> None:
    a, b = long_worker("A"), long_worker("B")
    calls: list[int | None] = []
    polled: list[int] = []
    leases: list[datetime | None] = []

    def handler(job: Job) -> None:
        calls.append(job.id)
        if len(calls) > 1:
            return  # a second run: the test fails on the calls assertion below
        for minute in range(1, 8):
            assert a.renew(t0 + minute * MINUTE) == 1
        leases.append(row(job.id).lease_until)  # type: ignore[arg-type]
        polled.append(b.run_once(t0 + 7 * MINUTE))

    targets("ll.slow", handler=handler, lane="long")
    job_id = put("ll.slow", t0)
    assert a.run_once(t0) == 1
    assert polled == [0]
    assert calls == [job_id]
    assert leases == [t0 + 12 * MINUTE]
    assert not JobModel.objects.filter(id=job_id).exists()


# -- reclaim after a worker died ---------------------------------------------------------------


def crash_first(calls: list[int | None]) -> Callable[[Job], None]:
    def handler(job: Job) -> None:
        calls.append(job.id)
        if len(calls) == 1:
            raise Crash

    return handler


def test_at_least_once_row_runs_again_after_its_worker_died(targets: Any,
                                                            t0: datetime) -> None:
    calls: list[int | None] = []
    targets("ll.alo", handler=crash_first(calls), lane="long",
            delivery_mode=DeliveryMode.AT_LEAST_ONCE)
    job_id = put("ll.alo", t0)
    with pytest.raises(Crash):
        long_worker("A").run_once(t0)
    assert row(job_id).status == JobStatus.RUNNING and row(job_id).started_at is not None
    b = long_worker("B")
    assert b.run_once(t0 + 299 * SECOND) == 0  # the lease is still live
    assert b.run_once(t0 + 301 * SECOND) == 1
    assert calls == [job_id, job_id]
    assert not JobModel.objects.filter(id=job_id).exists()


def test_at_most_once_row_that_started_goes_dead_instead_of_running_twice(
        targets: Any, t0: datetime, dead_signals: list[dict[str, Any]]) -> None:
    calls: list[int | None] = []
    targets("ll.amo", handler=crash_first(calls), lane="long")
    job_id = put("ll.amo", t0)
    with pytest.raises(Crash):
        long_worker("A").run_once(t0)
    later = t0 + 301 * SECOND
    assert long_worker("B").run_once(later) == 0
    dead = row(job_id)
    # The claim token stays: A, if alive after all, may still write what happened.
    assert (dead.status, dead.closed_at, dead.running_code) == (JobStatus.DEAD, later, None)
    assert dead.claim_token is not None and dead.lease_until is None
    assert "lease expired" in dead.last_error
    assert calls == [job_id]
    assert [s["job_id"] for s in dead_signals] == [job_id]


def test_reserved_but_not_started_row_goes_back_to_pending(targets: Any, t0: datetime) -> None:
    """Not started means not sent: even an at-most-once row runs on the next worker."""
    target = targets("ll.unstarted", lane="long")
    job_id = put("ll.unstarted", t0)
    assert [r.job.id for r in store.jobs_long_reserve("A", "tok", t0, 300, 10,
                                                           targets=["ll.unstarted"])] == [job_id]
    b = long_worker("B")
    assert b.run_once(t0 + 299 * SECOND) == 0
    assert row(job_id).status == JobStatus.RUNNING
    assert b.run_once(t0 + 301 * SECOND) == 1
    assert [job.id for job in target.extra["calls"]] == [job_id]
    assert not JobModel.objects.filter(id=job_id).exists()


def test_worker_whose_claim_was_taken_over_cannot_finish(
        targets: Any, t0: datetime, caplog: pytest.LogCaptureFixture) -> None:
    """A stalls past its lease; B reclaims and runs the row (which fails and is retried);
    A's late success matches nothing and is logged result=lost."""
    caplog.set_level(logging.INFO, logger="jobs_engine")
    b = long_worker("B")
    calls: list[int | None] = []

    def handler(job: Job) -> None:
        calls.append(job.id)
        if len(calls) == 1:  # A's run: stalls past its lease while B takes over
            assert b.run_once(t0 + 301 * SECOND) == 1
            return
        raise ValueError("B's run fails")

    targets("ll.stalled", handler=handler, lane="long", delivery_mode=DeliveryMode.AT_LEAST_ONCE)
    job_id = put("ll.stalled", t0)
    a = long_worker("A")
    assert a.run_once(t0) == 1
    assert calls == [job_id, job_id]
    kept = row(job_id)
    # Two tries made: A's (counted by the rescue: its handler had started) and B's.
    assert (kept.status, kept.attempts, kept.claim_token) == (JobStatus.PENDING, 2, None)
    results = [r.getMessage().rsplit("result=", 1)[1] for r in caplog.records
               if r.getMessage().startswith("job run ")]
    assert results == ["retried", "lost"]
    assert a.in_hand() == 0


@pytest.mark.django_db(transaction=True)
def test_concurrent_reservations_reserve_every_row_once(targets: Any, now: datetime) -> None:
    targets("ll.many", lane="long")
    ids = {put("ll.many", now) for _ in range(30)}

    def drain(owner: str) -> Callable[[], list[int]]:
        def run() -> list[int]:
            got: list[int] = []
            while rows := store.jobs_long_reserve(owner, uuid.uuid4().hex, now, 300, 4,
                                                 targets=["ll.many"]):
                got += [r.job.id for r in rows]
            return got

        return run

    first, second = race(drain("A"), drain("B"))
    assert not set(first) & set(second)
    assert len(first) + len(second) == 30
    assert set(first) | set(second) == ids
    assert JobModel.objects.filter(status=JobStatus.RUNNING, claim_token__isnull=False,
                                   id__in=ids).count() == 30


# -- exclusive targets --------------------------------------------------------------------------


def test_exclusive_code_runs_once_at_a_time_and_other_codes_keep_running(
        targets: Any, t0: datetime) -> None:
    one = load_settings({"LONG_BATCH": 1}, environ={})
    a, b = long_worker("A", one), long_worker("B")
    order: list[str] = []
    during: list[tuple[int, list[str]]] = []

    def exclusive(job: Job) -> None:
        order.append(f"x{job.id}")
        if len(order) == 1:  # the first slot runs long; B polls meanwhile
            handed = b.run_once(t0 + MINUTE)
            during.append((handed, list(JobModel.objects.filter(
                target="ll.excl").order_by("id").values_list("status", flat=True))))

    targets("ll.excl", handler=exclusive, lane="long", exclusive=True)
    targets("ll.other", handler=lambda job: order.append("other"), lane="long")
    first = put("ll.excl", t0, code="report")
    second = put("ll.excl", t0, code="report")
    put("ll.other", t0)
    assert a.run_once(t0) == 1
    assert during == [(1, [JobStatus.RUNNING, JobStatus.PENDING])]
    assert order == [f"x{first}", "other"]
    assert row(second).status == JobStatus.PENDING
    assert b.run_once(t0 + MINUTE) == 1
    assert order == [f"x{first}", "other", f"x{second}"]


@pytest.mark.django_db(transaction=True)
def test_racing_workers_never_run_one_exclusive_code_twice(targets: Any, now: datetime) -> None:
    """Each worker reserves one row; both see a free code, the unique index refuses one."""
    targets("ll.race", lane="long", exclusive=True)
    for _ in range(4):
        put("ll.race", now, code="nightly")
    for _ in range(3):
        got = race(*[lambda owner=owner: store.jobs_long_reserve(
            owner, uuid.uuid4().hex, now, 300, 1, exclusive_targets=["ll.race"],
            targets=["ll.race"])
            for owner in ("A", "B")])
        reserved = [r.job.id for rows in got for r in rows]
        running = list(JobModel.objects.filter(status=JobStatus.RUNNING).values_list(
            "id", "running_code"))
        assert len(reserved) == 1
        assert running == [(reserved[0], "nightly")]
        JobModel.objects.filter(id=reserved[0]).delete()  # that run finished


@pytest.mark.django_db(transaction=True)  # autocommit, as in a worker
def test_one_reserve_starts_plain_rows_and_the_first_row_of_each_exclusive_code(
        targets: Any, now: datetime) -> None:
    """With exclusive targets registered, PostgreSQL still reserves and starts the rows in
    one statement (SQLite: one transaction); a second due row of a code stays PENDING."""
    targets("ll.mixed.excl", lane="long", exclusive=True)
    targets("ll.mixed.plain", lane="long")
    nightly = [put("ll.mixed.excl", now, code="nightly") for _ in range(2)]
    hourly = put("ll.mixed.excl", now, code="hourly")
    plain = [put("ll.mixed.plain", now) for _ in range(2)]
    statements: list[str] = []

    def count(execute: Any, sql: str, *args: Any) -> Any:
        statements.append(sql)
        return execute(sql, *args)

    with connection.execute_wrapper(count):
        got = store.jobs_long_reserve("A", "tok", now, 300, 10, targets=[
            "ll.mixed.excl", "ll.mixed.plain"], exclusive_targets=["ll.mixed.excl"],
            start=True)
    assert sorted(r.job.id for r in got) == sorted([nightly[0], hourly, *plain])
    assert all(r.earlier_tries == [] for r in got)
    if connection.vendor == "postgresql":
        assert len(statements) == 1
    assert row(nightly[1]).status == JobStatus.PENDING
    assert {(r.id, r.running_code) for r in JobModel.objects.filter(
        status=JobStatus.RUNNING, started_at=now)} == {
        (nightly[0], "nightly"), (hourly, "hourly"), (plain[0], None), (plain[1], None)}


@pytest.mark.django_db(transaction=True)
def test_a_code_claimed_by_another_worker_meanwhile_is_skipped_not_fatal(
        targets: Any, now: datetime) -> None:
    """Another worker's transaction makes a row of the code RUNNING after this reserve
    read its candidates: the unique index refuses the one-statement reserve, which then
    reserves one code at a time and leaves the taken code alone."""
    targets("ll.meanwhile", lane="long", exclusive=True)
    targets("ll.meanwhile.plain", lane="long")
    taken = put("ll.meanwhile", now, code="nightly")
    waiting = put("ll.meanwhile", now, code="nightly")
    plain = put("ll.meanwhile.plain", now)
    other_started = threading.Event()
    release = threading.Event()

    def other_worker() -> None:  # claims ``taken`` and commits while our reserve waits
        with transaction.atomic():
            JobModel.objects.filter(id=taken).update(status=JobStatus.RUNNING,
                                                     running_code="nightly")
            other_started.set()
            # SQLite runs the steps in turn (one writer): nothing to wait for there.
            release.wait(timeout=10 if connection.vendor == "postgresql" else 0)

    def ours() -> list[store.Reserved]:
        assert other_started.wait(timeout=10)
        threading.Timer(0.3, release.set).start()  # commits while our UPDATE waits on it
        return store.jobs_long_reserve("A", "tok", now, 300, 10,
                                       targets=["ll.meanwhile", "ll.meanwhile.plain"],
                                       exclusive_targets=["ll.meanwhile"], start=True)

    _, got = race(other_worker, ours)
    assert [r.job.id for r in got] == [plain]
    assert row(waiting).status == JobStatus.PENDING
    assert row(taken).status == JobStatus.RUNNING


def test_a_paused_targets_rows_are_not_reserved_and_an_expired_ones_are_not_started(
        targets: Any, now: datetime) -> None:
    """The pause read is part of the reserve: a paused target's rows stay PENDING; rows of
    a target whose pause ran out come back reserved but unstarted (a probe candidate)."""
    targets("ll.paused", lane="long")
    targets("ll.expired", lane="long")
    paused, expired = put("ll.paused", now), put("ll.expired", now)
    store.pause_set("ll.paused", now, 60, "down")
    store.pause_set("ll.expired", now - MINUTE, 30, "was down")
    got = store.jobs_long_reserve("A", "tok", now, 300, 10,
                                  targets=["ll.expired", "ll.paused"], start=True)
    assert [(r.job.id, r.earlier_tries) for r in got] == [(expired, None)]
    assert row(paused).status == JobStatus.PENDING
    assert (row(expired).status, row(expired).started_at) == (JobStatus.RUNNING, None)


# -- outcomes on the long lane ------------------------------------------------------------------


def test_backoff_then_dead_at_the_policys_last_attempt(targets: Any, t0: datetime,
                                                       dead_signals: list[dict[str, Any]]
                                                       ) -> None:
    def fail(job: Job) -> None:
        raise ValueError("report failed")

    targets("ll.retry", handler=fail, lane="long", policy=JobPolicy(attempts=3, backoff_s=60))
    job_id = put("ll.retry", t0)
    lane = long_worker("A")
    at = t0
    for attempt, delay in ((1, 60), (2, 120)):
        assert lane.run_once(at) == 1
        failed = row(job_id)
        assert (failed.status, failed.attempts, failed.next_run_at) == (
            JobStatus.PENDING, attempt, at + timedelta(seconds=delay))
        assert (failed.claim_token, failed.lease_until, failed.started_at) == (None, None, None)
        assert lane.run_once(at + timedelta(seconds=delay) - SECOND) == 0
        at += timedelta(seconds=delay)
    assert lane.run_once(at) == 1
    dead = row(job_id)
    assert (dead.status, dead.attempts, dead.closed_at) == (JobStatus.DEAD, 3, at)
    assert [s["job_id"] for s in dead_signals] == [job_id]


def test_unreachable_releases_the_claim_keeps_attempts_and_pauses(targets: Any,
                                                                  t0: datetime) -> None:
    calls: list[int | None] = []

    def down(job: Job) -> None:
        calls.append(job.id)
        raise TargetUnreachable("service down")

    targets("ll.down", handler=down, lane="long")
    job_id = put("ll.down", t0)
    lane = long_worker("A")
    assert lane.run_once(t0) == 1
    released = row(job_id)
    assert (released.status, released.attempts) == (JobStatus.PENDING, 0)
    assert (released.claim_token, released.claimed_by, released.lease_until,
            released.running_code) == (None, None, None, None)
    assert TargetPause.objects.get(target="ll.down").paused_until == t0 + 30 * SECOND
    assert lane.run_once(t0 + 10 * SECOND) == 0
    assert row(job_id).status == JobStatus.PENDING
    assert lane.run_once(t0 + 31 * SECOND) == 1  # one probe after PROBE_S
    assert calls == [job_id, job_id]


# -- group commit --------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)  # the pool threads write on connections of their own
def test_outcomes_that_finish_while_one_is_written_are_written_together(
        targets: Any, t0: datetime, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer writes one outcome; the four handlers that return meanwhile free their
    slots at once, stay in hand (their leases renewed) and go in its next write, together."""
    from jobs_engine.lanes import long as long_lane

    go = threading.Semaphore(0)
    targets("ll.group", handler=lambda job: None if go.acquire(timeout=10) else "timeout",
            lane="long")
    ids = [put("ll.group", t0) for _ in range(5)]
    worker_id = f"G-{uuid.uuid4().hex[:6]}"
    settings = load_settings({"LONG_BATCH": 5, "LONG_PREFETCH": 1}, environ={})
    lane = LongLane(worker_id, settings, PauseGate(worker_id, settings))
    writes: list[list[int]] = []
    seen_while_writing: list[tuple[int, int]] = []
    real_record = long_lane.record

    def counted(guard: Any, results: Any, now: datetime, settings: Any) -> Any:
        writes.append(sorted(r.job.id for r in results))
        if len(writes) == 1:  # hold the first write until the other four are waiting
            go.release(4)
            deadline = time.monotonic() + 10
            while lane._outcomes.qsize() < 4 and time.monotonic() < deadline:
                time.sleep(0.01)
            seen_while_writing.append((lane.free_slots().rows, lane.in_hand()))
        return real_record(guard, results, now, settings)

    monkeypatch.setattr(long_lane, "record", counted)
    try:
        assert lane.run_once(t0) == 5
        go.release(1)
        deadline = time.monotonic() + 10
        while lane.in_hand() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        go.release(5)
        lane.shutdown(wait=True)
    assert [len(w) for w in writes] == [1, 4] and sorted(writes[0] + writes[1]) == sorted(ids)
    assert seen_while_writing == [(5, 5)]  # every slot free, no row out of hand yet
    assert not JobModel.objects.filter(id__in=ids).exists()


def test_expired_leases_are_looked_for_at_most_once_a_second(targets: Any, t0: datetime
                                                             ) -> None:
    targets("ll.rescue", handler=lambda job: None, lane="long")
    job_id = put("ll.rescue", t0)
    JobModel.objects.filter(id=job_id).update(status=JobStatus.RUNNING, claim_token="gone",
                                              lease_until=t0 - SECOND)
    lane = long_worker("R")
    assert lane.run_once(t0 - MINUTE) == 0  # its lease had not run out then
    assert row(job_id).status == JobStatus.RUNNING
    assert lane.run_once(t0 - MINUTE + SECOND / 2) == 0  # not looked for again so soon
    assert lane.run_once(t0) == 1  # a second later: released and run
    assert not JobModel.objects.filter(id=job_id).exists()


def test_a_rescue_reads_the_leases_expired_since_the_last_and_all_once_a_minute(
        targets: Any, t0: datetime) -> None:
    """Each rescue reads the leases that expired since the one before, less a lag band;
    every lease from the first expired one once a minute. A row whose lease expired before
    the band is not seen by a rescue from it (there is none such outside a test: a lease
    expires a lease after its reserve), and the whole read rescues it."""
    from jobs_engine.lanes.long import RESCUE_LAG, RESCUE_WHOLE_EVERY

    targets("ll.since", handler=lambda job: None, lane="long")
    lane = long_worker("S")
    with statements("UPDATE") as rescues:
        assert lane.run_once(t0) == 0  # the first: from the first expired lease
        early = put("ll.since", t0)
        JobModel.objects.filter(id=early).update(status=JobStatus.RUNNING, claim_token="gone",
                                                 lease_until=t0 - RESCUE_LAG - SECOND)
        late = put("ll.since", t0)
        JobModel.objects.filter(id=late).update(status=JobStatus.RUNNING, claim_token="gone",
                                                lease_until=t0 - RESCUE_LAG + SECOND)
        assert lane.run_once(t0 + 2 * SECOND) == 1  # since the last: the late one
        assert row(early).status == JobStatus.RUNNING
        assert not JobModel.objects.filter(id=late).exists()
        assert lane.run_once(t0 + RESCUE_WHOLE_EVERY) == 1  # the whole range
        assert not JobModel.objects.filter(id=early).exists()
    bounded = ["lease_until > " in query for query, _ in rescues
               if "lease_until <= " in query]
    assert bounded == [False, False, True, True, False, False]  # two statements a rescue


@pytest.mark.django_db(transaction=True)  # a second session holds its snapshot
def test_under_an_old_snapshot_a_rescue_since_the_last_visits_no_finished_row(
        targets: Any, t0: datetime) -> None:
    """An old snapshot keeps every RUNNING version of the rows reserved since it was
    taken; once their leases have passed, a read of ``jobs_running_lease`` from the
    first expired lease visits each (every second, on every worker). A rescue since the
    last one reads past them."""
    if connection.vendor != "postgresql":  # the snapshot and the buffers are PostgreSQL's
        return
    from tests.db.test_enqueue import pg_connect

    targets("ll.kept", handler=lambda job: None, lane="long")
    with pg_connect() as holder:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute(f"SELECT count(*) FROM {store.JOBS}").fetchone()
        # A few rows a page: the buffers read count the pages of the versions visited.
        enqueue_many([{"target": "ll.kept", "run_at": t0, "payload": uuid.uuid4().hex * 47}
                      for _ in range(300)])
        lane = long_worker("K")
        while lane.run_once(t0):  # reserved with leases to t0 + LONG_LEASE_S, then done
            pass
        later = t0 + timedelta(seconds=SETTINGS.LONG_LEASE_S) + MINUTE

        def buffers(after: datetime | None) -> int:
            with statements("UPDATE") as rescue:
                assert store.jobs_long_rescue_expired(later, after=after) == ([], 0)
            query, params = rescue[-1]
            with connection.cursor() as cursor:
                cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {query}", params)
                (plan,), = cursor.fetchall()
            return int(plan[0]["Plan"]["Shared Hit Blocks"]
                       + plan[0]["Plan"]["Shared Read Blocks"])

        assert buffers(None) >= 50  # the pages of the finished rows' RUNNING versions
        assert buffers(later - SECOND) < 10


def test_a_poll_answering_a_wake_up_leaves_the_rescue_to_the_next(targets: Any, t0: datetime
                                                                  ) -> None:
    """The rescue of expired leases is a statement of its own: a poll woken by a NOTIFY
    starts the woken row without it, and the poll after it rescues."""
    ran: list[int | None] = []
    targets("ll.woken", handler=lambda job: ran.append(job.id), lane="long")
    stuck = put("ll.woken", t0 - MINUTE)
    JobModel.objects.filter(id=stuck).update(status=JobStatus.RUNNING, claim_token="gone",
                                             lease_until=t0 - SECOND)
    woke = put("ll.woken", t0)
    lane = long_worker("W")
    assert lane.run_once(t0, woken=True) == 1
    assert ran == [woke]
    assert row(stuck).status == JobStatus.RUNNING
    assert lane.run_once(t0) == 1  # released and run
    assert ran == [woke, stuck]


# -- where a reserve starts -----------------------------------------------------------------


def put_at(target: str, at: datetime, priority: int = 0) -> int:
    result = enqueue(target, None, run_at=at, priority=priority)
    assert result.job_id is not None
    return result.job_id


def test_a_full_reserve_leaves_a_cursor_the_next_one_starts_from(
        targets: Any, t0: datetime) -> None:
    """After a reserve that took as many rows as it could and every row it locked, the next
    reserve reads the rows of that priority from after its last one (and the lag band
    before it): while another session holds an old snapshot, the dead index entries of
    the rows taken before cost every reserve that walked them again. Higher priorities are
    read from their first row, lower ones after; a row behind the cursor by more than the
    lag waits for a reserve from the first row. SQLite reads from the first row always."""
    targets("ll.cursor", lane="long")
    first = [put_at("ll.cursor", t0 + i * MILLISECOND) for i in range(25)]
    at = t0 + MINUTE

    def reserve(after: store.LongCursor | None) -> store.ReservedRows:
        return store.jobs_long_reserve("A", uuid.uuid4().hex, at, 300, 10,
                                       targets=["ll.cursor"], after=after)

    got = reserve(None)
    assert [r.job.id for r in got] == first[:10]
    postgres = connection.vendor == "postgresql"
    assert got.cursor == (store.LongCursor(0, t0 + 9 * MILLISECOND - store.CURSOR_LAG,
                                           t0 + 9 * MILLISECOND, first[9]) if postgres else None)
    behind = put_at("ll.cursor", t0 - SECOND)  # its transaction began long before
    in_band = put_at("ll.cursor", t0 + 9 * MILLISECOND - store.CURSOR_LAG / 2)
    above = put_at("ll.cursor", t0 + HOUR, priority=5)  # due later, but first in order
    below = put_at("ll.cursor", t0, priority=-5)
    JobModel.objects.filter(id=above).update(next_run_at=t0)
    cursor = got.cursor
    got = reserve(cursor)
    if not postgres:  # from the first row, in order
        assert [r.job.id for r in got] == [above, behind, in_band, *first[10:17]]
        assert {r.job.id for r in reserve(None)} == {*first[17:], below}
        return
    assert [r.job.id for r in got] == [above, in_band, *first[10:18]]
    rest = reserve(got.cursor)
    assert rest.cursor is None  # not full: the cursor before it stands
    assert {r.job.id for r in rest} == {*first[18:], below}
    assert [r.job.id for r in reserve(None)] == [behind]


@pytest.mark.django_db(transaction=True)  # handler threads of their own
def test_a_worker_that_finished_an_exclusive_code_reserves_from_the_first_row(
        targets: Any, t0: datetime) -> None:
    """A row of an exclusive code that ran when a reserve passed it lies behind the cursor:
    the worker that ran the code reads from the first row once it finished, so the row is
    taken at once, not at the next read from the first row a POLL_S later."""
    ran: list[int | None] = []
    release = threading.Event()

    def exclusive(job: Job) -> None:
        if not ran:
            assert release.wait(10)
        ran.append(job.id)

    targets("ll.plain", handler=lambda job: ran.append(job.id), lane="long")
    targets("ll.only", handler=exclusive, lane="long", exclusive=True)
    settings = load_settings({"LONG_PREFETCH": 1, "LONG_BATCH": 2}, environ={})
    worker_id = f"E-{uuid.uuid4().hex[:6]}"
    lane = LongLane(worker_id, settings, PauseGate(worker_id, settings),
                    monotonic=FakeMonotonic())  # no POLL_S passes: no read from the first row
    only = [put("ll.only", t0 - 2 * SECOND, code="one"), put("ll.only", t0 - SECOND, code="one")]
    plain = [put_at("ll.plain", t0 + i * MILLISECOND) for i in range(6)]
    at = t0 + MINUTE

    def run_until(done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 10
        while not done() and time.monotonic() < deadline:
            try:
                lane.run_once(at)
            except Exception as exc:
                # As the worker does (``WorkerProcess._survive``): SQLite's shared in-memory
                # test database refuses a reserve while the outcome writer's thread writes.
                if not is_database_fault(exc):
                    raise
            time.sleep(0.02)
        assert done(), ran

    try:
        run_until(lambda: set(plain) <= set(ran))  # the first row of "one" runs meanwhile
        assert only[1] not in ran
        assert (lane._cursor is not None) is (connection.vendor == "postgresql")  # SQLite: none
        release.set()
        run_until(lambda: only[1] in ran)
    finally:
        release.set()
        lane.shutdown(wait=True)
    assert ran[-2:] == only


def test_a_worker_reserves_from_the_first_row_once_a_poll_s(targets: Any, t0: datetime
                                                            ) -> None:
    """Its reserves start at its cursor, and once a ``POLL_S`` at the first due row: a row
    behind the cursor (a rescue put it back, its transaction began long before) waits no
    longer than that."""
    ran: list[int | None] = []
    targets("ll.deep", handler=lambda job: ran.append(job.id), lane="long")
    clock = FakeMonotonic()
    lane = long_worker("D", load_settings({"LONG_PREFETCH": 1}, environ={}), clock)
    rows = [put_at("ll.deep", t0 + i * MILLISECOND) for i in range(25)]
    at = t0 + MINUTE
    assert [lane.run_once(at) for _ in range(3)] == [10, 10, 5]
    behind = put_at("ll.deep", t0 - SECOND)
    if connection.vendor == "postgresql":
        assert lane.run_once(at) == 0  # after the cursor
        clock.advance(SETTINGS.POLL_S)
    assert lane.run_once(at) == 1
    assert ran == [*rows, behind]


def test_targets_named_with_quotes_and_placeholders_are_reserved(targets: Any,
                                                                 t0: datetime) -> None:
    """The long lane's targets are constants of the reserve's text on PostgreSQL: any
    name a target may have is reserved, exclusive ones too, and its later rows found."""
    odd = "ll.it's 100%s {a,b}"
    targets(odd, lane="long")
    targets('ll.quote"back\\slash', lane="long", exclusive=True)
    plain = put(odd, t0)
    coded = put('ll.quote"back\\slash', t0, code="c1")
    lane = long_worker("A")
    assert lane.run_once(t0) == 2
    assert not JobModel.objects.filter(id__in=[plain, coded]).exists()
    put(odd, t0 + timedelta(hours=1))
    assert lane.run_once(t0) == 0
    assert store.jobs_long_next_due([odd], t0) == t0 + timedelta(hours=1)


def test_a_target_reserved_lately_is_tested_first_and_dropped_with_the_registry(
        targets: Any, t0: datetime) -> None:
    """The reserve tests the targets the worker reserved rows of lately before the whole
    list (``likely``): rows of other targets are still reserved, and a target dropped from
    the registry since is not reserved, though it was likely."""
    targets("ll.likely", lane="long")
    targets("ll.other", lane="long")
    lane = long_worker("L")
    put("ll.likely", t0)
    assert lane.run_once(t0) == 1
    assert lane._likely() == ["ll.likely"]
    other = put("ll.other", t0)
    assert lane.run_once(t0) == 1 and not JobModel.objects.filter(id=other).exists()
    dropped = put("ll.likely", t0)
    registry.unregister_target("ll.likely")
    assert lane.run_once(t0) == 0
    assert row(dropped).status == JobStatus.PENDING
