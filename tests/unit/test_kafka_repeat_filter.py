"""librdkafka repeats the same line at every reconnect while a broker is down (about once a
second, for as long as the outage lasts); ``kafka_target.producer.RepeatFilter`` lets one
through per interval and says how many it dropped."""

from __future__ import annotations

import logging

from kafka_target.producer import RepeatFilter, client_logger
from tests.helpers import FakeMonotonic

REFUSED = ("FAIL [rdkafka#producer-{n}] [thrd:127.0.0.1:19092/bootstrap]: 127.0.0.1:19092/"
           "bootstrap: Connect to ipv4#127.0.0.1:19092 failed: Connection refused "
           "(after {ms}ms in state CONNECT{suppressed})")


def record(text: str) -> logging.LogRecord:
    return logging.LogRecord("kafka_target.librdkafka", logging.ERROR, __file__, 1, "%s",
                             (text,), None)


def refused(n: int = 1, ms: int = 0, suppressed: int = 0) -> logging.LogRecord:
    more = f", {suppressed} identical error(s) suppressed" if suppressed else ""
    return record(REFUSED.format(n=n, ms=ms, suppressed=more))


def test_a_repeated_line_passes_once_per_interval_with_the_count_dropped() -> None:
    clock = FakeMonotonic()
    repeats = RepeatFilter(interval=30, monotonic=clock)
    assert repeats.filter(refused()) is True
    dropped = []
    for second in range(1, 30):  # the parts that vary between repeats do not matter
        clock.advance(1)
        dropped.append(repeats.filter(refused(n=1 + second % 2, ms=second, suppressed=second)))
    assert dropped == [False] * 29
    clock.advance(1)
    line = refused()
    assert repeats.filter(line) is True
    assert line.getMessage().endswith("[29 repeat(s) in the last 30 s not logged]")
    assert "Connection refused" in line.getMessage()


def test_a_different_line_passes_at_once() -> None:
    clock = FakeMonotonic()
    repeats = RepeatFilter(interval=30, monotonic=clock)
    assert repeats.filter(refused()) is True
    assert repeats.filter(record("FAIL [rdkafka#producer-1] broker 2 down")) is True
    assert repeats.filter(refused()) is False


def test_the_client_logger_has_the_filter() -> None:
    assert any(isinstance(f, RepeatFilter) for f in client_logger.filters)
