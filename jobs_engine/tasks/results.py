"""A task as a job, and back: the job's payload names the task and its arguments; the job,
wherever it is (waiting, running, DEAD, or completed and kept), reads as a ``TaskResult``.

A task's statuses are the job's (``docs/design.md#djangos-tasks-api``): PENDING is READY,
RUNNING is RUNNING once its handler started, DEAD is FAILED and DONE is SUCCESSFUL. One
entry of the job's ``tries`` is one attempt: its worker is in ``worker_ids``, what it raised
in ``errors``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from django.utils.dateparse import parse_datetime
from django.utils.module_loading import import_string

from jobs_engine.inspection import JobInfo
from jobs_engine.states import JobStatus
from jobs_engine.store import read_dt
from jobs_engine.tasks.compat import InvalidTask, Task, TaskError, TaskResult, TaskResultStatus

STATUSES = {JobStatus.PENDING: TaskResultStatus.READY, JobStatus.RUNNING: TaskResultStatus.RUNNING,
            JobStatus.DEAD: TaskResultStatus.FAILED, JobStatus.DONE: TaskResultStatus.SUCCESSFUL}


def task_payload(task: Task[..., Any], args: list[Any], kwargs: dict[str, Any], alias: str
                 ) -> dict[str, Any]:
    """Everything that rebuilds the task and its call: what a job of it carries."""
    return {"task": task.module_path, "args": args, "kwargs": kwargs, "backend": alias,
            "queue": task.queue_name, "priority": task.priority,
            "run_after": task.run_after.isoformat() if task.run_after is not None else None}


class NotATask(InvalidTask):
    """A job's payload that names no task (a job of a task queue's target that the Tasks
    API did not enqueue)."""


_CALL_FIELDS = {"task": str, "args": list, "kwargs": dict, "backend": str, "queue": str,
                "priority": int}


def task_of(payload: Any) -> Task[..., Any]:
    """The task a job's payload names, as it was enqueued (priority, queue, run_after);
    ``NotATask`` for a payload ``task_payload`` did not make."""
    if not isinstance(payload, dict) or not all(
            isinstance(payload.get(name), kind) for name, kind in _CALL_FIELDS.items()) \
            or not isinstance(payload.get("run_after"), str | None):
        raise NotATask(f"the job's payload names no task: {str(payload)[:200]!r}")
    return _task(payload["task"], payload["priority"], payload["queue"], payload["backend"],
                 payload.get("run_after"))


@lru_cache(maxsize=1024)
def _task(path: str, priority: int, queue: str, backend: str, run_after: str | None
          ) -> Task[..., Any]:
    """Tasks are frozen: one per way they were enqueued, not one per run (``Task.using``
    validates anew; a worker runs the same few thousands of times)."""
    try:
        task = import_string(path)
    except ImportError as exc:
        raise InvalidTask(f"cannot import the task {path!r}: {exc}") from exc
    if not isinstance(task, Task):
        raise InvalidTask(f"{path!r} is not a task: decorate it with @task")
    if (priority, queue, backend, run_after) == (task.priority, task.queue_name, task.backend,
                                                 None):
        return task  # enqueued as declared (the usual case): validated when it was declared
    return task.using(priority=priority, queue_name=queue, backend=backend,
                      run_after=parse_datetime(run_after) if run_after else None)


def task_result(task: Task[..., Any], job_id: int, status: TaskResultStatus, *,
                payload: dict[str, Any], enqueued_at: datetime | None,
                tries: Sequence[dict[str, Any]], running: tuple[str, datetime] | None = None,
                finished_at: datetime | None = None, return_value: Any = None
                ) -> TaskResult[..., Any]:
    """The ``TaskResult`` of a job: ``tries`` are its ended attempts, ``running`` the
    worker and start of the attempt under way."""
    starts = [read_dt(entry.get("started_at")) for entry in tries]
    worker_ids = [str(entry.get("worker")) for entry in tries]
    if running is not None:
        worker_ids.append(running[0])
        starts.append(running[1])
    result: TaskResult[..., Any] = TaskResult(
        task=task, id=str(job_id), status=status, enqueued_at=enqueued_at,
        started_at=starts[0] if starts else None,
        last_attempted_at=starts[-1] if starts else None, finished_at=finished_at,
        args=payload["args"], kwargs=payload["kwargs"], backend=payload["backend"],
        errors=[TaskError(exception_class_path=entry["error"],
                          traceback=entry.get("traceback", "")) for entry in tries
                if entry.get("error")],
        worker_ids=worker_ids)
    object.__setattr__(result, "_return_value", return_value)
    return result


def result_of(job: JobInfo) -> TaskResult[..., Any]:
    """The ``TaskResult`` of a task's job as it is now."""
    running = (job.running_on or "", job.started_at) \
        if job.status is JobStatus.RUNNING and job.started_at is not None else None
    status = STATUSES[job.status] if job.status is not JobStatus.RUNNING or running is not None \
        else TaskResultStatus.READY  # reserved, its handler not started yet
    return task_result(
        task_of(job.payload), job.id, status, payload=job.payload, enqueued_at=job.created_at,
        tries=job.tries, running=running,
        finished_at=job.finished_at if job.status in (JobStatus.DEAD, JobStatus.DONE) else None,
        return_value=job.result if job.status is JobStatus.DONE else None)
