"""The jobs-engine side of the peers bench: the project's own bench (bench/run.py and the
modules it drives: bench/workloads.py, bench/harness.py) run from THIS checkout, phase by
phase, so only the workloads of this comparison run. Its files (the workers' logs, the
latency probes' files) go to PEERS_WORK/je-results, never into the checkout.

  E100  workloads.phase_e100   (enqueue_many, 100 per transaction.atomic; also its raw
        psycopg line in the same process)
  E1    workloads.phase_e1     (enqueue per call, autocommit; also its raw psycopg line)
  D1    harness.drain(..., count=1) with one worker process, as phase_d1 / phase_long do for
        one worker: ``run_fast_lane`` on the at-most-once and the at-least-once per-row
        no-op targets, ``run_long_lane`` on the long lane's at-most-once and at-least-once
        no-op targets (River's jobs are at least once: a crash runs them again)
  L     workloads.latency_run(o, "notify", lane): one idle worker, NOTIFY on, for the fast
        lane (run_fast_lane) and the long lane (run_long_lane)

Workers: settings defaults (bench.settings = the project's config.settings plus the bench
targets; FAST_BATCH 100, LONG_BATCH 10, PARTITIONS 64, NOTIFY on), log level WARNING.

  D1batch  the at-least-once drain again with FAST_BATCH 1,000 (default 100), the
        at-most-once one with FAST_MARK_ROWS 10 (default 1: a commit per row), and the
        long lane's at-most-once one with LONG_PREFETCH and LONG_PREFETCH_AT_MOST_ONCE 100
        (defaults 32 and 8): extra-setting rows, beside River's with its own benchmark's
        settings
  Eprepared  E100 and E1 again with Django's prepared statements turned on (DATABASES
        OPTIONS prepare_threshold): an extra-setting row. Django leaves them off by default
        for transaction poolers; then the enqueue's insert is bound on the server but not
        prepared.
  Xmin  the old-snapshot shape (``run.sh xmin``, ``xmin.py``): bench/shapes.py's
        ``snapshot_series`` on the fast lane's and the long lane's at-least-once no-op
        targets, three drains of D1's size in a row with and without another session
        holding an old snapshot (the order by XMIN_ROUND, as the peers' side); rows of the
        metric ``xmin``, not part of the default run

Usage (the checkout's venv python): bench_je.py [E100 E1 Eprepared D1 D1batch L Xmin]
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path[:0] = [str(HERE), str(REPO)]

from common import (  # noqa: E402
    D1_N,
    DRAIN_POLL_S,
    E1_N,
    E100_N,
    L_N,
    L_RATE,
    OURS,
    WORK,
    record,
    url,
)

# run.sh's "before" system has a database of its own.
os.environ["DATABASE_URL"] = url(os.environ.get("JE_DB", "jobs_engine"))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

from bench import run  # noqa: E402  (sets nothing up on import)

FAST_AT_MOST_ONCE = f"{OURS} fast lane, at-most-once"
FAST_AT_LEAST_ONCE = f"{OURS} fast lane, at-least-once"
LONG = f"{OURS} long lane, at-most-once"
LONG_AT_LEAST_ONCE = f"{OURS} long lane, at-least-once"
PREPARED = f"{OURS}, Django's prepared statements on"
# The fast lane's rows per poll for the extra-setting drain (River's own benchmark has its
# extra-setting row too): a poll's fixed cost, ~3 ms of statements, spread over more rows.
BIG_BATCH = 1_000
FAST_BIG_BATCH = f"{FAST_AT_LEAST_ONCE}, FAST_BATCH {BIG_BATCH}"
# At-most-once rows marked in flight per commit: PgQueuer's default batch, which it marks
# picked with one statement before running them. A crash may then presume up to this many
# rows DEAD, as PgQueuer leaves its picked ones, not only the one in hand.
MARK_ROWS = 10
FAST_MARK_ROWS = f"{FAST_AT_MOST_ONCE}, FAST_MARK_ROWS {MARK_ROWS}"
DEEP_PREFETCH = 100
LONG_DEEP_PREFETCH = f"{LONG}, LONG_PREFETCH_AT_MOST_ONCE {DEEP_PREFETCH}"
PREPARED_SETTING = ("DATABASES OPTIONS prepare_threshold 5 (Django leaves it None, for "
                    "transaction poolers): the enqueue's insert is prepared")


@contextlib.contextmanager
def prepared_statements_on() -> Iterator[None]:
    """The project's database with Django's prepared statements turned on, as a project
    without a transaction pooler may: a new connection for the block and after it."""
    from django.db import connection

    options = connection.settings_dict["OPTIONS"]
    connection.close()
    connection.settings_dict["OPTIONS"] = {**options, "prepare_threshold": 5}
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict["OPTIONS"] = options


def xmin(o: Any) -> None:
    """The old-snapshot series of both lanes (``xmin.py``'s definitions), one row a drain."""
    from xmin import DRAINS, METRIC, series_order

    from bench import shapes

    xo = dataclasses.replace(o, shapes_xmin_n=D1_N, shapes_xmin_drains=DRAINS,
                             shapes_poll_reps=5)
    round_number = int(os.environ.get("XMIN_ROUND", "1"))
    for lane, system in (("fast", FAST_AT_LEAST_ONCE), ("long", LONG_AT_LEAST_ONCE)):
        for held in series_order(round_number):
            series = "held" if held else "none"

            def row(i: int, d: dict[str, float], system: str = system,
                    series: str = series, lane: str = lane) -> None:
                record(system, METRIC, d["rate"], family=OURS, series=series, drain=i,
                       xmin_round=round_number, n=D1_N, startup_s=d["startup_s"],
                       drain_s=d["drain_s"], dead=d["dead"], settings="defaults",
                       concurrency=f"1 run_{lane}_lane process")

            got = shapes.snapshot_series(xo, lane, held, label="peers", on_drain=row)
            print(f"{system}, old snapshot {series}: " + ", ".join(
                f"{rate:,.0f}" for rate in got["rates"]) + " jobs/s", flush=True)


def main(which: list[str]) -> None:
    run.setup_django()
    run.prepare()
    from bench import harness, targets, workloads

    o = harness.Options(e100_n=E100_N, e1_n=E1_N, d1_n=D1_N, long_n=D1_N, lat_n=L_N,
                        lat_rate=L_RATE, poll_small=1_000, poll_big=1_000, poll_reps=1,
                        log_level="WARNING", drain_poll_s=DRAIN_POLL_S,
                        results_dir=Path(WORK) / "je-results")
    one_worker = "1 {} process"
    try:
        for w in which:
            if w == "E100":
                r = workloads.phase_e100(o)
                record(OURS, "E100", r["e100"], family=OURS, n=o.e100_n,
                       raw_psycopg_same_process=r.get("e100_raw"), api="enqueue_many")
            elif w == "E1":
                r = workloads.phase_e1(o)
                record(OURS, "E1", r["e1"], family=OURS, n=o.e1_n,
                       raw_psycopg_same_process=r.get("e1_raw"), api="enqueue")
            elif w == "Eprepared":
                with prepared_statements_on():
                    e100 = workloads.phase_e100(o)["e100"]
                    e1 = workloads.phase_e1(o)["e1"]
                for metric, value, n in (("E100", e100, o.e100_n), ("E1", e1, o.e1_n)):
                    record(PREPARED, metric, value, family=OURS, defaults=False, n=n,
                           settings=PREPARED_SETTING)
            elif w == "D1":
                for system, command, target, n in (
                        (FAST_AT_MOST_ONCE, "run_fast_lane", targets.AT_MOST_ONCE, o.d1_n),
                        (FAST_AT_LEAST_ONCE, "run_fast_lane", targets.AT_LEAST_ONCE, o.d1_n),
                        (LONG, "run_long_lane", targets.LONG, o.long_n),
                        (LONG_AT_LEAST_ONCE, "run_long_lane", targets.LONG_AT_LEAST_ONCE,
                         o.long_n)):
                    d = harness.drain(o, command, target, n, 1,
                                      f"peers-d1-{target.split('.')[-1]}", lambda: True)
                    record(system, "D1", d["rate"], family=OURS,
                           d1_incl_startup=d["rate_incl_startup"], startup_s=d["startup_s"],
                           drain_s=d["drain_s"], dead=d["dead"], n=n,
                           concurrency=one_worker.format(command))
            elif w == "D1batch":
                for system, command, target, changed in (
                        (FAST_BIG_BATCH, "run_fast_lane", targets.AT_LEAST_ONCE,
                         {"FAST_BATCH": (BIG_BATCH, 100)}),
                        (FAST_MARK_ROWS, "run_fast_lane", targets.AT_MOST_ONCE,
                         {"FAST_MARK_ROWS": (MARK_ROWS, 1)}),
                        (LONG_DEEP_PREFETCH, "run_long_lane", targets.LONG,
                         {"LONG_PREFETCH": (DEEP_PREFETCH, 32),
                          "LONG_PREFETCH_AT_MOST_ONCE": (DEEP_PREFETCH, 8)})):
                    d = harness.drain(o, command, target, o.d1_n, 1,
                                      f"peers-d1-{next(iter(changed)).lower()}", lambda: True,
                                      env={f"JOBS_{name}": str(value)
                                           for name, (value, _) in changed.items()})
                    record(system, "D1", d["rate"], family=OURS, defaults=False,
                           settings=", ".join(f"JOBS {name} {value} (default {default})"
                                              for name, (value, default) in changed.items()),
                           d1_incl_startup=d["rate_incl_startup"], startup_s=d["startup_s"],
                           drain_s=d["drain_s"], dead=d["dead"], n=o.d1_n,
                           concurrency=one_worker.format(command))
            elif w == "Xmin":
                xmin(o)
            elif w == "L":
                for system, lane in ((FAST_AT_MOST_ONCE, "fast"), (LONG, "long")):
                    p50, p99, missing = workloads.latency_run(o, "notify", lane)
                    record(system, "L", p50, family=OURS, p99=p99, missing=missing, n=o.lat_n,
                           clock="CLOCK_REALTIME (time.time)", mode="notify",
                           concurrency=one_worker.format(f"run_{lane}_lane"))
            else:
                raise SystemExit(f"unknown workload {w}")
    finally:
        harness.kill_all()
        harness.reset()


if __name__ == "__main__":
    main(sys.argv[1:] or ["E100", "E1", "Eprepared", "D1", "D1batch", "L"])
