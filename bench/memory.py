"""The ``memory`` phase: does a worker's resident memory grow with the jobs it has run?

For each lane, one worker (``run_fast_lane`` on the at-least-once per-row target that keeps
no completed jobs, so the database stays small; ``run_long_lane`` on the long no-op target)
runs ``memory_small`` jobs (10,000), then more until it has run ``memory_big``
(1,000,000) in all. The bench commits them ``BACKLOG`` / 2 at a time
as the worker drains them, never more than ``BACKLOG`` waiting, and reads the worker's
resident set size (``VmRSS`` of ``/proc/<pid>/status``) each time the queue is empty at a
checkpoint: the worker idle, after the same work per job. A leak per job shows as a
ratio above 1; the bar is within 10%. Linux only (``/proc``); import after
``django.setup()``.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench import targets
from bench.harness import (
    Metrics,
    Options,
    Workers,
    drained,
    fill,
    remaining,
    reset,
    running,
    wait_for,
)

BACKLOG = 50_000  # rows committed ahead of the worker at most
LANES = {  # lane -> (worker command, target)
    "fast": ("run_fast_lane", targets.FAST_KINDS_KEEP_NONE["at-least-once per-row"]),
    "long": ("run_long_lane", targets.LONG),
}


def rss_mb(pid: int) -> float:
    """The process's resident set size now, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def run_to(workers: Workers, target: str, done: int, upto: int) -> None:
    """Feed the worker from ``done`` jobs run to ``upto``, then wait for an empty queue."""
    while done < upto:
        if remaining() < BACKLOG // 2:
            n = min(BACKLOG // 2, upto - done)
            fill(target, n)
            done += n
        else:
            time.sleep(0.05)
        workers.check()
    wait_for(f"{upto:,} jobs run", drained, workers, timeout=max(120.0, upto / 1_000))
    time.sleep(1.0)  # the last outcome's log line and statistics written; idle


def phase_memory(o: Options) -> Metrics:
    if not Path("/proc/self/status").exists():
        raise RuntimeError("the memory phase reads /proc/<pid>/status (Linux)")
    out: Metrics = {}
    for lane, (command, target) in LANES.items():
        reset()
        workers = Workers(o, command, 1, f"memory-{lane}")
        with running(workers):
            assert workers.group is not None
            pid = workers.group.procs[0].pid
            run_to(workers, target, 0, o.memory_small)
            small = rss_mb(pid)
            run_to(workers, target, o.memory_small, o.memory_big)
            big = rss_mb(pid)
        reset()
        print(f"    {lane}-lane worker RSS {small:.1f} MB after {o.memory_small:,} jobs, "
              f"{big:.1f} MB after {o.memory_big:,} ({big / small:.3f}x)", flush=True)
        out.update({f"memory:{lane}:small": small, f"memory:{lane}:big": big,
                    f"memory:{lane}:ratio": big / small})
    return out
