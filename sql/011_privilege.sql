-- pgjobq schema, migration 11: run_at within sane bounds.
-- needs: 10
--
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
-- Libraries of version 10 keep working: no function they call changed its signature.

UPDATE pgjobq.jobs j
   SET run_at = CASE WHEN j.run_at < '1900-01-01 00:00:00+00' THEN '1900-01-01 00:00:00+00'::timestamptz
                     ELSE '9999-12-31 23:59:59+00'::timestamptz END
 WHERE j.run_at < '1900-01-01 00:00:00+00' OR j.run_at >= '10000-01-01 00:00:00+00';
ALTER TABLE pgjobq.jobs ADD CONSTRAINT jobs_run_at_range
    CHECK (run_at >= '1900-01-01 00:00:00+00' AND run_at < '10000-01-01 00:00:00+00');
