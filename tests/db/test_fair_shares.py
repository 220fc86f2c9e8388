"""Fair shares between tenants on the long lane (``store.jobs_long_reserve_fair``,
``FAIR_SHARES``): a tenant's backlog holds another tenant's new row back by one reserve at
most, weights share a reserve, and the reserve's rules (exclusive codes, the at-most-once
bound, the rows of no tenant) hold on that path too.

Each test is written so that the plain reserve, in priority and run order alone, fails it.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction

from jobs_engine import store
from jobs_engine.conf import JobsSettings, load_settings
from jobs_engine.enqueueing import enqueue, enqueue_many
from jobs_engine.job import Job
from jobs_engine.lanes.long import LongLane
from jobs_engine.lanes.pauses import PauseGate
from jobs_engine.models import Job as JobModel
from jobs_engine.models import TenantWeight
from jobs_engine.states import DeliveryMode, JobStatus
from jobs_engine.tenancy import PLATFORM
from tests.helpers import FakeMonotonic, race

pytestmark = pytest.mark.django_db

SECOND = timedelta(seconds=1)
MICROSECOND = timedelta(microseconds=1)
BACKLOG = 2_000
# One handler thread per row, no prefetch: a reserve takes 10 rows.
TEN = load_settings({"LONG_BATCH": 10, "LONG_PREFETCH": 1}, environ={})
TARGET = "fair.work"


def lane(settings: JobsSettings = TEN) -> LongLane:
    worker_id = f"fair-{uuid.uuid4().hex[:6]}"
    return LongLane(worker_id, settings, PauseGate(worker_id, settings), threads=False,
                    monotonic=FakeMonotonic())


def backlog(tenant: str | None, n: int, first_at: datetime, *, target: str = TARGET,
            step: timedelta = MICROSECOND, **item: Any) -> None:
    """``n`` due rows of ``tenant`` (None: of no tenant) in one statement, the first at
    ``first_at`` and each next one ``step`` later."""
    enqueue_many([{"target": target, "payload": {"n": i}, "run_at": first_at + i * step,
                   "tenant_id": tenant or PLATFORM, **item} for i in range(n)])


def reserve(now: datetime, limit: int, *, target: str = TARGET, **kwargs: Any
            ) -> store.ReservedRows:
    return store.jobs_long_reserve_fair("fair", uuid.uuid4().hex, now, 300, limit,
                                        targets=[target], start=True, **kwargs)


def tenants_of(rows: store.ReservedRows) -> Counter[str | None]:
    return Counter(r.job.tenant_id for r in rows)


def set_weight(tenant: str, weight: int, now: datetime) -> None:
    TenantWeight.objects.update_or_create(tenant_id=tenant, defaults={
        "weight": weight, "updated_at": now, "updated_by": "test"})


@pytest.fixture
def ran(targets: Any) -> list[Job]:
    """Target ``fair.work`` on the long lane (at least once); the jobs its handler ran."""
    return targets(TARGET, lane="long", delivery_mode=DeliveryMode.AT_LEAST_ONCE).extra["calls"]


# -- a backlog does not hold another tenant's row back ----------------------------------------


def test_a_tenants_new_row_starts_in_the_next_reserve_behind_another_tenants_backlog(
        ran: list[Job], now: datetime) -> None:
    """Tenant A's 2,000 due rows, then tenant B's one: the lane's very next reserve of 10
    starts B's row; A's rows fill the rest of it (B's share it could not use)."""
    backlog("A", BACKLOG, now - 3600 * SECOND)
    b = enqueue(TARGET, {"b": 1}, tenant_id="B", run_at=now - SECOND).job_id
    assert lane().run_once(now) == 10
    assert b in {job.id for job in ran}
    assert Counter(job.tenant_id for job in ran) == {"A": 9, "B": 1}
    assert not JobModel.objects.filter(id=b).exists()


def test_with_fair_shares_off_the_new_row_waits_behind_the_backlog(ran: list[Job],
                                                                   now: datetime) -> None:
    """The same rows, ``FAIR_SHARES`` off: the reserve takes A's ten oldest rows, and B's
    row waits (so the test above can fail)."""
    backlog("A", BACKLOG, now - 3600 * SECOND)
    b = enqueue(TARGET, {"b": 1}, tenant_id="B", run_at=now - SECOND).job_id
    off = load_settings({"LONG_BATCH": 10, "LONG_PREFETCH": 1, "FAIR_SHARES": False},
                        environ={})
    assert lane(off).run_once(now) == 10
    assert Counter(job.tenant_id for job in ran) == {"A": 10}
    assert JobModel.objects.get(id=b).status == JobStatus.PENDING


def test_the_fair_reserve_alone_puts_the_new_row_first_among_its_rows(ran: list[Job],
                                                                      now: datetime) -> None:
    """The store's fair reserve: B's row among the 10, and in the order of the shares
    (each tenant's first row, in run order, then the rest): second, where the lane's
    threads take it at once."""
    backlog("A", BACKLOG, now - 3600 * SECOND)
    b = enqueue(TARGET, {"b": 1}, tenant_id="B", run_at=now - SECOND).job_id
    got = reserve(now, 10)
    assert [r.job.tenant_id for r in got] == ["A", "B", *["A"] * 8]
    assert got[1].job.id == b
    assert all(r.earlier_tries == [] for r in got)  # started, as the plain reserve does
    assert got.cursor is None


# -- weights --------------------------------------------------------------------------------


def test_weights_three_to_one_share_a_reserve_three_to_one(ran: list[Job],
                                                           now: datetime) -> None:
    """A of weight 3 and B of weight 1 (none: 1), their rows due in turn: a reserve of 20
    takes 15 of A's and 5 of B's, each one's oldest. In run order alone it would take 10
    of each."""
    backlog("A", 100, now - 3600 * SECOND, step=2 * MICROSECOND)
    backlog("B", 100, now - 3600 * SECOND + MICROSECOND, step=2 * MICROSECOND)
    set_weight("A", 3, now)
    got = reserve(now, 20)
    assert tenants_of(got) == {"A": 15, "B": 5}
    for tenant, share in (("A", 15), ("B", 5)):
        oldest = JobModel.objects.filter(tenant_id=tenant).order_by("next_run_at", "id")
        assert sorted(r.job.id for r in got if r.job.tenant_id == tenant) == list(
            oldest.values_list("id", flat=True)[:share])


def test_a_weight_changed_at_run_time_counts_from_the_next_reserve(ran: list[Job],
                                                                   now: datetime) -> None:
    """Equal weights: 10 and 10 of a reserve of 20. B's weight set to 3 (A's stays 1), and
    then back to 1 by removing its row: the next reserves follow, no restart."""
    backlog("A", 100, now - 3600 * SECOND, step=2 * MICROSECOND)
    backlog("B", 100, now - 3600 * SECOND + MICROSECOND, step=2 * MICROSECOND)
    assert tenants_of(reserve(now, 20)) == {"A": 10, "B": 10}
    set_weight("B", 3, now)
    assert tenants_of(reserve(now, 20)) == {"A": 5, "B": 15}
    TenantWeight.objects.filter(tenant_id="B").delete()
    assert tenants_of(reserve(now, 20)) == {"A": 10, "B": 10}


# -- the rows of no tenant ------------------------------------------------------------------


def test_rows_of_no_tenant_get_a_share_of_their_own(ran: list[Job], now: datetime) -> None:
    """The platform's rows count as one more tenant of weight 1: five of them behind a
    hundred of A's rows (of its 2,000), B's one row after them all. A reserve of 9 gives
    each a share of 3: the platform's takes three of its rows, B's its one, and the two
    rows B could not use go to A's next rows in run order. In run order alone all nine
    would be A's."""
    backlog("A", 100, now - 3600 * SECOND)
    backlog(None, 5, now - 3000 * SECOND)
    backlog("A", BACKLOG - 100, now - 2000 * SECOND)
    enqueue(TARGET, {"b": 1}, tenant_id="B", run_at=now - SECOND)
    got = reserve(now, 9)
    assert tenants_of(got) == {"A": 5, None: 3, "B": 1}
    assert [r.job.tenant_id for r in got][:3] == ["A", None, "B"]  # the first row of each


def test_rows_of_no_tenant_alone_are_reserved_in_run_order(ran: list[Job],
                                                           now: datetime) -> None:
    """With no tenant's row due, the fair reserve takes the platform's rows as the plain one
    would; and so does the lane, which looks for tenants' rows first and finds none."""
    backlog(None, 30, now - 60 * SECOND)
    oldest = list(JobModel.objects.order_by("next_run_at", "id").values_list("id", flat=True))
    assert [r.job.id for r in reserve(now, 10)] == oldest[:10]
    assert lane().run_once(now) == 10
    assert [job.id for job in ran] == oldest[10:20]


# -- the reserve's rules on the fair path -----------------------------------------------------


def test_one_row_per_exclusive_code_on_the_fair_path(targets: Any, now: datetime) -> None:
    """An exclusive target's rows of one code from two tenants: the fair reserve takes the
    first of the code only, and none while a row of it runs; other codes are taken."""
    targets("fair.excl", lane="long", exclusive=True)
    for tenant, code, at in (("A", "x", 1), ("A", "x", 2), ("B", "x", 3), ("B", "y", 4),
                             ("A", "z", 5)):
        enqueue("fair.excl", None, code=code, tenant_id=tenant,
                run_at=now - 100 * SECOND + at * SECOND)
    got = store.jobs_long_reserve_fair("fair", "tok", now, 300, 10, targets=["fair.excl"],
                                       exclusive_targets=["fair.excl"], start=True)
    assert sorted((r.job.tenant_id, r.job.code) for r in got) == [
        ("A", "x"), ("A", "z"), ("B", "y")]
    assert JobModel.objects.filter(status=JobStatus.RUNNING, code="x").count() == 1
    again = store.jobs_long_reserve_fair("fair", "tok2", now, 300, 10, targets=["fair.excl"],
                                         exclusive_targets=["fair.excl"], start=True)
    assert list(again) == []  # x runs; y and z run too


def test_the_at_most_once_bound_holds_and_is_shared_on_the_fair_path(targets: Any,
                                                                     now: datetime) -> None:
    """Five at-most-once rows of A, then five of B, and at-least-once rows of both: a
    reserve of 10 bound to 2 at-most-once rows takes one of each tenant (in run order alone
    both would be A's); the other at-most-once rows stay PENDING."""
    targets("fair.amo", lane="long")
    targets("fair.alo", lane="long", delivery_mode=DeliveryMode.AT_LEAST_ONCE)
    backlog("A", 5, now - 300 * SECOND, target="fair.amo")
    backlog("B", 5, now - 200 * SECOND, target="fair.amo")
    backlog("A", 5, now - 100 * SECOND, target="fair.alo")
    backlog("B", 5, now - 100 * SECOND + MICROSECOND, target="fair.alo")
    got = store.jobs_long_reserve_fair("fair", "tok", now, 300, 10,
                                       targets=["fair.amo", "fair.alo"], start=True,
                                       at_most_once_limit=2)
    once = [r.job for r in got if r.job.delivery_mode == DeliveryMode.AT_MOST_ONCE]
    assert sorted(job.tenant_id for job in once) == ["A", "B"]
    assert JobModel.objects.filter(status=JobStatus.PENDING, target="fair.amo").count() == 8
    assert len(got) <= 10


# -- the lane -----------------------------------------------------------------------------------


def test_a_project_without_tenants_keeps_the_plain_reserve(ran: list[Job], now: datetime,
                                                           monkeypatch: Any) -> None:
    """No tenant's row: the lane asks whether one waits at most once a ``POLL_S`` (one
    index entry), and reserves with the plain reserve and its cursor. Once a tenant's row
    waits, the next look finds it and the fair reserve runs."""
    asked: list[str] = []
    plain, fair, wait = (store.jobs_long_reserve, store.jobs_long_reserve_fair,
                         store.jobs_long_tenants_wait)

    def spy(name: str, call: Any) -> Any:
        def spying(*args: Any, **kwargs: Any) -> Any:
            asked.append(name)
            return call(*args, **kwargs)
        return spying

    monkeypatch.setattr(store, "jobs_long_reserve", spy("plain", plain))
    monkeypatch.setattr(store, "jobs_long_reserve_fair", spy("fair", fair))
    monkeypatch.setattr(store, "jobs_long_tenants_wait", spy("wait", wait))
    backlog(None, 30, now - 60 * SECOND)
    clock = FakeMonotonic()
    worker = LongLane("plain", TEN, PauseGate("plain", TEN), threads=False, monotonic=clock)
    assert [worker.run_once(now), worker.run_once(now)] == [10, 10]
    assert asked == ["wait", "plain", "plain"]
    enqueue(TARGET, None, tenant_id="B", run_at=now - SECOND)
    clock.advance(TEN.POLL_S)
    assert worker.run_once(now) == 10
    assert asked[3:] == ["wait", "fair"]
    assert "B" in {job.tenant_id for job in ran}


@pytest.mark.django_db(transaction=True)  # autocommit, as in a worker
def test_one_statement_reserves_and_starts_and_skips_paused_targets(targets: Any,
                                                                    now: datetime) -> None:
    """On PostgreSQL the fair reserve is one statement (one round trip); on SQLite one
    transaction. A paused target's rows stay PENDING; a target whose pause ran out has its
    rows reserved but not started (a probe's candidates), as with the plain reserve."""
    targets("fair.on", lane="long")
    targets("fair.paused", lane="long")
    targets("fair.expired", lane="long")
    on = enqueue("fair.on", None, tenant_id="A", run_at=now - SECOND).job_id
    paused = enqueue("fair.paused", None, tenant_id="A", run_at=now - SECOND).job_id
    expired = enqueue("fair.expired", None, tenant_id="B", run_at=now - SECOND).job_id
    store.pause_set("fair.paused", now, 60, "down")
    store.pause_set("fair.expired", now - 60 * SECOND, 30, "was down")
    seen: list[str] = []

    def count(execute: Any, sql: str, *args: Any) -> Any:
        seen.append(sql)
        return execute(sql, *args)

    with connection.execute_wrapper(count):
        got = store.jobs_long_reserve_fair("fair", "tok", now, 300, 10, start=True,
                                           targets=["fair.on", "fair.paused", "fair.expired"])
    if connection.vendor == "postgresql":
        assert len(seen) == 1
    assert sorted((r.job.id, r.earlier_tries) for r in got) == sorted(
        [(on, []), (expired, None)])
    assert JobModel.objects.get(id=paused).status == JobStatus.PENDING
    assert JobModel.objects.get(id=expired).started_at is None


@pytest.mark.django_db(transaction=True)
def test_a_code_claimed_by_another_worker_meanwhile_is_skipped_on_the_fair_path(
        targets: Any, now: datetime) -> None:
    """Another worker makes a row of an exclusive code RUNNING after the fair statement
    read its candidates: the unique index refuses the statement, and the reserve is made
    again in Python one code at a time, still in the shares' order."""
    targets("fair.meanwhile", lane="long", exclusive=True)
    targets("fair.meanwhile.plain", lane="long")
    taken = enqueue("fair.meanwhile", None, code="nightly", tenant_id="A",
                    run_at=now - 2 * SECOND).job_id
    waiting = enqueue("fair.meanwhile", None, code="nightly", tenant_id="B",
                      run_at=now - 2 * SECOND).job_id
    plain = [enqueue("fair.meanwhile.plain", None, tenant_id=tenant,
                     run_at=now - SECOND).job_id for tenant in ("A", "B")]
    other_started = threading.Event()
    release = threading.Event()

    def other_worker() -> None:  # claims ``taken`` and commits while our reserve waits
        with transaction.atomic():
            JobModel.objects.filter(id=taken).update(status=JobStatus.RUNNING,
                                                     running_code="nightly")
            other_started.set()
            release.wait(timeout=10 if connection.vendor == "postgresql" else 0)

    def ours() -> store.ReservedRows:
        assert other_started.wait(timeout=10)
        threading.Timer(0.3, release.set).start()  # commits while our UPDATE waits on it
        return store.jobs_long_reserve_fair(
            "fair", "tok", now, 300, 10, targets=["fair.meanwhile", "fair.meanwhile.plain"],
            exclusive_targets=["fair.meanwhile"], start=True)

    _, got = race(other_worker, ours)
    assert sorted(r.job.id for r in got) == sorted(plain)
    assert JobModel.objects.get(id=waiting).status == JobStatus.PENDING


@pytest.mark.django_db(transaction=True)
def test_racing_fair_reserves_take_each_row_once_and_each_code_once(targets: Any,
                                                                   now: datetime) -> None:
    """Three workers reserve at the same moment, round after round, from two tenants' rows
    (plain ones, and an exclusive code both tenants have): no row goes to two of them, no
    code runs twice, and every row is taken in the end."""
    targets("fair.race", lane="long", exclusive=True)
    targets("fair.race.plain", lane="long")
    for tenant in ("A", "B"):
        backlog(tenant, 20, now - 60 * SECOND, target="fair.race.plain")
        backlog(tenant, 2, now - 60 * SECOND, target="fair.race", code="nightly")
    taken: list[int] = []
    for _ in range(6):
        got = race(*[lambda owner=owner: store.jobs_long_reserve_fair(
            owner, uuid.uuid4().hex, now, 300, 4, targets=["fair.race", "fair.race.plain"],
            exclusive_targets=["fair.race"]) for owner in ("W1", "W2", "W3")])
        ids = [r.job.id for rows in got for r in rows]
        assert len(ids) == len(set(ids))
        assert JobModel.objects.filter(status=JobStatus.RUNNING, code="nightly").count() <= 1
        taken += ids
        JobModel.objects.filter(id__in=ids).delete()  # those runs finished
    assert len(taken) == len(set(taken)) == 44
