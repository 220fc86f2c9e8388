"""Request context: the trace id, actor and tenant stamped on every job enqueued in a
request.

Outside a request each enqueue gets a fresh trace id and no tenant. When a job runs, its
handler sees the job's own trace id and tenant, so a chain of side effects shares one
trace and stays with its tenant.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.http import HttpRequest, HttpResponse

from jobs_engine.tenancy import owner_of, tenant_of

_trace_id: ContextVar[str | None] = ContextVar("jobs_engine_trace_id", default=None)
_actor: ContextVar[dict[str, Any] | None] = ContextVar("jobs_engine_actor", default=None)
# A job's tenant (None: none), or the request whose tenant is read when first needed.
_tenant: ContextVar[str | HttpRequest | None] = ContextVar("jobs_engine_tenant", default=None)


def new_trace_id() -> str:
    return secrets.token_hex(16)  # 128 random bits: uuid4().hex in a quarter of the time


def request_trace_id() -> str | None:
    """The trace id of the request or job this code runs in; None outside one."""
    return _trace_id.get()


def current_actor() -> dict[str, Any] | None:
    return _actor.get()


def current_tenant() -> str | None:
    """The tenant of the request or job this code runs for; None outside one, and for a
    request the platform operator serves or one without a tenant. A request's tenant is
    asked of the resolver only here, at the first enqueue that needs it."""
    tenant = _tenant.get()
    if tenant is None or isinstance(tenant, str):
        return tenant
    return owner_of(tenant_of(tenant))


class job_context:  # lower case: used as a function, ``with job_context(...):``
    """The trace id, actor and tenant of the job (or request) the code inside runs for.

    A class, not a ``@contextmanager`` generator: a lane enters one per job, and the
    generator's machinery costs more than this class's enter and exit."""

    __slots__ = ("_actor", "_actor_token", "_tenant", "_tenant_token", "_trace_id",
                 "_trace_token")

    def __init__(self, trace_id: str | None, actor: dict[str, Any] | None = None,
                 tenant: str | HttpRequest | None = None) -> None:
        self._trace_id, self._actor, self._tenant = trace_id, actor, tenant

    def __enter__(self) -> None:
        self._trace_token = _trace_id.set(self._trace_id)
        self._actor_token = _actor.set(self._actor)
        self._tenant_token = _tenant.set(self._tenant)

    def __exit__(self, *exc_info: object) -> None:
        _trace_id.reset(self._trace_token)
        _actor.reset(self._actor_token)
        _tenant.reset(self._tenant_token)


@dataclass(frozen=True)
class LongLaneTry:
    """The try a long-lane handler runs in: its worker, when it started, and the job's
    earlier tries (its ``tries`` entries, oldest first)."""

    worker_id: str
    started_at: datetime
    earlier: tuple[dict[str, Any], ...]


_try: ContextVar[LongLaneTry | None] = ContextVar("jobs_engine_try", default=None)


def current_try() -> LongLaneTry | None:
    """The running long-lane try, inside its handler; None anywhere else."""
    return _try.get()


class try_context:  # lower case: used as a function, as ``job_context`` is
    """The long-lane try the code inside runs in; a class for the reason ``job_context``
    is one."""

    __slots__ = ("_running", "_token")

    def __init__(self, running: LongLaneTry) -> None:
        self._running = running

    def __enter__(self) -> None:
        self._token = _try.set(self._running)

    def __exit__(self, *exc_info: object) -> None:
        _try.reset(self._token)


# What a request may name as its trace id: anything else (a NUL, text no column can hold,
# an endless value) gets a fresh one.
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def _trace_from_request(request: HttpRequest) -> str:
    traceparent = request.headers.get("traceparent", "")
    parts = traceparent.split("-")
    if len(parts) == 4 and re.fullmatch(r"[0-9a-f]{32}", parts[1]):
        return parts[1]
    request_id = request.headers.get("X-Request-ID", "")
    return request_id if _REQUEST_ID.fullmatch(request_id) else new_trace_id()


class RequestContextMiddleware:
    """Sets the trace id, actor and tenant (``JOBS["TENANT_RESOLVER"]``, asked at the first
    enqueue) for jobs enqueued while serving a request."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        user = getattr(request, "user", None)
        actor = None
        if user is not None and user.is_authenticated:
            actor = {"type": "user", "id": user.pk, "username": user.get_username()}
        with job_context(_trace_from_request(request), actor, request):
            return self.get_response(request)
