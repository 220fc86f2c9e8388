"""The admin's Limits page in a real browser (docs/operators.md#admin): headless Chromium
against the live server on PostgreSQL. A manager logs in, opens the Limits page from the
admin's index, overrides a limit, sees the new value in force beside the declared one (and
a worker's admission taking it), clears the override and sees the declared value back;
then pauses a target by hand on the targets' page and resumes it. Each step leaves a
screenshot under ``test-artifacts/browser/<test>/``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from jobs_engine import store
from jobs_engine.enqueueing import enqueue_many
from jobs_engine.limits import PER_TENANT, Concurrency, Rate
from jobs_engine.models import AuditRecord, LimitBucket, LimitOverride, TargetPause
from jobs_engine.registry import get_target
from tests.browser.test_admin_e2e import log_in
from tests.db.operator_helpers import manager

pytestmark = pytest.mark.django_db(transaction=True)


def test_manager_overrides_a_limit_sees_it_in_force_and_clears_it(
        live_server: Any, page: Page, shot: Callable[..., Path], targets: Any) -> None:
    targets("e2e.render", lane="long", limits=[Concurrency(2)])
    targets("e2e.pay", lane="long", limits=[Rate(3, period_s=60, per=PER_TENANT)])
    enqueue_many([{"target": "e2e.render", "payload": n} for n in range(10)])
    user = manager("limits-operator")
    base = live_server.url

    log_in(page, base, user.username, shot)
    page.click("a[href$='/admin/jobs_engine/targetlimit/']")
    render = page.locator("tbody.limit[data-limit='e2e.render/concurrency']")
    expect(render.locator("td.in-force")).to_have_text("2 at once")
    expect(page.locator("tbody.limit[data-limit='e2e.pay/rate/tenant'] td.in-force")
           ).to_have_text("3 per 60 s, burst 3")
    shot("03-limits-declared", full_page=True)

    # -- override the slots: in force on the page, and at the next admission --------------
    render.locator("input[name=slots]").fill("5")
    render.locator("button[name=set]").click()
    expect(page.locator(".messagelist .success")).to_have_text(
        "Limit concurrency of e2e.render: 5 at once in force (declared 2 at once).")
    render = page.locator("tbody.limit[data-limit='e2e.render/concurrency']")
    expect(render.locator("td.in-force")).to_contain_text("5 at once")
    expect(render.locator(".overridden")).to_contain_text(
        "overridden by limits-operator; declared: 2 at once")
    expect(render.locator("input[name=slots]")).to_have_value("5")
    shot("04-limit-overridden", full_page=True)
    admitted = store.jobs_long_reserve_limited(
        "e2e-worker", uuid.uuid4().hex, store.db_now(), 300, 10,
        targets=[get_target("e2e.render")])
    assert len(admitted.rows) == 5  # a worker's admission takes the override at once
    page.reload()
    render = page.locator("tbody.limit[data-limit='e2e.render/concurrency']")
    expect(render.locator("td.running")).to_have_text("5 / 5")
    expect(render.locator("td.admitted")).to_have_text("5")
    shot("05-limit-in-force-running", full_page=True)

    # -- clear it: the declared value is back --------------------------------------------
    render.locator("button[name=clear]").click()
    expect(page.locator(".messagelist .success")).to_have_text(
        "Limit concurrency of e2e.render: back to its declared 2 at once.")
    render = page.locator("tbody.limit[data-limit='e2e.render/concurrency']")
    expect(render.locator("td.in-force")).to_have_text("2 at once")
    expect(render.locator(".overridden")).to_have_count(0)
    expect(render.locator("button[name=clear]")).to_have_count(0)
    shot("06-limit-cleared", full_page=True)
    assert not LimitOverride.objects.exists()
    assert LimitBucket.objects.get(target="e2e.render").admitted == 5

    # -- a target paused by hand and resumed, on the targets' page -----------------------
    page.goto(f"{base}/admin/jobs_engine/registeredtarget/")
    row = page.locator("tr[data-target='e2e.pay']")
    row.locator("button[name=pause]").click()
    expect(page.locator(".messagelist .success")).to_contain_text(
        "Target e2e.pay paused by hand")
    row = page.locator("tr[data-target='e2e.pay']")
    expect(row.locator(".pause-state")).to_have_text("paused by hand, until resumed")
    shot("07-target-paused-by-hand", full_page=True)
    assert TargetPause.objects.get(target="e2e.pay").paused_until == store.HAND_PAUSE_UNTIL
    row.locator("button[name=resume]").click()
    expect(page.locator(".messagelist .success")).to_have_text(
        "Target e2e.pay resumed: workers send its jobs again.")
    expect(page.locator("tr[data-target='e2e.pay'] .pause-state")).to_have_text("-")
    assert not TargetPause.objects.exists()

    assert [(r.username, r.action, r.object_id, r.result)
            for r in AuditRecord.objects.order_by("id")] == [
        ("limits-operator", "set_override", "e2e.render/concurrency", "ok"),
        ("limits-operator", "clear_override", "e2e.render/concurrency", "ok"),
        ("limits-operator", "pause", "e2e.pay", "ok"),
        ("limits-operator", "resume", "e2e.pay", "ok")]
