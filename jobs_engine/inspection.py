"""``get_job``: what an operator needs of one job, wherever it is (waiting, running, DEAD,
or completed and kept by its target's policy)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobs_engine import store
from jobs_engine.errors import InvalidJob
from jobs_engine.states import JobStatus
from jobs_engine.store import read_dt, read_json

MAX_JOB_ID = 2**63 - 1  # bigint


@dataclass(frozen=True, kw_only=True)
class JobInfo:
    """One job as ``get_job`` returns it: what an operator needs of it (status, attempts,
    result, last error, created, started and finished times)."""

    id: int
    target: str
    code: str
    key: str | None
    status: JobStatus
    attempts: int  # tries made, as a policy's ``attempts`` counts them
    result: Any  # what the handler returned (DONE jobs of targets that keep them)
    last_error: str
    created_at: datetime
    started_at: datetime | None  # the last try's start
    finished_at: datetime | None  # DONE: when it completed; DEAD: when it went DEAD
    payload: Any = None
    running_on: str | None = None  # RUNNING: the worker that holds it
    # Long lane: the tries that ended, oldest first (``models.TRIES_HELP``)
    tries: tuple[dict[str, Any], ...] = ()
    tenant_id: str | None = None  # the tenant it belongs to; None: none


def get_job(job_id: int) -> JobInfo | None:
    """The job ``job_id``, or None when there is none (never enqueued, or removed: not kept
    by its policy, skipped, cancelled, pruned). A malformed id raises ``InvalidJob``."""
    if isinstance(job_id, bool) or not isinstance(job_id, int) or not 1 <= job_id <= MAX_JOB_ID:
        raise InvalidJob("job_id", f"must be a whole number from 1 to {MAX_JOB_ID}, "
                                   f"got {job_id!r}")
    row = store.job_info_row(job_id)
    if row is None:
        return None
    (job_id, target, code, key, status, attempts, result, last_error, created_at, started_at,
     finished_at, payload, running_on, tries, tenant_id) = row
    created = read_dt(created_at)
    assert created is not None, "created_at is NOT NULL"
    return JobInfo(id=job_id, target=target, code=code, key=key, status=JobStatus(status),
                   attempts=attempts, result=read_json(result), last_error=last_error,
                   created_at=created,
                   started_at=read_dt(started_at), finished_at=read_dt(finished_at),
                   payload=read_json(payload),
                   running_on=running_on if status == JobStatus.RUNNING else None,
                   tries=tuple(read_json(tries) or ()), tenant_id=tenant_id)
