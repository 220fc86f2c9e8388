"""Calling a target's handler: what it sees of a row, and its failure as a value.

Every exception a handler raises becomes an outcome (``outcomes.judge``), never a
crashed worker; both lanes call handlers only through here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from jobs_engine import store
from jobs_engine.context import job_context
from jobs_engine.registry import Job, Target


def handler_payload(target: Target, payload_json: str | None) -> Any:
    """The payload as ``target``'s handlers take it: decoded, or as its JSON text for a
    target that forwards it (``payload_json``)."""
    if target.payload_json or not isinstance(payload_json, str):
        return payload_json
    return json.loads(payload_json)


def handler_job(target: Target, row: store.JobRow) -> Job:
    # Positional (one per row handed): Job's fields are JobRow's first eleven, then created_at.
    return Job(*row[:5], handler_payload(target, row.payload_json), *row[6:11], row.created_at)


def call_handler(target: Target, row: store.JobRow) -> BaseException | None:
    with job_context(row.trace_id, {"via": "system", "origin": row.actor}):
        try:
            target.handler(handler_job(target, row))
        except Exception as exc:  # every failure is an outcome, never a crashed worker
            return exc
    return None


def call_batch_handler(target: Target, rows: Sequence[store.JobRow]
                       ) -> list[BaseException | None]:
    assert target.batch_handler is not None
    with job_context(rows[0].trace_id, {"via": "system"}):
        try:
            results = list(target.batch_handler([handler_job(target, row) for row in rows]))
        except Exception as exc:
            return [exc] * len(rows)
    if len(results) != len(rows):
        error = RuntimeError(f"batch handler of {target.name} returned {len(results)} results "
                             f"for {len(rows)} jobs")
        return [error] * len(rows)
    return results
