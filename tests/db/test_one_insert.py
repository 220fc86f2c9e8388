"""One canonical insert: the rows an enqueue stores are the same, column by column, through
PostgreSQL's function (jobs_engine/store/sql/enqueue.sql) and through SQLite's statement
(jobs_engine/store/enqueue.py), which read each row's values in the order the SQL file
declares (``store.functions.ROW_COLUMNS``).

In the PostgreSQL run the same rows go into both databases (SQLite as the ``sqlite`` alias of
tests/settings.py), and each database's rows are held to what the insert must store
(``stored_as``) and to the other's; in the SQLite run, SQLite's alone to the former.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.conf import settings
from django.db import connections

from jobs_engine import store
from jobs_engine.models import Job
from jobs_engine.store import NewJob, functions

# Every database of the run: PostgreSQL and SQLite, or SQLite alone.
ALIASES = ["default", "sqlite"] if "sqlite" in settings.DATABASES else ["default"]
BOTH = pytest.mark.django_db(databases=ALIASES)
POSTGRESQL = settings.DATABASES["default"]["ENGINE"].endswith("postgresql")

COLUMNS = [field.attname for field in Job._meta.concrete_fields if field.attname != "id"]
JSON_COLUMNS = ("payload", "headers", "actor", "tries")
STAMP = "stamp"  # a row's created_at, updated_at or next_run_at at the insert's clock


def stored_as(row: NewJob, next_run_at: Any = STAMP) -> dict[str, Any]:
    """The row the insert must store for ``row``, every column (``test_every_column_is_said``),
    and whether each JSON column is SQL NULL (a JSON null reads back as None too)."""
    return {
        "code": row.code, "target": row.target, "lane": row.lane, "key": row.key,
        "partition": row.partition, "version": row.version,
        "payload": json.loads(row.payload_json), "headers": row.headers,
        "dedupe_key": row.dedupe_key, "status": "PENDING", "delivery_mode": row.delivery_mode,
        "attempts": 0, "next_run_at": next_run_at, "last_error": "", "claimed_by": None,
        "claim_token": None, "lease_until": None, "started_at": None, "running_code": None,
        "outcome_token": None, "closed_at": None, "trace_id": row.trace_id, "actor": row.actor,
        "created_at": STAMP, "updated_at": STAMP, "priority": row.priority, "tries": None,
        "tenant_id": row.tenant_id, "limit_key": row.limit_key,
        "payload IS NULL": False, "headers IS NULL": False,
        "actor IS NULL": row.actor is None, "tries IS NULL": True,
    }


def stored(alias: str) -> dict[int, dict[str, Any]]:
    """Every row of ``alias``'s job table by id, every column but the id, the insert's clock
    (one instant for the whole test: one transaction) as ``STAMP``."""
    rows = {row.pop("id"): row for row in Job.objects.using(alias).values("id", *COLUMNS)}
    with connections[alias].cursor() as cursor:
        nulls = ", ".join(f"{column} IS NULL" for column in JSON_COLUMNS)
        cursor.execute(f"SELECT id, {nulls} FROM {store.JOBS}")
        for job_id, *is_null in cursor.fetchall():
            rows[job_id].update({f"{column} IS NULL": bool(null)
                                 for column, null in zip(JSON_COLUMNS, is_null, strict=True)})
    stamps = {row[column] for row in rows.values() for column in ("created_at", "updated_at")}
    assert len(stamps) == 1, f"{alias}: the rows' stamps {stamps}"
    for row in rows.values():
        for column in ("created_at", "updated_at", "next_run_at"):
            if row[column] in stamps:
                row[column] = STAMP
    return rows


def differences(got: dict[str, dict[str, Any]], want: dict[str, dict[str, Any]]
                ) -> list[tuple[str, str, Any, Any]]:
    """(dedupe key, column, got, wanted) of every column that differs."""
    assert sorted(got) == sorted(want)
    return [(key, column, got[key].get(column), want[key].get(column))
            for key in sorted(want) for column in sorted(want[key].keys() | got[key].keys())
            if got[key].get(column) != want[key].get(column)]


def job(dedupe_key: str, **values: Any) -> NewJob:
    """A row as enqueue builds it, ``values`` over plain defaults."""
    row = NewJob(code="t:one", target="t:one", lane="fast", key=None, partition=3, version=0,
                 payload_json='{"n":1}', headers={}, dedupe_key=dedupe_key,
                 delivery_mode="at_most_once", trace_id=f"trace:{dedupe_key}", actor=None,
                 run_at=None)
    return row._replace(**values)


@BOTH
def test_the_insert_stores_the_same_rows_on_postgresql_and_sqlite() -> None:
    """Three inserts of the same rows in each database: a key's head due later, and a row
    whose dedupe key is then taken; rows with keys given (``ON CONFLICT``): behind the head
    (due at its run time), due after it (its own), a key without a head, every value
    unusual (a run time in another zone, headers, an actor, a priority, a tenant, the
    long lane, at least once, a version past 32 bits, text with quotes, a backslash and
    characters outside the BMP, a JSON null payload) and the taken key again (not stored);
    then rows with keys enqueue made (no ``ON CONFLICT``), one behind the head."""
    now = datetime.now(UTC).replace(microsecond=123456)
    head_runs, own_run = now + timedelta(hours=1), now + timedelta(hours=2)
    zone = timezone(timedelta(hours=5, minutes=30))
    head = job("d:head", key="k", version=1, run_at=head_runs)
    taken = job("d:taken", payload_json='"first"')
    given = [
        job("d:behind", key="k", version=2),
        job("d:after", key="k", version=3, run_at=own_run),
        job("d:no-head", key="other", version=2),
        job("d:full", code='c\\u0000\'"😀', target='t:"q" \\ ä', lane="long", key='k"\\😀',
            partition=63, version=2**40, payload_json='{"s":"q\\"\\\\😀","f":1.5,"n":null}',
            headers={"h": ["v", 1, None], "ä": "😀"}, delivery_mode="at_least_once",
            trace_id="trace-ä", actor={"user": "ä", "id": 7}, priority=-7, tenant_id="acme",
            limit_key="acct-ä😀",
            run_at=(now + timedelta(minutes=5)).astimezone(zone)),
        job("d:null", payload_json="null", headers={"h": 1}, priority=100),
        job("d:taken", payload_json='"second"'),
    ]
    made = [job("m:behind", key="k", version=4, dedupe_key_given=False),
            job("m:plain", dedupe_key_given=False)]
    want = {row.dedupe_key: stored_as(row) for row in [head, taken, *given[:-1], *made]}
    for behind in ("d:behind", "m:behind"):
        want[behind]["next_run_at"] = head_runs
    want["d:head"]["next_run_at"], want["d:after"]["next_run_at"] = head_runs, own_run
    want["d:full"]["next_run_at"] = given[3].run_at
    assert set(COLUMNS) < set(want["d:full"]), "stored_as says what every column holds"

    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for alias in ALIASES:
        inserted = [store.jobs_insert_many(batch, now, alias)
                    for batch in ([head, taken], given, made)]
        assert [sorted(batch) for batch in inserted] == [
            ["d:head", "d:taken"], sorted(row.dedupe_key for row in given[:-1]),
            ["m:behind", "m:plain"]], alias
        rows[alias] = {row["dedupe_key"]: row for row in stored(alias).values()}
        assert differences(rows[alias], want) == [], connections[alias].vendor
    if len(ALIASES) == 2:
        assert differences(rows["sqlite"], rows["default"]) == []


@BOTH
@pytest.mark.parametrize("trace_id", [None, "trace-7"], ids=["traces-made", "trace-given"])
def test_a_batch_of_payloads_stores_the_same_rows_on_postgresql_and_sqlite(
        trace_id: str | None) -> None:
    """The payloads' insert: PostgreSQL's function makes each row's dedupe key, trace id (none
    given) and partition; on SQLite the store makes them the same way. Both store the same
    rows, but for those random draws: a prefix of 24 hex digits per call and the row's
    number from 1 in 8 hex digits, and partitions in turn after a random one. The ids come
    back in the payloads' order."""
    payloads = ['{"n":1}', "null", '"ä😀\\\\"', "[1.5,{}]"]
    partitions, actor = 8, {"user": "u", "id": 3}
    made_columns = ["dedupe_key", *([] if trace_id else ["trace_id"])]
    want = {f"#{n}": stored_as(job(f"#{n}", code="t:code", target="t:batch", lane="long",
                                   partition="in turn", payload_json=payload,
                                   delivery_mode="at_least_once", trace_id=trace_id or f"#{n}",
                                   actor=actor, tenant_id="acme"))
            for n, payload in enumerate(payloads, 1)}
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for alias in ALIASES:
        ids = store.jobs_insert_payloads("t:code", "t:batch", "long", "at_least_once", payloads,
                                         partitions, trace_id, actor, "acme", alias)
        by_id = stored(alias)
        made = [by_id[job_id] for job_id in ids]  # in the payloads' order, or a KeyError
        assert len(made) == len(by_id) == len(payloads), alias
        first = (made[0]["partition"] - 1) % partitions
        prefixes = {column: made[0][column][:24] for column in made_columns}
        for number, row in enumerate(made, 1):
            assert row["partition"] == (first + number) % partitions, alias
            row["partition"] = "in turn"
            for column, prefix in prefixes.items():
                assert re.fullmatch("[0-9a-f]{24}", prefix), (alias, row[column])
                assert row[column] == f"{prefix}{number:08x}", (alias, row[column])
                row[column] = f"#{number}"
        rows[alias] = {f"#{number}": row for number, row in enumerate(made, 1)}
        assert differences(rows[alias], want) == [], connections[alias].vendor
    if len(ALIASES) == 2:
        assert differences(rows["sqlite"], rows["default"]) == []


if POSTGRESQL:  # SQLite has no functions: not collected in its run, rather than skipped there
    @pytest.mark.django_db
    def test_postgresql_runs_the_files_functions_the_rows_one_inlined() -> None:
        """The database's functions are the file's, as the migration ran it; and the rows'
        function, which both inserts of ``jobs_engine_enqueue_rows`` read, is inlined into
        them (a SQL function of one stable SELECT without settings): their plans are the
        plans of its text in their place (the head lookup's:
        ``test_the_head_lookup_takes_the_key_order_index_at_any_size``)."""
        sources = dict(re.findall(r"CREATE OR REPLACE FUNCTION (\w+)\(.*?\$\$(.*?)\$\$;",
                                  functions.ENQUEUE_SQL, re.DOTALL))
        assert len(sources) == 9 and store.INSERT_ROWS_FUNCTION in sources, sorted(sources)
        connection = connections["default"]
        with connection.cursor() as cursor:
            cursor.execute("SELECT proname, prosrc FROM pg_proc WHERE proname LIKE %s",
                           ["jobs\\_engine\\_%"])
            assert dict(cursor.fetchall()) == sources
            row = json.dumps([["t:a", "t:a", "fast", "k", 1, 0, "1", {}, "d", "at_most_once",
                               None, "tr", None, 0, None]])
            cursor.execute("EXPLAIN SELECT * FROM jobs_engine_new_rows(%s::jsonb)", [row])
            plan = "\n".join(line for (line,) in cursor.fetchall())
        assert "jobs_engine_new_rows" not in plan, plan
        assert plan.startswith("Function Scan on jsonb_array_elements e"), plan
