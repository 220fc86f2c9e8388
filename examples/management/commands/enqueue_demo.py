from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from examples.models import Order
from examples.orders import create_order, orders_target, update_order_status
from examples.targets import EVENT_LOG, REPORT
from jobs_engine import enqueue, enqueue_many, next_version

# A load run commits its events in transactions of this many, as a busy service would.
LOAD_BATCH = 100

# Each demo order walks through these, one committed change (and one Kafka event) each.
ORDER_STEPS = (Order.Status.PAID, Order.Status.SHIPPED, Order.Status.DELIVERED)


class Command(BaseCommand):
    help = ("Enqueue a few demo jobs: ordered events for two keys, one long report, and "
            "orders whose status changes are published to Kafka.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--events", type=int, default=5)
        parser.add_argument("--orders", type=int, default=3)
        parser.add_argument("--load", type=int, default=0, metavar="N",
                            help="Also enqueue N Kafka events spread over --keys keys, "
                                 "versions 1, 2, ... per key (a load and ordering test).")
        parser.add_argument("--keys", type=int, default=50)

    def handle(self, *args: Any, **options: Any) -> None:
        for name in ("events", "orders", "load"):
            if options[name] < 0:
                raise CommandError(f"--{name} must be 0 or more, not {options[name]}")
        if options["keys"] < 1:
            raise CommandError(f"--keys must be 1 or more, not {options['keys']}")
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
        if options["load"]:
            prefix = f"load-{datetime.now(UTC):%Y%m%d-%H%M%S-%f}"
            keys = enqueue_load(prefix, options["load"], options["keys"])
            self.stdout.write(f"enqueued {options['load']} load events on {keys} keys "
                              f"{prefix}-* to {orders_target()}")


def enqueue_load(prefix: str, events: int, keys: int) -> int:
    """``events`` events round-robin over ``keys`` keys ``<prefix>-<k>``, each key's
    versions 1, 2, ... in commit order; returns the number of keys used."""
    keys = min(keys, events)
    batch: list[dict[str, Any]] = []
    for n in range(events):
        key, version = f"{prefix}-{n % keys + 1}", n // keys + 1
        batch.append({"target": orders_target(), "payload": {"n": n, "version": version},
                      "code": "load_event", "key": key, "version": version})
        if len(batch) == LOAD_BATCH or n == events - 1:
            with transaction.atomic():
                enqueue_many(batch)
            batch = []
    return keys
