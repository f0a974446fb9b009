-- pgjobq's claim of :n jobs as the worker sends it under a backlog (src/worker.c, src/cursor.c):
-- pgjobq.claim_next from the client's cursor (the largest key and id its previous claim took, at
-- priority 0), with the notification gate's row asked for; its own transaction.  Start with
-- pgbench -D n=100 -D k=-infinity -D i=0.  bench/cost.sh compares it with
-- claim_done.sql's claim alone.
WITH c AS (SELECT * FROM pgjobq.claim_next('bench', :n, '60 s', 'pgbench', '{0}', ARRAY[:k::timestamptz],
                                          ARRAY[:i::bigint], NULL, NULL, false, true))
SELECT coalesce((SELECT c.key FROM c WHERE c.meta IS NULL ORDER BY c.key DESC, c.id DESC LIMIT 1)::text, :k) AS k,
       coalesce((SELECT c.id FROM c WHERE c.meta IS NULL ORDER BY c.key DESC, c.id DESC LIMIT 1), :i) AS i \gset
