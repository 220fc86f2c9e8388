"""Writes of a schedule row's run and skip history, each one conditional UPDATE.

"Newest wins": ``last_run_at`` and ``last_skipped_at`` only move forward, so a late
writer (a slow worker, a second tick) can never rewind what an admin sees.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Case, DateTimeField, F, Q, TextField, Value, When

from jobs_engine.contrib.schedules.models import Schedule

MAX_REASON_LENGTH = 500


def _not_newer(field: str, value: datetime) -> Q:
    return Q(**{f"{field}__isnull": True}) | Q(**{f"{field}__lte": value})


def skip_updates(slot: datetime, reason: str) -> dict[str, Any]:
    """Update arguments recording a skipped slot and its reason (reason follows the slot)."""
    newer = _not_newer("last_skipped_at", slot)
    return {
        "last_skipped_at": Case(When(newer, then=Value(slot)), default=F("last_skipped_at"),
                                output_field=DateTimeField()),
        "last_skip_reason": Case(When(newer, then=Value(reason[:MAX_REASON_LENGTH])),
                                 default=F("last_skip_reason"), output_field=TextField()),
    }


def record_skip(code: str, slot: datetime, reason: str, now: datetime) -> None:
    Schedule.objects.filter(code=code).update(updated_at=now, **skip_updates(slot, reason))


def record_run_started(code: str, slot: datetime, now: datetime) -> None:
    Schedule.objects.filter(code=code).filter(_not_newer("last_run_at", slot)).update(
        last_run_at=slot, updated_at=now)


def record_run_finished(code: str, now: datetime) -> None:
    Schedule.objects.filter(code=code).filter(_not_newer("last_finished_at", now)).update(
        last_finished_at=now, updated_at=now)
