"""Fixtures of the real-process suite: PostgreSQL only, subprocesses always reaped.

The suite starts ``manage.py run_fast_lane`` (etc.) against the pytest-django test
database; LISTEN/NOTIFY, ``SKIP LOCKED`` and cross-process commits are what it tests, so
on SQLite it refuses to be collected instead of skipping silently.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from jobs_engine import registry
from tests.helpers import require_postgres
from tests.process import worker_targets
from tests.process.harness import WorkerCluster, database_url

require_postgres("tests/process", "starts real worker processes (LISTEN/NOTIFY, SKIP LOCKED, "
                 "cross-process commits)")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the item so teardown knows whether the test failed."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture
def process_targets() -> Iterator[None]:
    """The recording targets, registered in this process too (enqueue checks the name)."""
    registered = {t.name for t in registry.all_targets()}
    worker_targets.register()
    yield
    for name in worker_targets.NAMES:
        if name not in registered:
            registry.unregister_target(name)


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path: Path, transactional_db: Any,
            process_targets: None) -> Iterator[WorkerCluster]:
    """Worker processes on the test database; every one is killed at teardown (before the
    database is flushed), and their output is printed when the test failed."""
    workers = WorkerCluster(tmp_path, database_url(connection.settings_dict))
    try:
        yield workers
    finally:
        workers.kill_all()
        failed = any(getattr(getattr(request.node, f"rep_{when}", None), "failed", False)
                     for when in ("setup", "call"))
        if failed:
            print(workers.dump())
