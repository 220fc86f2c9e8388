"""Limits (jobs_engine.limits): declared beside the target, kept by the database's buckets,
on both lanes. Lanes run with ``threads=False`` and explicit decision times."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest

from jobs_engine import store
from jobs_engine.conf import load_settings
from jobs_engine.enqueueing import enqueue, enqueue_many
from jobs_engine.errors import InvalidJob, RateLimited
from jobs_engine.job import Job
from jobs_engine.lanes.long import LongLane
from jobs_engine.lanes.pauses import PauseGate
from jobs_engine.limits import PER_LIMIT_KEY, PER_TENANT, Concurrency, Rate, per_field
from jobs_engine.models import Job as JobModel
from jobs_engine.models import LimitBucket, LimitOverride
from jobs_engine.registry import get_target
from jobs_engine.states import JobStatus
from tests.db.test_fast_lane import make_worker
from tests.helpers import FakeMonotonic

pytestmark = pytest.mark.django_db

SETTINGS = load_settings({}, environ={})
SECOND = timedelta(seconds=1)
MILLISECOND = timedelta(milliseconds=1)


def long_worker(name: str = "L") -> LongLane:
    worker_id = f"{name}-{uuid.uuid4().hex[:6]}"
    return LongLane(worker_id, SETTINGS, PauseGate(worker_id, SETTINGS), threads=False,
                    monotonic=FakeMonotonic())


def reserve(target: str, now: datetime, limit: int = 10) -> store.Admitted:
    return store.jobs_long_reserve_limited(f"w-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex, now,
                                           300, limit, targets=[get_target(target)],
                                           start=True)


def running(target: str) -> int:
    return JobModel.objects.filter(target=target, status=JobStatus.RUNNING).count()


def test_a_concurrency_limit_admits_its_slots_across_reserves_and_frees_them_with_outcomes(
        targets: Any, now: datetime) -> None:
    targets("lim.render", lane="long", limits=[Concurrency(2)])
    enqueue_many([{"target": "lim.render", "payload": n} for n in range(6)])
    first = reserve("lim.render", now)
    assert len(first.rows) == 2 and first.wait_s is None  # slots: no token to wait for
    assert len(reserve("lim.render", now).rows) == 0  # another worker: the slots are taken
    assert running("lim.render") == 2
    JobModel.objects.filter(id=first.rows[0].job.id or 0).delete()  # its outcome moved it
    assert len(reserve("lim.render", now).rows) == 1
    bucket = LimitBucket.objects.get(target="lim.render")
    assert bucket.admitted == 3 and bucket.throttled == 1


def test_a_limit_per_key_holds_each_key_apart_and_other_keys_flow(targets: Any,
                                                                 now: datetime) -> None:
    targets("lim.import", lane="long", limits=[Concurrency(1, per=per_field("account"))])
    enqueue_many([{"target": "lim.import", "payload": {"account": "a", "n": n}}
                  for n in range(50)] + [{"target": "lim.import", "payload": {"account": 7}}])
    got = reserve("lim.import", now)
    assert sorted(r.job.limit_key or "" for r in got.rows) == ["7", "a"]
    assert [r.job.payload["n"] for r in got.rows if r.job.limit_key == "a"] == [0]


def test_a_rate_limit_takes_its_burst_then_tells_when_the_next_token_comes(
        targets: Any, now: datetime) -> None:
    targets("lim.pay", lane="long", limits=[Rate(3, period_s=60)])
    enqueue_many([{"target": "lim.pay", "payload": n} for n in range(10)])
    assert len(reserve("lim.pay", now).rows) == 3
    held = reserve("lim.pay", now)
    assert held.rows == [] and held.wait_s == pytest.approx(20, abs=0.1)
    assert len(reserve("lim.pay", now + 20 * SECOND).rows) == 1
    assert len(reserve("lim.pay", now + 80 * SECOND).rows) == 3  # the burst, never more


def test_an_operators_override_is_in_force_at_the_next_admission(targets: Any,
                                                                   now: datetime) -> None:
    targets("lim.over", lane="long", limits=[Concurrency(1)])
    enqueue_many([{"target": "lim.over", "payload": n} for n in range(10)])
    assert len(reserve("lim.over", now).rows) == 1
    LimitOverride.objects.create(target="lim.over", name="concurrency", slots=4,
                                 updated_at=now)
    assert len(reserve("lim.over", now).rows) == 3


def test_the_long_lane_runs_limited_and_free_targets_side_by_side(targets: Any,
                                                                 now: datetime) -> None:
    targets("lim.few", lane="long", limits=[Concurrency(1, per=PER_TENANT)])
    targets("lim.free", lane="long")
    enqueue_many([{"target": "lim.few", "payload": n, "tenant_id": t}
                  for n in range(4) for t in ("acme", "globex")]
                 + [{"target": "lim.free", "payload": n} for n in range(4)])
    lane = long_worker()
    assert lane.run_once(now) == 6  # 4 free rows, one a tenant of the limited target
    assert len(get_target("lim.few").extra["calls"]) == 2


def test_rate_limited_keeps_the_rows_place_and_attempts_and_blocks_its_key(
        targets: Any, now: datetime) -> None:
    def handler(job: Job) -> None:
        raise RateLimited("429 from the provider", retry_after_s=30)

    targets("lim.429", handler=handler, lane="long", limits=[Rate(100, period_s=1)])
    job_id = enqueue("lim.429", None).job_id
    assert job_id is not None
    enqueue("lim.429", None)
    lane = long_worker()
    assert lane.run_once(now) == 2
    rows = JobModel.objects.filter(target="lim.429")
    assert {(r.status, r.attempts) for r in rows} == {(JobStatus.PENDING, 0)}
    assert JobModel.objects.get(id=job_id).next_run_at < now  # its place in the run order
    assert lane.run_once(now + 10 * SECOND) == 0
    due_in = lane.due_in_s()
    assert due_in is not None and 19 < due_in <= 20  # asleep until the block ends: no busy loop
    assert lane.run_once(now + 31 * SECOND) == 2


def test_rate_limited_without_limits_waits_itself_and_spends_no_attempt(
        targets: Any, now: datetime) -> None:
    def handler(job: Job) -> None:
        raise RateLimited(retry_after_s=30)

    targets("lim.429-free", handler=handler, lane="long")
    job_id = enqueue("lim.429-free", None).job_id
    assert job_id is not None
    assert long_worker().run_once(now) == 1
    row = JobModel.objects.get(id=job_id)
    assert row.status == JobStatus.PENDING and row.attempts == 0
    assert row.next_run_at == now + 30 * SECOND


def test_the_fast_lane_sends_what_the_rate_admits_and_keeps_each_keys_order(
        targets: Any, now: datetime) -> None:
    targets("lim.events", limits=[Rate(2, period_s=60)])
    enqueue_many([{"target": "lim.events", "payload": n, "key": f"k{n % 3}", "version": n}
                  for n in range(9)])
    lane = make_worker("F")
    assert lane.run(now) == 2
    assert lane.run(now) == 0
    sent = [job.payload for job in get_target("lim.events").extra["calls"]]
    assert sent == [0, 1]  # the heads of k0 and k1; k2's head keeps its place
    assert lane.run(now + 30 * SECOND) == 1
    assert [job.payload for job in get_target("lim.events").extra["calls"]] == [0, 1, 2]


FIELD = [Concurrency(1, per=per_field("account"))]
BY_KEY = [Concurrency(1, per=PER_LIMIT_KEY)]
GOOD = {"payload": {"account": "a"}}


@pytest.mark.parametrize(("limits", "good", "item", "field", "problem"), [
    (FIELD, GOOD, {"payload": {"other": 1}}, "payload", "has no field 'account'"),
    (FIELD, GOOD, {"payload": [1]}, "payload", "has no field 'account'"),
    (FIELD, GOOD, {"payload": {"account": ["a"]}}, "payload.account",
     "non-empty string or a whole number"),
    (FIELD, GOOD, {"payload": {"account": True}}, "payload.account", "got bool"),
    (FIELD, GOOD, {"payload": {"account": "x" * 201}}, "payload.account", "over 200"),
    # The payload's own checks come first.
    (FIELD, GOOD, {"payload": {"account": "a\x00"}}, "payload", "NUL"),
    (FIELD, GOOD, {"payload": {"account": "a\ud800"}}, "payload", "surrogate"),
    (BY_KEY, {"payload": 1, "limit_key": "k"}, {"payload": 1}, "limit_key", "is required"),
    (BY_KEY, {"payload": 1, "limit_key": "k"}, {"payload": 1, "limit_key": 5}, "limit_key",
     "non-empty string"),
    ([], {"payload": 1}, {"payload": 1, "limit_key": "a"}, "limit_key",
     "has no limit per limit_key"),
])
def test_a_bad_limit_key_is_refused_naming_it_and_nothing_is_written(
        targets: Any, limits: list[Any], good: dict[str, Any], item: dict[str, Any],
        field: str, problem: str) -> None:
    targets("lim.bad", lane="long", limits=limits)
    enqueue_many([{"target": "lim.bad", **good}])  # the good item alone is taken
    with pytest.raises(InvalidJob, match=problem) as raised:
        enqueue_many([{"target": "lim.bad", **good}, {"target": "lim.bad", **item}])
    assert raised.value.field == field
    assert JobModel.objects.filter(target="lim.bad").count() == 1


def test_a_fast_lane_held_back_by_its_rate_waits_for_the_next_token_not_its_idle_pace(
        targets: Any, now: datetime) -> None:
    targets("lim.fast-wait", limits=[Rate(10, period_s=1, burst=1)])
    enqueue_many([{"target": "lim.fast-wait", "payload": n} for n in range(3)])
    lane = make_worker("W")
    assert lane.run(now) == 1
    due_in = lane.lane.due_in_s()
    assert due_in is not None and 0.099 < due_in < 0.101  # a token every 100 ms
    assert lane.run(now + 100 * MILLISECOND) == 1
    lane.leases.release_all()  # a poll that reads nothing forgets the wait: no stale 0 s
    assert lane.lane.run_once(now) == 0 and lane.lane.due_in_s() is None


def test_retention_removes_idle_buckets_of_keys_and_keeps_the_rest(targets: Any,
                                                                   now: datetime) -> None:
    from jobs_engine.lanes.retention import RetentionService

    targets("lim.keys", lane="long", limits=[Concurrency(1, per=PER_TENANT),
                                             Rate(1, period_s=86400, name="daily")])
    old, recent = now - 2 * 3600 * SECOND, now - 60 * SECOND
    for name, key, used_at, blocked in [
            ("concurrency/tenant", "idle", old, None),
            ("concurrency/tenant", "", old, None),  # the target's own: kept
            ("concurrency/tenant", "busy", recent, None),
            ("concurrency/tenant", "blocked", old, now + 60 * SECOND),
            ("daily", "idle", old, None)]:  # a day to refill: not as a new one yet
        LimitBucket.objects.create(target="lim.keys", name=name, key=key, used_at=used_at,
                                   blocked_until=blocked)
    counts = RetentionService(SETTINGS).run_once(now)
    assert counts.buckets == 1
    assert sorted(LimitBucket.objects.values_list("name", "key")) == [
        ("concurrency/tenant", ""), ("concurrency/tenant", "blocked"),
        ("concurrency/tenant", "busy"), ("daily", "idle")]


def test_rate_limited_on_the_fast_lane_holds_the_key_and_its_later_versions(
        targets: Any, now: datetime) -> None:
    answers = ["wait", "ok"]

    def handler(job: Job) -> None:
        if job.payload == 0 and answers.pop(0) == "wait":
            raise RateLimited(retry_after_s=30)
        sent.append(job.payload)

    sent: list[Any] = []
    targets("lim.fast-429", handler=handler, limits=[Rate(100, period_s=1)])
    enqueue_many([{"target": "lim.fast-429", "payload": n, "key": "k", "version": n}
                  for n in range(3)])
    lane = make_worker("R")
    lane.run(now)
    rows = JobModel.objects.filter(target="lim.fast-429").order_by("version")
    assert [(r.status, r.attempts) for r in rows] == [(JobStatus.PENDING, 0)] * 3
    assert sent == [] and lane.run(now + 10 * SECOND) == 0  # the key's bucket is blocked
    lane.run(now + 31 * SECOND)
    lane.run(now + 31 * SECOND)
    lane.run(now + 31 * SECOND)
    assert sent == [0, 1, 2]  # in version order once the block ended


def test_an_admission_whose_clock_is_behind_the_buckets_pays_for_its_tokens_once(
        targets: Any, now: datetime) -> None:
    """Two workers' clocks differ by a few milliseconds, and the one behind may commit its
    admission after the other's: its time is then the bucket's last refill, so a token is
    taken once and the rows it admits are stamped no earlier than their tokens."""
    targets("lim.skew", lane="long", limits=[Rate(20, period_s=1, burst=5)])
    enqueue_many([{"target": "lim.skew", "payload": n} for n in range(50)])
    now += 10 * SECOND  # every row due, even 50 ms before
    taken = len(reserve("lim.skew", now, limit=1).rows)
    for _ in range(5):  # a worker whose clock reads 50 ms earlier
        admitted = reserve("lim.skew", now - 50 * MILLISECOND, limit=4)
        taken += len(admitted.rows)
        assert admitted.at == now
        assert all(r.job.id is not None for r in admitted.rows)
    assert taken == 5  # the burst, once
    started = set(JobModel.objects.filter(status=JobStatus.RUNNING)
                  .values_list("started_at", flat=True))
    assert started == {now}


def test_a_block_read_on_a_clock_behind_the_bucket_gives_back_no_token(
        targets: Any, now: datetime) -> None:
    """A handler's ``RateLimited`` judged on a worker whose clock lags another's admission
    blocks until a moment the bucket has passed: the bucket keeps its later time, so the
    block empties it and never refills the tokens that admission took."""
    targets("lim.late", lane="long", limits=[Rate(20, period_s=1, burst=5)])
    enqueue_many([{"target": "lim.late", "payload": n} for n in range(50)])
    now += 10 * SECOND
    assert len(reserve("lim.late", now).rows) == 5  # the burst
    store.limits_block(get_target("lim.late"), "", now - 500 * MILLISECOND, now - SECOND)
    assert len(reserve("lim.late", now + 50 * MILLISECOND).rows) == 1  # one token since
    bucket = LimitBucket.objects.get(target="lim.late")
    assert bucket.blocked_until == now - 500 * MILLISECOND and bucket.throttled >= 1


@pytest.mark.parametrize("limits", [[Concurrency(1)], [Concurrency(1, per=PER_TENANT)],
                                    [Concurrency(1, per=per_field("account"))]])
def test_rows_enqueued_before_a_target_declared_limits_are_keyed_and_run_under_them(
        targets: Any, now: datetime, limits: list[Any]) -> None:
    from jobs_engine import registry
    from jobs_engine.lanes.retention import RetentionService

    targets("lim.later", lane="long")
    enqueue_many([{"target": "lim.later", "payload": {"account": n}, "tenant_id": "acme"}
                  for n in range(3)])
    registry.unregister_target("lim.later")
    targets("lim.later", lane="long", limits=limits)
    assert long_worker().run_once(now) == 0  # not the free reserve's, not keyed yet
    assert RetentionService(SETTINGS).run_once(now).rekeyed == 3
    keys = set(JobModel.objects.filter(target="lim.later").values_list("limit_key", flat=True))
    assert keys == {"target": {""}, "tenant": {"acme"}, "payload.account": {"0", "1", "2"}}[
        limits[0].per]
    ran = long_worker().run_once(now)
    assert ran == (3 if limits[0].per == "payload.account" else 1)


def test_rows_of_a_target_that_dropped_its_limits_run_as_any_other(targets: Any,
                                                                    now: datetime) -> None:
    from jobs_engine import registry
    from jobs_engine.lanes.retention import RetentionService

    targets("lim.dropped", lane="long", limits=[Concurrency(1)])
    enqueue_many([{"target": "lim.dropped", "payload": n} for n in range(3)])
    registry.unregister_target("lim.dropped")
    targets("lim.dropped", lane="long")
    assert long_worker().run_once(now) == 0
    assert RetentionService(SETTINGS).run_once(now).rekeyed == 3
    assert long_worker().run_once(now) == 3


def test_a_plan_from_stale_buckets_is_held_to_them_under_the_locks(
        targets: Any, now: datetime, monkeypatch: Any) -> None:
    """PostgreSQL's admission plans from the buckets as they are, unlocked, then locks them
    and counts again in one call: another worker's admission committed in between is seen,
    and the rows over the slots are never touched. (SQLite plans under its lock: the same
    holds without a stale plan.)"""
    from jobs_engine.store import limits as store_limits

    targets("lim.stale", lane="long", limits=[Concurrency(2)])
    enqueue_many([{"target": "lim.stale", "payload": n} for n in range(6)])
    assert len(reserve("lim.stale", now).rows) == 2  # another worker holds both slots
    before = dict(JobModel.objects.filter(status=JobStatus.PENDING)
                  .values_list("id", "updated_at"))
    if store.is_postgres():  # the plan misses the 2 running
        monkeypatch.setattr(store_limits, "_running", lambda names: {})
    assert reserve("lim.stale", now).rows == []
    assert running("lim.stale") == 2
    after = dict(JobModel.objects.filter(status=JobStatus.PENDING)
                 .values_list("id", "updated_at"))
    assert after == before
    bucket = LimitBucket.objects.get(target="lim.stale")
    assert bucket.admitted == 2 and bucket.throttled >= 1


def test_a_poll_the_limits_held_back_leaves_the_lane_quiet(targets: Any, now: datetime
                                                           ) -> None:
    """Rows admitted and others held back by the limits: a poll at once would find no more
    room, so the worker waits for its own slot to come free (a poke), a token or its idle
    pace, instead of polling again at once as after a full reserve."""
    targets("lim.quiet", lane="long", limits=[Concurrency(2)])
    targets("lim.loud", lane="long")
    enqueue_many([{"target": "lim.quiet", "payload": n} for n in range(5)])
    lane = long_worker()
    assert lane.run_once(now + SECOND) == 2 and lane.quiet
    enqueue_many([{"target": "lim.loud", "payload": n} for n in range(3)])
    JobModel.objects.filter(target="lim.quiet").delete()
    assert lane.run_once(now + 2 * SECOND) == 3 and not lane.quiet


def test_the_admissions_prepared_reads_keep_the_limits_indexes_in_a_generic_plan(
        targets: Any, now: datetime) -> None:
    """The running rows' count, a whole target's due probe and the next due row are
    prepared: their states are literals of the text, so a generic plan still matches the
    partial indexes (``jobs_limited_running``, ``jobs_limited_pending``); as parameters,
    it read the table (250 ms an admission at 1,000,000 rows)."""
    from django.db import connection

    from jobs_engine.store import limits as store_limits

    if not store.is_postgres():  # SQLite keeps no plans
        assert store_limits._running(["lim.plan"]) == {}
        return
    targets("lim.plan", lane="long", limits=[Concurrency(2)])
    reads = {"GROUP BY j.target, j.limit_key": "jobs_limited_running",
             "SELECT MIN(j.next_run_at)": "jobs_limited_pending",
             "FROM unnest($1::text[]) AS t(name)": "jobs_limited_pending"}
    values = {"text": "'lim.plan'", "text[]": "'{lim.plan}'",
              "timestamp with time zone": "now()"}
    with connection.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_generic_plan")
    try:
        store_limits._running(["lim.plan"])
        store_limits._next_due(["lim.plan"], now)
        store_limits._due_targets(["lim.plan"], now)
        with connection.cursor() as cursor:
            cursor.execute("SELECT name, statement, parameter_types::text[] "
                           "FROM pg_prepared_statements")
            used = {}
            for name, statement, types in cursor.fetchall():
                read = next((r for r in reads if r in statement), None)
                if read is None:
                    continue
                cursor.execute(f"EXPLAIN EXECUTE {name}("
                               + ", ".join(values[t] for t in types) + ")")
                used[read] = "\n".join(row[0] for row in cursor.fetchall())
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET plan_cache_mode")
    assert set(used) == set(reads)
    assert all(reads[read] in plan for read, plan in used.items()), used
