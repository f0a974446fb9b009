#!/bin/sh
# bench/soak.sh - `make soak`: the seed thread's deployment for a long time, on a throwaway cluster
# with durable settings.  40 worker processes (SOAK_PROCESSES) x 4 threads (SOAK_CONCURRENCY), a
# table holding 2,000,000 queued jobs (SOAK_QUEUED, scheduled a day ahead) and 2,000,000 finished ones
# (SOAK_FINISHED), and producers (SOAK_PRODUCERS connections, 2) offering 10,000 due jobs a second
# (SOAK_RATE), for 600 s (SOAK_SECONDS), no faults.  SOAK_RATE=0 makes the 2,000,000 due instead and
# the producers put back what drains: the database saturated, no headroom left for autovacuum (see
# bench/README.md).  Passes when
# the last minute's throughput is >= 0.9 of the first's and of the rate, worker RSS stays flat, the
# jobs table and its dead tuples stay bounded (autovacuum keeps up) and no connection leaks;
# `pgjobq bench soak` prints every check.
# The result is appended to bench/results/soak.jsonl.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
pgjobq=${PGJOBQ:-$top/build/pgjobq}
seconds=${SOAK_SECONDS:-600}
processes=${SOAK_PROCESSES:-40}
concurrency=${SOAK_CONCURRENCY:-4}
queued=${SOAK_QUEUED:-2000000}
rate=${SOAK_RATE:-10000}
finished=${SOAK_FINISHED:-2000000}
producers=${SOAK_PRODUCERS:-2}

# What docs/deploy.md recommends for a queue's database: autovacuum looks every 10 s, not every minute.
CLUSTER_CONF=${SOAK_CONF:-"autovacuum_naptime = 10s"}
. "$here/cluster.sh"
"$pgjobq" --db "$db" migrate >/dev/null
settings=$("$bindir/psql" -X -At -c "SELECT string_agg(name || '=' || setting, ' ' ORDER BY name) FROM pg_settings WHERE name IN ('server_version', 'shared_buffers', 'autovacuum_naptime', 'autovacuum_vacuum_cost_limit', 'autovacuum_max_workers')")
echo "# pgjobq soak: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, $processes x $concurrency workers, $rate jobs/s offered (0: saturated) by $producers producers, $seconds s; $settings"
mkdir -p "$here/results"
status=0
"$pgjobq" --db "$db" bench soak --processes "$processes" --concurrency "$concurrency" --jobs "$queued" --rate "$rate" \
    --noise "$finished" --seconds "$seconds" --producers "$producers" > "$dir/soak.json" || status=$?
cat "$dir/soak.json"
cat "$dir/soak.json" >> "$here/results/soak.jsonl"
if [ "$status" = 0 ]; then echo "soak: passed"; else echo "soak: FAILED (status $status)"; fi
exit "$status"
