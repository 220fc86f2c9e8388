"""JOBS settings: nonsense values fail at start-up naming the field; env JOBS_<NAME> wins.

Operators tune a pod through the environment without a deploy, so a typo there must stop
the process with a message that says which variable is wrong, before any work is done.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core import checks

from jobs_engine.checks import check_jobs_settings
from jobs_engine.conf import jobs_settings, load_settings
from jobs_engine.errors import InvalidSettings

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The check reads os.environ: no JOBS_* of the caller's shell may leak in."""
    for name in list(os.environ):
        if name.startswith("JOBS_"):
            monkeypatch.delenv(name)
    yield


def run_check(settings: Any, jobs: dict[str, Any]) -> list[checks.CheckMessage]:
    settings.JOBS = jobs
    return check_jobs_settings()


# -- load_settings -----------------------------------------------------------------------------


def test_defaults_match_the_spec() -> None:
    s = load_settings({}, environ={})
    assert (s.PARTITIONS, s.FAST_BATCH, s.LONG_BATCH) == (64, 100, 10)
    assert (s.FAST_MARK_ROWS, s.LONG_PREFETCH, s.LONG_PREFETCH_AT_MOST_ONCE) == (1, 32, 8)
    assert (s.RETENTION_S, s.UNHANDLED_GRACE_S) == (60, 900)
    assert s.IDLE_POLL_S == (1, 2, 5)
    assert (s.PARTITION_LEASE_S, s.PARTITION_HEARTBEAT_S) == (30, 10)
    assert (s.LONG_LEASE_S, s.LONG_HEARTBEAT_S) == (300, 60)
    assert (s.PROBE_S, s.TICK_S, s.GRACE_S, s.DEAD_TTL_DAYS, s.POLL_S) == (30, 15, 60, 30, 1)
    assert s.MAX_PAYLOAD_BYTES == 1_048_576
    assert s.WORKERS is True
    assert s.PLANNER_POLICY is True
    assert s.problems() == []


def test_jobs_dict_values_are_used() -> None:
    s = load_settings({"PARTITIONS": 16, "IDLE_POLL_S": [5, 10]}, environ={})
    assert s.PARTITIONS == 16
    assert s.IDLE_POLL_S == (5, 10)


@pytest.mark.parametrize(("env", "field", "value"), [
    ({"JOBS_PARTITIONS": "8"}, "PARTITIONS", 8),
    ({"JOBS_UNHANDLED_GRACE_S": "30"}, "UNHANDLED_GRACE_S", 30),
    ({"JOBS_IDLE_POLL_S": "0.5, 1"}, "IDLE_POLL_S", (0.5, 1.0)),
    ({"JOBS_WORKERS": "off"}, "WORKERS", False),
    ({"JOBS_WORKERS": "on"}, "WORKERS", True),
    ({"JOBS_PARTITION_LEASE_S": "45"}, "PARTITION_LEASE_S", 45),
    ({"JOBS_POLL_S": "0.25"}, "POLL_S", 0.25),
    ({"JOBS_PARTITION_LEASE_S": "12.5"}, "PARTITION_LEASE_S", 12.5),
    ({"JOBS_MAX_PAYLOAD_BYTES": "2048"}, "MAX_PAYLOAD_BYTES", 2048),
    ({"JOBS_FAST_MARK_ROWS": "100"}, "FAST_MARK_ROWS", 100),
    ({"JOBS_PLANNER_POLICY": "off"}, "PLANNER_POLICY", False),
])
def test_env_overrides_jobs(env: dict[str, str], field: str, value: Any) -> None:
    """The environment wins over the JOBS dict (operators change a pod without a deploy)."""
    s = load_settings({"PARTITIONS": 32, "WORKERS": True, "POLL_S": 2}, environ=env)
    assert getattr(s, field) == value


@pytest.mark.parametrize(("env", "name"), [
    ({"JOBS_PARTITIONS": "eight"}, "JOBS_PARTITIONS"),
    ({"JOBS_PARTITIONS": "8.5"}, "JOBS_PARTITIONS"),
    ({"JOBS_IDLE_POLL_S": "1,x,3"}, "JOBS_IDLE_POLL_S"),
    ({"JOBS_WORKERS": "maybe"}, "JOBS_WORKERS"),
    ({"JOBS_PARTITION_LEASE_S": "soon"}, "JOBS_PARTITION_LEASE_S"),
])
def test_bad_env_value_names_the_variable(env: dict[str, str], name: str) -> None:
    with pytest.raises(InvalidSettings) as info:
        load_settings({}, environ=env)
    assert name in str(info.value)


def test_unknown_key_in_jobs_is_refused() -> None:
    with pytest.raises(InvalidSettings) as info:
        load_settings({"PARTITION": 8}, environ={})
    assert "PARTITION" in str(info.value)


def test_jobs_settings_follows_django_settings(settings: Any) -> None:
    """The cached process settings are rebuilt when settings.JOBS changes (tests rely on it)."""
    settings.JOBS = {"PARTITIONS": 12}
    assert jobs_settings().PARTITIONS == 12
    settings.JOBS = {"PARTITIONS": 13}
    assert jobs_settings().PARTITIONS == 13


# -- the system check ---------------------------------------------------------------------------


NONSENSE: list[tuple[str, dict[str, Any], str]] = [
    ("negative-partition-lease", {"PARTITION_LEASE_S": -5}, "PARTITION_LEASE_S"),
    ("negative-long-lease", {"LONG_LEASE_S": -1}, "LONG_LEASE_S"),
    ("partition-heartbeat-equals-lease", {"PARTITION_HEARTBEAT_S": 30}, "PARTITION_HEARTBEAT_S"),
    ("partition-heartbeat-over-lease",
     {"PARTITION_LEASE_S": 20, "PARTITION_HEARTBEAT_S": 25}, "PARTITION_HEARTBEAT_S"),
    ("long-heartbeat-equals-lease", {"LONG_HEARTBEAT_S": 300}, "LONG_HEARTBEAT_S"),
    ("long-heartbeat-over-lease", {"LONG_LEASE_S": 60, "LONG_HEARTBEAT_S": 90},
     "LONG_HEARTBEAT_S"),
    ("zero-partitions", {"PARTITIONS": 0}, "PARTITIONS"),
    ("zero-mark-rows", {"FAST_MARK_ROWS": 0}, "FAST_MARK_ROWS"),
    ("zero-retention", {"RETENTION_S": 0}, "RETENTION_S"),
    ("negative-unhandled-grace", {"UNHANDLED_GRACE_S": -1}, "UNHANDLED_GRACE_S"),
    ("empty-idle-poll", {"IDLE_POLL_S": []}, "IDLE_POLL_S"),
    ("zero-payload-limit", {"MAX_PAYLOAD_BYTES": 0}, "MAX_PAYLOAD_BYTES"),
    ("negative-grace", {"GRACE_S": -1}, "GRACE_S"),
    ("unknown-key", {"PARTITIONZ": 8}, "PARTITIONZ"),
    ("partitions-as-text", {"PARTITIONS": "8"}, "PARTITIONS"),
    ("lease-as-none", {"PARTITION_LEASE_S": None}, "PARTITION_LEASE_S"),
    ("partitions-as-float", {"PARTITIONS": 8.5}, "PARTITIONS"),
    ("idle-poll-as-number", {"IDLE_POLL_S": 60}, "IDLE_POLL_S"),
    ("workers-as-number", {"WORKERS": 5}, "WORKERS"),
    ("notify-as-text", {"NOTIFY": "sometimes"}, "NOTIFY"),
    ("planner-policy-as-text", {"PLANNER_POLICY": "off"}, "PLANNER_POLICY"),
    ("metrics-token-as-number", {"METRICS_TOKEN": 1234}, "METRICS_TOKEN"),
    # A token short enough to guess, or one that whitespace or another script would make
    # differ between the scraper's header and the setting.
    ("metrics-token-too-short", {"METRICS_TOKEN": "x"}, "METRICS_TOKEN"),
    ("metrics-token-of-15", {"METRICS_TOKEN": "a" * 15}, "METRICS_TOKEN"),
    ("metrics-token-with-space", {"METRICS_TOKEN": " " + "a" * 20}, "METRICS_TOKEN"),
    ("metrics-token-not-ascii", {"METRICS_TOKEN": "é" * 20}, "METRICS_TOKEN"),
    ("api-docs-unknown", {"API_DOCS": "everyone"}, "API_DOCS"),
    ("tenant-resolver-unimportable", {"TENANT_RESOLVER": "no.such.resolver"},
     "TENANT_RESOLVER"),
]


@pytest.mark.parametrize(("jobs", "field"), [(j, f) for _, j, f in NONSENSE],
                         ids=[name for name, _, _ in NONSENSE])
def test_nonsense_settings_are_a_check_error_naming_the_field(
        settings: Any, jobs: dict[str, Any], field: str) -> None:
    errors = run_check(settings, jobs)
    assert errors, f"no error for {jobs}"
    assert all(isinstance(e, checks.Error) for e in errors)
    assert any(field in e.msg for e in errors), [e.msg for e in errors]


def test_jobs_that_is_not_a_dict_is_a_check_error(settings: Any) -> None:
    errors = run_check(settings, [("PARTITIONS", 8)])  # type: ignore[arg-type]
    assert [e.id for e in errors] == ["jobs_engine.E001"]
    assert "JOBS must be a dict" in errors[0].msg


def test_a_section_no_installed_app_reads_is_an_unknown_setting(
        settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``JOBS["KAFKA"]`` belongs to ``contrib.kafka``; without that app (its section not
    registered) it is an unknown setting, not silently ignored."""
    from jobs_engine import conf

    monkeypatch.setattr(conf, "_SECTIONS", set())
    errors = run_check(settings, {"KAFKA": {"BOOTSTRAP_SERVERS": "127.0.0.1:9092"}})
    assert [e.id for e in errors] == ["jobs_engine.E001"]
    assert "KAFKA" in errors[0].msg and "INSTALLED_APPS" in errors[0].msg
    monkeypatch.setattr(conf, "_SECTIONS", {"KAFKA"})
    assert run_check(settings, {"KAFKA": {"BOOTSTRAP_SERVERS": "127.0.0.1:9092"}}) == []


def test_kafka_app_without_confluent_kafka_is_a_check_error_saying_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs_engine.contrib.kafka import checks as kafka_checks

    monkeypatch.setattr(kafka_checks, "find_spec",
                        lambda name: None if name == "confluent_kafka" else object())
    errors = kafka_checks.check_kafka_settings()
    assert [e.id for e in errors] == ["jobs_engine_kafka.E001"]
    assert "pip install 'jobs-engine[kafka]'" in errors[0].msg


def test_sane_settings_pass_the_check(settings: Any) -> None:
    assert run_check(settings, {}) == []
    assert run_check(settings, {"PARTITIONS": 8, "PARTITION_LEASE_S": 10,
                                "PARTITION_HEARTBEAT_S": 3, "RETENTION_S": 5}) == []
    assert run_check(settings, {"METRICS_TOKEN": "a" * 16, "API_DOCS": "public",
                                "TENANT_RESOLVER": "tests.db.conftest.by_tenant"}) == []


def test_bad_env_value_is_a_check_error(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBS_PARTITIONS", "lots")
    errors = run_check(settings, {})
    assert len(errors) == 1 and "JOBS_PARTITIONS" in errors[0].msg


def test_env_nonsense_is_a_check_error(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBS_PARTITION_HEARTBEAT_S", "40")
    errors = run_check(settings, {})
    assert [e.id for e in errors] == ["jobs_engine.E002"]
    assert "PARTITION_HEARTBEAT_S" in errors[0].msg


def test_check_is_registered_with_django() -> None:
    assert check_jobs_settings in checks.registry.registry.get_checks()


# -- start-up in a real process --------------------------------------------------------------


def manage(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    """Run manage.py with the SQLite default database and the given JOBS_* variables."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("JOBS_") and k != "DATABASE_URL"}
    return subprocess.run([PYTHON, "manage.py", *args], cwd=ROOT, env={**clean, **env},
                          capture_output=True, text=True, timeout=timeout)


def test_manage_check_fails_on_zero_partitions() -> None:
    done = manage("check", env={"JOBS_PARTITIONS": "0"})
    assert done.returncode != 0
    assert "PARTITIONS" in done.stdout + done.stderr


def test_manage_check_passes_with_defaults() -> None:
    done = manage("check", env={})
    assert done.returncode == 0, done.stdout + done.stderr


def test_run_fast_lane_refuses_to_start_on_bad_heartbeat() -> None:
    """The system check stops the worker before it registers or takes a partition."""
    done = manage("run_fast_lane", env={"JOBS_PARTITION_HEARTBEAT_S": "40"}, timeout=60)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "PARTITION_HEARTBEAT_S" in output
    assert " running " not in done.stdout, "the worker started anyway"


def test_run_fast_lane_with_workers_off_only_enqueues() -> None:
    done = manage("run_fast_lane", env={"JOBS_WORKERS": "off"}, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "only enqueues" in done.stdout
    assert " running " not in done.stdout


def test_workers_off_settings_object() -> None:
    """WORKERS off from the JOBS dict as text too (the same words as the environment)."""
    assert load_settings({"WORKERS": "off"}, environ={}).WORKERS is False
    assert load_settings({"WORKERS": "on"}, environ={"JOBS_WORKERS": "off"}).WORKERS is False


@pytest.mark.parametrize("name", ["MAX_ATTEMPTS", "RETRY_DELAYS"])
def test_retry_settings_are_unknown_settings(settings: Any, name: str) -> None:
    """Retries are each target's JobPolicy; engine-wide retry settings never shipped, so
    these names are refused like any other unknown key."""
    errors = run_check(settings, {name: 6 if name == "MAX_ATTEMPTS" else [60, 120]})
    assert [e.id for e in errors] == ["jobs_engine.E001"]
    assert f"unknown settings: {name}" in errors[0].msg
