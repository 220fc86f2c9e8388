from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand
from django.db import transaction

from examples.models import Order
from examples.orders import create_order, orders_target, update_order_status
from examples.targets import EVENT_LOG, REPORT
from jobs_engine import enqueue, next_version

# Each demo order walks through these, one committed change (and one Kafka event) each.
ORDER_STEPS = (Order.Status.PAID, Order.Status.SHIPPED, Order.Status.DELIVERED)


class Command(BaseCommand):
    help = ("Enqueue a few demo jobs: ordered events for two keys, one long report, and "
            "orders whose status changes are published to Kafka.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--events", type=int, default=5)
        parser.add_argument("--orders", type=int, default=3)

    def handle(self, *args: Any, **options: Any) -> None:
        with transaction.atomic():
            for n in range(options["events"]):
                for key in ("order-1", "order-2"):
                    version = next_version(f"demo:{key}")
                    enqueue(EVENT_LOG, {"n": n, "status": "updated"}, key=key, version=version,
                            dedupe_key=f"demo-event:{key}:{version}")
            enqueue(REPORT, {"seconds": 2})
        self.stdout.write(f"enqueued {options['events'] * 2} events and 1 report")

        # Fresh order numbers per run, so a second demo run on the same database works.
        run = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        orders = [create_order(f"demo-{run}-{i + 1}") for i in range(options["orders"])]
        for status in ORDER_STEPS:
            for order in orders:
                update_order_status(order, status)
        events = len(orders) * (1 + len(ORDER_STEPS))
        self.stdout.write(f"created {len(orders)} orders and changed their status "
                          f"{len(ORDER_STEPS)} times: {events} events to {orders_target()} "
                          "(while no broker answers, the target is paused and they wait)")
