"""The enqueue's insert of a batch that is payloads of one target and nothing else, as a
PL/pgSQL function (PostgreSQL 13 or later: ``gen_random_uuid``).

Every other column of such a batch is the target's or a default, and its dedupe keys and
trace ids are made by the engine, so the server makes them: Python encodes the payloads
and nothing per row. A made key is ``enqueueing.random_keys``' kind: 24 hex digits drawn
once per call, then the row's number in 8. The rows take consecutive partitions from a
random one. The ids come back in the payloads' order: the rows are inserted in that order
and take ascending ids from the sequence.
"""

from django.db import migrations

INSERT_PAYLOADS = """
CREATE OR REPLACE FUNCTION jobs_engine_insert_payloads(
    p_code text, p_target text, p_lane text, p_delivery_mode text, p_partitions integer,
    p_trace_id text, p_actor jsonb, payloads jsonb)
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    -- 96 random bits of the call's own (the md5 spreads a UUID's fixed bits), then the
    -- row's number: one draw per call, and a batch's keys are neighbours in the index.
    key_prefix text := substr(md5(gen_random_uuid()::text), 1, 24);
    trace_prefix text := substr(md5(gen_random_uuid()::text), 1, 24);
    -- Rows without a key keep no order: the batch's go round the partitions from a
    -- random one, evenly, without an md5 per row.
    first_partition integer := floor(random() * p_partitions);
BEGIN
    RETURN QUERY WITH inserted AS (
        INSERT INTO jobs_engine_job AS j (code, target, lane, partition, version, payload,
            headers, dedupe_key, status, delivery_mode, attempts, next_run_at, last_error,
            trace_id, actor, priority, created_at, updated_at)
        SELECT p_code, p_target, p_lane,
            mod(first_partition + r.n, p_partitions)::smallint,
            0, r.payload, '{}', key_prefix || r.number, 'PENDING', p_delivery_mode, 0, now(),
            '', COALESCE(p_trace_id, trace_prefix || r.number), p_actor, 0, now(), now()
        FROM (SELECT e.payload, e.n, lpad(to_hex(e.n), 8, '0') AS number
              FROM jsonb_array_elements(payloads) WITH ORDINALITY AS e(payload, n)) AS r
        ORDER BY r.n
        RETURNING j.id)
    SELECT inserted.id FROM inserted ORDER BY inserted.id;
    -- Delivered when the caller's transaction commits.
    PERFORM pg_notify('jobs_engine', p_lane);
END
$$
"""


def create(apps, schema_editor):  # noqa: ARG001
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(INSERT_PAYLOADS)


def drop(apps, schema_editor):  # noqa: ARG001
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP FUNCTION IF EXISTS jobs_engine_insert_payloads("
                              "text, text, text, text, integer, text, jsonb, jsonb)")


class Migration(migrations.Migration):

    dependencies = [
        ("jobs_engine", "0013_insert_new_jobs_function"),
    ]

    operations = [
        migrations.RunPython(create, drop),
    ]
