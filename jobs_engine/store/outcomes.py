"""Every outcome write, for both lanes, under the holder's ``Guard``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from django.db import transaction

from jobs_engine.states import DELETED, DONE, Lane
from jobs_engine.store.connection import (
    execute,
    fetch,
    named,
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
from jobs_engine.store.leases import clear_inflight_sql, inflight_clear
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
    "jobs_still_stored",
    "write_successes",
]

# -- outcomes (both lanes) ----------------------------------------------------------------


@dataclass(frozen=True)
class Guard:
    """What a holder's outcome write must still match.

    Fast lane: the row is PENDING with the attempts it was read with; the write is stamped
    with the in-flight token (the poll's). Long lane: the row is RUNNING under the claim
    token.

    Either way a row that another worker *presumed* DEAD because its holder vanished (a
    takeover of an at-most-once row in flight, the rescue of an expired at-most-once
    lease) still matches: it keeps the holder's token in ``claim_token``, and the holder,
    back after a database outage or a stall, writes what really happened. A delivered row
    is then recorded as delivered, never left DEAD.

    Its fragments take named parameters: ``ids`` (or ``ids_0``...), ``attempts`` (or
    ``attempts_0``...), ``pending``, ``dead`` and ``token``, the guard's token (the same
    name as the poll's in-flight marks' clear, ``clear_inflight_sql``: one value).
    """

    lane: Lane
    token: str

    def match(self, rows: Sequence[tuple[int, int]]) -> tuple[str, dict[str, Any]]:
        """SQL true for the ``(id, attempts read)`` rows this holder may still write.

        Index: the primary key. On PostgreSQL one text for any number of rows (arrays), so
        the writes are prepared."""
        ids, id_params = named(in_("id", [job_id for job_id, _ in rows], arrays_from=1), "ids")
        if self.lane is Lane.LONG:
            return (f"{ids} AND status IN ('{RUNNING_VALUE}', '{DEAD_VALUE}') "
                    "AND claim_token = %(token)s", {**id_params, "token": self.token})
        read, read_params = named(attempts_as_read(rows), "attempts")
        return (f"{ids} AND ((status = %(pending)s AND {read}) "
                "OR (status = %(dead)s AND claim_token = %(token)s))",
                {**id_params, "pending": PENDING_VALUE, **read_params, "dead": DEAD_VALUE,
                 "token": self.token})

    def sets(self) -> tuple[str, dict[str, Any]]:
        """The columns a write under this guard sets besides its outcome's: the fast lane
        stamps its token (``outcome_token``), the long lane gives its claim up."""
        if self.lane is Lane.FAST:
            return "outcome_token = %(token)s, claim_token = NULL", {"token": self.token}
        return ("claim_token = NULL, claimed_by = NULL, lease_until = NULL, running_code = NULL, "
                "started_at = NULL", {})


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


# The columns a job keeps when it moves to the table of completed jobs.
_KEPT_COLUMNS = ("id", "target", "lane", "code", "key", "version", "partition", "dedupe_key",
                 "delivery_mode", "payload", "headers", "trace_id", "actor", "created_at",
                 "tenant_id")


class _Move(NamedTuple):
    """The parts of a statement that records successes (``_move``): the guard's test,
    the rows kept (None: none, every matched row is deleted) as a table ``r(id, result,
    started_at, duration_ms, tried)``, the insert of the moved rows into the completed
    jobs (``{moved}``: the rows, aliased ``m``), and every parameter."""

    where: str
    kept: str | None
    append: str
    params: dict[str, Any]


def _move(guard: Guard, done: Sequence[Done], now: datetime, keep: int) -> _Move:
    """The newest ``keep`` of ``done`` are kept (moved as DONE, with their result and one
    more try counted), the rest deleted."""
    where, params = guard.match([(d.id, d.attempts) for d in done])
    kept = sorted(done, key=lambda d: d.id, reverse=True)[:keep] if keep > 0 else []
    if not kept:
        assert DONE_NOT_KEPT[guard.lane].target is DELETED
        return _Move(where, None, "", params)
    assert DONE_KEPT[guard.lane].target is DONE
    # Each start time once (a send's rows share one), not once per row.
    starts = {s: json_dt(s) for s in {d.started_at for d in kept}}
    results, result_params = named(table(
        [(d.id, d.result_json, starts[d.started_at], d.duration_ms, d.try_json) for d in kept],
        ("bigint", "text", "timestamptz", "float8", "text"),
        arrays_from=1, as_json=True), "results")
    columns = ", ".join(_KEPT_COLUMNS)
    append = (
        f"INSERT INTO {DONE_JOBS} ({columns}, result, attempts, started_at, finished_at, "
        f"duration_ms, tries) SELECT {', '.join('m.' + c for c in _KEPT_COLUMNS)}, "
        f"{jsonb('r.result')}, m.attempts + 1, COALESCE(m.started_at, r.started_at), "
        f"%(finished_at)s, r.duration_ms, {_tries_after('r.tried', 'm.tries')} "
        "FROM {moved} m JOIN r ON r.id = m.id")
    return _Move(where, f"r(id, result, started_at, duration_ms, tried) AS ({results})",
                 append, {**params, **result_params, "finished_at": dt(now)})


def jobs_done(guard: Guard, done: Sequence[Done], now: datetime, *, keep: int) -> int:
    """Record the jobs of one send whose handler returned, in the caller's transaction
    among other outcomes; returns how many rows matched.

    Index: the primary key. ``keep``: the target's ``keep_completed`` (0 for rows of
    targets that keep none). The newest ``keep`` of the send move to the table of
    completed jobs as DONE, with their result and one more try counted, in one statement
    where writable CTEs allow (delete here, append there), else two; the rest are deleted
    (the retention service would remove them next anyway: a send never copies more rows
    than its target keeps). The caller counts them in the hourly statistics
    (``job_stats_add``). Successes written on their own: ``write_successes``.
    """
    if not done:
        return 0
    # The texts are the same for any number of rows (arrays): prepared, the server parses
    # and plans them once per session, where planning cost a large share of a write.
    move = _move(guard, done, now, keep)
    if move.kept is None:
        return execute(f"DELETE FROM {JOBS} WHERE {move.where}", move.params)
    if writable_ctes():
        moved: int = fetch(
            f"WITH {move.kept}, moved AS (DELETE FROM {JOBS} WHERE {move.where} RETURNING *), "
            f"appended AS ({move.append.format(moved='moved')} RETURNING 1) "
            "SELECT COUNT(*) FROM moved", move.params, prepare=True)[0][0]
        return moved
    execute(f"WITH {move.kept} "
            + move.append.format(moved=f"(SELECT * FROM {JOBS} WHERE {move.where})"),
            move.params)
    return execute(f"DELETE FROM {JOBS} WHERE {move.where}", move.params)


def write_successes(guard: Guard, done: Sequence[Done], now: datetime, *, keep: int,
                    count_as: tuple[datetime, str], clear_marks: bool = False,
                    flush_lazily: bool = False) -> int:
    """Record the jobs of one send whose handler returned and count them in the hourly
    statistics, atomically, with no other outcome; returns how many rows matched.

    Index: the primary key (``jobs_inflight_by_token`` for the marks' clear). The rows
    move (or go) as ``jobs_done`` says; ``count_as`` (hour, outcome) is the statistics'
    bucket of the rows matched. ``clear_marks`` (fast lane: the last write of a poll): the
    poll's in-flight marks, under the guard's token, are cleared with them.

    Where writable CTEs allow (PostgreSQL) all of it is one statement, atomic without a
    transaction (no BEGIN and COMMIT round trips), and ``flush_lazily`` (at-least-once rows
    only) lets that statement, its own transaction, commit without waiting for the WAL
    flush (``lazy_flush_item``); elsewhere it is the same statements as ``jobs_done``, the
    statistics' insert and the clear, in one transaction.
    """
    if not done:
        if clear_marks:
            inflight_clear(guard.token)
        return 0
    move = _move(guard, done, now, keep)
    counts = {"hour": dt(count_as[0]), "outcome": count_as[1],
              "shard": session_shard(STATS_SHARDS)}
    count = (f"INSERT INTO {JOB_STAT_SHARDS} (hour, target, outcome, tenant_id, shard, count) "
             "SELECT %(hour)s, target, %(outcome)s, COALESCE(tenant_id, ''), %(shard)s, "
             "COUNT(*) FROM {moved} GROUP BY target, tenant_id")
    assert not clear_marks or guard.lane is Lane.FAST, "a fast poll's marks"
    clear, clear_params = clear_inflight_sql(guard.token) if clear_marks else ("", {})
    params = {**move.params, **counts, **clear_params}
    if not writable_ctes():
        with transaction.atomic():
            if move.kept is not None:
                execute(f"WITH {move.kept} " + move.append.format(
                    moved=f"(SELECT * FROM {JOBS} WHERE {move.where})"), params)
            execute(count.format(moved=f"{JOBS} WHERE {move.where}"), params)
            matched = execute(f"DELETE FROM {JOBS} WHERE {move.where}", params)
            if clear_marks:
                inflight_clear(guard.token)
        return matched
    returning = "*" if move.kept is not None else "target, tenant_id"
    ctes = [f"moved AS (DELETE FROM {JOBS} WHERE {move.where} RETURNING {returning})"]
    if move.kept is not None:
        ctes = [move.kept, *ctes, f"appended AS ({move.append.format(moved='moved')} RETURNING 1)"]
    ctes.append(f"counted AS ({count.format(moved='moved')} RETURNING 1)")
    if clear_marks:
        ctes.append(f"cleared AS ({clear} RETURNING 1)")
    moved: int = fetch(f"WITH {', '.join(ctes)} SELECT COUNT(*){lazy_flush_item(flush_lazily)} "
                       "FROM moved", params, prepare=True)[0][0]
    return moved


def job_retry_later(guard: Guard, job_id: int, attempts: int, run_at: datetime, error: str,
                    now: datetime, try_json: str | None = None, *,
                    spend_attempt: bool = True) -> bool:
    """An answered failure: one more attempt spent, run again at ``run_at``
    (``spend_attempt=False``: a wait the downstream asked for, ``RateLimited``).

    Index: the primary key. ``try_json`` (long lane) is appended to the row's ``tries``."""
    where, where_params = guard.match([(job_id, attempts)])
    sets, set_params = guard.sets()
    spent = " + 1" if spend_attempt else ""
    return execute(
        f"UPDATE {JOBS} SET status = %(status)s, attempts = attempts{spent}, "
        "next_run_at = %(run_at)s, last_error = %(error)s, closed_at = NULL, "
        f"updated_at = %(now)s, tries = {_tries_after('%(tried)s')}, {sets} WHERE {where}",
        {"status": RETRIED[guard.lane].target, "run_at": dt(run_at), "error": cut_error(error),
         "now": dt(now), "tried": try_json, **set_params, **where_params},
    ) == 1


def job_release_unchanged(guard: Guard, job_id: int, attempts: int, error: str | None,
                          now: datetime) -> bool:
    """Not sent (target unreachable, or not this worker's probe): no attempt spent.

    Index: the primary key. The long lane gives the claim back. ``error=None`` keeps the
    row's last error."""
    where, where_params = guard.match([(job_id, attempts)])
    sets, set_params = guard.sets()
    error_sql, error_params = ("last_error = %(error)s, ", {"error": cut_error(error)}) \
        if error is not None else ("", {})
    return execute(
        f"UPDATE {JOBS} SET status = %(status)s, {error_sql}closed_at = NULL, "
        f"updated_at = %(now)s, {sets} WHERE {where}",
        {"status": RETRIED[guard.lane].target, **error_params, "now": dt(now), **set_params,
         **where_params},
    ) == 1


def job_close_dead(guard: Guard, job_id: int, attempts: int, error: str, now: datetime, *,
                   spend_attempt: bool, try_json: str | None = None) -> bool:
    """The row will not run again on its own: DEAD, with its error.

    Index: the primary key. ``spend_attempt``: the try counts as an attempt;
    ``try_json`` (long lane) is appended to the row's ``tries``."""
    where, where_params = guard.match([(job_id, attempts)])
    sets, set_params = guard.sets()
    spent = "attempts = attempts + 1, " if spend_attempt else ""
    return execute(
        f"UPDATE {JOBS} SET status = %(status)s, {spent}closed_at = %(now)s, "
        f"last_error = %(error)s, updated_at = %(now)s, tries = {_tries_after('%(tried)s')}, "
        f"{sets} WHERE {where}",
        {"status": CLOSED[guard.lane].target, "now": dt(now), "error": cut_error(error),
         "tried": try_json, **set_params, **where_params},
    ) == 1


def jobs_still_stored(ids: Sequence[int], using: str | None = None) -> set[int]:
    """The ids of ``ids`` whose row is still in the jobs table, whatever its status (those
    an outcome statement did not move or delete: another holder's, or changed by an admin).

    Index: the primary key."""
    clause, params = named(in_("id", ids, using), "ids")
    return {row[0] for row in fetch(f"SELECT id FROM {JOBS} WHERE {clause}", params, using)}


class StatBucket(NamedTuple):
    """What the hourly statistics count runs by; ``tenant_id`` '' for none."""

    hour: datetime
    target: str
    outcome: str
    tenant_id: str


def job_stats_add(counts: Mapping[StatBucket, int]) -> None:
    """Append run counts per bucket in one insert.

    Index: none (an insert). ``JobStatShard``: never an update, so nothing waits for
    another session's row and no row grows a chain of versions."""
    if not counts:
        return
    shard = session_shard(STATS_SHARDS)
    rows = [(dt(hour), target, outcome, tenant_id, shard, count)
            for (hour, target, outcome, tenant_id), count in counts.items()]
    values, params = named(values_(rows), "counts")
    execute(f"INSERT INTO {JOB_STAT_SHARDS} (hour, target, outcome, tenant_id, shard, count) "
            f"{values}", params)
