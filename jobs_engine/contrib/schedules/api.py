"""The schedules routes of the JSON API (``/api/v1/schedules``).

``SchedulesConfig.ready()`` attaches ``router`` to ``jobs_engine.operators.api.api``, so the engine
imports nothing of this app. Auth, CSRF, permission checks and the error shape are the
API's own (see ``jobs_engine.operators.api``); every action goes through this app's
``operations``, which writes the audit record. Errors: 404 ``not_found`` for an unknown or
malformed code, 400 ``invalid_cron`` for a bad override (nothing changed), 400
``validation_error`` for a query parameter, a body field no route uses or a body sent to a
route that takes none, 409 ``invalid_status`` for run now of a row no code declares. Every
route is bound to the caller's tenant: another tenant's schedule is not listed and answers
404, as an unknown code.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from django.http import HttpRequest
from ninja import Field, Path, Router, Schema

from jobs_engine.contrib.schedules import operations
from jobs_engine.contrib.schedules.declarations import MAX_CODE_LENGTH
from jobs_engine.contrib.schedules.models import Schedule
from jobs_engine.operators.api import BodyIn, errors
from jobs_engine.tenancy import tenant_of


class ScheduleOut(Schema):
    code: str
    cron: str = Field(description="Declared in code; read in `timezone`.")
    cron_override: str | None = Field(description="Set by an operator; replaces `cron`.")
    effective_cron: str = Field(description="The cron the schedule runs on now.")
    timezone: str = Field(description="IANA zone the cron fields are read in.")
    enabled: bool
    missed_slot_policy: str
    max_attempts: int
    next_run_at: datetime | None = Field(description="The next slot, in UTC.")
    next_run_local: datetime | None = Field(
        description="The same instant in the schedule's zone (ISO 8601 with its offset).")
    last_run_at: datetime | None
    last_finished_at: datetime | None
    last_skipped_at: datetime | None
    last_skip_reason: str
    tenant_id: str | None = Field(description="The tenant it belongs to; null: none.")
    updated_at: datetime


class ScheduleList(Schema):
    data: list[ScheduleOut] = Field(description="Every schedule, sorted by code.")


class CronOverrideIn(BodyIn):
    cron_override: str = Field(description="A cron expression read in the schedule's zone "
                                           "(5 fields, or 6 with seconds first).",
                               examples=["*/10 * * * *"])


class RunNowOut(Schema):
    code: str
    inserted: bool = Field(description="False when a run was already requested within the "
                                       "same second (no second job).")
    job_id: int | None


Code = Annotated[str, Path(max_length=MAX_CODE_LENGTH, description="The schedule's code.")]


def _utc(moment: datetime | None) -> datetime | None:
    return None if moment is None else moment.astimezone(UTC)


def schedule_out(row: Schedule) -> dict[str, Any]:
    return {
        "code": row.code, "cron": row.cron, "cron_override": row.cron_override,
        "effective_cron": row.effective_cron, "timezone": row.timezone,
        "enabled": row.enabled, "missed_slot_policy": row.missed_slot_policy,
        "max_attempts": row.max_attempts, "next_run_at": _utc(row.next_run_at),
        "next_run_local": operations.in_zone(row.next_run_at, row.timezone),
        "last_run_at": _utc(row.last_run_at), "last_finished_at": _utc(row.last_finished_at),
        "last_skipped_at": _utc(row.last_skipped_at), "last_skip_reason": row.last_skip_reason,
        "tenant_id": row.tenant_id, "updated_at": _utc(row.updated_at),
    }


router = Router(tags=["schedules"])


@router.get("", response={200: ScheduleList, **errors(400)}, summary="List schedules")
def list_schedules(request: HttpRequest) -> dict[str, Any]:
    """Every schedule row, sorted by code; next run in UTC and in the schedule's zone.
    Query parameters are refused (there are no filters)."""
    return {"data": [schedule_out(row)
                     for row in operations.list_schedules(tenant_of(request))]}


@router.post("/{code}/enable", response={200: ScheduleOut, **errors(404, 413)},
             summary="Enable a schedule")
def enable(request: HttpRequest, code: Code) -> dict[str, Any]:
    """The next slot is the first after now (slots missed while disabled are dropped)."""
    return schedule_out(operations.enable(code, request.user, scope=tenant_of(request)))


@router.post("/{code}/disable", response={200: ScheduleOut, **errors(404, 413)},
             summary="Disable a schedule")
def disable(request: HttpRequest, code: Code) -> dict[str, Any]:
    """No new slots; a slot already enqueued still runs."""
    return schedule_out(operations.disable(code, request.user, scope=tenant_of(request)))


@router.post("/{code}/run", response={200: RunNowOut, **errors(404, 409, 413)},
             summary="Run a schedule now, once")
def run_now(request: HttpRequest, code: Code) -> dict[str, Any]:
    """One extra job for the current second, besides the regular slots."""
    result = operations.run_now(code, request.user, scope=tenant_of(request))
    return {"code": code, "inserted": result.inserted, "job_id": result.job_id}


@router.put("/{code}/cron_override",
            response={200: ScheduleOut, **errors(400, 404, 413, 415)},
            summary="Set the cron override")
def set_cron_override(request: HttpRequest, code: Code, body: CronOverrideIn
                      ) -> dict[str, Any]:
    """A bad cron answers 400 ``invalid_cron`` naming the problem; nothing changes."""
    return schedule_out(operations.set_cron_override(code, body.cron_override, request.user,
                                                     scope=tenant_of(request)))


@router.delete("/{code}/cron_override", response={200: ScheduleOut, **errors(404, 413)},
               summary="Clear the cron override")
def clear_cron_override(request: HttpRequest, code: Code) -> dict[str, Any]:
    """Back to the declared cron; the next slot follows it."""
    return schedule_out(operations.clear_cron_override(code, request.user,
                                                       scope=tenant_of(request)))


_attached: list[bool] = []


def attach() -> None:
    """Add the routes to the engine's API, once (before its URLs are first built)."""
    from jobs_engine.operators.api import api

    if not _attached:
        api.add_router("/schedules", router)
        _attached.append(True)
