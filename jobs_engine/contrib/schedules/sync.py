"""Boot sync: the row of every declared schedule, upserted from its declaration.

Code-owned fields (``cron``, ``timezone``, ``missed_slot_policy``, ``max_attempts``,
``tenant_id``) are overwritten; admin-owned ``enabled`` and ``cron_override`` are kept. A
new row gets the first slot after now; an existing row keeps its ``next_run_at`` unless
the cron it runs on (or its zone) changed, so a restart neither loses nor repeats a slot.

It runs when a worker with the schedules lane starts, when ``tick_schedules`` starts (also
under ``JOBS_WORKERS=off``), after ``migrate``, and whenever ``sync_declared()`` is called.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction

from jobs_engine import store
from jobs_engine.contrib.schedules.cron import CronSpec, cron_spec
from jobs_engine.contrib.schedules.declarations import Declaration, declared
from jobs_engine.contrib.schedules.errors import InvalidCron
from jobs_engine.contrib.schedules.models import Schedule

logger = logging.getLogger("jobs_engine.schedules")


def sync_declared(now: datetime | None = None) -> int:
    """Upsert every declared schedule's row; returns the rows inserted or changed.

    One row's failure does not stop the others; the first failure is raised at the end,
    so a worker retries the sync instead of ticking without that row.
    """
    now = now or store.db_now()
    changed = 0
    failures: list[Exception] = []
    for declaration in declared().values():
        try:
            changed += _sync_one(declaration, now)
        except Exception as exc:
            logger.exception("schedule sync failed code=%s", declaration.code)
            failures.append(exc)
    if failures:
        raise failures[0]
    return changed


def _next_slot(cron: str, timezone: str, now: datetime) -> datetime:
    return cron_spec(cron, timezone).next_after(now)


def row_spec(row: Schedule) -> CronSpec:
    """The cron a row runs on: its override, or the declared cron. An override that cannot
    be read (written around the admin operations, which validate it) is logged and the
    declared cron is used, so the schedule keeps running."""
    if row.cron_override:
        try:
            return cron_spec(row.cron_override, row.timezone)
        except InvalidCron as exc:
            logger.error("schedule %s: %s; running on the declared cron %r", row.code, exc,
                         row.cron)
    return cron_spec(row.cron, row.timezone)


def _sync_one(declaration: Declaration, now: datetime) -> int:
    code_owned = {"cron": declaration.cron, "timezone": declaration.timezone,
                  "missed_slot_policy": declaration.missed_slot_policy.value,
                  "max_attempts": declaration.max_attempts,
                  "tenant_id": declaration.tenant_id}
    with transaction.atomic():
        row = Schedule.objects.select_for_update().filter(code=declaration.code).first()
        if row is None:
            _, created = Schedule.objects.get_or_create(
                code=declaration.code,
                defaults={**code_owned, "enabled": True,
                          "next_run_at": _next_slot(declaration.cron, declaration.timezone, now)})
            if created:
                logger.info("schedule declared code=%s cron=%r timezone=%s", declaration.code,
                            declaration.cron, declaration.timezone)
            return int(created)
        try:
            runs_on: CronSpec | None = row_spec(row)
        except InvalidCron:  # a stored zone that cannot be read: the declaration repairs it
            runs_on = None
        changed = [name for name, value in code_owned.items() if getattr(row, name) != value]
        for name in changed:
            setattr(row, name, code_owned[name])
        spec = row_spec(row)
        if spec != runs_on or row.next_run_at is None:
            row.next_run_at = spec.next_after(now)
            changed.append("next_run_at")
        if not changed:
            return 0
        row.save(update_fields=[*changed, "updated_at"])
        logger.info("schedule synced code=%s changed=%s", row.code, ",".join(changed))
        return 1
