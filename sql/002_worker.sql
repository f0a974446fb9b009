-- pgjobq schema version 2: what the worker runtime needs beyond version 1.
--
--   release_many  a worker shutting down hands its unfinished jobs back at once, without burning an
--                 attempt, instead of leaving them to wait for their leases to expire.
--   next_due      how long until a queue's next scheduled job is due, so that an idle worker can
--                 sleep exactly that long instead of polling.

-- release_many: running -> queued now, attempt given back, for jobs the caller holds (same fencing as
-- complete_many).  A job whose cancellation was requested ends cancelled instead.  Returns one row per
-- input: outcome 'queued', 'cancelled' or 'lost'.
CREATE FUNCTION pgjobq.release_many(ids bigint[], tokens bigint[], reason text DEFAULT NULL)
RETURNS TABLE (id bigint, outcome text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF cardinality(ids) IS DISTINCT FROM cardinality(tokens) THEN
        RAISE EXCEPTION 'pgjobq.release_many: ids and tokens must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH input AS (SELECT u.id, u.token FROM unnest(ids, tokens) AS u(id, token)),
    released AS (
        UPDATE pgjobq.jobs j
           SET state = CASE WHEN j.cancel_requested THEN 'cancelled'::pgjobq.job_state
                            ELSE 'queued'::pgjobq.job_state END,
               attempt = CASE WHEN j.cancel_requested THEN j.attempt ELSE j.attempt - 1 END,
               finished_at = CASE WHEN j.cancel_requested THEN now() END,
               run_at = CASE WHEN j.cancel_requested THEN j.run_at ELSE now() END,
               lease_until = NULL,
               last_error = coalesce(left(release_many.reason, 8192), j.last_error)
          FROM input
         WHERE j.id = ANY (ids) AND j.id = input.id AND j.lease_token = input.token
           AND j.state = 'running' AND j.lease_until > now()
        RETURNING j.id, j.state, j.queue::text AS queue),
    notified AS (
        SELECT pgjobq.notify(array_agg(released.queue)) AS x FROM released WHERE released.state = 'queued')
    SELECT input.id, coalesce(released.state::text, 'lost')
      FROM input LEFT JOIN released ON released.id = input.id
     CROSS JOIN notified;
END
$$;

-- next_due(queue): seconds until the queue's earliest queued job is due (0 or less: due now), or NULL
-- when nothing is queued.  It reads at most the first 1000 entries of the claim index, which is
-- exact unless more than 1000 jobs are queued across several priorities; a worker polls anyway.
CREATE FUNCTION pgjobq.next_due(queue text) RETURNS double precision
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT extract(epoch FROM min(s.run_at) - now())::double precision
      FROM (SELECT j.run_at FROM pgjobq.jobs j
             WHERE j.state = 'queued' AND j.queue = $1
             ORDER BY j.priority, j.run_at, j.id
             LIMIT 1000) s
$$;

REVOKE ALL ON FUNCTION pgjobq.release_many(bigint[], bigint[], text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgjobq.next_due(text) FROM PUBLIC;

-- cancel_many: a holder that decides its job should not run at all ends it cancelled (same fencing
-- as complete_many).  Returns one row per input: outcome 'cancelled' or 'lost'.
CREATE FUNCTION pgjobq.cancel_many(ids bigint[], tokens bigint[], reason text DEFAULT NULL)
RETURNS TABLE (id bigint, outcome text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF cardinality(ids) IS DISTINCT FROM cardinality(tokens) THEN
        RAISE EXCEPTION 'pgjobq.cancel_many: ids and tokens must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH input AS (SELECT u.id, u.token FROM unnest(ids, tokens) AS u(id, token)),
    ended AS (
        UPDATE pgjobq.jobs j
           SET state = 'cancelled', finished_at = now(), lease_until = NULL,
               last_error = coalesce(left(cancel_many.reason, 8192), j.last_error)
          FROM input
         WHERE j.id = ANY (ids) AND j.id = input.id AND j.lease_token = input.token
           AND j.state = 'running' AND j.lease_until > now()
        RETURNING j.id)
    SELECT input.id, CASE WHEN ended.id IS NULL THEN 'lost' ELSE 'cancelled' END
      FROM input LEFT JOIN ended ON ended.id = input.id;
END
$$;

REVOKE ALL ON FUNCTION pgjobq.cancel_many(bigint[], bigint[], text) FROM PUBLIC;
