"""Fixtures of the database tests: a defined flow for the flows' tests; a tenant resolver
reading headers (``BY_TENANT``, importable as ``tests.db.conftest.by_tenant``); and the
process's planner on a clock the test moves."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.http import HttpRequest

from jobs_engine import flows, store
from jobs_engine.errors import InvalidFlow
from jobs_engine.flows import Definition, Step
from jobs_engine.tenancy import PLATFORM, Scope
from tests.helpers import FakeMonotonic

MONTHLY = "monthly-report"
# For ``JOBS["TENANT_RESOLVER"]``: the tests act as the tenant of the ``X-Tenant`` header,
# as the platform operator with ``X-Platform: 1``, and as no tenant without either.
BY_TENANT = f"{__name__}.by_tenant"
AS_PLATFORM = {"HTTP_X_PLATFORM": "1"}


def by_tenant(request: HttpRequest) -> Scope:
    if request.headers.get("X-Platform") == "1":
        return PLATFORM
    return request.headers.get("X-Tenant")


def build_monthly(month: object) -> flows.ChainSpec:
    if not isinstance(month, str):
        raise InvalidFlow("input", "must be a month such as '2026-11'")
    return flows.ChainSpec([Step("report.query", {"month": month}), Step("report.render")])


@pytest.fixture
def monthly() -> Iterator[Definition]:
    """The defined flow ``monthly-report`` (a chain of two; a non-text input is refused)."""
    yield flows.define(MONTHLY, build_monthly, "Build and mail the monthly report")
    flows._definitions.pop(MONTHLY, None)


@pytest.fixture
def planner_clock() -> Iterator[FakeMonotonic]:
    """``store.planner`` as a new worker process finds it (on, not busy, not woken, no table
    size read, never analysed, every session's plans due to be made again), its intervals
    measured on the clock returned, which moves only when the test moves it; as new again,
    on the real clock, after the test."""
    clock = FakeMonotonic()
    store.planner.reset(clock=clock)
    yield clock
    store.planner.reset()
