"""Every job belongs to a tenant (``jobs_engine.tenancy``): a ``tenant_id`` on jobs,
completed jobs, the hourly statistics' shards and audit records, each indexed for a
tenant's own list (partial indexes: jobs without a tenant write no entry).

On PostgreSQL the enqueue's insert functions take the tenant too: ``jobs_engine_insert_rows``
reads it from each row (element 14; the rows of a process of the release before have none),
and ``jobs_engine_insert_payloads`` gains an overload with the call's tenant (the one
without it stays for those processes).
"""

from django.db import migrations, models

_INSERT = """
        INSERT INTO jobs_engine_job AS j (code, target, lane, key, partition, version,
            payload, headers, dedupe_key, status, delivery_mode, attempts, next_run_at,
            last_error, trace_id, actor, priority, tenant_id, created_at, updated_at)
        SELECT r.code, r.target, r.lane, r.key, r.partition, r.version, r.payload, r.headers,
            r.dedupe_key, 'PENDING', r.delivery_mode, 0,
            CASE WHEN r.key IS NULL THEN r.due ELSE GREATEST(r.due, COALESCE(
                (SELECT h.next_run_at FROM jobs_engine_job h WHERE h.status = 'PENDING'
                 AND h.partition = r.partition AND h.target = r.target AND h.key = r.key
                 ORDER BY h.version, h.id LIMIT 1), r.due)) END,
            '', r.trace_id, r.actor, r.priority, r.tenant_id, now(), now()
        FROM (SELECT e->>0 AS code, e->>1 AS target, e->>2 AS lane, e->>3 AS key,
                  (e->>4)::smallint AS partition, (e->>5)::bigint AS version,
                  (e->>6)::jsonb AS payload, (e->>7)::jsonb AS headers, e->>8 AS dedupe_key,
                  e->>9 AS delivery_mode, COALESCE((e->>10)::timestamptz, now()) AS due,
                  e->>11 AS trace_id, (e->>12)::jsonb AS actor, (e->>13)::smallint AS priority,
                  e->>14 AS tenant_id
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

INSERT_PAYLOADS = """
CREATE OR REPLACE FUNCTION jobs_engine_insert_payloads(
    p_code text, p_target text, p_lane text, p_delivery_mode text, p_partitions integer,
    p_trace_id text, p_actor jsonb, payloads jsonb, p_tenant_id text)
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
            trace_id, actor, priority, tenant_id, created_at, updated_at)
        SELECT p_code, p_target, p_lane,
            mod(first_partition + r.n, p_partitions)::smallint,
            0, r.payload, '{}', key_prefix || r.number, 'PENDING', p_delivery_mode, 0, now(),
            '', COALESCE(p_trace_id, trace_prefix || r.number), p_actor, 0, p_tenant_id,
            now(), now()
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

# 0015's insert of rows, for a migration back.
INSERT_ROWS_BEFORE = (INSERT_ROWS.replace(", tenant_id, created_at", ", created_at")
                      .replace(", r.tenant_id, now()", ", now()")
                      .replace(""",
                  e->>14 AS tenant_id""", ""))


def create(apps, schema_editor):  # noqa: ARG001
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(INSERT_ROWS)
        schema_editor.execute(INSERT_PAYLOADS)


def drop(apps, schema_editor):  # noqa: ARG001
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(INSERT_ROWS_BEFORE)
        schema_editor.execute("DROP FUNCTION IF EXISTS jobs_engine_insert_payloads("
                              "text, text, text, text, integer, text, jsonb, jsonb, text)")


class Migration(migrations.Migration):

    dependencies = [
        ('jobs_engine', '0015_insert_rows_function'),
    ]

    operations = [
        migrations.AddField(
            model_name='auditrecord',
            name='tenant_id',
            field=models.CharField(blank=True, help_text="The tenant it belongs to; empty: the platform's own (tenancy).", max_length=200, null=True),
        ),
        migrations.AddField(
            model_name='completedjob',
            name='tenant_id',
            field=models.CharField(blank=True, help_text="The tenant it belongs to; empty: the platform's own (tenancy).", max_length=200, null=True),
        ),
        migrations.AddField(
            model_name='job',
            name='tenant_id',
            field=models.CharField(blank=True, help_text="The tenant it belongs to; empty: the platform's own (tenancy).", max_length=200, null=True),
        ),
        migrations.AddField(
            model_name='jobstatshard',
            name='tenant_id',
            field=models.CharField(blank=True, db_default='', default='', help_text="The tenant it belongs to; empty: the platform's own (tenancy).", max_length=200),
        ),
        migrations.AlterField(
            model_name='flow',
            name='tenant_id',
            field=models.CharField(blank=True, help_text="The tenant it belongs to; empty: the platform's own (tenancy).", max_length=200, null=True),
        ),
        migrations.AlterField(
            model_name='jobstatshard',
            name='shard',
            field=models.SmallIntegerField(help_text="The counting session's shard; -1: folded."),
        ),
        migrations.AddIndex(
            model_name='auditrecord',
            index=models.Index(condition=models.Q(('tenant_id__isnull', False)), fields=['tenant_id', '-id'], name='audit_by_tenant'),
        ),
        migrations.AddIndex(
            model_name='completedjob',
            index=models.Index(condition=models.Q(('tenant_id__isnull', False)), fields=['tenant_id', '-id'], name='jobs_done_by_tenant'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('tenant_id__isnull', False)), fields=['tenant_id', '-id'], name='jobs_by_tenant'),
        ),
        migrations.AddConstraint(
            model_name='jobstatshard',
            constraint=models.UniqueConstraint(fields=('hour', 'target', 'outcome', 'tenant_id', 'shard'), name='job_stat_shards_tenant_bucket'),
        ),
        migrations.RemoveConstraint(
            model_name='jobstatshard',
            name='job_stat_shards_bucket',
        ),
        migrations.RunPython(create, drop),
    ]
