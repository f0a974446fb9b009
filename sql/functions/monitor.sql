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
CREATE OR REPLACE FUNCTION pgjobq.health()
RETURNS TABLE (jobs_bytes bigint, jobs_live bigint, jobs_dead bigint, vacuums bigint, last_vacuum timestamptz,
               horizon_age_s double precision, horizon_xids integer, holder_kind text, holder_pid integer,
               holder_application text, holder_state text, holder_since timestamptz, holder_query text)
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
           o.query
      FROM pg_stat_user_tables s
      LEFT JOIN oldest o ON true
     WHERE s.relid = 'pgjobq.jobs'::regclass
$$;
