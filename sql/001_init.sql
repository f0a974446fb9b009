-- pgjobq schema version 1: the jobs table and its indexes.
--
-- The migration runner (src/migrate.c) applies this file inside one transaction, under a transaction
-- advisory lock, only when pgjobq.schema_version says it has not been applied yet; that gate is what
-- makes running `pgjobq migrate` twice, or from several hosts at once, a no-op.
--
-- A numbered migration holds only what must run once: tables, types, indexes, data moves, and the
-- drops of function signatures that a later version replaced.  The functions (one per state
-- transition, since version 1) are defined once, as they are now, in sql/functions/, which the
-- runner applies after the numbered migrations (docs/hacking.md).

CREATE SCHEMA IF NOT EXISTS pgjobq;

CREATE TABLE pgjobq.schema_version (
    version    integer     NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT schema_version_pkey PRIMARY KEY (version)
);

-- Queue and kind names: an ASCII letter, then up to 63 letters, digits, '_', '.', ':' or '-'.
-- A domain is checked when a value is stored, not again when an UPDATE leaves the column alone, which
-- keeps the claim and completion updates free of regex work.
-- (The length test comes first and the pattern has no bounded repetition: PostgreSQL's regex engine
-- takes about seven times longer on '{0,63}', which showed up as a third of the cost of an enqueue.)
CREATE DOMAIN pgjobq.identifier AS text
    CONSTRAINT identifier_format CHECK (length(VALUE) BETWEEN 1 AND 64 AND VALUE ~ '^[A-Za-z][A-Za-z0-9_.:-]*$');

-- A payload is a JSON document of at most 1 MiB in its text form (the library checks the same cap).
CREATE DOMAIN pgjobq.payload AS jsonb
    CONSTRAINT payload_size CHECK (octet_length(VALUE::text) <= 1048576);

CREATE DOMAIN pgjobq.short_text AS text
    CONSTRAINT short_text_length CHECK (length(VALUE) BETWEEN 1 AND 255);

CREATE TYPE pgjobq.job_state AS ENUM ('queued', 'running', 'completed', 'failed', 'cancelled');

CREATE TABLE pgjobq.jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY,
    queue            pgjobq.identifier NOT NULL DEFAULT 'default',
    kind             pgjobq.identifier NOT NULL DEFAULT 'default',
    payload          pgjobq.payload    NOT NULL DEFAULT '{}',
    priority         smallint          NOT NULL DEFAULT 0,
    state            pgjobq.job_state  NOT NULL DEFAULT 'queued',
    attempt          integer           NOT NULL DEFAULT 0,
    max_attempts     integer           NOT NULL DEFAULT 25,
    run_at           timestamptz       NOT NULL DEFAULT now(),
    created_at       timestamptz       NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    lease_until      timestamptz,
    lease_token      bigint            NOT NULL DEFAULT 0,
    worker_id        pgjobq.short_text,
    result           jsonb,
    last_error       text,
    unique_key       pgjobq.short_text,
    cancel_requested boolean           NOT NULL DEFAULT false,
    CONSTRAINT jobs_pkey PRIMARY KEY (id),
    CONSTRAINT jobs_priority_range CHECK (priority BETWEEN -100 AND 100),
    CONSTRAINT jobs_max_attempts_range CHECK (max_attempts BETWEEN 1 AND 1000),
    CONSTRAINT jobs_attempt_range CHECK (attempt BETWEEN 0 AND max_attempts),
    CONSTRAINT jobs_queued_has_attempts_left CHECK (state <> 'queued' OR attempt < max_attempts),
    CONSTRAINT jobs_lease_iff_running CHECK ((state = 'running') = (lease_until IS NOT NULL)),
    CONSTRAINT jobs_finished_iff_final
        CHECK ((state IN ('completed', 'failed', 'cancelled')) = (finished_at IS NOT NULL)),
    CONSTRAINT jobs_run_at_finite CHECK (isfinite(run_at)),
    CONSTRAINT jobs_last_error_length CHECK (octet_length(last_error) <= 16384)
);

-- The claim walks this index in the claim's own ORDER BY, over queued rows only, so finished history
-- never slows a claim down however large it grows.
CREATE INDEX jobs_claim_idx ON pgjobq.jobs (queue, priority, run_at, id) WHERE state = 'queued';

-- The rescuer finds expired leases here.
CREATE INDEX jobs_lease_idx ON pgjobq.jobs (lease_until) WHERE state = 'running';

-- At most one queued or running job per unique key; enqueue relies on this index (ON CONFLICT), not on a
-- read-then-write check, so two racing producers cannot both insert.
CREATE UNIQUE INDEX jobs_unique_key_idx ON pgjobq.jobs (unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('queued', 'running');

-- Retention prunes finished jobs by age.
CREATE INDEX jobs_finished_idx ON pgjobq.jobs (finished_at)
    WHERE state IN ('completed', 'failed', 'cancelled');

-- A queue table churns: vacuum it early and often.
ALTER TABLE pgjobq.jobs SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1
);

-- Anyone who can connect may see which schema version is installed (the library checks it at
-- connect); seeing it grants nothing else.
GRANT USAGE ON SCHEMA pgjobq TO PUBLIC;
GRANT SELECT ON pgjobq.schema_version TO PUBLIC;
