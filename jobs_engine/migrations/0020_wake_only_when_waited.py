"""A statement after an enqueue's commit only when a worker waited (PostgreSQL only).

0019 ran one statement after every enqueuing commit to find out whether a worker waited:
a web process paid two round trips and two transactions for a one-job request, and with
nobody waiting (a busy queue) the second did nothing. Now the enqueue's own statement asks
(``jobs_engine_enqueuing``): it takes its lanes' advisory lock, shared, held until its
transaction ends, counts fast-lane rows (``jobs_engine_enqueues_fast``), then tells whether
a worker of its lanes waits. Only then does the statement after the commit
(``jobs_engine_wake``) run.

A worker that asks after the enqueue looked, before its commit, is told so by the lock:
its ask (``jobs_engine_ask``) takes its wait number, then tries the lock, which an
enqueuing transaction still open holds (``jobs_engine_enqueues_open``); such a worker
looks again soon instead of sleeping. A busy worker's poll reads the count and the lock
the same way (``jobs_engine_fast_enqueues``): a count read while an enqueue was open does
not let it skip its idle targets two polls later.

The lock is tried at the session level and given back at once, in a function whose every
error gives it back too: held any longer, it would stop every enqueue. The two keys are
``hashtext('jobs_engine')`` and ``hashtext(lane)``.
"""

from django.db import migrations

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


def create(apps, schema_editor):  # noqa: ARG001
    if schema_editor.connection.vendor == "postgresql":
        for statement in (ENQUEUING, ENQUEUES_OPEN, ASK, FAST_ENQUEUES):
            schema_editor.execute(statement)


def drop(apps, schema_editor):  # noqa: ARG001
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP FUNCTION IF EXISTS jobs_engine_fast_enqueues()")
        schema_editor.execute("DROP FUNCTION IF EXISTS jobs_engine_ask(text[])")
        schema_editor.execute("DROP FUNCTION IF EXISTS jobs_engine_enqueues_open(text)")
        schema_editor.execute("DROP FUNCTION IF EXISTS jobs_engine_enqueuing(text[])")


class Migration(migrations.Migration):

    dependencies = [
        ('jobs_engine', '0019_wake_when_waiting'),
    ]

    operations = [
        migrations.RunPython(create, drop),
    ]
