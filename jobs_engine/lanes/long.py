"""The long lane: leased rows for handlers that run for minutes.

``run_once`` first rescues rows whose lease expired (their worker died or stalled; at most
once a second), then reserves up to ``LONG_BATCH`` rows (``LONG_PREFETCH`` times that while
handlers are short, of which ``LONG_PREFETCH_AT_MOST_ONCE`` times at most once: ``slots``)
under a claim token, marks them started in one statement and hands each to a thread. The
heartbeat renews the leases of rows in hand; every write of a row's outcome is guarded on
its claim token, so a worker that lost a row cannot finish it. Outcomes are group-committed
by one writer thread: what the handlers returned while it wrote the last outcomes goes in
its next transaction, so a busy lane commits many outcomes at once and an idle one each at
once.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import connection

from jobs_engine import store
from jobs_engine.conf import JobsSettings
from jobs_engine.context import LongLaneTry, try_context
from jobs_engine.errors import UnknownTarget
from jobs_engine.job import Job
from jobs_engine.lanes.clock import DatabaseClock, DatabaseTime
from jobs_engine.lanes.handlers import Answer, call_handler
from jobs_engine.lanes.outage import Outages, backoff_s, close_quietly, is_database_fault
from jobs_engine.lanes.outcomes import RunResult, announce_closed, judge, record, try_entry
from jobs_engine.lanes.pauses import PauseGate
from jobs_engine.registry import Target, get_target, lane_names
from jobs_engine.states import DeliveryMode, Lane

logger = logging.getLogger("jobs_engine")

# Expired leases are looked for at most this often (database time): a lease is minutes, and
# a busy lane polls hundreds of times a second.
RESCUE_EVERY = timedelta(seconds=1)
# A rescue reads the leases that expired since the last one, less this lag band; from the
# first expired lease at most once a RESCUE_WHOLE_EVERY (``LongLane._rescue``).
RESCUE_LAG = timedelta(seconds=10)
RESCUE_WHOLE_EVERY = timedelta(minutes=1)
# Handlers shorter than this on average (ms) get ``LONG_PREFETCH`` rows per thread queued
# (``LongLane.slots``); the moving average gives each new duration this weight.
SHORT_HANDLER_MS = 10.0
HANDLER_MS_WEIGHT = 0.2
# A target the worker reserved rows of this recently is tested first by its reserve
# (``store.jobs_long_reserve``'s ``likely``).
LIKELY_S = 60.0
_AT_MOST_ONCE = DeliveryMode.AT_MOST_ONCE.value


class Slots(NamedTuple):
    """Rows of the long lane: all of them, and how many of those may be at-most-once."""

    rows: int
    at_most_once: int


class HandlerThreads:
    """``count`` threads that run the calls handed to them in order of arrival, started as
    calls come. A ``ThreadPoolExecutor`` made a future per call, which nothing here waits
    on, and its ``submit`` was a tenth of a busy long-lane worker's Python time."""

    def __init__(self, count: int, name: str) -> None:
        self._count = count
        self._name = name
        self._calls: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]] | None] = (
            queue.SimpleQueue())
        self._threads: list[threading.Thread] = []

    def submit(self, call: Callable[..., None], *args: Any) -> None:
        if len(self._threads) < self._count:
            # Daemon: a lane never shut down must not hold the interpreter open; the worker
            # shuts its lane down, and waits for the calls, before it exits.
            thread = threading.Thread(target=self._serve, daemon=True,
                                      name=f"{self._name}_{len(self._threads)}")
            self._threads.append(thread)
            thread.start()
        self._calls.put((call, args))

    def _serve(self) -> None:
        while (item := self._calls.get()) is not None:
            call, args = item
            try:
                call(*args)
            except BaseException:  # the call's own net failed: the thread serves the others
                logger.exception("a long-lane thread's call raised")

    def shutdown(self, wait: bool = True) -> None:
        """The calls handed so far still run; ``wait``: return when they have."""
        for _ in self._threads:
            self._calls.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


def runs_exclusively(target_name: str) -> bool:
    """Whether ``target_name`` is an exclusive target registered here."""
    try:
        return get_target(target_name).exclusive
    except UnknownTarget:
        return False


def reserved_here(target_name: str) -> bool:
    """Whether this lane reserves rows of ``target_name``: a long-lane target registered
    here, not lossy (``lane_targets``)."""
    try:
        target = get_target(target_name)
    except UnknownTarget:
        return False
    return target.lane is Lane.LONG and not target.lossy


class LongLane:
    def __init__(self, worker_id: str, settings: JobsSettings, pauses: PauseGate, *,
                 threads: bool = True, monotonic: Callable[[], float] = time.monotonic,
                 on_row_done: Callable[[], None] = lambda: None,
                 outages: Outages | None = None,
                 should_stop: Callable[[], bool] = lambda: False,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.worker_id = worker_id
        self.on_row_done = on_row_done  # a slot came free: the worker polls again at once
        self.settings = settings
        self.pauses = pauses
        self._monotonic = monotonic
        self.outages = outages or Outages(worker_id, monotonic)
        self.should_stop = should_stop
        self._sleep = sleep
        self._lock = threading.Lock()
        self._in_hand: dict[int, str] = {}  # job id -> claim token
        self._pool = HandlerThreads(settings.LONG_BATCH, "long-lane") if threads else None
        self._next_due_at: float | None = None  # monotonic: a deferred row comes due then
        self.quiet = False  # the last poll left nothing to take at once (``run_once``)
        # Where the next reserve starts (``store.LongCursor``), and when the next one from
        # the first due row is due (monotonic).
        self._cursor: store.LongCursor | None = None
        self._next_deep_reserve = 0.0
        # An exclusive code this worker ran is free again: rows of it that reserves passed
        # over while it ran lie behind the cursor (set by the writer, read by the poll).
        self._code_freed = False
        self._reserved_lately: dict[str, float] = {}  # target -> until (``_likely``)
        self._key_cursor = store.FIRST_KEYS  # where the limits' next admission looks
        self._tenants_wait = False  # a tenant's row waited (``_fair_shares``), looked at then
        self._tenants_looked_at: float | None = None
        self._rescued_at: datetime | None = None
        self._rescued_whole_at: datetime | None = None
        self._time = DatabaseTime(store.db_now, monotonic)
        self._running = 0  # rows whose handler has not returned (in hand: until written)
        self._running_at_most_once = 0  # of them, at-most-once rows
        self._at_most_once_share = 1.0  # of the rows the last reserve took
        self._handler_ms: float | None = None  # moving average of handler durations
        # Outcomes to write: (claim token, result, probe, clock), None to stop the writer.
        self._outcomes: queue.SimpleQueue[tuple[str, RunResult, bool, DatabaseClock] | None] = (
            queue.SimpleQueue())
        self._writer = (threading.Thread(target=self._write_outcomes, daemon=True,
                                         name="long-lane-outcomes") if threads else None)
        if self._writer is not None:
            self._writer.start()

    def in_hand(self) -> int:
        with self._lock:
            return len(self._in_hand)

    def slots(self) -> Slots:
        """Rows this lane may run or queue for its ``LONG_BATCH`` threads: one per thread,
        or ``LONG_PREFETCH`` per thread while its handlers are short (their moving average
        under ``SHORT_HANDLER_MS``), of which ``LONG_PREFETCH_AT_MOST_ONCE`` at most once.
        For handlers that short, the reserve and the outcome write cost more than the
        handler: a deeper queue makes each statement take more rows, and a queued row
        waits a few handlers' time, not a poll's. At-most-once rows queue less deep: a
        crash presumes every started one DEAD, where an at-least-once row runs again."""
        with self._lock:
            short = self._handler_ms is not None and self._handler_ms < SHORT_HANDLER_MS
        settings = self.settings
        batch = settings.LONG_BATCH
        if not short:
            return Slots(batch, batch)
        return Slots(batch * settings.LONG_PREFETCH,
                     batch * min(settings.LONG_PREFETCH, settings.LONG_PREFETCH_AT_MOST_ONCE))

    def free_slots(self) -> Slots:
        """Rows this lane may reserve now: ``slots()`` minus those running or queued. A
        row whose handler returned frees its slot at once, while its outcome waits for the
        writer (it stays in hand, its lease renewed, until written); but no more than
        ``slots()`` outcomes wait, so a slow database slows the lane down."""
        slots = self.slots()
        with self._lock:
            if len(self._in_hand) < self._running:
                return Slots(0, 0)
            rows = max(0, min(slots.rows - self._running, 2 * slots.rows - len(self._in_hand)))
            return Slots(rows, max(0, min(rows, slots.at_most_once - self._running_at_most_once)))

    def _reserve_limit(self, free: Slots) -> int:
        """The rows a reserve locks. It locks rows in order and leaves the at-most-once
        ones past ``free.at_most_once`` PENDING, and a lock is a write: with the share of
        at-most-once rows the last reserve took, it locks about as many as it can take
        (a lane of at-most-once rows locked 4 for every one it took, -11%)."""
        if self._at_most_once_share == 0:
            return free.rows
        return max(free.at_most_once,
                   min(free.rows, math.ceil(free.at_most_once / self._at_most_once_share)))

    def run_once(self, now: datetime | None = None, *, woken: bool = False) -> int:
        """Rescue expired leases, then reserve and start rows; returns rows started. A poll
        answering a wake-up (``woken``) leaves the clock's reading and the rescue that fell
        due to the next poll: the woken row starts first."""
        self.quiet = False
        now = now or self._time.now(defer_read=woken)
        clock = DatabaseClock(now, self._monotonic)
        if not woken:
            self._rescue(now)
        free = self.free_slots()
        if woken:  # its plans may predate the rows it finds (``store.WOKEN_POLL_ROWS``)
            free = Slots(*(min(n, store.WOKEN_POLL_ROWS) for n in free))
        if self._reserve_limit(free) <= 0:
            return 0
        token = uuid.uuid4().hex
        # Only targets registered here: another release's rows wait for its own workers.
        mine = lane_names(Lane.LONG)
        self._next_due_at = None
        admitted = store.Admitted(store.ReservedRows(), None, now)
        started = 0
        if mine.limited:
            # Limited targets first, each admitted by its limits; of rate-limited targets
            # as many rows as threads are idle (a slot is held by the row itself, queued or
            # not). Handed to threads at once: a rate counts starts, and the rows' start is
            # the admission's time, when their tokens were taken.
            with self._lock:
                idle_threads = max(0, self.settings.LONG_BATCH - self._running)
            admitted = store.jobs_long_reserve_limited(
                self.worker_id, token, now, self.settings.LONG_LEASE_S, free.rows,
                targets=mine.limited, start=True, at_most_once_limit=free.at_most_once,
                rated_limit=idle_threads, after=self._key_cursor)
            self._key_cursor = admitted.cursor
            started += self._start(admitted.rows, token, admitted.at,
                                   DatabaseClock(admitted.at, self._monotonic))
            free = Slots(free.rows - len(admitted.rows), free.at_most_once - sum(
                r.job.delivery_mode == _AT_MOST_ONCE for r in admitted.rows))
        limit = self._reserve_limit(free)
        # One statement reserves and starts the rows, skipping paused targets (no separate
        # read of the pauses); rows of a target whose pause ran out come back unstarted.
        reserve: Callable[..., store.ReservedRows] = (
            self._reserve_fair if self._fair_shares(woken) else store.jobs_long_reserve)
        reserved = store.ReservedRows() if not mine.free_names or limit <= 0 else reserve(
            self.worker_id, token, now, self.settings.LONG_LEASE_S, limit,
            exclusive_targets=mine.exclusive_names, targets=mine.free_names, start=True,
            at_most_once_limit=free.at_most_once,
            flush_lazily=self.settings.LAZY_FLUSH_AT_LEAST_ONCE,
            after=self._reserve_from(woken), likely=self._likely())
        self._cursor = reserved.cursor or self._cursor
        # The limits took what they allow and the free reserve all there was: a poll at
        # once would find nothing; the next comes at a slot of this worker's freed (a
        # poke), a token or a row due (``due_in_s``), a NOTIFY or the idle pace.
        self.quiet = admitted.held_back and len(reserved) < limit
        until = self._monotonic() + LIKELY_S
        self._reserved_lately.update((r.job.target, until) for r in reserved)
        taken = reserved + admitted.rows
        if taken:
            self._at_most_once_share = sum(r.job.delivery_mode == _AT_MOST_ONCE
                                           for r in taken) / len(taken)
        else:
            next_due = store.jobs_long_next_due(mine.names, now)
            if next_due is not None:
                self._next_due_at = self._monotonic() + (next_due - now).total_seconds()
        if admitted.wait_s is not None:  # a held-back key's next token or block's end
            at = self._monotonic() + admitted.wait_s
            self._next_due_at = at if self._next_due_at is None else min(at, self._next_due_at)
        return started + self._start(reserved, token, now, clock)

    def _start(self, reserved: list[store.Reserved], token: str, started_at: datetime,
               clock: DatabaseClock) -> int:
        """Hand the reserved rows that started (and the probes this worker won of the
        others) to the threads; returns how many. ``started_at``: what the reserve wrote."""
        if not reserved:
            return 0
        ready = [(r.job, r.earlier_tries) for r in reserved if r.earlier_tries is not None]
        probed, probes = self._probe([r.job for r in reserved if r.earlier_tries is None],
                                     token, started_at, started_at)
        ready += probed
        for job, earlier in ready:
            assert job.id is not None, "reserved: a stored row"
            with self._lock:
                self._in_hand[job.id] = token
                self._running += 1
                if job.delivery_mode == _AT_MOST_ONCE:
                    self._running_at_most_once += 1
            args: tuple[Any, ...] = (job, token, clock, LongLaneTry(
                self.worker_id, started_at, tuple(earlier)), job.target in probes)
            if self._pool is None:
                self._run(*args)
            else:
                self._pool.submit(self._run_in_thread, *args)
        return len(ready)

    def _fair_shares(self, woken: bool) -> bool:
        """Whether this reserve is the fair one (``store.jobs_long_reserve_fair``):
        ``FAIR_SHARES`` on and a tenant's row waiting, as ``store.jobs_long_tenants_wait``
        said at most a ``POLL_S`` ago (one entry of an index that holds no row without a
        tenant: a project without tenants pays that statement once a ``POLL_S``, and keeps
        the plain reserve and its cursor). A woken poll asks only if it never was."""
        if not self.settings.FAIR_SHARES:
            return False
        at, last = self._monotonic(), self._tenants_looked_at
        if last is None or (not woken and not 0 <= at - last < self.settings.POLL_S):
            self._tenants_looked_at = at
            self._tenants_wait = store.jobs_long_tenants_wait()
        return self._tenants_wait

    def _reserve_fair(self, *args: Any, after: store.LongCursor | None, likely: list[str],
                      **kwargs: Any) -> store.ReservedRows:
        """``store.jobs_long_reserve_fair`` in the plain reserve's place: it reads each
        tenant's rows from the first (no cursor, no ``likely``), and the next plain reserve
        reads from the first due row."""
        self._cursor = None
        return store.jobs_long_reserve_fair(*args, **kwargs)

    def _likely(self) -> list[str]:
        """The targets this worker reserved rows of in the last ``LIKELY_S``
        (``store.jobs_long_reserve``'s ``likely``), but one dropped from the registry
        since: not one to reserve."""
        now = self._monotonic()
        self._reserved_lately = {t: until for t, until in self._reserved_lately.items()
                                 if until > now}
        return [t for t in self._reserved_lately if reserved_here(t)]

    def _reserve_from(self, woken: bool) -> store.LongCursor | None:
        """Where a reserve starts: after the cursor the last full reserve left (the rows
        before it were taken, and walking their dead index entries again slowed every
        reserve while another session held an old snapshot), or at the first due row once
        a ``POLL_S`` (never at a wake-up), for a row released by a rescue, a pause ended or
        a transaction that committed more than ``store.CURSOR_LAG`` after it began; and
        after this worker finished a row of an exclusive target, whose code's next row a
        reserve may have passed over while it ran."""
        if self._code_freed:
            self._code_freed = False
            return None
        if not woken and self._monotonic() >= self._next_deep_reserve:
            self._next_deep_reserve = self._monotonic() + self.settings.POLL_S
            return None
        return self._cursor

    def _probe(self, unstarted: list[Job], token: str, now: datetime, started_at: datetime
               ) -> tuple[list[tuple[Job, list[dict[str, Any]]]], frozenset[str]]:
        """Rows of targets whose pause ran out: the probe this worker wins of each is
        started; the other rows go back untouched. Returns the started probes with their
        earlier tries, and the targets probed."""
        if not unstarted:
            return [], frozenset()
        probe_rows, give_back, probes = self.pauses.probe_rows(
            unstarted, {job.target for job in unstarted}, now)
        for job in give_back:
            assert job.id is not None, "reserved: a stored row"
            store.job_release_unchanged(store.Guard(Lane.LONG, token), job.id, job.attempts,
                                        None, now)
        started: list[tuple[Job, list[dict[str, Any]]]] = []
        if probe_rows:
            earlier = store.jobs_long_mark_started(
                [job.id for job in probe_rows], token, started_at)  # type: ignore[misc]  # stored rows: id is set (None only on a lossy job)
            for job in probe_rows:
                if job.id in earlier:
                    started.append((job, earlier[job.id]))
                else:
                    logger.warning("long lane lost job %s before it started", job.id)
        return started, probes

    def _rescue(self, now: datetime) -> None:
        """Rows whose lease expired: at-most-once ones that started go DEAD, the others
        back to PENDING (``store.jobs_long_rescue_expired``).

        Only the leases that expired since the last rescue, less ``RESCUE_LAG``: the rows
        of the earlier ones were rescued then, and under an old snapshot a read from the
        first expired lease visits every RUNNING version the snapshot keeps, those of
        every row reserved more than a lease ago. A lease is set a lease ahead of its
        reserve, so a row the last rescue could not see yet (not committed) expires after
        it; the whole range is read once a ``RESCUE_WHOLE_EVERY`` all the same."""
        last, whole = self._rescued_at, self._rescued_whole_at
        if last is not None and timedelta(0) <= now - last < RESCUE_EVERY:
            return
        read_whole = (last is None or whole is None
                      or not timedelta(0) <= now - whole < RESCUE_WHOLE_EVERY)
        closed, released = store.jobs_long_rescue_expired(
            now, after=None if read_whole or last is None else last - RESCUE_LAG)
        self._rescued_at = now
        if read_whole:
            self._rescued_whole_at = now
        announce_closed(closed)
        if released:
            logger.warning("long lane released %s rows whose lease expired", released)

    def due_in_s(self) -> float | None:
        """Seconds until the next deferred row comes due, when the last poll found nothing
        due: the worker waits no longer (``run_after`` is honoured to the poll, not to the
        next idle poll)."""
        if self._next_due_at is None:
            return None
        return max(0.0, self._next_due_at - self._monotonic())

    def _run_in_thread(self, job: Job, token: str, clock: DatabaseClock, running: LongLaneTry,
                       probe: bool) -> None:
        try:
            self._run(job, token, clock, running, probe)
        except Exception as exc:
            if is_database_fault(exc):
                self.outages.failed(exc, "long lane")  # drops the thread's connection
            else:
                logger.exception("long lane job %s failed outside its handler", job.id)
                # Each pool thread keeps its own connection: drop it if it broke. Only
                # then: Django would otherwise check it (or, with CONN_MAX_AGE 0, reopen
                # it) after every job.
                connection.close_if_unusable_or_obsolete()

    def _run(self, job: Job, token: str, clock: DatabaseClock, running: LongLaneTry,
             probe: bool) -> None:
        """Run the started job's handler and judge it once; its slot is free as soon as
        the handler returned, its outcome goes to the writer (without threads: written
        here). The row stays in hand until the outcome is written."""
        assert job.id is not None
        started = self._monotonic()
        result: RunResult | None = None
        try:
            target: Target | None
            try:
                target = get_target(job.target)
            except UnknownTarget as exc:
                target, answer = None, Answer(exc)
            else:
                with try_context(running):
                    answer = call_handler(target, job)
            duration_ms = (self._monotonic() - started) * 1000
            with self._lock:
                self._handler_ms = duration_ms if self._handler_ms is None else (
                    self._handler_ms + (duration_ms - self._handler_ms) * HANDLER_MS_WEIGHT)
            finished_at = clock()
            result = RunResult(job, judge(job, target, answer.error, finished_at), duration_ms,
                               answer.result_json, try_entry(self.worker_id, running.started_at,
                                                             finished_at, answer.error))
        finally:
            with self._lock:
                self._running -= 1
                if job.delivery_mode == _AT_MOST_ONCE:
                    self._running_at_most_once -= 1
            if result is None:  # failed outside its handler: the lease rescue takes it
                self._settle(job, None, False)
        if self._writer is None:
            self._write([(token, result, probe, clock)])
            return
        self._outcomes.put((token, result, probe, clock))
        if job.limit_key is None:  # a limited row's slot is free once its outcome is
            self.on_row_done()  # written (``_settle`` pokes then): a poll now finds it held

    def _write_outcomes(self) -> None:
        """The writer thread: every outcome queued while it wrote the last ones goes in
        one transaction per claim token (group commit)."""
        stopping = False
        while not stopping:
            batch = [self._outcomes.get()]
            while True:
                try:
                    batch.append(self._outcomes.get_nowait())
                except queue.Empty:
                    break
            stopping = None in batch
            items = [item for item in batch if item is not None]
            if not items:
                continue
            try:
                self._write(items)
            except Exception as exc:
                if is_database_fault(exc):
                    self.outages.failed(exc, "long-lane outcome")
                else:
                    logger.exception("long lane could not write the outcomes of jobs %s",
                                     ", ".join(str(item[1].job.id) for item in items))
                for _, result, _, _ in items:  # not written: the lease rescue takes them
                    self._settle(result.job, None, False)
        close_quietly()

    def _write(self, items: list[tuple[str, RunResult, bool, DatabaseClock]]) -> None:
        """Write the outcomes, then free their slots."""
        by_token: dict[str, list[RunResult]] = {}
        for token, result, _, _ in items:
            by_token.setdefault(token, []).append(result)
        for token, results in by_token.items():
            self._record(token, results, items[-1][3])
        if any(runs_exclusively(result.job.target) for _, result, _, _ in items):
            self._code_freed = True
        for _, result, probe, _ in items:
            self._settle(result.job, result, probe)

    def _settle(self, job: Job, result: RunResult | None, probe: bool) -> None:
        """The row is out of hand: its slot is free (and an answered probe resumes its
        target)."""
        if probe and result is not None and not result.outcome.pause_target:
            self.pauses.probe_answered(job.target)
        assert job.id is not None, "reserved: a stored row"
        with self._lock:
            self._in_hand.pop(job.id, None)
        self.on_row_done()

    def _record(self, token: str, results: list[RunResult], clock: Callable[[], datetime]
                ) -> None:
        """Write the rows' outcomes, again and again on a fresh connection while the
        database is unreachable: the handler ran, and what it did must not be lost. The row
        stays in hand meanwhile, so the heartbeat renews its lease once the database is
        back; a rescue that presumed it DEAD is overwritten (``store.Guard``). Gives up
        only when the worker is stopping and the lease has surely run out."""
        stop_by = self._monotonic() + self.settings.LONG_LEASE_S
        failures = 0
        while True:
            try:
                record(store.Guard(Lane.LONG, token), results, clock(), self.settings)
            except Exception as exc:
                if not is_database_fault(exc):
                    raise
                self.outages.failed(exc, "long-lane outcome")
                failures += 1
                if self.should_stop() and self._monotonic() > stop_by:
                    logger.error("long lane gave up writing the outcomes of jobs %s while "
                                 "stopping: the database is still unreachable",
                                 ", ".join(f"{r.job.id} ({r.outcome.kind.value})"
                                           for r in results))
                    return
                self._sleep(backoff_s(failures))
                continue
            self.outages.succeeded()
            return

    def renew(self, now: datetime | None = None) -> int:
        """Heartbeat: extend the leases of rows in hand; returns how many were renewed."""
        with self._lock:
            held = dict(self._in_hand)
        if not held:
            return 0
        renewed = store.jobs_long_renew(held, now or store.db_now(), self.settings.LONG_LEASE_S)
        lost = set(held.values()) - renewed
        if lost:
            logger.warning("long lane could not renew %s claim(s); their outcomes will be refused",
                           len(lost))
        return len(renewed)

    def shutdown(self, wait: bool = True) -> None:
        """Finish the rows in hand (their leases keep being renewed by the heartbeat)."""
        if self._pool is not None:
            self._pool.shutdown(wait=wait)
        if self._writer is not None:
            self._outcomes.put(None)
            if wait:
                self._writer.join()
