"""The bench's phases: each takes the run's ``Options`` and returns its metrics (name ->
value; ``bench/report.py`` turns them into rows). Definitions: docs/benchmarks.md#definitions.

- ``e100``, ``e1``: enqueue rates in this process, beside raw psycopg (``bench/baselines.py``);
- ``d1``, ``long``: drains by 1 and 3 real worker processes (``harness.drain``), beside raw
  psycopg's ``DELETE ... SKIP LOCKED``;
- ``latency``: handler start minus the enqueue's return, with NOTIFY and polling only;
- ``poll``: the poll's cost against the backlog's size (``bench/poll_cost.py``);
- ``kafka``: fast lane into a real broker, beside the raw ``confluent_kafka`` producer (one
  topic keeps no completed job: the cost of keeping them);
- ``policies``: what keeping completed jobs costs (``bench/policies.py``);
- ``flows``: a chain's and a batch's cost per step against plain jobs (``bench/flows.py``);
- ``tasks``: Django's Tasks API on the engine against django-tasks-db (``bench/tasks.py``);
- ``profile`` (on request): the fast lane's loop in this process under cProfile.

Import after ``django.setup()``.
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import logging
import os
import pstats
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import connection

from bench import targets
from bench.baselines import raw_drain, raw_e1, raw_e100, raw_kafka
from bench.flows import phase_flows
from bench.harness import (
    E100_KEYS,
    DrainWatch,
    Metrics,
    Options,
    Workers,
    analyze,
    drain,
    enqueue_rate,
    fill,
    kafka_broker,
    kafka_end_offset,
    kafka_fill,
    partitions_balanced,
    payload,
    pct,
    read_starts,
    remaining,
    reset,
    running,
    shown,
    wait_for,
    workers_registered,
)
from bench.memory import phase_memory
from bench.policies import phase_policies
from bench.poll_cost import phase_poll
from bench.tasks import phase_tasks
from jobs_engine import store
from jobs_engine.conf import jobs_settings
from jobs_engine.enqueueing import enqueue
from jobs_engine.lanes.fast import FastLane
from jobs_engine.lanes.partitions import PartitionLeases, new_worker_id
from jobs_engine.lanes.pauses import PauseGate

# -- enqueue ---------------------------------------------------------------------------------


def phase_e100(o: Options) -> Metrics:
    reset()
    out = {"e100": enqueue_rate(targets.AT_MOST_ONCE, o.e100_n)}
    reset()
    out["e100_keyed"] = enqueue_rate(targets.AT_MOST_ONCE, o.e100_n, keys=E100_KEYS)
    reset()
    out["e100_tenant"] = enqueue_rate(targets.AT_MOST_ONCE, o.e100_n, tenant="bench-tenant")
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



# -- drains ----------------------------------------------------------------------------------


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
    """D1 on the long lane, 1 and 3 workers, for the no-op target and for one whose handler
    waits ``LONG_WAIT_S`` (a call to another service): how the machine's CPUs and the
    workers' sessions were busy (``DrainWatch``; a lock convoy on the reserve would show
    as ``Lock`` waits), and the ratio 3 workers / 1."""
    out: Metrics = {}
    for kind, target, n in (("d1_long", targets.LONG, o.long_n),
                            ("d1_long_wait", targets.LONG_WAIT, o.long_wait_n)):
        for count in (1, 3):
            watch = DrainWatch()
            r = drain(o, "run_long_lane", target, n, count, f"{kind}-{count}w",
                      lambda c=count: workers_registered(c), watch=watch)
            out[f"{kind}:{count}"] = r["rate"]
            out[f"{kind}:{count}:dead"] = r["dead"]
            out[f"{kind}:{count}:busy"] = watch.busy_percent()
            out[f"{kind}:{count}:lock"] = watch.share("Lock")
            print(f"    {kind} {count}w: {r['rate']:,.0f} jobs/s (drain {r['drain_s']:.2f}s, "
                  f"start-up {r['startup_s']:.2f}s, dead {r['dead']}); {watch.summary()}",
                  flush=True)
        out[f"{kind}:ratio"] = out[f"{kind}:3"] / out[f"{kind}:1"]
    return out


def latency_run(o: Options, mode: str, lane: str = "fast", *, sparse: bool = False
                ) -> tuple[float, float, int]:
    """L: one idle worker of ``lane`` (``fast``: run_fast_lane, ``long``: run_long_lane);
    ``lat_n`` jobs of its latency probe at ``lat_rate``/s, each its own commit (``sparse``:
    ``lat_sparse_n`` at ``lat_sparse_rate``/s, each finding the worker idle for seconds)."""
    target, command = targets.LATENCY_BY_LANE[lane]
    count, rate = (o.lat_sparse_n, o.lat_sparse_rate) if sparse else (o.lat_n, o.lat_rate)
    name = "-".join(["latency", *([lane] if lane != "fast" else []), mode,
                     *(["sparse"] if sparse else [])])
    reset()
    o.logs.mkdir(parents=True, exist_ok=True)
    lat_file = o.logs / f"{name}.task"
    lat_file.unlink(missing_ok=True)
    env = {targets.LAT_FILE_ENV: str(lat_file)}
    if mode == "poll":
        env["JOBS_NOTIFY"] = "off"
    tag = uuid.uuid4().hex[:8]
    after: dict[str, float] = {}
    workers = Workers(o, command, 1, name, env)
    with running(workers):
        warm = f"lat-warm-{tag}"
        enqueue(target, payload(-1), dedupe_key=warm)
        wait_for("warm-up job", lambda: warm in read_starts(lat_file), workers, timeout=60)
        time.sleep(2.0)  # idle and waiting
        started = time.perf_counter()
        for i in range(count):
            delay = started + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            key = f"lat-{tag}-{i}"
            enqueue(target, payload(i), dedupe_key=key)
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
    if store.is_postgres() and o.lat_sparse_n:
        for lane in ("fast", "long"):
            p50, p99, missing = latency_run(o, "notify", lane, sparse=True)
            out[f"lat:sparse:{lane}:p50"], out[f"lat:sparse:{lane}:p99"] = p50, p99
            out[f"lat:sparse:{lane}:missing"] = missing
            print(f"    L sparse {lane} lane: p50 {p50:.2f} ms, p99 {p99:.2f} ms, "
                  f"missing {missing}", flush=True)
    return out


# -- profile (on request: --only profile) ----------------------------------------------------


def phase_profile(o: Options) -> Metrics:
    """The fast lane's run_once loop in this process, one worker holding all partitions, per
    target kind: once plain (jobs/s, SQL statements per job), once under cProfile (written to
    ``<results>/profile_<target>.txt``)."""
    out: Metrics = {}
    with quiet_engine_log(o.log_level):
        for kind, target in targets.FAST_KINDS.items():
            plain = run_lane(target, o.d1_n)
            out[f"profile:{kind}:rate"] = plain.handed / plain.elapsed
            out[f"profile:{kind}:sql_per_job"] = plain.statements / max(plain.handed, 1)
            print(f"    in-process {kind}: {plain.handed / plain.elapsed:,.0f} jobs/s, "
                  f"{plain.statements / max(plain.handed, 1):.2f} SQL statements per job, "
                  f"{plain.polls} polls", flush=True)
            profiler = cProfile.Profile()
            path = write_profile(o, kind, target, run_lane(target, o.d1_n, profiler), profiler)
            print(f"    profile {kind}: written to {shown(path)}", flush=True)
    reset()
    return out


@dataclass
class LaneRun:
    handed: int
    polls: int
    elapsed: float
    statements: int


def run_lane(target: str, n: int, profiler: cProfile.Profile | None = None) -> LaneRun:
    """``n`` jobs of ``target`` drained by ``FastLane.run_once`` in this process (under
    ``profiler`` if given), every SQL statement counted."""
    reset()
    fill(target, n)
    analyze()
    settings = jobs_settings()
    worker_id = new_worker_id()
    leases = PartitionLeases(worker_id, settings)
    leases.heartbeat()
    lane = FastLane(worker_id, settings, leases, PauseGate(worker_id, settings))
    statements = 0

    def count(execute: Any, query: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal statements
        statements += 1
        return execute(query, params, many, context)

    handed = polls = 0
    started = time.perf_counter()
    with connection.execute_wrapper(count):
        if profiler:
            profiler.enable()
        while got := lane.run_once():
            polls += 1
            handed += got
        polls += 1  # the last, empty poll
        if profiler:
            profiler.disable()
    elapsed = time.perf_counter() - started
    leases.release_all()
    return LaneRun(handed, polls, elapsed, statements)


def write_profile(o: Options, kind: str, target: str, run: LaneRun,
                  profiler: cProfile.Profile) -> Path:
    buf = io.StringIO()
    # strip_dirs: file names only, no path of the machine that ran it
    stats = pstats.Stats(profiler, stream=buf).strip_dirs()
    stats.sort_stats("cumulative").print_stats(35)
    stats.sort_stats("tottime").print_stats(25)
    o.results_dir.mkdir(parents=True, exist_ok=True)
    path = o.results_dir / f"profile_{target.split('.')[-1]}.txt"
    path.write_text(f"# {kind}: {run.handed} jobs in {run.elapsed:.2f}s under cProfile, "
                    f"{run.polls} polls\n" + buf.getvalue())
    return path


@contextlib.contextmanager
def quiet_engine_log(level: str) -> Iterator[None]:
    """The engine's log at ``level`` into /dev/null while a lane runs in this process (the
    workers' log level, without the driver's console)."""
    logger = logging.getLogger("jobs_engine")
    old_level, old_handlers = logger.level, logger.handlers[:]
    with open(os.devnull, "w") as sink:
        logger.setLevel(level)
        logger.handlers = [logging.StreamHandler(sink)]
        try:
            yield
        finally:
            logger.handlers = old_handlers
            logger.setLevel(old_level)


# -- kafka: fast lane → a real broker, beside the raw producer -------------------------------


def phase_kafka(o: Options) -> Metrics:
    """Fast lane → Kafka end to end: ``kafka_n`` pre-enqueued events drained by 1 and 3
    ``run_fast_lane`` processes per delivery mode (a row is deleted only after its delivery
    report, so an empty queue means the broker acknowledged every record; the topic's end
    offsets are checked too), then the same rows into a no-op batch handler (the database's
    part of the chain alone), then the raw producer on the same records in the same round."""
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
    # The same rows into a no-op batch handler: what the database's part of the chain
    # allows, with a broker that would cost nothing (at most once, as ``bench.kafka``).
    r = drain(o, "run_fast_lane", targets.KAFKA_DATABASE_PART, o.kafka_n, 1,
              "kafka-database-part-1w", lambda: partitions_balanced(1), env=env,
              filler=lambda: kafka_fill(targets.KAFKA_DATABASE_PART, o.kafka_n, o.kafka_keys))
    out["kafka_database_part"] = r["rate"]
    print(f"    the same rows into a no-op batch handler, 1w: {r['rate']:,.0f} jobs/s "
          f"(drain {r['drain_s']:.2f}s, dead {r['dead']})", flush=True)
    topic = targets.kafka_topic("at-most-once")
    out["kafka_raw"] = raw_kafka(broker.bootstrap, topic, o.kafka_n, o.kafka_keys, None)
    out["kafka_raw:100"] = raw_kafka(broker.bootstrap, topic, o.kafka_n, o.kafka_keys, 100)
    for kind in targets.KAFKA_TOPICS:
        for count in (1, 3):
            out[f"kafka_ratio:{kind}:{count}"] = out[f"kafka:{kind}:{count}"] / out["kafka_raw"]
    out["kafka_ratio:database_part"] = out["kafka_database_part"] / out["kafka_raw"]
    print(f"    raw producer: {out['kafka_raw']:,.0f} msg/s produce-all-then-flush, "
          f"{out['kafka_raw:100']:,.0f} msg/s flushing every 100", flush=True)
    reset()
    return out


PHASE_FUNCS: dict[str, Callable[[Options], Metrics]] = {
    "e100": phase_e100, "e1": phase_e1, "d1": phase_d1, "long": phase_long,
    "latency": phase_latency, "poll": phase_poll, "profile": phase_profile,
    "kafka": phase_kafka, "policies": phase_policies, "flows": phase_flows,
    "tasks": phase_tasks, "memory": phase_memory,
}


