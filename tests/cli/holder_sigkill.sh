#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# dlock run killed with SIGKILL (the OOM killer, kill -9) cannot stop its
# COMMAND itself: the kernel does, through the death signal dlock sets for
# COMMAND's process, and with --kill-group a guard process kills COMMAND's
# whole process group. Either way, COMMAND is gone at once, and the next
# holder, which gets the lock when the dead one's lease runs out, never runs
# beside it.
. "$(dirname "$0")/lib.sh"

# A COMMAND that appends a line "A" to MARKS every 50 ms for as long as it
# runs; the shell writes them itself, so the shell is what must die.
ticker='while :; do echo A >> "$1"; sleep 0.05; done'

# next_holder NAME MARKS WHAT: take NAME after the killed holder (whose lease
# nobody renews: free within its --ttl) with a COMMAND that marks its start
# and end in MARKS; then no "A" may follow its start.
next_holder() {
    expect 0 "$3: the next holder runs" "$DLOCK" --url "$URL" run --wait 30s "$1" -- \
        sh -c 'echo B-start >> "$0"; sleep 1; echo B-end >> "$0"' "$2"
    if sed -n '/^B-start$/,$p' "$2" | grep -q '^A$'; then
        fail "$3: the killed holder's COMMAND ran while the next holder's did: $(tr '\n' ' ' <"$2")"
    else
        pass "$3: the next holder's COMMAND ran alone"
    fi
}

# kill_dlock_check_gone PID TAG NAME WHAT WHO: dlock (PID) runs NAME with a
# COMMAND that wrote the pid of the process doing the work (WHO) to
# $WORK/TAG.pid and ticks into $WORK/TAG.marks. SIGKILL dlock: that process
# must be gone, and the next holder of NAME must never overlap it.
kill_dlock_check_gone() {
    BG_PIDS="$BG_PIDS $1"
    wait_file "$WORK/$2.pid"
    worker=$(cat "$WORK/$2.pid")
    CHILD_PIDS="$CHILD_PIDS $worker"
    wait_file "$WORK/$2.marks"
    kill -KILL "$1"
    wait "$1" 2>/dev/null
    # At once, in truth: the kernel sends the death signal as dlock dies. The
    # bound only keeps a slow machine from failing a correct dlock.
    if within 5 gone "$worker"; then
        pass "$4: $5 (pid $worker) is gone too"
    else
        fail "$4: $5 (pid $worker) still runs"
    fi
    next_holder "$3" "$WORK/$2.marks" "$4"
}

# The default: COMMAND is the shell itself.
N=$(name one)
"$DLOCK" --url "$URL" run --ttl 2s "$N" -- sh -c "echo \$\$ > \"\$0\"; $ticker" \
    "$WORK/one.pid" "$WORK/one.marks" 2>"$WORK/one.err" &
kill_dlock_check_gone $! one "$N" "SIGKILL of dlock" "COMMAND"

# --kill-group: the work is done by a child of COMMAND (a shell's background
# job, a pipeline), which the death signal of COMMAND's own process does not
# reach.
G=$(name group)
"$DLOCK" --url "$URL" run --kill-group --ttl 2s "$G" -- \
    sh -c "($ticker) & echo \$! > \"\$0\"; wait" "$WORK/group.pid" "$WORK/group.marks" \
    2>"$WORK/group.err" &
kill_dlock_check_gone $! group "$G" "--kill-group, SIGKILL of dlock" "COMMAND's child"

# --kill-group on the paths dlock controls: whatever COMMAND leaves running
# in its group when it ends is killed before the lock is released ...
expect 0 "--kill-group: COMMAND ends, leaving a child behind" \
    "$DLOCK" --url "$URL" run --kill-group "$(name left)" -- \
    sh -c 'sleep 60 & echo $! > "$0"' "$WORK/left.pid"
LEFT=$(cat "$WORK/left.pid")
CHILD_PIDS="$CHILD_PIDS $LEFT"
if within 5 gone "$LEFT"; then
    pass "--kill-group: the child COMMAND left behind was killed"
else
    fail "--kill-group: the child COMMAND left behind (pid $LEFT) still runs"
fi

# ... a signal to dlock goes to the whole group ...
"$DLOCK" --url "$URL" run --kill-group "$(name term)" -- \
    sh -c '(trap "echo yes > \"$1\"; exit 0" TERM; echo $$ > "$0"; while :; do sleep 0.05; done) &
           wait' "$WORK/term.pid" "$WORK/term.got" 2>"$WORK/term.err" &
PID=$!
BG_PIDS="$BG_PIDS $PID"
wait_file "$WORK/term.pid"
CHILD_PIDS="$CHILD_PIDS $(cat "$WORK/term.pid")"
kill -TERM "$PID"
expect_bg 143 "--kill-group: SIGTERM to dlock" "$PID"
grep_file yes "$WORK/term.got" "--kill-group: COMMAND's child got the SIGTERM"

# ... and a lost lock stops the whole group.
L=$(name lost)
"$DLOCK" --url "$URL" run --kill-group --ttl 3s "$L" -- \
    sh -c '(trap "" TERM; echo $$ > "$0"; while :; do sleep 0.05; done) & wait' \
    "$WORK/lost.pid" 2>"$WORK/lost.err" &
PID=$!
BG_PIDS="$BG_PIDS $PID"
wait_file "$WORK/lost.pid"
LOSTCHILD=$(cat "$WORK/lost.pid")
CHILD_PIDS="$CHILD_PIDS $LOSTCHILD"
expect 0 "release --force" "$DLOCK" --url "$URL" release --force "$L"
expect_bg 76 "--kill-group: lost lock, exit 76" "$PID"
if within 5 gone "$LOSTCHILD"; then
    pass "--kill-group: lost lock: COMMAND's child that ignores SIGTERM was killed"
else
    fail "--kill-group: lost lock: COMMAND's child (pid $LOSTCHILD) still runs"
fi

finish
