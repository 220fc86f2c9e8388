"""Schedules in the operators' admin: every row with its cron, override, zone, next run (in
the schedule's zone), last run and last skip with its reason; actions enable, disable,
set override (an intermediate form that validates the cron in each schedule's zone), clear
override and run now.

Rows are never edited here: every action calls ``contrib.schedules.operations``, which writes the
audit record. Users with ``jobs_engine.manage_jobs`` see and act, as on the jobs pages, on
their tenant's schedules (``tenancy``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html

from jobs_engine.contrib.schedules import operations
from jobs_engine.contrib.schedules.models import Schedule
from jobs_engine.errors import OperationRefused
from jobs_engine.operators.actions import audit
from jobs_engine.operators.admin_base import BULK_LIMIT, ManagedAdmin, run_bulk
from jobs_engine.tenancy import tenant_of


def _when(moment: datetime | None, zone: str) -> str:
    """Wall time in the schedule's zone, UTC in the tooltip."""
    if moment is None:
        return "-"
    return format_html('<span title="{}">{}</span>',
                       operations.local_text(moment, "UTC"),
                       operations.local_text(moment, zone))


def _cron(expression: str) -> str:
    return format_html('<code style="white-space: nowrap">{}</code>', expression)


class CronOverrideForm(forms.Form):
    """The cron text of the set-override action, valid in the zone of every selected
    schedule (``clean`` reads it as the service will)."""

    cron_override = forms.CharField(
        label="Cron override", strip=True,
        help_text="5 fields (minute hour day-of-month month day-of-week) or 6 with seconds "
                  "first, read in each schedule's time zone; e.g. */10 * * * *.",
        widget=forms.TextInput(attrs={"size": 40, "autofocus": True}))

    def __init__(self, *args: Any, schedules: list[Schedule], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.schedules = schedules

    def clean_cron_override(self) -> str:
        cron: str = self.cleaned_data["cron_override"]  # a CharField's
        for row in self.schedules:
            try:
                operations.check_cron(cron, row)
            except OperationRefused as exc:
                raise forms.ValidationError(exc.message) from None
        return cron


@admin.register(Schedule)
class ScheduleAdmin(ManagedAdmin[Schedule]):
    list_display = ("code", "cron_text", "override", "timezone", "enabled", "next_run",
                    "last_run", "last_skip")
    list_display_links = ("code",)
    list_filter = ("enabled",)
    ordering = ("code",)
    sortable_by = ("code",)
    actions = ("enable_selected", "disable_selected", "set_override", "clear_override",
               "run_now_selected")
    fieldsets = (
        (None, {"fields": ("code", "enabled", "cron", "cron_override", "timezone",
                           "missed_slot_policy", "max_attempts", "tenant_id")}),
        ("Runs", {"fields": ("next_run", "next_run_at", "last_run", "last_finished_at",
                             "last_skip", "updated_at")}),
    )
    readonly_fields = ("next_run", "last_run", "last_skip")

    @admin.display(description="cron")
    def cron_text(self, obj: Schedule) -> str:
        return _cron(obj.cron)

    @admin.display(description="override")
    def override(self, obj: Schedule) -> str:
        return _cron(obj.cron_override) if obj.cron_override else "-"

    @admin.display(description="next run (schedule's zone)")
    def next_run(self, obj: Schedule) -> str:
        return _when(obj.next_run_at, obj.timezone)

    @admin.display(description="last run")
    def last_run(self, obj: Schedule) -> str:
        return _when(obj.last_run_at, obj.timezone)

    @admin.display(description="last skip")
    def last_skip(self, obj: Schedule) -> str:
        if obj.last_skipped_at is None:
            return "-"
        return format_html("{} — {}", _when(obj.last_skipped_at, obj.timezone),
                           obj.last_skip_reason or "no reason recorded")

    # -- actions ---------------------------------------------------------------------------

    def _each(self, request: HttpRequest, queryset: QuerySet[Schedule], verb: str,
              action: Callable[..., Any],
              describe: Callable[[str, Any], str] | None = None) -> None:
        """``run_bulk`` over the selected codes, each named in the message, in the user's
        tenant."""
        codes = list(queryset.order_by("code").values_list("code", flat=True)[:BULK_LIMIT + 1])
        scope = tenant_of(request)
        run_bulk(self, request, codes, verb, "schedule",
                 lambda code, user: action(code, user, scope=scope),
                 describe or (lambda code, _result: code))

    @admin.action(description="Enable selected schedules", permissions=["manage"])
    def enable_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._each(request, queryset, "Enabled", operations.enable,
                   lambda code, row: f"{code} (next run {operations.next_run_text(row)})")

    @admin.action(description="Disable selected schedules", permissions=["manage"])
    def disable_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._each(request, queryset, "Disabled", operations.disable)

    @admin.action(description="Clear the cron override of selected schedules",
                  permissions=["manage"])
    def clear_override(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._each(request, queryset, "Cleared the override of", operations.clear_cron_override,
                   lambda code, row: f"{code} (on {row.cron}, next run "
                                     f"{operations.next_run_text(row)})")

    @admin.action(description="Run selected schedules now (one extra run)",
                  permissions=["manage"])
    def run_now_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        def describe(code: str, result: Any) -> str:
            if result.inserted:
                return f"{code} (job {result.job_id})"
            return f"{code} (already requested this second, no new job)"

        self._each(request, queryset, "Started", operations.run_now, describe)

    @admin.action(description="Set the cron override of selected schedules…",
                  permissions=["manage"])
    def set_override(self, request: HttpRequest, queryset: QuerySet[Schedule]
                     ) -> TemplateResponse | None:
        """First call: the form. Submitted (``apply``): validated in every selected
        schedule's zone, then applied to each; a bad cron changes nothing, is audited as
        refused and shows the form again with the problem."""
        rows = list(queryset.order_by("code")[:BULK_LIMIT])
        if "apply" in request.POST:
            form = CronOverrideForm(request.POST, schedules=rows)
            if form.is_valid():
                cron = form.cleaned_data["cron_override"]
                self._each(request, queryset.filter(pk__in=[r.pk for r in rows]),
                           "Set the override of",
                           lambda code, user, scope: operations.set_cron_override(
                               code, cron, user, scope=scope),
                           lambda code, row: f"{code} (on {row.cron_override}, next run "
                                             f"{operations.next_run_text(row)})")
                return None  # back to the list, with the messages
            problem = "; ".join(map(str, form.errors.get("cron_override", ["invalid"])))
            for row in rows:
                audit(request.user, operations.OVERRIDE, operations.SCHEDULE, row.code,
                      ok=False, message=problem, scope=tenant_of(request))
        else:
            initial = rows[0].cron_override or rows[0].cron if len(rows) == 1 else ""
            form = CronOverrideForm(initial={"cron_override": initial}, schedules=rows)
        context = {
            **self.admin_site.each_context(request),
            "title": "Set cron override",
            "opts": self.model._meta,
            "form": form,
            "schedules": [(row, operations.next_run_text(row)) for row in rows],
            "action_name": "set_override",
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "media": self.media,
        }
        return TemplateResponse(
            request, "admin/jobs_engine_schedules/schedule/set_override.html", context)
