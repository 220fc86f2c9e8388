"""The fast lane: ordered sends from the partitions this worker holds.

One ``run_once`` reads up to ``FAST_BATCH`` due rows (each the head of its key), and per
partition hands them to their targets in *sends*. Before a send its rows are added to
the partition's in-flight mark under the lease guard; outcomes are written when the
partition's rows are done, so a crash at any point leaves every handed row judged by its
delivery mode on takeover, and every row not handed still PENDING.

A send is one row, except for targets with a batch handler and at-least-once targets
(for which judging a not-yet-handed row "in flight" is harmless: it is sent again): those
hand all their rows of the partition in one send, which is the route to speed.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from itertools import groupby

from jobs_engine import store
from jobs_engine.conf import JobsSettings
from jobs_engine.context import job_context
from jobs_engine.errors import UnknownTarget
from jobs_engine.leases import PartitionLeases
from jobs_engine.outcomes import RunResult, judge, record
from jobs_engine.pauses import PauseGate
from jobs_engine.registry import Job, Target, get_target
from jobs_engine.states import DeliveryMode, Lane

logger = logging.getLogger("jobs_engine")


def handler_job(row: store.JobRow) -> Job:
    return Job(id=row.id, target=row.target, code=row.code, key=row.key, version=row.version,
               payload=row.payload, headers=row.headers, attempts=row.attempts,
               trace_id=row.trace_id, dedupe_key=row.dedupe_key, actor=row.actor,
               created_at=row.created_at)


def call_handler(target: Target, row: store.JobRow) -> BaseException | None:
    with job_context(row.trace_id, {"via": "system", "origin": row.actor}):
        try:
            target.handler(handler_job(row))
        except Exception as exc:  # every failure is an outcome, never a crashed worker
            return exc
    return None


def call_batch_handler(target: Target, rows: Sequence[store.JobRow]
                       ) -> list[BaseException | None]:
    assert target.batch_handler is not None
    with job_context(rows[0].trace_id, {"via": "system"}):
        try:
            results = list(target.batch_handler([handler_job(row) for row in rows]))
        except Exception as exc:
            return [exc] * len(rows)
    if len(results) != len(rows):
        error = RuntimeError(f"batch handler of {target.name} returned {len(results)} results "
                             f"for {len(rows)} jobs")
        return [error] * len(rows)
    return results


def sends_of(rows: Sequence[store.JobRow], targets: dict[str, Target | None]
             ) -> list[list[store.JobRow]]:
    """Split one partition's rows into sends (see the module docstring)."""
    sends: list[list[store.JobRow]] = []
    for name, group in groupby(sorted(rows, key=lambda r: r.target), key=lambda r: r.target):
        group_rows = list(group)
        target = targets[name]
        if target is not None and (target.batch_handler is not None
                                   or target.delivery_mode is DeliveryMode.AT_LEAST_ONCE):
            sends.append(group_rows)
        else:
            sends += [[row] for row in group_rows]
    return sends


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

    def run_once(self, now: datetime | None = None) -> int:
        """One poll and its sends; returns the number of rows handed to targets."""
        held = self.leases.held()
        if not held:
            return 0
        now = now or store.db_now()
        started = self._monotonic()

        def clock() -> datetime:  # the database clock, advanced locally during the batch
            return now + timedelta(seconds=self._monotonic() - started)

        gate = self.pauses.check(now, Lane.FAST)
        rows = store.jobs_fast_due(held, now, self.settings.FAST_BATCH, sorted(gate.skip))
        rows, _, probes = self.pauses.probe_rows(rows, gate, now)  # unsent rows stay PENDING
        handed = 0
        paused: set[str] = set()  # shared by every partition of this poll
        for partition, group in groupby(sorted(rows, key=lambda r: (r.partition, r.id)),
                                        key=lambda r: r.partition):
            self.leases.busy.add(partition)
            try:
                handed += self._send_partition(partition, list(group), probes, clock, paused)
            finally:
                self.leases.busy.discard(partition)
        return handed

    def _send_partition(self, partition: int, rows: list[store.JobRow], probes: frozenset[str],
                        clock: Callable[[], datetime], paused: set[str]) -> int:
        targets: dict[str, Target | None] = {}
        for row in rows:
            try:
                targets[row.target] = get_target(row.target)
            except UnknownTarget:
                targets[row.target] = None
        token = uuid.uuid4().hex
        inflight: list[int] = []
        results: list[RunResult] = []
        for send in sends_of(rows, targets):
            target = targets[send[0].target]
            if send[0].target in paused:
                continue  # the rest of a paused target's batch waits; other targets go on
            if self.should_stop():
                break  # shutting down: rows not handed stay PENDING for the next owner
            if not self.leases.trusted(partition):
                break  # self-fencing: the lease may be gone, send nothing more
            send = self._mark_inflight(partition, send, inflight, token, clock)
            if send is None:
                break
            if not send:
                continue
            inflight += [row.id for row in send]
            sent = self._send(target, send, clock)
            results += sent
            for result in sent:
                if result.outcome.pause_target:
                    paused.add(result.row.target)
        if results:
            now = clock()
            record(store.Guard(Lane.FAST, token), results, now, self.settings)
            for target_name in probes & {r.row.target for r in results} - paused:
                self.pauses.probe_answered(target_name)
        if inflight:
            store.partition_clear_inflight(partition, token)
        return len(results)

    def _mark_inflight(self, partition: int, send: list[store.JobRow], inflight: list[int],
                       token: str, clock: Callable[[], datetime]) -> list[store.JobRow] | None:
        """Mark ``send`` in flight; returns the rows to hand (rows closed meanwhile, e.g.
        by a takeover or an admin, are left out), or None when the lease is lost."""
        for _ in range(2):
            pairs = [(row.id, row.attempts) for row in send]
            if store.partition_mark_inflight_if_leased(
                    partition, self.worker_id, clock(), [*inflight, *(r.id for r in send)],
                    token, pairs):
                return send
            pending = store.jobs_still_pending(pairs)
            if len(pending) == len(send):
                break  # every row is fine: the lease is what failed
            send = [row for row in send if row.id in pending]
            if not send:
                return []
        logger.warning("partition lease lost before send partition=%s worker=%s",
                       partition, self.worker_id)
        self.leases.drop(partition)
        return None

    def _send(self, target: Target | None, send: list[store.JobRow],
              clock: Callable[[], datetime]) -> list[RunResult]:
        started = self._monotonic()
        if target is None:
            errors: list[BaseException | None] = [
                UnknownTarget(send[0].target)] * len(send)
        elif target.batch_handler is not None:
            errors = call_batch_handler(target, send)
        else:
            errors = []
            for row in send:
                errors.append(call_handler(target, row))
                if judge(row, target, errors[-1], clock(), self.settings).pause_target:
                    break  # the target is down: the rest of this send is not handed
        duration_ms = (self._monotonic() - started) * 1000 / len(errors)
        now = clock()
        # Rows after a pausing outcome were not handed: no result, they stay as they are.
        return [RunResult(row, judge(row, target, error, now, self.settings), duration_ms)
                for row, error in zip(send[: len(errors)], errors, strict=True)]
