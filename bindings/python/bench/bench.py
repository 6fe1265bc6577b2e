# SPDX-License-Identifier: BSD-3-Clause
"""The Python binding's cycle beside the C library's and beside the best
native peers, on one throwaway server each, in the same rounds (issue 31's
speed targets: within 1.3x of the C cycle, ahead of the peer):

  Redis: dlock (this binding), dlock's C API (cycle.c), redis-py's Lock
         (Debian's python3-redis: SET NX PX, and a script to release)
  etcd:  dlock, dlock's C API, python-etcd3's Lock (python3-etcd3)

Each cycle is an uncontended acquire (try once, 30 s lease, no renewal)
and release. Usage, from the top of the tree after `make build`:
  python3 bindings/python/bench/bench.py [--build build] [--cycles 2000]
`make bench` runs it.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROUNDS = 5


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, max(0, int(round(p / 100.0 * len(v))) - 1))] / 1000.0


def timed(n, one):
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        one()
        out.append(time.perf_counter_ns() - t0)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--cycles", type=int, default=2000)
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    os.environ.setdefault("DLOCK_LIBRARY", os.path.join(build, "libdlock.so"))
    os.environ.setdefault("DLOCK_MODULE_DIR", os.path.join(build, "dlock"))
    sys.path.insert(0, os.path.dirname(HERE))
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
    import dlock
    from conftest import start_etcd, start_redis

    tmp = tempfile.mkdtemp(prefix="dlock-pybench-")
    exe = os.path.join(tmp, "cycle")
    subprocess.run(["cc", "-O2", "-I", os.path.join(HERE, "..", "..", "..", "include"),
                    "-I", os.path.join(build, "include"), "-o", exe, os.path.join(HERE, "cycle.c"),
                    "-L", build, "-Wl,-rpath," + build, "-ldlock"], check=True)
    per = max(1, args.cycles // ROUNDS)
    print("== the Python binding (bindings/python/bench): %d cycles of each, in %d rounds"
          % (per * ROUNDS, ROUNDS))
    print("%-34s %9s %9s   %s" % ("", "p50 us", "p99 us", "ratio (p50)"))
    for start, peer_name in ((start_redis, "redis-py Lock"), (start_etcd, "python-etcd3 Lock")):
        srv = start(tmp)
        try:
            bench_one(dlock, srv, exe, per, peer_name)
        finally:
            srv.proc.terminate()
            srv.proc.wait(10)
    subprocess.run(["rm", "-rf", tmp])


def peer_cycle(srv):
    """One cycle of the peer library on srv, ready to call."""
    host, port = srv.url.split("//")[1].rsplit(":", 1)
    if srv.name == "redis":
        import redis
        r = redis.Redis(host=host, port=int(port))

        def one():
            lk = r.lock("py-bench-peer", timeout=30)
            if not lk.acquire(blocking=False):
                raise RuntimeError("redis-py: the lock is busy")
            lk.release()
        return one
    import etcd3
    e = etcd3.client(host=host, port=int(port))

    def one():
        lk = e.lock("py-bench-peer", ttl=30)
        if not lk.acquire(timeout=0):
            raise RuntimeError("python-etcd3: the lock is busy")
        lk.release()
    return one


def bench_one(dlock, srv, exe, per, peer_name):
    c = dlock.Client(srv.url)

    def binding():
        with c.lock("py-bench-binding", auto_renew=False):
            pass
    peer = peer_cycle(srv)
    timed(per // 5 + 1, binding)  # warm-up
    timed(per // 5 + 1, peer)
    py, pe, cs = [], [], []
    for _ in range(ROUNDS):
        out = subprocess.run([exe, srv.url, "py-bench-c", str(per)], check=True,
                             capture_output=True, text=True).stdout.split()
        cs.append((float(out[0]), float(out[1])))
        py += timed(per, binding)
        pe += timed(per, peer)
    c50 = statistics.median(x[0] for x in cs)
    c99 = statistics.median(x[1] for x in cs)
    p50, e50 = pct(py, 50), pct(pe, 50)
    print("%-34s %9.1f %9.1f" % (srv.name + ": dlock's C API", c50, c99))
    print("%-34s %9.1f %9.1f   %.2f x C (target <= 1.30: %s)" % (
        srv.name + ": dlock for Python", p50, pct(py, 99), p50 / c50,
        "met" if p50 / c50 <= 1.3 else "not met"))
    print("%-34s %9.1f %9.1f   dlock / it: %.2f (target < 1: %s)" % (
        srv.name + ": " + peer_name, e50, pct(pe, 99), p50 / e50,
        "met" if p50 < e50 else "not met"))
    c.close()


if __name__ == "__main__":
    main()
