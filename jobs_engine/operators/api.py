"""The JSON API under ``/api/v1/`` (django-ninja; OpenAPI at ``/api/v1/docs``).

Authentication is the Django session (log in at ``/admin/login/``), with Django's CSRF
check on unsafe methods: a POST, PUT or DELETE sends the ``csrftoken`` cookie's value in
an ``X-CSRFToken`` header. Session auth without CSRF would let any page the operator
visits fire retries in their name, so the check stays on; scripts log in once and reuse
the cookie jar. Only users with ``jobs_engine.manage_jobs`` pass: anonymous → 401,
others → 403. Every route is bound to the caller's tenant (``tenancy``): another
tenant's job or schedule answers exactly as an unknown one (404). The documentation
(``docs``, ``openapi.json``) is for staff users unless ``JOBS["API_DOCS"]`` says
otherwise.

Input is strict: a job id in a path is a plain decimal number (``JobId``: ``[1-9][0-9]*``,
at most 2**63-1; ``1.0``, ``+1``, `` 1``, ``01``, ``1e0``, ``0`` or a larger number names
no row: 404), and a query parameter or body field a route does not use is refused (400
naming it), as is a parameter given twice or empty, and any body on a route that takes
none (``refuse_unused_input``).

Every error has one shape: ``{"status_code", "code", "message": [...]}`` (400
``validation_error``, 401 ``unauthorized``, 403 ``forbidden``/``csrf_failed``, 404
``not_found`` for unknown or malformed ids and unknown routes, 409 ``invalid_status``,
413 ``body_too_large``, 415 ``unsupported_media_type`` for a form where JSON is taken).
Other apps (schedules) add their routers to ``api``; their body schemas derive from
``BodyIn`` and their filter schemas from ``QueryIn``.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import re
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Annotated, Any, Literal, cast

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, QueryDict
from django.http.multipartparser import MultiPartParserError
from django.http.request import RawPostDataException
from django.urls import NoReverseMatch, reverse
from ninja import Field, NinjaAPI, Path, Query, Router, Schema
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser
from ninja.security.apikey import APIKeyCookie
from ninja.utils import check_csrf
from pydantic import BeforeValidator, ConfigDict, StringConstraints, model_validator

from jobs_engine.conf import jobs_settings
from jobs_engine.errors import InvalidSettings, JobNotFound, OperationRefused
from jobs_engine.models import MANAGE_PERMISSION, CompletedJob, Job
from jobs_engine.operators import actions
from jobs_engine.operators.actions import MAX_JOB_ID
from jobs_engine.operators.queries import capped_count
from jobs_engine.states import JobStatus
from jobs_engine.tenancy import scoped, tenant_of
from jobs_engine.text import load_json

logger = logging.getLogger("jobs_engine")

MAX_BODY_BYTES = 64 * 1024  # the API takes small bodies (a cron override); more is refused
MAX_PAGE = 100_000
MAX_LIMIT = 100

CODES = {400: "validation_error", 401: "unauthorized", 403: "forbidden", 404: "not_found",
         405: "method_not_allowed", 409: "invalid_status", 413: "body_too_large",
         415: "unsupported_media_type", 429: "throttled"}


def error_body(status_code: int, code: str, messages: Iterable[str]) -> dict[str, Any]:
    return {"status_code": status_code, "code": code, "message": list(messages)}


def error_response(status_code: int, code: str, messages: Iterable[str]) -> JsonResponse:
    return JsonResponse(error_body(status_code, code, messages), status=status_code)


def _body_length(request: HttpRequest) -> int:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0


class ManagerSession(APIKeyCookie):
    """Django session auth for engine managers, CSRF-checked on unsafe methods.

    Order of checks: a body over ``MAX_BODY_BYTES`` (413, before anything reads it), not
    logged in (401), CSRF (403 ``csrf_failed``), no manage permission (403).
    """

    param_name = settings.SESSION_COOKIE_NAME

    def _get_key(self, request: HttpRequest) -> str | None:
        return request.COOKIES.get(self.param_name)

    def authenticate(self, request: HttpRequest, key: str | None) -> Any:
        if _body_length(request) > MAX_BODY_BYTES:
            raise OperationRefused(f"request body over {MAX_BODY_BYTES} bytes",
                                   status_code=413, code="body_too_large")
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        if self.csrf and not getattr(request, "_ninja_csrf_exempt", False) \
                and check_csrf(request) is not None:
            raise OperationRefused("CSRF check failed: send the csrftoken cookie's value in an "
                                   "X-CSRFToken header", status_code=403, code="csrf_failed")
        permissions = self.permissions(request)
        if not any(user.has_perm(permission) for permission in permissions):
            raise OperationRefused(f"the {' or '.join(permissions)} permission is required",
                                   status_code=403, code="forbidden")
        return user

    def permissions(self, request: HttpRequest) -> tuple[str, ...]:
        """The permissions of which a request needs one (the jobs and schedules routes: one
        for all)."""
        return (MANAGE_PERMISSION,)


def docs_access(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The API's documentation (Swagger UI, ``openapi.json``), as ``JOBS["API_DOCS"]``
    says: for logged-in staff users (others are sent to the login page), for anyone, or
    for no one (404). It lists every route and field: a map for an attacker."""

    @functools.wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        access = jobs_settings().API_DOCS
        if access == "off":
            raise Http404("the API documentation is off (JOBS['API_DOCS'])")
        user = getattr(request, "user", None)
        if access != "public" and not (user is not None and user.is_active
                                       and user.is_staff):
            try:  # the admin's login, where staff log in (as Django's staff_member_required)
                login_url = reverse("admin:login")
            except NoReverseMatch:
                login_url = None  # settings.LOGIN_URL
            return redirect_to_login(request.get_full_path(), login_url)
        return view(request, *args, **kwargs)

    return guarded


class NotJson(ValueError):
    """A body sent as something other than JSON to a route that takes one."""


JSON_TYPES = ("application/json",)


class JsonBodies(Parser):
    """The bodies of routes that take one: JSON only (a form is 415, ``_http_error``), and
    JSON nested too deep for the decoder is a 400 like any other that is not JSON."""

    def parse_body(self, request: HttpRequest) -> Any:
        if request.content_type not in JSON_TYPES:
            raise NotJson(f"body: send it as application/json, not {request.content_type}")
        return load_json(request.body)


api = NinjaAPI(
    title="jobs-engine API",
    version="1",
    description=__doc__ or "",
    urls_namespace="jobs_api",
    auth=ManagerSession(),
    docs_decorator=docs_access,
    parser=JsonBodies(),
)


# -- errors in one shape -------------------------------------------------------------------


def _location(loc: Iterable[Any]) -> str:
    return ".".join(str(part) for part in loc)


def _message(error: dict[str, Any]) -> str:
    what = "unknown field" if error.get("type") == "extra_forbidden" \
        else error.get("msg", "invalid")
    return f"{_location(error.get('loc', ()))}: {what}"


@api.exception_handler(ValidationError)
def _validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    errors = list(exc.errors)
    if any(tuple(error.get("loc", ()))[:1] == ("path",) for error in errors):
        # A malformed id names no row, like an unknown one.
        return error_response(404, "not_found", ["no row has this id"])
    messages = [_message(error) for error in errors]
    return error_response(400, "validation_error", messages or ["invalid request"])


@api.exception_handler(OperationRefused)
def _refused(request: HttpRequest, exc: OperationRefused) -> HttpResponse:
    return error_response(exc.status_code, exc.code, exc.messages)


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    if isinstance(exc, AuthenticationError):
        return error_response(401, "unauthorized",
                              ["log in first (Django session, e.g. /admin/login/)"])
    if isinstance(exc.__cause__, NotJson):  # the body parser's refusal, wrapped by ninja
        return error_response(415, "unsupported_media_type", [str(exc.__cause__)])
    return error_response(exc.status_code, CODES.get(exc.status_code, "error"), [exc.message])


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return error_response(404, "not_found", [str(exc) or "not found"])


@api.exception_handler(RequestDataTooBig)
def _too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    return error_response(413, "body_too_large", [str(exc)])


@api.exception_handler(RawPostDataException)
def _form_body(request: HttpRequest, exc: RawPostDataException) -> HttpResponse:
    """A multipart form sent where a JSON body is taken, read as a form already (by the CSRF
    check) so that it cannot be read again."""
    return error_response(415, "unsupported_media_type",
                          [f"body: send it as application/json, not {request.content_type}"])


@api.exception_handler(InvalidSettings)
def _misconfigured(request: HttpRequest, exc: InvalidSettings) -> HttpResponse:
    """A setting that fails a request (the tenant resolver's answer): logged, and named to
    the caller, a staff user; nothing was changed."""
    logger.error("API %s %s: %s", request.method, request.path, exc)
    return error_response(500, "misconfigured", [str(exc)])


@api.exception_handler(SuspiciousOperation)
@api.exception_handler(MultiPartParserError)
def _unparsable(request: HttpRequest, exc: Exception) -> HttpResponse:
    """A request Django would not parse (too many fields, a broken multipart form): 400, as
    Django answers it outside the API, not the catch-all's 500."""
    return error_response(400, "validation_error", [str(exc) or "malformed request"])


@api.exception_handler(Exception)
def _unexpected(request: HttpRequest, exc: Exception) -> HttpResponse:
    logger.exception("API %s %s failed", request.method, request.path)
    return error_response(500, "internal_error", ["internal error; see the server log"])


def not_found_view(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
    """Any other path under ``/api/v1/``: a 404 in the API's error shape."""
    return error_response(404, "not_found", [f"no API route {request.path}"])


# -- input nobody uses is refused ---------------------------------------------------------


FORM_TYPES = {"multipart/form-data", "application/x-www-form-urlencoded"}


def _unicode(value: Any) -> bool:
    """Whether every text in a parsed JSON body is Unicode that UTF-8 (and so a database
    column) can hold: JSON's ``\\ud800`` escapes make lone surrogates that cannot."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, dict):
        return all(_unicode(key) and _unicode(item) for key, item in value.items())
    if isinstance(value, list):
        return all(_unicode(item) for item in value)
    return True


class BodyIn(Schema):
    """A request body: a field the route does not know is refused (400), not ignored, and
    so is text with a lone surrogate (400, instead of a 500 when it reaches the database,
    e.g. quoted in an audit record)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        if not _unicode(data):
            raise ValueError("text with a lone surrogate (\\ud800-\\udfff) is not valid "
                             "Unicode")
        return data


class QueryIn(Schema):
    """A route's query parameters; any other query parameter is refused (400)."""


def _form_fields(request: HttpRequest) -> set[str]:
    """The field names of a form body (Django parses one only for a POST)."""
    if request.method == "POST":
        return {*request.POST, *request.FILES}
    if request.content_type == "multipart/form-data":
        data, files = request.parse_file_upload(request.META, io.BytesIO(request.body))
        return {*data, *files}
    return set(QueryDict(request.body, encoding=request.encoding))


def _no_body(request: HttpRequest) -> list[str]:
    """What is wrong with a body sent to a route that takes none: nothing for no body, a
    form with no field (what a test client or an HTML form sends) or ``{}`` (what generic
    JSON clients send); otherwise each field it names, or the body as a whole."""
    whole = ["body: this route takes no body"]
    try:
        if request.content_type in FORM_TYPES:
            return [f"body.{name}: unknown field (this route takes no body)"
                    for name in sorted(_form_fields(request))]
        raw = request.body
    except RawPostDataException:  # read as a stream already (a form): it was not empty
        return whole
    if not raw.strip():
        return []
    try:
        data = json.loads(raw)
    except ValueError:
        return whole
    if isinstance(data, dict):
        return [f"body.{name}: unknown field (this route takes no body)"
                for name in sorted(data)]  # none for {}
    return whole


def refuse_unused_input(view: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap every route (after auth and validation): a query parameter it does not declare
    (in a ``QueryIn`` schema), or a body when it takes no ``BodyIn``, is a 400 naming it.

    Why: a client that sends a field it believes is used (a ``force`` flag on a retry, a
    ``reason`` with a cancel, a misspelt ``cron_overide``) must learn that it is not,
    instead of getting a 200 for something other than what it asked.
    """

    @functools.wraps(view)
    def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        values = list(kwargs.values())
        known = {name for value in values if isinstance(value, QueryIn)
                 for name in type(value).model_fields}
        problems = [f"query.{name}: unknown parameter"
                    for name in sorted(set(request.GET) - known)]
        # An empty value (``?code=``) reads as "not given" to the parser: it filters on
        # nothing while the client asked for something, so it is refused like a bad value.
        problems += [f"query.{name}: must not be empty"
                     for name in sorted(set(request.GET) & known)
                     if any(value == "" for value in request.GET.getlist(name))]
        # A parameter given twice (``?code=a&code=b``) would filter on the last one only,
        # while the client asked for both: refused, not silently narrowed.
        problems += [f"query.{name}: given {len(request.GET.getlist(name))} times; give it "
                     "once" for name in sorted(set(request.GET) & known)
                     if len(request.GET.getlist(name)) > 1]
        if not any(isinstance(value, BodyIn) for value in values):
            problems += _no_body(request)
        if problems:
            raise OperationRefused(problems)
        return view(request, *args, **kwargs)

    return checked


# Every route, also those other apps add (ninja applies it to each router at build time).
api.add_decorator(refuse_unused_input, mode="operation")


# -- schemas -------------------------------------------------------------------------------


class ErrorOut(Schema):
    status_code: int
    code: str
    message: list[str]


# Filter text: bounded, and no NUL (PostgreSQL text cannot hold one).
Text = Annotated[str, StringConstraints(min_length=1, max_length=255, pattern=r"^[^\x00]*$")]
StatusName = Literal["PENDING", "RUNNING", "DEAD", "DONE"]
LaneName = Literal["fast", "long"]


class JobFilters(QueryIn):
    status: StatusName | None = None
    target: Text | None = None
    code: Text | None = None
    key: Text | None = None
    lane: LaneName | None = None
    page: int = Field(1, ge=1, le=MAX_PAGE)
    limit: int = Field(MAX_LIMIT, ge=1, le=MAX_LIMIT)


FILTERS = ("status", "target", "code", "key", "lane")


class JobOut(Schema):
    id: int
    target: str
    code: str
    lane: str
    key: str | None
    partition: int
    version: int
    dedupe_key: str
    status: str
    delivery_mode: str
    attempts: int = Field(description="Tries made, in the sense of the policy's attempts.")
    next_run_at: datetime | None = Field(description="When it is due; null once DONE.")
    closed_at: datetime | None = Field(description="When it went DEAD or DONE.")
    claimed_by: str | None
    lease_until: datetime | None
    started_at: datetime | None
    trace_id: str
    tenant_id: str | None = Field(description="The tenant it belongs to; null: none.")
    created_at: datetime
    updated_at: datetime


LIST_FIELDS = tuple(JobOut.model_fields)


class JobDetail(JobOut):
    payload: Any = None
    headers: dict[str, Any]
    last_error: str
    actor: dict[str, Any] | None = None
    result: Any = Field(None, description="What the handler returned (DONE jobs).")
    duration_ms: float | None = Field(None, description="How long the try that completed "
                                                        "it ran (DONE jobs).")


def completed_as_job(row: CompletedJob, schema: type[Schema]) -> dict[str, Any]:
    """A completed job in the shape of ``schema``: DONE, closed when it finished, due
    never again, held by nobody."""
    fields = {name: getattr(row, name) for name in schema.model_fields if hasattr(row, name)}
    return {**fields, "status": JobStatus.DONE.value, "next_run_at": None,
            "closed_at": row.finished_at, "claimed_by": None, "lease_until": None,
            "updated_at": row.finished_at, "last_error": ""}


class JobPage(Schema):
    data: list[JobOut]
    total: int = Field(description="Matching rows, counted up to a cap (see total_capped).")
    total_capped: bool = Field(description="True when more rows match than total says.")
    page: int
    limit: int


class Skipped(Schema):
    id: int
    skipped: bool


class Cancelled(Schema):
    id: int
    cancelled: bool
    was: str = Field(description="The row's status when it was removed.")


def errors(*codes: int) -> dict[int, type[ErrorOut]]:
    return dict.fromkeys((401, 403, *codes), ErrorOut)


PLAIN_ID = re.compile(r"[1-9][0-9]{0,18}")  # ASCII digits, no sign, space, zero or fraction


def plain_id(value: Any) -> Any:
    """Only the id's one plain spelling: ``01``, ``+1``, ``1.0``, `` 1`` or ``1_0`` would
    otherwise be read (by int or pydantic) as some row's id."""
    if isinstance(value, str) and not PLAIN_ID.fullmatch(value):
        raise ValueError("an id is a plain decimal number")
    return value


JobId = Annotated[int, BeforeValidator(plain_id),
                  Path(ge=1, le=MAX_JOB_ID, description="The job's id: digits, no leading 0.")]


# -- routes --------------------------------------------------------------------------------

jobs = Router(tags=["jobs"])


@jobs.get("", response={200: JobPage, **errors(400)}, summary="List jobs (no payload)")
def list_jobs(request: HttpRequest, filters: Query[JobFilters]) -> dict[str, Any]:
    """Newest first. ``total`` is counted up to a cap so a list stays fast on a million
    rows; unknown query parameters are refused, not ignored. ``status=DONE`` lists the
    completed jobs kept by their targets' policies."""
    done = filters.status == JobStatus.DONE
    queryset = scoped((CompletedJob if done else Job).objects.all(), tenant_of(request))
    for name in FILTERS:
        value = getattr(filters, name)
        if value is not None and not (done and name == "status"):
            queryset = queryset.filter(**{name: value})
    total, capped = capped_count(queryset)
    start = (filters.page - 1) * filters.limit
    page = queryset.order_by("-id")[start:start + filters.limit]
    rows = [completed_as_job(row, JobOut)  # done: the queryset is CompletedJob's
            for row in cast("QuerySet[CompletedJob]", page).defer(
                "payload", "headers", "result", "actor")] \
        if done else list(page.values(*LIST_FIELDS))
    return {"data": rows, "total": total, "total_capped": capped, "page": filters.page,
            "limit": filters.limit}


@jobs.get("/{job_id}", response={200: JobDetail, **errors(404)},
          summary="One job with its payload, headers, last error and result")
def get_job(request: HttpRequest, job_id: JobId) -> Job | dict[str, Any]:
    """Waiting, running, DEAD, or DONE and kept by its target's policy (with its
    ``result``); a job not kept is 404."""
    scope = tenant_of(request)
    job = scoped(Job.objects.filter(id=job_id), scope).first()
    if job is not None:
        return job
    completed = scoped(CompletedJob.objects.filter(id=job_id), scope).first()
    if completed is None:
        raise JobNotFound(job_id)
    return completed_as_job(completed, JobDetail)


@jobs.post("/{job_id}/retry", response={200: JobOut, **errors(404, 409, 413)},
           summary="Retry a DEAD job")
def retry_job(request: HttpRequest, job_id: JobId) -> Job:
    """DEAD → PENDING now with attempts 0. Not DEAD (or a concurrent retry won): 409."""
    return actions.retry_job(job_id, request.user, scope=tenant_of(request))


@jobs.post("/{job_id}/skip", response={200: Skipped, **errors(404, 409, 413)},
           summary="Delete a DEAD job")
def skip_job(request: HttpRequest, job_id: JobId) -> dict[str, Any]:
    row = actions.skip_job(job_id, request.user, scope=tenant_of(request))
    return {"id": row.id, "skipped": True}


@jobs.post("/{job_id}/cancel", response={200: Cancelled, **errors(404, 409, 413)},
           summary="Remove a job that has not run")
def cancel_job(request: HttpRequest, job_id: JobId) -> dict[str, Any]:
    """A PENDING row not in flight, or a long-lane RUNNING row not yet started; a row
    being sent or run answers 409."""
    row = actions.cancel_job(job_id, request.user, scope=tenant_of(request))
    return {"id": row.id, "cancelled": True, "was": row.status}


api.add_router("/jobs", jobs)
