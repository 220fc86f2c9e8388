"""The operators' admin in a real browser (docs/operations.md#access): headless Chromium
against the live server on PostgreSQL. A manager logs in through the login form, filters the
jobs by status DEAD, retries one and sees it PENDING, disables a schedule and sees it marked
disabled; each step leaves a screenshot under ``test-artifacts/browser/<test>/``.

The second test renders the jobs list over the demo data (``enqueue_demo`` plus a few DEAD
rows); its screenshot is ``docs/admin-jobs.png``, shown in ``docs/operators.md``.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from playwright.sync_api import Page, expect

from examples.targets import EVENT_LOG, REPORT
from jobs_engine.contrib.schedules.models import Schedule
from jobs_engine.models import AuditRecord, Job
from jobs_engine.states import JobStatus
from tests.db.operator_helpers import make_job, manager
from tests.db.schedule_helpers import declared_schedule

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "pw"  # what tests.db.operator_helpers.manager() sets


def log_in(page: Page, base: str, username: str, shot: Callable[..., Path]) -> None:
    """Through the admin's own login form, as a person would."""
    page.goto(f"{base}/admin/")
    expect(page).to_have_url(re.compile(r"/admin/login/\?next=/admin/$"))
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    shot("01-login-form")
    page.click("input[type=submit]")
    expect(page.locator("#site-name")).to_be_visible()
    expect(page.locator("#user-tools")).to_contain_text(username)
    # The engine's pages are on the index for a manager.
    expect(page.locator("a", has_text="Jobs").first).to_be_visible()
    expect(page.locator("a", has_text="Schedules").first).to_be_visible()
    shot("02-logged-in")


def listed_ids(page: Page, rows: int) -> list[int]:
    """The job ids in the change list, top to bottom, once it shows ``rows`` rows."""
    links = page.locator("#result_list tbody th.field-id a")
    expect(links).to_have_count(rows)
    return [int(text) for text in links.all_inner_texts()]


def test_manager_retries_a_dead_job_and_disables_a_schedule(
        live_server: Any, page: Page, shot: Callable[..., Path], targets: Any) -> None:
    targets("e2e.orders")
    user = manager("operator")
    dead = [make_job("e2e.orders", status=JobStatus.DEAD, key=f"order-{n}") for n in (1, 2)]
    pending = make_job("e2e.orders", key="order-3")
    base = live_server.url

    with declared_schedule("e2e_nightly") as schedule:
        log_in(page, base, user.username, shot)

        # -- the jobs list, filtered by status DEAD through the sidebar -------------------
        page.click("a[href$='/admin/jobs_engine/job/']")
        assert listed_ids(page, 3) == [pending.id, dead[1].id, dead[0].id]
        page.locator("#changelist-filter a[href='?status=DEAD']").click()
        expect(page).to_have_url(re.compile(r"\?status=DEAD$"))
        assert listed_ids(page, 2) == [dead[1].id, dead[0].id]
        expect(page.locator("#result_list tbody td.field-status")).to_have_text(
            ["Dead", "Dead"])
        shot("03-jobs-filtered-dead", full_page=True)

        # -- retry one from its page: it is PENDING again ---------------------------------
        page.click(f"#result_list a[href*='/admin/jobs_engine/job/{dead[0].id}/change/']")
        expect(page.locator(".field-status .readonly")).to_have_text("Dead")
        expect(page.locator(".field-last_error_text")).to_contain_text("RuntimeError: boom")
        page.click("button[name=retry]")
        expect(page.locator(".messagelist .success")).to_have_text(
            f"Job {dead[0].id} is PENDING again, due now.")
        expect(page.locator(".field-status .readonly")).to_have_text("Pending")
        expect(page.locator(".field-attempts .readonly")).to_have_text("0")
        shot("04-job-retried-pending", full_page=True)
        assert Job.objects.get(id=dead[0].id).status == JobStatus.PENDING

        # Back on the DEAD filter only the other row is left.
        page.goto(f"{base}/admin/jobs_engine/job/?status=DEAD")
        assert listed_ids(page, 1) == [dead[1].id]

        # -- disable the schedule with the list action ------------------------------------
        page.goto(f"{base}/admin/jobs_engine_schedules/schedule/")
        row = page.locator("#result_list tbody tr", has_text=schedule.code)
        expect(row.locator("td.field-enabled img")).to_have_attribute("alt", "True")
        expect(row.locator("td.field-timezone")).to_have_text("Europe/Berlin")
        expect(row.locator("td.field-next_run")).to_contain_text(re.compile(r"CES?T"))
        row.locator("input.action-select").check()
        page.select_option("select[name=action]", "disable_selected")
        shot("05-schedule-action-chosen")
        page.click("button[name=index]")
        expect(page.locator(".messagelist .success")).to_have_text(
            f"Disabled 1 schedule(s): {schedule.code}.")
        row = page.locator("#result_list tbody tr", has_text=schedule.code)
        expect(row.locator("td.field-enabled img")).to_have_attribute("alt", "False")
        shot("06-schedule-disabled", full_page=True)
        assert Schedule.objects.get(code=schedule.code).enabled is False

    assert Job.objects.get(id=dead[1].id).status == JobStatus.DEAD
    assert [(r.username, r.action, r.object_id, r.result)
            for r in AuditRecord.objects.order_by("id")] == [
        ("operator", "retry", str(dead[0].id), "ok"),
        ("operator", "disable", schedule.code, "ok")]


def test_jobs_list_over_the_demo_data(live_server: Any, page: Page,
                                      shot: Callable[..., Path]) -> None:
    """The screenshot docs/operators.md shows (copied to ``docs/admin-jobs.png``)."""
    call_command("enqueue_demo", stdout=io.StringIO())
    for n in (1, 2):
        make_job(EVENT_LOG, status=JobStatus.DEAD, key=f"order-{n + 8}",
                 payload={"n": n, "status": "updated"})
    make_job(REPORT, status=JobStatus.DEAD, payload={"seconds": 2})
    user = manager("admin")
    page.set_viewport_size({"width": 1600, "height": 900})  # every column, no wrapping

    page.goto(f"{live_server.url}/admin/login/?next=/admin/jobs_engine/job/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")

    expect(page.locator("#result_list tbody tr")).to_have_count(Job.objects.count())
    expect(page.locator("#result_list tbody td.field-status", has_text="Dead")).to_have_count(3)
    expect(page.locator("#changelist-filter")).to_contain_text("By status")
    path = shot("admin-jobs")
    assert path.stat().st_size < 300_000


# -- job flows --------------------------------------------------------------------------------

FLAKY = {"fixed": False}  # the render step fails until the test "deploys the fix"


def e2e_query(ctx: Any) -> Any:
    return {"rows": 3, "month": ctx.data}


def e2e_render(ctx: Any) -> Any:
    if not FLAKY["fixed"]:
        raise RuntimeError("the template is missing a column")
    return {"pages": ctx.previous["rows"]}


def test_manager_starts_a_flow_watches_it_fail_retries_it_and_sees_it_complete(
        live_server: Any, page: Page, shot: Callable[..., Path]) -> None:
    from jobs_engine import flows
    from jobs_engine.models import Flow
    from jobs_engine.states import FlowState
    from tests.helpers import drain_long_lane

    flows.register_step("e2e.query", e2e_query)
    flows.register_step("e2e.render", e2e_render)
    flows.define("e2e-monthly-report", lambda month: flows.ChainSpec(
        [flows.Step("e2e.query", month), flows.Step("e2e.render")]),
        "Query the month's orders, then render the report")
    FLAKY["fixed"] = False
    user = manager("flow-operator", flows=True)
    base = live_server.url
    try:
        log_in(page, base, user.username, shot)
        page.goto(f"{base}/admin/jobs_engine/flow/")
        page.click("text=Start a defined flow")
        expect(page.locator("#start-flow")).to_contain_text(
            "Query the month's orders, then render the report")
        page.fill("#id_input", '"2026-11"')
        shot("03-start-a-defined-flow")
        page.click("input[name=start]")
        expect(page.locator("#flow-summary")).to_contain_text("RUNNING")
        flow = Flow.objects.get(name="e2e-monthly-report")
        shot("04-flow-started")

        # The workers run it: the render step fails three times and the flow is FAILED.
        drain_long_lane(lambda: Flow.objects.get(id=flow.id).state != FlowState.RUNNING)
        page.reload()
        expect(page.locator("#flow-summary .flow-state")).to_have_text("FAILED")
        expect(page.locator("tr[data-step='1'] .step-error")).to_contain_text(
            "the template is missing a column")
        expect(page.locator("tr[data-step='0'] .step-state")).to_have_text("DONE")
        shot("05-flow-failed", full_page=True)

        FLAKY["fixed"] = True  # the fix is deployed
        page.click("button[name=retry]")
        expect(page.locator(".messagelist")).to_contain_text("1 failed step(s) queued again")
        drain_long_lane(lambda: Flow.objects.get(id=flow.id).state != FlowState.RUNNING)
        page.reload()
        expect(page.locator("#flow-summary .flow-state")).to_have_text("COMPLETED")
        expect(page.locator("#flow-summary")).to_contain_text("2/2 steps done")
        expect(page.locator("tr[data-step='1']")).to_contain_text('{"pages": 3}')
        shot("06-flow-completed", full_page=True)
        page.goto(f"{base}/admin/jobs_engine/flow/")
        expect(page.locator("#result_list td.field-state")).to_have_text("Completed")
        shot("07-flows-list", full_page=True)
    finally:
        flows._definitions.pop("e2e-monthly-report", None)
        flows._step_handlers.pop("e2e.query", None)
        flows._step_handlers.pop("e2e.render", None)
