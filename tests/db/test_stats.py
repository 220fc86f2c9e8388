"""Statistics and retention (docs/operations.md#metrics, #retention): hourly run counts per
target and outcome written by the outcome path in one upsert per record() call, DEAD rows
pruned after DEAD_TTL_DAYS by the workers, and the Prometheus ``/metrics`` endpoint."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from jobs_engine import conf, store
from jobs_engine.conf import load_settings
from jobs_engine.errors import DeadNow, TargetUnreachable
from jobs_engine.job import Job as HandlerJob
from jobs_engine.lanes import outcomes
from jobs_engine.lanes.long import LongLane
from jobs_engine.lanes.pauses import PauseGate
from jobs_engine.lanes.retention import RetentionCounts, RetentionService
from jobs_engine.lanes.worker import WorkerProcess
from jobs_engine.limits import PER_TENANT, Concurrency, Rate
from jobs_engine.models import Job, JobStatShard, LimitBucket
from jobs_engine.operators import metrics
from jobs_engine.states import JobStatus
from tests.db.operator_helpers import make_job
from tests.helpers import FakeMonotonic, fast_poller, race

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)


def hour_of(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def stats() -> dict[tuple[datetime, str, str], int]:
    return {(hour, target, outcome): count for hour, target, outcome, count
            in store.job_stats_since(datetime(2000, 1, 1, tzinfo=UTC))}


def raising(exc: BaseException) -> Callable[[HandlerJob], None]:
    def handler(job: HandlerJob) -> None:
        raise exc
    return handler




# -- hourly counts -------------------------------------------------------------------------


def test_fast_lane_runs_are_counted_per_hour_target_and_outcome(targets: Any,
                                                                now: datetime) -> None:
    targets("st.ok")
    targets("st.retry", handler=raising(ValueError("answered 500")))
    targets("st.down", handler=raising(TargetUnreachable("connection refused")))
    targets("st.dead", handler=raising(DeadNow("record too large")))
    for name, rows in (("st.ok", 3), ("st.retry", 2), ("st.down", 2), ("st.dead", 2)):
        for _ in range(rows):
            make_job(name)
    poll = fast_poller()

    poll(now)
    first = hour_of(now)
    assert stats() == {(first, "st.ok", "ok"): 3, (first, "st.retry", "retried"): 2,
                       (first, "st.down", "paused"): 1,  # the rest of a paused send waits
                       (first, "st.dead", "dead"): 2}

    poll(now + HOUR)  # the retries are due again, the paused target gets one probe
    later = hour_of(now + HOUR)
    assert stats()[(later, "st.retry", "retried")] == 2
    assert stats()[(later, "st.down", "paused")] == 1
    assert stats()[(first, "st.retry", "retried")] == 2  # earlier hours are kept apart


def test_long_lane_runs_are_counted(targets: Any, now: datetime) -> None:
    targets("st.long.ok", lane="long")
    targets("st.long.dead", lane="long", handler=raising(DeadNow("bad input")))
    for name in ("st.long.ok", "st.long.ok", "st.long.dead"):
        make_job(name)
    settings = conf.jobs_settings()
    lane = LongLane("w-long", settings, PauseGate("w-long", settings), threads=False,
                    monotonic=FakeMonotonic())

    assert lane.run_once(now) == 3

    assert stats() == {(hour_of(now), "st.long.ok", "ok"): 2,
                       (hour_of(now), "st.long.dead", "dead"): 1}


def test_one_statistics_statement_per_poll(targets: Any, now: datetime) -> None:
    targets("st.one.ok", delivery_mode="at_least_once")
    targets("st.one.retry", handler=raising(ValueError("no")))
    for _ in range(5):
        make_job("st.one.ok")
    for _ in range(3):
        make_job("st.one.retry")
    poll = fast_poller()

    with CaptureQueriesContext(connection) as captured:
        assert poll(now) == 8

    table = JobStatShard._meta.db_table
    writes = [q["sql"] for q in captured.captured_queries if table in q["sql"]]
    assert len(writes) == 1 and writes[0].upper().startswith("INSERT")
    assert "ON CONFLICT" not in writes[0].upper()  # appended (test_counts_are_appended_...)
    assert stats() == {(hour_of(now), "st.one.ok", "ok"): 5,
                       (hour_of(now), "st.one.retry", "retried"): 3}


def test_rows_closed_by_a_takeover_count_as_dead() -> None:
    outcomes.announce_closed([store.ClosedJob(1, "st.takeover", "c", "d:1", "in flight"),
                              store.ClosedJob(2, "st.takeover", "c", "d:2", "in flight")])
    [(key, count)] = stats().items()
    assert key[1:] == ("st.takeover", "dead") and count == 2


def test_counts_are_appended_never_updated_and_read_summed(now: datetime) -> None:
    """An update of one row per bucket made writers wait for each other's commits, and
    grew a chain of versions under an old snapshot: every count is a row of its own."""
    bucket = store.StatBucket(hour_of(now), "st.add", "ok", "")
    dead = store.StatBucket(hour_of(now), "st.add", "dead", "")
    with CaptureQueriesContext(connection) as captured:
        store.job_stats_add({bucket: 2})
        store.job_stats_add({bucket: 5, dead: 1})
    assert not any("UPDATE" in q["sql"].upper() for q in captured.captured_queries)
    assert sorted(JobStatShard.objects.filter(target="st.add").values_list(
        "outcome", "count")) == [("dead", 1), ("ok", 2), ("ok", 5)]
    assert stats() == {bucket[:3]: 7, dead[:3]: 1}


def test_a_tenants_runs_are_counted_apart_and_read_by_that_tenant_only(now: datetime
                                                                       ) -> None:
    hour = hour_of(now)
    store.job_stats_add({store.StatBucket(hour, "st.t", "ok", "acme"): 2,
                         store.StatBucket(hour, "st.t", "ok", "umbrella"): 3,
                         store.StatBucket(hour, "st.t", "ok", ""): 4})
    assert store.job_stats_since(hour, of_tenant="acme") == [(hour, "st.t", "ok", 2)]
    assert store.job_stats_since(hour, of_tenant="umbrella") == [(hour, "st.t", "ok", 3)]
    assert store.job_stats_since(hour) == [(hour, "st.t", "ok", 9)]  # the platform: all


# -- DEAD retention ------------------------------------------------------------------------


def test_prune_removes_only_dead_rows_older_than_the_ttl(targets: Any, now: datetime,
                                                         jobs_settings: Any) -> None:
    settings = jobs_settings(DEAD_TTL_DAYS=30)
    targets("st.prune")
    old = [make_job("st.prune", status=JobStatus.DEAD, closed_at=now - timedelta(days=31))
           for _ in range(3)]
    young = make_job("st.prune", status=JobStatus.DEAD, closed_at=now - timedelta(days=29))
    pending = make_job("st.prune", next_run_at=now - timedelta(days=90))
    running = make_job("st.prune", status=JobStatus.RUNNING,
                       lease_until=now - timedelta(days=40))

    retention = RetentionService(settings, batch=2)
    assert retention.run_once(now).failed == 3  # several batches in one run

    remaining = set(Job.objects.values_list("id", flat=True))
    assert remaining == {young.id, pending.id, running.id}
    assert not remaining & {job.id for job in old}


def test_retention_runs_at_most_once_per_retention_s(targets: Any, now: datetime,
                                                     jobs_settings: Any) -> None:
    settings = jobs_settings(DEAD_TTL_DAYS=7, RETENTION_S=60)
    targets("st.pruner")
    clock = FakeMonotonic()
    retention = RetentionService(settings, monotonic=clock)
    make_job("st.pruner", status=JobStatus.DEAD, closed_at=now - timedelta(days=8))

    assert retention.maybe_run(now).failed == 1  # type: ignore[union-attr]
    make_job("st.pruner", status=JobStatus.DEAD, closed_at=now - timedelta(days=8))
    clock.advance(59)
    assert retention.maybe_run(now) is None
    assert Job.objects.count() == 1
    clock.advance(1)
    assert retention.maybe_run(now).failed == 1  # type: ignore[union-attr]
    assert Job.objects.count() == 0


def test_retention_adds_the_statistics_shards_to_their_buckets(now: datetime) -> None:
    """Each session counts into its own shard of a bucket; a pass adds the shards into
    their bucket's FOLDED row (a tenant's apart) and removes them, counts unchanged; a
    session counting again makes a new shard."""
    hour = hour_of(now)
    folded = JobStatShard.FOLDED
    JobStatShard.objects.bulk_create([
        JobStatShard(hour=hour - HOUR, target="st.fold", outcome="ok", shard=shard,
                     count=count) for shard, count in ((5, 3), (9, 4))] + [
        JobStatShard(hour=hour - HOUR, target="st.fold", outcome="dead", shard=5, count=1),
        JobStatShard(hour=hour, target="st.fold", outcome="ok", shard=5, count=7),
        JobStatShard(hour=hour, target="st.fold", outcome="ok", shard=9, count=1),
        JobStatShard(hour=hour, target="st.fold", outcome="ok", shard=9, count=6,
                     tenant_id="acme"),
        JobStatShard(hour=hour, target="st.fold", outcome="ok", shard=folded, count=10)])
    sums = [row for row in store.job_stats_since(hour - HOUR) if row[1] == "st.fold"]

    RetentionService(conf.jobs_settings()).run_once(now)

    assert sorted(JobStatShard.objects.filter(target="st.fold").values_list(
        "hour", "outcome", "tenant_id", "shard", "count")) == [
        (hour - HOUR, "dead", "", folded, 1), (hour - HOUR, "ok", "", folded, 7),
        (hour, "ok", "", folded, 18), (hour, "ok", "acme", folded, 6)]
    assert [row for row in store.job_stats_since(hour - HOUR) if row[1] == "st.fold"] == sums
    assert store.job_stats_since(hour, of_tenant="acme") == [(hour, "st.fold", "ok", 6)]
    store.job_stats_add({store.StatBucket(hour, "st.fold", "ok", ""): 1})
    assert (hour, "st.fold", "ok", 25) in store.job_stats_since(hour)


@pytest.mark.django_db(transaction=True)
def test_two_workers_folding_at_once_count_each_shard_once(now: datetime) -> None:
    hour = hour_of(now) - HOUR
    JobStatShard.objects.bulk_create([
        JobStatShard(hour=hour, target="st.race", outcome="ok", shard=shard, count=shard)
        for shard in range(1, 21)])
    race(store.job_stats_fold_shards, store.job_stats_fold_shards)
    assert list(JobStatShard.objects.filter(target="st.race").values_list(
        "shard", "count")) == [(JobStatShard.FOLDED, sum(range(1, 21)))]


@pytest.mark.django_db(transaction=True)
def test_worker_heartbeat_prunes_old_dead_rows(targets: Any) -> None:
    targets("st.beat", lane="long")
    old = make_job("st.beat", status=JobStatus.DEAD, closed_at=store.db_now() - timedelta(days=31))
    young = make_job("st.beat", status=JobStatus.DEAD, closed_at=store.db_now())
    settings = load_settings({"PARTITION_LEASE_S": 3, "PARTITION_HEARTBEAT_S": 0.05,
                              "LONG_LEASE_S": 3, "LONG_HEARTBEAT_S": 0.05}, environ={})
    worker = WorkerProcess({"long"}, settings)
    beat = threading.Thread(target=worker._heartbeat_loop, daemon=True)
    beat.start()
    try:
        deadline = time.monotonic() + 10
        while Job.objects.filter(id=old.id).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        worker._stop_beats.set()
        beat.join(timeout=10)
    assert not Job.objects.filter(id=old.id).exists()
    assert Job.objects.filter(id=young.id).exists()


# -- /metrics ------------------------------------------------------------------------------


def families(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def test_metrics_report_backlog_age_dead_and_runs(targets: Any, now: datetime) -> None:
    targets("st.m.fast")
    targets("st.m.long", lane="long")
    make_job("st.m.fast", next_run_at=now - timedelta(seconds=90))
    make_job("st.m.fast", next_run_at=now + timedelta(minutes=5))
    make_job("st.m.long", next_run_at=now - timedelta(seconds=30))
    make_job("st.m.fast", status=JobStatus.DEAD)
    store.job_stats_add({store.StatBucket(hour_of(now), "st.m.fast", "ok", ""): 4,
                         store.StatBucket(hour_of(now) - HOUR, "st.m.fast", "ok", "acme"): 3,
                         store.StatBucket(hour_of(now), "st.m.fast", "dead", ""): 1})
    store.pause_set("st.m.fast", now, 30, "down")

    found = families(metrics.render(now).decode())

    assert found["jobs_backlog"] == {(("lane", "fast"),): 2, (("lane", "long"),): 1}
    assert found["jobs_oldest_pending_age_seconds"][(("lane", "fast"),)] == pytest.approx(90)
    assert found["jobs_oldest_pending_age_seconds"][(("lane", "long"),)] == pytest.approx(30)
    assert found["jobs_dead"] == {(): 1}
    assert found["jobs_running"] == {(): 0}
    assert found["jobs_target_paused"] == {(("target", "st.m.fast"),): 1}
    assert found["jobs_runs_total"] == {(("outcome", "dead"), ("target", "st.m.fast")): 1,
                                        (("outcome", "ok"), ("target", "st.m.fast")): 7}


def test_metrics_report_each_limited_targets_throttled_starts_and_running_rows(
        targets: Any, now: datetime) -> None:
    """``jobs_throttled_total``: its buckets' counts summed; ``jobs_limited_running``: its
    limited rows RUNNING; 0 for a registered target with limits that did neither; a
    target without limits has neither series."""
    targets("st.lim.render", lane="long", limits=[Concurrency(2, per=PER_TENANT)])
    targets("st.lim.pay", lane="long", limits=[Rate(5, period_s=60)])
    targets("st.lim.idle", lane="long", limits=[Concurrency(1)])
    targets("st.free", lane="long")
    for tenant, held in (("a", 3), ("b", 4)):
        LimitBucket.objects.create(target="st.lim.render", name="concurrency/tenant",
                                   key=tenant, throttled=held, used_at=now)
    LimitBucket.objects.create(target="st.lim.pay", name="rate", key="", throttled=1,
                               used_at=now)
    LimitBucket.objects.create(target="st.lim.gone", name="rate", key="", throttled=6,
                               used_at=now)  # of a target this process does not register
    for tenant in ("a", "a", "b"):
        make_job("st.lim.render", status=JobStatus.RUNNING, tenant_id=tenant)
    make_job("st.lim.render", tenant_id="a")  # PENDING: not running
    make_job("st.free", status=JobStatus.RUNNING)

    found = families(metrics.render(now).decode())

    assert found["jobs_throttled_total"] == {
        (("target", "st.lim.gone"),): 6, (("target", "st.lim.idle"),): 0,
        (("target", "st.lim.pay"),): 1, (("target", "st.lim.render"),): 7}
    assert found["jobs_limited_running"] == {
        (("target", "st.lim.gone"),): 0, (("target", "st.lim.idle"),): 0,
        (("target", "st.lim.pay"),): 0, (("target", "st.lim.render"),): 3}
    text = metrics.render(now).decode()
    assert "# TYPE jobs_throttled_total counter" in text
    assert "# TYPE jobs_limited_running gauge" in text
    assert 'jobs_limited_running{target="st.lim.render"} 3.0' in text


METRICS = "/jobs/metrics"


def test_metrics_endpoint_serves_prometheus_text_to_the_token(targets: Any, settings: Any
                                                               ) -> None:
    targets("st.m.http")
    make_job("st.m.http")
    settings.JOBS = {"METRICS_TOKEN": "s3cret-token"}
    scraper = Client(headers={"Authorization": "Bearer s3cret-token"})

    response = scraper.get(METRICS)

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    assert "# TYPE jobs_backlog gauge" in text
    assert 'jobs_backlog{lane="fast"} 1.0' in text
    assert "# TYPE jobs_runs_total counter" in text
    assert "jobs_workers_live 0.0" in text
    assert scraper.post(METRICS).status_code == 405


@pytest.mark.parametrize("header", [None, "Bearer wrong-token", "Basic s3cret-token",
                                    "Bearer ", "s3cret-token"])
def test_metrics_refuse_anonymous_callers_without_the_token(header: str | None,
                                                             settings: Any) -> None:
    settings.JOBS = {"METRICS_TOKEN": "s3cret-token"}
    client = Client(headers={"Authorization": header} if header else {})

    response = client.get(METRICS)

    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert "jobs_backlog" not in response.content.decode()


def test_metrics_are_closed_when_no_token_is_set(settings: Any) -> None:
    settings.JOBS = {}

    assert Client().get(METRICS).status_code == 401
    assert Client(headers={"Authorization": "Bearer "}).get(METRICS).status_code == 401


def test_metrics_open_to_users_with_the_engine_permission_only(settings: Any) -> None:
    from django.contrib.auth.models import Permission, User

    settings.JOBS = {}
    staff = User.objects.create_user("st-staff", password="pw", is_staff=True)
    manager = User.objects.create_user("st-manager", password="pw", is_staff=True)
    manager.user_permissions.add(Permission.objects.get(codename="manage_jobs"))
    as_staff, as_manager = Client(), Client()
    as_staff.force_login(staff)
    as_manager.force_login(manager)

    assert as_staff.get(METRICS).status_code == 403
    assert as_manager.get(METRICS).status_code == 200


def test_metrics_without_the_extra_say_how_to_install_it(settings: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    settings.JOBS = {"METRICS_TOKEN": "t"}
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails

    response = Client(headers={"Authorization": "Bearer t"}).get(METRICS)

    assert response.status_code == 501
    assert "pip install 'jobs-engine[metrics]'" in response.content.decode()


def test_a_retention_pass_cut_off_by_the_database_is_an_outage_not_a_bug(
        targets: Any, now: datetime, jobs_settings: Any, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A connection cut mid-pass raises, for the worker to ride out as an outage (logged
    once, no traceback); any other failure is logged in full and the pass tried again at
    the next due time."""
    from django.db import OperationalError

    from jobs_engine.lanes import retention as retention_module

    clock = FakeMonotonic()
    retention = RetentionService(jobs_settings(RETENTION_S=60), monotonic=clock)
    faults: list[Exception] = [OperationalError("server closed the connection"),
                               ValueError("a bug")]

    def failing() -> list[str]:
        raise faults.pop(0)

    monkeypatch.setattr(retention_module.store, "done_targets", failing)
    with pytest.raises(OperationalError):
        retention.maybe_run(now)
    assert "retention pass failed" not in caplog.text
    clock.advance(60)
    assert retention.maybe_run(now) == RetentionCounts()
    assert "retention pass failed" in caplog.text
