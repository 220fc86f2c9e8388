"""The admin's Job flows pages: list, a flow's steps, start, retry and cancel, each bound
to the user's tenant and permissions."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from jobs_engine import flows
from jobs_engine.flows import Step
from jobs_engine.models import Flow, FlowStep, Job
from jobs_engine.states import FlowState, StepState
from tests.db.conftest import BY_TENANT

pytestmark = pytest.mark.django_db

LIST = reverse("admin:jobs_engine_flow_changelist")
START = reverse("admin:jobs_engine_flow_start")


def page(flow_id: int) -> str:
    return reverse("admin:jobs_engine_flow_change", args=[flow_id])


def staff_with(*codenames: str, username: str) -> Client:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(
        codename__in=codenames, content_type__app_label="jobs_engine"))
    client = Client()
    client.force_login(User.objects.get(pk=user.pk))
    return client


@pytest.fixture
def viewer() -> Client:
    return staff_with("view_flow", username="viewer")


@pytest.fixture
def operator() -> Client:
    return staff_with("view_flow", "manage_flows", username="operator")



def failed_chain() -> int:
    flow_id = flows.chain("monthly-report", [Step("query"), Step("render"), Step("mail")])
    FlowStep.objects.filter(flow_id=flow_id, position=0).update(
        state=StepState.DONE, result={"rows": 3}, attempts=1)
    FlowStep.objects.filter(flow_id=flow_id, position=1).update(
        state=StepState.FAILED, attempts=3,
        last_error="RuntimeError: <render> broke (attempt 3 of 3)")
    Flow.objects.filter(id=flow_id).update(state=FlowState.FAILED, steps_done=1)
    return flow_id


def test_the_list_shows_state_and_progress(viewer: Client) -> None:
    failed_chain()
    body = viewer.get(LIST).content.decode()
    assert "monthly-report" in body and "FAILED" in body and "1/3" in body
    assert START not in body  # viewing is not managing


def test_a_flows_page_shows_its_steps_why_one_failed_and_the_step_jobs(viewer: Client
                                                                       ) -> None:
    flow_id = failed_chain()
    answer = viewer.get(page(flow_id))
    body = answer.content.decode()
    assert answer.status_code == 200
    assert 'data-step="1" data-state="FAILED"' in body
    # A step's result and error may hold what a payload holds: the job-text permission.
    assert "broke" not in body and "rows" not in body
    assert body.count("hidden: needs the jobs_engine.manage_jobs permission") == 3
    reader = staff_with("view_flow", "manage_jobs", username="reader").get(page(flow_id))
    shown = reader.content.decode()
    assert "RuntimeError: &lt;render&gt; broke (attempt 3 of 3)" in shown  # escaped
    assert "{&quot;rows&quot;: 3}" in shown and "hidden: needs" not in shown
    first_job = FlowStep.objects.get(flow_id=flow_id, position=0).job_id
    assert reverse("admin:jobs_engine_job_change", args=[first_job]) in body
    assert "Retry failed steps" not in body  # a viewer gets no button
    assert viewer.post(reverse("admin:jobs_engine_flow_retry", args=[flow_id])).status_code \
        == 403
    assert Flow.objects.get(id=flow_id).state == FlowState.FAILED


def test_retry_and_cancel_from_the_flows_page(operator: Client) -> None:
    flow_id = failed_chain()
    assert "Retry failed steps" in operator.get(page(flow_id)).content.decode()
    answer = operator.post(reverse("admin:jobs_engine_flow_retry", args=[flow_id]),
                           follow=True)
    assert "1 failed step(s) queued again" in answer.content.decode()
    assert Flow.objects.get(id=flow_id).state == FlowState.RUNNING
    again = operator.post(reverse("admin:jobs_engine_flow_retry", args=[flow_id]),
                          follow=True)
    assert "Not done: flow" in again.content.decode()  # nothing failed now: refused
    step = FlowStep.objects.get(flow_id=flow_id, position=1)
    Job.objects.filter(id=step.job_id).update(status="RUNNING", started_at=timezone.now())
    refused = operator.post(reverse("admin:jobs_engine_flow_cancel", args=[flow_id]),
                            follow=True)
    assert "is running" in refused.content.decode()
    assert Flow.objects.get(id=flow_id).state == FlowState.RUNNING
    Job.objects.filter(id=step.job_id).update(status="PENDING", started_at=None)
    done = operator.post(reverse("admin:jobs_engine_flow_cancel", args=[flow_id]),
                         follow=True)
    assert "cancelled: 2 step(s) dropped" in done.content.decode()
    assert Flow.objects.get(id=flow_id).state == FlowState.CANCELLED


def test_start_a_defined_flow_with_a_json_input(operator: Client, viewer: Client) -> None:
    flows.define("monthly-report", lambda month: flows.ChainSpec([Step("query", month)]),
                 "Build and mail the monthly report")
    try:
        assert viewer.get(START).status_code == 403
        form = operator.get(START).content.decode()
        assert "Build and mail the monthly report" in form
        bad = operator.post(START, {"definition": "monthly-report", "input": "{nope"},
                            follow=True)
        assert "Not started: input: not JSON" in bad.content.decode()
        assert not Flow.objects.exists()
        started = operator.post(START, {"definition": "monthly-report",
                                        "input": '"2026-11"'})
        flow = Flow.objects.get()
        assert started["Location"] == page(flow.id)
        assert (flow.definition, FlowStep.objects.get(flow=flow).data) == ("monthly-report",
                                                                          "2026-11")
    finally:
        flows._definitions.pop("monthly-report", None)


def test_another_tenants_flow_is_404_like_an_unknown_id(operator: Client,
                                                        settings: Any) -> None:
    settings.JOBS = {"TENANT_RESOLVER": BY_TENANT}
    theirs = flows.chain("theirs", [Step("a")], tenant_id="b")
    ours = flows.chain("ours", [Step("a")], tenant_id="a")
    as_a = {"HTTP_X_TENANT": "a"}
    assert operator.get(page(theirs), **as_a).status_code == 404
    assert operator.get(page(999999), **as_a).status_code == 404
    assert operator.get(page(ours), **as_a).status_code == 200
    listed = operator.get(LIST, **as_a).content.decode()
    assert "ours" in listed and "theirs" not in listed
    assert operator.post(reverse("admin:jobs_engine_flow_cancel", args=[theirs]),
                         **as_a).status_code == 404
    assert Flow.objects.get(id=theirs).state == FlowState.RUNNING


def test_managing_flows_includes_seeing_them() -> None:
    flows.chain("monthly-report", [Step("query")])
    acting = staff_with("manage_flows", username="acting")
    listed = acting.get(LIST)
    assert listed.status_code == 200 and "monthly-report" in listed.content.decode()
    assert LIST in acting.get(reverse("admin:index")).content.decode()


def test_a_start_refused_by_its_input_is_a_message_and_writes_nothing(operator: Client
                                                                     ) -> None:
    """An input nested past the decoder's depth, and a builder that fails on its input
    (a KeyError for a missing field), are refused with a message naming them."""
    flows.define("by-field", lambda value: flows.ChainSpec([Step("a", value["month"])]), "")
    try:
        deep = operator.post(START, {"definition": "by-field",
                                     "input": "[" * 100_000 + "]" * 100_000}, follow=True)
        assert deep.status_code == 200
        assert "Not started: input: not JSON (nested more than" in deep.content.decode()
        missing = operator.post(START, {"definition": "by-field", "input": '{"year": 1}'},
                                follow=True)
        assert missing.status_code == 200
        assert ("Not started: input: the builder of by-field refused it: KeyError: "
                "&#x27;month&#x27;") in missing.content.decode()
    finally:
        flows._definitions.pop("by-field", None)
    assert not Flow.objects.exists()


def test_start_retry_and_cancel_from_the_admin_are_audited(operator: Client) -> None:
    from jobs_engine.models import AuditRecord

    flows.define("monthly-report", lambda month: flows.ChainSpec([Step("query", month)]), "")
    try:
        operator.post(START, {"definition": "monthly-report", "input": '"2026-11"'})
    finally:
        flows._definitions.pop("monthly-report", None)
    failed = failed_chain()
    operator.post(reverse("admin:jobs_engine_flow_retry", args=[failed]))
    operator.post(reverse("admin:jobs_engine_flow_cancel", args=[failed]))
    assert list(AuditRecord.objects.order_by("id").values_list(
        "username", "action", "object_type", "result")) == [
        ("operator", "start", "flow_definition", "ok"), ("operator", "retry", "flow", "ok"),
        ("operator", "cancel", "flow", "ok")]
