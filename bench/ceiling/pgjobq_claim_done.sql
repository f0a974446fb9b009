-- pgjobq's statements, the same batch as claim_done.sql: claim 100 from the head of the queue
-- (pgjobq.claim_batch, as the worker sends it when it has no start key), then complete them
-- (pgjobq.complete_many: fenced by lease token, finished jobs move to history).
SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(lease_token), '{}') AS tokens,
       array_agg(payload) AS payloads
  FROM pgjobq.claim_batch('bench', 100, '60 s', 'pgbench') \gset
SELECT count(*) FROM pgjobq.complete_many(:ids::bigint[], :tokens::bigint[], NULL);
