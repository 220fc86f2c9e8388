"""Operator actions on jobs and targets, shared by the Django admin and the JSON API.

Admin actions and API routes call these functions and never edit rows themselves (the
Procrastinate way). Each action is one guarded statement in ``store`` (so two operators
racing on one row cannot both win) plus an ``AuditRecord`` saying who did what to which
row and whether it was done or refused. A refused action raises ``JobNotFound`` (404) or
``InvalidStatus`` (409) after its refusal is recorded.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from jobs_engine import store
from jobs_engine.errors import JobsEngineError
from jobs_engine.models import AuditRecord, Job
from jobs_engine.states import JobStatus, Lane

logger = logging.getLogger("jobs_engine")

JOB = "job"
TARGET = "target"
MAX_JOB_ID = 2**63 - 1  # bigint: a larger id cannot exist (and would make PostgreSQL fail)
_JOB_ID = re.compile(r"[1-9][0-9]{0,18}")


# -- errors --------------------------------------------------------------------------------


class OperationRefused(JobsEngineError):
    """An operator action that changed nothing; ``code`` and ``status_code`` are what the
    API answers."""

    code = "refused"
    status_code = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class JobNotFound(OperationRefused):
    code = "not_found"
    status_code = 404

    def __init__(self, job_id: Any) -> None:
        super().__init__(f"job {_text(job_id, 40)} does not exist")
        self.job_id = job_id


class InvalidStatus(OperationRefused):
    code = "invalid_status"
    status_code = 409


# -- who acts ------------------------------------------------------------------------------


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
    """Record one operator action and its result (also for actions of other apps)."""
    who = Actor.of(actor)
    return AuditRecord.objects.create(
        at=timezone.now(), user_id=who.user_id, username=_text(who.username, 150),
        action=action, object_type=object_type, object_id=_text(object_id, 255),
        result=AuditRecord.Result.OK if ok else AuditRecord.Result.REFUSED,
        message=_text(message, 2000),
    )


def _text(value: Any, limit: int) -> str:
    """Text an audit column can hold: cut, no NUL (PostgreSQL text refuses it; a malformed
    id from a URL may carry one) and nothing UTF-8 cannot encode (a lone surrogate in a
    request body)."""
    text = str(value).replace("\x00", "\\x00")[:limit]
    return text.encode("utf-8", "replace").decode("utf-8")


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


def _act(action: str, raw_id: Any, actor: Any, attempt: Any, wanted: str) -> Any:
    """Run ``attempt(job_id)`` (one guarded statement) and its audit record in one
    transaction; a refusal is audited too, then raised."""
    try:
        job_id = parse_job_id(raw_id)
    except JobNotFound as exc:
        audit(actor, action, JOB, raw_id, ok=False, message=exc.message)
        raise
    refused: OperationRefused | None = None
    with transaction.atomic():
        result = attempt(job_id)
        if result:
            audit(actor, action, JOB, job_id, ok=True)
        else:
            refused = _refusal(job_id, action, wanted)
            audit(actor, action, JOB, job_id, ok=False, message=refused.message)
    if refused is not None:
        raise refused
    return result


def _log_removed(row: store.RemovedJob, result: str) -> None:
    logger.info("job run code=%s target=%s dedupe_key=%s attempts=%s duration_ms=0.0 result=%s",
                row.code, row.target, row.dedupe_key, row.attempts, result)


# -- the actions ---------------------------------------------------------------------------


def retry_job(job_id: Any, actor: Any, now: datetime | None = None) -> Job:
    """DEAD → PENDING, due now, attempts 0, claim fields cleared; returns the row.

    ``InvalidStatus`` when the row is not DEAD, which is also what the loser of two
    concurrent retries gets.
    """
    when = now or store.db_now()
    _act("retry", job_id, actor, lambda i: store.job_retry_if_dead(i, when), "a DEAD row")
    job = Job.objects.filter(id=parse_job_id(job_id)).defer("payload").first()
    if job is None:  # removed by someone else right after the retry committed
        raise JobNotFound(job_id)
    logger.info("job retried id=%s target=%s code=%s dedupe_key=%s by=%s", job.id, job.target,
                job.code, job.dedupe_key, Actor.of(actor).username)
    return job


def skip_job(job_id: Any, actor: Any) -> store.RemovedJob:
    """Delete a DEAD row for good; logs its run line with ``result=skipped``."""
    row = _act("skip", job_id, actor, store.job_delete_if_dead, "a DEAD row")
    _log_removed(row, "skipped")
    return row


def cancel_job(job_id: Any, actor: Any, now: datetime | None = None) -> store.RemovedJob:
    """Remove a row that has not run: a PENDING row not in flight, or a long-lane RUNNING
    row whose handler has not started. A row being sent or run answers ``InvalidStatus``.

    Cancelling the head of a fast-lane key frees the key: later versions that waited for
    the head's retry time become due now (this is how an admin unblocks a key).
    """
    when = now or store.db_now()

    def attempt(job_id: int) -> store.RemovedJob | None:
        removed = store.job_delete_if_not_started(job_id)
        if removed is not None:
            store.jobs_release_key_held_by(removed, when)
        return removed

    row = _act("cancel", job_id, actor, attempt,
               f"a PENDING row not in flight or a {Lane.LONG.value}-lane RUNNING row "
               "not yet started")
    _log_removed(row, "cancelled")
    return row


def resume_target(target: str, actor: Any) -> None:
    """End a target's pause now: workers send to it again on their next poll."""
    with transaction.atomic():
        removed = store.pause_clear(target)
        message = "" if removed else f"target {target} is not paused"
        audit(actor, "resume", TARGET, target, ok=bool(removed), message=message)
    if not removed:
        raise OperationRefused(message)
    logger.info("target resumed target=%s by=%s", target, Actor.of(actor).username)
