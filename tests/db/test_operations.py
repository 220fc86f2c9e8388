"""Operator actions (``jobs_engine.operators.actions``): retry, skip and cancel guarded on the
row's state, races with exactly one winner, refusals that change nothing, and an audit
record for every attempt (docs/actions.md#access)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User

from jobs_engine import store
from jobs_engine.job import Job as HandlerJob
from jobs_engine.models import AuditRecord, Job, TargetPause
from jobs_engine.operators import actions
from jobs_engine.operators.actions import Actor, InvalidStatus, JobNotFound, OperationRefused
from jobs_engine.states import JobStatus
from tests.db.operator_helpers import make_job, manager
from tests.helpers import fast_poller, race

pytestmark = pytest.mark.django_db


@pytest.fixture
def user() -> User:
    return manager()




def audits(action: str) -> list[AuditRecord]:
    return list(AuditRecord.objects.filter(action=action).order_by("id"))


# -- retry ---------------------------------------------------------------------------------


def test_retry_puts_a_dead_row_back_to_pending_due_now(targets: Any, user: User,
                                                       now: datetime) -> None:
    targets("ops.retry")
    job = make_job("ops.retry", status=JobStatus.DEAD)

    returned = actions.retry_job(job.id, user, now=now)

    row = Job.objects.get(id=job.id)
    assert returned.id == job.id and returned.status == JobStatus.PENDING
    assert row.status == JobStatus.PENDING
    assert row.attempts == 0
    assert row.next_run_at == now
    assert row.closed_at is None
    assert row.last_error == "RuntimeError: boom (attempt 6 of 6)"  # kept as evidence
    [record] = audits("retry")
    assert (record.user_id, record.username, record.object_type, record.object_id,
            record.result) == (user.pk, "manager", "job", str(job.id), "ok")


def test_retry_clears_a_long_lane_claim(targets: Any, user: User, now: datetime) -> None:
    targets("ops.retry.long", lane="long", exclusive=True)
    job = make_job("ops.retry.long", status=JobStatus.DEAD, claimed_by="w1", claim_token="t1",
                   lease_until=now, started_at=now, running_code="ops.retry.long")

    actions.retry_job(job.id, user, now=now)

    row = Job.objects.get(id=job.id)
    assert (row.claimed_by, row.claim_token, row.lease_until, row.started_at,
            row.running_code) == (None, None, None, None, None)


def test_a_retried_row_runs_again_on_the_fast_lane(targets: Any, user: User,
                                                   now: datetime) -> None:
    target = targets("ops.retry.run")
    job = make_job("ops.retry.run", status=JobStatus.DEAD)
    poll = fast_poller()
    assert poll(now) == 0  # DEAD rows are never read

    actions.retry_job(job.id, user, now=now)

    assert poll(now + timedelta(seconds=1)) == 1
    assert [call.id for call in target.extra["calls"]] == [job.id]
    assert not Job.objects.filter(id=job.id).exists()


@pytest.mark.parametrize("status", [JobStatus.PENDING, JobStatus.RUNNING])
def test_retry_refuses_a_row_that_is_not_dead(targets: Any, user: User, status: str) -> None:
    targets("ops.retry.refused", lane="long")
    job = make_job("ops.retry.refused", status=status, attempts=2)

    with pytest.raises(InvalidStatus, match=f"is {status}; retry needs a DEAD row") as caught:
        actions.retry_job(job.id, user)

    assert caught.value.status_code == 409 and caught.value.code == "invalid_status"
    row = Job.objects.get(id=job.id)
    assert (row.status, row.attempts, row.updated_at) == (status, 2, job.updated_at)
    [record] = audits("retry")
    assert record.result == "refused" and f"is {status}" in record.message


@pytest.mark.parametrize("raw", [987654321, "987654321", "abc", "0", "-1", "1.5", " ",
                                 2**63, str(2**63), "1" * 5000, "\u0661\u0662", "1\x00",
                                 True])
def test_unknown_or_malformed_ids_are_not_found_and_audited(targets: Any, user: User,
                                                            raw: Any) -> None:
    targets("ops.ids")
    job = make_job("ops.ids", status=JobStatus.DEAD)

    for action in (actions.retry_job, actions.skip_job, actions.cancel_job):
        with pytest.raises(JobNotFound) as caught:
            action(raw, user)
        assert caught.value.status_code == 404 and caught.value.code == "not_found"

    assert Job.objects.get(id=job.id).status == JobStatus.DEAD
    assert AuditRecord.objects.filter(result="refused").count() == 3


@pytest.mark.parametrize("spelling", ["0{id}", " {id}", "{id} ", "+{id}", "{id}.0",
                                      "{id}\n", "{head}_{tail}"])
def test_a_near_miss_of_a_real_id_is_not_that_job(targets: Any, user: User,
                                                  spelling: str) -> None:
    """int() reads " 17", "017" and "1_7" as 17; an operator's action must not."""
    targets("ops.near")
    job = make_job("ops.near", status=JobStatus.DEAD)
    text = str(job.id)
    raw = spelling.format(id=text, head=text[:1], tail=text[1:] or "0")

    with pytest.raises(JobNotFound):
        actions.retry_job(raw, user)
    assert Job.objects.get(id=job.id).status == JobStatus.DEAD


def test_audit_text_holds_what_a_request_may_carry(user: User) -> None:
    record = actions.audit(user, "set_override", "schedule", "code\x00",
                              ok=False, message="bad \ud800 cron \x00")
    record.refresh_from_db()
    assert record.object_id == "code\\x00" and record.message == "bad ? cron \\x00"


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_retries_exactly_one_wins(targets: Any) -> None:
    targets("ops.race")
    job = make_job("ops.race", status=JobStatus.DEAD)
    first, second = manager("first"), manager("second")

    def attempt(who: User) -> Callable[[], str]:
        def run() -> str:
            try:
                actions.retry_job(job.id, who)
            except InvalidStatus:
                return "refused"
            return "ok"
        return run

    results = race(attempt(first), attempt(second))

    assert sorted(results) == ["ok", "refused"]
    assert Job.objects.get(id=job.id).status == JobStatus.PENDING
    assert sorted(r.result for r in audits("retry")) == ["ok", "refused"]


# -- skip ----------------------------------------------------------------------------------


def test_skip_deletes_a_dead_row_and_logs_skipped(targets: Any, user: User,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    targets("ops.skip")
    job = make_job("ops.skip", status=JobStatus.DEAD, code="ops.skip.code")

    with caplog.at_level(logging.INFO, logger="jobs_engine"):
        removed = actions.skip_job(job.id, user)

    assert removed.id == job.id and removed.status == JobStatus.DEAD
    assert not Job.objects.filter(id=job.id).exists()
    assert (f"job run code=ops.skip.code target=ops.skip dedupe_key={job.dedupe_key} "
            "attempts=6 duration_ms=0.0 result=skipped") in caplog.messages
    assert [r.result for r in audits("skip")] == ["ok"]


def test_skip_refuses_a_pending_row(targets: Any, user: User) -> None:
    targets("ops.skip.pending")
    job = make_job("ops.skip.pending")

    with pytest.raises(InvalidStatus, match="skip needs a DEAD row"):
        actions.skip_job(job.id, user)

    assert Job.objects.filter(id=job.id, status=JobStatus.PENDING).exists()
    assert [r.result for r in audits("skip")] == ["refused"]


# -- cancel --------------------------------------------------------------------------------


def test_cancel_removes_a_pending_row(targets: Any, user: User,
                                      caplog: pytest.LogCaptureFixture) -> None:
    targets("ops.cancel")
    job = make_job("ops.cancel", key="k1")

    with caplog.at_level(logging.INFO, logger="jobs_engine"):
        removed = actions.cancel_job(job.id, user)

    assert removed.status == JobStatus.PENDING
    assert not Job.objects.filter(id=job.id).exists()
    assert any(m.endswith("result=cancelled") and job.dedupe_key in m for m in caplog.messages)
    assert [r.result for r in audits("cancel")] == ["ok"]


def test_cancel_of_a_held_key_head_frees_the_later_versions(targets: Any, user: User,
                                                            now: datetime) -> None:
    """An admin frees a key held by a row waiting for a retry by cancelling that row."""
    target = targets("ops.cancel.hold")
    head = make_job("ops.cancel.hold", key="order-1", version=1,
                    next_run_at=now + timedelta(hours=1), attempts=3)
    later = make_job("ops.cancel.hold", key="order-1", version=2)
    poll = fast_poller()
    assert poll(now) == 0  # the head waits for its retry and holds version 2

    actions.cancel_job(head.id, user)

    assert poll(now + timedelta(seconds=1)) == 1
    assert [call.id for call in target.extra["calls"]] == [later.id]


def test_cancel_refuses_a_fast_row_in_flight(targets: Any, user: User, now: datetime) -> None:
    refusals: list[OperationRefused] = []

    def handler(job: HandlerJob) -> None:  # the row is in flight while its handler runs
        try:
            actions.cancel_job(job.id, user)
        except OperationRefused as exc:
            refusals.append(exc)

    targets("ops.cancel.inflight", handler=handler)
    job = make_job("ops.cancel.inflight")

    assert fast_poller()(now) == 1

    [refusal] = refusals
    assert isinstance(refusal, InvalidStatus)
    assert "in flight" in refusal.message
    assert not Job.objects.filter(id=job.id).exists()  # the send succeeded and was recorded
    assert [r.result for r in audits("cancel")] == ["refused"]


def test_cancel_removes_a_long_row_reserved_but_not_started(targets: Any, user: User,
                                                            now: datetime) -> None:
    targets("ops.cancel.long", lane="long")
    job = make_job("ops.cancel.long")
    [reserved] = store.jobs_long_reserve("w1", "tok", now, 300, 10, targets=["ops.cancel.long"])
    assert reserved.job.id == job.id

    removed = actions.cancel_job(job.id, user)

    assert removed.status == JobStatus.RUNNING
    assert not Job.objects.filter(id=job.id).exists()
    # The worker that reserved it finds the row gone and never runs the handler.
    assert store.jobs_long_mark_started([job.id], "tok", now) == {}


def test_cancel_refuses_a_long_row_whose_handler_started(targets: Any, user: User,
                                                         now: datetime) -> None:
    targets("ops.cancel.started", lane="long")
    job = make_job("ops.cancel.started")
    store.jobs_long_reserve("w1", "tok", now, 300, 10, targets=["ops.cancel.started"])
    assert store.jobs_long_mark_started([job.id], "tok", now) == {job.id: []}

    with pytest.raises(InvalidStatus, match="handler has started"):
        actions.cancel_job(job.id, user)

    assert Job.objects.get(id=job.id).status == JobStatus.RUNNING


def test_cancel_refuses_a_dead_row(targets: Any, user: User) -> None:
    targets("ops.cancel.dead")
    job = make_job("ops.cancel.dead", status=JobStatus.DEAD)

    with pytest.raises(InvalidStatus, match="is DEAD"):
        actions.cancel_job(job.id, user)

    assert Job.objects.filter(id=job.id, status=JobStatus.DEAD).exists()


# -- targets and actors --------------------------------------------------------------------


def test_resume_ends_a_pause_and_refuses_a_target_not_paused(user: User, now: datetime) -> None:
    store.pause_set("ops.paused", now, 30, "TargetUnreachable: connection refused")

    actions.resume_target("ops.paused", user)

    assert not TargetPause.objects.filter(target="ops.paused").exists()
    with pytest.raises(OperationRefused, match="not paused"):
        actions.resume_target("ops.paused", user)
    assert [r.result for r in audits("resume")] == ["ok", "refused"]


def test_actor_of_a_user_the_system_and_an_anonymous_request(user: User) -> None:
    from django.contrib.auth.models import AnonymousUser

    assert Actor.of(user) == Actor(user.pk, "manager")
    assert Actor.of(None) == Actor(None, "system")
    assert Actor.of(AnonymousUser()) == Actor(None, "anonymous")
