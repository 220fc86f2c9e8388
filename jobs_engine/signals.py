"""What a run tells the world: one ``job run`` log line per run, and for a row that goes
DEAD the ``job dead alert`` error line and the ``job_dead`` signal
(``job_dead(sender, job_id, target, code, reason)``, sent once per row, after the write
committed)."""

from __future__ import annotations

import logging

from django.dispatch import Signal

logger = logging.getLogger("jobs_engine")

job_dead = Signal()
"""Sent once for each row that goes DEAD, after the write committed:
``job_dead(sender, job_id, target, code, reason)``."""


def log_run(code: str, target: str, dedupe_key: str, attempts: int, duration_ms: float,
            result: str, **extra: object) -> None:
    """The one line every run writes (also an operator's skip or cancel, and a lossy
    hand-off): ``job run code= target= dedupe_key= attempts= duration_ms= result=``."""
    tail = "".join(f" {name}={value}" for name, value in extra.items())
    logger.info("job run code=%s target=%s dedupe_key=%s attempts=%s duration_ms=%.1f "
                "result=%s%s", code, target, dedupe_key, attempts, duration_ms, result, tail)


def announce_dead(job_id: int, target: str, code: str, dedupe_key: str, reason: str) -> None:
    """The DEAD alert: an error-level log line and the ``job_dead`` signal."""
    logger.error("job dead alert id=%s target=%s code=%s dedupe_key=%s reason=%s",
                 job_id, target, code, dedupe_key, reason)
    # A failing receiver must not stop the outcomes still to be written.
    for receiver, response in job_dead.send_robust(sender=None, job_id=job_id, target=target,
                                                   code=code, reason=reason):
        if isinstance(response, Exception):
            logger.error("job_dead receiver %r failed: %r", receiver, response)
