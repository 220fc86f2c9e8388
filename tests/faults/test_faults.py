"""The engine's promises under ordinary database and broker faults, with real processes.

Each scenario drains a workload with three ``manage.py run_workers`` processes (both lanes
and the schedule tick) on a database of the suite's dedicated PostgreSQL cluster, does its
faults in the middle of the drain (triggered by the deliveries logged so far), waits until
no row of the workload is PENDING or RUNNING (or every worker is gone, or a deadline),
stops the workers with SIGTERM and hands everything to ``checker.check``. It passes when
the checker's must-be-zero counts are 0, no worker died on its own and every fault found
work still open (a fault after the drain would prove nothing). The third worker
polls without LISTEN/NOTIFY (``JOBS_NOTIFY=off``), so both a fault in the LISTEN wait and a
fault in a poll's own statements are exercised.

- (a) PostgreSQL restarted twice (``pg_ctl restart -m fast``);
- (b) the same, with one worker SIGKILLed and another SIGSTOPped past its lease (the second
  restart while it is stopped, so it wakes up to dead connections);
- (c) a Kafka broker stopped for 10 s while ``kafka:<topic>`` jobs are enqueued and sent;
- (d) PostgreSQL stopped for twice the partition lease, then started again;
- (e) PostgreSQL crashed twice (``pg_ctl stop -m immediate``, then crash recovery): what
  was committed without waiting for its WAL flush (``LAZY_FLUSH_AT_LEAST_ONCE``: the marks,
  reserves and successes of at-least-once rows) may be undone, and those jobs must run
  again, in key order.

Sizes: a short form by default (this module in about 3 minutes on 2 cores; the limits
scenario, ``test_limits_faults.py``, adds 3 more);
``JOBS_FAULTS_FULL=1`` runs the full ones (10,000 fast-lane jobs over 200 keys plus 200
long-lane jobs per scenario). Every run prints its timeline, the workers' exits, the
checker's table and, on failure, the workers' stderr tails; all its files stay in the
test's tmp directory.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from tests.faults.checker import Delivery, Report
from tests.faults.harness import FaultRun, environ_flag
from tests.faults.targets import (
    FAST_AT_LEAST_ONCE,
    FAST_AT_MOST_ONCE,
    LONG_AT_LEAST_ONCE,
    LONG_AT_MOST_ONCE,
    NAMES,
)
from tests.faults.workload import Workload
from tests.process.harness import HEARTBEAT_S, LEASE_S, WorkerProc

pytestmark = [pytest.mark.process, pytest.mark.faults]

FULL = environ_flag("JOBS_FAULTS_FULL")


@dataclass(frozen=True)
class Size:
    """A scenario's workload and how long its drain may take (seconds)."""

    keys: int
    versions: int
    long_jobs: int
    drain_s: float


SIZE = Size(200, 50, 200, 300) if FULL else Size(200, 20, 60, 120)
# Kafka: one version of every key per round, a round every ``interval`` seconds.
KAFKA_KEYS, KAFKA_ROUNDS, KAFKA_INTERVAL_S = (200, 50, 0.4) if FULL else (200, 20, 0.5)
KAFKA_STOP_AT_ROUND = KAFKA_ROUNDS // 4
BROKER_DOWN_S = 10.0
KAFKA_PARTITIONS = 4
OUTCOME_UNKNOWN = "TargetOutcomeUnknown"  # at-most-once DEAD for a send cut by the outage


def workload() -> Workload:
    return Workload((FAST_AT_MOST_ONCE, FAST_AT_LEAST_ONCE), SIZE.keys, SIZE.versions,
                    (LONG_AT_MOST_ONCE, LONG_AT_LEAST_ONCE), SIZE.long_jobs)


def start_workers(run: FaultRun) -> list[WorkerProc]:
    """Three ``run_workers``; the third polls without LISTEN/NOTIFY."""
    return run.start_workers(["run_workers", "run_workers"]) + run.start_workers(
        ["run_workers"], JOBS_NOTIFY="off")


def at(run: FaultRun, work: Workload, fraction: float) -> None:
    """Wait until ``fraction`` of the workload's deliveries are logged (the next fault
    then lands mid-drain); goes on regardless after a while or once every worker is gone."""
    run.wait_delivered(int(work.total * fraction), timeout=SIZE.drain_s / 2)


def drain_and_stop(run: FaultRun, targets: list[str]) -> None:
    """Wait for the drain (and the enqueuer's end), then stop the workers with SIGTERM."""
    enqueuer = run.enqueuer
    run.wait_drained(targets, SIZE.drain_s,
                     also=lambda: enqueuer is None or enqueuer.poll() is not None)
    time.sleep(HEARTBEAT_S + 0.5)  # room for a late, wrong send to show up
    run.stop_workers()


def judge(run: FaultRun, title: str, deliveries: list[Delivery] | None = None,
          reasons: tuple[str, ...] = ()) -> tuple[Report, str]:
    """The checker's report and the run's summary (printed)."""
    report = run.check(reasons, deliveries)
    summary = run.summary(report, title)
    print("\n" + summary, flush=True)
    return report, summary


def finish(run: FaultRun, title: str) -> tuple[Report, str]:
    """Drain, stop and judge a run of the fault-suite targets."""
    drain_and_stop(run, list(NAMES))
    return judge(run, title)


def assert_promises_kept(run: FaultRun, report: Report, summary: str) -> None:
    died = run.died_on_their_own()
    problems = [f"checker: {name}={count}" for name, count in report.failures.items()]
    problems += [f"worker {name}: {how}" for name, how in died.items()]
    problems += [f"scenario: {what} found no work left (not mid-drain)"
                 for what in run.late_faults()]
    if problems:
        pytest.fail("promises broken:\n  " + "\n  ".join(problems) + "\n" + summary,
                    pytrace=False)


# -- (a) ---------------------------------------------------------------------------------------


def database_fault_twice(run: FaultRun, fault: Callable[[], None], title: str) -> None:
    """Scenarios (a) and (e): the database faulted at 30% and at 60% of the deliveries."""
    work = workload()
    start_workers(run)
    run.enqueue(work)
    at(run, work, 0.3)
    fault()
    at(run, work, 0.6)
    fault()
    report, summary = finish(run, title)
    assert_promises_kept(run, report, summary)


def test_a_postgres_restarted_twice_during_a_drain(fault_run: FaultRun) -> None:
    database_fault_twice(fault_run, fault_run.restart_db, "(a) PostgreSQL restarted twice")


# -- (b) ---------------------------------------------------------------------------------------


def test_b_restarts_with_a_worker_killed_and_one_stalled_past_its_lease(
        fault_run: FaultRun) -> None:
    run, work = fault_run, workload()
    procs = start_workers(run)
    run.enqueue(work)
    at(run, work, 0.15)
    run.kill(procs[0])
    at(run, work, 0.3)
    run.restart_db()
    at(run, work, 0.45)
    # The polling worker, past its lease, and the database restarts under it: it wakes up
    # to dead connections and partitions taken over.
    stall_s = LEASE_S + 2
    stalled = time.monotonic()
    run.pause(procs[2], stall_s)
    time.sleep(1.0)
    run.restart_db()
    time.sleep(max(0.0, stalled + stall_s - time.monotonic()))
    run.resume(procs[2])
    report, summary = finish(run, "(b) SIGKILL, SIGSTOP past the lease, two restarts")
    assert_promises_kept(run, report, summary)


# -- (c) ---------------------------------------------------------------------------------------


@dataclass
class OutageWatch:
    """What the rows and pauses looked like while the broker was down."""

    samples: int = 0
    max_attempts: int = 0
    paused: set[str] | None = None

    def sample(self, db_url: str, targets: list[str]) -> None:
        with psycopg.connect(db_url, connect_timeout=3) as conn:
            row = conn.execute("SELECT coalesce(max(attempts), 0) FROM jobs_engine_job "
                               "WHERE target = ANY(%s)", [targets]).fetchone()
            paused = conn.execute("SELECT target FROM jobs_engine_targetpause "
                                  "WHERE target = ANY(%s)", [targets]).fetchall()
        self.samples += 1
        self.max_attempts = max(self.max_attempts, int(row[0]) if row else 0)
        self.paused = (self.paused or set()) | {name for (name,) in paused}


def read_topics(bootstrap: str, topics: dict[str, str]) -> list[Delivery]:
    """Every record of the run's topics, from offset 0, as deliveries (offset order)."""
    from tests.kafka.conftest import TopicReader

    found = []
    for target, topic in topics.items():
        reader = TopicReader(bootstrap, topic)
        try:
            reader.start = dict.fromkeys(reader.partitions, 0)
            records = reader.read(timeout=60)
        finally:
            reader.close()
        for record in records:
            key = record.key.decode() if record.key is not None else None
            found.append(Delivery(int(record.headers["event_id"] or b"0"), target, key,
                                  int(record.payload["version"]), 0,
                                  float(record.partition * 10**9 + record.offset)))
    return found


def key_partitions(deliveries: list[Delivery]) -> dict[str, set[int]]:
    partitions: dict[str, set[int]] = defaultdict(set)
    for delivery in deliveries:
        partitions[f"{delivery.target} {delivery.key}"].add(int(delivery.seq // 10**9))
    return partitions


def test_c_kafka_broker_stopped_for_10s_mid_drain(fault_run: FaultRun, fault_kafka: Any) -> None:
    run, broker = fault_run, fault_kafka
    suffix = uuid.uuid4().hex[:6]
    topics = {f"kafka:faults.am-{suffix}": f"faults.am-{suffix}",
              f"kafka:faults.al-{suffix}": f"faults.al-{suffix}"}
    am_target, al_target = list(topics)
    broker.create_topics({topic: (KAFKA_PARTITIONS, {}) for topic in topics.values()})
    run.jobs_env.update({"JOBS_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
                         "JOBS_KAFKA_EXTRA_TOPICS": ",".join(
                             [topics[am_target], f"{topics[al_target]}:at_least_once"])})
    work = Workload((am_target, al_target), KAFKA_KEYS, KAFKA_ROUNDS,
                    transactions=KAFKA_ROUNDS, interval_s=KAFKA_INTERVAL_S)
    targets = list(topics)
    start_workers(run)
    run.start_enqueue(work)

    def sent_before_stop() -> bool:
        left = run.open_rows(targets)
        committed = run.enqueued_count()
        return committed >= KAFKA_STOP_AT_ROUND * KAFKA_KEYS and left is not None \
            and left < committed

    deadline = time.monotonic() + 60
    while not sent_before_stop():
        assert time.monotonic() < deadline, "no delivery before the broker stop\n" + \
            run.enqueuer_output()
        time.sleep(0.05)
    run.log(f"Kafka broker stop for {BROKER_DOWN_S:.0f}s; {run.enqueued_count()} committed, "
            f"{run.open_rows(targets)} left")
    broker.stop()
    watch = OutageWatch()
    down_until = time.monotonic() + BROKER_DOWN_S
    while time.monotonic() < down_until:
        watch.sample(run.db_url, targets)
        time.sleep(0.5)
    left_at_restart = run.open_rows(targets) or 0
    run.log(f"Kafka broker start; {left_at_restart} rows waiting; paused during the outage: "
            f"{sorted(watch.paused or [])}; max attempts seen {watch.max_attempts}")
    broker.start()
    run.log("Kafka broker answering again")

    drain_and_stop(run, targets)
    deliveries = read_topics(broker.bootstrap, topics)
    report, summary = judge(run, "(c) Kafka broker stopped for 10 s", deliveries,
                            (OUTCOME_UNKNOWN,))
    with psycopg.connect(run.db_url) as conn:
        spent = conn.execute("SELECT count(*) FROM jobs_engine_job WHERE target = ANY(%s) "
                             "AND attempts > 0", [targets]).fetchone()
    assert_promises_kept(run, report, summary)
    spread = {k: p for k, p in key_partitions(deliveries).items() if len(p) > 1}
    assert not spread, f"keys spread over Kafka partitions: {list(spread)[:5]}"
    assert left_at_restart > 0, "the outage did not land mid-drain\n" + summary
    assert watch.paused, "no target was paused while the broker was down\n" + summary
    assert watch.max_attempts == 0 and spent == (0,), \
        f"attempts spent on an unreachable broker (max {watch.max_attempts} during the " \
        f"outage, {spent} rows left with attempts)\n{summary}"


# -- (d) ---------------------------------------------------------------------------------------


def test_d_postgres_unreachable_for_twice_the_lease(fault_run: FaultRun) -> None:
    run, work = fault_run, workload()
    start_workers(run)
    run.enqueue(work)
    at(run, work, 0.35)
    run.stop_db_for(2 * LEASE_S)
    report, summary = finish(run, f"(d) PostgreSQL unreachable for {2 * LEASE_S:.0f}s")
    assert_promises_kept(run, report, summary)


# -- (e) ---------------------------------------------------------------------------------------


def test_e_postgres_crashed_twice_during_a_drain(fault_run: FaultRun) -> None:
    database_fault_twice(fault_run, fault_run.crash_db, "(e) PostgreSQL crashed twice")
