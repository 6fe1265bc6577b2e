// SPDX-License-Identifier: BSD-3-Clause
// TypeScript declarations of dlock's Node.js binding (lib/index.js).

/** The library's version, "MAJOR.MINOR.PATCH". */
export const version: string;

export interface ConnectOptions {
  /** How long connecting may take, ms (the C default: 5000). */
  connectTimeout?: number;
  /** How long one command may take, ms (the C default: 5000). */
  commandTimeout?: number;
  /** Prepended to every lock name's key on the server. */
  keyPrefix?: string;
  /** The connection's name on the server (Redis CLIENT SETNAME). */
  clientName?: string;
  /** libdlock starts no thread for this client (DLOCK_CLIENT_NO_THREADS):
   * Node's loop renews its locks too, and a wait polls the server. Redis
   * (one server, TLS, Sentinel) only: NotSupported elsewhere. */
  noThreads?: boolean;
}

export interface LockOptions {
  /** The lease, ms (default 30000). */
  ttl?: number;
  /** 0 (default): try once, Busy if held. A number of ms: wait that long,
   * then Timeout. Infinity (or null): as long as it takes. */
  wait?: number | null;
  /** Default true: the client's watchdog renews the lease until release. */
  autoRenew?: boolean;
  /** Called on the JavaScript thread when the lock is found lost, after
   * lock.signal aborted. reason: LockLost.code or Unreachable.code. */
  onLost?: (lock: Lock, reason: number) => void;
  /** An owner id: who holds the lock, for reentrancy. */
  owner?: string;
  /** With an owner id: the owner takes the lock again at once. */
  reentrant?: boolean;
  /** Shown by status() beside the holder's host and pid. */
  label?: string;
}

export interface AcquireOptions extends LockOptions {
  /** Waiters get the lock in the order they began to wait. */
  fair?: boolean;
}

export interface MultiOptions {
  ttl?: number;
  wait?: number | null;
  autoRenew?: boolean;
  onLost?: (lock: Lock, reason: number) => void;
  label?: string;
}

export interface CampaignOptions {
  ttl?: number;
  /** Default Infinity: campaign until elected. */
  wait?: number | null;
  onLost?: (lock: Lock, reason: number) => void;
}

export type LockKind = 'mutex' | 'fair' | 'read' | 'write' | 'semaphore' | 'leader' | 'multi';

export interface LockInfo {
  held: boolean;
  /** The highest fence issued for the name so far. */
  fence: bigint;
  /** Lease left, ms; null when held with no expiry. */
  ttl: number | null;
  holders: number;
  kind: LockKind | null;
  host: string | null;
  pid: number | null;
  /** When the holder took the lock, by its wall clock (ms since the epoch). */
  startMs: number | null;
  label: string | null;
}

export interface LeaderInfo {
  held: boolean;
  identity: string | null;
  fence: bigint;
  ttl: number | null;
}

/** A lock this process holds. */
export class Lock {
  private constructor();
  readonly name: string;
  /** Strictly greater than every fence issued before for this name. */
  readonly fence: bigint;
  readonly names: string[];
  readonly fences: bigint[];
  readonly kind: LockKind;
  /** True once the lock is known lost (no I/O). */
  readonly lost: boolean;
  /** Lease left, ms, by the last renewal the server confirmed. */
  readonly validMs: number;
  readonly released: boolean;
  /** Aborts, with a LockLost as its reason, when the lock is found lost. */
  readonly signal: AbortSignal;
  /** Rejects with LockLost if the server no longer has the lock as ours. */
  check(): Promise<void>;
  /** Set the lease to ttl ms from now. */
  extend(ttl: number): Promise<void>;
  /** A write lock becomes a read lock, without letting go. */
  downgrade(): Promise<void>;
  /** Give the lock back; LockLost if it had been lost meanwhile. */
  release(): Promise<void>;
}

export class Leader extends Lock {
  resign(): Promise<void>;
}

export class Client {
  private constructor();
  /** "redis", "etcd", "zk", "postgres", "mysql", "redlock" ... */
  readonly backend: string;
  acquire(name: string, opts?: AcquireOptions): Promise<Lock>;
  readLock(name: string, opts?: LockOptions): Promise<Lock>;
  writeLock(name: string, opts?: LockOptions): Promise<Lock>;
  semaphore(name: string, permits: number, opts?: LockOptions): Promise<Lock>;
  acquireMulti(names: string[], opts?: MultiOptions): Promise<Lock>;
  campaign(name: string, identity: string, opts?: CampaignOptions): Promise<Leader>;
  /** Acquire, run fn, release; LockLost after fn if the lock was lost. */
  using<T>(name: string, opts: AcquireOptions | undefined,
    fn: (lock: Lock) => T | Promise<T>): Promise<T>;
  using<T>(name: string, fn: (lock: Lock) => T | Promise<T>): Promise<T>;
  leader(name: string): Promise<LeaderInfo>;
  status(name: string): Promise<LockInfo>;
  setPermits(name: string, permits: number): Promise<void>;
  /** Stop every wait on this client, for good (they reject with Interrupted). */
  interrupt(): void;
  /** Interrupt the waits, release what is held, close the connections. */
  close(): Promise<void>;
}

export function connect(url: string, opts?: ConnectOptions): Promise<Client>;

export class DlockError extends Error {
  /** The C code (negative). */
  readonly code: number;
}
export class Busy extends DlockError {}
export class Timeout extends Busy {}
export class LockLost extends DlockError {}
export class Unreachable extends DlockError {}
export class AuthError extends DlockError {}
export class ProtocolError extends DlockError {}
export class InvalidArgument extends DlockError {}
export class OutOfMemory extends DlockError {}
export class NotSupported extends DlockError {}
export class Misuse extends DlockError {}
export class ServerError extends DlockError {}
export class Interrupted extends DlockError {}
/** An acquisition stopped because its client was freed while it ran. */
export class Canceled extends DlockError {}
