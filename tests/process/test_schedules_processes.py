"""Real ``tick_schedules`` / ``run_long_lane`` / ``run_workers`` processes on PostgreSQL
(the same slot ticked by every pod: docs/design.md#schedules).

The processes declare the test schedule ``proc_tick`` (``tests.process.schedule_app``)
with a seconds-field cron, so a slot comes every 2 seconds; its handler records each run
in a file per process. Two tick processes race for every slot; the database must let
exactly one of them turn it into a job, and the long lane must run that job once.
"""

from __future__ import annotations

import re
import signal
import time
from collections import Counter
from datetime import datetime, timedelta
from itertools import pairwise

import pytest

from jobs_engine.contrib.schedules.models import Schedule
from jobs_engine.models import Job, Worker
from tests.process.harness import WorkerCluster, WorkerProc, wait_until
from tests.process.schedule_app import CODE, CRON_ENV, read_slot_records

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

EVERY_2_S = {CRON_ENV: "*/2 * * * * *"}
_ENQUEUED = re.compile(rf"schedule slot enqueued code={CODE} slot=(\S+) job_id=\d+ "
                       r"inserted=True")


def enqueued_slots(proc: WorkerProc) -> list[str]:
    """Slots this tick process turned into a job (it logs only the advances it won)."""
    return _ENQUEUED.findall(proc.stderr())


def stop(procs: list[WorkerProc]) -> None:
    for proc in procs:
        proc.send(signal.SIGTERM)
    for proc in procs:
        assert proc.wait_exit(15) == 0, proc.dump()


def test_two_tick_processes_and_a_long_lane_run_each_slot_exactly_once(
        cluster: WorkerCluster) -> None:
    ticks = [cluster.start("tick_schedules", **EVERY_2_S) for _ in range(2)]
    lane = cluster.start("run_long_lane", **EVERY_2_S)
    for proc in (*ticks, lane):
        proc.worker_id()
    wait_until(lambda: len(read_slot_records(cluster.out_dir)) >= 1, 15, "the first slot run")
    time.sleep(8)
    stop([*ticks, lane])

    runs = read_slot_records(cluster.out_dir)
    ran = [r.slot for r in runs]
    print(f"slots run: {ran}")
    assert len(ran) >= 4, ran
    assert len(set(ran)) == len(ran), Counter(ran).most_common(3)  # each slot ran once
    assert {r.pid for r in runs} == {lane.pid}
    assert all(r.attempts == 0 for r in runs)
    by_tick = [enqueued_slots(proc) for proc in ticks]
    enqueued = [slot for slots in by_tick for slot in slots]
    print(f"slots enqueued per tick process: {[len(slots) for slots in by_tick]}")
    assert len(set(enqueued)) == len(enqueued), (by_tick, "a slot enqueued by both ticks")
    assert set(ran) <= set(enqueued)
    # What was enqueued but not run yet is still a PENDING job; nothing else is left.
    left = {j.payload["slot"]: j.status for j in Job.objects.filter(code=CODE)}
    assert left == dict.fromkeys(set(enqueued) - set(ran), "PENDING")
    row = Schedule.objects.get(code=CODE)
    if row.last_skipped_at is None:  # no tick fell behind: every 2-second slot is there
        times = sorted(datetime.fromisoformat(slot) for slot in enqueued)
        assert all(b - a == timedelta(seconds=2) for a, b in pairwise(times))
    assert row.last_run_at == max(datetime.fromisoformat(slot) for slot in ran)
    assert not Worker.objects.exists()


def test_run_workers_ticks_and_runs_the_schedule_in_one_process(
        cluster: WorkerCluster) -> None:
    proc = cluster.start("run_workers", **EVERY_2_S)
    assert "running fast, long, schedules" in wait_until(
        lambda: proc.worker_id() and proc.stdout(), 15, "the worker line")
    wait_until(lambda: len(read_slot_records(cluster.out_dir)) >= 2, 15, "two slot runs")
    stop([proc])
    runs = read_slot_records(cluster.out_dir)
    # A slot runs right after its tick (the service returns 0 so the long lane polls).
    assert all(r.at - datetime.fromisoformat(r.slot).timestamp() < 1.0 for r in runs), runs


def test_tick_schedules_with_workers_off_only_syncs_and_exits_0(
        cluster: WorkerCluster) -> None:
    proc = cluster.start("tick_schedules", JOBS_WORKERS="off", **EVERY_2_S)
    assert proc.wait_exit(20) == 0, proc.dump()
    assert "JOBS_WORKERS=off" in proc.stdout()
    row = Schedule.objects.get(code=CODE)
    assert row.enabled and row.next_run_at is not None
    assert not Worker.objects.exists()
    assert not Job.objects.filter(code=CODE).exists()
