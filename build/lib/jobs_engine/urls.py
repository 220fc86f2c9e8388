"""URLs a host project includes: ``path("jobs/", include("jobs_engine.urls"))``.

- ``api/v1/`` — the JSON API (the ``api`` extra: django-ninja), its docs at
  ``api/v1/docs``; any other path under it answers 404 in the API's error shape;
- ``metrics`` — Prometheus metrics (the ``metrics`` extra: prometheus-client), closed to
  anonymous callers without the metrics token.

Without an extra the rest works, and the missing part answers 501 saying what to install.
"""

from __future__ import annotations

from importlib.util import find_spec

from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver, path, re_path

from jobs_engine.operators.metrics import metrics_view


def _missing_api(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
    return HttpResponse("the jobs-engine API needs django-ninja: "
                        "pip install 'jobs-engine[api]'\n", status=501,
                        content_type="text/plain")


def _api_patterns() -> list[URLPattern | URLResolver]:
    if find_spec("ninja") is None:
        return [re_path(r"^api/v1/", _missing_api)]
    from jobs_engine.operators.api import api, not_found_view

    return [path("api/v1/", api.urls), re_path(r"^api/v1/", not_found_view)]


urlpatterns = [
    *_api_patterns(),
    path("metrics", metrics_view, name="jobs_metrics"),
]
