"""The operators' Django admin (docs/operations.md#access): job list filters and exact
search, the detail page, retry/skip/cancel single and bulk with refusal messages, no
full-table count on a list page, partitions and workers, paused targets, statistics and
the audit trail; filter, search and id input that no column can hold (NUL, which
PostgreSQL refuses) lists nothing or names no row on every page, never a 500. Who sees
what: tests/db/test_access.py."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from jobs_engine import conf, store
from jobs_engine.enqueueing import enqueue_many
from jobs_engine.lanes.partitions import PartitionLeases
from jobs_engine.models import AuditRecord, Job, TargetPause
from jobs_engine.operators import queries
from jobs_engine.states import JobStatus
from tests.db.operator_helpers import make_job, manager_client, staff
from tests.helpers import FakeMonotonic

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:jobs_engine_job_changelist")


@pytest.fixture
def client() -> Client:
    return manager_client()


def listed(response: Any) -> list[int]:
    assert response.status_code == 200, response.content[:500]
    return [job.id for job in response.context["cl"].result_list]


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def change_url(job_id: int) -> str:
    return reverse("admin:jobs_engine_job_change", args=[job_id])


# -- access --------------------------------------------------------------------------------


def test_only_managers_see_the_jobs(targets: Any) -> None:
    anonymous = Client().get(CHANGELIST)
    assert anonymous.status_code == 302 and "/admin/login/" in anonymous["Location"]
    other = Client()
    other.force_login(staff())
    assert other.get(CHANGELIST).status_code == 403
    targets("adm.access")
    job = make_job("adm.access", status=JobStatus.DEAD)
    assert other.post(reverse("admin:jobs_engine_job_retry", args=[job.id])).status_code == 403
    assert Job.objects.get(id=job.id).status == JobStatus.DEAD


# -- list, filters, search -----------------------------------------------------------------


def test_list_filters_by_status_target_code_lane_and_key(client: Client, targets: Any) -> None:
    targets("adm.fast")
    targets("adm.long", lane="long")
    dead = make_job("adm.fast", status=JobStatus.DEAD, code="order.paid", key="o-1")
    pending = make_job("adm.fast", code="order.shipped", key="o-2")
    long_row = make_job("adm.long", code="export")

    assert listed(client.get(CHANGELIST)) == [long_row.id, pending.id, dead.id]
    assert listed(client.get(CHANGELIST, {"status": "DEAD"})) == [dead.id]
    assert listed(client.get(CHANGELIST, {"target": "adm.fast"})) == [pending.id, dead.id]
    assert listed(client.get(CHANGELIST, {"code": "order.shipped"})) == [pending.id]
    assert listed(client.get(CHANGELIST, {"lane": "long"})) == [long_row.id]
    assert listed(client.get(CHANGELIST, {"key": "o-1"})) == [dead.id]
    assert listed(client.get(CHANGELIST, {"status": "PENDING", "lane": "fast"})) == [pending.id]


def test_filter_sidebar_offers_registered_targets_and_text_inputs(client: Client,
                                                                  targets: Any) -> None:
    targets("adm.sidebar.one")
    content = client.get(CHANGELIST).content.decode()
    assert "?target=adm.sidebar.one" in content
    assert 'name="code"' in content and 'name="key"' in content
    assert "?status=DEAD" in content and "?lane=long" in content


def test_search_is_exact_on_key_or_dedupe_key(client: Client, targets: Any) -> None:
    targets("adm.search")
    by_key = make_job("adm.search", key="order-42")
    other = make_job("adm.search", key="order-420")

    assert listed(client.get(CHANGELIST, {"q": "order-42"})) == [by_key.id]
    assert listed(client.get(CHANGELIST, {"q": other.dedupe_key})) == [other.id]
    assert listed(client.get(CHANGELIST, {"q": "order"})) == []  # not a substring search


def test_a_list_page_over_many_rows_counts_no_whole_table(
        client: Client, targets: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    targets("adm.many")
    enqueue_many([{"target": "adm.many", "payload": {"i": i}, "dedupe_key": f"adm.many:{i}"}
                  for i in range(1200)])
    monkeypatch.setattr(queries, "COUNT_CAP", 1000)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {Job._meta.db_table}")

    with CaptureQueriesContext(connection) as captured:
        response = client.get(CHANGELIST)

    assert len(listed(response)) == 100
    counts = [q["sql"] for q in captured.captured_queries if "COUNT(" in q["sql"].upper()]
    assert counts, "the paginator counts (capped)"
    for sql in counts:
        assert "LIMIT" in sql.upper(), f"unbounded count: {sql}"
    count = response.context["cl"].result_count
    if connection.vendor == "postgresql":
        assert count >= 1200  # past the cap, unfiltered: the planner's estimate
    else:
        assert count == 1001  # past the cap: "more than 1000"
    assert response.context["cl"].paginator.num_pages >= 11
    # A filtered page past the cap shows the capped count, never a full count.
    filtered = client.get(CHANGELIST, {"target": "adm.many", "p": 3})
    assert filtered.context["cl"].result_count == 1001
    assert len(listed(filtered)) == 100


# -- detail --------------------------------------------------------------------------------


def test_detail_page_shows_payload_headers_error_attempts_and_next_run(client: Client,
                                                                       targets: Any) -> None:
    targets("adm.detail")
    job = make_job("adm.detail", status=JobStatus.DEAD, payload={"order": "o-<7>"},
                   headers={"event_id": "evt-123"})

    response = client.get(change_url(job.id))

    content = response.content.decode()
    assert response.status_code == 200
    assert "&quot;order&quot;: &quot;o-&lt;7&gt;&quot;" in content  # pretty JSON, escaped
    assert "evt-123" in content
    assert "RuntimeError: boom (attempt 6 of 6)" in content
    assert "Attempts" in content and "Next run at" in content
    assert reverse("admin:jobs_engine_job_retry", args=[job.id]) in content
    assert reverse("admin:jobs_engine_job_skip", args=[job.id]) in content
    assert reverse("admin:jobs_engine_job_cancel", args=[job.id]) not in content


def test_detail_page_of_a_pending_row_offers_cancel(client: Client, targets: Any) -> None:
    targets("adm.detail.pending")
    job = make_job("adm.detail.pending")
    content = client.get(change_url(job.id)).content.decode()
    assert reverse("admin:jobs_engine_job_cancel", args=[job.id]) in content
    assert reverse("admin:jobs_engine_job_retry", args=[job.id]) not in content


# -- single-row actions --------------------------------------------------------------------


def test_retry_button(client: Client, targets: Any) -> None:
    targets("adm.one.retry")
    job = make_job("adm.one.retry", status=JobStatus.DEAD)

    response = client.post(reverse("admin:jobs_engine_job_retry", args=[job.id]))

    assert response.status_code == 302 and response["Location"] == change_url(job.id)
    assert messages_of(response) == [f"Job {job.id} is PENDING again, due now."]
    assert Job.objects.get(id=job.id).status == JobStatus.PENDING
    assert AuditRecord.objects.get(action="retry").username == "manager"


def test_retry_button_on_a_pending_row_is_refused_with_a_message(client: Client,
                                                                 targets: Any) -> None:
    targets("adm.one.refused")
    job = make_job("adm.one.refused")

    response = client.post(reverse("admin:jobs_engine_job_retry", args=[job.id]))

    assert response["Location"] == change_url(job.id)
    assert messages_of(response) == [
        f"Not done: job {job.id} is PENDING; retry needs a DEAD row"]
    assert Job.objects.get(id=job.id).status == JobStatus.PENDING


def test_skip_and_cancel_buttons(client: Client, targets: Any) -> None:
    targets("adm.one.rm")
    dead = make_job("adm.one.rm", status=JobStatus.DEAD)
    pending = make_job("adm.one.rm")

    skipped = client.post(reverse("admin:jobs_engine_job_skip", args=[dead.id]))
    cancelled = client.post(reverse("admin:jobs_engine_job_cancel", args=[pending.id]))

    assert skipped["Location"] == CHANGELIST and cancelled["Location"] == CHANGELIST
    assert messages_of(cancelled)[-1] == f"Job {pending.id} cancelled (row deleted)."
    assert not Job.objects.filter(id__in=[dead.id, pending.id]).exists()
    gone = client.post(reverse("admin:jobs_engine_job_skip", args=[dead.id]))
    assert gone["Location"] == CHANGELIST
    assert messages_of(gone)[-1] == f"Not done: job {dead.id} does not exist"


@pytest.mark.parametrize("raw", ["abc", "0", "%00", "9" * 30])
def test_buttons_on_malformed_ids_answer_with_a_message(client: Client, raw: str) -> None:
    response = client.post(f"{CHANGELIST}{raw}/retry/")
    assert response.status_code == 302 and response["Location"] == CHANGELIST
    [message] = messages_of(response)
    assert message.startswith("Not done: job ") and message.endswith(" does not exist")
    assert AuditRecord.objects.get().result == "refused"


def test_action_urls_take_post_only(client: Client, targets: Any) -> None:
    targets("adm.one.get")
    job = make_job("adm.one.get", status=JobStatus.DEAD)
    assert client.get(reverse("admin:jobs_engine_job_retry", args=[job.id])).status_code == 405
    assert Job.objects.get(id=job.id).status == JobStatus.DEAD


# -- bulk actions --------------------------------------------------------------------------


def bulk(client: Client, action: str, ids: list[int]) -> Any:
    return client.post(CHANGELIST, {"action": action, "_selected_action": ids}, follow=True)


def test_bulk_retry_reports_counts_and_refusals(client: Client, targets: Any) -> None:
    targets("adm.bulk.retry")
    dead = [make_job("adm.bulk.retry", status=JobStatus.DEAD) for _ in range(2)]
    pending = make_job("adm.bulk.retry")

    response = bulk(client, "retry_selected", [j.id for j in [*dead, pending]])

    found = messages_of(response)
    assert "Retried 2 job(s)." in found
    assert (f"Refused 1 job(s): job {pending.id} is PENDING; retry needs a DEAD row"
            in found)
    assert set(Job.objects.values_list("status", flat=True)) == {JobStatus.PENDING}
    assert AuditRecord.objects.filter(action="retry", result="ok").count() == 2
    assert AuditRecord.objects.filter(action="retry", result="refused").count() == 1


def test_bulk_skip_and_cancel(client: Client, targets: Any) -> None:
    targets("adm.bulk.rm")
    dead = make_job("adm.bulk.rm", status=JobStatus.DEAD)
    pending = [make_job("adm.bulk.rm") for _ in range(3)]

    skipped = messages_of(bulk(client, "skip_selected", [dead.id, pending[0].id]))
    assert "Skipped 1 job(s)." in skipped
    assert any(m.startswith("Refused 1 job(s)") for m in skipped)

    cancelled = messages_of(bulk(client, "cancel_selected", [j.id for j in pending]))
    assert "Cancelled 3 job(s)." in cancelled
    assert not Job.objects.exists()


def test_bulk_actions_are_not_offered_without_the_permission(targets: Any) -> None:
    from django.contrib.auth.models import Permission

    viewer_user = staff("viewer")
    viewer_user.user_permissions.add(Permission.objects.get(codename="view_job"))
    viewer = Client()
    viewer.force_login(viewer_user)
    targets("adm.viewer")
    job = make_job("adm.viewer", status=JobStatus.DEAD)

    content = viewer.get(CHANGELIST).content.decode()
    assert "retry_selected" not in content
    response = bulk(viewer, "retry_selected", [job.id])
    assert Job.objects.get(id=job.id).status == JobStatus.DEAD
    assert response.status_code == 403  # refused, not a list that silently did nothing
    assert not AuditRecord.objects.exists()


# -- input no column can hold (PostgreSQL refuses NUL in text) ----------------------------


def engine_admins() -> list[tuple[str, Any]]:
    """Every admin page over table rows of the engine's and the schedules' models (the
    targets' page reads the registry: test_completed_jobs_operators.py; the statistics
    page sums buckets: test_statistics_page_charts_the_last_48_hours; the limits' page
    reads the registry and the buckets: test_limits_operators.py)."""
    from django.contrib import admin

    from jobs_engine.operators.admin import JobStatAdmin, RegisteredTargetAdmin
    from jobs_engine.operators.admin_base import ManagedAdmin
    from jobs_engine.operators.limits_admin import TargetLimitAdmin

    pages = RegisteredTargetAdmin | JobStatAdmin | TargetLimitAdmin
    return sorted(((f"{model._meta.app_label}_{model._meta.model_name}", model_admin)
                   for model, model_admin in admin.site._registry.items()
                   if isinstance(model_admin, ManagedAdmin)
                   and not isinstance(model_admin, pages)),
                  key=lambda item: item[0])


def query_parameters(model_admin: Any) -> list[str]:
    """The search box, every list filter's parameters, every text column as a lookup, the
    statistics chart's ``target``, sort and page."""
    from django.contrib.admin import SimpleListFilter
    from django.db.models import CharField, TextField

    names = {"target", "o", "p", *(["q"] if model_admin.search_fields else [])}
    for spec in model_admin.list_filter:
        if isinstance(spec, type) and issubclass(spec, SimpleListFilter):
            names.add(spec.parameter_name)
        else:
            names |= {spec, f"{spec}__exact"}
    names |= {field.name for field in model_admin.model._meta.fields
              if isinstance(field, CharField | TextField)}
    return sorted(names)


BAD_TEXT = ["%00", "a%00b", "%ED%A0%80", "%00%ED%A0%80"]  # NUL; a lone surrogate's UTF-8
ADMINS = engine_admins()
ADMIN_IDS = [name for name, _ in ADMINS]


@pytest.mark.parametrize("name, model_admin", ADMINS, ids=ADMIN_IDS)
def test_filter_and_search_text_no_row_can_hold_lists_nothing(
        client: Client, targets: Any, name: str, model_admin: Any) -> None:
    targets("adm.nul")
    make_job("adm.nul", code="c", key="k")
    url = reverse(f"admin:{name}_changelist")
    for parameter in query_parameters(model_admin):
        for raw in BAD_TEXT:
            response = client.get(f"{url}?{parameter}={raw}")
            where = (name, parameter, raw, response.status_code)
            # An empty list, or Django's own answer to a lookup it refuses (?e=1, 400).
            assert response.status_code in (200, 302, 400), where
            if response.status_code == 200:
                listed_rows = response.context["cl"].result_list
                assert not listed_rows or parameter in ("o", "p"), where  # sort, page
            if response.status_code == 302:
                assert response["Location"].endswith("?e=1"), where


@pytest.mark.parametrize("name, model_admin", ADMINS, ids=ADMIN_IDS)
def test_ids_no_row_can_hold_name_no_row(client: Client, name: str, model_admin: Any) -> None:
    changelist = reverse(f"admin:{name}_changelist")
    for raw in ("%00", "a%00b", "abc", "9" * 30):
        for page in ("change", "history"):
            response = client.get(f"{changelist}{raw}/{page}/")
            assert response.status_code == 302, (name, raw, page, response.status_code)
        for action in model_admin.actions or ():
            selected = raw.replace("%00", "\x00")
            response = client.post(changelist, {"action": action,
                                                "_selected_action": [selected]})
            assert response.status_code in (200, 302), (name, raw, action)
    assert not AuditRecord.objects.filter(result="ok").exists()


# -- partitions, workers, paused targets ---------------------------------------------------


def test_partitions_and_workers_show_owner_lease_age_and_liveness(client: Client,
                                                                  now: datetime) -> None:
    settings = conf.jobs_settings()
    store.partitions_seed(settings.PARTITIONS)
    leases = PartitionLeases("worker-a:1:abc", settings, monotonic=FakeMonotonic())
    leases.heartbeat(now - timedelta(seconds=5))
    store.worker_beat("worker-gone:2:def", now - timedelta(minutes=5), hostname="h", pid=2,
                      lanes="fast")

    partitions = client.get(reverse("admin:jobs_engine_partition_changelist"))
    content = partitions.content.decode()
    assert partitions.status_code == 200
    assert content.count("worker-a:1:abc") == 64
    assert re.search(r"[56] s ago", content)  # lease age: renewed 5 s ago

    workers = client.get(reverse("admin:jobs_engine_worker_changelist"))
    rows = {w.worker_id: w for w in workers.context["cl"].result_list}
    assert rows["worker-a:1:abc"].held == 64
    assert rows["worker-gone:2:def"].held == 0
    admin_page = workers.context["cl"].model_admin
    assert admin_page.live(rows["worker-a:1:abc"]) is True
    assert admin_page.live(rows["worker-gone:2:def"]) is False
    assert 'alt="True"' in workers.content.decode() and 'alt="False"' in workers.content.decode()


def test_paused_targets_show_reason_and_resume(client: Client, now: datetime) -> None:
    store.pause_set("kafka:orders", now, 30, "TargetUnreachable: broker down")
    url = reverse("admin:jobs_engine_targetpause_changelist")

    content = client.get(url).content.decode()
    assert "kafka:orders" in content and "TargetUnreachable: broker down" in content

    response = client.post(url, {"action": "resume_selected",
                                 "_selected_action": ["kafka:orders"]}, follow=True)
    assert "Resumed 1 target(s)." in messages_of(response)
    assert not TargetPause.objects.exists()
    assert AuditRecord.objects.get(action="resume").object_id == "kafka:orders"


# -- statistics and audit ------------------------------------------------------------------


def test_statistics_page_charts_the_last_48_hours(client: Client) -> None:
    from django.utils import timezone

    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    bucket = store.StatBucket
    store.job_stats_add({bucket(hour, "kafka:orders", "ok", ""): 7,
                         bucket(hour, "kafka:orders", "dead", "acme"): 1,
                         bucket(hour - timedelta(hours=3), "mail", "retried", ""): 2,
                         bucket(hour - timedelta(hours=60), "mail", "ok", ""): 99})
    store.job_stats_add({bucket(hour, "mail", "ok", ""): 4})  # another session's shard

    response = client.get(reverse("admin:jobs_engine_jobstat_changelist"))

    chart = response.context["chart"]
    assert len(chart) == 48
    assert chart[-1]["total"] == 12 and chart[-4]["total"] == 2
    assert sum(h["total"] for h in chart) == 14  # the 60-hour-old bucket is outside
    assert 'id="job-stats-chart"' in response.content.decode()
    assert response.context["totals"] == [
        {"target": "kafka:orders", "counts": [7, 0, 0, 0, 1]},  # ok, retried, paused,
        {"target": "mail", "counts": [4, 2, 0, 0, 0]}]           # throttled, dead
    filtered = client.get(reverse("admin:jobs_engine_jobstat_changelist"), {"target": "mail"})
    assert sum(h["total"] for h in filtered.context["chart"]) == 6
    for raw in BAD_TEXT:  # a target no row can hold charts nothing
        nothing = client.get(f"{reverse('admin:jobs_engine_jobstat_changelist')}?target={raw}")
        assert nothing.status_code == 200 and sum(h["total"] for h in nothing.context["chart"]) == 0


def test_audit_trail_lists_who_did_what(client: Client, targets: Any) -> None:
    targets("adm.audit")
    job = make_job("adm.audit", status=JobStatus.DEAD)
    client.post(reverse("admin:jobs_engine_job_retry", args=[job.id]))
    client.post(reverse("admin:jobs_engine_job_retry", args=[job.id]))

    response = client.get(reverse("admin:jobs_engine_auditrecord_changelist"))

    records = list(response.context["cl"].result_list)
    assert [(r.action, r.result, r.username) for r in records] == [
        ("retry", "refused", "manager"), ("retry", "ok", "manager")]
