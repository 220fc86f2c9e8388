"""Demo targets: a fast-lane event log, a long-lane report, and a schedule that fires every
minute (``demo_cleanup``) so ``scripts/run.sh`` shows a cron slot becoming a job."""

from __future__ import annotations

import logging
import time
from datetime import datetime

from jobs_engine import DeliveryMode, Job, Lane, register_target
from jobs_engine.errors import UnknownTarget
from jobs_engine.registry import get_target
from schedules import declare, declared

logger = logging.getLogger("examples")

EVENT_LOG = "demo:event-log"
REPORT = "demo:report"
CLEANUP = "demo_cleanup"


def log_event(job: Job) -> None:
    logger.info("demo event sent key=%s version=%s payload=%s trace_id=%s", job.key,
                job.version, job.payload, job.trace_id)


def build_report(job: Job) -> None:
    seconds = float((job.payload or {}).get("seconds", 1))
    logger.info("demo report started id=%s for %.1fs", job.id, seconds)
    time.sleep(seconds)
    logger.info("demo report finished id=%s", job.id)


def cleanup(slot: datetime, job: Job) -> None:
    """A schedule handler: idempotent per slot (a slot may run again after a crash)."""
    from jobs_engine.models import Job as JobRow
    from jobs_engine.states import JobStatus

    dead = JobRow.objects.filter(status=JobStatus.DEAD).count()
    logger.info("demo cleanup ran slot=%s job=%s dead_jobs=%s", slot.isoformat(), job.id, dead)


def register() -> None:
    try:
        get_target(EVENT_LOG)
    except UnknownTarget:
        register_target(EVENT_LOG, log_event, lane=Lane.FAST,
                        delivery_mode=DeliveryMode.AT_LEAST_ONCE)
        register_target(REPORT, build_report, lane=Lane.LONG)
    if CLEANUP not in declared():
        declare(CLEANUP, "* * * * *", cleanup)
