#!/bin/sh
# ensure-deps.sh [--server | --tests] - makes sure what is needed is here:
#   (nothing)  the build: libpq's and libmicrohttpd's headers and libraries (make, make install);
#   --server   the build and the PostgreSQL server binaries (initdb, pg_ctl, postgres): make demo,
#              make bench, make soak;
#   --tests    all of the above and the test tools: g++ (the C++ header check), headless Chromium and
#              promtool (the dashboard and metrics tests), Python with psycopg 3, psycopg2, SQLAlchemy
#              pytest, pip, wheel and venv (the Python package's tests), Node.js with npm (the client examples),
#              PgBouncer, pg_auto_failover and PL/Proxy (the router of a cluster of shards)
#              (make check, make sanitize, make chaos, make screenshots).
# As root on Debian/Ubuntu it installs what is missing with apt-get; otherwise it stops and prints the
# exact command to run.
set -u

need_server=0
need_tests=0
case "${1:-}" in
    --server) need_server=1 ;;
    --tests) need_server=1; need_tests=1 ;;
    "") ;;
    *) echo "usage: ensure-deps.sh [--server | --tests]" >&2; exit 2 ;;
esac

have_libpq() {
    if command -v pkg-config >/dev/null 2>&1 && pkg-config --exists libpq 2>/dev/null; then
        inc=$(pkg-config --variable=includedir libpq 2>/dev/null)
    elif command -v pg_config >/dev/null 2>&1; then
        inc=$(pg_config --includedir 2>/dev/null)
    else
        return 1
    fi
    [ -f "$inc/libpq-fe.h" ] || [ -f /usr/include/postgresql/libpq-fe.h ]
}

have_server() {
    [ -n "${PGJOBQ_PG_BINDIR:-}" ] && [ -x "$PGJOBQ_PG_BINDIR/initdb" ] && return 0
    if command -v pg_config >/dev/null 2>&1; then
        b=$(pg_config --bindir 2>/dev/null)
        [ -x "$b/initdb" ] && [ -x "$b/postgres" ] && return 0
    fi
    for b in /usr/lib/postgresql/*/bin; do
        [ -x "$b/initdb" ] && [ -x "$b/postgres" ] && return 0
    done
    command -v initdb >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1
}

missing=""
have_libpq || missing="$missing libpq-dev"
command -v pkg-config >/dev/null 2>&1 || command -v pg_config >/dev/null 2>&1 || missing="$missing pkg-config"
[ -f /usr/include/microhttpd.h ] || { command -v pkg-config >/dev/null 2>&1 && pkg-config --exists libmicrohttpd; } ||
    missing="$missing libmicrohttpd-dev"
if [ $need_server = 1 ]; then
    have_server || missing="$missing postgresql postgresql-contrib"
fi
if [ $need_tests = 1 ]; then
    command -v g++ >/dev/null 2>&1 || missing="$missing g++"
    command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
    command -v promtool >/dev/null 2>&1 || missing="$missing prometheus"
    # (wheel and ensurepip: the install line of README.md and docs/python.md, a venv with Debian's packages)
    /usr/bin/python3 -c 'import psycopg, psycopg2, sqlalchemy, pytest, setuptools, pip, wheel, ensurepip' >/dev/null 2>&1 ||
        missing="$missing python3 python3-psycopg python3-psycopg2 python3-sqlalchemy python3-pytest python3-setuptools python3-pip python3-wheel python3-venv"
    command -v node >/dev/null 2>&1 || missing="$missing nodejs"
    command -v npm >/dev/null 2>&1 || missing="$missing npm"
    [ -x /usr/sbin/pgbouncer ] || command -v pgbouncer >/dev/null 2>&1 || missing="$missing pgbouncer"
    # pg_auto_failover (the failover test's HA manager), built for the server's major version (the
    # newest installed, as the tests use; Debian 12's 15 when none is yet).
    major=$(ls /usr/lib/postgresql 2>/dev/null | sort -n | tail -n 1)
    [ -n "$major" ] || major=15
    { command -v pg_autoctl >/dev/null 2>&1 &&
      [ -f "/usr/share/postgresql/$major/extension/pgautofailover.control" ]; } ||
        missing="$missing postgresql-$major-auto-failover"
    # PL/Proxy (the router of a cluster of shards, `pgjobq migrate --router`), for the same server.
    [ -f "/usr/share/postgresql/$major/extension/plproxy.control" ] || missing="$missing postgresql-$major-plproxy"
fi
[ -z "$missing" ] && exit 0

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "pgjobq: installing missing packages:$missing" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2 && apt-get install -y -q --no-install-recommends $missing >&2 && exit 0
    echo "pgjobq: apt-get could not install:$missing" >&2
    exit 1
fi
echo "pgjobq: missing packages:$missing" >&2
if command -v apt-get >/dev/null 2>&1; then
    echo "pgjobq: install them with: sudo apt-get install -y$missing" >&2
else
    echo "pgjobq: install libpq (headers included) and the PostgreSQL server binaries, or set PGJOBQ_PG_BINDIR" >&2
fi
exit 1
