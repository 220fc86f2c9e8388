"""What operators see of policies and completed jobs: the admin's DONE filter, the
completed job's page (result as escaped, pretty JSON; the policy of its target), the
targets' page, the API's ``result`` and ``status=DONE`` list, ``/metrics``' ``jobs_done``,
and actions on a DONE job refused with the reason. Who may see what: test_access.py."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from jobs_engine import RUN_ONCE_POLICY, JobPolicy
from jobs_engine.models import AuditRecord, CompletedJob
from jobs_engine.operators import metrics
from jobs_engine.states import JobStatus
from tests.db.operator_helpers import make_job, manager_client
from tests.db.test_stats import families

pytestmark = pytest.mark.django_db

API = "/jobs/api/v1/jobs"
JOBS = reverse("admin:jobs_engine_job_changelist")
COMPLETED = reverse("admin:jobs_engine_completedjob_changelist")
TARGETS = reverse("admin:jobs_engine_registeredtarget_changelist")


@pytest.fixture
def client() -> Client:
    return manager_client()


def completed(job_id: int, target: str, result: Any = None, **fields: Any) -> CompletedJob:
    now = timezone.now()
    values: dict[str, Any] = {
        "id": job_id, "target": target, "lane": "fast", "code": target,
        "dedupe_key": f"done-{job_id}", "delivery_mode": "at_most_once",
        "payload": {"n": job_id}, "result": result, "attempts": 2, "created_at": now,
        "started_at": now, "finished_at": now, "duration_ms": 12.0, **fields}
    return CompletedJob.objects.create(**values)


# -- admin ------------------------------------------------------------------------------------


def test_the_status_filter_offers_done_and_opens_the_completed_jobs(client: Client,
                                                                    targets: Any) -> None:
    targets("op.mail")
    page = client.get(JOBS)
    assert "?status=DONE" in page.content.decode()
    moved = client.get(JOBS, {"status": "DONE", "target": "op.mail", "o": "1"})
    assert moved.status_code == 302
    assert moved["Location"] == f"{COMPLETED}?target=op.mail"
    back = client.get(COMPLETED, {"status": "DEAD", "target": "op.mail"})
    assert back["Location"] == f"{JOBS}?status=DEAD&target=op.mail"


def test_the_completed_jobs_list_filters_by_target(client: Client, targets: Any) -> None:
    targets("op.a")
    targets("op.b")
    completed(9001, "op.a")
    completed(9002, "op.b")
    completed(9003, "op.a")
    page = client.get(COMPLETED, {"target": "op.a"})
    assert page.status_code == 200
    assert [row.id for row in page.context["cl"].result_list] == [9003, 9001]
    assert "12 ms" in page.content.decode()


def test_the_completed_job_page_shows_the_result_escaped_and_the_policy(client: Client,
                                                                        targets: Any) -> None:
    targets("op.charge", policy=RUN_ONCE_POLICY)
    completed(9010, "op.charge", result={"receipt": "<script>alert(1)</script>", "n": [1, 2]})
    page = client.get(reverse("admin:jobs_engine_completedjob_change", args=[9010]))
    assert page.status_code == 200
    content = page.content.decode()
    assert "<script>alert(1)</script>" not in content
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in content
    assert '&quot;n&quot;: [\n    1,\n    2\n  ]' in content  # pretty: indented JSON
    assert "RUN_ONCE_POLICY: 1 attempt (run once); keeps 100 completed, 1000 failed" in content
    assert "DONE" in content


def test_a_jobs_page_shows_the_policy_and_follows_a_job_that_completed(client: Client,
                                                                       targets: Any) -> None:
    targets("op.own", policy=JobPolicy(attempts=4, backoff_s=10, keep_completed=5))
    job = make_job("op.own", status=JobStatus.DEAD)
    page = client.get(reverse("admin:jobs_engine_job_change", args=[job.id]))
    assert "4 attempts, waits 10 s, 20 s, 40 s; keeps 5 completed, 1000 failed" in \
        page.content.decode()
    completed(job.id + 500, "op.own")
    followed = client.get(reverse("admin:jobs_engine_job_change", args=[job.id + 500]))
    assert followed.status_code == 302
    assert followed["Location"] == reverse("admin:jobs_engine_completedjob_change",
                                           args=[job.id + 500])


def test_the_targets_page_lists_each_policy_and_the_jobs_kept(client: Client,
                                                              targets: Any) -> None:
    targets("op.events", delivery_mode="at_least_once", policy=JobPolicy(keep_completed=0))
    targets("op.report", lane="long", policy=RUN_ONCE_POLICY)
    completed(9020, "op.report")
    completed(9021, "op.report")
    make_job("op.events", status=JobStatus.DEAD)
    completed(9022, "op.removed")  # kept, but no target of this process registers it
    page = client.get(TARGETS)
    assert page.status_code == 200
    rows = {row["name"]: row for row in page.context["rows"]}
    events, report = rows["op.events"], rows["op.report"]
    assert (events["lane"], events["delivery_mode"], events["policy"].keep_completed,
            events["done"], events["dead"]) == ("fast", "at_least_once", 0, 0, 1)
    assert (report["lane"], report["policy_name"], report["done"]) == (
        "long", "RUN_ONCE_POLICY", 2)
    assert rows["op.removed"]["registered"] is False and rows["op.removed"]["done"] == 1
    content = page.content.decode()
    assert 'data-target="op.report"' in content and "not registered in this process" in content
    assert client.get(reverse("admin:index")).content.decode().count(TARGETS) >= 1
    assert client.get(TARGETS, {"target": "\x00", "o": "%ED"}).status_code == 200  # ignored
    assert client.post(TARGETS).status_code == 405  # nothing to act on


def test_actions_on_a_done_job_are_refused_naming_its_state(client: Client,
                                                           targets: Any) -> None:
    targets("op.done")
    completed(9030, "op.done")
    answer = client.post(f"{API}/9030/retry")
    assert answer.status_code == 409
    assert answer.json()["message"] == ["job 9030 is DONE; retry needs a DEAD row"]
    assert client.post(f"{API}/9030/cancel").status_code == 409
    assert CompletedJob.objects.filter(id=9030).exists()
    assert AuditRecord.objects.filter(object_id="9030", result="refused").count() == 2


# -- API and metrics -------------------------------------------------------------------------


def test_the_api_job_detail_returns_the_result(client: Client, targets: Any) -> None:
    targets("op.api")
    completed(9040, "op.api", result={"id": "msg-7"})
    body = client.get(f"{API}/9040").json()
    assert (body["status"], body["result"], body["attempts"], body["duration_ms"]) == (
        "DONE", {"id": "msg-7"}, 2, 12.0)
    assert body["payload"] == {"n": 9040} and body["next_run_at"] is None
    assert body["closed_at"] is not None
    waiting = make_job("op.api")
    pending = client.get(f"{API}/{waiting.id}").json()
    assert (pending["status"], pending["result"]) == ("PENDING", None)


def test_the_api_lists_done_jobs_with_the_other_filters(client: Client, targets: Any) -> None:
    targets("op.list")
    targets("op.other")
    completed(9050, "op.list")
    completed(9051, "op.other")
    completed(9052, "op.list", key="k-1")
    make_job("op.list")
    listed = client.get(API, {"status": "DONE", "target": "op.list"}).json()
    assert [row["id"] for row in listed["data"]] == [9052, 9050]
    assert {row["status"] for row in listed["data"]} == {"DONE"}
    assert "result" not in listed["data"][0]  # the list never carries the big columns
    keyed = client.get(API, {"status": "DONE", "key": "k-1"}).json()
    assert [row["id"] for row in keyed["data"]] == [9052]


def test_metrics_count_done_jobs_by_target(targets: Any, now: datetime) -> None:
    targets("op.m")
    for job_id in (9060, 9061, 9062):
        completed(job_id, "op.m")
    completed(9063, "op.n")
    found = families(metrics.render(now).decode())
    assert found["jobs_done"] == {(("target", "op.m"),): 3, (("target", "op.n"),): 1}
