from typing import Any

from django.core.management.base import BaseCommand

from jobs_engine.lanes.worker import SCHEDULES
from jobs_engine.management.commands._lanes import run_lanes


class Command(BaseCommand):
    help = ("Sync the declared schedules, then tick them (every TICK_S, and when a slot is "
            "due) until SIGTERM/SIGINT. Under JOBS_WORKERS=off it only syncs.")

    def handle(self, *args: Any, **options: Any) -> None:
        from schedules.sync import sync_declared

        changed = sync_declared()
        self.stdout.write(f"schedules synced ({changed} rows inserted or changed)")
        run_lanes(self, {SCHEDULES})
