// SPDX-License-Identifier: BSD-3-Clause
// The payout job of seed 000, in Node.js (the C one: examples/payout.c; the
// Python one: bindings/python/examples/payout.py).
//
// A scheduler fires this job on every instance at once. The instance that
// gets the lock pays the pending orders; the others see the lock busy and
// stop. The lock alone is not enough: a holder can stall (a GC pause, a
// swapped-out page, SIGSTOP) past its lease while another instance takes
// over. So the store checks the lock's fence:
//
//   1. the holder registers its fence with the store before it reads;
//   2. every payment commits only if that fence is still the highest the
//      store has seen for the job, in the same transaction as the payment.
//
// A stale holder that wakes up finds its writes refused, and client.using
// tells it the lock was lost (it rejects with dlock.LockLost).
//
//   node payout.js [URL] [DB_FILE] [--ttl MS] [--wait MS] [--stall-after N]
//
// --stall-after N stops the process (SIGSTOP) after its N-th payment, as a
// long pause would; send it SIGCONT to wake it (the test does). The store
// is SQLite, through the sqlite3 program (Debian's sqlite3), one
// transaction per run of it.
'use strict';

const { execFile } = require('child_process');
const dlock = require('..');

const SCHEMA = `
CREATE TABLE IF NOT EXISTS payout(order_id INTEGER PRIMARY KEY, amount_cents INTEGER NOT NULL,
    status TEXT NOT NULL DEFAULT 'PENDING', fence INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS ledger(order_id INTEGER NOT NULL, fence INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS job_fence(job TEXT PRIMARY KEY, fence INTEGER NOT NULL);
INSERT OR IGNORE INTO job_fence VALUES ('payout', 0);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 10)
    INSERT INTO payout(amount_cents) SELECT 1000 * i FROM n
    WHERE NOT EXISTS (SELECT 1 FROM payout);
`;

// Runs sql (one script, its own transactions) on the database file db;
// resolves to the output lines.
function sqlite(db, sql) {
  return new Promise((resolve, reject) => {
    const p = execFile('sqlite3', ['-bail', '-cmd', '.timeout 5000', db], (err, out, errOut) => {
      if (err)
        reject(new Error(`sqlite3: ${errOut.trim() || err.message}`));
      else
        resolve(out.split('\n').filter((l) => l.length > 0));
    });
    p.stdin.end(sql);
  });
}

// Pays order if fence is still the job's highest: the check and the write
// in one IMMEDIATE transaction. true paid, false refused (stale). Numbers
// only are put in the SQL (order from the store, fence a BigInt).
async function pay(db, order, fence) {
  const [n] = await sqlite(db, `BEGIN IMMEDIATE;
    UPDATE payout SET status = 'PAID', fence = ${fence}
      WHERE order_id = ${order} AND status = 'PENDING'
        AND ${fence} = (SELECT fence FROM job_fence WHERE job = 'payout');
    INSERT INTO ledger SELECT ${order}, ${fence} WHERE changes() = 1;
    SELECT changes();
    COMMIT;`);
  return n === '1';
}

function parse(argv) {
  const args = { url: 'redis://127.0.0.1:6379', db: 'payout.db', ttl: 30000, wait: 0,
    stallAfter: 0 };
  const pos = [];
  for (let i = 0; i < argv.length; i++) {
    const flag = { '--ttl': 'ttl', '--wait': 'wait', '--stall-after': 'stallAfter' }[argv[i]];
    if (flag)
      args[flag] = Number(argv[++i]);
    else
      pos.push(argv[i]);
  }
  if (pos[0])
    args.url = pos[0];
  if (pos[1])
    args.db = pos[1];
  return args;
}

async function main() {
  const args = parse(process.argv.slice(2));
  await sqlite(args.db, `PRAGMA journal_mode = WAL;${SCHEMA}`);
  const client = await dlock.connect(args.url);
  try {
    // Redisson's tryLock(0, 30s): a lease renewed while we hold it.
    await client.using('payout-job', { ttl: args.ttl, wait: args.wait }, async (lock) => {
      const fence = lock.fence;
      let paid = 0;
      let refused = 0;
      // 1. Register the fence before reading anything.
      const [registered] = await sqlite(args.db, `UPDATE job_fence SET fence = ${fence}
        WHERE job = 'payout' AND fence < ${fence}; SELECT changes();`);
      if (registered !== '1') {
        console.log(`payout: fence ${fence} is stale: a newer holder ran`);
        return;
      }
      // 2. The pending orders, read before any write.
      const orders = await sqlite(args.db,
        "SELECT order_id FROM payout WHERE status = 'PENDING' LIMIT 100;");
      for (const order of orders) {
        if (!await pay(args.db, Number(order), fence)) {
          refused++;
          continue;
        }
        paid++;
        if (paid === args.stallAfter) {
          console.log(`payout: stalling after ${paid} payments (fence ${fence})`);
          process.kill(process.pid, 'SIGSTOP');
        }
      }
      console.log(`payout: fence ${fence} paid ${paid} orders, ${refused} refused as stale`);
    });
  } catch (e) {
    if (e instanceof dlock.Busy)
      console.log('payout: another instance is running the job');
    else if (e instanceof dlock.LockLost)
      console.log(`payout: the lock was lost while paying (${e.message}); ` +
        'the store refused the stale writes');
    else
      throw e;
  } finally {
    await client.close();
  }
}

main().catch((e) => {
  console.error(e);
  process.exitCode = 1;
});
