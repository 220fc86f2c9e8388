"""Wake-ups sent only to workers that wait, after the enqueue's commit (PostgreSQL only).

A NOTIFY in the enqueue's own transaction takes one database-wide lock at commit and holds
it through the commit's WAL flush: every enqueuing transaction that notified committed one
after another, so sixteen web processes enqueueing a job per request reached what one
did alone. Now:

- ``jobs_engine_enqueue_rows`` and ``jobs_engine_enqueue_payloads`` insert as 0016's
  functions do and notify nothing;
- a worker about to wait takes the next number of its lane's ``jobs_engine_waits_<lane>``
  sequence, then polls once more before it sleeps;
- after the enqueue's commit, ``jobs_engine_wake`` notifies a lane whose waits number is
  past its ``jobs_engine_wakes_<lane>`` (and moves that one up): one notification per
  wait, sent by a transaction of its own whose commit does not wait for the WAL flush.
  The notification names the fast-lane targets of the commit (``fast:<JSON list>``), so
  the poll that answers it reads those; and the statement counts the commits of fast-lane
  rows (``jobs_engine_enqueues_fast``, counted by the insert too), so a busy worker reads
  its other targets only when rows may have come for them.

Read after the commit, a wait number is either seen, and answered, or taken after the
rows were committed, and the poll that follows it finds them. Sequences, because they are
read and moved outside transactions: a number taken is seen at once by every session.

0016's functions stay, notifying, for processes of the release before.
"""

from django.db import migrations

LANES = ("fast", "long")

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


def create(apps, schema_editor):  # noqa: ARG001
    if schema_editor.connection.vendor == "postgresql":
        for lane in LANES:
            schema_editor.execute(f"CREATE SEQUENCE IF NOT EXISTS jobs_engine_waits_{lane}")
            schema_editor.execute(f"CREATE SEQUENCE IF NOT EXISTS jobs_engine_wakes_{lane}")
        schema_editor.execute("CREATE SEQUENCE IF NOT EXISTS jobs_engine_enqueues_fast")
        schema_editor.execute(ENQUEUE_ROWS)
        schema_editor.execute(ENQUEUE_PAYLOADS)
        schema_editor.execute(WAKE)


def drop(apps, schema_editor):  # noqa: ARG001
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP FUNCTION IF EXISTS jobs_engine_wake(text[], text[])")
        schema_editor.execute("DROP SEQUENCE IF EXISTS jobs_engine_enqueues_fast")
        schema_editor.execute("DROP FUNCTION IF EXISTS jobs_engine_enqueue_rows(jsonb, boolean)")
        schema_editor.execute("DROP FUNCTION IF EXISTS jobs_engine_enqueue_payloads("
                              "text, text, text, text, integer, text, jsonb, jsonb, text)")
        for lane in LANES:
            schema_editor.execute(f"DROP SEQUENCE IF EXISTS jobs_engine_waits_{lane}")
            schema_editor.execute(f"DROP SEQUENCE IF EXISTS jobs_engine_wakes_{lane}")


class Migration(migrations.Migration):

    dependencies = [
        ('jobs_engine', '0018_inflight_marks'),
    ]

    operations = [
        migrations.RunPython(create, drop),
    ]
