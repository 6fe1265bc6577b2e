// node-redlock's acquire+release cycle, for dlock-bench --redlock to print
// beside dlock's on the same servers in the same run (docs/bench.md).
//
//   node node_redlock.js ITERATIONS HOST:PORT[,HOST:PORT...]
//   node node_redlock.js serve HOST:PORT[,HOST:PORT...]
//
// The servers' password, if any, comes in DLOCK_BENCH_REDIS_PASSWORD (not on
// the command line, where other users could read it). Needs npm's redlock
// (v5) and ioredis where require() finds them (NODE_PATH). With ITERATIONS
// it prints one line:
//   cycle_p50_us=N cycle_p99_us=N samples=N
// With serve it warms up, prints "ready", then for each line N read on stdin
// runs N cycles and prints their times in us on one line (space-separated),
// until stdin ends: dlock-bench interleaves these chunks with its own rounds
// and computes both percentiles the same way.
// Like dlock's cycle, each acquire tries once (retryCount 0), with the same
// lease and drift (driftFactor 0.01).
'use strict';

const Redis = require('ioredis');
const Redlock = require('redlock').default;

const LEASE_MS = 10000;

async function main() {
  const serve = process.argv[2] === 'serve';
  const iterations = serve ? 0 : parseInt(process.argv[2], 10);
  const nodes = (process.argv[3] || '').split(',').filter((s) => s.length > 0);
  if (!(serve || iterations > 0) || nodes.length === 0) {
    console.error('usage: node node_redlock.js ITERATIONS|serve HOST:PORT[,HOST:PORT...]');
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

  async function timed() {
    const t0 = process.hrtime.bigint();
    await cycle();
    return Number(process.hrtime.bigint() - t0) / 1000;
  }

  const warm = Math.max(200, Math.floor(iterations / 10));
  for (let i = 0; i < warm; i++)
    await cycle();
  if (serve) {
    const lines = require('readline').createInterface({ input: process.stdin });
    process.stdout.write('ready\n');
    for await (const line of lines) {
      const n = parseInt(line, 10);
      const out = new Array(n > 0 ? n : 0);
      for (let i = 0; i < out.length; i++)
        out[i] = (await timed()).toFixed(1);
      process.stdout.write(out.join(' ') + '\n');
    }
    await Promise.all(clients.map((c) => c.quit()));
    return;
  }
  const samples = new Array(iterations);
  for (let i = 0; i < iterations; i++)
    samples[i] = await timed();
  samples.sort((a, b) => a - b);
  const pct = (p) => samples[Math.min(samples.length, Math.max(1, Math.ceil(p / 100 * samples.length))) - 1];
  console.log(`cycle_p50_us=${pct(50).toFixed(1)} cycle_p99_us=${pct(99).toFixed(1)} samples=${iterations}`);
  await Promise.all(clients.map((c) => c.quit()));
}

main().catch((err) => {
  console.error('node_redlock.js: ' + (err && err.stack ? err.stack : err));
  process.exit(1);
});
