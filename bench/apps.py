"""The bench app: registers the bench targets in every process that loads bench.settings, and
``JOBS_BENCH_IDLE_TARGETS`` idle ones of each lane when that variable is set (the ``shapes``
phase's workers), the ``limits`` phase's targets that ``BENCH_LIMITS`` names, and counts the
statements of the process when ``BENCH_COUNT_SQL`` is set (``bench/sqlcount.py``)."""

from __future__ import annotations

import os

from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "bench"
    verbose_name = "Benchmarks"

    def ready(self) -> None:
        from bench import sqlcount, targets

        targets.register()
        idle = targets.idle_count()
        if idle:
            targets.register_idle(idle)
        limits = targets.limits_named()
        if limits:
            targets.register_limits(limits)
        count_to = os.environ.get(sqlcount.COUNT_ENV)
        if count_to:
            sqlcount.install(count_to)
