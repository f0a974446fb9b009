#!/bin/sh
# bench/notify.sh - issue 42's producer figures: what listening workers cost producers of one job a
# transaction, and the pickup of 40 worker processes at a low rate (`sh bench/notify.sh`; QUICK=1
# for a short version, REPS=n; OLD=path/to/an/older/pgjobq for an A/B against that build).
#
# One throwaway cluster (bench/cluster.sh, durable settings); a database per build (newdb, olddb:
# each migrated by its own build, so the old one runs the old notify), in alternating rounds.  In each:
#
#   W = 0, 40   worker processes listening: `python3 -m pgjobq worker py_notify_app:app --queue
#               bench:4` (bench/py_notify_app.py: a no-op task that notes when it started).
#   via         8 producer threads, a session each, offering 500 jobs/s between them, one job a
#               transaction, for SECONDS (bench/producers.py): sql (pgjobq.enqueue; COMMIT),
#               python (a task's defer(conn); COMMIT) and c (pgjobq_enqueue through the build's
#               libpgjobq.so).
#
# Figures: the producers' rate with 40 workers listening / with none, per interface (target >= 0.9),
# and the pickup at 100 jobs/s from Python with 40 workers (p50 and p99 from the enqueue's transaction
# start to the claim's start, database clock; and from the producer's call to the task's start;
# target p99 <= 50 ms).  Prints a table, and appends every
# run to bench/results/notify.jsonl.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
new=${PGJOBQ:-$top/build/pgjobq}
old=${OLD:-}
python=${PYTHON:-$(command -v /usr/bin/python3 python3 | head -n 1)}
quick=${QUICK:-0}
if [ "$quick" = 1 ]; then
    reps=${REPS:-1}; seconds=5; workers=${WORKERS:-40}
else
    reps=${REPS:-3}; seconds=20; workers=${WORKERS:-40}
fi
results="$here/results"
mkdir -p "$results"
runs="$results/notify.jsonl"
: > "$runs"

. "$here/cluster.sh"
. "$here/rounds.sh"
sides="new"
[ -n "$old" ] && sides="old new"
for side in $sides; do
    sql "CREATE DATABASE ${side}db" >/dev/null
done
# The cluster's WAL written once, so that segments recycle as on a server in production.
sql "CREATE TABLE wal_once AS SELECT g, repeat('x', 500) AS t FROM generate_series(1, 2000000) g" >/dev/null
sql "DROP TABLE wal_once" >/dev/null
sql "CHECKPOINT" >/dev/null

bin_of() { if [ "$1" = old ]; then echo "$old"; else echo "$new"; fi; }
url_of() { echo "postgresql:///${1}db?host=$dir&user=postgres"; }
lib_of() { echo "$(dirname "$(bin_of "$1")")/libpgjobq.so.0"; }
for side in $sides; do
    "$(bin_of "$side")" --db "$(url_of "$side")" migrate >/dev/null
done

pids=""
start_workers() { # side count
    pids=""
    i=0
    while [ "$i" -lt "$2" ]; do
        PYTHONPATH="$top/python:$here" PGJOBQ_BENCH_LAGS="$dir/lags" "$python" -m pgjobq worker py_notify_app:app \
            --queue bench:4 --db "$(url_of "$1")" --pgjobq "$(bin_of "$1")" >"$dir/worker-$i.log" 2>&1 &
        pids="$pids $!"
        i=$((i + 1))
    done
    # Until every one listens (its claim connection is past its set-up).
    t=0
    while [ "$(sql "SELECT count(*) FROM pg_stat_activity WHERE datname = '${1}db'
                      AND application_name = 'pgjobq-claim' AND query <> ''
                      AND query NOT LIKE '%schema_version%'")" -lt "$2" ]; do
        t=$((t + 1))
        [ "$t" -le 600 ] || { echo "bench: $2 workers did not all start listening in 60 s" >&2; exit 70; }
        sleep 0.1
    done
}
stop_workers() {
    [ -n "$pids" ] && kill -TERM $pids 2>/dev/null || true
    for p in $pids; do wait "$p" 2>/dev/null || true; done
    pids=""
}
trap 'stop_workers; cleanup' EXIT INT TERM
reset() { # side: the last run's jobs out of the way (none runs: no worker, or all done)
    rm -f "$dir"/lags.*
    "$bindir/psql" -X -q -d "${1}db" -c "DELETE FROM pgjobq.history WHERE queue = 'bench'" \
        -c "DELETE FROM pgjobq.jobs WHERE queue = 'bench' AND state = 'queued'" >/dev/null
}
produce() { # side name round via rate
    reset "$1"
    out=$(PYTHONPATH="$top/python" "$python" "$here/producers.py" "$(url_of "$1")" "$4" "$5" "$seconds" 8 "$(lib_of "$1")" \
          "$dir/lags")
    echo "{\"name\":\"$2\",\"round\":$3,${out#\{}" >> "$runs"
    echo "  $2 round $3: $out"
}

echo "# pgjobq bench notify: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, $reps rounds of $seconds s, medians; sides: $sides"
r=1
while [ "$r" -le "$reps" ]; do
    for side in $sides; do
        for w in 0 "$workers"; do
            reset "$side"
            [ "$w" -gt 0 ] && start_workers "$side" "$w"
            for via in sql python c; do
                produce "$side" "$side-w$w-$via" "$r" "$via" 500
            done
            [ "$w" -gt 0 ] && produce "$side" "$side-w$w-python-100" "$r" python 100
            stop_workers
        done
    done
    r=$((r + 1))
done

echo
echo "| figure | $(echo "$sides" | sed 's/ / | /') | target |"
echo "|---|$(for s in $sides; do printf -- '---|'; done)---|"
for via in sql python c; do
    line="| $via producers, 8 x 500/s: rate with $workers workers listening / with none (jobs/s; notifications per job) |"
    for side in $sides; do
        line="$line $(ratio "$(m "$side-w$workers-$via" jobs_per_s)" "$(m "$side-w0-$via" jobs_per_s)") ($(m "$side-w$workers-$via" jobs_per_s) / $(m "$side-w0-$via" jobs_per_s); $(m "$side-w$workers-$via" notifications_per_job)) |"
    done
    v=$(ratio "$(m "new-w$workers-$via" jobs_per_s)" "$(m "new-w0-$via" jobs_per_s)")
    echo "$line >= 0.9: $(verdict "$v" ">=" 0.9) |"
done
line="| $workers workers, Python producers at 100/s: pickup p50 / p99 to the claim's start, ms |"
for side in $sides; do
    line="$line $(m "$side-w$workers-python-100" pickup_p50_ms) / $(m "$side-w$workers-python-100" pickup_p99_ms) |"
done
echo "$line p99 <= 50: $(verdict "$(m "new-w$workers-python-100" pickup_p99_ms)" "<=" 50) |"
line="| the same to the handler's start (the producer's call to the task's first line), ms |"
for side in $sides; do
    line="$line $(m "$side-w$workers-python-100" handler_p50_ms) / $(m "$side-w$workers-python-100" handler_p99_ms) |"
done
echo "$line p99 <= 50: $(verdict "$(m "new-w$workers-python-100" handler_p99_ms)" "<=" 50) |"
line="| the same at 500/s (sql producers): pickup p50 / p99, ms |"
for side in $sides; do
    line="$line $(m "$side-w$workers-sql" pickup_p50_ms) / $(m "$side-w$workers-sql" pickup_p99_ms) |"
done
echo "$line |"
