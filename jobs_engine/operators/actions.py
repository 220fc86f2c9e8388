"""Operator actions, shared by the Django admin and the JSON API (of this app and others).

Admin actions and API routes call these functions and never edit rows themselves. Each
action is one guarded statement in ``store`` (so two operators racing on one row cannot
both win) plus an ``AuditRecord`` saying who did what to which row and whether it was done
or refused (``act``). A refused action raises an ``OperationRefused`` (``JobNotFound``
404, ``InvalidStatus`` 409, ...) after its refusal is recorded.

Every action takes the caller's ``scope`` (``tenancy``): a row of a tenant out of it is
refused exactly as an unknown id (404), before anything else is looked at; code that calls
an action without one acts as the platform operator.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from jobs_engine import flows, store
from jobs_engine.errors import (
    FlowNotFound,
    FlowStepJob,
    InvalidFlow,
    InvalidStatus,
    JobNotFound,
    OperationRefused,
)
from jobs_engine.models import AuditRecord, Flow, Job
from jobs_engine.signals import log_run
from jobs_engine.states import JobStatus, Lane
from jobs_engine.tenancy import PLATFORM, Scope, owner_of, sees
from jobs_engine.text import clean

logger = logging.getLogger("jobs_engine")

JOB = "job"
TARGET = "target"
FLOW = "flow"
FLOW_DEFINITION = "flow_definition"
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
    ``audited_as(result)`` when given, else the row named) commit together; a refusal is
    audited outside the rolled-back transaction, then raised."""
    try:
        key = parse(raw_id)
        with transaction.atomic():
            result, message = attempt(key)
            audit(actor, action, object_type, key if audited_as is None else audited_as(result),
                  ok=True, message=message, scope=scope)
    except OperationRefused as exc:
        audit(actor, action, object_type, raw_id, ok=False, message=exc.message, scope=scope)
        raise
    logger.info("%s %s %s by=%s %s", object_type, action, key, Actor.of(actor).username,
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


# -- targets ------------------------------------------------------------------------------


def resume_target(target: str, actor: Any) -> None:
    """End a target's pause now: workers send to it again on their next poll."""
    def attempt(name: str) -> tuple[None, str]:
        if not store.pause_clear(name):
            raise OperationRefused(f"target {name} is not paused")
        return None, ""

    act("resume", TARGET, target, actor, str, attempt)


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
