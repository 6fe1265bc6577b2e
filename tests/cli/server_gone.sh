#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# The lock server goes away while COMMAND runs: the lease cannot be renewed,
# so the lock counts as lost when it runs out; dlock stops COMMAND and exits
# 76 (not killed by SIGPIPE on the dead connection, COMMAND left orphaned).
# Uses a server of its own, to be able to kill it (start_private_server):
# etcd's renewals then find the connection refused just as Redis's do.
. "$(dirname "$0")/lib.sh"

start_private_server

N=$(name g)
"$DLOCK" --url "$SERVER_URL" run --ttl 3s "$N" -- sh -c 'echo $$ > "$0"; n=0
    while [ $n -lt 600 ]; do sleep 0.05; n=$((n + 1)); done; echo yes > "$0.survived"' \
    "$WORK/cmd" 2>"$WORK/err" &
PID=$!
BG_PIDS="$BG_PIDS $PID"
wait_file "$WORK/cmd"
CHILD=$(cat "$WORK/cmd")
CHILD_PIDS="$CHILD_PIDS $CHILD"

kill -TERM "$SERVER"
# etcd dies of the SIGTERM: no "Terminated" from the shell.
wait "$SERVER" 2>/dev/null
expect_bg 76 "server gone: lock lost, exit 76" "$PID"
grep_file "^dlock: lost the lock '$N'" "$WORK/err" "server gone: message on stderr"
if [ -e "$WORK/cmd.survived" ] || kill -0 "$CHILD" 2>/dev/null; then
    fail "server gone: COMMAND was not stopped"
else
    pass "server gone: COMMAND stopped"
fi

finish
