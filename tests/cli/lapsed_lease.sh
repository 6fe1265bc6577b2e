#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# The lease runs out while the server does not answer, and COMMAND ends
# before the watchdog has noticed (issue 19, item 1). The server is paused
# (SIGSTOP): connections stay open and requests go unanswered, so the
# watchdog's renewal, sent a third of --ttl after the lock was taken, waits
# for its command timeout (5 s) before anyone learns anything. COMMAND
# outlives the 3 s lease by 0.7 s and exits 0 in that window; dlock must
# still exit 76, not COMMAND's 0: by the library's own deadline the lock was
# gone before COMMAND ended, and another holder may have run beside it. (The
# release then times out on the paused server, and its lease runs out there.)
# Uses a server of its own (start_private_server), to pause it.
. "$(dirname "$0")/lib.sh"

start_private_server

# COMMAND: pause the server ($1), outlive the lease by 0.7 s, note that it
# ran to its end ($0.done) and exit 0.
lapse='kill -STOP "$1"; sleep 3.7; echo yes > "$0.done"; exit 0'

# lapsed TAG WHAT SUBCOMMAND [OPTIONS...]: run it with that COMMAND; exit 76.
lapsed() {
    tag=$1 what=$2
    shift 2
    expect 76 "$what" "$DLOCK" --url "$SERVER_URL" "$@" --ttl 3s "$(name "$tag")" -- \
        sh -c "$lapse" "$WORK/$tag" "$SERVER"
    kill -CONT "$SERVER"
    grep_file "^dlock: .*'$(name "$tag")'.*lease ran out" "$WORK/err" "$what: stderr says why"
    # The window itself: COMMAND ended by itself, before dlock found the
    # loss. Only a machine too loaded to wake a sleep within 2 s makes the
    # watchdog find it first (and dlock stop COMMAND, exit 76 all the same).
    if [ -e "$WORK/$tag.done" ]; then
        pass "$what: COMMAND ran to its end, after the lease"
    else
        echo "note $TEST: $what: the watchdog found the loss before COMMAND ended" >&2
    fi
}

lapsed run "run: COMMAND ends 0.7 s after the lease, server paused" run
lapsed elect "elect --once: the same" elect --once

finish
