"""The schedules routes of the JSON API (docs/design.md#schedules): list with the next run in UTC
and in the schedule's zone, enable, disable, run now, set and clear the cron override;
401/403/CSRF like the jobs routes, 404 ``not_found`` for unknown codes, 400
``invalid_cron`` naming the problem with nothing changed, and an audit record for every
action, done or refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.test import Client
from django.utils import timezone

from jobs_engine import store
from jobs_engine.contrib.schedules.models import Schedule
from jobs_engine.models import AuditRecord, Job
from jobs_engine.operators.api import MAX_BODY_BYTES
from tests.db.operator_helpers import manager, manager_client, staff
from tests.db.schedule_helpers import declared_schedule, state

pytestmark = pytest.mark.django_db

API = "/jobs/api/v1/schedules"
BERLIN = ZoneInfo("Europe/Berlin")



@pytest.fixture
def client() -> Client:
    """Logged in as an engine manager."""
    return manager_client()


@pytest.fixture
def sched() -> Iterator[Schedule]:
    """A declared schedule, 02:30 every day in Europe/Berlin, enabled, no override."""
    with declared_schedule("api_sched") as row:
        yield row


def assert_error(response: Any, status_code: int, code: str) -> dict[str, Any]:
    assert response.status_code == status_code, response.content
    body = response.json()
    assert (body["status_code"], body["code"]) == (status_code, code), body
    assert isinstance(body["message"], list) and body["message"]
    assert all(isinstance(m, str) and m for m in body["message"])
    return body


def put_override(client: Client, code: str, cron: Any) -> Any:
    return client.put(f"{API}/{code}/cron_override", json.dumps({"cron_override": cron}),
                      content_type="application/json")


def audits() -> list[tuple[str, str, str, str, str]]:
    return [(r.username, r.action, r.object_type, r.object_id, r.result)
            for r in AuditRecord.objects.order_by("id")]


ROUTES = [("post", "enable"), ("post", "disable"), ("post", "run"), ("put", "cron_override"),
          ("delete", "cron_override")]


def call(client: Client, method: str, code: str, action: str) -> Any:
    """One route; the override body only where the route takes it."""
    body = json.dumps({"cron_override": "*/5 * * * *"}) if method == "put" else ""
    return getattr(client, method)(f"{API}/{code}/{action}", body,
                                   content_type="application/json")


# -- who may call --------------------------------------------------------------------------


@pytest.mark.parametrize("method, action", [("get", None), *ROUTES])
def test_anonymous_gets_401_and_a_user_without_the_permission_403(
        sched: Schedule, method: str, action: str | None) -> None:
    before = state(sched.code)
    for user, status_code, code in [(None, 401, "unauthorized"), (staff(), 403, "forbidden")]:
        api_client = Client()
        if user is not None:
            api_client.force_login(user)
        response = (api_client.get(API) if action is None
                    else call(api_client, method, sched.code, action))
        body = assert_error(response, status_code, code)
        if status_code == 403:
            assert "jobs_engine.manage_jobs" in body["message"][0]
    assert state(sched.code) == before
    assert not Job.objects.exists()
    assert not AuditRecord.objects.exists()


def test_unsafe_methods_need_the_csrf_token(sched: Schedule) -> None:
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(manager())

    assert_error(strict.post(f"{API}/{sched.code}/disable"), 403, "csrf_failed")
    assert_error(put_override(strict, sched.code, "*/5 * * * *"), 403, "csrf_failed")
    assert Schedule.objects.get(code=sched.code).enabled is True

    strict.get("/jobs/api/v1/docs")  # sets the csrftoken cookie
    token = strict.cookies["csrftoken"].value
    response = strict.post(f"{API}/{sched.code}/disable", headers={"X-CSRFToken": token})
    assert response.status_code == 200, response.content
    assert Schedule.objects.get(code=sched.code).enabled is False


# -- GET /schedules ------------------------------------------------------------------------


def test_list_has_every_row_sorted_by_code_with_next_run_in_utc_and_in_its_zone(
        client: Client) -> None:
    with declared_schedule("zz_berlin") as berlin, \
            declared_schedule("aa_utc", "*/15 * * * *", timezone="UTC") as utc, \
            declared_schedule("mm_tokyo", "0 9 * * MON", timezone="Asia/Tokyo") as tokyo:
        Schedule.objects.filter(pk=tokyo.pk).update(enabled=False, cron_override="0 10 * * *")
        # Whole milliseconds: the API's JSON encoder (Django's) writes times to the ms.
        skipped_at = (timezone.now() - timedelta(minutes=3)).replace(microsecond=123000)
        Schedule.objects.filter(pk=utc.pk).update(
            last_skipped_at=skipped_at, last_skip_reason="late by 120s at tick (workers down?)")

        response = client.get(API)

    assert response.status_code == 200, response.content
    rows = response.json()["data"]
    codes = [row["code"] for row in rows]
    assert codes == sorted(Schedule.objects.values_list("code", flat=True))  # every row
    assert [c for c in codes if c in {utc.code, tokyo.code, berlin.code}] == [
        utc.code, tokyo.code, berlin.code]
    by_code = {row["code"]: row for row in rows}
    for row, zone in [(by_code[berlin.code], BERLIN), (by_code[utc.code], UTC),
                      (by_code[tokyo.code], ZoneInfo("Asia/Tokyo"))]:
        stored = Schedule.objects.get(code=row["code"]).next_run_at
        in_utc = datetime.fromisoformat(row["next_run_at"])
        local = datetime.fromisoformat(row["next_run_local"])
        assert in_utc == local == stored
        assert in_utc.utcoffset() == timedelta(0)
        assert local.utcoffset() == stored.astimezone(zone).utcoffset()
    berlin_local = datetime.fromisoformat(by_code[berlin.code]["next_run_local"])
    assert (berlin_local.hour, berlin_local.minute) in {(2, 30), (3, 0)}  # (3, 0): DST gap
    assert by_code[tokyo.code] | {"enabled": False, "cron_override": "0 10 * * *",
                                  "effective_cron": "0 10 * * *", "cron": "0 9 * * MON",
                                  "timezone": "Asia/Tokyo"} == by_code[tokyo.code]
    assert by_code[utc.code]["last_skip_reason"] == "late by 120s at tick (workers down?)"
    assert datetime.fromisoformat(by_code[utc.code]["last_skipped_at"]) == skipped_at
    assert by_code[berlin.code]["enabled"] is True
    assert by_code[berlin.code]["cron_override"] is None


def test_list_refuses_query_parameters(client: Client) -> None:
    body = assert_error(client.get(API, {"enabled": "1"}), 400, "validation_error")
    assert body["message"] == ["query.enabled: unknown parameter"]


# -- enable / disable ----------------------------------------------------------------------


def test_disable_then_enable(client: Client, sched: Schedule) -> None:
    response = client.post(f"{API}/{sched.code}/disable")

    assert response.status_code == 200, response.content
    assert response.json()["enabled"] is False
    assert Schedule.objects.get(code=sched.code).enabled is False

    long_ago = timezone.now() - timedelta(days=3)
    Schedule.objects.filter(code=sched.code).update(next_run_at=long_ago)
    response = client.post(f"{API}/{sched.code}/enable")

    assert response.status_code == 200, response.content
    body = response.json()
    row = Schedule.objects.get(code=sched.code)
    assert body["enabled"] is True and row.enabled is True
    # Slots missed while disabled are dropped: the next one is after now.
    assert row.next_run_at > timezone.now() - timedelta(seconds=5)
    assert datetime.fromisoformat(body["next_run_at"]) == row.next_run_at
    assert audits() == [("manager", "disable", "schedule", sched.code, "ok"),
                        ("manager", "enable", "schedule", sched.code, "ok")]
    assert "next run" in AuditRecord.objects.get(action="enable").message


def test_enable_of_an_enabled_schedule_changes_nothing_and_is_audited(client: Client,
                                                                     sched: Schedule) -> None:
    before = state(sched.code)
    response = client.post(f"{API}/{sched.code}/enable")
    assert response.status_code == 200
    assert state(sched.code) == before
    record = AuditRecord.objects.get()
    assert (record.action, record.result) == ("enable", "ok")
    assert record.message.startswith("already enabled")


# -- run now -------------------------------------------------------------------------------


def test_run_now_enqueues_one_job_of_the_schedule(client: Client, sched: Schedule) -> None:
    response = client.post(f"{API}/{sched.code}/run")

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["code"] == sched.code and body["inserted"] is True
    job = Job.objects.get(id=body["job_id"])
    assert job.target == f"schedule:{sched.code}" and job.code == sched.code
    assert job.dedupe_key.startswith(f"{sched.code}:run-now:")
    assert job.payload["run_now"] is True
    record = AuditRecord.objects.get()
    assert (record.action, record.object_id, record.result) == ("run_now", sched.code, "ok")
    assert record.message == f"job {job.id} enqueued"


def test_run_now_of_a_row_no_code_declares_is_409(client: Client) -> None:
    Schedule.objects.create(code="gone_from_code", cron="0 * * * *", timezone="UTC",
                            missed_slot_policy="run_once")

    body = assert_error(client.post(f"{API}/gone_from_code/run"), 409, "invalid_status")

    assert "not declared" in body["message"][0]
    assert not Job.objects.exists()
    assert audits() == [("manager", "run_now", "schedule", "gone_from_code", "refused")]


# -- cron override -------------------------------------------------------------------------


def test_set_then_clear_the_cron_override(client: Client, sched: Schedule) -> None:
    response = put_override(client, sched.code, "  */10   * * * *  ")

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["cron_override"], body["effective_cron"]) == ("*/10 * * * *", "*/10 * * * *")
    row = Schedule.objects.get(code=sched.code)
    assert row.cron_override == "*/10 * * * *"
    next_run = row.next_run_at.astimezone(BERLIN)
    assert next_run.minute % 10 == 0 and next_run.second == 0
    assert next_run - timezone.now() <= timedelta(minutes=10)
    assert datetime.fromisoformat(body["next_run_local"]) == row.next_run_at

    response = client.delete(f"{API}/{sched.code}/cron_override")

    assert response.status_code == 200, response.content
    assert response.json()["cron_override"] is None
    row = Schedule.objects.get(code=sched.code)
    assert row.cron_override is None
    assert row.next_run_at.astimezone(BERLIN).minute in {30, 0}  # back on 30 2 * * *
    assert audits() == [("manager", "set_override", "schedule", sched.code, "ok"),
                        ("manager", "clear_override", "schedule", sched.code, "ok")]
    assert "*/10 * * * *" in AuditRecord.objects.get(action="set_override").message


@pytest.mark.parametrize("cron, problem", [
    ("61 * * * *", "61"),
    ("* * *", "has 3 fields"),
    ("* * * * * * *", "has 7 fields"),
    ("@sometimes", "unknown macro"),
    ("", "is empty"),
    ("   ", "is empty"),
    ("0 0 30 2 *", "never fires"),
    ("R * * * *", "random (R)"),
    ("* * * * FOO", "FOO"),
    ("* " * 120, "longer than 200"),
    ("* * * * *\x00", "is not acceptable"),
    ("*/0 * * * *", "step '0'"),
])
def test_a_bad_cron_is_400_invalid_cron_naming_the_problem_and_changes_nothing(
        client: Client, sched: Schedule, cron: str, problem: str) -> None:
    put_override(client, sched.code, "0 4 * * *")
    before = state(sched.code)
    AuditRecord.objects.all().delete()

    body = assert_error(put_override(client, sched.code, cron), 400, "invalid_cron")

    assert problem.lower() in body["message"][0].lower(), body
    assert body["message"][0].startswith("cron_override ")
    assert state(sched.code) == before
    record = AuditRecord.objects.get()
    assert (record.action, record.object_id, record.result) == (
        "set_override", sched.code, "refused")
    assert record.message == body["message"][0].replace("\x00", "\\x00")


@pytest.mark.parametrize("body", [
    "{}", '{"cron_override": 5}', '{"cron_override": null}', "not json", "[]",
    '{"cron": "* * * * *"}', '{"cron_override": "* * * * \\ud800"}',
    '{"cron_override": "\\udfff"}',
])
def test_a_malformed_override_body_is_400_and_changes_nothing(client: Client, sched: Schedule,
                                                              body: str) -> None:
    before = state(sched.code)
    response = client.put(f"{API}/{sched.code}/cron_override", body,
                          content_type="application/json")
    assert_error(response, 400, "validation_error")
    assert state(sched.code) == before


@pytest.mark.parametrize("extra", [{"cron_overide": "*/5 * * * *"}, {"enabled": False},
                                   {"timezone": "UTC"}])
def test_an_unknown_body_field_is_400_naming_it_and_changes_nothing(
        client: Client, sched: Schedule, extra: dict[str, Any]) -> None:
    """A client that believes a field is used (a misspelt one, or one this route does not
    take) learns that it is not, and nothing changes."""
    before = state(sched.code)
    body = json.dumps({"cron_override": "*/5 * * * *", **extra})
    response = client.put(f"{API}/{sched.code}/cron_override", body,
                          content_type="application/json")
    messages = assert_error(response, 400, "validation_error")["message"]
    [name] = extra
    assert messages == [f"body.body.{name}: unknown field"]
    assert state(sched.code) == before
    assert not AuditRecord.objects.exists()


@pytest.mark.parametrize("method, action", [r for r in ROUTES if r[0] != "put"])
def test_a_body_on_a_route_that_takes_none_is_400_and_changes_nothing(
        client: Client, sched: Schedule, method: str, action: str) -> None:
    before = state(sched.code)
    response = getattr(client, method)(f"{API}/{sched.code}/{action}",
                                       json.dumps({"cron_override": None}),
                                       content_type="application/json")
    messages = assert_error(response, 400, "validation_error")["message"]
    assert messages == ["body.cron_override: unknown field (this route takes no body)"]
    assert state(sched.code) == before
    assert not Job.objects.exists()
    assert not AuditRecord.objects.exists()


def test_a_huge_body_is_413_and_changes_nothing(client: Client, sched: Schedule) -> None:
    before = state(sched.code)
    huge = json.dumps({"cron_override": "* * * * *", "junk": "x" * (MAX_BODY_BYTES + 1)})
    response = client.put(f"{API}/{sched.code}/cron_override", huge,
                          content_type="application/json")
    assert_error(response, 413, "body_too_large")
    assert state(sched.code) == before
    assert not AuditRecord.objects.exists()


# -- unknown codes -------------------------------------------------------------------------


@pytest.mark.parametrize("code", ["no_such_schedule", "a b", "%00", "x" * 101, "%C3%BC",
                                  "..", "a;drop"])
@pytest.mark.parametrize("method, action", ROUTES)
def test_unknown_or_malformed_codes_are_404(client: Client, sched: Schedule, code: str,
                                            method: str, action: str) -> None:
    before = state(sched.code)
    assert_error(call(client, method, code, action), 404, "not_found")
    assert state(sched.code) == before
    assert not Job.objects.exists()
    assert all(record.result == "refused" for record in AuditRecord.objects.all())


def test_an_unknown_code_is_audited_as_refused(client: Client) -> None:
    client.post(f"{API}/no_such_schedule/disable")
    record = AuditRecord.objects.get()
    assert (record.action, record.object_type, record.object_id, record.result) == (
        "disable", "schedule", "no_such_schedule", "refused")
    assert record.message == "schedule 'no_such_schedule' does not exist"


def test_unknown_routes_and_methods_never_500(client: Client, sched: Schedule) -> None:
    assert_error(client.get(f"{API}/{sched.code}"), 404, "not_found")
    assert_error(client.post(f"{API}/{sched.code}/pause"), 404, "not_found")
    assert client.get(f"{API}/{sched.code}/enable").status_code == 405
    assert client.post(f"{API}/{sched.code}/cron_override").status_code == 405


# -- OpenAPI -------------------------------------------------------------------------------


def test_openapi_lists_the_schedule_routes() -> None:
    from jobs_engine.operators.api import api

    paths = json.loads(json.dumps(api.get_openapi_schema()))["paths"]  # as served
    assert set(paths["/jobs/api/v1/schedules/{code}/cron_override"]) == {"put", "delete"}
    assert set(paths["/jobs/api/v1/schedules/{code}/cron_override"]["put"]["responses"]) >= {
        "200", "400", "401", "403", "404"}
    for action in ("enable", "disable", "run"):
        assert "post" in paths[f"/jobs/api/v1/schedules/{{code}}/{action}"]
    assert "get" in paths["/jobs/api/v1/schedules"]


def test_db_clock_is_used_for_run_now(client: Client, sched: Schedule) -> None:
    """The run-now dedupe key carries the database's time, to the second."""
    before = store.db_now().replace(microsecond=0)
    job_id = client.post(f"{API}/{sched.code}/run").json()["job_id"]
    after = store.db_now()
    slot = datetime.fromisoformat(Job.objects.get(id=job_id).dedupe_key.split(":run-now:")[1])
    assert before <= slot <= after
