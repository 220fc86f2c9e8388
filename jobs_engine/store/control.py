"""The statements of the operator surfaces: guarded single-row actions, statistics,
retention and the reads of ``/metrics`` and the admin.

None of them runs on a lane's hot path. An action is one conditional statement whose
guard is the state the action needs, so two operators racing on one row cannot both win.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from jobs_engine import states
from jobs_engine.limits import Limit
from jobs_engine.models import JobStatShard, TenantWeight
from jobs_engine.states import DEAD, DELETED, DONE, PENDING, RUNNING, Lane
from jobs_engine.store.connection import (
    execute,
    fetch,
)
from jobs_engine.store.dialect import (
    dt,
    in_,
    json_array_has,
    json_array_length,
    read_dt,
    read_instant,
    skip_locked,
    writable_ctes,
)
from jobs_engine.store.leases import HAND_PAUSE_UNTIL, PauseRow
from jobs_engine.store.limits import LIMIT_BUCKETS, LIMIT_OVERRIDES, effective_limit
from jobs_engine.store.rows import (
    CLOSED_COLUMNS,
    DONE_JOBS,
    FLOW_STEP_KEY_PREFIX,
    FLOW_STEPS,
    FLOWS,
    INFLIGHT,
    JOB_STAT_SHARDS,
    JOBS,
    PARTITIONS,
    PAUSES,
    WORKERS,
    ClosedJob,
    closed_jobs,
)

__all__ = [
    "CANCEL",
    "PRUNE",
    "PRUNE_DONE",
    "RETRY",
    "SKIP",
    "UNHANDLED",
    "JobOwner",
    "JobState",
    "LimitOverrideRow",
    "RemovedJob",
    "TenantWeightRow",
    "dead_counts",
    "dead_prune_beyond",
    "dead_targets",
    "done_counts",
    "done_prune_beyond",
    "done_targets",
    "flows_delete",
    "flows_finished_before",
    "inflight_rows_sql",
    "job_delete_if_dead",
    "job_delete_if_not_started",
    "job_info_row",
    "job_owner",
    "job_retry_if_dead",
    "job_state",
    "job_stats_fold_shards",
    "job_stats_since",
    "job_stats_totals",
    "jobs_close_unhandled",
    "jobs_count",
    "jobs_delete_dead_closed_before",
    "jobs_pending_by_lane",
    "jobs_release_key_held_by",
    "limit_in_force",
    "limit_override_clear",
    "limit_override_of",
    "limit_override_set",
    "limits_running_by_target",
    "limits_throttled_by_target",
    "pause_by_hand",
    "pause_of",
    "pause_resume",
    "pending_targets",
    "tenant_weight_set",
    "tenant_weights",
    "workers_outages",
]

RETRY = states.transition(DEAD, to=PENDING)
SKIP = states.transition(DEAD, to=DELETED)
CANCEL = states.transition(PENDING, RUNNING, to=DELETED)
PRUNE = states.transition(DEAD, to=DELETED)
PRUNE_DONE = states.transition(DONE, to=DELETED)
UNHANDLED = states.transition(PENDING, to=DEAD)


@dataclass(frozen=True)
class RemovedJob:
    """A row an operator removed (skip, cancel), as it was just before."""

    id: int
    target: str
    code: str
    dedupe_key: str
    attempts: int
    status: str
    lane: str
    partition: int
    key: str | None
    version: int
    next_run_at: datetime | None


_REMOVED_COLUMNS = ("id, target, code, dedupe_key, attempts, status, lane, partition, key, "
                    "version, next_run_at")


def _removed(row: Sequence[Any]) -> RemovedJob:
    (job_id, target, code, dedupe_key, attempts, status, lane, partition, key, version,
     next_run_at) = row[:11]
    return RemovedJob(job_id, target, code, dedupe_key, attempts, status, lane, partition, key,
                      version, read_dt(next_run_at))


@dataclass(frozen=True)
class JobOwner:
    """Whom a job belongs to: its tenant (None: the platform's), and the flow whose step
    it runs, if any. Neither ever changes for a job."""

    tenant_id: str | None
    flow_id: int | None
    step_position: int | None


def job_owner(job_id: int) -> JobOwner | None:
    """The owner of a waiting, DEAD or completed job; None when there is no such job."""
    rows = fetch(
        f"SELECT j.tenant_id, s.flow_id, s.position FROM (SELECT id, tenant_id FROM {JOBS} "
        f"WHERE id = %s UNION ALL SELECT id, tenant_id FROM {DONE_JOBS} WHERE id = %s) AS j "
        f"LEFT JOIN {FLOW_STEPS} s ON s.job_id = j.id", [job_id, job_id])
    return JobOwner(*rows[0]) if rows else None


@dataclass(frozen=True)
class JobState:
    """What an operator action needs to explain a refusal."""

    status: str
    lane: str
    started: bool
    in_flight: bool


def _in_flight() -> str:
    """SQL true while the ``JOBS`` row being tested is marked in flight (an
    ``InflightMark`` of its partition)."""
    return (f"EXISTS (SELECT 1 FROM {INFLIGHT} m WHERE m.partition = {JOBS}.partition "
            f"AND {json_array_has('m.ids', f'{JOBS}.id')})")


def inflight_rows_sql() -> str:
    """SQL for the rows in flight in the partition of the ``PARTITIONS`` row being read
    (the admin's partitions page)."""
    return (f"(SELECT COALESCE(SUM({json_array_length('m.ids')}), 0) FROM {INFLIGHT} m "
            f"WHERE m.partition = {PARTITIONS}.partition)")


def job_retry_if_dead(job_id: int, now: datetime) -> bool:
    """DEAD → PENDING, due at ``now`` with attempts 0 and no claim; False when the row is
    missing or not DEAD (e.g. a concurrent retry won). ``last_error`` stays as evidence;
    ``outcome_token`` stays so a stale in-flight mark cannot close the retried row."""
    return execute(
        f"UPDATE {JOBS} SET status = %s, attempts = 0, next_run_at = %s, closed_at = NULL, "
        "claim_token = NULL, claimed_by = NULL, lease_until = NULL, started_at = NULL, "
        "running_code = NULL, updated_at = %s WHERE id = %s AND status = %s",
        [RETRY.target, dt(now), dt(now), job_id, *RETRY.source_values],
    ) == 1


def job_delete_if_dead(job_id: int, using: str | None = None) -> RemovedJob | None:
    """Skip: delete a DEAD row; None when it is missing or not DEAD."""
    rows = fetch(
        f"DELETE FROM {JOBS} WHERE id = %s AND status = %s RETURNING {_REMOVED_COLUMNS}",
        [job_id, *SKIP.source_values], using)
    return _removed(rows[0]) if rows else None


def job_delete_if_not_started(job_id: int, using: str | None = None) -> RemovedJob | None:
    """Cancel: delete a PENDING row that is not in its partition's in-flight mark, or a
    long-lane RUNNING row whose handler has not started; None otherwise.

    The long lane marks a row started with a guarded write on the same row, so a cancel
    and a start serialise on the row: one of them matches nothing.
    """
    assert CANCEL.sources == (PENDING, RUNNING)
    rows = fetch(
        f"DELETE FROM {JOBS} WHERE id = %s AND ((status = %s AND NOT {_in_flight()}) "
        f"OR (status = %s AND lane = %s AND started_at IS NULL)) RETURNING {_REMOVED_COLUMNS}",
        [job_id, PENDING.value, RUNNING.value, Lane.LONG.value], using,
    )
    return _removed(rows[0]) if rows else None


def jobs_release_key_held_by(removed: RemovedJob, now: datetime) -> int:
    """After a cancelled fast-lane key head: its later PENDING versions that were moved to
    its retry time (``jobs_hold_key_until`` or enqueue behind it) become due now."""
    if removed.lane != Lane.FAST.value or removed.key is None or removed.next_run_at is None \
            or removed.next_run_at <= now:
        return 0
    return execute(
        f"UPDATE {JOBS} SET next_run_at = %s WHERE status = %s AND partition = %s "
        "AND target = %s AND key = %s AND (version > %s OR (version = %s AND id > %s)) "
        "AND next_run_at = %s",
        [dt(now), PENDING.value, removed.partition, removed.target, removed.key,
         removed.version, removed.version, removed.id, dt(removed.next_run_at)],
    )


def job_state(job_id: int) -> JobState | None:
    """The row's state, from the hot table or, for a completed job, the kept ones."""
    rows = fetch(f"SELECT status, lane, started_at IS NOT NULL, {_in_flight()} "
                 f"FROM {JOBS} WHERE id = %s UNION ALL SELECT %s, lane, TRUE, FALSE "
                 f"FROM {DONE_JOBS} WHERE id = %s", [job_id, DONE.value, job_id])
    if not rows:
        return None
    status, lane, started, in_flight = rows[0]
    return JobState(status, lane, bool(started), bool(in_flight))


# -- retention ----------------------------------------------------------------------------


def _beyond_newest(table: str, where: str, order: str) -> str:
    """Ids past the newest ``%s`` rows of ``table`` matching ``where`` (newest first by
    ``order``), at most ``%s`` of them; rows another worker is removing are skipped."""
    return (f"SELECT id FROM {table} WHERE {where} ORDER BY {order} DESC, id DESC "
            f"LIMIT %s OFFSET %s{skip_locked()}")


# A flow's step jobs are kept and removed with their flow (``flows_delete``).
_NOT_STEP = "dedupe_key NOT LIKE %s"
_STEP_KEYS = FLOW_STEP_KEY_PREFIX + "%"


def _targets_where(table: str, where: str, params: Sequence[Any]) -> list[str]:
    """The distinct targets of ``table``'s rows matching ``where``, read off an index led by
    ``target`` one target at a time (a loose index scan): a handful of index probes however
    many rows each target has, where ``SELECT DISTINCT`` would read every entry. ``where``
    names the columns unqualified (the inner query's row is the one tested)."""
    rows = fetch(
        f"WITH RECURSIVE t(target) AS (SELECT min(target) FROM {table} WHERE {where} "
        f"UNION ALL SELECT (SELECT min(j.target) FROM {table} j WHERE {where} "
        "AND j.target > t.target) FROM t WHERE t.target IS NOT NULL) "
        "SELECT target FROM t WHERE target IS NOT NULL", [*params, *params])
    return [t for (t,) in rows]


def done_targets() -> list[str]:
    """The targets that have completed jobs kept (index ``jobs_done_by_target``)."""
    return _targets_where(DONE_JOBS, "TRUE", [])


def done_prune_beyond(target: str, keep: int, limit: int) -> int:
    """Delete up to ``limit`` completed jobs of ``target`` older than its newest ``keep``
    (index ``jobs_done_by_target``)."""
    assert PRUNE_DONE.sources == (DONE,)
    return execute(
        f"DELETE FROM {DONE_JOBS} WHERE id IN ("
        f"{_beyond_newest(DONE_JOBS, f'target = %s AND {_NOT_STEP}', 'finished_at')})",
        [target, _STEP_KEYS, limit, keep])


def dead_targets() -> list[str]:
    """The targets that have DEAD jobs (index ``jobs_dead_by_target``)."""
    return _targets_where(JOBS, "status = %s", [DEAD.value])


def dead_prune_beyond(target: str, keep: int, limit: int) -> int:
    """Delete up to ``limit`` DEAD jobs of ``target`` older than its newest ``keep`` (index
    ``jobs_dead_by_target``)."""
    return execute(
        f"DELETE FROM {JOBS} WHERE id IN ("
        f"{_beyond_newest(JOBS, f'status = %s AND target = %s AND {_NOT_STEP}', 'closed_at')})",
        [*PRUNE.source_values, target, _STEP_KEYS, limit, keep])


def pending_targets() -> list[str]:
    """The targets that have PENDING rows: fast-lane ones read off the poll's index one
    target at a time (a loose index scan), long-lane ones from theirs."""
    fast = _targets_where(JOBS, "status = %s AND lane = %s", [PENDING.value, Lane.FAST.value])
    long = fetch(f"SELECT DISTINCT target FROM {JOBS} WHERE status = %s AND lane = %s",
                 [PENDING.value, Lane.LONG.value])
    return sorted({*fast, *(t for (t,) in long)})


def jobs_close_unhandled(target: str, due_before: datetime, now: datetime, limit: int
                         ) -> list[ClosedJob]:
    """PENDING rows of ``target``, a target no handler takes, due before ``due_before``:
    DEAD with that reason, up to ``limit`` of them."""
    reason = f"no handler registered for {target}"
    rows = fetch(
        f"UPDATE {JOBS} SET status = %s, closed_at = %s, last_error = %s, updated_at = %s "
        f"WHERE id IN (SELECT id FROM {JOBS} WHERE status = %s AND target = %s "
        f"AND next_run_at < %s ORDER BY next_run_at LIMIT %s{skip_locked()}) "
        f"RETURNING {CLOSED_COLUMNS}",
        [UNHANDLED.target, dt(now), reason, dt(now), *UNHANDLED.source_values, target,
         dt(due_before), limit])
    return closed_jobs(rows, reason)


def jobs_delete_dead_closed_before(cutoff: datetime, limit: int) -> int:
    """Retention: delete up to ``limit`` DEAD rows closed before ``cutoff`` (index
    ``jobs_dead_closed``). Rows another worker is deleting right now are skipped."""
    return execute(
        f"DELETE FROM {JOBS} WHERE id IN (SELECT id FROM {JOBS} WHERE status = %s "
        f"AND closed_at < %s AND {_NOT_STEP} ORDER BY closed_at LIMIT %s{skip_locked()})",
        [*PRUNE.source_values, dt(cutoff), _STEP_KEYS, limit],
    )


def flows_finished_before(cutoff: datetime, limit: int) -> list[int]:
    """Ids of up to ``limit`` flows that finished (completed, failed, cancelled) before
    ``cutoff`` (index ``jobs_flow_finished``)."""
    return [i for (i,) in fetch(
        f"SELECT id FROM {FLOWS} WHERE finished_at < %s ORDER BY finished_at LIMIT %s",
        [dt(cutoff), limit])]


def flows_delete(flow_ids: Sequence[int]) -> int:
    """Delete flows with their steps and their steps' jobs (waiting, DEAD or kept DONE),
    in the caller's transaction; returns the flows deleted."""
    if not flow_ids:
        return 0
    ids = ", ".join(["%s"] * len(flow_ids))
    steps_jobs = f"SELECT job_id FROM {FLOW_STEPS} WHERE flow_id IN ({ids}) AND job_id IS NOT NULL"
    execute(f"DELETE FROM {JOBS} WHERE id IN ({steps_jobs})", list(flow_ids))
    execute(f"DELETE FROM {DONE_JOBS} WHERE id IN ({steps_jobs})", list(flow_ids))
    execute(f"DELETE FROM {FLOW_STEPS} WHERE flow_id IN ({ids})", list(flow_ids))
    return execute(f"DELETE FROM {FLOWS} WHERE id IN ({ids})", list(flow_ids))


# -- reads: statistics, metrics, counts ---------------------------------------------------


_FOLDED = JobStatShard.FOLDED


def job_stats_since(since: datetime, *, of_tenant: str | None = None
                    ) -> list[tuple[datetime, str, str, int]]:
    """(hour, target, outcome, count) of the hours from ``since`` on, oldest first; with
    ``of_tenant``, only that tenant's runs, else every run."""
    tenant, params = ("AND tenant_id = %s", [of_tenant]) if of_tenant is not None else ("", [])
    rows = fetch(f"SELECT hour, target, outcome, SUM(count) FROM {JOB_STAT_SHARDS} "
                 f"WHERE hour >= %s {tenant} "
                 "GROUP BY hour, target, outcome ORDER BY hour, target, outcome",
                 [dt(since), *params])
    return [(read_dt(h), t, o, int(c)) for h, t, o, c in rows]  # type: ignore[misc]  # hour is NOT NULL


def job_stats_fold_shards() -> int:
    """Add the appended counts into their bucket's ``FOLDED`` row and remove them
    (retention), so a bucket keeps one row however many writes counted into it. One
    statement on PostgreSQL, so two workers folding at once cannot count a shard twice
    (the second finds it deleted); a session adding to a shard meanwhile makes a new one.
    Returns the shard rows folded."""
    columns = "hour, target, outcome, tenant_id"
    add = (f"INSERT INTO {JOB_STAT_SHARDS} ({columns}, shard, count) "
           f"SELECT {columns}, {_FOLDED}, SUM(count) FROM {{rows}} GROUP BY {columns} "
           f"ORDER BY {columns} ON CONFLICT ({columns}) WHERE shard = {_FOLDED} "
           f"DO UPDATE SET count = {JOB_STAT_SHARDS}.count + excluded.count")
    not_folded = f"shard <> {_FOLDED}"
    if writable_ctes():
        folded: int = fetch(
            f"WITH gone AS (DELETE FROM {JOB_STAT_SHARDS} WHERE {not_folded} "
            f"RETURNING {columns}, count), folded AS ({add.format(rows='gone')} "
            "RETURNING 1) SELECT COUNT(*) FROM gone")[0][0]
        return folded
    with transaction.atomic():
        execute(add.format(rows=f"(SELECT * FROM {JOB_STAT_SHARDS} WHERE {not_folded}) AS s"))
        return execute(f"DELETE FROM {JOB_STAT_SHARDS} WHERE {not_folded}")


def job_stats_totals() -> list[tuple[str, str, int]]:
    """(target, outcome, runs) of every tenant, summed over every hour kept."""
    return [(t, o, int(c)) for t, o, c in fetch(
        f"SELECT target, outcome, SUM(count) FROM {JOB_STAT_SHARDS} GROUP BY target, outcome "
        "ORDER BY target, outcome")]


def jobs_pending_by_lane() -> dict[str, tuple[int, datetime | None]]:
    """lane → (PENDING rows, earliest next_run_at): a count, so a scan of the pending rows."""
    rows = fetch(f"SELECT lane, COUNT(*), MIN(next_run_at) FROM {JOBS} WHERE status = %s "
                 "GROUP BY lane", [PENDING.value])
    return {lane: (count, read_dt(earliest)) for lane, count, earliest in rows}


def jobs_count(statuses: Iterable[str] | None = None) -> int:
    count: int
    if statuses is None:
        count = fetch(f"SELECT COUNT(*) FROM {JOBS}")[0][0]
        return count
    clause, params = in_("status", list(statuses))
    count = fetch(f"SELECT COUNT(*) FROM {JOBS} WHERE {clause}", params)[0][0]
    return count


def job_info_row(job_id: int) -> tuple[Any, ...] | None:
    """(id, target, code, key, status, attempts, result, last_error, created_at, started_at,
    finished_at, payload, claimed_by, tries, tenant_id) of a job, from the hot table or the
    completed ones, or None."""
    rows = fetch(
        f"SELECT id, target, code, key, status, attempts, NULL, last_error, created_at, "
        f"started_at, closed_at, payload, claimed_by, tries, tenant_id FROM {JOBS} "
        f"WHERE id = %s UNION ALL SELECT id, target, code, key, %s, attempts, result, '', "
        f"created_at, started_at, finished_at, payload, NULL, tries, tenant_id "
        f"FROM {DONE_JOBS} WHERE id = %s",
        [job_id, DONE.value, job_id])
    return rows[0] if rows else None


def _of_tenant(of_tenant: str | None) -> tuple[str, list[Any]]:
    """SQL narrowing a statement's rows to ``of_tenant``'s (None: every tenant's)."""
    return ("", []) if of_tenant is None else (" AND tenant_id = %s", [of_tenant])


def done_counts(*, of_tenant: str | None = None) -> dict[str, int]:
    """target → completed jobs kept (the table is bounded by the keep counts); with
    ``of_tenant``, that tenant's only."""
    tenant, params = _of_tenant(of_tenant)
    return dict(fetch(f"SELECT target, COUNT(*) FROM {DONE_JOBS} WHERE TRUE{tenant} "
                      "GROUP BY target", params))


def dead_counts(*, of_tenant: str | None = None) -> dict[str, int]:
    """target → DEAD jobs kept; with ``of_tenant``, that tenant's only."""
    tenant, params = _of_tenant(of_tenant)
    return dict(fetch(f"SELECT target, COUNT(*) FROM {JOBS} WHERE status = %s{tenant} "
                      "GROUP BY target", [DEAD.value, *params]))


def workers_outages() -> list[tuple[str, int, float]]:
    """(worker id, database outages ridden out, seconds the last one lasted) per worker."""
    return [(w, int(n), float(s)) for w, n, s in fetch(
        f"SELECT worker_id, db_outages, last_db_outage_s FROM {WORKERS} ORDER BY worker_id")]


# -- the platform's settings: limits, tenants' weights, pauses by hand ---------------------

TENANT_WEIGHTS = TenantWeight._meta.db_table


@dataclass(frozen=True)
class LimitOverrideRow:
    """An operator's values for a declared limit (None: the declared one's), and who set
    them when."""

    target: str
    name: str
    slots: int | None
    starts: int | None
    period_s: float | None
    burst: int | None
    updated_at: datetime
    updated_by: str

    @property
    def values(self) -> tuple[int | None, int | None, float | None, int | None]:
        return self.slots, self.starts, self.period_s, self.burst


def limit_in_force(declared: Limit, override: LimitOverrideRow | None) -> Limit:
    """``declared`` with ``override`` applied, as every admission reads it."""
    return declared if override is None else effective_limit(declared, override.values)


def limit_override_of(target: str, name: str) -> LimitOverrideRow | None:
    """The override of ``target``'s limit ``name``, if an operator set one."""
    rows = fetch(f"SELECT target, name, slots, starts, period_s, burst, updated_at, "
                 f"updated_by FROM {LIMIT_OVERRIDES} WHERE target = %s AND name = %s",
                 [target, name])
    if not rows:
        return None
    target, name, slots, starts, period_s, burst, updated_at, updated_by = rows[0]
    return LimitOverrideRow(target, name, slots, starts, period_s, burst,
                            read_instant(updated_at), updated_by)


def limit_override_set(target: str, name: str, *, slots: int | None, starts: int | None,
                       period_s: float | None, burst: int | None, now: datetime,
                       by: str) -> None:
    """Put these values in force for ``target``'s limit ``name`` (those left None: the
    declared ones), replacing an earlier override; the workers read it at their next
    admission. The caller has checked the values against the declared limit."""
    execute(f"INSERT INTO {LIMIT_OVERRIDES} (target, name, slots, starts, period_s, burst, "
            "updated_at, updated_by) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (target, name) DO UPDATE SET slots = excluded.slots, "
            "starts = excluded.starts, period_s = excluded.period_s, burst = excluded.burst, "
            "updated_at = excluded.updated_at, updated_by = excluded.updated_by",
            [target, name, slots, starts, period_s, burst, dt(now), by])


def limit_override_clear(target: str, name: str) -> int:
    """Back to the declared values of ``target``'s limit ``name``; the overrides removed."""
    return execute(f"DELETE FROM {LIMIT_OVERRIDES} WHERE target = %s AND name = %s",
                   [target, name])


def limits_throttled_by_target() -> dict[str, int]:
    """target → the times its limits held a due job back (its buckets' counts summed)."""
    return {t: int(n) for t, n in fetch(
        f"SELECT target, SUM(throttled) FROM {LIMIT_BUCKETS} GROUP BY target")}


def limits_running_by_target() -> dict[str, int]:
    """target → its limited rows RUNNING now (index ``jobs_limited_running``, entries of
    RUNNING rows with a limit key only)."""
    return {t: int(n) for t, n in fetch(
        f"SELECT target, COUNT(*) FROM {JOBS} WHERE status = %s AND limit_key IS NOT NULL "
        "GROUP BY target", [RUNNING.value])}


@dataclass(frozen=True)
class TenantWeightRow:
    tenant_id: str
    weight: int
    updated_at: datetime | None  # None: no row, the default weight
    updated_by: str


def tenant_weights(of_tenant: str | None = None) -> list[TenantWeightRow]:
    """The weights operators set (a tenant without a row weighs 1), by tenant id; with
    ``of_tenant``, that tenant's only."""
    where, params = ("WHERE tenant_id = %s", [of_tenant]) if of_tenant is not None else ("", [])
    return [TenantWeightRow(t, int(w), read_dt(at), by) for t, w, at, by in fetch(
        f"SELECT tenant_id, weight, updated_at, updated_by FROM {TENANT_WEIGHTS} {where} "
        "ORDER BY tenant_id", params)]


def tenant_weight_set(tenant_id: str, weight: int, now: datetime, by: str) -> None:
    """``tenant_id``'s weight in the long lane's fair shares from the next reserve on; 1,
    the default, removes its row. The caller has checked both."""
    if weight == 1:
        execute(f"DELETE FROM {TENANT_WEIGHTS} WHERE tenant_id = %s", [tenant_id])
        return
    execute(f"INSERT INTO {TENANT_WEIGHTS} (tenant_id, weight, updated_at, updated_by) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT (tenant_id) DO UPDATE SET "
            "weight = excluded.weight, updated_at = excluded.updated_at, "
            "updated_by = excluded.updated_by", [tenant_id, weight, dt(now), by])


def pause_of(target: str) -> PauseRow | None:
    """``target``'s pause, the breaker's or an operator's, if it has one."""
    rows = fetch(f"SELECT target, paused_until, reason FROM {PAUSES} WHERE target = %s",
                 [target])
    return PauseRow(rows[0][0], read_instant(rows[0][1]), rows[0][2]) if rows else None


def pause_by_hand(target: str, now: datetime, reason: str) -> bool:
    """Pause ``target`` until an operator resumes it (``pause_resume``): no worker sends
    its rows, none probes it, and the breaker's statements leave the pause as it is. Over
    the breaker's pause it replaces it (its probe, if one is out, no longer ends it).
    False when the target was paused by hand already (nothing changed)."""
    return execute(
        f"INSERT INTO {PAUSES} AS p (target, paused_until, reason, paused_at, probe_by) "
        "VALUES (%s, %s, %s, %s, NULL) ON CONFLICT (target) DO UPDATE SET "
        "paused_until = excluded.paused_until, reason = excluded.reason, "
        "paused_at = excluded.paused_at, probe_by = NULL WHERE p.paused_until < %s",
        [target, dt(HAND_PAUSE_UNTIL), reason, dt(now), dt(HAND_PAUSE_UNTIL)]) == 1


def pause_resume(target: str) -> int:
    """An operator's resume: ``target``'s pause ends, the breaker's or a pause by hand;
    workers send its rows again at their next poll."""
    return execute(f"DELETE FROM {PAUSES} WHERE target = %s", [target])
