"""Time as the lanes reckon it: the database's clock, and how long to trust a lease.

Lease and schedule decisions are made on the database's clock, so workers with skewed
clocks stay correct; asking the database at every decision would cost a round trip each,
so a step reads it once and moves it on with this process's monotonic clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta


class DatabaseClock:
    """The database's time at the start of a step, moved on by the monotonic clock."""

    def __init__(self, start: datetime, monotonic: Callable[[], float] = time.monotonic
                 ) -> None:
        self.start = start
        self._monotonic = monotonic
        self.started = monotonic()  # when ``start`` was read, on the monotonic clock

    def __call__(self) -> datetime:
        return self.start + timedelta(seconds=self._monotonic() - self.started)


class DatabaseTime:
    """The database's clock as a polling lane reads it: asked at most once every
    ``every_s`` seconds (``read``: the database's answer), moved on by the monotonic clock
    in between. A busy lane polls hundreds of times a second; a round trip each for the
    time would be one more per poll, and the wake-up's latency."""

    def __init__(self, read: Callable[[], datetime],
                 monotonic: Callable[[], float] = time.monotonic, every_s: float = 1.0
                 ) -> None:
        self._read = read
        self._monotonic = monotonic
        self._every_s = every_s
        self._clock: DatabaseClock | None = None

    def now(self, *, defer_read: bool = False) -> datetime:
        """``defer_read``: a reading that fell due is taken at the next call instead (a poll
        answering a wake-up goes straight to its rows; the monotonic clock carries the
        last reading over the sleep)."""
        if self._clock is None or (
                not defer_read and self._monotonic() - self._clock.started > self._every_s):
            self._clock = DatabaseClock(self._read(), self._monotonic)
        return self._clock()


def trust_s(lease_s: float) -> float:
    """How long after asking for a renewal a worker trusts its lease: the lease minus a
    margin (a tenth, at most a second) for the time the answer took to arrive."""
    return lease_s - min(1.0, lease_s * 0.1)
