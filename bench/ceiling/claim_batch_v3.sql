-- Schema 3's claim_batch body, as bench_v3.claim_batch, for the same-run comparison that shows what
-- queue settings (schema 4) cost a queue that has none (T10 in run.sh; bench/README.md).  Never installed
-- outside the benchmark's throwaway cluster.
CREATE SCHEMA IF NOT EXISTS bench_v3;
CREATE OR REPLACE FUNCTION bench_v3.claim_batch(
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
    -- Two statements rather than one with "after_id IS NULL OR ...": each keeps a plan whose index
    -- scan starts where it should.
    IF after_id IS NULL THEN
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
END
$$;
