"""The flows' bookkeeping statements."""

from __future__ import annotations

from collections.abc import Sequence

from jobs_engine.states import StepState
from jobs_engine.store.connection import (
    execute,
)
from jobs_engine.store.dialect import (
    table,
)
from jobs_engine.store.rows import FLOW_STEPS

__all__ = [
    "flow_steps_queued",
]

# -- flows ---------------------------------------------------------------------------------


def flow_steps_queued(step_jobs: Sequence[tuple[int, int]], using: str | None = None) -> None:
    """Mark steps QUEUED, each with the job that runs it: (step id, job id) pairs, in one
    statement per ``FLOW_STEP_CHUNK`` (a batch of 10,000 jobs is ten statements, where an
    update per step or Django's ``bulk_update`` takes seconds)."""
    for start in range(0, len(step_jobs), FLOW_STEP_CHUNK):
        rows, params = table(step_jobs[start:start + FLOW_STEP_CHUNK], ("bigint", "bigint"),
                             using=using)
        execute(f"WITH v(id, job_id) AS ({rows}) UPDATE {FLOW_STEPS} SET state = %s, "
                f"job_id = (SELECT v.job_id FROM v WHERE v.id = {FLOW_STEPS}.id) "
                "WHERE id IN (SELECT id FROM v)", [*params, StepState.QUEUED.value], using)


FLOW_STEP_CHUNK = 1000  # rows of one statement: SQLite takes at most 32,766 parameters

