"""Order and delivery under faults, end to end (docs/design.md#delivery-modes-and-crashes).

10,000 jobs over 500 keys (250 keys to an at-most-once topic, 250 to an at-least-once
topic, versions 1..20 per key from ``next_version`` inside the enqueuing transaction) are
enqueued in rounds while three real ``manage.py run_fast_lane`` processes send them to a
real Apache Kafka broker. Mid-run the broker is stopped for 10 s (``scripts/kafka.sh
stop``/``start``, the stop starting as a round commits) while enqueuing goes on; once it is
back, one worker is SIGKILLed between a send and its outcome (stopped, its in-flight rows
without an outcome read from the database, then killed). When no row is PENDING any more,
both topics are consumed from offset 0 and judged:

*In increasing order*, per key: let ``s`` be the versions of the key's records in the order
the topic holds them (offset order; a key has one Kafka partition). ``s`` must be
non-decreasing: no record may carry a lower version than a record before it. So the first
deliveries of the versions are strictly increasing, and no version is delivered (again)
after a higher version of its key has arrived. Equal neighbours are resends: allowed on the
at-least-once topic only; on the at-most-once topic ``s`` is strictly increasing.

Delivery: at-most-once, no ``event_id`` twice, and every job either delivered (its row is
gone: success deletes it) or DEAD with a non-empty ``last_error`` (delivered *and* DEAD is
allowed: an unknown outcome that did land); a job neither delivered nor DEAD is lost.
At-least-once, every job delivered at least once and no row left. Nothing PENDING.

The counts are printed (``-s``) and written to ``test-artifacts/kafka_order_counts.json``.
PostgreSQL only (the suite's conftest refuses SQLite); about a minute.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction

from jobs_engine import conf
from jobs_engine.enqueueing import enqueue_many, next_version
from jobs_engine.models import InflightMark, Job
from jobs_engine.states import JobStatus
from tests.kafka.conftest import REPO_ROOT, Delivered, KafkaBroker, TopicReader
from tests.process.harness import WorkerCluster, WorkerProc, database_url, wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

KEYS_PER_TOPIC = 250
VERSIONS = 20  # 2 topics x 250 keys x 20 versions = 10,000 jobs
ROUND_INTERVAL_S = 1.5  # one version of every key per round, 500 jobs
KAFKA_PARTITIONS = 4
WORKERS = 3
STOP_AT_ROUND = 3  # the broker is stopped the moment round 4 commits (about 4.5 s in)
# Rounds before this one go on while the broker is down (a backlog up to 8 versions deep
# per key); the rest start once it is back, so the kill lands in live traffic whatever the
# broker's start-up time.
HOLD_AT_ROUND = 12
BROKER_DOWN_S = 10.0
DRAIN_DEADLINE_S = 150.0
COUNTS_FILE = REPO_ROOT / "test-artifacts" / "kafka_order_counts.json"

TAKEOVER = "in flight when its partition was taken over"
_RUN_LINE = re.compile(r"job run code=\S+ target=(\S+) .* result=(\w+)")
_ERROR_NAME = re.compile(r"\b_?[A-Z][A-Z_]{3,}[A-Z]\b")


# -- pieces ---------------------------------------------------------------------------------


class Enqueuer(threading.Thread):
    """Business traffic: each round enqueues the next version of every key, each version
    taken with ``next_version`` in the same transaction as its job (docs/design.md#enqueue)."""

    def __init__(self, plan: list[tuple[str, str]], rounds: int, interval: float,
                 hold_at: int) -> None:
        super().__init__(name="enqueuer", daemon=True)
        self.plan = plan  # (target, key)
        self.rounds = rounds
        self.interval = interval
        self.hold_at = hold_at  # round that waits for ``resume`` (the broker is back)
        self.resume = threading.Event()
        self.jobs: dict[tuple[str, str, int], int] = {}  # (target, key, version) -> job id
        self.error: BaseException | None = None
        self.committed = [threading.Event() for _ in range(rounds)]

    def run(self) -> None:
        try:
            start = time.monotonic()
            for number in range(self.rounds):
                if number == self.hold_at:
                    if not self.resume.wait(300):
                        raise TimeoutError("never told to resume enqueuing")
                    start = time.monotonic() - number * self.interval
                time.sleep(max(0.0, start + number * self.interval - time.monotonic()))
                with transaction.atomic():
                    items = []
                    for target, key in self.plan:
                        version = next_version(key)
                        items.append({"target": target, "key": key, "version": version,
                                      "code": "order_changed",
                                      "payload": {"key": key, "version": version},
                                      "dedupe_key": f"order_changed:{key}:{version}"})
                    results = enqueue_many(items)
                for item, result in zip(items, results, strict=True):
                    assert result.inserted and result.job_id is not None
                    self.jobs[(item["target"], item["key"], item["version"])] = result.job_id
                self.committed[number].set()
        except BaseException as exc:  # re-raised by the test
            self.error = exc
        finally:
            connection.close()


def kill_one_mid_send(procs: list[WorkerProc], modes: dict[str, str],
                      timeout: float = 30.0) -> dict[str, Any]:
    """SIGKILL a worker between a send and its outcome.

    A worker with a partition mark (rows handed under a poll token) is SIGSTOPped; while it
    cannot move, the marked rows still PENDING with no outcome under that token are the
    ones the takeover will judge. If there are some (in the first half of ``timeout``: at
    least 10, of both delivery modes) it is SIGKILLed, else SIGCONTed and another look is
    taken; a stop lasts milliseconds, far under the lease. Returns who died and the open
    rows by mode.
    """
    by_id = {p.worker_id(): p for p in procs if p.alive()}
    started = time.monotonic()
    looks = 0

    def open_rows(owners: Any) -> dict[str, list[int]]:
        found: dict[str, list[int]] = defaultdict(list)
        for ids, token in InflightMark.objects.filter(owner__in=owners).values_list(
                "ids", "token"):
            for job_id, target in (Job.objects.filter(id__in=ids, status=JobStatus.PENDING)
                                   .exclude(outcome_token=token).values_list("id", "target")):
                found[modes[target]].append(job_id)
        return {mode: sorted(ids) for mode, ids in found.items()}

    while time.monotonic() < started + timeout:
        owners = list(InflightMark.objects.filter(owner__in=by_id)
                      .values_list("owner", flat=True)[:1])
        if not owners:
            time.sleep(0.002)
            continue
        looks += 1
        victim = by_id[owners[0]]
        victim.send(signal.SIGSTOP)
        time.sleep(0.05)  # a statement it sent before the stop has finished by now
        unresolved = open_rows([victim.worker_id()])
        # Best: a full poll (not a probe's single row) of both modes.
        full = (len(unresolved) == len(set(modes.values()))
                and sum(map(len, unresolved.values())) >= 10)
        if unresolved and (full or time.monotonic() > started + timeout / 2):
            victim.send(signal.SIGKILL)
            victim.wait_exit(10)
            assert open_rows([victim.worker_id()]) == unresolved, \
                "the in-flight rows changed while the worker was stopped"
            return {"worker": victim.worker_id(), "pid": victim.pid, "looks": looks,
                    "open_at_kill": {mode: len(ids) for mode, ids in unresolved.items()},
                    "open_ids": unresolved}
        victim.send(signal.SIGCONT)
    raise AssertionError(f"no worker had rows in flight within {timeout}s ({looks} looks)")


def records_in(broker: KafkaBroker, topic: str) -> int:
    """Records on ``topic`` now (its partitions' high watermarks; the topic is new)."""
    reader = TopicReader(broker.bootstrap, topic)
    try:
        return sum(reader.start.values())
    finally:
        reader.close()


def read_all(broker: KafkaBroker, topic: str) -> list[Delivered]:
    """Every record of ``topic`` from offset 0, in (partition, offset) order. Readers are
    made only while the broker is up, so no client of the test logs the outage."""
    reader = TopicReader(broker.bootstrap, topic)
    try:
        reader.start = dict.fromkeys(reader.partitions, 0)
        return reader.read(timeout=60)
    finally:
        reader.close()


def reason_class(last_error: str) -> str:
    """A DEAD row's reason without ids and topic names: the error class and Kafka code."""
    if TAKEOVER in last_error:
        return f"takeover: {TAKEOVER}"
    kind = last_error.split(":", 1)[0]
    names = _ERROR_NAME.findall(last_error)
    return f"{kind} {names[0]}" if names else kind


def order_problems(versions: list[int], resends_allowed: bool) -> list[str]:
    """Where ``versions`` (one key, topic order) breaks "increasing" as defined above."""
    problems = []
    for position, (before, after) in enumerate(pairwise(versions), start=1):
        if after < before:
            problems.append(f"v{after} at #{position} after v{before} had arrived")
        elif after == before and not resends_allowed:
            problems.append(f"v{after} delivered twice (#{position - 1}, #{position})")
    return problems


def run_results(procs: list[WorkerProc]) -> dict[str, dict[str, int]]:
    """``job run`` log lines of every worker, counted by target and result."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for proc in procs:
        for target, result in _RUN_LINE.findall(proc.stderr()):
            counts[target][result] += 1
    return {target: dict(sorted(c.items())) for target, c in sorted(counts.items())}


def sent_ok(procs: list[WorkerProc]) -> int:
    """Rows the workers have logged as delivered so far."""
    return sum(c.get("ok", 0) for c in run_results(procs).values())


def tails(procs: list[WorkerProc], lines: int = 40) -> str:
    out = []
    for proc in procs:
        out.append(f"===== {proc.name} pid={proc.pid} exit={proc.popen.poll()} =====")
        out += proc.stdout().splitlines()[-5:]
        out += [line for line in proc.stderr().splitlines()
                if "job run " not in line][-lines:]
    return "\n".join(out)


@pytest.fixture
def workers(tmp_path: Path, transactional_db: Any) -> Iterator[WorkerCluster]:
    """Worker processes on the test database; all killed before the database is flushed."""
    cluster = WorkerCluster(tmp_path, database_url(connection.settings_dict))
    try:
        yield cluster
    finally:
        cluster.kill_all()


# -- the test ---------------------------------------------------------------------------------


def judge_topic(records: list[Delivered], jobs: dict[tuple[str, int], int], at_least_once: bool,
                dead: dict[int, str], open_at_kill: list[int]) -> dict[str, Any]:
    """Check one topic's records against its jobs and what the killed worker left open;
    returns its counts."""
    by_id = {job_id: (key, version) for (key, version), job_id in jobs.items()}
    per_key: dict[str, list[int]] = defaultdict(list)
    partitions: dict[str, set[int]] = defaultdict(set)
    event_ids: Counter[int] = Counter()
    for record in records:  # (partition, offset) order
        key = record.key.decode() if record.key is not None else None
        event_id = int(record.headers["event_id"] or b"0")
        assert event_id in by_id, f"a record of no job of this topic: {record}"
        assert by_id[event_id] == (key, record.payload["version"]), \
            f"event_id {event_id} is job {by_id[event_id]}, the record says {key} " \
            f"v{record.payload['version']}"
        per_key[key].append(record.payload["version"])
        partitions[key].add(record.partition)
        event_ids[event_id] += 1
    assert all(len(p) == 1 for p in partitions.values()), "a key spread over Kafka partitions"

    problems = {key: found for key, versions in per_key.items()
                if (found := order_problems(versions, resends_allowed=at_least_once))}
    assert not problems, f"versions out of order on {len(problems)} keys: " + "; ".join(
        f"{key}: {found[:3]} (sequence {per_key[key]})"
        for key, found in list(problems.items())[:5])

    delivered = set(event_ids)
    lost = sorted(set(by_id) - delivered - set(dead))
    assert not lost, f"{len(lost)} jobs neither delivered nor DEAD (lost): " + ", ".join(
        f"{by_id[i][0]} v{by_id[i][1]} (id {i})" for i in lost[:10])
    if at_least_once:
        assert not dead, f"at-least-once rows left DEAD: {sorted(dead.items())[:5]}"
        assert delivered == set(by_id)
        assert all(sorted(set(v)) == list(range(1, VERSIONS + 1)) for v in per_key.values())
        # Rows the dead worker had handed without an outcome stayed PENDING and were sent
        # (again) by the new owner.
        assert set(open_at_kill) <= delivered
    else:
        twice = {i: n for i, n in event_ids.items() if n > 1}
        assert not twice, f"at-most-once event_ids delivered more than once: {twice}"
        empty = [i for i, reason in dead.items() if not reason.strip()]
        assert not empty, f"DEAD rows without a reason: {empty}"
        # Rows the dead worker had handed without an outcome may have landed: the takeover
        # closes every one DEAD and none is sent again.
        not_closed = {i: dead.get(i) for i in open_at_kill if TAKEOVER not in dead.get(i, "")}
        assert not not_closed, f"in flight at the kill but not closed by the takeover: " \
            f"{not_closed}"
    return {
        "jobs": len(by_id),
        "records": len(records),
        "delivered_jobs": len(delivered),
        "duplicates": len(records) - len(delivered),
        "jobs_resent": sum(1 for n in event_ids.values() if n > 1),
        "dead": len(dead),
        "dead_and_delivered": len(set(dead) & delivered),
        "dead_by_reason": dict(Counter(reason_class(r) for r in dead.values()).most_common()),
        "keys": len(per_key),
        "open_at_kill": len(open_at_kill),
        "open_at_kill_delivered": len(set(open_at_kill) & delivered),
        "open_at_kill_delivered_twice": sum(1 for i in open_at_kill if event_ids[i] > 1),
    }


def test_order_definition() -> None:
    """What ``order_problems`` accepts: non-decreasing versions, equal neighbours only as
    at-least-once resends; a version after a higher one of its key is always a problem."""
    assert order_problems([1, 2, 3], resends_allowed=False) == []
    assert order_problems([1, 2, 2, 2, 3], resends_allowed=True) == []
    assert order_problems([1, 3], resends_allowed=False) == []  # v2 DEAD, never sent
    assert order_problems([1, 2, 2, 3], resends_allowed=False) == [
        "v2 delivered twice (#1, #2)"]
    assert order_problems([1, 3, 2], resends_allowed=True) == ["v2 at #2 after v3 had arrived"]
    # A resend of v1 after v2 arrived is out of order even though v1 arrived first.
    assert order_problems([1, 2, 1], resends_allowed=True) == ["v1 at #2 after v2 had arrived"]


def test_order_and_delivery_under_broker_stop_and_worker_kill(
        broker: KafkaBroker, kafka_targets: Any, workers: WorkerCluster) -> None:
    """Per-key order on both topics, at-most-once never twice and never lost, at-least-once
    complete, after a 10 s broker outage and a SIGKILLed worker mid-run."""
    started = time.monotonic()
    suffix = f"{int(time.time())}-{threading.get_ident() % 10_000}"
    amo_topic, alo_topic = f"jt.order-amo-{suffix}", f"jt.order-alo-{suffix}"
    broker.create_topics({amo_topic: (KAFKA_PARTITIONS, {}), alo_topic: (KAFKA_PARTITIONS, {})})
    amo, alo = kafka_targets(EXTRA_TOPICS=[amo_topic, f"{alo_topic}:at_least_once"])
    topics = {amo.name: amo_topic, alo.name: alo_topic}

    env = {"JOBS_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
           "JOBS_KAFKA_EXTRA_TOPICS": f"{amo_topic},{alo_topic}:at_least_once",
           "JOBS_PARTITIONS": str(conf.jobs_settings().PARTITIONS)}
    plan = [(amo.name, f"amo-{n:03d}") for n in range(KEYS_PER_TOPIC)] + \
           [(alo.name, f"alo-{n:03d}") for n in range(KEYS_PER_TOPIC)]
    enqueuer = Enqueuer(plan, VERSIONS, ROUND_INTERVAL_S, HOLD_AT_ROUND)
    procs = [workers.start("run_fast_lane", **env) for _ in range(WORKERS)]
    try:
        for proc in procs:
            proc.worker_id(timeout=30)
        enqueuer.start()

        # Fault 1: the broker stops for BROKER_DOWN_S while rounds keep coming; the stop
        # starts as a round commits, so the workers are sending it while the broker goes.
        assert enqueuer.committed[STOP_AT_ROUND - 1].wait(60)
        delivered_before_round = sum(records_in(broker, t) for t in topics.values())
        assert enqueuer.committed[STOP_AT_ROUND].wait(60)
        stopping = time.monotonic()
        broker.stop()
        stopped_at = time.monotonic()
        time.sleep(BROKER_DOWN_S)
        pending_at_restart = Job.objects.filter(status=JobStatus.PENDING).count()
        sent_at_restart = sent_ok(procs)
        starting = time.monotonic()
        broker.start()
        outage = {"stop_s": round(stopped_at - stopping, 1), "held_down_s": BROKER_DOWN_S,
                  "start_s": round(time.monotonic() - starting, 1)}

        # Fault 2: once the backlog drains again, SIGKILL a worker with rows in flight.
        wait_until(lambda: sent_ok(procs) > sent_at_restart, 60,
                   "deliveries after the broker came back", 0.05)
        enqueuer.resume.set()
        modes = {amo.name: amo.delivery_mode.value, alo.name: alo.delivery_mode.value}
        killed = kill_one_mid_send(procs, modes)

        enqueuer.join(timeout=120)
        assert not enqueuer.is_alive(), "enqueuing did not finish"
        if enqueuer.error is not None:
            raise enqueuer.error
        assert len(enqueuer.jobs) == 2 * KEYS_PER_TOPIC * VERSIONS

        def drained() -> bool:
            return not Job.objects.filter(status=JobStatus.PENDING).exists()

        wait_until(drained, DRAIN_DEADLINE_S, "no PENDING rows left", 0.5)
        drained_s = time.monotonic() - started

        survivors = [p for p in procs if p.alive()]
        assert len(survivors) == WORKERS - 1, "a worker died that was not killed"

        left = list(Job.objects.values_list("id", "target", "status", "last_error"))
        assert {status for _, _, status, _ in left} <= {JobStatus.DEAD}, \
            f"rows left that are not DEAD: {Counter(s for _, _, s, _ in left)}"
        counts: dict[str, Any] = {"jobs": len(enqueuer.jobs), "keys": len(plan),
                                  "workers": WORKERS, "topics": {}}
        for target in (amo, alo):
            jobs = {(key, version): job_id
                    for (name, key, version), job_id in enqueuer.jobs.items()
                    if name == target.name}
            dead = {job_id: error for job_id, name, _, error in left if name == target.name}
            records = read_all(broker, topics[target.name])
            counts["topics"][target.name] = {
                "delivery_mode": target.delivery_mode.value,
                **judge_topic(records, jobs, target.delivery_mode.value == "at_least_once",
                              dead, killed["open_ids"].get(target.delivery_mode.value, []))}
        assert not {name for _, name, _, _ in left} - {amo.name, alo.name}

        counts.update({
            "killed": {k: v for k, v in killed.items() if k != "open_ids"},
            "broker": {"stopped_at_round": STOP_AT_ROUND + 1, **outage,
                       "records_before_stop_round": delivered_before_round,
                       "pending_at_restart": pending_at_restart},
            "runs_by_result": run_results(procs),
            "elapsed_s": round(drained_s, 1),
        })
    except BaseException:
        enqueuer.resume.set()  # let the thread end (and close its connection)
        print(f"worker output in {workers.base_dir}\n{tails(procs)}")
        raise

    COUNTS_FILE.parent.mkdir(parents=True, exist_ok=True)
    COUNTS_FILE.write_text(json.dumps(counts, indent=2) + "\n")
    print("\nkafka order under faults:", json.dumps(counts, indent=2))
    # The faults happened where they were meant to: deliveries before the stop and a
    # backlog the outage built up (``kill_one_mid_send`` fails unless rows were in flight).
    assert delivered_before_round > 0
    assert pending_at_restart > 0
