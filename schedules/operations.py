"""Operator actions on schedules, shared by the Django admin and the JSON API.

Each action calls ``schedules.services`` and writes an ``AuditRecord`` (through
``jobs_engine.operations.audit``) in the same transaction: who, when, what, on which
schedule, and whether it was done or refused. A refusal is audited, then raised as an
``OperationRefused`` the API already answers in its one error shape: 404 ``not_found``
(unknown or malformed code), 400 ``invalid_cron`` (a bad override; nothing changed) and
409 ``invalid_status`` (run now of a row no code declares any more).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo

from django.db import transaction

from jobs_engine.enqueueing import EnqueueResult
from jobs_engine.operations import Actor, InvalidStatus, OperationRefused, audit
from schedules import services
from schedules.cron import load_zone, parse_cron
from schedules.declarations import MAX_CODE_LENGTH, get_declaration
from schedules.errors import InvalidCron, ScheduleNotFound
from schedules.models import Schedule

logger = logging.getLogger("jobs_engine.schedules")

SCHEDULE = "schedule"
ENABLE, DISABLE, OVERRIDE, CLEAR_OVERRIDE, RUN_NOW = (
    "enable", "disable", "set_override", "clear_override", "run_now")
_CODE = re.compile(r"^[A-Za-z0-9_.-]+$")  # what ``declare()`` accepts

class ScheduleMissing(OperationRefused):
    """No schedule has this code (API: 404 ``not_found``)."""

    code = "not_found"
    status_code = 404

    def __init__(self, code: Any) -> None:
        super().__init__(f"schedule {str(code)[:120]!r} does not exist")
        self.schedule_code = code


class CronRefused(OperationRefused):
    """A cron override that cannot be used (API: 400 ``invalid_cron``); nothing changed."""

    code = "invalid_cron"
    status_code = 400

    def __init__(self, exc: InvalidCron) -> None:
        field = "cron_override" if exc.field == "cron" else exc.field
        text = exc.cron if isinstance(exc.cron, str) else repr(exc.cron)
        shown = text if len(text) <= 80 else text[:80] + "…"
        super().__init__(f"{field} {shown!r}: {exc.problem}")
        self.problem = exc.problem


def check_code(raw: Any) -> str:
    """A code as ``declare()`` accepts it; anything else names no row (404), and never
    reaches the database (PostgreSQL text refuses a NUL)."""
    text = raw if isinstance(raw, str) else str(raw)
    if not _CODE.match(text) or len(text) > MAX_CODE_LENGTH:
        raise ScheduleMissing(raw)
    return text


def check_cron(cron: Any, schedule: Schedule) -> str:
    """``cron`` validated in the schedule's zone, normalised as it would be stored;
    ``CronRefused`` names the problem. Audits nothing (the admin form validates first)."""
    try:
        return parse_cron(cron, schedule.timezone).expression
    except InvalidCron as exc:
        raise CronRefused(exc) from None


def _act[T](action: str, raw_code: Any, actor: Any,
             attempt: Callable[[str], tuple[T, str]]) -> T:
    """Run ``attempt(code)`` and its audit record in one transaction; ``attempt`` returns
    (result, audit message). Refusals are audited (outside the failed transaction), then
    raised."""
    refused: OperationRefused | None = None
    try:
        code = check_code(raw_code)
        with transaction.atomic():
            result, message = attempt(code)
            audit(actor, action, SCHEDULE, code, ok=True, message=message)
    except ScheduleNotFound:
        refused = ScheduleMissing(raw_code)
    except InvalidCron as exc:
        refused = CronRefused(exc)
    except OperationRefused as exc:
        refused = exc
    if refused is not None:
        audit(actor, action, SCHEDULE, raw_code, ok=False, message=refused.message)
        raise refused
    logger.info("schedule %s code=%s by=%s %s", action, code, Actor.of(actor).username,
                message)
    return result


def next_run_text(row: Schedule) -> str:
    """The next slot as the audit trail and messages show it: in the schedule's zone."""
    return local_text(row.next_run_at, row.timezone)


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


# -- the actions ---------------------------------------------------------------------------


def enable(code: Any, actor: Any) -> Schedule:
    """Enable (a no-op on an enabled row, still audited); slots missed while disabled are
    dropped: the next slot is the first after now."""
    def attempt(code: str) -> tuple[Schedule, str]:
        was = services.get_schedule(code).enabled
        row = services.enable(code)
        note = "already enabled; " if was else ""
        return row, f"{note}next run {next_run_text(row)}"

    return _act(ENABLE, code, actor, attempt)


def disable(code: Any, actor: Any) -> Schedule:
    """Disable: no new slots; a slot already enqueued still runs."""
    def attempt(code: str) -> tuple[Schedule, str]:
        was = services.get_schedule(code).enabled
        row = services.disable(code)
        return row, "" if was else "already disabled"

    return _act(DISABLE, code, actor, attempt)


def set_cron_override(code: Any, cron: Any, actor: Any) -> Schedule:
    """Run on ``cron`` (read in the schedule's zone) instead of the declared cron. A bad
    cron is ``CronRefused`` naming the problem, and changes nothing."""
    def attempt(code: str) -> tuple[Schedule, str]:
        row = services.set_cron_override(code, cron)
        return row, f"cron_override {row.cron_override!r}; next run {next_run_text(row)}"

    return _act(OVERRIDE, code, actor, attempt)


def clear_cron_override(code: Any, actor: Any) -> Schedule:
    """Back to the declared cron (a no-op on a row without override, still audited)."""
    def attempt(code: str) -> tuple[Schedule, str]:
        was = services.get_schedule(code).cron_override
        row = services.clear_cron_override(code)
        before = f"was {was!r}" if was else "had no override"
        return row, f"{before}; next run {next_run_text(row)}"

    return _act(CLEAR_OVERRIDE, code, actor, attempt)


def run_now(code: Any, actor: Any) -> EnqueueResult:
    """One extra run for the current second. A second request within the same second
    inserts nothing (``inserted`` False). A row whose schedule no code declares any more
    (left by an earlier deployment) cannot run: ``InvalidStatus``."""
    def attempt(code: str) -> tuple[EnqueueResult, str]:
        services.get_schedule(code)
        if get_declaration(code) is None:
            raise InvalidStatus(f"schedule {code!r} is not declared in this deployment's "
                                "code (a row left by an earlier one); run now needs a "
                                "declared schedule")
        result = services.run_now(code)
        if result.inserted:
            return result, f"job {result.job_id} enqueued"
        return result, "already requested within this second; no new job"

    return _act(RUN_NOW, code, actor, attempt)

