#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Installs the Debian packages dlock needs, when any is missing. Needs root
# (or sudo) only when something is missing.
#   scripts/deps.sh demo   what `make demo` needs: the build (every backend's
#                          client library, scdoc for the man pages) and the
#                          redis-server the demo starts; no JDK, no database
#                          servers
#   scripts/deps.sh        what `make test` and CI need besides: the servers
#                          the tests start (etcd, ZooKeeper, PostgreSQL,
#                          MariaDB, Sentinel), the Curator interop test's
#                          Java, clang for the fuzzers, spin, faketime, the
#                          Python binding's cffi and pytest, ...
# `make build` and `make install` install nothing.
set -eu
build="build-essential cmake pkg-config python3 libhiredis-dev libssl-dev liburing-dev openssl libsqlite3-dev sqlite3 libpq-dev libcurl4-openssl-dev libjansson-dev golang-etcd-server-dev protobuf-c-compiler libprotobuf-c-dev libzookeeper-mt-dev libmariadb-dev scdoc redis-server redis-tools"
pkgs=$build
if [ "${1:-test}" != demo ]; then
    pkgs="$pkgs redis-sentinel postgresql etcd-server etcd-client python3-etcd3 faketime clang libclang-rt-14-dev spin man-db debhelper lintian mariadb-server"
    # The event loops of the asynchronous examples (examples/async_uv.c,
    # async_event.c, on the adapters in include/dlock/adapters/): built only
    # when found, so not needed by the demo.
    pkgs="$pkgs libuv1-dev libevent-dev"
    # ZooKeeper's server for the tests, and the Curator interop test
    # (tests/interop/curator): Java, Curator's recipes and what they load
    # (the ZooKeeper client jars, Guava, slf4j).
    pkgs="$pkgs zookeeper default-jdk-headless libcurator-recipes-java libcurator-framework-java libcurator-client-java libzookeeper-java libguava-java libslf4j-java"
    # The Python binding's tests (bindings/python): cffi, pytest, and what
    # makes its wheel and installs it in a virtualenv; redis-py, its bench's
    # peer.
    pkgs="$pkgs python3-cffi python3-pytest python3-build python3-setuptools python3-venv python3-redis"
    # The Node.js binding's (bindings/node): Node, npm and Node's headers
    # for node-gyp (a Node from elsewhere, as NodeSource's package, brings
    # its own npm and headers: then nothing is added).
    command -v node >/dev/null 2>&1 || pkgs="$pkgs nodejs"
    command -v npm >/dev/null 2>&1 || pkgs="$pkgs npm"
    [ -f "$(dirname "$(dirname "$(command -v node || echo /usr/bin/node)")")/include/node/node_api.h" ] ||
        pkgs="$pkgs libnode-dev"
fi
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "dlock: installing Debian packages:$missing"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
# Another apt-get (an unattended upgrade, a second checkout's make) holds
# dpkg's lock for a while: wait for it instead of failing at once.
$sudo apt-get -o DPkg::Lock::Timeout=600 update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq $missing >/dev/null
