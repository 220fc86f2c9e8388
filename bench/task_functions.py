"""The tasks of the ``tasks`` phase (``bench/tasks.py``), for both backends of Django's Tasks
API: bound to a backend with ``task.using(backend=...)``, imported by the bench and by both
systems' worker processes.

``started`` appends ``<key> <time.time()>`` to the file named by ``BENCH_LAT_FILE``
(``bench.targets.LAT_FILE_ENV``, as the latency target does) first thing, so the bench can
pair it with the moment the enqueuing transaction committed.
"""

from __future__ import annotations

import os
import time

from django.tasks import task

from bench.targets import LAT_FILE_ENV


@task
def noop() -> None:
    """Does nothing: what a drain of it measures is the backend."""


@task
def started(key: str) -> None:
    """Records when it started (seconds since the epoch) under ``key``."""
    now = time.time()
    with open(os.environ[LAT_FILE_ENV], "a") as out:
        out.write(f"{key} {now:.6f}\n")
