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
-- The same version rewrote the functions that finish jobs, so that they move them, and gave the
-- worker its claim (claim_batch, with a start key): sql/functions/transitions.sql explains the plan
-- shapes they keep, claim.sql the claim.

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

-- The hour of this migration and the next 48 exist from the start; maintenance (prune) keeps 48
-- hours ahead from then on.  Only future hours are created later, so that the default partition
-- can never hold rows of an hour being created.  The names and bounds are those of
-- pgjobq.history_partition_create (sql/functions/maintenance.sql), which does not exist yet when a
-- numbered migration runs: history_pYYYYMMDDHH, one UTC hour each.
DO $$
DECLARE
    v_hour timestamptz := date_trunc('hour', now(), 'UTC');
BEGIN
    FOR h IN 0 .. 48 LOOP
        EXECUTE format('CREATE TABLE pgjobq.%I PARTITION OF pgjobq.history_done FOR VALUES FROM (%L) TO (%L)',
                       to_char(v_hour AT TIME ZONE 'UTC', '"history_p"YYYYMMDDHH24'),
                       to_char(v_hour AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:00:00+00'),
                       to_char((v_hour + interval '1 hour') AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:00:00+00'));
        v_hour := v_hour + interval '1 hour';
    END LOOP;
END
$$;

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
