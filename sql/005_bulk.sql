-- pgjobq schema, migration 5: retry and cancel many jobs at once, chosen by a filter.
--
-- Both functions act in one statement: every job that matches moves, or (on an error) none does.
-- They take the queue and the state the jobs are in; the job kind and an age bound are optional.

-- filter_check(fn, queue, kind, since): the checks both functions share; raises an error naming the
-- argument that breaks a rule.
CREATE FUNCTION pgjobq.filter_check(fn text, queue text, kind text, since interval) RETURNS void
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

-- retry_where(queue, state, kind, since, dry_run): runs again now every job of `queue` in `state`:
--   'failed', 'cancelled' or 'completed': finished jobs move back from history to queued, keeping
--     their id, attempt count, result and last error (max_attempts is raised to allow one more
--     attempt), as pgjobq.retry does for one; `since` keeps those that finished within that interval;
--   'queued': jobs waiting for a later run_at (scheduled, or backing off before a retry) become due
--     now; `since` keeps those created within that interval.
-- `kind` keeps jobs of that kind.  A finished job whose unique key is held by a queued or running job
-- of the queue, or by a newer finished job chosen in the same call, stays where it is and is counted
-- as skipped.  With dry_run nothing changes and the counts say what would.  Returns one row: how many
-- jobs were (or would be) retried and skipped.  Workers of the queue are woken.
CREATE FUNCTION pgjobq.retry_where(queue text, state text, kind text DEFAULT NULL, since interval DEFAULT NULL,
                                   dry_run boolean DEFAULT false)
RETURNS TABLE (retried bigint, skipped bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ids     bigint[];
    v_skipped bigint;
    v_moved   bigint;
BEGIN
    PERFORM pgjobq.filter_check('retry_where', queue, kind, since);
    IF state IS NULL OR state NOT IN ('queued', 'failed', 'cancelled', 'completed') THEN
        RAISE EXCEPTION 'pgjobq.retry_where: state must be failed, cancelled, completed or queued (not %)',
                        coalesce('"' || left(state, 40) || '"', 'null')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A running job is retried by its worker or when its lease expires.';
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
        UPDATE pgjobq.jobs j SET run_at = now()
         WHERE j.state = 'queued' AND j.queue = retry_where.queue AND j.run_at > now()
           AND (retry_where.kind IS NULL OR j.kind = retry_where.kind)
           AND (retry_where.since IS NULL OR j.created_at >= now() - retry_where.since);
        GET DIAGNOSTICS v_moved = ROW_COUNT;
        IF v_moved > 0 THEN
            PERFORM pgjobq.notify(ARRAY[queue]);
        END IF;
        RETURN QUERY SELECT v_moved, 0::bigint;
        RETURN;
    END IF;

    -- The candidates, newest first within each unique key; the first of a key may go unless a live
    -- job holds the key.
    SELECT array_agg(c.id) FILTER (WHERE c.ok), count(*) FILTER (WHERE NOT c.ok)
      INTO v_ids, v_skipped
      FROM (SELECT h.id,
                   h.unique_key IS NULL
                   OR (row_number() OVER (PARTITION BY h.unique_key ORDER BY h.finished_at DESC, h.id DESC) = 1
                       AND NOT EXISTS (SELECT 1 FROM pgjobq.jobs j
                                        WHERE j.queue = retry_where.queue AND j.unique_key = h.unique_key
                                          AND j.state IN ('queued', 'running'))) AS ok
              FROM pgjobq.history h
             WHERE h.state = retry_where.state::pgjobq.job_state AND h.queue = retry_where.queue
               AND (retry_where.kind IS NULL OR h.kind = retry_where.kind)
               AND (retry_where.since IS NULL OR h.finished_at >= now() - retry_where.since)) c;
    IF dry_run OR v_ids IS NULL THEN
        RETURN QUERY SELECT coalesce(cardinality(v_ids), 0)::bigint, v_skipped;
        RETURN;
    END IF;

    -- DELETE ... RETURNING locks and removes each history row in one step: a job that another retry
    -- moved meanwhile is not found again, and is not counted.
    WITH gone AS (
        DELETE FROM pgjobq.history h
         WHERE h.id = ANY (v_ids) AND h.state = retry_where.state::pgjobq.job_state
        RETURNING h.*),
    moved AS (
        INSERT INTO pgjobq.jobs (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at,
                                 created_at, started_at, lease_token, worker_id, result, last_error, unique_key)
        OVERRIDING SYSTEM VALUE
        SELECT g.id, g.queue, g.kind, g.payload, g.priority, 'queued', g.attempt,
               greatest(g.max_attempts, g.attempt + 1), now(), g.created_at, g.started_at, g.lease_token,
               g.worker_id, g.result, g.last_error, g.unique_key
          FROM gone g
        RETURNING 1)
    SELECT count(*) INTO v_moved FROM moved;
    IF v_moved > 0 THEN
        PERFORM pgjobq.notify(ARRAY[queue]);
    END IF;
    RETURN QUERY SELECT v_moved, v_skipped;
EXCEPTION WHEN unique_violation THEN
    -- A job with one of these unique keys was enqueued while this ran: nothing moved.
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
CREATE FUNCTION pgjobq.cancel_where(queue text, state text, kind text DEFAULT NULL, since interval DEFAULT NULL,
                                    dry_run boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ids bigint[];
    v_n   bigint;
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
        UPDATE pgjobq.jobs j SET cancel_requested = true
         WHERE j.state = 'running' AND j.queue = cancel_where.queue AND NOT j.cancel_requested
           AND (cancel_where.kind IS NULL OR j.kind = cancel_where.kind)
           AND (cancel_where.since IS NULL OR j.created_at >= now() - cancel_where.since);
        GET DIAGNOSTICS v_n = ROW_COUNT;
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

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgjobq FROM PUBLIC;
