"""The platform's settings in the JSON API: limits (``/api/v1/limits``), tenants' weights
(``/api/v1/tenant-weights``) and pausing a target by hand (``/api/v1/targets``).

Same session auth, CSRF check, ``jobs_engine.manage_jobs`` permission, strict input and
error shape as the jobs routes (``operators.api``). Limits, weights and pauses belong to
the whole platform, not to a tenant (``operators.limits_admin`` says why): only the
platform operator changes them, any other caller gets 403 ``forbidden`` and nothing
changes. A tenant's operator reads its own share only: the keys of limits per tenant that
are its own, and its own weight; a request of no tenant reads nothing. Every change goes
through ``operators.actions`` (its audit record, done or refused).

A limit is named by its target and its name: ``/limits/payments:charge/rate``. Both may
hold ``/`` (a limit per key is named ``concurrency/tenant`` unless its declaration names
it): the path is read as the one registered target and limit it spells, and one that
spells two answers 400.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from django.http import HttpRequest
from ninja import Field, Path, Query, Router, Schema
from pydantic import StrictInt

from jobs_engine import registry, store
from jobs_engine.errors import OperationRefused
from jobs_engine.limits import MAX_LIMIT_NAME_LENGTH, MAX_PERIOD_S, MAX_SLOTS, Concurrency, Limit
from jobs_engine.operators import actions
from jobs_engine.operators.actions import MAX_WEIGHT, LimitSetting
from jobs_engine.operators.api import BodyIn, QueryIn, Text, api, errors
from jobs_engine.operators.queries import KeyLine, limit_lines, weights_seen
from jobs_engine.registry import MAX_TARGET_NAME_LENGTH
from jobs_engine.tenancy import TENANT_ID_LIMIT, tenant_of

Whole = Annotated[StrictInt, Field(ge=1, le=MAX_SLOTS)]
Seconds = Annotated[float, Field(gt=0, le=MAX_PERIOD_S, strict=True)]
TargetName = Annotated[str, Path(max_length=MAX_TARGET_NAME_LENGTH,
                                 description="The target's name, as registered.")]
LimitName = Annotated[str, Path(max_length=MAX_LIMIT_NAME_LENGTH,
                                description="The limit's name on its target.")]
TenantId = Annotated[str, Path(max_length=TENANT_ID_LIMIT, description="The tenant's id.")]


class LimitValues(Schema):
    slots: int | None = Field(None, description="Concurrency: rows of a key running at once.")
    starts: int | None = Field(None, description="Rate: starts a period.")
    period_s: float | None = Field(None, description="Rate: the period, in seconds.")
    burst: int | None = Field(None, description="Rate: the starts a key may save up.")


class LimitOut(Schema):
    target: str
    limit: str = Field(description="The limit's name on its target.")
    kind: Literal["concurrency", "rate"]
    per: str = Field(description="What it holds per: target, tenant, code, limit_key or "
                                 "payload.<field>.")
    in_force: LimitValues = Field(description="What the workers apply: the override's "
                                              "values where one is set, else the declared.")
    declared: LimitValues = Field(description="As declared in code (register_target).")
    overridden: bool
    updated_at: datetime | None = Field(description="When the override was set.")
    updated_by: str | None = Field(description="Who set the override.")


class KeyOut(Schema):
    target: str
    limit: str
    kind: Literal["concurrency", "rate"]
    per: str
    key: str = Field(description="The key's value; empty: the target as a whole (or the "
                                 "rows of no tenant, for a limit per tenant).")
    tenant_id: str | None = Field(description="The tenant whose key it is (a limit per "
                                              "tenant); null: no tenant's.")
    in_force: LimitValues
    declared: LimitValues
    overridden: bool
    running: int = Field(description="Its rows RUNNING now.")
    tokens: float | None = Field(description="Rate: starts it may make now.")
    blocked_until: datetime | None = Field(description="A handler said wait "
                                                       "(RateLimited) until then.")
    admitted: int = Field(description="Jobs started under it.")
    throttled: int = Field(description="Times it held a due job back.")
    used_at: datetime | None = Field(description="Its last admission.")


class KeyList(Schema):
    data: list[KeyOut] = Field(description="Each limit of each registered target with "
                                           "limits, and each of its keys, by target, limit "
                                           "and key.")


class LimitFilters(QueryIn):
    target: Text | None = None


class OverrideIn(BodyIn):
    """The values to put in force; those left out stay as declared. A ``Concurrency``
    takes ``slots``; a ``Rate`` ``starts``, ``period_s`` and ``burst``."""

    slots: Whole | None = None
    starts: Whole | None = None
    period_s: Seconds | None = None
    burst: Whole | None = None


class WeightOut(Schema):
    tenant_id: str
    weight: int = Field(description="Its share of the long lane's reserves while tenants' "
                                    "rows wait (1: the default).")
    updated_at: datetime | None
    updated_by: str


class WeightList(Schema):
    data: list[WeightOut] = Field(description="The weights set, by tenant id (a tenant "
                                              "without one weighs 1); a tenant's operator "
                                              "reads its own.")


class WeightIn(BodyIn):
    weight: Annotated[StrictInt, Field(ge=1, le=MAX_WEIGHT,
                                       description="1 (the default) to 1000.")]


class PauseOut(Schema):
    target: str
    paused: bool
    by_hand: bool = Field(description="Paused by an operator: never probed, until resumed.")
    paused_until: datetime | None
    reason: str


def _kind(limit: Limit) -> str:
    return "concurrency" if isinstance(limit, Concurrency) else "rate"


def values_out(limit: Limit) -> dict[str, Any]:
    if isinstance(limit, Concurrency):
        return {"slots": limit.slots}
    return {"starts": limit.starts, "period_s": limit.period_s, "burst": limit.burst}


def setting_out(setting: LimitSetting) -> dict[str, Any]:
    override = setting.override
    return {"target": setting.target, "limit": setting.name,
            "kind": _kind(setting.declared), "per": setting.declared.per,
            "in_force": values_out(setting.in_force), "declared": values_out(setting.declared),
            "overridden": override is not None,
            "updated_at": None if override is None else override.updated_at,
            "updated_by": None if override is None else override.updated_by}


def key_out(line: KeyLine) -> dict[str, Any]:
    state = line.state
    return {"target": state.target, "limit": state.declared.name, "kind": _kind(state.declared),
            "per": state.declared.per, "key": state.key, "tenant_id": line.tenant_id,
            "in_force": values_out(state.limit), "declared": values_out(state.declared),
            "overridden": state.overridden, "running": state.running, "tokens": state.tokens,
            "blocked_until": state.blocked_until, "admitted": state.admitted,
            "throttled": state.throttled, "used_at": state.used_at}


def _declares(target: str, name: str) -> bool:
    try:
        return name in registry.get_target(target).limits.by_name
    except LookupError:
        return False


def limit_named(target: str, name: str) -> tuple[str, str]:
    """The registered target and limit a path spells. Django's path converters cut
    ``/limits/a/b/c`` at the last slash (target ``a/b``, limit ``c``); a limit's name may
    hold a slash too, so every cut is tried. None matches: the path's own (the action then
    says 404); two: refused (400)."""
    whole = f"{target}/{name}"
    cuts = [(whole[:i], whole[i + 1:]) for i, char in enumerate(whole) if char == "/"]
    found = [cut for cut in cuts if _declares(*cut)]
    if len(found) > 1:
        raise OperationRefused(f"path: {whole!r} names {len(found)} limits ("
                               + ", ".join(f"{t!r} {n!r}" for t, n in found)
                               + "); change one through the admin")
    return found[0] if found else (target, name)


def pause_out(target: str, pause: store.PauseRow | None) -> dict[str, Any]:
    return {"target": target, "paused": pause is not None,
            "by_hand": pause is not None and pause.by_hand,
            "paused_until": None if pause is None else pause.paused_until,
            "reason": "" if pause is None else pause.reason}


limits_router = Router(tags=["limits"])
weights_router = Router(tags=["limits"])
targets_router = Router(tags=["limits"])


@limits_router.get("", response={200: KeyList, **errors(400)},
                   summary="Every limit and key: values in force, running, tokens, counts")
def list_limits(request: HttpRequest, filters: Query[LimitFilters]) -> dict[str, Any]:
    """The platform operator's: every key of every registered target's limits
    (``?target=`` narrows them to one target). A tenant's operator: the keys of limits
    per tenant that are its own. A request of no tenant: none."""
    lines = limit_lines(tenant_of(request), target=filters.target)
    return {"data": [key_out(line) for line in lines]}


@limits_router.put("/{path:target}/{path:name}",
                   response={200: LimitOut, **errors(400, 404, 413, 415)},
                   summary="Override a limit's values")
def set_override(request: HttpRequest, target: TargetName, name: LimitName,
                 body: OverrideIn) -> dict[str, Any]:
    """The values given replace the declared ones (the others stay as declared) from every
    worker's next admission, until cleared; a new override replaces the last one whole. A
    field of the other kind of limit, or none, is 400; an unknown target or limit 404;
    nothing changes either way. The platform operator's only (403)."""
    target, name = limit_named(target, name)
    return setting_out(actions.set_limit_override(
        target, name, body.model_dump(), request.user, scope=tenant_of(request)))


@limits_router.delete("/{path:target}/{path:name}",
                      response={200: LimitOut, **errors(400, 404, 413)},
                      summary="Clear a limit's override")
def clear_override(request: HttpRequest, target: TargetName, name: LimitName
                   ) -> dict[str, Any]:
    """Back to the declared values (a limit without override: nothing to do, 200). The
    platform operator's only (403)."""
    target, name = limit_named(target, name)
    return setting_out(actions.clear_limit_override(target, name, request.user,
                                                    scope=tenant_of(request)))


@weights_router.get("", response={200: WeightList, **errors()},
                    summary="Tenants' weights in the long lane's fair shares")
def list_weights(request: HttpRequest) -> dict[str, Any]:
    """The platform operator's: every weight set. A tenant's operator: its own (1 when
    none is set). A request of no tenant: none."""
    return {"data": [vars(row) for row in weights_seen(tenant_of(request))]}


@weights_router.put("/{path:tenant_id}", response={200: WeightOut, **errors(400, 404, 413, 415)},
                    summary="Set a tenant's weight")
def set_weight(request: HttpRequest, tenant_id: TenantId, body: WeightIn) -> dict[str, Any]:
    """From the next reserve on; 1 removes the tenant's row (the default). An id no tenant
    can have (not 1 to 200 printable characters) is 404. The platform operator's only
    (403)."""
    return vars(actions.set_tenant_weight(tenant_id, body.weight, request.user,
                                          scope=tenant_of(request)))


@targets_router.post("/{path:name}/pause", response={200: PauseOut, **errors(404, 413)},
                     summary="Pause a target by hand")
def pause(request: HttpRequest, name: TargetName) -> dict[str, Any]:
    """No worker sends its rows until it is resumed; it is never probed (the breaker's
    pause is, and ends by itself). A target paused by hand already: nothing to do, 200.
    An unregistered target is 404. The platform operator's only (403)."""
    row = actions.pause_target(name, request.user, scope=tenant_of(request))
    return pause_out(name, row)


@targets_router.post("/{path:name}/resume", response={200: PauseOut, **errors(404, 409, 413)},
                     summary="Resume a paused target")
def resume(request: HttpRequest, name: TargetName) -> dict[str, Any]:
    """Ends its pause, the breaker's or one made by hand: workers send its rows again at
    their next poll. A registered target not paused is 409; an unknown one 404. The
    platform operator's only (403)."""
    actions.resume_target(name, request.user, scope=tenant_of(request))
    return pause_out(name, None)


_attached: list[bool] = []


def attach() -> None:
    """Add the routes to the engine's API, once (before its URLs are first built)."""
    if not _attached:
        api.add_router("/limits", limits_router)
        api.add_router("/tenant-weights", weights_router)
        api.add_router("/targets", targets_router)
        _attached.append(True)
