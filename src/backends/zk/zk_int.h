/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the files of the ZooKeeper backend share. Private to src/backends/zk.
 * The design (paths, node names, sessions, the lease) is told in
 * docs/zookeeper.md and at the top of zk.c.
 *
 *   zk.c        open/close, release, extend, check, renew, the table
 *   zk_holds.c  the holds table and its reaper
 *   zk_status.c status, holders, force release, list
 *   zk_conn.c   sessions: connect, digest auth, session state, ACLs, errors
 *   zk_call.c   every ZooKeeper call with the client's command timeout
 *   zk_path.c   paths: a lock's directory, escaping names, the protected
 *               node name (Curator's _c_<uuid>-lock-<seq>), sorting
 *   zk_lock.c   the mutex: a try, the tries of a waiting acquisition, the
 *               predecessor watch, leaving the queue
 *
 * Locking: be->mu guards the holds table; each session's mu guards its
 * state and its list of watches. Neither is held across a ZooKeeper call or
 * while waiting for one; the library's completion thread takes a session's
 * mu only (never be->mu).
 *
 * For the family on ZooKeeper (zk_family.c): take a session with
 * dlock__zk_sess_for(be, lease_ms), call the server with the dlock__zk_*
 * calls below (each bounded by the command timeout, each failing with a
 * message naming the server), create queue nodes with
 * dlock__zk_create_protected (a lost reply is found again by its protection
 * id), order children with dlock__zk_sort_children, and wait for a
 * predecessor with dlock__zk_watch_target / dlock__zk_watch_sleep.
 */
#ifndef DLOCK_ZK_INT_H
#define DLOCK_ZK_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <zookeeper/zookeeper.h>

#include "dlock/sys/backend.h"

/* Curator's protection prefix ("_c_" + uuid + "-") and InterProcessMutex's
 * lock name: a holder node is "_c_<uuid>-lock-<10 digits>". */
#define DLOCK__ZK_PROTECT "_c_"
#define DLOCK__ZK_LOCK_NAME "lock-"
#define DLOCK__ZK_UUID_LEN 36

typedef struct dlock__zk_be dlock__zk_be;
typedef struct dlock__zk_watch dlock__zk_watch;

/*
 * One ZooKeeper session. A client keeps two (docs/zookeeper.md, "The
 * lease"): the short one, whose timeout is session_timeout_ms (default
 * 10 s), for leases up to it, and the long one, asked for with the longest
 * timeout the server grants, for longer leases. So a lease the core counts
 * never outlives the session that keeps the node: timeout_ms >= lease_ms.
 *
 * The slot is stable for the client's life; the ZooKeeper handle in it is
 * replaced (gen + 1) when the session expired. A node created under an
 * older gen is gone.
 */
typedef struct {
    dlock__zk_be *be;
    int64_t want_ms;      /* the timeout asked for */
    pthread_mutex_t mu;
    pthread_cond_t cv;    /* CLOCK_MONOTONIC; broadcast on every state change */
    zhandle_t *zh;        /* NULL until opened */
    uint64_t gen;         /* 1 for the first handle, + 1 for each new session */
    int connected;        /* gen's session is connected now */
    int authed;           /* gen's digest auth answered ZOK (or no auth) */
    int auth_failed;      /* gen's digest auth was refused */
    int expired;          /* gen's session expired (or auth failed): reopen */
    int64_t session_id;   /* of gen, once connected */
    int64_t timeout_ms;   /* negotiated with the server, once connected */
    /* The CLOCK_BOOTTIME time (ms) a request was sent whose reply came
     * back: the server heard from the session no earlier, so it keeps the
     * session at least until last_contact_ms + timeout_ms. */
    int64_t last_contact_ms;
    /* + 1 at each connect of the handle (first or again): a node watch
     * set on an earlier connection is not counted on (zk.c, "Renewal"). */
    uint64_t conn_epoch;
    /* The watches waiting on events of this session, doubly linked (a
     * waiter leaves in constant time), and those with a target hashed by
     * it (wtab_size chains through tnext/tprev, NULL until the first): a
     * node event wakes its path's watches without a walk of the others,
     * of which a client may have thousands. */
    dlock__zk_watch *watches;
    dlock__zk_watch **wtab;
    size_t wtab_size, nwatches;
    /* The callers' requests in flight (zk_call.c, "In flight"), at most
     * DLOCK__ZK_INFLIGHT; the callers waiting for one to end, first come
     * first served. Under qmu. */
    pthread_mutex_t qmu;
    int inflight;
    int renewing;         /* renewals waiting for replies: no new turns */
    int64_t last_turn_ms; /* CLOCK_MONOTONIC: when a request last ended */
    struct dlock__zk_slot_wait *qhead, *qtail;
} dlock__zk_sess;

/* The most requests of callers a session has in flight (zk_call.c). */
#define DLOCK__ZK_INFLIGHT 32

struct dlock__zk_be {
    char *hosts;          /* "h1:p1,h2:p2[/chroot]", as zookeeper_init takes it */
    char *shown;          /* the URL for messages (redacted) */
    char *auth;           /* "user:password" for digest auth, or NULL */
    /* The ACL of every node this client creates: with auth, the creator
     * (ZooKeeper's "auth" scheme: this digest identity) with all perms,
     * then acl='s entries; without, ZOO_OPEN_ACL_UNSAFE. */
    struct ACL_vector acl;
    char *prefix;         /* "/dlock/": a lock NAME lives at prefix + NAME */
    int64_t connect_timeout_ms;
    int64_t command_timeout_ms;
    dlock_log_cb log;
    void *log_payload;
    dlock__zk_sess sess[2]; /* [0] short, [1] long */

    pthread_mutex_t mu;   /* the holds table and the reaper */
    pthread_cond_t reap_cv;
    /* Every hold, doubly linked through prev/next, and hashed by token
     * (table of table_size chains through hnext): a client may hold
     * thousands, each renewal looks one up. */
    struct dlock__zk_hold *holds;
    struct dlock__zk_hold **table;
    size_t table_size, nholds;
    /* When the sleeping reaper plans to wake (CLOCK_BOOTTIME, INT64_MAX:
     * when told), or -1 while it is awake: a hold due before then pokes
     * it, a later one need not. */
    int64_t reap_at;
    pthread_t reaper;
    int reaper_running, stopping;
};

/* A string's hash for the tables of holds (by token, zk_holds.c) and of
 * watch targets (by path, zk_lock.c): FNV-1a, as the library's
 * dlock__hash_str, whose header (src/core/) a module does not include. */
static inline size_t dlock__zk_hash_str(const char *s)
{
    size_t h = 2166136261u;

    for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++)
        h = (h ^ *p) * 16777619u;
    return h;
}

/* ---- zk_conn.c: sessions ------------------------------------------------- */

/* be->acl from the URL's credentials and its acl= value (NULL: none); url
 * is the redacted URL, for messages. DLOCK_EINVAL naming the bad entry. */
int dlock__zk_acl_init(dlock__zk_be *be, const char *spec, const char *url);
void dlock__zk_acl_free(dlock__zk_be *be);

int64_t dlock__zk_now_ms(void); /* CLOCK_BOOTTIME */
int64_t dlock__zk_mono_ms(void); /* CLOCK_MONOTONIC, for waits */
/* pthread_cond_timedwait until the CLOCK_MONOTONIC time deadline_ms. */
int dlock__zk_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t deadline_ms);
/* A condition variable on CLOCK_MONOTONIC. */
void dlock__zk_cond_init(pthread_cond_t *cv);

/* Open the session slot (no connection yet) / close its handle. */
void dlock__zk_sess_init(dlock__zk_sess *s, dlock__zk_be *be, int64_t want_ms);
void dlock__zk_sess_close(dlock__zk_sess *s);

/* The session a lock with lease lease_ms lives in, connected (opening it or
 * a new one after expiry, within the connect timeout). DLOCK_EINVAL when the
 * server grants no session as long as the lease. *gen: the session's gen. */
int dlock__zk_sess_for(dlock__zk_be *be, int64_t lease_ms, dlock__zk_sess **out, uint64_t *gen);
/* Connect s if it is not (or no longer: expired). */
int dlock__zk_sess_ready(dlock__zk_sess *s, uint64_t *gen);
/* 1 while gen's session may still be alive on the server: not expired, and
 * connected or disconnected for less than its timeout since the last
 * contact. */
int dlock__zk_sess_alive(dlock__zk_sess *s, uint64_t gen);
/* The handle of gen is still open and was not told its session expired:
 * whatever our clock says, the server may keep the session (a new leader
 * starts every session's timeout again, and the handle reconnects to it),
 * and with it the nodes it made. What is to be deleted from such a
 * session is deleted (by the reaper) until it is gone or known expired. */
int dlock__zk_sess_open(dlock__zk_sess *s, uint64_t gen);

/* An error for ZooKeeper return code zrc during what ("create /dlock/x"):
 * ECONN for the connection and the session, EAUTH, ESERVER. */
int dlock__zk_fail(dlock__zk_sess *s, int zrc, const char *what, const char *path);

/* ---- zk_call.c: calls ---------------------------------------------------- */

/*
 * Calls, each waiting at most the command timeout for its reply. Each
 * returns ZOK or the ZooKeeper code (ZNONODE, ZNODEEXISTS, ZNOTEMPTY ... as
 * the server said, ZOPERATIONTIMEOUT when no reply came in time), for the
 * caller to judge; dlock__zk_fail turns the unexpected ones into messages.
 * Out-parameters are set only on ZOK.
 */
/* Create path with data (len bytes) and flags (ZOO_EPHEMERAL_SEQUENTIAL ...);
 * *created (malloc'd, may be NULL) the path made, *stat its stat. */
int dlock__zk_create(dlock__zk_sess *s, const char *path, const char *data, int len, int flags,
                     char **created, struct Stat *stat);
/* dlock__zk_create, and the children of dir listed in the same round trip:
 * the list is sent right behind the create, and the server, which serves a
 * session's requests in order, lists after the create. *listed is 1 when
 * *kids holds the list (the create succeeded and so did the list). */
int dlock__zk_create_list(dlock__zk_sess *s, const char *path, const char *data, int len,
                          int flags, char **created, struct Stat *stat, const char *dir,
                          struct String_vector *kids, int *listed);
/* Children names (deallocate_String_vector after). */
int dlock__zk_children(dlock__zk_sess *s, const char *path, struct String_vector *out);
/* The same without waiting for a turn (zk_call.c, "In flight"): a queued
 * waiter's look after its wake-up (one per release), whose lease runs
 * from before it. */
int dlock__zk_children_now(dlock__zk_sess *s, const char *path, struct String_vector *out);
/* The same, also setting a watch on path's children, whose event wakes the
 * watches that target path. */
int dlock__zk_children_watch(dlock__zk_sess *s, const char *path, struct String_vector *out);
/* Delete path at version (-1: any). */
int dlock__zk_delete(dlock__zk_sess *s, const char *path, int version);
/* The stat of path; with watch, also a watch on it (ZNONODE: a watch on its
 * creation), whose event wakes the watches that target path. */
int dlock__zk_exists(dlock__zk_sess *s, const char *path, int watch, struct Stat *stat);
/* The same without waiting for a turn (zk_call.c, "In flight"), as a
 * renewal: for a lock just taken, whose lease runs already. */
int dlock__zk_exists_now(dlock__zk_sess *s, const char *path, int watch, struct Stat *stat);
/* Data (malloc'd, *len bytes, NUL-terminated for convenience) and stat. */
int dlock__zk_get(dlock__zk_sess *s, const char *path, char **data, int *len, struct Stat *stat);
/* path's ACL (deallocate_ACL_vector after). */
int dlock__zk_get_acl(dlock__zk_sess *s, const char *path, struct ACL_vector *acl);
/* Set path's data at version (-1: any). */
int dlock__zk_set(dlock__zk_sess *s, const char *path, const char *data, int len, int version);
/*
 * A renewal's round trip (zk.c, "Renewal"), every request sent at once and
 * waited for together: with sync, a sync through the leader, whose reply
 * comes after every watch event for what changed before it; and an exists
 * with a watch of each of paths[0..n), rcs[i] its code (ZOK, ZNONODE ...).
 * ZOK when every reply came and the sync's was ZOK; else the first failure
 * (the rcs are then not to be trusted).
 */
int dlock__zk_confirm(dlock__zk_sess *s, int sync, const char *const *paths, size_t n,
                      int *rcs);
/* One multi request: check that check exists, and create path (data, len,
 * flags) in the same transaction, so that path is made only while check
 * is there. ZNONODE when check was gone (nothing made), ZNODEEXISTS when
 * path was there already. */
int dlock__zk_check_create(dlock__zk_sess *s, const char *check, const char *path,
                           const char *data, int len, int flags);
/* Create the missing parents of path (up to its last '/') as containers,
 * as Curator's creatingParentContainersIfNeeded does. */
int dlock__zk_make_parents(dlock__zk_sess *s, const char *path);

/* ---- zk_path.c: paths and node names ------------------------------------ */

/* prefix + escaped name (malloc'd): a lock's directory. Bytes outside
 * [A-Za-z0-9._:@+=,~-] and '%' are written %XX, and "." and ".." too, so
 * that any name is one path component. */
char *dlock__zk_dir(const dlock__zk_be *be, const char *name);
/* The name back from an escaped component, or NULL if it is not one of
 * ours (malloc'd). */
char *dlock__zk_unescape(const char *component);
/* The protection id of an acquisition: its token as a UUID (8-4-4-4-12 hex),
 * out holds DLOCK__ZK_UUID_LEN + 1 bytes. */
void dlock__zk_uuid(const char *token, char *out);
/* The child of kids whose name starts with "_c_<uuid>-", or -1. */
int dlock__zk_find_protected(const struct String_vector *kids, const char *uuid);
/* Sort children by sequence, the 10 digits after lock_name ("lock-"), as
 * Curator's StandardLockInternalsDriver.fixForSorting does (a child without
 * lock_name sorts by its whole name). */
void dlock__zk_sort_children(struct String_vector *kids, const char *lock_name);
/* The 10-digit sequence after the last "lock-" of a mutex child's name (a
 * re-entry's node has its holder's), or NULL. */
const char *dlock__zk_mutex_seq(const char *child);
/* dir + "/" + child (malloc'd). */
char *dlock__zk_join(const char *dir, const char *child);
/*
 * Create dir/_c_<uuid>-<name_part> with flags and data, unless a node of
 * that protection id exists already in dir (a create whose reply was lost,
 * here or in an earlier call: *maybe set), which is then taken as it is.
 * Sets *maybe before a create whose outcome is unknown, clears it once the
 * node is known. *node (malloc'd) and *stat of the node.
 */
int dlock__zk_create_protected(dlock__zk_sess *s, const char *dir, const char *uuid,
                               const char *name_part, const char *data, int len, int flags,
                               int *maybe, char **node, struct Stat *stat);
/* As dlock__zk_create_protected, with dir's children listed behind the
 * create (dlock__zk_create_list): *listed is 1 when *kids holds them. */
int dlock__zk_create_protected_list(dlock__zk_sess *s, const char *dir, const char *uuid,
                                    const char *name_part, const char *data, int len, int flags,
                                    int *maybe, char **node, struct Stat *stat,
                                    struct String_vector *kids, int *listed);

/* ---- zk_lock.c: the mutex and waiting ----------------------------------- */

/*
 * A waiting acquisition (the backend's watch). It belongs to a session; the
 * session's completion thread sets fired when an event for target comes (a
 * node deleted, created or changed, children changed) or the session's
 * state changes; watch_wake sets woken.
 */
struct dlock__zk_watch {
    dlock__zk_sess *sess;
    dlock__zk_watch *next, *prev;   /* in sess->watches */
    dlock__zk_watch *tnext, *tprev; /* in target's chain of sess->wtab */
    pthread_cond_t cv;     /* with sess->mu, CLOCK_MONOTONIC */
    char *target;          /* the path whose events wake us, or NULL */
    int fired, woken;      /* under sess->mu */

    /* The acquisition (the mutex; the family keeps its own state in
     * extra). */
    int kind;
    char *name;
    char *dir;
    char uuid[DLOCK__ZK_UUID_LEN + 1];
    uint64_t gen;          /* the session gen the node was made in */
    char *node;            /* our node's path, once known */
    int maybe;             /* a create whose reply was lost: look for it */
    uint64_t czxid;        /* the node's, once known */
    int won;               /* the last acquire through this watch took the lock */
    void *extra;           /* for zk_family.c, freed by extra_free */
    void (*extra_free)(void *extra);
    /* watch_notify's (under sess->mu): called with cv's signal, so that an
     * asynchronous waiter needs no thread asleep on cv. */
    void (*notify)(void *);
    void *notify_arg;
};

/* With w->sess->mu held: wake w (its sleeper, or its watch_notify). */
void dlock__zk_watch_signal(dlock__zk_watch *w);
void dlock__zk_watch_notify(void *arg, void *watch, void (*fn)(void *), void *fn_arg);

/* A watch in session s (registered in its list, target none). */
int dlock__zk_watch_new(dlock__zk_sess *s, dlock__zk_watch **out);
/* Unregister and free (does not touch the server). */
void dlock__zk_watch_free(dlock__zk_watch *w);
/* With w->sess->mu held: w's target is now path (malloc'd, taken; NULL:
 * none), hashed for dlock__zk_watch_fire. */
void dlock__zk_watch_retarget(dlock__zk_watch *w, char *path);
/* With s->mu held: wake the watches that target path. */
void dlock__zk_watch_fire(dlock__zk_sess *s, const char *path);
/* With s->mu held, closing: free the table of targets. */
void dlock__zk_watch_table_free(dlock__zk_sess *s);
/*
 * Wait for path: target it, then set a ZooKeeper watch on it (exists). 1
 * when the node is there (the watch is set: its deletion will wake w), 0
 * when it is gone already (try again at once), or a dlock error.
 */
int dlock__zk_watch_target(dlock__zk_watch *w, const char *path);
/* Sleep until w fired or was woken (DLOCK_OK, clearing both) or timeout_ms
 * passed (DLOCK_ETIMEOUT). */
int dlock__zk_watch_sleep(dlock__zk_watch *w, int64_t timeout_ms);

/* The mutex's backend calls. */
int dlock__zk_acquire(void *arg, const dlock_request *req, void *watch, dlock_acquire_result *out);
int dlock__zk_watch_begin(void *arg, const dlock_request *req, void **watch);
int dlock__zk_watch_wait(void *arg, void *watch, int64_t timeout_ms);
void dlock__zk_watch_end(void *arg, void *watch);
void dlock__zk_watch_wake(void *arg, void *watch);

/* The node data of a holder: req->holder, then NUL-separated fields
 * "lease_ms=N", "owner=HEX" (req->owner in hex, when it has one) and
 * "fence=N" (fence > 0: a re-entry's node, whose czxid is not the lock's
 * fence), and "kind=fair" for DLOCK_KIND_FAIR (its nodes are the mutex's).
 * Status reads them back; Curator ignores the data. *len its length. */
char *dlock__zk_node_data(const dlock_request *req, int64_t lease_ms, int *len);
char *dlock__zk_node_data_fenced(const dlock_request *req, int64_t lease_ms, uint64_t fence,
                                 int *len);
/* Read holder record, lease, fence (when stored) and kind=fair (out->kind)
 * from node data. */
void dlock__zk_parse_data(const char *data, int len, dlock_lock_info *out);
/* 1 when node data names owner as its owner id. */
int dlock__zk_data_owner_is(const char *data, int len, const char *owner);

/* ---- zk_holds.c: holds --------------------------------------------------- */

/* A lock taken, or an orphan; in be->holds (under be->mu). */
typedef struct dlock__zk_hold {
    struct dlock__zk_hold *next, *prev, *hnext;
    char *token;
    char *node;
    dlock__zk_sess *sess;
    uint64_t gen;
    uint64_t czxid;
    int64_t lease_ms;
    int64_t expires_ms; /* CLOCK_BOOTTIME: the reaper deletes the node then */
    /* The node's watch (zk.c, "Renewal"): armed is the session's
     * conn_epoch when an exists with a watch found the node (0: not
     * since); events counts the watch events for the node, gone says one
     * told it was deleted. Under be->mu, set by the session's watcher. */
    uint64_t armed;
    unsigned events;
    int gone;
    /* An orphan: a node that may exist in a live session but that nobody
     * will release (a create whose reply was lost, a leave or release that
     * could not reach the server). The reaper deletes it (finding it by its
     * protection id when node is NULL), once a second until it succeeds or
     * the session is gone. */
    int orphan;
    char *dir;
    char uuid[DLOCK__ZK_UUID_LEN + 1];
} dlock__zk_hold;

void dlock__zk_hold_free(dlock__zk_hold *h);
/* Free every hold and the table (closing: the reaper has stopped). */
void dlock__zk_holds_free(dlock__zk_be *be);
/* Take the hold of token out of the table (NULL if none). */
dlock__zk_hold *dlock__zk_hold_take(dlock__zk_be *be, const char *token);
/* A copy of token's hold (node and session), for a call without be->mu:
 * 1 found (out->node malloc'd), 0 not. */
int dlock__zk_hold_copy(dlock__zk_be *be, const char *token, dlock__zk_hold *out);
/* The lease of token's hold runs lease_ms from now. */
void dlock__zk_hold_touch(dlock__zk_be *be, const char *token, int64_t lease_ms);
/* With be->mu held: token's hold (not an orphan, its node known), or NULL;
 * and its lease runs lease_ms from now. */
dlock__zk_hold *dlock__zk_hold_get(dlock__zk_be *be, const char *token);
void dlock__zk_hold_touch_locked(dlock__zk_be *be, dlock__zk_hold *h, int64_t lease_ms);

/* Remember a lock taken (token -> node, session, lease) for release, renew
 * and the reaper, which deletes the node when its lease ran out unrenewed. */
int dlock__zk_hold_add(dlock__zk_be *be, const dlock_request *req, dlock__zk_sess *s,
                       uint64_t gen, const char *node, uint64_t czxid);

/* Set the watch of token's new hold now (an exists with a watch), as its
 * first renewal would (zk.c, "Renewal"): that renewal is then a sync, not
 * an exists per lock. For a waiter that won: thousands of them winning
 * together would send thousands of exists at their first renewal, one
 * batch after another from the watchdog, late. Failing, it leaves the hold
 * to the renewal's exists. */
void dlock__zk_hold_arm(dlock__zk_be *be, const char *token);

/* Hand a node that may exist but that nobody will release to the reaper
 * (token: the acquisition's, or NULL for a waiter's, keyed by uuid; node:
 * its path, or NULL to find it in dir by uuid). */
int dlock__zk_orphan_add(dlock__zk_be *be, const char *token, dlock__zk_sess *s, uint64_t gen,
                         const char *dir, const char *uuid, const char *node);

/* The node and session of token's hold (*node malloc'd); DLOCK_ELOST when
 * token holds nothing here or its session is gone. */
int dlock__zk_hold_find(dlock__zk_be *be, const char *token, dlock__zk_sess **s, uint64_t *gen,
                        char **node);
/* Token's hold is now node (a downgrade's read node). */
int dlock__zk_hold_move(dlock__zk_be *be, const char *token, const char *node);
/* The session watcher's node event (ZOO_DELETED_EVENT, ZOO_CHANGED_EVENT
 * ...) for path in gen of s: the hold whose node it is counts the event,
 * and is gone when it was a deletion. Takes be->mu; call without s->mu. */
void dlock__zk_hold_event(dlock__zk_be *be, dlock__zk_sess *s, uint64_t gen, int type,
                          const char *path);
/* 1 when dlock__zk_hold_event finds h by its node's name (a hold that it
 * would not find is never taken as watched: asked exists at each renewal). */
int dlock__zk_hold_watchable(const dlock__zk_hold *h);

/* ---- zk_status.c: the operator view -------------------------------------- */

int dlock__zk_status(void *arg, const char *name, dlock_lock_info *out);
int dlock__zk_holders_list(void *arg, const char *name, dlock_list_cb cb, void *payload);
int dlock__zk_force_release(void *arg, const char *name, dlock_lock_info *removed);
int dlock__zk_list(void *arg, const char *name_prefix, dlock_list_cb cb, void *payload);

/* ---- zk_family.c: read-write lock, semaphore, leader election --------- */

/* A try of READ, WRITE, SEMAPHORE or LEADER (w NULL: try once). */
int dlock__zk_family_acquire(dlock__zk_be *be, const dlock_request *req, dlock__zk_watch *w,
                             dlock_acquire_result *out);
/* The family's state in a new watch w of req. */
int dlock__zk_family_watch_begin(dlock__zk_watch *w, dlock__zk_be *be, const dlock_request *req);
/* Leave what w queued (unless it won) and free it. */
void dlock__zk_family_watch_end(dlock__zk_watch *w);
/* 1 for a watch of observe_begin, whose wait sets its watch again. */
int dlock__zk_is_observe(const dlock__zk_watch *w);
int dlock__zk_observe_wait(dlock__zk_watch *w, int64_t timeout_ms);
/* The table's family calls. */
int dlock__zk_downgrade(void *be, const dlock_request *req);
int dlock__zk_set_permits(void *be, const char *name, int permits);
int dlock__zk_leader_get(void *be, const char *name, dlock_leader_info *out);
int dlock__zk_observe_begin(void *be, const char *name, void **watch);

#endif
