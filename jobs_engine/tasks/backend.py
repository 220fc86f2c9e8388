"""``JobsEngineBackend``: Django's Tasks API on this engine.

``TASKS = {"default": {"BACKEND": "jobs_engine.tasks.JobsEngineBackend", "QUEUES": [...],
"OPTIONS": {...}}}``. A task's ``enqueue()`` is ``jobs_engine.enqueue`` of a job of its
queue's long-lane target: it joins the caller's transaction, and runs under the queue's
policy and delivery mode in ``run_long_lane`` / ``run_workers``. The result id is the job's
id.
"""

from __future__ import annotations

import json
import re
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from jobs_engine.enqueueing import enqueue
from jobs_engine.errors import InvalidJob
from jobs_engine.inspection import MAX_JOB_ID, get_job
from jobs_engine.tasks.compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
)
from jobs_engine.tasks.queues import queue_rules, register_queues, target_name
from jobs_engine.tasks.results import NotATask, result_of, task_payload
from jobs_engine.text import json_text

_RESULT_ID = re.compile(r"[1-9][0-9]{0,18}")


class JobsEngineBackend(BaseTaskBackend):
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.rules = queue_rules(alias, sorted(self.queues), self.options)
        register_queues(alias, self.rules)

    def enqueue[**P, R](self, task: Task[P, R], args: Any, kwargs: Any) -> TaskResult[P, R]:
        """One job, in the caller's transaction: rolled back, there is no task. It belongs
        to the tenant of the request or job that enqueues it (``enqueue``'s rule)."""
        self.validate_task(task)
        args, kwargs = _json_arguments(task, args, kwargs)
        run_after = task.run_after
        if run_after is not None and timezone.is_naive(run_after):  # USE_TZ = False
            run_after = timezone.make_aware(run_after)
        try:
            job = enqueue(target_name(self.alias, task.queue_name),
                          task_payload(task, args, kwargs, self.alias), code=task.module_path,
                          run_at=run_after, priority=task.priority)
        except InvalidJob as exc:
            field = "arguments" if exc.field == "payload" else exc.field
            raise InvalidTask(f"{task.module_path}: {field} {exc.problem}") from None
        result = TaskResult(task=task, id=str(job.job_id), status=TaskResultStatus.READY,
                            enqueued_at=timezone.now(), started_at=None, last_attempted_at=None,
                            finished_at=None, args=args, kwargs=kwargs, backend=self.alias,
                            errors=[], worker_ids=[])
        transaction.on_commit(partial(task_enqueued.send, type(self), task_result=result))
        return result

    def get_result(self, result_id: str) -> TaskResult[..., Any]:
        """The task's result as it is now; ``TaskResultDoesNotExist`` for an id that is not
        one of this backend's tasks, or whose job is gone (not kept by its queue's policy,
        skipped or cancelled by an operator, pruned)."""
        if not isinstance(result_id, str) or not _RESULT_ID.fullmatch(result_id) \
                or int(result_id) > MAX_JOB_ID:
            raise TaskResultDoesNotExist(result_id)
        job = get_job(int(result_id))
        if job is None or not job.target.startswith(target_name(self.alias, "")):
            raise TaskResultDoesNotExist(result_id)
        try:
            return result_of(job)
        except NotATask:  # a job of a task queue's target that no task enqueued
            raise TaskResultDoesNotExist(result_id) from None


def _json_arguments(task: Task[..., Any], args: Any, kwargs: Any
                    ) -> tuple[list[Any], dict[str, Any]]:
    """The arguments exactly as the worker and ``get_result`` will read them back from the
    stored JSON (``{1: 2}`` is ``{"1": 2}`` there, a tuple a list): ``TypeError`` (json's
    own message) for one that JSON cannot hold, as Django documents; ``InvalidTask`` for
    text no column can hold or nesting past ``MAX_PAYLOAD_DEPTH``."""
    call = [list(args), dict(kwargs)]
    try:
        text = json_text(call)
    except ValueError as exc:
        try:
            json.dumps(call)
        except TypeError:
            raise  # json's own message, as Django documents
        except (ValueError, RecursionError):
            pass
        raise InvalidTask(f"{task.module_path}: arguments {exc}") from None
    stored_args, stored_kwargs = json.loads(text)
    return stored_args, stored_kwargs


def register_configured_backends() -> None:
    """The targets of every ``TASKS`` backend of this engine, at start-up: a worker runs
    their queues before any code of it touched ``task_backends``."""
    for alias, params in (getattr(settings, "TASKS", None) or {}).items():
        try:
            backend = import_string(params["BACKEND"])
        except (ImportError, KeyError, TypeError):
            continue  # Django reports a backend it cannot import, when it is used
        if isinstance(backend, type) and issubclass(backend, JobsEngineBackend):
            register_queues(alias, queue_rules(alias, list(params.get("QUEUES", ["default"])),
                                               params.get("OPTIONS", {})))
