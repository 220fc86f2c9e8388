from typing import Any

from django.core.management.base import BaseCommand

from jobs_engine.management.commands._lanes import run_lanes
from jobs_engine.states import Lane


class Command(BaseCommand):
    help = "Run the fast lane in this process until SIGTERM/SIGINT."

    def handle(self, *args: Any, **options: Any) -> None:
        run_lanes(self, {Lane.FAST})
