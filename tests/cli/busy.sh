#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# A busy lock: 75 when it cannot be had within --wait (try once by default),
# -E changes that code, and --wait waits for the holder to finish.
. "$(dirname "$0")/lib.sh"

N=$(name b)
hold "$N" holder --label busy-holder

expect 75 "busy, try once" "$DLOCK" --url "$URL" run "$N" -- true
grep_file "^dlock: .*$N" "$WORK/err" "busy: message names the lock"
# Who holds it, as status says it: every backend but Redlock records it.
if [ "$BACKEND" != redlock ]; then
    grep_file "^dlock: $N: held, fence [0-9]+, ttl [0-9]+ ms, holder [^ ]+ pid $HOLDER since [0-9T:.-]+Z \(busy-holder\)$" \
        "$WORK/err" "busy: the holder's host, pid, label and lease left"
fi
expect 75 "busy after --wait 300ms" "$DLOCK" --url "$URL" run --wait 300ms "$N" -- true
expect 9 "busy with -E 9" "$DLOCK" --url "$URL" run -E 9 "$N" -- true
expect 0 "busy with -E 0" "$DLOCK" --url "$URL" run -E 0 "$N" -- true
expect 75 "COMMAND never runs while busy" "$DLOCK" --url "$URL" run "$N" -- touch "$WORK/ran"
if [ -e "$WORK/ran" ]; then fail "COMMAND ran without the lock"; fi
# A COMMAND that cannot run is reported as such (127, 126), not hidden
# behind the busy lock's 75.
expect 127 "busy, COMMAND not found: 127" "$DLOCK" --url "$URL" run --wait 0 "$N" -- "no-such-command-$$"
grep_file 'no-such-command' "$WORK/err" "busy, COMMAND not found: the message names COMMAND"
printf 'echo hi\n' >"$WORK/script"
chmod 644 "$WORK/script"
expect 126 "busy, COMMAND not executable: 126" "$DLOCK" --url "$URL" run --wait 10s "$N" -- "$WORK/script"
# A free lock is not taken (no fence spent) for a COMMAND that cannot run.
F=$(name f)
expect 0 "a free lock's first run" "$DLOCK" --url "$URL" run "$F" -- true
expect 0 "status before" "$DLOCK" --url "$URL" status "$F"
cp "$WORK/out" "$WORK/status.before"
expect 127 "free lock, COMMAND not found: 127" "$DLOCK" --url "$URL" run "$F" -- "no-such-command-$$"
expect 0 "status after" "$DLOCK" --url "$URL" status "$F"
if cmp -s "$WORK/out" "$WORK/status.before"; then
    pass "free lock, COMMAND not found: the lock was not taken ($(cat "$WORK/out"))"
else
    fail "free lock, COMMAND not found: status went from '$(cat "$WORK/status.before")' to '$(cat "$WORK/out")'"
fi

# SIGTERM to the holder's dlock reaches its sleep, which dies of it: 128+15.
kill -TERM "$HOLDER"
expect_bg 143 "holder stopped by SIGTERM" "$HOLDER"
expect 0 "free again once the holder ended" "$DLOCK" --url "$URL" run "$N" -- true

# --wait: the second run blocks until the first one's COMMAND has finished,
# then runs (its COMMAND checks that the first one's has).
W=$(name w)
"$DLOCK" --url "$URL" run "$W" -- sh -c \
    'echo "$DLOCK_FENCE" > "$0"; while [ ! -e "$1" ]; do sleep 0.05; done; echo done > "$2"' \
    "$WORK/first.fence" "$WORK/go" "$WORK/first.done" &
FIRST=$!
BG_PIDS="$BG_PIDS $FIRST"
wait_file "$WORK/first.fence"
"$DLOCK" --url "$URL" run --wait 30s "$W" -- sh -c \
    'test -s "$0" && echo "$DLOCK_FENCE" > "$1"' "$WORK/first.done" "$WORK/second.fence" &
SECOND=$!
BG_PIDS="$BG_PIDS $SECOND"
# Give the second run time to find the lock busy and start waiting. Only a
# chance to exercise the wait: a slow machine makes this test weaker, never
# wrong.
sleep 0.5
if kill -0 "$SECOND" 2>/dev/null; then
    pass "the waiter is still waiting while the lock is held"
else
    fail "the waiter ended while the lock was held"
fi
touch "$WORK/go"
expect_bg 0 "first run" "$FIRST"
expect_bg 0 "--wait: runs once the first run finished" "$SECOND"
if [ -s "$WORK/second.fence" ] && [ "$(cat "$WORK/second.fence")" -gt "$(cat "$WORK/first.fence")" ]; then
    pass "the waiter got a higher fence"
else
    fail "fences: first $(cat "$WORK/first.fence"), second $(cat "$WORK/second.fence" 2>/dev/null)"
fi

finish
