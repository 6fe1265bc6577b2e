#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Durations as people write them (1.5s, 500ms, 1h30m) reach the server as
# the lease they say, and a lease a backend cannot hold is refused naming
# that backend and its bound: etcd grants whole seconds (1 s at least, said
# before connecting), ZooKeeper at most the server's maxSessionTimeout
# (the number the server gave).
. "$(dirname "$0")/lib.sh"

N=$(name d)
# COMMAND reads its own lock's lease left: at most the --ttl given.
expect 0 "run --ttl 1.5s --wait 1h30m" "$DLOCK" --url "$URL" run --ttl 1.5s --wait 1h30m "$N" -- \
    "$DLOCK" --url "$URL" status --json "$N"
ttl=$(sed -n 's/.*"ttl_ms": *\([0-9-]*\).*/\1/p' "$WORK/out")
if [ "$BACKEND" = etcd ]; then
    # etcd rounds a lease up to whole seconds on the server.
    [ "${ttl:-0}" -gt 0 ] && [ "$ttl" -le 2000 ] && pass "--ttl 1.5s: $ttl ms left" ||
        fail "--ttl 1.5s: ttl_ms '$ttl' ($(cat "$WORK/out"))"
else
    [ "${ttl:-0}" -gt 0 ] && [ "$ttl" -le 1500 ] && pass "--ttl 1.5s: $ttl ms left" ||
        fail "--ttl 1.5s: ttl_ms '$ttl' ($(cat "$WORK/out"))"
fi

if [ "$BACKEND" = etcd ]; then
    expect 64 "--ttl 500ms on etcd" "$DLOCK" --url "$URL" run --ttl 500ms "$N" -- true
    grep_file 'at least 1000 ms.*etcd grants leases in whole seconds' "$WORK/err" \
        "--ttl 500ms on etcd: the message names etcd and its bound"
else
    expect 0 "--ttl 500ms on $BACKEND" "$DLOCK" --url "$URL" run --ttl 500ms "$N" -- \
        "$DLOCK" --url "$URL" status --json "$N"
    ttl=$(sed -n 's/.*"ttl_ms": *\([0-9-]*\).*/\1/p' "$WORK/out")
    [ "${ttl:-0}" -gt 0 ] && [ "$ttl" -le 500 ] && pass "--ttl 500ms: $ttl ms left" ||
        fail "--ttl 500ms: ttl_ms '$ttl' ($(cat "$WORK/out"))"
fi

if [ "$BACKEND" = zk ]; then
    # Longer than any session the server grants: the server's bound, named.
    expect 64 "--ttl 2h on ZooKeeper" "$DLOCK" --url "$URL" run --ttl 2h "$N" -- true
    grep_file 'longest session the server grants \([0-9]+ ms: raise maxSessionTimeout' \
        "$WORK/err" "--ttl 2h on ZooKeeper: the message gives the server's maxSessionTimeout"
fi
finish
