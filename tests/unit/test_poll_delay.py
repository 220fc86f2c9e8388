"""Pure decisions of the lanes, no database: poll delays and the mapping of every handler
result to an outcome under the target's policy (docs/design.md#outcomes)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobs_engine import JobPolicy
from jobs_engine.conf import JobsSettings, load_settings
from jobs_engine.errors import DeadNow, TargetOutcomeUnknown, TargetUnreachable, UnknownTarget
from jobs_engine.job import Job
from jobs_engine.lanes.outcomes import Outcome, OutcomeKind, judge
from jobs_engine.lanes.worker import next_poll_delay
from jobs_engine.registry import Target
from jobs_engine.states import DeliveryMode, Lane

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
SETTINGS = load_settings({}, environ={})


def job_row(attempts: int = 0, mode: DeliveryMode = DeliveryMode.AT_MOST_ONCE) -> Job:
    return Job(id=1, target="t", code="t", key="k", version=1, payload_json=None, headers={},
               attempts=attempts, trace_id="", dedupe_key="d", actor=None, partition=0,
               delivery_mode=mode.value, created_at=None)


def target(mode: DeliveryMode = DeliveryMode.AT_MOST_ONCE, **kwargs: object) -> Target:
    return Target(name="t", handler=lambda job: None, lane=Lane.FAST, delivery_mode=mode,
                  **kwargs)  # type: ignore[arg-type]


# -- poll delays ------------------------------------------------------------------------------


@pytest.mark.parametrize("handled", [1, 5, 100])
def test_a_lane_that_handled_rows_polls_again_at_once(handled: int) -> None:
    for idle in (0, 3, 10):
        assert next_poll_delay(handled, idle, SETTINGS) == 0.0


def test_an_idle_lane_backs_off_1_2_5_5() -> None:
    assert [next_poll_delay(0, idle, SETTINGS) for idle in range(5)] == [1, 2, 5, 5, 5]


def test_idle_backoff_follows_the_setting() -> None:
    settings = JobsSettings(IDLE_POLL_S=(0.5, 3))
    assert [next_poll_delay(0, idle, settings) for idle in range(3)] == [0.5, 3, 3]


# -- judge (a policy's waits, with an injected clock) -----------------------------------------


def test_success() -> None:
    assert judge(job_row(), target(), None, NOW) == Outcome.ok()


@pytest.mark.parametrize("mode", list(DeliveryMode))
def test_unreachable_pauses_and_spends_nothing(mode: DeliveryMode) -> None:
    outcome = judge(job_row(), target(mode), TargetUnreachable("refused"), NOW)
    assert (outcome.kind, outcome.pause_target, outcome.spend_attempt) == (
        OutcomeKind.PAUSED, True, False)
    assert outcome.error == "TargetUnreachable: refused"


def test_outcome_unknown_at_most_once_is_dead_pauses_and_spends_the_try() -> None:
    outcome = judge(job_row(), target(), TargetOutcomeUnknown("lost"), NOW)
    assert (outcome.kind, outcome.pause_target, outcome.spend_attempt) == (
        OutcomeKind.DEAD, True, True)


def test_outcome_unknown_with_target_up_at_most_once_is_dead_without_pause() -> None:
    exc = TargetOutcomeUnknown("request timed out", target_up=True)
    outcome = judge(job_row(), target(), exc, NOW)
    assert (outcome.kind, outcome.pause_target) == (OutcomeKind.DEAD, False)


@pytest.mark.parametrize("target_up", [False, True])
def test_outcome_unknown_at_least_once_is_kept_and_pauses(target_up: bool) -> None:
    exc = TargetOutcomeUnknown("lost", target_up=target_up)
    outcome = judge(job_row(), target(DeliveryMode.AT_LEAST_ONCE), exc, NOW)
    assert (outcome.kind, outcome.pause_target, outcome.spend_attempt) == (
        OutcomeKind.PAUSED, True, False)


@pytest.mark.parametrize("mode", list(DeliveryMode))
def test_dead_now_is_dead_whatever_the_mode_and_spends_the_try(mode: DeliveryMode) -> None:
    outcome = judge(job_row(attempts=0), target(mode), DeadNow("invalid"), NOW)
    assert (outcome.kind, outcome.pause_target, outcome.spend_attempt) == (
        OutcomeKind.DEAD, False, True)
    assert outcome.error == "DeadNow: invalid"


@pytest.mark.parametrize("exc", [ValueError("no"), RuntimeError(), KeyError("k"),
                                 UnknownTarget("another")])
def test_any_other_exception_is_an_answered_failure(exc: BaseException) -> None:
    outcome = judge(job_row(attempts=0), target(), exc, NOW)
    assert (outcome.kind, outcome.spend_attempt, outcome.pause_target) == (
        OutcomeKind.RETRIED, True, False)
    assert outcome.run_at == NOW + timedelta(seconds=1)
    assert outcome.error.startswith(type(exc).__name__)


def test_the_target_policy_sets_the_tries_and_the_doubling_waits() -> None:
    custom = target(policy=JobPolicy(attempts=5, backoff_s=5))
    runs = [judge(job_row(attempts=n), custom, ValueError("no"), NOW) for n in range(5)]
    assert [o.run_at - NOW for o in runs[:4] if o.run_at] == [
        timedelta(seconds=s) for s in (5, 10, 20, 40)]
    assert [o.kind for o in runs] == [OutcomeKind.RETRIED] * 4 + [OutcomeKind.DEAD]
    assert runs[4].spend_attempt and "(attempt 5 of 5)" in runs[4].error


def test_no_registered_handler_is_dead_with_the_reason_and_spends_nothing() -> None:
    for exc in (None, ValueError("x"), UnknownTarget("t")):
        outcome = judge(job_row(), None, exc, NOW)
        assert (outcome.kind, outcome.error, outcome.spend_attempt) == (
            OutcomeKind.DEAD, "no handler registered for t", False)
