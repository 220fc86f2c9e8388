"""The limits checker's rules on small hand-made records: each rule fails on the records
that break it, and what the engine may do (a killed holder's slot held until its rescue,
ends and starts at one moment, a window exactly full) passes."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.faults.checker import AT_LEAST_ONCE, Enqueued
from tests.faults.limits_checker import (
    OK,
    RATE_LIMITED,
    Finish,
    Limits,
    LimitsReport,
    Start,
    check_limits,
    read_killed,
    read_records,
)
from tests.faults.limits_targets import finish_line, start_line

pytestmark = pytest.mark.faults

C, R = "t:conc", "t:rate"
LIMITS = Limits({C: 2}, {R: (3, 1.0, 1)})  # 2 per key; 3 per s with a burst of 1: 4 a window
KILLED_PID, KILLED_AT = 9, 50.0


def jobs(ids: Iterable[int], target: str = C) -> list[Enqueued]:
    return [Enqueued(i, target, f"k{i}", 0, AT_LEAST_ONCE, "long") for i in ids]


def start(job: int, at: float, key: str = "a", pid: int = 1, target: str = C,
          admitted: float | None = None, lost: tuple[tuple[float, float], ...] = ()) -> Start:
    return Start(job, target, key, at, pid, at - 0.01 if admitted is None else admitted, lost)


def finish(job: int, at: float, key: str = "a", pid: int = 1, target: str = C,
           how: str = OK) -> Finish:
    return Finish(job, target, key, at, pid, how)


def judged(enqueued: list[Enqueued], starts: list[Start], finishes: list[Finish],
           in_doubt: dict[int, int] | None = None,
           killed: dict[int, float] | None = None) -> LimitsReport:
    report = check_limits(enqueued, starts, finishes, LIMITS, in_doubt=in_doubt,
                          killed=killed)
    assert "LIMITS RESULT: " in report.table()
    return report


def runs(spans: list[tuple[int, float, float]], key: str = "a"
         ) -> tuple[list[Start], list[Finish]]:
    """(job, start, end) handler runs of one key of C, on pid 1."""
    return ([start(j, s, key) for j, s, _ in spans], [finish(j, e, key) for j, _, e in spans])


def killed_holder() -> tuple[list[Enqueued], list[Start], list[Finish]]:
    """Job 1 started by the killed pid at 49, never finished; the rescue released its row
    at 53 and the job ran again at 54 (its start names the lost try)."""
    starts = [start(1, 49.0, pid=KILLED_PID, admitted=48.99),
              start(1, 54.0, pid=2, admitted=53.99, lost=((48.99, 53.0),))]
    return jobs([1, 2, 3]), starts, [finish(1, 54.5, pid=2)]


def test_a_clean_run_passes_with_every_limit_reached_exactly() -> None:
    starts, finishes = runs([(1, 0.0, 2.0), (2, 0.5, 1.0), (3, 1.0, 3.0)])  # 2 at once
    # 4 starts in [10, 11] (closed), the fifth just after: exactly R + B per window.
    rate = [start(10 + n, at, key="*", target=R) for n, at in enumerate(
        [10.0, 10.2, 10.5, 11.0, 11.0001])]
    report = judged(jobs([1, 2, 3]) + jobs(range(10, 15), R), starts + rate,
                    finishes + [finish(s.job_id, s.at + 0.01, "*", target=R) for s in rate])
    assert report.ok, report.table()
    assert report.keys[(C, "a")].max_running == 2
    assert report.by_start[R].max_starts == 4 and report.by_admission[R].max_starts == 4
    assert report.finished_jobs == 8


def test_more_than_the_slots_at_once_is_an_over_run_naming_the_jobs() -> None:
    starts, finishes = runs([(1, 0.0, 2.0), (2, 0.5, 1.5), (3, 1.0, 3.0)])
    report = judged(jobs([1, 2, 3]), starts, finishes)
    assert report.failures == {"over_concurrency": 1}
    assert report.keys[(C, "a")].max_running == 3
    assert "jobs 1(run, pid 1), 2(run, pid 1), 3(run, pid 1)" in \
        report.examples["over_concurrency"][0]
    # Other keys are counted apart.
    other_starts, other_finishes = runs([(3, 1.0, 3.0)], key="b")
    assert judged(jobs([1, 2, 3]), starts[:2] + other_starts,
                  finishes[:2] + other_finishes).ok


def test_a_finish_and_a_start_at_one_moment_do_not_overlap() -> None:
    starts, finishes = runs([(1, 0.0, 1.0), (2, 0.5, 2.0), (3, 1.0, 3.0)])
    assert judged(jobs([1, 2, 3]), starts, finishes).ok


def test_a_killed_holders_row_holds_its_slot_until_its_rescue() -> None:
    enqueued, starts, finishes = killed_holder()
    # Job 2 runs beside the killed row; job 3 starts before the rescue released it: 3 held.
    early = judged(enqueued, [*starts, start(2, 50.0), start(3, 52.0)],
                   [*finishes, finish(2, 53.2), finish(3, 56.0)],
                   killed={KILLED_PID: KILLED_AT})
    assert early.failures == {"over_concurrency": 1} and early.killed_runs == 1
    assert "1(killed, pid 9)" in early.examples["over_concurrency"][0]
    # After the rescue the slot is free again: 2 running at 53.5 (the slot came back).
    late = judged(enqueued, [*starts, start(2, 50.0), start(3, 53.5)],
                  [*finishes, finish(2, 56.0), finish(3, 53.9)], killed={KILLED_PID: KILLED_AT})
    assert late.ok, late.table()
    held = late.held[(C, "a")]
    assert (held.rows, held.stopped_at, held.released_at, held.back_at) == \
        ([1], KILLED_AT, 53.0, 53.5)
    assert held.others_while_held == 1  # job 2 alone beside the held row


def test_a_slot_that_never_comes_back_fails() -> None:
    enqueued, starts, finishes = killed_holder()
    # After the rescue at 53 the key never runs 2 at once again: a leaked slot looks so.
    one_at_a_time = judged(enqueued, [*starts, start(2, 50.0), start(3, 57.0)],
                           [*finishes, finish(2, 52.0), finish(3, 58.0)],
                           killed={KILLED_PID: KILLED_AT})
    assert one_at_a_time.failures == {"slots_not_returned": 1}
    assert one_at_a_time.held[(C, "a")].back_at is None
    # Two running before the rescue does not count: they are not after it.
    before = judged(enqueued, [*starts, start(2, 49.5), start(3, 57.0)],
                    [*finishes, finish(2, 50.5), finish(3, 58.0)], killed={KILLED_PID: KILLED_AT})
    assert before.failures == {"slots_not_returned": 1}
    # A held row with no rescue recorded (never ran again): its slot did not come back, and
    # the job never finished.
    no_rescue = judged(jobs([1, 2, 3]), [start(1, 49.0, pid=KILLED_PID), start(2, 50.0),
                                         start(3, 60.0)], [finish(2, 61.0), finish(3, 61.0)],
                       killed={KILLED_PID: KILLED_AT}, in_doubt={1: KILLED_PID})
    assert no_rescue.slots_not_returned == 1 and no_rescue.held[(C, "a")].released_at is None
    assert no_rescue.unfinished == 1 and no_rescue.not_finished == 1


def test_a_held_row_whose_handler_never_started_counts_from_its_lost_try() -> None:
    """In doubt (started in the database) but no start line: the lost try's own times
    hold the slot, and its release is when the key must come back to full."""
    starts = [start(1, 54.0, pid=2, admitted=53.99, lost=((49.0, 53.0),)),
              start(2, 49.5), start(3, 51.0)]
    finishes = [finish(1, 54.5, pid=2), finish(2, 53.5), finish(3, 55.0)]
    report = judged(jobs([1, 2, 3]), starts, finishes, in_doubt={1: KILLED_PID},
                    killed={KILLED_PID: KILLED_AT})
    assert report.admitted_only == 1 and report.failures == {"over_concurrency": 1}
    assert report.held[(C, "a")].released_at == 53.0


def test_a_start_that_never_finishes_fails_and_runs_to_the_end() -> None:
    starts = [start(1, 0.0), start(2, 1.0), start(3, 100.0)]
    report = judged(jobs([1, 2, 3]), starts, [finish(2, 2.0), finish(3, 101.0)])
    assert report.unfinished == 1 and report.not_finished == 1
    assert report.keys[(C, "a")].max_running == 2  # job 1, still "running" at 100
    assert set(report.failures) == {"unfinished", "not_finished"}


def test_more_than_rate_plus_burst_in_a_window_fails_on_each_clock() -> None:
    # Five starts within one second, by the handlers' clock and the admissions'.
    rate = [start(10 + n, 10.0 + n * 0.25, "*", target=R, admitted=10.0 + n * 0.25)
            for n in range(5)]
    ends = [finish(s.job_id, s.at + 0.01, "*", target=R) for s in rate]
    report = judged(jobs(range(10, 15), R), rate, ends)
    assert report.by_start[R].max_starts == 5
    assert report.failures == {"over_rate_by_start": 1, "over_rate_by_admission": 1}
    # Admitted in one moment, started spread out (a lane that queued them): the admission
    # clock sees the over-run the handlers' clock does not.
    spread = [start(10 + n, 10.0 + n * 0.3, "*", target=R, admitted=9.0) for n in range(5)]
    report = judged(jobs(range(10, 15), R), spread,
                    [finish(s.job_id, s.at + 0.01, "*", target=R) for s in spread])
    assert report.failures == {"over_rate_by_admission": 1}
    # A try that raised RateLimited took its token: it counts, and its job still must end.
    throttled = [*rate[:4], start(10, 10.9, "*", target=R, admitted=10.9)]
    report = judged(jobs(range(10, 14), R), throttled,
                    [finish(10, 10.05, "*", target=R, how=RATE_LIMITED), *ends[1:4],
                     finish(10, 11.0, "*", target=R)])
    assert report.throttled == 1 and report.failures == {"over_rate_by_start": 1,
                                                         "over_rate_by_admission": 1}
    assert judged(jobs([10]), [rate[0]], [finish(10, 10.05, "*", target=R,
                                                 how=RATE_LIMITED)]).not_finished == 1


def test_the_handlers_clock_is_allowed_the_lag_behind_their_admissions() -> None:
    """Admissions one a second apart (3 a second allowed, burst 1) whose handlers started
    up to 0.5 s late: five handler starts within a second are within R + B + R * 0.5 / P
    (6), and the admissions' windows hold 4; a sixth start in it is one too many."""
    admitted = [10.0, 10.3, 10.6, 10.9, 11.2]
    late = [start(20 + n, at + (0.5 if n == 0 else 0.0), "*", target=R, admitted=at)
            for n, at in enumerate(admitted)]
    ends = [finish(s.job_id, s.at + 0.01, "*", target=R) for s in late]
    report = judged(jobs(range(20, 25), R), late, ends)
    assert report.lag_s[R] == pytest.approx(0.5)
    assert report.by_start[R].allowed == 6 and report.by_start[R].max_starts == 5
    assert report.failures == {}
    six = [*late, start(25, 10.8, "*", target=R, admitted=10.8)]
    report = judged(jobs(range(20, 26), R), six,
                    [*ends, finish(25, 10.81, "*", target=R)])
    assert set(report.failures) == {"over_rate_by_admission"}


def test_a_lost_try_without_a_start_took_a_token() -> None:
    rate = [start(10 + n, 10.0 + n * 0.1, "*", target=R) for n in range(3)]
    rate.append(start(13, 12.0, "*", target=R, admitted=11.99, lost=((10.35, 10.9),)))
    ends = [finish(s.job_id, s.at + 0.01, "*", target=R) for s in rate]
    report = judged(jobs(range(10, 14), R), rate, ends)
    assert report.by_admission[R].max_starts == 4 and report.ok
    rate.insert(0, start(9, 10.05, "*", target=R))
    report = judged(jobs(range(9, 14), R), rate, [*ends, finish(9, 10.1, "*", target=R)])
    assert report.failures == {"over_rate_by_admission": 1}


def test_unknown_starts_and_finishes_without_a_start_fail() -> None:
    report = judged(jobs([1]), [start(1, 0.0), start(7, 0.0)],
                    [finish(1, 1.0), finish(7, 1.0), finish(1, 2.0), finish(8, 0.5)])
    assert report.failures == {"unknown_starts": 1, "unmatched_finishes": 2}


def test_records_round_trip_and_a_cut_line_is_ignored(tmp_path: Path) -> None:
    logs = tmp_path / "deliveries"
    logs.mkdir()
    (logs / "7.log").write_text(
        "deliver 5 t:am k 1 7 1.0\n"
        + start_line(1, C, "a", 12.5, 7, 12.25, [(1.5, 4.0), (5.0, 8.0)])
        + start_line(2, R, "*", 13.0, 7, 12.9, [])
        + finish_line(1, C, "a", 13.5, 7, OK) + "finish 2 t:rate * 14")
    starts, finishes = read_records(logs)
    assert starts == [Start(1, C, "a", 12.5, 7, 12.25, ((1.5, 4.0), (5.0, 8.0))),
                      Start(2, R, "*", 13.0, 7, 12.9, ())]
    assert finishes == [Finish(1, C, "a", 13.5, 7, OK)]
    (tmp_path / "killed.txt").write_text("7 12.750000\n")
    assert read_killed(tmp_path / "killed.txt") == {7: 12.75}
    assert read_killed(tmp_path / "none.txt") == {}
