#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# COMMAND's environment and file descriptors: DLOCK_NAME and DLOCK_FENCE set,
# the fence increasing from run to run; no DLOCK_URL, no URL anywhere, no
# server connection; the descriptors dlock was given are passed on.
. "$(dirname "$0")/lib.sh"

N=$(name e)
# A password the server accepts and that must show up nowhere in COMMAND's
# reach. Redis: the test server's default user has none, so any will do.
# etcd: a private etcd with auth on, so that dlock really logs in with it.
SECRET="s3cret-$$"
if [ "$BACKEND" = etcd ]; then
    start_etcd "$SECRET"
    SECRET_URL="etcd://root:$SECRET@$ETCD_HOSTPORT?insecure_auth=1"
elif [ "$BACKEND" = redlock ]; then
    SECRET_URL="redlock://default:$SECRET@$HOSTS"
elif [ "$BACKEND" = zk ]; then
    # Digest auth: ZooKeeper takes any user:password (it names who made a
    # node), on a private server: with credentials dlock makes /dlock its
    # own (docs/zookeeper.md, "Access control"), which the shared server's other
    # scripts could then not use.
    start_zk
    SECRET_URL="zk://dlock:$SECRET@$ZK"
elif [ "$BACKEND" = postgres ]; then
    # A role of the test's own with that password (scripts/test.sh's server
    # checks passwords on TCP).
    ROLE=cli_env_$$
    pg_sql "CREATE ROLE $ROLE LOGIN SUPERUSER PASSWORD '$SECRET'" >/dev/null ||
        { fail "cannot create role $ROLE"; finish; }
    SECRET_URL="postgres://$ROLE:$SECRET@$HOSTPORT/postgres"
elif [ "$BACKEND" = mysql ]; then
    # The shared MariaDB's own password (scripts/test.sh makes it distinctive).
    SECRET=${URL#*://*:}; SECRET=${SECRET%%@*}
    SECRET_URL=$URL
else
    SECRET_URL="redis://default:$SECRET@$HOSTPORT"
fi

show_env='printf "%s\n%s\n" "$DLOCK_NAME" "$DLOCK_FENCE" > "$0"; env > "$1"'
expect 0 "first run" "$DLOCK" --url "$URL" run "$N" -- sh -c "$show_env" "$WORK/vars1" "$WORK/env1"
# Stale values from an enclosing run must be replaced, not duplicated.
expect 0 "second run" env DLOCK_NAME=stale DLOCK_FENCE=999999 \
    "$DLOCK" --url "$URL" run "$N" -- sh -c "$show_env" "$WORK/vars2" "$WORK/env2"

name1=$(sed -n 1p "$WORK/vars1") fence1=$(sed -n 2p "$WORK/vars1")
fence2=$(sed -n 2p "$WORK/vars2")
[ "$name1" = "$N" ] && pass "DLOCK_NAME is the lock's name" || fail "DLOCK_NAME='$name1', want '$N'"
case $fence1 in
'' | *[!0-9]*) fail "DLOCK_FENCE='$fence1' is not a number" ;;
*) [ "$fence1" -gt 0 ] && pass "DLOCK_FENCE > 0" || fail "DLOCK_FENCE=$fence1" ;;
esac
[ "$fence2" -gt "$fence1" ] 2>/dev/null && [ "$fence2" != 999999 ] &&
    pass "fence increases: $fence1 then $fence2" || fail "fences $fence1 then $fence2"
[ "$(grep -c '^DLOCK_FENCE=' "$WORK/env2")" -eq 1 ] && [ "$(grep -c '^DLOCK_NAME=' "$WORK/env2")" -eq 1 ] &&
    pass "one DLOCK_NAME and one DLOCK_FENCE" || fail "duplicates: $(grep '^DLOCK_' "$WORK/env2")"

# The URL from $DLOCK_URL (with a password): used by dlock, hidden from COMMAND.
expect 0 "run with \$DLOCK_URL" env DLOCK_URL="$SECRET_URL" \
    "$DLOCK" run "$N" -- sh -c 'env > "$0"' "$WORK/env3"
grep -q '^DLOCK_URL=' "$WORK/env3" && fail "DLOCK_URL is in COMMAND's environment" ||
    pass "DLOCK_URL is not in COMMAND's environment"
grep -q "$SECRET" "$WORK/env3" && fail "the password is in COMMAND's environment" ||
    pass "the password is nowhere in COMMAND's environment"

# The URL from --url: not in the environment, and blanked from dlock's own
# command line, which COMMAND (and every user) can read.
expect 0 "run with --url" "$DLOCK" --url "$SECRET_URL" run "$N" -- \
    sh -c 'env > "$0"; tr "\0" " " < /proc/$PPID/cmdline > "$1"' "$WORK/env4" "$WORK/cmdline"
grep -q "$SECRET" "$WORK/env4" && fail "the --url password is in COMMAND's environment" ||
    pass "the --url password is not in COMMAND's environment"
grep -q "$SECRET" "$WORK/cmdline" && fail "the password stays on dlock's command line: $(cat "$WORK/cmdline")" ||
    pass "the password is blanked from dlock's command line"

# Core dumps and debuggers (docs/cli.md, "Secrets"): dlock, which holds the
# URL and its password, runs with a core limit of 0 and is not dumpable;
# COMMAND gets the caller's core limit back, and is dumpable again. Whether
# a process is dumpable shows in the owner of its /proc/PID files: root:root
# when it is not, its own uid:gid when it is. As root the uid cannot tell,
# so dlock runs with group nobody (setpriv) and the gid tells.
ulimit -S -c 2000 2>/dev/null || ulimit -S -c "$(ulimit -H -c)"
caller_core=$(grep '^Max core file size' /proc/$$/limits)
case $caller_core in
*"size        0 "*) fail "cannot raise the core limit of the test (hard limit 0): the check would prove nothing" ;;
esac
as_user=""
[ "$(id -u)" = 0 ] && as_user="setpriv --regid 65534 --clear-groups"
want_owner="$(id -u) $(id -g)"
[ -n "$as_user" ] && want_owner="0 65534"
# Under AddressSanitizer the runtime sets the core limit to 0 itself
# (disable_coredump): ask it not to, so that the checks see dlock's doing.
# shellcheck disable=SC2086 # as_user is split on purpose
expect 0 "run with a password, COMMAND reads the limits" env DLOCK_URL="$SECRET_URL" \
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}disable_coredump=0" $as_user \
    "$DLOCK" run "$N" -- sh -c 'grep "^Max core file size" /proc/$PPID/limits > "$0";
        grep "^Max core file size" /proc/$$/limits > "$1";
        stat -c "%u %g" /proc/$PPID/environ > "$2"; stat -c "%u %g" /proc/$$/environ > "$3"' \
    "$WORK/dlock-core" "$WORK/command-core" "$WORK/dlock-owner" "$WORK/command-owner"
case $(cat "$WORK/dlock-core") in
*"size        0 "*) pass "dlock's core limit is 0" ;;
*) fail "dlock's core limit is not 0: $(cat "$WORK/dlock-core")" ;;
esac
[ "$(cat "$WORK/command-core")" = "$caller_core" ] && pass "COMMAND has the caller's core limit" ||
    fail "COMMAND's core limit is '$(cat "$WORK/command-core")', the caller's '$caller_core'"
[ "$(cat "$WORK/dlock-owner")" = "0 0" ] && pass "dlock is not dumpable" ||
    fail "dlock is dumpable: its /proc/PID/environ belongs to $(cat "$WORK/dlock-owner"), not 0 0"
[ "$(cat "$WORK/command-owner")" = "$want_owner" ] && pass "COMMAND is dumpable" ||
    fail "COMMAND is not dumpable: its /proc/PID/environ belongs to $(cat "$WORK/command-owner"), not $want_owner"

# Descriptors: fd 7 given to dlock reaches COMMAND; the server connections
# dlock opened (sockets) do not.
(
    exec 7>"$WORK/seven"
    "$DLOCK" --url "$URL" run "$N" -- sh -c 'echo via-fd-7 >&7; ls -l /proc/$$/fd > "$0"' "$WORK/fds"
) >"$WORK/out" 2>"$WORK/err"
grep_file '^via-fd-7$' "$WORK/seven" "an inherited fd reaches COMMAND"
if grep -q 'socket:' "$WORK/fds"; then
    fail "COMMAND inherited a socket: $(cat "$WORK/fds")"
else
    pass "no server connection leaks into COMMAND"
fi
[ "$BACKEND" = postgres ] && pg_sql "DROP ROLE $ROLE" >/dev/null

finish
