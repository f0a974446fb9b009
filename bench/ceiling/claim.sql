-- The minimal table's claim alone: claim_done.sql's first statement, :n jobs (pgbench -D n=100), its
-- own transaction.  bench/cost.sh compares pgjobq's claim with it (pgjobq_claim_cursor.sql).
WITH c AS MATERIALIZED (
    SELECT id FROM ceiling.jobs
     WHERE queue = 'q' AND state = 'available' AND run_at <= now()
     ORDER BY run_at, id LIMIT :n FOR UPDATE SKIP LOCKED),
u AS (
    UPDATE ceiling.jobs j SET state = 'running', attempts = j.attempts + 1, lease_until = now() + interval '60 s'
     WHERE j.id = ANY (ARRAY(SELECT c.id FROM c)) RETURNING j.id, j.payload)
SELECT count(*) FROM u;
