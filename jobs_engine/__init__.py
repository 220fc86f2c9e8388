"""jobs-engine: the durable, transactional job engine for Django.

The names below are the public API (docs/architecture.md#the-public-api); every other
module is the engine's own. They load lazily so ``import jobs_engine`` works before the app
registry is ready (settings modules, ``INSTALLED_APPS``).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

# The release's version, written here only: the package's metadata takes it from here
# (pyproject.toml's ``[tool.setuptools.dynamic]``), so the running code and the installed
# distribution cannot disagree, and it is right in a checkout that was never installed.
__version__ = "0.1.0"

_PUBLIC = {
    # enqueue, inside the caller's transaction
    "enqueue": "jobs_engine.enqueueing",
    "enqueue_many": "jobs_engine.enqueueing",
    "next_version": "jobs_engine.enqueueing",
    "EnqueueResult": "jobs_engine.enqueueing",
    # targets, their policies and what their handlers get
    "register_target": "jobs_engine.registry",
    "JobPolicy": "jobs_engine.policies",
    "DEFAULT_POLICY": "jobs_engine.policies",
    "RUN_ONCE_POLICY": "jobs_engine.policies",
    "Concurrency": "jobs_engine.limits",
    "Rate": "jobs_engine.limits",
    "PER_TARGET": "jobs_engine.limits",
    "PER_TENANT": "jobs_engine.limits",
    "PER_CODE": "jobs_engine.limits",
    "PER_LIMIT_KEY": "jobs_engine.limits",
    "per_field": "jobs_engine.limits",
    "Job": "jobs_engine.job",
    "Lane": "jobs_engine.states",
    "DeliveryMode": "jobs_engine.states",
    "JobStatus": "jobs_engine.states",
    # one job, for operators
    "get_job": "jobs_engine.inspection",
    "JobInfo": "jobs_engine.inspection",
    # handler outcomes
    "TargetUnreachable": "jobs_engine.errors",
    "TargetOutcomeUnknown": "jobs_engine.errors",
    "DeadNow": "jobs_engine.errors",
    "RateLimited": "jobs_engine.errors",
    # errors a caller may catch
    "JobsEngineError": "jobs_engine.errors",
    "UnknownTarget": "jobs_engine.errors",
    "DuplicateTarget": "jobs_engine.errors",
    "InvalidJob": "jobs_engine.errors",
    "InvalidPolicy": "jobs_engine.errors",
    "InvalidLimit": "jobs_engine.errors",
    # the DEAD alert
    "job_dead": "jobs_engine.signals",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'jobs_engine' has no attribute {name!r}")
