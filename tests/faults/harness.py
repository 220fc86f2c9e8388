"""One fault run: a database of the dedicated cluster, real worker processes, an enqueuer
process, the faults done to them, the wait for the drain and the checker's verdict.

Used by ``tests/faults/test_faults.py`` and by ``bench/soak.py``. Workers are
``manage.py run_workers`` (or another lane command) started through
``tests.process.harness.WorkerCluster`` (a ``jobs_engine.testing.ProcessGroup``) with
``DJANGO_SETTINGS_MODULE=tests.faults.settings`` and the short leases of
``tests.process.harness.DEFAULT_JOBS_ENV``; this module adds what only a fault run needs: the
delivery logs, the faults and their bookkeeping, the drain and the verdict. Everything a run
writes stays in its directory: ``enqueued.txt``, ``deliveries/<pid>.log``, ``in_doubt.txt``,
``killed.txt`` (pids SIGKILLed, when they were stopped), each process's stdout and stderr,
and ``summary.txt`` (timeline, worker exits, the checker's
table, stderr tails).

Over 400 lines because ``FaultRun`` is one object on purpose: its faults, waits and verdict
share the run's state (the timeline, what was done to which pid, the exits noticed), and a
summary must see all of it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import psycopg

from jobs_engine.testing import ManagedProcess, wait_until
from tests.faults.checker import (
    DELIVERIES_DIR,
    ENQUEUED_FILE,
    IN_DOUBT_FILE,
    Delivery,
    Report,
    check,
    read_deliveries,
    read_enqueued,
    read_in_doubt,
    read_rows,
)
from tests.faults.limits_checker import KILLED_FILE
from tests.faults.pg import REPO_ROOT, PgCluster
from tests.faults.targets import LOG_DIR_ENV
from tests.faults.workload import Workload
from tests.process.harness import WorkerCluster, WorkerProc

SETTINGS_MODULE = "tests.faults.settings"
TEMPLATE_DB = "faults_template"

# The last line of a traceback: "psycopg.OperationalError: consuming input failed: ...".
_CAUSE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b.*)$", re.MULTILINE)


KILLED, STOPPED, DIED = "killed", "stopped", "died"


@dataclass(frozen=True)
class Exit:
    """How a worker process ended: killed by the run, stopped by its SIGTERM, or died."""

    at: float  # seconds into the run when it was noticed
    code: int
    how: str
    cause: str = ""

    @property
    def unexpected(self) -> bool:
        return self.how == DIED or (self.how == STOPPED and self.code != 0)

    def describe(self) -> str:
        if self.how == KILLED:
            text = "killed by the run (SIGKILL)"
        elif self.how == STOPPED:
            text = f"exited {self.code} after SIGTERM"
        else:
            text = f"DIED on its own, exit {self.code}" + (f": {self.cause}" if self.cause else "")
        return f"{text} (at {self.at:.1f}s)"


class FaultWorkers(WorkerCluster):
    """``WorkerCluster`` with the fault suite's settings and delivery-log directory."""

    settings_module = SETTINGS_MODULE

    @property
    def log_dir(self) -> Path:
        return self.base_dir / DELIVERIES_DIR

    def env(self, **jobs_env: str) -> dict[str, str]:
        return {**super().env(**jobs_env), LOG_DIR_ENV: str(self.log_dir)}


class ProgressCounter:
    """Delivery lines written so far, read incrementally (a million-line soak reads each
    byte once)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._offsets: dict[Path, int] = {}
        self._count = 0

    def __call__(self) -> int:
        for path in self.log_dir.glob("*.log"):
            start = self._offsets.get(path, 0)
            size = path.stat().st_size
            if size <= start:
                continue
            with open(path, "rb") as fh:
                fh.seek(start)
                data = fh.read(size - start)
            complete = data.rfind(b"\n") + 1
            self._count += data.count(b"\n", 0, complete)
            self._offsets[path] = start + complete
        return self._count


def has_started(proc: ManagedProcess) -> bool:
    """Whether ``proc`` runs and printed its worker id yet (never waits)."""
    return proc.alive() and proc.printed_id() is not None


def stopped_state(pid: int) -> bool:
    """Whether the kernel reports ``pid`` stopped (state T)."""
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] == "T"
    return False


def death_cause(stderr: str) -> str:
    """The last exception line a process printed (why it exited), or ''."""
    found = _CAUSE.findall(stderr)
    return found[-1].strip() if found else ""


def stderr_tail(proc: ManagedProcess, lines: int = 20) -> str:
    """The end of a worker's stderr without the per-job ``job run`` lines."""
    kept = [line for line in proc.stderr().splitlines() if "job run " not in line]
    return "\n".join(kept[-lines:])


class FaultRun:
    """Workers, enqueuer and faults of one run, against one database of a ``PgCluster``."""

    def __init__(self, base_dir: Path, pg: PgCluster, db_url: str,
                 jobs_env: dict[str, str] | None = None) -> None:
        self.base_dir = base_dir
        self.pg = pg
        self.db_url = db_url
        self.jobs_env = dict(jobs_env or {})
        self.workers = FaultWorkers(base_dir, db_url)
        self.workers.log_dir.mkdir(parents=True, exist_ok=True)
        self.progress = ProgressCounter(self.workers.log_dir)
        self.started = time.monotonic()
        self.timeline: list[str] = []
        self.faulted: dict[int, str] = {}  # pid -> what we did to it
        self.stopped_at: dict[int, float] = {}  # pid -> when its SIGSTOP took (unix time)
        self.exits: dict[int, Exit] = {}  # pid -> how it exited, once noticed
        self.stop_requested: set[int] = set()
        self.enqueuer: subprocess.Popen[bytes] | None = None
        self.targets: list[str] = []  # the workload's, once enqueuing started
        self.fault_points: list[tuple[str, int | None]] = []  # fault, rows open before it

    # -- files and time ---------------------------------------------------------------------

    @property
    def enqueued_path(self) -> Path:
        return self.base_dir / ENQUEUED_FILE

    @property
    def in_doubt_path(self) -> Path:
        return self.base_dir / IN_DOUBT_FILE

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def log(self, text: str) -> None:
        """Add ``text`` to the run's timeline (printed as it happens)."""
        line = f"{self.elapsed():7.1f}s  {text}"
        self.timeline.append(line)
        print(f"[faults] {line}", flush=True)

    # -- processes ----------------------------------------------------------------------------

    def start_workers(self, commands: Iterable[str], timeout: float = 60, **jobs_env: str
                      ) -> list[WorkerProc]:
        """Start one worker per command (``jobs_env`` on top of the run's) and wait until
        each printed its worker id."""
        procs = [self.workers.start(command, **{**self.jobs_env, **jobs_env})
                 for command in commands]
        for proc in procs:
            proc.worker_id(timeout=timeout)
        extra = " ".join(f"{k}={v}" for k, v in jobs_env.items())
        self.log("started " + ", ".join(f"{p.name} (pid {p.pid})" for p in procs)
                 + (f" with {extra}" if extra else ""))
        return procs

    def alive(self) -> list[WorkerProc]:
        return [p for p in self.workers.workers if p.alive()]

    def note_exits(self) -> None:
        """Log every worker that exited since the last look, and why."""
        for proc in self.workers.procs:
            code = proc.popen.poll()
            if code is None or proc.pid in self.exits:
                continue
            if self.faulted.get(proc.pid) == "SIGKILL":
                how, cause = KILLED, ""
            elif proc.pid in self.stop_requested:
                how, cause = STOPPED, ""
            else:
                how, cause = DIED, death_cause(proc.stderr())
            self.exits[proc.pid] = Exit(self.elapsed(), code, how, cause)
            self.log(f"{proc.name} (pid {proc.pid}) {self.exits[proc.pid].describe()}")

    def died_on_their_own(self) -> dict[str, str]:
        """Workers that exited without being killed or asked to stop, or exited non-zero
        after SIGTERM: ``name (pid)`` -> how."""
        self.note_exits()
        return {f"{proc.name} (pid {proc.pid})": found.describe()
                for proc in self.workers.procs
                if (found := self.exits.get(proc.pid)) is not None and found.unexpected}

    def enqueue(self, workload: Workload, timeout: float = 600) -> int:
        """Enqueue the workload in the enqueuer process and wait for it; returns the jobs."""
        self.start_enqueue(workload)
        assert self.enqueuer is not None
        code = self.enqueuer.wait(timeout=timeout)
        if code != 0:
            raise AssertionError(f"the enqueuer failed ({code}):\n{self.enqueuer_output()}")
        count = self.enqueued_count()
        self.log(f"enqueued {count} jobs")
        return count

    def start_enqueue(self, workload: Workload) -> None:
        """Start the enqueuer in the background (rounds at ``workload.interval_s``)."""
        self.targets = workload.targets
        out = self.base_dir / "enqueuer.out"
        with open(out, "wb") as fh:
            self.enqueuer = subprocess.Popen(
                [sys.executable, "-m", "tests.faults.workload", "--spec", workload.to_json(),
                 "--out", str(self.enqueued_path)],
                cwd=REPO_ROOT, env=self.workers.env(**self.jobs_env), stdout=fh,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.log(f"enqueuing {workload.total} jobs ({workload.keys} keys x {workload.versions} "
                 f"versions, {workload.long_jobs} long) in {workload.transactions} transactions")

    def enqueuer_output(self) -> str:
        path = self.base_dir / "enqueuer.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def enqueued_count(self) -> int:
        if not self.enqueued_path.exists():
            return 0
        with open(self.enqueued_path, "rb") as fh:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))

    # -- waiting -------------------------------------------------------------------------------

    def wait_delivered(self, count: int, timeout: float) -> bool:
        """Until ``count`` deliveries are logged; False on timeout or when every worker is
        gone (a run must go on to its verdict, not hang)."""
        deadline = time.monotonic() + timeout
        while self.progress() < count:
            self.note_exits()
            if not self.alive():
                self.log(f"no worker alive; {self.progress()} of the {count} deliveries awaited")
                return False
            if time.monotonic() > deadline:
                self.log(f"timed out after {timeout:.0f}s at {self.progress()} of the {count} "
                         "deliveries awaited")
                return False
            time.sleep(0.05)
        return True

    def open_rows(self, targets: Iterable[str]) -> int | None:
        """PENDING or RUNNING rows of ``targets``; None while the database does not answer."""
        try:
            with psycopg.connect(self.db_url, connect_timeout=2) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM jobs_engine_job WHERE status IN ('PENDING', 'RUNNING') "
                    "AND target = ANY(%s)", [list(targets)]).fetchone()
        except psycopg.Error:
            return None
        return int(row[0]) if row else None

    def wait_drained(self, targets: Iterable[str], timeout: float,
                     also: Callable[[], bool] = lambda: True) -> bool:
        """Until no row of ``targets`` is PENDING or RUNNING (and ``also()``); False on
        timeout or when every worker is gone."""
        names = list(targets)
        deadline = time.monotonic() + timeout
        while True:
            self.note_exits()
            left = self.open_rows(names)
            if left == 0 and also():
                logged = self.progress()
                self.log("drained: no row PENDING or RUNNING"
                         + (f"; {logged} deliveries logged" if logged else ""))
                return True
            if not self.alive():
                self.log(f"no worker alive; {left} rows PENDING/RUNNING")
                return False
            if time.monotonic() > deadline:
                self.log(f"drain timed out after {timeout:.0f}s; {left} rows PENDING/RUNNING")
                return False
            time.sleep(0.2)

    # -- faults -----------------------------------------------------------------------------------

    def _fault(self, what: str) -> None:
        """Log a fault about to happen with the work still open, which ``late_faults``
        holds against: a fault after the drain would prove nothing."""
        left = self.open_rows(self.targets) if self.targets else None
        self.fault_points.append((what, left))
        self.log(f"{what}; {self.progress()} delivered, "
                 f"{'?' if left is None else left} rows PENDING/RUNNING")

    def late_faults(self) -> list[str]:
        """Faults that found no work open (the scenario did not test what it says)."""
        return [what for what, left in self.fault_points if left == 0]

    def restart_db(self) -> None:
        self._fault("PostgreSQL restart (pg_ctl restart -m fast)")
        began = time.monotonic()
        self.pg.restart()
        self.log(f"PostgreSQL back after {time.monotonic() - began:.1f}s")

    def crash_db(self) -> None:
        self._fault("PostgreSQL crash (pg_ctl stop -m immediate, crash recovery on start)")
        began = time.monotonic()
        self.pg.crash()
        self.log(f"PostgreSQL recovered after {time.monotonic() - began:.1f}s")

    def stop_db_for(self, seconds: float) -> None:
        """The database unreachable for ``seconds`` (stopped, then started again)."""
        self._fault(f"PostgreSQL stop for {seconds:.0f}s")
        self.pg.stop()
        time.sleep(seconds)
        began = time.monotonic()
        self.pg.start()
        self.log(f"PostgreSQL started again ({time.monotonic() - began:.1f}s to answer)")

    def _stop_for_fault(self, proc: ManagedProcess, what: str) -> bool:
        """SIGSTOP ``proc`` and record its rows in hand as in doubt; False (and nothing
        done) when it is not running any more."""
        if not proc.alive():
            self.log(f"{what} {proc.name} (pid {proc.pid}) skipped: it is not running")
            return False
        self._fault(f"{what} {proc.name} (pid {proc.pid})")
        proc.send(signal.SIGSTOP)
        wait_until(lambda: stopped_state(proc.pid), 5, f"{proc.name} to stop", interval=0.01)
        self.stopped_at[proc.pid] = time.time()
        self.wait_statements_ended(proc)
        in_doubt = self.record_in_doubt(proc)
        self.log(f"{proc.name} stopped; {in_doubt} rows in hand recorded in doubt")
        return True

    def wait_statements_ended(self, proc: ManagedProcess, timeout: float = 10) -> None:
        """Wait until no statement ``proc`` (stopped) sent is still running in the server.

        An in-flight mark or a claim it committed just before the stop is in hand only once
        the server has run it; on a loaded machine that takes longer than any fixed pause."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(self.db_url, connect_timeout=3) as conn:
                    row = conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                        "AND state = 'active'", [proc.app_name]).fetchone()
            except psycopg.Error as exc:
                self.log(f"could not see the statements of {proc.name}: {exc}")
                return
            if row is not None and row[0] == 0:
                return
            time.sleep(0.01)
        self.log(f"{proc.name} still had a statement running {timeout:.0f}s after its stop")

    def kill(self, proc: ManagedProcess) -> None:
        """SIGKILL ``proc`` mid-work: stopped first, its rows in hand recorded as in doubt,
        then killed."""
        if not self._stop_for_fault(proc, "SIGKILL"):
            return
        self.faulted[proc.pid] = "SIGKILL"
        proc.send(signal.SIGKILL)
        with open(self.base_dir / KILLED_FILE, "a") as fh:  # for the limits checker
            fh.write(f"{proc.pid} {self.stopped_at[proc.pid]:.6f}\n")
        proc.wait_exit(10)
        self.note_exits()

    def stall(self, proc: ManagedProcess, seconds: float) -> None:
        """SIGSTOP ``proc`` for ``seconds`` (past its lease), then SIGCONT."""
        self.pause(proc, seconds)
        time.sleep(seconds)
        self.resume(proc)

    def pause(self, proc: ManagedProcess, planned_s: float) -> None:
        """SIGSTOP ``proc`` for about ``planned_s`` (``resume`` ends it)."""
        if self._stop_for_fault(proc, f"SIGSTOP for {planned_s:.1f}s"):
            self.faulted[proc.pid] = "SIGSTOP"

    def resume(self, proc: ManagedProcess) -> None:
        if self.faulted.get(proc.pid) != "SIGSTOP" or not proc.alive():
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send(signal.SIGCONT)
        self.log(f"SIGCONT {proc.name} (pid {proc.pid})")

    def record_in_doubt(self, proc: ManagedProcess) -> int:
        """Append the rows ``proc`` (stopped) has in hand to the in-doubt file: its
        partitions' in-flight marks and its started long-lane rows. A takeover or a lease
        rescue may close those DEAD (at-most-once)."""
        worker_id = proc.worker_id()
        try:
            with psycopg.connect(self.db_url, connect_timeout=3) as conn:
                marks = conn.execute(
                    "SELECT ids FROM jobs_engine_inflight WHERE owner = %s",
                    [worker_id]).fetchall()
                started = conn.execute(
                    "SELECT id FROM jobs_engine_job WHERE status = 'RUNNING' AND claimed_by = %s "
                    "AND started_at IS NOT NULL", [worker_id]).fetchall()
        except psycopg.Error as exc:
            self.log(f"could not record the rows in hand of {proc.name}: {exc}")
            return 0
        ids = [int(i) for (listed,) in marks for i in (listed or [])] + [i for (i,) in started]
        with open(self.in_doubt_path, "a") as fh:
            fh.writelines(f"{job_id} {proc.pid}\n" for job_id in ids)
        return len(ids)

    # -- the end ---------------------------------------------------------------------------------

    def stop_workers(self, timeout: float = 30) -> None:
        """SIGCONT, then SIGTERM every live worker and wait; SIGKILL what does not stop."""
        self.note_exits()
        for proc in self.alive():
            with contextlib.suppress(ProcessLookupError):
                proc.send(signal.SIGCONT)
                self.stop_requested.add(proc.pid)
                proc.send(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.workers.procs:
            try:
                proc.wait_exit(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.log(f"{proc.name} (pid {proc.pid}) did not stop within {timeout:.0f}s of "
                         "SIGTERM: SIGKILL")
                proc.kill()
        self.note_exits()
        self.end_enqueuer()

    def kill_all(self) -> None:
        self.workers.kill_all()
        self.end_enqueuer()

    def end_enqueuer(self) -> None:
        """SIGKILL the enqueuer if it still runs (a run that ends early) and reap it."""
        if self.enqueuer is not None and self.enqueuer.poll() is None:
            self.enqueuer.kill()
            self.enqueuer.wait(timeout=10)

    def check(self, in_doubt_reasons: Iterable[str] = (),
              deliveries: list[Delivery] | None = None) -> Report:
        """The checker's verdict on this run (the database must be up); ``deliveries``
        replace the handlers' logs (records read back from Kafka)."""
        self.pg.wait_answering()
        found = read_deliveries(self.workers.log_dir) if deliveries is None else deliveries
        return check(read_enqueued(self.enqueued_path), found, read_rows(self.db_url),
                     read_in_doubt(self.in_doubt_path), in_doubt_reasons)

    def summary(self, report: Report, title: str) -> str:
        """Timeline, worker exits, the checker's table and stderr tails, also written to
        ``summary.txt``."""
        died = self.died_on_their_own()
        parts = [f"===== fault run: {title} ({self.base_dir}) =====", "--- timeline ---",
                 *self.timeline, "--- workers ---"]
        for proc in self.workers.workers:
            found = self.exits.get(proc.pid)
            parts.append(f"{proc.name} pid {proc.pid}: "
                         + (found.describe() if found else "still running"))
        parts.append(f"workers that died on their own: {len(died)}")
        parts += ["--- checker ---", report.table()]
        for proc in self.workers.procs:
            if f"{proc.name} (pid {proc.pid})" in died or not report.ok:
                parts += [f"--- stderr tail of {proc.name} (pid {proc.pid}) ---",
                          stderr_tail(proc)]
        text = "\n".join(parts)
        (self.base_dir / "summary.txt").write_text(text + "\n")
        return text


def rss_kib(pid: int) -> int | None:
    """Resident memory of ``pid`` in KiB (``VmRSS`` of /proc/<pid>/status), None if gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def environ_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "on", "yes"}
