-- pgjobq router schema version 1: a database that routes enqueues and reads to the shards of a cluster
-- with PL/Proxy (docs/shards.md), made by `pgjobq migrate --router`.
--
-- A router holds no jobs: the extension plproxy, the map's tables (the same as a shard's, with self
-- NULL: tests/test_cluster.c holds them equal), and its version in pgjobq.router_version.  Its
-- functions (sql/router/functions, and sql/functions/cluster.sql) are applied after its migrations, as
-- a shard's are.  A database that has pgjobq.schema_version (a shard) is refused, and a shard's
-- `pgjobq migrate` refuses a router.

CREATE EXTENSION IF NOT EXISTS plproxy;
-- Where PL/Proxy looks for its cluster's configuration (get_cluster_version, _partitions, _config:
-- sql/router/functions/router.sql); the extension does not make it.
CREATE SCHEMA IF NOT EXISTS plproxy;
CREATE SCHEMA IF NOT EXISTS pgjobq;

CREATE TABLE pgjobq.router_version (
    version    integer     NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT router_version_pkey PRIMARY KEY (version)
);

CREATE DOMAIN pgjobq.identifier AS text
    CONSTRAINT identifier_format CHECK (length(VALUE) BETWEEN 1 AND 64 AND VALUE ~ '^[A-Za-z][A-Za-z0-9_.:-]*$');

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

GRANT USAGE ON SCHEMA pgjobq TO PUBLIC;
GRANT SELECT ON pgjobq.router_version TO PUBLIC;
GRANT SELECT ON pgjobq.cluster, pgjobq.cluster_shards, pgjobq.cluster_owners, pgjobq.cluster_queues TO PUBLIC;
