-- The same, starting each claim after the largest key of the client's previous claim, as the worker
-- does under a backlog (pgbench -D p=-32768 -D r=-infinity -D i=0 starts from the head).
SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(lease_token), '{}') AS tokens,
       array_agg(payload) AS payloads,
       coalesce((array_agg(priority ORDER BY priority DESC, run_at DESC, id DESC))[1], :p) AS p,
       coalesce((array_agg(run_at ORDER BY priority DESC, run_at DESC, id DESC))[1], :r::timestamptz) AS r,
       coalesce((array_agg(id ORDER BY priority DESC, run_at DESC, id DESC))[1], :i) AS i
  FROM pgjobq.claim_batch('bench', 100, '60 s', 'pgbench', :p::smallint, :r::timestamptz, :i::bigint) \gset
SELECT count(*) FROM pgjobq.complete_many(:ids::bigint[], :tokens::bigint[], NULL);
