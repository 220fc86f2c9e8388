"""The long lane's statements: reserve under a lease, start, renew, and rescue the expired."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, NamedTuple

from django.db import IntegrityError, transaction

from jobs_engine.job import Job
from jobs_engine.store.connection import (
    execute,
    fetch,
    named,
)
from jobs_engine.store.dialect import (
    dt,
    in_,
    in_names,
    json_append,
    json_object,
    read_dt,
    read_json,
    skip_locked,
    text_array,
    writable_ctes,
)
from jobs_engine.store.rows import (
    AT_MOST_ONCE_VALUE,
    BEGINNING,
    CLOSED_COLUMNS,
    CURSOR_LAG,
    JOB_COLUMNS,
    JOBS,
    LONG_PENDING,
    PAUSES,
    RELEASE_REASON,
    RESCUE_PRESUMED_DEAD,
    RESCUE_REASON,
    RESCUE_RELEASE,
    RESERVE,
    RUNNING_VALUE,
    ClosedJob,
    closed_jobs,
    job_from_row,
    lazy_flush_item,
)

__all__ = [
    "LongCursor",
    "Reserved",
    "ReservedRows",
    "jobs_long_mark_started",
    "jobs_long_next_due",
    "jobs_long_renew",
    "jobs_long_rescue_expired",
    "jobs_long_reserve",
]

# -- long lane ----------------------------------------------------------------------------


# A try whose worker stopped answering: recorded as this exception (``errors.WorkerLost``).
WORKER_LOST = "jobs_engine.errors.WorkerLost"


def _lost_try() -> str:
    """The ``tries`` entry of a started row whose lease expired, built from the row."""
    return json_object([("worker", "claimed_by"), ("started_at", "started_at"),
                        ("finished_at", "%(now)s"), ("error", f"'{WORKER_LOST}'"),
                        ("traceback", "%(reason)s")])


def jobs_long_rescue_expired(now: datetime, *, after: datetime | None = None
                             ) -> tuple[list[ClosedJob], int]:
    """Close or release the RUNNING rows whose lease expired (their worker died or stalled).

    Index: ``jobs_running_lease``.
    With ``after``, only the leases that expired after it.

    At-most-once rows whose handler had started go DEAD instead of running twice, keeping
    their claim token (``Guard``: a holder alive after all still writes what happened);
    every other expired row goes back to PENDING for any worker to reserve. A started
    row's try is recorded in ``tries`` as lost. Returns the rows closed and the number
    released.
    """
    since = "" if after is None else " AND lease_until > %(after)s"
    lost = json_append("tries", _lost_try())
    dead = fetch(
        f"UPDATE {JOBS} SET status = %(dead)s, closed_at = %(now)s, last_error = %(reason)s, "
        "running_code = NULL, lease_until = NULL, updated_at = %(now)s, "
        f"attempts = attempts + 1, tries = {lost} "
        f"WHERE status = %(running)s AND lease_until <= %(now)s{since} "
        f"AND delivery_mode = %(at_most_once)s AND started_at IS NOT NULL "
        f"RETURNING {CLOSED_COLUMNS}",
        {"dead": RESCUE_PRESUMED_DEAD.target, "now": dt(now), "reason": RESCUE_REASON,
         "running": RESCUE_PRESUMED_DEAD.source_value, "after": dt(after),
         "at_most_once": AT_MOST_ONCE_VALUE},
    )
    released = execute(
        f"UPDATE {JOBS} SET status = %(pending)s, running_code = NULL, claim_token = NULL, "
        "claimed_by = NULL, lease_until = NULL, started_at = NULL, updated_at = %(now)s, "
        "attempts = attempts + CASE WHEN started_at IS NULL THEN 0 ELSE 1 END, "
        f"tries = CASE WHEN started_at IS NULL THEN tries ELSE {lost} END "
        f"WHERE status = %(running)s AND lease_until <= %(now)s{since}",
        {"pending": RESCUE_RELEASE.target, "now": dt(now), "reason": RELEASE_REASON,
         "running": RESCUE_RELEASE.source_value, "after": dt(after)},
    )
    return closed_jobs(dead, RESCUE_REASON), released


class Reserved(NamedTuple):
    """A row the long lane reserved: the job, and its earlier tries (its ``tries`` entries)
    when the reserve also marked it started, else None (its handler must not run before
    ``jobs_long_mark_started`` says so)."""

    job: Job
    earlier_tries: list[dict[str, Any]] | None


class LongCursor(NamedTuple):
    """Where a long-lane worker's next reserve starts within ``priority`` (``LongLane``):
    as ``Cursor`` does on the fast lane; rows of a higher priority are read from the
    first, and rows of a lower one after these."""

    priority: int
    band_from: datetime
    at: datetime
    id: int


class ReservedRows(list[Reserved]):
    """The rows a reserve took, in priority order; ``cursor``: where the next reserve may
    start, when it took every row it locked and as many as it was allowed (None: it did
    not, and the cursor it started from stands)."""

    cursor: LongCursor | None = None


# Every priority is below this one: a reserve from the first due row reads the range
# "lower than it" only.
_ABOVE_EVERY_PRIORITY = 32767

# A reserve's candidates: not of a target whose pause has not run out; started (their
# handlers run next) only where the target has no pause at all.
_NOT_PAUSED = (f"NOT EXISTS (SELECT 1 FROM {PAUSES} p WHERE p.target = j.target "
               "AND p.paused_until > %(now)s)")
_STARTED_AT = (f"CASE WHEN %(start)s AND NOT EXISTS (SELECT 1 FROM {PAUSES} p "
               f"WHERE p.target = {JOBS}.target) THEN %(now)s END")
_RESERVED_COLUMNS = (f"{', '.join(f'{JOBS}.{c}' for c in JOB_COLUMNS)}, {JOBS}.priority, "
                     f"{JOBS}.next_run_at, {JOBS}.started_at, {JOBS}.tries")
# Where a reserved row's values after a Job's are (the reserve's count of locked rows last).
_PRIORITY_COLUMN, _RUN_AT_COLUMN, _STARTED_AT_COLUMN, _TRIES_COLUMN, _LOCKED_COLUMN = (
    range(len(JOB_COLUMNS), len(JOB_COLUMNS) + 5))
# The update of a reserve's statement: the rows of ``picked`` (id, exclusive, code) claimed.
_CLAIM_PICKED = (f"UPDATE {JOBS} SET status = %(running)s, claim_token = %(token)s, "
                 "claimed_by = %(owner)s, lease_until = %(lease_until)s, running_code = CASE "
                 f"WHEN picked.exclusive THEN picked.code END, started_at = {_STARTED_AT}, "
                 f"updated_at = %(now)s FROM picked WHERE {JOBS}.id = picked.id")
# The four ranges of a reserve from a cursor, in the index's order, with their tests.
_RANGES = {"above": "j.priority > %(priority)s",
           "band": "j.priority = %(priority)s AND j.next_run_at > %(band_from)s "
                   "AND j.next_run_at < %(at)s",
           "after": "j.priority = %(priority)s AND (j.next_run_at, j.id) > (%(at)s, %(after_id)s)",
           "below": "j.priority < %(priority)s"}


def _free_code(exclusive_clause: str) -> str:
    """A candidate of an exclusive target whose code runs on some worker is not due. The
    running codes are read once per statement (NOT IN an uncorrelated subquery): a
    correlated test, planned on an empty queue, read the table once per candidate."""
    return (f"(NOT ({exclusive_clause}) OR j.code NOT IN (SELECT r.running_code FROM {JOBS} r "
            f"WHERE r.status = '{RUNNING_VALUE}' AND r.running_code IS NOT NULL))")


@lru_cache(maxsize=16)
def _reserve_statement(targets: tuple[str, ...], exclusive: tuple[str, ...],
                       flush_lazily: bool) -> str:
    """``jobs_long_reserve``'s one statement (PostgreSQL) for a worker's target lists,
    made once: the same text at every reserve. With many targets registered it is long,
    and assembling it at each reserve held the worker's thread between a woken reserve
    and its handler's start.

    Locked candidates, four ranges of the index in its order, each locked as it is read,
    the next read only while fewer rows than the limit were locked; then the first of
    each exclusive code (window functions may not share a level with FOR UPDATE), then
    the first at-most-once rows; the update of those picked. The targets reserved lately
    are a parameter, tested first (``likely``)."""
    names, _ = in_names("j.target", targets)  # a constant of the text: no parameters
    exclusive_clause, _ = in_names("j.target", exclusive)
    candidates = (f"SELECT j.id, j.code, j.priority, j.next_run_at, "
                  f"{exclusive_clause if exclusive else 'false'} AS exclusive, "
                  f"j.delivery_mode = '{AT_MOST_ONCE_VALUE}' AS at_most_once "
                  f"FROM {JOBS} j WHERE {LONG_PENDING} AND j.next_run_at <= %(now)s "
                  f"AND (j.target = ANY(%(likely)s::text[]) OR {names}) AND {_NOT_PAUSED} "
                  f"AND {_free_code(exclusive_clause)} AND {{range}} "
                  "ORDER BY j.priority DESC, j.next_run_at, j.id "
                  "LIMIT %(limit)s FOR UPDATE SKIP LOCKED")
    return (
        "WITH " + ", ".join(f"locked_{name} AS ({candidates.replace('{range}', test)})"
                            for name, test in _RANGES.items())
        + ", locked AS (SELECT * FROM (" + " UNION ALL ".join(
            f"SELECT * FROM locked_{name}" for name in _RANGES)
        + ") AS ranges LIMIT %(limit)s), "
        "first_of_code AS (SELECT * FROM (SELECT *, row_number() OVER (PARTITION "
        "BY exclusive, CASE WHEN exclusive THEN code END ORDER BY priority DESC, "
        "next_run_at, id) AS nth FROM locked) AS l WHERE NOT exclusive OR nth = 1), "
        "picked AS (SELECT id, exclusive, code, at_most_once FROM (SELECT *, "
        "row_number() OVER (PARTITION BY at_most_once ORDER BY priority DESC, "
        "next_run_at, id) AS nth_mode FROM first_of_code) AS m "
        "WHERE NOT at_most_once OR nth_mode <= %(at_most_once)s) "
        f"{_CLAIM_PICKED} RETURNING {_RESERVED_COLUMNS}, (SELECT count(*) FROM locked)"
        + lazy_flush_item(flush_lazily, "EXISTS (SELECT 1 FROM picked "
                        "WHERE exclusive OR at_most_once)"))


def jobs_long_reserve(owner: str, token: str, now: datetime, lease_s: float, limit: int, *,
                      exclusive_targets: Sequence[str] = (), targets: Sequence[str],
                      start: bool = False, at_most_once_limit: int | None = None,
                      flush_lazily: bool = False, after: LongCursor | None = None,
                      likely: Sequence[str] = ()) -> ReservedRows:
    """Claim up to ``limit`` due long-lane rows of ``targets`` under a lease, in priority order.

    Index: ``jobs_long_pending_due``, and ``jobs_one_running_per_code`` on the update.
    The index is read from the cursor ``after``; the unique code refuses a second running
    row of an exclusive code. Rows of targets whose pause has
    not run out are skipped; of them at most ``at_most_once_limit`` at-most-once rows
    (None: no bound of their own). An at-most-once row past that bound stays PENDING, and
    the rows after it are still taken.

    ``start``: the rows of targets without any pause are also marked started, in the same
    statement (their handlers run next; the reserve and the mark commit together, before
    any of them can have an effect). A row of a target whose pause ran out is reserved but
    not started: one of them may become the target's probe.

    Rows of an exclusive target also take ``running_code = code``; the unique partial
    index ``jobs_one_running_per_code`` then refuses a second RUNNING row of that code
    on any worker, and such a loser is simply not reserved. On PostgreSQL one statement
    picks and claims the rows (one round trip, no transaction), the first due row of each
    exclusive code among them; when another worker claimed one of those codes meanwhile,
    the index fails that statement and the rows are reserved again one code at a time.
    ``flush_lazily``: a reserve of at-least-once rows of targets that are not exclusive
    commits without waiting for its flush (``lazy_flush_item``); a crash that loses it
    leaves them PENDING, to run again before their lease would have run out.

    ``after`` (PostgreSQL): read the rows of its priority from that cursor. The due rows
    are then four ranges of the index, read in its order, each locked as it is read: the
    higher priorities, the cursor's lag band, the rows after it, the lower priorities. A
    row passed over because its exclusive code was running lies behind the cursor: the
    worker that ran the code reads from the first row next (``LongLane``), any other at
    its next read from the first row.

    ``likely`` (PostgreSQL): targets among ``targets`` the worker reserved rows of lately,
    tested first, as a parameter: a row of one of them is never tested against the whole
    list, whose hashed constant PostgreSQL builds at each statement that tests a row
    against it: work in proportion to the registered targets on a woken reserve's path.
    """
    at_most_once = limit if at_most_once_limit is None else min(limit, at_most_once_limit)
    params: dict[str, Any] = {
        "now": dt(now), "limit": limit, "at_most_once": at_most_once, "start": start,
        "running": RESERVE.target, "token": token, "owner": owner,
        "lease_until": dt(now + timedelta(seconds=lease_s))}

    if writable_ctes():
        # Inside a caller's transaction a savepoint keeps a refused statement from aborting
        # it; in autocommit the statement is its own transaction (no BEGIN, no COMMIT).
        alone = contextlib.nullcontext() if transaction.get_autocommit() else transaction.atomic()
        cursor = after or LongCursor(_ABOVE_EVERY_PRIORITY, BEGINNING, BEGINNING, 0)
        try:
            with alone:
                rows = fetch(
                    _reserve_statement(tuple(targets), tuple(exclusive_targets), flush_lazily),
                    {**params, "likely": text_array(sorted(likely)),
                     "priority": cursor.priority, "band_from": dt(cursor.band_from),
                     "at": dt(cursor.at), "after_id": cursor.id},
                    prepare=True)
        except IntegrityError:
            pass  # a code another worker claimed meanwhile: one code at a time below
        else:
            rows.sort(key=lambda row: (-row[_PRIORITY_COLUMN], row[_RUN_AT_COLUMN], row[0]))
            got = ReservedRows(_reserved(row) for row in rows)
            if len(rows) == limit and rows[-1][_LOCKED_COLUMN] == limit:
                # Every row it locked was taken, as many as it may: the next reserve starts
                # after the last.
                last = rows[-1]
                got.cursor = LongCursor(last[_PRIORITY_COLUMN], last[_RUN_AT_COLUMN] - CURSOR_LAG,
                                        last[_RUN_AT_COLUMN], last[0])
            return got
    target_clause, target_params = named(in_names("j.target", targets), "targets")
    excl_clause, excl_params = named(in_names("j.target", exclusive_targets), "exclusive")
    with transaction.atomic():
        candidates = fetch(
            f"SELECT j.id, j.target, j.code, j.delivery_mode FROM {JOBS} j "
            f"WHERE {LONG_PENDING} AND j.next_run_at <= %(now)s AND {target_clause} "
            f"AND {_NOT_PAUSED} AND {_free_code(excl_clause)} "
            f"ORDER BY j.priority DESC, j.next_run_at, j.id LIMIT %(limit)s{skip_locked()}",
            {**params, **target_params, **excl_params},
        )
        return _claim_in_turn(candidates, params, exclusive_targets, at_most_once)


def _reserved(row: Sequence[Any]) -> Reserved:
    """A reserved row (``_RESERVED_COLUMNS``): its job, and its earlier tries if started."""
    started = row[_STARTED_AT_COLUMN] is not None
    return Reserved(job_from_row(row), (read_json(row[_TRIES_COLUMN]) or []) if started else None)


def _claim_in_turn(candidates: Sequence[Sequence[Any]], params: dict[str, Any],
                   exclusive_targets: Sequence[str], at_most_once: int) -> ReservedRows:
    """Claim the locked ``candidates`` (id, target, code, delivery_mode, ...), taken in
    their order: the first of each exclusive code, the first ``at_most_once`` at-most-once
    rows; a statement for the others and one per exclusive code, in the caller's
    transaction. The rows claimed, in the candidates' order."""
    order: dict[int, int] = {row[0]: place for place, row in enumerate(candidates)}
    found: list[Reserved] = []
    exclusive = set(exclusive_targets)
    plain_ids: list[int] = []
    seen_codes: set[str] = set()
    exclusive_rows = []
    for job_id, target, code, mode, *_ in candidates:  # in the caller's order
        if target in exclusive:
            if code in seen_codes:
                continue
            seen_codes.add(code)
        if mode == AT_MOST_ONCE_VALUE:
            if at_most_once <= 0:
                continue
            at_most_once -= 1
        if target in exclusive:
            exclusive_rows.append((job_id, code))
        else:
            plain_ids.append(job_id)
    update = (
        f"UPDATE {JOBS} SET status = %(running)s, claim_token = %(token)s, "
        "claimed_by = %(owner)s, lease_until = %(lease_until)s, running_code = %(code)s, "
        f"started_at = {_STARTED_AT}, updated_at = %(now)s "
        f"WHERE {{where}} AND status = %(pending)s RETURNING {_RESERVED_COLUMNS}"
    )
    params = {**params, "pending": RESERVE.source_value}
    if plain_ids:
        clause, id_params = named(in_("id", plain_ids), "ids")
        rows = fetch(update.format(where=clause), {**params, **id_params, "code": None})
        found += [_reserved(row) for row in rows]
    for job_id, code in exclusive_rows:
        try:
            with transaction.atomic():
                rows = fetch(update.format(where="id = %(id)s"),
                             {**params, "id": job_id, "code": code})
        except IntegrityError:
            continue  # another worker runs this code right now
        found += [_reserved(row) for row in rows]
    return ReservedRows(sorted(found, key=lambda r: order[r.job.id]))  # type: ignore[index]  # a reserved row is stored: its id is set


def jobs_long_next_due(targets: Sequence[str], now: datetime) -> datetime | None:
    """When the next PENDING long-lane row of ``targets`` not yet due comes due.

    Index: ``jobs_long_pending_due``. The lane sleeps no longer than that (a deferred job
    runs on time, not at the next idle poll). Prepared: an idle worker asks after each
    reserve that found nothing, and planning the statement, with every registered
    target's name in it, cost more than running it."""
    target_clause, target_params = named(in_names("j.target", targets), "targets")
    rows = fetch(f"SELECT MIN(j.next_run_at) FROM {JOBS} j WHERE {LONG_PENDING} "
                 f"AND j.next_run_at > %(now)s AND {target_clause}",
                 {"now": dt(now), **target_params}, prepare=True)
    return read_dt(rows[0][0]) if rows else None


def _not_indexed(test: str) -> str:
    """``test`` of a row found by id, in a form no index answers. Few rows are RUNNING, so
    the planner prefers ``jobs_running_lease`` (RUNNING rows only) to the primary key for
    a statement that also tests the status; under an old snapshot that index holds an
    entry for every RUNNING version the snapshot still sees, and each is visited."""
    return f"({test}) IS TRUE"


def jobs_long_mark_started(ids: Sequence[int], token: str, now: datetime
                           ) -> dict[int, list[dict[str, Any]]]:
    """Record that the handlers of reserved rows are about to run; each row's earlier tries.

    Index: the primary key. Its status test is kept off other indexes (``_not_indexed``).
    One statement for every row; its ``tries`` entries come back with it. A row missing
    from the answer lost its claim meanwhile: it must not run."""
    clause, params = named(in_("id", ids), "ids")
    rows = fetch(
        f"UPDATE {JOBS} SET started_at = %(now)s WHERE {clause} AND claim_token = %(token)s "
        f"AND {_not_indexed('status = %(running)s')} RETURNING id, tries",
        {"now": dt(now), "token": token, "running": RUNNING_VALUE, **params},
    )
    return {job_id: read_json(tries) or [] for job_id, tries in rows}


def jobs_long_renew(held: Mapping[int, str], now: datetime, lease_s: float) -> set[str]:
    """Extend the leases of the RUNNING rows ``held`` (job id -> claim token); the tokens
    renewed.

    Index: the primary key. Its status test is kept off other indexes (``_not_indexed``):
    ``jobs_running_lease`` would be read from the first RUNNING version of the last
    lease's reserves an old snapshot keeps."""
    ids, id_params = named(in_("id", sorted(held), arrays_from=1), "ids")
    tokens, token_params = named(in_("claim_token", sorted(set(held.values())), arrays_from=1),
                                 "tokens")
    rows = fetch(
        f"UPDATE {JOBS} SET lease_until = %(lease_until)s WHERE {ids} AND {tokens} "
        f"AND {_not_indexed('status = %(running)s AND lease_until > %(now)s')} "
        "RETURNING claim_token",
        {"lease_until": dt(now + timedelta(seconds=lease_s)), "running": RUNNING_VALUE,
         "now": dt(now), **id_params, **token_params},
    )
    return {row[0] for row in rows}
