"""Cron parsing and slot times (``contrib.schedules.cron``): the accepted syntax, the refusals, and
DST-correct slots checked against a brute-force oracle in real time zones
(docs/design.md#schedules)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter

from jobs_engine.contrib.schedules.cron import CronSpec, parse_cron
from jobs_engine.contrib.schedules.declarations import MissedSlotPolicy, default_policy
from jobs_engine.contrib.schedules.errors import InvalidCron

START = datetime(2026, 1, 1, tzinfo=UTC)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def slots(spec: CronSpec, after: datetime, count: int) -> list[datetime]:
    found: list[datetime] = []
    for _ in range(count):
        after = spec.next_after(after)
        found.append(after)
    return found


# -- accepted syntax ---------------------------------------------------------------------------


@pytest.mark.parametrize(("cron", "expected"), [
    ("*/15 * * * *", [utc(2026, 1, 1, 0, 15), utc(2026, 1, 1, 0, 30), utc(2026, 1, 1, 0, 45)]),
    ("0 9-17/4 * * *", [utc(2026, 1, 1, 9), utc(2026, 1, 1, 13), utc(2026, 1, 1, 17)]),
    ("5,35 1 * * *", [utc(2026, 1, 1, 1, 5), utc(2026, 1, 1, 1, 35), utc(2026, 1, 2, 1, 5)]),
    ("0 0 1 jan,JUL *", [utc(2026, 7, 1), utc(2027, 1, 1), utc(2027, 7, 1)]),
    ("0 12 ? * MON-FRI", [utc(2026, 1, 1, 12), utc(2026, 1, 2, 12), utc(2026, 1, 5, 12)]),
    ("0 0 L * *", [utc(2026, 1, 31), utc(2026, 2, 28), utc(2026, 3, 31)]),
    ("0 0 * * MON#2", [utc(2026, 1, 12), utc(2026, 2, 9), utc(2026, 3, 9)]),
    ("0 0 * * L5", [utc(2026, 1, 30), utc(2026, 2, 27), utc(2026, 3, 27)]),
    ("0 0 15W * *", [utc(2026, 1, 15), utc(2026, 2, 16), utc(2026, 3, 16)]),
    ("0 0 * * 7", [utc(2026, 1, 4), utc(2026, 1, 11), utc(2026, 1, 18)]),
    ("*/2 * * * * *", [utc(2026, 1, 1, 0, 0, 2), utc(2026, 1, 1, 0, 0, 4),
                       utc(2026, 1, 1, 0, 0, 6)]),
    ("30 0 12 * * *", [utc(2026, 1, 1, 12, 0, 30), utc(2026, 1, 2, 12, 0, 30),
                       utc(2026, 1, 3, 12, 0, 30)]),
    ("@hourly", [utc(2026, 1, 1, 1), utc(2026, 1, 1, 2), utc(2026, 1, 1, 3)]),
    ("@DAILY", [utc(2026, 1, 2), utc(2026, 1, 3), utc(2026, 1, 4)]),
    ("  0   6  * * *  ", [utc(2026, 1, 1, 6), utc(2026, 1, 2, 6), utc(2026, 1, 3, 6)]),
])
def test_accepted_syntax_gives_these_slots(cron: str, expected: list[datetime]) -> None:
    assert slots(parse_cron(cron, "UTC", now=START), START, 3) == expected


def test_fields_are_read_in_the_schedule_time_zone() -> None:
    bangkok = parse_cron("0 9 * * *", "Asia/Bangkok", now=START)  # +07:00, the seed's zone
    assert bangkok.next_after(START) == utc(2026, 1, 1, 2)
    assert bangkok.latest_at_or_before(utc(2026, 1, 1, 1, 59)) == utc(2025, 12, 31, 2)
    assert parse_cron("0 9 * * *", "UTC", now=START).next_after(START) == utc(2026, 1, 1, 9)


def test_latest_at_or_before_includes_the_moment_itself() -> None:
    spec = parse_cron("*/5 * * * *", "UTC", now=START)
    assert spec.latest_at_or_before(utc(2026, 1, 1, 0, 10)) == utc(2026, 1, 1, 0, 10)
    assert spec.latest_at_or_before(utc(2026, 1, 1, 0, 9, 59)) == utc(2026, 1, 1, 0, 5)
    assert spec.next_after(utc(2026, 1, 1, 0, 10)) == utc(2026, 1, 1, 0, 15)


def test_a_naive_datetime_is_refused() -> None:
    with pytest.raises(ValueError, match="time-zone-aware"):
        parse_cron("* * * * *", now=START).next_after(datetime(2026, 1, 1))


# -- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("cron", "problem"), [
    ("* * *", "has 3 fields; expected 5"),
    ("0 0 1 1 * 2030 x", "has 7 fields"),
    ("", "is empty"),
    ("   ", "is empty"),
    ("61 * * * *", "out of range"),
    ("0 24 * * *", "out of range"),
    ("0 0 0 * *", "out of range"),
    ("0 0 * * 8", "out of range"),
    ("0 0 * foo *", "not acceptable"),
    ("0 0 * * MON#6", "not acceptable"),
    ("0 0 30 2 *", "never fires within 5 years"),
    ("0 0 31 4,6 *", "never fires within 5 years"),
    ("R * * * *", "random (R) and hashed (H)"),
    ("H/5 * * * *", "random (R) and hashed (H)"),
    ("@reboot", "unknown macro"),
    ("* " * 100 + "*", "longer than 200"),
])
def test_invalid_cron_is_refused_naming_the_problem(cron: str, problem: str) -> None:
    with pytest.raises(InvalidCron, match=r"^cron ") as raised:
        parse_cron(cron, "UTC", now=START)
    assert problem in raised.value.problem
    assert raised.value.code == "invalid_cron"
    assert raised.value.field == "cron"


@pytest.mark.parametrize("cron", [None, 5, ["*"] * 5])
def test_a_cron_that_is_not_a_string_is_refused(cron: object) -> None:
    with pytest.raises(InvalidCron, match="must be a string"):
        parse_cron(cron, "UTC")


@pytest.mark.parametrize("zone", ["Mars/Olympus", "Europe", "../../etc/passwd", "", None, 7])
def test_an_unknown_time_zone_is_invalid_cron_naming_the_zone(zone: object) -> None:
    with pytest.raises(InvalidCron) as raised:
        parse_cron("* * * * *", zone)
    assert raised.value.code == "invalid_cron"
    assert raised.value.field == "timezone"
    assert "timezone" in str(raised.value)


# -- default missed-slot policy ----------------------------------------------------------------


@pytest.mark.parametrize(("cron", "policy"), [
    ("* * * * *", MissedSlotPolicy.SKIP),
    ("*/5 * * * *", MissedSlotPolicy.SKIP),
    ("*/2 * * * * *", MissedSlotPolicy.SKIP),
    ("0,3 * * * *", MissedSlotPolicy.SKIP),  # the shortest gap counts (3 min)
    ("*/6 * * * *", MissedSlotPolicy.RUN_ONCE),
    ("0 * * * *", MissedSlotPolicy.RUN_ONCE),
    ("0 3 * * *", MissedSlotPolicy.RUN_ONCE),
])
def test_default_policy_is_skip_up_to_every_5_minutes_else_run_once(
        cron: str, policy: MissedSlotPolicy) -> None:
    assert default_policy(parse_cron(cron, "UTC")) is policy


# -- daylight saving ---------------------------------------------------------------------------


def test_spring_forward_a_daily_slot_in_the_gap_fires_once_at_the_next_valid_instant() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    spec = parse_cron("30 2 * * *", "Europe/Berlin")
    got = slots(spec, utc(2026, 3, 27, 12), 3)
    assert [s.astimezone(berlin).isoformat() for s in got] == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00",  # 02:30 does not exist that night
        "2026-03-30T02:30:00+02:00",
    ]
    # Seen from inside the jump, the gap slot is the one at 03:00.
    assert spec.latest_at_or_before(utc(2026, 3, 29, 1, 30)) == utc(2026, 3, 29, 1)


def test_spring_forward_several_gap_slots_collapse_into_one() -> None:
    spec = parse_cron("*/20 * * * *", "Europe/Berlin")
    got = slots(spec, utc(2026, 3, 29, 0, 30), 4)  # 01:30 CET
    assert got == [utc(2026, 3, 29, 0, 40), utc(2026, 3, 29, 1), utc(2026, 3, 29, 1, 20),
                   utc(2026, 3, 29, 1, 40)]
    assert len(set(got)) == len(got)


def test_fall_back_a_daily_slot_in_the_repeated_hour_fires_once_not_twice() -> None:
    new_york = ZoneInfo("America/New_York")
    spec = parse_cron("30 1 * * *", "America/New_York")
    got = slots(spec, utc(2026, 10, 31, 12), 3)
    assert [s.astimezone(new_york).isoformat() for s in got] == [
        "2026-11-01T01:30:00-04:00",  # the first 01:30 (EDT); 01:30 EST does not fire
        "2026-11-02T01:30:00-05:00",
        "2026-11-03T01:30:00-05:00",
    ]
    assert spec.latest_at_or_before(utc(2026, 11, 1, 6, 45)) == utc(2026, 11, 1, 5, 30)


def test_fall_back_an_hourly_cron_follows_real_time_through_the_repeated_hour() -> None:
    spec = parse_cron("0 * * * *", "America/New_York")
    assert slots(spec, utc(2026, 11, 1, 4, 30), 4) == [
        utc(2026, 11, 1, 5), utc(2026, 11, 1, 6), utc(2026, 11, 1, 7), utc(2026, 11, 1, 8)]


def _oracle(cron: str, zone_name: str, spec: CronSpec, start: datetime, end: datetime,
            step: timedelta) -> list[datetime]:
    """Every slot in [start, end] by brute force: walk real time; an instant is a slot when
    its wall time matches (a repeated wall time only on its first pass unless the hour
    field is ``*``); wall times skipped by a jump fire at the instant after the jump."""
    zone = ZoneInfo(zone_name)
    seconds_first = len(cron.split()) == 6
    found: set[datetime] = set()
    moment, previous_wall = start, None
    while moment <= end:
        local = moment.astimezone(zone)
        wall = local.replace(tzinfo=None)
        if croniter.match(cron, wall, second_at_beginning=seconds_first) and (
                local.fold == 0 or spec.hour_wildcard):
            found.add(moment)
        if previous_wall is not None and wall - previous_wall > step:
            skipped = previous_wall + step
            while skipped < wall:
                if croniter.match(cron, skipped, second_at_beginning=seconds_first):
                    found.add(moment)
                    break
                skipped += step
        previous_wall = wall
        moment += step
    return sorted(found)


@pytest.mark.parametrize(("cron", "zone", "start"), [
    ("30 2 * * *", "Europe/Berlin", utc(2026, 3, 27, 12)),
    ("*/7 * * * *", "Europe/Berlin", utc(2026, 3, 28, 20)),
    ("*/7 * * * *", "Europe/Berlin", utc(2026, 10, 24, 20)),
    ("30 1 * * *", "America/New_York", utc(2026, 10, 31, 12)),
    ("50 * * * *", "America/New_York", utc(2026, 10, 31, 20)),
    ("15,45 1-2 * * *", "America/New_York", utc(2026, 10, 31, 20)),
    ("*/10 * * * *", "America/New_York", utc(2026, 3, 7, 20)),
    ("*/15 * * * *", "Australia/Lord_Howe", utc(2026, 4, 4, 5)),  # a 30-minute shift
    ("0,30 2 * * *", "Australia/Lord_Howe", utc(2026, 10, 3, 5)),
    ("*/20 * * * *", "Antarctica/Troll", utc(2026, 10, 24, 12)),  # a 2-hour shift
    ("*/20 1-3 * * *", "Antarctica/Troll", utc(2026, 3, 28, 12)),
    ("*/20 * * * * *", "America/New_York", utc(2026, 11, 1, 4, 45)),
])
def test_slots_around_dst_changes_match_a_brute_force_oracle(cron: str, zone: str,
                                                             start: datetime) -> None:
    seconds = len(cron.split()) == 6
    end = start + (timedelta(hours=2) if seconds else timedelta(hours=50))
    spec = parse_cron(cron, zone)
    expected = _oracle(cron, zone, spec, start, end,
                       timedelta(seconds=1) if seconds else timedelta(minutes=1))
    assert len(expected) >= 2
    rng = random.Random(cron + zone)
    moments = [start + (end - start) * rng.random() for _ in range(100)]
    moments += [s + delta for s in rng.sample(expected, min(len(expected), 60))
                for delta in (timedelta(0), timedelta(seconds=-1), timedelta(microseconds=1))]
    checked = 0
    for moment in moments:
        later = [s for s in expected if s > moment]
        earlier = [s for s in expected if s <= moment]
        if not later or not earlier or moment - start < timedelta(minutes=30):
            continue  # the oracle cannot see past its window
        assert spec.next_after(moment) == later[0], moment
        assert spec.latest_at_or_before(moment) == earlier[-1], moment
        checked += 1
    assert checked > 40
