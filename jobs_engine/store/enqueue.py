"""The enqueue: rows inserted in the caller's transaction, and the wake-ups after its commit."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any, NamedTuple

from jobs_engine.states import Lane
from jobs_engine.store.connection import (
    fetch,
    fetch_insert,
    is_postgres,
)
from jobs_engine.store.dialect import (
    clock_params,
    clock_text,
    dt,
    greatest,
    in_,
    json_param,
    json_rows,
    jsonb,
    table,
    text_array,
)
from jobs_engine.store.rows import (
    ASK_FUNCTION,
    COUNTERS,
    ENQUEUE,
    ENQUEUING_FUNCTION,
    INSERT_PAYLOADS_FUNCTION,
    INSERT_ROWS_FUNCTION,
    JOBS,
    NOTIFY_CHANNEL,
    PENDING_VALUE,
    WAKE_FUNCTION,
)

__all__ = [
    "WAKE_PAYLOAD_MAX",
    "Inserted",
    "InsertedIds",
    "NewJob",
    "jobs_ids_by_dedupe_key",
    "jobs_insert_many",
    "jobs_insert_payloads",
    "version_counter_next",
    "wake_payload",
    "wake_targets",
    "wakeups_wanted",
    "workers_notify",
    "workers_wake",
]

class Inserted(dict[str, int]):
    """``jobs_insert_many``'s rows, dedupe key -> id; ``waiting``: a worker of the rows'
    lanes waited for a wake-up when they were inserted (``ENQUEUING_FUNCTION``)."""

    waiting = False


class InsertedIds(list[int]):
    """``jobs_insert_payloads``'s ids; ``waiting`` as ``Inserted``'s."""

    waiting = False

# -- enqueue ----------------------------------------------------------------------------


class NewJob(NamedTuple):
    """A row to insert, as ``enqueue`` built it (a named tuple: a quarter of a frozen
    dataclass's construction time, and enqueue builds one per job)."""

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
    priority: int = 0
    # False when enqueue made the dedupe key (``random_keys``): no stored row can have it.
    dedupe_key_given: bool = True
    tenant_id: str | None = None  # None: the platform's own


_INSERT_COLUMNS = ("code", "target", "lane", "key", "partition", "version", "payload", "headers",
                   "dedupe_key", "delivery_mode", "run_at", "trace_id", "actor", "priority",
                   "tenant_id")
_INSERT_TYPES = ("text", "text", "text", "text", "smallint", "bigint", "text", "text", "text",
                 "text", "timestamptz", "text", "text", "smallint", "text")


def jobs_insert_many(rows: Sequence[NewJob], now: datetime, using: str | None = None
                     ) -> Inserted:
    """Insert PENDING rows, skipping any whose dedupe_key exists; returns dedupe_key → id
    of the rows inserted.

    ``ON CONFLICT DO NOTHING`` never raises, so a duplicate cannot abort the caller's
    transaction (waking a worker is the caller's, after the commit: ``workers_wake``). A
    new row of a key whose head waits for a retry starts at the head's run time: it is
    held until then anyway, and keeping held rows out of the due range keeps the fast
    poll's cost flat. Rows without a key skip that lookup. On PostgreSQL the rows go
    through a function (``INSERT_ROWS_FUNCTION``), whose plan the session keeps. A batch
    whose dedupe keys were all made by enqueue inserts without ``ON CONFLICT``: random
    keys conflict with nothing, and the arbiter's check, speculative insert and
    confirmation were an eighth of the insert.
    """
    if not rows:
        return Inserted()
    arbiter = any(row.dedupe_key_given for row in rows)
    if is_postgres(using):
        return _jobs_insert_by_function(rows, using, arbiter)
    keyed = any(row.key is not None for row in rows)
    source, params = table([_row_values(row, dt(row.run_at, using)) for row in rows],
                           _INSERT_TYPES, using=using, arrays_from=1, as_json=True)
    stamp_params = clock_params(now, using)
    return Inserted({row[1]: row[0] for row in fetch(
        f"WITH u({', '.join(_INSERT_COLUMNS)}) AS ({source}), "
        + _insert_many_sql(using, keyed, arbiter),
        [*params, *stamp_params, *stamp_params], using)})


def _row_values(row: NewJob, run_at: Any) -> tuple[Any, ...]:
    """A row's values in ``_INSERT_COLUMNS``' order, the order ``INSERT_ROWS_FUNCTION``
    reads them in too, with ``run_at`` as the backend takes it."""
    return (row.code, row.target, row.lane, row.key, row.partition, row.version,
            row.payload_json, json_param(row.headers) if row.headers else "{}",
            row.dedupe_key, row.delivery_mode, run_at, row.trace_id,
            json_param(row.actor) if row.actor is not None else None, row.priority,
            row.tenant_id)


def _jobs_insert_by_function(rows: Sequence[NewJob], using: str | None, arbiter: bool
                             ) -> Inserted:
    """``jobs_insert_many`` on PostgreSQL: one call of a function, the rows one JSON text;
    with ``ON CONFLICT`` (``arbiter``) or, when enqueue made every dedupe key, without. Its
    insert, each key's head lookup included, is planned once per session, prepared
    statements or not (a PL/pgSQL function keeps its plans); the call itself is prepared
    where the connection allows it. The same statement asks whether a worker waits
    (``_ENQUEUING``)."""
    found = fetch_insert(
        f"SELECT r.job_id, r.job_dedupe_key, w.waiting FROM {INSERT_ROWS_FUNCTION}"
        f"(%s::jsonb, %s) AS r, {_ENQUEUING}",
        [json_rows([_row_values(row, row.run_at) for row in rows]), arbiter,
         text_array(sorted({row.lane for row in rows}))], using, plan_may_be_kept=True)
    inserted = Inserted({row[1]: row[0] for row in found})
    inserted.waiting = any(row[2] for row in found)
    return inserted


# The enqueue's look at its lanes (``ENQUEUING_FUNCTION``): their lock, taken shared until its
# transaction ends, the fast-lane count, and whether a worker of them waits. A function
# scan of its own, evaluated once per statement whatever the number of rows.
_ENQUEUING = f"{ENQUEUING_FUNCTION}(%s::text[]) AS w(waiting)"


@lru_cache(maxsize=8)
def _insert_many_sql(using: str | None, keyed: bool, arbiter: bool) -> str:
    """``jobs_insert_many``'s statement on SQLite after its rows' source, the same at
    every call of a database: made once, only its parameters change between calls."""
    stamp = clock_text(using)
    head_run_at = (f"(SELECT h.next_run_at FROM {JOBS} h WHERE h.status = '{PENDING_VALUE}' "
                   "AND h.partition = v.partition AND h.target = v.target AND h.key = v.key "
                   "ORDER BY h.version, h.id LIMIT 1)")
    next_run_at = greatest("due", f"COALESCE({head_run_at}, due)", using) if keyed else "due"
    return (
        f"v AS (SELECT u.*, COALESCE(u.run_at, {stamp}) AS due, {stamp} AS stamp FROM u) "
        f"INSERT INTO {JOBS} (code, target, lane, key, partition, version, payload, headers, "
        "dedupe_key, status, delivery_mode, attempts, next_run_at, last_error, trace_id, actor, "
        "priority, tenant_id, created_at, updated_at) "
        f"SELECT code, target, lane, key, partition, version, {jsonb('payload', using)}, "
        f"{jsonb('headers', using)}, dedupe_key, '{ENQUEUE.target}', delivery_mode, 0, "
        f"{next_run_at}, '', trace_id, "
        f"{jsonb('actor', using)}, priority, tenant_id, stamp, stamp FROM v WHERE true "
        + ("ON CONFLICT (dedupe_key) DO NOTHING " if arbiter else "") + "RETURNING id, dedupe_key")


def jobs_insert_payloads(code: str, target: str, lane: str, delivery_mode: str,
                         payloads_json: str, partitions: int, trace_id: str | None,
                         actor: dict[str, Any] | None, tenant_id: str | None,
                         using: str | None = None) -> InsertedIds:
    """Insert one PENDING row per payload of ``payloads_json`` (a JSON array of them) with
    every other column the target's, the call's or its default; the ids, in the payloads'
    order, and whether a worker waits (``InsertedIds``).

    PostgreSQL only: the server makes each row's dedupe key, partition and, without
    ``trace_id``, trace id (``INSERT_PAYLOADS_FUNCTION``), so a batch costs Python its payloads'
    encoding and no more."""
    found = fetch_insert(
        f"SELECT r.id, w.waiting FROM {INSERT_PAYLOADS_FUNCTION}(%s, %s, %s, %s, %s, %s, "
        f"%s::jsonb, %s::jsonb, %s) AS r(id), {_ENQUEUING}",
        [code, target, lane, delivery_mode, partitions, trace_id,
         json_param(actor) if actor is not None else None, payloads_json, tenant_id,
         text_array([lane])], using, plan_may_be_kept=True)
    ids = InsertedIds(row[0] for row in found)
    ids.waiting = any(row[1] for row in found)
    return ids


def jobs_ids_by_dedupe_key(dedupe_keys: Sequence[str], using: str | None = None
                           ) -> dict[str, int]:
    clause, params = in_("dedupe_key", dedupe_keys, using)
    return {key: job_id for job_id, key in fetch(
        f"SELECT id, dedupe_key FROM {JOBS} WHERE {clause}", params, using)}


def version_counter_next(key: str, using: str | None = None) -> int:
    """Atomically add one to the counter of ``key`` (row-locked until the caller commits)."""
    value: int = fetch(
        f"INSERT INTO {COUNTERS} (key, value) VALUES (%s, 1) ON CONFLICT (key) "
        f"DO UPDATE SET value = {COUNTERS}.value + 1 RETURNING value", [key], using,
    )[0][0]
    return value


# -- wake-ups (PostgreSQL: the wait and wake sequences and ``WAKE_FUNCTION``) -------------


def _lane_sequence(kind: str, lane: str) -> str:
    return f"jobs_engine_{kind}_{Lane(lane)._value_}"  # Lane(): only the engine's lanes


def wakeups_wanted(lanes: Collection[str]) -> bool:
    """A worker about to sleep takes the next wait number of each of its lanes; an enqueue
    that looks at the numbers after it sends the lane's NOTIFY after its commit
    (``workers_wake``). Taken before the worker's last poll, so rows committed before it
    are found by that poll. False: an enqueue of these lanes was open as the worker asked
    (it holds their lock, ``ENQUEUING_FUNCTION``), and may have looked before the ask: the
    worker looks again soon rather than sleep."""
    wanted: bool = fetch(f"SELECT {ASK_FUNCTION}(%s::text[])",
                         [text_array([Lane(lane)._value_ for lane in sorted(lanes)])])[0][0]
    return wanted


def workers_wake(targets_by_lane: Mapping[str, Collection[str]], using: str | None = None
                 ) -> int:
    """After the commit of an enqueue that found a worker waiting, in autocommit: count a
    commit of fast-lane rows (``ENQUEUES_FAST``), and NOTIFY each lane on which a worker
    took a wait number no wake-up has answered yet; how many lanes were notified. A
    fast-lane notification names the commit's targets (``wake_payload``)."""
    lanes = sorted(targets_by_lane)
    notified: int = fetch(
        f"SELECT {WAKE_FUNCTION}(%s::text[], %s::text[])",
        [text_array([Lane(lane)._value_ for lane in lanes]),
         text_array([wake_payload(lane, targets_by_lane[lane]) for lane in lanes])],
        using)[0][0]
    return notified


# A notification's payload stays well under PostgreSQL's 8,000 bytes: past this many, it
# names no target (the poll answering it reads every one).
WAKE_PAYLOAD_MAX = 4000


def wake_payload(lane: str, targets: Collection[str]) -> str:
    """A lane's NOTIFY payload: ``fast:["a","b"]`` names the fast-lane targets the poll
    answering it reads; the lane alone, every target (``workers_notify``'s, or a list too
    long for a payload)."""
    if lane != Lane.FAST or not targets:
        return lane
    named = f"{lane}:{json.dumps(sorted(targets), separators=(',', ':'))}"
    return named if len(named) <= WAKE_PAYLOAD_MAX else lane


def wake_targets(payloads: Sequence[str]) -> frozenset[str] | None:
    """The fast-lane targets ``payloads`` name (``wake_payload``); None: every target."""
    named: set[str] = set()
    for payload in payloads:
        lane, _, listed = payload.partition(":")
        if lane != Lane.FAST:
            continue
        if not listed:
            return None
        try:
            targets = json.loads(listed)
        except ValueError:
            return None
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            return None
        named.update(targets)
    return frozenset(named)


def workers_notify(lanes: Collection[str], using: str | None = None) -> None:
    """NOTIFY ``lanes`` at the commit of the caller's transaction, naming no target: for a
    transaction that Django does not manage, which has no after-commit hook."""
    for lane in sorted(lanes):
        fetch("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, lane], using)


