"""Helpers of the operator-surface tests (admin, API, operations, statistics): job rows
in a given state, made through the real enqueue path, and users with or without the
engine's manage permission."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from jobs_engine.enqueueing import enqueue
from jobs_engine.models import Job
from jobs_engine.states import JobStatus


def make_job(target: str, *, status: str = JobStatus.PENDING, key: str | None = None,
             payload: Any = None, headers: dict[str, str] | None = None,
             code: str | None = None, **fields: Any) -> Job:
    """Enqueue one row of ``target`` and put it in ``status`` (DEAD rows get the fields a
    DEAD outcome writes: closed_at, last_error, attempts)."""
    result = enqueue(target, {"n": 1} if payload is None else payload, key=key, code=code,
                     headers=headers, dedupe_key=f"{target}:{uuid.uuid4().hex}")
    assert result.inserted
    updates: dict[str, Any] = {"status": status, **fields}
    if status == JobStatus.DEAD:
        updates.setdefault("closed_at", timezone.now())
        updates.setdefault("last_error", "RuntimeError: boom (attempt 6 of 6)")
        updates.setdefault("attempts", 6)
    Job.objects.filter(id=result.job_id).update(**updates)
    return Job.objects.get(id=result.job_id)


def manager(username: str = "manager", *, flows: bool = False) -> User:
    """A staff user with ``jobs_engine.manage_jobs`` (and nothing else); with ``flows``,
    also the flows' two permissions (view and manage)."""
    user = User.objects.create_user(username, password="pw", is_staff=True)
    codenames = ["manage_jobs", *(["view_flow", "manage_flows"] if flows else [])]
    user.user_permissions.add(*Permission.objects.filter(
        codename__in=codenames, content_type__app_label="jobs_engine"))
    return User.objects.get(pk=user.pk)  # fresh: no cached permissions


def manager_client() -> Client:
    """A test client logged in as ``manager()``."""
    client = Client()
    client.force_login(manager())
    return client


def staff(username: str = "staff") -> User:
    """A staff user without the engine's permission."""
    return User.objects.create_user(username, password="pw", is_staff=True)
