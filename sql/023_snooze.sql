-- pgjobq schema migration 23: how many times each job was snoozed, against a cap (docs/durable.md).
-- needs: 22
--
--   jobs.snoozes, history.snoozes
--                        the snoozes of the job (snooze_many: a handler's PGJOBQ_OUTCOME_SNOOZE, an
--                        --exec exit 99, a coprocess's or Python's Snooze), which give the attempt back.
--                        At the cap (1,000: pgjobq.snooze_cap()) a snooze is a failed attempt instead,
--                        so that a handler that snoozes for ever ends as its attempts say.  A metadata
--                        change only (a constant default): no row is rewritten.
--
-- Libraries of version 22 keep working: snooze_many keeps its signature.

ALTER TABLE pgjobq.jobs ADD COLUMN snoozes integer NOT NULL DEFAULT 0;
ALTER TABLE pgjobq.history ADD COLUMN snoozes integer NOT NULL DEFAULT 0;

CREATE OR REPLACE VIEW pgjobq.all_jobs AS
    SELECT id, queue::text AS queue, kind::text AS kind, payload::jsonb AS payload, priority, state, attempt,
           max_attempts, run_at, created_at, started_at, finished_at, lease_until, lease_token,
           worker_id::text AS worker_id, result, last_error, unique_key::text AS unique_key, cancel_requested,
           concurrency_key::text AS concurrency_key, tags, progress, cancel_requested_at, cancel_told_at,
           route_key::text AS route_key, snoozes
      FROM pgjobq.jobs
    UNION ALL
    SELECT id, queue, kind, payload, priority, state, attempt, max_attempts, run_at, created_at, started_at,
           finished_at, lease_until, lease_token, worker_id, result, last_error, unique_key, cancel_requested,
           concurrency_key, tags, progress, cancel_requested_at, cancel_told_at, route_key, snoozes
      FROM pgjobq.history;
