"""Real worker processes for ``tests/process`` (and ``tests/faults``, ``tests/kafka``).

The process plumbing (start, started line, signals, exit, output files) is
``jobs_engine.testing``; this module adds the suite's own: each process is ``manage.py
<command>`` run from the repository root with ``DJANGO_SETTINGS_MODULE=tests.process.settings``,
pointed at the pytest-django test database, with short leases from ``JOBS_<NAME>`` variables
(none from the developer's shell), and its handlers write ``<pid>.log`` record files.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from jobs_engine.testing import ManagedProcess, ProcessGroup, database_url, process_env, wait_until
from tests.process.worker_targets import OUT_DIR_ENV, Record, read_records

__all__ = [
    "DEFAULT_JOBS_ENV",
    "HEARTBEAT_S",
    "LEASE_S",
    "LONG_HEARTBEAT_S",
    "LONG_LEASE_S",
    "REPO_ROOT",
    "WorkerCluster",
    "WorkerProc",
    "database_url",
    "wait_until",
]

REPO_ROOT = Path(__file__).resolve().parents[2]

# Short leases so takeovers happen in seconds; the numbers the tests' bounds use.
LEASE_S = 3.0
HEARTBEAT_S = 1.0
LONG_LEASE_S = 3.0
LONG_HEARTBEAT_S = 1.0
DEFAULT_JOBS_ENV = {
    "JOBS_PARTITION_LEASE_S": str(LEASE_S),
    "JOBS_PARTITION_HEARTBEAT_S": str(HEARTBEAT_S),
    "JOBS_LONG_LEASE_S": str(LONG_LEASE_S),
    "JOBS_LONG_HEARTBEAT_S": str(LONG_HEARTBEAT_S),
    "JOBS_IDLE_POLL_S": "0.2,0.5",
    "JOBS_PROBE_S": "1",
}


@dataclass
class WorkerProc(ManagedProcess):
    """One worker process, its output files and the records its handlers wrote."""

    out_dir: Path = field(kw_only=True)

    def records(self) -> list[Record]:
        return read_records(self.out_dir, self.pid)

    def dump(self) -> str:
        return (super().dump() + "--- records ---\n"
                + "".join(f"{r}\n" for r in self.records()))


class WorkerCluster(ProcessGroup):
    """Worker processes of one test on the database at ``db_url``; their output and record
    files go under ``base_dir``. ``kill_all`` ends every one still running."""

    settings_module = "tests.process.settings"

    def __init__(self, base_dir: Path, db_url: str) -> None:
        super().__init__(REPO_ROOT / "manage.py", base_dir)
        self.base_dir = base_dir
        self.db_url = db_url
        self.out_dir.mkdir(parents=True, exist_ok=True)

    @property
    def out_dir(self) -> Path:
        return self.base_dir / "records"

    def env(self, **jobs_env: str) -> dict[str, str]:
        """The suite's leases, then ``jobs_env`` (adds or overrides ``JOBS_*`` variables),
        then the test database and the record directory."""
        return process_env(self.settings_module, {
            **DEFAULT_JOBS_ENV, **jobs_env,
            "DATABASE_URL": self.db_url, OUT_DIR_ENV: str(self.out_dir),
            "JOBS_LOG_LEVEL": "INFO",
        }, drop_prefix="JOBS_")

    def start(self, command: str, *args: str, name: str | None = None,
              **jobs_env: str) -> WorkerProc:
        """Start ``manage.py <command>``; ``jobs_env`` adds or overrides ``JOBS_*`` vars."""
        proc = super().start(command, *args, name=name, **jobs_env)
        assert isinstance(proc, WorkerProc)
        return proc

    def new_process(self, name: str, command: str, popen: subprocess.Popen[bytes],
                    stdout_path: Path, stderr_path: Path) -> WorkerProc:
        return WorkerProc(name, command, popen, stdout_path, stderr_path, out_dir=self.out_dir)

    @property
    def workers(self) -> list[WorkerProc]:
        """``procs``, typed: every process this cluster started is a ``WorkerProc``."""
        return [proc for proc in self.procs if isinstance(proc, WorkerProc)]

    def records(self) -> list[Record]:
        """Every record of every process, in time order."""
        return sorted((r for p in self.workers for r in p.records()), key=lambda r: r.at)
