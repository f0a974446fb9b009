#!/bin/sh
# bench/durable.sh - issue 40's figures for durable execution (docs/durable.md), run by `make bench`
# after bench/shards.sh (or alone: `sh bench/durable.sh`; QUICK=1 for a short version, REPS=n).
#
# One throwaway cluster (bench/cluster.sh, durable settings); in-process
# workers of one process x 32 threads (`pgjobq bench drain`); medians of REPS alternating rounds:
#
#   step cost   a drain of J jobs of ten no-op durable steps each (`--steps 10`: pgjobq_ctx_step, the
#               result stored fenced by the lease) against J chains of ten one-step jobs (`--chain
#               10`: each step its own job, which the one before enqueues: enqueue + claim +
#               complete): the cost of a step over the cost of a job.  Target < 0.5.  Reported with
#               it: ten-step workflows a second against ten-job chains a second.
#   parked      a drain of D ready jobs while 100,000 jobs of the same queue sleep (`--parked`:
#               queued for a day, each with its park row, as ctx.sleep leaves them) against the same
#               drain without them.  Target >= 0.95 (as B5).
#   await       an idle worker, jobs one after another each awaited (`pgjobq bench await`): the
#               waiter's wake after the worker's completion returned, p50.  Target <= 2 ms.  And B2's drain
#               with nobody waiting (the history's statement trigger history_awaited finds nobody)
#               against the same drain with that trigger disabled: within the noise (>= 0.97).
#
# Prints a table with each target met or missed, and appends every run to bench/results/durable.jsonl.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
pgjobq=${PGJOBQ:-$top/build/pgjobq}
quick=${QUICK:-0}
if [ "$quick" = 1 ]; then
    reps=${REPS:-1}; wf=2000; drain=20000; parked=${DURABLE_PARKED:-100000}; awaits=100
else
    reps=${REPS:-3}; wf=10000; drain=100000; parked=${DURABLE_PARKED:-100000}; awaits=300
fi
results="$here/results"
mkdir -p "$results"
runs="$results/durable.jsonl"
: > "$runs"


. "$here/cluster.sh"
"$pgjobq" --db "$db" migrate >/dev/null
. "$here/rounds.sh"

echo "# pgjobq bench durable: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, $reps rounds, medians"
r=1
while [ "$r" -le "$reps" ]; do
    run steps10 "$r" drain --jobs "$wf" --steps 10 --processes 1 --concurrency 32
    run chain10 "$r" drain --jobs "$wf" --chain 10 --processes 1 --concurrency 32
    run parked "$r" drain --jobs "$drain" --parked "$parked" --processes 1 --concurrency 32
    run plain "$r" drain --jobs "$drain" --processes 1 --concurrency 32
    sql "ALTER TABLE pgjobq.history DISABLE TRIGGER history_awaited" >/dev/null
    run no_trigger "$r" drain --jobs "$drain" --processes 1 --concurrency 32
    sql "ALTER TABLE pgjobq.history ENABLE TRIGGER history_awaited" >/dev/null
    run await "$r" await --jobs "$awaits"
    r=$((r + 1))
done

wf_s=$(m steps10 jobs_per_s); jobs_s=$(m chain10 jobs_per_s)
steps_s=$(awk -v w="$wf_s" 'BEGIN { if (w == "nan") print "nan"; else printf "%.1f", w * 10 }')
step_cost=$(ratio "$jobs_s" "$steps_s")     # (1 / steps_s) / (1 / jobs_s)
wf_ratio=$(ratio "$wf_s" "$(awk -v j="$jobs_s" 'BEGIN { if (j == "nan") print "nan"; else print j / 10 }')")
parked_ratio=$(ratio "$(m parked jobs_per_s)" "$(m plain jobs_per_s)")
trig_ratio=$(ratio "$(m plain jobs_per_s)" "$(m no_trigger jobs_per_s)")
p50=$(m await p50_ms)
echo
echo "| figure | value | target | |"
echo "|---|---|---|---|"
echo "| a step's cost / a one-step job's (${steps_s} steps/s in ten-step workflows, ${jobs_s} jobs/s in ten-job chains) | $step_cost | < 0.5 | $(verdict "$step_cost" "<" 0.5) |"
echo "| ten-step workflows a second / ten-job chains a second | $wf_ratio | (reported) | |"
echo "| drain with $parked jobs sleeping / without ($(m parked jobs_per_s) and $(m plain jobs_per_s) jobs/s) | $parked_ratio | >= 0.95 | $(verdict "$parked_ratio" ">=" 0.95) |"
echo "| await: the waiter's wake after the completion, p50 ms (p99 $(m await p99_ms)) | $p50 | <= 2 | $(verdict "$p50" "<=" 2) |"
echo "| drain with nobody waiting / with the await trigger disabled ($(m plain jobs_per_s) and $(m no_trigger jobs_per_s) jobs/s) | $trig_ratio | >= 0.97 | $(verdict "$trig_ratio" ">=" 0.97) |"
