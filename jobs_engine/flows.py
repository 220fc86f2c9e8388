"""Flows: several jobs run as one unit, written in the caller's transaction.

A *chain* runs its steps one after the other, each handed what the previous one returned; a
*batch* runs its jobs independently, then a callback handed every job's result in order. The
flow row and every step are written by ``chain``/``batch`` inside the caller's
``transaction.atomic()``: a rollback leaves nothing, a commit leaves the whole flow, and a
worker restart loses none of it, like any queued job.

A step with no ``target`` runs on the engine's flow target (``FLOW_TARGET``), where the
handler registered under its name with ``register_step`` runs it; a step that names a
registered target runs as a job of that target, on its lane and under its policy. Flow
bookkeeping lives in the engine's own columns (``models.Flow``, ``models.FlowStep``), never
in a step's ``data``: no name in ``data`` is reserved.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from django.db import transaction
from django.utils import timezone

from jobs_engine import registry, store
from jobs_engine.conf import jobs_settings
from jobs_engine.context import current_tenant
from jobs_engine.enqueueing import enqueue_many
from jobs_engine.errors import (
    DeadNow,
    FlowNotFound,
    FlowRunning,
    InvalidFlow,
    InvalidStatus,
    NothingToRetry,
)
from jobs_engine.job import Job
from jobs_engine.models import Flow, FlowStep
from jobs_engine.states import FlowState, StepRole, StepState
from jobs_engine.tenancy import PLATFORM, Platform, Scope, tenant_for
from jobs_engine.text import clean, json_text, storable

logger = logging.getLogger("jobs_engine")

FLOW_TARGET = "jobs_engine:flow"
# A step's job carries this dedupe key prefix, so the outcome path looks for flow steps
# only among such jobs (the step itself is found by job id, never by the key), and
# retention leaves such jobs to their flow.
STEP_DEDUPE_PREFIX = store.FLOW_STEP_KEY_PREFIX
NAME_LIMIT = 200  # the name columns of ``Flow`` and ``FlowStep``


@dataclass(frozen=True, kw_only=True)
class StepContext:
    """What a step handler gets: its ``data``; in a chain, what the ``previous`` step
    returned (None for the first); for a batch callback, every job's ``results`` in order;
    the flow's ``tenant_id`` and ``flow_id``; the step's ``name`` and ``position``."""

    data: Any
    previous: Any = None
    results: tuple[Any, ...] = ()
    tenant_id: str | None = None
    flow_id: int
    name: str = ""
    position: int = 0


@dataclass(frozen=True)
class Step:
    """One step of a chain, one job of a batch, or a batch's callback: a step name, its
    JSON ``data``, and the target that runs it (None: the flow's default)."""

    name: str
    data: Any = None
    target: str | None = field(default=None, kw_only=True)


StepHandler = Callable[[StepContext], Any]
_step_handlers: dict[str, StepHandler] = {}


def register_step(name: str, handler: StepHandler) -> None:
    """Make ``handler`` run the steps called ``name`` on the flow target."""
    _check_name("name", name)
    if not callable(handler):
        raise InvalidFlow("handler", f"must be callable, got {type(handler).__name__}")
    _step_handlers[name] = handler


def step_handler(name: str) -> StepHandler | None:
    return _step_handlers.get(name)


def chain(name: str, steps: Sequence[Step], *, tenant_id: str | Platform | None = None,
          target: str | None = None, using: str | None = None) -> int:
    """Run ``steps`` one after the other; returns the flow's id. Written in the caller's
    transaction (its own when there is none). ``tenant_id``: the tenant the flow and its
    step jobs belong to; None: the tenant the caller serves, if any; ``PLATFORM``: none."""
    tenant = _tenant(tenant_id)
    planned = _plan(name, [("steps", StepRole.STEP, list(_steps("steps", steps)))], target)
    return _write(name, "chain", planned, tenant, using, first=1)


def batch(name: str, jobs: Sequence[Step], on_complete: Step, *,
          tenant_id: str | Platform | None = None, target: str | None = None,
          using: str | None = None) -> int:
    """Run ``jobs`` independently, then ``on_complete`` with every job's result in order;
    returns the flow's id. ``tenant_id`` as for ``chain``."""
    tenant = _tenant(tenant_id)
    if not isinstance(on_complete, Step):
        raise InvalidFlow("on_complete", f"must be a Step, got {type(on_complete).__name__}")
    jobs_list = list(_steps("jobs", jobs))
    planned = _plan(name, [("jobs", StepRole.JOB, jobs_list),
                           ("on_complete", StepRole.CALLBACK, [on_complete])], target)
    return _write(name, "batch", planned, tenant, using, first=len(jobs_list))


# -- checks: everything is refused before anything is written -------------------------------


@dataclass(frozen=True)
class _Planned:
    role: StepRole
    name: str
    target: str
    data: Any


def _check_name(where: str, value: Any) -> None:
    if not isinstance(value, str):
        raise InvalidFlow(where, f"must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InvalidFlow(where, "must not be empty")
    if len(value) > NAME_LIMIT:
        raise InvalidFlow(where, f"is {len(value)} characters, over {NAME_LIMIT}")
    if not storable(value):
        raise InvalidFlow(where, "holds a NUL character or a lone surrogate")


def _steps(where: str, steps: Any) -> Sequence[Step]:
    if isinstance(steps, str | bytes) or not isinstance(steps, Sequence):
        raise InvalidFlow(where, f"must be a list of Step, got {type(steps).__name__}")
    if not steps:
        raise InvalidFlow(where, "must not be empty")
    for index, step in enumerate(steps):
        if not isinstance(step, Step):
            raise InvalidFlow(f"{where}[{index}]", f"must be a Step, got {type(step).__name__}")
    return steps


def _tenant(given: Any) -> str | None:
    """The tenant a new flow belongs to (``chain``'s ``tenant_id``)."""
    try:
        return tenant_for(given, current_tenant())
    except ValueError as exc:
        raise InvalidFlow("tenant_id", str(exc)) from None


def _plan(name: str, groups: list[tuple[str, StepRole, list[Step]]], default_target: Any
          ) -> list[_Planned]:
    _check_name("name", name)
    if default_target is not None:
        _check_target("target", default_target)
    limit = jobs_settings().MAX_PAYLOAD_BYTES
    planned = []
    for where, role, steps in groups:
        for index, step in enumerate(steps):
            place = f"{where}[{index}]" if role is not StepRole.CALLBACK else where
            _check_name(f"{place}.name", step.name)
            target = step.target if step.target is not None else default_target
            if target is None:
                target = FLOW_TARGET
            else:
                _check_target(f"{place}.target", target)
            try:
                json_text(step.data, limit)
            except ValueError as exc:
                raise InvalidFlow(f"{place}.data", str(exc)) from None
            planned.append(_Planned(role, step.name, target, step.data))
    return planned


def _check_target(where: str, target: Any) -> None:
    _check_name(where, target)
    try:
        found = registry.get_target(target)
    except LookupError:
        raise InvalidFlow(where, f"no target named {target!r} is registered") from None
    if found.lossy:  # no row, no outcome: the flow would wait for the step forever
        raise InvalidFlow(where, f"{target!r} is a lossy target: its jobs are not stored, "
                                 "so no outcome would advance the flow")


# -- the write -------------------------------------------------------------------------------


def _write(name: str, kind: str, planned: list[_Planned], tenant_id: str | None,
           using: str | None, *, first: int) -> int:
    """The flow, its steps, and the jobs of its first ``first`` steps, in one transaction
    (the caller's when there is one)."""
    with transaction.atomic(using=using):
        flow = Flow.objects.using(using).create(name=name, kind=kind, state=FlowState.RUNNING,
                                                tenant_id=tenant_id, steps_total=len(planned))
        steps = FlowStep.objects.using(using).bulk_create([
            FlowStep(flow=flow, position=position, role=step.role, name=step.name,
                     target=step.target, data=step.data, state=StepState.WAITING)
            for position, step in enumerate(planned)])
        queue(steps[:first], tenant_id, using)
    return flow.id


class Queueable(Protocol):
    """What ``queue`` makes a job of: a step as written (``FlowStep``) or as read
    (``store.StepRow``)."""

    @property
    def id(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def target(self) -> str: ...
    @property
    def data(self) -> Any: ...
    @property
    def attempts(self) -> int: ...


def queue(steps: Sequence[Queueable], tenant_id: str | None, using: str | None) -> None:
    """Enqueue a job for each of ``steps`` (its data as the payload), of the flow's tenant
    (``tenant_id``; None: the platform's, never the caller's), and mark them QUEUED with
    that job; the caller holds the transaction."""
    tenant = PLATFORM if tenant_id is None else tenant_id
    results = enqueue_many([{"target": step.target, "payload": step.data, "code": step.name,
                             "dedupe_key": f"{STEP_DEDUPE_PREFIX}{step.id}:{step.attempts}",
                             "tenant_id": tenant} for step in steps], using=using)
    step_jobs: list[tuple[int, int]] = []
    for step, result in zip(steps, results, strict=True):
        assert result.job_id is not None, "a step's target is not lossy (_check_target)"
        step_jobs.append((step.id, result.job_id))
    store.flow_steps_queued(step_jobs, using)


# -- running a step, and what its outcome does to the flow -----------------------------------


def run_step(job: Job) -> Any:
    """The flow target's handler: the step handler registered under the step's name, with
    its context. An unknown name is a missing registration, never a completion."""
    step = FlowStep.objects.select_related("flow").get(job_id=job.id)
    handler = step_handler(step.name)
    if handler is None:
        raise DeadNow(f"no step handler registered for {step.name}")
    return handler(context_of(step))


def context_of(step: FlowStep) -> StepContext:
    """What the step's handler is handed (steps on other targets may ask for it too)."""
    flow = step.flow
    previous: Any = None
    results: tuple[Any, ...] = ()
    if step.role == StepRole.STEP and step.position > 0:
        previous = FlowStep.objects.get(flow=flow, position=step.position - 1).result
    elif step.role == StepRole.CALLBACK:
        results = tuple(FlowStep.objects.filter(flow=flow, role=StepRole.JOB)
                        .order_by("position").values_list("result", flat=True))
    return StepContext(data=step.data, previous=previous, results=results,
                       tenant_id=flow.tenant_id, flow_id=flow.id, name=step.name,
                       position=step.position)


def is_flow_step(job: Job) -> bool:
    return job.dedupe_key.startswith(STEP_DEDUPE_PREFIX)


@dataclass
class _Progress:
    """A flow locked by ``advance``, as its steps' outcomes change it."""

    flow: store.FlowRow
    state: str
    steps_done: int
    finished_at: datetime | None


def advance(done: Sequence[tuple[int, int, str | None]],
            failed: Sequence[tuple[int, int, str]], now: datetime,
            using: str | None = None) -> None:
    """Outcomes of step jobs, in the outcome's own transaction: a completed step records
    its result and queues what follows (the next chain step; the callback once every batch
    job is done); a failed one fails the flow and leaves the steps after it waiting.

    ``done``: (job id, tries, result JSON text); ``failed``: (job id, tries, error);
    ``using``: the database of every statement. The flows are locked before their steps,
    in id order, as ``retry`` and ``cancel`` lock them: concurrent outcomes and actions on
    one flow queue up instead of deadlocking, and its ``steps_done`` count says when the
    batch's jobs are all done (no scan of its steps). A handful of statements whatever the
    number of steps: their ends in one, what follows them read in one and queued per
    tenant, the flows written in one.
    """
    by_job = {job_id: (tries, payload) for job_id, tries, payload in [*done, *failed]}
    if not by_job:
        return
    finished = {job_id for job_id, _, _ in done}
    locked = {flow.id: _Progress(flow, flow.state, flow.steps_done, flow.finished_at)
              for flow in store.flows_lock_of_step_jobs(list(by_job), using)}
    ends: list[store.StepEnd] = []
    following: dict[tuple[int, int | None], str | None] = {}  # place -> the flow's tenant
    for step in store.flow_steps_lock_queued(list(by_job), using):
        assert step.job_id is not None, "found by its job"
        tries, payload = by_job[step.job_id]
        progress = locked[step.flow_id]
        if step.job_id in finished:
            ends.append(store.StepEnd(step.id, True, tries, payload))
            progress.steps_done += 1
            place = _after_done(progress, step, now)
            if place is not None:
                following[place] = progress.flow.tenant_id
        else:
            ends.append(store.StepEnd(step.id, False, tries, payload or ""))
            if progress.state == FlowState.RUNNING:
                progress.state, progress.finished_at = FlowState.FAILED.value, now
    store.flow_steps_end(ends, now, using)
    waiting = store.flow_steps_waiting_after(list(following), using)
    for tenant_id in dict.fromkeys(following.values()):
        steps = [step for step in waiting if locked[step.flow_id].flow.tenant_id == tenant_id]
        if steps:
            queue(steps, tenant_id, using)
    store.flows_record_progress([(p.flow.id, p.state, p.steps_done, p.finished_at)
                                 for p in locked.values()], now, using)


def _after_done(progress: _Progress, step: store.StepRow, now: datetime
                ) -> tuple[int, int | None] | None:
    """What a completed step lets run, as its place (``store.flow_steps_waiting_after``):
    the next chain step, or once every batch job is done the callback; None for nothing.
    After the last step the flow is COMPLETED."""
    flow = progress.flow
    if progress.steps_done == flow.steps_total:
        progress.state, progress.finished_at = FlowState.COMPLETED.value, now
        return None
    if progress.state != FlowState.RUNNING:
        return None  # failed meanwhile: what follows waits for a retry
    if step.role == StepRole.JOB:
        if progress.steps_done < flow.steps_total - 1:
            return None  # the callback waits for every job
        return flow.id, None
    return flow.id, step.position + 1


def register_flow_target() -> None:
    """The engine's flow target: the long lane (a step may run for minutes), retried by
    the default policy, at least once (a step handler should be idempotent)."""
    if FLOW_TARGET not in {target.name for target in registry.all_targets()}:
        registry.register_target(FLOW_TARGET, run_step, lane="long",
                                 delivery_mode="at_least_once")


# -- operator actions --------------------------------------------------------------------------


@dataclass(frozen=True)
class Retried:
    """What ``retry`` did: the steps queued again, and the DEAD jobs that had run them
    (replaced by new jobs, so a step never runs twice at once)."""

    steps: int
    replaced_jobs: tuple[int, ...]


def retry(flow_id: int, *, scope: Scope = PLATFORM, using: str | None = None) -> Retried:
    """Queue the failed steps again with a fresh set of attempts; the flow carries on and
    completed steps never run again. ``scope``: whose flows the caller may act on
    (``tenancy``); a flow out of it is ``FlowNotFound``, as an unknown id. ``using``: the
    database of every statement."""
    with transaction.atomic(using=using):
        flow = _locked(flow_id, scope, using)
        failed = store.flow_steps_in_state(flow.id, StepState.FAILED, using)
        if flow.state != FlowState.FAILED or not failed:
            raise NothingToRetry(f"flow {flow.id} is {flow.state}: no failed step to retry")
        replaced = []
        for step in failed:
            if step.job_id is not None and store.job_delete_if_dead(step.job_id,
                                                                     using) is not None:
                replaced.append(step.job_id)
        queue(failed, flow.tenant_id, using)
        store.flow_set_state(flow.id, FlowState.RUNNING, finished_at=None, now=timezone.now(),
                             using=using)
    return Retried(len(failed), tuple(replaced))


def cancel(flow_id: int, *, scope: Scope = PLATFORM, using: str | None = None) -> int:
    """Drop every step that has not run and mark the flow CANCELLED; returns how many steps
    were dropped. Refused (``FlowRunning``), changing nothing, while a step runs.
    ``scope`` and ``using`` as for ``retry``."""
    with transaction.atomic(using=using):
        flow = _locked(flow_id, scope, using)
        if flow.state in (FlowState.COMPLETED, FlowState.CANCELLED):
            raise InvalidStatus(f"flow {flow.id} is {flow.state}: nothing to cancel")
        for step in store.flow_steps_in_state(flow.id, StepState.QUEUED, using):
            if step.job_id is not None \
                    and store.job_delete_if_not_started(step.job_id, using) is None \
                    and store.jobs_still_stored([step.job_id], using):
                raise FlowRunning(f"flow {flow.id}: step {step.position} ({step.name}) is "
                                  "running; cancel it once the step has finished")
        now = timezone.now()
        dropped = store.flow_steps_cancel_unrun(flow.id, now, using)
        store.flow_set_state(flow.id, FlowState.CANCELLED, finished_at=now, now=now,
                             using=using)
    return dropped


def _locked(flow_id: Any, scope: Scope, using: str | None) -> store.FlowRow:
    """The flow, locked for this transaction; one out of ``scope`` is not found, like an
    unknown id."""
    if isinstance(flow_id, bool) or not isinstance(flow_id, int) or scope is None:
        raise FlowNotFound(flow_id)  # a caller of no tenant sees no flow (``scoped``)
    flow = store.flow_lock(flow_id, tenant_only=None if scope is PLATFORM else scope,
                           using=using)
    if flow is None:
        raise FlowNotFound(flow_id)
    return flow


# -- defined flows: startable by name, from code, the admin or the API -----------------------


@dataclass(frozen=True)
class ChainSpec:
    """What a definition's builder returns for a chain (``chain``'s arguments)."""

    steps: Sequence[Step]
    target: str | None = None


@dataclass(frozen=True)
class BatchSpec:
    """What a definition's builder returns for a batch (``batch``'s arguments)."""

    jobs: Sequence[Step]
    on_complete: Step
    target: str | None = None


@dataclass(frozen=True)
class Definition:
    name: str
    builder: Callable[[Any], ChainSpec | BatchSpec]
    description: str


_definitions: dict[str, Definition] = {}


def define(name: str, builder: Callable[[Any], ChainSpec | BatchSpec],
           description: str) -> Definition:
    """Declare a flow operators can start by name with an input; ``builder(input)``
    returns its chain or batch (and may raise ``InvalidFlow`` to refuse the input)."""
    _check_name("name", name)
    if not callable(builder):
        raise InvalidFlow("builder", f"must be callable, got {type(builder).__name__}")
    if not isinstance(description, str):
        raise InvalidFlow("description", f"must be a string, got {type(description).__name__}")
    definition = _definitions[name] = Definition(name, builder, description)
    return definition


def definitions() -> list[Definition]:
    return sorted(_definitions.values(), key=lambda d: d.name)


def start(name: str, input: Any = None, *, tenant_id: str | Platform | None = None,
          using: str | None = None) -> int:
    """Start the defined flow ``name`` with ``input``; returns the flow's id. An unknown
    name, an input that is not JSON or that the builder refuses: ``InvalidFlow``, nothing
    written. ``tenant_id`` as for ``chain``.

    A builder refuses an input by raising ``InvalidFlow``; any other exception it raises
    (a ``KeyError`` for a missing field, say) is taken as a refusal too, naming the flow
    and the error, since an input comes from an operator and must never fail a request."""
    if not isinstance(name, str) or name not in _definitions:
        raise InvalidFlow("name", f"no flow named {clean(name, 200)!r} is defined")
    try:
        json_text(input, jobs_settings().MAX_PAYLOAD_BYTES)
    except ValueError as exc:
        raise InvalidFlow("input", str(exc)) from None
    try:
        spec = _definitions[name].builder(input)
    except InvalidFlow:
        raise
    except Exception as exc:
        logger.warning("flow %s: its builder refused the input", name, exc_info=True)
        raise InvalidFlow("input", f"the builder of {name} refused it: "
                                   f"{type(exc).__name__}: {clean(exc, 300)}") from None
    with transaction.atomic(using=using):
        if isinstance(spec, ChainSpec):
            flow_id = chain(name, spec.steps, tenant_id=tenant_id, target=spec.target,
                            using=using)
        elif isinstance(spec, BatchSpec):
            flow_id = batch(name, spec.jobs, spec.on_complete, tenant_id=tenant_id,
                            target=spec.target, using=using)
        else:
            raise InvalidFlow("builder", f"the builder of {name} returned "
                                         f"{type(spec).__name__}, not a ChainSpec or BatchSpec")
        Flow.objects.using(using).filter(id=flow_id).update(definition=name)
    return flow_id
