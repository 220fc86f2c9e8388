"""``/metrics`` in the Prometheus text format (``prometheus-client``).

Read from the database at each scrape, so every worker and web pod reports the same
cluster-wide numbers: backlog per lane, how overdue the oldest due row is, DEAD and
RUNNING rows, live workers, paused targets, and runs per target and outcome from the
hourly statistics (summed over the hours kept).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from jobs_engine import store
from jobs_engine.conf import jobs_settings
from jobs_engine.states import JobStatus, Lane


class JobsCollector(Collector):
    """Collects the engine's series from the database; ``now`` is fixed by tests."""

    def __init__(self, now: datetime | None = None) -> None:
        self.now = now

    def collect(self) -> Iterator[Metric]:
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
        yield GaugeMetricFamily("jobs_dead", "DEAD job rows (kept until retried, skipped or "
                                "pruned after DEAD_TTL_DAYS).",
                                value=store.jobs_count([JobStatus.DEAD.value]))
        yield GaugeMetricFamily("jobs_running", "Long-lane rows RUNNING now.",
                                value=store.jobs_count([JobStatus.RUNNING.value]))
        live = store.workers_live(now, jobs_settings().PARTITION_LEASE_S)
        yield GaugeMetricFamily("jobs_workers_live", "Worker processes with a fresh heartbeat.",
                                value=len(live))
        paused = GaugeMetricFamily("jobs_target_paused",
                                   "1 while a target is paused (unreachable or disabled).",
                                   labels=["target"])
        for pause in store.pauses_all():
            paused.add_metric([pause.target], 1)
        yield paused
        runs = CounterMetricFamily("jobs_runs", "Job runs by target and outcome (ok, retried, "
                                   "paused, dead), from the hourly statistics.",
                                   labels=["target", "outcome"])
        for target, outcome, count in store.job_stats_totals():
            runs.add_metric([target, outcome], count)
        yield runs


def render(now: datetime | None = None) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobsCollector(now))
    return generate_latest(registry)


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus scrape endpoint (no auth: it shows counts, never payloads; keep it on
    an internal network)."""
    return HttpResponse(render(), content_type=CONTENT_TYPE_LATEST)
