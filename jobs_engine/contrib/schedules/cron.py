"""Cron expressions read in a time zone: validation and DST-correct slot times.

Accepted syntax (parsed by ``croniter``):

- 5 fields ``minute hour day-of-month month day-of-week``, or 6 fields with the
  **seconds field first** ``second minute hour day-of-month month day-of-week`` (as in
  Quartz, Spring and node-cron; ``*/2 * * * * *`` is every 2 seconds);
- ``*``, values, ranges ``1-5``, steps ``*/15`` and ``10-50/20``, lists ``1,15,30``;
- month names ``JAN``-``DEC`` and day names ``SUN``-``SAT`` (any case); day-of-week 0 or 7
  is Sunday;
- ``L`` in day-of-month (last day of the month), ``L`` before a day-of-week (``L5``: the
  last Friday of the month), ``#`` in day-of-week (``MON#2``: the second Monday), ``W`` in
  day-of-month (``15W``: the weekday nearest the 15th), ``?`` as ``*``;
- the macros ``@yearly`` ``@annually`` ``@monthly`` ``@weekly`` ``@daily`` ``@midnight``
  ``@hourly``;
- when both day-of-month and day-of-week are restricted, a day matching either fires
  (classic Vixie cron behaviour).

Refused with ``invalid_cron``: any other field count (no year field), values out of range,
unknown names, ``R`` (random) and ``H`` (hashed) values (every worker must compute the same
slots), an unknown time zone, and an expression that never fires within 5 years (``0 0 30
2 *``).

Time zones: a schedule's fields are wall-clock times in its IANA zone. Slot times are
instants (aware UTC datetimes), computed so that daylight saving changes neither lose nor
double a slot:

- spring forward: a wall time inside the skipped hour fires once, at the first valid
  instant after the gap (``30 2 * * *`` in Europe/Berlin on 2026-03-29 fires at 03:00
  CEST); several such wall times collapse into that one slot;
- fall back: a wall time that happens twice fires once, at its first occurrence, when the
  hour field is restricted (``30 1 * * *`` in America/New_York fires at 01:30 EDT on
  2026-11-01, not again at 01:30 EST). When the hour field is ``*`` (the cron runs every
  hour), slots follow real time through the repeated hour: ``0 * * * *`` fires at 01:00
  EDT and again an hour later at 01:00 EST, like cronie and Vixie cron.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

from jobs_engine.contrib.schedules.errors import InvalidCron

HORIZON_YEARS = 5
MAX_CRON_LENGTH = 200
MACROS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
# Longer than any daylight saving shift in the tz database (2 h), so a slot of a repeated
# wall time is never missed when the search starts near a transition.
_DST_WINDOW = timedelta(hours=3)
_PARSE_ERRORS = (CroniterError, ValueError, TypeError, KeyError, IndexError, OverflowError)


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"a time-zone-aware datetime is required, got {moment!r}")
    return moment.astimezone(UTC)


def load_zone(name: object) -> ZoneInfo:
    """The IANA zone ``name``; ``InvalidCron`` (field ``timezone``) when there is none."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidCron(name, "must be an IANA time zone name such as 'Europe/Berlin'",
                          field="timezone")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidCron(name, "is not a known IANA time zone", field="timezone") from None


@dataclass(frozen=True)
class CronSpec:
    """A validated cron expression in a zone; slot times are aware UTC datetimes."""

    expression: str
    timezone: str
    zone: ZoneInfo = field(repr=False, compare=False)
    hour_wildcard: bool = field(compare=False)

    def _iter(self, start: datetime) -> croniter:
        """Wall-clock (naive) iteration: croniter never sees a DST change."""
        return croniter(self.expression, start, second_at_beginning=True,
                        max_years_between_matches=HORIZON_YEARS)

    def _instants(self, wall: datetime) -> tuple[datetime, datetime | None]:
        """The slot instant(s) of one wall-clock firing time: (first, second occurrence).

        ``second`` is set only for a repeated wall time of an hour-wildcard cron.
        """
        early = wall.replace(tzinfo=self.zone, fold=0).astimezone(UTC)
        late = wall.replace(tzinfo=self.zone, fold=1).astimezone(UTC)
        if early == late:
            return early, None
        if early.astimezone(self.zone).replace(tzinfo=None) != wall:
            # In a spring-forward gap: fold=1 reads it with the offset after the change
            # (an instant before the change), fold=0 with the offset before (after it).
            return self._gap_end(late, early), None
        return early, (late if self.hour_wildcard else None)

    def _gap_end(self, before_change: datetime, after_change: datetime) -> datetime:
        """The instant the clock jumps (the first valid wall time after the gap)."""
        offset = before_change.astimezone(self.zone).utcoffset()
        low, high = int(before_change.timestamp()), int(after_change.timestamp())
        while high - low > 1:
            middle = (low + high) // 2
            if datetime.fromtimestamp(middle, self.zone).utcoffset() == offset:
                low = middle
            else:
                high = middle
        return datetime.fromtimestamp(high, UTC)

    def next_after(self, moment: datetime) -> datetime:
        """The first slot strictly after ``moment``."""
        moment = _utc(moment)
        local = moment.astimezone(self.zone)
        # Before a fall-back change, second occurrences of earlier wall times come later.
        ahead_offset = (moment + _DST_WINDOW).astimezone(self.zone).utcoffset()
        local_offset = local.utcoffset()
        assert local_offset is not None and ahead_offset is not None
        margin = max(local_offset - ahead_offset, timedelta(0)) if self.hour_wildcard \
            else timedelta(0)
        wall_times = self._iter(local.replace(tzinfo=None) - margin)
        best: datetime | None = None
        while True:
            first, second = self._instants(wall_times.get_next(datetime))
            for instant in (first, second):
                if instant is not None and instant > moment and (best is None or instant < best):
                    best = instant
            if first > moment:  # later wall times only give later instants
                assert best is not None
                return best

    def latest_at_or_before(self, moment: datetime) -> datetime:
        """The last slot at or before ``moment``."""
        moment = _utc(moment)
        local = moment.astimezone(self.zone)
        # After a fall-back change, first occurrences of later wall times came earlier.
        behind_offset = (moment - _DST_WINDOW).astimezone(self.zone).utcoffset()
        local_offset = local.utcoffset()
        assert local_offset is not None and behind_offset is not None
        margin = max(behind_offset - local_offset, timedelta(0))
        wall_times = self._iter(local.replace(tzinfo=None) + margin + timedelta(seconds=1))
        best: datetime | None = None
        while True:
            first, second = self._instants(wall_times.get_prev(datetime))
            for instant in (first, second):
                if instant is not None and instant <= moment and (best is None or instant > best):
                    best = instant
            if first <= moment and (second is None or second <= moment):
                assert best is not None
                return best

    def min_interval(self, samples: int = 12) -> timedelta:
        """The shortest wall-clock gap between consecutive slots (picks the default
        missed-slot policy)."""
        wall_times = self._iter(datetime(2026, 1, 1))
        previous = wall_times.get_next(datetime)
        shortest: timedelta | None = None
        for _ in range(samples):
            current = wall_times.get_next(datetime)
            gap = current - previous
            shortest = gap if shortest is None else min(shortest, gap)
            previous = current
        assert shortest is not None
        return shortest


def parse_cron(expression: object, timezone: object = "UTC", *,
               now: datetime | None = None) -> CronSpec:
    """Validate ``expression`` in ``timezone``; ``InvalidCron`` names the problem."""
    if not isinstance(expression, str):
        raise InvalidCron(expression, "must be a string such as '*/5 * * * *'")
    text = " ".join(expression.split())
    if not text:
        raise InvalidCron(expression, "is empty")
    if len(text) > MAX_CRON_LENGTH:
        raise InvalidCron(expression, f"is longer than {MAX_CRON_LENGTH} characters")
    zone = load_zone(timezone)
    assert isinstance(timezone, str)
    if text.startswith("@"):
        if text.lower() not in MACROS:
            raise InvalidCron(expression, f"unknown macro; use one of {', '.join(MACROS)}")
        text = text.lower()
    else:
        parts = text.split(" ")
        if len(parts) not in (5, 6):
            raise InvalidCron(expression, f"has {len(parts)} fields; expected 5 (minute hour "
                                          "day-of-month month day-of-week) or 6 (second first)")
        for part in parts:
            for item in part.split(","):
                if item[:1].upper() in {"R", "H"}:
                    raise InvalidCron(expression, f"{item!r}: random (R) and hashed (H) values "
                                                  "are not accepted; every worker must "
                                                  "compute the same slots")
    try:
        hour_field = croniter(text, datetime(2026, 1, 1), second_at_beginning=True).expanded[1]
    except _PARSE_ERRORS as exc:
        raise InvalidCron(expression, str(exc) or type(exc).__name__) from None
    spec = CronSpec(text, timezone, zone, hour_field == ["*"])
    try:
        spec.next_after(now or datetime.now(UTC))
    except CroniterBadDateError:
        raise InvalidCron(expression, f"never fires within {HORIZON_YEARS} years") from None
    except _PARSE_ERRORS as exc:
        raise InvalidCron(expression, str(exc) or type(exc).__name__) from None
    return spec


@functools.lru_cache(maxsize=1024)
def cron_spec(expression: str, timezone: str) -> CronSpec:
    """``parse_cron`` cached for the tick (rows repeat the same few expressions)."""
    return parse_cron(expression, timezone)
