-- pgjobq schema migration 34: a lease alarm's arrays are stored as they are, not compressed
-- (docs/design.md, "The claim writes in place").
-- needs: 31
--
-- Every claim writes one pgjobq.lease_alarms row naming its jobs and their tokens: two bigint[] of
-- 8 bytes a job, so a claim of more than about 120 jobs makes a row longer than the 2 kB at which
-- PostgreSQL compresses it before storing it out of line.  Its compression (pglz) took about 1.3 ms
-- for a claim of 850, a job's ids and tokens being nearly incompressible: 5.6% of all the server's CPU
-- time in `pgjobq bench drain` 2 x 64 (perf).  Stored EXTERNAL (out of line, not compressed), the
-- same row is written in about 0.05 ms (as with lz4, which not every server has) and read back
-- three times faster than lz4's (every rescue pass, running_jobs and a limited claim's fold read
-- them).  Alarms live seconds, so their size on disk does not matter.  Applies to the rows written
-- from now on; the others are read as they are.
--
-- Libraries of version 31 to 33 keep working: no function changes.

ALTER TABLE pgjobq.lease_alarms ALTER COLUMN ids SET STORAGE EXTERNAL,
                                ALTER COLUMN tokens SET STORAGE EXTERNAL;
