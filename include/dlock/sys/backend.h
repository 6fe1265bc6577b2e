/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The backend interface: what a lock service (Redis, etcd, ZooKeeper,
 * PostgreSQL ...) provides to the dlock core. After sqlite3_vfs: a versioned
 * struct of function pointers with a name and a size, so the core can tell
 * which calls a table built against an older header has, and refuse one it
 * cannot serve.
 *
 * The core owns everything that is the same for every service: argument
 * checks, tokens, the acquire/wait loop, lease bookkeeping, the watchdog
 * thread, on_lost, and error text. A backend owns the wire: how to take a
 * lease and issue a fence in one round trip, how to release by token, how to
 * renew many leases at once, and how to wait for a release without polling.
 * Every call about a lock takes one request (dlock_request) that carries its
 * kind; a backend declares the kinds it serves in caps. This header is the
 * contract; docs/backends.md has the checklist for a new backend.
 *
 * Versions, after sqlite3_vfs's iVersion. A table says which version of
 * this interface it was built for (version) and how large it is (size). A
 * call that comes later is appended at the end of dlock_backend, optional
 * (NULL: the core does without it), and marked "since vN" with the version
 * of the header it first appeared in; the core reads a call only when the
 * table's size reaches past it, and treats a call beyond the size as NULL,
 * so a table built against an older header keeps working with the calls
 * it has. The structs a call is given (dlock_request, dlock_acquire_result,
 * dlock_lock_info, dlock_client_options) likewise only grow at their end.
 *
 * DLOCK_BACKEND_VERSION goes up only for a real break: a field that moves
 * or changes type, a call whose arguments or meaning change so that a
 * backend built before would do the wrong thing, or a new call every
 * backend must have. Appending an optional call is none, and neither is
 * dropping the last one when the core's doing without it is what its NULL
 * always meant: a table larger than the core knows, of a version it
 * serves, is served with the calls the core knows, the rest never read
 * (version 5 tables built while token_new followed holders). After a
 * break, tables of the versions before it are refused. Served today:
 * versions 2 (the first request-based table) to DLOCK_BACKEND_VERSION,
 * with a size of at least the version 2 table's (the calls up to
 * multi_acquire).
 */
#ifndef DLOCK_SYS_BACKEND_H
#define DLOCK_SYS_BACKEND_H

#include "dlock/dlock.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A parsed service URL, as the core hands it to a backend. All strings are
 * NUL-terminated, percent-decoded where the syntax allows, and owned by the
 * client; NULL when absent. */
typedef struct {
    char *host; /* name or address; IPv6 without brackets */
    int port;   /* 0 when the URL named none */
} dlock_url_host;

typedef struct {
    char *key;
    char *value;
} dlock_url_param;

typedef struct {
    char *scheme;   /* lower case: "redis", "unix", "etcd" ... */
    char *user;     /* NULL when absent */
    char *password; /* NULL when absent; never printed */
    dlock_url_host *hosts;
    size_t nhosts;  /* 0 for unix:// */
    char *path;     /* what follows the host list, with its leading '/' */
    dlock_url_param *params;
    size_t nparams;
    char *redacted; /* the URL for messages, the password replaced by "***" */
} dlock_url;

/* The value of query parameter key, or NULL. */
DLOCK_EXTERN const char *dlock_url_param_get(const dlock_url *url, const char *key);

/* 1 if the n bytes at host, as a URL writes them, name this machine: empty
 * (a client library's default socket), a Unix socket's path ('/', or '@' for
 * the abstract namespace), "localhost" (any case), 127.0.0.0/8 or ::1; else
 * 0. No name is looked up: what the URL says decides, so that a backend can
 * choose, before any I/O, whether a password may go without verified TLS. */
DLOCK_EXTERN int dlock_url_host_is_local(const char *host, size_t n);

/*
 * One acquisition, as the core hands it to a backend: every call about a
 * held or wanted lock takes one. Strings are borrowed for the call.
 */
typedef struct {
    int kind;             /* DLOCK_KIND_* but MULTI */
    const char *name;
    const char *token;    /* this acquisition's own token: fresh, unguessable;
                           * what release, extend and renew compare */
    const char *owner;    /* the caller's owner id, or NULL (the token owns) */
    int reentrant;
    int64_t lease_ms;     /* acquire, extend and renew: the lease to set */
    int permits;          /* SEMAPHORE: N when the service has none yet */
    const char *identity; /* LEADER: what observers see */
    /* Since v3 (a backend built before ignores it). Who holds the lock,
     * "HOST PID START_MS[ LABEL]": acquire stores it with the lock, as it
     * is, in the same round trip, and status gives it back to
     * dlock_holder_parse. At most DLOCK_HOLDER_MAX bytes, printable ASCII;
     * NULL when unknown (the other calls may ignore it). */
    const char *holder;
    /* Since v5, after holder (0 from a core built before). 1 when the
     * core's watchdog renews this lock (auto_renew): a backend may then
     * keep it alive together with the client's other auto-renewed locks
     * (etcd puts them on one lease); 0 when its lease must run out on the
     * server at the end of lease_ms unless extended. */
    int auto_renew;
} dlock_request;

/* Longest dlock_request.holder. */
#define DLOCK_HOLDER_MAX (DLOCK_HOST_MAX + 2 * 20 + 3 + DLOCK_LABEL_MAX)

/* What an acquire attempt found. */
typedef struct {
    /* DLOCK_OK: the fence, > 0 and strictly greater than any fence issued
     * before for the name. */
    uint64_t fence;
    /* DLOCK_EBUSY: how long the core may sleep before it tries again if no
     * release is announced: the holder's remaining lease (0: try again at
     * once, e.g. the key vanished between two commands); -1 when unknown
     * (the core then looks again every second); INT64_MAX when the watch is
     * certain to announce the release. */
    int64_t retry_ms;
    /* Set by the core before the call: the lease-clock time (ms) the
     * request is sent at, which the lease counts from. A backend that
     * knows the lease began later may move it later; one whose lock is on
     * a lease set on the server before this call (etcd's spare leases, kept
     * alive ahead of need) moves it earlier, to when that request was sent.
     * The server must keep the lock at least lease_ms from lease_from_ms. */
    int64_t lease_from_ms;
    /* multi_acquire, DLOCK_EBUSY: the index of a name held by another. */
    size_t busy;
    /* Since v3. DLOCK_OK: set to 1 when the lock was handed to this waiter
     * by the holder's release (the try confirmed a hand-off), for the
     * client's statistics and log. The core sets it to 0 before each try. */
    int handed;
} dlock_acquire_result;

/* One entry of a batched renewal. */
typedef struct {
    const dlock_request *req;
    int result; /* out: DLOCK_OK renewed, DLOCK_ELOST no longer ours */
} dlock_renewal;

/* What a backend supports, in dlock_backend.caps. The core answers
 * DLOCK_ENOTSUP for the rest (kinds, and owner ids without
 * DLOCK_CAP_OWNER_IDS) before any call reaches the backend. */
#define DLOCK_CAP_KIND(kind) (1u << (kind)) /* DLOCK_KIND_*: MUTEX is required */
#define DLOCK_CAP_OWNER_IDS (1u << 16)      /* owner ids and reentrancy */
/* A waiting acquisition of one lock begins with watch_begin and a try with
 * the watch, not a try without: the backend's queued try costs no more
 * than a try-once when the lock is free (ZooKeeper's: a node created and
 * the queue listed, as Curator's acquire), and a busy one stays queued
 * instead of being undone and made again. */
#define DLOCK_CAP_QUEUE_FIRST (1u << 17)

/* The version of this interface: see "Versions" at the top. */
#define DLOCK_BACKEND_VERSION 5

/* Length of an owner token (dlock_request.token), in hex digits. */
#define DLOCK_BACKEND_TOKEN_LEN 32

/*
 * Thread-safety required of a backend: every call but renew may be made
 * concurrently from several threads (the backend serialises use of its
 * connections); renew is only ever called from the client's watchdog thread,
 * one call at a time, and should use a connection of its own so that renewals
 * never queue behind a caller's command. Every call must return within the
 * client's timeouts (connect_timeout_ms, command_timeout_ms); a connection
 * that broke is opened again on next use.
 *
 * Errors: a failing call sets the thread's message with dlock_backend_fail
 * (text naming the server, never a password: url->redacted is the URL to
 * show), and returns a DLOCK_E* code: DLOCK_ECONN for the network and
 * timeouts, DLOCK_EAUTH for credentials, DLOCK_ESERVER for a refusal,
 * DLOCK_EPROTO for a reply the protocol does not allow, DLOCK_ENOMEM. After
 * DLOCK_ECONN, DLOCK_ETIMEOUT or DLOCK_EPROTO the core takes it that the
 * server may have carried the request out (it gives a try-once acquire
 * back with release); after any other code, that it did not.
 */
typedef struct dlock_backend {
    /* ---- Since v2: every table has the fields up to multi_acquire. ---- */

    unsigned version;     /* DLOCK_BACKEND_VERSION */
    size_t size;          /* sizeof(dlock_backend) */
    const char *name;     /* "redis" */
    const char *const *schemes; /* NULL-terminated list of URL schemes served */
    unsigned caps;        /* DLOCK_CAP_* */

    /* Connect and check the connection (credentials, database). opts->log
     * (may be NULL) is the client's log: a backend calls it with
     * DLOCK_LOG_INFO when it connects again after a connection broke. */
    int (*open)(void **out, const dlock_url *url, const dlock_client_options *opts);
    /* Close everything; NULL is a no-op. No other call is running. */
    void (*close)(void *be);

    /*
     * Try once, in one round trip where the service allows: take the lock
     * req asks for (a kind in caps) for req->token with a lease of
     * req->lease_ms and issue the next fence. DLOCK_OK and out->fence;
     * DLOCK_EBUSY and out->retry_ms; DLOCK_EMISUSE for an owner that holds
     * the lock but may not take it again (not reentrant, read-write
     * upgrade). DLOCK_OK must mean that the service set (or renewed) the
     * lease for lease_ms during this call, or from out->lease_from_ms when
     * the backend moved it earlier. Must be
     * idempotent for the same token: a retry after a lost reply returns the
     * fence already issued.
     *
     * watch is NULL for a try-once acquisition (leave nothing behind on
     * EBUSY), or the caller's watch from watch_begin when it is waiting: a
     * queue-based service (etcd, ZooKeeper) keeps its place in the queue in
     * the watch between tries. A service may hand the lock to a waiter as
     * the holder releases it (Redis does, for a short confirm window); the
     * waiter's next acquire confirms it. A message announcing a hand-off is
     * only a reason to try, never a lock by itself: it may come after the
     * handed-over lease ran out.
     */
    int (*acquire)(void *be, const dlock_request *req, void *watch, dlock_acquire_result *out);
    /* Give the lock up if req->token still holds it, and wake waiters.
     * DLOCK_OK, or DLOCK_ELOST when it was not ours (and nothing changed). */
    int (*release)(void *be, const dlock_request *req);
    /* Set the lease to req->lease_ms from now if req->token still holds it. */
    int (*extend)(void *be, const dlock_request *req);
    /* DLOCK_OK if req->token holds the lock, DLOCK_ELOST if not. */
    int (*check)(void *be, const dlock_request *req);
    /* Renew n leases (each its req->lease_ms; n at most 128) in as few
     * round trips as possible, setting each result. Returns DLOCK_OK when
     * every result is set, else a connection or protocol error and no
     * result is to be trusted (the core tries again until the deadline). */
    int (*renew)(void *be, dlock_renewal *items, size_t n);

    /*
     * Waiting without polling. watch_begin registers interest in releases of
     * the lock req wants and returns only once the registration is active
     * on the server, so that a release after it returns is never missed.
     * watch_wait (timeout_ms >= 0) sleeps until a release is announced or
     * watch_wake is called (DLOCK_OK) or timeout_ms passes (DLOCK_ETIMEOUT);
     * when the registration broke and may have missed a release, it returns
     * DLOCK_OK too (a reason to try) and restores it. watch_end drops the
     * registration, and whatever the waiter queued unless its last acquire
     * with this watch succeeded, including a lock that a try whose reply
     * was lost may have taken (by token). It may do I/O: the core keeps its
     * own error message around it. A try-once acquire (watch NULL) whose
     * outcome is unknown is given back by the core, with release. A backend
     * should wake only as many waiters per release as can use it.
     */
    int (*watch_begin)(void *be, const dlock_request *req, void **watch);
    int (*watch_wait)(void *be, void *watch, int64_t timeout_ms);
    void (*watch_end)(void *be, void *watch);
    /* Wake the current or next watch_wait of watch, between its
     * watch_begin (or observe_begin) and watch_end. Thread-safe. */
    void (*watch_wake)(void *be, void *watch);

    /* Read the state of name (its plain mutex, or election; a backend that
     * keeps the lock family's holders: any kind). The core sets
     * holders = 0 and kind = -1 first: a backend that counts its holders
     * sets both (the core makes holders 1 for a held lock otherwise). */
    int (*status)(void *be, const char *name, dlock_lock_info *out);
    /* Delete the lock whoever holds it, wake waiters; *removed the state
     * just before (never NULL here). */
    int (*force_release)(void *be, const char *name, dlock_lock_info *removed);

    /* ---- Set when caps has the kind they serve; NULL otherwise. ---- */

    /* READ/WRITE: turn the write lock req into a read lock held by the same
     * token, atomically, keeping its fence. DLOCK_ELOST if not ours. */
    int (*downgrade)(void *be, const dlock_request *req);
    /* SEMAPHORE: set the number of permits of name and wake its waiters. */
    int (*set_permits)(void *be, const char *name, int permits);
    /* LEADER: who leads election name, and a watch woken by every change of
     * leader of name (and by watch_wake). */
    int (*leader_get)(void *be, const char *name, dlock_leader_info *out);
    int (*observe_begin)(void *be, const char *name, void **watch);

    /*
     * Multi-locks: optional (NULL: the core takes the names one at a time
     * in a global order). multi_atomic says whether the n plain mutexes
     * reqs can be taken in one atomic step; multi_acquire then tries once
     * to take them all or none, setting fences[i]; DLOCK_EBUSY with
     * out->busy and out->retry_ms. Idempotent as acquire.
     */
    int (*multi_atomic)(void *be, const dlock_request *reqs, size_t n);
    int (*multi_acquire)(void *be, const dlock_request *reqs, size_t n, uint64_t *fences,
                         dlock_acquire_result *out);

    /* ---- Appended since: optional, there when size reaches past them. ---- */

    /*
     * Since v3. Listing: optional (NULL: dlock_list answers DLOCK_ENOTSUP).
     * Call cb for each lock held now whose name starts with prefix ("" for
     * all), with its state as status reads it, until cb returns non-zero
     * (then return DLOCK_OK). Names the service cannot turn back into lock
     * names are skipped.
     */
    int (*list)(void *be, const char *prefix, dlock_list_cb cb, void *payload);

    /*
     * Since v4. Holders: optional (NULL: dlock_status_holders calls status,
     * and cb once when held). Call cb for each holder of name, as
     * dlock_status_holders describes, until cb returns non-zero (then
     * return DLOCK_OK).
     */
    int (*holders)(void *be, const char *name, dlock_list_cb cb, void *payload);

    /*
     * Appended to v5 (after holders; optional). Waiting without a thread:
     * have the backend call fn(arg) each time watch_wait of watch would
     * return DLOCK_OK (a release announced, watch_wake, a registration that
     * broke), from any thread, until watch_end returns. fn takes a mutex of
     * the core's and returns at once; it never calls the backend. The
     * wake-up stays pending as before: the core consumes it with
     * watch_wait(watch, 0) before its next try. Called once per watch,
     * right after watch_begin. NULL: an asynchronous acquisition
     * (include/dlock/async.h) waits on a thread of its own in watch_wait.
     */
    void (*watch_notify)(void *be, void *watch, void (*fn)(void *), void *arg);

    /*
     * Appended to v5 (optional: all three, or none). Calls made without
     * blocking, on the asynchronous API's loop thread (include/dlock/async.h),
     * so that a request costs no thread hand-over:
     *
     * start sends op (DLOCK_BACKEND_OP_ACQUIRE: a try-once acquire, watch
     * NULL, *res as acquire fills it; DLOCK_BACKEND_OP_RELEASE) for req and
     * returns at once: DLOCK_OK, and done(arg, rc) is called once later, from
     * async_step on the loop's thread or from a thread of the backend's,
     * with the thread's message set when rc is not DLOCK_OK; it must return
     * at once and not call the backend. rc as the blocking call would
     * return it, or DLOCK_ENOTSUP: "do it with the blocking call" (nothing
     * was done, or it may be done again: NOSCRIPT, a failover). start itself
     * returns DLOCK_ENOTSUP, done never called, for a request it cannot
     * send so (no connection yet: connecting blocks; a kind it does not
     * serve this way).
     *
     * async_fds fills up to max descriptors to watch for readability, each
     * with a generation (a new connection on the same descriptor has a new
     * one), and returns how many. async_step reads what they have without
     * waiting, calls the done of what finished, fails what timed out, and
     * returns when it must run again at the latest (lease-clock ms), -1
     * when nothing is in flight.
     */
    int (*start)(void *be, int op, const dlock_request *req, dlock_acquire_result *res,
                 void (*done)(void *arg, int rc), void *arg);
    int (*async_fds)(void *be, int *fds, unsigned *gens, int max);
    int64_t (*async_step)(void *be);

    /*
     * Appended to v5 (optional; with start). A renewal batch sent as start
     * sends: items as renew takes them (n >= 1; a request's lease_ms is
     * the lease it gets, so an extension is a batch of one), done(arg, rc)
     * called once later as start's is, rc as renew returns it with every
     * items[i].result set on DLOCK_OK. items and the requests' strings live
     * until done. DLOCK_ENOTSUP (done never called) when it cannot. Needed,
     * with start, by a client opened with DLOCK_CLIENT_NO_THREADS.
     */
    int (*renew_start)(void *be, dlock_renewal *items, size_t n, void (*done)(void *arg, int rc),
                       void *arg);
} dlock_backend;

/* dlock_backend.start's op. */
#define DLOCK_BACKEND_OP_ACQUIRE 1
#define DLOCK_BACKEND_OP_RELEASE 2

/*
 * Serve URLs of scheme with backend, for every client opened from now on in
 * this process: a backend that lives outside the library. The table is
 * read at this call (the core keeps a full-size copy, its calls beyond the
 * table's size NULL); the name and schemes it points to are borrowed for
 * the life of the process. scheme: lower case letters, digits,
 * '+', '-', '.'; a scheme already served (built in or registered) is
 * refused. Thread-safe.
 *
 * Required of every backend: a version from 2 to DLOCK_BACKEND_VERSION, a
 * size of at least the version 2 table's (see "Versions"), a name,
 * DLOCK_CAP_KIND(DLOCK_KIND_MUTEX) in caps (and no unknown bit), every call
 * from open to force_release; downgrade with READ or WRITE, set_permits
 * with SEMAPHORE, leader_get and observe_begin with LEADER; multi_atomic
 * and multi_acquire both or neither. A backend should honour the client
 * options' key_prefix and client_name where its service has such things
 * (tests keep apart by key prefix).
 *
 * Returns DLOCK_OK, or DLOCK_EINVAL (NULL argument, a bad or taken scheme,
 * a version or size out of range, or a backend that misses one of the
 * above; the message says which, and names the backend).
 */
DLOCK_EXTERN int dlock_backend_register(const char *scheme, const dlock_backend *backend);

/*
 * Backend modules. A backend that needs a client library of its own
 * (ZooKeeper, PostgreSQL, MariaDB) is built as a loadable module, so that
 * programs that do not use it never load that library. The first client
 * opened with a scheme that no built-in or registered backend serves makes
 * the library look for the module:
 *   - zk                  -> zk.so
 *   - postgres, postgresql -> postgres.so
 *   - mysql, mariadb      -> mysql.so
 *   - any other scheme of lower case letters and digits -> SCHEME.so
 * in the directory $DLOCK_MODULE_DIR names (ignored in set-user-id
 * programs), else in dlock/ beside libdlock.so, else in the library
 * directory dlock was configured with (LIBDIR/dlock). The module is loaded
 * for the life of the process; its table is checked as
 * dlock_backend_register checks one and serves every scheme it lists.
 *
 * A module exports its table with DLOCK_BACKEND_MODULE(table), which
 * defines the function the library looks up (DLOCK_BACKEND_MODULE_SYMBOL).
 * A module resolves the dlock_* calls it makes in the program that loads
 * it: libdlock.so, or a static program linked with -rdynamic. A static
 * program without -rdynamic links the module's code itself and calls
 * dlock_backend_register; the same sources built with
 * DLOCK_BACKEND_MODULE_STATIC defined leave the function out.
 */
#define DLOCK_BACKEND_MODULE_SYMBOL "dlock_backend_module"
#ifdef DLOCK_BACKEND_MODULE_STATIC
#define DLOCK_BACKEND_MODULE(table)
#else
#define DLOCK_BACKEND_MODULE(table)                                                             \
    DLOCK_EXTERN const dlock_backend *dlock_backend_module(void);                               \
    const dlock_backend *dlock_backend_module(void) { return &(table); }
#endif

/*
 * Serve every scheme backend->schemes lists, as a loaded module's table is
 * served: dlock_backend_register for each, but for a scheme this very table
 * serves already (so a second call changes nothing). For a program that
 * links a backend's code instead of loading its module: a program linked
 * with libdlock.a cannot load modules, unless it exports dlock's calls
 * (-rdynamic). Call it before the first client of those schemes opens.
 * Thread-safe.
 *
 * Returns DLOCK_OK, or DLOCK_EINVAL: NULL, a table that lists no scheme,
 * or what dlock_backend_register refuses (a scheme another table serves,
 * a bad table); the message says which. The schemes before the refused one
 * stay served.
 */
DLOCK_EXTERN int dlock_backend_register_table(const dlock_backend *backend);

/*
 * The tables of the backend modules dlock ships, for programs that link
 * their code (docs/static.md):
 *   dlock_zk_backend()        zk://                       libdlock_zk.a
 *   dlock_postgres_backend()  postgres://, postgresql://  libdlock_postgres.a
 *   dlock_mysql_backend()     mysql://, mariadb://        libdlock_mysql.a
 * Each is defined in its static library (pkg-config dlock-zk, ...; CMake
 * find_package(dlock COMPONENTS zk) and dlock::zk_static, ...), which links
 * libdlock.a and the backend's client library, and in its module, but not
 * in libdlock itself:
 *   dlock_backend_register_table(dlock_zk_backend());
 * The table lives for the life of the process.
 */
DLOCK_EXTERN const dlock_backend *dlock_zk_backend(void);
DLOCK_EXTERN const dlock_backend *dlock_postgres_backend(void);
DLOCK_EXTERN const dlock_backend *dlock_mysql_backend(void);

/*
 * For backends: fill the holder fields of *info (has_holder, host, pid,
 * start_ms, label) from text, len bytes as an acquisition's
 * dlock_request.holder gave them. Text that is not such a record leaves
 * has_holder 0 and returns DLOCK_EPROTO; DLOCK_OK otherwise. Thread-safe.
 */
DLOCK_EXTERN int dlock_holder_parse(dlock_lock_info *info, const char *text, size_t len);

/*
 * For backends: set the calling thread's error message (printf-style; name
 * the server, as "redis 127.0.0.1:6390: connection refused") and return
 * code, so that `return dlock_backend_fail(DLOCK_ECONN, ...)` reports a
 * failure as the library's own calls do. Whatever code is, the text is set
 * (code 0 with a saved message puts it back). Control characters in it
 * (below 0x20, 0x7f), as a server's text may hold, become '?'.
 */
DLOCK_EXTERN int dlock_backend_fail(int code, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#ifdef __cplusplus
}
#endif

#endif /* DLOCK_SYS_BACKEND_H */
