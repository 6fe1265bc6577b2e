/*
 * The backend interface: what a lock service (Redis, etcd, ZooKeeper,
 * PostgreSQL ...) provides to the dlock core. After sqlite3_vfs: a versioned
 * struct of function pointers with a name and a size, so the core can refuse a
 * backend built for another version.
 *
 * The core owns everything that is the same for every service: argument
 * checks, owner tokens, the acquire/wait loop, lease bookkeeping, the watchdog
 * thread, on_lost, and error text. A backend owns the wire: how to take a lease
 * and issue a fence in one round trip, how to release by owner, how to renew
 * many leases at once, and how to wait for a release without polling.
 *
 * Not yet frozen: DLOCK_BACKEND_VERSION changes with every incompatible
 * change until 1.0.
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

/* One entry of a batched renewal. */
typedef struct {
    const char *name;  /* lock name */
    const char *owner; /* owner token */
    int64_t lease_ms;
    int result;        /* out: DLOCK_OK renewed, DLOCK_ELOST no longer ours */
    /* The lock family: DLOCK_KIND_* and the caller's owner id. Both are 0 /
     * NULL for the plain mutex, the only lock a backend without the family
     * calls (family_acquire NULL) is ever asked to renew. */
    int kind;
    const char *owner_id;
} dlock_renewal;

/*
 * A lock of the family (dlock.h, "Lock kinds"), as the core asks a backend
 * for it. The plain mutex (kind DLOCK_KIND_MUTEX, owner NULL) never comes
 * this way: it uses acquire / release / extend / check above.
 */
typedef struct {
    int kind;             /* DLOCK_KIND_* but MULTI */
    const char *name;
    const char *token;    /* this handle's own token, fresh and unguessable */
    const char *owner;    /* the caller's owner id, or NULL (the token owns) */
    int reentrant;
    int64_t lease_ms;
    int permits;          /* SEMAPHORE: N when the service has none yet */
    const char *identity; /* LEADER: what observers see */
} dlock_request;

#define DLOCK_BACKEND_VERSION 1

/*
 * Thread-safety required of a backend: every call but renew may be made
 * concurrently from several threads (the backend serialises use of its
 * connections); renew is only ever called from the client's watchdog thread,
 * one call at a time, and should use a connection of its own so that renewals
 * never queue behind a caller's command. Every call must return within the
 * client's timeouts. A failing call sets the thread's message with
 * dlock__fail-style text naming the server, and returns a DLOCK_E* code.
 */
typedef struct dlock_backend {
    unsigned version;     /* DLOCK_BACKEND_VERSION */
    size_t size;          /* sizeof(dlock_backend) */
    const char *name;     /* "redis" */
    const char *const *schemes; /* NULL-terminated list of URL schemes served */

    /* Connect and check the connection (credentials, database). */
    int (*open)(void **out, const dlock_url *url, const dlock_client_options *opts);
    /* Close everything; NULL is a no-op. No other call is running. */
    void (*close)(void *be);

    /*
     * Try once, in one round trip where the service allows: take the lock
     * for owner with a lease of lease_ms and issue the next fence. DLOCK_OK
     * and *fence (> 0, strictly greater than any fence issued before for
     * name); DLOCK_EBUSY with *retry_ms set to how long the core may sleep
     * before it tries again if no release is announced: the holder's
     * remaining lease, -1 when unknown (the core then looks again every
     * second), INT64_MAX when the watch is certain to announce it. Must be
     * idempotent for the same owner: a retry after a lost reply returns the
     * fence already issued.
     *
     * watch is NULL for a try-once acquisition (leave nothing behind on
     * EBUSY), or the caller's watch from watch_begin when it is waiting: a
     * queue-based service (etcd, ZooKeeper) keeps its place in the queue in
     * the watch between tries.
     *
     * The core counts the lease from when it called acquire, so DLOCK_OK
     * must mean that the service set (or renewed) the lease for lease_ms
     * during this call, never earlier. A service may hand the lock to a
     * waiter as the holder releases it (Redis does: the release names the
     * next holder and keeps the lock for a short confirm window); the
     * waiter's next acquire then confirms it in one round trip, and a
     * message announcing the hand-off is only a reason to try, never a
     * lock by itself: it may come after the handed-over lease ran out.
     * *retry_ms is left alone on DLOCK_OK.
     */
    int (*acquire)(void *be, const char *name, const char *owner, int64_t lease_ms,
                   void *watch, uint64_t *fence, int64_t *retry_ms);
    /* Delete the lock if owner still holds it and wake waiters. DLOCK_OK, or
     * DLOCK_ELOST when it was not ours (and nothing was deleted). */
    int (*release)(void *be, const char *name, const char *owner);
    /* Set the lease to lease_ms from now if owner still holds it. */
    int (*extend)(void *be, const char *name, const char *owner, int64_t lease_ms);
    /* DLOCK_OK if owner holds the lock, DLOCK_ELOST if not. */
    int (*check)(void *be, const char *name, const char *owner);
    /* Renew n leases in as few round trips as possible, setting each
     * result. Returns DLOCK_OK when every result is set, else a connection
     * or protocol error and no result is to be trusted. */
    int (*renew)(void *be, dlock_renewal *items, size_t n);

    /*
     * Waiting without polling. watch_begin registers interest in releases of
     * name and returns only once the registration is active on the server,
     * so that a release after it returns is never missed. watch_wait sleeps
     * until a release is announced (DLOCK_OK) or timeout_ms passes
     * (DLOCK_ETIMEOUT). watch_end drops the registration, and whatever the
     * waiter queued unless its last acquire with this watch succeeded. A
     * backend should wake only as many waiters per release as can use it.
     */
    int (*watch_begin)(void *be, const char *name, void **watch);
    int (*watch_wait)(void *be, void *watch, int64_t timeout_ms);
    void (*watch_end)(void *be, void *watch);

    /* Read the state of name. */
    int (*status)(void *be, const char *name, dlock_lock_info *out);
    /* Delete the lock whoever holds it, wake waiters; *removed the state
     * just before (never NULL here). */
    int (*force_release)(void *be, const char *name, dlock_lock_info *removed);

    /*
     * ---- The lock family: optional. ----
     * A backend leaves these NULL (or is built against an older struct:
     * size tells) to have the core refuse the family's kinds and calls with
     * DLOCK_ENOTSUP. One that sets family_acquire must set the four
     * family_* calls and handle family kinds in renew.
     */

    /* As acquire, for req. DLOCK_EMISUSE for an owner that holds the lock
     * but may not take it again (not reentrant, read-write upgrade). */
    int (*family_acquire)(void *be, const dlock_request *req, void *watch, uint64_t *fence,
                          int64_t *retry_ms);
    /* As release, extend (req->lease_ms) and check, for req. */
    int (*family_release)(void *be, const dlock_request *req);
    int (*family_extend)(void *be, const dlock_request *req);
    int (*family_check)(void *be, const dlock_request *req);
    /* As watch_begin, for waiting on req; watch_wait / watch_end apply. */
    int (*family_watch_begin)(void *be, const dlock_request *req, void **watch);

    /* Turn the write lock req (kind WRITE) into a read lock held by the same
     * token, atomically, keeping its fence. DLOCK_ELOST if not ours. */
    int (*downgrade)(void *be, const dlock_request *req);
    /* Set the number of permits of semaphore name and wake its waiters. */
    int (*set_permits)(void *be, const char *name, int permits);

    /* 1 when multi_acquire can take these names in one atomic step. */
    int (*multi_same_slot)(void *be, const char *const *names, size_t n);
    /* Try once to take the plain mutexes names[i] for tokens[i], all or
     * none, issuing fences[i]. DLOCK_EBUSY with *busy the index of a name
     * held by another and *retry_ms as for acquire. Idempotent as acquire. */
    int (*multi_acquire)(void *be, const char *const *names, const char *const *tokens,
                         size_t n, int64_t lease_ms, uint64_t *fences, size_t *busy,
                         int64_t *retry_ms);

    /* Who leads election name (kind LEADER). */
    int (*leader_get)(void *be, const char *name, dlock_leader_info *out);
    /* As watch_begin, but woken by every change of leader of name, and by
     * watch_wake. */
    int (*observe_begin)(void *be, const char *name, void **watch);
    /* Wake the current or next watch_wait of watch. Thread-safe. */
    void (*watch_wake)(void *be, void *watch);
} dlock_backend;

#ifdef __cplusplus
}
#endif

#endif /* DLOCK_SYS_BACKEND_H */
