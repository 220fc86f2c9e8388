"""Helpers of the schedules operator-surface tests (API, admin, browser): a schedule
declared in code for one test, with its row synced, and a snapshot of a row to show that a
refused request changed nothing."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from jobs_engine.contrib.schedules import declare, sync_declared
from jobs_engine.contrib.schedules.declarations import undeclare
from jobs_engine.contrib.schedules.models import Schedule
from jobs_engine.job import Job

# Columns an operator action may change; a refused one leaves them as they were.
STATE = ("enabled", "cron", "cron_override", "timezone", "next_run_at", "updated_at")


def _no_op(slot: datetime, job: Job) -> None:
    """A slot handler for schedules whose slots the tests never run."""


@contextmanager
def declared_schedule(name: str, cron: str = "30 2 * * *", *, timezone: str = "Europe/Berlin",
                      handler: Callable[[datetime, Job], None] = _no_op,
                      tenant_id: str | None = None) -> Iterator[Schedule]:
    """Declare ``<name>_<random>`` (a code no other test's rows share), sync its row and
    yield it; undeclared afterwards (the row goes with the test's transaction)."""
    code = f"{name}_{uuid.uuid4().hex[:6]}"
    declare(code, cron, handler, timezone=timezone, tenant_id=tenant_id)
    try:
        sync_declared()
        yield Schedule.objects.get(code=code)
    finally:
        undeclare(code)


def state(code: str) -> dict[str, Any]:
    """The operator-owned and derived columns of a row, to compare before and after."""
    return Schedule.objects.filter(code=code).values(*STATE).get()
