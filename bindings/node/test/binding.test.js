// SPDX-License-Identifier: BSD-3-Clause
// The Node.js binding against real servers (servers.js): the cases that
// matter to a user, on Redis and etcd, and on the ZooKeeper, PostgreSQL and
// MariaDB of make test when it names them. Run: npm test (node --test).
'use strict';

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn, spawnSync } = require('child_process');
const path = require('path');

const dlock = require('..');
const servers = require('./support/servers');

const HERE = path.resolve(__dirname, '..');
const RUN = `${process.pid}-${Date.now()}`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// A Node process running code, with this binding as require('dlock') and
// the script's arguments in process.argv.slice(1).
function child(code, ...args) {
  const p = spawn(process.execPath, ['-e', code, '--', ...args], {
    env: { ...process.env, NODE_PATH: path.dirname(HERE) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  p.lines = [];
  p.waiters = [];
  let buf = '';
  const take = (d) => {
    buf += d;
    let i;
    while ((i = buf.indexOf('\n')) >= 0) {
      p.lines.push(buf.slice(0, i));
      buf = buf.slice(i + 1);
    }
    p.waiters = p.waiters.filter((w) => !w());
  };
  p.stdout.on('data', take);
  p.stderr.on('data', take);
  p.on('exit', () => p.waiters.forEach((w) => w(true)));
  return p;
}

// Resolves with p's lines once one equals want; rejects at p's end or after
// seconds.
function readUntil(p, want, seconds = 20) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(
      `never saw ${JSON.stringify(want)} from the child; it said: ${JSON.stringify(p.lines)}`)),
    seconds * 1000);
    const check = (ended) => {
      if (p.lines.includes(want)) {
        clearTimeout(timer);
        resolve(p.lines.slice());
        return true;
      }
      if (ended || p.exitCode !== null) {
        clearTimeout(timer);
        reject(new Error(`the child ended without ${JSON.stringify(want)}: ${JSON.stringify(p.lines)}`));
        return true;
      }
      return false;
    };
    if (!check(false))
      p.waiters.push(check);
  });
}

let env;
before(async () => { env = await servers.start(); });
after(async () => { await env.stop(); });

it('has the library version', () => {
  assert.match(dlock.version, /^\d+\.\d+\.\d+$/);
});

// Every case below runs on each backend at hand. node:test collects the
// describe blocks before `before` runs, so the list is known up front.
const BACKENDS = ['redis', 'etcd'].concat(
  [['zk', 'DLOCK_TEST_ZK_URL'], ['postgres', 'DLOCK_TEST_POSTGRES_URL'],
    ['mysql', 'DLOCK_TEST_MYSQL_URL']].filter(([, v]) => process.env[v]).map(([b]) => b));

for (const backend of BACKENDS) {
  describe(backend, () => {
    let server;
    let client;
    let n = 0;
    // A lock name of this case's own and this run's (the shared servers
    // keep a semaphore's permits, a queue's places, from run to run).
    const fresh = () => `node-${backend}-${RUN}-${++n}`;

    before(async () => {
      server = env.servers.find((s) => s.name === backend);
      client = await dlock.connect(server.url);
    });
    after(async () => { await client.close(); });

    it('cycle', async () => {
      const name = fresh();
      const lock = await client.acquire(name, { ttl: 10000 });
      assert.equal(typeof lock.fence, 'bigint');
      assert.ok(lock.fence > 0n);
      assert.equal(lock.lost, false);
      assert.equal(lock.signal.aborted, false);
      assert.ok(lock.validMs > 9000 && lock.validMs <= 10000, String(lock.validMs));
      assert.equal(lock.name, name);
      assert.equal((await client.status(name)).held, true);
      await lock.check();
      // Within every backend's bounds (ZooKeeper: the session, 10 s here).
      await lock.extend(8000);
      assert.ok(lock.validMs > 7000 && lock.validMs <= 8000, String(lock.validMs));
      await lock.release();
      assert.equal(lock.released, true);
      assert.equal(lock.validMs, 0);
      assert.equal((await client.status(name)).held, false);
    });

    it('noThreads: Node\'s loop renews, libdlock starts no thread', async () => {
      if (backend !== 'redis') {
        await assert.rejects(dlock.connect(server.url, { noThreads: true }),
          (e) => e instanceof dlock.NotSupported && /DLOCK_CLIENT_NO_THREADS/.test(e.message));
        return;
      }
      const threads = () => Number(/^Threads:\s+(\d+)/m.exec(
        require('fs').readFileSync('/proc/self/status', 'utf8'))[1]);
      const c = await dlock.connect(server.url, { noThreads: true });
      try {
        const name = fresh();
        // The other client's threads started: libuv's pool (status runs
        // there) and its watchdog (a lock with an on_lost, as every lock).
        await client.status(name);
        await (await client.acquire(fresh(), { ttl: 10000 })).release();
        const before = threads();
        const lock = await c.acquire(name, { ttl: 600 });
        await new Promise((r) => setTimeout(r, 2000));
        assert.equal(lock.lost, false);
        assert.ok(lock.validMs > 0, String(lock.validMs));
        assert.equal((await client.status(name)).held, true);
        const fence = lock.fence;
        await lock.release();
        const held = await client.acquire(name, { ttl: 10000, autoRenew: false });
        const waiting = c.acquire(name, { ttl: 10000, wait: 5000 });
        await new Promise((r) => setTimeout(r, 300));
        await held.release();
        const got = await waiting;
        assert.ok(got.fence > fence);
        await got.release();
        assert.equal(threads(), before);
      } finally {
        await c.close();
      }
      await assert.rejects(dlock.connect(server.url, { noThreads: 1 }),
        (e) => e instanceof dlock.InvalidArgument && /noThreads/.test(e.message));
    });

    it('fences strictly increase across clients', async () => {
      const name = fresh();
      const other = await dlock.connect(server.url);
      const fences = [];
      try {
        for (let i = 0; i < 6; i++) {
          const lock = await (i % 2 ? client : other).acquire(name);
          fences.push(lock.fence);
          await lock.release();
        }
      } finally {
        await other.close();
      }
      for (let i = 1; i < fences.length; i++)
        assert.ok(fences[i] > fences[i - 1], fences.join(' '));
    });

    it('busy and timeout', async () => {
      const name = fresh();
      const held = await client.acquire(name);
      const other = await dlock.connect(server.url);
      try {
        await assert.rejects(other.acquire(name), (e) => e instanceof dlock.Busy &&
          e.code === -1 && e.message.length > 0 && e.name === 'Busy');
        const t0 = Date.now();
        await assert.rejects(other.acquire(name, { wait: 300 }),
          (e) => e instanceof dlock.Timeout && e instanceof dlock.Busy && e.code === -2);
        assert.ok(Date.now() - t0 >= 295, String(Date.now() - t0));
      } finally {
        await other.close();
        await held.release();
      }
    });

    it('wait and hand-off, the event loop free meanwhile', async () => {
      const name = fresh();
      const holder = await client.acquire(name);
      const other = await dlock.connect(server.url);
      try {
        const t0 = Date.now();
        let ticks = 0;
        const tick = setInterval(() => { ticks++; }, 10);
        setTimeout(() => holder.release(), 300);
        const lock = await other.acquire(name, { wait: 10000 });
        clearInterval(tick);
        const waited = Date.now() - t0;
        assert.ok(lock.fence > holder.fence);
        assert.ok(waited >= 250 && waited < 5000, String(waited));
        // The loop ran while the acquisition waited.
        assert.ok(ticks >= 10, `only ${ticks} timer ticks in ${waited} ms`);
        await lock.release();
      } finally {
        await other.close();
      }
    });

    it('more waiters than libuv has pool threads, and their holder releases', async () => {
      // Waits have threads of their own: the pool (4 threads) stays free
      // for the holder's release.
      const name = fresh();
      const holder = await client.acquire(name);
      const waits = [];
      for (let i = 0; i < 6; i++)
        waits.push(client.acquire(name, { wait: 20000, ttl: 5000 }));
      await sleep(200);
      await holder.release();
      // Each releases as soon as it holds: the others wait for it.
      await Promise.all(waits.map(async (w) => (await w).release()));
    });

    it('many acquisitions at once on one client, tries and waits', async () => {
      const base = fresh();
      const tries = await Promise.all(Array.from({ length: 300 },
        (_, i) => client.acquire(`${base}-${i}`, { ttl: 10000 })));
      assert.equal(new Set(tries.map((l) => l.name)).size, 300);
      await Promise.all(tries.map((l) => l.release()));
      // Forty waiters on one name, each releasing as soon as it holds.
      const name = `${base}-one`;
      const fences = await Promise.all(Array.from({ length: 40 }, async () => {
        const l = await client.acquire(name, { wait: 30000, ttl: 5000 });
        const f = l.fence;
        await l.release();
        return f;
      }));
      assert.equal(new Set(fences).size, 40);
      assert.equal((await client.status(name)).held, false);
    });

    it('interrupt and close end waits; a free with a wait in flight cancels it', async () => {
      const name = fresh();
      const holder = await client.acquire(name);
      try {
        const a = await dlock.connect(server.url);
        // Each wait's outcome is taken at once: it rejects while close()
        // and free() run, before assert.rejects would be there.
        const outcome = (p) => p.then((l) => l, (e) => e);
        const waitA = outcome(a.acquire(name, { wait: Infinity }));
        await sleep(200);
        a.interrupt();
        assert.ok(await waitA instanceof dlock.Interrupted);
        await a.close();

        const b = await dlock.connect(server.url);
        const waitB = outcome(b.acquire(name, { wait: Infinity }));
        await sleep(200);
        const t0 = Date.now();
        await b.close();
        const eb = await waitB;
        assert.ok(eb instanceof dlock.Interrupted || eb instanceof dlock.Canceled, String(eb));
        assert.ok(Date.now() - t0 < 5000, String(Date.now() - t0));

        // Freed under the wait (not through close(), which interrupts first):
        // the C library cancels it, and it rejects with Canceled.
        const c = await dlock.connect(server.url);
        const waitC = outcome(c.acquire(name, { wait: Infinity }));
        await sleep(200);
        await c._h.free();
        const ec = await waitC;
        assert.ok(ec instanceof dlock.Canceled && ec.code === -13 && ec.message.length > 0,
          String(ec));
      } finally {
        await holder.release();
      }
      // Nobody is left in the queue: the lock is free at once.
      await (await client.acquire(name)).release();
    });

    it('an idle client lets the process end; a held lock or a wait keeps it', async () => {
      const name = fresh();
      const holder = await client.acquire(name);
      const p = child(`
        const dlock = require('node');
        const [url, name] = process.argv.slice(1);
        (async () => {
          const c = await dlock.connect(url);
          await (await c.acquire(name + '-idle')).release();
          const held = await c.acquire(name + '-held');
          // Nothing else keeps the loop: an unref'd timer does not.
          setTimeout(() => held.release().then(() => console.log('released')), 300).unref();
          console.log('waiting');
          c.acquire(name, { wait: 20000 }).then((l) => {
            console.log('got it');
            return l.release();
          }).then(() => console.log('end of work'));
          // The client is never closed: idle again, it must not keep the
          // process alive.
        })();`, server.url, name);
      const exited = new Promise((r) => p.on('exit', (code) => r(code)));
      try {
        await readUntil(p, 'waiting');
        await sleep(500);
        assert.equal(p.exitCode, null, 'the child ended while it waited for a lock');
        await holder.release();
        const code = await Promise.race([exited, sleep(15000).then(() => 'still running')]);
        assert.equal(code, 0, p.lines.join('\n'));
        assert.ok(p.lines.includes('released'), p.lines.join('\n'));
        assert.ok(p.lines.includes('end of work'), p.lines.join('\n'));
      } finally {
        p.kill('SIGKILL');
        if (!holder.released)
          await holder.release();
      }
    });

    it('a signal first asked for after the loss is aborted already', async () => {
      // Neither onLost nor signal: the client does not follow the lock
      // until the signal is asked for, and then asks the native handle.
      const lock = await client.acquire(fresh(), { ttl: server.shortTtl, autoRenew: false });
      await sleep(server.shortTtl + 400);
      assert.equal(lock.lost, true);
      assert.equal(lock.signal.aborted, true);
      assert.ok(lock.signal.reason instanceof dlock.LockLost);
      await assert.rejects(lock.release(), dlock.LockLost);
    });

    it('expiry frees the lock, and the holder is told', async () => {
      const name = fresh();
      const ttl = server.shortTtl;
      const told = [];
      const lock = await client.acquire(name, { ttl, autoRenew: false,
        onLost: (l, reason) => told.push([l, reason]) });
      const aborted = new Promise((r) => lock.signal.addEventListener('abort', r));
      await sleep(ttl + 400);
      assert.equal(lock.lost, true);
      await aborted;
      assert.ok(lock.signal.reason instanceof dlock.LockLost);
      assert.equal(told.length, 1);
      assert.equal(told[0][0], lock);
      const other = await dlock.connect(server.url);
      try {
        // The server's own expiry may come a little later (etcd counts
        // leases in whole seconds): wait for it, never for a release.
        const again = await other.acquire(name, { wait: ttl * 4 + 2000 });
        assert.ok(again.fence > lock.fence);
        await again.release();
      } finally {
        await other.close();
      }
      await assert.rejects(lock.release(), dlock.LockLost);
    });

    it('a holder frozen past its lease sees lost and its signal abort', async () => {
      const name = fresh();
      const ttl = Math.max(server.shortTtl * 2, 1000);
      const p = child(`
        const dlock = require('node');
        const [url, name, ttl] = process.argv.slice(1);
        (async () => {
          const c = await dlock.connect(url);
          let told = false;
          try {
            await c.using(name, { ttl: Number(ttl), onLost: () => { told = true; } }, async (lock) => {
              console.log('held', String(lock.fence));
              await new Promise((r) => lock.signal.addEventListener('abort', r));
              console.log('lost', lock.lost, lock.signal.reason.name);
              console.log(told ? 'told' : 'not told');
            });
          } catch (e) {
            console.log('rejected', e.name);
          }
          await c.close();
          console.log('end');
        })();`, server.url, name, String(ttl));
      try {
        const lines = await waitHeld(p);
        const fence = BigInt(lines.find((l) => l.startsWith('held ')).split(' ')[1]);
        p.kill('SIGSTOP');
        const other = await dlock.connect(server.url);
        try {
          const taken = await other.acquire(name, { wait: ttl * 4 + 5000 });
          assert.ok(taken.fence > fence);
          await taken.release();
        } finally {
          p.kill('SIGCONT');
          await other.close();
        }
        const out = await readUntil(p, 'end');
        assert.ok(out.includes('lost true LockLost'), out.join('\n'));
        assert.ok(out.includes('told'), out.join('\n'));
        assert.ok(out.includes('rejected LockLost'), out.join('\n'));
      } finally {
        p.kill('SIGKILL');
      }
    });

    it('bad input names what was wrong', async () => {
      await assert.rejects(dlock.connect('nosuch://127.0.0.1:1'),
        (e) => e instanceof dlock.InvalidArgument && /nosuch/.test(e.message));
      await assert.rejects(client.acquire('x', { ttl: -1 }), dlock.InvalidArgument);
      await assert.rejects(client.acquire('x', { wait: 'soon' }),
        (e) => e instanceof dlock.InvalidArgument && /wait/.test(e.message));
      await assert.rejects(client.acquire('a\0b'),
        (e) => e instanceof dlock.InvalidArgument && /NUL/.test(e.message));
      await assert.rejects(client.acquire(''),
        (e) => e instanceof dlock.InvalidArgument && /name/.test(e.message));
      await assert.rejects(client.acquire(42), dlock.InvalidArgument);
      await assert.rejects(client.acquire('x', { tll: 5 }),
        (e) => e instanceof dlock.InvalidArgument && /tll/.test(e.message));
      await assert.rejects(client.acquire('x', { ttl: 31 * 86400 * 1000 }), dlock.InvalidArgument);
      await assert.rejects(client.semaphore('s', '2'), dlock.InvalidArgument);
      await assert.rejects(client.using('x', {}, 'not a function'), dlock.InvalidArgument);
      await assert.rejects(dlock.connect(await servers.closedPort(server.url),
        { connectTimeout: 1000 }), dlock.Unreachable);
    });

    it('release twice is misuse; calls on one lock run in turn', async () => {
      const lock = await client.acquire(fresh());
      // Issued together, they run one after the other on the handle.
      const [a, b, c] = await Promise.allSettled([lock.check(), lock.extend(15000),
        lock.release()]);
      assert.deepEqual([a.status, b.status, c.status], ['fulfilled', 'fulfilled', 'fulfilled']);
      await assert.rejects(lock.release(), dlock.Misuse);
      await assert.rejects(lock.check(), dlock.Misuse);
    });

    it('using releases, and returns what the function returns', async () => {
      const name = fresh();
      const r = await client.using(name, { wait: 1000 }, async (lock) => {
        assert.equal((await client.status(name)).held, true);
        return lock.fence;
      });
      assert.equal(typeof r, 'bigint');
      assert.equal((await client.status(name)).held, false);
      await assert.rejects(client.using(name, async () => { throw new Error('boom'); }),
        /boom/);
      assert.equal((await client.status(name)).held, false);
    });

    it('read-write', async (t) => {
      const name = fresh();
      const other = await dlock.connect(server.url);
      try {
        const r1 = await client.readLock(name);
        const r2 = await other.readLock(name);
        await assert.rejects(other.writeLock(name), dlock.Busy);
        await r1.release();
        await r2.release();
        const w = await other.writeLock(name);
        assert.equal(w.kind, 'write');
        await assert.rejects(client.readLock(name), dlock.Busy);
        await w.downgrade();
        assert.equal(w.kind, 'read');
        await (await client.readLock(name)).release();
        await w.release();
      } catch (e) {
        if (e instanceof dlock.NotSupported)
          return t.skip(`${backend} has no read-write lock`);
        throw e;
      } finally {
        await other.close();
      }
    });

    it('semaphore', async () => {
      const name = fresh();
      const other = await dlock.connect(server.url);
      try {
        const a = await client.semaphore(name, 2);
        const b = await other.semaphore(name, 2);
        await assert.rejects(client.semaphore(name, 2), dlock.Busy);
        await client.setPermits(name, 3);
        await (await client.semaphore(name, 2)).release();
        await a.release();
        await b.release();
      } finally {
        await other.close();
      }
    });

    it('multi: all or nothing', async () => {
      const base = fresh();
      const names = [`${base}-a`, `${base}-b`, `${base}-c`];
      const other = await dlock.connect(server.url);
      try {
        const one = await other.acquire(names[1]);
        await assert.rejects(client.acquireMulti(names), dlock.Busy);
        assert.equal((await other.status(names[0])).held, false);
        await one.release();
        const m = await client.acquireMulti(names);
        assert.deepEqual(m.names, names);
        assert.ok(m.fences.every((f) => f > 0n));
        await assert.rejects(other.acquire(names[2]), dlock.Busy);
        await m.release();
      } finally {
        await other.close();
      }
    });

    it('leader election', async () => {
      const name = fresh();
      const lead = await client.campaign(name, 'alpha');
      const info = await client.leader(name);
      assert.equal(info.held, true);
      assert.equal(info.identity, 'alpha');
      assert.equal(info.fence, lead.fence);
      const other = await dlock.connect(server.url);
      try {
        await assert.rejects(other.campaign(name, 'beta', { wait: 0 }), dlock.Busy);
      } finally {
        await other.close();
      }
      await lead.resign();
      assert.equal((await client.leader(name)).held, false);
    });

    it('close on SIGINT leaves the queue', async () => {
      const name = fresh();
      const held = await client.acquire(name, { fair: true });
      const p = child(`
        const dlock = require('node');
        const [url, name] = process.argv.slice(1);
        (async () => {
          const c = await dlock.connect(url);
          const t0 = Date.now();
          process.once('SIGINT', () => c.close());
          console.log('waiting');
          try {
            await c.acquire(name, { wait: Infinity, fair: true });
            console.log('got it');
          } catch (e) {
            console.log('interrupted', e.name, Date.now() - t0);
          }
          await c.close();
          console.log('end');
        })();`, server.url, name);
      let out;
      try {
        await readUntil(p, 'waiting');
        await sleep(500);
        p.kill('SIGINT');
        out = await readUntil(p, 'end');
      } finally {
        p.kill('SIGKILL');
        await held.release();
      }
      assert.ok(out.some((l) => l.startsWith('interrupted Interrupted')), out.join('\n'));
      // Nobody is left waiting: the next try takes the lock at once.
      await (await client.acquire(name, { fair: true })).release();
    });

    it('100,000 cycles leave the RSS flat', async () => {
      // The RSS grows in the first tens of thousands of cycles, as V8
      // sizes its young generation to the allocation rate (heapTotal: 20
      // MB to 39 MB), then stays. What must not grow at all is the memory
      // in use: malloc's (every arena: the C side's, and V8's own, which
      // settles in the warm-up) and the JavaScript heap's. One block of
      // 32 bytes (malloc's least) kept per cycle would be 3.2 MB in
      // 100,000.
      const name = fresh();
      const n = { redis: 100000, etcd: 10000 }[backend] || 2000;
      const cycle = async () => (await client.acquire(name, { autoRenew: false })).release();
      // A collected native Lock's memory is freed by its finalizer, which
      // Node-API runs at the loop's next turn (setImmediate), not inside
      // gc(): let them run before counting.
      const sample = async () => {
        if (global.gc) {
          global.gc();
          await new Promise((r) => setImmediate(r));
          global.gc();
        }
        const m = process.memoryUsage();
        return { rss: m.rss, total: m.heapTotal, heap: m.heapUsed, c: dlock._native.mallocInUse() };
      };
      for (let i = 0; i < n / 5; i++)
        await cycle();
      const a = await sample();
      for (let i = 0; i < n; i++)
        await cycle();
      const b = await sample();
      const kib = (k) => Math.round((b[k] - a[k]) / 1024);
      console.log(`# ${n} cycles on ${backend}: RSS grew ${kib('rss')} KiB (V8's heapTotal ` +
        `${kib('total')} KiB), malloc in use ${kib('c')} KiB, JavaScript heap used ${kib('heap')} KiB`);
      assert.ok(b.c - a.c < n * 20 + 512 * 1024,
        `malloc in use grew ${b.c - a.c} bytes in ${n} cycles`);
      assert.ok(b.heap - a.heap < 4 * 1024 * 1024,
        `the JavaScript heap grew ${b.heap - a.heap} bytes in ${n} cycles`);
    });
  });
}

async function waitHeld(p) {
  for (let i = 0; i < 400; i++) {
    if (p.lines.some((l) => l.startsWith('held ')))
      return p.lines.slice();
    if (p.exitCode !== null)
      break;
    await sleep(50);
  }
  throw new Error(`the holder never held: ${JSON.stringify(p.lines)}`);
}

it('a missing libdlock is named at build time', () => {
  const r = spawnSync(process.execPath, [path.join(HERE, 'scripts', 'libdlock.js'), 'libs'], {
    env: { ...process.env, DLOCK_BUILD: '/nonexistent' }, encoding: 'utf8',
  });
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /DLOCK_BUILD=\/nonexistent: no libdlock.so/);
});

it('the payout example pays each order once under a frozen holder', async () => {
  // examples/payout.js, the seed's job: an instance stalls (SIGSTOP) in the
  // middle of paying, past its lease; another takes the lock and pays the
  // rest; woken, the stale one's writes are refused and it is told.
  const fs = require('fs');
  const os = require('os');
  const example = path.join(HERE, 'examples', 'payout.js');
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'dlock-payout-'));
  const db = path.join(tmp, 'payout.db');
  const url = env.servers.find((s) => s.name === 'redis').url;
  const a = spawn(process.execPath, [example, url, db, '--ttl', '1000', '--stall-after', '3'],
    { stdio: ['ignore', 'pipe', 'pipe'] });
  try {
    let out = '';
    a.stdout.on('data', (d) => { out += d; });
    a.stderr.on('data', (d) => { out += d; });
    for (let i = 0; i < 400 && !out.includes('stalling after 3'); i++)
      await sleep(50);
    assert.ok(out.includes('stalling after 3'), out);
    // A is stopped now.
    const b = spawnSync(process.execPath, [example, url, db, '--wait', '10000'],
      { encoding: 'utf8', timeout: 60000 });
    assert.ok(b.stdout.includes('paid 7 orders'), b.stdout + b.stderr);
    const ended = new Promise((r) => a.once('exit', r));
    a.kill('SIGCONT');
    await ended;
    assert.ok(out.includes('refused as stale') && out.includes('the lock was lost'), out);
    const rows = spawnSync('sqlite3', [db,
      'SELECT order_id, COUNT(*) FROM ledger GROUP BY order_id;'], { encoding: 'utf8' })
      .stdout.trim().split('\n');
    assert.equal(rows.length, 10, rows.join(' '));
    assert.ok(rows.every((r) => r.endsWith('|1')), rows.join(' '));
  } finally {
    a.kill('SIGKILL');
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});

it('the TypeScript declarations cover the API', () => {
  const fs = require('fs');
  const dts = fs.readFileSync(path.join(HERE, 'lib', 'index.d.ts'), 'utf8');
  for (const name of Object.keys(dlock).filter((k) => !k.startsWith('_')))
    assert.match(dts, new RegExp(`export (const|function|class) ${name}\\b`), name);
  // A program written against them compiles (tsc from npm install's
  // devDependencies).
  const tsc = path.join(HERE, 'node_modules', 'typescript', 'bin', 'tsc');
  assert.ok(fs.existsSync(tsc), 'typescript is missing: npm install in bindings/node');
  const r = spawnSync(process.execPath, [tsc, '--noEmit', '--strict', '--target', 'es2020',
    '--module', 'commonjs', '--lib', 'es2020,dom', '--skipLibCheck',
    path.join(HERE, 'test', 'types.ts')], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stdout + r.stderr);
});

it('the package installs with npm into a project, and works there', async () => {
  // npm pack, then npm install of the tarball in a project of its own: the
  // files the package lists are enough to build the addon against libdlock.
  const fs = require('fs');
  const os = require('os');
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'dlock-npm-'));
  try {
    const pack = spawnSync('npm', ['pack', '--silent', '--pack-destination', tmp, HERE],
      { encoding: 'utf8', cwd: tmp });
    assert.equal(pack.status, 0, pack.stderr);
    const tarball = path.join(tmp, pack.stdout.trim().split('\n').pop());
    fs.writeFileSync(path.join(tmp, 'package.json'), '{"name": "app", "private": true}');
    const inst = spawnSync('npm', ['install', '--no-audit', '--no-fund', '--prefer-offline',
      '--loglevel=error', tarball], { encoding: 'utf8', cwd: tmp, timeout: 240000 });
    assert.equal(inst.status, 0, inst.stdout + inst.stderr);
    const url = env.servers.find((s) => s.name === 'redis').url;
    const run = spawnSync(process.execPath, ['-e', `
      const dlock = require('dlock');
      (async () => {
        const c = await dlock.connect(process.argv[1]);
        const l = await c.acquire('node-npm-${RUN}');
        console.log(require.resolve('dlock'), String(l.fence));
        await l.release();
        await c.close();
      })();`, url], { encoding: 'utf8', cwd: tmp });
    assert.equal(run.status, 0, run.stderr);
    assert.ok(run.stdout.startsWith(path.join(tmp, 'node_modules', 'dlock')), run.stdout);
    assert.ok(Number(run.stdout.trim().split(' ').pop()) > 0, run.stdout);
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});
