"""``Job``: what a handler sees of its job, the one job type of the engine's code.

The store reads a row straight into a ``Job`` and the lanes hand that same object to the
handler and to the outcome path; the table itself is ``jobs_engine.models.Job``.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, NamedTuple


class Job(NamedTuple):
    """One job as a handler sees it (immutable; a named tuple because the fast lane builds
    one per row, thousands a second).

    ``payload`` is decoded from the stored JSON text at each access (keep it in a variable
    when you read it often); a handler that forwards the payload unread takes
    ``payload_json``, the text itself, and pays for no decoding at all.
    """

    id: int | None
    target: str
    code: str
    key: str | None
    version: int
    payload_json: str | None
    headers: dict[str, Any]
    attempts: int
    trace_id: str
    dedupe_key: str
    actor: dict[str, Any] | None = None
    created_at: datetime | None = None
    partition: int = 0
    delivery_mode: str = "at_most_once"
    tenant_id: str | None = None  # the tenant it belongs to; None: the platform's own
    limit_key: str | None = None  # its key under its target's limits (``jobs_engine.limits``)

    @property
    def payload(self) -> Any:
        return json.loads(self.payload_json) if self.payload_json is not None else None

