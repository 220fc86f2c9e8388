"""The admin's "Job flows" pages: the list with state, progress and age; a flow's page with
its steps as a chain or a fan-in (state, attempts, why one failed, links to the step jobs);
start a defined flow (its description and a JSON input), retry, cancel.

Reading needs Django's ``view_flow`` permission or ``manage_flows`` (who acts on flows
sees them); a step's result and error, which may hold what a payload holds, need
``jobs_engine.manage_jobs`` as a job's do. Every page is bound to the user's tenant
(``tenancy.tenant_of``): another tenant's flow is a 404, as an unknown id. Every action
goes through ``operators.actions`` (``jobs_engine.flows`` and an audit record), which
refuses in the wrong state and changes nothing; the refusal is shown as a message.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from jobs_engine import flows
from jobs_engine.errors import OperationRefused
from jobs_engine.models import (
    MANAGE_FLOWS_PERMISSION,
    CompletedJob,
    Flow,
    FlowStep,
    Job,
)
from jobs_engine.operators import actions
from jobs_engine.operators.admin_base import HIDDEN_TEXT, ReadOnlyAdmin, age, may_see_job_text
from jobs_engine.states import StepRole
from jobs_engine.tenancy import tenant_of
from jobs_engine.text import load_json


def can_manage_flows(request: HttpRequest) -> bool:
    return request.user.is_active and request.user.has_perm(MANAGE_FLOWS_PERMISSION)


@admin.register(Flow)
class FlowAdmin(ReadOnlyAdmin[Flow]):
    list_display = ("id", "name", "state", "progress", "tenant_id", "started", "finished_at")
    list_filter = ("state",)
    search_fields = ("=name",)
    ordering = ("-id",)
    change_form_template = "admin/jobs_engine/flow/change_form.html"

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_view_permission(request, obj) or can_manage_flows(request)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return super().has_module_permission(request) or can_manage_flows(request)

    @admin.display(description="progress")
    def progress(self, obj: Flow) -> str:
        return f"{obj.steps_done}/{obj.steps_total}"

    @admin.display(description="started", ordering="created_at")
    def started(self, obj: Flow) -> str:
        return age(obj.created_at, timezone.now())

    # -- a flow's page ----------------------------------------------------------------------

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        flow = self._visible(request, object_id)
        steps = list(flow.steps.order_by("position"))
        links = _job_links(steps)
        rows = {role: [{"step": s, "link": links.get(s.id), "result": _shown(s.result)}
                       for s in steps if s.role == role] for role in StepRole}
        context = {**self.admin_site.each_context(request), "opts": self.model._meta,
                   "title": f"{flow.name} #{flow.id}", "flow": flow, "original": flow,
                   "progress": self.progress(flow), "can_manage": can_manage_flows(request),
                   "text_shown": may_see_job_text(request), "hidden_text": HIDDEN_TEXT,
                   "chain": rows[StepRole.STEP], "jobs": rows[StepRole.JOB],
                   "callback": rows[StepRole.CALLBACK], **(extra_context or {})}
        return TemplateResponse(request, self.change_form_template, context)

    def _visible(self, request: HttpRequest, object_id: Any) -> Flow:
        """The flow, if this user's tenant may see it; a 404 otherwise, as for an unknown
        id (and for an id that is not one)."""
        if not str(object_id).isdigit():
            raise Http404("no such flow")
        flow = self.get_queryset(request).filter(id=int(object_id)).first()
        if flow is None:
            raise Http404("no such flow")
        return flow

    # -- actions: retry, cancel, start --------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        def act(action: str) -> Any:
            return self.admin_site.admin_view(require_POST(
                lambda request, object_id: self.act_on_one(request, object_id, action)))

        return [path("start/", self.admin_site.admin_view(self.start_view),
                     name="jobs_engine_flow_start"),
                *[path(f"<path:object_id>/{action}/", act(action),
                       name=f"jobs_engine_flow_{action}") for action in ("retry", "cancel")],
                *super().get_urls()]

    def act_on_one(self, request: HttpRequest, object_id: str, action: str) -> HttpResponse:
        if not can_manage_flows(request):
            raise PermissionDenied
        flow = self._visible(request, object_id)
        page = reverse("admin:jobs_engine_flow_change", args=[flow.id])
        scope = tenant_of(request)
        try:
            if action == "retry":
                retried = actions.retry_flow(flow.id, request.user, scope=scope)
                done = f"Flow {flow.id}: {retried.steps} failed step(s) queued again."
            else:
                count = actions.cancel_flow(flow.id, request.user, scope=scope)
                done = f"Flow {flow.id} cancelled: {count} step(s) dropped."
        except OperationRefused as exc:
            self.message_user(request, f"Not done: {exc.message}", messages.ERROR)
            return HttpResponseRedirect(page)
        self.message_user(request, done, messages.SUCCESS)
        return HttpResponseRedirect(page)

    def start_view(self, request: HttpRequest) -> HttpResponse:
        """A form: a defined flow (with its description) and its JSON input."""
        if not can_manage_flows(request):
            raise PermissionDenied
        definitions = flows.definitions()
        chosen, raw, problem = request.POST.get("definition", ""), request.POST.get(
            "input", "null"), ""
        if request.method == "POST":
            try:
                value = load_json(raw)
            except ValueError as exc:
                problem = f"input: not JSON ({exc})"
            else:
                try:
                    flow = actions.start_flow(chosen, value, request.user,
                                              scope=tenant_of(request))
                except OperationRefused as exc:
                    problem = exc.message
                else:
                    self.message_user(request, f"Flow {chosen} started.", messages.SUCCESS)
                    return HttpResponseRedirect(
                        reverse("admin:jobs_engine_flow_change", args=[flow.id]))
            self.message_user(request, f"Not started: {problem}", messages.ERROR)
        context = {**self.admin_site.each_context(request), "opts": self.model._meta,
                   "title": "Start a job flow", "definitions": definitions,
                   "chosen": chosen, "input": raw}
        return TemplateResponse(request, "admin/jobs_engine/flow/start.html", context)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None
                        ) -> HttpResponse:
        extra = {"can_manage": can_manage_flows(request), **(extra_context or {})}
        return super().changelist_view(request, extra)


def _job_links(steps: list[FlowStep]) -> dict[int, str]:
    """Each step's job page: waiting or DEAD in the jobs, or kept among the completed."""
    ids = [s.job_id for s in steps if s.job_id is not None]
    live = set(Job.objects.filter(id__in=ids).values_list("id", flat=True))
    done = set(CompletedJob.objects.filter(id__in=ids).values_list("id", flat=True))
    links = {}
    for step in steps:
        if step.job_id in live:
            links[step.id] = reverse("admin:jobs_engine_job_change", args=[step.job_id])
        elif step.job_id in done:
            links[step.id] = reverse("admin:jobs_engine_completedjob_change",
                                     args=[step.job_id])
    return links


def _shown(result: Any) -> str:
    return "" if result is None else json.dumps(result, ensure_ascii=False, sort_keys=True)[:500]
