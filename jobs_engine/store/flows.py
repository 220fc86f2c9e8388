"""The flows' bookkeeping statements: their steps queued, ended and cancelled, and the
flows' state, each flow locked before its steps (``flows``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from jobs_engine.states import FlowState, StepRole, StepState
from jobs_engine.store.connection import (
    execute,
    fetch,
    named,
)
from jobs_engine.store.dialect import (
    dt,
    for_update,
    in_,
    json_dt,
    jsonb,
    read_dt,
    read_json,
    table,
)
from jobs_engine.store.rows import FLOW_STEPS, FLOWS

__all__ = [
    "FlowRow",
    "StepEnd",
    "StepRow",
    "flow_lock",
    "flow_set_state",
    "flow_steps_cancel_unrun",
    "flow_steps_end",
    "flow_steps_in_state",
    "flow_steps_lock_queued",
    "flow_steps_queued",
    "flow_steps_waiting_after",
    "flows_lock_of_step_jobs",
    "flows_record_progress",
]

# -- flows ---------------------------------------------------------------------------------


class FlowRow(NamedTuple):
    """A flow as its bookkeeping reads it."""

    id: int
    state: str
    tenant_id: str | None
    steps_total: int
    steps_done: int
    finished_at: datetime | None


_FLOW_COLUMNS = "id, state, tenant_id, steps_total, steps_done, finished_at"


def _flow(row: Sequence[Any]) -> FlowRow:
    return FlowRow(row[0], row[1], row[2], row[3], row[4], read_dt(row[5]))


class StepRow(NamedTuple):
    """A step as its bookkeeping reads it: what ``flows.queue`` makes a job of, its place,
    and the job that runs it (None before it is queued)."""

    id: int
    flow_id: int
    position: int
    role: str
    name: str
    target: str
    data: Any
    attempts: int
    job_id: int | None


_STEP_COLUMNS = "id, flow_id, position, role, name, target, data, attempts, job_id"


def _steps(rows: Sequence[Sequence[Any]]) -> list[StepRow]:
    return [StepRow(r[0], r[1], r[2], r[3], r[4], r[5], read_json(r[6]), r[7], r[8])
            for r in rows]


def flow_steps_queued(step_jobs: Sequence[tuple[int, int]], using: str | None = None) -> None:
    """Mark steps QUEUED, each with the job that runs it: (step id, job id) pairs.

    Index: the primary key. One statement per ``FLOW_STEP_CHUNK`` (a batch of 10,000 jobs
    is ten statements, where an update per step or Django's ``bulk_update`` takes
    seconds)."""
    for start in range(0, len(step_jobs), FLOW_STEP_CHUNK):
        rows, params = named(table(step_jobs[start:start + FLOW_STEP_CHUNK],
                                   ("bigint", "bigint"), using=using), "steps")
        execute(f"WITH v(id, job_id) AS ({rows}) UPDATE {FLOW_STEPS} SET state = %(queued)s, "
                f"job_id = (SELECT v.job_id FROM v WHERE v.id = {FLOW_STEPS}.id) "
                "WHERE id IN (SELECT id FROM v)",
                {**params, "queued": StepState.QUEUED.value}, using)


FLOW_STEP_CHUNK = 1000  # rows of one statement: SQLite takes at most 32,766 parameters


def flows_lock_of_step_jobs(job_ids: Sequence[int], using: str | None = None
                            ) -> list[FlowRow]:
    """Lock and read the flows of the QUEUED steps these jobs run, in id order.

    Index: ``jobs_flowstep_by_job``, then the primary key. The outcome of a step's job
    locks its flow before its step (``flow_steps_lock_queued``), as ``flow_lock`` does for
    an operator's retry or cancel: outcomes and actions on one flow queue up instead of
    deadlocking."""
    jobs, params = named(in_("job_id", job_ids, using), "jobs")
    return [_flow(row) for row in fetch(
        f"SELECT {_FLOW_COLUMNS} FROM {FLOWS} WHERE id IN (SELECT flow_id FROM {FLOW_STEPS} "
        f"WHERE {jobs} AND state = %(queued)s) ORDER BY id{for_update(using)}",
        {**params, "queued": StepState.QUEUED.value}, using)]


def flow_steps_lock_queued(job_ids: Sequence[int], using: str | None = None
                           ) -> list[StepRow]:
    """Lock and read the QUEUED steps these jobs run, by flow and position.

    Index: ``jobs_flowstep_by_job``. Their flows first: ``flows_lock_of_step_jobs``."""
    jobs, params = named(in_("job_id", job_ids, using), "jobs")
    return _steps(fetch(
        f"SELECT {_STEP_COLUMNS} FROM {FLOW_STEPS} WHERE {jobs} AND state = %(queued)s "
        f"ORDER BY flow_id, position{for_update(using)}",
        {**params, "queued": StepState.QUEUED.value}, using))


class StepEnd(NamedTuple):
    """How a step's job ended: the step, whether it completed (else failed), the tries it
    made, and its result as JSON text (None: none) or its error."""

    step_id: int
    completed: bool
    tries: int
    text: str | None


def flow_steps_end(ends: Sequence[StepEnd], now: datetime, using: str | None = None) -> None:
    """Record how steps' jobs ended, in one statement: DONE with the result, or FAILED
    with the error; the tries counted in the step's attempts, finished at ``now``.

    Index: the primary key."""
    if not ends:
        return
    rows, params = named(table(
        [(end.step_id, StepState.DONE.value if end.completed else StepState.FAILED.value,
          end.tries, end.text) for end in ends],
        ("bigint", "text", "integer", "text"), using=using, arrays_from=1, as_json=True),
        "ends")
    done = f"v.state = '{StepState.DONE.value}'"
    execute(
        f"WITH v(id, state, tries, text) AS ({rows}) UPDATE {FLOW_STEPS} SET "
        "(state, attempts, result, last_error, finished_at) = (SELECT v.state, "
        f"{FLOW_STEPS}.attempts + v.tries, "
        f"CASE WHEN {done} THEN {jsonb('v.text', using)} ELSE {FLOW_STEPS}.result END, "
        f"CASE WHEN {done} THEN {FLOW_STEPS}.last_error ELSE v.text END, %(now)s "
        f"FROM v WHERE v.id = {FLOW_STEPS}.id) WHERE id IN (SELECT id FROM v)",
        {**params, "now": dt(now, using)}, using)


def flow_steps_waiting_after(places: Sequence[tuple[int, int | None]],
                             using: str | None = None) -> list[StepRow]:
    """The WAITING steps at ``places``, by flow and position: (flow id, position) is that
    step, (flow id, None) the flow's batch callback.

    Index: ``jobs_flowstep_place``."""
    if not places:
        return []
    rows, params = named(table(places, ("bigint", "integer"), using=using, arrays_from=1,
                               as_json=True), "places")
    return _steps(fetch(
        f"WITH v(flow_id, position) AS ({rows}) SELECT "
        f"{', '.join('s.' + c for c in _STEP_COLUMNS.split(', '))} FROM v "
        f"JOIN {FLOW_STEPS} s ON s.flow_id = v.flow_id AND (s.position = v.position "
        "OR (v.position IS NULL AND s.role = %(callback)s)) WHERE s.state = %(waiting)s "
        "ORDER BY s.flow_id, s.position",
        {**params, "waiting": StepState.WAITING.value, "callback": StepRole.CALLBACK.value},
        using))


def flows_record_progress(flows: Sequence[tuple[int, str, int, datetime | None]],
                          now: datetime, using: str | None = None) -> None:
    """Write what their steps' outcomes made of locked flows, in one statement: each
    (flow id, state, steps done, finished at), updated at ``now``.

    Index: the primary key."""
    if not flows:
        return
    rows, params = named(table(
        [(flow_id, state, steps_done, None if finished is None else json_dt(finished, using))
         for flow_id, state, steps_done, finished in flows],
        ("bigint", "text", "integer", "timestamptz"), using=using, arrays_from=1,
        as_json=True), "flows")
    execute(
        f"WITH v(id, state, steps_done, finished_at) AS ({rows}) UPDATE {FLOWS} SET "
        "(state, steps_done, finished_at, updated_at) = (SELECT v.state, v.steps_done, "
        f"v.finished_at, %(now)s FROM v WHERE v.id = {FLOWS}.id) "
        "WHERE id IN (SELECT id FROM v)",
        {**params, "now": dt(now, using)}, using)


# -- operators' actions on a flow ----------------------------------------------------------


def flow_lock(flow_id: int, *, tenant_only: str | None = None, using: str | None = None
              ) -> FlowRow | None:
    """Lock and read one flow for an operator's action; None when there is none (or, with
    ``tenant_only``, none of that tenant).

    Index: the primary key. Locked as the outcomes of its steps lock it
    (``flows_lock_of_step_jobs``)."""
    tenant, params = ("AND tenant_id = %(tenant)s ", {"tenant": tenant_only}) \
        if tenant_only is not None else ("", {})
    rows = fetch(f"SELECT {_FLOW_COLUMNS} FROM {FLOWS} WHERE id = %(id)s {tenant}"
                 f"{for_update(using)}", {"id": flow_id, **params}, using)
    return _flow(rows[0]) if rows else None


def flow_steps_in_state(flow_id: int, state: StepState, using: str | None = None
                        ) -> list[StepRow]:
    """A flow's steps in ``state``, by position.

    Index: ``jobs_flowstep_place``."""
    return _steps(fetch(
        f"SELECT {_STEP_COLUMNS} FROM {FLOW_STEPS} WHERE flow_id = %(flow)s "
        "AND state = %(state)s ORDER BY position",
        {"flow": flow_id, "state": state.value}, using))


def flow_steps_cancel_unrun(flow_id: int, now: datetime, using: str | None = None) -> int:
    """Cancel a flow's steps that have not run (QUEUED or WAITING); returns how many.

    Index: ``jobs_flowstep_place``."""
    return execute(
        f"UPDATE {FLOW_STEPS} SET state = %(cancelled)s, finished_at = %(now)s "
        "WHERE flow_id = %(flow)s AND state IN (%(queued)s, %(waiting)s)",
        {"cancelled": StepState.CANCELLED.value, "now": dt(now, using), "flow": flow_id,
         "queued": StepState.QUEUED.value, "waiting": StepState.WAITING.value}, using)


def flow_set_state(flow_id: int, state: FlowState, *, finished_at: datetime | None,
                   now: datetime, using: str | None = None) -> None:
    """Set a flow's state and finish time (None: not finished), updated at ``now``.

    Index: the primary key."""
    execute(f"UPDATE {FLOWS} SET state = %(state)s, finished_at = %(finished_at)s, "
            "updated_at = %(now)s WHERE id = %(id)s",
            {"state": state.value, "finished_at": dt(finished_at, using), "now": dt(now, using),
             "id": flow_id}, using)
