-- pgjobq schema migration 26: dead-letter queues and their redrive (docs/queues.md, "Dead letters").
-- needs: 24
--
--   queues.dead_letter    the queue that receives a copy of each job of this queue that fails for good
--                         (its attempts spent, or failed permanently; not a cancelled one): a new job
--                         there, queued, with the same kind, payload, priority, attempts, tags and
--                         concurrency key, made in the failing transaction (dead_letter_send,
--                         sql/functions/transitions.sql).  NULL: none.  queue_set refuses a cycle.
--   pgjobq.dead_letters   the link of each such job to the one that failed: id (the new job),
--                         original_id (the failed one, in the history as it was), original_queue
--                         (where a redrive sends it back: retry_where(..., redrive => true)), queue
--                         (the dead-letter queue it was made in), at, and redriven_at.  Kept while the dead-letter job lives, and then as long as
--                         the history keeps finished jobs (prune).
--
-- queue_list() returns dead_letter, and retry_where takes redrive: both dropped here and made again by
-- the function files.  Libraries of version 24 keep working: they select queue_list()'s columns by
-- name and call retry_where with five arguments, which the new one takes (redrive defaults to false).

ALTER TABLE pgjobq.queues ADD COLUMN dead_letter pgjobq.identifier;
ALTER TABLE pgjobq.queues ADD CONSTRAINT queues_dead_letter_not_itself CHECK (dead_letter <> name);

CREATE TABLE pgjobq.dead_letters (
    id             bigint            NOT NULL,
    original_id    bigint            NOT NULL,
    original_queue pgjobq.identifier NOT NULL,
    queue          pgjobq.identifier NOT NULL,
    at             timestamptz       NOT NULL DEFAULT now(),
    redriven_at    timestamptz,
    CONSTRAINT dead_letters_pkey PRIMARY KEY (id)
);
CREATE INDEX dead_letters_original_idx ON pgjobq.dead_letters (original_id);
CREATE INDEX dead_letters_at_idx ON pgjobq.dead_letters (at);

DROP FUNCTION IF EXISTS pgjobq.queue_list();
DROP FUNCTION IF EXISTS pgjobq.retry_where(text, text, text, interval, boolean);
