"""The one outcome path shared by both lanes.

``judge`` turns what a handler did into an ``Outcome`` (built only by its constructors,
so no invalid combination exists); ``record`` writes outcomes through the store under
the lane's guard, pauses targets, and emits the run log line and DEAD alerts.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import NamedTuple

from django.db import transaction
from django.utils import timezone

from jobs_engine import store
from jobs_engine.conf import JobsSettings
from jobs_engine.errors import DeadNow, TargetOutcomeUnknown, TargetUnreachable
from jobs_engine.registry import Target
from jobs_engine.signals import job_dead
from jobs_engine.states import DeliveryMode, Lane

logger = logging.getLogger("jobs_engine")


class OutcomeKind(StrEnum):
    SUCCEEDED = "ok"
    RETRY = "retry"
    UNREACHABLE = "paused"
    DEAD = "dead"


@dataclass(frozen=True)
class Outcome:
    kind: OutcomeKind
    error: str = ""
    run_at: datetime | None = None
    pause_target: bool = False
    spend_attempt: bool = False

    @classmethod
    def succeeded(cls) -> Outcome:
        return _SUCCEEDED

    @classmethod
    def retry(cls, run_at: datetime, error: str) -> Outcome:
        return cls(OutcomeKind.RETRY, error, run_at=run_at, spend_attempt=True)

    @classmethod
    def unreachable(cls, error: str) -> Outcome:
        return cls(OutcomeKind.UNREACHABLE, error, pause_target=True)

    @classmethod
    def dead(cls, error: str, *, pause_target: bool = False, spend_attempt: bool = False
             ) -> Outcome:
        return cls(OutcomeKind.DEAD, error, pause_target=pause_target, spend_attempt=spend_attempt)


_SUCCEEDED = Outcome(OutcomeKind.SUCCEEDED)  # one for every success: the hot path's outcome


def describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def retry_delay_s(attempts_after: int, delays: Sequence[float]) -> float:
    """Delay before run ``attempts_after + 1``: the list's n-th entry, its last one after."""
    return float(delays[min(attempts_after, len(delays)) - 1])


def judge(row: store.JobRow, target: Target | None, exc: BaseException | None, now: datetime,
          settings: JobsSettings) -> Outcome:
    """Map a handler's result to an outcome (docs/design.md#outcomes)."""
    if exc is None:
        return Outcome.succeeded()
    error = describe(exc)
    if isinstance(exc, DeadNow):
        return Outcome.dead(error)
    mode = target.delivery_mode if target else DeliveryMode(row.delivery_mode)
    if isinstance(exc, TargetOutcomeUnknown):
        if mode is DeliveryMode.AT_MOST_ONCE:
            return Outcome.dead(error, pause_target=not exc.target_up)
        return Outcome.unreachable(error)
    if isinstance(exc, TargetUnreachable):
        return Outcome.unreachable(error)
    max_attempts = (target.max_attempts if target and target.max_attempts else
                    settings.MAX_ATTEMPTS)
    delays = (target.retry_delays if target and target.retry_delays else settings.RETRY_DELAYS)
    attempts_after = row.attempts + 1
    if attempts_after >= max_attempts:
        return Outcome.dead(f"{error} (attempt {attempts_after} of {max_attempts})",
                            spend_attempt=True)
    return Outcome.retry(now + timedelta(seconds=retry_delay_s(attempts_after, delays)), error)


class RunResult(NamedTuple):
    row: store.JobRow
    outcome: Outcome
    duration_ms: float


def record(guard: store.Guard, results: Sequence[RunResult], now: datetime,
           settings: JobsSettings) -> list[RunResult]:
    """Write every outcome under ``guard`` in one transaction, then report them; returns
    the results whose write matched. A database fault raises before anything is written,
    so the caller can write the same results again once the database is back."""
    with transaction.atomic():
        written = write(guard, results, now, settings)
    report(results, written, now)
    return written


def write(guard: store.Guard, results: Sequence[RunResult], now: datetime,
          settings: JobsSettings) -> list[RunResult]:
    """The outcome statements (the caller holds the transaction); returns the results
    whose write matched.

    A write that matches no row means the holder lost the row (lease taken over, or an
    admin changed it): the result is reported as ``lost`` and nothing else happens.
    """
    written: list[RunResult] = []
    succeeded: list[RunResult] = []
    others: list[RunResult] = []
    for result in results:
        (succeeded if result.outcome.kind is OutcomeKind.SUCCEEDED else others).append(result)
    if succeeded:
        deleted = store.jobs_delete_succeeded(guard, [(r.row.id, r.row.attempts)
                                                      for r in succeeded])
        # A batch delete reports only a count; a short count is rare (a takeover raced us).
        if deleted == len(succeeded):
            written += succeeded
        else:
            remaining = {row_id for (row_id,) in _existing_ids([r.row.id for r in succeeded])}
            written += [r for r in succeeded if r.row.id not in remaining]
    for result in others:
        kind, row, outcome = result.outcome.kind, result.row, result.outcome
        if kind is OutcomeKind.RETRY:
            assert outcome.run_at is not None
            ok = store.job_retry_later(guard, row.id, row.attempts, outcome.run_at, outcome.error,
                                       now)
            if ok and guard.lane is Lane.FAST and row.key is not None:
                store.jobs_hold_key_until(row, outcome.run_at)
        elif kind is OutcomeKind.UNREACHABLE:
            ok = store.job_release_unchanged(guard, row.id, row.attempts, outcome.error, now)
        else:
            ok = store.job_close_dead(guard, row.id, row.attempts, outcome.error, now,
                                      spend_attempt=outcome.spend_attempt)
        if ok:
            written.append(result)
        if outcome.pause_target:
            store.pause_set(row.target, now, settings.PROBE_S, outcome.error)
    return written


def report(results: Sequence[RunResult], written: Sequence[RunResult], now: datetime) -> None:
    """After the outcomes are committed: the hourly statistics, one run log line per
    result and the DEAD alerts."""
    count_runs(written, now)
    written_ids = {r.row.id for r in written}
    log_runs = logger.isEnabledFor(logging.INFO)  # else only the DEAD alerts: skip successes
    for result in results if log_runs else [r for r in results
                                            if r.outcome.kind is not OutcomeKind.SUCCEEDED]:
        row, ok = result.row, result.row.id in written_ids
        if log_runs:
            attempts = row.attempts + (1 if result.outcome.spend_attempt and ok else 0)
            logger.info(
                "job run code=%s target=%s dedupe_key=%s attempts=%s duration_ms=%.1f "
                "result=%s", row.code, row.target, row.dedupe_key, attempts,
                result.duration_ms, result.outcome.kind.value if ok else "lost",
            )
        if ok and result.outcome.kind is OutcomeKind.DEAD:
            announce_dead(row.id, row.target, row.code, row.dedupe_key, result.outcome.error)


# The outcome names of the hourly statistics (``JobStat.outcome``).
STAT_OUTCOMES = {OutcomeKind.SUCCEEDED: "ok", OutcomeKind.RETRY: "retried",
                 OutcomeKind.UNREACHABLE: "paused", OutcomeKind.DEAD: "dead"}


def stat_hour(now: datetime) -> datetime:
    return now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def count_runs(results: Sequence[RunResult], now: datetime) -> None:
    """Add the written outcomes to the hourly statistics in one statement. Statistics
    are evidence, not state: a failed write is logged and the outcomes stand."""
    if not results:
        return
    hour = stat_hour(now)
    counts = Counter((hour, r.row.target, STAT_OUTCOMES[r.outcome.kind]) for r in results)
    try:
        store.job_stats_add(counts)
    except Exception:
        logger.exception("job statistics not written for %s runs", len(results))


def _existing_ids(ids: Sequence[int]) -> list[tuple[int]]:
    from jobs_engine.models import Job

    return [(i,) for i in Job.objects.filter(id__in=ids).values_list("id", flat=True)]


def announce_dead(job_id: int, target: str, code: str, dedupe_key: str, reason: str) -> None:
    """The DEAD alert: an error-level log line and the ``job_dead`` signal."""
    logger.error("job dead alert id=%s target=%s code=%s dedupe_key=%s reason=%s",
                 job_id, target, code, dedupe_key, reason)
    # A failing receiver must not stop the outcomes still to be written.
    for receiver, response in job_dead.send_robust(sender=None, job_id=job_id, target=target,
                                                   code=code, reason=reason):
        if isinstance(response, Exception):
            logger.error("job_dead receiver %r failed: %r", receiver, response)


def announce_closed(closed: Sequence[store.ClosedJob]) -> None:
    for job in closed:
        announce_dead(job.id, job.target, job.code, job.dedupe_key, job.reason)
    if closed:  # closed by a takeover or a lease rescue: they count as dead runs too
        counts = Counter((stat_hour(timezone.now()), job.target, "dead") for job in closed)
        try:
            store.job_stats_add(counts)
        except Exception:
            logger.exception("job statistics not written for %s closed rows", len(closed))
