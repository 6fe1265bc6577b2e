# SPDX-License-Identifier: BSD-3-Clause
"""python-etcd3's Lock on the etcd dlock-bench --etcd measures, for the same
table: the uncontended cycle (acquire + release) and the hand-off (A
releases, B waiting in acquire() gets the lock). Prints one line:
"cycle_p50 cycle_p99 handoff_p50 handoff_p99" in microseconds.
Usage: etcd3_lock.py HOST PORT CYCLES HANDOFFS"""
import sys
import threading
import time

import etcd3
import etcd3.exceptions


def pct(v, p):
    v = sorted(v)
    rank = max(1, min(len(v), int(p / 100.0 * len(v) + 0.999999)))
    return v[rank - 1] / 1000.0


def main():
    host, port, n, handoffs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    a = etcd3.client(host=host, port=port)
    b = etcd3.client(host=host, port=port)
    name = "py-bench-cycle"
    for _ in range(20):
        lk = a.lock(name, ttl=30)
        lk.acquire()
        lk.release()
    cyc = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        lk = a.lock(name, ttl=30)
        lk.acquire()
        lk.release()
        cyc.append(time.perf_counter_ns() - t0)

    hand = []
    go, done = threading.Semaphore(0), threading.Semaphore(0)
    end = [0]

    def waiter():
        for _ in range(handoffs + 5):
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
    for i in range(handoffs + 5):
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
    print("%.1f %.1f %.1f %.1f" % (pct(cyc, 50), pct(cyc, 99), pct(hand, 50), pct(hand, 99)))


main()
