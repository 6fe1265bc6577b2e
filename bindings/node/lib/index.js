// SPDX-License-Identifier: BSD-3-Clause
// dlock for Node.js: distributed locks with fencing tokens, over libdlock's
// C API (src/dlock_node.cc is the native half).
//
//   const dlock = require('dlock');
//   const client = await dlock.connect('redis://127.0.0.1:6379');
//   await client.using('payout', { ttl: 30000, wait: 10000 }, async (lock) => {
//     await store.write(data, { fence: lock.fence, signal: lock.signal });
//   });
//   await client.close();
//
// Times are in milliseconds. No call blocks the event loop: acquisitions,
// releases and extensions run on Node's own loop through libdlock's
// asynchronous API; acquireMulti and campaign, which may wait, on a thread
// of their own; the other calls on libuv's pool.
'use strict';

const native = require('../build/Release/dlock.node');

// ---- errors -----------------------------------------------------------------------

/** A dlock call failed: `code` is the C code (negative), `name` the class,
 * `message` the C library's text (it names the server, never a password). */
class DlockError extends Error {
  constructor(message, code) {
    super(message);
    this.code = code === undefined ? this.constructor.code : code;
  }

  get name() {
    return this.constructor.name;
  }
}

function errorClass(name, code, Base = DlockError) {
  const cls = { [name]: class extends Base {} }[name];
  cls.code = code;
  return cls;
}

const Busy = errorClass('Busy', -1);
const Timeout = errorClass('Timeout', -2, Busy);
const LockLost = errorClass('LockLost', -3);
const Unreachable = errorClass('Unreachable', -4);
const AuthError = errorClass('AuthError', -5);
const ProtocolError = errorClass('ProtocolError', -6);
const InvalidArgument = errorClass('InvalidArgument', -7);
const OutOfMemory = errorClass('OutOfMemory', -8);
const NotSupported = errorClass('NotSupported', -9);
const Misuse = errorClass('Misuse', -10);
const ServerError = errorClass('ServerError', -11);
const Interrupted = errorClass('Interrupted', -12);
const Canceled = errorClass('Canceled', -13);

const ERRORS = new Map([Busy, Timeout, LockLost, Unreachable, AuthError, ProtocolError,
  InvalidArgument, OutOfMemory, NotSupported, Misuse, ServerError, Interrupted, Canceled]
  .map((cls) => [cls.code, cls]));

function makeError(code, message) {
  const cls = ERRORS.get(code) || DlockError;
  return new cls(message, code);
}

native.setup(makeError);

// ---- arguments --------------------------------------------------------------------

const KINDS = { mutex: 0, fair: 1, read: 2, write: 3, semaphore: 4, leader: 5, multi: 6 };
const KIND_NAMES = Object.fromEntries(Object.entries(KINDS).map(([k, v]) => [v, k]));
const WAIT_FOREVER = -1;

function invalid(message) {
  return new InvalidArgument(message, InvalidArgument.code);
}

// A duration in ms: a finite number >= 0 (forever: Infinity or null, where
// allowed, gives -1).
function ms(value, what, foreverOk = false) {
  if ((value === Infinity || value === null) && foreverOk)
    return WAIT_FOREVER;
  if (typeof value !== 'number' || Number.isNaN(value))
    throw invalid(`${what} must be a number of milliseconds, got ${describe(value)}`);
  if (value < 0)
    throw invalid(`${what} must not be negative, got ${value}`);
  if (!Number.isFinite(value))
    throw invalid(`${what} must be finite`);
  return Math.round(value);
}

function describe(v) {
  if (typeof v === 'string')
    return JSON.stringify(v);
  if (typeof v === 'bigint')
    return `${v}n`;
  return v === null ? 'null' : typeof v === 'object' ? 'an object' : String(v);
}

function text(value, what, optional = true) {
  if ((value === undefined || value === null) && optional)
    return null;
  if (typeof value !== 'string')
    throw invalid(`${what} must be a string, got ${describe(value)}`);
  return value;
}

const KIND_OPTIONS = new Set(['ttl', 'wait', 'autoRenew', 'onLost', 'owner', 'reentrant', 'label']);
const ACQUIRE_OPTIONS = new Set([...KIND_OPTIONS, 'fair']);

function checkKeys(opts, allowed, what) {
  if (opts === undefined || opts === null)
    return {};
  if (typeof opts !== 'object')
    throw invalid(`${what} must be an object, got ${describe(opts)}`);
  const unknown = Object.keys(opts).filter((k) => !allowed.has(k));
  if (unknown.length > 0)
    throw invalid(`unknown option(s) for ${what}: ${unknown.sort().join(', ')}`);
  return opts;
}

// ---- locks ------------------------------------------------------------------------

let nextId = 1;

/** A lock this process holds. `fence` rises with every acquisition of the
 * lock; `signal` aborts the moment the lock is known lost; release() gives
 * it back. */
class Lock {
  constructor(client, handle, id, onLost, name) {
    this._client = client;
    this._h = handle;
    this._id = id;
    this._onLost = onLost;
    this._ac = null;       // made when the signal is first asked for
    this._lostReason = 0;
    this._running = 0;     // calls on the handle not yet settled,
    this._tail = null;     // the last of them: the next one runs after it
    this._released = false;
    this.name = name;
    this.fence = handle.fence();
  }

  /** Every name a multi-lock holds (one name for the other kinds). */
  get names() {
    return this._released ? [this.name] : this._h.names();
  }

  /** The fence of each name, as names lists them (BigInts). */
  get fences() {
    return this._released ? [this.fence] : this._h.fences();
  }

  get kind() {
    return KIND_NAMES[this._h.kind()] || 'mutex';
  }

  /** True once the lock is known lost (no I/O: the watchdog's last word). */
  get lost() {
    return this._lostReason !== 0 || (!this._released && this._h.lost());
  }

  /** Lease left in ms, by the last renewal the server confirmed (0 once
   * lost or released). */
  get validMs() {
    return this._released ? 0 : this._h.validMs();
  }

  get released() {
    return this._released;
  }

  /** Aborts (its reason a LockLost) when the lock is found lost; give it
   * to whatever writes on the lock's behalf. */
  get signal() {
    if (this._ac === null) {
      this._ac = new AbortController();
      if (this._lostReason !== 0)
        this._ac.abort(this._lostError());
    }
    return this._ac.signal;
  }

  _lostError() {
    const why = this._lostReason === Unreachable.code ?
      'the lock server could not be reached before the lease ran out' :
      'the lock was lost (lease expired or taken over)';
    return new LockLost(`${this.name}: ${why}`, LockLost.code);
  }

  _markLost(reason) {
    if (this._lostReason !== 0)
      return;
    this._lostReason = reason;
    if (this._ac !== null)
      this._ac.abort(this._lostError());
    if (this._onLost) {
      try {
        this._onLost(this, reason);
      } catch (e) {
        process.nextTick(() => { throw e; });
      }
    }
  }

  // Runs op(handle) after the calls before it on this lock; a LockLost
  // from the server marks the lock lost. after(), when given, runs once
  // op's promise settled (if op ran), before the caller hears of it. One
  // promise per call on top of op's own: a cycle's time is mostly hops.
  _call(op, after) {
    let ran = false;
    const run = () => {
      if (this._released)
        throw new Misuse('the lock was released already', Misuse.code);
      ran = true;
      return op(this._h);
    };
    let p;
    if (this._running === 0) {
      try {
        p = Promise.resolve(run());
      } catch (e) {
        p = Promise.reject(e);
      }
    } else {
      p = this._tail.then(run, run);
    }
    this._running++;
    p = p.then((v) => {
      this._running--;
      if (after && ran)
        after();
      return v;
    }, (e) => {
      this._running--;
      if (after && ran)
        after();
      if (e instanceof LockLost)
        this._markLost(LockLost.code);
      throw e;
    });
    this._tail = p;
    return p;
  }

  /** Ask the server whether the lock is still ours; rejects with LockLost
   * if not. */
  check() {
    return this._call((h) => h.check());
  }

  /** Set the lease to ttl ms from now. */
  extend(ttl) {
    return this._call(async (h) => h.extend(ms(ttl, 'ttl')));
  }

  /** A write lock becomes a read lock, without letting go. */
  downgrade() {
    return this._call((h) => h.downgrade());
  }

  /** Give the lock back. Rejects with LockLost when it had been lost
   * meanwhile (it is gone either way); a second release is a Misuse. */
  release() {
    if (this._released || this._releasing)
      return Promise.reject(new Misuse('the lock was released already', Misuse.code));
    this._releasing = true;
    return this._call((h) => h.release(), () => {
      this._released = true;
      this._client._held.delete(this._h);
      this._client._locks.delete(this._id);
      registry.unregister(this);
    });
  }
}

/** Leadership won by Client.campaign; resign() steps down. */
class Leader extends Lock {
  resign() {
    return this.release();
  }
}

// A lock dropped without a release is released when it is collected, not
// kept (and renewed) until its client closes.
const registry = new FinalizationRegistry(({ client, handle, id }) => {
  client._locks.delete(id);
  if (client._held.delete(handle))
    handle.release().catch(() => {});
});

// ---- the client -------------------------------------------------------------------

/** One connection set to a lock server, shared by every call of this
 * process that uses it. Make one with dlock.connect(url). */
class Client {
  constructor(handle) {
    this._h = handle;
    this._locks = new Map();    // id -> WeakRef(Lock), for on_lost
    this._held = new Set();     // native handles not yet released
    this._pending = new Set();  // calls running, which close() waits for
    this._starting = new Set(); // ids of acquisitions not yet settled
    this._lostEarly = new Map(); // id -> reason: lost before its Lock was made
    this._closing = null;
  }

  get backend() {
    return this._h.backend();
  }

  _dispatchLost(id, reason) {
    const ref = this._locks.get(id);
    const lock = ref && ref.deref();
    if (lock)
      lock._markLost(reason);
    else if (!ref && this._starting.has(id))
      // Lost in the same turn of the loop as it was granted, before the
      // acquisition's promise reached _take: told once its Lock exists.
      this._lostEarly.set(id, reason);
  }

  _track(p) {
    this._pending.add(p);
    const done = () => this._pending.delete(p);
    p.then(done, done);
    return p;
  }

  _live() {
    if (this._closing)
      throw new Misuse('the client is closed', Misuse.code);
    return this._h;
  }

  async _take(Cls, name, start, opts) {
    const h = this._live();
    const onLost = opts.onLost;
    if (onLost !== undefined && onLost !== null && typeof onLost !== 'function')
      throw invalid(`onLost must be a function, got ${describe(onLost)}`);
    const id = nextId++;
    const p = start(h, id);
    this._pending.add(p);
    this._starting.add(id);
    let handle;
    try {
      handle = await p;
    } finally {
      this._pending.delete(p);
      this._starting.delete(id);
    }
    this._held.add(handle);
    const lock = new Cls(this, handle, id, onLost || null, name);
    this._locks.set(id, new WeakRef(lock));
    registry.register(lock, { client: this, handle, id }, lock);
    const early = this._lostEarly.get(id);
    if (early !== undefined) {
      this._lostEarly.delete(id);
      lock._markLost(early);
    }
    return lock;
  }

  // The positional options the native calls take after the name(s).
  _args(opts, kind, permits = 0) {
    return [ms(opts.ttl === undefined ? 30000 : opts.ttl, 'ttl'),
      ms(opts.wait === undefined ? 0 : opts.wait, 'wait', true),
      opts.autoRenew === undefined ? true : Boolean(opts.autoRenew),
      kind, text(opts.owner, 'owner'), Boolean(opts.reentrant), permits,
      text(opts.label, 'label')];
  }

  _kind(name, kind, opts, permits = 0) {
    return this._take(Lock, name, (h, id) => {
      const [ttl, wait, renew, k, owner, reentrant, p, label] = this._args(opts, kind, permits);
      return h.acquire(text(name, 'name', false), ttl, wait, renew, id, k, owner, reentrant, p,
        label);
    }, opts);
  }

  /** Take the lock called name. opts: ttl (the lease, default 30000 ms),
   * wait (0 tries once and rejects with Busy; a number of ms waits that
   * long, then Timeout; Infinity waits as long as it takes), autoRenew
   * (default true), onLost(lock, reason), fair, owner, reentrant, label. */
  acquire(name, opts) {
    try {
      opts = checkKeys(opts, ACQUIRE_OPTIONS, 'acquire');
      return this._kind(name, opts.fair ? KINDS.fair : KINDS.mutex, opts);
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /** The shared (reader's) side of the read-write lock name. */
  readLock(name, opts) {
    try {
      return this._kind(name, KINDS.read, checkKeys(opts, KIND_OPTIONS, 'readLock'));
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /** The exclusive (writer's) side of the read-write lock name. */
  writeLock(name, opts) {
    try {
      return this._kind(name, KINDS.write, checkKeys(opts, KIND_OPTIONS, 'writeLock'));
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /** One of permits places of the semaphore name (the first holder's
   * permits stand; setPermits changes them). */
  semaphore(name, permits, opts) {
    return (async () => {
      if (!Number.isInteger(permits))
        throw invalid(`permits must be an integer, got ${describe(permits)}`);
      return this._kind(name, KINDS.semaphore, checkKeys(opts, KIND_OPTIONS, 'semaphore'),
        permits);
    })();
  }

  /** Every lock of names, all or none; one Lock that holds them all. */
  acquireMulti(names, opts) {
    return (async () => {
      opts = checkKeys(opts, new Set(['ttl', 'wait', 'autoRenew', 'onLost', 'label']),
        'acquireMulti');
      if (!Array.isArray(names))
        throw invalid('names must be an array of names');
      return this._take(Lock, names[0], (h, id) => {
        const [ttl, wait, renew, , , , , label] = this._args(opts, 0);
        return h.acquireMulti(names.map((n) => text(n, 'each name', false)), ttl, wait, renew,
          id, 0, null, false, 0, label);
      }, opts);
    })();
  }

  /** Stand in the election name as identity; resolves to the Leader once
   * this campaigner leads (wait: Infinity by default). */
  campaign(name, identity, opts) {
    return (async () => {
      opts = checkKeys(opts, new Set(['ttl', 'wait', 'onLost']), 'campaign');
      const o = { ...opts, wait: opts.wait === undefined ? Infinity : opts.wait };
      return this._take(Leader, name, (h, id) => {
        const [ttl, wait] = this._args(o, 0);
        return h.campaign(text(name, 'name', false), text(identity, 'identity', false), ttl,
          wait, true, id, 0, null, false, 0, null);
      }, o);
    })();
  }

  /** Acquire, run fn(lock), release; resolves to fn's result. If the lock
   * was lost while fn ran, rejects with LockLost after fn has finished
   * (fn's own error wins if it threw). */
  async using(name, opts, fn) {
    if (typeof opts === 'function' && fn === undefined) {
      fn = opts;
      opts = undefined;
    }
    if (typeof fn !== 'function')
      throw invalid('using needs a function to run under the lock');
    const lock = await this.acquire(name, opts);
    let result;
    try {
      result = await fn(lock);
    } catch (e) {
      await lock.release().catch(() => {});
      throw e;
    }
    await lock.release();
    return result;
  }

  /** Who leads the election name now: { held, identity, fence, ttl }. */
  async leader(name) {
    return this._track(this._live().leader(text(name, 'name', false)));
  }

  /** The state of the lock name, without taking it: { held, fence, ttl,
   * holders, kind, host, pid, startMs, label }. */
  async status(name) {
    const s = await this._track(this._live().status(text(name, 'name', false)));
    s.kind = s.kind < 0 ? null : KIND_NAMES[s.kind] || String(s.kind);
    return s;
  }

  /** Change the number of places of the semaphore name. */
  async setPermits(name, permits) {
    if (!Number.isInteger(permits))
      throw invalid(`permits must be an integer, got ${describe(permits)}`);
    return this._track(this._live().setPermits(text(name, 'name', false), permits));
  }

  /** Stop every wait on this client, now and for good: waiting calls
   * reject with Interrupted and leave their queues. */
  interrupt() {
    this._h.interrupt();
  }

  /** Release the locks still held, then close the connections. Waits
   * that are running end with Interrupted first. */
  close() {
    if (!this._closing)
      this._closing = this._close();
    return this._closing;
  }

  async _close() {
    if (this._pending.size > 0) {
      this._h.interrupt();
      await Promise.allSettled([...this._pending]);
    }
    await Promise.allSettled([...this._held].map((h) => h.release()));
    this._held.clear();
    await this._h.free();
  }
}

if (Symbol.asyncDispose)
  Client.prototype[Symbol.asyncDispose] = Client.prototype.close;

/** Open a client for the lock server at url (redis://, rediss://,
 * redis-sentinel://, redis-cluster://, redlock://, etcd://, etcds://,
 * zk://, postgres://, mysql://: libdlock's docs/urls.md). opts:
 * connectTimeout and commandTimeout (ms), keyPrefix, clientName, noThreads
 * (libdlock starts no thread for the client: Node's loop renews its locks,
 * waits poll; Redis only, NotSupported elsewhere). Resolves once the
 * server answered. */
async function connect(url, opts) {
  opts = checkKeys(opts, new Set(['connectTimeout', 'commandTimeout', 'keyPrefix',
    'clientName', 'noThreads']), 'connect');
  text(url, 'url', false);
  if (opts.noThreads !== undefined && typeof opts.noThreads !== 'boolean')
    throw invalid(`noThreads must be a boolean, got ${describe(opts.noThreads)}`);
  let client = null;
  const args = [url,
    opts.connectTimeout === undefined ? null : ms(opts.connectTimeout, 'connectTimeout'),
    opts.commandTimeout === undefined ? null : ms(opts.commandTimeout, 'commandTimeout'),
    text(opts.keyPrefix, 'keyPrefix'), text(opts.clientName, 'clientName'),
    opts.noThreads === true];
  const h = new native.Client((id, reason) => client && client._dispatchLost(id, reason));
  try {
    await h.open(...args);
  } catch (e) {
    await h.free();
    throw e;
  }
  client = new Client(h);
  return client;
}

module.exports = {
  connect,
  Client,
  Lock,
  Leader,
  DlockError,
  Busy,
  Timeout,
  LockLost,
  Unreachable,
  AuthError,
  ProtocolError,
  InvalidArgument,
  OutOfMemory,
  NotSupported,
  Misuse,
  ServerError,
  Interrupted,
  Canceled,
  version: native.version(),
  _native: native,
};
