"""The ``policies`` phase: what keeping completed jobs costs, side by side in one run.

- E100 into a target whose policy keeps completed jobs (``DEFAULT_POLICY``: 100) and into
  one that keeps none (the insert is the same; the row shows it);
- D1 with one worker for each fast kind under both policies (a send moves at most the
  target's ``keep_completed`` rows to the completed jobs and deletes the rest);
- one fast poll and one long reserve with ``policy_done_n`` (1,000,000) completed jobs kept,
  against none, over a ``poll_small`` backlog: the lanes never read the completed jobs.

The Kafka figure under both policies is in the ``kafka`` phase (one of its topics keeps
none). Import after ``django.setup()``.
"""

from __future__ import annotations

import time

from bench import targets
from bench.harness import Metrics, Options, drain, enqueue_rate, partitions_balanced, reset, sql
from bench.poll_cost import backlog, measure_poll
from jobs_engine import store

KEEPS = {"keeps 100": targets.FAST_KINDS, "keeps none": targets.FAST_KINDS_KEEP_NONE}
FIRST_DONE_ID = 2**40  # far past the ids the backlog takes from the jobs' sequence


def phase_policies(o: Options) -> Metrics:
    out: Metrics = {}
    for label, kinds in KEEPS.items():
        reset()
        out[f"policy_e100:{label}"] = enqueue_rate(kinds["at-most-once per-row"], o.e100_n)
    out["policy_e100:ratio"] = out["policy_e100:keeps 100"] / out["policy_e100:keeps none"]
    print(f"    E100 keeps 100 / keeps none: {out['policy_e100:ratio']:.2f}", flush=True)
    for kind in targets.FAST_KINDS:
        for label, kinds in KEEPS.items():
            target = kinds[kind]
            r = drain(o, "run_fast_lane", target, o.d1_n, 1,
                      f"policy-{target.split('.')[-1]}", lambda: partitions_balanced(1))
            out[f"policy_d1:{kind}:{label}"] = r["rate"]
            print(f"    D1 {kind}, {label}: {r['rate']:,.0f} jobs/s", flush=True)
        out[f"policy_d1:{kind}:ratio"] = (out[f"policy_d1:{kind}:keeps 100"]
                                          / out[f"policy_d1:{kind}:keeps none"])
    out.update(done_rows_cost(o))
    reset()
    return out


def done_rows_cost(o: Options) -> Metrics:
    """Poll and reserve over the same backlog without, then with, ``policy_done_n`` kept
    completed jobs (of the very target the poll reads)."""
    backlog(o.poll_small)
    without = measure_poll(o.poll_reps)
    started = time.perf_counter()
    keep_done(o.policy_done_n)
    built_s = time.perf_counter() - started
    kept = measure_poll(o.poll_reps)
    out = {"policy_done:poll_none": without["poll_ms"], "policy_done:poll_kept": kept["poll_ms"],
           "policy_done:poll_ratio": kept["poll_ms"] / without["poll_ms"],
           "policy_done:long_none": without["long_ms"], "policy_done:long_kept": kept["long_ms"],
           "policy_done:long_ratio": kept["long_ms"] / without["long_ms"]}
    print(f"    {o.policy_done_n:,} completed jobs kept (written in {built_s:.1f}s): fast poll "
          f"{without['poll_ms']:.2f} → {kept['poll_ms']:.2f} ms, long reserve "
          f"{without['long_ms']:.2f} → {kept['long_ms']:.2f} ms", flush=True)
    return out


def keep_done(n: int) -> None:
    """``n`` completed jobs of the poll's target in one statement, then their statistics."""
    now = "now()" if store.is_postgres() else "CURRENT_TIMESTAMP"
    rows = (f"SELECT {FIRST_DONE_ID} + g, %s, 'fast', %s, 'k' || (g %% 1000), g, g %% 64, "
            "'done-' || g, 'at_most_once', '{\"i\": 1}', '{}', '{\"ok\": true}', 1, '', "
            f"{now}, {now}, {now}, 1.5")
    insert = (f"INSERT INTO {store.DONE_JOBS} (id, target, lane, code, key, version, "
              "partition, dedupe_key, delivery_mode, payload, headers, result, attempts, "
              "trace_id, created_at, started_at, finished_at, duration_ms) ")
    target = targets.AT_MOST_ONCE
    if store.is_postgres():
        sql(insert + rows + " FROM generate_series(0, %s - 1) AS g", [target, target, n])
        sql(f"VACUUM ANALYZE {store.DONE_JOBS}")
    else:  # no generate_series: a recursive count
        sql("WITH RECURSIVE s(g) AS (SELECT 0 UNION ALL SELECT g + 1 FROM s WHERE g < %s - 1) "
            + insert + rows + " FROM s", [n, target, target])
        sql(f"ANALYZE {store.DONE_JOBS}")
