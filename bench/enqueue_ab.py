"""E100, keyed E100 and E1 of the engine that ``PYTHONPATH`` puts first: one line of medians
over 3 repetitions, each into an emptied table. Run it from two checkouts in turn, each on a
database of its own migrated by its own code, to compare enqueue before and after a change
side by side (bench/README.md, "Before and after a change")::

    PYTHONPATH=$CHECKOUT DATABASE_URL=.../bench_$SIDE .venv/bin/python bench/enqueue_ab.py
"""

from __future__ import annotations

import os
import statistics
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from jobs_engine.enqueueing import enqueue, enqueue_many  # noqa: E402
from jobs_engine.registry import register_target  # noqa: E402

TARGET = "bench.enqueue_ab"
BATCHES, SINGLES, REPS = 50, 1_000, 3


def emptied() -> None:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE jobs_engine_job")
        cursor.execute("ANALYZE jobs_engine_job")


def e100(keyed: bool = False) -> float:
    emptied()
    started = time.perf_counter()
    for batch in range(BATCHES):
        with transaction.atomic():
            enqueue_many([{"target": TARGET, "payload": {"n": i, "s": "x" * 40},
                           **({"key": f"k{i % 1000}"} if keyed else {})}
                          for i in range(batch * 100, batch * 100 + 100)])
    return BATCHES * 100 / (time.perf_counter() - started)


def e1() -> float:
    emptied()
    started = time.perf_counter()
    for i in range(SINGLES):
        enqueue(TARGET, {"n": i, "s": "x" * 40})
    return SINGLES / (time.perf_counter() - started)


def main() -> None:
    call_command("migrate", verbosity=0)
    register_target(TARGET, lambda job: None, lane="fast")
    runs: dict[str, list[float]] = {"e100": [], "e100_keyed": [], "e1": []}
    for _ in range(REPS):
        runs["e100"].append(e100())
        runs["e100_keyed"].append(e100(keyed=True))
        runs["e1"].append(e1())
    print(" ".join(f"{name}={statistics.median(rates):.0f}" for name, rates in runs.items()))


if __name__ == "__main__":
    main()
