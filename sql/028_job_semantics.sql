-- pgjobq schema migration 28: jobs that expire while queued (docs/queues.md, "Expiry").
-- needs: 27
--
--   jobs.expires_at, history.expires_at
--                        the moment after which no attempt of the job starts (Hatchet's schedule
--                        timeout, pg-boss's expiry of a created job): a claim steps over a job past it,
--                        and the sweep (expire_queued, sql/functions/maintenance.sql, run by every
--                        worker's rescue pass) ends it cancelled, last_error 'expired: ...'.  Given at
--                        enqueue (expires_at, or expire_after counted from the job's run_at), or the
--                        queue's default.  NULL: never.  Kept in the history, as the job had it.
--   queues.expire_after  the queue's default expire_after, for the jobs enqueued without one.
--   jobs_expiry_idx      the live jobs that may expire, by when: the sweep's walk, empty when no job
--                        has an expiry (a partial index on a column nobody sets costs the enqueues
--                        and the claims nothing but the test of its predicate).
--
-- enqueue, enqueue_many and enqueue_keyed take expires_at(s) and expire_after(s), and queue_list()
-- returns expire_after: dropped here and made again by the function files.  Libraries of version 27
-- keep working: they call enqueue_many and enqueue_keyed with their first arguments by position
-- and notify and route_keys after them as before (the new arrays come last, with defaults), enqueue
-- by name, and select queue_list()'s columns by name.

ALTER TABLE pgjobq.jobs ADD COLUMN expires_at timestamptz;
ALTER TABLE pgjobq.history ADD COLUMN expires_at timestamptz;
ALTER TABLE pgjobq.queues ADD COLUMN expire_after interval;
ALTER TABLE pgjobq.queues ADD CONSTRAINT queues_expire_after_range
    CHECK (expire_after BETWEEN interval '1 second' AND interval '365 days');

CREATE INDEX jobs_expiry_idx ON pgjobq.jobs (expires_at)
    WHERE expires_at IS NOT NULL AND state IN ('waiting', 'queued');

CREATE OR REPLACE VIEW pgjobq.all_jobs AS
    SELECT id, queue::text AS queue, kind::text AS kind, payload::jsonb AS payload, priority, state, attempt,
           max_attempts, run_at, created_at, started_at, finished_at, lease_until, lease_token,
           worker_id::text AS worker_id, result, last_error, unique_key::text AS unique_key, cancel_requested,
           concurrency_key::text AS concurrency_key, tags, progress, cancel_requested_at, cancel_told_at,
           route_key::text AS route_key, snoozes, expires_at
      FROM pgjobq.jobs
    UNION ALL
    SELECT id, queue, kind, payload, priority, state, attempt, max_attempts, run_at, created_at, started_at,
           finished_at, lease_until, lease_token, worker_id, result, last_error, unique_key, cancel_requested,
           concurrency_key, tags, progress, cancel_requested_at, cancel_told_at, route_key, snoozes, expires_at
      FROM pgjobq.history;

DROP FUNCTION IF EXISTS pgjobq.queue_list();
DROP FUNCTION IF EXISTS pgjobq.enqueue(text, text, jsonb, smallint, timestamptz, interval, integer, text, text, bigint[],
                                       text[], text, text, text, interval);
DROP FUNCTION IF EXISTS pgjobq.enqueue_many(text[], text[], jsonb[], smallint[], timestamptz[], interval[], integer[],
                                            text[], text[], boolean, text[]);
DROP FUNCTION IF EXISTS pgjobq.enqueue_keyed(text[], text[], jsonb[], smallint[], timestamptz[], interval[], integer[],
                                             text[], text[], interval[], text[], boolean, text[]);
