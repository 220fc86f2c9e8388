"""A first admin: read-only views of jobs, partitions, workers and paused targets.

The full operator surface (actions, API, statistics) is built on top of this later.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from jobs_engine.models import Job, Partition, TargetPause, Worker


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = ("id", "status", "target", "code", "key", "version", "attempts",
                    "next_run_at", "closed_at")
    list_filter = ("status", "lane", "target")
    search_fields = ("=key", "=dedupe_key")
    show_full_result_count = False  # no full-table count on every page load


@admin.register(Partition)
class PartitionAdmin(ReadOnlyAdmin):
    list_display = ("partition", "owner", "lease_until", "inflight_token")


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    list_display = ("worker_id", "hostname", "pid", "lanes", "heartbeat_at", "started_at")


@admin.register(TargetPause)
class TargetPauseAdmin(ReadOnlyAdmin):
    list_display = ("target", "paused_until", "reason", "paused_at", "probe_by")
