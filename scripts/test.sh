#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The whole suite, as `make test` and CI run it:
#   1. a plain build, every test (unit, redis, cli, demo);
#   2. the same suite (but the Curator interop tests) built with
#      AddressSanitizer + UndefinedBehaviorSanitizer;
#   3. the watchdog and waiter tests built with ThreadSanitizer.
# Tests labelled redis start their own throwaway servers; the cli and demo
# tests use the one this script starts on a free loopback port (DLOCK_TEST_URL;
# and an etcd, 3 redis-servers for Redlock and a MariaDB, each its URL).
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=$(nproc 2>/dev/null || echo 2)
command -v redis-server >/dev/null || { echo "test.sh: redis-server is missing (apt-get install redis-server)" >&2; exit 1; }

tmp=$(mktemp -d /tmp/dlock-suite-XXXXXX)
redis_pid=""
redlock_pids=""
etcd_pid=""
zk_pid=""
pg_ctl_bin=""
pg_as=""
mysql_pid=""
fuzz_pid=""
cleanup() {
    # Never fail here: etcd exits 143 on SIGTERM, and under set -e the wait
    # would turn a green run into a failed one.
    set +e
    [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null
    for p in $redlock_pids; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
    [ -n "$etcd_pid" ] && kill "$etcd_pid" 2>/dev/null && wait "$etcd_pid" 2>/dev/null
    [ -n "$zk_pid" ] && kill "$zk_pid" 2>/dev/null && wait "$zk_pid" 2>/dev/null
    [ -n "$pg_ctl_bin" ] && $pg_as "$pg_ctl_bin" -D "$tmp/pg/data" -m immediate stop >/dev/null 2>&1
    [ -n "$mysql_pid" ] && kill "$mysql_pid" 2>/dev/null && wait "$mysql_pid" 2>/dev/null
    # A suite that failed leaves the fuzz build to finish on its own (its
    # lock keeps the next run.sh in that folder waiting for it).
    [ -n "$fuzz_pid" ] && kill "$fuzz_pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
        echo $((20000 + RANDOM % 20000))
}
port=$(free_port)
redis-server --port "$port" --bind 127.0.0.1 --dir "$tmp" --save '' --appendonly no \
    --loglevel warning >"$tmp/redis.log" 2>&1 &
redis_pid=$!
for _ in $(seq 1 200); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.05
done
redis-cli -p "$port" ping >/dev/null || { echo "test.sh: redis-server did not start" >&2; cat "$tmp/redis.log" >&2; exit 1; }
export DLOCK_TEST_URL="redis://127.0.0.1:$port"
echo "== redis-server for the cli and demo tests: $DLOCK_TEST_URL"

# Three independent redis-servers for the cli tests run with a redlock:// URL.
redlock_url=redlock://
for i in 1 2 3; do
    rport=$(free_port)
    mkdir -p "$tmp/redlock$i"
    redis-server --port "$rport" --bind 127.0.0.1 --dir "$tmp/redlock$i" --save '' --appendonly no \
        --loglevel warning >"$tmp/redlock$i.log" 2>&1 &
    redlock_pids="$redlock_pids $!"
    for _ in $(seq 1 200); do
        redis-cli -p "$rport" ping >/dev/null 2>&1 && break
        sleep 0.05
    done
    redis-cli -p "$rport" ping >/dev/null || { echo "test.sh: redis-server $i for redlock did not start" >&2; exit 1; }
    [ "$i" = 1 ] || redlock_url="$redlock_url,"
    redlock_url="${redlock_url}127.0.0.1:$rport"
done
export DLOCK_TEST_REDLOCK_URL=$redlock_url
echo "== redis-servers for the cli tests on redlock: $DLOCK_TEST_REDLOCK_URL"

# An etcd member for the cli tests run with an etcd:// URL.
command -v etcd >/dev/null || { echo "test.sh: etcd is missing (apt-get install etcd-server)" >&2; exit 1; }
eport=$(free_port)
epeer=$(free_port)
etcd --name dlock-test --data-dir "$tmp/etcd" \
    --listen-client-urls "http://127.0.0.1:$eport" --advertise-client-urls "http://127.0.0.1:$eport" \
    --listen-peer-urls "http://127.0.0.1:$epeer" --initial-advertise-peer-urls "http://127.0.0.1:$epeer" \
    --initial-cluster "dlock-test=http://127.0.0.1:$epeer" >"$tmp/etcd.log" 2>&1 &
etcd_pid=$!
for _ in $(seq 1 200); do
    ETCDCTL_API=3 etcdctl --endpoints="127.0.0.1:$eport" --command-timeout=1s endpoint health >/dev/null 2>&1 && break
    sleep 0.05
done
ETCDCTL_API=3 etcdctl --endpoints="127.0.0.1:$eport" --command-timeout=1s endpoint health >/dev/null 2>&1 ||
    { echo "test.sh: etcd did not start" >&2; tail -5 "$tmp/etcd.log" >&2; exit 1; }
export DLOCK_TEST_ETCD_URL="etcd://127.0.0.1:$eport"
echo "== etcd for the cli tests: $DLOCK_TEST_ETCD_URL"

# A standalone ZooKeeper for the cli tests run with a zk:// URL: ticks of
# 500 ms (sessions from 1 s, as waiter_sigkill.sh asks for), sessions up to
# 60 s, no fsync, no admin server. The classpath names the jars the server
# needs, as tests/support/test_zk.c does: all of /usr/share/java/* slows the
# JVM's start tenfold.
[ -e /usr/share/java/zookeeper.jar ] || { echo "test.sh: ZooKeeper is missing (apt-get install zookeeper)" >&2; exit 1; }
zport=$(free_port)
mkdir -p "$tmp/zk/data"
printf '%s\n' "tickTime=500" "dataDir=$tmp/zk/data" "clientPort=$zport" "clientPortAddress=127.0.0.1" \
    "admin.enableServer=false" "4lw.commands.whitelist=srvr" "maxSessionTimeout=60000" \
    "forceSync=no" >"$tmp/zk/zoo.cfg"
printf '%s\n' "log4j.rootLogger=WARN, F" "log4j.appender.F=org.apache.log4j.FileAppender" \
    "log4j.appender.F.File=$tmp/zk/zk.log" "log4j.appender.F.layout=org.apache.log4j.PatternLayout" \
    >"$tmp/zk/log4j.properties"
zcp=$tmp/zk
for j in zookeeper zookeeper-jute slf4j-api slf4j-simple netty-handler netty-common netty-buffer \
    netty-transport netty-resolver netty-codec netty-transport-native-epoll \
    netty-transport-native-unix-common commons-io metrics-core snappy-java commons-cli log4j-1.2; do
    zcp=$zcp:/usr/share/java/$j.jar
done
java -cp "$zcp" org.apache.zookeeper.server.ZooKeeperServerMain "$tmp/zk/zoo.cfg" >"$tmp/zk/out" 2>&1 &
zk_pid=$!
zk_ready() {
    python3 - "$zport" <<'PY' 2>/dev/null
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2)
s.sendall(b"srvr")
sys.exit(0 if b"Zookeeper version" in s.recv(4096) else 1)
PY
}
for _ in $(seq 1 600); do
    zk_ready && break
    sleep 0.1
done
zk_ready || { echo "test.sh: ZooKeeper did not start" >&2; tail -5 "$tmp/zk/out" >&2; exit 1; }
export DLOCK_TEST_ZK_URL="zk://127.0.0.1:$zport"
echo "== ZooKeeper for the cli tests: $DLOCK_TEST_ZK_URL"

# A PostgreSQL for the cli tests run with a postgres:// URL (as
# tests/support/test_pg.c starts one): initdb into $tmp/pg, password
# authentication on TCP (so that a wrong password is refused: exit_codes.sh),
# trust on its unix socket (for psql in the scripts), a free loopback port.
# PostgreSQL refuses to run as root: as root it runs as nobody.
pg_bindir=""
for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && { pg_bindir=$d; break; }
done
[ -n "$pg_bindir" ] || { echo "test.sh: the PostgreSQL server is missing (apt-get install postgresql)" >&2; exit 1; }
mkdir -p "$tmp/pg"
if [ "$(id -u)" -eq 0 ]; then
    chown nobody "$tmp/pg"
    chmod 755 "$tmp" "$tmp/pg"
    pg_as="runuser -u nobody --"
fi
pg_password=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
printf '%s\n' "$pg_password" >"$tmp/pg/pw"
chmod 644 "$tmp/pg/pw"
$pg_as "$pg_bindir/initdb" -D "$tmp/pg/data" -U dlock --pwfile="$tmp/pg/pw" \
    --auth-local=trust --auth-host=scram-sha-256 -E UTF8 >"$tmp/pg/initdb.log" 2>&1 ||
    { echo "test.sh: initdb failed" >&2; cat "$tmp/pg/initdb.log" >&2; exit 1; }
rm -f "$tmp/pg/pw"
pg_ctl_bin=$pg_bindir/pg_ctl
for _ in 1 2 3 4 5; do
    pgport=$(free_port)
    $pg_as "$pg_ctl_bin" -D "$tmp/pg/data" -l "$tmp/pg/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $pgport -k $tmp/pg -c fsync=off -c synchronous_commit=off -c max_connections=300" \
        start >/dev/null 2>&1 && break
    pgport=""
done
[ -n "$pgport" ] || { echo "test.sh: postgres did not start" >&2; tail -5 "$tmp/pg/server.log" >&2; exit 1; }
export DLOCK_TEST_POSTGRES_URL="postgres://dlock:$pg_password@127.0.0.1:$pgport/postgres"
echo "== PostgreSQL for the cli tests: postgres://dlock:***@127.0.0.1:$pgport/postgres"
# A MariaDB for the cli tests run with a mysql:// URL: mariadb-install-db into
# the temp dir, mariadbd on a free port and a socket there (as root it needs
# --user=root). The password is distinctive: env.sh looks for it where it
# must not be.
command -v mariadb-install-db >/dev/null || { echo "test.sh: MariaDB is missing (apt-get install mariadb-server)" >&2; exit 1; }
mport=$(free_port)
mysql_user=""
[ "$(id -u)" -eq 0 ] && mysql_user=--user=root
mariadb-install-db --no-defaults --datadir="$tmp/mysql" --auth-root-authentication-method=normal \
    --skip-test-db $mysql_user >"$tmp/mysql-install.log" 2>&1 ||
    { echo "test.sh: mariadb-install-db failed" >&2; tail -20 "$tmp/mysql-install.log" >&2; exit 1; }
mariadbd --no-defaults --datadir="$tmp/mysql" --socket="$tmp/mysql.sock" --port="$mport" \
    --bind-address=127.0.0.1 --skip-name-resolve --skip-log-bin --innodb-buffer-pool-size=32M \
    --pid-file="$tmp/mysql.pid" --log-error="$tmp/mysql.log" --tmpdir="$tmp" $mysql_user 2>/dev/null &
mysql_pid=$!
for _ in $(seq 1 600); do
    mariadb --no-defaults -S "$tmp/mysql.sock" -uroot -e 'SELECT 1' >/dev/null 2>&1 && break
    sleep 0.1
done
mariadb --no-defaults -S "$tmp/mysql.sock" -uroot -e "CREATE USER 'dlock'@'%' IDENTIFIED BY 'dlock-cli-s3cret';
    GRANT ALL ON *.* TO 'dlock'@'%'; CREATE DATABASE dlock_cli" ||
    { echo "test.sh: MariaDB did not start" >&2; tail -20 "$tmp/mysql.log" >&2; exit 1; }
export DLOCK_TEST_MYSQL_URL="mysql://dlock:dlock-cli-s3cret@127.0.0.1:$mport/dlock_cli"
echo "== MariaDB for the cli tests: mysql://dlock:***@127.0.0.1:$mport/dlock_cli"

run_suite() { # build-dir sanitizer "cmake-options" ctest-args...
    local dir=$1 san=$2 opts=$3
    shift 3
    echo "== build $dir ${san:+(sanitize=$san)}"
    # shellcheck disable=SC2086 # opts is a list of -D options
    cmake -S . -B "$dir" -DDLOCK_SANITIZE="$san" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDLOCK_WERROR=ON \
        $opts >/dev/null
    cmake --build "$dir" -j "$jobs" >/dev/null
    # The plain suite's fuzz cases (fuzz.bounded, fuzz.inprocess) run the
    # libFuzzer targets of $dir/fuzz (clang, ASan+UBSan). Built inside the
    # first case, the clang build held cpu_heavy for 1.5-4 minutes (the chain
    # of cases run one at a time) and a slot; built here, in the background
    # (nice) while the suite runs, it takes the CPU time the suite's waiting
    # cases leave (the CPUs are about half idle), and the cases, last of the
    # chain, find the targets built (or wait for the build: run.sh's lock).
    if [ -z "$san" ]; then
        echo "== build $dir/fuzz in the background (the libFuzzer targets, clang)"
        nice -n 5 tests/fuzz/run.sh --build-only "$PWD/$dir/fuzz" >"$tmp/fuzz-build.out" 2>&1 &
        fuzz_pid=$!
    fi
    echo "== test $dir"
    # --no-tests=error: a label or filter that matches nothing fails, not
    # passes (ctest -L watchdog with no watchdog test would exit 0).
    (cd "$dir" && ctest --output-on-failure --no-tests=error "$@")
    if [ -n "$fuzz_pid" ]; then
        wait "$fuzz_pid" || { echo "test.sh: the fuzz build failed" >&2; cat "$tmp/fuzz-build.out" >&2; exit 1; }
        fuzz_pid=""
    fi
}

# Tests run in parallel: -j 1.5 x the cores in the plain and ASan suites.
# Most cases wait (on leases running out, servers starting, watch events):
# with -j 2 on 2 cores, CI up to the end of the plain suite (its builds
# included) kept the CPUs 42% busy (user + sys over wall time, 2026-12-02),
# and the suite's wall time was the sum of the cases' times over 2. The
# cases that do keep CPUs busy (the chaos rows, the fuzz runs, the install
# check, the Curator interop, the ZooKeeper ensemble) run one at a time
# (RESOURCE_LOCK, DLOCK_CPU_HEAVY in tests/CMakeLists.txt; but a MariaDB
# chaos row beside a PostgreSQL one) and first (their COST; the fuzz runs
# last of them, after their build in the background), beside the rest:
# counted as 2 slots each instead, they were left for last and ran one after
# another (5 minutes of tail). TSan, with the most CPU per case, keeps -j of
# the cores.
many=$(( jobs * 3 / 2 ))
[ "$many" -ge 2 ] || many=2

# Leaks are errors; a sanitizer report fails the test that caused it.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=86"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# tests/tsan.supp: races inside libraries that are not ours, each explained.
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:exitcode=86:suppressions=$PWD/tests/tsan.supp"

run_suite build "" "" -j "$many"
# Left out of the sanitized run, to keep `make test` well under 30 minutes
# on 2 cores (each runs in the plain suite above):
#   interop   the Curator tests run Java beside the dlock command; the
#             sanitizers have nothing of ours to add there;
#   chaos     the fault-injection rows (about 4 minutes under ASan): their
#             fault paths run under ASan in the integration tests
#             (test_safety, the fault-proxy cases of test_etcd and test_redlock,
#             the cluster and failover cases), and
#             `make chaos` runs the long rows;
#   binding   the Python binding's tests: a sanitized libdlock does not
#             load into python3 (the build registers them in the plain
#             build only); the C calls they make run under ASan in core-*;
#   ensemble  the ZooKeeper 3-member case (a minute and a half of JVM
#             restarts; the zk backend's code runs under ASan in the rest of
#             test_zk and core-zk);
#   cli-BACKEND  the command on etcd, ZooKeeper, PostgreSQL, MySQL, Redlock
#             and TLS (about 2 minutes under ASan): the command's own code
#             runs under ASan in the cli cases on Redis, and each backend's
#             in its core, family and own tests. A case runs under a
#             sanitizer once, not once per backend it reaches through;
#   async-BACKEND, core-async-BACKEND  the asynchronous API beyond Redis,
#             etcd and Redlock, and test_async's cases on ZooKeeper,
#             PostgreSQL and MySQL: its engine's waiter is told by the
#             backend (watch_notify: all but MySQL) or waits on a thread of
#             its own (MySQL), and runs under ASan and TSan on those.
# The sanitized builds leave out what none of their tests runs: the bench
# (no test runs it; the plain build compiles it, warnings as errors), and for
# TSan, whose tests are the watchdog cases of the C test programs, also the
# demo, the examples and the man pages.
ASYNC_ELSEWHERE='async-(redis-cluster|redis-sentinel|rediss|plainredis|mysql-named)'
run_suite build-asan "address,undefined" "-DDLOCK_BUILD_BENCH=OFF" -j "$many" -LE 'interop|chaos|ensemble|binding' \
    -E "^(cli-(etcd|zk|postgres|mysql|redlock|tls)|(core-)?$ASYNC_ELSEWHERE|core-async-(zk|postgres|mysql))\\."
run_suite build-tsan "thread" "-DDLOCK_BUILD_BENCH=OFF -DDLOCK_BUILD_DEMO=OFF -DDLOCK_BUILD_EXAMPLES=OFF -DDLOCK_BUILD_MANPAGES=OFF" \
    -j "$jobs" -L watchdog -E "^(core-$ASYNC_ELSEWHERE|core-async-(zk|postgres|mysql))\\."
echo "== all suites passed"
