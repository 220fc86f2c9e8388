"""The flows' routes of the JSON API, under ``/api/v1/job-flows``.

Same session auth, CSRF check, strict input and error shape as the jobs routes
(``operators.api``), with the flows' own permissions: ``jobs_engine.view_flow`` (or
``manage_flows``) to read, ``jobs_engine.manage_flows`` to start, retry and cancel; a
step's result and error need ``jobs_engine.manage_jobs``, as a job's do. Every route is
bound to the caller's tenant (``tenancy.tenant_of``): another tenant's flow answers 404,
exactly as an unknown id. Every action is audited (``operators.actions``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from django.db.models import QuerySet
from django.http import HttpRequest
from ninja import Field, Path, Query, Router, Schema
from pydantic import BeforeValidator

from jobs_engine import flows
from jobs_engine.errors import FlowNotFound
from jobs_engine.models import MANAGE_FLOWS_PERMISSION, VIEW_FLOWS_PERMISSION, Flow, FlowStep
from jobs_engine.operators import actions
from jobs_engine.operators.actions import MAX_JOB_ID
from jobs_engine.operators.admin_base import may_see_job_text
from jobs_engine.operators.api import (
    MAX_LIMIT,
    MAX_PAGE,
    BodyIn,
    ManagerSession,
    QueryIn,
    Text,
    api,
    errors,
    plain_id,
)
from jobs_engine.operators.queries import capped_count
from jobs_engine.tenancy import scoped, tenant_of

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


class FlowSession(ManagerSession):
    def permissions(self, request: HttpRequest) -> tuple[str, ...]:
        """Reading: ``view_flow``, or ``manage_flows`` (who acts on flows sees them)."""
        if request.method in SAFE_METHODS:
            return VIEW_FLOWS_PERMISSION, MANAGE_FLOWS_PERMISSION
        return (MANAGE_FLOWS_PERMISSION,)


FlowId = Annotated[int, BeforeValidator(plain_id),
                   Path(ge=1, le=MAX_JOB_ID, description="The flow's id: digits, no leading 0.")]


class FlowFilters(QueryIn):
    state: Literal["RUNNING", "COMPLETED", "FAILED", "CANCELLED"] | None = None
    name: Text | None = None
    page: int = Field(1, ge=1, le=MAX_PAGE)
    limit: int = Field(MAX_LIMIT, ge=1, le=MAX_LIMIT)


class FlowOut(Schema):
    id: int
    name: str
    kind: str
    state: str
    definition: str
    tenant_id: str | None
    steps_total: int
    steps_done: int
    progress: str = Field(description="Steps done of all, such as 3/5.")
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


class StepOut(Schema):
    position: int
    role: str
    name: str
    target: str
    state: str
    attempts: int
    result: Any = Field(None, description="What the step returned; null without "
                                          "jobs_engine.manage_jobs (see text_hidden).")
    last_error: str | None = Field(description="Why it failed; null without "
                                               "jobs_engine.manage_jobs (see text_hidden).")
    job_id: int | None
    started_at: datetime | None
    finished_at: datetime | None


class FlowDetail(FlowOut):
    steps: list[StepOut]
    text_hidden: bool = Field(description="True when the caller lacks jobs_engine.manage_jobs: "
                                          "every step's result and last_error are left out "
                                          "(they may hold what a payload holds).")


class FlowPage(Schema):
    data: list[FlowOut]
    total: int
    total_capped: bool
    page: int
    limit: int


class DefinitionOut(Schema):
    name: str
    description: str


class StartIn(BodyIn):
    input: Any = None


class Dropped(Schema):
    id: int
    state: str
    steps: int = Field(description="Steps queued again (retry) or dropped (cancel).")


def flow_out(flow: Flow) -> dict[str, Any]:
    return {**{f: getattr(flow, f) for f in FlowOut.model_fields if f != "progress"},
            "progress": f"{flow.steps_done}/{flow.steps_total}"}


def _visible(request: HttpRequest) -> QuerySet[Flow]:
    return scoped(Flow.objects.all(), tenant_of(request))


def step_out(step: FlowStep, text_shown: bool) -> dict[str, Any]:
    fields = {name: getattr(step, name) for name in StepOut.model_fields}
    return fields if text_shown else {**fields, "result": None, "last_error": None}


def _one(request: HttpRequest, flow_id: int) -> Flow:
    flow = _visible(request).filter(id=flow_id).first()
    if flow is None:
        raise FlowNotFound(flow_id)
    return flow


router = Router(tags=["job-flows"], auth=FlowSession())


@router.get("", response={200: FlowPage, **errors(400)},
            summary="List flows with their state and progress")
def list_flows(request: HttpRequest, filters: Query[FlowFilters]) -> dict[str, Any]:
    queryset = _visible(request)
    if filters.state is not None:
        queryset = queryset.filter(state=filters.state)
    if filters.name is not None:
        queryset = queryset.filter(name=filters.name)
    total, capped = capped_count(queryset)
    start = (filters.page - 1) * filters.limit
    rows = queryset.order_by("-id")[start:start + filters.limit]
    return {"data": [flow_out(f) for f in rows], "total": total, "total_capped": capped,
            "page": filters.page, "limit": filters.limit}


@router.get("/definitions", response={200: list[DefinitionOut], **errors()},
            summary="The flows an operator can start by name")
def list_definitions(request: HttpRequest) -> list[dict[str, str]]:
    return [{"name": d.name, "description": d.description} for d in flows.definitions()]


@router.get("/{flow_id}", response={200: FlowDetail, **errors(404)},
            summary="One flow with every step: state, attempts, result or error")
def get_flow(request: HttpRequest, flow_id: FlowId) -> dict[str, Any]:
    flow = _one(request, flow_id)
    shown = may_see_job_text(request)
    return {**flow_out(flow), "text_hidden": not shown,
            "steps": [step_out(step, shown) for step in flow.steps.order_by("position")]}


@router.post("/definitions/{name}/start",
             response={200: FlowOut, **errors(400, 404, 413, 415)},
             summary="Start a defined flow with a JSON input")
def start_flow(request: HttpRequest, name: Annotated[str, Path(max_length=200)],
               body: StartIn) -> dict[str, Any]:
    """Under the caller's tenant. An unknown name is 404; an input the flow's builder
    refuses is 400 naming it; nothing is written either way."""
    return flow_out(actions.start_flow(name, body.input, request.user,
                                       scope=tenant_of(request)))


@router.post("/{flow_id}/retry", response={200: Dropped, **errors(404, 409, 413)},
             summary="Queue the failed steps again")
def retry_flow(request: HttpRequest, flow_id: FlowId) -> dict[str, Any]:
    """Completed steps never run again. No failed step: 409."""
    retried = actions.retry_flow(flow_id, request.user, scope=tenant_of(request))
    return {"id": flow_id, "state": Flow.objects.get(id=flow_id).state, "steps": retried.steps}


@router.post("/{flow_id}/cancel", response={200: Dropped, **errors(404, 409, 413)},
             summary="Drop every step that has not run")
def cancel_flow(request: HttpRequest, flow_id: FlowId) -> dict[str, Any]:
    """A step running: 409 ``flow_running``, nothing changed."""
    dropped = actions.cancel_flow(flow_id, request.user, scope=tenant_of(request))
    return {"id": flow_id, "state": Flow.objects.get(id=flow_id).state, "steps": dropped}


_attached: list[bool] = []


def attach() -> None:
    """Add the routes to the engine's API, once (before its URLs are first built)."""
    if not _attached:
        api.add_router("/job-flows", router)
        _attached.append(True)
