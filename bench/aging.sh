#!/bin/sh
# bench/aging.sh - issue 41's figure for priority aging (docs/queues.md, "Priority aging"): what the
# aging pass costs a drain when it is on (`sh bench/aging.sh`; QUICK=1 for a short version, REPS=n).
#
# One throwaway cluster (bench/cluster.sh, durable settings); in-process workers of one process x 32
# threads (`pgjobq bench drain`, the jobs of queue "bench"); medians of REPS alternating rounds:
#
#   on / off    a drain of N jobs with the queue's priority_aging at 1 second (the shortest there is:
#               every job ready for a second is raised a step by the workers' pass, which runs each
#               second on every worker, so the pass has the most to do) against the same drain with
#               it off.  Reported with it: how many of the on-drain's jobs were raised at least once
#               (base_priority kept in the history).  The claim is the same, on or off; the cost of
#               the pass when off (one probe of pgjobq.queues a second per worker) is B2's ratio
#               against the build before (bench/run.sh).
#
# Prints a table, and appends every run to bench/results/aging.jsonl.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
pgjobq=${PGJOBQ:-$top/build/pgjobq}
quick=${QUICK:-0}
if [ "$quick" = 1 ]; then
    reps=${REPS:-1}; drain=20000
else
    reps=${REPS:-3}; drain=100000
fi
results="$here/results"
mkdir -p "$results"
runs="$results/aging.jsonl"
: > "$runs"

. "$here/cluster.sh"
"$pgjobq" --db "$db" migrate >/dev/null
. "$here/rounds.sh"

echo "# pgjobq bench aging: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, $reps rounds, medians"
raised=""
r=1
while [ "$r" -le "$reps" ]; do
    "$pgjobq" --db "$db" queue set bench --priority-aging none >/dev/null
    run off "$r" drain --jobs "$drain" --processes 1 --concurrency 32
    "$pgjobq" --db "$db" queue set bench --priority-aging 1s >/dev/null
    run on "$r" drain --jobs "$drain" --processes 1 --concurrency 32
    raised="$raised $(sql "SELECT count(*) FROM pgjobq.history WHERE queue = 'bench' AND base_priority IS NOT NULL")"
    "$pgjobq" --db "$db" queue set bench --priority-aging none >/dev/null
    r=$((r + 1))
done

on=$(m on jobs_per_s); off=$(m off jobs_per_s)
echo
echo "| figure | value |"
echo "|---|---|"
echo "| drain with priority aging of 1 s / without ($on and $off jobs/s) | $(ratio "$on" "$off") |"
echo "| jobs of the on-drain raised at least once, per round (of $drain) |$raised |"
