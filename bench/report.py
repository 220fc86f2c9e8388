"""The bench's report: the rows (label, unit, the issue's bar, the docs' target, the peers'
figures), the Markdown table of medians, the notes on method, the machine line, and the files
``<output>.md`` and ``<output>.json``. Import after ``django.setup()`` (the machine line asks
the database for its version).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import django
from django.db import connection

from bench import targets
from bench import tasks as tasks_phase
from bench.harness import E100_KEYS, KAFKA_PARTITIONS, Options, shown, sql
from jobs_engine import store
from jobs_engine.tasks import TASKS_POLICY

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
        Row("e100_keyed", f"E100 keyed: the same, each job one of {E100_KEYS:,} keys", "jobs/s"),
        Row("e100_tenant", "E100 of a tenant: the same, every job the request's tenant's",
            "jobs/s"),
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
    wait_ms = f"{targets.LONG_WAIT_S * 1000:g} ms"
    for kind, what, n in (("d1_long", "", o.long_n),
                          ("d1_long_wait", f", a handler that waits {wait_ms}", o.long_wait_n)):
        for count in (1, 3):
            workers = f"{count} worker{'s' if count > 1 else ''}"
            rows += [
                Row(f"{kind}:{count}", f"D1 long lane{what}, {workers} ({n:,} jobs)", "jobs/s",
                    peers=PEER_D1 if count == 1 and not what else ""),
                Row(f"{kind}:{count}:busy", f"  machine CPU busy during it ({workers})", "%"),
                Row(f"{kind}:{count}:lock", "  running sessions waiting on a lock "
                    f"({workers})", "%"),
            ]
        rows.append(Row(f"{kind}:ratio", f"D1 long lane{what}, 3 workers / 1", "x",
                        "≥ 2x", lambda v: v >= 2))
    lat_what = f"{o.lat_n} jobs at {o.lat_rate:g}/s"
    rows += [
        Row("lat:notify:p50", f"L p50, NOTIFY ({lat_what})", "ms", "≤ 20 ms", lambda v: v <= 20,
            "≤ 2 ms", "raw LISTEN/NOTIFY 0.6; django-q2 Redis 0.7; Celery 0.8; Procrastinate "
            "2.4; django-q2 ORM 51.9; django-tasks-db 528 (1 s poll)"),
        Row("lat:notify:p99", "L p99, NOTIFY", "ms", "", None, "≤ 5 ms",
            "raw 0.9; django-q2 Redis 1.0; Celery 1.6; Procrastinate 3.7; django-q2 ORM 102.5; "
            "django-tasks-db 993"),
        Row("lat:sparse:fast:p50", f"L p50, NOTIFY, sparse events ({o.lat_sparse_n} at "
            f"{o.lat_sparse_rate:g}/s, the worker idle between), fast lane", "ms"),
        Row("lat:sparse:fast:p99", "L p99, NOTIFY, sparse events, fast lane", "ms"),
        Row("lat:sparse:long:p50", "L p50, NOTIFY, sparse events, long lane", "ms"),
        Row("lat:sparse:long:p99", "L p99, NOTIFY, sparse events, long lane", "ms"),
        Row("lat:poll:p50", "L p50, polling only (JOBS_NOTIFY=off, IDLE_POLL_S default 1,2,5)",
            "ms", peers="django-tasks-db 528 (1 s poll); django-q2 ORM 51.9"),
        Row("lat:poll:p99", "L p99, polling only", "ms",
            peers="django-tasks-db 993; django-q2 ORM 102.5"),
        Row("poll:small", f"fast poll, {o.poll_small:,} PENDING (21 partitions, limit 100)", "ms"),
        Row("poll:big", f"fast poll, {o.poll_big:,} PENDING", "ms"),
        Row("poll:ratio", "fast poll ratio big / small", "x", "≤ 2x", lambda v: v <= 2),
        Row("poll:small_full", f"fast poll, {o.poll_small:,} PENDING, one version per key "
            "(a full window: as many rows handed as the big poll)", "ms"),
        Row("poll:ratio_full", "fast poll ratio big / small, the same rows handed", "x"),
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
    for lane in ("fast", "long"):
        rows += [
            Row(f"memory:{lane}:small", f"{lane}-lane worker RSS after {o.memory_small:,} jobs",
                "MB"),
            Row(f"memory:{lane}:big", f"{lane}-lane worker RSS after {o.memory_big:,} jobs",
                "MB"),
            Row(f"memory:{lane}:ratio", f"{lane}-lane worker RSS ratio big / small", "x",
                "≤ 1.1x", lambda v: v <= 1.1),
        ]
    rows += policy_rows(o)
    rows += flow_rows(o)
    rows += shape_rows(o)
    rows += limit_rows(o)
    rows += task_rows(o)
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
        Row("kafka_database_part", "  The same rows into a no-op batch handler of the Kafka "
            "targets' BATCH_SIZE, 1 worker (the database's part of the chain alone)", "jobs/s"),
    ]
    for kind in targets.KAFKA_TOPICS:
        for count in (1, 3):
            rows.append(Row(
                f"kafka_ratio:{kind}:{count}", f"Kafka ratio fast lane / raw producer, {kind}, "
                f"{workers[count]}", "x", "≥ 0.25x" if count == 1 else "",
                (lambda v: v >= 0.25) if count == 1 else None))
    rows.append(Row("kafka_ratio:database_part", "Kafka ratio no-op batch handler (the "
                    "database's part alone) / raw producer, 1 worker: the most a worker "
                    "could reach", "x"))
    return rows


def policy_rows(o: Options) -> list[Row]:
    """The ``policies`` phase: keeping completed jobs (DEFAULT_POLICY, 100) against none."""
    rows = [Row(f"policy_e100:{label}", f"Policies: E100 ({o.e100_n:,} jobs), target {label}",
                "jobs/s") for label in ("keeps 100", "keeps none")]
    rows.append(Row("policy_e100:ratio", "Policies: E100 ratio keeps 100 / keeps none", "x"))
    for kind in targets.FAST_KINDS:
        rows += [Row(f"policy_d1:{kind}:{label}", f"Policies: D1 {kind}, 1 worker, target "
                     f"{label}", "jobs/s") for label in ("keeps 100", "keeps none")]
        rows.append(Row(f"policy_d1:{kind}:ratio", f"Policies: D1 {kind} ratio keeps 100 / "
                        "keeps none", "x"))
    kept = f"{o.policy_done_n:,} completed jobs kept"
    rows += [
        Row("policy_done:poll_none", f"fast poll, {o.poll_small:,} PENDING, no completed job "
            "kept", "ms"),
        Row("policy_done:poll_kept", f"fast poll, {o.poll_small:,} PENDING, {kept}", "ms"),
        Row("policy_done:poll_ratio", f"fast poll ratio, {kept} / none", "x", "≤ 1.2x",
            lambda v: v <= 1.2),
        Row("policy_done:long_none", "long reserve candidates, no completed job kept", "ms"),
        Row("policy_done:long_kept", f"long reserve candidates, {kept}", "ms"),
        Row("policy_done:long_ratio", f"long reserve ratio, {kept} / none", "x", "≤ 1.2x",
            lambda v: v <= 1.2),
    ]
    return rows


def shape_rows(o: Options) -> list[Row]:
    """The ``shapes`` phase (``bench/shapes.py``): idle targets, a web tier, an old snapshot."""
    rows: list[Row] = []
    base = o.shapes_idle[0]
    idle = [
        ("fast", f"D1 fast lane, at-least-once, 1 worker ({o.shapes_fast_n:,} jobs)", "jobs/s",
         True),
        ("long", f"D1 long lane, 1 worker ({o.shapes_long_n:,} jobs)", "jobs/s", True),
        ("lat_fast_p50", f"wake-up L p50, fast lane ({o.shapes_lat_n} jobs, idle worker)",
         "ms", True),
        ("lat_fast_p99", "wake-up L p99, fast lane", "ms", False),
        ("lat_long_p50", f"wake-up L p50, long lane ({o.shapes_lat_n} jobs)", "ms", True),
        ("lat_long_p99", "wake-up L p99, long lane", "ms", False),
        ("lat_fast_at_least_once_p50", f"wake-up L p50, fast lane at least once "
         f"({o.shapes_lat_n} jobs; its mark's commit does not wait for the flush)", "ms", False),
        ("lat_fast_at_least_once_p99", "wake-up L p99, fast lane at least once", "ms", False),
        ("poll_ms", f"fast poll as a worker runs it between deep reads, {o.shapes_fast_n:,} "
         f"PENDING of one target (median of {o.shapes_poll_reps})", "ms", True),
        ("deep_ms", "the deep read once a POLL_S (every target, from its first row)", "ms",
         True),
        ("walk_ms", "the worker's backlog walk (once a POLL_S: the targets its poll read "
         "nothing of)", "ms", True),
        ("cost", "  the read's plan: the planner's cost (jit_above_cost: 100,000)", "cost",
         False),
        ("plan_ms", "  the read's planning time (EXPLAIN ANALYZE)", "ms", False),
        ("exec_ms", "  the read's execution time (EXPLAIN ANALYZE)", "ms", False),
        ("jit_ms", "  of which JIT compilation", "ms", False),
        ("poll_generic_jit_ms", "  the poll's generic plan (a prepared statement's after "
         "five runs): JIT compilation", "ms", False),
        ("walk_jit_ms", "  the backlog walk: JIT compilation", "ms", False),
    ]
    for what, label, unit, ratio in idle:
        for n in o.shapes_idle:
            rows.append(Row(f"shapes:idle:{n}:{what}", f"Shapes, idle targets: {label}, "
                            f"{n:,} idle targets per lane", unit))
        if ratio:
            rows += [Row(f"shapes:idle:{n}:{what}:ratio", f"  ratio {n:,} idle targets / "
                         f"{base:,}, same round", "x") for n in o.shapes_idle[1:]]
    kinds = {"engine": "jobs_engine.enqueue, autocommit",
             "engine_prepared": "jobs_engine.enqueue, autocommit, Django's prepared "
                                "statements on (OPTIONS prepare_threshold 5)",
             "engine_worker": "jobs_engine.enqueue, autocommit, a fast-lane worker serving "
                              "(at-least-once no-op)",
             "raw_insert": "raw INSERT, autocommit",
             "raw_insert_notify": "raw INSERT + SELECT pg_notify, one transaction",
             "raw_insert_notify_1": "raw INSERT + pg_notify in one statement, autocommit"}
    web = f"{o.shapes_web_n:,} jobs one per commit"
    for procs in o.shapes_web_procs:
        who = f"{procs} process{'es' if procs > 1 else ''}"
        rows += [Row(f"shapes:web:{kind}:{procs}", f"Shapes, web tier: {who}, {web}, {label}",
                     "jobs/s") for kind, label in kinds.items()]
        rows += [Row(f"shapes:web:{kind}:{procs}:cpu", f"  the machine's CPUs busy, {who}, "
                     f"{label}", "%") for kind, label in kinds.items()]
        rows += [
            Row(f"shapes:web:ratio_notify:{procs}", f"  ratio engine / raw INSERT+NOTIFY "
                f"(one transaction), {who}", "x"),
            Row(f"shapes:web:ratio_notify_1:{procs}", f"  ratio engine / raw INSERT+NOTIFY "
                f"(one statement), {who}", "x"),
            Row(f"shapes:web:ratio_insert:{procs}", f"  ratio engine / raw INSERT, {who}",
                "x"),
            Row(f"shapes:web:ratio_notify:prepared:{procs}", f"  ratio engine, prepared "
                f"statements on / raw INSERT+NOTIFY (one transaction), {who}", "x"),
            Row(f"shapes:web:ratio_notify:worker:{procs}", f"  ratio engine with a worker / "
                f"raw INSERT+NOTIFY (one transaction), {who}", "x"),
            Row(f"shapes:web:ratio_insert:worker:{procs}", f"  ratio engine with a worker / "
                f"raw INSERT, {who}", "x"),
            Row(f"shapes:web:asked:{procs}", f"  the worker's asks to be woken, {who}",
                "asks"),
        ]
    for procs in o.shapes_web_procs[1:]:
        rows += [Row(f"shapes:web:{kind}:{procs}:scale", f"Shapes, web tier: {procs} "
                     f"processes / {o.shapes_web_procs[0]}, {label}", "x")
                 for kind, label in kinds.items()]
    drains = range(1, o.shapes_xmin_drains + 1)
    for lane, what in (("fast", "fast lane, at-least-once"),
                       ("long", "long lane, at-least-once")):
        head = f"Shapes, old snapshot: D1 {what}, 1 worker ({o.shapes_xmin_n:,} jobs)"
        for series, label in (("none", "no snapshot held"), ("held", "a snapshot held")):
            rows += [Row(f"shapes:xmin:{lane}:{series}:{i}", f"{head}, {label}, drain {i}",
                         "jobs/s") for i in drains]
        rows += [Row(f"shapes:xmin:{lane}:ratio:{i}", f"  ratio held / none, {what}, drain "
                     f"{i}", "x") for i in drains]
        statement = "fast poll" if lane == "fast" else "long reserve"
        for name, where in (("poll_empty", "the empty queue"),
                            ("poll_rows", f"{o.shapes_poll_n:,} PENDING"),
                            ("deep_empty", "the empty queue, from the first row (once a "
                                           "POLL_S)"),
                            ("deep_rows", f"{o.shapes_poll_n:,} PENDING, from the first row")):
            rows += [
                Row(f"shapes:xmin:{lane}:{series}:{name}", f"Shapes, old snapshot: {statement} "
                    f"after the drains, {where}, {label} (median of {o.shapes_poll_reps})",
                    "ms") for series, label in (("none", "no snapshot"),
                                                ("held", "the snapshot held"))]
            rows.append(Row(f"shapes:xmin:{lane}:{name}:ratio", f"  ratio held / none, "
                            f"{statement}, {where}", "x"))
        for series, label in (("none", "no snapshot"), ("held", "the snapshot held")):
            rows += [
                Row(f"shapes:xmin:{lane}:{series}:size_jobs", "Shapes, old snapshot: the jobs "
                    f"table and its indexes after the {what} drains, {label}", "kB"),
                Row(f"shapes:xmin:{lane}:{series}:unremovable_jobs", "  dead row versions of "
                    f"the jobs table a VACUUM then could not remove, {label}", "rows"),
                Row(f"shapes:xmin:{lane}:{series}:unremovable_partitions", "  the same of the "
                    f"partitions table, {label}", "rows"),
            ]
    return rows


def limit_rows(o: Options) -> list[Row]:
    """The ``limits`` phase (``bench/limits.py``): limits that never bind against none, a
    limit that binds against as many running at once without it, the admission's poll
    against the backlog."""
    w = o.limits_workers
    rows: list[Row] = []
    loose = f"Concurrency({targets.LOOSE_SLOTS:,})"
    labels = {
        ("noop", "free"): f"{targets.LIMITS_FREE} (no limits)",
        ("noop", "loose"): f"{targets.LIMITS_LOOSE} ({loose} for the target)",
        ("noop", "keyed"): f"{targets.LIMITS_LOOSE_KEYED} ({loose} per payload field "
                           f"{targets.LIMITS_KEY_FIELD}, {o.limits_keys:,} keys)",
        ("wait", "free"): f"{targets.LIMITS_FREE_WAIT} (no limits)",
        ("wait", "loose"): f"{targets.LIMITS_LOOSE_WAIT} ({loose} for the target)",
    }
    for kind, what, n, sides in (
            ("noop", "no-op", o.limits_n, ("free", "loose", "keyed")),
            ("wait", f"a handler that waits {targets.LONG_WAIT_S * 1000:g} ms", o.limits_wait_n,
             ("free", "loose"))):
        head = f"Limits, not binding: D1 long lane, {what}, {w} workers ({n:,} jobs)"
        for side in sides:
            key = f"limits:nb:{kind}:{side}"
            rows += [
                Row(f"{key}:rate", f"{head}, {labels[(kind, side)]}", "jobs/s"),
                Row(f"{key}:cpu_us", f"  the database's CPU per job, {side}", "µs/job"),
                Row(f"{key}:stmts", f"  the workers' statements per job, {side}", "stmts/job"),
                Row(f"{key}:admission", f"  the admission's statements per job, {side}",
                    "stmts/job"),
                Row(f"{key}:admission_ms", f"  the admission's statements' time per job, "
                    f"waited in the workers, {side}", "ms"),
                Row(f"{key}:busy", f"  the machine's CPUs busy, {side}", "%"),
                Row(f"{key}:lock", f"  the workers' running statements waiting on a lock "
                    f"(pg_stat_activity, sampled), {side}", "%"),
            ]
        for side in sides[1:]:
            bar = "≥ 0.9x" if side == "loose" else "(≥ 0.9x)"
            rows += [
                Row(f"limits:nb:{kind}:{side}:ratio", f"Limits, not binding, {what}: ratio "
                    f"{side} / free, jobs/s, same round", "x", bar, lambda v: v >= 0.9),
                Row(f"limits:nb:{kind}:{side}:cpu_ratio", f"  ratio {side} / free, the "
                    "database's CPU per job", "x"),
            ]
    tw = o.limits_tight_workers
    n = o.limits_tight_n
    wait = f"a handler that waits {targets.LONG_WAIT_S * 1000:g} ms"
    for side, label in (
            ("free", f"{targets.LIMITS_FREE_WAIT}, no limit, 1 worker with JOBS_LONG_BATCH=2 "
                     "(2 running at once)"),
            ("tight", f"{targets.LIMITS_TIGHT}, Concurrency({targets.TIGHT_SLOTS}) for the "
                      f"target, {tw} workers")):
        key = f"limits:bind:{side}"
        rows += [
            Row(f"{key}:rate", f"Limits, binding: D1 long lane, {wait}, {n:,} jobs, {label}",
                "jobs/s"),
            Row(f"{key}:cpu_us", f"  the database's CPU per job, {side} (its client backends' "
                "CPU time, /proc/<pid>/schedstat)", "µs/job"),
            Row(f"{key}:stmts", f"  the workers' statements per job, {side}", "stmts/job"),
            Row(f"{key}:admission", f"  the admission's statements per job, {side}",
                "stmts/job"),
            Row(f"{key}:admission_ms", f"  the admission's statements' time per job, "
                f"waited in the workers, {side}", "ms"),
            Row(f"{key}:running_max", f"  the most rows RUNNING at once seen, {side}", "rows"),
            Row(f"{key}:busy", f"  the machine's CPUs busy, {side}", "%"),
            Row(f"{key}:lock", f"  the workers' running statements waiting on a lock, {side}",
                "%"),
        ]
    rows += [
        Row("limits:bind:cpu_ratio", "Limits, binding: ratio tight / free, the database's CPU "
            "per job, same round", "x", "≤ 1.5x", lambda v: v <= 1.5),
        Row("limits:bind:stmts_ratio", "  ratio tight / free, the workers' statements per job",
            "x"),
        Row("limits:bind:rate_ratio", "  ratio tight / free, jobs/s", "x"),
    ]
    small, big = f"{o.limits_poll_small:,}", f"{o.limits_poll_big:,}"
    reps = o.limits_poll_reps
    for case, label, bar in (
            ("held", f"the admission ({targets.LIMITS_TIGHT}), its {targets.TIGHT_SLOTS} slots "
                     "held: nothing admitted", "≤ 1.2x"),
            ("free", f"the admission ({targets.LIMITS_TIGHT}), its slots free: "
                     f"{targets.TIGHT_SLOTS} admitted", "(≤ 1.2x)"),
            ("keyed", f"the admission ({targets.LIMITS_TIGHT_KEYED}), one key with the backlog "
                      "and its slots held, another key with one row: that row admitted",
             "(≤ 1.2x)"),
            ("reserve", "the same worker's free targets' reserve (finds nothing)", ""),
            ("next_due", "the same worker's look for the next due row", ""),
            ("empty", "the worker's whole empty poll (admission, slots held + reserve + next "
                      "due)", "(≤ 1.2x)")):
        rows += [
            Row(f"limits:poll:{case}:small", f"Limits, poll: {label}, {small} PENDING of the "
                f"target (median of {reps})", "ms"),
            Row(f"limits:poll:{case}:big", f"Limits, poll: {label}, {big} PENDING (median of "
                f"{reps}, or of the calls made in {o.limits_poll_budget_s:g} s, 5 at least)",
                "ms"),
            Row(f"limits:poll:{case}:ratio", f"  ratio {big} / {small}, {case}", "x", bar,
                (lambda v: v <= 1.2) if bar else None),
            Row(f"limits:poll:{case}:small:cpu_us", f"  the database's CPU per call, {case}, "
                f"{small} PENDING (this session's backend, /proc/<pid>/schedstat)", "µs/call"),
            Row(f"limits:poll:{case}:big:cpu_us", f"  the database's CPU per call, {case}, "
                f"{big} PENDING", "µs/call"),
            Row(f"limits:poll:{case}:cpu_us:ratio", f"  ratio {big} / {small}, the database's "
                f"CPU per call, {case}", "x"),
        ]
        if case in ("held", "free", "keyed"):
            rows += [
                Row(f"limits:poll:{case}:due_keys:small", f"  of it the key skip scan, {case}, "
                    f"{small} PENDING (mean per call)", "ms"),
                Row(f"limits:poll:{case}:due_keys:big", f"  of it the key skip scan, {case}, "
                    f"{big} PENDING", "ms"),
                Row(f"limits:poll:{case}:due_keys:ratio", f"  ratio {big} / {small}, the key "
                    f"skip scan, {case}", "x"),
                Row(f"limits:poll:{case}:admit:ratio", f"  ratio {big} / {small}, the "
                    f"admission's call (locks, count, take, write), {case}", "x"),
            ]
    return rows


def flow_rows(o: Options) -> list[Row]:
    """The ``flows`` phase: a chain and a batch per step against plain long-lane jobs."""
    rows = []
    for kind, steps in (("chain", f"{o.flow_chain_n:,} steps"),
                        ("batch", f"{o.flow_batch_n:,} jobs and a callback")):
        rows += [
            Row(f"flow:{kind}:rate", f"Flows: {kind} of {steps}, 1 long-lane worker",
                "jobs/s"),
            Row(f"flow:{kind}:plain", "  as many plain long-lane jobs, 1 worker, same round",
                "jobs/s"),
            Row(f"flow:{kind}:overhead_ms", f"Flows: {kind}, time per step over a plain job",
                "ms"),
            Row(f"flow:{kind}:write_ms", f"Flows: {kind}, writing the flow (one transaction)",
                "ms"),
        ]
    return rows


def task_columns(o: Options) -> list[tuple[str, str, str]]:
    """The ``tasks`` phase's measurements: (metric, heading, unit)."""
    return [
        ("e1", f"E1: {o.tasks_e1_n:,} tasks, 1 per tx", "jobs/s"),
        ("e100", f"E100: {o.tasks_n:,} tasks, 100 per tx", "jobs/s"),
        ("drain", f"drain {o.tasks_n:,}, 1 worker, from its spawn", "jobs/s"),
        ("drain_first", "drain, from the first progress", "jobs/s"),
        ("lat_p50", f"L p50 ({o.tasks_lat_n} tasks, idle worker)", "ms"),
        ("lat_p99", "L p99", "ms"),
    ]


TASK_SYSTEMS = (("ours", "ours"), ("theirs", "django-tasks-db"),
                ("ratio", "ratio ours / theirs"))


def task_rows(o: Options) -> list[Row]:
    """The ``tasks`` phase, one row per measurement and system (the side-by-side table is
    ``tasks_table``)."""
    return [Row(f"tasks:{metric}:{system}", f"Tasks API: {heading}, {label}",
                "x" if system == "ratio" else unit)
            for metric, heading, unit in task_columns(o) for system, label in TASK_SYSTEMS]


def tasks_table(results: dict[str, list[float]], o: Options) -> str:
    """The ``tasks`` phase side by side: a row per system, a column per measurement
    (medians over the rounds; the ratio is the median of the rounds' own ratios); empty
    when the phase did not run."""
    if not any(key.startswith("tasks:") for key in results):
        return ""
    columns = task_columns(o)
    systems = {
        "ours": "ours: `jobs_engine.tasks.JobsEngineBackend`, worker `manage.py "
                f"{tasks_phase.OURS_WORKER}`",
        "theirs": f"theirs: django-tasks-db {tasks_phase.theirs_version()} "
                  "`django_tasks_db.DatabaseBackend`, worker `manage.py "
                  f"{tasks_phase.THEIRS_WORKER} {' '.join(tasks_phase.THEIRS_WORKER_ARGS)}`",
        "ratio": "ratio ours / theirs",
    }
    lines = ["| Django Tasks API | " + " | ".join(f"{heading} ({unit})"
                                                  for _, heading, unit in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for system, label in systems.items():
        cells = []
        for metric, _, unit in columns:
            values = results.get(f"tasks:{metric}:{system}")
            cells.append(fmt(statistics.median(values), "x" if system == "ratio" else unit)
                         if values else "")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fmt(value: float, unit: str) -> str:
    if value != value:  # NaN
        return "n/a"
    if unit == "jobs/s" and abs(value) < 10:  # a drain that hardly moved (limits: per key)
        return f"{value:.2f}"
    if unit in ("jobs/s", "rows", "kB", "cost", "µs/job", "µs/call"):
        return f"{value:,.0f}"
    if unit == "x":  # a ratio far below 1 (the tasks phase's latencies) keeps 2 digits
        return f"{value:.2f}x" if abs(value) >= 0.1 else f"{value:.2g}x"
    return f"{value:.2f}"


def table(results: dict[str, list[float]], o: Options) -> str:
    lines = ["| metric | ours (median) | min-max | every run | unit | issue bar | "
             "docs/benchmarks.md target | peers (docs/benchmarks.md) |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows_for(o):
        values = results.get(row.key)
        if not values:
            continue
        median = statistics.median(values)
        spread = (f"{fmt(min(values), row.unit)}-{fmt(max(values), row.unit)}"
                  if len(values) > 1 else "")
        runs = " / ".join(fmt(value, row.unit) for value in values)  # in round order
        bar = row.bar
        if row.passes is not None:
            bar += " PASS" if row.passes(median) else " **FAIL**"
        lines.append(f"| {row.label} | {fmt(median, row.unit)} | {spread} | {runs} | "
                     f"{row.unit} | {bar} | {row.target} | {row.peers} |")
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
            "target; the sparse rows also the long lane (a worker of each, in turn).")
    if measured("poll:"):
        out.append(
            "- Poll cost: the worker's poll statement (store.jobs_fast_poll, prepared), "
            "partitions 0-20, limit 100, after VACUUM ANALYZE; plans in "
            f"{shown(o.results_dir / 'explain_fast_poll.txt')}.")
    if measured("policy"):
        out.append(
            "- Policies: the same no-op targets under DEFAULT_POLICY (keeps the newest 100 "
            "completed jobs: a send moves at most 100 rows to the completed jobs' table and "
            "deletes the rest) and under JobPolicy(keep_completed=0) (a send deletes them), "
            "measured one after the other in each round. Completed jobs kept: written in one "
            "INSERT ... SELECT into the completed jobs' table, then VACUUM ANALYZE, with the "
            "same PENDING backlog before and after.")
    if measured("flow:"):
        out.append(
            "- Flows: no-op steps on the engine's flow target (long lane), one run_long_lane "
            "worker started first; clock from the flow's write (timed apart) to its "
            "COMPLETED state, polled every 20 ms. Plain: the D1 drain of as many no-op "
            "long-lane jobs, same round. Overhead: time per step minus time per plain job.")
    if measured("tasks:"):
        out.append(
            "- Tasks API: both backends in the same run, each measurement for one system then "
            "the other (which goes first alternates by round); the TASKS aliases `ours` and "
            "`theirs` of bench/settings.py, one queue `default` each, their defaults otherwise "
            f"(ours: TASKS_POLICY, at-least-once, keeps {TASKS_POLICY.keep_completed:,} completed; "
            "theirs keeps every "
            "result). E1/E100: `noop.using(backend=...).enqueue()` in this process, 1 or 100 "
            "calls per `transaction.atomic()`. Drain: the E100 tasks, ANALYZEd, then one "
            f"worker spawned; clock from its spawn (start-up included: Django's, and "
            "db_worker's own random start-up delay of up to 1 s, one of its defaults) until "
            "no task is READY or RUNNING, polled every "
            f"{o.drain_poll_s * 1000:.0f} ms; \"from the first progress\" as D1. Checked after "
            "each drain: theirs, every row SUCCESSFUL; ours, the queue's runs that ended OK in "
            "the engine's statistics, no DEAD job, the newest results read SUCCESSFUL through "
            "the backend. Ours' worker: run_long_lane with JOBS defaults (LONG_BATCH 10 "
            "threads, LISTEN/NOTIFY on PostgreSQL), log level "
            f"{o.log_level}; theirs: db_worker's defaults (--interval 1, start-up delay on, "
            "verbosity 1, no --reload with DEBUG off) plus --backend/--queue-name. Latency: "
            f"idle worker, {o.tasks_lat_n} tasks {o.tasks_lat_pause_s * 1000:g} ms apart, "
            "each in its own transaction; the task's first statement appends time.time() to "
            "a file, minus time.time() right after the commit. Ratios: ours / theirs per "
            "round, their median (in ms columns below 1 means ours is faster).")
    if measured("kafka"):
        out.append(
            f"- Kafka: a real Apache Kafka broker (scripts/kafka.sh, one node, loopback), "
            f"topics of {KAFKA_PARTITIONS} partitions; the targets' producer config (acks=all, "
            "retries off, linger default). Fast lane: as D1 (real run_fast_lane processes, "
            "clock from first progress to an empty queue); a row is deleted only after its "
            "delivery report, and the topic's end offsets are checked after each drain. Raw "
            "producer: same records (key, JSON value, event_id/trace_id/traceparent headers) "
            "in this process after a warm-up message. Ratio: per round, fast lane / raw "
            "produce-all-then-flush. The database's part: the same rows drained by one "
            "run_fast_lane into a no-op batch handler taking the Kafka targets' BATCH_SIZE "
            "per send, as with a broker that cost nothing.")
    if measured("shapes:"):
        out.append(shape_notes(o))
    if measured("limits:"):
        out.append(limit_notes(o))
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


def shape_notes(o: Options) -> str:
    base = o.shapes_idle[0]
    return (
        "- Shapes (bench/shapes.py), each against a reference of the same round, the order "
        "of the levels and series turned by round. Idle targets: "
        f"JOBS_BENCH_IDLE_TARGETS=N registers N no-op fast-lane targets bench.idle.fast.<i> "
        "and N long-lane ones bench.idle.long.<i> in the workers, and the bench process "
        "registers the same; nothing is enqueued to them. D1 as above (harness.drain, one "
        "worker spawned on the filled queue); wake-up L as the latency rows, NOTIFY on, "
        f"{o.shapes_lat_n} jobs at {o.lat_rate:g}/s, for an idle run_fast_lane and an idle "
        f"run_long_lane; the fast poll: store.jobs_fast_poll with every registered fast "
        f"target's limit over all partitions, {o.shapes_fast_n:,} PENDING rows of one "
        "target, after ANALYZE, prepared as in a worker (its owner holds no partition, so "
        "it marks nothing); plans of the read (store.jobs_fast_due) and of the poll in "
        f"{shown(o.results_dir / 'explain_shapes_targets.txt')}. Ratios: N idle / {base} "
        "idle of the same round (in ms rows above 1 is slower). "
        "Web tier: P processes forked from the bench process (Django's connections closed "
        "first), each connected and warmed up by one row, released together by a barrier; "
        f"{o.shapes_web_n:,} jobs in all, each its own commit; rate = jobs / wall time from "
        "the barrier to the last process joined; once with no worker running (no enqueue "
        "finds one waiting), once with a run_fast_lane serving the jobs (it asks to be "
        "woken whenever it runs out); a CHECKPOINT before each run; rows checked after it. "
        "Raw: "
        "psycopg, table scale_raw (id bigserial, payload jsonb, created_at timestamptz "
        "default now()), the same payload. "
        "Old snapshot: another session runs SET TRANSACTION ISOLATION LEVEL REPEATABLE READ "
        "and SELECT count(*) of the jobs table before the first fill and keeps its "
        f"transaction open through {o.shapes_xmin_drains} drains of {o.shapes_xmin_n:,} "
        "jobs (each: rows committed in one transaction, ANALYZE, one worker spawned, clock "
        "as D1), nothing truncated or vacuumed between them; the same without it; the "
        "fast lane on bench.noop_at_least_once, the long lane on "
        "bench.long_noop_at_least_once. After the last drain, the snapshot still held: "
        "the lane's statement timed on the empty queue and on "
        f"{o.shapes_poll_n:,} PENDING rows (after ANALYZE): the fast poll as above; the "
        "long reserve as an idle worker's (store.jobs_long_reserve, every registered long "
        "target, LONG_BATCH rows), prepared, in autocommit as the worker runs it, the rows it "
        "reserved put back after each run, untimed. "
        "Sizes: pg_total_relation_size after the drains; then, the snapshot still held, a "
        "VACUUM of the table and its n_dead_tup: the dead row versions it could not remove. "
        "The engine's tables are vacuumed after a held series.")


def limit_notes(o: Options) -> str:
    return (
        "- Limits (bench/limits.py), each against the same work without limits in the same "
        "round, the order of the series turned by round. Drains as D1 with several workers, "
        "for any count (limits.limits_drain: the workers registered first, then the rows "
        "committed in one transaction; clock from the first progress to an empty queue, or "
        f"to {o.limits_cap_s:g} s after it: a drain stopped then is measured on the rows it "
        "drained, its rows left said in the run's output and the JSON); each worker "
        "registers the bench's targets, the free limits targets and only the limited one "
        "it drains (BENCH_LIMITS), so a free series runs no admission at all. The database's "
        "CPU: the CPU time (/proc/<pid>/schedstat) of every client backend of the bench "
        "database but the bench's own session, from the first progress to the empty queue "
        "(a backend made meanwhile counts from 0), per job drained; autovacuum and the "
        "server's other processes are not in it, nor other databases' backends. Statements: "
        "counted in the workers by an execute wrapper on every Django connection "
        "(bench/sqlcount.py; BEGIN/COMMIT not counted), read at the first progress and at the "
        "end; admission's: the statements of store.jobs_long_reserve_limited (due keys or "
        "targets, read buckets, running, the admission's call, held back), with the time the "
        "workers waited for them (lock waits included). Poll: in the bench process, "
        "store.jobs_long_reserve_limited as an idle worker calls it (LONG_BATCH rows, every "
        "thread idle, autocommit, prepared), after 5 untimed calls, the rows it admitted put "
        "back after each call, untimed; the layout built with generate_series (due an hour "
        "ago, in id order; the slots held by RUNNING rows under an hour's lease), then VACUUM "
        f"ANALYZE; plans in {shown(o.results_dir / 'explain_limits.txt')}.")


def write(output: Path, text: str, info: str, o: Options,
          results: dict[str, list[float]]) -> None:
    """The table and notes to ``output``, the raw values (every round's) beside it as JSON."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    # Not the results directory: a path of this machine (the JSON lies in it anyway).
    options = {k: v for k, v in asdict(o).items() if k != "results_dir"}
    output.with_suffix(".json").write_text(json.dumps(
        {"machine": info, "options": options, "results": results}, indent=1))
