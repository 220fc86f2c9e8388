from __future__ import annotations

import logging
from importlib.util import find_spec
from typing import Any

from django.apps import AppConfig
from django.db import DEFAULT_DB_ALIAS, connections

logger = logging.getLogger("jobs_engine.schedules")


class SchedulesConfig(AppConfig):
    name = "jobs_engine.contrib.schedules"
    # Not "schedules": a host project's own app may take that label (and its tables,
    # templates and admin URL names).
    label = "jobs_engine_schedules"
    verbose_name = "Schedules"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from jobs_engine.contrib.schedules.declarations import set_slot_runner
        from jobs_engine.contrib.schedules.runner import run_slot
        from jobs_engine.contrib.schedules.tick import worker_service
        from jobs_engine.lanes.worker import SCHEDULES, register_service

        # The engine imports no schedules code: workers that run the schedules lane
        # (tick_schedules, run_workers) get the tick from this hook, and a slot's job runs
        # through the runner handed to the declarations.
        register_service(SCHEDULES, worker_service)
        set_slot_runner(run_slot)
        # Likewise the API (the ``api`` extra): the schedules routes join the engine's
        # NinjaAPI from here.
        if find_spec("ninja") is not None:
            from jobs_engine.contrib.schedules.api import attach

            attach()
        post_migrate.connect(sync_after_migrate, sender=self,
                             dispatch_uid="jobs_engine.contrib.schedules.sync_after_migrate")


def sync_after_migrate(using: str = DEFAULT_DB_ALIAS, **_kwargs: Any) -> None:
    """Rows for the declared schedules exist after every ``migrate``, so an enqueue-only
    deployment (``JOBS_WORKERS=off``) shows them too."""
    from jobs_engine.contrib.schedules.models import Schedule
    from jobs_engine.contrib.schedules.sync import sync_declared

    if using != DEFAULT_DB_ALIAS:
        return
    if Schedule._meta.db_table not in connections[using].introspection.table_names():
        return  # migrated backwards past the schedules table
    try:
        sync_declared()
    except Exception:  # the schema is migrated; workers sync again when they start
        logger.exception("schedules sync after migrate failed")
