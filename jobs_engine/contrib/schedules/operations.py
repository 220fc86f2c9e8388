"""Operator actions on schedules, for the Django admin, the JSON API and code.

Each action runs through the engine's ``act``: one change and its ``AuditRecord`` (who,
when, what, on which schedule, done or refused) in one transaction. It takes the decision
time ``now`` (the database clock when omitted) and refuses with ``ScheduleNotFound`` (404,
also for a malformed code), ``InvalidCron`` (400 ``invalid_cron``, a bad override) or
``InvalidStatus`` (409, run now of a row no code declares any more); a refusal changes
nothing. Each takes the caller's ``scope`` (``tenancy``): a schedule of another tenant is
not found, exactly as an unknown code.
"""

from __future__ import annotations

from datetime import UTC, datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo

from jobs_engine import store
from jobs_engine.contrib.schedules.cron import cron_spec, load_zone, parse_cron
from jobs_engine.contrib.schedules.declarations import (
    CODE,
    MAX_CODE_LENGTH,
    get_declaration,
    slot_iso,
    target_name,
)
from jobs_engine.contrib.schedules.errors import InvalidCron, ScheduleNotFound
from jobs_engine.contrib.schedules.models import Schedule
from jobs_engine.contrib.schedules.sync import row_spec
from jobs_engine.enqueueing import EnqueueResult, enqueue
from jobs_engine.errors import InvalidStatus
from jobs_engine.operators.actions import act
from jobs_engine.tenancy import PLATFORM, Scope, scoped

SCHEDULE = "schedule"
ENABLE, DISABLE, OVERRIDE, CLEAR_OVERRIDE, RUN_NOW = (
    "enable", "disable", "set_override", "clear_override", "run_now")


def check_code(raw: Any) -> str:
    """A code as ``declare()`` accepts it; anything else names no row (404), and never
    reaches the database (PostgreSQL text refuses a NUL)."""
    text = raw if isinstance(raw, str) else str(raw)
    if not CODE.fullmatch(text) or len(text) > MAX_CODE_LENGTH:
        raise ScheduleNotFound(raw)
    return text


def get_schedule(code: Any, scope: Scope = PLATFORM) -> Schedule:
    row = scoped(Schedule.objects.filter(code=check_code(code)), scope).first()
    if row is None:
        raise ScheduleNotFound(code)
    return row


def list_schedules(scope: Scope = PLATFORM) -> list[Schedule]:
    return list(scoped(Schedule.objects.order_by("code"), scope))


def check_cron(cron: Any, schedule: Schedule) -> str:
    """``cron`` as an override of ``schedule``: validated in its zone and normalised as it
    would be stored; ``InvalidCron`` names the problem. Audits nothing (the admin form
    validates before it acts)."""
    try:
        return parse_cron(cron, schedule.timezone).expression
    except InvalidCron as exc:
        raise exc.for_field("cron_override") from None


# -- time in the schedule's zone ----------------------------------------------------------


def zone_of(name: str) -> ZoneInfo | timezone:
    """The schedule's zone; UTC when the stored name cannot be read (the sync repairs it)."""
    try:
        return load_zone(name)
    except InvalidCron:
        return UTC


def in_zone(moment: datetime | None, zone_name: str) -> datetime | None:
    """``moment`` as an aware datetime in the schedule's zone."""
    return None if moment is None else moment.astimezone(zone_of(zone_name))


def local_text(moment: datetime | None, zone_name: str) -> str:
    """``moment`` as wall time in the schedule's zone with its abbreviation."""
    local = in_zone(moment, zone_name)
    return "-" if local is None else local.strftime("%Y-%m-%d %H:%M:%S %Z")


def next_run_text(row: Schedule) -> str:
    """The next slot as the audit trail and messages show it: in the schedule's zone."""
    return local_text(row.next_run_at, row.timezone)


# -- the actions --------------------------------------------------------------------------


def enable(code: Any, actor: Any = None, now: datetime | None = None, *,
           scope: Scope = PLATFORM) -> Schedule:
    """Enable (a no-op on an enabled row, still audited); slots missed while disabled are
    dropped: the next slot is the first after now."""
    return _set_enabled(ENABLE, code, True, actor, now, scope)


def disable(code: Any, actor: Any = None, now: datetime | None = None, *,
            scope: Scope = PLATFORM) -> Schedule:
    """Disable: the tick makes no new slots; a slot already enqueued still runs."""
    return _set_enabled(DISABLE, code, False, actor, now, scope)


def _set_enabled(action: str, code: Any, enabled: bool, actor: Any, now: datetime | None,
                 scope: Scope) -> Schedule:
    def attempt(code: str) -> tuple[Schedule, str]:
        row = get_schedule(code, scope)
        if row.enabled == enabled:
            state = "enabled" if enabled else "disabled"
            return row, f"already {state}" + (f"; next run {next_run_text(row)}" if enabled
                                              else "")
        when = now or store.db_now()
        changes: dict[str, Any] = {"enabled": enabled, "updated_at": when}
        if enabled:  # the first slot after now: the ones missed while disabled are dropped
            changes["next_run_at"] = row_spec(row).next_after(when)
        Schedule.objects.filter(pk=row.pk, enabled=not enabled).update(**changes)
        row = get_schedule(code, scope)
        return row, f"next run {next_run_text(row)}" if enabled else ""

    return act(action, SCHEDULE, code, actor, check_code, attempt, scope=scope)


def set_cron_override(code: Any, cron: Any, actor: Any = None,
                      now: datetime | None = None, *, scope: Scope = PLATFORM) -> Schedule:
    """Run on ``cron`` (read in the schedule's zone) instead of the declared cron; the next
    slot follows it. A bad cron is ``InvalidCron`` naming the problem, and changes nothing."""
    def attempt(code: str) -> tuple[Schedule, str]:
        row = get_schedule(code, scope)
        when = now or store.db_now()
        try:
            spec = parse_cron(cron, row.timezone, now=when)
        except InvalidCron as exc:
            raise exc.for_field("cron_override") from None
        Schedule.objects.filter(pk=row.pk).update(
            cron_override=spec.expression, next_run_at=spec.next_after(when), updated_at=when)
        row = get_schedule(code, scope)
        return row, f"cron_override {row.cron_override!r}; next run {next_run_text(row)}"

    return act(OVERRIDE, SCHEDULE, code, actor, check_code, attempt, scope=scope)


def clear_cron_override(code: Any, actor: Any = None, now: datetime | None = None, *,
                        scope: Scope = PLATFORM) -> Schedule:
    """Back to the declared cron (a no-op on a row without override, still audited)."""
    def attempt(code: str) -> tuple[Schedule, str]:
        row = get_schedule(code, scope)
        was = row.cron_override
        when = now or store.db_now()
        Schedule.objects.filter(pk=row.pk).update(
            cron_override=None, next_run_at=cron_spec(row.cron, row.timezone).next_after(when),
            updated_at=when)
        row = get_schedule(code, scope)
        before = f"was {was!r}" if was else "had no override"
        return row, f"{before}; next run {next_run_text(row)}"

    return act(CLEAR_OVERRIDE, SCHEDULE, code, actor, check_code, attempt, scope=scope)


def run_now(code: Any, actor: Any = None, now: datetime | None = None, *,
            scope: Scope = PLATFORM) -> EnqueueResult:
    """One extra run for the current time (to the second), besides the regular slots.

    Its dedupe key ``<code>:run-now:<time>`` makes a repeated request within the same
    second a no-op (``inserted`` False). It waits like any slot while another run of the
    code is RUNNING, and it is never skipped as late. A row whose schedule no code declares
    any more (left by an earlier deployment) cannot run: ``InvalidStatus``.
    """
    def attempt(code: str) -> tuple[EnqueueResult, str]:
        row = get_schedule(code, scope)
        if get_declaration(code) is None:
            raise InvalidStatus(f"schedule {code!r} is not declared in this deployment's "
                                "code (a row left by an earlier one); run now needs a "
                                "declared schedule")
        slot = (now or store.db_now()).replace(microsecond=0)
        result = enqueue(target_name(code), {"slot": slot_iso(slot), "run_now": True},
                         code=code, dedupe_key=f"{code}:run-now:{slot_iso(slot)}",
                         tenant_id=row.tenant_id or PLATFORM)
        if result.inserted:
            return result, f"job {result.job_id} enqueued"
        return result, "already requested within this second; no new job"

    return act(RUN_NOW, SCHEDULE, code, actor, check_code, attempt, scope=scope)
