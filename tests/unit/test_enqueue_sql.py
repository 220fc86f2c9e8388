"""The one file of PostgreSQL's functions (jobs_engine/store/sql/enqueue.sql): the migrations
run it as it is and undo it, a change to it comes with a migration, and the row's columns
Python takes from it are numbered as the function reads them."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pytest
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.state import ProjectState

from jobs_engine.models import Job
from jobs_engine.store import enqueue, functions


def test_the_newest_migration_that_runs_the_file_names_its_digest() -> None:
    """An edit of the file without a migration that runs it again would leave every
    database migrated before it on the old functions (and the rows' columns, which Python
    reads from the file, perhaps in another order than theirs): the newest migration that
    runs the file names the digest of its text."""
    graph = MigrationLoader(None, ignore_no_migrations=True).graph
    (leaf,) = graph.leaf_nodes("jobs_engine")
    runs = [(key, operation) for key in graph.forwards_plan(leaf) if key[0] == "jobs_engine"
            for operation in graph.nodes[key].operations
            if isinstance(operation, functions.RunOnPostgreSQL)]
    assert runs, "no migration runs store/sql/enqueue.sql"
    newest, operation = runs[-1]
    assert operation.digest == functions.sha256(), (
        f"store/sql/enqueue.sql changed after {newest[1]}: a new migration runs it again "
        f"(postgresql_functions(...)) and names its digest, {functions.sha256()}")


def test_the_file_splits_into_its_statements_each_undone_in_reverse() -> None:
    """Every ``CREATE`` of the file is one statement, run in the file's order, and the
    operation's reverse drops each, last made first."""
    made = functions.statements(functions.ENQUEUE_SQL)
    create = re.compile(r"^CREATE (?:OR REPLACE FUNCTION|SEQUENCE IF NOT EXISTS) (\w+)",
                        re.MULTILINE)
    creates = create.findall(functions.ENQUEUE_SQL)
    assert [name for statement in made for name in create.findall(statement)] == creates
    assert all(create.match(statement) for statement in made)
    assert len(creates) == 14 and not any(s.rstrip().endswith(";") for s in made)
    operation = functions.postgresql_functions(functions.sha256())
    assert operation.sql == made
    assert operation.reverse_sql == [functions.undo(s) for s in reversed(made)]
    assert operation.reverse_sql[0].startswith(
        "DROP FUNCTION IF EXISTS jobs_engine_limits_admit(k_target text[], k_key text[], ")
    assert operation.reverse_sql[0].endswith("p_lease_s double precision, p_start boolean)")
    assert "DROP FUNCTION IF EXISTS jobs_engine_fast_enqueues(OUT n bigint, OUT open boolean)" \
        in operation.reverse_sql
    assert "DROP FUNCTION IF EXISTS jobs_engine_enqueue_payloads(p_code text, p_target text, " \
        "p_lane text, p_delivery_mode text, p_partitions integer, p_trace_id text, " \
        "p_actor jsonb, payloads jsonb, p_tenant_id text)" in operation.reverse_sql
    assert operation.reverse_sql[-1] == "DROP SEQUENCE IF EXISTS jobs_engine_waits_fast"


def test_a_statement_left_open_or_one_without_an_undo_is_refused() -> None:
    with pytest.raises(ValueError, match="without its ';'"):
        functions.statements("CREATE SEQUENCE s;\nCREATE FUNCTION f() AS $$\nSELECT 1;\n$$")
    assert functions.statements("-- a;\n\nCREATE SEQUENCE IF NOT EXISTS s;\n") == [
        "CREATE SEQUENCE IF NOT EXISTS s"]
    with pytest.raises(ValueError, match="no undo"):
        functions.undo("CREATE TABLE t (id int)")


@pytest.mark.parametrize(("vendor", "runs"), [("postgresql", True), ("sqlite", False)])
def test_the_functions_are_made_and_dropped_on_postgresql_only(vendor: str, runs: bool
                                                               ) -> None:
    executed: list[Any] = []
    editor = SimpleNamespace(connection=SimpleNamespace(vendor=vendor, alias="default"),
                             execute=lambda sql, params=None: executed.append(sql))
    operation = functions.postgresql_functions(functions.sha256())
    state = ProjectState()
    operation.database_forwards("jobs_engine", editor, state, state)
    assert executed == (operation.sql if runs else [])
    executed.clear()
    operation.database_backwards("jobs_engine", editor, state, state)
    assert executed == (operation.reverse_sql if runs else [])


def test_the_rows_columns_are_numbered_in_order_and_each_is_stored() -> None:
    """Python makes each row's values in the order of the file's ``e->>N AS name`` lines
    (``ROW_COLUMNS``): each is a column of the job table but the run time, which the
    insert stores as the due time."""
    columns = functions.ROW_COLUMNS
    assert len(columns) == 16 and len(set(columns)) == 16
    assert set(columns) - {field.attname for field in Job._meta.concrete_fields} == {"run_at"}
    row = enqueue.NewJob("c", "t", "fast", "k", 3, 4, "{}", {"h": 1}, "d", "at_most_once",
                         "tr", {"a": 1}, None, 5, True, "acme", "customer-7")
    values = dict(zip(columns, enqueue._row_values(row), strict=True))
    assert values == {"code": "c", "target": "t", "lane": "fast", "key": "k", "partition": 3,
                      "version": 4, "payload": "{}", "headers": {"h": 1}, "dedupe_key": "d",
                      "delivery_mode": "at_most_once", "run_at": None, "trace_id": "tr",
                      "actor": {"a": 1}, "priority": 5, "tenant_id": "acme",
                      "limit_key": "customer-7"}


def test_lines_that_number_the_values_otherwise_are_refused() -> None:
    good = "  e->>0 AS code,\n  (e->>1)::smallint AS partition\n"
    assert functions.row_columns(good) == ("code", "partition")
    for bad in (good.replace("e->>1", "e->>2"), good.replace("e->>0", "e->>1"), "SELECT 1"):
        with pytest.raises(ValueError, match="number"):
            functions.row_columns(bad)
