#!/bin/sh
# bench/cost.sh - issue 42's rows of cost and scale, each with met or missed (`sh bench/cost.sh`;
# QUICK=1 for a short version, REPS=n).  The latency rows against their floor are bench/floor.sh's,
# and the producers' rate with 40 workers listening is bench/notify.sh's; `make bench` runs all three.
#
# One throwaway cluster (bench/cluster.sh, durable settings), one database.  Every ratio is of two
# figures measured in the same round, and the rows print the median over REPS rounds (3; QUICK 1):
#
#   claim    a claim of 100, pgbench, one client: pgjobq.claim_next as the worker sends it under a
#            backlog (from its cursor; bench/ceiling/pgjobq_claim_cursor.sql) against the minimal
#            table's claim (bench/ceiling/claim_done.sql's first statement), per call.  Target:
#            <= 1.3x.
#   drain    pgjobq's best drain (`pgjobq bench drain`, 2 x 64 and 4 x 32) against the raw claim of
#            1,000 + done at 2 clients (bench/ceiling/claim_done.sql, -D n=1000).  Target: >= 0.9.
#   graphile 1 process x 32 against Graphile Worker tuned (bench/graphile/drain.mjs: one Node.js
#            process, 32 concurrent jobs, a local queue, batched completions), the same jobs.  Needs
#            node and npm: the script installs the pinned graphile-worker into bench/graphile
#            (npm registry); without them the row has no figure.  Target: >= 2.0.
#   lim      (no target) 2 x 64 under a concurrency limit of 128 against 2 x 64 without one: what the
#            limit's count and its claims, one at a time, cost.
#   w40      40 processes x 8 against the best drain, in every round.  Target: >= 0.8 in every round.
#            Its floor: the minimal table drained by 40 pgbench clients claiming 500 at a time against
#            2 claiming 1,000 (the raw drain above); where that ratio misses 0.8 too, so does the
#            machine (printed beside the 40-session rows, the Python one's too).
#   plain    2 x 64 while producers (`pgjobq bench steady`, 4 connections) offer half and then 80% of
#            the round's best drain: the pickup of the last third of the run, to the handler's start
#            (and to the claim's).  Targets: p99 <= 10 ms at half, <= 25 ms at 80%.  The floor runs at
#            the same rates, alternating: the minimal table, the same producers (batches of 100 with a
#            NOTIFY), 2 LISTENing workers claiming 100 at a time (`bench steady --floor`); where it
#            misses a target too, the target is out of reach on this machine.  (bench/floor.sh measures
#            15,000 jobs/s, with a snapshot held and at 40 x 8, against the floor.)
#   py40     `python3 -m pgjobq worker` (bench/py_tasks.py's no-op task): 40 processes x 4 slots
#            against 1 process x 160, both started and settled before the jobs arrive (the drain
#            from the enqueue's commit to the last completion, database clock).  Target: >= 0.8.
#            The same with each worker started as the jobs arrive (--burst, the start-up counted) is
#            printed beside it, as a figure without a target.
#   py40pick the same 40 processes at 100 jobs/s (pgbench, one job a transaction, 2 producers):
#            the pickup from the enqueuing transaction's start to the claim's start and to the
#            handler's start (py_tasks.py's "stamp" returns its clock), p50 and p99, against
#            1 x 160.  Target: p99 <= 50 ms.
#
# Prints the rows, and appends every measurement to bench/results/cost.jsonl.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
pgjobq=${PGJOBQ:-$top/build/pgjobq}
quick=${QUICK:-0}
if [ "$quick" = 1 ]; then
    reps=${REPS:-1}; claims=300; jobs=20000; py_jobs=20000; pick_s=10; steady_s=15
else
    reps=${REPS:-3}; claims=1000; jobs=100000; py_jobs=60000; pick_s=30; steady_s=30
fi
window=$(( (steady_s + 2) / 3 ))
results="$here/results"
mkdir -p "$results"
runs="$results/cost.jsonl"
: > "$runs"

. "$here/cluster.sh"
. "$here/rounds.sh"
"$pgjobq" --db "$db" migrate >/dev/null
"$bindir/psql" -X -q -f "$here/ceiling/schema.sql" 2>/dev/null
python=$(command -v /usr/bin/python3 python3 | head -n 1)
# raw_drain NAME ROUND CLIENTS N: the minimal table drained by pgbench, CLIENTS sessions each claiming N
# then marking them done (bench/ceiling/claim_done.sql), from a fresh load of jobs + 10%.
raw_drain() {
    load_ceiling $((jobs * 11 / 10))
    t=$((jobs / $4 / $3))
    out=$("$bindir/pgbench" -n -M prepared -c "$3" -j 2 -t "$t" -D n="$4" -f "$here/ceiling/claim_done.sql" 2>&1)
    tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    [ -n "$tps" ] || { echo "cost: pgbench claim_done.sql failed: $out" >&2; exit 70; }
    done_=$(sql "SELECT count(*) FROM ceiling.jobs WHERE state = 'done'")
    record "$1" "$2" "\"jobs_per_s\":$(awk -v d="$done_" -v t="$tps" -v n=$((t * $3)) 'BEGIN { printf "%.1f", d / (n / t) }')"
    sql "TRUNCATE ceiling.jobs" >/dev/null
}
record() { echo "{\"name\":\"$1\",\"round\":$2,$3}" >> "$runs"; } # record NAME ROUND 'FIELDS'
num() { sed -n "s/.*\"$1\":\([-0-9.]*\).*/\1/p"; }                 # num FIELD < JSON
# floor_says NAME TARGET: where the floor (the minimal table driven the same way) misses the target
# too, the target is out of reach on this machine: say so beside the verdict.
floor_says() { awk -v f="$(m "$1" pickup_p99_ms_last)" -v t="$2" 'BEGIN { if (f != "nan" && f > t) print " (the floor misses it too)" }'; }

load_ceiling() {
    sql "TRUNCATE ceiling.jobs" >/dev/null
    sql "INSERT INTO ceiling.jobs (queue, payload) SELECT 'q', '{\"noop\": true}' FROM generate_series(1, $1)" >/dev/null
    sql "VACUUM ANALYZE ceiling.jobs" >/dev/null
    sql "CHECKPOINT" >/dev/null
}
load_pgjobq() { # $1 queued jobs in queue 'bench'
    sql "SELECT pgjobq.reset_queue('bench')" >/dev/null
    sql "SELECT count(*) FROM pgjobq.enqueue_many(array_fill('bench'::text, ARRAY[$1]), NULL,
         array_fill('{\"noop\": true}'::jsonb, ARRAY[$1]), notify => false)" >/dev/null
    sql "VACUUM ANALYZE pgjobq.jobs" >/dev/null
    sql "CHECKPOINT" >/dev/null
}
# The minimal table's claim alone: claim_done.sql's first statement, as it is there (one text for both).
sed -n '/^WITH c AS MATERIALIZED/,/RETURNING j.id, j.payload)$/p' "$here/ceiling/claim_done.sql" > "$dir/claim.sql"
echo "SELECT count(*) FROM u;" >> "$dir/claim.sql"
[ "$(grep -c . "$dir/claim.sql")" = 8 ] || { echo "cost: claim_done.sql's claim not found" >&2; exit 70; }
pgbench_ms() { # pgbench_ms SCRIPT ARGS...: one client; prints the average latency per transaction (ms)
    script=$1; shift
    out=$("$bindir/pgbench" -n -M prepared -c 1 -j 1 "$@" -f "$script" 2>&1)
    lat=$(echo "$out" | sed -n 's/^latency average = \([0-9.]*\) ms.*/\1/p')
    [ -n "$lat" ] || { echo "cost: pgbench $script failed: $out" >&2; exit 70; }
    echo "$lat"
}

# --- the Graphile Worker harness: installed once (npm), pinned by bench/graphile/package.json ----------
graphile=no
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
    # npm install brings node_modules to package-lock.json (quickly when it is there already); offline,
    # what an earlier install left will do.
    if (cd "$here/graphile" && npm install --no-audit --no-fund --silent >/dev/null 2>&1) ||
       [ -d "$here/graphile/node_modules/graphile-worker" ]; then
        graphile=yes
    else
        echo "cost: npm install of graphile-worker failed: the Graphile row has no figure" >&2
    fi
else
    echo "cost: node and npm not found: the Graphile row has no figure" >&2
fi

# --- the Python workers --------------------------------------------------------------------------
py_pids=""
py_fail() { # py_fail MESSAGE: the workers' log goes with the cluster's directory at exit: show its end
    echo "cost: $1" >&2
    tail -n 20 "$dir/py.log" >&2 2>/dev/null || true
    exit 70
}
py_start() { # py_start PROCS SLOTS [--burst]: start PROCS workers of SLOTS slots each
    n=0
    while [ "$n" -lt "$1" ]; do
        PGJOBQ_BIN="$pgjobq" PYTHONPATH="$top/python:$here" "$python" -m pgjobq worker --db "$db" \
            -q "default:$2" ${3:-} py_tasks:app -- --log-level warn >/dev/null 2>>"$dir/py.log" &
        py_pids="$py_pids $!"
        n=$((n + 1))
    done
}
py_settle() { # py_settle PROCS: wait until PROCS workers are registered, then 2 s more (at most 120 s)
    w=0
    until [ "$(sql "SELECT count(*) FROM pgjobq.workers WHERE stopped_at IS NULL")" -ge "$1" ]; do
        w=$((w + 1))
        [ "$w" -lt 1200 ] || py_fail "$1 Python workers did not start"
        sleep 0.1
    done
    sleep 2
}
py_stop() {
    [ -z "$py_pids" ] || { kill -TERM $py_pids 2>/dev/null || true; wait $py_pids 2>/dev/null || true; }
    py_pids=""
    sql "DELETE FROM pgjobq.workers" >/dev/null
}
py_reset() { sql "TRUNCATE pgjobq.jobs, pgjobq.history" >/dev/null; sql "DELETE FROM pgjobq.workers" >/dev/null; sql "CHECKPOINT" >/dev/null; }
py_enqueue() { # enqueue $py_jobs jobs of queue 'default', kind 'default', in one statement (it notifies)
    sql "SELECT count(*) FROM pgjobq.enqueue_many(array_fill('default'::text, ARRAY[$py_jobs]), NULL,
         array_fill('{\"noop\": true}'::jsonb, ARRAY[$py_jobs]))" >/dev/null
}
py_wait_empty() { # until no job is left (at most 300 s)
    w=0
    until [ "$(sql "SELECT count(*) FROM pgjobq.jobs")" = 0 ]; do
        w=$((w + 1))
        [ "$w" -lt 6000 ] || py_fail "the Python workers left jobs undone"
        sleep 0.05
    done
}
py_drain() { # py_drain NAME ROUND PROCS SLOTS: settled workers; from the enqueue's commit to the last completion
    py_reset
    py_start "$3" "$4"
    py_settle "$3"
    py_enqueue
    t0=$(sql "SELECT extract(epoch FROM clock_timestamp())")
    py_wait_empty
    t1=$(sql "SELECT extract(epoch FROM max(finished_at)) FROM pgjobq.history")
    py_stop
    record "$1" "$2" "\"jobs_per_s\":$(awk -v n="$py_jobs" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", n / (b - a) }')"
}
py_burst() { # py_burst NAME ROUND PROCS SLOTS: the jobs first, then the workers with --burst, start-up counted
    py_reset
    py_enqueue
    t0=$(sql "SELECT extract(epoch FROM clock_timestamp())")
    py_start "$3" "$4" --burst
    for pid in $py_pids; do wait "$pid" || py_fail "a --burst worker exited with status $?"; done
    py_pids=""
    left=$(sql "SELECT count(*) FROM pgjobq.jobs")
    [ "$left" = 0 ] || py_fail "--burst workers left $left jobs"
    t1=$(sql "SELECT extract(epoch FROM max(finished_at)) FROM pgjobq.history")
    sql "DELETE FROM pgjobq.workers" >/dev/null
    record "$1" "$2" "\"jobs_per_s\":$(awk -v n="$py_jobs" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", n / (b - a) }')"
}
py_pickup() { # py_pickup NAME ROUND PROCS SLOTS: 100 jobs/s for $pick_s s; pickup to the claim's start
    py_reset
    py_start "$3" "$4"
    py_settle "$3"
    echo "SELECT pgjobq.enqueue('default', 'stamp', '{\"noop\": true}');" > "$dir/enqueue1.sql"
    "$bindir/pgbench" -n -M prepared -c 2 -j 2 -R 100 -T "$pick_s" -f "$dir/enqueue1.sql" >/dev/null 2>&1 ||
        py_fail "the producers' pgbench failed"
    py_wait_empty
    py_stop
    # The first 2 s are left out: the producers' connections start then.
    record "$1" "$2" "$(sql "SELECT '\"p50_ms\":' || round(1000 * percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM h.started_at - h.run_at))::numeric, 2)
                             || ',\"p99_ms\":' || round(1000 * percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM h.started_at - h.run_at))::numeric, 2)
                             || ',\"h50_ms\":' || round(1000 * percentile_cont(0.5) WITHIN GROUP (ORDER BY (h.result->>'at')::float8 - extract(epoch FROM h.run_at))::numeric, 2)
                             || ',\"h99_ms\":' || round(1000 * percentile_cont(0.99) WITHIN GROUP (ORDER BY (h.result->>'at')::float8 - extract(epoch FROM h.run_at))::numeric, 2)
                             || ',\"jobs\":' || count(*)
                        FROM pgjobq.history h
                       WHERE h.run_at > (SELECT min(x.run_at) + interval '2 s' FROM pgjobq.history x)")"
}
trap 'py_stop >/dev/null 2>&1 || true; cleanup' EXIT INT TERM
# round_of NAME ROUND FIELD: the median of FIELD over one round's runs; best_of ROUND: that round's best drain
round_of() { grep "\"name\":\"$1\",\"round\":$2," "$runs" | num "$3" | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
best_of() { awk -v a="$(round_of d_2x64 "$1" jobs_per_s)" -v b="$(round_of d_4x32 "$1" jobs_per_s)" 'BEGIN { print (a > b ? a : b) }'; }

echo "# pgjobq bench cost: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, $reps rounds, medians"
r=1
while [ "$r" -le "$reps" ]; do
    echo "# round $r of $reps" >&2
    # claim: alternating, each side on its own table, loaded afresh with the same number of jobs.
    for side in pgjobq minimal minimal pgjobq; do
        if [ "$side" = pgjobq ]; then
            load_pgjobq $((claims * 110))
            ms=$(pgbench_ms "$here/ceiling/pgjobq_claim_cursor.sql" -t "$claims" -D n=100 -D k=-infinity -D i=0)
        else
            load_ceiling $((claims * 110))
            ms=$(pgbench_ms "$dir/claim.sql" -t "$claims" -D n=100)
        fi
        record "claim_$side" "$r" "\"ms\":$ms"
    done
    # drain: the raw claim of 1,000 + done at 2 clients, and its floor at 40 (claims of 500), then
    # pgjobq's 2 x 64, 4 x 32, 40 x 8, 1 x 32.
    raw_drain raw "$r" 2 1000
    raw_drain raw40 "$r" 40 500
    # 2 x 64 under a concurrency limit of 128 first: every drain after it clears the limit.
    sql "SELECT pgjobq.reset_queue('bench')" >/dev/null; sql "CHECKPOINT" >/dev/null
    run d_lim "$r" drain --jobs "$jobs" --processes 2 --concurrency 64 --limit 128
    for pc in 2x64 4x32 40x8 1x32; do
        sql "SELECT pgjobq.reset_queue('bench')" >/dev/null; sql "CHECKPOINT" >/dev/null
        run "d_$pc" "$r" drain --jobs "$jobs" --processes "${pc%x*}" --concurrency "${pc#*x}"
    done
    # plain: 2 x 64 under producers offering half and 80% of this round's best drain, and the floor at
    # the same rates (the minimal table, 2 LISTENing workers claiming 100 at a time), alternating.
    if [ $((r % 2)) = 1 ]; then order="pgjobq floor"; else order="floor pgjobq"; fi
    for pct in 50 80; do
        rate=$(awk -v b="$(best_of "$r")" -v p="$pct" 'BEGIN { printf "%d", b * p / 100 }')
        for side in $order; do
            sql "CHECKPOINT" >/dev/null
            if [ "$side" = pgjobq ]; then name="steady_$pct"; floor=""; else name="steady_${pct}_floor"; floor=--floor; fi
            run "$name" "$r" steady --rate "$rate" --processes 2 --concurrency 64 --producers 4 \
                --seconds "$steady_s" --window "$window" $floor 2>/dev/null
        done
    done
    if [ "$graphile" = yes ]; then
        out=$(cd "$here/graphile" && node drain.mjs "postgresql://postgres@/postgres?host=$dir" "$jobs" 32 3000) ||
            { echo "cost: bench/graphile/drain.mjs failed" >&2; exit 70; }
        record graphile "$r" "\"jobs_per_s\":$(echo "$out" | num jobs_per_s)"
        sql "SET client_min_messages = warning; DROP SCHEMA graphile_worker CASCADE" >/dev/null
    fi
    # Python: 40 x 4 and 1 x 160, alternating.
    if [ $((r % 2)) = 1 ]; then order="40:4 1:160"; else order="1:160 40:4"; fi
    for pc in $order; do py_drain "py_${pc%:*}" "$r" "${pc%:*}" "${pc#*:}"; done
    for pc in $order; do py_burst "pyb_${pc%:*}" "$r" "${pc%:*}" "${pc#*:}"; done
    for pc in $order; do py_pickup "pyp_${pc%:*}" "$r" "${pc%:*}" "${pc#*:}"; done
    r=$((r + 1))
done

# --- the ratios of each round, then the rows --------------------------------------------------------
r=1
while [ "$r" -le "$reps" ]; do
    best=$(best_of "$r")
    record x_claim "$r" "\"ratio\":$(ratio "$(round_of claim_pgjobq "$r" ms)" "$(round_of claim_minimal "$r" ms)")"
    record x_drain "$r" "\"ratio\":$(ratio "$best" "$(round_of raw "$r" jobs_per_s)")"
    record x_graphile "$r" "\"ratio\":$(ratio "$(round_of d_1x32 "$r" jobs_per_s)" "$(round_of graphile "$r" jobs_per_s)")"
    record x_w40 "$r" "\"ratio\":$(ratio "$(round_of d_40x8 "$r" jobs_per_s)" "$best")"
    record x_lim "$r" "\"ratio\":$(ratio "$(round_of d_lim "$r" jobs_per_s)" "$(round_of d_2x64 "$r" jobs_per_s)")"
    record x_raw40 "$r" "\"ratio\":$(ratio "$(round_of raw40 "$r" jobs_per_s)" "$(round_of raw "$r" jobs_per_s)")"
    record x_py40 "$r" "\"ratio\":$(ratio "$(round_of py_40 "$r" jobs_per_s)" "$(round_of py_1 "$r" jobs_per_s)")"
    record x_pyb40 "$r" "\"ratio\":$(ratio "$(round_of pyb_40 "$r" jobs_per_s)" "$(round_of pyb_1 "$r" jobs_per_s)")"
    r=$((r + 1))
done
all_w40=$(grep '"name":"x_w40",' "$runs" | num ratio | tr '\n' ' ')
min_w40=$(grep '"name":"x_w40",' "$runs" | num ratio | sort -g | head -n 1)

echo
echo "| issue 42's row (medians of $reps rounds) | pgjobq | reference | ratio | target |"
echo "|---|---|---|---|---|"
echo "| a claim of 100 (pgbench, from the worker's cursor), ms | $(m claim_pgjobq ms) | minimal table $(m claim_minimal ms) |" \
     "$(m x_claim ratio) | <= 1.3: $(verdict "$(m x_claim ratio)" "<=" 1.3) |"
echo "| best drain (2 x 64: $(m d_2x64 jobs_per_s), 4 x 32: $(m d_4x32 jobs_per_s)) / raw claim-1000 + done at 2 clients, jobs/s |" \
     "| $(m raw jobs_per_s) | $(m x_drain ratio) | >= 0.9: $(verdict "$(m x_drain ratio)" ">=" 0.9) |"
for pct in 50 80; do
    [ "$pct" = 50 ] && target=10 || target=25
    echo "| 2 x 64 at $pct% of the best drain (offered $(m "steady_$pct" offered_avg_per_s) jobs/s), pickup p50 / p99 of the last window, ms (p99 to the claim's start) |" \
         "$(m "steady_$pct" pickup_p50_ms_last) / $(m "steady_$pct" pickup_p99_ms_last) ($(m "steady_$pct" to_claim_p99_ms_last)) |" \
         "floor $(m "steady_${pct}_floor" pickup_p50_ms_last) / $(m "steady_${pct}_floor" pickup_p99_ms_last) ($(m "steady_${pct}_floor" to_claim_p99_ms_last)), offered $(m "steady_${pct}_floor" offered_avg_per_s) |" \
         "completed / offered $(m "steady_$pct" completed_over_offered), floor $(m "steady_${pct}_floor" completed_over_offered) |" \
         "p99 <= $target: $(verdict "$(m "steady_$pct" pickup_p99_ms_last)" "<=" "$target")$(floor_says "steady_${pct}_floor" "$target") |"
done
echo "| (no target) 2 x 64 under a concurrency limit of 128 / without, jobs/s | $(m d_lim jobs_per_s) | $(m d_2x64 jobs_per_s) |" \
     "$(m x_lim ratio) | |"
echo "| 1 process x 32 / Graphile Worker tuned, jobs/s | $(m d_1x32 jobs_per_s) | $(m graphile jobs_per_s) |" \
     "$(m x_graphile ratio) | >= 2.0: $(verdict "$(m x_graphile ratio)" ">=" 2.0) |"
# The floor of the rows at 40 sessions: the minimal table at 40 clients against 2.
raw40_says() { awk -v f="$(m x_raw40 ratio)" -v t="$1" 'BEGIN { if (f != "nan" && f < t) print " (the floor misses it too)" }'; }
echo "| 40 processes x 8 / the best, jobs/s (each round: $all_w40) | $(m d_40x8 jobs_per_s) |" \
     "floor: raw claim-500 + done at 40 clients $(m raw40 jobs_per_s) / at 2 $(m raw jobs_per_s): $(m x_raw40 ratio) |" \
     "$(m x_w40 ratio), lowest $min_w40 | >= 0.8 every round: $(verdict "${min_w40:-nan}" ">=" 0.8)$(raw40_says 0.8) |"
echo "| 40 Python processes x 4 / 1 x 160, drain of $py_jobs, jobs/s | $(m py_40 jobs_per_s) | $(m py_1 jobs_per_s) |" \
     "$(m x_py40 ratio) (the floor at 40 sessions: $(m x_raw40 ratio)) | >= 0.8: $(verdict "$(m x_py40 ratio)" ">=" 0.8)$(raw40_says 0.8) |"
echo "| the same, each worker started as the jobs arrive (--burst: its start-up counted) | $(m pyb_40 jobs_per_s) | $(m pyb_1 jobs_per_s) |" \
     "$(m x_pyb40 ratio) | (no target) |"
echo "| the 40 Python processes at 100 jobs/s, pickup p50 / p99 to the claim's start, ms | $(m pyp_40 p50_ms) / $(m pyp_40 p99_ms) |" \
     "1 x 160: $(m pyp_1 p50_ms) / $(m pyp_1 p99_ms) | | p99 <= 50: $(verdict "$(m pyp_40 p99_ms)" "<=" 50) |"
echo "| the same, to the handler's start (the task's clock), ms | $(m pyp_40 h50_ms) / $(m pyp_40 h99_ms) |" \
     "1 x 160: $(m pyp_1 h50_ms) / $(m pyp_1 h99_ms) | | p99 <= 50: $(verdict "$(m pyp_40 h99_ms)" "<=" 50) |"
echo
echo "Against the floor (the minimal table driven the same way), with a snapshot held and at 40 x 8: bench/floor.sh;" \
     "the producers' rate with 40 workers listening: bench/notify.sh."
echo "results: every measurement in $runs"
