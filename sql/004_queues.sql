-- pgjobq schema version 4: queue settings, enforced inside the claim.
--
--   pgjobq.queues    one row per queue that has settings; a queue without a row behaves as before.
--                    paused_at: the claim returns nothing (workers keep the leases they hold);
--                    concurrency: at most N jobs of the queue running under a valid lease, across
--                    every worker; rate_limit / rate_period: at most N jobs started in any window of
--                    that length.
--
-- A claim from a queue with a limit first locks the queue's row (FOR UPDATE), so that limited claims
-- of one queue run one at a time, and then counts, in a new snapshot, what the limit is about: the
-- running jobs whose lease has not expired, or the starts still inside the rate window.  Counting in
-- the claim's own snapshot instead lets two claims that start together both see a free slot (the
-- race PgQueuer #761 describes); a separate counter drifts when a worker dies (Solid Queue #546).
-- The count is derived from the job rows themselves, so an expired lease frees its slot at once,
-- without waiting for the rescuer.  Claims from queues without limits take no lock and read the
-- settings row only (one primary-key probe).
--
-- The rate window is exact: the queue's row keeps the start times of the jobs started inside the
-- last rate_period (at most rate_limit of them), so "100 per minute" never lets 200 start within a
-- minute across a boundary, as a token bucket of capacity 100 would.

CREATE TABLE pgjobq.queues (
    name          pgjobq.identifier PRIMARY KEY,
    paused_at     timestamptz,
    pause_reason  text,
    concurrency   integer,
    key_concurrency integer,
    rate_limit    integer,
    rate_period   interval,
    recent_starts timestamptz[]     NOT NULL DEFAULT '{}',
    updated_at    timestamptz       NOT NULL DEFAULT now(),
    CONSTRAINT queues_concurrency_range CHECK (concurrency BETWEEN 1 AND 1000000),
    CONSTRAINT queues_key_concurrency_range CHECK (key_concurrency BETWEEN 1 AND 1000000),
    CONSTRAINT queues_rate_range CHECK (rate_limit BETWEEN 1 AND 10000),
    CONSTRAINT queues_rate_period_range CHECK (rate_period >= interval '1 millisecond'
                                               AND rate_period <= interval '1 day'),
    CONSTRAINT queues_rate_complete CHECK ((rate_limit IS NULL) = (rate_period IS NULL)),
    CONSTRAINT queues_pause_reason_length CHECK (octet_length(pause_reason) <= 1024),
    CONSTRAINT queues_reason_only_when_paused CHECK (pause_reason IS NULL OR paused_at IS NOT NULL)
);

-- A job may carry a concurrency key (a customer, a tenant, an API account): with the queue's
-- key_concurrency set, at most that many jobs of one key run at once.  The key lives while the job
-- does (the history does not keep it).  Claims under a key limit walk the distinct keys of the queued
-- jobs through this index (one probe per key), so that a busy key never holds back the others.
ALTER TABLE pgjobq.jobs ADD COLUMN concurrency_key pgjobq.short_text;
CREATE INDEX jobs_key_idx ON pgjobq.jobs (queue, concurrency_key, priority, run_at, id)
    WHERE state = 'queued' AND concurrency_key IS NOT NULL;

-- Unique keys are scoped to their queue (they were global): the same key in two queues names two jobs.
DROP INDEX pgjobq.jobs_unique_key_idx;
CREATE UNIQUE INDEX jobs_unique_key_idx ON pgjobq.jobs (queue, unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('queued', 'running');

-- enqueue_explain(...): raises an error naming the first element of enqueue_many's arrays that breaks
-- a rule, and what the rule is; returns quietly when it finds none.  Called only after a check
-- violation, so that a bad argument through the SQL API reads "queues[2] ..." rather than a domain's
-- constraint name and a page of CONTEXT.
CREATE FUNCTION pgjobq.enqueue_explain(queues text[], kinds text[], payloads jsonb[], priorities smallint[],
                                       max_attempts integer[], unique_keys text[], concurrency_keys text[])
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
    FOREACH nm IN ARRAY ARRAY['unique_keys', 'concurrency_keys'] LOOP
        FOR i IN 1 .. coalesce(cardinality(CASE nm WHEN 'unique_keys' THEN unique_keys ELSE concurrency_keys END), 0) LOOP
            v := (CASE nm WHEN 'unique_keys' THEN unique_keys ELSE concurrency_keys END)[i];
            IF v IS NOT NULL AND length(v) NOT BETWEEN 1 AND 255 THEN
                RAISE EXCEPTION 'pgjobq.enqueue: %[%] has % characters; a key has 1 to 255', nm, i, length(v)
                    USING ERRCODE = 'check_violation';
            END IF;
        END LOOP;
    END LOOP;
END
$$;

-- enqueue_many and enqueue take the concurrency key too (NULL: none).
DROP FUNCTION pgjobq.enqueue(text, text, jsonb, smallint, timestamptz, interval, integer, text);
DROP FUNCTION pgjobq.enqueue_many(text[], text[], jsonb[], smallint[], timestamptz[], interval[], integer[], text[]);
CREATE FUNCTION pgjobq.enqueue_many(
    queues       text[],
    kinds        text[],
    payloads     jsonb[],
    priorities   smallint[]    DEFAULT NULL,
    run_ats      timestamptz[] DEFAULT NULL,
    delays       interval[]    DEFAULT NULL,
    max_attempts integer[]     DEFAULT NULL,
    unique_keys  text[]        DEFAULT NULL,
    concurrency_keys text[]    DEFAULT NULL)
RETURNS TABLE (ord integer, id bigint, duplicate boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n          integer := greatest(cardinality(queues), cardinality(kinds), cardinality(payloads),
                                   cardinality(priorities), cardinality(run_ats), cardinality(delays),
                                   cardinality(max_attempts), cardinality(unique_keys),
                                   cardinality(concurrency_keys));
    v_ids      bigint[];
    v_due      text[];
    v_dup_ords integer[];
    v_dup_keys text[];
    v_found    bigint;
    v_seq      regclass := pg_get_serial_sequence('pgjobq.jobs', 'id')::regclass;
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
       OR (concurrency_keys IS NOT NULL AND cardinality(concurrency_keys) <> n) THEN
        RAISE EXCEPTION 'pgjobq.enqueue_many: the arrays must all have % elements', n
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(delays) AS d WHERE d < interval '0') THEN
        RAISE EXCEPTION 'pgjobq: delay must not be negative' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(run_ats, delays) AS u(r, d) WHERE r IS NOT NULL AND d IS NOT NULL) THEN
        RAISE EXCEPTION 'pgjobq: give run_at or delay, not both' USING ERRCODE = 'invalid_parameter_value';
    END IF;

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
                   u.unique_key, u.concurrency_key
              FROM unnest(queues, kinds, payloads, priorities, run_ats, delays, max_attempts, unique_keys,
                          concurrency_keys)
                   WITH ORDINALITY AS u(queue, kind, payload, priority, run_at, delay, max_attempts, unique_key,
                                        concurrency_key, ord)),
        ins AS (
            INSERT INTO pgjobq.jobs (id, queue, kind, payload, priority, run_at, max_attempts, unique_key,
                                     concurrency_key)
            OVERRIDING SYSTEM VALUE
            SELECT input.id, input.queue, input.kind, input.payload, input.priority, input.run_at,
                   input.max_attempts, input.unique_key, input.concurrency_key
              FROM input ORDER BY input.ord
            ON CONFLICT DO NOTHING
            RETURNING pgjobq.jobs.id, pgjobq.jobs.queue::text AS queue, pgjobq.jobs.run_at)
        SELECT array_agg(CASE WHEN ins.id IS NULL THEN 0 ELSE input.id END ORDER BY input.ord),
               array_agg(DISTINCT ins.queue) FILTER (WHERE ins.run_at <= now()),
               array_agg(input.ord ORDER BY input.ord) FILTER (WHERE ins.id IS NULL),
               array_agg(input.unique_key ORDER BY input.ord) FILTER (WHERE ins.id IS NULL)
          INTO v_ids, v_due, v_dup_ords, v_dup_keys
          FROM input LEFT JOIN ins ON ins.id = input.id;
    EXCEPTION WHEN check_violation THEN
        -- Name the argument and the rule rather than the domain.  (The block costs a subtransaction per
        -- call, small beside the commit; the scan of the arrays runs only on this path.)
        PERFORM pgjobq.enqueue_explain(queues, kinds, payloads, priorities, max_attempts, unique_keys,
                                       concurrency_keys);
        RAISE;
    END;

    PERFORM pgjobq.notify(v_due);

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
                                         concurrency_key)
                VALUES (coalesce(queues[v_dup_ords[i]], 'default'), coalesce(kinds[v_dup_ords[i]], 'default'),
                        coalesce(payloads[v_dup_ords[i]], '{}'::jsonb),
                        coalesce(priorities[v_dup_ords[i]], 0::smallint),
                        coalesce(run_ats[v_dup_ords[i]], now() + coalesce(delays[v_dup_ords[i]], interval '0')),
                        coalesce(max_attempts[v_dup_ords[i]], 25), v_dup_keys[i],
                        concurrency_keys[v_dup_ords[i]])
                ON CONFLICT DO NOTHING
                RETURNING pgjobq.jobs.id INTO v_found;
                IF FOUND THEN
                    ord := v_dup_ords[i]; id := v_found; duplicate := false;
                    RETURN NEXT;
                    PERFORM pgjobq.notify(ARRAY[coalesce(queues[v_dup_ords[i]], 'default')]);
                    EXIT;
                END IF;
            END LOOP;
        END LOOP;
    END IF;
END
$$;

CREATE FUNCTION pgjobq.enqueue(
    queue        text        DEFAULT 'default',
    kind         text        DEFAULT 'default',
    payload      jsonb       DEFAULT '{}',
    priority     smallint    DEFAULT 0,
    run_at       timestamptz DEFAULT NULL,
    delay        interval    DEFAULT NULL,
    max_attempts integer     DEFAULT 25,
    unique_key   text        DEFAULT NULL,
    concurrency_key text     DEFAULT NULL,
    OUT id bigint,
    OUT duplicate boolean)
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT e.id, e.duplicate
      FROM pgjobq.enqueue_many(ARRAY[$1], ARRAY[$2], ARRAY[$3], ARRAY[$4], ARRAY[$5], ARRAY[$6], ARRAY[$7],
                               ARRAY[$8], ARRAY[$9]) AS e
$$;

-- ------------------------------------------------------------------------------------------------
-- The claim, with the queue's settings

CREATE OR REPLACE FUNCTION pgjobq.claim_batch(
    queue          text,
    max_jobs       integer,
    lease          interval,
    worker_id      text,
    after_priority smallint    DEFAULT NULL,
    after_run_at   timestamptz DEFAULT NULL,
    after_id       bigint      DEFAULT NULL)
RETURNS TABLE (id bigint, kind text, payload jsonb, priority smallint, attempt integer, max_attempts integer,
               lease_token bigint, run_at timestamptz, created_at timestamptz, started_at timestamptz,
               lease_until timestamptz, unique_key text, last_error text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s         pgjobq.queues%ROWTYPE;
    v_limited boolean := false;
    v_room    integer;
    v_window  timestamptz[];
    v_claimed integer;
BEGIN
    IF max_jobs IS NULL OR max_jobs < 1 OR max_jobs > 10000 THEN
        RAISE EXCEPTION 'pgjobq.claim: max_jobs must be between 1 and 10000, not %', max_jobs
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF lease IS NULL OR lease <= interval '0' THEN
        RAISE EXCEPTION 'pgjobq.claim: lease must be positive, not %', lease
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (after_priority IS NULL) <> (after_run_at IS NULL) OR (after_priority IS NULL) <> (after_id IS NULL) THEN
        RAISE EXCEPTION 'pgjobq.claim: give all of after_priority, after_run_at and after_id, or none'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    SELECT * INTO s FROM pgjobq.queues qs WHERE qs.name = claim_batch.queue;
    IF FOUND THEN
        IF s.paused_at IS NOT NULL THEN
            RETURN;
        END IF;
        IF s.concurrency IS NOT NULL OR s.rate_limit IS NOT NULL OR s.key_concurrency IS NOT NULL THEN
            IF current_setting('transaction_isolation') <> 'read committed' THEN
                RAISE EXCEPTION 'pgjobq.claim: queue % has a limit; claim from it in a READ COMMITTED transaction', queue
                    USING ERRCODE = 'invalid_transaction_state',
                          HINT = 'A snapshot older than the claim cannot see the jobs other claims just started.';
            END IF;
            -- Limited claims of this queue run one at a time from here to their commit.  The counts
            -- below are new statements, so each sees every claim committed before this lock was given.
            SELECT * INTO s FROM pgjobq.queues qs WHERE qs.name = claim_batch.queue FOR UPDATE;
            IF s.paused_at IS NOT NULL THEN
                RETURN;
            END IF;
            v_room := max_jobs;
            IF s.concurrency IS NOT NULL THEN
                v_room := least(v_room, s.concurrency - (
                    SELECT count(*)::integer FROM pgjobq.jobs j
                     WHERE j.state = 'running' AND j.queue = claim_batch.queue AND j.lease_until > now()));
            END IF;
            IF s.rate_limit IS NOT NULL THEN
                v_window := ARRAY(SELECT t FROM unnest(s.recent_starts) t WHERE t > now() - s.rate_period ORDER BY t);
                v_room := least(v_room, s.rate_limit - cardinality(v_window));
            END IF;
            IF v_room <= 0 THEN
                RETURN;
            END IF;
            v_limited := true;
            max_jobs := v_room;
            after_id := NULL; -- a limited claim takes the head: few jobs, and none may be passed over
        END IF;
    END IF;

    IF v_limited AND s.key_concurrency IS NOT NULL THEN
        -- Per key: each key's due jobs, at most its free slots, then round-robin over the keys (every
        -- key's first job before any key's second); jobs without a key compete as their own.
        RETURN QUERY
        WITH RECURSIVE keys(k) AS (
            (SELECT j.concurrency_key::text FROM pgjobq.jobs j
              WHERE j.state = 'queued' AND j.queue = claim_batch.queue AND j.concurrency_key IS NOT NULL
              ORDER BY j.concurrency_key LIMIT 1)
            UNION ALL
            SELECT (SELECT j.concurrency_key::text FROM pgjobq.jobs j
                     WHERE j.state = 'queued' AND j.queue = claim_batch.queue AND j.concurrency_key IS NOT NULL
                       AND j.concurrency_key > keys.k
                     ORDER BY j.concurrency_key LIMIT 1)
              FROM keys WHERE keys.k IS NOT NULL),
        busy AS (
            SELECT j.concurrency_key::text AS k, count(*) AS n FROM pgjobq.jobs j
             WHERE j.state = 'running' AND j.queue = claim_batch.queue AND j.lease_until > now()
               AND j.concurrency_key IS NOT NULL
             GROUP BY 1),
        cand AS (
            SELECT c.id, c.priority, c.run_at, c.rn
              FROM keys
              CROSS JOIN LATERAL (
                  SELECT j.id, j.priority, j.run_at,
                         row_number() OVER (ORDER BY j.priority, j.run_at, j.id) AS rn
                    FROM pgjobq.jobs j
                   WHERE j.state = 'queued' AND j.queue = claim_batch.queue AND j.concurrency_key = keys.k
                     AND j.run_at <= now()
                   ORDER BY j.priority, j.run_at, j.id
                   LIMIT greatest(s.key_concurrency - coalesce((SELECT b.n FROM busy b WHERE b.k = keys.k), 0), 0)) c
             WHERE keys.k IS NOT NULL
            UNION ALL
            SELECT u.id, u.priority, u.run_at, row_number() OVER (ORDER BY u.priority, u.run_at, u.id)
              FROM (SELECT j.id, j.priority, j.run_at FROM pgjobq.jobs j
                     WHERE j.state = 'queued' AND j.queue = claim_batch.queue AND j.concurrency_key IS NULL
                       AND j.run_at <= now()
                     ORDER BY j.priority, j.run_at, j.id
                     LIMIT claim_batch.max_jobs) u),
        picked AS MATERIALIZED (
            SELECT j.id FROM pgjobq.jobs j
             WHERE j.id = ANY (ARRAY(SELECT cand.id FROM cand
                                      ORDER BY cand.rn, cand.priority, cand.run_at, cand.id
                                      LIMIT claim_batch.max_jobs))
               AND j.state = 'queued'
               FOR UPDATE SKIP LOCKED)
        UPDATE pgjobq.jobs j
           SET state = 'running', attempt = j.attempt + 1, lease_token = j.lease_token + 1,
               lease_until = now() + claim_batch.lease, started_at = now(), worker_id = claim_batch.worker_id
         WHERE j.id = ANY (ARRAY(SELECT picked.id FROM picked))
        RETURNING j.id, j.kind::text, j.payload::jsonb, j.priority, j.attempt, j.max_attempts, j.lease_token,
                  j.run_at, j.created_at, j.started_at, j.lease_until, j.unique_key::text, j.last_error;
    -- Two statements rather than one with "after_id IS NULL OR ...": each keeps a plan whose index
    -- scan starts where it should.
    ELSIF after_id IS NULL THEN
        RETURN QUERY
        WITH picked AS MATERIALIZED (
            SELECT j.id FROM pgjobq.jobs j
             WHERE j.state = 'queued' AND j.queue = claim_batch.queue AND j.run_at <= now()
             ORDER BY j.priority, j.run_at, j.id
             LIMIT claim_batch.max_jobs
               FOR UPDATE SKIP LOCKED)
        UPDATE pgjobq.jobs j
           SET state = 'running', attempt = j.attempt + 1, lease_token = j.lease_token + 1,
               lease_until = now() + claim_batch.lease, started_at = now(), worker_id = claim_batch.worker_id
         WHERE j.id = ANY (ARRAY(SELECT picked.id FROM picked))
        RETURNING j.id, j.kind::text, j.payload::jsonb, j.priority, j.attempt, j.max_attempts, j.lease_token,
                  j.run_at, j.created_at, j.started_at, j.lease_until, j.unique_key::text, j.last_error;
    ELSE
        RETURN QUERY
        WITH picked AS MATERIALIZED (
            SELECT j.id FROM pgjobq.jobs j
             WHERE j.state = 'queued' AND j.queue = claim_batch.queue AND j.run_at <= now()
               AND (j.priority, j.run_at, j.id) > (claim_batch.after_priority, claim_batch.after_run_at,
                                                    claim_batch.after_id)
             ORDER BY j.priority, j.run_at, j.id
             LIMIT claim_batch.max_jobs
               FOR UPDATE SKIP LOCKED)
        UPDATE pgjobq.jobs j
           SET state = 'running', attempt = j.attempt + 1, lease_token = j.lease_token + 1,
               lease_until = now() + claim_batch.lease, started_at = now(), worker_id = claim_batch.worker_id
         WHERE j.id = ANY (ARRAY(SELECT picked.id FROM picked))
        RETURNING j.id, j.kind::text, j.payload::jsonb, j.priority, j.attempt, j.max_attempts, j.lease_token,
                  j.run_at, j.created_at, j.started_at, j.lease_until, j.unique_key::text, j.last_error;
    END IF;

    IF v_limited AND s.rate_limit IS NOT NULL THEN
        GET DIAGNOSTICS v_claimed = ROW_COUNT;
        IF v_claimed > 0 THEN
            UPDATE pgjobq.queues qs SET recent_starts = v_window || array_fill(now(), ARRAY[v_claimed])
             WHERE qs.name = claim_batch.queue;
        END IF;
    END IF;
END
$$;

-- claim (the SQL API of version 1) goes through claim_batch, so it obeys the settings too.

-- next_due(queue): seconds until a claim from the queue can return a job (0 or less: now), or NULL
-- when none can until something happens that wakes workers anyway (nothing queued, the queue
-- paused: resuming notifies).  A rate-limited queue whose window is full is due when the oldest start
-- leaves the window.  A queue whose concurrency is used up counts as due now: the worker then polls.
CREATE OR REPLACE FUNCTION pgjobq.next_due(queue text) RETURNS double precision
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s      pgjobq.queues%ROWTYPE;
    v_due  double precision;
    v_full timestamptz;
BEGIN
    SELECT * INTO s FROM pgjobq.queues qs WHERE qs.name = next_due.queue;
    IF s.paused_at IS NOT NULL THEN
        RETURN NULL;
    END IF;
    SELECT extract(epoch FROM min(f.run_at) - now())::double precision INTO v_due
      FROM (SELECT j.run_at FROM pgjobq.jobs j
             WHERE j.state = 'queued' AND j.queue = next_due.queue
             ORDER BY j.priority, j.run_at, j.id
             LIMIT 1000) f;
    IF v_due IS NULL OR s.rate_limit IS NULL THEN
        RETURN v_due;
    END IF;
    -- The window is full: the next start is possible when its oldest start leaves it.
    SELECT min(t) + s.rate_period INTO v_full FROM unnest(s.recent_starts) t WHERE t > now() - s.rate_period
    HAVING count(*) >= s.rate_limit;
    IF v_full IS NOT NULL THEN
        RETURN greatest(v_due, extract(epoch FROM v_full - now())::double precision);
    END IF;
    RETURN v_due;
END
$$;

-- ------------------------------------------------------------------------------------------------
-- Settings

-- queue_pause(queue, reason): the queue's claims return nothing from now on, on every worker, until
-- queue_resume.  Jobs already running go on under their leases.  Returns false when the queue was
-- paused already (its reason is then replaced).
CREATE FUNCTION pgjobq.queue_pause(queue text, reason text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_was timestamptz;
BEGIN
    SELECT qs.paused_at INTO v_was FROM pgjobq.queues qs WHERE qs.name = queue_pause.queue FOR UPDATE;
    INSERT INTO pgjobq.queues AS qs (name, paused_at, pause_reason)
    VALUES (queue_pause.queue, now(), left(reason, 1024))
    ON CONFLICT (name) DO UPDATE
       SET paused_at = coalesce(qs.paused_at, now()), pause_reason = left(queue_pause.reason, 1024),
           updated_at = now();
    RETURN v_was IS NULL;
END
$$;

-- queue_resume(queue): claims from the queue return jobs again; workers are woken.  Returns false when
-- the queue was not paused.
CREATE FUNCTION pgjobq.queue_resume(queue text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE pgjobq.queues qs SET paused_at = NULL, pause_reason = NULL, updated_at = now()
     WHERE qs.name = queue_resume.queue AND qs.paused_at IS NOT NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pgjobq.notify(ARRAY[queue]);
    RETURN true;
END
$$;

-- queue_set(queue, settings): changes the settings named in a JSON object and leaves the others;
-- null removes a limit.  Keys: "concurrency" (1..1000000), "key_concurrency" (1..1000000: jobs of one
-- concurrency key running at once), "rate_limit" (1..10000) with
-- "rate_period" (an interval, 1 ms to 1 day; the two go together).  Workers are woken, as a limit may
-- have been raised.
CREATE FUNCTION pgjobq.queue_set(queue text, settings jsonb) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    k text;
BEGIN
    IF settings IS NULL OR jsonb_typeof(settings) <> 'object' THEN
        RAISE EXCEPTION 'pgjobq.queue_set: settings must be a JSON object'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR k IN SELECT jsonb_object_keys(settings) LOOP
        IF k NOT IN ('concurrency', 'key_concurrency', 'rate_limit', 'rate_period') THEN
            RAISE EXCEPTION 'pgjobq.queue_set: unknown setting "%"', k
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'The settings are concurrency, key_concurrency, rate_limit and rate_period.';
        END IF;
    END LOOP;
    IF (settings ? 'rate_limit') <> (settings ? 'rate_period') THEN
        RAISE EXCEPTION 'pgjobq.queue_set: give rate_limit and rate_period together'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO pgjobq.queues (name) VALUES (queue_set.queue) ON CONFLICT (name) DO NOTHING;
    UPDATE pgjobq.queues qs
       SET concurrency = CASE WHEN settings ? 'concurrency' THEN (settings ->> 'concurrency')::integer
                              ELSE qs.concurrency END,
           key_concurrency = CASE WHEN settings ? 'key_concurrency' THEN (settings ->> 'key_concurrency')::integer
                                  ELSE qs.key_concurrency END,
           rate_limit = CASE WHEN settings ? 'rate_limit' THEN (settings ->> 'rate_limit')::integer
                             ELSE qs.rate_limit END,
           rate_period = CASE WHEN settings ? 'rate_period' THEN (settings ->> 'rate_period')::interval
                              ELSE qs.rate_period END,
           updated_at = now()
     WHERE qs.name = queue_set.queue;
    PERFORM pgjobq.notify(ARRAY[queue]);
END
$$;

-- queue_list(): every queue that has jobs or settings, with its settings and its live jobs: queued
-- and due, scheduled (queued, not yet due), running (lease valid) and expired (running, lease past).
CREATE FUNCTION pgjobq.queue_list()
RETURNS TABLE (queue text, paused_at timestamptz, pause_reason text, concurrency integer, key_concurrency integer,
               rate_limit integer, rate_period interval, queued bigint, scheduled bigint, running bigint,
               expired bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH counts AS (
        SELECT j.queue::text AS queue,
               count(*) FILTER (WHERE j.state = 'queued' AND j.run_at <= now()) AS queued,
               count(*) FILTER (WHERE j.state = 'queued' AND j.run_at > now()) AS scheduled,
               count(*) FILTER (WHERE j.state = 'running' AND j.lease_until > now()) AS running,
               count(*) FILTER (WHERE j.state = 'running' AND j.lease_until <= now()) AS expired
          FROM pgjobq.jobs j GROUP BY 1)
    SELECT coalesce(s.name::text, c.queue), s.paused_at, s.pause_reason, s.concurrency, s.key_concurrency,
           s.rate_limit,
           s.rate_period, coalesce(c.queued, 0), coalesce(c.scheduled, 0), coalesce(c.running, 0),
           coalesce(c.expired, 0)
      FROM pgjobq.queues s FULL JOIN counts c ON c.queue = s.name::text
     ORDER BY 1
$$;

-- ------------------------------------------------------------------------------------------------
-- The calendar of cron schedules: one implementation, in the database, on its clock.

-- cron_field(spec, lo, hi, names, what): the values a cron field allows, sorted.  A field is a
-- comma-separated list of *, N, N-M, each optionally /STEP (N/STEP means N-hi/STEP); names (jan..dec,
-- sun..sat) stand for their numbers when given.
CREATE FUNCTION pgjobq.cron_field(spec text, lo integer, hi integer, names text[], what text) RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    part   text;
    range  text;
    a      integer;
    b      integer;
    step   integer;
    v      integer;
    vals   integer[] := '{}';
    bounds text[];
BEGIN
    IF spec IS NULL OR spec = '' THEN
        RAISE EXCEPTION 'pgjobq.cron: the % field is empty', what USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOREACH part IN ARRAY string_to_array(lower(spec), ',') LOOP
        step := 1;
        range := part;
        IF position('/' IN part) > 0 THEN
            IF split_part(part, '/', 2) !~ '^[0-9]{1,4}$' OR split_part(part, '/', 2)::integer < 1 THEN
                RAISE EXCEPTION 'pgjobq.cron: bad step in the % field "%"', what, spec
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            step := split_part(part, '/', 2)::integer;
            range := split_part(part, '/', 1);
        END IF;
        IF range IN ('*', '?') THEN
            a := lo;
            b := hi;
        ELSE
            bounds := string_to_array(range, '-');
            IF cardinality(bounds) > 2 THEN
                RAISE EXCEPTION 'pgjobq.cron: bad range in the % field "%"', what, spec
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            FOR i IN 1 .. cardinality(bounds) LOOP
                IF bounds[i] ~ '^[0-9]{1,4}$' THEN
                    v := bounds[i]::integer;
                ELSIF names IS NOT NULL AND array_position(names, bounds[i]) IS NOT NULL THEN
                    v := lo + array_position(names, bounds[i]) - 1;
                ELSE
                    RAISE EXCEPTION 'pgjobq.cron: "%" is not a value of the % field', bounds[i], what
                        USING ERRCODE = 'invalid_parameter_value';
                END IF;
                IF i = 1 THEN a := v; ELSE b := v; END IF;
            END LOOP;
            IF cardinality(bounds) = 1 THEN
                b := CASE WHEN position('/' IN part) > 0 THEN hi ELSE a END;
            END IF;
        END IF;
        IF a < lo OR b > hi OR a > b THEN
            RAISE EXCEPTION 'pgjobq.cron: the % field "%" is outside %..%', what, spec, lo, hi
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v := a;
        WHILE v <= b LOOP
            vals := vals || v;
            v := v + step;
        END LOOP;
    END LOOP;
    RETURN ARRAY(SELECT DISTINCT x FROM unnest(vals) x ORDER BY x);
END
$$;

-- cron_instant(local, tz): the instant a cron schedule fires for a local time: the local time's first
-- occurrence when clocks fall back and it happens twice; the first instant after the gap when clocks
-- spring forward and it does not exist.
CREATE FUNCTION pgjobq.cron_instant(local timestamp, tz text) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    u      timestamptz := local AT TIME ZONE tz;
    e      timestamptz;
    lo_s   bigint;
    hi_s   bigint;
    mid_s  bigint;
BEGIN
    IF (u AT TIME ZONE tz) <> local THEN
        -- In a gap: the first second whose local time is past it.  Local time is monotonic within a
        -- day of the gap, so a binary search over that day finds the transition.
        lo_s := extract(epoch FROM u - interval '1 day')::bigint;
        hi_s := extract(epoch FROM u + interval '1 day')::bigint;
        WHILE hi_s - lo_s > 1 LOOP
            mid_s := (lo_s + hi_s) / 2;
            IF (to_timestamp(mid_s) AT TIME ZONE tz) > local THEN
                hi_s := mid_s;
            ELSE
                lo_s := mid_s;
            END IF;
        END LOOP;
        RETURN to_timestamp(hi_s);
    END IF;
    -- Twice?  The same local time with the offset of a day earlier is the first occurrence.
    e := (local - ((u - interval '1 day') AT TIME ZONE tz - (u - interval '1 day') AT TIME ZONE 'UTC'))
         AT TIME ZONE 'UTC';
    IF e < u AND (e AT TIME ZONE tz) = local THEN
        RETURN e;
    END IF;
    RETURN u;
END
$$;

-- cron_next(schedule, tz, after): the first instant after `after` at which the schedule fires.  A
-- schedule has 5 fields (minute hour day-of-month month day-of-week) or 6 (second first); day of
-- week 0-7 (0 and 7 are Sunday) or sun..sat, month 1-12 or jan..dec.  When both day fields are
-- restricted a day matches either (as in cron).  tz is an IANA time zone name (UTC by default).
-- Daylight saving: a local time that does not exist fires at the first instant after the gap (a
-- schedule firing within the gap fires once there); a local time that occurs twice fires once, at
-- its first occurrence.  NULL when it never fires within five years (30 February).
CREATE FUNCTION pgjobq.cron_next(schedule text, tz text DEFAULT 'UTC', after timestamptz DEFAULT now())
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    f       text[] := regexp_split_to_array(btrim(coalesce(schedule, '')), '[[:space:]]+');
    o       integer;
    secs    integer[];
    mins    integer[];
    hours   integer[];
    doms    integer[];
    months  integer[];
    dows    integer[];
    dom_any boolean;
    dow_any boolean;
    l       timestamp;
    day     date;
    d       date;
    first   boolean;
    h       integer;
    m       integer;
    sec     integer;
    dom_ok  boolean;
    dow_ok  boolean;
    cand    timestamp;
    inst    timestamptz;
BEGIN
    IF cardinality(f) NOT IN (5, 6) THEN
        RAISE EXCEPTION 'pgjobq.cron: "%" has % fields; a schedule has 5 (minute hour day month weekday) or 6 (second first)',
            schedule, cardinality(f) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF tz IS NULL OR after IS NULL THEN
        RAISE EXCEPTION 'pgjobq.cron: tz and after are required' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    o := cardinality(f) - 5;
    secs := CASE WHEN o = 1 THEN pgjobq.cron_field(f[1], 0, 59, NULL, 'second') ELSE '{0}' END;
    mins := pgjobq.cron_field(f[o + 1], 0, 59, NULL, 'minute');
    hours := pgjobq.cron_field(f[o + 2], 0, 23, NULL, 'hour');
    doms := pgjobq.cron_field(f[o + 3], 1, 31, NULL, 'day of month');
    months := pgjobq.cron_field(f[o + 4], 1, 12,
                                '{jan,feb,mar,apr,may,jun,jul,aug,sep,oct,nov,dec}', 'month');
    dows := pgjobq.cron_field(f[o + 5], 0, 7, '{sun,mon,tue,wed,thu,fri,sat}', 'day of week');
    IF 7 = ANY (dows) THEN
        dows := ARRAY(SELECT DISTINCT x FROM unnest(dows || 0) x WHERE x < 7 ORDER BY x);
    END IF;
    dom_any := f[o + 3] IN ('*', '?');
    dow_any := f[o + 5] IN ('*', '?');

    l := after AT TIME ZONE tz; -- raises for an unknown time zone
    day := l::date;
    FOR i IN 0 .. 366 * 5 LOOP
        d := day + i;
        CONTINUE WHEN NOT (extract(month FROM d)::integer = ANY (months));
        dom_ok := extract(day FROM d)::integer = ANY (doms);
        dow_ok := extract(dow FROM d)::integer = ANY (dows);
        CONTINUE WHEN NOT CASE WHEN dom_any AND dow_any THEN true
                               WHEN dom_any THEN dow_ok
                               WHEN dow_any THEN dom_ok
                               ELSE dom_ok OR dow_ok END;
        first := i = 0;
        FOREACH h IN ARRAY hours LOOP
            CONTINUE WHEN first AND h < extract(hour FROM l);
            FOREACH m IN ARRAY mins LOOP
                CONTINUE WHEN first AND h = extract(hour FROM l) AND m < extract(minute FROM l);
                FOREACH sec IN ARRAY secs LOOP
                    cand := d + make_interval(hours => h, mins => m, secs => sec);
                    CONTINUE WHEN cand <= l;
                    inst := pgjobq.cron_instant(cand, tz);
                    IF inst > after THEN
                        RETURN inst;
                    END IF;
                END LOOP;
            END LOOP;
        END LOOP;
    END LOOP;
    RETURN NULL;
END
$$;

-- ------------------------------------------------------------------------------------------------
-- Schedules: jobs enqueued by the calendar, without a leader.
--
-- Every worker process ticks (pgjobq.schedule_tick, on its maintenance connection, about once a
-- second).  A tick locks the due schedules it can (FOR UPDATE SKIP LOCKED), enqueues their jobs and
-- moves next_run past now() in the same transaction: a schedule another tick holds is skipped, and
-- one that a tick committed meanwhile is no longer due when re-checked under its lock, so each fire
-- time enqueues exactly once however many workers tick.  Times are the database's.

CREATE TABLE pgjobq.schedules (
    name         pgjobq.identifier PRIMARY KEY,
    cron         text              NOT NULL,
    tz           text              NOT NULL DEFAULT 'UTC',
    queue        pgjobq.identifier NOT NULL DEFAULT 'default',
    kind         pgjobq.identifier NOT NULL DEFAULT 'default',
    payload      pgjobq.payload    NOT NULL DEFAULT '{}',
    priority     smallint          NOT NULL DEFAULT 0,
    max_attempts integer           NOT NULL DEFAULT 25,
    enabled      boolean           NOT NULL DEFAULT true,
    catch_up     text              NOT NULL DEFAULT 'latest',
    next_run     timestamptz,
    last_run     timestamptz,
    created_at   timestamptz       NOT NULL DEFAULT now(),
    updated_at   timestamptz       NOT NULL DEFAULT now(),
    CONSTRAINT schedules_catch_up CHECK (catch_up IN ('skip', 'latest', 'all')),
    CONSTRAINT schedules_priority_range CHECK (priority BETWEEN -100 AND 100),
    CONSTRAINT schedules_max_attempts_range CHECK (max_attempts BETWEEN 1 AND 1000),
    CONSTRAINT schedules_cron_length CHECK (octet_length(cron) <= 256),
    CONSTRAINT schedules_tz_length CHECK (octet_length(tz) <= 64)
);
CREATE INDEX schedules_due_idx ON pgjobq.schedules (next_run) WHERE enabled;

-- schedule_set(name, cron, tz, queue, kind, payload, priority, max_attempts, catch_up): creates or
-- replaces a schedule (enabled); its next run is the first fire time after now.  The expression and
-- the time zone are checked here (SQLSTATE 22023).
CREATE FUNCTION pgjobq.schedule_set(
    name         text,
    cron         text,
    tz           text     DEFAULT 'UTC',
    queue        text     DEFAULT 'default',
    kind         text     DEFAULT 'default',
    payload      jsonb    DEFAULT '{}',
    priority     smallint DEFAULT 0,
    max_attempts integer  DEFAULT 25,
    catch_up     text     DEFAULT 'latest')
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_next timestamptz := pgjobq.cron_next(cron, tz, now());
BEGIN
    INSERT INTO pgjobq.schedules AS s (name, cron, tz, queue, kind, payload, priority, max_attempts, catch_up,
                                       next_run)
    VALUES (schedule_set.name, btrim(schedule_set.cron), schedule_set.tz, coalesce(schedule_set.queue, 'default'),
            coalesce(schedule_set.kind, 'default'), coalesce(schedule_set.payload, '{}'),
            coalesce(schedule_set.priority, 0), coalesce(schedule_set.max_attempts, 25),
            coalesce(schedule_set.catch_up, 'latest'), v_next)
    ON CONFLICT ON CONSTRAINT schedules_pkey DO UPDATE
       SET cron = excluded.cron, tz = excluded.tz, queue = excluded.queue, kind = excluded.kind,
           payload = excluded.payload, priority = excluded.priority, max_attempts = excluded.max_attempts,
           catch_up = excluded.catch_up, next_run = excluded.next_run, enabled = true, updated_at = now();
    RETURN v_next;
END
$$;

-- schedule_enable(name, enabled): pauses (false) or resumes (true) a schedule; resuming starts from
-- the next fire time after now (what was missed while disabled is not caught up).  False when there
-- is no such schedule.
CREATE FUNCTION pgjobq.schedule_enable(name text, enabled boolean) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE pgjobq.schedules s
       SET enabled = schedule_enable.enabled, updated_at = now(),
           next_run = CASE WHEN schedule_enable.enabled AND NOT s.enabled THEN pgjobq.cron_next(s.cron, s.tz, now())
                           ELSE s.next_run END
     WHERE s.name = schedule_enable.name;
    RETURN FOUND;
END
$$;

-- schedule_delete(name): false when there was no such schedule.  Jobs it enqueued stay.
CREATE FUNCTION pgjobq.schedule_delete(name text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM pgjobq.schedules s WHERE s.name = schedule_delete.name;
    RETURN FOUND;
END
$$;

-- schedule_trigger(name): enqueues the schedule's job now, outside its calendar (next_run is left
-- alone).  Returns the job's id, or NULL when there is no such schedule.
CREATE FUNCTION pgjobq.schedule_trigger(name text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s    pgjobq.schedules%ROWTYPE;
    v_id bigint;
BEGIN
    SELECT * INTO s FROM pgjobq.schedules sc WHERE sc.name = schedule_trigger.name;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT e.id INTO v_id
      FROM pgjobq.enqueue_many(ARRAY[s.queue::text], ARRAY[s.kind::text], ARRAY[s.payload::jsonb],
                               ARRAY[s.priority], NULL, NULL, ARRAY[s.max_attempts], NULL) e;
    RETURN v_id;
END
$$;

-- schedule_sync(schedules): makes the set of schedules exactly the given JSON array of objects
-- ({"name", "schedule", and optionally "tz", "queue", "kind", "payload", "priority", "max_attempts",
-- "catch_up"}): schedules missing from it are deleted, changed ones replaced, unchanged ones left as
-- they are (their next run included).  All or nothing.  Returns how many schedules it created,
-- changed or deleted.
CREATE FUNCTION pgjobq.schedule_sync(schedules jsonb) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    e       jsonb;
    k       text;
    n       integer := 0;
    v_names text[] := '{}';
    v_old   pgjobq.schedules%ROWTYPE;
    v_name  text;
    v_gone  integer;
BEGIN
    IF schedules IS NULL OR jsonb_typeof(schedules) <> 'array' THEN
        RAISE EXCEPTION 'pgjobq.schedule_sync: schedules must be a JSON array of objects'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR e IN SELECT x FROM jsonb_array_elements(schedules) x LOOP
        IF jsonb_typeof(e) <> 'object' OR NOT (e ? 'name') OR NOT (e ? 'schedule') THEN
            RAISE EXCEPTION 'pgjobq.schedule_sync: each schedule is an object with "name" and "schedule": %', left(e::text, 200)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        FOR k IN SELECT jsonb_object_keys(e) LOOP
            IF k NOT IN ('name', 'schedule', 'tz', 'queue', 'kind', 'payload', 'priority', 'max_attempts', 'catch_up') THEN
                RAISE EXCEPTION 'pgjobq.schedule_sync: schedule %: unknown field "%"', e ->> 'name', k
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
        END LOOP;
        v_name := e ->> 'name';
        IF v_name = ANY (v_names) THEN
            RAISE EXCEPTION 'pgjobq.schedule_sync: schedule % is given twice', v_name
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_names := v_names || v_name;
        SELECT * INTO v_old FROM pgjobq.schedules sc WHERE sc.name = v_name;
        IF FOUND AND v_old.cron = btrim(e ->> 'schedule') AND v_old.tz = coalesce(e ->> 'tz', 'UTC')
           AND v_old.queue = coalesce(e ->> 'queue', 'default') AND v_old.kind = coalesce(e ->> 'kind', 'default')
           AND v_old.payload::jsonb = coalesce(e -> 'payload', '{}') AND v_old.priority = coalesce((e ->> 'priority')::smallint, 0)
           AND v_old.max_attempts = coalesce((e ->> 'max_attempts')::integer, 25)
           AND v_old.catch_up = coalesce(e ->> 'catch_up', 'latest') AND v_old.enabled THEN
            CONTINUE;
        END IF;
        PERFORM pgjobq.schedule_set(v_name, e ->> 'schedule', coalesce(e ->> 'tz', 'UTC'),
                                    coalesce(e ->> 'queue', 'default'), coalesce(e ->> 'kind', 'default'),
                                    coalesce(e -> 'payload', '{}'), coalesce((e ->> 'priority')::smallint, 0::smallint),
                                    coalesce((e ->> 'max_attempts')::integer, 25), coalesce(e ->> 'catch_up', 'latest'));
        n := n + 1;
    END LOOP;
    DELETE FROM pgjobq.schedules sc WHERE sc.name::text <> ALL (v_names);
    GET DIAGNOSTICS v_gone = ROW_COUNT;
    RETURN n + v_gone;
END
$$;

-- schedule_list(): every schedule, by name.
CREATE FUNCTION pgjobq.schedule_list() RETURNS SETOF pgjobq.schedules
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM pgjobq.schedules ORDER BY name
$$;

-- schedule_tick(max_schedules): enqueues the jobs of the schedules that are due, at most
-- max_schedules of them, and returns how many jobs it enqueued.  Fire times missed while no worker
-- ticked follow the schedule's catch_up: 'latest' enqueues one job for the most recent; 'all' one per
-- fire time, at most 100 (the most recent); 'skip' only a fire time less than a minute late.
CREATE FUNCTION pgjobq.schedule_tick(max_schedules integer DEFAULT 100) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s      pgjobq.schedules%ROWTYPE;
    v_at   timestamptz;
    v_due  timestamptz[];
    v_n    integer;
    v_jobs integer := 0;
BEGIN
    FOR s IN SELECT * FROM pgjobq.schedules sc
              WHERE sc.enabled AND sc.next_run <= now()
              ORDER BY sc.next_run LIMIT max_schedules
                FOR UPDATE SKIP LOCKED LOOP
        -- The fire times due now, oldest first; the 101st and older are not needed by any policy.
        v_due := ARRAY[s.next_run];
        v_at := s.next_run;
        LOOP
            v_at := pgjobq.cron_next(s.cron, s.tz, v_at);
            EXIT WHEN v_at IS NULL OR v_at > now();
            v_due := v_due || v_at;
            IF cardinality(v_due) > 100 THEN
                v_due := v_due[2:];
            END IF;
        END LOOP;
        v_due := CASE s.catch_up
                     WHEN 'all' THEN v_due
                     WHEN 'latest' THEN v_due[cardinality(v_due):]
                     ELSE (SELECT coalesce(array_agg(t), '{}') FROM unnest(v_due[cardinality(v_due):]) t
                            WHERE t > now() - interval '1 minute') END;
        v_n := cardinality(v_due);
        IF v_n > 0 THEN
            PERFORM pgjobq.enqueue_many(array_fill(s.queue::text, ARRAY[v_n]), array_fill(s.kind::text, ARRAY[v_n]),
                                        array_fill(s.payload::jsonb, ARRAY[v_n]), array_fill(s.priority, ARRAY[v_n]),
                                        NULL, NULL, array_fill(s.max_attempts, ARRAY[v_n]), NULL);
            v_jobs := v_jobs + v_n;
        END IF;
        UPDATE pgjobq.schedules sc
           SET next_run = pgjobq.cron_next(s.cron, s.tz, now()),
               last_run = CASE WHEN v_n > 0 THEN v_due[v_n] ELSE sc.last_run END
         WHERE sc.name = s.name;
    END LOOP;
    RETURN v_jobs;
END
$$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgjobq FROM PUBLIC;
