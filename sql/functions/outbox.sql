-- outbox.sql: the outbox (docs/shards.md, "The outbox"): a job enqueued, in the producer's own
-- transaction, into the database that holds the producer's data, and moved by a forwarder to the
-- shard that owns it, exactly once.  The schema is made by sql/022_outbox.sql.
--
-- The forwarder (pgjobq work's, src/outbox.c) claims the jobs of the queue outbox_queue() at the
-- source like any other, calls enqueue_forwarded(source label, outbox job's id, spec) on the job's
-- shard, and then completes the outbox job with the fenced completion: a forwarder that dies between
-- the two forwards it again after its lease ends, and enqueue_forwarded returns the job it made the
-- first time.

-- outbox_queue(): the queue of the outbox jobs.  It never leaves its database: a shard's guard lets
-- it be written whatever partition the map gives its name (cluster.sql, cluster_guard).
CREATE OR REPLACE FUNCTION pgjobq.outbox_queue() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 'pgjobq.outbox'::text $$;

-- outbox_self(): this database's label as a source (022_outbox.sql says what a copy must do).
CREATE OR REPLACE FUNCTION pgjobq.outbox_self() RETURNS uuid
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT s.label FROM pgjobq.outbox_self s $$;

-- forward(...): enqueues, in the caller's transaction, a job to be moved to its shard: the same
-- arguments as enqueue (but after and tags: a job's parents must be on its shard, and a workflow is
-- enqueued where it runs).  The job is checked by the same judges as an enqueue now, so that a job the
-- shard would refuse is refused to its producer, not to the forwarder.  A delay counts from now, not
-- from when the job is forwarded (it becomes run_at).  Returns the id of the outbox job; the id of
-- the job it becomes on its shard is the outbox job's result once forwarded: {"shard": .., "id": ..}.
CREATE OR REPLACE FUNCTION pgjobq.forward(
    queue        text        DEFAULT 'default',
    kind         text        DEFAULT 'default',
    payload      jsonb       DEFAULT '{}',
    priority     smallint    DEFAULT 0,
    run_at       timestamptz DEFAULT NULL,
    delay        interval    DEFAULT NULL,
    max_attempts integer     DEFAULT 25,
    unique_key   text        DEFAULT NULL,
    concurrency_key text     DEFAULT NULL,
    route_key    text        DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    IF forward.queue = pgjobq.outbox_queue() THEN
        RAISE EXCEPTION 'pgjobq.forward: the queue "%" is the outbox''s own', forward.queue
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The judges of enqueue (enqueue.sql), on the job as its shard will be asked to write it.
    PERFORM pgjobq.enqueue_when_check(ARRAY[forward.run_at], ARRAY[forward.delay]);
    PERFORM pgjobq.enqueue_explain(ARRAY[coalesce(forward.queue, 'default')], ARRAY[coalesce(forward.kind, 'default')],
                                   ARRAY[coalesce(forward.payload, '{}')], ARRAY[coalesce(forward.priority, 0)::smallint],
                                   ARRAY[coalesce(forward.max_attempts, 25)], ARRAY[forward.unique_key],
                                   ARRAY[forward.concurrency_key], ARRAY[forward.route_key]);
    SELECT e.id INTO v_id
      FROM pgjobq.enqueue(pgjobq.outbox_queue(), 'pgjobq.forward',
               jsonb_strip_nulls(jsonb_build_object(
                   'source', pgjobq.outbox_self(), 'queue', coalesce(forward.queue, 'default'),
                   'kind', coalesce(forward.kind, 'default'), 'payload', coalesce(forward.payload, '{}'),
                   'priority', coalesce(forward.priority, 0),
                   'run_at', coalesce(forward.run_at, now() + forward.delay),
                   'max_attempts', coalesce(forward.max_attempts, 25), 'unique_key', forward.unique_key,
                   'concurrency_key', forward.concurrency_key, 'route_key', forward.route_key)),
               0::smallint) AS e;
    RETURN v_id;
END
$$;

-- enqueue_forwarded(source, source_id, spec): on the job's shard, the forwarder's write: the job of
-- spec (an outbox job's payload: queue, kind, payload, priority, run_at, max_attempts, unique_key,
-- concurrency_key, route_key) enqueued once for (source, source_id), whatever the number of calls.
-- duplicate is true when the job was made by an earlier call (a forwarder that died after it) or
-- when its unique key found a job already queued (enqueue's duplicate; id is that job's).  Two calls
-- at once for one (source, source_id): the second waits for the first's transaction and returns its
-- job.  The shard's guard refuses a job this shard does not own (PJQ01): the forwarder routes again.
CREATE OR REPLACE FUNCTION pgjobq.enqueue_forwarded(source uuid, source_id bigint, spec jsonb,
                                                    OUT id bigint, OUT duplicate boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF source IS NULL OR source_id IS NULL OR jsonb_typeof(spec) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'pgjobq.enqueue_forwarded: a source, its id and a job (a JSON object) are needed'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO pgjobq.forwarded AS f (source, source_id) VALUES ($1, $2) ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        SELECT f.id INTO enqueue_forwarded.id FROM pgjobq.forwarded f WHERE f.source = $1 AND f.source_id = $2;
        duplicate := true;
        RETURN;
    END IF;
    SELECT e.id, e.duplicate INTO enqueue_forwarded.id, duplicate
      FROM pgjobq.enqueue(queue => coalesce(spec->>'queue', 'default'), kind => coalesce(spec->>'kind', 'default'),
                          payload => coalesce(spec->'payload', '{}'),
                          priority => coalesce((spec->>'priority')::smallint, 0::smallint),
                          run_at => (spec->>'run_at')::timestamptz,
                          max_attempts => coalesce((spec->>'max_attempts')::integer, 25),
                          unique_key => spec->>'unique_key', concurrency_key => spec->>'concurrency_key',
                          route_key => spec->>'route_key') AS e;
    UPDATE pgjobq.forwarded f SET id = enqueue_forwarded.id WHERE f.source = $1 AND f.source_id = $2;
END
$$;

-- forwarded_prune(age): forgets the jobs forwarded more than age ago (prune calls it with 30 days):
-- an outbox job is retried for far less than that.
CREATE OR REPLACE FUNCTION pgjobq.forwarded_prune(age interval DEFAULT interval '30 days', max_rows integer DEFAULT 10000)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer;
BEGIN
    DELETE FROM pgjobq.forwarded f
     WHERE (f.source, f.source_id) IN (SELECT o.source, o.source_id FROM pgjobq.forwarded o
                                        WHERE o.at < now() - forwarded_prune.age
                                        ORDER BY o.at LIMIT forwarded_prune.max_rows);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
