-- pgjobq schema migration 33: a claim that writes no index entry (docs/design.md, "The claim writes in
-- place").
-- needs: 31
--
-- A claim changes state, attempt, lease_token, lease_until, started_at and worker_id.  PostgreSQL
-- writes the new version of a row on the same page, with no new index entry (a HOT update), only when
-- no column it changes is a key, an expression or a predicate column of any index of the table.  Until
-- now every claim (and every heartbeat) wrote a new entry into the primary key and into jobs_lease_idx,
-- and its new version often went to another page: state was in the predicate of every partial index,
-- lease_until a key of jobs_lease_idx.  So:
--
--   jobs_ready_idx       queue IS NOT NULL, true of every row: it holds the running jobs too (and
--                        the waiting ones, which a claim steps over by their state, as it steps over
--                        the running ones).  A claim walks it from its cursor or the low-water mark,
--                        behind which the running jobs lie, so it does not read them.  The predicate
--                        keeps the index to the statements that name a queue: without one, a lookup
--                        by id alone could use it (id is its last column: a walk of the whole index
--                        per id), and a plan made while the table was nearly empty did (a rescue pass
--                        of 7 s, 40 workers at 10,000 jobs/s).
--   jobs_key_idx, jobs_sequence_idx
--                        concurrency_key IS NOT NULL (every row of pgjobq.jobs is waiting, queued or
--                        running: jobs_live_only).
--   jobs_unique_key_idx  unique_key IS NOT NULL: a waiting job has no unique key
--                        (enqueue_unique_key_why), so this holds the queued and running ones, as
--                        before.
--   jobs_waiting_idx     pending_parents IS NOT NULL, which jobs_waiting_iff_pending now makes the
--                        same as state = 'waiting' (a job whose parents are all done has NULL there).
--   jobs_expiry_idx      expires_at IS NOT NULL: the sweep checks the state of the rows it reads.
--   jobs_lease_idx       dropped.  The rescue finds expired leases in pgjobq.lease_alarms instead:
--                        one row per claim (queue, when to look: 5 seconds after the claim, or the
--                        lease's end if sooner; the ids and tokens of its jobs), inserted by the
--                        claim and never updated.  The rescue takes the rows that are due, rescues
--                        their jobs whose lease (the job's own lease_until, which heartbeats move)
--                        has ended, arms a new row for those still running under the same token
--                        (at their lease's end), and forgets the rest (completed, retried, claimed
--                        again: that claim armed its own row).  So a queue's alarms name its
--                        running jobs and its claims of the last few seconds: the concurrency
--                        limits and the monitor count the running jobs through them
--                        (pgjobq.running_jobs).  A lease moved earlier than its alarm (a
--                        heartbeat asking for a shorter one, an UPDATE by hand) gets an alarm of
--                        its own from the trigger jobs_lease_alarm.
--
-- And a fillfactor of 50, so that a claim's new version finds room on its page (at 90, a page had
-- room for about two: stop 51 measured 22% HOT at 90 and 92% at 50; bench/README.md, "What a claim
-- that writes no index entry would buy").  It applies to the pages written from now on.
--
-- Libraries of version 31 and 32 keep working: no function they call changes its signature.

UPDATE pgjobq.jobs SET pending_parents = NULL WHERE pending_parents <= 0;
ALTER TABLE pgjobq.jobs DROP CONSTRAINT jobs_waiting_iff_pending;
ALTER TABLE pgjobq.jobs ADD CONSTRAINT jobs_waiting_iff_pending
    CHECK ((state = 'waiting') = (pending_parents IS NOT NULL) AND (pending_parents IS NULL OR pending_parents > 0));

CREATE TABLE pgjobq.lease_alarms (
    queue   text          NOT NULL,
    until   timestamptz   NOT NULL,
    ids     bigint[]      NOT NULL,
    tokens  bigint[]      NOT NULL,
    CONSTRAINT lease_alarms_shape CHECK (cardinality(ids) = cardinality(tokens))
);
CREATE INDEX lease_alarms_queue_until_idx ON pgjobq.lease_alarms (queue, until);

-- The running jobs' alarms: one row per job, at its lease's end.
INSERT INTO pgjobq.lease_alarms (queue, until, ids, tokens)
SELECT j.queue, j.lease_until, ARRAY[j.id], ARRAY[j.lease_token] FROM pgjobq.jobs j WHERE j.state = 'running';

DROP INDEX pgjobq.jobs_lease_idx;
DROP INDEX pgjobq.jobs_ready_idx;
CREATE INDEX jobs_ready_idx ON pgjobq.jobs (queue, priority, (greatest(run_at, ready_at)), id)
    WHERE queue IS NOT NULL;
DROP INDEX pgjobq.jobs_key_idx;
CREATE INDEX jobs_key_idx ON pgjobq.jobs (queue, concurrency_key, priority, (greatest(run_at, ready_at)), id)
    WHERE concurrency_key IS NOT NULL;
DROP INDEX pgjobq.jobs_sequence_idx;
CREATE INDEX jobs_sequence_idx ON pgjobq.jobs (queue, concurrency_key, id) WHERE concurrency_key IS NOT NULL;
DROP INDEX pgjobq.jobs_unique_key_idx;
CREATE UNIQUE INDEX jobs_unique_key_idx ON pgjobq.jobs (queue, unique_key) WHERE unique_key IS NOT NULL;
DROP INDEX pgjobq.jobs_waiting_idx;
CREATE INDEX jobs_waiting_idx ON pgjobq.jobs (id) WHERE pending_parents IS NOT NULL;
DROP INDEX pgjobq.jobs_expiry_idx;
CREATE INDEX jobs_expiry_idx ON pgjobq.jobs (expires_at) WHERE expires_at IS NOT NULL;

-- jobs_lease_alarm(): a lease that an UPDATE moves earlier than it was (a heartbeat that asks for a
-- shorter lease, or an UPDATE by hand that ends it) gets an alarm at its new end, so that the rescue
-- does not wait for the claim's.  Run by the trigger jobs_lease_alarm, after an UPDATE of lease_until
-- that moves it earlier and only then: its WHEN clause is all a claim's (from NULL) or a heartbeat's
-- (later) update pays.  The schema's, like jobs_ready_stamp (017): a change of it is a migration.
CREATE OR REPLACE FUNCTION pgjobq.jobs_lease_alarm() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO pgjobq.lease_alarms (queue, until, ids, tokens)
    VALUES (NEW.queue, NEW.lease_until, ARRAY[NEW.id], ARRAY[NEW.lease_token]);
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_lease_alarm AFTER UPDATE OF lease_until ON pgjobq.jobs FOR EACH ROW
    WHEN (NEW.lease_until < OLD.lease_until)
    EXECUTE FUNCTION pgjobq.jobs_lease_alarm();

ALTER TABLE pgjobq.jobs SET (fillfactor = 50);
