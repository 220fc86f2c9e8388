"""Lossy targets: one try, right after the enqueuing transaction commits, dropped on failure.

No row is written for them (``enqueue`` hands them here through ``on_commit``), so the run
happens in the enqueuing process, on a small thread pool, and nothing retries it.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

from jobs_engine.conf import JobsSettings
from jobs_engine.job import Job
from jobs_engine.lanes.handlers import call_handler
from jobs_engine.registry import Target
from jobs_engine.signals import log_run
from jobs_engine.store import NewJob

logger = logging.getLogger("jobs_engine")

_pool: ThreadPoolExecutor | None = None


def submit(target: Target, new: NewJob, settings: JobsSettings) -> None:
    global _pool
    if not settings.WORKERS:
        logger.warning("lossy job dropped target=%s dedupe_key=%s reason=JOBS_WORKERS=off",
                       target.name, new.dedupe_key)
        return
    if _pool is None:
        _pool = ThreadPoolExecutor(2, thread_name_prefix="jobs-lossy")
    job = Job(None, new.target, new.code, new.key, new.version, new.payload_json, new.headers,
              0, new.trace_id, new.dedupe_key, new.actor, None, new.partition,
              new.delivery_mode, new.tenant_id)
    _pool.submit(_run, target, job)


def _run(target: Target, job: Job) -> None:
    started = time.monotonic()
    error = call_handler(target, job).error
    if error is not None:
        logger.warning("lossy job dropped target=%s dedupe_key=%s error=%r", target.name,
                       job.dedupe_key, error)
        return
    log_run(job.code, job.target, job.dedupe_key, 0, (time.monotonic() - started) * 1000, "ok",
            lossy=1)
