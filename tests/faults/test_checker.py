"""The checker's rules on small hand-made runs: each count catches what it names, and
what the engine is allowed to do (at-least-once duplicates, DEAD in doubt) passes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.faults.checker import (
    AT_LEAST_ONCE,
    AT_MOST_ONCE,
    Delivery,
    Enqueued,
    Report,
    Row,
    check,
    read_deliveries,
    read_enqueued,
)
from tests.faults.targets import delivery_line

pytestmark = pytest.mark.faults

AM, AL = "t:am", "t:al"


def job(job_id: int, version: int, mode: str = AT_MOST_ONCE, key: str = "k",
        lane: str = "fast") -> Enqueued:
    return Enqueued(job_id, AM if mode == AT_MOST_ONCE else AL, key, version, mode, lane)


def sent(j: Enqueued, at: float, pid: int = 1) -> Delivery:
    return Delivery(j.id, j.target, j.key, j.version, pid, at)


def judged(jobs: list[Enqueued], deliveries: list[Delivery], rows: Sequence[Row] = (),
           in_doubt: dict[int, int | None] | None = None,
           in_doubt_reasons: tuple[str, ...] = ()) -> Report:
    report = check(jobs, deliveries, rows, in_doubt, in_doubt_reasons)
    assert "RESULT: " in report.table()
    return report


def test_a_clean_run_passes_with_every_row_recorded() -> None:
    jobs = [job(1, 1), job(2, 2), job(3, 1, AT_LEAST_ONCE, key="q")]
    report = judged(jobs, [sent(jobs[0], 1.0), sent(jobs[1], 2.0), sent(jobs[2], 1.5)],
                    [Row(2, "DONE", 0, "")])  # a kept DONE row counts as recorded
    assert report.ok and report.recorded == 3 and report.delivered_jobs == 3


def test_lost_is_gone_without_a_delivery_or_left_open() -> None:
    jobs = [job(1, 1), job(2, 2), job(3, 3)]
    report = judged(jobs, [], [Row(2, "PENDING", 0, ""), Row(3, "RUNNING", 0, "")])
    assert (report.lost, report.lost_left_open) == (3, 2)
    assert report.failures == {"lost": 3}


def test_at_most_once_twice_fails_and_at_least_once_duplicates_are_allowed() -> None:
    am, al = job(1, 1), job(2, 1, AT_LEAST_ONCE, key="q")
    report = judged([am, al], [sent(am, 1), sent(am, 2, pid=2), sent(al, 1), sent(al, 2)])
    assert report.at_most_once_twice == 1 and report.examples["at_most_once_twice"] == [1]
    assert (report.at_least_once_duplicates, report.at_least_once_extra_deliveries) == (1, 1)
    assert report.failures == {"at_most_once_twice": 1}


def test_reordered_is_a_first_delivery_before_a_lower_versions_first() -> None:
    v1, v2, v3 = job(1, 1), job(2, 2), job(3, 3)
    report = judged([v1, v2, v3], [sent(v1, 1.0), sent(v3, 2.0), sent(v2, 3.0)])
    assert report.reordered == 1 and report.examples["reordered"] == [3]
    # Another key, or a long-lane key, has no order with this one.
    other = job(4, 1, key="other")
    long_row = job(5, 1, key="k", lane="long")
    assert judged([v1, other, long_row], [sent(other, 0.5), sent(v1, 1.0),
                                          sent(long_row, 0.1)]).ok


def test_a_late_send_of_a_stopped_worker_is_left_out_of_the_order() -> None:
    """v1 was in hand of worker 7 when it was stopped; its send ends after the new owner
    sent v2 and v3: counted, allowed. The same from any other process is a reorder."""
    jobs = [job(1, 1), job(2, 2), job(3, 3)]
    deliveries = [sent(jobs[1], 2.0, pid=8), sent(jobs[2], 3.0, pid=8), sent(jobs[0], 4.0, pid=7)]
    report = judged(jobs, deliveries, in_doubt={1: 7})
    assert report.ok and (report.late_in_doubt, report.reordered) == (1, 0)
    assert judged(jobs, deliveries, in_doubt={1: 8}).reordered == 2


def test_an_at_least_once_resend_after_a_later_version_is_counted_not_failed() -> None:
    v1, v2 = job(1, 1, AT_LEAST_ONCE), job(2, 2, AT_LEAST_ONCE)
    report = judged([v1, v2], [sent(v1, 1.0), sent(v2, 2.0), sent(v1, 3.0)])
    assert report.ok and report.stale_resends == 1


def test_dead_is_wrong_unless_a_faulted_worker_had_the_at_most_once_row() -> None:
    delivered_dead, unsent_dead, alo_dead, other_pid = job(1, 1), job(2, 2), \
        job(3, 1, AT_LEAST_ONCE, key="q"), job(4, 3)
    jobs = [delivered_dead, unsent_dead, alo_dead, other_pid]
    rows = [Row(i, "DEAD", 0, "in flight when its partition was taken over") for i in (1, 2, 3, 4)]
    deliveries = [sent(delivered_dead, 1.0, pid=7), sent(other_pid, 2.0, pid=8)]
    assert judged(jobs, deliveries, rows).wrongly_dead == 4
    report = judged(jobs, deliveries, rows, in_doubt={1: 7, 2: 7, 3: 7, 4: 7})
    assert report.dead_in_doubt == 2 and report.examples["dead_in_doubt"] == [1, 2]
    assert report.wrongly_dead == 2 and report.examples["wrongly_dead"] == [3, 4]


def test_dead_with_an_allowed_reason_is_in_doubt_for_at_most_once_only() -> None:
    am, al = job(1, 1), job(2, 1, AT_LEAST_ONCE, key="q")
    rows = [Row(1, "DEAD", 0, "TargetOutcomeUnknown: no answer"),
            Row(2, "DEAD", 0, "TargetOutcomeUnknown: no answer")]
    report = judged([am, al], [sent(am, 1.0)], rows, in_doubt_reasons=("TargetOutcomeUnknown",))
    assert (report.dead_in_doubt, report.wrongly_dead) == (1, 1)


def test_delivered_but_still_pending_is_not_recorded() -> None:
    am = job(1, 1)
    report = judged([am], [sent(am, 1.0)], [Row(1, "PENDING", 0, "")])
    assert report.failures == {"not_recorded": 1}


def test_deliveries_of_no_job_or_not_matching_it_fail_and_other_rows_are_ignored() -> None:
    am = job(1, 1)
    wrong_version = Delivery(1, AM, "k", 9, 1, 2.0)
    stray = Delivery(99, AM, "k", 1, 1, 3.0)
    report = judged([am], [sent(am, 1.0), wrong_version, stray], [Row(500, "PENDING", 0, "")])
    assert report.unknown_deliveries == 2 and report.other_rows == 1
    assert report.failures == {"unknown_deliveries": 2}


def test_files_round_trip_and_a_cut_last_line_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "enqueued.txt").write_text(f"1 {AM} k 1 at_most_once fast\n2 {AM} - 0 at_")
    logs = tmp_path / "deliveries"
    logs.mkdir()
    (logs / "7.log").write_text(delivery_line(1, AM, "k", 1, 7, 12.5) + "deliver 2 t")
    assert read_enqueued(tmp_path / "enqueued.txt") == [job(1, 1)]
    assert read_deliveries(logs) == [Delivery(1, AM, "k", 1, 7, 12.5)]
