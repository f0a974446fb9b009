#!/bin/sh
# bench/durable.sh - durable execution's figures (issue 40, docs/durable.md), on a throwaway cluster of
# its own (bench/cluster.sh); `make bench` runs it after run.sh and shards.sh, and `make bench
# BENCH_ONLY=durable` (or `sh bench/durable.sh`) alone.  QUICK=1 for smaller sizes and one round, REPS=n
# rounds (3); the two arms of each comparison alternate within a round, and the medians are compared.
#
#   D1  steps against jobs: N no-op ten-step workflows (each step a read and a store) against the same
#       work split into N x 10 one-step jobs, each timed from enqueue to the last completion, in-process
#       worker of 8 threads (bench/durable.c).  Target: a step costs less than half a job (the step
#       rate at least twice the job rate).
#   D2  parked jobs: a drain of J ready jobs while 100,000 jobs of the same queue are parked (half
#       sleeping a day, half waiting for an event), against the same drain without them (as B5 does
#       with held rows).  Target: >= 0.95.
#   D3  await: a waiter blocked in pgjobq_job_wait, idle, woken by the job's completion: its wake after
#       the completion's commit returned, p50 (target <= 2 ms) and p99; and B2's drain (pgjobq bench
#       drain, 2 x 64) with nobody waiting against the same drain with the trigger that serves waiters
#       disabled (the cost nobody waiting pays; target >= 0.95, the noise).
#
# Every run goes to bench/results/durable.jsonl; a table with met or missed to stdout.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
pgjobq=${PGJOBQ:-$top/build/pgjobq}
quick=${QUICK:-0}
if [ "$quick" = 1 ]; then
    reps=${REPS:-1}; workflows=2000; ready=20000; waits=200; b2_jobs=20000
else
    reps=${REPS:-3}; workflows=10000; ready=100000; waits=1000; b2_jobs=100000
fi
# Each size can be given (a smoke run of the script: WORKFLOWS=20 READY=200 PARKED=1000 WAITS=10 B2_JOBS=1000).
workflows=${WORKFLOWS:-$workflows}; ready=${READY:-$ready}; parked=${PARKED:-100000}; waits=${WAITS:-$waits}
b2_jobs=${B2_JOBS:-$b2_jobs}
results="$here/results"
mkdir -p "$results"
runs="$results/durable.jsonl"
: > "$runs"

. "$here/cluster.sh"
"$pgjobq" --db "$db" migrate >/dev/null
prog="$dir/durable"
cc -std=c11 -O2 -I"$top/include" $(pkg-config --cflags libpq 2>/dev/null) "$here/durable.c" "$top/build/libpgjobq.a" \
    $(pkg-config --libs libpq 2>/dev/null || echo -lpq) -lpthread -o "$prog"

sql() { "$bindir/psql" -X -q -At -c "$1"; }
record() { echo "{\"name\":\"$1\",${2#\{}" >> "$runs"; }
fresh() { sql "TRUNCATE pgjobq.jobs, pgjobq.history, pgjobq.job_steps, pgjobq.job_parks" >/dev/null; sql "VACUUM ANALYZE" >/dev/null; }
# park N: N jobs of queue dp parked, half sleeping a day, half waiting for an event nobody sends.
park() {
    sql "SELECT count(*) FROM pgjobq.enqueue_many(array_fill('dp'::text, ARRAY[$1]), NULL, array_fill('{}'::jsonb, ARRAY[$1]))" >/dev/null
    done_=0
    while [ "$done_" -lt "$1" ]; do
        n=$(sql "WITH c AS (SELECT id, lease_token FROM pgjobq.claim_batch('dp', 10000, '1 hour', 'bench-park'))
                 SELECT count(CASE WHEN c.id % 2 = 0 THEN (SELECT s.outcome FROM pgjobq.sleep(c.id, c.lease_token, 'nap', interval '1 day') s)
                                   ELSE (SELECT w.outcome FROM pgjobq.wait_event(c.id, c.lease_token, 'w', 'never', c.id::text, interval '1 day') w) END)
                   FROM c")
        [ "$n" -gt 0 ] || { echo "bench: parked only $done_ of $1 jobs" >&2; exit 70; }
        done_=$((done_ + n))
    done
    sql "VACUUM ANALYZE" >/dev/null
}

echo "# pgjobq durable bench: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, $reps rounds, medians"
rep=1
while [ $rep -le "$reps" ]; do
    echo "# round $rep of $reps" >&2
    fresh; record d1_jobs "$("$prog" "$db" jobs "$workflows" 8)"
    fresh; record d1_steps "$("$prog" "$db" steps "$workflows" 8)"
    fresh; record d2_empty "$("$prog" "$db" drain "$ready" 8)"
    fresh; park "$parked"
    [ "$(sql "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'dp' AND state = 'queued' AND lease_until IS NULL")" = "$parked" ] ||
        { echo "bench: the parked jobs hold a lease or are not queued" >&2; exit 70; }
    record d2_parked "$("$prog" "$db" drain "$ready" 8)"
    fresh; record d3_await "$("$prog" "$db" await "$waits")"
    fresh; record d3_b2_nobody "$("$pgjobq" --db "$db" bench drain --jobs "$b2_jobs" --processes 2 --concurrency 64 --json)"
    sql "ALTER TABLE pgjobq.history DISABLE TRIGGER history_awaited" >/dev/null
    fresh; record d3_b2_untriggered "$("$pgjobq" --db "$db" bench drain --jobs "$b2_jobs" --processes 2 --concurrency 64 --json)"
    sql "ALTER TABLE pgjobq.history ENABLE TRIGGER history_awaited" >/dev/null
    rep=$((rep + 1))
done

m() { # m NAME FIELD: the median of a field over the runs of a scenario
    grep "\"name\":\"$1\"," "$runs" | sed -n "s/.*\"$2\":\([-0-9.]*\).*/\1/p" | sort -g |
        awk '{ v[NR] = $1 } END { if (NR == 0) print "null"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 == 0 || a == "null" || b == "null") print "null"; else printf "%.2f", a / b }'; }
ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a != "null" && a + 0 >= b + 0) }'; }
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a != "null" && a + 0 <= b + 0) }'; }
verdict() { if [ "$1" = met ]; then echo met; else echo MISSED; fi; }

jobs_rate=$(m d1_jobs units_per_s); steps_rate=$(m d1_steps units_per_s)
# A step's cost over a job's: the job rate over the step rate (each the work of one unit).
d1=$(ratio "$jobs_rate" "$steps_rate")
le "$d1" 0.5 && v1=met || v1=missed
d2=$(ratio "$(m d2_parked units_per_s)" "$(m d2_empty units_per_s)")
ge "$d2" 0.95 && v2=met || v2=missed
le "$(m d3_await p50_ms)" 2 && v3a=met || v3a=missed
d3b=$(ratio "$(m d3_b2_nobody jobs_per_s)" "$(m d3_b2_untriggered jobs_per_s)")
ge "$d3b" 0.95 && v3b=met || v3b=missed

row() { printf '%-58s %12s  %s\n' "$1" "$2" "$3"; }
echo
row "scenario (medians)" "per s" "in the same run"
row "D1 ten one-step jobs ($((workflows * 10)) jobs), enqueue to done" "$jobs_rate" "jobs/s"
row "D1 ten-step workflows ($workflows), enqueue to done" "$steps_rate" "steps/s; a step costs $d1 of a job (< 0.5: $(verdict $v1))"
row "D2 drain of $ready ready jobs, nothing parked" "$(m d2_empty units_per_s)" "jobs/s"
row "D2 the same beside $parked parked (sleeping, waiting)" "$(m d2_parked units_per_s)" "$d2 of the drain without them (>= 0.95: $(verdict $v2))"
row "D3 await: wake after the completion, p50 / p99 / max ms" "$(m d3_await p50_ms)" "$(m d3_await p99_ms) / $(m d3_await max_ms) (p50 <= 2: $(verdict $v3a))"
row "D3 B2 drain 2 x 64, nobody waiting" "$(m d3_b2_nobody jobs_per_s)" "$d3b of the same without the await trigger (>= 0.95: $(verdict $v3b))"
row "D3 B2 drain 2 x 64, the await trigger disabled" "$(m d3_b2_untriggered jobs_per_s)" ""
echo
echo "every run: $runs"
