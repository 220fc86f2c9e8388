"""The flows' API routes: permissions, tenancy, and each route's answers."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from jobs_engine import flows
from jobs_engine.errors import FlowStepJob
from jobs_engine.flows import Step
from jobs_engine.models import Flow, FlowStep, Job
from jobs_engine.operators.actions import cancel_job
from jobs_engine.states import FlowState, StepState
from tests.db.conftest import AS_PLATFORM, BY_TENANT

pytestmark = pytest.mark.django_db

API = "/jobs/api/v1/job-flows"


def user_with(*codenames: str, username: str = "ops") -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(codename=codename,
                                                         content_type__app_label="jobs_engine"))
    return User.objects.get(pk=user.pk)


def client_of(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def viewer() -> Client:
    return client_of(user_with("view_flow", username="viewer"))


@pytest.fixture
def manager() -> Client:
    return client_of(user_with("view_flow", "manage_flows", username="flows-manager"))



@pytest.mark.parametrize(("method", "path"), [
    ("get", ""), ("get", "/definitions"), ("get", "/1"),
    ("post", "/1/retry"), ("post", "/1/cancel"), ("post", "/definitions/x/start")])
def test_anonymous_is_401_and_a_user_without_the_permission_403(method: str, path: str) -> None:
    assert getattr(Client(), method)(API + path).status_code == 401
    jobs_only = client_of(user_with("manage_jobs"))
    answer = getattr(jobs_only, method)(API + path)
    assert answer.status_code == 403
    assert answer.json()["code"] == "forbidden"


def test_viewing_is_not_managing(viewer: Client) -> None:
    flow_id = flows.chain("c", [Step("a")])
    assert viewer.get(f"{API}/{flow_id}").status_code == 200
    refused = viewer.post(f"{API}/{flow_id}/cancel")
    assert refused.status_code == 403
    assert "jobs_engine.manage_flows" in refused.json()["message"][0]
    assert Flow.objects.get(id=flow_id).state == FlowState.RUNNING


def test_list_and_detail_show_state_progress_and_steps(viewer: Client) -> None:
    first = flows.chain("report", [Step("a", {"n": 1}), Step("b")])
    flows.batch("import", [Step("j")], on_complete=Step("s"))
    FlowStep.objects.filter(flow_id=first, position=0).update(state=StepState.DONE,
                                                               result={"rows": 3})
    Flow.objects.filter(id=first).update(steps_done=1)
    page = viewer.get(API).json()
    assert page["total"] == 2
    assert [(f["name"], f["progress"]) for f in page["data"]] == [("import", "0/2"),
                                                                   ("report", "1/2")]
    assert [f["name"] for f in viewer.get(API, {"name": "report"}).json()["data"]] == ["report"]
    assert viewer.get(API, {"state": "FAILED"}).json()["total"] == 0
    assert viewer.get(API, {"state": "nope"}).status_code == 400
    detail = viewer.get(f"{API}/{first}").json()
    # A step's result and error may hold what a payload holds: the job-text permission.
    assert detail["text_hidden"] is True
    assert [(s["name"], s["state"], s["result"], s["last_error"]) for s in detail["steps"]] \
        == [("a", "DONE", None, None), ("b", "WAITING", None, None)]
    reader = client_of(user_with("view_flow", "manage_jobs", username="reader"))
    detail = reader.get(f"{API}/{first}").json()
    assert detail["text_hidden"] is False
    assert [(s["name"], s["state"], s["result"]) for s in detail["steps"]] == [
        ("a", "DONE", {"rows": 3}), ("b", "WAITING", None)]


def test_definitions_and_start(manager: Client, monthly: Any) -> None:
    assert manager.get(f"{API}/definitions").json() == [
        {"name": "monthly-report", "description": "Build and mail the monthly report"}]
    started = manager.post(f"{API}/definitions/monthly-report/start",
                           {"input": "2026-11"}, content_type="application/json")
    assert started.status_code == 200
    body = started.json()
    assert (body["name"], body["state"], body["progress"]) == ("monthly-report", "RUNNING", "0/2")
    refused = manager.post(f"{API}/definitions/monthly-report/start", {"input": 11},
                           content_type="application/json")
    assert refused.status_code == 400
    assert refused.json()["message"] == ["input: must be a month such as '2026-11'"]
    unknown = manager.post(f"{API}/definitions/nope/start", {"input": 1},
                           content_type="application/json")
    assert unknown.status_code == 404
    extra = manager.post(f"{API}/definitions/monthly-report/start", {"inptu": 1},
                         content_type="application/json")
    assert extra.status_code == 400
    assert Flow.objects.count() == 1


def test_retry_with_nothing_failed_and_cancel_while_running_are_409(manager: Client) -> None:
    from django.utils import timezone

    flow_id = flows.chain("c", [Step("a"), Step("b")])
    nothing = manager.post(f"{API}/{flow_id}/retry")
    assert (nothing.status_code, nothing.json()["code"]) == (409, "nothing_to_retry")
    first = FlowStep.objects.get(flow_id=flow_id, position=0)
    Job.objects.filter(id=first.job_id).update(status="RUNNING", started_at=timezone.now())
    running = manager.post(f"{API}/{flow_id}/cancel")
    assert (running.status_code, running.json()["code"]) == (409, "flow_running")
    assert Flow.objects.get(id=flow_id).state == FlowState.RUNNING
    Job.objects.filter(id=first.job_id).update(status="PENDING", started_at=None)
    cancelled = manager.post(f"{API}/{flow_id}/cancel")
    assert cancelled.json() == {"id": flow_id, "state": "CANCELLED", "steps": 2}


def test_another_tenants_flow_answers_404_like_an_unknown_id(manager: Client,
                                                            settings: Any) -> None:
    settings.JOBS = {"TENANT_RESOLVER": BY_TENANT}
    theirs = flows.chain("c", [Step("a")], tenant_id="b")
    ours = flows.chain("c", [Step("a")], tenant_id="a")
    as_a = {"HTTP_X_TENANT": "a"}
    assert manager.get(f"{API}/{theirs}", **as_a).status_code == 404
    assert manager.get(f"{API}/{theirs}", **as_a).json() == \
        manager.get(f"{API}/999999", **as_a).json() | {"message": [f"flow {theirs} does not exist"]}
    assert manager.post(f"{API}/{theirs}/cancel", **as_a).status_code == 404
    assert [f["id"] for f in manager.get(API, **as_a).json()["data"]] == [ours]
    assert Flow.objects.get(id=theirs).state == FlowState.RUNNING
    # The platform operator sees both; a request of no tenant sees neither.
    assert manager.get(API, **AS_PLATFORM).json()["total"] == 2
    assert manager.get(API).json()["total"] == 0
    assert manager.get(f"{API}/{ours}").status_code == 404


def test_managing_flows_includes_seeing_them() -> None:
    """A user who may start, retry and cancel flows may list what it acts on."""
    flow_id = flows.chain("c", [Step("a")])
    acting = client_of(user_with("manage_flows", username="acting"))
    assert acting.get(API).json()["total"] == 1
    assert acting.get(f"{API}/{flow_id}").status_code == 200
    assert acting.get(f"{API}/definitions").status_code == 200


def test_every_flow_action_leaves_an_audit_record(manager: Client, monthly: Any) -> None:
    from jobs_engine.models import AuditRecord

    started = manager.post(f"{API}/definitions/monthly-report/start", {"input": "2026-11"},
                           content_type="application/json").json()["id"]
    refused = manager.post(f"{API}/definitions/monthly-report/start", {"input": 11},
                           content_type="application/json")
    assert refused.status_code == 400
    first = FlowStep.objects.get(flow_id=started, position=0)
    Job.objects.filter(id=first.job_id).update(status="DEAD")
    FlowStep.objects.filter(id=first.id).update(state=StepState.FAILED, last_error="x")
    Flow.objects.filter(id=started).update(state=FlowState.FAILED)
    assert manager.post(f"{API}/{started}/retry").status_code == 200
    assert manager.post(f"{API}/{started}/cancel").status_code == 200
    assert manager.post(f"{API}/{started}/cancel").status_code == 409
    records = list(AuditRecord.objects.order_by("id").values_list(
        "username", "action", "object_type", "object_id", "result", "message"))
    assert records == [
        ("flows-manager", "start", "flow_definition", "monthly-report", "ok",
         f"flow {started} started"),
        ("flows-manager", "start", "flow_definition", "monthly-report", "refused",
         "input: must be a month such as '2026-11'"),
        ("flows-manager", "retry", "flow", str(started), "ok",
         f"1 failed step(s) queued again; DEAD job(s) replaced: {first.job_id}"),
        ("flows-manager", "cancel", "flow", str(started), "ok", "2 step(s) dropped"),
        ("flows-manager", "cancel", "flow", str(started), "refused",
         f"flow {started} is CANCELLED: nothing to cancel")]


def test_a_form_sent_to_a_route_that_takes_json_is_415_and_writes_nothing(
        manager: Client, monthly: Any) -> None:
    from jobs_engine.models import AuditRecord

    start = f"{API}/definitions/monthly-report/start"
    strict = Client(enforce_csrf_checks=True)  # its middleware reads a form first
    strict.force_login(User.objects.get(username="flows-manager"))
    strict.get("/jobs/api/v1/docs")  # the csrftoken cookie
    token = strict.cookies["csrftoken"].value
    for client, headers in ((manager, {}), (strict, {"X-CSRFToken": token})):
        for data in ({"input": "2026-11", "file": io.BytesIO(b"x")},  # multipart
                     {"csrfmiddlewaretoken": token, "input": "2026-11"}):
            form = client.post(start, data, headers=headers)
            assert (form.status_code, form.json()["code"]) == (415, "unsupported_media_type")
        urlencoded = client.post(start, "input=2026-11", headers=headers,
                                 content_type="application/x-www-form-urlencoded")
        assert urlencoded.status_code == 415
    assert not Flow.objects.exists() and not AuditRecord.objects.exists()


def test_a_builder_that_fails_on_its_input_is_a_400_naming_the_flow(manager: Client) -> None:
    flows.define("by-field", lambda value: flows.ChainSpec([Step("a", value["month"])]), "")
    try:
        for value in ({"year": 2026}, "2026-11", None):
            refused = manager.post(f"{API}/definitions/by-field/start", {"input": value},
                                   content_type="application/json")
            assert refused.status_code == 400, refused.content
            [message] = refused.json()["message"]
            assert message.startswith("input: the builder of by-field refused it: ")
        deep = "[" * 20_000 + "]" * 20_000  # past the decoder's depth, inside the size
        nested = manager.post(f"{API}/definitions/by-field/start", '{"input": ' + deep + "}",
                              content_type="application/json")
        assert nested.status_code == 400
    finally:
        flows._definitions.pop("by-field", None)
    assert not Flow.objects.exists()


def test_a_job_action_on_a_flow_step_is_refused_naming_the_flow(manager: Client) -> None:
    """Cancelling a step's job alone left its flow RUNNING for ever, and the flow's retry
    found nothing to retry; the flow's own actions act on both."""
    jobs_manager = client_of(user_with("manage_jobs", username="jobs"))
    flow_id = flows.chain("c", [Step("a"), Step("b")])
    step = FlowStep.objects.get(flow_id=flow_id, position=0)
    for action in ("cancel", "retry", "skip"):
        refused = jobs_manager.post(f"/jobs/api/v1/jobs/{step.job_id}/{action}")
        assert (refused.status_code, refused.json()["code"]) == (409, "flow_step")
        assert refused.json()["message"] == [
            f"job {step.job_id} runs step 0 of flow {flow_id}; retry or cancel the flow "
            "instead"]
    with pytest.raises(FlowStepJob):
        cancel_job(step.job_id, None)
    assert Job.objects.filter(id=step.job_id, status="PENDING").exists()
    assert Flow.objects.get(id=flow_id).state == FlowState.RUNNING
    assert manager.post(f"{API}/{flow_id}/cancel").json()["state"] == "CANCELLED"
