"""Errors of the schedules app; each carries the API error ``code`` it maps to."""

from __future__ import annotations

from jobs_engine.errors import JobsEngineError


class ScheduleError(JobsEngineError):
    """Base of the schedules errors; ``code`` is the API error code."""

    code = "schedule_error"


class InvalidCron(ScheduleError, ValueError):
    """A cron expression or time zone that cannot be used (API: 400 ``invalid_cron``)."""

    code = "invalid_cron"

    def __init__(self, cron: object, problem: str, *, field: str = "cron") -> None:
        super().__init__(f"invalid_cron: {field} {cron!r}: {problem}")
        self.cron = cron
        self.field = field
        self.problem = problem


class InvalidSchedule(ScheduleError, ValueError):
    """A ``declare()`` argument other than the cron or time zone is wrong."""

    code = "invalid_schedule"

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"invalid_schedule: {field}: {problem}")
        self.field = field
        self.problem = problem


class DuplicateSchedule(ScheduleError, ValueError):
    code = "duplicate_schedule"

    def __init__(self, code: str) -> None:
        super().__init__(f"duplicate_schedule: a schedule {code!r} is already declared")
        self.schedule_code = code


class ScheduleNotFound(ScheduleError, LookupError):
    """No schedule row with that code (API: 404 ``not_found``)."""

    code = "not_found"

    def __init__(self, code: str) -> None:
        super().__init__(f"not_found: no schedule {code!r}")
        self.schedule_code = code
