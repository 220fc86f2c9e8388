"""Raw psycopg 3 baselines ("physical limit" lines: no queue, just the table): E100
(executemany, 100 rows per transaction), E1 (one INSERT per autocommit), D1 and D100
(``DELETE ... FOR UPDATE SKIP LOCKED LIMIT 1 / 100 RETURNING`` loops in one process).
Usage: bench_baseline.py"""

from __future__ import annotations

import time

import psycopg
from common import D1_N, E1_N, E100_N, REFERENCE, dsn, payload, record
from psycopg.types.json import Jsonb

SYS = "baseline-psycopg"
FAMILY = REFERENCE
DDL = """
DROP TABLE IF EXISTS jobs;
CREATE TABLE jobs (id bigserial PRIMARY KEY, payload jsonb, status text,
                   created_at timestamptz DEFAULT now());
"""
INS = "INSERT INTO jobs (payload, status, created_at) VALUES (%s, 'todo', now())"


def reset(conn: psycopg.Connection) -> None:
    conn.execute(DDL)


def fill(conn: psycopg.Connection, n: int) -> None:
    with conn.transaction(), conn.cursor() as cur:
        cur.executemany(INS, [(Jsonb(payload(i)),) for i in range(n)])
    conn.execute("ANALYZE jobs")


def main() -> None:
    conn = psycopg.connect(dsn("baseline"), autocommit=True)

    # (a) 100 rows per transaction (executemany -> psycopg3 pipeline, 1 txn / 100 rows)
    reset(conn)
    n = E100_N
    t = time.perf_counter()
    with conn.cursor() as cur:
        for b in range(n // 100):
            with conn.transaction():
                cur.executemany(INS, [(Jsonb(payload(b * 100 + j)),) for j in range(100)])
    record(SYS, "E100", n / (time.perf_counter() - t), family=FAMILY)

    # (b) one INSERT + COMMIT per row (autocommit)
    reset(conn)
    n = E1_N
    t = time.perf_counter()
    for i in range(n):
        conn.execute(INS, (Jsonb(payload(i)),))
    record(SYS, "E1", n / (time.perf_counter() - t), family=FAMILY)

    # (c)/(d) drain loops: DELETE ... SKIP LOCKED RETURNING, one process, autocommit
    for lim, metric in ((100, "D100"), (1, "D1")):
        reset(conn)
        fill(conn, D1_N)
        q = (f"DELETE FROM jobs WHERE id IN (SELECT id FROM jobs ORDER BY id LIMIT {lim} "
             "FOR UPDATE SKIP LOCKED) RETURNING id, payload")
        done = 0
        t = time.perf_counter()
        while True:
            rows = conn.execute(q).fetchall()
            if not rows:
                break
            done += len(rows)
        el = time.perf_counter() - t
        assert done == D1_N, done
        record(SYS, metric, done / el, family=FAMILY)
    conn.execute("DROP TABLE IF EXISTS jobs")
    conn.close()


if __name__ == "__main__":
    main()
