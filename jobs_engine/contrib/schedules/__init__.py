"""Cron schedules declared in code; each slot becomes one long-lane job.

``declare(code, cron, handler, *, timezone="UTC", missed_slot_policy=None, max_attempts=3)``
from an app's ``ready()``; see ``declarations.declare`` for the contract and ``cron`` for the
accepted cron syntax and the daylight-saving rules. The public names load lazily so
``import jobs_engine.contrib.schedules`` works before the app registry is ready.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_PUBLIC = {
    "declare": "jobs_engine.contrib.schedules.declarations",
    "declared": "jobs_engine.contrib.schedules.declarations",
    "MissedSlotPolicy": "jobs_engine.contrib.schedules.declarations",
    "InvalidCron": "jobs_engine.contrib.schedules.errors",
    "InvalidSchedule": "jobs_engine.contrib.schedules.errors",
    "DuplicateSchedule": "jobs_engine.contrib.schedules.errors",
    "ScheduleNotFound": "jobs_engine.contrib.schedules.errors",
    "sync_declared": "jobs_engine.contrib.schedules.sync",
}
# ``tick`` is not re-exported: ``.tick`` is the module of that name.

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
