# SPDX-License-Identifier: BSD-3-Clause
"""Real servers for the binding's tests: a redis-server and a one-member
etcd, each started on free loopback ports in a temporary directory and
stopped at the end (Debian's redis-server and etcd-server packages), and
the ZooKeeper, PostgreSQL and MariaDB that scripts/test.sh starts for the
suite, when their DLOCK_TEST_*_URL is set (make test sets them)."""
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def need(program, package):
    path = shutil.which(program) or ("/usr/bin/" + program if os.path.exists("/usr/bin/" + program) else None)
    if path is None:
        pytest.fail("%s is missing: apt-get install %s" % (program, package))
    return path


def wait_until(check, what, seconds=30):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if check():
            return
        time.sleep(0.05)
    pytest.fail("%s did not come up within %d s" % (what, seconds))


class Server:
    def __init__(self, name, url, proc, short_ttl):
        self.name, self.url, self.proc, self.short_ttl = name, url, proc, short_ttl


def start_redis(tmp):
    port = free_port()
    proc = subprocess.Popen([need("redis-server", "redis-server"), "--port", str(port),
                             "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", tmp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up():
        try:
            with socket.create_connection(("127.0.0.1", port), 0.2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False
    wait_until(up, "redis-server")
    return Server("redis", "redis://127.0.0.1:%d" % port, proc, 0.5)


def start_etcd(tmp):
    client, peer = free_port(), free_port()
    proc = subprocess.Popen([
        need("etcd", "etcd-server"), "--name", "py", "--data-dir", os.path.join(tmp, "etcd"),
        "--listen-client-urls", "http://127.0.0.1:%d" % client,
        "--advertise-client-urls", "http://127.0.0.1:%d" % client,
        "--listen-peer-urls", "http://127.0.0.1:%d" % peer,
        "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % peer,
        "--initial-cluster", "py=http://127.0.0.1:%d" % peer,
        "--heartbeat-interval", "50", "--election-timeout", "500",
        "--logger", "zap", "--log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up():
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/health" % client, timeout=0.5) as r:
                return b'"true"' in r.read()
        except OSError:
            return False
    wait_until(up, "etcd")
    return Server("etcd", "etcd://127.0.0.1:%d" % client, proc, 1.0)


def _serve(start):
    tmp = tempfile.mkdtemp(prefix="dlock-py-")
    srv = start(tmp)
    yield srv
    srv.proc.terminate()
    srv.proc.wait(10)
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server():
    yield from _serve(start_redis)


@pytest.fixture(scope="session")
def etcd_server():
    yield from _serve(start_etcd)


# The servers scripts/test.sh starts for the whole suite (make test), when
# it names them: every case runs on those backends too.
SHARED = [("zk", "DLOCK_TEST_ZK_URL", 1.0), ("postgres", "DLOCK_TEST_POSTGRES_URL", 1.0),
          ("mysql", "DLOCK_TEST_MYSQL_URL", 1.0)]
BACKENDS = ["redis", "etcd"] + [b for b, env, _ in SHARED if os.environ.get(env)]


@pytest.fixture(params=BACKENDS)
def server(request):
    """Each case that takes it runs on every backend at hand: the redis-server
    and the etcd started here, and the shared servers of make test."""
    for name, env, short_ttl in SHARED:
        if request.param == name:
            return Server(name, os.environ[env], None, short_ttl)
    return request.getfixturevalue(request.param + "_server")


@pytest.fixture
def client(server):
    import dlock
    with dlock.Client(server.url) as c:
        yield c


RUN = "%d-%d" % (os.getpid(), int(time.time()))


@pytest.fixture
def name(request):
    """A lock name of this test's own, and of this run's (the shared servers
    keep a semaphore's permits, a queue's places, from run to run)."""
    return "py-%s-%s" % (request.node.name.replace("[", "-").replace("]", ""), RUN)
