"""Django's admin autodiscovery imports ``<app>.admin``: the engine's pages live in
``jobs_engine.operators.admin``, with the API and metrics they sit beside."""

from jobs_engine.operators import admin, flows_admin, limits_admin  # noqa: F401  registers the admins
