-- pgjobq schema, migration 16: what a role can see and hold.
-- needs: 11
--
--   health()            gains holder_role, and shows the holder's query only to a caller that
--                       pg_stat_activity would show it to (sql/functions/monitor.sql): it runs with
--                       the caller's rights, and health_facts(), as the schema's owner, gives the rest.
--                       It returns one more column: dropped here and created again by the files.
--
-- Libraries of version 11 keep working: they select health()'s columns by name.

DROP FUNCTION IF EXISTS pgjobq.health();
