-- pgjobq schema, migration 15: the jobs that reach the history are counted as they get there.
-- needs: 11
--
-- pgjobq.tallies, which counted retries and lost leases where they happen, now also counts the jobs
-- each statement moves to the history, per queue and outcome ('completed', 'failed', 'cancelled'):
-- the functions that move them write one row per queue and outcome (sql/functions).  The dashboard's
-- "completed and failed in the last hour" and its jobs finished per minute (monitor_overview,
-- monitor_finished_per_minute) read those rows instead of every row of the last hour's history: at
-- 15,000 jobs/s that was 4 s and more a call, every 10 s while the dashboard is open.  Jobs finished
-- before this migration are not counted: those counts start from the upgrade.
ALTER TABLE pgjobq.tallies DROP CONSTRAINT tallies_what_check;
ALTER TABLE pgjobq.tallies ADD CONSTRAINT tallies_what_check
    CHECK (what IN ('retried', 'lost', 'completed', 'failed', 'cancelled'));
