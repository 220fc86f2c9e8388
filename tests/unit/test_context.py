"""The request context stamped on enqueued jobs (docs/operations.md#settings, middleware):
the trace id a request names is taken only when a column can hold it."""

from __future__ import annotations

import pytest
from django.test import RequestFactory

from jobs_engine.context import _trace_from_request

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
