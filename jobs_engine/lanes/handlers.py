"""Calling a target's handler: its failure as a value, its result as JSON text.

Every exception a handler raises becomes an outcome (``outcomes.judge``), never a crashed
worker; a result the engine cannot store (not JSON, a NUL, too deep, too large) fails the
try with ``InvalidResult`` rather than being dropped. Both lanes call handlers only through
here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from jobs_engine.conf import jobs_settings
from jobs_engine.context import job_context
from jobs_engine.errors import InvalidResult
from jobs_engine.job import Job
from jobs_engine.registry import Target
from jobs_engine.text import json_text


class Answer(NamedTuple):
    """What a handler did with one job: the exception it raised, or its result as the
    JSON text to keep (None when it returned None)."""

    error: BaseException | None
    result_json: str | None = None


_RETURNED_NOTHING = Answer(None)  # the hot path's answer: one object for every success


def _result(target: Target, value: Any) -> Answer:
    if value is None:
        return _RETURNED_NOTHING
    try:
        return Answer(None, json_text(value, jobs_settings().MAX_PAYLOAD_BYTES))
    except ValueError as exc:
        return Answer(InvalidResult(f"the handler of {target.name} returned a result that "
                                    f"cannot be kept: it {exc}"))


def call_handler(target: Target, job: Job) -> Answer:
    with job_context(job.trace_id, {"via": "system", "origin": job.actor}, job.tenant_id):
        try:
            value = target.handler(job)
        except Exception as exc:  # every failure is an outcome, never a crashed worker
            return Answer(exc)
    return _result(target, value)


def call_batch_handler(target: Target, jobs: Sequence[Job]) -> list[Answer]:
    """The batch handler returns, per job and in order, an exception or a result."""
    assert target.batch_handler is not None
    # Jobs it enqueues belong to the send's tenant, when every job of the send has one.
    tenants = {job.tenant_id for job in jobs}
    tenant = next(iter(tenants)) if len(tenants) == 1 else None
    with job_context(jobs[0].trace_id, {"via": "system"}, tenant):
        try:
            values = list(target.batch_handler(jobs))
        except Exception as exc:
            return [Answer(exc)] * len(jobs)
    if len(values) != len(jobs):
        error = RuntimeError(f"batch handler of {target.name} returned {len(values)} results "
                             f"for {len(jobs)} jobs")
        return [Answer(error)] * len(jobs)
    return [Answer(value) if isinstance(value, BaseException) else _result(target, value)
            for value in values]
