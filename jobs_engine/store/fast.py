"""The fast lane's reads: each target's due heads, in run order, marked in flight by the read."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any, NamedTuple

from jobs_engine.job import Job
from jobs_engine.store.connection import (
    execute,
    fetch,
    is_postgres,
    named,
)
from jobs_engine.store.dialect import (
    dt,
    in_,
    instant_array,
    int_array,
    names_constant,
    read_dt,
    text_array,
    writable_ctes,
)
from jobs_engine.store.leases import inflight_mark_if_leased, leased_partitions_sql
from jobs_engine.store.rows import (
    AT_LEAST_ONCE_VALUE,
    BEGINNING,
    FAST_ENQUEUES_FUNCTION,
    FAST_PENDING,
    INFLIGHT,
    JOB_COLUMNS,
    JOB_COLUMNS_SQL,
    JOBS,
    PAUSES,
    PENDING_VALUE,
    job_from_row,
    lazy_flush_item,
)

__all__ = [
    "ENQUEUES_FAST",
    "READ_ALL",
    "Cursor",
    "FastPoll",
    "jobs_fast_due",
    "jobs_fast_poll",
    "jobs_hold_key_until",
]

# -- fast lane ----------------------------------------------------------------------------


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
_ENQUEUES_MOVED = f"(SELECT {_ENQUEUES_READ}) > %(enqueues_seen)s"


def _fast_heads_sql(partitions: Sequence[int], now: datetime, limits: Mapping[str, int], *,
                    whole_backlog: bool = False, after: Mapping[str, Cursor] | None = None,
                    always: Collection[str] = (), enqueues_seen: int = READ_ALL
                    ) -> tuple[str, dict[str, Any]]:
    """The heads of the targets in ``limits`` that are not paused: ``JOB_COLUMNS``,
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
    and past ``jit_above_cost`` every poll was compiled first, for far longer than the
    read itself took. Unless every target is in ``always`` (a wake-up's few), the names
    and limits are constants of the text (``_constant_targets``: a worker's registered
    targets, the same text poll after poll), and only the targets in ``always`` or with a
    cursor go as parameters: arrays of every target's name, limit and cursor, dumped and
    parsed at every poll, cost more than the read. SQLite reads every target, one
    ``UNION ALL`` branch each.
    """
    after = after or {}
    names = sorted(limits)
    if not is_postgres():
        return _fast_heads_sqlite(partitions, now, limits, names, whole_backlog, after)
    constant = not set(always) >= set(names)
    listed = [name for name in names if name in always or name in after] if constant else names
    cursors = [after.get(name) for name in listed]
    text = (_fast_heads_constant(whole_backlog, tuple((name, limits[name]) for name in names))
            if constant else _FAST_HEADS_PG[whole_backlog])
    return text, {
        "targets": text_array(listed), "limits": int_array([limits[name] for name in listed]),
        "band_froms": instant_array([c.band_from if c else None for c in cursors]),
        "after_ats": instant_array([c.at if c else None for c in cursors]),
        "after_ids": int_array([c.id if c else 0 for c in cursors]),
        "always": "{" + ",".join("t" if name in always else "f" for name in listed) + "}",
        "enqueues_seen": enqueues_seen, "now": dt(now), "partitions": int_array(partitions)}


def _fast_window(whole_backlog: bool, target: str, limit: str) -> tuple[str, str]:
    """A target's due rows in run order and the condition that a row is its key's head."""
    due = (f"SELECT {', '.join('j.' + c for c in JOB_COLUMNS)}, j.next_run_at "
           f"FROM {JOBS} j WHERE {FAST_PENDING} AND j.target = {target} "
           "AND j.next_run_at <= %(now)s AND {range} AND {partitions}")
    head = ("(j.key IS NULL OR NOT EXISTS ("
            f"SELECT 1 FROM {JOBS} e WHERE e.status = '{PENDING_VALUE}' AND e.key IS NOT NULL "
            "AND e.partition = j.partition AND e.target = j.target AND e.key = j.key "
            "AND (e.version, e.id) < (j.version, j.id)))")
    order = f"ORDER BY j.next_run_at, j.id LIMIT {limit}"
    return (f"{due} AND {head} {order}" if whole_backlog else f"{due} {order}"), head


def _fast_heads_pg(whole_backlog: bool, constant: str = "") -> str:
    """The read of ``_fast_heads_sql``; ``constant``: a ``UNION ALL`` branch of the targets
    not passed as parameters (``_fast_heads_constant``)."""
    window, head = _fast_window(whole_backlog, "w.target", "w.lim")
    partitions = "j.partition = ANY(%(partitions)s::integer[])"
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
        "FROM (SELECT * FROM unnest(%(targets)s::text[], %(limits)s::integer[], "
        "%(band_froms)s::timestamptz[], %(after_ats)s::timestamptz[], "
        "%(after_ids)s::bigint[], %(always)s::boolean[]) AS a(target, lim, band_from, "
        f"after_at, after_id, always){constant}) AS w "
        f"CROSS JOIN {enqueues} AS c WHERE (w.always OR c.n > %(enqueues_seen)s) AND NOT EXISTS ("
        f"SELECT 1 FROM {PAUSES} p WHERE p.target = w.target AND p.paused_until > %(now)s)) "
        "AS w "
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
        f"WHERE {_ENQUEUES_MOVED} AND t.target <> ALL(%(targets)s::text[])"))


def _fast_heads_sqlite(partitions: Sequence[int], now: datetime, limits: Mapping[str, int],
                       names: list[str], whole_backlog: bool, after: Mapping[str, Cursor]
                       ) -> tuple[str, dict[str, Any]]:
    """``_fast_heads_sql`` on SQLite: a ``UNION ALL`` branch per target, its parameters
    numbered (``target_0``, ``limit_0``, ``band_from_0``...)."""
    window, head = _fast_window(whole_backlog, "%(target)s", "%(limit)s")
    part_clause, params = named(in_("j.partition", partitions), "partitions")
    window = window.format(range="(j.next_run_at, j.id) > (%(band_from)s, 0)",
                           partitions=part_clause)
    paused = f"EXISTS (SELECT 1 FROM {PAUSES} p WHERE p.target = %(target)s)"
    per_target = (f"SELECT *, {paused} AS probe, NULL AS enqueues, NULL AS enqueues_open "
                  f"FROM ({window}) AS j "
                  f"WHERE NOT EXISTS (SELECT 1 FROM {PAUSES} p WHERE p.target = %(target)s "
                  "AND p.paused_until > %(now)s)" + ("" if whole_backlog else f" AND {head}"))
    params["now"] = dt(now)
    branches = []
    for n, name in enumerate(names):
        cursor = after.get(name)
        branches.append(_OF_TARGET.sub(rf"%(\1_{n})s", per_target))
        params |= {f"target_{n}": name, f"limit_{n}": limits[name],
                   f"band_from_{n}": dt(cursor.band_from if cursor else BEGINNING)}
    return " UNION ALL ".join(branches), params


_OF_TARGET = re.compile(r"%\((target|limit|band_from)\)s")  # a branch's own parameters


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
    the server parsed at each of them: work in proportion to the registered targets."""
    if len(limits) < len(per_row):
        return tuple(name for name in sorted(limits) if name in per_row)
    return tuple(per_row)


_NEXT_RUN_AT = len(JOB_COLUMNS)  # where a read row's next_run_at is, after a Job's columns


def _read_fast(fetched: Sequence[Sequence[Any]]) -> FastPoll:
    """``fetched``: rows of ``JOB_COLUMNS``, ``next_run_at``, ``probe``, ``enqueues``,
    ``enqueues_open``, then
    any columns of the caller's."""
    jobs = [job_from_row(row) for row in fetched]
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
    """Read the due heads of the fast-lane targets in ``limits``, in run order.

    Index: ``jobs_fast_pending_due``, ``jobs_pending_key_order`` for each hold test.
    One scan per target read. Due PENDING rows (up to its limit each) of targets that are
    not paused, in the given partitions, each the head of its key, in run order: the heads
    among each target's first ``limit`` due rows (``_fast_heads_sql``).

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
        f"SELECT {JOB_COLUMNS_SQL}, next_run_at, probe, enqueues, enqueues_open "
        f"FROM ({union}) AS due ORDER BY next_run_at, id", params))


def jobs_fast_poll(
    partitions: Sequence[int], now: datetime, limits: Mapping[str, int], *, owner: str,
    token: str, per_row: Collection[str] = (), per_row_send: int = 1,
    flush_lazily: bool = False, after: Mapping[str, Cursor] | None = None,
    always: Collection[str] = (), enqueues_seen: int = READ_ALL,
) -> FastPoll:
    """Read as ``jobs_fast_due`` does and mark the poll's first send in flight.

    Index: ``jobs_fast_pending_due``, ``jobs_pending_key_order``, ``jobs_inflight_by_token``.
    The read is ``jobs_fast_due``'s; the rows of the poll's first send are marked in
    flight by the read itself.

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
    without waiting for its flush (``lazy_flush_item``; a takeover leaves such rows PENDING,
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
    single = "(SELECT (SELECT min(target) FROM due) = ANY(%(per_row)s::text[]))"  # an InitPlan
    first_rows = ("(SELECT id FROM due WHERE target = (SELECT min(target) FROM due) "
                  "ORDER BY next_run_at, id LIMIT %(per_row_send)s)")
    lazily = lazy_flush_item(flush_lazily, "EXISTS (SELECT 1 FROM first_send "
                           f"WHERE delivery_mode <> '{AT_LEAST_ONCE_VALUE}')")
    # The marks as one object {partition: ids}, made once: the update reads the owner's
    # partitions once, where a join of one row per partition compared every pair (64 by 64).
    fetched = fetch(
        f"WITH due AS MATERIALIZED ({union}), "
        "first_send AS MATERIALIZED (SELECT partition, id, delivery_mode FROM due "
        "WHERE target = (SELECT min(target) FROM due) AND NOT probe "
        f"AND (NOT ({single}) OR id IN {first_rows})), "
        f"leased AS ({leased_partitions_sql(partitions='first_send')}), "
        f"marked AS (INSERT INTO {INFLIGHT} (token, partition, owner, ids, marked_at) "
        "SELECT %(token)s, partition, %(owner)s, jsonb_agg(id), %(now)s FROM first_send "
        "WHERE partition IN (SELECT partition FROM leased) GROUP BY partition "
        "RETURNING partition) "
        f"SELECT {JOB_COLUMNS_SQL}, next_run_at, probe, enqueues, enqueues_open{lazily}, "
        "id IN (SELECT id FROM "
        "first_send) AND partition IN (SELECT partition FROM marked) FROM due "
        "ORDER BY next_run_at, id",
        {**params, "per_row": _names_literal(_read_per_row(per_row, limits)),
         "per_row_send": per_row_send, "owner": owner, "token": token},
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


def jobs_hold_key_until(job: Job, run_at: datetime) -> int:
    """Move the later PENDING versions of a retrying row's key to its retry time.

    Index: ``jobs_pending_key_order``.

    They are held anyway (the row is the key's head); moving them keeps the poll's scan
    from walking them again and again until then.
    """
    return execute(
        f"UPDATE {JOBS} SET next_run_at = %(run_at)s WHERE status = %(pending)s "
        "AND partition = %(partition)s AND target = %(target)s AND key = %(key)s "
        "AND (version > %(version)s OR (version = %(version)s AND id > %(id)s)) "
        "AND next_run_at < %(run_at)s",
        {"run_at": dt(run_at), "pending": PENDING_VALUE, "partition": job.partition,
         "target": job.target, "key": job.key, "version": job.version, "id": job.id},
    )


