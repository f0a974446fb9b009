-- pgjobq functions: what `pgjobq stats` and `pgjobq serve` read, and the workers' heartbeat in
-- pgjobq.workers.
--
-- Applied by `pgjobq migrate` with the other files of sql/functions (docs/hacking.md): each function
-- is defined once, here, as it is now.

-- stats: job counts per queue and state, live and finished.
CREATE OR REPLACE FUNCTION pgjobq.stats() RETURNS TABLE (queue text, state text, jobs bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT a.queue, a.state::text, count(*)
      FROM (SELECT j.queue::text AS queue, j.state FROM pgjobq.jobs j
            UNION ALL
            SELECT h.queue, h.state FROM pgjobq.history h) a
     GROUP BY 1, 2 ORDER BY 1, 2
$$;

-- worker_beat(id, host, pid, version, queues): the worker `id` (serving queues "name:concurrency,...")
-- is alive now; started_at is its first beat (or the first since its pid changed).  Also forgets
-- workers unseen for a day and tallies older than a day (one caller at a time does that).
CREATE OR REPLACE FUNCTION pgjobq.worker_beat(id text, host text, pid integer, version text, queues text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO pgjobq.workers AS w (id, host, pid, version, queues, started_at)
    VALUES (left(worker_beat.id, 255), left(worker_beat.host, 255), worker_beat.pid, left(worker_beat.version, 64),
            left(worker_beat.queues, 4096), now())
    ON CONFLICT ON CONSTRAINT workers_pkey DO UPDATE
       SET host = excluded.host, pid = excluded.pid, version = excluded.version, queues = excluded.queues,
           started_at = CASE WHEN w.pid = excluded.pid AND w.host = excluded.host THEN w.started_at
                             ELSE now() END,
           last_seen = now();
    IF pg_try_advisory_xact_lock(1885825649, 6) THEN
        DELETE FROM pgjobq.workers w WHERE w.last_seen < now() - interval '1 day';
        DELETE FROM pgjobq.tallies t WHERE t.at < now() - interval '1 day';
    END IF;
END
$$;

-- worker_gone(id): the worker stopped cleanly.
CREATE OR REPLACE FUNCTION pgjobq.worker_gone(id text) RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    DELETE FROM pgjobq.workers w WHERE w.id = $1
$$;
