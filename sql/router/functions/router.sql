-- pgjobq router functions: PL/Proxy's cluster over the map, and the enqueues and reads a router runs on
-- the shards (docs/shards.md).  Applied by `pgjobq migrate --router`, after sql/functions/cluster.sql
-- (route_hash, route_partition, route_job, cluster_map, cluster_set), as a shard's function files are.
--
-- The PL/Proxy functions are not SECURITY DEFINER: PL/Proxy connects to a shard as the role that calls
-- it (it adds user=CURRENT_USER to a conninfo without a user), so that each shard grants what the caller
-- may do there, as if it had connected itself (the role and its password, in ~/.pgpass of the router's
-- server, or a certificate, on every shard).  Each call runs on its shard in a transaction of its own
-- (PL/Proxy's autocommit): a router's enqueue is not part of its caller's transaction.

-- PL/Proxy's cluster 'pgjobq' is the map of this database.  get_cluster_version is called at every
-- call of a PL/Proxy function (one indexed read): when the epoch grows, PL/Proxy reads the partitions
-- again, the conninfo of each partition's owner, in order (P of them; equal conninfos share a
-- connection).
CREATE OR REPLACE FUNCTION plproxy.get_cluster_version(cluster_name text) RETURNS integer
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_epoch integer;
BEGIN
    IF cluster_name IS DISTINCT FROM 'pgjobq' THEN
        RAISE EXCEPTION 'pgjobq router: no cluster "%" (its PL/Proxy cluster is "pgjobq")', cluster_name
            USING ERRCODE = 'undefined_object';
    END IF;
    SELECT c.epoch INTO v_epoch FROM pgjobq.cluster c;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgjobq router: this database has no cluster map: install one with pgjobq.cluster_set(map, NULL)'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    RETURN v_epoch;
END
$$;

CREATE OR REPLACE FUNCTION plproxy.get_cluster_partitions(cluster_name text) RETURNS SETOF text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM plproxy.get_cluster_version(cluster_name);
    RETURN QUERY SELECT s.conninfo FROM pgjobq.cluster_owners o JOIN pgjobq.cluster_shards s ON s.name = o.shard
                  ORDER BY o.partition;
END
$$;

-- No setting of PL/Proxy's is changed (its defaults: connections kept while they work); a conninfo
-- carries libpq's own (connect_timeout, keepalives).
CREATE OR REPLACE FUNCTION plproxy.get_cluster_config(IN cluster_name text, OUT key text, OUT val text)
RETURNS SETOF record
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM plproxy.get_cluster_version(cluster_name);
    RETURN;
END
$$;

-- enqueue(...): a shard's pgjobq.enqueue, the same arguments and result, run on the shard that owns the
-- job's partition (route_partition).  A job with parents (after) must be on its parents' shard.  When
-- the router's map is older than the shards' (a partition moved), the shard refuses with PJQ01 and
-- nothing is written: install the new map here too (cluster_set) and call again.
CREATE OR REPLACE FUNCTION pgjobq.enqueue(
    queue        text        DEFAULT 'default',
    kind         text        DEFAULT 'default',
    payload      jsonb       DEFAULT '{}',
    priority     smallint    DEFAULT 0,
    run_at       timestamptz DEFAULT NULL,
    delay        interval    DEFAULT NULL,
    max_attempts integer     DEFAULT 25,
    unique_key   text        DEFAULT NULL,
    concurrency_key text     DEFAULT NULL,
    after        bigint[]    DEFAULT NULL,
    tags         text[]      DEFAULT NULL,
    on_parent_failure text   DEFAULT NULL,
    route_key    text        DEFAULT NULL,
    on_conflict  text        DEFAULT NULL,
    unique_for   interval    DEFAULT NULL,
    OUT id bigint,
    OUT duplicate boolean)
LANGUAGE plproxy
AS $$
    CLUSTER 'pgjobq';
    RUN ON pgjobq.route_partition(queue, route_key);
$$;

-- enqueue_split(ords, ...): enqueue_many's arrays split by partition (PL/Proxy's SPLIT: route_partition
-- of each element), each shard's part one call of its enqueue_many, which answers with its ords; ords
-- (the caller's positions, split with the rest) turns them back into the caller's.
CREATE OR REPLACE FUNCTION pgjobq.enqueue_split(
    ords integer[], queues text[], kinds text[], payloads jsonb[], priorities smallint[], run_ats timestamptz[],
    delays interval[], max_attempts integer[], unique_keys text[], concurrency_keys text[], notify boolean,
    route_keys text[])
RETURNS TABLE (ord integer, id bigint, duplicate boolean)
LANGUAGE plproxy
AS $$
    CLUSTER 'pgjobq';
    SPLIT ords, queues, kinds, payloads, priorities, run_ats, delays, max_attempts, unique_keys, concurrency_keys,
          route_keys;
    RUN ON pgjobq.route_partition(queues, route_keys);
    SELECT (ords)[e.ord] AS ord, e.id, e.duplicate
      FROM pgjobq.enqueue_many(queues, kinds, payloads, priorities, run_ats, delays, max_attempts, unique_keys,
                               concurrency_keys, notify, route_keys) AS e;
$$;

-- enqueue_many(...): a shard's pgjobq.enqueue_many, the same arguments and result (one row per job, in
-- the caller's order), its jobs split over their shards.  Each shard's part is written at once, in a
-- transaction of its own, and the parts in parallel: when a shard refuses its part (an error of its
-- enqueue_many, PJQ01 from a stale map, a shard that is down), nothing of that part is written, but the
-- other shards' parts may have been, and the call fails without saying which (as every PL/Proxy call
-- across partitions; docs/shards.md).  Route a batch that must be all or none to one shard: one queue
-- (pinned), or one routing key.
CREATE OR REPLACE FUNCTION pgjobq.enqueue_many(
    queues       text[],
    kinds        text[],
    payloads     jsonb[],
    priorities   smallint[]    DEFAULT NULL,
    run_ats      timestamptz[] DEFAULT NULL,
    delays       interval[]    DEFAULT NULL,
    max_attempts integer[]     DEFAULT NULL,
    unique_keys  text[]        DEFAULT NULL,
    concurrency_keys text[]    DEFAULT NULL,
    notify       boolean       DEFAULT true,
    route_keys   text[]        DEFAULT NULL)
RETURNS TABLE (ord integer, id bigint, duplicate boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer := greatest(cardinality(queues), cardinality(kinds), cardinality(payloads), cardinality(priorities),
                          cardinality(run_ats), cardinality(delays), cardinality(max_attempts),
                          cardinality(unique_keys), cardinality(concurrency_keys), cardinality(route_keys));
BEGIN
    IF n IS NULL OR n = 0 THEN
        RETURN;
    END IF;
    IF (queues IS NOT NULL AND cardinality(queues) <> n)
       OR (kinds IS NOT NULL AND cardinality(kinds) <> n)
       OR (payloads IS NOT NULL AND cardinality(payloads) <> n)
       OR (priorities IS NOT NULL AND cardinality(priorities) <> n)
       OR (run_ats IS NOT NULL AND cardinality(run_ats) <> n)
       OR (delays IS NOT NULL AND cardinality(delays) <> n)
       OR (max_attempts IS NOT NULL AND cardinality(max_attempts) <> n)
       OR (unique_keys IS NOT NULL AND cardinality(unique_keys) <> n)
       OR (concurrency_keys IS NOT NULL AND cardinality(concurrency_keys) <> n)
       OR (route_keys IS NOT NULL AND cardinality(route_keys) <> n) THEN
        RAISE EXCEPTION 'pgjobq.enqueue_many: the arrays must all have % elements', n
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- (SPLIT needs every array: a NULL one becomes n NULLs, which a shard reads the same way.)
    RETURN QUERY
    SELECT s.ord, s.id, s.duplicate
      FROM pgjobq.enqueue_split(ARRAY(SELECT generate_series(1, n)),
                                coalesce(queues, array_fill(NULL::text, ARRAY[n])),
                                coalesce(kinds, array_fill(NULL::text, ARRAY[n])),
                                coalesce(payloads, array_fill(NULL::jsonb, ARRAY[n])),
                                coalesce(priorities, array_fill(NULL::smallint, ARRAY[n])),
                                coalesce(run_ats, array_fill(NULL::timestamptz, ARRAY[n])),
                                coalesce(delays, array_fill(NULL::interval, ARRAY[n])),
                                coalesce(max_attempts, array_fill(NULL::integer, ARRAY[n])),
                                coalesce(unique_keys, array_fill(NULL::text, ARRAY[n])),
                                coalesce(concurrency_keys, array_fill(NULL::text, ARRAY[n])),
                                enqueue_many.notify,
                                coalesce(route_keys, array_fill(NULL::text, ARRAY[n]))) AS s
     ORDER BY s.ord;
END
$$;

-- shard_send_event(name, key, payload): a shard's send_event on every shard (RUN ON ALL), how many
-- jobs each resumed.
CREATE OR REPLACE FUNCTION pgjobq.shard_send_event(name text, key text, payload jsonb) RETURNS SETOF integer
LANGUAGE plproxy
AS $$
    CLUSTER 'pgjobq';
    RUN ON ALL;
    SELECT e.resumed FROM pgjobq.send_event(name, key, payload) AS e;
$$;

-- send_event(name, key, payload): a shard's, the same arguments, on every shard (a job waiting for the
-- event may be on any; docs/durable.md, "Events"), the jobs resumed summed; id is NULL (an event per
-- shard).  Each shard takes it in a transaction of its own: a shard that fails fails the call, and the
-- others may have taken it (sending it again changes nothing for the jobs that got it).
CREATE OR REPLACE FUNCTION pgjobq.send_event(name text, key text DEFAULT '', payload jsonb DEFAULT NULL)
RETURNS TABLE (id bigint, resumed integer)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT NULL::bigint, coalesce(sum(n), 0)::integer FROM pgjobq.shard_send_event(name, key, payload) AS n
$$;

-- shard_stats(): each shard's pgjobq.stats(), with the shard's name (its self), from every shard at
-- once (RUN ON ALL: once per shard, however many partitions it owns).
CREATE OR REPLACE FUNCTION pgjobq.shard_stats() RETURNS TABLE (shard text, queue text, state text, jobs bigint)
LANGUAGE plproxy
AS $$
    CLUSTER 'pgjobq';
    RUN ON ALL;
    SELECT (SELECT pgjobq.cluster_map() ->> 'self') AS shard, s.queue, s.state, s.jobs FROM pgjobq.stats() AS s;
$$;

-- stats(): what a shard's pgjobq.stats() says (`pgjobq stats`: jobs per queue and state), summed over the
-- shards.
CREATE OR REPLACE FUNCTION pgjobq.stats() RETURNS TABLE (queue text, state text, jobs bigint)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.queue, s.state, sum(s.jobs)::bigint FROM pgjobq.shard_stats() AS s GROUP BY 1, 2 ORDER BY 1, 2
$$;

-- job_partitions(id): the partitions to ask for job id: the lowest partition of the shard that handed
-- it out (route_job), or, for an id from before the cluster (route_job is NULL), the lowest partition
-- of each shard.  For PL/Proxy's RUN ON.
CREATE OR REPLACE FUNCTION pgjobq.job_partitions(id bigint) RETURNS SETOF integer
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT min(o.partition) FROM pgjobq.cluster_owners o
     WHERE o.shard = coalesce(pgjobq.route_job(job_partitions.id), o.shard)
     GROUP BY o.shard
$$;

-- monitor_job(job_id): a shard's pgjobq.monitor_job (`pgjobq show`, the dashboard's page of a job), run
-- on the shard whose number the id ends in (job_partitions).
CREATE OR REPLACE FUNCTION pgjobq.monitor_job(job_id bigint)
RETURNS TABLE (id bigint, queue text, kind text, state text, priority smallint, attempt integer,
               max_attempts integer, run_at timestamptz, created_at timestamptz, started_at timestamptz,
               finished_at timestamptz, lease_until timestamptz, worker_id text, unique_key text,
               cancel_requested boolean, payload jsonb, result jsonb, last_error text, tags text[], progress jsonb)
LANGUAGE plproxy
AS $$
    CLUSTER 'pgjobq';
    RUN ON pgjobq.job_partitions(job_id);
$$;

-- shard_cancel(id), shard_retry(id): a shard's pgjobq.cancel and pgjobq.retry, run where job id can be
-- (job_partitions: its shard, or every shard for an id from before the cluster), one answer each.
CREATE OR REPLACE FUNCTION pgjobq.shard_cancel(id bigint) RETURNS SETOF text
LANGUAGE plproxy
AS $$
    CLUSTER 'pgjobq';
    RUN ON pgjobq.job_partitions(id);
    SELECT pgjobq.cancel(id);
$$;

CREATE OR REPLACE FUNCTION pgjobq.shard_retry(id bigint) RETURNS SETOF text
LANGUAGE plproxy
AS $$
    CLUSTER 'pgjobq';
    RUN ON pgjobq.job_partitions(id);
    SELECT pgjobq.retry(id);
$$;

-- cancel(id), retry(id): a shard's, the same argument and answer, on the shard holding the job: what
-- the shard that has it answers ('not_found' when none has it).
CREATE OR REPLACE FUNCTION pgjobq.cancel(id bigint) RETURNS text
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce((SELECT s FROM pgjobq.shard_cancel(cancel.id) AS s WHERE s <> 'not_found' LIMIT 1), 'not_found')
$$;

CREATE OR REPLACE FUNCTION pgjobq.retry(id bigint) RETURNS text
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce((SELECT s FROM pgjobq.shard_retry(retry.id) AS s WHERE s <> 'not_found' LIMIT 1), 'not_found')
$$;

-- shard_cancel_where(...), shard_retry_where(...): a shard's cancel_where and retry_where on every shard
-- (RUN ON ALL), one row each.
CREATE OR REPLACE FUNCTION pgjobq.shard_cancel_where(queue text, state text, kind text, since interval,
                                                     dry_run boolean)
RETURNS SETOF bigint
LANGUAGE plproxy
AS $$
    CLUSTER 'pgjobq';
    RUN ON ALL;
    SELECT pgjobq.cancel_where(queue, state, kind, since, dry_run);
$$;

CREATE OR REPLACE FUNCTION pgjobq.shard_retry_where(queue text, state text, kind text, since interval,
                                                    dry_run boolean, redrive boolean)
RETURNS TABLE (retried bigint, skipped bigint)
LANGUAGE plproxy
AS $$
    CLUSTER 'pgjobq';
    RUN ON ALL;
    SELECT r.retried, r.skipped FROM pgjobq.retry_where(queue, state, kind, since, dry_run, redrive) AS r;
$$;

-- cancel_where(...), retry_where(...): a shard's, the same arguments and answer, summed over the shards
-- (a spread queue's jobs are on each; a pinned queue's on one, the others answer 0).  Each shard acts
-- in a transaction of its own: a shard that fails fails the call, and the others may have acted.
CREATE OR REPLACE FUNCTION pgjobq.cancel_where(queue text, state text, kind text DEFAULT NULL,
                                               since interval DEFAULT NULL, dry_run boolean DEFAULT false)
RETURNS bigint
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(sum(n), 0)::bigint FROM pgjobq.shard_cancel_where(queue, state, kind, since, dry_run) AS n
$$;

CREATE OR REPLACE FUNCTION pgjobq.retry_where(queue text, state text, kind text DEFAULT NULL,
                                              since interval DEFAULT NULL, dry_run boolean DEFAULT false,
                                              redrive boolean DEFAULT false)
RETURNS TABLE (retried bigint, skipped bigint)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(sum(r.retried), 0)::bigint, coalesce(sum(r.skipped), 0)::bigint
      FROM pgjobq.shard_retry_where(queue, state, kind, since, dry_run, coalesce(redrive, false)) AS r
$$;
