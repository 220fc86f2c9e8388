"""A worker process: the lanes it runs, its heartbeat thread, wake-ups and shutdown.

The main thread polls the lanes; a heartbeat thread renews the liveness row, partition
leases and long-lane claims, so a slow send or a minutes-long handler never lets a lease
lapse. SIGTERM/SIGINT: stop polling, finish the rows in hand, release the partitions,
delete the liveness row, exit 0.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, NamedTuple

from django.db import connection

from jobs_engine import store
from jobs_engine.conf import JobsSettings, jobs_settings
from jobs_engine.lanes.clock import trust_s
from jobs_engine.lanes.fast import FastLane
from jobs_engine.lanes.long import LongLane
from jobs_engine.lanes.outage import Outages, backoff_s, close_quietly, is_database_fault
from jobs_engine.lanes.partitions import PartitionLeases, new_worker_id
from jobs_engine.lanes.pauses import PauseGate
from jobs_engine.lanes.retention import RetentionService
from jobs_engine.readiness import check_database, unreachable
from jobs_engine.states import Lane

logger = logging.getLogger("jobs_engine")

SCHEDULES = "schedules"  # served by a companion app through ``register_service``

# A lane served by another app (``contrib.schedules``): the engine imports no such app; the app
# registers a factory here from its ``ready()``. A worker running that lane calls the
# factory once and then the returned callable on every loop; it answers the seconds
# until it wants to run again.
ServiceFactory = Callable[["WorkerProcess"], Callable[[], float]]
_service_factories: dict[str, ServiceFactory] = {}


# A fast-lane poll builds tens of thousands of short-lived objects (rows, jobs, records,
# results) that reference counting frees; with the default gen-0 threshold (700) the cycle
# collector runs dozens of times per poll and rescans the survivors (a Kafka worker drained
# ~15 % faster without it). So: fewer gen-0 runs, and the objects that live as long as the
# process (modules, settings, registry) frozen out of every scan.
GC_GEN0_THRESHOLD = 10_000

# The LISTEN connection after an outage: a connect attempt waits at most this long, and
# the attempts back off from 1 s to 30 s.
LISTEN_CONNECT_TIMEOUT_S = 3
LISTEN_RETRY_FIRST_S = 1.0
LISTEN_RETRY_MAX_S = 30.0
# How soon a worker that asked while an enqueue was open looks again (then doubling, up
# to its sleep): such an enqueue commits within its statement's time in autocommit.
RECHECK_FIRST_S = 0.002


def tune_garbage_collector() -> None:
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(GC_GEN0_THRESHOLD, gen0), gen1, gen2)


def register_service(lane: str, factory: ServiceFactory) -> None:
    """Serve ``lane`` in worker processes that run it (a repeat call replaces the factory)."""
    _service_factories[lane] = factory


def next_poll_delay(handled: int, idle_polls: int, settings: JobsSettings) -> float:
    """A lane that handled rows polls again at once (a key's next version becomes due the
    moment its predecessor is done); an idle lane backs off along ``IDLE_POLL_S``, and a
    NOTIFY ends the wait early."""
    if handled > 0:
        return 0.0
    return settings.IDLE_POLL_S[min(idle_polls, len(settings.IDLE_POLL_S) - 1)]


def drain_notifications(listener: Any) -> list[str]:
    """The payloads of what the LISTEN connection received (``store.wake_payload``).

    Through libpq itself: psycopg's ``notifies()`` generator (its lock, its deadline, a
    ``Notify`` per message) is work on an idle worker's path from the commit to the
    handler. The connection runs no query after its ``LISTEN``, so nothing else reads it.
    A broken connection raises ``psycopg.OperationalError``.
    """
    pgconn = listener.pgconn
    pgconn.consume_input()
    payloads = []
    while (notification := pgconn.notifies()) is not None:
        payloads.append(notification.extra.decode(errors="replace"))
    return payloads


class Wakeup:
    """Sleeps until the next poll, woken early by a NOTIFY (PostgreSQL), a poke (a
    long-lane slot came free) or a stop request. A self-pipe makes pokes and signals
    interrupt the wait at once.

    The LISTEN connection is one more connection a database outage breaks: then the wait
    falls back to the poll delays, and the connection is made again with backoff.
    """

    def __init__(self, listen: bool, outages: Outages | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._stop = threading.Event()
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._poked = False  # a byte is in the pipe, or about to be: no need for another
        self._listen = listen and store.notifications_exist()
        self._outages = outages
        self._monotonic = monotonic
        self._listener: Any = None
        self._listen_failures = 0
        self._listen_again_at = 0.0
        self.notified = False  # the last wait ended with a NOTIFY
        # The fast-lane targets its notifications named (None: every target).
        self.named: frozenset[str] | None = frozenset()
        if self._listen:
            self._connect_listener()

    def _connect_listener(self) -> None:
        import psycopg

        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        params.setdefault("connect_timeout", LISTEN_CONNECT_TIMEOUT_S)
        listener = psycopg.connect(**params, autocommit=True)
        listener.execute(f"LISTEN {store.NOTIFY_CHANNEL}")
        self._listener = listener
        self._listen_failures = 0

    def _listener_failed(self, exc: BaseException) -> None:
        if self._outages is not None:
            self._outages.failed(exc, "listen")
        with contextlib.suppress(Exception):
            self._listener.close()
        self._listener = None
        self._listen_failures += 1
        self._listen_again_at = self._monotonic() + min(
            LISTEN_RETRY_FIRST_S * 2 ** (self._listen_failures - 1), LISTEN_RETRY_MAX_S)

    def _listening(self) -> Any:
        """The LISTEN connection, made again when it broke and its backoff is over."""
        if self._listen and self._listener is None and self._monotonic() >= self._listen_again_at:
            try:
                self._connect_listener()
            except Exception as exc:
                if not is_database_fault(exc):
                    raise
                self._listener_failed(exc)
        return self._listener

    def poke(self) -> None:
        """Wake the wait. One byte stands for every poke until the wait reads it: a busy
        long lane pokes twice a job, and each write is a system call that lets go of the
        GIL (5% of a draining worker's Python time)."""
        if self._poked:
            return
        self._poked = True
        # A full pipe already means "wake up"; a closed one, shutting down.
        with contextlib.suppress(OSError):
            os.write(self._write_fd, b"!")

    def stop(self) -> None:
        self._stop.set()
        self.poke()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` at most; True when something woke the worker before then."""
        self.notified = False
        self.named = frozenset()
        if seconds <= 0 or self._stop.is_set():
            return False
        listener = self._listening()
        fds = [self._read_fd]
        if listener is not None:
            fds.append(listener.fileno())
        ready, _, _ = select.select(fds, [], [], seconds)
        if self._read_fd in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(self._read_fd, 4096):
                    pass
            # After the read: a poke between the two leaves a byte for the next wait, where
            # clearing first could leave the flag set over an empty pipe and lose a poke.
            self._poked = False
        self.notified = listener is not None and listener.fileno() in ready
        if self.notified:
            try:
                self.named = store.wake_targets(drain_notifications(listener))
            except Exception as exc:
                if not is_database_fault(exc):
                    raise
                self._listener_failed(exc)
        return bool(ready)

    @property
    def listening(self) -> bool:
        """A NOTIFY can end the next wait (the LISTEN connection is up, or made again)."""
        return self._listening() is not None

    def close(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(Exception):
                self._listener.close()
        os.close(self._read_fd)
        os.close(self._write_fd)


class Step[T](NamedTuple):
    """What one guarded step of the worker gave (``WorkerProcess._survive``)."""

    value: T
    ok: bool
    database_fault: bool


class WorkerProcess:
    def __init__(self, lanes: set[str], settings: JobsSettings | None = None) -> None:
        self.settings = settings or jobs_settings()
        self.lanes = lanes
        self.worker_id = new_worker_id()
        self.outages = Outages(self.worker_id)
        self.pauses = PauseGate(self.worker_id, self.settings)
        self.leases = PartitionLeases(self.worker_id, self.settings, lanes=",".join(sorted(lanes)),
                                      outages=self.outages)
        self.fast = FastLane(self.worker_id, self.settings, self.leases, self.pauses,
                             should_stop=self._stopping)
        self.long = (LongLane(self.worker_id, self.settings, self.pauses, on_row_done=self._poke,
                              outages=self.outages, should_stop=self._stopping)
                     if Lane.LONG in lanes else None)
        self.services: list[Callable[[], float]] = []  # extra loops (schedules) -> next delay
        for lane in sorted(lanes - {Lane.FAST, Lane.LONG}):
            if lane in _service_factories:
                self.services.append(_service_factories[lane](self))
            else:
                logger.warning("worker lane %s requested but no installed app serves it", lane)
        self.wakeup: Wakeup | None = None
        self.notified_lanes = lanes & {Lane.FAST, Lane.LONG}  # the lanes enqueues wake
        self._heartbeat_ok_until = 0.0
        self._stop_beats = threading.Event()
        self.retention = RetentionService(self.settings)  # keep counts, DEAD_TTL_DAYS, unhandled
        # The planner policy of this process's sessions (``store/planning.py``): on or off by
        # ``PLANNER_POLICY``, before any statement; then told what each poll saw.
        self.planner = store.planner
        self.planner.enable(self.settings.PLANNER_POLICY)

    def _poke(self) -> None:
        if self.wakeup is not None:
            self.wakeup.poke()

    def _stopping(self) -> bool:
        return self.wakeup is not None and self.wakeup.stopping

    # -- lifecycle ------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        def on_signal(signum: int, _frame: FrameType | None) -> None:
            logger.info("worker %s got signal %s: finishing and shutting down", self.worker_id,
                        signal.Signals(signum).name)
            if self.wakeup:
                self.wakeup.stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def start(self) -> None:
        """Reach the database, check its schema, seed the partitions and beat once; a
        database that cannot be reached or is not migrated raises ``DatabaseNotReady``."""
        check_database()
        try:
            self.wakeup = Wakeup(self.settings.NOTIFY, self.outages)
            store.partitions_seed(self.settings.PARTITIONS)
            self._beat()
        except Exception as exc:
            if not is_database_fault(exc):
                raise
            raise unreachable(exc) from None

    def run(self) -> None:
        if self.wakeup is None:
            self.start()
        self.install_signal_handlers()
        tune_garbage_collector()
        beat = threading.Thread(target=self._heartbeat_loop, name="jobs-heartbeat", daemon=True)
        beat.start()
        logger.info("worker %s started lanes=%s", self.worker_id, ",".join(sorted(self.lanes)))
        try:
            self._loop()
        finally:
            self._shutdown(beat)

    def _loop(self) -> None:
        assert self.wakeup is not None
        idle = 0
        failures = 0  # database faults in a row: the loop backs off while they last
        # The poll answers a wake-up: the housekeeping that fell due while the worker slept
        # (the clock's reading, plans, walks, rescues) waits for the poll after it.
        woken = False
        # Enqueues notify a lane only while one of its workers has asked them to
        # (``store.wakeups_wanted``): a worker asks before it sleeps, then polls once more
        # for what committed before it asked. ``asked_at``: when this worker last asked
        # and no NOTIFY answered since.
        asked_at: float | None = None
        ask = checking = False
        # An enqueue was open as the worker asked (``store.wakeups_wanted``: it may have
        # looked before the ask, and then wakes nobody at its commit): the worker looks
        # again after ``recheck_s``, doubled each time it is still open, not its sleep.
        enqueue_open, recheck_s = False, 0.0
        while not self.wakeup.stopping:
            if ask:
                asked = self._survive("wake-up request",
                                      functools.partial(store.wakeups_wanted, self.notified_lanes),
                                      True)
                asked_at = time.monotonic() if asked.ok else None
                enqueue_open = asked.ok and not asked.value
                ask, checking = False, True
            delays = []
            handled_total = 0
            faulted = False
            self.planner.poll_woken(woken)
            if time.monotonic() < self._heartbeat_ok_until:
                steps = ((Lane.FAST, functools.partial(
                    self.fast.run_once, woken=woken, named=self.wakeup.named)),
                         (Lane.LONG, functools.partial(self._run_long, woken=woken)))
                for lane, run_once in steps:
                    if lane not in self.lanes:
                        continue
                    step = self._survive(f"{lane} lane poll", run_once, 0)
                    faulted |= step.database_fault
                    handled_total += step.value
                    quiet = lane is Lane.LONG and self.long is not None and self.long.quiet
                    delays.append(next_poll_delay(0 if quiet else step.value, idle,
                                                  self.settings))
                    lane_runner = self.long if lane is Lane.LONG else self.fast
                    if lane_runner is not None:
                        due_in = lane_runner.due_in_s()
                        if due_in is not None:
                            delays.append(due_in)
            for service in self.services:
                delays.append(self._survive("service", service, self.settings.POLL_S).value)
            # Rows handed: the plans made while there were none are made again (off the
            # wake-up's path: the poll that handed them has run).
            self.planner.queue_busy(bool(handled_total))
            if handled_total:  # a step that ran no statement must not end an outage
                self._survive("statistics", functools.partial(
                    self.planner.analyze_when_behind, handled_total), False)
            idle = 0 if handled_total else idle + (not checking)  # the check is no idle poll
            failures = failures + 1 if faulted else 0
            wait = backoff_s(failures) if faulted else min(delays, default=self.settings.POLL_S)
            recheck = checking and enqueue_open and not handled_total and not faulted and wait > 0
            if recheck:
                recheck_s = min(max(2 * recheck_s, RECHECK_FIRST_S), wait)
                wait = recheck_s
            elif checking or handled_total:
                recheck_s = 0.0
            checking = enqueue_open = False
            if (wait > 0 and not faulted and asked_at is None and self.notified_lanes
                    and self.wakeup.listening):
                ask, woken = True, False
                continue
            slept_through = not self.wakeup.wait(wait)
            if self.wakeup.notified:
                asked_at = None  # answered: ask again before the next sleep
            elif recheck:
                ask = True  # ask again, then look
            elif (slept_through and asked_at is not None
                  and time.monotonic() - asked_at >= self.settings.POLL_S):
                ask = True  # a wake-up lost (its sender died before its commit) ends here
            # Never twice in a row: a worker woken again and again still keeps house.
            woken = not slept_through and not woken

    def _run_long(self, *, woken: bool) -> int:
        assert self.long is not None
        return self.long.run_once(woken=woken)

    def _survive[T](self, where: str, step: Callable[[], T], fallback: T) -> Step[T]:
        """Run one step of the worker (a poll, a service, a beat): a database fault is an
        outage to ride out, anything else a bug to report in full; neither kills the
        worker, and after either the thread's connection is a fresh one."""
        try:
            value = step()
        except Exception as exc:
            if is_database_fault(exc):
                self.outages.failed(exc, where)
                return Step(fallback, ok=False, database_fault=True)
            logger.exception("worker %s %s failed", self.worker_id, where)
            close_quietly()
            return Step(fallback, ok=False, database_fault=False)
        self.outages.succeeded()
        return Step(value, ok=True, database_fault=False)

    # -- heartbeat --------------------------------------------------------------------------

    def _beat(self) -> None:
        started = time.monotonic()
        now = store.db_now()
        if Lane.FAST in self.lanes:
            self.leases.heartbeat(now)
        else:
            store.worker_beat(self.worker_id, now, hostname=socket.gethostname(), pid=os.getpid(),
                              lanes=self.leases.lanes, outages=self.outages.record())
        if self.long is not None:
            self.long.renew(now)
        # Self-fencing: take new work only while the last beat is fresh.
        self._heartbeat_ok_until = started + trust_s(self.settings.PARTITION_LEASE_S)

    def _heartbeat_loop(self) -> None:
        interval = min(self.settings.PARTITION_HEARTBEAT_S, self.settings.LONG_HEARTBEAT_S)
        while not self._stop_beats.wait(interval):
            if self._survive("heartbeat", self._beat, None).ok:
                self._survive("retention", self.retention.maybe_run, None)
        close_quietly()

    def _shutdown(self, beat: threading.Thread) -> None:
        # The heartbeat keeps renewing claims while the long-lane rows in hand finish.
        if self.long is not None:
            self.long.shutdown(wait=True)
        self._write_unwritten_before_exit()
        self._stop_beats.set()
        beat.join()
        try:
            self.leases.release_all()
        except Exception as exc:
            logger.error("worker %s could not release its partitions (%s); their leases run "
                         "out", self.worker_id, exc)
        if self.wakeup is not None:
            self.wakeup.close()
        logger.info("worker %s stopped", self.worker_id)

    def _write_unwritten_before_exit(self) -> None:
        """Outcomes a database fault kept are written before the partitions are given
        back; while the leases last (after that a new owner judges the marks)."""
        give_up_at = time.monotonic() + self.settings.PARTITION_LEASE_S
        failures = 0
        while self.fast.unwritten_tokens():
            try:
                self.fast.write_unwritten()
            except Exception as exc:
                if not is_database_fault(exc) or time.monotonic() > give_up_at:
                    logger.error("worker %s exits with outcomes of %s poll(s) unwritten: %s",
                                 self.worker_id, len(self.fast.unwritten_tokens()), exc)
                    return
                self.outages.failed(exc, "shutdown")
                failures += 1
                time.sleep(backoff_s(failures))
