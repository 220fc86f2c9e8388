"""``jobs_engine.testing``, the process harness shared by the process suites, the fault suite,
the bench and host projects: checked here on a stand-in ``manage.py`` (no database, no
Django), so a broken harness shows as itself and not as a worker test failing oddly."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs_engine.testing import (
    ProcessDied,
    ProcessGroup,
    WaitTimeout,
    database_url,
    process_env,
    wait_until,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

# Prints the started line the worker commands print (with its cwd and one variable), exits 0
# on SIGTERM; ``fail`` exits 1 before starting, with a message on stderr.
FAKE_MANAGE = """\
import os, signal, sys, time

if sys.argv[1] == "fail":
    sys.exit("boom: no database")
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print(f"worker fake-{os.getpid()} running {sys.argv[1]}", flush=True)
print(f"cwd={os.getcwd()} flag={os.environ.get('FAKE_FLAG', '-')}", flush=True)
while True:
    time.sleep(0.02)
"""


@pytest.fixture
def group(tmp_path: Path) -> Iterator[ProcessGroup]:
    project = tmp_path / "project"
    project.mkdir()
    (project / "manage.py").write_text(FAKE_MANAGE)
    processes = ProcessGroup(project / "manage.py", tmp_path / "logs",
                             process_env("fake.settings"))
    yield processes
    processes.kill_all()


def process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_import_loads_no_django_and_no_database_driver() -> None:
    """A conftest or a bench script imports it before ``django.setup()``."""
    code = ("import sys, jobs_engine.testing; "
            "print(sorted({m.split('.')[0] for m in sys.modules} "
            "& {'django', 'psycopg', 'confluent_kafka', 'tests', 'bench'}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                          text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_start_reads_the_worker_id_and_sigterm_stops_it(group: ProcessGroup) -> None:
    proc = group.start("run_workers", FAKE_FLAG="on")
    assert proc.worker_id() == f"fake-{proc.pid}"
    wait_until(lambda: "flag=" in proc.stdout(), 5, "the second line")
    assert f"cwd={group.manage_py.parent} flag=on" in proc.stdout()
    assert proc.name == "run_workers#1"
    assert (group.output_dir / "run_workers#1.stdout").exists()
    proc.send(signal.SIGTERM)
    assert proc.wait_exit(5) == 0
    assert not proc.alive()


def test_sigstop_sigcont_and_stop_of_a_stopped_process(group: ProcessGroup) -> None:
    proc = group.start("run_fast_lane")
    proc.worker_id()
    proc.send(signal.SIGSTOP)
    wait_until(lambda: process_state(proc.pid) == "T", 5, "the stop")
    proc.send(signal.SIGCONT)
    wait_until(lambda: process_state(proc.pid) != "T", 5, "the continue")
    proc.send(signal.SIGSTOP)
    assert proc.stop(timeout=5) == 0  # SIGCONT first: a stopped process cannot act on SIGTERM


def test_sigkill_and_kill_all_reap_everything(group: ProcessGroup) -> None:
    first, second = group.start("run_workers"), group.start("run_long_lane")
    first.worker_id()
    second.worker_id()
    first.send(signal.SIGKILL)
    assert first.wait_exit(5) == -signal.SIGKILL
    assert group.alive() == [second]
    group.kill_all()
    assert group.alive() == []
    assert second.popen.returncode == -signal.SIGKILL


def test_stop_all_sigterms_every_live_process(group: ProcessGroup) -> None:
    procs = [group.start("run_workers") for _ in range(3)]
    for proc in procs:
        proc.worker_id()
    group.stop_all(timeout=5)
    assert [proc.popen.returncode for proc in procs] == [0, 0, 0]


def test_a_process_that_exits_before_starting_fails_the_wait_with_its_stderr(
        group: ProcessGroup) -> None:
    proc = group.start("fail")
    with pytest.raises(ProcessDied, match="boom: no database"):
        proc.worker_id(timeout=10)
    assert "exit=1" in proc.dump()


def test_wait_until_returns_the_value_or_times_out_as_assertion_and_timeout() -> None:
    assert wait_until(lambda: 42, 1, "the answer") == 42
    with pytest.raises(WaitTimeout, match="waiting for nothing") as caught:
        wait_until(lambda: None, 0.1, "nothing", interval=0.01)
    assert isinstance(caught.value, AssertionError)
    assert isinstance(caught.value, TimeoutError)


def test_process_env_drops_a_prefix_and_sets_the_settings() -> None:
    env = process_env("site.settings", {"JOBS_LEASE": "3"},
                      base={"JOBS_OLD": "x", "PATH": "/bin"}, drop_prefix="JOBS_")
    assert env == {"PATH": "/bin", "DJANGO_SETTINGS_MODULE": "site.settings",
                   "PYTHONUNBUFFERED": "1", "JOBS_LEASE": "3"}


def test_database_url_quotes_credentials() -> None:
    assert database_url({"NAME": "test_db", "USER": "pg", "PASSWORD": "p@ss", "HOST": "db",
                         "PORT": 5432}) == "postgres://pg:p%40ss@db:5432/test_db"
    assert database_url({"NAME": "x", "USER": "", "HOST": "", "PORT": ""}) == \
        "postgres://localhost/x"
