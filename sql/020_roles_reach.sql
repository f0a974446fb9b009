-- pgjobq schema, migration 20: what a role can see and hold.
-- needs: 15
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
--   pgjobq.levels       a queue's levels were never removed, and levels_add, granted to the producer,
--                       took any text: 10 calls of 1,000 names made 10,005 sequences.  Now its queue
--                       is a queue name (pgjobq.identifier; rows of other names are retired here: no
--                       job can be of them), levels_add records only levels with queued jobs, at most
--                       levels_max() levels are recorded, and the levels of a queue without jobs for
--                       an hour are reclaimed (levels_reclaim, from prune; maintenance.sql).
--     .idle_since       since when the reclaim has seen the level's queue without jobs.
--   pgjobq.levels_gone  the frontiers of retired levels, kept until no claim can read them, then
--                       dropped (safe_after: the reclaim explains).
--
-- Libraries of version 15 on keep working: they select health()'s and queue_list()'s columns by name.
-- Their workers' claims are refused when they ask for a lease longer than a day (or than the
-- queue's max_lease once set).

DROP FUNCTION IF EXISTS pgjobq.health();

CREATE TABLE pgjobq.levels_gone (
    frontier   text NOT NULL,
    safe_after xid8,
    CONSTRAINT levels_gone_pkey PRIMARY KEY (frontier)
);
ALTER TABLE pgjobq.levels ADD COLUMN idle_since timestamptz;
WITH gone AS (
    DELETE FROM pgjobq.levels l
     WHERE NOT (length(l.queue) BETWEEN 1 AND 64 AND l.queue ~ '^[A-Za-z][A-Za-z0-9_.:-]*$')
    RETURNING l.queue, l.priority, l.frontier),
marks AS (
    DELETE FROM pgjobq.lows x USING gone WHERE x.queue = gone.queue AND x.priority = gone.priority)
INSERT INTO pgjobq.levels_gone (frontier)
SELECT c.relname::text FROM gone JOIN pg_catalog.pg_class c ON c.oid = gone.frontier;
ALTER TABLE pgjobq.levels ALTER COLUMN queue TYPE pgjobq.identifier;

ALTER TABLE pgjobq.queues ADD COLUMN max_lease interval;
ALTER TABLE pgjobq.queues ADD CONSTRAINT queues_max_lease_range
    CHECK (max_lease BETWEEN interval '1 second' AND interval '365 days');
DROP FUNCTION IF EXISTS pgjobq.queue_list();
