"""Limits exact under faults (issue 44): real workers, one SIGKILLed while it holds slots,
PostgreSQL restarted once, at least two minutes of enqueue and drain; judged from the
handlers' start and finish records (``limits_checker``).

Three ``manage.py run_workers`` (the third polling without LISTEN/NOTIFY) on a database of
the dedicated cluster, with the short leases of ``tests/process/harness.py``. The enqueuer
commits a round every ``ROUND_S`` for ``ENQUEUE_S`` seconds, each round a little more than
the limits let through, so both targets keep a backlog to the end:

- ``limits.conc`` (long lane, at least once): ``Concurrency(3, per=per_field("account"))``
  over 5 accounts, handlers sleeping a random 50-400 ms (15 slots, about 67 jobs/s;
  70/s offered);
- ``limits.rate`` (long lane, at least once): ``Rate(20, period_s=1, burst=5)`` for the
  whole target, handlers of 5-30 ms, every 50th raising ``RateLimited(retry_after_s=0.5)``
  at its first try (22/s offered).

At ``KILL_AT_S`` the first worker is SIGKILLed once it holds rows of ``limits.conc``
(stopped first, its started rows recorded in doubt); at ``RESTART_AT_S``, right after a
round committed, PostgreSQL is restarted (``pg_ctl restart -m fast``). Then the drain, and
the verdict: no key over 3 running, no window of 1 s with more than 25 starts (by the
handlers' clock and by the admissions'), every job finished, the killed worker's keys
running 3 again after the rescue released its rows, and the fault checker's table
(nothing lost, nothing left open) clean.

``JOBS_FAULTS_LIMITS_OFF=1`` runs the same with the targets registered without limits: the
test then asserts that the checker reports the over-run (a demonstration, not CI).
``JOBS_FAULTS_LIMITS_S`` changes ``ENQUEUE_S`` (the issue asks for two minutes at least:
the default is 120).
"""

from __future__ import annotations

import os
import time

import psycopg
import pytest

from tests.faults.checker import Delivery, read_enqueued, read_in_doubt
from tests.faults.harness import FaultRun, environ_flag
from tests.faults.limits_checker import (
    KILLED_FILE,
    OK,
    LimitsReport,
    check_limits,
    read_killed,
    read_records,
    scenario_limits,
)
from tests.faults.limits_targets import CONC, LIMITS_ENV, NAMES, RATE
from tests.faults.workload import LimitedJobs, Workload
from tests.process.harness import HEARTBEAT_S, WorkerProc

pytestmark = [pytest.mark.process, pytest.mark.faults]

LIMITS_OFF = environ_flag("JOBS_FAULTS_LIMITS_OFF")
ENQUEUE_S = float(os.environ.get("JOBS_FAULTS_LIMITS_S") or 120)
ROUND_S = 2.0
ACCOUNTS = 5
CONC_PER_S, RATE_PER_S = 70, 22
KILL_AT_S = ENQUEUE_S * 0.3
RESTART_AT_S = ENQUEUE_S * 0.6
DRAIN_S = 180.0  # after the last round


def limits_workload() -> Workload:
    rounds = int(ENQUEUE_S / ROUND_S) + 1  # the first at 0 s, the last at ENQUEUE_S
    return Workload((), 0, 0, transactions=rounds, interval_s=ROUND_S, prefix="L", limited=(
        LimitedJobs(CONC, int(CONC_PER_S * ENQUEUE_S), ACCOUNTS, (50, 400)),
        LimitedJobs(RATE, int(RATE_PER_S * ENQUEUE_S), 0, (5, 30), throttle_every=50)))


def held_rows(run: FaultRun, proc: WorkerProc) -> int:
    """Started RUNNING rows of ``limits.conc`` ``proc`` holds (0 while the database does
    not answer)."""
    try:
        with psycopg.connect(run.db_url, connect_timeout=2) as conn:
            row = conn.execute(
                "SELECT count(*) FROM jobs_engine_job WHERE status = 'RUNNING' AND target = %s "
                "AND claimed_by = %s AND started_at IS NOT NULL",
                [CONC, proc.worker_id()]).fetchone()
    except psycopg.Error:
        return 0
    return int(row[0]) if row else 0


def wait_elapsed(run: FaultRun, seconds: float) -> None:
    while run.elapsed() < seconds:
        run.note_exits()
        time.sleep(0.1)


def test_limits_hold_with_a_worker_killed_and_a_restart(fault_run: FaultRun) -> None:
    run, work = fault_run, limits_workload()
    run.jobs_env[LIMITS_ENV] = "off" if LIMITS_OFF else "on"
    origin = time.time() - run.elapsed()
    procs = run.start_workers(["run_workers", "run_workers"]) + run.start_workers(
        ["run_workers"], JOBS_NOTIFY="off")
    run.start_enqueue(work)
    enqueue_began = run.elapsed()

    wait_elapsed(run, enqueue_began + KILL_AT_S)
    deadline = time.monotonic() + 30
    while held_rows(run, procs[0]) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    run.kill(procs[0])

    wait_elapsed(run, enqueue_began + RESTART_AT_S)
    committed = run.enqueued_count()  # restart right after a round: the enqueuer sleeps
    deadline = time.monotonic() + 2 * ROUND_S + 5
    while run.enqueued_count() == committed and time.monotonic() < deadline:
        time.sleep(0.01)
    run.restart_db()

    enqueuer = run.enqueuer
    assert enqueuer is not None
    drained = run.wait_drained(list(NAMES), ENQUEUE_S + DRAIN_S,
                               also=lambda: enqueuer.poll() is not None)
    duration = run.elapsed() - enqueue_began
    time.sleep(HEARTBEAT_S + 0.5)
    run.stop_workers()

    enqueued = read_enqueued(run.enqueued_path)
    starts, finishes = read_records(run.workers.log_dir)
    limits = check_limits(enqueued, starts, finishes, scenario_limits(),
                          in_doubt=read_in_doubt(run.in_doubt_path),
                          killed=read_killed(run.base_dir / KILLED_FILE), origin=origin)
    keys = {job.id: job.key for job in enqueued}
    report = run.check(deliveries=[Delivery(f.job_id, f.target, keys.get(f.job_id, "?"), 0,
                                            f.pid, f.at) for f in finishes if f.how == OK])
    title = "limits: a worker SIGKILLed holding slots, a restart" + (
        " (LIMITS OFF)" if LIMITS_OFF else "")
    summary = (run.summary(report, title) + "\n--- limits ---\n"
               + f"enqueue + drain {duration:.1f}s (enqueuing {ENQUEUE_S:.0f}s), drained: "
               + f"{drained}, enqueuer exit {enqueuer.returncode}\n" + limits.table())
    (run.base_dir / "summary.txt").write_text(summary + "\n")
    print("\n" + summary, flush=True)

    if LIMITS_OFF:
        assert_over_run_caught(limits, summary)
        return
    problems = [f"checker: {name}={count}" for name, count in report.failures.items()]
    problems += [f"limits: {name}={count}" for name, count in limits.failures.items()]
    problems += [f"worker {name}: {how}" for name, how in run.died_on_their_own().items()]
    problems += [f"scenario: {what} found no work left" for what in run.late_faults()]
    if enqueuer.returncode != 0 or len(enqueued) != work.total:
        problems.append(f"enqueuer exit {enqueuer.returncode}, {len(enqueued)} of "
                        f"{work.total} jobs enqueued")
    if not drained:
        problems.append("the run did not drain")
    if duration < ENQUEUE_S:
        problems.append(f"enqueue and drain took {duration:.0f}s, under {ENQUEUE_S:.0f}s")
    if not any(target == CONC for target, _ in limits.held):
        problems.append("the killed worker held no slot of limits.conc")
    if not limits.by_start.get(RATE) or limits.by_start[RATE].starts < work.total // 10:
        problems.append("too few starts of limits.rate")
    if problems:
        pytest.fail("limits broken:\n  " + "\n  ".join(problems) + "\n" + summary,
                    pytrace=False)


def assert_over_run_caught(limits: LimitsReport, summary: str) -> None:
    """Without limits the same run must fail the checker's limit rules."""
    assert limits.over_concurrency > 0, "no over-run of the slots caught\n" + summary
    assert limits.over_rate_by_start > 0 and limits.over_rate_by_admission > 0, \
        "no over-run of the rate caught\n" + summary
