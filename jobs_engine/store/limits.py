"""The limits' statements: admission of limited targets' rows, RateLimited's block, and what
operators see of the buckets (``jobs_engine.limits``).

An admission plans from the buckets as they are, unlocked; then, in one transaction, it
locks the buckets of the keys it may admit (in id order, so two workers never wait on each
other in a circle), counts their running rows after the locks are granted (so it sees
every admission that committed before), takes what the slots and tokens allow and writes
the tokens back. On PostgreSQL that transaction is one call (``jobs_engine_limits_admit``,
``sql/enqueue.sql``), so the locks are never held across a round trip; SQLite plans under
its own lock. Two workers admitting the
same key take turns; workers admitting different keys do not meet. The slots are the
rows themselves: a row that leaves RUNNING, by its outcome or by the lease rescue of a
killed worker, frees its slot, so no slot leaks.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Protocol

from django.db import transaction

from jobs_engine.job import Job
from jobs_engine.limits import (
    FIELD_PREFIX,
    PER_CODE,
    PER_TARGET,
    PER_TENANT,
    TARGET_KEY,
    Concurrency,
    Limit,
    Rate,
    TargetLimits,
    key_of,
)
from jobs_engine.states import DeliveryMode
from jobs_engine.store.connection import execute, fetch, is_postgres, named
from jobs_engine.store.dialect import (
    dt,
    for_update,
    greatest,
    in_,
    int_array,
    json_dt,
    json_text_field,
    number_array,
    read_dt,
    read_instant,
    table,
    text_array,
)
from jobs_engine.store.long import (
    _RESERVED_COLUMNS,
    _STARTED_AT,
    Reserved,
    ReservedRows,
    _reserved,
)
from jobs_engine.store.rows import (
    JOBS,
    LIMITED_PENDING,
    LIMITED_RUNNING,
    LIMITS_ADMIT_FUNCTION,
    LONG_PENDING,
    PAUSES,
    PENDING_VALUE,
    RESERVE,
)

__all__ = [
    "FIRST_KEYS",
    "LIMIT_BUCKETS",
    "LIMIT_OVERRIDES",
    "Admitted",
    "BucketState",
    "KeyCursor",
    "effective_limit",
    "jobs_long_reserve_limited",
    "limit_buckets_prune",
    "limits_admit_fast",
    "limits_block",
    "limits_rekey",
    "limits_state",
    "limits_unkey",
]

LIMIT_BUCKETS = "jobs_engine_limit_bucket"
LIMIT_OVERRIDES = "jobs_engine_limit_override"
# The keys with due rows one admission looks at: this many per row it may take (some are
# held back by their limits), at least ``MIN_KEYS``; the later keys by later admissions.
KEYS_PER_ROW = 2
MIN_KEYS = 16


class Target(Protocol):
    """What the admission reads of a registered target (``registry.Target``; the store
    imports nothing above it)."""

    @property
    def name(self) -> str: ...

    @property
    def limits(self) -> TargetLimits: ...

    @property
    def delivery_mode(self) -> DeliveryMode: ...


class KeyCursor(NamedTuple):
    """Where an admission's look at the keys starts: after ``key`` (in each target's keys
    in order), or from the first key (``FIRST_KEYS``). Keys take turns: a pass over
    every key with rows waiting is made a few keys an admission at a time."""

    key: str | None


FIRST_KEYS = KeyCursor(None)


class Admitted(NamedTuple):
    """What a limited reserve took, when the next admission could take more (seconds;
    None: nothing held back, or only by slots another worker holds), the admission's
    time, which the rows' ``started_at`` holds (``_Plan.at``), and where the next
    admission looks at the keys. ``held_back``: a key looked at kept rows back for its
    limits, so an admission at once would find no more room (the lane waits for a slot of
    its own to come free, a token, or its idle pace)."""

    rows: ReservedRows
    wait_s: float | None
    at: datetime
    cursor: KeyCursor = FIRST_KEYS
    held_back: bool = False


@dataclass
class _Bucket:
    """One locked bucket, with the limit's values in force (an override's, else declared)."""

    id: int
    limit: Limit
    key: str
    tokens: float
    refilled_at: datetime | None
    blocked_until: datetime | None
    running: int = 0
    taken: int = 0
    throttled: int = 0

    def tokens_at(self, now: datetime) -> float:
        """A rate bucket's tokens at ``now``: refilled since ``refilled_at``, never past
        its burst (a bucket never used is full)."""
        limit = self.limit
        assert isinstance(limit, Rate)
        burst = float(limit.burst or limit.starts)
        if self.refilled_at is None:
            return burst
        elapsed = max(0.0, (now - self.refilled_at).total_seconds())
        return min(burst, self.tokens + elapsed * limit.per_second)

    def settled(self, now: datetime) -> tuple[float, datetime]:
        """Its tokens once this admission's are taken, and the time they are counted from:
        ``now``, or the end of a block still running (tokens come only after it)."""
        if self.refilled_at is not None and self.refilled_at > now:  # a block's end
            return self.tokens - self.taken, self.refilled_at
        if isinstance(self.limit, Rate):
            return self.tokens_at(now) - self.taken, now
        return 0.0, now  # slots are the running rows: a concurrency bucket has no tokens

    def room(self, now: datetime) -> int:
        """Rows this bucket lets start now, beyond those taken in this admission."""
        if self.blocked_until is not None and self.blocked_until > now:
            return 0
        if isinstance(self.limit, Concurrency):
            return max(0, self.limit.slots - self.running - self.taken)
        return max(0, math.floor(self.tokens_at(now) + 1e-9) - self.taken)

    def wait_s(self, now: datetime) -> float | None:
        """Seconds until this bucket lets a row start again by itself (a token comes, a
        block ends); None for slots, which another worker's outcome frees."""
        if self.blocked_until is not None and self.blocked_until > now:
            return (self.blocked_until - now).total_seconds()
        if isinstance(self.limit, Rate):
            missing = self.taken + 1 - self.tokens_at(now)
            return max(0.0, missing / self.limit.per_second)
        return None


def effective_limit(limit: Limit, override: Sequence[Any]) -> Limit:
    """``limit`` with an operator's override (slots, starts, period_s, burst) in force."""
    slots, starts, period_s, burst = override
    if isinstance(limit, Concurrency):
        return Concurrency(slots, limit.per, limit.name) if slots else limit
    if starts is None and period_s is None and burst is None:
        return limit
    return Rate(starts or limit.starts, period_s or limit.period_s,
                burst or limit.burst, limit.per, limit.name)


def _lock_buckets(wanted: Iterable[tuple[Target, Limit, str]], now: datetime, *,
                  lock: bool = True) -> dict[tuple[str, str, str], _Bucket]:
    """Lock the buckets of ``wanted`` (target, limit, key) in id order, with their
    overrides, making the missing ones; keyed by (target, limit name, key). ``lock``
    False: read them as they are, a missing one as new (full, nothing running).

    Index: ``jobs_limit_bucket_key``."""
    wanted = sorted({(t.name, limit.name, key): (t, limit, key) for t, limit, key in wanted}
                    .values(), key=lambda w: (w[0].name, w[1].name, w[2]))
    rows = [(t.name, limit.name, key) for t, limit, key in wanted]
    found = _locked(rows) if lock else _read(rows)
    existing = {tuple(row[1:4]) for row in found}
    missing = [row for row in rows if row not in existing]
    if missing and lock:
        # A new bucket is full: its tokens are read as its burst until first written. Its
        # id is above every bucket's locked so far: the id order of the locks holds.
        source, params = named(table(missing, ("text", "text", "text"), arrays_from=1,
                                     as_json=True), "keys")
        execute(f"WITH v(target, name, key) AS ({source}) INSERT INTO {LIMIT_BUCKETS} "
                "(target, name, key, tokens, admitted, throttled, used_at) SELECT target, "
                "name, key, 0, 0, 0, %(now)s FROM v WHERE true "
                "ON CONFLICT (target, name, key) DO NOTHING", {**params, "now": dt(now)})
        found += _locked(missing)
    limits = {(t.name, limit.name): limit for t, limit, _ in wanted}
    return {(target, name, key): _Bucket(
        bucket_id, effective_limit(limits[(target, name)], override), key, tokens,
        read_dt(refilled_at), read_dt(blocked_until))
        for bucket_id, target, name, key, tokens, refilled_at, blocked_until, *override
        in found}


def _read(keys: Sequence[tuple[str, str, str]]) -> list[tuple[Any, ...]]:
    """The buckets of ``keys`` (target, limit name, key) with their overrides, unlocked; a
    missing one as new (id 0: full, never used).

    Index: ``jobs_limit_bucket_key``."""
    source, params = named(table(keys, ("text", "text", "text"), arrays_from=1,
                                 as_json=True), "keys")
    return fetch(
        f"WITH v(target, name, key) AS ({source}) "
        "SELECT COALESCE(b.id, 0), v.target, v.name, v.key, COALESCE(b.tokens, 0), "
        "b.refilled_at, b.blocked_until, o.slots, o.starts, o.period_s, o.burst FROM v "
        f"LEFT JOIN {LIMIT_BUCKETS} b ON b.target = v.target AND b.name = v.name "
        f"AND b.key = v.key LEFT JOIN {LIMIT_OVERRIDES} o ON o.target = v.target "
        "AND o.name = v.name", params, prepare=True)


def _locked(keys: Sequence[tuple[str, str, str]]) -> list[tuple[Any, ...]]:
    """Lock the buckets of ``keys`` (target, limit name, key) that exist, in id order, and
    read them with their overrides.

    Index: ``jobs_limit_bucket_key``."""
    source, params = named(table(keys, ("text", "text", "text"), arrays_from=1,
                                 as_json=True), "keys")
    return fetch(
        f"WITH v(target, name, key) AS ({source}) "
        "SELECT b.id, b.target, b.name, b.key, b.tokens, b.refilled_at, b.blocked_until, "
        f"o.slots, o.starts, o.period_s, o.burst FROM {LIMIT_BUCKETS} b "
        "JOIN v ON v.target = b.target AND v.name = b.name AND v.key = b.key "
        f"LEFT JOIN {LIMIT_OVERRIDES} o ON o.target = b.target AND o.name = b.name "
        f"ORDER BY b.id{for_update()}{' OF b' if for_update() else ''}", params, prepare=True)


def _running(targets: Sequence[str]) -> dict[tuple[str, str], int]:
    """RUNNING rows per (target, limit key) of ``targets``.

    Index: ``jobs_limited_running``."""
    clause, params = named(in_("j.target", targets), "targets")
    rows = fetch(f"SELECT j.target, j.limit_key, count(*) FROM {JOBS} j WHERE {LIMITED_RUNNING} "
                 f"AND {clause} GROUP BY j.target, j.limit_key", params, prepare=True)
    return {(target, key): count for target, key, count in rows}


def _write_buckets(buckets: Iterable[_Bucket], now: datetime) -> None:
    """The tokens left, and the counts, of the buckets an admission used or held back by.

    Index: the primary key."""
    rows = [(b.id, *b.settled(now), b.taken, b.throttled)
            for b in buckets if b.taken or b.throttled]
    if not rows:
        return
    source, params = named(table(
        [(bucket_id, tokens, json_dt(at), taken, held)
         for bucket_id, tokens, at, taken, held in rows],
        ("bigint", "float8", "timestamptz", "bigint", "bigint"), arrays_from=1, as_json=True),
        "rows")
    execute(f"WITH v(id, tokens, refilled_at, taken, held) AS ({source}) "
            f"UPDATE {LIMIT_BUCKETS} SET tokens = v.tokens, refilled_at = v.refilled_at, "
            "admitted = admitted + v.taken, throttled = throttled + v.held, "
            f"used_at = %(now)s FROM v WHERE {LIMIT_BUCKETS}.id = v.id",
            {**params, "now": dt(now)})


def _count_held_back(buckets: Iterable[_Bucket]) -> None:
    """Add the times these buckets held a due row back, without locking them (an update
    of the count alone; their tokens are left to the admissions that lock them).

    Index: the primary key."""
    rows = [(b.id, b.throttled) for b in buckets if b.throttled and b.id]
    if not rows:
        return
    source, params = named(table(rows, ("bigint", "bigint"), arrays_from=1, as_json=True),
                           "rows")
    fetch(f"WITH v(id, held) AS ({source}) UPDATE {LIMIT_BUCKETS} SET throttled = "
          f"throttled + v.held FROM v WHERE {LIMIT_BUCKETS}.id = v.id", params, prepare=True)


class _Plan(NamedTuple):
    takes: dict[tuple[str, str], int]  # (target, limit key) -> rows to take
    buckets: dict[tuple[str, str, str], _Bucket]
    wait_s: float | None
    # The admission's time: the caller's, or the latest refill of a bucket it locked if that
    # is later (another worker's admission with a later clock committed first). Tokens are
    # counted at it, and so never twice: a bucket's time only moves forward.
    at: datetime
    held_back: bool = False  # a key's take was cut by its buckets' room


def _plan(keys: Sequence[tuple[Target, str]], limit: int, at_most_once: int, now: datetime,
          running: Mapping[tuple[str, str], int] | None, rated: int | None = None,
          wants: Mapping[tuple[str, str], int] | None = None, *, lock: bool = True) -> _Plan:
    """Lock the buckets of ``keys`` (in their heads' run order) and share ``limit`` rows
    among them as the slots and tokens allow, of which at most ``rated`` (None: no bound
    of its own) of targets with a rate limit. ``running``: None to count the running rows
    after the locks (the long lane); the fast lane has none. ``wants``: the rows each key
    has read (the fast lane); without it a key is held back only when it gets none.
    ``lock`` False: a guess from the buckets as they are, nothing locked or written."""
    wanted = [(target, lim, key_of(lim, key)) for target, key in keys
              for lim in target.limits.limits]
    buckets = _lock_buckets(wanted, now, lock=lock)
    now = max([now] + [b.refilled_at for b in buckets.values() if b.refilled_at is not None
                       and not (b.blocked_until is not None and b.blocked_until > now)])
    if running is None:
        counted = (_running(sorted({t.name for t, _ in keys}))
                   if any(isinstance(lim, Concurrency) for _, lim, _ in wanted) else {})
        per_target: dict[str, int] = defaultdict(int)
        for (target_name, _), count in counted.items():
            per_target[target_name] += count
        for (target_name, _name, key), bucket in buckets.items():
            bucket.running = (per_target[target_name] if bucket.limit.per == PER_TARGET
                              else counted.get((target_name, key), 0))
    takes: dict[tuple[str, str], int] = {}
    held_back = False
    waits: list[float] = []
    for target, key in keys:
        mine = [buckets[(target.name, lim.name, key_of(lim, key))]
                for lim in target.limits.limits]
        at_most_once_row = target.delivery_mode._value_ == "at_most_once"
        has_rate = rated is not None and any(isinstance(b.limit, Rate) for b in mine)
        wants_here = limit if wants is None else wants.get((target.name, key), 0)
        room = min(bucket.room(now) for bucket in mine)
        bound = min([limit, wants_here] + ([at_most_once] if at_most_once_row else [])
                    + ([rated] if has_rate and rated is not None else []))
        held_back |= room < bound
        take = max(min(room, bound), 0)
        if take:
            takes[(target.name, key)] = take
            limit -= take
            at_most_once -= take if at_most_once_row else 0
            if has_rate and rated is not None:
                rated -= take
            for bucket in mine:
                bucket.taken += take
        if (take == 0 if wants is None else take < wants_here) and limit + take > 0:
            for bucket in mine:  # the limits that held this key back
                if bucket.room(now) == 0:
                    bucket.throttled += 1
                    wait = bucket.wait_s(now)
                    if wait is not None:
                        waits.append(wait)
    return _Plan(takes, buckets, min(waits) if waits else None, now, held_back)


def _due_keys(targets: Sequence[str], now: datetime, after: KeyCursor, count: int
              ) -> list[tuple[str, str]]:
    """Up to ``count`` keys of ``targets`` (none paused) with a due row, from ``after`` on
    in key order.

    Index: ``jobs_limited_pending``, read as a skip scan per target: one descent per key
    waiting, and each key's first due row, at any depth of its backlog."""
    start = ">=" if after.key is None else ">"
    params = {"pending": PENDING_VALUE, "now": dt(now), "keys": count,
              "after": after.key or ""}
    if is_postgres():
        return [(target, key) for target, key in fetch(
            "WITH RECURSIVE keys(target, limit_key) AS ("
            "SELECT f.target, f.limit_key FROM unnest(%(targets)s::text[]) AS t(name) "
            f"CROSS JOIN LATERAL (SELECT j.target, j.limit_key FROM {JOBS} j "
            "WHERE j.status = %(pending)s AND j.limit_key IS NOT NULL AND j.target = t.name "
            f"AND j.limit_key {start} %(after)s ORDER BY j.limit_key LIMIT 1) AS f "
            "UNION ALL SELECT n.target, n.limit_key FROM keys k CROSS JOIN LATERAL ("
            f"SELECT j.target, j.limit_key FROM {JOBS} j WHERE j.status = %(pending)s "
            "AND j.limit_key IS NOT NULL AND j.target = k.target "
            "AND j.limit_key > k.limit_key ORDER BY j.limit_key LIMIT 1) AS n) "
            f"SELECT k.target, k.limit_key FROM keys k WHERE NOT EXISTS (SELECT 1 FROM {PAUSES} "
            "p WHERE p.target = k.target AND p.paused_until > %(now)s) "
            f"AND EXISTS (SELECT 1 FROM {JOBS} j WHERE j.status = %(pending)s "
            "AND j.limit_key = k.limit_key AND j.target = k.target "
            "AND j.next_run_at <= %(now)s) LIMIT %(keys)s",
            # Not prepared: a generic plan, blind to the cursor and the clock, read every
            # row of the key (0.2 ms planned for its values, 500 ms generic at 300,000 rows).
            {**params, "targets": text_array(sorted(targets))})]
    clause, target_params = named(in_("j.target", targets), "targets")
    return [(target, key) for target, key in fetch(
        f"SELECT DISTINCT j.target, j.limit_key FROM {JOBS} j WHERE j.status = %(pending)s "
        f"AND j.limit_key IS NOT NULL AND {clause} AND j.limit_key {start} %(after)s "
        f"AND j.next_run_at <= %(now)s AND NOT EXISTS (SELECT 1 FROM {PAUSES} p "
        "WHERE p.target = j.target AND p.paused_until > %(now)s) "
        "ORDER BY j.limit_key, j.target LIMIT %(keys)s", {**params, **target_params})]


def _due_targets(targets: Sequence[str], now: datetime) -> list[str]:
    """Of ``targets``, each keyed on the target alone (PostgreSQL), those not paused with a
    due row.

    Index: ``jobs_limited_pending``, one probe per target."""
    if not targets:
        return []
    return [target for target, in fetch(
        "SELECT t.name FROM unnest(%(targets)s::text[]) AS t(name) WHERE NOT EXISTS ("
        f"SELECT 1 FROM {PAUSES} p WHERE p.target = t.name AND p.paused_until > %(now)s) "
        f"AND EXISTS (SELECT 1 FROM {JOBS} j WHERE {LIMITED_PENDING} "
        f"AND j.limit_key = '{TARGET_KEY}' AND j.target = t.name AND j.next_run_at <= %(now)s) "
        "ORDER BY t.name", {"targets": text_array(targets), "now": dt(now)}, prepare=True)]


def _next_due(targets: Sequence[str], now: datetime) -> datetime | None:
    """When the next row of ``targets`` not yet due comes due (the admission found none
    due).

    Index: ``jobs_limited_pending``."""
    clause, params = named(in_("j.target", targets), "targets")
    rows = fetch(f"SELECT MIN(j.next_run_at) FROM {JOBS} j WHERE {LIMITED_PENDING} "
                 f"AND {clause} AND j.next_run_at > %(now)s", {**params, "now": dt(now)},
                 prepare=True)
    return read_dt(rows[0][0]) if rows else None


def jobs_long_reserve_limited(owner: str, token: str, now: datetime, lease_s: float,
                              limit: int, *, targets: Sequence[Target], start: bool = False,
                              at_most_once_limit: int | None = None,
                              rated_limit: int | None = None,
                              after: KeyCursor = FIRST_KEYS) -> Admitted:
    """Claim up to ``limit`` due rows of the limited long-lane ``targets`` that their limits
    admit now, under a lease, like ``jobs_long_reserve``; at most ``rated_limit`` of them
    of targets with a rate limit (the lane's idle threads: a rate counts starts, and a row
    queued behind busy threads would start later than its token was taken).

    Index: ``jobs_limited_pending`` (the keys, then each key's first rows),
    ``jobs_limited_running`` (the slots in use), ``jobs_limit_bucket_key``.
    A row not admitted is not touched: it keeps its place, its attempts and its status.
    The keys looked at are a few from ``after`` on (``KEYS_PER_ROW`` per row it may take);
    ``Admitted.cursor`` is where the next admission looks. ``wait_s``: when a token, the
    end of a block or a deferred row lets the next admission take more (the lane sleeps
    no longer than that); 0 when every key looked at was held back and more keys follow."""
    by_name = {t.name: t for t in targets}
    if limit <= 0:
        return Admitted(ReservedRows(), None, now, after)
    count = max(MIN_KEYS, KEYS_PER_ROW * limit)
    # A target keyed on itself alone has one key: whether it has a due row is one probe,
    # where the skip scan is a statement planned for its values at every admission.
    whole = sorted(name for name, target in by_name.items() if is_postgres()
                   and all(lim.per == PER_TARGET for lim in target.limits.limits))
    keyed = sorted(set(by_name) - set(whole))
    found = _due_keys(keyed, now, after, count) if keyed else []
    cursor = KeyCursor(found[-1][1]) if len(found) == count else FIRST_KEYS
    keys = ([(by_name[target], TARGET_KEY) for target in _due_targets(whole, now)]
            + [(by_name[target], key) for target, key in found])
    if not keys:
        due = _next_due(sorted(by_name), now) if after is FIRST_KEYS else now
        return Admitted(ReservedRows(), None if due is None else
                        max(0.0, (due - now).total_seconds()), now, cursor)
    at_most_once = limit if at_most_once_limit is None else min(limit, at_most_once_limit)
    if is_postgres():
        # A plan from the buckets as they are, unlocked; one call then locks them, counts
        # again and cuts each key's take to what they allow (the locks held for that call
        # only). Every key held back: counted, nothing locked.
        plan = _plan(keys, limit, at_most_once, now, None, rated_limit, lock=False)
        if plan.takes:
            reserved, at = _admit(plan, by_name, owner, token, lease_s, start)
        else:
            _count_held_back(plan.buckets.values())
            reserved, at = [], plan.at
    else:  # one writer at a time: the buckets' lock is the database's
        with transaction.atomic():
            plan = _plan(keys, limit, at_most_once, now, None, rated_limit)
            reserved = (_take(plan.takes, owner, token, plan.at, lease_s, start)
                        if plan.takes else [])
            _write_buckets(_given_back(plan, reserved, by_name).buckets.values(), plan.at)
        at = plan.at
    reserved.sort(key=lambda r: (r.job.target, r.job.id))
    wait_s = 0.0 if not reserved and cursor is not FIRST_KEYS else plan.wait_s
    return Admitted(ReservedRows(reserved), wait_s, at, cursor, plan.held_back)


def _given_back(plan: _Plan, reserved: Sequence[Reserved], by_name: Mapping[str, Target]
                ) -> _Plan:
    """``plan`` with the slots and tokens of the rows it could not take (another worker
    had locked them) given back to its buckets."""
    got: dict[tuple[str, str], int] = defaultdict(int)
    for row in reserved:
        got[(row.job.target, row.job.limit_key or TARGET_KEY)] += 1
    for (target_name, key), take in plan.takes.items():
        short = take - got[(target_name, key)]
        if short:
            for lim in by_name[target_name].limits.limits:
                plan.buckets[(target_name, lim.name, key_of(lim, key))].taken -= short
    return plan


# The admission function's arrays, in its arguments' order, and their types.
_ADMIT_ARRAYS = (("k_target", "text"), ("k_key", "text"), ("k_take", "integer"),
                 ("b_target", "text"), ("b_name", "text"), ("b_key", "text"),
                 ("b_slots", "integer"), ("b_starts", "integer"),
                 ("b_period_s", "double precision"), ("b_burst", "integer"),
                 ("b_whole", "boolean"), ("b_held", "integer"), ("k_of", "integer"),
                 ("b_of", "integer"))
_ADMIT = (f"SELECT {_RESERVED_COLUMNS}, {JOBS}.updated_at FROM {LIMITS_ADMIT_FUNCTION}("
          + ", ".join(f"%({name})s::{kind}[]" for name, kind in _ADMIT_ARRAYS)
          + f", %(owner)s, %(token)s, %(now)s, %(lease_s)s, %(start)s) AS {JOBS}")


def _admit(plan: _Plan, by_name: Mapping[str, Target], owner: str, token: str,
           lease_s: float, start: bool) -> tuple[list[Reserved], datetime]:
    """``plan``'s takes claimed by ``jobs_engine_limits_admit`` (``sql/enqueue.sql``),
    which holds them to the buckets as it locks them; the rows, and the admission's time.

    Index: ``jobs_limit_bucket_key``, ``jobs_limited_running``, ``jobs_limited_pending``."""
    names = list(plan.buckets)
    place = {name: n for n, name in enumerate(names, 1)}
    limits = [bucket.limit for bucket in plan.buckets.values()]
    links = [(k, place[(target_name, lim.name, key_of(lim, key))])
             for k, (target_name, key) in enumerate(plan.takes, 1)
             for lim in by_name[target_name].limits.limits]
    rates = [lim if isinstance(lim, Rate) else None for lim in limits]
    arrays = {
        "k_target": text_array([target for target, _ in plan.takes]),
        "k_key": text_array([key for _, key in plan.takes]),
        "k_take": int_array(list(plan.takes.values())),
        "b_target": text_array([target for target, _, _ in names]),
        "b_name": text_array([name for _, name, _ in names]),
        "b_key": text_array([key for _, _, key in names]),
        "b_slots": number_array([lim.slots if isinstance(lim, Concurrency) else None
                                 for lim in limits]),
        "b_starts": number_array([None if r is None else r.starts for r in rates]),
        "b_period_s": number_array([None if r is None else float(r.period_s)
                                    for r in rates]),
        "b_burst": number_array([None if r is None else r.burst for r in rates]),
        "b_whole": number_array([lim.per == PER_TARGET for lim in limits]),
        "b_held": int_array([bucket.throttled for bucket in plan.buckets.values()]),
        "k_of": int_array([k for k, _ in links]),
        "b_of": int_array([b for _, b in links])}
    rows = fetch(_ADMIT, {**arrays, "owner": owner, "token": token, "now": dt(plan.at),
                          "lease_s": float(lease_s), "start": start}, prepare=True)
    return [_reserved(row) for row in rows], read_instant(rows[0][-1]) if rows else plan.at


def _take(takes: Mapping[tuple[str, str], int], owner: str, token: str, now: datetime,
          lease_s: float, start: bool) -> list[Reserved]:
    """Claim each key's first ``take`` due rows, in the admission's transaction (SQLite;
    PostgreSQL's admission claims them in ``jobs_engine_limits_admit``).

    Index: ``jobs_limited_pending``; the primary key on the update."""
    params: dict[str, Any] = {
        "pending": PENDING_VALUE, "now": dt(now), "running": RESERVE.target, "token": token,
        "owner": owner, "lease_until": dt(now + timedelta(seconds=lease_s)), "start": start}
    ids: list[int] = []
    for (target_name, key), take in takes.items():
        ids += [row[0] for row in fetch(
            f"SELECT j.id FROM {JOBS} j WHERE j.status = %(pending)s AND j.limit_key = %(key)s "
            "AND j.target = %(target)s AND j.next_run_at <= %(now)s "
            "ORDER BY j.priority DESC, j.next_run_at, j.id LIMIT %(take)s",
            {**params, "key": key, "target": target_name, "take": take})]
    if not ids:
        return []
    clause, id_params = named(in_("id", ids), "ids")
    return [_reserved(row) for row in fetch(
        f"UPDATE {JOBS} SET status = %(running)s, claim_token = %(token)s, "
        "claimed_by = %(owner)s, lease_until = %(lease_until)s, "
        f"started_at = {_STARTED_AT}, updated_at = %(now)s WHERE {clause} "
        f"AND status = %(pending)s RETURNING {_RESERVED_COLUMNS}", {**params, **id_params})]


def limits_admit_fast(jobs: Sequence[Job], targets: Mapping[str, Target], now: datetime
                      ) -> tuple[list[Job], float | None]:
    """The fast lane's read rows that their targets' rate limits admit now, and when a row
    held back could go (seconds; None: none held back); the others are not sent and keep
    their place (a key's head held back holds its key's later rows).

    Index: ``jobs_limit_bucket_key``. Rows of targets without limits pass untouched; the
    tokens taken commit at once, before the sends."""
    limited = [job for job in jobs if job.target in targets]
    if not limited:
        return list(jobs), None
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for job in limited:
        counts[(job.target, job.limit_key or TARGET_KEY)] += 1
    keys = [(targets[target], key) for target, key in counts]
    with transaction.atomic():
        plan = _plan(keys, len(limited), len(limited), now, running={}, wants=counts)
        takes = dict(plan.takes)
        _write_buckets(plan.buckets.values(), plan.at)
    # A key's tokens go to its oldest rows first (ids grow with the enqueue), so no key's
    # head waits behind rows that came later.
    chosen: set[int | None] = set()
    for job in sorted(limited, key=lambda job: job.id or 0):
        key = (job.target, job.limit_key or TARGET_KEY)
        if takes.get(key, 0) > 0:
            takes[key] -= 1
            chosen.add(job.id)
    admitted = [job for job in jobs if job.target not in targets or job.id in chosen]
    held_back = len(admitted) < len(jobs)
    return admitted, plan.wait_s if held_back else None


def limits_block(target: Target, limit_key: str | None, until: datetime, now: datetime
                 ) -> None:
    """A handler of ``target`` raised ``RateLimited``: each of its limits' buckets of the
    row's key takes no start until ``until`` (its rate tokens emptied), counted as held
    back once. A bucket's time never moves back: ``until`` read on a worker's clock that
    lags another's admission would otherwise refill the tokens that admission took.

    Index: ``jobs_limit_bucket_key``."""
    rows = [(target.name, lim.name, key_of(lim, limit_key)) for lim in target.limits.limits]
    if not rows:
        return
    source, params = named(table(rows, ("text", "text", "text"), arrays_from=1, as_json=True),
                           "keys")
    execute(f"WITH v(target, name, key) AS ({source}) INSERT INTO {LIMIT_BUCKETS} AS b "
            "(target, name, key, tokens, refilled_at, blocked_until, admitted, throttled, "
            "used_at) SELECT target, name, key, 0, %(until)s, %(until)s, 0, 1, %(now)s FROM v "
            "WHERE true ON CONFLICT (target, name, key) DO UPDATE SET tokens = 0, "
            f"refilled_at = {_later('b.refilled_at', 'excluded.refilled_at')}, "
            f"blocked_until = {_later('b.blocked_until', 'excluded.blocked_until')}, "
            "throttled = b.throttled + 1", {**params, "now": dt(now), "until": dt(until)})


def _later(kept: str, new: str) -> str:
    """The later of a bucket's time and a new one (the new one where it had none)."""
    return greatest(f"COALESCE({kept}, {new})", new)


def limit_buckets_prune(target: str, name: str, idle_before: datetime, now: datetime,
                        batch: int) -> int:
    """Remove up to ``batch`` buckets of one limit's keys (never the target's own) unused
    since ``idle_before`` and not blocked: a bucket idle that long is as a new one would be
    (no running rows it counts, its tokens full), so keys that come and go (customers,
    accounts) do not pile up. Returns how many were removed.

    Index: ``jobs_limit_bucket_used``."""
    return execute(
        f"DELETE FROM {LIMIT_BUCKETS} WHERE id IN (SELECT id FROM {LIMIT_BUCKETS} "
        "WHERE used_at < %(idle_before)s AND target = %(target)s AND name = %(name)s "
        "AND key <> '' AND (blocked_until IS NULL OR blocked_until < %(now)s) "
        "LIMIT %(batch)s)",
        {"idle_before": dt(idle_before), "target": target, "name": name, "now": dt(now),
         "batch": batch})


def limits_unkey(targets: Sequence[str], batch: int) -> int:
    """Take the ``limit_key`` off up to ``batch`` PENDING rows of ``targets``, which have no
    limits now (a deploy dropped them): the reserve of targets without limits finds them
    again. Returns the rows changed.

    Index: ``jobs_limited_pending``."""
    if not targets:
        return 0
    clause, params = named(in_("j.target", targets, arrays_from=1), "targets")
    return execute(
        f"UPDATE {JOBS} SET limit_key = NULL WHERE id IN (SELECT j.id FROM {JOBS} j "
        f"WHERE j.status = %(pending)s AND j.limit_key IS NOT NULL AND {clause} "
        "LIMIT %(batch)s)", {**params, "pending": PENDING_VALUE, "batch": batch})


def limits_rekey(target: Target, batch: int) -> int:
    """Give up to ``batch`` PENDING long-lane rows of the limited ``target`` enqueued before
    it declared limits the ``limit_key`` its limits use. Returns the rows changed. Their
    lookup walks the index of rows without limits: the caller does it now and then.

    Index: ``jobs_long_pending_due``."""
    params: dict[str, Any] = {"target": target.name, "batch": batch}
    per = target.limits.key_per
    if per == PER_TENANT:
        key = "COALESCE(tenant_id, '')"
    elif per == PER_CODE:
        key = "code"
    elif per is not None and per.startswith(FIELD_PREFIX):
        key = f"COALESCE({json_text_field('payload', '%(field)s')}, '')"
        params["field"] = per.removeprefix(FIELD_PREFIX)
    else:  # the target as a whole, or a limit_key= never given
        key = "''"
    return execute(
        f"UPDATE {JOBS} SET limit_key = {key} WHERE id IN (SELECT j.id FROM {JOBS} j "
        f"WHERE {LONG_PENDING} AND j.target = %(target)s LIMIT %(batch)s)", params)


@dataclass(frozen=True)
class BucketState:
    """One key of one limit as operators see it: the values in force (``limit``, an
    override's when there is one), its running rows and tokens now, and its counts."""

    target: str
    limit: Limit
    declared: Limit
    key: str
    running: int
    tokens: float | None
    blocked_until: datetime | None
    admitted: int
    throttled: int
    used_at: datetime | None
    overridden: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)


def limits_state(targets: Sequence[Target], now: datetime) -> list[BucketState]:
    """Every bucket of ``targets``' limits, and a line for each limit that has none yet.

    Index: ``jobs_limit_bucket_key``, ``jobs_limited_running``. Read without locks."""
    names = sorted({t.name for t in targets if t.limits})
    if not names:
        return []
    clause, params = named(in_("b.target", names, arrays_from=1), "targets")
    buckets = fetch(f"SELECT b.target, b.name, b.key, b.tokens, b.refilled_at, "
                    f"b.blocked_until, b.admitted, b.throttled, b.used_at "
                    f"FROM {LIMIT_BUCKETS} b WHERE {clause} ORDER BY b.target, b.name, b.key",
                    params)
    o_clause, o_params = named(in_("target", names, arrays_from=1), "targets")
    overrides = {(target, name): rest for target, name, *rest in fetch(
        f"SELECT target, name, slots, starts, period_s, burst FROM {LIMIT_OVERRIDES} "
        f"WHERE {o_clause}", o_params)}
    counted = _running(names)
    by_name = {t.name: t for t in targets}
    states: list[BucketState] = []
    seen: set[tuple[str, str]] = set()
    for target_name, name, key, tokens, refilled_at, blocked_until, admitted, throttled, \
            used_at in buckets:
        target = by_name[target_name]
        declared = target.limits.by_name.get(name)
        if declared is None:
            continue  # a limit a deploy removed
        seen.add((target_name, name))
        override = overrides.get((target_name, name))
        limit = effective_limit(declared, override) if override else declared
        bucket = _Bucket(0, limit, key, tokens, read_dt(refilled_at), read_dt(blocked_until))
        running = (sum(c for (t, _), c in counted.items() if t == target_name)
                   if limit.per == PER_TARGET else counted.get((target_name, key), 0))
        states.append(BucketState(
            target_name, limit, declared, key, running,
            bucket.tokens_at(now) if isinstance(limit, Rate) else None,
            bucket.blocked_until, admitted, throttled, read_dt(used_at), override is not None))
    for name in names:
        for declared in by_name[name].limits.limits:
            if (name, declared.name) not in seen:
                override = overrides.get((name, declared.name))
                limit = effective_limit(declared, override) if override else declared
                states.append(BucketState(
                    name, limit, declared, TARGET_KEY,
                    sum(c for (t, _), c in counted.items() if t == name),
                    float(limit.burst or 0) if isinstance(limit, Rate) else None, None, 0, 0,
                    None, override is not None))
    return states
