-- pgjobq schema, migration 9: workflows.  Jobs that wait for other jobs, graphs enqueued at once,
-- batches with a callback, progress and tags.
-- needs: 7
--
--   pgjobq.deps       one row per (parent, child) edge.  A child is `waiting` (a live state that no
--                     claim sees: the claim index holds queued rows only) while pending_parents > 0.
--   jobs.has_children set, under the parent's row lock, by whoever enqueues a child of a live job.
--                     The statement that finishes a job returns it, and only then is a second
--                     statement run to release the children, so a job without children pays nothing.
--   jobs.pending_parents
--                     decremented by each parent's fenced completion, under the child's row lock
--                     (children are locked in id order): 500 parents completed at once by 8 workers
--                     leave the count at 0 exactly once, and the child is queued exactly once.
--
-- The race that a "check the parents, then insert the child" design loses (pg-boss's review of
-- flows): a parent completes between the check and the insert, and the child waits forever.  Here
-- the child's enqueue locks its live parents (UPDATE ... has_children) before it counts them, so a
-- parent's completion either finished before (the parent is found in history, completed) or waits
-- for the enqueue to commit and then, in a statement that starts after that commit, sees the edge.
--
-- Libraries of version 7 keep working: no signature they call changed (pgjobq.enqueue gained
-- arguments with defaults), and their claims never return a waiting job.  Listing a waiting job
-- with such a library reports an unknown state.

-- ------------------------------------------------------------------------------------------------
-- Columns

ALTER TABLE pgjobq.jobs
    ADD COLUMN tags              text[],
    ADD COLUMN progress          jsonb,
    ADD COLUMN has_children      boolean NOT NULL DEFAULT false,
    ADD COLUMN pending_parents   integer,
    ADD COLUMN on_parent_failure text;

ALTER TABLE pgjobq.jobs DROP CONSTRAINT jobs_live_only;
ALTER TABLE pgjobq.jobs ADD CONSTRAINT jobs_live_only CHECK (state IN ('waiting', 'queued', 'running')) NOT VALID;
ALTER TABLE pgjobq.jobs VALIDATE CONSTRAINT jobs_live_only;
ALTER TABLE pgjobq.jobs
    ADD CONSTRAINT jobs_waiting_iff_pending CHECK ((state = 'waiting') = (coalesce(pending_parents, 0) > 0)),
    ADD CONSTRAINT jobs_on_parent_failure CHECK (on_parent_failure IN ('cancel', 'run', 'batch')),
    ADD CONSTRAINT jobs_tags_count CHECK (cardinality(tags) BETWEEN 1 AND 20);

-- Finished jobs keep their tags, their last progress and (which version 3 forgot) their concurrency
-- key, so that a job retried from history comes back with it.
ALTER TABLE pgjobq.history
    ADD COLUMN tags            text[],
    ADD COLUMN progress        jsonb,
    ADD COLUMN concurrency_key text;

-- `pgjobq list --tag T`: untagged jobs are not in these indexes and cost nothing.
CREATE INDEX jobs_tags_idx ON pgjobq.jobs USING gin (tags) WHERE tags IS NOT NULL;
CREATE INDEX history_tags_idx ON pgjobq.history USING gin (tags) WHERE tags IS NOT NULL;
-- Waiting jobs, for retention (a parent stays while a child waits on it) and the dashboard.
CREATE INDEX jobs_waiting_idx ON pgjobq.jobs (id) WHERE state = 'waiting';

CREATE TABLE pgjobq.deps (
    parent     bigint      NOT NULL,
    child      bigint      NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT deps_pkey PRIMARY KEY (parent, child),
    CONSTRAINT deps_no_loop CHECK (parent <> child)
);
CREATE INDEX deps_child_idx ON pgjobq.deps (child);
CREATE INDEX deps_created_idx ON pgjobq.deps (created_at);

CREATE OR REPLACE VIEW pgjobq.all_jobs AS
    SELECT id, queue::text AS queue, kind::text AS kind, payload::jsonb AS payload, priority, state, attempt,
           max_attempts, run_at, created_at, started_at, finished_at, lease_until, lease_token,
           worker_id::text AS worker_id, result, last_error, unique_key::text AS unique_key, cancel_requested,
           concurrency_key::text AS concurrency_key, tags, progress
      FROM pgjobq.jobs
    UNION ALL
    SELECT id, queue, kind, payload, priority, state, attempt, max_attempts, run_at, created_at, started_at,
           finished_at, lease_until, lease_token, worker_id, result, last_error, unique_key, cancel_requested,
           concurrency_key, tags, progress
      FROM pgjobq.history;

-- ------------------------------------------------------------------------------------------------
-- Releasing children

-- batch_counts(callback): what a batch's callback job finds in its payload under "batch" when it is
-- released: how many jobs the batch had and how each ended.
CREATE FUNCTION pgjobq.batch_counts(callback bigint) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT jsonb_build_object('id', $1, 'jobs', count(*),
                              'completed', count(*) FILTER (WHERE a.state = 'completed'),
                              'failed', count(*) FILTER (WHERE a.state = 'failed'),
                              'cancelled', count(*) FILTER (WHERE a.state = 'cancelled'))
      FROM pgjobq.deps d LEFT JOIN pgjobq.all_jobs a ON a.id = d.parent
     WHERE d.child = $1
$$;

-- children_release(parents, ok, only): the parents have finished (ok: completed; otherwise failed
-- or cancelled).  Each child still waiting on them counts them off; a child whose count reaches 0 is
-- queued (and its queue notified).  A child of a parent that did not complete is cancelled, with the
-- parent named in last_error, unless it was enqueued with on_parent_failure 'run' (or is a batch
-- callback): then the parent counts as finished.  Cancelling a child cancels its own waiting children
-- in turn.  `among` limits the first round to those children (an enqueue whose parents had already
-- finished).  Must run in a statement that starts after the statement that finished the parents, so
-- that it sees every edge committed while that statement waited for a parent's row.
CREATE FUNCTION pgjobq.children_release(parents bigint[], ok boolean[], among bigint[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_parents bigint[]  := parents;
    v_ok      boolean[] := ok;
    v_only    bigint[]  := among;
    v_kid     bigint[];
    v_nok     bigint[];
    v_nbad    bigint[];
    v_bad     bigint[];
    v_due     text[];
    v_next    bigint[];
BEGIN
    WHILE v_parents IS NOT NULL LOOP
        SELECT array_agg(k.child ORDER BY k.child), array_agg(k.n_ok ORDER BY k.child),
               array_agg(k.n_bad ORDER BY k.child), array_agg(k.bad ORDER BY k.child)
          INTO v_kid, v_nok, v_nbad, v_bad
          FROM (SELECT d.child, count(*) FILTER (WHERE p.ok) AS n_ok, count(*) FILTER (WHERE NOT p.ok) AS n_bad,
                       min(p.id) FILTER (WHERE NOT p.ok) AS bad
                  FROM (SELECT DISTINCT u.id, coalesce(u.ok, false) AS ok FROM unnest(v_parents, v_ok) AS u(id, ok)) p
                  JOIN pgjobq.deps d ON d.parent = p.id
                 WHERE v_only IS NULL OR d.child = ANY (v_only)
                 GROUP BY d.child) k;
        EXIT WHEN v_kid IS NULL;
        -- Lock the waiting children in id order: the completions of a fan-in queue here one after the
        -- other, and the statements below read the latest count.
        PERFORM 1 FROM pgjobq.jobs j WHERE j.id = ANY (v_kid) AND j.state = 'waiting' ORDER BY j.id FOR UPDATE;

        WITH u AS (SELECT * FROM unnest(v_kid, v_nbad, v_bad) AS u(id, n_bad, bad)),
        gone AS (
            DELETE FROM pgjobq.jobs j USING u
             WHERE j.id = ANY (v_kid) AND j.id = u.id AND j.state = 'waiting' AND u.n_bad > 0
               AND j.on_parent_failure = 'cancel'
            RETURNING j.*, u.bad),
        moved AS (
            INSERT INTO pgjobq.history (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at,
                                        created_at, started_at, finished_at, lease_token, worker_id, result,
                                        last_error, unique_key, cancel_requested, tags, progress, concurrency_key)
            SELECT g.id, g.queue, g.kind, g.payload, g.priority, 'cancelled', g.attempt, g.max_attempts, g.run_at,
                   g.created_at, g.started_at, now(), g.lease_token, g.worker_id, g.result,
                   format('parent job %s failed or was cancelled', g.bad), g.unique_key, g.cancel_requested, g.tags,
                   g.progress, g.concurrency_key
              FROM gone g
            RETURNING 1)
        SELECT array_agg(g.id) FILTER (WHERE g.has_children) INTO v_next
          FROM gone g CROSS JOIN (SELECT count(*) FROM moved) m;

        WITH u AS (SELECT u.id, u.n_ok + u.n_bad AS n FROM unnest(v_kid, v_nok, v_nbad) AS u(id, n_ok, n_bad)),
        released AS (
            UPDATE pgjobq.jobs j
               SET pending_parents = CASE WHEN j.pending_parents - u.n > 0 THEN j.pending_parents - u.n END,
                   state = CASE WHEN j.pending_parents - u.n > 0 THEN 'waiting'::pgjobq.job_state
                                ELSE 'queued'::pgjobq.job_state END,
                   payload = CASE WHEN j.on_parent_failure = 'batch' AND j.pending_parents - u.n <= 0
                                  THEN j.payload || jsonb_build_object('batch', pgjobq.batch_counts(j.id))
                                  ELSE j.payload END
              FROM u
             WHERE j.id = ANY (v_kid) AND j.id = u.id AND j.state = 'waiting'
            RETURNING j.queue::text AS queue, j.state, j.run_at)
        SELECT array_agg(DISTINCT r.queue) FILTER (WHERE r.state = 'queued' AND r.run_at <= now()) INTO v_due
          FROM released r;
        PERFORM pgjobq.notify(v_due);

        v_parents := v_next;
        v_ok := array_fill(false, ARRAY[coalesce(cardinality(v_next), 0)]);
        v_only := NULL;
    END LOOP;
END
$$;

-- ------------------------------------------------------------------------------------------------
-- The statements that finish jobs: as in versions 3 to 7, and they carry tags, progress and the
-- concurrency key into history and release the children of the jobs they finish.

CREATE OR REPLACE FUNCTION pgjobq.history_move_cancelled(ids bigint[], reason text) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    v_n    integer;
    v_kids bigint[];
BEGIN
    WITH gone AS (DELETE FROM pgjobq.jobs j WHERE j.id = ANY ($1) RETURNING j.*),
    moved AS (
        INSERT INTO pgjobq.history (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at,
                                    created_at, started_at, finished_at, lease_token, worker_id, result,
                                    last_error, unique_key, cancel_requested, tags, progress, concurrency_key)
        SELECT g.id, g.queue, g.kind, g.payload, g.priority, 'cancelled', g.attempt, g.max_attempts, g.run_at,
               g.created_at, g.started_at, now(), g.lease_token, g.worker_id, g.result,
               coalesce($2, g.last_error), g.unique_key, g.cancel_requested, g.tags, g.progress, g.concurrency_key
          FROM gone g
        RETURNING 1)
    SELECT (SELECT count(*) FROM moved)::integer, array_agg(g.id) FILTER (WHERE g.has_children)
      INTO v_n, v_kids FROM gone g;
    IF v_kids IS NOT NULL THEN
        PERFORM pgjobq.children_release(v_kids, array_fill(false, ARRAY[cardinality(v_kids)]));
    END IF;
    RETURN coalesce(v_n, 0);
END
$$;

CREATE OR REPLACE FUNCTION pgjobq.complete_many(ids bigint[], tokens bigint[], results jsonb[] DEFAULT NULL)
RETURNS TABLE (id bigint, outcome text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    v_ids      bigint[];
    v_outcomes text[];
    v_kids     bigint[];
    v_kids_ok  boolean[];
BEGIN
    IF cardinality(ids) IS DISTINCT FROM cardinality(tokens)
       OR (results IS NOT NULL AND cardinality(results) <> cardinality(ids)) THEN
        RAISE EXCEPTION 'pgjobq.complete_many: ids, tokens and results must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH input AS MATERIALIZED (
        SELECT u.id, u.token, u.result, now() AS at FROM unnest(ids, tokens, results) AS u(id, token, result)),
    gone AS (
        DELETE FROM pgjobq.jobs j USING input
         WHERE j.id = ANY (complete_many.ids) AND j.id = input.id AND j.lease_token = input.token
           AND j.lease_until > input.at
        RETURNING j.id, j.queue, j.kind, j.payload, j.priority, j.cancel_requested, j.attempt, j.max_attempts,
                  j.run_at, j.created_at, j.started_at, j.lease_token, j.worker_id, j.last_error, j.unique_key,
                  j.tags, j.progress, j.concurrency_key, j.has_children, input.result),
    moved AS (
        INSERT INTO pgjobq.history (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at,
                                    created_at, started_at, finished_at, lease_token, worker_id, result,
                                    last_error, unique_key, cancel_requested, tags, progress, concurrency_key)
        SELECT g.id, g.queue, g.kind, g.payload, g.priority,
               CASE WHEN g.cancel_requested THEN 'cancelled'::pgjobq.job_state
                    ELSE 'completed'::pgjobq.job_state END,
               g.attempt, g.max_attempts, g.run_at, g.created_at, g.started_at, now(), g.lease_token, g.worker_id,
               g.result, g.last_error, g.unique_key, g.cancel_requested, g.tags, g.progress, g.concurrency_key
          FROM gone g
        RETURNING pgjobq.history.id, pgjobq.history.state)
    SELECT array_agg(input.id), array_agg(coalesce(moved.state::text, 'lost')),
           array_agg(input.id) FILTER (WHERE gone.has_children),
           array_agg(moved.state = 'completed') FILTER (WHERE gone.has_children)
      INTO v_ids, v_outcomes, v_kids, v_kids_ok
      FROM input LEFT JOIN moved ON moved.id = input.id LEFT JOIN gone ON gone.id = input.id;
    IF v_kids IS NOT NULL THEN
        PERFORM pgjobq.children_release(v_kids, v_kids_ok);
    END IF;
    RETURN QUERY SELECT u.id, u.outcome FROM unnest(v_ids, v_outcomes) AS u(id, outcome);
END
$$;

CREATE OR REPLACE FUNCTION pgjobq.fail_many(
    ids          bigint[],
    tokens       bigint[],
    errors       text[]     DEFAULT NULL,
    retry_delays interval[] DEFAULT NULL,
    permanent    boolean[]  DEFAULT NULL)
RETURNS TABLE (id bigint, outcome text, run_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    v_final bigint[];
    v_retry bigint[];
    v_kids  bigint[];
BEGIN
    IF cardinality(ids) IS DISTINCT FROM cardinality(tokens)
       OR (errors IS NOT NULL AND cardinality(errors) <> cardinality(ids))
       OR (retry_delays IS NOT NULL AND cardinality(retry_delays) <> cardinality(ids))
       OR (permanent IS NOT NULL AND cardinality(permanent) <> cardinality(ids)) THEN
        RAISE EXCEPTION 'pgjobq.fail_many: the arrays must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(retry_delays) AS d WHERE d < interval '0') THEN
        RAISE EXCEPTION 'pgjobq: retry delay must not be negative' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Lock the held rows first and decide from their latest versions (a cancel may have committed
    -- since this statement's snapshot); then move the finished ones and requeue the others.
    SELECT array_agg(held.id) FILTER (WHERE held.final), array_agg(held.id) FILTER (WHERE NOT held.final),
           array_agg(held.id) FILTER (WHERE held.final AND held.has_children)
      INTO v_final, v_retry, v_kids
      FROM (WITH u AS MATERIALIZED (SELECT u.id, u.token, u.permanent, now() AS at
                                      FROM unnest(ids, tokens, permanent) AS u(id, token, permanent))
            SELECT j.id, j.cancel_requested OR coalesce(u.permanent, false) OR j.attempt >= j.max_attempts AS final,
                   j.has_children
              FROM u JOIN pgjobq.jobs j ON j.id = u.id
             WHERE j.id = ANY (fail_many.ids) AND j.lease_token = u.token AND j.lease_until > u.at
               FOR UPDATE OF j) held;
    RETURN QUERY
    WITH input AS (
        SELECT u.id, left(u.error, 8192) AS error, u.delay
          FROM unnest(ids, errors, retry_delays) AS u(id, error, delay)),
    gone AS (
        DELETE FROM pgjobq.jobs j WHERE j.id = ANY (v_final)
        RETURNING j.id, j.queue, j.kind, j.payload, j.priority, j.cancel_requested, j.attempt, j.max_attempts,
                  j.run_at, j.created_at, j.started_at, j.lease_token, j.worker_id, j.unique_key, j.tags,
                  j.progress, j.concurrency_key),
    moved AS (
        INSERT INTO pgjobq.history (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at,
                                    created_at, started_at, finished_at, lease_token, worker_id, result,
                                    last_error, unique_key, cancel_requested, tags, progress, concurrency_key)
        SELECT g.id, g.queue, g.kind, g.payload, g.priority,
               CASE WHEN g.cancel_requested THEN 'cancelled'::pgjobq.job_state ELSE 'failed'::pgjobq.job_state END,
               g.attempt, g.max_attempts, g.run_at, g.created_at, g.started_at, now(), g.lease_token, g.worker_id,
               NULL, input.error, g.unique_key, g.cancel_requested, g.tags, g.progress, g.concurrency_key
          FROM gone g JOIN input ON input.id = g.id
        RETURNING pgjobq.history.id, pgjobq.history.state),
    retried AS (
        UPDATE pgjobq.jobs j
           SET state = 'queued', run_at = now() + coalesce(input.delay, pgjobq.backoff(j.attempt)),
               lease_until = NULL, last_error = input.error
          FROM input
         WHERE j.id = ANY (v_retry) AND j.id = input.id
        RETURNING j.id, j.run_at, j.queue::text AS queue),
    tallied AS (
        INSERT INTO pgjobq.tallies (queue, what, n)
        SELECT retried.queue, 'retried', count(*) FROM retried GROUP BY retried.queue),
    notified AS (
        SELECT pgjobq.notify(array_agg(retried.queue)) AS x FROM retried WHERE retried.run_at <= now())
    SELECT input.id, coalesce(moved.state::text, CASE WHEN retried.id IS NOT NULL THEN 'queued' END, 'lost'),
           retried.run_at
      FROM input LEFT JOIN moved ON moved.id = input.id LEFT JOIN retried ON retried.id = input.id
     CROSS JOIN notified;
    -- A job that ended failed or cancelled: its waiting children are cancelled (or run).  A retry
    -- releases nothing.
    IF v_kids IS NOT NULL THEN
        PERFORM pgjobq.children_release(v_kids, array_fill(false, ARRAY[cardinality(v_kids)]));
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pgjobq.cancel_many(ids bigint[], tokens bigint[], reason text DEFAULT NULL)
RETURNS TABLE (id bigint, outcome text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    v_ids      bigint[];
    v_outcomes text[];
    v_kids     bigint[];
BEGIN
    IF cardinality(ids) IS DISTINCT FROM cardinality(tokens) THEN
        RAISE EXCEPTION 'pgjobq.cancel_many: ids and tokens must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH input AS MATERIALIZED (SELECT u.id, u.token, now() AS at FROM unnest(ids, tokens) AS u(id, token)),
    gone AS (
        DELETE FROM pgjobq.jobs j USING input
         WHERE j.id = ANY (cancel_many.ids) AND j.id = input.id AND j.lease_token = input.token
           AND j.lease_until > input.at
        RETURNING j.*),
    moved AS (
        INSERT INTO pgjobq.history (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at,
                                    created_at, started_at, finished_at, lease_token, worker_id, result,
                                    last_error, unique_key, cancel_requested, tags, progress, concurrency_key)
        SELECT g.id, g.queue, g.kind, g.payload, g.priority, 'cancelled', g.attempt, g.max_attempts, g.run_at,
               g.created_at, g.started_at, now(), g.lease_token, g.worker_id, g.result,
               coalesce(left(cancel_many.reason, 8192), g.last_error), g.unique_key, g.cancel_requested, g.tags,
               g.progress, g.concurrency_key
          FROM gone g
        RETURNING pgjobq.history.id)
    SELECT array_agg(input.id), array_agg(CASE WHEN moved.id IS NULL THEN 'lost' ELSE 'cancelled' END),
           array_agg(input.id) FILTER (WHERE gone.has_children)
      INTO v_ids, v_outcomes, v_kids
      FROM input LEFT JOIN moved ON moved.id = input.id LEFT JOIN gone ON gone.id = input.id;
    IF v_kids IS NOT NULL THEN
        PERFORM pgjobq.children_release(v_kids, array_fill(false, ARRAY[cardinality(v_kids)]));
    END IF;
    RETURN QUERY SELECT u.id, u.outcome FROM unnest(v_ids, v_outcomes) AS u(id, outcome);
END
$$;

-- cancel: as before; a waiting job is cancelled at once, like a queued one (and its waiting children
-- with it).
CREATE OR REPLACE FUNCTION pgjobq.cancel(id bigint) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_state pgjobq.job_state;
BEGIN
    SELECT j.state INTO v_state FROM pgjobq.jobs j WHERE j.id = cancel.id FOR UPDATE;
    IF NOT FOUND THEN
        SELECT h.state INTO v_state FROM pgjobq.history h WHERE h.id = cancel.id;
        IF NOT FOUND THEN
            RETURN 'not_found';
        END IF;
        RETURN 'already_' || v_state::text;
    END IF;
    IF v_state = 'running' THEN
        UPDATE pgjobq.jobs j SET cancel_requested = true WHERE j.id = cancel.id;
        RETURN 'cancel_requested';
    END IF;
    PERFORM pgjobq.history_move_cancelled(ARRAY[cancel.id], NULL);
    RETURN 'cancelled';
END
$$;

-- retry: as before; the job comes back with its tags and concurrency key.  A waiting job stays
-- waiting for its parents ('waiting').
CREATE OR REPLACE FUNCTION pgjobq.retry(id bigint) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_state pgjobq.job_state;
    v_queue text;
BEGIN
    SELECT j.state, j.queue INTO v_state, v_queue FROM pgjobq.jobs j WHERE j.id = retry.id FOR UPDATE;
    IF FOUND THEN
        IF v_state = 'running' OR v_state = 'waiting' THEN
            RETURN v_state::text;
        END IF;
        UPDATE pgjobq.jobs j SET run_at = now(), max_attempts = greatest(j.max_attempts, j.attempt + 1)
         WHERE j.id = retry.id;
    ELSE
        -- DELETE ... RETURNING locks and removes the history row in one step, so two retries of one
        -- job cannot both move it.
        WITH gone AS (DELETE FROM pgjobq.history h WHERE h.id = retry.id RETURNING h.*)
        INSERT INTO pgjobq.jobs (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at,
                                 created_at, started_at, lease_token, worker_id, result, last_error, unique_key,
                                 tags, progress, concurrency_key)
        OVERRIDING SYSTEM VALUE
        SELECT g.id, g.queue, g.kind, g.payload, g.priority, 'queued', g.attempt,
               greatest(g.max_attempts, g.attempt + 1), now(), g.created_at, g.started_at, g.lease_token,
               g.worker_id, g.result, g.last_error, g.unique_key, g.tags, g.progress, g.concurrency_key
          FROM gone g
        RETURNING queue INTO v_queue;
        IF NOT FOUND THEN
            -- Another retry may have just moved it: look again (a new statement sees its commit).
            IF EXISTS (SELECT 1 FROM pgjobq.jobs j WHERE j.id = retry.id) THEN
                RETURN 'queued';
            END IF;
            RETURN 'not_found';
        END IF;
    END IF;
    PERFORM pgjobq.notify(ARRAY[v_queue]);
    RETURN 'queued';
END
$$;

CREATE OR REPLACE FUNCTION pgjobq.retry_where(queue text, state text, kind text DEFAULT NULL, since interval DEFAULT NULL,
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

    WITH gone AS (
        DELETE FROM pgjobq.history h
         WHERE h.id = ANY (v_ids) AND h.state = retry_where.state::pgjobq.job_state
        RETURNING h.*),
    moved AS (
        INSERT INTO pgjobq.jobs (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at,
                                 created_at, started_at, lease_token, worker_id, result, last_error, unique_key,
                                 tags, progress, concurrency_key)
        OVERRIDING SYSTEM VALUE
        SELECT g.id, g.queue, g.kind, g.payload, g.priority, 'queued', g.attempt,
               greatest(g.max_attempts, g.attempt + 1), now(), g.created_at, g.started_at, g.lease_token,
               g.worker_id, g.result, g.last_error, g.unique_key, g.tags, g.progress, g.concurrency_key
          FROM gone g
        RETURNING 1)
    SELECT count(*) INTO v_moved FROM moved;
    IF v_moved > 0 THEN
        PERFORM pgjobq.notify(ARRAY[queue]);
    END IF;
    RETURN QUERY SELECT v_moved, v_skipped;
EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION 'pgjobq.retry_where: a job of queue "%" with the unique key of a job to retry was enqueued meanwhile; nothing was retried',
                    queue
        USING ERRCODE = 'unique_violation', HINT = 'Run it again: that job is now skipped.';
END
$$;

CREATE OR REPLACE FUNCTION pgjobq.rescue_expired(max_jobs integer DEFAULT 1000) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_final   bigint[];
    v_requeue bigint[];
    v_due     text[];
    v_kids    bigint[];
BEGIN
    -- Lock expired leases (skipping rows others hold) and decide from their latest versions.
    SELECT array_agg(e.id) FILTER (WHERE e.final), array_agg(e.id) FILTER (WHERE NOT e.final),
           array_agg(e.id) FILTER (WHERE e.final AND e.has_children)
      INTO v_final, v_requeue, v_kids
      FROM (SELECT j.id, j.cancel_requested OR j.attempt >= j.max_attempts AS final, j.has_children
              FROM pgjobq.jobs j
             WHERE j.state = 'running' AND j.lease_until < now()
             LIMIT rescue_expired.max_jobs
               FOR UPDATE SKIP LOCKED) e;
    IF v_final IS NOT NULL OR v_requeue IS NOT NULL THEN
        INSERT INTO pgjobq.tallies (queue, what, n)
        SELECT j.queue, 'lost', count(*) FROM pgjobq.jobs j
         WHERE j.id = ANY (v_final) OR j.id = ANY (v_requeue) GROUP BY j.queue;
    END IF;
    IF v_final IS NOT NULL THEN
        WITH gone AS (DELETE FROM pgjobq.jobs j WHERE j.id = ANY (v_final) RETURNING j.*)
        INSERT INTO pgjobq.history (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at,
                                    created_at, started_at, finished_at, lease_token, worker_id, result,
                                    last_error, unique_key, cancel_requested, tags, progress, concurrency_key)
        SELECT g.id, g.queue, g.kind, g.payload, g.priority,
               CASE WHEN g.cancel_requested THEN 'cancelled'::pgjobq.job_state ELSE 'failed'::pgjobq.job_state END,
               g.attempt, g.max_attempts, g.run_at, g.created_at, g.started_at, now(), g.lease_token, g.worker_id,
               g.result,
               format('lease expired at %s: worker %s stopped renewing it (crashed, stalled or lost its connection)',
                      g.lease_until, coalesce(g.worker_id, '?')),
               g.unique_key, g.cancel_requested, g.tags, g.progress, g.concurrency_key
          FROM gone g;
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
    RETURN coalesce(cardinality(v_final), 0) + coalesce(cardinality(v_requeue), 0);
END
$$;

-- ------------------------------------------------------------------------------------------------
-- Enqueueing graphs

-- enqueue_graph(graph): enqueues the jobs of a graph in one transaction, all or none.  graph is a
-- JSON array of jobs (or an object whose "jobs" is one).  Each job is an object with any of:
--   "ref"                a name other jobs of the graph use in "after" (default: its index, "0", "1"...)
--   "queue", "kind", "payload", "priority", "max_attempts", "concurrency_key"   as for enqueue
--   "run_at" (timestamptz text) or "delay" (seconds, a number)
--   "tags"               an array of 1 to 20 tags, each 1 to 64 characters
--   "after"              an array of parents: refs of jobs in the graph (strings) or ids of jobs
--                        already enqueued (numbers)
--   "on_parent_failure"  "cancel" (the default: a parent that fails for good or is cancelled cancels
--                        this job) or "run" (it runs once every parent has finished, however)
--   "callback"           true: a batch callback (runs once every parent has finished, however, and
--                        finds {"batch": {"id", "jobs", "completed", "failed", "cancelled"}} added
--                        to its payload)
-- A job with parents waits (state 'waiting') until they have all completed.  The graph must be
-- acyclic.  Unique keys are not accepted in a graph.  Returns one row per job, in input order: its
-- ref and its id.
CREATE FUNCTION pgjobq.enqueue_graph(graph jsonb)
RETURNS TABLE (ref text, id bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_jobs    jsonb := CASE jsonb_typeof(graph) WHEN 'array' THEN graph WHEN 'object' THEN graph -> 'jobs' END;
    v_n       integer;
    v_seq     regclass := pg_get_serial_sequence('pgjobq.jobs', 'id')::regclass;
    v_refs    text[];
    v_ids     bigint[];
    v_bad     record;
    v_e_child integer[];   -- edges: child's position, parent's position (in the graph) or id (outside)
    v_e_in    integer[];
    v_e_out   bigint[];
    v_left    integer[];
    v_ready   integer[];
    v_ext     bigint[];
    v_live    bigint[];
    v_done    bigint[];
    v_done_ok boolean[];
    v_due     text[];
BEGIN
    IF v_jobs IS NULL OR jsonb_typeof(v_jobs) <> 'array' THEN
        RAISE EXCEPTION 'pgjobq.enqueue_graph: give an array of jobs, or an object whose "jobs" is one'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_n := jsonb_array_length(v_jobs);
    IF v_n = 0 THEN
        RETURN;
    END IF;
    IF v_n > 10000 THEN
        RAISE EXCEPTION 'pgjobq.enqueue_graph: % jobs is too many for one graph (at most 10000)', v_n
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- Each job: an object with known keys and values of the right types.
    FOR v_bad IN
        SELECT e.o - 1 AS i, e.j,
               CASE
                 WHEN jsonb_typeof(e.j) <> 'object' THEN 'is not a JSON object'
                 WHEN EXISTS (SELECT 1 FROM jsonb_object_keys(e.j) AS k
                               WHERE k NOT IN ('ref', 'queue', 'kind', 'payload', 'priority', 'max_attempts',
                                               'concurrency_key', 'run_at', 'delay', 'tags', 'after',
                                               'on_parent_failure', 'callback'))
                   THEN 'has an unknown key: ' || (SELECT string_agg(k, ', ') FROM jsonb_object_keys(e.j) AS k
                               WHERE k NOT IN ('ref', 'queue', 'kind', 'payload', 'priority', 'max_attempts',
                                               'concurrency_key', 'run_at', 'delay', 'tags', 'after',
                                               'on_parent_failure', 'callback'))
                                 || ' (unique keys are not accepted in a graph)'
                 WHEN e.j ? 'ref' AND (jsonb_typeof(e.j -> 'ref') <> 'string' OR length(e.j ->> 'ref') NOT BETWEEN 1 AND 255)
                   THEN '"ref" must be a string of 1 to 255 characters'
                 WHEN jsonb_typeof(e.j -> 'queue') IS DISTINCT FROM 'string' AND e.j ? 'queue'
                      OR (e.j ->> 'queue') !~ '^[A-Za-z][A-Za-z0-9_.:-]{0,63}$'
                   THEN '"queue" must be a name: a letter, then up to 63 letters, digits, _ . : -'
                 WHEN jsonb_typeof(e.j -> 'kind') IS DISTINCT FROM 'string' AND e.j ? 'kind'
                      OR (e.j ->> 'kind') !~ '^[A-Za-z][A-Za-z0-9_.:-]{0,63}$'
                   THEN '"kind" must be a name: a letter, then up to 63 letters, digits, _ . : -'
                 WHEN e.j ? 'priority' AND (jsonb_typeof(e.j -> 'priority') <> 'number'
                      OR (e.j ->> 'priority')::numeric NOT BETWEEN -100 AND 100
                      OR (e.j ->> 'priority')::numeric <> trunc((e.j ->> 'priority')::numeric))
                   THEN '"priority" must be an integer from -100 to 100'
                 WHEN e.j ? 'max_attempts' AND (jsonb_typeof(e.j -> 'max_attempts') <> 'number'
                      OR (e.j ->> 'max_attempts')::numeric NOT BETWEEN 1 AND 1000
                      OR (e.j ->> 'max_attempts')::numeric <> trunc((e.j ->> 'max_attempts')::numeric))
                   THEN '"max_attempts" must be an integer from 1 to 1000'
                 WHEN e.j ? 'concurrency_key' AND (jsonb_typeof(e.j -> 'concurrency_key') <> 'string'
                      OR length(e.j ->> 'concurrency_key') NOT BETWEEN 1 AND 255)
                   THEN '"concurrency_key" must be a string of 1 to 255 characters'
                 WHEN e.j ? 'delay' AND (jsonb_typeof(e.j -> 'delay') <> 'number'
                      OR (e.j ->> 'delay')::numeric < 0 OR (e.j ->> 'delay')::numeric > 3153600000)
                   THEN '"delay" must be a number of seconds, not negative'
                 WHEN e.j ? 'run_at' AND e.j ? 'delay' THEN 'give "run_at" or "delay", not both'
                 WHEN e.j ? 'run_at' AND (jsonb_typeof(e.j -> 'run_at') <> 'string'
                      OR pgjobq.timestamp_ok(e.j ->> 'run_at') IS NOT TRUE)
                   THEN '"run_at" must be a timestamp (text such as "2026-12-01 10:00:00+00")'
                 WHEN e.j ? 'payload' AND octet_length((e.j -> 'payload')::text) > 1048576
                   THEN '"payload" is larger than 1 MiB'
                 WHEN e.j ? 'tags' AND (jsonb_typeof(e.j -> 'tags') <> 'array'
                      OR jsonb_array_length(e.j -> 'tags') NOT BETWEEN 1 AND 20
                      OR EXISTS (SELECT 1 FROM jsonb_array_elements(e.j -> 'tags') AS t
                                  WHERE jsonb_typeof(t) <> 'string' OR length(t #>> '{}') NOT BETWEEN 1 AND 64))
                   THEN '"tags" must be an array of 1 to 20 strings of 1 to 64 characters'
                 WHEN e.j ? 'after' AND (jsonb_typeof(e.j -> 'after') <> 'array'
                      OR jsonb_array_length(e.j -> 'after') > 10000
                      OR EXISTS (SELECT 1 FROM jsonb_array_elements(e.j -> 'after') AS a
                                  WHERE NOT (jsonb_typeof(a) = 'string'
                                             OR (jsonb_typeof(a) = 'number' AND (a #>> '{}')::numeric >= 1
                                                 AND (a #>> '{}')::numeric <= 9223372036854775807
                                                 AND (a #>> '{}')::numeric = trunc((a #>> '{}')::numeric)))))
                   THEN '"after" must be an array of refs (strings) and job ids (positive integers)'
                 WHEN e.j ? 'on_parent_failure' AND (e.j ->> 'on_parent_failure') NOT IN ('cancel', 'run')
                   THEN '"on_parent_failure" must be "cancel" or "run"'
                 WHEN e.j ? 'callback' AND jsonb_typeof(e.j -> 'callback') <> 'boolean'
                   THEN '"callback" must be true or false'
               END AS why
          FROM jsonb_array_elements(v_jobs) WITH ORDINALITY AS e(j, o)
    LOOP
        IF v_bad.why IS NOT NULL THEN
            RAISE EXCEPTION 'pgjobq.enqueue_graph: job %: %', v_bad.i, v_bad.why
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;

    SELECT array_agg(coalesce(e.j ->> 'ref', (e.o - 1)::text) ORDER BY e.o) INTO v_refs
      FROM jsonb_array_elements(v_jobs) WITH ORDINALITY AS e(j, o);
    SELECT d.r INTO v_bad FROM unnest(v_refs) AS d(r) GROUP BY d.r HAVING count(*) > 1 LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'pgjobq.enqueue_graph: two jobs have the ref "%"', v_bad.r
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The edges.  A string names a job of the graph by its ref; a number, a job already enqueued.
    SELECT array_agg(x.child), array_agg(x.pin), array_agg(x.pid)
      INTO v_e_child, v_e_in, v_e_out
      FROM (SELECT DISTINCT e.o::integer AS child, r.o::integer AS pin,
                   CASE WHEN jsonb_typeof(a) = 'number' THEN (a #>> '{}')::numeric::bigint END AS pid,
                   a AS raw
              FROM jsonb_array_elements(v_jobs) WITH ORDINALITY AS e(j, o)
             CROSS JOIN LATERAL jsonb_array_elements(CASE WHEN e.j ? 'after' THEN e.j -> 'after' ELSE '[]' END) AS a
              LEFT JOIN unnest(v_refs) WITH ORDINALITY AS r(ref, o)
                     ON jsonb_typeof(a) = 'string' AND r.ref = a #>> '{}') x;
    IF v_e_child IS NOT NULL THEN
        SELECT u.child, v_refs[u.child] AS cref, u.pin, u.pid INTO v_bad
          FROM unnest(v_e_child, v_e_in, v_e_out) AS u(child, pin, pid)
         WHERE (u.pin IS NULL AND u.pid IS NULL) OR u.pin = u.child LIMIT 1;
        IF FOUND THEN
            IF v_bad.pin = v_bad.child THEN
                RAISE EXCEPTION 'pgjobq.enqueue_graph: job "%" is after itself', v_bad.cref
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            RAISE EXCEPTION 'pgjobq.enqueue_graph: job "%" is after a ref that no job of the graph has', v_bad.cref
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- Cycle check (Kahn): take away, round after round, the jobs none of whose parents in the
        -- graph is left; what cannot be taken away is on a cycle.
        v_left := ARRAY(SELECT DISTINCT u.child FROM unnest(v_e_child, v_e_in) AS u(child, pin) WHERE u.pin IS NOT NULL);
        LOOP
            v_ready := ARRAY(SELECT l FROM unnest(v_left) AS l
                              WHERE NOT EXISTS (SELECT 1 FROM unnest(v_e_child, v_e_in) AS u(child, pin)
                                                 WHERE u.child = l AND u.pin = ANY (v_left)));
            EXIT WHEN cardinality(v_ready) = 0;
            v_left := ARRAY(SELECT l FROM unnest(v_left) AS l WHERE NOT (l = ANY (v_ready)));
        END LOOP;
        IF cardinality(v_left) > 0 THEN
            RAISE EXCEPTION 'pgjobq.enqueue_graph: the graph has a cycle through job "%"',
                            v_refs[(SELECT min(l) FROM unnest(v_left) AS l)]
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;

    -- Parents already enqueued: lock the live ones in id order (their completion waits for this
    -- transaction, then sees the edges), and find the others among the finished jobs.
    v_ext := ARRAY(SELECT DISTINCT u.pid FROM unnest(v_e_out) AS u(pid) WHERE u.pid IS NOT NULL ORDER BY 1);
    IF cardinality(v_ext) > 0 THEN
        v_live := ARRAY(SELECT j.id FROM pgjobq.jobs j WHERE j.id = ANY (v_ext) ORDER BY j.id FOR UPDATE);
        UPDATE pgjobq.jobs j SET has_children = true WHERE j.id = ANY (v_live) AND NOT j.has_children;
        SELECT array_agg(h.id), array_agg(h.state = 'completed') INTO v_done, v_done_ok
          FROM pgjobq.history h WHERE h.id = ANY (v_ext) AND NOT (h.id = ANY (v_live));
        SELECT x INTO v_bad FROM unnest(v_ext) AS x
         WHERE NOT (x = ANY (v_live)) AND NOT (x = ANY (coalesce(v_done, '{}'))) LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'pgjobq.enqueue_graph: job % (a parent) does not exist', v_bad.x
                USING ERRCODE = 'foreign_key_violation';
        END IF;
    END IF;

    v_ids := ARRAY(SELECT nextval(v_seq) FROM generate_series(1, v_n));
    BEGIN
        WITH input AS (
            SELECT e.o::integer AS o, e.j, v_ids[e.o] AS id,
                   (SELECT count(*) FROM unnest(v_e_child) AS c WHERE c = e.o)::integer AS parents,
                   EXISTS (SELECT 1 FROM unnest(v_e_in) AS p WHERE p = e.o) AS has_children
              FROM jsonb_array_elements(v_jobs) WITH ORDINALITY AS e(j, o)),
        ins AS (
            INSERT INTO pgjobq.jobs (id, queue, kind, payload, priority, state, run_at, max_attempts,
                                     concurrency_key, tags, has_children, pending_parents, on_parent_failure)
            OVERRIDING SYSTEM VALUE
            SELECT i.id, coalesce(i.j ->> 'queue', 'default'), coalesce(i.j ->> 'kind', 'default'),
                   coalesce(i.j -> 'payload', '{}'), coalesce((i.j ->> 'priority')::numeric::smallint, 0),
                   CASE WHEN i.parents > 0 THEN 'waiting'::pgjobq.job_state ELSE 'queued'::pgjobq.job_state END,
                   coalesce((i.j ->> 'run_at')::timestamptz,
                            now() + make_interval(secs => coalesce((i.j ->> 'delay')::double precision, 0))),
                   coalesce((i.j ->> 'max_attempts')::numeric::integer, 25), i.j ->> 'concurrency_key',
                   CASE WHEN i.j ? 'tags' THEN ARRAY(SELECT DISTINCT t FROM jsonb_array_elements_text(i.j -> 'tags') AS t ORDER BY 1) END,
                   i.has_children, CASE WHEN i.parents > 0 THEN i.parents END,
                   CASE WHEN i.parents = 0 THEN NULL
                        WHEN (i.j -> 'callback') = 'true' THEN 'batch'
                        ELSE coalesce(i.j ->> 'on_parent_failure', 'cancel') END
              FROM input i ORDER BY i.o
            RETURNING pgjobq.jobs.queue::text AS queue, pgjobq.jobs.state, pgjobq.jobs.run_at)
        SELECT array_agg(DISTINCT ins.queue) FILTER (WHERE ins.state = 'queued' AND ins.run_at <= now())
          INTO v_due FROM ins;
    EXCEPTION WHEN check_violation THEN
        RAISE EXCEPTION 'pgjobq.enqueue_graph: a job breaks a rule of pgjobq.jobs: %', SQLERRM
            USING ERRCODE = 'check_violation';
    END;
    INSERT INTO pgjobq.deps (parent, child)
    SELECT coalesce(v_ids[u.pin], u.pid), v_ids[u.child]
      FROM unnest(v_e_child, v_e_in, v_e_out) AS u(child, pin, pid);
    PERFORM pgjobq.notify(v_due);

    -- Parents that had already finished count off now, as their completion would have.
    IF v_done IS NOT NULL THEN
        PERFORM pgjobq.children_release(v_done, v_done_ok, v_ids);
    END IF;

    RETURN QUERY SELECT r.ref, v_ids[r.o]::bigint FROM unnest(v_refs) WITH ORDINALITY AS r(ref, o) ORDER BY r.o;
END
$$;

-- timestamp_ok(t): whether t reads as a finite timestamptz (pg_input_is_valid arrives in 16).
CREATE FUNCTION pgjobq.timestamp_ok(t text) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN isfinite(t::timestamptz);
EXCEPTION WHEN OTHERS THEN
    RETURN false;
END
$$;

-- enqueue_batch(jobs, callback): the jobs (an array, as for enqueue_graph, whose refs must not be
-- "callback") and a callback job that runs once, when every one of them has finished, however it
-- ended, with {"batch": {"id", "jobs", "completed", "failed", "cancelled"}} added to its payload.
-- Returns the callback's id (the batch's id) and the jobs' ids, in input order.
CREATE FUNCTION pgjobq.enqueue_batch(jobs jsonb, callback jsonb DEFAULT '{}')
RETURNS TABLE (batch_id bigint, ids bigint[])
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_graph jsonb;
    v_ids   bigint[];
BEGIN
    IF jsonb_typeof(jobs) IS DISTINCT FROM 'array' OR jsonb_array_length(jobs) = 0 THEN
        RAISE EXCEPTION 'pgjobq.enqueue_batch: jobs must be a non-empty array' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(callback) IS DISTINCT FROM 'object' OR callback ?| ARRAY['after', 'ref', 'callback'] THEN
        RAISE EXCEPTION 'pgjobq.enqueue_batch: callback must be an object without "after", "ref" or "callback"'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT jsonb_agg(CASE WHEN jsonb_typeof(e.j) = 'object' AND NOT e.j ? 'ref'
                          THEN e.j || jsonb_build_object('ref', 'job ' || (e.o - 1)) ELSE e.j END ORDER BY e.o)
      INTO v_graph FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(j, o);
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(v_graph) AS j WHERE j ->> 'ref' = 'callback') THEN
        RAISE EXCEPTION 'pgjobq.enqueue_batch: the ref "callback" is the callback''s' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_graph := v_graph || jsonb_build_array(callback || jsonb_build_object(
        'ref', 'callback', 'callback', true,
        'after', (SELECT jsonb_agg(j -> 'ref') FROM jsonb_array_elements(v_graph) AS j)));
    SELECT array_agg(e.id ORDER BY e.ord) INTO v_ids
      FROM pgjobq.enqueue_graph(v_graph) WITH ORDINALITY AS e(ref, id, ord);
    RETURN QUERY SELECT v_ids[cardinality(v_ids)], v_ids[1:cardinality(v_ids) - 1];
END
$$;

-- enqueue: as in version 4, and with parents, tags and what a parent's failure does.  A job with
-- `after` or `tags` is enqueued as a graph of one job (no unique key then).
DROP FUNCTION pgjobq.enqueue(text, text, jsonb, smallint, timestamptz, interval, integer, text, text);
CREATE FUNCTION pgjobq.enqueue(
    queue        text        DEFAULT 'default',
    kind         text        DEFAULT 'default',
    payload      jsonb       DEFAULT '{}',
    priority     smallint    DEFAULT 0,
    run_at       timestamptz DEFAULT NULL,
    delay        interval    DEFAULT NULL,
    max_attempts integer     DEFAULT 25,
    unique_key   text        DEFAULT NULL,
    concurrency_key text     DEFAULT NULL,
    after        bigint[]    DEFAULT NULL,
    tags         text[]      DEFAULT NULL,
    on_parent_failure text   DEFAULT NULL,
    OUT id bigint,
    OUT duplicate boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF after IS NULL AND tags IS NULL AND on_parent_failure IS NULL THEN
        SELECT e.id, e.duplicate INTO id, duplicate
          FROM pgjobq.enqueue_many(ARRAY[queue], ARRAY[kind], ARRAY[payload], ARRAY[priority], ARRAY[run_at],
                                   ARRAY[delay], ARRAY[max_attempts], ARRAY[unique_key],
                                   ARRAY[concurrency_key]) AS e;
        RETURN;
    END IF;
    IF unique_key IS NOT NULL THEN
        RAISE EXCEPTION 'pgjobq.enqueue: a job with parents or tags cannot have a unique key'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF delay < interval '0' THEN
        RAISE EXCEPTION 'pgjobq: delay must not be negative' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF run_at IS NOT NULL AND delay IS NOT NULL THEN
        RAISE EXCEPTION 'pgjobq: give run_at or delay, not both' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- (The keys left out are those given as NULL; the payload is taken as it is.)
    SELECT g.id INTO id FROM pgjobq.enqueue_graph(jsonb_build_array(
        (SELECT jsonb_object_agg(f.k, f.v) FROM (VALUES
            ('queue', to_jsonb(coalesce(queue, 'default'))), ('kind', to_jsonb(coalesce(kind, 'default'))),
            ('payload', coalesce(payload, '{}')), ('priority', to_jsonb(priority)),
            ('max_attempts', to_jsonb(max_attempts)), ('concurrency_key', to_jsonb(concurrency_key)),
            ('run_at', to_jsonb(to_char(run_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))),
            ('delay', to_jsonb(extract(epoch FROM delay))), ('tags', to_jsonb(tags)), ('after', to_jsonb(after)),
            ('on_parent_failure', to_jsonb(on_parent_failure))) AS f(k, v)
          WHERE f.v IS NOT NULL))) AS g;
    duplicate := false;
END
$$;

-- ------------------------------------------------------------------------------------------------
-- Reading a workflow

-- set_progress(id, token, progress): a running job reports its progress (any JSON value of at most
-- 8 KiB), fenced like a completion: returns false, and writes nothing, when the lease is no longer
-- the caller's.
CREATE FUNCTION pgjobq.set_progress(id bigint, token bigint, progress jsonb) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF progress IS NULL OR octet_length(progress::text) > 8192 THEN
        RAISE EXCEPTION 'pgjobq.set_progress: progress must be JSON of at most 8 KiB'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE pgjobq.jobs j SET progress = set_progress.progress
     WHERE j.id = set_progress.id AND j.lease_token = set_progress.token AND j.lease_until > now();
    RETURN FOUND;
END
$$;

-- parents(job): the jobs `job` waits (or waited) for, with their state and result ('pruned' when
-- retention has removed one).
CREATE FUNCTION pgjobq.parents(job bigint)
RETURNS TABLE (id bigint, state text, kind text, result jsonb, finished_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT d.parent, coalesce(a.state::text, 'pruned'), a.kind, a.result, a.finished_at
      FROM pgjobq.deps d LEFT JOIN pgjobq.all_jobs a ON a.id = d.parent
     WHERE d.child = $1 ORDER BY d.parent
$$;

-- children(job): the jobs that wait (or waited) for `job`.
CREATE FUNCTION pgjobq.children(job bigint)
RETURNS TABLE (id bigint, state text, kind text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT d.child, coalesce(a.state::text, 'pruned'), a.kind
      FROM pgjobq.deps d LEFT JOIN pgjobq.all_jobs a ON a.id = d.child
     WHERE d.parent = $1 ORDER BY d.child
$$;

-- graph(job): every job connected to `job` through parents and children (at most 10000), each with
-- its depth (the longest chain of parents above it within the graph) and its parents.
CREATE FUNCTION pgjobq.graph(job bigint)
RETURNS TABLE (id bigint, depth integer, state text, queue text, kind text, parents bigint[])
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_nodes bigint[] := ARRAY[graph.job];
    v_more  bigint[];
    v_par   bigint[];
    v_chi   bigint[];
    v_left  bigint[];
    v_ready bigint[];
    v_at    bigint[] := '{}';
    v_depth integer[] := '{}';
    v_level integer;
BEGIN
    LOOP
        v_more := ARRAY(SELECT DISTINCT x FROM (
                            SELECT d.parent AS x FROM pgjobq.deps d WHERE d.child = ANY (v_nodes)
                            UNION SELECT d.child FROM pgjobq.deps d WHERE d.parent = ANY (v_nodes)) n
                         WHERE NOT (x = ANY (v_nodes)));
        EXIT WHEN cardinality(v_more) = 0 OR cardinality(v_nodes) >= 10000;
        v_nodes := v_nodes || v_more;
    END LOOP;
    -- Depth by layers (Kahn): a job's depth is one more than its deepest parent's.
    WITH e AS (SELECT d.parent, d.child FROM pgjobq.deps d WHERE d.child = ANY (v_nodes) AND d.parent = ANY (v_nodes))
    SELECT array_agg(e.parent), array_agg(e.child) INTO v_par, v_chi FROM e;
    v_left := v_nodes;
    v_level := 0;
    LOOP
        v_ready := ARRAY(SELECT l FROM unnest(v_left) AS l
                          WHERE NOT EXISTS (SELECT 1 FROM unnest(v_par, v_chi) AS u(p, c)
                                             WHERE u.c = l AND u.p = ANY (v_left)));
        EXIT WHEN cardinality(v_ready) = 0;
        v_at := v_at || v_ready;
        v_depth := v_depth || array_fill(v_level, ARRAY[cardinality(v_ready)]);
        v_left := ARRAY(SELECT l FROM unnest(v_left) AS l WHERE NOT (l = ANY (v_ready)));
        v_level := v_level + 1;
    END LOOP;
    RETURN QUERY
    SELECT u.n, u.dp, coalesce(a.state::text, 'pruned'), a.queue, a.kind,
           ARRAY(SELECT d.parent FROM pgjobq.deps d WHERE d.child = u.n ORDER BY 1)
      FROM unnest(v_at, v_depth) AS u(n, dp) LEFT JOIN pgjobq.all_jobs a ON a.id = u.n
     ORDER BY u.dp, u.n;
END
$$;

-- ------------------------------------------------------------------------------------------------
-- The claim hands a child its parents' results

-- parents_json(job): [{"id", "state", "result"}, ...] of the job's parents, in id order.
CREATE FUNCTION pgjobq.parents_json(job bigint) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object('id', d.parent, 'state', coalesce(a.state::text, 'pruned'),
                                                 'result', a.result) ORDER BY d.parent), '[]')
      FROM pgjobq.deps d LEFT JOIN pgjobq.all_jobs a ON a.id = d.parent
     WHERE d.child = $1
$$;

-- claim_batch: as in version 7, and a job that had parents comes with their results (a column that
-- is NULL for every other job, so the claim of a plain job costs one test of a NULL column).  The
-- new column is the last, so a library of version 7, which names the columns it reads, is not
-- affected.  The grants of the roles are kept across the DROP.
DROP FUNCTION pgjobq.claim_batch(text, integer, interval, text, smallint, timestamptz, bigint);
CREATE FUNCTION pgjobq.claim_batch(
    queue          text,
    max_jobs       integer,
    lease          interval,
    worker_id      text,
    after_priority smallint    DEFAULT NULL,
    after_run_at   timestamptz DEFAULT NULL,
    after_id       bigint      DEFAULT NULL)
RETURNS TABLE (id bigint, kind text, payload jsonb, priority smallint, attempt integer, max_attempts integer,
               lease_token bigint, run_at timestamptz, created_at timestamptz, started_at timestamptz,
               lease_until timestamptz, unique_key text, last_error text, parents jsonb)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s         pgjobq.queues%ROWTYPE;
    v_limited boolean := false;
    v_room    integer;
    v_window  timestamptz[];
    v_claimed integer;
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

    SELECT * INTO s FROM pgjobq.queues qs WHERE qs.name = claim_batch.queue;
    IF FOUND THEN
        IF s.paused_at IS NOT NULL THEN
            RETURN;
        END IF;
        IF s.concurrency IS NOT NULL OR s.rate_limit IS NOT NULL OR s.key_concurrency IS NOT NULL THEN
            IF current_setting('transaction_isolation') <> 'read committed' THEN
                RAISE EXCEPTION 'pgjobq.claim: queue % has a limit; claim from it in a READ COMMITTED transaction', queue
                    USING ERRCODE = 'invalid_transaction_state',
                          HINT = 'A snapshot older than the claim cannot see the jobs other claims just started.';
            END IF;
            -- Limited claims of this queue run one at a time from here to their commit.  The counts
            -- below are new statements, so each sees every claim committed before this lock was given.
            SELECT * INTO s FROM pgjobq.queues qs WHERE qs.name = claim_batch.queue FOR UPDATE;
            IF s.paused_at IS NOT NULL THEN
                RETURN;
            END IF;
            v_room := max_jobs;
            IF s.concurrency IS NOT NULL THEN
                v_room := least(v_room, s.concurrency - (
                    SELECT count(*)::integer FROM pgjobq.jobs j
                     WHERE j.state = 'running' AND j.queue = claim_batch.queue AND j.lease_until > now()));
            END IF;
            IF s.rate_limit IS NOT NULL THEN
                v_window := ARRAY(SELECT t FROM unnest(s.recent_starts) t WHERE t > now() - s.rate_period ORDER BY t);
                v_room := least(v_room, s.rate_limit - cardinality(v_window));
            END IF;
            IF v_room <= 0 THEN
                RETURN;
            END IF;
            v_limited := true;
            max_jobs := v_room;
            after_id := NULL; -- a limited claim takes the head: few jobs, and none may be passed over
        END IF;
    END IF;

    IF v_limited AND s.key_concurrency IS NOT NULL THEN
        -- Per key: each key's due jobs, at most its free slots, then round-robin over the keys (every
        -- key's first job before any key's second); jobs without a key compete as their own.
        RETURN QUERY
        WITH RECURSIVE keys(k) AS (
            (SELECT j.concurrency_key::text FROM pgjobq.jobs j
              WHERE j.state = 'queued' AND j.queue = claim_batch.queue AND j.concurrency_key IS NOT NULL
              ORDER BY j.concurrency_key LIMIT 1)
            UNION ALL
            SELECT (SELECT j.concurrency_key::text FROM pgjobq.jobs j
                     WHERE j.state = 'queued' AND j.queue = claim_batch.queue AND j.concurrency_key IS NOT NULL
                       AND j.concurrency_key > keys.k
                     ORDER BY j.concurrency_key LIMIT 1)
              FROM keys WHERE keys.k IS NOT NULL),
        busy AS (
            SELECT j.concurrency_key::text AS k, count(*) AS n FROM pgjobq.jobs j
             WHERE j.state = 'running' AND j.queue = claim_batch.queue AND j.lease_until > now()
               AND j.concurrency_key IS NOT NULL
             GROUP BY 1),
        cand AS (
            SELECT c.id, c.priority, c.run_at, c.rn
              FROM keys
              CROSS JOIN LATERAL (
                  SELECT j.id, j.priority, j.run_at,
                         row_number() OVER (ORDER BY j.priority, j.run_at, j.id) AS rn
                    FROM pgjobq.jobs j
                   WHERE j.state = 'queued' AND j.queue = claim_batch.queue AND j.concurrency_key = keys.k
                     AND j.run_at <= now()
                   ORDER BY j.priority, j.run_at, j.id
                   LIMIT greatest(s.key_concurrency - coalesce((SELECT b.n FROM busy b WHERE b.k = keys.k), 0), 0)) c
             WHERE keys.k IS NOT NULL
            UNION ALL
            SELECT u.id, u.priority, u.run_at, row_number() OVER (ORDER BY u.priority, u.run_at, u.id)
              FROM (SELECT j.id, j.priority, j.run_at FROM pgjobq.jobs j
                     WHERE j.state = 'queued' AND j.queue = claim_batch.queue AND j.concurrency_key IS NULL
                       AND j.run_at <= now()
                     ORDER BY j.priority, j.run_at, j.id
                     LIMIT claim_batch.max_jobs) u),
        picked AS MATERIALIZED (
            SELECT j.id FROM pgjobq.jobs j
             WHERE j.id = ANY (ARRAY(SELECT cand.id FROM cand
                                      ORDER BY cand.rn, cand.priority, cand.run_at, cand.id
                                      LIMIT claim_batch.max_jobs))
               AND j.state = 'queued'
               FOR UPDATE SKIP LOCKED)
        UPDATE pgjobq.jobs j
           SET state = 'running', attempt = j.attempt + 1,
               lease_token = greatest(j.lease_token + 1, (extract(epoch FROM now()) * 1000000)::bigint),
               lease_until = now() + claim_batch.lease, started_at = now(), worker_id = claim_batch.worker_id
         WHERE j.id = ANY (ARRAY(SELECT picked.id FROM picked))
        RETURNING j.id, j.kind::text, j.payload::jsonb, j.priority, j.attempt, j.max_attempts, j.lease_token,
                  j.run_at, j.created_at, j.started_at, j.lease_until, j.unique_key::text, j.last_error,
                  CASE WHEN j.on_parent_failure IS NOT NULL THEN pgjobq.parents_json(j.id) END;
    -- Two statements rather than one with "after_id IS NULL OR ...": each keeps a plan whose index
    -- scan starts where it should.
    ELSIF after_id IS NULL THEN
        RETURN QUERY
        WITH picked AS MATERIALIZED (
            SELECT j.id FROM pgjobq.jobs j
             WHERE j.state = 'queued' AND j.queue = claim_batch.queue AND j.run_at <= now()
             ORDER BY j.priority, j.run_at, j.id
             LIMIT claim_batch.max_jobs
               FOR UPDATE SKIP LOCKED)
        UPDATE pgjobq.jobs j
           SET state = 'running', attempt = j.attempt + 1,
               lease_token = greatest(j.lease_token + 1, (extract(epoch FROM now()) * 1000000)::bigint),
               lease_until = now() + claim_batch.lease, started_at = now(), worker_id = claim_batch.worker_id
         WHERE j.id = ANY (ARRAY(SELECT picked.id FROM picked))
        RETURNING j.id, j.kind::text, j.payload::jsonb, j.priority, j.attempt, j.max_attempts, j.lease_token,
                  j.run_at, j.created_at, j.started_at, j.lease_until, j.unique_key::text, j.last_error,
                  CASE WHEN j.on_parent_failure IS NOT NULL THEN pgjobq.parents_json(j.id) END;
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
           SET state = 'running', attempt = j.attempt + 1,
               lease_token = greatest(j.lease_token + 1, (extract(epoch FROM now()) * 1000000)::bigint),
               lease_until = now() + claim_batch.lease, started_at = now(), worker_id = claim_batch.worker_id
         WHERE j.id = ANY (ARRAY(SELECT picked.id FROM picked))
        RETURNING j.id, j.kind::text, j.payload::jsonb, j.priority, j.attempt, j.max_attempts, j.lease_token,
                  j.run_at, j.created_at, j.started_at, j.lease_until, j.unique_key::text, j.last_error,
                  CASE WHEN j.on_parent_failure IS NOT NULL THEN pgjobq.parents_json(j.id) END;
    END IF;

    IF v_limited AND s.rate_limit IS NOT NULL THEN
        GET DIAGNOSTICS v_claimed = ROW_COUNT;
        IF v_claimed > 0 THEN
            UPDATE pgjobq.queues qs SET recent_starts = v_window || array_fill(now(), ARRAY[v_claimed])
             WHERE qs.name = claim_batch.queue;
        END IF;
    END IF;
END
$$;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'pgjobq_worker') THEN
        GRANT EXECUTE ON FUNCTION pgjobq.claim_batch(text, integer, interval, text, smallint, timestamptz, bigint)
            TO pgjobq_worker;
        GRANT EXECUTE ON FUNCTION pgjobq.enqueue(text, text, jsonb, smallint, timestamptz, interval, integer, text,
                                                 text, bigint[], text[], text) TO pgjobq_producer;
    END IF;
END
$$;

-- ------------------------------------------------------------------------------------------------
-- Retention: a parent stays while a child waits on it

CREATE OR REPLACE FUNCTION pgjobq.prune(
    completed_age interval DEFAULT '24 hours',
    failed_age    interval DEFAULT '7 days',
    max_jobs      integer  DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
AS $$
DECLARE
    v_count   integer := 0;
    v_n       integer;
    v_part    record;
    v_keep    bigint[];
    v_created integer := 0;
BEGIN
    IF completed_age IS NULL OR failed_age IS NULL OR completed_age < interval '0' OR failed_age < interval '0' THEN
        RAISE EXCEPTION 'pgjobq.prune: ages must not be negative' USING ERRCODE = 'invalid_parameter_value';
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
         LIMIT prune.max_jobs FOR UPDATE OF h SKIP LOCKED)
    DELETE FROM pgjobq.history_failed h WHERE h.id = ANY (ARRAY(SELECT old.id FROM old))
       AND h.finished_at < now() - prune.failed_age;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_count := v_count + v_n;
    WITH old AS MATERIALIZED (
        SELECT h.id FROM pgjobq.history_done_default h WHERE h.finished_at < now() - prune.completed_age
           AND NOT EXISTS (SELECT 1 FROM pgjobq.deps d JOIN pgjobq.jobs c ON c.id = d.child AND c.state = 'waiting'
                            WHERE d.parent = h.id)
         LIMIT prune.max_jobs FOR UPDATE OF h SKIP LOCKED)
    DELETE FROM pgjobq.history_done_default h WHERE h.id = ANY (ARRAY(SELECT old.id FROM old))
       AND h.finished_at < now() - prune.completed_age;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_count := v_count + v_n;
    -- Edges whose child is gone (pruned), older than the shorter retention.
    DELETE FROM pgjobq.deps d
     WHERE (d.parent, d.child) IN (
        SELECT x.parent, x.child FROM pgjobq.deps x
         WHERE x.created_at < now() - least(prune.completed_age, prune.failed_age)
           AND NOT EXISTS (SELECT 1 FROM pgjobq.jobs j WHERE j.id = x.child)
           AND NOT EXISTS (SELECT 1 FROM pgjobq.history h WHERE h.id = x.child)
         ORDER BY x.created_at LIMIT prune.max_jobs);
    RETURN v_count;
END
$$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgjobq FROM PUBLIC;
