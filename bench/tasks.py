"""The ``tasks`` phase: Django's Tasks API on this engine against django-tasks-db, side by
side in every round.

Two ``TASKS`` aliases of ``bench/settings.py``: ``ours`` (``jobs_engine.tasks.
JobsEngineBackend``, run by ``manage.py run_long_lane``) and ``theirs`` (django-tasks-db's
``django_tasks_db.DatabaseBackend``, run by ``manage.py db_worker`` with its defaults and
the flags that make it take this backend's one queue, ``THEIRS_WORKER_ARGS``). The tasks
are ``bench/task_functions.py``'s, bound to a backend with ``task.using(backend=...)``.
Each measurement runs for one system, then for the other (which goes first alternates by
round):

- E1: ``tasks_e1_n`` (2,000) no-op tasks, each ``enqueue()`` in a transaction of its own;
- E100: ``tasks_n`` (10,000) no-op tasks, 100 ``enqueue()`` calls per transaction;
- drain: those ``tasks_n`` tasks (``ANALYZE``d) run by one worker process; clock from the
  worker's spawn until none is READY or RUNNING (and from the first observed progress, as
  D1), then every task is checked SUCCESSFUL;
- latency: an idle worker, ``tasks_lat_n`` (300) tasks each enqueued in a transaction of
  its own ``tasks_lat_pause_s`` (50 ms) apart; the task's start (``time.time()`` appended
  to a file) minus the moment right after the commit.

django-tasks-db is the bench's own requirement (``bench/requirements-tasks.txt``), never
the project's: without it the phase stops with one line saying how to install it. Import
after ``django.setup()``.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.db import transaction
from django.tasks import Task, TaskResultStatus

from bench.harness import (
    Metrics,
    Options,
    Workers,
    analyze,
    clock_drain,
    dead_count,
    drained,
    pct,
    read_starts,
    remaining,
    reset,
    running,
    sql,
    wait_for,
)
from bench.targets import LAT_FILE_ENV
from bench.task_functions import noop, started
from jobs_engine import store
from jobs_engine.tasks.queues import target_name
from jobs_engine.testing import wait_until

OURS, THEIRS = "ours", "theirs"  # the TASKS aliases of bench/settings.py
QUEUE = "default"  # the one queue of both aliases
THEIRS_APP = "django_tasks_database"  # django_tasks_db's app label (its migrations)
THEIRS_WORKER_ARGS = ("--backend", THEIRS, "--queue-name", QUEUE)
OURS_WORKER = "run_long_lane"
THEIRS_WORKER = "db_worker"
REQUIREMENT = ("the tasks phase needs django-tasks-db, the bench's own requirement: "
               ".venv/bin/pip install -r bench/requirements-tasks.txt")
METRICS = ("e1", "e100", "drain", "drain_first", "lat_p50", "lat_p99")


def theirs_version() -> str:
    try:
        return version("django-tasks-db")
    except PackageNotFoundError:
        return "not installed"


@dataclass(frozen=True)
class System:
    """One backend under test: its alias, its worker command and how to read its queue."""

    alias: str
    command: str
    args: tuple[str, ...]
    reset: Callable[[], None]
    analyze: Callable[[], None]
    left: Callable[[], int]  # tasks READY or RUNNING
    empty: Callable[[], bool]  # none READY or RUNNING (cheaper than ``left() == 0``)
    outcome: Callable[[int], tuple[int, int]]  # (SUCCESSFUL, FAILED) of the n just drained

    def task(self, task: Task) -> Task:
        return task.using(backend=self.alias)

    def worker(self, o: Options, name: str, env: dict[str, str] | None = None) -> Workers:
        return Workers(o, self.command, 1, f"tasks-{self.alias}-{name}", env or {},
                       args=self.args)


# -- ours: the engine's tables -------------------------------------------------------------


def ours_done() -> int:
    """Runs of ours' queue that ended OK, from the engine's hourly statistics (written
    after each outcome commits): the completed jobs kept are capped by the queue's
    ``keep_completed``, the statistics are not."""
    return int(sql(f"SELECT COALESCE(SUM(count), 0) FROM {store.JOB_STAT_SHARDS} "
               "WHERE target = %s AND outcome = 'ok'", [target_name(OURS, QUEUE)])[0][0])


_ours_done_before = 0


def ours_reset() -> None:
    global _ours_done_before
    reset()
    _ours_done_before = ours_done()


def ours_outcome(n: int) -> tuple[int, int]:
    """Every task's job ended OK (the statistics' count of this drain) and none is DEAD;
    a sample of the results kept reads SUCCESSFUL through the backend."""
    with contextlib.suppress(TimeoutError):  # the statistics follow the outcome's commit
        wait_until(lambda: ours_done() - _ours_done_before >= n, 10, "ours' statistics")
    ids = [row[0] for row in sql(f"SELECT id FROM {store.DONE_JOBS} WHERE target = %s "
                                 "ORDER BY id DESC LIMIT 20", [target_name(OURS, QUEUE)])]
    backend = noop.using(backend=OURS).get_backend()
    statuses = {backend.get_result(str(job_id)).status for job_id in ids}
    if ids and statuses != {TaskResultStatus.SUCCESSFUL}:
        raise RuntimeError(f"tasks: ours' completed tasks read {statuses}, not SUCCESSFUL")
    return ours_done() - _ours_done_before, dead_count()


# -- theirs: django-tasks-db's table -------------------------------------------------------


def theirs_model() -> Any:
    from django_tasks_db.models import DBTaskResult

    return DBTaskResult


def theirs_table() -> str:
    return theirs_model()._meta.db_table


def theirs_reset() -> None:
    sql(f"TRUNCATE {theirs_table()}" if store.is_postgres() else f"DELETE FROM {theirs_table()}")
    theirs_analyze()


def theirs_analyze() -> None:
    sql(f"ANALYZE {theirs_table()}")


def theirs_pending() -> Any:
    return theirs_model().objects.filter(backend_name=THEIRS, status__in=["READY", "RUNNING"])


def theirs_empty() -> bool:
    """No task READY (read in the order of its partial index, so an index scan whatever the
    statistics say), then none RUNNING (a scan, but only once none is READY): a probe of
    both at once every 20 ms scans the table each time (~1 ms at 10,000 rows)."""
    rows = theirs_model().objects.filter(backend_name=THEIRS)
    ready = rows.filter(status="READY").order_by("-priority", "run_after", "enqueued_at")
    return not ready.values_list("pk")[:1] and not rows.filter(status="RUNNING").exists()


def theirs_outcome(n: int) -> tuple[int, int]:
    rows = theirs_model().objects.filter(backend_name=THEIRS)
    return rows.filter(status="SUCCESSFUL").count(), rows.filter(status="FAILED").count()


SYSTEMS = {
    OURS: System(OURS, OURS_WORKER, (), ours_reset, analyze, remaining, drained, ours_outcome),
    THEIRS: System(THEIRS, THEIRS_WORKER, THEIRS_WORKER_ARGS, theirs_reset, theirs_analyze,
                   lambda: theirs_pending().count(), theirs_empty, theirs_outcome),
}


# -- the phase -----------------------------------------------------------------------------

_rounds = 0  # which system goes first alternates by round
_migrated = False


def phase_tasks(o: Options) -> Metrics:
    global _rounds
    ready_theirs()
    order = [SYSTEMS[OURS], SYSTEMS[THEIRS]]
    if _rounds % 2:
        order.reverse()
    _rounds += 1
    out: Metrics = {}
    for system in order:
        system.reset()
        out[f"tasks:e1:{system.alias}"] = enqueue_rate(system, o.tasks_e1_n, 1)
    for system in order:
        system.reset()
        out[f"tasks:e100:{system.alias}"] = enqueue_rate(system, o.tasks_n, 100)
    for system in order:
        system.analyze()
    for system in order:
        out.update(drain(o, system, o.tasks_n))
    for system in order:
        out.update(latency(o, system))
    for system in order:
        system.reset()
    for metric in METRICS:
        out[f"tasks:{metric}:ratio"] = (out[f"tasks:{metric}:{OURS}"]
                                        / out[f"tasks:{metric}:{THEIRS}"])
    for system in order:
        alias = system.alias
        print(f"    {alias}: E1 {out[f'tasks:e1:{alias}']:,.0f}, E100 "
              f"{out[f'tasks:e100:{alias}']:,.0f}, drain {out[f'tasks:drain:{alias}']:,.0f} "
              f"({out[f'tasks:drain_first:{alias}']:,.0f} from the first progress) tasks/s; "
              f"latency p50 {out[f'tasks:lat_p50:{alias}']:.1f} ms, p99 "
              f"{out[f'tasks:lat_p99:{alias}']:.1f} ms", flush=True)
    return out


def missing() -> str | None:
    """``REQUIREMENT`` when django-tasks-db is not installed (``bench/settings.py`` then
    configures no ``theirs`` backend)."""
    if THEIRS not in getattr(settings, "TASKS", {}) or theirs_version() == "not installed":
        return REQUIREMENT
    return None


def ready_theirs() -> None:
    """django-tasks-db installed, its backend configured and its table migrated."""
    global _migrated
    if missing():
        raise RuntimeError(REQUIREMENT)
    if not _migrated:
        call_command("migrate", THEIRS_APP, verbosity=0)
        _migrated = True


def enqueue_rate(system: System, n: int, per_tx: int) -> float:
    """``n`` no-op tasks, ``per_tx`` ``enqueue()`` calls per transaction; tasks per second."""
    task = system.task(noop)
    batches = n // per_tx
    begun = time.perf_counter()
    for _ in range(batches):
        with transaction.atomic():
            for _ in range(per_tx):
                task.enqueue()
    elapsed = time.perf_counter() - begun
    stored = system.left()
    if stored != batches * per_tx:
        raise RuntimeError(f"tasks {system.alias}: {stored} tasks stored, expected "
                           f"{batches * per_tx}")
    return batches * per_tx / elapsed


def drain(o: Options, system: System, n: int) -> Metrics:
    """The ``n`` tasks enqueued (E100) run by one worker process; then all SUCCESSFUL?"""
    if system.left() != n:
        raise RuntimeError(f"tasks {system.alias}: {system.left()} tasks to drain, not {n}")
    workers = system.worker(o, "drain")
    with running(workers):
        t_zero = time.perf_counter()
        t_first, rem_first, t_end = clock_drain(o, workers, n, t_zero + max(180.0, n / 20),
                                                count=system.left, empty=system.empty)
    succeeded, failed = system.outcome(n)
    alias = system.alias
    print(f"    drain {alias}: {n / (t_end - t_zero):,.0f} tasks/s from the worker's spawn, "
          f"{rem_first / (t_end - t_first):,.0f} from the first progress (start-up "
          f"{t_first - t_zero:.2f}s); SUCCESSFUL {succeeded:,}, FAILED {failed:,}", flush=True)
    return {f"tasks:drain:{alias}": n / (t_end - t_zero),
            f"tasks:drain_first:{alias}": rem_first / (t_end - t_first),
            f"tasks:drain_startup_s:{alias}": t_first - t_zero,
            f"tasks:drain:{alias}:dead": failed, f"tasks:drain:{alias}:missing": n - succeeded}


def latency(o: Options, system: System) -> Metrics:
    """An idle worker; each task enqueued in its own transaction, ``tasks_lat_pause_s``
    apart: its start in the worker minus the moment right after the commit."""
    system.reset()
    o.logs.mkdir(parents=True, exist_ok=True)
    lat_file = o.logs / f"tasks-latency-{system.alias}.task"
    lat_file.unlink(missing_ok=True)
    task = system.task(started)
    tag = uuid.uuid4().hex[:8]
    after: dict[str, float] = {}
    workers = system.worker(o, "latency", {LAT_FILE_ENV: str(lat_file)})
    with running(workers):
        warm = f"warm-{tag}"
        with transaction.atomic():
            task.enqueue(warm)
        wait_for("warm-up task", lambda: warm in read_starts(lat_file), workers, timeout=60)
        time.sleep(2.0)  # idle and waiting
        for i in range(o.tasks_lat_n):
            key = f"lat-{tag}-{i}"
            with transaction.atomic():
                task.enqueue(key)
            after[key] = time.time()
            time.sleep(o.tasks_lat_pause_s)
        with contextlib.suppress(TimeoutError):
            wait_for("every task started", lambda: set(after) <= set(read_starts(lat_file)),
                     workers, timeout=60)
    starts = read_starts(lat_file)
    lats = [(starts[k] - t) * 1000 for k, t in after.items() if k in starts]
    return {f"tasks:lat_p50:{system.alias}": pct(lats, 50),
            f"tasks:lat_p99:{system.alias}": pct(lats, 99),
            f"tasks:lat:{system.alias}:missing": len(after) - len(lats)}
