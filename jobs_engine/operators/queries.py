"""Reads of the operator surfaces (admin lists, API list): counts that stay fast with a
million rows.

A list page never counts the whole table: it counts at most ``COUNT_CAP + 1`` matching
rows (``SELECT COUNT(*) FROM (... LIMIT n)``), and past the cap shows the cap, or on
PostgreSQL the planner's estimate of the table's rows for an unfiltered list.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.utils.functional import cached_property

from jobs_engine import store

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
