"""Benchmark of the jobs engine: prints a table, never asserts (not part of pytest).

    DATABASE_URL=postgres://postgres@127.0.0.1:5433/bench_jobs python bench/run.py
    python bench/run.py --only e100,e1 --rounds 1      # SQLite without DATABASE_URL

Definitions follow docs/benchmarks.md#definitions so our numbers compare with the peers':
E100, E1, D1 (clock from the first observed progress to an empty queue, polled from
this process), L (handler start minus the moment the enqueue call returned after
commit). Rounds are interleaved (every phase once per round) and medians reported.
Workers are real ``manage.py run_fast_lane`` / ``run_long_lane`` subprocesses with
``DJANGO_SETTINGS_MODULE=bench.settings``; each phase SIGTERMs its workers (SIGKILL
after a timeout, and on any error). The ``kafka`` phase starts its own Apache Kafka broker
(``scripts/kafka.sh``, Java 17 + Maven) and stops it at the end of the run.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import logging
import os
import platform
import pstats
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
# Without DATABASE_URL: a SQLite file of the bench's own, never the project's default one.
os.environ.setdefault("DATABASE_URL", f"sqlite:///{ROOT}/bench/results/bench.sqlite3")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from bench import targets  # noqa: E402
from jobs_engine import store  # noqa: E402
from jobs_engine.conf import jobs_settings  # noqa: E402
from jobs_engine.enqueueing import enqueue, enqueue_many  # noqa: E402
from jobs_engine.lanes.fast import FastLane  # noqa: E402
from jobs_engine.lanes.leases import PartitionLeases, new_worker_id  # noqa: E402
from jobs_engine.lanes.pauses import PauseGate  # noqa: E402

RESULTS = ROOT / "bench" / "results"
LOGS = RESULTS / "logs"
PHASES = ("e100", "e1", "d1", "long", "latency", "poll", "kafka")
EXTRA_PHASES = ("profile",)


def payload(i: int) -> dict[str, Any]:
    """The payload of docs/benchmarks.md#definitions."""
    return {"i": i, "ts": time.time(), "msg": "hello world"}


def pct(values: list[float], p: float) -> float:
    """Linear-interpolated percentile, as the peers' harness computes it."""
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


# -- database helpers ----------------------------------------------------------------------


def sql(query: str, params: list[Any] | tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall() if cursor.description else []


def remaining() -> int:
    """Rows still to drain (PENDING or RUNNING); DEAD rows are counted apart."""
    return sql(f"SELECT COUNT(*) FROM {store.JOBS} WHERE status IN ('PENDING', 'RUNNING')")[0][0]


def drained() -> bool:
    """No row left to drain: ``remaining() == 0`` at a fraction of its cost. A count
    reads every row (~13 ms at 50,000), and a drain sampled every 20 ms by counts spends
    a third of a core of this 2-core machine on the sampling, beside the workers."""
    return not sql(f"SELECT EXISTS (SELECT 1 FROM {store.JOBS} "
                   "WHERE status IN ('PENDING', 'RUNNING'))")[0][0]


def dead_count() -> int:
    return sql(f"SELECT COUNT(*) FROM {store.JOBS} WHERE status = 'DEAD'")[0][0]


def reset() -> None:
    """Empty the queue between phases (workers are stopped by then)."""
    if store.is_postgres():
        sql(f"TRUNCATE {store.JOBS}")
    else:
        sql(f"DELETE FROM {store.JOBS}")
    sql(f"UPDATE {store.PARTITIONS} SET owner = NULL, lease_until = NULL, inflight_ids = %s, "
        "inflight_token = NULL", ["[]"])
    sql(f"DELETE FROM {store.WORKERS}")
    sql(f"DELETE FROM {store.PAUSES}")
    analyze()


def analyze() -> None:
    sql(f"ANALYZE {store.JOBS}")


def fill(target: str, n: int, chunk: int = 500) -> None:
    """``n`` jobs of ``target`` committed in one transaction (all pending at once)."""
    with transaction.atomic():
        for start in range(0, n, chunk):
            enqueue_many([{"target": target, "payload": payload(i)}
                          for i in range(start, min(n, start + chunk))])


# -- worker subprocesses -------------------------------------------------------------------

_live: list[subprocess.Popen[bytes]] = []


class WorkerDied(RuntimeError):
    pass


@dataclass
class Workers:
    """``count`` worker processes of one ``manage.py`` command, each in its own session so
    a signal reaches only the processes this bench started."""

    command: str
    count: int
    name: str
    env: dict[str, str]
    log_level: str
    procs: list[subprocess.Popen[bytes]] | None = None

    def start(self) -> Workers:
        LOGS.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings",
               "JOBS_LOG_LEVEL": self.log_level, "PYTHONUNBUFFERED": "1", **self.env}
        self.procs = []
        for i in range(self.count):
            log = open(LOGS / f"{self.name}-{i}.log", "w")  # noqa: SIM115  closed by the child
            proc = subprocess.Popen([sys.executable, "manage.py", self.command], cwd=ROOT,
                                    env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            log.close()
            self.procs.append(proc)
            _live.append(proc)
        return self

    def check(self) -> None:
        for proc in self.procs or []:
            if proc.poll() is not None:
                raise WorkerDied(f"{self.name}: worker pid {proc.pid} exited rc={proc.returncode}"
                                 f" (see {LOGS}/{self.name}-*.log)")

    def stop(self, timeout: float = 30) -> None:
        for proc in self.procs or []:
            stop_process(proc, timeout)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """SIGTERM (clean shutdown), SIGKILL if it does not exit within ``timeout``."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc in _live:
        _live.remove(proc)


def kill_all() -> None:
    for proc in list(_live):
        stop_process(proc, timeout=5)


@contextlib.contextmanager
def running(workers: Workers) -> Iterator[Workers]:
    workers.start()
    try:
        yield workers
    finally:
        workers.stop()


def wait_for(what: str, check: Callable[[], bool], workers: Workers, timeout: float) -> float:
    started = time.perf_counter()
    while not check():
        workers.check()
        if time.perf_counter() - started > timeout:
            raise TimeoutError(f"{workers.name}: {what} not reached in {timeout:.0f}s")
        time.sleep(0.05)
    return time.perf_counter() - started


def partitions_balanced(count: int) -> bool:
    """Every one of ``count`` fast workers holds its fair share of the partitions."""
    rows = sql(f"SELECT owner, COUNT(*) FROM {store.PARTITIONS} WHERE owner IS NOT NULL "
               "GROUP BY owner")
    partitions = jobs_settings().PARTITIONS
    return (len(rows) == count and sum(n for _, n in rows) == partitions
            and all(n >= partitions // count for _, n in rows))


def workers_registered(count: int) -> bool:
    return sql(f"SELECT COUNT(*) FROM {store.WORKERS}")[0][0] >= count


# -- phases ----------------------------------------------------------------------------------


@dataclass
class Options:
    e100_n: int
    e1_n: int
    d1_n: int
    long_n: int
    lat_n: int
    lat_rate: float
    poll_small: int
    poll_big: int
    poll_reps: int
    log_level: str
    drain_poll_s: float
    kafka_n: int = 50_000
    kafka_keys: int = 1_000
    kafka_port: int = 19292
    kafka_dir: str = str(Path(tempfile.gettempdir()) / "jobs-engine-kafka-bench")


Metrics = dict[str, float]


RAW_TABLE = "bench_raw_jobs"
RAW_INSERT = f"INSERT INTO {RAW_TABLE} (payload, status, created_at) VALUES (%s, 'todo', now())"


@contextlib.contextmanager
def raw_psycopg() -> Iterator[Any]:
    """A plain psycopg connection and table: the same-session limit docs/benchmarks.md
    calls "raw psycopg", so ratios are quoted against this run's machine."""
    import psycopg

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    conn = psycopg.connect(**params, autocommit=True)
    try:
        conn.execute(f"DROP TABLE IF EXISTS {RAW_TABLE}; CREATE TABLE {RAW_TABLE} (id "
                     "bigserial PRIMARY KEY, payload jsonb, status text, "
                     "created_at timestamptz DEFAULT now())")
        yield conn
    finally:
        conn.execute(f"DROP TABLE IF EXISTS {RAW_TABLE}")
        conn.close()


def raw_e100(n: int) -> float:
    from psycopg.types.json import Jsonb

    with raw_psycopg() as conn, conn.cursor() as cur:
        started = time.perf_counter()
        for b in range(n // 100):
            with conn.transaction():
                cur.executemany(RAW_INSERT, [(Jsonb(payload(b * 100 + j)),) for j in range(100)])
        return (n // 100 * 100) / (time.perf_counter() - started)


def raw_e1(n: int) -> float:
    from psycopg.types.json import Jsonb

    with raw_psycopg() as conn:
        started = time.perf_counter()
        for i in range(n):
            conn.execute(RAW_INSERT, (Jsonb(payload(i)),))
        return n / (time.perf_counter() - started)


def raw_drain(n: int, limit: int) -> float:
    """DELETE ... FOR UPDATE SKIP LOCKED LIMIT ``limit`` RETURNING, autocommit, one process."""
    from psycopg.types.json import Jsonb

    with raw_psycopg() as conn:
        with conn.transaction(), conn.cursor() as cur:
            cur.executemany(RAW_INSERT, [(Jsonb(payload(i)),) for i in range(n)])
        conn.execute(f"ANALYZE {RAW_TABLE}")
        query = (f"DELETE FROM {RAW_TABLE} WHERE id IN (SELECT id FROM {RAW_TABLE} ORDER BY id "
                 f"LIMIT {limit} FOR UPDATE SKIP LOCKED) RETURNING id, payload")
        done = 0
        started = time.perf_counter()
        while rows := conn.execute(query).fetchall():
            done += len(rows)
        return done / (time.perf_counter() - started)


def phase_e100(o: Options) -> Metrics:
    reset()
    batches = o.e100_n // 100
    started = time.perf_counter()
    for b in range(batches):
        with transaction.atomic():
            enqueue_many([{"target": targets.AT_MOST_ONCE, "payload": payload(b * 100 + j)}
                          for j in range(100)])
    elapsed = time.perf_counter() - started
    stored = remaining()
    if stored != batches * 100:
        raise RuntimeError(f"E100 stored {stored} rows, expected {batches * 100}")
    out = {"e100": batches * 100 / elapsed}
    if store.is_postgres():
        out["e100_raw"] = raw_e100(o.e100_n)
    return out


def phase_e1(o: Options) -> Metrics:
    reset()
    started = time.perf_counter()
    for i in range(o.e1_n):
        enqueue(targets.AT_MOST_ONCE, payload(i))
    elapsed = time.perf_counter() - started
    if remaining() != o.e1_n:
        raise RuntimeError("E1 stored a different number of rows")
    out = {"e1": o.e1_n / elapsed}
    if store.is_postgres():
        out["e1_raw"] = raw_e1(o.e1_n)
    return out


def drain(o: Options, command: str, target: str, n: int, count: int, name: str,
          ready: Callable[[], bool], env: dict[str, str] | None = None,
          filler: Callable[[], None] | None = None) -> dict[str, float]:
    """D1: one worker starts on ``n`` pre-enqueued rows (the peers' method). Several
    workers first reach their steady state (partitions balanced / registered), then the
    ``n`` rows are committed in one transaction, so the partition rebalance, which takes
    up to two heartbeats, is start-up and not drain time. Clock: first observed progress
    → queue empty. ``env`` goes to the workers; ``filler`` commits the ``n`` rows (default:
    ``fill(target, n)``)."""
    reset()
    workers = Workers(command, count, name, env or {}, o.log_level)
    load = filler or (lambda: fill(target, n))
    if count == 1:
        load()
        analyze()
    with running(workers):
        t_zero = time.perf_counter()
        if count > 1:
            wait_for("steady state", ready, workers, timeout=90)
            load()
            t_zero = time.perf_counter()
        t_first = rem_first = None
        deadline = t_zero + max(180.0, n / 20)
        while True:
            # Counts until the first progress (its count is the rate's numerator), then
            # the cheap emptiness probe, so the sampling takes little from the workers.
            left = remaining() if t_first is None else int(not drained())
            now = time.perf_counter()
            if t_first is None and left < n:
                t_first, rem_first = now, left
            if left == 0:
                t_end = now
                break
            if now > deadline:
                raise TimeoutError(f"{name}: drain timeout, {remaining()} rows left")
            workers.check()
            time.sleep(o.drain_poll_s)
    assert t_first is not None and rem_first is not None
    dead = dead_count()
    return {
        "rate": rem_first / (t_end - t_first) if t_end > t_first else float("nan"),
        "rate_incl_startup": n / (t_end - t_zero),
        "startup_s": t_first - t_zero,
        "drain_s": t_end - t_first,
        "dead": dead,
    }


def phase_d1(o: Options) -> Metrics:
    out: Metrics = {}
    for kind, target in targets.FAST_KINDS.items():
        for count in (1, 3):
            r = drain(o, "run_fast_lane", target, o.d1_n, count,
                      f"d1-{target.split('.')[-1]}-{count}w",
                      lambda c=count: partitions_balanced(c))
            out[f"d1_fast:{kind}:{count}"] = r["rate"]
            out[f"d1_fast:{kind}:{count}:startup_s"] = r["startup_s"]
            out[f"d1_fast:{kind}:{count}:dead"] = r["dead"]
            print(f"    D1 fast {kind} {count}w: {r['rate']:,.0f} jobs/s "
                  f"(drain {r['drain_s']:.2f}s, start-up {r['startup_s']:.2f}s, dead {r['dead']})",
                  flush=True)
    if store.is_postgres():
        reset()
        out["d1_raw:1"] = raw_drain(o.d1_n, 1)
        out["d1_raw:100"] = raw_drain(o.d1_n, 100)
        print(f"    raw psycopg drain: {out['d1_raw:1']:,.0f} jobs/s one by one, "
              f"{out['d1_raw:100']:,.0f} jobs/s 100 at a time", flush=True)
    return out


def phase_long(o: Options) -> Metrics:
    out: Metrics = {}
    for count in (1, 3):
        r = drain(o, "run_long_lane", targets.LONG, o.long_n, count, f"long-{count}w",
                  lambda c=count: workers_registered(c))
        out[f"d1_long:{count}"] = r["rate"]
        out[f"d1_long:{count}:dead"] = r["dead"]
        print(f"    D1 long {count}w: {r['rate']:,.0f} jobs/s (drain {r['drain_s']:.2f}s, "
              f"start-up {r['startup_s']:.2f}s, dead {r['dead']})", flush=True)
    return out


def read_starts(path: Path) -> dict[str, float]:
    got: dict[str, float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                got[parts[0]] = float(parts[1])
    return got


def latency_run(o: Options, mode: str) -> tuple[float, float, int]:
    """L: one idle fast worker; ``lat_n`` jobs at ``lat_rate``/s, each its own commit."""
    reset()
    LOGS.mkdir(parents=True, exist_ok=True)
    lat_file = LOGS / f"latency-{mode}.task"
    lat_file.unlink(missing_ok=True)
    env = {targets.LAT_FILE_ENV: str(lat_file)}
    if mode == "poll":
        env["JOBS_NOTIFY"] = "off"
    tag = uuid.uuid4().hex[:8]
    after: dict[str, float] = {}
    workers = Workers("run_fast_lane", 1, f"latency-{mode}", env, o.log_level)
    with running(workers):
        warm = f"lat-warm-{tag}"
        enqueue(targets.LATENCY, payload(-1), dedupe_key=warm)
        wait_for("warm-up job", lambda: warm in read_starts(lat_file), workers, timeout=60)
        time.sleep(2.0)  # idle and waiting
        started = time.perf_counter()
        for i in range(o.lat_n):
            delay = started + i / o.lat_rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            key = f"lat-{tag}-{i}"
            enqueue(targets.LATENCY, payload(i), dedupe_key=key)
            after[key] = time.time()
        with contextlib.suppress(TimeoutError):
            wait_for("every job started", lambda: set(after) <= set(read_starts(lat_file)),
                     workers, timeout=60)
    starts = read_starts(lat_file)
    lats = [(starts[k] - t) * 1000 for k, t in after.items() if k in starts]
    return pct(lats, 50), pct(lats, 99), len(after) - len(lats)


def phase_latency(o: Options) -> Metrics:
    out: Metrics = {}
    modes = ["notify", "poll"] if store.is_postgres() else ["poll"]
    for mode in modes:
        p50, p99, missing = latency_run(o, mode)
        out[f"lat:{mode}:p50"], out[f"lat:{mode}:p99"] = p50, p99
        out[f"lat:{mode}:missing"] = missing
        print(f"    L {mode}: p50 {p50:.2f} ms, p99 {p99:.2f} ms, missing {missing}", flush=True)
    return out


# -- poll cost -------------------------------------------------------------------------------

POLL_PARTITIONS = list(range(21))  # a third of 64: one of three workers


INSERT_COLUMNS = (
    "code, target, lane, key, partition, version, payload, headers, dedupe_key, status, "
    "delivery_mode, attempts, next_run_at, last_error, trace_id, created_at, updated_at"
)


def backlog(n: int, held_front: bool = False) -> None:
    """``n`` PENDING rows for the poll-cost phase, built in one INSERT ... SELECT.

    Default layout: due fast rows over 64 partitions, one in 7 without a key, the rest on
    n/20 keys with ~20 versions each (version order = run order); one key in 100 has its
    first version waiting for a retry an hour away, which holds its later versions.
    ``held_front`` (stress layout): a tenth of the rows are later versions of n/1000 keys
    whose first version waits for a retry, stored at the head's retry time as the engine
    stores them. Both layouts add
    n/100 long-lane rows for the long-lane reserve query."""
    reset()
    held = n // 10 if held_front else 0
    hot = max(1, n // 1000)
    plain = n - held
    keys = max(1, plain // 20)
    n_long = max(10, n // 100)
    fast = [targets.AT_MOST_ONCE, targets.AT_MOST_ONCE]
    if not store.is_postgres():
        backlog_sqlite(plain, keys, held, hot, n_long)
        return
    payload_sql = ("jsonb_build_object('i', g, 'ts', extract(epoch FROM now()), "
                   "'msg', 'hello world'), '{}'::jsonb")
    sql(
        f"INSERT INTO {store.JOBS} ({INSERT_COLUMNS}) SELECT %s, %s, 'fast', "
        "CASE WHEN g %% 7 = 6 THEN NULL ELSE 'k' || (g %% %s) END, "
        "CASE WHEN g %% 7 = 6 THEN g %% 64 ELSE (g %% %s) %% 64 END, "
        f"CASE WHEN g %% 7 = 6 THEN 0 ELSE g / %s END, {payload_sql}, 'poll-' || g, "
        "'PENDING', 'at_most_once', "
        "CASE WHEN g < %s AND g %% 7 <> 6 AND g %% 100 = 0 THEN 1 ELSE 0 END, "
        "CASE WHEN g < %s AND g %% 7 <> 6 AND g %% 100 = 0 THEN now() + interval '1 hour' "
        "ELSE now() - interval '1 hour' + g * interval '1 microsecond' END, "
        "'', '', now(), now() FROM generate_series(0, %s - 1) AS g",
        [*fast, keys, keys, keys, keys, keys, plain],
    )
    if held:
        # The heads of the hot keys, retrying in an hour ...
        sql(f"INSERT INTO {store.JOBS} ({INSERT_COLUMNS}) SELECT %s, %s, 'fast', 'hot' || g, "
            f"g %% 64, 0, {payload_sql}, 'poll-head-' || g, 'PENDING', 'at_most_once', 1, "
            "now() + interval '1 hour', '', '', now(), now() FROM generate_series(0, %s - 1) g",
            [*fast, hot])
        # ... hold their later versions, which the engine stores at the head's retry time
        # (a retry moves them there; a row enqueued behind a retrying head starts there).
        sql(f"INSERT INTO {store.JOBS} ({INSERT_COLUMNS}) SELECT %s, %s, 'fast', "
            f"'hot' || (g %% %s), (g %% %s) %% 64, g / %s + 1, {payload_sql}, 'poll-held-' || g, "
            "'PENDING', 'at_most_once', 0, now() + interval '1 hour', '', '', now(), now() "
            "FROM generate_series(0, %s - 1) g",
            [*fast, hot, hot, hot, held - hot])
    sql(f"INSERT INTO {store.JOBS} ({INSERT_COLUMNS}) SELECT %s, %s, 'long', NULL, g %% 64, 0, "
        f"{payload_sql}, 'poll-long-' || g, 'PENDING', 'at_most_once', 0, "
        "now() - interval '1 hour' + g * interval '1 microsecond', '', '', now(), now() "
        "FROM generate_series(0, %s - 1) AS g",
        [targets.LONG, targets.LONG, n_long])
    sql(f"VACUUM ANALYZE {store.JOBS}")


def backlog_sqlite(plain: int, keys: int, held: int, hot: int, n_long: int) -> None:
    """The same layouts row by row (SQLite has no generate_series)."""
    base = store.db_now().timestamp() - 3600

    def at(offset_s: float) -> Any:
        return store._dt(datetime.fromtimestamp(base + offset_s, UTC))

    def rows() -> Iterator[list[Any]]:
        fast = [targets.AT_MOST_ONCE, targets.AT_MOST_ONCE, "fast"]
        for g in range(plain):
            keyed = g % 7 != 6
            waiting = keyed and g < keys and g % 100 == 0
            yield [*fast, f"k{g % keys}" if keyed else None,
                   (g % keys) % 64 if keyed else g % 64, g // keys if keyed else 0,
                   json.dumps(payload(g)), "{}", f"poll-{g}", "PENDING", "at_most_once",
                   1 if waiting else 0, at(7200) if waiting else at(g / 1e6)]
        if held:
            for g in range(hot):
                yield [*fast, f"hot{g}", g % 64, 0, json.dumps(payload(g)), "{}",
                       f"poll-head-{g}", "PENDING", "at_most_once", 1, at(7200)]
            for g in range(held - hot):
                yield [*fast, f"hot{g % hot}", (g % hot) % 64, g // hot + 1,
                       json.dumps(payload(g)), "{}", f"poll-held-{g}", "PENDING",
                       "at_most_once", 0, at(7200)]
        for g in range(n_long):
            yield [targets.LONG, targets.LONG, "long", None, g % 64, 0, json.dumps(payload(g)),
                   "{}", f"poll-long-{g}", "PENDING", "at_most_once", 0, at(g / 1e6)]

    insert = (f"INSERT INTO {store.JOBS} ({INSERT_COLUMNS}) VALUES "
              "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, '', '', "
              "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)")
    batch: list[list[Any]] = []
    with transaction.atomic(), connection.cursor() as cursor:
        for row in rows():
            batch.append(row)
            if len(batch) == 10_000:
                cursor.executemany(insert, batch)
                batch = []
        if batch:
            cursor.executemany(insert, batch)
    analyze()


def capture_sql(call: Callable[[], Any]) -> list[tuple[str, Any]]:
    """The statements ``call`` runs, with their parameters, as the backend got them."""
    seen: list[tuple[str, Any]] = []

    def wrapper(execute: Any, query: str, params: Any, many: bool, context: Any) -> Any:
        seen.append((query, params))
        return execute(query, params, many, context)

    with connection.execute_wrapper(wrapper):
        call()
    return seen


class _Rollback(Exception):
    pass


def long_candidate_sql() -> tuple[str, Any]:
    """The long-lane reserve candidate SELECT, captured from ``store.jobs_long_reserve`` in a
    rolled-back transaction (so the EXPLAIN shows the statement the store really runs)."""
    captured: list[tuple[str, Any]] = []
    with contextlib.suppress(_Rollback), transaction.atomic():
        captured = capture_sql(lambda: store.jobs_long_reserve(
            "bench-explain", uuid.uuid4().hex, store.db_now(), 300, jobs_settings().LONG_BATCH,
            exclusive_targets=[targets.LONG_EXCLUSIVE],
            targets=[targets.LONG, targets.LONG_EXCLUSIVE]))
        raise _Rollback
    return next((q, p) for q, p in captured if q.lstrip().upper().startswith("SELECT J.ID"))


def time_query(query: str, params: Any, reps: int) -> float:
    """Median ms of ``reps`` runs of one statement (in a rolled-back transaction, since the
    long-lane candidate query takes row locks)."""
    times: list[float] = []
    with contextlib.suppress(_Rollback), transaction.atomic(), connection.cursor() as cursor:
        for _ in range(reps):
            started = time.perf_counter()
            cursor.execute(query, params)
            cursor.fetchall()
            times.append((time.perf_counter() - started) * 1000)
        raise _Rollback
    return statistics.median(times)


def explain(query: str, params: Any) -> str:
    prefix = "EXPLAIN (ANALYZE, BUFFERS) " if store.is_postgres() else "EXPLAIN QUERY PLAN "
    with contextlib.suppress(_Rollback), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(prefix + query, params)
        lines = ["  ".join(str(c) for c in row) for row in cursor.fetchall()]
        raise _Rollback
    return "\n".join(lines)


# What a worker with the bench targets registered reads (the poll runs once per target).
POLL_TARGETS = {targets.AT_MOST_ONCE: 100}  # target -> rows per poll


def poll_at(n: int, reps: int, held_front: bool = False) -> dict[str, Any]:
    started = time.perf_counter()
    backlog(n, held_front)
    built_s = time.perf_counter() - started
    now = store.db_now()
    times: list[float] = []
    handed = 0
    for _ in range(reps):
        t = time.perf_counter()
        handed = len(store.jobs_fast_due(POLL_PARTITIONS, now, POLL_TARGETS))
        times.append((time.perf_counter() - t) * 1000)
    fast_sql, fast_params = capture_sql(
        lambda: store.jobs_fast_due(POLL_PARTITIONS, now, POLL_TARGETS))[-1]
    long_sql, long_params = long_candidate_sql()
    return {"n": n, "poll_ms": statistics.median(times), "rows": handed, "build_s": built_s,
            "long_ms": time_query(long_sql, long_params, reps),
            "fast_sql": (fast_sql, fast_params), "long_sql": (long_sql, long_params)}


def phase_poll(o: Options) -> Metrics:
    small = poll_at(o.poll_small, o.poll_reps)
    print(f"    poll at {small['n']:,}: {small['poll_ms']:.2f} ms ({small['rows']} rows), "
          f"long candidates {small['long_ms']:.2f} ms", flush=True)
    big = poll_at(o.poll_big, o.poll_reps)
    print(f"    poll at {big['n']:,}: {big['poll_ms']:.2f} ms ({big['rows']} rows), "
          f"long candidates {big['long_ms']:.2f} ms (backlog built in {big['build_s']:.1f}s)",
          flush=True)
    fast_plan = explain(*big["fast_sql"])
    long_plan = explain(*big["long_sql"])
    held_small = poll_at(o.poll_small, o.poll_reps, held_front=True)
    held_big = poll_at(o.poll_big, max(5, o.poll_reps // 5), held_front=True)
    held_plan = explain(*held_big["fast_sql"])
    print(f"    stress layout (a tenth of the backlog held behind retrying key heads): "
          f"{held_small['poll_ms']:.2f} ms at {o.poll_small:,}, {held_big['poll_ms']:.2f} ms at "
          f"{o.poll_big:,} ({held_big['rows']} rows)", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    header = (f"# {datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC, {connection.vendor}, "
              f"{big['n']:,} PENDING fast rows + {max(10, big['n'] // 100):,} long rows, "
              f"{len(POLL_PARTITIONS)} partitions held, limit 100\n")
    text = (header + "\n## fast-lane poll (store.jobs_fast_due)\n" + big["fast_sql"][0]
            + "\n-- params: " + repr(big["fast_sql"][1]) + "\n\n" + fast_plan
            + "\n\n## long-lane reserve candidate query (store.jobs_long_reserve)\n"
            + big["long_sql"][0] + "\n-- params: " + repr(big["long_sql"][1]) + "\n\n"
            + long_plan
            + f"\n\n## stress layout: fast-lane poll at {o.poll_big:,} rows, a tenth of them "
            "later versions of keys whose head waits for a retry\n"
            + held_plan + "\n")
    (RESULTS / "explain_fast_poll.txt").write_text(text)
    uses = {name: name in fast_plan
            for name in ("jobs_fast_pending_due", "jobs_pending_key_order")}
    seq = f"Seq Scan on {store.JOBS}" in fast_plan or f"SCAN {store.JOBS}" in fast_plan
    long_uses_index = "jobs_long_pending_due" in long_plan
    print(f"    fast poll plan uses {uses}, seq scan: {seq}; long candidates use "
          f"jobs_long_pending_due: {long_uses_index}", flush=True)
    reset()
    return {
        "poll:small": small["poll_ms"], "poll:big": big["poll_ms"],
        "poll:ratio": big["poll_ms"] / small["poll_ms"],
        "poll:rows_small": small["rows"], "poll:rows_big": big["rows"],
        "poll:long_small": small["long_ms"], "poll:long_big": big["long_ms"],
        "poll:long_ratio": big["long_ms"] / small["long_ms"],
        "poll:held_small": held_small["poll_ms"], "poll:held_big": held_big["poll_ms"],
        "poll:held_ratio": held_big["poll_ms"] / held_small["poll_ms"],
        "poll:index_due": float(uses["jobs_fast_pending_due"]),
        "poll:index_key": float(uses["jobs_pending_key_order"]),
        "poll:seq_scan": float(seq),
    }


# -- profile (on request: --only profile) ----------------------------------------------------


def phase_profile(o: Options) -> Metrics:
    """The fast lane's run_once loop in this process under cProfile, one worker holding all
    partitions, per target kind; also counts SQL statements per job (unprofiled run)."""
    out: Metrics = {}
    logger = logging.getLogger("jobs_engine")
    old_level = logger.level
    logger.setLevel(o.log_level)
    sink = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115
    old_handlers = logger.handlers[:]
    logger.handlers = [sink]
    try:
        for kind, target in targets.FAST_KINDS.items():
            slug = target.split(".")[-1]
            for profiled in (False, True):
                reset()
                fill(target, o.d1_n)
                analyze()
                settings = jobs_settings()
                worker_id = new_worker_id()
                leases = PartitionLeases(worker_id, settings)
                leases.heartbeat()
                lane = FastLane(worker_id, settings, leases, PauseGate(worker_id, settings))
                statements = [0]

                def count(execute: Any, query: str, params: Any, many: bool, context: Any,
                          counter: list[int] = statements) -> Any:
                    counter[0] += 1
                    return execute(query, params, many, context)

                profiler = cProfile.Profile()
                handed = polls = 0
                started = time.perf_counter()
                with connection.execute_wrapper(count):
                    if profiled:
                        profiler.enable()
                    while True:
                        n = lane.run_once()
                        polls += 1
                        if not n:
                            break
                        handed += n
                    if profiled:
                        profiler.disable()
                elapsed = time.perf_counter() - started
                leases.release_all()
                if profiled:
                    buf = io.StringIO()
                    # strip_dirs: file names only, no path of the machine that ran it
                    stats = pstats.Stats(profiler, stream=buf).strip_dirs()
                    stats.sort_stats("cumulative").print_stats(35)
                    stats.sort_stats("tottime").print_stats(25)
                    (RESULTS / f"profile_{slug}.txt").write_text(
                        f"# {kind}: {handed} jobs in {elapsed:.2f}s under cProfile, "
                        f"{polls} polls\n" + buf.getvalue())
                    print(f"    profile {kind}: written to bench/results/profile_{slug}.txt",
                          flush=True)
                else:
                    out[f"profile:{kind}:rate"] = handed / elapsed
                    out[f"profile:{kind}:sql_per_job"] = statements[0] / max(handed, 1)
                    print(f"    in-process {kind}: {handed / elapsed:,.0f} jobs/s, "
                          f"{statements[0] / max(handed, 1):.2f} SQL statements per job, "
                          f"{polls} polls", flush=True)
    finally:
        logger.handlers = old_handlers
        logger.setLevel(old_level)
    reset()
    return out


# -- kafka: fast lane → a real broker, beside the raw producer -------------------------------

KAFKA_SH = ROOT / "scripts" / "kafka.sh"
KAFKA_PARTITIONS = 3


@dataclass
class BenchBroker:
    """``scripts/kafka.sh`` on the bench's own port and data dir. Started on first use,
    stopped at the end of the run unless it was already running."""

    port: int
    data_dir: str
    bootstrap: str = ""
    started_here: bool = False

    def script(self, *args: str, check: bool = True, timeout: float = 300
               ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "JOBS_KAFKA_PORT": str(self.port), "JOBS_KAFKA_DIR": self.data_dir}
        done = subprocess.run(["bash", str(KAFKA_SH), *args], env=env, capture_output=True,
                              text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"scripts/kafka.sh {' '.join(args)} failed ({done.returncode}):"
                               f"\n{done.stdout}\n{done.stderr}")
        return done

    def start(self) -> None:
        self.started_here = not self.script("status", check=False).stdout.startswith("running")
        self.bootstrap = self.script("start").stdout.strip().splitlines()[-1]

    def stop(self) -> None:
        if self.started_here:
            self.script("stop", check=False)


_kafka: BenchBroker | None = None


def kafka_broker(o: Options) -> BenchBroker:
    """The bench broker, running, with the bench topics; the driver's targets point at it."""
    global _kafka
    if _kafka is None:
        broker = BenchBroker(o.kafka_port, o.kafka_dir)
        started = time.perf_counter()
        broker.start()
        _kafka = broker
        kafka_create_topics(broker.bootstrap,
                            [targets.kafka_topic(kind) for kind in targets.KAFKA_TOPICS])
        targets.register_kafka(broker.bootstrap)
        how = "started" if broker.started_here else "already running"
        print(f"    kafka broker on {broker.bootstrap} ({how}, "
              f"{time.perf_counter() - started:.1f}s)", flush=True)
    return _kafka


def stop_kafka() -> None:
    global _kafka
    if _kafka is not None:
        _kafka.stop()
        _kafka = None


def kafka_create_topics(bootstrap: str, topics: list[str]) -> None:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(t, KAFKA_PARTITIONS, 1) for t in topics],
                                  request_timeout=30)
    for future in futures.values():
        try:
            future.result(60)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


def kafka_end_offset(bootstrap: str, topic: str) -> int:
    """Records appended to ``topic`` so far (the sum of its partitions' high watermarks)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks",
                         "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=15).topics[topic].partitions
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1]
                   for p in partitions)
    finally:
        consumer.close()


def kafka_fill(target: str, n: int, keys: int, chunk: int = 500) -> None:
    """``n`` events over ``keys`` keys, versions 1, 2, ... per key, committed in one
    transaction in event order (every key's version 1, then every key's version 2, ...)."""
    with transaction.atomic():
        for start in range(0, n, chunk):
            enqueue_many([{"target": target, "payload": payload(i), "key": f"k{i % keys}",
                           "version": i // keys + 1}
                          for i in range(start, min(n, start + chunk))])


def raw_kafka(bootstrap: str, topic: str, n: int, keys: int, per_flush: int | None) -> float:
    """The raw ``confluent_kafka.Producer`` with the target's configuration sending the same
    records (key, JSON value byte for byte as the target sends PostgreSQL's jsonb text,
    headers event_id/trace_id/traceparent): messages/s
    from the first ``produce`` to the last delivery report, after a warm-up message (the
    connection and the topic's metadata are start-up, as the workers' are).
    ``per_flush``: wait for every report each ``per_flush`` messages (the target's send
    protocol, without the database); None: produce everything, then flush once."""
    from confluent_kafka import Producer

    from kafka_target.settings import parse_kafka_settings

    config = parse_kafka_settings({"BOOTSTRAP_SERVERS": bootstrap}, environ={}).producer_config()
    producer = Producer(config)
    errors: list[Any] = []
    delivered = [0]

    def report(err: Any, _msg: Any) -> None:
        if err is None:
            delivered[0] += 1
        else:
            errors.append(err)

    producer.produce(topic, b"{}", key=b"warm-up", on_delivery=report)
    producer.flush(30)
    delivered[0] = 0
    trace = uuid.uuid4().hex
    started = time.perf_counter()
    for i in range(n):
        value = json.dumps(payload(i), ensure_ascii=False, allow_nan=False).encode()
        headers = [("event_id", str(i).encode()), ("trace_id", trace.encode()),
                   ("traceparent", f"00-{trace}-{secrets.token_hex(8)}-01".encode())]
        while True:
            try:
                producer.produce(topic, value, key=f"k{i % keys}".encode(), headers=headers,
                                 on_delivery=report)
                break
            except BufferError:  # the client's queue is full: serve reports, then again
                producer.poll(0.01)
        if per_flush and (i + 1) % per_flush == 0:
            producer.flush(30)
    producer.flush(60)
    elapsed = time.perf_counter() - started
    if errors or delivered[0] != n:
        raise RuntimeError(f"raw producer: {delivered[0]} of {n} delivered, errors {errors[:3]}")
    return n / elapsed


def phase_kafka(o: Options) -> Metrics:
    """Fast lane → Kafka end to end: ``kafka_n`` pre-enqueued events drained by 1 and 3
    ``run_fast_lane`` processes per delivery mode (a row is deleted only after its delivery
    report, so an empty queue means the broker acknowledged every record; the topic's end
    offsets are checked too), then the raw producer on the same records in the same round."""
    broker = kafka_broker(o)
    env = targets.kafka_settings(broker.bootstrap)
    out: Metrics = {}
    for kind in targets.KAFKA_TOPICS:
        target, topic = targets.kafka_target(kind), targets.kafka_topic(kind)
        for count in (1, 3):
            before = kafka_end_offset(broker.bootstrap, topic)
            r = drain(o, "run_fast_lane", target, o.kafka_n, count,
                      f"kafka-{kind}-{count}w", lambda c=count: partitions_balanced(c), env=env,
                      filler=lambda t=target: kafka_fill(t, o.kafka_n, o.kafka_keys))
            appended = kafka_end_offset(broker.bootstrap, topic) - before
            out[f"kafka:{kind}:{count}"] = r["rate"]
            out[f"kafka:{kind}:{count}:startup_s"] = r["startup_s"]
            out[f"kafka:{kind}:{count}:dead"] = r["dead"]
            out[f"kafka:{kind}:{count}:missing"] = o.kafka_n - appended
            print(f"    kafka {kind} {count}w: {r['rate']:,.0f} jobs/s (drain {r['drain_s']:.2f}s, "
                  f"start-up {r['startup_s']:.2f}s, dead {r['dead']}, records appended "
                  f"{appended:,})", flush=True)
    topic = targets.kafka_topic("at-most-once")
    out["kafka_raw"] = raw_kafka(broker.bootstrap, topic, o.kafka_n, o.kafka_keys, None)
    out["kafka_raw:100"] = raw_kafka(broker.bootstrap, topic, o.kafka_n, o.kafka_keys, 100)
    for kind in targets.KAFKA_TOPICS:
        for count in (1, 3):
            out[f"kafka_ratio:{kind}:{count}"] = out[f"kafka:{kind}:{count}"] / out["kafka_raw"]
    print(f"    raw producer: {out['kafka_raw']:,.0f} msg/s produce-all-then-flush, "
          f"{out['kafka_raw:100']:,.0f} msg/s flushing every 100", flush=True)
    reset()
    return out


PHASE_FUNCS: dict[str, Callable[[Options], Metrics]] = {
    "e100": phase_e100, "e1": phase_e1, "d1": phase_d1, "long": phase_long,
    "latency": phase_latency, "poll": phase_poll, "profile": phase_profile,
    "kafka": phase_kafka,
}


# -- the table ---------------------------------------------------------------------------------


PEER_D1 = ("raw psycopg 64,019 batched / 2,818 one-by-one; django-q2 Redis 2,698; django-q2 ORM "
           "1,118; Celery 1,008; Procrastinate 398; django-tasks-db 324 (all 1 worker)")


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    unit: str  # "jobs/s", "ms", "x"
    bar: str = ""
    passes: Callable[[float], bool] | None = None
    target: str = ""
    peers: str = ""


def rows_for(o: Options) -> list[Row]:
    rows = [
        Row("e100", f"E100: {o.e100_n:,} jobs, enqueue_many 100 per tx", "jobs/s", "≥ 10,000",
            lambda v: v >= 10_000, "≥ 20,000",
            "raw psycopg 41,660; django-q2 Redis 4,615; Procrastinate 4,611; django-q2 ORM "
            "2,117; Celery 1,872; django-tasks-db 1,705"),
        Row("e100_raw", "  E100 raw psycopg, same session (reference limit)", "jobs/s",
            peers="raw psycopg 41,660"),
        Row("e1", f"E1: {o.e1_n:,} jobs, enqueue per call, autocommit", "jobs/s", "", None,
            "≥ 2,600",
            "raw psycopg 3,271; django-q2 Redis 4,346; Celery 2,062; django-q2 ORM 1,496; "
            "django-tasks-db 1,486; Procrastinate 888"),
        Row("e1_raw", "  E1 raw psycopg, same session (reference limit)", "jobs/s",
            peers="raw psycopg 3,271"),
    ]
    for kind in targets.FAST_KINDS:
        for count in (1, 3):
            rows.append(Row(
                f"d1_fast:{kind}:{count}",
                f"D1 fast lane, {kind}, {count} worker{'s' if count > 1 else ''} "
                f"({o.d1_n:,} jobs)", "jobs/s",
                "≥ 5,000" if count == 1 else "", (lambda v: v >= 5_000) if count == 1 else None,
                "≥ 10,000" if count == 1 else "", PEER_D1 if count == 1 else ""))
    rows += [
        Row("d1_raw:1", "  D1 raw psycopg DELETE..SKIP LOCKED one by one, same session",
            "jobs/s", peers="raw psycopg 2,818"),
        Row("d1_raw:100", "  D1 raw psycopg DELETE..SKIP LOCKED 100 at a time, same session",
            "jobs/s", peers="raw psycopg 64,019"),
    ]
    for count in (1, 3):
        rows.append(Row(f"d1_long:{count}",
                        f"D1 long lane, {count} worker{'s' if count > 1 else ''} "
                        f"({o.long_n:,} jobs)", "jobs/s",
                        peers=PEER_D1 if count == 1 else ""))
    lat_what = f"{o.lat_n} jobs at {o.lat_rate:g}/s"
    rows += [
        Row("lat:notify:p50", f"L p50, NOTIFY ({lat_what})", "ms", "≤ 20 ms", lambda v: v <= 20,
            "≤ 2 ms", "raw LISTEN/NOTIFY 0.6; django-q2 Redis 0.7; Celery 0.8; Procrastinate "
            "2.4; django-q2 ORM 51.9; django-tasks-db 528 (1 s poll)"),
        Row("lat:notify:p99", "L p99, NOTIFY", "ms", "", None, "≤ 5 ms",
            "raw 0.9; django-q2 Redis 1.0; Celery 1.6; Procrastinate 3.7; django-q2 ORM 102.5; "
            "django-tasks-db 993"),
        Row("lat:poll:p50", "L p50, polling only (JOBS_NOTIFY=off, IDLE_POLL_S default 1,2,5)",
            "ms", peers="django-tasks-db 528 (1 s poll); django-q2 ORM 51.9"),
        Row("lat:poll:p99", "L p99, polling only", "ms",
            peers="django-tasks-db 993; django-q2 ORM 102.5"),
        Row("poll:small", f"fast poll, {o.poll_small:,} PENDING (21 partitions, limit 100)", "ms"),
        Row("poll:big", f"fast poll, {o.poll_big:,} PENDING", "ms"),
        Row("poll:ratio", "fast poll ratio big / small", "x", "≤ 2x", lambda v: v <= 2),
        Row("poll:held_small", f"fast poll, stress layout, {o.poll_small:,} PENDING "
            "(a tenth held behind retrying key heads)", "ms"),
        Row("poll:held_big", f"fast poll, stress layout, {o.poll_big:,} PENDING", "ms"),
        Row("poll:held_ratio", "fast poll ratio, stress layout", "x", "(≤ 2x)",
            lambda v: v <= 2),
        Row("poll:long_small", f"long reserve candidates, {max(10, o.poll_small // 100):,} long "
            f"rows in {o.poll_small:,}", "ms"),
        Row("poll:long_big", f"long reserve candidates, {max(10, o.poll_big // 100):,} long rows "
            f"in {o.poll_big:,}", "ms"),
        Row("poll:long_ratio", "long candidates ratio big / small", "x"),
    ]
    workers = {1: "1 worker", 3: "3 workers"}
    for kind in targets.KAFKA_TOPICS:
        for count in (1, 3):
            rows.append(Row(
                f"kafka:{kind}:{count}", f"Kafka: fast lane → broker, {kind}, {workers[count]} "
                f"({o.kafka_n:,} jobs, {o.kafka_keys:,} keys)", "jobs/s",
                "≥ 5,000" if count == 1 else "", (lambda v: v >= 5_000) if count == 1 else None))
    rows += [
        Row("kafka_raw", "  Kafka raw confluent-kafka Producer, same records and config, "
            "produce all then flush, same session", "jobs/s"),
        Row("kafka_raw:100", "  Kafka raw Producer, flush every 100 (the target's send "
            "protocol without the database), same session", "jobs/s"),
    ]
    for kind in targets.KAFKA_TOPICS:
        for count in (1, 3):
            rows.append(Row(
                f"kafka_ratio:{kind}:{count}", f"Kafka ratio fast lane / raw producer, {kind}, "
                f"{workers[count]}", "x", "≥ 0.25x" if count == 1 else "",
                (lambda v: v >= 0.25) if count == 1 else None))
    return rows


def fmt(value: float, unit: str) -> str:
    if value != value:  # NaN
        return "n/a"
    if unit == "jobs/s":
        return f"{value:,.0f}"
    if unit == "x":
        return f"{value:.2f}x"
    return f"{value:.2f}"


def table(results: dict[str, list[float]], o: Options) -> str:
    lines = ["| metric | ours (median) | min-max | unit | issue bar | docs/benchmarks.md target "
             "| peers (docs/benchmarks.md) |", "|---|---|---|---|---|---|---|"]
    for row in rows_for(o):
        values = results.get(row.key)
        if not values:
            continue
        median = statistics.median(values)
        spread = (f"{fmt(min(values), row.unit)}-{fmt(max(values), row.unit)}"
                  if len(values) > 1 else "")
        bar = row.bar
        if row.passes is not None:
            bar += " PASS" if row.passes(median) else " **FAIL**"
        lines.append(f"| {row.label} | {fmt(median, row.unit)} | {spread} | {row.unit} | "
                     f"{bar} | {row.target} | {row.peers} |")
    return "\n".join(lines)


def machine() -> str:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    db = connection.vendor
    if store.is_postgres():
        db = sql("SELECT version()")[0][0].split(" on ")[0]
    return (f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; host {platform.node()}; "
            f"{os.cpu_count()} CPUs ({cpu}); Python {platform.python_version()}; "
            f"Django {django.get_version()}; {db}")


def notes(results: dict[str, list[float]], o: Options, rounds: int) -> str:
    def measured(*prefixes: str) -> bool:  # a note only for the phases that ran
        return any(key.startswith(prefixes) for key in results)

    out = [
        f"- {rounds} interleaved round(s); medians. Worker log level {o.log_level} "
        "(the peers' Procrastinate ran at warning).",
    ]
    if measured("d1", "kafka"):
        out.append(
            "- D1, 1 worker: rows pre-enqueued, then the worker is spawned "
            "(docs/benchmarks.md method). "
            "D1, 3 workers: the workers start first and reach their steady state (fast lane: "
            "partitions balanced, which takes up to two PARTITION_HEARTBEAT_S; long lane: all "
            "registered), then the rows are committed in one transaction. Clock: first observed "
            f"progress → queue empty, polled every {o.drain_poll_s * 1000:.0f} ms from the "
            "bench (a row count until the first progress, then an EXISTS probe: a count every "
            "poll would take a third of a core from the workers).")
    if measured("lat:"):
        out.append(
            "- Latency: handler start (time.time() in the worker, appended to a file) - the "
            "moment the autocommit enqueue() returned in the bench; fast lane, at-most-once "
            "target.")
    if measured("poll:"):
        out.append(
            "- Poll cost: store.jobs_fast_due, partitions 0-20 held, limit 100, after VACUUM "
            "ANALYZE; plans in bench/results/explain_fast_poll.txt.")
    if measured("kafka"):
        out.append(
            f"- Kafka: a real Apache Kafka broker (scripts/kafka.sh, one node, loopback), "
            f"topics of {KAFKA_PARTITIONS} partitions; the targets' producer config (acks=all, "
            "retries off, linger default). Fast lane: as D1 (real run_fast_lane processes, "
            "clock from first progress to an empty queue); a row is deleted only after its "
            "delivery report, and the topic's end offsets are checked after each drain. Raw "
            "producer: same records (key, JSON value, event_id/trace_id/traceparent headers) "
            "in this process after a warm-up message. Ratio: per round, fast lane / raw "
            "produce-all-then-flush.")
    for key in [k for k in results if k.endswith(":dead") or k.endswith(":missing")]:
        if any(results[key]):
            out.append(f"- WARNING {key}: {results[key]}")
    if "poll:index_due" in results:
        index_backed = (all(results["poll:index_due"]) and all(results["poll:index_key"])
                        and not any(results["poll:seq_scan"]))
        out.append("- fast poll plan index-backed (jobs_fast_pending_due + "
                   "jobs_pending_key_order, no seq scan): "
                   f"{'yes' if index_backed else 'NO — see the plan'}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", default=",".join(PHASES),
                   help=f"comma list of {', '.join(PHASES + EXTRA_PHASES)}")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--e100-n", type=int, default=10_000)
    p.add_argument("--e1-n", type=int, default=2_000)
    p.add_argument("--d1-n", type=int, default=10_000)
    p.add_argument("--long-n", type=int, default=2_000)
    p.add_argument("--lat-n", type=int, default=200)
    p.add_argument("--lat-rate", type=float, default=20.0)
    p.add_argument("--poll-small", type=int, default=1_000)
    p.add_argument("--poll-big", type=int, default=1_000_000)
    p.add_argument("--poll-reps", type=int, default=50)
    p.add_argument("--worker-log-level", default="WARNING")
    p.add_argument("--drain-poll-ms", type=float, default=20)
    p.add_argument("--kafka-n", type=int, default=50_000,
                   help="events of the kafka phase: a drain of over a second, so the 20 ms "
                        "progress sampling is a small part of it")
    p.add_argument("--kafka-keys", type=int, default=1_000)
    p.add_argument("--kafka-port", type=int, default=19292,
                   help="port of the bench's own broker (scripts/kafka.sh JOBS_KAFKA_PORT)")
    p.add_argument("--kafka-dir", default=Options.kafka_dir,
                   help="its data dir (JOBS_KAFKA_DIR)")
    p.add_argument("--output", default=str(RESULTS / "latest.md"))
    args = p.parse_args(argv)
    phases = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = set(phases) - set(PHASE_FUNCS)
    if unknown:
        p.error(f"unknown phases: {', '.join(sorted(unknown))}")
    o = Options(args.e100_n, args.e1_n, args.d1_n, args.long_n, args.lat_n, args.lat_rate,
                args.poll_small, args.poll_big, args.poll_reps, args.worker_log_level.upper(),
                args.drain_poll_ms / 1000, args.kafka_n, args.kafka_keys, args.kafka_port,
                args.kafka_dir)
    logging.getLogger("jobs_engine").setLevel(logging.WARNING)  # the driver's own enqueues
    call_command("migrate", verbosity=0)
    store.partitions_seed(jobs_settings().PARTITIONS)
    RESULTS.mkdir(parents=True, exist_ok=True)
    info = machine()
    print(f"jobs-engine bench — {info}", flush=True)
    results: dict[str, list[float]] = {}
    started = time.perf_counter()
    try:
        for r in range(args.rounds):
            print(f"== round {r + 1}/{args.rounds}", flush=True)
            for name in phases:
                t = time.perf_counter()
                print(f"  {name} ...", flush=True)
                for key, value in PHASE_FUNCS[name](o).items():
                    results.setdefault(key, []).append(value)
                print(f"  {name} done in {time.perf_counter() - t:.1f}s", flush=True)
    except BaseException:
        kill_all()
        raise
    finally:
        kill_all()
        stop_kafka()
        with contextlib.suppress(Exception):
            reset()
    elapsed = time.perf_counter() - started
    body = table(results, o)
    text = (f"# jobs-engine bench\n\n{info}; database {connection.settings_dict['NAME']}; "
            f"phases {','.join(phases)}; total {elapsed:.0f}s\n\n{body}\n\n"
            f"{notes(results, o, args.rounds)}\n")
    print("\n" + text)
    Path(args.output).write_text(text)
    Path(args.output).with_suffix(".json").write_text(json.dumps(
        {"machine": info, "options": o.__dict__, "results": results}, indent=1))
    print(f"written {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
