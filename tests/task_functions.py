"""Tasks of Django's Tasks API for the tests of ``jobs_engine.tasks``: Django's own
documented examples (``docs/topics/tasks``, their bodies unchanged) and a few that record
what they saw. Imported by the test process and by real worker processes alike."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from django.core.mail import send_mail

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task

from jobs_engine.policies import JobPolicy

THREE_TRIES = JobPolicy(attempts=3, backoff_s=0.05, keep_completed=100, keep_failed=100)
KEEP_TWO = JobPolicy(attempts=1, keep_completed=2, keep_failed=2)

logger = logging.getLogger(__name__)


# -- Django's documented examples ----------------------------------------------------------


@task
def email_users(emails, subject, message):
    return send_mail(
        subject=subject, message=message, from_email=None, recipient_list=emails
    )


@task(priority=2, queue_name="emails")
def email_users_on_queue(emails, subject, message):
    return send_mail(
        subject=subject, message=message, from_email=None, recipient_list=emails
    )


@task(takes_context=True)
def email_users_with_context(context, emails, subject, message):
    logger.debug(
        f"Attempt {context.attempt} to send user email. Task result id: {context.task_result.id}."
    )
    return send_mail(
        subject=subject, message=message, from_email=None, recipient_list=emails
    )


@task()
def double_dictionary(key):
    return {key: key * 2}


@task
def process_data(value):
    return value


# -- the engine's own tests -----------------------------------------------------------------


@task
def add(a: int, b: int) -> int:
    return a + b


@task
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@task(takes_context=True)
def who_am_i(context: Any) -> dict[str, Any]:
    return {"attempt": context.attempt, "id": context.task_result.id,
            "status": str(context.task_result.status),
            "worker_ids": context.task_result.worker_ids}


@task
def fail(message: str) -> None:
    raise ValueError(message)


@task(queue_name="retried", takes_context=True)
def fail_twice(context: Any) -> int:
    if context.attempt < 3:
        raise RuntimeError(f"try {context.attempt} fails")
    return context.attempt


@task
def record(label: str, out_dir: str, sleep_s: float = 0.0) -> str:
    """Appends ``start <label> <pid> <time>`` to a file of its process, flushed and
    fsynced, sleeps, then ``end ...``: a SIGKILL mid-task leaves a start without an end."""
    path = os.path.join(out_dir, f"{os.getpid()}.log")
    for event in ("start", "end"):
        with open(path, "a") as log:
            log.write(f"{event} {label} {os.getpid()} {time.time():.6f}\n")
            log.flush()
            os.fsync(log.fileno())
        if event == "start" and sleep_s:
            time.sleep(sleep_s)
    return label


@task(queue_name="once")
def record_once(label: str, out_dir: str, sleep_s: float = 0.0) -> str:
    return record.func(label, out_dir, sleep_s)
