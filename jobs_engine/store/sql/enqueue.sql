-- PostgreSQL's side of the enqueue, the wake-ups and the limits' admission, the one source
-- of these sequences and functions: the engine's migrations run this file as it is (store/functions.py splits it
-- into statements, and undoes them in reverse). A change to it needs a new migration that
-- runs it again (tests/unit/test_enqueue_sql.py holds the file to the newest one's digest).
-- jobs_engine.store calls the functions by the names in store/rows.py.
--
-- A row of the enqueue is a JSON array of its values, in the order of the "e->>N AS name"
-- lines of jobs_engine_new_rows, one a line: Python reads the columns from those lines
-- (store/functions.py, ROW_COLUMNS) to make its rows and SQLite's statement.
--
-- Wake-ups go only to workers that wait, after the enqueue's commit. A worker about to wait
-- takes the next number of its lane's jobs_engine_waits_<lane> sequence (jobs_engine_ask),
-- then polls once more before it sleeps. The enqueue's own statement (jobs_engine_enqueuing)
-- takes its lanes' advisory lock, shared, held until its transaction ends, counts fast-lane
-- rows (jobs_engine_enqueues_fast) and tells whether a worker of its lanes waits; only then
-- does jobs_engine_wake run after the commit: it notifies a lane whose waits number is past
-- its jobs_engine_wakes_<lane> (and moves that one up). A worker whose ask comes after an
-- enqueue looked, before its commit, finds the lock held (jobs_engine_enqueues_open) and
-- looks again soon instead of sleeping; a busy worker's poll reads the count and the lock
-- the same way (jobs_engine_fast_enqueues). The lock's two keys are hashtext('jobs_engine')
-- and hashtext(lane). Sequences, because they are read and moved outside transactions: a
-- number taken is seen at once by every session.

CREATE SEQUENCE IF NOT EXISTS jobs_engine_waits_fast;
CREATE SEQUENCE IF NOT EXISTS jobs_engine_waits_long;
CREATE SEQUENCE IF NOT EXISTS jobs_engine_wakes_fast;
CREATE SEQUENCE IF NOT EXISTS jobs_engine_wakes_long;
CREATE SEQUENCE IF NOT EXISTS jobs_engine_enqueues_fast;

-- The rows of an enqueue as they are stored, from their JSON. Written once for both of
-- jobs_engine_enqueue_rows' inserts, and inlined into them (a SQL function of one SELECT,
-- stable, without settings): their plans are the same as with this text in their place. A
-- new row of a key whose head waits for a retry starts at the head's run time: it is held
-- until then anyway, and keeping held rows out of the due range keeps the fast poll's cost
-- flat. Rows without a key skip that lookup (jobs_pending_key_order).
CREATE OR REPLACE FUNCTION jobs_engine_new_rows(rows jsonb)
RETURNS TABLE (code text, target text, lane text, key text, partition smallint,
    version bigint, payload jsonb, headers jsonb, dedupe_key text, delivery_mode text,
    next_run_at timestamptz, trace_id text, actor jsonb, priority smallint, tenant_id text,
    limit_key text)
LANGUAGE sql STABLE AS $$
SELECT r.code, r.target, r.lane, r.key, r.partition, r.version, r.payload, r.headers,
    r.dedupe_key, r.delivery_mode,
    CASE WHEN r.key IS NULL THEN r.due ELSE GREATEST(r.due, COALESCE(
        (SELECT h.next_run_at FROM jobs_engine_job h WHERE h.status = 'PENDING'
         AND h.partition = r.partition AND h.target = r.target AND h.key = r.key
         ORDER BY h.version, h.id LIMIT 1), r.due)) END,
    r.trace_id, r.actor, r.priority, r.tenant_id, r.limit_key
FROM (SELECT u.*, COALESCE(u.run_at, now()) AS due
      FROM (SELECT
                e->>0 AS code,
                e->>1 AS target,
                e->>2 AS lane,
                e->>3 AS key,
                (e->>4)::smallint AS partition,
                (e->>5)::bigint AS version,
                (e->>6)::jsonb AS payload,
                (e->>7)::jsonb AS headers,
                e->>8 AS dedupe_key,
                e->>9 AS delivery_mode,
                (e->>10)::timestamptz AS run_at,
                e->>11 AS trace_id,
                (e->>12)::jsonb AS actor,
                (e->>13)::smallint AS priority,
                e->>14 AS tenant_id,
                e->>15 AS limit_key
            FROM jsonb_array_elements(rows) AS e) AS u) AS r
$$;

-- The enqueue's insert of any rows, keyed ones included (jobs_engine_new_rows), as one
-- function whose plan the session keeps, prepared statements or not (a transaction pooler).
-- ``arbiter`` false when the enqueue made every dedupe key: no ON CONFLICT, whose check,
-- speculative insert and confirmation were an eighth of the insert. Sorts are off while it
-- runs (its own setting), so the head lookup takes the key-order index at any size of the
-- table and the kept plan stays good.
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
        RETURN QUERY WITH inserted AS (
            INSERT INTO jobs_engine_job AS j (code, target, lane, key, partition, version,
                payload, headers, dedupe_key, status, delivery_mode, attempts, next_run_at,
                last_error, trace_id, actor, priority, tenant_id, limit_key, created_at,
                updated_at)
            SELECT r.code, r.target, r.lane, r.key, r.partition, r.version, r.payload,
                r.headers, r.dedupe_key, 'PENDING', r.delivery_mode, 0, r.next_run_at, '',
                r.trace_id, r.actor, r.priority, r.tenant_id, r.limit_key, now(), now()
            FROM jobs_engine_new_rows(rows) AS r
            ON CONFLICT (dedupe_key) DO NOTHING
            RETURNING j.id, j.dedupe_key)
        SELECT inserted.id, inserted.dedupe_key::text FROM inserted;
    ELSE
        RETURN QUERY WITH inserted AS (
            INSERT INTO jobs_engine_job AS j (code, target, lane, key, partition, version,
                payload, headers, dedupe_key, status, delivery_mode, attempts, next_run_at,
                last_error, trace_id, actor, priority, tenant_id, limit_key, created_at,
                updated_at)
            SELECT r.code, r.target, r.lane, r.key, r.partition, r.version, r.payload,
                r.headers, r.dedupe_key, 'PENDING', r.delivery_mode, 0, r.next_run_at, '',
                r.trace_id, r.actor, r.priority, r.tenant_id, r.limit_key, now(), now()
            FROM jobs_engine_new_rows(rows) AS r
            RETURNING j.id, j.dedupe_key)
        SELECT inserted.id, inserted.dedupe_key::text FROM inserted;
    END IF;
END
$$;

-- The insert of a batch that is payloads of one target and nothing else; the server makes
-- its dedupe keys and trace ids (24 hex digits drawn once per call, then the row's number
-- in 8) and spreads its rows over consecutive partitions from a random one. The ids come
-- back in the payloads' order (PostgreSQL 13 or later: gen_random_uuid).
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
$$;

-- After the commit of an enqueue that found a worker waiting: notify each lane whose waits
-- number is past its wakes number, and move that one up; how many lanes were notified.
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
$$;

-- The enqueue's look at its lanes: their lock, taken shared until its transaction ends, the
-- fast-lane count, and whether a worker of them waits.
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
        PERFORM pg_advisory_xact_lock_shared(hashtext('jobs_engine'), hashtext('fast'));
        PERFORM nextval('jobs_engine_enqueues_fast');
    END IF;
    IF long THEN
        PERFORM pg_advisory_xact_lock_shared(hashtext('jobs_engine'), hashtext('long'));
    END IF;
    RETURN (fast AND COALESCE(pg_sequence_last_value('jobs_engine_waits_fast'), 0)
                     > COALESCE(pg_sequence_last_value('jobs_engine_wakes_fast'), 0))
        OR (long AND COALESCE(pg_sequence_last_value('jobs_engine_waits_long'), 0)
                     > COALESCE(pg_sequence_last_value('jobs_engine_wakes_long'), 0));
END
$$;

-- Whether an enqueue of the lane is open: its lock, tried at the session level and given
-- back at once, in a function whose every error gives it back too.
CREATE OR REPLACE FUNCTION jobs_engine_enqueues_open(p_lane text)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_try_advisory_lock(hashtext('jobs_engine'), hashtext(p_lane)) THEN
        PERFORM pg_advisory_unlock(hashtext('jobs_engine'), hashtext(p_lane));
        RETURN false;
    END IF;
    RETURN true;
EXCEPTION WHEN query_canceled OR OTHERS THEN
    -- Given back whatever happened: held, it would stop every enqueue of the lane.
    PERFORM pg_advisory_unlock(hashtext('jobs_engine'), hashtext(p_lane));
    RAISE;
END
$$;

-- A worker about to sleep: the next wait number of each of its lanes; false when an enqueue
-- of them is open (it may have looked before this ask).
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
$$;

-- A busy worker's poll: the fast-lane count and whether an enqueue of the lane is open.
CREATE OR REPLACE FUNCTION jobs_engine_fast_enqueues(OUT n bigint, OUT open boolean)
LANGUAGE plpgsql AS $$
BEGIN
    -- The count first, then the lock: an enqueue counted before the count was read either
    -- committed before the lock was tried or still holds it.
    n := COALESCE(pg_sequence_last_value('jobs_engine_enqueues_fast'), 0);
    open := jobs_engine_enqueues_open('fast');
END
$$;

-- The long lane's admission of rows its limits hold (store/limits.py,
-- jobs_long_reserve_limited). The worker plans from the buckets as they are, read unlocked:
-- k_take rows of key n (k_target, k_key), in that order. Here, in one call, the buckets are
-- locked in id order, the running rows counted after the locks (each statement of a
-- function sees what committed before it), each key's take cut to what its buckets allow
-- now, the rows claimed and the buckets written: the locks are held for this call only,
-- never across a round trip. A bucket (b_*) carries its limit's values in force: b_slots
-- for a concurrency limit (b_whole: its slots count the whole target), else b_starts per
-- b_period_s with b_burst; b_held: the keys it held back in the plan. Link n: key k_of[n]
-- is under bucket b_of[n] (1-based). The admission's time is the caller's, or the latest
-- refill of an unblocked bucket if that is later (another worker's clock ran ahead): tokens
-- are counted at it, and so never twice. The rows come back claimed, updated_at that time.
CREATE OR REPLACE FUNCTION jobs_engine_limits_admit(
    k_target text[], k_key text[], k_take integer[],
    b_target text[], b_name text[], b_key text[], b_slots integer[], b_starts integer[],
    b_period_s double precision[], b_burst integer[], b_whole boolean[], b_held integer[],
    k_of integer[], b_of integer[],
    p_owner text, p_token text, p_now timestamptz, p_lease_s double precision,
    p_start boolean)
RETURNS SETOF jobs_engine_job
LANGUAGE plpgsql
AS $$
DECLARE
    buckets integer := coalesce(array_length(b_target, 1), 0);
    links integer := coalesce(array_length(k_of, 1), 0);
    b_id bigint[] := array_fill(0::bigint, ARRAY[buckets]);
    b_tokens double precision[] := array_fill(0::double precision, ARRAY[buckets]);
    b_refilled timestamptz[] := array_fill(NULL::timestamptz, ARRAY[buckets]);
    b_blocked timestamptz[] := array_fill(NULL::timestamptz, ARRAY[buckets]);
    b_running bigint[];
    b_room bigint[] := array_fill(0::bigint, ARRAY[buckets]);
    b_taken integer[] := array_fill(0, ARRAY[buckets]);
    held_now integer[] := coalesce(b_held, '{}');
    b_left double precision[] := array_fill(0::double precision, ARRAY[buckets]);
    b_at timestamptz[] := array_fill(NULL::timestamptz, ARRAY[buckets]);
    admitted_at timestamptz := p_now;
    locked record;
    take bigint;
    got bigint;
    burst double precision;
BEGIN
    -- A new bucket is full: refilled_at NULL reads as its burst until first written.
    INSERT INTO jobs_engine_limit_bucket (target, name, key, tokens, admitted, throttled,
        used_at)
    SELECT w.target, w.name, w.key, 0, 0, 0, p_now
    FROM unnest(b_target, b_name, b_key) AS w(target, name, key)
    WHERE NOT EXISTS (SELECT 1 FROM jobs_engine_limit_bucket e WHERE e.target = w.target
                      AND e.name = w.name AND e.key = w.key)
    ON CONFLICT (target, name, key) DO NOTHING;
    FOR locked IN
        SELECT b.id, w.n, b.tokens, b.refilled_at, b.blocked_until
        FROM unnest(b_target, b_name, b_key) WITH ORDINALITY AS w(target, name, key, n)
        JOIN jobs_engine_limit_bucket b ON b.target = w.target AND b.name = w.name
             AND b.key = w.key
        ORDER BY b.id FOR UPDATE OF b
    LOOP
        b_id[locked.n] := locked.id;
        b_tokens[locked.n] := locked.tokens;
        b_refilled[locked.n] := locked.refilled_at;
        b_blocked[locked.n] := locked.blocked_until;
        IF locked.refilled_at IS NOT NULL
           AND NOT coalesce(locked.blocked_until > p_now, false) THEN
            admitted_at := greatest(admitted_at, locked.refilled_at);
        END IF;
    END LOOP;
    SELECT array_agg(CASE WHEN w.slots IS NULL THEN 0
        WHEN w.whole THEN (SELECT count(*) FROM jobs_engine_job j WHERE j.status = 'RUNNING'
                           AND j.limit_key IS NOT NULL AND j.target = w.target)
        ELSE (SELECT count(*) FROM jobs_engine_job j WHERE j.status = 'RUNNING'
              AND j.limit_key IS NOT NULL AND j.target = w.target AND j.limit_key = w.key)
        END ORDER BY w.n)
    INTO b_running
    FROM unnest(b_target, b_key, b_slots, b_whole) WITH ORDINALITY AS w(target, key, slots,
                                                                       whole, n);
    FOR n IN 1..buckets LOOP
        -- Its tokens at the admission's time, and the time they count from: a block's end
        -- still ahead keeps its time and its (emptied) tokens.
        IF b_refilled[n] > admitted_at THEN
            b_left[n] := b_tokens[n];
            b_at[n] := b_refilled[n];
        ELSIF b_slots[n] IS NULL THEN
            burst := coalesce(nullif(b_burst[n], 0), b_starts[n]);
            b_left[n] := CASE WHEN b_refilled[n] IS NULL THEN burst ELSE least(burst,
                b_tokens[n] + extract(epoch FROM admitted_at - b_refilled[n])::double precision
                * b_starts[n] / b_period_s[n]) END;
            b_at[n] := admitted_at;
        ELSE
            b_left[n] := 0;
            b_at[n] := admitted_at;
        END IF;
        b_room[n] := CASE WHEN b_blocked[n] > admitted_at THEN 0
                          WHEN b_slots[n] IS NOT NULL THEN greatest(0, b_slots[n] - b_running[n])
                          ELSE greatest(0, floor(b_left[n] + 1e-9)) END;
    END LOOP;
    FOR k IN 1..coalesce(array_length(k_target, 1), 0) LOOP
        take := k_take[k];
        FOR n IN 1..links LOOP
            IF k_of[n] = k THEN
                take := least(take, b_room[b_of[n]]);
            END IF;
        END LOOP;
        IF take < k_take[k] THEN  -- held back after all: by the buckets with no room left
            FOR n IN 1..links LOOP
                IF k_of[n] = k AND b_room[b_of[n]] = 0 THEN
                    held_now[b_of[n]] := coalesce(held_now[b_of[n]], 0) + 1;
                END IF;
            END LOOP;
        END IF;
        CONTINUE WHEN take <= 0;
        RETURN QUERY
        WITH picked AS (
            SELECT j.id FROM jobs_engine_job j
            WHERE j.status = 'PENDING' AND j.limit_key = k_key[k] AND j.target = k_target[k]
              AND j.next_run_at <= admitted_at
            ORDER BY j.priority DESC, j.next_run_at, j.id LIMIT take
            FOR UPDATE SKIP LOCKED)
        UPDATE jobs_engine_job AS j SET status = 'RUNNING', claim_token = p_token,
            claimed_by = p_owner,
            lease_until = admitted_at + p_lease_s * interval '1 second',
            started_at = CASE WHEN p_start AND NOT EXISTS (
                SELECT 1 FROM jobs_engine_targetpause p WHERE p.target = j.target)
                THEN admitted_at END,
            updated_at = admitted_at
        FROM picked WHERE j.id = picked.id AND j.status = 'PENDING'
        RETURNING j.*;
        GET DIAGNOSTICS got = ROW_COUNT;
        FOR n IN 1..links LOOP
            IF k_of[n] = k THEN
                b_room[b_of[n]] := b_room[b_of[n]] - got;
                b_taken[b_of[n]] := b_taken[b_of[n]] + got;
            END IF;
        END LOOP;
    END LOOP;
    UPDATE jobs_engine_limit_bucket AS b
    SET tokens = CASE WHEN w.slots IS NULL OR w.refilled > admitted_at THEN w.left_ - w.taken
                      ELSE 0 END,
        refilled_at = w.at_, admitted = b.admitted + w.taken,
        throttled = b.throttled + coalesce(w.held, 0), used_at = admitted_at
    FROM unnest(b_id, b_left, b_at, b_taken, held_now, b_slots, b_refilled)
         AS w(id, left_, at_, taken, held, slots, refilled)
    WHERE b.id = w.id AND (w.taken > 0 OR coalesce(w.held, 0) > 0);
END
$$;
