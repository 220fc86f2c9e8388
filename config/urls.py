"""URLs: the admin, the JSON API under ``/api/v1/`` and the Prometheus ``/metrics``."""

from django.contrib import admin
from django.urls import path, re_path

from jobs_engine.api import api, not_found_view
from jobs_engine.metrics import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    re_path(r"^api/v1/", not_found_view),  # unknown API paths answer in the API's shape
    path("metrics", metrics_view, name="metrics"),
]
