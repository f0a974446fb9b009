-- pgjobq functions: an operator's transitions: cancel and retry one job, or every job a filter
-- chooses.
--
-- Applied by `pgjobq migrate` with the other files of sql/functions (docs/hacking.md): each function
-- is defined once, here, as it is now.

-- cancel_notify(workers): tells the workers that hold jobs whose cancel was just requested, one
-- notification each on channel 'pgjobq' (delivered at commit), so that each renews its leases at once:
-- the heartbeat that ends such a job cancelled and asks its handler to stop (extend_many), rather than
-- the next one, up to a heartbeat later.  The payload, '!cancel:' and the worker's id, cannot be a
-- queue's name (those begin with a letter), so workers that do not know it ignore it.  Every listening
-- worker receives it, as every queue's wakeup; a cancel is rare, and an operator's.
CREATE OR REPLACE FUNCTION pgjobq.cancel_notify(workers text[]) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_notify('pgjobq', '!cancel:' || d.w)
       FROM (SELECT DISTINCT u.w FROM unnest(workers) AS u(w) WHERE u.w IS NOT NULL) d;
END
$$;

-- cancel: a queued or waiting job becomes cancelled at once (it moves to history, and its waiting
-- children are cancelled with it); a running job is marked (with the time, cancel_requested_at), its
-- holder is notified (cancel_notify), and the job ends cancelled at the holder's heartbeat that
-- follows, its completion or failure (or when its lease expires).  Returns 'cancelled',
-- 'cancel_requested', 'not_found', or 'already_' and the final state the job already had
-- ('already_completed', 'already_failed', 'already_cancelled').
CREATE OR REPLACE FUNCTION pgjobq.cancel(id bigint) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_state  pgjobq.job_state;
    v_worker text;
BEGIN
    SELECT j.state, j.worker_id INTO v_state, v_worker FROM pgjobq.jobs j WHERE j.id = cancel.id FOR UPDATE;
    IF NOT FOUND THEN
        SELECT h.state INTO v_state FROM pgjobq.history h WHERE h.id = cancel.id;
        IF NOT FOUND THEN
            RETURN 'not_found';
        END IF;
        RETURN 'already_' || v_state::text;
    END IF;
    IF v_state = 'running' THEN
        UPDATE pgjobq.jobs j SET cancel_requested = true, cancel_requested_at = coalesce(j.cancel_requested_at, now())
         WHERE j.id = cancel.id;
        PERFORM pgjobq.cancel_notify(ARRAY[v_worker]);
        RETURN 'cancel_requested';
    END IF;
    PERFORM pgjobq.history_move_cancelled(ARRAY[cancel.id], NULL);
    RETURN 'cancelled';
END
$$;

-- retry: run a finished (completed, failed or cancelled) or scheduled job again now.  A finished job
-- moves back from history, keeping its id, attempt count, result, tags and concurrency key;
-- max_attempts is raised when needed so that one more attempt is allowed.  Its stored steps
-- (steps.sql) are kept when it failed or was cancelled, so that it resumes after the last step it
-- stored (as DBOS resumes a workflow), and removed when it completed: it starts over (kept, they
-- would only replay into the same result).  A sleeping job wakes: its sleep ends now; a job waiting
-- for an event gets its timeout now.  Returns 'queued',
-- 'not_found', 'running' (a running job cannot be retried) or 'waiting' (a waiting job stays waiting
-- for its parents).  Fails with a unique violation if the job's unique key is held by another queued
-- or running job.
CREATE OR REPLACE FUNCTION pgjobq.retry(id bigint) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_state pgjobq.job_state;
    v_queue text;
    v_priority smallint;
    v_was pgjobq.job_state;
BEGIN
    SELECT j.state, j.queue INTO v_state, v_queue FROM pgjobq.jobs j WHERE j.id = retry.id FOR UPDATE;
    IF FOUND THEN
        IF v_state = 'running' OR v_state = 'waiting' THEN
            RETURN v_state::text;
        END IF;
        -- Due now, and claimable from now on: ready_at is read after the row lock gave this
        -- transaction its id (claim.sql).
        UPDATE pgjobq.jobs j SET run_at = now(), ready_at = clock_timestamp(),
                                 max_attempts = greatest(j.max_attempts, j.attempt + 1), expires_at = NULL,
                                 priority = coalesce(j.base_priority, j.priority), base_priority = NULL
         WHERE j.id = retry.id
        RETURNING j.priority INTO v_priority;
        -- Its level, when aging had taken it from its first one (docs/queues.md, "Priority aging").
        PERFORM pgjobq.levels_record(ARRAY[v_queue], ARRAY[v_priority]);
        PERFORM pgjobq.parks_wake(ARRAY[retry.id]);
    ELSE
        -- DELETE ... RETURNING locks and removes the history row in one step, so two retries of one
        -- job cannot both move it.
        WITH gone AS (DELETE FROM pgjobq.history h WHERE h.id = retry.id RETURNING h.*),
        moved AS (
            INSERT INTO pgjobq.jobs (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at,
                                     created_at, started_at, lease_token, worker_id, result, last_error, unique_key,
                                     tags, progress, concurrency_key, route_key, snoozes, expires_at, base_priority, traceparent)
            OVERRIDING SYSTEM VALUE
            SELECT g.id, g.queue, g.kind, g.payload,
                   coalesce(g.base_priority, g.priority),  -- (at the priority it was enqueued with: its wait
                                                           -- starts again, docs/queues.md "Priority aging")
                   'queued', g.attempt,
                   greatest(g.max_attempts, g.attempt + 1), now(), g.created_at, g.started_at, g.lease_token,
                   g.worker_id, g.result, g.last_error, g.unique_key, g.tags, g.progress, g.concurrency_key, g.route_key,
                   0,    -- (a retry by hand starts its snoozes again: the cap counts from it)
                   NULL, -- (and is started by hand: its expiry is gone, docs/queues.md "Expiry")
                   NULL, -- (and has not been aged)
                   g.traceparent
              FROM gone g
            RETURNING pgjobq.jobs.queue, pgjobq.jobs.priority)
        SELECT m.queue, m.priority, (SELECT g.state FROM gone g) INTO v_queue, v_priority, v_was FROM moved m;
        IF NOT FOUND THEN
            -- Another retry may have just moved it: look again (a new statement sees its commit).
            IF EXISTS (SELECT 1 FROM pgjobq.jobs j WHERE j.id = retry.id) THEN
                RETURN 'queued';
            END IF;
            RETURN 'not_found';
        END IF;
        -- A completed job starts over; a failed or cancelled one resumes after its stored steps.
        -- Either way no park of its past holds it.
        IF v_was = 'completed' THEN
            PERFORM pgjobq.durable_forget(ARRAY[retry.id]);
        ELSE
            DELETE FROM pgjobq.job_parks p WHERE p.job_id = retry.id;
        END IF;
        -- A failed job that blocked its key in a strict-order queue is back in line, first of its key
        -- (its id is the lowest): the block goes, and it runs before the rest of the key.
        DELETE FROM pgjobq.sequence_blocks b WHERE b.job_id = retry.id;
        -- Its level, which may have been reclaimed since it finished (levels_reclaim).
        PERFORM pgjobq.levels_record(ARRAY[v_queue], ARRAY[v_priority]);
    END IF;
    PERFORM pgjobq.notify(ARRAY[v_queue]);
    RETURN 'queued';
END
$$;

-- sequence_skip(id): lets the key that job `id` blocks (it failed for good in a strict-order queue:
-- sequence_block) move on without it: the job stays failed, in the history, and the next job of its
-- key may start.  Returns 'skipped', 'not_blocking' (the job blocks no key: it did not fail in a
-- strict-order queue, was retried, or was skipped already) or 'not_found'.  Workers of the queue are
-- woken.
CREATE OR REPLACE FUNCTION pgjobq.sequence_skip(id bigint) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_queue text;
BEGIN
    DELETE FROM pgjobq.sequence_blocks b WHERE b.job_id = sequence_skip.id RETURNING b.queue INTO v_queue;
    IF FOUND THEN
        PERFORM pgjobq.notify(ARRAY[v_queue]);
        RETURN 'skipped';
    END IF;
    IF EXISTS (SELECT 1 FROM pgjobq.jobs j WHERE j.id = sequence_skip.id)
       OR EXISTS (SELECT 1 FROM pgjobq.history h WHERE h.id = sequence_skip.id) THEN
        RETURN 'not_blocking';
    END IF;
    RETURN 'not_found';
END
$$;

-- retry_running: ends a running job's lease now, for an operator: the job is queued to run again now,
-- as if its lease had just expired and the rescue had found it, and the holder's writes are refused
-- from this moment (its complete, fail, heartbeat or hand-back find no lease under its token: 'lost').
-- Its holder is notified as for a cancel (cancel_notify): it renews its leases at once, learns the job
-- is lost and asks its handler to stop, rather than at its next heartbeat.
-- The attempt it was running counts, as a lease that expires counts (River's rescuer and Oban's
-- Lifeline count it too); like retry, max_attempts is raised when needed so that one more attempt is
-- allowed, so the job always runs again.  A job whose cancellation was requested ends cancelled
-- instead.  What a worker that holds a job for ever (a lease up to its queue's max_lease, a heartbeat
-- that keeps renewing it) leaves an operator, where cancel only requests and retry refuses a running
-- job.  Returns 'queued', 'cancelled', 'not_running' (queued, waiting, or finished) or 'not_found'.
CREATE OR REPLACE FUNCTION pgjobq.retry_running(id bigint) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_job record;
BEGIN
    SELECT j.state, j.queue::text AS queue, j.cancel_requested, j.worker_id, j.lease_until INTO v_job
      FROM pgjobq.jobs j WHERE j.id = retry_running.id FOR UPDATE;
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM pgjobq.history h WHERE h.id = retry_running.id) THEN
            RETURN 'not_running';
        END IF;
        RETURN 'not_found';
    END IF;
    IF v_job.state <> 'running' THEN
        RETURN 'not_running';
    END IF;
    IF v_job.cancel_requested THEN
        PERFORM pgjobq.history_move_cancelled(ARRAY[retry_running.id],
                                              format('lease ended by %s: a cancel had been requested', session_user));
        RETURN 'cancelled';
    END IF;
    -- Queued again now (jobs_ready_stamp makes it claimable now); lease_until NULL fences the holder.
    UPDATE pgjobq.jobs j
       SET state = 'queued', run_at = now(), lease_until = NULL,
           max_attempts = greatest(j.max_attempts, j.attempt + 1),
           last_error = format('lease (until %s) ended at %s by %s: worker %s''s writes are refused', v_job.lease_until,
                               now(), session_user, coalesce(v_job.worker_id, '?'))
     WHERE j.id = retry_running.id;
    PERFORM pgjobq.notify(ARRAY[v_job.queue]);
    -- Its holder renews its leases at once, and learns the job is lost (its handler is told to stop).
    PERFORM pgjobq.cancel_notify(ARRAY[v_job.worker_id]);
    RETURN 'queued';
END
$$;

-- Retry and cancel many jobs at once, chosen by a filter: retry_where and cancel_where.  Each acts in
-- one statement: every job that matches moves, or (on an error) none does.  They take the queue and
-- the state the jobs are in; the job kind and an age bound are optional.

-- filter_check(fn, queue, kind, since): the checks retry_where and cancel_where share; raises an error
-- naming the argument that breaks a rule.
CREATE OR REPLACE FUNCTION pgjobq.filter_check(fn text, queue text, kind text, since interval) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF queue IS NULL THEN
        RAISE EXCEPTION 'pgjobq.%: queue must not be null', fn USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF length(queue) NOT BETWEEN 1 AND 64 OR queue !~ '^[A-Za-z][A-Za-z0-9_.:-]*$' THEN
        RAISE EXCEPTION 'pgjobq.%: queue "%" is not a queue name', fn, left(queue, 200)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A name is a letter, then up to 63 letters, digits and _ . : -';
    END IF;
    IF kind IS NOT NULL AND (length(kind) NOT BETWEEN 1 AND 64 OR kind !~ '^[A-Za-z][A-Za-z0-9_.:-]*$') THEN
        RAISE EXCEPTION 'pgjobq.%: kind "%" is not a kind name', fn, left(kind, 200)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A name is a letter, then up to 63 letters, digits and _ . : -';
    END IF;
    IF since IS NOT NULL AND since <= interval '0' THEN
        RAISE EXCEPTION 'pgjobq.%: since must be a positive interval (not %)', fn, since
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;

-- retry_where(queue, state, kind, since, dry_run, redrive): runs again now every job of `queue` in `state`:
--   'failed', 'cancelled' or 'completed': finished jobs move back from history to queued, keeping
--     their id, attempt count, result, last error, tags and concurrency key (max_attempts is raised
--     to allow one more attempt), and their steps unless they completed, as pgjobq.retry does for
--     one; `since` keeps those that finished within that interval;
--   'queued': jobs waiting for a later run_at (scheduled, backing off before a retry, sleeping or
--     waiting for an event: as pgjobq.retry wakes one) become due now; `since` keeps those created
--     within that interval.
-- `kind` keeps jobs of that kind.  A finished job whose unique key is held by a queued or running job
-- of the queue, or by a newer finished job chosen in the same call (the newest of a key may go), stays
-- where it is and is counted as skipped.  Each history row is locked and removed in one step (DELETE
-- ... RETURNING): a job that another retry moved meanwhile is not found again, and is not counted.
-- When a job with one of these unique keys is enqueued while this runs, nothing moves: the call fails
-- with a unique violation, and run again it skips that job.  With dry_run nothing changes and the
-- counts say what would.  Returns one row: how many jobs were (or would be) retried and skipped.
-- Workers of the queue are woken.
--
-- redrive: `queue` is a dead-letter queue, and its dead letters (pgjobq.dead_letters) go back to the
-- queue each came from, as well: in state 'queued', every one of them, due or not; in a finished
-- state, those in it, run again as above.  A job of the queue that is no dead letter (enqueued there
-- directly) stays and is counted as skipped.  The link notes when (redriven_at); a redriven job that
-- fails for good again comes back to the dead-letter queue as a new dead letter.  A dead letter that
-- a worker of the dead-letter queue claims at that instant is waited for, and stays where it runs.
CREATE OR REPLACE FUNCTION pgjobq.retry_where(queue text, state text, kind text DEFAULT NULL, since interval DEFAULT NULL,
                                              dry_run boolean DEFAULT false, redrive boolean DEFAULT false)
RETURNS TABLE (retried bigint, skipped bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ids     bigint[];
    v_skipped bigint;
    v_moved   bigint;
    v_queues  text[];
    v_priorities smallint[];
BEGIN
    PERFORM pgjobq.filter_check('retry_where', queue, kind, since);
    IF state IS NULL OR state NOT IN ('queued', 'failed', 'cancelled', 'completed') THEN
        RAISE EXCEPTION 'pgjobq.retry_where: state must be failed, cancelled, completed or queued (not %)',
                        coalesce('"' || left(state, 40) || '"', 'null')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A running job is retried by its worker or when its lease expires.';
    END IF;
    redrive := coalesce(redrive, false);

    IF state = 'queued' AND redrive THEN
        SELECT count(*) FILTER (WHERE d.id IS NULL) INTO v_skipped FROM pgjobq.jobs j
          LEFT JOIN pgjobq.dead_letters d ON d.id = j.id
         WHERE j.state = 'queued' AND j.queue = retry_where.queue
           AND (retry_where.kind IS NULL OR j.kind = retry_where.kind)
           AND (retry_where.since IS NULL OR j.created_at >= now() - retry_where.since);
        IF dry_run THEN
            SELECT count(*) INTO v_moved FROM pgjobq.jobs j JOIN pgjobq.dead_letters d ON d.id = j.id
             WHERE j.state = 'queued' AND j.queue = retry_where.queue
               AND (retry_where.kind IS NULL OR j.kind = retry_where.kind)
               AND (retry_where.since IS NULL OR j.created_at >= now() - retry_where.since);
            RETURN QUERY SELECT v_moved, v_skipped;
            RETURN;
        END IF;
        -- A row a claimer holds at this instant is waited for and re-checked (it is running by then, and
        -- stays).  Claimable from now on, in its queue: ready_at is read after this transaction has its id.
        PERFORM pg_current_xact_id();
        WITH moved AS (
            UPDATE pgjobq.jobs j SET queue = d.original_queue, run_at = now(), ready_at = clock_timestamp(),
                                     priority = coalesce(j.base_priority, j.priority), base_priority = NULL
              FROM pgjobq.dead_letters d
             WHERE d.id = j.id AND j.state = 'queued' AND j.queue = retry_where.queue
               AND (retry_where.kind IS NULL OR j.kind = retry_where.kind)
               AND (retry_where.since IS NULL OR j.created_at >= now() - retry_where.since)
            RETURNING j.id, j.queue::text AS queue, j.priority),
        marked AS (
            UPDATE pgjobq.dead_letters d SET redriven_at = now() FROM moved WHERE d.id = moved.id)
        SELECT count(*), array_agg(moved.queue), array_agg(moved.priority) INTO v_moved, v_queues, v_priorities
          FROM moved;
        IF v_moved > 0 THEN
            PERFORM pgjobq.levels_record(v_queues, v_priorities);
            PERFORM pgjobq.notify(ARRAY(SELECT DISTINCT u FROM unnest(v_queues) AS u));
        END IF;
        RETURN QUERY SELECT v_moved, v_skipped;
        RETURN;
    END IF;

    IF state = 'queued' THEN
        IF dry_run THEN
            SELECT count(*) INTO v_moved FROM pgjobq.jobs j
             WHERE j.state = 'queued' AND j.queue = retry_where.queue AND j.run_at > now()
               AND (retry_where.kind IS NULL OR j.kind = retry_where.kind)
               AND (retry_where.since IS NULL OR j.created_at >= now() - retry_where.since);
            RETURN QUERY SELECT v_moved, 0::bigint;
            RETURN;
        END IF;
        -- A row a claimer holds at this instant is waited for and re-checked (it is running by then).
        -- Claimable from now on: ready_at is read after this transaction has its id (claim.sql).
        PERFORM pg_current_xact_id();
        WITH due AS (
            UPDATE pgjobq.jobs j SET run_at = now(), ready_at = clock_timestamp(), expires_at = NULL,
                                     priority = coalesce(j.base_priority, j.priority), base_priority = NULL
             WHERE j.state = 'queued' AND j.queue = retry_where.queue AND j.run_at > now()
               AND (retry_where.kind IS NULL OR j.kind = retry_where.kind)
               AND (retry_where.since IS NULL OR j.created_at >= now() - retry_where.since)
            RETURNING j.id, j.priority)
        SELECT array_agg(due.id), array_agg(due.priority) INTO v_ids, v_priorities FROM due;
        v_moved := coalesce(cardinality(v_ids), 0);
        IF v_moved > 0 THEN
            -- At the priority they were enqueued with, as pgjobq.retry (docs/queues.md, "Priority aging").
            PERFORM pgjobq.levels_record(array_fill(queue, ARRAY[v_moved::integer]), v_priorities);
            -- Parked ones wake as pgjobq.retry wakes one.
            PERFORM pgjobq.parks_wake(v_ids);
            PERFORM pgjobq.notify(ARRAY[queue]);
        END IF;
        RETURN QUERY SELECT v_moved, 0::bigint;
        RETURN;
    END IF;

    SELECT array_agg(c.id) FILTER (WHERE c.ok), count(*) FILTER (WHERE NOT c.ok)
      INTO v_ids, v_skipped
      FROM (SELECT h.id,
                   (NOT retry_where.redrive OR EXISTS (SELECT 1 FROM pgjobq.dead_letters d WHERE d.id = h.id))
                   AND (h.unique_key IS NULL
                        OR (row_number() OVER (PARTITION BY h.unique_key ORDER BY h.finished_at DESC, h.id DESC) = 1
                            AND NOT EXISTS (SELECT 1 FROM pgjobq.jobs j
                                             WHERE j.queue = retry_where.queue AND j.unique_key = h.unique_key
                                               AND j.state IN ('queued', 'running')))) AS ok
              FROM pgjobq.history h
             WHERE h.state = retry_where.state::pgjobq.job_state AND h.queue = retry_where.queue
               AND (retry_where.kind IS NULL OR h.kind = retry_where.kind)
               AND (retry_where.since IS NULL OR h.finished_at >= now() - retry_where.since)) c;
    IF dry_run OR v_ids IS NULL THEN
        RETURN QUERY SELECT coalesce(cardinality(v_ids), 0)::bigint, v_skipped;
        RETURN;
    END IF;

    WITH gone AS (
        DELETE FROM pgjobq.history h
         WHERE h.id = ANY (v_ids) AND h.state = retry_where.state::pgjobq.job_state
        RETURNING h.*),
    moved AS (
        INSERT INTO pgjobq.jobs (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at,
                                 created_at, started_at, lease_token, worker_id, result, last_error, unique_key,
                                 tags, progress, concurrency_key, route_key, snoozes, expires_at, base_priority, traceparent)
        OVERRIDING SYSTEM VALUE
        SELECT g.id,
               CASE WHEN retry_where.redrive
                    THEN (SELECT d.original_queue FROM pgjobq.dead_letters d WHERE d.id = g.id) ELSE g.queue END,
               g.kind, g.payload, coalesce(g.base_priority, g.priority), 'queued', g.attempt,
               greatest(g.max_attempts, g.attempt + 1), now(), g.created_at, g.started_at, g.lease_token,
               g.worker_id, g.result, g.last_error, g.unique_key, g.tags, g.progress, g.concurrency_key, g.route_key,
               0,    -- (a retry by hand starts its snoozes again: the cap counts from it)
               NULL, -- (and is started by hand: its expiry is gone, docs/queues.md "Expiry")
               NULL, -- (and at the priority it was enqueued with, as pgjobq.retry)
               g.traceparent
          FROM gone g
        RETURNING pgjobq.jobs.id, pgjobq.jobs.queue::text AS queue, pgjobq.jobs.priority),
    marked AS (
        UPDATE pgjobq.dead_letters d SET redriven_at = now() FROM moved WHERE retry_where.redrive AND d.id = moved.id)
    SELECT count(*), array_agg(moved.queue), array_agg(moved.priority), array_agg(moved.id)
      INTO v_moved, v_queues, v_priorities, v_ids
      FROM moved;
    -- As pgjobq.retry: completed jobs start over, the others resume after their stored steps, and
    -- the keys they blocked in a strict-order queue are free again.
    IF state = 'completed' THEN
        PERFORM pgjobq.durable_forget(v_ids);
    ELSE
        DELETE FROM pgjobq.job_parks p WHERE p.job_id = ANY (v_ids);
        DELETE FROM pgjobq.sequence_blocks b WHERE b.job_id = ANY (v_ids);
    END IF;
    IF v_moved > 0 THEN
        -- Their levels, which may have been reclaimed since they finished (levels_reclaim).
        PERFORM pgjobq.levels_record(v_queues, v_priorities);
        PERFORM pgjobq.notify(ARRAY(SELECT DISTINCT u FROM unnest(v_queues) AS u));
    END IF;
    RETURN QUERY SELECT v_moved, v_skipped;
EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION 'pgjobq.retry_where: a job of queue "%" with the unique key of a job to retry was enqueued meanwhile; nothing was retried',
                    queue
        USING ERRCODE = 'unique_violation', HINT = 'Run it again: that job is now skipped.';
END
$$;

-- cancel_where(queue, state, kind, since, dry_run): cancels every job of `queue` in `state`:
--   'queued': the jobs end cancelled at once (they move to history), as pgjobq.cancel does for one;
--   'running': a cancel is requested, and each ends cancelled at its holder's next heartbeat or
--     write, or when its lease expires.
-- `kind` keeps jobs of that kind, `since` those created within that interval.  A queued job that a
-- claim holds at this instant is waited for, and left alone if it started.  With dry_run nothing
-- changes.  Returns how many jobs were (or would be) cancelled or marked.
CREATE OR REPLACE FUNCTION pgjobq.cancel_where(queue text, state text, kind text DEFAULT NULL, since interval DEFAULT NULL,
                                    dry_run boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ids     bigint[];
    v_workers text[];
    v_n       bigint;
BEGIN
    PERFORM pgjobq.filter_check('cancel_where', queue, kind, since);
    IF state IS NULL OR state NOT IN ('queued', 'running') THEN
        RAISE EXCEPTION 'pgjobq.cancel_where: state must be queued or running (not %)',
                        coalesce('"' || left(state, 40) || '"', 'null')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'A finished job cannot be cancelled.';
    END IF;

    IF dry_run THEN
        SELECT count(*) INTO v_n FROM pgjobq.jobs j
         WHERE j.state = cancel_where.state::pgjobq.job_state AND j.queue = cancel_where.queue
           AND (cancel_where.state = 'queued' OR NOT j.cancel_requested)
           AND (cancel_where.kind IS NULL OR j.kind = cancel_where.kind)
           AND (cancel_where.since IS NULL OR j.created_at >= now() - cancel_where.since);
        RETURN v_n;
    END IF;

    IF state = 'running' THEN
        WITH marked AS (
            UPDATE pgjobq.jobs j SET cancel_requested = true, cancel_requested_at = now()
             WHERE j.state = 'running' AND j.queue = cancel_where.queue AND NOT j.cancel_requested
               AND (cancel_where.kind IS NULL OR j.kind = cancel_where.kind)
               AND (cancel_where.since IS NULL OR j.created_at >= now() - cancel_where.since)
            RETURNING j.worker_id::text AS w)
        SELECT count(*), array_agg(DISTINCT m.w) INTO v_n, v_workers FROM marked m;
        PERFORM pgjobq.cancel_notify(v_workers);
        RETURN v_n;
    END IF;

    SELECT array_agg(l.id) INTO v_ids
      FROM (SELECT j.id FROM pgjobq.jobs j
             WHERE j.state = 'queued' AND j.queue = cancel_where.queue
               AND (cancel_where.kind IS NULL OR j.kind = cancel_where.kind)
               AND (cancel_where.since IS NULL OR j.created_at >= now() - cancel_where.since)
               FOR UPDATE) l;
    IF v_ids IS NULL THEN
        RETURN 0;
    END IF;
    RETURN pgjobq.history_move_cancelled(v_ids, NULL);
END
$$;

-- caller_is_admin(): whether the role that logged in (session_user: inside a SECURITY DEFINER
-- function current_user is the function's owner) may administer pgjobq: a member of pgjobq_admin (when
-- that role exists), or of the schema's owner; a superuser is a member of every role.  What the
-- admin role alone may do inside functions every worker may run: prune below the configured retention
-- (maintenance.sql), remove another live worker's row from the registry (monitor.sql).
CREATE OR REPLACE FUNCTION pgjobq.caller_is_admin() RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(pg_has_role(session_user, to_regrole('pgjobq_admin')::oid, 'MEMBER'), false)
        OR pg_has_role(session_user, (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'pgjobq'), 'MEMBER')
$$;

-- reset_queue(queue): removes every job of the queue, live and finished, at once, and returns how many
-- were live.  What the benchmarks start from (`pgjobq bench`, bench/run.sh); not a transition: the
-- jobs are gone without a trace, whatever their state, and a worker holding one of them finds it gone
-- at its next write.  Granted to pgjobq_admin only.
CREATE OR REPLACE FUNCTION pgjobq.reset_queue(queue text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_live bigint;
    v_ids  bigint[];
BEGIN
    WITH gone AS (DELETE FROM pgjobq.jobs j WHERE j.queue = reset_queue.queue RETURNING j.id)
    SELECT count(*), array_agg(gone.id) INTO v_live, v_ids FROM gone;
    -- The alarms of the queue's leases (none of its jobs runs any more).
    DELETE FROM pgjobq.lease_alarms a WHERE a.queue = reset_queue.queue;
    WITH gone AS (DELETE FROM pgjobq.history h WHERE h.queue = reset_queue.queue RETURNING h.id)
    SELECT v_ids || array_agg(gone.id) INTO v_ids FROM gone;
    IF EXISTS (SELECT FROM pgjobq.job_steps) OR EXISTS (SELECT FROM pgjobq.job_parks) THEN
        PERFORM pgjobq.durable_forget(v_ids);
    END IF;
    RETURN v_live;
END
$$;

-- load_history(queue, n): adds n completed jobs of the queue, finished now, to the history at once (ids
-- from the jobs' sequence; kind 'default', payload {}): what a busy production table holds, for the
-- benchmarks (`pgjobq bench --noise`).  Granted to pgjobq_admin only.
CREATE OR REPLACE FUNCTION pgjobq.load_history(queue text, n bigint) RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH loaded AS (
        INSERT INTO pgjobq.history (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at,
                                    created_at, started_at, finished_at, lease_token)
        SELECT nextval(pg_get_serial_sequence('pgjobq.jobs', 'id')), load_history.queue, 'default', '{}', 0,
               'completed', 1, 25, now(), now(), now(), now(), 1
          FROM generate_series(1, load_history.n)
        RETURNING 1)
    INSERT INTO pgjobq.tallies (queue, what, n) SELECT load_history.queue, 'completed', count(*) FROM loaded
$$;
