#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# A lock lost while COMMAND runs (here broken with release --force): dlock
# says so on stderr, stops COMMAND with SIGTERM (SIGKILL after --grace if it
# does not stop) and exits 76. The watchdog finds the loss at its next
# renewal, a third of the TTL later.
. "$(dirname "$0")/lib.sh"

# COMMAND: say it is ready, then idle; should it run to its end (30 s: it
# was never stopped), it leaves $WORK/TAG.survived behind. $1 is sh code to
# run first.
idle='eval "$1"; echo $$ > "$0"; n=0
    while [ $n -lt 600 ]; do sleep 0.05; n=$((n + 1)); done; echo yes > "$0.survived"'

# start TAG SETUP [run options...]: dlock in the background; sets PID, CHILD.
start() {
    tag=$1 setup=$2
    shift 2
    "$DLOCK" --url "$URL" run "$@" "$(name "$tag")" -- sh -c "$idle" "$WORK/$tag" "$setup" \
        2>"$WORK/$tag.err" &
    PID=$!
    BG_PIDS="$BG_PIDS $PID"
    wait_file "$WORK/$tag"
    CHILD=$(cat "$WORK/$tag")
    CHILD_PIDS="$CHILD_PIDS $CHILD"
}

stopped() { # TAG WHAT: COMMAND was stopped, not run to its end, and is gone
    if [ -e "$WORK/$1.survived" ]; then
        fail "$2: COMMAND was never stopped"
    elif kill -0 "$CHILD" 2>/dev/null; then
        fail "$2: COMMAND (pid $CHILD) still runs"
    else
        pass "$2"
    fi
}

# COMMAND notes the SIGTERM and exits.
start term 'trap "echo yes > \"\$0.term\"; exit 0" TERM' --ttl 3s
expect 0 "release --force" "$DLOCK" --url "$URL" release --force "$(name term)"
expect_bg 76 "lost lock: exit 76" "$PID"
grep_file "^dlock: lost the lock '$(name term)'" "$WORK/term.err" "lost: message on stderr"
stopped term "lost: COMMAND stopped"
grep_file yes "$WORK/term.term" "lost: COMMAND got SIGTERM"

# COMMAND ignores SIGTERM: SIGKILL after the grace.
start kill 'trap "" TERM' --ttl 3s --grace 500ms
expect 0 "release --force" "$DLOCK" --url "$URL" release --force "$(name kill)"
expect_bg 76 "lost lock, COMMAND ignores SIGTERM: exit 76" "$PID"
grep_file 'sending SIGKILL' "$WORK/kill.err" "SIGKILL after the grace is reported"
stopped kill "COMMAND stopped by SIGKILL"

# --command-status-offset moves COMMAND's status, not dlock's own 76.
start offset 'trap "exit 0" TERM' --ttl 3s --command-status-offset 128
expect 0 "release --force" "$DLOCK" --url "$URL" release --force "$(name offset)"
expect_bg 76 "lost lock with --command-status-offset: still 76" "$PID"

finish
