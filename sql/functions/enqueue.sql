-- pgjobq functions: enqueue.  Jobs enter pgjobq.jobs here (-> queued), and workers are woken.
--
-- Applied by `pgjobq migrate` with the other files of sql/functions (docs/hacking.md): each function
-- is defined once, here, as it is now.

-- job_defaults(): what a job gets for a field it is enqueued without: queue and kind 'default',
-- payload {}, priority 0, max_attempts 25, the columns' defaults of pgjobq.jobs.  Read by the C
-- library once per client for its COPY (src/enqueue.c), so that no client states them; the enqueue
-- functions write the same values (tests/test_rules.c enqueues a job without fields through every
-- path, and a row by hand, and reads them back).  An SQL function without SET: the planner inlines
-- it, a constant row.
CREATE OR REPLACE FUNCTION pgjobq.job_defaults()
RETURNS TABLE (queue text, kind text, payload jsonb, priority smallint, max_attempts integer)
LANGUAGE sql IMMUTABLE
AS $$
    SELECT 'default'::pg_catalog.text, 'default'::pg_catalog.text, '{}'::pg_catalog.jsonb, 0::pg_catalog.int2,
           25::pg_catalog.int4
$$;

-- notify_gate_window(): how long a gate's stamp silences the notifications of its queue (5 ms);
-- notify_gate_slot(queue), notify_gate_tag(queue): the queue's slot (its sequence) and tag; notify_gate_tick(t): a moment as a
-- stamp's time, in units of 64 microseconds since 2000 (up to the year 2285 in a stamp's 47 bits)
-- (docs/design.md, "The notification gate"; sql/032_notify_gate.sql).  SQL functions without SET: the
-- planner inlines them (notify_gate_tick is STABLE, as date_part of a timestamptz is: declared
-- IMMUTABLE it was not inlined, and its body was planned at every call).
CREATE OR REPLACE FUNCTION pgjobq.notify_gate_window() RETURNS interval
LANGUAGE sql IMMUTABLE
AS $$ SELECT interval '5 milliseconds' $$;

CREATE OR REPLACE FUNCTION pgjobq.notify_gate_slot(queue text) RETURNS regclass
LANGUAGE sql STABLE
AS $$ SELECT ('pgjobq.notify_gate_' || (pg_catalog.hashtext(queue) & 63))::pg_catalog.regclass $$;

CREATE OR REPLACE FUNCTION pgjobq.notify_gate_tag(queue text) RETURNS bigint
LANGUAGE sql IMMUTABLE
AS $$ SELECT ((pg_catalog.hashtext(queue) >> 6) & 65535)::pg_catalog.int8 $$;

CREATE OR REPLACE FUNCTION pgjobq.notify_gate_tick(t timestamptz) RETURNS bigint
LANGUAGE sql STABLE
AS $$
    SELECT (((pg_catalog.date_part('epoch', t) - 946684800) * 1000000)::pg_catalog.int8) >> 6
$$;

-- notify_gate_shut(stamp, queue, age): whether stamp (a gate's sequence value, NULL: never set) is a
-- stamp of queue's younger than age: the one judge of notify (age: the window) and of claim_next (half
-- the window).  The stamp is truncated to 64 microseconds, so it ends no later than the worker's.
-- VOLATILE, as clock_timestamp is, so that the planner inlines it (STABLE, it would not).
CREATE OR REPLACE FUNCTION pgjobq.notify_gate_shut(stamp bigint, queue text, age interval) RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT coalesce(stamp & 65535 = pgjobq.notify_gate_tag(queue)
                    AND stamp >> 16 > pgjobq.notify_gate_tick(pg_catalog.clock_timestamp() - age), false)
$$;

-- notify(queues): wake workers listening on channel 'pgjobq', one notification per distinct queue (a
-- NULL element: the default queue, job_defaults()), except for a queue whose gate a worker stamped
-- less than notify_gate_window() ago: that worker will claim from it again after the window, and go
-- on claiming until this transaction has ended, so the notification would tell nobody anything
-- (docs/design.md, "The notification gate").  Notifications are delivered at commit, so a
-- rolled-back enqueue wakes nobody.  SECURITY DEFINER: it reads the gate's sequences, which no role
-- is granted; its statements planned once per session.
CREATE OR REPLACE FUNCTION pgjobq.notify(queues text[]) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    PERFORM pg_notify('pgjobq', d.q)
       FROM (SELECT DISTINCT coalesce(u.q, j.queue) AS q
               FROM unnest(queues) AS u(q), pgjobq.job_defaults() j) d
      CROSS JOIN LATERAL (SELECT pg_sequence_last_value(pgjobq.notify_gate_slot(d.q)) AS st) g
      WHERE NOT pgjobq.notify_gate_shut(g.st, d.q, pgjobq.notify_gate_window());
END
$$;

-- The enqueue rules that no constraint of pgjobq.jobs can state, one function each, applied by every
-- way in: enqueue, enqueue_many, enqueue_graph and the C library's COPY (docs/sql.md, "The enqueue
-- rules").  Clients check only what cannot reach the database (invalid UTF-8, JSON that does not
-- parse), so that every interface gives the same answer.
--
-- enqueue_when_why(run_at, delay, run_at_name, delay_name): when a job may be due.  run_at or a
-- delay, not both; a delay not negative; run_at, or now() + the delay, within 100 years of now(), past
-- or future (the cap of the command's --delay): a date far outside (year 99999, 4713 BC) is a mistake,
-- and would make the queue's lag absurd.  (The schema's jobs_run_at_range, 1900 to 9999, is the wider,
-- fixed bound of rows written by hand.)  NULL when the job keeps the rule, else why, naming the values
-- by the names given (the caller's element: run_ats[3], "run_at").  An SQL function without SET, so
-- that the planner inlines it into its callers, which pin search_path; the names go into the text
-- only when it breaks the rule.
CREATE OR REPLACE FUNCTION pgjobq.enqueue_when_why(run_at timestamptz, delay interval,
                                                   run_at_name text DEFAULT 'run_at',
                                                   delay_name text DEFAULT 'delay')
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE
             WHEN delay < interval '0'
               THEN format('%s is %s: a delay must not be negative', delay_name, delay)
             WHEN run_at IS NOT NULL AND delay IS NOT NULL
               THEN format('%s and %s are both given: give run_at or delay, not both', run_at_name,
                           delay_name)
             WHEN run_at NOT BETWEEN now() - interval '100 years' AND now() + interval '100 years'
               THEN format('%s is %s: run_at must be within 100 years of now', run_at_name, run_at)
             -- (A delay far beyond the bound is refused before now() + it could overflow.)
             WHEN CASE WHEN delay > interval '200 years' THEN true
                       ELSE now() + delay > now() + interval '100 years' END
               THEN format('%s is %s: a delay is at most 100 years', delay_name, delay)
           END
$$;

-- enqueue_when_check(run_ats, delays, ords): raises invalid_parameter_value for the first element
-- (in order) that breaks enqueue_when_why's rule, named run_ats[i] or delays[i]: i its position, or
-- ords[i] when given (the C library's COPY checks the distinct run_at texts of a batch, and names
-- each by its first job).  Returns quietly when none does.
CREATE OR REPLACE FUNCTION pgjobq.enqueue_when_check(run_ats timestamptz[], delays interval[],
                                                     ords integer[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_why text;
BEGIN
    SELECT w.why INTO v_why
      FROM unnest(run_ats, delays, ords) WITH ORDINALITY AS u(r, d, k, o)
     CROSS JOIN LATERAL (SELECT pgjobq.enqueue_when_why(u.r, u.d, format('run_ats[%s]', coalesce(u.k, u.o)),
                                                       format('delays[%s]', coalesce(u.k, u.o))) AS why) w
     WHERE w.why IS NOT NULL
     ORDER BY u.o LIMIT 1;
    IF v_why IS NOT NULL THEN
        RAISE EXCEPTION 'pgjobq.enqueue: %', v_why USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;

-- enqueue_expiry_why(run_at, expires_at, expire_after, expires_at_name, expire_after_name): when a job
-- may stop waiting (docs/queues.md, "Expiry").  expires_at or expire_after, not both; expire_after from
-- 1 second to 365 days (counted from the job's run_at, as a queue's default is); expires_at later than
-- the job's run_at (a job that expires before it is due could never start: a mistake, refused rather
-- than swept).  NULL when the job keeps the rule, else why, naming the values as given.
CREATE OR REPLACE FUNCTION pgjobq.enqueue_expiry_why(run_at timestamptz, expires_at timestamptz, expire_after interval,
                                                     expires_at_name text DEFAULT 'expires_at',
                                                     expire_after_name text DEFAULT 'expire_after')
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE
             WHEN expires_at IS NOT NULL AND expire_after IS NOT NULL
               THEN format('%s and %s are both given: give expires_at or expire_after, not both', expires_at_name,
                           expire_after_name)
             WHEN NOT (expire_after BETWEEN interval '1 second' AND interval '365 days')
               THEN format('%s is %s: an expire_after is from 1 second to 365 days', expire_after_name, expire_after)
             WHEN expires_at <= run_at
               THEN format('%s is %s, not after the job''s run_at (%s): the job could never start', expires_at_name,
                           expires_at, run_at)
           END
$$;

-- enqueue_expiry_check(run_ats, delays, expires_ats, expire_afters): raises invalid_parameter_value
-- for the first job (in order) that breaks enqueue_expiry_why's rule, named expires_ats[i] or
-- expire_afters[i].  Returns quietly when none does.  (run_ats and delays have passed
-- enqueue_when_check.)
CREATE OR REPLACE FUNCTION pgjobq.enqueue_expiry_check(run_ats timestamptz[], delays interval[],
                                                       expires_ats timestamptz[], expire_afters interval[])
RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_why text;
BEGIN
    SELECT w.why INTO v_why
      FROM unnest(run_ats, delays, expires_ats, expire_afters) WITH ORDINALITY AS u(r, d, x, a, o)
     CROSS JOIN LATERAL (SELECT pgjobq.enqueue_expiry_why(coalesce(u.r, now() + coalesce(u.d, interval '0')), u.x,
                                                         u.a, format('expires_ats[%s]', u.o),
                                                         format('expire_afters[%s]', u.o)) AS why) w
     WHERE w.why IS NOT NULL
     ORDER BY u.o LIMIT 1;
    IF v_why IS NOT NULL THEN
        RAISE EXCEPTION 'pgjobq.enqueue: %', v_why USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;

-- expiry_defaults(): whether any queue has a default expire_after (queue_set), asked once per
-- enqueue statement so that the enqueues of an install that sets none look no queue up (SECURITY
-- DEFINER: the C library asks it before a COPY, as a producer that may not read pgjobq.queues).
-- PL/pgSQL, so that its statement is planned once per session: an SQL function that is not inlined
-- (SECURITY DEFINER) is planned again at every call, which was a plan per enqueue statement.
CREATE OR REPLACE FUNCTION pgjobq.expiry_defaults() RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM pgjobq.queues q WHERE q.expire_after IS NOT NULL);
END
$$;

-- queue_expire_after(queue): the queue's default expire_after (NULL: none), for expiry_of.  PL/pgSQL:
-- its statement is planned once per session.
CREATE OR REPLACE FUNCTION pgjobq.queue_expire_after(queue text) RETURNS interval
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT q.expire_after FROM pgjobq.queues q WHERE q.name = queue_expire_after.queue);
END
$$;

-- expiry_of(queue, run_at, expires_at, expire_after, defaults): a new job's expires_at: the one given,
-- else its run_at + the expire_after given, else + its queue's default when `defaults` (expiry_defaults()
-- said a queue has one), else NULL.  An SQL function without SET or subquery, inlined into the
-- enqueues' inserts (a subquery in it kept it from being inlined: its body was planned at every
-- enqueue); the queue is looked up only when `defaults`.
CREATE OR REPLACE FUNCTION pgjobq.expiry_of(queue text, run_at timestamptz, expires_at timestamptz,
                                            expire_after interval, defaults boolean)
RETURNS timestamptz
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN $3 IS NOT NULL THEN $3
                WHEN $4 IS NOT NULL THEN $2 + $4
                WHEN $5 THEN $2 + pgjobq.queue_expire_after($1)
           END
$$;

-- traceparent_why(traceparent, name): whether a job's trace context (docs/queues.md, "Trace context") is a
-- W3C traceparent of version 00, as the domain pgjobq.traceparent (migration 29), the one judge of the
-- format, says: NULL when it is (or is NULL), else why, naming the value by the name given.  Asked
-- where a value must be named before it is stored (a graph's job, enqueue_explain after a batch's
-- insert was refused); the insert itself is judged by the domain.  (PL/pgSQL: the cast is tried, as
-- timestamp_ok does; pg_input_is_valid arrives in 16.)
CREATE OR REPLACE FUNCTION pgjobq.traceparent_why(traceparent text, name text DEFAULT 'traceparent')
RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM traceparent::pgjobq.traceparent;
    RETURN NULL;
EXCEPTION WHEN check_violation THEN
    RETURN format('%s "%s" is not a W3C traceparent: 00-<trace id: 32 lowercase hex digits, not all zero>-'
                  '<parent id: 16 lowercase hex digits, not all zero>-<flags: 2 lowercase hex digits>', name,
                  left(traceparent, 80));
END
$$;

-- enqueue_unique_key_why(unique_key, in_graph): a unique key goes only with a job enqueued alone or by
-- enqueue_many, not with parents or tags, nor in a graph (which is how those are enqueued): a key held
-- by another job skips the job that asks for it, and a graph is written all or none.  NULL when the
-- job keeps the rule, else why.
CREATE OR REPLACE FUNCTION pgjobq.enqueue_unique_key_why(unique_key text, in_graph boolean)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN unique_key IS NOT NULL AND in_graph
                THEN 'a job with parents or tags, or in a graph, cannot have a unique key' END
$$;

-- enqueue_explain(...): raises an error naming the first element of enqueue_many's arrays that breaks
-- a rule, and what the rule is; returns quietly when it finds none.  Called only after a check
-- violation, so that a bad argument through the SQL API reads "queues[2] ..." rather than a domain's
-- constraint name and a page of CONTEXT.
CREATE OR REPLACE FUNCTION pgjobq.enqueue_explain(queues text[], kinds text[], payloads jsonb[], priorities smallint[],
                                       max_attempts integer[], unique_keys text[], concurrency_keys text[],
                                       route_keys text[], traceparents text[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v  text;
    nm text;
    i  integer;
BEGIN
    FOR i IN 1 .. coalesce(cardinality(queues), 0) LOOP
        v := queues[i];
        IF v IS NOT NULL AND NOT (length(v) BETWEEN 1 AND 64 AND v ~ '^[A-Za-z][A-Za-z0-9_.:-]*$') THEN
            RAISE EXCEPTION 'pgjobq.enqueue: queues[%] "%" is not a queue name: a letter, then letters, digits, _ . : or -, 64 at most',
                i, left(v, 80) USING ERRCODE = 'check_violation';
        END IF;
    END LOOP;
    FOR i IN 1 .. coalesce(cardinality(kinds), 0) LOOP
        v := kinds[i];
        IF v IS NOT NULL AND NOT (length(v) BETWEEN 1 AND 64 AND v ~ '^[A-Za-z][A-Za-z0-9_.:-]*$') THEN
            RAISE EXCEPTION 'pgjobq.enqueue: kinds[%] "%" is not a kind name: a letter, then letters, digits, _ . : or -, 64 at most',
                i, left(v, 80) USING ERRCODE = 'check_violation';
        END IF;
    END LOOP;
    FOR i IN 1 .. coalesce(cardinality(payloads), 0) LOOP
        IF octet_length(payloads[i]::text) > 1048576 THEN
            RAISE EXCEPTION 'pgjobq.enqueue: payloads[%] is % bytes; a payload is at most 1 MiB', i,
                octet_length(payloads[i]::text) USING ERRCODE = 'check_violation';
        END IF;
    END LOOP;
    FOR i IN 1 .. coalesce(cardinality(priorities), 0) LOOP
        IF priorities[i] NOT BETWEEN -100 AND 100 THEN
            RAISE EXCEPTION 'pgjobq.enqueue: priorities[%] is %; a priority is between -100 and 100', i, priorities[i]
                USING ERRCODE = 'check_violation';
        END IF;
    END LOOP;
    FOR i IN 1 .. coalesce(cardinality(max_attempts), 0) LOOP
        IF max_attempts[i] NOT BETWEEN 1 AND 1000 THEN
            RAISE EXCEPTION 'pgjobq.enqueue: max_attempts[%] is %; it is between 1 and 1000', i, max_attempts[i]
                USING ERRCODE = 'check_violation';
        END IF;
    END LOOP;
    FOREACH nm IN ARRAY ARRAY['unique_keys', 'concurrency_keys', 'route_keys'] LOOP
        FOR i IN 1 .. coalesce(cardinality(CASE nm WHEN 'unique_keys' THEN unique_keys
                                                   WHEN 'concurrency_keys' THEN concurrency_keys
                                                   ELSE route_keys END), 0) LOOP
            v := (CASE nm WHEN 'unique_keys' THEN unique_keys WHEN 'concurrency_keys' THEN concurrency_keys
                          ELSE route_keys END)[i];
            IF v IS NOT NULL AND length(v) NOT BETWEEN 1 AND 255 THEN
                RAISE EXCEPTION 'pgjobq.enqueue: %[%] has % characters; a key has 1 to 255', nm, i, length(v)
                    USING ERRCODE = 'check_violation';
            END IF;
        END LOOP;
    END LOOP;
    FOR i IN 1 .. coalesce(cardinality(traceparents), 0) LOOP
        v := pgjobq.traceparent_why(traceparents[i], format('traceparents[%s]', i));
        IF v IS NOT NULL THEN
            RAISE EXCEPTION 'pgjobq.enqueue: %', v USING ERRCODE = 'check_violation';
        END IF;
    END LOOP;
END
$$;

-- enqueue_many: insert a batch of jobs in one statement; all or none.
--
-- The arrays are parallel, one element per job; a NULL element takes the column default (a NULL array
-- means NULL for every job).  A job gets run_at when given, else now() + delay.  A job whose unique_key
-- is already held by a queued or running job of its queue is not inserted: its row comes back with the
-- existing job's id and duplicate = true.  concurrency_keys (NULL: none) are what a queue's
-- key_concurrency limits.  route_keys (NULL: none) are the jobs' routing keys, which place the jobs of
-- a spread queue in a cluster of shards (docs/shards.md; the shard's guard, cluster.sql, checks them).
-- expires_ats, or expire_afters counted from each job's run_at (NULL: the queue's default expire_after,
-- if it has one; enqueue_expiry_why's rule): no attempt of the job starts after it (docs/queues.md,
-- "Expiry").  traceparents (NULL: none) are the jobs' W3C trace contexts, handed to their handlers
-- (docs/queues.md, "Trace context"; the domain pgjobq.traceparent judges them).
-- Returns one row per input element, in input order (ord is 1-based).
-- Sends one NOTIFY per distinct queue that received a job that is due now; with notify => false it
-- sends none, and the caller notifies after its commit (pgjobq.notify, in a transaction of its own): a
-- commit that carries a NOTIFY holds PostgreSQL's notification lock through its WAL flush, so
-- producers that notify commit one at a time (bench/README.md, "NOTIFY and concurrent producers").
-- The C library does so, pipelined in the same round trip, for the statements it runs as their own
-- transactions.
-- An element that breaks a rule of pgjobq.jobs is named with the rule (enqueue_explain), not with a
-- domain's constraint.
CREATE OR REPLACE FUNCTION pgjobq.enqueue_many(
    queues       text[],
    kinds        text[],
    payloads     jsonb[],
    priorities   smallint[]    DEFAULT NULL,
    run_ats      timestamptz[] DEFAULT NULL,
    delays       interval[]    DEFAULT NULL,
    max_attempts integer[]     DEFAULT NULL,
    unique_keys  text[]        DEFAULT NULL,
    concurrency_keys text[]    DEFAULT NULL,
    notify       boolean       DEFAULT true,
    route_keys   text[]        DEFAULT NULL,
    expires_ats  timestamptz[] DEFAULT NULL,
    expire_afters interval[]   DEFAULT NULL,
    traceparents text[]        DEFAULT NULL)
RETURNS TABLE (ord integer, id bigint, duplicate boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Each statement planned once per session (as claim_next's): with the levels' probe below, PL/pgSQL
-- chose a custom plan for the insert and planned it at every call (bench/README.md, "Idle pickup, and
-- statements PL/pgSQL planned at every call").
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    n          integer := greatest(cardinality(queues), cardinality(kinds), cardinality(payloads),
                                   cardinality(priorities), cardinality(run_ats), cardinality(delays),
                                   cardinality(max_attempts), cardinality(unique_keys),
                                   cardinality(concurrency_keys), cardinality(route_keys), cardinality(expires_ats),
                                   cardinality(expire_afters), cardinality(traceparents));
    v_ids      bigint[];
    v_due      text[];
    v_dup_ords integer[];
    v_dup_keys text[];
    v_found    bigint;
    v_levels_known boolean;
    v_seq      regclass := pg_get_serial_sequence('pgjobq.jobs', 'id')::regclass;
    v_expiry_defaults boolean := pgjobq.expiry_defaults();
    i          integer;
BEGIN
    IF n IS NULL OR n = 0 THEN
        RETURN;
    END IF;
    IF (queues IS NOT NULL AND cardinality(queues) <> n)
       OR (kinds IS NOT NULL AND cardinality(kinds) <> n)
       OR (payloads IS NOT NULL AND cardinality(payloads) <> n)
       OR (priorities IS NOT NULL AND cardinality(priorities) <> n)
       OR (run_ats IS NOT NULL AND cardinality(run_ats) <> n)
       OR (delays IS NOT NULL AND cardinality(delays) <> n)
       OR (max_attempts IS NOT NULL AND cardinality(max_attempts) <> n)
       OR (unique_keys IS NOT NULL AND cardinality(unique_keys) <> n)
       OR (concurrency_keys IS NOT NULL AND cardinality(concurrency_keys) <> n)
       OR (route_keys IS NOT NULL AND cardinality(route_keys) <> n)
       OR (expires_ats IS NOT NULL AND cardinality(expires_ats) <> n)
       OR (expire_afters IS NOT NULL AND cardinality(expire_afters) <> n)
       OR (traceparents IS NOT NULL AND cardinality(traceparents) <> n) THEN
        RAISE EXCEPTION 'pgjobq.enqueue_many: the arrays must all have % elements', n
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- When each job may be due (enqueue_when_check): only when a run_at or a delay is given.
    IF run_ats IS NOT NULL OR delays IS NOT NULL THEN
        PERFORM pgjobq.enqueue_when_check(run_ats, delays);
    END IF;
    -- When each may expire (enqueue_expiry_check): only when an expiry is given.
    IF expires_ats IS NOT NULL OR expire_afters IS NOT NULL THEN
        PERFORM pgjobq.enqueue_expiry_check(run_ats, delays, expires_ats, expire_afters);
    END IF;

    -- This transaction's id before the rows' ready_at (their claim key) is read: see claim.sql.
    PERFORM pg_current_xact_id();

    -- Ids are drawn before the insert so that every input row knows its id, inserted or not.
    -- unnest() of several arrays walks them together (subscripting a text array is linear in the
    -- subscript, which would make a large batch quadratic).
    BEGIN
        WITH input AS MATERIALIZED (
            SELECT nextval(v_seq) AS id, u.ord::integer AS ord,
                   coalesce(u.queue, 'default') AS queue,
                   coalesce(u.kind, 'default') AS kind,
                   coalesce(u.payload, '{}'::jsonb) AS payload,
                   coalesce(u.priority, 0::smallint) AS priority,
                   coalesce(u.run_at, now() + coalesce(u.delay, interval '0')) AS run_at,
                   coalesce(u.max_attempts, 25) AS max_attempts,
                   u.unique_key, u.concurrency_key, u.route_key, u.expires_at, u.expire_after, u.traceparent
              FROM unnest(queues, kinds, payloads, priorities, run_ats, delays, max_attempts, unique_keys,
                          concurrency_keys, route_keys, expires_ats, expire_afters, traceparents)
                   WITH ORDINALITY AS u(queue, kind, payload, priority, run_at, delay, max_attempts, unique_key,
                                        concurrency_key, route_key, expires_at, expire_after, traceparent, ord)),
        -- The conflict's arbiter is named: the unique-key index, which holds only jobs that have a key.
        -- A bare ON CONFLICT probed every unique index for every row, the primary key included, where
        -- nothing can conflict (the ids are the sequence's): batches of 100 without keys go in 17%
        -- faster this way (bench/README.md, "What an enqueue costs").
        ins AS (
            INSERT INTO pgjobq.jobs (id, queue, kind, payload, priority, run_at, max_attempts, unique_key,
                                     concurrency_key, route_key, expires_at, traceparent)
            OVERRIDING SYSTEM VALUE
            SELECT input.id, input.queue, input.kind, input.payload, input.priority, input.run_at,
                   input.max_attempts, input.unique_key, input.concurrency_key, input.route_key,
                   pgjobq.expiry_of(input.queue, input.run_at, input.expires_at, input.expire_after, v_expiry_defaults),
                   input.traceparent
              FROM input ORDER BY input.ord
            ON CONFLICT (queue, unique_key) WHERE unique_key IS NOT NULL
            DO NOTHING
            RETURNING pgjobq.jobs.id, pgjobq.jobs.queue::text AS queue, pgjobq.jobs.run_at)
        SELECT array_agg(CASE WHEN ins.id IS NULL THEN 0 ELSE input.id END ORDER BY input.ord),
               array_agg(DISTINCT ins.queue) FILTER (WHERE ins.run_at <= now()),
               array_agg(input.ord ORDER BY input.ord) FILTER (WHERE ins.id IS NULL),
               array_agg(input.unique_key ORDER BY input.ord) FILTER (WHERE ins.id IS NULL),
               (SELECT bool_and(EXISTS (SELECT 1 FROM pgjobq.levels l WHERE l.queue = d.queue AND l.priority = d.priority))
                  FROM (SELECT DISTINCT i.queue, i.priority FROM input i) d)
          INTO v_ids, v_due, v_dup_ords, v_dup_keys, v_levels_known
          FROM input LEFT JOIN ins ON ins.id = input.id;
    EXCEPTION WHEN check_violation THEN
        -- Name the argument and the rule rather than the domain.  (The block costs a subtransaction per
        -- call, small beside the commit; the scan of the arrays runs only on this path.)
        PERFORM pgjobq.enqueue_explain(queues, kinds, payloads, priorities, max_attempts, unique_keys,
                                       concurrency_keys, route_keys, traceparents);
        RAISE;
    END;

    IF enqueue_many.notify THEN
        PERFORM pgjobq.notify(v_due);
    END IF;
    -- Record the batch's levels (queue, priority) unless every one is recorded already, as each is
    -- after a queue's first jobs at a priority: the insert's statement looked.  (A level seen there
    -- may be reclaimed before this commits, if its queue had no job for an hour: levels_reclaim in
    -- maintenance.sql.  Then the claims find the job's level by themselves within a second.)
    IF v_levels_known IS NOT TRUE THEN
        PERFORM pgjobq.levels_record(coalesce(queues, array_fill('default'::text, ARRAY[n])), priorities);
    END IF;

    RETURN QUERY SELECT t.o::integer, t.job_id, false
                   FROM unnest(v_ids) WITH ORDINALITY AS t(job_id, o) WHERE t.job_id <> 0;

    -- Rows that hit a unique key: find the job holding the key.  This is a new statement, so it sees
    -- jobs committed after the insert began and jobs inserted earlier in this very batch.  If the holder
    -- finished in between, the key is free again and the job is inserted after all.
    IF v_dup_ords IS NOT NULL THEN
        FOR i IN 1 .. cardinality(v_dup_ords) LOOP
            LOOP
                SELECT j.id INTO v_found FROM pgjobq.jobs j
                 WHERE j.unique_key = v_dup_keys[i] AND j.queue = coalesce(queues[v_dup_ords[i]], 'default')
                   AND j.state IN ('queued', 'running');
                IF FOUND THEN
                    ord := v_dup_ords[i]; id := v_found; duplicate := true;
                    RETURN NEXT;
                    EXIT;
                END IF;
                INSERT INTO pgjobq.jobs (queue, kind, payload, priority, run_at, max_attempts, unique_key,
                                         concurrency_key, route_key, expires_at, traceparent)
                SELECT r.queue, coalesce(kinds[v_dup_ords[i]], 'default'), coalesce(payloads[v_dup_ords[i]], '{}'::jsonb),
                       coalesce(priorities[v_dup_ords[i]], 0::smallint), r.run_at,
                       coalesce(max_attempts[v_dup_ords[i]], 25), v_dup_keys[i],
                       concurrency_keys[v_dup_ords[i]], route_keys[v_dup_ords[i]],
                       pgjobq.expiry_of(r.queue, r.run_at, expires_ats[v_dup_ords[i]], expire_afters[v_dup_ords[i]],
                                        v_expiry_defaults),
                       traceparents[v_dup_ords[i]]
                  FROM (SELECT coalesce(queues[v_dup_ords[i]], 'default') AS queue,
                               coalesce(run_ats[v_dup_ords[i]], now() + coalesce(delays[v_dup_ords[i]], interval '0'))
                                 AS run_at) r
                ON CONFLICT DO NOTHING
                RETURNING pgjobq.jobs.id INTO v_found;
                IF FOUND THEN
                    ord := v_dup_ords[i]; id := v_found; duplicate := false;
                    RETURN NEXT;
                    IF enqueue_many.notify THEN
                        PERFORM pgjobq.notify(ARRAY[coalesce(queues[v_dup_ords[i]], 'default')]);
                    END IF;
                    EXIT;
                END IF;
            END LOOP;
        END LOOP;
    END IF;
END
$$;

-- enqueue_keyed: enqueue_many for jobs whose unique key says what to do when it is held (docs/queues.md,
-- "Debounce and throttle"): the same arrays, and per job
--   on_conflicts  'skip' (NULL, the default: enqueue_many's rule: while a queued or running job of the
--                 queue holds the key, the job is not inserted and the holder is returned),
--                 'replace' (a debounce, Graphile Worker's job_key_mode 'replace'): a *queued* holder
--                 takes this job's kind, payload, priority, run_at, max_attempts, concurrency key, expiry
--                 and trace context,
--                 and starts afresh (attempt 0, no last error): the last one wins, and runs at its
--                 run_at, typically now() + delay, so after a quiet delay.  A *running* holder is not
--                 touched (its worker may have read its payload, and a write would wait for its row):
--                 the job is not inserted, and the running job is returned, as by 'skip';
--                 'keep' (a throttle, pg-boss's sendThrottled): the key is held for unique_fors[i]
--                 from the enqueue that took it, whatever became of that job (queued, running, or
--                 finished since): within that window the job is not inserted and the job that took
--                 the key is returned; after it, as 'skip'.  The window needs keep, and keep a window
--                 (1 second to 365 days); NULL mode with a window is keep.
-- Returns one row per job, in input order: its ord, the job's id (the new one, the replaced one, or the
-- holder), and outcome 'inserted', 'replaced' or 'duplicate'.  A mode or a window without a unique key
-- is refused (22023), as is a bad mode; the rest is enqueue_many's (rules, levels, notifications).
--
-- How it holds under racing producers: jobs are taken one at a time, each in the order
--   1. 'replace': UPDATE the queued holder (the row lock orders racing replacers: each waits for the
--      one before to commit, and sees its version: the last to commit wins);
--   2. INSERT ... ON CONFLICT DO NOTHING: the unique index orders racing inserters (the second waits
--      for the first, then finds the key held);
--   3. held: read the holder in a new statement (it sees what committed meanwhile).  A queued holder
--      and 'replace': back to 1; a holder that finished meanwhile: back to 2; else 'duplicate'.
--   With a window, the window is taken after the insert: INSERT INTO unique_holds ... ON CONFLICT DO
--   UPDATE WHERE the window has passed (the primary key orders racing takers); when it has not, the
--   job just inserted is deleted again (it never committed) and the window's job is returned.
-- So 16 producers replacing one key leave one queued job with the payload of the last to commit
-- (tests/test_unique.c).  The jobs without a mode and a window are inserted as enqueue_many would,
-- one at a time: this is not the path of plain enqueues, whose cost it leaves as it was.
CREATE OR REPLACE FUNCTION pgjobq.enqueue_keyed(
    queues       text[],
    kinds        text[],
    payloads     jsonb[],
    priorities   smallint[]    DEFAULT NULL,
    run_ats      timestamptz[] DEFAULT NULL,
    delays       interval[]    DEFAULT NULL,
    max_attempts integer[]     DEFAULT NULL,
    unique_keys  text[]        DEFAULT NULL,
    on_conflicts text[]        DEFAULT NULL,
    unique_fors  interval[]    DEFAULT NULL,
    concurrency_keys text[]    DEFAULT NULL,
    notify       boolean       DEFAULT true,
    route_keys   text[]        DEFAULT NULL,
    expires_ats  timestamptz[] DEFAULT NULL,
    expire_afters interval[]   DEFAULT NULL,
    traceparents text[]        DEFAULT NULL)
RETURNS TABLE (ord integer, id bigint, outcome text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    n        integer := greatest(cardinality(queues), cardinality(kinds), cardinality(payloads),
                                 cardinality(priorities), cardinality(run_ats), cardinality(delays),
                                 cardinality(max_attempts), cardinality(unique_keys), cardinality(on_conflicts),
                                 cardinality(unique_fors), cardinality(concurrency_keys), cardinality(route_keys),
                                 cardinality(expires_ats), cardinality(expire_afters), cardinality(traceparents));
    v_seq    regclass := pg_get_serial_sequence('pgjobq.jobs', 'id')::regclass;
    v_ids    bigint[] := '{}';
    v_outs   text[] := '{}';
    v_lq     text[] := '{}';
    v_lp     smallint[] := '{}';
    v_due    text[] := '{}';
    v_queue  text;
    v_key    text;
    v_mode   text;
    v_for    interval;
    v_prio   smallint;
    v_run_at timestamptz;
    v_expiry_defaults boolean := pgjobq.expiry_defaults();
    v_expires timestamptz;
    v_id     bigint;
    v_found  bigint;
    v_state  pgjobq.job_state;
    v_out    text;
    i        integer;
BEGIN
    IF n IS NULL OR n = 0 THEN
        RETURN;
    END IF;
    IF (queues IS NOT NULL AND cardinality(queues) <> n)
       OR (kinds IS NOT NULL AND cardinality(kinds) <> n)
       OR (payloads IS NOT NULL AND cardinality(payloads) <> n)
       OR (priorities IS NOT NULL AND cardinality(priorities) <> n)
       OR (run_ats IS NOT NULL AND cardinality(run_ats) <> n)
       OR (delays IS NOT NULL AND cardinality(delays) <> n)
       OR (max_attempts IS NOT NULL AND cardinality(max_attempts) <> n)
       OR (unique_keys IS NOT NULL AND cardinality(unique_keys) <> n)
       OR (on_conflicts IS NOT NULL AND cardinality(on_conflicts) <> n)
       OR (unique_fors IS NOT NULL AND cardinality(unique_fors) <> n)
       OR (concurrency_keys IS NOT NULL AND cardinality(concurrency_keys) <> n)
       OR (route_keys IS NOT NULL AND cardinality(route_keys) <> n)
       OR (expires_ats IS NOT NULL AND cardinality(expires_ats) <> n)
       OR (expire_afters IS NOT NULL AND cardinality(expire_afters) <> n)
       OR (traceparents IS NOT NULL AND cardinality(traceparents) <> n) THEN
        RAISE EXCEPTION 'pgjobq.enqueue_keyed: the arrays must all have % elements', n
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF run_ats IS NOT NULL OR delays IS NOT NULL THEN
        PERFORM pgjobq.enqueue_when_check(run_ats, delays);
    END IF;
    IF expires_ats IS NOT NULL OR expire_afters IS NOT NULL THEN
        PERFORM pgjobq.enqueue_expiry_check(run_ats, delays, expires_ats, expire_afters);
    END IF;
    -- The modes' rules, the first element that breaks one named.
    FOR i IN 1 .. n LOOP
        v_mode := on_conflicts[i];
        v_for := unique_fors[i];
        IF v_mode IS NOT NULL AND v_mode NOT IN ('skip', 'replace', 'keep') THEN
            RAISE EXCEPTION 'pgjobq.enqueue: on_conflicts[%] is "%": skip, replace or keep', i, left(v_mode, 40)
                USING ERRCODE = 'invalid_parameter_value';
        ELSIF (v_mode IS NOT NULL OR v_for IS NOT NULL) AND unique_keys[i] IS NULL THEN
            RAISE EXCEPTION 'pgjobq.enqueue: %[%] goes with a unique key, and unique_keys[%] is null',
                CASE WHEN v_mode IS NOT NULL THEN 'on_conflicts' ELSE 'unique_fors' END, i, i
                USING ERRCODE = 'invalid_parameter_value';
        ELSIF v_for IS NOT NULL AND NOT (v_for BETWEEN interval '1 second' AND interval '365 days') THEN
            RAISE EXCEPTION 'pgjobq.enqueue: unique_fors[%] is %: a window is from 1 second to 365 days', i, v_for
                USING ERRCODE = 'invalid_parameter_value';
        ELSIF v_for IS NOT NULL AND v_mode IN ('skip', 'replace') THEN
            RAISE EXCEPTION 'pgjobq.enqueue: unique_fors[%] is a window, which is keep''s (on_conflicts[%] is %)', i, i,
                v_mode
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'skip holds a key while its job is queued or running; replace pushes the queued job''s run_at.';
        ELSIF v_mode = 'keep' AND v_for IS NULL THEN
            RAISE EXCEPTION 'pgjobq.enqueue: on_conflicts[%] is keep, which holds the key for a window: give unique_fors[%]',
                i, i USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;

    -- This transaction's id before any row's ready_at (its claim key) is read: see claim.sql.
    PERFORM pg_current_xact_id();
    BEGIN
        FOR i IN 1 .. n LOOP
            v_queue := coalesce(queues[i], 'default');
            v_key := unique_keys[i];
            v_for := unique_fors[i];
            v_mode := CASE WHEN v_for IS NOT NULL THEN 'keep' ELSE coalesce(on_conflicts[i], 'skip') END;
            v_prio := coalesce(priorities[i], 0::smallint);
            v_run_at := coalesce(run_ats[i], now() + coalesce(delays[i], interval '0'));
            v_expires := pgjobq.expiry_of(v_queue, v_run_at, expires_ats[i], expire_afters[i], v_expiry_defaults);
            v_out := NULL;
            -- A window still held: the job that took it, at once (the insert below would be undone).
            IF v_for IS NOT NULL THEN
                SELECT h.job_id INTO v_found FROM pgjobq.unique_holds h
                 WHERE h.queue = v_queue AND h.unique_key = v_key AND h.until > now();
                IF FOUND THEN
                    v_out := 'duplicate';
                END IF;
            END IF;
            WHILE v_out IS NULL LOOP
                IF v_mode = 'replace' THEN
                    UPDATE pgjobq.jobs j
                       SET kind = coalesce(kinds[i], 'default'), payload = coalesce(payloads[i], '{}'::jsonb),
                           priority = v_prio, run_at = v_run_at,
                           max_attempts = coalesce(enqueue_keyed.max_attempts[i], 25),
                           concurrency_key = concurrency_keys[i], attempt = 0, last_error = NULL, snoozes = 0,
                           expires_at = v_expires, traceparent = traceparents[i], ready_at = clock_timestamp(),
                           base_priority = NULL
                     WHERE j.queue = v_queue AND j.unique_key = v_key AND j.state = 'queued'
                    RETURNING j.id INTO v_found;
                    IF FOUND THEN
                        v_out := 'replaced';
                        EXIT;
                    END IF;
                END IF;
                v_id := nextval(v_seq);
                INSERT INTO pgjobq.jobs (id, queue, kind, payload, priority, run_at, max_attempts, unique_key,
                                         concurrency_key, route_key, expires_at, traceparent)
                OVERRIDING SYSTEM VALUE
                VALUES (v_id, v_queue, coalesce(kinds[i], 'default'), coalesce(payloads[i], '{}'::jsonb), v_prio,
                        v_run_at, coalesce(enqueue_keyed.max_attempts[i], 25), v_key, concurrency_keys[i], route_keys[i],
                        v_expires, traceparents[i])
                ON CONFLICT DO NOTHING
                RETURNING pgjobq.jobs.id INTO v_found;
                IF FOUND THEN
                    v_out := 'inserted';
                    IF v_for IS NOT NULL THEN
                        -- Take the window, unless another job took it and it has not passed.
                        INSERT INTO pgjobq.unique_holds AS h (queue, unique_key, job_id, until)
                        VALUES (v_queue, v_key, v_found, now() + v_for)
                        ON CONFLICT ON CONSTRAINT unique_holds_pkey DO UPDATE
                           SET job_id = excluded.job_id, until = excluded.until
                         WHERE h.until <= now()
                        RETURNING h.job_id INTO v_id;
                        IF NOT FOUND THEN
                            DELETE FROM pgjobq.jobs j WHERE j.id = v_found;
                            SELECT h.job_id INTO v_found FROM pgjobq.unique_holds h
                             WHERE h.queue = v_queue AND h.unique_key = v_key;
                            v_out := 'duplicate';
                        END IF;
                    END IF;
                    EXIT;
                END IF;
                -- Held: by which job, now?  (A new statement: it sees what committed meanwhile.)
                SELECT j.id, j.state INTO v_found, v_state FROM pgjobq.jobs j
                 WHERE j.queue = v_queue AND j.unique_key = v_key AND j.state IN ('queued', 'running');
                IF FOUND AND NOT (v_mode = 'replace' AND v_state = 'queued') THEN
                    v_out := 'duplicate';
                END IF;
                -- Else: a queued holder to replace, or a holder that finished meanwhile: again.
            END LOOP;
            v_ids := v_ids || v_found;
            v_outs := v_outs || v_out;
            IF v_out <> 'duplicate' THEN
                v_lq := v_lq || v_queue;
                v_lp := v_lp || v_prio;
                IF v_run_at <= now() THEN
                    v_due := v_due || v_queue;
                END IF;
            END IF;
        END LOOP;
    EXCEPTION WHEN check_violation THEN
        PERFORM pgjobq.enqueue_explain(queues, kinds, payloads, priorities, max_attempts, unique_keys,
                                       concurrency_keys, route_keys, traceparents);
        RAISE;
    END;
    IF cardinality(v_lq) > 0 THEN
        PERFORM pgjobq.levels_record(v_lq, v_lp);
    END IF;
    IF enqueue_keyed.notify AND cardinality(v_due) > 0 THEN
        PERFORM pgjobq.notify(v_due);
    END IF;
    RETURN QUERY SELECT t.o::integer, t.job_id, t.out
                   FROM unnest(v_ids, v_outs) WITH ORDINALITY AS t(job_id, out, o);
END
$$;

-- enqueue: one job.  A thin wrapper over enqueue_many, so both share one INSERT.  A job with `after`
-- (the ids of the jobs it waits for), `tags` or `on_parent_failure` is enqueued as a graph of one job
-- (enqueue_graph, workflows.sql; no unique key then).  route_key: the job's routing key (enqueue_many).
-- on_conflict ('skip', 'replace' or 'keep') and unique_for (keep's window): enqueue_keyed, whose
-- outcome 'replaced' is duplicate = true here too (no job was inserted: the id is the queued job that
-- now carries this one's payload).  expires_at, or expire_after counted from run_at: no attempt of the
-- job starts after it (docs/queues.md, "Expiry"; neither: its queue's default expire_after, if any).
-- traceparent: the caller's W3C trace context, handed to the job's handler (docs/queues.md, "Trace
-- context").
CREATE OR REPLACE FUNCTION pgjobq.enqueue(
    queue        text        DEFAULT 'default',
    kind         text        DEFAULT 'default',
    payload      jsonb       DEFAULT '{}',
    priority     smallint    DEFAULT 0,
    run_at       timestamptz DEFAULT NULL,
    delay        interval    DEFAULT NULL,
    max_attempts integer     DEFAULT 25,
    unique_key   text        DEFAULT NULL,
    concurrency_key text     DEFAULT NULL,
    after        bigint[]    DEFAULT NULL,
    tags         text[]      DEFAULT NULL,
    on_parent_failure text   DEFAULT NULL,
    route_key    text        DEFAULT NULL,
    on_conflict  text        DEFAULT NULL,
    unique_for   interval    DEFAULT NULL,
    expires_at   timestamptz DEFAULT NULL,
    expire_after interval    DEFAULT NULL,
    traceparent  text        DEFAULT NULL,
    OUT id bigint,
    OUT duplicate boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF (on_conflict IS NOT NULL OR unique_for IS NOT NULL) AND after IS NULL AND tags IS NULL
       AND on_parent_failure IS NULL THEN
        SELECT e.id, e.outcome <> 'inserted' INTO id, duplicate
          FROM pgjobq.enqueue_keyed(ARRAY[queue], ARRAY[kind], ARRAY[payload], ARRAY[priority], ARRAY[run_at],
                                    ARRAY[delay], ARRAY[max_attempts], ARRAY[unique_key], ARRAY[on_conflict],
                                    ARRAY[unique_for], ARRAY[concurrency_key], true, ARRAY[route_key],
                                    ARRAY[expires_at], ARRAY[expire_after], ARRAY[traceparent]) AS e;
        RETURN;
    END IF;
    IF on_conflict IS NOT NULL OR unique_for IS NOT NULL THEN
        RAISE EXCEPTION 'pgjobq.enqueue: on_conflict and unique_for go with a unique key, which a job with parents or tags cannot have'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF after IS NULL AND tags IS NULL AND on_parent_failure IS NULL THEN
        SELECT e.id, e.duplicate INTO id, duplicate
          FROM pgjobq.enqueue_many(ARRAY[queue], ARRAY[kind], ARRAY[payload], ARRAY[priority], ARRAY[run_at],
                                   ARRAY[delay], ARRAY[max_attempts], ARRAY[unique_key],
                                   ARRAY[concurrency_key], true, ARRAY[route_key], ARRAY[expires_at],
                                   ARRAY[expire_after], ARRAY[traceparent]) AS e;
        RETURN;
    END IF;
    IF pgjobq.enqueue_unique_key_why(unique_key, true) IS NOT NULL THEN
        RAISE EXCEPTION 'pgjobq.enqueue: %', pgjobq.enqueue_unique_key_why(unique_key, true)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Checked here rather than by enqueue_graph: the times are turned into JSON below, and text of a
    -- time far outside the rule's range (4713 BC) would not read back as the same time.
    PERFORM pgjobq.enqueue_when_check(ARRAY[run_at], ARRAY[delay]);
    -- (The keys left out are those given as NULL; the payload is taken as it is.)
    SELECT g.id INTO id FROM pgjobq.enqueue_graph(jsonb_build_array(
        (SELECT jsonb_object_agg(f.k, f.v) FROM (VALUES
            ('queue', to_jsonb(coalesce(queue, 'default'))), ('kind', to_jsonb(coalesce(kind, 'default'))),
            ('payload', coalesce(payload, '{}')), ('priority', to_jsonb(priority)),
            ('max_attempts', to_jsonb(max_attempts)), ('concurrency_key', to_jsonb(concurrency_key)),
            ('run_at', to_jsonb(to_char(run_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))),
            ('delay', to_jsonb(extract(epoch FROM delay))), ('tags', to_jsonb(tags)), ('after', to_jsonb(after)),
            ('on_parent_failure', to_jsonb(on_parent_failure)), ('route_key', to_jsonb(route_key)),
            ('expires_at', to_jsonb(to_char(expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))),
            ('expire_after', to_jsonb(extract(epoch FROM expire_after))),
            ('traceparent', to_jsonb(traceparent))) AS f(k, v)
          WHERE f.v IS NOT NULL))) AS g;
    duplicate := false;
END
$$;

-- levels_max(): how many levels (queue, priority) may be recorded at once.  Each has a sequence (its
-- frontier) and is visited by every rescue and by the dashboard's counts: 10,000 levels took the
-- rescue from 5.5 to 12 ms a second and monitor_queue_counts from 8 to 40 ms, and 100 MB.  The levels
-- of a queue without jobs are reclaimed (levels_reclaim), so this bounds the queues and priorities
-- with live jobs (or idle for less than an hour): a new level past it is refused (levels_record).
CREATE OR REPLACE FUNCTION pgjobq.levels_max() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 10000 $$;

-- levels_record(queues, priorities, strict): records that these queues have jobs at these priorities
-- (element by element; a NULL priority is 0), so that claims visit those levels (pgjobq.levels;
-- claim.sql).  For the functions that insert jobs (enqueue_many, enqueue_graph, retry, retry_where)
-- and the claim that finds unrecorded ones; no role is granted it (levels_add is what a caller with
-- COPY uses).  A level another transaction is recording at the same time is left to it (an advisory
-- lock tried, not waited for): an enqueue never waits on another one's transaction.  If that one rolls
-- back, the claims find the level by themselves within a second.  Past levels_max() levels a new one
-- is refused (strict: an error, and the enqueue with it; not strict, the claim's: left unrecorded,
-- which the claims then find again each second).
-- (PL/pgSQL rather than SQL: its statement's plan is kept for the session, where an SQL function's
-- body would be planned at every call, a large part of an enqueue.  Kept only with plan_cache_mode =
-- force_generic_plan: left to choose, PL/pgSQL found the custom plan of the INSERT cheaper and
-- planned it again at every call (pg_stat_statements with track_planning: bench/README.md, "Idle
-- pickup, and statements PL/pgSQL planned at every call").)
-- A level recorded gets its frontier, a sequence (pgjobq.levels, migration 10).
CREATE OR REPLACE FUNCTION pgjobq.levels_record(queues text[], priorities smallint[], strict boolean DEFAULT true)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_n   integer;
    v_new integer;
BEGIN
    SELECT count(*) INTO v_new
      FROM (SELECT DISTINCT coalesce(u.queue, 'default') AS queue, coalesce(u.priority, 0::smallint) AS priority
              FROM unnest(levels_record.queues, levels_record.priorities) AS u(queue, priority)) l
     WHERE NOT EXISTS (SELECT 1 FROM pgjobq.levels x WHERE x.queue = l.queue AND x.priority = l.priority);
    IF v_new = 0 THEN
        RETURN;
    END IF;
    IF (SELECT count(*) FROM pgjobq.levels) + v_new > pgjobq.levels_max() THEN
        IF NOT strict THEN
            RETURN;
        END IF;
        RAISE EXCEPTION 'pgjobq: % priority levels (queue, priority) have jobs, the most there may be; this one would add %',
            (SELECT count(*) FROM pgjobq.levels), v_new
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Enqueue into queues and priorities that have jobs: a level is reclaimed an hour after its queue has none. '
                         'Many queues of one job each (a queue per customer) are better one queue with a concurrency key.';
    END IF;
    FOR v_n IN
        INSERT INTO pgjobq.levels (queue, priority)
        SELECT l.queue, l.priority
          FROM (SELECT DISTINCT coalesce(u.queue, 'default') AS queue, coalesce(u.priority, 0::smallint) AS priority
                  FROM unnest(levels_record.queues, levels_record.priorities) AS u(queue, priority)) l
         WHERE CASE WHEN EXISTS (SELECT 1 FROM pgjobq.levels x WHERE x.queue = l.queue AND x.priority = l.priority)
                    THEN false
                    ELSE pg_try_advisory_xact_lock(1885825650, hashtext(l.queue || ':' || l.priority)) END
        ON CONFLICT DO NOTHING
        RETURNING n
    LOOP
        EXECUTE format('CREATE SEQUENCE pgjobq.%I', 'frontier_' || v_n);
        UPDATE pgjobq.levels l SET frontier = format('pgjobq.%I', 'frontier_' || v_n)::regclass WHERE l.n = v_n;
    END LOOP;
END
$$;

-- levels_add(queues, priorities): levels_record for a caller that wrote jobs with COPY (the C
-- library's batches, for a role with INSERT on pgjobq.jobs), which records the levels of its rows.
-- It records only what a caller could have made by enqueueing: each queue name must be one
-- (22023), and each (queue, priority) not yet recorded must have a queued job this caller can see
-- (its own rows, uncommitted, included; 22023 otherwise).  So a producer cannot make levels, and
-- their sequences, without jobs: it reaches them only through what it enqueues (it could call this
-- with any names before: 10 calls of 1,000 names made 10,005 sequences that nothing removed).
CREATE OR REPLACE FUNCTION pgjobq.levels_add(queues text[], priorities smallint[]) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_bad record;
BEGIN
    IF cardinality(queues) IS DISTINCT FROM cardinality(priorities) AND priorities IS NOT NULL THEN
        RAISE EXCEPTION 'pgjobq.levels_add: queues and priorities must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT l.queue, l.priority, l.named INTO v_bad
      FROM (SELECT DISTINCT coalesce(u.queue, 'default') AS queue, coalesce(u.priority, 0::smallint) AS priority,
                   length(coalesce(u.queue, 'default')) BETWEEN 1 AND 64
                   AND coalesce(u.queue, 'default') ~ '^[A-Za-z][A-Za-z0-9_.:-]*$' AS named
              FROM unnest(levels_add.queues, levels_add.priorities) AS u(queue, priority)) l
     WHERE NOT l.named
        OR NOT EXISTS (SELECT 1 FROM pgjobq.levels x WHERE x.queue = l.queue AND x.priority = l.priority)
           AND NOT EXISTS (SELECT 1 FROM pgjobq.jobs j WHERE j.state = 'queued' AND j.queue = l.queue
                                                          AND j.priority = l.priority)
     ORDER BY l.named LIMIT 1;
    IF FOUND AND NOT v_bad.named THEN
        RAISE EXCEPTION 'pgjobq.levels_add: "%" is not a queue name: a letter, then letters, digits, _ . : or -, 64 at most',
            left(v_bad.queue, 80) USING ERRCODE = 'invalid_parameter_value';
    ELSIF FOUND THEN
        RAISE EXCEPTION 'pgjobq.levels_add: queue % has no queued job at priority %', v_bad.queue, v_bad.priority
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A level is recorded for the jobs at it: enqueue records its own; levels_add, those written with COPY.';
    END IF;
    PERFORM pgjobq.levels_record(queues, priorities, true);
END
$$;

-- reserve_ids(n): n new job ids from the jobs' sequence, for a producer that writes a batch of jobs
-- with COPY (pgjobq_enqueue_many), so that every id still comes from the sequence and the caller
-- learns the ids of its jobs.  Ids reserved by a batch that then fails are simply never used.
CREATE OR REPLACE FUNCTION pgjobq.reserve_ids(n integer) RETURNS bigint[]
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- The sequence is looked up once (a materialized CTE: a subquery is flattened, and then
    -- pg_get_serial_sequence() ran for every id, most of what an id cost: bench/README.md, "What each
    -- lever did").
    WITH s AS MATERIALIZED (SELECT pg_get_serial_sequence('pgjobq.jobs', 'id')::regclass AS seq)
    SELECT ARRAY(SELECT nextval(s.seq) FROM s, generate_series(1, least(greatest($1, 0), 1000000)))
$$;
