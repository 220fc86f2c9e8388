"""Targets of the fault suite's worker processes: both lanes, both delivery modes.

A handler is the delivery: on entry it appends one line
``deliver <job_id> <target> <key> <version> <pid> <unix_time>`` to ``<pid>.log`` in
``$JOBS_FAULTS_LOG_DIR``, written, flushed and fsynced, so the line survives a SIGKILL that
lands right after it and the checker sees every hand-off. It never touches the database:
the database is down at times, and a handler that needed it would turn a database fault
into a handler failure, which is not what the suite measures.

Payload ``{"sleep": s}`` makes a handler take time (long-lane rows, so a lease can lapse
while one runs).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from django.apps import AppConfig

if TYPE_CHECKING:
    from jobs_engine.job import Job

LOG_DIR_ENV = "JOBS_FAULTS_LOG_DIR"

FAST_AT_MOST_ONCE = "faults:fast-am"
FAST_AT_LEAST_ONCE = "faults:fast-al"
LONG_AT_MOST_ONCE = "faults:long-am"
LONG_AT_LEAST_ONCE = "faults:long-al"
NAMES = (FAST_AT_MOST_ONCE, FAST_AT_LEAST_ONCE, LONG_AT_MOST_ONCE, LONG_AT_LEAST_ONCE)


def delivery_line(job_id: int, target: str, key: str | None, version: int, pid: int,
                  at: float) -> str:
    """The one line a delivery writes (``checker.read_deliveries`` parses it)."""
    return f"deliver {job_id} {target} {key or '-'} {version} {pid} {at:.6f}\n"


def deliver(job: Job) -> None:
    """Record the hand-off durably, then take the payload's time."""
    pid = os.getpid()
    line = delivery_line(job.id, job.target, job.key, job.version, pid, time.time())
    path = Path(os.environ[LOG_DIR_ENV]) / f"{pid}.log"
    with open(path, "a") as fh:  # O_APPEND: lines of long-lane threads never interleave
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())
    sleep = (job.payload or {}).get("sleep", 0) if isinstance(job.payload, dict) else 0
    if sleep:
        time.sleep(float(sleep))


def register() -> None:
    """Register the four targets (idempotent), and the limits scenario's when
    ``$JOBS_FAULTS_LIMITS`` asks for them (``limits_targets``)."""
    from jobs_engine import DeliveryMode, Lane, register_target
    from jobs_engine.registry import all_targets
    from tests.faults import limits_targets

    limits_targets.register()
    if FAST_AT_MOST_ONCE in {t.name for t in all_targets()}:
        return
    register_target(FAST_AT_MOST_ONCE, deliver, lane=Lane.FAST,
                    delivery_mode=DeliveryMode.AT_MOST_ONCE)
    register_target(FAST_AT_LEAST_ONCE, deliver, lane=Lane.FAST,
                    delivery_mode=DeliveryMode.AT_LEAST_ONCE)
    register_target(LONG_AT_MOST_ONCE, deliver, lane=Lane.LONG,
                    delivery_mode=DeliveryMode.AT_MOST_ONCE)
    register_target(LONG_AT_LEAST_ONCE, deliver, lane=Lane.LONG,
                    delivery_mode=DeliveryMode.AT_LEAST_ONCE)


class FaultTargetsConfig(AppConfig):
    """Installed only by ``tests.faults.settings``: the fault suite's targets."""

    name = "tests.faults"
    label = "faults_targets"
    verbose_name = "Fault-suite targets"

    def ready(self) -> None:
        register()
