-- pgjobq schema, migration 11: least privilege between workers, and run_at within sane bounds.
-- needs: 10
--
--   pgjobq.retention   the retention of finished jobs, for every worker (one row: completed and
--                      cancelled jobs are kept `completed`, failed ones `failed`; 24 hours and 7
--                      days, the defaults workers had).  It was each worker's option only, and any
--                      worker role could erase all history with prune('0s', '0s').  Now prune()
--                      with ages shorter than these needs pgjobq_admin or the schema's owner, and
--                      prune() without ages keeps these (sql/functions/maintenance.sql);
--                      pgjobq.retention_set changes them.
--   workers.secret_hash
--                      a row of the registry of workers belongs to the worker that wrote it: the
--                      SHA-256 of a random secret it passes with every beat and with its goodbye.
--                      Any worker role could overwrite or delete any row (worker_beat, worker_gone),
--                      and two live workers could share an id.  Now another secret is refused while
--                      the row is live (sql/functions/monitor.sql).  Rows written before have none.
--   jobs_run_at_range  a job's run_at is from 1900 to the end of 9999 (UTC).  A date far outside
--                      (year 99999, 4713 BC) was accepted, and a job due in 4713 BC made the queue's
--                      lag metric 2e11 seconds.  The enqueue functions refuse more narrowly, naming
--                      the element: within 100 years of now, the cap of `pgjobq enqueue --delay`
--                      (sql/functions/enqueue.sql); this constraint, which cannot follow the clock,
--                      is the bound for what they do not check (COPY, graphs, rows written by hand).
--                      Live rows of earlier versions outside the range move to its nearer end first:
--                      a job due in year 99999 is as far from due at the end of 9999, and one due in
--                      4713 BC as due now in 1900.
--
-- With this version, outside this file: a lease token is random (claim.sql), and the admin and
-- monitor roles read every column of the jobs but lease_token, and of the workers but secret_hash
-- (roles.sql).
--
-- Libraries of version 10 keep working: no function they call changed its signature.  Their workers
-- prune with their own options (24 hours and 7 days unless set), which a worker role may do as long
-- as they are not shorter than the retention here; they beat and leave with worker_beat(id, host, pid,
-- version, queues) and worker_gone(id), which now reach the functions that take the worker's secret
-- (it defaults to NULL: rows without one).  The old five- and one-argument functions are dropped here,
-- so that each name has one definition (sql/functions/monitor.sql) and those calls are not ambiguous.  What
-- such a library cannot do any more, under the admin or monitor role once roles.sql is applied again:
-- read a job back (it selects lease_token: permission denied).

DROP FUNCTION IF EXISTS pgjobq.worker_beat(text, text, integer, text, text);
DROP FUNCTION IF EXISTS pgjobq.worker_gone(text);

UPDATE pgjobq.jobs j
   SET run_at = CASE WHEN j.run_at < '1900-01-01 00:00:00+00' THEN '1900-01-01 00:00:00+00'::timestamptz
                     ELSE '9999-12-31 23:59:59+00'::timestamptz END
 WHERE j.run_at < '1900-01-01 00:00:00+00' OR j.run_at >= '10000-01-01 00:00:00+00';
ALTER TABLE pgjobq.jobs ADD CONSTRAINT jobs_run_at_range
    CHECK (run_at >= '1900-01-01 00:00:00+00' AND run_at < '10000-01-01 00:00:00+00');

CREATE TABLE pgjobq.retention (
    one        boolean     NOT NULL DEFAULT true,
    completed  interval    NOT NULL DEFAULT '24 hours',
    failed     interval    NOT NULL DEFAULT '7 days',
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT retention_pkey PRIMARY KEY (one),
    CONSTRAINT retention_one_row CHECK (one),
    CONSTRAINT retention_not_negative CHECK (completed >= interval '0' AND failed >= interval '0')
);
INSERT INTO pgjobq.retention DEFAULT VALUES;

ALTER TABLE pgjobq.workers ADD COLUMN secret_hash bytea;
