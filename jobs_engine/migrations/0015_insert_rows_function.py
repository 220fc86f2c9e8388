"""The enqueue's insert of any rows, keyed ones included, as one PL/pgSQL function
(PostgreSQL only).

A new row of a key whose head waits for a retry starts at the head's run time (it is held
until then anyway, and the fast poll's due range stays free of held rows), so a keyed row
looks up its key's head. That lookup kept keyed rows out of the functions of migrations
0012 and 0013: a plan the session keeps, made while the table was nearly empty, took
another index, filtered and sorted, for every keyed row once the table had grown (a
100-row keyed insert into 20,000 rows: 6 -> 135 ms), so their statement was planned at
every call. This function runs with sorts off (its own setting, only while it runs): the
key-order index is the one way to a head without a sort, so the lookup takes it at any
size of the table, and the plan can be kept.

``rows`` is a JSON array of arrays in ``store.queue._INSERT_COLUMNS``' order; ``arbiter``
false when the enqueue made every dedupe key (no stored row can have one: no
``ON CONFLICT``). The functions of 0012 and 0013 stay for processes of the release before,
which call them during a rolling upgrade; a process of this release fails loudly, rather
than dropping its rows' keys, where this migration has not run.
"""

from django.db import migrations

_INSERT = """
        INSERT INTO jobs_engine_job AS j (code, target, lane, key, partition, version,
            payload, headers, dedupe_key, status, delivery_mode, attempts, next_run_at,
            last_error, trace_id, actor, priority, created_at, updated_at)
        SELECT r.code, r.target, r.lane, r.key, r.partition, r.version, r.payload, r.headers,
            r.dedupe_key, 'PENDING', r.delivery_mode, 0,
            CASE WHEN r.key IS NULL THEN r.due ELSE GREATEST(r.due, COALESCE(
                (SELECT h.next_run_at FROM jobs_engine_job h WHERE h.status = 'PENDING'
                 AND h.partition = r.partition AND h.target = r.target AND h.key = r.key
                 ORDER BY h.version, h.id LIMIT 1), r.due)) END,
            '', r.trace_id, r.actor, r.priority, now(), now()
        FROM (SELECT e->>0 AS code, e->>1 AS target, e->>2 AS lane, e->>3 AS key,
                  (e->>4)::smallint AS partition, (e->>5)::bigint AS version,
                  (e->>6)::jsonb AS payload, (e->>7)::jsonb AS headers, e->>8 AS dedupe_key,
                  e->>9 AS delivery_mode, COALESCE((e->>10)::timestamptz, now()) AS due,
                  e->>11 AS trace_id, (e->>12)::jsonb AS actor, (e->>13)::smallint AS priority
              FROM jsonb_array_elements(rows) AS e) AS r"""

INSERT_ROWS = f"""
CREATE OR REPLACE FUNCTION jobs_engine_insert_rows(rows jsonb, arbiter boolean)
RETURNS TABLE (job_id bigint, job_dedupe_key text)
LANGUAGE plpgsql
SET enable_sort = off
AS $$
BEGIN
    -- One NOTIFY per row inserted, folded by PostgreSQL into one per lane at commit; a row
    -- left out by ON CONFLICT notifies nothing.
    IF arbiter THEN
        RETURN QUERY WITH inserted AS ({_INSERT}
        ON CONFLICT (dedupe_key) DO NOTHING
        RETURNING j.id, j.dedupe_key, pg_notify('jobs_engine', j.lane) AS notified)
        SELECT inserted.id, inserted.dedupe_key::text FROM inserted;
    ELSE
        RETURN QUERY WITH inserted AS ({_INSERT}
        RETURNING j.id, j.dedupe_key, pg_notify('jobs_engine', j.lane) AS notified)
        SELECT inserted.id, inserted.dedupe_key::text FROM inserted;
    END IF;
END
$$
"""


def create(apps, schema_editor):  # noqa: ARG001
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(INSERT_ROWS)


def drop(apps, schema_editor):  # noqa: ARG001
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP FUNCTION IF EXISTS jobs_engine_insert_rows(jsonb, boolean)")


class Migration(migrations.Migration):

    dependencies = [
        ("jobs_engine", "0014_insert_payloads_function"),
    ]

    operations = [
        migrations.RunPython(create, drop),
    ]
