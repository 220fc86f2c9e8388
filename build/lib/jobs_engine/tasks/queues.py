"""A backend's queues as the engine's targets: one long-lane target per queue, with the
queue's policy and delivery mode, all run by one handler (``running.run_task``).

``TASKS[alias]["OPTIONS"]`` is read here and nowhere else; a bad option raises
``InvalidTaskBackend`` naming it, before any target is registered.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.utils.module_loading import import_string

from jobs_engine import registry
from jobs_engine.policies import JobPolicy
from jobs_engine.states import DeliveryMode, Lane
from jobs_engine.tasks.compat import InvalidTaskBackend

# Django's Tasks API knows no retries: a task that raises is FAILED, as Django documents, so
# a queue tries once unless its policy says otherwise. Results are what callers come back
# for (``get_result``): ten thousand per queue are kept, completed and failed.
TASKS_POLICY = JobPolicy(attempts=1, backoff_s=1.0, keep_completed=10_000, keep_failed=10_000)
# A worker killed mid-task runs it again: a queue of tasks that must never run twice says
# ``"at_most_once"`` (the task is FAILED instead).
TASKS_DELIVERY_MODE = DeliveryMode.AT_LEAST_ONCE

OPTION_NAMES = ("POLICY", "DELIVERY_MODE", "QUEUE_OPTIONS")
QUEUE_OPTION_NAMES = ("POLICY", "DELIVERY_MODE")


@dataclass(frozen=True)
class QueueRules:
    """How the tasks of one queue run."""

    policy: JobPolicy
    delivery_mode: DeliveryMode


def target_name(alias: str, queue: str) -> str:
    """The engine target that runs the tasks of ``queue`` of the backend ``alias``."""
    return f"{registry.TASK_TARGET_PREFIX}{alias}:{queue}"


def queue_rules(alias: str, queues: Sequence[str], options: Any) -> dict[str, QueueRules]:
    """Every queue's rules from ``OPTIONS``; raises ``InvalidTaskBackend`` naming the
    setting that is wrong."""
    where = f"TASKS[{alias!r}]"
    if not queues:
        raise InvalidTaskBackend(f"{where}['QUEUES'] is empty: name every queue, so that the "
                                 "workers know which queues to run")
    if not isinstance(options, Mapping):
        raise InvalidTaskBackend(f"{where}['OPTIONS'] must be a dict, got {options!r}")
    _known(options, OPTION_NAMES, f"{where}['OPTIONS']")
    default = QueueRules(_policy(options.get("POLICY", TASKS_POLICY), f"{where}['OPTIONS']"),
                         _mode(options.get("DELIVERY_MODE", TASKS_DELIVERY_MODE),
                               f"{where}['OPTIONS']"))
    per_queue = options.get("QUEUE_OPTIONS", {})
    if not isinstance(per_queue, Mapping):
        raise InvalidTaskBackend(f"{where}['OPTIONS']['QUEUE_OPTIONS'] must be a dict of queue "
                                 f"name to options, got {per_queue!r}")
    rules = {}
    for queue in queues:
        if not isinstance(queue, str) or not queue or len(target_name(alias, queue)) > \
                registry.MAX_TARGET_NAME_LENGTH:
            raise InvalidTaskBackend(f"{where}['QUEUES']: {queue!r} is not a queue name (a "
                                     "non-empty string, at most "
                                     f"{registry.MAX_TARGET_NAME_LENGTH - 20} characters)")
        rules[queue] = default
    for queue, own in per_queue.items():
        at = f"{where}['OPTIONS']['QUEUE_OPTIONS'][{queue!r}]"
        if queue not in rules:
            raise InvalidTaskBackend(f"{at}: {queue!r} is not one of QUEUES {sorted(rules)}")
        if not isinstance(own, Mapping):
            raise InvalidTaskBackend(f"{at} must be a dict, got {own!r}")
        _known(own, QUEUE_OPTION_NAMES, at)
        rules[queue] = QueueRules(_policy(own.get("POLICY", default.policy), at),
                                  _mode(own.get("DELIVERY_MODE", default.delivery_mode), at))
    return rules


def _known(options: Mapping[str, Any], names: Sequence[str], at: str) -> None:
    unknown = sorted(set(options) - set(names), key=str)
    if unknown:
        raise InvalidTaskBackend(f"{at}[{unknown[0]!r}] is not an option; the options are "
                                 f"{', '.join(names)}")


def _policy(value: Any, at: str) -> JobPolicy:
    """A ``JobPolicy``, or the dotted path of one."""
    if isinstance(value, str):
        try:
            value = import_string(value)
        except ImportError as exc:
            raise InvalidTaskBackend(f"{at}['POLICY']: cannot import {value!r}: {exc}") from None
    if not isinstance(value, JobPolicy):
        raise InvalidTaskBackend(f"{at}['POLICY'] must be a JobPolicy or the dotted path of "
                                 f"one, got {value!r}")
    return value


def _mode(value: Any, at: str) -> DeliveryMode:
    try:
        return DeliveryMode(value)
    except ValueError:
        choices = ", ".join(mode.value for mode in DeliveryMode)
        raise InvalidTaskBackend(f"{at}['DELIVERY_MODE'] must be one of {choices}, "
                                 f"got {value!r}") from None


_lock = threading.Lock()


def register_queues(alias: str, rules: Mapping[str, QueueRules]) -> None:
    """Register (or re-register, when its rules changed) the target of every queue."""
    from jobs_engine.tasks.running import run_task

    with _lock:
        current = {target.name: target for target in registry.all_targets()}
        for queue, rule in rules.items():
            name = target_name(alias, queue)
            existing = current.get(name)
            if existing is not None and (existing.handler, existing.policy,
                                         existing.delivery_mode) == (run_task, rule.policy,
                                                                     rule.delivery_mode):
                continue
            registry.unregister_target(name)
            registry.register_target(name, run_task, lane=Lane.LONG,
                                     delivery_mode=rule.delivery_mode, policy=rule.policy)
