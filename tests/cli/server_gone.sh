#!/bin/sh
# The lock server goes away while COMMAND runs: the lease cannot be renewed,
# so the lock counts as lost when it runs out; dlock stops COMMAND and exits
# 76 (not killed by SIGPIPE on the dead connection, COMMAND left orphaned).
# Uses a redis-server of its own, on a unix socket, to be able to kill it.
. "$(dirname "$0")/lib.sh"

command -v redis-server >/dev/null || { fail "redis-server is not installed"; finish; }
SOCK=$WORK/redis.sock
redis-server --port 0 --unixsocket "$SOCK" --dir "$WORK" --save '' --appendonly no \
    --loglevel warning >"$WORK/redis.log" 2>&1 &
REDIS=$!
BG_PIDS="$BG_PIDS $REDIS"
n=0
until "$DLOCK" --url "unix://$SOCK" status probe >/dev/null 2>&1; do
    n=$((n + 1))
    if [ "$n" -gt 600 ] || ! kill -0 "$REDIS" 2>/dev/null; then
        fail "redis-server did not start: $(cat "$WORK/redis.log")"
        finish
    fi
    sleep 0.05
done

N=$(name g)
"$DLOCK" --url "unix://$SOCK" run --ttl 3s "$N" -- sh -c 'echo $$ > "$0"; n=0
    while [ $n -lt 600 ]; do sleep 0.05; n=$((n + 1)); done; echo yes > "$0.survived"' \
    "$WORK/cmd" 2>"$WORK/err" &
PID=$!
BG_PIDS="$BG_PIDS $PID"
wait_file "$WORK/cmd"
CHILD=$(cat "$WORK/cmd")
CHILD_PIDS="$CHILD_PIDS $CHILD"

kill -TERM "$REDIS"
wait "$REDIS"
expect_bg 76 "server gone: lock lost, exit 76" "$PID"
grep_file "^dlock: lost the lock '$N'" "$WORK/err" "server gone: message on stderr"
if [ -e "$WORK/cmd.survived" ] || kill -0 "$CHILD" 2>/dev/null; then
    fail "server gone: COMMAND was not stopped"
else
    pass "server gone: COMMAND stopped"
fi

finish
