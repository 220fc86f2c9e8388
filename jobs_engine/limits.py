"""Limits: how many of a target's jobs run at once, and how often they start, cluster-wide.

Declared beside the target, not in its policy (the policy stays four knobs)::

    register_target("payments:charge", charge, lane="long",
                    limits=[Rate(20, period_s=1)])                  # the provider's 20 calls/s
    register_target("pdf:render", render, lane="long",
                    limits=[Concurrency(4)])                        # 4 renderers at a time
    register_target("imports:row", import_row, lane="long",
                    limits=[Concurrency(2, per=PER_TENANT)])        # no customer starves the rest

A limit holds per key (``per``): the target as a whole (``PER_TARGET``), the job's tenant
(``PER_TENANT``), its code (``PER_CODE``), a field of its payload (``per_field("account")``)
or the ``limit_key=`` given at enqueue (``PER_LIMIT_KEY``). A target's limits may key on
the target and on one other of these: the enqueue stores that key with the row
(``limit_key``), where the workers' admission finds it by index.

``Concurrency(n)``: at most ``n`` rows of a key RUNNING at once on the long lane, or in
flight on the fast lane, across every worker. ``Rate(r, period_s, burst)``: a token bucket
of ``burst`` tokens (``r`` when omitted), refilled at ``r`` per ``period_s``; each start
takes one. So in any window of ``period_s`` at most ``r + burst`` rows of a key start.
Both are kept in the database (``store.limits``), so they hold across processes and
restarts, and operators change them at run time (``LimitOverride``).

A handler whose downstream says "wait" raises ``RateLimited(retry_after_s=...)``: its key's
bucket is emptied for that long, and the job keeps its place and its attempts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jobs_engine.errors import InvalidJob, InvalidLimit
from jobs_engine.text import NUL_PROBLEM, SURROGATE_PROBLEM

PER_TARGET = "target"
PER_TENANT = "tenant"
PER_CODE = "code"
PER_LIMIT_KEY = "limit_key"
FIELD_PREFIX = "payload."  # ``per_field(name)``: the payload's field ``name``
MAX_LIMIT_KEY_LENGTH = 200  # the ``limit_key`` column holds 200 characters
MAX_LIMIT_NAME_LENGTH = 60
MAX_PERIOD_S = 366 * 24 * 3600.0  # a year: a rate of a year's period is a quota, not a rate
MAX_SLOTS = 1_000_000
TARGET_KEY = ""  # the key of a limit per target: one bucket for the whole target


def per_field(name: str) -> str:
    """The ``per`` of a limit keyed by the payload's field ``name`` (a top-level field
    whose value is a string or a whole number)."""
    return FIELD_PREFIX + name


def _check_per(per: Any) -> None:
    if not isinstance(per, str):
        raise InvalidLimit("per", f"must be a string, got {type(per).__name__}")
    if per in (PER_TARGET, PER_TENANT, PER_CODE, PER_LIMIT_KEY):
        return
    field_name = per.removeprefix(FIELD_PREFIX)
    if per.startswith(FIELD_PREFIX) and field_name and field_name.isprintable() \
            and len(field_name) <= MAX_LIMIT_NAME_LENGTH:
        return
    raise InvalidLimit("per", f"must be one of {PER_TARGET!r}, {PER_TENANT!r}, {PER_CODE!r}, "
                              f"{PER_LIMIT_KEY!r} or per_field(name), got {per!r}")


def _whole(knob: str, value: Any, least: int, most: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise InvalidLimit(knob, f"must be a whole number from {least} to {most:,}, "
                                 f"got {value!r}")


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name or len(name) > MAX_LIMIT_NAME_LENGTH \
            or not name.isprintable():
        raise InvalidLimit("name", f"must be 1 to {MAX_LIMIT_NAME_LENGTH} printable "
                                   f"characters, got {name!r}")


@dataclass(frozen=True)
class Concurrency:
    """At most ``slots`` rows of a key running at once, across every worker. ``exclusive``
    targets are the case of one slot per code, kept by a unique index of their own."""

    slots: int
    per: str = PER_TARGET
    name: str = ""  # how operators and ``/metrics`` name it; default "concurrency[/per]"

    def __post_init__(self) -> None:
        _whole("slots", self.slots, 1, MAX_SLOTS)
        _check_per(self.per)
        if not self.name:
            object.__setattr__(self, "name", _default_name("concurrency", self.per))
        _check_name(self.name)

    def __str__(self) -> str:
        return f"{self.slots} at once {_per_text(self.per)}"


@dataclass(frozen=True)
class Rate:
    """At most ``starts`` starts per ``period_s`` of a key, with bursts of up to ``burst``
    (``starts`` when omitted): a token bucket on the database's clock."""

    starts: int
    period_s: float = 1.0
    burst: int | None = None
    per: str = PER_TARGET
    name: str = ""  # default "rate[/per]"

    def __post_init__(self) -> None:
        _whole("starts", self.starts, 1, MAX_SLOTS)
        if isinstance(self.period_s, bool) or not isinstance(self.period_s, int | float) \
                or not math.isfinite(self.period_s) or not 0 < self.period_s <= MAX_PERIOD_S:
            raise InvalidLimit("period_s", f"must be a number of seconds > 0 and at most "
                                           f"{MAX_PERIOD_S:,.0f}, got {self.period_s!r}")
        if self.burst is None:
            object.__setattr__(self, "burst", self.starts)
        _whole("burst", self.burst, 1, MAX_SLOTS)
        _check_per(self.per)
        if not self.name:
            object.__setattr__(self, "name", _default_name("rate", self.per))
        _check_name(self.name)

    @property
    def per_second(self) -> float:
        return self.starts / self.period_s

    def __str__(self) -> str:
        return f"{self.starts} per {self.period_s:g} s (burst {self.burst}) {_per_text(self.per)}"


Limit = Concurrency | Rate


def _default_name(kind: str, per: str) -> str:
    return kind if per == PER_TARGET else f"{kind}/{per}"


def _per_text(per: str) -> str:
    return "for the target" if per == PER_TARGET else f"per {per}"


@dataclass(frozen=True)
class TargetLimits:
    """A target's limits as the registry keeps them: ``key_per`` is the one key besides the
    target's that its limits use (None: only per target)."""

    limits: tuple[Limit, ...] = ()
    key_per: str | None = None
    by_name: Mapping[str, Limit] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.limits)


NO_LIMITS = TargetLimits()


def target_limits(target_name: str, limits: Any) -> TargetLimits:
    """``register_target``'s ``limits``, checked: a sequence of ``Concurrency`` / ``Rate``,
    names unique, keyed on the target and at most one other key."""
    if limits is None:
        return NO_LIMITS
    if isinstance(limits, Concurrency | Rate):
        limits = [limits]
    if isinstance(limits, str | bytes | Mapping) or not isinstance(limits, Sequence):
        raise InvalidLimit("limits", f"must be a list of Concurrency or Rate, "
                                     f"got {type(limits).__name__}")
    checked: list[Limit] = []
    names: dict[str, Limit] = {}
    for limit in limits:
        if not isinstance(limit, Concurrency | Rate):
            raise InvalidLimit("limits", f"must hold Concurrency or Rate only, got "
                                         f"{type(limit).__name__}")
        if limit.name in names:
            raise InvalidLimit("limits", f"two limits of {target_name} are named "
                                         f"{limit.name!r}: give one a name=")
        names[limit.name] = limit
        checked.append(limit)
    keys = sorted({limit.per for limit in checked} - {PER_TARGET})
    if len(keys) > 1:
        raise InvalidLimit("limits", f"{target_name}'s limits key on {keys[0]!r} and "
                                     f"{keys[1]!r}: a target's limits may key on the target "
                                     "and on one other key")
    return TargetLimits(tuple(checked), keys[0] if keys else None, names)


def limit_key_for(target_name: str, limits: TargetLimits, *, payload: Any, code: str,
                  tenant_id: str | None, given: Any) -> str | None:
    """The ``limit_key`` an enqueue stores with a row of the target: None for a target
    without limits, ``TARGET_KEY`` for one limited per target only, else the row's key.
    Raises ``InvalidJob`` naming what is missing or wrong (before anything is written)."""
    if given is not None and limits.key_per != PER_LIMIT_KEY:
        raise InvalidJob("limit_key", f"{target_name} has no limit per limit_key: "
                                      "leave it out")
    if not limits:
        return None
    per = limits.key_per
    if per is None:
        return TARGET_KEY
    if per == PER_TENANT:
        return tenant_id or TARGET_KEY
    if per == PER_CODE:
        return code
    if per == PER_LIMIT_KEY:
        if given is None:
            raise InvalidJob("limit_key", f"is required: {target_name}'s limits are per "
                                          "limit_key")
        return _checked_key("limit_key", given)
    field_name = per.removeprefix(FIELD_PREFIX)
    if not isinstance(payload, Mapping) or field_name not in payload:
        raise InvalidJob("payload", f"has no field {field_name!r}, the key of "
                                    f"{target_name}'s limits")
    value = payload[field_name]
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    return _checked_key(f"payload.{field_name}", value)


def _checked_key(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidJob(where, f"is a limit key: a non-empty string or a whole number, "
                                f"got {type(value).__name__}")
    if len(value) > MAX_LIMIT_KEY_LENGTH:
        raise InvalidJob(where, f"is a limit key of {len(value)} characters, over "
                                f"{MAX_LIMIT_KEY_LENGTH}")
    if "\x00" in value:
        raise InvalidJob(where, NUL_PROBLEM)
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise InvalidJob(where, SURROGATE_PROBLEM) from None
    return value


def key_of(limit: Limit, limit_key: str | None) -> str:
    """The bucket key of ``limit`` for a row stored with ``limit_key``."""
    return TARGET_KEY if limit.per == PER_TARGET else (limit_key or TARGET_KEY)
