-- pgjobq schema migration: the cluster map, for a database that is one shard of several (docs/shards.md),
-- and each job's routing key.
-- needs: 11
--
--   pgjobq.cluster          one row once the database is in a cluster: its name, the map's epoch (grows
--                           with every change of the map), its P partitions (a power of two), the id
--                           floor (the ids of jobs enqueued before the cluster are at most it), and
--                           self, this database's own name among the shards (NULL in a router database).
--   pgjobq.cluster_shards   the shards: name, number (0 to 1023: the job ids a shard hands out end in
--                           it, id % 1024) and conninfo (never a password).
--   pgjobq.cluster_owners   the shard that owns each partition 0 .. P - 1.
--   pgjobq.cluster_queues   how a queue is placed: pinned (the default, also for a queue not listed:
--                           the whole queue on one partition, route_hash(queue) & (P - 1) unless given)
--                           or spread (each job by its routing key).
--   jobs.route_key, history.route_key
--                           the routing key a job was enqueued with (a tenant, an account): where a job
--                           of a spread queue lives.  NULL for most jobs; a job of a spread queue without
--                           one lives on its queue's own partition, as a pinned queue's.
--
-- The tables stay empty until pgjobq.cluster_set installs a map (sql/functions/cluster.sql), which is
-- also when the shard's guard (a statement trigger on pgjobq.jobs) and the shard's ids (the jobs'
-- sequence stepping by 1024) are set up: a database that is in no cluster has neither and pays nothing.
--
-- Libraries of version 11 keep working: enqueue and enqueue_many gained an argument with a default
-- (route_key, route_keys), and the old signatures are dropped here so that their calls are not
-- ambiguous.

CREATE TABLE pgjobq.cluster (
    one          boolean           NOT NULL DEFAULT true,
    name         pgjobq.identifier NOT NULL,
    epoch        integer           NOT NULL,
    partitions   integer           NOT NULL,
    id_floor     bigint            NOT NULL DEFAULT 0,
    self         pgjobq.identifier,
    installed_at timestamptz       NOT NULL DEFAULT now(),
    CONSTRAINT cluster_pkey PRIMARY KEY (one),
    CONSTRAINT cluster_one_row CHECK (one),
    -- (An integer: PL/Proxy's cluster version, which the router reads from it, is one.)
    CONSTRAINT cluster_epoch_positive CHECK (epoch > 0),
    CONSTRAINT cluster_partitions_power_of_two
        CHECK (partitions BETWEEN 1 AND 4096 AND (partitions & (partitions - 1)) = 0),
    CONSTRAINT cluster_id_floor_not_negative CHECK (id_floor >= 0)
);

CREATE TABLE pgjobq.cluster_shards (
    name     pgjobq.identifier NOT NULL,
    number   integer           NOT NULL,
    conninfo text              NOT NULL,
    CONSTRAINT cluster_shards_pkey PRIMARY KEY (name),
    CONSTRAINT cluster_shards_number_key UNIQUE (number),
    CONSTRAINT cluster_shards_number_range CHECK (number BETWEEN 0 AND 1023),
    CONSTRAINT cluster_shards_conninfo_length CHECK (length(conninfo) BETWEEN 1 AND 4096)
);

CREATE TABLE pgjobq.cluster_owners (
    partition integer           NOT NULL,
    shard     pgjobq.identifier NOT NULL,
    CONSTRAINT cluster_owners_pkey PRIMARY KEY (partition),
    CONSTRAINT cluster_owners_partition_range CHECK (partition >= 0),
    CONSTRAINT cluster_owners_shard_fkey FOREIGN KEY (shard) REFERENCES pgjobq.cluster_shards (name)
);

CREATE TABLE pgjobq.cluster_queues (
    queue     pgjobq.identifier NOT NULL,
    placement text              NOT NULL,
    partition integer,
    CONSTRAINT cluster_queues_pkey PRIMARY KEY (queue),
    CONSTRAINT cluster_queues_placement CHECK (placement IN ('pinned', 'spread')),
    CONSTRAINT cluster_queues_partition CHECK (partition IS NULL OR (partition >= 0 AND placement = 'pinned'))
);

ALTER TABLE pgjobq.jobs ADD COLUMN route_key pgjobq.short_text;
ALTER TABLE pgjobq.history ADD COLUMN route_key text;

CREATE OR REPLACE VIEW pgjobq.all_jobs AS
    SELECT id, queue::text AS queue, kind::text AS kind, payload::jsonb AS payload, priority, state, attempt,
           max_attempts, run_at, created_at, started_at, finished_at, lease_until, lease_token,
           worker_id::text AS worker_id, result, last_error, unique_key::text AS unique_key, cancel_requested,
           concurrency_key::text AS concurrency_key, tags, progress, cancel_requested_at, cancel_told_at,
           route_key::text AS route_key
      FROM pgjobq.jobs
    UNION ALL
    SELECT id, queue, kind, payload, priority, state, attempt, max_attempts, run_at, created_at, started_at,
           finished_at, lease_until, lease_token, worker_id, result, last_error, unique_key, cancel_requested,
           concurrency_key, tags, progress, cancel_requested_at, cancel_told_at, route_key
      FROM pgjobq.history;

-- The map is no secret (a conninfo never holds a password: cluster_set refuses one), and every client
-- needs it to route: anyone who may use the schema reads it, through pgjobq.cluster_map() too.
GRANT SELECT ON pgjobq.cluster, pgjobq.cluster_shards, pgjobq.cluster_owners, pgjobq.cluster_queues TO PUBLIC;

-- enqueue and enqueue_many take the routing key (route_key, route_keys), and enqueue_explain names a
-- bad one.
DROP FUNCTION IF EXISTS pgjobq.enqueue(text, text, jsonb, smallint, timestamptz, interval, integer, text, text, bigint[],
                                       text[], text);
DROP FUNCTION IF EXISTS pgjobq.enqueue_many(text[], text[], jsonb[], smallint[], timestamptz[], interval[], integer[],
                                            text[], text[], boolean);
DROP FUNCTION IF EXISTS pgjobq.enqueue_explain(text[], text[], jsonb[], smallint[], integer[], text[], text[]);
