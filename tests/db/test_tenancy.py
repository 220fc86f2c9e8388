"""Every job has a tenant (docs/design.md#tenancy): where it comes from (the caller, the
request being served, the job whose handler enqueues, the flow, the schedule), that it is
kept on completed and DEAD jobs and in their statistics, that a bad tenant id or resolver
answer writes nothing, and that the resolver fails closed. Which surfaces show whose rows:
test_tenant_access.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core import checks
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory

from jobs_engine import flows, store
from jobs_engine.checks import check_jobs_settings
from jobs_engine.context import RequestContextMiddleware
from jobs_engine.contrib.schedules import declare
from jobs_engine.contrib.schedules.errors import InvalidSchedule
from jobs_engine.contrib.schedules.models import Schedule
from jobs_engine.contrib.schedules.operations import run_now
from jobs_engine.contrib.schedules.tick import tick
from jobs_engine.enqueueing import enqueue, enqueue_many
from jobs_engine.errors import InvalidFlow, InvalidJob, InvalidSettings
from jobs_engine.inspection import get_job
from jobs_engine.job import Job as HandlerJob
from jobs_engine.models import CompletedJob, Flow, Job
from jobs_engine.policies import JobPolicy
from jobs_engine.states import FlowState, JobStatus
from jobs_engine.tasks.compat import task_backends
from jobs_engine.tenancy import PLATFORM
from tests import task_functions as tasks
from tests.db.conftest import BY_TENANT
from tests.db.operator_helpers import manager
from tests.db.schedule_helpers import declared_schedule
from tests.helpers import drain_long_lane, fast_poller

pytestmark = pytest.mark.django_db

KEEP = JobPolicy(attempts=1, keep_completed=10, keep_failed=10)


def tenants() -> dict[int, str | None]:
    """Job id → tenant, of every job waiting, DEAD or completed."""
    return {**dict(Job.objects.values_list("id", "tenant_id")),
            **dict(CompletedJob.objects.values_list("id", "tenant_id"))}


# -- from the caller -------------------------------------------------------------------------


def test_enqueue_and_each_row_of_enqueue_many_take_a_tenant(targets: Any) -> None:
    targets("tn.t")
    mine = enqueue("tn.t", {"n": 1}, tenant_id="acme")
    rows = enqueue_many([{"target": "tn.t", "payload": 1, "tenant_id": "acme"},
                         {"target": "tn.t", "payload": 2, "tenant_id": "umbrella"},
                         {"target": "tn.t", "payload": 3, "tenant_id": PLATFORM},
                         {"target": "tn.t", "payload": 4}])
    assert tenants() == {mine.job_id: "acme", rows[0].job_id: "acme",
                         rows[1].job_id: "umbrella", rows[2].job_id: None,
                         rows[3].job_id: None}


def test_a_batch_of_payloads_with_one_tenant_or_several(targets: Any) -> None:
    """A batch of one target's payloads is inserted by the server (PostgreSQL) when its
    rows share a tenant; rows of several tenants, or some naming none, keep each their own."""
    targets("tn.t")
    same = enqueue_many([{"target": "tn.t", "payload": i, "tenant_id": "acme"}
                         for i in range(3)])
    mixed = enqueue_many([{"target": "tn.t", "payload": 1, "tenant_id": "acme"},
                          {"target": "tn.t", "payload": 2},
                          {"target": "tn.t", "payload": 3, "tenant_id": None}])
    none_first = enqueue_many([{"target": "tn.t", "payload": 1},
                               {"target": "tn.t", "payload": 2, "tenant_id": "acme"}])
    found = tenants()
    assert [found[r.job_id] for r in same] == ["acme"] * 3  # type: ignore[index]
    assert [found[r.job_id] for r in mixed] == ["acme", None, None]  # type: ignore[index]
    assert [found[r.job_id] for r in none_first] == [None, "acme"]  # type: ignore[index]
    with pytest.raises(InvalidJob, match="tenant_id"):
        enqueue_many([{"target": "tn.t", "payload": i, "tenant_id": ""} for i in range(3)])
    assert len(tenants()) == 8


BAD_TENANT_IDS = ["", "a\x00b", "x" * 201, 5, b"acme", "a\nb", "\ud800", "\x7f"]


@pytest.mark.parametrize("tenant_id", BAD_TENANT_IDS, ids=repr)
def test_a_tenant_id_that_is_not_a_short_printable_string_is_refused_writing_nothing(
        targets: Any, tenant_id: Any) -> None:
    targets("tn.bad")
    with pytest.raises(InvalidJob, match="tenant_id"):
        enqueue_many([{"target": "tn.bad", "payload": 1},
                      {"target": "tn.bad", "payload": 2, "tenant_id": tenant_id}])
    with pytest.raises(InvalidFlow, match="tenant_id"):
        flows.chain("c", [flows.Step("a")], tenant_id=tenant_id)
    with pytest.raises(InvalidSchedule, match="tenant_id"):
        declare("tn_bad", "* * * * *", lambda slot, job: None, tenant_id=tenant_id)
    assert not Job.objects.exists() and not Flow.objects.exists()


# -- from the request being served ---------------------------------------------------------


def serve(view: Callable[[HttpRequest], Any], **headers: str) -> Any:
    """``view`` run as a request through the context middleware; what it returned."""
    seen: list[Any] = []

    def respond(request: HttpRequest) -> HttpResponse:
        seen.append(view(request))
        return HttpResponse()

    RequestContextMiddleware(respond)(RequestFactory(headers=headers).post("/orders"))
    return seen[0]


def enqueue_every_way(request: HttpRequest) -> list[int]:
    """One job by each path of the enqueue, a flow's first step and a task."""
    plain = enqueue("tn.req", {"n": 1}).job_id  # a bare payload: the server makes the row
    keyed = enqueue("tn.req", {"n": 2}, key="k", dedupe_key=f"k-{id(request)}").job_id
    many = [r.job_id for r in enqueue_many([{"target": "tn.req", "payload": 3},
                                            {"target": "tn.req", "payload": 4, "key": "j"}])]
    flow = Flow.objects.get(id=flows.chain("tn-flow", [flows.Step("a")]))
    task = int(tasks.add.enqueue(1, 2).id)
    return [plain, keyed, *many, flow.steps.get().job_id, task]  # type: ignore[list-item]


@pytest.mark.parametrize(("headers", "tenant"), [
    ({"X-Tenant": "acme"}, "acme"),
    ({"X-Platform": "1"}, None),  # the platform operator's jobs belong to no tenant
    ({}, None),  # a request of no tenant owns nothing: its jobs are the platform's to see
])
def test_jobs_enqueued_while_serving_a_request_are_its_tenants(
        targets: Any, settings: Any, headers: dict[str, str], tenant: str | None) -> None:
    settings.JOBS = {"TENANT_RESOLVER": BY_TENANT}
    targets("tn.req")
    ids = serve(enqueue_every_way, **headers)
    assert [tenants()[job_id] for job_id in ids] == [tenant] * len(ids)
    assert {flow.tenant_id for flow in Flow.objects.all()} == {tenant}


def test_a_caller_names_another_tenant_or_none_inside_a_request(targets: Any,
                                                               settings: Any) -> None:
    settings.JOBS = {"TENANT_RESOLVER": BY_TENANT}
    targets("tn.req")
    ids = serve(lambda request: [enqueue("tn.req", 1, tenant_id="umbrella").job_id,
                                 enqueue("tn.req", 2, tenant_id=PLATFORM).job_id],
                **{"X-Tenant": "acme"})
    assert [tenants()[job_id] for job_id in ids] == ["umbrella", None]


def test_without_a_resolver_every_job_is_the_platforms(targets: Any) -> None:
    targets("tn.req")
    ids = serve(enqueue_every_way, **{"X-Tenant": "acme"})
    assert {tenants()[job_id] for job_id in ids} == {None}


RESOLVER_ANSWER: list[Any] = [None]


def resolver_answer(request: HttpRequest) -> Any:
    """A resolver answering ``RESOLVER_ANSWER[0]``, whatever the request."""
    return RESOLVER_ANSWER[0]


@pytest.mark.parametrize("answer", ["", "a\x00", "x" * 201, 7, ["acme"], "\ud800"], ids=repr)
def test_a_resolver_answer_that_is_no_tenant_is_an_error_naming_it_and_writes_nothing(
        targets: Any, settings: Any, answer: Any) -> None:
    settings.JOBS = {"TENANT_RESOLVER": f"{__name__}.resolver_answer"}
    RESOLVER_ANSWER[0] = answer
    targets("tn.req")
    with pytest.raises(InvalidSettings, match=r"TENANT_RESOLVER.*returned"):
        serve(lambda request: enqueue("tn.req", 1))
    client = Client()
    client.force_login(manager(flows=True))
    refused = client.post("/jobs/api/v1/job-flows/definitions/none/start", {"input": 1},
                          content_type="application/json")
    assert refused.status_code == 500 and refused.json()["code"] == "misconfigured"
    assert "TENANT_RESOLVER" in refused.json()["message"][0]
    assert not Job.objects.exists() and not Flow.objects.exists()


@pytest.mark.parametrize(("path", "problem"), [
    ("no.such.resolver", "cannot import"),
    ("jobs_engine.conf.API_DOCS_CHOICES", "not a function"),
])
def test_a_resolver_that_cannot_be_used_fails_the_system_check(settings: Any, path: str,
                                                                problem: str) -> None:
    settings.JOBS = {"TENANT_RESOLVER": path}
    [error] = check_jobs_settings()
    assert (error.level, error.id) == (checks.ERROR, "jobs_engine.E003")
    assert "TENANT_RESOLVER" in error.msg and path in error.msg and problem in error.msg
    settings.JOBS = {"TENANT_RESOLVER": BY_TENANT}
    assert check_jobs_settings() == []


# -- from the job whose handler enqueues -----------------------------------------------------


def test_a_handler_enqueues_in_its_jobs_tenant(targets: Any, now: datetime) -> None:
    followed: list[int] = []

    def follow(job: HandlerJob) -> None:
        followed.append(enqueue("tn.next", {"after": job.id}).job_id)  # type: ignore[arg-type]

    def batch(jobs: Any) -> list[None]:
        followed.append(enqueue("tn.next", {"batch": len(jobs)}).job_id)  # type: ignore[arg-type]
        return [None] * len(jobs)

    targets("tn.next", lane="long")
    targets("tn.first", handler=follow)
    targets("tn.batch", handler=follow, batch_handler=batch, delivery_mode="at_least_once")
    enqueue("tn.first", 1, tenant_id="acme")
    enqueue("tn.first", 2)
    enqueue_many([{"target": "tn.batch", "payload": 1, "tenant_id": "acme", "key": "a"},
                  {"target": "tn.batch", "payload": 2, "tenant_id": "acme", "key": "b"}])
    poll = fast_poller()
    poll(now)
    poll(now + timedelta(seconds=1))
    assert sorted(tenants()[job_id] or "" for job_id in followed) == ["", "acme", "acme"]
    # A send of jobs of several tenants: what its batch handler enqueues is nobody's.
    followed.clear()
    enqueue_many([{"target": "tn.batch", "payload": 3, "tenant_id": "acme", "key": "c"},
                  {"target": "tn.batch", "payload": 4, "tenant_id": "umbrella", "key": "d"}])
    poll(now + timedelta(seconds=2))
    assert [tenants()[job_id] for job_id in followed] == [None]


# -- kept with the job, and counted ------------------------------------------------------------


def test_completed_and_dead_jobs_keep_their_tenant_and_are_counted_in_it(
        targets: Any, now: datetime) -> None:
    def fail(job: HandlerJob) -> None:
        raise RuntimeError("no")

    targets("tn.ok", policy=KEEP)
    targets("tn.fail", handler=fail, policy=KEEP)
    ok = enqueue("tn.ok", 1, tenant_id="acme").job_id
    failed = enqueue("tn.fail", 2, tenant_id="acme").job_id
    enqueue("tn.ok", 3)
    fast_poller()(now)
    assert CompletedJob.objects.get(id=ok).tenant_id == "acme"
    assert get_job(ok).tenant_id == get_job(failed).tenant_id == "acme"  # type: ignore[union-attr,arg-type]
    assert Job.objects.get(id=failed).status == JobStatus.DEAD
    assert Job.objects.get(id=failed).tenant_id == "acme"
    since = now - timedelta(hours=2)
    assert {(target, outcome): count for _, target, outcome, count in
            store.job_stats_since(since, of_tenant="acme")} == {("tn.ok", "ok"): 1,
                                                               ("tn.fail", "dead"): 1}
    assert {(target, outcome): count for _, target, outcome, count in
            store.job_stats_since(since)} == {("tn.ok", "ok"): 2, ("tn.fail", "dead"): 1}


# -- flows and schedules -------------------------------------------------------------------------


@pytest.fixture
def step_handlers() -> Iterator[Callable[[str, Any], None]]:
    names: list[str] = []

    def register(name: str, handler: Any) -> None:
        flows.register_step(name, handler)
        names.append(name)

    yield register
    for name in names:
        flows._step_handlers.pop(name, None)


def test_every_step_job_of_a_flow_is_the_flows_tenants(step_handlers: Any) -> None:
    broken = {"now": True}

    def second(ctx: flows.StepContext) -> int:
        if broken["now"]:
            raise RuntimeError("not yet")
        return 2

    step_handlers("tn.one", lambda ctx: 1)
    step_handlers("tn.two", second)
    step_handlers("tn.summary", lambda ctx: list(ctx.results))
    chain = flows.chain("c", [flows.Step("tn.one"), flows.Step("tn.two")], tenant_id="acme")
    batch = flows.batch("b", [flows.Step("tn.one"), flows.Step("tn.one")],
                        on_complete=flows.Step("tn.summary"), tenant_id="acme")
    drain_long_lane(lambda: Flow.objects.get(id=chain).state == FlowState.FAILED
                    and Flow.objects.get(id=batch).state == FlowState.COMPLETED)
    broken["now"] = False
    flows.retry(chain)  # the failed step's new job too
    drain_long_lane(lambda: Flow.objects.get(id=chain).state == FlowState.COMPLETED)
    step_jobs = [job_id for flow in (chain, batch)
                 for job_id in Flow.objects.get(id=flow).steps.values_list("job_id", flat=True)]
    assert len(step_jobs) == 5 and {tenants()[job_id] for job_id in step_jobs} == {"acme"}


def test_a_schedule_names_the_tenant_of_its_slots_jobs(now: datetime) -> None:
    with declared_schedule("tn_sched", cron="* * * * *", tenant_id="acme") as row, \
            declared_schedule("tn_plain", cron="* * * * *") as plain:
        assert (row.tenant_id, plain.tenant_id) == ("acme", None)
        Schedule.objects.update(next_run_at=now - timedelta(seconds=5))
        tick(now)
        slot_jobs = dict(Job.objects.filter(code__in=[row.code, plain.code])
                         .values_list("code", "tenant_id"))
        assert slot_jobs == {row.code: "acme", plain.code: None}
        extra = run_now(row.code)
        assert tenants()[extra.job_id] == "acme"  # type: ignore[index]


def test_a_task_result_is_read_whatever_the_tenant(settings: Any) -> None:
    """``get_result`` is code, not an operator surface: it reads the task's result by id."""
    settings.JOBS = {"TENANT_RESOLVER": BY_TENANT}
    result_id = serve(lambda request: tasks.add.enqueue(1, 2).id, **{"X-Tenant": "acme"})
    assert tenants()[int(result_id)] == "acme"
    assert task_backends["default"].get_result(result_id).args == [1, 2]
