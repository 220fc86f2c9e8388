"""Reads of the operator surfaces (admin lists, API list): counts that stay fast with a
million rows, and the limits and tenants' weights a caller's tenant sees.

A list page never counts the whole table: it counts at most ``COUNT_CAP + 1`` matching
rows (``SELECT COUNT(*) FROM (... LIMIT n)``), and past the cap shows the cap, or on
PostgreSQL the planner's estimate of the table's rows for an unfiltered list.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.utils.functional import cached_property

from jobs_engine import registry, store
from jobs_engine.limits import PER_TENANT, Rate
from jobs_engine.tenancy import PLATFORM, Scope

COUNT_CAP = 10_000


def capped_count(queryset: QuerySet[Any], cap: int | None = None) -> tuple[int, bool]:
    """(rows, capped): the number of rows up to ``cap`` (``COUNT_CAP``); ``capped`` when
    there are more."""
    cap = COUNT_CAP if cap is None else cap
    found = queryset.order_by().values("pk")[: cap + 1].count()
    return min(found, cap), found > cap


def is_filtered(queryset: QuerySet[Any]) -> bool:
    return bool(queryset.query.where)


if TYPE_CHECKING:
    _Paginator = Paginator[Any]  # generic in django-stubs only: any model's rows
else:
    _Paginator = Paginator


class CappedCountPaginator(_Paginator):
    """Admin paginator whose count is capped (and estimated past the cap when unfiltered
    on PostgreSQL), so a list page of a huge table does no full count."""

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not isinstance(queryset, QuerySet):
            return super().count
        found, capped = capped_count(queryset)
        if not capped:
            return found
        if not is_filtered(queryset):
            estimate = store.table_row_estimate(queryset.model._meta.db_table)
            if estimate is not None:
                return max(estimate, found + 1)
        return found + 1  # "more than the cap": one page past it is reachable


# -- limits and weights, as a tenant sees them -----------------------------------------------


@dataclasses.dataclass(frozen=True)
class KeyLine:
    """One key of one limit as operators see it, and the tenant whose key it is (a limit
    per tenant keys on the tenant's id; None: no tenant's, such as a limit of the whole
    target, which every tenant's jobs share)."""

    state: store.BucketState
    tenant_id: str | None


def key_tenant(state: store.BucketState) -> str | None:
    return state.key or None if state.declared.per == PER_TENANT else None


def limit_lines(scope: Scope, now: datetime | None = None, target: str | None = None
                ) -> list[KeyLine]:
    """The keys of the registered targets' limits (``target``: of that one only) that
    ``scope`` sees: the platform operator every key; a tenant the keys of limits per
    tenant that are its own (a line of a full bucket for a key never used yet), nothing of
    a key every tenant shares; no tenant nothing."""
    if scope is None:
        return []
    limited = [t for t in registry.all_targets()
               if t.limits and (target is None or t.name == target)]
    states = store.limits_state(limited, now or store.db_now()) if limited else []
    if scope is PLATFORM:
        return [KeyLine(state, key_tenant(state)) for state in states]
    mine = [state for state in states
            if state.declared.per == PER_TENANT and state.key == scope]
    have = {(state.target, state.declared.name) for state in mine}
    for state in states:
        limit = (state.target, state.declared.name)
        if state.declared.per == PER_TENANT and limit not in have:
            have.add(limit)  # a key of the tenant's never used: a full bucket, nothing run
            mine.append(dataclasses.replace(
                state, key=scope, running=0,
                tokens=float(state.limit.burst or 0) if isinstance(state.limit, Rate) else None,
                blocked_until=None, admitted=0, throttled=0, used_at=None))
    mine.sort(key=lambda state: (state.target, state.declared.name))
    return [KeyLine(state, scope) for state in mine]


def weights_seen(scope: Scope) -> list[store.TenantWeightRow]:
    """The tenants' weights ``scope`` sees: the platform operator every weight set; a
    tenant its own (1 when none is set); no tenant none."""
    if scope is None:
        return []
    if scope is PLATFORM:
        return store.tenant_weights()
    return store.tenant_weights(of_tenant=scope) or [store.TenantWeightRow(scope, 1, None, "")]
