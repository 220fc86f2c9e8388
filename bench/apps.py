"""The bench app: registers the bench targets in every process that loads bench.settings."""

from __future__ import annotations

from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "bench"
    verbose_name = "Benchmarks"

    def ready(self) -> None:
        from bench import targets

        targets.register()
