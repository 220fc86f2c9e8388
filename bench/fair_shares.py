"""Fair shares on the long lane: how long tenant B's jobs wait to start while tenant A has a
backlog. One worker's long lane in this process (``LongLane`` with its threads,
``LONG_BATCH`` 10, handlers that sleep 20 ms), woken after each enqueue's commit as a NOTIFY
would wake it; tenant B enqueues one job every ``--interval-ms`` (100) for ``--seconds`` (20),
each its own commit. B's start latency: the handler's start minus the moment its enqueue
returned. Three cases, in turn each round:

- ``no backlog``: B's jobs alone;
- ``A backlog, fair``: tenant A's ``--backlog`` (100,000) due rows first, in one
  ``INSERT ... SELECT generate_series``, ``FAIR_SHARES`` on (the default);
- ``A backlog, not fair``: the same, ``FAIR_SHARES`` off: B's rows wait behind A's.

A job of B not started when the case ends counts as waiting longer than the case lasted (its
latency at least that: ">"). The table gives each column's median over the rounds, and
A's jobs run per second beside. PostgreSQL only::

    DATABASE_URL=postgres://postgres@127.0.0.1:54329/jobs_engine .venv/bin/python \\
        bench/fair_shares.py [--rounds 1] [--backlog 100000] [--seconds 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from bench.harness import pct, reset, sql  # noqa: E402
from jobs_engine import store  # noqa: E402
from jobs_engine.conf import load_settings  # noqa: E402
from jobs_engine.enqueueing import enqueue  # noqa: E402
from jobs_engine.job import Job  # noqa: E402
from jobs_engine.lanes.long import LongLane  # noqa: E402
from jobs_engine.lanes.pauses import PauseGate  # noqa: E402
from jobs_engine.registry import register_target  # noqa: E402
from jobs_engine.states import DeliveryMode  # noqa: E402

TARGET = "bench.fair_shares"
HANDLER_S = 0.02
CASES = {"no backlog": (False, True), "A backlog, fair": (True, True),
         "A backlog, not fair": (True, False)}  # name -> (A's backlog, FAIR_SHARES)


class Run:
    """One case's worker: the handlers' starts of B's jobs and how many of A's ran."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: dict[int, float] = {}  # B's job id -> time.time() at its handler
        self.a_done = 0

    def handler(self, job: Job) -> None:
        at = time.time()
        if job.tenant_id == "B":
            with self.lock:
                self.started[job.id] = at  # type: ignore[index]  # a stored row
        time.sleep(HANDLER_S)
        if job.tenant_id == "A":
            with self.lock:
                self.a_done += 1


RUN = Run()  # the handler registered once; each case starts a new one


def handler(job: Job) -> None:
    RUN.handler(job)


def backlog(n: int) -> None:
    """``n`` due rows of tenant A, oldest first, in one statement (as ``poll_cost.backlog``)."""
    sql(f"INSERT INTO {store.JOBS} (code, target, lane, partition, version, payload, headers, "
        "dedupe_key, status, delivery_mode, attempts, next_run_at, last_error, trace_id, "
        "created_at, updated_at, tenant_id) SELECT %s, %s, 'long', g %% 64, 0, "
        "jsonb_build_object('i', g), '{}'::jsonb, 'fair-a-' || g, 'PENDING', %s, 0, "
        "now() - interval '1 hour' + g * interval '1 microsecond', '', '', now(), now(), 'A' "
        "FROM generate_series(1, %s) AS g",
        [TARGET, TARGET, DeliveryMode.AT_LEAST_ONCE.value, n])
    sql(f"VACUUM ANALYZE {store.JOBS}")


@dataclass
class Result:
    p50_ms: float
    p99_ms: float
    started: int
    enqueued: int
    a_per_s: float
    lasted_s: float


def run_case(with_backlog: bool, fair: bool, o: argparse.Namespace) -> Result:
    global RUN
    reset()
    if with_backlog:
        backlog(o.backlog)
    RUN = Run()
    settings = load_settings({"LONG_BATCH": 10, "FAIR_SHARES": fair}, environ={})
    poke, stop = threading.Event(), threading.Event()
    lane = LongLane("bench-fair", settings, PauseGate("bench-fair", settings), threads=True,
                    on_row_done=poke.set)

    def drive() -> None:  # the worker's loop: poll at once after a row, else wait to be poked
        while not stop.is_set():
            poke.clear()
            if lane.run_once() == 0:
                due = lane.due_in_s()
                poke.wait(settings.POLL_S if due is None else min(due, settings.POLL_S))
        connection.close()

    driver = threading.Thread(target=drive, name="bench-fair-driver")
    driver.start()
    time.sleep(1.0)  # the lane at work on A's backlog (or idle) before B's first job
    enqueued: dict[int, float] = {}
    count = int(o.seconds * 1000 / o.interval_ms)
    began = time.perf_counter()
    a_before = RUN.a_done
    for i in range(count):
        delay = began + i * o.interval_ms / 1000 - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        job_id = enqueue(TARGET, {"i": i}, tenant_id="B").job_id
        enqueued[job_id] = time.time()  # type: ignore[index]  # a durable target's row
        poke.set()  # what the enqueue's NOTIFY does for a worker waiting on it
    give_up = time.perf_counter() + o.drain_s
    while time.perf_counter() < give_up and len(RUN.started) < len(enqueued):
        time.sleep(0.05)
    lasted_s = time.perf_counter() - began
    a_per_s = (RUN.a_done - a_before) / lasted_s
    ended = time.time()
    stop.set()
    poke.set()
    driver.join()
    lane.shutdown(wait=True)
    # One not started waited at least until now.
    waits = [(RUN.started.get(job_id, ended) - at) * 1000 for job_id, at in enqueued.items()]
    return Result(pct(waits, 50), pct(waits, 99), len(RUN.started), len(enqueued), a_per_s,
                  lasted_s)


def shown(values: list[float], unstarted: bool) -> str:
    median = statistics.median(values)
    return f"> {median / 1000:,.1f} s" if unstarted else f"{median:,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--interval-ms", type=float, default=100.0)
    parser.add_argument("--drain-s", type=float, default=3.0,
                        help="how long a case waits for B's last jobs to start")
    o = parser.parse_args()
    if not store.is_postgres():
        raise SystemExit("bench/fair_shares.py runs on PostgreSQL (DATABASE_URL)")
    call_command("migrate", verbosity=0)
    register_target(TARGET, handler, lane="long", delivery_mode=DeliveryMode.AT_LEAST_ONCE)
    results: dict[str, list[Result]] = {name: [] for name in CASES}
    for round_ in range(o.rounds):
        for name, (with_backlog, fair) in CASES.items():
            r = run_case(with_backlog, fair, o)
            results[name].append(r)
            print(f"  round {round_ + 1} {name}: B p50 {r.p50_ms:,.1f} ms, p99 "
                  f"{r.p99_ms:,.1f} ms, {r.started}/{r.enqueued} started, A "
                  f"{r.a_per_s:,.0f} jobs/s", flush=True)
    reset()
    print(f"\nB's start latency (handler start - enqueue returned), one job every "
          f"{o.interval_ms:g} ms for {o.seconds:g} s; A's backlog {o.backlog:,} rows; one "
          f"worker, LONG_BATCH 10, handlers {HANDLER_S * 1000:g} ms; median of "
          f"{o.rounds} round(s)\n")
    print("| case | B p50 ms | B p99 ms | B started | A jobs/s |")
    print("|---|---:|---:|---:|---:|")
    for name, runs in results.items():
        unstarted_p50 = any(r.started <= r.enqueued // 2 for r in runs)
        unstarted_p99 = any(r.started < r.enqueued * 0.99 for r in runs)
        started = statistics.median(r.started for r in runs)
        print(f"| {name} | {shown([r.p50_ms for r in runs], unstarted_p50)} | "
              f"{shown([r.p99_ms for r in runs], unstarted_p99)} | "
              f"{started:,.0f}/{runs[0].enqueued} | "
              f"{statistics.median(r.a_per_s for r in runs):,.0f} |")


if __name__ == "__main__":
    main()
