"""Driver for the native peers: River (Go), graphile-worker (Node), PgQueuer (Python).

    run_peer.py river    [E100 E100fast E1 D1 D1c1 D1bench L]
    run_peer.py graphile [E100 E1 D1 L]
    run_peer.py pgqueuer [E100 E1 D1 L]

The peer's own client program does the enqueues (timed inside it) and runs the worker;
this driver empties the tables, times D1 from outside, and pairs the L files.
Worker settings (one process each):
  river     MaxWorkers 100 on the default queue (River has no default: 100 is the value of
            its docs' examples); everything else River's defaults (FetchCooldown 100 ms,
            FetchPollInterval 1 s, LISTEN/NOTIFY on), pgxpool defaults. Extras, rows of
            their own: E100fast (InsertManyFast, COPY), D1c1 (MaxWorkers 1, 500 jobs: it runs
            at FetchCooldown pace), D1bench (the settings of River's own benchmark command
            `river bench`, cmd/river/riverbench: MaxWorkers 2000, FetchCooldown 2 ms,
            FetchPollInterval 20 ms).
  graphile  graphile-worker `run()` with its defaults: concurrency 1, pollInterval 2 s,
            maxPoolSize 10, LISTEN/NOTIFY; logger at warning (default logs each job at INFO).
  pgqueuer  bench_pgq.py work = `pgq run bench_pgq:factory --log-level WARNING` (the CLI itself
            crashes in 1.6.0, see bench_pgq.py): CLI defaults batch_size 10,
            dequeue_timeout 30 s, max_concurrent_tasks unlimited, entrypoint
            concurrency_limit 0 (unlimited), uvloop (the CLI's), one asyncpg connection.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import psycopg
from common import (
    D1_N,
    D1C1_RIVER_N,
    E1_N,
    E100_N,
    NODE,
    NODE_MODULES,
    PY_VENV,
    RIVER_BIN,
    ROOT,
    drain,
    dsn,
    latency_native,
    record,
    run_json,
    spawn,
    url,
)

PEERS: dict[str, dict[str, Any]] = {
    "river": {
        "db": "river",
        "cmd": [RIVER_BIN],
        "env": {},
        "truncate": "TRUNCATE river_job RESTART IDENTITY",
        "table": "river_job",
        "left": "SELECT count(*) FROM river_job WHERE state IN "
                "('available','running','retryable','scheduled','pending')",
        "exists": "SELECT EXISTS (SELECT 1 FROM river_job WHERE state IN "
                  "('available','running','retryable','scheduled','pending'))",
        "install": ["migrate"],
        "worker": lambda c: [RIVER_BIN, "work", str(c)],
        "default_c": 100,
        "final": "SELECT state::text, count(*) FROM river_job GROUP BY 1",
    },
    "graphile": {
        "db": "graphile",
        "cmd": [NODE, os.path.join(ROOT, "graphile", "bench.js")],
        "env": {"NODE_PATH": NODE_MODULES},
        "truncate": "TRUNCATE graphile_worker._private_jobs RESTART IDENTITY",
        "table": "graphile_worker._private_jobs",
        "left": "SELECT count(*) FROM graphile_worker._private_jobs",
        "exists": "SELECT EXISTS (SELECT 1 FROM graphile_worker._private_jobs)",
        "install": ["migrate"],
        "worker": lambda c: [NODE, os.path.join(ROOT, "graphile", "bench.js"), "work", str(c)],
        "default_c": 1,
        "final": "SELECT 'left', count(*) FROM graphile_worker._private_jobs",
    },
    "pgqueuer": {
        "db": "pgqueuer",
        "cmd": [os.path.join(PY_VENV, "python"), os.path.join(ROOT, "bench_pgq.py")],
        "env": {},
        "truncate": "TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics RESTART IDENTITY",
        "table": "pgqueuer",
        "left": "SELECT count(*) FROM pgqueuer",
        "exists": "SELECT EXISTS (SELECT 1 FROM pgqueuer)",
        "install": ["install"],
        "worker": lambda c: [os.path.join(PY_VENV, "python"),
                             os.path.join(ROOT, "bench_pgq.py"), "work"],
        "default_c": None,
        "final": "SELECT status::text, count(*) FROM pgqueuer_log GROUP BY 1",
    },
}

D1BENCH_MIN_N = 5_000
NAMES = {"river": "River", "graphile": "graphile-worker", "pgqueuer": "PgQueuer"}
# Extra settings: their rows' names, and the settings written into the rows.
RIVER_BENCH = "River, `river bench` settings"
EXTRA_SETTINGS = {
    "E100fast": "InsertManyFast (COPY) instead of InsertMany",
    "D1c1": "MaxWorkers 1 (else River's defaults)",
    "D1bench": "the settings of River's own benchmark command (`river bench`, "
               "cmd/river/riverbench): MaxWorkers 2000, FetchCooldown 2 ms, "
               "FetchPollInterval 20 ms",
}


def main(peer: str, which: list[str]) -> None:
    p = PEERS[peer]
    env = {"DATABASE_URL": url(p["db"]), **p["env"]}
    conn = psycopg.connect(dsn(p["db"]), autocommit=True)
    try:
        conn.execute(f"SELECT 1 FROM {p['table']} LIMIT 1")
    except psycopg.errors.UndefinedTable:
        run_json(p["cmd"] + p["install"], env=env)

    def one(query: str) -> Any:
        row = conn.execute(query).fetchone()
        assert row is not None
        return row[0]

    def reset() -> None:
        conn.execute(p["truncate"])
        conn.execute(f"ANALYZE {p['table']}")

    family = NAMES[peer]
    for w in which:
        if w in ("E100", "E100fast", "E1"):
            reset()
            mode = {"E100": "e100", "E100fast": "e100fast", "E1": "e1"}[w]
            n = E1_N if w == "E1" else E100_N
            r = run_json(p["cmd"] + [mode, str(n)], env=env)
            rate = r.pop("rate")
            if w == "E100fast":
                record(f"{family} InsertManyFast", "E100", rate, family=family,
                       defaults=False, settings=EXTRA_SETTINGS[w], **r)
            else:
                record(family, w, rate, family=family, **r)
            left = one(p["left"])
            assert left == n, f"{family} {w}: {left} rows stored, expected {n}"
        elif w in ("D1", "D1c1", "D1bench"):
            c = {"D1": p["default_c"], "D1c1": 1, "D1bench": 2000}[w]
            wenv = dict(env)
            if w == "D1bench":  # River's own `river bench` settings (cmd/river/riverbench)
                assert peer == "river"
                wenv.update(RIVER_FETCH_COOLDOWN_MS="2", RIVER_FETCH_POLL_INTERVAL_MS="20")
            # River with MaxWorkers 1 is bound by FetchCooldown (100 ms between fetches of
            # at most one job: ~10 jobs/s), so its c=1 drain uses 500 jobs, not 20,000.
            n = D1C1_RIVER_N if (peer == "river" and w == "D1c1") else D1_N
            if w == "D1bench":  # ~10,000 jobs/s: 1,000 (a smoke run's D1) end in one sample
                n = max(n, D1BENCH_MIN_N)
            reset()
            run_json(p["cmd"] + ["fill", str(n)], env=env)
            conn.execute(f"ANALYZE {p['table']}")
            assert one(p["left"]) == n
            name = family if w == "D1" else f"{family} MaxWorkers=1"
            if peer == "river" and w == "D1":  # River has no default MaxWorkers
                name = f"{family} MaxWorkers=100"
            if w == "D1bench":
                name = RIVER_BENCH
            def worker(c: int = c, w: str = w,
                       wenv: dict[str, str] = wenv) -> subprocess.Popen[bytes]:
                return spawn(p["worker"](c), f"{peer}_{w}.log", env=wenv)

            drain(name, family, worker, lambda: one(p["left"]), lambda: one(p["exists"]), n,
                  defaults=w == "D1",
                  extra={"concurrency": c, "settings": EXTRA_SETTINGS.get(w, "defaults")},
                  post=lambda: dict(conn.execute(p["final"]).fetchall()))
        elif w == "L":
            reset()
            c = p["default_c"]
            name = f"{family} MaxWorkers=100" if peer == "river" else family
            latency_native(name, family,
                           lambda c=c: spawn(p["worker"](c), f"{peer}_L.log", env=env),
                           p["cmd"] + ["lat"], env=env, extra={"concurrency": c})
        else:
            raise SystemExit(f"unknown workload {w}")
    reset()
    conn.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or ["E100", "E1", "D1", "L"])
