#!/usr/bin/env node
// SPDX-License-Identifier: BSD-3-Clause
// The Node.js binding's cycle beside the C library's and beside the native
// peers from npm, on one throwaway server each, in the same rounds (issue
// 31's speed targets: within 1.3x of the C cycle, ahead of the best peer):
//
//   Redis: dlock (this binding); dlock's C API (bindings/python/bench/
//          cycle.c), and the same with an on_lost set (cycle.c ... watch: the
//          binding sets one on every lock, for lock.signal); redis-semaphore's
//          Mutex and node-redlock's Redlock (redlock@5.0.0-beta.2, one
//          server, retryCount 0), both on ioredis
//   etcd:  dlock, dlock's C API (plain and with on_lost), etcd3's Lock
//
// and, once, two bare round trips through libuv's thread pool: what a cycle
// cost on top of C when the binding ran its try and its release each on the
// pool (they run on Node's loop now, through libdlock's async.h).
//
// Each cycle is an uncontended acquire (try once, 30 s lease, no renewal)
// and release. The peers are installed with npm under PEERS (default
// BUILD/node-bench), never in the repository. Usage, from the top of the
// tree after `make build` and the binding's `npm install`:
//   node bindings/node/bench/bench.js [--build build] [--cycles 2000] [--peers DIR]
// `make bench` runs it. It exits 0 whatever the figures are, 1 when
// something breaks (a call of dlock's, cc, a server that does not start).
'use strict';

const { spawnSync } = require('child_process');
const fs = require('fs');
const fsp = require('fs/promises');
const os = require('os');
const path = require('path');

const HERE = __dirname;
const TOP = path.resolve(HERE, '..', '..', '..');
const ROUNDS = 10;
const TTL = 30000;
const PEERS = ['redis-semaphore@5', 'ioredis@5', 'redlock@5.0.0-beta.2', 'etcd3@1'];

function parseArgs(argv) {
  const a = { build: 'build', cycles: 2000, peers: null };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i];
    const v = argv[i + 1];
    if (k === '--build' && v) a.build = v;
    else if (k === '--cycles' && v) a.cycles = parseInt(v, 10);
    else if (k === '--peers' && v) a.peers = v;
    else {
      console.error('usage: bench.js [--build DIR] [--cycles N] [--peers DIR]');
      process.exit(2);
    }
    i++;
  }
  if (!(a.cycles > 0)) {
    console.error('bench.js: --cycles needs a number above 0');
    process.exit(2);
  }
  a.build = path.resolve(a.build);
  a.peers = path.resolve(a.peers || path.join(a.build, 'node-bench'));
  return a;
}

// The p-th percentile of v (ns), in us, as bench.py takes it.
function pct(v, p) {
  const s = Float64Array.from(v).sort();
  const i = Math.min(s.length - 1, Math.max(0, Math.round((p / 100) * s.length) - 1));
  return s[i] / 1000;
}

function median(v) {
  const s = [...v].sort((x, y) => x - y);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

async function timed(n, one, into) {
  for (let i = 0; i < n; i++) {
    const t0 = process.hrtime.bigint();
    await one();
    if (into)
      into.push(Number(process.hrtime.bigint() - t0));
  }
}

// ---- the C side ---------------------------------------------------------------------

function compile(build, tmp, src, name) {
  const exe = path.join(tmp, name);
  const r = spawnSync('cc', ['-O2', '-I', path.join(TOP, 'include'), '-I',
    path.join(build, 'include'), '-o', exe, src, '-L', build, `-Wl,-rpath,${build}`, '-ldlock'],
  { stdio: 'inherit' });
  if (r.status !== 0)
    throw new Error(`cc ${src} failed`);
  return exe;
}

// One run of a C cycle program: [p50, p99] in us.
function cRun(exe, url, name, n, ...more) {
  const r = spawnSync(exe, [url, name, String(n), ...more], { encoding: 'utf8' });
  if (r.status !== 0)
    throw new Error(`${path.basename(exe)}: ${(r.stderr || '').trim() || `exit ${r.status}`}`);
  return r.stdout.trim().split(/\s+/).map(Number);
}

// ---- the peers ----------------------------------------------------------------------

function installPeers(dir) {
  const have = ['redis-semaphore', 'ioredis', 'redlock', 'etcd3']
    .every((m) => fs.existsSync(path.join(dir, 'node_modules', m, 'package.json')));
  if (have)
    return null;
  fs.mkdirSync(dir, { recursive: true });
  const r = spawnSync('npm', ['install', '--prefix', dir, '--no-audit', '--no-fund', '--no-save',
    ...PEERS], { stdio: ['ignore', 'ignore', 'pipe'], encoding: 'utf8' });
  if (r.error)
    return `npm is missing (apt-get install npm): ${r.error.message}`;
  if (r.status !== 0)
    return `npm install failed: ${(r.stderr || '').trim().split('\n').pop()}`;
  return null;
}

function peerRequire(dir, mod) {
  return require(require.resolve(mod, { paths: [path.join(dir, 'node_modules')] }));
}

// The peers on srv: [{ name, one, close }], or { name, why } for one that
// cannot be measured.
async function peersFor(srv, dir) {
  const [host, port] = srv.url.split('//')[1].split(':');
  const out = [];
  const attempt = async (name, make) => {
    try {
      const p = await make();
      await p.one();  // it works, or it says why not
      out.push({ name, ...p });
    } catch (e) {
      out.push({ name, why: e.message.split('\n')[0] });
    }
  };
  if (srv.name === 'redis') {
    await attempt('redis-semaphore Mutex', () => {
      const Redis = peerRequire(dir, 'ioredis');
      const { Mutex } = peerRequire(dir, 'redis-semaphore');
      const r = new Redis({ host, port: Number(port) });
      return {
        async one() {
          const m = new Mutex(r, 'node-bench-semaphore', { lockTimeout: TTL,
            acquireAttemptsLimit: 1, refreshInterval: 0 });
          if (!await m.tryAcquire())
            throw new Error('redis-semaphore: the lock is busy');
          await m.release();
        },
        close: () => r.quit(),
      };
    });
    await attempt('node-redlock (1 server)', () => {
      const Redis = peerRequire(dir, 'ioredis');
      const Redlock = peerRequire(dir, 'redlock').default;
      const r = new Redis({ host, port: Number(port) });
      const rl = new Redlock([r], { retryCount: 0 });
      return {
        async one() {
          const l = await rl.acquire(['node-bench-redlock'], TTL);
          await l.release();
        },
        close: () => r.quit(),
      };
    });
  } else {
    await attempt('etcd3 Lock', () => {
      const { Etcd3 } = peerRequire(dir, 'etcd3');
      const e = new Etcd3({ hosts: `http://${host}:${port}` });
      return {
        async one() {
          const l = await e.lock('node-bench-etcd3').ttl(TTL / 1000).acquire();
          await l.release();
        },
        close: () => e.close(),
      };
    });
  }
  return out;
}

// ---- one server ---------------------------------------------------------------------

function row(label, p50, p99, note) {
  const pad = (s, w) => String(s).padStart(w);
  const l = label.padEnd(38);
  console.log(`${l} ${pad(p50, 9)} ${pad(p99, 9)}   ${note || ''}`.trimEnd());
}

// Two round trips through libuv's thread pool with no lock and no I/O to
// speak of (fs.access): what the binding's cycle paid on top of C while it
// ran its try and its release each on the pool (before async.h).
async function twoHops() {
  await fsp.access(HERE);
  await fsp.access(HERE);
}

async function benchOne(dlock, srv, cycle, per, peerDir, peerWhy) {
  const c = await dlock.connect(srv.url);
  const binding = async () => {
    const l = await c.acquire('node-bench-binding', { ttl: TTL, wait: 0, autoRenew: false });
    await l.release();
  };
  const peers = peerWhy ? [] : await peersFor(srv, peerDir);
  const live = peers.filter((p) => p.one);
  if (srv.name === 'redis')  // once is enough: it does not touch the server
    live.push({ name: 'node: 2 thread-pool round trips', one: twoHops, close() {}, floor: true });
  await timed(Math.floor(per / 5) + 1, binding);  // warm-up
  for (const p of live)
    await timed(Math.floor(per / 5) + 1, p.one);
  const cs = [], cws = [], js = [];
  const ps = live.map(() => []);
  for (let r = 0; r < ROUNDS; r++) {
    cs.push(cRun(cycle, srv.url, 'node-bench-c', per));
    cws.push(cRun(cycle, srv.url, 'node-bench-cw', per, 'watch'));
    await timed(per, binding, js);
    for (let i = 0; i < live.length; i++)
      await timed(per, live[i].one, ps[i]);
  }
  const c50 = median(cs.map((x) => x[0])), c99 = median(cs.map((x) => x[1]));
  const w50 = median(cws.map((x) => x[0])), w99 = median(cws.map((x) => x[1]));
  const b50 = pct(js, 50), b99 = pct(js, 99);
  const f = (x) => x.toFixed(1);
  row(`${srv.name}: dlock's C API`, f(c50), f(c99));
  row(`${srv.name}: dlock's C API, on_lost set`, f(w50), f(w99), `${(w50 / c50).toFixed(2)} x C`);
  row(`${srv.name}: dlock for Node.js`, f(b50), f(b99),
    `${(b50 / c50).toFixed(2)} x C (target <= 1.30: ${b50 / c50 <= 1.3 ? 'met' : 'not met'}); ` +
    `${(b50 / w50).toFixed(2)} x C with on_lost`);
  let best = null;
  live.forEach((p, i) => {
    const e50 = pct(ps[i], 50);
    if (p.floor) {
      row(`${srv.name}: ${p.name}`, f(e50), f(pct(ps[i], 99)),
        `C + it: ${f(c50 + e50)} us, ${((c50 + e50) / c50).toFixed(2)} x C`);
      return;
    }
    row(`${srv.name}: ${p.name}`, f(e50), f(pct(ps[i], 99)), `dlock / it: ${(b50 / e50).toFixed(2)}`);
    if (!best || e50 < best.p50)
      best = { name: p.name, p50: e50 };
  });
  for (const p of peers.filter((x) => x.why))
    console.log(`${srv.name}: ${p.name}: not measured (${p.why})`);
  if (peerWhy)
    console.log(`${srv.name}: the npm peers: not measured (${peerWhy})`);
  if (best)
    console.log(`${srv.name}: dlock / the best peer (${best.name}): ${(b50 / best.p50).toFixed(2)} ` +
      `(target < 1: ${b50 < best.p50 ? 'met' : 'not met'})`);
  for (const p of live)
    await p.close();
  await c.close();
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  process.env.DLOCK_MODULE_DIR = process.env.DLOCK_MODULE_DIR || path.join(args.build, 'dlock');
  let dlock;
  try {
    dlock = require(path.join(HERE, '..', 'lib', 'index.js'));
  } catch (e) {
    throw new Error(`the binding is not built (cd bindings/node && DLOCK_BUILD=${args.build} ` +
      `npm install): ${e.message.split('\n')[0]}`);
  }
  const servers = require(path.join(HERE, '..', 'test', 'support', 'servers.js'));

  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'dlock-nodebench-'));
  const peerWhy = installPeers(args.peers);
  let env = null;
  try {
    const cycle = compile(args.build, tmp,
      path.join(TOP, 'bindings', 'python', 'bench', 'cycle.c'), 'cycle');
    const per = Math.max(1, Math.floor(args.cycles / ROUNDS));
    env = await servers.start();
    console.log(`== the Node.js binding (bindings/node/bench): ${per * ROUNDS} cycles of each, ` +
      `in ${ROUNDS} rounds`);
    row('', 'p50 us', 'p99 us', 'ratio (p50)');
    for (const name of ['redis', 'etcd']) {
      const srv = env.servers.find((s) => s.name === name);
      await benchOne(dlock, srv, cycle, per, args.peers, peerWhy);
    }
  } finally {
    if (env)
      await env.stop();
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

main().catch((e) => {
  console.error(`bench.js: ${e.stack || e}`);
  process.exit(1);
});
