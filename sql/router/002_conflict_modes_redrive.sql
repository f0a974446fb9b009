-- pgjobq router schema version 2: the router's enqueue takes a unique key's conflict mode and window
-- (on_conflict, unique_for: docs/queues.md, "Debounce and throttle") and its retry_where the redrive of
-- dead letters (docs/queues.md, "Dead letters"), as a shard's do since its schema 26.  Their old forms
-- are dropped here (a new form beside an old one, both with defaults, would make calls ambiguous); the
-- new ones are in sql/router/functions/router.sql, applied after the migrations.
DROP FUNCTION IF EXISTS pgjobq.enqueue(text, text, jsonb, smallint, timestamptz, interval, integer, text, text,
                                       bigint[], text[], text, text);
DROP FUNCTION IF EXISTS pgjobq.retry_where(text, text, text, interval, boolean);
DROP FUNCTION IF EXISTS pgjobq.shard_retry_where(text, text, text, interval, boolean);
