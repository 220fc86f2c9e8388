"""URLs of the demo project: the admin, and the engine's URLs under ``jobs/`` exactly as a
host project includes them (the API at ``jobs/api/v1/``, metrics at ``jobs/metrics``)."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("jobs/", include("jobs_engine.urls")),
]
