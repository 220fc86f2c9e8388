"""The planner policy: how the worker's sessions keep PostgreSQL's plans, and when they make
them again.

What it is. A worker session prepares the statements it repeats (``connection.fetch`` with
``prepare``) and keeps one generic plan per statement (``plan_cache_mode =
force_generic_plan``), without JIT compilation (``jit = off``). It drops its plans
(``DISCARD PLANS``) once a ``REPLAN_S`` and makes them again for the table as it is; and
at once when the worker finds rows after finding none. The poll answering a wake-up runs on
the plans the session has and reads a few rows (``WOKEN_POLL_ROWS``). A worker pass that
handed more rows than PostgreSQL's statistics say the jobs table holds has the table
analysed (``Planner.analyze_when_behind``).

Why, rule by rule (the measurements behind each: docs/benchmarks.md):

- Planning cost more than running: more than the long-lane reserve's run, as much as the
  fast poll's, a large share of a write of successes. Hence one generic plan.
- A generic plan is made for the table's size at the time, and kept: a worker that polled
  an empty queue kept a sequential scan for the burst that followed, and drained it at a
  fraction of its rate. Hence ``REPLAN_S``: a plan made on a small table serves a second
  at most.
- A second is long in a burst: three long-lane workers drained a burst slower than one
  worker did, each spending its first reserves in plans made for no rows. Hence
  ``queue_busy``: once the worker finds rows, each session makes the plans it made while
  it found none again at its next prepared statement (off the wake-up's path: the poll
  that found the rows has run), and keeps those it makes meanwhile for ``REPLAN_S``.
- A worker idle for longer than ``REPLAN_S`` spent its wake-up remaking them, a large part
  of the time from commit to handler. Hence ``poll_woken``: that poll runs on the plans
  and the table size the worker has, and the poll after it makes them again. Those plans
  may be made for an empty table, where a plan walked the whole table once per row read:
  the woken poll reads at most ``WOKEN_POLL_ROWS`` rows (the lanes cap it).
- JIT compiled cheap statements: the engine's are short, but a plan costed past
  ``jit_above_cost`` (a window's limit a tenth of a large table, many targets) was
  compiled first, at every run of a generic plan, for many times the statement's run.
- Plans made again are only as good as the statistics, and a drained queue that autovacuum
  analysed says "no rows" until its next analyse, up to a minute after a burst: every plan
  read the burst as a handful of rows, through the wrong indexes, and polls ran many
  times slower. Hence ``analyze_when_behind``.
- One rule outside the worker's sessions: the enqueue function
  ``jobs_engine_enqueue_rows`` runs with ``SET enable_sort = off`` (its own setting, in the
  migration, only while it runs). PL/pgSQL keeps its insert's plan for the session, and a
  plan made while the table was empty looked a key's head up through the status index and
  a sort, kept once the table had grown, and keyed inserts ran many times slower. With
  sorts off, the key-order index is the one way to a head without a sort, at any size of
  the table.

Who owns it: ``planner``, this process's ``Planner``. The worker tells it what it sees
(``queue_busy``, ``poll_woken``) and asks it to analyse (``analyze_when_behind``); the
connection asks it before each prepared statement (``refresh_plans``). Nothing else sets
its state. It depends on nothing of the store (the connection applies it, so it sits
below): it sets a session up on the connection it is handed, and reads a table's size and
analyses on Django's cursors.

How to turn it off: ``JOBS["PLANNER_POLICY"] = False`` (``JOBS_PLANNER_POLICY=off``), which
the worker passes to ``Planner.enable`` before its first statement. Its sessions then keep
PostgreSQL's defaults: the plan cache mode ``auto`` (custom plans for a statement's first
five runs, then a generic one where it costs about as much), JIT as the server has it, no
``DISCARD PLANS``, and no analyse but autovacuum's. What is not the planner's stays:
statements are still prepared, a woken poll still reads a few rows, and the enqueue
function keeps its setting (part of the schema, for every session that enqueues).
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from jobs_engine.models import Job as JobTable

__all__ = [
    "REPLAN_S",
    "WOKEN_POLL_ROWS",
    "Planner",
    "planner",
    "table_row_estimate",
]

# How long a worker session keeps its generic plans before it makes them again (seconds,
# monotonic); the table's size is read again as often (``Planner.planned_rows``).
REPLAN_S = 1.0
# A poll answering a wake-up reads at most this many rows (per target on the fast lane).
WOKEN_POLL_ROWS = 10
# A pass of the worker that handed this many rows, more than the planner believes the
# jobs table holds, has the table analysed, at most once an ``ANALYZE_EVERY_S``.
BEHIND_FROM_ROWS = 100
ANALYZE_EVERY_S = 10.0
# The columns the lanes' reads filter and order by: the wide ones (payloads, results,
# tries) are most of a whole analyse's time.
ANALYZE_COLUMNS = ("status", "lane", "target", "partition", "key", "version", "next_run_at",
                   "priority", "running_code")
JOBS = JobTable._meta.db_table  # ``rows.JOBS``, read off the model: ``rows`` is above this

# A worker session's settings, once, at its first prepared statement.
_WORKER_SESSION = ("SELECT set_config('plan_cache_mode', 'force_generic_plan', false), "
                   "set_config('jit', 'off', false)")


def table_row_estimate(table_name: str) -> int | None:
    """PostgreSQL's planner estimate of a table's rows (no scan); None elsewhere or when
    the table was never analysed."""
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor != "postgresql":
        return None
    with db.cursor() as cursor:
        cursor.execute("SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)",
                       [table_name])
        row = cursor.fetchone()
    if row is None or row[0] is None or row[0] < 0:
        return None
    return int(row[0])


class Planner:
    """The planner policy of one process's worker sessions, and its state: whether it is
    on, what the worker last saw (rows found, a wake-up answered), when each session made
    its plans, the table sizes read and when the jobs table was last analysed.

    ``clock``: monotonic seconds, the intervals' measure (a test's fake clock);
    ``row_estimate``: how a table's size is read (``table_row_estimate``).
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic,
                 row_estimate: Callable[[str], int | None] = table_row_estimate) -> None:
        self._row_estimate = row_estimate
        # Sessions whose prepared statements are the engine's only -> when their plans were
        # made, and whether the worker was finding rows then.
        self._sessions: weakref.WeakKeyDictionary[Any, tuple[float, bool]] = \
            weakref.WeakKeyDictionary()
        self.reset(clock=clock)

    def reset(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        """Back to a new process's state (on, not busy, not woken, no table size read, never
        analysed), its intervals measured on ``clock``: a test's fresh start. Sessions
        already set up keep their settings, and make their plans again at their next
        prepared statement (times of the old clock mean nothing on the new one)."""
        for session in list(self._sessions):
            self._sessions[session] = (-math.inf, False)
        self._clock = clock
        self._enabled = True
        self._busy = False  # the worker found rows at its last poll (``queue_busy``)
        self._woken = False  # its next poll answers a wake-up (``poll_woken``)
        self._row_estimates: dict[str, tuple[float, int | None]] = {}  # -> (read at, rows)
        self._analyzed_at: float | None = None  # when this process last analysed the jobs

    @property
    def enabled(self) -> bool:
        return self._enabled

    @property
    def busy(self) -> bool:
        return self._busy

    @property
    def woken(self) -> bool:
        return self._woken

    # -- what the worker tells it -------------------------------------------------------

    def enable(self, on: bool) -> None:
        """The policy on, or off (``PLANNER_POLICY``; the module's docstring says what off
        leaves). Set before the worker's first statement: a session already set up keeps
        its settings until it closes."""
        self._enabled = on

    def queue_busy(self, busy: bool) -> None:
        """This process's worker found rows to hand (``busy``) or none at its last poll.
        Plans made while it found none may have been made for an empty queue: once it
        finds rows, each session's next prepared statement makes them again."""
        self._busy = busy

    def poll_woken(self, woken: bool) -> None:
        """This process's worker's next poll answers a wake-up (a NOTIFY, or a poke after
        an idle wait): it runs with the plans the sessions have and the table sizes last
        read, however old, made again at the poll after it."""
        self._woken = woken

    # -- what the connection asks -------------------------------------------------------

    def refresh_plans(self, db: BaseDatabaseWrapper, raw_connection: Any) -> None:
        """Before a prepared statement on a worker session (``raw_connection``, Django's
        ``db``): set the session up at its first one, and drop its plans when they are
        stale, so the statement is planned for the table as it is. In autocommit only: a
        ``SET`` in a transaction would end with a rollback."""
        if not self._enabled:
            return
        made, now = self._sessions.get(raw_connection), self._clock()
        stale = made is None or (not self._woken and (
            not 0 <= now - made[0] < REPLAN_S or (self._busy and not made[1])))
        if stale and db.get_autocommit():
            with db.wrap_database_errors:
                raw_connection.execute(_WORKER_SESSION if made is None else "DISCARD PLANS")
            self._sessions[raw_connection] = (now, self._busy)

    def plans_made_at(self, raw_connection: Any) -> float | None:
        """When the session last made its plans (``clock``); None before the policy set it
        up."""
        made = self._sessions.get(raw_connection)
        return None if made is None else made[0]

    # -- statistics -----------------------------------------------------------------------

    def planned_rows(self, table_name: str, *, fresh: bool = False) -> int | None:
        """The table's size as the planner believes it (``table_row_estimate``), read again
        at most once a ``REPLAN_S``, as often as the sessions' plans are made, and not by
        the poll answering a wake-up. ``fresh``: read now."""
        now = self._clock()
        seen = self._row_estimates.get(table_name)
        if fresh or seen is None or (not self._woken and not 0 <= now - seen[0] < REPLAN_S):
            seen = self._row_estimates[table_name] = (now, self._row_estimate(table_name))
        return seen[1]

    def analyze_when_behind(self, rows: int) -> bool:
        """Analyse the jobs table when this process's worker just handed ``rows`` rows, at
        least ``BEHIND_FROM_ROWS`` and more than the planner believes the table holds;
        whether it did.

        The statistics then still describe the table before a burst (a drained queue,
        analysed empty), and every plan made from them reads the burst as if it were a
        handful of rows: wrong indexes, a walk of a key's versions for each row read. A
        drain that followed ran on slow polls for seconds, until autovacuum's own analyse
        came (its naptime is a minute). Analysing makes every session's plans again, for
        the rows there are. Only the columns the lanes' reads filter and order by
        (``ANALYZE_COLUMNS``): a whole analyse, payloads and results included, took twice
        as long and slowed a short drain of three workers; with only ``status``,
        ``target`` and ``key``, the reserve, short of ``next_run_at``'s statistics, read
        and sorted every due row. ``SKIP_LOCKED``: another worker's analyse, or
        autovacuum's, is as good and is not waited for; a role that does not own the table
        gets a warning from PostgreSQL and nothing changes.
        """
        if rows < BEHIND_FROM_ROWS or not self._enabled:
            return False
        db = connections[DEFAULT_DB_ALIAS]
        if db.vendor != "postgresql" or (self.planned_rows(JOBS) or 0) >= rows:
            return False
        now = self._clock()
        if self._analyzed_at is not None and 0 <= now - self._analyzed_at < ANALYZE_EVERY_S:
            return False
        self._analyzed_at = now
        # Another worker may have analysed it since this one last read its size.
        if (self.planned_rows(JOBS, fresh=True) or 0) >= rows:
            return False
        with db.cursor() as cursor:
            cursor.execute(f"ANALYZE (SKIP_LOCKED) {JOBS} ({', '.join(ANALYZE_COLUMNS)})")
        self.planned_rows(JOBS, fresh=True)
        return True


# This process's planner: its worker's sessions are set up by it, its worker tells it what
# it sees.
planner = Planner()
