"""Retention: what the workers keep of finished jobs, and the jobs no handler takes.

Every ``RETENTION_S`` each worker, from its heartbeat thread and within a small time budget
so the heartbeat is never late:

- keeps the newest ``keep_completed`` completed jobs and ``keep_failed`` DEAD jobs of each
  target (its policy; ``DEFAULT_POLICY`` for a target this process does not know) and
  removes the rest, in small batches;
- removes DEAD jobs closed more than ``DEAD_TTL_DAYS`` ago, whatever the counts;
- removes flows finished more than ``FLOW_RETENTION_DAYS`` ago, with their steps and their
  step jobs (which the counts and the TTL above leave alone);
- adds the statistics each session counted (its shards) to the hourly buckets, one row per
  hour, target and outcome (``store.job_stats_fold_shards``);
- removes the buckets of limits' keys unused for ``IDLE_BUCKET`` (or the time their rate
  takes to refill, if longer), which a new one would equal (``store.limit_buckets_prune``);
- gives the long lane's PENDING rows of a target whose limits a deploy changed the key
  they need: none for a target without limits now, at every pass (``store.limits_unkey``);
  the key its limits use for rows of a limited target enqueued before, at the first pass
  and every ``REKEY_EVERY`` after it (``store.limits_rekey``: their lookup walks the
  index of rows without limits);
- closes as DEAD the PENDING rows of targets no handler here takes that have been due for
  ``UNHANDLED_GRACE_S`` (a deploy removed the target, a typo in a data migration): "no
  handler registered for <target>". The grace lets a rolling deploy bring up the workers of
  a release that added a target before an older worker gives up on its rows.

Several workers at once skip each other's rows. ``run_once`` does one pass (tests call it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial

from django.db import transaction

from jobs_engine import store
from jobs_engine.conf import JobsSettings
from jobs_engine.lanes.outage import is_database_fault
from jobs_engine.limits import Rate
from jobs_engine.registry import all_targets, policy_for
from jobs_engine.signals import announce_dead
from jobs_engine.states import Lane

logger = logging.getLogger("jobs_engine")

BATCH = 5000
BUDGET_S = 2.0
IDLE_BUCKET = timedelta(hours=1)
REKEY_EVERY = 10  # passes


@dataclass
class RetentionCounts:
    completed: int = 0  # completed jobs removed past their target's keep_completed
    failed: int = 0  # DEAD jobs removed past keep_failed or DEAD_TTL_DAYS
    flows: int = 0  # flows removed FLOW_RETENTION_DAYS after they finished, with their jobs
    unhandled: int = 0  # PENDING rows closed DEAD: no handler registered
    buckets: int = 0  # idle buckets of limits' keys removed
    rekeyed: int = 0  # rows given the key their target's limits use now


class RetentionService:
    """Runs ``run_once`` at most once per ``RETENTION_S`` of this process's clock."""

    def __init__(self, settings: JobsSettings, *, batch: int = BATCH,
                 budget_s: float = BUDGET_S,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.batch = batch
        self.budget_s = budget_s
        self._monotonic = monotonic
        self._due = monotonic()  # the first beat prunes: a restarted worker catches up
        self._passes = 0

    def maybe_run(self, now: datetime | None = None) -> RetentionCounts | None:
        """A pass when due; None when not. A failed pass is logged in full and tried again
        at the next due time; a database fault is raised, for the worker to ride out as an
        outage (logged once, without a traceback: a connection cut mid-pass is no bug)."""
        clock = self._monotonic()
        if clock < self._due:
            return None
        self._due = clock + self.settings.RETENTION_S
        try:
            return self.run_once(now or store.db_now())
        except Exception as exc:
            if is_database_fault(exc):
                raise
            logger.exception("retention pass failed")
            return RetentionCounts()

    def run_once(self, now: datetime) -> RetentionCounts:
        counts = RetentionCounts()
        deadline = self._monotonic() + self.budget_s
        for target in store.done_targets():
            counts.completed += self._drain(partial(
                store.done_prune_beyond, target, policy_for(target).keep_completed,
                self.batch), deadline)
        for target in store.dead_targets():
            counts.failed += self._drain(partial(
                store.dead_prune_beyond, target, policy_for(target).keep_failed,
                self.batch), deadline)
        cutoff = now - timedelta(days=self.settings.DEAD_TTL_DAYS)
        counts.failed += self._drain(
            lambda: store.jobs_delete_dead_closed_before(cutoff, self.batch), deadline)
        flows_cutoff = now - timedelta(days=self.settings.FLOW_RETENTION_DAYS)
        counts.flows = self._drain(lambda: self._delete_flows(flows_cutoff), deadline)
        store.job_stats_fold_shards()
        for limited in all_targets():
            for limit in limited.limits.limits:
                idle = max(IDLE_BUCKET, timedelta(seconds=limit.burst / limit.per_second)
                           if isinstance(limit, Rate) and limit.burst else IDLE_BUCKET)
                counts.buckets += self._drain(partial(
                    store.limit_buckets_prune, limited.name, limit.name, now - idle, now,
                    self.batch), deadline)
        long_targets = [t for t in all_targets() if t.lane is Lane.LONG and not t.lossy]
        counts.rekeyed += self._drain(partial(
            store.limits_unkey, [t.name for t in long_targets if not t.limits], self.batch),
            deadline)
        if self._passes % REKEY_EVERY == 0:
            for limited in (t for t in long_targets if t.limits):
                counts.rekeyed += self._drain(partial(store.limits_rekey, limited, self.batch),
                                              deadline)
        self._passes += 1
        counts.unhandled = self._close_unhandled(now)
        if counts.completed or counts.failed or counts.flows or counts.unhandled:
            logger.info("retention removed completed=%s failed=%s flows=%s; closed "
                        "unhandled=%s", counts.completed, counts.failed, counts.flows,
                        counts.unhandled)
        return counts

    def _delete_flows(self, cutoff: datetime) -> int:
        """One batch of flows finished before ``cutoff``, each with its steps and their jobs
        (one transaction: a flow never loses its steps alone)."""
        with transaction.atomic():
            return store.flows_delete(store.flows_finished_before(cutoff, self.batch))

    def _drain(self, step: Callable[[], int], deadline: float) -> int:
        """``step`` (one batch) again while it fills a batch and time is left."""
        total = 0
        while self._monotonic() < deadline:
            removed = step()
            total += removed
            if removed < self.batch:
                break
        return total

    def _close_unhandled(self, now: datetime) -> int:
        known = {target.name for target in all_targets()}
        due_before = now - timedelta(seconds=self.settings.UNHANDLED_GRACE_S)
        closed = []
        for target in store.pending_targets():
            if target not in known:
                closed += store.jobs_close_unhandled(target, due_before, now, self.batch)
        for job in closed:
            announce_dead(job.id, job.target, job.code, job.dedupe_key, job.reason)
        return len(closed)
