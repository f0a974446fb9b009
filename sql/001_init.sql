-- pgjobq schema version 1: the jobs table, its indexes, and one function per state transition.
--
-- The migration runner (src/migrate.c) applies this file inside one transaction, under a transaction
-- advisory lock, only when pgjobq.schema_version says it has not been applied yet; that gate is what
-- makes running `pgjobq migrate` twice, or from several hosts at once, a no-op.
--
-- Rules every function below follows:
--   * Times come from the database clock (now()), never from a client.
--   * A write by a lease holder is conditional on the job being running, on the lease token it was
--     given, and on the lease not having expired, all in the same statement (fencing).
--   * Functions are SECURITY DEFINER with a pinned search_path, so a caller's search_path cannot
--     redirect them and a role can be granted a transition without being granted the table.

CREATE SCHEMA IF NOT EXISTS pgjobq;

CREATE TABLE pgjobq.schema_version (
    version    integer     NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT schema_version_pkey PRIMARY KEY (version)
);

-- Queue and kind names: an ASCII letter, then up to 63 letters, digits, '_', '.', ':' or '-'.
-- A domain is checked when a value is stored, not again when an UPDATE leaves the column alone, which
-- keeps the claim and completion updates free of regex work.
-- (The length test comes first and the pattern has no bounded repetition: PostgreSQL's regex engine
-- takes about seven times longer on '{0,63}', which showed up as a third of the cost of an enqueue.)
CREATE DOMAIN pgjobq.identifier AS text
    CONSTRAINT identifier_format CHECK (length(VALUE) BETWEEN 1 AND 64 AND VALUE ~ '^[A-Za-z][A-Za-z0-9_.:-]*$');

-- A payload is a JSON document of at most 1 MiB in its text form (the library checks the same cap).
CREATE DOMAIN pgjobq.payload AS jsonb
    CONSTRAINT payload_size CHECK (octet_length(VALUE::text) <= 1048576);

CREATE DOMAIN pgjobq.short_text AS text
    CONSTRAINT short_text_length CHECK (length(VALUE) BETWEEN 1 AND 255);

CREATE TYPE pgjobq.job_state AS ENUM ('queued', 'running', 'completed', 'failed', 'cancelled');

CREATE TABLE pgjobq.jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY,
    queue            pgjobq.identifier NOT NULL DEFAULT 'default',
    kind             pgjobq.identifier NOT NULL DEFAULT 'default',
    payload          pgjobq.payload    NOT NULL DEFAULT '{}',
    priority         smallint          NOT NULL DEFAULT 0,
    state            pgjobq.job_state  NOT NULL DEFAULT 'queued',
    attempt          integer           NOT NULL DEFAULT 0,
    max_attempts     integer           NOT NULL DEFAULT 25,
    run_at           timestamptz       NOT NULL DEFAULT now(),
    created_at       timestamptz       NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    lease_until      timestamptz,
    lease_token      bigint            NOT NULL DEFAULT 0,
    worker_id        pgjobq.short_text,
    result           jsonb,
    last_error       text,
    unique_key       pgjobq.short_text,
    cancel_requested boolean           NOT NULL DEFAULT false,
    CONSTRAINT jobs_pkey PRIMARY KEY (id),
    CONSTRAINT jobs_priority_range CHECK (priority BETWEEN -100 AND 100),
    CONSTRAINT jobs_max_attempts_range CHECK (max_attempts BETWEEN 1 AND 1000),
    CONSTRAINT jobs_attempt_range CHECK (attempt BETWEEN 0 AND max_attempts),
    CONSTRAINT jobs_queued_has_attempts_left CHECK (state <> 'queued' OR attempt < max_attempts),
    CONSTRAINT jobs_lease_iff_running CHECK ((state = 'running') = (lease_until IS NOT NULL)),
    CONSTRAINT jobs_finished_iff_final
        CHECK ((state IN ('completed', 'failed', 'cancelled')) = (finished_at IS NOT NULL)),
    CONSTRAINT jobs_run_at_finite CHECK (isfinite(run_at)),
    CONSTRAINT jobs_last_error_length CHECK (octet_length(last_error) <= 16384)
);

-- The claim walks this index in the claim's own ORDER BY, over queued rows only, so finished history
-- never slows a claim down however large it grows.
CREATE INDEX jobs_claim_idx ON pgjobq.jobs (queue, priority, run_at, id) WHERE state = 'queued';

-- The rescuer finds expired leases here.
CREATE INDEX jobs_lease_idx ON pgjobq.jobs (lease_until) WHERE state = 'running';

-- At most one queued or running job per unique key; enqueue relies on this index (ON CONFLICT), not on a
-- read-then-write check, so two racing producers cannot both insert.
CREATE UNIQUE INDEX jobs_unique_key_idx ON pgjobq.jobs (unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('queued', 'running');

-- Retention prunes finished jobs by age.
CREATE INDEX jobs_finished_idx ON pgjobq.jobs (finished_at)
    WHERE state IN ('completed', 'failed', 'cancelled');

-- A queue table churns: vacuum it early and often.
ALTER TABLE pgjobq.jobs SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1
);

-- backoff(attempt): how long to wait before retrying after failed attempt number `attempt` (1-based).
-- 2^attempt seconds, capped at one hour, with +-10% jitter so that jobs that failed together do not
-- retry together.  Replace this function (CREATE OR REPLACE, same signature) to change the policy.
CREATE FUNCTION pgjobq.backoff(attempt integer) RETURNS interval
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT make_interval(secs => least(power(2, least(greatest(attempt, 1), 30)), 3600)
                                 * (0.9 + 0.2 * random()))
$$;

-- notify(queues): wake workers listening on channel 'pgjobq', one notification per distinct queue.
-- Notifications are delivered at commit, so a rolled-back enqueue wakes nobody.
CREATE FUNCTION pgjobq.notify(queues text[]) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_notify('pgjobq', d.q)
       FROM (SELECT DISTINCT u.q FROM unnest(queues) AS u(q) WHERE u.q IS NOT NULL) d;
END
$$;

-- enqueue_many: insert a batch of jobs in one statement; all or none.
--
-- The arrays are parallel, one element per job; a NULL element takes the column default (a NULL array
-- means NULL for every job).  A job gets run_at when given, else now() + delay.  A job whose unique_key
-- is already held by a queued or running job is not inserted: its row comes back with the existing
-- job's id and duplicate = true.  Returns one row per input element, in input order (ord is 1-based).
-- Sends one NOTIFY per distinct queue that received a job that is due now.
CREATE FUNCTION pgjobq.enqueue_many(
    queues       text[],
    kinds        text[],
    payloads     jsonb[],
    priorities   smallint[]    DEFAULT NULL,
    run_ats      timestamptz[] DEFAULT NULL,
    delays       interval[]    DEFAULT NULL,
    max_attempts integer[]     DEFAULT NULL,
    unique_keys  text[]        DEFAULT NULL)
RETURNS TABLE (ord integer, id bigint, duplicate boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n          integer := greatest(cardinality(queues), cardinality(kinds), cardinality(payloads),
                                   cardinality(priorities), cardinality(run_ats), cardinality(delays),
                                   cardinality(max_attempts), cardinality(unique_keys));
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
       OR (unique_keys IS NOT NULL AND cardinality(unique_keys) <> n) THEN
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
    WITH input AS MATERIALIZED (
        SELECT nextval(v_seq) AS id, u.ord::integer AS ord,
               coalesce(u.queue, 'default') AS queue,
               coalesce(u.kind, 'default') AS kind,
               coalesce(u.payload, '{}'::jsonb) AS payload,
               coalesce(u.priority, 0::smallint) AS priority,
               coalesce(u.run_at, now() + coalesce(u.delay, interval '0')) AS run_at,
               coalesce(u.max_attempts, 25) AS max_attempts,
               u.unique_key
          FROM unnest(queues, kinds, payloads, priorities, run_ats, delays, max_attempts, unique_keys)
               WITH ORDINALITY AS u(queue, kind, payload, priority, run_at, delay, max_attempts, unique_key, ord)),
    ins AS (
        INSERT INTO pgjobq.jobs (id, queue, kind, payload, priority, run_at, max_attempts, unique_key)
        OVERRIDING SYSTEM VALUE
        SELECT input.id, input.queue, input.kind, input.payload, input.priority, input.run_at,
               input.max_attempts, input.unique_key
          FROM input ORDER BY input.ord
        ON CONFLICT DO NOTHING
        RETURNING pgjobq.jobs.id, pgjobq.jobs.queue::text AS queue, pgjobq.jobs.run_at)
    SELECT array_agg(CASE WHEN ins.id IS NULL THEN 0 ELSE input.id END ORDER BY input.ord),
           array_agg(DISTINCT ins.queue) FILTER (WHERE ins.run_at <= now()),
           array_agg(input.ord ORDER BY input.ord) FILTER (WHERE ins.id IS NULL),
           array_agg(input.unique_key ORDER BY input.ord) FILTER (WHERE ins.id IS NULL)
      INTO v_ids, v_due, v_dup_ords, v_dup_keys
      FROM input LEFT JOIN ins ON ins.id = input.id;

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
                 WHERE j.unique_key = v_dup_keys[i] AND j.state IN ('queued', 'running');
                IF FOUND THEN
                    ord := v_dup_ords[i]; id := v_found; duplicate := true;
                    RETURN NEXT;
                    EXIT;
                END IF;
                INSERT INTO pgjobq.jobs (queue, kind, payload, priority, run_at, max_attempts, unique_key)
                VALUES (coalesce(queues[v_dup_ords[i]], 'default'), coalesce(kinds[v_dup_ords[i]], 'default'),
                        coalesce(payloads[v_dup_ords[i]], '{}'::jsonb),
                        coalesce(priorities[v_dup_ords[i]], 0::smallint),
                        coalesce(run_ats[v_dup_ords[i]], now() + coalesce(delays[v_dup_ords[i]], interval '0')),
                        coalesce(max_attempts[v_dup_ords[i]], 25), v_dup_keys[i])
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

-- enqueue: one job.  A thin wrapper over enqueue_many, so both share one INSERT.
CREATE FUNCTION pgjobq.enqueue(
    queue        text        DEFAULT 'default',
    kind         text        DEFAULT 'default',
    payload      jsonb       DEFAULT '{}',
    priority     smallint    DEFAULT 0,
    run_at       timestamptz DEFAULT NULL,
    delay        interval    DEFAULT NULL,
    max_attempts integer     DEFAULT 25,
    unique_key   text        DEFAULT NULL,
    OUT id bigint,
    OUT duplicate boolean)
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT e.id, e.duplicate
      FROM pgjobq.enqueue_many(ARRAY[$1], ARRAY[$2], ARRAY[$3], ARRAY[$4], ARRAY[$5], ARRAY[$6], ARRAY[$7],
                               ARRAY[$8]) AS e
$$;

-- claim: take up to max_jobs due jobs of one queue, in (priority, run_at, id) order, without waiting
-- for rows other claimers hold (SKIP LOCKED).  Each claimed job becomes running with attempt + 1, a
-- new lease token, and a lease that ends at now() + lease.  One statement; no lock outlives it.
CREATE FUNCTION pgjobq.claim(
    queue     text,
    max_jobs  integer  DEFAULT 1,
    lease     interval DEFAULT '30 seconds',
    worker_id text     DEFAULT NULL)
RETURNS SETOF pgjobq.jobs
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF max_jobs IS NULL OR max_jobs < 1 OR max_jobs > 10000 THEN
        RAISE EXCEPTION 'pgjobq.claim: max_jobs must be between 1 and 10000, not %', max_jobs
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF lease IS NULL OR lease <= interval '0' THEN
        RAISE EXCEPTION 'pgjobq.claim: lease must be positive, not %', lease
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT j.id FROM pgjobq.jobs j
         WHERE j.state = 'queued' AND j.queue = claim.queue AND j.run_at <= now()
         ORDER BY j.priority, j.run_at, j.id
         LIMIT claim.max_jobs
           FOR UPDATE SKIP LOCKED),
    -- id = ANY(ARRAY(...)) makes the update probe the primary key for exactly the picked rows; a
    -- join against the CTE let the planner hash-join against a scan of the whole table.
    claimed AS (
        UPDATE pgjobq.jobs j
           SET state = 'running', attempt = j.attempt + 1, lease_token = j.lease_token + 1,
               lease_until = now() + claim.lease, started_at = now(), worker_id = claim.worker_id
         WHERE j.id = ANY (ARRAY(SELECT picked.id FROM picked))
        RETURNING j.*)
    SELECT * FROM claimed c ORDER BY c.priority, c.run_at, c.id;
END
$$;

-- complete_many: finish jobs the caller holds.  Each (id, token) is completed only if the job is still
-- running under that token and its lease has not expired; a job whose cancellation was requested ends
-- cancelled instead.  Returns one row per input: outcome 'completed', 'cancelled' or 'lost'.
CREATE FUNCTION pgjobq.complete_many(ids bigint[], tokens bigint[], results jsonb[] DEFAULT NULL)
RETURNS TABLE (id bigint, outcome text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF cardinality(ids) IS DISTINCT FROM cardinality(tokens)
       OR (results IS NOT NULL AND cardinality(results) <> cardinality(ids)) THEN
        RAISE EXCEPTION 'pgjobq.complete_many: ids, tokens and results must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH input AS (SELECT u.id, u.token, u.result FROM unnest(ids, tokens, results) AS u(id, token, result)),
    done AS (
        UPDATE pgjobq.jobs j
           SET state = CASE WHEN j.cancel_requested THEN 'cancelled'::pgjobq.job_state
                            ELSE 'completed'::pgjobq.job_state END,
               finished_at = now(), lease_until = NULL, result = input.result
          FROM input
         WHERE j.id = ANY (ids) AND j.id = input.id AND j.lease_token = input.token
           AND j.state = 'running' AND j.lease_until > now()
        RETURNING j.id, j.state)
    SELECT input.id, coalesce(done.state::text, 'lost') FROM input LEFT JOIN done ON done.id = input.id;
END
$$;

-- fail_many: record failed attempts of jobs the caller holds (same fencing as complete_many).
-- A job goes back to queued with run_at = now() + retry_delay (or + backoff(attempt) when the delay is
-- NULL) while attempts remain, else to failed; permanent = true fails it at once.  A job whose
-- cancellation was requested ends cancelled.  The error text is kept in last_error (the first 8 KiB).
-- Returns one row per input: outcome 'queued', 'failed', 'cancelled' or 'lost', and the new run_at.
CREATE FUNCTION pgjobq.fail_many(
    ids          bigint[],
    tokens       bigint[],
    errors       text[]     DEFAULT NULL,
    retry_delays interval[] DEFAULT NULL,
    permanent    boolean[]  DEFAULT NULL)
RETURNS TABLE (id bigint, outcome text, run_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF cardinality(ids) IS DISTINCT FROM cardinality(tokens)
       OR (errors IS NOT NULL AND cardinality(errors) <> cardinality(ids))
       OR (retry_delays IS NOT NULL AND cardinality(retry_delays) <> cardinality(ids))
       OR (permanent IS NOT NULL AND cardinality(permanent) <> cardinality(ids)) THEN
        RAISE EXCEPTION 'pgjobq.fail_many: the arrays must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(retry_delays) AS d WHERE d < interval '0') THEN
        RAISE EXCEPTION 'pgjobq: retry delay must not be negative' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH input AS (
        SELECT u.id, u.token, left(u.error, 8192) AS error, u.delay, coalesce(u.permanent, false) AS permanent
          FROM unnest(ids, tokens, errors, retry_delays, permanent) AS u(id, token, error, delay, permanent)),
    failed AS (
        UPDATE pgjobq.jobs j
           SET state = CASE WHEN j.cancel_requested THEN 'cancelled'::pgjobq.job_state
                            WHEN input.permanent OR j.attempt >= j.max_attempts THEN 'failed'::pgjobq.job_state
                            ELSE 'queued'::pgjobq.job_state END,
               finished_at = CASE WHEN j.cancel_requested OR input.permanent OR j.attempt >= j.max_attempts
                                  THEN now() END,
               run_at = CASE WHEN j.cancel_requested OR input.permanent OR j.attempt >= j.max_attempts
                             THEN j.run_at
                             ELSE now() + coalesce(input.delay, pgjobq.backoff(j.attempt)) END,
               lease_until = NULL, last_error = input.error
          FROM input
         WHERE j.id = ANY (ids) AND j.id = input.id AND j.lease_token = input.token
           AND j.state = 'running' AND j.lease_until > now()
        RETURNING j.id, j.state, j.run_at, j.queue::text AS queue),
    notified AS (
        SELECT pgjobq.notify(array_agg(failed.queue)) AS x
          FROM failed WHERE failed.state = 'queued' AND failed.run_at <= now())
    SELECT input.id, coalesce(failed.state::text, 'lost'),
           CASE WHEN failed.state = 'queued' THEN failed.run_at END
      FROM input LEFT JOIN failed ON failed.id = input.id
     CROSS JOIN notified;
END
$$;

-- extend_many: the heartbeat.  Moves the lease of each held job to now() + lease (same fencing as
-- complete_many).  A job whose cancellation was requested ends cancelled here, so its holder learns to
-- stop.  Returns one row per input: outcome 'extended', 'cancelled' or 'lost', and the new lease_until.
CREATE FUNCTION pgjobq.extend_many(ids bigint[], tokens bigint[], lease interval DEFAULT '30 seconds')
RETURNS TABLE (id bigint, outcome text, lease_until timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF cardinality(ids) IS DISTINCT FROM cardinality(tokens) THEN
        RAISE EXCEPTION 'pgjobq.extend_many: ids and tokens must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF lease IS NULL OR lease <= interval '0' THEN
        RAISE EXCEPTION 'pgjobq.extend_many: lease must be positive, not %', lease
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH input AS (SELECT u.id, u.token FROM unnest(ids, tokens) AS u(id, token)),
    held AS (
        UPDATE pgjobq.jobs j
           SET state = CASE WHEN j.cancel_requested THEN 'cancelled'::pgjobq.job_state
                            ELSE 'running'::pgjobq.job_state END,
               lease_until = CASE WHEN j.cancel_requested THEN NULL ELSE now() + extend_many.lease END,
               finished_at = CASE WHEN j.cancel_requested THEN now() END
          FROM input
         WHERE j.id = ANY (ids) AND j.id = input.id AND j.lease_token = input.token
           AND j.state = 'running' AND j.lease_until > now()
        RETURNING j.id, j.state, j.lease_until)
    SELECT input.id,
           CASE WHEN held.id IS NULL THEN 'lost' WHEN held.state = 'cancelled' THEN 'cancelled'
                ELSE 'extended' END,
           held.lease_until
      FROM input LEFT JOIN held ON held.id = input.id;
END
$$;

-- cancel: a queued job becomes cancelled at once; a running job is marked, and ends cancelled at its
-- holder's next heartbeat, completion or failure (or when its lease expires).  Returns 'cancelled',
-- 'cancel_requested', 'not_found', or 'already_' and the final state the job already had
-- ('already_completed', 'already_failed', 'already_cancelled').
CREATE FUNCTION pgjobq.cancel(id bigint) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_state pgjobq.job_state;
BEGIN
    SELECT j.state INTO v_state FROM pgjobq.jobs j WHERE j.id = cancel.id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'not_found';
    END IF;
    IF v_state = 'queued' THEN
        UPDATE pgjobq.jobs j SET state = 'cancelled', finished_at = now() WHERE j.id = cancel.id;
        RETURN 'cancelled';
    ELSIF v_state = 'running' THEN
        UPDATE pgjobq.jobs j SET cancel_requested = true WHERE j.id = cancel.id;
        RETURN 'cancel_requested';
    END IF;
    RETURN 'already_' || v_state::text;
END
$$;

-- retry: run a finished (completed, failed or cancelled) or scheduled job again now.  Its attempt
-- count is kept, and max_attempts is raised when needed so that one more attempt is allowed.  Returns
-- 'queued', 'not_found', or 'running' (a running job cannot be retried).
CREATE FUNCTION pgjobq.retry(id bigint) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_state pgjobq.job_state;
    v_queue text;
BEGIN
    SELECT j.state, j.queue INTO v_state, v_queue FROM pgjobq.jobs j WHERE j.id = retry.id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'not_found';
    END IF;
    IF v_state = 'running' THEN
        RETURN 'running';
    END IF;
    UPDATE pgjobq.jobs j
       SET state = 'queued', run_at = now(), finished_at = NULL, cancel_requested = false,
           max_attempts = greatest(j.max_attempts, j.attempt + 1)
     WHERE j.id = retry.id;
    PERFORM pgjobq.notify(ARRAY[v_queue]);
    RETURN 'queued';
END
$$;

-- rescue_expired: jobs whose lease ended without a completion (the worker crashed, stalled or lost its
-- connection) go back to queued, or to failed when no attempts remain, or to cancelled when that was
-- requested.  The UPDATE re-checks the state and the lease, so a job completed meanwhile is never
-- touched.  At most max_jobs per call; returns how many were rescued.
CREATE FUNCTION pgjobq.rescue_expired(max_jobs integer DEFAULT 1000) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count integer;
    v_due   text[];
BEGIN
    WITH expired AS MATERIALIZED (
        SELECT j.id FROM pgjobq.jobs j
         WHERE j.state = 'running' AND j.lease_until < now()
         ORDER BY j.lease_until
         LIMIT rescue_expired.max_jobs
           FOR UPDATE SKIP LOCKED),
    rescued AS (
        UPDATE pgjobq.jobs j
           SET state = CASE WHEN j.cancel_requested THEN 'cancelled'::pgjobq.job_state
                            WHEN j.attempt >= j.max_attempts THEN 'failed'::pgjobq.job_state
                            ELSE 'queued'::pgjobq.job_state END,
               finished_at = CASE WHEN j.cancel_requested OR j.attempt >= j.max_attempts THEN now() END,
               run_at = CASE WHEN j.cancel_requested OR j.attempt >= j.max_attempts THEN j.run_at
                             ELSE now() END,
               lease_until = NULL,
               last_error = format('lease expired at %s: worker %s stopped renewing it (crashed, stalled '
                                   'or lost its connection)', j.lease_until, coalesce(j.worker_id, '?'))
         WHERE j.id = ANY (ARRAY(SELECT expired.id FROM expired)) AND j.state = 'running' AND j.lease_until < now()
        RETURNING j.state, j.queue::text AS queue)
    SELECT count(*), array_agg(DISTINCT rescued.queue) FILTER (WHERE rescued.state = 'queued')
      INTO v_count, v_due FROM rescued;
    PERFORM pgjobq.notify(v_due);
    RETURN v_count;
END
$$;

-- prune: delete finished jobs older than their retention: completed and cancelled after
-- completed_age, failed after failed_age.  At most max_jobs per call, so no call holds a long
-- transaction; call it until it returns less than max_jobs.  Returns how many were deleted.
CREATE FUNCTION pgjobq.prune(
    completed_age interval DEFAULT '24 hours',
    failed_age    interval DEFAULT '7 days',
    max_jobs      integer  DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count integer;
BEGIN
    WITH old AS MATERIALIZED (
        SELECT j.id FROM pgjobq.jobs j
         WHERE j.state IN ('completed', 'failed', 'cancelled')
           AND j.finished_at < now() - least(prune.completed_age, prune.failed_age)
           AND j.finished_at < now() - CASE WHEN j.state = 'failed' THEN prune.failed_age
                                            ELSE prune.completed_age END
         LIMIT prune.max_jobs
           FOR UPDATE SKIP LOCKED),
    gone AS (DELETE FROM pgjobq.jobs j WHERE j.id = ANY (ARRAY(SELECT old.id FROM old)) RETURNING 1)
    SELECT count(*) INTO v_count FROM gone;
    RETURN v_count;
END
$$;

-- stats: job counts per queue and state.
CREATE FUNCTION pgjobq.stats() RETURNS TABLE (queue text, state text, jobs bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT j.queue::text, j.state::text, count(*) FROM pgjobq.jobs j GROUP BY 1, 2 ORDER BY 1, 2
$$;

-- Functions are executable by PUBLIC by default; pgjobq's are granted explicitly instead (the owner of
-- the schema always has them).  Role grants come with a later migration.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgjobq FROM PUBLIC;

-- Anyone who can connect may see which schema version is installed (the library checks it at
-- connect); seeing it grants nothing else.
GRANT USAGE ON SCHEMA pgjobq TO PUBLIC;
GRANT SELECT ON pgjobq.schema_version TO PUBLIC;
