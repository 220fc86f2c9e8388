"""The long lane's fair reserve: a reserve's rows shared between the tenants whose rows wait,
in proportion to their weights (``TenantWeight``), so a tenant's backlog never holds
another tenant's new row back by more than one reserve."""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from django.db import IntegrityError, transaction

from jobs_engine.models import TenantWeight
from jobs_engine.store.connection import fetch, named
from jobs_engine.store.dialect import dt, in_, in_names, skip_locked, writable_ctes
from jobs_engine.store.long import (
    _CLAIM_PICKED,
    _LOCKED_COLUMN,
    _NOT_PAUSED,
    _RESERVED_COLUMNS,
    ReservedRows,
    _claim_in_turn,
    _free_code,
    _reserved,
)
from jobs_engine.store.rows import (
    AT_MOST_ONCE_VALUE,
    JOBS,
    LONG_PENDING,
    RESERVE,
    lazy_flush_item,
)

__all__ = ["jobs_long_reserve_fair", "jobs_long_tenants_wait"]

TENANT_WEIGHTS = TenantWeight._meta.db_table

# Where the fair reserve's statement returns a row's place in the order of the shares (where
# the plain reserve returns its count of locked rows).
_PLACE_COLUMN = _LOCKED_COLUMN

# A tenant's weight as read beside its rows (``w``: its ``TenantWeight``, if any): 1 without
# one, and never below 1 (a share is at least one row).
_WEIGHT = "GREATEST(COALESCE(w.weight, 1), 1)"

# The rows of no tenant (the platform's) a reserve looks for among the first due rows, in run
# order: they have no index of their own (every row of a project without tenants would write
# its entry), so they are read through ``jobs_long_pending_due``, tested one by one. Deeper
# ones wait for the rows before them, as they would without fair shares.
PLATFORM_DEPTH = 500

# The run order of the long lane, within a tenant and for the rows of no tenant's share.
_RUN_ORDER = "ORDER BY j.priority DESC, j.next_run_at, j.id"

# The rows of one tenant (``{tenant}.tenant_id``) in run order, as ``jobs_long_pending_tenant``
# holds them. A range, not ``=``: with the tenant equal to a value, the planner finds the order
# of ``jobs_long_pending_due`` as good, and a generic plan read one tenant's rows through it,
# past every row of the others (and with few tenants the statistics call each a large share).
_OF_TENANT = ("j.tenant_id >= {tenant}.tenant_id AND j.tenant_id <= {tenant}.tenant_id "
              "ORDER BY j.tenant_id, j.priority DESC, j.next_run_at, j.id")

# The tenants with long-lane rows waiting, one descent of ``jobs_long_pending_tenant`` each
# (a skip scan): the least tenant id, then the least after it, until none is left (a last
# NULL row). ``min`` is the first entry of the index, on PostgreSQL and SQLite alike.
_TENANTS = (
    "WITH RECURSIVE tenants (tenant_id) AS ("
    f"SELECT (SELECT min(j.tenant_id) FROM {JOBS} j WHERE {LONG_PENDING} "
    "AND j.tenant_id IS NOT NULL) "
    f"UNION ALL SELECT (SELECT min(j.tenant_id) FROM {JOBS} j WHERE {LONG_PENDING} "
    "AND j.tenant_id IS NOT NULL AND j.tenant_id > t.tenant_id) "
    "FROM tenants t WHERE t.tenant_id IS NOT NULL)"
)


def _due(names: str, exclusive_clause: str) -> str:
    """A candidate of a reserve (as ``store.long``'s): a due long-lane row of the worker's
    targets, not of a paused target, not of an exclusive code running somewhere."""
    return (f"{LONG_PENDING} AND j.next_run_at <= %(now)s AND {names} AND {_NOT_PAUSED} "
            f"AND {_free_code(exclusive_clause)}")


@lru_cache(maxsize=16)
def _fair_statement(targets: tuple[str, ...], exclusive: tuple[str, ...],
                    flush_lazily: bool) -> str:
    """``jobs_long_reserve_fair``'s one statement (PostgreSQL) for a worker's target lists,
    made once.

    ``tenants``: the skip scan. ``heads``: each tenant's first due row (``LATERAL``, one
    descent of the tenant's range of ``jobs_long_pending_tenant``), and the first row of no
    tenant among the first ``PLATFORM_DEPTH`` due rows (``platform``, read through
    ``jobs_long_pending_due``); only these count. ``shares``: the slots of the reserve,
    ``limit`` of them, given in the order of ``(n - 1) / weight`` for each one's n-th row
    (every one gets a row before any gets a second, then in proportion to the weights),
    ties to the higher first row's priority, then in turns (``_turn``). ``first_*``: each
    one's share of rows locked in run order; ``spare``: what the shares could not use,
    locked from the due rows in run order. The picks (the first of each exclusive code,
    the at-most-once bound) and each row's place go in the order of the shares: by
    ``(n - 1) / weight`` of each one's locked rows, then run order."""
    names, _ = in_names("j.target", targets)  # constants of the text: no parameters
    exclusive_clause, _ = in_names("j.target", exclusive)
    due = _due(names, exclusive_clause)
    columns = (f"j.id, j.code, j.priority, j.next_run_at, j.tenant_id, "
               f"{exclusive_clause if exclusive else 'false'} AS exclusive, "
               f"j.delivery_mode = '{AT_MOST_ONCE_VALUE}' AS at_most_once")
    fair_order = "ORDER BY fair_key, priority DESC, next_run_at, id"
    return (
        f"{_TENANTS}, "
        "heads AS (SELECT t.tenant_id, h.priority, h.next_run_at, h.id FROM tenants t "
        "CROSS JOIN LATERAL (SELECT j.priority, j.next_run_at, j.id "
        f"FROM {JOBS} j WHERE {due} AND {_OF_TENANT.format(tenant='t')} LIMIT 1) h "
        "UNION ALL (SELECT NULL, p.priority, p.next_run_at, p.id FROM platform p "
        "ORDER BY p.priority DESC, p.next_run_at, p.id LIMIT 1)), "
        "platform AS (SELECT j.id, j.priority, j.next_run_at FROM (SELECT j.id, j.target, "
        f"j.code, j.tenant_id, j.priority, j.next_run_at FROM {JOBS} j WHERE {LONG_PENDING} "
        f"AND j.next_run_at <= %(now)s AND {names} {_RUN_ORDER} LIMIT {PLATFORM_DEPTH}) AS j "
        f"WHERE j.tenant_id IS NULL AND {_NOT_PAUSED} AND {_free_code(exclusive_clause)}), "
        f"weighted AS (SELECT h.tenant_id, h.priority, {_WEIGHT} AS weight, row_number() "
        "OVER (ORDER BY h.priority DESC, h.next_run_at, h.id) AS head_rank, count(*) OVER () "
        f"AS heads FROM heads h LEFT JOIN {TENANT_WEIGHTS} w ON w.tenant_id = h.tenant_id), "
        "shares AS (SELECT s.tenant_id, count(*) AS share FROM (SELECT x.tenant_id "
        "FROM weighted x CROSS JOIN generate_series(1, LEAST(%(limit)s, CEIL(%(limit)s "
        "* x.weight::numeric / (SELECT sum(weight) FROM weighted))::integer + 1)) AS g (n) "
        "ORDER BY (g.n - 1)::float8 / x.weight, x.priority DESC, "
        "(x.head_rank + %(turn)s) %% x.heads LIMIT %(limit)s) AS s GROUP BY s.tenant_id), "
        f"first_tenants AS (SELECT l.* FROM shares s CROSS JOIN LATERAL (SELECT {columns} "
        f"FROM {JOBS} j WHERE {due} AND {_OF_TENANT.format(tenant='s')} "
        "LIMIT s.share FOR UPDATE SKIP LOCKED) l), "
        f"first_platform AS (SELECT {columns} FROM platform p JOIN {JOBS} j ON j.id = p.id "
        f"WHERE {due} AND j.tenant_id IS NULL ORDER BY p.priority DESC, p.next_run_at, p.id "
        "LIMIT COALESCE((SELECT s.share FROM shares s WHERE s.tenant_id IS NULL), 0) "
        "FOR UPDATE OF j SKIP LOCKED), "
        "first AS (SELECT * FROM first_tenants UNION ALL SELECT * FROM first_platform), "
        f"spare AS (SELECT {columns} FROM {JOBS} j WHERE {due} "
        f"AND j.id <> ALL(ARRAY(SELECT id FROM first)) {_RUN_ORDER} "
        "LIMIT %(limit)s - (SELECT count(*) FROM first) FOR UPDATE SKIP LOCKED), "
        "locked AS (SELECT * FROM (SELECT * FROM first UNION ALL SELECT * FROM spare) AS l "
        "LIMIT %(limit)s), "
        "ordered AS (SELECT l.*, (row_number() OVER (PARTITION BY l.tenant_id ORDER BY "
        f"l.priority DESC, l.next_run_at, l.id) - 1)::float8 / {_WEIGHT} AS fair_key "
        f"FROM locked l LEFT JOIN {TENANT_WEIGHTS} w ON w.tenant_id = l.tenant_id), "
        "first_of_code AS (SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY "
        f"exclusive, CASE WHEN exclusive THEN code END {fair_order}) AS nth FROM ordered) "
        "AS o WHERE NOT exclusive OR nth = 1), "
        "picked AS (SELECT id, exclusive, code, at_most_once, place FROM (SELECT *, "
        f"row_number() OVER (PARTITION BY at_most_once {fair_order}) AS nth_mode, "
        f"row_number() OVER ({fair_order}) AS place FROM first_of_code) AS m "
        "WHERE NOT at_most_once OR nth_mode <= %(at_most_once)s) "
        f"{_CLAIM_PICKED} AND {JOBS}.id = ANY(ARRAY(SELECT id FROM picked)) "
        f"RETURNING {_RESERVED_COLUMNS}, picked.place"
        + _lazily(flush_lazily))


def _lazily(flush_lazily: bool) -> str:
    """``rows.lazy_flush_item`` of the statement: unless a picked row is at most once or of
    an exclusive target."""
    return lazy_flush_item(flush_lazily, "EXISTS (SELECT 1 FROM picked "
                                         "WHERE exclusive OR at_most_once)")


def jobs_long_reserve_fair(owner: str, token: str, now: datetime, lease_s: float, limit: int,
                           *, targets: Sequence[str], exclusive_targets: Sequence[str] = (),
                           start: bool = False, at_most_once_limit: int | None = None,
                           flush_lazily: bool = False) -> ReservedRows:
    """Claim up to ``limit`` due long-lane rows of ``targets`` under a lease, shared between
    the tenants whose rows wait in proportion to their weights.

    Index: ``jobs_long_pending_tenant``, ``jobs_long_pending_due``, ``jobs_one_running_per_code``.
    The first for the tenants and each one's rows in run order, the second for the rows of
    no tenant and the spare, the third on the update.

    ``store.jobs_long_reserve``'s rows and rules (the lease, ``start``, paused targets
    skipped, one running row per exclusive code, at most ``at_most_once_limit``
    at-most-once rows, ``flush_lazily``), but not its order: the tenants with rows waiting
    are found by a skip scan of ``jobs_long_pending_tenant``, the rows without a tenant
    (the platform's) count as one more tenant of weight 1, and each gets a share of the
    ``limit`` rows in proportion to its weight (``TenantWeight``, 1 without one, read at
    each reserve): one row each first while the reserve has rows to give, ties to the
    higher priority of a tenant's first row, then in turns that move from reserve to
    reserve (more tenants waiting than rows: they take turns). Each locks its share of its
    first rows in run order (``FOR UPDATE SKIP LOCKED``); what a share could not use goes
    to the other due rows in run order. So tenant A's backlog of any length and tenant
    B's one new row: a reserve of two rows or more takes B's row. Rows come back in the
    order of the shares (each tenant's first row, then as the weights give), which the
    lane hands to its threads in turn; no cursor (``ReservedRows.cursor`` None).

    The rows of no tenant have no index of their own: they are looked for among the first
    ``PLATFORM_DEPTH`` due rows only, and deeper ones wait for the rows before them, as
    with the plain reserve (their share then goes to the spare).

    On PostgreSQL one statement (one round trip); when the unique code refuses a code
    another worker claimed meanwhile, and on SQLite, the same choice is made in Python
    over each one's first rows, inside a transaction. Its work grows with the tenants
    that have rows waiting: two index descents each.
    """
    at_most_once = limit if at_most_once_limit is None else min(limit, at_most_once_limit)
    params: dict[str, Any] = {
        "now": dt(now), "limit": limit, "at_most_once": at_most_once, "start": start,
        "running": RESERVE.target, "token": token, "owner": owner,
        "lease_until": dt(now + timedelta(seconds=lease_s)), "turn": _turn(now)}
    if writable_ctes():
        # As ``jobs_long_reserve``: a savepoint inside a caller's transaction, else alone.
        alone = contextlib.nullcontext() if transaction.get_autocommit() else transaction.atomic()
        try:
            with alone:
                rows = fetch(_fair_statement(tuple(targets), tuple(exclusive_targets),
                                             flush_lazily), params, prepare=True)
        except IntegrityError:
            pass  # a code another worker claimed meanwhile: one code at a time below
        else:
            rows.sort(key=lambda row: row[_PLACE_COLUMN])
            return ReservedRows(_reserved(row) for row in rows)
    target_clause, target_params = named(in_names("j.target", targets), "targets")
    excl_clause, excl_params = named(in_names("j.target", exclusive_targets), "exclusive")
    params.update(target_params)
    params.update(excl_params)
    candidates = (f"SELECT j.id, j.target, j.code, j.delivery_mode, j.tenant_id, j.priority, "
                  f"j.next_run_at FROM {JOBS} j WHERE {_due(target_clause, excl_clause)} "
                  f"AND {{tenant}} {_RUN_ORDER} LIMIT %(limit)s{skip_locked()}")
    with transaction.atomic():
        tenants = [row[0] for row in fetch(f"{_TENANTS} SELECT tenant_id FROM tenants "
                                           "WHERE tenant_id IS NOT NULL", {})]
        firsts: dict[str | None, list[tuple[Any, ...]]] = {
            tenant: fetch(candidates.replace("{tenant}", "j.tenant_id = %(tenant)s"),
                          {**params, "tenant": tenant}) for tenant in tenants}
        firsts[None] = fetch(candidates.replace("{tenant}", _among_first(target_clause)),
                             params)
        weights = _weights(tenants)
        return _claim_in_turn(_fair_order(firsts, weights, limit, params["turn"]), params,
                              exclusive_targets, at_most_once)


def _among_first(names: str) -> str:
    """A row of no tenant among the first ``PLATFORM_DEPTH`` due rows of ``names``, as the
    statement's ``platform`` reads them."""
    return (f"j.tenant_id IS NULL AND j.id IN (SELECT front.id FROM (SELECT j.id, j.tenant_id "
            f"FROM {JOBS} j WHERE {LONG_PENDING} AND j.next_run_at <= %(now)s AND {names} "
            f"{_RUN_ORDER} LIMIT {PLATFORM_DEPTH}) AS front WHERE front.tenant_id IS NULL)")


def _turn(now: datetime) -> int:
    """Where the shares' order of tenants starts at ``now``: the tenants whose first rows
    are equal in the shares (more tenants than rows, say) take turns, reserve after
    reserve, not the same ones first each time."""
    return int(now.timestamp() * 1_000_000)


def _weights(tenants: Sequence[str]) -> dict[str | None, int]:
    """The weights of ``tenants`` (``_WEIGHT``: 1 without a row, never below 1)."""
    if not tenants:
        return {}
    clause, params = named(in_("tenant_id", tenants), "tenants")
    rows = fetch(f"SELECT tenant_id, weight FROM {TENANT_WEIGHTS} WHERE {clause}", params)
    return {tenant: max(weight, 1) for tenant, weight in rows}


def _run_key(row: Sequence[Any]) -> tuple[Any, ...]:
    """A candidate's place in run order (id, ..., tenant_id, priority, next_run_at)."""
    return -row[5], row[6], row[0]


def _fair_order(firsts: dict[str | None, list[tuple[Any, ...]]],
                weights: dict[str | None, int], limit: int, turn: int
                ) -> list[tuple[Any, ...]]:
    """The rows ``_fair_statement`` takes, in its order, from each one's first rows in run
    order (``firsts``: tenant -> rows, None for the rows of no tenant)."""
    heads = sorted(((rows[0], tenant) for tenant, rows in firsts.items() if rows),
                   key=lambda head: _run_key(head[0]))
    total = sum(weights.get(tenant, 1) for _, tenant in heads)
    slots = sorted(((n - 1) / weights.get(tenant, 1), -head[5], (rank + turn) % len(heads),
                    tenant)
                   for rank, (head, tenant) in enumerate(heads, 1)
                   for n in range(1, min(limit, math.ceil(limit * weights.get(tenant, 1)
                                                          / total) + 1) + 1))[:limit]
    shares = Counter(slot[-1] for slot in slots)
    taken = [row for tenant, share in shares.items() for row in firsts[tenant][:share]]
    ids = {row[0] for row in taken}
    rest = sorted((row for rows in firsts.values() for row in rows if row[0] not in ids),
                  key=_run_key)
    taken += rest[:limit - len(taken)]
    nth: Counter[str | None] = Counter()

    def fair_key(row: tuple[Any, ...]) -> tuple[Any, ...]:
        nth[row[4]] += 1
        return (nth[row[4]] - 1) / weights.get(row[4], 1), *_run_key(row)

    keyed = [(fair_key(row), row) for row in sorted(taken, key=_run_key)]
    return [row for _, row in sorted(keyed, key=lambda pair: pair[0])]


def jobs_long_tenants_wait() -> bool:
    """Whether any long-lane row of a tenant waits (PENDING, due or not): the lane's fair
    reserve is then worth its statement.

    Index: ``jobs_long_pending_tenant``. One entry read, whatever the backlog; a project
    whose rows have no tenant has the index empty."""
    rows = fetch(f"SELECT EXISTS (SELECT 1 FROM {JOBS} j WHERE {LONG_PENDING} "
                 "AND j.tenant_id IS NOT NULL)", {})
    return bool(rows[0][0])
