"""The in-memory registry of targets: name → lane, handler and delivery rules.

Targets are registered from an app's ``ready()``; the engine imports no business app,
business apps register their targets here.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from jobs_engine.errors import DuplicateTarget, InvalidJob, UnknownTarget
from jobs_engine.job import Job
from jobs_engine.states import DeliveryMode, Lane

MAX_TARGET_NAME_LENGTH = 200


Handler = Callable[[Job], None]
# A batch handler takes the whole send and returns, per job and in order, None for
# success or the exception the per-row handler would have raised.
BatchHandler = Callable[[Sequence[Job]], Sequence[BaseException | None]]


@dataclass(frozen=True, kw_only=True)
class Target:
    name: str
    handler: Handler
    lane: Lane
    delivery_mode: DeliveryMode = DeliveryMode.AT_MOST_ONCE
    lossy: bool = False
    exclusive: bool = False
    max_attempts: int | None = None  # None: the JOBS MAX_ATTEMPTS setting
    retry_delays: tuple[float, ...] | None = None  # None: the JOBS RETRY_DELAYS setting
    batch_handler: BatchHandler | None = None
    # Fast lane: rows of this target read in one poll, and so handed in one send when
    # sends take the whole poll (a batch handler, at-least-once). None: JOBS FAST_BATCH.
    batch_size: int | None = None
    # Deprecated: handlers of this target get ``job.payload`` as the stored JSON text. Every
    # job now carries that text as ``job.payload_json`` and decodes ``payload`` only when
    # read, so a forwarding handler reads ``payload_json`` instead.
    payload_json: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # free for the target's owner


_targets: dict[str, Target] = {}
_lock = threading.Lock()


def register_target(
    name: str,
    handler: Handler,
    *,
    lane: Lane | str,
    delivery_mode: DeliveryMode | str = DeliveryMode.AT_MOST_ONCE,
    lossy: bool = False,
    exclusive: bool = False,
    max_attempts: int | None = None,
    retry_delays: Sequence[float] | None = None,
    batch_handler: BatchHandler | None = None,
    batch_size: int | None = None,
    payload_json: bool = False,
) -> Target:
    """Register a target; every check runs before the registry changes."""
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
    if max_attempts is not None and (isinstance(max_attempts, bool)
                                     or not isinstance(max_attempts, int) or max_attempts < 1):
        raise InvalidJob("max_attempts", f"must be an integer >= 1, got {max_attempts!r}")
    if batch_size is not None and (isinstance(batch_size, bool)
                                   or not isinstance(batch_size, int) or batch_size < 1):
        raise InvalidJob("batch_size", f"must be an integer >= 1, got {batch_size!r}")
    for flag, value in (("lossy", lossy), ("exclusive", exclusive),
                        ("payload_json", payload_json)):
        if not isinstance(value, bool):  # "no" or 0 would pass a truth test the wrong way
            raise InvalidJob(flag, f"must be True or False, got {value!r}")
    if payload_json:
        warnings.warn("register_target(payload_json=True) is deprecated: every job carries "
                      "its stored JSON text as job.payload_json (job.payload is decoded only "
                      "when read); read that instead", DeprecationWarning, stacklevel=2)
    delays: tuple[float, ...] | None = None
    if retry_delays is not None:
        delays = tuple(retry_delays)
        if not delays or any(isinstance(d, bool) or not isinstance(d, int | float) or d < 0
                             for d in delays):
            raise InvalidJob("retry_delays",
                             f"must be a non-empty list of seconds >= 0, got {retry_delays!r}")
    target = Target(
        name=name, handler=handler, lane=lane, delivery_mode=delivery_mode, lossy=lossy,
        exclusive=exclusive, max_attempts=max_attempts, retry_delays=delays,
        batch_handler=batch_handler, batch_size=batch_size, payload_json=payload_json,
    )
    with _lock:
        if name in _targets:
            raise DuplicateTarget(name)
        _targets[name] = target
    return target


def get_target(name: str) -> Target:
    try:
        return _targets[name]
    except (KeyError, TypeError):
        raise UnknownTarget(name) from None


def all_targets() -> list[Target]:
    return list(_targets.values())


def unregister_target(name: str) -> None:
    """Drop a target (tests and re-declaration); unknown names are ignored."""
    with _lock:
        _targets.pop(name, None)
