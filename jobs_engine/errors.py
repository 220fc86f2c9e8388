"""Errors of the engine.

Handler outcomes (raised by a target's handler to steer what happens to the row) and
caller errors (raised at enqueue or registration, before anything is written).
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


class JobsEngineError(Exception):
    """Base of every error the engine raises on purpose."""


# -- handler outcomes -------------------------------------------------------------


class TargetUnreachable(JobsEngineError):
    """Nothing reached the target: no attempt is spent, the target is paused."""


class TargetOutcomeUnknown(JobsEngineError):
    """The send may have landed with no answer.

    ``target_up=True`` says the target answered (e.g. "request timed out"), so an
    at-most-once row goes DEAD without pausing the target.
    """

    def __init__(self, message: str = "", *, target_up: bool = False) -> None:
        super().__init__(message)
        self.target_up = target_up


class DeadNow(JobsEngineError):
    """A resend can never succeed (e.g. the record is invalid): DEAD at once."""


# -- caller errors ----------------------------------------------------------------


class UnknownTarget(JobsEngineError, LookupError):
    def __init__(self, name: str) -> None:
        super().__init__(f"unknown_target: no target named {name!r} is registered")
        self.name = name


class DuplicateTarget(JobsEngineError, ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(f"duplicate_target: a target named {name!r} is already registered")
        self.name = name


class InvalidJob(JobsEngineError, ValueError):
    """A job or target definition is malformed; ``field`` names what is wrong."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"invalid_job: {field}: {problem}")
        self.field = field
        self.problem = problem


class InvalidSettings(JobsEngineError, ImproperlyConfigured):
    pass
