"""Fast-lane partition leases: liveness rows, fair-share rebalancing, self-fencing.

Each worker holds a fair share of the ``PARTITIONS`` rows, renewed every
``PARTITION_HEARTBEAT_S``. Ownership is decided by conditional updates on the database
clock; the worker's own monotonic clock only bounds how long it trusts its last renewal,
so a worker that cannot renew (database gone, process paused) stops sending before its
lease can be taken over.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from jobs_engine import store
from jobs_engine.conf import JobsSettings
from jobs_engine.lanes import outcomes
from jobs_engine.lanes.clock import trust_s
from jobs_engine.lanes.outage import Outages

logger = logging.getLogger("jobs_engine")


def new_worker_id() -> str:
    """Unique per process lifetime: a restarted pod with the same pid never reuses one."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def fair_share(partitions: int, owner: str, live: list[str], counts: dict[str, int]) -> int:
    """How many partitions ``owner`` may hold.

    ceil(partitions / live workers); while another live worker is below the floor, hold at
    most the floor so it can catch up (e.g. 64 over 3 workers ends 22/21/21).
    """
    workers = set(live) | {owner}
    share = math.ceil(partitions / len(workers))
    floor = max(partitions // len(workers), 1)
    if any(counts.get(other, 0) < floor for other in workers if other != owner):
        return floor
    return share


@dataclass
class HeartbeatCounts:
    held: int = 0
    taken: list[int] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    closed: int = 0


class PartitionLeases:
    """The partitions this worker holds, and until when it trusts each lease."""

    def __init__(self, worker_id: str, settings: JobsSettings, *, lanes: str = "fast",
                 monotonic: Callable[[], float] = time.monotonic,
                 outages: Outages | None = None) -> None:
        self.worker_id = worker_id
        self.settings = settings
        self.lanes = lanes
        self._monotonic = monotonic
        self.outages = outages or Outages(worker_id, monotonic)
        # Tokens of this worker's own in-flight marks whose outcomes wait to be written
        # (after a database fault); a partition taken back with one is not judged. The
        # fast lane of this worker sets it.
        self.own_unwritten: Callable[[], frozenset[str]] = frozenset
        self._lock = threading.Lock()
        self._trusted_until: dict[int, float] = {}
        self.busy: set[int] = set()  # partitions whose rows are being sent right now

    # -- what the send loop asks -----------------------------------------------------

    def held(self) -> list[int]:
        """Partitions whose lease this worker still trusts."""
        clock = self._monotonic()
        with self._lock:
            return sorted(p for p, until in self._trusted_until.items() if until > clock)

    def trusted(self, partition: int) -> bool:
        with self._lock:
            return self._trusted_until.get(partition, 0.0) > self._monotonic()

    def drop(self, partition: int) -> None:
        """Forget a partition whose lease turned out to be lost."""
        with self._lock:
            self._trusted_until.pop(partition, None)

    # -- the heartbeat -------------------------------------------------------------

    def _trust(self, partitions: list[int], renewed_at: float) -> None:
        # Trust a renewal for the lease minus a margin, measured from before the request.
        until = renewed_at + trust_s(self.settings.PARTITION_LEASE_S)
        with self._lock:
            for partition in partitions:
                self._trusted_until[partition] = until

    def heartbeat(self, now: datetime | None = None) -> HeartbeatCounts:
        """Beat, renew, rebalance to the fair share and judge rows taken over."""
        started = self._monotonic()
        now = now or store.db_now()
        settings = self.settings
        counts = HeartbeatCounts()
        store.worker_beat(self.worker_id, now, hostname=socket.gethostname(), pid=os.getpid(),
                          lanes=self.lanes, outages=self.outages.record())
        held = store.partitions_renew_if_owner(self.worker_id, now, settings.PARTITION_LEASE_S)
        with self._lock:
            counts.lost = sorted(set(self._trusted_until) - set(held))
            self._trusted_until = {p: u for p, u in self._trusted_until.items() if p in held}
        self._trust(held, started)
        for partition in counts.lost:
            logger.warning("partition lease lost partition=%s worker=%s", partition, self.worker_id)

        # Only fast-lane workers share the partitions: a pod that runs only the long lane or
        # the schedules must not shrink the fast workers' shares (leaving partitions unowned).
        live = store.workers_live(now, settings.PARTITION_LEASE_S, lane="fast")
        owner_counts = store.partition_owner_counts(now)
        share = fair_share(settings.PARTITIONS, self.worker_id, live, owner_counts)
        if len(held) > share:
            spare = [p for p in reversed(held) if p not in self.busy][: len(held) - share]
            if spare:
                with self._lock:
                    for partition in spare:
                        self._trusted_until.pop(partition, None)
                store.partitions_release(self.worker_id, spare)
                counts.released = sorted(spare)
        while len(held) - len(counts.released) + len(counts.taken) < share:
            taken = store.partition_take_free(self.worker_id, now, settings.PARTITION_LEASE_S)
            if taken is None:
                break
            # This worker's own marks, left by a database outage longer than the lease, are
            # not judged: the fast lane writes what happened to those rows, and clears them.
            closed = store.inflight_close_after_takeover(taken, now, self.own_unwritten())
            outcomes.announce_closed(closed)
            counts.closed += len(closed)
            counts.taken.append(taken.partition)
            self._trust([taken.partition], started)
        counts.held = len(self.held())
        if counts.taken or counts.released:
            logger.info("partitions rebalanced worker=%s held=%s taken=%s released=%s",
                        self.worker_id, counts.held, counts.taken, counts.released)
        return counts

    def release_all(self) -> None:
        """Clean shutdown: give every partition back and delete the liveness row."""
        with self._lock:
            self._trusted_until.clear()
        store.partitions_release_owned(self.worker_id)
        store.worker_delete(self.worker_id)
