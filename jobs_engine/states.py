"""The explicit enums of the engine: job states, lanes and delivery modes.

A job row moves only along the transitions in ``ALLOWED_TRANSITIONS``; a finished
row is deleted rather than kept, so "done" is normally the absence of a row.
"""

from __future__ import annotations

from django.db import models


class JobStatus(models.TextChoices):
    PENDING = "PENDING", "Pending"
    RUNNING = "RUNNING", "Running"  # long lane only; the fast lane marks its partition instead
    DEAD = "DEAD", "Dead"
    DONE = "DONE", "Done"  # reserved for retention policies (docs/design.md#jobs-and-their-states)


class Lane(models.TextChoices):
    FAST = "fast", "Fast"
    LONG = "long", "Long"


class DeliveryMode(models.TextChoices):
    AT_MOST_ONCE = "at_most_once", "At most once"
    AT_LEAST_ONCE = "at_least_once", "At least once"


ALLOWED_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.PENDING: frozenset({JobStatus.RUNNING, JobStatus.DEAD}),
    JobStatus.RUNNING: frozenset({JobStatus.PENDING, JobStatus.DEAD}),
    JobStatus.DEAD: frozenset({JobStatus.PENDING}),  # admin retry
    JobStatus.DONE: frozenset(),
}
