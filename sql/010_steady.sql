-- pgjobq schema, migration 10: claims that do not step over dead rows, so that a queue holds its pace
-- while vacuum cannot run (another session holds a snapshot open: pg_dump, a long report, an idle
-- transaction, a standby with hot_standby_feedback).
-- needs: 9
--
-- Every claimed and finished job leaves dead row versions and index entries.  While a snapshot is
-- held open vacuum can remove none that died after it was taken, and a claim that starts at the head
-- of the queue steps over every entry claimed since: with a snapshot held for minutes the claim of
-- version 9 took 20 ms, then 167 ms, and the queue fell behind (bench/README.md, "steady state").
-- From this version a claim starts, per priority level, where the claimer knows nothing claimable can
-- be behind it (docs/design.md, "The claim's cursor"):
--
--   jobs.ready_at     when the row became claimable (enqueued, retried, released, its parents done),
--                     on the database clock, read after its transaction got its id.  The claim key is
--                     greatest(run_at, ready_at): rows that appear later (a transaction that commits
--                     late) have a key after the moment their transaction started writing, which is
--                     what lets a claimer's cursor pass everything older.  NULL in rows of earlier
--                     versions: their key is their run_at.
--   jobs_ready_idx    the claim index on that key, per queue and priority (it replaces
--                     jobs_claim_idx).
--   pgjobq.levels     the priorities each queue has had jobs at: a claim visits them in order and
--                     starts each one at its own place.  Written by enqueue; never deleted from.
--                     Each has a sequence, its frontier: the furthest cursor a claimer has reported,
--                     which every claimer may start from (a sequence, not a row: it is set at every
--                     claim, and a row updated that often would leave a dead version each time).
--   pgjobq.lows       per queue and priority, a key no claimable row is behind, moved on by the claims
--                     that start there (a claim without a cursor, and every worker's claim once a
--                     second).  Insert-only, read newest first, so its own dead rows are never read.
--   jobs_lease_idx    running jobs by queue and lease end (it replaces jobs_running_idx): the rescue
--                     looks only at the leases that ended since its previous run, and a concurrency
--                     limit counts only the leases that have not.
--
-- Libraries of version 9 keep working (their claim_batch, rescue_expired(integer) and next_due calls
-- reach the new definitions); their COPY enqueue does not record new priority levels, which the
-- claims then find within a second.

ALTER TABLE pgjobq.jobs ADD COLUMN ready_at timestamptz;
-- Set after the column exists, so that the rows already there keep NULL (no table rewrite).
ALTER TABLE pgjobq.jobs ALTER COLUMN ready_at SET DEFAULT clock_timestamp();
ALTER TABLE pgjobq.jobs ADD CONSTRAINT jobs_ready_at_finite CHECK (isfinite(ready_at));

CREATE INDEX jobs_ready_idx ON pgjobq.jobs (queue, priority, (greatest(run_at, ready_at)), id)
    WHERE state = 'queued';
DROP INDEX pgjobq.jobs_claim_idx;

DROP INDEX pgjobq.jobs_key_idx;
CREATE INDEX jobs_key_idx ON pgjobq.jobs (queue, concurrency_key, priority, (greatest(run_at, ready_at)), id)
    WHERE state = 'queued' AND concurrency_key IS NOT NULL;

CREATE INDEX jobs_lease_idx ON pgjobq.jobs (queue, lease_until) WHERE state = 'running';
DROP INDEX pgjobq.jobs_running_idx;

CREATE TABLE pgjobq.levels (
    queue    text     NOT NULL,
    priority smallint NOT NULL,
    n        integer  GENERATED ALWAYS AS IDENTITY,
    frontier regclass,
    CONSTRAINT levels_pkey PRIMARY KEY (queue, priority),
    CONSTRAINT levels_priority_range CHECK (priority BETWEEN -100 AND 100)
);
INSERT INTO pgjobq.levels (queue, priority)
SELECT DISTINCT j.queue, j.priority FROM pgjobq.jobs j;
DO $$
DECLARE
    v_n integer;
BEGIN
    FOR v_n IN SELECT l.n FROM pgjobq.levels l LOOP
        EXECUTE format('CREATE SEQUENCE pgjobq.%I', 'frontier_' || v_n);
        UPDATE pgjobq.levels l SET frontier = format('pgjobq.%I', 'frontier_' || v_n)::regclass WHERE l.n = v_n;
    END LOOP;
END
$$;

CREATE TABLE pgjobq.lows (
    queue    text        NOT NULL,
    priority smallint    NOT NULL,
    key      timestamptz NOT NULL,
    id       bigint      NOT NULL,
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX lows_latest_idx ON pgjobq.lows (queue, priority, at);

-- rescue_expired gained an argument (since); the old signature would make calls ambiguous.
DROP FUNCTION IF EXISTS pgjobq.rescue_expired(integer);
