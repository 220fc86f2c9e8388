from typing import Any

from django.core.management.base import BaseCommand
from django.db import transaction

from examples.targets import EVENT_LOG, REPORT
from jobs_engine import enqueue, next_version


class Command(BaseCommand):
    help = "Enqueue a few demo jobs: ordered events for two keys and one long report."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--events", type=int, default=5)

    def handle(self, *args: Any, **options: Any) -> None:
        with transaction.atomic():
            for n in range(options["events"]):
                for key in ("order-1", "order-2"):
                    version = next_version(f"demo:{key}")
                    enqueue(EVENT_LOG, {"n": n, "status": "updated"}, key=key, version=version,
                            dedupe_key=f"demo-event:{key}:{version}")
            enqueue(REPORT, {"seconds": 2})
        self.stdout.write(f"enqueued {options['events'] * 2} events and 1 report")
