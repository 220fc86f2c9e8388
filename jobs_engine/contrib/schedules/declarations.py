"""``declare()``: cron schedules declared in code, kept in an in-memory registry.

Each declaration registers the long-lane, exclusive target ``schedule:<code>``: every slot
becomes one job of that target (dedupe key ``<code>:<slot ISO>``), and at most one job of a
code is RUNNING across every worker. The schedule's row (admin-owned ``enabled`` and
``cron_override``) is written by ``sync_declared()``.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import models

from jobs_engine.contrib.schedules.cron import CronSpec, parse_cron
from jobs_engine.contrib.schedules.errors import DuplicateSchedule, InvalidSchedule
from jobs_engine.errors import DuplicateTarget
from jobs_engine.job import Job
from jobs_engine.policies import JobPolicy
from jobs_engine.registry import Handler, register_target, unregister_target
from jobs_engine.states import DeliveryMode, Lane
from jobs_engine.tenancy import tenant_id_problem


class MissedSlotPolicy(models.TextChoices):
    RUN_ONCE = "run_once", "Run once (the newest missed slot runs)"
    SKIP = "skip", "Skip (a late slot does not run)"


TARGET_PREFIX = "schedule:"
MAX_CODE_LENGTH = 100
DEFAULT_MAX_ATTEMPTS = 3
# A schedule whose slots come this often or more skips late slots unless told otherwise;
# a rarer one runs the newest missed slot once.
SKIP_BY_DEFAULT_UP_TO = timedelta(minutes=5)
CODE = re.compile(r"[A-Za-z0-9_.-]+")  # what a schedule code may be

SlotHandler = Callable[[datetime, Job], Any]


@dataclass(frozen=True, kw_only=True)
class Declaration:
    code: str
    cron: str
    timezone: str
    handler: SlotHandler
    missed_slot_policy: MissedSlotPolicy
    max_attempts: int
    tenant_id: str | None = None

    @property
    def target(self) -> str:
        return target_name(self.code)


_declared: dict[str, Declaration] = {}
_lock = threading.Lock()


def target_name(code: str) -> str:
    return f"{TARGET_PREFIX}{code}"


def slot_iso(slot: datetime) -> str:
    """A slot in the payload and the dedupe key: ISO 8601 in UTC, to the second."""
    return slot.astimezone(UTC).replace(microsecond=0).isoformat()


def slot_dedupe_key(code: str, slot: datetime) -> str:
    return f"{code}:{slot_iso(slot)}"


def default_policy(spec: CronSpec) -> MissedSlotPolicy:
    return (MissedSlotPolicy.SKIP if spec.min_interval() <= SKIP_BY_DEFAULT_UP_TO
            else MissedSlotPolicy.RUN_ONCE)


# What runs a slot's job: ``contrib.schedules.runner.run_slot``, set by the app's ``ready()``. The
# runner reads the schedules table, which does not exist yet when ``declare()`` is called
# (from an app's ``ready()``); handing it over here keeps this module below the runner.
SlotRunner = Callable[[str, Job], Any]
_slot_runner: SlotRunner | None = None


def set_slot_runner(runner: SlotRunner) -> None:
    global _slot_runner
    _slot_runner = runner


def slot_policy(max_attempts: int) -> JobPolicy:
    """The policy of a schedule's target: ``max_attempts`` runs of a slot, a minute apart and
    doubling (a slot's handler is a batch of work, not a quick send); the last 10 runs kept
    as completed jobs and the last 100 failed ones."""
    return JobPolicy(attempts=max_attempts, backoff_s=60, keep_completed=10, keep_failed=100)


def _slot_job_handler(code: str) -> Handler:
    def handle(job: Job) -> Any:
        if _slot_runner is None:
            raise RuntimeError("the schedules app is not ready: add "
                               "'jobs_engine.contrib.schedules' to INSTALLED_APPS")
        return _slot_runner(code, job)

    handle.__name__ = handle.__qualname__ = f"schedule_slot[{code}]"
    return handle


def declare(code: str, cron: str, handler: SlotHandler, *, timezone: str = "UTC",
            missed_slot_policy: MissedSlotPolicy | str | None = None,
            max_attempts: int = DEFAULT_MAX_ATTEMPTS,
            tenant_id: str | None = None) -> Declaration:
    """Declare a cron schedule; call it from your app's ``AppConfig.ready()``.

    ``handler(slot, job)`` runs on the long lane once per slot: ``slot`` is the slot time
    (aware, in the schedule's ``timezone``), ``job`` the engine's job. At most one slot of a
    code runs at a time across every worker, and a worker that died mid-run has its slot
    run again, so the handler must be idempotent per slot.

    ``cron``: see ``contrib.schedules.cron`` for the accepted syntax (5 fields, or 6 with seconds
    first) read in ``timezone`` (an IANA name). ``missed_slot_policy``: ``run_once`` or
    ``skip``; by default ``skip`` when slots come every 5 minutes or more often, else
    ``run_once``. ``max_attempts``: the **total number of runs** of one slot (3 = the first
    run and 2 retries, 60 s then 120 s after: ``slot_policy``); then the slot's job is DEAD
    and the next slot runs as usual. ``tenant_id``: the tenant the schedule and its slots'
    jobs belong to (None: the platform's own); only that tenant's operators, and the
    platform operator, see and steer it.

    Raises ``InvalidCron`` (bad cron, unknown time zone, never fires within 5 years),
    ``DuplicateSchedule`` (the code is declared already) or ``InvalidSchedule``; nothing is
    registered then.
    """
    if not isinstance(code, str) or not CODE.fullmatch(code):
        raise InvalidSchedule("code", "must be a non-empty string of letters, digits, '_', '.' "
                                      f"or '-', got {code!r}")
    if len(code) > MAX_CODE_LENGTH:
        raise InvalidSchedule("code", f"is {len(code)} characters, longer than {MAX_CODE_LENGTH}")
    if not callable(handler):
        raise InvalidSchedule("handler", f"must be callable, got {type(handler).__name__}")
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise InvalidSchedule("max_attempts", f"must be an integer >= 1 (total runs per slot), "
                                              f"got {max_attempts!r}")
    if tenant_id is not None:
        problem = tenant_id_problem(tenant_id)
        if problem is not None:
            raise InvalidSchedule("tenant_id", problem)
    spec = parse_cron(cron, timezone)
    if missed_slot_policy is None:
        policy = default_policy(spec)
    else:
        try:
            policy = MissedSlotPolicy(missed_slot_policy)
        except ValueError:
            raise InvalidSchedule("missed_slot_policy",
                                  f"must be one of {MissedSlotPolicy.values}, "
                                  f"got {missed_slot_policy!r}") from None
    declaration = Declaration(code=code, cron=spec.expression, timezone=spec.timezone,
                              handler=handler, missed_slot_policy=policy,
                              max_attempts=max_attempts, tenant_id=tenant_id)
    with _lock:
        if code in _declared:
            raise DuplicateSchedule(code)
        try:
            register_target(declaration.target, _slot_job_handler(code), lane=Lane.LONG,
                            exclusive=True, delivery_mode=DeliveryMode.AT_LEAST_ONCE,
                            policy=slot_policy(max_attempts))
        except DuplicateTarget:
            raise DuplicateSchedule(code) from None
        _declared[code] = declaration
    return declaration


def declared() -> dict[str, Declaration]:
    """Every schedule declared in this process, by code."""
    with _lock:
        return dict(_declared)


def get_declaration(code: str) -> Declaration | None:
    return _declared.get(code)


def undeclare(code: str) -> None:
    """Forget a declaration and its target (tests); unknown codes are ignored."""
    with _lock:
        if _declared.pop(code, None) is not None:
            unregister_target(target_name(code))
