"""What PostgreSQL and SQLite do differently, and nothing else.

The queue's statements are written once, in ``queue.py`` and ``operators.py``; the pieces
in which the two databases differ (array parameters, jsonb casts, row locks, NOTIFY, JSON
array tests, reading timestamps back, the clock) come from here. A third database (a
MongoDB implementation of a hot query, say) starts by reading this file.
"""

from __future__ import annotations

import itertools
import json
import re
import time
import weakref
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from functools import cache, lru_cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.utils import timezone
from django.utils.dateparse import parse_datetime

# Lists from this length on go to PostgreSQL as one array parameter: the statement's text
# stays the same whatever the length, so the driver does not parse a new text at every
# call (it caches only statements of up to 50 parameters). Shorter lists are inlined,
# which plans faster for the one-row statements of per-row sends.
ARRAY_FROM = 16


def conn(using: str | None = None) -> BaseDatabaseWrapper:
    """The connection itself, not ``django.db.connection``: that proxy looks the
    connection up again (a context-local read) at every attribute, dozens per poll."""
    return connections[using or DEFAULT_DB_ALIAS]


@cache
def _vendor(alias: str) -> str:
    # Fixed for the process, where ``connections[alias]`` is a context-local read: asked
    # several times a write, and once a row by ``dt``.
    return str(connections[alias].vendor)


def is_postgres(using: str | None = None) -> bool:
    return _vendor(using or DEFAULT_DB_ALIAS) == "postgresql"


# -- running statements ----------------------------------------------------------------


@cache
def _timestamptz_loader() -> type:
    # psycopg is imported only on PostgreSQL: a SQLite-only project need not install it.
    from psycopg.types.datetime import TimestamptzLoader

    return TimestamptzLoader


# A statement's parameters: positional (``%s``) or named (``%(name)s``); a text uses one kind.
Params = Sequence[Any] | Mapping[str, Any]


def fetch(sql: str, params: Params = (), using: str | None = None, *,
          prepare: bool = False) -> list[tuple[Any, ...]]:
    """The rows of ``sql``. ``prepare`` (PostgreSQL): the server keeps the statement's plan
    on this connection, for a statement whose text repeats and whose planning costs more
    than its run (the fast lane's poll: ~2 ms to plan, ~0.4 ms to run)."""
    db = conn(using)
    if prepare and db.vendor == "postgresql":
        cursor = _prepared_cursor(db)  # the session's own, kept open: not closed here
        text, names = native_placeholders(sql)
        cursor.execute(text, [params[name] for name in names]
                       if isinstance(params, Mapping) else params)
        return cursor.fetchall() if cursor.description else []
    with db.cursor() as cursor:
        if db.vendor == "postgresql":
            _load_timestamptz(cursor.cursor)
        cursor.execute(*positional(sql, params))
        return cursor.fetchall() if cursor.description else []


@lru_cache(maxsize=512)
def native_placeholders(sql: str) -> tuple[str, tuple[str, ...]]:
    """``sql`` with PostgreSQL's own placeholders (``$1``, ``$2``, ...) for the session's
    ``RawCursor``, made once per text, and the parameter names in their numbers' order
    (none for a positional text; a name used twice is one number). psycopg converts
    ``%s`` at every execution, and caches the conversion only for texts under 4 kB: the
    long-lane reserve with 500 registered targets (49 kB) spent 0.3 ms a reserve in it."""
    numbers = itertools.count(1)
    names: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        if match.group() == "%%":
            return "%"
        name = match.group(1)
        if name is None:
            return f"${next(numbers)}"
        if name not in names:
            names[name] = next(numbers)
        return f"${names[name]}"

    return _PLACEHOLDER.sub(number, sql), tuple(names)


_PLACEHOLDER = re.compile(r"%%|%s|%\((\w+)\)s")


def positional(sql: str, params: Params) -> tuple[str, Sequence[Any]]:
    """``sql`` and ``params`` as Django's cursors take them on every database (``%s``)."""
    if not isinstance(params, Mapping):
        return sql, params
    text, names = _positional_names(sql)
    return text, [params[name] for name in names]


@lru_cache(maxsize=512)
def _positional_names(sql: str) -> tuple[str, tuple[str, ...]]:
    """``sql``'s named placeholders as ``%s``, and the name of each, in the text's order."""
    names: list[str] = []

    def unnamed(match: re.Match[str]) -> str:
        if match.group(1) is None:
            return match.group()  # ``%%`` stays for the driver; a text is named or not
        names.append(match.group(1))
        return "%s"

    return _PLACEHOLDER.sub(unnamed, sql), tuple(names)


def named(fragment: tuple[str, Sequence[Any]], name: str) -> tuple[str, dict[str, Any]]:
    """A fragment made with positional parameters (``in_``, ``table``, ``values_``) for a
    statement with named ones: its one parameter ``name``, or ``name_0``, ``name_1``..."""
    sql, params = fragment
    keys = [name] if len(params) == 1 else [f"{name}_{n}" for n in range(len(params))]
    places = iter(keys)
    text = _PLACEHOLDER.sub(lambda m: m.group() if m.group() == "%%" else f"%({next(places)})s",
                            sql)
    return text, dict(zip(keys, params, strict=True))


def _load_timestamptz(cursor: Any) -> None:
    """The driver's own timestamptz loader: Django's wrapper re-sets the time zone of every
    value in Python, a third of the fast lane's row decoding. The driver's values are
    aware, in the session time zone Django sets: the same instants."""
    cursor.adapters.register_loader("timestamptz", _timestamptz_loader())


# How long a worker session keeps the generic plans of its prepared statements before it
# makes them again (seconds, monotonic): a plan is made for the table's size at the time.
REPLAN_S = 1.0
# Sessions whose prepared statements are this module's only -> when their plans were made.
_plans_made: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
# Sessions whose plans were made while this process's worker was finding rows.
_made_busy: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_monotonic = time.monotonic
_busy = False  # this process's worker found rows at its last poll (``queue_busy``)
_woken = False  # its next poll answers a wake-up (``poll_woken``)


def queue_busy(busy: bool) -> None:
    """This process's worker found rows to hand (``busy``) or none. Plans made while it
    found none may have been made for an empty queue, and would read a burst until
    ``REPLAN_S`` passed (three long-lane workers drained a 10,000-row burst at 0.9x one
    worker's rate, each spending its first two reserves, 0.8 s, in plans made for no
    rows): once it finds rows, each session's next prepared statement makes such plans
    again, and plans made since are kept for ``REPLAN_S``."""
    global _busy
    _busy = busy


# A poll answering a wake-up reads at most this many rows (per target on the fast lane).
# It runs on the plans the session has (``poll_woken``), which may have been made while
# the table was empty: with the table analysed empty, such a plan walked the whole table
# once per row read (a fast poll of 1,000 rows into a 50,000-row burst took 4 s; of 10,
# 80 ms). The poll after it plans for the table as it is and reads the rest.
WOKEN_POLL_ROWS = 10


def poll_woken(woken: bool) -> None:
    """This process's worker's next poll answers a wake-up (a NOTIFY or a poke after an
    idle wait). It runs with the plans the session has and the table size last read,
    however old: made again at the poll after it. Idle more than ``REPLAN_S``, a worker
    otherwise spent its wake-up remaking them (1.2 ms of the 5 ms from commit to handler
    that sparse events took)."""
    global _woken
    _woken = woken


# A worker session's settings: one generic plan per statement, and no JIT compilation.
# The engine's statements run in a millisecond or two; a plan costed past
# ``jit_above_cost`` (a window's limit a tenth of a large table, many targets) was compiled
# first, at every run of a generic plan: 45 ms of a poll at a million rows.
_WORKER_SESSION = ("SELECT set_config('plan_cache_mode', 'force_generic_plan', false), "
                   "set_config('jit', 'off', false)")


def _prepared_cursor(db: Any) -> Any:
    """A Django cursor (its wrappers, its errors) over a server-side binding psycopg cursor
    that prepares what it runs. Django's own cursors bind client-side, so the server parses
    and plans every statement anew; and Django turns prepared statements off for
    transaction-mode poolers, which a worker cannot use anyway (``LISTEN`` needs a session).

    The session keeps one generic plan per statement (``force_generic_plan``): planning
    cost more than running (0.48 ms of a 0.29 ms long-lane reserve, 1-2 ms of a fast
    poll). But a generic plan is made for the table's size at that time, and kept: a
    worker that first polled an empty queue kept a sequential scan for the burst that
    followed (three long-lane workers drained 10,000 rows at 500 jobs/s instead of 6,600).
    So the session drops its plans every ``REPLAN_S`` and makes them again for the table
    as it is then: a plan made on a small table serves one second at most (and the poll
    answering a wake-up, ``poll_woken``), and once the worker finds rows, none made
    while it found none (``queue_busy``). Where the project binds server-side itself,
    its statements are prepared too: its ``prepare_threshold`` and the plan cache mode
    stand.

    The psycopg cursor is made once per session and kept open: making one (its adapters,
    the timestamptz loader) and closing it took 14 µs of a one-row statement's 116 (the
    round trip alone is ~86), and an at-most-once per-row target runs one such statement
    per row.
    """
    import psycopg

    db.ensure_connection()
    raw_connection = db.connection
    if db.settings_dict["OPTIONS"].get("server_side_binding") is not True:
        made, now = _plans_made.get(raw_connection), _monotonic()
        raw_connection.prepare_threshold = 0  # only server-side cursors, so only these
        # In autocommit only: a SET in a transaction would end with a rollback.
        stale = made is None or (not _woken and (
            not 0 <= now - made < REPLAN_S
            or (_busy and not _made_busy.get(raw_connection, False))))
        if stale and db.get_autocommit():
            with db.wrap_database_errors:
                raw_connection.execute(_WORKER_SESSION if made is None else "DISCARD PLANS")
            _plans_made[raw_connection] = now
            _made_busy[raw_connection] = _busy
    # Kept on Django's wrapper of the session, which outlives its raw connections: a
    # reconnect makes a new cursor, and the old one goes with its connection.
    kept = getattr(db, "_jobs_engine_cursor", None)
    if kept is None or kept.connection is not raw_connection:
        kept = psycopg.RawCursor(raw_connection)  # ``native_placeholders``
        _load_timestamptz(kept)
        db._jobs_engine_cursor = kept
    return _wrapped(db, kept)


def fetch_insert(sql: str, params: Params, using: str | None = None, *,
                 plan_may_be_kept: bool) -> list[tuple[Any, ...]]:
    """``fetch`` for an enqueue's insert, in the caller's session and transaction.

    On PostgreSQL its parameters are bound on the server, not quoted into the statement's
    text as Django's cursors do, so the text repeats and can be prepared. A statement
    whose plan may be kept (``plan_may_be_kept``: it inserts values and looks up the
    unique dedupe key only, the right plan at every size of the table) is prepared where
    the connection allows it (``_may_prepare``): planning was a third of a one-row
    enqueue's time on the server. The caller's session settings are left as they are.
    """
    db = conn(using)
    if db.vendor != "postgresql":
        return fetch(sql, params, using)
    db.ensure_connection()
    prepare = plan_may_be_kept and _may_prepare(db)
    with _wrapped(db, _insert_cursor_class(prepare)(db.connection)) as cursor:
        cursor.execute(sql, params)  # ids and keys back: no timestamp to load
        rows: list[tuple[Any, ...]] = cursor.fetchall()
        return rows


@cache
def _insert_cursor_class(prepare: bool) -> type:
    """A psycopg cursor whose every statement is prepared, or never is: Django's wrapper
    (its errors, its query log, which ``assertNumQueries`` counts) passes no options."""
    import psycopg

    class InsertCursor(psycopg.Cursor):
        def execute(self, query: Any, params: Any = None, **options: Any) -> Any:
            return super().execute(query, params, **{"prepare": prepare, **options})

    return InsertCursor


def _may_prepare(db: BaseDatabaseWrapper) -> bool:
    """Whether a statement may be prepared on the caller's connection. Django leaves
    prepared statements off unless the project turns them on (``OPTIONS``
    ``prepare_threshold``): a transaction-mode pooler may give the next transaction
    another server session, where a statement prepared in this one does not exist. A
    worker's session has them on (``_prepared_cursor``; it needs a session anyway).
    ``DISABLE_SERVER_SIDE_CURSORS``, Django's setting for such a pooler, keeps them off."""
    if db.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"):
        return False
    return db.connection.prepare_threshold is not None


def _wrapped(db: BaseDatabaseWrapper, raw: Any) -> CursorWrapper:
    """Django's wrapper over a raw cursor: its error translation and query logging."""
    return db.make_debug_cursor(raw) if db.queries_logged else db.make_cursor(raw)


def execute(sql: str, params: Params = (), using: str | None = None) -> int:
    with conn(using).cursor() as cursor:
        cursor.execute(*positional(sql, params))
        count: int = cursor.rowcount
        return count


def db_now() -> datetime:
    """The database's clock: every lease and liveness decision is made on it (SQLite, one
    process on one machine, has the process's)."""
    if is_postgres():
        now: datetime = fetch("SELECT clock_timestamp()")[0][0]
        return now
    return timezone.now()


def clock_text(using: str | None = None) -> str:
    """SQL for "now" in a statement: PostgreSQL's own clock (the database's clock wins);
    on SQLite the caller's ``now`` (``clock_params``), in the stored text form. Apart from
    its parameters, so a statement's text can be made once and kept."""
    return "now()" if is_postgres(using) else "%s"


def clock_params(now: datetime, using: str | None = None) -> list[Any]:
    """The parameters of one ``clock_text`` in a statement."""
    return [] if is_postgres(using) else [dt(now, using)]


# -- values in and out ------------------------------------------------------------------


def dt(value: datetime | None, using: str | None = None) -> Any:
    """A datetime parameter in the form the backend stores (SQLite keeps naive UTC text;
    PostgreSQL's adapter gives the value back, and is skipped)."""
    if value is None or is_postgres(using):
        return value
    return conn(using).ops.adapt_datetimefield_value(value)


def json_dt(value: datetime, using: str | None = None) -> Any:
    """A datetime for a row of ``table(..., arrays_from=1, as_json=True)``: on PostgreSQL,
    where the rows go as JSON, its ISO text (made once for a value many rows share, not
    by the encoder for each); ``dt`` elsewhere."""
    return value.isoformat() if is_postgres(using) else dt(value, using)


def read_dt(value: Any) -> datetime | None:
    if value is None:
        return None
    # SQLite's raw cursor gives naive UTC datetimes (or text); make them aware.
    parsed = value if isinstance(value, datetime) else parse_datetime(value)
    if parsed is not None and parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def read_json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def json_param(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def jsonb(expression: str = "%s", using: str | None = None) -> str:
    """A JSON value for a jsonb column (PostgreSQL needs the cast; SQLite stores text)."""
    return f"{expression}::jsonb" if is_postgres(using) else expression


def greatest(first: str, second: str, using: str | None = None) -> str:
    """The later of two values (SQLite's two-argument ``max`` is PostgreSQL's GREATEST)."""
    return f"GREATEST({first}, {second})" if is_postgres(using) else f"MAX({first}, {second})"


# -- lists and tables of parameters -----------------------------------------------------


def _array(values: Sequence[Any]) -> Any:
    """An array parameter. Integers go as one array literal, which PostgreSQL reads far
    faster than the driver dumps a list element by element (the fast lane's id lists)."""
    if all(type(value) is int for value in values):
        return int_array(values)
    return list(values)


def int_array(values: Sequence[int]) -> str:
    """An ``integer[]`` or ``bigint[]`` literal (PostgreSQL)."""
    return "{" + ",".join(map(str, values)) + "}"


def text_array(values: Sequence[str]) -> str:
    """A ``text[]`` literal (PostgreSQL)."""
    return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
                          for v in values) + "}"


def instant_array(values: Sequence[datetime | None]) -> str:
    """A ``timestamptz[]`` literal (PostgreSQL); None: ``-infinity``, before every instant."""
    return "{" + ",".join("-infinity" if v is None else f'"{v.isoformat()}"'
                          for v in values) + "}"


def in_(column: str, values: Sequence[Any], using: str | None = None, *,
        arrays_from: int = ARRAY_FROM) -> tuple[str, list[Any]]:
    """``column`` is one of ``values``; valid SQL for an empty list too."""
    if not values:
        return "1 = 0", []
    if len(values) >= arrays_from and is_postgres(using):
        return f"{column} = ANY(%s)", [_array(values)]
    return f"{column} IN ({', '.join(['%s'] * len(values))})", list(values)


def in_names(column: str, names: Sequence[str], using: str | None = None
             ) -> tuple[str, list[Any]]:
    """``in_`` for a worker's registered targets, a list that repeats statement after
    statement: on PostgreSQL a constant of the text (``names_constant``). The planner
    hashes a constant list (PostgreSQL 14), where a parameter's 500 names were compared
    one by one for each row, and dumped and parsed at every call."""
    if names and is_postgres(using):
        return f"{column} = ANY({names_constant(tuple(names))})", []
    return in_(column, names, using)


@lru_cache(maxsize=128)
def names_constant(names: tuple[str, ...]) -> str:
    """``names`` as a ``text[]`` constant of a statement's text (``%`` doubled, for the
    driver's placeholders), made once per list."""
    literal = text_array(names).replace("'", "''").replace("%", "%%")
    return f"'{literal}'::text[]"


def values_(rows: Sequence[Sequence[Any]]) -> tuple[str, list[Any]]:
    """``VALUES (%s, ...), ...`` of equal-length tuples, with their parameters."""
    row = f"({', '.join(['%s'] * len(rows[0]))})"
    return f"VALUES {', '.join([row] * len(rows))}", [value for r in rows for value in r]


def table(rows: Sequence[Sequence[Any]], types: Sequence[str], *, using: str | None = None,
          arrays_from: int = ARRAY_FROM, as_json: bool = False) -> tuple[str, list[Any]]:
    """A table of equal-length tuples (``types`` are their PostgreSQL column types), for
    ``FROM (...)``, ``IN (...)`` or a CTE: ``VALUES``, or on PostgreSQL from ``arrays_from``
    rows ``unnest`` of one array per column.

    ``as_json`` (values JSON can carry, and datetimes): on PostgreSQL the rows go as one
    JSON text that the server takes apart. The driver then encodes one text with the C
    encoder, where it dumps an array per column element by element in Python: an enqueue
    of 100 rows took a third less time."""
    if len(rows) >= arrays_from and is_postgres(using):
        if as_json:
            columns = ", ".join(f"(e->>{n})::{kind}" for n, kind in enumerate(types))
            return (f"SELECT {columns} FROM jsonb_array_elements(%s::jsonb) e",
                    [json_rows(rows)])
        arrays = ", ".join(f"%s::{kind}[]" for kind in types)
        return f"SELECT * FROM unnest({arrays})", [_array(column)
                                                   for column in zip(*rows, strict=True)]
    return values_(rows)


def json_rows(rows: Sequence[Sequence[Any]]) -> str:
    """Rows as one JSON text (an array of arrays; datetimes as ISO text with their offset),
    for a statement that takes them apart on the server."""
    return _ROWS_ENCODER.encode(rows)


def _iso(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()  # with its offset: the same instant as the value
    raise TypeError(f"{type(value).__name__} has no JSON form in a table of parameters")


_ROWS_ENCODER = json.JSONEncoder(separators=(",", ":"), default=_iso)


# -- locks, notifications, JSON arrays --------------------------------------------------


def skip_locked() -> str:
    """Row locks that let concurrent workers pass each other (SQLite has one writer)."""
    return " FOR UPDATE SKIP LOCKED" if is_postgres() else ""


def for_share() -> str:
    """A row lock that an update of the row waits for, and that waits for one (SQLite has
    one writer)."""
    return " FOR SHARE" if is_postgres() else ""


def json_array_length(array_sql: str) -> str:
    """SQL for the number of items of the JSON array ``array_sql``."""
    return f"jsonb_array_length({array_sql})" if is_postgres() else \
        f"json_array_length({array_sql})"


def json_array_has(array_column: str, value_column: str) -> str:
    """SQL true when the JSON array in ``array_column`` holds ``value_column``."""
    if is_postgres():
        return f"{array_column} @> to_jsonb({value_column})"
    return f"EXISTS (SELECT 1 FROM json_each({array_column}) e WHERE e.value = {value_column})"


def json_append(array_sql: str, item_sql: str) -> str:
    """The JSON array ``array_sql`` (NULL for an empty one) with the JSON object
    ``item_sql`` appended."""
    if is_postgres():
        return f"COALESCE({array_sql}, '[]'::jsonb) || ({item_sql})::jsonb"
    return f"json_insert(COALESCE({array_sql}, '[]'), '$[#]', json({item_sql}))"


def json_object(pairs: Sequence[tuple[str, str]]) -> str:
    """A JSON object built in SQL from (key, SQL expression) pairs."""
    function = "jsonb_build_object" if is_postgres() else "json_object"
    arguments = ", ".join(f"'{key}', {value}" for key, value in pairs)
    return f"{function}({arguments})"


def writable_ctes() -> bool:
    """Whether one statement may read and update (PostgreSQL's data-modifying WITH)."""
    return is_postgres()


def session_shard(shards: int, using: str | None = None) -> int:
    """This database session's shard of ``shards`` (its server process id on PostgreSQL;
    0 on SQLite, where one writer at a time holds the whole database anyway)."""
    db = conn(using)
    if db.vendor != "postgresql":
        return 0
    db.ensure_connection()
    return int(db.connection.info.backend_pid) % shards


_row_estimates: dict[str, tuple[float, int | None]] = {}  # table -> (read at, rows)


def planned_rows(table_name: str, *, fresh: bool = False) -> int | None:
    """``table_row_estimate``, read again at most once a ``REPLAN_S``: the size the plans a
    worker session makes (as often) are made for. ``fresh``: read now."""
    now = _monotonic()
    seen = _row_estimates.get(table_name)
    if fresh or seen is None or (not _woken and not 0 <= now - seen[0] < REPLAN_S):
        seen = _row_estimates[table_name] = (now, table_row_estimate(table_name))
    return seen[1]


def table_row_estimate(table_name: str) -> int | None:
    """PostgreSQL's planner estimate of a table's rows (no scan); None elsewhere or when
    the table was never analysed."""
    if not is_postgres():
        return None
    rows = fetch("SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)", [table_name])
    if not rows or rows[0][0] is None or rows[0][0] < 0:
        return None
    return int(rows[0][0])
