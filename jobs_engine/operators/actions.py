"""Operator actions, shared by the Django admin and the JSON API (of this app and others).

Admin actions and API routes call these functions and never edit rows themselves. Each
action is one guarded statement in ``store`` (so two operators racing on one row cannot
both win) plus an ``AuditRecord`` saying who did what to which row and whether it was done
or refused (``act``). A refused action raises an ``OperationRefused`` (``JobNotFound``
404, ``InvalidStatus`` 409, ...) after its refusal is recorded.

Every action takes the caller's ``scope`` (``tenancy``): a row of a tenant out of it is
refused exactly as an unknown id (404), before anything else is looked at; code that calls
an action without one acts as the platform operator. The platform's settings (limits'
overrides, tenants' weights, pauses by hand) belong to no tenant: any other scope is
refused them (403), before anything else is looked at.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from django.db import transaction
from django.utils import timezone

from jobs_engine import flows, registry, store
from jobs_engine.errors import (
    FlowNotFound,
    FlowStepJob,
    InvalidFlow,
    InvalidLimit,
    InvalidStatus,
    JobNotFound,
    NotFound,
    OperationRefused,
    UnknownTarget,
)
from jobs_engine.limits import MAX_PERIOD_S, MAX_SLOTS, Concurrency, Limit, Rate
from jobs_engine.models import AuditRecord, Flow, Job
from jobs_engine.signals import log_run
from jobs_engine.states import JobStatus, Lane
from jobs_engine.tenancy import PLATFORM, Scope, owner_of, sees, tenant_id_problem
from jobs_engine.text import clean, storable

logger = logging.getLogger("jobs_engine")

JOB = "job"
TARGET = "target"
FLOW = "flow"
FLOW_DEFINITION = "flow_definition"
LIMIT = "limit"
TENANT = "tenant"
SET_OVERRIDE, CLEAR_OVERRIDE, SET_WEIGHT, PAUSE, RESUME = (
    "set_override", "clear_override", "set_weight", "pause", "resume")
MAX_WEIGHT = 1000  # a tenant's weight in the fair shares: 1 (the default) to this
MAX_JOB_ID = 2**63 - 1  # bigint: a larger id cannot exist (and would make PostgreSQL fail)
_JOB_ID = re.compile(r"[1-9][0-9]{0,18}")


# -- who acts, and the audit trail --------------------------------------------------------


@dataclass(frozen=True)
class Actor:
    """Who did it: a Django user, or the system (``user_id=None``)."""

    user_id: int | None
    username: str

    @classmethod
    def of(cls, user: Any) -> Actor:
        if isinstance(user, Actor):
            return user
        if user is None or not getattr(user, "is_authenticated", False):
            return cls(None, "system" if user is None else "anonymous")
        return cls(user.pk, user.get_username())


def audit(actor: Any, action: str, object_type: str, object_id: Any, *, ok: bool,
          message: str = "", scope: Scope = PLATFORM) -> AuditRecord:
    """Record one operator action and its result, in the tenant the operator acted for
    (``scope``). Ids and messages come from requests: cleaned, a NUL or a lone surrogate
    must not fail the record."""
    who = Actor.of(actor)
    return AuditRecord.objects.create(
        at=timezone.now(), user_id=who.user_id, username=clean(who.username, 150),
        action=action, object_type=object_type, object_id=clean(object_id, 255),
        result=AuditRecord.Result.OK if ok else AuditRecord.Result.REFUSED,
        message=clean(message, 2000), tenant_id=owner_of(scope),
    )


def act[K, T](action: str, object_type: str, raw_id: Any, actor: Any,
              parse: Callable[[Any], K], attempt: Callable[[K], tuple[T, str]], *,
              scope: Scope = PLATFORM, audited_as: Callable[[T], Any] | None = None) -> T:
    """The shape of every operator action: ``parse(raw_id)`` names the row (or raises a
    ``NotFound``), ``attempt(key)`` acts and returns (result, audit message) or raises an
    ``OperationRefused``. The action and its audit record (in the tenant of ``scope``, on
    ``audited_as(result)`` when given, else the row named; the log line names the same)
    commit together; a refusal is audited outside the rolled-back transaction, then
    raised."""
    try:
        key = parse(raw_id)
        with transaction.atomic():
            result, message = attempt(key)
            named = key if audited_as is None else audited_as(result)
            audit(actor, action, object_type, named, ok=True, message=message, scope=scope)
    except OperationRefused as exc:
        audit(actor, action, object_type, raw_id, ok=False, message=exc.message, scope=scope)
        raise
    logger.info("%s %s %s by=%s %s", object_type, action, named, Actor.of(actor).username,
                message)
    return result


# -- jobs ---------------------------------------------------------------------------------


def parse_job_id(raw: Any) -> int:
    """A job id from a URL or form; anything that cannot be a row's id is ``JobNotFound``
    (malformed ids answer 404 like unknown ones)."""
    if isinstance(raw, bool):
        raise JobNotFound(raw)
    if isinstance(raw, int):
        value = raw
    else:
        # A plain decimal id: ASCII digits, no sign, space or leading zero, at most 19 of
        # them (int() would take other scripts' digits, "1_0" as 10 and " 01" as 1).
        text = str(raw)
        if not _JOB_ID.fullmatch(text):
            raise JobNotFound(raw)
        value = int(text)
    if not 1 <= value <= MAX_JOB_ID:
        raise JobNotFound(raw)
    return value


def _refusal(job_id: int, action: str, wanted: str) -> OperationRefused:
    """Why ``action`` matched no row: the row is gone, or in a state the action refuses."""
    state = store.job_state(job_id)
    if state is None:
        return JobNotFound(job_id)
    detail = ""
    if state.status == JobStatus.PENDING and state.in_flight:
        detail = " and in flight (being sent right now)"
    elif state.status == JobStatus.RUNNING and state.started:
        detail = " and its handler has started"
    return InvalidStatus(f"job {job_id} is {state.status}{detail}; {action} needs {wanted}")


def _on_job[T](action: str, raw_id: Any, actor: Any, statement: Callable[[int], T | None],
               wanted: str, scope: Scope) -> T:
    """``act`` for one guarded statement on a job of ``scope``; no row matched: the refusal
    says why. A job that runs a flow's step is refused: acting on it alone would leave its
    flow waiting for a step that never ends, or running it twice; its flow's retry and
    cancel act on both. A job's tenant and its step never change, so one read before the
    statement decides both."""
    def attempt(job_id: int) -> tuple[T, str]:
        owner = store.job_owner(job_id)
        if owner is None or not sees(scope, owner.tenant_id):
            raise JobNotFound(job_id)
        if owner.flow_id is not None:
            raise FlowStepJob(f"job {job_id} runs step {owner.step_position} of flow "
                              f"{owner.flow_id}; retry or cancel the flow instead")
        result = statement(job_id)
        if not result:
            raise _refusal(job_id, action, wanted)
        return result, ""

    return act(action, JOB, raw_id, actor, parse_job_id, attempt, scope=scope)


def retry_job(job_id: Any, actor: Any, now: datetime | None = None, *,
              scope: Scope = PLATFORM) -> Job:
    """DEAD → PENDING, due now, attempts 0, claim fields cleared; returns the row.

    ``InvalidStatus`` when the row is not DEAD, which is also what the loser of two
    concurrent retries gets.
    """
    when = now or store.db_now()
    _on_job("retry", job_id, actor, lambda i: store.job_retry_if_dead(i, when), "a DEAD row",
            scope)
    job = Job.objects.filter(id=parse_job_id(job_id)).defer("payload").first()
    if job is None:  # removed by someone else right after the retry committed
        raise JobNotFound(job_id)
    return job


def skip_job(job_id: Any, actor: Any, *, scope: Scope = PLATFORM) -> store.RemovedJob:
    """Delete a DEAD row for good; logs its run line with ``result=skipped``."""
    row = _on_job("skip", job_id, actor, store.job_delete_if_dead, "a DEAD row", scope)
    log_run(row.code, row.target, row.dedupe_key, row.attempts, 0.0, "skipped")
    return row


def cancel_job(job_id: Any, actor: Any, now: datetime | None = None, *,
               scope: Scope = PLATFORM) -> store.RemovedJob:
    """Remove a row that has not run: a PENDING row not in flight, or a long-lane RUNNING
    row whose handler has not started. A row being sent or run answers ``InvalidStatus``.

    Cancelling the head of a fast-lane key frees the key: later versions that waited for
    the head's retry time become due now (this is how an admin unblocks a key).
    """
    when = now or store.db_now()

    def statement(job_id: int) -> store.RemovedJob | None:
        removed = store.job_delete_if_not_started(job_id)
        if removed is not None:
            store.jobs_release_key_held_by(removed, when)
        return removed

    row = _on_job("cancel", job_id, actor, statement,
                  f"a PENDING row not in flight or a {Lane.LONG.value}-lane RUNNING row "
                  "not yet started", scope)
    log_run(row.code, row.target, row.dedupe_key, row.attempts, 0.0, "cancelled")
    return row


# -- the platform's settings: pauses by hand, limits, tenants' weights --------------------

PLATFORM_SETTINGS = ("limits, tenants' weights and target pauses are the whole platform's "
                     "settings: only the platform operator changes them")


def _platform_only(scope: Scope) -> None:
    """The platform's settings are no tenant's: any other caller is refused (403)."""
    if scope is not PLATFORM:
        raise OperationRefused(PLATFORM_SETTINGS, status_code=403, code="forbidden")


def _registered(name: Any) -> registry.Target:
    """The target registered under ``name`` (in this process); anything else is 404."""
    try:
        return registry.get_target(name)
    except UnknownTarget:
        raise NotFound(f"no target named {clean(name, 200)!r} is registered") from None


def _pause_text(pause: store.PauseRow | None) -> str:
    """A pause as the audit trail says it: not its reason, a target's error text that may
    quote a payload (the pauses' page shows it to who may read payloads only)."""
    if pause is None:
        return "not paused"
    return "paused by hand" if pause.by_hand else "paused by the breaker"


def pause_target(target: Any, actor: Any, now: datetime | None = None, *,
                 scope: Scope = PLATFORM) -> store.PauseRow:
    """Pause a registered target by hand: no worker sends its rows until an operator
    resumes it (``resume_target``); it is never probed, and the breaker leaves it as it is.
    Over the breaker's pause it replaces it. Pausing a target paused by hand already
    changes nothing (still audited). The platform operator's alone (403 otherwise)."""
    def parse(raw: Any) -> str:
        _platform_only(scope)
        return _registered(raw).name

    def attempt(name: str) -> tuple[store.PauseRow, str]:
        before = store.pause_of(name)
        who = Actor.of(actor).username
        store.pause_by_hand(name, now or store.db_now(), f"paused by hand by {who}")
        after = store.pause_of(name)
        assert after is not None
        return after, f"was {_pause_text(before)}"

    return act(PAUSE, TARGET, target, actor, parse, attempt, scope=scope)


def resume_target(target: Any, actor: Any, *, scope: Scope = PLATFORM) -> None:
    """End a target's pause now, the breaker's or one made by hand: workers send to it
    again on their next poll. A target without a pause: ``InvalidStatus`` (409) when it is
    registered, else 404. The platform operator's alone (403 otherwise)."""
    def parse(raw: Any) -> str:
        _platform_only(scope)
        if isinstance(raw, str) and storable(raw) and store.pause_of(raw) is not None:
            return raw
        try:
            return registry.get_target(raw).name
        except UnknownTarget:
            raise NotFound(f"target {clean(raw, 200)} is not paused, and no target of that "
                           "name is registered") from None

    def attempt(name: str) -> tuple[None, str]:
        before = store.pause_of(name)
        if not store.pause_resume(name):
            raise InvalidStatus(f"target {name} is not paused")
        return None, f"was {_pause_text(before)}"

    act(RESUME, TARGET, target, actor, parse, attempt, scope=scope)


@dataclass(frozen=True)
class LimitSetting:
    """One declared limit of a target as operators change it: the values in force (the
    override's, where one is set) beside the declared ones."""

    target: str
    declared: Limit
    in_force: Limit
    override: store.LimitOverrideRow | None

    @property
    def name(self) -> str:
        return self.declared.name

    @property
    def overridden(self) -> bool:
        return self.override is not None


OVERRIDE_FIELDS: dict[type, tuple[str, ...]] = {Concurrency: ("slots",),
                                                Rate: ("starts", "period_s", "burst")}
ALL_OVERRIDE_FIELDS = ("slots", "starts", "period_s", "burst")


def limit_setting(target: str, declared: Limit) -> LimitSetting:
    override = store.limit_override_of(target, declared.name)
    return LimitSetting(target, declared, store.limit_in_force(declared, override), override)


def _declared_limit(target: Any, name: Any) -> tuple[str, Limit]:
    """The limit ``name`` that the registered ``target`` declares; anything else is 404."""
    found = _registered(target).limits.by_name.get(name) if isinstance(name, str) else None
    if found is None:
        raise NotFound(f"target {clean(target, 200)!r} declares no limit named "
                       f"{clean(name, 60)!r}")
    return target, found


def _whole(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SLOTS:
        raise OperationRefused(f"{field}: must be a whole number from 1 to {MAX_SLOTS:,}, "
                               f"got {clean(repr(value), 40)}")
    return value


def _seconds(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or not 0 < value <= MAX_PERIOD_S:
        raise OperationRefused(f"{field}: must be a number of seconds above 0 and at most "
                               f"{MAX_PERIOD_S:,.0f}, got {clean(repr(value), 40)}")
    return float(value)


def check_override(declared: Limit, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` as an override of ``declared``: the fields of its kind only (``slots``
    for a ``Concurrency``; ``starts``, ``period_s``, ``burst`` for a ``Rate``), at least one
    of them, each in range, and the limit they make valid. ``OperationRefused`` (400)
    naming the field otherwise. Returns every field of the table, None where not given."""
    given = {field: value for field, value in values.items() if value is not None}
    kind = type(declared)
    fields = OVERRIDE_FIELDS[kind]
    problems = [f"{field}: unknown field" for field in given if field not in ALL_OVERRIDE_FIELDS]
    problems += [f"{field}: {declared.name} is a {kind.__name__} limit, which takes "
                 f"{', '.join(fields)} only" for field in given
                 if field in ALL_OVERRIDE_FIELDS and field not in fields]
    if problems:
        raise OperationRefused(problems)
    if not given:
        raise OperationRefused(f"give at least one of {', '.join(fields)}")
    checked: dict[str, Any] = dict.fromkeys(ALL_OVERRIDE_FIELDS)
    for field, value in given.items():
        checked[field] = _seconds(field, value) if field == "period_s" else _whole(field, value)
    override = store.LimitOverrideRow("", declared.name, checked["slots"], checked["starts"],
                                      checked["period_s"], checked["burst"],
                                      datetime.min, "")
    try:
        store.limit_in_force(declared, override)
    except InvalidLimit as exc:
        raise OperationRefused(f"{exc.field}: {exc.problem}") from None
    return checked


def _limit_id(target: Any, name: Any) -> str:
    return f"{clean(target, 200)}/{clean(name, 60)}"


def _platform_limit(target: Any, name: Any, scope: Scope, _raw: Any) -> tuple[str, Limit]:
    """The target's name and the limit ``name`` it declares, for the platform operator only
    (403 for anyone else, 404 for an unknown target or limit): an override's ``parse``."""
    _platform_only(scope)
    return _declared_limit(target, name)


def set_limit_override(target: Any, name: Any, values: Mapping[str, Any], actor: Any,
                       now: datetime | None = None, *, scope: Scope = PLATFORM
                       ) -> LimitSetting:
    """Put ``values`` in force for the limit ``name`` that ``target`` declares (``slots``;
    or ``starts``, ``period_s``, ``burst``: ``check_override``), replacing an earlier
    override; every worker applies it at its next admission. An unknown target or limit
    is 404, a value that cannot be 400; nothing is changed either way. The platform
    operator's alone (403 otherwise)."""
    def attempt(key: tuple[str, Limit]) -> tuple[LimitSetting, str]:
        target_name, declared = key
        checked = check_override(declared, values)
        before = limit_setting(target_name, declared)
        store.limit_override_set(target_name, declared.name, **checked,
                                 now=now or store.db_now(), by=Actor.of(actor).username)
        after = limit_setting(target_name, declared)
        return after, f"{before.in_force} -> {after.in_force} (declared {declared})"

    return act(SET_OVERRIDE, LIMIT, _limit_id(target, name), actor,
               partial(_platform_limit, target, name, scope), attempt,
               scope=scope, audited_as=lambda setting: _limit_id(setting.target, setting.name))


def clear_limit_override(target: Any, name: Any, actor: Any, *, scope: Scope = PLATFORM
                         ) -> LimitSetting:
    """Back to the declared values of the limit ``name`` of ``target`` (a no-op on a limit
    without override, still audited). The platform operator's alone (403 otherwise)."""
    def attempt(key: tuple[str, Limit]) -> tuple[LimitSetting, str]:
        target_name, declared = key
        before = limit_setting(target_name, declared)
        store.limit_override_clear(target_name, declared.name)
        message = (f"was {before.in_force}; back to {declared}" if before.overridden
                   else f"had no override ({declared})")
        return limit_setting(target_name, declared), message

    return act(CLEAR_OVERRIDE, LIMIT, _limit_id(target, name), actor,
               partial(_platform_limit, target, name, scope), attempt,
               scope=scope, audited_as=lambda setting: _limit_id(setting.target, setting.name))


def set_tenant_weight(tenant_id: Any, weight: Any, actor: Any, now: datetime | None = None,
                      *, scope: Scope = PLATFORM) -> store.TenantWeightRow:
    """``tenant_id``'s weight in the long lane's fair shares, a whole number from 1 to
    ``MAX_WEIGHT``, from the next reserve on; 1, the default, removes the tenant's row. A
    text that can be no tenant id names none (404); a weight out of range is 400. The
    platform operator's alone (403 otherwise)."""
    def parse(raw: Any) -> str:
        _platform_only(scope)
        problem = tenant_id_problem(raw)
        if problem is not None:
            raise NotFound(f"no tenant can have this id: it {problem}")
        return str(raw)

    def attempt(tenant: str) -> tuple[store.TenantWeightRow, str]:
        if isinstance(weight, bool) or not isinstance(weight, int) \
                or not 1 <= weight <= MAX_WEIGHT:
            raise OperationRefused(f"weight: must be a whole number from 1 to {MAX_WEIGHT}, "
                                   f"got {clean(repr(weight), 40)}")
        before = _weight_of(tenant)
        store.tenant_weight_set(tenant, weight, now or store.db_now(),
                                Actor.of(actor).username)
        return _weight_of(tenant), f"weight {before.weight} -> {weight}"

    return act(SET_WEIGHT, TENANT, tenant_id, actor, parse, attempt, scope=scope)


def _weight_of(tenant: str) -> store.TenantWeightRow:
    found = store.tenant_weights(of_tenant=tenant)
    return found[0] if found else store.TenantWeightRow(tenant, 1, None, "")


# -- flows --------------------------------------------------------------------------------


def parse_flow_id(raw: Any) -> int:
    """A flow id, spelt as a job id is (``parse_job_id``); anything else names no flow."""
    try:
        return parse_job_id(raw)
    except JobNotFound:
        raise FlowNotFound(raw) from None


def retry_flow(flow_id: Any, actor: Any, *, scope: Scope = PLATFORM) -> flows.Retried:
    """``flows.retry``, audited: which steps were queued again, which DEAD jobs replaced."""
    def attempt(key: int) -> tuple[flows.Retried, str]:
        retried = flows.retry(key, scope=scope)
        replaced = ", ".join(map(str, retried.replaced_jobs)) or "none"
        return retried, (f"{retried.steps} failed step(s) queued again; DEAD job(s) "
                         f"replaced: {replaced}")

    return act("retry", FLOW, flow_id, actor, parse_flow_id, attempt, scope=scope)


def cancel_flow(flow_id: Any, actor: Any, *, scope: Scope = PLATFORM) -> int:
    """``flows.cancel``, audited; returns the steps dropped."""
    def attempt(key: int) -> tuple[int, str]:
        dropped = flows.cancel(key, scope=scope)
        return dropped, f"{dropped} step(s) dropped"

    return act("cancel", FLOW, flow_id, actor, parse_flow_id, attempt, scope=scope)


def start_flow(name: Any, input: Any, actor: Any, *, scope: Scope = PLATFORM) -> Flow:
    """``flows.start`` under the caller's tenant, audited on the definition's name; an
    input its builder refuses is a 400 naming the field, an unknown name a 404. A caller
    without a tenant (``scope`` None) starts nothing: the flow would be the platform's."""
    def parse(raw: Any) -> str:
        if not isinstance(raw, str) or raw not in {d.name for d in flows.definitions()}:
            raise OperationRefused(f"no flow named {clean(raw, 200)!r} is defined",
                                   status_code=404, code="not_found")
        return raw

    def attempt(key: str) -> tuple[Flow, str]:
        if scope is None:
            raise OperationRefused("this request acts for no tenant: start a flow as a "
                                   "tenant or as the platform operator", status_code=403,
                                   code="forbidden")
        try:
            flow_id = flows.start(key, input, tenant_id=scope)
        except InvalidFlow as exc:
            raise OperationRefused(f"{exc.field}: {exc.problem}") from None
        return Flow.objects.get(id=flow_id), f"flow {flow_id} started"

    return act("start", FLOW_DEFINITION, name, actor, parse, attempt, scope=scope)
