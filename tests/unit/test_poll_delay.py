"""Pure decisions of the lanes, no database: poll delays, retry delays and the mapping of
every handler result to an outcome (docs/design.md#outcomes)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobs_engine.conf import JobsSettings, load_settings
from jobs_engine.errors import DeadNow, TargetOutcomeUnknown, TargetUnreachable, UnknownTarget
from jobs_engine.job import Job
from jobs_engine.lanes.outcomes import Outcome, OutcomeKind, judge, retry_delay_s
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


# -- retry delays -----------------------------------------------------------------------------


def test_retry_delays_are_1_2_4_8_16_minutes_then_the_last_repeats() -> None:
    delays = SETTINGS.RETRY_DELAYS
    assert [retry_delay_s(n, delays) for n in range(1, 8)] == [60, 120, 240, 480, 960, 960, 960]


def test_retry_delay_with_a_short_list() -> None:
    assert [retry_delay_s(n, [5]) for n in (1, 2, 3)] == [5.0, 5.0, 5.0]


# -- judge ------------------------------------------------------------------------------------


def test_success() -> None:
    assert judge(job_row(), target(), None, NOW, SETTINGS) == Outcome.ok()


@pytest.mark.parametrize("mode", list(DeliveryMode))
def test_unreachable_pauses_and_spends_nothing(mode: DeliveryMode) -> None:
    outcome = judge(job_row(), target(mode), TargetUnreachable("refused"), NOW, SETTINGS)
    assert (outcome.kind, outcome.pause_target, outcome.spend_attempt) == (
        OutcomeKind.PAUSED, True, False)
    assert outcome.error == "TargetUnreachable: refused"


def test_outcome_unknown_at_most_once_is_dead_and_pauses() -> None:
    outcome = judge(job_row(), target(), TargetOutcomeUnknown("lost"), NOW, SETTINGS)
    assert (outcome.kind, outcome.pause_target, outcome.spend_attempt) == (
        OutcomeKind.DEAD, True, False)


def test_outcome_unknown_with_target_up_at_most_once_is_dead_without_pause() -> None:
    exc = TargetOutcomeUnknown("request timed out", target_up=True)
    outcome = judge(job_row(), target(), exc, NOW, SETTINGS)
    assert (outcome.kind, outcome.pause_target) == (OutcomeKind.DEAD, False)


@pytest.mark.parametrize("target_up", [False, True])
def test_outcome_unknown_at_least_once_is_kept_and_pauses(target_up: bool) -> None:
    exc = TargetOutcomeUnknown("lost", target_up=target_up)
    outcome = judge(job_row(), target(DeliveryMode.AT_LEAST_ONCE), exc, NOW, SETTINGS)
    assert (outcome.kind, outcome.pause_target, outcome.spend_attempt) == (
        OutcomeKind.PAUSED, True, False)


@pytest.mark.parametrize("mode", list(DeliveryMode))
def test_dead_now_is_dead_whatever_the_mode(mode: DeliveryMode) -> None:
    outcome = judge(job_row(attempts=2), target(mode), DeadNow("invalid"), NOW, SETTINGS)
    assert (outcome.kind, outcome.pause_target, outcome.spend_attempt) == (
        OutcomeKind.DEAD, False, False)
    assert outcome.error == "DeadNow: invalid"


@pytest.mark.parametrize("exc", [ValueError("no"), RuntimeError(), KeyError("k"),
                                 UnknownTarget("gone")])
def test_any_other_exception_is_an_answered_failure(exc: BaseException) -> None:
    outcome = judge(job_row(attempts=0), target(), exc, NOW, SETTINGS)
    assert (outcome.kind, outcome.spend_attempt, outcome.pause_target) == (
        OutcomeKind.RETRIED, True, False)
    assert outcome.run_at == NOW + timedelta(seconds=60)
    assert outcome.error.startswith(type(exc).__name__)


def test_answered_failures_back_off_then_die_at_the_sixth() -> None:
    runs = [judge(job_row(attempts=n), target(), ValueError("no"), NOW, SETTINGS)
            for n in range(6)]
    assert [o.run_at - NOW for o in runs[:5] if o.run_at] == [
        timedelta(seconds=s) for s in (60, 120, 240, 480, 960)]
    assert [o.kind for o in runs] == [OutcomeKind.RETRIED] * 5 + [OutcomeKind.DEAD]
    assert runs[5].spend_attempt and "(attempt 6 of 6)" in runs[5].error


def test_target_max_attempts_and_delays_win_over_settings() -> None:
    custom = target(max_attempts=3, retry_delays=(5, 7))
    runs = [judge(job_row(attempts=n), custom, ValueError("no"), NOW, SETTINGS)
            for n in range(3)]
    assert [o.run_at for o in runs[:2]] == [NOW + timedelta(seconds=5),
                                             NOW + timedelta(seconds=7)]
    assert runs[2].kind is OutcomeKind.DEAD


def test_an_unregistered_target_uses_the_rows_mode_and_the_settings() -> None:
    row = job_row(mode=DeliveryMode.AT_LEAST_ONCE)
    assert judge(row, None, TargetOutcomeUnknown(), NOW, SETTINGS).kind is OutcomeKind.PAUSED
    assert judge(job_row(attempts=5), None, ValueError(), NOW, SETTINGS).kind is OutcomeKind.DEAD
