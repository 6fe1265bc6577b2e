/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the files of the Redis backend share: the backend's state, key
 * names, running a script on a command connection, and the watch a
 * waiter holds. Private to src/backends/redis.
 */
#ifndef DLOCK_REDIS_INT_H
#define DLOCK_REDIS_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "backends/redis/redis_conn.h"
#include "backends/redis/redis_mux.h"
#include "backends/redis/redis_watch.h"
#include "core/fmt.h"

/* Callers' connections for what does not go through the shared pipelined
 * one (mux; redis_mux.h): up to this many, each opened when concurrent
 * calls first need it; a call has one to itself for its round trip. */
#define DLOCK__REDIS_CMD_MAX 4

/* Waiters of one client that listen for a grant pushed to a list at once
 * (redis_listen.c), each on a connection of its own; more wait as before. */
#define DLOCK__REDIS_LISTEN_MAX 4

/* The fair waiters' places the subscriber thread keeps (redis_places.c). */
typedef struct dlock__redis_place dlock__redis_place;
typedef struct {
    pthread_mutex_t mu;
    dlock__redis_place *first;
    int64_t next_due_ms; /* no place is due before; INT64_MAX: none */
    int ready;
} dlock__redis_places;

typedef struct {
    char *prefix;
    pthread_mutex_t cmd_mu;    /* guards cmd_busy */
    pthread_cond_t cmd_freed;  /* a connection came back */
    dlock__redis_conn cmd[DLOCK__REDIS_CMD_MAX];
    int cmd_busy[DLOCK__REDIS_CMD_MAX];
    dlock__redis_mux mux; /* the scripts' connection (connections on a cluster) */
    dlock__redis_conn wd;
    dlock__redis_watcher *watcher;
    dlock__redis_places places;
    int no_threads; /* DLOCK_CLIENT_NO_THREADS: start connects, on the loop's thread */
    /* The listeners' connections and wake-up pipes (redis_listen.c; -1
     * until made), taken under cmd_mu. */
    dlock__redis_conn listen[DLOCK__REDIS_LISTEN_MAX];
    int listen_pipe[DLOCK__REDIS_LISTEN_MAX][2];
    int listen_busy[DLOCK__REDIS_LISTEN_MAX];
    atomic_int listen_off; /* 1: a BLPOP was refused (an ACL): nobody listens */
} dlock__redis_be;

/* prefix + '{' + name + '}' + suffix */
/* A cluster's hash tag for a name starting with '}' (dlock__redis_key). */
#define DLOCK__REDIS_ALT_TAG 64
#define DLOCK__REDIS_KEY_MAX (128 + DLOCK__REDIS_ALT_TAG + 4 + DLOCK_NAME_MAX + 32)

/* A lock the release hands to a waiter lives this long (or the waiter's
 * lease, if shorter) until the waiter's next try confirms it (release.lua):
 * a waiter that died or stalled in the hand-off slot keeps the lock from
 * everyone else for this long at most, whatever its lease. */
#define DLOCK__REDIS_HANDOFF_CONFIRM_MS 2000

/* How long a waiter of the plain mutex sleeps at most between tries (each
 * try keeps its hand-off entry alive), and how long the entry outlives it. */
static inline int64_t dlock__redis_handoff_refresh_ms(int64_t lease_ms)
{
    return lease_ms / 4 > 10 ? lease_ms / 4 : 10;
}

/* The keys that keep fences bounded (lib/fence.lua): one pair per prefix
 * on a single server, PREFIXfence-floor; one pair per prefix and hash slot
 * on a cluster, PREFIX{fence:N}fence-floor with fence:N in the slot of the
 * lock's keys (dlock__redis_slot_tag), so that a script never crosses a
 * slot (docs/redis-cluster.md). */
#define DLOCK__REDIS_FENCE_FLOOR "fence-floor"
#define DLOCK__REDIS_FENCE_REGISTRY "fence-registry"

typedef struct {
    char buf[DLOCK__REDIS_KEY_MAX];
    size_t len;
} dlock__redis_key_buf;

/* prefix{name}suffix (a cluster's name starting with '}': see redis.c) */
void dlock__redis_key(dlock__redis_key_buf *k, const dlock__redis_be *be, const char *name,
                      const char *suffix);
/* The fence floor and registry that name's fence counter answers to. */
void dlock__redis_fence_keys(dlock__redis_key_buf *floor, dlock__redis_key_buf *registry,
                             const dlock__redis_be *be, const char *name);

int dlock__redis_bad_reply(const dlock__redis_conn *conn, const char *what);

/* Take a command connection for one call (waiting while all are in use),
 * and give it back. An open one is preferred to one not yet opened. */
dlock__redis_conn *dlock__redis_cmd_take(dlock__redis_be *be);
void dlock__redis_cmd_give(dlock__redis_be *be, dlock__redis_conn *conn);

/* A script's keys then arguments, as the script calls take them. */
typedef struct {
    const char *argv[24];
    size_t lens[24];
    char nums[4][24];
    int argc, nnums;
} dlock__redis_args;

static inline void dlock__redis_arg(dlock__redis_args *a, const char *s, size_t len)
{
    a->argv[a->argc] = s;
    a->lens[a->argc++] = len;
}

static inline void dlock__redis_arg_str(dlock__redis_args *a, const char *s)
{
    dlock__redis_arg(a, s, strlen(s));
}

static inline void dlock__redis_arg_key(dlock__redis_args *a, const dlock__redis_key_buf *k)
{
    dlock__redis_arg(a, k->buf, k->len);
}

static inline void dlock__redis_arg_num(dlock__redis_args *a, long long v)
{
    char *buf = a->nums[a->nnums++];
    dlock__redis_arg(a, buf, dlock__fmt_ll(buf, v));
}

/*
 * What the scripts answer (each script's header says which): the owner-
 * checked ones (release, extend, renew, leave) an integer, the acquire
 * scripts {status, value}.
 */
enum {
    DLOCK__REDIS_NOT_OURS = 0,   /* not ours: nothing changed */
    DLOCK__REDIS_DONE = 1,
    DLOCK__REDIS_BUSY = 0,       /* acquire: {0, retry ms}, another holds it */
    DLOCK__REDIS_TAKEN = 1,      /* acquire: {1, fence} */
    DLOCK__REDIS_HANDED = 2,     /* acquire: {2, fence}, a hand-off confirmed */
    DLOCK__REDIS_REFUSED = -1,   /* acquire: {-1, DLOCK__REDIS_WHY_*} */
    DLOCK__REDIS_NO_PERMITS = -2 /* sem_acquire: {-2, 1}, no N for the name */
};
/* Why an acquire script refused an owner id that holds the lock. */
enum {
    DLOCK__REDIS_WHY_HELD = 1,       /* held by this owner, not reentrant */
    DLOCK__REDIS_WHY_OTHER_KIND = 2, /* held by this owner as another kind */
    DLOCK__REDIS_WHY_UPGRADE = 3     /* a reader asks for the write lock */
};

/* Run a script on the shared pipelined connection (redis_mux.h). */
int dlock__redis_cmd_script(dlock__redis_be *be, const dlock__redis_script *s,
                            redisReply **out, int nkeys, int argc, const char **argv,
                            const size_t *lens);

/*
 * What a waiter holds between watch_begin and watch_end. leave is set while
 * the waiter has left something on the server that must go if it gives up
 * (a place in a fair queue, a writer-waiting marker).
 */
typedef struct {
    dlock__redis_waiter *waiter;
    int leave;
    char *name;  /* for leave */
    /* For leave: the waiter's random id (the family's queue place or writer
     * marker), or, once a plain mutex's waiter has made its hand-off entry,
     * its owner token (mutex_leave.lua gives back a lock handed to it). */
    char *token;
    /* A plain mutex's waiter: its hand-off entry "WAITER-ID TOKEN LEASE"
     * (acquire.lua; NULL until the first try that waits). */
    char *entry;
    /* A fair waiter's place, while the subscriber thread keeps it. */
    dlock__redis_place *place;
    /* A plain mutex's waiter that listens for its grant (redis_listen.c):
     * listens, its entry says so ("... L"); in_slot, its last try found
     * its entry in the slot; bound_ms, no grant of this wait was pushed
     * before (0 before its first try); granted, a fence popped and not yet
     * taken by a try; ln, the connection (NULL: none taken) of be's
     * listen[ln_slot], ln_out with a BLPOP outstanding, sent at ln_sent_ms,
     * overdue at ln_due_ms. */
    int listens, in_slot;
    int told; /* watch_notify'd: it never listens (redis.c) */
    /* A waiter of the family that may listen (redis_family.c): its owner
     * token and owner value, with which leave.lua gives back a hold handed
     * to it after its last try (NULL when it never could). */
    char *grant_token, *grant_value;
    int64_t lease_ms, bound_ms;
    uint64_t granted;
    dlock__redis_conn *ln;
    int ln_slot, ln_out;
    int64_t ln_sent_ms, ln_due_ms;
} dlock__redis_watch;

/* ---- redis_listen.c: a grant pushed to the waiter's list ---- */

/* Whether this client's waiters may listen: one server or a Sentinel's
 * master, without min_replicas (whose WAIT a confirming try pairs), and no
 * BLPOP refused so far. */
int dlock__redis_listen_on(dlock__redis_be *be);
/* Take a listener's connection for w now (a fair waiter, before the try
 * whose entry says it listens): 1 taken, 0 none free (it does not listen). */
int dlock__redis_listen_take(dlock__redis_be *be, dlock__redis_watch *w);
/* The wait of a waiter that listens: DLOCK_OK when woken (w->granted set
 * when a grant came), DLOCK_ETIMEOUT after timeout_ms. */
int dlock__redis_listen_wait(dlock__redis_be *be, dlock__redis_watch *w, int64_t timeout_ms);
/* After a grant came (w->granted): 1 with *out the lock's fence and lease,
 * or 0 when a try must confirm it (the bound leaves too little of the
 * lease, or nothing will renew it). */
int dlock__redis_listen_granted(dlock__redis_watch *w, const dlock_request *req,
                                dlock_acquire_result *out);
/* Give back the waiter's connection (its watch ends). */
void dlock__redis_listen_end(dlock__redis_be *be, dlock__redis_watch *w);
/* Close the listeners' connections and pipes (the client closes). */
void dlock__redis_listen_close(dlock__redis_be *be);

/* Subscribe to channel for a waiter, known by the random id token (see
 * dlock__redis_watch_begin; never an owner token, which must not travel on
 * a channel); name and token (may be NULL) are kept for a later leave. */
int dlock__redis_watch_open(dlock__redis_be *be, const char *channel, const char *name,
                            const char *token, dlock__redis_watch **out);
/* Leave what the waiter queued (if anything), unsubscribe, free. */
void dlock__redis_watch_close(dlock__redis_be *be, dlock__redis_watch *watch);

/* ---- redis_places.c: fair waiters' places, kept in batches ---- */

int dlock__redis_places_init(dlock__redis_places *ps);
void dlock__redis_places_destroy(dlock__redis_places *ps);
/* After a fair waiter's try queued it (or kept its place) in the queue of
 * the lock whose base key is key: have the subscriber thread keep the place
 * from now on, and wake the waiter when its turn may have come. Returns 1
 * (and sets *retry_ms to the waiter's own recheck) when it does, 0 when the
 * waiter keeps its own place (a cluster; no memory). */
int dlock__redis_place_keep(dlock__redis_be *be, dlock__redis_watch *w, const char *key,
                            int64_t ttl_ms, int64_t *retry_ms);
/* Stop keeping w's place (before its waiter leaves the queue). */
void dlock__redis_place_drop(dlock__redis_be *be, dlock__redis_watch *w);
/* The subscriber thread's upkeep: ms until it is due again, -1 never. */
int64_t dlock__redis_places_upkeep(void *be);

/* ---- redis_family.c: the lock family (dlock_backend's optional calls) ---- */

int dlock__redis_family_acquire(void *be, const dlock_request *req, void *watch,
                                dlock_acquire_result *out);
int dlock__redis_family_release(void *be, const dlock_request *req);
int dlock__redis_family_extend(void *be, const dlock_request *req);
int dlock__redis_family_check(void *be, const dlock_request *req);
int dlock__redis_family_watch_begin(void *be, const dlock_request *req, void **watch);
int dlock__redis_downgrade(void *be, const dlock_request *req);
int dlock__redis_set_permits(void *be, const char *name, int permits);
int dlock__redis_multi_atomic(void *be, const dlock_request *reqs, size_t n);
int dlock__redis_multi_acquire(void *be, const dlock_request *reqs, size_t n, uint64_t *fences,
                               dlock_acquire_result *out);
int dlock__redis_leader_get(void *be, const char *name, dlock_leader_info *out);
int dlock__redis_observe_begin(void *be, const char *name, void **watch);

/* Renew or check (renew 0) items of any kind on conn (NULL: a command
 * connection), in one round trip. */
/* The renew script's arguments for items (renew: "renew", else "check"),
 * in one allocation (*out, the caller's to free; the requests' strings
 * borrowed), and its reply read into items' results. */
int dlock__redis_renew_args(dlock__redis_be *be, const dlock_renewal *items, size_t n, int renew,
                            void **out, int *argc, const char ***argv, size_t **lens);
int dlock__redis_renew_reply(const dlock__redis_conn *conn, const redisReply *r,
                             dlock_renewal *items, size_t n);
int dlock__redis_family_renew(dlock__redis_be *be, dlock__redis_conn *conn,
                              dlock_renewal *items, size_t n, int renew);

/* The backend's status, holders, force_release and list (redis_status.c). */
int dlock__redis_status(void *be, const char *name, dlock_lock_info *out);
int dlock__redis_holders(void *be, const char *name, dlock_list_cb cb, void *payload);
int dlock__redis_force_release(void *be, const char *name, dlock_lock_info *removed);
int dlock__redis_list(void *be, const char *name_prefix, dlock_list_cb cb, void *payload);

#endif
