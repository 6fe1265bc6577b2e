// node-redlock's acquire+release cycle, for dlock-bench --redlock to print
// beside dlock's on the same servers in the same run (docs/bench.md).
//
//   node node_redlock.js ITERATIONS HOST:PORT[,HOST:PORT...]
//
// The servers' password, if any, comes in DLOCK_BENCH_REDIS_PASSWORD (not on
// the command line, where other users could read it). Needs npm's redlock
// (v5) and ioredis where require() finds them (NODE_PATH). Prints one line:
//   cycle_p50_us=N cycle_p99_us=N samples=N
// Like dlock's cycle, each acquire tries once (retryCount 0), with the same
// lease and drift (driftFactor 0.01).
'use strict';

const Redis = require('ioredis');
const Redlock = require('redlock').default;

const LEASE_MS = 10000;

async function main() {
  const iterations = parseInt(process.argv[2], 10);
  const nodes = (process.argv[3] || '').split(',').filter((s) => s.length > 0);
  if (!(iterations > 0) || nodes.length === 0) {
    console.error('usage: node node_redlock.js ITERATIONS HOST:PORT[,HOST:PORT...]');
    process.exit(2);
  }
  const password = process.env.DLOCK_BENCH_REDIS_PASSWORD || undefined;
  const clients = nodes.map((hp) => {
    const i = hp.lastIndexOf(':');
    return new Redis({ host: hp.slice(0, i), port: parseInt(hp.slice(i + 1), 10), password,
                       enableOfflineQueue: true, maxRetriesPerRequest: 1 });
  });
  const redlock = new Redlock(clients, { driftFactor: 0.01, retryCount: 0 });
  const resource = 'node-redlock-bench:' + process.pid;

  async function cycle() {
    const lock = await redlock.acquire([resource], LEASE_MS);
    await lock.release();
  }

  const warm = Math.max(200, Math.floor(iterations / 10));
  for (let i = 0; i < warm; i++)
    await cycle();
  const samples = new Array(iterations);
  for (let i = 0; i < iterations; i++) {
    const t0 = process.hrtime.bigint();
    await cycle();
    samples[i] = Number(process.hrtime.bigint() - t0) / 1000;
  }
  samples.sort((a, b) => a - b);
  const pct = (p) => samples[Math.min(samples.length, Math.max(1, Math.ceil(p / 100 * samples.length))) - 1];
  console.log(`cycle_p50_us=${pct(50).toFixed(1)} cycle_p99_us=${pct(99).toFixed(1)} samples=${iterations}`);
  await Promise.all(clients.map((c) => c.quit()));
}

main().catch((err) => {
  console.error('node_redlock.js: ' + (err && err.stack ? err.stack : err));
  process.exit(1);
});
