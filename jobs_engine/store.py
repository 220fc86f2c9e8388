"""Every database operation of the queue, in one place.

The worker loops, leases and outcome code never write SQL; they call these functions.
Each function is one named state transition or read, with its guard in its name or
docstring, so the hot SQL can be reviewed and indexed from this file alone. Functions
take the decision time ``now`` from the caller: workers read it from the database
(``db_now``) so skewed worker clocks stay correct, and tests pass a fixed value.

Both PostgreSQL and SQLite run these statements; the few differences (row locks,
NOTIFY, array parameters) are handled here and nowhere else.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any, NamedTuple

from django.db import IntegrityError, connection, connections, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from jobs_engine.models import Job, JobStat, Partition, TargetPause, VersionCounter, Worker
from jobs_engine.outage import OutageRecord
from jobs_engine.states import DeliveryMode, JobStatus, Lane

JOBS = Job._meta.db_table
PARTITIONS = Partition._meta.db_table
WORKERS = Worker._meta.db_table
PAUSES = TargetPause._meta.db_table
COUNTERS = VersionCounter._meta.db_table

NOTIFY_CHANNEL = "jobs_engine"
LAST_ERROR_LIMIT = 2000

_PENDING = JobStatus.PENDING.value
_RUNNING = JobStatus.RUNNING.value
_DEAD = JobStatus.DEAD.value

# Columns a handler needs, in the order ``_job_row`` reads them.
_JOB_COLUMNS = (
    "id, target, code, key, version, payload, headers, attempts, trace_id, dedupe_key, "
    "actor, partition, delivery_mode, created_at"
)


class JobRow(NamedTuple):
    """A job row as the lanes read it (a named tuple: the fast lane builds thousands a
    second, and a tuple is immutable at a third of a frozen dataclass's cost)."""

    id: int
    target: str
    code: str
    key: str | None
    version: int
    payload_json: str | None  # as stored: handlers.handler_payload decodes it
    headers: dict[str, Any]
    attempts: int
    trace_id: str
    dedupe_key: str
    actor: dict[str, Any] | None
    partition: int
    delivery_mode: str
    created_at: datetime | None
    claim_token: str | None = None


# -- helpers ----------------------------------------------------------------------------


def is_postgres(using: str | None = None) -> bool:
    return _conn(using).vendor == "postgresql"


def _conn(using: str | None) -> Any:
    return connection if using is None else connections[using]


def _dt(value: datetime | None, using: str | None = None) -> Any:
    """A datetime parameter in the form the backend stores (SQLite keeps naive UTC text)."""
    return _conn(using).ops.adapt_datetimefield_value(value)


def _read_dt(value: Any) -> datetime | None:
    if value is None:
        return None
    # SQLite's raw cursor gives naive UTC datetimes (or text); make them aware.
    parsed = value if isinstance(value, datetime) else parse_datetime(value)
    if parsed is not None and parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def _read_json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


# Lists from this length on go to PostgreSQL as one array parameter: the statement's text
# stays the same whatever the length, so the driver does not parse a new text at every
# call (it caches only statements of up to 50 parameters). Shorter lists are inlined,
# which plans faster for the one-row statements of per-row sends.
ARRAY_FROM = 16


def _in(column: str, values: Sequence[Any], using: str | None = None
        ) -> tuple[str, list[Any]]:
    """``column`` is one of ``values``; valid SQL for an empty list too."""
    if not values:
        return "1 = 0", []
    if len(values) >= ARRAY_FROM and is_postgres(using):
        return f"{column} = ANY(%s)", [_pg_array(values)]
    return f"{column} IN ({', '.join(['%s'] * len(values))})", list(values)


def _pg_array(values: Sequence[Any]) -> Any:
    """An array parameter. Integers go as one array literal, which PostgreSQL reads far
    faster than the driver dumps a list element by element (the fast lane's id lists)."""
    if all(type(value) is int for value in values):
        return "{" + ",".join(map(str, values)) + "}"
    return list(values)


def _rows(rows: Sequence[Sequence[Any]], types: Sequence[str]) -> tuple[str, list[Any]]:
    """A table of equal-length tuples (``types`` are their PostgreSQL column types), for
    ``IN (...)``, ``FROM (...)`` or a CTE: ``VALUES``, or on PostgreSQL from ``ARRAY_FROM``
    rows ``unnest`` of one array per column (as ``_in``)."""
    if len(rows) >= ARRAY_FROM and is_postgres():
        arrays = ", ".join(f"%s::{kind}[]" for kind in types)
        return f"SELECT * FROM unnest({arrays})", [_pg_array(column)
                                                   for column in zip(*rows, strict=True)]
    return _values(rows)


def _id_attempts_in(rows: Sequence[tuple[int, int]]) -> tuple[str, list[Any]]:
    """``(id, attempts)`` is one of ``rows``: an ``id IN`` per attempts value (a send's
    rows mostly share one), so even a large queue is read by its primary key."""
    ids_by_attempts: dict[int, list[int]] = {}
    for job_id, attempts in rows:
        ids_by_attempts.setdefault(attempts, []).append(job_id)
    clauses, params = [], []
    for attempts, ids in ids_by_attempts.items():
        ids_clause, ids_params = _in("id", ids)
        clauses.append(f"({ids_clause} AND attempts = %s)")
        params += [*ids_params, attempts]
    return f"({' OR '.join(clauses)})", params


def _values(rows: Sequence[Sequence[Any]]) -> tuple[str, list[Any]]:
    """``VALUES (%s, ...), ...`` of equal-length tuples, with their parameters."""
    row = f"({', '.join(['%s'] * len(rows[0]))})"
    return f"VALUES {', '.join([row] * len(rows))}", [value for r in rows for value in r]


@cache
def _timestamptz_loader() -> type:
    # psycopg is imported only on PostgreSQL: a SQLite-only project need not install it.
    from psycopg.types.datetime import TimestamptzLoader

    return TimestamptzLoader


def _fetch(sql: str, params: Sequence[Any] = (), using: str | None = None
           ) -> list[tuple[Any, ...]]:
    conn = _conn(using)
    with conn.cursor() as cursor:
        if conn.vendor == "postgresql":
            # The driver's own timestamptz loader: Django's wrapper re-sets the time zone of
            # every value in Python, a third of the fast lane's row decoding. The driver's
            # values are aware, in the session time zone Django sets: the same instants.
            cursor.cursor.adapters.register_loader("timestamptz", _timestamptz_loader())
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def _execute(sql: str, params: Sequence[Any] = ()) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def _json_param(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _jsonb(placeholder: str = "%s", using: str | None = None) -> str:
    """A JSON value for a jsonb column (PostgreSQL needs the cast, SQLite stores text)."""
    return f"{placeholder}::jsonb" if is_postgres(using) else placeholder


def _job_row(row: Sequence[Any], claim_token: str | None = None) -> JobRow:
    """A row of ``_JOB_COLUMNS`` (positional: this runs for every row a lane reads)."""
    (job_id, target, code, key, version, payload, headers, attempts, trace_id, dedupe_key,
     actor, partition, delivery_mode, created_at) = row[:14]
    return JobRow(job_id, target, code, key, version, payload,
                  _read_json(headers) if headers != "{}" else {}, attempts, trace_id,
                  dedupe_key, _read_json(actor), partition, delivery_mode,
                  _read_dt(created_at), claim_token)


def cut_error(text: str) -> str:
    """Error text a text column can hold on every database: cut, NUL removed (PostgreSQL
    text refuses it) and what UTF-8 cannot encode (lone surrogates) replaced. A handler's
    error may carry anything, e.g. a webhook's response body; if it could not be written,
    the outcome would be lost and the row run again and again."""
    text = text[:LAST_ERROR_LIMIT].replace("\x00", "")
    return text.encode("utf-8", "replace").decode("utf-8")


def db_now() -> datetime:
    """The database's clock: every lease and liveness decision is made on it."""
    if is_postgres():
        return _fetch("SELECT clock_timestamp()")[0][0]
    return timezone.now()


# -- enqueue ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class NewJob:
    code: str
    target: str
    lane: str
    key: str | None
    partition: int
    version: int
    payload_json: str
    headers: dict[str, Any]
    dedupe_key: str
    delivery_mode: str
    trace_id: str
    actor: dict[str, Any] | None
    run_at: datetime | None


# The run time of a key's head row. A new row of a key whose head waits for a retry
# starts at that time: it is held until then anyway, and keeping held rows out of the
# due range keeps the fast poll's cost flat. Parameters: partition, target, key.
_KEY_HEAD_RUN_AT = (
    f"SELECT h.next_run_at FROM {JOBS} h WHERE h.status = '{_PENDING}' AND h.partition = {{p}} "
    "AND h.target = {t} AND h.key = {k} ORDER BY h.version, h.id LIMIT 1"
)


def jobs_insert_many(rows: Sequence[NewJob], now: datetime, using: str | None = None
                     ) -> dict[str, int]:
    """Insert PENDING rows, skipping any whose dedupe_key exists; returns dedupe_key → id
    of the rows inserted.

    ``ON CONFLICT DO NOTHING`` never raises, so a duplicate cannot abort the caller's
    transaction. On PostgreSQL the same statement queues a NOTIFY per lane, which is
    delivered only when the caller's transaction commits.
    """
    if not rows:
        return {}
    columns = ("code, target, lane, key, partition, version, payload, headers, dedupe_key, "
               "status, delivery_mode, attempts, next_run_at, last_error, trace_id, actor, "
               "created_at, updated_at")
    returning = "ON CONFLICT (dedupe_key) DO NOTHING RETURNING id, dedupe_key, lane"
    actors = [_json_param(row.actor) if row.actor is not None else None for row in rows]
    if is_postgres(using):
        # One array per column: the statement text is the same for any batch size, and
        # the rows are stamped with the database's clock. One NOTIFY per lane.
        head = _KEY_HEAD_RUN_AT.format(p="u.partition", t="u.target", k="u.key")
        sql = (
            f"WITH inserted AS (INSERT INTO {JOBS} ({columns}) "
            "SELECT code, target, lane, key, partition, version, payload::jsonb, "
            f"headers::jsonb, dedupe_key, '{_PENDING}', delivery_mode, 0, "
            f"GREATEST(COALESCE(run_at, now()), ({head})), "
            "'', trace_id, actor::jsonb, now(), now() FROM unnest("
            "%s::text[], %s::text[], %s::text[], %s::text[], %s::smallint[], %s::bigint[], "
            "%s::text[], %s::text[], %s::text[], %s::text[], %s::timestamptz[], %s::text[], "
            "%s::text[]) AS u(code, target, lane, key, partition, version, payload, headers, "
            f"dedupe_key, delivery_mode, run_at, trace_id, actor) {returning}), "
            f"notified AS (SELECT pg_notify('{NOTIFY_CHANNEL}', lane) "
            "FROM (SELECT DISTINCT lane FROM inserted) AS lanes) "
            "SELECT id, dedupe_key, (SELECT COUNT(*) FROM notified) FROM inserted"
        )
        params: list[Any] = [
            [row.code for row in rows], [row.target for row in rows],
            [row.lane for row in rows], [row.key for row in rows],
            [row.partition for row in rows], [row.version for row in rows],
            [row.payload_json for row in rows], [_json_param(row.headers) for row in rows],
            [row.dedupe_key for row in rows], [row.delivery_mode for row in rows],
            [row.run_at for row in rows], [row.trace_id for row in rows], actors,
        ]
    else:
        stamp = _dt(now, using)
        head = _KEY_HEAD_RUN_AT.format(p="%s", t="%s", k="%s")
        one = (f"(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 0, "
               f"MAX(%s, COALESCE(({head}), %s)), '', %s, %s, %s, %s)")
        params = []
        for row, actor in zip(rows, actors, strict=True):
            run_at = _dt(row.run_at or now, using)
            params += [row.code, row.target, row.lane, row.key, row.partition, row.version,
                       row.payload_json, _json_param(row.headers), row.dedupe_key, _PENDING,
                       row.delivery_mode, run_at, row.partition, row.target, row.key, run_at,
                       row.trace_id, actor, stamp, stamp]
        sql = f"INSERT INTO {JOBS} ({columns}) VALUES {', '.join([one] * len(rows))} {returning}"
    return {dedupe_key: job_id for job_id, dedupe_key, _ in _fetch(sql, params, using)}


def jobs_ids_by_dedupe_key(dedupe_keys: Sequence[str], using: str | None = None
                           ) -> dict[str, int]:
    clause, params = _in("dedupe_key", dedupe_keys, using)
    return {key: job_id for job_id, key in _fetch(
        f"SELECT id, dedupe_key FROM {JOBS} WHERE {clause}", params, using)}


def version_counter_next(key: str, using: str | None = None) -> int:
    """Atomically add one to the counter of ``key`` (row-locked until the caller commits)."""
    return _fetch(
        f"INSERT INTO {COUNTERS} (key, value) VALUES (%s, 1) ON CONFLICT (key) "
        f"DO UPDATE SET value = {COUNTERS}.value + 1 RETURNING value", [key], using,
    )[0][0]


# -- workers and partition leases ----------------------------------------------------------


def partitions_seed(count: int) -> int:
    """Create partition rows 0..count-1 that are missing; safe for many workers at once."""
    values = ", ".join(["(%s, %s)"] * count)
    params: list[Any] = []
    for number in range(count):
        params += [number, "[]"]
    return _execute(
        f"INSERT INTO {PARTITIONS} (partition, inflight_ids) VALUES {values} "
        "ON CONFLICT (partition) DO NOTHING", params,
    )


def worker_beat(worker_id: str, now: datetime, *, hostname: str, pid: int, lanes: str,
                outages: OutageRecord | None = None) -> None:
    """Insert or refresh this worker's liveness row, with the database outages it lived
    through."""
    outages = outages or OutageRecord()
    _execute(
        f"INSERT INTO {WORKERS} (worker_id, heartbeat_at, started_at, hostname, pid, lanes, "
        "db_outages, last_db_outage_at, last_db_outage_s, last_db_error) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (worker_id) "
        "DO UPDATE SET heartbeat_at = excluded.heartbeat_at, db_outages = excluded.db_outages, "
        "last_db_outage_at = excluded.last_db_outage_at, "
        "last_db_outage_s = excluded.last_db_outage_s, last_db_error = excluded.last_db_error",
        [worker_id, _dt(now), _dt(now), hostname, pid, lanes, outages.count,
         _dt(outages.last_at), outages.last_s, cut_error(outages.last_error)],
    )


def worker_delete(worker_id: str) -> None:
    _execute(f"DELETE FROM {WORKERS} WHERE worker_id = %s", [worker_id])


def workers_live(now: datetime, within_s: float) -> list[str]:
    """Worker ids whose heartbeat is newer than ``within_s`` seconds."""
    rows = _fetch(f"SELECT worker_id FROM {WORKERS} WHERE heartbeat_at > %s ORDER BY worker_id",
                  [_dt(now - timedelta(seconds=within_s))])
    return [row[0] for row in rows]


def workers_outages() -> list[tuple[str, int, float]]:
    """(worker id, database outages ridden out, seconds the last one lasted) per worker."""
    return [(w, int(n), float(s)) for w, n, s in _fetch(
        f"SELECT worker_id, db_outages, last_db_outage_s FROM {WORKERS} ORDER BY worker_id")]


def partitions_renew_if_owner(owner: str, now: datetime, lease_s: float) -> list[int]:
    """Extend every lease ``owner`` still holds; a lease already expired is not renewed
    (another worker may have taken it). Returns the partitions still held."""
    rows = _fetch(
        f"UPDATE {PARTITIONS} SET lease_until = %s WHERE owner = %s AND lease_until > %s "
        "RETURNING partition",
        [_dt(now + timedelta(seconds=lease_s)), owner, _dt(now)],
    )
    return sorted(row[0] for row in rows)


def partition_owner_counts(now: datetime) -> dict[str, int]:
    rows = _fetch(
        f"SELECT owner, COUNT(*) FROM {PARTITIONS} WHERE owner IS NOT NULL AND lease_until > %s "
        "GROUP BY owner", [_dt(now)],
    )
    return {owner: count for owner, count in rows}


@dataclass(frozen=True)
class TakenPartition:
    partition: int
    inflight_ids: list[int]
    inflight_token: str | None


def partition_take_free(owner: str, now: datetime, lease_s: float) -> TakenPartition | None:
    """Take one partition that has no owner or an expired lease.

    One conditional UPDATE per take: the guard repeats the "free" test, so two workers
    racing for a partition cannot both win. Returns the previous in-flight mark so the
    new owner can judge it.
    """
    free = _fetch(
        f"SELECT partition FROM {PARTITIONS} WHERE owner IS NULL OR lease_until IS NULL "
        "OR lease_until <= %s ORDER BY partition LIMIT 8", [_dt(now)],
    )
    for (number,) in free:
        rows = _fetch(
            f"UPDATE {PARTITIONS} SET owner = %s, lease_until = %s WHERE partition = %s "
            "AND (owner IS NULL OR lease_until IS NULL OR lease_until <= %s) "
            "RETURNING partition, inflight_ids, inflight_token",
            [owner, _dt(now + timedelta(seconds=lease_s)), number, _dt(now)],
        )
        if rows:
            number, ids, token = rows[0]
            return TakenPartition(number, [int(i) for i in _read_json(ids) or []], token)
    return None


def partitions_release(owner: str, partitions: Sequence[int]) -> int:
    """Give partitions back (only while ``owner`` still holds them)."""
    clause, params = _in("partition", partitions)
    return _execute(
        f"UPDATE {PARTITIONS} SET owner = NULL, lease_until = NULL WHERE owner = %s AND {clause}",
        [owner, *params],
    )


def partitions_release_owned(owner: str) -> int:
    return _execute(f"UPDATE {PARTITIONS} SET owner = NULL, lease_until = NULL WHERE owner = %s",
                    [owner])


def partitions_mark_inflight_if_leased(
    owner: str, now: datetime, inflight: Mapping[int, Sequence[int]], token: str,
    sending: Sequence[tuple[int, int, int]],
) -> set[int]:
    """Record rows about to be handed to a target in their partitions' in-flight marks,
    under the poll's token, in one statement for every partition of the send.

    ``inflight`` maps each partition of the send to every row handed in this poll so far
    plus the rows about to go; ``sending`` is those rows as (partition, id, attempts).
    A partition is marked only while ``owner`` holds a live lease on it and every row of
    it in ``sending`` is still PENDING as read (a takeover or an admin may have closed
    one). Returns the partitions marked; for the others send nothing, and
    ``jobs_still_pending`` tells a lost lease from a closed row.
    """
    counts: dict[int, int] = {}
    for partition, _, _ in sending:
        counts[partition] = counts.get(partition, 0) + 1
    marks, mark_params = _rows([(p, _json_param(list(inflight[p])), n)
                                for p, n in counts.items()], ("int", "jsonb", "int"))
    sent, sent_params = _id_attempts_in([(job_id, attempts) for _, job_id, attempts in sending])
    rows = _fetch(
        f"WITH mark(partition, ids, n) AS ({marks}), "
        f"live(partition, n) AS (SELECT partition, COUNT(*) FROM {JOBS} "
        f"WHERE status = %s AND {sent} GROUP BY partition) "
        f"UPDATE {PARTITIONS} SET inflight_ids = {_jsonb('mark.ids')}, inflight_token = %s "
        "FROM mark JOIN live ON live.partition = mark.partition AND live.n = mark.n "
        f"WHERE {PARTITIONS}.partition = mark.partition AND {PARTITIONS}.owner = %s "
        f"AND {PARTITIONS}.lease_until > %s RETURNING {PARTITIONS}.partition",
        [*mark_params, _PENDING, *sent_params, token, owner, _dt(now)],
    )
    return {row[0] for row in rows}


def jobs_still_pending(rows: Sequence[tuple[int, int]]) -> set[int]:
    """Ids of the (id, attempts) rows that are still PENDING as read."""
    pending, params = _id_attempts_in(rows)
    return {row[0] for row in _fetch(
        f"SELECT id FROM {JOBS} WHERE status = %s AND {pending}",
        [_PENDING, *params])}


def partitions_clear_inflight(token: str) -> None:
    """Clear the in-flight marks a poll made (its outcomes are written)."""
    _execute(
        f"UPDATE {PARTITIONS} SET inflight_ids = {_jsonb()}, inflight_token = NULL "
        "WHERE inflight_token = %s", ["[]", token],
    )


@dataclass(frozen=True)
class ClosedJob:
    id: int
    target: str
    code: str
    dedupe_key: str
    reason: str


def inflight_close_after_takeover(taken: TakenPartition, now: datetime) -> list[ClosedJob]:
    """Judge the rows the previous owner had in flight.

    A row whose outcome was written under that token is left alone. At-most-once rows
    go DEAD (the send may have landed); at-least-once rows stay PENDING to be sent again.
    """
    reason = "in flight when its partition was taken over"
    closed: list[ClosedJob] = []
    if taken.inflight_ids:
        clause, params = _in("id", taken.inflight_ids)
        # The DEAD row keeps the previous holder's token (``Guard``): if that worker is
        # alive after all (a database outage, a stall), its outcome write still lands.
        rows = _fetch(
            f"UPDATE {JOBS} SET status = %s, closed_at = %s, last_error = %s, updated_at = %s, "
            f"claim_token = %s WHERE {clause} AND status = %s AND delivery_mode = %s "
            "AND (outcome_token IS NULL OR outcome_token <> %s) "
            "RETURNING id, target, code, dedupe_key",
            [_DEAD, _dt(now), reason, _dt(now), taken.inflight_token, *params, _PENDING,
             DeliveryMode.AT_MOST_ONCE.value, taken.inflight_token or ""],
        )
        closed = [ClosedJob(r[0], r[1], r[2], r[3], reason) for r in rows]
    if taken.inflight_token:
        _execute(f"UPDATE {PARTITIONS} SET inflight_ids = {_jsonb()}, inflight_token = NULL "
                 "WHERE partition = %s AND inflight_token = %s",
                 ["[]", taken.partition, taken.inflight_token])
    return closed


# -- fast lane --------------------------------------------------------------------------------


def _fast_heads_sql(partitions: Sequence[int], now: datetime, limits: Mapping[str, int], *,
                    whole_backlog: bool = False) -> tuple[str, list[Any]]:
    """The heads of each target in ``limits``, UNION ALL: ``_JOB_COLUMNS`` plus
    ``next_run_at``.

    A target's heads are those among its first ``limit`` due rows (its window), so a deep
    backlog on few keys costs a poll ``limit`` rows, not the whole backlog; the later
    versions among them wait for a later poll. ``whole_backlog``: the first ``limit``
    heads of the whole due backlog.
    """
    part_clause, part_params = _in("j.partition", partitions)
    due = (f"SELECT {', '.join('j.' + c.strip() for c in _JOB_COLUMNS.split(','))}, "
           f"j.next_run_at FROM {JOBS} j WHERE j.lane = %s AND j.status = %s "
           f"AND j.target = %s AND j.next_run_at <= %s AND {part_clause}")
    head = ("(j.key IS NULL OR NOT EXISTS ("
            f"SELECT 1 FROM {JOBS} e WHERE e.status = %s AND e.key IS NOT NULL "
            "AND e.partition = j.partition AND e.target = j.target AND e.key = j.key "
            "AND (e.version, e.id) < (j.version, j.id)))")
    order = "ORDER BY j.next_run_at, j.id LIMIT %s"
    if whole_backlog:
        per_target = f"SELECT * FROM ({due} AND {head} {order}) AS t{{n}}"
    else:
        per_target = f"SELECT * FROM ({due} {order}) AS j WHERE {head}"
    branches, params = [], []
    for n, (target, limit) in enumerate(limits.items()):
        branches.append(per_target.format(n=n))
        due_params = [Lane.FAST.value, _PENDING, target, _dt(now), *part_params]
        params += ([*due_params, _PENDING, limit] if whole_backlog
                   else [*due_params, limit, _PENDING])
    return " UNION ALL ".join(branches), params


_COLUMN_NAMES = ", ".join(c.strip() for c in _JOB_COLUMNS.split(","))


def jobs_fast_due(partitions: Sequence[int], now: datetime, limits: Mapping[str, int], *,
                  whole_backlog: bool = False) -> list[JobRow]:
    """Due PENDING fast-lane rows of the targets in ``limits`` (up to its limit each) in
    the given partitions, each the head of its key, in run order: the heads among each
    target's first ``limit`` due rows (``_fast_heads_sql``).

    A row is the head when no PENDING row of the same target and key comes before it in
    (version, id) order, whatever that row's run time: a row waiting for a retry holds
    the later versions of its key (``jobs_hold_key_until`` moves those out of the way).
    DEAD rows hold nothing. Index-backed: one scan of ``jobs_fast_pending_due`` per
    target, so a paused target's backlog is never walked, and each hold test is one
    probe of ``jobs_pending_key_order``.

    ``whole_backlog``: the first heads of each target's whole due backlog instead. A
    window holds no head when every row in it waits for an earlier version due later
    (versions committed out of order); this walk keeps the lane from stalling behind
    them, and reads the whole backlog, so the lane runs it seldom.
    """
    if not limits or not partitions:
        return []
    union, params = _fast_heads_sql(partitions, now, limits, whole_backlog=whole_backlog)
    return [_job_row(row) for row in _fetch(
        f"SELECT {_COLUMN_NAMES} FROM ({union}) AS due ORDER BY next_run_at, id", params)]


@dataclass(frozen=True)
class FastPoll:
    rows: list[JobRow]
    marked_target: str | None = None  # the target whose rows the poll marked in flight
    marked: Mapping[int, list[int]] = field(default_factory=dict)  # partition -> ids


def jobs_fast_poll(
    partitions: Sequence[int], now: datetime, limits: Mapping[str, int], *, owner: str,
    token: str, markable: Collection[str],
) -> FastPoll:
    """``jobs_fast_due``, with the rows of the poll's first send marked in flight by the
    read itself when that send takes the whole poll.

    The first send is the rows of the first target in name order (the lane sends target
    by target in that order); its rows are marked when that target is in ``markable``.
    Marks are those of ``partitions_mark_inflight_if_leased`` (poll token, live lease of
    ``owner``); a partition whose lease is gone is not marked. PostgreSQL reads and
    marks in one statement, so a marked row is PENDING as read and no separate mark
    statement (the largest fixed cost of a send) is needed; SQLite reads, then marks with
    the guarded statement.
    """
    if not limits or not partitions:
        return FastPoll([])
    if not is_postgres():
        rows = jobs_fast_due(partitions, now, limits)
        first = min((row.target for row in rows), default=None)
        if first not in markable:
            return FastPoll(rows)
        wanted: dict[int, list[int]] = {}
        for row in rows:
            if row.target == first:
                wanted.setdefault(row.partition, []).append(row.id)
        marked = partitions_mark_inflight_if_leased(
            owner, now, wanted, token,
            [(row.partition, row.id, row.attempts) for row in rows if row.target == first])
        return FastPoll(rows, first, {p: ids for p, ids in wanted.items() if p in marked})
    union, params = _fast_heads_sql(partitions, now, limits)
    markable_clause, markable_params = _in("target", list(markable))
    first_send = f"target = (SELECT min(target) FROM due) AND {markable_clause}"
    # The marks as one object {partition: ids}: the update reads the owner's partitions
    # once, where a join of one row per partition compared every pair (64 by 64).
    fetched = _fetch(
        f"WITH due AS MATERIALIZED ({union}), "
        "first_send AS MATERIALIZED (SELECT jsonb_object_agg(partition, ids) AS marks "
        f"FROM (SELECT partition, jsonb_agg(id) AS ids FROM due WHERE {first_send} "
        "GROUP BY partition) AS by_partition), "
        f"marked AS (UPDATE {PARTITIONS} p SET inflight_ids = f.marks -> p.partition::text, "
        "inflight_token = %s FROM first_send f WHERE f.marks ? p.partition::text "
        "AND p.owner = %s AND p.lease_until > %s RETURNING p.partition) "
        f"SELECT {_COLUMN_NAMES}, {first_send} AND partition IN (SELECT partition FROM marked) "
        "FROM due ORDER BY next_run_at, id",
        [*params, *markable_params, token, owner, _dt(now), *markable_params],
    )
    rows = [_job_row(row) for row in fetched]
    marks: dict[int, list[int]] = {}
    for row, values in zip(rows, fetched, strict=True):
        if values[-1]:
            marks.setdefault(row.partition, []).append(row.id)
    first = min((row.target for row in rows), default=None)
    return FastPoll(rows, first if first in markable else None, marks)


def jobs_hold_key_until(row: JobRow, run_at: datetime) -> int:
    """Move the later PENDING versions of a retrying row's key to its retry time.

    They are held anyway (the row is the key's head); moving them keeps the poll's scan
    from walking them again and again until then.
    """
    return _execute(
        f"UPDATE {JOBS} SET next_run_at = %s WHERE status = %s AND partition = %s "
        "AND target = %s AND key = %s AND (version > %s OR (version = %s AND id > %s)) "
        "AND next_run_at < %s",
        [_dt(run_at), _PENDING, row.partition, row.target, row.key, row.version, row.version,
         row.id, _dt(run_at)],
    )


# -- long lane --------------------------------------------------------------------------------


def jobs_long_rescue_expired(now: datetime) -> tuple[list[ClosedJob], int]:
    """Deal with RUNNING rows whose lease expired (their worker died or stalled).

    At-most-once rows whose handler had started go DEAD instead of running twice; every
    other expired row goes back to PENDING for any worker to reserve. Returns the rows
    closed and the number released.
    """
    reason = "lease expired while running; at-most-once rows are not run twice"
    expired = _dt(now)
    # The DEAD rows keep their claim token (``Guard``): a holder that is alive after all
    # (a database outage longer than the lease) still writes what really happened.
    dead = _fetch(
        f"UPDATE {JOBS} SET status = %s, closed_at = %s, last_error = %s, running_code = NULL, "
        "lease_until = NULL, updated_at = %s "
        "WHERE status = %s AND lease_until <= %s AND delivery_mode = %s "
        "AND started_at IS NOT NULL RETURNING id, target, code, dedupe_key",
        [_DEAD, expired, reason, expired, _RUNNING, expired, DeliveryMode.AT_MOST_ONCE.value],
    )
    released = _execute(
        f"UPDATE {JOBS} SET status = %s, running_code = NULL, claim_token = NULL, "
        "claimed_by = NULL, lease_until = NULL, started_at = NULL, updated_at = %s "
        "WHERE status = %s AND lease_until <= %s",
        [_PENDING, expired, _RUNNING, expired],
    )
    return [ClosedJob(r[0], r[1], r[2], r[3], reason) for r in dead], released


def jobs_long_reserve(
    owner: str,
    token: str,
    now: datetime,
    lease_s: float,
    limit: int,
    *,
    exclusive_targets: Sequence[str] = (),
    targets: Sequence[str],
) -> list[JobRow]:
    """Reserve up to ``limit`` due PENDING long-lane rows of ``targets`` under ``token``
    and a lease.

    Rows of an exclusive target also take ``running_code = code``; the unique partial
    index ``jobs_one_running_per_code`` then refuses a second RUNNING row of that code
    on any worker, and such a loser is simply not reserved.
    """
    lease_until = _dt(now + timedelta(seconds=lease_s))
    target_clause, target_params = _in("j.target", targets)
    excl_clause, excl_params = _in("j.target", exclusive_targets)
    lock = " FOR UPDATE SKIP LOCKED" if is_postgres() else ""
    reserved: list[JobRow] = []
    with transaction.atomic():
        candidates = _fetch(
            f"SELECT j.id, j.target, j.code FROM {JOBS} j WHERE j.lane = %s AND j.status = %s "
            f"AND j.next_run_at <= %s AND {target_clause} AND (NOT ({excl_clause}) OR NOT EXISTS ("
            f"SELECT 1 FROM {JOBS} r WHERE r.status = %s AND r.running_code = j.code)) "
            f"ORDER BY j.next_run_at, j.id LIMIT %s{lock}",
            [Lane.LONG.value, _PENDING, _dt(now), *target_params, *excl_params, _RUNNING, limit],
        )
        exclusive = set(exclusive_targets)
        plain_ids = [job_id for job_id, target, _ in candidates if target not in exclusive]
        seen_codes: set[str] = set()
        exclusive_rows = []
        for job_id, target, code in candidates:
            if target in exclusive and code not in seen_codes:
                seen_codes.add(code)
                exclusive_rows.append((job_id, code))
        update = (
            f"UPDATE {JOBS} SET status = %s, claim_token = %s, claimed_by = %s, lease_until = %s, "
            "running_code = %s, started_at = NULL, updated_at = %s WHERE {where} AND status = %s "
            f"RETURNING {_JOB_COLUMNS}"
        )
        if plain_ids:
            clause, params = _in("id", plain_ids)
            rows = _fetch(update.format(where=clause),
                          [_RUNNING, token, owner, lease_until, None, _dt(now), *params, _PENDING])
            reserved += [_job_row(row, token) for row in rows]
        for job_id, code in exclusive_rows:
            try:
                with transaction.atomic():
                    rows = _fetch(update.format(where="id = %s"),
                                  [_RUNNING, token, owner, lease_until, code, _dt(now), job_id,
                                   _PENDING])
            except IntegrityError:
                continue  # another worker runs this code right now
            reserved += [_job_row(row, token) for row in rows]
    return sorted(reserved, key=lambda row: row.id)


def job_long_mark_started(job_id: int, token: str, now: datetime) -> bool:
    """Record that the handler is about to run; False when the claim was lost."""
    return _execute(
        f"UPDATE {JOBS} SET started_at = %s WHERE id = %s AND claim_token = %s AND status = %s",
        [_dt(now), job_id, token, _RUNNING],
    ) == 1


def jobs_long_renew(tokens: Sequence[str], now: datetime, lease_s: float) -> set[str]:
    """Extend the leases of RUNNING rows held under ``tokens``; returns the tokens renewed."""
    clause, params = _in("claim_token", tokens)
    rows = _fetch(
        f"UPDATE {JOBS} SET lease_until = %s WHERE status = %s AND {clause} "
        "AND lease_until > %s RETURNING claim_token",
        [_dt(now + timedelta(seconds=lease_s)), _RUNNING, *params, _dt(now)],
    )
    return {row[0] for row in rows}


# -- outcomes (both lanes) ----------------------------------------------------------------------


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
        """SQL true for the ``(id, attempts read)`` rows this holder may still write."""
        ids, id_params = _in("id", [job_id for job_id, _ in rows])
        if self.lane is Lane.LONG:
            return (f"{ids} AND status IN (%s, %s) AND claim_token = %s",
                    [*id_params, _RUNNING, _DEAD, self.token])
        if len({attempts for _, attempts in rows}) == 1:
            read, read_params = "attempts = %s", [rows[0][1]]
        else:
            read, read_params = _id_attempts_in(rows)
        return (f"{ids} AND ((status = %s AND {read}) OR (status = %s AND claim_token = %s))",
                [*id_params, _PENDING, *read_params, _DEAD, self.token])

    def sets(self) -> tuple[str, list[Any]]:
        if self.lane is Lane.FAST:
            return "outcome_token = %s, claim_token = NULL", [self.token]
        return ("claim_token = NULL, claimed_by = NULL, lease_until = NULL, running_code = NULL, "
                "started_at = NULL", [])


def jobs_delete_succeeded(guard: Guard, rows: Sequence[tuple[int, int]]) -> int:
    """Delete rows whose handler returned (one statement for a whole send); ``rows`` are
    (id, attempts read)."""
    if not rows:
        return 0
    where, params = guard.match(rows)
    return _execute(f"DELETE FROM {JOBS} WHERE {where}", params)


def job_retry_later(guard: Guard, job_id: int, attempts: int, run_at: datetime, error: str,
                    now: datetime) -> bool:
    """An answered failure: one more attempt spent, run again at ``run_at``."""
    where, where_params = guard.match([(job_id, attempts)])
    sets, set_params = guard.sets()
    return _execute(
        f"UPDATE {JOBS} SET status = %s, attempts = attempts + 1, next_run_at = %s, "
        f"last_error = %s, closed_at = NULL, updated_at = %s, {sets} WHERE {where}",
        [_PENDING, _dt(run_at), cut_error(error), _dt(now), *set_params, *where_params],
    ) == 1


def job_release_unchanged(guard: Guard, job_id: int, attempts: int, error: str | None,
                          now: datetime) -> bool:
    """Not sent (target unreachable, or not this worker's probe): no attempt spent; the
    long lane gives the claim back. ``error=None`` keeps the row's last error."""
    where, where_params = guard.match([(job_id, attempts)])
    sets, set_params = guard.sets()
    error_sql, error_params = ("last_error = %s, ", [cut_error(error)]) if error is not None \
        else ("", [])
    return _execute(
        f"UPDATE {JOBS} SET status = %s, {error_sql}closed_at = NULL, updated_at = %s, {sets} "
        f"WHERE {where}",
        [_PENDING, *error_params, _dt(now), *set_params, *where_params],
    ) == 1


def job_close_dead(guard: Guard, job_id: int, attempts: int, error: str, now: datetime, *,
                   spend_attempt: bool) -> bool:
    where, where_params = guard.match([(job_id, attempts)])
    sets, set_params = guard.sets()
    spent = "attempts = attempts + 1, " if spend_attempt else ""
    return _execute(
        f"UPDATE {JOBS} SET status = %s, {spent}closed_at = %s, last_error = %s, updated_at = %s, "
        f"{sets} WHERE {where}",
        [_DEAD, _dt(now), cut_error(error), _dt(now), *set_params, *where_params],
    ) == 1


# -- shared pause state ------------------------------------------------------------------------


@dataclass(frozen=True)
class PauseRow:
    target: str
    paused_until: datetime
    reason: str


def pauses_all() -> list[PauseRow]:
    return [PauseRow(t, _read_dt(u), r) for t, u, r in  # type: ignore[arg-type]
            _fetch(f"SELECT target, paused_until, reason FROM {PAUSES}")]


def pause_set(target: str, now: datetime, probe_s: float, reason: str) -> None:
    """Pause ``target`` until ``now + probe_s`` (insert or extend)."""
    until = _dt(now + timedelta(seconds=probe_s))
    _execute(
        f"INSERT INTO {PAUSES} (target, paused_until, reason, paused_at, probe_by) "
        "VALUES (%s, %s, %s, %s, NULL) ON CONFLICT (target) DO UPDATE SET "
        "paused_until = excluded.paused_until, reason = excluded.reason, probe_by = NULL",
        [target, until, cut_error(reason), _dt(now)],
    )


def pause_claim_probe(target: str, owner: str, now: datetime, probe_s: float) -> bool:
    """Win the right to send one probe row of a paused target whose pause ran out.

    The guard on the old ``paused_until`` makes the probe cluster-wide: one worker wins
    per ``PROBE_S``, the rest keep skipping the target.
    """
    return _execute(
        f"UPDATE {PAUSES} SET paused_until = %s, probe_by = %s "
        "WHERE target = %s AND paused_until <= %s",
        [_dt(now + timedelta(seconds=probe_s)), owner, target, _dt(now)],
    ) == 1


def pause_clear(target: str) -> int:
    return _execute(f"DELETE FROM {PAUSES} WHERE target = %s", [target])


# -- reads for tests, admin and benchmarks -------------------------------------------------


def jobs_count(statuses: Iterable[str] | None = None) -> int:
    if statuses is None:
        return _fetch(f"SELECT COUNT(*) FROM {JOBS}")[0][0]
    clause, params = _in("status", list(statuses))
    return _fetch(f"SELECT COUNT(*) FROM {JOBS} WHERE {clause}", params)[0][0]


# -- operator actions, statistics and retention -------------------------------------------
# Admin and API actions on single rows: each is one conditional statement whose guard is
# the state the action needs, so two operators racing on one row cannot both win.

JOB_STATS = JobStat._meta.db_table


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
    return RemovedJob(*row[:10], _read_dt(row[10]))


@dataclass(frozen=True)
class JobState:
    """What an operator action needs to explain a refusal."""

    status: str
    lane: str
    started: bool
    in_flight: bool


def _in_flight_sql(using: str | None = None) -> str:
    """SQL true while the ``JOBS`` row being tested sits in its partition's in-flight mark."""
    if is_postgres(using):
        return (f"EXISTS (SELECT 1 FROM {PARTITIONS} p WHERE p.partition = {JOBS}.partition "
                f"AND p.inflight_ids @> to_jsonb({JOBS}.id))")
    return (f"EXISTS (SELECT 1 FROM {PARTITIONS} p, json_each(p.inflight_ids) f "
            f"WHERE p.partition = {JOBS}.partition AND f.value = {JOBS}.id)")


def job_retry_if_dead(job_id: int, now: datetime) -> bool:
    """DEAD → PENDING, due at ``now`` with attempts 0 and no claim; False when the row is
    missing or not DEAD (e.g. a concurrent retry won). ``last_error`` stays as evidence;
    ``outcome_token`` stays so a stale in-flight mark cannot close the retried row."""
    return _execute(
        f"UPDATE {JOBS} SET status = %s, attempts = 0, next_run_at = %s, closed_at = NULL, "
        "claim_token = NULL, claimed_by = NULL, lease_until = NULL, started_at = NULL, "
        "running_code = NULL, updated_at = %s WHERE id = %s AND status = %s",
        [_PENDING, _dt(now), _dt(now), job_id, _DEAD],
    ) == 1


def job_delete_if_dead(job_id: int) -> RemovedJob | None:
    """Skip: delete a DEAD row; None when it is missing or not DEAD."""
    rows = _fetch(
        f"DELETE FROM {JOBS} WHERE id = %s AND status = %s RETURNING {_REMOVED_COLUMNS}",
        [job_id, _DEAD])
    return _removed(rows[0]) if rows else None


def job_delete_if_not_started(job_id: int) -> RemovedJob | None:
    """Cancel: delete a PENDING row that is not in its partition's in-flight mark, or a
    long-lane RUNNING row whose handler has not started; None otherwise.

    The long lane marks a row started with a guarded write on the same row, so a cancel
    and a start serialise on the row: one of them matches nothing.
    """
    rows = _fetch(
        f"DELETE FROM {JOBS} WHERE id = %s AND ((status = %s AND NOT {_in_flight_sql()}) "
        f"OR (status = %s AND lane = %s AND started_at IS NULL)) RETURNING {_REMOVED_COLUMNS}",
        [job_id, _PENDING, _RUNNING, Lane.LONG.value],
    )
    return _removed(rows[0]) if rows else None


def jobs_release_key_held_by(removed: RemovedJob, now: datetime) -> int:
    """After a cancelled fast-lane key head: its later PENDING versions that were moved to
    its retry time (``jobs_hold_key_until`` or enqueue behind it) become due now."""
    if removed.lane != Lane.FAST.value or removed.key is None or removed.next_run_at is None \
            or removed.next_run_at <= now:
        return 0
    return _execute(
        f"UPDATE {JOBS} SET next_run_at = %s WHERE status = %s AND partition = %s "
        "AND target = %s AND key = %s AND (version > %s OR (version = %s AND id > %s)) "
        "AND next_run_at = %s",
        [_dt(now), _PENDING, removed.partition, removed.target, removed.key, removed.version,
         removed.version, removed.id, _dt(removed.next_run_at)],
    )


def job_state(job_id: int) -> JobState | None:
    rows = _fetch(f"SELECT status, lane, started_at IS NOT NULL, {_in_flight_sql()} "
                  f"FROM {JOBS} WHERE id = %s", [job_id])
    if not rows:
        return None
    status, lane, started, in_flight = rows[0]
    return JobState(status, lane, bool(started), bool(in_flight))


def job_stats_add(counts: Mapping[tuple[datetime, str, str], int]) -> None:
    """Add run counts per (hour, target, outcome) in one upsert.

    Rows go in sorted order so two workers upserting the same buckets lock them in the
    same order (no deadlock).
    """
    if not counts:
        return
    rows = [(_dt(hour), target, outcome, count)
            for (hour, target, outcome), count in sorted(counts.items())]
    values, params = _values(rows)
    _execute(
        f"INSERT INTO {JOB_STATS} (hour, target, outcome, count) {values} "
        "ON CONFLICT (hour, target, outcome) "
        f"DO UPDATE SET count = {JOB_STATS}.count + excluded.count", params,
    )


def job_stats_since(since: datetime) -> list[tuple[datetime, str, str, int]]:
    """(hour, target, outcome, count) of the hours from ``since`` on, oldest first."""
    rows = _fetch(f"SELECT hour, target, outcome, count FROM {JOB_STATS} WHERE hour >= %s "
                  "ORDER BY hour, target, outcome", [_dt(since)])
    return [(_read_dt(h), t, o, c) for h, t, o, c in rows]  # type: ignore[misc]


def job_stats_totals() -> list[tuple[str, str, int]]:
    """(target, outcome, runs) summed over every hour kept."""
    return [(t, o, int(c)) for t, o, c in _fetch(
        f"SELECT target, outcome, SUM(count) FROM {JOB_STATS} GROUP BY target, outcome "
        "ORDER BY target, outcome")]


def jobs_delete_dead_closed_before(cutoff: datetime, limit: int) -> int:
    """Retention: delete up to ``limit`` DEAD rows closed before ``cutoff`` (index
    ``jobs_status_closed``). Rows another worker is deleting right now are skipped."""
    lock = " FOR UPDATE SKIP LOCKED" if is_postgres() else ""
    return _execute(
        f"DELETE FROM {JOBS} WHERE id IN (SELECT id FROM {JOBS} WHERE status = %s "
        f"AND closed_at < %s ORDER BY closed_at LIMIT %s{lock})",
        [_DEAD, _dt(cutoff), limit],
    )


def jobs_pending_by_lane() -> dict[str, tuple[int, datetime | None]]:
    """lane → (PENDING rows, earliest next_run_at): a count, so a scan of the pending rows."""
    rows = _fetch(f"SELECT lane, COUNT(*), MIN(next_run_at) FROM {JOBS} WHERE status = %s "
                  "GROUP BY lane", [_PENDING])
    return {lane: (count, _read_dt(earliest)) for lane, count, earliest in rows}


def table_row_estimate(table: str) -> int | None:
    """PostgreSQL's planner estimate of a table's rows (no scan); None elsewhere or when
    the table was never analysed."""
    if not is_postgres():
        return None
    rows = _fetch("SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)", [table])
    if not rows or rows[0][0] is None or rows[0][0] < 0:
        return None
    return int(rows[0][0])
