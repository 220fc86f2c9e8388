"""Order status changes and their Kafka events, written in one transaction
(docs/design.md#enqueue).

``create_order`` and ``update_order_status`` change the row and enqueue an
``order_status_changed`` event to ``kafka:<DEMO_ORDERS_TOPIC>`` inside the same
``transaction.atomic()`` block: a committed change always has its event, a rolled-back one
has none. Per order the events carry a growing ``version`` (``next_version``, rolled back
with the block) and the message key is the order number, so a consumer sees each order's
changes in order. The ``dedupe_key`` is derived from the change
(``order-status-changed:<number>:<version>``), so re-emitting a version inserts nothing.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction

from examples.models import Order
from jobs_engine import EnqueueResult, enqueue, next_version
from jobs_engine.contrib.kafka import target_name

ORDER_STATUS_CHANGED = "order_status_changed"
DEFAULT_TOPIC = "demo.orders"


def orders_topic() -> str:
    return getattr(settings, "DEMO_ORDERS_TOPIC", DEFAULT_TOPIC)


def orders_target() -> str:
    """``kafka:<topic>``; the topic must be in ``JOBS["KAFKA"]["EXTRA_TOPICS"]``."""
    return target_name(orders_topic())


def dedupe_key(number: str, version: int) -> str:
    return f"order-status-changed:{number}:{version}"


def enqueue_status_changed(order: Order, previous: str | None, version: int
                           ) -> EnqueueResult:
    """Enqueue the event of ``order``'s change to its current status as ``version``.

    Joins the caller's transaction. The same ``version`` again (a replay) inserts nothing
    and raises nothing, and never aborts the caller's transaction.
    """
    payload: dict[str, Any] = {
        "number": order.number, "status": order.status, "previous_status": previous,
        "version": version, "updated_at": order.updated_at.isoformat(),
    }
    return enqueue(orders_target(), payload, code=ORDER_STATUS_CHANGED, key=order.number,
                   version=version, dedupe_key=dedupe_key(order.number, version))


def create_order(number: str, status: str = Order.Status.NEW) -> Order:
    """Create an order and enqueue its first event (version 1, ``previous_status`` None)."""
    with transaction.atomic():
        order = Order.objects.create(number=number, status=status)
        enqueue_status_changed(order, None, next_version(f"order:{number}"))
    return order


def update_order_status(order: Order, status: str) -> EnqueueResult | None:
    """Set ``order``'s status and enqueue the change's event, in one transaction.

    The row is re-read under a lock, so concurrent updates of one order are serialised
    and their versions follow the commit order. Setting the status it already has (a
    replayed request) changes nothing and enqueues nothing: returns None. ``order`` is
    refreshed with the stored status.
    """
    if status not in Order.Status.values:
        raise ValueError(f"unknown order status {status!r} (known: {Order.Status.values})")
    with transaction.atomic():
        locked = Order.objects.select_for_update().get(pk=order.pk)
        previous = locked.status
        if previous == status:
            result = None
        else:
            locked.status = status
            locked.save(update_fields=["status", "updated_at"])
            result = enqueue_status_changed(locked, previous,
                                            next_version(f"order:{locked.number}"))
    order.status, order.updated_at = locked.status, locked.updated_at
    return result
