#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# dlock and real Curator (Debian's jars) on one lock: interop.sh DLOCK CASE.
# Starts a private ZooKeeper, compiles CuratorWorker.java with javac, and runs
# one CASE:
#   mutex   dlock runs and InterProcessMutex workers take turns on one
#           read-modify-write register (critical.sh write): no update lost,
#           no two inside, fences (czxids) rising across both.
#   rw      --exclusive / --shared runs beside InterProcessReadWriteLock's
#           write and read sides: writers alone, readers never see a write.
#   sem     --permits 2 runs beside InterProcessSemaphoreV2(2): never three
#           inside.
#   block   a Curator holder blocks `dlock run` and the reverse, for the
#           mutex, both read-write sides and the semaphore; a waiter of one
#           side gets the lock when the other side releases it.
#   leader  LeaderLatch and `dlock elect` in one election: either leader
#           keeps the other out, and each sees the other's id as leader.
#   auth    both sides with one digest identity (zk://USER:PASSWORD@,
#           Curator's authorization() and a CREATOR_ALL ACL provider):
#           they exclude each other and hand over as without it; a Curator
#           or a dlock without the credentials neither takes nor breaks it.
# Nothing is skipped: without java, javac, the Curator jars or ZooKeeper the
# test fails and names the Debian package (scripts/deps.sh installs them).
#
# The helpers (fail, pass, finish, within, start_zk, cleanup of BG_PIDS and
# $WORK) are tests/cli/lib.sh's; this test talks to no Redis, the URL given
# to lib.sh is never used.
HERE=$(cd "$(dirname "$0")" && pwd)
CASE=${2:-}
DLOCK_TESTS_DIR="$HERE/../.." DLOCK_CLI_BACKEND=redis DLOCK_TEST_URL=redis://127.0.0.1:1 \
    . "$HERE/../../cli/lib.sh"
TEST=interop-$CASE
case $CASE in mutex | rw | sem | block | leader | auth) ;;
*) echo "usage: interop.sh DLOCK (mutex|rw|sem|block|leader|auth)" >&2; exit 2 ;; esac

# ---- Java, Curator and ZooKeeper ----

J=/usr/share/java
need() { # need FILE PACKAGE
    [ -e "$1" ] || { fail "$1 is missing: install the Debian package $2 (scripts/deps.sh does)"; finish; }
}
need "$(command -v java || echo /usr/bin/java)" default-jdk-headless
need "$(command -v javac || echo /usr/bin/javac)" default-jdk-headless
need $J/curator-recipes.jar libcurator-recipes-java
need $J/curator-framework.jar libcurator-framework-java
need $J/curator-client.jar libcurator-client-java
need $J/zookeeper.jar libzookeeper-java
need $J/zookeeper-jute.jar libzookeeper-java
need /usr/share/zookeeper/bin/zkServer.sh zookeeper
need $J/guava.jar libguava-java
need $J/slf4j-api.jar libslf4j-java
# What Curator needs at run time: its three jars, the ZooKeeper client (and
# its jute records), Guava, and slf4j (bound to nop: the test reads no log).
CP=$J/curator-recipes.jar:$J/curator-framework.jar:$J/curator-client.jar:$J/zookeeper.jar
CP=$CP:$J/zookeeper-jute.jar:$J/guava.jar:$J/slf4j-api.jar:$J/slf4j-nop.jar
mkdir "$WORK/classes"
javac -Xlint:all,-path -Werror -d "$WORK/classes" -cp "$CP" "$HERE/CuratorWorker.java" \
    2>"$WORK/javac.err" || { fail "javac CuratorWorker.java: $(cat "$WORK/javac.err")"; finish; }
CP=$WORK/classes:$CP

start_zk
ZKURL=zk://$ZK

curator() { java -cp "$CP" CuratorWorker "$ZK" "$@"; }
dl() { "$DLOCK" --url "$ZKURL" "$@"; }

# A fresh register per case: DIR/register 0, DIR/fence 0, empty readers/
# and inside/.
D=$WORK/reg
mkdir -p "$D/readers" "$D/inside"
echo 0 >"$D/register"
echo 0 >"$D/fence"
: >"$D/violations"
CRIT=$HERE/critical.sh

# no_violations WHAT
no_violations() {
    if [ -s "$D/violations" ]; then
        fail "$1: $(head -5 "$D/violations")"
    else
        pass "$1"
    fi
}

# dlock_loop COUNT RUNOPTS... -- CMD...: COUNT `dlock run`s one after the
# other, each waiting as long as it takes; stops at the first failure.
dlock_loop() {
    count=$1
    shift
    i=0
    while [ "$i" -lt "$count" ]; do
        dl run --wait forever "$@" || { echo "dlock run exited $?" >&2; return 1; }
        i=$((i + 1))
    done
}

# together: start the workers given as lines of "side args..." in the
# background and wait for all; each must exit 0.
PIDS=""
bg() { "$@" 2>>"$WORK/workers.err" & PIDS="$PIDS $!"; BG_PIDS="$BG_PIDS $!"; }
wait_all() {
    for p in $PIDS; do
        wait "$p" || fail "$1: a worker exited $? ($(tail -3 "$WORK/workers.err"))"
    done
    PIDS=""
}

K=12 # turns per worker
case $CASE in
mutex)
    N=$(name m)
    bg curator mutex "/dlock/$N" loop $K sh "$CRIT" write "$D"
    bg curator mutex "/dlock/$N" loop $K sh "$CRIT" write "$D"
    bg dlock_loop $K "$N" -- sh "$CRIT" write "$D"
    bg dlock_loop $K "$N" -- sh "$CRIT" write "$D"
    wait_all "mutex workers"
    got=$(cat "$D/register")
    [ "$got" -eq $((4 * K)) ] && pass "2 Curator and 2 dlock workers: $got updates, none lost" ||
        fail "the register is $got after $((4 * K)) read-modify-writes"
    no_violations "never two holders, fences rising across Curator and dlock"
    ;;
rw)
    N=$(name rw)
    bg curator write "/dlock/$N" loop $K sh "$CRIT" write "$D"
    bg curator read "/dlock/$N" loop $K sh "$CRIT" read "$D"
    bg curator read "/dlock/$N" loop $K sh "$CRIT" read "$D"
    bg dlock_loop $K --exclusive "$N" -- sh "$CRIT" write "$D"
    bg dlock_loop $K --shared "$N" -- sh "$CRIT" read "$D"
    bg dlock_loop $K --shared "$N" -- sh "$CRIT" read "$D"
    wait_all "read-write workers"
    got=$(cat "$D/register")
    [ "$got" -eq $((2 * K)) ] && pass "Curator and dlock writers: $got updates, none lost" ||
        fail "the register is $got after $((2 * K)) writes"
    [ "$(wc -l <"$D/reads")" -eq $((4 * K)) ] && pass "$((4 * K)) reads done" ||
        fail "$(wc -l <"$D/reads") reads, want $((4 * K))"
    no_violations "writers alone, readers never see a write (Curator and dlock)"
    ;;
sem)
    N=$(name s)
    bg curator sem:2 "/dlock/$N" loop $K sh "$CRIT" permit 2 "$D"
    bg curator sem:2 "/dlock/$N" loop $K sh "$CRIT" permit 2 "$D"
    bg dlock_loop $K --permits 2 "$N" -- sh "$CRIT" permit 2 "$D"
    bg dlock_loop $K --permits 2 "$N" -- sh "$CRIT" permit 2 "$D"
    wait_all "semaphore workers"
    [ "$(wc -l <"$D/counts")" -eq $((4 * K)) ] && pass "$((4 * K)) permits taken" ||
        fail "$(wc -l <"$D/counts") permits taken, want $((4 * K))"
    no_violations "never more than 2 inside (Curator and dlock)"
    ;;
block)
    # curator_holds KIND PATH TAG: a Curator holder in the background; waits
    # until it holds. `release TAG` lets it go and waits for it to end.
    curator_holds() {
        curator "$1" "$2" hold "$WORK/$3.ready" "$WORK/$3.go" 2>"$WORK/$3.err" &
        eval "PID_$3=$!"
        BG_PIDS="$BG_PIDS $!"
        wait_file "$WORK/$3.ready"
    }
    # dlock_holds TAG RUNOPTS...: a `dlock run` holder in the background,
    # until $WORK/TAG.go exists.
    dlock_holds() {
        tag=$1
        shift
        dl run "$@" -- sh -c 'echo "$DLOCK_FENCE" >"$0.ready"; while [ ! -e "$0.go" ]; do sleep 0.02; done' \
            "$WORK/$tag" 2>"$WORK/$tag.err" &
        eval "PID_$tag=$!"
        BG_PIDS="$BG_PIDS $!"
        wait_file "$WORK/$tag.ready"
    }
    release() {
        touch "$WORK/$1.go"
        eval "p=\$PID_$1"
        wait "$p" || fail "holder $1 exited $? ($(cat "$WORK/$1.err"))"
    }
    # curator_try WANT WHAT KIND PATH: a Curator try exits WANT: 0 had it
    # (within 30 s), 3 timed out (after 1 s).
    curator_try() {
        if [ "$1" = 0 ]; then t=30000; else t=1000; fi
        expect "$1" "$2" curator "$3" "$4" try $t
    }

    M=$(name m)
    curator_holds mutex "/dlock/$M" cm
    expect 75 "a Curator InterProcessMutex holder keeps dlock run out" dl run --wait 1s "$M" -- true
    # A dlock waiter gets the lock when Curator releases it (a watch, not a
    # poll: --wait forever, bounded by the test's within).
    dl run --wait forever "$M" -- sh -c 'echo "$DLOCK_FENCE" >"$0"' "$WORK/m.after" 2>"$WORK/m.after.err" &
    W=$!
    BG_PIDS="$BG_PIDS $W"
    sleep 0.5 # only a chance to see it wait
    [ -e "$WORK/m.after" ] && fail "dlock ran while Curator held the mutex" || pass "dlock waits behind Curator"
    release cm
    within 30 test -s "$WORK/m.after" && pass "the dlock waiter runs once Curator released" ||
        fail "the dlock waiter did not run after Curator released ($(cat "$WORK/m.after.err"))"
    wait "$W"
    [ "$(cat "$WORK/m.after")" -gt "$(cat "$WORK/cm.ready")" ] &&
        pass "the dlock fence is above the Curator holder's czxid" ||
        fail "fences: Curator $(cat "$WORK/cm.ready"), dlock after it $(cat "$WORK/m.after")"

    dlock_holds dm "$M"
    curator_try 3 "a dlock run holder keeps Curator's InterProcessMutex out" mutex "/dlock/$M"
    release dm
    curator_try 0 "Curator takes the mutex once dlock released" mutex "/dlock/$M"

    RW=$(name rw)
    curator_holds write "/dlock/$RW" cw
    expect 75 "a Curator write holder keeps dlock run --shared out" dl run --shared --wait 1s "$RW" -- true
    expect 75 "a Curator write holder keeps dlock run --exclusive out" dl run --exclusive --wait 1s "$RW" -- true
    release cw
    curator_holds read "/dlock/$RW" cr
    expect 0 "a Curator read holder lets dlock run --shared in" dl run --shared --wait 30s "$RW" -- true
    expect 75 "a Curator read holder keeps dlock run --exclusive out" dl run --exclusive --wait 1s "$RW" -- true
    release cr
    dlock_holds dw --exclusive "$RW"
    curator_try 3 "dlock --exclusive keeps Curator's read lock out" read "/dlock/$RW"
    curator_try 3 "dlock --exclusive keeps Curator's write lock out" write "/dlock/$RW"
    release dw
    dlock_holds dr --shared "$RW"
    curator_try 0 "dlock --shared lets Curator's read lock in" read "/dlock/$RW"
    curator_try 3 "dlock --shared keeps Curator's write lock out" write "/dlock/$RW"
    release dr
    curator_try 0 "Curator's write lock once dlock released" write "/dlock/$RW"

    S=$(name s)
    curator_holds sem:2 "/dlock/$S" cs
    dlock_holds ds --permits 2 "$S"
    pass "a Curator lease and a dlock permit at once, of 2"
    expect 75 "the third (dlock) waits" dl run --permits 2 --wait 1s "$S" -- true
    curator_try 3 "the third (Curator) waits" sem:2 "/dlock/$S"
    release cs
    expect 0 "dlock gets the permit Curator gave back" dl run --permits 2 --wait 30s "$S" -- true
    release ds
    ;;
auth)
    ZKURL=zk://team:pw-$$@$ZK
    export CURATOR_AUTH=team:pw-$$
    A=$(name a)
    curator mutex "/dlock/$A" hold "$WORK/ca.ready" "$WORK/ca.go" 2>"$WORK/ca.err" &
    P=$!
    BG_PIDS="$BG_PIDS $P"
    wait_file "$WORK/ca.ready"
    expect 75 "a Curator holder with the same digest keeps dlock run out" dl run --wait 1s "$A" -- true
    expect 77 "dlock without the credentials is refused" "$DLOCK" --url "zk://$ZK" run --wait 1s "$A" -- true
    expect 1 "Curator without the credentials is refused" \
        env -u CURATOR_AUTH java -cp "$CP" CuratorWorker "$ZK" mutex "/dlock/$A" try 1000
    dl run --wait forever "$A" -- sh -c 'echo "$DLOCK_FENCE" >"$0"' "$WORK/da" 2>"$WORK/da.err" &
    W=$!
    BG_PIDS="$BG_PIDS $W"
    sleep 0.5 # only a chance to see it wait
    [ -e "$WORK/da" ] && fail "dlock ran while Curator held the mutex" || pass "dlock waits behind Curator"
    touch "$WORK/ca.go"
    wait "$P" || fail "the Curator holder exited $? ($(cat "$WORK/ca.err"))"
    within 30 test -s "$WORK/da" && pass "the dlock waiter runs once Curator released" ||
        fail "the dlock waiter did not run after Curator released ($(cat "$WORK/da.err"))"
    wait "$W"
    # A name whose directory dlock makes: before dlock set ACLs, a client
    # without credentials could queue (and delete) in it.
    B=$(name b)
    dl run "$B" -- sh -c 'echo "$DLOCK_FENCE" >"$0.ready"; while [ ! -e "$0.go" ]; do sleep 0.02; done' \
        "$WORK/db" 2>"$WORK/db.err" &
    W=$!
    BG_PIDS="$BG_PIDS $W"
    wait_file "$WORK/db.ready"
    expect 3 "a dlock holder keeps Curator (same digest) out" curator mutex "/dlock/$B" try 1000
    expect 1 "Curator without the credentials cannot queue in dlock's directory" \
        env -u CURATOR_AUTH java -cp "$CP" CuratorWorker "$ZK" mutex "/dlock/$B" try 1000
    touch "$WORK/db.go"
    wait "$W" || fail "the dlock holder exited $? ($(cat "$WORK/db.err"))"
    expect 0 "Curator takes the mutex once dlock released" curator mutex "/dlock/$B" try 30000
    ;;
leader)
    L=$(name l)
    curator latch:java-1 "/dlock/$L" hold "$WORK/cl.ready" "$WORK/cl.go" 2>"$WORK/cl.err" &
    CL=$!
    BG_PIDS="$BG_PIDS $CL"
    wait_file "$WORK/cl.ready"
    expect 0 "dlock status reads the Curator leader" dl status "$L"
    grep_file "held" "$WORK/out" "a Curator LeaderLatch leader shows as held"
    dl elect --once --id dlock-1 "$L" -- sh -c 'echo "$DLOCK_FENCE" >"$0"' "$WORK/dl.fence" 2>"$WORK/dl.err" &
    DE=$!
    BG_PIDS="$BG_PIDS $DE"
    sleep 0.5 # only a chance to see it wait
    [ -e "$WORK/dl.fence" ] && fail "dlock led while Curator's latch led" || pass "dlock elect waits behind a LeaderLatch"
    touch "$WORK/cl.go"
    wait "$CL" || fail "the Curator leader exited $?: $(cat "$WORK/cl.err")"
    wait "$DE" && pass "dlock elect leads once the LeaderLatch closed" ||
        fail "dlock elect exited $?: $(cat "$WORK/dl.err")"
    [ "$(cat "$WORK/dl.fence")" -gt "$(cat "$WORK/cl.ready")" ] &&
        pass "the dlock leader's fence is above the Curator leader's czxid" ||
        fail "fences: Curator $(cat "$WORK/cl.ready"), dlock $(cat "$WORK/dl.fence")"

    dl elect --once --id dlock-2 "$L" -- sh -c 'echo x >"$0.ready"; while [ ! -e "$0.go" ]; do sleep 0.02; done' \
        "$WORK/de" 2>"$WORK/de.err" &
    DE=$!
    BG_PIDS="$BG_PIDS $DE"
    wait_file "$WORK/de.ready"
    expect 0 "Curator reads the leader" curator latch:x "/dlock/$L" leader
    grep_file "^dlock-2$" "$WORK/out" "Curator's getLeader() is dlock's --id"
    expect 3 "a dlock leader keeps a LeaderLatch from leading" curator latch:java-2 "/dlock/$L" try 1000
    touch "$WORK/de.go"
    wait "$DE" || fail "the dlock leader exited $?: $(cat "$WORK/de.err")"
    expect 0 "a LeaderLatch leads once dlock resigned" curator latch:java-2 "/dlock/$L" try 30000
    ;;
esac
finish
