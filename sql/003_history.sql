-- pgjobq schema version 3: finished jobs leave the hot table, and every hot statement costs what it
-- must and no more.
--
--   pgjobq.jobs      now holds only live jobs (queued, running).  Claims, completions and heartbeats
--                    touch a table whose size is the backlog, not the backlog plus all of history, so
--                    vacuum keeps up and the claim index stays short.
--   pgjobq.history   finished jobs (completed, failed, cancelled), moved there by the statement that
--                    finishes them.  Completed and cancelled jobs live in hourly partitions, so that
--                    retention drops a whole hour at once (no DELETE, no VACUUM); failed jobs, which
--                    are few and kept longer, live in one table pruned by age.
--   pgjobq.all_jobs  both, with the columns pgjobq.jobs had in version 2: read finished jobs here.
--
-- The indexes of the hot table change too: the lease index is replaced by an index of running jobs
-- by queue that does not contain lease_until, so that a heartbeat (which only moves lease_until) can
-- be a HOT update, and the index of finished jobs goes with the finished jobs.
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

-- ------------------------------------------------------------------------------------------------
-- History

CREATE TABLE pgjobq.history (
    id               bigint           NOT NULL,
    queue            text             NOT NULL,
    kind             text             NOT NULL,
    payload          jsonb            NOT NULL,
    priority         smallint         NOT NULL,
    state            pgjobq.job_state NOT NULL,
    attempt          integer          NOT NULL,
    max_attempts     integer          NOT NULL,
    run_at           timestamptz      NOT NULL,
    created_at       timestamptz      NOT NULL,
    started_at       timestamptz,
    finished_at      timestamptz      NOT NULL,
    lease_until      timestamptz,
    lease_token      bigint           NOT NULL,
    worker_id        text,
    result           jsonb,
    last_error       text,
    unique_key       text,
    cancel_requested boolean          NOT NULL DEFAULT false
) PARTITION BY LIST (state);

-- (The columns are plain types, not the domains of pgjobq.jobs: every row arrives from pgjobq.jobs,
-- already checked, and re-checking a domain on each move would cost a regex and a jsonb-to-text
-- conversion per job.)

CREATE TABLE pgjobq.history_failed PARTITION OF pgjobq.history FOR VALUES IN ('failed');
CREATE TABLE pgjobq.history_done PARTITION OF pgjobq.history FOR VALUES IN ('completed', 'cancelled')
    PARTITION BY RANGE (finished_at);
-- Rows of an hour that has no partition (before this migration, or if maintenance stopped for two
-- days) land here and are pruned by age, row by row: slower, never wrong.
CREATE TABLE pgjobq.history_done_default PARTITION OF pgjobq.history_done DEFAULT;

-- `pgjobq show ID` and `pgjobq list` find finished jobs by id (one index per partition).
CREATE INDEX history_id_idx ON pgjobq.history (id);
CREATE INDEX history_failed_finished_idx ON pgjobq.history_failed (finished_at);
CREATE INDEX history_done_default_finished_idx ON pgjobq.history_done_default (finished_at);

-- history_partition_create(hour): creates the partition of completed and cancelled jobs that
-- finished in the hour starting at `hour` (UTC hours), unless it exists.  Returns true if it created
-- one.  Partitions are named history_pYYYYMMDDHH (UTC).  Creating a partition takes an ACCESS
-- EXCLUSIVE lock on pgjobq.history_done, which completions need too: the caller sets a short
-- lock_timeout and tries again later rather than stall them.
CREATE FUNCTION pgjobq.history_partition_create(hour timestamptz) RETURNS boolean
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
    -- Bounds as ISO text in UTC, whatever the caller's DateStyle and TimeZone.
    EXECUTE format('CREATE TABLE pgjobq.%I PARTITION OF pgjobq.history_done FOR VALUES FROM (%L) TO (%L)',
                   v_name, to_char(v_from AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || '+00',
                   to_char((v_from + interval '1 hour') AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || '+00');
    RETURN true;
END
$$;

-- The hour of this migration and the next 48 exist from the start; maintenance (prune) keeps 48
-- hours ahead from then on.  Only future hours are created later, so that the default partition
-- can never hold rows of an hour being created.
SELECT pgjobq.history_partition_create(now() + make_interval(hours => h)) FROM generate_series(0, 48) AS h;

-- Finished jobs of version 2 move to history (old hours land in the default partition).
WITH moved AS (
    DELETE FROM pgjobq.jobs j WHERE j.state IN ('completed', 'failed', 'cancelled') RETURNING j.*)
INSERT INTO pgjobq.history (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at, created_at,
                            started_at, finished_at, lease_until, lease_token, worker_id, result, last_error,
                            unique_key, cancel_requested)
SELECT id, queue, kind, payload, priority, state, attempt, max_attempts, run_at, created_at, started_at,
       finished_at, NULL, lease_token, worker_id, result, last_error, unique_key, cancel_requested
  FROM moved;

-- all_jobs: every job, live or finished, with the columns pgjobq.jobs had in version 2.
CREATE VIEW pgjobq.all_jobs AS
    SELECT id, queue::text AS queue, kind::text AS kind, payload::jsonb AS payload, priority, state, attempt,
           max_attempts, run_at, created_at, started_at, finished_at, lease_until, lease_token,
           worker_id::text AS worker_id, result, last_error, unique_key::text AS unique_key, cancel_requested
      FROM pgjobq.jobs
    UNION ALL
    SELECT id, queue, kind, payload, priority, state, attempt, max_attempts, run_at, created_at, started_at,
           finished_at, lease_until, lease_token, worker_id, result, last_error, unique_key, cancel_requested
      FROM pgjobq.history;

-- ------------------------------------------------------------------------------------------------
-- The hot table

ALTER TABLE pgjobq.jobs ADD CONSTRAINT jobs_live_only CHECK (state IN ('queued', 'running'));
DROP INDEX pgjobq.jobs_finished_idx;
DROP INDEX pgjobq.jobs_lease_idx;
-- Running jobs by queue: what rescue walks (checking lease_until on each), and what a per-queue
-- concurrency limit counts.  lease_until is deliberately not a key: a heartbeat stays HOT.
CREATE INDEX jobs_running_idx ON pgjobq.jobs (queue) WHERE state = 'running';
-- Leave room on each page for HOT heartbeats.
ALTER TABLE pgjobq.jobs SET (fillfactor = 90);

-- ------------------------------------------------------------------------------------------------
-- Enqueue in bulk

-- reserve_ids(n): n new job ids from the jobs' sequence, for a producer that writes a batch of jobs
-- with COPY (pgjobq_enqueue_batch), so that every id still comes from the sequence and the caller
-- learns the ids of its jobs.  Ids reserved by a batch that then fails are simply never used.
CREATE FUNCTION pgjobq.reserve_ids(n integer) RETURNS bigint[]
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- The sequence is looked up once (a materialized CTE: a subquery is flattened, and then
    -- pg_get_serial_sequence() ran for every id, 2.3 us of the 2.8 us an id took).
    WITH s AS MATERIALIZED (SELECT pg_get_serial_sequence('pgjobq.jobs', 'id')::regclass AS seq)
    SELECT ARRAY(SELECT nextval(s.seq) FROM s, generate_series(1, least(greatest($1, 0), 1000000)))
$$;

-- ------------------------------------------------------------------------------------------------
-- Claim

-- claim_batch: the claim the worker runs.  Takes up to max_jobs due jobs of one queue, in (priority,
-- run_at, id) order, skipping rows others hold (SKIP LOCKED); each becomes running with attempt + 1,
-- a new lease token and a lease until now() + lease.  Returns only what a worker needs.
--
-- after_priority, after_run_at, after_id (all three, or none): start after this key.  A claimer that
-- passes the largest key its previous claim returned skips the index entries of every job claimed
-- since the last vacuum (they are dead but stay in the index until vacuum removes them, and a claim
-- from the head walks all of them: ~2 us per index page, growing with every job).  A job that sorts
-- before the key (a higher priority enqueued meanwhile, an explicit run_at in the past, a claim that
-- rolled back) is not seen by such a claim: the caller must also claim without a key regularly (the
-- worker does at least every 100 ms, and whenever a claim with a key comes back short).
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
               lease_until timestamptz, unique_key text, last_error text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
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
    -- Two statements rather than one with "after_id IS NULL OR ...": each keeps a plan whose index
    -- scan starts where it should.
    IF after_id IS NULL THEN
        RETURN QUERY
        WITH picked AS MATERIALIZED (
            SELECT j.id FROM pgjobq.jobs j
             WHERE j.state = 'queued' AND j.queue = claim_batch.queue AND j.run_at <= now()
             ORDER BY j.priority, j.run_at, j.id
             LIMIT claim_batch.max_jobs
               FOR UPDATE SKIP LOCKED)
        UPDATE pgjobq.jobs j
           SET state = 'running', attempt = j.attempt + 1, lease_token = j.lease_token + 1,
               lease_until = now() + claim_batch.lease, started_at = now(), worker_id = claim_batch.worker_id
         WHERE j.id = ANY (ARRAY(SELECT picked.id FROM picked))
        RETURNING j.id, j.kind::text, j.payload::jsonb, j.priority, j.attempt, j.max_attempts, j.lease_token,
                  j.run_at, j.created_at, j.started_at, j.lease_until, j.unique_key::text, j.last_error;
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
           SET state = 'running', attempt = j.attempt + 1, lease_token = j.lease_token + 1,
               lease_until = now() + claim_batch.lease, started_at = now(), worker_id = claim_batch.worker_id
         WHERE j.id = ANY (ARRAY(SELECT picked.id FROM picked))
        RETURNING j.id, j.kind::text, j.payload::jsonb, j.priority, j.attempt, j.max_attempts, j.lease_token,
                  j.run_at, j.created_at, j.started_at, j.lease_until, j.unique_key::text, j.last_error;
    END IF;
END
$$;

-- claim: the same claim, returning whole rows (the SQL API of version 1), from the head of the queue.
DROP FUNCTION pgjobq.claim(text, integer, interval, text);
CREATE FUNCTION pgjobq.claim(
    queue     text,
    max_jobs  integer  DEFAULT 1,
    lease     interval DEFAULT '30 seconds',
    worker_id text     DEFAULT NULL)
RETURNS SETOF pgjobq.jobs
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ids bigint[];
BEGIN
    SELECT array_agg(c.id) INTO v_ids FROM pgjobq.claim_batch(queue, max_jobs, lease, worker_id) c;
    -- A new statement: it sees the rows as the claim left them.
    RETURN QUERY SELECT j.* FROM pgjobq.jobs j WHERE j.id = ANY (v_ids) ORDER BY j.priority, j.run_at, j.id;
END
$$;

-- ------------------------------------------------------------------------------------------------
-- Fenced writes by the holder.  Each (id, token) is accepted only while the job is running under that
-- token and its lease has not expired (lease_until > now(): only running jobs have a lease).  Jobs that
-- finish move to pgjobq.history in the same statement.

-- history_move_cancelled(ids, reason): moves live jobs (locked by the caller) to history as cancelled,
-- with reason as last_error when given.  Returns how many moved.
CREATE FUNCTION pgjobq.history_move_cancelled(ids bigint[], reason text) RETURNS integer
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
    WITH gone AS (DELETE FROM pgjobq.jobs j WHERE j.id = ANY ($1) RETURNING j.*),
    moved AS (
        INSERT INTO pgjobq.history (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at,
                                    created_at, started_at, finished_at, lease_token, worker_id, result,
                                    last_error, unique_key, cancel_requested)
        SELECT g.id, g.queue, g.kind, g.payload, g.priority, 'cancelled', g.attempt, g.max_attempts, g.run_at,
               g.created_at, g.started_at, now(), g.lease_token, g.worker_id, g.result,
               coalesce($2, g.last_error), g.unique_key, g.cancel_requested
          FROM gone g
        RETURNING 1)
    SELECT count(*)::integer FROM moved
$$;

-- complete_many: running -> completed (history), or cancelled when a cancel was requested.
-- Returns one row per input: outcome 'completed', 'cancelled' or 'lost'.
CREATE OR REPLACE FUNCTION pgjobq.complete_many(ids bigint[], tokens bigint[], results jsonb[] DEFAULT NULL)
RETURNS TABLE (id bigint, outcome text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
BEGIN
    IF cardinality(ids) IS DISTINCT FROM cardinality(tokens)
       OR (results IS NOT NULL AND cardinality(results) <> cardinality(ids)) THEN
        RAISE EXCEPTION 'pgjobq.complete_many: ids, tokens and results must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH input AS MATERIALIZED (
        SELECT u.id, u.token, u.result, now() AS at FROM unnest(ids, tokens, results) AS u(id, token, result)),
    gone AS (
        DELETE FROM pgjobq.jobs j USING input
         WHERE j.id = ANY (complete_many.ids) AND j.id = input.id AND j.lease_token = input.token
           AND j.lease_until > input.at
        RETURNING j.id, j.queue, j.kind, j.payload, j.priority, j.cancel_requested, j.attempt, j.max_attempts,
                  j.run_at, j.created_at, j.started_at, j.lease_token, j.worker_id, j.last_error, j.unique_key,
                  input.result),
    moved AS (
        INSERT INTO pgjobq.history (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at,
                                    created_at, started_at, finished_at, lease_token, worker_id, result,
                                    last_error, unique_key, cancel_requested)
        SELECT g.id, g.queue, g.kind, g.payload, g.priority,
               CASE WHEN g.cancel_requested THEN 'cancelled'::pgjobq.job_state
                    ELSE 'completed'::pgjobq.job_state END,
               g.attempt, g.max_attempts, g.run_at, g.created_at, g.started_at, now(), g.lease_token, g.worker_id,
               g.result, g.last_error, g.unique_key, g.cancel_requested
          FROM gone g
        RETURNING pgjobq.history.id, pgjobq.history.state)
    SELECT input.id, coalesce(moved.state::text, 'lost') FROM input LEFT JOIN moved ON moved.id = input.id;
END
$$;

-- fail_many: record failed attempts (same fencing as complete_many).  While attempts remain the job
-- goes back to queued with run_at = now() + retry_delay (or + backoff(attempt) when the delay is
-- NULL); otherwise, or with permanent = true, it ends failed (history).  A job whose cancellation was
-- requested ends cancelled.  The error text is kept in last_error (the first 8 KiB).  Returns one row
-- per input: outcome 'queued', 'failed', 'cancelled' or 'lost', and the new run_at.
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
    SELECT array_agg(held.id) FILTER (WHERE held.final), array_agg(held.id) FILTER (WHERE NOT held.final)
      INTO v_final, v_retry
      FROM (WITH u AS MATERIALIZED (SELECT u.id, u.token, u.permanent, now() AS at
                                      FROM unnest(ids, tokens, permanent) AS u(id, token, permanent))
            SELECT j.id, j.cancel_requested OR coalesce(u.permanent, false) OR j.attempt >= j.max_attempts AS final
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
                  j.run_at, j.created_at, j.started_at, j.lease_token, j.worker_id, j.unique_key),
    moved AS (
        INSERT INTO pgjobq.history (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at,
                                    created_at, started_at, finished_at, lease_token, worker_id, result,
                                    last_error, unique_key, cancel_requested)
        SELECT g.id, g.queue, g.kind, g.payload, g.priority,
               CASE WHEN g.cancel_requested THEN 'cancelled'::pgjobq.job_state ELSE 'failed'::pgjobq.job_state END,
               g.attempt, g.max_attempts, g.run_at, g.created_at, g.started_at, now(), g.lease_token, g.worker_id,
               NULL, input.error, g.unique_key, g.cancel_requested
          FROM gone g JOIN input ON input.id = g.id
        RETURNING pgjobq.history.id, pgjobq.history.state),
    retried AS (
        UPDATE pgjobq.jobs j
           SET state = 'queued', run_at = now() + coalesce(input.delay, pgjobq.backoff(j.attempt)),
               lease_until = NULL, last_error = input.error
          FROM input
         WHERE j.id = ANY (v_retry) AND j.id = input.id
        RETURNING j.id, j.run_at, j.queue::text AS queue),
    notified AS (
        SELECT pgjobq.notify(array_agg(retried.queue)) AS x FROM retried WHERE retried.run_at <= now())
    SELECT input.id, coalesce(moved.state::text, CASE WHEN retried.id IS NOT NULL THEN 'queued' END, 'lost'),
           retried.run_at
      FROM input LEFT JOIN moved ON moved.id = input.id LEFT JOIN retried ON retried.id = input.id
     CROSS JOIN notified;
END
$$;

-- extend_many: the heartbeat.  Moves the lease of each held job to now() + lease (same fencing as
-- complete_many); the update touches no indexed column, so it can be HOT.  A job whose cancellation
-- was requested ends cancelled here, so its holder learns to stop.  Returns one row per input:
-- outcome 'extended', 'cancelled' or 'lost', and the new lease_until.
CREATE OR REPLACE FUNCTION pgjobq.extend_many(ids bigint[], tokens bigint[], lease interval DEFAULT '30 seconds')
RETURNS TABLE (id bigint, outcome text, lease_until timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    v_held   bigint[];
    v_until  timestamptz[];
    v_cancel bigint[];
BEGIN
    IF cardinality(ids) IS DISTINCT FROM cardinality(tokens) THEN
        RAISE EXCEPTION 'pgjobq.extend_many: ids and tokens must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF lease IS NULL OR lease <= interval '0' THEN
        RAISE EXCEPTION 'pgjobq.extend_many: lease must be positive, not %', lease
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- One UPDATE renews every held lease (and locks the rows, so the decision below is stable); a job
    -- whose cancellation was requested keeps its lease and is then moved to history as cancelled.
    WITH u AS MATERIALIZED (SELECT u.id, u.token, now() AS at FROM unnest(ids, tokens) AS u(id, token)),
    held AS (
        UPDATE pgjobq.jobs j
           SET lease_until = CASE WHEN j.cancel_requested THEN j.lease_until ELSE now() + extend_many.lease END
          FROM u
         WHERE j.id = ANY (extend_many.ids) AND j.id = u.id AND j.lease_token = u.token AND j.lease_until > u.at
        RETURNING j.id, j.lease_until, j.cancel_requested)
    SELECT array_agg(held.id) FILTER (WHERE NOT held.cancel_requested),
           array_agg(held.lease_until) FILTER (WHERE NOT held.cancel_requested),
           array_agg(held.id) FILTER (WHERE held.cancel_requested)
      INTO v_held, v_until, v_cancel FROM held;
    IF v_cancel IS NOT NULL THEN
        PERFORM pgjobq.history_move_cancelled(v_cancel, NULL);
    END IF;
    RETURN QUERY
    SELECT u.id,
           CASE WHEN h.id IS NOT NULL THEN 'extended' WHEN u.id = ANY (v_cancel) THEN 'cancelled' ELSE 'lost' END,
           h.until
      FROM unnest(ids) AS u(id) LEFT JOIN unnest(v_held, v_until) AS h(id, until) ON h.id = u.id;
END
$$;

-- release_many: running -> queued now, attempt given back, for jobs the caller holds (worker shutdown);
-- a job whose cancellation was requested ends cancelled instead.  Returns one row per input: outcome
-- 'queued', 'cancelled' or 'lost'.
CREATE OR REPLACE FUNCTION pgjobq.release_many(ids bigint[], tokens bigint[], reason text DEFAULT NULL)
RETURNS TABLE (id bigint, outcome text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
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

-- cancel_many: a holder that decides its job should not run at all ends it cancelled (same fencing as
-- complete_many).  Returns one row per input: outcome 'cancelled' or 'lost'.
CREATE OR REPLACE FUNCTION pgjobq.cancel_many(ids bigint[], tokens bigint[], reason text DEFAULT NULL)
RETURNS TABLE (id bigint, outcome text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
BEGIN
    IF cardinality(ids) IS DISTINCT FROM cardinality(tokens) THEN
        RAISE EXCEPTION 'pgjobq.cancel_many: ids and tokens must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH input AS MATERIALIZED (SELECT u.id, u.token, now() AS at FROM unnest(ids, tokens) AS u(id, token)),
    gone AS (
        DELETE FROM pgjobq.jobs j USING input
         WHERE j.id = ANY (cancel_many.ids) AND j.id = input.id AND j.lease_token = input.token
           AND j.lease_until > input.at
        RETURNING j.*),
    moved AS (
        INSERT INTO pgjobq.history (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at,
                                    created_at, started_at, finished_at, lease_token, worker_id, result,
                                    last_error, unique_key, cancel_requested)
        SELECT g.id, g.queue, g.kind, g.payload, g.priority, 'cancelled', g.attempt, g.max_attempts, g.run_at,
               g.created_at, g.started_at, now(), g.lease_token, g.worker_id, g.result,
               coalesce(left(cancel_many.reason, 8192), g.last_error), g.unique_key, g.cancel_requested
          FROM gone g
        RETURNING pgjobq.history.id)
    SELECT input.id, CASE WHEN moved.id IS NULL THEN 'lost' ELSE 'cancelled' END
      FROM input LEFT JOIN moved ON moved.id = input.id;
END
$$;

-- ------------------------------------------------------------------------------------------------
-- Administration

-- cancel: a queued job becomes cancelled at once (it moves to history); a running job is marked, and
-- ends cancelled at its holder's next heartbeat, completion or failure (or when its lease expires).
-- Returns 'cancelled', 'cancel_requested', 'not_found', or 'already_' and the final state the job
-- already had ('already_completed', 'already_failed', 'already_cancelled').
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

-- retry: run a finished (completed, failed or cancelled) or scheduled job again now.  A finished job
-- moves back from history, keeping its id, attempt count and result; max_attempts is raised when
-- needed so that one more attempt is allowed.  Returns 'queued', 'not_found', or 'running' (a
-- running job cannot be retried).  Fails with a unique violation if the job's unique key is held by
-- another queued or running job.
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
        IF v_state = 'running' THEN
            RETURN 'running';
        END IF;
        UPDATE pgjobq.jobs j SET run_at = now(), max_attempts = greatest(j.max_attempts, j.attempt + 1)
         WHERE j.id = retry.id;
    ELSE
        -- DELETE ... RETURNING locks and removes the history row in one step, so two retries of one
        -- job cannot both move it.
        WITH gone AS (DELETE FROM pgjobq.history h WHERE h.id = retry.id RETURNING h.*)
        INSERT INTO pgjobq.jobs (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at,
                                 created_at, started_at, lease_token, worker_id, result, last_error, unique_key)
        OVERRIDING SYSTEM VALUE
        SELECT g.id, g.queue, g.kind, g.payload, g.priority, 'queued', g.attempt,
               greatest(g.max_attempts, g.attempt + 1), now(), g.created_at, g.started_at, g.lease_token,
               g.worker_id, g.result, g.last_error, g.unique_key
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

-- ------------------------------------------------------------------------------------------------
-- Maintenance

-- rescue_expired: jobs whose lease ended without a completion (the worker crashed, stalled or lost its
-- connection) go back to queued, or end failed when no attempts remain, or cancelled when that was
-- requested (both move to history).  The writes re-check the state and the lease, so a job completed
-- meanwhile is never touched.  At most max_jobs per call; returns how many were rescued.
CREATE OR REPLACE FUNCTION pgjobq.rescue_expired(max_jobs integer DEFAULT 1000) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_final   bigint[];
    v_requeue bigint[];
    v_due     text[];
BEGIN
    -- Lock expired leases (skipping rows others hold) and decide from their latest versions.
    SELECT array_agg(e.id) FILTER (WHERE e.final), array_agg(e.id) FILTER (WHERE NOT e.final)
      INTO v_final, v_requeue
      FROM (SELECT j.id, j.cancel_requested OR j.attempt >= j.max_attempts AS final
              FROM pgjobq.jobs j
             WHERE j.state = 'running' AND j.lease_until < now()
             LIMIT rescue_expired.max_jobs
               FOR UPDATE SKIP LOCKED) e;
    IF v_final IS NOT NULL THEN
        WITH gone AS (DELETE FROM pgjobq.jobs j WHERE j.id = ANY (v_final) RETURNING j.*)
        INSERT INTO pgjobq.history (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at,
                                    created_at, started_at, finished_at, lease_token, worker_id, result,
                                    last_error, unique_key, cancel_requested)
        SELECT g.id, g.queue, g.kind, g.payload, g.priority,
               CASE WHEN g.cancel_requested THEN 'cancelled'::pgjobq.job_state ELSE 'failed'::pgjobq.job_state END,
               g.attempt, g.max_attempts, g.run_at, g.created_at, g.started_at, now(), g.lease_token, g.worker_id,
               g.result,
               format('lease expired at %s: worker %s stopped renewing it (crashed, stalled or lost its connection)',
                      g.lease_until, coalesce(g.worker_id, '?')),
               g.unique_key, g.cancel_requested
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
    RETURN coalesce(cardinality(v_final), 0) + coalesce(cardinality(v_requeue), 0);
END
$$;

-- prune: retention.  Completed and cancelled jobs are removed an hour at a time: the partition of an
-- hour is dropped once the whole hour is older than completed_age (so a job is kept at least
-- completed_age and at most an hour longer), without a DELETE or a VACUUM.  Failed jobs older than
-- failed_age, and rows in the default partition older than their age, are deleted, at most max_jobs
-- per call.  Also creates the partitions of the next 48 hours.  DDL waits at most 100 ms for its lock
-- (completions need the same lock) and is otherwise left for the next call.  Returns how many jobs
-- were removed (a dropped partition counts its estimated rows); call again while it returns max_jobs
-- or more.
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
    v_created integer := 0;
BEGIN
    IF completed_age IS NULL OR failed_age IS NULL OR completed_age < interval '0' OR failed_age < interval '0' THEN
        RAISE EXCEPTION 'pgjobq.prune: ages must not be negative' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Hours whose partition can go: the partition's end is older than the cutoff.
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
            -- Counted from the statistics; a partition never analyzed is small enough to count.
            IF v_part.reltuples >= 0 THEN
                v_n := v_part.reltuples;
            ELSE
                EXECUTE format('SELECT count(*) FROM pgjobq.%I', v_part.relname) INTO v_n;
            END IF;
            EXECUTE format('DROP TABLE pgjobq.%I', v_part.relname);
            v_count := v_count + v_n;
        EXCEPTION WHEN lock_not_available THEN
            EXIT; -- busy: the next call tries again
        END;
    END LOOP;
    -- The next 48 hours (only future hours: the default partition cannot hold their rows).
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
         LIMIT prune.max_jobs FOR UPDATE SKIP LOCKED)
    DELETE FROM pgjobq.history_failed h WHERE h.id = ANY (ARRAY(SELECT old.id FROM old))
       AND h.finished_at < now() - prune.failed_age;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_count := v_count + v_n;
    WITH old AS MATERIALIZED (
        SELECT h.id FROM pgjobq.history_done_default h WHERE h.finished_at < now() - prune.completed_age
         LIMIT prune.max_jobs FOR UPDATE SKIP LOCKED)
    DELETE FROM pgjobq.history_done_default h WHERE h.id = ANY (ARRAY(SELECT old.id FROM old))
       AND h.finished_at < now() - prune.completed_age;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_count := v_count + v_n;
    RETURN v_count;
END
$$;

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

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgjobq FROM PUBLIC;
