"""The queue's statements: enqueue, both lanes' reads and claims, every outcome write.

The worker loops, leases and outcome code never write SQL; they call these functions.
Each is one named state transition or read, its guard in its name or docstring, so the
hot SQL is reviewed and indexed from this file alone. Decision times come from the
caller: workers read the database's clock (``dialect.db_now``) so skewed worker clocks
stay correct, and tests pass a fixed ``now``. Status changes come from ``states``.

Over 400 lines because it is meant to be read whole: this is every statement a job meets,
from its insert through both lanes to its outcome. Who may act (partition leases, worker
liveness, in-flight marks, target pauses) is in ``leases``.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any, NamedTuple

from django.db import IntegrityError, transaction

from jobs_engine import states
from jobs_engine.job import Job
from jobs_engine.models import (
    CompletedJob,
    Flow,
    FlowStep,
    InflightMark,
    JobStatShard,
    Partition,
    TargetPause,
    VersionCounter,
    Worker,
)
from jobs_engine.models import Job as JobTable
from jobs_engine.states import DEAD, DELETED, DONE, PENDING, RUNNING, DeliveryMode, Lane, StepState
from jobs_engine.store.dialect import (
    clock_params,
    clock_text,
    dt,
    execute,
    fetch,
    fetch_insert,
    for_share,
    greatest,
    in_,
    in_names,
    instant_array,
    int_array,
    is_postgres,
    json_append,
    json_dt,
    json_object,
    json_param,
    json_rows,
    jsonb,
    names_constant,
    planned_rows,
    read_dt,
    read_json,
    session_shard,
    skip_locked,
    table,
    text_array,
    values_,
    writable_ctes,
)
from jobs_engine.text import clean

__all__ = [
    "ASK_FUNCTION",
    "CLOSED",
    "CLOSED_COLUMNS",
    "COUNTERS",
    "CURSOR_LAG",
    "DONE_JOBS",
    "DONE_KEPT",
    "DONE_NOT_KEPT",
    "ENQUEUE",
    "ENQUEUES_FAST",
    "ENQUEUING_FUNCTION",
    "FAST_ENQUEUES_FUNCTION",
    "FLOWS",
    "FLOW_STEPS",
    "FLOW_STEP_KEY_PREFIX",
    "INFLIGHT",
    "INSERT_PAYLOADS_FUNCTION",
    "INSERT_ROWS_FUNCTION",
    "JOBS",
    "JOB_STAT_SHARDS",
    "LAST_ERROR_LIMIT",
    "NOTIFY_CHANNEL",
    "PARTITIONS",
    "PAUSES",
    "READ_ALL",
    "RELEASE_REASON",
    "RESCUE_PRESUMED_DEAD",
    "RESCUE_REASON",
    "RESCUE_RELEASE",
    "RESERVE",
    "RETRIED",
    "TAKEOVER_PRESUMED_DEAD",
    "TAKEOVER_REASON",
    "WAKE_FUNCTION",
    "WAKE_PAYLOAD_MAX",
    "WORKERS",
    "ClosedJob",
    "Cursor",
    "Done",
    "FastPoll",
    "Guard",
    "Inserted",
    "InsertedIds",
    "LongCursor",
    "NewJob",
    "Reserved",
    "ReservedRows",
    "StatBucket",
    "closed_jobs",
    "cut_error",
    "flow_steps_queued",
    "inflight_clear",
    "inflight_mark_if_leased",
    "job_close_dead",
    "job_release_unchanged",
    "job_retry_later",
    "job_stats_add",
    "jobs_analyze_when_behind",
    "jobs_done",
    "jobs_fast_due",
    "jobs_fast_poll",
    "jobs_hold_key_until",
    "jobs_ids_by_dedupe_key",
    "jobs_insert_many",
    "jobs_insert_payloads",
    "jobs_long_mark_started",
    "jobs_long_next_due",
    "jobs_long_renew",
    "jobs_long_rescue_expired",
    "jobs_long_reserve",
    "jobs_still_pending",
    "version_counter_next",
    "wake_payload",
    "wake_targets",
    "wakeups_wanted",
    "workers_notify",
    "workers_wake",
]

JOBS = JobTable._meta.db_table
PARTITIONS = Partition._meta.db_table
INFLIGHT = InflightMark._meta.db_table
WORKERS = Worker._meta.db_table
PAUSES = TargetPause._meta.db_table
COUNTERS = VersionCounter._meta.db_table
JOB_STAT_SHARDS = JobStatShard._meta.db_table
DONE_JOBS = CompletedJob._meta.db_table
FLOWS = Flow._meta.db_table
FLOW_STEPS = FlowStep._meta.db_table

NOTIFY_CHANNEL = "jobs_engine"
# PostgreSQL's functions of the enqueue and the wake-ups, made by the engine's migration.
INSERT_ROWS_FUNCTION = "jobs_engine_enqueue_rows"  # any rows
INSERT_PAYLOADS_FUNCTION = "jobs_engine_enqueue_payloads"  # payloads of one target only
WAKE_FUNCTION = "jobs_engine_wake"  # after the commit, when a worker waited
ENQUEUING_FUNCTION = "jobs_engine_enqueuing"  # the insert's look at its lanes
ASK_FUNCTION = "jobs_engine_ask"
FAST_ENQUEUES_FUNCTION = "jobs_engine_fast_enqueues"


class Inserted(dict[str, int]):
    """``jobs_insert_many``'s rows, dedupe key -> id; ``waiting``: a worker of the rows'
    lanes waited for a wake-up when they were inserted (``ENQUEUING_FUNCTION``)."""

    waiting = False


class InsertedIds(list[int]):
    """``jobs_insert_payloads``'s ids; ``waiting`` as ``Inserted``'s."""

    waiting = False
# The shard a session's appended statistics rows name (``JobStatShard``: where they came
# from; the rows are never updated).
STATS_SHARDS = 64
LAST_ERROR_LIMIT = 2000
TAKEOVER_REASON = "in flight when its partition was taken over"
RESCUE_REASON = "lease expired while running; at-most-once rows are not run twice"
RELEASE_REASON = "lease expired while running; run again (at least once)"

# The state machine's edges each statement below takes.
ENQUEUE = states.transition(DELETED, to=PENDING)
RESERVE = states.transition(PENDING, to=RUNNING)
RESCUE_PRESUMED_DEAD = states.transition(RUNNING, to=DEAD)
RESCUE_RELEASE = states.transition(RUNNING, to=PENDING)
TAKEOVER_PRESUMED_DEAD = states.transition(PENDING, to=DEAD)
# Outcomes: from the lane's own status, or from a DEAD its holder's late write replaces.
DONE_NOT_KEPT = {Lane.FAST: states.transition(PENDING, DEAD, to=DELETED),
                 Lane.LONG: states.transition(RUNNING, DEAD, to=DELETED)}
DONE_KEPT = {Lane.FAST: states.transition(PENDING, DEAD, to=DONE),
             Lane.LONG: states.transition(RUNNING, DEAD, to=DONE)}
RETRIED = {Lane.FAST: states.transition(PENDING, DEAD, to=PENDING),
           Lane.LONG: states.transition(RUNNING, DEAD, to=PENDING)}
CLOSED = {Lane.FAST: states.transition(PENDING, DEAD, to=DEAD),
          Lane.LONG: states.transition(RUNNING, DEAD, to=DEAD)}

_PENDING, _RUNNING, _DEAD = PENDING.value, RUNNING.value, DEAD.value
_AT_MOST_ONCE = DeliveryMode.AT_MOST_ONCE.value
_AT_LEAST_ONCE = DeliveryMode.AT_LEAST_ONCE.value
# A hot prepared statement names the lane and state of the partial index it reads as
# literals, not parameters: its generic plan (``dialect._prepared_cursor``) can then use
# that index, where with parameters only a plan made for each call's values can.
_LONG_PENDING = f"j.lane = '{Lane.LONG.value}' AND j.status = '{_PENDING}'"
_FAST_PENDING = f"j.lane = '{Lane.FAST.value}' AND j.status = '{_PENDING}'"

# The dedupe key of a flow step's job starts with this (``flows.queue``): such a job belongs
# to its flow, kept and removed with it, never by its target's keep counts.
FLOW_STEP_KEY_PREFIX = "flow-step:"

# What a lane reads of a row, in the order of ``Job``'s fields.
_JOB_COLUMNS = ("id", "target", "code", "key", "version", "payload", "headers", "attempts",
                "trace_id", "dedupe_key", "actor", "created_at", "partition", "delivery_mode",
                "tenant_id")
_COLUMNS = ", ".join(_JOB_COLUMNS)


def _job(row: Sequence[Any]) -> Job:
    """A row of ``_JOB_COLUMNS`` (positional: this runs for every row a lane reads)."""
    (job_id, target, code, key, version, payload, headers, attempts, trace_id, dedupe_key,
     actor, created_at, partition, delivery_mode, tenant_id) = row[:15]
    return Job(job_id, target, code, key, version, payload,
               read_json(headers) if headers != "{}" else {}, attempts, trace_id, dedupe_key,
               read_json(actor), read_dt(created_at), partition, delivery_mode, tenant_id)


def cut_error(text: str) -> str:
    return clean(text, LAST_ERROR_LIMIT)


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
    head_run_at = (f"(SELECT h.next_run_at FROM {JOBS} h WHERE h.status = '{_PENDING}' "
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


# -- shared by the statements below -----------------------------------------------


def _attempts_as_read(rows: Sequence[tuple[int, int]]) -> tuple[str, list[Any]]:
    """SQL true when a row's ``attempts`` is the one of its ``(id, attempts)`` in ``rows``
    (as it was read): one value for a send's rows, nearly always, else the pairs. On
    PostgreSQL one text for any number of rows (arrays), so the statement can be prepared."""
    if len({attempts for _, attempts in rows}) == 1:
        return "attempts = %s", [rows[0][1]]
    pairs, params = table(rows, ("bigint", "integer"), arrays_from=1)
    return f"(id, attempts) IN ({pairs})", params


def _id_attempts_in(rows: Sequence[tuple[int, int]]) -> tuple[str, list[Any]]:
    """``(id, attempts)`` is one of ``rows``: read by the primary key, so even a large queue
    costs a probe per row; one text for any number of rows on PostgreSQL."""
    ids, id_params = in_("id", [job_id for job_id, _ in rows], arrays_from=1)
    read, read_params = _attempts_as_read(rows)
    return f"({ids} AND {read})", [*id_params, *read_params]


@dataclass(frozen=True)
class ClosedJob:
    id: int
    target: str
    code: str
    dedupe_key: str
    reason: str
    tenant_id: str | None = None


# What a statement that closes rows returns of each, for ``closed_jobs``.
CLOSED_COLUMNS = "id, target, code, dedupe_key, tenant_id"


def closed_jobs(rows: Sequence[Sequence[Any]], reason: str) -> list[ClosedJob]:
    """The rows (``CLOSED_COLUMNS``) a statement closed for ``reason``."""
    return [ClosedJob(r[0], r[1], r[2], r[3], reason, r[4]) for r in rows]


# -- commits that need not wait for their flush --------------------------------------------


def _flush_lazily(wanted: bool, unless: str | None = None) -> str:
    """A select-list item by which a statement about at-least-once rows (their marks,
    reserves and successes) commits without waiting for its WAL flush
    (``JobsSettings.LAZY_FLUSH_AT_LEAST_ONCE``), or "" where it must wait.

    The setting lasts for the statement's own transaction only, so it is never used inside
    a caller's, where it would reach the caller's commit. A database crash may lose the
    last such commits (PostgreSQL flushes them within ``wal_writer_delay``, 3 times at
    most); their rows are then PENDING again and run again, which at least once allows. A
    later commit that waits for its flush flushes every one before it: no later write
    outlives an earlier one. ``unless``: SQL true when a row of the statement needs its
    flush (an at-most-once row, an exclusive code), judged by the statement itself.
    """
    if not (wanted and writable_ctes() and transaction.get_autocommit()):
        return ""
    lazily = "set_config('synchronous_commit', 'off', true)"
    return f", {lazily}" if unless is None else f", (SELECT {lazily} WHERE NOT ({unless}))"


# -- in-flight marks ----------------------------------------------------------------------


def _leased(owner_param: str = "%s", partitions: str = "mark") -> str:
    """The partitions of ``partitions`` whose live lease ``owner`` holds, locked until the
    statement's commit: a takeover's update of the partition waits for a mark, and a mark
    made after a takeover finds the partition another's (a mark is never left unjudged)."""
    return (f"SELECT partition FROM {PARTITIONS} WHERE owner = {owner_param} "
            f"AND lease_until > %s AND partition IN (SELECT partition FROM {partitions})"
            f"{for_share()}")


def inflight_mark_if_leased(owner: str, now: datetime, token: str,
                            sending: Sequence[tuple[int, int, int]], *,
                            flush_lazily: bool = False) -> set[int]:
    """Record rows about to be handed to a target as in flight (``InflightMark``: a row per
    partition), under the poll's token, in one statement for every partition of the send.

    ``sending`` is the rows as (partition, id, attempts). A partition's rows are marked
    only while ``owner`` holds a live lease on it and every row of it in ``sending`` is
    still PENDING as read (a takeover or an admin may have closed one). Returns the
    partitions marked; for the others send nothing, and ``jobs_still_pending`` tells a
    lost lease from a closed row. ``flush_lazily`` (the rows are at least once): the
    commit does not wait for its flush (``_flush_lazily``).
    """
    ids_of: dict[int, list[int]] = {}
    for partition, job_id, _ in sending:
        ids_of.setdefault(partition, []).append(job_id)
    marks, mark_params = table([(p, json_param(ids), len(ids)) for p, ids in ids_of.items()],
                               ("int", "jsonb", "int"), arrays_from=1, as_json=True)
    sent, sent_params = _id_attempts_in([(job_id, attempts) for _, job_id, attempts in sending])
    # One text for any send (arrays), prepared: an at-most-once per-row target runs it once
    # a row, and the server planned it at each call.
    rows = fetch(
        f"WITH mark(partition, ids, n) AS ({marks}), "
        f"live(partition, n) AS (SELECT partition, COUNT(*) FROM {JOBS} "
        f"WHERE status = %s AND {sent} GROUP BY partition), "
        f"leased AS ({_leased()}) "
        f"INSERT INTO {INFLIGHT} (token, partition, owner, ids, marked_at) "
        f"SELECT %s, mark.partition, %s, {jsonb('mark.ids')}, %s FROM mark "
        "JOIN live ON live.partition = mark.partition AND live.n = mark.n "
        "WHERE mark.partition IN (SELECT partition FROM leased) RETURNING partition"
        + _flush_lazily(flush_lazily),
        [*mark_params, _PENDING, *sent_params, owner, dt(now), token, owner, dt(now)],
        prepare=True,
    )
    return {row[0] for row in rows}


def jobs_still_pending(rows: Sequence[tuple[int, int]]) -> set[int]:
    """Ids of the (id, attempts) rows that are still PENDING as read."""
    pending, params = _id_attempts_in(rows)
    return {row[0] for row in fetch(
        f"SELECT id FROM {JOBS} WHERE status = %s AND {pending}", [_PENDING, *params])}


def _clear_inflight(token: str) -> tuple[str, list[Any]]:
    return f"DELETE FROM {INFLIGHT} WHERE token = %s", [token]


def inflight_clear(token: str) -> None:
    """Remove the in-flight marks a poll made (its outcomes are written)."""
    execute(*_clear_inflight(token))


# -- fast lane ----------------------------------------------------------------------------


# A cursor's lag band: a read after a cursor also reads the rows due this long before it,
# which a transaction that began that much before another's commit may commit after it.
CURSOR_LAG = timedelta(seconds=0.1)


class Cursor(NamedTuple):
    """Where a target's next read starts (``FastLane``): the rows after ``(at, id)``, the
    last row of a window its worker handed, and before them the rows due in the lag band
    ``(band_from, at)``, which a transaction that began earlier may have committed since.
    Rows before the band were handed and deleted: while another session holds an old
    snapshot their index entries cannot be marked dead, and each read from the first due
    row walked every one of them again."""

    band_from: datetime
    at: datetime
    id: int


# The enqueues of fast-lane rows so far: every enqueue's insert takes the next number
# (``ENQUEUING_FUNCTION``, under its lanes' lock), and so does the statement after its
# commit when a worker waited. A poll reads the number and whether an enqueue held the
# lock (``FAST_ENQUEUES_FUNCTION``): a poll that reads the number a poll two before it
# read, while none was open, knows no idle target has received a row since (``Reads``).
ENQUEUES_FAST = "jobs_engine_enqueues_fast"
READ_ALL = -1  # ``enqueues_seen`` for a read of every target
_ENQUEUES_READ = f"COALESCE(pg_sequence_last_value('{ENQUEUES_FAST}'), 0)"
# Evaluated once per statement (an InitPlan), so a branch of targets it gates is not read.
_ENQUEUES_MOVED = f"(SELECT {_ENQUEUES_READ}) > %s"


def _fast_heads_sql(partitions: Sequence[int], now: datetime, limits: Mapping[str, int], *,
                    whole_backlog: bool = False, after: Mapping[str, Cursor] | None = None,
                    always: Collection[str] = (), enqueues_seen: int = READ_ALL
                    ) -> tuple[str, list[Any]]:
    """The heads of the targets in ``limits`` that are not paused: ``_JOB_COLUMNS``,
    ``next_run_at``, ``probe`` (the target's pause ran out: one of its rows may go as the
    probe, ``PauseGate.probe_rows``), ``enqueues`` (``ENQUEUES_FAST`` as read, or NULL) and
    ``enqueues_open`` (an enqueue held the lane's lock then, or NULL).

    A target's heads are those among its first ``limit`` due rows (its window), so a deep
    backlog on few keys costs a poll ``limit`` rows, not the whole backlog; the later
    versions among them wait for a later poll. ``whole_backlog``: the first ``limit``
    heads of the whole due backlog. ``after``: the targets' cursors. The pauses are read by
    the same statement: a read of its own was one more round trip per poll.

    Which targets are read: on PostgreSQL those in ``always``, and every other one only
    when ``ENQUEUES_FAST`` is past ``enqueues_seen`` (``READ_ALL``: always), so a busy
    worker does not probe its idle targets poll after poll. The targets, their limits and
    cursors are unnested and read in a lateral join: one generic plan at any number of
    targets. With a list of values per target the planner costed a full window for each,
    and past ``jit_above_cost`` (about 90 targets) every poll was compiled first: 1.5 s a
    poll at 500 targets, where the read itself took 2 ms. Unless every target is in
    ``always`` (a wake-up's few), the names and limits are constants of the text
    (``_constant_targets``: a worker's registered targets, the same text poll after
    poll), and only the targets in ``always`` or with a cursor go as parameters: an array
    of 500 names, limits and cursors, dumped and parsed at every poll, cost more than the
    read. SQLite reads every target, one ``UNION ALL`` branch each.
    """
    after = after or {}
    names = sorted(limits)
    if not is_postgres():
        return _fast_heads_sqlite(partitions, now, limits, names, whole_backlog, after)
    constant = not set(always) >= set(names)
    listed = [name for name in names if name in always or name in after] if constant else names
    cursors = [after.get(name) for name in listed]
    clock = dt(now)
    parts = int_array(partitions)
    params: list[str | int] = [
        text_array(listed), int_array([limits[name] for name in listed]),
        instant_array([c.band_from if c else None for c in cursors]),
        instant_array([c.at if c else None for c in cursors]),
        int_array([c.id if c else 0 for c in cursors]),
        "{" + ",".join("t" if name in always else "f" for name in listed) + "}"]
    if constant:
        text = _fast_heads_constant(whole_backlog, tuple((name, limits[name]) for name in names))
        params += [enqueues_seen, text_array(listed)]
    else:
        text = _FAST_HEADS_PG[whole_backlog]
    return text, [*params, enqueues_seen, clock, clock, parts, clock, parts]


def _fast_window(whole_backlog: bool, target: str, limit: str) -> tuple[str, str]:
    """A target's due rows in run order (``%s``: the clock, then its partitions) and the
    condition that a row is its key's head."""
    due = (f"SELECT {', '.join('j.' + c for c in _JOB_COLUMNS)}, j.next_run_at "
           f"FROM {JOBS} j WHERE {_FAST_PENDING} AND j.target = {target} "
           "AND j.next_run_at <= %s AND {range} AND {partitions}")
    head = ("(j.key IS NULL OR NOT EXISTS ("
            f"SELECT 1 FROM {JOBS} e WHERE e.status = '{_PENDING}' AND e.key IS NOT NULL "
            "AND e.partition = j.partition AND e.target = j.target AND e.key = j.key "
            "AND (e.version, e.id) < (j.version, j.id)))")
    order = f"ORDER BY j.next_run_at, j.id LIMIT {limit}"
    return (f"{due} AND {head} {order}" if whole_backlog else f"{due} {order}"), head


def _fast_heads_pg(whole_backlog: bool, constant: str = "") -> str:
    """The read of ``_fast_heads_sql``; ``constant``: a ``UNION ALL`` branch of the targets
    not passed as parameters (``_fast_heads_constant``)."""
    window, head = _fast_window(whole_backlog, "w.target", "w.lim")
    partitions = "j.partition = ANY(%s::integer[])"
    # The lag band, then the rows after the cursor: two index ranges, in run order.
    band = window.format(range="j.next_run_at > w.band_from AND j.next_run_at < w.after_at",
                         partitions=partitions)
    later = window.format(range="(j.next_run_at, j.id) > (w.after_at, w.after_id)",
                          partitions=partitions)
    enqueues = f"(SELECT n, open FROM {FAST_ENQUEUES_FUNCTION}())"
    return (
        f"SELECT j.*, w.probe, w.enqueues, w.enqueues_open FROM (SELECT w.target, w.lim, "
        "w.band_from, w.after_at, w.after_id, c.n AS enqueues, c.open AS enqueues_open, "
        f"EXISTS (SELECT 1 FROM {PAUSES} p WHERE p.target = w.target) AS probe "
        "FROM (SELECT * FROM unnest(%s::text[], %s::integer[], %s::timestamptz[], "
        "%s::timestamptz[], %s::bigint[], %s::boolean[]) AS a(target, lim, band_from, "
        f"after_at, after_id, always){constant}) AS w "
        f"CROSS JOIN {enqueues} AS c WHERE (w.always OR c.n > %s) AND NOT EXISTS ("
        f"SELECT 1 FROM {PAUSES} p WHERE p.target = w.target AND p.paused_until > %s)) AS w "
        f"CROSS JOIN LATERAL (SELECT * FROM (({band}) UNION ALL ({later})) AS u "
        "LIMIT w.lim) AS j" + ("" if whole_backlog else f" WHERE {head}"))


_FAST_HEADS_PG = {whole: _fast_heads_pg(whole) for whole in (False, True)}


@lru_cache(maxsize=64)
def _fast_heads_constant(whole_backlog: bool, limits: tuple[tuple[str, int], ...]) -> str:
    """``_fast_heads_pg`` with ``limits`` (target, limit) as constants of the text, read
    from the first due row, those passed as parameters (the last one: their names) left
    out. A worker's registered targets make one text, kept by this cache and prepared."""
    names = names_constant(tuple(name for name, _ in limits))
    lims = int_array([limit for _, limit in limits])
    return _fast_heads_pg(whole_backlog, (
        " UNION ALL SELECT t.target, t.lim, '-infinity'::timestamptz, '-infinity'::timestamptz, "
        f"0::bigint, false FROM unnest({names}, '{lims}'::integer[]) AS t(target, lim) "
        f"WHERE {_ENQUEUES_MOVED} AND t.target <> ALL(%s::text[])"))


def _fast_heads_sqlite(partitions: Sequence[int], now: datetime, limits: Mapping[str, int],
                       names: list[str], whole_backlog: bool, after: Mapping[str, Cursor]
                       ) -> tuple[str, list[Any]]:
    window, head = _fast_window(whole_backlog, "%s", "%s")
    part_clause, part_params = in_("j.partition", partitions)
    window = window.format(range="(j.next_run_at, j.id) > (%s, 0)", partitions=part_clause)
    paused = f"EXISTS (SELECT 1 FROM {PAUSES} p WHERE p.target = %s)"
    per_target = (f"SELECT *, {paused} AS probe, NULL AS enqueues, NULL AS enqueues_open "
                  f"FROM ({window}) AS j "
                  f"WHERE NOT EXISTS (SELECT 1 FROM {PAUSES} p WHERE p.target = %s "
                  "AND p.paused_until > %s)" + ("" if whole_backlog else f" AND {head}"))
    clock = dt(now)
    params: list[Any] = []
    for name in names:
        cursor = after.get(name)
        band_from = dt(cursor.band_from) if cursor else dt(BEGINNING)
        params += [name, name, clock, band_from, *part_params, limits[name], name, clock]
    return " UNION ALL ".join([per_target] * len(names)), params


# Before every row: where a read without a cursor starts on SQLite.
BEGINNING = datetime(1, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class FastPoll:
    """A fast-lane read: its jobs in run order, the targets among them whose pause ran
    out, and (``jobs_fast_poll``) the first send's rows the read marked in flight."""

    jobs: list[Job]
    probing: frozenset[str] = frozenset()
    marked_target: str | None = None
    marked: Mapping[int, list[int]] = field(default_factory=dict)  # partition -> ids
    # target -> its last row read, (next_run_at, id): where a cursor after it starts
    last_read: Mapping[str, tuple[datetime, int]] = field(default_factory=dict)
    # ``ENQUEUES_FAST`` as the read found it (None: no row read, or SQLite)
    enqueues: int | None = None
    enqueues_open: bool | None = None  # an enqueue was open as the count was read


@lru_cache(maxsize=64)
def _names_literal(names: tuple[str, ...]) -> str:
    """``text_array`` of a worker's list of targets, made once."""
    return text_array(names)


def _read_per_row(per_row: Collection[str], limits: Mapping[str, int]) -> tuple[str, ...]:
    """The targets of ``per_row`` among those a poll reads (``limits``): only those can be
    its first send. A wake-up's poll reads a few, and the worker's whole list was an array
    the server parsed at each of them (500 names: 0.07 ms a statement)."""
    if len(limits) < len(per_row):
        return tuple(name for name in sorted(limits) if name in per_row)
    return tuple(per_row)


_NEXT_RUN_AT = len(_JOB_COLUMNS)  # where a read row's next_run_at is, after a Job's columns


def _read_fast(fetched: Sequence[Sequence[Any]]) -> FastPoll:
    """``fetched``: rows of ``_JOB_COLUMNS``, ``next_run_at``, ``probe``, ``enqueues``,
    ``enqueues_open``, then
    any columns of the caller's."""
    jobs = [_job(row) for row in fetched]
    # Run order: the last wins.
    last_read = {job.target: (read_dt(row[_NEXT_RUN_AT]), job.id)
                 for job, row in zip(jobs, fetched, strict=True)}
    probe_at = _NEXT_RUN_AT + 1
    return FastPoll(jobs, frozenset(job.target for job, row in zip(jobs, fetched, strict=True)
                                    if row[probe_at]),
                    last_read=last_read,  # type: ignore[arg-type]  # a stored row has its run time and id
                    enqueues=fetched[0][probe_at + 1] if fetched else None,
                    enqueues_open=fetched[0][probe_at + 2] if fetched else None)


def jobs_fast_due(partitions: Sequence[int], now: datetime, limits: Mapping[str, int], *,
                  whole_backlog: bool = False, after: Mapping[str, Cursor] | None = None,
                  always: Collection[str] = (), enqueues_seen: int = READ_ALL) -> FastPoll:
    """Due PENDING fast-lane rows of the targets in ``limits`` (up to its limit each) that
    are not paused, in the given partitions, each the head of its key, in run order: the
    heads among each target's first ``limit`` due rows (``_fast_heads_sql``).

    A row is the head when no PENDING row of the same target and key comes before it in
    (version, id) order, whatever that row's run time: a row waiting for a retry holds
    the later versions of its key (``jobs_hold_key_until`` moves those out of the way).
    DEAD rows hold nothing. Index-backed: one scan of ``jobs_fast_pending_due`` per
    target read, so a paused target's backlog is never walked, and each hold test is one
    probe of ``jobs_pending_key_order``.

    ``whole_backlog``: the first heads of each target's whole due backlog instead. A
    window holds no head when every row in it waits for an earlier version due later
    (versions committed out of order); this walk keeps the lane from stalling behind
    them, and reads the whole backlog, so the lane runs it seldom.

    ``after``, ``always``, ``enqueues_seen``: the cursors and which targets are read
    (``_fast_heads_sql``).
    """
    if not limits or not partitions:
        return FastPoll([])
    union, params = _fast_heads_sql(partitions, now, limits, whole_backlog=whole_backlog,
                                    after=after, always=always, enqueues_seen=enqueues_seen)
    return _read_fast(fetch(
        f"SELECT {_COLUMNS}, next_run_at, probe, enqueues, enqueues_open FROM ({union}) AS due "
        "ORDER BY next_run_at, id", params))


def jobs_fast_poll(
    partitions: Sequence[int], now: datetime, limits: Mapping[str, int], *, owner: str,
    token: str, per_row: Collection[str] = (), per_row_send: int = 1,
    flush_lazily: bool = False, after: Mapping[str, Cursor] | None = None,
    always: Collection[str] = (), enqueues_seen: int = READ_ALL,
) -> FastPoll:
    """``jobs_fast_due``, with the rows of the poll's first send marked in flight by the
    read itself.

    The first send is of the first target in name order: all its rows, or for a target in
    ``per_row`` (an at-most-once per-row handler) its first ``per_row_send`` rows in poll
    order. They are marked unless that target's pause ran out (its probe row may be given
    back), and the lane hands them before any other send. Marks are those of
    ``inflight_mark_if_leased`` (poll token, live lease of ``owner``); a
    partition whose lease is gone is not marked.
    With writable CTEs (PostgreSQL) one statement reads and marks, so a marked row is
    PENDING as read and no mark statement of its own (the largest fixed cost of a send,
    and of an idle worker's wake-up) is needed; otherwise the read is followed by the
    guarded mark. ``flush_lazily`` (PostgreSQL): a mark of at-least-once rows only commits
    without waiting for its flush (``_flush_lazily``; a takeover leaves such rows PENDING,
    marked or not). ``after``, ``always``, ``enqueues_seen``: as ``jobs_fast_due``.
    """
    if not limits or not partitions:
        return FastPoll([])
    if not writable_ctes():
        due = jobs_fast_due(partitions, now, limits, after=after, always=always,
                            enqueues_seen=enqueues_seen)
        first = min((job.target for job in due.jobs), default=None)
        if first is None or first in due.probing:
            return due
        send = [job for job in due.jobs if job.target == first]
        if first in per_row:
            send = send[:per_row_send]
        wanted: dict[int, list[int]] = {}
        for job in send:
            wanted.setdefault(job.partition, []).append(job.id)  # type: ignore[arg-type]  # stored rows: id is set (None only on a lossy job)
        marked = inflight_mark_if_leased(
            owner, now, token,
            [(job.partition, job.id, job.attempts) for job in send])  # type: ignore[misc]  # stored rows: id is set (None only on a lossy job)
        return FastPoll(due.jobs, due.probing, first,
                        {p: ids for p, ids in wanted.items() if p in marked}, due.last_read,
                        due.enqueues, due.enqueues_open)
    union, params = _fast_heads_sql(partitions, now, limits, after=after, always=always,
                                    enqueues_seen=enqueues_seen)
    # Whether the first target sends per row: one test of one name, whatever the count.
    single = "(SELECT (SELECT min(target) FROM due) = ANY(%s::text[]))"  # an InitPlan
    single_params = [_names_literal(_read_per_row(per_row, limits))]
    first_rows = ("(SELECT id FROM due WHERE target = (SELECT min(target) FROM due) "
                  "ORDER BY next_run_at, id LIMIT %s)")
    lazily = _flush_lazily(flush_lazily, "EXISTS (SELECT 1 FROM first_send "
                           f"WHERE delivery_mode <> '{_AT_LEAST_ONCE}')")
    # The marks as one object {partition: ids}, made once: the update reads the owner's
    # partitions once, where a join of one row per partition compared every pair (64 by 64).
    fetched = fetch(
        f"WITH due AS MATERIALIZED ({union}), "
        "first_send AS MATERIALIZED (SELECT partition, id, delivery_mode FROM due "
        "WHERE target = (SELECT min(target) FROM due) AND NOT probe "
        f"AND (NOT ({single}) OR id IN {first_rows})), "
        f"leased AS ({_leased(partitions='first_send')}), "
        f"marked AS (INSERT INTO {INFLIGHT} (token, partition, owner, ids, marked_at) "
        "SELECT %s, partition, %s, jsonb_agg(id), %s FROM first_send "
        "WHERE partition IN (SELECT partition FROM leased) GROUP BY partition "
        "RETURNING partition) "
        f"SELECT {_COLUMNS}, next_run_at, probe, enqueues, enqueues_open{lazily}, "
        "id IN (SELECT id FROM "
        "first_send) AND partition IN (SELECT partition FROM marked) FROM due "
        "ORDER BY next_run_at, id",
        [*params, *single_params, per_row_send, owner, dt(now), token, owner, dt(now)],
        prepare=True,
    )
    read = _read_fast(fetched)
    marks: dict[int, list[int]] = {}
    for job, values in zip(read.jobs, fetched, strict=True):
        if values[-1]:
            marks.setdefault(job.partition, []).append(job.id)  # type: ignore[arg-type]  # stored rows: id is set (None only on a lossy job)
    first = min((job.target for job in read.jobs), default=None)
    return FastPoll(read.jobs, read.probing, first if first not in read.probing else None,
                    marks, read.last_read, read.enqueues, read.enqueues_open)


# A pass of the worker that handed this many rows, more than the planner believes the
# jobs table holds, has the table analysed (``jobs_analyze_when_behind``), at most once
# an ``ANALYZE_EVERY_S`` per process.
BEHIND_FROM_ROWS = 100
ANALYZE_EVERY_S = 10.0
# The columns the lanes' reads filter and order by: the wide ones (payloads, results,
# tries) are most of a whole analyse's time.
ANALYZE_COLUMNS = ("status", "lane", "target", "partition", "key", "version", "next_run_at",
                   "priority", "running_code")
_monotonic = time.monotonic
_analyzed_at: float | None = None  # when this process last analysed the jobs table


def jobs_analyze_when_behind(rows: int) -> bool:
    """Analyse the jobs table when this process's worker just handed ``rows`` rows, at
    least ``BEHIND_FROM_ROWS`` and more than the planner believes the table holds; whether
    it did.

    The statistics then still describe the table before a burst (a drained queue,
    analysed empty), and every plan made from them reads the burst as if it were a
    handful of rows: wrong indexes, a walk of a key's versions for each row read. A
    drain that followed took seconds of polls of 20-180 ms instead of ~5 ms, until
    autovacuum's own analyse came (its naptime is a minute). Analysing makes every
    session's plans again, for the rows there are. Only the columns the lanes' reads
    filter and order by (``ANALYZE_COLUMNS``): a whole analyse, payloads and results
    included, took twice as long (131 ms at 50,000 rows against 64; 28 against 10 at
    10,000) and 5% from a 10,000-row drain of three workers; with only ``status``,
    ``target`` and ``key``, the reserve, short of ``next_run_at``'s statistics, read and
    sorted every due row. ``SKIP_LOCKED``: another worker's analyse, or autovacuum's, is
    as good and is not waited for; a role that does not own the table gets a warning
    from PostgreSQL and nothing changes.
    """
    global _analyzed_at
    if rows < BEHIND_FROM_ROWS or not is_postgres() or (planned_rows(JOBS) or 0) >= rows:
        return False
    now = _monotonic()
    if _analyzed_at is not None and 0 <= now - _analyzed_at < ANALYZE_EVERY_S:
        return False
    _analyzed_at = now
    # Another worker may have analysed it since this one last read its size.
    if (planned_rows(JOBS, fresh=True) or 0) >= rows:
        return False
    execute(f"ANALYZE (SKIP_LOCKED) {JOBS} ({', '.join(ANALYZE_COLUMNS)})")
    planned_rows(JOBS, fresh=True)
    return True


def jobs_hold_key_until(job: Job, run_at: datetime) -> int:
    """Move the later PENDING versions of a retrying row's key to its retry time.

    They are held anyway (the row is the key's head); moving them keeps the poll's scan
    from walking them again and again until then.
    """
    return execute(
        f"UPDATE {JOBS} SET next_run_at = %s WHERE status = %s AND partition = %s "
        "AND target = %s AND key = %s AND (version > %s OR (version = %s AND id > %s)) "
        "AND next_run_at < %s",
        [dt(run_at), _PENDING, job.partition, job.target, job.key, job.version, job.version,
         job.id, dt(run_at)],
    )


# -- long lane ----------------------------------------------------------------------------


# A try whose worker stopped answering: recorded as this exception (``errors.WorkerLost``).
WORKER_LOST = "jobs_engine.errors.WorkerLost"


def _lost_try() -> str:
    """The ``tries`` entry of a started row whose lease expired, built from the row."""
    return json_object([("worker", "claimed_by"), ("started_at", "started_at"),
                        ("finished_at", "%s"), ("error", f"'{WORKER_LOST}'"),
                        ("traceback", "%s")])


def jobs_long_rescue_expired(now: datetime, *, after: datetime | None = None
                             ) -> tuple[list[ClosedJob], int]:
    """Deal with RUNNING rows whose lease expired (their worker died or stalled); with
    ``after``, only those whose lease expired after it (index ``jobs_running_lease``).

    At-most-once rows whose handler had started go DEAD instead of running twice, keeping
    their claim token (``Guard``: a holder alive after all still writes what happened);
    every other expired row goes back to PENDING for any worker to reserve. A started
    row's try is recorded in ``tries`` as lost. Returns the rows closed and the number
    released.
    """
    expired = dt(now)
    since, since_params = ("", []) if after is None else (" AND lease_until > %s", [dt(after)])
    lost = json_append("tries", _lost_try())
    dead = fetch(
        f"UPDATE {JOBS} SET status = %s, closed_at = %s, last_error = %s, running_code = NULL, "
        f"lease_until = NULL, updated_at = %s, attempts = attempts + 1, tries = {lost} "
        f"WHERE status = %s AND lease_until <= %s{since} AND delivery_mode = %s "
        f"AND started_at IS NOT NULL RETURNING {CLOSED_COLUMNS}",
        [RESCUE_PRESUMED_DEAD.target, expired, RESCUE_REASON, expired, expired, RESCUE_REASON,
         *RESCUE_PRESUMED_DEAD.source_values, expired, *since_params, _AT_MOST_ONCE],
    )
    released = execute(
        f"UPDATE {JOBS} SET status = %s, running_code = NULL, claim_token = NULL, "
        "claimed_by = NULL, lease_until = NULL, started_at = NULL, updated_at = %s, "
        "attempts = attempts + CASE WHEN started_at IS NULL THEN 0 ELSE 1 END, "
        f"tries = CASE WHEN started_at IS NULL THEN tries ELSE {lost} END "
        f"WHERE status = %s AND lease_until <= %s{since}",
        [RESCUE_RELEASE.target, expired, expired, RELEASE_REASON,
         *RESCUE_RELEASE.source_values, expired, *since_params],
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
               "AND p.paused_until > %s)")
_STARTED_AT = (f"CASE WHEN %s AND NOT EXISTS (SELECT 1 FROM {PAUSES} p "
               f"WHERE p.target = {JOBS}.target) THEN %s END")
_RESERVED_COLUMNS = (f"{', '.join(f'{JOBS}.{c}' for c in _JOB_COLUMNS)}, {JOBS}.priority, "
                     f"{JOBS}.next_run_at, {JOBS}.started_at, {JOBS}.tries")
# The four ranges of a reserve from a cursor, in the index's order, with their tests.
_RANGES = {"above": "j.priority > %s",
           "band": "j.priority = %s AND j.next_run_at > %s AND j.next_run_at < %s",
           "after": "j.priority = %s AND (j.next_run_at, j.id) > (%s, %s)",
           "below": "j.priority < %s"}


def _free_code(exclusive_clause: str) -> str:
    """A candidate of an exclusive target whose code runs on some worker is not due. The
    running codes are read once per statement (NOT IN an uncorrelated subquery): a
    correlated test, planned on an empty queue, read the table once per candidate."""
    return (f"(NOT ({exclusive_clause}) OR j.code NOT IN (SELECT r.running_code FROM {JOBS} r "
            f"WHERE r.status = '{_RUNNING}' AND r.running_code IS NOT NULL))")


@lru_cache(maxsize=16)
def _reserve_statement(targets: tuple[str, ...], exclusive: tuple[str, ...],
                       flush_lazily: bool) -> str:
    """``jobs_long_reserve``'s one statement (PostgreSQL) for a worker's target lists,
    made once: the same text at every reserve. With 500 targets registered it is 49 kB,
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
                  f"j.delivery_mode = '{_AT_MOST_ONCE}' AS at_most_once "
                  f"FROM {JOBS} j WHERE {_LONG_PENDING} AND j.next_run_at <= %s "
                  f"AND (j.target = ANY(%s::text[]) OR {names}) AND {_NOT_PAUSED} "
                  f"AND {_free_code(exclusive_clause)} AND {{range}} "
                  "ORDER BY j.priority DESC, j.next_run_at, j.id "
                  "LIMIT %s FOR UPDATE SKIP LOCKED")
    return (
        "WITH " + ", ".join(f"locked_{name} AS ({candidates.replace('{range}', test)})"
                            for name, test in _RANGES.items())
        + ", locked AS (SELECT * FROM (" + " UNION ALL ".join(
            f"SELECT * FROM locked_{name}" for name in _RANGES)
        + ") AS ranges LIMIT %s), "
        "first_of_code AS (SELECT * FROM (SELECT *, row_number() OVER (PARTITION "
        "BY exclusive, CASE WHEN exclusive THEN code END ORDER BY priority DESC, "
        "next_run_at, id) AS nth FROM locked) AS l WHERE NOT exclusive OR nth = 1), "
        "picked AS (SELECT id, exclusive, code, at_most_once FROM (SELECT *, "
        "row_number() OVER (PARTITION BY at_most_once ORDER BY priority DESC, "
        "next_run_at, id) AS nth_mode FROM first_of_code) AS m "
        "WHERE NOT at_most_once OR nth_mode <= %s) "
        f"UPDATE {JOBS} SET status = %s, claim_token = %s, claimed_by = %s, "
        "lease_until = %s, running_code = CASE WHEN picked.exclusive "
        f"THEN picked.code END, started_at = {_STARTED_AT}, updated_at = %s "
        f"FROM picked WHERE {JOBS}.id = picked.id RETURNING {_RESERVED_COLUMNS}, "
        "(SELECT count(*) FROM locked)"
        + _flush_lazily(flush_lazily, "EXISTS (SELECT 1 FROM picked "
                        "WHERE exclusive OR at_most_once)"))


def jobs_long_reserve(owner: str, token: str, now: datetime, lease_s: float, limit: int, *,
                      exclusive_targets: Sequence[str] = (), targets: Sequence[str],
                      start: bool = False, at_most_once_limit: int | None = None,
                      flush_lazily: bool = False, after: LongCursor | None = None,
                      likely: Sequence[str] = ()) -> ReservedRows:
    """Reserve up to ``limit`` due PENDING long-lane rows of ``targets`` under ``token``
    and a lease, in priority order, skipping targets whose pause has not run out; of them
    at most ``at_most_once_limit`` at-most-once rows (None: no bound of their own). An
    at-most-once row past that bound stays PENDING, and the rows after it are still taken.

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
    commits without waiting for its flush (``_flush_lazily``); a crash that loses it
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
    against it (0.35 ms of a woken reserve with 500 targets registered).
    """
    lease_until = dt(now + timedelta(seconds=lease_s))
    started_params = [start, dt(now)]

    def reserved(row: Sequence[Any]) -> Reserved:
        started = row[17] is not None
        return Reserved(_job(row), (read_json(row[18]) or []) if started else None)

    at_most_once = limit if at_most_once_limit is None else min(limit, at_most_once_limit)
    if writable_ctes():
        # Inside a caller's transaction a savepoint keeps a refused statement from aborting
        # it; in autocommit the statement is its own transaction (no BEGIN, no COMMIT).
        alone = contextlib.nullcontext() if transaction.get_autocommit() else transaction.atomic()
        cursor = after or LongCursor(_ABOVE_EVERY_PRIORITY, BEGINNING, BEGINNING, 0)
        range_params = {"above": [cursor.priority],
                        "band": [cursor.priority, dt(cursor.band_from), dt(cursor.at)],
                        "after": [cursor.priority, dt(cursor.at), cursor.id],
                        "below": [cursor.priority]}
        likely_param = text_array(sorted(likely))
        try:
            with alone:
                rows = fetch(
                    _reserve_statement(tuple(targets), tuple(exclusive_targets), flush_lazily),
                    [*[p for name in _RANGES for p in (dt(now), likely_param, dt(now),
                                                         *range_params[name], limit)],
                     limit, at_most_once, RESERVE.target, token, owner, lease_until,
                     *started_params, dt(now)],
                    prepare=True)
        except IntegrityError:
            pass  # a code another worker claimed meanwhile: one code at a time below
        else:
            rows.sort(key=lambda row: (-row[15], row[16], row[0]))
            got = ReservedRows(reserved(row) for row in rows)
            if len(rows) == limit and rows[-1][19] == limit:
                # Every row it locked was taken, as many as it may: the next reserve starts
                # after the last.
                last = rows[-1]
                got.cursor = LongCursor(last[15], last[16] - CURSOR_LAG, last[16], last[0])
            return got
    order: dict[int, int] = {}
    found: list[Reserved] = []
    target_clause, target_params = in_names("j.target", targets)
    excl_clause, excl_params = in_names("j.target", exclusive_targets)
    with transaction.atomic():
        candidates = fetch(
            f"SELECT j.id, j.target, j.code, j.delivery_mode FROM {JOBS} j "
            f"WHERE {_LONG_PENDING} AND j.next_run_at <= %s AND {target_clause} "
            f"AND {_NOT_PAUSED} AND {_free_code(excl_clause)} "
            f"ORDER BY j.priority DESC, j.next_run_at, j.id LIMIT %s{skip_locked()}",
            [dt(now), *target_params, dt(now), *excl_params, limit],
        )
        order = {row[0]: place for place, row in enumerate(candidates)}
        exclusive = set(exclusive_targets)
        plain_ids: list[int] = []
        seen_codes: set[str] = set()
        exclusive_rows = []
        for job_id, target, code, mode in candidates:  # as the statement above picks
            if target in exclusive:
                if code in seen_codes:
                    continue
                seen_codes.add(code)
            if mode == _AT_MOST_ONCE:
                if at_most_once <= 0:
                    continue
                at_most_once -= 1
            if target in exclusive:
                exclusive_rows.append((job_id, code))
            else:
                plain_ids.append(job_id)
        update = (
            f"UPDATE {JOBS} SET status = %s, claim_token = %s, claimed_by = %s, lease_until = %s, "
            f"running_code = %s, started_at = {_STARTED_AT}, updated_at = %s "
            f"WHERE {{where}} AND status = %s RETURNING {_RESERVED_COLUMNS}"
        )
        if plain_ids:
            clause, params = in_("id", plain_ids)
            rows = fetch(update.format(where=clause),
                         [RESERVE.target, token, owner, lease_until, None, *started_params,
                          dt(now), *params, *RESERVE.source_values])
            found += [reserved(row) for row in rows]
        for job_id, code in exclusive_rows:
            try:
                with transaction.atomic():
                    rows = fetch(update.format(where="id = %s"),
                                 [RESERVE.target, token, owner, lease_until, code,
                                  *started_params, dt(now), job_id, *RESERVE.source_values])
            except IntegrityError:
                continue  # another worker runs this code right now
            found += [reserved(row) for row in rows]
    return ReservedRows(sorted(found, key=lambda r: order[r.job.id]))  # type: ignore[index]  # a reserved row is stored: its id is set


def jobs_long_next_due(targets: Sequence[str], now: datetime) -> datetime | None:
    """When the next PENDING long-lane row of ``targets`` not yet due comes due: the lane
    sleeps no longer than that (a deferred job runs on time, not at the next idle poll).
    Prepared: an idle worker asks after each reserve that found nothing, and planning the
    statement with 500 targets' names took 2 ms a call."""
    target_clause, target_params = in_names("j.target", targets)
    rows = fetch(f"SELECT MIN(j.next_run_at) FROM {JOBS} j WHERE {_LONG_PENDING} "
                 f"AND j.next_run_at > %s AND {target_clause}",
                 [dt(now), *target_params], prepare=True)
    return read_dt(rows[0][0]) if rows else None


def _not_indexed(test: str) -> str:
    """``test`` of a row found by id, in a form no index answers. Few rows are RUNNING, so
    the planner prefers ``jobs_running_lease`` (RUNNING rows only) to the primary key for
    a statement that also tests the status; under an old snapshot that index holds an
    entry for every RUNNING version the snapshot still sees, and each is visited."""
    return f"({test}) IS TRUE"


def jobs_long_mark_started(ids: Sequence[int], token: str, now: datetime
                           ) -> dict[int, list[dict[str, Any]]]:
    """Record that the handlers of reserved rows are about to run, in one statement;
    returns each row's earlier tries (its ``tries`` entries). A row missing from the
    answer lost its claim meanwhile: it must not run."""
    clause, params = in_("id", ids)
    rows = fetch(
        f"UPDATE {JOBS} SET started_at = %s WHERE {clause} AND claim_token = %s "
        f"AND {_not_indexed('status = %s')} RETURNING id, tries",
        [dt(now), *params, token, _RUNNING],
    )
    return {job_id: read_json(tries) or [] for job_id, tries in rows}


def jobs_long_renew(held: Mapping[int, str], now: datetime, lease_s: float) -> set[str]:
    """Extend the leases of the RUNNING rows ``held`` (job id -> claim token); returns the
    tokens renewed. By id (``_not_indexed``): ``jobs_running_lease`` would be read from the
    first RUNNING version of the last lease's reserves an old snapshot keeps."""
    ids, id_params = in_("id", sorted(held), arrays_from=1)
    tokens, token_params = in_("claim_token", sorted(set(held.values())), arrays_from=1)
    rows = fetch(
        f"UPDATE {JOBS} SET lease_until = %s WHERE {ids} AND {tokens} "
        f"AND {_not_indexed('status = %s AND lease_until > %s')} RETURNING claim_token",
        [dt(now + timedelta(seconds=lease_s)), *id_params, *token_params, _RUNNING, dt(now)],
    )
    return {row[0] for row in rows}


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
            return (f"{ids} AND status IN ('{_RUNNING}', '{_DEAD}') AND claim_token = %s",
                    [*id_params, self.token])
        read, read_params = _attempts_as_read(rows)
        return (f"{ids} AND ((status = %s AND {read}) OR (status = %s AND claim_token = %s))",
                [*id_params, _PENDING, *read_params, _DEAD, self.token])

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
    transaction, commits without waiting for the WAL flush (``_flush_lazily``).
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
        clear, clear_params = _clear_inflight(guard.token)
        counted += f", cleared AS ({clear} RETURNING 1)"
        count_params += clear_params
    lazily = _flush_lazily(flush_lazily)
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


# -- flows ---------------------------------------------------------------------------------


def flow_steps_queued(step_jobs: Sequence[tuple[int, int]], using: str | None = None) -> None:
    """Mark steps QUEUED, each with the job that runs it: (step id, job id) pairs, in one
    statement per ``FLOW_STEP_CHUNK`` (a batch of 10,000 jobs is ten statements, where an
    update per step or Django's ``bulk_update`` takes seconds)."""
    for start in range(0, len(step_jobs), FLOW_STEP_CHUNK):
        rows, params = table(step_jobs[start:start + FLOW_STEP_CHUNK], ("bigint", "bigint"),
                             using=using)
        execute(f"WITH v(id, job_id) AS ({rows}) UPDATE {FLOW_STEPS} SET state = %s, "
                f"job_id = (SELECT v.job_id FROM v WHERE v.id = {FLOW_STEPS}.id) "
                "WHERE id IN (SELECT id FROM v)", [*params, StepState.QUEUED.value], using)


FLOW_STEP_CHUNK = 1000  # rows of one statement: SQLite takes at most 32,766 parameters
