"""The ``poll`` phase: what one fast-lane poll and one long-lane reserve cost at a small and a
big backlog (the poll must not grow with the queue), in two layouts, with the plans written
to ``<results>/explain_fast_poll.txt``. Runs in the bench's process on its database
connection (no workers); import after ``django.setup()``.
"""

from __future__ import annotations

import contextlib
import json
import re
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from django.db import connection, transaction

from bench import targets
from bench.harness import Metrics, Options, analyze, payload, reset, sql
from jobs_engine import store
from jobs_engine.conf import jobs_settings
from jobs_engine.store import dialect

POLL_PARTITIONS = list(range(21))  # a third of 64: one of three workers
POLL_OWNER = "bench-poll"  # a worker id that holds no partition lease


INSERT_COLUMNS = (
    "code, target, lane, key, partition, version, payload, headers, dedupe_key, status, "
    "delivery_mode, attempts, next_run_at, last_error, trace_id, created_at, updated_at"
)


def backlog(n: int, held_front: bool = False, versions: int = 20) -> None:
    """``n`` PENDING rows for the poll-cost phase, built in one INSERT ... SELECT.

    Default layout: due fast rows over 64 partitions, one in 7 without a key, the rest on
    n/``versions`` keys with ~``versions`` versions each (version order = run order; at
    1,000 rows and 20 versions a window of the held partitions holds few heads, so
    ``versions=1`` gives the small backlog a full window); one key in 100 has its
    first version waiting for a retry an hour away, which holds its later versions.
    ``held_front`` (stress layout): a tenth of the rows are later versions of n/1000 keys
    whose first version waits for a retry, stored at the head's retry time as the engine
    stores them. Both layouts add
    n/100 long-lane rows for the long-lane reserve query."""
    reset()
    held = n // 10 if held_front else 0
    hot = max(1, n // 1000)
    plain = n - held
    keys = max(1, plain // versions)
    n_long = max(10, n // 100)
    fast = [targets.AT_MOST_ONCE, targets.AT_MOST_ONCE]
    if not store.is_postgres():
        backlog_sqlite(plain, keys, held, hot, n_long)
        return
    payload_sql = ("jsonb_build_object('i', g, 'ts', extract(epoch FROM now()), "
                   "'msg', 'hello world'), '{}'::jsonb")
    sql(
        f"INSERT INTO {store.JOBS} ({INSERT_COLUMNS}) SELECT %s, %s, 'fast', "
        "CASE WHEN g %% 7 = 6 THEN NULL ELSE 'k' || (g %% %s) END, "
        "CASE WHEN g %% 7 = 6 THEN g %% 64 ELSE (g %% %s) %% 64 END, "
        f"CASE WHEN g %% 7 = 6 THEN 0 ELSE g / %s END, {payload_sql}, 'poll-' || g, "
        "'PENDING', 'at_most_once', "
        "CASE WHEN g < %s AND g %% 7 <> 6 AND g %% 100 = 0 THEN 1 ELSE 0 END, "
        "CASE WHEN g < %s AND g %% 7 <> 6 AND g %% 100 = 0 THEN now() + interval '1 hour' "
        "ELSE now() - interval '1 hour' + g * interval '1 microsecond' END, "
        "'', '', now(), now() FROM generate_series(0, %s - 1) AS g",
        [*fast, keys, keys, keys, keys, keys, plain],
    )
    if held:
        # The heads of the hot keys, retrying in an hour ...
        sql(f"INSERT INTO {store.JOBS} ({INSERT_COLUMNS}) SELECT %s, %s, 'fast', 'hot' || g, "
            f"g %% 64, 0, {payload_sql}, 'poll-head-' || g, 'PENDING', 'at_most_once', 1, "
            "now() + interval '1 hour', '', '', now(), now() FROM generate_series(0, %s - 1) g",
            [*fast, hot])
        # ... hold their later versions, which the engine stores at the head's retry time
        # (a retry moves them there; a row enqueued behind a retrying head starts there).
        sql(f"INSERT INTO {store.JOBS} ({INSERT_COLUMNS}) SELECT %s, %s, 'fast', "
            f"'hot' || (g %% %s), (g %% %s) %% 64, g / %s + 1, {payload_sql}, 'poll-held-' || g, "
            "'PENDING', 'at_most_once', 0, now() + interval '1 hour', '', '', now(), now() "
            "FROM generate_series(0, %s - 1) g",
            [*fast, hot, hot, hot, held - hot])
    sql(f"INSERT INTO {store.JOBS} ({INSERT_COLUMNS}) SELECT %s, %s, 'long', NULL, g %% 64, 0, "
        f"{payload_sql}, 'poll-long-' || g, 'PENDING', 'at_most_once', 0, "
        "now() - interval '1 hour' + g * interval '1 microsecond', '', '', now(), now() "
        "FROM generate_series(0, %s - 1) AS g",
        [targets.LONG, targets.LONG, n_long])
    sql(f"VACUUM ANALYZE {store.JOBS}")


def backlog_sqlite(plain: int, keys: int, held: int, hot: int, n_long: int) -> None:
    """The same layouts row by row (SQLite has no generate_series)."""
    base = store.db_now().timestamp() - 3600

    def at(offset_s: float) -> Any:
        return dialect.dt(datetime.fromtimestamp(base + offset_s, UTC))

    def rows() -> Iterator[list[Any]]:
        fast = [targets.AT_MOST_ONCE, targets.AT_MOST_ONCE, "fast"]
        for g in range(plain):
            keyed = g % 7 != 6
            waiting = keyed and g < keys and g % 100 == 0
            yield [*fast, f"k{g % keys}" if keyed else None,
                   (g % keys) % 64 if keyed else g % 64, g // keys if keyed else 0,
                   json.dumps(payload(g)), "{}", f"poll-{g}", "PENDING", "at_most_once",
                   1 if waiting else 0, at(7200) if waiting else at(g / 1e6)]
        if held:
            for g in range(hot):
                yield [*fast, f"hot{g}", g % 64, 0, json.dumps(payload(g)), "{}",
                       f"poll-head-{g}", "PENDING", "at_most_once", 1, at(7200)]
            for g in range(held - hot):
                yield [*fast, f"hot{g % hot}", (g % hot) % 64, g // hot + 1,
                       json.dumps(payload(g)), "{}", f"poll-held-{g}", "PENDING",
                       "at_most_once", 0, at(7200)]
        for g in range(n_long):
            yield [targets.LONG, targets.LONG, "long", None, g % 64, 0, json.dumps(payload(g)),
                   "{}", f"poll-long-{g}", "PENDING", "at_most_once", 0, at(g / 1e6)]

    insert = (f"INSERT INTO {store.JOBS} ({INSERT_COLUMNS}) VALUES "
              "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, '', '', "
              "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)")
    batch: list[list[Any]] = []
    with transaction.atomic(), connection.cursor() as cursor:
        for row in rows():
            batch.append(row)
            if len(batch) == 10_000:
                cursor.executemany(insert, batch)
                batch = []
        if batch:
            cursor.executemany(insert, batch)
    analyze()


def capture_sql(call: Callable[[], Any]) -> list[tuple[str, Any]]:
    """The statements ``call`` runs, with their parameters, with ``%s`` placeholders (a
    worker session's prepared statements reach the backend with PostgreSQL's own,
    ``$1``..., made by ``store.connection.native_placeholders``), to run on Django's cursor."""
    seen: list[tuple[str, Any]] = []

    def wrapper(execute: Any, query: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(_percent_placeholders(query, params))
        return execute(query, params, many, context)

    with connection.execute_wrapper(wrapper):
        call()
    return seen


def _percent_placeholders(query: str, params: Any) -> tuple[str, Any]:
    """``store.connection.native_placeholders`` undone: ``$n`` back to ``%s``, ``%`` doubled,
    and the parameters in the text's order (a named parameter's number may repeat)."""
    if not _NATIVE.search(query):
        return query, params
    numbers = [int(n) for n in _NATIVE.findall(query)]
    return (_NATIVE.sub("%s", query.replace("%", "%%")),
            [params[n - 1] for n in numbers])


_NATIVE = re.compile(r"\$(\d+)")


class _Rollback(Exception):
    pass


def long_candidate_sql() -> tuple[str, Any]:
    """The long-lane reserve statement (on PostgreSQL one statement that picks and claims,
    elsewhere its candidate SELECT), captured from ``store.jobs_long_reserve`` in a
    rolled-back transaction (so the EXPLAIN shows the statement the store really runs)."""
    captured: list[tuple[str, Any]] = []
    with contextlib.suppress(_Rollback), transaction.atomic():
        captured = capture_sql(lambda: store.jobs_long_reserve(
            "bench-explain", uuid.uuid4().hex, store.db_now(), 300, jobs_settings().LONG_BATCH,
            exclusive_targets=[targets.LONG_EXCLUSIVE],
            targets=[targets.LONG, targets.LONG_EXCLUSIVE]))
        raise _Rollback
    return next((q, p) for q, p in captured
                if q.lstrip().upper().startswith(("WITH LOCKED", "SELECT J.ID")))


def time_query(query: str, params: Any, reps: int) -> float:
    """Median ms of ``reps`` runs of one statement (in a rolled-back transaction, since the
    long-lane candidate query takes row locks)."""
    times: list[float] = []
    with contextlib.suppress(_Rollback), transaction.atomic(), connection.cursor() as cursor:
        for _ in range(reps):
            started = time.perf_counter()
            cursor.execute(query, params)
            cursor.fetchall()
            times.append((time.perf_counter() - started) * 1000)
        raise _Rollback
    return statistics.median(times)


def explain(query: str, params: Any) -> str:
    prefix = "EXPLAIN (ANALYZE, BUFFERS) " if store.is_postgres() else "EXPLAIN QUERY PLAN "
    with contextlib.suppress(_Rollback), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(prefix + query, params)
        lines = ["  ".join(str(c) for c in row) for row in cursor.fetchall()]
        raise _Rollback
    return "\n".join(lines)


# What a worker with the bench targets registered reads (the poll runs once per target).
POLL_TARGETS = {targets.AT_MOST_ONCE: 100}  # target -> rows per poll


def poll_at(n: int, reps: int, held_front: bool = False, versions: int = 20
            ) -> dict[str, Any]:
    started = time.perf_counter()
    backlog(n, held_front, versions)
    built_s = time.perf_counter() - started
    return {"n": n, "build_s": built_s, **measure_poll(reps)}


def fast_poll(now: datetime) -> int:
    """The worker's poll statement, prepared as in a worker (``POLL_OWNER`` holds no
    partition, so it marks nothing); the rows it read."""
    return len(store.jobs_fast_poll(POLL_PARTITIONS, now, POLL_TARGETS, owner=POLL_OWNER,
                                    token="bench-poll").jobs)


def measure_poll(reps: int) -> dict[str, Any]:
    """Median ms of one fast poll and of the long reserve's candidate query over ``reps``
    runs against the rows in the table now, with the statements (for ``explain``)."""
    now = store.db_now()
    times: list[float] = []
    handed = 0
    for _ in range(reps):
        t = time.perf_counter()
        handed = fast_poll(now)
        times.append((time.perf_counter() - t) * 1000)
    fast_sql, fast_params = capture_sql(lambda: fast_poll(now))[-1]
    long_sql, long_params = long_candidate_sql()
    return {"poll_ms": statistics.median(times), "rows": handed,
            "long_ms": time_query(long_sql, long_params, reps),
            "fast_sql": (fast_sql, fast_params), "long_sql": (long_sql, long_params)}


def phase_poll(o: Options) -> Metrics:
    """Poll and reserve cost at ``poll_small`` and ``poll_big`` rows, in the default layout
    and the stress layout; the big backlog's plans go to the results directory."""
    small = poll_at(o.poll_small, o.poll_reps)
    print(f"    poll at {small['n']:,}: {small['poll_ms']:.2f} ms ({small['rows']} rows), "
          f"long candidates {small['long_ms']:.2f} ms", flush=True)
    # The same work as the big poll's (a full window of heads): one version per key.
    full = poll_at(o.poll_small, o.poll_reps, versions=1)
    print(f"    poll at {full['n']:,}, one version per key: {full['poll_ms']:.2f} ms "
          f"({full['rows']} rows)", flush=True)
    big = poll_at(o.poll_big, o.poll_reps)
    print(f"    poll at {big['n']:,}: {big['poll_ms']:.2f} ms ({big['rows']} rows), "
          f"long candidates {big['long_ms']:.2f} ms (backlog built in {big['build_s']:.1f}s)",
          flush=True)
    fast_plan = explain(*big["fast_sql"])
    long_plan = explain(*big["long_sql"])
    held_small = poll_at(o.poll_small, o.poll_reps, held_front=True)
    held_big = poll_at(o.poll_big, max(5, o.poll_reps // 5), held_front=True)
    held_plan = explain(*held_big["fast_sql"])
    print(f"    stress layout (a tenth of the backlog held behind retrying key heads): "
          f"{held_small['poll_ms']:.2f} ms at {o.poll_small:,}, {held_big['poll_ms']:.2f} ms at "
          f"{o.poll_big:,} ({held_big['rows']} rows)", flush=True)
    write_plans(o, big, fast_plan, long_plan, held_plan)
    flags = plan_flags(fast_plan, long_plan)
    reset()
    return {
        "poll:small": small["poll_ms"], "poll:big": big["poll_ms"],
        "poll:ratio": big["poll_ms"] / small["poll_ms"],
        "poll:small_full": full["poll_ms"], "poll:ratio_full": big["poll_ms"] / full["poll_ms"],
        "poll:rows_small_full": full["rows"],
        "poll:rows_small": small["rows"], "poll:rows_big": big["rows"],
        "poll:long_small": small["long_ms"], "poll:long_big": big["long_ms"],
        "poll:long_ratio": big["long_ms"] / small["long_ms"],
        "poll:held_small": held_small["poll_ms"], "poll:held_big": held_big["poll_ms"],
        "poll:held_ratio": held_big["poll_ms"] / held_small["poll_ms"],
        **flags,
    }


def write_plans(o: Options, big: dict[str, Any], fast_plan: str, long_plan: str,
                held_plan: str) -> None:
    """The statements and their plans at the big backlog: ``explain_fast_poll.txt``."""
    o.results_dir.mkdir(parents=True, exist_ok=True)
    header = (f"# {datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC, {connection.vendor}, "
              f"{big['n']:,} PENDING fast rows + {max(10, big['n'] // 100):,} long rows, "
              f"{len(POLL_PARTITIONS)} partitions held, limit 100\n")
    text = (header + "\n## fast-lane poll (store.jobs_fast_poll, as a worker runs it)\n"
            + big["fast_sql"][0]
            + "\n-- params: " + repr(big["fast_sql"][1]) + "\n\n" + fast_plan
            + "\n\n## long-lane reserve candidate query (store.jobs_long_reserve)\n"
            + big["long_sql"][0] + "\n-- params: " + repr(big["long_sql"][1]) + "\n\n"
            + long_plan
            + f"\n\n## stress layout: fast-lane poll at {o.poll_big:,} rows, a tenth of them "
            "later versions of keys whose head waits for a retry\n"
            + held_plan + "\n")
    (o.results_dir / "explain_fast_poll.txt").write_text(text)


def plan_flags(fast_plan: str, long_plan: str) -> Metrics:
    """Whether the fast poll is index-backed (both indexes, no sequential scan); printed,
    and kept for the report's note."""
    uses = {name: name in fast_plan
            for name in ("jobs_fast_pending_due", "jobs_pending_key_order")}
    seq = f"Seq Scan on {store.JOBS}" in fast_plan or f"SCAN {store.JOBS}" in fast_plan
    long_uses_index = "jobs_long_pending_due" in long_plan
    print(f"    fast poll plan uses {uses}, seq scan: {seq}; long candidates use "
          f"jobs_long_pending_due: {long_uses_index}", flush=True)
    return {"poll:index_due": float(uses["jobs_fast_pending_due"]),
            "poll:index_key": float(uses["jobs_pending_key_order"]),
            "poll:seq_scan": float(seq)}
