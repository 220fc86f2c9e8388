"""Enqueue: job rows join the caller's open transaction.

A committed business change always has its jobs; a rolled-back one has none. Every check
runs before the first write, so a bad item leaves the database untouched.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from django.db import transaction
from django.utils import timezone

from jobs_engine import store
from jobs_engine.conf import JobsSettings, jobs_settings
from jobs_engine.context import current_actor, current_tenant, request_trace_id
from jobs_engine.errors import InvalidJob
from jobs_engine.lanes import lossy
from jobs_engine.limits import limit_key_for
from jobs_engine.registry import Target, get_target
from jobs_engine.states import Lane
from jobs_engine.tenancy import Platform, tenant_for
from jobs_engine.text import NUL_PROBLEM, SURROGATE_PROBLEM, json_text

MAX_DEDUPE_KEY_LENGTH = 255
_COLUMN_KEY_LENGTH = 255
_COLUMN_CODE_LENGTH = 200
MIN_PRIORITY, MAX_PRIORITY = -100, 100  # Django's Tasks API uses the same range

@dataclass(frozen=True)
class EnqueueResult:
    """What ``enqueue`` did with one job. ``inserted`` is False for a duplicate ``dedupe_key``
    (nothing written; ``job_id`` names the job that holds it) and for a lossy target's job,
    which writes no row (``lossy``, ``job_id`` None) and is handed off after the commit."""

    inserted: bool
    job_id: int | None
    lossy: bool = False


def partition_for(key: str | None, dedupe_key: str, partitions: int) -> int:
    """A stable partition: md5, not ``hash()``, whose seed changes per process."""
    digest = hashlib.md5((key or dedupe_key).encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[:8], "big") % partitions


def random_keys(count: int) -> Iterator[str]:
    """``count`` keys of 32 hex digits for the dedupe keys and trace ids the engine makes:
    96 random bits drawn once per call, then the key's number. Unique as random keys are
    (even odds of two calls drawing the same bits only after 2**48 calls), and a batch's
    dedupe keys are neighbours in their unique index, where random ones each dirtied a
    page of their own (the payloads' insert: 2.3 -> 1.6 ms per 100 rows on the server)."""
    prefix = os.urandom(12).hex()
    return (f"{prefix}{number:08x}" for number in range(count))


def _check_text(field: str, value: Any, limit: int) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not value:
        raise InvalidJob(field, f"must be a non-empty string, got {value!r}")
    if len(value) > limit:
        raise InvalidJob(field, f"is {len(value)} characters, longer than {limit}")
    if "\x00" in value:
        raise InvalidJob(field, NUL_PROBLEM)
    if not value.isascii():  # ASCII (the usual key) cannot hold a surrogate: no encode
        try:
            value.encode()
        except UnicodeEncodeError:
            raise InvalidJob(field, SURROGATE_PROBLEM) from None


def _json_text(field: str, value: Any, max_bytes: int | None = None) -> str:
    try:
        return json_text(value, max_bytes)
    except ValueError as exc:
        raise InvalidJob(field, str(exc)) from None


_ARGUMENTS = frozenset({"target", "payload", "code", "key", "version", "dedupe_key", "headers",
                        "run_at", "priority", "tenant_id", "limit_key"})
_TARGET_AND_PAYLOAD = frozenset({"target", "payload"})
# What a batch of payloads (``_target_of_payloads``) may give besides them: one tenant for all.
_SHARED_BY_PAYLOADS = _TARGET_AND_PAYLOAD | {"tenant_id"}


def job_tenant(given: str | Platform | None, serving: str | None) -> str | None:
    """``tenancy.tenant_for``, refusing a bad tenant id as a bad enqueue argument."""
    try:
        return tenant_for(given, serving)
    except ValueError as exc:
        raise InvalidJob("tenant_id", str(exc)) from None


def _build(item: Mapping[str, Any], settings: JobsSettings, trace_id: str | None,
           actor: dict[str, Any] | None, tenant: str | None, keys: Iterator[str]
           ) -> tuple[Target, store.NewJob]:
    """Every check of one item, then its row. Runs once per job: each argument is read
    once, and the checks of an absent one cost a comparison (0.7 ms of a 100-job enqueue's
    ~3 ms went here). What the call's items share (the request's trace id, actor and
    tenant) is read once per call; a job outside a request gets a trace id of its own from
    ``keys``."""
    if not item.keys() <= _ARGUMENTS:
        raise InvalidJob(sorted(item.keys() - _ARGUMENTS)[0], "is not an enqueue argument")
    get = item.get
    name: Any = get("target")  # any value: get_target refuses one that names no target
    if name is None and "target" not in item:
        raise InvalidJob("target", "is required")
    target = get_target(name)
    payload_json = _json_text("payload", get("payload"), settings.MAX_PAYLOAD_BYTES)
    key, code, dedupe_key = get("key"), get("code"), get("dedupe_key")
    dedupe_key_given = dedupe_key is not None
    if key is not None:
        _check_text("key", key, min(settings.MAX_KEY_LENGTH, _COLUMN_KEY_LENGTH))
    if code is not None:
        _check_text("code", code, min(settings.MAX_CODE_LENGTH, _COLUMN_CODE_LENGTH))
    if dedupe_key is not None:
        _check_text("dedupe_key", dedupe_key, MAX_DEDUPE_KEY_LENGTH)
    else:
        dedupe_key = next(keys)
    version = get("version")
    if version is None:
        version = 0
    elif isinstance(version, bool) or not isinstance(version, int):
        raise InvalidJob("version", f"must be an integer, got {version!r}")
    elif version < 0:
        raise InvalidJob("version", f"must not be negative, got {version}")
    headers = get("headers")
    if headers is None:
        headers = {}
    else:
        if not isinstance(headers, Mapping) or not all(isinstance(k, str) for k in headers):
            raise InvalidJob("headers", "must be a mapping with string keys")
        headers = dict(headers)
        if headers:  # the store encodes them again; checked here for what it cannot write
            _json_text("headers", headers)
    run_at = get("run_at")
    if run_at is not None and (not isinstance(run_at, datetime) or timezone.is_naive(run_at)):
        raise InvalidJob("run_at", "must be a timezone-aware datetime")
    priority = get("priority") or 0
    if priority:
        if isinstance(priority, bool) or not isinstance(priority, int) \
                or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
            raise InvalidJob("priority", f"must be a whole number from {MIN_PRIORITY} to "
                                         f"{MAX_PRIORITY}, got {priority!r}")
        if target.lane is not Lane.LONG:
            raise InvalidJob("priority", f"orders the long lane only; {target.name} runs on "
                                         f"the {target.lane.value} lane, in key order")
    given_tenant = get("tenant_id")
    if given_tenant is not None:
        tenant = job_tenant(given_tenant, tenant)
    limit_key = None
    if target.limits or get("limit_key") is not None:
        limit_key = limit_key_for(target.name, target.limits, payload=get("payload"),
                                  code=code or target.name, tenant_id=tenant,
                                  given=get("limit_key"))
    # Positional: a third of the keyword call's time; ``_value_``: the enum's ``value``
    # without its property's lookup.
    return target, store.NewJob(
        code or target.name, target.name, target.lane._value_, key,
        partition_for(key, dedupe_key, settings.PARTITIONS), version, payload_json, headers,
        dedupe_key, target.delivery_mode._value_, trace_id or next(keys), actor, run_at,
        priority, dedupe_key_given, tenant, limit_key,
    )


def _target_of_payloads(items: list[Mapping[str, Any]]) -> tuple[Target, Any] | None:
    """The target of a batch whose every item is that target's payload and nothing else
    (each other argument absent or at its default, the tenant the same for all), for a
    durable target, and that tenant as given (None: not given); None for any other batch,
    which ``_build`` checks item by item."""
    if not items:
        return None
    name = items[0].get("target")
    if name is None:
        return None
    tenant = items[0].get("tenant_id")
    for item in items:
        if item.get("target") != name or item.get("tenant_id") != tenant:
            return None
        if item.keys() != _TARGET_AND_PAYLOAD:
            for argument, value in item.items():
                if argument not in _ARGUMENTS or (
                        value is not None and argument not in _SHARED_BY_PAYLOADS
                        and not (argument == "priority" and type(value) is int and value == 0)):
                    return None
    target = get_target(name)
    # A limited target's rows each take their key (``_build``).
    return None if target.lossy or target.limits else (target, tenant)


def _enqueue_payloads(target: Target, items: list[Mapping[str, Any]], settings: JobsSettings,
                      trace_id: str | None, actor: dict[str, Any] | None, tenant: str | None,
                      using: str | None) -> list[EnqueueResult]:
    """``enqueue_many`` of a batch of one target's payloads: the payloads are its only
    input to check, and the store makes the rest of each row (``jobs_insert_payloads``)."""
    limit = settings.MAX_PAYLOAD_BYTES
    payloads = [_json_text("payload", item.get("payload"), limit) for item in items]
    ids = store.jobs_insert_payloads(
        target.name, target.name, target.lane._value_, target.delivery_mode._value_,
        payloads, settings.PARTITIONS, trace_id or None, actor, tenant, using)
    if ids:
        wake_workers(target.lane._value_, {target.name}, settings, using, ids.waiting)
    return [EnqueueResult(True, job_id) for job_id in ids]


def wake_workers(lane: str, targets: set[str], settings: JobsSettings, using: str | None,
                 waiting: bool) -> None:
    """Once the caller's transaction commits, wake the workers that wait on ``lane`` for
    ``targets`` if its insert found one waiting (``store.wake_after_commit``), unless the
    project turned wake-ups off (``NOTIFY``)."""
    if settings.NOTIFY:
        store.wake_after_commit(lane, targets, waiting, using)


def enqueue_many(items: Iterable[Mapping[str, Any]], using: str | None = None
                 ) -> list[EnqueueResult]:
    """Enqueue several jobs with one insert; results are in the order of ``items``.

    Each item is a mapping of ``enqueue``'s arguments. Within the call and against rows
    already stored, the first ``dedupe_key`` wins and the others insert nothing.
    """
    settings = jobs_settings()
    items = list(items)
    trace_id, actor, tenant = request_trace_id(), current_actor(), current_tenant()
    payloads_of = _target_of_payloads(items)
    if payloads_of is not None:
        target, given_tenant = payloads_of
        return _enqueue_payloads(target, items, settings, trace_id, actor,
                                 job_tenant(given_tenant, tenant), using)
    keys = random_keys(len(items) * (1 if trace_id else 2))  # dedupe keys, trace ids
    built = [_build(item, settings, trace_id, actor, tenant, keys) for item in items]
    durable: list[store.NewJob] = []
    seen: set[str] = set()
    for target, row in built:
        if not target.lossy and row.dedupe_key not in seen:
            seen.add(row.dedupe_key)
            durable.append(row)
    # One statement: atomic on its own in autocommit, part of the caller's transaction
    # inside one (no savepoint needed, ON CONFLICT cannot fail it).
    inserted = (store.jobs_insert_many(durable, timezone.now(), using) if durable
                else store.Inserted())
    for lane in {row.lane for row in durable if row.dedupe_key in inserted}:
        wake_workers(lane, {row.target for row in durable
                            if row.lane == lane and row.dedupe_key in inserted}, settings,
                     using, inserted.waiting)
    existing: dict[str, int] = {}
    missing = [row.dedupe_key for row in durable if row.dedupe_key not in inserted]
    if missing:
        existing = store.jobs_ids_by_dedupe_key(missing, using)
    results: list[EnqueueResult] = []
    first_claim: set[str] = set()
    for target, row in built:
        if target.lossy:
            transaction.on_commit(partial(lossy.submit, target, row, settings), using=using)
            results.append(EnqueueResult(inserted=False, job_id=None, lossy=True))
            continue
        if row.dedupe_key in inserted and row.dedupe_key not in first_claim:
            first_claim.add(row.dedupe_key)
            results.append(EnqueueResult(inserted=True, job_id=inserted[row.dedupe_key]))
        else:
            job_id = inserted.get(row.dedupe_key) or existing.get(row.dedupe_key)
            results.append(EnqueueResult(inserted=False, job_id=job_id))
    return results


def enqueue(target: str, payload: Any, *, code: str | None = None, key: str | None = None,
            version: int | None = None, dedupe_key: str | None = None,
            headers: Mapping[str, Any] | None = None, run_at: datetime | None = None,
            priority: int = 0, tenant_id: str | Platform | None = None,
            limit_key: str | None = None, using: str | None = None) -> EnqueueResult:
    """Enqueue one job inside the caller's transaction (autocommit outside one).

    Business code should derive ``dedupe_key`` from the change (``<event>:<key>:<version>``)
    so a replayed request cannot make a second job; without one a random key is used.
    ``priority`` (long lane, -100..100): among due jobs a higher one runs first.
    ``tenant_id``: the tenant the job belongs to; None: the tenant of the request
    (``RequestContextMiddleware``) or job the caller serves, if any; ``PLATFORM``: none.
    ``limit_key``: the key of the target's limits declared ``per=PER_LIMIT_KEY``
    (``jobs_engine.limits``); required for such a target, refused for any other.
    """
    item = {"target": target, "payload": payload, "code": code, "key": key, "version": version,
            "dedupe_key": dedupe_key, "headers": headers, "run_at": run_at, "priority": priority,
            "tenant_id": tenant_id, "limit_key": limit_key}
    return enqueue_many([item], using=using)[0]


def next_version(key: str, using: str | None = None) -> int:
    """The next version of ``key`` (1, 2, ...), atomic inside the caller's transaction."""
    _check_text("key", key, _COLUMN_KEY_LENGTH)
    return store.version_counter_next(key, using)  # one upsert: atomic on its own
