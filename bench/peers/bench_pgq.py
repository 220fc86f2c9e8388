"""PgQueuer side of the peers bench (the driver, run_peer.py, times D1 and pairs L files).

    bench_pgq.py install
    bench_pgq.py e100 N | e1 N | fill N     -> prints {"rate": jobs/s, ...}
    bench_pgq.py lat                        -> L enqueuer (LAT_* env)
    bench_pgq.py work                       -> the worker: what `pgq run bench_pgq:factory
                                               --log-level WARNING` does, with the CLI's defaults

Why not `pgq run` itself: in pgqueuer 1.6.0 with typer 0.29.2 (what pip resolved) the CLI dies
before starting (`--log-level`'s parser returns a str, and setup_fancy_logger calls .name on
it: AttributeError: 'str' object has no attribute 'name'), with or without --log-level. The
`work` mode runs the same three statements as the CLI's `run` command body: the fancy logger
at WARNING, then supervisor.run(factory) on uvloop (pgqueuer's asyncio_run) with the CLI
defaults (batch_size 10, dequeue_timeout 30 s, heartbeat_timeout 30 s, max_concurrent_tasks
None, mode continuous, no restart).

DATABASE_URL picks the database. Clock for L: time.time() on both sides.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.queries import Queries

URL = os.environ.get("DATABASE_URL", "")


def payload(i: int) -> bytes:
    return json.dumps({"i": i, "ts": time.time(), "msg": "hello world"}).encode()


@asynccontextmanager
async def factory() -> AsyncIterator[PgQueuer]:
    """Worker factory for `pgq run bench_pgq:factory` (one asyncpg connection, as PgQueuer's
    examples do; 1.6.0 wants an async context manager)."""
    conn = await asyncpg.connect(URL)
    pgq = PgQueuer(AsyncpgDriver(conn))
    task_file = os.environ.get("LAT_TASK_FILE")

    @pgq.entrypoint("noop")
    async def noop(job: Any) -> None:
        pass

    @pgq.entrypoint("lat")
    async def lat(job: Any) -> None:
        t = time.time()
        if task_file:
            with open(task_file, "a") as f:
                f.write(f"{json.loads(job.payload)['seq']} {t!r}\n")

    try:
        yield pgq
    finally:
        await conn.close()


async def main(mode: str, n: int) -> None:
    conn = await asyncpg.connect(URL)
    q = Queries(AsyncpgDriver(conn))
    out: dict[str, Any] = {}
    if mode == "install":
        if not await q.schema_is_installed():
            await q.install()
        out = {"installed": True}
    elif mode == "e100":
        t = time.perf_counter()
        for b in range(n // 100):
            await q.enqueue(["noop"] * 100, [payload(b * 100 + j) for j in range(100)], [0] * 100)
        out = {"rate": n // 100 * 100 / (time.perf_counter() - t), "n": n // 100 * 100,
               "api": "Queries.enqueue(lists)"}
    elif mode == "e1":
        t = time.perf_counter()
        for i in range(n):
            await q.enqueue("noop", payload(i))
        out = {"rate": n / (time.perf_counter() - t), "n": n, "api": "Queries.enqueue"}
    elif mode == "fill":
        for s in range(0, n, 1000):
            k = min(n, s + 1000) - s
            await q.enqueue(["noop"] * k, [payload(s + j) for j in range(k)], [0] * k)
        out = {"filled": n}
    elif mode == "lat":
        task = os.environ["LAT_TASK_FILE"]
        total = int(os.environ["LAT_N"])
        rate = float(os.environ["LAT_RATE"])
        await q.enqueue("lat", json.dumps({"seq": -1}).encode())  # warm-up
        t0 = time.time()
        while not (os.path.exists(task) and Path(task).read_text().strip()):
            if time.time() - t0 > 60:
                raise RuntimeError("worker not ready")
            await asyncio.sleep(0.05)
        await asyncio.sleep(2.0)  # idle and waiting
        lines = []
        start = time.perf_counter()
        for i in range(total):
            d = start + i / rate - time.perf_counter()
            if d > 0:
                await asyncio.sleep(d)
            await q.enqueue("lat", json.dumps({"seq": i}).encode())
            lines.append(f"{i} {time.time()!r}")
        with open(os.environ["LAT_AFTER_FILE"], "w") as f:
            f.write("\n".join(lines) + "\n")
        out = {"clock": "CLOCK_REALTIME (time.time)", "api": "Queries.enqueue"}
    else:
        raise SystemExit(f"unknown mode {mode}")
    await conn.close()
    print(json.dumps(out), flush=True)


def work() -> None:
    from pgqueuer.adapters.cli import supervisor
    from pgqueuer.adapters.cli.cli import asyncio_run
    from pgqueuer.core import logconfig

    logconfig.setup_fancy_logger(logconfig.LogLevel.WARNING)
    asyncio_run(supervisor.run("bench_pgq:factory"))


if __name__ == "__main__":
    if sys.argv[1] == "work":
        work()
        sys.exit(0)
    asyncio.run(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0))
