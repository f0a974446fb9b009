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

-- The registry of live workers, pgjobq.workers: each worker process says it is alive every 5 seconds
-- (worker_beat), and leaves on a clean stop (worker_gone); `pgjobq serve` shows it.  A row belongs to
-- the worker that wrote it: the worker draws a random 64-bit secret at start, never shows it, and
-- passes it with every beat and with its goodbye; the row keeps its SHA-256.  A beat or a goodbye
-- with another secret is refused while the row is live (seen in the last 15 seconds: three beats,
-- as the dashboard counts), so that no worker role can overwrite or delete another live worker's row,
-- and two live workers cannot share an id.  A row unseen for longer is taken over by the next beat
-- (a worker that crashed and was started again under the same id waits that long).  The admin role
-- (or the schema's owner) may remove any row; it may not beat over a live one (the duplicate would
-- be the same mistake).  Rows without a secret were written by libraries before schema 11 (they call
-- worker_beat(id, host, pid, version, queues) and worker_gone(id): the secret defaults to NULL):
-- anyone may take them over, and such a call cannot take over or remove the live row of a worker that
-- has one.

-- worker_beat(id, host, pid, version, queues, secret): the worker `id` (serving queues
-- "name:concurrency,...") is alive now; started_at is its first beat (or the first since its pid or
-- its secret changed).  55006 (object_in_use) when the id is another live worker's.  Also forgets
-- workers unseen for a day and tallies older than a day (one caller at a time does that).
CREATE OR REPLACE FUNCTION pgjobq.worker_beat(id text, host text, pid integer, version text, queues text,
                                              secret bigint DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_hash bytea := sha256(int8send(worker_beat.secret));
    v_row  pgjobq.workers%ROWTYPE;
BEGIN
    INSERT INTO pgjobq.workers AS w (id, host, pid, version, queues, started_at, secret_hash)
    VALUES (left(worker_beat.id, 255), left(worker_beat.host, 255), worker_beat.pid, left(worker_beat.version, 64),
            left(worker_beat.queues, 4096), now(), v_hash)
    ON CONFLICT ON CONSTRAINT workers_pkey DO UPDATE
       SET host = excluded.host, pid = excluded.pid, version = excluded.version, queues = excluded.queues,
           started_at = CASE WHEN w.pid = excluded.pid AND w.host = excluded.host
                                  AND w.secret_hash IS NOT DISTINCT FROM excluded.secret_hash
                             THEN w.started_at ELSE now() END,
           last_seen = now(), secret_hash = excluded.secret_hash
     WHERE w.secret_hash IS NOT DISTINCT FROM excluded.secret_hash OR w.secret_hash IS NULL
        OR w.last_seen <= now() - interval '15 seconds';
    IF NOT FOUND THEN
        SELECT * INTO v_row FROM pgjobq.workers w WHERE w.id = left(worker_beat.id, 255);
        RAISE EXCEPTION 'worker id % is in use by a live worker (on host %, pid %, seen %s ago)', v_row.id,
            v_row.host, v_row.pid, round(extract(epoch FROM now() - v_row.last_seen)::numeric, 1)
            USING ERRCODE = 'object_in_use',
                  HINT = 'Give each worker its own id; the row of a worker that stopped without a word is '
                         'taken over once it has not been seen for 15 seconds.';
    END IF;
    IF pg_try_advisory_xact_lock(1885825649, 6) THEN
        DELETE FROM pgjobq.workers w WHERE w.last_seen < now() - interval '1 day';
        DELETE FROM pgjobq.tallies t WHERE t.at < now() - interval '1 day';
    END IF;
END
$$;

-- worker_gone(id, secret): the worker stopped cleanly.  42501 when the row is another live worker's
-- (and the caller not an admin); nothing when there is no row.
CREATE OR REPLACE FUNCTION pgjobq.worker_gone(id text, secret bigint DEFAULT NULL) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM pgjobq.workers w
     WHERE w.id = worker_gone.id
       AND (w.secret_hash IS NOT DISTINCT FROM sha256(int8send(worker_gone.secret)) OR w.secret_hash IS NULL
            OR w.last_seen <= now() - interval '15 seconds' OR pgjobq.caller_is_admin());
    IF NOT FOUND AND EXISTS (SELECT 1 FROM pgjobq.workers w WHERE w.id = worker_gone.id) THEN
        RAISE EXCEPTION 'worker id % belongs to another live worker: only it, or pgjobq_admin, may remove it',
            worker_gone.id USING ERRCODE = 'insufficient_privilege';
    END IF;
END
$$;

-- health(): what decides whether pgjobq.jobs stays small, in one row.  The live table's size with its
-- indexes, its live and dead rows and vacuums (the statistics' estimates), and the oldest thing that
-- keeps vacuum from removing the dead rows of finished jobs, with its age: a transaction or snapshot
-- of this database (a `pg_dump`, a report, a session idle in a transaction: holder_kind 'session',
-- with its pid, application, state, since when and what it ran), a replication slot ('slot': a
-- standby or logical consumer that lags, named in holder_application), a standby that reports
-- through hot_standby_feedback ('standby') or a prepared transaction ('prepared').  While one is
-- held, every job that finishes leaves dead rows behind (claims step over none of them: docs/design.md,
-- "The claim's cursor"), and the table grows until it ends.  Seeing another role's session's
-- application, state and query takes pg_read_all_stats (for the schema's owner, which this runs as).
-- autovacuum_paused_since: since when autovacuum of pgjobq.jobs is off because it could remove
-- nothing while the holder holds (autovacuum_adapt(), sql/functions/maintenance.sql); NULL when not.
CREATE OR REPLACE FUNCTION pgjobq.health()
RETURNS TABLE (jobs_bytes bigint, jobs_live bigint, jobs_dead bigint, vacuums bigint, last_vacuum timestamptz,
               horizon_age_s double precision, horizon_xids integer, holder_kind text, holder_pid integer,
               holder_application text, holder_state text, holder_since timestamptz, holder_query text,
               autovacuum_paused_since timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH h AS (
        SELECT 'session'::text AS kind, a.pid, a.application_name::text AS app, a.state::text AS state,
               coalesce(a.xact_start, a.query_start, a.backend_start) AS since, left(a.query, 200) AS query,
               age(coalesce(a.backend_xid, a.backend_xmin)) AS xids
          FROM pg_stat_activity a
         WHERE a.datid = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
           AND coalesce(a.backend_xid, a.backend_xmin) IS NOT NULL AND a.pid <> pg_backend_pid()
        UNION ALL
        SELECT 'standby', a.pid, a.application_name::text, a.state::text, a.backend_start, NULL, age(a.backend_xmin)
          FROM pg_stat_activity a
         WHERE a.backend_type = 'walsender' AND a.backend_xmin IS NOT NULL
        UNION ALL
        SELECT 'slot', NULL::integer, s.slot_name::text, CASE WHEN s.active THEN 'active' ELSE 'inactive' END, NULL,
               NULL, age(s.xmin)
          FROM pg_replication_slots s WHERE s.xmin IS NOT NULL
        UNION ALL
        SELECT 'prepared', NULL::integer, p.gid, 'prepared', p.prepared, NULL, age(p.transaction)
          FROM pg_prepared_xacts p WHERE p.database = current_database()),
    oldest AS (SELECT * FROM h ORDER BY h.xids DESC NULLS LAST, h.since NULLS LAST LIMIT 1)
    SELECT pg_total_relation_size('pgjobq.jobs'), s.n_live_tup, s.n_dead_tup, s.vacuum_count + s.autovacuum_count,
           greatest(s.last_vacuum, s.last_autovacuum),
           extract(epoch FROM now() - o.since)::double precision, o.xids, o.kind, o.pid, o.app, o.state, o.since,
           o.query, (SELECT v.paused_since FROM pgjobq.vacuum_watch v)
      FROM pg_stat_user_tables s
      LEFT JOIN oldest o ON true
     WHERE s.relid = 'pgjobq.jobs'::regclass
$$;
