"""Database outages as a worker process lives through them.

A worker holds several connections (the poll's, the heartbeat's, the LISTEN one, one per
long-lane thread). When PostgreSQL restarts or the network drops, each of them fails; the
worker must ride it out: log one line when the outage starts and one when it ends (not a
traceback per poll), back off while it lasts, reconnect, and carry on. ``Outages`` is that
shared memory; ``is_database_fault`` tells an outage from a bug.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from django.db import InterfaceError, OperationalError, connection
from django.utils import timezone

from jobs_engine.store import OutageRecord

logger = logging.getLogger("jobs_engine")

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 5.0
# Past these doublings BACKOFF_FIRST_S is past BACKOFF_MAX_S.
_BACKOFF_DOUBLINGS = math.ceil(math.log2(BACKOFF_MAX_S / BACKOFF_FIRST_S))


def is_database_fault(exc: BaseException) -> bool:
    """Whether ``exc`` says the database could not be reached or dropped the connection
    (as opposed to a statement it refused, which is a bug to report in full)."""
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    try:  # the LISTEN connection is a plain psycopg one, outside Django's wrappers
        import psycopg
    except ImportError:
        return False
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)


def backoff_s(failures: int) -> float:
    """Seconds to wait after ``failures`` failures in a row: 0.5, 1, 2, 4, then 5. The
    exponent is bounded: the long lane's outcome write counts its failures for as long as
    an outage lasts, and 2 ** 1024 does not fit a float."""
    return min(BACKOFF_FIRST_S * 2.0 ** min(max(failures - 1, 0), _BACKOFF_DOUBLINGS),
               BACKOFF_MAX_S)


class Outages:
    """One per worker process, shared by its threads."""

    def __init__(self, worker_id: str, monotonic: Callable[[], float] = time.monotonic,
                 drop_connection: Callable[[], None] | None = None) -> None:
        self.worker_id = worker_id
        self._monotonic = monotonic
        # After a fault the thread's connection is broken: drop it, so the next query opens
        # a fresh one (tests inside a transaction keep theirs).
        self._drop_connection = drop_connection or close_quietly
        self._lock = threading.Lock()
        self._since: float | None = None  # monotonic start of the current outage
        self._record = OutageRecord()

    @property
    def ongoing(self) -> bool:
        with self._lock:
            return self._since is not None

    def record(self) -> OutageRecord:
        with self._lock:
            return self._record

    def failed(self, exc: BaseException, where: str) -> None:
        """A connection failed: the first failure of an outage is logged, once; the
        thread's connection is dropped every time."""
        self._drop_connection()
        with self._lock:
            if self._since is not None:
                return
            self._since = self._monotonic()
            count = self._record.count + 1
            self._record = OutageRecord(count, timezone.now(), 0.0, str(exc).strip()[:500])
        first_line = (self._record.last_error.splitlines() or [""])[0]
        logger.warning("database unreachable worker=%s where=%s error=%s (retrying with "
                       "backoff; work in hand is kept until its outcome is written)",
                       self.worker_id, where, first_line)

    def succeeded(self) -> None:
        """A statement went through: an ongoing outage is over."""
        since = self._since  # read once, unlocked: checked again under the lock
        if since is None:  # the hot path: no lock
            return
        with self._lock:
            if self._since is None:
                return
            lasted = self._monotonic() - self._since
            self._since = None
            self._record = OutageRecord(self._record.count, self._record.last_at, lasted,
                                        self._record.last_error)
        logger.warning("database reachable again worker=%s after %.1f s", self.worker_id, lasted)


def close_quietly() -> None:
    """Drop this thread's Django connection; closing a broken one may raise too."""
    try:
        connection.close()
    except Exception:
        logger.debug("closing a broken connection failed", exc_info=True)
