-- pgjobq schema version 4: queue settings, enforced inside the claim.
--
--   pgjobq.queues    one row per queue that has settings; a queue without a row behaves as before.
--                    paused_at: the claim returns nothing (workers keep the leases they hold);
--                    concurrency: at most N jobs of the queue running under a valid lease, across
--                    every worker; rate_limit / rate_period: at most N jobs started in any window of
--                    that length.
--   pgjobq.schedules cron schedules, whose jobs every worker's tick enqueues.
--
-- How the claim enforces the settings, and why so: claim_batch in sql/functions/claim.sql.  The
-- functions that set them: queues.sql; the calendar and the tick: schedules.sql.

CREATE TABLE pgjobq.queues (
    name          pgjobq.identifier PRIMARY KEY,
    paused_at     timestamptz,
    pause_reason  text,
    concurrency   integer,
    key_concurrency integer,
    rate_limit    integer,
    rate_period   interval,
    recent_starts timestamptz[]     NOT NULL DEFAULT '{}',
    updated_at    timestamptz       NOT NULL DEFAULT now(),
    CONSTRAINT queues_concurrency_range CHECK (concurrency BETWEEN 1 AND 1000000),
    CONSTRAINT queues_key_concurrency_range CHECK (key_concurrency BETWEEN 1 AND 1000000),
    CONSTRAINT queues_rate_range CHECK (rate_limit BETWEEN 1 AND 10000),
    CONSTRAINT queues_rate_period_range CHECK (rate_period >= interval '1 millisecond'
                                               AND rate_period <= interval '1 day'),
    CONSTRAINT queues_rate_complete CHECK ((rate_limit IS NULL) = (rate_period IS NULL)),
    CONSTRAINT queues_pause_reason_length CHECK (octet_length(pause_reason) <= 1024),
    CONSTRAINT queues_reason_only_when_paused CHECK (pause_reason IS NULL OR paused_at IS NOT NULL)
);

-- A job may carry a concurrency key (a customer, a tenant, an API account): with the queue's
-- key_concurrency set, at most that many jobs of one key run at once.  The key lives while the job
-- does (the history does not keep it).  Claims under a key limit walk the distinct keys of the queued
-- jobs through this index (one probe per key), so that a busy key never holds back the others.
ALTER TABLE pgjobq.jobs ADD COLUMN concurrency_key pgjobq.short_text;
CREATE INDEX jobs_key_idx ON pgjobq.jobs (queue, concurrency_key, priority, run_at, id)
    WHERE state = 'queued' AND concurrency_key IS NOT NULL;

-- Unique keys are scoped to their queue (they were global): the same key in two queues names two jobs.
DROP INDEX pgjobq.jobs_unique_key_idx;
CREATE UNIQUE INDEX jobs_unique_key_idx ON pgjobq.jobs (queue, unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('queued', 'running');

-- enqueue_many and enqueue take the concurrency key too (NULL: none): version 1's signatures go
-- (IF EXISTS: on a new database the functions are created after the numbered migrations).
DROP FUNCTION IF EXISTS pgjobq.enqueue(text, text, jsonb, smallint, timestamptz, interval, integer, text);
DROP FUNCTION IF EXISTS pgjobq.enqueue_many(text[], text[], jsonb[], smallint[], timestamptz[], interval[],
                                            integer[], text[]);

-- ------------------------------------------------------------------------------------------------
-- Schedules: jobs enqueued by the calendar, without a leader (schedule_tick).

CREATE TABLE pgjobq.schedules (
    name         pgjobq.identifier PRIMARY KEY,
    cron         text              NOT NULL,
    tz           text              NOT NULL DEFAULT 'UTC',
    queue        pgjobq.identifier NOT NULL DEFAULT 'default',
    kind         pgjobq.identifier NOT NULL DEFAULT 'default',
    payload      pgjobq.payload    NOT NULL DEFAULT '{}',
    priority     smallint          NOT NULL DEFAULT 0,
    max_attempts integer           NOT NULL DEFAULT 25,
    enabled      boolean           NOT NULL DEFAULT true,
    catch_up     text              NOT NULL DEFAULT 'latest',
    next_run     timestamptz,
    last_run     timestamptz,
    created_at   timestamptz       NOT NULL DEFAULT now(),
    updated_at   timestamptz       NOT NULL DEFAULT now(),
    CONSTRAINT schedules_catch_up CHECK (catch_up IN ('skip', 'latest', 'all')),
    CONSTRAINT schedules_priority_range CHECK (priority BETWEEN -100 AND 100),
    CONSTRAINT schedules_max_attempts_range CHECK (max_attempts BETWEEN 1 AND 1000),
    CONSTRAINT schedules_cron_length CHECK (octet_length(cron) <= 256),
    CONSTRAINT schedules_tz_length CHECK (octet_length(tz) <= 64)
);
CREATE INDEX schedules_due_idx ON pgjobq.schedules (next_run) WHERE enabled;
