"""Real worker processes against real PostgreSQL: boot, crash, stall, shutdown, NOTIFY.

Each test starts ``manage.py run_fast_lane`` / ``run_long_lane`` / ``run_workers``
subprocesses on the pytest-django test database with leases of seconds (see
``harness.DEFAULT_JOBS_ENV``), signals them (SIGKILL, SIGSTOP/SIGCONT, SIGTERM) and checks
the exact rows and the handlers' records. Unit tests drive the same code with a fixed
clock; only these show the pieces (heartbeat thread, signal handlers, LISTEN socket,
separate connections) working together.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from jobs_engine import enqueue, enqueue_many
from jobs_engine.enqueueing import partition_for
from jobs_engine.models import Job, Partition, Worker
from jobs_engine.states import JobStatus
from tests.helpers import in_flight
from tests.process.harness import (
    HEARTBEAT_S,
    LEASE_S,
    LONG_LEASE_S,
    WorkerCluster,
    WorkerProc,
    wait_until,
)
from tests.process.worker_targets import (
    FAST_AT_LEAST_ONCE,
    FAST_AT_MOST_ONCE,
    LONG_AT_LEAST_ONCE,
    LONG_AT_MOST_ONCE,
    Record,
)

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

PARTITIONS = 64
TAKEOVER_REASON = "in flight when its partition was taken over"
LONG_EXPIRED_REASON = "lease expired while running; at-most-once rows are not run twice"


# -- helpers -------------------------------------------------------------------------------


def ownership() -> dict[int, str]:
    """partition -> owner, for leases still valid on the database clock."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT partition, owner FROM {Partition._meta.db_table} "
            "WHERE owner IS NOT NULL AND lease_until > clock_timestamp()")
        return dict(cursor.fetchall())


def wait_settled(procs: list[WorkerProc], timeout: float = 30.0,
                 stable_for: float = 2 * HEARTBEAT_S + 0.5) -> dict[int, str]:
    """Wait until the live processes hold a fair share each (floor or ceil of 64/n), every
    partition leased, and the map unchanged for ``stable_for`` seconds; returns the map."""
    ids = {p.worker_id() for p in procs}
    low, high = PARTITIONS // len(ids), -(-PARTITIONS // len(ids))
    state: dict[str, Any] = {"map": None, "since": 0.0}

    def settled() -> dict[int, str] | None:
        current = ownership()
        counts = Counter(current.values())
        fair = (len(current) == PARTITIONS and set(counts) == ids
                and all(low <= n <= high for n in counts.values()))
        if not fair or current != state["map"]:
            state.update(map=current if fair else None, since=time.monotonic())
            return None
        return current if time.monotonic() - state["since"] >= stable_for else None

    return wait_until(settled, timeout, f"a stable fair share over {len(ids)} workers",
                      interval=0.1)


def key_in(partition: int, prefix: str, skip: int = 0) -> str:
    """The ``skip``-th key of the form ``<prefix>-<n>`` that hashes to ``partition``."""
    n = 0
    while True:
        key = f"{prefix}-{n}"
        if partition_for(key, key, PARTITIONS) == partition:
            if skip == 0:
                return key
            skip -= 1
        n += 1


def rows_in(partition: int, target: str, count: int, prefix: str, sleep: float = 0.0
            ) -> list[dict[str, Any]]:
    """``count`` enqueue items of distinct keys (each the head of its key) in ``partition``."""
    items = []
    for i in range(count):
        key = key_in(partition, f"{prefix}-{target}", i)
        items.append({"target": target, "payload": {"sleep": sleep}, "key": key,
                      "dedupe_key": f"{prefix}:{target}:{key}"})
    return items


def enqueue_items(items: list[dict[str, Any]]) -> list[int]:
    """One committed insert; returns the job ids in item order."""
    results = enqueue_many(items)
    ids = [r.job_id for r in results if r.inserted and r.job_id is not None]
    assert len(ids) == len(items), results
    return ids


def starts(records: list[Record], job_id: int) -> list[Record]:
    return [r for r in records if r.job_id == job_id and r.event == "start"]


def ends(records: list[Record], job_id: int) -> list[Record]:
    return [r for r in records if r.job_id == job_id and r.event == "end"]


def assert_sent_only_by_owner(cluster: WorkerCluster) -> None:
    """Every fast-lane send started while its partition was owned by the sending process."""
    for proc in cluster.procs:
        worker_id = proc.worker_id()
        wrong = [r for r in proc.records() if r.event == "start"
                 and r.target in {FAST_AT_MOST_ONCE, FAST_AT_LEAST_ONCE} and r.owner != worker_id]
        assert not wrong, f"{proc.name} ({worker_id}) sent rows of partitions it did not own: " \
                          f"{wrong}"


def wait_stopped(proc: WorkerProc) -> None:
    """Wait until the kernel reports the process stopped (state T), so every record it
    wrote is older than the next clock reading."""

    def stopped() -> bool:
        stat = Path(f"/proc/{proc.pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] == "T"

    wait_until(stopped, 5, f"{proc.name} to stop", interval=0.01)


def pending_count() -> int:
    return Job.objects.filter(status=JobStatus.PENDING).count()


# -- 1. boot ---------------------------------------------------------------------------------


def test_three_workers_booting_at_once_seed_64_partitions_once_and_share_them(
        cluster: WorkerCluster) -> None:
    assert Partition.objects.count() == 0 and Worker.objects.count() == 0
    procs = [cluster.start("run_fast_lane") for _ in range(3)]

    settled = wait_settled(procs)

    assert sorted(Partition.objects.values_list("partition", flat=True)) == list(range(64))
    counts = Counter(settled.values())
    assert sorted(counts.values()) == [21, 21, 22]
    assert sum(counts.values()) == 64
    assert set(counts) == {p.worker_id() for p in procs}
    assert sorted(Worker.objects.values_list("pid", flat=True)) == sorted(p.pid for p in procs)
    for proc in procs:
        assert proc.alive(), proc.dump()
        assert "Traceback" not in proc.stderr() and " ERROR " not in proc.stderr(), proc.dump()


# -- 2. SIGKILL mid-send ---------------------------------------------------------------------


def test_sigkill_mid_send_takeover_judges_in_flight_rows_by_delivery_mode(
        cluster: WorkerCluster) -> None:
    procs = [cluster.start("run_fast_lane") for _ in range(3)]
    settled = wait_settled(procs)
    victim, survivors = procs[0], procs[1:]
    victim_id = victim.worker_id()
    victim_parts = sorted(p for p, owner in settled.items() if owner == victim_id)
    first, last = victim_parts[0], victim_parts[-1]
    survivor_part = min(p for p, owner in settled.items() if owner != victim_id)

    # One commit, so the victim reads every row in one poll. Its at-least-once rows of
    # both partitions go in one send ("proc:al" sorts before "proc:am"), marked in flight
    # in both partitions at once; then the slow at-most-once rows one by one.
    all_ids = enqueue_items(
        rows_in(first, FAST_AT_LEAST_ONCE, 3, "k2", sleep=0.2)
        + rows_in(first, FAST_AT_MOST_ONCE, 3, "k2", sleep=1.0)
        + rows_in(last, FAST_AT_LEAST_ONCE, 2, "k2") + rows_in(last, FAST_AT_MOST_ONCE, 2, "k2")
        + rows_in(survivor_part, FAST_AT_LEAST_ONCE, 2, "k2")
        + rows_in(survivor_part, FAST_AT_MOST_ONCE, 2, "k2"))
    first_al, first_am, elsewhere = all_ids[:3], all_ids[3:6], all_ids[10:]
    later_al, later_am = all_ids[6:8], all_ids[8:10]

    wait_until(lambda: starts(victim.records(), first_am[1]), 15,
               "the victim to start the second at-most-once row")
    victim.send(signal.SIGKILL)
    killed_at = time.time()
    victim.wait_exit(5)

    # Frozen until the lease runs out: what the dead process had in flight, and its leases.
    assert set(in_flight(first)) == set(first_al) | set(first_am[:2])
    assert set(in_flight(last)) == set(later_al)
    assert Job.objects.filter(id__in=later_al + later_am, status=JobStatus.PENDING).count() == 4
    old_leases = dict(Partition.objects.filter(partition__in=victim_parts)
                      .values_list("partition", "lease_until"))
    assert set(old_leases) == set(victim_parts) and all(old_leases.values())

    seen_at: dict[int, float] = {}  # wall time a survivor was first seen owning it
    taken_db: dict[int, datetime] = {}  # database time of the take (its lease - LEASE_S)

    def all_taken() -> bool:
        for part, owner, lease_until in Partition.objects.filter(
                partition__in=victim_parts).values_list("partition", "owner", "lease_until"):
            if owner not in (None, victim_id) and part not in seen_at:
                seen_at[part] = time.time()
                taken_db[part] = lease_until - timedelta(seconds=LEASE_S)
        return len(seen_at) == len(victim_parts)

    wait_until(all_taken, LEASE_S + HEARTBEAT_S + 10, "survivors to take every partition",
               interval=0.02)
    earliest = min(seen_at.values()) - killed_at
    latest = max(seen_at.values()) - killed_at
    print(f"takeover after the kill: first {earliest:.2f}s, all {latest:.2f}s")
    # No partition was taken before the dead worker's lease on it ran out (database
    # clock; a renewal after the take only moves the estimate later), and all were taken
    # within lease + heartbeat of the kill (+ slack for polling and a loaded machine).
    early = {p: (taken_db[p], old_leases[p]) for p in victim_parts if taken_db[p] < old_leases[p]}
    assert early == {}, early
    assert latest <= LEASE_S + HEARTBEAT_S + 1.5, seen_at
    survivor_ids = {p.worker_id() for p in survivors}
    final = wait_settled(survivors)
    assert set(final.values()) == survivor_ids

    wait_until(lambda: pending_count() == 0, 20, "every row to be sent or closed")
    records = cluster.records()
    survivor_records = [r for r in records if r.pid != victim.pid]

    # At-most-once rows in flight on the dead process: DEAD with the reason, never resent.
    dead = {j.id: j for j in Job.objects.all()}
    assert set(dead) == set(first_am[:2])
    for job in dead.values():
        assert job.status == JobStatus.DEAD
        assert job.last_error == TAKEOVER_REASON
        assert job.closed_at is not None
        assert len(starts(records, job.id)) == 1 and starts(records, job.id)[0].pid == victim.pid
    # At-least-once rows in flight: sent by the victim, then again by a survivor.
    for job_id in first_al + later_al:
        assert starts(records, job_id)[0].pid == victim.pid
        assert ends(survivor_records, job_id), f"at-least-once row {job_id} was not resent"
    # Rows never started stay PENDING through the takeover: each sent exactly once.
    for job_id in [first_am[2], *later_am, *elsewhere]:
        assert len(starts(records, job_id)) == 1, starts(records, job_id)
        assert len(ends(records, job_id)) == 1
    # Nothing lost: every job is delivered (row deleted) or DEAD with a reason.
    for job_id in set(all_ids) - set(dead):
        assert ends(records, job_id), f"job {job_id} deleted but never delivered"
    assert_sent_only_by_owner(cluster)


def test_sigkill_with_rows_marked_together_presumes_them_dead_and_sends_none_twice(
        cluster: WorkerCluster) -> None:
    """``FAST_MARK_ROWS`` 3: the victim marks three at-most-once rows with one commit and
    is killed handing the second. On takeover the three go DEAD, the third never handed
    (at most once: possibly never); the rows after them, never marked, are sent once by
    the next worker."""
    victim = cluster.start("run_fast_lane", JOBS_FAST_MARK_ROWS="3")
    settled = wait_settled([victim])
    ids = enqueue_items(rows_in(min(settled), FAST_AT_MOST_ONCE, 5, "mark3", sleep=1.0))
    wait_until(lambda: starts(victim.records(), ids[1]), 15,
               "the victim to start the second row")
    victim.send(signal.SIGKILL)
    victim.wait_exit(5)
    assert set(in_flight(min(settled))) == set(ids[:3])

    successor = cluster.start("run_fast_lane", JOBS_FAST_MARK_ROWS="3")
    wait_until(lambda: pending_count() == 0, LEASE_S + HEARTBEAT_S + 20,
               "every row to be sent or closed")
    records = cluster.records()
    dead = Job.objects.filter(status=JobStatus.DEAD)
    assert sorted(dead.values_list("id", flat=True)) == sorted(ids[:3])
    assert set(dead.values_list("last_error", flat=True)) == {TAKEOVER_REASON}
    assert [len(starts(records, job_id)) for job_id in ids] == [1, 1, 0, 1, 1]
    assert {r.pid for job_id in ids[3:] for r in starts(records, job_id)} == {successor.pid}
    assert all(ends(records, job_id) for job_id in ids[3:])
    assert_sent_only_by_owner(cluster)


# -- 3. SIGSTOP past the lease ---------------------------------------------------------------


def test_stalled_worker_sends_nothing_more_of_the_partitions_it_lost(
        cluster: WorkerCluster) -> None:
    procs = [cluster.start("run_fast_lane") for _ in range(3)]
    settled = wait_settled(procs)
    # The owner of partition 0 stalls mid-send of partition 0. Whoever takes partition 0
    # takes the lowest free ones first and a rebalance gives back the highest, so partition
    # 0 stays with its new owner while the stalled worker wakes up and rejoins.
    victim = next(p for p in procs if p.worker_id() == settled[0])
    victim_id = victim.worker_id()
    victim_parts = sorted(p for p, owner in settled.items() if owner == victim_id)
    first = victim_parts[0]
    assert first == 0
    stale = enqueue_items(rows_in(first, FAST_AT_MOST_ONCE, 10, "k3", sleep=0.5))

    wait_until(lambda: starts(victim.records(), stale[0]), 15, "the victim to start sending")
    victim.send(signal.SIGSTOP)
    wait_stopped(victim)
    stopped_at = time.time()
    started_before_stop = {r.job_id for r in victim.records() if r.event == "start"}
    in_hand = started_before_stop - {r.job_id for r in victim.records() if r.event == "end"}
    assert started_before_stop and started_before_stop <= set(stale)
    assert len(in_hand) <= 1

    wait_until(lambda: all(ownership().get(p) not in (None, victim_id) for p in victim_parts),
               LEASE_S + HEARTBEAT_S + 10, "the other workers to take the stalled partitions")
    time.sleep(max(0.0, stopped_at + LEASE_S + 2 - time.time()))
    # New rows in the lost partitions, then the stalled worker wakes up.
    fresh: list[int] = []
    for part in victim_parts[:6]:
        fresh += enqueue_items(rows_in(part, FAST_AT_MOST_ONCE, 2, "k3-new")
                               + rows_in(part, FAST_AT_LEAST_ONCE, 1, "k3-new"))
    resumed_at = time.time()
    victim.send(signal.SIGCONT)

    wait_until(lambda: pending_count() == 0, 20, "every row to be sent or closed")
    time.sleep(HEARTBEAT_S + 0.5)  # room for a late, wrong send to show up
    assert victim.alive(), victim.dump()
    records = cluster.records()
    victim_after = [r for r in victim.records() if r.at >= stopped_at]

    # After the stall it writes only the end of the send it was in, plus sends of
    # partitions it legitimately holds again after rejoining (owner recorded = itself).
    assert all(r.at >= resumed_at for r in victim_after)
    rejoined = {r.job_id for r in victim_after if r.event == "start" and r.owner == victim_id}
    unexplained = [r for r in victim_after if r.job_id not in rejoined]
    assert [(r.event, r.job_id) for r in unexplained] == [("end", j) for j in in_hand], \
        unexplained
    assert not rejoined & set(stale)
    # It noticed: its heartbeat found the leases gone.
    wait_until(lambda: f"partition lease lost partition={first} worker={victim_id}"
               in victim.stderr(), 5, "the victim to log the lost lease")

    # Rows it had in flight were presumed DEAD by the new owner; awake, it wrote what
    # really happened (delivered), so none is left DEAD. The rest went to the new owner.
    assert any(TAKEOVER_REASON in p.stderr() for p in procs if p is not victim)
    assert list(Job.objects.values_list("id", "status")) == []
    for job_id in set(stale) - started_before_stop:
        sent = starts(records, job_id)
        assert len(sent) == 1 and sent[0].pid != victim.pid and sent[0].at > stopped_at
    # Rows enqueued after the takeover: sent once, by the partition's owner at that time.
    for job_id in fresh:
        sent = starts(records, job_id)
        assert len(sent) == 1, sent
        sender = next(p for p in cluster.procs if p.pid == sent[0].pid)
        assert sent[0].owner == sender.worker_id()
    assert_sent_only_by_owner(cluster)


# -- 4. SIGTERM ------------------------------------------------------------------------------


def test_sigterm_fast_lane_finishes_the_send_releases_partitions_and_exits_0(
        cluster: WorkerCluster) -> None:
    proc = cluster.start("run_fast_lane")
    worker_id = proc.worker_id()
    wait_until(lambda: len(ownership()) == 64 and set(ownership().values()) == {worker_id}, 15,
               "the only worker to hold every partition")
    [job_id] = enqueue_items(rows_in(5, FAST_AT_MOST_ONCE, 1, "k4", sleep=1.0))
    wait_until(lambda: starts(proc.records(), job_id), 10, "the send to start")

    proc.send(signal.SIGTERM)
    signalled = time.monotonic()
    assert proc.wait_exit(10) == 0, proc.dump()
    assert time.monotonic() - signalled < 5
    assert len(ends(proc.records(), job_id)) == 1
    assert not Job.objects.exists()
    assert Partition.objects.count() == 64
    assert list(Partition.objects.exclude(owner=None).values_list("partition", flat=True)) == []
    assert not Partition.objects.exclude(lease_until=None).exists()
    assert not Worker.objects.exists()
    assert f"worker {worker_id} stopped" in proc.stderr()


def test_sigterm_long_lane_finishes_the_row_in_hand_then_exits_0(
        cluster: WorkerCluster) -> None:
    proc = cluster.start("run_long_lane")
    worker_id = proc.worker_id()
    wait_until(lambda: Worker.objects.filter(worker_id=worker_id).exists(), 10,
               "the liveness row")
    job_id = enqueue(LONG_AT_MOST_ONCE, {"sleep": 2.0}, key="k5").job_id
    wait_until(lambda: starts(proc.records(), job_id), 10, "the long row to start")
    assert Job.objects.get(id=job_id).status == JobStatus.RUNNING

    proc.send(signal.SIGTERM)
    assert proc.wait_exit(15) == 0, proc.dump()
    exited = time.time()
    [end] = ends(proc.records(), job_id)
    assert end.at < exited
    assert not Job.objects.filter(id=job_id).exists()
    assert not Worker.objects.exists()
    assert "job run code=proc:long-am" in proc.stderr() and "result=ok" in proc.stderr()


# -- 5. long lane crash ----------------------------------------------------------------------


def test_long_lane_sigkill_reruns_at_least_once_and_closes_started_at_most_once(
        cluster: WorkerCluster) -> None:
    runner = cluster.start("run_long_lane")
    other = cluster.start("run_long_lane")
    for proc in (runner, other):
        worker_id = proc.worker_id()
        wait_until(lambda w=worker_id: Worker.objects.filter(worker_id=w).exists(), 10,
                   "both liveness rows")
    # Hold the other one still while the runner reserves both rows.
    other.send(signal.SIGSTOP)
    try:
        [al_id, am_id] = enqueue_items([
            {"target": LONG_AT_LEAST_ONCE, "payload": {"sleep": 2.0}, "key": "k6-al"},
            {"target": LONG_AT_MOST_ONCE, "payload": {"sleep": 2.0}, "key": "k6-am"},
        ])
        wait_until(lambda: starts(runner.records(), al_id) and starts(runner.records(), am_id),
                   10, "the runner to start both rows")
    finally:
        other.send(signal.SIGCONT)
    runner.send(signal.SIGKILL)
    killed_at = time.time()
    runner.wait_exit(5)
    assert set(Job.objects.filter(status=JobStatus.RUNNING).values_list("id", flat=True)) == {
        al_id, am_id}
    al_lease = Job.objects.get(id=al_id).lease_until
    assert al_lease is not None

    wait_until(lambda: ends(other.records(), al_id), LONG_LEASE_S + 10,
               "the other worker to re-run the at-least-once row")
    [rerun] = starts(other.records(), al_id)
    delay = rerun.at - killed_at
    print(f"at-least-once row re-run {delay:.2f}s after the kill")
    # Not before the dead worker's lease ran out (same host clock as the database), and
    # within a lease plus an idle poll (+ slack).
    assert rerun.at >= al_lease.timestamp(), (rerun.at, al_lease)
    assert delay <= LONG_LEASE_S + 2.0, delay
    wait_until(lambda: not Job.objects.filter(id=al_id).exists(), 5, "the re-run row deleted")

    records = cluster.records()
    # The at-most-once row had started on the dead worker: never run again, closed DEAD.
    assert [r.pid for r in starts(records, am_id)] == [runner.pid]
    assert ends(records, am_id) == []
    am = Job.objects.get(id=am_id)
    assert am.status == JobStatus.DEAD
    assert am.last_error == LONG_EXPIRED_REASON
    assert am.closed_at is not None
    assert [r.pid for r in starts(records, al_id)] == [runner.pid, other.pid]
    assert list(Job.objects.values_list("id", flat=True)) == [am_id]


# -- 6. NOTIFY -------------------------------------------------------------------------------


def test_idle_fast_lane_wakes_on_notify_not_on_the_poll(cluster: WorkerCluster) -> None:
    proc = cluster.start("run_fast_lane", JOBS_IDLE_POLL_S="5")
    worker_id = proc.worker_id()
    wait_until(lambda: len(ownership()) == 64 and set(ownership().values()) == {worker_id}, 15,
               "the only worker to hold every partition")
    time.sleep(1.0)
    latencies = []
    for i in range(3):
        committed = time.time()
        job_id = enqueue(FAST_AT_MOST_ONCE, {}, key=f"k7-{i}").job_id
        [sent] = wait_until(lambda j=job_id: starts(proc.records(), j), 5, "the send")
        latencies.append(sent.at - committed)
        # The lane just polled: it now waits 5 s, so only a NOTIFY can wake it in time.
        time.sleep(1.2)
    print(f"enqueue-to-send latencies: {[round(x, 3) for x in latencies]}")
    assert all(latency < 0.5 for latency in latencies), latencies


# -- 7. JOBS_WORKERS=off ----------------------------------------------------------------------


def test_run_workers_with_workers_off_exits_0_at_once_without_a_worker_row(
        cluster: WorkerCluster) -> None:
    started = time.monotonic()
    proc = cluster.start("run_workers", JOBS_WORKERS="off")
    assert proc.wait_exit(20) == 0, proc.dump()
    assert time.monotonic() - started < 5
    assert "JOBS_WORKERS=off" in proc.stdout()
    assert not Worker.objects.exists()
    assert not Partition.objects.exists()


# -- 7. database connections cut -------------------------------------------------------------


def cut_database_connections() -> int:
    """Terminate every other connection to the test database, as a PostgreSQL restart does
    to a worker (the shared server itself stays up for the rest of the suite)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        return cursor.fetchone()[0]


def test_workers_ride_out_cut_database_connections_and_send_each_row_once(
        cluster: WorkerCluster) -> None:
    """Every connection of two workers is cut twice mid-drain (poll, LISTEN, heartbeat,
    long-lane threads): both keep running, every row is delivered, no at-most-once row
    twice, and their rows show the outages."""
    from tests.process.worker_targets import NO_DATABASE_ENV

    procs = [cluster.start("run_workers", **{NO_DATABASE_ENV: "1"}) for _ in range(2)]
    for proc in procs:
        proc.worker_id()
    items = [{"target": FAST_AT_MOST_ONCE if n % 2 else FAST_AT_LEAST_ONCE,
              "payload": {"n": n}, "key": f"cut-{n % 40}", "version": n} for n in range(1500)]
    items += [{"target": LONG_AT_MOST_ONCE if n % 2 else LONG_AT_LEAST_ONCE,
               "payload": {"sleep": 0.05}} for n in range(40)]
    ids = enqueue_items(items)
    for _ in range(2):
        wait_until(lambda: Job.objects.count() < len(ids) * 0.8, 30, "the drain to go on")
        assert cut_database_connections() >= 2
        time.sleep(0.5)
    wait_until(lambda: not Job.objects.exists(), 60, "every row to be delivered")

    records = cluster.records()
    started = Counter(r.job_id for r in records if r.event == "start")
    assert set(started) == set(ids)
    at_most_once = {job_id for job_id, item in zip(ids, items, strict=True)
                    if item["target"] in {FAST_AT_MOST_ONCE, LONG_AT_MOST_ONCE}}
    assert [job_id for job_id in at_most_once if started[job_id] > 1] == []
    assert all(proc.alive() for proc in procs), cluster.dump()
    outages = dict(Worker.objects.values_list("worker_id", "db_outages"))
    wait_until(lambda: all(n >= 1 for n in dict(
        Worker.objects.values_list("worker_id", "db_outages")).values()), 10,
        f"the worker rows to show the outages ({outages})")
    for proc in procs:
        proc.send(signal.SIGTERM)
    assert [proc.wait_exit(15) for proc in procs] == [0, 0], cluster.dump()
    assert "Traceback" not in "".join(proc.stderr() for proc in procs), cluster.dump()
