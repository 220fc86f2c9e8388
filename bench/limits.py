"""The ``limits`` phase: what a target's limits (``jobs_engine.limits``) cost the long lane,
each against the same work without limits in the same round.

1. A limit that never binds. ``limits_n`` pre-enqueued no-op jobs drained by
   ``limits_workers`` (3) ``run_long_lane`` processes, of ``bench.limits.free`` (no
   limits) and of ``bench.limits.loose`` (``Concurrency(10_000)`` for the target, which a
   worker's at most ``LONG_BATCH * LONG_PREFETCH`` rows never reach), and of
   ``bench.limits.loose_keyed`` (the same per payload field ``k``, the rows spread over
   ``limits_keys`` keys); then ``limits_wait_n`` jobs of the 20 ms handler, free and loose.
   The order of the series turns by round. Ratios: limited / free of the same round.
2. A limit that binds. ``limits_tight_n`` jobs of ``bench.limits.tight`` (20 ms handler,
   ``Concurrency(2)``) drained by ``limits_tight_workers`` (4) workers, more than its
   slots: the rate, and the database's CPU per admitted job (``DbWatch``: the CPU time of
   the database's backends serving this database, ``/proc/<pid>/schedstat``, the bench's
   own session left out) against the same work with as many running at once and no limit
   (``bench.limits.free_wait``, one worker with ``JOBS_LONG_BATCH=2``). The workers count
   their own statements (``bench/sqlcount.py``): statements, and admission statements,
   per job; and the most rows of the target seen RUNNING at once.
3. The admission's poll against the backlog (in this process, ``jobs_long_reserve_limited``
   as an idle worker calls it, median of ``limits_poll_reps`` after warming), at
   ``limits_poll_small`` and ``limits_poll_big`` PENDING rows of the target (built with
   ``generate_series``, ``limit_key = ''``): ``bench.limits.tight`` with its two slots
   held by RUNNING rows (nothing admitted) and with them free (two admitted, put back
   untimed after each call); ``bench.limits.tight_keyed`` (2 per key) with one key holding
   the whole backlog and its slots full, and another key one row, which must be
   admitted. Beside them the rest of that worker's empty poll: the free targets' reserve
   (``jobs_long_reserve``, the worker's other long targets) and the look for the next
   due row (``jobs_long_next_due``). Ratios: big / small. The plans at the big backlog go
   to ``<results>/explain_limits.txt``.

Import after ``django.setup()``; ``bench/run.py --only limits`` (PostgreSQL).
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.db import connection, transaction

from bench import targets
from bench.harness import (
    DrainWatch,
    Metrics,
    Options,
    Workers,
    dead_count,
    drained,
    payload,
    remaining,
    reset,
    running,
    shown,
    sql,
    wait_for,
    workers_registered,
)
from bench.poll_cost import INSERT_COLUMNS, capture_sql, explain
from bench.shapes import turned
from bench.sqlcount import ADMISSION_PREFIX, COUNT_ENV, kind_of, read_counts
from jobs_engine import registry, store
from jobs_engine.conf import jobs_settings
from jobs_engine.enqueueing import enqueue_many
from jobs_engine.registry import Target
from jobs_engine.states import Lane

EXPLAIN_FILE = "explain_limits.txt"
POLL_OWNER = "bench-limits"
HOLDER = "bench-limits-holder"  # the RUNNING rows that hold the slots in the poll's layouts
HOT_KEY, COLD_KEY = "hot", "cold"
WARM = 5  # untimed calls before a statement is timed
WAIT_BATCH = 2  # the free reference of the binding case: one worker, this many threads

_round = 0


def phase_limits(o: Options) -> Metrics:
    global _round
    r, _round = _round, _round + 1
    if not store.is_postgres():
        raise RuntimeError("the limits phase needs PostgreSQL (DATABASE_URL=postgres://...)")
    out: Metrics = {}
    with limits_registered():
        for name, part in (("non-binding", part_loose), ("binding", part_tight),
                           ("admission poll", part_poll)):
            started = time.perf_counter()
            out.update(part(o, r))
            print(f"    limits {name} done in {time.perf_counter() - started:.1f}s", flush=True)
    reset()
    return out


@contextlib.contextmanager
def limits_registered() -> Iterator[None]:
    """Every limits target registered in this process (its enqueues store each row's
    ``limit_key`` by them) while the phase runs, and none after: another phase's
    statements must not name them."""
    targets.register_limits(list(targets.limits_specs()))
    try:
        yield
    finally:
        targets.unregister_limits()


def fill_limits(target: str, n: int, keys: int = 1, chunk: int = 500) -> None:
    """``n`` jobs of ``target`` committed in one transaction, each payload with a field
    ``k`` (one of ``keys``: the key of ``loose_keyed``; every series carries it, so the
    payloads are the same size), and the table ANALYZEd in that transaction (its own rows
    count): the running workers see the rows and their statistics at once. Without it
    the first admissions were planned on the statistics of the table emptied before, and
    the first admission of the per-key target took up to 20 s in one round and a second
    in the next (the free reserve reads its index in order whatever they say)."""
    with transaction.atomic():
        for start in range(0, n, chunk):
            enqueue_many([{"target": target,
                           "payload": {**payload(i), targets.LIMITS_KEY_FIELD: i % keys}}
                          for i in range(start, min(n, start + chunk))])
        sql(f"ANALYZE {store.JOBS}")


# -- the database's CPU and the workers' statements during a drain -----------------------------


def backend_cpu_ns(pid: int) -> int | None:
    """CPU time of process ``pid`` so far, ns (``/proc/<pid>/schedstat``'s run time; its
    ``stat`` ticks where there is no schedstat); None when it is gone or not visible."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * 10_000_000  # utime + stime, 100 Hz
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class DbWatch(DrainWatch):
    """``DrainWatch`` and, at each probe of the drain clock (from the first progress to
    the empty queue): the CPU time of every client backend of this database but the
    bench's own (a backend first seen after the first probe counts from 0: it was made
    during the drain), the statements the workers counted (``count_dir``), and the most
    RUNNING rows of ``target`` seen at once."""

    count_dir: Path | None = None
    target: str = ""
    cpu_first: dict[int, int] = field(default_factory=dict)
    cpu_last: dict[int, int] = field(default_factory=dict)
    counts_first: tuple[Counter[str], Counter[str]] | None = None
    counts_last: tuple[Counter[str], Counter[str]] = field(
        default_factory=lambda: (Counter(), Counter()))
    running_max: int = 0
    samples: int = 0
    backends_lost: int = 0  # backends that exited during the drain (their last reading kept)

    def sample(self) -> None:
        super().sample()
        seen = set()
        for (pid,) in sql("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                          "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"):
            ns = backend_cpu_ns(pid)
            if ns is None:
                continue
            seen.add(pid)
            self.cpu_first.setdefault(pid, ns if self.samples == 0 else 0)
            self.cpu_last[pid] = ns
        self.backends_lost = len(set(self.cpu_last) - seen)
        if self.count_dir is not None:
            counts = read_counts(self.count_dir)
            if self.counts_first is None:
                self.counts_first = counts
            self.counts_last = counts
        if self.target:
            running = sql(f"SELECT count(*) FROM {store.JOBS} WHERE status = 'RUNNING' "
                          "AND target = %s", [self.target])[0][0]
            self.running_max = max(self.running_max, running)
        self.samples += 1

    def cpu_s(self) -> float:
        return sum(self.cpu_last[pid] - first for pid, first in self.cpu_first.items()) / 1e9

    def statements(self) -> tuple[Counter[str], Counter[str]]:
        """The workers' statements during the drain by kind: counts, and seconds waited."""
        first = self.counts_first or (Counter(), Counter())
        out = []
        for last, before in zip(self.counts_last, first, strict=True):
            diff = Counter(last)
            diff.subtract(before)
            out.append(+diff)
        return out[0], out[1]


def limits_drain(o: Options, target: str, n: int, count: int, name: str, env: dict[str, str],
                 filler: Callable[[], None], watch: DrainWatch) -> dict[str, float]:
    """D1 as ``harness.drain`` with several workers, for any count: the workers start and
    register, then the ``n`` rows are committed in one transaction; clock from the first
    progress to an empty queue, or to ``limits_cap_s`` after the first progress when the
    queue is not empty by then (a drain too slow to finish in the phase's time: its rate
    is the rows drained meanwhile, and ``left`` says how many were not)."""
    reset()
    workers = Workers(o, "run_long_lane", count, name, env)
    with running(workers):
        wait_for("every worker registered", lambda: workers_registered(count), workers, 90)
        t_zero = time.perf_counter()
        filler()
        while (left := remaining()) >= n:
            if time.perf_counter() - t_zero > 120:
                raise TimeoutError(f"{name}: no progress in 120 s")
            workers.check()
            time.sleep(o.drain_poll_s)
        t_first, rem_first = time.perf_counter(), left
        watch.sample()
        while True:
            empty = drained()
            now = time.perf_counter()
            watch.sample()
            if empty or now - t_first >= o.limits_cap_s:
                break
            workers.check()
            time.sleep(o.drain_poll_s)
        t_end = now
        left = 0 if empty else remaining()
    return {"rate": (rem_first - left) / (t_end - t_first) if t_end > t_first else float("nan"),
            "startup_s": t_first - t_zero, "drain_s": t_end - t_first, "dead": dead_count(),
            "left": left}


def measured_drain(o: Options, target: str, n: int, count: int, name: str,
                   env: dict[str, str], filler: Callable[[], None],
                   running_of: str = "") -> dict[str, Any]:
    """``limits_drain`` by ``count`` ``run_long_lane`` workers with a ``DbWatch``: the
    rate, the machine's CPUs busy, the database's CPU per job (µs), the workers'
    statements per job, their admission statements per job and the time they waited
    for them."""
    with tempfile.TemporaryDirectory(prefix="bench-sqlcount-") as counts:
        watch = DbWatch(count_dir=Path(counts), target=running_of)
        got = limits_drain(o, target, n, count, name, {**env, COUNT_ENV: counts}, filler,
                           watch)
    jobs = got["rate"] * got["drain_s"]  # the rows drained from the first progress on
    statements, seconds = watch.statements()
    admission = sum(v for kind, v in statements.items() if kind.startswith(ADMISSION_PREFIX))
    admission_s = sum(v for kind, v in seconds.items() if kind.startswith(ADMISSION_PREFIX))

    def per_job(value: float) -> float:
        return value / jobs if jobs else float("nan")

    return {**got, "jobs": jobs, "busy": watch.busy_percent(), "lock": watch.share("Lock"),
            "waits": watch.summary().split("; ", 1)[-1],
            "cpu_us": per_job(watch.cpu_s() * 1e6),
            "stmts": per_job(sum(statements.values())), "admission": per_job(admission),
            "admission_ms": per_job(admission_s * 1000),
            "statements": statements, "seconds": seconds, "running_max": watch.running_max,
            "lost": watch.backends_lost}


def said(got: dict[str, Any]) -> str:
    capped = (f", STOPPED after {got['drain_s']:.0f}s with {got['left']:,.0f} rows left"
              if got["left"] else "")
    return (f"{got['rate']:,.0f} jobs/s (drain {got['drain_s']:.2f}s, start-up "
            f"{got['startup_s']:.2f}s, dead {got['dead']:.0f}{capped}); database CPU "
            f"{got['cpu_us']:,.0f} µs/job, {got['stmts']:.2f} statements/job of which "
            f"admission {got['admission']:.2f} ({got['admission_ms']:.3f} ms/job waited in the "
            f"workers); machine CPU busy {got['busy']:.0f}%; {got['waits']}")


def statements_line(got: dict[str, Any]) -> str:
    """The workers' statements per job by kind, with the ms per job they waited for them."""
    jobs = got["jobs"] or float("nan")
    return ", ".join(f"{kind} {count / jobs:.2f} ({got['seconds'][kind] * 1000 / jobs:.3f} ms)"
                     for kind, count in got["statements"].most_common(9))


# -- 1. a limit that never binds ---------------------------------------------------------------


def part_loose(o: Options, r: int) -> Metrics:
    out: Metrics = {}
    series = [
        ("noop", o.limits_n, [("free", targets.LIMITS_FREE, 1),
                              ("loose", targets.LIMITS_LOOSE, 1),
                              ("keyed", targets.LIMITS_LOOSE_KEYED, o.limits_keys)]),
        ("wait", o.limits_wait_n, [("free", targets.LIMITS_FREE_WAIT, 1),
                                   ("loose", targets.LIMITS_LOOSE_WAIT, 1)]),
    ]
    count = o.limits_workers
    for kind, n, sides in series:
        if n <= 0:
            continue
        for side, target, keys in turned(sides, r):
            limited = () if side == "free" else (target,)
            got = measured_drain(
                o, target, n, count, f"limits-{kind}-{side}-{count}w",
                targets.limits_env(*limited),
                lambda t=target, m=n, k=keys: fill_limits(t, m, k))
            key = f"limits:nb:{kind}:{side}"
            for name in ("rate", "cpu_us", "stmts", "admission", "admission_ms", "busy",
                         "lock", "dead", "left"):
                out[f"{key}:{name}"] = got[name]
            print(f"    {kind} {side} ({target}, {count} workers, {n:,} jobs"
                  f"{f', {keys:,} keys' if keys > 1 else ''}): {said(got)}", flush=True)
            print(f"      statements/job: {statements_line(got)}", flush=True)
        free = out[f"limits:nb:{kind}:free:rate"]
        for side, _, _ in sides[1:]:
            out[f"limits:nb:{kind}:{side}:ratio"] = out[f"limits:nb:{kind}:{side}:rate"] / free
            out[f"limits:nb:{kind}:{side}:cpu_ratio"] = (
                out[f"limits:nb:{kind}:{side}:cpu_us"] / out[f"limits:nb:{kind}:free:cpu_us"])
            print(f"    {kind} {side} / free: {out[f'limits:nb:{kind}:{side}:ratio']:.2f}x "
                  f"jobs/s, {out[f'limits:nb:{kind}:{side}:cpu_ratio']:.2f}x database CPU/job",
                  flush=True)
    return out


# -- 2. a limit that binds ---------------------------------------------------------------------


def part_tight(o: Options, r: int) -> Metrics:
    out: Metrics = {}
    n = o.limits_tight_n
    if n <= 0:
        return out
    sides = [
        ("free", targets.LIMITS_FREE_WAIT, 1, {"JOBS_LONG_BATCH": str(WAIT_BATCH)}),
        ("tight", targets.LIMITS_TIGHT, o.limits_tight_workers,
         targets.limits_env(targets.LIMITS_TIGHT)),
    ]
    for side, target, count, env in turned(sides, r):
        got = measured_drain(o, target, n, count, f"limits-bind-{side}-{count}w",
                             {**targets.limits_env(), **env},
                             lambda t=target: fill_limits(t, n), running_of=target)
        key = f"limits:bind:{side}"
        for name in ("rate", "cpu_us", "stmts", "admission", "admission_ms", "busy", "lock",
                     "dead", "left", "running_max", "lost"):
            out[f"{key}:{name}"] = got[name]
        print(f"    binding, {side} ({target}, {count} worker(s), {n:,} jobs): {said(got)}; "
              f"at most {got['running_max']} RUNNING at once seen", flush=True)
        print(f"      statements/job: {statements_line(got)}", flush=True)
    out["limits:bind:cpu_ratio"] = out["limits:bind:tight:cpu_us"] / out["limits:bind:free:cpu_us"]
    out["limits:bind:rate_ratio"] = out["limits:bind:tight:rate"] / out["limits:bind:free:rate"]
    out["limits:bind:stmts_ratio"] = (out["limits:bind:tight:stmts"]
                                      / out["limits:bind:free:stmts"])
    print(f"    binding tight / free: database CPU per job {out['limits:bind:cpu_ratio']:.2f}x, "
          f"jobs/s {out['limits:bind:rate_ratio']:.2f}x, statements per job "
          f"{out['limits:bind:stmts_ratio']:.2f}x", flush=True)
    return out


# -- 3. the admission's poll against the backlog -----------------------------------------------


def insert_rows(target: str, n: int, limit_key: str, status: str = "PENDING",
                tag: str = "") -> None:
    """``n`` rows of ``target`` with ``limit_key`` in one INSERT ... SELECT; due an hour
    ago, in id order. RUNNING rows are held by ``HOLDER`` under a lease an hour long."""
    running = status == "RUNNING"
    sql(f"INSERT INTO {store.JOBS} ({INSERT_COLUMNS}, limit_key, claimed_by, claim_token, "
        "lease_until, started_at) SELECT %s, %s, 'long', NULL, g %% 64, 0, "
        "jsonb_build_object('i', g, 'msg', 'hello world'), '{}'::jsonb, "
        "%s || g, %s, 'at_most_once', 0, "
        "now() - interval '1 hour' + g * interval '1 microsecond', '', '', now(), now(), %s, "
        f"{'%s, %s, now() + interval %s, now()' if running else 'NULL, NULL, NULL, NULL'} "
        "FROM generate_series(0, %s - 1) AS g",
        [target, target, f"lim-{target}-{limit_key}-{status}{tag}-", status, limit_key,
         *([HOLDER, "h" * 32, "1 hour"] if running else []), n])


def hold(target: str, limit_key: str, slots: int) -> None:
    insert_rows(target, slots, limit_key, "RUNNING")


def release_holders(target: str) -> None:
    sql(f"DELETE FROM {store.JOBS} WHERE target = %s AND claimed_by = %s", [target, HOLDER])


def poll_layout(n: int) -> float:
    """``n`` PENDING rows of the tight target (``limit_key ''``) with its slots held, and
    ``n`` of the tight keyed target's key ``hot`` with that key's slots held, then one row
    of its key ``cold``; VACUUM ANALYZE. Seconds it took."""
    started = time.perf_counter()
    reset()
    insert_rows(targets.LIMITS_TIGHT, n, "")
    hold(targets.LIMITS_TIGHT, "", targets.TIGHT_SLOTS)
    insert_rows(targets.LIMITS_TIGHT_KEYED, n, HOT_KEY)
    hold(targets.LIMITS_TIGHT_KEYED, HOT_KEY, targets.TIGHT_SLOTS)
    insert_rows(targets.LIMITS_TIGHT_KEYED, 1, COLD_KEY)
    sql(f"VACUUM ANALYZE {store.JOBS}")
    return time.perf_counter() - started


def worker_targets(limited: str) -> tuple[list[Target], list[str], list[str], list[str]]:
    """What a worker that registers the free limits targets and ``limited`` passes its
    statements: its limited targets, its free long targets' names, the exclusive ones, and
    every long target's name (registered in this process: the bench's targets, which every
    worker has, and the limits phase's)."""
    skip = {name for name in targets.limits_specs()
            if name not in (*targets.LIMITS_FREE_NAMES, limited)}
    skip |= {targets.kafka_target(kind) for kind in targets.KAFKA_TOPICS}
    skip |= {t.name for t in registry.all_targets() if t.name.startswith(targets.IDLE_PREFIX)}
    mine = [t for t in registry.lane_targets(Lane.LONG) if t.name not in skip]
    return ([t for t in mine if t.limits], sorted(t.name for t in mine if not t.limits),
            sorted(t.name for t in mine if t.exclusive), sorted(t.name for t in mine))


def admit(limited: Sequence[Target], now: datetime) -> store.Admitted:
    """The admission as an idle worker's poll runs it (``LongLane.run_once``): its free
    slots (``LONG_BATCH``: no handler timed yet), all idle threads, in autocommit."""
    settings = jobs_settings()
    return store.jobs_long_reserve_limited(
        POLL_OWNER, uuid.uuid4().hex, now, settings.LONG_LEASE_S, settings.LONG_BATCH,
        targets=limited, start=True, at_most_once_limit=settings.LONG_BATCH,
        rated_limit=settings.LONG_BATCH)


def put_back(ids: Sequence[int | None]) -> None:
    if ids:
        sql(f"UPDATE {store.JOBS} SET status = 'PENDING', claim_token = NULL, claimed_by = NULL, "
            "lease_until = NULL, running_code = NULL, started_at = NULL WHERE id = ANY(%s)",
            [list(ids)])


@dataclass
class Timed:
    ms: float
    admitted: list[int]  # rows admitted per call (each call's, all the same when right)
    statements: list[tuple[str, Any]]
    per_kind: dict[str, float] = field(default_factory=dict)  # mean ms per call, by kind
    cpu_us: float = float("nan")  # mean CPU time of this session's backend per call
    cpu_kind: dict[str, float] = field(default_factory=dict)  # of it, µs per call by kind


class BackendCpu:
    """The CPU time this process's database session spends in each call timed: its
    backend's ``/proc/<pid>/schedstat`` read before and after the call (the backend is
    waiting for the next statement by then)."""

    def __init__(self) -> None:
        self.pid = sql("SELECT pg_backend_pid()")[0][0]
        self.spent_ns = 0
        self.calls = 0

    @contextlib.contextmanager
    def call(self, counted: bool) -> Iterator[None]:
        before = backend_cpu_ns(self.pid)
        yield
        after = backend_cpu_ns(self.pid)
        if counted and before is not None and after is not None:
            self.spent_ns += after - before
            self.calls += 1

    def mean_us(self) -> float:
        return self.spent_ns / self.calls / 1000 if self.calls else float("nan")


def spread(reps: int, budget_s: float, warm: int = WARM) -> Iterator[bool]:
    """``warm`` untimed calls then ``reps`` timed ones (yields whether to time it), fewer
    when they take longer than ``budget_s`` in all (at least 1 untimed and 5 timed): a
    statement that takes seconds at the big backlog is not run hundreds of times."""
    started = time.perf_counter()
    for i in range(warm):
        if i and time.perf_counter() - started > budget_s / 4:
            break
        yield False
    started = time.perf_counter()
    for i in range(reps):
        if i >= 5 and time.perf_counter() - started > budget_s:
            break
        yield True


def time_admission(limited: Sequence[Target], reps: int, budget_s: float) -> Timed:
    """Median ms of the admission over ``reps`` calls after ``warm`` untimed ones; the rows
    it admitted are put back after each call, untimed. The mean ms per call of each kind
    of statement (``sqlcount.kind_of``; the rest: BEGIN, COMMIT and Python), and the
    statements of one call."""
    now = store.db_now()
    admitted: list[int] = []
    times: list[float] = []
    spent: Counter[str] = Counter()
    spent_cpu: Counter[str] = Counter()
    cpu = BackendCpu()

    def timing(execute: Any, query: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        cpu_before = backend_cpu_ns(cpu.pid) or 0
        try:
            return execute(query, params, many, context)
        finally:
            spent[kind_of(query)] += time.perf_counter() - started
            spent_cpu[kind_of(query)] += (backend_cpu_ns(cpu.pid) or 0) - cpu_before

    warming = True
    for timed in spread(reps, budget_s):
        if timed and warming:
            spent.clear()
            spent_cpu.clear()
            warming = False
        with connection.execute_wrapper(timing), cpu.call(timed):
            started = time.perf_counter()
            got = admit(limited, now)
            elapsed = (time.perf_counter() - started) * 1000
        put_back([row.job.id for row in got.rows])
        if timed:
            times.append(elapsed)
            admitted.append(len(got.rows))
    statements: list[tuple[str, Any]] = []

    def once() -> None:
        put_back([row.job.id for row in admit(limited, now).rows])

    statements = capture_sql(once)
    per_kind = {kind: seconds * 1000 / len(times) for kind, seconds in spent.most_common()}
    per_kind["the rest (BEGIN, COMMIT, Python)"] = statistics.mean(times) - sum(per_kind.values())
    cpu_kind = {kind: ns / 1000 / len(times) for kind, ns in spent_cpu.most_common()}
    cpu_kind["the rest (BEGIN, COMMIT)"] = cpu.mean_us() - sum(cpu_kind.values())
    return Timed(statistics.median(times), admitted, statements, per_kind, cpu.mean_us(),
                 cpu_kind)


def time_call(call: Callable[[], Any], reps: int, budget_s: float,
              cleanup: Callable[[Any], None] | None = None) -> tuple[float, float]:
    """Median ms of ``call`` and the mean CPU µs of this session's backend per call;
    ``cleanup`` gets each call's answer, untimed."""
    times = []
    cpu = BackendCpu()
    for timed in spread(reps, budget_s):
        with cpu.call(timed):
            started = time.perf_counter()
            got = call()
            elapsed = (time.perf_counter() - started) * 1000
        if cleanup is not None:
            cleanup(got)
        if timed:
            times.append(elapsed)
    return statistics.median(times), cpu.mean_us()


@dataclass
class WorkerPoll:
    """The rest of an idle worker's poll after an admission that took nothing, as
    ``LongLane.run_once`` runs it: the free targets' reserve (from the first row, once a
    ``POLL_S``; the free targets have no rows here), then the look for the next due row."""

    free_names: list[str]
    exclusive: list[str]
    names: list[str]
    now: datetime

    def free_reserve(self) -> list[int | None]:
        settings = jobs_settings()
        got = store.jobs_long_reserve(
            POLL_OWNER, uuid.uuid4().hex, self.now, settings.LONG_LEASE_S, settings.LONG_BATCH,
            exclusive_targets=self.exclusive, targets=self.free_names, start=True,
            at_most_once_limit=settings.LONG_BATCH,
            flush_lazily=settings.LAZY_FLUSH_AT_LEAST_ONCE, after=None, likely=())
        return [row.job.id for row in got]

    def next_due(self) -> None:
        store.jobs_long_next_due(self.names, self.now)


def poll_at(o: Options, size: str, n: int, out: Metrics, plan: bool) -> str | None:
    """The admission's cases and the rest of the worker's poll timed over a layout of ``n``
    rows (``poll_layout``), into ``out``; their plans when ``plan``."""
    tight, free_names, exclusive, names = worker_targets(targets.LIMITS_TIGHT)
    keyed, _, _, _ = worker_targets(targets.LIMITS_TIGHT_KEYED)
    built = poll_layout(n)
    # The slots held: nothing admitted; the rest of that worker's empty poll.
    reps, budget = o.limits_poll_reps, o.limits_poll_budget_s
    held = time_admission(tight, reps, budget)
    keyed_got = time_admission(keyed, reps, budget)
    rest = WorkerPoll(free_names, exclusive, names, store.db_now())
    reserve_ms, reserve_cpu = time_call(rest.free_reserve, reps, budget, put_back)
    next_due_ms, next_due_cpu = time_call(rest.next_due, reps, budget)
    reserve_sql = capture_sql(lambda: put_back(rest.free_reserve()))
    next_due_sql = capture_sql(rest.next_due)
    release_holders(targets.LIMITS_TIGHT)
    free = time_admission(tight, reps, budget)
    for case, timed in (("held", held), ("free", free), ("keyed", keyed_got)):
        out[f"limits:poll:{case}:{size}"] = timed.ms
        out[f"limits:poll:{case}:{size}:calls"] = len(timed.admitted)
        out[f"limits:poll:{case}:{size}:cpu_us"] = timed.cpu_us
        out[f"limits:poll:{case}:{size}:admitted"] = statistics.median(timed.admitted)
        for kind, ms in timed.per_kind.items():
            out[f"limits:poll:{case}:{size}:kind:{kind}"] = ms
        for kind, us in timed.cpu_kind.items():
            out[f"limits:poll:{case}:{size}:cpu_kind:{kind}"] = us
    out[f"limits:poll:reserve:{size}"] = reserve_ms
    out[f"limits:poll:next_due:{size}"] = next_due_ms
    out[f"limits:poll:empty:{size}"] = held.ms + reserve_ms + next_due_ms
    out[f"limits:poll:reserve:{size}:cpu_us"] = reserve_cpu
    out[f"limits:poll:next_due:{size}:cpu_us"] = next_due_cpu
    out[f"limits:poll:empty:{size}:cpu_us"] = held.cpu_us + reserve_cpu + next_due_cpu
    wrong = [case for case, bad in (
        ("held", any(held.admitted)),
        ("free", any(a != targets.TIGHT_SLOTS for a in free.admitted)),
        ("keyed", any(a != 1 for a in keyed_got.admitted))) if bad]
    out[f"limits:poll:{size}:wrong"] = float(len(wrong))
    print(f"    admission at {n:,} PENDING (built in {built:.1f}s): slots held "
          f"{held.ms:.3f} ms (admitted {max(held.admitted)}), slots free {free.ms:.3f} ms "
          f"(admitted {min(free.admitted)}-{max(free.admitted)}), one key full and one "
          f"free {keyed_got.ms:.3f} ms (admitted {min(keyed_got.admitted)}-"
          f"{max(keyed_got.admitted)}); the free reserve {reserve_ms:.3f} ms, the next "
          f"due row {next_due_ms:.3f} ms" + (f"; WRONG {wrong}" if wrong else ""), flush=True)
    print(f"      the database's CPU per call, µs: slots held {held.cpu_us:,.0f}, slots free "
          f"{free.cpu_us:,.0f}, one key full and one free {keyed_got.cpu_us:,.0f}, the free "
          f"reserve {reserve_cpu:,.0f}, the next due row {next_due_cpu:,.0f}", flush=True)
    for case, timed in (("slots held", held), ("slots free", free),
                        ("one key full, one free", keyed_got)):
        print(f"      {case}, mean ms per call: " + ", ".join(
            f"{kind} {ms:.3f}" for kind, ms in timed.per_kind.items()), flush=True)
        print(f"      {case}, the database's CPU µs per call: " + ", ".join(
            f"{kind} {us:,.0f}" for kind, us in timed.cpu_kind.items()), flush=True)
    if not plan:
        return None
    return poll_plans(n, held, free, keyed_got, reserve_sql, next_due_sql)


POLL_CASES = ("held", "free", "keyed", "reserve", "next_due", "empty")
DUE_KEYS, ADMIT = "limits: due keys", "limits: admit"  # sqlcount.KINDS


def part_poll(o: Options, r: int) -> Metrics:
    out: Metrics = {}
    if r >= o.limits_poll_rounds:
        print(f"    (the admission's poll runs in the first {o.limits_poll_rounds} round(s))",
              flush=True)
        return out
    plans: list[str] = []
    for size, n in turned([("small", o.limits_poll_small), ("big", o.limits_poll_big)], r):
        plan = poll_at(o, size, n, out, plan=size == "big" and r == 0)
        if plan:
            plans.append(plan)
    for case in POLL_CASES:
        out[f"limits:poll:{case}:ratio"] = (out[f"limits:poll:{case}:big"]
                                            / out[f"limits:poll:{case}:small"])
        for unit in ("cpu_us",):
            out[f"limits:poll:{case}:{unit}:ratio"] = (out[f"limits:poll:{case}:big:{unit}"]
                                                       / out[f"limits:poll:{case}:small:{unit}"])
    # The statements by kind, big / small: the key skip scan, and the admission's call (the
    # buckets locked, the running rows counted, the take, the buckets written).
    for case in ("held", "free", "keyed"):
        for kind, name in ((DUE_KEYS, "due_keys"), (ADMIT, "admit")):
            small = out.get(f"limits:poll:{case}:small:kind:{kind}")
            big = out.get(f"limits:poll:{case}:big:kind:{kind}")
            if small and big:
                out[f"limits:poll:{case}:{name}:small"] = small
                out[f"limits:poll:{case}:{name}:big"] = big
                out[f"limits:poll:{case}:{name}:ratio"] = big / small
    print("    big / small: " + ", ".join(f"{case} {out[f'limits:poll:{case}:ratio']:.2f}x"
                                          for case in POLL_CASES), flush=True)
    write_plans(o, plans)
    reset()
    return out


def of_kind(statements: list[tuple[str, Any]], piece: str) -> tuple[str, Any] | None:
    return next(((q, p) for q, p in statements if piece in q), None)


def poll_plans(n: int, held: Timed, free: Timed, keyed: Timed,
               reserve_sql: list[tuple[str, Any]], next_due_sql: list[tuple[str, Any]]) -> str:
    """The plans of the big layout: the key skip scan and the RUNNING count (slots held),
    the take (slots free; one key full and one free), the free reserve and the next due
    row, each with its statement and parameters."""
    parts = [f"# {datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC, {n:,} PENDING rows of "
             f"{targets.LIMITS_TIGHT} (limit_key '', its {targets.TIGHT_SLOTS} slots held by "
             f"RUNNING rows) and of {targets.LIMITS_TIGHT_KEYED} (key '{HOT_KEY}', its slots "
             f"held; key '{COLD_KEY}' one row), after VACUUM ANALYZE; each statement as "
             "jobs_long_reserve_limited / the lane runs it, EXPLAIN (ANALYZE, BUFFERS) in a "
             "rolled-back transaction\n"]
    wanted = [
        ("the key skip scan (_due_keys), slots held: nothing admitted", held.statements,
         "WITH RECURSIVE keys"),
        ("the RUNNING rows per key (_running), slots held", held.statements,
         "GROUP BY j.target, j.limit_key"),
        ("the admission's call (jobs_engine_limits_admit: the buckets locked, the running "
         "rows counted again, the take, the buckets written), slots free: two rows "
         "admitted", free.statements, "jobs_engine_limits_admit("),
        ("the key skip scan, one key full and one free", keyed.statements,
         "WITH RECURSIVE keys"),
        ("the admission's call, one key full and one free: the free key's row",
         keyed.statements, "jobs_engine_limits_admit("),
        ("the free targets' reserve of the same worker (jobs_long_reserve, from the first "
         "row): finds nothing", reserve_sql, "locked_above AS"),
        ("the next due row after an empty poll (jobs_long_next_due, every long target)",
         next_due_sql, "MIN(j.next_run_at)"),
    ]
    for title, statements, piece in wanted:
        found = of_kind(statements, piece)
        if found is None:
            parts.append(f"## {title}\n(not run)\n")
            continue
        query, params = found
        parts.append(f"## {title}\n{query}\n-- params: {params!r}\n\n{explain(query, params)}\n")
    return "\n".join(parts)


def write_plans(o: Options, plans: list[str]) -> None:
    if not plans:
        return
    o.results_dir.mkdir(parents=True, exist_ok=True)
    path = o.results_dir / EXPLAIN_FILE
    path.write_text(plans[-1])
    print(f"    plans written to {shown(path)}", flush=True)
