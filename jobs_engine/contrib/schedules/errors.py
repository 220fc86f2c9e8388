"""Errors of the schedules app, in the engine's one family (``jobs_engine.errors``)."""

from __future__ import annotations

from typing import Any

from jobs_engine.errors import JobsEngineError, NotFound, OperationRefused


class InvalidCron(OperationRefused, ValueError):
    """A cron expression or time zone that cannot be used: refused by ``declare()`` at
    start-up, and by a cron override (API: 400 ``invalid_cron``), changing nothing."""

    code = "invalid_cron"

    def __init__(self, cron: object, problem: str, *, field: str = "cron") -> None:
        text = cron if isinstance(cron, str) else repr(cron)
        shown = text if len(text) <= 80 else text[:80] + "…"
        super().__init__(f"{field} {shown!r}: {problem}")
        self.cron = cron
        self.field = field
        self.problem = problem

    def for_field(self, field: str) -> InvalidCron:
        """The same refusal, naming the field the caller knows (an override, say)."""
        return InvalidCron(self.cron, self.problem, field=field)


class InvalidSchedule(JobsEngineError, ValueError):
    """A ``declare()`` argument other than the cron or time zone is wrong."""

    code = "invalid_schedule"

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"invalid_schedule: {field}: {problem}")
        self.field = field
        self.problem = problem


class DuplicateSchedule(JobsEngineError, ValueError):
    code = "duplicate_schedule"

    def __init__(self, code: str) -> None:
        super().__init__(f"duplicate_schedule: a schedule {code!r} is already declared")
        self.schedule_code = code


class ScheduleNotFound(NotFound):
    """No schedule row has this code (malformed codes included): 404 ``not_found``."""

    def __init__(self, code: Any) -> None:
        super().__init__(f"schedule {str(code)[:120]!r} does not exist")
        self.schedule_code = code
