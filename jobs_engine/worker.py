"""A worker process: the lanes it runs, its heartbeat thread, wake-ups and shutdown.

The main thread polls the lanes; a heartbeat thread renews the liveness row, partition
leases and long-lane claims, so a slow send or a minutes-long handler never lets a lease
lapse. SIGTERM/SIGINT: stop polling, finish the rows in hand, release the partitions,
delete the liveness row, exit 0.
"""

from __future__ import annotations

import contextlib
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
from typing import Any

from django.db import close_old_connections, connection

from jobs_engine import store
from jobs_engine.conf import JobsSettings, jobs_settings
from jobs_engine.fast_lane import FastLane
from jobs_engine.leases import PartitionLeases, new_worker_id
from jobs_engine.long_lane import LongLane
from jobs_engine.pauses import PauseGate
from jobs_engine.retention import DeadPruner

logger = logging.getLogger("jobs_engine")

FAST, LONG = "fast", "long"
SCHEDULES = "schedules"  # served by a companion app through ``register_service``

# A lane served by another app (``schedules``): the engine imports no such app; the app
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


class Wakeup:
    """Sleeps until the next poll, woken early by a NOTIFY (PostgreSQL), a poke (a
    long-lane slot came free) or a stop request. A self-pipe makes pokes and signals
    interrupt the wait at once."""

    def __init__(self, listen: bool) -> None:
        self._stop = threading.Event()
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._listener: Any = None
        if listen and store.is_postgres():
            import psycopg

            params = connection.get_connection_params()
            params.pop("cursor_factory", None)
            params.pop("context", None)
            self._listener = psycopg.connect(**params, autocommit=True)
            self._listener.execute(f"LISTEN {store.NOTIFY_CHANNEL}")

    def poke(self) -> None:
        # A full pipe already means "wake up"; a closed one, shutting down.
        with contextlib.suppress(OSError):
            os.write(self._write_fd, b"!")

    def stop(self) -> None:
        self._stop.set()
        self.poke()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def wait(self, seconds: float) -> None:
        if seconds <= 0 or self._stop.is_set():
            return
        fds = [self._read_fd]
        if self._listener is not None:
            fds.append(self._listener.fileno())
        ready, _, _ = select.select(fds, [], [], seconds)
        if self._read_fd in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(self._read_fd, 4096):
                    pass
        if self._listener is not None and self._listener.fileno() in ready:
            for _ in self._listener.notifies(timeout=0):
                pass

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        os.close(self._read_fd)
        os.close(self._write_fd)


class WorkerProcess:
    def __init__(self, lanes: set[str], settings: JobsSettings | None = None) -> None:
        self.settings = settings or jobs_settings()
        self.lanes = lanes
        self.worker_id = new_worker_id()
        self.pauses = PauseGate(self.worker_id, self.settings)
        self.leases = PartitionLeases(self.worker_id, self.settings, lanes=",".join(sorted(lanes)))
        self.fast = FastLane(self.worker_id, self.settings, self.leases, self.pauses,
                             should_stop=lambda: self.wakeup is not None and self.wakeup.stopping)
        self.long = (LongLane(self.worker_id, self.settings, self.pauses,
                              on_row_done=self._poke) if LONG in lanes else None)
        self.services: list[Callable[[], float]] = []  # extra loops (schedules) -> next delay
        for lane in sorted(lanes - {FAST, LONG}):
            if lane in _service_factories:
                self.services.append(_service_factories[lane](self))
            else:
                logger.warning("worker lane %s requested but no installed app serves it", lane)
        self.wakeup: Wakeup | None = None
        self._heartbeat_ok_until = 0.0
        self._stop_beats = threading.Event()
        self.pruner = DeadPruner(self.settings)  # DEAD_TTL_DAYS, at most once an hour

    def _poke(self) -> None:
        if self.wakeup is not None:
            self.wakeup.poke()

    # -- lifecycle ------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        def on_signal(signum: int, _frame: FrameType | None) -> None:
            logger.info("worker %s got signal %s: finishing and shutting down", self.worker_id,
                        signal.Signals(signum).name)
            if self.wakeup:
                self.wakeup.stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def run(self) -> None:
        self.wakeup = Wakeup(self.settings.NOTIFY)
        self.install_signal_handlers()
        store.partitions_seed(self.settings.PARTITIONS)
        self._beat()
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
        while not self.wakeup.stopping:
            delays = []
            handled_total = 0
            if time.monotonic() < self._heartbeat_ok_until:
                if FAST in self.lanes:
                    handled = self._guarded(self.fast.run_once)
                    handled_total += handled
                    delays.append(next_poll_delay(handled, idle, self.settings))
                if self.long is not None:
                    handled = self._guarded(self.long.run_once)
                    handled_total += handled
                    delays.append(next_poll_delay(handled, idle, self.settings))
            for service in self.services:
                delays.append(self._guarded_delay(service))
            idle = 0 if handled_total else idle + 1
            self.wakeup.wait(min(delays) if delays else self.settings.POLL_S)

    def _guarded(self, step: Callable[[], int]) -> int:
        try:
            return step()
        except Exception:
            # A lost database connection must not kill the worker: log, reconnect, go on.
            logger.exception("worker %s poll failed", self.worker_id)
            close_old_connections()
            connection.close()
            return 0

    def _guarded_delay(self, service: Callable[[], float]) -> float:
        try:
            return service()
        except Exception:
            logger.exception("worker %s service failed", self.worker_id)
            connection.close()
            return self.settings.POLL_S

    # -- heartbeat --------------------------------------------------------------------------

    def _beat(self) -> None:
        started = time.monotonic()
        now = store.db_now()
        if FAST in self.lanes:
            self.leases.heartbeat(now)
        else:
            store.worker_beat(self.worker_id, now, hostname=socket.gethostname(), pid=os.getpid(),
                              lanes=self.leases.lanes)
        if self.long is not None:
            self.long.renew(now)
        # Self-fencing: take new work only while the last beat is fresh.
        self._heartbeat_ok_until = started + self.settings.PARTITION_LEASE_S - min(
            1.0, self.settings.PARTITION_LEASE_S * 0.1)

    def _heartbeat_loop(self) -> None:
        interval = min(self.settings.PARTITION_HEARTBEAT_S, self.settings.LONG_HEARTBEAT_S)
        while not self._stop_beats.wait(interval):
            try:
                self._beat()
                self.pruner.maybe_run()
            except Exception:
                logger.exception("worker %s heartbeat failed", self.worker_id)
                connection.close()
        connection.close()

    def _shutdown(self, beat: threading.Thread) -> None:
        # The heartbeat keeps renewing claims while the long-lane rows in hand finish.
        if self.long is not None:
            self.long.shutdown(wait=True)
        self._stop_beats.set()
        beat.join()
        try:
            self.leases.release_all()
        except Exception:
            logger.exception("worker %s could not release its partitions", self.worker_id)
        if self.wakeup is not None:
            self.wakeup.close()
        logger.info("worker %s stopped", self.worker_id)
