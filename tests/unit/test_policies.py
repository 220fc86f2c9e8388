"""JobPolicy: four knobs, frozen, nonsense refused at construction naming the knob; the
shipped policies; and how a policy turns failures into waits (``judge`` with an injected
clock)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobs_engine import (
    DEFAULT_POLICY,
    RUN_ONCE_POLICY,
    DeadNow,
    InvalidPolicy,
    JobPolicy,
    Lane,
    TargetUnreachable,
    register_target,
)
from jobs_engine.job import Job
from jobs_engine.lanes.outcomes import OutcomeKind, judge
from jobs_engine.policies import MAX_WAIT_S
from jobs_engine.registry import all_targets, policy_for, unregister_target

NAME = "t:policy-test"
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def noop(job: Job) -> None:
    """A handler that does nothing."""


@pytest.fixture(autouse=True)
def _unregister() -> Iterator[None]:
    yield
    unregister_target(NAME)


def job(attempts: int) -> Job:
    return Job(id=1, code="c", target=NAME, key=None, version=0, payload_json="null",
               headers={}, attempts=attempts, trace_id="", actor=None, partition=0,
               delivery_mode="at_most_once", dedupe_key="d")


def test_the_shipped_policies() -> None:
    assert dataclasses.astuple(DEFAULT_POLICY) == (3, 1.0, 100, 1000)
    assert DEFAULT_POLICY.keep_failed == 10 * DEFAULT_POLICY.keep_completed
    assert RUN_ONCE_POLICY.attempts == 1
    assert JobPolicy() == DEFAULT_POLICY


def test_a_policy_is_frozen_and_keyword_only() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_POLICY.attempts = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        JobPolicy(3)  # type: ignore[misc]


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("zero-attempts", {"attempts": 0}, "attempts"),
    ("negative-attempts", {"attempts": -1}, "attempts"),
    ("bool-attempts", {"attempts": True}, "attempts"),
    ("float-attempts", {"attempts": 3.0}, "attempts"),
    ("text-attempts", {"attempts": "3"}, "attempts"),
    ("negative-backoff", {"backoff_s": -1}, "backoff_s"),
    ("bool-backoff", {"backoff_s": False}, "backoff_s"),
    ("nan-backoff", {"backoff_s": float("nan")}, "backoff_s"),
    ("infinite-backoff", {"backoff_s": float("inf")}, "backoff_s"),
    ("text-backoff", {"backoff_s": "1s"}, "backoff_s"),
    ("waits-past-a-year", {"attempts": 27, "backoff_s": 1}, "attempts"),
    ("waits-past-a-float", {"attempts": 5000, "backoff_s": 1}, "attempts"),
    ("float-keep-completed", {"keep_completed": 10.0}, "keep_completed"),
    ("negative-keep-completed", {"keep_completed": -1}, "keep_completed"),
    ("bool-keep-failed", {"keep_failed": True}, "keep_failed"),
    ("none-keep-failed", {"keep_failed": None}, "keep_failed"),
]


@pytest.mark.parametrize(("bad", "knob"), [(b, k) for _, b, k in BAD],
                         ids=[name for name, _, _ in BAD])
def test_nonsense_raises_at_construction_naming_the_knob(bad: dict[str, Any], knob: str
                                                         ) -> None:
    with pytest.raises(InvalidPolicy) as info:
        JobPolicy(**bad)
    assert info.value.field == knob
    assert str(info.value).startswith(f"invalid_policy: {knob}: ")


def test_zero_keeps_and_zero_backoff_are_allowed() -> None:
    policy = JobPolicy(attempts=1, backoff_s=0, keep_completed=0, keep_failed=0)
    assert policy.delay_s(1) == 0.0


def test_the_longest_waits_a_policy_may_ask_for_are_dated() -> None:
    """Up to a year between tries: every wait of such a policy makes a next run time."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    for policy in (JobPolicy(attempts=26, backoff_s=1), JobPolicy(attempts=2, backoff_s=MAX_WAIT_S),
                   JobPolicy(attempts=10**6, backoff_s=0)):
        waits = [policy.delay_s(n) for n in range(1, min(policy.attempts, 100))]
        assert max(waits) <= MAX_WAIT_S
        assert now + timedelta(seconds=max(waits)) >= now


def test_the_wait_before_each_try_doubles_from_backoff() -> None:
    assert [DEFAULT_POLICY.delay_s(n) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert [JobPolicy(backoff_s=60).delay_s(n) for n in (1, 2)] == [60.0, 120.0]


def test_judge_under_the_default_policy_waits_1_s_then_2_s_then_dead() -> None:
    """Tries, counted as the policy counts them: the first and second fail and are retried
    1 s and 2 s after they failed; the third failure is the last attempt."""
    target = register_target(NAME, noop, lane=Lane.FAST)
    assert target.policy is DEFAULT_POLICY
    first = judge(job(0), target, ValueError("boom"), T0)
    second = judge(job(1), target, ValueError("boom"), T0)
    third = judge(job(2), target, ValueError("boom"), T0)
    assert (first.kind, first.run_at) == (OutcomeKind.RETRIED, T0 + timedelta(seconds=1))
    assert (second.kind, second.run_at) == (OutcomeKind.RETRIED, T0 + timedelta(seconds=2))
    assert (third.kind, third.spend_attempt) == (OutcomeKind.DEAD, True)
    assert third.error == "ValueError: boom (attempt 3 of 3)"


def test_run_once_never_retries_and_every_try_spends_an_attempt() -> None:
    target = register_target(NAME, noop, lane=Lane.LONG, policy=RUN_ONCE_POLICY)
    failed = judge(job(0), target, ValueError("declined"), T0)
    assert (failed.kind, failed.spend_attempt) == (OutcomeKind.DEAD, True)
    assert judge(job(0), target, DeadNow("no"), T0).spend_attempt
    unreachable = judge(job(0), target, TargetUnreachable("down"), T0)
    assert (unreachable.kind, unreachable.spend_attempt) == (OutcomeKind.PAUSED, False)


def test_a_job_without_a_handler_is_dead_with_a_clear_error() -> None:
    outcome = judge(job(0), None, None, T0)
    assert (outcome.kind, outcome.error) == (OutcomeKind.DEAD,
                                             f"no handler registered for {NAME}")


def test_policy_for_is_the_targets_or_the_default() -> None:
    policy = JobPolicy(attempts=2, keep_completed=0)
    register_target(NAME, noop, lane=Lane.FAST, policy=policy)
    assert policy_for(NAME) is policy
    assert policy_for("t:never-registered") is DEFAULT_POLICY


@pytest.mark.parametrize("bad", ["DEFAULT_POLICY", {"attempts": 1}, 3, dataclasses.asdict(
    DEFAULT_POLICY)], ids=["text", "dict", "int", "asdict"])
def test_a_policy_that_is_not_a_jobpolicy_is_refused_and_nothing_registered(bad: Any) -> None:
    before = list(all_targets())
    with pytest.raises(InvalidPolicy) as info:
        register_target(NAME, noop, lane=Lane.FAST, policy=bad)
    assert info.value.field == "policy"
    assert "must be a JobPolicy" in str(info.value)
    assert list(all_targets()) == before


def test_a_policy_reads_as_its_tries_waits_and_keeps() -> None:
    assert str(DEFAULT_POLICY) == "3 attempts, waits 1 s, 2 s; keeps 100 completed, 1000 failed"
    assert str(RUN_ONCE_POLICY).startswith("1 attempt (run once);")
