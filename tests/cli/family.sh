#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# run --shared / --exclusive (the two sides of a read-write lock) and
# run --permits N (a semaphore): who may run together, and the usage errors.
. "$(dirname "$0")/lib.sh"

dl() { "$DLOCK" --url "$URL" "$@"; }

# Readers share; a writer waits for them; while a writer holds the lock,
# readers wait.
R=$(name rw)
hold "$R" reader1 --shared
expect 0 "a second reader runs beside the first" dl run --shared "$R" -- true
expect 75 "a writer is refused while a reader holds it" dl run --exclusive "$R" -- true
kill -TERM "$HOLDER"
expect_bg 143 "the reader stopped" "$HOLDER"
hold "$R" writer --exclusive
expect 75 "a reader is refused while the writer holds it" dl run --shared "$R" -- true
expect 75 "so is a second writer" dl run --exclusive "$R" -- true
# A waiting reader gets in once the writer is done.
"$DLOCK" --url "$URL" run --shared --wait 30s "$R" -- sh -c 'echo "$DLOCK_FENCE" > "$0"' "$WORK/reader.fence" \
    2>"$WORK/reader.err" &
READER=$!
BG_PIDS="$BG_PIDS $READER"
wait_subscribed "$R" # the reader waits: it is on the lock's channel
kill -TERM "$HOLDER"
expect_bg 143 "the writer stopped" "$HOLDER"
expect_bg 0 "the waiting reader ran after the writer" "$READER"
grep_file "^[0-9]+$" "$WORK/reader.fence" "the reader got a fence"

# Two permits: two run at once, a third is refused until one ends.
P=$(name sem)
hold "$P" p1 --permits 2
hold "$P" p2 --permits 2
expect 75 "a third holder is refused" dl run --permits 2 "$P" -- true
kill -TERM "$HOLDER"
expect_bg 143 "one holder stopped" "$HOLDER"
expect 0 "its permit is free again" dl run --permits 2 "$P" -- sh -c 'test "$DLOCK_FENCE" -gt 2'
# The latest run's N wins: with 1 permit the remaining holder fills it.
expect 75 "--permits 1: full with one holder" dl run --permits 1 "$P" -- true
expect 0 "--permits 3: room again" dl run --permits 3 "$P" -- true

expect 64 "--shared and --permits together" dl run --shared --permits 2 "$P" -- true
expect 64 "--shared and --exclusive together" dl run --shared --exclusive "$P" -- true
expect 64 "--permits 0" dl run --permits 0 "$P" -- true
expect 64 "--permits x" dl run --permits x "$P" -- true
expect 64 "--permits without N" dl run "$P" --permits
# Redis, etcd and PostgreSQL keep a record per reader and permit holder;
# ZooKeeper's backend has no multi-holder view yet (docs/zookeeper.md).
if [ "$BACKEND" = redis ] || [ "$BACKEND" = etcd ] || [ "$BACKEND" = postgres ]; then
# The operator's view of a lock several hold (issue 16): status and list
# count the readers or permit holders and show each, with --json too.
HOST=$(hostname)
V=$(name view-rw)
hold "$V" view-r1 --shared --label "reader one"
PID_R1=$HOLDER
hold "$V" view-r2 --shared --label "reader two" --ttl 20s
PID_R2=$HOLDER
expect 0 "status of a lock two readers hold" dl status "$V"
grep_file "^$V: held by 2 readers, fence [0-9]+, ttl [0-9]+ ms$" "$WORK/out" "status: how many readers"
grep_file "^  reader fence [0-9]+, ttl [0-9]+ ms, holder $HOST pid $PID_R1 since [0-9-]+T[0-9:.]+Z \(reader one\)$" \
    "$WORK/out" "status: the first reader"
grep_file "^  reader fence [0-9]+, ttl [0-9]+ ms, holder $HOST pid $PID_R2 since [^ ]+ \(reader two\)$" \
    "$WORK/out" "status: the second reader"
expect 0 "list of the read-write lock" dl list "$V"
[ "$(grep -c "^$V:" "$WORK/out")" -eq 1 ] && [ "$(grep -c '^  reader ' "$WORK/out")" -eq 2 ] &&
    pass "list: the lock once, its two readers under it" || fail "list: $(cat "$WORK/out")"
expect 0 "status --json of the readers" dl status --json "$V"
python3 - "$WORK/out" "$PID_R1" "$PID_R2" >"$WORK/check" 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["held"] is True and d["kind"] == "read", d
hs = d["holders"]
assert sorted((h["holder"]["pid"], h["holder"]["label"]) for h in hs) == \
    sorted([(int(sys.argv[2]), "reader one"), (int(sys.argv[3]), "reader two")]), hs
assert all(h["fence"] > 0 and h["ttl_ms"] > 0 for h in hs), hs
assert d["holder"]["label"] == "reader one", d  # the oldest
print("readers ok")
PY
grep_file '^readers ok$' "$WORK/check" "status --json: kind read, each reader"
kill -TERM "$PID_R1"
expect_bg 143 "the first reader stopped" "$PID_R1"
expect 0 "status after one reader left" dl status "$V"
grep_file "^$V: held by 1 reader, fence [0-9]+, ttl [0-9]+ ms$" "$WORK/out" "status: one reader left"
if grep -q "pid $PID_R1 " "$WORK/out"; then fail "the reader that left is still shown"; else pass "the reader that left is gone"; fi
kill -TERM "$PID_R2"
expect_bg 143 "the second reader stopped" "$PID_R2"
hold "$V" view-w --exclusive --label writer
expect 0 "status of the writer" dl status "$V"
grep_file "^$V: held, fence [0-9]+, ttl [0-9]+ ms, holder $HOST pid $HOLDER since [^ ]+ \(writer\)$" \
    "$WORK/out" "status: the writer, one line"
kill -TERM "$HOLDER"
expect_bg 143 "the writer stopped" "$HOLDER"
expect 0 "status of the free read-write lock" dl status "$V"
grep_file "^$V: free, fence [0-9]+$" "$WORK/out" "status: free once all left"

S=$(name view-sem)
hold "$S" view-p1 --permits 3 --label "permit one"
PID_P1=$HOLDER
hold "$S" view-p2 --permits 3
PID_P2=$HOLDER
expect 0 "status of a semaphore two hold" dl status "$S"
grep_file "^$S: held by 2 permit holders, fence [0-9]+, ttl [0-9]+ ms$" "$WORK/out" "status: how many permit holders"
grep_file "^  permit holder fence [0-9]+, ttl [0-9]+ ms, holder $HOST pid $PID_P1 since [^ ]+ \(permit one\)$" \
    "$WORK/out" "status: the first permit holder"
grep_file "^  permit holder fence [0-9]+, ttl [0-9]+ ms, holder $HOST pid $PID_P2 since [^ ]+$" \
    "$WORK/out" "status: the second permit holder"
expect 0 "list --json of the semaphore" dl list --json "$S"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert len(d) == 1 and d[0]["kind"] == "semaphore" and len(d[0]["holders"]) == 2, d; print("sem ok")' \
    "$WORK/out" >"$WORK/check" 2>&1
grep_file '^sem ok$' "$WORK/check" "list --json: the semaphore once, two holders"
kill -TERM "$PID_P1" "$PID_P2"
expect_bg 143 "the first permit holder stopped" "$PID_P1"
expect_bg 143 "the second permit holder stopped" "$PID_P2"
expect 0 "list of the semaphore once all left" dl list "$S"
[ ! -s "$WORK/out" ] && pass "list: nothing once the permits are back" || fail "list: $(cat "$WORK/out")"
fi
finish
