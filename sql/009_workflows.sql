-- pgjobq schema, migration 9: workflows.  Jobs that wait for other jobs, graphs enqueued at once,
-- batches with a callback, progress and tags.
-- needs: 7
--
--   pgjobq.deps       one row per (parent, child) edge.  A child is `waiting` (a live state that no
--                     claim sees: the claim index holds queued rows only) while pending_parents > 0.
--   jobs.has_children set, under the parent's row lock, by whoever enqueues a child of a live job.
--                     The statement that finishes a job returns it, and only then is a second
--                     statement run to release the children, so a job without children pays nothing.
--   jobs.pending_parents
--                     decremented by each parent's fenced completion, under the child's row lock
--                     (children are locked in id order): 500 parents completed at once by 8 workers
--                     leave the count at 0 exactly once, and the child is queued exactly once.
--
-- The race that a "check the parents, then insert the child" design loses (pg-boss's review of
-- flows): a parent completes between the check and the insert, and the child waits forever.  Here
-- the child's enqueue locks its live parents (UPDATE ... has_children) before it counts them, so a
-- parent's completion either finished before (the parent is found in history, completed) or waits
-- for the enqueue to commit and then, in a statement that starts after that commit, sees the edge.
--
-- Libraries of version 7 keep working: no signature they call changed (pgjobq.enqueue gained
-- arguments with defaults), and their claims never return a waiting job.  Listing a waiting job
-- with such a library reports an unknown state.

-- ------------------------------------------------------------------------------------------------
-- Columns

ALTER TABLE pgjobq.jobs
    ADD COLUMN tags              text[],
    ADD COLUMN progress          jsonb,
    ADD COLUMN has_children      boolean NOT NULL DEFAULT false,
    ADD COLUMN pending_parents   integer,
    ADD COLUMN on_parent_failure text;

ALTER TABLE pgjobq.jobs DROP CONSTRAINT jobs_live_only;
ALTER TABLE pgjobq.jobs ADD CONSTRAINT jobs_live_only CHECK (state IN ('waiting', 'queued', 'running')) NOT VALID;
ALTER TABLE pgjobq.jobs VALIDATE CONSTRAINT jobs_live_only;
ALTER TABLE pgjobq.jobs
    ADD CONSTRAINT jobs_waiting_iff_pending CHECK ((state = 'waiting') = (coalesce(pending_parents, 0) > 0)),
    ADD CONSTRAINT jobs_on_parent_failure CHECK (on_parent_failure IN ('cancel', 'run', 'batch')),
    ADD CONSTRAINT jobs_tags_count CHECK (cardinality(tags) BETWEEN 1 AND 20);

-- Finished jobs keep their tags, their last progress and (which version 3 forgot) their concurrency
-- key, so that a job retried from history comes back with it.
ALTER TABLE pgjobq.history
    ADD COLUMN tags            text[],
    ADD COLUMN progress        jsonb,
    ADD COLUMN concurrency_key text;

-- `pgjobq list --tag T`: untagged jobs are not in these indexes and cost nothing.
CREATE INDEX jobs_tags_idx ON pgjobq.jobs USING gin (tags) WHERE tags IS NOT NULL;
CREATE INDEX history_tags_idx ON pgjobq.history USING gin (tags) WHERE tags IS NOT NULL;
-- Waiting jobs, for retention (a parent stays while a child waits on it) and the dashboard.
CREATE INDEX jobs_waiting_idx ON pgjobq.jobs (id) WHERE state = 'waiting';

CREATE TABLE pgjobq.deps (
    parent     bigint      NOT NULL,
    child      bigint      NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT deps_pkey PRIMARY KEY (parent, child),
    CONSTRAINT deps_no_loop CHECK (parent <> child)
);
CREATE INDEX deps_child_idx ON pgjobq.deps (child);
CREATE INDEX deps_created_idx ON pgjobq.deps (created_at);

CREATE OR REPLACE VIEW pgjobq.all_jobs AS
    SELECT id, queue::text AS queue, kind::text AS kind, payload::jsonb AS payload, priority, state, attempt,
           max_attempts, run_at, created_at, started_at, finished_at, lease_until, lease_token,
           worker_id::text AS worker_id, result, last_error, unique_key::text AS unique_key, cancel_requested,
           concurrency_key::text AS concurrency_key, tags, progress
      FROM pgjobq.jobs
    UNION ALL
    SELECT id, queue, kind, payload, priority, state, attempt, max_attempts, run_at, created_at, started_at,
           finished_at, lease_until, lease_token, worker_id, result, last_error, unique_key, cancel_requested,
           concurrency_key, tags, progress
      FROM pgjobq.history;

-- ------------------------------------------------------------------------------------------------
-- Signatures that change (IF EXISTS: on a new database the functions are created after the numbered
-- migrations).  The roles' grants on the new functions come back when `pgjobq migrate` applies
-- sql/roles.sql again after the function files (src/migrate.c).

-- enqueue takes parents, tags and what a parent's failure does.
DROP FUNCTION IF EXISTS pgjobq.enqueue(text, text, jsonb, smallint, timestamptz, interval, integer, text, text);
-- claim_batch returns the results of a job's parents too: a new return type.
DROP FUNCTION IF EXISTS pgjobq.claim_batch(text, integer, interval, text, smallint, timestamptz, bigint);
