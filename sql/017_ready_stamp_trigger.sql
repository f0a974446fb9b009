-- pgjobq schema migration: the trigger jobs_ready_stamp, and its function, are the schema's, made here
-- once.
-- needs: 11
--
-- Until this migration the function file claim.sql made the trigger (a DO block that created it
-- when missing) every time the function files were applied.  A trigger is part of its table, like
-- the table's indexes and constraints: it is made once, here, with the function it runs, which must
-- exist first (the function files are applied after the migrations).  So pgjobq.jobs_ready_stamp()
-- lives here, not in sql/functions: a later change of it is a migration of its own (CREATE OR
-- REPLACE FUNCTION).  On a database that has the trigger already (every version from 10 on), it is
-- made again, the same.  (The file's name says nothing else about its place: numbered after others
-- that land first, it is renamed.)

-- jobs_ready_stamp(): a job that goes back to queued (a retry, a job handed back, a rescued lease, a
-- waiting job whose parents are done, an UPDATE by hand) becomes claimable now: its ready_at is the
-- clock, read after its transaction has an id (see the top of sql/functions/claim.sql), so that no
-- cursor is past it.  Run by the trigger jobs_ready_stamp, before an UPDATE that makes a row queued
-- and only then: its WHEN clause is all a claim's or a heartbeat's update pays.
CREATE OR REPLACE FUNCTION pgjobq.jobs_ready_stamp() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_current_xact_id();
    NEW.ready_at := clock_timestamp();
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS jobs_ready_stamp ON pgjobq.jobs;
CREATE TRIGGER jobs_ready_stamp BEFORE UPDATE OF state ON pgjobq.jobs FOR EACH ROW
    WHEN (NEW.state = 'queued' AND OLD.state IS DISTINCT FROM 'queued')
    EXECUTE FUNCTION pgjobq.jobs_ready_stamp();
