"""Settings of the bench processes (the driver and the worker subprocesses).

The project settings plus the bench app, whose ``ready()`` registers the bench targets,
so ``manage.py run_fast_lane`` started with ``DJANGO_SETTINGS_MODULE=bench.settings``
can run them.

The ``tasks`` phase (``bench/tasks.py``) compares two backends of Django's Tasks API, each
under a ``TASKS`` alias of its own: ``ours`` (``jobs_engine.tasks.JobsEngineBackend``) and,
only when ``django_tasks_db`` is importable (``bench/requirements-tasks.txt``), ``theirs``
(``django_tasks_db.DatabaseBackend``) with its app, so these settings load without it.
"""

from __future__ import annotations

import os
from importlib.util import find_spec

# Workers run as in production (and as the peers' harness runs theirs): with DEBUG on,
# Django keeps every statement of a worker in memory. The demo refuses DEBUG off without
# a key of its own.
os.environ.setdefault("DJANGO_SECRET_KEY", "bench-only-secret-key-" + "x" * 40)

from config.settings import *  # noqa: F403
from config.settings import INSTALLED_APPS, JOBS, TASKS
from jobs_engine import JobPolicy

INSTALLED_APPS = [*INSTALLED_APPS, "bench.apps.BenchConfig"]

# The tasks phase's backends (bench/tasks.py OURS, THEIRS), each with the one queue its
# tasks use; "default" stays the project's.
TASKS = {**TASKS, "ours": {"BACKEND": "jobs_engine.tasks.JobsEngineBackend",
                           "QUEUES": ["default"]}}
if find_spec("django_tasks_db") is not None:
    INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks_db"]
    TASKS["theirs"] = {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}

# The Kafka phase's topic whose completed jobs are not kept (bench/targets.py KAFKA_TOPICS;
# the workers get the topics themselves from JOBS_KAFKA_EXTRA_TOPICS).
JOBS = {**JOBS, "KAFKA": {**JOBS["KAFKA"], "POLICIES": {
    **JOBS["KAFKA"].get("POLICIES", {}), "bench.kafka-alo-keep-none": JobPolicy(keep_completed=0)}}}

DEBUG = False
