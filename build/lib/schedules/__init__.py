"""Cron schedules declared in code; each slot becomes one long-lane job.

``declare(code, cron, handler, *, timezone="UTC", missed_slot_policy=None, max_attempts=3)``
from an app's ``ready()``; see ``schedules.declarations.declare`` for the contract and
``schedules.cron`` for the accepted cron syntax and the daylight-saving rules. The public
names load lazily so ``import schedules`` works before the app registry is ready.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_PUBLIC = {
    "declare": "schedules.declarations",
    "declared": "schedules.declarations",
    "MissedSlotPolicy": "schedules.declarations",
    "InvalidCron": "schedules.errors",
    "InvalidSchedule": "schedules.errors",
    "DuplicateSchedule": "schedules.errors",
    "ScheduleNotFound": "schedules.errors",
    "sync_declared": "schedules.sync",
}
# ``tick`` is not re-exported: ``schedules.tick`` is the module of that name.

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'schedules' has no attribute {name!r}")
