-- pgjobq functions: the writes of a lease holder (running -> completed, failed, queued, cancelled) and
-- the retry policy.
--
-- Applied by `pgjobq migrate` with the other files of sql/functions (docs/hacking.md): each function
-- is defined once, here, as it is now.
--
-- Fenced writes by the holder.  Each (id, token) is accepted only while the job is running under that
-- token and its lease has not expired (lease_until > now(): only running jobs have a lease).  Jobs that
-- finish move to pgjobq.history in the same statement.
--
-- Plan shapes matter as much as the schema (bench/README.md, experiments).  Fenced writes take their
-- input as arrays and must reach each row through the primary key, driven by the input: one probe
-- per (id, token).  Every other shape compares every candidate row with every input row, and the
-- planner picks one whenever it believes the table yields a single candidate, which statistics
-- gathered while no job was running make it believe of any filter on the lease:
--   * `state = 'running'` walked the running index (the old lease index) for each batch;
--   * `lease_until > now()` is estimated at one row: a full scan joined to the input with a filter
--     (2,000 x 2,000 comparisons, 600 ms for one batch, a minute per batch under 40 workers).
-- So the lease is compared with `input.at`, the statement's now() carried by the (materialized)
-- input: a join clause, which leaves the table's estimate alone (lease_until > now() and
-- state = 'running' are equivalent by jobs_lease_iff_running).  The functions also run with
-- enable_seqscan = off, so that on a small table a sequential scan never looks cheaper than the
-- probes, and name the table's rows by `j.id = ANY (ids)` besides the join: that bounds the scan of
-- the table to the input's ids whatever join the planner picks (with statistics saying no job runs
-- it hashed the input and walked the whole primary key, every row of a backlog, for each batch).
-- And with enable_nestloop = off: bounded to the input's ids, the rows were still joined to the
-- input by a nested loop whenever the table's estimate said one row (a vacuum while a snapshot is
-- held counts no live row: reltuples 0), every row compared with every input row, 250,000
-- comparisons and 50-110 ms for a batch of 500 (bench/README.md, S3); hashed, 500.  Every join in
-- these functions is of the input and rows named by their ids, which a hash join serves;
-- children_release, which they call and which reaches deps through an index per parent, sets
-- enable_nestloop back on.  And with jit = off: a node of a type turned off costs 1e10 to the
-- planner, so any statement that must keep one (fail_many's final CROSS JOIN is a nested loop
-- whatever the setting) crosses jit_above_cost and jit_optimize_above_cost whatever the data, and
-- was compiled on every call: about 1 s of server CPU per failed batch on an idle server, 3 s
-- under load, with the heartbeats queued behind it on the worker's write connection (leases lost).
-- And with plan_cache_mode = force_generic_plan (fail_many, extend_many, release_many, cancel_many),
-- so that the plans these settings shape are made once per session: left to choose, PL/pgSQL found
-- the custom plans of five statements of fail_many, extend_many and release_many cheaper and planned
-- them again at every call, 0.05-0.17 ms each (pg_stat_statements with track_planning).
-- complete_many's and cancel_many's plans were kept; cancel_many, of release_many's shape, gets the
-- setting so that its plans do not depend on that choice either.

-- backoff(attempt): how long to wait before retrying after failed attempt number `attempt` (1-based).
-- 2^attempt seconds, capped at one hour, with +-10% jitter so that jobs that failed together do not
-- retry together.  Replace this function (CREATE OR REPLACE, same signature) to change the policy.
-- It is created only when it does not exist, so that `pgjobq migrate` keeps a replacement when it
-- applies these files again.
DO $do$
BEGIN
    IF to_regprocedure('pgjobq.backoff(integer)') IS NULL THEN
        CREATE FUNCTION pgjobq.backoff(attempt integer) RETURNS interval
        LANGUAGE sql VOLATILE
        SET search_path = pg_catalog, pg_temp
        AS $$
    SELECT make_interval(secs => least(power(2, least(greatest(attempt, 1), 30)), 3600)
                                 * (0.9 + 0.2 * random()))
$$;
    END IF;
END
$do$;

-- history_move_cancelled(ids, reason): moves live jobs (locked by the caller) to history as cancelled,
-- with reason as last_error when given, and with their tags, progress and concurrency key.  Their
-- waiting children are then released as by parents that did not complete (children_release).
-- Returns how many moved.
CREATE OR REPLACE FUNCTION pgjobq.history_move_cancelled(ids bigint[], reason text) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_nestloop = off
SET jit = off
AS $$
DECLARE
    v_n    integer;
    v_kids bigint[];
BEGIN
    WITH gone AS (DELETE FROM pgjobq.jobs j WHERE j.id = ANY ($1) RETURNING j.*),
    moved AS (
        INSERT INTO pgjobq.history (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at,
                                    created_at, started_at, finished_at, lease_token, worker_id, result,
                                    last_error, unique_key, cancel_requested, tags, progress, concurrency_key,
                                    cancel_requested_at, cancel_told_at, route_key, snoozes, expires_at, base_priority, traceparent)
        SELECT g.id, g.queue, g.kind, g.payload, g.priority, 'cancelled', g.attempt, g.max_attempts, g.run_at,
               g.created_at, g.started_at, now(), g.lease_token, g.worker_id, g.result,
               coalesce($2, g.last_error), g.unique_key, g.cancel_requested, g.tags, g.progress, g.concurrency_key,
               g.cancel_requested_at, g.cancel_told_at, g.route_key, g.snoozes, g.expires_at, g.base_priority, g.traceparent
          FROM gone g
        RETURNING pgjobq.history.queue),
    tallied AS (
        INSERT INTO pgjobq.tallies (queue, what, n) SELECT m.queue, 'cancelled', count(*) FROM moved m GROUP BY 1)
    SELECT (SELECT count(*) FROM moved)::integer, array_agg(g.id) FILTER (WHERE g.has_children)
      INTO v_n, v_kids FROM gone g;
    IF v_kids IS NOT NULL THEN
        PERFORM pgjobq.children_release(v_kids, array_fill(false, ARRAY[cardinality(v_kids)]));
    END IF;
    RETURN coalesce(v_n, 0);
END
$$;

-- complete_many: running -> completed (history), or cancelled when a cancel was requested, for jobs
-- the caller holds (fenced, see above).  The job's tags, progress and concurrency key go with it to
-- history, and a statement after the move releases its waiting children (children_release).  Returns
-- one row per input: outcome 'completed', 'cancelled' or 'lost'.
CREATE OR REPLACE FUNCTION pgjobq.complete_many(ids bigint[], tokens bigint[], results jsonb[] DEFAULT NULL)
RETURNS TABLE (id bigint, outcome text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_nestloop = off
SET jit = off
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
                  j.tags, j.progress, j.concurrency_key, j.has_children, input.result, j.cancel_requested_at,
                  j.cancel_told_at, j.route_key, j.snoozes, j.expires_at, j.base_priority, j.traceparent),
    moved AS (
        INSERT INTO pgjobq.history (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at,
                                    created_at, started_at, finished_at, lease_token, worker_id, result,
                                    last_error, unique_key, cancel_requested, tags, progress, concurrency_key,
                                    cancel_requested_at, cancel_told_at, route_key, snoozes, expires_at, base_priority, traceparent)
        SELECT g.id, g.queue, g.kind, g.payload, g.priority,
               CASE WHEN g.cancel_requested THEN 'cancelled'::pgjobq.job_state
                    ELSE 'completed'::pgjobq.job_state END,
               g.attempt, g.max_attempts, g.run_at, g.created_at, g.started_at, now(), g.lease_token, g.worker_id,
               g.result, g.last_error, g.unique_key, g.cancel_requested, g.tags, g.progress, g.concurrency_key,
               g.cancel_requested_at, g.cancel_told_at, g.route_key, g.snoozes, g.expires_at, g.base_priority, g.traceparent
          FROM gone g
        RETURNING pgjobq.history.id, pgjobq.history.state, pgjobq.history.queue),
    tallied AS (
        INSERT INTO pgjobq.tallies (queue, what, n)
        SELECT m.queue, m.state::text, count(*) FROM moved m GROUP BY 1, 2)
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

-- dead_letter_send(ids, errors): called by the statements that end jobs failed for good (fail_many,
-- rescue_expired) just before they move them to the history, with the rows still live and locked by
-- the caller: each job whose queue has a dead-letter queue (queues.dead_letter) and that does not end
-- cancelled gets a copy there, in the same transaction, so that the failure and the dead letter commit
-- together or not at all.  The copy is a new job, queued and due now, with the job's kind, payload,
-- priority, max_attempts, tags, concurrency and routing keys, and errors[i] (the final error; NULL:
-- the job's last) as its last_error, and its stored steps (job_steps); not its unique key (the
-- dead-letter queue keeps every failure).  pgjobq.dead_letters links it to the job that failed, which keeps its id and history row, and names
-- the queue a redrive sends it back to (retry_where).  A paused or limited dead-letter queue receives
-- all the same (those settings hold claims back, not inserts); its level is recorded, leniently (at
-- the cap of levels the claims find it within a second), and its workers are woken.  Returns how many
-- copies it made.  One probe of pgjobq.queues per job and nothing else when no queue has a dead-letter
-- queue; the failures that are retried never come here.
CREATE OR REPLACE FUNCTION pgjobq.dead_letter_send(ids bigint[], errors text[] DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_queues text[];
    v_prios  smallint[];
    v_n      integer;
BEGIN
    -- Every read of pgjobq.jobs here is by id alone (OFFSET 0: the queue's join stays outside), so
    -- that only the primary key can serve it: with the queue beside the id, jobs_ready_idx could, walking
    -- the queue's whole range for each id (docs/design.md, "The claim writes in place").
    IF NOT EXISTS (SELECT 1
                     FROM (SELECT j.queue FROM pgjobq.jobs j WHERE j.id = ANY (dead_letter_send.ids) OFFSET 0) j
                     JOIN pgjobq.queues q ON q.name = j.queue
                    WHERE q.dead_letter IS NOT NULL) THEN
        RETURN 0;
    END IF;
    -- (The caller locked the rows: its transaction has an id, which the copies' ready_at must follow.)
    PERFORM pg_current_xact_id();
    WITH dead AS MATERIALIZED (
        SELECT j.id, q.dead_letter, j.queue, nextval(pg_get_serial_sequence('pgjobq.jobs', 'id')) AS new_id,
               u.error
          FROM unnest(dead_letter_send.ids, dead_letter_send.errors) AS u(id, error)
         CROSS JOIN LATERAL (SELECT j.id, j.queue, j.cancel_requested FROM pgjobq.jobs j
                              WHERE j.id = u.id OFFSET 0) j
          JOIN pgjobq.queues q ON q.name = j.queue
         WHERE q.dead_letter IS NOT NULL AND NOT j.cancel_requested),
    made AS (
        INSERT INTO pgjobq.jobs (id, queue, kind, payload, priority, max_attempts, last_error, tags,
                                 concurrency_key, route_key, traceparent)
        OVERRIDING SYSTEM VALUE
        SELECT d.new_id, d.dead_letter, j.kind, j.payload, j.priority, j.max_attempts,
               left(coalesce(d.error, j.last_error), 8192), j.tags, j.concurrency_key, j.route_key, j.traceparent
          FROM dead d JOIN pgjobq.jobs j ON j.id = d.id
        RETURNING pgjobq.jobs.queue::text AS queue, pgjobq.jobs.priority),
    linked AS (
        INSERT INTO pgjobq.dead_letters (id, original_id, original_queue, queue)
        SELECT d.new_id, d.id, d.queue, d.dead_letter FROM dead d),
    -- Its stored steps go with it (docs/durable.md): the dead letter, and a redrive of it, resume after
    -- them, as a retry of the failed job would; a step's effects are not made twice.
    stepped AS (
        INSERT INTO pgjobq.job_steps (job_id, name, result, attempt, stored_at)
        SELECT d.new_id, s.name, s.result, s.attempt, s.stored_at FROM dead d JOIN pgjobq.job_steps s ON s.job_id = d.id)
    SELECT array_agg(m.queue), array_agg(m.priority), count(*) INTO v_queues, v_prios, v_n FROM made m;
    IF v_n > 0 THEN
        PERFORM pgjobq.levels_record(v_queues, v_prios, false);
        PERFORM pgjobq.notify(ARRAY(SELECT DISTINCT u FROM unnest(v_queues) AS u));
    END IF;
    RETURN v_n;
END
$$;

-- sequence_block(ids): called with dead_letter_send by the statements that end jobs failed for good
-- (fail_many, rescue_expired), with the rows still live and locked: each such job of a strict-order
-- queue (queues.strict_order; docs/queues.md, "Strict order per key") that has a key and does not end
-- cancelled blocks its key in pgjobq.sequence_blocks, in the same transaction, so that a claim sees the
-- failure and the block together or neither: nothing more of the key starts until the job is retried
-- (retry, retry_where) or skipped (sequence_skip).  A key already blocked stays blocked by its first
-- failure.  Returns how many keys it blocked; reads pgjobq.queues only when no queue is strict.
CREATE OR REPLACE FUNCTION pgjobq.sequence_block(ids bigint[]) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_n integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pgjobq.queues q WHERE q.strict_order) THEN
        RETURN 0;
    END IF;
    INSERT INTO pgjobq.sequence_blocks (queue, key, job_id)
    SELECT DISTINCT ON (j.queue, j.concurrency_key) j.queue, j.concurrency_key, j.id
      FROM (SELECT j.id, j.queue, j.concurrency_key, j.cancel_requested FROM pgjobq.jobs j
             WHERE j.id = ANY (sequence_block.ids) OFFSET 0) j  -- by id alone, as in dead_letter_send
      JOIN pgjobq.queues q ON q.name = j.queue
     WHERE q.strict_order AND j.concurrency_key IS NOT NULL AND NOT j.cancel_requested
     ORDER BY j.queue, j.concurrency_key, j.id
    ON CONFLICT (queue, key) DO NOTHING;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

-- fail_many: record failed attempts (same fencing as complete_many).  While attempts remain the job
-- goes back to queued with run_at = now() + retry_delay (or + backoff(attempt) when the delay is
-- NULL), and the retry is counted in pgjobq.tallies; otherwise, or with permanent = true, it ends
-- failed (history), and its waiting children are cancelled (or run, as they asked); a job that ends
-- failed in a queue with a dead-letter queue leaves a copy there (dead_letter_send).  A job whose
-- cancellation was requested ends cancelled.  The error text is kept in last_error (the first 8 KiB).
-- Returns one row per input: outcome 'queued', 'failed', 'cancelled' or 'lost', and the new run_at.
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
SET enable_nestloop = off
SET jit = off
SET plan_cache_mode = force_generic_plan
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
    IF v_final IS NOT NULL THEN
        PERFORM pgjobq.dead_letter_send(v_final, ARRAY(SELECT left(u.error, 8192)
                                                         FROM unnest(ids, errors) AS u(id, error)
                                                         JOIN unnest(v_final) AS f(id) ON f.id = u.id
                                                        ORDER BY array_position(v_final, f.id)));
        PERFORM pgjobq.sequence_block(v_final);
    END IF;
    RETURN QUERY
    WITH input AS (
        SELECT u.id, left(u.error, 8192) AS error, u.delay
          FROM unnest(ids, errors, retry_delays) AS u(id, error, delay)),
    gone AS (
        DELETE FROM pgjobq.jobs j WHERE j.id = ANY (v_final)
        RETURNING j.id, j.queue, j.kind, j.payload, j.priority, j.cancel_requested, j.attempt, j.max_attempts,
                  j.run_at, j.created_at, j.started_at, j.lease_token, j.worker_id, j.unique_key, j.tags,
                  j.progress, j.concurrency_key, j.cancel_requested_at, j.cancel_told_at, j.route_key, j.snoozes,
                  j.expires_at, j.base_priority, j.traceparent),
    moved AS (
        INSERT INTO pgjobq.history (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at,
                                    created_at, started_at, finished_at, lease_token, worker_id, result,
                                    last_error, unique_key, cancel_requested, tags, progress, concurrency_key,
                                    cancel_requested_at, cancel_told_at, route_key, snoozes, expires_at, base_priority, traceparent)
        SELECT g.id, g.queue, g.kind, g.payload, g.priority,
               CASE WHEN g.cancel_requested THEN 'cancelled'::pgjobq.job_state ELSE 'failed'::pgjobq.job_state END,
               g.attempt, g.max_attempts, g.run_at, g.created_at, g.started_at, now(), g.lease_token, g.worker_id,
               NULL, input.error, g.unique_key, g.cancel_requested, g.tags, g.progress, g.concurrency_key,
               g.cancel_requested_at, g.cancel_told_at, g.route_key, g.snoozes, g.expires_at, g.base_priority, g.traceparent
          FROM gone g JOIN input ON input.id = g.id
        RETURNING pgjobq.history.id, pgjobq.history.state, pgjobq.history.queue),
    retried AS (
        UPDATE pgjobq.jobs j
           SET state = 'queued', run_at = now() + coalesce(input.delay, pgjobq.backoff(j.attempt)),
               lease_until = NULL, last_error = input.error
          FROM input
         WHERE j.id = ANY (v_retry) AND j.id = input.id
        RETURNING j.id, j.run_at, j.queue::text AS queue),
    tallied AS (
        INSERT INTO pgjobq.tallies (queue, what, n)
        SELECT retried.queue, 'retried', count(*) FROM retried GROUP BY retried.queue
        UNION ALL
        SELECT moved.queue, moved.state::text, count(*) FROM moved GROUP BY 1, 2),
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

-- extend_many: the heartbeat.  Moves the lease of each held job to now() + lease (same fencing as
-- complete_many).  A HOT update since schema 33 (no index holds lease_until; the rescue finds leases
-- through their alarms, pgjobq.lease_alarms, and arms a new one for a lease a heartbeat moved on; a
-- heartbeat that moves a lease earlier arms one itself, by the trigger jobs_lease_alarm).  A job
-- whose cancellation was requested ends cancelled
-- here, so its holder learns to stop.  Returns one row per input: outcome 'extended', 'cancelled' or
-- 'lost', and the new lease_until.
-- A lease longer than its queue allows (max_lease, queues.sql) is cut to it, not refused as the claim
-- refuses it: the job is running already, and a refusal would lose its lease (and those of its
-- batch-mates) where a shorter one keeps it; the claim with that lease was refused anyway, unless the
-- queue's max_lease was lowered since.  The queues with a max_lease are read once per call.
CREATE OR REPLACE FUNCTION pgjobq.extend_many(ids bigint[], tokens bigint[], lease interval DEFAULT '30 seconds')
RETURNS TABLE (id bigint, outcome text, lease_until timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_nestloop = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_held   bigint[];
    v_until  timestamptz[];
    v_cancel bigint[];
    v_names  text[];
    v_caps   interval[];
BEGIN
    IF cardinality(ids) IS DISTINCT FROM cardinality(tokens) THEN
        RAISE EXCEPTION 'pgjobq.extend_many: ids and tokens must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF lease IS NULL OR lease <= interval '0' THEN
        RAISE EXCEPTION 'pgjobq.extend_many: lease must be positive, not %', lease
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The queues whose max_lease is set (no lease of a second or less is ever cut: no setting is shorter).
    IF lease > interval '1 second' THEN
        SELECT array_agg(q.name::text), array_agg(q.max_lease) INTO v_names, v_caps
          FROM pgjobq.queues q WHERE q.max_lease IS NOT NULL;
    END IF;
    -- One UPDATE renews every held lease (and locks the rows, so the decision below is stable); a job
    -- whose cancellation was requested keeps its lease and is then moved to history as cancelled.
    WITH u AS MATERIALIZED (SELECT u.id, u.token, now() AS at FROM unnest(ids, tokens) AS u(id, token)),
    held AS (
        UPDATE pgjobq.jobs j
           SET lease_until = CASE WHEN j.cancel_requested THEN j.lease_until
                                  ELSE now() + least(extend_many.lease,
                                                     coalesce(v_caps[array_position(v_names, j.queue::text)],
                                                              pgjobq.max_lease_default())) END
          FROM u
         WHERE j.id = ANY (extend_many.ids) AND j.id = u.id AND j.lease_token = u.token AND j.lease_until > u.at
        RETURNING j.id, j.lease_until, j.cancel_requested)
    SELECT array_agg(held.id) FILTER (WHERE NOT held.cancel_requested),
           array_agg(held.lease_until) FILTER (WHERE NOT held.cancel_requested),
           array_agg(held.id) FILTER (WHERE held.cancel_requested)
      INTO v_held, v_until, v_cancel FROM held;
    IF v_cancel IS NOT NULL THEN
        -- The holder learns it from this answer, and asks the handler to stop: note when (only here,
        -- when a cancel was requested, so that the renewal above stays what it was).  The clock's
        -- time, not the transaction's: a heartbeat that began before the cancel and waited for its
        -- row lock tells the handler after the cancel's commit.
        UPDATE pgjobq.jobs j SET cancel_told_at = clock_timestamp() WHERE j.id = ANY (v_cancel);
        PERFORM pgjobq.history_move_cancelled(v_cancel, NULL);
    END IF;
    RETURN QUERY
    SELECT u.id,
           CASE WHEN h.id IS NOT NULL THEN 'extended' WHEN u.id = ANY (v_cancel) THEN 'cancelled' ELSE 'lost' END,
           h.until
      FROM unnest(ids) AS u(id) LEFT JOIN unnest(v_held, v_until) AS h(id, until) ON h.id = u.id;
END
$$;

-- release_many: running -> queued now, attempt given back, for jobs the caller holds (worker shutdown;
-- same fencing as complete_many); a job whose cancellation was requested ends cancelled instead.
-- Returns one row per input: outcome 'queued', 'cancelled' or 'lost'.
CREATE OR REPLACE FUNCTION pgjobq.release_many(ids bigint[], tokens bigint[], reason text DEFAULT NULL)
RETURNS TABLE (id bigint, outcome text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_nestloop = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_release bigint[];
    v_cancel  bigint[];
    v_queues  text[];
BEGIN
    IF cardinality(ids) IS DISTINCT FROM cardinality(tokens) THEN
        RAISE EXCEPTION 'pgjobq.release_many: ids and tokens must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Lock the held rows and decide from their latest versions, then act.
    SELECT array_agg(held.id) FILTER (WHERE NOT held.cancel_requested),
           array_agg(held.id) FILTER (WHERE held.cancel_requested)
      INTO v_release, v_cancel
      FROM (WITH u AS MATERIALIZED (SELECT u.id, u.token, now() AS at FROM unnest(ids, tokens) AS u(id, token))
            SELECT j.id, j.cancel_requested FROM u JOIN pgjobq.jobs j ON j.id = u.id
             WHERE j.id = ANY (release_many.ids) AND j.lease_token = u.token AND j.lease_until > u.at
               FOR UPDATE OF j) held;
    IF v_cancel IS NOT NULL THEN
        PERFORM pgjobq.history_move_cancelled(v_cancel, left(reason, 8192));
    END IF;
    WITH released AS (
        UPDATE pgjobq.jobs j
           SET state = 'queued', attempt = j.attempt - 1, run_at = now(), lease_until = NULL,
               last_error = coalesce(left(release_many.reason, 8192), j.last_error)
         WHERE j.id = ANY (v_release)
        RETURNING j.queue::text AS queue)
    SELECT array_agg(DISTINCT released.queue) INTO v_queues FROM released;
    PERFORM pgjobq.notify(v_queues);
    RETURN QUERY
    SELECT u.id, CASE WHEN u.id = ANY (v_release) THEN 'queued' WHEN u.id = ANY (v_cancel) THEN 'cancelled'
                      ELSE 'lost' END
      FROM unnest(ids) AS u(id);
END
$$;

-- snooze_cap(): how many times a job may be snoozed (jobs.snoozes, schema 23) before a snooze is a
-- failed attempt instead: 1,000 (a handler that snoozes for ever ends as its attempts say).  A
-- hand-back of a job its worker did not run (snooze_many's handed_back) is not counted.
CREATE OR REPLACE FUNCTION pgjobq.snooze_cap() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 1000 $$;

-- snooze_many: jobs their holder hands back untouched (PGJOBQ_OUTCOME_SNOOZE: a handler that asks to
-- run later; PGJOBQ_OUTCOME_HAND_BACK: a job its worker did not run, a kind it does not know yet, a
-- handler that could not start): running -> queued, the attempt given back as release_many gives it,
-- due after its delay (NULL: backoff(attempt), so that a job handed back without a delay does not come
-- back at once), its reason kept in last_error (the first 8 KiB).  A snooze is counted (jobs.snoozes),
-- and a job snoozed snooze_cap() times already gets a failed attempt instead (fail_many, with the
-- reason in the error: retried while attempts remain).  A hand-back (handed_back[i] true) is not the
-- handler's choice: it is neither counted nor capped (what bounds it is its delay, and the worker that
-- stops claiming while it cannot run jobs).  Same fencing as complete_many; a job whose cancellation was
-- requested ends cancelled.  Returns one row per input: outcome 'queued', 'cancelled', 'lost', or
-- fail_many's for a job at the cap ('queued' or 'failed').  (Schema 16; the cap, 23; handed_back, 26:
-- an overload, so that the four-argument form of older libraries stays what it was.)
CREATE OR REPLACE FUNCTION pgjobq.snooze_many(ids bigint[], tokens bigint[], reasons text[], delays interval[],
                                              handed_back boolean[])
RETURNS TABLE (id bigint, outcome text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_nestloop = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_snooze   bigint[];
    v_cancel   bigint[];
    v_over     bigint[];
    v_over_out text[];
    v_queues   text[];
BEGIN
    IF cardinality(ids) IS DISTINCT FROM cardinality(tokens)
       OR (reasons IS NOT NULL AND cardinality(reasons) <> cardinality(ids))
       OR (delays IS NOT NULL AND cardinality(delays) <> cardinality(ids))
       OR (handed_back IS NOT NULL AND cardinality(handed_back) <> cardinality(ids)) THEN
        RAISE EXCEPTION 'pgjobq.snooze_many: the arrays must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- 100 years as the library counts them (36,525 days): an interval of months compares as 30 days each.
    IF EXISTS (SELECT 1 FROM unnest(delays) AS d WHERE d < interval '0' OR d > interval '3155760000 seconds') THEN
        RAISE EXCEPTION 'pgjobq: a snooze''s delay must be from 0 to 100 years'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Lock the held rows and decide from their latest versions, then act.
    SELECT array_agg(held.id) FILTER (WHERE NOT held.cancel_requested AND (held.back OR held.snoozes < pgjobq.snooze_cap())),
           array_agg(held.id) FILTER (WHERE held.cancel_requested),
           array_agg(held.id) FILTER (WHERE NOT held.cancel_requested AND NOT held.back AND held.snoozes >= pgjobq.snooze_cap())
      INTO v_snooze, v_cancel, v_over
      FROM (WITH u AS MATERIALIZED (SELECT u.id, u.token, coalesce(u.back, false) AS back, now() AS at
                                      FROM unnest(ids, tokens, handed_back) AS u(id, token, back))
            SELECT j.id, j.cancel_requested, j.snoozes, u.back FROM u JOIN pgjobq.jobs j ON j.id = u.id
             WHERE j.id = ANY (snooze_many.ids) AND j.lease_token = u.token AND j.lease_until > u.at
               FOR UPDATE OF j) held;
    IF v_cancel IS NOT NULL THEN
        PERFORM pgjobq.history_move_cancelled(v_cancel, NULL);
    END IF;
    IF v_over IS NOT NULL THEN
        -- At the cap: a failed attempt, which fail_many writes (and fences again: the same lease).
        SELECT array_agg(f.id ORDER BY f.id), array_agg(f.outcome ORDER BY f.id) INTO v_over, v_over_out
          FROM (SELECT array_agg(u.id ORDER BY u.id) AS ids, array_agg(u.token ORDER BY u.id) AS tokens,
                       array_agg(format('snoozed %s times, the cap (pgjobq.snooze_cap()): this snooze is a failed attempt; %s',
                                        pgjobq.snooze_cap(), coalesce(u.reason, 'no reason given'))
                                 ORDER BY u.id) AS errors
                  FROM unnest(ids, tokens, reasons) AS u(id, token, reason)
                 WHERE u.id = ANY (v_over)) o,
               pgjobq.fail_many(o.ids, o.tokens, o.errors) AS f;
    END IF;
    WITH input AS (
        SELECT u.id, left(u.reason, 8192) AS reason, u.delay, coalesce(u.back, false) AS back
          FROM unnest(ids, reasons, delays, handed_back) AS u(id, reason, delay, back)),
    snoozed AS (
        UPDATE pgjobq.jobs j
           SET state = 'queued', attempt = j.attempt - 1, run_at = now() + coalesce(input.delay, pgjobq.backoff(j.attempt)),
               lease_until = NULL, last_error = coalesce(input.reason, j.last_error),
               snoozes = j.snoozes + CASE WHEN input.back THEN 0 ELSE 1 END
          FROM input
         WHERE j.id = ANY (v_snooze) AND j.id = input.id
        RETURNING j.queue::text AS queue, j.run_at)
    SELECT array_agg(DISTINCT snoozed.queue) FILTER (WHERE snoozed.run_at <= now()) INTO v_queues FROM snoozed;
    PERFORM pgjobq.notify(v_queues);
    RETURN QUERY
    SELECT u.id, CASE WHEN u.id = ANY (v_snooze) THEN 'queued' WHEN u.id = ANY (v_cancel) THEN 'cancelled'
                      WHEN u.id = ANY (v_over) THEN v_over_out[array_position(v_over, u.id)]
                      ELSE 'lost' END
      FROM unnest(ids) AS u(id);
END
$$;

-- snooze_many without handed_back: every job snoozed, and counted (the form of libraries of schema 16
-- to 25, and of SQL callers that only snooze).
CREATE OR REPLACE FUNCTION pgjobq.snooze_many(ids bigint[], tokens bigint[], reasons text[] DEFAULT NULL,
                                              delays interval[] DEFAULT NULL)
RETURNS TABLE (id bigint, outcome text)
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT s.id, s.outcome FROM pgjobq.snooze_many(ids, tokens, reasons, delays, NULL::boolean[]) AS s $$;

-- cancel_many: a holder that decides its job should not run at all ends it cancelled (same fencing as
-- complete_many); its waiting children are cancelled (or run, as they asked).  Returns one row per
-- input: outcome 'cancelled' or 'lost'.
CREATE OR REPLACE FUNCTION pgjobq.cancel_many(ids bigint[], tokens bigint[], reason text DEFAULT NULL)
RETURNS TABLE (id bigint, outcome text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_nestloop = off
SET jit = off
SET plan_cache_mode = force_generic_plan
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
                                    last_error, unique_key, cancel_requested, tags, progress, concurrency_key,
                                    cancel_requested_at, cancel_told_at, route_key, snoozes, expires_at, base_priority, traceparent)
        SELECT g.id, g.queue, g.kind, g.payload, g.priority, 'cancelled', g.attempt, g.max_attempts, g.run_at,
               g.created_at, g.started_at, now(), g.lease_token, g.worker_id, g.result,
               coalesce(left(cancel_many.reason, 8192), g.last_error), g.unique_key, g.cancel_requested, g.tags,
               g.progress, g.concurrency_key, g.cancel_requested_at, g.cancel_told_at, g.route_key, g.snoozes, g.expires_at, g.base_priority, g.traceparent
          FROM gone g
        RETURNING pgjobq.history.id, pgjobq.history.queue),
    tallied AS (
        INSERT INTO pgjobq.tallies (queue, what, n) SELECT m.queue, 'cancelled', count(*) FROM moved m GROUP BY 1)
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

-- progress_many(ids, tokens, progress): a worker writes the latest progress its handlers reported, for
-- many jobs in one statement, each fenced by its lease like a completion (and unlike set_progress, an
-- element that is too large is skipped, not an error: the others are still written).  A row per
-- element: 'written', 'too_large' (over 8 KiB as jsonb text) or 'lost' (the lease is not the
-- caller's any more: ended, expired, or taken over).
CREATE OR REPLACE FUNCTION pgjobq.progress_many(ids bigint[], tokens bigint[], progress jsonb[])
RETURNS TABLE (id bigint, outcome text)
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
    WITH input AS MATERIALIZED (
        SELECT u.id, u.token, u.p, octet_length(u.p::text) <= 8192 AS fits
          FROM unnest(progress_many.ids, progress_many.tokens, progress_many.progress) AS u(id, token, p)
         WHERE u.id IS NOT NULL),
    upd AS (
        UPDATE pgjobq.jobs j SET progress = input.p
          FROM input
         WHERE j.id = ANY (progress_many.ids) AND j.id = input.id AND j.lease_token = input.token
           AND j.lease_until > now() AND input.fits
        RETURNING j.id)
    SELECT input.id, CASE WHEN upd.id IS NOT NULL THEN 'written' WHEN NOT input.fits THEN 'too_large' ELSE 'lost' END
      FROM input LEFT JOIN upd ON upd.id = input.id
$$;

-- set_progress(id, token, progress): a running job reports its progress (any JSON value of at most
-- 8 KiB), fenced like a completion: returns false, and writes nothing, when the lease is no longer
-- the caller's.
CREATE OR REPLACE FUNCTION pgjobq.set_progress(id bigint, token bigint, progress jsonb) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
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
