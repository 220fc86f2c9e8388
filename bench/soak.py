"""Soak: a million jobs through worker processes that are killed, stopped and cut off from
their database, judged by the fault suite's checker (not part of pytest or CI).

    .venv/bin/python bench/soak.py                          # 1,000,000 jobs, 8 workers
    .venv/bin/python bench/soak.py --jobs 20000 --workers 4 # a small run

It needs no DATABASE_URL: like ``tests/faults`` it starts a PostgreSQL cluster of its own
(``~/.cache/jobs-engine/pg-faults/run-<pid>``, a free port; ``--keep`` keeps it running),
migrates it, and drives ``manage.py run_workers`` processes through ``tests.faults.harness``
(the suite's short leases; the processes are ``jobs_engine.testing``'s). While the jobs are
enqueued and drained, every few seconds a random worker is SIGKILLed (and a new one started
in its slot) or SIGSTOPped for up to twice the lease (then SIGCONT); once, when half the jobs
are delivered, PostgreSQL is restarted. At the end it prints the checker's table, the drain
rate over time, the resident memory (VmRSS) of each worker over time and the fault counts;
the run's files (delivery logs, enqueued set, worker output, ``samples.json``) stay in
``--run-dir``.
Exit status 1 when the checker fails or a worker died on its own.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from jobs_engine.testing import ManagedProcess  # noqa: E402
from tests.faults.checker import Report  # noqa: E402
from tests.faults.harness import (  # noqa: E402
    SETTINGS_MODULE,
    TEMPLATE_DB,
    FaultRun,
    has_started,
    rss_kib,
)
from tests.faults.pg import PgCluster, remove_run, run_data_dir, template_cluster  # noqa: E402
from tests.faults.targets import (  # noqa: E402
    FAST_AT_LEAST_ONCE,
    FAST_AT_MOST_ONCE,
    LONG_AT_LEAST_ONCE,
    LONG_AT_MOST_ONCE,
    NAMES,
)
from tests.faults.workload import Workload  # noqa: E402
from tests.process.harness import LEASE_S  # noqa: E402

JOBS_PER_TRANSACTION = 20_000
MAX_TABLE_ROWS = 40


@dataclass
class Slot:
    """One worker place: the process now in it, and every process it had."""

    number: int
    env: dict[str, str]
    procs: list[ManagedProcess] = field(default_factory=list)
    stopped_until: float = 0.0  # monotonic time of the SIGCONT, while SIGSTOPped

    @property
    def proc(self) -> ManagedProcess:
        return self.procs[-1]


@dataclass
class Sample:
    at: float
    delivered: int
    open_rows: int | None
    rss_mib: list[float | None]
    pids: list[int]


@dataclass
class Counts:
    kills: int = 0
    stops: int = 0
    restarts: int = 0
    db_restarts: int = 0


def build_workload(jobs: int, keys: int, long_share: float) -> Workload:
    """``jobs`` jobs: ``long_share`` of them long-lane, the rest over ``keys`` keys."""
    long_jobs = int(jobs * long_share)
    versions = max(1, (jobs - long_jobs) // keys)
    transactions = max(1, math.ceil(jobs / JOBS_PER_TRANSACTION))
    return Workload((FAST_AT_MOST_ONCE, FAST_AT_LEAST_ONCE), keys, versions,
                    (LONG_AT_MOST_ONCE, LONG_AT_LEAST_ONCE), long_jobs,
                    transactions=min(transactions, versions), prefix="s")


class Soak:
    """The soak's loop: faults at random, one database restart, samples, the verdict."""

    def __init__(self, args: argparse.Namespace, run: FaultRun, work: Workload) -> None:
        self.args = args
        self.run = run
        self.work = work
        self.rng = random.Random(args.seed)
        self.slots = [Slot(i, {"JOBS_NOTIFY": "off"} if i >= args.workers - args.polling else {})
                      for i in range(args.workers)]
        self.samples: list[Sample] = []
        self.counts = Counts()
        self.db_restarted = False

    def start(self) -> None:
        for slot in self.slots:
            slot.procs.append(self.run.start_workers(["run_workers"], **slot.env)[0])
        self.run.start_enqueue(self.work)

    def loop(self) -> bool:
        """Faults and samples until drained; False on timeout or with no worker left."""
        deadline = time.monotonic() + self.args.timeout
        next_fault = time.monotonic() + self.fault_gap()
        next_sample = 0.0
        while True:
            now = time.monotonic()
            self.resume_due(now)
            if now >= next_sample:
                self.sample()
                next_sample = now + self.args.sample_s
                if self.drained():
                    return True
            if now >= next_fault:
                self.fault()
                next_fault = time.monotonic() + self.fault_gap()
            self.maybe_restart_db()
            self.run.note_exits()
            if not self.run.alive():
                self.run.log("no worker alive")
                return False
            if now > deadline:
                self.run.log(f"timed out after {self.args.timeout:.0f}s")
                return False
            time.sleep(0.1)

    def fault_gap(self) -> float:
        return self.rng.uniform(0.5, 1.5) * self.args.fault_every

    def drained(self) -> bool:
        enqueuer = self.run.enqueuer
        return (enqueuer is not None and enqueuer.poll() is not None
                and self.samples[-1].open_rows == 0)

    def sample(self) -> None:
        procs = [slot.proc for slot in self.slots]
        rss = [rss_kib(p.pid) if p.alive() else None for p in procs]
        self.samples.append(Sample(round(self.run.elapsed(), 1), self.run.progress(),
                                   self.run.open_rows(NAMES),
                                   [round(r / 1024, 1) if r else None for r in rss],
                                   [p.pid for p in procs]))

    def resume_due(self, now: float) -> None:
        for slot in self.slots:
            if slot.stopped_until and now >= slot.stopped_until:
                slot.stopped_until = 0.0
                self.run.resume(slot.proc)

    def fault(self) -> None:
        """SIGKILL (and replace) or SIGSTOP a random running worker."""
        ready = [s for s in self.slots if not s.stopped_until and has_started(s.proc)]
        if not ready:
            return
        slot = self.rng.choice(ready)
        if self.rng.random() < 0.5:
            self.run.kill(slot.proc)
            self.counts.kills += 1
            slot.procs.append(self.run.workers.start("run_workers",
                                                     **{**self.run.jobs_env, **slot.env}))
            self.counts.restarts += 1
            self.run.log(f"started {slot.proc.name} (pid {slot.proc.pid}) in slot {slot.number}")
        else:
            seconds = self.rng.uniform(0.5, 2.0) * LEASE_S
            self.run.pause(slot.proc, seconds)
            slot.stopped_until = time.monotonic() + seconds
            self.counts.stops += 1

    def maybe_restart_db(self) -> None:
        """Once: a PostgreSQL restart when half the jobs are delivered and all are enqueued
        (the enqueuer does not retry a transaction cut by the restart)."""
        enqueuer = self.run.enqueuer
        if self.db_restarted or enqueuer is None or enqueuer.poll() is None:
            return
        if self.run.progress() >= self.work.total // 2:
            self.db_restarted = True
            self.run.restart_db()
            self.counts.db_restarts += 1

    def finish(self) -> Report:
        for slot in self.slots:
            if slot.stopped_until:
                self.run.resume(slot.proc)
                slot.stopped_until = 0.0
        self.run.stop_workers(timeout=60)
        self.sample()
        return self.run.check()


# -- tables -------------------------------------------------------------------------------------


def thinned(samples: list[Sample]) -> list[Sample]:
    """At most MAX_TABLE_ROWS samples, evenly spread, the last one kept."""
    if len(samples) <= MAX_TABLE_ROWS:
        return samples
    step = math.ceil(len(samples) / MAX_TABLE_ROWS)
    return samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else [])


def rate_table(samples: list[Sample]) -> str:
    lines = [f"{'t (s)':>8} {'delivered':>10} {'jobs/s':>8} {'open rows':>10}"]
    previous: Sample | None = None
    for sample in thinned(samples):
        rate = ((sample.delivered - previous.delivered) / (sample.at - previous.at)
                if previous and sample.at > previous.at else 0.0)
        open_rows = "db down" if sample.open_rows is None else str(sample.open_rows)
        lines.append(f"{sample.at:>8.1f} {sample.delivered:>10} {rate:>8.0f} {open_rows:>10}")
        previous = sample
    return "\n".join(lines)


def rss_table(samples: list[Sample], slots: list[Slot]) -> str:
    """RSS (MiB) of each slot's current process; ``*`` marks a new process in the slot."""
    header = f"{'t (s)':>8} " + " ".join(f"{'w' + str(s.number):>8}" for s in slots)
    lines = [header]
    last_pids: list[int] = []
    for sample in thinned(samples):
        cells = []
        for i, rss in enumerate(sample.rss_mib):
            mark = "*" if last_pids and last_pids[i] != sample.pids[i] else " "
            cells.append(f"{'-' if rss is None else f'{rss:.1f}'}{mark}".rjust(8))
        last_pids = sample.pids
        lines.append(f"{sample.at:>8.1f} " + " ".join(cells))
    return "\n".join(lines)


def process_table(run: FaultRun, slots: list[Slot], samples: list[Sample]) -> str:
    lines = [f"{'slot':>4} {'process':<16} {'pid':>8} {'RSS first':>10} {'RSS max':>8} "
             f"{'RSS last':>9}  how it ended"]
    for slot in slots:
        for proc in slot.procs:
            seen = [s.rss_mib[slot.number] for s in samples
                    if s.pids[slot.number] == proc.pid and s.rss_mib[slot.number]]
            first, peak, last = ((f"{seen[0]:.1f}", f"{max(seen):.1f}", f"{seen[-1]:.1f}")
                                 if seen else ("-", "-", "-"))
            ended = run.exits.get(proc.pid)
            lines.append(f"{slot.number:>4} {proc.name:<16} {proc.pid:>8} {first:>10} {peak:>8} "
                         f"{last:>9}  {ended.describe() if ended else 'running'}")
    return "\n".join(lines)


# -- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--polling", type=int, default=1,
                        help="workers that poll without LISTEN/NOTIFY (JOBS_NOTIFY=off)")
    parser.add_argument("--keys", type=int, default=0,
                        help="fast-lane keys (default: jobs / 500, at least 200)")
    parser.add_argument("--long-share", type=float, default=0.01,
                        help="share of long-lane jobs (sleeping 50 ms each)")
    parser.add_argument("--fault-every", type=float, default=4.0,
                        help="mean seconds between worker faults")
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=6 * 3600.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--run-dir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the PostgreSQL cluster")
    args = parser.parse_args(argv)
    args.keys = args.keys or max(200, args.jobs // 500)
    args.seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    args.polling = min(args.polling, args.workers)
    return args


def report(soak: Soak, verdict: Report, drained: bool) -> str:
    died = soak.run.died_on_their_own()
    first = soak.samples[0].at if soak.samples else 0.0
    last = soak.samples[-1] if soak.samples else None
    overall = (last.delivered / (last.at - first)) if last and last.at > first else 0.0
    parts = [
        f"===== soak: {soak.work.total} jobs, {soak.args.workers} workers "
        f"({soak.args.polling} polling), seed {soak.args.seed} =====",
        f"run dir: {soak.run.base_dir}",
        f"drained: {drained}; elapsed {soak.run.elapsed():.0f}s; mean {overall:.0f} "
        "deliveries/s",
        f"faults: {asdict(soak.counts)}",
        f"workers that died on their own: {len(died)}",
        *[f"  {name}: {how}" for name, how in died.items()],
        "--- checker ---", verdict.table(),
        "--- drain rate over time ---", rate_table(soak.samples),
        "--- worker RSS (MiB) over time (* = a new process in the slot) ---",
        rss_table(soak.samples, soak.slots),
        "--- worker processes ---", process_table(soak.run, soak.slots, soak.samples),
    ]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = args.run_dir or Path(tempfile.mkdtemp(prefix="jobs-soak-"))
    base.mkdir(parents=True, exist_ok=True)
    work = build_workload(args.jobs, args.keys, args.long_share)
    pg: PgCluster = template_cluster(run_data_dir(), None, SETTINGS_MODULE, TEMPLATE_DB)
    run = FaultRun(base, pg, pg.create_database("soak", TEMPLATE_DB))
    soak = Soak(args, run, work)
    try:
        soak.start()
        drained = soak.loop()
        verdict = soak.finish()
        (base / "samples.json").write_text(json.dumps([asdict(s) for s in soak.samples]) + "\n")
        text = report(soak, verdict, drained)
        (base / "soak.txt").write_text(text + "\n")
        print(text)
    finally:
        run.kill_all()
        if args.keep:
            print(f"PostgreSQL kept running: {run.db_url} (data {pg.data_dir})")
        else:
            remove_run(pg)
    return 0 if verdict.ok and drained and not run.died_on_their_own() else 1


if __name__ == "__main__":
    sys.exit(main())
