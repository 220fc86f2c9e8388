"""``/metrics`` in the Prometheus text format (the ``metrics`` extra: ``prometheus-client``).

Read from the database at each scrape, so every worker and web pod reports the same
cluster-wide numbers: backlog per lane, how overdue the oldest due row is, DEAD and
RUNNING rows, completed jobs kept per target, live workers, paused targets, runs per
target and outcome from the hourly statistics (summed over the hours kept), and for the
targets with limits the times their limits held a job back and their rows running.

Counts only, never payloads; still, they tell an outsider how busy the system is and which
targets exist, so the page is closed by default: a scraper sends
``Authorization: Bearer <JOBS["METRICS_TOKEN"]>``, and a logged-in user with the engine's
permission may read it in a browser, if that user is the platform operator (the numbers
are every tenant's). Anyone else gets 401 (or 403 when logged in).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from jobs_engine import registry, store
from jobs_engine.conf import jobs_settings
from jobs_engine.models import MANAGE_PERMISSION
from jobs_engine.states import JobStatus, Lane
from jobs_engine.tenancy import is_platform

MISSING_EXTRA = ("Prometheus metrics need prometheus-client: "
                 "pip install 'jobs-engine[metrics]'\n")


class JobsCollector:
    """Collects the engine's series from the database; ``now`` is fixed by tests."""

    def __init__(self, now: datetime | None = None) -> None:
        self.now = now

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        now = self.now or store.db_now()
        pending = store.jobs_pending_by_lane()
        backlog = GaugeMetricFamily("jobs_backlog", "PENDING job rows per lane.",
                                    labels=["lane"])
        overdue = GaugeMetricFamily(
            "jobs_oldest_pending_age_seconds",
            "Seconds the most overdue PENDING row of a lane has waited past its run time "
            "(0 when nothing is due).", labels=["lane"])
        for lane in Lane:
            count, earliest = pending.get(lane.value, (0, None))
            backlog.add_metric([lane.value], count)
            age = (now - earliest).total_seconds() if earliest is not None else 0.0
            overdue.add_metric([lane.value], max(age, 0.0))
        yield backlog
        yield overdue
        yield GaugeMetricFamily("jobs_dead", "DEAD job rows (kept until retried or skipped, "
                                "the newest keep_failed per target, at most DEAD_TTL_DAYS).",
                                value=store.jobs_count([JobStatus.DEAD.value]))
        done = GaugeMetricFamily("jobs_done", "Completed (DONE) jobs kept, by target (each "
                                 "target's policy keeps its newest keep_completed).",
                                 labels=["target"])
        for target, count in sorted(store.done_counts().items()):
            done.add_metric([target], count)
        yield done
        yield GaugeMetricFamily("jobs_running", "Long-lane rows RUNNING now.",
                                value=store.jobs_count([JobStatus.RUNNING.value]))
        live = store.workers_live(now, jobs_settings().PARTITION_LEASE_S)
        yield GaugeMetricFamily("jobs_workers_live", "Worker processes with a fresh heartbeat.",
                                value=len(live))
        outages = CounterMetricFamily(
            "jobs_worker_database_outages", "Database outages a worker process rode out "
            "(reported at its first heartbeat after each).", labels=["worker"])
        lasted = GaugeMetricFamily("jobs_worker_last_database_outage_seconds",
                                   "How long the last database outage of a worker lasted.",
                                   labels=["worker"])
        for worker_id, count, seconds in store.workers_outages():
            outages.add_metric([worker_id], count)
            lasted.add_metric([worker_id], seconds)
        yield outages
        yield lasted
        paused = GaugeMetricFamily("jobs_target_paused",
                                   "1 while a target is paused (unreachable, disabled or by hand).",
                                   labels=["target"])
        for pause in store.pauses_all():
            paused.add_metric([pause.target], 1)
        yield paused
        runs = CounterMetricFamily("jobs_runs", "Job runs by target and outcome (ok, retried, "
                                   "paused, dead, throttled), from the hourly statistics.",
                                   labels=["target", "outcome"])
        for target, outcome, count in store.job_stats_totals():
            runs.add_metric([target, outcome], count)
        yield runs
        # The targets with limits: those this process registers (0 before their first
        # admission), and those the buckets and running rows name.
        limited = {t.name for t in registry.all_targets() if t.limits}
        held = store.limits_throttled_by_target()
        running = store.limits_running_by_target()
        throttled = CounterMetricFamily(
            "jobs_throttled", "Times a target's limits held a due job back (a slot or a "
            "token missing, or a RateLimited answer), summed over its limits' keys.",
            labels=["target"])
        for target in sorted(limited | held.keys()):
            throttled.add_metric([target], held.get(target, 0))
        yield throttled
        limited_running = GaugeMetricFamily(
            "jobs_limited_running", "Rows RUNNING now of each target with limits.",
            labels=["target"])
        for target in sorted(limited | held.keys() | running.keys()):
            limited_running.add_metric([target], running.get(target, 0))
        yield limited_running


def render(now: datetime | None = None) -> bytes:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobsCollector(now))
    return generate_latest(registry)


def _refusal(request: HttpRequest) -> HttpResponse | None:
    """None when the request may read the metrics, else the answer that refuses it."""
    token = jobs_settings().METRICS_TOKEN
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if token and scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), token.encode()):
        return None
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        if not (user.is_active and user.has_perm(MANAGE_PERMISSION)):
            return HttpResponse(f"the {MANAGE_PERMISSION} permission is required\n",
                                status=403, content_type="text/plain")
        if not is_platform(request):
            return HttpResponse("the metrics count every tenant's jobs: the platform "
                                "operator's only\n", status=403, content_type="text/plain")
        return None
    refused = HttpResponse("send Authorization: Bearer <JOBS METRICS_TOKEN>, or log in\n",
                           status=401, content_type="text/plain")
    refused["WWW-Authenticate"] = 'Bearer realm="jobs-engine metrics"'
    return refused


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus scrape endpoint (see the module docstring for who may read it)."""
    refused = _refusal(request)
    if refused is not None:
        return refused
    try:
        from prometheus_client import CONTENT_TYPE_LATEST
    except ImportError:
        return HttpResponse(MISSING_EXTRA, status=501, content_type="text/plain")
    return HttpResponse(render(), content_type=CONTENT_TYPE_LATEST)
