#!/bin/sh
# bench/ab.sh - an A/B of two builds of pgjobq on one throwaway cluster (bench/cluster.sh).
#
#   bench/ab.sh OLD NEW ROUNDS SCENARIO [BENCH OPTIONS...]
#
# OLD and NEW are pgjobq executables (build the other one in a worktree: `git worktree add
# /tmp/old COMMIT && make -C /tmp/old build/pgjobq`).  Each migrates a database of its own (olddb,
# newdb) in the same cluster, so that both run on the same server, disk and WAL; the cluster's WAL is
# written once beforehand, so that segments recycle as on a server in production.  Then ROUNDS
# rounds, old then new, of `pgjobq bench SCENARIO --json [BENCH OPTIONS...]`, alternating so that
# drift of a shared machine hits both alike.  Prints one line per run (round, side, jobs_per_s) and
# the medians.  Example, the S5 drain:
#
#   bench/ab.sh /tmp/old/build/pgjobq build/pgjobq 5 drain --jobs 100000 --processes 40 --concurrency 8
#
# AB_FIELD names the JSON field compared (jobs_per_s by default), e.g. the B4 pickup's median:
#
#   AB_FIELD=p50_ms bench/ab.sh /tmp/old/build/pgjobq build/pgjobq 5 latency --jobs 1000 --rate 200
set -eu
field=${AB_FIELD:-jobs_per_s}
case $field in '' | *[!a-z0-9_]*) echo "bench/ab.sh: AB_FIELD must be a JSON field's name, not $field" >&2; exit 64;; esac
[ $# -ge 4 ] || { echo "usage: bench/ab.sh OLD NEW ROUNDS SCENARIO [BENCH OPTIONS...]" >&2; exit 64; }
old=$1 new=$2 rounds=$3
shift 3
for b in "$old" "$new"; do
    [ -x "$b" ] || { echo "bench/ab.sh: $b is not an executable" >&2; exit 66; }
done
case $rounds in '' | *[!0-9]*) echo "bench/ab.sh: ROUNDS must be a number, not $rounds" >&2; exit 64;; esac
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cluster.sh"
for side in old new; do
    psql -qc "CREATE DATABASE ${side}db"
done
psql -q <<'EOF'
CREATE TABLE wal_once AS SELECT g, repeat('x', 500) AS t FROM generate_series(1, 2000000) g;
DROP TABLE wal_once;
CHECKPOINT;
EOF
"$old" --db "host=$dir user=postgres dbname=olddb" migrate >/dev/null
"$new" --db "host=$dir user=postgres dbname=newdb" migrate >/dev/null
out=$dir/ab.txt
: > "$out"
r=1
while [ "$r" -le "$rounds" ]; do
    for side in old new; do
        if [ "$side" = old ]; then b=$old; else b=$new; fi
        v=$("$b" bench "$@" --json --db "host=$dir user=postgres dbname=${side}db" |
            sed -n "s/.*\"$field\":\([0-9.]*\).*/\1/p" | tail -n 1)
        echo "round $r $side ${v:-failed}" | tee -a "$out"
    done
    r=$((r + 1))
done
for side in old new; do
    awk -v s="$side" -v f="$field" '$3 == s && $4 != "failed" { v[n++] = $4 }
        END { if (n == 0) { print s ": no result"; exit }
              for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
              m = n % 2 ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2
              printf "%s: median %.2f %s over %d runs\n", s, m, f, n }' "$out"
done
