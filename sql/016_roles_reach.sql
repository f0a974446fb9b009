-- pgjobq schema, migration 16: what a role can see and hold.
-- needs: 11
--
--   health()            gains holder_role, and shows the holder's query only to a caller that
--                       pg_stat_activity would show it to (sql/functions/monitor.sql): it runs with
--                       the caller's rights, and health_facts(), as the schema's owner, gives the rest.
--                       It returns one more column: dropped here and created again by the files.
--   queues.max_lease    the longest lease a claim may ask for, and a heartbeat renew, in the queue
--                       (NULL: max_lease_default(), a day).  A claim could hold a job for ever
--                       (claim('q', 1, '1000 years', ...)): now a longer lease is refused by the
--                       claim and cut by the heartbeat (claim.sql, transitions.sql).  queue_list()
--                       returns it (one more column: dropped here).  An operator ends a running
--                       job's lease with retry_running(id) (admin.sql).
--
-- Libraries of version 11 keep working: they select health()'s and queue_list()'s columns by name.
-- Their workers' claims are refused when they ask for a lease longer than a day (or than the
-- queue's max_lease once set).

DROP FUNCTION IF EXISTS pgjobq.health();

ALTER TABLE pgjobq.queues ADD COLUMN max_lease interval;
ALTER TABLE pgjobq.queues ADD CONSTRAINT queues_max_lease_range
    CHECK (max_lease BETWEEN interval '1 second' AND interval '365 days');
DROP FUNCTION IF EXISTS pgjobq.queue_list();
