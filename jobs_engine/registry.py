"""The in-memory registry of targets: name → lane, handler and delivery rules.

Targets are registered from an app's ``ready()``; the engine imports no business app,
business apps register their targets here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from jobs_engine.errors import (
    DuplicateTarget,
    InvalidJob,
    InvalidLimit,
    InvalidPolicy,
    UnknownTarget,
)
from jobs_engine.job import Job
from jobs_engine.limits import NO_LIMITS, Concurrency, Limit, TargetLimits, target_limits
from jobs_engine.policies import DEFAULT_POLICY, JobPolicy
from jobs_engine.states import DeliveryMode, Lane

MAX_TARGET_NAME_LENGTH = 200
# Targets named so run the queues of Django's Tasks API (``jobs_engine.tasks``), one each.
TASK_TARGET_PREFIX = "tasks:"


# A handler returns nothing, or a JSON-serialisable result kept with the completed job.
Handler = Callable[[Job], Any]
# A batch handler takes the whole send and returns, per job and in order, the exception
# the per-row handler would have raised, or its result (None for none).
BatchHandler = Callable[[Sequence[Job]], Sequence[Any]]


@dataclass(frozen=True, kw_only=True)
class Target:
    name: str
    handler: Handler
    lane: Lane
    delivery_mode: DeliveryMode = DeliveryMode.AT_MOST_ONCE
    lossy: bool = False
    exclusive: bool = False
    policy: JobPolicy = DEFAULT_POLICY  # tries, backoff, and how many jobs are kept
    batch_handler: BatchHandler | None = None
    # Fast lane: rows of this target read in one poll, and so handed in one send when
    # sends take the whole poll (a batch handler, at-least-once). None: JOBS FAST_BATCH.
    batch_size: int | None = None
    limits: TargetLimits = NO_LIMITS  # concurrency and rate limits (``jobs_engine.limits``)
    extra: dict[str, Any] = field(default_factory=dict)  # free for the target's owner


_targets: dict[str, Target] = {}
_lock = threading.Lock()
_of_lane: dict[Lane, LaneTargets] = {}  # ``lane_targets``, until the registry changes


class LaneTargets(NamedTuple):
    """The targets of a lane a worker reads, and their names, as every poll passes them."""

    targets: tuple[Target, ...]
    names: tuple[str, ...]
    exclusive_names: tuple[str, ...]
    # Targets with limits: reserved by the admission (``store.limits``), not with the others.
    limited: tuple[Target, ...] = ()
    free_names: tuple[str, ...] = ()  # ``names`` less the limited ones


def register_target(
    name: str,
    handler: Handler,
    *,
    lane: Lane | str,
    delivery_mode: DeliveryMode | str = DeliveryMode.AT_MOST_ONCE,
    lossy: bool = False,
    exclusive: bool = False,
    policy: JobPolicy | None = None,
    batch_handler: BatchHandler | None = None,
    batch_size: int | None = None,
    limits: Sequence[Limit] | Limit | None = None,
) -> Target:
    """Register a target; every check runs before the registry changes.

    ``policy`` (a ``JobPolicy``; ``DEFAULT_POLICY`` when omitted) is the one way to set a
    target's retries and how many of its jobs are kept. ``limits`` (``Concurrency``,
    ``Rate``): how many of its jobs run at once and how often they start, across every
    worker (``jobs_engine.limits``).
    """
    if not isinstance(name, str) or not name.strip():
        raise InvalidJob("name", "must be a non-empty string")
    if len(name) > MAX_TARGET_NAME_LENGTH:
        raise InvalidJob("name", f"longer than {MAX_TARGET_NAME_LENGTH} characters")
    if not callable(handler):
        raise InvalidJob("handler", f"must be callable, got {type(handler).__name__}")
    if batch_handler is not None and not callable(batch_handler):
        raise InvalidJob("batch_handler", f"must be callable, got {type(batch_handler).__name__}")
    try:
        lane = Lane(lane)
    except ValueError:
        choices = [v.value for v in Lane]
        raise InvalidJob("lane", f"must be one of {choices}, got {lane!r}") from None
    try:
        delivery_mode = DeliveryMode(delivery_mode)
    except ValueError:
        choices = [v.value for v in DeliveryMode]
        raise InvalidJob("delivery_mode",
                         f"must be one of {choices}, got {delivery_mode!r}") from None
    if batch_size is not None and (isinstance(batch_size, bool)
                                   or not isinstance(batch_size, int) or batch_size < 1):
        raise InvalidJob("batch_size", f"must be an integer >= 1, got {batch_size!r}")
    for flag, value in (("lossy", lossy), ("exclusive", exclusive)):
        if not isinstance(value, bool):  # "no" or 0 would pass a truth test the wrong way
            raise InvalidJob(flag, f"must be True or False, got {value!r}")
    if policy is not None and not isinstance(policy, JobPolicy):
        raise InvalidPolicy("policy", f"must be a JobPolicy, got {type(policy).__name__}")
    checked_limits = target_limits(name, limits)
    if checked_limits and exclusive:
        raise InvalidLimit("limits", f"{name} is exclusive and has limits: declare "
                                     "Concurrency(1, per=PER_CODE) among its limits instead")
    if lane is Lane.FAST and any(isinstance(limit, Concurrency) for limit in checked_limits.limits):
        raise InvalidLimit("limits", f"{name} runs on the fast lane, which sends each "
                                     "partition's rows in turn: limit its starts with Rate, "
                                     "or run it on the long lane to cap its running jobs")
    if checked_limits and lossy:
        raise InvalidLimit("limits", f"{name} is lossy: its jobs are never stored, so no "
                                     "worker admits them")
    target = Target(
        name=name, handler=handler, lane=lane, delivery_mode=delivery_mode, lossy=lossy,
        exclusive=exclusive, policy=policy or DEFAULT_POLICY, batch_handler=batch_handler,
        batch_size=batch_size, limits=checked_limits,
    )
    with _lock:
        if name in _targets:
            raise DuplicateTarget(name)
        _targets[name] = target
        _of_lane.clear()
    return target


def get_target(name: str) -> Target:
    try:
        return _targets[name]
    except (KeyError, TypeError):
        raise UnknownTarget(name) from None


def policy_for(name: str) -> JobPolicy:
    """The policy of the target ``name``; ``DEFAULT_POLICY`` for a target not registered in
    this process (another release's, or one a deploy removed)."""
    target = _targets.get(name)
    return target.policy if target is not None else DEFAULT_POLICY


def all_targets() -> list[Target]:
    return list(_targets.values())


def lane_targets(lane: Lane) -> tuple[Target, ...]:
    """The targets of ``lane`` a worker reads (not lossy), by name: asked at every poll,
    made once until a target is registered or dropped (made at each poll, it cost every
    poll time in proportion to the registered targets)."""
    return lane_names(lane).targets


def lane_names(lane: Lane) -> LaneTargets:
    """``lane_targets`` with their names and the exclusive ones', made with them. The long
    lane's worker made both lists at each poll, on the thread a woken row's handler waits
    for: every wake-up did work in proportion to the registered targets."""
    with _lock:
        found = _of_lane.get(lane)
        if found is None:
            targets = tuple(sorted(
                (t for t in _targets.values() if t.lane is lane and not t.lossy),
                key=lambda t: t.name))
            found = _of_lane[lane] = LaneTargets(
                targets, tuple(t.name for t in targets),
                tuple(t.name for t in targets if t.exclusive),
                tuple(t for t in targets if t.limits),
                tuple(t.name for t in targets if not t.limits))
        return found


def unregister_target(name: str) -> None:
    """Drop a target (tests and re-declaration); unknown names are ignored."""
    with _lock:
        _targets.pop(name, None)
        _of_lane.clear()
