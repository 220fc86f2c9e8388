"""The limits scenario's targets (``test_limits_faults.py``): one under a concurrency limit
per account, one under a rate limit for the whole target.

Registered only when ``$JOBS_FAULTS_LIMITS`` says so (the other scenarios' workers have no
limited target, so their long lane never runs the limited admission): ``on`` with their
limits, ``off`` the same targets without limits (to show the checker catches the over-run).

Each handler appends fsynced lines to ``<pid>.log`` in ``$JOBS_FAULTS_LOG_DIR`` (beside the
other targets' ``deliver`` lines, which ``checker.read_deliveries`` reads alone):

- on entry ``start <job_id> <target> <key> <unix_time> <pid> <admitted> <lost>``: ``key`` is
  the limit's key (the payload's account, ``*`` for the whole target); ``admitted`` the
  try's ``started_at`` (the admission's time on the database clock, the time the rate
  bucket reckoned with); ``lost`` the job's earlier tries whose worker was lost
  (``<started_at>/<finished_at>`` comma-separated, ``-`` if none): a lease rescue wrote
  them, ``finished_at`` being when it released the row, i.e. when its slot came back;
- on return ``finish <job_id> <target> <key> <unix_time> <pid> <how>``: ``ok``, or
  ``ratelimited`` right before it raises ``RateLimited``.

Payload: ``sleep`` (seconds), ``account`` (the concurrency key), ``throttle`` (raise
``RateLimited(retry_after_s=THROTTLE_S)`` at the first try only; the marker file
``throttled/<job_id>`` in the log dir remembers it across processes).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.faults.targets import LOG_DIR_ENV

if TYPE_CHECKING:
    from jobs_engine.job import Job

LIMITS_ENV = "JOBS_FAULTS_LIMITS"  # "on", "off" (registered without limits), unset: none

CONC = "limits.conc"
RATE = "limits.rate"
NAMES = (CONC, RATE)
SLOTS = 3  # Concurrency(SLOTS, per=per_field("account")) on CONC
RATE_STARTS, RATE_PERIOD_S, RATE_BURST = 20, 1.0, 5  # Rate(...) on RATE, for the target
THROTTLE_S = 0.5
WHOLE_TARGET = "*"  # the key of RATE's records
WORKER_LOST = "jobs_engine.errors.WorkerLost"  # a lost try's ``error`` (store.long)


def start_line(job_id: int, target: str, key: str, at: float, pid: int, admitted: float,
               lost: list[tuple[float, float]]) -> str:
    lost_text = ",".join(f"{s:.6f}/{f:.6f}" for s, f in lost) or "-"
    return f"start {job_id} {target} {key} {at:.6f} {pid} {admitted:.6f} {lost_text}\n"


def finish_line(job_id: int, target: str, key: str, at: float, pid: int, how: str) -> str:
    return f"finish {job_id} {target} {key} {at:.6f} {pid} {how}\n"


def _append(line: str) -> None:
    path = Path(os.environ[LOG_DIR_ENV]) / f"{os.getpid()}.log"
    with open(path, "a") as fh:  # O_APPEND: lines of the lane's threads never interleave
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def _epoch(value: Any) -> float:
    from datetime import datetime

    return (value if isinstance(value, datetime) else datetime.fromisoformat(value)).timestamp()


def _first_try(job_id: int) -> bool:
    """True once per job across every process: the marker file is created exclusively."""
    marks = Path(os.environ[LOG_DIR_ENV]) / "throttled"
    marks.mkdir(exist_ok=True)
    try:
        os.close(os.open(marks / str(job_id), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def run_limited(job: Job) -> None:
    """Record the start (with the admission's time and the lost tries), take the payload's
    time, record the finish."""
    from jobs_engine import RateLimited
    from jobs_engine.context import current_try

    assert job.id is not None
    payload = job.payload if isinstance(job.payload, dict) else {}
    pid, started = os.getpid(), time.time()
    key = str(payload["account"]) if job.target == CONC else WHOLE_TARGET
    running = current_try()
    admitted = _epoch(running.started_at) if running is not None else 0.0
    lost = [(_epoch(t["started_at"]), _epoch(t["finished_at"]))
            for t in (running.earlier if running is not None else ())
            if t.get("error") == WORKER_LOST and t.get("started_at") and t.get("finished_at")]
    _append(start_line(job.id, job.target, key, started, pid, admitted, lost))
    if payload.get("sleep"):
        time.sleep(float(payload["sleep"]))
    if payload.get("throttle") and _first_try(job.id):
        _append(finish_line(job.id, job.target, key, time.time(), pid, "ratelimited"))
        raise RateLimited("the downstream said wait", retry_after_s=THROTTLE_S)
    _append(finish_line(job.id, job.target, key, time.time(), pid, "ok"))


def register() -> None:
    """Register the two targets as ``$JOBS_FAULTS_LIMITS`` says (idempotent)."""
    mode = os.environ.get(LIMITS_ENV, "").strip().lower()
    if mode not in ("on", "off"):
        return
    from jobs_engine import Concurrency, DeliveryMode, Lane, Rate, per_field, register_target
    from jobs_engine.registry import all_targets

    if CONC in {t.name for t in all_targets()}:
        return
    on = mode == "on"
    register_target(CONC, run_limited, lane=Lane.LONG,
                    delivery_mode=DeliveryMode.AT_LEAST_ONCE,
                    limits=[Concurrency(SLOTS, per=per_field("account"))] if on else None)
    register_target(RATE, run_limited, lane=Lane.LONG,
                    delivery_mode=DeliveryMode.AT_LEAST_ONCE,
                    limits=[Rate(RATE_STARTS, period_s=RATE_PERIOD_S, burst=RATE_BURST)]
                    if on else None)
