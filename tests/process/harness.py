"""Start, signal and observe real worker processes for ``tests/process``.

Each process is ``sys.executable manage.py <command>`` run from the repository root with
``DJANGO_SETTINGS_MODULE=tests.process.settings``, pointed at the pytest-django test
database, with short leases from ``JOBS_<NAME>`` variables. Its stdout and stderr go to
files (printed when a test fails) and its handlers write ``<pid>.log`` record files.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tests.process.worker_targets import OUT_DIR_ENV, Record, read_records

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

_WORKER_LINE = re.compile(r"^worker (\S+) running ", re.MULTILINE)


def database_url(settings_dict: dict[str, Any]) -> str:
    """A ``postgres://`` URL of the database Django is connected to (the test database)."""
    user = quote(settings_dict.get("USER") or "", safe="")
    password = quote(settings_dict.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = settings_dict.get("HOST") or "localhost"
    port = f":{settings_dict['PORT']}" if settings_dict.get("PORT") else ""
    return f"postgres://{auth}{host}{port}/{settings_dict['NAME']}"


def wait_until(predicate: Callable[[], Any], timeout: float, what: str,
               interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@dataclass
class WorkerProc:
    """One worker process and the files it writes."""

    name: str
    command: str
    popen: subprocess.Popen[bytes]
    stdout_path: Path
    stderr_path: Path
    out_dir: Path
    _worker_id: str | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def records(self) -> list[Record]:
        return read_records(self.out_dir, self.pid)

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def worker_id(self, timeout: float = 15.0) -> str:
        """The worker id the process printed when it started."""
        if self._worker_id is None:
            def printed() -> str | None:
                if self.popen.poll() is not None:
                    raise AssertionError(f"{self.name} exited with {self.popen.returncode} "
                                         f"before starting:\n{self.stderr()}")
                found = _WORKER_LINE.search(self.stdout())
                return found.group(1) if found else None

            self._worker_id = wait_until(printed, timeout, f"{self.name} to start")
        assert self._worker_id is not None
        return self._worker_id

    def send(self, sig: signal.Signals) -> None:
        os.kill(self.pid, sig)

    def wait_exit(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def dump(self) -> str:
        return (f"===== {self.name} pid={self.pid} `{self.command}` "
                f"exit={self.popen.poll()} =====\n--- stdout ---\n{self.stdout()}"
                f"--- stderr ---\n{self.stderr()}--- records ---\n"
                + "".join(f"{r}\n" for r in self.records()))


@dataclass
class WorkerCluster:
    """Starts worker processes for one test; ``kill_all`` ends every one still running."""

    base_dir: Path
    db_url: str
    procs: list[WorkerProc] = field(default_factory=list)

    @property
    def out_dir(self) -> Path:
        return self.base_dir / "records"

    def env(self, **jobs_env: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBS_")}
        env.update(DEFAULT_JOBS_ENV)
        env.update(jobs_env)
        env.update({
            "DATABASE_URL": self.db_url,
            "DJANGO_SETTINGS_MODULE": "tests.process.settings",
            OUT_DIR_ENV: str(self.out_dir),
            "PYTHONUNBUFFERED": "1",
            "JOBS_LOG_LEVEL": "INFO",
        })
        return env

    def start(self, command: str, **jobs_env: str) -> WorkerProc:
        """Start ``manage.py <command>``; ``jobs_env`` adds or overrides ``JOBS_*`` vars."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        name = f"{command}#{len(self.procs) + 1}"
        stdout_path = self.base_dir / f"{name}.stdout"
        stderr_path = self.base_dir / f"{name}.stderr"
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            popen = subprocess.Popen(
                [sys.executable, "manage.py", command], cwd=REPO_ROOT, env=self.env(**jobs_env),
                stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        proc = WorkerProc(name, command, popen, stdout_path, stderr_path, self.out_dir)
        self.procs.append(proc)
        return proc

    def records(self) -> list[Record]:
        """Every record of every process, in time order."""
        return sorted((r for p in self.procs for r in p.records()), key=lambda r: r.at)

    def kill_all(self) -> None:
        """SIGKILL every process still running (a stopped one too) and reap it."""
        for proc in self.procs:
            if proc.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=10)

    def dump(self) -> str:
        return "\n".join(proc.dump() for proc in self.procs)
