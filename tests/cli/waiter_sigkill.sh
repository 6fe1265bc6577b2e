#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# A dlock run killed with SIGKILL while it waits for a busy lock cannot leave
# the queue. It must still cost the next waiter only a short, fixed time,
# whatever --ttl it asked for (30 s here):
#   - etcd: its queued key lives on a lease of a few seconds while it waits
#     (src/backends/etcd/etcd_queue.c, WAIT_TTL_S), and is gone that long
#     after it died;
#   - Redis: a lock the release hands to a waiter is held only for a short
#     confirm window (min(lease, 2 s)) until that waiter confirms it, which
#     a dead one never does.
#   - ZooKeeper: its queue node is ephemeral and goes when its session
#     times out: the session its lease lives in (docs/zookeeper.md), so
#     there the dead waiter asks for a short session and a lease within it
#     (session_timeout_ms=3000, --ttl 3s): a dead waiter costs the session
#     timeout, which a deployment where waiters may die keeps short.
# The live waiter asks for 30 s too: on Redis the grant that names the dead
# waiter wakes it to look again once the confirm window is over
# (redis_watch.c, grant), so its own lease does not bound how soon it
# notices.
. "$(dirname "$0")/lib.sh"
need_server_tools

N=$(name k)
hold "$N" holder
DEAD_URL=$URL DEAD_TTL=30s
if [ "$BACKEND" = zk ]; then DEAD_URL="$URL?session_timeout_ms=3000" DEAD_TTL=3s; fi
"$DLOCK" --url "$DEAD_URL" run --wait 60s --ttl "$DEAD_TTL" "$N" -- touch "$WORK/dead.ran" 2>"$WORK/dead.err" &
DEAD=$!
BG_PIDS="$BG_PIDS $DEAD"
within 30 queued_is "$N" 1 || fail "the waiter never queued (queued: $(queued "$N"))"
[ "$BACKEND" = zk ] && zk_children "$N" >"$WORK/before"
kill -KILL "$DEAD"
wait "$DEAD" 2>/dev/null
# PostgreSQL: the dead waiter's LISTEN session ends when the server sees
# its connection closed; then only the live one is counted.
[ "$BACKEND" = postgres ] && { within 30 queued_is "$N" 0 || fail "the killed waiter still LISTENs"; }

"$DLOCK" --url "$URL" run --wait 60s --ttl 30s "$N" -- sh -c 'echo "$DLOCK_FENCE" > "$0"' \
    "$WORK/live.got" 2>"$WORK/live.err" &
LIVE=$!
BG_PIDS="$BG_PIDS $LIVE"
# The live waiter waits behind the dead one: on etcd its key is queued
# second; on Redis the dead one's entry keeps the hand-off slot, and the
# live one is known only by its subscription. ZooKeeper: its node is second
# in the lock's directory, behind the dead one's.
# ZooKeeper: a node that was not there before it came (the dead one's
# goes when its session times out, maybe before zkCli looks).
live_queued() { zk_children "$N" | grep -qvxF -f "$WORK/before"; }
if [ "$BACKEND" = zk ]; then
    within 30 live_queued || fail "the live waiter never queued ($(zk_children "$N" | tr '\n' ' '))"
elif [ "$BACKEND" = etcd ]; then
    within 30 queued_is "$N" 2 || fail "the live waiter never queued (queued: $(queued "$N"))"
else
    within 30 subscribed_is "$N" 1 || fail "the live waiter never subscribed"
fi
# Released at once, while the dead waiter's place is still held.
start=$(now_ms)
kill -TERM "$HOLDER"
# A few seconds by design; 10 s leaves room for a loaded machine and is far
# below the dead waiter's 30 s.
if within 10 gone "$LIVE"; then
    expect_bg 0 "SIGKILLed waiter: the live waiter ran, $(($(now_ms) - start)) ms after the release" "$LIVE"
else
    fail "SIGKILLed waiter: the live waiter still waits 10 s after the release (the dead one's --ttl is 30 s)"
fi
expect_bg 143 "holder stopped" "$HOLDER"
if [ -e "$WORK/dead.ran" ]; then fail "the killed waiter's COMMAND ran"; fi

finish
