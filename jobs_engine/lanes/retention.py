"""Retention: DEAD rows older than ``DEAD_TTL_DAYS`` are deleted by the workers.

Each worker's heartbeat thread asks ``DeadPruner.maybe_run`` after every beat; it prunes
at most once per ``every_s`` (an hour), in batches, within a small time budget so the
heartbeat is never late. Several workers pruning at once skip each other's rows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from jobs_engine import store
from jobs_engine.conf import JobsSettings

logger = logging.getLogger("jobs_engine")

PRUNE_EVERY_S = 3600.0
PRUNE_BATCH = 5000
PRUNE_BUDGET_S = 2.0


def prune_dead(now: datetime, settings: JobsSettings, *, batch: int = PRUNE_BATCH,
               budget_s: float = PRUNE_BUDGET_S,
               monotonic: Callable[[], float] = time.monotonic) -> int:
    """Delete DEAD rows closed more than ``DEAD_TTL_DAYS`` before ``now``; returns how
    many. Stops after ``budget_s``; the next run goes on where this one stopped."""
    cutoff = now - timedelta(days=settings.DEAD_TTL_DAYS)
    started = monotonic()
    total = 0
    while True:
        deleted = store.jobs_delete_dead_closed_before(cutoff, batch)
        total += deleted
        if deleted < batch or monotonic() - started >= budget_s:
            break
    if total:
        logger.info("pruned %s DEAD jobs closed before %s (DEAD_TTL_DAYS=%s)", total,
                    cutoff.isoformat(), settings.DEAD_TTL_DAYS)
    return total


class DeadPruner:
    """Runs ``prune_dead`` at most once per ``every_s`` of this process's clock."""

    def __init__(self, settings: JobsSettings, *, every_s: float = PRUNE_EVERY_S,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.every_s = every_s
        self._monotonic = monotonic
        self._due = monotonic()  # the first beat prunes: a restarted worker catches up

    def maybe_run(self, now: datetime | None = None) -> int | None:
        """Prune when due; returns the rows deleted, or None when not due. Never raises:
        a failed prune is logged and tried again at the next due time."""
        clock = self._monotonic()
        if clock < self._due:
            return None
        self._due = clock + self.every_s
        try:
            return prune_dead(now or store.db_now(), self.settings, monotonic=self._monotonic)
        except Exception:
            logger.exception("pruning DEAD jobs failed")
            return 0
