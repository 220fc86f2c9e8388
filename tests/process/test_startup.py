"""A process that cannot serve stops at start-up with one line naming the problem.

Real ``manage.py`` processes against a port nobody listens on and against an empty
(unmigrated) database: every worker command and ``check_ready`` exit 1 with one line on
stderr and no traceback, and write nothing (docker/'s containers rely on this to fail
visibly instead of looking alive)."""

from __future__ import annotations

import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection

from jobs_engine.testing import process_env
from tests.process.harness import DEFAULT_JOBS_ENV, REPO_ROOT, database_url

COMMANDS = [("run_fast_lane",), ("run_long_lane",), ("run_workers",), ("tick_schedules",),
            ("check_ready",)]


def manage(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = process_env("tests.process.settings", {**DEFAULT_JOBS_ENV, "DATABASE_URL": db_url},
                      drop_prefix="JOBS_")
    return subprocess.run([sys.executable, str(REPO_ROOT / "manage.py"), *args], env=env,
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)


def assert_one_line_exit(done: subprocess.CompletedProcess[str], expected: str) -> None:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1, done.stderr
    assert len(lines) == 1 and expected in lines[0], done.stderr
    assert "Traceback" not in done.stderr + done.stdout


@pytest.fixture
def closed_port_url() -> Iterator[str]:
    """A database URL on a loopback port that is bound but never listens."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        yield f"postgres://jobs:secret@127.0.0.1:{closed.getsockname()[1]}/jobs"


@pytest.fixture
def empty_database_url(transactional_db: Any) -> Iterator[str]:
    """A new, empty database on the test server (dropped afterwards)."""
    name = f"jobs_empty_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{name}"')
    try:
        yield database_url({**connection.settings_dict, "NAME": name})
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_an_unreachable_database_stops_the_process_with_one_line(
        command: tuple[str, ...], closed_port_url: str) -> None:
    assert_one_line_exit(manage(closed_port_url, *command), "cannot connect to the database")


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_an_unmigrated_database_stops_the_process_with_one_line(
        command: tuple[str, ...], empty_database_url: str) -> None:
    done = manage(empty_database_url, *command)
    assert_one_line_exit(done, "the database is not migrated")
    assert "run manage.py migrate first" in done.stderr
    with psycopg.connect(empty_database_url) as empty:  # nothing was created there
        tables = empty.execute("SELECT COUNT(*) FROM pg_tables WHERE schemaname = 'public'")
        assert tables.fetchone() == (0,)


def test_check_ready_passes_on_a_migrated_database(transactional_db: Any) -> None:
    done = manage(database_url(connection.settings_dict), "check_ready", "-v", "2")
    assert done.returncode == 0, done.stderr
    assert "the database answers and is migrated" in done.stdout


def test_check_ready_before_migrate_only_asks_for_an_answer(empty_database_url: str,
                                                            closed_port_url: str) -> None:
    assert manage(empty_database_url, "check_ready", "--unmigrated-ok").returncode == 0
    assert_one_line_exit(manage(closed_port_url, "check_ready", "--unmigrated-ok"),
                         "cannot connect to the database")
