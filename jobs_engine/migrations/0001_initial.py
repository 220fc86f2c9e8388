"""The engine's tables, and on PostgreSQL the sequences and PL/pgSQL functions of the enqueue
and the wake-ups, which models do not express.

The tables are ``makemigrations``' output (two of them, ``Worker`` and ``JobStatShard``, list
their last columns in the order the schema has always had them; Django reads columns by name).
The PostgreSQL objects, which ``jobs_engine.store`` names and calls:

- ``jobs_engine_enqueue_rows(rows, arbiter)``: the enqueue's insert of any rows, keyed ones
  included, as one function whose plan the session keeps, prepared statements or not (a
  transaction pooler). ``rows`` is a JSON array of arrays in ``store.enqueue._INSERT_COLUMNS``'
  order; ``arbiter`` false when the enqueue made every dedupe key (no ``ON CONFLICT``). A new
  row of a key whose head waits for a retry starts at the head's run time, so a keyed row
  looks up its key's head; the function runs with sorts off (its own setting, only while it
  runs), so that lookup takes the key-order index at any size of the table and the kept plan
  stays good.
- ``jobs_engine_enqueue_payloads(...)``: the insert of a batch that is payloads of one target
  and nothing else; the server makes its dedupe keys and trace ids (24 hex digits drawn once
  per call, then the row's number in 8) and spreads its rows over consecutive partitions from
  a random one. The ids come back in the payloads' order (PostgreSQL 13 or later:
  ``gen_random_uuid``).
- Wake-ups sent only to workers that wait, after the enqueue's commit. A worker about to wait
  takes the next number of its lane's ``jobs_engine_waits_<lane>`` sequence (``jobs_engine_ask``)
  then polls once more before it sleeps. The enqueue's own statement
  (``jobs_engine_enqueuing``) takes its lanes' advisory lock, shared, held until its
  transaction ends, counts fast-lane rows (``jobs_engine_enqueues_fast``) and tells whether a
  worker of its lanes waits; only then does ``jobs_engine_wake`` run after the commit: it
  notifies a lane whose waits number is past its ``jobs_engine_wakes_<lane>`` (and moves that
  one up), in a transaction of its own whose commit does not wait for the WAL flush. A worker
  whose ask comes after an enqueue looked, before its commit, finds the lock held
  (``jobs_engine_enqueues_open``) and looks again soon instead of sleeping; a busy worker's
  poll reads the count and the lock the same way (``jobs_engine_fast_enqueues``). The lock is
  tried at the session level and given back at once, in a function whose every error gives it
  back too. Its two keys are ``hashtext('jobs_engine')`` and ``hashtext(lane)``. Sequences,
  because they are read and moved outside transactions: a number taken is seen at once by
  every session.

A database role that is not the migrations' owner needs ``USAGE, SELECT, UPDATE`` on the five
sequences and ``EXECUTE`` on the functions (PostgreSQL grants ``EXECUTE`` to ``PUBLIC`` by
default).
"""

import django.db.models.deletion
from django.db import migrations, models

_INSERT_ROWS = """
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

ENQUEUE_ROWS = f"""
CREATE OR REPLACE FUNCTION jobs_engine_enqueue_rows(rows jsonb, arbiter boolean)
RETURNS TABLE (job_id bigint, job_dedupe_key text)
LANGUAGE plpgsql
SET enable_sort = off
AS $$
BEGIN
    -- Counted at the insert too (the count after the commit may never come: a test's
    -- transaction, one Django does not manage); any lane's rows: one count is cheaper
    -- than finding out.
    PERFORM nextval('jobs_engine_enqueues_fast');
    IF arbiter THEN
        RETURN QUERY WITH inserted AS ({_INSERT_ROWS}
        ON CONFLICT (dedupe_key) DO NOTHING
        RETURNING j.id, j.dedupe_key)
        SELECT inserted.id, inserted.dedupe_key::text FROM inserted;
    ELSE
        RETURN QUERY WITH inserted AS ({_INSERT_ROWS}
        RETURNING j.id, j.dedupe_key)
        SELECT inserted.id, inserted.dedupe_key::text FROM inserted;
    END IF;
END
$$
"""

ENQUEUE_PAYLOADS = """
CREATE OR REPLACE FUNCTION jobs_engine_enqueue_payloads(
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
    IF p_lane = 'fast' THEN
        PERFORM nextval('jobs_engine_enqueues_fast');  -- as jobs_engine_enqueue_rows
    END IF;
END
$$
"""

WAKE = """
CREATE OR REPLACE FUNCTION jobs_engine_wake(p_lanes text[], p_payloads text[])
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    lane text;
    waits bigint;
    notified integer := 0;
BEGIN
    -- Called on its own after the enqueue's commit, and writes nothing but sequences and
    -- notifications: a crash can lose a wake-up or a count, never a job, so its commit
    -- need not wait for the WAL flush (nor hold the notification lock through it).
    PERFORM set_config('synchronous_commit', 'off', true);
    FOR i IN 1 .. coalesce(array_length(p_lanes, 1), 0) LOOP
        lane := p_lanes[i];
        IF lane = 'fast' THEN
            PERFORM nextval('jobs_engine_enqueues_fast');
        END IF;
        waits := COALESCE(pg_sequence_last_value(('jobs_engine_waits_' || lane)::regclass), 0);
        IF waits > COALESCE(
                pg_sequence_last_value(('jobs_engine_wakes_' || lane)::regclass), 0) THEN
            PERFORM setval(('jobs_engine_wakes_' || lane)::regclass, waits);
            PERFORM pg_notify('jobs_engine', p_payloads[i]);
            notified := notified + 1;
        END IF;
    END LOOP;
    RETURN notified;
END
$$
"""


LOCK = "hashtext('jobs_engine'), hashtext({lane})"

ENQUEUING = f"""
CREATE OR REPLACE FUNCTION jobs_engine_enqueuing(p_lanes text[])
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    fast boolean := 'fast' = ANY(p_lanes);
    long boolean := 'long' = ANY(p_lanes);
BEGIN
    -- The lock first, then the count and the look at the wait numbers: a worker that
    -- asks after this look finds the lock held until this transaction ends. The lanes'
    -- names are written out: a sequence named at run time is looked up at every call.
    IF fast THEN
        PERFORM pg_advisory_xact_lock_shared({LOCK.format(lane="'fast'")});
        PERFORM nextval('jobs_engine_enqueues_fast');
    END IF;
    IF long THEN
        PERFORM pg_advisory_xact_lock_shared({LOCK.format(lane="'long'")});
    END IF;
    RETURN (fast AND COALESCE(pg_sequence_last_value('jobs_engine_waits_fast'), 0)
                     > COALESCE(pg_sequence_last_value('jobs_engine_wakes_fast'), 0))
        OR (long AND COALESCE(pg_sequence_last_value('jobs_engine_waits_long'), 0)
                     > COALESCE(pg_sequence_last_value('jobs_engine_wakes_long'), 0));
END
$$
"""

ENQUEUES_OPEN = f"""
CREATE OR REPLACE FUNCTION jobs_engine_enqueues_open(p_lane text)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_try_advisory_lock({LOCK.format(lane="p_lane")}) THEN
        PERFORM pg_advisory_unlock({LOCK.format(lane="p_lane")});
        RETURN false;
    END IF;
    RETURN true;
EXCEPTION WHEN query_canceled OR OTHERS THEN
    -- Given back whatever happened: held, it would stop every enqueue of the lane.
    PERFORM pg_advisory_unlock({LOCK.format(lane="p_lane")});
    RAISE;
END
$$
"""

ASK = """
CREATE OR REPLACE FUNCTION jobs_engine_ask(p_lanes text[])
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    lane text;
    clear boolean := true;
BEGIN
    -- The wait numbers first, then the locks: an enqueue that looked at the numbers
    -- before this ask holds its lock until it commits.
    FOREACH lane IN ARRAY p_lanes LOOP
        PERFORM nextval(('jobs_engine_waits_' || lane)::regclass);
    END LOOP;
    FOREACH lane IN ARRAY p_lanes LOOP
        IF jobs_engine_enqueues_open(lane) THEN
            clear := false;
        END IF;
    END LOOP;
    RETURN clear;
END
$$
"""

FAST_ENQUEUES = """
CREATE OR REPLACE FUNCTION jobs_engine_fast_enqueues(OUT n bigint, OUT open boolean)
LANGUAGE plpgsql AS $$
BEGIN
    -- The count first, then the lock: an enqueue counted before the count was read either
    -- committed before the lock was tried or still holds it.
    n := COALESCE(pg_sequence_last_value('jobs_engine_enqueues_fast'), 0);
    open := jobs_engine_enqueues_open('fast');
END
$$
"""


SEQUENCES = ("jobs_engine_waits_fast", "jobs_engine_waits_long", "jobs_engine_wakes_fast",
             "jobs_engine_wakes_long", "jobs_engine_enqueues_fast")
FUNCTIONS = (ENQUEUE_ROWS, ENQUEUE_PAYLOADS, WAKE, ENQUEUING, ENQUEUES_OPEN, ASK, FAST_ENQUEUES)
SIGNATURES = ("jobs_engine_fast_enqueues()", "jobs_engine_ask(text[])",
              "jobs_engine_enqueues_open(text)", "jobs_engine_enqueuing(text[])",
              "jobs_engine_wake(text[], text[])", "jobs_engine_enqueue_rows(jsonb, boolean)",
              "jobs_engine_enqueue_payloads(text, text, text, text, integer, text, jsonb, jsonb, "
              "text)")


def create_postgresql_objects(apps, schema_editor):  # noqa: ARG001
    if schema_editor.connection.vendor == "postgresql":
        for sequence in SEQUENCES:
            schema_editor.execute(f"CREATE SEQUENCE IF NOT EXISTS {sequence}")
        for function in FUNCTIONS:
            schema_editor.execute(function)


def drop_postgresql_objects(apps, schema_editor):  # noqa: ARG001
    if schema_editor.connection.vendor == "postgresql":
        for signature in SIGNATURES:
            schema_editor.execute(f"DROP FUNCTION IF EXISTS {signature}")
        for sequence in SEQUENCES:
            schema_editor.execute(f"DROP SEQUENCE IF EXISTS {sequence}")


class Migration(migrations.Migration):

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='JobStat',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
            ],
            options={
                'db_table': 'jobs_engine_jobstat',
                'managed': False,
            },
        ),
        migrations.CreateModel(
            name='RegisteredTarget',
            fields=[
                ('name', models.CharField(max_length=200, primary_key=True, serialize=False)),
            ],
            options={
                'verbose_name': 'target',
                'db_table': 'jobs_engine_registered_target',
                'managed': False,
            },
        ),
        migrations.CreateModel(
            name='Partition',
            fields=[
                ('partition', models.SmallIntegerField(primary_key=True, serialize=False)),
                ('owner', models.CharField(blank=True, db_index=True, max_length=200, null=True)),
                ('lease_until', models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.CreateModel(
            name='TargetPause',
            fields=[
                ('target', models.CharField(max_length=200, primary_key=True, serialize=False)),
                ('paused_until', models.DateTimeField()),
                ('reason', models.TextField(blank=True, default='')),
                ('paused_at', models.DateTimeField()),
                ('probe_by', models.CharField(blank=True, max_length=200, null=True)),
            ],
        ),
        migrations.CreateModel(
            name='VersionCounter',
            fields=[
                ('key', models.CharField(max_length=255, primary_key=True, serialize=False)),
                ('value', models.BigIntegerField(default=0)),
            ],
        ),
        migrations.CreateModel(
            name='Worker',
            fields=[
                ('worker_id', models.CharField(max_length=200, primary_key=True, serialize=False)),
                ('heartbeat_at', models.DateTimeField(db_index=True)),
                ('started_at', models.DateTimeField()),
                ('hostname', models.CharField(blank=True, default='', max_length=200)),
                ('pid', models.IntegerField(default=0)),
                ('lanes', models.CharField(blank=True, default='', max_length=50)),
                ('db_outages', models.IntegerField(db_default=0, default=0)),
                ('last_db_error', models.TextField(blank=True, db_default='', default='')),
                ('last_db_outage_at', models.DateTimeField(blank=True, null=True)),
                ('last_db_outage_s', models.FloatField(db_default=0.0, default=0.0)),
            ],
        ),
        migrations.CreateModel(
            name='AuditRecord',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('at', models.DateTimeField(db_index=True)),
                ('user_id', models.BigIntegerField(blank=True, null=True)),
                ('username', models.CharField(blank=True, default='', max_length=150)),
                ('action', models.CharField(max_length=32)),
                ('object_type', models.CharField(max_length=32)),
                ('object_id', models.CharField(max_length=255)),
                ('result', models.CharField(choices=[('ok', 'Done'), ('refused', 'Refused')], max_length=8)),
                ('message', models.TextField(blank=True, default='')),
                ('tenant_id', models.CharField(blank=True, help_text="The tenant it belongs to; empty: the platform's own (tenancy).", max_length=200, null=True)),
            ],
            options={
                'indexes': [models.Index(fields=['object_type', 'object_id'], name='audit_object'), models.Index(condition=models.Q(('tenant_id__isnull', False)), fields=['tenant_id', '-id'], name='audit_by_tenant')],
            },
        ),
        migrations.CreateModel(
            name='CompletedJob',
            fields=[
                ('id', models.BigIntegerField(primary_key=True, serialize=False)),
                ('target', models.CharField(max_length=200)),
                ('lane', models.CharField(choices=[('fast', 'Fast'), ('long', 'Long')], max_length=8)),
                ('code', models.CharField(max_length=200)),
                ('key', models.CharField(blank=True, max_length=255, null=True)),
                ('version', models.BigIntegerField(default=0)),
                ('partition', models.SmallIntegerField(default=0)),
                ('dedupe_key', models.CharField(max_length=255)),
                ('delivery_mode', models.CharField(choices=[('at_most_once', 'At most once'), ('at_least_once', 'At least once')], max_length=16)),
                ('payload', models.JSONField(blank=True, null=True)),
                ('headers', models.JSONField(blank=True, default=dict)),
                ('result', models.JSONField(blank=True, help_text='What the handler returned.', null=True)),
                ('attempts', models.IntegerField(default=1, help_text='Tries made, this one included.')),
                ('trace_id', models.CharField(blank=True, default='', max_length=64)),
                ('actor', models.JSONField(blank=True, null=True)),
                ('created_at', models.DateTimeField()),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField()),
                ('duration_ms', models.FloatField(default=0.0)),
                ('tries', models.JSONField(blank=True, help_text="Long lane: one entry per try that ended: the worker, its start and end, and the exception's class and traceback when it raised.", null=True)),
                ('tenant_id', models.CharField(blank=True, help_text="The tenant it belongs to; empty: the platform's own (tenancy).", max_length=200, null=True)),
            ],
            options={
                'db_table': 'jobs_engine_done',
                'indexes': [models.Index(fields=['target', 'finished_at', 'id'], name='jobs_done_by_target'), models.Index(condition=models.Q(('tenant_id__isnull', False)), fields=['tenant_id', '-id'], name='jobs_done_by_tenant')],
            },
        ),
        migrations.CreateModel(
            name='Flow',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('name', models.CharField(max_length=200)),
                ('kind', models.CharField(choices=[('chain', 'Chain'), ('batch', 'Batch')], max_length=8)),
                ('state', models.CharField(choices=[('RUNNING', 'Running'), ('COMPLETED', 'Completed'), ('FAILED', 'Failed'), ('CANCELLED', 'Cancelled')], default='RUNNING', max_length=10)),
                ('definition', models.CharField(blank=True, default='', help_text='The defined flow it was started from, if any.', max_length=200)),
                ('tenant_id', models.CharField(blank=True, help_text="The tenant it belongs to; empty: the platform's own (tenancy).", max_length=200, null=True)),
                ('steps_total', models.IntegerField()),
                ('steps_done', models.IntegerField(default=0)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'verbose_name': 'job flow',
                'db_table': 'jobs_engine_flow',
                'permissions': [('manage_flows', 'Can start, retry and cancel job flows')],
                'indexes': [models.Index(fields=['tenant_id', 'state', 'id'], name='jobs_flow_by_tenant'), models.Index(condition=models.Q(('finished_at__isnull', False)), fields=['finished_at'], name='jobs_flow_finished')],
            },
        ),
        migrations.CreateModel(
            name='InflightMark',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('token', models.CharField(help_text="The poll's token.", max_length=32)),
                ('partition', models.SmallIntegerField()),
                ('owner', models.CharField(max_length=200)),
                ('ids', models.JSONField(help_text='The rows of the send in this partition.')),
                ('marked_at', models.DateTimeField()),
            ],
            options={
                'db_table': 'jobs_engine_inflight',
                'indexes': [models.Index(fields=['token'], name='jobs_inflight_by_token'), models.Index(fields=['partition'], name='jobs_inflight_by_partition')],
            },
        ),
        migrations.CreateModel(
            name='Job',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('code', models.CharField(help_text='Business name; defaults to the target.', max_length=200)),
                ('target', models.CharField(max_length=200)),
                ('lane', models.CharField(choices=[('fast', 'Fast'), ('long', 'Long')], max_length=8)),
                ('key', models.CharField(blank=True, help_text='Ordering key.', max_length=255, null=True)),
                ('partition', models.SmallIntegerField()),
                ('version', models.BigIntegerField(default=0, help_text='Order inside a key.')),
                ('payload', models.JSONField(blank=True, null=True)),
                ('headers', models.JSONField(blank=True, default=dict)),
                ('dedupe_key', models.CharField(max_length=255)),
                ('status', models.CharField(choices=[('PENDING', 'Pending'), ('RUNNING', 'Running'), ('DEAD', 'Dead'), ('DONE', 'Done')], default='PENDING', max_length=8)),
                ('delivery_mode', models.CharField(choices=[('at_most_once', 'At most once'), ('at_least_once', 'At least once')], default='at_most_once', max_length=16)),
                ('attempts', models.IntegerField(default=0, help_text='Tries made so far.')),
                ('next_run_at', models.DateTimeField()),
                ('last_error', models.TextField(blank=True, default='')),
                ('claimed_by', models.CharField(blank=True, max_length=200, null=True)),
                ('claim_token', models.CharField(blank=True, max_length=32, null=True)),
                ('lease_until', models.DateTimeField(blank=True, null=True)),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('running_code', models.CharField(blank=True, max_length=200, null=True)),
                ('outcome_token', models.CharField(blank=True, max_length=32, null=True)),
                ('closed_at', models.DateTimeField(blank=True, null=True)),
                ('trace_id', models.CharField(blank=True, default='', max_length=64)),
                ('actor', models.JSONField(blank=True, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('priority', models.SmallIntegerField(db_default=0, default=0, help_text='Long lane: -100..100, higher runs first.')),
                ('tries', models.JSONField(blank=True, help_text="Long lane: one entry per try that ended: the worker, its start and end, and the exception's class and traceback when it raised.", null=True)),
                ('tenant_id', models.CharField(blank=True, help_text="The tenant it belongs to; empty: the platform's own (tenancy).", max_length=200, null=True)),
            ],
            options={
                'permissions': [('manage_jobs', 'Can manage jobs and schedules')],
                'indexes': [models.Index(condition=models.Q(('status', 'PENDING'), ('lane', 'long')), fields=['-priority', 'next_run_at', 'id'], name='jobs_long_pending_due'), models.Index(condition=models.Q(('status', 'PENDING'), ('lane', 'fast')), fields=['target', 'next_run_at', 'id'], name='jobs_fast_pending_due'), models.Index(condition=models.Q(('status', 'PENDING'), ('key__isnull', False)), fields=['partition', 'target', 'key', 'version', 'id'], name='jobs_pending_key_order'), models.Index(condition=models.Q(('status', 'RUNNING')), fields=['lease_until'], name='jobs_running_lease'), models.Index(condition=models.Q(('status', 'DEAD')), fields=['closed_at'], name='jobs_dead_closed'), models.Index(condition=models.Q(('status', 'DEAD')), fields=['target', 'closed_at', 'id'], name='jobs_dead_by_target'), models.Index(condition=models.Q(('key__isnull', False)), fields=['key'], name='jobs_key'), models.Index(condition=models.Q(('tenant_id__isnull', False)), fields=['tenant_id', '-id'], name='jobs_by_tenant')],
                'constraints': [models.UniqueConstraint(fields=('dedupe_key',), name='jobs_one_per_dedupe_key'), models.UniqueConstraint(condition=models.Q(('status', 'RUNNING'), ('running_code__isnull', False)), fields=('running_code',), name='jobs_one_running_per_code')],
            },
        ),
        migrations.CreateModel(
            name='JobStatShard',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('hour', models.DateTimeField(help_text='Start of the hour (UTC).')),
                ('target', models.CharField(max_length=200)),
                ('outcome', models.CharField(max_length=16)),
                ('shard', models.SmallIntegerField(help_text="The counting session's shard; -1: folded.")),
                ('count', models.BigIntegerField(default=0)),
                ('tenant_id', models.CharField(blank=True, db_default='', default='', help_text="The tenant it belongs to; empty: the platform's own (tenancy).", max_length=200)),
            ],
            options={
                'indexes': [models.Index(fields=['hour'], name='job_stat_shards_hour')],
                'constraints': [models.UniqueConstraint(condition=models.Q(('shard', -1)), fields=('hour', 'target', 'outcome', 'tenant_id'), name='job_stat_shards_folded')],
            },
        ),
        migrations.CreateModel(
            name='FlowStep',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('position', models.IntegerField(help_text="Order in the chain, or in the batch's results.")),
                ('role', models.CharField(choices=[('step', 'Chain step'), ('job', 'Batch job'), ('callback', 'Batch callback')], max_length=8)),
                ('name', models.CharField(max_length=200)),
                ('target', models.CharField(max_length=200)),
                ('data', models.JSONField(blank=True, null=True)),
                ('state', models.CharField(choices=[('WAITING', 'Waiting'), ('QUEUED', 'Queued'), ('DONE', 'Done'), ('FAILED', 'Failed'), ('CANCELLED', 'Cancelled')], default='WAITING', max_length=10)),
                ('job_id', models.BigIntegerField(blank=True, null=True)),
                ('result', models.JSONField(blank=True, null=True)),
                ('attempts', models.IntegerField(default=0, help_text='Tries made, over every retry.')),
                ('last_error', models.TextField(blank=True, default='')),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('flow', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='steps', to='jobs_engine.flow')),
            ],
            options={
                'db_table': 'jobs_engine_flowstep',
                'indexes': [models.Index(condition=models.Q(('job_id__isnull', False)), fields=['job_id'], name='jobs_flowstep_by_job')],
                'constraints': [models.UniqueConstraint(fields=('flow', 'position'), name='jobs_flowstep_place')],
            },
        ),
        migrations.RunPython(create_postgresql_objects, drop_postgresql_objects),
    ]
