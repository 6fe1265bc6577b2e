#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# A set-user-id dlock (issue 26, item 7): run as an unprivileged user, it
# must not let that user's environment steer the libraries dlock loads. A
# set-user-id root copy of the built dlock, with libdlock and its modules in
# a root-owned folder (its RUNPATH made absolute: the loader ignores
# $ORIGIN for such a program), is run as nobody with
#   LIBMYSQL_PLUGINS / MARIADB_PLUGIN_DIR: a plugin built here, whose
#     constructor writes a marker file if libmariadb loads it (as root);
#   SSLKEYLOGFILE: where libcurl (the etcd backend) would write TLS keys.
# Neither the marker nor the key log may appear. Needs root (CI runs as
# root), cc, cmake, readelf, setpriv, and a folder that is not mounted
# nosuid; without them it says why and fails (exit 77, a skip, only outside
# CI when not root).
set -u
DLOCK=${1:?usage: sh $0 path/to/dlock}
case $DLOCK in /*) ;; *) DLOCK=$PWD/$DLOCK ;; esac
BUILD=$(cd "$(dirname "$DLOCK")/.." && pwd)
TEST=setuid
FAILS=0
fail() { echo "FAIL $TEST: $*" >&2; FAILS=$((FAILS + 1)); }
pass() { echo "ok   $TEST: $*"; }
cannot() {
    if [ "$(id -u)" -ne 0 ] && [ -z "${CI:-}" ]; then
        echo "SKIP $TEST: cannot run: $* (run as root, as CI does)" >&2
        exit 77
    fi
    echo "FAIL $TEST: cannot run: $*" >&2
    exit 1
}

[ "$(id -u)" -eq 0 ] || cannot "needs root to make a set-user-id root program"
for tool in cc cmake readelf setpriv; do
    command -v "$tool" >/dev/null || cannot "$tool not found"
done
[ -r "$BUILD/dlock/mysql.so" ] || cannot "no $BUILD/dlock/mysql.so (build with the MySQL backend)"
# Short: the new RUNPATH must fit where the old one was.
W=$(mktemp -d /tmp/dsXXXXXX) || cannot "mktemp"
trap 'rm -rf "$W"' EXIT INT TERM
chmod 755 "$W"
case ",$(findmnt -no OPTIONS -T "$W")," in
*,nosuid,*) cannot "$W is on a nosuid mount" ;;
esac

# The program, its library and modules, all root's.
mkdir "$W/lib" "$W/bin" "$W/plugin" "$W/out"
chmod 1777 "$W/out" # so that the plugin can mark it when nobody runs it plainly
cp -P "$BUILD"/libdlock.so* "$W/lib/"
cp -r "$BUILD/dlock" "$W/lib/dlock"
cp "$DLOCK" "$W/bin/dlock"
old=$(readelf -d "$W/bin/dlock" | sed -n 's/.*Library r[a-z]*path: \[\(.*\)\]$/\1/p')
[ -n "$old" ] || cannot "no RUNPATH in $DLOCK"
cat >"$W/rpath.cmake" <<EOF2
file(RPATH_CHANGE FILE "$W/bin/dlock" OLD_RPATH "$old" NEW_RPATH "$W/lib")
EOF2
cmake -P "$W/rpath.cmake" || cannot "cannot set the copy's RUNPATH to $W/lib"
chown -R root:root "$W/lib" "$W/bin"
chmod 4755 "$W/bin/dlock"

# The plugin: its constructor marks that it ran, and as whom.
cat >"$W/plugin.c" <<EOF2
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void ran(void)
{
    FILE *f = fopen("$W/out/marker", "w");
    if (f != NULL) {
        fprintf(f, "euid %d\n", (int)geteuid());
        fclose(f);
    }
}
EOF2
cc -shared -fPIC -o "$W/plugin/evil.so" "$W/plugin.c" || cannot "cc of the plugin failed"
chmod 755 "$W/plugin" "$W/plugin/evil.so"

# run WHAT URL [ARGS...]: the copy as nobody, with the hostile variables:
# dlock --url URL ARGS (status NAME when none).
run() {
    what=$1 url=$2
    shift 2
    [ $# -gt 0 ] || set -- status "cli-setuid-$$"
    setpriv --reuid=nobody --regid=nogroup --clear-groups -- \
        env LIBMYSQL_PLUGINS=evil MARIADB_PLUGIN_DIR="$W/plugin" LIBMYSQL_PLUGIN_DIR="$W/plugin" \
        SSLKEYLOGFILE="$W/out/keylog" PGSSLMODE=disable PGSERVICEFILE="$W/out/svc" \
        "$W/bin/dlock" --url "$url" "$@" >"$W/run.out" 2>&1
    echo "  ($what: exit $?: $(head -c 300 "$W/run.out"))"
}

# The copy must really be set-user-id root when nobody runs it: a plugin
# loaded without it would not prove anything.
setpriv --reuid=nobody --regid=nogroup --clear-groups -- "$W/bin/dlock" --version >/dev/null 2>&1 ||
    cannot "nobody cannot run $W/bin/dlock"

run "mysql://" "mysql://dlock:pw@127.0.0.1:1/dlock"
if [ -e "$W/out/marker" ]; then
    fail "LIBMYSQL_PLUGINS: the plugin ran in the set-user-id dlock ($(cat "$W/out/marker"))"
else
    pass "LIBMYSQL_PLUGINS / MARIADB_PLUGIN_DIR: no plugin loaded"
fi
run "etcd://" "etcd://127.0.0.1:1"
if [ -e "$W/out/keylog" ]; then
    fail "SSLKEYLOGFILE: a key log was created ($(stat -c '%U %a' "$W/out/keylog"))"
else
    pass "SSLKEYLOGFILE: no key log"
fi
# -v names what was removed.
run "etcd://, run -v" "etcd://127.0.0.1:1" run -v "cli-setuid-$$" -- true
for v in SSLKEYLOGFILE LIBMYSQL_PLUGINS MARIADB_PLUGIN_DIR PGSSLMODE PGSERVICEFILE; do
    if grep -q "warning: set-user-id program: $v removed from the environment" "$W/run.out"; then
        pass "-v: $v removed, said so"
    else
        fail "-v: no warning that $v was removed: $(cat "$W/run.out")"
    fi
done
[ ! -e "$W/out/keylog" ] && pass "run -v: no key log" || fail "run -v: a key log was created"
# And the same variables still work for a program that is not set-user-id
# (a check that the test's bait is real): the plugin loads.
chmod 0755 "$W/bin/dlock"
rm -f "$W/out/marker"
run "mysql://, not set-user-id" "mysql://dlock:pw@127.0.0.1:1/dlock"
if [ -e "$W/out/marker" ]; then
    pass "the bait works without set-user-id: the plugin ran"
else
    fail "the plugin did not run even without set-user-id: the test proves nothing"
fi

[ "$FAILS" -eq 0 ] || { echo "FAIL $TEST: $FAILS check(s) failed" >&2; exit 1; }
exit 0
