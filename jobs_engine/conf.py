"""Every tunable of the engine in one settings object.

Values come from ``settings.JOBS`` and may be overridden by environment variables
``JOBS_<NAME>`` (operators change a pod without a deploy). ``problems()`` lists what is
wrong; the system check in ``checks.py`` turns those into start-up errors.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings as django_settings

from jobs_engine.errors import InvalidSettings


@dataclass(frozen=True, kw_only=True)
class JobsSettings:
    PARTITIONS: int = 64
    FAST_BATCH: int = 100
    # Rows of an at-most-once per-row target the fast lane marks in flight with one commit,
    # then hands one by one. 1: a commit per row, and a crash presumes only the row in hand
    # DEAD; N: a commit per N rows, and a crash may presume up to N-1 rows never handed DEAD.
    FAST_MARK_ROWS: int = 1
    LONG_BATCH: int = 10
    # Rows per long-lane thread a worker reserves while its handlers are short (under
    # 10 ms on average): one statement then starts and ends more of them. 1: one per thread.
    LONG_PREFETCH: int = 32
    # Of those, at-most-once rows per thread: a crash presumes every started one DEAD, run
    # or not, so they queue less deep than at-least-once rows, which run again instead.
    LONG_PREFETCH_AT_MOST_ONCE: int = 8
    # The long lane shares each reserve between the tenants whose rows wait, in proportion
    # to their weights (``TenantWeight``, 1 without one; the rows of no tenant count as one
    # more tenant of weight 1): a tenant's backlog holds another tenant's new row back by
    # one reserve at most. Whether a tenant's row waits is looked at once a POLL_S; without
    # one, the plain reserve. False: rows in priority and run order alone, whoever's.
    FAIR_SHARES: bool = True
    POLL_S: float = 1
    IDLE_POLL_S: tuple[float, ...] = (1, 2, 5)
    PARTITION_LEASE_S: float = 30
    PARTITION_HEARTBEAT_S: float = 10
    LONG_LEASE_S: float = 300
    LONG_HEARTBEAT_S: float = 60
    PROBE_S: float = 30
    TICK_S: float = 15
    GRACE_S: float = 60
    DEAD_TTL_DAYS: float = 30
    # A flow and its step jobs stay this long after the flow finished (failed ones too: a
    # flow can be resumed as long as its failed step's job exists).
    FLOW_RETENTION_DAYS: float = 7
    # Retention: how often a worker prunes completed and DEAD jobs past their targets'
    # keep counts (and DEAD ones past DEAD_TTL_DAYS).
    RETENTION_S: float = 60
    # A PENDING row whose target no handler in this worker knows goes DEAD ("no handler
    # registered") once it has been due this long: long enough for a rolling deploy to
    # bring up the workers of a release that added the target.
    UNHANDLED_GRACE_S: float = 900
    MAX_PAYLOAD_BYTES: int = 1_048_576
    MAX_KEY_LENGTH: int = 255
    MAX_CODE_LENGTH: int = 200
    # PostgreSQL: a statement about at-least-once rows alone (a fast-lane mark, a long-lane
    # reserve of targets that are not exclusive, a write of successes) commits without
    # waiting for the WAL flush. A database crash within a fraction of a second after it
    # may run those jobs again, which at least once allows; at-most-once rows, exclusive
    # codes and every other write always wait. False: every commit waits for its flush.
    LAZY_FLUSH_AT_LEAST_ONCE: bool = True
    # PostgreSQL: the planner policy of a worker's sessions (``store/planning.py``): one
    # generic plan per prepared statement, made again once a second and when a burst
    # comes, no JIT, the jobs table analysed when a burst outgrows its statistics. False:
    # the sessions keep PostgreSQL's defaults (statements are still prepared).
    PLANNER_POLICY: bool = True
    WORKERS: bool = True
    NOTIFY: bool = True  # PostgreSQL only: wake workers on commit instead of the next poll
    # ``/metrics`` answers a request with ``Authorization: Bearer <METRICS_TOKEN>`` (a
    # Prometheus scraper) and logged-in users with the engine's permission; no one else.
    METRICS_TOKEN: str = ""
    # Dotted path of ``f(request)``: the tenant a request acts for in the admin, the API and
    # the jobs it enqueues (a tenant id; ``tenancy.PLATFORM``: the platform operator, who
    # sees every tenant; None: no tenant's data). Empty: every request is the platform
    # operator's (a single-tenant project).
    TENANT_RESOLVER: str = ""
    # Who reads the API's documentation (Swagger UI and openapi.json): "staff" (logged-in
    # staff users), "public" (anyone) or "off" (nobody: 404).
    API_DOCS: str = "staff"

    def problems(self) -> list[tuple[str, str]]:
        """(field, problem) for every value that cannot work."""
        found: list[tuple[str, str]] = []
        for f in dataclasses.fields(self):  # a wrong type would crash the checks below
            value = getattr(self, f.name)
            if f.type in _NUMBERS:
                items = value if isinstance(value, tuple) else [value]
                kind = int if f.type == "int" else int | float
                if (not isinstance(value, tuple) and f.type.startswith("tuple")) or any(
                        isinstance(v, bool) or not isinstance(v, kind) for v in items):
                    found.append((f.name, f"must be a {_NUMBERS[f.type]}, got {value!r}"))
            elif f.type in _OTHERS and not isinstance(value, _OTHERS[f.type][0]):
                found.append((f.name, f"must be {_OTHERS[f.type][1]}, got {value!r}"))
        if found:
            return found
        positive = (
            "PARTITIONS", "FAST_BATCH", "FAST_MARK_ROWS", "LONG_BATCH", "LONG_PREFETCH",
            "LONG_PREFETCH_AT_MOST_ONCE", "POLL_S", "RETENTION_S", "PARTITION_LEASE_S",
            "PARTITION_HEARTBEAT_S", "LONG_LEASE_S", "LONG_HEARTBEAT_S", "PROBE_S", "TICK_S",
            "MAX_PAYLOAD_BYTES", "MAX_KEY_LENGTH", "MAX_CODE_LENGTH",
        )
        for name in positive:
            if not getattr(self, name) > 0:
                found.append((name, f"must be greater than 0, got {getattr(self, name)!r}"))
        for name in ("GRACE_S", "DEAD_TTL_DAYS", "FLOW_RETENTION_DAYS", "UNHANDLED_GRACE_S"):
            if getattr(self, name) < 0:
                found.append((name, f"must not be negative, got {getattr(self, name)!r}"))
        for name in ("IDLE_POLL_S",):
            values = getattr(self, name)
            if not values or any(v < 0 for v in values):
                found.append((name, f"must be a non-empty list of delays >= 0, got {values!r}"))
        if self.PARTITION_HEARTBEAT_S >= self.PARTITION_LEASE_S:
            found.append(("PARTITION_HEARTBEAT_S", "must be shorter than PARTITION_LEASE_S"))
        if self.LONG_HEARTBEAT_S >= self.LONG_LEASE_S:
            found.append(("LONG_HEARTBEAT_S", "must be shorter than LONG_LEASE_S"))
        if self.METRICS_TOKEN and (len(self.METRICS_TOKEN) < MIN_METRICS_TOKEN_LENGTH
                                   or not self.METRICS_TOKEN.isascii()
                                   or not self.METRICS_TOKEN.isprintable()
                                   or self.METRICS_TOKEN.strip() != self.METRICS_TOKEN):
            found.append(("METRICS_TOKEN", f"must be at least {MIN_METRICS_TOKEN_LENGTH} "
                          "printable ASCII characters without spaces around them (a short "
                          "token can be guessed); make one with python -c 'import secrets; "
                          "print(secrets.token_urlsafe(32))', or leave it empty"))
        if self.API_DOCS not in API_DOCS_CHOICES:
            found.append(("API_DOCS", f"must be one of {', '.join(API_DOCS_CHOICES)}, got "
                                      f"{self.API_DOCS!r}"))
        return found


MIN_METRICS_TOKEN_LENGTH = 16
API_DOCS_CHOICES = ("staff", "public", "off")


# Sections of ``JOBS`` that other apps read and check themselves (``contrib.kafka``'s
# "KAFKA"): the engine passes over them. One an app not installed would read is unknown.
_SECTIONS: set[str] = set()


def register_section(name: str) -> None:
    """Let an app keep its settings in ``JOBS[name]`` (call it when the app is imported)."""
    _SECTIONS.add(name)


_NUMBERS = {"int": "whole number", "float": "number",
            "tuple[float, ...]": "list of numbers of seconds"}
_OTHERS: dict[str, tuple[type, str]] = {"bool": (bool, "True or False"),
                                         "str": (str, "a string")}
_NUMBER_LISTS = {"IDLE_POLL_S"}


def _parse_env(name: str, raw: str, default: Any) -> Any:
    try:
        if name in _NUMBER_LISTS:
            return tuple(float(part) for part in raw.split(",") if part.strip())
        if isinstance(default, bool):
            if raw.strip().lower() in {"on", "true", "1", "yes"}:
                return True
            if raw.strip().lower() in {"off", "false", "0", "no"}:
                return False
            raise ValueError("expected on or off")
        if isinstance(default, int | float):  # a float field may have an int default (30)
            return float(raw) if JobsSettings.__dataclass_fields__[name].type == "float" \
                else int(raw)
        if isinstance(default, str):
            return raw
    except ValueError as exc:
        raise InvalidSettings(f"JOBS_{name}={raw!r} from the environment: {exc}") from exc
    raise InvalidSettings(f"JOBS_{name} cannot be set from the environment")


def load_settings(overrides: dict[str, Any] | None = None,
                  environ: Mapping[str, str] | None = None
                  ) -> JobsSettings:
    """Build the settings from ``settings.JOBS`` (or ``overrides``) and the environment."""
    raw = getattr(django_settings, "JOBS", {}) if overrides is None else overrides
    if not isinstance(raw, dict):
        raise InvalidSettings(f"JOBS must be a dict of settings, got {type(raw).__name__}")
    given = dict(raw)
    env: Mapping[str, str] = os.environ if environ is None else environ
    defaults = JobsSettings()
    known = {f.name for f in dataclasses.fields(JobsSettings)}
    unknown = sorted(set(given) - known - _SECTIONS)
    if unknown:
        raise InvalidSettings(f"JOBS has unknown settings: {', '.join(map(str, unknown))} (an "
                              "app that reads a section of JOBS must be in INSTALLED_APPS)")
    given = {name: value for name, value in given.items() if name in known}
    for name in known:
        raw = env.get(f"JOBS_{name}")
        if raw is not None:
            given[name] = _parse_env(name, raw, getattr(defaults, name))
    for name in _NUMBER_LISTS & set(given):
        if not isinstance(given[name], list | tuple):
            raise InvalidSettings(f"JOBS[{name!r}] must be a list of seconds, got {given[name]!r}")
        given[name] = tuple(given[name])
    if isinstance(given.get("WORKERS"), str):
        given["WORKERS"] = _parse_env("WORKERS", given["WORKERS"], True)
    return JobsSettings(**given)


_cached: JobsSettings | None = None


def jobs_settings() -> JobsSettings:
    """The process-wide settings, read once."""
    global _cached
    if _cached is None:
        _cached = load_settings()
    return _cached


def reset_settings_cache(*_args: Any, **_kwargs: Any) -> None:
    """Drop the cache (connected to Django's ``setting_changed`` for tests)."""
    global _cached
    _cached = None
