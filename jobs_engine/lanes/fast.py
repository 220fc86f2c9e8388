"""The fast lane: ordered sends from the partitions this worker holds.

One ``run_once`` reads up to ``FAST_BATCH`` due rows (each the head of its key) and hands
them to their targets in *sends*. Before a send its rows join their partitions' in-flight
marks, under the lease guard and under one token for the whole poll; outcomes are written
after the poll's sends, together with the clearing of the marks, so a crash at any point
leaves every marked row judged by its delivery mode on takeover, and every other row still
PENDING.

A send of an at-most-once target with a per-row handler is one row, or up to
``FAST_MARK_ROWS`` rows marked with one commit and handed one by one (a crash then judges
the rows marked with the one in hand as handed: at most once means possibly never).
Targets with a batch handler and at-least-once targets (for which judging a not-yet-handed
row "in flight" is harmless: it is sent again) get all their rows of the poll in one send.
So a poll costs a handful of statements, not a few per row, which is the route to speed.
The read marks the rows of the poll's first send itself (``store.jobs_fast_poll``), and
that send goes first: the busiest case, one batch target such as a Kafka topic, needs no
mark statement of its own, and neither does an idle worker woken for one at-most-once row.

A database fault does not lose what was sent: the poll's results wait (``Unwritten``) and
are written before anything else is polled (docs/design.md#database-outages).

Which targets a poll reads, and from where (``Reads``): a registered target that receives
nothing costs a poll nothing. A poll reads the targets the last poll found rows of, and the
others only when an enqueue has committed rows of the lane since (``store.ENQUEUES_FAST``);
a poll answering a wake-up, those and the targets its notifications name. A target whose
whole window was handed is read from after it at its next read (its cursor, less the lag
band ``store.CURSOR_LAG``), so a poll does not walk again the rows its predecessors handed and
deleted: while another session holds an old snapshot, PostgreSQL can neither remove them
nor mark their index entries dead, and a drain slowed with every poll. Once a ``POLL_S``,
and whenever the worker's partitions change, a poll reads every target from its first due
row (a deep read): a row behind a cursor (its transaction committed more than
``store.CURSOR_LAG`` after it began) or of a target nothing pointed to waits for it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import groupby
from typing import NamedTuple

from jobs_engine import store
from jobs_engine.conf import JobsSettings
from jobs_engine.errors import UnknownTarget
from jobs_engine.job import Job
from jobs_engine.lanes import outcomes
from jobs_engine.lanes.clock import DatabaseClock, DatabaseTime
from jobs_engine.lanes.handlers import Answer, call_batch_handler, call_handler
from jobs_engine.lanes.outage import is_database_fault
from jobs_engine.lanes.outcomes import Outcome, OutcomeKind, RunResult, judge
from jobs_engine.lanes.partitions import PartitionLeases
from jobs_engine.lanes.pauses import PauseGate
from jobs_engine.registry import Target, get_target, lane_targets
from jobs_engine.states import DeliveryMode, Lane

logger = logging.getLogger("jobs_engine")
_AT_LEAST_ONCE = DeliveryMode.AT_LEAST_ONCE.value
# How long a target a poll found rows of is read at every poll (``Reads``).
ACTIVE_S = 60.0


def takes_whole_poll(target: Target | None) -> bool:
    """Whether a target's rows of a poll go in one send (see the module docstring)."""
    return target is not None and (target.batch_handler is not None
                                   or target.delivery_mode is DeliveryMode.AT_LEAST_ONCE)


def sends_of(jobs: Sequence[Job], targets: dict[str, Target | None], rows_per_send: int = 1
             ) -> list[list[Job]]:
    """Split a poll's jobs into sends, target by target in name order: a target that takes
    the whole poll in one send, any other in sends of ``rows_per_send`` rows."""
    sends: list[list[Job]] = []
    for name, group in groupby(sorted(jobs, key=lambda j: j.target), key=lambda j: j.target):
        group_jobs = list(group)
        if takes_whole_poll(targets[name]):
            sends.append(group_jobs)
        else:
            sends += [group_jobs[i:i + rows_per_send]
                      for i in range(0, len(group_jobs), rows_per_send)]
    return sends


class Read(NamedTuple):
    """What one poll reads (``Reads.plan``): the targets and their limits, their cursors,
    those read whatever was enqueued, and the enqueue count that lets the others be
    skipped (``store.jobs_fast_due``)."""

    limits: dict[str, int]
    after: dict[str, store.Cursor]
    always: frozenset[str]
    enqueues_seen: int
    deep: bool


class Reads:
    """Which targets a worker's polls read, and from where (see the module docstring).

    ``_active``: the targets a poll found rows of in the last ``ACTIVE_S``, with the time
    they stop being read at every poll: a row retried, a pause's probe, a row due later
    come up among them as soon as they are due. ``_enqueues``: the enqueue count as the
    last two polls read it; a poll reads its other targets when the count moved since the
    older of the two. The older, because a count read by a poll may include an enqueue
    that committed after that poll's snapshot began; and a count read while an enqueue was
    open (it held the lane's lock) is none to compare with: that enqueue may commit any
    time after. Read with no enqueue open, every enqueue it counts committed before the
    next poll began, and that poll read the targets if the count had moved.
    """

    def __init__(self, poll_s: float, monotonic: Callable[[], float]) -> None:
        self.poll_s = poll_s
        self._monotonic = monotonic
        self.cursors: dict[str, store.Cursor] = {}
        self._cursors_held: list[int] = []  # the partitions the cursors were made in
        self._active: dict[str, float] = {}
        self._enqueues: tuple[int | None, int | None] = (None, None)
        self._next_deep_read = 0.0

    @property
    def active(self) -> frozenset[str]:
        now = self._monotonic()
        self._active = {name: until for name, until in self._active.items() if until > now}
        return frozenset(self._active)

    def plan(self, held: list[int], limits: dict[str, int], *, woken: bool,
             named: frozenset[str] | None) -> Read:
        if held != self._cursors_held:  # rows of partitions new to this worker: from the top
            self.cursors, self._cursors_held = {}, held
            self._next_deep_read = 0.0
        if woken:
            # The named few, not every registered target: a wake-up's path does no work per
            # registered target, so many idle targets do not slow it. At most
            # ``store.WOKEN_POLL_ROWS`` rows each: its plans may predate the rows it finds.
            wanted = sorted(self.active | named) if named is not None else limits
            listed = {name: min(limits[name], store.WOKEN_POLL_ROWS)
                      for name in wanted if name in limits}
            return Read(listed, self.cursors, frozenset(listed), store.READ_ALL, deep=False)
        if self._monotonic() >= self._next_deep_read:
            self._next_deep_read = self._monotonic() + self.poll_s
            return Read(limits, {}, frozenset(), store.READ_ALL, deep=True)
        older = self._enqueues[0]
        return Read(limits, self.cursors, self.active,
                    store.READ_ALL if older is None else older, deep=False)

    def found(self, poll: store.FastPoll) -> None:
        """After a read: its targets are active, and its enqueue count the newest."""
        until = self._monotonic() + ACTIVE_S
        self._active.update((job.target, until) for job in poll.jobs)
        self._enqueues = (self._enqueues[1], None if poll.enqueues_open else poll.enqueues)

    def advance(self, poll: store.FastPoll, limits: dict[str, int],
               results: Sequence[RunResult]) -> None:
        """After a poll's outcomes were written: a target whose window was full and every
        row of it handed and written (not given back by a pause) is read from after its
        last row next time. Any other target keeps its cursor: its read began there, and
        what it did not hand (a later version of a key, not a head; a pause) lies after
        it."""
        written = {r.job.id for r in results
                   if r.outcome.kind not in (OutcomeKind.PAUSED, OutcomeKind.THROTTLED)}
        read = Counter(job.target for job in poll.jobs)
        unhanded = {job.target for job in poll.jobs if job.id not in written}
        for target, (at, last_id) in poll.last_read.items():
            if read[target] == limits.get(target) and target not in unhanded:
                self.cursors[target] = store.Cursor(at - store.CURSOR_LAG, at, last_id)


@dataclass
class Unwritten:
    """A poll's results until they are written; its rows stay in the poll's in-flight
    marks (under ``token``) until then."""

    token: str
    results: list[RunResult] = field(default_factory=list)
    probes: frozenset[str] = frozenset()  # paused targets this poll probes
    paused: set[str] = field(default_factory=set)  # targets a send of this poll paused


class FastLane:
    def __init__(self, worker_id: str, settings: JobsSettings, leases: PartitionLeases,
                 pauses: PauseGate, monotonic: Callable[[], float] = time.monotonic,
                 should_stop: Callable[[], bool] = lambda: False) -> None:
        self.worker_id = worker_id
        self.should_stop = should_stop
        self.settings = settings
        self.leases = leases
        self.pauses = pauses
        self._monotonic = monotonic
        self._time = DatabaseTime(store.db_now, monotonic)
        self.reads = Reads(settings.POLL_S, monotonic)
        self._limits_of: tuple[tuple[Target, ...], dict[str, int], frozenset[str]] | None = None
        self._limited_of: tuple[tuple[Target, ...], dict[str, Target]] | None = None
        self._held_until: float | None = None  # monotonic: a held-back row's next token
        # Polls whose outcomes a database fault kept from being written, by token (the main
        # thread writes them; the heartbeat thread reads the tokens).
        self._unwritten: dict[str, Unwritten] = {}
        self._unwritten_lock = threading.Lock()
        # A partition the heartbeat takes back with one of these marks is this lane's own.
        leases.own_unwritten = self.unwritten_tokens

    def run_once(self, now: datetime | None = None, *, woken: bool = False,
                 named: frozenset[str] | None = None) -> int:
        """One poll and its sends; returns the number of rows handed to targets.

        Outcomes a database fault kept from being written are written first; until they
        are, nothing is polled (a poll would re-read the rows still in this worker's
        in-flight marks, and its marks would overwrite them). A poll answering a wake-up
        (``woken``) reads the targets its notifications ``named`` (None: every target) and
        leaves the clock's reading, the deep read and the backlog walk that fell due to
        the next poll: the woken row is sent first.
        """
        self._held_until = None
        self.write_unwritten()
        held = self.leases.held()
        if not held:
            return 0
        now = now or self._time.now(defer_read=woken)
        clock = DatabaseClock(now, self._monotonic)
        # Only targets registered here: another release's rows wait for its own workers.
        # The read skips paused targets itself.
        limits, per_row = self._limits(lane_targets(Lane.FAST))
        read = self.reads.plan(held, limits, woken=woken, named=named)
        # One token per poll: marks, outcomes and the final clear carry it. From the read on
        # (it may mark rows), a database fault leaves the poll's outcomes to write later.
        poll_out = Unwritten(uuid.uuid4().hex)
        try:
            poll = store.jobs_fast_poll(held, now, read.limits, owner=self.worker_id,
                                        token=poll_out.token, per_row=per_row,
                                        per_row_send=self.settings.FAST_MARK_ROWS,
                                        flush_lazily=self.settings.LAZY_FLUSH_AT_LEAST_ONCE,
                                        after=read.after, always=read.always,
                                        enqueues_seen=read.enqueues_seen)
            self.reads.found(poll)
            walk = (self._backlog_heads(held, now, limits, poll.jobs) if read.deep
                    else store.FastPoll([]))
            jobs, _, poll_out.probes = self.pauses.probe_rows(
                poll.jobs + walk.jobs, poll.probing | walk.probing, now)
            limited = self._limited(lane_targets(Lane.FAST))
            if limited and jobs:  # rows their limits hold back stay PENDING, in their place
                jobs, wait_s = store.limits_admit_fast(jobs, limited, now)
                self._held_until = (None if wait_s is None
                                    else self._monotonic() + wait_s)
            if not jobs:  # unsent rows stay PENDING
                if poll.marked:  # rows the read marked that limits held back: unmarked
                    self._write(poll_out, clock())
                return 0
            partitions = {job.partition for job in jobs}
            self.leases.busy |= partitions
            try:
                self._send_poll(jobs, poll, poll_out, clock)
            finally:
                self.leases.busy -= partitions
        except Exception as exc:
            if is_database_fault(exc):
                self._keep_unwritten(poll_out)
            raise
        self._write(poll_out, clock())
        self.reads.advance(poll, read.limits, poll_out.results)
        return len(poll_out.results)

    def _limits(self, fast: tuple[Target, ...]) -> tuple[dict[str, int], frozenset[str]]:
        """Each target's rows per poll, and the targets sent per row: made again only when
        the registered targets change."""
        if self._limits_of is None or self._limits_of[0] is not fast:
            self._limits_of = (fast, {t.name: t.batch_size or self.settings.FAST_BATCH
                                      for t in fast},
                               frozenset(t.name for t in fast if not takes_whole_poll(t)))
        return self._limits_of[1], self._limits_of[2]

    def due_in_s(self) -> float | None:
        """Seconds until a row its rate limit held back at the last poll gets a token: the
        worker waits no longer (an idle worker's backoff would hold a limit's rate down)."""
        if self._held_until is None:
            return None
        return max(0.0, self._held_until - self._monotonic())

    def _limited(self, fast: tuple[Target, ...]) -> dict[str, Target]:
        """The targets with limits, by name: made again only when the targets change."""
        if self._limited_of is None or self._limited_of[0] is not fast:
            self._limited_of = (fast, {t.name: t for t in fast if t.limits})
        return self._limited_of[1]

    @staticmethod
    def _backlog_heads(held: list[int], now: datetime, limits: dict[str, int],
                       jobs: list[Job]) -> store.FastPoll:
        """Heads from the whole due backlog of the targets a deep read read nothing of (once
        a POLL_S): a window without a head (``store.jobs_fast_due``) would stall its
        target, and the walk reads that target's whole backlog."""
        found = {job.target for job in jobs}
        missing = {name: limit for name, limit in limits.items() if name not in found}
        if not missing:
            return store.FastPoll([])
        return store.jobs_fast_due(held, now, missing, whole_backlog=True)

    # -- outcomes kept through a database fault -----------------------------------------

    def unwritten_tokens(self) -> frozenset[str]:
        """Tokens of this worker's in-flight marks whose outcomes wait to be written: a
        partition taken back with such a mark is this worker's own, not a dead one's."""
        with self._unwritten_lock:
            return frozenset(self._unwritten)

    def write_unwritten(self, now: datetime | None = None) -> int:
        """Write the outcomes of earlier polls that a database fault kept (and clear their
        marks); raises on a database fault. Returns the polls written."""
        with self._unwritten_lock:
            pending = list(self._unwritten.values())
        if not pending:
            return 0
        now = now or store.db_now()
        for poll_out in pending:
            self._write(poll_out, now)
            with self._unwritten_lock:
                self._unwritten.pop(poll_out.token, None)
            logger.warning("outcomes of %s row(s) written after a database fault worker=%s",
                           len(poll_out.results), self.worker_id)
        return len(pending)

    def _keep_unwritten(self, poll_out: Unwritten) -> None:
        with self._unwritten_lock:
            self._unwritten[poll_out.token] = poll_out

    def _write(self, poll_out: Unwritten, now: datetime) -> None:
        """Write a poll's outcomes and clear its marks atomically, then report
        (``outcomes.record``: one statement for successes alone where the database
        allows, else one transaction)."""
        try:
            outcomes.record(store.Guard(Lane.FAST, poll_out.token), poll_out.results, now,
                            self.settings, clear_marks=True)
        except Exception as exc:
            if is_database_fault(exc):
                self._keep_unwritten(poll_out)
            raise
        answered = {r.job.target for r in poll_out.results} - poll_out.paused
        for target_name in poll_out.probes & answered:
            self.pauses.probe_answered(target_name)

    # -- sends ----------------------------------------------------------------------------

    def _send_poll(self, jobs: list[Job], poll: store.FastPoll, poll_out: Unwritten,
                   clock: Callable[[], datetime]) -> None:
        """Hand the jobs to their targets, send by send, adding each result to
        ``poll_out`` as it comes (so a fault halfway keeps what was already sent)."""
        targets: dict[str, Target | None] = {}
        for name in {job.target for job in jobs}:
            try:
                targets[name] = get_target(name)
            except UnknownTarget:
                targets[name] = None
        token = poll_out.token
        sends = sends_of(jobs, targets, self.settings.FAST_MARK_ROWS)
        if poll.marked_target is not None:  # its first send was marked by the read: first
            marked = next(i for i, send in enumerate(sends)
                          if send[0].target == poll.marked_target)
            sends.insert(0, sends.pop(marked))
        for index, send in enumerate(sends):
            if index == 0 and send[0].target == poll.marked_target:
                # Marked by the read: in hand already, so a stop request does not leave
                # them unsent. Rows of a partition the read could not mark (its lease gone,
                # or a row of it closed meanwhile) take the usual path, which tells the two
                # apart (``_mark_inflight``).
                send = ([job for job in send if job.partition in poll.marked]
                        + self._mark_inflight([job for job in send
                                               if job.partition not in poll.marked],
                                              token, clock))
            else:
                if send[0].target in poll_out.paused:
                    continue  # the rest of a paused target's rows wait; others go on
                if self.should_stop():
                    break  # shutting down: rows not handed stay PENDING for the next owner
                # Self-fencing: nothing more of a partition whose lease may be gone.
                trusted = {p for p in {job.partition for job in send}
                           if self.leases.trusted(p)}
                send = self._mark_inflight([job for job in send if job.partition in trusted],
                                           token, clock)
            if not send:
                continue
            sent = self._send(targets[send[0].target], send, clock)
            poll_out.results += sent
            poll_out.paused |= {r.job.target for r in sent if r.outcome.pause_target}

    def _mark_inflight(self, send: list[Job], token: str, clock: Callable[[], datetime]
                       ) -> list[Job]:
        """Mark ``send`` in flight in one statement; returns the jobs to hand.

        Rows of a partition whose lease is lost are dropped with the partition; rows
        closed meanwhile (a takeover, an admin) are left out and the rest marked again.
        """
        handed: list[Job] = []
        for _ in range(2):
            if not send:
                break
            marked = store.inflight_mark_if_leased(
                self.worker_id, clock(), token,
                [(job.partition, job.id, job.attempts) for job in send],  # type: ignore[misc]  # stored rows: id is set (None only on a lossy job)
                flush_lazily=self.settings.LAZY_FLUSH_AT_LEAST_ONCE and all(
                    job.delivery_mode == _AT_LEAST_ONCE for job in send))
            handed += [job for job in send if job.partition in marked]
            refused = [job for job in send if job.partition not in marked]
            if not refused:
                break
            pending = store.jobs_still_pending(
                [(job.id, job.attempts) for job in refused])  # type: ignore[misc]  # stored rows: id is set (None only on a lossy job)
            closed_in = {job.partition for job in refused if job.id not in pending}
            for partition in {job.partition for job in refused} - closed_in:
                logger.warning("partition lease lost before send partition=%s worker=%s",
                               partition, self.worker_id)
                self.leases.drop(partition)
            send = [job for job in refused if job.partition in closed_in and job.id in pending]
        return handed

    def _send(self, target: Target | None, send: list[Job], clock: Callable[[], datetime]
              ) -> list[RunResult]:
        """Hand ``send`` to its target and judge each job once.

        The lease is checked again right before the hand-off: a worker stalled after its
        mark (SIGSTOP, a long GC pause) may have lost the partition meanwhile, and its new
        owner may already have sent later versions of the key. Jobs not handed get no
        result: they stay as they are (in this poll's mark, for the new owner to judge).
        """
        started = self._monotonic()
        trusted = self.leases.trusted
        if target is None:
            handed, answers = send, [Answer(UnknownTarget(send[0].target))] * len(send)
        elif target.batch_handler is not None:
            kept = {p for p in {job.partition for job in send} if trusted(p)}
            handed = [job for job in send if job.partition in kept]
            answers = call_batch_handler(target, handed) if handed else []
        else:
            handed, answers, verdicts = [], [], []
            for job in send:
                if handed and self.should_stop():
                    break  # rows marked with it and not handed go back to PENDING at the write
                if not trusted(job.partition):
                    continue
                handed.append(job)
                answers.append(call_handler(target, job))
                error = answers[-1].error  # the clock is read for a failure's retry time only
                verdicts.append(Outcome.ok() if error is None
                                else judge(job, target, error, clock()))
                if verdicts[-1].pause_target or verdicts[-1].kind is OutcomeKind.THROTTLED:
                    break  # the target is down or said wait: the rest of the send waits
            return self._results(handed, answers, verdicts, started)
        now = clock()
        return self._results(handed, answers, [judge(job, target, answer.error, now)
                                               for job, answer in zip(handed, answers,
                                                                      strict=True)], started)

    def _results(self, handed: list[Job], answers: list[Answer], verdicts: list[Outcome],
                 started: float) -> list[RunResult]:
        if not answers:
            return []
        duration_ms = (self._monotonic() - started) * 1000 / len(answers)
        return [RunResult(job, verdict, duration_ms, answer.result_json)
                for job, answer, verdict in zip(handed, answers, verdicts, strict=True)]
