"""Admin operations on schedules (Django admin and the API call these).

Each takes the decision time ``now`` (the database clock when omitted) and raises
``ScheduleNotFound`` for an unknown code and ``InvalidCron`` for a bad override; a bad
request changes nothing.
"""

from __future__ import annotations

from datetime import datetime

from jobs_engine import store
from jobs_engine.enqueueing import EnqueueResult, enqueue
from schedules.cron import cron_spec, parse_cron
from schedules.declarations import slot_iso, target_name
from schedules.errors import ScheduleNotFound
from schedules.models import Schedule
from schedules.sync import row_spec


def list_schedules() -> list[Schedule]:
    return list(Schedule.objects.order_by("code"))


def get_schedule(code: str) -> Schedule:
    row = Schedule.objects.filter(code=code).first()
    if row is None:
        raise ScheduleNotFound(code)
    return row


def enable(code: str, now: datetime | None = None) -> Schedule:
    """Enable; coming from disabled, the next slot is the first one after now, so slots
    missed while disabled are dropped."""
    row = get_schedule(code)
    if not row.enabled:
        now = now or store.db_now()
        next_run_at = row_spec(row).next_after(now)
        Schedule.objects.filter(pk=row.pk, enabled=False).update(
            enabled=True, next_run_at=next_run_at, updated_at=now)
    return get_schedule(code)


def disable(code: str, now: datetime | None = None) -> Schedule:
    """Disable: the tick makes no new slots; a slot already enqueued still runs."""
    row = get_schedule(code)
    if row.enabled:
        Schedule.objects.filter(pk=row.pk).update(enabled=False,
                                                  updated_at=now or store.db_now())
    return get_schedule(code)


def set_cron_override(code: str, cron: str, now: datetime | None = None) -> Schedule:
    """Run the schedule on ``cron`` (read in its time zone) instead of the declared one;
    the next slot follows the override."""
    row = get_schedule(code)
    now = now or store.db_now()
    spec = parse_cron(cron, row.timezone, now=now)
    Schedule.objects.filter(pk=row.pk).update(cron_override=spec.expression,
                                              next_run_at=spec.next_after(now), updated_at=now)
    return get_schedule(code)


def clear_cron_override(code: str, now: datetime | None = None) -> Schedule:
    """Back to the declared cron; the next slot follows it."""
    row = get_schedule(code)
    now = now or store.db_now()
    next_run_at = cron_spec(row.cron, row.timezone).next_after(now)
    Schedule.objects.filter(pk=row.pk).update(cron_override=None, next_run_at=next_run_at,
                                              updated_at=now)
    return get_schedule(code)


def run_now(code: str, now: datetime | None = None) -> EnqueueResult:
    """One extra run for the current time (to the second), besides the regular slots.

    Its dedupe key ``<code>:run-now:<time>`` makes a repeated request within the same
    second a no-op. It waits like any slot while another run of the code is RUNNING, and
    it is never skipped as late.
    """
    get_schedule(code)
    slot = (now or store.db_now()).replace(microsecond=0)
    return enqueue(target_name(code), {"slot": slot_iso(slot), "run_now": True}, code=code,
                   dedupe_key=f"{code}:run-now:{slot_iso(slot)}")
