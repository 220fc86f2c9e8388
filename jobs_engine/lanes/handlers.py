"""Calling a target's handler, and its failure as a value.

Every exception a handler raises becomes an outcome (``outcomes.judge``), never a
crashed worker; both lanes call handlers only through here.
"""

from __future__ import annotations

from collections.abc import Sequence

from jobs_engine.context import job_context
from jobs_engine.job import Job, RawPayloadJob
from jobs_engine.registry import Target


def _as_handed(target: Target, job: Job) -> Job:
    # The deprecated ``payload_json=True`` promised the stored text as ``job.payload``.
    return RawPayloadJob(*job) if target.payload_json else job


def call_handler(target: Target, job: Job) -> BaseException | None:
    with job_context(job.trace_id, {"via": "system", "origin": job.actor}):
        try:
            target.handler(_as_handed(target, job))
        except Exception as exc:  # every failure is an outcome, never a crashed worker
            return exc
    return None


def call_batch_handler(target: Target, jobs: Sequence[Job]) -> list[BaseException | None]:
    assert target.batch_handler is not None
    handed = [RawPayloadJob(*job) for job in jobs] if target.payload_json else jobs
    with job_context(jobs[0].trace_id, {"via": "system"}):
        try:
            results = list(target.batch_handler(handed))
        except Exception as exc:
            return [exc] * len(jobs)
    if len(results) != len(jobs):
        error = RuntimeError(f"batch handler of {target.name} returned {len(results)} results "
                             f"for {len(jobs)} jobs")
        return [error] * len(jobs)
    return results
