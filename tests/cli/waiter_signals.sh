#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# A dlock run that waits for a busy lock and gets SIGTERM or SIGINT (^C)
# leaves the queue before it exits (and so does a waiting candidate of
# dlock elect): on Redis its hand-off slot, on etcd its
# queued key. It still dies of the signal (143, 130), and its COMMAND never
# runs. So when the holder releases, the lock goes to the next waiter that
# is alive, at once, and not to the dead one for its --ttl (30 s here).
. "$(dirname "$0")/lib.sh"
need_server_tools

for sig in TERM INT; do
    N=$(name "$sig")
    hold "$N" "holder-$sig"
    # A script's background jobs start with SIGINT ignored, and dlock leaves
    # an ignored signal alone: env puts it back to the default.
    env --default-signal=INT "$DLOCK" --url "$URL" run --wait 60s --ttl 30s "$N" -- \
        touch "$WORK/dead-$sig.ran" 2>"$WORK/dead-$sig.err" &
    DEAD=$!
    BG_PIDS="$BG_PIDS $DEAD"
    within 30 queued_is "$N" 1 || fail "SIG$sig: the waiter never queued (queued: $(queued "$N"))"
    kill -"$sig" "$DEAD"
    if [ "$sig" = TERM ]; then want=143; else want=130; fi
    expect_bg "$want" "SIG$sig to a waiter: it dies of it" "$DEAD"
    # Checked right after the waiter exited: it left before, not later.
    # PostgreSQL keeps no queue: the server ends the dead waiter's LISTEN
    # session once it sees the connection closed.
    if [ "$BACKEND" = postgres ]; then
        within 30 queued_is "$N" 0 && pass "SIG$sig: the waiter's LISTEN session is gone" ||
            fail "SIG$sig: the dead waiter still LISTENs ($(queued "$N"))"
    elif queued_is "$N" 0; then
        pass "SIG$sig: the waiter left the queue before it exited"
    else
        fail "SIG$sig: the dead waiter is still queued ($(queued "$N"))"
    fi

    # The next waiter, alive; the holder then releases.
    "$DLOCK" --url "$URL" run --wait 60s "$N" -- sh -c 'echo "$DLOCK_FENCE" > "$0"' \
        "$WORK/live-$sig.got" 2>"$WORK/live-$sig.err" &
    LIVE=$!
    BG_PIDS="$BG_PIDS $LIVE"
    within 30 queued_is "$N" 1 || fail "SIG$sig: the live waiter never queued"
    start=$(now_ms)
    kill -TERM "$HOLDER"
    # A hand-off takes milliseconds; 5 s only keeps a loaded machine from
    # failing a correct dlock, and is far below the dead waiter's 30 s.
    if within 5 gone "$LIVE"; then
        expect_bg 0 "SIG$sig: the live waiter ran, $(($(now_ms) - start)) ms after the release" "$LIVE"
    else
        fail "SIG$sig: the live waiter still waits 5 s after the release (the dead one's --ttl is 30 s)"
    fi
    expect_bg 143 "SIG$sig: holder stopped" "$HOLDER"
    if [ -e "$WORK/dead-$sig.ran" ]; then fail "SIG$sig: the dead waiter's COMMAND ran"; fi
done

# A candidate of dlock elect waits the same way, and leaves the same way. On
# etcd it has a queued key to delete; on Redis a candidate leaves no trace
# but its subscription.
if [ "$BACKEND" = etcd ]; then
    E=$(name elect)
    "$DLOCK" --url "$URL" elect "$E" -- sh -c 'echo $$ > "$0"; exec sleep 60' \
        "$WORK/leader.pid" 2>"$WORK/leader.err" &
    LEADER=$!
    BG_PIDS="$BG_PIDS $LEADER"
    wait_file "$WORK/leader.pid"
    CHILD_PIDS="$CHILD_PIDS $(cat "$WORK/leader.pid")"
    "$DLOCK" --url "$URL" elect --ttl 30s "$E" -- touch "$WORK/candidate.ran" \
        2>"$WORK/candidate.err" &
    CANDIDATE=$!
    BG_PIDS="$BG_PIDS $CANDIDATE"
    within 30 queued_is "$E" 1 || fail "elect: the candidate never queued"
    kill -TERM "$CANDIDATE"
    expect_bg 143 "elect: SIGTERM to a waiting candidate: it dies of it" "$CANDIDATE"
    if queued_is "$E" 0; then
        pass "elect: the candidate left the queue before it exited"
    else
        fail "elect: the dead candidate is still queued ($(queued "$E"))"
    fi
    kill -TERM "$LEADER"
    expect_bg 143 "elect: the leader stopped" "$LEADER"
    if [ -e "$WORK/candidate.ran" ]; then fail "elect: the dead candidate's COMMAND ran"; fi
fi

finish
