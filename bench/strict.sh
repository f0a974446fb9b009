#!/bin/sh
# bench/strict.sh - issue 41's figure for strict order per key (docs/queues.md, "Strict order per
# key"), run by `make bench` (or alone: `sh bench/strict.sh`; QUICK=1 for a short version, REPS=n).
#
# One throwaway cluster (bench/cluster.sh, durable settings); in-process workers of one process x 32
# threads (`pgjobq bench drain`); medians of REPS alternating rounds:
#
#   strict      a drain of J jobs spread round-robin over K = 1,000 concurrency keys in a queue with
#               strict order (`--keys 1000 --strict`: a key's jobs one at a time, in order) against
#               the same drain in the same queue without it (`--keys 1000`).  The figure the issue
#               asks for; reported, no target (a key's jobs run one after another by design: with
#               1,000 keys and 32 threads the keys are not what limits it).
#   keys        the drain with keys and without strict order against the plain drain (no keys): what
#               the keys alone cost (jobs_sequence_idx, the keyed claim's walk).
#
# Prints a table and appends every run to bench/results/strict.jsonl.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
pgjobq=${PGJOBQ:-$top/build/pgjobq}
quick=${QUICK:-0}
keys=${STRICT_KEYS:-1000}
if [ "$quick" = 1 ]; then
    reps=${REPS:-1}; jobs=20000
else
    reps=${REPS:-3}; jobs=100000
fi
results="$here/results"
mkdir -p "$results"
runs="$results/strict.jsonl"
: > "$runs"

. "$here/cluster.sh"
"$pgjobq" --db "$db" migrate >/dev/null
. "$here/rounds.sh"

echo "# pgjobq bench strict: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, $reps rounds, medians"
r=1
while [ "$r" -le "$reps" ]; do
    run strict "$r" drain --jobs "$jobs" --keys "$keys" --strict --processes 1 --concurrency 32
    run keyed "$r" drain --jobs "$jobs" --keys "$keys" --processes 1 --concurrency 32
    run plain "$r" drain --jobs "$jobs" --processes 1 --concurrency 32
    r=$((r + 1))
done

strict_s=$(m strict jobs_per_s); keyed_s=$(m keyed jobs_per_s); plain_s=$(m plain jobs_per_s)
echo
echo "| figure | value | |"
echo "|---|---|---|"
echo "| $keys keys in strict order / the same without it ($strict_s and $keyed_s jobs/s; claims of $(m strict avg_claim_batch) and $(m keyed avg_claim_batch) jobs) | $(ratio "$strict_s" "$keyed_s") | reported |"
echo "| $keys keys without strict order / no keys ($keyed_s and $plain_s jobs/s) | $(ratio "$keyed_s" "$plain_s") | reported |"
