"""Job policies in real worker processes on PostgreSQL: tries and waits, DONE with the
result and DEAD with the error, keep counts pruned by the workers' retention, and jobs of
a target no worker registers made DEAD while the others flow.

One ``run_workers`` process (both lanes) with a retention pass every second and an
unhandled grace of one second; the rows are watched while it works, so the waits are read
from the rows' own times (each failed try writes ``next_run_at`` and ``updated_at`` from one
database time), and the runs from the handlers' record files.
"""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import timedelta
from typing import Any

import pytest

from jobs_engine import enqueue, get_job
from jobs_engine.models import CompletedJob, Job
from jobs_engine.states import JobStatus
from tests.process.harness import WorkerCluster, wait_until
from tests.process.worker_targets import (
    FAST_AT_LEAST_ONCE,
    FAST_DEFAULT_POLICY,
    FAST_KEEP_3,
    FAST_TWO_ATTEMPTS,
    LONG_DEFAULT_POLICY,
    LONG_RUN_ONCE,
)

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

GONE = "proc:gone"  # registered only in this process: no worker has its handler


def put(target: str, payload: dict[str, Any]) -> int:
    job_id = enqueue(target, payload).job_id
    assert job_id is not None
    return job_id


def test_policies_in_real_workers(cluster: WorkerCluster, targets: Any) -> None:
    targets(GONE)
    flaky = {lane: put(target, {"fail": 2, "n": lane})
             for lane, target in (("fast", FAST_DEFAULT_POLICY), ("long", LONG_DEFAULT_POLICY))}
    charge = put(LONG_RUN_ONCE, {"fail": "always"})
    twice = put(FAST_TWO_ATTEMPTS, {"fail": "always"})
    gone = [put(GONE, {}) for _ in range(3)]
    others = [put(FAST_AT_LEAST_ONCE, {}) for _ in range(3)]
    cluster.start("run_workers", JOBS_RETENTION_S="1", JOBS_UNHANDLED_GRACE_S="1")
    # Watch the two flaky rows from the start: each failed try leaves its wait in the row
    # for a second or two. The wait runs from the failure, a moment before the outcome's
    # write (``updated_at``).
    waits: dict[int, set[tuple[int, float]]] = defaultdict(set)

    def watch_flaky() -> None:
        for job_id in flaky.values():
            row = Job.objects.filter(id=job_id).values("attempts", "next_run_at",
                                                       "updated_at").first()
            if row and row["attempts"]:
                waits[job_id].add((row["attempts"], round(
                    (row["next_run_at"] - row["updated_at"]).total_seconds(), 3)))

    keep = []
    for n in range(7):  # one at a time: each completes in its own send, at its own time
        keep.append(put(FAST_KEEP_3, {"n": n}))
        wait_until(lambda: watch_flaky() or not Job.objects.filter(id=keep[-1]).exists(), 30,
                   f"keep {n}", interval=0.02)

    def finished() -> bool:
        watch_flaky()
        return (CompletedJob.objects.filter(id__in=flaky.values()).count() == 2
                and Job.objects.filter(id__in=[charge, twice, *gone],
                                       status=JobStatus.DEAD).count() == 5
                and not Job.objects.filter(id__in=others).exists()
                and CompletedJob.objects.filter(target=FAST_KEEP_3).count() == 3)

    wait_until(finished, 60, "every policy's end state", interval=0.02)
    records = cluster.records()
    starts = defaultdict(list)
    for record in records:
        if record.event == "start":
            starts[record.job_id].append(record.at)

    # DEFAULT_POLICY: fails twice, waits 1 s then 2 s, the third try completes.
    for lane, job_id in flaky.items():
        seen = dict(sorted(waits[job_id]))
        assert sorted(seen) == [1, 2], (lane, waits[job_id])
        assert 0.9 <= seen[1] <= 1.0 and 1.9 <= seen[2] <= 2.0, (lane, waits[job_id])
        runs = starts[job_id]
        assert len(runs) == 3, (lane, runs)
        assert runs[1] - runs[0] >= 1.0 and runs[2] - runs[1] >= 2.0, (lane, runs)
        info = get_job(job_id)
        assert info is not None
        assert (info.status, info.attempts, info.result) == (
            JobStatus.DONE, 3, {"n": lane, "tries": 3})
        assert info.finished_at is not None and info.started_at is not None
        assert info.finished_at - info.created_at >= timedelta(seconds=3)

    # RUN_ONCE_POLICY runs once; attempts=2 stops after two.
    assert len(starts[charge]) == 1
    assert len(starts[twice]) == 2
    assert Job.objects.get(id=charge).attempts == 1
    assert Job.objects.get(id=twice).attempts == 2
    assert Job.objects.get(id=twice).last_error == "RuntimeError: try 2 fails (attempt 2 of 2)"

    # The target no worker registers: DEAD with the reason, never run; the others flowed.
    assert set(Job.objects.filter(id__in=gone).values_list("status", "last_error")) == {
        (JobStatus.DEAD, f"no handler registered for {GONE}")}
    assert not any(r.job_id in gone for r in records)
    assert all(len(starts[job_id]) >= 1 for job_id in others)

    # Keep counts: the newest 3 completed of FAST_KEEP_3 (and nothing more, a while later).
    time.sleep(1.5)
    kept = sorted(CompletedJob.objects.filter(target=FAST_KEEP_3).order_by(
        "-finished_at", "-id").values_list("id", flat=True)[:10])
    assert kept == sorted(keep[-3:])
    assert CompletedJob.objects.get(id=keep[-1]).result == {"n": 6, "tries": 1}
    assert [p.alive() for p in cluster.workers] == [True]
