"""librdkafka repeats the same line at every reconnect while a broker is down (about once a
second, for as long as the outage lasts); ``jobs_engine.contrib.kafka.producer.RepeatFilter``
lets one through per interval and says how many it dropped. A broker that is down is expected
(its targets pause), so the lines saying so become a WARNING summary, never an ERROR."""

from __future__ import annotations

import logging
import socket
import time

import pytest

from jobs_engine.contrib.kafka.producer import RepeatFilter, client_logger
from jobs_engine.contrib.kafka.settings import parse_kafka_settings
from tests.helpers import FakeMonotonic

REFUSED = ("FAIL [rdkafka#producer-{n}] [thrd:127.0.0.1:19092/bootstrap]: 127.0.0.1:19092/"
           "bootstrap: Connect to ipv4#127.0.0.1:19092 failed: Connection refused "
           "(after {ms}ms in state CONNECT{suppressed})")
# What librdkafka 2.16 logs at ERROR when the port answers, but not as Kafka (here: HTTP).
WRONG_SERVICE = ("FAIL [rdkafka#producer-{n}] [thrd:127.0.0.1:8000/bootstrap]: 127.0.0.1:8000/"
                 "bootstrap: Receive failed: Invalid response size 1213486160 (0..100000000): "
                 "increase receive.message.max.bytes (after {ms}ms in state APIVERSION_QUERY)")
# librdkafka 2.16's other lines about a broker it cannot reach (levels as it logs them).
UNREACHABLE = [
    (logging.ERROR, "FAIL [rdkafka#producer-1] [thrd:no-such-host.invalid:9092/bootstrap]: "
     "no-such-host.invalid:9092/bootstrap: Failed to resolve 'no-such-host.invalid:9092': "
     "Name or service not known (after 1ms in state CONNECT)",
     "kafka: broker no-such-host.invalid:9092 unreachable: name not resolved "
     "(Name or service not known)"),
    (logging.WARNING, "FAIL [rdkafka#producer-1] [thrd:127.0.0.1:19092/bootstrap]: "
     "127.0.0.1:19092/bootstrap: Connection setup timed out in state CONNECT "
     "(after 3003ms in state CONNECT)",
     "kafka: broker 127.0.0.1:19092 unreachable: Connection setup timed out in state CONNECT"),
    (logging.INFO, "FAIL [rdkafka#producer-1] [thrd:127.0.0.1:19092/bootstrap]: "
     "127.0.0.1:19092/bootstrap: Disconnected: connection reset by peer "
     "(after 0ms in state APIVERSION_QUERY)",
     "kafka: broker 127.0.0.1:19092 unreachable: Disconnected: connection reset by peer"),
]


def record(text: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord("jobs_engine.kafka.librdkafka", level, __file__, 1, "%s",
                             (text,), None)


def refused(n: int = 1, ms: int = 0, suppressed: int = 0) -> logging.LogRecord:
    more = f", {suppressed} identical error(s) suppressed" if suppressed else ""
    return record(REFUSED.format(n=n, ms=ms, suppressed=more))


def test_a_repeated_line_passes_once_per_interval_with_the_count_dropped() -> None:
    clock = FakeMonotonic()
    repeats = RepeatFilter(interval=30, monotonic=clock)
    first = record(WRONG_SERVICE.format(n=1, ms=0))
    assert repeats.filter(first) is True
    assert (first.levelno, first.getMessage()) == (logging.ERROR,
                                                   WRONG_SERVICE.format(n=1, ms=0))
    dropped = []
    for second in range(1, 30):  # the parts that vary between repeats do not matter
        clock.advance(1)
        dropped.append(repeats.filter(record(WRONG_SERVICE.format(n=1 + second % 2,
                                                                  ms=second))))
    assert dropped == [False] * 29
    clock.advance(1)
    line = record(WRONG_SERVICE.format(n=1, ms=0))
    assert repeats.filter(line) is True
    assert line.getMessage().endswith("[29 repeat(s) in the last 30 s not logged]")
    assert "Invalid response size" in line.getMessage()
    assert line.levelno == logging.ERROR  # not an outage: it keeps its level


def test_connection_refused_is_a_warning_summary_once_per_interval_with_the_count() -> None:
    clock = FakeMonotonic()
    repeats = RepeatFilter(interval=30, monotonic=clock)
    first = refused()
    assert repeats.filter(first) is True
    assert (first.levelno, first.levelname) == (logging.WARNING, "WARNING")
    assert first.getMessage() == "kafka: broker 127.0.0.1:19092 unreachable: Connection refused"
    dropped = []
    for second in range(1, 30):  # other reasons for the same broker count as repeats
        clock.advance(1)
        line = refused(n=1 + second % 2, ms=second, suppressed=second) if second % 3 \
            else record(UNREACHABLE[1][1], UNREACHABLE[1][0])
        dropped.append(repeats.filter(line))
    assert dropped == [False] * 29
    clock.advance(1)
    line = refused(suppressed=4)
    assert repeats.filter(line) is True
    assert line.levelno == logging.WARNING
    assert line.getMessage() == ("kafka: broker 127.0.0.1:19092 unreachable: Connection refused "
                                 "(29 repeats in the last 30 s)")


@pytest.mark.parametrize(("level", "text", "summary"), UNREACHABLE)
def test_every_unreachable_line_is_a_summary_at_most_warning(level: int, text: str,
                                                             summary: str) -> None:
    line = record(text, level)
    assert RepeatFilter(interval=30, monotonic=FakeMonotonic()).filter(line) is True
    assert line.getMessage() == summary
    assert line.levelno == min(level, logging.WARNING)  # lowered, never raised


def test_other_client_lines_keep_their_level_and_text() -> None:
    repeats = RepeatFilter(interval=30, monotonic=FakeMonotonic())
    for level, text in [
        (logging.ERROR, WRONG_SERVICE.format(n=1, ms=0)),
        # A disconnect with a configuration hint is no outage.
        (logging.ERROR, "FAIL [rdkafka#producer-1] [thrd:127.0.0.1:9093/bootstrap]: "
         "127.0.0.1:9093/bootstrap: Disconnected while requesting ApiVersion: might be caused "
         "by incorrect security.protocol configuration (connecting to a SSL listener?) or "
         "broker version is < 0.10 (see api.version.request) (after 1ms in state "
         "APIVERSION_QUERY)"),
        (logging.WARNING, "CONFWARN [rdkafka#producer-1] [thrd:app]: Configuration property "
         "queue.buffering.max.ms is a producer property and will be ignored"),
    ]:
        line = record(text, level)
        assert repeats.filter(line) is True
        assert (line.levelno, line.getMessage()) == (level, text)


def test_a_different_line_passes_at_once() -> None:
    clock = FakeMonotonic()
    repeats = RepeatFilter(interval=30, monotonic=clock)
    assert repeats.filter(refused()) is True
    assert repeats.filter(record("FAIL [rdkafka#producer-1] broker 2 down")) is True
    assert repeats.filter(refused()) is False


def test_the_client_logger_has_the_filter() -> None:
    assert any(isinstance(f, RepeatFilter) for f in client_logger.filters)


def test_a_producer_with_no_broker_logs_no_error() -> None:
    """End to end, no broker needed: the project's client config against a closed local
    port (bound, not listening: refused), polled for 3 s, logs warnings only."""
    from confluent_kafka import Producer

    class Records(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.DEBUG)
            self.records: list[logging.LogRecord] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.records.append(record)

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    server = f"127.0.0.1:{closed.getsockname()[1]}"
    config = parse_kafka_settings({"BOOTSTRAP_SERVERS": server}, environ={}).producer_config()
    seen = Records()
    client_logger.addHandler(seen)
    try:
        producer = Producer({**config, "logger": client_logger})
        until = time.monotonic() + 3
        while time.monotonic() < until:
            producer.poll(0.1)
        producer.flush(0)
        del producer
    finally:
        client_logger.removeHandler(seen)
        closed.close()
    lines = [(r.levelname, r.getMessage()) for r in seen.records]
    assert ("WARNING", f"kafka: broker {server} unreachable: Connection refused") in lines
    assert all(r.levelno < logging.ERROR for r in seen.records), lines
