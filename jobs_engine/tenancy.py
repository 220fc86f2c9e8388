"""Tenants: which tenant a job belongs to, and which tenant's objects a request may see.

Jobs (waiting, DEAD or completed), flows, schedules, their statistics and the audit records
of actions on them each belong to one tenant (``tenant_id``, a short printable string) or
to none (the platform's own, such as a system schedule). ``JOBS["TENANT_RESOLVER"]`` is
the dotted path of ``f(request)`` that tells which tenant a request acts for; it answers:

- a tenant id: that tenant's objects only; another tenant's answer exactly as an unknown
  id would (404), so ids reveal nothing;
- ``PLATFORM``: the platform operator, who sees and acts on every tenant's objects;
- ``None`` (an unknown user, say): no tenant's objects at all. A resolver that cannot tell
  fails closed, never open.

A project without a resolver is single-tenant: every request is the platform operator's.
The same three values, as a ``Scope``, bound the operator functions called from code
(``PLATFORM`` by default, code being trusted).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from functools import lru_cache
from typing import Any, Final, Literal, cast

from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.utils.module_loading import import_string

from jobs_engine.conf import jobs_settings
from jobs_engine.errors import InvalidSettings
from jobs_engine.text import clean


class Platform(Enum):
    """The platform operator: above every tenant (one value, so a check is ``is``)."""

    PLATFORM = "platform"

    def __repr__(self) -> str:
        return "PLATFORM"


PLATFORM: Final = Platform.PLATFORM
# Whose objects a caller may see: one tenant's, every tenant's, or none.
Scope = str | Literal[Platform.PLATFORM] | None

TENANT_ID_LIMIT = 200  # the tenant_id columns hold 200 characters


def tenant_id_problem(value: Any) -> str | None:
    """What is wrong with ``value`` as a tenant id, or None: a tenant id is a string of 1 to
    ``TENANT_ID_LIMIT`` printable characters (no NUL, control character or lone
    surrogate), so every column, log line and admin page shows it as it is."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if not value:
        return "must not be empty"
    if len(value) > TENANT_ID_LIMIT:
        return f"is {len(value)} characters, over {TENANT_ID_LIMIT}"
    if not value.isprintable():
        return "holds a character that is not printable (a NUL, a control character or a " \
               "lone surrogate)"
    return None


def tenant_for(given: Any, serving: str | None) -> str | None:
    """The tenant a new job, flow or schedule belongs to: ``given``; for None the tenant the
    caller serves (``serving``: the request's or the running job's); ``PLATFORM``: none.
    ``ValueError`` naming what is wrong with a given value that is no tenant id."""
    if given is None:
        return serving
    if given is PLATFORM:
        return None
    problem = tenant_id_problem(given)
    if problem is not None:
        raise ValueError(f"{problem} (a tenant id, PLATFORM or None)")
    return cast(str, given)  # tenant_id_problem found no problem: a str


# -- the resolver --------------------------------------------------------------------------


@lru_cache(maxsize=4)
def _load(path: str) -> Callable[[HttpRequest], Any]:
    try:
        resolver: object = import_string(path)
    except ImportError as exc:
        raise InvalidSettings(f"JOBS['TENANT_RESOLVER']: cannot import {path!r}: {exc}"
                              ) from None
    if not callable(resolver):
        raise InvalidSettings(f"JOBS['TENANT_RESOLVER']: {path!r} is a "
                              f"{type(resolver).__name__}, not a function of the request")
    return resolver


def check_resolver() -> str | None:
    """Why the configured resolver cannot be used, or None (the system check asks, so a
    resolver that cannot be imported stops the process at start-up, not each request)."""
    path = jobs_settings().TENANT_RESOLVER
    if not path:
        return None
    try:
        _load(path)
    except InvalidSettings as exc:
        return str(exc)
    return None


_SCOPE_ATTRIBUTE = "_jobs_engine_scope"  # one resolver call per request


def tenant_of(request: HttpRequest) -> Scope:
    """Whose objects ``request`` may see (see the module docstring). The resolver runs once
    per request; an answer that is none of the three is ``InvalidSettings`` naming it, and
    the request changes nothing."""
    known = getattr(request, _SCOPE_ATTRIBUTE, _SCOPE_ATTRIBUTE)
    if known is not _SCOPE_ATTRIBUTE:
        return cast(Scope, known)  # set below, a Scope
    path = jobs_settings().TENANT_RESOLVER
    scope: Scope = PLATFORM
    if path:
        answer = _load(path)(request)
        if answer is not None and answer is not PLATFORM:
            problem = tenant_id_problem(answer)
            if problem is not None:
                raise InvalidSettings(
                    f"JOBS['TENANT_RESOLVER'] {path!r} returned {clean(repr(answer), 80)}: a "
                    f"tenant id {problem}; return a tenant id, PLATFORM or None")
        scope = answer
    setattr(request, _SCOPE_ATTRIBUTE, scope)
    return scope


def is_platform(request: HttpRequest) -> bool:
    """Whether ``request`` is the platform operator's: the only one to see what belongs to
    no tenant and the whole cluster (workers, partitions, target pauses, metrics)."""
    return tenant_of(request) is PLATFORM


# -- what a scope sees ---------------------------------------------------------------------


def scoped[M: Model](queryset: QuerySet[M], scope: Scope,
                     field: str = "tenant_id") -> QuerySet[M]:
    """``queryset`` narrowed to what ``scope`` sees."""
    if scope is PLATFORM:
        return queryset
    if scope is None:
        return queryset.none()
    return queryset.filter(**{field: scope})


def sees(scope: Scope, tenant_id: str | None) -> bool:
    """Whether ``scope`` sees an object of ``tenant_id`` (None: the platform's own)."""
    return scope is PLATFORM or (scope is not None and scope == tenant_id)


def owner_of(scope: Scope) -> str | None:
    """The tenant a record made under ``scope`` belongs to: a tenant's own, else none (the
    platform operator's records, and those of a request without a tenant, are seen by the
    platform operator only)."""
    return scope if isinstance(scope, str) else None
