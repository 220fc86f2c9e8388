"""The limits scenario's judge: from the handlers' ``start`` and ``finish`` records
(``limits_targets.py``), did a concurrency limit ever let more than N rows of a key run at
once, a rate limit more than R + B rows start in a window of P, and did the slots a killed
worker held come back?

What a key's concurrency counts, at each moment:

- a handler from its ``start`` line to its ``finish`` line (a row holds its slot longer,
  from its admission until its outcome is written, so these intervals lie inside the
  engine's own count: a key over N here is over N in the database too);
- a start with no ``finish`` (its process was SIGKILLed mid-handler) until the lease rescue
  released its row: the rescue writes the lost try into the row's ``tries`` with
  ``finished_at`` = the rescue's time, and the job's next start records it (``lost``). That
  is the moment the slot came back, read from the database's own record, not a bound from
  the lease length; it is the rescuing worker's reading of the database clock, taken before
  its statement, so never later than the release itself;
- a lost try without any ``start`` (the row was admitted, its handler never wrote) from its
  ``started_at`` to its ``finished_at``.

A start that has neither a finish nor a rescue is ``unfinished`` (a slot never given back,
or a job that never ended): it must not happen, and it counts as running to the end.

Rates: every start is a token taken (a try that raised ``RateLimited`` too). The windows are
closed intervals of P seconds, anchored at each start, over two clocks: the handlers' start
times (``time.time()`` in the worker) and the admissions' times (the try's ``started_at``,
the database clock the token bucket reckons with). The admissions must hold at most R + B;
the handlers' starts, which lag their admissions by up to L (a thread takes the row), at
most R + B + R * L / P (starts in a window of P were admitted within P + L).

Slots back: for each key a killed worker held a row of when it was stopped (the in-doubt
rows of its pid, and its starts without a finish), the release is the latest rescue of
those rows; after it, the key must reach N running again (a moment with N handlers of the
key running, none of them the killed worker's). A leaked slot leaves the key at N - 1.

``python -m tests.faults.limits_checker --run-dir DIR`` prints a run's table (exit 1 when it
fails; the limits are this scenario's, ``limits_targets.py``).
"""

from __future__ import annotations

import argparse
import bisect
import math
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tests.faults.checker import (
    DELIVERIES_DIR,
    ENQUEUED_FILE,
    IN_DOUBT_FILE,
    Enqueued,
    read_enqueued,
    read_in_doubt,
)

EXAMPLES = 5
KILLED_FILE = "killed.txt"  # ``<pid> <unix_time>``: a worker SIGKILLed, when it was stopped
LABEL_MATCH_S = 2e-6  # an admission's time as a start wrote it vs as the lost try holds it
OK, RATE_LIMITED = "ok", "ratelimited"
FOREVER = math.inf


@dataclass(frozen=True, slots=True)
class Start:
    job_id: int
    target: str
    key: str
    at: float  # the handler's start, wall clock
    pid: int
    admitted: float  # the try's started_at: the admission, database clock
    lost: tuple[tuple[float, float], ...] = ()  # earlier lost tries: (started_at, finished_at)


@dataclass(frozen=True, slots=True)
class Finish:
    job_id: int
    target: str
    key: str
    at: float
    pid: int
    how: str = OK


@dataclass(frozen=True, slots=True)
class Interval:
    """A key's slot in use: a handler's run, or a row of a lost holder until its rescue."""

    job_id: int
    target: str
    key: str
    start: float
    end: float  # FOREVER: never given back as far as the records show
    pid: int  # 0: a lost try no start recorded
    what: str  # "run", "killed" (until its rescue), "admitted" (lost try), "unfinished"


@dataclass(frozen=True)
class Limits:
    """The limits the records are held against: slots per key of a concurrency target,
    (R, P, B) of a rate target (one key: the whole target)."""

    slots: Mapping[str, int] = field(default_factory=dict)
    rates: Mapping[str, tuple[int, float, int]] = field(default_factory=dict)


@dataclass
class KeyRun:
    """One key's concurrency: its maximum and when, and the starts that took it over N."""

    slots: int
    max_running: int = 0
    max_at: float = 0.0
    over: int = 0
    full_at: list[float] = field(default_factory=list)  # moments N (or more) ran


@dataclass
class Window:
    """One rate target's windows on one clock: the fullest, and those over R + B."""

    allowed: int
    period_s: float
    starts: int = 0
    max_starts: int = 0
    max_from: float = 0.0
    over: int = 0


@dataclass
class Held:
    """A key a killed worker held slots of: its rows' latest rescue, and the first moment
    after it the key had all its slots running again."""

    rows: list[int]
    stopped_at: float
    released_at: float | None  # None: a held row was never rescued (no lost try seen)
    back_at: float | None = None
    others_while_held: int = 0  # the most other rows of the key running meanwhile


@dataclass
class LimitsReport:
    starts: int = 0
    finishes: int = 0
    throttled: int = 0  # finishes that raised RateLimited
    jobs: int = 0  # enqueued jobs of the limited targets
    finished_jobs: int = 0
    not_finished: int = 0
    unfinished: int = 0
    unmatched_finishes: int = 0
    unknown_starts: int = 0  # starts of a job not in the enqueued set
    killed_runs: int = 0  # starts of a killed process, counted until their rescue
    admitted_only: int = 0  # lost tries without a start, counted as running
    keys: dict[tuple[str, str], KeyRun] = field(default_factory=dict)
    by_start: dict[str, Window] = field(default_factory=dict)
    by_admission: dict[str, Window] = field(default_factory=dict)
    lag_s: dict[str, float] = field(default_factory=dict)  # the longest admission-to-start
    held: dict[tuple[str, str], Held] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    origin: float = 0.0  # the table's and the examples' moments count from it (unix time)

    MUST_BE_ZERO = ("not_finished", "unfinished", "unmatched_finishes", "unknown_starts",
                    "over_concurrency",
                    "over_rate_by_start", "over_rate_by_admission", "slots_not_returned")

    @property
    def over_concurrency(self) -> int:
        return sum(run.over for run in self.keys.values())

    @property
    def over_rate_by_start(self) -> int:
        return sum(w.over for w in self.by_start.values())

    @property
    def over_rate_by_admission(self) -> int:
        return sum(w.over for w in self.by_admission.values())

    @property
    def slots_not_returned(self) -> int:
        return sum(held.back_at is None for held in self.held.values())

    @property
    def failures(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.MUST_BE_ZERO if getattr(self, name)}

    @property
    def ok(self) -> bool:
        return not self.failures

    def note(self, kind: str, text: str) -> None:
        if len(self.examples[kind]) < EXAMPLES:
            self.examples[kind].append(text)

    def t(self, at: float) -> str:
        """A moment as the table shows it: seconds after ``origin``."""
        return f"{at - self.origin:.3f}"

    def table(self) -> str:
        """Every count, what it must be, examples; moments in seconds after ``origin``."""
        lines = [f"{'limits check':<52}{'count':>9}  must be",
                 f"(moments in seconds after unix time {self.origin:.3f})"]

        def line(label: str, value: object, rule: str = "") -> None:
            lines.append(f"{label:<52}{value!s:>9}  {rule}".rstrip())

        line("handler starts", self.starts)
        line("handler finishes (of them RateLimited)", f"{self.finishes} ({self.throttled})")
        line("jobs of the limited targets", self.jobs)
        line("jobs finished", self.finished_jobs)
        line("jobs never finished", self.not_finished, "0")
        line("starts with neither finish nor rescue", self.unfinished, "0")
        line("finishes without a start", self.unmatched_finishes, "0")
        line("starts of no enqueued job", self.unknown_starts, "0")
        line("starts of a killed worker (running to their rescue)", self.killed_runs)
        line("lost tries without a start (running)", self.admitted_only)
        for (target, key), run in sorted(self.keys.items()):
            line(f"max running {target} {key} (at {self.t(run.max_at)})",
                 run.max_running, f"<= {run.slots}")
        line("starts over a key's slots", self.over_concurrency, "0")
        for name, windows in (("handler start", self.by_start),
                              ("admission", self.by_admission)):
            for target, w in sorted(windows.items()):
                line(f"max starts in {w.period_s:g} s by {name} {target} "
                     f"(from {self.t(w.max_from)})", w.max_starts, f"<= {w.allowed}")
                line(f"  windows over {w.allowed}", w.over, "0")
        for (target, key), held in sorted(self.held.items()):
            released = "never" if held.released_at is None else self.t(held.released_at)
            back = "never" if held.back_at is None else (
                f"{self.t(held.back_at)} (+{held.back_at - (held.released_at or 0):.3f}s)")
            lines.append(f"killed holder's {target} {key}: {len(held.rows)} rows "
                         f"{held.rows[:EXAMPLES]} held from {self.t(held.stopped_at)} (at "
                         f"most {held.others_while_held} others running meanwhile), released "
                         f"{released}, all {self.keys[(target, key)].slots} slots running "
                         f"again {back}")
        line("keys whose slots never came back", self.slots_not_returned, "0")
        for kind, texts in sorted(self.examples.items()):
            for text in texts:
                lines.append(f"  {kind}: {text}")
        verdict = "PASS" if self.ok else "FAIL: " + ", ".join(
            f"{name}={n}" for name, n in self.failures.items())
        lines.append(f"LIMITS RESULT: {verdict}")
        return "\n".join(lines)


# -- reading ---------------------------------------------------------------------------------


def _lost(text: str) -> tuple[tuple[float, float], ...]:
    if text == "-":
        return ()
    return tuple((float(s), float(f)) for s, f in (pair.split("/") for pair in text.split(",")))


def read_records(log_dir: Path) -> tuple[list[Start], list[Finish]]:
    """Every complete ``start`` and ``finish`` line of every process's file (a line cut by
    a kill is ignored; ``deliver`` lines are the other scenarios')."""
    starts, finishes = [], []
    for path in sorted(log_dir.glob("*.log")):
        with open(path) as fh:
            for line in fh:
                if not line.endswith("\n"):
                    continue
                if line.startswith("start "):
                    _, job_id, target, key, at, pid, admitted, lost = line.split()
                    starts.append(Start(int(job_id), target, key, float(at), int(pid),
                                        float(admitted), _lost(lost)))
                elif line.startswith("finish "):
                    _, job_id, target, key, at, pid, how = line.split()
                    finishes.append(Finish(int(job_id), target, key, float(at), int(pid), how))
    return starts, finishes


# -- judging ---------------------------------------------------------------------------------


def intervals(report: LimitsReport, starts: list[Start], finishes: list[Finish],
              killed: Mapping[int, float]) -> list[Interval]:
    """Every run of a handler and every slot a lost holder kept (see the module
    docstring); counts the unfinished starts and unmatched finishes on ``report``."""
    lost: dict[int, set[tuple[float, float]]] = defaultdict(set)
    key_of: dict[int, tuple[str, str]] = {}
    for start in starts:
        lost[start.job_id].update(start.lost)
        key_of[start.job_id] = (start.target, start.key)
    ends: dict[tuple[int, int], list[Finish]] = defaultdict(list)
    for finish in finishes:
        ends[(finish.job_id, finish.pid)].append(finish)
    for found in ends.values():
        found.sort(key=lambda f: f.at)
    found_intervals: list[Interval] = []
    matched_lost: set[tuple[int, float, float]] = set()
    by_process: dict[tuple[int, int], list[Start]] = defaultdict(list)
    for start in starts:
        by_process[(start.job_id, start.pid)].append(start)
    for (job_id, pid), runs in by_process.items():
        runs.sort(key=lambda s: s.at)
        done = ends.get((job_id, pid), [])
        used = 0
        for i, start in enumerate(runs):
            next_at = runs[i + 1].at if i + 1 < len(runs) else FOREVER
            while used < len(done) and done[used].at < start.at:
                report.unmatched_finishes += 1
                report.note("unmatched_finishes", f"job {job_id} pid {pid} at "
                                                  f"{report.t(done[used].at)}")
                used += 1
            rescue = next(((s, f) for s, f in sorted(lost[job_id])
                           if abs(s - start.admitted) <= LABEL_MATCH_S), None)
            if rescue is not None:
                matched_lost.add((job_id, *rescue))
            if used < len(done) and done[used].at <= next_at:
                found_intervals.append(Interval(job_id, start.target, start.key, start.at,
                                                done[used].at, pid, "run"))
                used += 1
            elif rescue is not None:
                if pid in killed:
                    report.killed_runs += 1
                found_intervals.append(Interval(job_id, start.target, start.key, start.at,
                                                max(start.at, rescue[1]), pid, "killed"))
            else:
                report.unfinished += 1
                report.note("unfinished", f"job {job_id} pid {pid} started {report.t(start.at)}")
                found_intervals.append(Interval(job_id, start.target, start.key, start.at,
                                                FOREVER, pid, "unfinished"))
        for extra in done[used:]:
            report.unmatched_finishes += 1
            report.note("unmatched_finishes", f"job {job_id} pid {pid} at {report.t(extra.at)}")
    for (job_id, pid), done in ends.items():
        if (job_id, pid) not in by_process:
            report.unmatched_finishes += len(done)
            report.note("unmatched_finishes", f"job {job_id} pid {pid} at "
                                              f"{report.t(done[0].at)}")
    for job_id, tries in lost.items():
        target, key = key_of[job_id]
        for started, finished in sorted(tries):
            if (job_id, started, finished) not in matched_lost:
                report.admitted_only += 1
                found_intervals.append(Interval(job_id, target, key, started, finished, 0,
                                                "admitted"))
    return found_intervals


def _concurrency(report: LimitsReport, runs: list[Interval], slots: int) -> KeyRun:
    """The sweep over one key's intervals: ends before starts at the same moment (a row's
    slot is free once its outcome is written, before the next admission can see it)."""
    run = KeyRun(slots)
    events = sorted([(i.start, 1, n) for n, i in enumerate(runs)]
                    + [(i.end, 0, n) for n, i in enumerate(runs) if i.end != FOREVER])
    active: set[int] = set()
    for at, is_start, n in events:
        if not is_start:
            active.discard(n)
            continue
        active.add(n)
        count = len(active)
        if count > run.max_running:
            run.max_running, run.max_at = count, at
        if count >= slots:
            run.full_at.append(at)
        if count > slots:
            run.over += 1
            report.note("over_concurrency", f"{runs[n].target} {runs[n].key} at {report.t(at)}: "
                        f"{count} running, jobs " + ", ".join(
                            f"{runs[m].job_id}({runs[m].what}, pid {runs[m].pid})"
                            for m in sorted(active)))
    return run


def _windows(report: LimitsReport, kind: str, target: str, times: list[float],
             rate: tuple[int, float, int], lag_s: float = 0.0) -> Window:
    """Closed windows of ``period_s`` anchored at each start: the most starts in one, and
    how many hold more than R + B, or on a clock that lags the admissions by up to
    ``lag_s`` more than R + B + R * lag_s / P: starts in a window of P were admitted in a
    window of P + lag_s, which the bucket holds to that."""
    starts, period_s, burst = rate
    window = Window(starts + burst + math.ceil(starts * lag_s / period_s), period_s,
                    len(times))
    times = sorted(times)
    last = 0
    for first, at in enumerate(times):
        last = max(last, first)
        while last + 1 < len(times) and times[last + 1] - at <= period_s:
            last += 1
        count = last - first + 1
        if count > window.max_starts:
            window.max_starts, window.max_from = count, at
        if count > window.allowed:
            window.over += 1
            report.note(kind, f"{target}: {count} starts in [{report.t(at)}, "
                                    f"{report.t(at + period_s)}]")
    return window


def _most_between(runs: list[Interval], low: float, high: float) -> int:
    """The most of ``runs`` running at once between ``low`` and ``high``."""
    events = sorted([(max(i.start, low), 1) for i in runs if i.start < high and i.end > low]
                    + [(min(i.end, high), 0) for i in runs if i.start < high and i.end > low])
    count = most = 0
    for _, is_start in events:
        count += 1 if is_start else -1
        most = max(most, count)
    return most


def _held_keys(report: LimitsReport, starts: list[Start], runs: list[Interval],
               in_doubt: Mapping[int, int], killed: Mapping[int, float],
               limits: Limits) -> None:
    """The keys a killed worker held rows of, their release, and the slots coming back."""
    key_of = {s.job_id: (s.target, s.key) for s in starts}
    lost: dict[int, set[tuple[float, float]]] = defaultdict(set)
    for start in starts:
        lost[start.job_id].update(start.lost)
    held: dict[int, float] = {job_id: killed[pid] for job_id, pid in in_doubt.items()
                              if pid in killed}
    for run in runs:
        if run.pid in killed and run.what in ("killed", "unfinished"):
            held.setdefault(run.job_id, killed[run.pid])
    per_key: dict[tuple[str, str], list[tuple[int, float | None]]] = defaultdict(list)
    for job_id, killed_at in sorted(held.items()):
        if job_id not in key_of or key_of[job_id][0] not in limits.slots:
            continue  # a rate target's row: no slot; or a row never started again (lost)
        # The try in hand at the kill: the latest lost try that began before it.
        tries = [(s, f) for s, f in lost[job_id] if s <= killed_at]
        per_key[key_of[job_id]].append((job_id, max(tries)[1] if tries else None))
    for (target, key), rows in sorted(per_key.items()):
        releases = [released for _, released in rows]
        released_at = None if None in releases else max(r for r in releases if r is not None)
        ids = [job_id for job_id, _ in rows]
        stopped_at = min(held[job_id] for job_id in ids)
        found = Held(ids, stopped_at, released_at)
        others = [i for i in runs if (i.target, i.key) == (target, key)
                  and not (i.job_id in held and i.start <= stopped_at)]
        found.others_while_held = _most_between(
            others, stopped_at, FOREVER if released_at is None else released_at)
        key_run = report.keys.get((target, key))
        if released_at is not None and key_run is not None:
            at = bisect.bisect_right(key_run.full_at, released_at)
            found.back_at = key_run.full_at[at] if at < len(key_run.full_at) else None
        if found.back_at is None:
            report.note("slots_not_returned", f"{target} {key}: rows {found.rows[:EXAMPLES]} "
                        f"released {'never' if released_at is None else report.t(released_at)}")
        report.held[(target, key)] = found


def check_limits(enqueued: Iterable[Enqueued], starts: list[Start], finishes: list[Finish],
                 limits: Limits, *, in_doubt: Mapping[int, int] | None = None,
                 killed: Mapping[int, float] | None = None, origin: float = 0.0
                 ) -> LimitsReport:
    """Judge a run's records. ``killed``: pid -> when it was stopped for its SIGKILL (wall
    clock); ``in_doubt``: job -> pid, the started rows a faulted worker had in hand;
    ``origin``: the unix time the report's moments count from."""
    report = LimitsReport(origin=origin)
    killed = dict(killed or {})
    names = set(limits.slots) | set(limits.rates)
    starts = [s for s in starts if s.target in names]
    finishes = [f for f in finishes if f.target in names]
    report.starts, report.finishes = len(starts), len(finishes)
    report.throttled = sum(f.how == RATE_LIMITED for f in finishes)
    jobs = {job.id for job in enqueued if job.target in names}
    done = {f.job_id for f in finishes if f.how == OK}
    report.jobs, report.finished_jobs = len(jobs), len(jobs & done)
    for job_id in sorted(jobs - done):
        report.not_finished += 1
        report.note("not_finished", f"job {job_id}")
    for job_id in sorted({s.job_id for s in starts} - jobs):
        report.unknown_starts += 1
        report.note("unknown_starts", f"job {job_id}")
    runs = intervals(report, starts, finishes, killed)
    per_key: dict[tuple[str, str], list[Interval]] = defaultdict(list)
    for run in runs:
        if run.target in limits.slots:
            per_key[(run.target, run.key)].append(run)
    for (target, key), key_runs in sorted(per_key.items()):
        report.keys[(target, key)] = _concurrency(report, key_runs, limits.slots[target])
    for target, rate in sorted(limits.rates.items()):
        mine = [s for s in starts if s.target == target]
        # A handler starts a little after its admission (its thread takes it): the
        # handlers' clock is held to the bound that lag allows, the admissions' to R + B.
        lag_s = max((s.at - s.admitted for s in mine), default=0.0)
        report.lag_s[target] = lag_s
        report.by_start[target] = _windows(report, "over_rate_by_start", target,
                                           [s.at for s in mine], rate, max(0.0, lag_s))
        admitted = [s.admitted for s in mine] + [
            r.start for r in runs if r.target == target and r.what == "admitted"]
        report.by_admission[target] = _windows(report, "over_rate_by_admission", target,
                                               admitted, rate)
    _held_keys(report, starts, runs, in_doubt or {}, killed, limits)
    return report


def scenario_limits() -> Limits:
    """The limits ``limits_targets`` declares."""
    from tests.faults import limits_targets as t

    return Limits({t.CONC: t.SLOTS}, {t.RATE: (t.RATE_STARTS, t.RATE_PERIOD_S, t.RATE_BURST)})


def read_killed(path: Path) -> dict[int, float]:
    """``<pid> <unix_time>`` lines: the workers SIGKILLed, and when they were stopped."""
    if not path.exists():
        return {}
    pairs = (line.split() for line in path.read_text().splitlines() if line.strip())
    return {int(pid): float(at) for pid, at in pairs}



def check_run_dir(run_dir: Path) -> LimitsReport:
    """Judge a run directory as the scenario leaves it; moments count from its first
    start."""
    starts, finishes = read_records(run_dir / DELIVERIES_DIR)
    return check_limits(read_enqueued(run_dir / ENQUEUED_FILE), starts, finishes,
                        scenario_limits(), in_doubt=read_in_doubt(run_dir / IN_DOUBT_FILE),
                        killed=read_killed(run_dir / KILLED_FILE),
                        origin=min((s.at for s in starts), default=0.0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print the limits checker's table of a run.")
    parser.add_argument("--run-dir", type=Path, required=True,
                        help=f"holds {ENQUEUED_FILE}, {DELIVERIES_DIR}/, {IN_DOUBT_FILE} and "
                             f"{KILLED_FILE}")
    args = parser.parse_args(argv)
    report = check_run_dir(args.run_dir)
    print(report.table())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
