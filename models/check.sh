#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Model-checks dlock's protocols with spin, as `make verify` and CI run it
# (docs/verification.md):
#   - the Redis mutex (models/redis_mutex.pml): under the grant rule the code
#     follows, spin must find no violation of the three properties, in three
#     configurations; under the old rule (-DOLD_GRANT), spin must find
#     property (1) broken; the counterexample is printed; under the stamped
#     grant proposed for issue 28 (-DSTAMPED_GRANT, not in the code), no
#     violation, and property (1) broken by each of its three mutants; the
#     same for the grant pushed to a list (-DLIST_GRANT) and its two;
#   - the fair lock's queue (-DFAIR): its head handed the lock with the list
#     grant as the code has it (-DLIST_WINDOW), and without listening: no
#     violation; the list grant's two mutants: property (1) broken;
#   - the Redlock fence (models/redlock.pml): spin must find no violation of
#     properties (2) and (3), also with a retry that reuses the token
#     (-DATTEMPTS=2); without the unanimity check (-DNO_UNANIMITY: F = the
#     highest value in one round, always), with a node that forgets its
#     high-water mark (-DFORGET) and with round 2 not checking that the key
#     is ours (-DNO_CONFIRM_CHECK), it must find (2) broken;
#   - etcd's queue, promote and spare leases (models/etcd_handoff.pml): no
#     violation of (1) and (2); with each guard taken away (-DNO_FIRST_CMP,
#     -DNO_REV_CMP, -DFROM_CALL, -DBACK_AT_RELEASE, -DPROMOTE_NO_KA), the
#     property it guards broken.
# `models/check.sh --long` also runs the checks that take minutes (owner ids
# on Redlock, larger bounds; docs/verification.md has their numbers).
# Each check builds its own pan in a temporary directory. Exits non-zero if
# any expectation fails.
set -u

here=$(cd "$(dirname "$0")" && pwd)
cc=${CC:-cc}

command -v spin >/dev/null 2>&1 || {
    echo "check.sh: spin is missing (apt-get install spin, or scripts/deps.sh)" >&2
    exit 2
}
command -v "$cc" >/dev/null 2>&1 || { echo "check.sh: no C compiler ($cc)" >&2; exit 2; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dlock-verify-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

passed=0
failed=0
n=0

# Which property the assertion pan reports is: (2) and (3) assert on their
# ghosts (last_fence, or redlock.pml's issued; store_tok), (1) on what the
# clients believe.
which_property() {
    if grep -q -e 'assertion violated.*last_fence' -e 'assertion violated.*issued' "$1"; then
        echo 2
    elif grep -q 'assertion violated.*store_tok' "$1"; then
        echo 3
    elif grep -q 'assertion violated' "$1"; then
        echo 1
    else
        echo "?"
    fi
}

# check MODEL EXPECT TITLE SPIN-FLAGS...
#   MODEL:  the file name under models/.
#   EXPECT: "none" (the exhaustive search finds no violation) or the number
#           of the property spin must find broken.
check() {
    model=$1 expect=$2 title=$3
    shift 3
    n=$((n + 1))
    dir="$tmp/$n"
    mkdir "$dir"
    cp "$here/$model" "$dir/"
    if ! (cd "$dir" && spin "$@" -a "$model" >spin.log 2>&1 &&
          "$cc" -O2 -w -DSAFETY -DCOLLAPSE -DMEMLIM=4096 -o pan pan.c \
              >cc.log 2>&1); then
        echo "FAIL  $title: the model did not build (spin $*)"
        cat "$dir/spin.log" "$dir/cc.log" 2>/dev/null | head -20 | sed 's/^/      /'
        failed=$((failed + 1))
        return
    fi
    start=$(date +%s%N)
    (cd "$dir" && ./pan -m200000 -n >pan.log 2>&1)
    end=$(date +%s%N)
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
    errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' "$dir/pan.log")
    states=$(sed -n 's/^ *\([0-9][0-9]*\) states, stored.*/\1/p' "$dir/pan.log")
    stats="${states:-?} states, ${secs} s"
    broken=""
    [ -n "$errors" ] && [ "$errors" != 0 ] && broken=$(which_property "$dir/pan.log")

    if [ -z "$errors" ] ||
            grep -q -e 'max search depth too small' -e 'MEMLIM' -e 'out of memory' \
                "$dir/pan.log"; then
        echo "FAIL  $title: the search did not complete ($stats)"
        tail -5 "$dir/pan.log" | sed 's/^/      /'
        failed=$((failed + 1))
    elif [ "$expect" = none ] && [ -z "$broken" ]; then
        echo "PASS  $title: no violation ($stats)"
        passed=$((passed + 1))
    elif [ "$expect" = "$broken" ]; then
        echo "PASS  $title: spin finds property ($broken) broken, as expected ($stats); the trail:"
        trail "$dir" "$@"
        passed=$((passed + 1))
    elif [ -n "$broken" ]; then
        echo "FAIL  $title: spin finds property ($broken) broken ($stats); the trail:"
        trail "$dir" "$@"
        failed=$((failed + 1))
    else
        echo "FAIL  $title: spin finds no violation, but property ($expect) should break ($stats)"
        failed=$((failed + 1))
    fi
}

# trail DIR SPIN-FLAGS...: replay pan's counterexample, printing the model's
# narration (its printf lines: redis_mutex.pml's start with the time,
# redlock.pml's with a client or a node).
trail() {
    dir=$1
    shift
    (cd "$dir" && spin -t "$@" "$model" 2>&1) |
        sed -n 's/^ *\(t=[0-9]\|c[0-9][ :]\|node [0-9]\)/      \1/p'
}

long=0
[ "${1:-}" = --long ] && long=1

spin -V
m=redis_mutex.pml
check $m none "mutex: new grant rule, 3 clients, 8 ticks"
check $m none "mutex: new grant rule, 2 clients x 2 acquisitions, 10 ticks" -DN=2 -DROUNDS=2 -DTMAX=10
check $m none "mutex: new grant rule, request and reply delays, 3 clients, 4 ticks" -DDELAY -DTMAX=4
check $m 1 "mutex: old grant rule (-DOLD_GRANT), 3 clients, 8 ticks" -DOLD_GRANT -DPROPS=1
check $m none "mutex: stamped grant, proposed (-DSTAMPED_GRANT), 2 clients, 8 ticks" -DSTAMPED_GRANT -DN=2 -DTMAX=8
check $m 1 "mutex: stamped grant, lease from the grant's arrival (-DGRANT_FROM_ARRIVAL)" \
    -DGRANT_FROM_ARRIVAL -DPROPS=1 -DN=2 -DROUNDS=2 -DTMAX=6
check $m 1 "mutex: stamped grant, from the last reply before the take (-DGRANT_LATEST_BOUND)" \
    -DGRANT_LATEST_BOUND -DPROPS=1 -DN=2 -DROUNDS=2 -DTMAX=6
check $m 1 "mutex: stamped grant, key handed over for the confirm window (-DGRANT_SHORT_PX)" \
    -DGRANT_SHORT_PX -DPROPS=1 -DN=2 -DROUNDS=2 -DTMAX=6
check $m none "mutex: list grant, proposed (-DLIST_GRANT), 2 clients x 2 acquisitions, 6 ticks" \
    -DLIST_GRANT -DN=2 -DROUNDS=2 -DTMAX=6
check $m 1 "mutex: list grant, lease from the BLPOP that popped it (-DLIST_FROM_POP)" \
    -DLIST_FROM_POP -DPROPS=1 -DN=2 -DROUNDS=2 -DTMAX=6
check $m 1 "mutex: list grant, key handed over for the confirm window (-DLIST_SHORT_PX)" \
    -DLIST_SHORT_PX -DPROPS=1 -DN=2 -DROUNDS=2 -DTMAX=6
check $m none "mutex: list grant as the code has it, window from the bound (-DLIST_WINDOW), 2 clients x 2" \
    -DLIST_WINDOW -DN=2 -DROUNDS=2 -DTMAX=6
check $m none "fair: the queue's head handed the lock, list grant as the code has it (-DFAIR -DLIST_WINDOW), 2 clients x 2" \
    -DFAIR -DLIST_WINDOW -DN=2 -DROUNDS=2 -DTMAX=6
check $m 1 "fair: list grant, lease from the BLPOP that popped it (-DFAIR -DLIST_FROM_POP)" \
    -DFAIR -DLIST_FROM_POP -DPROPS=1 -DN=2 -DROUNDS=2 -DTMAX=6
check $m 1 "fair: list grant, believed for the lease past the key's window (-DFAIR -DLIST_SHORT_PX)" \
    -DFAIR -DLIST_SHORT_PX -DPROPS=1 -DN=2 -DROUNDS=2 -DTMAX=6
check $m none "fair: list grant as the code has it, 3 clients (two queued), 5 ticks" \
    -DFAIR -DLIST_WINDOW -DTMAX=5
check $m none "fair: without listening, the head takes it by a try (-DFAIR), 2 clients x 2, 8 ticks" \
    -DFAIR -DN=2 -DROUNDS=2 -DTMAX=8
if [ "$long" = 1 ]; then
    check $m none "mutex: stamped grant, proposed, 3 clients, 6 ticks" -DSTAMPED_GRANT -DTMAX=6
    check $m none "mutex: list grant, proposed, 3 clients, 6 ticks" -DLIST_GRANT -DTMAX=6
fi
m=redlock.pml
check $m none "redlock: 3 nodes, 2 clients, a renewal each, return at quorum"
check $m 2 "redlock: no unanimity check, always one round (-DNO_UNANIMITY), 3 nodes, 3 clients" -DNO_UNANIMITY -DCLIENTS=3 -DRENEWS=0
check $m 2 "redlock: a node forgets its high-water (-DFORGET), 3 nodes, 2 clients" -DFORGET
check $m none "redlock: a retry with the same token (-DATTEMPTS=2), 2 clients, one retrying, every reply awaited" \
    -DATTEMPTS=2 -DRETRIERS=1 -DRENEWS=0 -DIN_ORDER -DWAIT_ALL
check $m 2 "redlock: round 2 without the token check (-DNO_CONFIRM_CHECK), 3 nodes, 2 clients" -DNO_CONFIRM_CHECK
if [ "$long" = 1 ]; then
    check $m none "redlock: a retry with the same token, return at quorum (late requests)" \
        -DATTEMPTS=2 -DRETRIERS=1 -DRENEWS=0 -DIN_ORDER
    check $m none "redlock: owner ids, 2 nested handles of one owner and another owner" \
        -DOWNERS -DROUNDS=2 -DRENEWS=0 -DIN_ORDER -DNO_LOSS
    check $m 2 "redlock: owner ids, the re-entry's fence without its two conditions (-DTENURE_ONE -DTENURE_ANY)" \
        -DOWNERS -DROUNDS=2 -DRENEWS=0 -DIN_ORDER -DNO_LOSS -DTENURE_ONE -DTENURE_ANY
fi
m=etcd_handoff.pml
check $m none "etcd: queue, promote, spares, 2 clients (one acquiring twice), 4 ticks" -DTMAX=4
check $m 1 "etcd: the wake-up's move without \"no key ahead\" (-DNO_FIRST_CMP)" -DNO_FIRST_CMP -DTMAX=3
check $m 1 "etcd: the move without our create revision (-DNO_REV_CMP)" -DNO_REV_CMP -DTMAX=3
check $m 1 "etcd: a fresh spare's lease counted from the acquire (-DFROM_CALL)" -DFROM_CALL -DTMAX=3
check $m 1 "etcd: a spare given back alive as of the release (-DBACK_AT_RELEASE)" -DBACK_AT_RELEASE -DTMAX=3
check $m 1 "etcd: the promote onto a spare without its keepalive (-DPROMOTE_NO_KA)" -DPROMOTE_NO_KA -DTMAX=3
check $m none "etcd: session leases (-DSESSION), 2 clients (one acquiring twice), 3 ticks" -DSESSION -DTMAX=3
check $m 1 "etcd: session lease, the acquire counted from the call (-DSESSION -DFROM_CALL)" -DSESSION -DFROM_CALL -DTMAX=3
check $m 1 "etcd: session lease counted alive as of a release (-DSESSION -DBACK_AT_RELEASE)" -DSESSION -DBACK_AT_RELEASE -DTMAX=3
if [ "$long" = 1 ]; then
    check $m none "etcd: 5 ticks" -DTMAX=5
    check $m none "etcd: session leases, 4 ticks" -DSESSION -DTMAX=4
    check $m none "etcd: the short lease revoked before the move (-DREVOKE_EARLY), 4 ticks" -DREVOKE_EARLY -DTMAX=4
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
