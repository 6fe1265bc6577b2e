# SPDX-License-Identifier: BSD-3-Clause
"""dlock for asyncio, on the C library's asynchronous API.

    import dlock.aio

    async def main():
        async with await dlock.aio.connect("redis://127.0.0.1:6379") as c:
            async with c.lock("payout", ttl=30, wait=10) as lock:
                await store.write(data, fence=lock.fence)

Acquisitions, releases and extensions run on the running event loop: the
loop watches the client's descriptor (``loop.add_reader``) and the C
library calls back inside it, so no call takes a thread, and a task waiting
for a lock costs a future (on Redis, not even a thread of the client's:
docs/async.md). Cancelling the task that awaits ``acquire`` leaves the
lock's queue; a lock granted as the task was cancelled is released.

``on_lost(lock)`` runs on the loop (a coroutine function is scheduled as a
task); leaving an ``async with`` block whose lock was lost raises
``dlock.LockLost``, after the body ran, as the blocking API does. The other
calls (status, leader, set_permits, multi-locks, campaigns) are the
blocking ``dlock.Client``'s, on ``c.client``: run them with
``asyncio.to_thread``.

Threading: an AsyncClient belongs to the loop that made it; use it from
that loop only.
"""
import asyncio
from typing import Callable, Optional, Union

from . import (FAIR, MUTEX, READ, SEMAPHORE, WRITE, Client, Error, InvalidArgument, Lock,
               LockLost, Misuse, _ERRORS, _check, _message, _ms, _text)
from ._ffi import ffi, lib

__all__ = ["connect", "AsyncClient", "AsyncLock"]


class _Call:
    """A request in flight: its future, and what must live until the C
    library calls back (the handle it was given, the options' strings)."""

    def __init__(self, client, lock=None, keep=None):
        self.client = client
        self.lock = lock
        self.keep = keep
        self.fut = client._loop.create_future()
        self.handle = ffi.new_handle(self)
        client._calls.add(self)

    def settle(self, rc, c_lock):
        self.client._calls.discard(self)
        if self.fut.done():  # its task was cancelled; a granted lock is given back
            if rc == 0 and c_lock != ffi.NULL:
                _release_quietly(self.client, c_lock)
            return
        if rc != 0:
            self.fut.set_exception(_ERRORS.get(rc, Error)(_message(), rc))
        else:
            self.fut.set_result(c_lock)


@ffi.callback("void(int, dlock_lock *, void *)")
def _acquired(rc, c_lock, arg):
    ffi.from_handle(arg).settle(rc, c_lock)


@ffi.callback("void(int, void *)")
def _done(rc, arg):
    ffi.from_handle(arg).settle(rc, ffi.NULL)


@ffi.callback("void(int, void *)")
def _ignored(rc, arg):
    pass


def _release_quietly(client, c_lock):
    """Give back a lock nobody will see (its acquisition's task is gone)."""
    if lib.dlock_release_async(ffi.NULL, c_lock, _ignored, ffi.NULL) != 0:
        pass  # its client is gone: released and freed by the call already


@ffi.callback("void(dlock_lock *, int, void *)")
def _lost_on_loop(c_lock, reason, payload):
    """The C library calls it inside dlock_async_process, on the loop."""
    lock = ffi.from_handle(payload)
    lock._lost_reason = reason
    if lock._on_lost is not None:
        lock._client._loop.call_soon(lock._run_on_lost)


class AsyncLock(Lock):
    """A lock this task holds (see dlock.Lock for fence, lost, valid):
    ``await release()``, or use it in ``async with``."""

    def __init__(self, aclient, on_lost):
        super().__init__(aclient._client, on_lost)
        self._aclient = aclient
        self._client = aclient  # _lost_on_loop reaches the loop through it

    def _run_on_lost(self):
        result = self._on_lost(self)
        if asyncio.iscoroutine(result):
            self._aclient._loop.create_task(result)

    async def release(self) -> None:
        """Give the lock back. LockLost when it had been lost meanwhile (it
        is gone either way). Releasing twice is a Misuse."""
        with self._lock:
            c = self._ptr()
            self._c = None
        self._aclient._held.discard(self)
        call = _Call(self._aclient)
        rc = lib.dlock_release_async(ffi.NULL, c, _done, call.handle)
        if rc != 0:
            self._aclient._calls.discard(call)
            raise _ERRORS.get(rc, Error)(_message(), rc)
        await call.fut

    async def extend(self, ttl: float) -> None:
        """Set the lease to ttl seconds from now."""
        call = _Call(self._aclient)
        rc = lib.dlock_extend_async(ffi.NULL, self._ptr(), _ms(ttl, "ttl"), _done, call.handle)
        if rc != 0:
            self._aclient._calls.discard(call)
            raise _ERRORS.get(rc, Error)(_message(), rc)
        await call.fut

    async def __aenter__(self) -> "AsyncLock":
        return self

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        if self._c is None:
            return False
        try:
            await self.release()
        except LockLost:
            if exc_type is None:
                raise
        return False

    def __enter__(self):
        raise TypeError("use 'async with' for a dlock.aio lock")

    def __del__(self):
        # Dropped without a release: released, not leaked.
        c, self._c = getattr(self, "_c", None), None
        if c is not None:
            _release_quietly(self._aclient, c)

    def __repr__(self):
        return Lock.__repr__(self).replace("dlock.Lock", "dlock.aio.AsyncLock")


class _Acquiring:
    """What ``AsyncClient.lock(...)`` returns: awaitable (the lock) and an
    async context manager (released on the way out)."""

    def __init__(self, coro_fn):
        self._coro_fn = coro_fn
        self._lock = None

    def __await__(self):
        return self._coro_fn().__await__()

    async def __aenter__(self) -> AsyncLock:
        self._lock = await self._coro_fn()
        return self._lock

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        return await self._lock.__aexit__(exc_type, exc, tb)


class AsyncClient:
    """A dlock.Client served on an asyncio loop. Made by ``await
    connect(url)``; ``await close()`` (or ``async with``) ends it."""

    def __init__(self, client: Client, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self._client = client
        self._loop = loop
        self._calls = set()
        self._held = set()
        self._timer = None
        self._fd = lib.dlock_async_fd(client._ptr())
        if self._fd < 0:
            raise Error(_message() or "dlock_async_fd failed", -8)
        loop.add_reader(self._fd, self._process)

    def _process(self):
        c = self.client._c
        if c is None:
            return
        n = lib.dlock_async_process(c)
        if n < 0:
            _check(n)
        self._arm()

    def _arm(self):
        """Have the loop process again when the C library says (what it sent
        from here times out then)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        c = self.client._c
        ms = lib.dlock_async_timeout_ms(c) if c is not None else -1
        if ms >= 0:
            self._timer = self._loop.call_later(ms / 1000.0, self._process)

    @property
    def backend(self) -> str:
        return self.client.backend

    def _acquire(self, name, kind, ttl, wait, auto_renew, on_lost, owner, reentrant, permits,
                 label):
        async def run():
            if isinstance(permits, bool) or not isinstance(permits, int):
                raise InvalidArgument("permits must be an int, got %r" % (permits,), -7)
            if on_lost is not None and not callable(on_lost):
                raise InvalidArgument("on_lost must be callable", -7)
            lock = AsyncLock(self, on_lost)
            o, keep = self.client._options(ttl, wait, auto_renew, None, kind, owner, reentrant,
                                           permits, label, lock)
            if on_lost is not None:
                o.on_lost = _lost_on_loop
                o.payload = lock._handle
            n = _text(name, "name")
            call = _Call(self, lock, (keep, o, n))
            out = ffi.new("dlock_request_handle **")
            rc = lib.dlock_acquire_async(out, self.client._ptr(), n, o, _acquired, call.handle)
            if rc != 0:
                self._calls.discard(call)
                raise _ERRORS.get(rc, Error)(_message(), rc)
            try:
                c_lock = await call.fut
            except asyncio.CancelledError:
                if call.fut.done() and not call.fut.cancelled() and \
                        call.fut.exception() is None:
                    _release_quietly(self, call.fut.result())  # granted as it was cancelled
                elif not call.fut.done() or call.fut.cancelled():
                    if call in self._calls:  # not called back yet: leave the queue
                        lib.dlock_request_cancel(out[0])
                raise
            lock._c = c_lock
            self._held.add(lock)
            return lock
        return _Acquiring(run)

    def lock(self, name: Union[str, bytes], *, ttl: float = 30, wait: Optional[float] = 0,
             auto_renew: bool = True, on_lost: Optional[Callable[[AsyncLock], None]] = None,
             fair: bool = False, owner: Optional[str] = None, reentrant: bool = False,
             label: Optional[str] = None) -> _Acquiring:
        """As dlock.Client.acquire: ``async with c.lock(...) as lock``
        releases it at the end; ``await c.lock(...)`` gives the lock."""
        return self._acquire(name, FAIR if fair else MUTEX, ttl, wait, auto_renew, on_lost,
                             owner, reentrant, 0, label)

    async def acquire(self, name: Union[str, bytes], **kw) -> AsyncLock:
        """``await c.acquire(...)``: the lock (a coroutine, for create_task);
        the options of lock()."""
        return await self.lock(name, **kw)

    def read_lock(self, name: Union[str, bytes], **kw) -> _Acquiring:
        return self._kind(name, READ, kw)

    def write_lock(self, name: Union[str, bytes], **kw) -> _Acquiring:
        return self._kind(name, WRITE, kw)

    def semaphore(self, name: Union[str, bytes], permits: int, **kw) -> _Acquiring:
        return self._kind(name, SEMAPHORE, kw, permits)

    def _kind(self, name, kind, kw, permits=0):
        args = {"ttl": 30, "wait": 0, "auto_renew": True, "on_lost": None, "owner": None,
                "reentrant": False, "label": None}
        unknown = set(kw) - set(args)
        if unknown:
            raise InvalidArgument("unknown option(s): %s" % ", ".join(sorted(unknown)), -7)
        args.update(kw)
        return self._acquire(name, kind, args["ttl"], args["wait"], args["auto_renew"],
                             args["on_lost"], args["owner"], args["reentrant"], permits,
                             args["label"])

    async def close(self) -> None:
        """Release the locks still held (quietly), stop the waits (they
        raise Canceled), and free the client."""
        if self.client._c is None:
            return
        for lock in list(self._held):
            try:
                await lock.release()
            except Error:
                pass
        self._loop.remove_reader(self._fd)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # Waits still running get DLOCK_ECANCELED, called back from inside.
        self.client.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> bool:
        await self.close()
        return False


async def connect(url: Union[str, bytes], **kw) -> AsyncClient:
    """Open a client (its connection made on a thread: dlock_client_open
    blocks) and serve it on the running loop. kw: dlock.Client's."""
    loop = asyncio.get_running_loop()
    client = await loop.run_in_executor(None, lambda: Client(url, **kw))
    try:
        return AsyncClient(client, loop)
    except BaseException:
        client.close()
        raise
