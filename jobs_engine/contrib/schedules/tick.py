"""The tick: each due slot of an enabled schedule becomes one long-lane job.

Every worker that runs the schedules lane (``tick_schedules``, ``run_workers``) ticks; they
agree through the database. A row's ``next_run_at`` advance is one UPDATE guarded on its
old value, in the same transaction as the job insert: of two ticks that read the same due
row, one advances it and enqueues, the other changes nothing. The job's dedupe key
``<code>:<slot ISO>`` is a second lock on the same door.

Missed slots (workers were down, or the tick ran late): the newest slot due stands for all
of them. Policy ``skip`` enqueues nothing when that slot is later than ``GRACE_S``;
otherwise the newest slot is enqueued once and the older ones are recorded as skipped.
Every skip lands in ``last_skipped_at`` / ``last_skip_reason``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import Min

from jobs_engine import store
from jobs_engine.conf import JobsSettings, jobs_settings
from jobs_engine.contrib.schedules.declarations import (
    MissedSlotPolicy,
    declared,
    slot_dedupe_key,
    slot_iso,
    target_name,
)
from jobs_engine.contrib.schedules.history import skip_updates
from jobs_engine.contrib.schedules.models import Schedule
from jobs_engine.contrib.schedules.sync import row_spec, sync_declared
from jobs_engine.enqueueing import enqueue
from jobs_engine.tenancy import PLATFORM

if TYPE_CHECKING:
    from jobs_engine.lanes.worker import WorkerProcess

logger = logging.getLogger("jobs_engine.schedules")

_SECOND = timedelta(seconds=1)


@dataclass
class TickReport:
    now: datetime
    enqueued: list[tuple[str, datetime]] = field(default_factory=list)
    skipped: list[tuple[str, datetime, str]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    next_due: datetime | None = None  # the earliest next slot after this tick


def tick(now: datetime | None = None, settings: JobsSettings | None = None) -> TickReport:
    """Turn every due slot of the schedules declared here into a job; one row's failure
    does not stop the others."""
    settings = settings or jobs_settings()
    now = now or store.db_now()
    report = TickReport(now)
    codes = list(declared())
    due = Schedule.objects.filter(enabled=True, next_run_at__lte=now, code__in=codes) \
        .order_by("next_run_at", "code")
    for row in due:
        try:
            _tick_row(row, now, settings, report)
        except Exception:
            logger.exception("schedule tick failed code=%s", row.code)
            report.failed.append(row.code)
    upcoming = Schedule.objects.filter(enabled=True, code__in=codes).exclude(
        code__in=report.failed).aggregate(next_due=Min("next_run_at"))
    report.next_due = upcoming["next_due"]
    return report


def _tick_row(row: Schedule, now: datetime, settings: JobsSettings, report: TickReport) -> None:
    spec = row_spec(row)
    due = row.next_run_at
    assert due is not None
    newest = max(spec.latest_at_or_before(now), due)
    late_s = (now - newest).total_seconds()
    policy = MissedSlotPolicy(row.missed_slot_policy)
    skip_late = policy is MissedSlotPolicy.SKIP and late_s > settings.GRACE_S
    updates: dict[str, Any] = {"next_run_at": spec.next_after(now), "updated_at": now}
    skipped: tuple[datetime, str] | None = None
    if skip_late:
        skipped = (newest, f"late by {late_s:.0f}s at tick (workers down?)")
    elif newest > due:
        older = max(spec.latest_at_or_before(newest - _SECOND), due)
        skipped = (older, f"missed: collapsed into the newer slot {slot_iso(newest)}")
    if skipped is not None:
        updates.update(skip_updates(*skipped))
    with transaction.atomic():
        won = Schedule.objects.filter(pk=row.pk, enabled=True, next_run_at=due).update(**updates)
        if not won:
            return  # another tick advanced this row (or an admin changed it) first
        result = None
        if not skip_late:
            result = enqueue(target_name(row.code), {"slot": slot_iso(newest)}, code=row.code,
                             dedupe_key=slot_dedupe_key(row.code, newest),
                             tenant_id=row.tenant_id or PLATFORM)
    if newest > due or late_s > settings.GRACE_S:
        logger.warning("schedule missed code=%s first_missed=%s newest=%s late_s=%.0f "
                       "policy=%s action=%s", row.code, slot_iso(due), slot_iso(newest), late_s,
                       policy.value, "skipped" if skip_late else "enqueued newest")
    if skipped is not None:
        report.skipped.append((row.code, *skipped))
    if result is not None:
        report.enqueued.append((row.code, newest))
        logger.info("schedule slot enqueued code=%s slot=%s job_id=%s inserted=%s", row.code,
                    slot_iso(newest), result.job_id, result.inserted)


class TickService:
    """The schedules lane of a worker process: sync once, then tick whenever a slot is
    due, at least every ``TICK_S``. Returns the seconds until it wants to run again (the
    worker loop may call it earlier; it then just answers the time left)."""

    MIN_DELAY_S = 0.01

    def __init__(self, settings: JobsSettings, *,
                 monotonic: Callable[[], float] = time.monotonic,
                 clock: Callable[[], datetime] = store.db_now) -> None:
        self.settings = settings
        self._monotonic = monotonic
        self._clock = clock
        self._synced = False
        self._next_at = 0.0

    def __call__(self) -> float:
        started = self._monotonic()
        if started < self._next_at:
            return self._next_at - started
        if not self._synced:
            sync_declared(self._clock())
            self._synced = True
        report = tick(self._clock(), self.settings)
        delay = self.settings.TICK_S
        if report.next_due is not None:
            delay = min(delay, max((report.next_due - report.now).total_seconds(),
                                   self.MIN_DELAY_S))
        self._next_at = started + delay
        if report.enqueued:
            return 0.0  # let this worker's long lane poll at once for the new job
        return max(self._next_at - self._monotonic(), 0.0)


def worker_service(worker: WorkerProcess) -> Callable[[], float]:
    """The factory this app registers with ``jobs_engine.lanes.worker.register_service``."""
    return TickService(worker.settings)
