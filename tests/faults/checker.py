"""The fault suite's judge: the enqueued set, the deliveries and the tables, held against
the engine's promises.

Inputs:

- the **enqueued set**: ``<id> <target> <key> <version> <mode> <lane>`` per committed job
  (``workload.py`` writes it);
- the **deliveries**: the handlers' ``deliver ...`` lines (``targets.py``), or records read
  back from a Kafka topic; ``seq`` orders the deliveries of one key (time, or offset);
- the **rows** left in ``jobs_engine_job``;
- the rows **in doubt**: at-most-once rows a faulted worker (SIGKILLed, or SIGSTOPped past
  its lease) had in flight or had started, mapped to that worker's pid. Going DEAD is what
  at-most-once promises for them (docs/design.md#delivery-modes-and-crashes). With
  ``in_doubt_reasons``, an at-most-once row DEAD with such a ``last_error`` is in doubt too
  (a Kafka send whose outcome is unknown).

What must be 0: **lost** (never delivered, and gone or still PENDING/RUNNING), **at-most-once
delivered twice**, **reordered** (per fast-lane target and key, the first delivery of a
version before the first delivery of a lower one), **wrongly DEAD** (DEAD though not in
doubt: delivered, or never started), **delivered but not recorded** (delivered, yet the row
is still PENDING/RUNNING; a delivered row must be deleted, or DONE), **unknown deliveries**
(a delivery of no enqueued job, or not matching its job). At-least-once duplicates are
counted and allowed.

``python -m tests.faults.checker --run-dir DIR --db-url URL`` prints the table of a run
(exit 1 when it fails).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

AT_MOST_ONCE = "at_most_once"
AT_LEAST_ONCE = "at_least_once"
FAST = "fast"
OPEN_STATUSES = frozenset({"PENDING", "RUNNING"})
RECORDED_STATUSES = frozenset({"DONE"})  # or no row at all: finished rows are deleted today
EXAMPLES = 8

ENQUEUED_FILE = "enqueued.txt"
DELIVERIES_DIR = "deliveries"
IN_DOUBT_FILE = "in_doubt.txt"


@dataclass(frozen=True, slots=True)
class Enqueued:
    id: int
    target: str
    key: str | None
    version: int
    mode: str
    lane: str


@dataclass(frozen=True, slots=True)
class Delivery:
    job_id: int
    target: str
    key: str | None
    version: int
    pid: int
    seq: float  # orders the deliveries of one key: handler time, or Kafka offset


@dataclass(frozen=True, slots=True)
class Row:
    id: int
    status: str
    attempts: int
    last_error: str


@dataclass
class Report:
    """Counts of one run, and the first few job ids of each kind."""

    enqueued: int = 0
    deliveries: int = 0
    delivered_jobs: int = 0
    lost: int = 0
    lost_left_open: int = 0
    at_most_once_twice: int = 0
    at_least_once_duplicates: int = 0
    at_least_once_extra_deliveries: int = 0
    reordered: int = 0
    wrongly_dead: int = 0
    dead_in_doubt: int = 0
    late_in_doubt: int = 0  # delivered by a stopped worker that had it in hand (any order)
    not_recorded: int = 0
    recorded: int = 0
    unknown_deliveries: int = 0
    stale_resends: int = 0
    rows_left: dict[str, int] = field(default_factory=dict)
    other_rows: int = 0
    examples: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))

    MUST_BE_ZERO = ("lost", "at_most_once_twice", "reordered", "wrongly_dead", "not_recorded",
                    "unknown_deliveries")

    @property
    def failures(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.MUST_BE_ZERO if getattr(self, name)}

    @property
    def ok(self) -> bool:
        return not self.failures

    def note(self, kind: str, job_id: int) -> None:
        if len(self.examples[kind]) < EXAMPLES:
            self.examples[kind].append(job_id)

    def table(self) -> str:
        """The table a run prints: every count, what it must be, example job ids."""
        lines = [f"{'check':<44}{'count':>9}  {'must be':<9}examples (job ids)"]

        def line(label: str, count: int, rule: str = "", kind: str = "") -> None:
            ids = ", ".join(map(str, self.examples.get(kind, []))) if kind else ""
            lines.append(f"{label:<44}{count:>9}  {rule:<9}{ids}".rstrip())

        line("enqueued", self.enqueued)
        line("deliveries (lines or records)", self.deliveries)
        line("jobs delivered", self.delivered_jobs)
        line("lost", self.lost, "0", "lost")
        line("  of which left PENDING/RUNNING", self.lost_left_open, "", "lost_left_open")
        line("at-most-once delivered twice", self.at_most_once_twice, "0", "at_most_once_twice")
        line("at-least-once duplicates (jobs)", self.at_least_once_duplicates, "allowed",
             "at_least_once_duplicates")
        line("  extra deliveries", self.at_least_once_extra_deliveries, "allowed")
        line("  resent after a later version", self.stale_resends, "allowed", "stale_resends")
        line("reordered", self.reordered, "0", "reordered")
        line("wrongly DEAD", self.wrongly_dead, "0", "wrongly_dead")
        line("DEAD in doubt (faulted worker / reason)", self.dead_in_doubt, "allowed",
             "dead_in_doubt")
        line("in hand of a faulted worker, order not judged", self.late_in_doubt, "allowed",
             "late_in_doubt")
        line("recorded as delivered (deleted or DONE)", self.recorded)
        line("delivered but not recorded", self.not_recorded, "0", "not_recorded")
        line("unknown or mismatched deliveries", self.unknown_deliveries, "0",
             "unknown_deliveries")
        left = ", ".join(f"{status} {n}" for status, n in sorted(self.rows_left.items()))
        lines.append(f"{'rows left of the enqueued set':<44}{left or 'none':>9}")
        if self.other_rows:
            lines.append(f"{'rows of other targets (ignored)':<44}{self.other_rows:>9}")
        verdict = "PASS" if self.ok else "FAIL: " + ", ".join(
            f"{name}={n}" for name, n in self.failures.items())
        lines.append(f"RESULT: {verdict}")
        return "\n".join(lines)


# -- reading ---------------------------------------------------------------------------------


def _key(text: str) -> str | None:
    return None if text == "-" else text


def read_enqueued(path: Path) -> list[Enqueued]:
    """The enqueued set (a line cut by a kill is ignored)."""
    found = []
    with open(path) as fh:
        for line in fh:
            if line.endswith("\n"):
                job_id, target, key, version, mode, lane = line.split()
                found.append(Enqueued(int(job_id), target, _key(key), int(version), mode, lane))
    return found


def read_deliveries(log_dir: Path) -> list[Delivery]:
    """Every complete ``deliver`` line of every process's file."""
    found = []
    for path in sorted(log_dir.glob("*.log")):
        with open(path) as fh:
            for line in fh:
                if line.endswith("\n") and line.startswith("deliver "):
                    _, job_id, target, key, version, pid, at = line.split()
                    found.append(Delivery(int(job_id), target, _key(key), int(version), int(pid),
                                          float(at)))
    return found


def read_rows(db_url: str) -> list[Row]:
    """Every row of the jobs table."""
    import psycopg

    with psycopg.connect(db_url, connect_timeout=10) as conn:
        cursor = conn.execute("SELECT id, status, attempts, last_error FROM jobs_engine_job")
        return [Row(int(i), s, int(a), e or "") for i, s, a, e in cursor]


def read_in_doubt(path: Path) -> dict[int, int]:
    """``<job_id> <pid>`` lines: rows a faulted worker had in hand."""
    if not path.exists():
        return {}
    pairs = (line.split() for line in path.read_text().splitlines() if line.strip())
    return {int(job_id): int(pid) for job_id, pid in pairs}


# -- judging ---------------------------------------------------------------------------------


def check(enqueued: Iterable[Enqueued], deliveries: Iterable[Delivery], rows: Iterable[Row],
          in_doubt: Mapping[int, int | None] | None = None,
          in_doubt_reasons: Iterable[str] = ()) -> Report:
    """Judge one run (see the module docstring for every count)."""
    report = Report()
    jobs = {job.id: job for job in enqueued}
    report.enqueued = len(jobs)
    by_job: dict[int, list[Delivery]] = defaultdict(list)
    for delivery in deliveries:
        report.deliveries += 1
        job = jobs.get(delivery.job_id)
        if job is None or (job.target, job.key, job.version) != (
                delivery.target, delivery.key, delivery.version):
            report.unknown_deliveries += 1
            report.note("unknown_deliveries", delivery.job_id)
            continue
        by_job[delivery.job_id].append(delivery)
    for sent in by_job.values():
        sent.sort(key=lambda d: d.seq)
    report.delivered_jobs = len(by_job)
    states = {}
    for row in rows:
        if row.id in jobs:
            states[row.id] = row
        else:
            report.other_rows += 1
    report.rows_left = dict(Counter(row.status for row in states.values()))
    reasons = tuple(in_doubt_reasons)
    for job in jobs.values():
        _judge_job(report, job, by_job.get(job.id, []), states.get(job.id), in_doubt or {},
                   reasons)
    _judge_order(report, jobs, by_job, in_doubt or {})
    return report


def _judge_job(report: Report, job: Enqueued, sent: list[Delivery], row: Row | None,
               in_doubt: Mapping[int, int | None], reasons: tuple[str, ...]) -> None:
    """Delivery count, DEAD and recording verdicts of one job."""
    status = row.status if row is not None else None
    if len(sent) > 1:
        if job.mode == AT_MOST_ONCE:
            report.at_most_once_twice += 1
            report.note("at_most_once_twice", job.id)
        else:
            report.at_least_once_duplicates += 1
            report.at_least_once_extra_deliveries += len(sent) - 1
            report.note("at_least_once_duplicates", job.id)
    if status == "DEAD":
        assert row is not None
        if _dead_in_doubt(job, sent, row, in_doubt, reasons):
            report.dead_in_doubt += 1
            report.note("dead_in_doubt", job.id)
        else:
            report.wrongly_dead += 1
            report.note("wrongly_dead", job.id)
        return
    if not sent:
        if status is None or status in OPEN_STATUSES or status in RECORDED_STATUSES:
            report.lost += 1
            report.note("lost", job.id)
            if status in OPEN_STATUSES:
                report.lost_left_open += 1
                report.note("lost_left_open", job.id)
        return
    if status is None or status in RECORDED_STATUSES:
        report.recorded += 1
    else:
        report.not_recorded += 1
        report.note("not_recorded", job.id)


def _dead_in_doubt(job: Enqueued, sent: list[Delivery], row: Row,
                   in_doubt: Mapping[int, int | None], reasons: tuple[str, ...]) -> bool:
    """A DEAD at-most-once row is in doubt when a faulted worker had it in hand (and no one
    else delivered it), or its reason is one the run allows (an unknown outcome)."""
    if job.mode != AT_MOST_ONCE or len(sent) > 1:
        return False
    if reasons and row.last_error.startswith(reasons):
        return True
    if job.id not in in_doubt:
        return False
    holder = in_doubt[job.id]
    return all(holder is None or d.pid == holder for d in sent)


def _judge_order(report: Report, jobs: Mapping[int, Enqueued],
                 by_job: Mapping[int, list[Delivery]],
                 in_doubt: Mapping[int, int | None]) -> None:
    """Per fast-lane target and key: first deliveries in version order; at-least-once
    resends after a later version's first delivery are counted (allowed).

    A delivery by a faulted worker of a row it had in hand when it was stopped is left out
    of the order (and counted, allowed): the send had begun before the stop and ends when
    the process runs again, after the lease it was fenced by ran out. No lease can call
    back a send under way; the engine's part is to hand nothing more after the stop."""
    per_key: dict[tuple[str, str | None], list[tuple[int, int, list[Delivery]]]] = \
        defaultdict(list)
    for job_id, sent in by_job.items():
        job = jobs[job_id]
        if job_id in in_doubt and sent[0].pid == in_doubt[job_id] and len(sent) == 1:
            report.late_in_doubt += 1
            report.note("late_in_doubt", job_id)
            continue
        if job.lane == FAST and job.key is not None:
            per_key[(job.target, job.key)].append((job.version, job_id, sent))
    for versions in per_key.values():
        versions.sort(key=lambda item: (item[0], item[1]))
        latest_first = float("-inf")  # the latest first delivery among lower versions
        for _, job_id, sent in versions:
            if sent[0].seq < latest_first:
                report.reordered += 1
                report.note("reordered", job_id)
            latest_first = max(latest_first, sent[0].seq)
        earliest_higher = float("inf")  # the earliest first delivery among higher versions
        for _, job_id, sent in reversed(versions):
            if len(sent) > 1 and sent[-1].seq > earliest_higher:
                report.stale_resends += 1
                report.note("stale_resends", job_id)
            earliest_higher = min(earliest_higher, sent[0].seq)


def check_run_dir(run_dir: Path, db_url: str, in_doubt_reasons: Iterable[str] = ()) -> Report:
    """Judge a run directory as the suite leaves it (enqueued set, deliveries, in-doubt)."""
    return check(read_enqueued(run_dir / ENQUEUED_FILE),
                 read_deliveries(run_dir / DELIVERIES_DIR), read_rows(db_url),
                 read_in_doubt(run_dir / IN_DOUBT_FILE), in_doubt_reasons)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print the fault checker's table of a run.")
    parser.add_argument("--run-dir", type=Path, required=True,
                        help=f"holds {ENQUEUED_FILE}, {DELIVERIES_DIR}/ and {IN_DOUBT_FILE}")
    parser.add_argument("--db-url", required=True, help="the run's database (postgres://...)")
    parser.add_argument("--in-doubt-reason", action="append", default=[],
                        help="last_error prefix of at-most-once DEAD rows that are allowed")
    args = parser.parse_args(argv)
    report = check_run_dir(args.run_dir, args.db_url, args.in_doubt_reason)
    print(report.table())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
