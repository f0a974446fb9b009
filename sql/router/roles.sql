-- pgjobq router roles: the grants of a router database (`pgjobq migrate --router`), applied after its
-- function files every time they are applied.  The roles are those sql/roles.sql creates on the shards
-- (roles belong to a PostgreSQL cluster: a router in another cluster has them only when created
-- there); each is granted here only when it exists.  A caller of the router needs on every shard what
-- it would need there itself: PL/Proxy connects as that role.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'pgjobq_producer') THEN
        GRANT EXECUTE ON FUNCTION
            pgjobq.enqueue(text, text, jsonb, smallint, timestamptz, interval, integer, text, text, bigint[], text[],
                           text, text, text, interval),
            pgjobq.enqueue_many(text[], text[], jsonb[], smallint[], timestamptz[], interval[], integer[], text[],
                                text[], boolean, text[]),
            pgjobq.enqueue_split(integer[], text[], text[], jsonb[], smallint[], timestamptz[], interval[], integer[],
                                 text[], text[], boolean, text[]),
            pgjobq.route_hash(text), pgjobq.route_partition(text, text), pgjobq.route_job(bigint), pgjobq.cluster_map(),
            pgjobq.send_event(text, text, jsonb), pgjobq.shard_send_event(text, text, jsonb)
        TO pgjobq_producer;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'pgjobq_monitor') THEN
        GRANT EXECUTE ON FUNCTION pgjobq.stats(), pgjobq.shard_stats(), pgjobq.monitor_job(bigint),
            pgjobq.job_partitions(bigint), pgjobq.route_hash(text), pgjobq.route_partition(text, text),
            pgjobq.route_job(bigint), pgjobq.cluster_map()
        TO pgjobq_monitor;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'pgjobq_admin') THEN
        GRANT EXECUTE ON FUNCTION pgjobq.stats(), pgjobq.shard_stats(), pgjobq.monitor_job(bigint),
            pgjobq.job_partitions(bigint), pgjobq.cluster_set(jsonb, text),
            pgjobq.cancel(bigint), pgjobq.retry(bigint), pgjobq.shard_cancel(bigint), pgjobq.shard_retry(bigint),
            pgjobq.cancel_where(text, text, text, interval, boolean),
            pgjobq.retry_where(text, text, text, interval, boolean, boolean),
            pgjobq.shard_cancel_where(text, text, text, interval, boolean),
            pgjobq.shard_retry_where(text, text, text, interval, boolean, boolean),
            pgjobq.send_event(text, text, jsonb), pgjobq.shard_send_event(text, text, jsonb)
        TO pgjobq_admin;
    END IF;
END
$$;
