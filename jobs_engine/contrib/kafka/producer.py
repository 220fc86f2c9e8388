"""One long-lived confluent-kafka producer per worker process (per cluster config).

The producer is created on the first send, in the process that sends (a worker), never at
import, and a forked child never reuses its parent's (librdkafka's threads do not survive a
fork). Sends are serialised by a lock: ``send`` produces its messages, then waits for
every delivery report, so nothing of a send is still queued in the client when it returns.

The Python client does not expose librdkafka's per-message persistence status, so the
send itself tells "never transmitted" from "transmitted, no answer": a message still not
delivered after ``QUEUE_WAIT_S`` (connect timeout + 1 s) is purged from the client's
*queues* only, which librdkafka reports as ``_PURGE_QUEUE`` and which by its contract
never touches a message already transmitted. Messages in flight then get their own
report (success, a broker error, or ``_MSG_TIMED_OUT`` at ``message.timeout.ms``); one
still open at the send deadline is purged from flight too (``_PURGE_INFLIGHT``: unknown).

Between sends a daemon thread polls the client once a second, so librdkafka's log and
error events (routed to the ``jobs_engine.kafka.librdkafka`` logger) never pile up. A broker that
is down is expected (its targets pause, their rows wait; the send's outcome carries the
reason), so the client's lines saying a broker is unreachable (connection refused, connect
timeout, name not resolved, disconnected; librdkafka logs them at every reconnect, about once
a second, refused and unresolved at ERROR) become one WARNING summary per broker per
``REPEAT_LOG_S``, with the count of repeats. Any other line the client repeats keeps its level
and is logged once per ``REPEAT_LOG_S``.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from jobs_engine.contrib.kafka.settings import QUEUE_WAIT_S, SEND_DEADLINE_S

logger = logging.getLogger("jobs_engine.kafka")
# librdkafka's own log lines, routed through Python logging instead of raw stderr.
client_logger = logging.getLogger("jobs_engine.kafka.librdkafka")

REPEAT_LOG_S = 30.0  # about one probe period (PROBE_S) of a paused target
# The parts of a librdkafka line that change between repeats of the same event.
_VARYING = re.compile(r"\(after \d+ms in state \w+(?:, \d+ identical error\(s\) suppressed)?\)"
                      r"|#producer-\d+")
# A broker that cannot be reached, as librdkafka 2.16 says it (after _VARYING is removed):
# "FAIL [rdkafka] [thrd:h:p/bootstrap]: h:p/bootstrap: Connect to ipv4#h:p failed: Connection
# refused", "...: Failed to resolve 'h:p': Name or service not known", "...: Connection setup
# timed out in state CONNECT", "...: Disconnected: connection reset by peer". A disconnect with
# more to say (a TLS or protocol hint in parentheses) is no outage and keeps its level.
_UNREACHABLE = re.compile(
    r"\]: (?P<broker>[^\s/]+)/\S*: (?:Connect to \S+ failed: (?P<connect>[^(]+?)"
    r"|Failed to resolve '[^']*': (?P<resolve>[^(]+?)"
    r"|(?P<other>Connection setup timed out in state \w+|Disconnected(?:: [^(]+?)?))\s*$")


class RepeatFilter(logging.Filter):
    """Passes a librdkafka line at most once per ``interval`` seconds; the next one that
    passes says how many repeats were dropped. Lines that differ pass at once.

    A line saying a broker is unreachable becomes a summary, at most WARNING: one per broker
    per interval whatever the reason, ``kafka: broker h:p unreachable: <reason>``."""

    def __init__(self, interval: float = REPEAT_LOG_S,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval = interval
        self._monotonic = monotonic
        self._seen: dict[str, tuple[float, int]] = {}  # line -> (last passed, dropped since)
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        line = _VARYING.sub("", text)
        unreachable = _UNREACHABLE.search(line)
        if unreachable:  # one key per broker: a reason that alternates is still one outage
            line = f"unreachable {unreachable['broker']}"
        now = self._monotonic()
        with self._lock:
            seen = self._seen.get(line)
            if seen is not None and now - seen[0] < self.interval:
                self._seen[line] = (seen[0], seen[1] + 1)
                return False
            if len(self._seen) > 256:  # bounded: forget old lines rather than grow
                self._seen.clear()
            self._seen[line] = (now, 0)
        dropped = seen[1] if seen is not None else 0
        since = now - seen[0] if seen is not None else 0.0
        if unreachable:
            reason = unreachable["connect"] or unreachable["other"] or \
                f"name not resolved ({unreachable['resolve']})"
            record.msg, record.args = (
                f"kafka: broker {unreachable['broker']} unreachable: {reason}"
                + (f" ({dropped} repeats in the last {since:.0f} s)" if dropped else ""), ())
            if record.levelno > logging.WARNING:  # expected while a broker is down
                record.levelno, record.levelname = logging.WARNING, "WARNING"
        elif dropped:
            record.msg, record.args = (
                f"{text} [{dropped} repeat(s) in the last {since:.0f} s not logged]", ())
        return True


client_logger.addFilter(RepeatFilter())


class OutMessage(NamedTuple):
    topic: str
    value: bytes
    key: bytes | None = None
    headers: Sequence[tuple[str, bytes | None]] = ()


class ProducerUnavailable(Exception):
    """The client could not be created (a configuration librdkafka refuses)."""


_PENDING = object()
IDLE_POLL_S = 1.0


class KafkaProducer:
    """A lazily created ``confluent_kafka.Producer`` and the send protocol around it."""

    def __init__(self, config: dict[str, Any],
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.config = dict(config)
        self._monotonic = monotonic
        self._producer: Any = None
        self._lock = threading.Lock()
        self._replace = False
        # error_cb messages since the last send that delivered every record: librdkafka
        # reports a repeated error once, so a broker refusing since before a send is told
        # before it, not during it.
        self.client_errors: list[str] = []
        self.sends = 0
        self._closed = threading.Event()
        self._poller: threading.Thread | None = None

    # -- the client -----------------------------------------------------------------

    def _client(self) -> Any:
        if self._producer is None or self._replace:
            from confluent_kafka import KafkaException, Producer

            try:
                self._producer = Producer({**self.config, "error_cb": self._on_error,
                                           "logger": client_logger})
            except KafkaException as exc:
                raise ProducerUnavailable(f"kafka producer could not be created: {exc}") from exc
            self._replace = False
            if self._poller is None:
                self._poller = threading.Thread(target=self._poll_while_idle, daemon=True,
                                                name="kafka-producer-poll")
                self._poller.start()
        return self._producer

    def _poll_while_idle(self) -> None:
        """Serve the client's log and error events between sends: librdkafka queues them
        for ``poll()``, and an idle producer whose broker is down would pile them up."""
        while not self._closed.wait(IDLE_POLL_S):
            with self._lock:
                if self._producer is not None:
                    try:
                        self._producer.poll(0)
                    except Exception:  # a failing log handler must not end the poller
                        logger.exception("kafka producer poll failed")

    def _on_error(self, err: Any) -> None:
        text = f"{err.name()}: {err.str()}"
        self.client_errors.append(text)
        del self.client_errors[:-5]
        if err.fatal():  # cannot happen without idempotence; start afresh if it does
            self._replace = True
            logger.error("kafka producer fatal error, replacing the producer: %s", text)
        else:  # librdkafka logs the same failure itself (jobs_engine.kafka.librdkafka)
            logger.debug("kafka client error: %s", text)

    def close(self, timeout: float = 5.0) -> None:
        self._closed.set()
        with self._lock:
            if self._producer is not None:
                self._producer.flush(timeout)
                self._producer = None

    # -- a send ---------------------------------------------------------------------

    def send(self, messages: Sequence[OutMessage], deadline: float | None = None
             ) -> list[Any]:
        """Produce ``messages`` and wait for every report.

        Returns, per message in order, None (delivered) or the ``KafkaError`` that ended
        it. Returns by ``deadline`` (monotonic; default now + ``SEND_DEADLINE_S``) with
        every message resolved, so none can be sent after the caller decided its outcome.
        """
        with self._lock:
            start = self._monotonic()
            deadline = start + SEND_DEADLINE_S if deadline is None else deadline
            self.sends += 1
            producer = self._client()
            results = self._send(producer, messages, start, deadline)
            if all(result is None for result in results):  # the errors before are over
                self.client_errors = []
            return results

    def _send(self, producer: Any, messages: Sequence[OutMessage], start: float,
              deadline: float) -> list[Any]:
        from confluent_kafka import KafkaError, KafkaException

        results: list[Any] = [_PENDING] * len(messages)

        def reporter(index: int) -> Callable[[Any, Any], None]:
            def on_delivery(err: Any, _msg: Any) -> None:
                results[index] = err

            return on_delivery

        for index, message in enumerate(messages):
            try:
                producer.produce(message.topic, message.value, key=message.key,
                                 headers=message.headers, on_delivery=reporter(index))
            except KafkaException as exc:  # refused by the client before queueing
                results[index] = exc.args[0]
            except BufferError as exc:
                results[index] = KafkaError(KafkaError._QUEUE_FULL, str(exc))
            except (TypeError, ValueError) as exc:
                results[index] = KafkaError(KafkaError._INVALID_ARG, str(exc))

        def open_count() -> int:
            producer.poll(0)  # serve reports already waiting
            return sum(1 for result in results if result is _PENDING)

        queue_wait_until = min(start + QUEUE_WAIT_S, deadline)
        if open_count():
            producer.flush(max(0.0, queue_wait_until - self._monotonic()))
        if open_count():
            # Still queued = never transmitted: librdkafka reports them _PURGE_QUEUE.
            producer.purge(in_queue=True, in_flight=False, blocking=True)
            if open_count():
                producer.flush(max(0.0, deadline - self._monotonic()))
        if open_count():
            producer.purge(in_queue=True, in_flight=True, blocking=True)
            producer.flush(0)
        for index, result in enumerate(results):
            if result is _PENDING:  # no report even after the purge: treat as in flight
                results[index] = KafkaError(KafkaError._PURGE_INFLIGHT,
                                            "no delivery report by the send deadline")
        return results


_producers: dict[tuple[int, tuple[tuple[str, str], ...]], KafkaProducer] = {}
_producers_lock = threading.Lock()


def get_producer(config: dict[str, Any]) -> KafkaProducer:
    """This process's producer for ``config`` (one per cluster configuration)."""
    key = (os.getpid(), tuple(sorted((name, repr(value)) for name, value in config.items())))
    with _producers_lock:
        producer = _producers.get(key)
        if producer is None:
            # A child forked from a process with producers starts with none of them.
            for stale in [k for k in _producers if k[0] != key[0]]:
                del _producers[stale]
            producer = _producers[key] = KafkaProducer(config)
        return producer


def producers() -> list[KafkaProducer]:
    with _producers_lock:
        return [p for (pid, _), p in _producers.items() if pid == os.getpid()]


def close_producers(timeout: float = 5.0) -> None:
    """Close this process's producers (shutdown; tests that need a fresh client)."""
    with _producers_lock:
        mine = [key for key in _producers if key[0] == os.getpid()]
        closing = [_producers.pop(key) for key in mine]
    for producer in closing:
        try:
            producer.close(timeout)
        except Exception:  # shutting down: a failing close must not mask the exit
            logger.exception("kafka producer close failed")


atexit.register(close_producers)
