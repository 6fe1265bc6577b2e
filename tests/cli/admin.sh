#!/bin/sh
# status and release --force: one readable line each, exit 0 whether the
# lock is held or not.
. "$(dirname "$0")/lib.sh"

N=$(name s)
dl() { "$DLOCK" --url "$URL" "$@"; }

expect 0 "status of a never used lock" dl status "$N"
grep_file "^$N: free, fence 0$" "$WORK/out" "never used: free, fence 0"
expect 0 "release --force of a never used lock" dl release --force "$N"
grep_file "^$N: not held, nothing removed \(fence 0\)$" "$WORK/out" "nothing to release"

expect 0 "one run" dl run "$N" -- true
expect 0 "status after a run" dl status "$N"
grep_file "^$N: free, fence 1$" "$WORK/out" "after a run: free, fence 1"

hold "$N" holder --ttl 6s
expect 0 "status while held" dl status "$N"
grep_file "^$N: held, fence 2, ttl [0-9]+ ms$" "$WORK/out" "held: fence and ttl"
ttl=$(sed -n 's/.*ttl \([0-9]*\) ms$/\1/p' "$WORK/out")
[ "${ttl:-0}" -gt 0 ] && [ "$ttl" -le 6000 ] && pass "ttl within the lease ($ttl ms)" ||
    fail "ttl '$ttl' not in (0, 6000]"

expect 0 "release --force while held" dl release --force "$N"
grep_file "^$N: released by force \(was held, fence 2, ttl [0-9]+ ms\)$" "$WORK/out" \
    "release --force says what it removed"
expect 0 "status after release --force" dl status "$N"
grep_file "^$N: free, fence 2$" "$WORK/out" "after release --force: free, the fence kept"
expect_bg 76 "the holder finds its lock lost" "$HOLDER"

expect 0 "a name that needs '--'" dl status -- "-$N"
grep_file "^-$N: free, fence 0$" "$WORK/out" "status -- -NAME"

finish
