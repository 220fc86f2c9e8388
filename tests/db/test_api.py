"""The JSON API under /api/v1/ (docs/operations.md#access): every jobs
route, every error in the one error shape, bad input that changes nothing (a job id is
plain decimal digits: any other spelling is 404; a query parameter or body the route does
not use is 400), and two concurrent retries with exactly one winner."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs_engine import store
from jobs_engine.models import AuditRecord, InflightMark, Job
from jobs_engine.operators import queries
from jobs_engine.operators.api import MAX_BODY_BYTES
from jobs_engine.states import JobStatus
from tests.db.operator_helpers import make_job, manager, manager_client, staff
from tests.helpers import race

pytestmark = pytest.mark.django_db

JOBS = "/jobs/api/v1/jobs"


@pytest.fixture
def client() -> Client:
    """Logged in as an engine manager."""
    return manager_client()


def assert_error(response: Any, status_code: int, code: str) -> dict[str, Any]:
    assert response.status_code == status_code, response.content
    body = response.json()
    assert body["status_code"] == status_code
    assert body["code"] == code
    assert isinstance(body["message"], list) and body["message"]
    assert all(isinstance(m, str) and m for m in body["message"])
    return body


def ids(response: Any) -> list[int]:
    assert response.status_code == 200, response.content
    return [row["id"] for row in response.json()["data"]]


# -- who may call --------------------------------------------------------------------------


@pytest.mark.parametrize("method, path", [
    ("get", JOBS), ("get", f"{JOBS}/1"), ("post", f"{JOBS}/1/retry"),
    ("post", f"{JOBS}/1/skip"), ("post", f"{JOBS}/1/cancel"),
])
def test_anonymous_gets_401_and_a_user_without_the_permission_403(method: str,
                                                                  path: str) -> None:
    assert_error(getattr(Client(), method)(path), 401, "unauthorized")
    other = Client()
    other.force_login(staff())
    body = assert_error(getattr(other, method)(path), 403, "forbidden")
    assert "jobs_engine.manage_jobs" in body["message"][0]


def test_a_superuser_passes(targets: Any) -> None:
    targets("api.super")
    job = make_job("api.super")
    admin_client = Client()
    admin_client.force_login(User.objects.create_superuser("root", password="pw"))
    assert ids(admin_client.get(JOBS)) == [job.id]


def test_post_without_the_csrf_token_is_refused_and_changes_nothing(targets: Any) -> None:
    targets("api.csrf")
    job = make_job("api.csrf", status=JobStatus.DEAD)
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(manager())

    assert_error(strict.post(f"{JOBS}/{job.id}/retry"), 403, "csrf_failed")
    assert Job.objects.get(id=job.id).status == JobStatus.DEAD

    strict.get("/jobs/api/v1/docs")  # any page with a form sets the csrftoken cookie
    token = strict.cookies["csrftoken"].value
    response = strict.post(f"{JOBS}/{job.id}/retry", headers={"X-CSRFToken": token})
    assert response.status_code == 200, response.content
    assert Job.objects.get(id=job.id).status == JobStatus.PENDING


# -- GET /jobs -----------------------------------------------------------------------------


def test_list_is_newest_first_without_payload(client: Client, targets: Any) -> None:
    targets("api.list")
    jobs = [make_job("api.list", payload={"secret": i}) for i in range(3)]

    response = client.get(JOBS)

    body = response.json()
    assert ids(response) == [job.id for job in reversed(jobs)]
    assert (body["total"], body["total_capped"], body["page"], body["limit"]) == (3, False, 1, 100)
    row = body["data"][0]
    assert "payload" not in row and "headers" not in row and "last_error" not in row
    assert row["target"] == "api.list" and row["status"] == "PENDING"
    assert row["dedupe_key"] == jobs[-1].dedupe_key


def test_list_filters(client: Client, targets: Any) -> None:
    targets("api.f.fast")
    targets("api.f.long", lane="long")
    dead = make_job("api.f.fast", status=JobStatus.DEAD, code="order.paid", key="o-1")
    pending = make_job("api.f.fast", code="order.paid", key="o-2")
    long_row = make_job("api.f.long", code="export")

    assert ids(client.get(JOBS, {"status": "DEAD"})) == [dead.id]
    assert ids(client.get(JOBS, {"target": "api.f.fast"})) == [pending.id, dead.id]
    assert ids(client.get(JOBS, {"code": "order.paid"})) == [pending.id, dead.id]
    assert ids(client.get(JOBS, {"key": "o-2"})) == [pending.id]
    assert ids(client.get(JOBS, {"lane": "long"})) == [long_row.id]
    assert ids(client.get(JOBS, {"lane": "fast", "status": "PENDING"})) == [pending.id]
    assert ids(client.get(JOBS, {"target": "nothing"})) == []


def test_list_paging(client: Client, targets: Any) -> None:
    targets("api.page")
    jobs = [make_job("api.page") for _ in range(5)]
    newest_first = [job.id for job in reversed(jobs)]

    assert ids(client.get(JOBS, {"limit": 2})) == newest_first[:2]
    assert ids(client.get(JOBS, {"limit": 2, "page": 2})) == newest_first[2:4]
    assert ids(client.get(JOBS, {"limit": 2, "page": 3})) == newest_first[4:]
    assert ids(client.get(JOBS, {"limit": 2, "page": 4})) == []
    assert client.get(JOBS, {"limit": 2, "page": 2}).json()["total"] == 5


def test_list_total_is_capped(client: Client, targets: Any,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    targets("api.cap")
    for _ in range(4):
        make_job("api.cap")
    monkeypatch.setattr(queries, "COUNT_CAP", 3)

    body = client.get(JOBS, {"limit": 2}).json()

    assert (body["total"], body["total_capped"]) == (3, True)
    assert len(body["data"]) == 2


@pytest.mark.parametrize("query, where", [
    ({"limit": 101}, "query.limit"),
    ({"limit": 0}, "query.limit"),
    ({"page": 0}, "query.page"),
    ({"page": "x"}, "query.page"),
    ({"page": 10**9}, "query.page"),
    ({"status": "DONEISH"}, "query.status"),
    ({"lane": "slow"}, "query.lane"),
    ({"key": "a\x00b"}, "query.key"),
    ({"target": "t" * 256}, "query.target"),
    ({"sort": "id"}, "query.sort"),
    ({"payload": "1", "status": "DEAD"}, "query.payload"),
])
def test_list_bad_query_is_400_naming_the_parameter(client: Client, query: dict[str, Any],
                                                    where: str) -> None:
    body = assert_error(client.get(JOBS, query), 400, "validation_error")
    assert any(m.startswith(where) for m in body["message"]), body


# -- GET /jobs/{id} ------------------------------------------------------------------------


def test_detail_has_payload_headers_and_last_error(client: Client, targets: Any) -> None:
    targets("api.detail")
    job = make_job("api.detail", status=JobStatus.DEAD, payload={"order": 7, "items": [1, 2]},
                   headers={"event_id": "e-1"}, key="o-7")

    response = client.get(f"{JOBS}/{job.id}")

    assert response.status_code == 200
    body = response.json()
    assert body["id"] == job.id and body["status"] == "DEAD" and body["key"] == "o-7"
    assert body["payload"] == {"order": 7, "items": [1, 2]}
    assert body["headers"] == {"event_id": "e-1"}
    assert body["last_error"] == "RuntimeError: boom (attempt 6 of 6)"
    assert body["attempts"] == 6 and body["closed_at"] is not None


@pytest.mark.parametrize("job_id", ["987654321", "abc", "0", "-3", "1.5", "1e3",
                                    str(2**63), "9" * 400, "%E2%91%A0", "%D9%A1", "1_000",
                                    "%00"])
def test_unknown_or_malformed_ids_are_404(client: Client, job_id: str) -> None:
    assert_error(client.get(f"{JOBS}/{job_id}"), 404, "not_found")
    for action in ("retry", "skip", "cancel"):
        assert_error(client.post(f"{JOBS}/{job_id}/{action}"), 404, "not_found")


def near_misses(job_id: int) -> list[str]:
    """Spellings that int() or pydantic read as ``job_id``: none is a plain id."""
    text = str(job_id)
    return [f"{text}.0", f"+{text}", f"%20{text}", f"{text}%20", f"{text}%0A", f"0{text}",
            f"00{text}", f"{text}e0", f"{text}.", f"{job_id // 10}_{job_id % 10}"]


def test_near_miss_spellings_of_a_real_id_are_404_and_touch_nothing(client: Client,
                                                                    targets: Any) -> None:
    """An id is plain decimal digits without a leading zero; ``42.0`` or ``042`` is not
    job 42."""
    targets("api.near")
    job = make_job("api.near", status=JobStatus.DEAD)
    while job.id < 10:  # two digits, so that "4_2" can spell 42
        job = make_job("api.near", status=JobStatus.DEAD)
    for raw in near_misses(job.id):
        assert_error(client.get(f"{JOBS}/{raw}"), 404, "not_found")
        for action in ("retry", "skip", "cancel"):
            assert_error(client.post(f"{JOBS}/{raw}/{action}"), 404, "not_found")
    assert Job.objects.get(id=job.id).status == JobStatus.DEAD
    assert not AuditRecord.objects.filter(object_id=str(job.id)).exists()


def test_unknown_routes_and_methods_never_500(client: Client) -> None:
    assert_error(client.get("/jobs/api/v1/nothing"), 404, "not_found")
    assert_error(client.get(f"{JOBS}/1/2/3"), 404, "not_found")
    assert client.get(f"{JOBS}/1/retry").status_code == 405
    assert client.delete(f"{JOBS}/1").status_code == 405


# -- POST /jobs/{id}/retry|skip|cancel -----------------------------------------------------


def test_retry_a_dead_job(client: Client, targets: Any) -> None:
    targets("api.retry")
    job = make_job("api.retry", status=JobStatus.DEAD)

    response = client.post(f"{JOBS}/{job.id}/retry")

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["id"], body["status"], body["attempts"], body["closed_at"]) == (
        job.id, "PENDING", 0, None)
    assert "payload" not in body
    assert Job.objects.get(id=job.id).status == JobStatus.PENDING
    record = AuditRecord.objects.get(action="retry")
    assert (record.username, record.object_id, record.result) == ("manager", str(job.id), "ok")


def test_retry_of_a_pending_job_is_409_and_audited(client: Client, targets: Any) -> None:
    targets("api.retry.409")
    job = make_job("api.retry.409")

    body = assert_error(client.post(f"{JOBS}/{job.id}/retry"), 409, "invalid_status")

    assert "is PENDING" in body["message"][0]
    assert AuditRecord.objects.get(action="retry").result == "refused"


def test_skip_a_dead_job_and_409_for_others(client: Client, targets: Any) -> None:
    targets("api.skip")
    dead = make_job("api.skip", status=JobStatus.DEAD)
    pending = make_job("api.skip")

    response = client.post(f"{JOBS}/{dead.id}/skip")
    assert response.status_code == 200
    assert response.json() == {"id": dead.id, "skipped": True}
    assert not Job.objects.filter(id=dead.id).exists()

    assert_error(client.post(f"{JOBS}/{pending.id}/skip"), 409, "invalid_status")
    assert Job.objects.filter(id=pending.id).exists()
    assert_error(client.post(f"{JOBS}/{dead.id}/skip"), 404, "not_found")  # gone now


def test_cancel_a_pending_job(client: Client, targets: Any) -> None:
    targets("api.cancel")
    job = make_job("api.cancel")

    response = client.post(f"{JOBS}/{job.id}/cancel")

    assert response.status_code == 200
    assert response.json() == {"id": job.id, "cancelled": True, "was": "PENDING"}
    assert not Job.objects.filter(id=job.id).exists()


def test_cancel_a_long_row_not_started_and_409_once_started(client: Client, targets: Any,
                                                            now: Any) -> None:
    targets("api.cancel.long", lane="long")
    waiting = make_job("api.cancel.long")
    started = make_job("api.cancel.long")
    store.jobs_long_reserve("w1", "tok", now, 300, 10, targets=["api.cancel.long"])
    assert store.jobs_long_mark_started([started.id], "tok", now) == {started.id: []}

    response = client.post(f"{JOBS}/{waiting.id}/cancel")
    assert response.status_code == 200
    assert response.json()["was"] == "RUNNING"

    body = assert_error(client.post(f"{JOBS}/{started.id}/cancel"), 409, "invalid_status")
    assert "started" in body["message"][0]
    assert Job.objects.filter(id=started.id, status=JobStatus.RUNNING).exists()


def test_cancel_of_a_row_in_flight_is_409(client: Client, targets: Any) -> None:
    """Marked in flight by a worker (``InflightMark``)."""
    targets("api.cancel.inflight")
    job = make_job("api.cancel.inflight")
    store.partitions_seed(64)
    InflightMark.objects.create(token="t", partition=job.partition, owner="w",
                                ids=[job.id - 1, job.id], marked_at=job.created_at)

    body = assert_error(client.post(f"{JOBS}/{job.id}/cancel"), 409, "invalid_status")

    assert "in flight" in body["message"][0]
    assert Job.objects.filter(id=job.id, status=JobStatus.PENDING).exists()


def test_cancel_of_a_dead_row_is_409(client: Client, targets: Any) -> None:
    targets("api.cancel.dead")
    job = make_job("api.cancel.dead", status=JobStatus.DEAD)
    assert_error(client.post(f"{JOBS}/{job.id}/cancel"), 409, "invalid_status")
    assert Job.objects.filter(id=job.id, status=JobStatus.DEAD).exists()


def test_a_huge_body_is_413_and_changes_nothing(client: Client, targets: Any) -> None:
    targets("api.huge")
    job = make_job("api.huge", status=JobStatus.DEAD)
    huge = json.dumps({"junk": "x" * (MAX_BODY_BYTES + 1)})

    for action in ("retry", "skip", "cancel"):
        response = client.post(f"{JOBS}/{job.id}/{action}", huge,
                               content_type="application/json")
        assert_error(response, 413, "body_too_large")

    assert Job.objects.get(id=job.id).status == JobStatus.DEAD
    assert not AuditRecord.objects.exists()


@pytest.mark.parametrize("body, content_type", [
    ("not json", "application/json"), ('{"force": true}', "application/json"),
    ("[]", "application/json"), ("null", "application/json"),
    ("force=1", "application/x-www-form-urlencoded"),
    ("&".join(f"f{i}=1" for i in range(1500)), "application/x-www-form-urlencoded"),
    ("--x\r\n", "multipart/form-data"),
])
def test_a_body_sent_to_a_route_that_takes_none_is_400_and_changes_nothing(
        client: Client, targets: Any, body: str, content_type: str) -> None:
    """The client believes the body means something; it must learn that it does not."""
    targets("api.body")
    job = make_job("api.body", status=JobStatus.DEAD)
    response = client.post(f"{JOBS}/{job.id}/retry", body, content_type=content_type)
    messages = assert_error(response, 400, "validation_error")["message"]
    if "force" in body:
        assert messages == ["body.force: unknown field (this route takes no body)"]
    assert Job.objects.get(id=job.id).status == JobStatus.DEAD
    assert not AuditRecord.objects.exists()
    # No body, only whitespace, or an empty object (what generic JSON clients send): fine.
    for nothing in ("", " \n", "{}", " { } "):
        response = client.post(f"{JOBS}/{job.id}/retry", nothing,
                               content_type="application/json")
        assert response.status_code in (200, 409), (nothing, response.content)  # 409: done
    assert Job.objects.get(id=job.id).status == JobStatus.PENDING


def test_an_unknown_query_parameter_is_400_on_an_action(client: Client, targets: Any) -> None:
    targets("api.query")
    job = make_job("api.query", status=JobStatus.DEAD)
    body = assert_error(client.post(f"{JOBS}/{job.id}/retry?force=1"), 400, "validation_error")
    assert body["message"] == ["query.force: unknown parameter"]
    assert Job.objects.get(id=job.id).status == JobStatus.DEAD


@pytest.mark.parametrize("query", ["code=", "key=", "target=&code=x", "status="])
def test_an_empty_filter_is_400_not_a_list_of_everything(client: Client, query: str) -> None:
    """An empty value reads as "not given" to the parser; the client asked to filter on
    something, so it is told, not handed every row."""
    body = assert_error(client.get(f"{JOBS}?{query}"), 400, "validation_error")
    assert any("must not be empty" in line or "query." in line for line in body["message"])


@pytest.mark.parametrize("query", ["code=a&code=b", "target=t&target=t", "page=1&page=2",
                                   "lane=fast&lane=long&key=k"])
def test_a_filter_given_twice_is_400_not_narrowed_to_the_last(client: Client, targets: Any,
                                                              query: str) -> None:
    """``?code=a&code=b`` would filter on ``b`` alone while the client asked for both."""
    targets("api.twice")
    make_job("api.twice", code="b")
    body = assert_error(client.get(f"{JOBS}?{query}"), 400, "validation_error")
    name = query.split("=")[0]
    assert f"query.{name}: given 2 times; give it once" in body["message"]


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_retries_one_200_one_409(targets: Any) -> None:
    targets("api.race")
    job = make_job("api.race", status=JobStatus.DEAD)
    first, second = manager("first"), manager("second")

    def post_as(user: User) -> Callable[[], int]:
        def run() -> int:
            api_client = Client()
            api_client.force_login(user)
            return api_client.post(f"{JOBS}/{job.id}/retry").status_code
        return run

    assert sorted(race(post_as(first), post_as(second))) == [200, 409]
    assert Job.objects.get(id=job.id).status == JobStatus.PENDING
    assert sorted(AuditRecord.objects.values_list("result", flat=True)) == ["ok", "refused"]


# -- OpenAPI -------------------------------------------------------------------------------


@pytest.mark.parametrize("page", ["docs", "openapi.json"])
def test_the_api_documentation_is_for_staff_unless_the_setting_says_otherwise(
        settings: Any, page: str) -> None:
    """It maps every route and field: anonymous callers and users who are not staff are
    sent to the login page; ``API_DOCS`` "public" opens it, "off" closes it to all."""
    url = f"/jobs/api/v1/{page}"
    from django.contrib.auth.models import User

    outsider = Client()
    outsider.force_login(User.objects.create_user("outsider", password="pw"))
    insider = Client()
    insider.force_login(staff())
    for refused in (Client().get(url), outsider.get(url)):
        assert refused.status_code == 302 and refused["Location"].startswith("/admin/login/")
    assert insider.get(url).status_code == 200
    settings.JOBS = {"API_DOCS": "public"}
    assert Client().get(url).status_code == 200
    settings.JOBS = {"API_DOCS": "off"}
    assert insider.get(url).status_code == 404


def test_openapi_docs_and_schema() -> None:
    staff_client = Client()
    staff_client.force_login(staff())
    docs = staff_client.get("/jobs/api/v1/docs")
    assert docs.status_code == 200 and b"swagger" in docs.content.lower()
    schema = staff_client.get("/jobs/api/v1/openapi.json").json()
    paths = schema["paths"]
    assert set(paths) >= {"/jobs/api/v1/jobs", "/jobs/api/v1/jobs/{job_id}",
                          "/jobs/api/v1/jobs/{job_id}/retry", "/jobs/api/v1/jobs/{job_id}/skip",
                          "/jobs/api/v1/jobs/{job_id}/cancel"}
    assert set(paths["/jobs/api/v1/jobs/{job_id}/retry"]["post"]["responses"]) >= {
        "200", "401", "403", "404", "409"}
