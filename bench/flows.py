"""The ``flows`` phase: what a flow costs per step, against plain jobs of the same lane.

- a chain of ``flow_chain_n`` (1,000) no-op steps, each handed the previous one's result,
  against as many plain jobs of the long lane;
- a batch of ``flow_batch_n`` (10,000) no-op jobs and a callback handed all their results,
  against as many plain long-lane jobs.

One ``run_long_lane`` worker each time (steps run on the engine's flow target, on the long
lane). Clock: the flow is written (in one transaction, timed apart) with the worker already
running, until its state is COMPLETED; plain jobs are the D1 drain of the same count.
Import after ``django.setup()``.
"""

from __future__ import annotations

import time

from bench import targets
from bench.harness import (
    Metrics,
    Options,
    Workers,
    drain,
    reset,
    running,
    sql,
    wait_for,
    workers_registered,
)
from jobs_engine import flows, store
from jobs_engine.models import Flow
from jobs_engine.states import FlowState


def phase_flows(o: Options) -> Metrics:
    out: Metrics = {}
    shapes = {
        "chain": (o.flow_chain_n, lambda n: flows.chain(
            "bench-chain", [flows.Step(targets.STEP, {"i": i}) for i in range(n)])),
        "batch": (o.flow_batch_n, lambda n: flows.batch(
            "bench-batch", [flows.Step(targets.STEP, {"i": i}) for i in range(n)],
            on_complete=flows.Step(targets.STEP))),
    }
    for kind, (n, build) in shapes.items():
        steps = n + (kind == "batch")
        plain = drain(o, "run_long_lane", targets.LONG, steps, 1, f"flows-plain-{kind}",
                      lambda: True)["rate"]
        written_s, run_s = run_flow(o, kind, steps, lambda b=build, k=n: b(k))
        out[f"flow:{kind}:plain"] = plain
        out[f"flow:{kind}:rate"] = steps / run_s
        out[f"flow:{kind}:write_ms"] = written_s * 1000
        out[f"flow:{kind}:overhead_ms"] = (run_s / steps - 1 / plain) * 1000
        print(f"    {kind} of {steps:,} steps: written in {written_s * 1000:,.0f} ms, ran at "
              f"{steps / run_s:,.0f} steps/s; plain long-lane jobs {plain:,.0f} jobs/s; "
              f"overhead {out[f'flow:{kind}:overhead_ms']:.2f} ms a step", flush=True)
    reset_flows()
    return out


def run_flow(o: Options, kind: str, steps: int, build: object) -> tuple[float, float]:
    """(seconds to write the flow, seconds from then until it completed)."""
    reset()
    reset_flows()
    workers = Workers(o, "run_long_lane", 1, f"flows-{kind}")
    with running(workers):
        wait_for("registered", lambda: workers_registered(1), workers, timeout=60)
        started = time.perf_counter()
        flow_id = build()  # type: ignore[operator]
        written = time.perf_counter()
        wait_for(f"the {kind} to complete", lambda: Flow.objects.filter(
            id=flow_id, state=FlowState.COMPLETED).exists(), workers,
            timeout=max(300.0, steps / 10))
        finished = time.perf_counter()
    return written - started, finished - written


def reset_flows() -> None:
    for table in (store.FLOW_STEPS, store.FLOWS):
        sql(f"DELETE FROM {table}")
