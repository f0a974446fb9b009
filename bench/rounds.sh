# bench/rounds.sh - what bench/durable.sh, bench/aging.sh and bench/strict.sh share: sourced after
# bench/cluster.sh (which sets $db and $bindir) with $pgjobq and $runs (a JSON-lines file) set.
#
#   sql TEXT                 run one statement on the cluster, print its rows
#   run NAME ROUND ARGS...   one `pgjobq bench --json ARGS...`, its JSON recorded in $runs under NAME
#   m NAME FIELD             the median of FIELD over the runs recorded under NAME ("nan": none)
#   ratio A B                A / B to two decimals ("nan" when either is missing or B is 0)
#   verdict V OP T           "met" when V OP T holds (OP: >=, < or <=), "MISSED", or "no figure"

sql() { "$bindir/psql" -X -q -At -c "$1"; }
run() {
    name=$1; round=$2; shift 2
    out=$("$pgjobq" --db "$db" bench --json "$@")
    echo "{\"name\":\"$name\",\"round\":$round,${out#\{}" >> "$runs"
}
m() {
    grep "\"name\":\"$1\"," "$runs" | sed -n "s/.*\"$2\":\([-0-9.]*\).*/\1/p" | sort -g |
        awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "nan" || b == "nan" || b + 0 == 0) print "nan"; else printf "%.2f", a / b }'; }
verdict() { awk -v v="$1" -v op="$2" -v t="$3" 'BEGIN { ok = (op == ">=" ? v >= t : op == "<" ? v < t : v <= t); print (v == "nan" ? "no figure" : ok ? "met" : "MISSED") }'; }
