-- pgjobq schema, migration 12: autovacuum of the live table paused while it can remove nothing.
-- needs: 11
--
-- While a snapshot is held open (a pg_dump, a long report, a session idle in a transaction, a
-- standby with hot_standby_feedback), vacuum can remove no row that died after it was taken.  The
-- dead rows of finished jobs still count towards autovacuum's threshold, so autovacuum started on
-- pgjobq.jobs every minute and read the whole table, removing nothing: with a snapshot held for ten
-- minutes at 15,000 jobs/s, a 3.4 GB pass each minute on one of two cores, and a claim that took
-- 1.89x its first minute's time (bench/README.md, "Steady state").
--
--   pgjobq.vacuum_watch  one row: the oldest transaction id that holds the horizon back (as the last
--                        call of pgjobq.autovacuum_adapt() saw it), how many vacuums of pgjobq.jobs
--                        had ended when it was first seen and whether one was running then, and
--                        when autovacuum_adapt() paused autovacuum's vacuums of pgjobq.jobs (NULL:
--                        it did not).
--   health()             gains autovacuum_paused_since (it returns one more column: dropped here and
--                        created again by sql/functions/monitor.sql).
--
-- autovacuum_adapt() (sql/functions/maintenance.sql), called each minute by the worker that
-- maintains, raises the vacuum thresholds of pgjobq.jobs out of reach once a vacuum has run entirely
-- while the same holder was the oldest (another pass could remove nothing more), and resets them as
-- soon as the oldest holder is another or none.  Autovacuum's ANALYZE goes on.  Anti-wraparound
-- vacuums run whatever the setting.
--
-- With this version, outside this file: what the dashboard, /metrics, the demo and the benchmarks
-- read comes from the pgjobq.monitor_* functions (sql/functions/monitor.sql), granted to
-- pgjobq_monitor and pgjobq_admin, so that the command knows no table; the benchmarks start from
-- pgjobq.reset_queue() and pgjobq.load_history() (sql/functions/admin.sql, pgjobq_admin only).
--
-- Libraries of version 11 keep working: nothing they call changed, and they select health()'s
-- columns by name.  They do not pause autovacuum.

DROP FUNCTION IF EXISTS pgjobq.health();

CREATE TABLE pgjobq.vacuum_watch (
    one            boolean NOT NULL DEFAULT true,
    horizon        text,
    vacuums_then   bigint,
    vacuum_running boolean,
    paused_since   timestamptz,
    CONSTRAINT vacuum_watch_pkey PRIMARY KEY (one),
    CONSTRAINT vacuum_watch_one_row CHECK (one)
);
INSERT INTO pgjobq.vacuum_watch DEFAULT VALUES;
