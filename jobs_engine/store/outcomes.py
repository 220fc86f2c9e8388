"""Every outcome write, for both lanes, under the holder's ``Guard``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from jobs_engine.states import DELETED, DONE, Lane
from jobs_engine.store.connection import (
    execute,
    fetch,
)
from jobs_engine.store.dialect import (
    dt,
    in_,
    json_append,
    json_dt,
    jsonb,
    session_shard,
    table,
    values_,
    writable_ctes,
)
from jobs_engine.store.leases import clear_inflight_sql
from jobs_engine.store.rows import (
    CLOSED,
    DEAD_VALUE,
    DONE_JOBS,
    DONE_KEPT,
    DONE_NOT_KEPT,
    JOB_STAT_SHARDS,
    JOBS,
    PENDING_VALUE,
    RETRIED,
    RUNNING_VALUE,
    STATS_SHARDS,
    attempts_as_read,
    cut_error,
    lazy_flush_item,
)

__all__ = [
    "Done",
    "Guard",
    "StatBucket",
    "job_close_dead",
    "job_release_unchanged",
    "job_retry_later",
    "job_stats_add",
    "jobs_done",
]

# -- outcomes (both lanes) ----------------------------------------------------------------


@dataclass(frozen=True)
class Guard:
    """What a holder's outcome write must still match.

    Fast lane: the row is PENDING with the attempts it was read with; the write is stamped
    with the in-flight token. Long lane: the row is RUNNING under the claim token.

    Either way a row that another worker *presumed* DEAD because its holder vanished (a
    takeover of an at-most-once row in flight, the rescue of an expired at-most-once
    lease) still matches: it keeps the holder's token in ``claim_token``, and the holder,
    back after a database outage or a stall, writes what really happened. A delivered row
    is then recorded as delivered, never left DEAD.
    """

    lane: Lane
    token: str

    def match(self, rows: Sequence[tuple[int, int]]) -> tuple[str, list[Any]]:
        """SQL true for the ``(id, attempts read)`` rows this holder may still write. On
        PostgreSQL one text for any number of rows (arrays), so the writes are prepared."""
        ids, id_params = in_("id", [job_id for job_id, _ in rows], arrays_from=1)
        if self.lane is Lane.LONG:
            return (f"{ids} AND status IN ('{RUNNING_VALUE}', '{DEAD_VALUE}') AND claim_token = %s",
                    [*id_params, self.token])
        read, read_params = attempts_as_read(rows)
        return (f"{ids} AND ((status = %s AND {read}) OR (status = %s AND claim_token = %s))",
                [*id_params, PENDING_VALUE, *read_params, DEAD_VALUE, self.token])

    def sets(self) -> tuple[str, list[Any]]:
        if self.lane is Lane.FAST:
            return "outcome_token = %s, claim_token = NULL", [self.token]
        return ("claim_token = NULL, claimed_by = NULL, lease_until = NULL, running_code = NULL, "
                "started_at = NULL", [])


class Done(NamedTuple):
    """A job whose handler returned: (id, attempts read, result as JSON text or None, when
    its try started, how long it took, and for the long lane its ``tries`` entry)."""

    id: int
    attempts: int
    result_json: str | None
    started_at: datetime
    duration_ms: float
    try_json: str | None = None


def _tries_after(tried: str, tries: str = "tries") -> str:
    """The ``tries`` column with the entry ``tried`` (SQL, a JSON text or NULL) appended."""
    return f"CASE WHEN {tried} IS NULL THEN {tries} ELSE {json_append(tries, tried)} END"


def jobs_done(guard: Guard, done: Sequence[Done], now: datetime, *, keep: int,
              count_as: tuple[datetime, str] | None = None, clear_marks: bool = False,
              flush_lazily: bool = False) -> int:
    """Record the jobs of one send whose handler returned; returns how many rows matched.

    ``keep``: the target's ``keep_completed`` (0 for rows of targets that keep none). The
    newest ``keep`` of the send move to the table of completed jobs as DONE, with their
    result and one more try counted, in one statement where writable CTEs allow (delete
    here, append there), else two in the caller's transaction; the rest are deleted (the
    retention service would remove them next anyway: a send never copies more rows than
    its target keeps).

    ``count_as`` (hour, outcome; only where writable CTEs allow): the same statement also
    adds the rows it matched to the hourly statistics, so a write of successes is one
    statement, atomic without a transaction (no BEGIN and COMMIT round trips).
    ``clear_marks`` (fast lane, with ``count_as``): it also clears the poll's in-flight
    marks (``inflight_clear``), the last write of a poll.
    ``flush_lazily`` (with ``count_as``, at-least-once rows only): that statement, its own
    transaction, commits without waiting for the WAL flush (``lazy_flush_item``).
    """
    if not done:
        return 0
    # The texts are the same for any number of rows (arrays): prepared, the server parses
    # and plans them once per session (a third of a 100-row write of the fast lane).
    where, params = guard.match([(d.id, d.attempts) for d in done])
    kept = sorted(done, key=lambda d: d.id, reverse=True)[:keep]
    counted, count_params = "", []
    if count_as is not None:
        assert writable_ctes(), "the statistics join the statement only through a CTE"
        counted = (f", counted AS (INSERT INTO {JOB_STAT_SHARDS} (hour, target, outcome, "
                   "tenant_id, shard, count) SELECT %s, target, %s, COALESCE(tenant_id, ''), "
                   "%s, COUNT(*) FROM moved GROUP BY target, tenant_id RETURNING 1)")
        count_params = [dt(count_as[0]), count_as[1], session_shard(STATS_SHARDS)]
    if clear_marks:
        assert count_as is not None and guard.lane is Lane.FAST, "a fast poll's last write"
        clear, clear_params = clear_inflight_sql(guard.token)
        counted += f", cleared AS ({clear} RETURNING 1)"
        count_params += clear_params
    lazily = lazy_flush_item(flush_lazily)
    if lazily:
        assert count_as is not None, "one statement, so one transaction of its own"
    if not kept:
        assert DONE_NOT_KEPT[guard.lane].target is DELETED
        if counted:
            deleted: int = fetch(f"WITH moved AS (DELETE FROM {JOBS} WHERE {where} "
                                 "RETURNING target, tenant_id)"
                                 f"{counted} SELECT COUNT(*){lazily} FROM moved",
                                 [*params, *count_params], prepare=True)[0][0]
            return deleted
        return execute(f"DELETE FROM {JOBS} WHERE {where}", params)
    assert DONE_KEPT[guard.lane].target is DONE
    # Each start time once (a send's rows share one), not once per row.
    starts = {s: json_dt(s) for s in {d.started_at for d in kept}}
    results, result_params = table(
        [(d.id, d.result_json, starts[d.started_at], d.duration_ms, d.try_json) for d in kept],
        ("bigint", "text", "timestamptz", "float8", "text"),
        arrays_from=1, as_json=True)
    columns = ("id, target, lane, code, key, version, partition, dedupe_key, delivery_mode, "
               "payload, headers, trace_id, actor, created_at, tenant_id")
    tries = _tries_after("r.tried", "m.tries")
    append = (
        f"INSERT INTO {DONE_JOBS} ({columns}, result, attempts, started_at, finished_at, "
        f"duration_ms, tries) SELECT {', '.join('m.' + c.strip() for c in columns.split(','))}, "
        f"{jsonb('r.result')}, m.attempts + 1, COALESCE(m.started_at, r.started_at), %s, "
        f"r.duration_ms, {tries} FROM {{moved}} m JOIN r ON r.id = m.id")
    if writable_ctes():
        moved: int = fetch(
            f"WITH r(id, result, started_at, duration_ms, tried) AS ({results}), "
            f"moved AS (DELETE FROM {JOBS} WHERE {where} RETURNING *), "
            f"appended AS ({append.format(moved='moved')} RETURNING 1){counted} "
            f"SELECT COUNT(*){lazily} FROM moved",
            [*result_params, *params, dt(now), *count_params], prepare=True)[0][0]
        return moved
    execute(f"WITH r(id, result, started_at, duration_ms, tried) AS ({results}) "
            + append.format(moved=f"(SELECT * FROM {JOBS} WHERE {where})"),
            [*result_params, dt(now), *params])
    return execute(f"DELETE FROM {JOBS} WHERE {where}", params)


def job_retry_later(guard: Guard, job_id: int, attempts: int, run_at: datetime, error: str,
                    now: datetime, try_json: str | None = None) -> bool:
    """An answered failure: one more attempt spent, run again at ``run_at``; ``try_json``
    (long lane) is appended to the row's ``tries``."""
    where, where_params = guard.match([(job_id, attempts)])
    sets, set_params = guard.sets()
    return execute(
        f"UPDATE {JOBS} SET status = %s, attempts = attempts + 1, next_run_at = %s, "
        f"last_error = %s, closed_at = NULL, updated_at = %s, tries = {_tries_after('%s')}, "
        f"{sets} WHERE {where}",
        [RETRIED[guard.lane].target, dt(run_at), cut_error(error), dt(now), try_json, try_json,
         *set_params, *where_params],
    ) == 1


def job_release_unchanged(guard: Guard, job_id: int, attempts: int, error: str | None,
                          now: datetime) -> bool:
    """Not sent (target unreachable, or not this worker's probe): no attempt spent; the
    long lane gives the claim back. ``error=None`` keeps the row's last error."""
    where, where_params = guard.match([(job_id, attempts)])
    sets, set_params = guard.sets()
    error_sql, error_params = ("last_error = %s, ", [cut_error(error)]) if error is not None \
        else ("", [])
    return execute(
        f"UPDATE {JOBS} SET status = %s, {error_sql}closed_at = NULL, updated_at = %s, {sets} "
        f"WHERE {where}",
        [RETRIED[guard.lane].target, *error_params, dt(now), *set_params, *where_params],
    ) == 1


def job_close_dead(guard: Guard, job_id: int, attempts: int, error: str, now: datetime, *,
                   spend_attempt: bool, try_json: str | None = None) -> bool:
    where, where_params = guard.match([(job_id, attempts)])
    sets, set_params = guard.sets()
    spent = "attempts = attempts + 1, " if spend_attempt else ""
    return execute(
        f"UPDATE {JOBS} SET status = %s, {spent}closed_at = %s, last_error = %s, updated_at = %s, "
        f"tries = {_tries_after('%s')}, {sets} WHERE {where}",
        [CLOSED[guard.lane].target, dt(now), cut_error(error), dt(now), try_json, try_json,
         *set_params, *where_params],
    ) == 1


class StatBucket(NamedTuple):
    """What the hourly statistics count runs by; ``tenant_id`` '' for none."""

    hour: datetime
    target: str
    outcome: str
    tenant_id: str


def job_stats_add(counts: Mapping[StatBucket, int]) -> None:
    """Append run counts per bucket in one insert (``JobStatShard``: never an update, so
    nothing waits for another session's row and no row grows a chain of versions)."""
    if not counts:
        return
    shard = session_shard(STATS_SHARDS)
    rows = [(dt(hour), target, outcome, tenant_id, shard, count)
            for (hour, target, outcome, tenant_id), count in counts.items()]
    values, params = values_(rows)
    execute(f"INSERT INTO {JOB_STAT_SHARDS} (hour, target, outcome, tenant_id, shard, count) "
            f"{values}", params)


