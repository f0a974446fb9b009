-- pgjobq schema, migration 18: a worker says when it cannot run jobs, and a handler can hand a job back.
-- needs: 15
--
-- pgjobq.workers.unhealthy, unhealthy_since
--                      why a live worker claims nothing (pgjobq_worker_set_unhealthy: a coprocess
--                      that cannot start, the traceback of the module it could not import), and since
--                      when; NULL while it claims.  Written by its beat (worker_beat's new last
--                      argument, which defaults to NULL: the libraries of version 15 call it with six
--                      and keep working), read by `pgjobq health` and the dashboard
--                      (monitor_unhealthy_workers).
-- snooze_many          (sql/functions/transitions.sql, a new function): a handler hands jobs back
--                      untouched, the attempt not counted, to run after a delay (a kind the worker
--                      does not know yet, a handler that could not start).
ALTER TABLE pgjobq.workers ADD COLUMN unhealthy text, ADD COLUMN unhealthy_since timestamptz;
ALTER TABLE pgjobq.workers ADD CONSTRAINT workers_unhealthy_length CHECK (length(unhealthy) <= 4096);
DROP FUNCTION IF EXISTS pgjobq.worker_beat(text, text, integer, text, text, bigint);
