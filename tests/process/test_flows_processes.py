"""Flows in real ``run_workers`` processes on PostgreSQL: a chain that fails, is fixed and
resumed; a batch whose callback waits for two failed jobs; cancel refused while a step
runs and honoured for a waiting flow; a worker SIGKILLed mid-flow.

Steps run on the engine's flow target (the long lane) through the step handlers of
``worker_targets``, which record each try in ``<pid>.steps``; a step given
``{"fail_unless": f}`` fails until the test creates the file ``f``.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest

from jobs_engine import flows
from jobs_engine.errors import FlowRunning
from jobs_engine.flows import Step
from jobs_engine.models import Flow, FlowStep
from jobs_engine.states import FlowState, StepState
from tests.process.harness import WorkerCluster, wait_until
from tests.process.worker_targets import STEP, SUMMARY, StepRecord, read_step_records

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def state(flow_id: int) -> str:
    return Flow.objects.get(id=flow_id).state


def runs(cluster: WorkerCluster, flow_id: int, event: str = "start") -> list[StepRecord]:
    return [r for r in read_step_records(cluster.out_dir)
            if r.flow_id == flow_id and r.event == event]


def fix(cluster: WorkerCluster, flag: str) -> None:
    (cluster.out_dir / flag).touch()


def test_a_failed_chain_resumes_from_the_failed_step(cluster: WorkerCluster) -> None:
    cluster.out_dir.mkdir(parents=True, exist_ok=True)
    flow_id = flows.chain("report", [Step(STEP, {"n": 1}),
                                     Step(STEP, {"n": 2, "fail_unless": "fixed"}),
                                     Step(STEP, {"n": 3})])
    cluster.start("run_workers")
    wait_until(lambda: state(flow_id) == FlowState.FAILED, 60, "the chain to fail")
    steps = list(FlowStep.objects.filter(flow_id=flow_id).order_by("position")
                 .values_list("state", "attempts"))
    assert steps == [(StepState.DONE, 1), (StepState.FAILED, 3), (StepState.WAITING, 0)]
    assert [r.position for r in runs(cluster, flow_id)] == [0, 1, 1, 1]  # step 3 never ran

    fix(cluster, "fixed")
    assert flows.retry(flow_id).steps == 1
    wait_until(lambda: state(flow_id) == FlowState.COMPLETED, 60, "the chain to complete")
    assert [r.position for r in runs(cluster, flow_id)] == [0, 1, 1, 1, 1, 2]  # 1 not rerun
    last = FlowStep.objects.get(flow_id=flow_id, position=2)
    assert last.result == {"n": 3, "previous": {"n": 2, "previous": {"n": 1, "previous": None}}}
    assert [p.alive() for p in cluster.workers] == [True]


def test_a_batch_callback_waits_for_failed_jobs_and_gets_every_result(
        cluster: WorkerCluster) -> None:
    cluster.out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [Step(STEP, {"n": n, **({"fail_unless": "fixed"} if n in (7, 31) else {})})
            for n in range(50)]
    flow_id = flows.batch("import", jobs, on_complete=Step(SUMMARY))
    cluster.start("run_workers")
    wait_until(lambda: state(flow_id) == FlowState.FAILED
               and FlowStep.objects.filter(flow_id=flow_id, state=StepState.DONE).count() == 48
               and not FlowStep.objects.filter(flow_id=flow_id, state=StepState.QUEUED,
                                               role="job").exists(),
               90, "48 jobs done and 2 failed")
    callback = FlowStep.objects.get(flow_id=flow_id, role="callback")
    assert callback.state == StepState.WAITING
    assert not [r for r in runs(cluster, flow_id) if r.name == SUMMARY]

    fix(cluster, "fixed")
    assert flows.retry(flow_id).steps == 2
    wait_until(lambda: state(flow_id) == FlowState.COMPLETED, 60, "the batch to complete")
    assert FlowStep.objects.get(flow_id=flow_id, role="callback").result == list(range(50))
    done_once = [r.position for r in runs(cluster, flow_id, "end")]
    assert sorted(done_once) == list(range(51))  # every job, and the callback, ended once


def test_cancel_is_refused_while_a_step_runs_and_drops_a_waiting_flow(
        cluster: WorkerCluster) -> None:
    cluster.out_dir.mkdir(parents=True, exist_ok=True)
    waiting = flows.chain("waiting", [Step(STEP, {"n": 1}), Step(STEP, {"n": 2})])
    assert flows.cancel(waiting) == 2  # before any worker: nothing of it ever runs
    busy = flows.chain("busy", [Step(STEP, {"n": 1, "sleep": 4}), Step(STEP, {"n": 2})])
    cluster.start("run_workers")
    wait_until(lambda: runs(cluster, busy), 30, "the slow step to start")
    before = list(FlowStep.objects.filter(flow_id=busy).values_list("state", flat=True))
    with pytest.raises(FlowRunning):
        flows.cancel(busy)
    assert state(busy) == FlowState.RUNNING
    assert list(FlowStep.objects.filter(flow_id=busy).values_list("state", flat=True)) == before
    wait_until(lambda: state(busy) == FlowState.COMPLETED, 60, "the busy flow to complete")
    assert state(waiting) == FlowState.CANCELLED
    assert runs(cluster, waiting) == []


def test_a_flow_completes_after_its_worker_is_killed_mid_step(cluster: WorkerCluster
                                                              ) -> None:
    cluster.out_dir.mkdir(parents=True, exist_ok=True)
    flow_id = flows.chain("killed", [Step(STEP, {"n": 1}), Step(STEP, {"n": 2, "sleep": 3}),
                                     Step(STEP, {"n": 3})])
    first = cluster.start("run_workers")
    wait_until(lambda: [r for r in runs(cluster, flow_id) if r.position == 1], 30,
               "step 2 to start")
    first.send(signal.SIGKILL)
    first.wait_exit(10)
    cluster.start("run_workers")
    wait_until(lambda: state(flow_id) == FlowState.COMPLETED, 60,
               "the flow to complete after the lease ran out")
    ended: dict[Any, int] = {}
    for record in runs(cluster, flow_id, "end"):
        ended[record.position] = ended.get(record.position, 0) + 1
    assert ended == {0: 1, 1: 1, 2: 1}  # the killed step ran again; step 1 never did
    assert [r.position for r in runs(cluster, flow_id)].count(0) == 1
