"""The request context stamped on enqueued jobs (docs/operations.md#settings, middleware):
the trace id a request names is taken only when a column can hold it; the job and try
contexts a lane enters per job nest and always restore what was there."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.test import RequestFactory

from jobs_engine.context import (
    LongLaneTry,
    _trace_from_request,
    current_actor,
    current_try,
    job_context,
    request_trace_id,
    try_context,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize(("headers", "expected"), [
    ({"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"}, TRACE),
    ({"X-Request-ID": "req-42.a:b_c"}, "req-42.a:b_c"),
    ({"traceparent": "00-not-hex-01", "X-Request-ID": "req-7"}, "req-7"),
])
def test_a_well_formed_trace_id_is_taken(headers: dict[str, str], expected: str) -> None:
    assert _trace_from_request(RequestFactory(headers=headers).get("/")) == expected


@pytest.mark.parametrize("request_id", ["bad\x00id", "x" * 65, "a b", "é", ""])
def test_any_other_request_id_gets_a_fresh_trace_id(request_id: str) -> None:
    trace = _trace_from_request(RequestFactory(headers={"X-Request-ID": request_id}).get("/"))
    assert trace != request_id and len(trace) == 32 and trace.isalnum()


def test_job_and_try_contexts_nest_and_restore_the_outer_one_after_an_error() -> None:
    first = LongLaneTry("w-1", datetime(2026, 1, 1, tzinfo=UTC), ())
    second = LongLaneTry("w-2", datetime(2026, 1, 2, tzinfo=UTC), ())
    with job_context("outer", {"id": 1}), try_context(first):
        with pytest.raises(RuntimeError, match="handler"), job_context("inner", {"id": 2}), \
                try_context(second):
            assert (request_trace_id(), current_actor(), current_try()) == (
                "inner", {"id": 2}, second)
            raise RuntimeError("handler")
        assert (request_trace_id(), current_actor(), current_try()) == (
            "outer", {"id": 1}, first)
    assert (request_trace_id(), current_actor(), current_try()) == (None, None, None)
