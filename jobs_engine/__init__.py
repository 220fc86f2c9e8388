"""jobs-engine: the durable, transactional job engine for Django.

The public names load lazily so ``import jobs_engine`` works before the app registry
is ready (settings modules, ``INSTALLED_APPS``).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_PUBLIC = {
    "enqueue": "jobs_engine.enqueueing",
    "enqueue_many": "jobs_engine.enqueueing",
    "next_version": "jobs_engine.enqueueing",
    "EnqueueResult": "jobs_engine.enqueueing",
    "register_target": "jobs_engine.registry",
    "Job": "jobs_engine.registry",
    "Lane": "jobs_engine.states",
    "DeliveryMode": "jobs_engine.states",
    "JobStatus": "jobs_engine.states",
    "TargetUnreachable": "jobs_engine.errors",
    "TargetOutcomeUnknown": "jobs_engine.errors",
    "DeadNow": "jobs_engine.errors",
    "UnknownTarget": "jobs_engine.errors",
    "DuplicateTarget": "jobs_engine.errors",
    "InvalidJob": "jobs_engine.errors",
    "job_dead": "jobs_engine.signals",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'jobs_engine' has no attribute {name!r}")
