"""A dedicated PostgreSQL cluster for the fault suite and the soak.

The fault scenarios restart and stop their database; the suite's main cluster (54329) serves
other tests at the same time, so every fault run gets a cluster of its own: its own data dir
and a free port, started and stopped with ``scripts/postgres.sh`` (``JOBS_PG_DIR``,
``JOBS_PG_PORT``), restarted with ``pg_ctl restart -m fast`` (postgres.sh has no restart) and
crashed with ``pg_ctl stop -m immediate``.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

REPO_ROOT = Path(__file__).resolve().parents[2]
POSTGRES_SH = REPO_ROOT / "scripts" / "postgres.sh"
SBIN_PATH = "/usr/sbin:/sbin"  # runuser, for a root caller (as postgres.sh does)


def free_port(span: int = 1) -> int:
    """A loopback port, and the ``span - 1`` after it, that nobody listens on now.

    Picked below the kernel's ephemeral range: the scenarios stop a server and start it again
    on the same port, and while it is down a port inside that range can become the local port
    of any client's outgoing connection, which makes the restart fail with "address in use"."""
    below = _ephemeral_range_start()
    lowest = 10_000 if below - span > 10_000 else 1_024
    for _ in range(200):
        port = random.randrange(lowest, below - span)
        if all(_port_free(port + i) for i in range(span)):
            return port
    raise RuntimeError(f"no {span} free consecutive ports found below {below}")


def _ephemeral_range_start() -> int:
    """The first port the kernel hands out to outgoing connections (Linux's default when it
    does not say)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class PgCluster:
    """One private cluster: ``data_dir`` (the server's files; ``postgres.log`` beside it)
    on ``127.0.0.1:port``, superuser ``postgres`` with trust auth."""

    data_dir: Path
    port: int

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / "postgres.log"

    def url(self, dbname: str = "jobs_engine") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def _script(self, action: str, timeout: float = 120) -> str:
        env = {**os.environ, "JOBS_PG_DIR": str(self.data_dir), "JOBS_PG_PORT": str(self.port)}
        done = subprocess.run(["bash", str(POSTGRES_SH), action], env=env, capture_output=True,
                              text=True, timeout=timeout, cwd=REPO_ROOT)
        if done.returncode not in (0, 3):  # 3: `status` of a stopped cluster
            raise RuntimeError(f"postgres.sh {action} failed ({done.returncode}):\n"
                               f"{done.stdout}{done.stderr}\n{self.log_tail()}")
        return done.stdout

    def start(self) -> None:
        """Start (initdb the first time); returns when it answers."""
        self._script("start")

    def stop(self) -> None:
        self._script("stop")

    def running(self) -> bool:
        return self._script("status").startswith("running")

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every connection is cut, the server comes back."""
        self._pg_ctl("restart", "-m", "fast", "-w", "-t", "60", "-l", str(self.log_path))

    def crash(self) -> None:
        """``pg_ctl stop -m immediate``, then start: no shutdown checkpoint, so the server
        comes back through crash recovery, without what was committed but not flushed."""
        self._pg_ctl("stop", "-m", "immediate", "-w", "-t", "60")
        self.start()

    def _pg_ctl(self, *args: str) -> None:
        command = [str(self._bindir() / "pg_ctl"), *args, "-D", str(self.data_dir)]
        cwd = None
        if os.geteuid() == 0:  # the server runs as the postgres user (see postgres.sh)
            runuser = shutil.which("runuser", path=f"{os.environ.get('PATH', '')}:{SBIN_PATH}")
            if runuser is None:
                raise RuntimeError("runuser not found: cannot run pg_ctl as postgres")
            command, cwd = [runuser, "-u", "postgres", "--", *command], "/"
        # The server inherits pg_ctl's output files: never a pipe we would wait on.
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=120, cwd=cwd)
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl {' '.join(args)} failed ({done.returncode})\n"
                               f"{self.log_tail()}")

    def _bindir(self) -> Path:
        version = (self.data_dir / "PG_VERSION").read_text().strip()
        return Path("/usr/lib/postgresql") / version / "bin"

    def log_tail(self, lines: int = 15) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def connect(self, dbname: str = "postgres", **kwargs: Any) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url(dbname), autocommit=True, connect_timeout=3, **kwargs)

    def create_database(self, name: str, template: str | None = None) -> str:
        """A fresh database (a copy of ``template``); returns its URL."""
        with self.connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            suffix = f' TEMPLATE "{template}"' if template else ""
            conn.execute(f'CREATE DATABASE "{name}"{suffix}')
        return self.url(name)

    def migrate(self, dbname: str, settings_module: str) -> None:
        """``manage.py migrate`` into ``dbname`` with the given settings."""
        env = {**os.environ, "DATABASE_URL": self.url(dbname),
               "DJANGO_SETTINGS_MODULE": settings_module}
        done = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
                              cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"migrate failed ({done.returncode}):\n{done.stdout}{done.stderr}")

    def wait_answering(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with self.connect():
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def runs_parent() -> Path:
    """Where run clusters live by default: beside the main cluster's data, outside pytest's
    temporary directory (a concurrent pytest session resets that one to mode 700, which
    the server's user could then no longer traverse)."""
    return Path(os.environ.get("HOME") or Path.home()) / ".cache" / "jobs-engine" / "pg-faults"


def run_data_dir() -> Path:
    """A data dir of this process's own (``run-<pid>/data``); stale ones are swept first."""
    parent = runs_parent()
    sweep_stale_runs(parent)
    return parent / f"run-{os.getpid()}" / "data"


def sweep_stale_runs(parent: Path) -> None:
    """Stop and delete the clusters of runs whose process is gone (a killed session)."""
    if not parent.is_dir():
        return
    for run_dir in parent.glob("run-*"):
        pid = run_dir.name.removeprefix("run-")
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        data_dir = run_dir / "data"
        if (data_dir / "PG_VERSION").exists():
            with contextlib.suppress(RuntimeError, OSError, ValueError):
                PgCluster(data_dir, 0).stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def remove_run(cluster: PgCluster) -> None:
    """Stop a run cluster and delete its directory."""
    cluster.stop()
    shutil.rmtree(cluster.data_dir.parent, ignore_errors=True)


def template_cluster(data_dir: Path, port: int | None, settings_module: str,
                     template: str = "faults_template") -> PgCluster:
    """Start a cluster in ``data_dir`` (a free port unless given) with a migrated
    ``template`` database that each run copies."""
    cluster = PgCluster(data_dir, port or free_port())
    cluster.start()
    cluster.create_database(template)
    cluster.migrate(template, settings_module)
    return cluster
