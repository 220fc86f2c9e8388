"""The operators' admin: jobs (filters, exact key search, detail, retry/skip/cancel),
completed jobs kept by their target's policy (with results), the registered targets and
their policies, partitions and workers (who owns what, lease age, live or not), paused
targets (resume), hourly statistics (a 48-hour chart) and the audit trail.

Rows are never edited here: every action calls ``jobs_engine.operators.actions``, which
guards the change on the row's state and writes the audit record. What the pages share
(who sees what, capped lists, bulk actions) is in ``admin_base``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypedDict

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.views.decorators.http import require_GET, require_POST

from jobs_engine import registry, store
from jobs_engine.conf import jobs_settings
from jobs_engine.errors import JobNotFound, OperationRefused, UnknownTarget
from jobs_engine.models import (
    AuditRecord,
    CompletedJob,
    Job,
    JobStat,
    Partition,
    RegisteredTarget,
    TargetPause,
    Worker,
)
from jobs_engine.operators import actions
from jobs_engine.operators.admin_base import (
    BULK_LIMIT,
    EngineChangeList,
    ManagedAdmin,
    age,
    can_manage,
    hidden,
    pretty_json,
    run_bulk,
)
from jobs_engine.policies import DEFAULT_POLICY, RUN_ONCE_POLICY
from jobs_engine.states import JobStatus, Lane
from jobs_engine.tenancy import PLATFORM, Scope, is_platform, scoped, tenant_of

if TYPE_CHECKING:  # names of the type checker's only (django-stubs)
    from django.contrib.admin.filters import _ListFilterChoices
    from django_stubs_ext import WithAnnotations

    class _InFlight(TypedDict):  # PartitionAdmin's annotation
        rows_in_flight: int

    class _Held(TypedDict):  # WorkerAdmin's annotation
        held: int

# -- job list filters (none of them reads the table to build its choices) ------------------


class InputFilter(admin.SimpleListFilter):
    """A free-text filter: exact match on ``field``."""

    template = "admin/jobs_engine/input_filter.html"
    parameter_name: str
    field = ""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return []

    def has_output(self) -> bool:
        return True

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(**{self.field: value}) if value else queryset

    def choices(self, changelist: ChangeList) -> Iterator[dict[str, Any]]:  # type: ignore[override]  # input_filter.html reads its own keys, not those of Django's template
        keep = [(name, value) for name, value in changelist.params.items()
                if name != self.parameter_name]
        yield {"query_parts": keep, "value": self.value() or "",
               "clear": changelist.get_query_string(remove=[self.parameter_name])}


class CodeFilter(InputFilter):
    title = "code"
    parameter_name = field = "code"


class KeyFilter(InputFilter):
    title = "key"
    parameter_name = field = "key"


class ChoiceFilter(admin.SimpleListFilter):
    field = ""

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(**{self.field: value}) if value else queryset


class StatusFilter(ChoiceFilter):
    """Every status; DONE rows live in their own table, so choosing DONE opens the
    completed jobs' list (``JobAdmin.changelist_view``) and the other statuses open the
    jobs' list from there (``CompletedJobAdmin.changelist_view``)."""

    title = "status"
    parameter_name = field = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return list(JobStatus.choices)


class CompletedStatusFilter(StatusFilter):
    """The status filter of the completed jobs' list: DONE, always selected (another
    status opens the jobs' list; a value that is no status lists nothing)."""

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset if self.value() in (None, JobStatus.DONE) else queryset.none()

    def choices(self, changelist: ChangeList) -> Iterator[_ListFilterChoices]:
        for value, label in self.lookup_choices:
            yield {"selected": value == JobStatus.DONE, "display": label,
                   "query_string": changelist.get_query_string({self.parameter_name: value})}


class LaneFilter(ChoiceFilter):
    title = "lane"
    parameter_name = field = "lane"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return list(Lane.choices)


class TargetFilter(ChoiceFilter):
    """Choices from the target registry (never ``SELECT DISTINCT`` over the jobs)."""

    title = "target"
    parameter_name = field = "target"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = {target.name for target in registry.all_targets()}
        value = self.value()
        if value:
            names.add(value)
        return [(name, name) for name in sorted(names)]


def other_list(request: HttpRequest, model: str, drop: tuple[str, ...] = ()) -> HttpResponse:
    """The same filters (target, lane, code, key, search) on the list of ``model``."""
    query = request.GET.copy()
    for name in list(query):
        if name not in ("status", "target", "lane", "code", "key", "q") or name in drop:
            del query[name]
    url = reverse(f"admin:jobs_engine_{model}_changelist")
    return HttpResponseRedirect(f"{url}?{query.urlencode()}" if query else url)


class JobChangeList(EngineChangeList):
    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None
                     ) -> QuerySet[Any]:
        # The list never shows the big columns: do not read them.
        return super().get_queryset(request, exclude_parameters).defer(
            "payload", "headers", "last_error", "actor", "tries")


# -- jobs ----------------------------------------------------------------------------------


def _bulk_jobs(modeladmin: ManagedAdmin[Any], request: HttpRequest, queryset: QuerySet[Any],
               verb: str, action: Callable[..., Any]) -> None:
    ids = list(queryset.order_by("-id").values_list("id", flat=True)[: BULK_LIMIT + 1])
    scope = tenant_of(request)
    run_bulk(modeladmin, request, ids, verb, "job",
             lambda job_id, user: action(job_id, user, scope=scope))


class JobRowAdmin[M: Job | CompletedJob](ManagedAdmin[M]):
    """What the pages of waiting, running and DEAD jobs and of completed ones share: exact
    search, the private texts, and the policy of the row's target."""

    search_fields = ("key__exact", "dedupe_key__exact")
    search_help_text = "Exact key or dedupe key."
    ordering = ("-id",)
    sortable_by = ("id",)  # sorting a million rows by another column is a full sort
    payload_hidden = hidden("payload")
    headers_hidden = hidden("headers")
    actor_hidden = hidden("actor")

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[M], search_term: str
                           ) -> tuple[QuerySet[M], bool]:
        """The whole term, exact, on key or dedupe key: both index-backed."""
        term = search_term.strip()
        if not term:
            return queryset, False
        return queryset.filter(Q(key=term) | Q(dedupe_key=term)), False

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> list[tuple[Any, Any]]:
        """A task of Django's Tasks API gets a section of its own first: its path, its
        call (the payload: arguments, queue, priority) and, once completed, its return
        value."""
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None or not obj.target.startswith(registry.TASK_TARGET_PREFIX):
            return fieldsets
        moved = ("payload_json", "payload_hidden", "result_json", "result_hidden")
        task = ("task", *(name for _, options in fieldsets for name in options["fields"]
                          if name in moved))
        rest = [(title, {**options, "fields": tuple(name for name in options["fields"]
                                                    if name not in moved)})
                for title, options in fieldsets]
        return [("Task (Django's Tasks API)", {"fields": task}), *rest]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return (*super().get_readonly_fields(request, obj), "task")

    @admin.display(description="task")
    def task(self, obj: Job | CompletedJob) -> str:
        return obj.code

    @admin.display(description="payload")
    def payload_json(self, obj: Job | CompletedJob) -> str:
        return pretty_json(obj.payload)

    @admin.display(description="tries")
    def tries_text(self, obj: Job | CompletedJob) -> str:
        """One line per try that ended: when, on which worker, and what it raised, with
        the traceback's last line."""
        lines = []
        for number, entry in enumerate(obj.tries or [], start=1):
            error = entry.get("error")
            last = (entry.get("traceback") or "").strip().splitlines()[-1:] or [""]
            outcome = f"raised {error}: {last[0]}" if error else "returned"
            lines.append(f"{number}. {entry.get('started_at')} on {entry.get('worker')}: "
                         f"{outcome}")
        return format_html("<pre style='white-space: pre-wrap; margin: 0'>{}</pre>",
                           "\n".join(lines) or "-")

    @admin.display(description="headers")
    def headers_json(self, obj: Job | CompletedJob) -> str:
        return pretty_json(obj.headers)

    @admin.display(description="actor")
    def actor_json(self, obj: Job | CompletedJob) -> str:
        return pretty_json(obj.actor)

    @admin.display(description="policy of its target")
    def policy(self, obj: Job | CompletedJob) -> str:
        return policy_text(obj.target)

    @admin.display(description="flow")
    def flow(self, obj: Job | CompletedJob) -> str:
        """The flow whose step this job runs: act on the flow, not on the job."""
        owner = store.job_owner(obj.id)
        if owner is None or owner.flow_id is None:
            return "-"
        return format_html('<a href="{}">step {} of flow {}</a> (retry or cancel the flow)',
                           reverse("admin:jobs_engine_flow_change", args=[owner.flow_id]),
                           owner.step_position, owner.flow_id)


def policy_text(target: str) -> str:
    """The policy the workers apply to ``target`` (as this process registered it)."""
    try:
        policy = registry.get_target(target).policy
    except UnknownTarget:
        return "not registered in this process: a worker without its handler makes its " \
               "jobs DEAD (no handler registered)"
    name = SHIPPED_POLICIES.get(policy)
    return f"{name}: {policy}" if name else str(policy)


SHIPPED_POLICIES = {DEFAULT_POLICY: "DEFAULT_POLICY", RUN_ONCE_POLICY: "RUN_ONCE_POLICY"}


@admin.register(Job)
class JobAdmin(JobRowAdmin[Job]):
    list_display = ("id", "status", "lane", "target", "code", "key", "version", "attempts",
                    "next_run_at", "closed_at")
    list_filter = (StatusFilter, LaneFilter, TargetFilter, CodeFilter, KeyFilter)
    actions = ("retry_selected", "skip_selected", "cancel_selected")
    change_form_template = "admin/jobs_engine/job/change_form.html"
    fieldsets = (
        (None, {"fields": ("id", "status", "target", "policy", "flow", "code", "lane", "key",
                           "version", "partition", "dedupe_key", "delivery_mode",
                           "tenant_id")}),
        ("Run", {"fields": ("attempts", "priority", "next_run_at", "last_error_text",
                            "tries_text", "closed_at", "created_at", "updated_at")}),
        ("Content", {"fields": ("payload_json", "headers_json", "trace_id", "actor_json")}),
        ("Claim", {"fields": ("claimed_by", "claim_token", "lease_until", "started_at",
                              "running_code", "outcome_token")}),
    )
    readonly_fields = ("policy", "flow", "last_error_text", "tries_text", "payload_json",
                       "headers_json", "actor_json")
    private = {"payload": "payload_json", "headers": "headers_json", "actor": "actor_json",
               "last_error": "last_error_text", "tries": "tries_text"}
    last_error_hidden = hidden("last error")
    tries_hidden = hidden("tries")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return JobChangeList

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None
                        ) -> HttpResponse:
        if request.method == "GET" and request.GET.get("status") == JobStatus.DONE:
            return other_list(request, "completedjob", drop=("status",))
        return super().changelist_view(request, extra_context)

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """A job that completed since its link was made is on the completed jobs' page."""
        scope = tenant_of(request)
        if self.names_a_row(object_id) \
                and not scoped(Job.objects.filter(pk=object_id), scope).exists() \
                and scoped(CompletedJob.objects.filter(pk=object_id), scope).exists():
            return HttpResponseRedirect(
                reverse("admin:jobs_engine_completedjob_change", args=[object_id]))
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.display(description="last error")
    def last_error_text(self, obj: Job) -> str:
        return format_html("<pre style='white-space: pre-wrap; margin: 0'>{}</pre>",
                           obj.last_error or "-")

    # -- bulk actions ---------------------------------------------------------------------

    @admin.action(description="Retry selected DEAD jobs", permissions=["manage"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        _bulk_jobs(self, request, queryset, "Retried", actions.retry_job)

    @admin.action(description="Skip (delete) selected DEAD jobs", permissions=["manage"])
    def skip_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        _bulk_jobs(self, request, queryset, "Skipped", actions.skip_job)

    @admin.action(description="Cancel selected jobs that have not run",
                  permissions=["manage"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        _bulk_jobs(self, request, queryset, "Cancelled", actions.cancel_job)

    # -- single-row buttons on the change page -------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        def view(action: str) -> Callable[..., HttpResponse]:
            return self.admin_site.admin_view(require_POST(
                lambda request, object_id: self.act_on_one(request, object_id, action)))

        own = [path(f"<path:object_id>/{action}/", view(action),
                    name=f"jobs_engine_job_{action}") for action in ("retry", "skip", "cancel")]
        return own + super().get_urls()

    def act_on_one(self, request: HttpRequest, object_id: str, action: str) -> HttpResponse:
        if not can_manage(request):
            raise PermissionDenied
        operations: dict[str, Callable[..., object]] = {
            "retry": actions.retry_job, "skip": actions.skip_job, "cancel": actions.cancel_job}
        operation = operations[action]
        change_url = reverse("admin:jobs_engine_job_change", args=[object_id])
        try:
            operation(object_id, request.user, scope=tenant_of(request))
        except OperationRefused as exc:
            self.message_user(request, f"Not done: {exc.message}", messages.ERROR)
            gone = isinstance(exc, JobNotFound)
            return HttpResponseRedirect(
                reverse("admin:jobs_engine_job_changelist") if gone else change_url)
        if action == "retry":
            self.message_user(request, f"Job {object_id} is PENDING again, due now.",
                              messages.SUCCESS)
            return HttpResponseRedirect(change_url)
        verb = "skipped" if action == "skip" else "cancelled"
        self.message_user(request, f"Job {object_id} {verb} (row deleted).", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:jobs_engine_job_changelist"))

    def render_change_form(self, request: HttpRequest, context: dict[str, Any], *args: Any,
                           **kwargs: Any) -> HttpResponse:
        context["can_manage"] = can_manage(request)
        return super().render_change_form(request, context, *args, **kwargs)


# -- completed jobs and targets -------------------------------------------------------------


@admin.register(CompletedJob)
class CompletedJobAdmin(JobRowAdmin[CompletedJob]):
    """DONE jobs of targets whose policy keeps them (``keep_completed``), newest first."""

    list_display = ("id", "status", "lane", "target", "code", "key", "version", "attempts",
                    "duration", "finished_at")
    list_filter = (CompletedStatusFilter, LaneFilter, TargetFilter, CodeFilter, KeyFilter)
    fieldsets = (
        (None, {"fields": ("id", "status", "target", "policy", "flow", "code", "lane", "key",
                           "version", "partition", "dedupe_key", "delivery_mode",
                           "tenant_id")}),
        ("Run", {"fields": ("attempts", "created_at", "started_at", "finished_at",
                            "duration", "tries_text")}),
        ("Result", {"fields": ("result_json",)}),
        ("Content", {"fields": ("payload_json", "headers_json", "trace_id", "actor_json")}),
    )
    readonly_fields = ("status", "policy", "flow", "duration", "result_json", "tries_text",
                       "payload_json", "headers_json", "actor_json")
    private = {"payload": "payload_json", "headers": "headers_json", "actor": "actor_json",
               "result": "result_json", "tries": "tries_text"}
    result_hidden = hidden("result")
    tries_hidden = hidden("tries")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return CompletedJobChangeList

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None
                        ) -> HttpResponse:
        status = request.GET.get("status")
        if request.method == "GET" and status in JobStatus.values and status != JobStatus.DONE:
            return other_list(request, "job")
        return super().changelist_view(request, extra_context)

    @admin.display(description="status")
    def status(self, obj: CompletedJob) -> str:
        return obj.status

    @admin.display(description="duration")
    def duration(self, obj: CompletedJob) -> str:
        return f"{obj.duration_ms:.0f} ms"

    @admin.display(description="result")
    def result_json(self, obj: CompletedJob) -> str:
        return pretty_json(obj.result)


class CompletedJobChangeList(EngineChangeList):
    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None
                     ) -> QuerySet[Any]:
        # The list never shows the big columns: do not read them.
        return super().get_queryset(request, exclude_parameters).defer(
            "payload", "headers", "result", "actor", "tries")


def target_rows(scope: Scope = PLATFORM) -> list[dict[str, Any]]:
    """Each registered target with its lane, delivery mode, policy and the jobs kept of
    ``scope``; then names with kept jobs that no target of this process registers."""
    if scope is None:
        done: dict[str, int] = {}
        dead: dict[str, int] = {}
    else:
        of_tenant = None if scope is PLATFORM else scope
        done = store.done_counts(of_tenant=of_tenant)
        dead = store.dead_counts(of_tenant=of_tenant)
    rows = [{"name": t.name, "lane": t.lane.value, "delivery_mode": t.delivery_mode.value,
             "policy": t.policy, "policy_name": SHIPPED_POLICIES.get(t.policy, ""),
             "done": done.get(t.name, 0), "dead": dead.get(t.name, 0), "registered": True}
            for t in sorted(registry.all_targets(), key=lambda t: t.name)]
    known = {row["name"] for row in rows}
    rows += [{"name": name, "done": done.get(name, 0), "dead": dead.get(name, 0),
              "registered": False} for name in sorted((done.keys() | dead.keys()) - known)]
    return rows


def pause_state(pause: store.PauseRow | None, now: datetime) -> str:
    """A target's pause as the targets' page shows it (the reason is the pauses' page's)."""
    if pause is None:
        return ""
    if pause.by_hand:
        return "paused by hand, until resumed"
    if pause.paused_until > now:
        return f"paused (unreachable), next probe {age(pause.paused_until, now)}"
    return "paused (unreachable), probe due"


@admin.register(RegisteredTarget)
class RegisteredTargetAdmin(ManagedAdmin[RegisteredTarget]):
    """The targets this process registers and their policies: read from the registry,
    not from a table, so the page shows what the code declares (the jobs kept: the
    user's tenant's). To the platform operator also each target's pause, and to one with
    ``jobs_engine.manage_jobs`` the buttons that pause a target by hand and resume it
    (``actions.pause_target``, ``actions.resume_target``): a pause holds every tenant's
    jobs, so it is the platform operator's alone."""

    tenant_field = None

    def get_urls(self) -> list[URLPattern]:
        def act(action: str) -> Callable[..., HttpResponse]:
            return self.admin_site.admin_view(require_POST(
                lambda request, object_id: self.pause_or_resume(request, object_id, action)))

        return [path("", self.admin_site.admin_view(require_GET(self.changelist_view)),
                     name="jobs_engine_registeredtarget_changelist"),
                *[path(f"<path:object_id>/{action}/", act(action),
                       name=f"jobs_engine_registeredtarget_{action}")
                  for action in ("pause", "resume")]]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None
                        ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        rows = target_rows(tenant_of(request))
        platform = is_platform(request)
        if platform:
            now = timezone.now()
            pauses = {pause.target: pause for pause in store.pauses_all()}
            known = {row["name"] for row in rows}
            rows += [{"name": name, "done": 0, "dead": 0, "registered": False}
                     for name in sorted(pauses.keys() - known)]
            for row in rows:
                pause = pauses.get(row["name"])
                row["pause"] = pause_state(pause, now)
                row["paused_by_hand"] = pause is not None and pause.by_hand
        context = {**self.admin_site.each_context(request), "opts": self.model._meta,
                   "title": "Targets and their policies", "rows": rows,
                   "platform": platform, "can_pause": platform and can_manage(request),
                   **(extra_context or {})}
        return TemplateResponse(request, "admin/jobs_engine/registeredtarget/change_list.html",
                                context)

    def pause_or_resume(self, request: HttpRequest, object_id: str, action: str
                        ) -> HttpResponse:
        """A button's POST: the action (refused, and audited, for anyone but the platform
        operator), its message, and back to the list."""
        if not can_manage(request):
            raise PermissionDenied
        try:
            if action == "pause":
                actions.pause_target(object_id, request.user, scope=tenant_of(request))
                done = f"Target {object_id} paused by hand: no worker sends its jobs until " \
                       "it is resumed."
            else:
                actions.resume_target(object_id, request.user, scope=tenant_of(request))
                done = f"Target {object_id} resumed: workers send its jobs again."
        except OperationRefused as exc:
            self.message_user(request, f"Not done: {exc.message}", messages.ERROR)
        else:
            self.message_user(request, done, messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:jobs_engine_registeredtarget_changelist"))


# -- partitions, workers, paused targets ---------------------------------------------------


@admin.register(Partition)
class PartitionAdmin(ManagedAdmin[Partition]):
    platform_only = True
    tenant_field = None
    list_display = ("partition", "owner", "owner_live", "lease_renewed", "lease_until",
                    "in_flight")
    ordering = ("partition",)
    list_filter = ()

    @admin.display(description="lease renewed")
    def lease_renewed(self, obj: Partition) -> str:
        """Lease age: the lease is renewed to now + PARTITION_LEASE_S on every beat."""
        if obj.lease_until is None:
            return "-"
        renewed = obj.lease_until - timedelta(seconds=jobs_settings().PARTITION_LEASE_S)
        return age(renewed, timezone.now())

    @admin.display(description="live", boolean=True)
    def owner_live(self, obj: Partition) -> bool:
        return bool(obj.owner and obj.lease_until and obj.lease_until > timezone.now())

    def get_queryset(self, request: HttpRequest) -> QuerySet[Partition]:
        return super().get_queryset(request).annotate(
            rows_in_flight=RawSQL(store.inflight_rows_sql(), []))

    @admin.display(description="in flight")
    def in_flight(self, obj: WithAnnotations[Partition, _InFlight]) -> int:
        return int(obj.rows_in_flight)


@admin.register(Worker)
class WorkerAdmin(ManagedAdmin[Worker]):
    platform_only = True
    tenant_field = None
    list_display = ("worker_id", "live", "heartbeat", "partitions_held", "lanes", "hostname",
                    "pid", "started_at")
    ordering = ("worker_id",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Worker]:
        held = (Partition.objects.filter(owner=OuterRef("worker_id"),
                                         lease_until__gt=timezone.now())
                .order_by().values("owner").annotate(n=Count("partition")).values("n"))
        return super().get_queryset(request).annotate(held=Coalesce(Subquery(held), 0))

    @admin.display(description="partitions held")
    def partitions_held(self, obj: WithAnnotations[Worker, _Held]) -> int:
        return obj.held

    @admin.display(description="last heartbeat")
    def heartbeat(self, obj: Worker) -> str:
        return age(obj.heartbeat_at, timezone.now())

    @admin.display(description="live", boolean=True)
    def live(self, obj: Worker) -> bool:
        """Live while its heartbeat is newer than the partition lease."""
        cutoff = timezone.now() - timedelta(seconds=jobs_settings().PARTITION_LEASE_S)
        return obj.heartbeat_at > cutoff


@admin.register(TargetPause)
class TargetPauseAdmin(ManagedAdmin[TargetPause]):
    """A pause is a target's, shared by every tenant's jobs: the platform operator's."""

    platform_only = True
    tenant_field = None
    list_display = ("target", "state", "reason", "paused_until", "paused_at", "probe_by")
    fields = ("target", "state", "reason", "paused_until", "paused_at", "probe_by")
    readonly_fields = ("state",)
    ordering = ("target",)
    actions = ("resume_selected",)
    private = {"reason": "reason"}  # a target's error text: it may quote a payload
    reason_hidden = hidden("reason")

    @admin.display(description="state")
    def state(self, obj: TargetPause) -> str:
        if obj.paused_until >= store.HAND_PAUSE_UNTIL:
            return "paused by hand, until resumed"
        if obj.paused_until > timezone.now():
            return f"paused, next probe {age(obj.paused_until, timezone.now())}"
        return "probe due"

    @admin.action(description="Resume selected targets now", permissions=["manage"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[TargetPause]) -> None:
        targets = list(queryset.values_list("target", flat=True)[: BULK_LIMIT + 1])
        run_bulk(self, request, targets, "Resumed", "target", actions.resume_target)


# -- statistics and audit ------------------------------------------------------------------

CHART_HOURS = 48
CHART_OUTCOMES = (("ok", "#3a9a5b"), ("retried", "#e0a800"), ("paused", "#6c8ebf"),
                  ("throttled", "#8e6cbf"), ("dead", "#c0392b"))


def _chart_start(now: datetime) -> datetime:
    return now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=CHART_HOURS - 1)


def _runs_since(first: datetime, scope: Scope) -> list[tuple[datetime, str, str, int]]:
    """The hourly statistics ``scope`` sees, from ``first`` on."""
    if scope is None:
        return []
    return store.job_stats_since(first, of_tenant=None if scope is PLATFORM else scope)


def chart_rows(now: datetime, target: str | None = None, scope: Scope = PLATFORM
               ) -> list[dict[str, Any]]:
    """One entry per hour of the last ``CHART_HOURS``: counts per outcome and bar heights
    (percent of the busiest hour), of the runs ``scope`` sees."""
    first = _chart_start(now)
    hours = {first + timedelta(hours=i): dict.fromkeys((o for o, _ in CHART_OUTCOMES), 0)
             for i in range(CHART_HOURS)}
    for hour, row_target, outcome, count in _runs_since(first, scope):
        if (target is None or row_target == target) and hour in hours \
                and outcome in hours[hour]:
            hours[hour][outcome] += count
    busiest = max((sum(c.values()) for c in hours.values()), default=0) or 1
    return [{"hour": hour, "total": sum(counts.values()),
             "bars": [{"outcome": o, "color": color, "count": counts[o],
                       "height": round(100 * counts[o] / busiest, 1)}
                      for o, color in CHART_OUTCOMES]}
            for hour, counts in hours.items()]


def target_totals(now: datetime, scope: Scope = PLATFORM) -> list[dict[str, Any]]:
    """Each target's runs per outcome over the chart's hours, of the runs ``scope`` sees."""
    outcomes = [o for o, _ in CHART_OUTCOMES]
    totals: dict[str, dict[str, int]] = {}
    for _, target, outcome, count in _runs_since(_chart_start(now), scope):
        if outcome in outcomes:
            counts = totals.setdefault(target, dict.fromkeys(outcomes, 0))
            counts[outcome] += count
    return [{"target": target, "counts": [counts[o] for o in outcomes]}
            for target, counts in sorted(totals.items())]


@admin.register(JobStat)
class JobStatAdmin(ManagedAdmin[JobStat]):
    """Runs per hour, target and outcome, of the user's tenant: a chart of the last
    ``CHART_HOURS`` (``?target=`` narrows it) and each target's totals over them. One page
    computed from the statistics' shards (``JobStatShard``), not a list of their rows: a
    bucket's runs are spread over its shards until retention folds them."""

    tenant_field = None

    def get_urls(self) -> list[URLPattern]:
        return [path("", self.admin_site.admin_view(require_GET(self.changelist_view)),
                     name="jobs_engine_jobstat_changelist")]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None
                        ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        target = request.GET.get("target") or None
        now, scope = timezone.now(), tenant_of(request)
        context = {**self.admin_site.each_context(request), "opts": self.model._meta,
                   "title": "Job runs", "chart": chart_rows(now, target, scope),
                   "totals": target_totals(now, scope), "chart_hours": CHART_HOURS,
                   "chart_outcomes": CHART_OUTCOMES, "chart_target": target,
                   **(extra_context or {})}
        return TemplateResponse(request, "admin/jobs_engine/jobstat/change_list.html", context)


@admin.register(AuditRecord)
class AuditRecordAdmin(ManagedAdmin[AuditRecord]):
    """Who did what, in the user's tenant (the platform operator: every tenant's)."""

    list_display = ("at", "username", "action", "object_type", "object_id", "result",
                    "message")
    list_filter = ("result", "action", "object_type")
    search_fields = ("object_id__exact", "username__exact")
    ordering = ("-id",)

