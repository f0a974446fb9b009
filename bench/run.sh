#!/bin/sh
# bench/run.sh - the benchmark suite behind `make bench` (QUICK=1 for a short version, REPS=n).
#
# Starts its own throwaway PostgreSQL cluster with durable settings (fsync and synchronous_commit on),
# and runs, REPS times over (interleaved, so that drift on a shared machine hits every scenario
# alike):
#
#   ceilings  a minimal queue table (bench/ceiling/schema.sql) driven by pgbench: claim 100 + done at
#             1, 2, 8 and 16 clients; 100-row INSERTs; COPY in batches of 10,000 rows.  Nothing of
#             pgjobq is in them.
#   T2        pgjobq's own claim and completion statements, through pgbench, at 8 clients.
#   B1..B8    pgjobq itself, through `pgjobq bench` (cli/cmd_bench.c).
#   S1..S5    steady state (issue 21): `pgjobq bench steady` for STEADY_SECONDS (600; QUICK: 60) at
#             2 worker processes x 64 threads (issue 21's): S1 a producer at 80% of the best drain (at most what two
#             producer connections offer beside the workers, STEADY_MAX_RATE), S2 at STEADY_RATE
#             (15,000) while another session holds a snapshot open, S3 the same while it also holds
#             ACCESS SHARE on every pgjobq table (as pg_dump does) and a real pg_dump runs, then is
#             restored; S4 B7 at every step up to 90% of the best drain (and `make soak`); S5 the seed's
#             40 x 8 against the best drain, and S1 with 40 x 8.
#
# It writes the medians to bench/results/latest.json, every run to bench/results/runs.jsonl, a table
# with every target met or missed to stdout, and PNG plots when gnuplot is available.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
pgjobq=${PGJOBQ:-$top/build/pgjobq}
quick=${QUICK:-0}
if [ "$quick" = 1 ]; then
    reps=${REPS:-1}
    jobs=20000; noise=100000; mixed_s=10; latency_n=300; exec_jobs=1000; py_exec_jobs=200
    steady_s=${STEADY_SECONDS:-60}
else
    reps=${REPS:-3}
    jobs=100000; noise=1000000; mixed_s=30; latency_n=1000; exec_jobs=5000; py_exec_jobs=1000
    steady_s=${STEADY_SECONDS:-600}
fi
steady_rate=${STEADY_RATE:-15000}
steady_max_rate=${STEADY_MAX_RATE:-20000}
results="$here/results"
mkdir -p "$results"
runs="$results/runs.jsonl"
: > "$runs"

# --- a throwaway cluster ------------------------------------------------------------------------
. "$here/cluster.sh"
"$pgjobq" --db "$db" migrate >/dev/null
"$bindir/psql" -X -q -f "$here/ceiling/schema.sql"
# The claim's server time, for the steady-state targets.
"$bindir/psql" -X -q -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"

settings=$("$bindir/psql" -X -At -c "SELECT string_agg(name || '=' || setting, ' ' ORDER BY name) FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes', 'wal_sync_method', 'shared_buffers', 'max_wal_size', 'server_version')")
cpus=$(nproc)
echo "# pgjobq bench: $(date -u +%Y-%m-%dT%H:%M:%SZ), $cpus CPUs, $reps repetitions, medians"
echo "# PostgreSQL: $settings"

sql() { "$bindir/psql" -X -q -At -c "$1"; }
record() { echo "{\"name\":\"$1\",${2#\{}" >> "$runs"; }
bench() { # bench NAME ARGS... : one run of a pgjobq bench scenario
    name=$1; shift
    record "$name" "$("$pgjobq" --db "$db" bench "$@" --json)"
}

# pgbench_jobs NAME SCRIPT CLIENTS COUNT_SQL [PGBENCH ARGS]: runs SCRIPT for $jobs jobs of 100 per
# transaction and records jobs/s, counting the jobs that were actually done (not transactions x 100).
pgbench_jobs() {
    name=$1 script=$2 clients=$3 count_sql=$4; shift 4
    t=$((jobs / 100 / clients))
    out=$("$bindir/pgbench" -n -M prepared -c "$clients" -j "$clients" -t "$t" "$@" -f "$here/ceiling/$script" 2>&1)
    tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    done_=$(sql "$count_sql")
    [ -n "$tps" ] || { echo "bench: pgbench $script failed: $out" >&2; exit 70; }
    record "$name" "{\"jobs_per_s\":$(awk -v d="$done_" -v t="$tps" -v n=$((t * clients)) 'BEGIN { printf "%.1f", d / (n / t) }'),\"jobs\":$done_,\"clients\":$clients}"
}

load_ceiling() { # the minimal table, with $1 available jobs
    sql "TRUNCATE ceiling.jobs" >/dev/null
    sql "INSERT INTO ceiling.jobs (queue, payload) SELECT 'q', '{\"noop\": true}' FROM generate_series(1, $1)" >/dev/null
    sql "VACUUM ANALYZE ceiling.jobs" >/dev/null
    sql "CHECKPOINT" >/dev/null
}
load_pgjobq() { # pgjobq's table, with $1 queued jobs in queue 'bench' (through the API: reset_queue, enqueue_many)
    sql "SELECT pgjobq.reset_queue('bench')" >/dev/null
    sql "SELECT count(*) FROM pgjobq.enqueue_many(array_fill('bench'::text, ARRAY[$1]), array_fill('default'::text, ARRAY[$1]),
         array_fill('{\"noop\": true}'::jsonb, ARRAY[$1]))" >/dev/null
    sql "VACUUM ANALYZE" >/dev/null
    sql "CHECKPOINT" >/dev/null
}

copy_file="$dir/copy.txt"
awk 'BEGIN { for (i = 0; i < 10000; i++) printf "q\t{\"to\": \"someone@example.org\", \"n\": 12345}\n" }' > "$copy_file"
copy_script="$dir/copy.psql"
: > "$copy_script"
# (printf, not echo: dash's echo reads "\c" as "stop output")
i=0; while [ $i -lt $((jobs / 10000)) ]; do printf '%s\n' "\\copy ceiling.jobs (queue, payload) FROM '$copy_file'" >> "$copy_script"; i=$((i + 1)); done
file_jobs="$dir/jobs.jsonl"
awk -v n="$jobs" 'BEGIN { for (i = 0; i < n; i++) printf "{\"to\": \"someone@example.org\", \"n\": %d}\n", i }' > "$file_jobs"

slack=$((jobs * 11 / 10)) # every claim of 100 finds 100
history_bench="SELECT coalesce(sum(jobs), 0) FROM pgjobq.monitor_history_counts() WHERE queue = 'bench'"
rep=1
while [ $rep -le "$reps" ]; do
    echo "# repetition $rep of $reps" >&2
    # --- ceilings and T2 ---------------------------------------------------------------------------
    for c in 1 2 8 16; do
        load_ceiling $slack
        pgbench_jobs "c_claim_$c" claim_done.sql $c "SELECT count(*) FROM ceiling.jobs WHERE state = 'done'" -D n=100
    done
    load_pgjobq $slack
    pgbench_jobs t2_head pgjobq_claim_done.sql 8 "$history_bench"
    load_pgjobq $slack
    pgbench_jobs t2_keyed pgjobq_claim_done_keyed.sql 8 "$history_bench" \
        -D p=-32768 -D r=-infinity -D i=0
    sql "TRUNCATE ceiling.jobs" >/dev/null; sql "CHECKPOINT" >/dev/null
    pgbench_jobs c_insert insert100.sql 1 "SELECT count(*) FROM ceiling.jobs"
    sql "TRUNCATE ceiling.jobs" >/dev/null; sql "CHECKPOINT" >/dev/null
    t0=$(date +%s.%N); "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -f "$copy_script"; t1=$(date +%s.%N)
    copied=$(sql "SELECT count(*) FROM ceiling.jobs")
    [ "$copied" = "$jobs" ] || { echo "bench: the COPY ceiling wrote $copied rows, not $jobs" >&2; exit 70; }
    record c_copy "{\"jobs_per_s\":$(awk -v n="$copied" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", n / (b - a) }')}"
    sql "TRUNCATE ceiling.jobs" >/dev/null

    # --- B1 bulk enqueue -----------------------------------------------------------------------------
    bench b1_api enqueue --jobs "$jobs" --batch 10000
    sql "SELECT pgjobq.reset_queue('bench')" >/dev/null; sql "CHECKPOINT" >/dev/null
    t0=$(date +%s.%N); "$pgjobq" --db "$db" enqueue --queue bench --file "$file_jobs" --batch 10000 --quiet; t1=$(date +%s.%N)
    record b1_file "{\"jobs_per_s\":$(awk -v n="$jobs" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", n / (b - a) }')}"

    # --- B2 drain: one process, several, and the seed thread's 40 x 8 ---------------------------------
    for pc in 1x1 1x8 1x32 1x128 2x64 4x32 8x16 40x8; do
        p=${pc%x*}; c=${pc#*x}; n=$jobs
        [ "$pc" = 1x1 ] && n=$((jobs / 20))
        [ "$pc" = 1x8 ] && n=$((jobs / 4))
        bench "b2_$pc" drain --jobs "$n" --processes "$p" --concurrency "$c"
    done
    rep=$((rep + 1))
done

m() { # m NAME FIELD: the median of a field over the runs of a scenario
    grep "\"name\":\"$1\"," "$runs" | sed -n "s/.*\"$2\":\([-0-9.]*\).*/\1/p" | sort -g |
        awk '{ v[NR] = $1 } END { if (NR == 0) print "null"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 == 0 || a == "null" || b == "null") print "null"; else printf "%.2f", a / b }'; }
ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a != "null" && a + 0 >= b + 0) }'; }
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a != "null" && a + 0 <= b + 0) }'; }

best_multi=b2_2x64
for n in b2_4x32 b2_8x16; do
    if awk -v a="$(m $n jobs_per_s)" -v b="$(m $best_multi jobs_per_s)" 'BEGIN { exit !(a > b) }'; then best_multi=$n; fi
done
best_p=${best_multi#b2_}; best_c=${best_p#*x}; best_p=${best_p%x*}
best_rate=$(m $best_multi jobs_per_s)

# --- once, after the repetitions: latency, scale, mixed load up to saturation, exec ---------------
echo "# latency, scale, saturation, exec" >&2
i=0; while [ $i -lt "$reps" ]; do bench b4_latency latency --jobs "$latency_n" --rate 200 --concurrency 8; i=$((i + 1)); done
bench b5_empty drain --jobs "$jobs" --processes "$best_p" --concurrency "$best_c"
bench b5_noise drain --jobs "$jobs" --processes "$best_p" --concurrency "$best_c" --noise "$noise"
# B5's 2,000,000 rows go with TRUNCATE: deleted, they would leave autovacuum 2,000,000 dead rows to
# clean up during B7 (the suspect for a B7 step that fell behind at 0.3 of what the next steps kept up with).
# (The one place the script names the tables: pgjobq.reset_queue deletes, and no function may VACUUM.)
sql "TRUNCATE pgjobq.jobs, pgjobq.history" >/dev/null; sql "VACUUM ANALYZE pgjobq.jobs" >/dev/null
# B7: producers at a growing share of the best drain rate, with the best worker configuration; the
# saturation point is the highest rate the workers kept up with (the producer shares the two cores:
# the rate it manages to offer varies from step to step).
b7_sat=0; b7_kept_all=1
for pct in 25 50 75 90 100 125; do
    rate=$(awk -v r="$best_rate" -v p="$pct" 'BEGIN { printf "%d", r * p / 100 }')
    bench "b7_$pct" mixed --seconds "$mixed_s" --rate "$rate" --processes "$best_p" --concurrency "$best_c"
    if grep "\"name\":\"b7_$pct\"," "$runs" | grep -q '"kept_up":true'; then
        b7_sat=$(awk -v a="$b7_sat" -v b="$(m "b7_$pct" offered_per_s)" 'BEGIN { print (b + 0 > a + 0) ? b : a }')
    else
        b7_kept_all=0
    fi
done
# S4's part of B7: every step up to 90% of the best drain kept up.
s4_b7=met
for pct in 25 50 75 90; do
    grep "\"name\":\"b7_$pct\"," "$runs" | grep -q '"kept_up":true' || s4_b7=missed
done
bench b8_exec drain-exec --jobs "$exec_jobs" --concurrency 32
bench b8_inproc drain --jobs "$exec_jobs" --concurrency 32
# B9: a Python handler as a coprocess, all at 32 slots, medians of the repetitions: a no-op
# (bench/coproc_noop.py) against the in-process no-op, and examples/coproc.py (it echoes the payload
# back as a result, which the database stores) against the same handler run per job with --exec.
python=$(command -v /usr/bin/python3 python3 | head -n 1)
# The Python package (issue 25): its coprocess side running a no-op @app.task (bench/py_tasks.py), and
# defer of 10,000 jobs in one call (bench/py_defer.py) against `pgjobq enqueue --file` of the same 10,000.
head -n 10000 "$file_jobs" > "$dir/jobs10k.jsonl"
i=0; while [ $i -lt "$reps" ]; do
    bench b9_noop drain-coproc --jobs "$jobs" --concurrency 32 --handler "$python $here/coproc_noop.py"
    bench b9_coproc drain-coproc --jobs "$jobs" --concurrency 32 --handler "$python $top/examples/coproc.py"
    bench b9_inproc drain --jobs "$jobs" --concurrency 32
    bench b9_pytask drain-coproc --jobs "$jobs" --concurrency 32 \
        --handler "env PYTHONPATH=$top/python:$here $python -m pgjobq.coproc py_tasks:app"
    sql "SELECT pgjobq.reset_queue('bench')" >/dev/null
    t0=$(date +%s.%N); "$pgjobq" --db "$db" enqueue --queue bench --file "$dir/jobs10k.jsonl" --batch 10000 --quiet
    t1=$(date +%s.%N)
    record b9_file10k "{\"jobs_per_s\":$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", 10000 / (b - a) }')}"
    sql "SELECT pgjobq.reset_queue('bench')" >/dev/null
    record b9_defer "$(PYTHONPATH="$top/python" "$python" "$here/py_defer.py" "$db" 10000)"
    i=$((i + 1))
done
bench b9_exec drain-exec --jobs "$py_exec_jobs" --concurrency 32 --handler "$python $here/handler_exec.py"

# --- steady state: S1, S2, S3, S5 (issue 21) -------------------------------------------------------
echo "# steady state: $steady_s s a run" >&2
s1_rate=$(awk -v r="$best_rate" -v m="$steady_max_rate" 'BEGIN { r = r * 0.8; printf "%d", r < m ? r : m }')
sql "TRUNCATE pgjobq.jobs, pgjobq.history" >/dev/null; sql "VACUUM ANALYZE pgjobq.jobs" >/dev/null
bench s1 steady --rate "$s1_rate" --seconds "$steady_s" --processes 2 --concurrency 64
sql "TRUNCATE pgjobq.jobs, pgjobq.history" >/dev/null; sql "VACUUM ANALYZE pgjobq.jobs" >/dev/null
bench s2 steady --rate "$steady_rate" --seconds "$steady_s" --processes 2 --concurrency 64 --pin snapshot
sql "TRUNCATE pgjobq.jobs, pgjobq.history" >/dev/null; sql "VACUUM ANALYZE pgjobq.jobs" >/dev/null
# S3: the pinned session holds what pg_dump holds, and a real pg_dump runs a third of the way in; the
# dump is restored into a new database afterwards, which must migrate as up to date and run a job.
"$pgjobq" --db "$db" bench steady --rate "$steady_rate" --seconds "$steady_s" --processes 2 \
    --concurrency 64 --pin dump --json > "$dir/s3.json" &
s3_pid=$!
sleep $((steady_s / 3))
dump_t0=$(date +%s.%N)
dump_ok=0
as_owner "$bindir/pg_dump" -h "$dir" -U postgres -Fc -f "$dir/s3.dump" postgres && dump_ok=1
dump_t1=$(date +%s.%N)
wait "$s3_pid"
record s3 "$(cat "$dir/s3.json")"
restore_ok=0
if [ "$dump_ok" = 1 ]; then
    sql "DROP DATABASE IF EXISTS restored" >/dev/null; sql "CREATE DATABASE restored" >/dev/null
    if as_owner "$bindir/pg_restore" -h "$dir" -U postgres -d restored "$dir/s3.dump" >"$dir/restore.log" 2>&1; then
        rdb="host=$dir user=postgres dbname=restored"
        "$pgjobq" --db "$rdb" migrate >/dev/null 2>&1 &&
            "$pgjobq" --db "$rdb" enqueue --queue restored '{}' >/dev/null 2>&1 &&
            [ "$("$bindir/psql" -X -At -d restored -c "SELECT count(*) FROM pgjobq.claim_batch('restored', 1, '1 min', 'check')")" = 1 ] &&
            restore_ok=1
    fi
fi
dump_s=$(awk -v a="$dump_t0" -v b="$dump_t1" 'BEGIN { printf "%.1f", b - a }')
sql "TRUNCATE pgjobq.jobs, pgjobq.history" >/dev/null; sql "VACUUM ANALYZE pgjobq.jobs" >/dev/null
bench s5_steady steady --rate "$s1_rate" --seconds "$steady_s" --processes 40 --concurrency 8

# --- results -------------------------------------------------------------------------------------
c8=$(m c_claim_8 jobs_per_s)
copy_ceiling=$(m c_copy jobs_per_s)
verdict() { if [ "$1" = met ]; then echo met; else echo MISSED; fi; }
t1=$(ratio "$(m b2_1x32 jobs_per_s)" "$c8")
t2=$(ratio "$(m t2_head jobs_per_s)" "$c8")
t3a=$(ratio "$best_rate" "$c8")
t3b=$(ratio "$(m b2_40x8 jobs_per_s)" "$best_rate")
t4=$(ratio "$(m b1_api jobs_per_s)" "$copy_ceiling")
ge "$t1" 0.6 && v1=met || v1=missed
ge "$t2" 0.8 && v2=met || v2=missed
ge "$t3a" 0.8 && ge "$t3b" 0.7 && v3=met || v3=missed
ge "$(m b1_api jobs_per_s)" 150000 && ge "$t4" 0.7 && v4=met || v4=missed
le "$(m b4_latency p50_ms)" 2 && le "$(m b4_latency p99_ms)" 8 && vl=met || vl=missed
le "$(m b2_1x128 connections_max)" 3 && le "$(m b2_1x128 rss_kb_max)" 16384 && vr=met || vr=missed
ge "$(ratio "$(m b9_noop jobs_per_s)" "$(m b9_inproc jobs_per_s)")" 0.7 && v9a=met || v9a=missed
ge "$(ratio "$(m b9_pytask jobs_per_s)" "$(m b9_inproc jobs_per_s)")" 0.6 && v9c=met || v9c=missed
ge "$(ratio "$(m b9_defer jobs_per_s)" "$(m b9_file10k jobs_per_s)")" 0.5 && v9d=met || v9d=missed
ge "$(ratio "$(m b9_coproc jobs_per_s)" "$(m b9_exec jobs_per_s)")" 5 && v9b=met || v9b=missed
metof() { grep "\"name\":\"$1\"," "$runs" | grep -q '"met":true' && echo met || echo missed; }
vs1=$(metof s1); vs2=$(metof s2); vs3=$(metof s3)
[ "$dump_ok" = 1 ] && [ "$restore_ok" = 1 ] || vs3=missed
[ "$s4_b7" = met ] && vs4=met || vs4=missed
ge "$t3b" 0.7 && le "$(m s5_steady pickup_p99_ms_max)" 20 && vs5=met || vs5=missed

{
    echo "{"
    echo "  \"date\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\", \"cpus\": $cpus, \"repetitions\": $reps, \"quick\": $quick, \"jobs\": $jobs,"
    echo "  \"postgresql\": \"$settings\","
    for n in c_claim_1 c_claim_2 c_claim_8 c_claim_16 t2_head t2_keyed c_insert c_copy b1_api b1_file b2_1x1 b2_1x8 b2_1x32 b2_1x128 b2_2x64 b2_4x32 b2_8x16 b2_40x8 b5_empty b5_noise b8_exec b8_inproc b9_noop b9_coproc b9_inproc b9_exec b9_pytask b9_file10k b9_defer; do
        echo "  \"${n}_jobs_per_s\": $(m $n jobs_per_s),"
    done
    for pc in 1x1 1x8 1x32 1x128 2x64 4x32 8x16 40x8; do echo "  \"b2_${pc}_avg_claim_batch\": $(m b2_$pc avg_claim_batch),"; done
    echo "  \"b2_best_multi\": \"$best_multi\", \"b4_p50_ms\": $(m b4_latency p50_ms), \"b4_p95_ms\": $(m b4_latency p95_ms), \"b4_p99_ms\": $(m b4_latency p99_ms), \"b4_max_ms\": $(m b4_latency max_ms),"
    echo "  \"b6_c1_connections\": $(m b2_1x1 connections_max), \"b6_c128_connections\": $(m b2_1x128 connections_max), \"b6_c1_rss_kb\": $(m b2_1x1 rss_kb_max), \"b6_c128_rss_kb\": $(m b2_1x128 rss_kb_max),"
    for pct in 25 50 75 90 100 125; do echo "  \"b7_${pct}_offered\": $(m b7_$pct offered_per_s), \"b7_${pct}_jobs_per_s\": $(m b7_$pct jobs_per_s), \"b7_${pct}_p99_ms\": $(m b7_$pct p99_ms), \"b7_${pct}_depth_end\": $(m b7_$pct depth_end),"; done
    echo "  \"b7_saturation\": $b7_sat, \"b7_kept_up_with_all\": $b7_kept_all,"
    for n in s1 s2 s3 s5_steady; do
        echo "  \"${n}_rate\": $(m $n offered_avg_per_s), \"${n}_completed_over_offered\": $(m $n completed_over_offered), \"${n}_last_over_first\": $(m $n last_over_first), \"${n}_p99_ms_max\": $(m $n pickup_p99_ms_max), \"${n}_p99_ms_last\": $(m $n pickup_p99_ms_last), \"${n}_table_second_over_first\": $(m $n table_second_over_first), \"${n}_claim_last_over_first\": $(m $n claim_last_over_first), \"${n}_lock_wait_ms_max\": $(m $n lock_wait_ms_max),"
    done
    echo "  \"s3_pg_dump_s\": $dump_s, \"s3_pg_dump_ok\": $dump_ok, \"s3_restore_ok\": $restore_ok, \"steady_seconds\": $steady_s,"
    echo "  \"s1_met\": \"$vs1\", \"s2_met\": \"$vs2\", \"s3_met\": \"$vs3\", \"s4_b7_met\": \"$vs4\", \"s5_met\": \"$vs5\","
    echo "  \"t1\": $t1, \"t2\": $t2, \"t2_keyed\": $(ratio "$(m t2_keyed jobs_per_s)" "$c8"), \"t3_best\": $t3a, \"t3_40x8\": $t3b, \"t4\": $t4,"
    echo "  \"t1_met\": \"$v1\", \"t2_met\": \"$v2\", \"t3_met\": \"$v3\", \"t4_met\": \"$v4\", \"latency_met\": \"$vl\", \"resources_met\": \"$vr\""
    echo "}"
} > "$results/latest.json"

row() { printf '%-50s %12s  %s\n' "$1" "$2" "$3"; }
echo
row "scenario (medians)" "jobs/s" "ratio in the same run"
row "ceiling: minimal table, claim 100 + done, 1 client" "$(m c_claim_1 jobs_per_s)" ""
row "ceiling: ... 2 clients" "$(m c_claim_2 jobs_per_s)" ""
row "ceiling: ... 8 clients (C8)" "$c8" ""
row "ceiling: ... 16 clients" "$(m c_claim_16 jobs_per_s)" ""
row "ceiling: 100-row INSERTs, 1 client" "$(m c_insert jobs_per_s)" ""
row "ceiling: COPY, batches of 10,000 rows" "$copy_ceiling" ""
row "T2 pgjobq statements, 8 clients, from the head" "$(m t2_head jobs_per_s)" "$t2 of C8 (target 0.8: $(verdict $v2))"
row "T2 pgjobq statements, 8 clients, with the key" "$(m t2_keyed jobs_per_s)" "$(ratio "$(m t2_keyed jobs_per_s)" "$c8") of C8"
row "B1 enqueue, API, batches of 10,000" "$(m b1_api jobs_per_s)" "$t4 of COPY, $(ratio "$(m b1_api jobs_per_s)" "$(m c_insert jobs_per_s)") of INSERT (T4: >= 150,000 and 0.7: $(verdict $v4))"
row "B1 enqueue --file" "$(m b1_file jobs_per_s)" "$(ratio "$(m b1_file jobs_per_s)" "$copy_ceiling") of COPY"
for pc in 1x1 1x8 1x32 1x128 2x64 4x32 8x16 40x8; do
    extra=""
    [ "$pc" = 1x32 ] && extra=" (T1 >= 0.6: $(verdict $v1))"
    [ "b2_$pc" = "$best_multi" ] && extra=" (best multi-process; T3 >= 0.8: $t3a)"
    [ "$pc" = 40x8 ] && extra=" = $t3b of the best multi-process (T3 >= 0.7: $(verdict $v3))"
    row "B2 drain, $pc (claim batch $(m b2_$pc avg_claim_batch))" "$(m b2_$pc jobs_per_s)" "$(ratio "$(m b2_$pc jobs_per_s)" "$c8") of C8$extra"
done
row "B4 pickup p50 / p95 / p99 / max (ms)" "$(m b4_latency p50_ms)" "$(m b4_latency p95_ms) / $(m b4_latency p99_ms) / $(m b4_latency max_ms) (<= 2 / 8: $(verdict $vl))"
row "B5 best drain with $((noise * 2)) other rows" "$(m b5_noise jobs_per_s)" "$(ratio "$(m b5_noise jobs_per_s)" "$(m b5_empty jobs_per_s)") of empty"
row "B6 connections 1x1 / 1x128, peak RSS KiB" "$(m b2_1x1 connections_max) / $(m b2_1x128 connections_max)" "$(m b2_1x1 rss_kb_max) / $(m b2_1x128 rss_kb_max) (<= 3, <= 16 MiB: $(verdict $vr))"
for pct in 25 50 75 90 100 125; do
    row "B7 $best_p x $best_c at $pct% of the best drain" "$(m b7_$pct jobs_per_s)" "offered $(m b7_$pct offered_per_s)/s ($(m b7_$pct offered_steady_per_s)/s after the warm-up), p99 $(m b7_$pct p99_ms) ms, backlog at the end $(m b7_$pct depth_end)"
done
if [ "$b7_kept_all" = 1 ]; then
    row "B7 saturation: not reached; kept up with" "$b7_sat" "$(ratio "$b7_sat" "$best_rate") of the best drain (all the producer offered)"
else
    row "B7 saturation: the highest rate kept up with" "$b7_sat" "$(ratio "$b7_sat" "$best_rate") of the best drain"
fi
row "B8 --exec /bin/true, 1 x 32" "$(m b8_exec jobs_per_s)" "$(ratio "$(m b8_exec jobs_per_s)" "$(m b8_inproc jobs_per_s)") of in-process"
row "B9 --coproc a Python no-op (bench/coproc_noop.py), 1 x 32" "$(m b9_noop jobs_per_s)" "$(ratio "$(m b9_noop jobs_per_s)" "$(m b9_inproc jobs_per_s)") of the in-process no-op (>= 0.7: $(verdict $v9a))"
row "B9 --coproc examples/coproc.py (a result per job), 1 x 32" "$(m b9_coproc jobs_per_s)" "$(ratio "$(m b9_coproc jobs_per_s)" "$(m b9_inproc jobs_per_s)") of in-process; $(ratio "$(m b9_coproc jobs_per_s)" "$(m b9_exec jobs_per_s)") x the same handler by --exec (>= 5: $(verdict $v9b))"
row "B9 python3 -m pgjobq worker: a no-op @app.task, 1 x 32" "$(m b9_pytask jobs_per_s)" "$(ratio "$(m b9_pytask jobs_per_s)" "$(m b9_inproc jobs_per_s)") of in-process (>= 0.6: $(verdict $v9c))"
row "B9 defer() of 10,000 in one call (psycopg 3)" "$(m b9_defer jobs_per_s)" "$(ratio "$(m b9_defer jobs_per_s)" "$(m b9_file10k jobs_per_s)") of enqueue --file of the same 10,000 (>= 0.5: $(verdict $v9d))"
srow() { # srow NAME LABEL TARGET VERDICT
    row "$2" "$(m $1 last_window_per_s | cut -d. -f1)" "offered $(m $1 offered_avg_per_s | cut -d. -f1)/s for $steady_s s: done $(m $1 completed_over_offered), last/first minute $(m $1 last_over_first), p99 max $(m $1 pickup_p99_ms_max) last $(m $1 pickup_p99_ms_last) ms, table 2nd/1st half $(m $1 table_second_over_first), claim time last/first $(m $1 claim_last_over_first), lock wait max $(m $1 lock_wait_ms_max) ms ($3: $(verdict $4))"
}
srow s1 "S1 sustained, 2 x 64" "done >= 0.98, last/first >= 0.95, p99 <= 10 every minute, size <= 1.25" "$vs1"
srow s2 "S2 snapshot held open, 2 x 64" "done >= 0.98, last/first >= 0.9, p99 last <= 50, claim <= 1.5" "$vs2"
srow s3 "S3 held like pg_dump, 2 x 64" "as S2, no lock wait > 100 ms, pg_dump $dump_s s ok=$dump_ok, restored ok=$restore_ok" "$vs3"
row "S4 B7 kept up at every step to 90% of the best" "" "$(verdict $vs4) (saturated soak: make soak SOAK_RATE=0)"
srow s5_steady "S5 40 x 8 in S1" "40 x 8 drain >= 0.7 of the best ($t3b), p99 <= 20 ms" "$vs5"
echo
echo "results: $results/latest.json (every run: $runs)"

# --- plots ---------------------------------------------------------------------------------------
if command -v gnuplot >/dev/null 2>&1; then
    : > "$dir/b2.dat"
    i=0
    for pc in 1x1 1x8 1x32 1x128 2x64 4x32 8x16 40x8; do
        echo "$i $pc $(m b2_$pc jobs_per_s) $c8" >> "$dir/b2.dat"; i=$((i + 1))
    done
    gnuplot <<EOF
set terminal png size 900,480
set output "$results/drain.png"
set title "B2 drain (100 no-op jobs per claim or more), processes x threads, against the minimal-table ceiling at 8 clients"
set style data histograms
set style fill solid 0.6
set ylabel "jobs/s"
set yrange [0:*]
set xtics rotate by 0
plot "$dir/b2.dat" using 3:xtic(2) title "pgjobq (B2)", "" using 4 with lines lw 2 title "ceiling: minimal table, pgbench, 8 clients"
EOF
    echo "plots: $results/drain.png"
else
    echo "plots: skipped (install gnuplot-nox to draw them)"
fi
