"""Operator actions, shared by the Django admin and the JSON API (of this app and others).

Admin actions and API routes call these functions and never edit rows themselves. Each
action is one guarded statement in ``store`` (so two operators racing on one row cannot
both win) plus an ``AuditRecord`` saying who did what to which row and whether it was done
or refused (``act``). A refused action raises an ``OperationRefused`` (``JobNotFound``
404, ``InvalidStatus`` 409, ...) after its refusal is recorded.
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

from jobs_engine import store
from jobs_engine.errors import InvalidStatus, JobNotFound, OperationRefused
from jobs_engine.models import AuditRecord, Job
from jobs_engine.signals import log_run
from jobs_engine.states import JobStatus, Lane
from jobs_engine.text import clean

logger = logging.getLogger("jobs_engine")

JOB = "job"
TARGET = "target"
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
          message: str = "") -> AuditRecord:
    """Record one operator action and its result. Ids and messages come from requests:
    cleaned, a NUL or a lone surrogate must not fail the record."""
    who = Actor.of(actor)
    return AuditRecord.objects.create(
        at=timezone.now(), user_id=who.user_id, username=clean(who.username, 150),
        action=action, object_type=object_type, object_id=clean(object_id, 255),
        result=AuditRecord.Result.OK if ok else AuditRecord.Result.REFUSED,
        message=clean(message, 2000),
    )


def act[K, T](action: str, object_type: str, raw_id: Any, actor: Any,
              parse: Callable[[Any], K], attempt: Callable[[K], tuple[T, str]]) -> T:
    """The shape of every operator action: ``parse(raw_id)`` names the row (or raises a
    ``NotFound``), ``attempt(key)`` acts and returns (result, audit message) or raises an
    ``OperationRefused``. The action and its audit record commit together; a refusal is
    audited outside the rolled-back transaction, then raised."""
    try:
        key = parse(raw_id)
        with transaction.atomic():
            result, message = attempt(key)
            audit(actor, action, object_type, key, ok=True, message=message)
    except OperationRefused as exc:
        audit(actor, action, object_type, raw_id, ok=False, message=exc.message)
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
               wanted: str) -> T:
    """``act`` for one guarded statement on a job; no row matched: the refusal says why."""
    def attempt(job_id: int) -> tuple[T, str]:
        result = statement(job_id)
        if not result:
            raise _refusal(job_id, action, wanted)
        return result, ""

    return act(action, JOB, raw_id, actor, parse_job_id, attempt)


def retry_job(job_id: Any, actor: Any, now: datetime | None = None) -> Job:
    """DEAD → PENDING, due now, attempts 0, claim fields cleared; returns the row.

    ``InvalidStatus`` when the row is not DEAD, which is also what the loser of two
    concurrent retries gets.
    """
    when = now or store.db_now()
    _on_job("retry", job_id, actor, lambda i: store.job_retry_if_dead(i, when), "a DEAD row")
    job = Job.objects.filter(id=parse_job_id(job_id)).defer("payload").first()
    if job is None:  # removed by someone else right after the retry committed
        raise JobNotFound(job_id)
    return job


def skip_job(job_id: Any, actor: Any) -> store.RemovedJob:
    """Delete a DEAD row for good; logs its run line with ``result=skipped``."""
    row = _on_job("skip", job_id, actor, store.job_delete_if_dead, "a DEAD row")
    log_run(row.code, row.target, row.dedupe_key, row.attempts, 0.0, "skipped")
    return row


def cancel_job(job_id: Any, actor: Any, now: datetime | None = None) -> store.RemovedJob:
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
                  "not yet started")
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
