"""``kafka:<topic>`` targets against a real Apache Kafka broker (docs/design.md#kafka-target).

Rows go through the real fast lane (in process, injected clock): every assertion about a
row is about what the engine wrote after the broker's real answer, and every assertion
about a message is about what a Kafka consumer reads back from the broker.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError
from django.db import connection

from jobs_engine import conf
from jobs_engine.contrib.kafka.producer import KafkaProducer, OutMessage, producers
from jobs_engine.contrib.kafka.settings import QUEUE_WAIT_S
from jobs_engine.contrib.kafka.target import DISABLED_REASON, KafkaSendError, KafkaTarget, classify
from jobs_engine.enqueueing import enqueue, partition_for
from jobs_engine.errors import DeadNow, TargetOutcomeUnknown, TargetUnreachable
from jobs_engine.job import Job
from jobs_engine.models import Job as JobModel
from jobs_engine.models import TargetPause
from jobs_engine.states import DeliveryMode, JobStatus
from tests.kafka.conftest import REPO_ROOT, KafkaBroker, LaneWorker, TopicReader

pytestmark = pytest.mark.django_db

PROBE = timedelta(seconds=conf.JobsSettings().PROBE_S + 1)
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-01")


def put(target: str, payload: Any, *, key: str | None = None, version: int | None = None,
        code: str | None = None, headers: dict[str, Any] | None = None) -> int:
    result = enqueue(target, payload, key=key, version=version, code=code, headers=headers)
    assert result.job_id is not None
    return result.job_id


def row(job_id: int) -> JobModel:
    return JobModel.objects.get(id=job_id)


def gone(job_id: int) -> bool:
    return not JobModel.objects.filter(id=job_id).exists()


def pause_reason(target: str) -> str | None:
    pause = TargetPause.objects.filter(target=target).first()
    return None if pause is None else pause.reason


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def keys_in_one_partition(count: int, prefix: str) -> list[str]:
    """``count`` keys of one engine partition, so their rows go out in one send."""
    partitions = conf.jobs_settings().PARTITIONS
    by_partition: dict[int, list[str]] = {}
    number = 0
    while True:
        key = f"{prefix}-{number}"
        keys = by_partition.setdefault(partition_for(key, key, partitions), [])
        keys.append(key)
        if len(keys) == count:
            return keys
        number += 1


# -- the record on the wire ----------------------------------------------------------------


def test_key_value_and_headers_arrive(kafka_targets: Any, lane_worker: Any,
                                      reader: Callable[[str], TopicReader],
                                      now: datetime) -> None:
    """Key = job key, value = the payload's stored JSON text, headers
    event_id/trace_id/traceparent plus the job's own headers, which win (a business event id
    replaces the job id)."""
    kafka_targets(EXTRA_TOPICS=["jt.main"])
    topic = reader("jt.main")
    key = unique("order")
    first = put("kafka:jt.main", {"n": 1, "name": "ü ok", "list": [1, 2]}, key=key, version=1,
                headers={"source": "tests", "attempt_note": {"a": 1}})
    second = put("kafka:jt.main", {"n": 2}, key=key, version=2, headers={"event_id": "biz-42"})
    job_one = row(first)
    with connection.cursor() as cursor:
        cursor.execute("SELECT payload::text FROM jobs_engine_job WHERE id = %s", [first])
        stored = cursor.fetchone()[0]

    worker: LaneWorker = lane_worker()
    assert worker.drain(now) == [1, 1, 0]  # a key's next version goes once its head is done

    assert gone(first) and gone(second)
    got = topic.read()
    assert [d.key for d in got] == [key.encode(), key.encode()]
    # The stored JSON text as read (no decode and encode on the way), UTF-8.
    assert json.loads(got[0].value) == {"n": 1, "name": "ü ok", "list": [1, 2]}
    assert got[0].value == stored.encode() and "ü ok".encode() in got[0].value
    assert got[1].payload == {"n": 2}
    assert got[0].headers["event_id"] == str(first).encode()
    assert got[1].headers["event_id"] == b"biz-42"
    assert got[0].headers["trace_id"] == job_one.trace_id.encode()
    match = TRACEPARENT.fullmatch(got[0].headers["traceparent"].decode())
    assert match and match.group(1) == job_one.trace_id
    assert got[0].headers["source"] == b"tests"
    assert got[0].headers["attempt_note"] == b'{"a":1}'
    assert len({d.partition for d in got}) == 1  # one key, one Kafka partition: ordered


def test_one_lazy_long_lived_producer_per_process(kafka_targets: Any, lane_worker: Any,
                                                  reader: Any, now: datetime) -> None:
    """No client exists before the first send; later sends reuse the same one."""
    kafka_targets(EXTRA_TOPICS=["jt.main", "jt.alo:at_least_once"])
    assert producers() == []
    topic = reader("jt.main")
    worker = lane_worker()
    put("kafka:jt.main", {"n": 1}, key=unique("k"))
    worker.drain(now)
    assert len(producers()) == 1
    client = producers()[0]
    put("kafka:jt.main", {"n": 2}, key=unique("k"))
    put("kafka:jt.alo", {"n": 3}, key=unique("k"))
    worker.drain(now)
    assert producers() == [client]
    assert client.sends == 3
    assert sorted(d.payload["n"] for d in topic.read()) == [1, 2]


def test_topic_override_by_event_code(kafka_targets: Any, lane_worker: Any, reader: Any,
                                      now: datetime) -> None:
    """TOPIC_OVERRIDES sends a job whose code is listed to that topic; others keep theirs."""
    kafka_targets(EXTRA_TOPICS="jt.main", TOPIC_OVERRIDES={"order_shipped": "jt.override"})
    main, override = reader("jt.main"), reader("jt.override")
    key = unique("order")
    put("kafka:jt.main", {"shipped": True}, key=key, version=1, code="order_shipped")
    put("kafka:jt.main", {"created": True}, key=key, version=2, code="order_created")
    lane_worker().drain(now)
    assert [d.payload for d in override.read()] == [{"shipped": True}]
    assert [d.payload for d in main.read()] == [{"created": True}]


def test_extra_topics_delivery_modes(kafka_targets: Any, lane_worker: Any, reader: Any,
                                     now: datetime) -> None:
    """``topic:at_least_once`` registers an at-least-once target; a bare topic is
    at-most-once; both fast lane, both with a batch handler and a per-row handler."""
    targets = {t.name: t for t in kafka_targets(EXTRA_TOPICS="jt.main, jt.alo:at_least_once")}
    assert targets["kafka:jt.alo"].delivery_mode is DeliveryMode.AT_LEAST_ONCE
    assert targets["kafka:jt.main"].delivery_mode is DeliveryMode.AT_MOST_ONCE
    assert all(t.lane == "fast" and t.batch_handler and t.handler for t in targets.values())
    alo = reader("jt.alo")
    job_id = put("kafka:jt.alo", {"alo": 1}, key=unique("k"))
    assert row(job_id).delivery_mode == DeliveryMode.AT_LEAST_ONCE
    lane_worker().drain(now)
    assert [d.payload for d in alo.read()] == [{"alo": 1}]


def test_per_row_handler_sends_one_record(kafka_targets: Any, reader: Any) -> None:
    """The per-row handler produces and flushes one record; failures raise the outcome."""
    target = kafka_targets(EXTRA_TOPICS=["jt.main"])[0]
    topic = reader("jt.main")
    job = Job(id=7, target=target.name, code="c", key="k7", version=0, payload_json='{"x": 1}',
              headers={}, attempts=0, trace_id="not-a-w3c-id", dedupe_key="d7")
    target.handler(job)
    got = topic.read()
    assert [(d.key, d.payload) for d in got] == [(b"k7", {"x": 1})]
    # A trace id that is not 32 hex digits still yields a valid, stable-trace traceparent.
    assert TRACEPARENT.fullmatch(got[0].headers["traceparent"].decode())
    with pytest.raises(DeadNow, match="empty value"):
        target.handler(job._replace(payload_json=None))


# -- settings switches ---------------------------------------------------------------------


def test_disabled_pauses_every_target_and_sends_nothing(kafka_targets: Any, lane_worker: Any,
                                                        reader: Any, now: datetime) -> None:
    """ENABLED=False: rows stay PENDING with attempts 0, every Kafka target is paused with
    that reason (and probed later like any pause), and no client is even created."""
    kafka_targets(ENABLED=False, EXTRA_TOPICS=["jt.main", "jt.alo:at_least_once"])
    main = reader("jt.main")
    ids = [put("kafka:jt.main", {"n": 1}, key=unique("k")),
           put("kafka:jt.alo", {"n": 2}, key=unique("k"))]
    worker = lane_worker()
    worker.drain(now)
    assert [(row(i).status, row(i).attempts) for i in ids] == [(JobStatus.PENDING, 0)] * 2
    assert DISABLED_REASON in (pause_reason("kafka:jt.main") or "")
    assert DISABLED_REASON in (pause_reason("kafka:jt.alo") or "")
    worker.drain(now + PROBE)  # the probe finds Kafka still disabled
    assert [(row(i).status, row(i).attempts) for i in ids] == [(JobStatus.PENDING, 0)] * 2
    assert producers() == []
    assert main.read() == []


# -- not sent: unreachable -----------------------------------------------------------------


def test_unknown_topic_pauses_then_resumes_once_created(kafka_targets: Any, lane_worker: Any,
                                                        broker: KafkaBroker, now: datetime
                                                        ) -> None:
    """Auto-create is off: a missing topic is "not sent" (UNKNOWN_TOPIC_OR_PART within
    topic.metadata.propagation.max.ms) -> paused, attempts kept; after the topic is
    created the next probe delivers."""
    topic_name = unique("jt.missing")
    kafka_targets(EXTRA_TOPICS=[topic_name])
    target = f"kafka:{topic_name}"
    job_id = put(target, {"n": 1}, key="k")
    worker = lane_worker()
    started = time.monotonic()
    assert worker.run(now) == 1
    assert time.monotonic() - started < 5
    assert (row(job_id).status, row(job_id).attempts) == (JobStatus.PENDING, 0)
    reason = pause_reason(target) or ""
    assert "TargetUnreachable" in reason and "UNKNOWN_TOPIC_OR_PART" in reason

    broker.create_topic(topic_name)
    topic = TopicReader(broker.bootstrap, topic_name)
    try:
        # librdkafka may still hold "topic does not exist" for up to a second (produce()
        # then refuses with _UNKNOWN_TOPIC): a probe or two later the row is delivered.
        worker.drain_until(now + PROBE, lambda: gone(job_id))
        assert pause_reason(target) is None
        assert [d.payload for d in topic.read()] == [{"n": 1}]
    finally:
        topic.close()
        broker.script("topics", "--delete", "--topic", topic_name)


def test_unreachable_address_is_unreachable_not_a_crash(kafka_targets: Any, lane_worker: Any,
                                                        now: datetime) -> None:
    """A well-formed address where no broker listens: every row "not sent" within the
    queue wait (connect timeout + 1 s), the worker goes on."""
    kafka_targets(BOOTSTRAP_SERVERS="127.0.0.1:1", EXTRA_TOPICS=["jt.nowhere"])
    ids = [put("kafka:jt.nowhere", {"n": n}, key=unique("k")) for n in range(3)]
    started = time.monotonic()
    lane_worker().drain(now)
    assert time.monotonic() - started < 6
    assert [(row(i).status, row(i).attempts) for i in ids] == [(JobStatus.PENDING, 0)] * 3
    reason = pause_reason("kafka:jt.nowhere") or ""
    assert "_PURGE_QUEUE" in reason and "not sent" in reason
    assert "Connection refused" in reason  # the client's own error, for the operator


def test_broker_down_pauses_keeps_attempts_then_drains_in_key_order(
        kafka_targets: Any, lane_worker: Any, broker: KafkaBroker, reader: Any,
        now: datetime) -> None:
    """Broker stopped: TargetUnreachable -> the target is paused, attempts unchanged; after
    the restart the probe gets through and the backlog drains in per-key version order."""
    kafka_targets(EXTRA_TOPICS=["jt.outage"])
    topic = reader("jt.outage")
    worker = lane_worker()
    put("kafka:jt.outage", {"warm": True}, key=unique("warm"))
    worker.drain(now)  # the producer is connected when the broker goes away

    keys = [unique("k") for _ in range(3)]
    ids = {(key, version): put("kafka:jt.outage", {"key": key, "version": version}, key=key,
                               version=version)
           for version in (1, 2, 3) for key in keys}
    broker.stop()
    try:
        worker.drain(now)
        assert {(row(i).status, row(i).attempts) for i in ids.values()} == {
            (JobStatus.PENDING, 0)}
        assert "not sent" in (pause_reason("kafka:jt.outage") or "")
        assert "Connection refused" in (pause_reason("kafka:jt.outage") or "")
        worker.drain(now + timedelta(seconds=5))  # still paused: nothing is tried
        assert {row(i).attempts for i in ids.values()} == {0}
    finally:
        broker.start()
    worker.drain_until(now + PROBE,
                       lambda: not JobModel.objects.filter(target="kafka:jt.outage").exists())
    got = [d for d in topic.read() if d.payload.get("key") in keys]
    for key in keys:
        versions = [d.payload["version"] for d in got if d.key == key.encode()]
        assert versions == [1, 2, 3], (key, versions)


def test_client_errors_from_before_a_send_are_kept_until_a_send_delivers(
        broker: KafkaBroker) -> None:
    """The client reports a repeated connection error once, and often while the worker is
    idle: a broker down since before a send may report nothing during it (its reason then
    said only "no broker took it"). What the client said since the last send that
    delivered everything stays for the pause reason; a delivered send clears it."""
    producer = KafkaProducer({"bootstrap.servers": broker.bootstrap,
                              "socket.connection.setup.timeout.ms": 30_000})
    record = OutMessage("jt.idle", b"{}", b"k", [])
    try:
        assert producer.send([record]) == [None]  # connected
        broker.pause()  # hung: nothing answers, and the client says nothing meanwhile
        try:
            # As librdkafka's error callback reports a refusal between two sends.
            producer._on_error(KafkaError(KafkaError._TRANSPORT,
                                          "127.0.0.1:1/1: Connection refused"))
            results = producer.send([record], deadline=time.monotonic() + QUEUE_WAIT_S + 1)
            assert results[0] is not None  # not delivered
            assert any(e.endswith("Connection refused") for e in producer.client_errors)
        finally:
            broker.resume()
        assert producer.send([record]) == [None]
        assert producer.client_errors == []
    finally:
        producer.close()


def test_broker_hung_before_the_connection_is_up_is_not_sent(
        kafka_targets: Any, lane_worker: Any, broker: KafkaBroker, reader: Any,
        now: datetime) -> None:
    """A hung broker the client never finished connecting to (the kernel accepts, nothing
    answers): nothing was transmitted, so even an at-most-once row is only paused — the
    queue purge tells this apart from a hung send — and it goes out after the resume."""
    kafka_targets(EXTRA_TOPICS=["jt.hung"])
    topic = reader("jt.hung")
    job_id = put("kafka:jt.hung", {"early": True}, key=unique("k"))
    worker = lane_worker()
    broker.pause()
    try:
        started = time.monotonic()
        assert worker.run(now) == 1
        took = time.monotonic() - started
    finally:
        broker.resume()
    assert 3.5 < took < 6  # the queue wait: connect timeout + 1 s
    assert (row(job_id).status, row(job_id).attempts) == (JobStatus.PENDING, 0)
    assert "_PURGE_QUEUE" in (pause_reason("kafka:jt.hung") or "")
    worker.drain_until(now + PROBE, lambda: gone(job_id))
    assert [d.payload for d in topic.read()] == [{"early": True}]


# -- sent, no answer: outcome unknown ------------------------------------------------------


def _hung_send(kafka_targets: Any, lane_worker: Any, broker: KafkaBroker, topic: str,
               now: datetime) -> tuple[LaneWorker, int, float]:
    """Send one row while the broker is SIGSTOPped (its connection already up)."""
    worker = lane_worker()
    put(f"kafka:{topic}", {"warm": True}, key=unique("warm"))
    worker.drain(now)
    job_id = put(f"kafka:{topic}", {"hung": True}, key=unique("k"))
    broker.pause()
    try:
        started = time.monotonic()
        assert worker.run(now) == 1
        took = time.monotonic() - started
    finally:
        broker.resume()
    return worker, job_id, took


def test_hung_broker_at_most_once_goes_dead_and_is_never_resent(
        kafka_targets: Any, lane_worker: Any, broker: KafkaBroker, reader: Any,
        now: datetime, dead_signals: list[dict[str, Any]]) -> None:
    """Broker SIGSTOPped during a send: transmitted, no answer (_MSG_TIMED_OUT) -> outcome
    unknown -> at-most-once DEAD at once, the target paused; after the resume it is never
    sent again (at most the hung copy lands)."""
    kafka_targets(EXTRA_TOPICS=["jt.hung"])
    topic = reader("jt.hung")
    worker, job_id, took = _hung_send(kafka_targets, lane_worker, broker, "jt.hung", now)
    assert 9 < took < 13  # capped by message.timeout.ms, well under the partition lease
    dead = row(job_id)
    assert dead.status == JobStatus.DEAD and dead.closed_at is not None
    assert "TargetOutcomeUnknown" in dead.last_error and "_MSG_TIMED_OUT" in dead.last_error
    assert "_MSG_TIMED_OUT" in (pause_reason("kafka:jt.hung") or "")
    assert [s["job_id"] for s in dead_signals] == [job_id]
    worker.drain(now + PROBE)
    worker.drain(now + 2 * PROBE)
    assert row(job_id).status == JobStatus.DEAD
    time.sleep(1)  # let the broker finish whatever it had buffered while stopped
    hung = [d for d in topic.read() if d.payload == {"hung": True}]
    assert len(hung) <= 1


def test_hung_broker_at_least_once_is_kept_and_resent(
        kafka_targets: Any, lane_worker: Any, broker: KafkaBroker, reader: Any,
        now: datetime) -> None:
    """The same hung send on an at-least-once target: the row is kept (attempts 0, target
    paused) and resent after the resume."""
    kafka_targets(EXTRA_TOPICS=["jt.hung-alo:at_least_once"])
    topic = reader("jt.hung-alo")
    worker, job_id, took = _hung_send(kafka_targets, lane_worker, broker, "jt.hung-alo", now)
    assert 9 < took < 13
    assert (row(job_id).status, row(job_id).attempts) == (JobStatus.PENDING, 0)
    assert "_MSG_TIMED_OUT" in (pause_reason("kafka:jt.hung-alo") or "")
    worker.drain_until(now + PROBE, lambda: gone(job_id))
    hung = [d for d in topic.read() if d.payload == {"hung": True}]
    assert 1 <= len(hung) <= 2  # the resend, and perhaps the hung copy too


# -- the record refused: dead at once ------------------------------------------------------


@pytest.mark.parametrize("mode", ["at_most_once", "at_least_once"])
def test_record_over_the_topic_limit_is_dead_at_once(
        kafka_targets: Any, lane_worker: Any, reader: Any, jobs_settings: Any, now: datetime,
        mode: str) -> None:
    """The broker refuses a record over the topic's max.message.bytes (MSG_SIZE_TOO_LARGE):
    DEAD at once in both modes, the target not paused, and a valid record that shared the
    send (and possibly its record batch) still arrives."""
    jobs = jobs_settings(PARTITIONS=1)  # every row in one send
    kafka_targets(EXTRA_TOPICS=[f"jt.main:{mode}"], TOPIC_OVERRIDES={"small": "jt.small"})
    small = reader("jt.small")
    big = put("kafka:jt.main", {"blob": "x" * 2000}, key=unique("big"), code="small")
    fine = put("kafka:jt.main", {"ok": 1}, key=unique("fine"), code="small")
    lane_worker(jobs).drain(now)
    dead = row(big)
    assert (dead.status, dead.attempts) == (JobStatus.DEAD, 1)  # one try, no retry
    assert "DeadNow" in dead.last_error and "MSG_SIZE_TOO_LARGE" in dead.last_error
    assert gone(fine)
    assert pause_reason("kafka:jt.main") is None
    assert [d.payload for d in small.read()] == [{"ok": 1}]


def test_record_over_the_client_limit_is_dead_at_once(kafka_targets: Any, lane_worker: Any,
                                                      now: datetime) -> None:
    """The client refuses a record over its message.max.bytes before sending: DEAD."""
    kafka_targets(EXTRA_TOPICS=["jt.main"], CLIENT={"message.max.bytes": 1000})
    job_id = put("kafka:jt.main", {"blob": "y" * 5000}, key=unique("big"))
    lane_worker().drain(now)
    assert row(job_id).status == JobStatus.DEAD
    assert "MSG_SIZE_TOO_LARGE" in row(job_id).last_error


@pytest.mark.parametrize("mode", ["at_most_once", "at_least_once"])
def test_empty_value_is_dead_at_once(kafka_targets: Any, lane_worker: Any, reader: Any,
                                     now: datetime, mode: str) -> None:
    """A payload of None would be a null value (a tombstone on a compacted topic): it is
    refused as an empty value, DEAD at once, nothing sent, the target not paused."""
    kafka_targets(EXTRA_TOPICS=[f"jt.main:{mode}"])
    topic = reader("jt.main")
    job_id = put("kafka:jt.main", None, key=unique("k"))
    lane_worker().drain(now)
    assert (row(job_id).status, row(job_id).attempts) == (JobStatus.DEAD, 1)  # one try
    assert "empty value" in row(job_id).last_error
    assert pause_reason("kafka:jt.main") is None
    assert topic.read() == []


# -- classification of the codes no single local broker can produce ------------------------


@pytest.mark.parametrize(("code", "outcome", "target_up"), [
    (KafkaError._PURGE_QUEUE, TargetUnreachable, None),
    (KafkaError._ALL_BROKERS_DOWN, TargetUnreachable, None),
    (KafkaError._UNKNOWN_TOPIC, TargetUnreachable, None),
    (KafkaError.UNKNOWN_TOPIC_OR_PART, TargetUnreachable, None),
    (KafkaError.NOT_LEADER_FOR_PARTITION, TargetUnreachable, None),
    (KafkaError.NOT_ENOUGH_REPLICAS, TargetUnreachable, None),
    (KafkaError._MSG_TIMED_OUT, TargetOutcomeUnknown, False),
    (KafkaError._TRANSPORT, TargetOutcomeUnknown, False),
    (KafkaError._PURGE_INFLIGHT, TargetOutcomeUnknown, False),
    (KafkaError.REQUEST_TIMED_OUT, TargetOutcomeUnknown, True),
    (KafkaError.NETWORK_EXCEPTION, TargetOutcomeUnknown, True),
    (KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND, TargetOutcomeUnknown, True),
    (KafkaError.MSG_SIZE_TOO_LARGE, DeadNow, None),
    (KafkaError._INVALID_ARG, DeadNow, None),
    (KafkaError.INVALID_RECORD, DeadNow, None),
    (KafkaError.INVALID_REQUIRED_ACKS, KafkaSendError, None),
    (KafkaError.POLICY_VIOLATION, KafkaSendError, None),
])
def test_error_classes(code: int, outcome: type[BaseException], target_up: bool | None
                       ) -> None:
    """Every delivery error maps to one outcome class (docs/design.md#kafka-target); unlisted
    answered errors take the retry path."""
    result = classify(KafkaError(code), "t")
    assert type(result) is outcome
    if target_up is not None:
        assert isinstance(result, TargetOutcomeUnknown) and result.target_up is target_up
    assert classify(None, "t") is None


def test_send_never_raises(kafka_targets: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever goes wrong inside a send is an outcome (here a bug-like failure while a
    record is built), never an exception out of the batch handler."""
    from jobs_engine.contrib.kafka import target as target_module

    target = kafka_targets(EXTRA_TOPICS=["jt.main"])[0]
    kafka: KafkaTarget = target.extra["kafka"]

    def broken(job: Job, topic: str) -> Any:
        raise RuntimeError("a bug while building the record")

    monkeypatch.setattr(target_module, "build_message", broken)
    job = Job(id=1, target=target.name, code="c", key="k", version=0, payload_json="{}",
              headers={}, attempts=0, trace_id="", dedupe_key="d")
    results = kafka.send([job])
    assert len(results) == 1 and isinstance(results[0], KafkaSendError)


# -- start-up ------------------------------------------------------------------------------


def test_bad_bootstrap_address_is_a_clear_error_at_start_up(broker: KafkaBroker) -> None:
    """A worker started with a malformed address stops at once with the system check's
    message naming the field, instead of running and failing at its first send."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings",
           "JOBS_KAFKA_BOOTSTRAP_SERVERS": "kafka-without-port",
           "JOBS_KAFKA_EXTRA_TOPICS": "jt.main", "DATABASE_URL": _database_url()}
    done = subprocess.run([sys.executable, "manage.py", "run_fast_lane"], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "jobs_engine_kafka.E001" in done.stderr
    assert "JOBS['KAFKA']['BOOTSTRAP_SERVERS']: 'kafka-without-port' is not host:port" \
        in done.stderr
    assert "Traceback" not in done.stderr
    assert "running fast" not in done.stdout  # the lane never started


def test_settings_are_parsed_from_jobs_kafka(settings: Any) -> None:
    """The targets come from ``JOBS["KAFKA"]``, this app's section of the ``JOBS`` setting
    (the engine passes over it)."""
    from jobs_engine.contrib.kafka.settings import configured

    settings.JOBS = {"KAFKA": {"BOOTSTRAP_SERVERS": ["127.0.0.1:1"], "EXTRA_TOPICS": "a"}}
    assert conf.jobs_settings().PARTITIONS == 64  # the engine's own settings still load
    kafka = configured()
    assert kafka.bootstrap_servers == ("127.0.0.1:1",)
    assert [spec.target for spec in kafka.extra_topics] == ["kafka:a"]


def _database_url() -> str:
    from tests.process.harness import database_url

    return database_url(connection.settings_dict)


def test_engine_does_not_import_the_kafka_app() -> None:
    """The engine imports no business app; the Kafka app registers itself with it. It lives
    in the engine's package (``jobs_engine.contrib.kafka``) for its name only."""
    import ast

    app = "jobs_engine.contrib.kafka"

    def imported(path: Path) -> set[str]:
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                # ``from jobs_engine.contrib import kafka`` names the app as well
                names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        return names

    engine = REPO_ROOT / "jobs_engine"
    app_dir = engine / "contrib" / "kafka"
    offenders = [str(path.relative_to(REPO_ROOT)) for path in engine.rglob("*.py")
                 if app_dir not in path.parents
                 and any(name == app or name.startswith(app + ".") for name in imported(path))]
    assert offenders == []


def test_producer_config_keeps_every_send_bounded(kafka_targets: Any) -> None:
    """Retries off, idempotence off (librdkafka refuses idempotence without retries),
    connect 3 s, request and message timeouts 10 s, acks all."""
    target = kafka_targets(EXTRA_TOPICS=["jt.main"], CLIENT={"linger.ms": 1})[0]
    config = target.extra["kafka"].settings.producer_config()
    assert config["retries"] == 0 and config["message.send.max.retries"] == 0
    assert config["enable.idempotence"] is False
    assert config["socket.connection.setup.timeout.ms"] == 3000
    assert config["request.timeout.ms"] == 10000 and config["message.timeout.ms"] == 10000
    assert config["acks"] == "all" and config["linger.ms"] == 1
    from confluent_kafka import KafkaException, Producer

    with pytest.raises(KafkaException, match="retries` must be set >= 1"):
        Producer({**config, "enable.idempotence": True})


def test_payload_value_is_the_stored_json_text() -> None:
    """The record's value is the payload's stored JSON text, sent as is (UTF-8, not decoded
    and encoded again)."""
    from jobs_engine.contrib.kafka.target import build_message

    stored = '{"a": [1, 2], "é": null}'
    job = Job(id=3, target="kafka:t", code="c", key=None, version=0, payload_json=stored,
              headers={}, attempts=0, trace_id="", dedupe_key="d")
    message = build_message(job, "t")
    assert message.value == stored.encode()
    assert message.key is None
    assert dict(message.headers) == {"event_id": b"3"}
    for empty in (None, "null"):
        with pytest.raises(DeadNow, match="empty value"):
            build_message(job._replace(payload_json=empty), "t")
