/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the files of the etcd backend share: the backend's state, the keys
 * and lease of one acquisition, the requests and lease calls every
 * operation makes, and the state a waiting acquisition keeps. Private to
 * src/backends/etcd. The design is told at the top of etcd.c.
 *
 *   etcd.c        open/close, release, extend, check, renew and the
 *                 backend table
 *   etcd_status.c status, holders, force release, list
 *   etcd_keys.c   names: a lock's directory, its key and lease IDs, the
 *                 key ids lent for reuse, the range requests that read them
 *   etcd_lease.c  one request on the backend's connection, reply checks,
 *                 the lease calls (grant, revoke, keepalive, TTL left), and
 *                 the lease source the acquisitions take their leases from
 *   etcd_queue.c  acquiring: a try that will not wait, and the tries of a
 *                 waiting acquisition in the queue of keys (enqueue, promote)
 *   etcd_multi.c  multi-locks: several mutexes in one txn
 *   etcd_wait.c   waiting between tries: the watch of the key ahead, the
 *                 observer's watch of a directory, wake-ups
 *   etcd_elect.c  leader election: the leader, and an observer's start
 *   etcd_spare.c  spare leases granted ahead of need, and the leases the
 *                 acquisitions hold (release is one revoke)
 *   etcd_owner.c  owner ids and reentrancy: hold keys beside the queue
 *   etcd_family.c the read-write lock and the semaphore in the same queue:
 *                 kinds in the values, who of the queue holds, a
 *                 semaphore's N, downgrade, and the holders status reads
 *   etcd_async.c  the asynchronous API's try and release, sent without
 *                 blocking on the loop's thread (etcd_loop.c carries them)
 */
#ifndef DLOCK_ETCD_INT_H
#define DLOCK_ETCD_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "backends/etcd/etcd_codec.h"
#include "backends/etcd/etcd_http.h"
#include "backends/etcd/etcd_watch.h"

typedef struct dlock__etcd_spares dlock__etcd_spares;
typedef struct dlock__etcd_watch dlock__etcd_watch;

/* The client's waiting lease (etcd_session.c): the keys its waiters queue
 * share it, kept alive by the spare thread (etcd_spare.c) while any waits. */
typedef struct dlock__etcd_drop {
    char *key;
    struct dlock__etcd_drop *next;
} dlock__etcd_drop;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int64_t id;            /* 0: none, or the last one was found gone */
    int64_t ttl;           /* seconds */
    int64_t ok_ms;         /* send time of the grant or keepalive that last found it alive */
    int64_t ka_retry_at;   /* the thread's keepalive failed: the next not before */
    int64_t drop_retry_at; /* a delete of drops failed: the next not before */
    int busy;              /* a waiter grants or keeps it alive now: the others wait */
    size_t n;              /* waiters joined (list) */
    dlock__etcd_watch *list;
    dlock__etcd_drop *drops; /* keys of waiters that left, whose delete failed */
} dlock__etcd_waiting;

/* The client's session lease of one TTL (etcd_session.c). */
typedef struct {
    int64_t ttl;     /* seconds; 0: the slot is free */
    int64_t id;      /* 0: none granted, or the last one ran out */
    int64_t ok_ms;   /* send time of the grant or keepalive that last found it alive */
    int64_t used_ms; /* last time an acquisition took it */
} dlock__etcd_session;

/* TTLs with a session lease at a time per client. */
#define DLOCK__ETCD_SESSIONS 8

/* Key ids kept for reuse (etcd_keys.c), at most. */
#define DLOCK__ETCD_FREE_IDS 64

/* A key id lent to the acquisition of token (etcd_keys.c). */
typedef struct {
    char token[DLOCK_BACKEND_TOKEN_LEN + 1];
    int64_t id;
} dlock__etcd_loan;

typedef struct {
    dlock__etcd *http;
    char *prefix;
    char *value;          /* what every lock key holds: the client name */
    dlock__etcd_conn *wd; /* the watchdog thread's alone */
    dlock__etcd_spares *spares; /* etcd_spare.c */
    /* The session leases of the auto-renewed locks (etcd_session.c). */
    pthread_mutex_t sessions_mu;
    dlock__etcd_session sessions[DLOCK__ETCD_SESSIONS];
    dlock__etcd_waiting waiting; /* the waiters' shared lease (etcd_session.c) */
    /* The server answered at open runs an etcd before 3.4.25 / 3.5.8, whose
     * stale leader may answer a keepalive (or whose version could not be
     * read): each renewal is confirmed by the lease's TTL (etcd_renew). */
    int confirm_renewals;
    /* Key ids (etcd_keys.c): those whose keys are known gone, for the next
     * acquisitions, and those lent to the acquisitions under way. */
    pthread_mutex_t ids_mu;
    int64_t free_ids[DLOCK__ETCD_FREE_IDS];
    int nfree;
    dlock__etcd_loan *lent;
    size_t nlent, lent_cap;
    dlock__etcd_loop *loop; /* the asynchronous API's requests (etcd_async.c) */
} dlock__etcd_be;

/* ---- etcd_keys.c: names ------------------------------------------------- */

typedef struct {
    char *dir;     /* prefix + escaped name + '/' */
    char *dir_end; /* end of the queue's key range: dir + "g", past the 16
                    * hex digits of every queued key; a semaphore's N
                    * (dir + "permits") is outside it */
    char *dir_all; /* end of every key of the name (the queue and N) */
    char *key;     /* dir + id: this owner's key */
    int64_t ttl;   /* seconds */
    int64_t lease;
    const char *value; /* what the key holds: the client name, or a leader's
                        * identity (borrowed) */
} dlock__etcd_keys;

/* Lease IDs the client chooses: a spare's (etcd_spare.c) has bit 62 set
 * and bit 61 clear, a session lease's (etcd_session.c) both set, one
 * derived from a token (etcd_keys.c) both clear. */
#define DLOCK__ETCD_SPARE_BIT (1ULL << 62)
#define DLOCK__ETCD_SESSION_BIT (1ULL << 61)
#define DLOCK__ETCD_ID_BITS (DLOCK__ETCD_SPARE_BIT | DLOCK__ETCD_SESSION_BIT)
#define DLOCK__ETCD_IS_SPARE(id) (((uint64_t)(id) & DLOCK__ETCD_ID_BITS) == DLOCK__ETCD_SPARE_BIT)
#define DLOCK__ETCD_IS_SESSION(id) (((uint64_t)(id) & DLOCK__ETCD_ID_BITS) == DLOCK__ETCD_ID_BITS)

/* The lease ID of (owner, ttl): derived, so that every call finds it. */
int64_t dlock__etcd_lease_for(const char *owner, int64_t ttl);
/* The id that names the keys of the acquisition of token: the one lent to
 * it, else the first half of the token. */
int64_t dlock__etcd_key_id(dlock__etcd_be *be, const char *token);
/* The acquisition of token begins (its first try, or its first through a
 * watch): lend it an id whose key is known gone, when there is one and it
 * has none yet. */
void dlock__etcd_key_id_lend(dlock__etcd_be *be, const char *token);
/* token's key is known gone from the server (a delete answered), or was
 * never put: its id may name a later acquisition's keys. The loan ends. */
void dlock__etcd_key_id_free(dlock__etcd_be *be, const char *token);
/* A busy try put nothing: its loan ends and the lent id goes back. An
 * unlent token's own id does not: its acquisition may go on (a wait) and
 * keeps naming its key by it, which must not be lent to another meanwhile. */
void dlock__etcd_key_id_give_back(dlock__etcd_be *be, const char *token);
/* The acquisition of token ended otherwise: its loan ends, the id is not
 * reused. */
void dlock__etcd_key_id_drop(dlock__etcd_be *be, const char *token);
/* owner may be NULL (status, force release: the directory only). */
int dlock__etcd_keys_make(dlock__etcd_keys *k, dlock__etcd_be *be, const char *name,
                          const char *owner, int64_t lease_ms);
void dlock__etcd_keys_free(dlock__etcd_keys *k);
/* kv is the key named key. */
int dlock__etcd_same_key(const dlock__etcd_kv *kv, const char *key);

/* Range requests, bare (for /v3/kv/range) or as a txn operation (as_op). */
json_t *dlock__etcd_as_op(json_t *range);
json_t *dlock__etcd_range_first(const dlock__etcd_keys *k);
json_t *dlock__etcd_range_ahead(const dlock__etcd_keys *k, int64_t rev);
json_t *dlock__etcd_range_key(const char *key);

/* ---- etcd_lease.c: requests and leases ---------------------------------- */

int dlock__etcd_bad_reply(dlock__etcd_be *be, const char *what);
/* Run req (consumed) on path. */
int dlock__etcd_be_call(dlock__etcd_be *be, dlock__etcd_conn *c, const char *path, json_t *req,
                        json_t **reply);
/* The first key of a range reply: 1 found (*kv filled), 0 none, or an error. */
int dlock__etcd_read_kv(dlock__etcd_be *be, const json_t *range, dlock__etcd_kv *kv,
                        const char *what);
/* Grant the lease; one that exists already is ours (a retry). */
int dlock__etcd_grant(dlock__etcd_be *be, dlock__etcd_conn *c, int64_t lease, int64_t ttl);
/* Revoke the lease, deleting what is attached. A lease already gone is fine.
 * A session lease (DLOCK__ETCD_IS_SESSION) is never revoked here, whoever
 * asks (an operator's force release too): it backs the keys of other locks
 * of its client, which a release deletes one by one. */
int dlock__etcd_lease_revoke(dlock__etcd_be *be, dlock__etcd_conn *c, int64_t lease);
/* Lease left in ms: -1 for no lease (a key set by hand), 0 when expired. */
int dlock__etcd_lease_left(dlock__etcd_be *be, dlock__etcd_conn *c, int64_t lease,
                           int64_t *left_ms);
/* The answers of a keepalive stream for ids[0..n) into alive[] (see
 * etcd_lease.c). */
/* lease_left's request and the judging of its reply (consumed; rc and
 * grpc_code as the call ended), for a request sent without blocking. */
json_t *dlock__etcd_ttl_request(int64_t lease);
int dlock__etcd_ttl_reply(dlock__etcd_be *be, int rc, dlock__grpc_status grpc_code,
                          json_t *reply, int64_t *left_ms);
int dlock__etcd_keepalive_results(dlock__etcd_be *be, const json_t *results, const int64_t *ids,
                                  size_t n, int *alive);
/* Keep leases ids[0..n) alive: alive[i] 1 renewed, 0 gone. */
int dlock__etcd_keepalive(dlock__etcd_be *be, dlock__etcd_conn *c, const int64_t *ids, size_t n,
                          int *alive);

/* ---- etcd_lease.c: the lease source ------------------------------------- */

/*
 * The lease an acquisition puts its key on, from one source: a spare of the
 * pool (etcd_spare.c) when one is ready, else one granted now under the ID
 * derived from the token. The queue and its callers never see which: they
 * take a lease, put their key on it in a txn that also confirms it alive
 * when it must (lease_txn), and then hold it (lease_hold) or give it back
 * (lease_give_back). Which lease it was matters only to the source, and to
 * a release (etcd.c), which may hand a spare back to the pool.
 */
typedef struct {
    int64_t own;   /* the ID granted when no spare is ready */
    int64_t ttl;   /* seconds */
    int64_t id;    /* the lease taken; 0: none */
    int64_t ok_ms; /* send time of the grant or keepalive that last found id
                    * alive; 0: not known (an error left it in doubt) */
    int pooled;    /* etcd_lease.c's alone: a spare the pool still counts as
                    * taken, which may go back to it */
    /* Set by the caller after lease_init: the key goes on the client's
     * session lease of this TTL (etcd_session.c), shared with its other
     * auto-renewed locks, instead of a spare or a lease of its own; key
     * (borrowed) is the key the txn puts, which a failure deletes by name,
     * as the lease cannot be revoked. */
    int session;
    const char *key;
} dlock__etcd_lease;

/* How lease_take may get a lease. */
enum {
    DLOCK__ETCD_TAKE_ANY,   /* one ready (no request), else a grant */
    DLOCK__ETCD_TAKE_READY, /* only one ready: DLOCK__ETCD_LEASE_NONE if not */
    DLOCK__ETCD_TAKE_GRANT  /* a grant: a lease whose release never pools it
                             * (the family's), or after LEASE_GONE */
};
/* lease_take: no lease is ready (TAKE_READY). */
#define DLOCK__ETCD_LEASE_NONE 2
/* lease_txn: the lease ran out before it was confirmed, taking whatever
 * the txn put on it (or that was revoked): take another, by a grant. */
#define DLOCK__ETCD_LEASE_GONE 1

/* A source for keys of TTL ttl seconds whose own lease ID is own. */
void dlock__etcd_lease_init(dlock__etcd_lease *l, int64_t own, int64_t ttl);
/* Take a lease into l (how: DLOCK__ETCD_TAKE_*): l->id, and l->ok_ms the
 * send time of the request that last found it alive (a grant made now: its
 * own send time). After a failed grant l->id is set all the same (its reply
 * may be lost): the caller gives it back. */
int dlock__etcd_lease_take(dlock__etcd_be *be, dlock__etcd_conn *c, dlock__etcd_lease *l,
                           int how);
/* Send txn (consumed), which puts a key on l->id, with the lease known
 * alive from since_ms on: alone when l->ok_ms >= since_ms, else beside a
 * keepalive of the lease in the same round trip (l->ok_ms then its send
 * time). DLOCK_OK and *reply (the caller's); DLOCK__ETCD_LEASE_GONE; or an
 * error, after which l->id may back the key: hold it, give it back, or
 * leave it to run out (lease_drop). */
int dlock__etcd_lease_txn(dlock__etcd_be *be, dlock__etcd_conn *c, dlock__etcd_lease *l,
                          int64_t since_ms, json_t *txn, json_t **reply);
/* The end of a txn on a lease confirmed recently that failed with rc
 * (grpc_code its status): DLOCK__ETCD_LEASE_GONE when the lease ran out,
 * else rc; the lease is the pool's no more. */
int dlock__etcd_lease_txn_failed(dlock__etcd_be *be, dlock__etcd_lease *l, int rc,
                                 dlock__grpc_status grpc_code);
/* A key of the acquisition of token is on l: noted in the held table (with
 * what a release needs to reuse it), and no longer the pool's. */
int dlock__etcd_lease_hold(dlock__etcd_be *be, const char *token, dlock__etcd_lease *l);
/* l backs no key (a txn said so, or none was sent), alive as of l->ok_ms:
 * kept for the next acquire, or revoked on c (c NULL: by the spare thread,
 * else left to run out). Nothing when l holds none. */
void dlock__etcd_lease_give_back(dlock__etcd_be *be, dlock__etcd_conn *c, dlock__etcd_lease *l);
/* What l backs is not known (an error): left to run out, as nothing keeps
 * it alive (a release deletes the key by its name). */
void dlock__etcd_lease_drop(dlock__etcd_be *be, dlock__etcd_lease *l);

/* ---- etcd_spare.c: spare leases, held leases ----------------------------- */

/* TTLs with a spare at a time per client: one uses one or two lease lengths. */
#define DLOCK__ETCD_SPARES 4
/* Spares kept per TTL: the one a release gave back, and those granted
 * while locks of this TTL were held at once. */
#define DLOCK__ETCD_SPARE_POOL 4
/* Spare lease IDs at most, for the watchdog's renewal request. */
#define DLOCK__ETCD_SPARE_IDS (DLOCK__ETCD_SPARES * DLOCK__ETCD_SPARE_POOL)

int dlock__etcd_spares_new(dlock__etcd_be *be);
/* Stop the spare thread and revoke the spares. */
void dlock__etcd_spares_free(dlock__etcd_be *be);
/* The pool's side of the lease source (etcd_lease.c), its only user. 1,
 * *lease and *ok_ms: a spare of ttl seconds, alive by its last
 * confirmation, whose request was sent at *ok_ms. Wakes the spare thread
 * when it has a grant to make. */
int dlock__etcd_spare_take(dlock__etcd_be *be, int64_t ttl, int64_t *lease, int64_t *ok_ms);
/* Start the spare thread, or wake it: it has work on the waiting lease. */
void dlock__etcd_spares_wake(dlock__etcd_be *be);
/* Revoke lease, which backs no key any more, in the spare thread (on c
 * when it cannot take it). */
void dlock__etcd_revoke_later(dlock__etcd_be *be, dlock__etcd_conn *c, int64_t lease);
/* The spares' IDs (up to max) to keep alive in the watchdog's renewal,
 * and what it found of each, sent at sent_ms. */
size_t dlock__etcd_spares_alive(dlock__etcd_be *be, int64_t *ids, size_t max);
void dlock__etcd_spare_renewed(dlock__etcd_be *be, int64_t lease, int alive, int64_t sent_ms);
/* The spare taken for ttl is used up: the thread grants the next, when
 * none is left. */
void dlock__etcd_spare_used(dlock__etcd_be *be, int64_t ttl);
/* A spare taken but not used, confirmed alive at ok_ms: kept, or revoked. */
void dlock__etcd_spare_return(dlock__etcd_be *be, dlock__etcd_conn *c, int64_t ttl,
                              int64_t lease, int64_t ok_ms);
/* A spare lease whose release deleted the key it backed, alive at ok_ms:
 * back to the pool of its TTL, or revoked. */
void dlock__etcd_spare_reuse(dlock__etcd_be *be, dlock__etcd_conn *c, int64_t ttl,
                             int64_t lease, int64_t ok_ms);
/* The lease the acquisition of token holds (lease 0: not known). */
int dlock__etcd_held_set(dlock__etcd_be *be, const char *token, int64_t lease, int64_t ttl);
/* 1 and *lease, *ttl when token's lease is in the table, else 0. */
int dlock__etcd_held_get(dlock__etcd_be *be, const char *token, int64_t *lease, int64_t *ttl);
void dlock__etcd_held_drop(dlock__etcd_be *be, const char *token);
/* A keepalive sent at ok_ms found token's lease alive. */
void dlock__etcd_held_alive(dlock__etcd_be *be, const char *token, int64_t lease, int64_t ok_ms);
/* Get and drop token's entry: 1 when there was one, with the send time of
 * the last keepalive that found its lease alive (0: not known). */
int dlock__etcd_held_take(dlock__etcd_be *be, const char *token, int64_t *lease, int64_t *ttl,
                          int64_t *ok_ms);

/* ---- etcd_session.c: session leases ------------------------------------- */

void dlock__etcd_sessions_init(dlock__etcd_be *be);
/* Revoke the session leases (the client closes). */
void dlock__etcd_sessions_free(dlock__etcd_be *be);
/* 1, *lease and *ok_ms: the session lease of ttl seconds, which the
 * server still has by its last confirmation (sent at *ok_ms); else 0. */
int dlock__etcd_session_get(dlock__etcd_be *be, int64_t ttl, int64_t *lease, int64_t *ok_ms);
/* Grant a new session lease of ttl seconds, on c: DLOCK_OK, *lease and
 * *ok_ms (the grant's send time); it becomes the one of its TTL. */
int dlock__etcd_session_grant(dlock__etcd_be *be, dlock__etcd_conn *c, int64_t ttl,
                              int64_t *lease, int64_t *ok_ms);
/* A request sent at sent_ms found lease (a session lease) alive, or gone. */
void dlock__etcd_session_seen(dlock__etcd_be *be, int64_t lease, int alive, int64_t sent_ms);
/* Delete key, which was this client's, by name (best effort): for a key
 * on a session lease, what a revoke does for a key on a lease of its own. */
void dlock__etcd_session_key_drop(dlock__etcd_be *be, dlock__etcd_conn *c, const char *key);

/*
 * The waiting lease: the keys of the client's waiters (whose locks' leases
 * are longer than the wait's) queue on one lease of ttl seconds, as the
 * keys of a concurrency.Session share its lease. Its ID is a session
 * lease's (both bits: dlock__etcd_lease_revoke leaves it), chosen here. A
 * waiter joins before it puts its key and leaves when the key moved to the
 * holder's lease (promote) or was deleted (the wait ended); while any is
 * joined, the spare thread keeps the lease alive every third of its TTL
 * (dlock__etcd_waiting_job), one keepalive whatever their number, and when
 * it finds the lease gone it wakes every waiter joined (watch_wake), whose
 * next try queues again on a new one. With no waiter joined nothing keeps
 * it alive: it runs out, and the key of a waiter whose delete never got
 * through with it.
 */
void dlock__etcd_waiting_init(dlock__etcd_be *be);
/* Revoke the waiting lease (the client closes; no waiter is left). */
void dlock__etcd_waiting_free(dlock__etcd_be *be);
/* w joins (once), and gets the waiting lease of ttl seconds, granted or
 * kept alive on c when the last confirmation is too old: *lease, *ok_ms
 * (the send time of the request that last found it alive). */
int dlock__etcd_waiting_get(dlock__etcd_be *be, dlock__etcd_conn *c, dlock__etcd_watch *w,
                            int64_t ttl, int64_t *lease, int64_t *ok_ms);
/* A request sent at sent_ms found lease alive, or gone (every waiter
 * joined is woken, the next get grants another). */
void dlock__etcd_waiting_seen(dlock__etcd_be *be, int64_t lease, int alive, int64_t sent_ms);
/* w's key is off the waiting lease (moved, or deleted): w leaves. */
void dlock__etcd_waiting_leave(dlock__etcd_be *be, dlock__etcd_watch *w);
/* w left the queue without the lock: delete its key, by name (the
 * waiting lease backs the keys of other waiters); a delete that fails is
 * made again by the spare thread. */
void dlock__etcd_waiting_drop_key(dlock__etcd_be *be, dlock__etcd_conn *c, const char *key);
/* The spare thread's turn, on its connection c: the waiting lease's
 * keepalive when due, a failed delete again. 1 when it made a call; else
 * 0, *next lowered to when it will. */
int dlock__etcd_waiting_job(dlock__etcd_be *be, dlock__etcd_conn *c, int64_t now,
                            int64_t *next);

/* ---- etcd_queue.c and etcd_wait.c: acquiring and waiting ---------------- */

/*
 * What a waiting acquisition keeps between its tries: its key and lease, its
 * place in the queue (the key's create revision), the key just ahead and the
 * stream watching it.
 */
struct dlock__etcd_watch {
    dlock__etcd_keys k; /* k.key is NULL until the first acquire through the
                         * watch; k.lease and k.ttl are the short lease the
                         * key waits on */
    /* The key waits on the client's waiting lease (etcd_session.c), shared
     * with its other waiters, not on a lease of its own; joined: w is on
     * the waiting lease's list (wl_prev, wl_next). */
    int shared_wait, joined;
    dlock__etcd_watch *wl_prev, *wl_next;
    /* A connection of the pool taken at the end of a wait, for the next
     * try (NULL: none): a try waits for a connection (the pool lends at
     * most a few at once) before the core counts the lease from its start,
     * not after, so 10,000 waiters woken at once do not each count their
     * lease from a queue of the others' tries. */
    dlock__etcd_conn *conn;
    dlock__etcd_lease hold; /* the holder's lease, which the key moves to at
                             * the head of the queue (promote); hold.own is
                             * k.lease when the key waits on it already.
                             * hold.id: taken, not yet ours for good */
    char *name;
    int granted;           /* the lease exists, as far as we know */
    int64_t lease_ok_ms;   /* when the last grant or keepalive that succeeded was sent */
    int64_t keepalive_at;  /* next keepalive while waiting */
    int64_t myrev;         /* our key's create revision, 0 when not known */
    int won;               /* the last acquire through this watch took the lock */
    /* The acquisition that tried through this watch (etcd.c), and whether
     * its last try took the lock (a re-entry too): its key id's loan ends
     * with the watch otherwise. "" before the first try. */
    char token[DLOCK_BACKEND_TOKEN_LEN + 1];
    int took;
    int kind;              /* DLOCK_KIND_*: READ and SEMAPHORE decide in
                            * etcd_family.c */
    int permits;           /* SEMAPHORE: N to store when none is */
    char *ahead;           /* the key to wait for, NULL when none */
    char *ahead_end;       /* NULL: wait for ahead's deletion; else wake on any
                            * change of the keys from ahead to ahead_end */
    int64_t ahead_from;    /* watch it from this revision */
    dlock__etcd_stream *stream;
    int stream_failures;   /* in a row, for the back-off */
    int64_t stream_retry_at;
    char *value;           /* a leader's identity (k.value points here) */

    /* watch_wake from another thread (dlock_client_interrupt, an observer's
     * stop) sets woken and writes to wake_fd, which every sleep polls. An
     * election's observer is also woken by any change of the directory. */
    int observe;
    int wake_fd;
    atomic_int woken;
    /* watch_notify's: set once, before the watch is shared (wake_fd is then
     * -1: nobody sleeps in watch_wait), and called instead of a sleep's end
     * (dlock__etcd_watch_arm). NULL: the waiter sleeps in watch_wait. */
    void (*notify)(void *);
    void *notify_arg;
};

/* Acquire once (w NULL: a try that never waits) or as a try of the waiting
 * acquisition w. value: what the key holds (NULL: the client name). kind
 * and permits as in dlock_request. session: the held key goes on the
 * client's session lease (an auto-renewed plain lock, etcd.c). */
int dlock__etcd_acquire_as(dlock__etcd_be *be, const char *name, const char *owner,
                           int64_t lease_ms, const char *value, int kind, int permits,
                           int session, dlock__etcd_watch *w, uint64_t *fence,
                           int64_t *retry_ms, int64_t *lease_from_ms);

/*
 * A try that never waits, in two halves, for a request sent without
 * blocking (etcd_async.c), as the blocking try makes it when its lease is
 * ready: try_begin takes the lease without a request (a spare, or the
 * session lease for session, confirmed within the last twentieth of its
 * TTL) and builds the acquire txn for k, DLOCK_ENOTSUP when that needs a
 * request (a grant, a keepalive); try_end reads the txn's reply (consumed):
 * DLOCK_OK with *fence (and *lease_from_ms lowered to the lease's
 * confirmation), or DLOCK_EBUSY with *holder_lease the holder's lease (0:
 * none known), l given back.
 */
int dlock__etcd_try_begin(dlock__etcd_be *be, const dlock__etcd_keys *k, int session,
                          dlock__etcd_lease *l, json_t **txn);
int dlock__etcd_try_end(dlock__etcd_be *be, const dlock__etcd_keys *k, dlock__etcd_lease *l,
                        const char *owner, json_t *reply, uint64_t *fence,
                        int64_t *lease_from_ms, int64_t *holder_lease);

/* ---- etcd.c, for etcd_async.c ------------------------------------------- */

/* A try that will not wait ended with rc: its key id's loan (etcd_keys.c)
 * given back when nothing was put (busy), dropped when it failed for sure,
 * kept when its outcome is not known (the core's release ends it) or it
 * was not made (DLOCK_ENOTSUP: the blocking try makes it). */
void dlock__etcd_try_loan_end(dlock__etcd_be *be, const char *token, int kind, int rc);
/* The key of a plain auto-renewed lock goes on the session lease. */
int dlock__etcd_on_session(const dlock_request *req);
/* What req's key holds (*value malloc'd; NULL for a candidate's, whose
 * identity it holds). */
int dlock__etcd_key_value(dlock__etcd_be *be, const dlock_request *req, char **value);
/* A release by the delete of its key on a spare lease: the request, and
 * its reply (consumed; rc as the call ended) judged: DLOCK_OK, the lease
 * reused or revoked (on c; c NULL: off the caller's thread), or
 * DLOCK_ENOTSUP when the reply does not show the key deleted on it. */
json_t *dlock__etcd_delete_request(const char *key);
int dlock__etcd_release_deleted(dlock__etcd_be *be, dlock__etcd_conn *c, const char *owner,
                                int rc, json_t *reply, int64_t lease, int64_t ttl,
                                int64_t ok_ms);

/* The release of a key on a session lease (or on none known) by its
 * delete: the reply (consumed; rc as the call ended) judged: DLOCK_OK, or
 * DLOCK_ELOST when the key was gone. */
int dlock__etcd_key_deleted(dlock__etcd_be *be, dlock__etcd_conn *c, const char *owner, int rc,
                            json_t *reply);

/* ---- etcd_async.c: the backend's start, async_fds and async_step --------- */

int dlock__etcd_start(void *be, int op, const dlock_request *req, dlock_acquire_result *res,
                      void (*done)(void *arg, int rc), void *arg);
int dlock__etcd_async_fds(void *be, int *fds, unsigned *gens, int max);
int64_t dlock__etcd_async_step(void *be);

/* The backend's multi_atomic and multi_acquire (etcd_multi.c): all names
 * in one txn. */
int dlock__etcd_multi_atomic(void *arg, const dlock_request *reqs, size_t n);
int dlock__etcd_multi_acquire(void *arg, const dlock_request *reqs, size_t n, uint64_t *fences,
                              dlock_acquire_result *out);

/* A new waiting state for name, with its wake-up eventfd. */
int dlock__etcd_watch_new(const char *name, dlock__etcd_watch **out);

/* The backend's watch calls (dlock_backend's watch_begin ... watch_wake). */
int dlock__etcd_watch_begin(void *arg, const dlock_request *req, void **watch);
int dlock__etcd_watch_wait(void *arg, void *watch, int64_t timeout_ms);
void dlock__etcd_watch_end(void *arg, void *watch);
void dlock__etcd_watch_wake(void *arg, void *watch);
void dlock__etcd_watch_notify(void *arg, void *watch, void (*fn)(void *), void *fn_arg);

/* Before a try of w: the stream of its last sleep goes (the try reads the
 * key to wait for again), a failure of it counted for the back-off. */
void dlock__etcd_watch_settle(dlock__etcd_be *be, dlock__etcd_watch *w);
/* After a busy try of w with watch_notify: its sleep armed without a thread
 * (see etcd_wait.c); *retry_ms lowered to when it must look by itself. */
void dlock__etcd_watch_arm(dlock__etcd_be *be, dlock__etcd_watch *w, int64_t *retry_ms);

/* ---- etcd_status.c: the operator view ------------------------------------ */

int dlock__etcd_status(void *arg, const char *name, dlock_lock_info *out);
int dlock__etcd_holders(void *arg, const char *name, dlock_list_cb cb, void *payload);
int dlock__etcd_force_release(void *arg, const char *name, dlock_lock_info *removed);
int dlock__etcd_list(void *arg, const char *name_prefix, dlock_list_cb cb, void *payload);

/* ---- etcd_family.c: read-write locks and semaphores ---------------------- */

/* The kinds that share a lock (READ, SEMAPHORE) decide here; the others
 * hold when their key is first. */
int dlock__etcd_shared_kind(int kind);
/* The kind a key's value names ('=r ', '=w ', '=s '), DLOCK_KIND_MUTEX for
 * any other value; *rest the text after the mark. */
int dlock__etcd_value_kind(const char *value, size_t len, size_t *rest);
/* The owner id at the end of a reader's value, or NULL (*olen its length). */
const char *dlock__etcd_value_owner(const char *v, size_t len, size_t *olen);
/* The ops that read, in a txn, what a shared kind's decision needs: the
 * keys ahead of rev (0: every key) with their values, and N. */
json_t *dlock__etcd_look_ops(const dlock__etcd_keys *k, int64_t rev);
/* Decide from the reply of txn ops[at], ops[at + 1] (dlock__etcd_look_ops)
 * whether the key of create revision myrev holds w->kind: 1 held, 0 not
 * (w->ahead, w->ahead_end, w->ahead_from set for the wait, or cleared to
 * look again at once), or an error. */
int dlock__etcd_look_decide(dlock__etcd_be *be, dlock__etcd_watch *w, const json_t *reply,
                            size_t at, int64_t myrev);
/* A semaphore's N before the first try: stored, else set from permits. */
int dlock__etcd_permits_ensure(dlock__etcd_be *be, dlock__etcd_conn *c, const dlock__etcd_keys *k,
                               int permits);
/* A try that will not wait, for a shared kind: queue, look, and leave
 * again when it does not hold. */
int dlock__etcd_try_shared(dlock__etcd_be *be, dlock__etcd_conn *c, const dlock__etcd_keys *k,
                           int kind, const char *owner, uint64_t *fence, int64_t *retry_ms);
int dlock__etcd_downgrade(void *arg, const dlock_request *req);
int dlock__etcd_set_permits(void *arg, const char *name, int permits);

/* One holder found by dlock__etcd_holders_read. */
typedef struct {
    dlock__etcd_kv kv;
    dlock_lock_info info; /* held, fence, holder record, kind; no ttl yet */
} dlock__etcd_holder;

/* Who holds name: the first key, or each reader or permit holder. *out
 * (malloc'd, *n entries; free each kv.key) is empty for a free lock. With
 * ttl, each holder's lease left too. */
int dlock__etcd_holders_read(dlock__etcd_be *be, dlock__etcd_conn *c, const dlock__etcd_keys *k,
                             int ttl, dlock__etcd_holder **out, size_t *n);
void dlock__etcd_holders_free(dlock__etcd_holder *h, size_t n);

/* ---- etcd_owner.c: owner ids -------------------------------------------- */

/* req keeps a hold key (an owner id; any kind but a semaphore and an
 * election: readers too, for nested reads). */
int dlock__etcd_owner_mode(const dlock_request *req);
/* In owner mode, k->key (the queue key) becomes the hold key. */
int dlock__etcd_hold_key(dlock__etcd_keys *k, const dlock_request *req);
/* Re-enter a lock req->owner holds: 1 (and *fence), 0 not held by it (go
 * on as usual), or an error (DLOCK_EMISUSE when reentrant is off). */
int dlock__etcd_reenter(dlock__etcd_be *be, const dlock_request *req, uint64_t *fence);
/* After the queue gave req the lock: its hold key, on the lock's lease. */
int dlock__etcd_hold_add(dlock__etcd_be *be, const dlock_request *req, uint64_t fence);
int dlock__etcd_hold_release(dlock__etcd_be *be, const dlock_request *req);
int dlock__etcd_hold_extend(dlock__etcd_be *be, const dlock_request *req);
/* A read-write acquisition with an owner id that holds the other side:
 * DLOCK_EMISUSE (an upgrade would wait for itself; a read under one's own
 * write lock is a downgrade). */
int dlock__etcd_owner_conflict(dlock__etcd_be *be, const dlock_request *req);

/* ---- etcd_elect.c: leader election --------------------------------------- */

int dlock__etcd_leader_get(void *arg, const char *name, dlock_leader_info *out);
int dlock__etcd_observe_begin(void *arg, const char *name, void **watch);

#endif
