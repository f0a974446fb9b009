#!/bin/sh
# bench/run.sh - the benchmark suite behind `make bench` (QUICK=1 for a short version).
#
# Starts its own throwaway PostgreSQL cluster with durable settings (fsync and synchronous_commit on),
# runs every scenario REPS times through `pgjobq bench`, and writes medians to
# bench/results/latest.json, a table to stdout, and PNG plots when gnuplot is available.
# Every figure is also a ratio against another measured in the same run, because absolute times on a
# shared machine drift.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
pgjobq=${PGJOBQ:-$top/build/pgjobq}
quick=${QUICK:-0}
reps=${REPS:-3}
if [ "$quick" = 1 ]; then
    reps=${REPS:-1}
    jobs=20000; noise=100000; mixed_s=10; latency_n=300; exec_jobs=1000
else
    jobs=100000; noise=1000000; mixed_s=60; latency_n=1000; exec_jobs=5000
fi
results="$here/results"
mkdir -p "$results"
runs="$results/runs.jsonl"
: > "$runs"

# --- a throwaway cluster ------------------------------------------------------------------------
bindir=${PGJOBQ_PG_BINDIR:-}
if [ -z "$bindir" ]; then
    for d in $(pg_config --bindir 2>/dev/null) $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$d/initdb" ]; then bindir=$d; break; fi
    done
fi
[ -n "$bindir" ] || { echo "bench: PostgreSQL server programs not found (apt-get install postgresql)" >&2; exit 69; }
dir=$(mktemp -d /tmp/pgjobq-bench-XXXXXX)
as_owner() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[ "$(id -u)" = 0 ] && chown postgres "$dir"
cleanup() {
    as_owner "$bindir/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap cleanup EXIT INT TERM
as_owner "$bindir/initdb" -D "$dir/data" -A trust -U postgres -E UTF8 --locale=C >/dev/null
cat >> "$dir/data/postgresql.conf" <<EOF
listen_addresses = ''
unix_socket_directories = '$dir'
max_connections = 200
shared_buffers = 512MB
max_wal_size = 8GB
checkpoint_timeout = 30min
fsync = on
synchronous_commit = on
full_page_writes = on
EOF
as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
db="host=$dir user=postgres dbname=postgres"
"$pgjobq" --db "$db" migrate >/dev/null

settings=$("$bindir/psql" -X -At -h "$dir" -U postgres -c "SELECT string_agg(name || '=' || setting, ' ' ORDER BY name) FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes', 'wal_sync_method', 'shared_buffers', 'max_wal_size', 'server_version')")
cpus=$(nproc)
echo "# pgjobq bench: $(date -u +%Y-%m-%dT%H:%M:%SZ), $cpus CPUs, $reps repetitions, medians"
echo "# PostgreSQL: $settings"

run() { # run NAME ARGS... : REPS runs of one scenario, each JSON line tagged with NAME
    name=$1; shift
    i=0
    while [ $i -lt "$reps" ]; do
        line=$("$pgjobq" --db "$db" bench "$@" --json)
        echo "{\"name\":\"$name\",${line#\{}" >> "$runs"
        i=$((i + 1))
    done
}

median() { # median NAME FIELD
    grep "\"name\":\"$1\"," "$runs" | sed -n "s/.*\"$2\":\([-0-9.]*\).*/\1/p" | sort -g |
        awk '{ v[NR] = $1 } END { if (NR == 0) print "null"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 == 0 || a == "null" || b == "null") print "null"; else printf "%.2f", a / b }'; }

# --- B1 bulk enqueue ----------------------------------------------------------------------------
run b1_enqueue enqueue --jobs "$jobs" --batch 10000
seq_file="$dir/jobs.jsonl"
awk -v n="$jobs" 'BEGIN { for (i = 0; i < n; i++) printf "{\"to\": \"someone@example.org\", \"n\": %d}\n", i }' > "$seq_file"
i=0
while [ $i -lt "$reps" ]; do
    "$bindir/psql" -X -q -h "$dir" -U postgres -c "DELETE FROM pgjobq.jobs WHERE queue = 'bench'" -c "CHECKPOINT"
    t0=$(date +%s.%N)
    "$pgjobq" --db "$db" enqueue --queue bench --file "$seq_file" --batch 10000 --quiet
    t1=$(date +%s.%N)
    echo "{\"name\":\"b1_file\",\"jobs\":$jobs,\"jobs_per_s\":$(awk -v n="$jobs" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", n / (b - a) }')}" >> "$runs"
    i=$((i + 1))
done

# --- B2 drain, B3 ceiling at the batch size and client count B2 used, B6 resources ----------------
for c in 1 8 32 128; do
    n=$jobs
    [ $c -eq 1 ] && n=$((jobs / 10))
    [ $c -eq 8 ] && n=$((jobs / 4))
    run "b2_c$c" drain --jobs "$n" --concurrency "$c"
    batch=$(median "b2_c$c" avg_claim_batch | awk '{ printf "%d", $1 + 0.5 }')
    [ "$batch" -ge 1 ] || batch=1
    run "b3_c$c" ceiling --jobs "$n" --batch "$batch" --clients 1
done
run b2_p4x32 drain --jobs "$jobs" --concurrency 32 --processes 4
batch=$(median b2_p4x32 avg_claim_batch | awk '{ printf "%d", $1 + 0.5 }')
run b3_p4x32 ceiling --jobs "$jobs" --batch "$batch" --clients 4
run b3_bare_c128 ceiling --jobs "$jobs" --batch "$(median b2_c128 avg_claim_batch | awk '{ printf "%d", $1 + 0.5 }')" --clients 1 --bare

best=b2_c128
for n in b2_c32 b2_p4x32; do
    if awk -v a="$(median $n jobs_per_s)" -v b="$(median $best jobs_per_s)" 'BEGIN { exit !(a > b) }'; then best=$n; fi
done
best_rate=$(median $best jobs_per_s)

# --- B4 pickup latency ---------------------------------------------------------------------------
run b4_latency latency --jobs "$latency_n" --rate 200 --concurrency 8

# --- B5 scale: the best drain on a table with history and another queue's backlog ----------------
best_args="--jobs $jobs --concurrency 128"
[ $best = b2_c32 ] && best_args="--jobs $jobs --concurrency 32"
[ $best = b2_p4x32 ] && best_args="--jobs $jobs --concurrency 32 --processes 4"
# shellcheck disable=SC2086
run b5_empty drain $best_args
# shellcheck disable=SC2086
run b5_noise drain $best_args --noise "$noise"
"$bindir/psql" -X -q -h "$dir" -U postgres -c "DELETE FROM pgjobq.jobs" -c "VACUUM pgjobq.jobs"

# --- B7 mixed: producers at half the best drain rate ----------------------------------------------
half=$(awk -v r="$best_rate" 'BEGIN { printf "%d", r / 2 }')
run b7_mixed mixed --seconds "$mixed_s" --rate "$half" --concurrency 128

# --- B8 exec worker ------------------------------------------------------------------------------
run b8_exec drain-exec --jobs "$exec_jobs" --concurrency 32
run b8_inproc drain --jobs "$exec_jobs" --concurrency 32

# --- results -------------------------------------------------------------------------------------
m() { median "$1" "$2"; }
{
    echo "{"
    echo "  \"date\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\", \"cpus\": $cpus, \"repetitions\": $reps, \"quick\": $quick,"
    echo "  \"postgresql\": \"$settings\","
    echo "  \"b1_enqueue_jobs_per_s\": $(m b1_enqueue jobs_per_s), \"b1_file_jobs_per_s\": $(m b1_file jobs_per_s),"
    for c in 1 8 32 128; do
        echo "  \"b2_c${c}_jobs_per_s\": $(m b2_c$c jobs_per_s), \"b2_c${c}_avg_claim_batch\": $(m b2_c$c avg_claim_batch), \"b3_c${c}_jobs_per_s\": $(m b3_c$c jobs_per_s), \"b2_b3_c${c}\": $(ratio "$(m b2_c$c jobs_per_s)" "$(m b3_c$c jobs_per_s)"),"
    done
    echo "  \"b2_p4x32_jobs_per_s\": $(m b2_p4x32 jobs_per_s), \"b3_p4x32_jobs_per_s\": $(m b3_p4x32 jobs_per_s), \"b2_b3_p4x32\": $(ratio "$(m b2_p4x32 jobs_per_s)" "$(m b3_p4x32 jobs_per_s)"),"
    echo "  \"b3_bare_c128_jobs_per_s\": $(m b3_bare_c128 jobs_per_s), \"b2_best\": \"$best\", \"b2_best_jobs_per_s\": $best_rate,"
    echo "  \"b4_p50_ms\": $(m b4_latency p50_ms), \"b4_p95_ms\": $(m b4_latency p95_ms), \"b4_p99_ms\": $(m b4_latency p99_ms), \"b4_max_ms\": $(m b4_latency max_ms),"
    echo "  \"b5_empty_jobs_per_s\": $(m b5_empty jobs_per_s), \"b5_noise_jobs_per_s\": $(m b5_noise jobs_per_s), \"b5_ratio\": $(ratio "$(m b5_noise jobs_per_s)" "$(m b5_empty jobs_per_s)"), \"b5_noise_rows\": $((noise * 2)),"
    echo "  \"b6_c1_connections\": $(m b2_c1 connections_max), \"b6_c128_connections\": $(m b2_c128 connections_max), \"b6_c1_rss_kb\": $(m b2_c1 rss_kb_max), \"b6_c128_rss_kb\": $(m b2_c128 rss_kb_max),"
    echo "  \"b7_rate\": $half, \"b7_jobs_per_s\": $(m b7_mixed jobs_per_s), \"b7_depth_avg\": $(m b7_mixed depth_avg), \"b7_depth_max\": $(m b7_mixed depth_max), \"b7_p99_ms\": $(m b7_mixed p99_ms),"
    echo "  \"b8_exec_jobs_per_s\": $(m b8_exec jobs_per_s), \"b8_inproc_jobs_per_s\": $(m b8_inproc jobs_per_s), \"b8_ratio\": $(ratio "$(m b8_exec jobs_per_s)" "$(m b8_inproc jobs_per_s)")"
    echo "}"
} > "$results/latest.json"

printf '\n%-44s %14s %s\n' "scenario" "median" "ratio (same run)"
printf '%-44s %14s %s\n' "B1 enqueue, batch API (batches of 10,000)" "$(m b1_enqueue jobs_per_s) /s" ""
printf '%-44s %14s %s\n' "B1 enqueue, pgjobq enqueue --file" "$(m b1_file jobs_per_s) /s" "$(ratio "$(m b1_file jobs_per_s)" "$(m b1_enqueue jobs_per_s)") of the API"
for c in 1 8 32 128; do
    printf '%-44s %14s %s\n' "B2 drain, 1 process x $c (batch $(m b2_c$c avg_claim_batch))" "$(m b2_c$c jobs_per_s) /s" "B2/B3 $(ratio "$(m b2_c$c jobs_per_s)" "$(m b3_c$c jobs_per_s)") (B3 $(m b3_c$c jobs_per_s))"
done
printf '%-44s %14s %s\n' "B2 drain, 4 processes x 32" "$(m b2_p4x32 jobs_per_s) /s" "B2/B3 $(ratio "$(m b2_p4x32 jobs_per_s)" "$(m b3_p4x32 jobs_per_s)") (B3 $(m b3_p4x32 jobs_per_s))"
printf '%-44s %14s %s\n' "B3 bare statements (no function), batch as c128" "$(m b3_bare_c128 jobs_per_s) /s" "functions cost $(ratio "$(m b3_c128 jobs_per_s)" "$(m b3_bare_c128 jobs_per_s)") of bare"
printf '%-44s %14s %s\n' "B4 pickup latency p50 / p95 / p99 / max" "$(m b4_latency p50_ms) ms" "$(m b4_latency p95_ms) / $(m b4_latency p99_ms) / $(m b4_latency max_ms) ms"
printf '%-44s %14s %s\n' "B5 best drain with $((noise * 2)) other rows" "$(m b5_noise jobs_per_s) /s" "$(ratio "$(m b5_noise jobs_per_s)" "$(m b5_empty jobs_per_s)") of empty ($(m b5_empty jobs_per_s))"
printf '%-44s %14s %s\n' "B6 connections at concurrency 1 / 128" "$(m b2_c1 connections_max) / $(m b2_c128 connections_max)" "peak RSS $(m b2_c1 rss_kb_max) / $(m b2_c128 rss_kb_max) KiB"
printf '%-44s %14s %s\n' "B7 mixed at $half/s enqueued" "$(m b7_mixed jobs_per_s) /s" "depth avg $(m b7_mixed depth_avg) max $(m b7_mixed depth_max), p99 $(m b7_mixed p99_ms) ms"
printf '%-44s %14s %s\n' "B8 exec worker (/bin/true), 32 threads" "$(m b8_exec jobs_per_s) /s" "$(ratio "$(m b8_exec jobs_per_s)" "$(m b8_inproc jobs_per_s)") of in-process"
echo
echo "results: $results/latest.json (every run: $runs)"

# --- plots ---------------------------------------------------------------------------------------
if command -v gnuplot >/dev/null 2>&1; then
    printf '1 %s %s\n8 %s %s\n32 %s %s\n128 %s %s\n' \
        "$(m b2_c1 jobs_per_s)" "$(m b3_c1 jobs_per_s)" "$(m b2_c8 jobs_per_s)" "$(m b3_c8 jobs_per_s)" \
        "$(m b2_c32 jobs_per_s)" "$(m b3_c32 jobs_per_s)" "$(m b2_c128 jobs_per_s)" "$(m b3_c128 jobs_per_s)" > "$dir/b2.dat"
    gnuplot <<EOF
set terminal png size 800,480
set output "$results/drain.png"
set title "B2 drain: jobs/s by worker concurrency (one process), against B3 at the same batch size"
set logscale x 2
set xlabel "threads"
set ylabel "jobs/s"
set key left top
plot "$dir/b2.dat" using 1:2 with linespoints title "pgjobq worker (B2)", "$dir/b2.dat" using 1:3 with linespoints title "same statements, no library (B3)"
EOF
    "$bindir/psql" -X -At -h "$dir" -U postgres -c "SELECT 1" >/dev/null
    grep '"name":"b4_latency"' "$runs" | head -1 >/dev/null
    printf 'p50 %s\np95 %s\np99 %s\nmax %s\n' "$(m b4_latency p50_ms)" "$(m b4_latency p95_ms)" "$(m b4_latency p99_ms)" "$(m b4_latency max_ms)" > "$dir/b4.dat"
    gnuplot <<EOF
set terminal png size 800,480
set output "$results/latency.png"
set title "B4 pickup latency, 1 job at a time at 200/s (database clock)"
set style data histograms
set style fill solid 0.6
set ylabel "ms"
set yrange [0:*]
plot "$dir/b4.dat" using 2:xtic(1) title "created_at to claim"
EOF
    echo "plots: $results/drain.png $results/latency.png"
else
    echo "plots: skipped (install gnuplot-nox to draw them)"
fi
