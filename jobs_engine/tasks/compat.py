"""Django's Tasks API, wherever it lives: ``django.tasks`` on Django 6, the ``django-tasks``
backport on Django 5.2 (``pip install "jobs-engine[tasks]"``). The backend has one code
path; only these imports differ."""

from importlib.util import find_spec
from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured

__all__ = [
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]

# The type checker reads the first branch only (Django 6's django.tasks, typed by
# django-stubs): the backport's classes are the same API under other names.
if TYPE_CHECKING or find_spec("django.tasks") is not None:
    from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import (
        InvalidTask,
        InvalidTaskBackend,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
elif find_spec("django_tasks") is not None:
    from django_tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskError
    from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json
else:
    raise ImproperlyConfigured(
        "jobs_engine.tasks needs Django's Tasks API: Django 6, or on Django 5.2 the "
        "django-tasks backport (pip install \"jobs-engine[tasks]\")")
