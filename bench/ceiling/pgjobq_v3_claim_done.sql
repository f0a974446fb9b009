-- T2's statements with schema 3's claim (bench_v3.claim_batch, made by run.sh: no settings lookup), for T10.
SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(lease_token), '{}') AS tokens,
       array_agg(payload) AS payloads
  FROM bench_v3.claim_batch('bench', 100, '60 s', 'pgbench') \gset
SELECT count(*) FROM pgjobq.complete_many(:ids::bigint[], :tokens::bigint[], NULL);
