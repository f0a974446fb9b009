-- pgjobq schema, migration 7: lease tokens that a failover cannot hand out twice, and an unthrottled
-- autovacuum of the queue table.
-- needs: 6
--
-- A lease token was the job's previous token plus one.  After a failover to an asynchronous standby
-- the new primary has lost the last transactions of the old one, so the same (job, token) pair could
-- be given out again, and a job id that a lost enqueue had used could name another job with the same
-- small token.  From this version on the claim also makes the token at least the claim's time on the
-- database clock in microseconds (claim_batch in sql/functions/claim.sql says why that suffices).
--
-- schema_version.needs: the oldest library schema version that can use the database once this
-- migration is applied (a library reads it to accept a newer, compatible schema during a rolling
-- deploy).  This migration changes no signature, so libraries of version 6 work with it.

ALTER TABLE pgjobq.schema_version ADD COLUMN needs integer;

-- The queue table's vacuum is never throttled: under churn a throttled vacuum (1 ms of sleep per 200
-- cost units) scanned about 20 MB/s while 40 workers made the table grow faster than that, and the
-- claim slowed as dead tuples piled up (`make soak`, bench/README.md).
ALTER TABLE pgjobq.jobs SET (autovacuum_vacuum_cost_delay = 0);
