"""Running a task in a worker: the handler of every task queue's target.

The engine does the rest, as for any long-lane job: the lease, the outcome, the retries of
the queue's policy, the try recorded in the job's ``tries``. A task that raises fails the
try with that exception; its return value is kept as the job's result.
"""

from __future__ import annotations

from traceback import format_exception
from typing import Any

from django.utils import timezone

from jobs_engine.context import current_try
from jobs_engine.job import Job
from jobs_engine.registry import policy_for
from jobs_engine.tasks.compat import (
    TaskContext,
    TaskError,
    TaskResultStatus,
    normalize_json,
    task_finished,
    task_started,
)
from jobs_engine.tasks.results import task_of, task_result


def run_task(job: Job) -> Any:
    """Call the task the job names; Django's ``task_started`` and ``task_finished`` are sent
    around it, with the ``TaskResult`` as it stands."""
    payload = job.payload
    task = task_of(payload)
    running = current_try()
    assert job.id is not None, "a task's job is stored (long lane)"
    result = task_result(
        task, job.id, TaskResultStatus.RUNNING, payload=payload,
        enqueued_at=job.created_at, tries=running.earlier if running else (),
        running=(running.worker_id, running.started_at) if running else None)
    sender = type(task.get_backend())
    task_started.send(sender=sender, task_result=result)
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *result.args, **result.kwargs)
        else:
            value = task.call(*result.args, **result.kwargs)
        value = normalize_json(value)
    except Exception as exc:
        last = job.attempts + 1 >= policy_for(job.target).attempts
        object.__setattr__(result, "status",
                           TaskResultStatus.FAILED if last else TaskResultStatus.READY)
        object.__setattr__(result, "finished_at", timezone.now())
        kind = type(exc)
        result.errors.append(TaskError(exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
                                       traceback="".join(format_exception(exc))))
        task_finished.send(sender=sender, task_result=result)  # inside except: exc_info is set
        raise
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "finished_at", timezone.now())
    object.__setattr__(result, "_return_value", value)
    task_finished.send(sender=sender, task_result=result)
    return value
