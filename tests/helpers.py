"""Helpers shared by the database tests: a test-driven monotonic clock and a race runner."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connection


class FakeMonotonic:
    """A monotonic clock that moves only when the test moves it."""

    def __init__(self, start: float = 1000.0) -> None:
        self.value = start

    def __call__(self) -> float:
        return self.value

    def advance(self, seconds: float) -> None:
        self.value += seconds


def race(*steps: Callable[[], Any]) -> list[Any]:
    """Run ``steps`` at the same moment in threads (PostgreSQL) or in turn (SQLite, where
    one worker process is the supported set-up)."""
    if connection.vendor != "postgresql":
        return [step() for step in steps]
    barrier = threading.Barrier(len(steps))
    results: list[Any] = [None] * len(steps)
    errors: list[BaseException] = []

    def run(index: int, step: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout=10)
            results[index] = step()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, step)) for i, step in enumerate(steps)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    if errors:
        raise errors[0]
    return results
