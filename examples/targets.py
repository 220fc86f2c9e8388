"""Demo targets: a fast-lane event log, a long-lane report, and a schedule that fires every
minute (``demo_cleanup``) so ``scripts/run.sh`` shows a cron slot becoming a job.

Each target's name and policy are declared side by side, here, where every caller imports
the name from (docs/guide.md, "Job policies", tells why each has the policy it has).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any

from jobs_engine import DEFAULT_POLICY, DeliveryMode, Job, JobPolicy, Lane, register_target
from jobs_engine.contrib.schedules import declare, declared
from jobs_engine.errors import UnknownTarget
from jobs_engine.registry import get_target

logger = logging.getLogger("examples")

# A log line per event: resending is harmless (at-least-once), a blip is worth two retries.
EVENT_LOG = "demo:event-log"
EVENT_LOG_POLICY = DEFAULT_POLICY

# Minutes of work: one more try, after 30 s (a restart mid-run), and the last 20 results
# kept so an operator can see what the recent reports produced.
REPORT = "demo:report"
REPORT_POLICY = JobPolicy(attempts=2, backoff_s=30, keep_completed=20, keep_failed=200)

CLEANUP = "demo_cleanup"


def log_event(job: Job) -> None:
    logger.info("demo event sent key=%s version=%s payload=%s trace_id=%s", job.key,
                job.version, job.payload, job.trace_id)


def build_report(job: Job) -> dict[str, Any]:
    """Returns a summary: kept with the completed job (admin, API, ``get_job``)."""
    seconds = float((job.payload or {}).get("seconds", 1))
    logger.info("demo report started id=%s for %.1fs", job.id, seconds)
    time.sleep(seconds)
    logger.info("demo report finished id=%s", job.id)
    return {"seconds": seconds, "report": f"report-{job.id}.csv"}


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
                        delivery_mode=DeliveryMode.AT_LEAST_ONCE, policy=EVENT_LOG_POLICY)
        register_target(REPORT, build_report, lane=Lane.LONG, policy=REPORT_POLICY)
    if CLEANUP not in declared():
        declare(CLEANUP, "* * * * *", cleanup)
