#!/bin/sh
# The lock server goes away while COMMAND runs: the lease cannot be renewed,
# so the lock counts as lost when it runs out; dlock stops COMMAND and exits
# 76 (not killed by SIGPIPE on the dead connection, COMMAND left orphaned).
# Uses a server of its own, to be able to kill it: a redis-server on a unix
# socket, or with etcd (DLOCK_CLI_BACKEND=etcd) a private etcd member, whose
# renewals then find the connection refused just as Redis's do.
. "$(dirname "$0")/lib.sh"

if [ "$BACKEND" = etcd ]; then
    start_etcd
    SERVER=$ETCD_PID SERVER_URL=$ETCD_URL
else
    command -v redis-server >/dev/null || { fail "redis-server is not installed"; finish; }
    SOCK=$WORK/redis.sock
    redis-server --port 0 --unixsocket "$SOCK" --dir "$WORK" --save '' --appendonly no \
        --loglevel warning >"$WORK/redis.log" 2>&1 &
    SERVER=$!
    SERVER_URL=unix://$SOCK
    BG_PIDS="$BG_PIDS $SERVER"
    n=0
    until "$DLOCK" --url "$SERVER_URL" status probe >/dev/null 2>&1; do
        n=$((n + 1))
        if [ "$n" -gt 600 ] || ! kill -0 "$SERVER" 2>/dev/null; then
            fail "redis-server did not start: $(cat "$WORK/redis.log")"
            finish
        fi
        sleep 0.05
    done
fi

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
