-- pgjobq schema migration 30: priority aging (docs/queues.md, "Priority aging").
-- needs: 29
--
--   queues.priority_aging  opt-in, per queue: a queued job that has been ready that long at its
--                          priority is raised one step (its priority number lowered by 1, never below
--                          -100, the best the jobs table allows), and again after each further
--                          interval (Oban Pro's Reprioritizer).  Done by age_priorities
--                          (sql/functions/maintenance.sql), which every worker's rescue pass runs; the
--                          claim is not changed, on or off.  NULL: off.
--   jobs.base_priority, history.base_priority
--                          the priority the job was enqueued with, kept when aging first raised it, so
--                          that `pgjobq show` and the history tell both.  NULL: never aged.
--
-- job_get and monitor_job return base_priority: dropped and made again by monitor.sql (which DROPs
-- them itself).  queue_list() returns priority_aging: dropped here, made again by the function files.
-- Libraries of version 29 keep working: they select queue_list()'s and job_get's columns by name.

ALTER TABLE pgjobq.jobs ADD COLUMN base_priority smallint;
ALTER TABLE pgjobq.history ADD COLUMN base_priority smallint;
ALTER TABLE pgjobq.queues ADD COLUMN priority_aging interval;
ALTER TABLE pgjobq.queues ADD CONSTRAINT queues_priority_aging_range
    CHECK (priority_aging BETWEEN interval '1 second' AND interval '365 days');

CREATE OR REPLACE VIEW pgjobq.all_jobs AS
    SELECT id, queue::text AS queue, kind::text AS kind, payload::jsonb AS payload, priority, state, attempt,
           max_attempts, run_at, created_at, started_at, finished_at, lease_until, lease_token,
           worker_id::text AS worker_id, result, last_error, unique_key::text AS unique_key, cancel_requested,
           concurrency_key::text AS concurrency_key, tags, progress, cancel_requested_at, cancel_told_at,
           route_key::text AS route_key, snoozes, expires_at, base_priority
      FROM pgjobq.jobs
    UNION ALL
    SELECT id, queue, kind, payload, priority, state, attempt, max_attempts, run_at, created_at, started_at,
           finished_at, lease_until, lease_token, worker_id, result, last_error, unique_key, cancel_requested,
           concurrency_key, tags, progress, cancel_requested_at, cancel_told_at, route_key, snoozes, expires_at,
           base_priority
      FROM pgjobq.history;

DROP FUNCTION IF EXISTS pgjobq.queue_list();
DROP FUNCTION IF EXISTS pgjobq.job_get(bigint);
DROP FUNCTION IF EXISTS pgjobq.monitor_job(bigint);
