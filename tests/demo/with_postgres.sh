#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Runs "$@" against a private PostgreSQL server: initdb in a temporary folder,
# a unix socket only (no port to collide on), trust authentication; exports
# DLOCK_DEMO_STORE as its URL; stops the server and removes the folder after.
#   with_postgres.sh COMMAND [ARG...]
set -eu

bindir=""
if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
    bindir=$(dirname "$(command -v pg_ctl)")
else
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then bindir=$d; break; fi
    done
fi
if [ -z "$bindir" ]; then
    echo "with_postgres.sh: the PostgreSQL server (initdb, pg_ctl) is not installed;" \
         "install it with: apt-get install postgresql" >&2
    exit 1
fi

dir=$(mktemp -d /tmp/dlock-demo-pg.XXXXXX)
as=""
# PostgreSQL refuses to run as root: run it as nobody, in a folder nobody owns.
if [ "$(id -u)" -eq 0 ]; then
    chown nobody "$dir"
    chmod 755 "$dir"
    as="runuser -u nobody --"
fi
cleanup() {
    $as "$bindir/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ! $as "$bindir/initdb" -D "$dir/data" -U demo --auth=trust -E UTF8 >"$dir/initdb.log" 2>&1; then
    echo "with_postgres.sh: initdb failed:" >&2
    cat "$dir/initdb.log" >&2
    exit 1
fi
if ! $as "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 \
        -o "-c listen_addresses='' -k $dir -c fsync=off -c synchronous_commit=off" \
        start >/dev/null; then
    echo "with_postgres.sh: the server did not start:" >&2
    cat "$dir/server.log" >&2
    exit 1
fi
export DLOCK_DEMO_STORE="postgresql://demo@/postgres?host=$dir"
status=0
"$@" || status=$?
exit "$status"
