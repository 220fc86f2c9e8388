"""How the store's statements reach the database: cursors, prepared statements, parameters.

Every statement of the store runs through ``fetch`` or ``execute`` (an enqueue's insert
through ``fetch_insert``). Parameters are positional (``%s``) or named (``%(name)s``);
named ones are compiled once per text, for Django's cursors and for the worker session's
prepared cursor, which takes PostgreSQL's own ``$n``. The vendor test, ``is_postgres``,
is here too.

A worker session's prepared statements keep their plans; when a kept plan is made again is
the planner policy's decision (``planning``), applied here at each prepared statement.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cache, lru_cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from jobs_engine.store.planning import planner


def conn(using: str | None = None) -> BaseDatabaseWrapper:
    """The connection itself, not ``django.db.connection``: that proxy looks the
    connection up again (a context-local read) at every attribute, dozens per poll."""
    return connections[using or DEFAULT_DB_ALIAS]


@cache
def _vendor(alias: str) -> str:
    # Fixed for the process, where ``connections[alias]`` is a context-local read: asked
    # several times a write, and once a row by ``dialect.dt``.
    return str(connections[alias].vendor)


def is_postgres(using: str | None = None) -> bool:
    return _vendor(using or DEFAULT_DB_ALIAS) == "postgresql"


def notifications_exist() -> bool:
    """Whether the database sends notifications a worker may wait for (PostgreSQL's
    ``LISTEN``); without them a worker polls."""
    return is_postgres()


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
    than its run (the fast lane's poll)."""
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


def execute(sql: str, params: Params = (), using: str | None = None) -> int:
    """Run ``sql``; the rows it changed."""
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


# -- parameters -------------------------------------------------------------------------


@lru_cache(maxsize=512)
def native_placeholders(sql: str) -> tuple[str, tuple[str, ...]]:
    """``sql`` with PostgreSQL's own placeholders (``$1``, ``$2``, ...) for the session's
    ``RawCursor``, made once per text, and the parameter names in their numbers' order
    (none for a positional text; a name used twice is one number). psycopg converts
    ``%s`` at every execution, and caches the conversion only for texts under 4 kB, which
    a worker's statements with many registered targets (the long-lane reserve's) exceed."""
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
    """A fragment made with positional parameters (``dialect.in_``, ``table``, ``values_``)
    for a statement with named ones: its one parameter ``name``, or ``name_0``,
    ``name_1``..."""
    sql, params = fragment
    text, keys = _named_text(sql, name, len(params))
    return text, dict(zip(keys, params, strict=True))


@lru_cache(maxsize=512)
def _named_text(sql: str, name: str, count: int) -> tuple[str, tuple[str, ...]]:
    """``named``'s text and keys, made once per fragment: a lane's fragments repeat poll
    after poll, and the substitution was most of the call."""
    keys = (name,) if count == 1 else tuple(f"{name}_{n}" for n in range(count))
    places = iter(keys)
    text = _PLACEHOLDER.sub(lambda m: m.group() if m.group() == "%%" else f"%({next(places)})s",
                            sql)
    return text, keys


# -- cursors ----------------------------------------------------------------------------


def _load_timestamptz(cursor: Any) -> None:
    """The driver's own timestamptz loader: Django's wrapper re-sets the time zone of every
    value in Python, much of the fast lane's row decoding. The driver's values are
    aware, in the session time zone Django sets: the same instants."""
    cursor.adapters.register_loader("timestamptz", _timestamptz_loader())


def _prepared_cursor(db: Any) -> Any:
    """A Django cursor (its wrappers, its errors) over a server-side binding psycopg cursor
    that prepares what it runs. Django's own cursors bind client-side, so the server parses
    and plans every statement anew; and Django turns prepared statements off for
    transaction-mode poolers, which a worker cannot use anyway (``LISTEN`` needs a session).

    Planning cost more than running (the long-lane reserve, the fast poll): the session
    keeps its plans, and ``planning.planner`` decides when they are made again
    (``Planner.refresh_plans``). Where the project binds server-side itself, its
    statements are prepared too: its ``prepare_threshold`` and the plan cache mode stand,
    and the planner is not asked.

    The psycopg cursor is made once per session and kept open: making one (its adapters,
    the timestamptz loader) and closing it was a fair share of a one-row statement's time
    beyond its round trip, and an at-most-once per-row target runs one such statement per
    row.
    """
    import psycopg

    db.ensure_connection()
    raw_connection = db.connection
    if db.settings_dict["OPTIONS"].get("server_side_binding") is not True:
        raw_connection.prepare_threshold = 0  # only server-side cursors, so only these
        planner.refresh_plans(db, raw_connection)
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
    the connection allows it (``_may_prepare``): planning was a large share of a one-row
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
