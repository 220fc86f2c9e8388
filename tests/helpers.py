"""Helpers shared by the database tests: a test-driven monotonic clock and a race runner."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.db import connection


@contextmanager
def statements(prefix: str) -> Iterator[list[tuple[str, Any]]]:
    """(sql, params) of every statement starting with ``prefix`` that this connection runs
    meanwhile (to ``EXPLAIN EXECUTE`` a prepared one with its parameters)."""
    seen: list[tuple[str, Any]] = []

    def capture(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.startswith(prefix):
            seen.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        yield seen


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


def fast_poller(prefix: str = "fast") -> Callable[[datetime], int]:
    """One fast-lane worker: a function that heartbeats (taking its partitions) and polls
    once at the given time."""
    from jobs_engine import conf, store
    from jobs_engine.lanes.fast import FastLane
    from jobs_engine.lanes.partitions import PartitionLeases
    from jobs_engine.lanes.pauses import PauseGate

    settings = conf.jobs_settings()
    worker_id = f"{prefix}-{uuid.uuid4().hex[:6]}"
    clock = FakeMonotonic()
    leases = PartitionLeases(worker_id, settings, monotonic=clock)
    fast = FastLane(worker_id, settings, leases, PauseGate(worker_id, settings), monotonic=clock)
    store.partitions_seed(settings.PARTITIONS)

    def poll(at: datetime) -> int:
        leases.heartbeat(at)
        return fast.run_once(at)

    return poll


def require_postgres(suite: str, why: str) -> None:
    """Refuse to collect ``suite`` on SQLite (a loud usage error, never a silent skip)."""
    import pytest
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    if "postgresql" not in engine:
        raise pytest.UsageError(
            f"{suite} {why} and needs PostgreSQL; set DATABASE_URL=postgres://... or do not "
            f"select {suite} on SQLite. Database engine in use: {engine}")


def drain_long_lane(until: Callable[[], Any], rounds: int = 30) -> None:
    """Run the long lane in this process (no threads) until ``until()`` or ``rounds``
    passes, each a minute later than the last (past any retry wait of DEFAULT_POLICY)."""
    from datetime import timedelta

    from django.utils import timezone

    from jobs_engine.conf import load_settings
    from jobs_engine.lanes.long import LongLane
    from jobs_engine.lanes.pauses import PauseGate

    settings = load_settings({}, environ={})
    worker_id = f"drain-{uuid.uuid4().hex[:6]}"
    lane = LongLane(worker_id, settings, PauseGate(worker_id, settings), threads=False,
                    monotonic=FakeMonotonic())
    at = timezone.now()
    for _ in range(rounds):
        if until():
            return
        lane.run_once(at)
        at += timedelta(minutes=1)


# What the in-flight marks' statements start with (``store.inflight_mark_if_leased``, the
# poll's read that marks, ``store.inflight_clear``).
MARK_SQL = "INSERT INTO jobs_engine_inflight"
CLEAR_SQL = "DELETE FROM jobs_engine_inflight WHERE token"


def in_flight(partition: int | None = None) -> list[int]:
    """The ids marked in flight, sorted: of every partition, or of ``partition``."""
    from jobs_engine.models import InflightMark

    marks = InflightMark.objects.all() if partition is None else \
        InflightMark.objects.filter(partition=partition)
    return sorted(int(job_id) for mark in marks for job_id in mark.ids)
