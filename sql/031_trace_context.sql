-- pgjobq schema migration 31: a job's trace context (docs/queues.md, "Trace context").
-- needs: 30
--
--   pgjobq.traceparent   a W3C Trace Context traceparent (https://www.w3.org/TR/trace-context/) of
--                        version 00: "00-" 32 lowercase hex digits of trace id (not all zero) "-" 16
--                        of parent id (not all zero) "-" 2 of flags.  The one judge of the format:
--                        every way in (enqueue, enqueue_many, enqueue_keyed, enqueue_graph, COPY, an
--                        INSERT by hand) stores through it, and pgjobq.traceparent_why
--                        (sql/functions/enqueue.sql) asks it to name a bad value.
--   jobs.traceparent, history.traceparent
--                        the trace context of whoever enqueued the job (River's otelriver, PgQueuer
--                        and Hatchet carry the same), handed to the job's handler at every attempt
--                        (the claim returns it) and kept in the history.  NULL: none.
--
-- enqueue, enqueue_many and enqueue_keyed take traceparent(s) last, enqueue_explain names a bad one,
-- and claim_next and claim_batch return it as their last column: dropped here and made again by the
-- function files (job_get and monitor_job drop themselves there).  Libraries of version 30 keep
-- working: they call enqueue_many and enqueue_keyed with their first arguments by position (the new
-- array comes last, with a default), enqueue by name, and select the claims' columns by name.

CREATE DOMAIN pgjobq.traceparent AS text
    CONSTRAINT traceparent_format CHECK (length(VALUE) = 55
                                         AND VALUE ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
                                         AND substr(VALUE, 4, 32) <> '00000000000000000000000000000000'
                                         AND substr(VALUE, 37, 16) <> '0000000000000000');

ALTER TABLE pgjobq.jobs ADD COLUMN traceparent pgjobq.traceparent;
ALTER TABLE pgjobq.history ADD COLUMN traceparent text;

CREATE OR REPLACE VIEW pgjobq.all_jobs AS
    SELECT id, queue::text AS queue, kind::text AS kind, payload::jsonb AS payload, priority, state, attempt,
           max_attempts, run_at, created_at, started_at, finished_at, lease_until, lease_token,
           worker_id::text AS worker_id, result, last_error, unique_key::text AS unique_key, cancel_requested,
           concurrency_key::text AS concurrency_key, tags, progress, cancel_requested_at, cancel_told_at,
           route_key::text AS route_key, snoozes, expires_at, base_priority, traceparent::text AS traceparent
      FROM pgjobq.jobs
    UNION ALL
    SELECT id, queue, kind, payload, priority, state, attempt, max_attempts, run_at, created_at, started_at,
           finished_at, lease_until, lease_token, worker_id, result, last_error, unique_key, cancel_requested,
           concurrency_key, tags, progress, cancel_requested_at, cancel_told_at, route_key, snoozes, expires_at,
           base_priority, traceparent
      FROM pgjobq.history;

DROP FUNCTION IF EXISTS pgjobq.enqueue(text, text, jsonb, smallint, timestamptz, interval, integer, text, text, bigint[],
                                       text[], text, text, text, interval, timestamptz, interval);
DROP FUNCTION IF EXISTS pgjobq.enqueue_many(text[], text[], jsonb[], smallint[], timestamptz[], interval[], integer[],
                                            text[], text[], boolean, text[], timestamptz[], interval[]);
DROP FUNCTION IF EXISTS pgjobq.enqueue_keyed(text[], text[], jsonb[], smallint[], timestamptz[], interval[], integer[],
                                             text[], text[], interval[], text[], boolean, text[], timestamptz[],
                                             interval[]);
DROP FUNCTION IF EXISTS pgjobq.enqueue_explain(text[], text[], jsonb[], smallint[], integer[], text[], text[], text[]);
DROP FUNCTION IF EXISTS pgjobq.claim_next(text, integer, interval, text, smallint[], timestamptz[], bigint[],
                                          timestamptz[], bigint[], boolean);
DROP FUNCTION IF EXISTS pgjobq.claim_batch(text, integer, interval, text, smallint, timestamptz, bigint);
