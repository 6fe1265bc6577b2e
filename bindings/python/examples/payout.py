# SPDX-License-Identifier: BSD-3-Clause
"""The payout job of seed 000, in Python (the C one: examples/payout.c).

A scheduler fires this job on every instance at once. The instance that
gets the lock pays the pending orders; the others see the lock busy and
stop. The lock alone is not enough: a holder can stall (a GC pause, a
swapped-out page, SIGSTOP) past its lease while another instance takes
over. So the store checks the lock's fence:

  1. the holder registers its fence with the store before it reads;
  2. every payment commits only if that fence is still the highest the
     store has seen for the job, in the same transaction as the payment.

A stale holder that wakes up finds its writes refused, and leaving the
``with`` block tells it the lock was lost (dlock.LockLost).

  python3 payout.py [URL] [DB_FILE] [--ttl S] [--wait S] [--stall-after N]

--stall-after N stops the process (SIGSTOP) after its N-th payment, as a
long pause would; send it SIGCONT to wake it (the test does).
"""
import argparse
import os
import signal
import sqlite3
import sys

import dlock

SCHEMA = """
CREATE TABLE IF NOT EXISTS payout(order_id INTEGER PRIMARY KEY, amount_cents INTEGER NOT NULL,
    status TEXT NOT NULL DEFAULT 'PENDING', fence INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS ledger(order_id INTEGER NOT NULL, fence INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS job_fence(job TEXT PRIMARY KEY, fence INTEGER NOT NULL);
INSERT OR IGNORE INTO job_fence VALUES ('payout', 0);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 10)
    INSERT INTO payout(amount_cents) SELECT 1000 * i FROM n
    WHERE NOT EXISTS (SELECT 1 FROM payout);
"""


def pay(db, order, fence):
    """Pay order if fence is still the job's highest: the check and the
    write in one IMMEDIATE transaction. True paid, False refused (stale)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        n = db.execute("UPDATE payout SET status = 'PAID', fence = ?2"
                       " WHERE order_id = ?1 AND status = 'PENDING'"
                       "   AND ?2 = (SELECT fence FROM job_fence WHERE job = 'payout')",
                       (order, fence)).rowcount
        if n == 1:
            db.execute("INSERT INTO ledger VALUES (?, ?)", (order, fence))
        db.execute("COMMIT")
        return n == 1
    except BaseException:
        db.execute("ROLLBACK")
        raise


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url", nargs="?", default="redis://127.0.0.1:6379")
    ap.add_argument("db", nargs="?", default="payout.db")
    ap.add_argument("--ttl", type=float, default=30)
    ap.add_argument("--wait", type=float, default=0)
    ap.add_argument("--stall-after", type=int, default=0)
    args = ap.parse_args()

    db = sqlite3.connect(args.db, timeout=5, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.executescript(SCHEMA)
    paid = refused = 0
    with dlock.Client(args.url) as client:
        try:
            # Redisson's tryLock(0, 30s): a lease renewed while we hold it.
            with client.lock("payout-job", ttl=args.ttl, wait=args.wait) as lock:
                fence = lock.fence
                # 1. Register the fence before reading anything.
                if db.execute("UPDATE job_fence SET fence = ?1 WHERE job = 'payout' AND fence < ?1",
                              (fence,)).rowcount != 1:
                    print("payout: fence %d is stale: a newer holder ran" % fence, flush=True)
                    return 1
                # 2. The pending orders, read before any write.
                orders = [r[0] for r in db.execute(
                    "SELECT order_id FROM payout WHERE status = 'PENDING' LIMIT 100")]
                for order in orders:
                    if not pay(db, order, fence):
                        refused += 1
                        continue
                    paid += 1
                    if paid == args.stall_after:
                        print("payout: stalling after %d payments (fence %d)" % (paid, fence),
                              flush=True)
                        os.kill(os.getpid(), signal.SIGSTOP)
                print("payout: fence %d paid %d orders, %d refused as stale"
                      % (fence, paid, refused), flush=True)
        except dlock.Busy:
            print("payout: another instance is running the job", flush=True)
        except dlock.LockLost as e:
            print("payout: the lock was lost while paying (%s); the store refused the stale "
                  "writes" % e.message, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
