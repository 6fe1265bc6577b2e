# SPDX-License-Identifier: BSD-3-Clause
"""dlock: distributed locks with fencing tokens, over libdlock's C API.

    import dlock

    with dlock.Client("redis://127.0.0.1:6379") as c:
        with c.lock("payout", ttl=30, wait=10) as lock:
            store.write(data, fence=lock.fence)

A lock is taken on Redis (single node, Sentinel, Cluster, Redlock), etcd,
ZooKeeper, PostgreSQL or MySQL/MariaDB, whichever the URL names, with a
fence that rises with every acquisition: give it to the resource you
protect and let it refuse a smaller one (the C library's docs/fencing.md).
The lease is renewed in the background while you hold the lock; if it is
lost anyway (a pause longer than the lease, a server that lost the key),
``lock.lost`` turns true as soon as the library knows, an optional
``on_lost`` callback runs on a thread of its own, and leaving the ``with``
block raises ``LockLost`` -- after the block's body ran, which is why
writes must carry the fence.

Times are in seconds (floats allowed). Every call that waits releases the
GIL; a wait in the main thread is interrupted by ^C (KeyboardInterrupt),
which leaves the lock's queue as the ``dlock`` command does: the client's
waits stop for good then (``Client.interrupt``). For asyncio, ``dlock.aio``
runs acquisitions and releases on the event loop itself (the C library's
asynchronous API), without a thread per call or per wait.
"""
from typing import Callable, List, Optional, Sequence, Union
import signal
import threading
import weakref

from ._ffi import (ACQUIRE_OPTIONS_VERSION, CLIENT_NO_THREADS, CLIENT_OPTIONS_VERSION,
                   WAIT_FOREVER, ffi, lib)

__all__ = [
    "Client", "Lock", "Leader", "LockInfo", "LeaderInfo", "version",
    "Error", "Busy", "Timeout", "LockLost", "Unreachable", "AuthError", "ProtocolError",
    "InvalidArgument", "OutOfMemory", "NotSupported", "Misuse", "ServerError",
    "Interrupted", "Canceled",
]

MUTEX, FAIR, READ, WRITE, SEMAPHORE, LEADER = range(6)
# Blocked in a helper thread that waits in a C call (Client._take).
_ASYNC_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                  signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGCHLD}
_KIND_NAMES = {MUTEX: "mutex", FAIR: "fair", READ: "read", WRITE: "write",
               SEMAPHORE: "semaphore", LEADER: "leader"}


def version() -> str:
    """The version of the C library loaded, "MAJOR.MINOR.PATCH"."""
    return ffi.string(lib.dlock_version()).decode()


# ---- errors -------------------------------------------------------------------


class Error(Exception):
    """A dlock call failed: ``code`` is the C code (DLOCK_E*, negative),
    ``message`` the C library's text (it names the server, never a
    password)."""

    code = None

    def __init__(self, message: str, code: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class Busy(Error):
    """The lock is held by another owner (a try that does not wait)."""
    code = -1


class Timeout(Busy, TimeoutError):
    """Still held by another owner when the wait ran out."""
    code = -2


class LockLost(Error):
    """The lock was lost: its lease ran out or another took it over."""
    code = -3


class Unreachable(Error, ConnectionError):
    """The lock server could not be reached (or did not answer in time)."""
    code = -4


class AuthError(Error):
    """The lock server refused the credentials."""
    code = -5


class ProtocolError(Error):
    """The lock server answered something its protocol does not allow."""
    code = -6


class InvalidArgument(Error, ValueError):
    """A bad URL, name or option; the message says which."""
    code = -7


class OutOfMemory(Error, MemoryError):
    code = -8


class NotSupported(Error):
    """The backend does not offer this kind of lock or call."""
    code = -9


class Misuse(Error):
    """The API was used in a way it forbids (a release from on_lost ...)."""
    code = -10


class ServerError(Error):
    """The lock server refused the command."""
    code = -11


class Interrupted(Error):
    """The client's waits were stopped (Client.interrupt)."""
    code = -12


class Canceled(Error):
    """An asynchronous acquisition was stopped before it got the lock
    (dlock.aio: its client closed)."""
    code = -13


_ERRORS = {cls.code: cls for cls in (Busy, Timeout, LockLost, Unreachable, AuthError,
                                     ProtocolError, InvalidArgument, OutOfMemory,
                                     NotSupported, Misuse, ServerError, Interrupted,
                                     Canceled)}


def _error(rc):
    """The exception for C code rc, with this thread's C message (read it
    right after the call, on the thread that made it)."""
    message = ffi.string(lib.dlock_error_message()).decode("utf-8", "replace")
    if not message:
        message = ffi.string(lib.dlock_strerror(rc)).decode()
    cls = _ERRORS.get(rc, Error)
    return cls(message, rc)


def _check(rc):
    if rc != 0:
        raise _error(rc)


def _ms(seconds, what, forever_ok=False):
    if seconds is None:
        if forever_ok:
            return WAIT_FOREVER
        raise InvalidArgument("%s must be a number of seconds, not None" % what, -7)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise InvalidArgument("%s must be a number of seconds, got %r" % (what, seconds), -7)
    if seconds < 0:
        raise InvalidArgument("%s must not be negative, got %r" % (what, seconds), -7)
    if seconds == float("inf"):
        if forever_ok:
            return WAIT_FOREVER
        raise InvalidArgument("%s must be finite" % what, -7)
    return int(round(seconds * 1000))


def _text(value, what):
    if value is None:
        return ffi.NULL
    if isinstance(value, str):
        value = value.encode()
    if not isinstance(value, bytes):
        raise InvalidArgument("%s must be a str, got %r" % (what, type(value).__name__), -7)
    if b"\0" in value:
        raise InvalidArgument("%s must not contain a NUL byte" % what, -7)
    return value


# ---- on_lost --------------------------------------------------------------------


@ffi.callback("void(dlock_lock *, int, void *)")
def _lost_trampoline(c_lock, reason, payload):
    """Runs on the client's watchdog thread (cffi takes the GIL), which must
    not wait: the lock is marked, the user's callback gets a thread."""
    lock = ffi.from_handle(payload)
    lock._lost_reason = reason
    if lock._on_lost is not None:
        threading.Thread(target=lock._run_on_lost, name="dlock-on-lost", daemon=True).start()


# ---- locks ------------------------------------------------------------------------


class LockInfo:
    """What dlock_status read about a lock (Client.status)."""

    def __init__(self, info):
        self.held = bool(info.held)
        self.fence = int(info.fence)
        self.ttl = info.ttl_ms / 1000.0 if info.ttl_ms >= 0 else None
        self.holders = int(info.holders)
        self.kind = _KIND_NAMES.get(info.kind, str(info.kind))
        if info.has_holder:
            self.host = ffi.string(info.host).decode("utf-8", "replace")
            self.pid = int(info.pid)
            self.label = ffi.string(info.label).decode("utf-8", "replace") or None
        else:
            self.host = self.pid = self.label = None

    def __repr__(self):
        return "LockInfo(held=%r, fence=%r, ttl=%r, holders=%r, host=%r, pid=%r)" % (
            self.held, self.fence, self.ttl, self.holders, self.host, self.pid)


class LeaderInfo:
    """Who leads an election now (Client.leader)."""

    def __init__(self, info):
        self.held = bool(info.held)
        self.fence = int(info.fence)
        self.ttl = info.ttl_ms / 1000.0 if info.held else None
        self.identity = ffi.string(info.identity).decode("utf-8", "replace") if info.held else None

    def __repr__(self):
        return "LeaderInfo(held=%r, identity=%r, fence=%r)" % (self.held, self.identity, self.fence)


class Lock:
    """A lock this process holds. Use it as a context manager, or call
    release(). ``fence`` rises with every acquisition of the lock; ``lost``
    is true once the lock is known lost; ``valid`` is the lease left, in
    seconds, by the last renewal the server confirmed."""

    def __init__(self, client, on_lost):
        self._client = client
        self._c = None
        self._on_lost = on_lost
        self._lost_reason = 0
        self._handle = ffi.new_handle(self)
        self._lock = threading.Lock()

    def _run_on_lost(self):
        self._on_lost(self)

    def _ptr(self):
        if self._c is None:
            raise Misuse("the lock was released already", -10)
        return self._c

    @property
    def name(self) -> str:
        return ffi.string(lib.dlock_lock_name(self._ptr())).decode("utf-8", "replace")

    @property
    def names(self) -> List[str]:
        """Every name a multi-lock holds (one name for the others)."""
        c = self._ptr()
        return [ffi.string(lib.dlock_lock_name_at(c, i)).decode("utf-8", "replace")
                for i in range(lib.dlock_lock_count(c))]

    @property
    def fence(self) -> int:
        return int(lib.dlock_lock_fence(self._ptr()))

    @property
    def fences(self) -> List[int]:
        """The fence of each lock of a multi-lock, in the order of names."""
        c = self._ptr()
        return [int(lib.dlock_lock_fence_at(c, i)) for i in range(lib.dlock_lock_count(c))]

    @property
    def kind(self) -> str:
        return _KIND_NAMES.get(lib.dlock_lock_kind(self._ptr()), "multi")

    @property
    def lost(self) -> bool:
        return self._c is not None and bool(lib.dlock_lock_lost(self._c))

    @property
    def valid(self) -> float:
        """Seconds of lease left (0 once lost)."""
        return lib.dlock_lock_valid_ms(self._ptr()) / 1000.0

    @property
    def valid_ms(self) -> int:
        return int(lib.dlock_lock_valid_ms(self._ptr()))

    @property
    def released(self) -> bool:
        return self._c is None

    def check(self) -> None:
        """Ask the server whether the lock is still ours; LockLost if not."""
        _check(lib.dlock_lock_check(self._ptr()))

    def extend(self, ttl: float) -> None:
        """Set the lease to ttl seconds from now."""
        _check(lib.dlock_lock_extend(self._ptr(), _ms(ttl, "ttl")))

    def downgrade(self) -> None:
        """A write lock becomes a read lock, without letting go."""
        _check(lib.dlock_lock_downgrade(self._ptr()))

    def release(self) -> None:
        """Give the lock back. LockLost when it had been lost meanwhile (it
        is gone either way). Releasing twice is a Misuse."""
        with self._lock:
            c = self._ptr()
            self._c = None
        self._client._held.discard(self)
        rc = lib.dlock_release(c)
        if rc != 0:
            raise _error(rc)

    def __enter__(self) -> "Lock":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._c is None:
            return False
        try:
            self.release()
        except LockLost:
            if exc_type is None:
                raise
        return False

    def __del__(self):
        # A lock dropped without a release is released, not leaked.
        c, self._c = getattr(self, "_c", None), None
        if c is not None:
            lib.dlock_release(c)

    def __repr__(self):
        if self._c is None:
            return "<dlock.Lock released>"
        return "<dlock.Lock %r fence=%d%s>" % (self.name, self.fence, " lost" if self.lost else "")


class Leader(Lock):
    """Leadership won by Client.campaign; resign() (or leaving the with
    block) steps down."""

    def resign(self) -> None:
        with self._lock:
            c = self._ptr()
            self._c = None
        self._client._held.discard(self)
        rc = lib.dlock_resign(c)
        if rc != 0:
            raise _error(rc)

    release = resign


# ---- the client ----------------------------------------------------------------------


class Client:
    """One connection set to a lock server, shared by threads.

    url: redis://, rediss://, redis-sentinel://, redis-cluster://,
    redlock://, etcd://, etcds://, zk://, postgres:// or mysql:// (the C
    library's docs/urls.md). connect_timeout and command_timeout in
    seconds; key_prefix and client_name as in dlock_client_options.

    no_threads=True: the C library starts no thread for this client
    (DLOCK_CLIENT_NO_THREADS; Redis on one server, TLS or Sentinel, plain
    locks): for dlock.aio, whose loop then renews the locks too, and waits
    by polling (docs/async.md). NotSupported on the other backends."""

    def __init__(self, url: Union[str, bytes], *, connect_timeout: Optional[float] = None,
                 command_timeout: Optional[float] = None, key_prefix: Optional[str] = None,
                 client_name: Optional[str] = None, no_threads: bool = False) -> None:
        opts = ffi.new("dlock_client_options *")
        _check(lib.dlock_client_options_init(opts, CLIENT_OPTIONS_VERSION))
        if no_threads:
            opts.flags = CLIENT_NO_THREADS
        if connect_timeout is not None:
            opts.connect_timeout_ms = _ms(connect_timeout, "connect_timeout")
        if command_timeout is not None:
            opts.command_timeout_ms = _ms(command_timeout, "command_timeout")
        keep = [_text(key_prefix, "key_prefix"), _text(client_name, "client_name")]
        if key_prefix is not None:
            opts.key_prefix = keep[0]
        if client_name is not None:
            opts.client_name = keep[1]
        out = ffi.new("dlock_client **")
        _check(lib.dlock_client_open(out, _text(url, "url"), opts))
        self._c = out[0]
        self._held = weakref.WeakSet()

    # ---- lifetime

    def close(self) -> None:
        """Free the client. Locks still held are released first (quietly:
        one lost meanwhile is gone anyway)."""
        c = getattr(self, "_c", None)
        if c is None:
            return
        for lock in list(self._held):
            try:
                lock.release()
            except Error:
                pass
        self._c = None
        lib.dlock_client_free(c)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def __del__(self):
        self.close()

    def _ptr(self):
        if self._c is None:
            raise Misuse("the client is closed", -10)
        return self._c

    @property
    def backend(self) -> str:
        return ffi.string(lib.dlock_client_backend(self._ptr())).decode()

    def interrupt(self) -> None:
        """Stop every wait on this client, now and for good: waiting calls
        raise Interrupted and leave their queues."""
        lib.dlock_client_interrupt(self._c)

    # ---- acquiring

    def _options(self, ttl, wait, auto_renew, on_lost, kind, owner, reentrant, permits,
                 label, lock):
        o = ffi.new("dlock_acquire_options *")
        _check(lib.dlock_acquire_options_init(o, ACQUIRE_OPTIONS_VERSION))
        o.lease_ms = _ms(ttl, "ttl")
        o.wait_ms = _ms(wait, "wait", forever_ok=True)
        o.auto_renew = 1 if auto_renew else 0
        if on_lost is not None:
            # Only then: a lock with on_lost is one more for the watchdog to
            # look after (lock.lost needs none: the C call is local).
            o.on_lost = _lost_trampoline
            o.payload = lock._handle
        o.kind = kind
        keep = [_text(owner, "owner"), _text(label, "label")]
        o.owner = keep[0]
        o.reentrant = 1 if reentrant else 0
        o.permits = permits
        o.label = keep[1]
        if on_lost is not None and not callable(on_lost):
            raise InvalidArgument("on_lost must be callable", -7)
        return o, keep

    def _take(self, lock, call, waits):
        """Run call(out) -> rc, the C acquisition. In the main thread a wait
        runs on a helper thread, so that ^C reaches Python: it interrupts
        the client's waits, and whatever the call took is released."""
        out = ffi.new("dlock_lock **")
        if not waits or threading.current_thread() is not threading.main_thread():
            rc = call(out)
        else:
            result = []
            # Not Thread.join: interrupted by ^C, it may take a thread that
            # still runs for ended (CPython gh-90882).
            done = threading.Event()

            def wait():
                try:
                    # The signals go to the main thread, which turns them
                    # into exceptions: none interrupts this one's calls.
                    signal.pthread_sigmask(signal.SIG_BLOCK, _ASYNC_SIGNALS)
                    result.append((call(out), _message()))
                finally:
                    done.set()
            t = threading.Thread(target=wait, name="dlock-wait", daemon=True)
            started = False
            try:
                t.start()
                started = True
                while not done.wait(0.05):
                    pass
            except BaseException:
                # ^C (or any exception) while the call waits: it leaves the
                # queue and returns within a round trip or two; nothing may
                # use the client before it has (dlock_client_free must not
                # run under a call).
                lib.dlock_client_interrupt(self._c)
                while started and not done.is_set():
                    try:
                        done.wait()
                    except KeyboardInterrupt:
                        pass
                if result and result[0][0] == 0:
                    lib.dlock_release(out[0])
                raise
            rc, message = result[0]
            if rc != 0:
                raise _ERRORS.get(rc, Error)(message, rc)
        if rc != 0:
            raise _error(rc)
        lock._c = out[0]
        self._held.add(lock)
        return lock

    def acquire(self, name: Union[str, bytes], *, ttl: float = 30, wait: Optional[float] = 0,
                auto_renew: bool = True, on_lost: Optional[Callable[["Lock"], None]] = None,
                fair: bool = False, owner: Optional[str] = None, reentrant: bool = False,
                label: Optional[str] = None) -> Lock:
        """Take the lock called name (a mutex; fair=True: a fair one, FIFO).
        ttl: the lease in seconds; wait: 0 tries once (Busy if held), a
        number waits that long (Timeout), None waits as long as it takes.
        on_lost(lock) runs on a thread of its own if the lock is lost.
        Returns a Lock; use it in a with block or release() it."""
        return self._kind(name, FAIR if fair else MUTEX,
                          {"ttl": ttl, "wait": wait, "auto_renew": auto_renew, "on_lost": on_lost,
                           "owner": owner, "reentrant": reentrant, "label": label})

    lock = acquire

    def read_lock(self, name: Union[str, bytes], **kw) -> Lock:
        """A shared (reader's) side of the read-write lock name."""
        return self._kind(name, READ, kw)

    def write_lock(self, name: Union[str, bytes], **kw) -> Lock:
        """The exclusive (writer's) side of the read-write lock name."""
        return self._kind(name, WRITE, kw)

    def semaphore(self, name: Union[str, bytes], permits: int, **kw) -> Lock:
        """One of permits places of the semaphore name (the first holder's
        permits stand; set_permits changes them)."""
        return self._kind(name, SEMAPHORE, kw, permits=permits)

    def _kind(self, name, kind, kw, permits=0):
        """One lock of kind (dlock_acquire); kw: acquire's options."""
        ttl, wait = kw.pop("ttl", 30), kw.pop("wait", 0)
        auto_renew, on_lost = kw.pop("auto_renew", True), kw.pop("on_lost", None)
        owner, reentrant, label = kw.pop("owner", None), kw.pop("reentrant", False), kw.pop("label", None)
        if kw:
            raise InvalidArgument("unknown option(s): %s" % ", ".join(sorted(kw)), -7)
        if isinstance(permits, bool) or not isinstance(permits, int):
            raise InvalidArgument("permits must be an int, got %r" % (permits,), -7)
        lock = Lock(self, on_lost)
        o, keep = self._options(ttl, wait, auto_renew, on_lost, kind, owner, reentrant, permits,
                                label, lock)
        n = _text(name, "name")
        return self._take(lock, lambda out: lib.dlock_acquire(out, self._ptr(), n, o),
                          o.wait_ms != 0)

    def acquire_multi(self, names: Sequence[Union[str, bytes]], *, ttl: float = 30,
                      wait: Optional[float] = 0, auto_renew: bool = True,
                      on_lost: Optional[Callable[["Lock"], None]] = None,
                      label: Optional[str] = None) -> Lock:
        """Every lock of names, all or none, in one step; one Lock that
        holds them all (its fences per name)."""
        if isinstance(names, (str, bytes)):
            raise InvalidArgument("names must be a list of names, not one name", -7)
        encoded = [_text(n, "name") for n in names]
        lock = Lock(self, on_lost)
        o, keep = self._options(ttl, wait, auto_renew, on_lost, MUTEX, None, False, 0, label,
                                lock)
        bufs = [ffi.new("char[]", n) for n in encoded]  # alive while arr is used
        arr = ffi.new("const char *[]", bufs or [ffi.NULL])
        return self._take(lock, lambda out: lib.dlock_acquire_multi(
            out, self._ptr(), arr, len(bufs), o), o.wait_ms != 0)

    def campaign(self, name: Union[str, bytes], identity: Union[str, bytes], *, ttl: float = 30,
                 wait: Optional[float] = None,
                 on_lost: Optional[Callable[["Lock"], None]] = None) -> "Leader":
        """Stand in the election name as identity; returns the Leader once
        this campaigner leads (wait: None for as long as it takes)."""
        lock = Leader(self, on_lost)
        o, keep = self._options(ttl, wait, True, on_lost, MUTEX, None, False, 0, None, lock)
        n, ident = _text(name, "name"), _text(identity, "identity")
        return self._take(lock, lambda out: lib.dlock_campaign(out, self._ptr(), n, ident, o),
                          o.wait_ms != 0)

    # ---- reading and administering

    def leader(self, name: Union[str, bytes]) -> LeaderInfo:
        """Who leads the election name now (LeaderInfo)."""
        info = ffi.new("dlock_leader_info *")
        _check(lib.dlock_leader(info, self._ptr(), _text(name, "name")))
        return LeaderInfo(info)

    def status(self, name: Union[str, bytes]) -> LockInfo:
        """The lock's state, without taking it (LockInfo)."""
        info = ffi.new("dlock_lock_info *")
        _check(lib.dlock_status(info, self._ptr(), _text(name, "name")))
        return LockInfo(info)

    def set_permits(self, name: Union[str, bytes], permits: int) -> None:
        """Change the number of places of the semaphore name."""
        _check(lib.dlock_semaphore_set_permits(self._ptr(), _text(name, "name"), permits))


def _message():
    return ffi.string(lib.dlock_error_message()).decode("utf-8", "replace")
