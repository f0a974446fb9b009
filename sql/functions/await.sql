-- pgjobq functions: waiting for a job to finish (docs/durable.md, "Awaiting a result").
--
-- A waiter LISTENs on pgjobq_done, then calls await_begin(id) (in a transaction of its own, so that
-- its wait is seen once it returns), reads the job, and reads it again whenever a notification names
-- its id (or has an empty payload), and every few seconds in case one was missed; then await_end(id).
-- The trigger history_awaited (migration 24) sends the notification in the transaction that moves the
-- job to the history, only when somebody waits.  pgjobq_job_wait (C), `pgjobq wait` and Python's
-- app.result do all of this.

-- await_begin(job_id): registers this session's wait for the job and returns the job's state now
-- (queued, running, waiting, or its final state), with its result and last error; no row for an id
-- no job has (never, or pruned).
CREATE OR REPLACE FUNCTION pgjobq.await_begin(job_id bigint)
RETURNS TABLE (state text, result jsonb, last_error text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO pgjobq.awaited (job_id, pid) VALUES (await_begin.job_id, pg_backend_pid())
    ON CONFLICT ON CONSTRAINT awaited_pkey DO NOTHING;
    RETURN QUERY SELECT a.state::text, a.result, a.last_error FROM pgjobq.all_jobs a WHERE a.id = await_begin.job_id;
END
$$;

-- await_end(job_id): this session waits for the job no more.
CREATE OR REPLACE FUNCTION pgjobq.await_end(job_id bigint) RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    DELETE FROM pgjobq.awaited a WHERE a.job_id = await_end.job_id AND a.pid = pg_backend_pid();
$$;
