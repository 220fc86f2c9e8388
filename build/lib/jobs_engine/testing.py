"""Real ``manage.py`` processes for tests and benchmarks: start, signal, observe, reap.

What the engine promises across processes (LISTEN/NOTIFY wake-ups, ``SKIP LOCKED``, partition
leases, a clean exit on SIGTERM, nothing lost under SIGKILL) shows only with real worker
processes, so the engine's own process suites and its bench start them through this module,
and a host project can do the same in its own tests::

    import signal
    from pathlib import Path

    from django.db import connection
    from jobs_engine.testing import ProcessGroup, database_url, process_env, wait_until

    MANAGE_PY = Path(__file__).resolve().parents[1] / "manage.py"


    def test_welcome_mail_is_sent(tmp_path, transactional_db):
        env = process_env("mysite.settings",
                          {"DATABASE_URL": database_url(connection.settings_dict)})
        workers = ProcessGroup(MANAGE_PY, tmp_path, env)
        try:
            worker = workers.start("run_workers")
            worker.worker_id()  # waits for its "worker <id> running ..." line
            sign_up("ada@example.com")  # commits a user and its mail job
            wait_until(lambda: outbox_has("ada@example.com"), 10, "the welcome mail")
            worker.send(signal.SIGTERM)
            assert worker.wait_exit(10) == 0, worker.dump()
        finally:
            workers.kill_all()

(``DATABASE_URL`` is how the project's settings would read the test database's address; the
workers must reach the database the test writes to, which for pytest-django is the test
database, committed, hence ``transactional_db``.)

Each process is ``<python> <manage.py> <command> [args]``: ``sys.executable`` unless the group
is given another interpreter, the working directory the group is given (by default the
directory of that ``manage.py``), stdin closed, stdout and stderr in
``<output_dir>/<name>.stdout`` and ``.stderr`` (read back as text at any time), and its own
session, so a signal reaches it and what it started, never the test runner. The environment
is the group's (``process_env`` builds one: the caller's, a settings module, unbuffered output
so the started line shows at once) with a start's own variables on top.

The module imports only the standard library: it sets no Django up and loads no database
driver, so a conftest or a benchmark script can import it before ``django.setup()``.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

__all__ = [
    "WORKER_STARTED",
    "ManagedProcess",
    "ProcessDied",
    "ProcessGroup",
    "WaitTimeout",
    "database_url",
    "process_env",
    "wait_until",
]

# What the worker commands (run_workers, run_fast_lane, run_long_lane, tick_schedules) print
# once they run; group 1 is the worker id their rows carry (claimed_by, partition owner).
WORKER_STARTED = re.compile(r"^worker (\S+) running ", re.MULTILINE)


class WaitTimeout(AssertionError, TimeoutError):
    """``wait_until`` gave up: an ``AssertionError`` so pytest reports it as a failed check, a
    ``TimeoutError`` so a script can catch it as one."""


class ProcessDied(AssertionError, RuntimeError):
    """A process exited while the caller waited for it to start."""


def wait_until(predicate: Callable[[], Any], timeout: float, what: str,
               interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns a truthy value, and return that value; raise
    ``WaitTimeout`` naming ``what`` after ``timeout`` seconds. An exception the predicate
    raises ends the wait at once (a dead process need not wait out the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def database_url(settings_dict: Mapping[str, Any]) -> str:
    """A ``postgres://`` URL of a Django PostgreSQL connection's settings (pass
    ``connection.settings_dict``: under pytest-django, the test database), for processes
    whose settings read the database from a URL."""
    user = quote(settings_dict.get("USER") or "", safe="")
    password = quote(settings_dict.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = settings_dict.get("HOST") or "localhost"
    port = f":{settings_dict['PORT']}" if settings_dict.get("PORT") else ""
    return f"postgres://{auth}{host}{port}/{settings_dict['NAME']}"


def process_env(settings_module: str, overrides: Mapping[str, str] | None = None, *,
                base: Mapping[str, str] | None = None,
                drop_prefix: str | None = None) -> dict[str, str]:
    """An environment for ``manage.py`` processes: ``base`` (default ``os.environ``) without
    the variables named ``drop_prefix...`` (e.g. ``"JOBS_"``, so a developer's shell cannot
    change a test), then ``DJANGO_SETTINGS_MODULE`` and ``PYTHONUNBUFFERED=1`` (the started
    line reaches the file when printed), then ``overrides``."""
    source = os.environ if base is None else base
    env = {k: v for k, v in source.items() if not (drop_prefix and k.startswith(drop_prefix))}
    env.update({"DJANGO_SETTINGS_MODULE": settings_module, "PYTHONUNBUFFERED": "1"})
    env.update(overrides or {})
    return env


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


@dataclass
class ManagedProcess:
    """One started ``manage.py`` process and the files its output goes to."""

    name: str
    command: str
    popen: subprocess.Popen[bytes]
    stdout_path: Path
    stderr_path: Path
    # Its connections' application_name (libpq reads PGAPPNAME): its backends can be told
    # apart in pg_stat_activity.
    app_name: str = field(default="", init=False)
    _worker_id: str | None = field(default=None, init=False, repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        """Running (or stopped by SIGSTOP): it has not exited yet."""
        return self.popen.poll() is None

    def stdout(self) -> str:
        return _read(self.stdout_path)

    def stderr(self) -> str:
        return _read(self.stderr_path)

    def printed_id(self) -> str | None:
        """The worker id of its started line, or None while it has printed none (never
        waits)."""
        if self._worker_id is None:
            found = WORKER_STARTED.search(self.stdout())
            self._worker_id = found.group(1) if found else None
        return self._worker_id

    def worker_id(self, timeout: float = 15.0) -> str:
        """Wait for the started line and return its worker id; ``ProcessDied`` (with its
        stderr) when the process exits first."""
        def printed() -> str | None:
            if self.printed_id() is None and not self.alive():
                raise ProcessDied(f"{self.name} exited with {self.popen.returncode} before "
                                  f"starting:\n{self.stderr()}")
            return self.printed_id()

        found: str = wait_until(printed, timeout, f"{self.name} to start")
        return found

    def send(self, sig: signal.Signals) -> None:
        """Send ``sig`` (SIGTERM, SIGKILL, SIGSTOP, SIGCONT, ...) to the process's session:
        the process and anything it started. ``ProcessLookupError`` once it was reaped."""
        os.killpg(self.pid, sig)

    def wait_exit(self, timeout: float) -> int:
        """Its exit code (a negative signal number when a signal ended it);
        ``subprocess.TimeoutExpired`` if it still runs after ``timeout`` seconds."""
        return self.popen.wait(timeout=timeout)

    def stop(self, timeout: float = 30.0) -> int:
        """A clean stop: SIGCONT (a stopped process cannot act on SIGTERM), SIGTERM, then
        SIGKILL if it has not exited within ``timeout``; returns the exit code."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.send(signal.SIGCONT)
                self.send(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                return self.wait_exit(timeout)
        return self.kill()

    def kill(self, reap_timeout: float = 10.0) -> int:
        """SIGKILL it if it still runs (stopped too) and reap it; returns the exit code."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.send(signal.SIGKILL)
        return self.popen.wait(timeout=reap_timeout)

    def dump(self) -> str:
        """Its command, exit code and output, for a failure message."""
        return (f"===== {self.name} pid={self.pid} `{self.command}` "
                f"exit={self.popen.poll()} =====\n--- stdout ---\n{self.stdout()}"
                f"--- stderr ---\n{self.stderr()}")


class ProcessGroup:
    """The processes one test (or one benchmark phase) starts from one ``manage.py``;
    ``kill_all`` in a ``finally`` leaves none behind.

    Subclasses adapt it to a suite: ``env`` (the variables each start gets) and
    ``new_process`` (a ``ManagedProcess`` subclass that knows the suite's files)."""

    def __init__(self, manage_py: Path, output_dir: Path,
                 base_env: Mapping[str, str] | None = None, *, cwd: Path | None = None,
                 python: str | os.PathLike[str] | None = None) -> None:
        self.manage_py = Path(manage_py).resolve()
        self.output_dir = Path(output_dir)
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.cwd = Path(cwd) if cwd is not None else self.manage_py.parent
        self.python = str(python) if python is not None else sys.executable
        self.procs: list[ManagedProcess] = []

    def env(self, **overrides: str) -> dict[str, str]:
        """The environment of one start: ``base_env`` with ``overrides``."""
        return {**self.base_env, **overrides}

    def start(self, command: str, *args: str, name: str | None = None,
              **env: str) -> ManagedProcess:
        """Start ``manage.py <command> <args>`` (``env`` on top of ``self.env()``); its output
        goes to ``<output_dir>/<name>.stdout|.stderr`` (name default: ``<command>#<n>``)."""
        name = name or f"{command}#{len(self.procs) + 1}"
        self.output_dir.mkdir(parents=True, exist_ok=True)
        stdout_path = self.output_dir / f"{name}.stdout"
        stderr_path = self.output_dir / f"{name}.stderr"
        app_name = f"{name} {secrets.token_hex(4)}"
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            popen = subprocess.Popen(
                [self.python, str(self.manage_py), command, *args], cwd=self.cwd,
                env={**self.env(**env), "PGAPPNAME": app_name}, stdout=out, stderr=err,
                stdin=subprocess.DEVNULL, start_new_session=True)
        proc = self.new_process(name, " ".join([command, *args]), popen, stdout_path,
                                stderr_path)
        proc.app_name = app_name
        self.procs.append(proc)
        return proc

    def new_process(self, name: str, command: str, popen: subprocess.Popen[bytes],
                    stdout_path: Path, stderr_path: Path) -> ManagedProcess:
        """The object ``start`` returns (a hook for subclasses)."""
        return ManagedProcess(name, command, popen, stdout_path, stderr_path)

    def alive(self) -> list[ManagedProcess]:
        return [proc for proc in self.procs if proc.alive()]

    def stop_all(self, timeout: float = 30.0) -> None:
        """SIGCONT and SIGTERM to every live process at once, then wait up to ``timeout``
        for all of them; SIGKILL (and reap) the ones still running."""
        for proc in self.alive():
            with contextlib.suppress(ProcessLookupError):
                proc.send(signal.SIGCONT)
                proc.send(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait_exit(max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.kill()

    def kill_all(self) -> None:
        """SIGKILL every process still running (a stopped one too) and reap them all."""
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.kill()

    def dump(self) -> str:
        return "\n".join(proc.dump() for proc in self.procs)
