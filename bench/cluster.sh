# bench/cluster.sh - sourced by bench/run.sh and bench/soak.sh: starts a throwaway PostgreSQL cluster
# with durable settings (fsync and synchronous_commit on) on a Unix socket only, and stops and removes
# it when the calling script exits.  CLUSTER_CONF: more postgresql.conf lines.  Sets bindir, dir, db,
# as_owner and PGHOST/PGUSER/PGDATABASE.
bindir=${PGJOBQ_PG_BINDIR:-}
if [ -z "$bindir" ]; then
    for d in $(pg_config --bindir 2>/dev/null) $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$d/initdb" ] && [ -x "$d/pgbench" ]; then bindir=$d; break; fi
    done
fi
[ -n "$bindir" ] || { echo "bench: PostgreSQL server programs and pgbench not found (apt-get install postgresql)" >&2; exit 69; }
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
max_connections = 300
shared_buffers = 512MB
max_wal_size = 8GB
checkpoint_timeout = 30min
fsync = on
synchronous_commit = on
full_page_writes = on
shared_preload_libraries = 'pg_stat_statements'
${CLUSTER_CONF:-}
EOF
as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
db="host=$dir user=postgres dbname=postgres"
export PGHOST="$dir" PGUSER=postgres PGDATABASE=postgres
