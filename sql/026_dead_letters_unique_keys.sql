-- pgjobq schema migration 26: dead-letter queues and their redrive, and unique keys that debounce or
-- throttle (docs/queues.md, "Dead letters", "Debounce and throttle").
-- needs: 25
--
--   queues.dead_letter    the queue that receives a copy of each job of this queue that fails for good
--                         (its attempts spent, or failed permanently; not a cancelled one): a new job
--                         there, queued, with the same kind, payload, priority, attempts, tags and
--                         concurrency key, made in the failing transaction (dead_letter_send,
--                         sql/functions/transitions.sql).  NULL: none.  queue_set refuses a cycle.
--   pgjobq.dead_letters   the link of each such job to the one that failed: id (the new job),
--                         original_id (the failed one, in the history as it was), original_queue
--                         (where a redrive sends it back: retry_where(..., redrive => true)), queue
--                         (the dead-letter queue it was made in), at, and redriven_at.  Kept while
--                         the dead-letter job lives, and then as long as the history keeps it (prune).
--   pgjobq.unique_holds   unique keys held for a window (unique_for: a throttle; enqueue_keyed,
--                         sql/functions/enqueue.sql) from the enqueue that took them, whatever became
--                         of the job: (queue, unique_key) -> job_id, until.  Pruned once past.
--
-- queue_list() returns dead_letter, retry_where takes redrive, and enqueue takes on_conflict and
-- unique_for: dropped here and made again by the function files.  Libraries of version 24 keep
-- working: they select queue_list()'s columns by name and call retry_where with five arguments and
-- enqueue by name, which the new ones take (the new arguments have defaults).

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

CREATE TABLE pgjobq.unique_holds (
    queue      pgjobq.identifier NOT NULL,
    unique_key pgjobq.short_text NOT NULL,
    job_id     bigint            NOT NULL,
    until      timestamptz       NOT NULL,
    CONSTRAINT unique_holds_pkey PRIMARY KEY (queue, unique_key)
);
CREATE INDEX unique_holds_until_idx ON pgjobq.unique_holds (until);

DROP FUNCTION IF EXISTS pgjobq.queue_list();
DROP FUNCTION IF EXISTS pgjobq.enqueue(text, text, jsonb, smallint, timestamptz, interval, integer, text, text, bigint[],
                                       text[], text, text);
DROP FUNCTION IF EXISTS pgjobq.retry_where(text, text, text, interval, boolean);
