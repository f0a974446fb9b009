-- The independent ceiling: a minimal queue table, as a careful user would write it without pgjobq.
-- One row per job, a primary key, and one partial index that serves the claim.  Nothing of pgjobq is
-- here: what pgjobq reaches is compared with what this reaches on the same cluster, in the same run.
DROP SCHEMA IF EXISTS ceiling CASCADE;
CREATE SCHEMA ceiling;
CREATE TABLE ceiling.jobs (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue       text        NOT NULL,
    state       text        NOT NULL DEFAULT 'available',
    run_at      timestamptz NOT NULL DEFAULT now(),
    payload     jsonb       NOT NULL,
    attempts    integer     NOT NULL DEFAULT 0,
    lease_until timestamptz);
CREATE INDEX jobs_claim_idx ON ceiling.jobs (queue, run_at, id) WHERE state = 'available';
