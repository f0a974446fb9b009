#!/bin/sh
# bench/shards.sh - issue 39's figures for a cluster of shards (docs/shards.md), run by `make bench`
# after bench/run.sh (or alone: `sh bench/shards.sh`; QUICK=1 for a short version, REPS=n;
# SHARD_SYNC=off runs both servers with synchronous_commit off, to see what the shared disk costs;
# SHARD_ONLY=scale stops after the scale figure and its pgbench ceiling).
#
# Two PostgreSQL clusters on this machine, each on a Unix socket of its own and held to one core
# with taskset (shard a on CPU 0, shard b on CPU 1), each with its producer and workers on the same
# core, as two hosts of one core each would be.  Three figures, medians of REPS alternating rounds:
#
#   scale          enqueue + drain (`pgjobq bench mixed` at a rate neither core keeps up with) on a
#                  and b at once, against a alone: the sum over the one.  Target >= 1.8.
#                  Reported with it: how busy the other core was during the one-shard run.
#   routing cost   B1 (`pgjobq bench enqueue`, batches of 10,000) through a cluster of one shard
#                  (--cluster: pgjobq_cluster_enqueue_many, on a database with a map of one shard)
#                  against the direct path on a database without a map, and B2 (an in-process drain)
#                  on each: target >= 0.95; and the PL/Proxy router's enqueue_many against a shard's
#                  own (reported).
#   locality       a spread queue's jobs over both shards, through the cluster client and one
#                  `pgjobq work --cluster`: each shard's pg_stat_statements shows its own jobs only.
#   blast radius   a's `mixed` at half of what it drains, with b running its own load, then with b
#                  stopped (-m immediate): a's throughput (target >= 0.95) and pickup p99 (target
#                  <= 1.2x); and how long an enqueue for one of b's queues takes to fail while b is
#                  down (within the connect timeout, with the shard named).
#
# Prints a table with each target met or missed, and appends every run to
# bench/results/shards.jsonl.  Needs taskset (util-linux), and PL/Proxy for the router's figure
# (skipped without it).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
pgjobq=${PGJOBQ:-$top/build/pgjobq}
quick=${QUICK:-0}
if [ "$quick" = 1 ]; then
    reps=${REPS:-1}; secs=10; bulk=20000
else
    reps=${REPS:-3}; secs=20; bulk=100000
fi
rate=${SHARD_RATE:-40000}    # offered per shard in the scale runs: more than one core drains
results="$here/results"
mkdir -p "$results"
runs="$results/shards.jsonl"
: > "$runs"
[ "$(nproc)" -ge 2 ] || { echo "bench/shards.sh: needs 2 CPUs" >&2; exit 69; }
command -v taskset >/dev/null 2>&1 || { echo "bench/shards.sh: needs taskset (util-linux)" >&2; exit 69; }

bindir=${PGJOBQ_PG_BINDIR:-}
if [ -z "$bindir" ]; then
    for d in $(pg_config --bindir 2>/dev/null) $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$d/initdb" ]; then bindir=$d; break; fi
    done
fi
[ -n "$bindir" ] || { echo "bench/shards.sh: PostgreSQL's server programs not found" >&2; exit 69; }
as_owner() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
top_dir=$(mktemp -d /tmp/pgjobq-shards-XXXXXX)
[ "$(id -u)" = 0 ] && chown postgres "$top_dir"
cleanup() {
    for s in a b; do
        [ -d "$top_dir/$s/data" ] && as_owner "$bindir/pg_ctl" -D "$top_dir/$s/data" -m immediate stop >/dev/null 2>&1
    done
    rm -rf "$top_dir"
}
trap cleanup EXIT INT TERM

cpu_of() { if [ "$1" = a ]; then echo 0; else echo 1; fi; }
start() { # start SHARD: its server, held to its core
    as_owner "$bindir/pg_ctl" -D "$top_dir/$1/data" -l "$top_dir/$1/server.log" -w \
        -o "-c listen_addresses=''" start >/dev/null
    pid=$(head -n 1 "$top_dir/$1/data/postmaster.pid")
    # The postmaster's children inherit its core; those it already has are moved too.
    for p in $pid $(pgrep -P "$pid" 2>/dev/null || true); do taskset -pc "$(cpu_of "$1")" "$p" >/dev/null; done
}
stop() { as_owner "$bindir/pg_ctl" -D "$top_dir/$1/data" -m "${2:-fast}" stop >/dev/null; }
for s in a b; do
    mkdir -p "$top_dir/$s"
    [ "$(id -u)" = 0 ] && chown postgres "$top_dir/$s"
    as_owner "$bindir/initdb" -D "$top_dir/$s/data" -A trust -U postgres -E UTF8 --locale=C >/dev/null
    cat >> "$top_dir/$s/data/postgresql.conf" <<EOF
unix_socket_directories = '$top_dir/$s'
max_connections = 200
shared_buffers = 256MB
max_wal_size = 4GB
checkpoint_timeout = 30min
fsync = on
synchronous_commit = ${SHARD_SYNC:-on}
shared_preload_libraries = 'pg_stat_statements'
EOF
    start "$s"
    "$bindir/psql" -X -q -h "$top_dir/$s" -U postgres -d postgres -c "CREATE DATABASE jobs"
done
A="host=$top_dir/a user=postgres dbname=jobs"
B="host=$top_dir/b user=postgres dbname=jobs"
"$pgjobq" --db "$A" migrate >/dev/null
"$pgjobq" --db "$B" migrate >/dev/null

echo "# pgjobq bench shards: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, $reps rounds, medians"
field() { sed -n "s/.*\"$1\":\\([0-9.]*\\).*/\\1/p" | tail -n 1; }
mixed() { # mixed SHARD RATE -> the JSON line of a `pgjobq bench mixed` on that shard's core
    db=$A; [ "$1" = b ] && db=$B
    taskset -c "$(cpu_of "$1")" "$pgjobq" bench mixed --db "$db" --rate "$2" --seconds "$secs" \
        --processes 1 --concurrency 32 --json
}
record() { echo "{\"name\":\"$1\",\"round\":$2,${3#\{}" >> "$runs"; }
median() { sort -n | awk '{ v[n++] = $1 } END { if (n == 0) print "nan"; else print (n % 2 ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2) }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }'; }
verdict() { awk -v v="$1" -v op="$2" -v t="$3" 'BEGIN { ok = (op == ">=" ? v >= t : v <= t); print (v == "nan" ? "no figure" : ok ? "met" : "MISSED") }'; }

cpu_busy() { # cpu_busy N -> "busy total" jiffies of CPU N so far (/proc/stat)
    awk -v c="cpu$1" '$1 == c { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t }' /proc/stat
}

# --- scale -----------------------------------------------------------------------------------------
r=1
while [ "$r" -le "$reps" ]; do
    c0=$(cpu_busy 1)
    one=$(mixed a "$rate")
    c1=$(cpu_busy 1)
    record scale_one "$r" "$one"
    # How busy core 1 (no shard's) was meanwhile: the kernel's and the disk's share that the one-shard
    # run borrows from it, and the two-shard run must find on its own cores.
    awk -v a="$c0" -v b="$c1" 'BEGIN { split(a, x, " "); split(b, y, " "); t = y[2] - x[2]; if (t > 0) printf "%.3f\n", (y[1] - x[1]) / t }' >> "$top_dir/other_core"
    mixed a "$rate" > "$top_dir/ma" & pa=$!
    mixed b "$rate" > "$top_dir/mb" & pb=$!
    wait "$pa" "$pb"
    record scale_two_a "$r" "$(cat "$top_dir/ma")"
    record scale_two_b "$r" "$(cat "$top_dir/mb")"
    v1=$(echo "$one" | field jobs_per_s)
    v2=$(awk -v a="$(field jobs_per_s < "$top_dir/ma")" -v b="$(field jobs_per_s < "$top_dir/mb")" 'BEGIN { print a + b }')
    echo "$v1 $v2" >> "$top_dir/scale"
    echo "scale round $r: one shard $v1 jobs/s, two shards $v2 jobs/s"
    r=$((r + 1))
done
one_m=$(cut -d' ' -f1 "$top_dir/scale" | median)
two_m=$(cut -d' ' -f2 "$top_dir/scale" | median)
scale=$(ratio "$two_m" "$one_m")
other_core=$(median < "$top_dir/other_core")

# --- what the machine gives PostgreSQL itself: pgbench, the same shape ---------------------------------
# The same servers and cores, pgbench instead of pgjobq: select-only (-S: CPU and memory, no disk) and
# simple-update (-N: a commit, its WAL flush, per transaction), one shard alone against both at once.
# The ceiling of the scale figure on this machine: what two one-core PostgreSQL servers get over one
# when pgjobq is not involved at all.
pgb_tps() { # pgb_tps SHARD MODE -> tps of a pgbench on that shard's core
    taskset -c "$(cpu_of "$1")" "$bindir/pgbench" -h "$top_dir/$1" -U postgres -n "$2" -c 8 -j 1 -T "$pgb_secs" pgb 2>/dev/null |
        sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -n 1
}
pgb_secs=$([ "$quick" = 1 ] && echo 5 || echo 10)
for s in a b; do
    "$bindir/psql" -X -q -h "$top_dir/$s" -U postgres -d postgres -c "CREATE DATABASE pgb"
    "$bindir/pgbench" -q -i -s 10 -h "$top_dir/$s" -U postgres pgb >/dev/null 2>&1
done
r=1
while [ "$r" -le "$reps" ]; do
    for mode in -S -N; do
        one=$(pgb_tps a "$mode")
        pgb_tps a "$mode" > "$top_dir/pa" & pa=$!
        pgb_tps b "$mode" > "$top_dir/pb" & pb=$!
        wait "$pa" "$pb"
        two=$(awk -v a="$(cat "$top_dir/pa")" -v b="$(cat "$top_dir/pb")" 'BEGIN { print a + b }')
        echo "{\"name\":\"pgbench$mode\",\"round\":$r,\"one\":${one:-0},\"two\":$two}" >> "$runs"
        echo "$(ratio "$two" "${one:-0}")" >> "$top_dir/pgb$mode"
        echo "pgbench $mode round $r: one server $one tps, two servers $two tps"
    done
    r=$((r + 1))
done
pgb_read=$(median < "$top_dir/pgb-S")
pgb_write=$(median < "$top_dir/pgb-N")
scale_rel=$(ratio "$scale" "$pgb_write")
if [ "${SHARD_ONLY:-}" = scale ]; then
    echo
    echo "| scale: 2 shards / 1 (a core each; $one_m and $two_m jobs/s) | $scale | >= 1.8 | $(verdict "$scale" ">=" 1.8) |"
    echo "| the same for pgbench -S (no disk) / -N (a commit each) | $pgb_read / $pgb_write | the machine's ceiling | |"
    echo "| scale / pgbench -N's | $scale_rel | reported | |"
    echo "| the other core's use during the one-shard run (kernel, disk) | $other_core | reported | |"
    exit 0
fi

# --- routing cost ----------------------------------------------------------------------------------
# Two fresh databases of a's server, side by side: "none" without a map (today's direct path) and "one"
# with a map of one shard (which gives it every partition: no guard), alternating.  B1 goes through
# the cluster client (--cluster) on one, directly on none; B2 (an in-process drain, 1 process x 32) on
# each: a worker over a cluster of one shard is one engine on that database.
for db in none one; do
    "$bindir/psql" -X -q -h "$top_dir/a" -U postgres -d postgres -c "CREATE DATABASE $db"
done
NONE="host=$top_dir/a user=postgres dbname=none"
ONE="host=$top_dir/a user=postgres dbname=one"
"$pgjobq" --db "$NONE" migrate >/dev/null
"$pgjobq" --db "$ONE" migrate >/dev/null
map_one="{\"name\": \"one\", \"epoch\": 1, \"partitions\": 1, \"shards\": {\"one\": {\"number\": 0, \"conninfo\": \"$ONE\"}}, \"owners\": [\"one\"]}"
"$bindir/psql" -X -q "$ONE" -c "SELECT pgjobq.cluster_set('$map_one', 'one')" >/dev/null
# Three rounds for each of the others' (a round is a few seconds, and the two sides run the same
# code but for the routing: what differs is mostly noise), each side first in turn.
r=1
while [ "$r" -le $((reps * 3)) ]; do
    order="direct routed"; [ $((r % 2)) = 0 ] && order="routed direct"
    for how in $order; do
        if [ "$how" = direct ]; then
            out=$(taskset -c 0 "$pgjobq" bench enqueue --db "$NONE" --jobs "$bulk" --batch 10000 --json)
            dr=$(taskset -c 0 "$pgjobq" bench drain --db "$NONE" --jobs "$bulk" --processes 1 --concurrency 32 --json)
        else
            out=$(taskset -c 0 "$pgjobq" bench enqueue --db "$ONE" --cluster "$ONE" --jobs "$bulk" --batch 10000 --json)
            dr=$(taskset -c 0 "$pgjobq" bench drain --db "$ONE" --jobs "$bulk" --processes 1 --concurrency 32 --json)
        fi
        record "routing_$how" "$r" "$out"
        record "routing_drain_$how" "$r" "$dr"
        echo "$how $(echo "$out" | field jobs_per_s) $(echo "$dr" | field jobs_per_s)" >> "$top_dir/routing"
    done
    r=$((r + 1))
done
direct_m=$(awk '$1 == "direct" { print $2 }' "$top_dir/routing" 2>/dev/null | median)
routed_m=$(awk '$1 == "routed" { print $2 }' "$top_dir/routing" 2>/dev/null | median)
routing=$(ratio "${routed_m:-0}" "${direct_m:-0}")
drain_direct_m=$(awk '$1 == "direct" { print $3 }' "$top_dir/routing" 2>/dev/null | median)
drain_routed_m=$(awk '$1 == "routed" { print $3 }' "$top_dir/routing" 2>/dev/null | median)
routing_drain=$(ratio "${drain_routed_m:-0}" "${drain_direct_m:-0}")

# The router (PL/Proxy), when installed: enqueue_many of 1,000 jobs through it (to the shard "one")
# against the shard's own.
router=nan
if "$bindir/psql" -X -q "$A" -Atc "SELECT 1 FROM pg_available_extensions WHERE name = 'plproxy'" | grep -q 1; then
    "$bindir/psql" -X -q -h "$top_dir/a" -U postgres -d postgres -c "CREATE DATABASE router"
    R="host=$top_dir/a user=postgres dbname=router"
    "$pgjobq" --db "$R" migrate --router >/dev/null
    "$bindir/psql" -X -q "$R" -c "SELECT pgjobq.cluster_set('$map_one', NULL)" >/dev/null
    q="SELECT count(*) FROM pgjobq.enqueue_many(ARRAY(SELECT 'viarouter' FROM generate_series(1, 1000)), NULL, NULL)"
    for i in 1 2 3 4 5; do
        for how in direct router; do
            db=$ONE; [ "$how" = router ] && db=$R
            t0=$(date +%s.%N)
            "$bindir/psql" -X -q "$db" -Atc "$q" >/dev/null
            t1=$(date +%s.%N)
            echo "$how $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", 1000 / (b - a) }')" >> "$top_dir/router"
        done
    done
    router=$(ratio "$(awk '$1 == "router" { print $2 }' "$top_dir/router" | median)" \
                   "$(awk '$1 == "direct" { print $2 }' "$top_dir/router" | median)")
fi

# --- blast radius ----------------------------------------------------------------------------------
half=$(awk -v v="$one_m" 'BEGIN { printf "%d", v / 2 }')
r=1
while [ "$r" -le "$reps" ]; do
    mixed a "$half" > "$top_dir/ba" & pa=$!
    mixed b "$half" > "$top_dir/bb" & pb=$!
    wait "$pa" "$pb"
    record blast_both "$r" "$(cat "$top_dir/ba")"
    stop b immediate
    down=$(mixed a "$half")
    record blast_b_down "$r" "$down"
    echo "$(field jobs_per_s < "$top_dir/ba") $(field p99_ms < "$top_dir/ba") $(echo "$down" | field jobs_per_s) $(echo "$down" | field p99_ms)" >> "$top_dir/blast"
    start b
    r=$((r + 1))
done
tp=$(ratio "$(cut -d' ' -f3 "$top_dir/blast" | median)" "$(cut -d' ' -f1 "$top_dir/blast" | median)")
p99=$(ratio "$(cut -d' ' -f4 "$top_dir/blast" | median)" "$(cut -d' ' -f2 "$top_dir/blast" | median)")
# An enqueue for b's queue while b is down, through a cluster of a and b (the client's connect timeout).
fail_s=nan fail_msg=
if true; then
    map="{\"name\": \"blast\", \"epoch\": 1, \"id_floor\": 4000000000000, \"partitions\": 2, \"shards\": {\"a\": {\"number\": 0, \"conninfo\": \"$A\"}, \"b\": {\"number\": 1, \"conninfo\": \"$B\"}}, \"owners\": [\"a\", \"b\"], \"queues\": {\"ofb\": {\"placement\": \"pinned\", \"partition\": 1}}}"
    "$bindir/psql" -X -q "$A" -c "SELECT pgjobq.cluster_set('$map', 'a')" >/dev/null
    stop b immediate
    t0=$(date +%s.%N)
    fail_msg=$("$pgjobq" enqueue --cluster "$A" -q ofb '{}' 2>&1 >/dev/null | head -n 1 || true)
    t1=$(date +%s.%N)
    fail_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
    start b
fi

# --- locality ----------------------------------------------------------------------------------------
# A spread queue over both shards (a map of two, half of the partitions each), jobs enqueued one by one
# through the cluster client (`pgjobq enqueue --cluster`, a routing key each) and drained by one
# `pgjobq work --cluster`; then each shard's pg_stat_statements: the rows its enqueue and completion
# statements returned must be its own jobs (a claim's rows are its jobs and where it got to: shown), and the two shards' jobs all the jobs: no job
# touched the other shard.
loc_n=$([ "$quick" = 1 ] && echo 100 || echo 400)
for s in a b; do
    "$bindir/psql" -X -q -h "$top_dir/$s" -U postgres -d postgres -c "CREATE DATABASE loc"
done
LA="host=$top_dir/a user=postgres dbname=loc"
LB="host=$top_dir/b user=postgres dbname=loc"
owners=$(awk 'BEGIN { for (i = 0; i < 64; i++) printf "%s\"%s\"", i ? ", " : "", i < 32 ? "a" : "b" }')
map_loc="{\"name\": \"loc\", \"epoch\": 1, \"partitions\": 64, \"shards\": {\"a\": {\"number\": 0, \"conninfo\": \"$LA\"}, \"b\": {\"number\": 1, \"conninfo\": \"$LB\"}}, \"owners\": [$owners], \"queues\": {\"loc\": {\"placement\": \"spread\"}}}"
for s in a b; do
    db=$LA; [ "$s" = b ] && db=$LB
    "$pgjobq" --db "$db" migrate >/dev/null
    "$bindir/psql" -X -q "$db" -c "SELECT pgjobq.cluster_set('$map_loc', '$s')" -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" \
        -c "SELECT pg_stat_statements_reset()" >/dev/null
done
i=1
while [ "$i" -le "$loc_n" ]; do
    "$pgjobq" enqueue --cluster "$LA" -q loc --route-key "tenant-$i" "{\"n\": $i}" >/dev/null
    i=$((i + 1))
done
"$pgjobq" work --cluster "$LA" -q loc --burst --exec /bin/true >/dev/null 2>&1
loc_ok=met loc_sum=0 loc_rows=
for s in a b; do
    db=$LA; [ "$s" = b ] && db=$LB
    row=$("$bindir/psql" -X -q "$db" -Atc "SELECT (SELECT count(*) FROM pgjobq.history WHERE queue = 'loc' AND state = 'completed')
        || ' ' || (SELECT coalesce(sum(rows), 0) FROM pg_stat_statements WHERE query ~ 'pgjobq\.enqueue')
        || ' ' || (SELECT coalesce(sum(rows), 0) FROM pg_stat_statements WHERE query ~ 'pgjobq\.claim_next')
        || ' ' || (SELECT coalesce(sum(rows), 0) FROM pg_stat_statements WHERE query ~ 'pgjobq\.complete_many')")
    set -- $row
    loc_rows="$loc_rows $s: $1 jobs, enqueue $2, complete $4 rows (claim $3: with the rows that say where it got to);"
    loc_sum=$((loc_sum + $1))
    [ "$1" -gt 0 ] && [ "$1" = "$2" ] && [ "$1" = "$4" ] || loc_ok=MISSED
done
[ "$loc_sum" = "$loc_n" ] || loc_ok=MISSED
echo "{\"name\":\"locality\",\"round\":1,\"jobs\":$loc_n,\"completed\":$loc_sum,\"verdict\":\"$loc_ok\",\"per_shard\":\"${loc_rows# }\"}" >> "$runs"

echo
echo "| figure | value | target | |"
echo "|---|---|---|---|"
echo "| scale: 2 shards / 1 (a core each; $one_m and $two_m jobs/s) | $scale | >= 1.8 | $(verdict "$scale" ">=" 1.8) |"
echo "| locality: $loc_n jobs of a spread queue over 2 shards, each shard's statements (pg_stat_statements) | $loc_sum completed;$loc_rows | each job on one shard only | $loc_ok |"
echo "| the same for pgbench -S (no disk) / -N (a commit each): the machine's ceiling | $pgb_read / $pgb_write | reported | |"
echo "| scale / pgbench -N's | $scale_rel | reported | |"
echo "| the other core's use during the one-shard run (kernel, disk) | $other_core | reported | |"
echo "| routing cost: B1 of $bulk jobs, routed (a cluster of 1 shard) / direct ($routed_m and $direct_m jobs/s) | $routing | >= 0.95 | $(verdict "$routing" ">=" 0.95) |"
echo "| routing cost: B2 drain of $bulk jobs, a shard of a cluster of 1 / a database without a map ($drain_routed_m and $drain_direct_m jobs/s) | $routing_drain | >= 0.95 | $(verdict "$routing_drain" ">=" 0.95) |"
echo "| the router's enqueue_many of 1,000 / a shard's own | $router | reported | |"
echo "| blast radius: a's throughput, b stopped / b running | $tp | >= 0.95 | $(verdict "$tp" ">=" 0.95) |"
echo "| blast radius: a's pickup p99, b stopped / b running | $p99 | <= 1.2 | $(verdict "$p99" "<=" 1.2) |"
echo "| an enqueue for b while b is down fails in (s) | $fail_s | the connect timeout | $fail_msg |"
