#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# dlock elect: one leader at a time runs COMMAND; a new leader once the
# leader stops or is killed; --once; campaigning again after a term; usage.
. "$(dirname "$0")/lib.sh"

# (Background processes are started without dl, so that $! is dlock's pid.)
dl() { "$DLOCK" --url "$URL" "$@"; }

N=$(name e)
expect 0 "--once: runs COMMAND once as leader" dl elect --once "$N" -- \
    sh -c 'echo "$DLOCK_NAME $DLOCK_FENCE" > "$0"' "$WORK/once"
grep_file "^$N [0-9]+$" "$WORK/once" "COMMAND got DLOCK_NAME and DLOCK_FENCE"
expect 3 "--once: COMMAND's status" dl elect --once "$N" -- sh -c 'exit 3'

# A leads; B waits; SIGTERM to A reaches its COMMAND, A resigns and exits
# with COMMAND's status, and B leads.
"$DLOCK" --url "$URL" elect --id a "$N" -- sh -c 'echo $$ > "$0"; exec sleep 60' "$WORK/a.pid" 2>"$WORK/a.err" &
A=$!
BG_PIDS="$BG_PIDS $A"
wait_file "$WORK/a.pid"
CHILD_PIDS="$CHILD_PIDS $(cat "$WORK/a.pid")"
"$DLOCK" --url "$URL" elect --once --id b "$N" -- sh -c 'echo "$DLOCK_FENCE" > "$0"' "$WORK/b.fence" \
    2>"$WORK/b.err" &
B=$!
BG_PIDS="$BG_PIDS $B"
# Only a chance to see B wait: a slow machine makes this weaker, not wrong.
sleep 0.5
if [ -e "$WORK/b.fence" ]; then fail "B ran while A led"; else pass "B waits while A leads"; fi
kill -TERM "$A"
expect_bg 143 "A stopped by SIGTERM, with its COMMAND's status" "$A"
expect_bg 0 "B leads once A resigned" "$B"

# The leader is killed (SIGKILL: it cannot resign): another takes over once
# its lease has run out, with a higher fence.
K=$(name k)
"$DLOCK" --url "$URL" elect --ttl 1s "$K" -- \
    sh -c 'echo $$ > "$1"; echo "$DLOCK_FENCE" > "$0"; exec sleep 60' "$WORK/k1.fence" \
    "$WORK/k1.pid" 2>"$WORK/k1.err" &
K1=$!
BG_PIDS="$BG_PIDS $K1"
wait_file "$WORK/k1.fence"
CHILD_PIDS="$CHILD_PIDS $(cat "$WORK/k1.pid")"
kill -KILL "$K1"
wait "$K1" 2>/dev/null
expect 0 "a new leader after the leader was killed" dl elect --once "$K" -- \
    sh -c 'echo "$DLOCK_FENCE" > "$0"' "$WORK/k2.fence"
if [ "$(cat "$WORK/k2.fence")" -gt "$(cat "$WORK/k1.fence")" ]; then
    pass "the new leader's fence is higher"
else
    fail "fences: killed leader $(cat "$WORK/k1.fence"), new $(cat "$WORK/k2.fence")"
fi

# Without --once, elect campaigns again after COMMAND ends: the second term
# stops it (SIGTERM to dlock, forwarded to COMMAND).
C=$(name c)
"$DLOCK" --url "$URL" elect "$C" -- sh -c 'echo x >> "$0"; if [ "$(wc -l < "$0")" -ge 2 ]; then kill -TERM $PPID; exec sleep 5; fi' \
    "$WORK/terms" 2>"$WORK/c.err" &
CE=$!
BG_PIDS="$BG_PIDS $CE"
wait "$CE"
code=$?
[ "$code" -eq 143 ] && pass "stopped by SIGTERM in its second term (exit 143)" ||
    fail "exit $code, want 143; stderr: $(cat "$WORK/c.err")"
[ "$(wc -l < "$WORK/terms")" -eq 2 ] && pass "two terms" || fail "terms: $(wc -l < "$WORK/terms")"
grep_file "campaigning again" "$WORK/c.err" "says it campaigns again"

expect 64 "elect without NAME" dl elect
expect 64 "elect without COMMAND" dl elect "$N" --
expect 64 "elect takes no --wait" dl elect --wait 1s "$N" -- true
expect 64 "elect --id ''" dl elect --id '' "$N" -- true
expect 69 "elect, server unreachable" "$DLOCK" --url redis://127.0.0.1:1 elect "$N" -- true
finish
