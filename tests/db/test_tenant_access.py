"""Every operator surface is bound to the caller's tenant (docs/design.md#tenancy), on every
admin URL of the engine's and the schedules' models (read from the admin registry) and on
every API route (read from the OpenAPI schema), so a new page or route cannot escape it.

Three tenants' worth of rows: tenant A's, tenant B's and the platform's own (no tenant);
the resolver reads the tenant from a header. Tenant B asking for one of A's objects gets
exactly what it gets for an id no row has (the same statuses, redirects and messages, the
id aside), and nothing changes; A itself gets the object and its actions work. Every list
shows B its own rows only; a request of no tenant sees nothing; the pages of the whole
cluster (workers, partitions, target pauses) and ``/metrics`` are the platform operator's.
The platform's settings (limits' overrides, tenants' weights, pauses by hand) are changed
by the platform operator only: every tenant, and a request of no tenant, is refused (403)
and nothing changes; a tenant reads its own keys of limits per tenant and its own weight.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import URLPattern, reverse
from django.utils import timezone

from jobs_engine import flows, store
from jobs_engine.contrib.schedules.models import Schedule
from jobs_engine.limits import PER_TENANT, Concurrency
from jobs_engine.models import (
    AuditRecord,
    CompletedJob,
    Flow,
    FlowStep,
    Job,
    LimitBucket,
    LimitOverride,
    Partition,
    RegisteredTarget,
    TargetPause,
    TenantWeight,
    Worker,
)
from jobs_engine.operators.actions import audit
from jobs_engine.operators.api import api
from jobs_engine.states import FlowState, JobStatus, StepState
from jobs_engine.tenancy import PLATFORM
from tests.db.conftest import BY_TENANT
from tests.db.operator_helpers import make_job, manager
from tests.db.schedule_helpers import declared_schedule

pytestmark = pytest.mark.django_db

API = "/jobs/api/v1"
APPS = ("jobs_engine", "jobs_engine_schedules")
UNKNOWN_ID = 987654321  # no row has it
UNKNOWN_CODE = "no_such_schedule"
DEFINED_FLOW = "tenants-defined"
LIMITED = "ten.lim"  # limits: "concurrency" (the whole target's) and "concurrency/tenant"


@dataclass
class Owned:
    """One tenant's rows: one of each kind an operator can see or act on."""

    job: Job  # DEAD: retry
    dead: Job  # DEAD: skip
    pending: Job  # PENDING: cancel
    completed: CompletedJob
    failed_flow: Flow  # retry
    running_flow: Flow  # cancel
    schedule: Schedule
    record: AuditRecord


def owned(tenant: str | None, schedule: Schedule) -> Owned:
    """Rows of ``tenant`` (None: the platform's own), as the engine makes them."""
    scope = tenant or PLATFORM
    label = tenant or "platform"
    job, dead = (make_job("ten.t", status=JobStatus.DEAD, tenant_id=tenant) for _ in range(2))
    pending = make_job("ten.t", tenant_id=tenant)
    now = timezone.now()
    completed = CompletedJob.objects.create(
        id=pending.id + 100_000, target="ten.t", lane="fast", code="ten.t",
        dedupe_key=f"ten-done-{label}", delivery_mode="at_most_once", payload={"n": 1},
        result={"r": 1}, attempts=1, created_at=now, started_at=now, finished_at=now,
        tenant_id=tenant)
    failed_flow = Flow.objects.get(id=flows.chain(f"ten-failed-{label}", [flows.Step("a")],
                                                  tenant_id=scope))
    step_job = failed_flow.steps.get().job_id
    Job.objects.filter(id=step_job).update(status=JobStatus.DEAD, closed_at=now)
    failed_flow.steps.update(state=StepState.FAILED, last_error="boom")
    Flow.objects.filter(id=failed_flow.id).update(state=FlowState.FAILED, finished_at=now)
    running_flow = Flow.objects.get(id=flows.chain(f"ten-running-{label}", [flows.Step("a")],
                                                   tenant_id=scope))
    record = audit(None, "retry", "job", job.id, ok=True, scope=scope)
    store.job_stats_add({store.StatBucket(now.replace(minute=0, second=0, microsecond=0),
                                          "ten.t", "ok", tenant or ""): 3})
    return Owned(job, dead, pending, completed, failed_flow, running_flow, schedule, record)


@dataclass
class World:
    a: Owned
    b: Owned
    platform: Owned
    partition: Partition
    worker: Worker
    pause: TargetPause


@pytest.fixture
def world(targets: Any, settings: Any) -> Iterator[World]:
    settings.JOBS = {"TENANT_RESOLVER": BY_TENANT}
    targets("ten.t")
    targets(LIMITED, lane="long", limits=[Concurrency(3), Concurrency(2, per=PER_TENANT)])
    now = timezone.now()
    for tenant in ("a", "b"):  # each tenant's key of the limit per tenant, and its weight
        LimitBucket.objects.create(target=LIMITED, name="concurrency/tenant", key=tenant,
                                   used_at=now, admitted=4, throttled=1)
        TenantWeight.objects.create(tenant_id=tenant, weight=2, updated_at=now)
    flows.define(DEFINED_FLOW, lambda value: flows.ChainSpec([flows.Step("a", value)]), "")
    with declared_schedule("ten_a", tenant_id="a") as sched_a, \
            declared_schedule("ten_b", tenant_id="b") as sched_b, \
            declared_schedule("ten_p") as sched_p:
        yield World(
            owned("a", sched_a), owned("b", sched_b), owned(None, sched_p),
            Partition.objects.create(partition=0, owner="w-1:1:a",
                                     lease_until=now + timedelta(seconds=30)),
            Worker.objects.create(worker_id="w-1:1:a", heartbeat_at=now, started_at=now,
                                  hostname="host", pid=1, lanes="fast"),
            TargetPause.objects.create(target="ten.t", reason="down", paused_at=now,
                                       paused_until=now + timedelta(minutes=5)))
    flows._definitions.pop(DEFINED_FLOW, None)


HEADERS = {"a": {"X-Tenant": "a"}, "b": {"X-Tenant": "b"}, "platform": {"X-Platform": "1"},
           "none": {}}


def client_as(who: str) -> Client:
    """A staff user with every permission of the engine's, acting for ``who``."""
    client = Client(headers=HEADERS[who])
    username = f"manager-{who}"
    client.force_login(User.objects.filter(username=username).first()
                       or manager(username, flows=True))
    return client


def snapshot() -> tuple[Any, ...]:
    """Everything an operator action could change; an action done adds an OK audit record
    (a refused one is recorded, as refused)."""
    return (sorted(Job.objects.values_list("id", "status", "attempts", "next_run_at")),
            sorted(CompletedJob.objects.values_list("id", flat=True)),
            sorted(Flow.objects.values_list("id", "state")),
            sorted(FlowStep.objects.values_list("id", "state", "job_id")),
            sorted(Schedule.objects.values_list("code", "enabled", "cron_override",
                                                "next_run_at")),
            sorted(TargetPause.objects.values_list("target", "paused_until", "reason")),
            sorted(LimitOverride.objects.values_list("target", "name", "slots")),
            sorted(TenantWeight.objects.values_list("tenant_id", "weight")),
            AuditRecord.objects.filter(result=AuditRecord.Result.OK).count())


def same_but_ids(first: str, second: str, ids: tuple[Any, Any]) -> None:
    """Two answers equal once the two ids they name are taken out."""
    def plain(text: str, row_id: Any) -> str:
        return re.sub(rf"(?<![0-9A-Za-z_]){re.escape(str(row_id))}(?![0-9A-Za-z_])", "ID",
                      text)

    assert plain(first, ids[0]) == plain(second, ids[1])


# -- the API, route by route from its schema -------------------------------------------------


def routes() -> list[tuple[str, str]]:
    paths = api.get_openapi_schema()["paths"]
    return sorted((method.upper(), path) for path, methods in paths.items()
                  for method in methods)


ROUTES = routes()
NAMED = [(method, path) for method, path in ROUTES
         if "{job_id}" in path or "{flow_id}" in path or "{code}" in path]
# Lists (no id in the path) and what each entry of theirs must carry to show whose it is;
# a list of no tenant's rows says so here.
LISTS = [(method, path) for method, path in ROUTES if "{" not in path and method == "GET"]
TENANTLESS_LISTS = {f"{API}/job-flows/definitions"}  # code's definitions: everyone's
# What the platform operator's list holds besides A's and B's (None: the platform's own);
# a weight is always a tenant's.
PLATFORM_LISTS = {f"{API}/tenant-weights": {"a", "b"}}
# The platform's settings: changed by the platform operator only, whoever's they concern.
SETTINGS = [(method, path) for method, path in ROUTES
            if path.startswith((f"{API}/limits/", f"{API}/tenant-weights/", f"{API}/targets/"))]
# Routes a test of its own covers below.
OWN_TESTS = {("POST", f"{API}/job-flows/definitions/{{name}}/start")}
BODIES = {("PUT", f"{API}/schedules/{{code}}/cron_override"): {"cron_override": "*/5 * * * *"},
          ("PUT", f"{API}/limits/{{target}}/{{name}}"): {"slots": 5},
          ("PUT", f"{API}/tenant-weights/{{tenant_id}}"): {"weight": 3}}


def test_every_api_route_is_covered_here() -> None:
    """A route names a tenant's object, lists, changes a platform setting, or has a test of
    its own: a new one that is none of these fails here."""
    assert set(ROUTES) == set(NAMED) | set(LISTS) | set(SETTINGS) | OWN_TESTS


def fill(path: str, rows: Owned | None) -> tuple[str, Any]:
    """The path naming ``rows``' object for the route's action (None: ids no row has) and
    the id it names."""
    action = path.rsplit("/", 1)[-1]
    if "{job_id}" in path:
        job = None if rows is None else {"skip": rows.dead, "cancel": rows.pending}.get(
            action, rows.job)
        row_id: Any = UNKNOWN_ID if job is None else job.pk
        return path.replace("{job_id}", str(row_id)), row_id
    if "{flow_id}" in path:
        flow = None if rows is None else (rows.running_flow if action == "cancel"
                                          else rows.failed_flow)
        row_id = UNKNOWN_ID if flow is None else flow.pk
        return path.replace("{flow_id}", str(row_id)), row_id
    code = UNKNOWN_CODE if rows is None else rows.schedule.code
    return path.replace("{code}", code), code


def send(client: Client, method: str, url: str, route: str | None = None) -> Any:
    """``method`` of ``url``, with the body ``route`` (its path in the schema) takes."""
    body = BODIES.get((method, route or url))
    return client.generic(method, url, "" if body is None else json.dumps(body),
                          content_type="application/json")


@pytest.mark.parametrize("method, path", NAMED)
def test_an_api_route_answers_another_tenants_object_as_an_unknown_one(
        world: World, method: str, path: str) -> None:
    as_b = client_as("b")
    before = snapshot()
    theirs_url, theirs_id = fill(path, world.a)
    unknown_url, unknown_id = fill(path, None)

    theirs = send(as_b, method, theirs_url, path)
    unknown = send(as_b, method, unknown_url, path)

    assert theirs.status_code == unknown.status_code == 404, (theirs.content, path)
    same_but_ids(theirs.content.decode(), unknown.content.decode(), (theirs_id, unknown_id))
    assert snapshot() == before
    # A request of no tenant sees no tenant's object, nor the platform's.
    nobody = client_as("none")
    for rows in (world.a, world.platform):
        assert send(nobody, method, fill(path, rows)[0], path).status_code == 404
    assert snapshot() == before
    # The owner, and the platform operator, get it (the owner's action is done).
    mine = send(client_as("a"), method, theirs_url, path)
    assert mine.status_code == 200, (path, mine.content)
    assert send(client_as("platform"), method, fill(path, world.b)[0], path).status_code == 200


@pytest.mark.parametrize("method, path", LISTS)
def test_an_api_list_shows_the_callers_tenants_rows_only(world: World, method: str,
                                                          path: str) -> None:
    queries = [""] + (["?status=DONE", "?status=DEAD"] if path == f"{API}/jobs" else [])
    for query in queries:
        seen = {who: send(client_as(who), method, path + query).json()
                for who in ("a", "b", "none", "platform")}
        entries = {who: answer if isinstance(answer, list) else answer["data"]
                   for who, answer in seen.items()}
        if path in TENANTLESS_LISTS:
            assert entries["a"] == entries["b"] == entries["platform"]
            continue
        for who, tenant in (("a", "a"), ("b", "b")):
            assert entries[who], (path, query, who)  # each tenant has rows of its own here
            assert {entry["tenant_id"] for entry in entries[who]} == {tenant}, (path, query)
        assert entries["none"] == []
        assert {entry["tenant_id"] for entry in entries["platform"]} \
            == PLATFORM_LISTS.get(path, {"a", "b", None})


def settings_url(path: str, tenant: str) -> str:
    """A setting's route, naming the limited target's limit of the whole target, the
    paused target, or ``tenant``'s weight."""
    return (path.replace("{target}", LIMITED).replace("{name}", "concurrency")
            if path.startswith(f"{API}/limits/")
            else path.replace("{name}", "ten.t").replace("{tenant_id}", tenant))


@pytest.mark.parametrize("method, path", SETTINGS)
def test_a_platform_setting_is_changed_by_the_platform_operator_only(
        world: World, method: str, path: str) -> None:
    before = snapshot()
    for who in ("a", "b", "none"):
        for tenant in ("a", "b"):  # its own weight, another's
            answer = send(client_as(who), method, settings_url(path, tenant), path)
            assert (answer.status_code, answer.json()["code"]) == (403, "forbidden"), \
                (who, path, answer.content)
            assert "platform operator" in answer.json()["message"][0]
    assert snapshot() == before
    refused = AuditRecord.objects.filter(result=AuditRecord.Result.REFUSED)
    assert {record.tenant_id for record in refused} == {"a", "b", None}  # each audited
    done = send(client_as("platform"), method, settings_url(path, "a"), path)
    assert done.status_code == 200, (path, done.content)
    assert snapshot() != before


def test_a_flow_started_through_the_api_is_the_callers_tenants(world: World) -> None:
    start = f"{API}/job-flows/definitions/{DEFINED_FLOW}/start"
    for who, tenant in (("a", "a"), ("b", "b"), ("platform", None)):
        answer = client_as(who).post(start, {"input": 1}, content_type="application/json")
        assert answer.status_code == 200
        flow = Flow.objects.get(id=answer.json()["id"])
        assert flow.tenant_id == tenant
        assert {job.tenant_id for job in Job.objects.filter(
            id__in=flow.steps.values("job_id"))} == {tenant}
    before = snapshot()
    refused = client_as("none").post(start, {"input": 1}, content_type="application/json")
    assert (refused.status_code, refused.json()["code"]) == (403, "forbidden")
    assert snapshot() == before


# -- the admin, URL by URL from its registry ---------------------------------------------------


def engine_admins() -> dict[str, Any]:
    return {f"{model._meta.app_label}_{model._meta.model_name}": model_admin
            for model, model_admin in admin.site._registry.items()
            if model._meta.app_label in APPS}


def object_urls() -> list[tuple[str, str]]:
    """(model, route) of every admin URL that names one object."""
    return sorted((name, pattern.pattern._route)  # type: ignore[union-attr]  # RoutePattern
                  for name, model_admin in engine_admins().items()
                  for pattern in model_admin.get_urls()
                  if isinstance(pattern, URLPattern)
                  and "object_id" in getattr(pattern.pattern, "converters", {}))


# The object of each model a URL names (per action where it matters); a model whose pages
# name objects must be here, so a new one cannot escape the test.
def object_of(world: World, rows: Owned | None, model: str, route: str) -> Any:
    action = route.rstrip("/").rsplit("/", 1)[-1]
    if rows is None:
        return UNKNOWN_ID
    choices: dict[str, Any] = {
        "jobs_engine_job": {"skip": rows.dead, "cancel": rows.pending}.get(action, rows.job),
        "jobs_engine_completedjob": rows.completed,
        "jobs_engine_flow": rows.running_flow if action == "cancel" else rows.failed_flow,
        "jobs_engine_schedules_schedule": rows.schedule,
        "jobs_engine_auditrecord": rows.record,
        # The cluster's rows belong to no tenant: every tenant is refused them.
        "jobs_engine_partition": world.partition,
        "jobs_engine_worker": world.worker,
        "jobs_engine_targetpause": world.pause,
        # A target is the platform's: a tenant is refused its pause and resume.
        "jobs_engine_registeredtarget": RegisteredTarget(name=world.pause.target),
    }
    assert model in choices, f"{model}: add its objects to this test"
    return choices[model].pk


def admin_url(model: str, route: str, pk: Any) -> str:
    return reverse(f"admin:{model}_changelist") + route.replace("<path:object_id>", str(pk))


def outcome(client: Client, method: str, url: str) -> tuple[Any, ...]:
    """What a user sees of a request: each redirect, the last status and the messages."""
    response = (client.get if method == "GET" else client.post)(url, follow=True)
    shown = [str(message) for message in get_messages(response.wsgi_request)]
    if response.context and "messages" in response.context:
        shown += [str(message) for message in response.context["messages"]]
    return (tuple(response.redirect_chain), response.status_code, tuple(shown))


PLATFORM_PAGES = ("jobs_engine_partition", "jobs_engine_worker", "jobs_engine_targetpause")


@pytest.mark.parametrize("model, route", object_urls())
def test_an_admin_url_answers_another_tenants_object_as_an_unknown_one(
        world: World, model: str, route: str) -> None:
    as_b = client_as("b")
    before = snapshot()
    theirs_id = object_of(world, world.a, model, route)
    for method in ("GET", "POST"):
        theirs = outcome(as_b, method, admin_url(model, route, theirs_id))
        unknown = outcome(as_b, method, admin_url(model, route, UNKNOWN_ID))
        same_but_ids(repr(theirs), repr(unknown), (theirs_id, UNKNOWN_ID))
        assert theirs[1] in (200, 403, 404, 405), (method, theirs)
        if model in PLATFORM_PAGES:  # a tenant never sees the cluster's rows
            assert theirs[1] == 403 or theirs[0][-1][0] == reverse("admin:index"), theirs
        assert snapshot() == before, (method, model, route)
    # The owner opens it (the change page and the history).
    if route in ("<path:object_id>/change/", "<path:object_id>/history/"):
        owner = "platform" if model in PLATFORM_PAGES else "a"
        answer = client_as(owner).get(admin_url(model, route, theirs_id))
        assert answer.status_code == 200, (model, route)


def admin_actions() -> list[tuple[str, str]]:
    return sorted((name, action) for name, model_admin in engine_admins().items()
                  for action in (model_admin.actions or ()))


@pytest.mark.parametrize("model, action", admin_actions())
def test_an_admin_action_on_another_tenants_rows_changes_nothing(
        world: World, model: str, action: str) -> None:
    rows = [object_of(world, world.a, model, f"<path:object_id>/{verb}/")
            for verb in ("retry", "skip", "cancel")]
    url = reverse(f"admin:{model}_changelist")
    before = snapshot()
    data = {"action": action, "_selected_action": rows, "cron_override": "*/5 * * * *",
            "apply": "Set override"}
    answer = client_as("b").post(url, data)
    assert answer.status_code in (200, 302, 403)
    assert snapshot() == before
    if model not in PLATFORM_PAGES:  # the same action by the owner is done
        client_as("a").post(url, data)
        assert snapshot() != before, (model, action)


LIMITS_FORMS = {"override": {"target": LIMITED, "name": "concurrency", "slots": "5"},
                "clear": {"target": LIMITED, "name": "concurrency"},
                "weight": {"tenant_id": "a", "weight": "3"}}


def test_every_form_of_the_limits_page_is_covered_here() -> None:
    limits_admin = engine_admins()["jobs_engine_targetlimit"]
    forms = {pattern.name.removeprefix("jobs_engine_targetlimit_")
             for pattern in limits_admin.get_urls()} - {"changelist"}
    assert forms == set(LIMITS_FORMS)


@pytest.mark.parametrize("form", LIMITS_FORMS)
def test_a_form_of_the_limits_page_is_the_platform_operators(world: World, form: str) -> None:
    """A tenant's operator (one with every permission) posting a change anyway, its own
    tenant's weight included, is refused with a message, audited as refused, and nothing
    changes; the platform operator's is done."""
    LimitOverride.objects.create(target=LIMITED, name="concurrency", slots=1,
                                 updated_at=timezone.now())  # for the clear
    url = reverse(f"admin:jobs_engine_targetlimit_{form}")
    before = snapshot()
    for who in ("a", "b", "none"):
        answer = client_as(who).post(url, LIMITS_FORMS[form], follow=True)
        assert answer.status_code == 200
        shown = [str(message) for message in get_messages(answer.wsgi_request)]
        shown += [str(message) for message in answer.context["messages"]]
        assert any("Not done" in text and "platform operator" in text for text in shown), shown
    assert snapshot() == before
    assert AuditRecord.objects.filter(result=AuditRecord.Result.REFUSED).count() == 3
    client_as("platform").post(url, LIMITS_FORMS[form])
    assert snapshot() != before


@pytest.mark.parametrize("model", sorted(engine_admins()))
def test_an_admin_list_shows_the_callers_tenants_rows_only(world: World, model: str
                                                           ) -> None:
    url = reverse(f"admin:{model}_changelist")
    if model in PLATFORM_PAGES:
        for who in ("a", "b", "none"):
            assert client_as(who).get(url).status_code == 403
        assert client_as("platform").get(url).status_code == 200
        index = client_as("a").get(reverse("admin:index")).content.decode()
        assert url not in index  # not offered either
        return
    seen = {who: client_as(who).get(url) for who in ("a", "b", "none", "platform")}
    assert all(answer.status_code == 200 for answer in seen.values()), model
    if model == "jobs_engine_jobstat":  # the runs counted, summed over the chart's hours
        runs = {who: sum(hour["total"] for hour in answer.context["chart"])
                for who, answer in seen.items()}
        assert runs == {"a": 3, "b": 3, "none": 0, "platform": 9}
        return
    if model == "jobs_engine_registeredtarget":  # the jobs kept, counted per tenant
        kept = {who: {row["name"]: (row["done"], row["dead"]) for row in answer.context["rows"]}
                ["ten.t"] for who, answer in seen.items()}
        # Each tenant has 1 completed job and 2 DEAD ones of the target.
        assert kept == {"a": (1, 2), "b": (1, 2), "none": (0, 0), "platform": (3, 6)}
        # The pauses, and their buttons, are the platform operator's.
        pauses = {who: {row["name"]: row.get("pause") for row in answer.context["rows"]}
                  ["ten.t"] for who, answer in seen.items()}
        assert pauses == {"a": None, "b": None, "none": None,
                          "platform": pauses["platform"]} and pauses["platform"]
        for who in ("a", "b", "none"):
            assert "/pause/" not in seen[who].text and "/resume/" not in seen[who].text
        return
    if model == "jobs_engine_targetlimit":  # each tenant's keys and weight, and no form
        keys = {who: {(group["name"], key["tenant_id"]) for group in answer.context["limits"]
                      for key in group["keys"]} for who, answer in seen.items()}
        assert keys == {"a": {("concurrency/tenant", "a")}, "b": {("concurrency/tenant", "b")},
                        "none": set(),
                        "platform": {("concurrency", None), ("concurrency/tenant", "a"),
                                     ("concurrency/tenant", "b")}}
        weights = {who: [row.tenant_id for row in answer.context["weights"]]
                   for who, answer in seen.items()}
        assert weights == {"a": ["a"], "b": ["b"], "none": [], "platform": ["a", "b"]}
        for who in ("a", "b", "none"):
            assert 'name="slots"' not in seen[who].text
            assert 'id="set-weight"' not in seen[who].text
        assert 'name="slots"' in seen["platform"].text
        return
    listed = {who: {row.tenant_id for row in answer.context["cl"].result_list}
              for who, answer in seen.items()}
    assert listed == {"a": {"a"}, "b": {"b"}, "none": set(), "platform": {"a", "b", None}}, \
        model


# -- the rest of the URL conf --------------------------------------------------------------


def test_metrics_are_the_platform_operators(world: World) -> None:
    for who in ("a", "b", "none"):
        refused = client_as(who).get("/jobs/metrics")
        assert refused.status_code == 403 and b"platform operator" in refused.content
    assert client_as("platform").get("/jobs/metrics").status_code == 200


def test_the_api_docs_are_for_staff(world: World) -> None:
    """Not bound to a tenant (they describe the routes, not rows); closed to anonymous
    callers (test_api.py has the setting)."""
    for who in ("a", "none"):
        assert client_as(who).get(f"{API}/docs").status_code == 200
    assert Client().get(f"{API}/openapi.json").status_code == 302
