"""Targets run by the real worker processes of ``tests/process``.

Each handler appends what it did to a file per process (``<pid>.log`` in
``$JOBS_TEST_OUT_DIR``), one line written, flushed and fsynced per event, so a record
survives a SIGKILL that lands right after it. A line is
``event job_id target key version partition owner unix_time``: ``start`` when the
handler is entered (that is the send), ``end`` when it returns, ``fail`` when it is about
to raise. Fast-lane handlers also
record the partition's owner read from the database at the start of the send, so a test
can prove that nobody sends a row of a partition it does not own.

Payload ``{"sleep": s}`` makes a handler slow so a signal can land mid-send.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.apps import AppConfig

if TYPE_CHECKING:
    from jobs_engine.job import Job

OUT_DIR_ENV = "JOBS_TEST_OUT_DIR"

FAST_AT_MOST_ONCE = "proc:am"
FAST_AT_LEAST_ONCE = "proc:al"
LONG_AT_MOST_ONCE = "proc:long-am"
LONG_AT_LEAST_ONCE = "proc:long-al"
# Job policies (test_policies_processes.py): payload {"fail": n} fails the first n tries,
# {"fail": "always"} every one; a try that passes returns {"n": payload n, "tries": ...}.
FAST_DEFAULT_POLICY = "proc:policy-default"
LONG_DEFAULT_POLICY = "proc:long-policy-default"
LONG_RUN_ONCE = "proc:long-run-once"
FAST_TWO_ATTEMPTS = "proc:two-attempts"
FAST_KEEP_3 = "proc:keep-3"
NAMES = (FAST_AT_MOST_ONCE, FAST_AT_LEAST_ONCE, LONG_AT_MOST_ONCE, LONG_AT_LEAST_ONCE,
         FAST_DEFAULT_POLICY, LONG_DEFAULT_POLICY, LONG_RUN_ONCE, FAST_TWO_ATTEMPTS,
         FAST_KEEP_3)


@dataclass(frozen=True)
class Record:
    """One line of a handler's record file."""

    pid: int
    event: str
    job_id: int
    target: str
    key: str | None
    version: int
    partition: int
    owner: str | None
    at: float

    @classmethod
    def parse(cls, pid: int, line: str) -> Record:
        event, job_id, target, key, version, partition, owner, at = line.split()
        return cls(pid, event, int(job_id), target, None if key == "-" else key, int(version),
                   int(partition), None if owner == "-" else owner, float(at))


def read_records(out_dir: Path, pid: int) -> list[Record]:
    """Every complete line one process wrote (a line cut by a kill is ignored)."""
    path = out_dir / f"{pid}.log"
    if not path.exists():
        return []
    text = path.read_text()
    return [Record.parse(pid, line) for line in text.splitlines(keepends=True)
            if line.endswith("\n")]


def _write(event: str, job: Job, partition: int, owner: str | None) -> None:
    line = (f"{event} {job.id} {job.target} {job.key or '-'} {job.version} {partition} "
            f"{owner or '-'} {time.time():.6f}\n")
    path = Path(os.environ[OUT_DIR_ENV]) / f"{os.getpid()}.log"
    with open(path, "a") as fh:  # O_APPEND: lines of handler threads never interleave
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def _partition(job: Job) -> int:
    """A key's partition; the stored one of a row without a key (a batch of payloads
    spreads its rows round the partitions), -1 where the handler must not read it."""
    from django.db import connection

    from jobs_engine.conf import jobs_settings
    from jobs_engine.enqueueing import partition_for
    from jobs_engine.models import Job as JobRow

    if job.key is not None:
        return partition_for(job.key, job.dedupe_key, jobs_settings().PARTITIONS)
    if os.environ.get(NO_DATABASE_ENV):
        return -1
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT partition FROM {JobRow._meta.db_table} WHERE id = %s", [job.id])
        row = cursor.fetchone()
    return row[0] if row else -1


def _owner(partition: int) -> str | None:
    from django.db import connection

    from jobs_engine.models import Partition

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT owner FROM {Partition._meta.db_table} WHERE partition = %s",
                       [partition])
        row = cursor.fetchone()
    return row[0] if row else None


def _sleep(job: Job) -> None:
    time.sleep(float((job.payload or {}).get("sleep", 0)))


NO_DATABASE_ENV = "JOBS_TEST_HANDLERS_WITHOUT_DATABASE"


def fast_handler(job: Job) -> None:
    """A fast-lane send: record the owner seen at the start (unless the test cuts the
    database connections and wants handlers that do not read it), maybe sleep, record the
    end."""
    partition = _partition(job)
    owner = None if os.environ.get(NO_DATABASE_ENV) else _owner(partition)
    _write("start", job, partition, owner)
    _sleep(job)
    _write("end", job, partition, None)


def long_handler(job: Job) -> None:
    """A long-lane run (in a pool thread): record start and end around the sleep."""
    partition = _partition(job)
    _write("start", job, partition, None)
    _sleep(job)
    _write("end", job, partition, None)


def policy_handler(job: Job) -> dict[str, Any]:
    """Record the try, fail it while the payload says so, else return a result."""
    partition = _partition(job)
    _write("start", job, partition, None)
    fail = (job.payload or {}).get("fail", 0)
    if fail == "always" or job.attempts < fail:
        _write("fail", job, partition, None)
        raise RuntimeError(f"try {job.attempts + 1} fails")
    _write("end", job, partition, None)
    return {"n": (job.payload or {}).get("n"), "tries": job.attempts + 1}


# Flow steps (test_flows_processes.py): each try appends ``<event> <flow> <position>
# <name> <time>`` to ``<pid>.steps``; data {"sleep": s} slows a step, {"fail_unless": f}
# fails it until the file ``f`` exists in the output folder.
STEP = "proc.step"
SUMMARY = "proc.summary"


@dataclass(frozen=True)
class StepRecord:
    pid: int
    event: str
    flow_id: int
    position: int
    name: str
    at: float


def _write_step(event: str, ctx: Any) -> None:
    path = Path(os.environ[OUT_DIR_ENV]) / f"{os.getpid()}.steps"
    with open(path, "a") as fh:
        fh.write(f"{event} {ctx.flow_id} {ctx.position} {ctx.name} {time.time():.6f}\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_step_records(out_dir: Path) -> list[StepRecord]:
    """Every complete step line of every process, in time order."""
    found = []
    for path in out_dir.glob("*.steps"):
        for line in path.read_text().splitlines(keepends=True):
            if line.endswith("\n"):
                event, flow_id, position, name, at = line.split()
                found.append(StepRecord(int(path.stem), event, int(flow_id), int(position),
                                        name, float(at)))
    return sorted(found, key=lambda r: r.at)


def step_handler(ctx: Any) -> Any:
    """A chain step or batch job: returns its data's ``n`` and what came before it."""
    data = ctx.data or {}
    _write_step("start", ctx)
    time.sleep(float(data.get("sleep", 0)))
    flag = data.get("fail_unless")
    if flag and not (Path(os.environ[OUT_DIR_ENV]) / flag).exists():
        _write_step("fail", ctx)
        raise RuntimeError(f"step {ctx.position} waits for {flag}")
    _write_step("end", ctx)
    return {"n": data.get("n"), "previous": ctx.previous}


def summary_handler(ctx: Any) -> Any:
    """A batch callback: every job's ``n``, in order."""
    _write_step("start", ctx)
    _write_step("end", ctx)
    return [result["n"] for result in ctx.results]


def register() -> None:
    """Register the targets (idempotent: the pytest process registers them too)."""
    from jobs_engine import (
        DEFAULT_POLICY,
        RUN_ONCE_POLICY,
        DeliveryMode,
        JobPolicy,
        Lane,
        register_target,
    )
    from jobs_engine.registry import all_targets

    if FAST_AT_MOST_ONCE in {t.name for t in all_targets()}:
        return
    register_target(FAST_AT_MOST_ONCE, fast_handler, lane=Lane.FAST,
                    delivery_mode=DeliveryMode.AT_MOST_ONCE)
    register_target(FAST_AT_LEAST_ONCE, fast_handler, lane=Lane.FAST,
                    delivery_mode=DeliveryMode.AT_LEAST_ONCE)
    register_target(LONG_AT_MOST_ONCE, long_handler, lane=Lane.LONG,
                    delivery_mode=DeliveryMode.AT_MOST_ONCE)
    register_target(LONG_AT_LEAST_ONCE, long_handler, lane=Lane.LONG,
                    delivery_mode=DeliveryMode.AT_LEAST_ONCE)
    register_target(FAST_DEFAULT_POLICY, policy_handler, lane=Lane.FAST, policy=DEFAULT_POLICY)
    register_target(LONG_DEFAULT_POLICY, policy_handler, lane=Lane.LONG, policy=DEFAULT_POLICY)
    register_target(LONG_RUN_ONCE, policy_handler, lane=Lane.LONG, policy=RUN_ONCE_POLICY)
    register_target(FAST_TWO_ATTEMPTS, policy_handler, lane=Lane.FAST,
                    policy=JobPolicy(attempts=2, backoff_s=0.5))
    register_target(FAST_KEEP_3, policy_handler, lane=Lane.FAST,
                    delivery_mode=DeliveryMode.AT_LEAST_ONCE,
                    policy=JobPolicy(keep_completed=3, keep_failed=2))


def register_steps() -> None:
    from jobs_engine import flows

    flows.register_step(STEP, step_handler)
    flows.register_step(SUMMARY, summary_handler)


class WorkerTargetsConfig(AppConfig):
    """Installed only by ``tests.process.settings``: the worker processes' targets."""

    name = "tests.process"
    label = "process_worker_targets"
    verbose_name = "Process-test targets"

    def ready(self) -> None:
        register()
        register_steps()
