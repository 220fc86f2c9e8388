"""``DatabaseTime``: the lanes ask the database for the time at most once a second and move
its answer on with the monotonic clock in between."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from jobs_engine.lanes.clock import DatabaseTime
from tests.helpers import FakeMonotonic

T0 = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)


def test_the_database_is_asked_once_a_second_and_the_answer_moves_on() -> None:
    monotonic = FakeMonotonic()
    answers = iter([T0, T0 + timedelta(seconds=5)])  # the second: a clock the host lost
    asked: list[datetime] = []

    def read() -> datetime:
        asked.append(next(answers))
        return asked[-1]

    time = DatabaseTime(read, monotonic, every_s=1.0)
    assert time.now() == T0
    monotonic.advance(0.25)
    assert time.now() == T0 + timedelta(seconds=0.25)
    monotonic.advance(0.75)
    assert time.now() == T0 + timedelta(seconds=1)  # a second on: not yet asked again
    assert len(asked) == 1
    monotonic.advance(0.01)
    assert time.now() == T0 + timedelta(seconds=5)  # asked again: the database's word wins
    assert len(asked) == 2


def test_a_wake_up_poll_defers_a_due_reading_to_the_next_call() -> None:
    monotonic = FakeMonotonic()
    answers = iter([T0, T0 + timedelta(seconds=9)])
    time = DatabaseTime(lambda: next(answers), monotonic, every_s=1.0)
    assert time.now(defer_read=True) == T0  # the first reading is never deferred
    monotonic.advance(3)
    assert time.now(defer_read=True) == T0 + timedelta(seconds=3)  # carried over the sleep
    assert time.now() == T0 + timedelta(seconds=9)  # the next call reads
