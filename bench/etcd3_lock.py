# SPDX-License-Identifier: BSD-3-Clause
"""python-etcd3's Lock on the etcd dlock-bench --etcd measures, for the same
table: the uncontended cycle (acquire + release) and the hand-off (A
releases, B waiting in acquire() gets the lock).

Driven by dlock-bench on stdin, so that its cycles run interleaved with
dlock's, round by round, on the same etcd at the same time of the run:
prints "ready" once connected and warmed up, then answers each command
with a line:
  cycles N    run N cycles, recording each         -> "ok"
  handoffs N  run N hand-offs (after 5 unrecorded)  -> "ok"
  report      "cycle_p50 cycle_p99 handoff_p50 handoff_p99" in microseconds,
              and exit
Usage: etcd3_lock.py HOST PORT"""
import os
import sys
import threading
import time

import etcd3
import etcd3.exceptions


def pct(v, p):
    if not v:
        return 0.0
    v = sorted(v)
    rank = max(1, min(len(v), int(p / 100.0 * len(v) + 0.999999)))
    return v[rank - 1] / 1000.0


def cycles(a, n, out):
    name = "py-bench-cycle"
    for _ in range(n):
        t0 = time.perf_counter_ns()
        lk = a.lock(name, ttl=30)
        lk.acquire()
        lk.release()
        if out is not None:
            out.append(time.perf_counter_ns() - t0)


def handoffs(a, b, n, hand):
    go, done = threading.Semaphore(0), threading.Semaphore(0)
    end = [0]

    def waiter():
        for _ in range(n + 5):
            go.acquire()
            lk = b.lock("py-bench-handoff", ttl=30)
            # Lock.acquire's own wait (a try, then watch_once on the key),
            # spelt out: Debian's tenacity no longer calls Lock's wait
            # function with the arguments it takes (TypeError).
            while not lk.acquire(timeout=0):
                try:
                    b.watch_once(lk.key, timeout=5)
                except etcd3.exceptions.WatchTimedOut:
                    pass
            end[0] = time.perf_counter_ns()
            lk.release()
            done.release()

    t = threading.Thread(target=waiter)
    t.start()
    for i in range(n + 5):
        lk = a.lock("py-bench-handoff", ttl=30)
        lk.acquire()
        go.release()
        time.sleep(0.02)  # B is queued and watching
        t0 = time.perf_counter_ns()
        lk.release()
        done.acquire()
        if i >= 5:
            hand.append(end[0] - t0)
    t.join()


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    # The throwaway etcd's root user, if dlock-bench turned authentication on.
    auth = {}
    if os.environ.get("DLOCK_BENCH_ETCD_USER"):
        auth = {"user": os.environ["DLOCK_BENCH_ETCD_USER"],
                "password": os.environ["DLOCK_BENCH_ETCD_PASSWORD"]}
    a = etcd3.client(host=host, port=port, **auth)
    b = etcd3.client(host=host, port=port, **auth)
    # python-etcd3 sends the token twice: as metadata and as call
    # credentials, which grpcio 1.51 and later refuse to send over a plain
    # channel ("does not have a sufficient security level"). The metadata
    # is enough for etcd.
    for c in (a, b):
        c.call_credentials = None
        c.watcher._credentials = None
    cyc, hand = [], []
    cycles(a, 20, None)
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["cycles"]:
            cycles(a, int(words[1]), cyc)
        elif words[:1] == ["handoffs"]:
            handoffs(a, b, int(words[1]), hand)
        elif words[:1] == ["report"]:
            print("%.1f %.1f %.1f %.1f" % (pct(cyc, 50), pct(cyc, 99), pct(hand, 50), pct(hand, 99)),
                  flush=True)
            return
        else:
            print("unknown command: %s" % line.strip(), flush=True)
            return
        print("ok", flush=True)


main()
