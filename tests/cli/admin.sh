#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# status and release --force: one readable line each, exit 0 whether the
# lock is held or not.
# The fence they show differs by backend: Redis shows the last token issued
# for the name (1, 2 ..., kept when the lock is free); etcd the holder's create
# revision, a number shared by the whole store, and 0 when the lock is free
# (etcd keeps no counter per name: docs/etcd.md, "Status").
. "$(dirname "$0")/lib.sh"

N=$(name s)
dl() { "$DLOCK" --url "$URL" "$@"; }
# fence_above FENCE LOWER WHAT: FENCE is a number greater than LOWER.
fence_above() {
    case $1 in
    '' | *[!0-9]*) fail "$3: fence '$1' is not a number" ;;
    *) [ "$1" -gt "$2" ] && pass "$3 ($1 > $2)" || fail "$3: fence $1, not above $2" ;;
    esac
}

expect 0 "status of a never used lock" dl status "$N"
grep_file "^$N: free, fence 0$" "$WORK/out" "never used: free, fence 0"
expect 0 "release --force of a never used lock" dl release --force "$N"
grep_file "^$N: not held, nothing removed \(fence 0\)$" "$WORK/out" "nothing to release"

expect 0 "one run" dl run "$N" -- sh -c 'echo "$DLOCK_FENCE" > "$0"' "$WORK/fence1"
fence1=$(cat "$WORK/fence1")
fence_above "$fence1" 0 "the run's fence"
expect 0 "status after a run" dl status "$N"
# etcd and ZooKeeper keep no fence for a free lock (a revision, a czxid).
if [ "$BACKEND" = etcd ] || [ "$BACKEND" = zk ]; then
    grep_file "^$N: free, fence 0$" "$WORK/out" "after a run: free, fence 0"
    held_fence='[0-9]+'
elif [ "$BACKEND" = postgres ] || [ "$BACKEND" = mysql ]; then
    # One sequence (MySQL: one counter) for every name (docs/postgres.md,
    # "Fences"; docs/mysql.md): the row keeps the last fence issued for the
    # name, not a count.
    grep_file "^$N: free, fence $fence1$" "$WORK/out" "after a run: free, the run's fence kept"
    held_fence='[0-9]+'
else
    grep_file "^$N: free, fence 1$" "$WORK/out" "after a run: free, fence 1"
    held_fence=2
fi

hold "$N" holder --ttl 6s
expect 0 "status while held" dl status "$N"
grep_file "^$N: held, fence $held_fence, ttl [0-9]+ ms, holder [^ ]+ pid $HOLDER since [0-9-]+T[0-9:.]+Z$" \
    "$WORK/out" "held: fence, ttl and holder"
fence2=$(sed -n 's/.*held, fence \([0-9]*\),.*/\1/p' "$WORK/out")
fence_above "$fence2" "$fence1" "held: a fence above the earlier holder's"
holder_fence=$(tr '\0' '\n' <"/proc/$HOLDER_CHILD/environ" | sed -n 's/^DLOCK_FENCE=//p')
[ "$fence2" = "$holder_fence" ] && pass "status shows the holder's DLOCK_FENCE" ||
    fail "status shows fence '$fence2', the holder has DLOCK_FENCE=$holder_fence"
ttl=$(sed -n 's/.*ttl \([0-9]*\) ms,.*/\1/p' "$WORK/out")
[ "${ttl:-0}" -gt 0 ] && [ "$ttl" -le 6000 ] && pass "ttl within the lease ($ttl ms)" ||
    fail "ttl '$ttl' not in (0, 6000]"

expect 0 "release --force while held" dl release --force "$N"
grep_file "^$N: released by force \(was held, fence $fence2, ttl [0-9]+ ms, holder [^ ]+ pid $HOLDER since [^ ]+\)$" "$WORK/out" \
    "release --force says what it removed"
expect 0 "status after release --force" dl status "$N"
if [ "$BACKEND" = etcd ] || [ "$BACKEND" = zk ]; then
    grep_file "^$N: free, fence 0$" "$WORK/out" "after release --force: free"
elif [ "$BACKEND" = postgres ] || [ "$BACKEND" = mysql ]; then
    grep_file "^$N: free, fence $fence2$" "$WORK/out" "after release --force: free, the fence kept"
else
    grep_file "^$N: free, fence 2$" "$WORK/out" "after release --force: free, the fence kept"
fi
expect_bg 76 "the holder finds its lock lost" "$HOLDER"
expect 0 "a run after release --force" dl run "$N" -- sh -c 'echo "$DLOCK_FENCE" > "$0"' "$WORK/fence3"
fence_above "$(cat "$WORK/fence3")" "$fence2" "the next holder's fence is still higher"

expect 0 "a name that needs '--'" dl status -- "-$N"
grep_file "^-$N: free, fence 0$" "$WORK/out" "status -- -NAME"

finish
