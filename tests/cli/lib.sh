# Sourced by the tests in tests/cli. $1 is the dlock binary; DLOCK_TEST_URL the
# redis-server to use (scripts/test.sh starts a throwaway one and exports it).
# Each test uses lock names of its own (name), so tests may run in parallel.
set -u

DLOCK=${1:?usage: sh $0 path/to/dlock}
case $DLOCK in /*) ;; *) DLOCK=$PWD/$DLOCK ;; esac
TEST=$(basename "$0" .sh)

# The same scripts run against etcd (tests/cli/CMakeLists.txt sets
# DLOCK_CLI_BACKEND=etcd; scripts/test.sh exports DLOCK_TEST_ETCD_URL).
if [ "${DLOCK_CLI_BACKEND:-redis}" = etcd ]; then
    DLOCK_TEST_URL=${DLOCK_TEST_ETCD_URL:-}
    [ -n "$DLOCK_TEST_URL" ] || { echo "FAIL: DLOCK_TEST_ETCD_URL is not set (scripts/test.sh starts an etcd)" >&2; exit 1; }
fi
if [ -z "${DLOCK_TEST_URL:-}" ]; then
    echo "FAIL $TEST: DLOCK_TEST_URL is not set; these tests need a redis-server" \
         "(scripts/test.sh starts one; or run redis-server and export" \
         "DLOCK_TEST_URL=redis://127.0.0.1:PORT)" >&2
    exit 1
fi
URL=$DLOCK_TEST_URL
case $URL in
redis://*) HOSTPORT=${URL#redis://}; HOSTPORT=${HOSTPORT%%/*}; HOSTPORT=${HOSTPORT##*@} ;;
etcd://*) HOSTPORT=${URL#etcd://}; HOSTPORT=${HOSTPORT%%[/?,]*}; HOSTPORT=${HOSTPORT##*@} ;;
*) echo "FAIL $TEST: DLOCK_TEST_URL must be redis://HOST:PORT or etcd://HOST:PORT, got $URL" >&2; exit 1 ;;
esac
# The developer's own settings must not leak into what is tested.
unset DLOCK_URL DLOCK_NAME DLOCK_FENCE

WORK=$(mktemp -d "${TMPDIR:-/tmp}/dlock-cli-$TEST.XXXXXX")
BG_PIDS=""    # background dlock processes
CHILD_PIDS="" # their COMMANDs, in case a dlock died without stopping one
FAILS=0

cleanup() {
    for p in $BG_PIDS; do kill -TERM "$p" 2>/dev/null; done
    for p in $CHILD_PIDS; do kill -KILL "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

fail() { echo "FAIL $TEST: $*" >&2; FAILS=$((FAILS + 1)); }
pass() { echo "ok   $TEST: $*"; }

# finish: the test's verdict, as its exit status.
finish() {
    if [ "$FAILS" -ne 0 ]; then
        echo "FAIL $TEST: $FAILS check(s) failed" >&2
        exit 1
    fi
    exit 0
}

# name SUFFIX: a lock name no other test or run uses.
name() { echo "cli-$TEST-$$-$1"; }

# expect CODE WHAT CMD...: run CMD (stdout in $WORK/out, stderr in $WORK/err)
# and check its exit status.
expect() {
    want=$1 what=$2
    shift 2
    "$@" >"$WORK/out" 2>"$WORK/err"
    got=$?
    if [ "$got" -eq "$want" ]; then
        pass "$what (exit $got)"
    else
        fail "$what: exit $got, want $want; stdout: $(cat "$WORK/out"); stderr: $(cat "$WORK/err")"
    fi
}

# expect_bg CODE WHAT PID: wait for a background dlock and check its status.
expect_bg() {
    wait "$3"
    got=$?
    if [ "$got" -eq "$1" ]; then pass "$2 (exit $got)"; else fail "$2: exit $got, want $1"; fi
}

# grep_file PATTERN FILE WHAT: FILE must match the extended regex PATTERN.
grep_file() {
    if grep -Eq -- "$1" "$2"; then
        pass "$3"
    else
        fail "$3: '$2' does not match /$1/: $(cat "$2")"
    fi
}

# wait_file FILE: wait until FILE exists and is not empty. This waits for the
# test's processes to be ready; it measures nothing. Gives up after 30 s.
wait_file() {
    n=0
    while [ ! -s "$1" ]; do
        n=$((n + 1))
        if [ "$n" -gt 600 ]; then
            fail "gave up waiting for $1"
            finish
        fi
        sleep 0.05
    done
}

# hold NAME TAG [run options...]: in the background, hold NAME with a COMMAND
# that writes its pid to $WORK/TAG.pid and then sleeps. Sets HOLDER (dlock's
# pid) and HOLDER_CHILD (COMMAND's) once COMMAND runs.
hold() {
    lock=$1 tag=$2
    shift 2
    "$DLOCK" --url "$URL" run "$@" "$lock" -- \
        sh -c 'echo $$ > "$0"; exec sleep 60' "$WORK/$tag.pid" 2>"$WORK/$tag.err" &
    HOLDER=$!
    BG_PIDS="$BG_PIDS $HOLDER"
    wait_file "$WORK/$tag.pid"
    HOLDER_CHILD=$(cat "$WORK/$tag.pid")
    CHILD_PIDS="$CHILD_PIDS $HOLDER_CHILD"
}
