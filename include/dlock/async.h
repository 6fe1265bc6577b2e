/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The asynchronous API: acquire, release and extend without blocking the
 * calling thread, for programs written around an event loop (libuv,
 * libevent, epoll). After hiredis' async.h and libcurl's multi socket
 * interface: a request is started with a callback, the loop watches one
 * descriptor of the client's (dlock_async_fd) and calls
 * dlock_async_process when it is readable, and every callback runs inside
 * dlock_async_process, on the loop's thread. The adapters in
 * include/dlock/adapters/ do that wiring for libuv and libevent in one call.
 * docs/async.md has the threading rules and an example.
 *
 * How it works, so that costs are no surprise. On Redis (one server, TLS,
 * Sentinel) a try-once acquisition of a plain mutex and a release are sent
 * from the calling thread, the loop's, on the client's shared pipelined
 * connection, and their replies read by dlock_async_process: no thread is
 * involved, and a cycle costs what the blocking one does. The other
 * requests (waits, the lock family, extensions, other backends) run on a
 * few threads of the client's (4 at most, started by the first such
 * request, shared by all), which hand results to the loop through the
 * descriptor. A request that waits for a lock holds no thread while it
 * waits, where its backend announces releases to the client (Redis, its
 * Sentinel and Cluster URLs, Redlock, etcd over gRPC, ZooKeeper,
 * PostgreSQL; MySQL keeps a thread of the client's per waiting request
 * today). So 10,000 requests waiting for Redis locks cost 10,000 small
 * records, not 10,000 threads.
 *
 * A client opened with DLOCK_CLIENT_NO_THREADS (dlock.h) starts no thread
 * at all: renewals, on_lost and every request run inside
 * dlock_async_process, waits poll, and only plain mutexes are served here
 * (DLOCK_ENOTSUP for the rest). docs/async.md, "Without threads".
 *
 * The loop must call dlock_async_process when the descriptor is readable
 * and when dlock_async_timeout_ms says (what it sent itself fails at its
 * command timeout only then), as the adapters do.
 *
 * Threading: the calls of this header are made from one thread at a time
 * per client, the loop's (they are not thread-safe with one another on
 * one client), and never from a signal handler. The blocking calls of
 * dlock.h stay usable from any thread beside them, on the same client, and
 * on locks acquired here: the accessors (fence, valid_ms, lost) at any
 * time, the calls that talk to the server (check, extend, downgrade) as
 * dlock.h allows them, not while an asynchronous call on the same lock is
 * in flight. A lock acquired here is released by dlock_release_async or
 * dlock_release, from the loop's thread.
 */
#ifndef DLOCK_ASYNC_H
#define DLOCK_ASYNC_H

#include "dlock/dlock.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A request in flight. Owned by the library: valid from the call that made
 * it until its callback returns, and freed then. */
typedef struct dlock_request_handle dlock_request_handle;

/*
 * An acquisition's outcome. rc is DLOCK_OK with lock the held lock (yours:
 * release it with dlock_release_async or dlock_release), or an error with
 * lock NULL: what dlock_acquire would return (DLOCK_EBUSY for a try that
 * found it held, DLOCK_ETIMEOUT, DLOCK_ECONN ...), or DLOCK_ECANCELED after
 * dlock_request_cancel or dlock_client_free. dlock_error_message() inside
 * the callback has the detailed text. arg is the caller's.
 */
typedef void (*dlock_acquire_cb)(int rc, dlock_lock *lock, void *arg);

/* A release's or an extension's outcome, as dlock_release or
 * dlock_lock_extend would return it; dlock_error_message() has the text. */
typedef void (*dlock_done_cb)(int rc, void *arg);

/*
 * Start acquiring name as opts says (NULL: the defaults), as dlock_acquire
 * does: a try, and, when opts->wait_ms is not 0 and the lock is busy, a wait
 * for its release, in the same queue and order as a blocking waiter
 * (DLOCK_KIND_FAIR: first come, first served). cb is called once, from
 * dlock_async_process. *out (out may be NULL) is the request, for
 * dlock_request_cancel.
 *
 * opts->on_lost, for a lock acquired here, is called from
 * dlock_async_process on the loop's thread (not from the watchdog's), and
 * may release the lock. It is not called after the lock's release began.
 *
 * Returns DLOCK_OK (cb will be called), or, with cb never called and *out
 * NULL: DLOCK_EINVAL for NULL client or cb, a bad name or bad options (the
 * same checks and messages as dlock_acquire), DLOCK_ENOTSUP for a kind the
 * backend lacks or DLOCK_KIND_LEADER / DLOCK_KIND_MULTI (not served here),
 * DLOCK_EMISUSE once the client is being freed, DLOCK_ENOMEM.
 */
DLOCK_EXTERN int dlock_acquire_async(dlock_request_handle **out, dlock_client *client,
                                     const char *name, const dlock_acquire_options *opts,
                                     dlock_acquire_cb cb, void *arg);

/*
 * Start releasing lock, as dlock_release does (the handle is freed when the
 * release is done, before cb is called: do not use it after this call).
 * Returns DLOCK_OK (cb will be called), or, cb never called: DLOCK_EINVAL
 * for NULL lock or cb, DLOCK_ENOTSUP for a multi-lock or an election's lock
 * (release those with dlock_release), DLOCK_ENOMEM, each with the lock
 * untouched; or what dlock_release returns for a lock whose client was
 * freed: DLOCK_EMISUSE, and the handle is freed (as dlock_release frees
 * it).
 */
DLOCK_EXTERN int dlock_release_async(dlock_request_handle **out, dlock_lock *lock,
                                     dlock_done_cb cb, void *arg);

/* Start extending lock's lease to lease_ms from now, as dlock_lock_extend
 * does. No other call on lock until cb ran. Errors as dlock_release_async's
 * (DLOCK_EMISUSE for a lock whose client was freed, the lock untouched),
 * and DLOCK_EINVAL for lease_ms out of range. */
DLOCK_EXTERN int dlock_extend_async(dlock_request_handle **out, dlock_lock *lock,
                                    int64_t lease_ms, dlock_done_cb cb, void *arg);

/*
 * Stop an acquisition: a waiting one leaves the queue it joined (as one
 * whose wait_ms ran out), and one whose lock was taken but not yet handed
 * to its callback releases it. Its callback is then called once with
 * DLOCK_ECANCELED, from a later dlock_async_process (never from inside this
 * call). Returns DLOCK_OK; DLOCK_EINVAL for NULL; DLOCK_EMISUSE for a
 * release or an extension, which cannot be stopped (their callbacks come as
 * usual). Calling it twice, or once the request was canceled by
 * dlock_client_free, changes nothing (DLOCK_OK).
 */
DLOCK_EXTERN int dlock_request_cancel(dlock_request_handle *req);

/*
 * The descriptor the loop watches for readability (POLLIN / EPOLLIN /
 * UV_READABLE / EV_READ), level-triggered: readable while something waits
 * for dlock_async_process. The client's own (an eventfd): do not read,
 * write or close it. -1 with the message on failure (no descriptor could
 * be made, DLOCK_EMISUSE once the client is being freed). Made by the
 * first call; the same for the client's life.
 */
DLOCK_EXTERN int dlock_async_fd(dlock_client *client);

/* How many ms from now the loop should call dlock_async_process even if
 * the descriptor stays quiet (a request the loop's thread sent itself times
 * out then); -1 when it need not. A request started outside
 * dlock_async_process that makes it earlier turns the descriptor readable,
 * so that a loop that asks again after each dlock_async_process is never
 * late. */
DLOCK_EXTERN int64_t dlock_async_timeout_ms(dlock_client *client);

/*
 * Run the callbacks whose requests are done, and the on_lost of locks
 * acquired here, on this thread. Returns the number of callbacks run, or a
 * negative code: DLOCK_EINVAL for NULL, DLOCK_EMISUSE when called from
 * inside one of its own callbacks. A callback may start and cancel
 * requests, and free the client: dlock_client_free from a callback ends
 * this call once the callback returns (the requests still in flight get
 * DLOCK_ECANCELED first), and the client is gone when it returns.
 */
DLOCK_EXTERN int dlock_async_process(dlock_client *client);

/*
 * For an adapter: cb(arg) is called once by dlock_client_free, after the
 * last callback ran and before the descriptor is closed, so that the loop
 * stops watching it. One hook per client: DLOCK_EMISUSE when one is set
 * already (the client is attached to a loop); NULL cb removes it.
 * DLOCK_EINVAL for NULL client.
 */
typedef void (*dlock_async_detach_cb)(void *arg);
DLOCK_EXTERN int dlock_async_set_detach(dlock_client *client, dlock_async_detach_cb cb,
                                        void *arg);

#ifdef __cplusplus
}
#endif

#endif
