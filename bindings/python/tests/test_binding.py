# SPDX-License-Identifier: BSD-3-Clause
"""The Python binding against real servers (conftest.py): the cases that
matter to a user, run on Redis and on etcd."""
import os
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import dlock

HERE = os.path.dirname(os.path.abspath(__file__))


def child(code, *args):
    """A Python process running code with this binding importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(HERE) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)] + list(args),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def read_until(p, want, seconds=20):
    """Lines of p until one equal to want (fails at p's end or a timeout)."""
    seen = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        line = p.stdout.readline()
        if not line:
            break
        seen.append(line.rstrip("\n"))
        if seen[-1] == want:
            return seen
    pytest.fail("never saw %r from the child; it said: %s" % (want, seen))


STRUCTS = {
    "dlock_client_options": ["version", "connect_timeout_ms", "command_timeout_ms", "key_prefix",
                             "client_name", "log", "log_payload", "log_level", "trace",
                             "trace_payload", "flags"],
    "dlock_acquire_options": ["version", "wait_ms", "lease_ms", "auto_renew", "on_lost",
                              "payload", "kind", "owner", "reentrant", "permits", "label"],
    "dlock_leader_info": ["held", "fence", "ttl_ms", "identity"],
    "dlock_lock_info": ["held", "fence", "ttl_ms", "has_holder", "host", "pid", "start_ms",
                        "label", "holders", "kind"],
    "dlock_trace_event": ["phase", "id", "call", "name", "count", "duration_us", "result"],
}


def test_layout_matches_the_header(tmp_path):
    """The binding's struct declarations (dlock/_ffi.py) have the header's
    sizes and offsets: a field added to dlock.h and not here fails."""
    from dlock._ffi import ffi
    include = os.path.join(os.path.dirname(HERE), "..", "..", "include")
    # dlock/version.h is made by the build, beside libdlock.so.
    built = os.path.join(os.path.dirname(os.environ.get("DLOCK_LIBRARY", "build/x")), "include")
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <dlock/dlock.h>",
             "int main(void) {"]
    for st, fields in STRUCTS.items():
        lines.append('printf("%s %%zu\\n", sizeof(%s));' % (st, st))
        for f in fields:
            lines.append('printf("%s.%s %%zu\\n", offsetof(%s, %s));' % (st, f, st, f))
    lines.append("return 0; }")
    (tmp_path / "layout.c").write_text("\n".join(lines) + "\n")
    exe = str(tmp_path / "layout")
    subprocess.run(["cc", "-I", include, "-I", built, "-o", exe, str(tmp_path / "layout.c")], check=True)
    want = dict(l.split() for l in subprocess.run([exe], capture_output=True, text=True,
                                                  check=True).stdout.splitlines())
    for st, fields in STRUCTS.items():
        assert ffi.sizeof(st) == int(want[st]), st
        for f in fields:
            assert ffi.offsetof(st, f) == int(want[st + "." + f]), st + "." + f


def closed_port(url):
    """url with its server's port replaced by 1, where nobody listens."""
    scheme, rest = url.split("://", 1)
    cut = min([i for i in (rest.find("/"), rest.find("?")) if i >= 0] or [len(rest)])
    host = rest[:cut]
    return "%s://%s:1%s" % (scheme, host.rsplit(":", 1)[0], rest[cut:])


def test_version():
    v = dlock.version()
    assert v.count(".") == 2 and all(p.isdigit() for p in v.split("."))


def test_cycle(client, name):
    with client.lock(name, ttl=10) as lock:
        assert lock.fence > 0
        assert not lock.lost
        assert 9.0 < lock.valid <= 10.0
        assert lock.name == name
        assert client.status(name).held
        lock.check()
    assert lock.released
    assert not client.status(name).held


def test_fences_rise_across_clients(server, client, name):
    fences = []
    with dlock.Client(server.url) as other:
        for i in range(6):
            c = client if i % 2 else other
            with c.lock(name) as lock:
                fences.append(lock.fence)
    assert fences == sorted(fences) and len(set(fences)) == len(fences)


def test_busy_and_timeout(server, client, name):
    with client.lock(name), dlock.Client(server.url) as other:
        with pytest.raises(dlock.Busy) as e:
            other.lock(name)
        assert e.value.code == -1 and e.value.message
        t0 = time.monotonic()
        with pytest.raises(dlock.Timeout) as e:
            other.lock(name, wait=0.3)
        assert isinstance(e.value, TimeoutError) and isinstance(e.value, dlock.Busy)
        assert time.monotonic() - t0 >= 0.3


def test_wait_and_hand_off(server, client, name):
    holder = client.lock(name)
    with dlock.Client(server.url) as other:
        # The release's timer starts after the open, which may take longer
        # than it (a PostgreSQL connection on a loaded machine).
        t0 = time.monotonic()
        threading.Timer(0.3, holder.release).start()
        with other.lock(name, wait=10) as lock:
            waited = time.monotonic() - t0
            assert lock.fence > 0
        assert 0.25 <= waited < 5, waited


def test_expiry_frees_the_lock(server, client, name):
    lost = threading.Event()
    lock = client.lock(name, ttl=server.short_ttl, auto_renew=False,
                       on_lost=lambda l: lost.set())
    time.sleep(server.short_ttl + 0.4)
    assert lock.lost
    assert lost.wait(5), "on_lost never ran"
    with dlock.Client(server.url) as other:
        # The server's own expiry may come a little later (etcd counts
        # leases in whole seconds): wait for it, never for a release.
        with other.lock(name, wait=server.short_ttl * 4 + 2) as again:
            assert again.fence > lock.fence
    with pytest.raises(dlock.LockLost):
        lock.release()


FROZEN = """
    import sys, threading, time
    import dlock
    url, name, ttl = sys.argv[1], sys.argv[2], float(sys.argv[3])
    told = threading.Event()
    c = dlock.Client(url)
    try:
        with c.lock(name, ttl=ttl, on_lost=lambda l: told.set()) as lock:
            print("held", lock.fence, flush=True)
            while not lock.lost:
                time.sleep(0.05)
            print("lost", flush=True)
            print("told" if told.wait(10) else "not told", flush=True)
    except dlock.LockLost as e:
        print("LockLost:", e.message, flush=True)
    print("end", flush=True)
"""


def test_frozen_holder_is_told(server, name):
    """A holder stopped past its lease (SIGSTOP) loses the lock to another;
    resumed, it sees lock.lost, gets on_lost, and its with raises
    LockLost after the body."""
    ttl = max(server.short_ttl * 2, 1.0)
    p = child(FROZEN, server.url, name, str(ttl))
    try:
        seen = []
        while True:
            line = p.stdout.readline()
            assert line, "the holder ended: %s" % seen
            seen.append(line.strip())
            if line.startswith("held "):
                break
        fence = int(line.split()[1])
        os.kill(p.pid, signal.SIGSTOP)
        try:
            with dlock.Client(server.url) as other:
                with other.lock(name, wait=ttl * 4 + 5) as taken:
                    assert taken.fence > fence
        finally:
            os.kill(p.pid, signal.SIGCONT)
        out = read_until(p, "end")
        assert "lost" in out and "told" in out, out
        assert any(l.startswith("LockLost:") for l in out), out
    finally:
        p.kill()
        p.wait()


def test_bad_input_names_what(server, client):
    with pytest.raises(dlock.InvalidArgument) as e:
        dlock.Client("nosuch://127.0.0.1:1")
    assert "nosuch" in e.value.message
    with pytest.raises(dlock.InvalidArgument):
        client.lock("x", ttl=-1)
    with pytest.raises(dlock.InvalidArgument):
        client.lock("x", wait="soon")
    with pytest.raises(dlock.InvalidArgument):
        client.lock("a\0b")
    with pytest.raises(dlock.InvalidArgument) as e:
        client.lock("")
    assert e.value.message
    with pytest.raises(dlock.InvalidArgument):
        client.semaphore("s", permits="2")
    with pytest.raises(ValueError):  # InvalidArgument is one
        client.lock("x", ttl=None)
    with pytest.raises(dlock.Unreachable):
        dlock.Client(closed_port(server.url), connect_timeout=1).lock("x")


def test_release_twice_is_misuse(client, name):
    lock = client.lock(name)
    lock.release()
    with pytest.raises(dlock.Misuse):
        lock.release()


def test_read_write(server, client, name):
    with dlock.Client(server.url) as other:
        r1 = client.read_lock(name)
        r2 = other.read_lock(name)
        with pytest.raises(dlock.Busy):
            other.write_lock(name)
        r1.release()
        r2.release()
        with other.write_lock(name) as w:
            assert w.kind == "write"
            with pytest.raises(dlock.Busy):
                client.read_lock(name)
            w.downgrade()
            assert w.kind == "read"
            with client.read_lock(name):
                pass


def test_semaphore(server, client, name):
    with dlock.Client(server.url) as other:
        a = client.semaphore(name, 2)
        b = other.semaphore(name, 2)
        with pytest.raises(dlock.Busy):
            client.semaphore(name, 2)
        client.set_permits(name, 3)
        with client.semaphore(name, 2):
            pass
        a.release()
        b.release()


def test_multi_all_or_nothing(server, client, name):
    names = [name + "-a", name + "-b", name + "-c"]
    with dlock.Client(server.url) as other:
        with other.lock(names[1]):
            with pytest.raises(dlock.Busy):
                client.acquire_multi(names)
            assert not other.status(names[0]).held
        with client.acquire_multi(names) as m:
            assert m.names == names
            assert all(f > 0 for f in m.fences)
            with pytest.raises(dlock.Busy):
                other.lock(names[2])


def test_leader(server, client, name):
    with client.campaign(name, "alpha") as lead:
        info = client.leader(name)
        assert info.held and info.identity == "alpha" and info.fence == lead.fence
        with dlock.Client(server.url) as other:
            with pytest.raises(dlock.Busy):
                other.campaign(name, "beta", wait=0)
    assert not client.leader(name).held


WAITER = """
    import sys, time
    import dlock
    c = dlock.Client(sys.argv[1])
    print("waiting", flush=True)
    t0 = time.monotonic()
    try:
        c.lock(sys.argv[2], wait=None, fair=True)
        print("got it", flush=True)
    except KeyboardInterrupt:
        print("interrupted after %.1f s" % (time.monotonic() - t0), flush=True)
    c.close()
    print("end", flush=True)
"""


def test_ctrl_c_leaves_the_queue(server, client, name):
    with client.lock(name, wait=0, fair=True):
        p = child(WAITER, server.url, name)
        try:
            read_until(p, "waiting")
            time.sleep(0.5)
            p.send_signal(signal.SIGINT)
            out = read_until(p, "end")
        finally:
            p.kill()
            p.wait()
    assert any(l.startswith("interrupted") for l in out), out
    # Nobody is left waiting: the next try takes the lock at once.
    with client.lock(name, fair=True):
        pass


def test_memory_flat(server, client, name):
    """100,000 cycles (Redis; 10,000 on etcd, 2,000 on the others) leave
    the RSS flat."""
    n = {"redis": 100000, "etcd": 10000}.get(server.name, 2000)
    for _ in range(1000):
        with client.lock(name, auto_renew=False):
            pass
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(n):
        with client.lock(name, auto_renew=False):
            pass
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print("%d cycles on %s: peak RSS grew %d KiB" % (n, server.name, grown))
    assert grown < 8 * 1024


def test_missing_library_is_named():
    env = dict(os.environ, DLOCK_LIBRARY="/nonexistent/libdlock.so")
    env["PYTHONPATH"] = os.path.dirname(HERE)
    p = subprocess.run([sys.executable, "-c", "import dlock"], capture_output=True, text=True,
                       env=env)
    assert p.returncode != 0
    assert "ImportError: dlock: cannot load libdlock" in p.stderr
    assert "/nonexistent/libdlock.so" in p.stderr and "DLOCK_LIBRARY" in p.stderr


def test_wheel_installs_in_a_virtualenv(redis_server, tmp_path):
    """python3 -m build makes a wheel (offline: --no-isolation), which a
    virtualenv installs and uses."""
    server = redis_server
    src = tmp_path / "src"
    shutil.copytree(os.path.dirname(HERE), src, ignore=shutil.ignore_patterns("tests", "__pycache__"))
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir",
                    str(tmp_path / "dist"), str(src)], check=True, capture_output=True)
    wheels = list((tmp_path / "dist").glob("dlock-*.whl"))
    assert len(wheels) == 1
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(tmp_path / "venv")],
                   check=True, capture_output=True)
    py = str(tmp_path / "venv" / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "--no-index", "--no-deps", str(wheels[0])],
                   check=True, capture_output=True)
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    out = subprocess.run([py, "-c", "import dlock, sys\n"
                          "with dlock.Client(sys.argv[1]) as c, c.lock('py-wheel') as l:\n"
                          "    print(dlock.__file__, l.fence)", server.url],
                         check=True, capture_output=True, text=True, env=env, cwd=str(tmp_path)).stdout
    assert str(tmp_path / "venv") in out and int(out.split()[-1]) > 0


def test_payout_example_frozen_holder(redis_server, tmp_path):
    """examples/payout.py, the seed's job: an instance stalls (SIGSTOP) in
    the middle of paying, past its lease; another takes the lock and pays
    the rest; woken, the stale one's writes are refused and it is told.
    Every order paid exactly once."""
    example = os.path.join(os.path.dirname(HERE), "examples", "payout.py")
    db = str(tmp_path / "payout.db")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(HERE)
    a = subprocess.Popen([sys.executable, example, redis_server.url, db, "--ttl", "1",
                          "--stall-after", "3"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env=env)
    try:
        line = a.stdout.readline()
        assert "stalling after 3" in line, line
        # A is stopped now (its state: T).
        b = subprocess.run([sys.executable, example, redis_server.url, db, "--wait", "10"],
                           capture_output=True, text=True, env=env, timeout=60)
        assert "paid 7 orders" in b.stdout, b.stdout + b.stderr
        os.kill(a.pid, signal.SIGCONT)
        out = a.communicate(timeout=30)[0]
    finally:
        a.kill()
        a.wait()
    assert "refused as stale" in out and "the lock was lost" in out, out
    import sqlite3
    rows = sqlite3.connect(db).execute(
        "SELECT order_id, COUNT(*) FROM ledger GROUP BY order_id").fetchall()
    assert len(rows) == 10 and all(n == 1 for _, n in rows), rows
