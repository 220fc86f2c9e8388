"""The one outcome path of both lanes: judge, then ``record`` (write, report).

``judge`` turns what a handler did into an ``Outcome`` (built only by its constructors, so
no invalid combination exists), once per job. ``record``, the one entry point both lanes
write outcomes through, commits them at once (the fast lane's mark clear included):
``write`` turns them into the store's guarded statements and the hourly statistics of what
they wrote, then ``report`` follows the commit with one run log line per job and the DEAD
alerts. The words of ``OutcomeKind`` are the ones the run log, the statistics, the admin
chart and ``/metrics`` use.
"""

from __future__ import annotations

import functools
import json
import logging
import traceback
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import NamedTuple

from django.db import transaction
from django.utils import timezone

from jobs_engine import flows, store
from jobs_engine.conf import JobsSettings
from jobs_engine.errors import (
    DeadNow,
    RateLimited,
    TargetOutcomeUnknown,
    TargetUnreachable,
    UnknownTarget,
)
from jobs_engine.job import Job
from jobs_engine.lanes.outage import is_database_fault
from jobs_engine.registry import Target, get_target, policy_for
from jobs_engine.signals import announce_dead, log_run
from jobs_engine.states import DeliveryMode, Lane
from jobs_engine.text import clean

logger = logging.getLogger("jobs_engine")


class OutcomeKind(StrEnum):
    OK = "ok"  # the handler returned
    RETRIED = "retried"  # an answered failure: run again later, one attempt spent
    PAUSED = "paused"  # the target could not be reached: the target pauses, no attempt spent
    THROTTLED = "throttled"  # the downstream said wait (RateLimited): no attempt spent
    DEAD = "dead"  # will not run again on its own


@dataclass(frozen=True)
class Outcome:
    kind: OutcomeKind
    error: str = ""
    run_at: datetime | None = None
    pause_target: bool = False
    spend_attempt: bool = False

    @classmethod
    def ok(cls) -> Outcome:
        return _OK

    @classmethod
    def retried(cls, run_at: datetime, error: str) -> Outcome:
        return cls(OutcomeKind.RETRIED, error, run_at=run_at, spend_attempt=True)

    @classmethod
    def paused(cls, error: str) -> Outcome:
        return cls(OutcomeKind.PAUSED, error, pause_target=True)

    @classmethod
    def throttled(cls, run_at: datetime, error: str) -> Outcome:
        """Its key takes no start until ``run_at`` (``RateLimited``); the row keeps its place
        and its attempts."""
        return cls(OutcomeKind.THROTTLED, error, run_at=run_at)

    @classmethod
    def dead(cls, error: str, *, pause_target: bool = False, spend_attempt: bool = False
             ) -> Outcome:
        return cls(OutcomeKind.DEAD, error, pause_target=pause_target, spend_attempt=spend_attempt)


_OK = Outcome(OutcomeKind.OK)  # one for every success: the hot path's outcome
_AT_LEAST_ONCE = DeliveryMode.AT_LEAST_ONCE.value


def describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def judge(job: Job, target: Target | None, exc: BaseException | None, now: datetime
          ) -> Outcome:
    """Map a handler's result to an outcome (docs/design.md#outcomes), under the target's
    policy. A try spends an attempt whatever its result, except when nothing reached the
    target (unreachable) or there was no handler to try."""
    if target is None:  # this worker has no handler for it (the lanes pass UnknownTarget)
        return Outcome.dead(f"no handler registered for {job.target}")
    if exc is None:
        return _OK
    error = describe(exc)
    if isinstance(exc, DeadNow):
        return Outcome.dead(error, spend_attempt=True)
    if isinstance(exc, TargetOutcomeUnknown):
        if target.delivery_mode is DeliveryMode.AT_MOST_ONCE:
            return Outcome.dead(error, pause_target=not exc.target_up, spend_attempt=True)
        return Outcome.paused(error)
    if isinstance(exc, TargetUnreachable):
        return Outcome.paused(error)
    if isinstance(exc, RateLimited):
        return Outcome.throttled(now + timedelta(seconds=exc.retry_after_s), error)
    policy, tries = target.policy, job.attempts + 1
    if tries >= policy.attempts:
        return Outcome.dead(f"{error} (attempt {tries} of {policy.attempts})",
                            spend_attempt=True)
    return Outcome.retried(now + timedelta(seconds=policy.delay_s(tries)), error)


class RunResult(NamedTuple):
    job: Job
    outcome: Outcome
    duration_ms: float
    result_json: str | None = None  # what the handler returned, as JSON text
    try_json: str | None = None  # long lane: the entry this try adds to the row's ``tries``


TRACEBACK_LIMIT = 8000  # characters of a try's traceback kept: its end, where the error is


@functools.lru_cache(maxsize=64)
def _try_head(worker_id: str, started_at: datetime) -> str:
    """The start of a try's entry, open for its end: every row of one reserve shares it."""
    return json.dumps({"worker": worker_id, "started_at": started_at.isoformat()})[:-1]


def try_entry(worker_id: str, started_at: datetime, finished_at: datetime,
              error: BaseException | None) -> str:
    """A long-lane try as the JSON text of its ``tries`` entry (``models.TRIES_HELP``):
    the worker, its start and end, and what it raised. ``store`` builds the same entry in
    SQL for a try whose worker was lost."""
    head = _try_head(worker_id, started_at)
    if error is None:  # an ISO time needs no escape: no encoder call on the hot path
        return f'{head}, "finished_at": "{finished_at.isoformat()}"}}'
    kind = type(error)
    tail = {"finished_at": finished_at.isoformat(),
            "error": f"{kind.__module__}.{kind.__qualname__}",
            "traceback": clean("".join(traceback.format_exception(error))[-TRACEBACK_LIMIT:],
                               TRACEBACK_LIMIT)}
    return f"{head}, {json.dumps(tail)[1:]}"


def record(guard: store.Guard, results: Sequence[RunResult], now: datetime,
           settings: JobsSettings, *, clear_marks: bool = False) -> list[RunResult]:
    """The one outcome entry point of both lanes: write every outcome under ``guard``,
    atomically, then report them; returns the results whose write matched.

    ``clear_marks`` (fast lane): the write ends a poll, whose token is the guard's; the
    poll's in-flight marks are cleared with the outcomes, never apart from them. Successes
    alone (``grouped``) the store writes atomically by itself, in one statement where it
    can (``store.write_successes``): no BEGIN and COMMIT round trips; anything else is
    written in one transaction. A database fault raises before anything is written, so
    the caller can write the same results again once the database is back."""
    statements = grouped(results)
    if statements.alone:
        written = write(guard, results, now, settings, statements, clear_marks=clear_marks)
    else:
        with transaction.atomic():
            written = write(guard, results, now, settings, statements,
                            clear_marks=clear_marks)
    report(results, written, now)
    return written


class Grouped(NamedTuple):
    """A write's outcomes as its statements take them.

    ``done``: the successes per (target, is a flow step), or (None, False) for all those of
    targets that keep none; each group is one statement. A flow's step jobs are all kept,
    whatever their target's policy: they stay as long as their flow
    (``FLOW_RETENTION_DAYS``). ``others``: one statement each. ``alone``: only successes
    of one group, no flow step: the store writes them, their statistics and a poll's mark
    clear atomically by itself (``store.write_successes``).
    """

    done: dict[tuple[str | None, bool], list[RunResult]]
    others: list[RunResult]
    alone: bool


def grouped(results: Sequence[RunResult]) -> Grouped:
    done: dict[tuple[str | None, bool], list[RunResult]] = defaultdict(list)
    others: list[RunResult] = []
    for result in results:
        if result.outcome.kind is OutcomeKind.OK:
            step = flows.is_flow_step(result.job)
            keeps = step or policy_for(result.job.target).keep_completed > 0
            done[(result.job.target, step) if keeps else (None, False)].append(result)
        else:
            others.append(result)
    return Grouped(done, others, not others and len(done) == 1 and not next(iter(done))[1])


def write(guard: store.Guard, results: Sequence[RunResult], now: datetime,
          settings: JobsSettings, statements: Grouped | None = None, *,
          clear_marks: bool = False) -> list[RunResult]:
    """The outcome statements, then the hourly statistics of the results whose write
    matched (and with ``clear_marks`` the clear of the poll's in-flight marks), all in the
    caller's transaction; or, for successes ``alone``, the store's write of them, atomic by
    itself. Returns the results whose write matched.

    A write that matches no row means the holder lost the row (lease taken over, or an
    admin changed it): the result is reported as ``lost`` and nothing else happens.
    ``statements``: ``grouped(results)``, when the caller has it.
    """
    written: list[RunResult] = []
    done, others, alone = statements or grouped(results)
    hour = stat_hour(now)
    for (target, step), group in done.items():
        keep = (len(group) if step else 0 if target is None
                else policy_for(target).keep_completed)
        # A send's rows share one duration (``_results``), so one start time.
        started = {ms: now - timedelta(milliseconds=ms) for ms in {r.duration_ms for r in group}}
        rows = [store.Done(r.job.id, r.job.attempts, r.result_json,  # type: ignore[arg-type]  # stored rows: id is set (None only on a lossy job)
                           started[r.duration_ms], r.duration_ms, r.try_json) for r in group]
        if alone:
            matched = store.write_successes(
                guard, rows, now, keep=keep, count_as=(hour, OutcomeKind.OK.value),
                clear_marks=clear_marks,
                flush_lazily=settings.LAZY_FLUSH_AT_LEAST_ONCE and all(
                    r.job.delivery_mode == _AT_LEAST_ONCE for r in group))
        else:
            matched = store.jobs_done(guard, rows, now, keep=keep)
        # A statement for a whole send reports only a count; a short one is rare (a
        # takeover raced us): the rows still in the table are the ones it did not match.
        if matched == len(group):
            written += group
        else:
            remaining = store.jobs_still_stored([r.job.id for r in group])  # type: ignore[misc]  # stored rows: id is set (None only on a lossy job)
            written += [r for r in group if r.job.id not in remaining]
    if alone:
        return written
    for result in others:
        kind, job, outcome = result.outcome.kind, result.job, result.outcome
        assert job.id is not None
        if kind is OutcomeKind.RETRIED:
            assert outcome.run_at is not None
            ok = store.job_retry_later(guard, job.id, job.attempts, outcome.run_at,
                                       outcome.error, now, result.try_json)
            if ok and guard.lane is Lane.FAST and job.key is not None:
                store.jobs_hold_key_until(job, outcome.run_at)
        elif kind is OutcomeKind.PAUSED:
            ok = store.job_release_unchanged(guard, job.id, job.attempts, outcome.error, now)
        elif kind is OutcomeKind.THROTTLED:
            ok = _throttle(guard, job, outcome, now)
        else:
            ok = store.job_close_dead(guard, job.id, job.attempts, outcome.error, now,
                                      spend_attempt=outcome.spend_attempt,
                                      try_json=result.try_json)
        if ok:
            written.append(result)
        if outcome.pause_target:
            store.pause_set(job.target, now, settings.PROBE_S, outcome.error)
    steps = [r for r in written if flows.is_flow_step(r.job)]
    if steps:  # in the outcome's transaction: a step's end and what follows commit together
        flows.advance(
            [(r.job.id, r.job.attempts + 1, r.result_json) for r in steps  # type: ignore[misc]  # stored rows: id is set (None only on a lossy job)
             if r.outcome.kind is OutcomeKind.OK],
            [(r.job.id, r.job.attempts + 1, r.outcome.error) for r in steps  # type: ignore[misc]  # stored rows: id is set (None only on a lossy job)
             if r.outcome.kind is OutcomeKind.DEAD], now)
    # Last: the hourly bucket is the row every worker's outcomes update, locked from here
    # to the commit. A failure fails the whole write, which is then written again.
    if written:
        store.job_stats_add(Counter(store.StatBucket(hour, r.job.target, r.outcome.kind.value,
                                                     r.job.tenant_id or "")
                                    for r in written))
    if clear_marks:  # the poll's end: its marks go with its outcomes
        store.inflight_clear(guard.token)
    return written


def _throttle(guard: store.Guard, job: Job, outcome: Outcome, now: datetime) -> bool:
    """``RateLimited``: the row goes back as it was (its place, its attempts); its key's
    buckets take no start until ``outcome.run_at``. A target without limits has no
    buckets: its row itself waits until then, its attempts unspent."""
    assert job.id is not None and outcome.run_at is not None
    try:
        target: Target | None = get_target(job.target)
    except UnknownTarget:
        target = None
    if target is not None and target.limits:
        store.limits_block(target, job.limit_key, outcome.run_at, now)
        return store.job_release_unchanged(guard, job.id, job.attempts, outcome.error, now)
    ok = store.job_retry_later(guard, job.id, job.attempts, outcome.run_at, outcome.error, now,
                               spend_attempt=False)
    if ok and guard.lane is Lane.FAST and job.key is not None:
        store.jobs_hold_key_until(job, outcome.run_at)
    return ok


def report(results: Sequence[RunResult], written: Sequence[RunResult], now: datetime) -> None:
    """After the outcomes are committed: one run log line per result and the DEAD
    alerts."""
    written_ids = {r.job.id for r in written}
    log_runs = logger.isEnabledFor(logging.INFO)  # else only the DEAD alerts: skip successes
    for result in results if log_runs else [r for r in results
                                            if r.outcome.kind is not OutcomeKind.OK]:
        job, ok = result.job, result.job.id in written_ids
        if log_runs:
            attempts = job.attempts + (1 if result.outcome.spend_attempt and ok else 0)
            log_run(job.code, job.target, job.dedupe_key, attempts, result.duration_ms,
                    result.outcome.kind.value if ok else "lost")
        if ok and result.outcome.kind is OutcomeKind.DEAD:
            assert job.id is not None, "written: a stored row"
            announce_dead(job.id, job.target, job.code, job.dedupe_key,
                          result.outcome.error)


def stat_hour(now: datetime) -> datetime:
    return now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def count_runs(runs: Sequence[tuple[str, str | None, OutcomeKind]], now: datetime) -> None:
    """Add (target, tenant, outcome) runs to the hourly statistics in one statement,
    outside any outcome write (rows a rescue or a takeover closed). Statistics are
    evidence, not state: a failed write is logged and the rows stay closed."""
    if not runs:
        return
    hour = stat_hour(now)
    try:
        store.job_stats_add(Counter(store.StatBucket(hour, target, kind.value, tenant or "")
                                    for target, tenant, kind in runs))
    except Exception as exc:
        if not is_database_fault(exc):
            logger.exception("job statistics not written for %s runs", len(runs))
            return
        logger.warning("job statistics not written for %s runs: %s", len(runs),
                       (str(exc).strip().splitlines() or [""])[0])


def announce_closed(closed: Sequence[store.ClosedJob]) -> None:
    """Rows a takeover or a lease rescue presumed DEAD: alerts, and dead runs counted."""
    for job in closed:
        announce_dead(job.id, job.target, job.code, job.dedupe_key, job.reason)
    count_runs([(job.target, job.tenant_id, OutcomeKind.DEAD) for job in closed],
               timezone.now())
