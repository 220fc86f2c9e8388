"""The bench app: registers the bench targets in every process that loads bench.settings, and
``JOBS_BENCH_IDLE_TARGETS`` idle ones of each lane when that variable is set (the ``shapes``
phase's workers)."""

from __future__ import annotations

from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "bench"
    verbose_name = "Benchmarks"

    def ready(self) -> None:
        from bench import targets

        targets.register()
        idle = targets.idle_count()
        if idle:
            targets.register_idle(idle)
