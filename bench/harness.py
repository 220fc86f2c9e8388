"""The bench's plumbing: options, the queue tables, worker processes, the drain clock, the
Kafka broker. The phases (``bench/workloads.py``) measure with it.

Import it after ``django.setup()`` (``bench/run.py`` does, in ``main``): it reads the engine's
tables through Django's connection. Worker processes are ``manage.py run_fast_lane`` /
``run_long_lane`` started by ``jobs_engine.testing`` with ``DJANGO_SETTINGS_MODULE=
bench.settings``, each in its own session, their output in ``<results>/logs/``; every phase
SIGTERMs its own (SIGKILL after a timeout), and ``kill_all`` ends whatever is left after an
error. The broker is ``scripts/kafka.sh`` through the Kafka suite's ``KafkaBroker``.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import connection, transaction

from bench import targets
from jobs_engine import store
from jobs_engine.conf import jobs_settings
from jobs_engine.context import job_context
from jobs_engine.enqueueing import enqueue_many
from jobs_engine.testing import ManagedProcess, ProcessGroup, process_env, wait_until
from tests.kafka.broker import KafkaBroker

ROOT = Path(__file__).resolve().parent.parent
MANAGE_PY = ROOT / "manage.py"
RESULTS = ROOT / "bench" / "results"
SETTINGS_MODULE = "bench.settings"
KAFKA_PARTITIONS = 3  # of each bench topic

Metrics = dict[str, float]


@dataclass
class Options:
    """The sizes and settings of one bench run (``bench/run.py``'s options)."""

    e100_n: int
    e1_n: int
    d1_n: int
    long_n: int
    lat_n: int
    lat_rate: float
    poll_small: int
    poll_big: int
    poll_reps: int
    log_level: str
    drain_poll_s: float
    kafka_n: int = 50_000
    kafka_keys: int = 1_000
    kafka_port: int = 19292
    kafka_dir: str = str(Path(tempfile.gettempdir()) / "jobs-engine-kafka-bench")
    policy_done_n: int = 1_000_000
    flow_chain_n: int = 1_000
    flow_batch_n: int = 10_000
    tasks_e1_n: int = 2_000
    tasks_n: int = 10_000
    tasks_lat_n: int = 300
    tasks_lat_pause_s: float = 0.05
    memory_small: int = 10_000
    memory_big: int = 1_000_000
    results_dir: Path = field(default=RESULTS)
    long_wait_n: int = 3_000
    lat_sparse_n: int = 10
    lat_sparse_rate: float = 0.2
    # The ``shapes`` phase (``bench/shapes.py``): idle targets registered per level, the
    # drains and latency samples beside them; the web tier's processes and jobs; the old
    # snapshot's drains, and the queue its polls are timed on.
    shapes_idle: tuple[int, ...] = (0, 50, 500)
    shapes_fast_n: int = 20_000
    shapes_long_n: int = 10_000
    shapes_lat_n: int = 100
    shapes_web_procs: tuple[int, ...] = (1, 16, 64)
    shapes_web_n: int = 4_800
    shapes_xmin_n: int = 20_000
    shapes_xmin_drains: int = 3
    shapes_poll_n: int = 1_000
    shapes_poll_reps: int = 100
    # The ``limits`` phase (``bench/limits.py``): the non-binding drains (no-op and 20 ms
    # handlers, the keyed target's keys, the workers), the binding drain (jobs, workers),
    # and the admission's poll (the backlogs, the calls timed).
    limits_n: int = 20_000
    limits_wait_n: int = 6_000
    limits_keys: int = 1_000
    limits_workers: int = 3
    limits_tight_n: int = 1_000
    limits_tight_workers: int = 4
    limits_poll_small: int = 1_000
    limits_poll_big: int = 1_000_000
    limits_poll_reps: int = 200
    limits_poll_budget_s: float = 10.0
    limits_poll_rounds: int = 3
    limits_cap_s: float = 30.0

    @property
    def logs(self) -> Path:
        """Where the worker processes' output goes."""
        return self.results_dir / "logs"


def shown(path: Path) -> str:
    """``path`` for a message or a report: relative to the repository when inside it (a
    committed report names no path of the machine that ran it)."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def payload(i: int) -> dict[str, Any]:
    """The payload of docs/benchmarks.md#definitions."""
    return {"i": i, "ts": time.time(), "msg": "hello world"}


def pct(values: list[float], p: float) -> float:
    """Linear-interpolated percentile, as the peers' harness computes it."""
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


# -- the queue's tables ------------------------------------------------------------------------


def sql(query: str, params: list[Any] | tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall() if cursor.description else []


def remaining() -> int:
    """Rows still to drain (PENDING or RUNNING); DEAD rows are counted apart."""
    return sql(f"SELECT COUNT(*) FROM {store.JOBS} WHERE status IN ('PENDING', 'RUNNING')")[0][0]


def drained() -> bool:
    """No row left to drain: ``remaining() == 0`` at a fraction of its cost. A count
    reads every row (~13 ms at 50,000), and a drain sampled every 20 ms by counts spends
    a third of a core of this 2-core machine on the sampling, beside the workers."""
    return not sql(f"SELECT EXISTS (SELECT 1 FROM {store.JOBS} "
                   "WHERE status IN ('PENDING', 'RUNNING'))")[0][0]


def dead_count() -> int:
    return sql(f"SELECT COUNT(*) FROM {store.JOBS} WHERE status = 'DEAD'")[0][0]


def reset() -> None:
    """Empty the queue between phases (workers are stopped by then)."""
    for table in (store.JOBS, store.DONE_JOBS, store.INFLIGHT):
        sql(f"TRUNCATE {table}" if store.is_postgres() else f"DELETE FROM {table}")
    sql(f"UPDATE {store.PARTITIONS} SET owner = NULL, lease_until = NULL")
    sql(f"DELETE FROM {store.WORKERS}")
    sql(f"DELETE FROM {store.PAUSES}")
    analyze()


def analyze() -> None:
    sql(f"ANALYZE {store.JOBS}")


E100_KEYS = 1_000  # the keyed E100: each job one of this many keys


def enqueue_rate(target: str, n: int, keys: int = 0, tenant: str | None = None) -> float:
    """E100: ``n`` jobs of ``target`` enqueued 100 per transaction; jobs per second. With
    ``keys``, each job has one of that many keys, as events of business objects do; with
    ``tenant``, every job is that tenant's, as when a request of a tenant enqueues."""
    batches = n // 100
    keyed = [{"key": f"k{i}"} for i in range(keys)]
    started = time.perf_counter()
    with job_context(None, None, tenant):
        for b in range(batches):
            with transaction.atomic():
                enqueue_many([{"target": target, "payload": payload(i),
                               **(keyed[i % keys] if keys else {})}
                              for i in range(b * 100, b * 100 + 100)])
    elapsed = time.perf_counter() - started
    stored = remaining()
    if stored != batches * 100:
        raise RuntimeError(f"E100 stored {stored} rows, expected {batches * 100}")
    return batches * 100 / elapsed


def fill(target: str, n: int, chunk: int = 500) -> None:
    """``n`` jobs of ``target`` committed in one transaction (all pending at once)."""
    with transaction.atomic():
        for start in range(0, n, chunk):
            enqueue_many([{"target": target, "payload": payload(i)}
                          for i in range(start, min(n, start + chunk))])


def kafka_fill(target: str, n: int, keys: int, chunk: int = 500) -> None:
    """``n`` events over ``keys`` keys, versions 1, 2, ... per key, committed in one
    transaction in event order (every key's version 1, then every key's version 2, ...)."""
    with transaction.atomic():
        for start in range(0, n, chunk):
            enqueue_many([{"target": target, "payload": payload(i), "key": f"k{i % keys}",
                           "version": i // keys + 1}
                          for i in range(start, min(n, start + chunk))])


def partitions_balanced(count: int) -> bool:
    """Every one of ``count`` fast workers holds its fair share of the partitions."""
    rows = sql(f"SELECT owner, COUNT(*) FROM {store.PARTITIONS} WHERE owner IS NOT NULL "
               "GROUP BY owner")
    partitions = jobs_settings().PARTITIONS
    return (len(rows) == count and sum(n for _, n in rows) == partitions
            and all(n >= partitions // count for _, n in rows))


def workers_registered(count: int) -> bool:
    return sql(f"SELECT COUNT(*) FROM {store.WORKERS}")[0][0] >= count


# -- worker processes --------------------------------------------------------------------------

_started: list[ManagedProcess] = []  # every worker of this run, for ``kill_all``


class WorkerDied(RuntimeError):
    pass


@dataclass
class Workers:
    """``count`` worker processes of one ``manage.py`` command (with ``args``) for one
    measurement, named ``<name>-<i>`` (their output:
    ``<results>/logs/<name>-<i>.stdout|.stderr``)."""

    o: Options
    command: str
    count: int
    name: str
    env: dict[str, str] = field(default_factory=dict)
    group: ProcessGroup | None = None
    args: tuple[str, ...] = ()

    def start(self) -> Workers:
        env = process_env(SETTINGS_MODULE, {"JOBS_LOG_LEVEL": self.o.log_level, **self.env})
        self.group = ProcessGroup(MANAGE_PY, self.o.logs, env, cwd=ROOT)
        for i in range(self.count):
            _started.append(self.group.start(self.command, *self.args,
                                             name=f"{self.name}-{i}"))
        return self

    def check(self) -> None:
        """``WorkerDied`` if one of them exited (a measurement must not wait on the dead)."""
        for proc in self.group.procs if self.group else []:
            if not proc.alive():
                raise WorkerDied(f"{self.name}: worker pid {proc.pid} exited "
                                 f"rc={proc.popen.returncode} (see {proc.stderr_path})")

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM (a clean shutdown), SIGKILL what has not exited within ``timeout``."""
        if self.group:
            self.group.stop_all(timeout)


def kill_all() -> None:
    """Stop every worker this run started and that still runs (after an error)."""
    for proc in _started:
        proc.stop(timeout=5)
    _started.clear()


@contextlib.contextmanager
def running(workers: Workers) -> Iterator[Workers]:
    workers.start()
    try:
        yield workers
    finally:
        workers.stop()


def wait_for(what: str, check: Callable[[], bool], workers: Workers, timeout: float) -> float:
    """Seconds until ``check()``; ``WorkerDied`` if a worker exits first, a ``TimeoutError``
    (``jobs_engine.testing.WaitTimeout``) after ``timeout``."""
    started = time.perf_counter()

    def reached() -> bool:
        if check():
            return True
        workers.check()
        return False

    wait_until(reached, timeout, f"{workers.name}: {what}")
    return time.perf_counter() - started


def read_starts(path: Path) -> dict[str, float]:
    """The ``<key> <time.time()>`` lines a latency probe appended to ``path``: key -> time."""
    got: dict[str, float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                got[parts[0]] = float(parts[1])
    return got


# -- the drain clock (D1) ----------------------------------------------------------------------


def cpu_times() -> tuple[int, int] | None:
    """The machine's (all, idle) CPU time since boot, in ticks (Linux ``/proc/stat``; idle
    counts I/O wait); None elsewhere."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(value) for value in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(ticks), ticks[3] + ticks[4]


@dataclass
class DrainWatch:
    """What the machine and the workers' sessions do during a drain: the share of the
    machine's CPUs busy (the bench's own sampling included), and the wait events of the
    database sessions that are running a statement, sampled at each probe of the drain
    clock. A lock convoy shows as ``Lock`` waits, running on a CPU as no wait event."""

    first: tuple[int, int] | None = None
    last: tuple[int, int] | None = None
    waits: Counter[str] = field(default_factory=Counter)

    def sample(self) -> None:
        self.last = cpu_times()
        if self.first is None:
            self.first = self.last
        if store.is_postgres():
            for kind, event in sql(
                    "SELECT wait_event_type, wait_event FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND backend_type = 'client backend' AND state = 'active'"):
                self.waits[f"{kind}: {event}" if kind else "CPU"] += 1

    def busy_percent(self) -> float:
        if self.first is None or self.last is None or self.last[0] == self.first[0]:
            return float("nan")
        return 100 * (1 - (self.last[1] - self.first[1]) / (self.last[0] - self.first[0]))

    def share(self, kind: str) -> float:
        """Percent of the running sessions' samples waiting on ``kind`` ("CPU": none)."""
        total = sum(self.waits.values())
        found = sum(n for name, n in self.waits.items()
                    if name == kind or name.startswith(f"{kind}:"))
        return 100 * found / total if total else float("nan")

    def summary(self) -> str:
        total = sum(self.waits.values())
        top = ", ".join(f"{name} {100 * n / total:.0f}%" for name, n in self.waits.most_common(5))
        return f"CPU busy {self.busy_percent():.0f}%; running sessions: {top or 'none seen'}"


def drain(o: Options, command: str, target: str, n: int, count: int, name: str,
          ready: Callable[[], bool], env: dict[str, str] | None = None,
          filler: Callable[[], None] | None = None, watch: DrainWatch | None = None
          ) -> dict[str, float]:
    """D1: one worker starts on ``n`` pre-enqueued rows (the peers' method). Several
    workers first reach their steady state (partitions balanced / registered), then the
    ``n`` rows are committed in one transaction, so the partition rebalance, which takes
    up to two heartbeats, is start-up and not drain time. Clock: first observed progress
    → queue empty. ``env`` goes to the workers; ``filler`` commits the ``n`` rows (default:
    ``fill(target, n)``); ``watch`` samples the machine and the sessions meanwhile."""
    reset()
    workers = Workers(o, command, count, name, env or {})
    load = filler or (lambda: fill(target, n))
    if count == 1:
        load()
        analyze()
    with running(workers):
        t_zero = time.perf_counter()
        if count > 1:
            wait_for("steady state", ready, workers, timeout=90)
            load()
            t_zero = time.perf_counter()
        t_first, rem_first, t_end = clock_drain(o, workers, n, deadline=t_zero + max(180.0, n / 20),
                                                during=watch.sample if watch else None)
    return {
        "rate": rem_first / (t_end - t_first) if t_end > t_first else float("nan"),
        "rate_incl_startup": n / (t_end - t_zero),
        "startup_s": t_first - t_zero,
        "drain_s": t_end - t_first,
        "dead": dead_count(),
    }


def clock_drain(o: Options, workers: Workers, n: int, deadline: float, *,
                count: Callable[[], int] = remaining, empty: Callable[[], bool] = drained,
                during: Callable[[], None] | None = None) -> tuple[float, int, float]:
    """Sample the queue every ``drain_poll_s`` until it is empty: the time of the first
    progress and the rows left then, and the time it was found empty. Counts until the first
    progress (its count is the rate's numerator), then the cheap emptiness probe, so the
    sampling takes little from the workers. ``count`` and ``empty`` read another queue
    than the engine's (the ``tasks`` phase's django-tasks-db table); ``during`` is called
    at each probe from the first progress on (``DrainWatch.sample``)."""
    t_first: float | None = None
    rem_first = n
    while True:
        left = count() if t_first is None else int(not empty())
        now = time.perf_counter()
        if t_first is None and left < n:
            t_first, rem_first = now, left
        if during is not None and t_first is not None:
            during()
        if left == 0:
            assert t_first is not None
            return t_first, rem_first, now
        if now > deadline:
            raise TimeoutError(f"{workers.name}: drain timeout, {count()} rows left")
        workers.check()
        time.sleep(o.drain_poll_s)


# -- the Kafka broker --------------------------------------------------------------------------


class BenchBroker(KafkaBroker):
    """The broker on the bench's own port and data dir, stopped at the end of the run only
    if this run started it."""

    started_here = False

    def start(self) -> None:
        self.started_here = not self.running()
        self.script("start", timeout=300)  # the first start may fetch the jars

    def stop_if_started(self) -> None:
        if self.started_here:
            with contextlib.suppress(RuntimeError, OSError):
                self.stop()


_broker: BenchBroker | None = None


def kafka_broker(o: Options) -> BenchBroker:
    """The bench broker, running, with the bench topics; the driver's targets point at it."""
    global _broker
    if _broker is None:
        broker = BenchBroker(o.kafka_port, o.kafka_dir)
        started = time.perf_counter()
        broker.start()
        _broker = broker
        kafka_create_topics(broker.bootstrap,
                            [targets.kafka_topic(kind) for kind in targets.KAFKA_TOPICS])
        targets.register_kafka(broker.bootstrap)
        how = "started" if broker.started_here else "already running"
        print(f"    kafka broker on {broker.bootstrap} ({how}, "
              f"{time.perf_counter() - started:.1f}s)", flush=True)
    return _broker


def stop_kafka() -> None:
    global _broker
    if _broker is not None:
        _broker.stop_if_started()
        _broker = None


def kafka_create_topics(bootstrap: str, topics: list[str]) -> None:
    """The bench topics, ``KAFKA_PARTITIONS`` each (an existing one is kept)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(t, KAFKA_PARTITIONS, 1) for t in topics],
                                  request_timeout=30)
    for future in futures.values():
        try:
            future.result(60)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    # A topic just created answers NOT_LEADER until its partitions have leaders.
    deadline = time.monotonic() + 60
    while not all(_has_leaders(admin, topic) for topic in topics):
        if time.monotonic() > deadline:
            raise RuntimeError(f"kafka topics {topics} have no leaders after 60 s")
        time.sleep(0.2)


def _has_leaders(admin: Any, topic: str) -> bool:
    found = admin.list_topics(topic, timeout=15).topics.get(topic)
    return (found is not None and found.error is None and len(found.partitions) > 0
            and all(p.leader >= 0 and p.error is None for p in found.partitions.values()))


def kafka_end_offset(bootstrap: str, topic: str) -> int:
    """Records appended to ``topic`` so far (the sum of its partitions' high watermarks).

    A broker just started may still be settling its partitions' leaders: a retriable
    answer, or one that names a leader being settled (``NOT_LEADER_FOR_PARTITION``, which
    the client does not mark retriable), is asked again for up to 30 s.
    """
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    settling = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE}

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks",
                         "enable.auto.commit": False})
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                partitions = consumer.list_topics(topic, timeout=15).topics[topic].partitions
                return sum(consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                          timeout=15)[1]
                           for p in partitions)
            except KafkaException as exc:
                error = exc.args[0]
                if not (error.retriable() or error.code() in settling) \
                        or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        consumer.close()
