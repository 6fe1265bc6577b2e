// SPDX-License-Identifier: BSD-3-Clause
// Compiled (tsc --noEmit --strict) by binding.test.js: the declarations
// in lib/index.d.ts describe the API the way a program uses it.
import * as dlock from '..';

async function job(url: string): Promise<bigint> {
  const client: dlock.Client = await dlock.connect(url, { connectTimeout: 1000 });
  const lock: dlock.Lock = await client.acquire('payout', { ttl: 30000, wait: 10000, fair: true });
  const fence: bigint = lock.fence;
  const signal: AbortSignal = lock.signal;
  const left: number = lock.validMs;
  await lock.extend(left + 1000);
  await lock.release();
  const r: string = await client.using('payout', { wait: Infinity }, async (l) => {
    return l.kind + (signal.aborted ? 'lost' : '');
  });
  await client.using('payout', (l) => l.fence);
  const info: dlock.LockInfo = await client.status('payout');
  const lead: dlock.Leader = await client.campaign('election', 'me', { ttl: 5000 });
  await lead.resign();
  const sem = await client.semaphore('pool', 3, { onLost: (l, reason) => l.name + reason });
  await sem.release();
  try {
    await client.acquire('payout');
  } catch (e) {
    if (e instanceof dlock.Busy)
      return BigInt(e.code) + (info.fence ?? 0n) + BigInt(r.length);
    if (e instanceof dlock.Canceled || e instanceof dlock.Interrupted)
      return BigInt(e.code);
  }
  await client.close();
  return fence;
}

void job;
