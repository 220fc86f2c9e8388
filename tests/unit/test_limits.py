"""Declaring limits: every check runs when the limit is built or the target registered, and
names what is wrong."""

from __future__ import annotations

import math
from typing import Any

import pytest

from jobs_engine import registry
from jobs_engine.errors import InvalidLimit, RateLimited
from jobs_engine.limits import (
    PER_CODE,
    PER_LIMIT_KEY,
    PER_TENANT,
    TARGET_KEY,
    Concurrency,
    Rate,
    limit_key_for,
    per_field,
    target_limits,
)


@pytest.mark.parametrize(("make", "knob"), [
    (lambda: Concurrency(0), "slots"),
    (lambda: Concurrency(-1), "slots"),
    (lambda: Concurrency(True), "slots"),
    (lambda: Concurrency(1.5), "slots"),  # type: ignore[arg-type]  # the wrong type on purpose
    (lambda: Rate(0), "starts"),
    (lambda: Rate(5, period_s=0), "period_s"),
    (lambda: Rate(5, period_s=-1), "period_s"),
    (lambda: Rate(5, period_s=math.nan), "period_s"),
    (lambda: Rate(5, period_s=math.inf), "period_s"),
    (lambda: Rate(5, period_s="1"), "period_s"),  # type: ignore[arg-type]  # the wrong type on purpose
    (lambda: Rate(5, burst=0), "burst"),
    (lambda: Concurrency(1, per="customer"), "per"),
    (lambda: Concurrency(1, per=per_field("")), "per"),
    (lambda: Concurrency(1, per=5), "per"),  # type: ignore[arg-type]  # the wrong type on purpose
    (lambda: Concurrency(1, name="x" * 61), "name"),
    (lambda: Concurrency(1, name="a\x00"), "name"),
    (lambda: RateLimited(retry_after_s=-1), "retry_after_s"),
    (lambda: RateLimited(retry_after_s=math.nan), "retry_after_s"),
    (lambda: RateLimited(retry_after_s="5"), "retry_after_s"),  # type: ignore[arg-type]  # the wrong type on purpose
])
def test_a_limit_that_cannot_work_is_refused_naming_its_knob(make: Any, knob: str) -> None:
    with pytest.raises(InvalidLimit) as raised:
        make()
    assert raised.value.field == knob


def test_a_burst_defaults_to_the_rate_and_names_to_the_kind_and_key() -> None:
    assert Rate(20).burst == 20 and Rate(20).name == "rate"
    assert Concurrency(2, per=PER_TENANT).name == "concurrency/tenant"
    assert str(Rate(20, period_s=1, burst=5)) == "20 per 1 s (burst 5) for the target"


@pytest.mark.parametrize(("limits", "problem"), [
    ([Concurrency(1), Concurrency(2)], "named 'concurrency'"),
    ([Concurrency(1, per=PER_TENANT), Rate(1, per=PER_CODE)], "one other key"),
    ("rate", "must be a list"),
    ([Concurrency(1), "rate"], "Concurrency or Rate only"),
])
def test_a_targets_list_of_limits_is_checked_whole(limits: Any, problem: str) -> None:
    with pytest.raises(InvalidLimit, match=problem):
        target_limits("t", limits)


@pytest.mark.parametrize(("kwargs", "problem"), [
    ({"lane": "long", "exclusive": True}, "PER_CODE"),
    ({"lane": "long", "lossy": True}, "lossy"),
    ({"lane": "fast"}, "fast lane"),
])
def test_register_target_refuses_limits_it_cannot_keep_and_registers_nothing(
        kwargs: dict[str, Any], problem: str) -> None:
    with pytest.raises(InvalidLimit, match=problem):
        registry.register_target("lim.refused", lambda job: None, limits=[Concurrency(1)],
                                 **kwargs)
    assert "lim.refused" not in {t.name for t in registry.all_targets()}


def test_each_row_takes_the_key_its_targets_limits_use() -> None:
    def key(limits: Any, **kwargs: Any) -> str | None:
        values = {"payload": None, "code": "c", "tenant_id": None, "given": None, **kwargs}
        return limit_key_for("t", target_limits("t", limits), **values)

    assert key([]) is None
    assert key([Rate(1)]) == TARGET_KEY
    assert key([Rate(1), Concurrency(1, per=PER_TENANT)], tenant_id="acme") == "acme"
    assert key([Concurrency(1, per=PER_TENANT)]) == TARGET_KEY  # the platform's own
    assert key([Concurrency(1, per=PER_CODE)], code="invoice:7") == "invoice:7"
    assert key([Concurrency(1, per=PER_LIMIT_KEY)], given="k") == "k"
    assert key([Concurrency(1, per=per_field("account"))], payload={"account": 42}) == "42"
