"""Flows: a chain or a batch is written whole in the caller's transaction, or not at all,
and malformed input is refused naming the field before anything is written."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import transaction

from jobs_engine import flows
from jobs_engine.errors import InvalidFlow
from jobs_engine.flows import FLOW_TARGET, Step
from jobs_engine.models import Flow, FlowStep, Job
from jobs_engine.states import FlowState, StepRole, StepState
from tests.helpers import drain_long_lane

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def flow_target() -> Any:
    """The engine registers its flow target when the app is ready."""
    from jobs_engine.registry import get_target

    return get_target(FLOW_TARGET)


def steps_of(flow_id: int) -> list[tuple[str, str, str, Any]]:
    return [(s.role, s.name, s.state, s.data)
            for s in FlowStep.objects.filter(flow_id=flow_id).order_by("position")]


def test_a_chain_is_written_whole_with_its_first_step_queued(flow_target: Any) -> None:
    with transaction.atomic():
        flow_id = flows.chain("monthly-report", [Step("report.query", {"month": "2026-11"}),
                                                 Step("report.render"), Step("report.mail")])
    flow = Flow.objects.get(id=flow_id)
    assert (flow.name, flow.kind, flow.state, flow.steps_total, flow.steps_done) == (
        "monthly-report", "chain", FlowState.RUNNING, 3, 0)
    assert steps_of(flow_id) == [
        (StepRole.STEP, "report.query", StepState.QUEUED, {"month": "2026-11"}),
        (StepRole.STEP, "report.render", StepState.WAITING, None),
        (StepRole.STEP, "report.mail", StepState.WAITING, None)]
    first = FlowStep.objects.get(flow_id=flow_id, position=0)
    job = Job.objects.get(id=first.job_id)
    assert (job.target, job.code, job.payload) == (FLOW_TARGET, "report.query",
                                                   {"month": "2026-11"})
    assert Job.objects.count() == 1  # the later steps wait: no job yet


def test_a_batch_queues_every_job_and_keeps_its_callback_waiting(flow_target: Any,
                                                                 targets: Any) -> None:
    targets("exports:generate", lane="long")
    flow_id = flows.batch("import", [Step("import.chunk", {"rows": [n]}) for n in range(3)]
                          + [Step("export", {"n": 1}, target="exports:generate")],
                          on_complete=Step("import.summary"), tenant_id="acme")
    assert Flow.objects.get(id=flow_id).tenant_id == "acme"
    assert [(role, name, state) for role, name, state, _ in steps_of(flow_id)] == [
        *[(StepRole.JOB, "import.chunk", StepState.QUEUED)] * 3,
        (StepRole.JOB, "export", StepState.QUEUED),
        (StepRole.CALLBACK, "import.summary", StepState.WAITING)]
    assert sorted(Job.objects.values_list("target", flat=True)) == [
        "exports:generate", *[FLOW_TARGET] * 3]


def test_target_on_the_call_is_every_unnamed_steps_default(targets: Any) -> None:
    targets("exports:generate", lane="long")
    targets("mail:send")
    flows.chain("c", [Step("a"), Step("b", target="mail:send")], target="exports:generate")
    assert list(FlowStep.objects.order_by("position").values_list("target", flat=True)) == [
        "exports:generate", "mail:send"]


def test_a_rollback_leaves_no_flow(flow_target: Any) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        flows.chain("c", [Step("a"), Step("b")])
        flows.batch("b", [Step("j")], on_complete=Step("done"))
        raise RuntimeError("rolled back")
    assert (Flow.objects.count(), FlowStep.objects.count(), Job.objects.count()) == (0, 0, 0)


@pytest.mark.parametrize(("call", "field"), [
    (lambda: flows.chain("c", []), "steps"),
    (lambda: flows.chain("c", "abc"), "steps"),
    (lambda: flows.chain("c", [Step("a"), "b"]), "steps[1]"),
    (lambda: flows.chain("c", [Step(7)]), "steps[0].name"),  # type: ignore[arg-type]
    (lambda: flows.chain("c", [Step("")]), "steps[0].name"),
    (lambda: flows.chain("c", [Step("a", {"x": object()})]), "steps[0].data"),
    (lambda: flows.chain("c", [Step("a", "\x00")]), "steps[0].data"),
    (lambda: flows.chain("x" * 201, [Step("a")]), "name"),
    (lambda: flows.chain(None, [Step("a")]), "name"),  # type: ignore[arg-type]
    (lambda: flows.chain("c", [Step("a", target="nowhere")]), "steps[0].target"),
    (lambda: flows.chain("c", [Step("a")], target="nowhere"), "target"),
    (lambda: flows.chain("c", [Step("a")], tenant_id=5), "tenant_id"),  # type: ignore[arg-type]
    (lambda: flows.batch("b", [], on_complete=Step("s")), "jobs"),
    (lambda: flows.batch("b", [Step("j")], on_complete="s"), "on_complete"),  # type: ignore[arg-type]
    (lambda: flows.batch("b", [Step("j")], on_complete=Step("s", [{1}])), "on_complete.data"),
])
def test_bad_input_is_refused_naming_the_field_and_writes_nothing(
        flow_target: Any, call: Any, field: str) -> None:
    with pytest.raises(InvalidFlow) as raised:
        call()
    assert raised.value.field == field
    assert str(raised.value).startswith(f"invalid_flow: {field}: ")
    assert (Flow.objects.count(), FlowStep.objects.count(), Job.objects.count()) == (0, 0, 0)


def test_a_lossy_target_is_refused_as_a_step_target(flow_target: Any, targets: Any) -> None:
    """A lossy target's job is never stored: its step was QUEUED with no job (job_id
    NULL) and no outcome ever advanced the flow, which stayed RUNNING for good."""
    targets("metrics:ping", lossy=True)
    for call, field in ((lambda: flows.chain("c", [Step("a", target="metrics:ping")]),
                         "steps[0].target"),
                        (lambda: flows.chain("c", [Step("a")], target="metrics:ping"),
                         "target")):
        with pytest.raises(InvalidFlow) as raised:
            call()
        assert raised.value.field == field and "lossy" in str(raised.value)
    assert (Flow.objects.count(), FlowStep.objects.count(), Job.objects.count()) == (0, 0, 0)


def test_register_step_refuses_a_name_that_is_not_a_string() -> None:
    with pytest.raises(InvalidFlow, match="name"):
        flows.register_step(3, lambda ctx: None)  # type: ignore[arg-type]
    with pytest.raises(InvalidFlow, match="handler"):
        flows.register_step("a", "not callable")  # type: ignore[arg-type]


# -- running: the long lane runs the steps, the outcome path advances the flow ---------------


@pytest.fixture
def steps() -> Any:
    """Register step handlers for one test; each call is recorded as (name, context)."""
    calls: list[tuple[str, flows.StepContext]] = []
    names: list[str] = []

    def register(name: str, handler: Any) -> None:
        def recorded(ctx: flows.StepContext) -> Any:
            calls.append((name, ctx))
            return handler(ctx)
        flows.register_step(name, recorded)
        names.append(name)

    register.calls = calls  # type: ignore[attr-defined]
    yield register
    for name in names:
        flows._step_handlers.pop(name, None)


def flow_state(flow_id: int) -> str:
    return Flow.objects.get(id=flow_id).state


def test_a_chain_hands_each_step_the_previous_result(flow_target: Any, steps: Any) -> None:
    steps("r.query", lambda ctx: {"rows": ctx.data["month"]})
    steps("r.render", lambda ctx: f"report of {ctx.previous['rows']}")
    steps("r.mail", lambda ctx: {"sent": ctx.previous, "tenant": ctx.tenant_id})
    flow_id = flows.chain("monthly", [Step("r.query", {"month": "11"}), Step("r.render"),
                                      Step("r.mail")], tenant_id="acme")
    drain_long_lane(lambda: flow_state(flow_id) != FlowState.RUNNING)
    flow = Flow.objects.get(id=flow_id)
    assert (flow.state, flow.steps_done) == (FlowState.COMPLETED, 3)
    assert flow.finished_at is not None
    assert [name for name, _ in steps.calls] == ["r.query", "r.render", "r.mail"]
    assert [s.result for s in FlowStep.objects.filter(flow_id=flow_id).order_by("position")] == [
        {"rows": "11"}, "report of 11", {"sent": "report of 11", "tenant": "acme"}]
    assert all(ctx.flow_id == flow_id for _, ctx in steps.calls)


def test_a_batch_callback_gets_every_result_in_order(flow_target: Any, steps: Any) -> None:
    steps("chunk", lambda ctx: ctx.data * 10)
    steps("summary", lambda ctx: sum(ctx.results))
    flow_id = flows.batch("import", [Step("chunk", n) for n in range(5)],
                          on_complete=Step("summary"))
    drain_long_lane(lambda: flow_state(flow_id) != FlowState.RUNNING)
    callback = FlowStep.objects.get(flow_id=flow_id, role=StepRole.CALLBACK)
    assert flow_state(flow_id) == FlowState.COMPLETED
    assert steps.calls[-1][1].results == (0, 10, 20, 30, 40)
    assert callback.result == 100


def test_a_failed_step_fails_the_flow_and_the_rest_wait(flow_target: Any, steps: Any) -> None:
    steps("one", lambda ctx: 1)

    def broken(ctx: flows.StepContext) -> Any:
        raise RuntimeError("render broke")

    steps("two", broken)
    steps("three", lambda ctx: 3)
    flow_id = flows.chain("c", [Step("one"), Step("two"), Step("three")])
    drain_long_lane(lambda: flow_state(flow_id) != FlowState.RUNNING)
    assert flow_state(flow_id) == FlowState.FAILED
    states = dict(FlowStep.objects.filter(flow_id=flow_id).values_list("name", "state"))
    assert states == {"one": StepState.DONE, "two": StepState.FAILED,
                      "three": StepState.WAITING}
    two = FlowStep.objects.get(flow_id=flow_id, name="two")
    assert (two.attempts, two.last_error) == (3, "RuntimeError: render broke (attempt 3 of 3)")
    assert [name for name, _ in steps.calls].count("three") == 0


def test_an_unknown_step_name_fails_that_step_never_completes_it(flow_target: Any) -> None:
    flow_id = flows.chain("c", [Step("nobody.handles.this")])
    drain_long_lane(lambda: flow_state(flow_id) != FlowState.RUNNING)
    step = FlowStep.objects.get(flow_id=flow_id)
    assert (flow_state(flow_id), step.state) == (FlowState.FAILED, StepState.FAILED)
    assert "no step handler registered for nobody.handles.this" in step.last_error


def _reserve_step_jobs() -> tuple[str, dict[int, Any]]:
    """The flow target's queued step jobs, reserved and started under one claim token, as
    a long-lane worker holds them: (token, job id -> Job)."""
    from django.utils import timezone

    from jobs_engine import store

    token = uuid.uuid4().hex
    reserved = store.jobs_long_reserve("flows-worker", token, timezone.now(), 300, 50,
                                       targets=[FLOW_TARGET], start=True)
    return token, {r.job.id: r.job for r in reserved}


def _step(flow_id: int, position: int) -> FlowStep:
    return FlowStep.objects.get(flow_id=flow_id, position=position)


def test_one_write_of_step_outcomes_advances_each_flow_and_queues_what_follows(
        flow_target: Any) -> None:
    """The outcome path writes several step jobs' outcomes at once (the long lane's group
    commit): each flow advances as if alone. The next chain step is queued for its flow's
    tenant, a batch's callback once when its last jobs end together, and a failed step
    fails its flow and leaves the step after it waiting."""
    from datetime import timedelta

    from django.utils import timezone

    from jobs_engine import conf, store
    from jobs_engine.lanes import outcomes
    from jobs_engine.lanes.outcomes import Outcome, RunResult
    from jobs_engine.states import Lane

    a = flows.chain("a", [Step("a0"), Step("a1")], tenant_id="tenant-a")
    b = flows.chain("b", [Step("b0"), Step("b1")], tenant_id="tenant-b")
    c = flows.chain("c", [Step("c0"), Step("c1")])
    d = flows.batch("d", [Step("d0"), Step("d1")], on_complete=Step("d.sum"))
    token, jobs = _reserve_step_jobs()
    assert len(jobs) == 5

    def result(flow_id: int, position: int, outcome: Outcome, result_json: str | None = None
               ) -> RunResult:
        return RunResult(jobs[_step(flow_id, position).job_id], outcome, 1.0, result_json)

    now = timezone.now() + timedelta(minutes=5)
    results = [result(a, 0, Outcome.ok(), '{"from": "a0"}'), result(b, 0, Outcome.ok()),
               result(c, 0, Outcome.dead("DeadNow: no")), result(d, 0, Outcome.ok(), "1"),
               result(d, 1, Outcome.ok(), "2")]
    written = outcomes.record(store.Guard(Lane.LONG, token), results, now,
                              conf.jobs_settings())
    assert sorted(r.job.id for r in written) == sorted(r.job.id for r in results)

    for flow_id, tenant, first_result in ((a, "tenant-a", {"from": "a0"}), (b, "tenant-b", None)):
        first, following = _step(flow_id, 0), _step(flow_id, 1)
        assert (first.state, first.result, first.attempts, first.finished_at) == (
            StepState.DONE, first_result, 1, now)
        assert following.state == StepState.QUEUED
        assert Job.objects.get(id=following.job_id).tenant_id == tenant
    failed, waiting = _step(c, 0), _step(c, 1)
    assert (failed.state, failed.last_error, failed.attempts) == (
        StepState.FAILED, "DeadNow: no", 1)
    assert (waiting.state, waiting.job_id) == (StepState.WAITING, None)
    callback = FlowStep.objects.get(flow_id=d, role=StepRole.CALLBACK)
    assert callback.state == StepState.QUEUED
    assert Job.objects.filter(dedupe_key__startswith=f"flow-step:{callback.id}:").count() == 1
    assert Job.objects.get(id=callback.job_id).tenant_id is None
    assert [_step(d, n).result for n in (0, 1)] == [1, 2]
    progress = {f.id: (f.state, f.steps_done, f.finished_at, f.updated_at)
                for f in Flow.objects.all()}
    assert progress == {a: (FlowState.RUNNING, 1, None, now),
                        b: (FlowState.RUNNING, 1, None, now),
                        c: (FlowState.FAILED, 0, now, now),
                        d: (FlowState.RUNNING, 2, None, now)}


def test_a_steps_outcome_locks_its_flow_before_its_step(flow_target: Any) -> None:
    """The outcome of a step's job reads (and on PostgreSQL locks) its flow, then its step,
    the order in which ``retry`` and ``cancel`` lock them: concurrent outcomes and actions
    on one flow queue up instead of deadlocking."""
    import re

    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from jobs_engine import conf, store
    from jobs_engine.lanes import outcomes
    from jobs_engine.lanes.outcomes import Outcome, RunResult
    from jobs_engine.states import Lane

    flow_id = flows.chain("c", [Step("s0"), Step("s1")])
    token, jobs = _reserve_step_jobs()
    [job] = jobs.values()
    with CaptureQueriesContext(connection) as queries:
        outcomes.record(store.Guard(Lane.LONG, token), [RunResult(job, Outcome.ok(), 1.0)],
                        timezone.now(), conf.jobs_settings())
    assert _step(flow_id, 1).state == StepState.QUEUED

    def read_from(sql: str) -> str | None:
        found = re.match(r"SELECT .*? FROM (jobs_engine_flow\w*)", sql)
        return found.group(1) if found else None

    sql = [q["sql"] for q in queries]
    reads = [table for table in map(read_from, sql) if table is not None]
    assert reads[:2] == ["jobs_engine_flow", "jobs_engine_flowstep"]
    locks = [read_from(s) for s in sql if s.rstrip().endswith("FOR UPDATE")]
    if connection.vendor == "postgresql":
        assert locks == ["jobs_engine_flow", "jobs_engine_flowstep"]
    else:  # one writer at a time holds the whole database
        assert locks == []


def test_flow_bookkeeping_runs_every_statement_on_the_database_it_is_given(
        flow_target: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``advance`` (the outcome path), ``retry`` and ``cancel`` pass ``using`` to every
    store function and enqueue they call (what follows a step and a retried step were
    queued on the default database whatever the caller's)."""
    import inspect

    from django.db import DEFAULT_DB_ALIAS
    from django.utils import timezone

    from jobs_engine import store

    flow_id = flows.chain("c", [Step("s0"), Step("s1")], using=DEFAULT_DB_ALIAS)
    seen: list[tuple[str, Any]] = []

    def spy(name: str, function: Any) -> Any:
        signature = inspect.signature(function)

        def called(*args: Any, **kwargs: Any) -> Any:
            seen.append((name, signature.bind(*args, **kwargs).arguments.get("using")))
            return function(*args, **kwargs)

        return called

    for name in store.__all__:
        function = getattr(store, name)
        if inspect.isfunction(function) and "using" in inspect.signature(function).parameters:
            monkeypatch.setattr(store, name, spy(name, function))
    monkeypatch.setattr(flows, "enqueue_many", spy("enqueue_many", flows.enqueue_many))

    now = timezone.now()
    with transaction.atomic():
        flows.advance([], [(_step(flow_id, 0).job_id, 1, "RuntimeError: no")], now,
                      using=DEFAULT_DB_ALIAS)
    assert flows.retry(flow_id, using=DEFAULT_DB_ALIAS).steps == 1
    with transaction.atomic():
        flows.advance([(_step(flow_id, 0).job_id, 1, '"ok"')], [], now,
                      using=DEFAULT_DB_ALIAS)
    assert _step(flow_id, 1).state == StepState.QUEUED
    assert flows.cancel(flow_id, using=DEFAULT_DB_ALIAS) == 1
    assert flow_state(flow_id) == FlowState.CANCELLED

    assert {name for name, _ in seen} >= {
        "flows_lock_of_step_jobs", "flow_steps_lock_queued", "flow_steps_end",
        "flow_steps_waiting_after", "flows_record_progress", "flow_lock",
        "flow_steps_in_state", "flow_steps_queued", "flow_set_state", "job_delete_if_dead",
        "job_delete_if_not_started", "flow_steps_cancel_unrun", "enqueue_many"}
    assert {using for _, using in seen} == {DEFAULT_DB_ALIAS}


# -- retry and cancel ----------------------------------------------------------------------------


def test_retry_queues_only_the_failed_step_and_the_flow_carries_on(flow_target: Any,
                                                                   steps: Any) -> None:
    fixed = {"render": False}

    def render(ctx: flows.StepContext) -> Any:
        if not fixed["render"]:
            raise RuntimeError("render broke")
        return f"rendered {ctx.previous}"

    steps("one", lambda ctx: 1)
    steps("two", render)
    steps("three", lambda ctx: {"got": ctx.previous})
    flow_id = flows.chain("c", [Step("one"), Step("two"), Step("three")])
    drain_long_lane(lambda: flow_state(flow_id) != FlowState.RUNNING)
    assert flow_state(flow_id) == FlowState.FAILED
    fixed["render"] = True
    dead_job = FlowStep.objects.get(flow_id=flow_id, name="two").job_id
    assert flows.retry(flow_id) == flows.Retried(1, (dead_job,))
    assert flow_state(flow_id) == FlowState.RUNNING
    drain_long_lane(lambda: flow_state(flow_id) != FlowState.RUNNING)
    assert flow_state(flow_id) == FlowState.COMPLETED
    names = [name for name, _ in steps.calls]
    assert names.count("one") == 1 and names.count("three") == 1
    assert FlowStep.objects.get(flow_id=flow_id, name="three").result == {"got": "rendered 1"}
    assert FlowStep.objects.get(flow_id=flow_id, name="two").attempts == 4  # 3 failed, 1 ok
    assert not Job.objects.filter(status="DEAD").exists()  # the failed job was replaced


def test_retry_with_nothing_failed_is_refused(flow_target: Any, steps: Any) -> None:
    from jobs_engine.errors import NothingToRetry

    flow_id = flows.chain("c", [Step("a")])
    with pytest.raises(NothingToRetry, match="no failed step"):
        flows.retry(flow_id)
    assert flow_state(flow_id) == FlowState.RUNNING


def test_cancel_drops_what_has_not_run(flow_target: Any, steps: Any) -> None:
    flow_id = flows.chain("c", [Step("a"), Step("b")])
    assert flows.cancel(flow_id) == 2
    assert flow_state(flow_id) == FlowState.CANCELLED
    assert set(FlowStep.objects.values_list("state", flat=True)) == {StepState.CANCELLED}
    assert not Job.objects.exists()


def test_cancel_while_a_step_runs_is_refused_and_changes_nothing(flow_target: Any,
                                                                 steps: Any) -> None:
    from django.utils import timezone

    from jobs_engine.errors import FlowRunning

    flow_id = flows.chain("c", [Step("a"), Step("b")])
    first = FlowStep.objects.get(flow_id=flow_id, position=0)
    Job.objects.filter(id=first.job_id).update(status="RUNNING", started_at=timezone.now(),
                                               claim_token="t", claimed_by="w")
    with pytest.raises(FlowRunning, match="step 0 \\(a\\) is running"):
        flows.cancel(flow_id)
    assert flow_state(flow_id) == FlowState.RUNNING
    assert list(FlowStep.objects.filter(flow_id=flow_id).order_by("position")
                .values_list("state", flat=True)) == [StepState.QUEUED, StepState.WAITING]
    assert Job.objects.filter(id=first.job_id, status="RUNNING").exists()


def test_another_tenants_flow_is_not_found(flow_target: Any) -> None:
    from jobs_engine.errors import FlowNotFound

    flow_id = flows.chain("c", [Step("a")], tenant_id="b")
    for scope in ("a", None):  # another tenant, and a caller of no tenant
        with pytest.raises(FlowNotFound):
            flows.cancel(flow_id, scope=scope)
        with pytest.raises(FlowNotFound):
            flows.retry(flow_id, scope=scope)
    assert flow_state(flow_id) == FlowState.RUNNING
    assert flows.cancel(flow_id, scope="b") == 1


# -- defined flows ------------------------------------------------------------------------------


def test_a_defined_flow_starts_by_name(flow_target: Any, monthly: Any) -> None:
    assert monthly in flows.definitions()
    flow_id = flows.start("monthly-report", "2026-11", tenant_id="acme")
    flow = Flow.objects.get(id=flow_id)
    assert (flow.name, flow.definition, flow.kind, flow.tenant_id) == (
        "monthly-report", "monthly-report", "chain", "acme")
    assert FlowStep.objects.get(flow=flow, position=0).data == {"month": "2026-11"}


@pytest.mark.parametrize(("name", "value", "field"), [
    ("nobody-defined-this", "2026-11", "name"),
    (None, "2026-11", "name"),
    ("monthly-report", 11, "input"),  # the builder refuses it
    ("monthly-report", {"x": {1, 2}}, "input"),  # not JSON
])
def test_start_refuses_an_unknown_name_or_a_bad_input_and_writes_nothing(
        flow_target: Any, monthly: Any, name: Any, value: Any, field: str) -> None:
    with pytest.raises(InvalidFlow) as raised:
        flows.start(name, value)
    assert raised.value.field == field
    assert (Flow.objects.count(), FlowStep.objects.count(), Job.objects.count()) == (0, 0, 0)


# -- retention ------------------------------------------------------------------------------


def test_step_jobs_stay_with_their_flow_whatever_the_keep_counts(
        flow_target: Any, steps: Any, targets: Any) -> None:
    """A target that keeps no completed job still keeps its flow steps' jobs; the flow,
    its steps and their jobs go together FLOW_RETENTION_DAYS after the flow finished."""
    from datetime import timedelta

    from django.utils import timezone

    from jobs_engine import JobPolicy
    from jobs_engine.conf import load_settings
    from jobs_engine.lanes.retention import RetentionService
    from jobs_engine.models import CompletedJob

    targets("keeps.none", handler=lambda job: {"n": job.payload}, lane="long",
            policy=JobPolicy(keep_completed=0, keep_failed=0))
    flow_id = flows.batch("b", [Step("j", n, target="keeps.none") for n in range(3)],
                          on_complete=Step("sum"))
    steps("sum", lambda ctx: [r["n"] for r in ctx.results])
    drain_long_lane(lambda: flow_state(flow_id) != FlowState.RUNNING)
    assert flow_state(flow_id) == FlowState.COMPLETED
    step_jobs = list(FlowStep.objects.filter(flow_id=flow_id).values_list("job_id", flat=True))
    assert CompletedJob.objects.filter(id__in=step_jobs).count() == 4

    now = timezone.now()
    settings = load_settings({"FLOW_RETENTION_DAYS": 7}, environ={})
    kept = RetentionService(settings).run_once(now + timedelta(days=6))
    assert (kept.completed, kept.flows) == (0, 0)
    assert CompletedJob.objects.filter(id__in=step_jobs).count() == 4
    gone = RetentionService(settings).run_once(now + timedelta(days=8))
    assert gone.flows == 1
    assert not Flow.objects.filter(id=flow_id).exists()
    assert not FlowStep.objects.exists()
    assert not CompletedJob.objects.filter(id__in=step_jobs).exists()


def test_a_failed_flow_keeps_its_dead_job_until_the_flow_expires(
        flow_target: Any, steps: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from jobs_engine.conf import load_settings
    from jobs_engine.lanes.retention import RetentionService

    def broken(ctx: flows.StepContext) -> Any:
        raise RuntimeError("no")

    steps("x", broken)
    flow_id = flows.chain("c", [Step("x")])
    drain_long_lane(lambda: flow_state(flow_id) != FlowState.RUNNING)
    dead = FlowStep.objects.get(flow_id=flow_id).job_id
    now = timezone.now()
    # Past DEAD_TTL_DAYS and keep_failed=0 would remove any other DEAD job.
    settings = load_settings({"FLOW_RETENTION_DAYS": 40, "DEAD_TTL_DAYS": 1}, environ={})
    RetentionService(settings).run_once(now + timedelta(days=30))
    assert Job.objects.filter(id=dead, status="DEAD").exists()
    assert flows.retry(flow_id).steps == 1  # still resumable
