"""Settings of the bench processes (the driver and the worker subprocesses).

The project settings plus the bench app, whose ``ready()`` registers the bench targets,
so ``manage.py run_fast_lane`` started with ``DJANGO_SETTINGS_MODULE=bench.settings``
can run them.
"""

from __future__ import annotations

import os

# Workers run as in production (and as the peers' harness runs theirs): with DEBUG on,
# Django keeps every statement of a worker in memory. The demo refuses DEBUG off without
# a key of its own.
os.environ.setdefault("DJANGO_SECRET_KEY", "bench-only-secret-key-" + "x" * 40)

from config.settings import *  # noqa: F403
from config.settings import INSTALLED_APPS, JOBS
from jobs_engine import JobPolicy

INSTALLED_APPS = [*INSTALLED_APPS, "bench.apps.BenchConfig"]

# The Kafka phase's topic whose completed jobs are not kept (bench/targets.py KAFKA_TOPICS;
# the workers get the topics themselves from JOBS_KAFKA_EXTRA_TOPICS).
JOBS = {**JOBS, "KAFKA": {**JOBS["KAFKA"], "POLICIES": {
    **JOBS["KAFKA"].get("POLICIES", {}), "bench.kafka-alo-keep-none": JobPolicy(keep_completed=0)}}}

DEBUG = False
