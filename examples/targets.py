"""Demo targets: a fast-lane event log and a long-lane report."""

from __future__ import annotations

import logging
import time

from jobs_engine import DeliveryMode, Job, Lane, register_target
from jobs_engine.errors import UnknownTarget
from jobs_engine.registry import get_target

logger = logging.getLogger("examples")

EVENT_LOG = "demo:event-log"
REPORT = "demo:report"


def log_event(job: Job) -> None:
    logger.info("demo event sent key=%s version=%s payload=%s trace_id=%s", job.key,
                job.version, job.payload, job.trace_id)


def build_report(job: Job) -> None:
    seconds = float((job.payload or {}).get("seconds", 1))
    logger.info("demo report started id=%s for %.1fs", job.id, seconds)
    time.sleep(seconds)
    logger.info("demo report finished id=%s", job.id)


def register() -> None:
    try:
        get_target(EVENT_LOG)
    except UnknownTarget:
        register_target(EVENT_LOG, log_event, lane=Lane.FAST,
                        delivery_mode=DeliveryMode.AT_LEAST_ONCE)
        register_target(REPORT, build_report, lane=Lane.LONG)
