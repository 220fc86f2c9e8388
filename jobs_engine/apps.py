from importlib.util import find_spec

from django.apps import AppConfig


class JobsEngineConfig(AppConfig):
    name = "jobs_engine"
    verbose_name = "Jobs engine"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings
        from django.core.signals import setting_changed

        from jobs_engine import (
            checks,  # noqa: F401  registers the system check
            flows,
        )
        from jobs_engine.conf import reset_settings_cache

        setting_changed.connect(reset_settings_cache)
        flows.register_flow_target()
        if _names_this_engine(getattr(settings, "TASKS", None)):
            from jobs_engine.tasks.backend import register_configured_backends

            register_configured_backends()
        if find_spec("ninja") is not None:  # the ``api`` extra: these routes join it
            from jobs_engine.operators import flows_api, limits_api

            flows_api.attach()
            limits_api.attach()


def _names_this_engine(tasks: object) -> bool:
    """Whether ``TASKS`` configures a backend of this package (its queues' targets are then
    registered at start-up, before a worker polls)."""
    return isinstance(tasks, dict) and any(
        isinstance(params, dict) and str(params.get("BACKEND", "")).startswith("jobs_engine.")
        for params in tasks.values())
