"""The admin's "Limits" page: each registered target's limits (``jobs_engine.limits``) with
each of their keys, the operators' overrides, and the tenants' weights in the long lane's
fair shares.

Who sees and does what:

- **Changes are the platform operator's.** A limit, a tenant's weight and a target's pause
  hold for the whole cluster and every tenant's jobs (a limit per target is shared by every
  tenant's rows; a weight is a tenant's share against the others), so no tenant's operator
  may change one, its own weight included: the forms show to a user with
  ``jobs_engine.manage_jobs`` who is the platform operator, and a change posted by anyone
  else is refused (403 without the permission; with it, refused and audited). Every change
  goes through ``operators.actions``, which writes its ``AuditRecord``, done or refused.
- **Reading**: Django's view permission of the page (``jobs_engine.view_targetlimit``) or
  ``manage_jobs``, as the engine's other pages. The platform operator sees every key and
  every weight. A tenant's operator sees its own share only: the keys of limits per tenant
  that are its own (values in force, running rows, tokens, counts) and its own weight; not
  the keys every tenant shares (a limit per target: its running rows and counts are every
  tenant's jobs) nor other keys (per code, field or limit key: any tenant's). A request of
  no tenant sees neither.
- A key of a limit per payload field or per ``limit_key`` is the text of a job's payload
  or enqueue: shown only to who may read payloads (``may_see_job_text``).

The page is computed from the registry and ``store.limits_state`` (the buckets, overrides
and running rows), like the targets' page; ``TargetLimit`` has no table.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from jobs_engine.errors import OperationRefused
from jobs_engine.limits import (
    FIELD_PREFIX,
    PER_LIMIT_KEY,
    PER_TARGET,
    Concurrency,
    Limit,
    Rate,
)
from jobs_engine.models import TargetLimit
from jobs_engine.operators import actions
from jobs_engine.operators.actions import ALL_OVERRIDE_FIELDS, MAX_WEIGHT, OVERRIDE_FIELDS
from jobs_engine.operators.admin_base import (
    HIDDEN_TEXT,
    ManagedAdmin,
    age,
    can_manage,
    may_see_job_text,
)
from jobs_engine.operators.queries import KeyLine, limit_lines, weights_seen
from jobs_engine.tenancy import is_platform, tenant_of

KEYS_SHOWN = 50  # keys listed per limit, the most recently used first; the API lists all
_WHOLE = re.compile(r"[0-9]{1,12}")
_DECIMAL = re.compile(r"[0-9]{0,12}\.[0-9]{1,12}|[0-9]{1,12}(\.[0-9]{0,12})?[eE][+-]?[0-9]{1,3}")


def form_number(text: str) -> Any:
    """A form's text as the number it spells (whole or decimal); empty: None (the declared
    value); anything else as it is, for the action to refuse naming it."""
    text = text.strip()
    if not text:
        return None
    if _WHOLE.fullmatch(text):
        return int(text)
    if _DECIMAL.fullmatch(text):
        return float(text)
    return text


def values_text(limit: Limit) -> str:
    if isinstance(limit, Concurrency):
        return f"{limit.slots} at once"
    return f"{limit.starts} per {limit.period_s:g} s, burst {limit.burst}"


def per_text(per: str) -> str:
    return "the target" if per == PER_TARGET else per


def private_key(limit: Limit) -> bool:
    """Whether the keys of ``limit`` are a job's text (a payload field, a ``limit_key``)."""
    return limit.per.startswith(FIELD_PREFIX) or limit.per == PER_LIMIT_KEY


def _when(moment: datetime | None, now: datetime) -> str:
    return "-" if moment is None else age(moment, now)


def limit_groups(lines: list[KeyLine], *, text_shown: bool, now: datetime
                 ) -> list[dict[str, Any]]:
    """One entry per target's limit: its values in force and declared, the fields of an
    override (its values, blank for the declared ones), and its keys (at most
    ``KEYS_SHOWN``, the most recently used first)."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for line in lines:
        state = line.state
        declared = state.declared
        group = groups.get((state.target, declared.name))
        if group is None:
            override = actions.limit_setting(state.target, declared).override
            group = groups[(state.target, declared.name)] = {
                "target": state.target, "name": declared.name,
                "kind": type(declared).__name__, "per": per_text(declared.per),
                "in_force": values_text(state.limit), "declared": values_text(declared),
                "overridden": state.overridden,
                "override_by": "" if override is None else override.updated_by,
                "override_at": None if override is None else override.updated_at,
                "fields": [{"name": field,
                            "value": "" if override is None or getattr(override, field) is None
                            else f"{getattr(override, field):g}",
                            "declared": f"{getattr(declared, field):g}"}
                           for field in OVERRIDE_FIELDS[type(declared)]],
                "keys": [], "more": 0}
        group["keys"].append(line)
    for group in groups.values():
        keys: list[KeyLine] = sorted(
            group["keys"], key=lambda line: (line.state.used_at is None,
                                             -(line.state.used_at or now).timestamp(),
                                             line.state.key))
        group["more"] = max(0, len(keys) - KEYS_SHOWN)
        group["keys"] = [_key_row(line, text_shown, now) for line in keys[:KEYS_SHOWN]]
    return sorted(groups.values(), key=lambda group: (group["target"], group["name"]))


def _key_row(line: KeyLine, text_shown: bool, now: datetime) -> dict[str, Any]:
    state = line.state
    if state.declared.per == PER_TARGET:
        key = "(the whole target)"
    elif not state.key and state.used_at is None:
        key = "(no key used yet)"
    elif not state.key:
        key = "(the rows of no tenant)"  # a limit per tenant: the platform's own rows
    elif private_key(state.declared) and not text_shown:
        key = HIDDEN_TEXT
    else:
        key = state.key
    limit = state.limit
    return {"key": key, "tenant_id": line.tenant_id, "running": state.running,
            "slots": limit.slots if isinstance(limit, Concurrency) else None,
            "tokens": (f"{state.tokens:.1f} of {limit.burst}"
                       if state.tokens is not None and isinstance(limit, Rate) else None),
            "blocked": (age(state.blocked_until, now)
                        if state.blocked_until is not None and state.blocked_until > now
                        else "-"),
            "admitted": state.admitted, "throttled": state.throttled,
            "used": _when(state.used_at, now)}


@admin.register(TargetLimit)
class TargetLimitAdmin(ManagedAdmin[TargetLimit]):
    """The Limits page (see the module docstring for who sees and changes what)."""

    tenant_field = None

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view
        return [
            path("", view(require_GET(self.changelist_view)),
                 name="jobs_engine_targetlimit_changelist"),
            path("override/", view(require_POST(self.override_view)),
                 name="jobs_engine_targetlimit_override"),
            path("override/clear/", view(require_POST(self.clear_view)),
                 name="jobs_engine_targetlimit_clear"),
            path("weight/", view(require_POST(self.weight_view)),
                 name="jobs_engine_targetlimit_weight"),
        ]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None
                        ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        now, scope = timezone.now(), tenant_of(request)
        context = {**self.admin_site.each_context(request), "opts": self.model._meta,
                   "title": "Limits",
                   "limits": limit_groups(limit_lines(scope), now=now,
                                          text_shown=may_see_job_text(request)),
                   "weights": weights_seen(scope), "max_weight": MAX_WEIGHT,
                   "can_change": can_manage(request) and is_platform(request),
                   "platform": is_platform(request), **(extra_context or {})}
        return TemplateResponse(request, "admin/jobs_engine/targetlimit/change_list.html",
                                context)

    # -- changes: each through ``operators.actions``, audited ------------------------------

    def _back(self, request: HttpRequest) -> HttpResponseRedirect:
        return HttpResponseRedirect(reverse("admin:jobs_engine_targetlimit_changelist"))

    def _change(self, request: HttpRequest, change: Any) -> HttpResponseRedirect:
        """Run ``change()`` (an action of the user's): its message, done or refused, and
        back to the page."""
        if not can_manage(request):
            raise PermissionDenied
        try:
            done = change()
        except OperationRefused as exc:
            self.message_user(request, f"Not done: {exc.message}", messages.ERROR)
        else:
            self.message_user(request, done, messages.SUCCESS)
        return self._back(request)

    def override_view(self, request: HttpRequest) -> HttpResponse:
        post = request.POST

        def change() -> str:
            values = {field: form_number(post.get(field, "")) for field in ALL_OVERRIDE_FIELDS}
            setting = actions.set_limit_override(post.get("target", ""), post.get("name", ""),
                                                 values, request.user,
                                                 scope=tenant_of(request))
            return (f"Limit {setting.name} of {setting.target}: "
                    f"{values_text(setting.in_force)} in force (declared "
                    f"{values_text(setting.declared)}).")

        return self._change(request, change)

    def clear_view(self, request: HttpRequest) -> HttpResponse:
        post = request.POST

        def change() -> str:
            setting = actions.clear_limit_override(post.get("target", ""),
                                                   post.get("name", ""), request.user,
                                                   scope=tenant_of(request))
            return (f"Limit {setting.name} of {setting.target}: back to its declared "
                    f"{values_text(setting.declared)}.")

        return self._change(request, change)

    def weight_view(self, request: HttpRequest) -> HttpResponse:
        post = request.POST

        def change() -> str:
            row = actions.set_tenant_weight(post.get("tenant_id", "").strip(),
                                            form_number(post.get("weight", "")),
                                            request.user, scope=tenant_of(request))
            return f"Tenant {row.tenant_id}: weight {row.weight}."

        return self._change(request, change)
