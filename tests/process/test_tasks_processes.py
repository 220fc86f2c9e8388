"""Django's Tasks API delivered by real ``run_long_lane`` processes on PostgreSQL: tasks
enqueued in transactions all run once and read back SUCCESSFUL; ``run_after`` is honoured
to the second; a worker SIGKILLed mid-task means a rerun on an at-least-once queue and a
FAILED result on an at-most-once one, each recording the lost try.

The tasks are ``tests.task_functions``; ``record`` appends ``start``/``end`` lines to a
file of its process, so a test sees every run, including one a SIGKILL cut short.
"""

from __future__ import annotations

import signal
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import transaction
from django.utils import timezone

from jobs_engine.tasks import JobsEngineBackend
from jobs_engine.tasks.compat import TaskResultStatus, task_backends
from tests import task_functions as tasks
from tests.process.harness import WorkerCluster, wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED


def runs(out_dir: Path, event: str) -> list[tuple[str, float]]:
    """(label, unix time) of every ``event`` line the ``record`` tasks wrote."""
    found = []
    for path in out_dir.glob("*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[0] == event:
                found.append((parts[1], float(parts[3])))
    return found


def _backend() -> JobsEngineBackend:
    return task_backends["default"]


def status(result_id: str) -> TaskResultStatus:
    return _backend().get_result(result_id).status


def test_tasks_enqueued_in_transactions_all_run_once(cluster: WorkerCluster) -> None:
    out = str(cluster.out_dir)
    ids = []
    for batch in range(4):
        with transaction.atomic():
            ids += [tasks.record.enqueue(f"t{batch}-{n}", out).id for n in range(50)]
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.record.enqueue("rolled-back", out)
        raise RuntimeError("rolled back")
    cluster.start("run_long_lane")
    wait_until(lambda: all(status(i) == SUCCESSFUL for i in ids), 60, "200 tasks to succeed")
    labels = [label for label, _ in runs(cluster.out_dir, "end")]
    assert sorted(labels) == sorted(f"t{b}-{n}" for b in range(4) for n in range(50))
    result = _backend().get_result(ids[0])
    assert result.return_value == "t0-0" and len(result.worker_ids) == 1


def test_run_after_is_honoured_to_the_second(cluster: WorkerCluster) -> None:
    cluster.start("run_long_lane")
    time.sleep(1)  # the worker is idle: nothing wakes it but the deferred task coming due
    run_after = timezone.now() + timedelta(seconds=3)
    result = tasks.record.using(run_after=run_after).enqueue("later", str(cluster.out_dir))
    wait_until(lambda: status(result.id) == SUCCESSFUL, 20, "the deferred task to run")
    [(_, started)] = runs(cluster.out_dir, "start")
    assert run_after.timestamp() <= started < run_after.timestamp() + 1.0


@pytest.mark.parametrize(("task", "delivery"), [(tasks.record, "at_least_once"),
                                                (tasks.record_once, "at_most_once")])
def test_a_worker_killed_mid_task_reruns_or_fails_it_as_its_queue_says(
        cluster: WorkerCluster, task: object, delivery: str) -> None:
    result = task.enqueue("killed", str(cluster.out_dir), 30)  # type: ignore[attr-defined]
    first = cluster.start("run_long_lane", name="first")
    wait_until(lambda: runs(cluster.out_dir, "start"), 30, "the task to start")
    assert _backend().get_result(result.id).status == TaskResultStatus.RUNNING
    first.send(signal.SIGKILL)
    first.wait_exit(10)
    # The second worker rescues the row once the killed worker's lease has run out.
    cluster.start("run_long_lane", name="second")
    if delivery == "at_least_once":
        wait_until(lambda: len(runs(cluster.out_dir, "start")) == 2, 60, "the rerun to start")
        final = _backend().get_result(result.id)
        assert final.status == TaskResultStatus.RUNNING and final.attempts == 2
        lost = final.errors[0]
        assert lost.exception_class_path == "jobs_engine.errors.WorkerLost"
        assert len(set(final.worker_ids)) == 2
    else:
        wait_until(lambda: status(result.id) == FAILED, 60, "the task to be FAILED")
        final = _backend().get_result(result.id)
        assert final.attempts == 1 and len(runs(cluster.out_dir, "start")) == 1
        assert [e.exception_class_path for e in final.errors] == ["jobs_engine.errors.WorkerLost"]
        assert "not run twice" in final.errors[0].traceback
