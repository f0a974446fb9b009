-- pgjobq schema, migration 16: when a running job's cancel was requested, and when its holder was told.
-- needs: 15
--
-- pgjobq.cancel and pgjobq.cancel_where mark a running job (cancel_requested) and now note when
-- (cancel_requested_at), and notify the worker that holds it, which renews its leases at once rather
-- than at its next heartbeat: the heartbeat that ends the job cancelled, and asks its handler to
-- stop, notes that moment (cancel_told_at).  Both go to the history with the job; `pgjobq show`
-- prints them.  Jobs whose cancel was requested before this migration have neither.
ALTER TABLE pgjobq.jobs ADD COLUMN cancel_requested_at timestamptz, ADD COLUMN cancel_told_at timestamptz;
ALTER TABLE pgjobq.history ADD COLUMN cancel_requested_at timestamptz, ADD COLUMN cancel_told_at timestamptz;

CREATE OR REPLACE VIEW pgjobq.all_jobs AS
    SELECT id, queue::text AS queue, kind::text AS kind, payload::jsonb AS payload, priority, state, attempt,
           max_attempts, run_at, created_at, started_at, finished_at, lease_until, lease_token,
           worker_id::text AS worker_id, result, last_error, unique_key::text AS unique_key, cancel_requested,
           concurrency_key::text AS concurrency_key, tags, progress, cancel_requested_at, cancel_told_at
      FROM pgjobq.jobs
    UNION ALL
    SELECT id, queue, kind, payload, priority, state, attempt, max_attempts, run_at, created_at, started_at,
           finished_at, lease_until, lease_token, worker_id, result, last_error, unique_key, cancel_requested,
           concurrency_key, tags, progress, cancel_requested_at, cancel_told_at
      FROM pgjobq.history;
