#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Installs the Debian packages dlock needs to build, test and demo, when any
# is missing (scdoc for the man pages, man-db to check them, debhelper for
# the .debs). Needs root (or sudo) only when something is missing. `make
# demo`, `make test` and CI run it; `make build` and `make install` do not.
set -eu
pkgs="build-essential cmake pkg-config python3 libhiredis-dev libssl-dev liburing-dev openssl redis-server redis-sentinel redis-tools libsqlite3-dev sqlite3 libpq-dev postgresql etcd-server etcd-client libcurl4-openssl-dev libjansson-dev golang-etcd-server-dev protobuf-c-compiler libprotobuf-c-dev python3-etcd3 faketime clang libclang-rt-14-dev spin scdoc man-db debhelper mariadb-server libmariadb-dev"
missing=""
# ZooKeeper (the zk module's client library, the server for its tests) and
# the Curator interop test (tests/interop/curator): Java, Curator's recipes
# and what they load (the ZooKeeper client jars, Guava, slf4j).
pkgs="$pkgs zookeeper libzookeeper-mt-dev default-jdk-headless libcurator-recipes-java libcurator-framework-java libcurator-client-java libzookeeper-java libguava-java libslf4j-java"
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "dlock: installing Debian packages:$missing"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
