# SPDX-License-Identifier: BSD-3-Clause
# Sourced by the tests in tests/cli. $1 is the dlock binary; DLOCK_TEST_URL the
# redis-server to use (scripts/test.sh starts a throwaway one and exports it),
# or DLOCK_TEST_ETCD_URL the etcd when DLOCK_CLI_BACKEND=etcd.
# Each test uses lock names of its own (name), so tests may run in parallel.
set -u

DLOCK=${1:?usage: sh $0 path/to/dlock}
case $DLOCK in /*) ;; *) DLOCK=$PWD/$DLOCK ;; esac
TEST=$(basename "$0" .sh)

# The same scripts run against etcd and Redlock (tests/cli/CMakeLists.txt
# sets DLOCK_CLI_BACKEND=etcd or redlock; scripts/test.sh exports
# DLOCK_TEST_ETCD_URL and DLOCK_TEST_REDLOCK_URL). BACKEND is redis, etcd or
# redlock (or mysql: DLOCK_TEST_MYSQL_URL): what a script checks where they
# differ.
BACKEND=${DLOCK_CLI_BACKEND:-redis}
case $BACKEND in redis | etcd | redlock | rediss | zk | postgres | mysql) ;; *) echo "FAIL: DLOCK_CLI_BACKEND must be redis, etcd, redlock, rediss, zk, postgres or mysql, got $BACKEND" >&2; exit 1 ;; esac
# rediss: a private redis-server with TLS, started below (start_redis_tls).
[ "$BACKEND" = rediss ] && DLOCK_TEST_URL=rediss://pending
# zk: DLOCK_TEST_ZK_URL, or else a private ZooKeeper the script starts
# (start_zk, below) once the helpers are defined.
ZK_PRIVATE=0
if [ "$BACKEND" = zk ]; then
    DLOCK_TEST_URL=${DLOCK_TEST_ZK_URL:-zk://private}
    [ -n "${DLOCK_TEST_ZK_URL:-}" ] || ZK_PRIVATE=1
fi
if [ "$BACKEND" = mysql ]; then
    # The URL has the server's password: kept out of the environment that
    # dlock and its COMMAND inherit (env.sh looks for it there).
    mysql_url=${DLOCK_TEST_MYSQL_URL:-}
    unset DLOCK_TEST_URL DLOCK_TEST_MYSQL_URL
    DLOCK_TEST_URL=$mysql_url
    [ -n "$DLOCK_TEST_URL" ] || { echo "FAIL: DLOCK_TEST_MYSQL_URL is not set (scripts/test.sh starts a MariaDB)" >&2; exit 1; }
fi
if [ "$BACKEND" = etcd ]; then
    DLOCK_TEST_URL=${DLOCK_TEST_ETCD_URL:-}
    [ -n "$DLOCK_TEST_URL" ] || { echo "FAIL: DLOCK_TEST_ETCD_URL is not set (scripts/test.sh starts an etcd)" >&2; exit 1; }
fi
# postgres: the PostgreSQL that scripts/test.sh starts (lease mode).
if [ "$BACKEND" = postgres ]; then
    DLOCK_TEST_URL=${DLOCK_TEST_POSTGRES_URL:-}
    [ -n "$DLOCK_TEST_URL" ] || { echo "FAIL: DLOCK_TEST_POSTGRES_URL is not set (scripts/test.sh starts a PostgreSQL)" >&2; exit 1; }
fi
if [ "$BACKEND" = redlock ]; then
    DLOCK_TEST_URL=${DLOCK_TEST_REDLOCK_URL:-}
    [ -n "$DLOCK_TEST_URL" ] || { echo "FAIL: DLOCK_TEST_REDLOCK_URL is not set (scripts/test.sh starts 3 redis-servers)" >&2; exit 1; }
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
# HOSTS: every node; HOSTPORT: the first, for redis-cli.
redlock://*) HOSTS=${URL#redlock://}; HOSTS=${HOSTS%%[/?]*}; HOSTS=${HOSTS##*@}; HOSTPORT=${HOSTS%%,*} ;;
etcd://*) HOSTPORT=${URL#etcd://}; HOSTPORT=${HOSTPORT%%[/?,]*}; HOSTPORT=${HOSTPORT##*@} ;;
rediss://pending) ;;
zk://*) HOSTPORT=${URL#zk://}; HOSTPORT=${HOSTPORT%%[/?,]*}; HOSTPORT=${HOSTPORT##*@} ;;
# HOSTPORT for psql (pg_sql); the URL itself is a libpq connection URI.
postgres://* | postgresql://*) HOSTPORT=${URL#*://}; HOSTPORT=${HOSTPORT%%[/?,]*}; HOSTPORT=${HOSTPORT##*@} ;;
# MYSQL_DB: the database the URL names.
mysql://* | mariadb://*) HOSTPORT=${URL#*://}; HOSTPORT=${HOSTPORT%%[/?]*}; HOSTPORT=${HOSTPORT##*@}
    MYSQL_DB=${URL#*://*/}; MYSQL_DB=${MYSQL_DB%%\?*} ;;
*) echo "FAIL $TEST: DLOCK_TEST_URL must be redis://, etcd://, redlock://, zk://, postgres:// or mysql://, got $URL" >&2; exit 1 ;;
esac
# postgres: every connection of this script carries its name, so that
# queued can tell this script's waiters from other tests' on the shared server.
if [ "$BACKEND" = postgres ]; then
    case $URL in *\?*) URL="$URL&application_name=cli-$TEST-$$" ;; *) URL="$URL?application_name=cli-$TEST-$$" ;; esac
fi
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

# start_redis_tls [REDIS_SERVER_ARGS...]: a private redis-server with TLS on
# a free port, certificates from tests/support/make_certs.sh in $WORK/tls,
# its plain port kept for redis-cli (HOSTPORT). Sets URL to
# rediss://127.0.0.1:TLS_PORT?cacert=$WORK/tls/ca.crt, TLS_PORT, REDIS_TLS_PID.
start_redis_tls() {
    mkdir -p "$WORK/tls"
    tls_faketime=""
    for f in /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 \
             /usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1 \
             /usr/lib/faketime/libfaketimeMT.so.1; do
        [ -r "$f" ] && tls_faketime=$f && break
    done
    [ -n "$tls_faketime" ] || { echo "FAIL $TEST: libfaketime not found (apt-get install faketime)" >&2; exit 1; }
    sh "$(dirname "$0")/../support/make_certs.sh" "$WORK/tls" "$tls_faketime" ||
        { echo "FAIL $TEST: making certificates: $(cat "$WORK/tls/openssl.log")" >&2; exit 1; }
    tls_plain=$(free_port) TLS_PORT=$(free_port)
    redis-server --port "$tls_plain" --bind 127.0.0.1 --tls-port "$TLS_PORT" \
        --tls-cert-file "$WORK/tls/server.crt" --tls-key-file "$WORK/tls/server.key" \
        --tls-ca-cert-file "$WORK/tls/ca.crt" --tls-auth-clients no --save '' \
        --appendonly no --dir "$WORK" "$@" >"$WORK/redis.log" 2>&1 &
    REDIS_TLS_PID=$!
    BG_PIDS="$BG_PIDS $REDIS_TLS_PID"
    HOSTPORT=127.0.0.1:$tls_plain
    URL="rediss://127.0.0.1:$TLS_PORT?cacert=$WORK/tls/ca.crt"
    DLOCK_TEST_URL=$URL
    within 30 redis-cli -h 127.0.0.1 -p "$tls_plain" ping >/dev/null 2>&1 ||
        { echo "FAIL $TEST: the private TLS redis-server did not start: $(tail -5 "$WORK/redis.log")" >&2; exit 1; }
}
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
    within 30 test -s "$1" || { fail "gave up waiting for $1"; finish; }
}

# wait_subscribed NAME: wait until a waiter of lock NAME is on its release
# channel (Redis only: PUBSUB NUMSUB dlock:{NAME}:release, through
# redis-cli). Gives up after 30 s.
wait_subscribed() {
    within 30 subscribed_some "$1" || { fail "gave up waiting for a waiter of $1"; finish; }
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

# free_port (tests/support/free_port.sh; DLOCK_TESTS_DIR: tests/, for a
# script outside tests/cli that sources this file).
. "${DLOCK_TESTS_DIR:-$(dirname "$0")/..}/support/free_port.sh"

# etcd_ctl ARGS...: etcdctl against the private etcd.
etcd_ctl() {
    ETCDCTL_API=3 etcdctl --endpoints="$ETCD_HOSTPORT" --command-timeout=5s "$@"
}

# start_etcd [ROOT_PASSWORD]: a private single-member etcd on free loopback
# ports, its data in $WORK, stopped on exit with the other background
# processes. With ROOT_PASSWORD, auth is on and user root has that password.
# Sets ETCD_PID, ETCD_HOSTPORT and ETCD_URL (without credentials). A port
# taken between free_port and etcd's bind costs another try.
start_etcd() {
    command -v etcd >/dev/null || { fail "etcd is not installed (apt-get install etcd-server)"; finish; }
    [ $# -eq 0 ] || command -v etcdctl >/dev/null ||
        { fail "etcdctl is not installed (apt-get install etcd-client)"; finish; }
    etcd_try=0
    while :; do
        etcd_try=$((etcd_try + 1))
        etcd_client=$(free_port) etcd_peer=$(free_port)
        ETCD_LOG=$WORK/etcd.$etcd_try.log
        ETCD_HOSTPORT=127.0.0.1:$etcd_client
        ETCD_URL=etcd://$ETCD_HOSTPORT
        # Fast elections, as tests/support/test.c: a minimum lease of 1 s.
        etcd --name cli --data-dir "$WORK/etcd.$etcd_try" \
            --listen-client-urls "http://$ETCD_HOSTPORT" --advertise-client-urls "http://$ETCD_HOSTPORT" \
            --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
            --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
            --initial-cluster "cli=http://127.0.0.1:$etcd_peer" \
            --heartbeat-interval 50 --election-timeout 500 --logger zap --log-level warn \
            >"$ETCD_LOG" 2>&1 &
        ETCD_PID=$!
        BG_PIDS="$BG_PIDS $ETCD_PID"
        etcd_n=0
        until "$DLOCK" --url "$ETCD_URL" status probe >/dev/null 2>&1; do
            etcd_n=$((etcd_n + 1))
            if grep -q 'address already in use' "$ETCD_LOG" && [ "$etcd_try" -lt 5 ]; then
                kill -TERM "$ETCD_PID" 2>/dev/null
                wait "$ETCD_PID" 2>/dev/null
                continue 2
            fi
            if [ "$etcd_n" -gt 600 ]; then
                fail "the private etcd did not become healthy: $(tail -5 "$ETCD_LOG")"
                finish
            fi
            sleep 0.05
        done
        break
    done
    [ $# -eq 0 ] && return
    # etcdctl's auth enable grants root the root role it needs.
    { etcd_ctl user add "root:$1" && etcd_ctl auth enable; } >>"$ETCD_LOG" 2>&1 ||
        { fail "cannot turn on auth in the private etcd: $(tail -5 "$ETCD_LOG")"; finish; }
}

# start_private_server: a server of the test's own, to stop or kill: a
# redis-server on a unix socket in $WORK, with etcd a private member
# (start_etcd), with ZooKeeper a private standalone server (start_zk). Sets SERVER (its pid) and SERVER_URL; it is stopped on exit
# with the other background processes.
start_private_server() {
    if [ "$BACKEND" = zk ]; then
        start_zk
        SERVER=$ZK_PID SERVER_URL=$ZK_URL
        return
    fi
    if [ "$BACKEND" = etcd ]; then
        start_etcd
        SERVER=$ETCD_PID SERVER_URL=$ETCD_URL
        return
    fi
    command -v redis-server >/dev/null || { fail "redis-server is not installed"; finish; }
    SERVER_URL=unix://$WORK/redis.sock
    redis-server --port 0 --unixsocket "$WORK/redis.sock" --dir "$WORK" --save '' \
        --appendonly no --loglevel warning >"$WORK/redis.log" 2>&1 &
    SERVER=$!
    BG_PIDS="$BG_PIDS $SERVER"
    n=0
    until "$DLOCK" --url "$SERVER_URL" status probe >/dev/null 2>&1; do
        n=$((n + 1))
        if [ "$n" -gt 600 ] || ! kill -0 "$SERVER" 2>/dev/null; then
            fail "redis-server did not start: $(cat "$WORK/redis.log")"
            finish
        fi
        sleep 0.05
    done
}

# now_ms: the wall clock in milliseconds, to report how long something took.
now_ms() { date +%s%3N; }

# alive PID: PID runs. A zombie (dead, not yet reaped by its parent, or by
# init after its parent died) runs no more.
alive() {
    alive_state=$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$1/status" 2>/dev/null)
    [ -n "$alive_state" ] && [ "$alive_state" != Z ]
}

# within SECONDS CMD...: run CMD every 20 ms until it succeeds (true), or
# until SECONDS have passed (false). SECONDS is the bound a check allows,
# generous enough for a loaded machine; the wait ends as soon as CMD holds.
within() {
    within_end=$(($(now_ms) + $1 * 1000))
    shift
    until "$@"; do
        [ "$(now_ms)" -lt "$within_end" ] || return 1
        sleep 0.02
    done
}

# gone PID: PID no longer runs.
gone() { ! alive "$1"; }

# What the server keeps for NAME, read with the backend's own client
# (redis-cli, etcdctl), to wait on a waiter's state instead of sleeping:
#   queued NAME: how many acquisitions wait for NAME. etcd: the keys of NAME's
#     queue but the holder's. Redis: 1 while a waiter holds NAME's hand-off
#     slot (dlock:{NAME}:next), else 0 (Redis keeps no other trace of a
#     waiter but its subscription).
#   subscribed NAME: on Redis the subscribers to NAME's release channel; on
#   ZooKeeper, etcd and PostgreSQL the waiters (queued).
# Test names are plain ASCII, so NAME needs no escaping in a key.
# zk_children NAME: ZooKeeper only, the nodes in /dlock/NAME, one a line
# (zkCli prints "[a, b]").
zk_children() {
    /usr/share/zookeeper/bin/zkCli.sh -server "$HOSTPORT" ls "/dlock/$1" 2>/dev/null |
        tail -1 | sed -n 's/^\[\(.*\)\]$/\1/p' | tr ',' '\n' | tr -d ' ' | grep .
}
queued() {
    if [ "$BACKEND" = postgres ]; then
        # Lease mode keeps no queue: a waiter is a LISTEN session, one per
        # waiting dlock. The waiters of this script (its application_name)
        # but not which name they wait for: the scripts wait for one name
        # at a time.
        pg_sql "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'cli-$TEST-$$'
                AND query LIKE 'LISTEN %'"
    elif [ "$BACKEND" = zk ]; then
        # The nodes in /dlock/NAME but the holder's.
        zk_kids=$(zk_children "$1" | grep -c .)
        echo $((zk_kids > 0 ? zk_kids - 1 : 0))
    elif [ "$BACKEND" = etcd ]; then
        queued_keys=$(ETCDCTL_API=3 etcdctl --endpoints="$HOSTPORT" --command-timeout=5s \
            get --prefix --keys-only "dlock/$1/" | grep -c .)
        echo $((queued_keys > 0 ? queued_keys - 1 : 0))
    else
        redis-cli -h "${HOSTPORT%:*}" -p "${HOSTPORT##*:}" EXISTS "dlock:{$1}:next"
    fi
}
# pg_sql SQL: one value, read with psql from the test's PostgreSQL.
pg_sql() { psql "$DLOCK_TEST_URL" -XAtq -v ON_ERROR_STOP=1 -c "$1"; }
subscribed() {
    [ "$BACKEND" = postgres ] && { queued "$1"; return; }
    # ZooKeeper: a waiter's node in the queue carries its watch.
    [ "$BACKEND" = zk ] && { queued "$1"; return; }
    # etcd: a waiter's key in the queue carries its watch.
    [ "$BACKEND" = etcd ] && { queued "$1"; return; }
    redis-cli -h "${HOSTPORT%:*}" -p "${HOSTPORT##*:}" PUBSUB NUMSUB "dlock:{$1}:release" | sed -n 2p
}
queued_is() { [ "$(queued "$1")" = "$2" ]; }
subscribed_is() { [ "$(subscribed "$1")" = "$2" ]; }
subscribed_some() { [ "$(subscribed "$1")" -ge 1 ] 2>/dev/null; }

# need_server_tools: redis-cli, etcdctl with etcd, or zkCli.sh with
# ZooKeeper, for queued.
need_server_tools() {
    if [ "$BACKEND" = postgres ]; then
        command -v psql >/dev/null || { fail "psql is not installed (apt-get install postgresql-client)"; finish; }
    elif [ "$BACKEND" = zk ]; then
        [ -x /usr/share/zookeeper/bin/zkCli.sh ] || { fail "zkCli.sh is not installed (apt-get install zookeeper)"; finish; }
    elif [ "$BACKEND" = etcd ]; then
        command -v etcdctl >/dev/null || { fail "etcdctl is not installed (apt-get install etcd-client)"; finish; }
    else
        command -v redis-cli >/dev/null || { fail "redis-cli is not installed (apt-get install redis-tools)"; finish; }
    fi
}

# start_zk: a private standalone ZooKeeper (Debian's zookeeper package) on a
# free loopback port, its data in $WORK, stopped on exit with the other
# background processes. Sets ZK (host:port), ZK_URL and ZK_PID. Ready when
# it answers "srvr"; a port taken meanwhile costs another try.
zk_ready() {
    python3 - "$1" <<'EOF' 2>/dev/null
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2)
s.sendall(b"srvr")
sys.exit(0 if b"Zookeeper version" in s.recv(4096) else 1)
EOF
}
start_zk() {
    [ -e /usr/share/zookeeper/bin/zkServer.sh ] && [ -e /usr/share/java/zookeeper.jar ] ||
        { fail "ZooKeeper is not installed (apt-get install zookeeper)"; finish; }
    zk_try=0
    while :; do
        zk_try=$((zk_try + 1))
        zk_port=$(free_port)
        zk_dir=$WORK/zk.$zk_try
        mkdir -p "$zk_dir/data"
        printf '%s\n' "tickTime=500" "dataDir=$zk_dir/data" "clientPort=$zk_port" \
            "clientPortAddress=127.0.0.1" "admin.enableServer=false" \
            "4lw.commands.whitelist=srvr" "maxSessionTimeout=60000" >"$zk_dir/zoo.cfg"
        printf '%s\n' "log4j.rootLogger=WARN, F" "log4j.appender.F=org.apache.log4j.FileAppender" \
            "log4j.appender.F.File=$zk_dir/zk.log" "log4j.appender.F.layout=org.apache.log4j.PatternLayout" \
            >"$zk_dir/log4j.properties"
        # The jars the server needs (as tests/support/test_zk.c: all of
        # /usr/share/java/* slows the start down tenfold).
        zk_cp=$zk_dir
        for j in zookeeper zookeeper-jute slf4j-api slf4j-simple netty-handler netty-common \
            netty-buffer netty-transport netty-resolver netty-codec netty-transport-native-epoll \
            netty-transport-native-unix-common commons-io metrics-core snappy-java commons-cli log4j-1.2; do
            zk_cp=$zk_cp:/usr/share/java/$j.jar
        done
        java -cp "$zk_cp" org.apache.zookeeper.server.ZooKeeperServerMain "$zk_dir/zoo.cfg" \
            >"$zk_dir/out" 2>&1 &
        ZK_PID=$!
        BG_PIDS="$BG_PIDS $ZK_PID"
        if within 60 zk_ready "$zk_port"; then
            ZK=127.0.0.1:$zk_port
            ZK_URL=zk://$ZK
            return
        fi
        if alive "$ZK_PID" || [ "$zk_try" -ge 5 ]; then
            fail "ZooKeeper did not start on $zk_port: $(tail -5 "$zk_dir/out" "$zk_dir/zk.log" 2>/dev/null)"
            finish
        fi
        wait "$ZK_PID" 2>/dev/null # the port was taken: try another
    done
}
if [ "$ZK_PRIVATE" = 1 ]; then
    start_zk
    URL=$ZK_URL HOSTPORT=$ZK DLOCK_TEST_URL=$ZK_URL
fi

# BACKEND=rediss: the scripts run against a private TLS redis-server.
if [ "$BACKEND" = rediss ]; then start_redis_tls; fi
