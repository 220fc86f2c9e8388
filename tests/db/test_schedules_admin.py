"""Schedules in the operators' Django admin (docs/design.md#schedules): the list (cron, override,
zone, enabled, next run in the schedule's zone, last run, last skip with reason), actions
enable, disable, set override (intermediate form that validates the cron; a bad one
changes nothing), clear override and run now, each with its messages and audit records;
only engine managers see and act."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django.utils.html import strip_tags

from jobs_engine.contrib.schedules.models import Schedule
from jobs_engine.models import AuditRecord, Job
from tests.db.operator_helpers import manager_client, staff
from tests.db.schedule_helpers import declared_schedule, state

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:jobs_engine_schedules_schedule_changelist")
BERLIN = ZoneInfo("Europe/Berlin")



@pytest.fixture
def client() -> Client:
    return manager_client()


@pytest.fixture
def sched() -> Iterator[Schedule]:
    """02:30 every day in Europe/Berlin, enabled, no override."""
    with declared_schedule("adm_sched") as row:
        yield row


@pytest.fixture
def other() -> Iterator[Schedule]:
    with declared_schedule("adm_other", "0 * * * *", timezone="UTC") as row:
        yield row


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def act(client: Client, action: str, rows: list[Schedule], **extra: Any) -> Any:
    return client.post(CHANGELIST, {"action": action,
                                    "_selected_action": [r.pk for r in rows], **extra})


def audits() -> list[tuple[str, str, str, str, str]]:
    return [(r.username, r.action, r.object_type, r.object_id, r.result)
            for r in AuditRecord.objects.order_by("id")]


# -- access --------------------------------------------------------------------------------


def test_only_managers_see_and_act(sched: Schedule) -> None:
    anonymous = Client().get(CHANGELIST)
    assert anonymous.status_code == 302 and "/admin/login/" in anonymous["Location"]
    other_user = Client()
    other_user.force_login(staff())
    assert other_user.get(CHANGELIST).status_code == 403
    assert act(other_user, "disable_selected", [sched]).status_code == 403
    assert Schedule.objects.get(pk=sched.pk).enabled is True
    assert not AuditRecord.objects.exists()


def test_a_viewer_without_the_manage_permission_gets_no_actions(sched: Schedule) -> None:
    viewer_user = staff("viewer")
    viewer_user.user_permissions.add(Permission.objects.get(codename="view_schedule"))
    viewer = Client()
    viewer.force_login(viewer_user)

    content = viewer.get(CHANGELIST).content.decode()
    assert sched.code in content and "disable_selected" not in content
    detail = viewer.get(reverse("admin:jobs_engine_schedules_schedule_change", args=[sched.pk]))
    assert detail.status_code == 200 and sched.code in detail.content.decode()
    for action in ("disable_selected", "run_now_selected", "set_override"):
        assert act(viewer, action, [sched], cron_override="* * * * *",
                   apply="Set override").status_code == 403
    assert Schedule.objects.get(pk=sched.pk).enabled is True
    assert not Job.objects.exists()
    assert not AuditRecord.objects.exists()


# -- the list ------------------------------------------------------------------------------


def test_list_shows_cron_override_zone_enabled_next_run_in_zone_last_run_and_skip(
        client: Client, sched: Schedule, other: Schedule) -> None:
    last_run = datetime(2026, 7, 1, 0, 30, tzinfo=UTC)  # 02:30 CEST
    skipped = datetime(2026, 7, 2, 0, 30, tzinfo=UTC)
    Schedule.objects.filter(pk=sched.pk).update(
        cron_override="15 4 * * *", last_run_at=last_run, last_skipped_at=skipped,
        last_skip_reason="late by 95s at start (long lane busy)")
    Schedule.objects.filter(pk=other.pk).update(enabled=False)
    row = Schedule.objects.get(pk=sched.pk)

    response = client.get(CHANGELIST)

    assert response.status_code == 200
    listed = [r.code for r in response.context["cl"].result_list]
    assert listed == sorted(listed) and {sched.code, other.code} <= set(listed)
    html = response.content.decode()
    content = strip_tags(html)
    assert "30 2 * * *" in content and "15 4 * * *" in content and "Europe/Berlin" in content
    next_local = row.next_run_at.astimezone(BERLIN).strftime("%Y-%m-%d %H:%M:%S %Z")
    assert next_local in content  # the next run in the schedule's zone
    utc_title = row.next_run_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert f'title="{utc_title}"' in html  # and in UTC on hover
    assert "2026-07-01 02:30:00 CEST" in content  # last run, in its zone
    assert "2026-07-02 02:30:00 CEST — late by 95s at start (long lane busy)" in content
    page = response.context["cl"].model_admin
    assert page.next_run(row).endswith(f">{next_local}</span>")
    disabled = {r.code: r.enabled for r in response.context["cl"].result_list}
    assert disabled[other.code] is False and disabled[sched.code] is True
    assert 'alt="False"' in html and 'alt="True"' in html


def test_detail_page_shows_the_next_run_in_the_zone(client: Client, sched: Schedule) -> None:
    row = Schedule.objects.get(pk=sched.pk)
    response = client.get(reverse("admin:jobs_engine_schedules_schedule_change", args=[sched.pk]))
    assert response.status_code == 200
    content = response.content.decode()
    assert row.next_run_at.astimezone(BERLIN).strftime("%Y-%m-%d %H:%M:%S %Z") in content
    assert "30 2 * * *" in content


# -- enable, disable, clear override, run now ----------------------------------------------


def test_disable_and_enable(client: Client, sched: Schedule, other: Schedule) -> None:
    response = act(client, "disable_selected", [sched, other])

    assert response.status_code == 302 and response["Location"].startswith(CHANGELIST)
    assert messages_of(response) == [
        f"Disabled 2 schedule(s): {', '.join(sorted([sched.code, other.code]))}."]
    assert not Schedule.objects.filter(pk__in=[sched.pk, other.pk], enabled=True).exists()

    Schedule.objects.filter(pk=sched.pk).update(next_run_at=timezone.now() - timedelta(days=2))
    response = act(client, "enable_selected", [sched])

    row = Schedule.objects.get(pk=sched.pk)
    assert row.enabled is True and row.next_run_at > timezone.now() - timedelta(seconds=5)
    local = row.next_run_at.astimezone(BERLIN).strftime("%Y-%m-%d %H:%M:%S %Z")
    assert messages_of(response)[-1] == (
        f"Enabled 1 schedule(s): {sched.code} (next run {local}).")
    assert Schedule.objects.get(pk=other.pk).enabled is False
    assert sorted(audits()) == sorted([
        ("manager", "disable", "schedule", sched.code, "ok"),
        ("manager", "disable", "schedule", other.code, "ok"),
        ("manager", "enable", "schedule", sched.code, "ok")])


def test_clear_override(client: Client, sched: Schedule) -> None:
    Schedule.objects.filter(pk=sched.pk).update(cron_override="*/5 * * * *")

    response = act(client, "clear_override", [sched])

    row = Schedule.objects.get(pk=sched.pk)
    assert row.cron_override is None
    assert row.next_run_at.astimezone(BERLIN).minute in {30, 0}  # back on 30 2 * * *
    [message] = messages_of(response)
    assert message.startswith(f"Cleared the override of 1 schedule(s): {sched.code} "
                              "(on 30 2 * * *, next run ")
    record = AuditRecord.objects.get()
    assert (record.action, record.result) == ("clear_override", "ok")
    assert "was '*/5 * * * *'" in record.message


def test_run_now(client: Client, sched: Schedule) -> None:
    response = act(client, "run_now_selected", [sched])

    job = Job.objects.get(target=f"schedule:{sched.code}")
    assert job.payload["run_now"] is True
    assert messages_of(response) == [f"Started 1 schedule(s): {sched.code} (job {job.id})."]
    assert audits() == [("manager", "run_now", "schedule", sched.code, "ok")]


def test_run_now_of_a_row_no_code_declares_is_refused_with_a_message(client: Client) -> None:
    row = Schedule.objects.create(code="gone_from_code", cron="0 * * * *", timezone="UTC",
                                  missed_slot_policy="run_once")

    response = act(client, "run_now_selected", [row])

    [message] = messages_of(response)
    assert message.startswith("Refused 1 schedule(s): schedule 'gone_from_code' is not declared")
    assert not Job.objects.exists()
    assert audits() == [("manager", "run_now", "schedule", "gone_from_code", "refused")]


# -- set override (intermediate form) ------------------------------------------------------


def test_set_override_shows_a_form_first_and_changes_nothing(client: Client,
                                                             sched: Schedule) -> None:
    before = state(sched.code)

    response = act(client, "set_override", [sched])

    assert response.status_code == 200
    content = response.content.decode()
    assert 'name="cron_override"' in content and 'value="30 2 * * *"' in content
    assert f'name="_selected_action" value="{sched.pk}"' in content
    assert 'name="action" value="set_override"' in content
    assert state(sched.code) == before
    assert not AuditRecord.objects.exists()


def test_set_override_applies_a_valid_cron(client: Client, sched: Schedule,
                                           other: Schedule) -> None:
    response = act(client, "set_override", [sched, other], cron_override=" */10 * * * * ",
                   apply="Set override")

    assert response.status_code == 302
    rows = {r.code: r for r in Schedule.objects.filter(pk__in=[sched.pk, other.pk])}
    assert {r.cron_override for r in rows.values()} == {"*/10 * * * *"}
    for row in rows.values():
        assert row.next_run_at.minute % 10 == 0
        assert row.next_run_at - timezone.now() <= timedelta(minutes=10)
    [message] = messages_of(response)
    assert message.startswith("Set the override of 2 schedule(s): ")
    assert "on */10 * * * *, next run" in message
    assert sorted(audits()) == sorted([
        ("manager", "set_override", "schedule", sched.code, "ok"),
        ("manager", "set_override", "schedule", other.code, "ok")])


@pytest.mark.parametrize("cron, problem", [
    ("61 * * * *", "out of range"),
    ("* * *", "has 3 fields"),
    ("0 0 30 2 *", "never fires within 5 years"),
    ("", "This field is required."),
])
def test_set_override_with_a_bad_cron_shows_the_problem_and_changes_nothing(
        client: Client, sched: Schedule, other: Schedule, cron: str, problem: str) -> None:
    before = [state(sched.code), state(other.code)]

    response = act(client, "set_override", [sched, other], cron_override=cron,
                   apply="Set override")

    assert response.status_code == 200  # the form again
    errors = response.context["form"].errors["cron_override"]
    assert any(problem in error for error in errors), errors
    assert problem in response.content.decode().replace("&#x27;", "'")
    assert [state(sched.code), state(other.code)] == before
    assert sorted(audits()) == sorted([
        ("manager", "set_override", "schedule", sched.code, "refused"),
        ("manager", "set_override", "schedule", other.code, "refused")])
    assert all(problem in r.message for r in AuditRecord.objects.all())
