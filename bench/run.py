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

This file is the command line only: Django is set up in ``main`` (importing it sets nothing
up), then ``bench/harness.py`` (processes, database, drain clock, broker),
``bench/workloads.py`` (the phases, with ``poll_cost.py`` and the raw ``baselines.py``) and
``bench/report.py`` (the table and the files) do the work.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # ``python bench/run.py`` puts bench/ on the path, not the root
    sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from bench.harness import Options

RESULTS = ROOT / "bench" / "results"
PHASES = ("e100", "e1", "d1", "long", "latency", "poll", "kafka", "policies", "flows")
# On request only (tasks: bench/requirements-tasks.txt; memory: a few minutes, Linux;
# shapes: idle targets, a web tier, an old snapshot, ~5 minutes a round, PostgreSQL;
# limits: what a target's limits cost the long lane, ~3 minutes a round, PostgreSQL).
EXTRA_PHASES = ("profile", "tasks", "memory", "shapes", "limits")
KAFKA_DIR_DEFAULT = "<tmp>/jobs-engine-kafka-bench"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--only", default=",".join(PHASES),
                   help=f"comma list of {', '.join(PHASES + EXTRA_PHASES)}")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--e100-n", type=int, default=10_000)
    p.add_argument("--e1-n", type=int, default=2_000)
    p.add_argument("--d1-n", type=int, default=10_000)
    p.add_argument("--long-n", type=int, default=10_000)
    p.add_argument("--long-wait-n", type=int, default=3_000,
                   help="jobs of the long phase's waiting handler (20 ms each)")
    p.add_argument("--lat-n", type=int, default=200)
    p.add_argument("--lat-rate", type=float, default=20.0)
    p.add_argument("--lat-sparse-n", type=int, default=10,
                   help="latency samples of sparse events, per lane (0: none)")
    p.add_argument("--lat-sparse-rate", type=float, default=0.2,
                   help="their rate per second: each finds the worker idle for seconds")
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
    p.add_argument("--kafka-dir", default=None,
                   help=f"its data dir (JOBS_KAFKA_DIR; default {KAFKA_DIR_DEFAULT})")
    p.add_argument("--flow-chain-n", type=int, default=1_000, help="steps of the flows "
                   "phase's chain")
    p.add_argument("--flow-batch-n", type=int, default=10_000, help="jobs of the flows "
                   "phase's batch (and a callback)")
    p.add_argument("--tasks-e1-n", type=int, default=2_000, help="tasks phase: tasks "
                   "enqueued one per transaction")
    p.add_argument("--tasks-n", type=int, default=10_000, help="tasks phase: tasks enqueued "
                   "100 per transaction, then drained by one worker")
    p.add_argument("--tasks-lat-n", type=int, default=300, help="tasks phase: latency samples")
    p.add_argument("--tasks-lat-pause-ms", type=float, default=50, help="tasks phase: pause "
                   "between the latency samples' transactions")
    p.add_argument("--memory-small", type=int, default=10_000, help="memory phase: jobs "
                   "run before the first reading of the worker's memory")
    p.add_argument("--memory-big", type=int, default=1_000_000, help="memory phase: jobs run "
                   "in all before the second")
    p.add_argument("--policy-done-n", type=int, default=1_000_000,
                   help="completed jobs kept while the policies phase times a poll")
    p.add_argument("--shapes-idle", type=counts, default=(0, 50, 500), help="shapes phase: "
                   "idle targets registered per lane, comma list; the first is the ratios' base")
    # Drains of a second or less (20,000 fast, 10,000 long) measured the host's noise more
    # than the targets: the same level ranged 0.65x-1.13x of the other from round to round.
    p.add_argument("--shapes-fast-n", type=int, default=40_000, help="shapes phase: jobs of "
                   "the fast-lane drain beside idle targets (and the poll's backlog)")
    p.add_argument("--shapes-long-n", type=int, default=30_000, help="shapes phase: jobs of "
                   "the long-lane drain beside idle targets")
    p.add_argument("--shapes-lat-n", type=int, default=100, help="shapes phase: wake-up "
                   "latency samples per lane beside idle targets (at --lat-rate)")
    p.add_argument("--shapes-web-procs", type=counts, default=(1, 16, 64), help="shapes "
                   "phase: processes of the web tier, comma list; the first is the base")
    p.add_argument("--shapes-web-n", type=int, default=4_800, help="shapes phase: jobs the "
                   "web tier enqueues in all, one per commit, split over its processes")
    p.add_argument("--shapes-xmin-n", type=int, default=20_000, help="shapes phase: jobs of "
                   "each drain beside an old snapshot")
    p.add_argument("--shapes-xmin-drains", type=int, default=3, help="shapes phase: drains "
                   "in a row beside an old snapshot (nothing truncated between them)")
    p.add_argument("--shapes-poll-n", type=int, default=1_000, help="shapes phase: rows of "
                   "the queue the poll and the reserve are timed on after those drains")
    p.add_argument("--shapes-poll-reps", type=int, default=100, help="shapes phase: runs of "
                   "each timed poll (median)")
    p.add_argument("--limits-n", type=int, default=20_000, help="limits phase: no-op jobs "
                   "of each non-binding drain (free, loose, loose per key)")
    p.add_argument("--limits-wait-n", type=int, default=6_000, help="limits phase: 20 ms "
                   "jobs of each non-binding drain (free, loose; 0: none)")
    p.add_argument("--limits-keys", type=int, default=1_000, help="limits phase: keys of "
                   "the per-key non-binding drain")
    p.add_argument("--limits-workers", type=int, default=3, help="limits phase: workers of "
                   "the non-binding drains")
    p.add_argument("--limits-tight-n", type=int, default=1_000, help="limits phase: 20 ms "
                   "jobs of the binding drain (Concurrency(2)) and of its free reference")
    p.add_argument("--limits-tight-workers", type=int, default=4, help="limits phase: "
                   "workers of the binding drain (more than its 2 slots)")
    p.add_argument("--limits-poll-small", type=int, default=1_000, help="limits phase: the "
                   "small backlog the admission is timed on")
    p.add_argument("--limits-poll-big", type=int, default=1_000_000, help="limits phase: "
                   "the big backlog")
    p.add_argument("--limits-poll-reps", type=int, default=200, help="limits phase: calls "
                   "of each timed statement (median)")
    p.add_argument("--limits-poll-budget-s", type=float, default=10.0, help="limits phase: "
                   "seconds each timed statement may take in all (then fewer calls, 5 at least)")
    p.add_argument("--limits-poll-rounds", type=int, default=3, help="limits phase: the "
                   "rounds the admission's poll runs in (the first ones; the 1,000,000-row "
                   "backlog takes half a minute to build, its plans are written in the first)")
    p.add_argument("--limits-cap-s", type=float, default=30.0, help="limits phase: a drain "
                   "not done this long after its first progress is stopped and measured so far")
    p.add_argument("--results-dir", type=Path, default=RESULTS,
                   help="where every file of the run goes: the table (unless --output), the "
                        "poll plans, the profiles, the workers' logs (default bench/results; "
                        "a smoke run points it elsewhere to keep the committed results)")
    p.add_argument("--output", type=Path, default=None,
                   help="the table (the JSON beside it); default <results-dir>/latest.md")
    return p


def counts(text: str) -> tuple[int, ...]:
    """A comma list of counts (``--shapes-idle 0,50,500``)."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a comma list of counts: {text!r}") from exc
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"not a comma list of counts: {text!r}")
    return values


def phases_of(p: argparse.ArgumentParser, only: str) -> list[str]:
    phases = [name.strip() for name in only.split(",") if name.strip()]
    unknown = set(phases) - set(PHASES + EXTRA_PHASES)
    if unknown:
        p.error(f"unknown phases: {', '.join(sorted(unknown))}")
    return phases


def missing_requirement(phases: list[str]) -> str | None:
    """The line saying what a requested phase needs and is not installed (the ``tasks``
    phase: django-tasks-db, which the bench settings do without)."""
    if "tasks" in phases:
        from bench.tasks import missing

        return missing()
    return None


def setup_django() -> None:
    """The bench's settings and database (without DATABASE_URL: a SQLite file of the bench's
    own, never the project's default one), then ``django.setup()``. Only ``main`` calls it."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    os.environ.setdefault("DATABASE_URL", f"sqlite:///{RESULTS}/bench.sqlite3")
    import django

    django.setup()


def options(args: argparse.Namespace) -> Options:
    from bench.harness import Options

    extra = {"kafka_dir": args.kafka_dir} if args.kafka_dir else {}
    return Options(args.e100_n, args.e1_n, args.d1_n, args.long_n, args.lat_n, args.lat_rate,
                   args.poll_small, args.poll_big, args.poll_reps, args.worker_log_level.upper(),
                   args.drain_poll_ms / 1000, args.kafka_n, args.kafka_keys, args.kafka_port,
                   results_dir=args.results_dir, policy_done_n=args.policy_done_n,
                   flow_chain_n=args.flow_chain_n, flow_batch_n=args.flow_batch_n,
                   tasks_e1_n=args.tasks_e1_n, tasks_n=args.tasks_n, tasks_lat_n=args.tasks_lat_n,
                   tasks_lat_pause_s=args.tasks_lat_pause_ms / 1000,
                   memory_small=args.memory_small, memory_big=args.memory_big,
                   long_wait_n=args.long_wait_n, lat_sparse_n=args.lat_sparse_n,
                   lat_sparse_rate=args.lat_sparse_rate, shapes_idle=args.shapes_idle,
                   shapes_fast_n=args.shapes_fast_n, shapes_long_n=args.shapes_long_n,
                   shapes_lat_n=args.shapes_lat_n, shapes_web_procs=args.shapes_web_procs,
                   shapes_web_n=args.shapes_web_n, shapes_xmin_n=args.shapes_xmin_n,
                   shapes_xmin_drains=args.shapes_xmin_drains, shapes_poll_n=args.shapes_poll_n,
                   shapes_poll_reps=args.shapes_poll_reps, limits_n=args.limits_n,
                   limits_wait_n=args.limits_wait_n, limits_keys=args.limits_keys,
                   limits_workers=args.limits_workers, limits_tight_n=args.limits_tight_n,
                   limits_tight_workers=args.limits_tight_workers,
                   limits_poll_small=args.limits_poll_small,
                   limits_poll_big=args.limits_poll_big,
                   limits_poll_reps=args.limits_poll_reps,
                   limits_poll_budget_s=args.limits_poll_budget_s,
                   limits_poll_rounds=args.limits_poll_rounds, limits_cap_s=args.limits_cap_s,
                   **extra)


def prepare() -> None:
    """Migrations and partition rows of the bench database; the driver's own enqueues quiet."""
    from django.core.management import call_command

    from jobs_engine import store
    from jobs_engine.conf import jobs_settings

    logging.getLogger("jobs_engine").setLevel(logging.WARNING)
    call_command("migrate", verbosity=0)
    if store.is_postgres():
        # The migration ran the functions' file once: a bench database made before a change
        # to it keeps the old functions (every statement is CREATE OR REPLACE).
        from django.db import connection

        from jobs_engine.store.functions import ENQUEUE_SQL, statements

        with connection.cursor() as cursor:
            for statement in statements(ENQUEUE_SQL):
                cursor.execute(statement)
    store.partitions_seed(jobs_settings().PARTITIONS)


def run_rounds(phases: list[str], o: Options, rounds: int) -> dict[str, list[float]]:
    """Every phase once per round, interleaved; each metric's values over the rounds. Workers
    and the broker are stopped and the queue emptied whatever happens."""
    from bench import harness
    from bench.limits import phase_limits
    from bench.shapes import phase_shapes
    from bench.workloads import PHASE_FUNCS

    funcs = {**PHASE_FUNCS, "shapes": phase_shapes, "limits": phase_limits}
    results: dict[str, list[float]] = {}
    try:
        for r in range(rounds):
            print(f"== round {r + 1}/{rounds}", flush=True)
            for name in phases:
                t = time.perf_counter()
                print(f"  {name} ...", flush=True)
                for key, value in funcs[name](o).items():
                    results.setdefault(key, []).append(value)
                print(f"  {name} done in {time.perf_counter() - t:.1f}s", flush=True)
    finally:
        harness.kill_all()
        harness.stop_kafka()
        with contextlib.suppress(Exception):
            harness.reset()
    return results


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    phases = phases_of(p, args.only)
    setup_django()
    missing = missing_requirement(phases)
    if missing:
        print(f"bench: {missing}", file=sys.stderr)
        return 2
    from django.db import connection

    from bench import report

    o = options(args)
    prepare()
    o.results_dir.mkdir(parents=True, exist_ok=True)
    info = report.machine()
    print(f"jobs-engine bench — {info}", flush=True)
    started = time.perf_counter()
    results = run_rounds(phases, o, args.rounds)
    elapsed = time.perf_counter() - started
    side_by_side = report.tasks_table(results, o)
    text = (f"# jobs-engine bench\n\n{info}; database {connection.settings_dict['NAME']}; "
            f"phases {','.join(phases)}; total {elapsed:.0f}s\n\n"
            + (f"{side_by_side}\n\n" if side_by_side else "")
            + f"{report.table(results, o)}\n\n{report.notes(results, o, args.rounds)}\n")
    print("\n" + text)
    output = args.output or o.results_dir / "latest.md"
    report.write(output, text, info, o, results)
    print(f"written {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
