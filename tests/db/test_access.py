"""Who sees and does what (docs/operations.md#access), on every admin page of the engine's
and the schedules' models and on every API route read from the OpenAPI schema, for three
users: anonymous, a staff user with Django's view permission on every one of those models
(a viewer), and a staff user with ``jobs_engine.manage_jobs`` (a manager).

Admin: anonymous → the login page; the viewer → 200 on lists and detail pages without the
private text (payload, headers, actor, last error, pause reason, a limit's key taken from a
payload: their secret marker is not in the HTML) and 403 on every action; the manager →
200 with the text, and the actions work. Every URL the engine's admins add is exercised
here or named with the file that does. API: anonymous → 401, the viewer → 403, the manager
→ 200; on every route a malformed id is 404 (and touches no row), an unknown query
parameter or body field is 400.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import URLPattern, resolve, reverse
from django.utils import timezone

from jobs_engine import flows
from jobs_engine.contrib.schedules.models import Schedule
from jobs_engine.limits import Concurrency, Rate, per_field
from jobs_engine.models import (
    AuditRecord,
    CompletedJob,
    Flow,
    Job,
    JobStatShard,
    LimitBucket,
    LimitOverride,
    Partition,
    TargetPause,
    TenantWeight,
    Worker,
)
from jobs_engine.operators.actions import audit
from jobs_engine.operators.api import api
from jobs_engine.states import FlowState, JobStatus, StepState
from tests.db.operator_helpers import make_job, manager, staff
from tests.db.schedule_helpers import declared_schedule, state

pytestmark = pytest.mark.django_db

SECRET = "s3cr3t-marker"  # in every private field; must never reach a viewer's HTML
HIDDEN_TEXT = "hidden: needs the jobs_engine.manage_jobs permission"  # what a viewer sees
API = "/jobs/api/v1"
USERS = ("anonymous", "viewer", "manager")


@dataclass
class Rows:
    """One real row of every model the admin shows, plus jobs for each job action."""

    job: Job  # DEAD, every private field holds SECRET
    dead: Job  # DEAD, for skip
    pending: Job  # for cancel
    completed: CompletedJob  # DONE, every private field (the result too) holds SECRET
    pause: TargetPause
    partition: Partition
    worker: Worker
    stat: JobStatShard
    record: AuditRecord
    schedule: Schedule
    failed_flow: Flow  # for a read and a retry
    running_flow: Flow  # for a cancel
    bucket: LimitBucket  # a key of a limit per payload field: it holds SECRET


LIMITED = "access.lim"  # limits: "concurrency" (overridden) and one per payload field
FIELD_LIMIT = "rate/payload.mail"


@pytest.fixture
def rows(targets: Any) -> Iterator[Rows]:
    targets("access.t")
    targets(LIMITED, lane="long",
            limits=[Concurrency(2), Rate(5, period_s=60, per=per_field("mail"))])
    now = timezone.now()
    bucket = LimitBucket.objects.create(target=LIMITED, name=FIELD_LIMIT,
                                        key=f"{SECRET}-key", used_at=now)
    LimitOverride.objects.create(target=LIMITED, name="concurrency", slots=4, updated_at=now)
    job = make_job("access.t", status=JobStatus.DEAD, payload={"mail": f"{SECRET}-payload"},
                   headers={"h": f"{SECRET}-headers"}, last_error=f"{SECRET}-error",
                   actor={"user": f"{SECRET}-actor"})
    dead = make_job("access.t", status=JobStatus.DEAD)
    pending = make_job("access.t")
    completed = CompletedJob.objects.create(
        id=pending.id + 1000, target="access.t", lane="fast", code="access.t",
        dedupe_key="access-done", delivery_mode="at_most_once",
        payload={"mail": f"{SECRET}-payload"}, headers={"h": f"{SECRET}-headers"},
        actor={"user": f"{SECRET}-actor"}, result={"r": f"{SECRET}-result"}, attempts=1,
        created_at=now, started_at=now, finished_at=now, duration_ms=3.0)
    pause = TargetPause.objects.create(target="access.t", reason=f"{SECRET}-reason",
                                       paused_until=now + timedelta(minutes=5), paused_at=now)
    partition = Partition.objects.create(partition=0, owner="w-1:1:a",
                                         lease_until=now + timedelta(seconds=30))
    worker = Worker.objects.create(worker_id="w-1:1:a", heartbeat_at=now, started_at=now,
                                   hostname="host", pid=1, lanes="fast")
    stat = JobStatShard.objects.create(hour=now.replace(minute=0, second=0, microsecond=0),
                                       target="access.t", outcome="ok", shard=0, count=3)
    record = audit(None, "retry", "job", job.id, ok=True)
    failed_flow = Flow.objects.get(id=flows.chain("access-failed", [flows.Step("a")]))
    failed_flow.steps.update(state=StepState.FAILED, last_error=f"{SECRET}-step-error")
    Flow.objects.filter(id=failed_flow.id).update(state=FlowState.FAILED)
    running_flow = Flow.objects.get(id=flows.chain("access-running", [flows.Step("a")]))
    flows.define(DEFINED_FLOW, lambda value: flows.ChainSpec([flows.Step("a", value)]), "")
    with declared_schedule("access_sched") as schedule:
        yield Rows(job, dead, pending, completed, pause, partition, worker, stat, record,
                   schedule, failed_flow, running_flow, bucket)
    flows._definitions.pop(DEFINED_FLOW, None)


def viewer() -> User:
    """Staff with Django's view permission on every model of both apps, nothing else."""
    user = staff("viewer")
    user.user_permissions.add(*Permission.objects.filter(
        codename__startswith="view_",
        content_type__app_label__in=["jobs_engine", "jobs_engine_schedules"]))
    return User.objects.get(pk=user.pk)


def client_of(kind: str) -> Client:
    """``anonymous``, ``viewer``, ``jobs-manager`` (jobs and schedules only) or ``manager``
    (the flows too)."""
    client = Client()
    if kind != "anonymous":
        client.force_login(viewer() if kind == "viewer" else
                           manager("jobs-manager") if kind == "jobs-manager" else
                           manager(flows=True))
    return client


# -- admin pages -----------------------------------------------------------------------------

MODELS: dict[str, Callable[[Rows], Any]] = {
    "jobs_engine_job": lambda r: r.job.pk,
    "jobs_engine_completedjob": lambda r: r.completed.pk,
    "jobs_engine_targetpause": lambda r: r.pause.pk,
    "jobs_engine_partition": lambda r: r.partition.pk,
    "jobs_engine_worker": lambda r: r.worker.pk,
    "jobs_engine_auditrecord": lambda r: r.record.pk,
    "jobs_engine_schedules_schedule": lambda r: r.schedule.pk,
}
# Where a manager finds the private text.
SHOWN = {("jobs_engine_job", "change"): ["payload", "headers", "actor", "error"],
         ("jobs_engine_completedjob", "change"): ["payload", "headers", "actor", "result"],
         ("jobs_engine_targetpause", "changelist"): ["reason"],
         ("jobs_engine_targetpause", "change"): ["reason"],
         ("jobs_engine_targetlimit", "changelist"): ["key"]}
PAGES = [(model, page) for model in MODELS for page in ("changelist", "change", "history")]
# One page each: the registry's targets, the statistics summed over their buckets, and the
# limits of the registry's targets with their buckets.
PAGES += [("jobs_engine_registeredtarget", "changelist"), ("jobs_engine_jobstat", "changelist"),
          ("jobs_engine_targetlimit", "changelist")]


def page_url(rows: Rows, model: str, page: str) -> str:
    if page == "changelist":
        return reverse(f"admin:{model}_changelist")
    return reverse(f"admin:{model}_{page}", args=[MODELS[model](rows)])


@pytest.mark.parametrize("model, page", [*PAGES, ("jobs_engine_jobstat", "statistics")])
def test_admin_page(rows: Rows, model: str, page: str) -> None:
    url = (reverse("admin:jobs_engine_jobstat_changelist") + "?target=access.t"
           if page == "statistics" else page_url(rows, model, page))

    anonymous = client_of("anonymous").get(url)
    assert anonymous.status_code == 302 and "/admin/login/" in anonymous["Location"]

    viewer_client = client_of("viewer")
    seen = viewer_client.get(url)
    assert seen.status_code == 200, (url, seen.status_code)
    assert SECRET not in seen.content.decode(), url
    if (model, page) in SHOWN:
        assert HIDDEN_TEXT in seen.content.decode()
    if page == "changelist":  # and the admin's index links to the page
        index = viewer_client.get(reverse("admin:index")).content.decode()
        assert url in index

    managed = client_of("manager").get(url)
    assert managed.status_code == 200, url
    content = managed.content.decode()
    for what in SHOWN.get((model, page), []):
        assert f"{SECRET}-{what}" in content, (url, what)
    assert HIDDEN_TEXT not in content


@pytest.mark.parametrize("lookup", ["payload__mail", "payload__mail__startswith",
                                    "headers__h", "actor__user", "last_error__startswith",
                                    "last_error"])
def test_a_viewer_cannot_filter_the_jobs_on_private_text(rows: Rows, lookup: str) -> None:
    """A filter that matches or not would tell the viewer what the text holds."""
    url = reverse("admin:jobs_engine_job_changelist")
    value = f"{SECRET}-payload" if lookup.startswith("payload") else SECRET
    seen = client_of("viewer")
    assert seen.get(url, {lookup: value}).status_code == 400
    assert client_of("manager").get(url, {lookup: value}).status_code == 200
    pauses = reverse("admin:jobs_engine_targetpause_changelist")
    assert seen.get(pauses, {"reason__startswith": "s"}).status_code == 400


Action = Callable[[Rows], tuple[str, dict[str, Any], str, str]]


def _job_button(action: str) -> Action:
    """(url, data, the page that offers it to a manager, the text that offers it)."""
    def make(rows: Rows) -> tuple[str, dict[str, Any], str, str]:
        job = rows.pending if action == "cancel" else rows.job
        url = reverse(f"admin:jobs_engine_job_{action}", args=[job.pk])
        return url, {}, reverse("admin:jobs_engine_job_change", args=[job.pk]), url
    return make


def _form(url_name: str, page: str, args: list[Any] | None = None, **data: Any) -> Action:
    """A form of a page that is no list of rows (a limit's override, a tenant's weight, a
    target's pause): offered as a form posting to its URL."""
    def make(rows: Rows) -> tuple[str, dict[str, Any], str, str]:
        url = reverse(f"admin:{url_name}", args=args)
        return url, data, reverse(f"admin:{page}_changelist"), f'action="{url}"'
    return make


def _bulk(model: str, action: str, **extra: Any) -> Action:
    def make(rows: Rows) -> tuple[str, dict[str, Any], str, str]:
        selected = {"jobs_engine_job": [rows.job.pk, rows.dead.pk, rows.pending.pk],
                    "jobs_engine_targetpause": [rows.pause.pk],
                    "jobs_engine_schedules_schedule": [rows.schedule.pk]}[model]
        url = reverse(f"admin:{model}_changelist")
        data = {"action": action, "_selected_action": selected, **extra}
        return url, data, url, f'value="{action}"'
    return make


ACTIONS = {
    "job retry button": _job_button("retry"),
    "job skip button": _job_button("skip"),
    "job cancel button": _job_button("cancel"),
    "job bulk retry": _bulk("jobs_engine_job", "retry_selected"),
    "job bulk skip": _bulk("jobs_engine_job", "skip_selected"),
    "job bulk cancel": _bulk("jobs_engine_job", "cancel_selected"),
    "resume": _bulk("jobs_engine_targetpause", "resume_selected"),
    "schedule enable": _bulk("jobs_engine_schedules_schedule", "enable_selected"),
    "schedule disable": _bulk("jobs_engine_schedules_schedule", "disable_selected"),
    "schedule set override form": _bulk("jobs_engine_schedules_schedule", "set_override"),
    "schedule set override": _bulk("jobs_engine_schedules_schedule", "set_override",
                                   cron_override="*/5 * * * *", apply="Set override"),
    "schedule clear override": _bulk("jobs_engine_schedules_schedule", "clear_override"),
    "schedule run now": _bulk("jobs_engine_schedules_schedule", "run_now_selected"),
    "limit override": _form("jobs_engine_targetlimit_override", "jobs_engine_targetlimit",
                            target=LIMITED, name="concurrency", slots="3"),
    "limit clear override": _form("jobs_engine_targetlimit_clear", "jobs_engine_targetlimit",
                                  target=LIMITED, name="concurrency"),
    "tenant weight": _form("jobs_engine_targetlimit_weight", "jobs_engine_targetlimit",
                           tenant_id="acme", weight="3"),
    "target pause by hand": _form("jobs_engine_registeredtarget_pause",
                                  "jobs_engine_registeredtarget", ["access.t"]),
    "target resume": _form("jobs_engine_registeredtarget_resume",
                           "jobs_engine_registeredtarget", ["access.t"]),
    "job change form": lambda rows: (page_url(rows, "jobs_engine_job", "change"),
                                     {"status": "PENDING", "payload": "{}"},
                                     page_url(rows, "jobs_engine_job", "change"), "_save"),
}


def snapshot(rows: Rows) -> tuple[Any, ...]:
    return (sorted(Job.objects.values_list("id", "status", "attempts")),
            sorted(TargetPause.objects.values_list("target", "paused_until", "reason")),
            state(rows.schedule.code), sorted(Flow.objects.values_list("id", "state")),
            sorted(LimitOverride.objects.values_list("target", "name", "slots", "starts",
                                                     "period_s", "burst")),
            sorted(TenantWeight.objects.values_list("tenant_id", "weight")),
            AuditRecord.objects.count())  # last: the admin actions' test reads it


@pytest.mark.parametrize("action", ACTIONS)
def test_admin_action(rows: Rows, action: str) -> None:
    url, data, page, offer = ACTIONS[action](rows)
    before = snapshot(rows)

    anonymous = client_of("anonymous").post(url, data)
    assert anonymous.status_code == 302 and "/admin/login/" in anonymous["Location"]
    viewer_client = client_of("viewer")
    assert offer not in viewer_client.get(page).content.decode()  # not offered
    assert viewer_client.post(url, data).status_code == 403  # nor accepted
    assert snapshot(rows) == before  # nothing done, nothing audited

    manager_client = client_of("manager")
    if action != "job change form":
        assert offer in manager_client.get(page).content.decode()
    response = manager_client.post(url, data)
    if action == "job change form":  # nobody edits a row in place
        assert response.status_code == 403 and snapshot(rows) == before
    elif action == "schedule set override form":
        assert response.status_code == 200 and 'name="cron_override"' in response.text
    else:
        assert response.status_code == 302, action
        assert AuditRecord.objects.count() > before[-1], action  # done (or refused), audited
        if action in FORMS_DONE:  # and done: the change is in the tables
            assert snapshot(rows) != before and AuditRecord.objects.latest("id").result == "ok"


FORMS_DONE = {"limit override", "limit clear override", "tenant weight",
              "target pause by hand", "target resume"}


def engine_admins() -> dict[str, Any]:
    return {f"{model._meta.app_label}_{model._meta.model_name}": model_admin
            for model, model_admin in admin.site._registry.items()
            if model._meta.app_label in ("jobs_engine", "jobs_engine_schedules")}


DJANGOS_OWN = ("add", "delete")  # refused on every engine page (nothing is added or deleted)
# URLs of the engine's admins exercised by another file, with its name.
ELSEWHERE = {"jobs_engine_flow_changelist": "test_flows_admin.py",
             "jobs_engine_flow_change": "test_flows_admin.py",
             "jobs_engine_flow_history": "test_flows_admin.py",
             "jobs_engine_flow_start": "test_flows_admin.py",
             "jobs_engine_flow_retry": "test_flows_admin.py",
             "jobs_engine_flow_cancel": "test_flows_admin.py"}


def test_every_url_of_the_engines_admins_is_exercised(rows: Rows) -> None:
    """A page or action the admins add is in ``PAGES`` or ``ACTIONS`` above (or named in
    ``ELSEWHERE``): a new URL that this file cannot exercise fails here."""
    names = {pattern.name for model_admin in engine_admins().values()
             for pattern in model_admin.get_urls()
             if isinstance(pattern, URLPattern) and pattern.name}
    exercised = {f"{model}_{page}" for model, page in PAGES}
    exercised |= {resolve(make(rows)[0]).url_name for make in ACTIONS.values()}
    left = {name for name in names - exercised - ELSEWHERE.keys()
            if not name.endswith(tuple(f"_{own}" for own in DJANGOS_OWN))}
    assert not left, f"exercise these admin URLs in this file: {sorted(left)}"


# -- API routes ------------------------------------------------------------------------------


def routes() -> list[tuple[str, str]]:
    """Every (method, path) of the OpenAPI schema (the one ``openapi.json`` serves): a new
    route is covered without asking."""
    paths = api.get_openapi_schema()["paths"]
    return sorted((method.upper(), path) for path, methods in paths.items()
                  for method in methods)


ROUTES = routes()
BODIES = {("PUT", f"{API}/schedules/{{code}}/cron_override"): {"cron_override": "*/5 * * * *"},
          ("POST", f"{API}/job-flows/definitions/{{name}}/start"): {"input": 1},
          ("PUT", f"{API}/limits/{{target}}/{{name}}"): {"slots": 3},
          ("PUT", f"{API}/tenant-weights/{{tenant_id}}"): {"weight": 3}}
DEFINED_FLOW = "access-defined"


def fill(rows: Rows, method: str, path: str, row_id: str | None = None) -> str:
    """The path with real rows: the DEAD job for a retry or a read, another DEAD one for a
    skip, the PENDING one for a cancel; the FAILED flow for a read or a retry, the running
    one for a cancel. ``row_id`` spells the job's or flow's id instead."""
    action = path.rsplit("/", 1)[-1]
    job = {"skip": rows.dead, "cancel": rows.pending}.get(action, rows.job)
    flow = rows.running_flow if action == "cancel" else rows.failed_flow
    if path.startswith(f"{API}/limits/"):  # the limit of slots, overridden
        return path.replace("{target}", LIMITED).replace("{name}", "concurrency")
    if path.startswith(f"{API}/targets/"):  # the target paused (by the breaker)
        return path.replace("{name}", rows.pause.target)
    return (path.replace("{job_id}", row_id or str(job.pk))
            .replace("{flow_id}", row_id or str(flow.pk))
            .replace("{code}", rows.schedule.code).replace("{name}", DEFINED_FLOW)
            .replace("{tenant_id}", "acme"))


def refused(method: str, path: str) -> tuple[str, str]:
    """Who is refused a route (403), and the permission the refusal names: the flows'
    routes need their own permissions, a read only ``view_flow``."""
    if "/job-flows" not in path:
        return "viewer", "jobs_engine.manage_jobs"
    if method == "GET":
        return "jobs-manager", "jobs_engine.view_flow"
    return "viewer", "jobs_engine.manage_flows"


def send(client: Client, method: str, url: str, body: Any = None, *,
         raw: str | None = None, content_type: str = "application/json") -> Any:
    data = raw if raw is not None else ("" if body is None else json.dumps(body))
    return client.generic(method, url, data, content_type=content_type)


def assert_error(response: Any, status_code: int, code: str) -> list[str]:
    assert response.status_code == status_code, (response.status_code, response.content)
    body = response.json()
    assert (body["status_code"], body["code"]) == (status_code, code), body
    return body["message"]


def near_misses(job_id: int) -> list[str]:
    """Spellings of ``job_id`` that int() or pydantic would read as that row (or another
    one), and ids no row can have."""
    digits = str(job_id)
    grouped = f"{job_id // 10}_{job_id % 10}" if job_id >= 10 else f"0_{job_id}"
    return [f"{digits}.0", f"+{digits}", f"%20{digits}", f"{digits}%20", f"{digits}%0A",
            f"0{digits}", f"{digits}e0", grouped, "%D9%A1", "0", "-1", str(2**63),
            "9" * 30, "abc", "%00"]


@pytest.mark.parametrize("method, path", ROUTES)
def test_api_route(rows: Rows, method: str, path: str) -> None:
    url = fill(rows, method, path)
    body = BODIES.get((method, path))
    before = snapshot(rows)

    assert_error(send(client_of("anonymous"), method, url, body), 401, "unauthorized")
    outsider, permission = refused(method, path)
    [message] = assert_error(send(client_of(outsider), method, url, body), 403, "forbidden")
    assert permission in message
    assert snapshot(rows) == before

    client = client_of("manager")
    # Input the route does not use: refused, naming it, and nothing done.
    messages = assert_error(send(client, method, f"{url}?force=1", body), 400,
                            "validation_error")
    assert any("query.force" in m for m in messages), messages
    messages = assert_error(send(client, method, url, {**(body or {}), "reason": "x"}), 400,
                            "validation_error")
    assert any("reason" in m and "unknown field" in m for m in messages), messages
    if "{job_id}" in path or "{flow_id}" in path:
        for spelling in near_misses(rows.job.pk):
            malformed = fill(rows, method, path, spelling)
            assert_error(send(client, method, malformed, body), 404, "not_found")
    assert snapshot(rows) == before

    response = send(client, method, url, body)
    assert response.status_code == 200, (method, url, response.content)


BAD_BODIES = [("not json", "application/json"), ("[]", "application/json"),
              ("null", "application/json"), ("1", "application/json"),
              ('{"job_id": 1}', "application/json"), ("a=1", "application/x-www-form-urlencoded"),
              ("retry", "text/plain")]


@pytest.mark.parametrize("method, path", [r for r in ROUTES if r not in BODIES])
def test_a_route_without_a_body_refuses_one(rows: Rows, method: str, path: str) -> None:
    """A client that sends fields it believes are used must learn that they are not; an
    empty body, an empty form and ``{}`` are no fields."""
    url = fill(rows, method, path)
    client = client_of("manager")
    before = snapshot(rows)
    for raw, content_type in BAD_BODIES:
        response = send(client, method, url, raw=raw, content_type=content_type)
        assert_error(response, 400, "validation_error")
    assert snapshot(rows) == before
    for raw, content_type in [("{}", "application/json"), ("", "application/json"),
                              (" \n", "text/plain"), ("", "application/x-www-form-urlencoded")]:
        response = send(client, method, url, raw=raw, content_type=content_type)
        assert response.status_code in (200, 404, 409), (raw, response.content)
