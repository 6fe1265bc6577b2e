#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# SIGTERM, SIGHUP and SIGINT sent to dlock reach COMMAND, whose exit status
# then passes through; a signal dlock was started with ignored (nohup, a
# background job of a script) stays ignored, for dlock and for COMMAND.
. "$(dirname "$0")/lib.sh"

# COMMAND: trap SIG, say it is ready, idle until the trap exits with CODE,
# or until $WORK/stop-TAG appears (then exit 5). It gives up after 30 s
# (exit 6), so that a signal never forwarded fails the test, not hangs it.
trap_cmd='trap "exit $1" "$2"; echo $$ > "$0"; n=0
    while [ ! -e "$3" ] && [ $n -lt 600 ]; do sleep 0.05; n=$((n + 1)); done
    [ -e "$3" ] && exit 5; exit 6'

# start TAG SIG CODE [prefix...]: start dlock in the background; sets PID.
start() {
    tag=$1 sig=$2 code=$3
    shift 3
    "$@" "$DLOCK" --url "$URL" run "$(name "$tag")" -- \
        sh -c "$trap_cmd" "$WORK/$tag.pid" "$code" "$sig" "$WORK/stop-$tag" &
    PID=$!
    BG_PIDS="$BG_PIDS $PID"
    wait_file "$WORK/$tag.pid"
    CHILD_PIDS="$CHILD_PIDS $(cat "$WORK/$tag.pid")"
}

start term TERM 42
kill -TERM "$PID"
expect_bg 42 "SIGTERM forwarded to COMMAND" "$PID"

start hup HUP 43
kill -HUP "$PID"
expect_bg 43 "SIGHUP forwarded to COMMAND" "$PID"

# A script's background jobs start with SIGINT ignored; env puts it back to
# the default, as in an interactive shell.
start int INT 44 env --default-signal=INT
kill -INT "$PID"
expect_bg 44 "SIGINT forwarded to COMMAND" "$PID"

# COMMAND starts with the dispositions dlock started with (SigIgn bit 2 is
# SIGINT): ignored stays ignored, default stays default.
sigint_ignored='mask=$(sed -n "s/^SigIgn:[[:space:]]*//p" /proc/$$/status);
    if [ $(( 0x$mask & 2 )) -ne 0 ]; then echo ignored; else echo default; fi > "$0"'
(trap '' INT; exec "$DLOCK" --url "$URL" run "$(name ign)" -- sh -c "$sigint_ignored" "$WORK/ign") >"$WORK/out" 2>&1
grep_file '^ignored$' "$WORK/ign" "COMMAND inherits an ignored SIGINT"
env --default-signal=INT "$DLOCK" --url "$URL" run "$(name dfl)" -- sh -c "$sigint_ignored" "$WORK/dfl" >"$WORK/out" 2>&1
grep_file '^default$' "$WORK/dfl" "COMMAND gets SIGINT at its default"

# With SIGHUP ignored (nohup), a hangup is not forwarded: COMMAND (which
# here puts SIGHUP back to the default and traps it) never sees it.
trap '' HUP
"$DLOCK" --url "$URL" run "$(name nohup)" -- env --default-signal=HUP \
    sh -c "$trap_cmd" "$WORK/nohup.pid" 43 HUP "$WORK/stop-nohup" &
PID=$!
trap - HUP
BG_PIDS="$BG_PIDS $PID"
wait_file "$WORK/nohup.pid"
CHILD_PIDS="$CHILD_PIDS $(cat "$WORK/nohup.pid")"
kill -HUP "$PID"
# Time for a (wrongly) forwarded SIGHUP to arrive. A slow machine can only
# make this check miss a bug, never fail a correct dlock.
sleep 0.3
touch "$WORK/stop-nohup"
expect_bg 5 "nohup: SIGHUP not forwarded, COMMAND ran to its end" "$PID"

finish
