-- pgjobq schema, migration 8: the state of a job that waits for other jobs.
-- needs: 7
--
-- A value added to an enum cannot be used in the transaction that adds it, and each migration is one
-- transaction: migration 9 (workflows) uses it.  No library of version 7 ever sees a waiting job
-- until migration 9 makes one.

ALTER TYPE pgjobq.job_state ADD VALUE IF NOT EXISTS 'waiting' BEFORE 'queued';
