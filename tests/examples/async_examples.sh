#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# The asynchronous examples (examples/async_uv.c, examples/async_event.c) end
# to end, against a throwaway redis-server of their own:
#
#   tests/examples/async_examples.sh BUILD_DIR
#
# For each example that BUILD_DIR/examples holds (each is built only when
# pkg-config finds its loop; none at all is a failure), once as it is and
# once with --no-threads (DLOCK_CLIENT_NO_THREADS), on one lock:
#   1. client 1 connects and gets "fence N" (--no-threads: 2.2 s later its
#      lease was renewed by the loop, and the process has one thread);
#   2. client 2 connects and gets nothing while client 1 stays connected;
#   3. client 1 closes: client 2 gets "fence M", M > N;
#   4. client 3 waits; client 2 sends "release": it gets "released" and
#      client 3 gets "fence K", K > M;
#   5. client 4 waits; SIGTERM: the example exits 0, client 4's connection
#      is closed without a fence, the example printed its request as
#      canceled (dlock_client_free cancels what is in flight), and client
#      3's lock was released: none is left on the server.
# Bash for /dev/tcp and read -t; the clients are file descriptors 3 to 6.
# KEEP_WORK=1 keeps the temporary folder (the examples' output) for a look.
set -u

BUILD=${1:?usage: $0 BUILD_DIR}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dlock-async-examples.XXXXXX")
REDIS_PID="" EXAMPLE_PID=""
FAILS=0

cleanup() {
    for p in $EXAMPLE_PID $REDIS_PID; do
        kill -TERM "$p" 2>/dev/null
        within 5 gone "$p" || kill -KILL "$p" 2>/dev/null
    done
    wait 2>/dev/null
    if [ -n "${KEEP_WORK:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

fail() { echo "FAIL async_examples${EX:+ $EX}: $*" >&2; FAILS=$((FAILS + 1)); }
pass() { echo "ok   async_examples $EX: $*"; }
die() { fail "$@"; exit 1; }

# free_port (tests/support/free_port.sh).
. "$(dirname "$0")/../support/free_port.sh"

# within SECONDS CMD...: until CMD succeeds; 1 when the time ran out.
within() {
    local end=$((SECONDS + $1))
    shift
    until "$@"; do
        [ "$SECONDS" -lt "$end" ] || return 1
        sleep 0.05
    done
}

# gone PID: PID has exited (a zombie until waited for counts as gone).
gone() { ! kill -0 "$1" 2>/dev/null || [ "$(ps -o stat= -p "$1" 2>/dev/null | cut -c1)" = Z ]; }

# logged REGEX: the example's output has a line matching REGEX.
logged() { grep -Eq -- "$1" "$WORK/$EX.out"; }

# await_log REGEX WHAT: wait (10 s at most) for the example to print it.
await_log() {
    within 10 logged "$1" || die "$2: no line /$1/ in its output: $(cat "$WORK/$EX.out")"
}

# connect FD: a TCP client on the example's port, as descriptor FD.
connect() { eval "exec $1<>/dev/tcp/127.0.0.1/$PORT" || die "client on fd $1 cannot connect"; }
hangup() { eval "exec $1>&-"; }

# fence_of FD WHAT: read one line (10 s at most) from FD; it must be
# "fence N": prints N.
fence_of() {
    local line=""
    IFS= read -r -t 10 -u "$1" line
    case $line in
    "fence "[0-9]*) echo "${line#fence }" ;;
    *) die "$2: got '$line' where 'fence N' was due; output: $(cat "$WORK/$EX.out")" ;;
    esac
}

# ---- the server ----
command -v redis-server >/dev/null && command -v redis-cli >/dev/null ||
    die "redis-server and redis-cli are not installed (scripts/deps.sh)"
for _ in 1 2 3 4 5; do # a port taken meanwhile costs another try
    REDIS_PORT=$(free_port)
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
        --dir "$WORK" >"$WORK/redis.log" 2>&1 &
    REDIS_PID=$!
    within 10 redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
    kill -KILL "$REDIS_PID" 2>/dev/null
    wait "$REDIS_PID" 2>/dev/null
    REDIS_PID=""
done
[ -n "$REDIS_PID" ] || die "the redis-server did not start: $(tail -5 "$WORK/redis.log")"
URL=redis://127.0.0.1:$REDIS_PORT

ran=0
for name in async_uv async_event; do
for MODE in "" --no-threads; do
    EX=$name$MODE
    bin=$BUILD/examples/$name
    [ -x "$bin" ] || { echo "--   async_examples: $bin not built (its loop's -dev package is missing)"; continue; }
    ran=$((ran + 1))
    LOCK=async-$EX-$$

    PORT=$(free_port)
    # shellcheck disable=SC2086 # MODE: no word, or one
    "$bin" $MODE "$URL" "$PORT" "$LOCK" >"$WORK/$EX.out" 2>"$WORK/$EX.err" &
    EXAMPLE_PID=$!
    within 10 logged '^listening on' ||
        die "did not start listening: $(cat "$WORK/$EX.out" "$WORK/$EX.err")"

    # 1, 2: the first client holds the lock, the second waits for it.
    connect 3
    n=$(fence_of 3 "client 1") || exit 1
    pass "client 1 got fence $n"
    if [ -n "$MODE" ]; then
        # 1b: without threads, the loop alone renews the 5 s lease (due
        # at a third of it): past that, the server's lease is fresh, and
        # the process is still one thread.
        sleep 2.2
        ttl=$(redis-cli -p "$REDIS_PORT" pttl "dlock:{$LOCK}")
        [ "$ttl" -gt 3500 ] && pass "renewed by the loop: $ttl ms left of 5000 after 2.2 s" ||
            fail "not renewed: $ttl ms left of 5000 after 2.2 s"
        threads=$(awk '/^Threads:/ {print $2}' "/proc/$EXAMPLE_PID/status")
        [ "$threads" = 1 ] && pass "one thread in the process" ||
            fail "$threads threads in the process, not 1"
    fi
    connect 4
    await_log '^conn 2: waiting' "client 2's request"
    line=""
    if IFS= read -r -t 1.5 -u 4 line; then
        fail "client 2 got '$line' while client 1 held the lock"
    else
        pass "client 2 got nothing while client 1 held the lock"
    fi

    # 3: client 1 leaves; its lock goes to client 2.
    hangup 3
    m=$(fence_of 4 "client 2, after client 1 closed") || exit 1
    if [ "$m" -gt "$n" ]; then pass "client 2 got fence $m > $n once client 1 closed"
    else fail "client 2's fence $m is not above client 1's $n"; fi
    await_log '^conn 1: released \(success\)' "client 1's release"

    # 4: "release" gives the lock up without closing the connection first.
    connect 5
    await_log '^conn 3: waiting' "client 3's request"
    echo release >&4
    line=""
    IFS= read -r -t 10 -u 4 line
    [ "$line" = released ] && pass "client 2's release was answered" ||
        fail "client 2 sent release and got '$line'"
    k=$(fence_of 5 "client 3, after client 2's release") || exit 1
    if [ "$k" -gt "$m" ]; then pass "client 3 got fence $k > $m after the release"
    else fail "client 3's fence $k is not above client 2's $m"; fi
    hangup 4

    # 5: SIGTERM while client 4 waits.
    connect 6
    await_log '^conn 4: waiting' "client 4's request"
    kill -TERM "$EXAMPLE_PID"
    # It must end by itself, within 15 s.
    within 15 gone "$EXAMPLE_PID" || { kill -KILL "$EXAMPLE_PID"; fail "still running 15 s after SIGTERM"; }
    status=0
    wait "$EXAMPLE_PID" || status=$?
    EXAMPLE_PID=""
    [ "$status" -eq 0 ] && pass "exit 0 on SIGTERM" ||
        fail "exit $status on SIGTERM; stderr: $(cat "$WORK/$EX.err")"
    logged '^conn 4: canceled' && pass "client 4's request was canceled" ||
        fail "no 'conn 4: canceled' line: $(cat "$WORK/$EX.out")"
    logged '^conn 3: released \(success\)' && pass "client 3's lock was released on SIGTERM" ||
        fail "client 3's lock was not released on SIGTERM: $(cat "$WORK/$EX.out")"
    line=""
    if IFS= read -r -t 5 -u 6 line; then
        fail "client 4 got '$line' after SIGTERM, not the end of the connection"
    elif [ -n "$line" ]; then
        fail "client 4 got '$line' (no newline) after SIGTERM"
    else
        pass "client 4's connection was closed"
    fi
    hangup 5
    hangup 6
    # Released, not left to its lease: the lock's key is gone.
    [ "$(redis-cli -p "$REDIS_PORT" exists "dlock:{$LOCK}")" = 0 ] &&
        pass "no lock left on the server" || fail "dlock:{$LOCK} is still on the server"
    [ -s "$WORK/$EX.err" ] && fail "stderr not empty: $(cat "$WORK/$EX.err")"
done
done
EX=""

[ "$ran" -gt 0 ] || die "neither $BUILD/examples/async_uv nor async_event is built (libuv1-dev, libevent-dev: scripts/deps.sh)"
if [ "$FAILS" -ne 0 ]; then
    echo "FAIL async_examples: $FAILS check(s) failed" >&2
    exit 1
fi
echo "ok   async_examples: $ran example(s)"
