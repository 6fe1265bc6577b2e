#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# What flock users expect: -c STRING runs through /bin/sh -c; --wait alone
# waits as long as it takes (the default stays try-once); COMMAND gets
# DLOCK_HOLDER, the record status reads back.
. "$(dirname "$0")/lib.sh"

N=$(name c)
# -c STRING: a shell's list, with the lock's variables; its status is dlock's.
expect 0 "-c STRING" "$DLOCK" --url "$URL" run "$N" -c 'echo "fence $DLOCK_FENCE"; echo "name $DLOCK_NAME"'
grep_file "^fence [0-9]+$" "$WORK/out" "-c: the first command of the list ran, with DLOCK_FENCE"
grep_file "^name $N$" "$WORK/out" "-c: the second ran, with DLOCK_NAME"
expect 3 "-c 'exit 3'" "$DLOCK" --url "$URL" run -c 'exit 3' "$N"
expect 64 "-c and -- COMMAND" "$DLOCK" --url "$URL" run "$N" -c true -- true
grep_file 'give one of them' "$WORK/err" "-c and --: the message says so"
expect 64 "-c without STRING" "$DLOCK" --url "$URL" run "$N" -c

# DLOCK_HOLDER: "HOST PID START_MS LABEL", the holder status shows.
expect 0 "DLOCK_HOLDER" env D="$DLOCK" U="$URL" "$DLOCK" --url "$URL" run --label "shell test" "$N" -c \
    'echo "holder $DLOCK_HOLDER"; echo "parent $PPID"; "$D" --url "$U" status --json "$DLOCK_NAME"'
holder=$(sed -n 's/^holder //p' "$WORK/out")
parent=$(sed -n 's/^parent //p' "$WORK/out")
start=$(sed -n 's/.*"start_ms": *\([0-9]*\).*/\1/p' "$WORK/out")
case $holder in
"$(hostname) $parent $start shell test") pass "DLOCK_HOLDER is the record status reads ($holder)" ;;
*) fail "DLOCK_HOLDER '$holder', want '$(hostname) $parent $start shell test' ($(cat "$WORK/out"))" ;;
esac

# --wait alone (before NAME, and before --) waits for the holder to finish.
W=$(name w)
hold "$W" holder
"$DLOCK" --url "$URL" run --wait "$W" -- true 2>"$WORK/w1.err" &
W1=$!
"$DLOCK" --url "$URL" run "$W" --wait -- true 2>"$WORK/w2.err" &
W2=$!
BG_PIDS="$BG_PIDS $W1 $W2"
expect 75 "no --wait: tries once" "$DLOCK" --url "$URL" run "$W" -- true
sleep 0.5
alive "$W1" && alive "$W2" && pass "--wait alone: still waiting while the lock is held" ||
    fail "--wait alone: a waiter ended while the lock was held ($(cat "$WORK/w1.err" "$WORK/w2.err"))"
kill -TERM "$HOLDER"
expect_bg 143 "holder stopped" "$HOLDER"
expect_bg 0 "--wait NAME: ran once the holder ended" "$W1"
expect_bg 0 "NAME --wait --: ran once the holder ended" "$W2"
finish
