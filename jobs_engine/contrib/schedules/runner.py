"""A slot's run on the long lane: the late-start check, then the declared handler.

A slot whose first run starts more than ``GRACE_S`` after its slot time (it waited behind
a previous run of the same code, a busy or paused lane, or workers that were down):

- policy ``skip``: the slot is skipped, with the real reason (``previous slot still
  running`` only when a run of this code ended after the slot's grace; otherwise ``late by
  Ns at start``);
- policy ``run_once``: skipped only when a newer slot of the code is PENDING, else it runs.

Retries of a slot (``job.attempts > 0``) and run-now jobs always run. The row records the
newest slot that started (``last_run_at``) and when a run last ended (``last_finished_at``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from jobs_engine import store
from jobs_engine.conf import jobs_settings
from jobs_engine.contrib.schedules.cron import load_zone
from jobs_engine.contrib.schedules.declarations import (
    Declaration,
    MissedSlotPolicy,
    get_declaration,
    slot_iso,
    target_name,
)
from jobs_engine.contrib.schedules.history import (
    record_run_finished,
    record_run_started,
    record_skip,
)
from jobs_engine.contrib.schedules.models import Schedule
from jobs_engine.errors import DeadNow
from jobs_engine.job import Job
from jobs_engine.models import Job as JobTable
from jobs_engine.states import JobStatus

logger = logging.getLogger("jobs_engine.schedules")

# The decision time of a run (the database clock); tests that drive the long lane with a
# fixed ``now`` point this at their clock.
clock: Callable[[], datetime] = store.db_now


def parse_slot(job: Job) -> tuple[datetime, bool]:
    """(slot time, run-now?) from the job's payload; ``DeadNow`` when unreadable."""
    payload = job.payload if isinstance(job.payload, dict) else {}
    try:
        slot = datetime.fromisoformat(payload["slot"])
    except (KeyError, TypeError, ValueError):
        raise DeadNow(f"schedule job payload has no valid 'slot': {job.payload!r}") from None
    if slot.tzinfo is None:
        raise DeadNow(f"schedule job slot {payload['slot']!r} has no time zone")
    return slot, bool(payload.get("run_now"))


def run_slot(code: str, job: Job, now: datetime | None = None) -> Any:
    """The handler of target ``schedule:<code>``; returns what the declared handler returned
    (kept with the completed job)."""
    declaration = get_declaration(code)
    if declaration is None:
        raise DeadNow(f"schedule {code!r} is not declared in this process")
    slot, run_now = parse_slot(job)
    now = now or clock()
    if job.attempts == 0 and not run_now:
        late_s = (now - slot).total_seconds()
        if late_s > jobs_settings().GRACE_S:
            reason = _late_start_reason(declaration, job, slot, late_s)
            if reason is not None:
                record_skip(code, slot, reason, now)
                logger.warning("schedule slot skipped code=%s slot=%s reason=%s", code,
                               slot_iso(slot), reason)
                return {"skipped": reason}
    record_run_started(code, slot, now)
    try:
        return declaration.handler(slot.astimezone(load_zone(declaration.timezone)), job)
    finally:
        record_run_finished(code, clock())


def _late_start_reason(declaration: Declaration, job: Job, slot: datetime, late_s: float
                       ) -> str | None:
    """Why a late first run is skipped, or None when it runs anyway."""
    if declaration.missed_slot_policy is MissedSlotPolicy.RUN_ONCE:
        newer = _newer_pending_slot(declaration.code, job.id, slot)
        if newer is None:
            return None
        return f"newer slot {slot_iso(newer)} pending (this slot started {late_s:.0f}s late)"
    finished = Schedule.objects.filter(code=declaration.code).values_list(
        "last_finished_at", flat=True).first()
    grace = timedelta(seconds=jobs_settings().GRACE_S)
    if finished is not None and finished > slot + grace:
        held_s = (finished - slot).total_seconds()
        return f"previous slot still running (a run of this schedule ended {held_s:.0f}s " \
               "after this slot)"
    return f"late by {late_s:.0f}s at start (long lane busy or paused, or no long-lane worker)"


def _newer_pending_slot(code: str, job_id: int | None, slot: datetime) -> datetime | None:
    pending = JobTable.objects.filter(target=target_name(code), status=JobStatus.PENDING)
    if job_id is not None:  # exclude(id=None) would exclude no row either
        pending = pending.exclude(id=job_id)
    payloads = pending.values_list("payload", flat=True)
    newer = []
    for payload in payloads:
        if not isinstance(payload, dict) or payload.get("run_now"):
            continue
        try:
            other = datetime.fromisoformat(payload["slot"])
        except (KeyError, TypeError, ValueError):
            continue
        if other.tzinfo is not None and other > slot:
            newer.append(other)
    return max(newer, default=None)
