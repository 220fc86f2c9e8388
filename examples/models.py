"""The demo's business model: an order whose status changes are published to Kafka.

The model itself sends nothing: status changes go through ``examples.orders`` (a service
function), which writes the row and enqueues its event in one transaction. A ``save()``
override would be bypassed by ``QuerySet.update()``/``bulk_update()`` and would hide a side
effect in a method Django calls in many places (admin, fixtures, forms).
"""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    class Status(models.TextChoices):
        NEW = "new"
        PAID = "paid"
        SHIPPED = "shipped"
        DELIVERED = "delivered"
        CANCELLED = "cancelled"

    number = models.CharField(max_length=64, unique=True,
                              help_text="Business id; the Kafka message key of its events.")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.NEW)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"order {self.number} ({self.status})"
