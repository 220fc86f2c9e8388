"""What every page of the engine's admin (and of its companion apps) shares.

``ManagedAdmin``: read-only pages that engine managers see whole and act on through
actions; a staff user with only Django's view permission sees a model's pages without its
private fields (``may_see_job_text``) and gets no action. Every page is bound to the
user's tenant (``tenancy``): a model with a tenant shows the user's tenant's rows only
(another tenant's row answers as an unknown id), and a model of the whole cluster
(``platform_only``: workers, partitions, target pauses) shows to the platform operator
only. Lists never count a whole table (capped counts, estimates on PostgreSQL, no
facets), so they stay fast with a million rows, and filter text no stored value can hold
lists nothing instead of failing. ``run_bulk`` is the one way a bulk action reports what
it did and what was refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection
from django.db.models import Model, QuerySet
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils.html import format_html

from jobs_engine.errors import OperationRefused
from jobs_engine.models import MANAGE_PERMISSION
from jobs_engine.operators.queries import CappedCountPaginator
from jobs_engine.tenancy import is_platform, scoped, tenant_of
from jobs_engine.text import storable

BULK_LIMIT = 1000  # rows one bulk action handles; "select all" on a million rows stops here


def can_manage(request: HttpRequest) -> bool:
    return request.user.is_active and request.user.has_perm(MANAGE_PERMISSION)


def may_see_job_text(request: HttpRequest) -> bool:
    """Payloads, headers, actors and error texts may hold personal data: only engine
    managers read them. Django's view permission shows the rest of a row, never these
    (every page, list filter and detail field asks this one check)."""
    return can_manage(request)


HIDDEN_TEXT = f"hidden: needs the {MANAGE_PERMISSION} permission"


def hidden(description: str) -> Callable[[Any, Any], str]:
    """The stand-in of one private field for users who may not read it."""

    @admin.display(description=description)
    def stand_in(modeladmin: Any, obj: Any) -> str:
        return HIDDEN_TEXT

    return stand_in


class EngineChangeList(ChangeList):
    """A filter or search value no column can hold lists nothing: sent to PostgreSQL it
    would fail the whole page (a 500) instead of matching no row."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None
                     ) -> QuerySet[Any]:
        queryset = super().get_queryset(request, exclude_parameters)
        if all(storable(value) for _, values in request.GET.lists() for value in values):
            return queryset
        return queryset.none()


if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin
else:
    class _ModelAdmin(admin.ModelAdmin):
        """``admin.ModelAdmin`` that takes its model as a type argument, as django-stubs
        types it (``ManagedAdmin[Job]``); Django's own class cannot be subscripted."""

        def __class_getitem__(cls, model: Any) -> type:
            return cls


class ReadOnlyAdmin[M: Model](_ModelAdmin[M]):
    """Pages that never add, edit or delete a row in place (actions are guarded changes),
    lists that never count a whole table, and rows of the user's tenant only.

    ``tenant_field``: the column naming a row's tenant (None: the model has none); with
    ``platform_only`` the pages are the platform operator's alone."""

    show_facets = admin.ShowFacets.NEVER  # facet counts scan the table
    show_full_result_count = False
    paginator = CappedCountPaginator
    list_per_page = 100
    tenant_field: str | None = "tenant_id"
    platform_only = False

    def shown_to(self, request: HttpRequest) -> bool:
        """Whether these pages show to the user at all (a cluster's: the platform
        operator only); the permissions decide the rest."""
        return not self.platform_only or is_platform(request)

    def get_queryset(self, request: HttpRequest) -> QuerySet[M]:
        queryset = super().get_queryset(request)
        if not self.shown_to(request):
            return queryset.none()
        if self.tenant_field is None:
            return queryset
        return scoped(queryset, tenant_of(request), self.tenant_field)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.shown_to(request) and super().has_view_permission(request, obj)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.shown_to(request) and super().has_module_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ManagedAdmin[M: Model](ReadOnlyAdmin[M]):
    """Engine managers see all and act (through actions); a staff user with Django's view
    permission sees the page without ``private`` fields and acts on nothing."""

    # Private model fields (see may_see_job_text) → the name they are shown under; a user
    # who may not read them sees the stand-in ``<field>_hidden`` instead, and cannot filter
    # the list on them.
    private: dict[str, str] = {}

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.shown_to(request) and (
            can_manage(request) or super().has_view_permission(request, obj))

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.shown_to(request) and (
            can_manage(request) or super().has_module_permission(request))

    def has_manage_permission(self, request: HttpRequest) -> bool:
        return self.shown_to(request) and can_manage(request)

    # -- private fields --------------------------------------------------------------------

    def _shown(self, request: HttpRequest, names: Any) -> tuple[Any, ...]:
        if not self.private or may_see_job_text(request):
            return tuple(names)
        stand_ins = {shown: f"{field}_hidden" for field, shown in self.private.items()}
        return tuple(stand_ins.get(name, name) for name in names)

    def get_queryset(self, request: HttpRequest) -> QuerySet[M]:
        queryset = super().get_queryset(request)
        if self.private and not may_see_job_text(request):
            return queryset.defer(*self.private)  # never even read from the database
        return queryset

    def get_list_display(self, request: HttpRequest) -> tuple[Any, ...]:
        return self._shown(request, super().get_list_display(request))

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> list[tuple[Any, Any]]:
        return [(title, {**options, "fields": self._shown(request, options["fields"])})
                for title, options in super().get_fieldsets(request, obj)]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return (*super().get_readonly_fields(request, obj),
                *(f"{field}_hidden" for field in self.private))

    def lookup_allowed(self, lookup: str, value: Any, request: HttpRequest) -> bool:
        """``?payload__contains=…`` would tell a viewer what a payload holds: refused (400)."""
        if lookup.split(LOOKUP_SEP)[0] in self.private and not may_see_job_text(request):
            return False
        return super().lookup_allowed(lookup, value, request)

    # -- bad input and actions -------------------------------------------------------------

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return EngineChangeList

    def names_a_row(self, text: str) -> bool:
        """Whether ``text`` could be a row's primary key: storable, of the key's type and,
        for an integer key, in the column's range (SQLite cannot even bind a larger one)."""
        field = self.model._meta.pk
        try:
            value = field.to_python(text) if storable(text) else None
        except ValidationError:
            return False
        if isinstance(value, int):
            low, high = connection.ops.integer_field_range(field.get_internal_type())
            return (low is None or value >= low) and (high is None or value <= high)
        return value is not None

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None
                   ) -> Any:
        """An id no column can hold names no row (Django then says so and redirects)."""
        possible = self.names_a_row(object_id) if from_field is None else storable(object_id)
        if not possible:
            return None
        return super().get_object(request, object_id, from_field)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None
                        ) -> HttpResponse:
        # A POST to a list page is an action: without the manage permission it is refused
        # outright (403), not answered with a list that silently did nothing.
        if request.method == "POST" and not can_manage(request):
            raise PermissionDenied
        return super().changelist_view(request, extra_context)

    def response_action(self, request: HttpRequest, queryset: QuerySet[M], *args: Any,
                        **kwargs: Any) -> HttpResponse | None:
        """A selected id that cannot be a row's key refuses the action with a message
        (it would otherwise fail in the database)."""
        selected = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        if not all(self.names_a_row(value) for value in selected):
            self.message_user(request, "Not done: a selected id names no row.", messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())
        return super().response_action(request, queryset, *args, **kwargs)


def pretty_json(value: Any) -> str:
    return format_html("<pre style='white-space: pre-wrap; margin: 0'>{}</pre>",
                       json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False,
                                  default=str))


def age(since: datetime | None, now: datetime) -> str:
    if since is None:
        return "-"
    seconds = (now - since).total_seconds()
    # Clocks of the web and database hosts differ a little: under a second is "now".
    return f"{max(seconds, 0):.0f} s ago" if seconds > -1 else f"in {-seconds:.0f} s"


def run_bulk(modeladmin: admin.ModelAdmin[Any], request: HttpRequest, keys: list[Any], verb: str,
             noun: str, action: Callable[[Any, Any], Any],
             describe: Callable[[Any, Any], str] | None = None) -> None:
    """Run ``action(key, user)`` on each selected row (at most ``BULK_LIMIT``; ``keys`` may
    hold one more to tell that the selection was cut); one message for the done ones (with
    ``describe(key, result)`` details when given), one for the refused with their reasons."""
    done, refused = [], []
    for key in keys[:BULK_LIMIT]:
        try:
            result = action(key, request.user)
        except OperationRefused as exc:
            refused.append(exc.message)
            continue
        done.append(describe(key, result) if describe else str(key))
    if done:
        details = f": {', '.join(done)}" if describe else ""
        modeladmin.message_user(request, f"{verb} {len(done)} {noun}(s){details}.",
                                messages.SUCCESS)
    if refused:
        shown = "; ".join(refused[:10]) + (" …" if len(refused) > 10 else "")
        modeladmin.message_user(request, f"Refused {len(refused)} {noun}(s): {shown}",
                                messages.WARNING)
    if len(keys) > BULK_LIMIT:
        modeladmin.message_user(
            request, f"Only the first {BULK_LIMIT} selected {noun}s were handled; run the "
            "action again for the rest.", messages.WARNING)
