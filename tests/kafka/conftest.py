"""Fixtures of the Kafka suite: a real Apache Kafka broker (``scripts/kafka.sh``), topics
made with Kafka's own CLI, a reader of what landed on a topic, and in-process fast-lane
workers driven with an injected clock (as ``tests/db/test_fast_lane.py`` does).

The broker (``tests.kafka.broker.KafkaBroker``, shared with the fault suite and the bench)
runs on its own port and data dir (``JOBS_TEST_KAFKA_PORT``, default 19192, and
``JOBS_TEST_KAFKA_DIR``), so the suite never touches a developer's broker on 19092, and is
stopped when the session ends. The suite runs on PostgreSQL only: on SQLite it refuses to
be collected instead of skipping silently.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from jobs_engine import conf, registry, store
from jobs_engine.conf import JobsSettings
from jobs_engine.contrib.kafka.producer import close_producers
from jobs_engine.contrib.kafka.settings import parse_kafka_settings
from jobs_engine.contrib.kafka.target import register_topics
from jobs_engine.lanes.fast import FastLane
from jobs_engine.lanes.partitions import PartitionLeases
from jobs_engine.lanes.pauses import PauseGate
from jobs_engine.registry import Target
from tests.helpers import FakeMonotonic, require_postgres
from tests.kafka.broker import REPO_ROOT, KafkaBroker

__all__ = ["REPO_ROOT", "Delivered", "KafkaBroker", "LaneWorker", "TopicReader"]

require_postgres("tests/kafka", "runs fast-lane workers against a real Kafka broker")

PORT = int(os.environ.get("JOBS_TEST_KAFKA_PORT", "19192"))
DATA_DIR = os.environ.get("JOBS_TEST_KAFKA_DIR",
                          str(Path(tempfile.gettempdir()) / "jobs-engine-kafka-test"))

# Topics of the session: name -> (partitions, topic configs).
TOPICS: dict[str, tuple[int, dict[str, str]]] = {
    "jt.main": (2, {}),
    "jt.override": (1, {}),
    "jt.alo": (1, {}),
    "jt.small": (1, {"max.message.bytes": "1024"}),
    "jt.outage": (3, {}),
    "jt.idle": (1, {}),
    "jt.hung": (1, {}),
    "jt.hung-alo": (1, {}),
}


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    """A running broker with the session's topics; stopped at the end of the session."""
    broker = KafkaBroker(PORT, DATA_DIR)
    broker.start()
    try:
        broker.create_topics(TOPICS)
        yield broker
    finally:
        close_producers(timeout=1)
        broker.stop()


@pytest.fixture
def broker(kafka_broker: KafkaBroker) -> Iterator[KafkaBroker]:
    """The session broker, running and not paused when the test starts and ends."""
    kafka_broker.ensure_running()
    yield kafka_broker
    kafka_broker.ensure_running()
    close_producers(timeout=1)  # each test starts with no client, as a fresh worker does


@pytest.fixture
def now() -> datetime:
    """The decision time passed to the lane: a minute ahead of the real clock, so rows the
    test enqueues (stamped with the real clock, after slow steps such as a broker restart)
    are due at it."""
    return datetime.now(UTC) + timedelta(minutes=1)


@dataclass
class Delivered:
    """One record read back from the broker."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes | None]

    @property
    def payload(self) -> Any:
        return None if self.value is None else json.loads(self.value)


class TopicReader:
    """Reads what was appended to a topic after the reader was made (per partition, from
    the high watermark at creation up to the current one)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self.topic = topic
        self._tp = TopicPartition
        self.consumer = Consumer({"bootstrap.servers": bootstrap,
                                  "group.id": f"jt-reader-{uuid.uuid4().hex}",
                                  "enable.auto.commit": False,
                                  "auto.offset.reset": "earliest",
                                  "isolation.level": "read_uncommitted"})
        metadata = self.consumer.list_topics(topic, timeout=15)
        self.partitions = sorted(metadata.topics[topic].partitions)
        self.start = self._high()

    def _high(self) -> dict[int, int]:
        return {p: self._watermark(p) for p in self.partitions}

    def _watermark(self, partition: int, timeout: float = 30) -> int:
        """The partition's high watermark; a broker just resumed or restarted answers
        NOT_LEADER_FOR_PARTITION (or times out) for a moment, so ask again until it knows."""
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + timeout
        while True:
            try:
                return int(self.consumer.get_watermark_offsets(
                    self._tp(self.topic, partition), timeout=10)[1])
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def read(self, timeout: float = 15) -> list[Delivered]:
        high = self._high()
        wanted = {p: high[p] for p in self.partitions if high[p] > self.start[p]}
        if not wanted:
            return []
        self.consumer.assign([self._tp(self.topic, p, self.start[p]) for p in wanted])
        got: list[Delivered] = []
        done: dict[int, int] = {p: self.start[p] for p in wanted}
        deadline = time.monotonic() + timeout
        while any(done[p] < wanted[p] for p in wanted):
            assert time.monotonic() < deadline, f"could not read {self.topic} up to {wanted}"
            for msg in self.consumer.consume(100, timeout=0.5):
                if msg.error():
                    continue
                done[msg.partition()] = msg.offset() + 1
                got.append(Delivered(msg.topic(), msg.partition(), msg.offset(), msg.key(),
                                     msg.value(), {k: v for k, v in msg.headers() or []}))
        self.consumer.unassign()
        return sorted(got, key=lambda d: (d.partition, d.offset))

    def close(self) -> None:
        self.consumer.close()


@pytest.fixture
def reader(broker: KafkaBroker) -> Iterator[Callable[[str], TopicReader]]:
    """``reader(topic)``: a ``TopicReader`` starting at the topic's current end."""
    made: list[TopicReader] = []

    def make(topic: str) -> TopicReader:
        made.append(TopicReader(broker.bootstrap, topic))
        return made[-1]

    yield make
    for topic_reader in made:
        topic_reader.close()


@pytest.fixture
def kafka_targets(broker: KafkaBroker) -> Iterator[Callable[..., list[Target]]]:
    """``kafka_targets(EXTRA_TOPICS=..., **KAFKA)`` parses a ``JOBS["KAFKA"]`` dict (the
    suite's broker unless ``BOOTSTRAP_SERVERS`` is given) and registers its targets for
    one test."""
    names: list[str] = []

    def register(**kafka: Any) -> list[Target]:
        kafka.setdefault("BOOTSTRAP_SERVERS", broker.bootstrap)
        registered = register_topics(parse_kafka_settings(kafka, environ={}))
        names.extend(target.name for target in registered)
        return registered

    yield register
    for name in names:
        registry.unregister_target(name)


@dataclass
class LaneWorker:
    """One in-process fast-lane worker: its leases, lane and fake monotonic clock."""

    lane: FastLane
    leases: PartitionLeases
    clock: FakeMonotonic = field(default_factory=FakeMonotonic)
    last_beat: datetime | None = None

    def run(self, at: datetime) -> int:
        """Heartbeat up to ``at`` (every PARTITION_HEARTBEAT_S of the injected time, as the
        heartbeat thread would, so the leases stay held), then one poll at ``at``."""
        step = timedelta(seconds=self.leases.settings.PARTITION_HEARTBEAT_S)
        beat = (self.last_beat or at) + step
        while beat < at:
            self.leases.heartbeat(beat)
            beat += step
        self.leases.heartbeat(at)
        self.last_beat = at
        return self.lane.run_once(at)

    def drain(self, at: datetime, polls: int = 20) -> list[int]:
        """Poll at ``at`` until a poll hands nothing; returns the rows handed per poll."""
        handed: list[int] = []
        for _ in range(polls):
            handed.append(self.run(at))
            if handed[-1] == 0:
                break
        return handed

    def drain_until(self, at: datetime, done: Callable[[], bool], tries: int = 6) -> datetime:
        """Drain at ``at``, then one probe period later (after a real second, for a broker
        that has just come back or a topic just created), until ``done()``; returns the
        last decision time used."""
        probe = timedelta(seconds=self.leases.settings.PROBE_S + 1)
        for _ in range(tries):
            self.drain(at)
            if done():
                return at
            time.sleep(1)
            at += probe
        raise AssertionError(f"not done after {tries} probe periods")


@pytest.fixture
def lane_worker() -> Callable[..., LaneWorker]:
    """``lane_worker(settings=None)``: a fast-lane worker on the test database (by default
    with the process's JOBS settings, which enqueue partitions with too)."""
    workers: list[LaneWorker] = []

    def make(jobs: JobsSettings | None = None) -> LaneWorker:
        jobs = jobs or conf.jobs_settings()  # enqueue partitions with the same settings
        clock = FakeMonotonic()
        worker_id = f"kafka-test-{uuid.uuid4().hex[:6]}"
        leases = PartitionLeases(worker_id, jobs, monotonic=clock)
        lane = FastLane(worker_id, jobs, leases, PauseGate(worker_id, jobs), monotonic=clock)
        store.partitions_seed(jobs.PARTITIONS)
        workers.append(LaneWorker(lane, leases, clock))
        return workers[-1]

    yield make

