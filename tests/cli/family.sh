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
finish
