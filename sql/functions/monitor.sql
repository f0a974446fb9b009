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
-- (worker_beat), and says so on a clean stop (worker_gone: its row stays, as stopped, until a worker
-- of that id starts again or it is a day old); `pgjobq serve` shows it.  A row belongs to
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

-- worker_beat(id, host, pid, version, queues, secret, unhealthy): the worker `id` (serving queues
-- "name:concurrency,...") is alive now; started_at is its first beat (or the first since its pid or
-- its secret changed, or since it stopped).  The row of a worker that stopped cleanly is taken over
-- at once.  unhealthy: why it claims nothing (NULL while it claims; schema 18), kept with since when
-- (unhealthy_since, from the first beat that said so).  55006 (object_in_use) when the id is another
-- live worker's.  Also forgets workers unseen for a day and tallies older than a day (one caller at a
-- time does that).
CREATE OR REPLACE FUNCTION pgjobq.worker_beat(id text, host text, pid integer, version text, queues text,
                                              secret bigint DEFAULT NULL, unhealthy text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_hash bytea := sha256(int8send(worker_beat.secret));
    v_row  pgjobq.workers%ROWTYPE;
BEGIN
    INSERT INTO pgjobq.workers AS w (id, host, pid, version, queues, started_at, secret_hash, unhealthy,
                                     unhealthy_since)
    VALUES (left(worker_beat.id, 255), left(worker_beat.host, 255), worker_beat.pid, left(worker_beat.version, 64),
            left(worker_beat.queues, 4096), now(), v_hash, left(worker_beat.unhealthy, 4096),
            CASE WHEN worker_beat.unhealthy IS NOT NULL THEN now() END)
    ON CONFLICT ON CONSTRAINT workers_pkey DO UPDATE
       SET host = excluded.host, pid = excluded.pid, version = excluded.version, queues = excluded.queues,
           started_at = CASE WHEN w.pid = excluded.pid AND w.host = excluded.host
                                  AND w.secret_hash IS NOT DISTINCT FROM excluded.secret_hash
                                  AND w.stopped_at IS NULL
                             THEN w.started_at ELSE now() END,
           last_seen = now(), secret_hash = excluded.secret_hash, stopped_at = NULL, unhealthy = excluded.unhealthy,
           unhealthy_since = CASE WHEN excluded.unhealthy IS NULL THEN NULL
                                  WHEN w.unhealthy IS NOT NULL AND w.pid = excluded.pid AND w.host = excluded.host
                                  THEN w.unhealthy_since ELSE now() END
     WHERE w.secret_hash IS NOT DISTINCT FROM excluded.secret_hash OR w.secret_hash IS NULL
        OR w.last_seen <= now() - interval '15 seconds' OR w.stopped_at IS NOT NULL;
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

-- worker_gone(id, secret): the worker stopped cleanly: its row says when (stopped_at), and is no
-- longer alive.  42501 when the row is another live worker's (and the caller not an admin); nothing
-- when there is no row, or it stopped already.
CREATE OR REPLACE FUNCTION pgjobq.worker_gone(id text, secret bigint DEFAULT NULL) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE pgjobq.workers w SET stopped_at = coalesce(w.stopped_at, now())
     WHERE w.id = worker_gone.id
       AND (w.secret_hash IS NOT DISTINCT FROM sha256(int8send(worker_gone.secret)) OR w.secret_hash IS NULL
            OR w.last_seen <= now() - interval '15 seconds' OR w.stopped_at IS NOT NULL
            OR pgjobq.caller_is_admin());
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
-- with its pid, role, application, state, since when and what it ran), a replication slot ('slot': a
-- standby or logical consumer that lags, named in holder_application), a standby that reports
-- through hot_standby_feedback ('standby') or a prepared transaction ('prepared', with its owner).
-- While one is held, every job that finishes leaves dead rows behind (claims step over none of them:
-- docs/design.md, "The claim's cursor"), and the table grows until it ends.
-- autovacuum_paused_since: since when autovacuum of pgjobq.jobs is off because it could remove
-- nothing while the holder holds (autovacuum_adapt(), sql/functions/maintenance.sql); NULL when not.
--
-- Two parts.  health_facts() runs as the schema's owner, who sees every session's pid, role,
-- application, state and age (with pg_read_all_stats, or as a superuser: what an unprivileged caller
-- of pg_stat_activity sees is only the pid, role and application): the monitor and worker roles need
-- those to say what holds vacuum back, and they say nothing of what the holder does.  Its query text
-- is another matter: it may carry anything (`SELECT 'ssn=...'`), and pg_stat_activity shows it only to
-- a superuser, a member of pg_read_all_stats or of the holder's role.  So health() runs with the
-- caller's rights and reads the query from pg_stat_activity itself: PostgreSQL's own rule decides,
-- for the role the caller is at that moment (SET ROLE included), with nothing of ours to get wrong
-- (pg_has_role(session_user, ...) inside a SECURITY DEFINER function would judge the login role,
-- not the current one, and would have to copy the rule).  Both read the same sessions: the activity
-- of every backend is read once per transaction.  A caller that may not see the query gets NULL.
CREATE OR REPLACE FUNCTION pgjobq.health_facts()
RETURNS TABLE (jobs_bytes bigint, jobs_live bigint, jobs_dead bigint, vacuums bigint, last_vacuum timestamptz,
               horizon_age_s double precision, horizon_xids integer, holder_kind text, holder_pid integer,
               holder_role text, holder_application text, holder_state text, holder_since timestamptz,
               autovacuum_paused_since timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH h AS (
        SELECT 'session'::text AS kind, a.pid, a.usename::text AS role, a.application_name::text AS app,
               a.state::text AS state, coalesce(a.xact_start, a.query_start, a.backend_start) AS since,
               age(coalesce(a.backend_xid, a.backend_xmin)) AS xids
          FROM pg_stat_activity a
         WHERE a.datid = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
           AND coalesce(a.backend_xid, a.backend_xmin) IS NOT NULL AND a.pid <> pg_backend_pid()
           -- Not autovacuum's workers: a vacuum's snapshot holds back no other vacuum, an analyze's
           -- lasts a moment, and neither is anything to end.  (One that had started just before a
           -- session took its snapshot was named instead of it, their snapshots being of one age:
           -- roles_health_shows_another_roles_query_only_to_who_may_see_it failed once so.)
           AND a.backend_type IS DISTINCT FROM 'autovacuum worker'
        UNION ALL
        SELECT 'standby', a.pid, a.usename::text, a.application_name::text, a.state::text, a.backend_start,
               age(a.backend_xmin)
          FROM pg_stat_activity a
         WHERE a.backend_type = 'walsender' AND a.backend_xmin IS NOT NULL
        UNION ALL
        SELECT 'slot', NULL::integer, NULL::text, s.slot_name::text,
               CASE WHEN s.active THEN 'active' ELSE 'inactive' END, NULL, age(s.xmin)
          FROM pg_replication_slots s WHERE s.xmin IS NOT NULL
        UNION ALL
        SELECT 'prepared', NULL::integer, p.owner::text, p.gid, 'prepared', p.prepared, age(p.transaction)
          FROM pg_prepared_xacts p WHERE p.database = current_database()),
    oldest AS (SELECT * FROM h ORDER BY h.xids DESC NULLS LAST, h.since NULLS LAST LIMIT 1)
    SELECT pg_total_relation_size('pgjobq.jobs'), s.n_live_tup, s.n_dead_tup, s.vacuum_count + s.autovacuum_count,
           greatest(s.last_vacuum, s.last_autovacuum),
           extract(epoch FROM now() - o.since)::double precision, o.xids, o.kind, o.pid, o.role, o.app, o.state,
           o.since, (SELECT v.paused_since FROM pgjobq.vacuum_watch v)
      FROM pg_stat_user_tables s
      LEFT JOIN oldest o ON true
     WHERE s.relid = 'pgjobq.jobs'::regclass
$$;

CREATE OR REPLACE FUNCTION pgjobq.health()
RETURNS TABLE (jobs_bytes bigint, jobs_live bigint, jobs_dead bigint, vacuums bigint, last_vacuum timestamptz,
               horizon_age_s double precision, horizon_xids integer, holder_kind text, holder_pid integer,
               holder_role text, holder_application text, holder_state text, holder_since timestamptz,
               holder_query text, autovacuum_paused_since timestamptz)
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT f.jobs_bytes, f.jobs_live, f.jobs_dead, f.vacuums, f.last_vacuum, f.horizon_age_s, f.horizon_xids,
           f.holder_kind, f.holder_pid, f.holder_role, f.holder_application, f.holder_state, f.holder_since,
           CASE WHEN f.holder_kind = 'session' THEN
               -- What pg_stat_activity shows this caller of that session: the text, or this marker.
               (SELECT left(a.query, 200) FROM pg_stat_activity a
                 WHERE a.pid = f.holder_pid AND a.query IS DISTINCT FROM '<insufficient privilege>')
           END,
           f.autovacuum_paused_since
      FROM pgjobq.health_facts() f
$$;

-- ------------------------------------------------------------------------------------------------
-- What `pgjobq serve` (its pages and its /metrics), the demo's summary and the benchmarks read: the
-- command knows these functions, not the tables.  Each is the statement the command ran before, moved
-- here unchanged, so that a change of the tables is made in SQL and the library only.  STABLE,
-- SECURITY DEFINER with a pinned search_path like the transitions: the monitor role may be granted
-- them without the tables.  None returns a lease token or a worker's secret.
--
-- The ones that filter by values the caller gives (a time window, the jobs page's filters) are PL/pgSQL
-- running their query with EXECUTE ... USING: such a query is planned for each call with the values
-- known, as the command's own parameterised statement was (a SQL function's body is planned once for
-- any values, and `$1 IS NULL OR ...` filters or a window over hourly partitions want the values).

-- leased_now(): the queue and worker of each running job whose lease has not ended, or ended less than
-- 10 seconds ago (a worker's rescue puts an ended lease back in the queue within a second or two): the
-- running jobs that monitor_queue_counts and monitor_workers count.  Queue by queue (pgjobq.levels)
-- through the alarms of their leases (running_jobs, claim.sql), so that what is read while a snapshot
-- is held is the alarms of the claims within about the last lease, not every job claimed since the
-- snapshot began.
-- A job whose lease ended longer ago, with no worker to rescue it, is left out (`pgjobq list --state
-- running` shows it).
CREATE OR REPLACE FUNCTION pgjobq.leased_now() RETURNS TABLE (queue text, worker_id text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
    SELECT q.queue, j.worker_id::text
      FROM (SELECT DISTINCT l.queue FROM pgjobq.levels l) q
     CROSS JOIN LATERAL (SELECT j.worker_id FROM pgjobq.running_jobs(q.queue) j
                          WHERE j.lease_until > now() - interval '10 seconds') j
$$;

-- monitor_queue_counts(): the live jobs per queue: due (queued, run_at reached), scheduled (queued, not
-- due yet), running, waiting (for parents), and the lag, seconds since the oldest due job became due
-- (NULL when none is due).  Queues without live jobs are left out.
--
-- Each count reads only where live rows can be, not the whole table: while a snapshot is held open (a
-- pg_dump, a long report, a session idle in a transaction) vacuum removes nothing, and a count of the
-- table walks every job claimed or finished since the snapshot began (2.7 s a call 6 minutes into
-- 15,000 jobs/s, and growing: bench/README.md, "Monitoring while a snapshot is held"), which the
-- dashboard and /metrics would ask every few seconds.
--   queued     each level (queue, priority) from its low-water mark (pgjobq.lows): no queued row is
--              behind it (claim.sql), so the dead entries of the jobs claimed before it are not read.
--              Levels come from pgjobq.levels (every enqueue records its own; a row inserted by hand is
--              recorded by the next claim of its queue).
--   running    the rows of leased_now() (below).
--   waiting    every waiting row (workflows only).
CREATE OR REPLACE FUNCTION pgjobq.monitor_queue_counts()
RETURNS TABLE (queue text, due bigint, scheduled bigint, running bigint, waiting bigint, lag_s numeric)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
    WITH queued AS (
        SELECT l.queue, sum(c.due) AS due, sum(c.scheduled) AS scheduled, min(c.first_due) AS first_due
          FROM pgjobq.levels l
          LEFT JOIN LATERAL (SELECT x.key, x.id FROM pgjobq.lows x
                              WHERE x.queue = l.queue AND x.priority = l.priority
                              ORDER BY x.at DESC LIMIT 1) lo ON true
         CROSS JOIN LATERAL (
             SELECT count(*) FILTER (WHERE j.run_at <= now()) AS due,
                    count(*) FILTER (WHERE j.run_at > now()) AS scheduled,
                    min(j.run_at) FILTER (WHERE j.run_at <= now()) AS first_due
               FROM pgjobq.jobs j
              WHERE j.state = 'queued' AND j.queue = l.queue AND j.priority = l.priority
                AND (greatest(j.run_at, j.ready_at), j.id) > (coalesce(lo.key, '-infinity'), coalesce(lo.id, 0))) c
         GROUP BY l.queue),
    running AS (SELECT r.queue, count(*) AS n FROM pgjobq.leased_now() r GROUP BY 1),
    waiting AS (SELECT j.queue::text AS queue, count(*) AS n FROM pgjobq.jobs j
                 WHERE j.state = 'waiting' AND j.pending_parents IS NOT NULL GROUP BY 1)
    SELECT n.queue, coalesce(q.due, 0)::bigint, coalesce(q.scheduled, 0)::bigint, coalesce(r.n, 0),
           coalesce(w.n, 0), extract(epoch FROM now() - q.first_due)
      FROM (SELECT queued.queue FROM queued UNION SELECT running.queue FROM running
            UNION SELECT waiting.queue FROM waiting) n
      LEFT JOIN queued q ON q.queue = n.queue
      LEFT JOIN running r ON r.queue = n.queue
      LEFT JOIN waiting w ON w.queue = n.queue
     WHERE coalesce(q.due, 0) + coalesce(q.scheduled, 0) + coalesce(r.n, 0) + coalesce(w.n, 0) > 0
$$;

-- queue_ready(of_queue): what an autoscaler reads, per queue (docs/deploy.md, "Autoscaling"):
--   ready           queued jobs a claim could take now: due, and claimable (the claim's key,
--                   greatest(run_at, ready_at), reached); a paused queue's too (paused says so);
--   oldest_ready_s  seconds since the oldest of them became claimable (its run_at, or when it was
--                   queued again or its parents finished); NULL when none is ready;
--   running         jobs under a lease that has not ended: what a concurrency limit counts;
--   concurrency     the queue's limit (NULL: none);
--   worker_slots    the slots of the live workers (seen in the last 15 s, not stopped) that serve the
--                   queue, from what each says in its beat ("name:slots,...");
--   paused.
-- With of_queue, one row for it, zeros when it has nothing (a KEDA postgresql trigger wants a query
-- that always answers); without, every queue with a priority level (pgjobq.levels: jobs in the last
-- hour), settings or a live worker, ordered by name.
--
-- Asked every few seconds by a scaler, so it reads only what it counts: per level, one range of
-- jobs_ready_idx from the level's low-water mark (pgjobq.lows, as monitor_queue_counts) up to now,
-- which holds the ready rows and the few running ones claimed past the mark (not the scheduled ones
-- ahead of now, not the history, not the dead entries behind the mark); the running ones through
-- the alarms of their leases (running_jobs, claim.sql); a row per worker.  tests/test_steady.c
-- counts the blocks it reads while 20,000 dead rows are kept.
CREATE OR REPLACE FUNCTION pgjobq.queue_ready(of_queue text DEFAULT NULL)
RETURNS TABLE (queue text, ready bigint, oldest_ready_s double precision, running bigint, concurrency integer,
               worker_slots bigint, paused boolean)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
    WITH slots AS (
        SELECT m[1] AS queue, sum(m[2]::bigint) AS n
          FROM pgjobq.workers w
         CROSS JOIN LATERAL unnest(string_to_array(w.queues, ',')) e
         CROSS JOIN LATERAL regexp_match(e, '^(.+):([0-9]{1,9})$') m
         WHERE w.last_seen > now() - interval '15 seconds' AND w.stopped_at IS NULL
         GROUP BY 1),
    names AS (
        SELECT queue_ready.of_queue AS queue WHERE queue_ready.of_queue IS NOT NULL
        UNION
        SELECT l.queue::text FROM pgjobq.levels l WHERE queue_ready.of_queue IS NULL
        UNION
        SELECT s.name::text FROM pgjobq.queues s WHERE queue_ready.of_queue IS NULL
        UNION
        SELECT sl.queue FROM slots sl WHERE queue_ready.of_queue IS NULL),
    lv AS (
        SELECT l.queue::text AS queue, sum(c.n) AS n, min(c.first) AS first
          FROM pgjobq.levels l
          LEFT JOIN LATERAL (SELECT x.key, x.id FROM pgjobq.lows x
                              WHERE x.queue = l.queue AND x.priority = l.priority
                              ORDER BY x.at DESC LIMIT 1) lo ON true
         CROSS JOIN LATERAL (
             SELECT count(*) AS n, min(greatest(j.run_at, j.ready_at)) AS first
               FROM pgjobq.jobs j
              WHERE j.state = 'queued' AND j.queue = l.queue AND j.priority = l.priority
                AND (greatest(j.run_at, j.ready_at), j.id) > (coalesce(lo.key, '-infinity'), coalesce(lo.id, 0))
                AND greatest(j.run_at, j.ready_at) <= now()) c
         WHERE queue_ready.of_queue IS NULL OR l.queue = queue_ready.of_queue
         GROUP BY 1)
    SELECT n.queue, coalesce(lv.n, 0)::bigint, extract(epoch FROM now() - lv.first)::double precision,
           (SELECT count(*) FROM pgjobq.running_jobs(n.queue) j WHERE j.lease_until > now()),
           s.concurrency, coalesce(sl.n, 0)::bigint, coalesce(s.paused_at IS NOT NULL, false)
      FROM names n
      LEFT JOIN lv ON lv.queue = n.queue
      LEFT JOIN pgjobq.queues s ON s.name = n.queue
      LEFT JOIN slots sl ON sl.queue = n.queue
     ORDER BY 1
$$;

-- monitor_queue_names(): every queue that has settings (pgjobq.queues), and whether it is paused.
CREATE OR REPLACE FUNCTION pgjobq.monitor_queue_names() RETURNS TABLE (queue text, paused boolean)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT q.name::text, q.paused_at IS NOT NULL FROM pgjobq.queues q
$$;

-- monitor_overview(): the dashboard's table of queues: every queue with live jobs, jobs finished in
-- the last hour or settings, whether it is paused, its live counts (monitor_queue_counts) and the
-- jobs completed and failed in the last hour.  Ordered by queue.  The last hour's counts are the
-- tallies the moves to the history wrote (schema 15), not a count of the history: a few rows per
-- statement that finished jobs, where the history holds a row per job (4 s and more a call at 15,000
-- jobs/s).  They count moves: a job finished and then retried by hand was still finished then.
CREATE OR REPLACE FUNCTION pgjobq.monitor_overview()
RETURNS TABLE (queue text, paused boolean, due bigint, scheduled bigint, running bigint, lag_s numeric,
               completed_1h bigint, failed_1h bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH live AS (SELECT * FROM pgjobq.monitor_queue_counts()),
    hour AS (SELECT t.queue, sum(t.n) FILTER (WHERE t.what = 'completed') AS done,
                    sum(t.n) FILTER (WHERE t.what = 'failed') AS failed
               FROM pgjobq.tallies t
              WHERE t.at > now() - interval '1 hour' AND t.what IN ('completed', 'failed') GROUP BY 1),
    settings AS (SELECT * FROM pgjobq.monitor_queue_names()),
    names AS (SELECT l.queue FROM live l UNION SELECT h.queue FROM hour h UNION SELECT s.queue FROM settings s)
    SELECT n.queue, coalesce((SELECT s.paused FROM settings s WHERE s.queue = n.queue), false),
           coalesce(l.due, 0), coalesce(l.scheduled, 0), coalesce(l.running, 0), l.lag_s,
           coalesce(h.done, 0)::bigint, coalesce(h.failed, 0)::bigint
      FROM names n LEFT JOIN live l ON l.queue = n.queue LEFT JOIN hour h ON h.queue = n.queue
     ORDER BY 1
$$;

-- monitor_finished_per_minute(): the jobs finished in the last hour, completed and failed, per minute
-- ago (0: the last minute); minutes without any are left out.  From the tallies, as monitor_overview.
CREATE OR REPLACE FUNCTION pgjobq.monitor_finished_per_minute()
RETURNS TABLE (minutes_ago integer, completed bigint, failed bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT floor(extract(epoch FROM now() - t.at) / 60)::int,
           coalesce(sum(t.n) FILTER (WHERE t.what = 'completed'), 0)::bigint,
           coalesce(sum(t.n) FILTER (WHERE t.what = 'failed'), 0)::bigint
      FROM pgjobq.tallies t
     WHERE t.at > now() - interval '1 hour' AND t.what IN ('completed', 'failed') GROUP BY 1
$$;

-- monitor_failures(max_jobs): the jobs that failed in the last hour, the last first, at most max_jobs.
CREATE OR REPLACE FUNCTION pgjobq.monitor_failures(max_jobs integer)
RETURNS TABLE (id bigint, queue text, kind text, finished_at timestamptz, last_error text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT h.id, h.queue, h.kind, h.finished_at, h.last_error
      FROM pgjobq.history h WHERE h.state = 'failed' AND h.finished_at > now() - interval '1 hour'
     ORDER BY h.finished_at DESC LIMIT monitor_failures.max_jobs
$$;

-- monitor_jobs(of_state, of_queue, of_kind, error_contains, before_id, of_worker, max_jobs): jobs, live and
-- finished, the newest first, at most max_jobs; each filter NULL matches every job.  error_contains is
-- a substring of the last error, without wildcards (its % and _ are matched as such, escaped with !);
-- before_id keeps the jobs with a smaller id (the next page).  PL/pgSQL with EXECUTE: see the top of
-- this section.  The state is compared as pgjobq.job_state, not as text: the history's partitions
-- by state that cannot hold it are then left out (a text comparison walked the whole history, newest
-- first, to list the few queued jobs); a name that is no state matches nothing.  Queued jobs are read
-- as monitor_queue_counts reads them, from each level's low-water mark: not the index entries of the
-- jobs claimed since a snapshot was taken, which vacuum cannot remove while it is held.
CREATE OR REPLACE FUNCTION pgjobq.monitor_jobs(of_state text, of_queue text, of_kind text, error_contains text,
                                               before_id bigint, of_worker text, max_jobs integer)
RETURNS TABLE (id bigint, queue text, kind text, state text, attempt integer, max_attempts integer,
               run_at timestamptz, created_at timestamptz, finished_at timestamptz, worker_id text,
               last_error text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
SET enable_bitmapscan = off
AS $$
DECLARE
    -- Where the jobs come from: all of them, or for queued ones the rows past each level's low-water
    -- mark (the lateral scan is not flattened: the mark must bound the index scan).
    v_from text := CASE WHEN of_state = 'queued' THEN
        $f$(SELECT j.id, l.queue::text AS queue, j.kind::text AS kind, j.state, j.attempt, j.max_attempts, j.run_at, j.created_at,
                   j.finished_at, j.worker_id::text AS worker_id, j.last_error
              FROM pgjobq.levels l
              LEFT JOIN LATERAL (SELECT x.key, x.id FROM pgjobq.lows x
                                  WHERE x.queue = l.queue AND x.priority = l.priority
                                  ORDER BY x.at DESC LIMIT 1) lo ON true
              JOIN LATERAL (SELECT * FROM pgjobq.jobs j
                             WHERE j.state = 'queued' AND j.queue = l.queue AND j.priority = l.priority
                               AND (greatest(j.run_at, j.ready_at), j.id)
                                   > (coalesce(lo.key, '-infinity'), coalesce(lo.id, 0))
                            OFFSET 0) j ON true) a$f$
        ELSE 'pgjobq.all_jobs a' END;
BEGIN
    IF of_state IS NOT NULL AND NOT of_state = ANY (enum_range(NULL::pgjobq.job_state)::text[]) THEN
        RETURN;
    END IF;
    RETURN QUERY EXECUTE
        $q$SELECT a.id, a.queue, a.kind, a.state::text, a.attempt, a.max_attempts, a.run_at, a.created_at,
                  a.finished_at, a.worker_id, a.last_error
             FROM $q$ || v_from || $q$
            WHERE ($1 IS NULL OR a.state = $1) AND ($2::text IS NULL OR a.queue = $2)
              AND ($3::text IS NULL OR a.kind = $3)
              AND ($4::text IS NULL OR a.last_error ILIKE '%' || replace(replace(replace($4, '!', '!!'), '%', '!%'),
                                                                        '_', '!_') || '%' ESCAPE '!')
              AND ($5::bigint IS NULL OR a.id < $5::bigint) AND ($6::text IS NULL OR a.worker_id = $6)
            ORDER BY a.id DESC LIMIT $7::int$q$
        USING monitor_jobs.of_state::pgjobq.job_state, monitor_jobs.of_queue, monitor_jobs.of_kind,
              monitor_jobs.error_contains, monitor_jobs.before_id, monitor_jobs.of_worker, monitor_jobs.max_jobs;
END
$$;

-- monitor_job(job_id): one job, live or finished, with every column but its lease token; no row when there
-- is no such job (it may have been pruned).
-- base_priority: the priority it was enqueued with, when priority aging raised it (NULL: never aged).
-- (Dropped first: schemas 28, 30 and 31 added expires_at, base_priority and traceparent to its result,
-- which CREATE OR REPLACE cannot change; the grant comes back with sql/roles.sql.)
DROP FUNCTION IF EXISTS pgjobq.monitor_job(bigint);
CREATE OR REPLACE FUNCTION pgjobq.monitor_job(job_id bigint)
RETURNS TABLE (id bigint, queue text, kind text, state text, priority smallint, attempt integer,
               max_attempts integer, run_at timestamptz, created_at timestamptz, started_at timestamptz,
               finished_at timestamptz, lease_until timestamptz, worker_id text, unique_key text,
               cancel_requested boolean, payload jsonb, result jsonb, last_error text, tags text[], progress jsonb,
               expires_at timestamptz, base_priority smallint, traceparent text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
    SELECT a.id, a.queue, a.kind, a.state::text, a.priority, a.attempt, a.max_attempts, a.run_at, a.created_at,
           a.started_at, a.finished_at, a.lease_until, a.worker_id, a.unique_key, a.cancel_requested, a.payload,
           a.result, a.last_error, a.tags, a.progress, a.expires_at, a.base_priority, a.traceparent
      FROM pgjobq.all_jobs a WHERE a.id = monitor_job.job_id
$$;

-- job_get(job_id): one job, live or finished, every column but its lease token, as the library and the
-- Python package read it (pgjobq_job_get, pgjobq_job_wait, `pgjobq show`, get, result); no row when
-- there is none (pruned, or never).  PL/pgSQL with a generic plan: planned once per session, where
-- the same statement sent on its own plans an index scan of every partition of the history at each
-- call.  With the caller's rights, which are those to read the jobs (admin, monitor).
-- (Dropped first: CREATE OR REPLACE cannot change a result type, and schemas 28, 30 and 31 added
-- expires_at, base_priority and traceparent, as an early build of 27 lacked the routing key and the
-- rest; the grants come back with sql/roles.sql, applied after these files.)
DROP FUNCTION IF EXISTS pgjobq.job_get(bigint);
CREATE OR REPLACE FUNCTION pgjobq.job_get(job_id bigint)
RETURNS TABLE (id bigint, queue text, kind text, payload jsonb, priority smallint, state text, attempt integer,
               max_attempts integer, run_at timestamptz, created_at timestamptz, started_at timestamptz,
               finished_at timestamptz, lease_until timestamptz, worker_id text, result jsonb, last_error text,
               unique_key text, cancel_requested boolean, tags text[], progress jsonb,
               cancel_requested_at timestamptz, concurrency_key text, cancel_told_at timestamptz, route_key text,
               snoozes integer, expires_at timestamptz, base_priority smallint, traceparent text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT a.id, a.queue::text, a.kind::text, a.payload::jsonb, a.priority, a.state::text, a.attempt, a.max_attempts,
           a.run_at, a.created_at, a.started_at, a.finished_at, a.lease_until, a.worker_id::text, a.result,
           a.last_error, a.unique_key::text, a.cancel_requested, a.tags, a.progress, a.cancel_requested_at,
           a.concurrency_key::text, a.cancel_told_at, a.route_key::text, a.snoozes, a.expires_at,
           a.base_priority, a.traceparent
      FROM pgjobq.all_jobs a WHERE a.id = job_get.job_id;
END
$$;

-- monitor_dead_letters(job_id): a job's dead-letter links (pgjobq.dead_letters): 'of', the job it is the
-- dead letter of (which failed for good in `queue`); 'to', the dead letter it left when it failed for
-- good (made in the dead-letter queue `queue`); each with when, and when it was redriven.  The job
-- page of the dashboard shows them.
CREATE OR REPLACE FUNCTION pgjobq.monitor_dead_letters(job_id bigint)
RETURNS TABLE (relation text, id bigint, queue text, at timestamptz, redriven_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 'of', d.original_id, d.original_queue::text, d.at, d.redriven_at
      FROM pgjobq.dead_letters d WHERE d.id = monitor_dead_letters.job_id
    UNION ALL
    SELECT 'to', d.id, d.queue::text, d.at, d.redriven_at
      FROM pgjobq.dead_letters d WHERE d.original_id = monitor_dead_letters.job_id
$$;

-- monitor_workers(after_state, after_id, max_rows): the workers seen in the last hour: state 'running'
-- when seen in the last 15 seconds (three beats) and not stopped, 'stopped' when it stopped cleanly
-- (stopped_at), else 'gone'; and the jobs each runs now (leased_now()).  Not their secret.  In pages:
-- running first, then stopped, then gone, each by id; after_state and after_id (both, or neither) are
-- the last row of the page before, max_rows the size of a page (NULL: every row).
CREATE OR REPLACE FUNCTION pgjobq.monitor_workers(after_state text DEFAULT NULL, after_id text DEFAULT NULL,
                                                  max_rows integer DEFAULT NULL)
RETURNS TABLE (id text, host text, pid integer, queues text, version text, started_at timestamptz,
               last_seen timestamptz, alive boolean, jobs bigint, stopped_at timestamptz, state text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT w.id, w.host, w.pid, w.queues, w.version, w.started_at, w.last_seen, w.state = 'running',
           coalesce(r.n, 0), w.stopped_at, w.state
      FROM (SELECT w.*, CASE WHEN w.stopped_at IS NOT NULL THEN 'stopped'
                             WHEN w.last_seen > now() - interval '15 seconds' THEN 'running'
                             ELSE 'gone' END AS state
              FROM pgjobq.workers w WHERE w.last_seen > now() - interval '1 hour') w
      LEFT JOIN (SELECT r.worker_id AS id, count(*) AS n FROM pgjobq.leased_now() r GROUP BY 1) r ON r.id = w.id
     WHERE monitor_workers.after_id IS NULL
        OR (array_position(ARRAY['running', 'stopped', 'gone'], w.state), w.id)
           > (coalesce(array_position(ARRAY['running', 'stopped', 'gone'], monitor_workers.after_state), 0),
              monitor_workers.after_id)
     ORDER BY array_position(ARRAY['running', 'stopped', 'gone'], w.state), w.id
     LIMIT monitor_workers.max_rows
$$;

-- monitor_unhealthy_workers(): the live workers (seen in the last 15 seconds, not stopped) that claim nothing because
-- they cannot run jobs (pgjobq_worker_set_unhealthy: a coprocess that cannot start), with why and since
-- when, oldest first.  `pgjobq health` and the dashboard show them.
CREATE OR REPLACE FUNCTION pgjobq.monitor_unhealthy_workers()
RETURNS TABLE (id text, host text, pid integer, queues text, reason text, since timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT w.id, w.host, w.pid, w.queues, w.unhealthy, w.unhealthy_since
      FROM pgjobq.workers w
     WHERE w.unhealthy IS NOT NULL AND w.last_seen > now() - interval '15 seconds' AND w.stopped_at IS NULL
     ORDER BY w.unhealthy_since, w.id
$$;

-- monitor_finished(since, upto, bounds): the jobs that reached the history in (since, upto], per queue
-- and state, with how long they waited (started_at - run_at) and ran (finished_at - started_at) put in
-- buckets: bounds are the histogram's bounds in seconds, negated and ascending, and a bucket column is
-- width_bucket of the negated time over them (how many bounds hold the time; NULL for a job that never
-- started).  jobs counts all, started those that started; wait_s and run_s are the sums.  The finished_at
-- index (BRIN on the hourly partitions) keeps a window of a few seconds cheap.  EXECUTE: see above.
CREATE OR REPLACE FUNCTION pgjobq.monitor_finished(since timestamptz, upto timestamptz, bounds float8[])
RETURNS TABLE (queue text, state text, wait_bucket integer, run_bucket integer, jobs bigint, started bigint,
               wait_s numeric, run_s numeric)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY EXECUTE
        $q$SELECT h.queue, h.state::text,
                  width_bucket(-extract(epoch FROM h.started_at - h.run_at)::float8, $3),
                  width_bucket(-extract(epoch FROM h.finished_at - h.started_at)::float8, $3),
                  count(*), count(h.started_at),
                  coalesce(sum(greatest(extract(epoch FROM h.started_at - h.run_at), 0)), 0),
                  coalesce(sum(greatest(extract(epoch FROM h.finished_at - h.started_at), 0)), 0)
             FROM pgjobq.history h WHERE h.finished_at > $1 AND h.finished_at <= $2
            GROUP BY 1, 2, 3, 4$q$
        USING monitor_finished.since, monitor_finished.upto, monitor_finished.bounds;
END
$$;

-- monitor_tallies(since, upto): the retries and lost leases (pgjobq.tallies) of (since, upto], per
-- queue and what ('retried', 'lost').
CREATE OR REPLACE FUNCTION pgjobq.monitor_tallies(since timestamptz, upto timestamptz)
RETURNS TABLE (queue text, what text, n numeric)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY EXECUTE
        $q$SELECT t.queue, t.what, sum(t.n) FROM pgjobq.tallies t
            WHERE t.at > $1 AND t.at <= $2 AND t.what IN ('retried', 'lost') GROUP BY 1, 2$q$
        USING monitor_tallies.since, monitor_tallies.upto;
END
$$;

-- monitor_history_counts(): the finished jobs the history holds, per queue and state (a scan of it).
CREATE OR REPLACE FUNCTION pgjobq.monitor_history_counts() RETURNS TABLE (queue text, state text, jobs bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT h.queue, h.state::text, count(*) FROM pgjobq.history h GROUP BY 1, 2
$$;

-- monitor_run(first_id, last_id): what happened to the jobs first_id..last_id (a run of `pgjobq demo`,
-- which enqueues them together): how many completed and failed, the pickup latency of their first
-- attempts (started_at - created_at, both by the database clock) at the median and the 99th
-- percentile in milliseconds (NULL without any), and how many ended after 1, 2 and 3 attempts.
CREATE OR REPLACE FUNCTION pgjobq.monitor_run(first_id bigint, last_id bigint)
RETURNS TABLE (completed bigint, failed bigint, pickup_p50_ms double precision, pickup_p99_ms double precision,
               attempts_1 bigint, attempts_2 bigint, attempts_3 bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT count(*) FILTER (WHERE a.state = 'completed'), count(*) FILTER (WHERE a.state = 'failed'),
           percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM a.started_at - a.created_at))
               FILTER (WHERE a.attempt = 1) * 1000,
           percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM a.started_at - a.created_at))
               FILTER (WHERE a.attempt = 1) * 1000,
           count(*) FILTER (WHERE a.attempt = 1), count(*) FILTER (WHERE a.attempt = 2),
           count(*) FILTER (WHERE a.attempt = 3)
      FROM pgjobq.all_jobs a WHERE a.id BETWEEN monitor_run.first_id AND monitor_run.last_id
$$;

-- monitor_queue_live(queue): how many jobs of the queue are live (queued, waiting or running),
-- counted through jobs_ready_idx, which skips the dead versions of finished jobs that a scan of the
-- table would read.
CREATE OR REPLACE FUNCTION pgjobq.monitor_queue_live(queue text) RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n bigint;
BEGIN
    -- Every row of pgjobq.jobs is live (waiting, queued or running), and jobs_ready_idx holds them all.
    EXECUTE $q$SELECT count(*) FROM pgjobq.jobs j WHERE j.queue = $1$q$
        INTO v_n USING monitor_queue_live.queue;
    RETURN v_n;
END
$$;

-- monitor_queue_drained(queue): true once the queue has no live job.  What a benchmark polls to see a
-- queue drain, so it must not load the server it measures: it stops at the queue's first live job in
-- jobs_ready_idx (monitor_queue_live counts them all: 6 ms a call at the start of a 50,000-job drain,
-- which polled every 50 ms took 7% of two cores from the drain it measured).
CREATE OR REPLACE FUNCTION pgjobq.monitor_queue_drained(queue text) RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    -- Static SQL: its plan is kept from call to call (one plan suits every queue here).
    RETURN NOT EXISTS (SELECT FROM pgjobq.jobs j WHERE j.queue = monitor_queue_drained.queue);
END
$$;

-- monitor_queue_first_live(queue, from_id): the smallest id at or above from_id of a live job of the
-- queue, 0 when there is none.  For a benchmark that enqueued all its jobs before it polls: it passes
-- each answer back as the next from_id (a job below the first live one has finished and does not come
-- back), so each poll walks only the index entries of the jobs that finished since the previous one.
-- monitor_queue_drained walks every finished job's dead entries from the head at each call: 8 ms a
-- poll late in a 100,000-job drain, polled every 20 ms 14% of the two cores the drain had.
CREATE OR REPLACE FUNCTION pgjobq.monitor_queue_first_live(queue text, from_id bigint) RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
BEGIN
    -- The walk is by id alone, the queue filtered after it (OFFSET 0): with the queue beside the id,
    -- jobs_ready_idx could serve it, reading and sorting the queue's whole range at each poll.
    RETURN coalesce((SELECT x.id
                       FROM (SELECT j.id, j.queue FROM pgjobq.jobs j
                              WHERE j.id >= monitor_queue_first_live.from_id ORDER BY j.id OFFSET 0) x
                      WHERE x.queue = monitor_queue_first_live.queue
                      ORDER BY x.id LIMIT 1), 0);
END
$$;

-- monitor_last_id(): the greatest id of any job, live or finished, 0 without any: the jobs enqueued
-- after this call have greater ones.
CREATE OR REPLACE FUNCTION pgjobq.monitor_last_id() RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(max(a.id), 0) FROM pgjobq.all_jobs a
$$;

-- monitor_latency(queue, after_id): how long the queue's jobs with an id above after_id that started
-- waited from their creation to their (last) start, both by the database clock, in milliseconds: the
-- median, the 95th and 99th percentiles and the longest (NULL without any).  EXECUTE: see above.
CREATE OR REPLACE FUNCTION pgjobq.monitor_latency(queue text, after_id bigint)
RETURNS TABLE (p50_ms double precision, p95_ms double precision, p99_ms double precision, max_ms double precision)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY EXECUTE
        $q$SELECT p[1], p[2], p[3], m
             FROM (SELECT percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP
                              (ORDER BY extract(epoch FROM a.started_at - a.created_at) * 1000) AS p,
                          (max(extract(epoch FROM a.started_at - a.created_at)) * 1000)::float8 AS m
                     FROM pgjobq.all_jobs a WHERE a.queue = $1 AND a.id > $2 AND a.started_at IS NOT NULL) s$q$
        USING monitor_latency.queue, monitor_latency.after_id;
END
$$;

-- monitor_pickup_lag(queue, after_id): the pickup lag of the queue's jobs with an id above after_id that
-- finished in the last minute: from when each was due (run_at, or its creation if that was later) to
-- its start, in milliseconds, the median and the 99th percentile (NULL without any).  Jobs scheduled
-- more than an hour after their creation are left out (their lag says nothing of the workers).
CREATE OR REPLACE FUNCTION pgjobq.monitor_pickup_lag(queue text, after_id bigint)
RETURNS TABLE (p50_ms double precision, p99_ms double precision)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY EXECUTE
        $q$SELECT p[1], p[2]
             FROM (SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP
                              (ORDER BY extract(epoch FROM h.started_at - greatest(h.run_at, h.created_at)) * 1000) AS p
                     FROM pgjobq.history h
                    WHERE h.queue = $1 AND h.id > $2 AND h.finished_at > now() - interval '60 s'
                      AND h.run_at <= h.created_at + interval '1 hour') s$q$
        USING monitor_pickup_lag.queue, monitor_pickup_lag.after_id;
END
$$;

-- monitor_storage(): the storage of the jobs, from the statistics (estimates): the live table with its
-- indexes and TOAST (and its partitions, if it has any), its live and dead rows, its vacuums (manual
-- and auto) and autovacuums, and the size of every partition of the history.  What the benchmarks
-- sample; health() says what holds vacuum back.
CREATE OR REPLACE FUNCTION pgjobq.monitor_storage()
RETURNS TABLE (jobs_bytes bigint, jobs_live bigint, jobs_dead bigint, jobs_vacuums bigint, jobs_autovacuums bigint,
               history_bytes bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0)::bigint, coalesce(sum(s.n_live_tup), 0)::bigint,
           coalesce(sum(s.n_dead_tup), 0)::bigint, coalesce(sum(s.autovacuum_count + s.vacuum_count), 0)::bigint,
           coalesce(sum(s.autovacuum_count), 0)::bigint,
           (SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c
             WHERE c.relnamespace = 'pgjobq'::regnamespace AND c.relkind = 'r' AND c.relname LIKE 'history%')
      FROM (SELECT 'pgjobq.jobs'::regclass AS relid UNION
            SELECT p.relid FROM pg_partition_tree('pgjobq.jobs') p WHERE p.isleaf) t
      LEFT JOIN pg_stat_user_tables s ON s.relid = t.relid
$$;
