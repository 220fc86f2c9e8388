"""Shared fixtures: test targets that unregister themselves, a fixed clock, settings."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from jobs_engine import registry
from jobs_engine.conf import JobsSettings, load_settings
from jobs_engine.job import Job
from jobs_engine.registry import Target


@pytest.fixture
def now() -> datetime:
    """A fixed decision time, taken once when the test starts; tests pass it (and later
    times made from it) to ``run_once``/``heartbeat`` instead of sleeping. Enqueue stamps
    rows with the real clock, so the fixed time starts a little after it."""
    return datetime.now(UTC) + timedelta(milliseconds=50)


@pytest.fixture
def targets() -> Iterator[Callable[..., Target]]:
    """Register targets for one test; each is unregistered afterwards.

    ``targets(name, handler=None, **register_kwargs)``; the default handler records jobs
    in ``target.extra["calls"]``.
    """
    names: list[str] = []

    def register(name: str, handler: Callable[[Job], None] | None = None, **kwargs: Any
                 ) -> Target:
        calls: list[Job] = []
        target = registry.register_target(
            name, handler or calls.append, **{"lane": "fast", **kwargs})
        target.extra["calls"] = calls
        names.append(name)
        return target

    yield register
    for name in names:
        registry.unregister_target(name)


@pytest.fixture
def jobs_settings(settings: Any) -> Callable[..., JobsSettings]:
    """``jobs_settings(PARTITIONS=8, ...)`` sets ``settings.JOBS`` and returns the object."""

    def apply(**values: Any) -> JobsSettings:
        settings.JOBS = values
        return load_settings(values, environ={})

    return apply


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


@pytest.fixture
def dead_signals() -> Iterator[list[dict[str, Any]]]:
    """Every ``job_dead`` signal sent during the test, as its keyword arguments."""
    from jobs_engine.signals import job_dead

    got: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        got.append(kwargs)

    job_dead.connect(receiver, weak=False, dispatch_uid="tests.dead_signals")
    yield got
    job_dead.disconnect(dispatch_uid="tests.dead_signals")


@pytest.fixture(autouse=True)
def fast_passwords(settings: Any) -> None:
    """Test users' passwords hashed cheaply (the default hasher takes ~0.5 s a user)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
