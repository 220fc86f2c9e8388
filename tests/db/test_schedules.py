"""Schedules against a real database (docs/design.md#schedules).

Every tick, sync and admin call gets an explicit decision time, and the slot runner's clock
(``contrib.schedules.runner.clock``) is pointed at the test's clock, so "time passes" without
sleeping. The long lane runs inline (``threads=False``); "a handler runs for minutes" is
played out inside the handler, which ticks and lets another worker poll at later times.
Other declared schedules (the demo's) are set aside for each test so only the test's
schedules tick.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.core.management import call_command

from jobs_engine.conf import load_settings
from jobs_engine.contrib.schedules import (
    DuplicateSchedule,
    InvalidCron,
    InvalidSchedule,
    MissedSlotPolicy,
    ScheduleNotFound,
    declare,
    operations,
    runner,
    sync_declared,
)
from jobs_engine.contrib.schedules.declarations import Declaration, declared, slot_policy, undeclare
from jobs_engine.contrib.schedules.models import Schedule
from jobs_engine.contrib.schedules.tick import TickReport, TickService, _tick_row, tick
from jobs_engine.errors import UnknownTarget
from jobs_engine.job import Job
from jobs_engine.lanes.long import LongLane
from jobs_engine.lanes.pauses import PauseGate
from jobs_engine.lanes.worker import SCHEDULES, WorkerProcess
from jobs_engine.models import Job as JobModel
from jobs_engine.registry import get_target
from jobs_engine.states import DeliveryMode, Lane
from tests.helpers import FakeMonotonic, race

pytestmark = pytest.mark.django_db

SECOND = timedelta(seconds=1)
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
SETTINGS = load_settings({}, environ={})


# -- fixtures and helpers ----------------------------------------------------------------------


@dataclass
class Declared:
    """A schedule declared for one test and the (slot, job) calls its handler got."""

    code: str
    declaration: Declaration
    calls: list[tuple[datetime, Job]] = field(default_factory=list)

    @property
    def slots(self) -> list[datetime]:
        return [slot for slot, _ in self.calls]


@pytest.fixture(autouse=True)
def only_test_schedules() -> Iterator[None]:
    """Set the already declared schedules (the demo's) aside for the test, then restore."""
    others = declared()
    for code in others:
        undeclare(code)
    yield
    for d in others.values():
        if d.code not in declared():
            declare(d.code, d.cron, d.handler, timezone=d.timezone,
                    missed_slot_policy=d.missed_slot_policy, max_attempts=d.max_attempts)


@pytest.fixture
def schedule() -> Iterator[Callable[..., Declared]]:
    """``schedule(name, cron, handler=None, **declare_kwargs)`` declares ``<name>_<random>``
    (unique, so rows left by another test never meet it); undeclared afterwards. Without a
    handler, calls are recorded; a handler gets the ``Declared`` as first argument."""
    codes: list[str] = []

    def make(name: str, cron: str, handler: Callable[..., None] | None = None,
             **kwargs: Any) -> Declared:
        code = f"{name}_{uuid.uuid4().hex[:6]}"
        holder: list[Declared] = []

        def slot_handler(slot: datetime, job: Job) -> None:
            holder[0].calls.append((slot, job))
            if handler is not None:
                handler(holder[0], slot, job)

        declaration = declare(code, cron, slot_handler, **kwargs)
        codes.append(code)
        holder.append(Declared(code, declaration))
        return holder[0]

    yield make
    for code in codes:
        undeclare(code)


@dataclass
class Clock:
    now: datetime


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch, now: datetime) -> Clock:
    """The decision time of slot runs (``runner.clock``); tests move it."""
    current = Clock(now)
    monkeypatch.setattr(runner, "clock", lambda: current.now)
    return current


@pytest.fixture
def t0(now: datetime) -> datetime:
    """The first whole minute after the test starts (a slot of every-minute crons)."""
    return (now + MINUTE).replace(second=0, microsecond=0)


@pytest.fixture
def h0(now: datetime) -> datetime:
    """The first whole hour after the test starts."""
    return (now + HOUR).replace(minute=0, second=0, microsecond=0)


def next_boundary(moment: datetime, minutes: int) -> datetime:
    """The first whole ``minutes`` boundary after ``moment``."""
    base = moment.replace(second=0, microsecond=0)
    return base + timedelta(minutes=minutes - base.minute % minutes)


def long_worker(name: str) -> LongLane:
    worker_id = f"{name}-{uuid.uuid4().hex[:6]}"
    return LongLane(worker_id, SETTINGS, PauseGate(worker_id, SETTINGS), threads=False,
                    monotonic=FakeMonotonic())


def run_lane(lane: LongLane, clock: Clock, at: datetime) -> int:
    clock.now = at
    return lane.run_once(at)


def row(code: str) -> Schedule:
    return Schedule.objects.get(code=code)


def jobs(code: str) -> list[JobModel]:
    return list(JobModel.objects.filter(code=code).order_by("id"))


def slot_key(code: str, slot: datetime) -> str:
    return f"{code}:{slot.astimezone(UTC).isoformat()}"


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()


# -- declare -----------------------------------------------------------------------------------


def test_declare_registers_a_long_lane_exclusive_target_whose_max_attempts_are_total_runs(
        schedule: Callable[..., Declared]) -> None:
    d = schedule("t_reg", "*/10 * * * *", max_attempts=4)
    target = get_target(f"schedule:{d.code}")
    assert target.lane is Lane.LONG
    assert target.exclusive is True
    # total runs of one slot (docs/design.md#schedules), a minute apart, then doubling
    assert target.policy == slot_policy(4)
    assert (target.policy.attempts, target.policy.backoff_s) == (4, 60)
    assert target.delivery_mode is DeliveryMode.AT_LEAST_ONCE
    assert declared()[d.code].missed_slot_policy is MissedSlotPolicy.RUN_ONCE


def test_a_repeat_code_raises_duplicate_schedule_and_keeps_the_first(
        schedule: Callable[..., Declared]) -> None:
    d = schedule("t_dup", "0 * * * *")
    with pytest.raises(DuplicateSchedule, match="duplicate_schedule") as raised:
        declare(d.code, "*/5 * * * *", lambda slot, job: None)
    assert raised.value.code == "duplicate_schedule"
    assert declared()[d.code].cron == "0 * * * *"
    assert declared()[d.code].handler is d.declaration.handler


@pytest.mark.parametrize(("cron", "zone", "problem"), [
    ("61 * * * *", "UTC", "out of range"),
    ("* * *", "UTC", "has 3 fields"),
    ("0 0 30 2 *", "UTC", "never fires within 5 years"),
    ("* * * * *", "Nowhere/Land", "not a known IANA time zone"),
])
def test_a_bad_cron_or_time_zone_raises_invalid_cron_and_registers_nothing(
        cron: str, zone: str, problem: str) -> None:
    code = f"t_bad_{uuid.uuid4().hex[:6]}"
    with pytest.raises(InvalidCron) as raised:
        declare(code, cron, lambda slot, job: None, timezone=zone)
    assert raised.value.code == "invalid_cron"
    assert problem in str(raised.value)
    assert code not in declared()
    with pytest.raises(UnknownTarget):
        get_target(f"schedule:{code}")


@pytest.mark.parametrize(("kwargs", "field_name"), [
    ({"code": "has space"}, "code"),
    ({"code": ""}, "code"),
    ({"code": "a:b"}, "code"),
    ({"code": "x" * 101}, "code"),
    ({"handler": "not callable"}, "handler"),
    ({"max_attempts": 0}, "max_attempts"),
    ({"max_attempts": True}, "max_attempts"),
    ({"missed_slot_policy": "sometimes"}, "missed_slot_policy"),
])
def test_bad_declare_arguments_raise_invalid_schedule_naming_the_field(
        kwargs: dict[str, Any], field_name: str) -> None:
    args: dict[str, Any] = {"code": f"t_arg_{uuid.uuid4().hex[:6]}", "cron": "* * * * *",
                            "handler": lambda slot, job: None, **kwargs}
    with pytest.raises(InvalidSchedule) as raised:
        declare(args.pop("code"), args.pop("cron"), args.pop("handler"), **args)
    assert raised.value.field == field_name
    assert len(declared()) == 0


@pytest.mark.parametrize(("cron", "policy"), [
    ("* * * * *", MissedSlotPolicy.SKIP),
    ("*/5 * * * *", MissedSlotPolicy.SKIP),
    ("*/10 * * * *", MissedSlotPolicy.RUN_ONCE),
    ("0 3 * * *", MissedSlotPolicy.RUN_ONCE),
])
def test_default_policy_is_skip_up_to_5_minutes_else_run_once_and_lands_in_the_row(
        schedule: Callable[..., Declared], now: datetime, cron: str,
        policy: MissedSlotPolicy) -> None:
    d = schedule("t_pol", cron)
    explicit = schedule("t_pol_x", cron, missed_slot_policy="run_once")
    sync_declared(now)
    assert row(d.code).missed_slot_policy == policy.value
    assert row(explicit.code).missed_slot_policy == MissedSlotPolicy.RUN_ONCE.value


# -- boot sync ---------------------------------------------------------------------------------


def test_sync_inserts_the_row_with_the_first_slot_after_now(
        schedule: Callable[..., Declared], t0: datetime) -> None:
    d = schedule("t_sync", "* * * * *", timezone="Europe/Berlin", max_attempts=5)
    assert sync_declared(t0 - 30 * SECOND) == 1
    r = row(d.code)
    assert (r.cron, r.timezone, r.enabled, r.cron_override, r.max_attempts) == (
        "* * * * *", "Europe/Berlin", True, None, 5)
    assert r.next_run_at == t0
    assert (r.last_run_at, r.last_skipped_at, r.last_skip_reason) == (None, None, "")


def test_sync_again_changes_nothing_and_keeps_next_run_at(
        schedule: Callable[..., Declared], t0: datetime) -> None:
    d = schedule("t_sync2", "* * * * *")
    sync_declared(t0 - 30 * SECOND)
    assert sync_declared(t0 + 10 * MINUTE) == 0
    assert row(d.code).next_run_at == t0  # a restart neither loses nor repeats a slot


def test_sync_overwrites_code_owned_fields_and_keeps_enabled_and_cron_override(
        schedule: Callable[..., Declared], h0: datetime) -> None:
    d = schedule("t_own", "0 * * * *", max_attempts=2)
    sync_declared(h0 - MINUTE)
    operations.disable(d.code, now=h0)
    operations.set_cron_override(d.code, "0 9 * * *", now=h0)
    # A new release declares the same code differently.
    undeclare(d.code)
    declare(d.code, "*/30 * * * *", lambda slot, job: None, timezone="Asia/Bangkok",
            missed_slot_policy="skip", max_attempts=7)
    assert sync_declared(h0 + MINUTE) == 1
    r = row(d.code)
    assert (r.cron, r.timezone, r.missed_slot_policy, r.max_attempts) == (
        "*/30 * * * *", "Asia/Bangkok", "skip", 7)
    assert r.enabled is False
    assert r.cron_override == "0 9 * * *"
    # The override is now read in Asia/Bangkok (+07:00): 09:00 there is 02:00 UTC.
    expected = (h0 + MINUTE).astimezone(ZoneInfo("Asia/Bangkok"))
    expected = expected.replace(hour=9, minute=0, second=0, microsecond=0)
    if expected <= h0 + MINUTE:
        expected += timedelta(days=1)
    assert r.next_run_at == expected


def test_sync_moves_next_run_at_when_the_declared_cron_changes(
        schedule: Callable[..., Declared], h0: datetime) -> None:
    d = schedule("t_move", "0 0 1 1 *")
    sync_declared(h0 - MINUTE)
    undeclare(d.code)
    declare(d.code, "0 * * * *", lambda slot, job: None)
    sync_declared(h0 - MINUTE)
    assert row(d.code).next_run_at == h0
    assert tick(h0 + SECOND).enqueued == [(d.code, h0)]


def test_sync_runs_on_the_declared_cron_when_a_stored_override_cannot_be_read(
        schedule: Callable[..., Declared], h0: datetime) -> None:
    d = schedule("t_garbage", "0 0 1 1 *")
    sync_declared(h0 - MINUTE)
    Schedule.objects.filter(code=d.code).update(cron_override="not a cron")
    undeclare(d.code)
    declare(d.code, "0 * * * *", lambda slot, job: None)
    sync_declared(h0 - MINUTE)
    assert row(d.code).next_run_at == h0
    assert tick(h0 + SECOND).enqueued == [(d.code, h0)]


# -- tick: one job per slot --------------------------------------------------------------------


def test_a_row_the_tick_cannot_read_fails_alone(
        schedule: Callable[..., Declared], t0: datetime) -> None:
    broken = schedule("t_broken", "* * * * *")
    fine = schedule("t_fine", "* * * * *")
    sync_declared(t0 - 30 * SECOND)
    Schedule.objects.filter(code=broken.code).update(timezone="Nowhere/Land")
    report = tick(t0 + SECOND)
    assert report.failed == [broken.code]
    assert report.enqueued == [(fine.code, t0)]
    assert report.next_due == t0 + MINUTE  # the broken row does not make the tick spin
    assert row(broken.code).next_run_at == t0
    sync_declared(t0 + 2 * SECOND)  # the next boot sync repairs the code-owned zone
    assert row(broken.code).timezone == "UTC"
    assert sorted(tick(t0 + MINUTE + SECOND).enqueued) == sorted(
        [(broken.code, t0 + MINUTE), (fine.code, t0 + MINUTE)])


def test_a_due_slot_becomes_one_long_lane_exclusive_job_keyed_code_and_slot(
        schedule: Callable[..., Declared], t0: datetime) -> None:
    d = schedule("t_tick", "* * * * *")
    sync_declared(t0 - 30 * SECOND)
    assert tick(t0 - SECOND).enqueued == []
    report = tick(t0 + SECOND)
    assert report.enqueued == [(d.code, t0)]
    [job] = jobs(d.code)
    assert (job.target, job.lane, job.status) == (f"schedule:{d.code}", "long", "PENDING")
    assert job.dedupe_key == slot_key(d.code, t0)
    assert job.payload == {"slot": iso(t0)}
    assert row(d.code).next_run_at == t0 + MINUTE
    assert report.next_due == t0 + MINUTE
    assert tick(t0 + 2 * SECOND).enqueued == []
    assert len(jobs(d.code)) == 1


@pytest.mark.django_db(transaction=True)
def test_two_ticks_racing_make_exactly_one_job_per_slot(
        schedule: Callable[..., Declared], t0: datetime) -> None:
    d = schedule("t_race", "* * * * *")
    sync_declared(t0 - 30 * SECOND)
    for n in range(2):  # whole ticks at the same moment
        at = t0 + n * MINUTE + SECOND
        reports = race(lambda at=at: tick(at), lambda at=at: tick(at))
        assert sorted(len(r.enqueued) for r in reports) == [0, 1], n
    for n in range(2, 4):  # both ticks read the due row before either writes
        at = t0 + n * MINUTE + SECOND
        seen = [row(d.code), row(d.code)]
        reports = [TickReport(at), TickReport(at)]
        race(*[lambda r=r, report=report, at=at: _tick_row(r, at, SETTINGS, report)
               for r, report in zip(seen, reports, strict=True)])
        assert sorted(len(r.enqueued) for r in reports) == [0, 1], n
    assert [j.dedupe_key for j in jobs(d.code)] == [
        slot_key(d.code, t0 + n * MINUTE) for n in range(4)]
    assert row(d.code).next_run_at == t0 + 4 * MINUTE


def test_a_tick_working_from_a_stale_read_changes_nothing(
        schedule: Callable[..., Declared], t0: datetime) -> None:
    d = schedule("t_stale", "* * * * *")
    sync_declared(t0 - 30 * SECOND)
    stale = row(d.code)  # this tick read the row ...
    tick(t0 + SECOND)  # ... and another tick advanced it first
    report = TickReport(t0 + 2 * SECOND)
    _tick_row(stale, t0 + 2 * SECOND, SETTINGS, report)
    assert report.enqueued == []
    assert len(jobs(d.code)) == 1
    assert row(d.code).next_run_at == t0 + MINUTE


def test_the_handler_gets_the_slot_in_the_schedule_zone_and_the_row_records_the_run(
        schedule: Callable[..., Declared], clock: Clock, t0: datetime) -> None:
    d = schedule("t_zone", "* * * * *", timezone="Asia/Bangkok")
    sync_declared(t0 - 30 * SECOND)
    tick(t0 + SECOND)
    assert run_lane(long_worker("w"), clock, t0 + 2 * SECOND) == 1
    [(slot, job)] = d.calls
    assert slot == t0 and slot.utcoffset() == timedelta(hours=7)
    assert job.code == d.code and job.payload == {"slot": iso(t0)}
    r = row(d.code)
    assert r.last_run_at == t0
    assert r.last_finished_at == t0 + 2 * SECOND
    assert jobs(d.code) == []


# -- retries inside a slot (max_attempts is total runs) ----------------------------------------


def test_a_failing_slot_runs_max_attempts_times_in_total_then_goes_dead(
        schedule: Callable[..., Declared], clock: Clock, t0: datetime,
        dead_signals: list[dict[str, Any]]) -> None:
    def fail(d: Declared, slot: datetime, job: Job) -> None:
        raise RuntimeError(f"run {len(d.calls)}")

    d = schedule("t_retry", "* * * * *", fail, max_attempts=3)
    sync_declared(t0 - 30 * SECOND)
    tick(t0 + SECOND)
    lane = long_worker("w")
    start = t0 + 2 * SECOND
    run_lane(lane, clock, start)
    [job] = jobs(d.code)
    assert (job.status, job.attempts, job.next_run_at) == ("PENDING", 1, start + 60 * SECOND)
    assert run_lane(lane, clock, start + 59 * SECOND) == 0
    # The retry starts more than GRACE_S after the slot and still runs: only a first run
    # is ever skipped as late.
    run_lane(lane, clock, start + 60 * SECOND)
    [job] = jobs(d.code)
    assert (job.attempts, job.next_run_at) == (2, start + 180 * SECOND)
    run_lane(lane, clock, start + 180 * SECOND)
    [job] = jobs(d.code)
    assert (job.status, job.attempts) == ("DEAD", 3)
    assert "attempt 3 of 3" in job.last_error
    assert d.slots == [t0, t0, t0]
    assert [s["job_id"] for s in dead_signals] == [job.id]


def test_a_slot_that_fails_once_is_retried_inside_the_slot_then_succeeds(
        schedule: Callable[..., Declared], clock: Clock, t0: datetime) -> None:
    def fail_first(d: Declared, slot: datetime, job: Job) -> None:
        if job.attempts == 0:
            raise RuntimeError("flaky")

    d = schedule("t_flaky", "* * * * *", fail_first)
    sync_declared(t0 - 30 * SECOND)
    tick(t0 + SECOND)
    lane = long_worker("w")
    run_lane(lane, clock, t0 + 2 * SECOND)
    run_lane(lane, clock, t0 + 62 * SECOND)
    assert [(slot, job.attempts) for slot, job in d.calls] == [(t0, 0), (t0, 1)]
    assert jobs(d.code) == []


def test_a_dead_slot_does_not_stop_the_next_slot(
        schedule: Callable[..., Declared], clock: Clock, t0: datetime) -> None:
    def fail_first_slot(d: Declared, slot: datetime, job: Job) -> None:
        if slot == t0:
            raise RuntimeError("broken slot")

    d = schedule("t_deadnext", "* * * * *", fail_first_slot, max_attempts=1)
    sync_declared(t0 - 30 * SECOND)
    lane = long_worker("w")
    tick(t0 + SECOND)
    run_lane(lane, clock, t0 + 2 * SECOND)
    [dead] = jobs(d.code)
    assert dead.status == "DEAD"
    tick(t0 + MINUTE + SECOND)
    run_lane(lane, clock, t0 + MINUTE + 2 * SECOND)
    assert d.slots == [t0, t0 + MINUTE]
    assert [j.id for j in jobs(d.code)] == [dead.id]  # the next slot ran and completed


# -- missed slots ------------------------------------------------------------------------------


def test_run_once_after_downtime_enqueues_only_the_newest_slot_and_records_the_rest(
        schedule: Callable[..., Declared], clock: Clock, h0: datetime) -> None:
    d = schedule("t_down", "0 * * * *")  # hourly: run_once by default
    sync_declared(h0 - MINUTE)
    back = h0 + 5 * HOUR + 10 * MINUTE  # workers were down for 5 slots
    report = tick(back)
    assert report.enqueued == [(d.code, h0 + 5 * HOUR)]
    assert [j.dedupe_key for j in jobs(d.code)] == [slot_key(d.code, h0 + 5 * HOUR)]
    r = row(d.code)
    assert r.next_run_at == h0 + 6 * HOUR
    assert r.last_skipped_at == h0 + 4 * HOUR
    assert r.last_skip_reason == f"missed: collapsed into the newer slot {iso(h0 + 5 * HOUR)}"
    # Its first run is 10 minutes late, but nothing newer waits: run_once runs it.
    run_lane(long_worker("w"), clock, back + SECOND)
    assert d.slots == [h0 + 5 * HOUR]


def test_skip_after_downtime_enqueues_nothing_and_records_the_late_skip(
        schedule: Callable[..., Declared], now: datetime) -> None:
    d = schedule("t_skip", "*/5 * * * *")  # every 5 minutes: skip by default
    first = next_boundary(now, 5)
    sync_declared(first - MINUTE)
    back = first + 30 * MINUTE + 2 * MINUTE
    report = tick(back)
    assert report.enqueued == []
    assert jobs(d.code) == []
    r = row(d.code)
    assert r.next_run_at == first + 35 * MINUTE
    assert r.last_skipped_at == first + 30 * MINUTE  # recorded, not only logged
    assert r.last_skip_reason == "late by 120s at tick (workers down?)"
    assert report.skipped == [(d.code, first + 30 * MINUTE, r.last_skip_reason)]


def test_skip_with_missed_slots_but_the_newest_within_grace_enqueues_the_newest(
        schedule: Callable[..., Declared], now: datetime) -> None:
    d = schedule("t_skipnew", "*/5 * * * *")
    first = next_boundary(now, 5)
    sync_declared(first - MINUTE)
    tick(first + 30 * MINUTE + 20 * SECOND)
    assert [j.dedupe_key for j in jobs(d.code)] == [slot_key(d.code, first + 30 * MINUTE)]
    r = row(d.code)
    assert r.last_skipped_at == first + 25 * MINUTE
    assert r.last_skip_reason.startswith("missed: collapsed into the newer slot")


# -- a late first run ("a schedule slot's first run starts more than 60 s after") ---------------


def test_skip_policy_a_slot_held_up_by_a_long_previous_run_is_skipped_as_previous_slot_running(
        schedule: Callable[..., Declared], clock: Clock, t0: datetime) -> None:
    other = long_worker("other")
    seen: dict[str, Any] = {}

    def long_first_slot(d: Declared, slot: datetime, job: Job) -> None:
        if slot != t0:
            return
        tick(t0 + MINUTE + SECOND)  # the next slot comes due while this one runs
        run_lane(other, clock, t0 + MINUTE + 2 * SECOND)
        seen["running"] = [(j.status, j.payload["slot"]) for j in jobs(d.code)]
        clock.now = t0 + MINUTE + 90 * SECOND  # this run ends 90 s after the next slot

    d = schedule("t_prev", "* * * * *", long_first_slot)
    sync_declared(t0 - 30 * SECOND)
    lane = long_worker("w")
    tick(t0 + SECOND)
    run_lane(lane, clock, t0 + 2 * SECOND)
    assert seen["running"] == [("RUNNING", iso(t0)), ("PENDING", iso(t0 + MINUTE))]
    run_lane(lane, clock, t0 + MINUTE + 91 * SECOND)
    assert d.slots == [t0]  # the held-up slot was skipped, not run
    assert jobs(d.code) == []
    r = row(d.code)
    assert r.last_skipped_at == t0 + MINUTE
    assert r.last_skip_reason == ("previous slot still running (a run of this schedule ended "
                                  "90s after this slot)")


def test_skip_policy_a_slot_started_late_for_another_reason_says_so(
        schedule: Callable[..., Declared], clock: Clock, t0: datetime) -> None:
    d = schedule("t_lanelate", "* * * * *")
    sync_declared(t0 - 30 * SECOND)
    tick(t0 + SECOND)
    run_lane(long_worker("w"), clock, t0 + 100 * SECOND)  # no long-lane worker until now
    assert d.slots == []
    r = row(d.code)
    assert r.last_skipped_at == t0
    assert r.last_skip_reason == ("late by 100s at start (long lane busy or paused, or no "
                                  "long-lane worker)")


def test_run_once_a_late_slot_is_skipped_only_when_a_newer_slot_is_pending(
        schedule: Callable[..., Declared], clock: Clock, h0: datetime) -> None:
    d = schedule("t_collapse", "0 * * * *")  # run_once
    sync_declared(h0 - MINUTE)
    tick(h0 + SECOND)
    tick(h0 + HOUR + SECOND)  # no long-lane worker ran meanwhile: two slots wait
    lane = long_worker("w")
    assert run_lane(lane, clock, h0 + HOUR + 2 * SECOND) == 1  # one row per code at a time
    assert d.slots == []
    r = row(d.code)
    assert r.last_skipped_at == h0
    assert r.last_skip_reason == (f"newer slot {iso(h0 + HOUR)} pending (this slot started "
                                  "3602s late)")
    assert run_lane(lane, clock, h0 + HOUR + 3 * SECOND) == 1
    assert d.slots == [h0 + HOUR]
    assert jobs(d.code) == []


def test_run_once_a_late_slot_with_nothing_newer_runs(
        schedule: Callable[..., Declared], clock: Clock, h0: datetime) -> None:
    d = schedule("t_lateonce", "0 * * * *")
    sync_declared(h0 - MINUTE)
    tick(h0 + SECOND)
    run_lane(long_worker("w"), clock, h0 + 20 * MINUTE)
    assert d.slots == [h0]
    assert row(d.code).last_skipped_at is None


# -- exclusive: one RUNNING row per code; other codes keep running -----------------------------


def test_one_running_row_per_code_across_workers(
        schedule: Callable[..., Declared], clock: Clock, t0: datetime) -> None:
    other = long_worker("other")
    seen: dict[str, Any] = {}

    def hold(d: Declared, slot: datetime, job: Job) -> None:
        if slot != t0:
            return
        tick(t0 + MINUTE + SECOND)
        operations.run_now(d.code, now=t0 + MINUTE + SECOND)
        run_lane(other, clock, t0 + MINUTE + 2 * SECOND)
        seen["statuses"] = sorted(j.status for j in jobs(d.code))
        seen["running"] = JobModel.objects.filter(code=d.code, status="RUNNING").count()
        clock.now = t0 + MINUTE + 10 * SECOND

    d = schedule("t_one", "* * * * *", hold)
    sync_declared(t0 - 30 * SECOND)
    lane = long_worker("w")
    tick(t0 + SECOND)
    run_lane(lane, clock, t0 + 2 * SECOND)
    assert seen == {"statuses": ["PENDING", "PENDING", "RUNNING"], "running": 1}
    assert d.slots == [t0]
    # Once it is done, the waiting slot and the run-now job run, one at a time.
    assert run_lane(lane, clock, t0 + MINUTE + 11 * SECOND) == 1
    assert run_lane(lane, clock, t0 + MINUTE + 12 * SECOND) == 1
    assert sorted(d.slots) == [t0, t0 + MINUTE, t0 + MINUTE + SECOND]


def test_other_codes_keep_running_while_one_exclusive_code_runs_long(
        schedule: Callable[..., Declared], clock: Clock, t0: datetime) -> None:
    other = long_worker("other")
    seen: list[list[str]] = []

    def runs_for_minutes(d: Declared, slot: datetime, job: Job) -> None:
        if slot != t0:
            return
        for minute in (1, 2, 3):
            at = t0 + minute * MINUTE
            tick(at + SECOND)
            run_lane(other, clock, at + 2 * SECOND)
            seen.append(sorted(j.status for j in jobs(d.code)))
        clock.now = t0 + 3 * MINUTE + 30 * SECOND

    slow = schedule("t_slow", "* * * * *", runs_for_minutes)
    quick = schedule("t_quick", "* * * * *")
    sync_declared(t0 - 30 * SECOND)
    lane = long_worker("w")
    tick(t0 + SECOND)
    run_lane(lane, clock, t0 + 2 * SECOND)  # runs both codes' first slots, slow one last
    assert quick.slots == [t0, t0 + MINUTE, t0 + 2 * MINUTE, t0 + 3 * MINUTE]
    assert seen == [["PENDING", "RUNNING"], ["PENDING", "PENDING", "RUNNING"],
                    ["PENDING", "PENDING", "PENDING", "RUNNING"]]
    assert slow.slots == [t0]


# -- disable and enable ------------------------------------------------------------------------


def test_disable_makes_no_new_slot_but_an_enqueued_slot_still_runs(
        schedule: Callable[..., Declared], clock: Clock, t0: datetime) -> None:
    d = schedule("t_off", "* * * * *")
    sync_declared(t0 - 30 * SECOND)
    tick(t0 + SECOND)
    assert operations.disable(d.code, now=t0 + 2 * SECOND).enabled is False
    assert tick(t0 + MINUTE + SECOND).enqueued == []
    assert tick(t0 + 10 * MINUTE).enqueued == []
    run_lane(long_worker("w"), clock, t0 + 3 * SECOND)
    assert d.slots == [t0]


def test_enable_after_disable_drops_the_slots_missed_while_disabled(
        schedule: Callable[..., Declared], t0: datetime) -> None:
    d = schedule("t_on", "* * * * *")
    sync_declared(t0 - 30 * SECOND)
    operations.disable(d.code, now=t0 - 20 * SECOND)
    back = t0 + 10 * MINUTE + 30 * SECOND
    r = operations.enable(d.code, now=back)
    assert (r.enabled, r.next_run_at) == (True, t0 + 11 * MINUTE)
    assert tick(back).enqueued == []
    assert tick(t0 + 11 * MINUTE + SECOND).enqueued == [(d.code, t0 + 11 * MINUTE)]
    assert row(d.code).last_skipped_at is None


def test_enable_on_an_enabled_schedule_keeps_its_next_slot(
        schedule: Callable[..., Declared], t0: datetime) -> None:
    d = schedule("t_on2", "* * * * *")
    sync_declared(t0 - 30 * SECOND)
    assert operations.enable(d.code, now=t0 + 5 * MINUTE).next_run_at == t0


# -- cron override -----------------------------------------------------------------------------


def test_cron_override_moves_the_next_slot_and_the_tick_follows_it_until_cleared(
        schedule: Callable[..., Declared], h0: datetime) -> None:
    d = schedule("t_ovr", "0 * * * *")
    sync_declared(h0 - 20 * MINUTE)
    assert row(d.code).next_run_at == h0
    r = operations.set_cron_override(d.code, "*/5 * * * *", now=h0 - 12 * MINUTE)
    assert (r.cron_override, r.effective_cron, r.next_run_at) == (
        "*/5 * * * *", "*/5 * * * *", h0 - 10 * MINUTE)
    tick(h0 - 10 * MINUTE + SECOND)
    tick(h0 - 5 * MINUTE + SECOND)
    r = operations.clear_cron_override(d.code, now=h0 - 4 * MINUTE)
    assert (r.cron_override, r.next_run_at) == (None, h0)
    tick(h0 - 4 * MINUTE + SECOND)
    tick(h0 + SECOND)
    assert [j.payload["slot"] for j in jobs(d.code)] == [
        iso(h0 - 10 * MINUTE), iso(h0 - 5 * MINUTE), iso(h0)]


def test_an_invalid_override_raises_invalid_cron_and_changes_nothing(
        schedule: Callable[..., Declared], h0: datetime) -> None:
    d = schedule("t_badovr", "0 * * * *")
    sync_declared(h0 - MINUTE)
    before = row(d.code)
    for bad in ("61 * * * *", "not a cron", "0 0 30 2 *", ""):
        with pytest.raises(InvalidCron) as raised:
            operations.set_cron_override(d.code, bad, now=h0 - 30 * SECOND)
        assert raised.value.code == "invalid_cron"
    after = row(d.code)
    assert (after.cron_override, after.next_run_at, after.updated_at) == (
        None, before.next_run_at, before.updated_at)


# -- unknown codes and run now -----------------------------------------------------------------


@pytest.mark.parametrize("call", [
    lambda code: operations.get_schedule(code),
    lambda code: operations.enable(code),
    lambda code: operations.disable(code),
    lambda code: operations.set_cron_override(code, "* * * * *"),
    lambda code: operations.clear_cron_override(code),
    lambda code: operations.run_now(code),
])
def test_admin_operations_on_an_unknown_code_raise_not_found(
        call: Callable[[str], Any]) -> None:
    with pytest.raises(ScheduleNotFound) as raised:
        call("t_no_such_schedule")
    assert raised.value.code == "not_found"
    assert "t_no_such_schedule" in str(raised.value)
    assert not JobModel.objects.filter(code="t_no_such_schedule").exists()


def test_run_now_enqueues_one_extra_job_for_now_and_is_dedupe_safe(
        schedule: Callable[..., Declared], clock: Clock, t0: datetime) -> None:
    d = schedule("t_now", "0 0 1 1 *")
    sync_declared(t0 - MINUTE)
    at = t0 + 5 * SECOND + timedelta(microseconds=250_000)
    first = operations.run_now(d.code, now=at)
    again = operations.run_now(d.code, now=at + timedelta(microseconds=500_000))
    assert first.inserted and not again.inserted and again.job_id == first.job_id
    later = operations.run_now(d.code, now=at + SECOND)
    assert later.inserted
    [job, _] = jobs(d.code)
    assert job.dedupe_key == f"{d.code}:run-now:{iso(t0 + 5 * SECOND)}"
    assert job.payload == {"slot": iso(t0 + 5 * SECOND), "run_now": True}
    # Asked for explicitly: never skipped as late.
    lane = long_worker("w")
    run_lane(lane, clock, t0 + 10 * MINUTE)
    run_lane(lane, clock, t0 + 10 * MINUTE + SECOND)
    assert d.slots == [t0 + 5 * SECOND, t0 + 6 * SECOND]
    assert row(d.code).last_skipped_at is None


# -- the schedules lane in worker processes ----------------------------------------------------


def test_run_workers_gets_the_tick_through_the_registered_service() -> None:
    everything = WorkerProcess({Lane.FAST, Lane.LONG, SCHEDULES}, SETTINGS)
    assert [type(s) for s in everything.services] == [TickService]
    assert WorkerProcess({Lane.FAST, Lane.LONG}, SETTINGS).services == []


def test_tick_service_syncs_then_wakes_for_the_next_slot_capped_at_tick_s(
        schedule: Callable[..., Declared], now: datetime) -> None:
    d = schedule("t_svc", "*/2 * * * * *")
    yearly = schedule("t_svc_y", "0 0 1 1 *")
    start = now.replace(microsecond=0) + 10 * SECOND
    first_slot = start + (2 - start.second % 2) * SECOND
    current = Clock(start + timedelta(milliseconds=500))
    monotonic = FakeMonotonic()
    service = TickService(SETTINGS, monotonic=monotonic, clock=lambda: current.now)
    delay = service()
    assert row(d.code).next_run_at == first_slot and row(yearly.code).next_run_at is not None
    assert delay == pytest.approx((first_slot - current.now).total_seconds())
    assert delay <= 2
    monotonic.advance(delay / 2)
    assert service() == pytest.approx(delay / 2)  # called early: no tick, the time left
    monotonic.advance(delay / 2)
    current.now = first_slot + timedelta(milliseconds=1)
    assert service() == 0.0  # enqueued: the worker's long lane should poll at once
    assert [j.dedupe_key for j in jobs(d.code)] == [slot_key(d.code, first_slot)]
    undeclare(d.code)
    monotonic.advance(10)
    assert service() == SETTINGS.TICK_S  # only the yearly one is left: capped at TICK_S


def test_tick_schedules_with_workers_off_syncs_and_returns(
        schedule: Callable[..., Declared], jobs_settings: Callable[..., Any]) -> None:
    d = schedule("t_cmd", "*/10 * * * *")
    jobs_settings(WORKERS=False)
    out = io.StringIO()
    call_command("tick_schedules", stdout=out)
    assert "schedules synced (1 rows inserted or changed)" in out.getvalue()
    assert "JOBS_WORKERS=off" in out.getvalue()
    assert row(d.code).next_run_at is not None
    assert jobs(d.code) == []


# -- daylight saving through the tick ----------------------------------------------------------


def tick_through(start: datetime, end: datetime, step: timedelta) -> None:
    at = start
    while at <= end:
        tick(at)
        at += step


def test_tick_through_spring_forward_fires_the_gap_slot_once_at_the_next_valid_instant(
        schedule: Callable[..., Declared]) -> None:
    d = schedule("t_spring", "30 2 * * *", timezone="Europe/Berlin")
    start = datetime(2026, 3, 28, 12, tzinfo=UTC)
    sync_declared(start)
    tick_through(start, datetime(2026, 3, 30, 6, tzinfo=UTC), 10 * MINUTE)
    berlin = ZoneInfo("Europe/Berlin")
    fired = [datetime.fromisoformat(j.payload["slot"]).astimezone(berlin).isoformat()
             for j in jobs(d.code)]
    assert fired == ["2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"]


def test_tick_through_fall_back_fires_the_repeated_slot_once(
        schedule: Callable[..., Declared]) -> None:
    d = schedule("t_fall", "30 1 * * *", timezone="America/New_York")
    start = datetime(2026, 10, 31, 12, tzinfo=UTC)
    sync_declared(start)
    tick_through(start, datetime(2026, 11, 2, 12, tzinfo=UTC), 10 * MINUTE)
    new_york = ZoneInfo("America/New_York")
    fired = [datetime.fromisoformat(j.payload["slot"]).astimezone(new_york).isoformat()
             for j in jobs(d.code)]
    assert fired == ["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"]


def test_tick_through_fall_back_an_hourly_schedule_fires_every_real_hour_once(
        schedule: Callable[..., Declared]) -> None:
    d = schedule("t_hourly", "0 * * * *", timezone="America/New_York")
    start = datetime(2026, 11, 1, 4, 30, tzinfo=UTC)
    sync_declared(start)
    tick_through(start, datetime(2026, 11, 1, 8, 30, tzinfo=UTC), 5 * MINUTE)
    assert [j.payload["slot"] for j in jobs(d.code)] == [
        iso(datetime(2026, 11, 1, hour, tzinfo=UTC)) for hour in (5, 6, 7, 8)]
