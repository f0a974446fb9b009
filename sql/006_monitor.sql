-- pgjobq schema, migration 6: what `pgjobq serve` (metrics and the dashboard) reads.
--
-- * pgjobq.workers: every worker process says it is alive every few seconds (worker_beat, from its
--   write connection), so that a dashboard can show which workers run and what they hold.
-- * pgjobq.tallies: retries and lost leases, counted where they happen (fail_many, rescue_expired),
--   one row per queue per statement: insert-only, so no writer ever waits for another.  Completions,
--   failures and cancellations need no tally: each one is a row of pgjobq.history.
-- * A BRIN index on finished_at, so that "what finished in the last N seconds" reads a few pages of
--   the newest partition instead of the whole hour (a BRIN index costs inserts almost nothing).
-- * The pgjobq_monitor role (pgjobq migrate --roles): reading, nothing else.

CREATE TABLE pgjobq.workers (
    id         text        PRIMARY KEY,
    host       text        NOT NULL,
    pid        integer     NOT NULL,
    version    text        NOT NULL,
    queues     text        NOT NULL,
    started_at timestamptz NOT NULL,
    last_seen  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT workers_id_length CHECK (length(id) BETWEEN 1 AND 255),
    CONSTRAINT workers_text_lengths CHECK (length(host) <= 255 AND length(version) <= 64
                                           AND length(queues) <= 4096)
);

CREATE TABLE pgjobq.tallies (
    id    bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at    timestamptz NOT NULL DEFAULT now(),
    queue text        NOT NULL,
    what  text        NOT NULL CHECK (what IN ('retried', 'lost')),
    n     bigint      NOT NULL
);
CREATE INDEX tallies_at_idx ON pgjobq.tallies (at);

CREATE INDEX history_done_finished_brin ON pgjobq.history_done USING brin (finished_at);
