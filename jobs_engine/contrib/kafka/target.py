"""``kafka:<topic>`` targets: build the record, send it, classify the outcome
(docs/design.md#kafka-target).

Record: key = the job's key, value = the payload's JSON text as stored (UTF-8), headers
``event_id`` (the job id), ``trace_id``, ``traceparent`` (W3C), then the job's own headers,
which win (a business event id given at enqueue replaces the job id). A payload of
``None`` is refused as an empty value (DEAD at once): on a compacted topic a null value is
a tombstone that deletes the key, which no job should do by accident.

Outcome classes, from the delivery report's error code (evidence from a real Apache Kafka
4.4 broker and librdkafka 2.16 in ``tests/kafka``):

- never transmitted → ``TargetUnreachable`` (the row keeps its attempts, the target pauses):
  ``_PURGE_QUEUE`` (no connection within the queue wait: broker down, refused, hung at
  connect), an unknown topic (``UNKNOWN_TOPIC_OR_PART`` after
  ``topic.metadata.propagation.max.ms``), and broker answers that guarantee no write;
- transmitted, no answer → ``TargetOutcomeUnknown`` (``_MSG_TIMED_OUT`` after the queue
  purge, ``_TRANSPORT`` on an in-flight request, ``_PURGE_INFLIGHT``). Really unknown: a
  record reported ``_MSG_TIMED_OUT`` by a SIGSTOPped broker is appended once it resumes;
- the broker answered that it may have written (``REQUEST_TIMED_OUT``,
  ``NETWORK_EXCEPTION``, ``NOT_ENOUGH_REPLICAS_AFTER_APPEND``) →
  ``TargetOutcomeUnknown(target_up=True)``;
- the record itself is refused (too large, invalid, empty value) → ``DeadNow``;
- any other answered error → ``KafkaSendError`` (the retry path).

A broker refuses a whole record batch when one record is too large, so in a send of
several records each refused one is sent again alone (a refused batch was not written, so
this cannot duplicate) and only the record that is refused alone goes DEAD.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import random
import re
import time
from collections.abc import Sequence
from typing import Any

from jobs_engine.contrib.kafka.producer import (
    KafkaProducer,
    OutMessage,
    ProducerUnavailable,
    get_producer,
)
from jobs_engine.contrib.kafka.settings import (
    QUEUE_WAIT_S,
    SEND_DEADLINE_S,
    KafkaSettings,
    TopicSpec,
)
from jobs_engine.errors import DeadNow, JobsEngineError, TargetOutcomeUnknown, TargetUnreachable
from jobs_engine.job import Job
from jobs_engine.registry import Target, register_target, unregister_target
from jobs_engine.states import Lane

logger = logging.getLogger("jobs_engine.kafka")

DISABLED_REASON = "kafka disabled by settings"

# Error names (confluent_kafka.KafkaError attribute names) by outcome class.
NOT_SENT = frozenset({
    "_PURGE_QUEUE", "_ALL_BROKERS_DOWN", "_UNKNOWN_TOPIC", "_UNKNOWN_PARTITION", "_RESOLVE",
    "_QUEUE_FULL", "_AUTHENTICATION", "_SSL", "_NOT_CONFIGURED",
    # Broker answers meaning "not appended": the write can be repeated safely.
    "UNKNOWN_TOPIC_OR_PART", "LEADER_NOT_AVAILABLE", "NOT_LEADER_FOR_PARTITION",
    "BROKER_NOT_AVAILABLE", "REPLICA_NOT_AVAILABLE", "NOT_ENOUGH_REPLICAS",
    "KAFKA_STORAGE_ERROR", "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH",
    "TOPIC_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED",
    "SASL_AUTHENTICATION_FAILED", "THROTTLING_QUOTA_EXCEEDED",
})
NO_ANSWER = frozenset({
    "_MSG_TIMED_OUT", "_TIMED_OUT", "_TRANSPORT", "_PURGE_INFLIGHT", "_DESTROY",
    "_TIMED_OUT_QUEUE",
})
ANSWERED_UNKNOWN = frozenset({
    "REQUEST_TIMED_OUT", "NETWORK_EXCEPTION", "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
})
INVALID_RECORD = frozenset({
    "MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE", "INVALID_RECORD",
    "INVALID_MSG", "INVALID_MSG_SIZE", "_BAD_MSG", "_INVALID_ARG",
    "_KEY_SERIALIZATION", "_VALUE_SERIALIZATION",
})
# Broker refusals of a whole record batch: in a send of several messages each is sent
# again alone, so one bad record does not kill the valid ones batched with it.
BATCH_REFUSALS = frozenset({"MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE", "INVALID_RECORD",
                            "INVALID_MSG"})

_HEX32 = re.compile(r"[0-9a-f]{32}")


class KafkaSendError(JobsEngineError):
    """An answered Kafka error that a later resend may fix (the retry path)."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


def error_name(err: Any) -> str:
    return str(err.name())


def classify(err: Any, topic: str, client_error: str = "", *, alone_unchecked: bool = False
             ) -> BaseException | None:
    """The handler outcome for one delivery report error (None: delivered).

    ``client_error`` (the client's last connection error, if any) explains a purge;
    ``alone_unchecked``: the record's batch was refused and no time was left to send it
    alone, so the refusal may be about another record (the retry path, not DEAD).
    """
    if err is None:
        return None
    name = error_name(err)
    if alone_unchecked:
        return KafkaSendError(f"kafka refused the record batch for {topic} ({name}); no time "
                              "left to send this record alone", name)
    text = f"{name} ({err.str()})"
    if name == "_PURGE_QUEUE":
        text = (f"{text}: no broker took it within {QUEUE_WAIT_S:g} s"
                + (f"; last client error {client_error}" if client_error else ""))
    if name in NOT_SENT:
        what = "unknown topic" if "UNKNOWN_TOPIC" in name else "not sent"
        return TargetUnreachable(f"kafka {what} to {topic}: {text}")
    if name in ANSWERED_UNKNOWN:
        return TargetOutcomeUnknown(f"kafka answered without a result for {topic}: {text}",
                                    target_up=True)
    if name in NO_ANSWER:
        return TargetOutcomeUnknown(f"kafka sent to {topic} with no answer: {text}")
    if name in INVALID_RECORD:
        return DeadNow(f"kafka refused the record for {topic}: {text}")
    return KafkaSendError(f"kafka error from {topic}: {text}", name)


# -- the record -----------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)  # a request's jobs share its trace id
def w3c_trace_id(trace_id: str) -> str:
    """``trace_id`` as a W3C trace id; a non-W3C id is hashed to 32 hex digits."""
    trace = trace_id.lower()
    if not _HEX32.fullmatch(trace) or trace == "0" * 32:
        trace = hashlib.sha256(trace_id.encode()).hexdigest()[:32]
    return trace


def traceparent(trace_id: str) -> str:
    """W3C ``traceparent`` for ``trace_id``, with a new span id."""
    # A span id is unique, not secret: the fast generator (an all-zero id is invalid).
    span = random.getrandbits(64) or 1
    return f"00-{w3c_trace_id(trace_id)}-{span:016x}-01"


# One encoder for every header: ``json.dumps`` with options builds a new one per call.
_HEADER_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _header_value(value: Any) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    return _HEADER_ENCODER.encode(value).encode()


def build_message(job: Job, topic: str) -> OutMessage:
    """The Kafka record of ``job``: its payload's stored JSON text, sent as is (no decode
    and encode per record); raises ``DeadNow`` for an empty value."""
    text = job.payload_json
    if text is None or text == "null":
        raise DeadNow(f"kafka refused the record for {topic}: empty value (payload is None)")
    value = text.encode()
    trace_id = job.trace_id
    headers: list[tuple[str, bytes | None]] = [("event_id", str(job.id).encode())]
    if trace_id:
        headers += (("trace_id", trace_id.encode()),
                    ("traceparent", traceparent(trace_id).encode()))
    if job.headers:  # the job's own headers win
        merged = dict(headers)
        for name, header in job.headers.items():
            merged[str(name)] = _header_value(header)
        headers = list(merged.items())
    key = job.key
    return OutMessage(topic, value, key.encode() if key is not None else None, headers)


# -- the target ---------------------------------------------------------------------


class KafkaTarget:
    """The handlers of one ``kafka:<topic>`` target, bound to the Kafka settings."""

    def __init__(self, spec: TopicSpec, settings: KafkaSettings) -> None:
        self.spec = spec
        self.settings = settings

    @property
    def producer(self) -> KafkaProducer:
        return get_producer(self.settings.producer_config())

    def handler(self, job: Job) -> None:
        """Per-row handler: one produce and one flush."""
        error = self.send([job])[0]
        if error is not None:
            raise error

    def send(self, jobs: Sequence[Job]) -> list[BaseException | None]:
        """Batch handler: produce every row, wait once, one outcome per row, in order.

        Never raises: whatever goes wrong is an outcome, never a crashed worker.
        """
        try:
            return self._send(jobs)
        except Exception as exc:
            logger.exception("kafka send to %s failed unexpectedly", self.spec.topic)
            return [KafkaSendError(f"kafka send failed: {exc!r}")] * len(jobs)

    def _send(self, jobs: Sequence[Job]) -> list[BaseException | None]:
        if not self.settings.enabled:
            return [TargetUnreachable(DISABLED_REASON) for _ in jobs]
        outcomes: list[BaseException | None] = [None] * len(jobs)
        messages: list[tuple[int, OutMessage]] = []
        for index, job in enumerate(jobs):
            topic = self.settings.topic_for(job.code, self.spec.topic)
            try:
                messages.append((index, build_message(job, topic)))
            except DeadNow as exc:
                outcomes[index] = exc
        if not messages:
            return outcomes
        deadline = time.monotonic() + SEND_DEADLINE_S
        producer = self.producer
        try:
            errors = producer.send([message for _, message in messages], deadline)
        except ProducerUnavailable as exc:
            return [outcome or TargetUnreachable(str(exc)) for outcome in outcomes]
        refused = [(index, message) for (index, message), err in zip(messages, errors,
                                                                    strict=True)
                   if err is not None and error_name(err) in BATCH_REFUSALS]
        unchecked: set[int] = set()
        if len(messages) > 1 and refused:
            errors = list(errors)
            positions = {index: position for position, (index, _) in enumerate(messages)}
            for index, message in refused:  # alone now: the verdict is about this record
                if time.monotonic() >= deadline:
                    unchecked.add(index)
                    continue
                errors[positions[index]] = producer.send([message], deadline)[0]
        # The most telling client error ("Connection refused" over "1/1 brokers are down").
        telling = [e for e in producer.client_errors if not e.startswith("_ALL_BROKERS_DOWN")]
        client_error = (telling or producer.client_errors or [""])[-1]
        for (index, message), err in zip(messages, errors, strict=True):
            outcomes[index] = classify(err, message.topic, client_error,
                                       alone_unchecked=index in unchecked)
        return outcomes


def register_topic(spec: TopicSpec, settings: KafkaSettings) -> Target:
    """Register ``kafka:<topic>`` on the fast lane with both handlers."""
    kafka = KafkaTarget(spec, settings)
    target = register_target(spec.target, kafka.handler, lane=Lane.FAST,
                             delivery_mode=spec.delivery_mode, policy=spec.policy,
                             batch_handler=kafka.send, batch_size=settings.batch_size)
    target.extra["kafka"] = kafka
    return target


def register_topics(settings: KafkaSettings) -> list[Target]:
    """Register every configured topic; all or nothing."""
    registered: list[Target] = []
    try:
        for spec in settings.extra_topics:
            registered.append(register_topic(spec, settings))
    except Exception:
        for target in registered:
            unregister_target(target.name)
        raise
    return registered

