/*
 * dlock: distributed locks with fencing tokens.
 *
 * This header is the contract. Every call documents what it promises, the
 * error codes it returns and whether it may be called from several threads.
 *
 * Conventions (after libgit2 and SQLite):
 *   - Functions return int: 0 (DLOCK_OK) on success, a negative DLOCK_E* code
 *     on failure. After a failure, dlock_error_message() gives this thread's
 *     detailed text, naming the cause and the server.
 *   - Output parameters come first. An object you receive through an output
 *     parameter is yours: free it with its _free (or dlock_release) call.
 *     Nothing is freed behind your back on error.
 *   - Input strings are copied; returned const char * are borrowed for the
 *     lifetime of the object they came from.
 *   - Options structs start with a version field; initialise them with their
 *     _INIT macro and then set the fields you need. Passing NULL means "all
 *     defaults".
 *   - Every lease and deadline is measured with CLOCK_MONOTONIC. Wall-clock
 *     time never decides whether a lock is held.
 *
 * What a lease lock can and cannot promise
 * ----------------------------------------
 * A lock here is a lease: it is yours until you release it or until its lease
 * runs out without renewal. A process can stall (a pause, swapping, SIGSTOP)
 * past its lease and resume believing it still holds the lock, and a Redis
 * failover can forget a lock. No client library can prevent that. What makes a
 * correctness-critical section safe is the fencing token: every acquisition
 * returns a number that is strictly greater than any token issued before for
 * the same name, and the protected resource must refuse writes that carry a
 * token lower than the highest it has seen. See docs/fencing.md.
 */
#ifndef DLOCK_DLOCK_H
#define DLOCK_DLOCK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && !defined(DLOCK_STATIC)
#define DLOCK_EXTERN __attribute__((visibility("default")))
#else
#define DLOCK_EXTERN
#endif

#define DLOCK_VERSION_MAJOR 0
#define DLOCK_VERSION_MINOR 1
#define DLOCK_VERSION_PATCH 0
#define DLOCK_VERSION "0.1.0"

/* ------------------------------------------------------------------------
 * Error codes
 *
 * Frozen once released: new codes are only ever appended. The table is an
 * X-macro so the enum and dlock_strerror() can never disagree.
 * ---------------------------------------------------------------------- */
#define DLOCK_ERRNO_MAP(XX)                                                    \
    XX(OK, 0, "success")                                                       \
    XX(EBUSY, -1, "lock is held by another owner")                             \
    XX(ETIMEOUT, -2, "timed out waiting for the lock")                         \
    XX(ELOST, -3, "lock was lost (lease expired or taken over)")               \
    XX(ECONN, -4, "cannot reach the lock server")                              \
    XX(EAUTH, -5, "authentication with the lock server failed")                \
    XX(EPROTO, -6, "unexpected reply from the lock server")                    \
    XX(EINVAL, -7, "invalid argument")                                         \
    XX(ENOMEM, -8, "out of memory")                                            \
    XX(ENOTSUP, -9, "not supported")                                           \
    XX(EMISUSE, -10, "API misuse")                                             \
    XX(ESERVER, -11, "the lock server refused the command")

typedef enum {
#define DLOCK_ERRNO_GEN(name, value, text) DLOCK_##name = (value),
    DLOCK_ERRNO_MAP(DLOCK_ERRNO_GEN)
#undef DLOCK_ERRNO_GEN
} dlock_error_code;

/*
 * The static, English description of an error code ("lock is held by another
 * owner"). Unknown codes give "unknown error". Thread-safe.
 */
DLOCK_EXTERN const char *dlock_strerror(int code);

/*
 * The detailed text of the last failure of a dlock call made by this thread,
 * for example "redis 127.0.0.1:6390: connection refused". Never NULL (empty
 * when there was none). Valid until the next dlock call on this thread. It
 * never contains a password. Thread-safe (the text is thread-local).
 */
DLOCK_EXTERN const char *dlock_error_message(void);

/* The library version as "MAJOR.MINOR.PATCH". */
DLOCK_EXTERN const char *dlock_version(void);

/* ------------------------------------------------------------------------
 * Limits
 * ---------------------------------------------------------------------- */

/* Longest lock name, in bytes. Names are any non-empty byte string without
 * NUL of at most this length. */
#define DLOCK_NAME_MAX 512

/* Longest lease and longest finite wait: 30 days. */
#define DLOCK_LEASE_MAX_MS ((int64_t)30 * 24 * 3600 * 1000)

/* ------------------------------------------------------------------------
 * Client
 * ---------------------------------------------------------------------- */

/*
 * A connection to one lock service. Opaque.
 *
 * Thread-safety: a client may be shared by any number of threads. Each call
 * on it (acquire, status, release of its locks ...) is safe to make
 * concurrently; calls that need the server take turns on the client's command
 * connection, while blocked waiters wait on a separate subscriber connection
 * and do not hold up other callers. The watchdog has a connection of its own,
 * so renewals are never queued behind a caller's command.
 */
typedef struct dlock_client dlock_client;

typedef struct {
    unsigned version;
    /* Time allowed to open a TCP or unix connection. Default 2000 ms. */
    int64_t connect_timeout_ms;
    /* Time allowed for one command's reply. Default 5000 ms. */
    int64_t command_timeout_ms;
    /* Prefix of every key dlock creates. Default "dlock:". Copied. */
    const char *key_prefix;
    /* Connection name shown by the server (Redis CLIENT LIST). Default
     * "dlock". Copied; letters, digits and "-_.:" only. */
    const char *client_name;
} dlock_client_options;

#define DLOCK_CLIENT_OPTIONS_VERSION 1
#define DLOCK_CLIENT_OPTIONS_INIT {DLOCK_CLIENT_OPTIONS_VERSION, 2000, 5000, NULL, NULL}

/*
 * Open a client for the lock service at url. opts NULL means defaults.
 *
 * URLs:
 *   redis://[user:password@]host[:port][/db]     default port 6379, db 0
 *   unix:///path/to/redis.sock[?db=N]
 *   rediss://...    refused with DLOCK_ENOTSUP: this build's hiredis has no
 *                   TLS, and dlock never falls back to clear text.
 * User and password may be percent-encoded.
 *
 * The connection is made and checked (AUTH, SELECT, CLIENT SETNAME) before
 * this returns, so a wrong password or an unreachable server is reported
 * here. Later, a dropped connection is re-established on next use.
 *
 * Returns DLOCK_OK and *out, or:
 *   DLOCK_EINVAL   NULL out/url, malformed URL or options, unknown scheme
 *   DLOCK_ENOTSUP  a scheme this build cannot serve (rediss://)
 *   DLOCK_ECONN    the server cannot be reached within connect_timeout_ms
 *   DLOCK_EAUTH    the server refused the credentials
 *   DLOCK_EPROTO   the server did not answer like a Redis server
 *   DLOCK_ENOMEM
 */
DLOCK_EXTERN int dlock_client_open(dlock_client **out, const char *url,
                                   const dlock_client_options *opts);

/*
 * Close the client's connections, stop its watchdog and free it. NULL is a
 * no-op. Locks still held are not released on the server (their leases run
 * out) but their handles stay valid for dlock_release, which then frees them
 * and returns DLOCK_EMISUSE; the watchdog no longer renews them and never calls
 * their on_lost after this returns. Must not be called while another thread is
 * still inside a call on this client.
 */
DLOCK_EXTERN void dlock_client_free(dlock_client *client);

/* The backend's name ("redis"). Borrowed for the client's lifetime. */
DLOCK_EXTERN const char *dlock_client_backend(const dlock_client *client);

/* ------------------------------------------------------------------------
 * Locks
 * ---------------------------------------------------------------------- */

/*
 * A held lock. Opaque. Created by dlock_acquire, freed by dlock_release.
 *
 * Thread-safety: the accessors (fence, name, lost, valid_ms) may be called
 * from any thread at any time, also while the watchdog renews the lock. The
 * calls that talk to the server (extend, check, release) may be called from
 * any thread but not concurrently on the same lock, and release must be the
 * last call on a handle.
 */
typedef struct dlock_lock dlock_lock;

/* dlock_acquire_options.wait_ms: wait as long as it takes. */
#define DLOCK_WAIT_FOREVER ((int64_t)-1)

/*
 * on_lost reasons: DLOCK_ELOST when the server says the lock is no longer
 * ours (expired, or taken over after a stall), DLOCK_ECONN when the server
 * could not be reached to renew the lease before it ran out.
 */
typedef void (*dlock_lost_cb)(dlock_lock *lock, int reason, void *payload);

typedef struct {
    unsigned version;
    /* 0: try once; > 0: wait up to that long; DLOCK_WAIT_FOREVER. */
    int64_t wait_ms;
    /* The lease. Default 30000 ms; at most DLOCK_LEASE_MAX_MS. */
    int64_t lease_ms;
    /* Default 1: the client's watchdog renews the lease every lease/3 until
     * release. 0: the lease runs out lease_ms after acquisition unless you
     * call dlock_lock_extend. */
    int auto_renew;
    /* Called once, from the watchdog thread, when the lock is found lost:
     * a renewal (or dlock_lock_check / extend) found it gone or owned by
     * another, or the server could not be reached before the lease ran out
     * (then it may come up to command_timeout_ms late, while the renewal
     * times out; dlock_lock_lost() is exact). With auto_renew off it fires
     * when the lease runs out. It must return quickly and must not call
     * dlock_release on the lock (that returns DLOCK_EMISUSE from inside the
     * callback). It is never called after dlock_release or
     * dlock_client_free has returned. */
    dlock_lost_cb on_lost;
    void *payload;
} dlock_acquire_options;

#define DLOCK_ACQUIRE_OPTIONS_VERSION 1
#define DLOCK_ACQUIRE_OPTIONS_INIT {DLOCK_ACQUIRE_OPTIONS_VERSION, 0, 30000, 1, NULL, NULL}

/*
 * Acquire the lock called name. opts NULL means defaults (try once, 30 s
 * lease, auto-renewed).
 *
 * On success *out is a held lock with a fencing token (dlock_lock_fence) that
 * is strictly greater than every token issued before for this name, and the
 * lock is taken and its token issued in one server round trip.
 *
 * Waiting (wait_ms != 0) does not poll: the caller sleeps until the holder
 * releases (the release is announced to waiters) or until the holder's lease
 * runs out, whichever is first, then tries again.
 *
 * Returns DLOCK_OK and *out, or:
 *   DLOCK_EBUSY     held by another owner and wait_ms is 0
 *   DLOCK_ETIMEOUT  still held by another owner after wait_ms
 *   DLOCK_EINVAL    NULL argument, empty name or over DLOCK_NAME_MAX bytes,
 *                   lease_ms <= 0 or over DLOCK_LEASE_MAX_MS, wait_ms < -1
 *                   or over DLOCK_LEASE_MAX_MS, unknown options version.
 *                   Checked before any network call.
 *   DLOCK_ECONN     the server could not be reached
 *   DLOCK_ESERVER   the server refused (out of memory, read-only replica ...)
 *   DLOCK_EPROTO, DLOCK_EAUTH, DLOCK_ENOMEM
 * Thread-safe.
 */
DLOCK_EXTERN int dlock_acquire(dlock_lock **out, dlock_client *client, const char *name,
                               const dlock_acquire_options *opts);

/* The fencing token of a held lock, > 0. Thread-safe, no I/O. */
DLOCK_EXTERN uint64_t dlock_lock_fence(const dlock_lock *lock);

/* The lock's name. Borrowed for the handle's lifetime. */
DLOCK_EXTERN const char *dlock_lock_name(const dlock_lock *lock);

/*
 * Set the lease to lease_ms from now, if the lock is still ours. Also the
 * new renewal period for an auto-renewed lock.
 *
 * Returns DLOCK_OK, DLOCK_ELOST (no longer ours: on_lost fires if set),
 * DLOCK_EINVAL (bad lease), DLOCK_ECONN, DLOCK_ESERVER, DLOCK_EPROTO.
 */
DLOCK_EXTERN int dlock_lock_extend(dlock_lock *lock, int64_t lease_ms);

/*
 * Ask the server whether the lock is still ours. DLOCK_OK if it is,
 * DLOCK_ELOST if not (and the handle is marked lost), or a connection error.
 */
DLOCK_EXTERN int dlock_lock_check(dlock_lock *lock);

/*
 * Local, no I/O: 1 once the lock is known to be lost, because the watchdog
 * or a call found it gone, or because its lease has run out since the last
 * renewal the server confirmed; 0 otherwise. Thread-safe.
 */
DLOCK_EXTERN int dlock_lock_lost(const dlock_lock *lock);

/*
 * Local, no I/O: milliseconds left before the lease, as last confirmed by
 * the server, runs out; 0 when lost. The lease was counted from the moment
 * the confirming request was sent, so this never overestimates. Thread-safe.
 */
DLOCK_EXTERN int64_t dlock_lock_valid_ms(const dlock_lock *lock);

/*
 * Release the lock and free the handle, whatever the result. The key is
 * deleted only if it is still ours (compare-and-delete by owner token), and
 * waiters are told. After this returns the watchdog no longer touches the
 * lock and on_lost is never called. NULL is a no-op returning DLOCK_OK.
 *
 * Returns DLOCK_OK, or
 *   DLOCK_ELOST    the lock was no longer ours; nothing was deleted
 *   DLOCK_ECONN    the server could not be reached; the lease will run out
 *   DLOCK_EMISUSE  called from inside this lock's on_lost (handle not freed)
 *   DLOCK_ESERVER, DLOCK_EPROTO
 */
DLOCK_EXTERN int dlock_release(dlock_lock *lock);

/* ------------------------------------------------------------------------
 * Administration
 * ---------------------------------------------------------------------- */

typedef struct {
    /* 1 if some owner holds the lock now. */
    int held;
    /* The highest fencing token issued for this name so far (0: never). */
    uint64_t fence;
    /* Lease left, in ms, when held; -1 when held with no expiry (a key set
     * by hand); 0 when not held. */
    int64_t ttl_ms;
} dlock_lock_info;

/*
 * Read the state of the lock called name, without taking it.
 * Returns DLOCK_OK, DLOCK_EINVAL, DLOCK_ECONN, DLOCK_EPROTO, DLOCK_ESERVER.
 * Thread-safe.
 */
DLOCK_EXTERN int dlock_status(dlock_lock_info *out, dlock_client *client, const char *name);

/*
 * Break the lock called name whoever holds it, and wake its waiters. For
 * administrators: the holder will find its lock lost. *removed (may be NULL)
 * receives the state just before. The fence counter is kept, so tokens stay
 * increasing. Returns as dlock_status. Thread-safe.
 */
DLOCK_EXTERN int dlock_force_release(dlock_lock_info *removed, dlock_client *client,
                                     const char *name);

/* ------------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------- */

/*
 * Parse a duration: a non-negative integer with an optional unit, "ms", "s"
 * or "m" ("250ms", "30s", "2m"); no unit means seconds. Returns DLOCK_OK and
 * *out_ms, or DLOCK_EINVAL for anything else (empty, negative, fractional,
 * unknown unit, over DLOCK_LEASE_MAX_MS).
 */
DLOCK_EXTERN int dlock_duration_parse(int64_t *out_ms, const char *text);

#ifdef __cplusplus
}
#endif

#endif /* DLOCK_DLOCK_H */
