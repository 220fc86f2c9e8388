"""Every error the engine raises on purpose derives from ``JobsEngineError``.

Four families, each named for the condition:

- caller errors, raised before anything is written: ``UnknownTarget``, ``DuplicateTarget``,
  ``InvalidJob``, ``InvalidPolicy``, ``InvalidLimit`` (and the schedules app's ``InvalidSchedule``,
  ``DuplicateSchedule``);
- handler outcomes, raised by a target's handler to steer its row: ``TargetUnreachable``,
  ``TargetOutcomeUnknown``, ``DeadNow``, ``RateLimited`` (the Kafka app's ``KafkaSendError`` is an
  answered failure; ``InvalidResult`` is the engine's verdict on a result it cannot store);
- refused operator actions, which changed nothing and carry the API's answer:
  ``OperationRefused`` and below it ``NotFound`` (``JobNotFound``, ``ScheduleNotFound``),
  ``InvalidStatus`` and the schedules app's ``InvalidCron``;
- configuration: ``InvalidSettings`` (also an ``ImproperlyConfigured``) and
  ``DatabaseNotReady``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from jobs_engine.text import clean


class JobsEngineError(Exception):
    """Base of every error the engine raises on purpose; ``code`` names the condition in
    one word, as the API's answers and the messages' prefixes do."""

    code = "error"


# -- caller errors ------------------------------------------------------------------------


class UnknownTarget(JobsEngineError, LookupError):
    """No target of that name is registered in this process; ``enqueue`` raises it before
    anything is written."""

    code = "unknown_target"

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown_target: no target named {name!r} is registered")
        self.name = name


class DuplicateTarget(JobsEngineError, ValueError):
    """``register_target`` was given a name that is already registered."""

    code = "duplicate_target"

    def __init__(self, name: str) -> None:
        super().__init__(f"duplicate_target: a target named {name!r} is already registered")
        self.name = name


class InvalidJob(JobsEngineError, ValueError):
    """A job or target definition is malformed; ``field`` names what is wrong."""

    code = "invalid_job"

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"invalid_job: {field}: {problem}")
        self.field = field
        self.problem = problem


class InvalidPolicy(JobsEngineError, ValueError):
    """A ``JobPolicy`` knob that cannot work; ``field`` names the knob."""

    code = "invalid_policy"

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"invalid_policy: {field}: {problem}")
        self.field = field
        self.problem = problem


class InvalidFlow(JobsEngineError, ValueError):
    """A chain, batch or flow definition is malformed; ``field`` names what is wrong
    (``steps[2].data``). Raised before anything is written."""

    code = "invalid_flow"

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"invalid_flow: {field}: {problem}")
        self.field = field
        self.problem = problem


class InvalidLimit(JobsEngineError, ValueError):
    """A ``Concurrency`` or ``Rate`` limit, or a target's list of them, that cannot work;
    ``field`` names the knob. Raised when the limit is built or the target registered."""

    code = "invalid_limit"

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"invalid_limit: {field}: {problem}")
        self.field = field
        self.problem = problem


# -- handler outcomes ---------------------------------------------------------------------


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


class RateLimited(JobsEngineError):
    """The downstream said "wait" (an HTTP 429, a quota error): the job keeps its place and
    its attempts, and its key takes no start for ``retry_after_s`` (the buckets of its
    target's limits are emptied that long; a job of a target without limits waits that
    long itself)."""

    MAX_RETRY_AFTER_S = 24 * 3600.0

    def __init__(self, message: str = "", *, retry_after_s: float = 1.0) -> None:
        if isinstance(retry_after_s, bool) or not isinstance(retry_after_s, int | float) \
                or not 0 <= retry_after_s <= self.MAX_RETRY_AFTER_S:  # NaN fails too
            raise InvalidLimit("retry_after_s", f"must be a number of seconds from 0 to "
                                                f"{self.MAX_RETRY_AFTER_S:,.0f}, got "
                                                f"{retry_after_s!r}")
        super().__init__(message or f"rate limited: retry after {retry_after_s:g} s")
        self.retry_after_s = float(retry_after_s)


class DeadNow(JobsEngineError):
    """A resend can never succeed (e.g. the record is invalid): DEAD at once."""


class WorkerLost(JobsEngineError):
    """Recorded, never raised: a try whose worker stopped answering (killed, stalled past its
    lease). It names such a try in a long-lane job's ``tries``."""


class InvalidResult(JobsEngineError):
    """A handler returned a value the engine cannot store as JSON: the handler's bug, so
    the try fails (and is retried by the target's policy) rather than losing the value."""


# -- refused operator actions -------------------------------------------------------------


class OperationRefused(JobsEngineError):
    """An operator action (admin or API) that changed nothing. ``status_code`` and
    ``code`` are what the API answers, ``messages`` the lines of its ``message``."""

    status_code = 400
    code = "validation_error"

    def __init__(self, message: str | Iterable[str], *, status_code: int | None = None,
                 code: str | None = None) -> None:
        self.messages = [message] if isinstance(message, str) else list(message)
        super().__init__("; ".join(self.messages))
        self.message = "; ".join(self.messages)
        if status_code is not None:
            self.status_code = status_code
        if code is not None:
            self.code = code


class NotFound(OperationRefused):
    """No row answers to the id or code given (malformed ones included)."""

    status_code = 404
    code = "not_found"


class JobNotFound(NotFound):
    def __init__(self, job_id: Any) -> None:
        super().__init__(f"job {clean(job_id, 40)} does not exist")
        self.job_id = job_id


class InvalidStatus(OperationRefused):
    """The row is in a state the action refuses (or a concurrent action won)."""

    status_code = 409
    code = "invalid_status"


class FlowNotFound(NotFound):
    """No flow with that id, or one of another tenant (the same answer: 404)."""

    def __init__(self, flow_id: Any) -> None:
        super().__init__(f"flow {clean(flow_id, 40)} does not exist")
        self.flow_id = flow_id


class FlowRunning(InvalidStatus):
    """Cancel while one of the flow's steps is running: nothing changed."""

    code = "flow_running"


class NothingToRetry(InvalidStatus):
    """Retry of a flow with no failed step: nothing changed."""

    code = "nothing_to_retry"


class FlowStepJob(InvalidStatus):
    """A job action (retry, skip, cancel) on a job that runs a flow's step: refused, the
    flow's own retry and cancel act on it. Nothing changed."""

    code = "flow_step"


# -- configuration ------------------------------------------------------------------------


class InvalidSettings(JobsEngineError, ImproperlyConfigured):
    """A setting that cannot work; the system checks report it at start-up."""


class DatabaseNotReady(JobsEngineError):
    """The database cannot be reached or is not migrated when a process starts (a worker,
    or ``check_ready`` before a web server): one clear line and a non-zero exit, rather than
    a process that looks alive and does nothing or fails every request."""
