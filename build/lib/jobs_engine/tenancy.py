"""Which tenant a request acts for: the host project's ``JOBS["TENANT_RESOLVER"]``.

The engine knows tenants only as the ``tenant_id`` a flow was started under. A request of
tenant A sees A's flows only; another tenant's flow answers as an unknown one would (404),
so ids reveal nothing. ``None`` is the platform operator, who sees every tenant.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from django.utils.module_loading import import_string

from jobs_engine.conf import jobs_settings


@lru_cache(maxsize=4)
def _resolver(path: str) -> Callable[[HttpRequest], Any]:
    try:
        return import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(f"JOBS['TENANT_RESOLVER']: cannot import {path!r}: {exc}"
                                   ) from None


def tenant_of(request: HttpRequest) -> str | None:
    """The tenant ``request`` acts for, or None for the platform operator."""
    path = jobs_settings().TENANT_RESOLVER
    if not path:
        return None
    tenant = _resolver(path)(request)
    if tenant is not None and not isinstance(tenant, str):
        raise ImproperlyConfigured(f"JOBS['TENANT_RESOLVER'] {path!r} returned "
                                   f"{type(tenant).__name__}, not a str or None")
    return tenant
