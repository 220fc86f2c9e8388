"""docker/healthcheck.py, the health check of the image's worker containers, run as Docker
runs it (a separate process beside the worker) against the test database."""

from __future__ import annotations

import socket
import subprocess
import sys
from datetime import timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from jobs_engine.models import Worker
from jobs_engine.testing import process_env
from tests.process.harness import DEFAULT_JOBS_ENV, REPO_ROOT, database_url

HEALTHCHECK = REPO_ROOT / "docker" / "healthcheck.py"


def healthcheck(db_url: str) -> subprocess.CompletedProcess[str]:
    env = process_env("tests.process.settings", {
        **DEFAULT_JOBS_ENV, "DATABASE_URL": db_url, "PYTHONPATH": str(REPO_ROOT)},
        drop_prefix="JOBS_")
    return subprocess.run([sys.executable, str(HEALTHCHECK)], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)


def beat(seconds_ago: float) -> None:
    at = timezone.now() - timedelta(seconds=seconds_ago)
    Worker.objects.update_or_create(worker_id="health-test", defaults={
        "hostname": socket.gethostname(), "heartbeat_at": at, "started_at": at})


def test_a_worker_is_healthy_while_its_heartbeat_row_is_fresh(transactional_db: Any) -> None:
    url = database_url(connection.settings_dict)
    assert healthcheck(url).returncode == 1  # no row for this host
    beat(seconds_ago=1)
    assert healthcheck(url).returncode == 0
    beat(seconds_ago=float(DEFAULT_JOBS_ENV["JOBS_PARTITION_LEASE_S"]) + 5)
    assert healthcheck(url).returncode == 1  # stale: the worker stopped beating


def test_a_database_outage_does_not_fail_a_worker() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        done = healthcheck(f"postgres://jobs:x@127.0.0.1:{closed.getsockname()[1]}/jobs")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("database unreachable, worker not judged:")
    assert "Traceback" not in done.stderr
