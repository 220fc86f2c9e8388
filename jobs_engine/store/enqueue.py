"""The enqueue: rows inserted in the caller's transaction, and the wake-ups after its commit."""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from operator import attrgetter
from typing import Any, NamedTuple

from django.db import DatabaseError, transaction
from django.utils import timezone

from jobs_engine.states import Lane
from jobs_engine.store.connection import (
    fetch,
    fetch_insert,
    is_postgres,
    named,
)
from jobs_engine.store.dialect import (
    dt,
    in_,
    json_param,
    json_rows,
    text_array,
    values_,
)
from jobs_engine.store.functions import ROW_COLUMNS
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
    "wake_after_commit",
    "wake_payload",
    "wake_targets",
    "wakeups_wanted",
    "workers_notify",
    "workers_wake",
]

logger = logging.getLogger("jobs_engine.enqueueing")  # the enqueue's, as projects configure it


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
    limit_key: str | None = None  # its key under its target's limits; None: no limits


def _fields(columns: Sequence[str]) -> tuple[str, ...]:
    """``NewJob``'s field of each column (the payload's is its JSON text)."""
    fields = tuple("payload_json" if column == "payload" else column for column in columns)
    unknown = sorted(set(fields) - set(NewJob._fields))
    if unknown:
        raise RuntimeError(f"store/sql/enqueue.sql's row names {unknown}, not NewJob's fields")
    return fields


# A row's values in the order the insert reads them (``ROW_COLUMNS``, from the SQL file):
# one C call per row. For PostgreSQL headers and actor stay objects, encoded with the rows'
# one JSON text; SQLite binds them as text (``_sqlite_values``).
_row_values = attrgetter(*_fields(ROW_COLUMNS))
_ROW_COLUMNS_SQL = ", ".join(ROW_COLUMNS)
_HEADERS, _ACTOR, _RUN_AT = (ROW_COLUMNS.index(column) for column in ("headers", "actor", "run_at"))


def jobs_insert_many(rows: Sequence[NewJob], now: datetime, using: str | None = None
                     ) -> Inserted:
    """Insert PENDING rows, skipping any whose dedupe_key exists; returns dedupe_key → id
    of the rows inserted.

    Index: ``jobs_one_per_dedupe_key``, ``jobs_pending_key_order`` for a keyed row's head.
    ``ON CONFLICT DO NOTHING`` never raises, so a duplicate cannot abort the
    caller's transaction (waking a worker is the caller's, after the commit:
    ``wake_after_commit``). A new row of a key whose head waits for a retry starts at the
    head's run time. Each row's values go in the order ``store/sql/enqueue.sql`` declares
    (``ROW_COLUMNS``): on PostgreSQL as one JSON text to its function
    (``INSERT_ROWS_FUNCTION``), whose plan the session keeps; on SQLite as the rows of a
    ``VALUES`` list whose columns are named in that order (``_insert_sql``). A batch whose
    dedupe keys were all made by enqueue inserts without ``ON CONFLICT``: random keys
    conflict with nothing, and the arbiter's check, speculative insert and confirmation
    were an eighth of the insert.
    """
    if not rows:
        return Inserted()
    arbiter = any(row.dedupe_key_given for row in rows)
    if is_postgres(using):
        return _insert_by_function(rows, arbiter, using)
    # Positional parameters: the VALUES list binds 15 a row, and naming each would cost
    # more than the statement's other work in Python.
    source, params = named(values_([_sqlite_values(row, using) for row in rows]), "value")
    found = fetch(f"WITH u({_ROW_COLUMNS_SQL}) AS ({source}), "
                  + _insert_sql(any(row.key is not None for row in rows), arbiter),
                  {**params, "now": dt(now, using)}, using)
    return Inserted({dedupe_key: job_id for job_id, dedupe_key in found})


def _insert_by_function(rows: Sequence[NewJob], arbiter: bool, using: str | None
                        ) -> Inserted:
    """``jobs_insert_many`` on PostgreSQL: one call of a function, the rows one JSON text;
    with ``ON CONFLICT`` (``arbiter``) or, when enqueue made every dedupe key, without.

    Index: ``jobs_one_per_dedupe_key``, ``jobs_pending_key_order``, in the function.
    Its insert, each key's head lookup included, is planned once per session, prepared
    statements or not (a PL/pgSQL function keeps its plans); the call itself is prepared
    where the connection allows it. The same statement asks whether a worker waits
    (``_ENQUEUING``)."""
    found = fetch_insert(
        f"SELECT r.job_id, r.job_dedupe_key, w.waiting FROM {INSERT_ROWS_FUNCTION}"
        f"(%(rows)s::jsonb, %(arbiter)s) AS r, {_ENQUEUING}",
        {"rows": json_rows(list(map(_row_values, rows))), "arbiter": arbiter,
         "lanes": text_array(sorted({row.lane for row in rows}))},
        using, plan_may_be_kept=True)
    inserted = Inserted({row[1]: row[0] for row in found})
    inserted.waiting = any(row[2] for row in found)
    return inserted


# The enqueue's look at its lanes (``ENQUEUING_FUNCTION``): their lock, taken shared until its
# transaction ends, the fast-lane count, and whether a worker of them waits. A function
# scan of its own, evaluated once per statement whatever the number of rows.
_ENQUEUING = f"{ENQUEUING_FUNCTION}(%(lanes)s::text[]) AS w(waiting)"


def _sqlite_values(row: NewJob, using: str | None) -> list[Any]:
    """A row's values as SQLite binds them: the JSON columns as text, the run time in the
    form Django stores (``dt``)."""
    values = list(_row_values(row))
    values[_HEADERS] = json_param(row.headers) if row.headers else "{}"
    if row.actor is not None:
        values[_ACTOR] = json_param(row.actor)
    if row.run_at is not None:
        values[_RUN_AT] = dt(row.run_at, using)
    return values


@lru_cache(maxsize=4)
def _insert_sql(keyed: bool, arbiter: bool) -> str:
    """``jobs_insert_many``'s statement on SQLite after its rows (``u``, columns in
    ``ROW_COLUMNS``' order): ``jobs_engine_new_rows`` and the insert of
    ``jobs_engine_enqueue_rows`` (store/sql/enqueue.sql) in SQLite's words.

    Index: ``jobs_one_per_dedupe_key``, ``jobs_pending_key_order`` (arbiter, keyed).
    The clock is the caller's ``now``. Made once per shape: only
    its parameters change between calls."""
    head_run_at = (f"(SELECT h.next_run_at FROM {JOBS} h WHERE h.status = '{PENDING_VALUE}' "
                   "AND h.partition = v.partition AND h.target = v.target AND h.key = v.key "
                   "ORDER BY h.version, h.id LIMIT 1)")
    next_run_at = f"MAX(due, COALESCE({head_run_at}, due))" if keyed else "due"
    return (
        "v AS (SELECT u.*, COALESCE(u.run_at, %(now)s) AS due FROM u) "
        f"INSERT INTO {JOBS} (code, target, lane, key, partition, version, payload, headers, "
        "dedupe_key, status, delivery_mode, attempts, next_run_at, last_error, trace_id, actor, "
        "priority, tenant_id, limit_key, created_at, updated_at) "
        "SELECT code, target, lane, key, partition, version, payload, headers, dedupe_key, "
        f"'{ENQUEUE.target}', delivery_mode, 0, {next_run_at}, '', trace_id, actor, priority, "
        "tenant_id, limit_key, %(now)s, %(now)s FROM v WHERE true "
        + ("ON CONFLICT (dedupe_key) DO NOTHING " if arbiter else "") + "RETURNING id, dedupe_key")


def jobs_insert_payloads(code: str, target: str, lane: str, delivery_mode: str,
                         payloads: Sequence[str], partitions: int, trace_id: str | None,
                         actor: dict[str, Any] | None, tenant_id: str | None,
                         using: str | None = None) -> InsertedIds:
    """Insert one PENDING row per payload (each one's JSON text) with every other column
    the target's, the call's or its default; the ids, in the payloads' order, and whether
    a worker waits (``InsertedIds``).

    Index: none read, as no key and no arbiter: every dedupe key is made here. Each row's
    dedupe key and, without ``trace_id``, trace id are a random prefix drawn once per call
    and the row's number; the rows go round the partitions from a random one. On
    PostgreSQL the server makes them (``INSERT_PAYLOADS_FUNCTION``), so a batch costs
    Python its payloads' encoding and no more; on SQLite they are made here and inserted
    as ``jobs_insert_many``'s rows."""
    if not payloads:
        return InsertedIds()
    if not is_postgres(using):
        return _insert_payloads_as_rows(code, target, lane, delivery_mode, payloads,
                                        partitions, trace_id, actor, tenant_id, using)
    found = fetch_insert(
        f"SELECT r.id, w.waiting FROM {INSERT_PAYLOADS_FUNCTION}(%(code)s, %(target)s, "
        "%(lane)s, %(delivery_mode)s, %(partitions)s, %(trace_id)s, %(actor)s::jsonb, "
        f"%(payloads)s::jsonb, %(tenant_id)s) AS r(id), {_ENQUEUING}",
        {"code": code, "target": target, "lane": lane, "delivery_mode": delivery_mode,
         "partitions": partitions, "trace_id": trace_id,
         "actor": json_param(actor) if actor is not None else None,
         "payloads": f"[{','.join(payloads)}]", "tenant_id": tenant_id,
         "lanes": text_array([lane])}, using, plan_may_be_kept=True)
    ids = InsertedIds(row[0] for row in found)
    ids.waiting = any(row[1] for row in found)
    return ids


def _insert_payloads_as_rows(code: str, target: str, lane: str, delivery_mode: str,
                             payloads: Sequence[str], partitions: int, trace_id: str | None,
                             actor: dict[str, Any] | None, tenant_id: str | None,
                             using: str | None) -> InsertedIds:
    """``jobs_insert_payloads`` where the database has no function: the rows that
    ``INSERT_PAYLOADS_FUNCTION`` makes, made here (numbered from 1, as there)."""
    key_prefix, trace_prefix = os.urandom(12).hex(), os.urandom(12).hex()
    first = random.randrange(partitions)
    rows = [NewJob(code, target, lane, None, (first + n) % partitions, 0, payload, {},
                   f"{key_prefix}{n:08x}", delivery_mode, trace_id or f"{trace_prefix}{n:08x}",
                   actor, None, 0, False, tenant_id)
            for n, payload in enumerate(payloads, 1)]
    inserted = jobs_insert_many(rows, timezone.now(), using)
    return InsertedIds(inserted[row.dedupe_key] for row in rows)


def jobs_ids_by_dedupe_key(dedupe_keys: Sequence[str], using: str | None = None
                           ) -> dict[str, int]:
    """The ids of the stored rows of ``dedupe_keys`` (an enqueue's duplicates).

    Index: ``jobs_one_per_dedupe_key``."""
    clause, params = named(in_("dedupe_key", dedupe_keys, using), "keys")
    return {key: job_id for job_id, key in fetch(
        f"SELECT id, dedupe_key FROM {JOBS} WHERE {clause}", params, using)}


def version_counter_next(key: str, using: str | None = None) -> int:
    """Atomically add one to the counter of ``key`` (row-locked until the caller commits).

    Index: the primary key of the counters."""
    value: int = fetch(
        f"INSERT INTO {COUNTERS} (key, value) VALUES (%(key)s, 1) ON CONFLICT (key) "
        f"DO UPDATE SET value = {COUNTERS}.value + 1 RETURNING value", {"key": key}, using,
    )[0][0]
    return value


# -- wake-ups (PostgreSQL: the wait and wake sequences and ``WAKE_FUNCTION``) -------------


def wakeups_wanted(lanes: Collection[str]) -> bool:
    """Take the next wait number of each of a worker's lanes before it sleeps; False: an
    enqueue of them is open.

    Index: none, sequences and advisory locks.
    The statement calls ``ASK_FUNCTION``. An enqueue that looks at
    the numbers after it sends the lane's NOTIFY after its commit (``workers_wake``). Taken
    before the worker's last poll, so rows committed before it are found by that poll.
    False: an enqueue of these lanes was open as the worker asked (it holds their lock,
    ``ENQUEUING_FUNCTION``), and may have looked before the ask: the worker looks again
    soon rather than sleep."""
    wanted: bool = fetch(f"SELECT {ASK_FUNCTION}(%(lanes)s::text[])",
                         {"lanes": text_array([Lane(lane)._value_ for lane in sorted(lanes)])}
                         )[0][0]
    return wanted


class _WakeAfterCommit:
    """The after-commit wake-up of one transaction's enqueues: their lanes and targets, one
    statement, run only if one of them found a worker waiting (``waiting``)."""

    __slots__ = ("targets_by_lane", "using", "waiting")

    def __init__(self, using: str | None) -> None:
        self.targets_by_lane: dict[str, set[str]] = {}
        self.using = using
        self.waiting = False

    def add(self, lane: str, targets: set[str], waiting: bool) -> None:
        self.targets_by_lane.setdefault(lane, set()).update(targets)
        self.waiting |= waiting

    def __call__(self) -> None:
        if not self.waiting:
            return
        try:
            workers_wake(self.targets_by_lane, self.using)
        except DatabaseError:  # committed: the workers find the rows at their next poll
            logger.warning("enqueue committed but could not wake the workers of %s",
                           ",".join(sorted(self.targets_by_lane)), exc_info=True)


def wake_after_commit(lane: str, targets: set[str], waiting: bool, using: str | None = None
                      ) -> None:
    """Once the caller's transaction commits, wake the workers that wait on ``lane`` for
    ``targets``, if its insert found one waiting (``waiting``); where the database sends
    no wake-ups (SQLite), nothing: its workers find the rows at their next poll.

    Index: none, a notification.
    It is sent after the commit (``workers_wake``), or in it.
    After the commit, not in it: a NOTIFY in the enqueue's transaction held a
    database-wide lock through its commit, so enqueuing transactions committed one at a
    time. And only when a worker waited as the rows were inserted: a statement after
    every commit was a second round trip for nothing while the workers were busy. A
    worker that asks later, before the commit, finds the transaction holding its lanes'
    lock and looks again soon (``wakeups_wanted``). A transaction Django does not manage
    (autocommit off, no ``atomic``) has no after-commit hook: its NOTIFY rides it.
    """
    if not is_postgres(using):
        return
    db = transaction.get_connection(using)
    if not db.in_atomic_block and not db.get_autocommit():
        if waiting:
            workers_notify([lane], using)
        return
    for _savepoints, callback, _robust in db.run_on_commit:
        if isinstance(callback, _WakeAfterCommit):
            callback.add(lane, targets, waiting)
            return
    if not waiting and not db.in_atomic_block:
        return  # autocommit, nobody waited: nothing to run after this commit
    wake = _WakeAfterCommit(using)
    wake.add(lane, targets, waiting)
    transaction.on_commit(wake, using=using)  # in autocommit: now


def workers_wake(targets_by_lane: Mapping[str, Collection[str]], using: str | None = None
                 ) -> int:
    """NOTIFY each lane on which a worker waits, after the commit of an enqueue that found
    one waiting; how many lanes were notified.

    Index: none, sequences and notifications.
    The statement calls ``WAKE_FUNCTION``. In autocommit: counts a
    commit of fast-lane rows (``ENQUEUES_FAST``), and notifies each lane on which a worker
    took a wait number no wake-up has answered yet. A fast-lane notification names the
    commit's targets (``wake_payload``)."""
    lanes = sorted(targets_by_lane)
    notified: int = fetch(
        f"SELECT {WAKE_FUNCTION}(%(lanes)s::text[], %(payloads)s::text[])",
        {"lanes": text_array([Lane(lane)._value_ for lane in lanes]),
         "payloads": text_array([wake_payload(lane, targets_by_lane[lane]) for lane in lanes])},
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
    """NOTIFY ``lanes`` at the commit of the caller's transaction, naming no target.

    Index: none, a notification. For a transaction that Django does not manage, which has
    no after-commit hook."""
    for lane in sorted(lanes):
        fetch("SELECT pg_notify(%(channel)s, %(lane)s)", {"channel": NOTIFY_CHANNEL,
                                                            "lane": lane}, using)


