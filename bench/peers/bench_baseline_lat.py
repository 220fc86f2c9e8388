"""Raw psycopg 3 latency floor: INSERT+NOTIFY per job (one txn); one consumer process LISTENs
and drains with DELETE ... FOR UPDATE SKIP LOCKED LIMIT 1 RETURNING.
Usage: bench_baseline_lat.py            (driver)
       bench_baseline_lat.py consumer   (the worker, spawned by the driver)
       bench_baseline_lat.py lat        (the L enqueuer, run by the driver)"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import psycopg
from common import PY_VENV, REFERENCE, ROOT, dsn, latency_native, spawn
from psycopg.types.json import Jsonb

SYS = "baseline-psycopg LISTEN+NOTIFY"
Q = ("DELETE FROM ljobs WHERE id IN (SELECT id FROM ljobs ORDER BY id LIMIT 1 "
     "FOR UPDATE SKIP LOCKED) RETURNING id, payload")


def consumer() -> None:
    task = os.environ["LAT_TASK_FILE"]
    conn = psycopg.connect(dsn("baseline"), autocommit=True)
    conn.execute("LISTEN ljobs")
    while True:
        while True:
            row = conn.execute(Q).fetchone()
            if row is None:
                break
            t = time.time()
            with open(task, "a") as f:
                f.write(f"{row[1]['i']} {t!r}\n")
        for _ in conn.notifies(timeout=5.0, stop_after=1):
            pass


def enqueuer() -> None:
    conn = psycopg.connect(dsn("baseline"), autocommit=True)
    task = os.environ["LAT_TASK_FILE"]
    n, rate = int(os.environ["LAT_N"]), float(os.environ["LAT_RATE"])

    def enqueue_one(i: int) -> None:
        with conn.transaction():
            conn.execute("INSERT INTO ljobs (payload, status) VALUES (%s, 'todo')",
                         (Jsonb({"i": i}),))
            conn.execute("NOTIFY ljobs")

    enqueue_one(-1)
    t0 = time.time()
    while not (os.path.exists(task) and Path(task).read_text().strip()):
        if time.time() - t0 > 60:
            raise RuntimeError("consumer not ready")
        time.sleep(0.05)
    time.sleep(2.0)
    lines = []
    start = time.perf_counter()
    for i in range(n):
        d = start + i / rate - time.perf_counter()
        if d > 0:
            time.sleep(d)
        enqueue_one(i)
        lines.append(f"{i} {time.time()!r}")
    with open(os.environ["LAT_AFTER_FILE"], "w") as f:
        f.write("\n".join(lines) + "\n")
    print(json.dumps({"clock": "CLOCK_REALTIME (time.time)"}))


def main() -> None:
    conn = psycopg.connect(dsn("baseline"), autocommit=True)
    conn.execute("DROP TABLE IF EXISTS ljobs; CREATE TABLE ljobs (id bigserial PRIMARY KEY, "
                 "payload jsonb, status text, created_at timestamptz DEFAULT now())")
    py = os.path.join(PY_VENV, "python")
    me = os.path.join(ROOT, "bench_baseline_lat.py")
    latency_native(SYS, REFERENCE, lambda: spawn([py, me, "consumer"], "baseline_lat.log"),
                   [py, me, "lat"])
    conn.execute("DROP TABLE IF EXISTS ljobs")
    conn.close()


if __name__ == "__main__":
    {"consumer": consumer, "lat": enqueuer}.get(sys.argv[1] if sys.argv[1:] else "", main)()
