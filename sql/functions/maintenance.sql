-- pgjobq functions: maintenance that every worker runs: rescuing expired leases, and retention (the
-- hourly partitions of pgjobq.history_done).
--
-- Applied by `pgjobq migrate` with the other files of sql/functions (docs/hacking.md): each function
-- is defined once, here, as it is now.

-- rescue_expired(max_jobs, since): jobs whose lease ended without a completion (the worker crashed,
-- stalled or lost its connection) go back to queued, or end failed when no attempts remain, or
-- cancelled when that was requested (both move to history, and their waiting children are cancelled
-- or run, as they asked; one that ends failed leaves a copy in its queue's dead-letter queue:
-- dead_letter_send in transitions.sql).  Each is counted as 'lost' in pgjobq.tallies.  The writes re-check the state
-- and the lease, so a job completed meanwhile is never touched.  At most max_jobs per call; returns
-- how many were rescued.  Every call also sweeps the jobs that expired while queued (expire_queued,
-- below), and raises the priority of the jobs that waited long in a queue with priority aging
-- (age_priorities, below): the pass every worker runs each second, and pgjobq_rescue_expired's
-- callers, do all three.
--
-- The leases come from their alarms (pgjobq.lease_alarms, sql/033_hot_claim.sql: a row per claim,
-- due 5 seconds after it or at its lease's end if sooner).  A call takes the alarms that are due (FOR
-- UPDATE SKIP LOCKED: callers that run together take different ones), up to max_jobs alarms (a
-- claim's each: a call looks at far more jobs than it rescues, since most of them have finished),
-- and deletes them.  Of their jobs, those still running under the alarm's token whose lease
-- (lease_until, which heartbeats move) has ended are rescued, up to max_jobs; those still running
-- under it afterwards (a heartbeat renewed the lease, the row was locked by a completion in flight,
-- or past max_jobs) get a new alarm at their lease's end, or now if that has passed; the others
-- (completed, retried, claimed again, which armed its own alarm) are forgotten.
-- So every running job keeps an alarm, in the same transaction that removed its last one.
--
-- since: look only at the alarms due at or after it, queue by queue, so that the call steps over the
-- dead index entries of recent alarms only (a worker passes a little before its previous call's
-- now(), and now and then NULL).  NULL: every due alarm.
CREATE OR REPLACE FUNCTION pgjobq.rescue_expired(max_jobs integer DEFAULT 1000, since timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_final   bigint[];
    v_requeue bigint[];
    v_due     text[];
    v_kids    bigint[];
    v_cand    bigint[];
    v_alarms  tid[];
    v_ids     bigint[];
    v_tokens  bigint[];
BEGIN
    PERFORM pgjobq.expire_queued(rescue_expired.max_jobs);
    PERFORM pgjobq.age_priorities(rescue_expired.max_jobs);
    -- The due alarms, locked, and their jobs, in one statement (accumulated row by row in a loop, the
    -- arrays were copied at each row: a rescue pass of 40 workers' small claims took 50 s).
    WITH due AS MATERIALIZED (
        SELECT a.ctid AS at, a.ids, a.tokens
          FROM (SELECT DISTINCT l.queue FROM pgjobq.levels l
                 WHERE rescue_expired.since IS NOT NULL
                UNION
                SELECT DISTINCT x.queue FROM pgjobq.lease_alarms x
                 WHERE rescue_expired.since IS NULL) q
         CROSS JOIN LATERAL (SELECT y.ctid, y.ids, y.tokens FROM pgjobq.lease_alarms y
                              WHERE y.queue = q.queue AND y.until < now()
                                AND y.until >= coalesce(rescue_expired.since, '-infinity')
                              ORDER BY y.until
                              LIMIT rescue_expired.max_jobs
                                FOR UPDATE SKIP LOCKED) a
         LIMIT rescue_expired.max_jobs)
    SELECT (SELECT array_agg(d.at) FROM due d), x.ids, x.tokens
      INTO v_alarms, v_ids, v_tokens
      FROM (SELECT array_agg(r.id) AS ids, array_agg(r.token) AS tokens
              FROM due d CROSS JOIN LATERAL unnest(d.ids, d.tokens) AS r(id, token)) x;
    IF v_alarms IS NULL THEN
        RETURN 0;
    END IF;
    DELETE FROM pgjobq.lease_alarms a WHERE a.ctid = ANY (v_alarms);
    -- Of the alarms' jobs, those still running under the alarm's token (most have finished: an alarm
    -- is due a few seconds after its claim); of those, the ones whose lease has ended.  Each job is
    -- looked up by its id (OFFSET 0: a probe of the primary key per id, whatever the statistics say;
    -- a join the planner chose read the whole table, or compared every row with every id).
    SELECT array_agg(x.id), array_agg(x.lease_token),
           (array_agg(x.id) FILTER (WHERE x.lease_until < now()))[1:rescue_expired.max_jobs]
      INTO v_ids, v_tokens, v_cand
      FROM unnest(v_ids, v_tokens) AS r(id, token)
     CROSS JOIN LATERAL (SELECT j.id, j.lease_token, j.lease_until FROM pgjobq.jobs j
                          WHERE j.id = r.id AND j.lease_token = r.token AND j.state = 'running'
                         OFFSET 0) x;
    -- Lock them (skipping rows others hold) and decide from their latest versions.
    SELECT array_agg(e.id) FILTER (WHERE e.final), array_agg(e.id) FILTER (WHERE NOT e.final),
           array_agg(e.id) FILTER (WHERE e.final AND e.has_children)
      INTO v_final, v_requeue, v_kids
      FROM (SELECT j.id, j.cancel_requested OR j.attempt >= j.max_attempts AS final, j.has_children
              FROM pgjobq.jobs j
             WHERE j.id = ANY (v_cand) AND j.state = 'running' AND j.lease_until < now()
               FOR UPDATE SKIP LOCKED) e;
    IF v_final IS NOT NULL OR v_requeue IS NOT NULL THEN
        INSERT INTO pgjobq.tallies (queue, what, n)
        SELECT j.queue, 'lost', count(*) FROM pgjobq.jobs j
         WHERE j.id = ANY (v_final) OR j.id = ANY (v_requeue) GROUP BY j.queue;
    END IF;
    IF v_final IS NOT NULL THEN
        PERFORM pgjobq.dead_letter_send(v_final,
            ARRAY(SELECT format('lease expired at %s: worker %s stopped renewing it (crashed, stalled or lost its '
                                'connection)', j.lease_until, coalesce(j.worker_id, '?'))
                    FROM unnest(v_final) WITH ORDINALITY AS f(id, o) JOIN pgjobq.jobs j ON j.id = f.id
                   ORDER BY f.o));
        PERFORM pgjobq.sequence_block(v_final);
        WITH gone AS (DELETE FROM pgjobq.jobs j WHERE j.id = ANY (v_final) RETURNING j.*),
        moved AS (
            INSERT INTO pgjobq.history (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at,
                                        created_at, started_at, finished_at, lease_token, worker_id, result,
                                        last_error, unique_key, cancel_requested, tags, progress, concurrency_key,
                                        cancel_requested_at, cancel_told_at, route_key, snoozes, expires_at, base_priority, traceparent)
            SELECT g.id, g.queue, g.kind, g.payload, g.priority,
                   CASE WHEN g.cancel_requested THEN 'cancelled'::pgjobq.job_state ELSE 'failed'::pgjobq.job_state END,
                   g.attempt, g.max_attempts, g.run_at, g.created_at, g.started_at, now(), g.lease_token, g.worker_id,
                   g.result,
                   format('lease expired at %s: worker %s stopped renewing it (crashed, stalled or lost its connection)',
                          g.lease_until, coalesce(g.worker_id, '?')),
                   g.unique_key, g.cancel_requested, g.tags, g.progress, g.concurrency_key, g.cancel_requested_at,
                   g.cancel_told_at, g.route_key, g.snoozes, g.expires_at, g.base_priority, g.traceparent
              FROM gone g
            RETURNING pgjobq.history.queue, pgjobq.history.state)
        INSERT INTO pgjobq.tallies (queue, what, n) SELECT m.queue, m.state::text, count(*) FROM moved m GROUP BY 1, 2;
    END IF;
    IF v_requeue IS NOT NULL THEN
        WITH requeued AS (
            UPDATE pgjobq.jobs j
               SET state = 'queued', run_at = now(), lease_until = NULL,
                   last_error = format('lease expired at %s: worker %s stopped renewing it (crashed, stalled '
                                       'or lost its connection)', j.lease_until, coalesce(j.worker_id, '?'))
             WHERE j.id = ANY (v_requeue)
            RETURNING j.queue::text AS queue)
        SELECT array_agg(DISTINCT requeued.queue) INTO v_due FROM requeued;
        PERFORM pgjobq.notify(v_due);
    END IF;
    IF v_kids IS NOT NULL THEN
        PERFORM pgjobq.children_release(v_kids, array_fill(false, ARRAY[cardinality(v_kids)]));
    END IF;
    -- The alarms again, for the jobs of the alarms taken that still run under their token: in a new
    -- statement, which sees what the writes above left (and every write committed since).  A job that
    -- was not running under its alarm's token above never will be again: a claim draws a new token.
    INSERT INTO pgjobq.lease_alarms (queue, until, ids, tokens)
    SELECT x.queue, greatest(min(x.lease_until), now()), array_agg(x.id), array_agg(x.lease_token)
      FROM unnest(v_ids, v_tokens) AS r(id, token)
     CROSS JOIN LATERAL (SELECT j.queue, j.id, j.lease_token, j.lease_until FROM pgjobq.jobs j
                          WHERE j.id = r.id AND j.lease_token = r.token AND j.state = 'running'
                         OFFSET 0) x
     GROUP BY x.queue;
    RETURN coalesce(cardinality(v_final), 0) + coalesce(cardinality(v_requeue), 0);
END
$$;

-- expire_queued(max_jobs): the jobs that were still waiting or queued when their expires_at passed
-- (docs/queues.md, "Expiry") end cancelled, with last_error 'expired: ...', as a cancel by hand would
-- end them (history_move_cancelled: their waiting children are cancelled or run, as they asked; no
-- dead letter: the job did not fail).  Claims step over such jobs already (claim.sql); this moves them
-- out of the queue.  Each row is locked (SKIP LOCKED: one a claim holds at this instant is the
-- claim's) and the conditions are checked again on its latest version, so a job a claim started
-- meanwhile, or one retried by hand (which clears its expiry), stays.  At most max_jobs a call, found
-- on jobs_expiry_idx (empty when no job has an expiry); returns how many ended.
CREATE OR REPLACE FUNCTION pgjobq.expire_queued(max_jobs integer DEFAULT 1000) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_ids bigint[];
BEGIN
    v_ids := ARRAY(SELECT j.id FROM pgjobq.jobs j
                    WHERE j.expires_at IS NOT NULL AND j.state IN ('waiting', 'queued') AND j.expires_at <= now()
                    ORDER BY j.expires_at
                    LIMIT expire_queued.max_jobs
                      FOR UPDATE SKIP LOCKED);
    IF cardinality(v_ids) = 0 THEN
        RETURN 0;
    END IF;
    RETURN pgjobq.history_move_cancelled(v_ids, 'expired: not started by its expires_at');
END
$$;

-- age_priorities(max_jobs): priority aging (docs/queues.md, "Priority aging"; Oban Pro's
-- Reprioritizer).  In a queue whose priority_aging is set, a queued job that has been ready at its
-- priority for that long (greatest(run_at, ready_at), the claim's own key, at least priority_aging
-- ago) is raised one step: its priority number lowered by 1, never below -100 (the best the jobs
-- table allows), its first priority kept in base_priority.  Returns how many were raised; at most
-- max_jobs a call.
--
-- The claim is not touched, on or off: a raised job is, to the claims, a job that became claimable
-- now at its new priority.  Its ready_at is the clock read after this transaction has its id (as the
-- trigger jobs_ready_stamp stamps a retried job), so no claimer's cursor or frontier at the new level
-- is past it (docs/design.md, "The claim's cursor"), and the level is recorded (levels_record, not
-- strict: past levels_max() the claims find it by themselves each second).  That stamp is also what
-- makes the next step come one further interval later: the wait is counted at each priority.
--
-- Each level of an aging queue is read on jobs_ready_idx from its low-water mark (pgjobq.lows: no
-- claimable row is behind it) to the keys old enough, so a pass steps only over what was claimed at
-- that level since the mark last moved.  Each row is locked with SKIP LOCKED (one a claim holds at
-- this instant is the claim's: aging never waits for a claim, and a claim, which skips locked rows,
-- never waits for aging) and the conditions are checked again on its latest version: a job claimed,
-- finished, retried or raised by another pass meanwhile is left.  Without any queue that ages, one
-- probe of pgjobq.queues.
CREATE OR REPLACE FUNCTION pgjobq.age_priorities(max_jobs integer DEFAULT 1000) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
SET enable_seqscan = off
AS $$
DECLARE
    v_ids    bigint[];
    v_queues text[];
    v_prios  smallint[];
BEGIN
    IF max_jobs IS NULL OR max_jobs < 1 THEN
        RAISE EXCEPTION 'pgjobq.age_priorities: max_jobs must be positive' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pgjobq.queues q WHERE q.priority_aging IS NOT NULL) THEN
        RETURN 0;
    END IF;
    v_ids := ARRAY(
        SELECT c.id
          FROM pgjobq.queues q
          JOIN pgjobq.levels l ON l.queue = q.name::text AND l.priority > -100
          LEFT JOIN LATERAL (SELECT x.key, x.id FROM pgjobq.lows x
                              WHERE x.queue = l.queue AND x.priority = l.priority
                              ORDER BY x.at DESC LIMIT 1) lo ON true
          CROSS JOIN LATERAL (
              SELECT j.id FROM pgjobq.jobs j
               WHERE j.state = 'queued' AND j.queue = l.queue AND j.priority = l.priority
                 AND (greatest(j.run_at, j.ready_at), j.id) > (coalesce(lo.key, '-infinity'), coalesce(lo.id, 0))
                 AND greatest(j.run_at, j.ready_at) <= now() - q.priority_aging
               ORDER BY greatest(j.run_at, j.ready_at), j.id
               LIMIT age_priorities.max_jobs) c
         WHERE q.priority_aging IS NOT NULL
         LIMIT age_priorities.max_jobs);
    IF cardinality(v_ids) = 0 THEN
        RETURN 0;
    END IF;
    -- The new key is read after this transaction has its id (claim.sql).
    PERFORM pg_current_xact_id();
    WITH locked AS (
        -- By id alone (the queue's setting read per row): with a join on the queue, jobs_ready_idx
        -- could serve it, walking the queue's aged range for each id.
        SELECT j.id FROM pgjobq.jobs j
         WHERE j.id = ANY (v_ids) AND j.state = 'queued' AND j.priority > -100
           AND greatest(j.run_at, j.ready_at)
               <= now() - (SELECT q.priority_aging FROM pgjobq.queues q WHERE q.name = j.queue)
           FOR UPDATE OF j SKIP LOCKED),
    raised AS (
        UPDATE pgjobq.jobs j
           SET priority = j.priority - 1, base_priority = coalesce(j.base_priority, j.priority),
               ready_at = clock_timestamp()
          FROM locked
         WHERE j.id = locked.id
        RETURNING j.queue::text AS queue, j.priority)
    SELECT array_agg(r.queue), array_agg(r.priority) INTO v_queues, v_prios FROM raised r;
    IF v_queues IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM pgjobq.levels_record(v_queues, v_prios, false);
    RETURN cardinality(v_queues);
END
$$;

-- history_partition_create(hour): creates the partition of completed and cancelled jobs that
-- finished in the hour starting at `hour` (UTC hours), unless it exists.  Returns true if it created
-- one.  Partitions are named history_pYYYYMMDDHH (UTC).  The table is made first and attached
-- then, which takes a SHARE UPDATE EXCLUSIVE lock on pgjobq.history_done (CREATE TABLE ... PARTITION
-- OF would take ACCESS EXCLUSIVE: completions, and pg_dump's ACCESS SHARE, would queue with it) and
-- ACCESS EXCLUSIVE on the default partition, which attaching scans: the caller sets a short
-- lock_timeout and tries again later rather than wait.
CREATE OR REPLACE FUNCTION pgjobq.history_partition_create(hour timestamptz) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_from timestamptz := date_trunc('hour', hour, 'UTC');
    v_name text := 'history_p' || to_char(date_trunc('hour', hour, 'UTC') AT TIME ZONE 'UTC', 'YYYYMMDDHH24');
BEGIN
    IF EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = 'pgjobq' AND c.relname = v_name) THEN
        RETURN false;
    END IF;
    -- Bounds as ISO text in UTC, whatever the caller's DateStyle and TimeZone.  Attaching creates the
    -- partition's indexes from the parent's.
    EXECUTE format('CREATE TABLE pgjobq.%I (LIKE pgjobq.history_done INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                   v_name);
    EXECUTE format('ALTER TABLE pgjobq.history_done ATTACH PARTITION pgjobq.%I FOR VALUES FROM (%L) TO (%L)',
                   v_name, to_char(v_from AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || '+00',
                   to_char((v_from + interval '1 hour') AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || '+00');
    RETURN true;
END
$$;

-- prune: retention.  completed_age and failed_age NULL (the defaults): the retention configured in
-- pgjobq.retention (24 hours and 7 days unless retention_set changed it), which is what a worker's
-- maintenance passes unless it was given its own.  Ages shorter than the configured ones need the
-- caller to be a member of pgjobq_admin (or of the schema's owner: caller_is_admin): otherwise any
-- worker role could erase all history (prune('0s', '0s')).  42501 then.
-- Completed and cancelled jobs are removed an hour at a time: the partition of an
-- hour is dropped once the whole hour (the partition's end) is older than completed_age (so a job is
-- kept at least completed_age and at most an hour longer), without a DELETE or a VACUUM.  Failed jobs
-- older than failed_age, and rows in the default partition older than their age, are deleted, at most
-- max_jobs per call.  Parents that a waiting job still waits on outlive their age: a partition that
-- holds one is detached, they move to the default partition (no partition covers their hour any
-- more), and the rest goes with the partition.  Edges (pgjobq.deps) whose child is gone are deleted
-- once older than the shorter retention.  Also creates the partitions of the next 48 hours (only
-- future hours: the default partition cannot hold their rows).  DDL waits at most 100 ms for its lock
-- (completions need the same lock) and is otherwise left for the next call.  Returns how many jobs
-- were removed (a dropped partition counts its estimated rows from the statistics, or counts them
-- when it was never analyzed); call again while it returns max_jobs or more.  Also reclaims the levels of
-- queues that have had no job for an hour (levels_reclaim), and forgets the outbox's jobs forwarded
-- here more than 30 days ago (forwarded_prune, outbox.sql), and the waits of sessions gone (await.sql).
-- The steps and parks of the jobs it removes go with them, and events older than event_retention()
-- (steps.sql).
CREATE OR REPLACE FUNCTION pgjobq.prune(
    completed_age interval DEFAULT NULL,
    failed_age    interval DEFAULT NULL,
    max_jobs      integer  DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_count   integer := 0;
    v_n       integer;
    v_part    record;
    v_keep    bigint[];
    v_gone    bigint[];
    v_created integer := 0;
    v_ret     pgjobq.retention%ROWTYPE;
BEGIN
    SELECT r.* INTO v_ret FROM pgjobq.retention r;
    v_ret.completed := coalesce(v_ret.completed, interval '24 hours');
    v_ret.failed := coalesce(v_ret.failed, interval '7 days');
    completed_age := coalesce(completed_age, v_ret.completed);
    failed_age := coalesce(failed_age, v_ret.failed);
    IF completed_age < interval '0' OR failed_age < interval '0' THEN
        RAISE EXCEPTION 'pgjobq.prune: ages must not be negative' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (completed_age < v_ret.completed OR failed_age < v_ret.failed) AND NOT pgjobq.caller_is_admin() THEN
        RAISE EXCEPTION 'pgjobq.prune: keeping completed jobs % and failed ones % is shorter than the configured retention (% and %)',
            completed_age, failed_age, v_ret.completed, v_ret.failed
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Pruning below it needs pgjobq_admin; pgjobq.retention_set() changes the retention.';
    END IF;
    FOR v_part IN
        SELECT c.relname, c.reltuples
          FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = 'pgjobq.history_done'::regclass AND c.relname ~ '^history_p[0-9]{10}$'
           AND make_timestamp(substr(c.relname, 10, 4)::integer, substr(c.relname, 14, 2)::integer,
                              substr(c.relname, 16, 2)::integer, substr(c.relname, 18, 2)::integer, 0, 0)
               AT TIME ZONE 'UTC' + interval '1 hour' <= now() - prune.completed_age
         ORDER BY c.relname
    LOOP
        BEGIN
            IF v_part.reltuples >= 0 THEN
                v_n := v_part.reltuples;
            ELSE
                EXECUTE format('SELECT count(*) FROM pgjobq.%I', v_part.relname) INTO v_n;
            END IF;
            -- Parents that a waiting job still waits on outlive their hour: the partition is detached,
            -- they move to the default partition (no partition covers their hour any more), and the
            -- rest goes with the partition.
            EXECUTE format('SELECT array_agg(p.id) FROM pgjobq.%I p WHERE p.id IN (SELECT d.parent'
                           ' FROM pgjobq.jobs c JOIN pgjobq.deps d ON d.child = c.id WHERE c.state = ''waiting'')',
                           v_part.relname) INTO v_keep;
            IF v_keep IS NOT NULL THEN
                EXECUTE format('ALTER TABLE pgjobq.history_done DETACH PARTITION pgjobq.%I', v_part.relname);
                EXECUTE format('INSERT INTO pgjobq.history SELECT * FROM pgjobq.%I p WHERE p.id = ANY ($1)',
                               v_part.relname) USING v_keep;
                v_n := greatest(v_n - cardinality(v_keep), 0);
            END IF;
            -- The steps and parks of its jobs go with them (steps.sql), joined to the partition: only
            -- while some job has any.
            IF EXISTS (SELECT FROM pgjobq.job_steps) OR EXISTS (SELECT FROM pgjobq.job_parks) THEN
                EXECUTE format('DELETE FROM pgjobq.job_steps s USING pgjobq.%I p'
                               ' WHERE s.job_id = p.id AND p.id <> ALL ($1)', v_part.relname)
                    USING coalesce(v_keep, '{}');
                EXECUTE format('DELETE FROM pgjobq.job_parks s USING pgjobq.%I p'
                               ' WHERE s.job_id = p.id AND p.id <> ALL ($1)', v_part.relname)
                    USING coalesce(v_keep, '{}');
            END IF;
            EXECUTE format('DROP TABLE pgjobq.%I', v_part.relname);
            v_count := v_count + v_n;
        EXCEPTION WHEN lock_not_available THEN
            EXIT; -- busy: the next call tries again
        END;
    END LOOP;
    FOR h IN 1 .. 48 LOOP
        BEGIN
            IF pgjobq.history_partition_create(now() + make_interval(hours => h)) THEN
                v_created := v_created + 1;
            END IF;
        EXCEPTION WHEN lock_not_available OR duplicate_table OR check_violation THEN
            EXIT;
        END;
    END LOOP;
    WITH old AS MATERIALIZED (
        SELECT h.id FROM pgjobq.history_failed h WHERE h.finished_at < now() - prune.failed_age
           AND NOT EXISTS (SELECT 1 FROM pgjobq.deps d JOIN pgjobq.jobs c ON c.id = d.child AND c.state = 'waiting'
                            WHERE d.parent = h.id)
         LIMIT prune.max_jobs FOR UPDATE OF h SKIP LOCKED),
    gone AS (
        DELETE FROM pgjobq.history_failed h WHERE h.id = ANY (ARRAY(SELECT old.id FROM old))
           AND h.finished_at < now() - prune.failed_age
        RETURNING h.id)
    SELECT array_agg(gone.id) INTO v_gone FROM gone;
    v_count := v_count + coalesce(cardinality(v_gone), 0);
    IF v_gone IS NOT NULL THEN
        PERFORM pgjobq.durable_forget(v_gone);
    END IF;
    WITH old AS MATERIALIZED (
        SELECT h.id FROM pgjobq.history_done_default h WHERE h.finished_at < now() - prune.completed_age
           AND NOT EXISTS (SELECT 1 FROM pgjobq.deps d JOIN pgjobq.jobs c ON c.id = d.child AND c.state = 'waiting'
                            WHERE d.parent = h.id)
         LIMIT prune.max_jobs FOR UPDATE OF h SKIP LOCKED),
    gone AS (
        DELETE FROM pgjobq.history_done_default h WHERE h.id = ANY (ARRAY(SELECT old.id FROM old))
           AND h.finished_at < now() - prune.completed_age
        RETURNING h.id)
    SELECT array_agg(gone.id) INTO v_gone FROM gone;
    v_count := v_count + coalesce(cardinality(v_gone), 0);
    IF v_gone IS NOT NULL THEN
        PERFORM pgjobq.durable_forget(v_gone);
    END IF;
    -- Events older than their retention (steps.sql), the oldest first.
    DELETE FROM pgjobq.events e
     WHERE e.id IN (SELECT x.id FROM pgjobq.events x WHERE x.sent_at < now() - pgjobq.event_retention()
                     ORDER BY x.sent_at LIMIT prune.max_jobs);
    -- Edges whose child is gone (pruned), older than the shorter retention.
    DELETE FROM pgjobq.deps d
     WHERE (d.parent, d.child) IN (
        SELECT x.parent, x.child FROM pgjobq.deps x
         WHERE x.created_at < now() - least(prune.completed_age, prune.failed_age)
           AND NOT EXISTS (SELECT 1 FROM pgjobq.jobs j WHERE j.id = x.child)
           AND NOT EXISTS (SELECT 1 FROM pgjobq.history h WHERE h.id = x.child)
         ORDER BY x.created_at LIMIT prune.max_jobs);
    -- Dead-letter links whose job is gone (pruned), older than the shorter retention: a link lives as
    -- long as its dead-letter job, live or finished (a redrive needs it).
    DELETE FROM pgjobq.dead_letters d
     WHERE d.id IN (
        SELECT x.id FROM pgjobq.dead_letters x
         WHERE x.at < now() - least(prune.completed_age, prune.failed_age)
           AND NOT EXISTS (SELECT 1 FROM pgjobq.jobs j WHERE j.id = x.id)
           AND NOT EXISTS (SELECT 1 FROM pgjobq.history h WHERE h.id = x.id)
         ORDER BY x.at LIMIT prune.max_jobs);
    -- Throttle windows that have passed (enqueue_keyed takes a passed one over anyway).
    DELETE FROM pgjobq.unique_holds h
     WHERE (h.queue, h.unique_key) IN (SELECT x.queue, x.unique_key FROM pgjobq.unique_holds x
                                        WHERE x.until < now() ORDER BY x.until LIMIT prune.max_jobs);
    -- Low-water marks superseded for ten minutes (claims read only the latest of each level).
    DELETE FROM pgjobq.lows l
     WHERE l.at < now() - interval '10 minutes'
       AND EXISTS (SELECT 1 FROM pgjobq.lows n WHERE n.queue = l.queue AND n.priority = l.priority AND n.at > l.at);
    -- The levels of queues without jobs for an hour, and their frontiers.
    PERFORM pgjobq.levels_reclaim(interval '1 hour');
    PERFORM pgjobq.forwarded_prune(interval '30 days', max_jobs);
    -- Waits whose session is gone (killed before its await_end: await.sql).
    DELETE FROM pgjobq.awaited a WHERE NOT EXISTS (SELECT FROM pg_stat_activity s WHERE s.pid = a.pid);
    RETURN v_count;
END
$$;

-- levels_reclaim(idle, max_levels): gives back the levels (pgjobq.levels: a row, its low-water marks
-- in pgjobq.lows and its frontier sequence) of the queues that have had no job, queued, running or
-- waiting, for `idle` (prune's: an hour, so that a queue that drains now and then keeps its levels and
-- its enqueues create no sequence each time).  Returns how many levels it retired.  What it costs
-- while a snapshot is held open: a queue's queued jobs are looked for from each level's low-water
-- mark, behind which nothing queued is (claim.sql), so the scan steps over what was claimed since the
-- mark last moved, as a claim does.  Its levels' idle_since says since when a call first saw the
-- queue without jobs (cleared when one sees jobs again).
--
-- A level is taken in two steps, because a claim reads a level's row and then its frontier: a
-- frontier dropped between the two would fail the claim.  The row (with its marks) is deleted, and
-- the frontier's name kept in pgjobq.levels_gone; a later call stamps it with its own transaction id
-- (safe_after: every transaction that got its id since sees the row gone, and a claim gets its
-- id before it reads the levels), and a call after every transaction older than that has ended drops
-- it.  (A claim in a REPEATABLE READ transaction whose snapshot is older than that may still read the
-- row, and fail on the frontier; its transaction rolls back, and nothing is lost.)  DROP waits for
-- its lock at most 100 ms, and is otherwise left for the next call.
--
-- An enqueue that races the reclaim can insert a job at a level it saw recorded, which the reclaim
-- then deletes (it could not see the job): that job's level is recorded again by the first claim
-- without a cursor, which every worker makes once a second and which looks for queued jobs at
-- priorities no level records (claim.sql).  The job waits for that claim, no longer; it is never lost.
CREATE OR REPLACE FUNCTION pgjobq.levels_reclaim(idle interval DEFAULT '1 hour', max_levels integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_snap    pg_snapshot := pg_current_snapshot();
    v_seq     text;
    v_waiting text[];
    v_empty   text[];
    v_n       integer := 0;
BEGIN
    IF idle IS NULL OR idle < interval '0' OR max_levels IS NULL OR max_levels < 1 THEN
        RAISE EXCEPTION 'pgjobq.levels_reclaim: idle must not be negative and max_levels must be positive'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The frontiers no claim can read any more (at most 500 a call: each DROP holds its lock to the
    -- end of the transaction, and the lock table is shared).
    FOR v_seq IN SELECT g.frontier FROM pgjobq.levels_gone g
                  WHERE g.safe_after <= pg_snapshot_xmin(v_snap)
                  ORDER BY g.safe_after LIMIT least(levels_reclaim.max_levels, 500)
    LOOP
        BEGIN
            EXECUTE format('DROP SEQUENCE IF EXISTS pgjobq.%I', v_seq);
            DELETE FROM pgjobq.levels_gone g WHERE g.frontier = v_seq;
        EXCEPTION WHEN lock_not_available THEN
            EXIT; -- the next call tries again
        END;
    END LOOP;
    BEGIN
        -- Those retired by earlier calls: their deletion had committed when this statement's snapshot
        -- was taken (it sees their rows), so every transaction given an id after this one's sees them
        -- gone.  This transaction's own id, not the snapshot's xmax: that is the last completed id
        -- plus one, and a claim that got its id before the deletion committed, and read the row,
        -- can hold a larger id than that while no later one has completed; its frontier was then
        -- dropped under it ("could not open relation", 2 runs in 30 of
        -- levels_reclaimed_under_enqueues_and_claims_lose_no_job).
        UPDATE pgjobq.levels_gone g SET safe_after = pg_current_xact_id()
         WHERE g.safe_after IS NULL;

        v_waiting := ARRAY(SELECT DISTINCT j.queue::text FROM pgjobq.jobs j
                            WHERE j.state = 'waiting' AND j.pending_parents IS NOT NULL);
        -- In this order (CASE): waiting, queued from the marks, then running (through the alarms of
        -- their leases, which hold every running job).
        v_empty := ARRAY(
            SELECT q.queue FROM (SELECT DISTINCT l.queue::text AS queue FROM pgjobq.levels l) q
             WHERE CASE WHEN q.queue = ANY (v_waiting) THEN false
                        WHEN EXISTS (
                            SELECT 1 FROM pgjobq.levels l
                              LEFT JOIN LATERAL (SELECT x.key, x.id FROM pgjobq.lows x
                                                  WHERE x.queue = l.queue AND x.priority = l.priority
                                                  ORDER BY x.at DESC LIMIT 1) lo ON true
                             WHERE l.queue = q.queue
                               AND EXISTS (SELECT 1 FROM pgjobq.jobs j
                                            WHERE j.state = 'queued' AND j.queue = l.queue
                                              AND j.priority = l.priority
                                              AND (greatest(j.run_at, j.ready_at), j.id)
                                                  > (coalesce(lo.key, '-infinity'), coalesce(lo.id, 0)))) THEN false
                        ELSE NOT EXISTS (SELECT 1 FROM pgjobq.running_jobs(q.queue))
                   END);
        UPDATE pgjobq.levels l SET idle_since = now() WHERE l.queue = ANY (v_empty) AND l.idle_since IS NULL;
        UPDATE pgjobq.levels l SET idle_since = NULL WHERE l.idle_since IS NOT NULL AND l.queue <> ALL (v_empty);

        WITH gone AS (
            DELETE FROM pgjobq.levels l
             WHERE (l.queue, l.priority) IN (SELECT x.queue, x.priority FROM pgjobq.levels x
                                              WHERE x.queue = ANY (v_empty)
                                                AND x.idle_since <= now() - levels_reclaim.idle
                                              ORDER BY x.idle_since LIMIT levels_reclaim.max_levels)
            RETURNING l.queue, l.priority, l.frontier),
        marks AS (
            DELETE FROM pgjobq.lows x USING gone WHERE x.queue = gone.queue AND x.priority = gone.priority),
        kept AS (
            INSERT INTO pgjobq.levels_gone (frontier)
            SELECT c.relname::text FROM gone JOIN pg_catalog.pg_class c ON c.oid = gone.frontier
            ON CONFLICT DO NOTHING)
        SELECT count(*) INTO v_n FROM gone;
    EXCEPTION WHEN lock_not_available THEN
        RETURN 0; -- a level's row is being written: the next call
    END;
    RETURN v_n;
END
$$;

-- retention_set(completed_age, failed_age): the retention every worker's prune keeps (pgjobq.retention;
-- NULL: leave that one as it is).  Returns the retention now.  For pgjobq_admin.
CREATE OR REPLACE FUNCTION pgjobq.retention_set(completed_age interval DEFAULT NULL, failed_age interval DEFAULT NULL)
RETURNS TABLE (completed interval, failed interval)
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO pgjobq.retention AS r (one, completed, failed)
    VALUES (true, coalesce($1, interval '24 hours'), coalesce($2, interval '7 days'))
    ON CONFLICT ON CONSTRAINT retention_pkey DO UPDATE
       SET completed = coalesce($1, r.completed), failed = coalesce($2, r.failed), updated_at = now()
    RETURNING r.completed, r.failed
$$;

-- autovacuum_adapt(): pauses autovacuum's vacuums of pgjobq.jobs while they can remove nothing, and
-- resumes them when they can.  While a transaction or snapshot is held open (health() names it),
-- vacuum removes no row that died after it; once a vacuum of pgjobq.jobs has run entirely while the
-- same holder was the oldest, another pass would remove nothing more, yet the dead rows keep
-- autovacuum starting every minute, each pass reading the whole table.  This raises the table's
-- vacuum thresholds out of reach then (autovacuum_vacuum_threshold 2147483647,
-- autovacuum_vacuum_insert_threshold -1), and resets them as soon as the oldest holder is another one
-- or none (migration 12 says more).  Autovacuum's ANALYZE goes on: the claims' and the writes' plans
-- need statistics that follow the queue (without them, measured: completions 40 ms instead of 1).
-- A table whose autovacuum someone else turned off, or whose vacuum thresholds someone set, is left
-- as it is.  Anti-wraparound vacuums run whatever the setting.  Returns 'paused' or 'resumed' when
-- it changed that, else NULL.
--
-- Called each minute by the worker that maintains (pgjobq_worker).  Changing the setting needs SHARE
-- UPDATE EXCLUSIVE on the table, which claims, writes and pg_dump do not conflict with: it waits only
-- for a vacuum or an analyze that is running, which PostgreSQL cancels after deadlock_timeout for it;
-- it gives up a second later (and tries again at the next call).
CREATE OR REPLACE FUNCTION pgjobq.autovacuum_adapt() RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_horizon text;
    v_vacuums bigint;
    v_needed bigint;
    v_running boolean;
    v_paused boolean;   -- the thresholds are those this function sets
    v_theirs boolean;   -- autovacuum off, or thresholds set, by someone else
    w pgjobq.vacuum_watch;
BEGIN
    -- The oldest transaction id that holds this database's horizon back (health()'s holders, without
    -- the vacuums themselves, whose own snapshots do not hold other vacuums back): a session's own
    -- transaction id or its snapshot's xmin, whichever is older.
    SELECT h.xid INTO v_horizon
      FROM (SELECT x.x
              FROM pg_stat_activity a, LATERAL (VALUES (a.backend_xid), (a.backend_xmin)) x(x)
             WHERE a.datid = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
               AND a.backend_type <> 'autovacuum worker' AND a.pid <> pg_backend_pid() AND x.x IS NOT NULL
            UNION ALL
            SELECT a.backend_xmin FROM pg_stat_activity a
             WHERE a.backend_type = 'walsender' AND a.backend_xmin IS NOT NULL
            UNION ALL
            SELECT s.xmin FROM pg_replication_slots s WHERE s.xmin IS NOT NULL
            UNION ALL
            SELECT p.transaction FROM pg_prepared_xacts p WHERE p.database = current_database()) o,
           LATERAL (SELECT o.x::text AS xid, age(o.x) AS xids) h
     ORDER BY h.xids DESC
     LIMIT 1;
    SELECT s.vacuum_count + s.autovacuum_count INTO v_vacuums
      FROM pg_stat_user_tables s WHERE s.relid = 'pgjobq.jobs'::regclass;
    v_running := EXISTS (SELECT 1 FROM pg_stat_progress_vacuum v WHERE v.relid = 'pgjobq.jobs'::regclass);
    SELECT coalesce(bool_or(o.option_name = 'autovacuum_vacuum_threshold' AND o.option_value = '2147483647'), false),
           coalesce(bool_or((o.option_name = 'autovacuum_enabled' AND o.option_value IN ('false', 'off', 'no', '0'))
                            OR (o.option_name = 'autovacuum_vacuum_threshold' AND o.option_value <> '2147483647')
                            OR (o.option_name = 'autovacuum_vacuum_insert_threshold' AND o.option_value <> '-1')),
                    false)
      INTO v_paused, v_theirs
      FROM pg_class c, pg_options_to_table(c.reloptions) o
     WHERE c.oid = 'pgjobq.jobs'::regclass;

    SELECT * INTO w FROM pgjobq.vacuum_watch WHERE one FOR UPDATE; -- one caller at a time
    IF v_horizon IS DISTINCT FROM w.horizon THEN
        -- Another holder, or none: whatever was paused can do work again.
        IF w.paused_since IS NOT NULL AND v_paused AND NOT pgjobq.autovacuum_switch(true) THEN
            RETURN NULL; -- the watch is left as it was: the next call tries again
        END IF;
        UPDATE pgjobq.vacuum_watch
           SET horizon = v_horizon, vacuums_then = v_vacuums, vacuum_running = v_running,
               paused_since = NULL
         WHERE one;
        RETURN CASE WHEN w.paused_since IS NOT NULL AND v_paused THEN 'resumed' END;
    END IF;
    IF w.paused_since IS NOT NULL AND NOT v_paused THEN
        -- Someone reset the thresholds by hand: theirs to decide from now on, for this holder.
        UPDATE pgjobq.vacuum_watch SET paused_since = NULL, vacuums_then = NULL WHERE one;
        RETURN NULL;
    END IF;
    -- A pass that was running at first sight may have begun before the holder: one more is needed.
    v_needed := w.vacuums_then + 1 + w.vacuum_running::integer;
    IF v_horizon IS NULL OR w.paused_since IS NOT NULL OR v_paused OR v_theirs OR v_needed IS NULL
       OR v_vacuums < v_needed THEN
        RETURN NULL; -- nothing holds, already paused, someone else's setting, or no full pass yet
    END IF;
    IF NOT pgjobq.autovacuum_switch(false) THEN
        RETURN NULL; -- a vacuum that could not be cancelled: again at the next call
    END IF;
    UPDATE pgjobq.vacuum_watch SET paused_since = now() WHERE one;
    RETURN 'paused';
END
$$;

-- autovacuum_switch(turn_on): resets the vacuum thresholds of pgjobq.jobs (on) or raises them out of
-- reach; false when the table's SHARE UPDATE EXCLUSIVE lock could not be had in time.  It waits a
-- second longer than deadlock_timeout, after which PostgreSQL cancels an autovacuum that holds the
-- lock.  For autovacuum_adapt() only (no role is granted it).
CREATE OR REPLACE FUNCTION pgjobq.autovacuum_switch(turn_on boolean) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM set_config('lock_timeout',
                       least(extract(epoch FROM current_setting('deadlock_timeout')::interval) * 1000 + 1000,
                             60000)::bigint::text, true);
    IF turn_on THEN
        ALTER TABLE pgjobq.jobs RESET (autovacuum_vacuum_threshold, autovacuum_vacuum_insert_threshold);
    ELSE
        ALTER TABLE pgjobq.jobs SET (autovacuum_vacuum_threshold = 2147483647, autovacuum_vacuum_insert_threshold = -1);
    END IF;
    RETURN true;
EXCEPTION WHEN lock_not_available THEN
    RETURN false;
END
$$;
