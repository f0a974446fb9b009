-- Claim :n jobs (FOR UPDATE SKIP LOCKED, one statement, its own transaction), then mark them done
-- (another): what any queue must do per batch, on the minimal table (pgbench -D n=100).
WITH c AS MATERIALIZED (
    SELECT id FROM ceiling.jobs
     WHERE queue = 'q' AND state = 'available' AND run_at <= now()
     ORDER BY run_at, id LIMIT :n FOR UPDATE SKIP LOCKED),
u AS (
    UPDATE ceiling.jobs j SET state = 'running', attempts = j.attempts + 1, lease_until = now() + interval '60 s'
     WHERE j.id = ANY (ARRAY(SELECT c.id FROM c)) RETURNING j.id, j.payload)
SELECT coalesce(array_agg(id), '{}') AS ids, array_agg(payload) AS payloads FROM u \gset
UPDATE ceiling.jobs SET state = 'done', lease_until = NULL WHERE id = ANY (:ids::bigint[]);
