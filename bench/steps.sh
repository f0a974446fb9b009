#!/bin/sh
# bench/steps.sh - where a job's time goes, step by step, against the minimal table: one session
# claims N jobs and completes them, B times, alternating with the minimal table's claim of N
# (bench/ceiling/claim_done.sql's statements) and its "done", and prints each step's median, per job
# (`sh bench/steps.sh`; N=850 B=30 by default: a drain's claims are of 700-900).  One session, so no
# lock waits and no other work: what each statement costs the server and the round trip, the way
# psql sends it (the ids and tokens as array literals, on both sides).
#
# One throwaway cluster (bench/cluster.sh, durable settings), one database.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
pgjobq=${PGJOBQ:-$top/build/pgjobq}
n=${N:-850}
b=${B:-30}
case "$n$b" in *[!0-9]*) echo "steps: N and B must be whole numbers" >&2; exit 64 ;; esac
[ "$n" -ge 1 ] && [ "$n" -le 1000 ] && [ "$b" -ge 1 ] || { echo "steps: N must be 1 to 1000 and B at least 1" >&2; exit 64; }

. "$here/cluster.sh"
"$pgjobq" --db "$db" migrate >/dev/null
"$bindir/psql" -X -q -f "$here/ceiling/schema.sql" 2>/dev/null
psql_() { "$bindir/psql" -X -q "$@"; }
psql_ -c "INSERT INTO pgjobq.jobs (queue, kind, payload) SELECT 'steps', 'noop', '{\"noop\": true}' FROM generate_series(1, $((n * b)))" \
      -c "INSERT INTO ceiling.jobs (queue, payload) SELECT 'q', '{\"noop\": true}' FROM generate_series(1, $((n * b)))" \
      -c "VACUUM ANALYZE" -c "CHECKPOINT" >/dev/null

i=0
{
    printf '%s\n' '\timing on'
    while [ "$i" -lt "$b" ]; do
        cat <<SQL
\echo minimal_claim
WITH c AS MATERIALIZED (SELECT id FROM ceiling.jobs WHERE queue = 'q' AND state = 'available' AND run_at <= now() ORDER BY run_at, id LIMIT $n FOR UPDATE SKIP LOCKED), u AS (UPDATE ceiling.jobs j SET state = 'running', attempts = j.attempts + 1, lease_until = now() + interval '60 s' WHERE j.id = ANY (ARRAY(SELECT c.id FROM c)) RETURNING j.id, j.payload) SELECT coalesce(array_agg(id), '{}') AS ids, array_agg(payload) AS payloads FROM u \gset
\echo minimal_done
UPDATE ceiling.jobs SET state = 'done', lease_until = NULL WHERE id = ANY (:'ids'::bigint[]);
\echo pgjobq_claim
SELECT array_agg(id) AS ids, array_agg(lease_token) AS toks FROM pgjobq.claim_next('steps', $n, '60 s', 'steps:1') WHERE meta IS NULL \gset
\echo pgjobq_complete
SELECT count(*) FROM pgjobq.complete_many(:'ids'::bigint[], :'toks'::bigint[]) \g /dev/null
SQL
        i=$((i + 1))
    done
} | psql_ 2>&1 | grep -E '^(minimal_claim|minimal_done|pgjobq_claim|pgjobq_complete)$|^Time' | paste - - |
    awk '{ print $1, $3 }' | sort -k1,1 -k2n | awk -v n="$n" '
        { v[$1, ++c[$1]] = $2 }
        END {
            split("minimal_claim minimal_done pgjobq_claim pgjobq_complete", keys, " ")
            for (i = 1; i <= 4; i++) {
                k = keys[i]
                if (!(k in c))
                    continue
                h = int((c[k] + 1) / 2)
                m = (c[k] % 2) ? v[k, h] : (v[k, h] + v[k, h + 1]) / 2
                med[k] = m
                printf "%-16s median %8.2f ms a claim of %d = %6.2f us a job (%d calls)\n", k, m, n, m * 1000 / n, c[k]
            }
            if (("minimal_claim" in med) && ("pgjobq_claim" in med))
                printf "pgjobq / minimal: claim %.2f, completion %.2f, both %.2f\n", med["pgjobq_claim"] / med["minimal_claim"],
                       med["pgjobq_complete"] / med["minimal_done"],
                       (med["pgjobq_claim"] + med["pgjobq_complete"]) / (med["minimal_claim"] + med["minimal_done"])
        }'
