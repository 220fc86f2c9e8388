"""What PostgreSQL and SQLite do differently in a statement, and nothing else: fragments of
its text (array and list parameters, jsonb casts, row locks, JSON array tests, the clock,
whether one statement may read and update), the form of the values it takes and gives
back (timestamps, JSON), and a session's statistics shard.

No statement runs here: ``connection`` runs them, and the planner policy is ``planning``'s.
The statement families (``enqueue``, ``fast``, ``long``, ...) are written once, with these
pieces where the two databases differ. A third database (a MongoDB implementation of a hot
query, say) starts by reading this file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from django.utils.dateparse import parse_datetime

from jobs_engine.store.connection import conn, is_postgres

# Lists from this length on go to PostgreSQL as one array parameter: the statement's text
# stays the same whatever the length, so the driver does not parse a new text at every
# call (it caches only statements of up to 50 parameters). Shorter lists are inlined,
# which plans faster for the one-row statements of per-row sends.
ARRAY_FROM = 16


# -- the clock --------------------------------------------------------------------------


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


def read_instant(value: Any) -> datetime:
    """``read_dt`` of a NOT NULL column."""
    instant = read_dt(value)
    if instant is None:
        raise ValueError("a NOT NULL timestamp read as NULL")
    return instant


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


def number_array(values: Sequence[float | bool | None]) -> str:
    """A literal of an array of numbers or booleans, None as NULL (PostgreSQL)."""
    return "{" + ",".join("NULL" if v is None else ("t" if v else "f") if isinstance(v, bool)
                          else repr(v) for v in values) + "}"


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
    hashes a constant list (PostgreSQL 14), where a parameter's names were compared one
    by one for each row, and dumped and parsed at every call."""
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


# -- locks, JSON in SQL, what one statement may do ---------------------------------------


def skip_locked() -> str:
    """Row locks that let concurrent workers pass each other (SQLite has one writer)."""
    return " FOR UPDATE SKIP LOCKED" if is_postgres() else ""


def for_update(using: str | None = None) -> str:
    """A row lock that other writers of the row wait for (SQLite has one writer)."""
    return " FOR UPDATE" if is_postgres(using) else ""


def for_share() -> str:
    """A row lock that an update of the row waits for, and that waits for one (SQLite has
    one writer)."""
    return " FOR SHARE" if is_postgres() else ""


def json_text_field(column: str, field_param: str) -> str:
    """The text of the top-level field named by the parameter ``field_param`` (a ``%(..)s``)
    of the JSON ``column``, NULL when it has none."""
    if is_postgres():
        return f"{column}->>{field_param}"
    return f"CAST(json_extract({column}, '$.\"' || {field_param} || '\"') AS TEXT)"


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
