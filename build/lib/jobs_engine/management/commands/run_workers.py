from typing import Any

from django.core.management.base import BaseCommand

from jobs_engine.lanes.worker import SCHEDULES
from jobs_engine.management.commands._lanes import run_lanes
from jobs_engine.states import Lane


class Command(BaseCommand):
    help = ("Run the fast lane, the long lane and the schedules tick in one process (the "
            "embedded default).")

    def handle(self, *args: Any, **options: Any) -> None:
        run_lanes(self, {Lane.FAST, Lane.LONG, SCHEDULES})
