"""The demo business app (``examples.orders``; docs/design.md#enqueue) on PostgreSQL and SQLite.

An order's status change and its Kafka event are one transaction: rollback leaves neither,
commit leaves exactly one job with the derived dedupe key and the order's next version, a
replay makes no second job. These tests only check what is enqueued; the last one sends to
a port where no broker listens, which must pause the target and keep the row.
"""

from __future__ import annotations

import io
import socket
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction

from examples.models import Order
from examples.orders import (
    ORDER_STATUS_CHANGED,
    create_order,
    enqueue_status_changed,
    orders_target,
    orders_topic,
    update_order_status,
)
from jobs_engine import conf, registry, store
from jobs_engine.contrib.kafka.producer import close_producers
from jobs_engine.contrib.kafka.settings import parse_kafka_settings
from jobs_engine.contrib.kafka.target import register_topics
from jobs_engine.lanes.fast import FastLane
from jobs_engine.lanes.partitions import PartitionLeases
from jobs_engine.lanes.pauses import PauseGate
from jobs_engine.models import Job, TargetPause, VersionCounter
from jobs_engine.states import DeliveryMode, JobStatus, Lane
from tests.helpers import FakeMonotonic

TRANSACTIONAL = pytest.mark.django_db(transaction=True)


class Boom(Exception):
    """Raised by a test to roll back its business transaction."""


def order_jobs(number: str) -> list[Job]:
    return list(Job.objects.filter(target=orders_target(), key=number).order_by("version"))


def number() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


def test_the_orders_topic_is_a_kafka_target_from_the_project_settings() -> None:
    """config/settings.py lists the demo topic in JOBS["KAFKA"]["EXTRA_TOPICS"]; the Kafka
    app registered it at start-up as an at-least-once fast-lane target."""
    target = registry.get_target(orders_target())
    assert orders_target() == f"kafka:{orders_topic()}" == "kafka:demo.orders"
    assert (target.lane, target.delivery_mode) == (Lane.FAST, DeliveryMode.AT_LEAST_ONCE)
    assert target.batch_handler is not None


@TRANSACTIONAL
def test_rollback_leaves_no_job_no_status_change_and_no_version() -> None:
    """The block rolls back after the update: the row keeps its status, no job exists for
    the change, and the version counter rolled back too (the next change is version 2)."""
    n = number()
    order = create_order(n)
    with pytest.raises(Boom), transaction.atomic():
        update_order_status(order, Order.Status.PAID)
        assert len(order_jobs(n)) == 2  # visible inside the block ...
        raise Boom
    assert Order.objects.get(number=n).status == Order.Status.NEW
    assert [j.version for j in order_jobs(n)] == [1]  # ... gone with it
    update_order_status(order, Order.Status.PAID)
    assert [j.version for j in order_jobs(n)] == [1, 2]


@TRANSACTIONAL
def test_a_failed_create_leaves_neither_order_nor_job() -> None:
    n = number()
    with pytest.raises(Boom), transaction.atomic():
        create_order(n)
        raise Boom
    assert not Order.objects.filter(number=n).exists()
    assert order_jobs(n) == []


@TRANSACTIONAL
def test_each_commit_enqueues_one_job_with_derived_dedupe_key_and_next_version() -> None:
    n = number()
    order = create_order(n)
    first = update_order_status(order, Order.Status.PAID)
    second = update_order_status(order, Order.Status.SHIPPED)
    assert first is not None and first.inserted and second is not None and second.inserted
    jobs = order_jobs(n)
    assert [(j.version, j.dedupe_key) for j in jobs] == [
        (1, f"order-status-changed:{n}:1"), (2, f"order-status-changed:{n}:2"),
        (3, f"order-status-changed:{n}:3")]
    assert [j.id for j in jobs][1:] == [first.job_id, second.job_id]
    assert [(j.payload["previous_status"], j.payload["status"]) for j in jobs] == [
        (None, "new"), ("new", "paid"), ("paid", "shipped")]
    for version, job in enumerate(jobs, start=1):
        assert (job.code, job.key, job.lane, job.status) == (
            ORDER_STATUS_CHANGED, n, Lane.FAST, JobStatus.PENDING)
        assert job.delivery_mode == DeliveryMode.AT_LEAST_ONCE
        assert job.payload["number"] == n and job.payload["version"] == version
    assert Order.objects.get(number=n).status == order.status == Order.Status.SHIPPED
    assert VersionCounter.objects.get(key=f"order:{n}").value == 3


@TRANSACTIONAL
def test_versions_are_per_order() -> None:
    a, b = number(), number()
    order_a, order_b = create_order(a), create_order(b)
    update_order_status(order_a, Order.Status.PAID)
    update_order_status(order_a, Order.Status.SHIPPED)
    update_order_status(order_b, Order.Status.CANCELLED)
    assert [j.version for j in order_jobs(a)] == [1, 2, 3]
    assert [j.version for j in order_jobs(b)] == [1, 2]


@TRANSACTIONAL
def test_a_replayed_update_makes_no_second_job() -> None:
    """The same status again (a replayed request) changes nothing and spends no version."""
    n = number()
    order = create_order(n)
    update_order_status(order, Order.Status.PAID)
    assert update_order_status(order, Order.Status.PAID) is None
    assert [j.version for j in order_jobs(n)] == [1, 2]
    assert VersionCounter.objects.get(key=f"order:{n}").value == 2


@TRANSACTIONAL
def test_re_emitting_a_version_inserts_nothing_and_keeps_the_transaction() -> None:
    """The derived dedupe key repeats for a replayed version: nothing is inserted, nothing
    raised, and the caller's transaction goes on (on PostgreSQL a failed INSERT would have
    aborted it) and commits its other writes."""
    n = number()
    order = create_order(n)
    first = update_order_status(order, Order.Status.PAID)
    assert first is not None
    with transaction.atomic():
        replay = enqueue_status_changed(order, Order.Status.NEW, 2)
        assert (replay.inserted, replay.job_id) == (False, first.job_id)  # the existing row
        Order.objects.filter(pk=order.pk).update(status=Order.Status.SHIPPED)
    assert [j.version for j in order_jobs(n)] == [1, 2]
    assert order_jobs(n)[1].payload["status"] == "paid"  # first wins
    assert Order.objects.get(pk=order.pk).status == Order.Status.SHIPPED


@TRANSACTIONAL
def test_an_unknown_status_is_refused_before_any_write() -> None:
    n = number()
    order = create_order(n)
    with pytest.raises(ValueError, match="unknown order status 'lost'"):
        update_order_status(order, "lost")
    assert Order.objects.get(pk=order.pk).status == Order.Status.NEW
    assert [j.version for j in order_jobs(n)] == [1]


@TRANSACTIONAL
def test_the_demo_command_publishes_order_changes_through_the_service() -> None:
    """``enqueue_demo`` (run by scripts/run.sh) creates orders and walks each through
    paid, shipped, delivered: four events per order, versions 1..4 in status order."""
    before = set(Order.objects.values_list("number", flat=True))
    call_command("enqueue_demo", events=1, orders=2, stdout=io.StringIO())
    made = sorted(set(Order.objects.values_list("number", flat=True)) - before)
    assert len(made) == 2
    for n in made:
        jobs = order_jobs(n)
        assert [(j.version, j.payload["status"]) for j in jobs] == [
            (1, "new"), (2, "paid"), (3, "shipped"), (4, "delivered")]
        assert all(j.dedupe_key == f"order-status-changed:{n}:{j.version}" for j in jobs)



@TRANSACTIONAL
def test_the_demo_load_spreads_events_over_keys_with_growing_versions() -> None:
    """``enqueue_demo --load N --keys K`` (scripts/docker-test.sh's load): N events
    round-robin over K keys, each key's versions 1, 2, ... so a consumer can check order."""
    out = io.StringIO()
    call_command("enqueue_demo", events=0, orders=0, load=10, keys=3, stdout=out)
    prefix = out.getvalue().split(" keys ")[1].split("-* ")[0]
    rows = Job.objects.filter(key__startswith=f"{prefix}-").order_by("id")
    by_key: dict[str, list[int]] = {}
    for job in rows:
        assert job.target == orders_target() and job.code == "load_event"
        by_key.setdefault(job.key, []).append(job.version)
    assert by_key == {f"{prefix}-1": [1, 2, 3, 4], f"{prefix}-2": [1, 2, 3],
                      f"{prefix}-3": [1, 2, 3]}


@pytest.mark.parametrize(("option", "value"), [("keys", 0), ("load", -1), ("orders", -2)])
@TRANSACTIONAL
def test_the_demo_command_refuses_a_bad_count_before_any_write(option: str, value: int
                                                                ) -> None:
    before = Job.objects.count()
    with pytest.raises(CommandError, match=f"--{option} must be"):
        call_command("enqueue_demo", **{option: value}, stdout=io.StringIO())
    assert Job.objects.count() == before

# -- no broker: the event waits -------------------------------------------------------------


@pytest.fixture
def orders_target_without_broker() -> Iterator[None]:
    """The orders target re-registered against a loopback port that refuses connections
    (bound, never listening), so a broker a developer runs on 19092 cannot answer; the
    project's registration is restored afterwards."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    project = registry.get_target(orders_target())
    registry.unregister_target(orders_target())
    close_producers(timeout=1)
    try:
        register_topics(parse_kafka_settings({
            "BOOTSTRAP_SERVERS": f"127.0.0.1:{closed.getsockname()[1]}",
            "EXTRA_TOPICS": [f"{orders_topic()}:at_least_once"]}, environ={}))
        yield
    finally:
        close_producers(timeout=1)
        registry.unregister_target(orders_target())
        registry.register_target(
            project.name, project.handler, lane=project.lane,
            delivery_mode=project.delivery_mode, batch_handler=project.batch_handler,
        ).extra.update(project.extra)
        closed.close()


@TRANSACTIONAL
def test_with_no_broker_the_event_stays_pending_and_the_target_pauses(
        orders_target_without_broker: None, now: datetime) -> None:
    """The demo's fallback: the send is refused (never transmitted), so the row keeps its
    attempts and stays PENDING, and the target is paused for PROBE_S for every worker."""
    n = number()
    create_order(n)
    settings = conf.jobs_settings()
    clock = FakeMonotonic()
    leases = PartitionLeases("examples-test", settings, monotonic=clock)
    lane = FastLane("examples-test", settings, leases, PauseGate("examples-test", settings),
                    monotonic=clock)
    store.partitions_seed(settings.PARTITIONS)
    at = now + timedelta(seconds=1)
    leases.heartbeat(at)
    assert lane.run_once(at) == 1
    job = order_jobs(n)[0]
    assert (job.status, job.attempts) == (JobStatus.PENDING, 0)
    assert "kafka not sent to demo.orders" in job.last_error
    pause = TargetPause.objects.get(target=orders_target())
    assert pause.paused_until >= at + timedelta(seconds=settings.PROBE_S - 1)
    assert lane.run_once(at) == 0  # paused: nothing read until the probe is due
    leases.release_all()
