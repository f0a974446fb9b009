-- pgjobq schema migration 29: strict order per key (docs/queues.md, "Strict order per key").
-- needs: 28
--
--   queues.strict_order  a queue whose jobs with the same concurrency key run one at a time, in the
--                        order of their ids (the order they were enqueued in), as River Pro's
--                        sequences, pg-boss's key_strict_fifo and PGMQ's FIFO groups do: a key's
--                        next job starts only when the one before it has completed or been
--                        cancelled.  Jobs without a key run as in any queue.
--   queues.sequence_cursor  the last key a claim of a strict queue started a job of: the next claim
--                        looks at the keys after it first, then from the first key round to it, so
--                        that every key gets its turn however many there are.
--   sequence_blocks      a key of a strict queue whose job failed for good: nothing more of the key
--                        starts until that job is retried (pgjobq.retry, retry_where) or skipped
--                        (pgjobq.sequence_skip).  Written in the statement that ends the job failed
--                        (sequence_block, transitions.sql), so a claim sees the failure and the
--                        block together or neither.
--   jobs_sequence_idx    a key's jobs still in line (waiting, queued or running) by id: the claim
--                        finds each key's first in one probe.  Only rows with a concurrency key are
--                        in it: a queue without keys pays nothing.
--
-- queue_list() returns strict_order and blocked_keys: dropped here and made again by the function
-- files.  Libraries of version 28 select its columns by name.

ALTER TABLE pgjobq.queues ADD COLUMN strict_order boolean NOT NULL DEFAULT false;
ALTER TABLE pgjobq.queues ADD COLUMN sequence_cursor text;

CREATE TABLE pgjobq.sequence_blocks (
    queue  pgjobq.identifier NOT NULL,
    key    pgjobq.short_text NOT NULL,
    job_id bigint            NOT NULL,
    at     timestamptz       NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, key)
);
CREATE INDEX sequence_blocks_job_idx ON pgjobq.sequence_blocks (job_id);

CREATE INDEX jobs_sequence_idx ON pgjobq.jobs (queue, concurrency_key, id)
    WHERE concurrency_key IS NOT NULL AND state IN ('waiting', 'queued', 'running');

DROP FUNCTION IF EXISTS pgjobq.queue_list();
