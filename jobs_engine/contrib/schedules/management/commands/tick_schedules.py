from typing import Any

from django.core.management.base import BaseCommand, CommandError

from jobs_engine.errors import DatabaseNotReady
from jobs_engine.lanes.worker import SCHEDULES
from jobs_engine.management.commands._lanes import run_lanes
from jobs_engine.readiness import check_database


class Command(BaseCommand):
    help = ("Sync the declared schedules, then tick them (every TICK_S, and when a slot is "
            "due) until SIGTERM/SIGINT. Under JOBS_WORKERS=off it only syncs.")

    def handle(self, *args: Any, **options: Any) -> None:
        from jobs_engine.contrib.schedules.sync import sync_declared

        try:  # before the sync, which would fail with a traceback
            check_database()
        except DatabaseNotReady as exc:
            raise CommandError(f"cannot tick schedules: {exc}") from None
        changed = sync_declared()
        self.stdout.write(f"schedules synced ({changed} rows inserted or changed)")
        run_lanes(self, {SCHEDULES})
