"""The ``shapes`` phase: three shapes of production load, each measured through the engine's
public API and real worker processes, each beside a reference of the same round.

1. Idle targets. A project registers many targets that receive nothing. With 0, 50 and 500
   (``shapes_idle``) idle fast-lane and as many idle long-lane no-op targets registered
   (``JOBS_BENCH_IDLE_TARGETS``, ``bench/targets.py``), in the workers and in this
   process: the D1 drain of ``shapes_fast_n`` at-least-once no-op jobs by one
   ``run_fast_lane``, of ``shapes_long_n`` no-op jobs by one ``run_long_lane``, an idle
   worker's wake-up latency on each lane (``workloads.latency_run``, ``shapes_lat_n``
   jobs), and the fast poll as a worker runs it over a backlog of ``shapes_fast_n`` rows
   of one target (``store.jobs_fast_poll``, timed; ``store.jobs_fast_due``'s statement
   and the poll's own EXPLAINed into ``<results>/explain_shapes_targets.txt``). Each
   against 0 idle targets of the same round.
2. A web tier. P processes (``shapes_web_procs``: 1, 16, 64; forked from this one, all
   released by one barrier) each enqueue ``shapes_web_n / P`` jobs, one per commit
   (``jobs_engine.enqueue`` in autocommit), of a no-op fast target, with no worker
   running, and again with one ``run_fast_lane`` serving an at-least-once no-op target (it
   keeps up, so it sleeps and asks to be woken again and again; how often is counted).
   Beside them, in the same round, the same processes
   doing raw psycopg ``INSERT`` into ``scale_raw`` (the job row's payload: id bigserial,
   payload jsonb, created_at timestamptz) in autocommit, and ``INSERT`` + ``SELECT
   pg_notify(...)`` in one transaction (and, as one more reference, both in one statement
   in autocommit: one round trip, as the engine's enqueue). Rate: jobs over the wall time
   from the barrier to the last process joined.
3. An old snapshot. Another session holds a snapshot taken before the first fill
   (``REPEATABLE READ``, ``SELECT count(*)`` of the jobs table, kept open) while
   ``shapes_xmin_drains`` drains of ``shapes_xmin_n`` jobs run in a row, nothing truncated
   or vacuumed between them (dead rows pile up, as behind a long report or a replica's
   feedback); the same drains without it; per lane (at-least-once no-op targets, one
   worker). After the last drain, the snapshot still held, the lane's own statement (the
   fast poll, the long reserve) is timed on the empty queue and on ``shapes_poll_n`` rows,
   against the same without it; then a VACUUM tells the dead row versions it could not
   remove. The engine's tables are vacuumed once the snapshot is released.

The order of the levels and of the series turns by round, so no level always runs first on
this noisy machine. Import after ``django.setup()``; ``bench/run.py --only shapes``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import re
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from django.db import DatabaseError, connection, connections, transaction

from bench import targets
from bench.harness import (
    DrainWatch,
    Metrics,
    Options,
    Workers,
    analyze,
    clock_drain,
    cpu_times,
    dead_count,
    drain,
    drained,
    fill,
    partitions_balanced,
    payload,
    remaining,
    reset,
    running,
    shown,
    sql,
    wait_for,
)
from bench.poll_cost import capture_sql, explain
from bench.workloads import latency_run
from jobs_engine import enqueue, registry, store
from jobs_engine.conf import jobs_settings
from jobs_engine.lanes.fast import takes_whole_poll
from jobs_engine.states import Lane

POLL_OWNER = "bench-shapes"  # a worker id that holds no partition: a poll marks nothing
EXPLAIN_FILE = "explain_shapes_targets.txt"

_round = 0  # which level and which series go first turns by round


def turned(items: Sequence[Any], by: int) -> list[Any]:
    """``items`` rotated left by ``by``."""
    k = by % len(items) if items else 0
    return [*items[k:], *items[:k]]


def phase_shapes(o: Options) -> Metrics:
    global _round
    r, _round = _round, _round + 1
    if not store.is_postgres():
        raise RuntimeError("the shapes phase needs PostgreSQL (DATABASE_URL=postgres://...)")
    out: Metrics = {}
    for name, shape in (("idle targets", shape_idle), ("web tier", shape_web),
                        ("old snapshot", shape_snapshot)):
        started = time.perf_counter()
        out.update(shape(o, r))
        print(f"    shape {name} done in {time.perf_counter() - started:.1f}s", flush=True)
    reset()
    return out


# -- what a worker passes ----------------------------------------------------------------------


def _not_in_workers() -> set[str]:
    """Targets this process may hold that the shapes' workers do not register: the Kafka
    phase's (its workers alone get them)."""
    return {targets.kafka_target(kind) for kind in targets.KAFKA_TOPICS} | {
        targets.KAFKA_DATABASE_PART}


def fast_limits() -> tuple[dict[str, int], list[str]]:
    """The limits a ``run_fast_lane`` worker passes to its poll (every registered fast
    target, its batch size or FAST_BATCH; ``FastLane.run_once``) and its per-row targets;
    made again only when the registered targets change, as the worker's."""
    fast = registry.lane_targets(Lane.FAST)
    if _limits_made.get("of") is not fast:
        skip = _not_in_workers()
        mine = [t for t in fast if t.name not in skip]
        batch = jobs_settings().FAST_BATCH
        _limits_made.update(of=fast, limits=({t.name: t.batch_size or batch for t in mine},
                                             [t.name for t in mine if not takes_whole_poll(t)]))
    return _limits_made["limits"]


_limits_made: dict[str, Any] = {}


def fast_poll(now: Any, after: dict[str, store.Cursor] | None = None,
              active: Sequence[str] | None = None) -> int:
    """The fast lane's poll as one worker holding every partition runs it (prepared, the
    worker's limits), by ``POLL_OWNER``, which holds no lease and so marks nothing: a deep
    read (every target, from its first due row), or with ``active`` the poll between
    two (those targets only, the enqueue count unmoved), from the cursors ``after``."""
    settings = jobs_settings()
    limits, per_row = fast_limits()
    seen = store.READ_ALL if active is None else enqueues_fast()
    return len(store.jobs_fast_poll(
        list(range(settings.PARTITIONS)), now, limits, owner=POLL_OWNER,
        token=uuid.uuid4().hex, per_row=per_row, per_row_send=settings.FAST_MARK_ROWS,
        flush_lazily=settings.LAZY_FLUSH_AT_LEAST_ONCE, after=after, always=active or (),
        enqueues_seen=seen).jobs)


def enqueues_fast() -> int:
    """``store.ENQUEUES_FAST`` now."""
    return sql(f"SELECT COALESCE(pg_sequence_last_value('{store.ENQUEUES_FAST}'), 0)")[0][0]


def fast_due_sql(now: Any) -> tuple[str, Any]:
    """``store.jobs_fast_due``'s statement (``_fast_heads_sql``) with the worker's limits."""
    limits, _ = fast_limits()
    partitions = list(range(jobs_settings().PARTITIONS))
    return capture_sql(lambda: store.jobs_fast_due(partitions, now, limits))[-1]


def fast_poll_sql(now: Any) -> tuple[str, Any]:
    return capture_sql(lambda: fast_poll(now))[-1]


def backlog_walk_limits(found: set[str]) -> dict[str, int]:
    """The limits of the worker's backlog walk (``FastLane._backlog_heads``, at most once a
    POLL_S): the targets its poll read nothing of."""
    limits, _ = fast_limits()
    return {name: limit for name, limit in limits.items() if name not in found}


def backlog_walk(now: Any, found: set[str]) -> int:
    partitions = list(range(jobs_settings().PARTITIONS))
    return len(store.jobs_fast_due(partitions, now, backlog_walk_limits(found),
                                   whole_backlog=True).jobs)


def explain_generic(query: str, params: Sequence[Any]) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of the server's generic plan of ``query``, the plan a
    prepared statement may keep after its fifth run (PREPARE, then EXECUTE under
    ``plan_cache_mode = force_generic_plan``), in a rolled-back transaction."""
    numbers = iter(range(1, len(params) + 1))
    numbered = re.sub(r"%s", lambda _: f"${next(numbers)}", query).replace("%%", "%")
    lines: list[str] = []
    with contextlib.suppress(_Rollback), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"PREPARE bench_shapes_generic AS {numbered}")
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) EXECUTE bench_shapes_generic("
                       + ", ".join(["%s"] * len(params)) + ")", params)
        lines = [str(row[0]) for row in cursor.fetchall()]
        raise _Rollback
    return "\n".join(lines)


class _Rollback(Exception):
    pass


def long_reserve() -> Callable[[store.LongCursor | None], store.ReservedRows]:
    """The long lane's reserve (``store.jobs_long_reserve``) as an idle worker's poll passes
    it: every registered long target, LONG_BATCH rows, from the first due row or the
    cursor it is given."""
    settings = jobs_settings()
    skip = _not_in_workers()
    mine = [t for t in registry.all_targets()
            if t.lane is Lane.LONG and not t.lossy and t.name not in skip]
    exclusive, names = [t.name for t in mine if t.exclusive], sorted(t.name for t in mine)

    def reserve(after: store.LongCursor | None) -> store.ReservedRows:
        return store.jobs_long_reserve(
            POLL_OWNER, uuid.uuid4().hex, store.db_now(), settings.LONG_LEASE_S,
            settings.LONG_BATCH, exclusive_targets=exclusive, targets=names, start=True,
            at_most_once_limit=settings.LONG_BATCH, after=after)
    return reserve


def median_ms(call: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def time_fast_poll(reps: int, after: dict[str, store.Cursor] | None = None,
                   active: Sequence[str] | None = None) -> float:
    """Median ms of the worker's fast poll on the rows in the table now (``fast_poll``)."""
    now = store.db_now()
    return median_ms(lambda: fast_poll(now, after, active), reps)


def time_long_reserve_from(reps: int, cursor: store.LongCursor) -> float:
    """Median ms of the long lane's reserve from ``cursor`` as the worker runs it, in
    autocommit, the cursor moved on after each as the worker's is. The rows taken stay
    RUNNING: a row put back would leave dead index entries an old snapshot keeps, which
    every later run from the same cursor walked (a worker's next reserve never reads them
    again)."""
    reserve = long_reserve()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        got = reserve(cursor)
        times.append((time.perf_counter() - started) * 1000)
        cursor = got.cursor or cursor
    return statistics.median(times)


def time_long_reserve(reps: int) -> float:
    """Median ms of the long lane's reserve from the first due row (once a ``POLL_S``) as
    the worker runs it, in autocommit; the rows it took are put back by id after each run,
    untimed, so every run finds the same rows (by status, the put-back would walk every
    RUNNING version an old snapshot keeps)."""
    reserve = long_reserve()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        got = reserve(None)
        times.append((time.perf_counter() - started) * 1000)
        if got:
            sql(f"UPDATE {store.JOBS} SET status = 'PENDING', claim_token = NULL, "
                "claimed_by = NULL, lease_until = NULL, running_code = NULL, started_at = NULL "
                "WHERE id = ANY(%s)", [[r.job.id for r in got]])
    return statistics.median(times)


# -- 1. idle targets ---------------------------------------------------------------------------


@contextlib.contextmanager
def idle_targets(count: int) -> Iterator[dict[str, str]]:
    """``count`` idle targets of each lane registered in this process and in every worker
    started meanwhile (their environment is this process's, ``harness.Workers``); the
    environment for ``harness.drain``."""
    before = os.environ.get(targets.IDLE_TARGETS_ENV)
    os.environ[targets.IDLE_TARGETS_ENV] = str(count)
    targets.register_idle(count)
    try:
        yield {targets.IDLE_TARGETS_ENV: str(count)}
    finally:
        if before is None:
            os.environ.pop(targets.IDLE_TARGETS_ENV, None)
        else:
            os.environ[targets.IDLE_TARGETS_ENV] = before
        targets.register_idle(targets.idle_count())


def plan_times(plan: str) -> dict[str, float]:
    """The planner's total cost of the top node, and the planning, execution and JIT time
    (ms) of an EXPLAIN ANALYZE (NaN when absent, JIT 0)."""
    found = {}
    for name, pattern in (("cost", r"cost=[\d.]+\.\.([\d.]+)"),
                          ("plan_ms", r"Planning Time: ([\d.]+) ms"),
                          ("exec_ms", r"Execution Time: ([\d.]+) ms"),
                          ("jit_ms", r"Timing:.*Total ([\d.]+) ms")):
        match = re.search(pattern, plan)
        found[name] = float(match.group(1)) if match else (0.0 if name == "jit_ms"
                                                             else float("nan"))
    return found


def shape_idle(o: Options, r: int) -> Metrics:
    out: Metrics = {}
    lat_o = dataclasses.replace(o, lat_n=o.shapes_lat_n)
    plans: dict[int, str] = {}
    for n in turned(list(o.shapes_idle), r):
        with idle_targets(n) as env:
            got = drain(o, "run_fast_lane", targets.AT_LEAST_ONCE, o.shapes_fast_n, 1,
                        f"shapes-idle{n}-fast", lambda: True, env=env)
            out[f"shapes:idle:{n}:fast"] = got["rate"]
            out[f"shapes:idle:{n}:fast:dead"] = got["dead"]
            got_long = drain(o, "run_long_lane", targets.LONG, o.shapes_long_n, 1,
                             f"shapes-idle{n}-long", lambda: True, env=env)
            out[f"shapes:idle:{n}:long"] = got_long["rate"]
            out[f"shapes:idle:{n}:long:dead"] = got_long["dead"]
            print(f"    {n} idle targets per lane: D1 fast {got['rate']:,.0f} jobs/s (drain "
                  f"{got['drain_s']:.1f}s), long {got_long['rate']:,.0f} jobs/s (drain "
                  f"{got_long['drain_s']:.1f}s)", flush=True)
            # At the base level also the fast lane at least once: what the at-most-once
            # mark's durable commit costs a wake-up.
            lanes = ["fast", "long", *(["fast_at_least_once"] if n == o.shapes_idle[0] else [])]
            for lane in lanes:
                p50, p99, missing = latency_run(lat_o, "notify", lane)
                out[f"shapes:idle:{n}:lat_{lane}_p50"] = p50
                out[f"shapes:idle:{n}:lat_{lane}_p99"] = p99
                out[f"shapes:idle:{n}:lat_{lane}:missing"] = missing
            poll, plans[n] = idle_poll(o, n)
            out.update({f"shapes:idle:{n}:{k}": v for k, v in poll.items()})
        print(f"    {n} idle targets per lane: wake-up p50 fast "
              f"{out[f'shapes:idle:{n}:lat_fast_p50']:.2f} ms, long "
              f"{out[f'shapes:idle:{n}:lat_long_p50']:.2f} ms; fast poll "
              f"{poll['poll_ms']:.2f} ms, deep read {poll['deep_ms']:.2f} ms, backlog walk "
              f"{poll['walk_ms']:.2f} ms; the read's "
              f"plan: cost {poll['cost']:,.0f}, planning {poll['plan_ms']:.2f} ms, run "
              f"{poll['exec_ms']:.2f} ms, of which JIT {poll['jit_ms']:.2f} ms", flush=True)
    base = o.shapes_idle[0]
    for n in o.shapes_idle[1:]:
        for what in ("fast", "long", "lat_fast_p50", "lat_long_p50", "poll_ms", "deep_ms",
                     "walk_ms"):
            out[f"shapes:idle:{n}:{what}:ratio"] = (out[f"shapes:idle:{n}:{what}"]
                                                    / out[f"shapes:idle:{base}:{what}"])
    write_idle_plans(o, plans)
    return out


def idle_poll(o: Options, n: int) -> tuple[Metrics, str]:
    """The fast poll with ``n`` idle targets registered, over ``shapes_fast_n`` PENDING rows
    of one target, after ANALYZE: the worker's poll (prepared) and its backlog walk timed,
    and the plans of the poll (its parameters', and the generic one it may keep), of the
    read ``store.jobs_fast_due`` and of the walk."""
    reset()
    fill(targets.AT_LEAST_ONCE, o.shapes_fast_n)
    analyze()
    now = store.db_now()
    limits, _ = fast_limits()
    found = {targets.AT_LEAST_ONCE}
    statements = {
        "read": fast_due_sql(now),
        "poll": fast_poll_sql(now),
        "walk": capture_sql(lambda: backlog_walk(now, found))[-1],
    }
    plans = {name: explain(*statements[name]) for name in statements}
    plans["poll_generic"] = explain_generic(*statements["poll"])
    poll_ms = time_fast_poll(o.shapes_poll_reps, active=[targets.AT_LEAST_ONCE])
    deep_ms = time_fast_poll(o.shapes_poll_reps)
    walk_ms = median_ms(lambda: backlog_walk(now, found), max(3, o.shapes_poll_reps // 4))
    times = {name: plan_times(plan) for name, plan in plans.items()}
    due_sql, due_params = statements["read"]
    sections = [
        ("poll", "the poll as the worker runs it (store.jobs_fast_poll, prepared; it marks "
         "nothing here: its owner holds no partition), planned for its parameters"),
        ("poll_generic", "the same poll, the generic plan its prepared statement may keep "
         "after five runs (PREPARE; plan_cache_mode = force_generic_plan)"),
        ("read", "the read alone (store.jobs_fast_due, _fast_heads_sql)"),
        ("walk", "the backlog walk the worker runs at most once a POLL_S "
         "(store.jobs_fast_due, whole_backlog=True, the targets its poll read nothing of: "
         f"{len(backlog_walk_limits(found))})"),
    ]
    text = (f"\n# {n} idle fast-lane targets (+ {n} long): {len(limits)} fast targets in the "
            f"poll's limits; the read: {len(due_params)} parameters, a text of "
            f"{len(due_sql):,} characters; {o.shapes_fast_n:,} PENDING rows of "
            f"{targets.AT_LEAST_ONCE}, analysed. Timed (median of {o.shapes_poll_reps}): the "
            f"poll between deep reads {poll_ms:.2f} ms, the deep read {deep_ms:.2f} ms, the "
            f"walk {walk_ms:.2f} ms\n\n"
            + "".join(f"  {name}: cost {t['cost']:,.0f}, planning {t['plan_ms']:.2f} ms, "
                      f"execution {t['exec_ms']:.2f} ms, of which JIT {t['jit_ms']:.2f} ms\n"
                      for name, t in times.items()))
    for name, title in sections:
        query, params = statements["poll" if name == "poll_generic" else name]
        text += (f"\n## {title}\n" + ("" if name == "poll_generic" else query + "\n-- params: "
                                       + _params_text(params) + "\n")
                 + "\n" + plans[name] + "\n")
    reset()
    read, poll, generic = times["read"], times["poll"], times["poll_generic"]
    return ({"poll_ms": poll_ms, "deep_ms": deep_ms, "walk_ms": walk_ms, **read,
             "poll_cost": poll["cost"], "poll_jit_ms": poll["jit_ms"],
             "poll_generic_cost": generic["cost"], "poll_generic_jit_ms": generic["jit_ms"],
             "walk_jit_ms": times["walk"]["jit_ms"],
             "seq_scan": float(any(f"Seq Scan on {store.JOBS}" in plan
                                   for plan in plans.values()))}, text)


def _params_text(params: Sequence[Any], keep: int = 12) -> str:
    shown_params = [repr(p) for p in params[:keep]]
    more = f", ... ({len(params) - keep} more)" if len(params) > keep else ""
    return "[" + ", ".join(shown_params) + more + "]"


def write_idle_plans(o: Options, plans: dict[int, str]) -> None:
    o.results_dir.mkdir(parents=True, exist_ok=True)
    path = o.results_dir / EXPLAIN_FILE
    jit = ", ".join(f"{name} {sql(f'SHOW {name}')[0][0]}" for name in (
        "jit", "jit_above_cost", "jit_inline_above_cost", "jit_optimize_above_cost"))
    header = (f"# EXPLAIN (ANALYZE, BUFFERS) of the fast lane's poll with idle targets "
              f"registered, {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC; one "
              f"worker's limits (every registered fast target) over all "
              f"{jobs_settings().PARTITIONS} partitions; the server's {jit}\n")
    path.write_text(header + "".join(plans[n] for n in sorted(plans)))
    print(f"    plans written to {shown(path)}", flush=True)


# -- 2. a web tier -----------------------------------------------------------------------------

RAW_TABLE = "scale_raw"
RAW_CHANNEL = "bench_scale_raw"
# engine_worker: the engine's enqueue while a fast-lane worker serves the rows (an
# at-least-once no-op target it keeps up with, so it sleeps and asks to be woken often).
# engine_prepared: the engine's enqueue with Django's prepared statements on (psycopg's
# own default, which the raw kinds run with).
WEB_KINDS = ("engine", "engine_prepared", "engine_worker", "raw_insert", "raw_insert_notify",
             "raw_insert_notify_1")
WEB_BARRIER_S = 120.0


def raw_params() -> dict[str, Any]:
    """psycopg.connect's arguments for this database (as ``bench/baselines.py``)."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return params


def _web_child(kind: str, barrier: Any, n: int, params: dict[str, Any]) -> None:
    """One process of the web tier: connect and warm up (one row), wait for the others,
    then ``n`` rows, each its own commit."""
    try:
        if kind.startswith("engine"):
            if kind == "engine_prepared":  # this process's connection only: it forked
                options = connection.settings_dict["OPTIONS"]
                connection.settings_dict["OPTIONS"] = {**options, "prepare_threshold": 5}
            target = targets.AT_LEAST_ONCE if kind == "engine_worker" else targets.AT_MOST_ONCE
            enqueue(target, payload(-1))
            barrier.wait(WEB_BARRIER_S)
            for i in range(n):
                enqueue(target, payload(i))
            connections.close_all()
            return
        import psycopg
        from psycopg.types.json import Jsonb

        insert = f"INSERT INTO {RAW_TABLE} (payload) VALUES (%s)"
        with psycopg.connect(**params, autocommit=True) as conn:
            def one(i: int) -> None:
                if kind == "raw_insert":
                    conn.execute(insert, (Jsonb(payload(i)),))
                elif kind == "raw_insert_notify":
                    with conn.transaction():
                        conn.execute(insert, (Jsonb(payload(i)),))
                        conn.execute("SELECT pg_notify(%s, '')", (RAW_CHANNEL,))
                else:  # both in one statement: one round trip, as the engine's enqueue
                    conn.execute(f"WITH i AS ({insert} RETURNING 1) "
                                 "SELECT pg_notify(%s, '') FROM i",
                                 (Jsonb(payload(i)), RAW_CHANNEL))
            one(-1)
            barrier.wait(WEB_BARRIER_S)
            for i in range(n):
                one(i)
    except BaseException:
        barrier.abort()
        raise


def job_ids_taken() -> int:
    return sql(f"SELECT last_value FROM {store.JOBS}_id_seq")[0][0]


def wakeups_asked() -> int:
    return sql("SELECT COALESCE(pg_sequence_last_value('jobs_engine_waits_fast'), 0)")[0][0]


def web_run(o: Options, kind: str, procs: int, per_proc: int) -> tuple[float, int, float]:
    """``procs`` processes of ``kind`` released together; jobs per second of wall time from
    the barrier to the last one joined, how often a worker asked to be woken meanwhile, and
    the share of the machine's CPUs busy meanwhile (a tier bound by the CPU a job costs,
    not by a lock, keeps them all busy). The rows written are checked."""
    reset()
    sql(f"TRUNCATE {RAW_TABLE}")
    with contextlib.suppress(DatabaseError):
        sql("CHECKPOINT")  # each run starts without the last one's dirty pages
    with contextlib.ExitStack() as stack:
        ids_before = job_ids_taken()
        if kind == "engine_worker":
            workers = stack.enter_context(running(Workers(o, "run_fast_lane", 1,
                                                          f"shapes-web-worker-{procs}")))
            wait_for("every partition held", lambda: partitions_balanced(1), workers, 60)
        asked = wakeups_asked()
        watch = DrainWatch()
        rate = _web_rate(kind, procs, per_proc, watch)
        asked = wakeups_asked() - asked
        if kind == "engine_worker":
            wait_for("the rows handled", drained, workers, 120)
    if kind.startswith("engine"):
        stored = job_ids_taken() - ids_before
    else:
        stored = sql(f"SELECT COUNT(*) FROM {RAW_TABLE}")[0][0]
    if stored != procs * (per_proc + 1):
        raise RuntimeError(f"web tier {kind} x{procs}: {stored} rows, expected "
                           f"{procs * (per_proc + 1)}")
    return rate, asked, watch.busy_percent()


def _web_rate(kind: str, procs: int, per_proc: int, watch: DrainWatch) -> float:
    params = raw_params()
    connections.close_all()  # a forked process must not share this one's connection
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(procs + 1)
    children = [ctx.Process(target=_web_child, args=(kind, barrier, per_proc, params),
                            name=f"web-{kind}-{i}") for i in range(procs)]
    for child in children:
        child.start()
    try:
        barrier.wait(WEB_BARRIER_S)
        started = time.perf_counter()
        watch.last = watch.first = cpu_times()
        for child in children:
            child.join(600)
        elapsed = time.perf_counter() - started
        watch.last = cpu_times()
    except threading.BrokenBarrierError as exc:
        raise RuntimeError(f"web tier {kind} x{procs}: a process failed before the start "
                           "(its traceback is above)") from exc
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
                child.join()
    failed = [child.exitcode for child in children if child.exitcode != 0]
    if failed:
        raise RuntimeError(f"web tier {kind} x{procs}: processes exited {failed}")
    return procs * per_proc / elapsed


def shape_web(o: Options, r: int) -> Metrics:
    out: Metrics = {}
    sql(f"DROP TABLE IF EXISTS {RAW_TABLE}")
    sql(f"CREATE TABLE {RAW_TABLE} (id bigserial PRIMARY KEY, payload jsonb NOT NULL, "
        "created_at timestamptz NOT NULL DEFAULT now())")
    try:
        for procs in o.shapes_web_procs:
            per_proc = o.shapes_web_n // procs
            for kind in turned(WEB_KINDS, r):
                rate, asked, busy = web_run(o, kind, procs, per_proc)
                out[f"shapes:web:{kind}:{procs}"] = rate
                out[f"shapes:web:{kind}:{procs}:cpu"] = busy
                if kind == "engine_worker":
                    out[f"shapes:web:asked:{procs}"] = asked
            engine = out[f"shapes:web:engine:{procs}"]
            served = out[f"shapes:web:engine_worker:{procs}"]
            prepared = out[f"shapes:web:engine_prepared:{procs}"]
            for ratio, kind in (("ratio_notify", "raw_insert_notify"),
                                ("ratio_notify_1", "raw_insert_notify_1"),
                                ("ratio_insert", "raw_insert")):
                raw = out[f"shapes:web:{kind}:{procs}"]
                out[f"shapes:web:{ratio}:{procs}"] = engine / raw
                out[f"shapes:web:{ratio}:worker:{procs}"] = served / raw
                out[f"shapes:web:{ratio}:prepared:{procs}"] = prepared / raw
            print(f"    {procs} process(es) x {per_proc:,} commits: " + ", ".join(
                f"{kind} {out[f'shapes:web:{kind}:{procs}']:,.0f}/s" for kind in WEB_KINDS)
                + f"; engine / INSERT+NOTIFY {out[f'shapes:web:ratio_notify:{procs}']:.2f}x, "
                f"prepared {out[f'shapes:web:ratio_notify:prepared:{procs}']:.2f}x, "
                f"with a worker {out[f'shapes:web:ratio_notify:worker:{procs}']:.2f}x (it "
                f"asked to be woken {out[f'shapes:web:asked:{procs}']:,.0f} times)", flush=True)
        base = o.shapes_web_procs[0]
        for procs in o.shapes_web_procs[1:]:
            for kind in WEB_KINDS:
                out[f"shapes:web:{kind}:{procs}:scale"] = (out[f"shapes:web:{kind}:{procs}"]
                                                           / out[f"shapes:web:{kind}:{base}"])
    finally:
        sql(f"DROP TABLE IF EXISTS {RAW_TABLE}")
        reset()
    return out


# -- 3. an old snapshot ------------------------------------------------------------------------

SNAPSHOT_LANES = {  # lane -> (worker command, at-least-once no-op target)
    "fast": ("run_fast_lane", targets.AT_LEAST_ONCE),
    "long": ("run_long_lane", targets.LONG_AT_LEAST_ONCE),
}


@contextlib.contextmanager
def old_snapshot(held: bool) -> Iterator[Any]:
    """Another session holding a snapshot (REPEATABLE READ, its first read taken now and
    kept) while the block runs; nothing when not ``held``. Yields that session's pid."""
    if not held:
        yield None
        return
    import psycopg

    holder = psycopg.connect(**raw_params())
    try:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute(f"SELECT count(*) FROM {store.JOBS}").fetchone()
        yield holder.info.backend_pid
    finally:
        holder.rollback()
        holder.close()


def holds_xmin(pid: int | None) -> bool:
    return pid is not None and bool(sql(
        "SELECT backend_xmin IS NOT NULL FROM pg_stat_activity WHERE pid = %s", [pid])
        [0][0])


def drain_in_place(o: Options, command: str, target: str, n: int, name: str
                   ) -> dict[str, float]:
    """D1 as ``harness.drain`` with one worker, but on the table as it is: ``n`` rows
    committed in one transaction, ANALYZE, one worker spawned, clock from the first
    progress to an empty queue. Nothing is truncated first."""
    if remaining():
        raise RuntimeError(f"{name}: {remaining()} rows left from before")
    dead_before = dead_count()
    fill(target, n)
    analyze()
    # The last row in run order: the cursor the worker is left with once it handed it.
    [last] = sql(f"SELECT next_run_at, id FROM {store.JOBS} WHERE status = 'PENDING' "
                 "AND target = %s ORDER BY priority DESC, next_run_at DESC, id DESC LIMIT 1",
                 [target])
    workers = Workers(o, command, 1, name)
    with running(workers):
        t_zero = time.perf_counter()
        t_first, rem_first, t_end = clock_drain(o, workers, n,
                                                deadline=t_zero + max(180.0, n / 20))
    return {"rate": rem_first / (t_end - t_first) if t_end > t_first else float("nan"),
            "startup_s": t_first - t_zero, "drain_s": t_end - t_first,
            "dead": dead_count() - dead_before, "last": last}


def size_kb(table: str) -> float:
    """``table`` with its indexes on disk, kB."""
    return sql("SELECT pg_total_relation_size(%s::regclass)", [table])[0][0] / 1024


def unremovable(table: str) -> float:
    """VACUUM ``table`` now; the dead row versions it could not remove (what an old
    snapshot keeps: the statistics' n_dead_tup as that VACUUM left it)."""
    sql(f"VACUUM {table}")
    sql("SELECT pg_stat_clear_snapshot()")
    rows = sql("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = %s::regclass",
               [table])
    return float(rows[0][0]) if rows else float("nan")


def vacuum_engine() -> None:
    for table in (store.JOBS, store.DONE_JOBS, store.PARTITIONS, store.WORKERS):
        sql(f"VACUUM ANALYZE {table}")


def snapshot_series(o: Options, lane: str, held: bool, label: str = "shapes",
                    on_drain: Callable[[int, dict[str, float]], None] | None = None
                    ) -> dict[str, Any]:
    """``shapes_xmin_drains`` drains in a row of ``lane``, with an old snapshot ``held`` or
    none; then, the snapshot still held, the lane's statement timed on the empty queue and
    on ``shapes_poll_n`` rows. The table is emptied and vacuumed before, and vacuumed
    after a held series (once the snapshot is released). ``on_drain(i, drain)`` after each
    drain (``bench/peers``' rows)."""
    command, target = SNAPSHOT_LANES[lane]
    series = "held" if held else "none"
    reset()
    vacuum_engine()
    got: dict[str, Any] = {"rates": [], "startup_s": [], "dead": 0.0}
    try:
        with old_snapshot(held) as pid:
            got["xmin_held"] = float(holds_xmin(pid))
            last: tuple[Any, int] | None = None
            for i in range(o.shapes_xmin_drains):
                d = drain_in_place(o, command, target, o.shapes_xmin_n,
                                   f"{label}-xmin-{lane}-{series}-{i + 1}")
                got["rates"].append(d["rate"])
                got["startup_s"].append(d["startup_s"])
                got["dead"] += d["dead"]
                last = d["last"]
                if on_drain:
                    on_drain(i + 1, d)
            got["xmin_held_after"] = float(holds_xmin(pid))
            got["size_jobs"] = size_kb(store.JOBS)
            assert last is not None
            at, last_id = last
            band_from = at - store.CURSOR_LAG

            def poll() -> float:  # as the worker polls after the drains: from its cursor
                if lane == "fast":
                    return time_fast_poll(o.shapes_poll_reps,
                                          {target: store.Cursor(band_from, at, last_id)},
                                          active=[target])
                return time_long_reserve_from(o.shapes_poll_reps,
                                              store.LongCursor(0, band_from, at, last_id))

            def deep() -> float:  # once a POLL_S: every target from its first due row
                return (time_fast_poll if lane == "fast" else time_long_reserve)(
                    o.shapes_poll_reps)

            got["poll_empty"], got["deep_empty"] = poll(), deep()
            fill(target, o.shapes_poll_n)
            analyze()
            # The deep read first: the long reserve from the cursor takes the rows it reads.
            got["deep_rows"], got["poll_rows"] = deep(), poll()
            got["unremovable_jobs"] = unremovable(store.JOBS)
            got["unremovable_partitions"] = unremovable(store.PARTITIONS)
    finally:
        reset()
        if held:
            vacuum_engine()
    return got


def shape_snapshot(o: Options, r: int) -> Metrics:
    out: Metrics = {}
    for lane in SNAPSHOT_LANES:
        for held in turned([False, True], r):
            series = "held" if held else "none"
            got = snapshot_series(o, lane, held)
            key = f"shapes:xmin:{lane}:{series}"
            for i, rate in enumerate(got["rates"], 1):
                out[f"{key}:{i}"] = rate
            for name in ("poll_empty", "poll_rows", "deep_empty", "deep_rows", "size_jobs",
                         "unremovable_jobs", "unremovable_partitions"):
                out[f"{key}:{name}"] = got[name]
            out[f"{key}:dead"] = got["dead"]
            if held:
                out[f"{key}:xmin:missing"] = float(not (got["xmin_held"]
                                                        and got["xmin_held_after"]))
            print(f"    {lane} lane, old snapshot {series}: drains "
                  + ", ".join(f"{rate:,.0f}" for rate in got["rates"])
                  + f" jobs/s; then {'poll' if lane == 'fast' else 'reserve'} "
                  f"{got['poll_empty']:.2f} ms empty, {got['poll_rows']:.2f} ms at "
                  f"{o.shapes_poll_n:,} rows (from the first row, once a POLL_S: "
                  f"{got['deep_empty']:.2f}, {got['deep_rows']:.2f}); jobs table "
                  f"{got['size_jobs']:,.0f} kB; dead row "
                  f"versions VACUUM could not remove: jobs {got['unremovable_jobs']:,.0f}, "
                  f"partitions {got['unremovable_partitions']:,.0f}", flush=True)
        for i in range(1, o.shapes_xmin_drains + 1):
            out[f"shapes:xmin:{lane}:ratio:{i}"] = (out[f"shapes:xmin:{lane}:held:{i}"]
                                                    / out[f"shapes:xmin:{lane}:none:{i}"])
        for name in ("poll_empty", "poll_rows", "deep_empty", "deep_rows"):
            out[f"shapes:xmin:{lane}:{name}:ratio"] = (out[f"shapes:xmin:{lane}:held:{name}"]
                                                       / out[f"shapes:xmin:{lane}:none:{name}"])
    return out
