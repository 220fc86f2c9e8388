"""PostgreSQL's functions and sequences of the enqueue, the wake-ups and the limits'
admission, as the one file that holds them says (``sql/enqueue.sql``): its statements for
the migrations that make them (``postgresql_functions``), and the columns of an enqueued row,
in order (``ROW_COLUMNS``).

The file is the one source: the database runs its text as it is, and Python takes the
order of a row's values from it instead of writing that order a second time, so the two
cannot drift apart. A row goes to the server as a JSON array (one text the C encoder makes,
no name repeated per row); the function reads value ``N`` as the column its line
``e->>N AS name`` names.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from django.db import migrations

__all__ = ["ENQUEUE_SQL", "ENQUEUE_SQL_FILE", "ROW_COLUMNS", "RunOnPostgreSQL",
           "postgresql_functions", "sha256", "statements", "undo"]

ENQUEUE_SQL_FILE = Path(__file__).with_name("sql") / "enqueue.sql"
ENQUEUE_SQL = ENQUEUE_SQL_FILE.read_text(encoding="utf-8")


def sha256(sql: str = ENQUEUE_SQL) -> str:
    """The digest of the file's text: a migration that runs it names the text it ran."""
    return hashlib.sha256(sql.encode()).hexdigest()


def statements(sql: str) -> list[str]:
    """``sql``'s statements, each ending at a ``;`` that ends a line outside a ``$$`` body;
    comment lines between them left out. Split here, not by Django's ``sqlparse``: one
    statement per ``execute``, whatever a driver makes of several."""
    found: list[str] = []
    lines: list[str] = []
    in_body = False
    for line in sql.splitlines():
        if not in_body and not lines and (not line.strip() or line.lstrip().startswith("--")):
            continue
        lines.append(line)
        in_body ^= line.count("$$") % 2 == 1
        if not in_body and line.rstrip().endswith(";"):
            found.append("\n".join(lines).rstrip()[:-1])
            lines = []
    if lines:
        raise ValueError(f"a statement without its ';': {lines[0]!r}")
    return found


_CREATED = re.compile(r"CREATE (?:OR REPLACE FUNCTION (\w+\([^)]*\))|SEQUENCE IF NOT EXISTS "
                      r"(\w+))")


def undo(statement: str) -> str:
    """The statement that removes what ``statement`` makes (a migration's reverse)."""
    made = _CREATED.match(statement)
    if made is None:
        raise ValueError(f"no undo for {statement.splitlines()[0]!r}")
    function, sequence = made.groups()
    if function is not None:  # argument names and modes are allowed, OUT ones ignored
        return f"DROP FUNCTION IF EXISTS {' '.join(function.split()).replace('( ', '(')}"
    return f"DROP SEQUENCE IF EXISTS {sequence}"


# One line of ``jobs_engine_new_rows``' row: ``e->>4`` or ``(e->>4)::smallint``, its name.
_ROW_VALUE = re.compile(r"^\s*\(?e->>(\d+)\)?(?:::\w+)?\s+AS\s+(\w+),?\s*$", re.MULTILINE)


def row_columns(sql: str) -> tuple[str, ...]:
    """The columns of a row, in the order of its values: the ``e->>N AS name`` lines, which
    must number the values 0, 1, 2... in their order."""
    found = _ROW_VALUE.findall(sql)
    numbers = [int(number) for number, _ in found]
    if not found or numbers != list(range(len(found))):
        raise ValueError(f"{ENQUEUE_SQL_FILE.name}: the row's 'e->>N AS name' lines number "
                         f"{numbers}, not 0, 1, 2... once each")
    return tuple(name for _, name in found)


ROW_COLUMNS = row_columns(ENQUEUE_SQL)


class RunOnPostgreSQL(migrations.RunSQL):
    """``RunSQL`` on PostgreSQL only: SQLite has no functions, and the store calls none there.
    ``digest``: the ``sha256`` of the text the migration was written for, which the test
    holding the file to its newest migration reads."""

    def __init__(self, sql: Any, reverse_sql: Any = None, *, digest: str = "",
                 **options: Any) -> None:
        super().__init__(sql, reverse_sql, **options)
        self.digest = digest

    def deconstruct(self) -> tuple[str, Sequence[Any], dict[str, Any]]:
        name, args, kwargs = super().deconstruct()
        return name, args, {**kwargs, "digest": self.digest}

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any,
                          to_state: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any,
                           to_state: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)


def postgresql_functions(digest: str) -> RunOnPostgreSQL:
    """A migration's operation that makes the file's sequences and functions on PostgreSQL
    (every statement is ``CREATE OR REPLACE`` or ``IF NOT EXISTS``: it runs again over an
    earlier version), and removes them in reverse; ``digest`` as ``RunOnPostgreSQL``'s."""
    made = statements(ENQUEUE_SQL)
    return RunOnPostgreSQL(made, [undo(statement) for statement in reversed(made)],
                           digest=digest)
