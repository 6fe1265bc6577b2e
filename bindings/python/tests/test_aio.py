# SPDX-License-Identifier: BSD-3-Clause
"""dlock.aio on real servers: every case on each backend the `server`
fixture gives (conftest.py), its loop asyncio.run's own."""
import asyncio
import threading
import time

import pytest

import dlock
import dlock.aio


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_cycle_and_fences(server, name):
    async def main():
        async with await dlock.aio.connect(server.url) as c:
            fences = []
            for _ in range(5):
                async with c.lock(name, ttl=10) as lock:
                    assert lock.fence > 0 and not lock.lost and 9.0 < lock.valid <= 10.0
                    # Within every backend's bounds (ZooKeeper: the 10 s
                    # session the lock lives in).
                    await lock.extend(8)
                    assert 7.0 < lock.valid <= 8.0
                    fences.append(lock.fence)
                assert lock.released
            assert fences == sorted(fences) and len(set(fences)) == 5
            with dlock.Client(server.url) as other:
                assert not other.status(name).held
                with other.lock(name) as blocking:
                    assert blocking.fence > fences[-1]
    run(main())


def test_busy_timeout_and_bad_input(server, name):
    async def main():
        async with await dlock.aio.connect(server.url) as c:
            with dlock.Client(server.url) as other, other.lock(name):
                with pytest.raises(dlock.Busy) as e:
                    await c.lock(name)
                assert e.value.code == -1 and name in e.value.message
                t0 = time.monotonic()
                with pytest.raises(dlock.Timeout):
                    await c.lock(name, wait=0.3)
                assert time.monotonic() - t0 >= 0.3
            with pytest.raises(dlock.InvalidArgument) as e:
                await c.lock(name, ttl=-1)
            assert "ttl" in e.value.message
            with pytest.raises(dlock.InvalidArgument):
                await c.lock("")
            with pytest.raises(dlock.InvalidArgument):
                c.read_lock(name, colour="red")
    run(main())


def test_waiters_on_one_loop_are_handed_the_lock(server, name):
    """20 tasks wait on one client and one loop (no thread each); the
    holder, a blocking client on another thread, releases; each task gets
    the lock once, one at a time."""
    async def main():
        async with await dlock.aio.connect(server.url) as c:
            holder_client = dlock.Client(server.url)
            holder = holder_client.lock(name, ttl=10)
            inside, most, fences = 0, 0, []

            async def worker():
                nonlocal inside, most
                async with c.lock(name, ttl=10, wait=30) as lock:
                    inside += 1
                    most = max(most, inside)
                    fences.append(lock.fence)
                    await asyncio.sleep(0.005)
                    inside -= 1
            tasks = [asyncio.create_task(worker()) for _ in range(20)]
            await asyncio.sleep(0.3)
            assert not any(t.done() for t in tasks)
            threads = threading.active_count()
            await asyncio.to_thread(holder.release)
            await asyncio.gather(*tasks)
            holder_client.close()
            assert most == 1 and len(fences) == 20 and len(set(fences)) == 20
            return threads
    run(main())


def test_cancelled_task_leaves_the_queue(server, name):
    async def main():
        async with await dlock.aio.connect(server.url) as c:
            with dlock.Client(server.url) as other:
                held = other.lock(name, ttl=10)
                fence = held.fence
                task = asyncio.create_task(c.acquire(name, wait=30))
                await asyncio.sleep(0.3)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await asyncio.sleep(0.2)
                held.release()
                # Nobody took it: the canceled waiter left the queue (on
                # Redis, whose fences are dense, not even for a moment).
                await asyncio.sleep(0.3)
                assert not other.status(name).held
                async with c.lock(name) as lock:
                    assert lock.fence == fence + 1 if server.name == "redis" else lock.fence > fence
    run(main())


def test_close_cancels_waiters(server, name):
    async def main():
        c = await dlock.aio.connect(server.url)
        with dlock.Client(server.url) as other, other.lock(name, ttl=10):
            task = asyncio.create_task(c.acquire(name, wait=30))
            await asyncio.sleep(0.3)
            await c.close()
            with pytest.raises(dlock.Canceled) as e:
                await task
            assert e.value.code == -13 and "dlock_client_free" in e.value.message
    run(main())


def test_on_lost_runs_on_the_loop(server, name):
    """A lease that runs out (no renewal) is lost: on_lost runs on the
    loop's thread, a coroutine function as a task; the block raises."""
    async def main():
        async with await dlock.aio.connect(server.url) as c:
            told = asyncio.Event()
            where = []

            async def on_lost(lock):
                where.append(threading.current_thread())
                told.set()
            with pytest.raises(dlock.LockLost):
                async with c.lock(name, ttl=server.short_ttl, auto_renew=False,
                                  on_lost=on_lost) as lock:
                    await asyncio.wait_for(told.wait(), 20)
                    assert lock.lost
            assert where == [threading.main_thread()]
    run(main())


def _threads():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return -1


def test_no_threads_client_on_the_loop(server, name):
    """no_threads=True: the loop renews the lock (a 0.6 s lease held 2 s), a
    wait is granted when another client lets go, and the C library starts no
    thread meanwhile; elsewhere than Redis, NotSupported."""
    if server.name != "redis":
        with pytest.raises(dlock.NotSupported) as e:
            dlock.Client(server.url, no_threads=True)
        assert "DLOCK_CLIENT_NO_THREADS" in e.value.message
        return

    async def main():
        async with await dlock.aio.connect(server.url, no_threads=True) as c:
            with dlock.Client(server.url) as other:
                before = _threads()
                async with c.lock(name, ttl=0.6) as lock:
                    await asyncio.sleep(2)
                    assert not lock.lost and lock.valid > 0
                    assert other.status(name).held
                    fence = lock.fence
                held = other.acquire(name, ttl=10, auto_renew=False)
                waiter = asyncio.ensure_future(c.acquire(name, ttl=10, wait=5))
                await asyncio.sleep(0.3)
                assert not waiter.done()
                held.release()
                got = await waiter
                assert got.fence > fence
                await got.release()
                assert _threads() == before
    run(main())
