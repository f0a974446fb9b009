-- pgjobq schema, migration 6: what `pgjobq serve` (metrics and the dashboard) reads.
--
-- * pgjobq.workers: every worker process says it is alive every few seconds (worker_beat, from its
--   write connection), so that a dashboard can show which workers run and what they hold.
-- * pgjobq.tallies: retries and lost leases, counted where they happen (fail_many, rescue_expired),
--   one row per queue per statement: insert-only, so no writer ever waits for another.  Completions,
--   failures and cancellations need no tally: each one is a row of pgjobq.history.
-- * A BRIN index on finished_at, so that "what finished in the last N seconds" reads a few pages of
--   the newest partition instead of the whole hour (a BRIN index costs inserts almost nothing).
-- * The pgjobq_monitor role (pgjobq migrate --roles): reading, nothing else.

CREATE TABLE pgjobq.workers (
    id         text        PRIMARY KEY,
    host       text        NOT NULL,
    pid        integer     NOT NULL,
    version    text        NOT NULL,
    queues     text        NOT NULL,
    started_at timestamptz NOT NULL,
    last_seen  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT workers_id_length CHECK (length(id) BETWEEN 1 AND 255),
    CONSTRAINT workers_text_lengths CHECK (length(host) <= 255 AND length(version) <= 64
                                           AND length(queues) <= 4096)
);

CREATE TABLE pgjobq.tallies (
    id    bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at    timestamptz NOT NULL DEFAULT now(),
    queue text        NOT NULL,
    what  text        NOT NULL CHECK (what IN ('retried', 'lost')),
    n     bigint      NOT NULL
);
CREATE INDEX tallies_at_idx ON pgjobq.tallies (at);

CREATE INDEX history_done_finished_brin ON pgjobq.history_done USING brin (finished_at);

-- worker_beat(id, host, pid, version, queues): the worker `id` (serving queues "name:concurrency,...")
-- is alive now; started_at is its first beat (or the first since its pid changed).  Also forgets
-- workers unseen for a day and tallies older than a day (one caller at a time does that).
CREATE FUNCTION pgjobq.worker_beat(id text, host text, pid integer, version text, queues text) RETURNS void
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
CREATE FUNCTION pgjobq.worker_gone(id text) RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    DELETE FROM pgjobq.workers w WHERE w.id = $1
$$;

-- fail_many and rescue_expired as in migration 3, with their tallies.
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
    tallied AS (
        INSERT INTO pgjobq.tallies (queue, what, n)
        SELECT retried.queue, 'retried', count(*) FROM retried GROUP BY retried.queue),
    notified AS (
        SELECT pgjobq.notify(array_agg(retried.queue)) AS x FROM retried WHERE retried.run_at <= now())
    SELECT input.id, coalesce(moved.state::text, CASE WHEN retried.id IS NOT NULL THEN 'queued' END, 'lost'),
           retried.run_at
      FROM input LEFT JOIN moved ON moved.id = input.id LEFT JOIN retried ON retried.id = input.id
     CROSS JOIN notified;
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
BEGIN
    -- Lock expired leases (skipping rows others hold) and decide from their latest versions.
    SELECT array_agg(e.id) FILTER (WHERE e.final), array_agg(e.id) FILTER (WHERE NOT e.final)
      INTO v_final, v_requeue
      FROM (SELECT j.id, j.cancel_requested OR j.attempt >= j.max_attempts AS final
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

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgjobq FROM PUBLIC;
