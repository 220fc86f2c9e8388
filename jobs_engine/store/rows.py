"""What every statement family of the store shares: the tables, what a lane reads of a
row, the edges of the state machine the statements take, and the guards on rows as read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction

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
from jobs_engine.states import DEAD, DELETED, DONE, PENDING, RUNNING, DeliveryMode, Lane
from jobs_engine.store.dialect import (
    read_dt,
    read_json,
    table,
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
    "RELEASE_REASON",
    "RESCUE_PRESUMED_DEAD",
    "RESCUE_REASON",
    "RESCUE_RELEASE",
    "RESERVE",
    "RETRIED",
    "TAKEOVER_PRESUMED_DEAD",
    "TAKEOVER_REASON",
    "WAKE_FUNCTION",
    "WORKERS",
    "ClosedJob",
    "closed_jobs",
    "cut_error",
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
# PostgreSQL's functions of the enqueue, the wake-ups and the limits' admission, made by the
# engine's migration.
INSERT_ROWS_FUNCTION = "jobs_engine_enqueue_rows"  # any rows
INSERT_PAYLOADS_FUNCTION = "jobs_engine_enqueue_payloads"  # payloads of one target only
WAKE_FUNCTION = "jobs_engine_wake"  # after the commit, when a worker waited
ENQUEUING_FUNCTION = "jobs_engine_enqueuing"  # the insert's look at its lanes
ASK_FUNCTION = "jobs_engine_ask"
FAST_ENQUEUES_FUNCTION = "jobs_engine_fast_enqueues"
LIMITS_ADMIT_FUNCTION = "jobs_engine_limits_admit"  # the long lane's admission under limits


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

PENDING_VALUE, RUNNING_VALUE, DEAD_VALUE = PENDING.value, RUNNING.value, DEAD.value
AT_MOST_ONCE_VALUE = DeliveryMode.AT_MOST_ONCE.value
AT_LEAST_ONCE_VALUE = DeliveryMode.AT_LEAST_ONCE.value
# A hot prepared statement names the lane and state of the partial index it reads as
# literals, not parameters: its generic plan (``planning``) can then use that index,
# where with parameters only a plan made for each call's values can.
# The long lane's rows for the reserve of targets without limits (``jobs_long_pending_due``).
LONG_PENDING = (f"j.lane = '{Lane.LONG.value}' AND j.status = '{PENDING_VALUE}' "
                "AND j.limit_key IS NULL")
FAST_PENDING = f"j.lane = '{Lane.FAST.value}' AND j.status = '{PENDING_VALUE}'"
# The limited targets' rows waiting (``jobs_limited_pending``) and running
# (``jobs_limited_running``), for the admission's prepared reads.
LIMITED_PENDING = f"j.status = '{PENDING_VALUE}' AND j.limit_key IS NOT NULL"
LIMITED_RUNNING = f"j.status = '{RUNNING_VALUE}' AND j.limit_key IS NOT NULL"

# The dedupe key of a flow step's job starts with this (``flows.queue``): such a job belongs
# to its flow, kept and removed with it, never by its target's keep counts.
FLOW_STEP_KEY_PREFIX = "flow-step:"

# What a lane reads of a row, in the order of ``Job``'s fields.
JOB_COLUMNS = ("id", "target", "code", "key", "version", "payload", "headers", "attempts",
                "trace_id", "dedupe_key", "actor", "created_at", "partition", "delivery_mode",
                "tenant_id", "limit_key")
JOB_COLUMNS_SQL = ", ".join(JOB_COLUMNS)


def job_from_row(row: Sequence[Any]) -> Job:
    """A row of ``JOB_COLUMNS`` (positional: this runs for every row a lane reads)."""
    (job_id, target, code, key, version, payload, headers, attempts, trace_id, dedupe_key,
     actor, created_at, partition, delivery_mode, tenant_id, limit_key) = row[:16]
    return Job(job_id, target, code, key, version, payload,
               read_json(headers) if headers != "{}" else {}, attempts, trace_id, dedupe_key,
               read_json(actor), read_dt(created_at), partition, delivery_mode, tenant_id,
               limit_key)


def cut_error(text: str) -> str:
    return clean(text, LAST_ERROR_LIMIT)



# -- shared by the statements below -----------------------------------------------


def attempts_as_read(rows: Sequence[tuple[int, int]]) -> tuple[str, list[Any]]:
    """SQL true when a row's ``attempts`` is the one of its ``(id, attempts)`` in ``rows``
    (as it was read): one value for a send's rows, nearly always, else the pairs. On
    PostgreSQL one text for any number of rows (arrays), so the statement can be prepared."""
    if len({attempts for _, attempts in rows}) == 1:
        return "attempts = %s", [rows[0][1]]
    pairs, params = table(rows, ("bigint", "integer"), arrays_from=1)
    return f"(id, attempts) IN ({pairs})", params


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


def lazy_flush_item(wanted: bool, unless: str | None = None) -> str:
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



# A cursor's lag band: a read after a cursor also reads the rows due this long before it,
# which a transaction that began that much before another's commit may commit after it.
CURSOR_LAG = timedelta(seconds=0.1)


# Before every row: where a read without a cursor starts on SQLite.
BEGINNING = datetime(1, 1, 1, tzinfo=UTC)


