"""Django's Tasks API (``django.tasks``) delivered by this engine.

Configure ``TASKS = {"default": {"BACKEND": "jobs_engine.tasks.JobsEngineBackend",
"QUEUES": ["default"]}}``; every queue runs on the long lane (``run_long_lane`` or
``run_workers``). See ``docs/tasks.md`` and ``docs/design.md``.
"""

from jobs_engine.tasks.backend import JobsEngineBackend
from jobs_engine.tasks.queues import TASKS_DELIVERY_MODE, TASKS_POLICY

__all__ = ["TASKS_DELIVERY_MODE", "TASKS_POLICY", "JobsEngineBackend"]
