/* SPDX-License-Identifier: BSD-3-Clause */
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
 *   - Every lease and deadline is measured with CLOCK_BOOTTIME, which keeps
 *     counting while the host is suspended, as the server's clock does.
 *     Wall-clock time never decides whether a lock is held.
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

/* DLOCK_VERSION, DLOCK_VERSION_NUMBER and DLOCK_VERSION_AT_LEAST, generated
 * from the build's project(VERSION). */
#include "dlock/version.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && !defined(DLOCK_STATIC)
#define DLOCK_EXTERN __attribute__((visibility("default")))
#else
#define DLOCK_EXTERN
#endif


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
    XX(ESERVER, -11, "the lock server refused the command")                   \
    XX(EINTR, -12, "interrupted by dlock_client_interrupt")                    \
    XX(ECANCELED, -13, "the request was canceled")

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
 * never contains a password, nor a control character (bytes below 0x20 and
 * 0x7f, as a hostile server may send in its error text, are shown as '?'):
 * it is safe to print. Thread-safe (the text is thread-local).
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

/* Longest owner id (dlock_acquire_options.owner), in bytes. */
#define DLOCK_OWNER_MAX 128

/* Length of an owner id made by dlock_owner_generate (128 random bits in
 * hex); its buffer needs one more byte for the NUL. */
#define DLOCK_OWNER_GENERATED_LEN 32

/* Longest leader identity (dlock_campaign), in bytes. */
#define DLOCK_IDENTITY_MAX 256

/* Longest holder label (dlock_acquire_options.label), in bytes. */
#define DLOCK_LABEL_MAX 128

/* Longest host name a holder records (dlock_lock_info.host), in bytes. */
#define DLOCK_HOST_MAX 255

/* Most names in one dlock_acquire_multi. */
#define DLOCK_MULTI_MAX 64

/* Most permits of a semaphore. */
#define DLOCK_PERMITS_MAX 1000000

/* ------------------------------------------------------------------------
 * Client
 * ---------------------------------------------------------------------- */

/*
 * A connection to one lock service. Opaque.
 *
 * Thread-safety: a client may be shared by any number of threads. Each call
 * on it (acquire, status, release of its locks ...) is safe to make
 * concurrently. On Redis (one server, TLS or not, Sentinel's master, and
 * each master of a cluster), the acquisitions and releases of all threads
 * share one command connection to the server, pipelined: each call's
 * command goes out at once, behind the others', and the replies come back
 * in order, so concurrent calls do not queue for a connection; the other
 * calls (status, list) share up to 4 command connections, each opened when
 * overlapping calls first need it. On etcd, each concurrent call takes an HTTP connection from
 * a pool. Blocked waiters wait on a separate subscriber connection (Redis)
 * or watch (etcd) and do not hold up other callers. The watchdog has a
 * connection of its own, so renewals are never queued behind a caller's
 * command.
 */
typedef struct dlock_client dlock_client;

/* Log levels (dlock_client_options.log and log_level). */
#define DLOCK_LOG_DEBUG 0
#define DLOCK_LOG_INFO 1
#define DLOCK_LOG_WARN 2
#define DLOCK_LOG_ERROR 3

/*
 * The client's log callback (dlock_client_options.log): level is one of
 * DLOCK_LOG_*, message one line of text without a newline, naming the lock
 * or the server (never a password, nor a control character), borrowed for
 * the call. Called from whichever thread met the event, the watchdog's
 * included, possibly while the library holds internal locks: it must
 * return quickly and must not call into dlock. Events:
 *   DLOCK_LOG_WARN   a renewal could not reach the server (it is retried
 *                    until the lease runs out)
 *   DLOCK_LOG_ERROR  a lock was lost (before its on_lost is called)
 *   DLOCK_LOG_INFO   (Redis) a connection to the server was made again
 *                    after it broke; a waiter was handed the lock by the
 *                    holder's release
 *   DLOCK_LOG_DEBUG  every call to the server, when it ends: what it was
 *                    for, its outcome and how long it took ("acquire
 *                    'payout': busy in 0.42 ms"); only with log_level
 *                    DLOCK_LOG_DEBUG
 */
typedef void (*dlock_log_cb)(int level, const char *message, void *payload);

/* Phases of a traced call (dlock_trace_event.phase). */
#define DLOCK_TRACE_BEGIN 0
#define DLOCK_TRACE_END 1

/*
 * One call from the client to the lock service, for a tracer
 * (dlock_client_options.trace): a span's start and end, so that a program
 * can feed OpenTelemetry or its own tracer without dlock linking either.
 * Every call is traced once as BEGIN just before it is sent and once as
 * END when it returns, on the same thread, with the same id.
 */
typedef struct {
    int phase;         /* DLOCK_TRACE_BEGIN or DLOCK_TRACE_END */
    uint64_t id;       /* pairs a BEGIN with its END; unique in a client */
    /* What the call does: "acquire" (one try; a waiting acquisition makes
     * several), "release", "extend", "check", "renew" (a batch of the
     * watchdog's), "status", "force_release", "downgrade", "set_permits",
     * "leader_get", "multi_acquire" (one try of a multi-lock), "list",
     * "holders". A static string. */
    const char *call;
    /* The lock's name (borrowed for the callback), or NULL for a call on
     * many (a renewal batch, a multi-lock's try, list). */
    const char *name;
    size_t count;        /* locks the call is for: 1, or a batch's size */
    int64_t duration_us; /* END: microseconds since its BEGIN; 0 at BEGIN */
    /* END: DLOCK_OK, or the call's error (DLOCK_EBUSY for a try that found
     * the lock held; a renewal batch's DLOCK_OK may hold locks found lost);
     * 0 at BEGIN. */
    int result;
} dlock_trace_event;

/*
 * The client's trace hook. Called on the thread that makes the call (the
 * watchdog's for renewals), never while the library holds a lock of its
 * own: it may take its own locks, but must not call into dlock with the
 * same client, and should return quickly: the call waits for it.
 */
typedef void (*dlock_trace_cb)(const dlock_trace_event *ev, void *payload);

typedef struct {
    unsigned version;
    /* Time allowed to open a TCP or unix connection. Default 2000 ms. */
    int64_t connect_timeout_ms;
    /* Time allowed for one command's reply. Default 5000 ms. */
    int64_t command_timeout_ms;
    /* Prefix of every key dlock creates. Default "dlock:" (etcd: "dlock/").
     * Copied. */
    const char *key_prefix;
    /* Connection name shown by the server (Redis CLIENT LIST; etcd: the
     * first word of the lock keys' value, before the holder record, and part
     * of the User-Agent). Default "dlock".
     * Copied; letters, digits and "-_.:" only. */
    const char *client_name;

    /* ---- Version 2 ---- */

    /* Called for renew failures, reconnections, hand-offs and losses (see
     * dlock_log_cb), with log_payload. NULL (default): nothing is logged. */
    dlock_log_cb log;
    void *log_payload;

    /* ---- Version 3 ---- */

    /* The lowest level passed to log. Default DLOCK_LOG_INFO;
     * DLOCK_LOG_DEBUG adds a line per call to the server. */
    int log_level;
    /* Called at the start and end of every call to the server (see
     * dlock_trace_cb), with trace_payload. NULL (default): none. */
    dlock_trace_cb trace;
    void *trace_payload;

    /* ---- Version 4 ---- */

    /* DLOCK_CLIENT_* bits. Default 0. */
    unsigned flags;
} dlock_client_options;

/*
 * flags: the client starts no thread of its own, for a program built
 * around one event loop (include/dlock/async.h): no watchdog thread, no
 * subscriber, no worker. Renewals, on_lost and every request of the
 * asynchronous API run inside dlock_async_process, which the loop must then
 * call whenever dlock_async_fd is readable and dlock_async_timeout_ms says,
 * as long as it holds a lock (a lock is renewed only then). A wait polls
 * the server (no announcement of releases without a subscriber); the
 * blocking calls of this header keep working on the calling thread.
 * Served by Redis on one server, TLS or Sentinel, for plain mutexes
 * (no kind, no owner); dlock_client_open answers DLOCK_ENOTSUP on the
 * other backends and URLs (Cluster, min_replicas), and dlock_acquire_async
 * for the other kinds. docs/async.md has the details.
 */
#define DLOCK_CLIENT_NO_THREADS 1u

#define DLOCK_CLIENT_OPTIONS_VERSION 4
#define DLOCK_CLIENT_OPTIONS_INIT                                                                 \
    {DLOCK_CLIENT_OPTIONS_VERSION, 2000, 5000, NULL, NULL, NULL, NULL, DLOCK_LOG_INFO, NULL,   \
     NULL, 0}

/*
 * The URL schemes this library knows, one by one: i from 0 until NULL.
 * First the built-in backends' (redis, unix, rediss, redis-sentinel, ...,
 * etcd, etcds, redlock), each as its backend's table lists it; then those
 * of the backend modules dlock ships (zk, postgres, postgresql, mysql,
 * mariadb), with DLOCK_SCHEME_MODULE in *flags, and DLOCK_SCHEME_NOT_INSTALLED
 * too when the module is not where dlock_client_open would look for it;
 * then those a program registered (dlock_backend_register), with
 * DLOCK_SCHEME_REGISTERED. flags may be NULL. The string is borrowed for
 * the life of the process; an index keeps its scheme (registrations are
 * appended). Thread-safe; no I/O but a file-existence check per module.
 */
#define DLOCK_SCHEME_MODULE 1u
#define DLOCK_SCHEME_NOT_INSTALLED 2u
#define DLOCK_SCHEME_REGISTERED 4u
DLOCK_EXTERN const char *dlock_scheme(size_t i, unsigned *flags);

/*
 * Fill opts with the defaults of options version (1..DLOCK_CLIENT_OPTIONS_VERSION),
 * as DLOCK_CLIENT_OPTIONS_INIT does: for callers that cannot use C macros.
 * Every options struct is read as the version in its first field says, so
 * a program built against an older header keeps working; fields added
 * since keep their defaults. DLOCK_EINVAL for NULL or an unknown version.
 * Thread-safe.
 */
DLOCK_EXTERN int dlock_client_options_init(dlock_client_options *opts, unsigned version);

/*
 * Open a client for the lock service at url. opts NULL means defaults.
 *
 * URLs (dlock_scheme lists the schemes this library knows):
 *   redis://[user:password@]host[:port][/db]     default port 6379, db 0
 *   unix:///path/to/redis.sock[?db=N]
 *   rediss://host[:port][/db]?cacert=FILE[&cert=FILE&key=FILE][&sni=NAME]
 *                   Redis over TLS, certificate and host name verified
 *                   (docs/redis-tls.md); never a fall-back to clear text
 *   redis-sentinel://[user:password@]s1:p1,...,sN:pN/MASTERNAME[?...]
 *   rediss-sentinel://...   the master found through Sentinel, failover
 *                   followed (docs/redis-sentinel.md); rediss-: over TLS
 *   redis-cluster://[user:password@]h1:p1,h2:p2,...[?min_replicas=N]
 *   rediss-cluster://...    Redis Cluster, slots followed
 *                   (docs/redis-cluster.md); rediss-: over TLS
 *   etcd://[user:password@]host[:port][,host[:port]...]   etcd v3, default
 *                   port 2379; the next endpoint is tried when one fails
 *   etcds://...[?cacert=FILE][&cert=FILE&key=FILE]   the same over https
 *                   (docs/etcd.md; key_prefix defaults to "dlock/" there)
 *   etcd and etcds also take:
 *     proxy=URL     the only proxy used (http_proxy, https_proxy and
 *                   ALL_PROXY are ignored); no user:password@ in it
 *     insecure_auth=1   allows user:password@ on plain etcd://, which is
 *                   otherwise DLOCK_EINVAL (the password would travel in
 *                   clear text)
 *   redlock://[user:password@]h1:p1,h2:p2,...,hN:pN[/db][?drift_ms=M&node_timeout_ms=T&io=I]
 *                   Redlock over N independent Redis masters, N odd, 3 to
 *                   15 (docs/redlock.md): held on a majority, with a fence
 *                   that increases across holders; the mutex, with owner
 *                   ids and reentrancy (other kinds are DLOCK_ENOTSUP).
 *                   drift_ms: the clock-drift
 *                   margin (default lease / 100 + 2 ms); node_timeout_ms:
 *                   how long a node may take (default lease / 10, at least
 *                   5 ms, at most the command timeout); io: how a round
 *                   waits for the nodes, auto (default: io_uring where the
 *                   kernel allows it, else poll), poll, or io_uring
 *                   (DLOCK_ENOTSUP from open when it cannot be had; not
 *                   with tls=1, which reads through OpenSSL with poll)
 * Served by backend modules (loaded by scheme the first time; DLOCK_EINVAL
 * naming the module and where it was looked for when it is not installed):
 *   zk://[user:password@]h1:p1,...[/chroot][?session_timeout_ms=T&acl=...]
 *                   ZooKeeper, Curator's recipes (docs/zookeeper.md)
 *   postgres://user:password@host[:port]/db[?mode=lease|advisory&...]
 *   postgresql://...        PostgreSQL (docs/postgres.md)
 *   mysql://user:password@host[:port]/db[?mode=lease|named&...]
 *   mariadb://...           MySQL or MariaDB (docs/mysql.md)
 * User and password may be percent-encoded.
 *
 * The connection is made and checked (AUTH, SELECT, CLIENT SETNAME) before
 * this returns, so a wrong password or an unreachable server is reported
 * here. Later, a dropped connection is re-established on next use.
 *
 * In a set-user-ID (AT_SECURE) process, the first call removes from the
 * environment, before any backend library reads it, each variable such a
 * library would trust (LIBMYSQL_*, MARIADB_*, MYSQL_*, PG*, SSLKEYLOGFILE;
 * docs/cli.md), with a DLOCK_LOG_WARN line for each: call it before other
 * threads read the environment.
 *
 * Returns DLOCK_OK and *out, or:
 *   DLOCK_EINVAL   NULL out/url, malformed URL or options, unknown scheme
 *                  (the message lists the known ones), a module that
 *                  cannot be loaded
 *   DLOCK_ENOTSUP  what this build or host cannot do (redlock's io=io_uring)
 *   DLOCK_ECONN    the server cannot be reached within connect_timeout_ms
 *   DLOCK_EAUTH    the server refused the credentials
 *   DLOCK_EPROTO   the server did not answer as its backend's protocol says
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

/*
 * Stop all waiting on this client, for good: every call that waits for a
 * lock (dlock_acquire and dlock_acquire_multi with wait_ms != 0,
 * dlock_campaign) returns DLOCK_EINTR instead of waiting, now and for the
 * rest of the client's life. A call waiting now leaves whatever queue it
 * joined, as one whose wait_ms ran out does (Redis: a waiter gives up its
 * place in the hand-off slot, and passes on a lock handed to it meanwhile;
 * etcd: its queue key is deleted; the lock family: its place in a queue,
 * its writer's block), and returns within a round trip or two, without a
 * lock. A call still makes its first try: one that takes the lock before it
 * sees the interruption returns DLOCK_OK as usual (release the lock). Tries
 * (wait_ms 0), releases and the other calls work as before.
 *
 * Meant for a program that is shutting down and must not leave a waiter
 * behind that is gone: one that died in the queue could be handed the lock
 * and keep it from the live ones. dlock's CLI calls it on SIGTERM or ^C
 * while it waits.
 *
 * Async-signal-safe: it may be called from a signal handler (it only sets
 * a flag and writes a byte to a pipe, which a thread of the client's,
 * started by the first call that waits, reads to wake the waiters), and
 * from any thread. NULL is a no-op. Thread-safe.
 */
DLOCK_EXTERN void dlock_client_interrupt(dlock_client *client);

/* The backend's name ("redis", "etcd"). Borrowed for the client's lifetime. */
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

/*
 * Lock kinds (dlock_acquire_options.kind; docs/family.md). Every kind gives
 * a dlock_lock handle with a fencing token, renewed by the client's watchdog
 * under the same on_lost contract, released by dlock_release, and woken by
 * the server when it may be had (pub/sub), not by polling. Fences of all
 * kinds of one name come from one counter: strictly increasing across
 * kinds, holders and permits.
 *
 * Use one name with one kind. The kinds keep different state under the
 * name, and mixing them on one name is not supported (the outcome is
 * unspecified, but it never touches other names).
 *
 * A backend that does not implement a kind refuses it with DLOCK_ENOTSUP
 * (the Redis backend implements them all).
 *
 * DLOCK_KIND_MUTEX  (the default) one holder at a time. With an owner id
 *     and reentrant (see the options), the owner may take it again.
 *
 * DLOCK_KIND_FAIR  one holder at a time; waiters get the lock in the order
 *     they began to wait (FIFO), and a try (wait_ms 0) succeeds only when
 *     nobody waits. Each waiter has a place in a queue on the server with
 *     an expiry in server time, W = min(max(lease_ms, 1 s), 30 s) after its
 *     last refresh; a waiting caller refreshes it every W/3. So a waiter
 *     that dies leaves the queue at most W after its last refresh, by the
 *     server's clock, not the clients'; one whose wait_ms runs out leaves
 *     at once. A release wakes only the waiter at the head of the queue.
 *     Reentrant with an owner id like MUTEX (a re-entry skips the queue).
 *
 * DLOCK_KIND_READ, DLOCK_KIND_WRITE  the two sides of a read-write lock:
 *     any number of readers, or one writer. Each reader holds its own lease
 *     (server time), so a crashed reader holds the lock for its own lease
 *     only, whatever the other readers do.
 *     Policy, writer preference: a writer that waits blocks new readers.
 *     Readers that hold the lock keep it until they release or their
 *     leases end; new readers wait; the writer gets the lock when the last
 *     reader is gone. So a stream of readers cannot starve a writer (a
 *     stream of writers can delay readers). A waiting writer's block is a
 *     marker with an expiry of W (as for FAIR) in server time, refreshed
 *     while it waits and dropped when it gives up, so a writer that dies
 *     blocks readers for W at most. A reader whose owner id already holds a
 *     read lock on the name is not held back (a nested read never waits
 *     for a writer that waits for it).
 *     Downgrade, write to read: dlock_lock_downgrade. Upgrade, read to
 *     write, is refused: a WRITE acquisition whose owner id holds a read
 *     lock on the name, and a READ acquisition whose owner id holds the
 *     write lock, fail at once with DLOCK_EMISUSE, whatever wait_ms says.
 *     Without owner ids dlock cannot tell that two acquisitions come from
 *     the same owner: a writer waits for every reader, its own included
 *     (until wait_ms). Release the read lock first, or use owner ids.
 *
 * DLOCK_KIND_SEMAPHORE  one of N permits. Each permit is a lease of its
 *     own, with its own fence, renewed by the watchdog; a holder that
 *     crashes gives its permit back when its lease ends (server time). N is
 *     kept on the server: the first acquisition sets it from
 *     options.permits (required then), later acquisitions use the stored N
 *     and ignore theirs, and dlock_semaphore_set_permits changes it at any
 *     time (the last call wins). N is forgotten after a day in which nobody
 *     acquired a permit (10 leases if longer); the next acquisition's
 *     permits then sets it again.
 *
 * DLOCK_KIND_LEADER  a handle from dlock_campaign (not for dlock_acquire).
 * DLOCK_KIND_MULTI   a handle from dlock_acquire_multi (not for dlock_acquire).
 */
#define DLOCK_KIND_MUTEX 0
#define DLOCK_KIND_FAIR 1
#define DLOCK_KIND_READ 2
#define DLOCK_KIND_WRITE 3
#define DLOCK_KIND_SEMAPHORE 4
#define DLOCK_KIND_LEADER 5
#define DLOCK_KIND_MULTI 6

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

    /* ---- The lock family (see the kinds above). The defaults (0, NULL)
     * give the plain mutex. ---- */

    /* DLOCK_KIND_MUTEX (default), _FAIR, _READ, _WRITE or _SEMAPHORE. */
    int kind;
    /* The owner id: who holds the lock, for reentrancy and to refuse a
     * read-write upgrade at once. NULL (default): every acquisition is an
     * owner of its own. Else 1..DLOCK_OWNER_MAX bytes, any but NUL, copied.
     * It is the caller's choice, not the thread id, so one owner may span
     * threads, callbacks and thread pools. Whoever knows an owner id can
     * re-enter the lock as that owner: when parties you do not trust share
     * the server, make it unguessable (dlock_owner_generate). For MUTEX,
     * FAIR, READ and WRITE; DLOCK_EINVAL for SEMAPHORE. */
    const char *owner;
    /* 1 (MUTEX and FAIR, with an owner id): an owner that already holds the
     * lock takes it again at once, without waiting or queueing, and gets a
     * new handle with the same fence. The lock is freed on the server when
     * the owner's last handle is released. The holds share one lease, which
     * every live handle renews: it is the longest any of them asked for.
     * Holds are counted per handle: a handle whose hold ended (lease ran
     * out, force release) is lost, even if the same owner took the lock
     * again since. 0 (default): an owner that already holds the lock gets
     * DLOCK_EMISUSE at once rather than waiting for itself. */
    int reentrant;
    /* SEMAPHORE: the number of permits N, 1..DLOCK_PERMITS_MAX, used when
     * the server has none for this name yet (see DLOCK_KIND_SEMAPHORE); 0
     * (default) uses the server's N and fails with DLOCK_EINVAL if it has
     * none. Must be 0 for the other kinds. */
    int permits;

    /* ---- Version 2 ---- */

    /* A label for the holder, shown by dlock_status and dlock_list beside
     * its host, pid and start time (dlock_lock_info): what the holder does
     * ("nightly backup"). NULL (default): none. Else 1..DLOCK_LABEL_MAX
     * bytes of printable ASCII (0x20..0x7e), copied. Anyone who can read
     * the server's keys can read it: no secrets. */
    const char *label;
} dlock_acquire_options;

#define DLOCK_ACQUIRE_OPTIONS_VERSION 2
#define DLOCK_ACQUIRE_OPTIONS_INIT                                                                 \
    {DLOCK_ACQUIRE_OPTIONS_VERSION, 0, 30000, 1, NULL, NULL, DLOCK_KIND_MUTEX, NULL, 0, 0, NULL}

/* As dlock_client_options_init, for acquire options (DLOCK_ACQUIRE_OPTIONS_INIT). */
DLOCK_EXTERN int dlock_acquire_options_init(dlock_acquire_options *opts, unsigned version);

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
 * On Redis, a waiting plain mutex is also handed over: one waiter holds the
 * lock's hand-off slot, and the holder's release gives the lock (and the next
 * fence) to that waiter in the same script, for a confirm window of 2 s (or
 * the waiter's lease, if shorter). That waiter keeps a blocking pop of a
 * list of its own outstanding, and the release pushes the fence there: the
 * waiter holds the lock as the pop returns, in one trip from the server,
 * for the window counted from a moment before the release (the send of its
 * last pop answered empty), and the watchdog extends it to the full lease
 * at once (on a cluster, from the master of the lock's slot). Where it
 * cannot pop (an ACL without RPUSH or BLPOP, min_replicas, four waiters of
 * the client popping already, a slot that moved), or a lock
 * without auto_renew has a lease longer than the window, the release's
 * message wakes the waiter, whose next try finds its own token in the key
 * and renews it to its full lease: one round trip more. Nobody else can
 * take the lock in between. What is guaranteed: a successful acquisition
 * always holds the lock for its lease_ms (or, when handed over with
 * auto_renew, for the window while the watchdog extends it), counted from
 * when the try that won or confirmed the lock, or the pop that bounds the
 * grant, was sent; a waiter that stalled past the confirm window (or whose
 * wake-up was lost) finds the lock gone or taken and goes on waiting, it
 * never holds a lock the server has let go. Such a waiter tries again at least every
 * lease_ms / 4 to keep its place (which lapses after lease_ms / 2 + 100 ms
 * without a try). A waiter that dies in the slot keeps the lock from the
 * others for the confirm window at most, whatever its lease.
 *
 * A try whose outcome is unknown (a timeout or a dropped connection after
 * the request was sent) is cleaned up before the call returns, as far as
 * the server can be reached: a lock or a place it may have taken is given
 * back by owner token, so a failed acquisition leaves nothing held.
 *
 * On etcd, waiters queue in order, each with a key of its own; while it
 * waits, that key lives on a lease of 3 s (or lease_ms, if shorter) which
 * the waiter keeps alive, and it moves to a lease of lease_ms when the
 * waiter gets the lock. So a waiter that dies holds up the queue for 3 s at
 * most, whatever its lease_ms (docs/etcd.md).
 *
 * The kind, owner id and reentrancy come from the options (see the lock
 * kinds above); each successful call gives a handle of its own, also when
 * a reentrant owner takes a lock it holds.
 *
 * Returns DLOCK_OK and *out, or:
 *   DLOCK_EBUSY     held by another owner and wait_ms is 0
 *   DLOCK_ETIMEOUT  still held by another owner after wait_ms
 *   DLOCK_EMISUSE   the owner id already holds the lock and reentrant is 0,
 *                   or a read-write upgrade (see DLOCK_KIND_READ); at once
 *   DLOCK_EINVAL    NULL argument, empty name or over DLOCK_NAME_MAX bytes,
 *                   lease_ms <= 0 or over DLOCK_LEASE_MAX_MS, wait_ms < -1
 *                   or over DLOCK_LEASE_MAX_MS, unknown options version,
 *                   unknown kind, an owner id that is empty or too long,
 *                   reentrant without an owner id or for a kind that has
 *                   none, permits out of range or given for another kind
 *                   than SEMAPHORE. Checked before any network call. Also
 *                   a SEMAPHORE acquisition with permits 0 when the server
 *                   has no N for the name.
 *   DLOCK_ENOTSUP   a kind the client's backend does not implement
 *   DLOCK_EINTR     dlock_client_interrupt was called while it waited
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
 * The holder record this acquisition stored with the lock, "HOST PID
 * START_MS[ LABEL]" (the host name, the process id, the wall-clock time of
 * the acquisition in ms since the Unix epoch, the label if one was given):
 * what dlock_status reads back into dlock_lock_info's host, pid, start_ms
 * and label. NULL for NULL. Borrowed for the handle's lifetime.
 * Thread-safe, no I/O.
 */
DLOCK_EXTERN const char *dlock_lock_holder(const dlock_lock *lock);

/*
 * Set the lease to lease_ms from now, if the lock is still ours. Also the
 * new renewal period for an auto-renewed lock. (Family: a reentrant hold
 * never shortens the lease its owner's other holds share; a reader or a
 * permit extends its own lease only; a multi-lock extends all its locks.)
 *
 * The watchdog does not renew the lock while the call runs, so a renewal
 * with the old lease never lands after the new one.
 *
 * Returns DLOCK_OK, DLOCK_ELOST (no longer ours: on_lost fires if set),
 * DLOCK_EINVAL (bad lease), DLOCK_ECONN, DLOCK_ESERVER, DLOCK_EPROTO. After
 * a failure whose outcome is unknown (DLOCK_ECONN, a timeout), the server
 * may have applied the new lease or not: dlock_lock_valid_ms() is then the
 * smaller of the two, and the lease renewed after stays the old one.
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
 * renewal the server confirmed; 0 otherwise. Thread-safe. Once 1, it stays
 * 1 for the watchdog's renewals: one answered after the lease ran out
 * marks the lock lost (with its on_lost) instead of reviving it.
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
 * waiters are told. For the other kinds: a reentrant hold frees the lock
 * when it was its owner's last; a reader, a permit or a leader gives back
 * just its own share; a multi-lock releases all its locks. After this returns the watchdog no longer touches the
 * lock and on_lost is never called. NULL is a no-op returning DLOCK_OK.
 *
 * The release is sent even when the lock is known lost, so that a key still
 * ours on the server is deleted all the same. But the result reports the
 * loss, whatever the server answered, when the lock was known lost
 * (on_lost, a call that found it gone) or when its lease had run out by the
 * handle's own deadline (dlock_lock_valid_ms() was 0) at the time of the
 * call: the holder may then have worked while another held the lock.
 *
 * Returns DLOCK_OK, or
 *   DLOCK_ELOST    the lock was lost or its lease had run out (see above);
 *                  or it was no longer ours on the server, and nothing was
 *                  deleted
 *   DLOCK_ECONN    the server could not be reached; the lease will run out
 *   DLOCK_EMISUSE  called from inside this lock's on_lost (handle not freed)
 *   DLOCK_ESERVER, DLOCK_EPROTO
 */
DLOCK_EXTERN int dlock_release(dlock_lock *lock);

/* ------------------------------------------------------------------------
 * The lock family: calls beside dlock_acquire (docs/family.md)
 * ---------------------------------------------------------------------- */

/* The kind of a held lock (DLOCK_KIND_*), -1 for NULL. A write lock that
 * was downgraded reports DLOCK_KIND_READ. Thread-safe, no I/O. */
DLOCK_EXTERN int dlock_lock_kind(const dlock_lock *lock);

/*
 * Write a fresh owner id to out: DLOCK_OWNER_GENERATED_LEN hex digits (128
 * bits from the kernel's CSPRNG) and a NUL, so size must be at least
 * DLOCK_OWNER_GENERATED_LEN + 1. Use it where an owner id must not be
 * guessable. Returns DLOCK_OK, DLOCK_EINVAL (NULL or too small), or
 * DLOCK_ENOTSUP when the kernel has no random source. Thread-safe.
 */
DLOCK_EXTERN int dlock_owner_generate(char *out, size_t size);

/*
 * Turn a held write lock (DLOCK_KIND_WRITE) into a read lock, in place:
 * one atomic step on the server, so no other writer can come in between.
 * The handle keeps its fence and lease and becomes DLOCK_KIND_READ; readers
 * waiting for the writer are woken. (The other way, upgrade, is refused:
 * see DLOCK_KIND_READ.) Not concurrently with another call on the same
 * handle that talks to the server.
 *
 * Returns DLOCK_OK, DLOCK_EMISUSE (not a write lock), DLOCK_ELOST (no
 * longer ours: on_lost fires if set), DLOCK_EINVAL (NULL), DLOCK_ECONN,
 * DLOCK_ESERVER, DLOCK_EPROTO, DLOCK_ENOTSUP.
 */
DLOCK_EXTERN int dlock_lock_downgrade(dlock_lock *lock);

/*
 * Set the number of permits of the semaphore called name to permits
 * (1..DLOCK_PERMITS_MAX), now and for later acquisitions, and wake its
 * waiters. Lowering it takes no permit away: holders keep theirs until they
 * release, and new permits are granted while fewer than N are held. The
 * last call wins; see DLOCK_KIND_SEMAPHORE for how long N is kept.
 * Returns DLOCK_OK, DLOCK_EINVAL, DLOCK_ENOTSUP, DLOCK_ECONN, DLOCK_ESERVER,
 * DLOCK_EPROTO. Thread-safe.
 */
DLOCK_EXTERN int dlock_semaphore_set_permits(dlock_client *client, const char *name,
                                             int permits);

/*
 * Acquire the n locks names[0..n-1] all or nothing, as one handle. They are
 * plain mutexes (opts->kind DLOCK_KIND_MUTEX, no owner id): each name is
 * the same lock dlock_acquire takes.
 *
 * When all the names are in one Redis hash slot (they share a hash tag: a
 * common "{tag}" at the start of each name), one script takes them all at
 * once or none; a waiter sleeps until a release of the name that was busy
 * and tries again. Otherwise they are taken one at a time in one global
 * order, the names sorted by their bytes, each waited for within what is
 * left of wait_ms; if one cannot be had, those already taken are released
 * before the call returns. Since every caller takes the names in the same
 * order, callers locking {a,b} and {b,a} never deadlock (a multi-lock
 * waits only for names above those it holds, so no cycle can form).
 *
 * The handle: dlock_lock_count gives n; dlock_lock_name_at and
 * dlock_lock_fence_at give each name and its own fence, in the order of
 * names (each fence is that name's own, strictly increasing per name);
 * dlock_lock_name and dlock_lock_fence give those of names[0]. Every lock
 * is renewed by the watchdog; on_lost fires once, with the multi handle,
 * when any of them is lost, and dlock_lock_lost tells the same. extend,
 * check and release act on all of them (check: DLOCK_ELOST if any is
 * lost; release: every lock is released, and the first failure returned).
 *
 * Returns DLOCK_OK and *out, or DLOCK_EBUSY / DLOCK_ETIMEOUT with a message
 * naming the first name that could not be had, DLOCK_EINVAL (NULL names, n
 * of 0 or over DLOCK_MULTI_MAX, a bad or repeated name, options as for
 * dlock_acquire or with a kind, owner id or permits set), DLOCK_ENOTSUP,
 * DLOCK_EINTR (dlock_client_interrupt; the locks taken so far are released)
 * and the connection errors of dlock_acquire. Thread-safe.
 */
DLOCK_EXTERN int dlock_acquire_multi(dlock_lock **out, dlock_client *client,
                                     const char *const *names, size_t n,
                                     const dlock_acquire_options *opts);

/* How many locks the handle holds: n for a multi-lock, else 1 (0 for
 * NULL). Thread-safe, no I/O. */
DLOCK_EXTERN size_t dlock_lock_count(const dlock_lock *lock);

/* The name and fence of lock i (0 <= i < dlock_lock_count) of a handle, in
 * the order given to dlock_acquire_multi; for another handle i = 0 is its
 * name and fence. NULL / 0 when i is out of range. Thread-safe, no I/O. */
DLOCK_EXTERN const char *dlock_lock_name_at(const dlock_lock *lock, size_t i);
DLOCK_EXTERN uint64_t dlock_lock_fence_at(const dlock_lock *lock, size_t i);

/* ---- Leader election ---- */

/*
 * Campaign to lead the election called name: block until this caller is
 * the leader, then return its handle (DLOCK_KIND_LEADER), whose fence is
 * strictly greater than that of every leader before. Leadership is a lock
 * on name: the watchdog renews it, on_lost says when it is lost, and
 * dlock_resign (or dlock_release) ends it. Observers (dlock_observe) see
 * identity while this caller leads.
 *
 * identity: what observers see, 1..DLOCK_IDENTITY_MAX bytes (copied); NULL
 * means "HOSTNAME:PID". opts NULL means: wait forever, 30 s lease,
 * auto-renewed. With opts, wait_ms applies as for dlock_acquire (0: try
 * once), and kind, owner, reentrant and permits must be left at 0.
 *
 * Waiting candidates are woken when the leader resigns; when a leader dies
 * they take over once its lease has run out.
 *
 * Returns as dlock_acquire (DLOCK_EBUSY / DLOCK_ETIMEOUT: another leads).
 * Thread-safe.
 */
DLOCK_EXTERN int dlock_campaign(dlock_lock **out, dlock_client *client, const char *name,
                                const char *identity, const dlock_acquire_options *opts);

/* Stop leading and free the handle: dlock_release of a leader handle, which
 * also tells the observers at once. Returns as dlock_release. */
DLOCK_EXTERN int dlock_resign(dlock_lock *leader);

typedef struct {
    /* 1 when some campaigner leads now. */
    int held;
    /* The leader's fence; 0 when none. */
    uint64_t fence;
    /* Lease left, in ms, when held. */
    int64_t ttl_ms;
    /* The leader's identity, NUL-terminated; "" when none. */
    char identity[DLOCK_IDENTITY_MAX + 1];
} dlock_leader_info;

/*
 * Read who leads the election called name now, without campaigning.
 * Returns DLOCK_OK (also when nobody leads: held is 0), DLOCK_EINVAL,
 * DLOCK_ENOTSUP, DLOCK_ECONN, DLOCK_ESERVER, DLOCK_EPROTO. Thread-safe.
 */
DLOCK_EXTERN int dlock_leader(dlock_leader_info *out, dlock_client *client, const char *name);

/* An observer of an election. Opaque. */
typedef struct dlock_observer dlock_observer;

/*
 * Called from the observer's own thread: once with the state when the
 * observer starts, then at each change: a new leader (a new fence, even
 * with the same identity) or none. leader is borrowed for the call.
 */
typedef void (*dlock_observe_cb)(const dlock_leader_info *leader, void *payload);

/*
 * Watch the election called name. A thread of the observer's calls cb as
 * described above. Changes are announced by the server (pub/sub) when a
 * leader starts or resigns; a leader that dies without resigning is seen
 * as gone when its lease runs out (the observer sleeps until then, it does
 * not poll). If the server cannot be reached, the observer keeps trying
 * (once a second) and reports the state when it can read it again; cb is
 * not called meanwhile.
 *
 * Returns DLOCK_OK and *out (cb may already be running), DLOCK_EINVAL,
 * DLOCK_ENOTSUP, DLOCK_ENOMEM, or a server error (DLOCK_ECONN, DLOCK_EAUTH,
 * DLOCK_EPROTO, DLOCK_ESERVER) from a backend that reads the election's
 * state before the observer starts (etcd does). Thread-safe.
 */
DLOCK_EXTERN int dlock_observe(dlock_observer **out, dlock_client *client, const char *name,
                               dlock_observe_cb cb, void *payload);

/*
 * Stop the observer and free it. cb is never called after this returns.
 * NULL is a no-op. Must not be called from cb (it would wait for itself),
 * and must be called before dlock_client_free of its client.
 */
DLOCK_EXTERN void dlock_observer_free(dlock_observer *observer);

/* ------------------------------------------------------------------------
 * Administration
 * ---------------------------------------------------------------------- */

/*
 * The state of a lock, as dlock_status, dlock_force_release and dlock_list
 * read it. Fields are only ever appended (while the ABI is 0.x, the
 * library's SONAME changes when they are).
 */
typedef struct {
    /* 1 if some owner holds the lock now. */
    int held;
    /* The highest fencing token issued for this name so far (0: never;
     * etcd: the holder's fence, 0 when free). */
    uint64_t fence;
    /* Lease left, in ms, when held; -1 when held with no expiry (a key set
     * by hand); 0 when not held. */
    int64_t ttl_ms;

    /* ---- Who holds it: recorded by each acquisition in the same round
     * trip that takes the lock (Redis and etcd: every kind). has_holder
     * is 0 when the lock is free or the holder left no record (an older
     * dlock, a key set by hand); the
     * fields below are then empty. When several hold the lock (readers,
     * permits, the handles of a reentrant owner), these are the oldest
     * holder's (the lowest fence): dlock_status_holders gives each. ---- */
    int has_holder;
    /* The holder's host name (gethostname), NUL-terminated. */
    char host[DLOCK_HOST_MAX + 1];
    /* The holder's process id. */
    int64_t pid;
    /* When the holder took the lock: its wall clock, in ms since the Unix
     * epoch. Shown to people only: it decides nothing. */
    int64_t start_ms;
    /* dlock_acquire_options.label, "" when none. */
    char label[DLOCK_LABEL_MAX + 1];

    /* ---- Appended while the ABI is 0.x (issue 16). ---- */

    /* How many hold the lock now: 0 when free; the number of readers of a
     * read-write lock or permit holders of a semaphore; the number of
     * handles of a reentrant owner; else 1 (also when the backend cannot
     * count them). */
    int holders;
    /* What holds it, when the backend records that (Redis): DLOCK_KIND_MUTEX
     * (a plain mutex, or one with owner ids), _FAIR, _WRITE (the writer of
     * a read-write lock), _READ (its readers), _SEMAPHORE (permit holders)
     * or _LEADER; -1 when free or not known. */
    int kind;
} dlock_lock_info;

/*
 * Read the state of the lock called name, without taking it: whether it is
 * held, its fence, its lease left and who holds it (dlock_lock_info).
 * Returns DLOCK_OK, DLOCK_EINVAL, DLOCK_ECONN, DLOCK_EPROTO, DLOCK_ESERVER.
 * Thread-safe.
 */
DLOCK_EXTERN int dlock_status(dlock_lock_info *out, dlock_client *client, const char *name);

/*
 * dlock_list's callback: one held lock, its name (NUL-terminated, borrowed
 * for the call) and state (borrowed). Return 0 to go on, anything else to
 * stop the listing (dlock_list then returns DLOCK_OK). Also
 * dlock_status_holders': one holder.
 */
typedef int (*dlock_list_cb)(const char *name, const dlock_lock_info *info, void *payload);

/*
 * Call cb once for each holder of the lock called name, in no particular
 * order: each reader of a read-write lock, each permit holder of a
 * semaphore, each handle of a reentrant owner, or the one holder. info is
 * the lock's state as dlock_status reads it (held, holders, kind), with
 * fence, ttl_ms and the holder fields of that holder: its own fence, its
 * own lease left (readers and permits have one each), its record. Nothing
 * is called for a free lock. All holders are read in one round trip.
 * A backend that keeps no list of holders (Redlock) calls cb once,
 * with dlock_status' answer, when the lock is held.
 *
 * Returns DLOCK_OK (also when cb stopped it by returning non-zero),
 * DLOCK_EINVAL (NULL client or cb, a bad name), or a server error as
 * dlock_status. Thread-safe.
 */
DLOCK_EXTERN int dlock_status_holders(dlock_client *client, const char *name, dlock_list_cb cb,
                                      void *payload);

/*
 * Call cb for every lock held now on the client's server whose name starts
 * with prefix (NULL or "": every lock under the client's key_prefix), in
 * no particular order. For operators: it scans the server (Redis: SCAN,
 * etcd: a range read), so it costs in proportion to the keys there, and a
 * lock taken or released meanwhile may be listed or not. Lists the locks
 * whose state dlock_status reads (Redis and etcd: every kind, a read-write
 * lock or semaphore once however many hold it; each part of a multi-lock
 * by its own name).
 *
 * Returns DLOCK_OK, DLOCK_EINVAL (NULL client or cb, a prefix over
 * DLOCK_NAME_MAX bytes), DLOCK_ENOTSUP (a backend without a listing), or a
 * server error (DLOCK_ECONN, DLOCK_EPROTO, DLOCK_ESERVER; cb may have been
 * called for some locks). Thread-safe.
 */
DLOCK_EXTERN int dlock_list(dlock_client *client, const char *prefix, dlock_list_cb cb,
                            void *payload);

/*
 * Break the lock called name whoever holds it, and wake its waiters. For
 * administrators: the holder will find its lock lost. *removed (may be NULL)
 * receives the state just before. The fence counter is kept, so tokens stay
 * increasing. Returns as dlock_status. Thread-safe.
 */
DLOCK_EXTERN int dlock_force_release(dlock_lock_info *removed, dlock_client *client,
                                     const char *name);

/* ------------------------------------------------------------------------
 * Statistics
 * ---------------------------------------------------------------------- */

/* Buckets of the histograms in dlock_stats. */
#define DLOCK_STATS_BUCKETS 40

/*
 * A client's counters since it was opened (dlock_client_stats). Set version
 * (DLOCK_STATS_INIT) before the call: the library fills the struct as far as
 * that version goes, so fields are only ever appended.
 *
 * Histograms have log2 buckets of microseconds: bucket 0 counts times
 * under 1 us, bucket i (1 <= i < DLOCK_STATS_BUCKETS - 1) times from
 * 2^(i-1) us to under 2^i us, the last bucket every longer time.
 */
typedef struct {
    unsigned version;
    /* Acquisitions that succeeded (dlock_acquire, dlock_campaign, each lock
     * of a multi-lock taken one at a time, an atomic multi-lock once). */
    uint64_t acquires;
    /* Tries the server answered "held by another" (each try counts). */
    uint64_t busy;
    /* Acquisitions that waited for a release (they found the lock busy and
     * wait_ms was not 0), whatever their outcome. */
    uint64_t waits;
    /* Acquisitions that were handed the lock by the holder's release
     * (Redis' hand-off slot). */
    uint64_t handoffs;
    /* Leases renewed by the watchdog (one per lock per renewal). */
    uint64_t renewals;
    /* Renewals of a lock that could not reach the server (retried until its
     * lease runs out). */
    uint64_t renew_failures;
    /* Locks found lost (on_lost's events, whether or not one is set). */
    uint64_t losses;
    /* Round trips: how long each call to the server for a lock took (every
     * try of an acquisition, release, extend, check, renewal batch). */
    uint64_t round_trip_us[DLOCK_STATS_BUCKETS];
    /* How long acquisitions that waited (see waits) waited, till the lock or
     * till they gave up. */
    uint64_t wait_us[DLOCK_STATS_BUCKETS];

    /* ---- Version 2 ---- */

    /* The sums of the times the two histograms count, in microseconds. */
    uint64_t round_trip_us_sum;
    uint64_t wait_us_sum;
} dlock_stats;

#define DLOCK_STATS_VERSION 2
#define DLOCK_STATS_INIT {DLOCK_STATS_VERSION, 0, 0, 0, 0, 0, 0, 0, {0}, {0}, 0, 0}

/*
 * Read the client's counters, all at once, into *out (whose version says
 * how much of it to fill). Each counter is read atomically; the set is not
 * one snapshot if other threads use the client meanwhile. Returns DLOCK_OK,
 * or DLOCK_EINVAL (NULL, an unknown version). Thread-safe, no I/O.
 */
DLOCK_EXTERN int dlock_client_stats(dlock_stats *out, const dlock_client *client);

/* Formats of dlock_stats_format. */
#define DLOCK_STATS_JSON 1
#define DLOCK_STATS_PROMETHEUS 2

/*
 * Write *st as text into buf, snprintf-style: at most size bytes, always
 * NUL-terminated when size > 0 (buf may be NULL when size is 0). Returns the
 * length of the whole text without its NUL (so a return >= size means it was
 * cut: call again with a buffer of return + 1 bytes), or -1 for NULL st, a
 * version below 1 or an unknown format. backend (may be NULL: left out)
 * names the client's backend, as dlock_client_backend gives it.
 *
 *   DLOCK_STATS_JSON        one object on one line and a newline, its keys
 *     always these, in this order: "backend" (when given), "acquires",
 *     "busy", "waits", "handoffs", "renewals", "renew_failures", "losses",
 *     "round_trip_us" and "wait_us" (arrays of the DLOCK_STATS_BUCKETS
 *     bucket counts as dlock_stats has them), and with a version 2 *st,
 *     "round_trip_us_sum" and "wait_us_sum".
 *   DLOCK_STATS_PROMETHEUS  the text exposition format 0.0.4, for a
 *     /metrics handler: with # HELP and # TYPE lines, the counters
 *     dlock_acquires_total, dlock_busy_total, dlock_waits_total,
 *     dlock_handoffs_total, dlock_renewals_total, dlock_renew_failures_total
 *     and dlock_losses_total, and the histograms dlock_round_trip_seconds
 *     and dlock_wait_seconds, each sample labelled {backend="..."} when
 *     backend is given. A histogram's buckets are cumulative, le="2^i us" in
 *     seconds for i from 0 to DLOCK_STATS_BUCKETS - 2, then le="+Inf" whose
 *     count equals _count. Each le counts the times under it (one microsecond
 *     short of Prometheus' "at most"). A version 2 *st adds each
 *     histogram's _sum (in seconds); a version 1 one has no total time, so
 *     no _sum. One client per call: the text has each metric's HELP
 *     and TYPE, so it is a whole scrape body, not a part to concatenate.
 *
 * Thread-safe, no I/O, no allocation.
 */
DLOCK_EXTERN int dlock_stats_format(char *buf, size_t size, const dlock_stats *st,
                                    const char *backend, int format);

/* ------------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------- */

/*
 * Parse a duration, as people write them (and Go's time.ParseDuration and
 * systemd mostly agree): one or more parts, each a non-negative number with
 * an optional fraction of at most 9 digits and a unit, "d" (days of 24 h),
 * "h", "m" (minutes), "s" or "ms", the units from the longest to the
 * shortest, each once: "250ms", "30s", "90s", "1.5s", "2m", "1h30m",
 * "1d12h", "0.25h". A bare number alone is seconds ("30", "1.5"). The sum
 * must be a whole number of milliseconds ("0.5ms" is refused, not rounded),
 * at most DLOCK_LEASE_MAX_MS. Returns DLOCK_OK and *out_ms, or DLOCK_EINVAL
 * for anything else (empty, a sign, spaces, an unknown unit, units out of
 * order or repeated, "1h30"), saying why and leaving *out_ms alone.
 */
DLOCK_EXTERN int dlock_duration_parse(int64_t *out_ms, const char *text);

#ifdef __cplusplus
}
#endif

#endif /* DLOCK_DLOCK_H */
