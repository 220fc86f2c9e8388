"""Whether this process can serve: the database answers and is migrated.

Every worker command checks it once at start-up, and ``manage.py check_ready`` lets a
container's entrypoint check it before its web server starts: a process that cannot serve
stops with one line naming the problem, rather than looking alive and failing later (a
worker that does nothing, a web server answering every request with a traceback).
"""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, connections

from jobs_engine.errors import DatabaseNotReady
from jobs_engine.lanes.outage import is_database_fault


def unreachable(exc: BaseException) -> DatabaseNotReady:
    """The one-line error of a database fault: the driver's first line, no traceback."""
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return DatabaseNotReady(f"cannot connect to the database: {first_line}")


def unapplied_migrations(using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """The engine's migrations (and every other app's) not applied to the database."""
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connections[using])
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [f"{migration.app_label}.{migration.name}" for migration, _ in plan]


def check_database(using: str = DEFAULT_DB_ALIAS, *, migrated: bool = True) -> None:
    """Raise ``DatabaseNotReady`` unless the database answers and (``migrated``) has every
    migration applied."""
    try:
        if not migrated:
            connections[using].ensure_connection()
            return
        unapplied = unapplied_migrations(using)
    except Exception as exc:
        if not is_database_fault(exc):
            raise
        raise unreachable(exc) from None
    if unapplied:
        raise DatabaseNotReady(
            f"the database is not migrated ({len(unapplied)} migration(s) not applied, "
            f"first {unapplied[0]}): run manage.py migrate first")
