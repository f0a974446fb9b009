-- pgjobq schema, migration 7: lease tokens that a failover cannot hand out twice, and an unthrottled
-- autovacuum of the queue table.
-- needs: 6
--
-- A lease token was the job's previous token plus one.  After a failover to an asynchronous standby
-- the new primary has lost the last transactions of the old one, so the same (job, token) pair could
-- be given out again: a worker still holding a lease from the old primary would then pass the fencing
-- check of a lease it never had, and a job id that a lost enqueue had used could name another job
-- with the same small token.  The token is now also at least the claim's time on the database clock
-- in microseconds: still strictly increasing per job, and greater after a promotion than any token
-- the old primary gave out, as long as the two servers' clocks agree to within the failover time.
--
-- schema_version.needs: the oldest library schema version that can use the database once this
-- migration is applied (a library reads it to accept a newer, compatible schema during a rolling
-- deploy).  This migration changes no signature, so libraries of version 6 work with it.

ALTER TABLE pgjobq.schema_version ADD COLUMN needs integer;

-- The queue table's vacuum is never throttled: under churn a throttled vacuum (1 ms of sleep per 200
-- cost units) scanned about 20 MB/s while 40 workers made the table grow faster than that, and the
-- claim slowed as dead tuples piled up (`make soak`, bench/README.md).
ALTER TABLE pgjobq.jobs SET (autovacuum_vacuum_cost_delay = 0);

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
           SET state = 'running', attempt = j.attempt + 1,
               lease_token = greatest(j.lease_token + 1, (extract(epoch FROM now()) * 1000000)::bigint),
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
           SET state = 'running', attempt = j.attempt + 1,
               lease_token = greatest(j.lease_token + 1, (extract(epoch FROM now()) * 1000000)::bigint),
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
           SET state = 'running', attempt = j.attempt + 1,
               lease_token = greatest(j.lease_token + 1, (extract(epoch FROM now()) * 1000000)::bigint),
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
