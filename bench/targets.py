"""The bench targets: no-op handlers of each kind, a latency probe, and the Kafka topics.

The latency handler appends ``<dedupe_key> <time.time()>`` to the file named by the
``BENCH_LAT_FILE`` environment variable first thing, so the driver can pair it with the
moment its enqueue call returned.

Limits targets (the ``limits`` phase, ``bench/limits.py``): ``BENCH_LIMITS=<names>`` in a
process's environment registers the phase's free targets (``bench.limits.free``, no limits)
and the limited ones it names, comma-separated (``limits_env``); no other process has any
of them, so no other phase's worker runs an admission. The bench process registers them
all for the phase's duration (``register_limits``).

Idle targets (the ``shapes`` phase): ``JOBS_BENCH_IDLE_TARGETS=N`` in a process's environment
registers N no-op fast-lane targets ``bench.idle.fast.<i>`` and N no-op long-lane targets
``bench.idle.long.<i>`` that never receive a job (``bench/apps.py`` reads it; the driver
calls ``register_idle`` itself, so the poll it EXPLAINs is the workers').

The Kafka targets are the real ``jobs_engine.contrib.kafka`` ones: worker processes get them
from the environment (``kafka_env``: ``JOBS_KAFKA_BOOTSTRAP_SERVERS``/``JOBS_KAFKA_EXTRA_TOPICS``
override ``JOBS["KAFKA"]``), the driver registers the same ones (``register_kafka``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence

from jobs_engine import flows, registry
from jobs_engine.contrib.kafka.settings import DEFAULT_BATCH_SIZE
from jobs_engine.job import Job
from jobs_engine.limits import Concurrency, per_field
from jobs_engine.policies import JobPolicy
from jobs_engine.states import DeliveryMode, Lane

AT_MOST_ONCE = "bench.noop_at_most_once"
AT_LEAST_ONCE = "bench.noop_at_least_once"
BATCH = "bench.noop_batch"
LONG = "bench.long_noop"
LONG_AT_LEAST_ONCE = "bench.long_noop_at_least_once"  # River's kind: a crash runs it again
LONG_WAIT = "bench.long_wait"  # its handler waits LONG_WAIT_S, as a call to a service would
LONG_WAIT_S = 0.02
LONG_EXCLUSIVE = "bench.long_exclusive"  # never enqueued: puts the exclusive clause in the plan
LATENCY = "bench.latency"
LATENCY_LONG = "bench.latency_long"  # the same probe on the long lane

# The latency probe's target and worker command per lane (``workloads.latency_run``).
# The fast lane's probe at least once: its mark commits without waiting for the WAL flush.
LATENCY_AT_LEAST_ONCE = "bench.latency_at_least_once"
LATENCY_BY_LANE = {"fast": (LATENCY, "run_fast_lane"), "long": (LATENCY_LONG, "run_long_lane"),
                   "fast_at_least_once": (LATENCY_AT_LEAST_ONCE, "run_fast_lane")}

LAT_FILE_ENV = "BENCH_LAT_FILE"

# Fast-lane D1 kinds: table label -> target name.
FAST_KINDS = {
    "at-most-once per-row": AT_MOST_ONCE,
    "at-least-once per-row": AT_LEAST_ONCE,
    "batch_handler": BATCH,
}

# The same kinds under a policy that keeps no completed job (the ``policies`` phase sets them
# beside the ones above, which keep DEFAULT_POLICY's 100).
KEEP_NONE = JobPolicy(keep_completed=0)
KEEP_NONE_SUFFIX = "_keep_none"
FAST_KINDS_KEEP_NONE = {kind: name + KEEP_NONE_SUFFIX for kind, name in FAST_KINDS.items()}


# Kafka phase: kind -> EXTRA_TOPICS entry (one topic per kind). The last one's policy keeps
# no completed job (``bench.settings`` POLICIES), the others keep DEFAULT_POLICY's 100.
KAFKA_TOPICS = {
    "at-most-once": "bench.kafka",
    "at-least-once": "bench.kafka-alo:at_least_once",
    "at-least-once, keeps none": "bench.kafka-alo-keep-none:at_least_once",
}
KAFKA_KEEP_NONE_TOPIC = "bench.kafka-alo-keep-none"
# The Kafka phase's rows into a no-op batch handler that takes as many rows per send as a
# Kafka target: the database's part of the chain alone (read, mark, write the outcomes),
# so the table shows the most a worker could reach with a broker that cost nothing. Only
# the Kafka phase's processes register it (``KAFKA_PHASE_ENV``), as they do the topics:
# every registered target is one more window in every other phase's polls.
KAFKA_DATABASE_PART = "bench.kafka_database_part"
KAFKA_PHASE_ENV = "BENCH_KAFKA_PHASE"


# Limits (the ``limits`` phase): the same no-op and 20 ms handlers without limits, under a
# concurrency limit that never binds (for the target, and per payload field ``k`` over many
# keys), and under one that binds (2 slots for the whole target; and 2 per key, for the
# admission's poll with one full key and one free).
LIMITS_ENV = "BENCH_LIMITS"
LIMITS_FREE = "bench.limits.free"
LIMITS_FREE_WAIT = "bench.limits.free_wait"
LIMITS_LOOSE = "bench.limits.loose"
LIMITS_LOOSE_WAIT = "bench.limits.loose_wait"
LIMITS_LOOSE_KEYED = "bench.limits.loose_keyed"
LIMITS_TIGHT = "bench.limits.tight"
LIMITS_TIGHT_KEYED = "bench.limits.tight_keyed"
LIMITS_KEY_FIELD = "k"
LOOSE_SLOTS = 10_000  # never reached: a worker holds at most LONG_BATCH * LONG_PREFETCH rows
TIGHT_SLOTS = 2


def limits_specs() -> dict[str, tuple[Callable[[Job], None], list[Concurrency]]]:
    """The limits phase's targets: name -> (handler, limits)."""
    per_key = per_field(LIMITS_KEY_FIELD)
    return {
        LIMITS_FREE: (noop, []),
        LIMITS_FREE_WAIT: (wait, []),
        LIMITS_LOOSE: (noop, [Concurrency(LOOSE_SLOTS)]),
        LIMITS_LOOSE_WAIT: (wait, [Concurrency(LOOSE_SLOTS)]),
        LIMITS_LOOSE_KEYED: (noop, [Concurrency(LOOSE_SLOTS, per=per_key)]),
        LIMITS_TIGHT: (wait, [Concurrency(TIGHT_SLOTS)]),
        LIMITS_TIGHT_KEYED: (noop, [Concurrency(TIGHT_SLOTS, per=per_key)]),
    }


LIMITS_FREE_NAMES = (LIMITS_FREE, LIMITS_FREE_WAIT)


def limits_env(*limited: str) -> dict[str, str]:
    """The environment of a worker that registers the free targets and ``limited``."""
    return {LIMITS_ENV: ",".join(["free", *limited])}


def limits_named(environ: Mapping[str, str] | None = None) -> list[str]:
    """The limits targets a process registers: ``BENCH_LIMITS`` (``free`` stands for the
    free ones), none when unset."""
    raw = (os.environ if environ is None else environ).get(LIMITS_ENV, "")
    names = [name.strip() for name in raw.split(",") if name.strip()]
    return [*(LIMITS_FREE_NAMES if "free" in names else ()),
            *(name for name in names if name != "free")]


def register_limits(names: Sequence[str]) -> None:
    """Register the limits targets ``names`` (those not registered yet)."""
    specs = limits_specs()
    known = {t.name for t in registry.all_targets()}
    for name in names:
        if name not in known:
            handler, limits = specs[name]
            registry.register_target(name, handler, lane=Lane.LONG, limits=limits or None)


def unregister_limits() -> None:
    for name in limits_specs():
        registry.unregister_target(name)


# Idle targets: registered, never enqueued to (a project with many targets that mostly sit).
IDLE_TARGETS_ENV = "JOBS_BENCH_IDLE_TARGETS"
IDLE_PREFIX = "bench.idle."
IDLE_FAST = IDLE_PREFIX + "fast.{}"
IDLE_LONG = IDLE_PREFIX + "long.{}"


def idle_count(environ: Mapping[str, str] | None = None) -> int:
    """The idle targets a process registers: ``JOBS_BENCH_IDLE_TARGETS`` (default 0)."""
    raw = (os.environ if environ is None else environ).get(IDLE_TARGETS_ENV, "").strip()
    return int(raw) if raw else 0


def register_idle(count: int) -> None:
    """Exactly ``count`` idle fast-lane and ``count`` idle long-lane no-op targets registered
    (the ones past ``count`` are dropped, so the driver can go from 500 back to 0)."""
    known = {t.name for t in registry.all_targets()}
    for name in known:
        if name.startswith(IDLE_PREFIX) and int(name.rsplit(".", 1)[1]) >= count:
            registry.unregister_target(name)
    for i in range(count):
        for pattern, lane in ((IDLE_FAST, Lane.FAST), (IDLE_LONG, Lane.LONG)):
            if pattern.format(i) not in known:
                registry.register_target(pattern.format(i), noop, lane=lane)


def kafka_topic(kind: str) -> str:
    return KAFKA_TOPICS[kind].split(":")[0]


def kafka_target(kind: str) -> str:
    return f"kafka:{kafka_topic(kind)}"


def kafka_settings(bootstrap: str) -> dict[str, str]:
    """The ``JOBS["KAFKA"]`` of the bench's broker, as environment overrides."""
    return {"JOBS_KAFKA_BOOTSTRAP_SERVERS": bootstrap, "JOBS_KAFKA_ENABLED": "on",
            "JOBS_KAFKA_EXTRA_TOPICS": ",".join(KAFKA_TOPICS.values()), KAFKA_PHASE_ENV: "on"}


def register_kafka(bootstrap: str) -> None:
    """Register the bench's Kafka targets in this process, as the workers get them (again
    if they exist: the driver may be pointed at another broker), and the database's part."""
    from jobs_engine.contrib.kafka.settings import parse_kafka_settings
    from jobs_engine.contrib.kafka.target import register_topics

    for kind in KAFKA_TOPICS:
        registry.unregister_target(kafka_target(kind))
    register_topics(parse_kafka_settings({}, environ=kafka_settings(bootstrap)))
    register_database_part()


def register_database_part() -> None:
    """Register ``KAFKA_DATABASE_PART`` once (``register_kafka`` may run again)."""
    if KAFKA_DATABASE_PART not in {t.name for t in registry.all_targets()}:
        registry.register_target(KAFKA_DATABASE_PART, noop, lane=Lane.FAST,
                                 batch_handler=noop_batch, batch_size=DEFAULT_BATCH_SIZE)


def noop(job: Job) -> None:
    """The no-op handler of D1."""


def wait(job: Job) -> None:
    """A handler that waits on something else, not the CPU (the long lane's scaling)."""
    time.sleep(LONG_WAIT_S)


def noop_batch(jobs: Sequence[Job]) -> list[BaseException | None]:
    return [None] * len(jobs)


def record_start(job: Job) -> None:
    """Latency probe: the handler's start time, written where the driver reads it."""
    started = time.time()
    path = os.environ.get(LAT_FILE_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{job.dedupe_key} {started!r}\n")


def register() -> None:
    """Register every bench target (idempotent: the driver may call it again)."""
    fast = [
        (AT_MOST_ONCE, {"lane": Lane.FAST}),
        (AT_LEAST_ONCE, {"lane": Lane.FAST, "delivery_mode": DeliveryMode.AT_LEAST_ONCE}),
        (BATCH, {"lane": Lane.FAST, "batch_handler": noop_batch}),
    ]
    specs = [
        *((name, noop, kwargs) for name, kwargs in fast),
        *((name + KEEP_NONE_SUFFIX, noop, {**kwargs, "policy": KEEP_NONE})
          for name, kwargs in fast),
        (LONG, noop, {"lane": Lane.LONG}),
        (LONG_AT_LEAST_ONCE, noop, {"lane": Lane.LONG,
                                    "delivery_mode": DeliveryMode.AT_LEAST_ONCE}),
        (LONG_WAIT, wait, {"lane": Lane.LONG}),
        (LONG_EXCLUSIVE, noop, {"lane": Lane.LONG, "exclusive": True}),
        (LATENCY, record_start, {"lane": Lane.FAST}),
        (LATENCY_LONG, record_start, {"lane": Lane.LONG}),
        (LATENCY_AT_LEAST_ONCE, record_start, {"lane": Lane.FAST,
                                               "delivery_mode": DeliveryMode.AT_LEAST_ONCE}),
    ]
    known = {t.name for t in registry.all_targets()}
    for name, handler, kwargs in specs:
        if name not in known:
            registry.register_target(name, handler, **kwargs)
    flows.register_step(STEP, noop_step)
    if os.environ.get(KAFKA_PHASE_ENV):
        register_database_part()


STEP = "bench.step"  # a flow step that does nothing (the flows phase)


def noop_step(ctx: flows.StepContext) -> None:
    return None
