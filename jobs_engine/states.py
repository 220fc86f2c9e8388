"""The job state machine, read from one place: every status, every allowed transition.

A job row is PENDING until it runs; the long lane holds it RUNNING under a lease; DEAD
is where it rests when it will not run again on its own (kept for operators until they
retry or skip it, or retention removes it); DONE when it completed and its target's
policy keeps completed jobs (in the table of completed jobs, apart from the hot one). A
row removed for good is ``None`` below.

Every status change of the engine is a ``Transition`` made here: the store takes a
statement's statuses from it, so a write outside ``ALLOWED`` fails when its module is
imported, and ``test_states`` checks that each allowed transition has its statement.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import models


class JobStatus(models.TextChoices):
    """A job's status: PENDING (waiting or due), RUNNING (long lane: reserved under a
    lease), DEAD (failed for good, kept for operators), DONE (completed, kept with its
    result)."""

    PENDING = "PENDING", "Pending"
    RUNNING = "RUNNING", "Running"  # long lane only; the fast lane marks its partition instead
    DEAD = "DEAD", "Dead"
    DONE = "DONE", "Done"  # completed and kept, with its result (``models.CompletedJob``)


class FlowState(models.TextChoices):
    """A flow (``jobs_engine.flows``): RUNNING until every step completed, FAILED while a
    step that exhausted its attempts waits for ``flows.retry``, CANCELLED by an operator."""

    RUNNING = "RUNNING", "Running"
    COMPLETED = "COMPLETED", "Completed"
    FAILED = "FAILED", "Failed"
    CANCELLED = "CANCELLED", "Cancelled"


class StepState(models.TextChoices):
    """One step of a flow: WAITING for the steps before it, QUEUED as a job of its target,
    DONE with its result, FAILED with its job's error, CANCELLED before it ran."""

    WAITING = "WAITING", "Waiting"
    QUEUED = "QUEUED", "Queued"
    DONE = "DONE", "Done"
    FAILED = "FAILED", "Failed"
    CANCELLED = "CANCELLED", "Cancelled"


class StepRole(models.TextChoices):
    STEP = "step", "Chain step"
    JOB = "job", "Batch job"
    CALLBACK = "callback", "Batch callback"


class Lane(models.TextChoices):
    """Where a target's jobs run: FAST (ordered per key, partitioned) for short sends, LONG
    (leased) for handlers that run for minutes."""

    FAST = "fast", "Fast"
    LONG = "long", "Long"


class DeliveryMode(models.TextChoices):
    """What a worker's crash does to a job it may have handed to its target: AT_MOST_ONCE
    goes DEAD and is never sent twice, AT_LEAST_ONCE is sent again."""

    AT_MOST_ONCE = "at_most_once", "At most once"
    AT_LEAST_ONCE = "at_least_once", "At least once"


PENDING, RUNNING, DEAD, DONE = (JobStatus.PENDING, JobStatus.RUNNING, JobStatus.DEAD,
                                JobStatus.DONE)
DELETED = None  # the row is gone: done and not kept, skipped, cancelled or pruned

# (from, to) -> what makes the engine take it (docs/design.md#jobs-and-their-states).
ALLOWED: dict[tuple[JobStatus | None, JobStatus | None], str] = {
    (DELETED, PENDING): "enqueue",
    (PENDING, PENDING): "fast lane: answered failure (retried later) or target unreachable",
    (PENDING, RUNNING): "long lane: reserved under a claim token and a lease",
    (PENDING, DEAD): "fast lane: dead outcome, or presumed by a takeover of the row in flight",
    (PENDING, DONE): "fast lane: done, kept by the target's policy",
    (PENDING, DELETED): "fast lane: done and not kept; operator: cancel",
    (RUNNING, PENDING): "long lane: retried, unreachable, or its expired lease rescued",
    (RUNNING, DEAD): "long lane: dead outcome, or presumed by the rescue of an expired lease",
    (RUNNING, DONE): "long lane: done, kept by the target's policy",
    (RUNNING, DELETED): "long lane: done and not kept; operator: cancel before it started",
    (DEAD, PENDING): "operator: retry; or the holder's late outcome replaces a presumed DEAD",
    (DEAD, DEAD): "the holder's late outcome replaces a presumed DEAD",
    (DEAD, DONE): "the holder's late done outcome replaces a presumed DEAD (kept)",
    (DEAD, DELETED): "operator: skip; retention; or the holder's late done outcome",
    (DONE, DELETED): "retention: beyond the newest keep_completed of its target",
}


@dataclass(frozen=True)
class Transition:
    """A statement's status change: from any of ``sources`` to ``target``."""

    sources: tuple[JobStatus, ...]
    target: JobStatus | None

    @property
    def source_values(self) -> list[str]:
        return [status.value for status in self.sources]

    @property
    def source_value(self) -> str:
        """The one status a statement with a single source changes rows from."""
        (only,) = self.sources
        return only.value


used: set[tuple[JobStatus | None, JobStatus | None]] = set()


def transition(*sources: JobStatus | None, to: JobStatus | None) -> Transition:
    """The transition a statement makes; raises when the state machine has no such edge."""
    for source in sources:
        if (source, to) not in ALLOWED:
            raise ValueError(f"no transition from {source} to {to} in jobs_engine.states")
        used.add((source, to))
    return Transition(tuple(s for s in sources if s is not None), to)
