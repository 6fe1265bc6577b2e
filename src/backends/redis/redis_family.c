/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The lock family on Redis: reentrant and fair locks, read-write locks,
 * semaphores, multi-locks and leader election (docs/family.md). Every
 * operation is one script, so each step is atomic on the server; expiries
 * that decide who is in (a reader, a permit, a fair waiter) are measured in
 * server time (TIME inside the scripts), never with a client's clock.
 *
 * Keys, for name NAME and the default prefix "dlock:" (all share the hash
 * tag {NAME}; the scripts derive them from the base key):
 *   dlock:{NAME}               holder of the exclusive kinds: the owner id, or
 *                              the handle's token; PX lease (as the mutex)
 *   dlock:{NAME}:holds         HASH token -> "FENCE HOLDER\nKIND" of each
 *                              handle holding it (HOLDER its holder record,
 *                              lib/family.lua)
 *   dlock:{NAME}:fence         the fence counter of every kind
 *   dlock:{NAME}:queue         fair: ZSET waiter id -> arrival order
 *   dlock:{NAME}:queue-exp     fair: ZSET waiter id -> place expiry (server ms)
 *   dlock:{NAME}:queue-grant   fair: HASH waiter id -> the grant entry of a
 *                              waiter that listens (lib/family.lua)
 *   dlock:{NAME}:listen        rw, semaphore: ZSET id -> arrival of each
 *                              waiter that listens
 *   dlock:{NAME}:listen-exp    ZSET id -> expiry (server ms)
 *   dlock:{NAME}:listen-grant  HASH id -> its grant entry (lib/family.lua)
 *   dlock:{NAME}:grant:ID      LIST, the fence handed to waiter ID that
 *                              listens (redis_listen.c; PX the confirm window)
 *   dlock:{NAME}:readers       ZSET token -> lease end (server ms)
 *   dlock:{NAME}:reader-fences HASH token -> "FENCE HOLDER\nOWNER-ID"
 *   dlock:{NAME}:writer-wait   the id of a waiting writer; PX its expiry
 *   dlock:{NAME}:sem           ZSET token -> lease end (server ms)
 *   dlock:{NAME}:sem-fences    HASH token -> "FENCE HOLDER\n"
 *   dlock:{NAME}:permits       a semaphore's N
 *   dlock:{NAME}:leader        the leader's identity; PX lease
 * Channels: dlock:{NAME}:release (waiters; see redis_watch.h for whom a
 * message wakes) and dlock:{NAME}:leader (observers of an election).
 * Every key has an expiry, so a name nobody uses leaves nothing behind but
 * its fence counter, which lib/fence.lua retires.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/redis/redis_int.h"
#include "core/client.h"
#include "core/error.h"
#include "core/token.h"

typedef dlock__redis_be redis_backend;
typedef dlock__redis_key_buf key_buf;

/* How long a fair waiter's place, or a waiting writer's marker, lives past
 * its last refresh (server time): W in dlock.h. */
static int64_t waiter_ttl_ms(int64_t lease_ms)
{
    return lease_ms < 1000 ? 1000 : lease_ms > 30000 ? 30000 : lease_ms;
}

static const char *owner_value(const dlock_request *req)
{
    return req->owner != NULL ? req->owner : req->token;
}

typedef dlock__redis_args args;
#define arg dlock__redis_arg
#define arg_str dlock__redis_arg_str
#define arg_key dlock__redis_arg_key
#define arg_num dlock__redis_arg_num

/* The reply of the acquire scripts: {status, value}. */
static int pair_reply(redis_backend *be, redisReply *r, const char *what, long long *status,
                      long long *value)
{
    int ok = r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
             r->element[0]->type == REDIS_REPLY_INTEGER &&
             r->element[1]->type == REDIS_REPLY_INTEGER;

    if (ok) {
        *status = r->element[0]->integer;
        *value = r->element[1]->integer;
    }
    freeReplyObject(r);
    return ok ? DLOCK_OK : dlock__redis_bad_reply(be->cmd, what);
}

static int int_result(redis_backend *be, redisReply *r, const char *what, long long *value)
{
    int ok = r->type == REDIS_REPLY_INTEGER;

    if (ok)
        *value = r->integer;
    freeReplyObject(r);
    return ok ? DLOCK_OK : dlock__redis_bad_reply(be->cmd, what);
}

/* ---- acquire ----------------------------------------------------------- */

static int misuse(const dlock_request *req, long long why)
{
    char name[80];

    dlock__printable(name, sizeof(name), req->name);
    switch (why) {
    case DLOCK__REDIS_WHY_HELD:
        if (req->kind == DLOCK_KIND_WRITE)
            return dlock__fail(DLOCK_EMISUSE, "write lock '%s' is already held by this owner id "
                               "(read-write locks are not reentrant)", name);
        return dlock__fail(DLOCK_EMISUSE, "lock '%s' is already held by this owner id and "
                           "reentrant is off: set reentrant to take it again", name);
    case DLOCK__REDIS_WHY_OTHER_KIND:
        if (req->kind == DLOCK_KIND_READ)
            return dlock__fail(DLOCK_EMISUSE, "read lock '%s' asked by the owner id that holds "
                               "its write lock: downgrade the write lock instead "
                               "(dlock_lock_downgrade)", name);
        return dlock__fail(DLOCK_EMISUSE, "lock '%s' is held by this owner id, but not as a "
                           "lock of this kind (use one name with one kind)", name);
    case DLOCK__REDIS_WHY_UPGRADE:
        return dlock__fail(DLOCK_EMISUSE, "write lock '%s' asked by an owner id that holds a "
                           "read lock on it: upgrade is refused (two upgrading readers would "
                           "wait for each other for ever); release the read lock first", name);
    default:
        return dlock__fail(DLOCK_EPROTO, "lock '%s': the server refused with reason %lld",
                           name, why);
    }
}

/*
 * On a cluster, the keys an acquire or release script derives from the
 * base key (its
 * fence counter, holds, queue, readers...) are declared too, after the
 * script's own KEYS (which it reads by index, so it ignores them). Redis
 * routes by declared keys only: while the slot migrates, a script whose
 * derived key had already gone would fail on the old master ("attempted to
 * access a non local key"), or, for a key not there yet, write it where the
 * migration has passed. Declared, every key must be on the master that runs
 * it (else ASK or TRYAGAIN, which the router follows and waits out), so a
 * script never sees half of a lock's state (docs/redis-cluster.md).
 * Returns how many keys were added to a (0 on a single server).
 */
#define STATE_MAX 8
static int declare_state(redis_backend *be, int kind, const char *name,
                         key_buf state[STATE_MAX], args *a)
{
    static const char *const excl[] = {":fence", ":holds", ":leader", ":queue", ":queue-exp",
                                       ":queue-grant", NULL};
    static const char *const rw[] = {":fence", ":holds", ":reader-fences", ":readers",
                                     ":writer-wait", ":listen", ":listen-exp", ":listen-grant",
                                     NULL};
    static const char *const sem[] = {":fence", ":permits", ":sem", ":sem-fences", ":listen",
                                      ":listen-exp", ":listen-grant", NULL};
    const char *const *suffixes = kind == DLOCK_KIND_READ || kind == DLOCK_KIND_WRITE ? rw
                                  : kind == DLOCK_KIND_SEMAPHORE                     ? sem
                                                                                     : excl;
    int n = 0;

    if (!be->cmd[0].is_cluster)
        return 0;
    for (; suffixes[n] != NULL && n < STATE_MAX; n++) {
        dlock__redis_key(&state[n], be, name, suffixes[n]);
        arg_key(a, &state[n]);
    }
    return n;
}

/*
 * A waiter's first try decides whether it listens for its grant
 * (redis_listen.c): with a listener's connection of its own taken now, its
 * tries leave its grant entry on the server (lib/family.lua), and a release
 * that may admit it hands it the lock and pushes the fence to its list, as
 * the plain mutex's waiter in the hand-off slot is handed it (release.lua):
 * the head of a fair queue (excl_release.lua), the marker's writer or the
 * readers (rw_release.lua), the first waiter for a permit (sem_release.lua).
 * Without a free connection (or on the asynchronous API's loop, or without
 * threads) it is woken on the channel and tries, as before.
 */
static int listens_for_grant(int kind)
{
    return kind == DLOCK_KIND_FAIR || kind == DLOCK_KIND_READ || kind == DLOCK_KIND_WRITE ||
           kind == DLOCK_KIND_SEMAPHORE;
}

static int family_listen_begin(redis_backend *be, dlock__redis_watch *w,
                               const dlock_request *req)
{
    if (w->lease_ms != 0)
        return DLOCK_OK; /* decided by an earlier try */
    w->lease_ms = req->lease_ms;
    if (w->told || !dlock__redis_listen_on(be))
        return DLOCK_OK;
    if ((w->grant_token = strdup(req->token)) == NULL ||
        (w->grant_value = strdup(owner_value(req))) == NULL) {
        free(w->grant_token);
        w->grant_token = NULL;
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    w->listens = dlock__redis_listen_take(be, w);
    return DLOCK_OK;
}

int dlock__redis_family_acquire(void *arg_be, const dlock_request *req, void *watch_arg,
                                dlock_acquire_result *out)
{
    redis_backend *be = arg_be;
    dlock__redis_watch *watch = watch_arg;
    const dlock__redis_script *script;
    key_buf base, floor, registry, leader, state[STATE_MAX];
    int nkeys;
    const char *mode = watch != NULL ? "wait" : "try";
    /* A waiter's place in a fair queue, or its writer marker, is its
     * watch's id: a release publishes it to wake that waiter alone. */
    const char *wid = watch != NULL ? dlock__redis_watch_id(watch->waiter) : "";
    int64_t ttl = waiter_ttl_ms(req->lease_ms);
    /* Who holds it, kept in the hold's value (lib/family.lua). */
    const char *holder = req->holder != NULL ? req->holder : "";
    long long status = 0, value = 0;
    char name[80];
    args a = {0};
    redisReply *r;
    int rc, confirm = 0;
    int listens = 0, grant_wait = watch != NULL && listens_for_grant(req->kind);

    if (grant_wait) {
        if ((rc = family_listen_begin(be, watch, req)) != DLOCK_OK)
            return rc;
        /* A grant popped from our list is the lock, with no try, when its
         * bound leaves enough of the lease; else this try confirms it
         * (excl_acquire finds our hold). No grant of this wait can be
         * pushed before the first try that wrote our entry is sent. */
        if (watch->granted != 0) {
            confirm = 1;
            if (dlock__redis_listen_granted(watch, req, out))
                return DLOCK_OK;
        }
        if (watch->bound_ms == 0)
            watch->bound_ms = out->lease_from_ms;
        listens = watch->listens;
    }

    dlock__redis_key(&base, be, req->name, "");
    dlock__redis_key(&leader, be, req->name, ":leader");
    dlock__redis_fence_keys(&floor, &registry, be, req->name);
    arg_key(&a, &base);
    arg_key(&a, &floor);
    arg_key(&a, &registry);
    nkeys = 3 + declare_state(be, req->kind, req->name, state, &a);
    switch (req->kind) {
    case DLOCK_KIND_MUTEX:
    case DLOCK_KIND_FAIR:
    case DLOCK_KIND_LEADER:
        script = &dlock__redis_script_excl_acquire;
        arg_str(&a, req->kind == DLOCK_KIND_FAIR     ? "fair"
                    : req->kind == DLOCK_KIND_LEADER ? "leader"
                                                     : "mutex");
        arg_str(&a, req->token);
        arg_str(&a, owner_value(req));
        arg_str(&a, req->reentrant ? "1" : "0");
        arg_num(&a, req->lease_ms);
        arg_str(&a, mode);
        arg_num(&a, ttl);
        arg_str(&a, req->identity != NULL ? req->identity : "");
        arg_key(&a, &leader);
        arg_str(&a, wid);
        arg_str(&a, holder);
        arg_str(&a, listens ? "1" : "");
        break;
    case DLOCK_KIND_READ:
    case DLOCK_KIND_WRITE:
        script = &dlock__redis_script_rw_acquire;
        arg_str(&a, req->kind == DLOCK_KIND_READ ? "read" : "write");
        arg_str(&a, req->token);
        arg_str(&a, req->owner != NULL ? req->owner : "");
        arg_num(&a, req->lease_ms);
        arg_str(&a, mode);
        arg_num(&a, ttl);
        arg_str(&a, wid);
        arg_str(&a, holder);
        arg_str(&a, listens ? "1" : "");
        break;
    case DLOCK_KIND_SEMAPHORE:
        script = &dlock__redis_script_sem_acquire;
        arg_str(&a, req->token);
        arg_num(&a, req->lease_ms);
        arg_num(&a, req->permits);
        arg_str(&a, holder);
        arg_str(&a, wid);
        arg_num(&a, ttl);
        arg_str(&a, listens ? "1" : "");
        break;
    default:
        return dlock__fail(DLOCK_ENOTSUP, "redis: no lock of kind %d", req->kind);
    }
    /* A fair waiter's try takes a place in the queue, a writer's may set
     * its marker, a waiter that listens registers: all must go if it gives
     * up, also when this try's reply never comes (and a lock handed to it
     * meanwhile goes back: leave.lua). */
    if (watch != NULL &&
        (req->kind == DLOCK_KIND_FAIR || req->kind == DLOCK_KIND_WRITE || listens))
        watch->leave = 1;
    if ((rc = dlock__redis_cmd_script(be, script, &r, nkeys, a.argc, a.argv, a.lens)) !=
        DLOCK_OK)
        return rc;
    if ((rc = pair_reply(be, r, script->name, &status, &value)) != DLOCK_OK)
        return rc;
    if (status == DLOCK__REDIS_TAKEN) {
        if (value <= 0)
            return dlock__redis_bad_reply(be->cmd, "an acquire script (fence <= 0)");
        out->fence = (uint64_t)value;
        if (confirm)
            out->handed = 1;
        if (watch != NULL)
            watch->leave = 0;
        return DLOCK_OK;
    }
    if (status == DLOCK__REDIS_BUSY) {
        int64_t *retry_ms = &out->retry_ms;

        *retry_ms = value;
        /* A fair waiter's place is kept by the subscriber thread from now
         * on, in batches with the client's other waiters (redis_places.c). */
        if (watch != NULL && req->kind == DLOCK_KIND_FAIR)
            dlock__redis_place_keep(be, watch, base.buf, ttl, retry_ms);
        return DLOCK_EBUSY;
    }
    if (status == DLOCK__REDIS_NO_PERMITS)
        return dlock__fail(DLOCK_EINVAL, "semaphore '%s' has no number of permits yet: give "
                           "options.permits (or call dlock_semaphore_set_permits)",
                           dlock__printable(name, sizeof(name), req->name));
    return misuse(req, value);
}

int dlock__redis_family_watch_begin(void *arg_be, const dlock_request *req, void **watch)
{
    redis_backend *be = arg_be;
    char wid[DLOCK__TOKEN_LEN + 1];
    key_buf chan;
    int rc;

    /* The waiter is known by a random id of its own, not its owner token:
     * a release names the head of a fair queue on the channel, which anyone
     * allowed to SUBSCRIBE can read (and a token is what release and extend
     * check). The name and id are kept to leave the queue or drop the
     * writer's marker. */
    if ((rc = dlock__token_new(wid)) != DLOCK_OK)
        return rc;
    dlock__redis_key(&chan, be, req->name, ":release");
    return dlock__redis_watch_open(be, chan.buf, req->name, wid, (dlock__redis_watch **)watch);
}

/* ---- release, downgrade, permits --------------------------------------- */

int dlock__redis_family_release(void *arg_be, const dlock_request *req)
{
    redis_backend *be = arg_be;
    const dlock__redis_script *script;
    key_buf base, chan, leader, floor, registry, state[STATE_MAX];
    long long v = 0;
    args a = {0};
    redisReply *r;
    int rc, nkeys;

    dlock__redis_key(&base, be, req->name, "");
    dlock__redis_key(&chan, be, req->name, ":release");
    dlock__redis_key(&leader, be, req->name, ":leader");
    /* A lock handed over takes the next fence (the release scripts). */
    dlock__redis_fence_keys(&floor, &registry, be, req->name);
    arg_key(&a, &base);
    arg_key(&a, &floor);
    arg_key(&a, &registry);
    /* On a cluster the keys it derives too (the scripts use their own KEYS
     * only): in a half-migrated slot Redis then answers TRYAGAIN, which the
     * router waits out, instead of stopping the script at the first derived
     * key not on this node ("non local key"). */
    nkeys = 3 + declare_state(be, req->kind, req->name, state, &a);
    switch (req->kind) {
    case DLOCK_KIND_READ:
    case DLOCK_KIND_WRITE:
        script = &dlock__redis_script_rw_release;
        arg_str(&a, req->kind == DLOCK_KIND_READ ? "read" : "write");
        arg_str(&a, req->token);
        arg_str(&a, owner_value(req));
        arg_key(&a, &chan);
        arg_num(&a, req->lease_ms);
        arg_str(&a, req->owner != NULL ? req->owner : "");
        arg_num(&a, DLOCK__REDIS_HANDOFF_CONFIRM_MS);
        break;
    case DLOCK_KIND_SEMAPHORE:
        script = &dlock__redis_script_sem_release;
        arg_str(&a, req->token);
        arg_key(&a, &chan);
        arg_num(&a, DLOCK__REDIS_HANDOFF_CONFIRM_MS);
        break;
    default:
        script = &dlock__redis_script_excl_release;
        arg_str(&a, req->kind == DLOCK_KIND_FAIR     ? "fair"
                    : req->kind == DLOCK_KIND_LEADER ? "leader"
                                                     : "mutex");
        arg_str(&a, req->token);
        arg_str(&a, owner_value(req));
        arg_key(&a, &chan);
        arg_key(&a, &leader);
        arg_num(&a, DLOCK__REDIS_HANDOFF_CONFIRM_MS);
        break;
    }
    if ((rc = dlock__redis_cmd_script(be, script, &r, nkeys, a.argc, a.argv, a.lens)) !=
        DLOCK_OK)
        return rc;
    if ((rc = int_result(be, r, script->name, &v)) != DLOCK_OK)
        return rc;
    return v == DLOCK__REDIS_DONE ? DLOCK_OK : DLOCK_ELOST;
}

int dlock__redis_downgrade(void *arg_be, const dlock_request *req)
{
    redis_backend *be = arg_be;
    key_buf base, chan, floor, registry, state[STATE_MAX];
    long long v = 0;
    args a = {0};
    redisReply *r;
    int rc, nkeys;

    dlock__redis_key(&base, be, req->name, "");
    dlock__redis_key(&chan, be, req->name, ":release");
    dlock__redis_fence_keys(&floor, &registry, be, req->name);
    arg_key(&a, &base);
    arg_key(&a, &floor);
    arg_key(&a, &registry);
    nkeys = 3 + declare_state(be, DLOCK_KIND_WRITE, req->name, state, &a); /* as release */
    arg_str(&a, "downgrade");
    arg_str(&a, req->token);
    arg_str(&a, owner_value(req));
    arg_key(&a, &chan);
    arg_num(&a, req->lease_ms);
    arg_str(&a, req->owner != NULL ? req->owner : "");
    arg_num(&a, DLOCK__REDIS_HANDOFF_CONFIRM_MS);
    if ((rc = dlock__redis_cmd_script(be, &dlock__redis_script_rw_release, &r, nkeys, a.argc,
                                      a.argv, a.lens)) != DLOCK_OK)
        return rc;
    if ((rc = int_result(be, r, "the downgrade script", &v)) != DLOCK_OK)
        return rc;
    return v == DLOCK__REDIS_DONE ? DLOCK_OK : DLOCK_ELOST;
}

int dlock__redis_set_permits(void *arg_be, const char *name, int permits)
{
    redis_backend *be = arg_be;
    key_buf base, chan;
    long long v = 0;
    args a = {0};
    redisReply *r;
    int rc;

    dlock__redis_key(&base, be, name, "");
    dlock__redis_key(&chan, be, name, ":release");
    arg_key(&a, &base);
    arg_num(&a, permits);
    arg_key(&a, &chan);
    if ((rc = dlock__redis_cmd_script(be, &dlock__redis_script_sem_permits, &r, 1, a.argc, a.argv,
                                      a.lens)) != DLOCK_OK)
        return rc;
    return int_result(be, r, "the permits script", &v);
}

/* ---- renew, extend, check ---------------------------------------------- */

/* A lock's kind word in family_renew.lua. Only the kinds kept in base:holds
 * ('excl', 'leader') compare the owner value; the others get '' for it. */
static const char *renew_kind(int kind, const char *owner, int *wants_value)
{
    *wants_value = 0;
    switch (kind) {
    case DLOCK_KIND_MUTEX:
        *wants_value = owner != NULL;
        return owner == NULL ? "mutex" : "excl";
    case DLOCK_KIND_READ:
        return "read";
    case DLOCK_KIND_SEMAPHORE:
        return "sem";
    case DLOCK_KIND_LEADER:
        *wants_value = 1;
        return "leader";
    default:
        *wants_value = 1;
        return "excl"; /* fair, write */
    }
}

static int renew_batch(redis_backend *be, dlock__redis_conn *conn, dlock_renewal *items,
                       size_t n, int renew);

static unsigned item_slot(redis_backend *be, const dlock_renewal *item)
{
    key_buf k;

    dlock__redis_key(&k, be, item->req->name, "");
    return dlock__redis_key_slot(k.buf, k.len);
}

/*
 * On a cluster a script runs in one hash slot: the batch goes out as one
 * script per slot (the router sends each to its slot's master), the items
 * of a slot gathered into a copy and their results copied back (the
 * caller's order is kept: the watchdog pairs items with its locks by
 * index). A failed slot's items keep their result unset and the failure
 * is reported; the other slots are still renewed.
 */
int dlock__redis_family_renew(redis_backend *be, dlock__redis_conn *conn, dlock_renewal *items,
                              size_t n, int renew)
{
    dlock_renewal *group;
    unsigned *slots;
    size_t *at;
    int rc = DLOCK_OK;

    if (!be->cmd[0].is_cluster || n <= 1)
        return renew_batch(be, conn, items, n, renew);
    group = malloc(n * sizeof(*group));
    slots = malloc(n * sizeof(*slots));
    at = malloc(n * sizeof(*at));
    if (group == NULL || slots == NULL || at == NULL) {
        free(group);
        free(slots);
        free(at);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++)
        slots[i] = item_slot(be, &items[i]);
    for (size_t i = 0; i < n; i++) {
        size_t k = 0;
        int brc;
        if (slots[i] == DLOCK__REDIS_SLOTS)
            continue; /* done with an earlier slot */
        for (size_t j = i; j < n; j++) {
            if (slots[j] != slots[i] || (j > i && slots[j] == DLOCK__REDIS_SLOTS))
                continue;
            at[k] = j;
            group[k++] = items[j];
        }
        brc = renew_batch(be, conn, group, k, renew);
        for (size_t g = 0; g < k; g++) {
            items[at[g]].result = group[g].result;
            slots[at[g]] = DLOCK__REDIS_SLOTS;
        }
        if (brc != DLOCK_OK && rc == DLOCK_OK)
            rc = brc;
    }
    free(group);
    free(slots);
    free(at);
    return rc;
}

/*
 * One script for the batch (family_renew.lua), its arguments in one
 * allocation: the keys, and a lease written out once for a run of items
 * with the same lease (a watchdog's batch usually has one). The plain
 * mutex, the reader and the semaphore send '' for the owner value, which
 * their checks do not read: a renewal is the bytes it needs only. The
 * reply is one string, a character a lock, not an array of n integers
 * (n + 1 objects for the reader to make and free).
 */
int dlock__redis_renew_args(redis_backend *be, const dlock_renewal *items, size_t n, int renew,
                            void **out, int *argc_out, const char ***argv_out,
                            size_t **lens_out)
{
    typedef char lease_text[24];
    size_t argc = 1 + 5 * n;
    char *block = malloc(n * (sizeof(key_buf) + sizeof(lease_text)) +
                         argc * (sizeof(const char *) + sizeof(size_t)));
    key_buf *keys = (key_buf *)block;
    lease_text *leases = (lease_text *)(keys + n);
    const char **argv = (const char **)(leases + n);
    size_t *lens = (size_t *)(argv + argc);
    const char *lease = NULL;
    size_t lease_len = 0;
    int64_t last_lease = -1;

    if (block == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const dlock_request *req = items[i].req;
        int wants_value;
        const char *kind = renew_kind(req->kind, req->owner, &wants_value);
        const char *value = !wants_value ? "" : req->owner != NULL ? req->owner : req->token;
        size_t at = n + 1 + 4 * i;

        if (lease == NULL || req->lease_ms != last_lease) {
            int len = snprintf(leases[i], sizeof(leases[i]), "%lld", (long long)req->lease_ms);
            lease = leases[i];
            lease_len = (size_t)len;
            last_lease = req->lease_ms;
        }
        dlock__redis_key(&keys[i], be, req->name, "");
        argv[i] = keys[i].buf, lens[i] = keys[i].len;
        argv[at] = kind, lens[at] = strlen(kind);
        argv[at + 1] = req->token, lens[at + 1] = strlen(req->token);
        argv[at + 2] = value, lens[at + 2] = strlen(value);
        argv[at + 3] = lease, lens[at + 3] = lease_len;
    }
    argv[n] = renew ? "renew" : "check";
    lens[n] = 5;
    *out = block;
    *argc_out = (int)argc;
    *argv_out = argv;
    *lens_out = lens;
    return DLOCK_OK;
}

int dlock__redis_renew_reply(const dlock__redis_conn *conn, const redisReply *r,
                             dlock_renewal *items, size_t n)
{
    if (r->type != REDIS_REPLY_STRING || r->len != n || strspn(r->str, "01") != n)
        return dlock__redis_bad_reply(conn, "the renew script");
    for (size_t i = 0; i < n; i++)
        items[i].result = r->str[i] == '1' ? DLOCK_OK : DLOCK_ELOST;
    return DLOCK_OK;
}

static int renew_batch(redis_backend *be, dlock__redis_conn *conn, dlock_renewal *items,
                       size_t n, int renew)
{
    void *block = NULL;
    const char **argv = NULL;
    size_t *lens = NULL;
    redisReply *r = NULL;
    int argc = 0, rc;

    if ((rc = dlock__redis_renew_args(be, items, n, renew, &block, &argc, &argv, &lens)) !=
        DLOCK_OK)
        return rc;
    if (conn != NULL) {
        rc = dlock__redis_conn_script(conn, &dlock__redis_script_family_renew, &r, (int)n, argc,
                                      argv, lens);
    } else {
        rc = dlock__redis_cmd_script(be, &dlock__redis_script_family_renew, &r, (int)n, argc,
                                     argv, lens);
        conn = be->cmd; /* for messages: every command connection has the same name */
    }
    if (rc == DLOCK_OK)
        rc = dlock__redis_renew_reply(conn, r, items, n);
    if (r != NULL)
        freeReplyObject(r);
    free(block);
    return rc;
}

static int renew_one(redis_backend *be, const dlock_request *req, int renew)
{
    dlock_renewal item = {req, DLOCK_EPROTO};
    int rc = dlock__redis_family_renew(be, NULL, &item, 1, renew);

    return rc != DLOCK_OK ? rc : item.result;
}

int dlock__redis_family_extend(void *be, const dlock_request *req)
{
    return renew_one(be, req, 1);
}

int dlock__redis_family_check(void *be, const dlock_request *req)
{
    return renew_one(be, req, 0);
}

/* ---- multi-lock ----------------------------------------------------------- */

int dlock__redis_multi_atomic(void *arg_be, const dlock_request *reqs, size_t n)
{
    redis_backend *be = arg_be;
    unsigned first = 0;

    for (size_t i = 0; i < n; i++) {
        key_buf k;
        unsigned slot;

        dlock__redis_key(&k, be, reqs[i].name, "");
        slot = dlock__redis_key_slot(k.buf, k.len);
        if (i == 0)
            first = slot;
        else if (slot != first)
            /* On a cluster the names go to dlock__redis_multi_acquire all
             * the same, which refuses them (one script, one slot). */
            return be->cmd[0].is_cluster;
    }
    return 1;
}

int dlock__redis_multi_acquire(void *arg_be, const dlock_request *reqs, size_t n,
                               uint64_t *fences, dlock_acquire_result *out)
{
    redis_backend *be = arg_be;
    /* The locks, the floor and registry, and on a cluster the locks' fence
     * counters (declared: see declare_state). */
    size_t nkeys = n + 2 + (be->cmd[0].is_cluster ? n : 0);
    key_buf *keys = malloc(nkeys * sizeof(*keys));
    size_t argc = nkeys + n + 2;
    const char **argv = malloc(argc * sizeof(*argv));
    size_t *lens = malloc(argc * sizeof(*lens));
    char lease[24];
    redisReply *r = NULL;
    int rc;

    if (keys == NULL || argv == NULL || lens == NULL) {
        rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        dlock__redis_key(&keys[i], be, reqs[i].name, "");
        if (i > 0 && dlock__redis_key_slot(keys[i].buf, keys[i].len) !=
                         dlock__redis_key_slot(keys[0].buf, keys[0].len)) {
            /* Only on a cluster (dlock__redis_multi_atomic): taken one by
             * one, they would not be all or none. */
            rc = dlock__fail(DLOCK_EINVAL, "%s: the names '%.64s' and '%.64s' are in different "
                             "hash slots, and a multi-lock on Redis Cluster is taken in one "
                             "slot: give them a shared hash tag, as {TAG}a and {TAG}b",
                             be->cmd[0].url->scheme, reqs[0].name, reqs[i].name);
            goto done;
        }
        if (nkeys > n + 2)
            dlock__redis_key(&keys[n + 2 + i], be, reqs[i].name, ":fence");
        argv[nkeys + i] = reqs[i].token, lens[nkeys + i] = strlen(reqs[i].token);
    }
    /* One slot for all (dlock__redis_multi_atomic): the first name's. */
    dlock__redis_fence_keys(&keys[n], &keys[n + 1], be, reqs[0].name);
    for (size_t i = 0; i < nkeys; i++)
        argv[i] = keys[i].buf, lens[i] = keys[i].len;
    snprintf(lease, sizeof(lease), "%lld", (long long)reqs[0].lease_ms);
    argv[nkeys + n] = lease, lens[nkeys + n] = strlen(lease);
    /* Every part has the same record (dlock__lock_new of the same options,
     * the same process). */
    argv[nkeys + n + 1] = reqs[0].holder != NULL ? reqs[0].holder : "";
    lens[nkeys + n + 1] = strlen(argv[nkeys + n + 1]);
    rc = dlock__redis_cmd_script(be, &dlock__redis_script_multi_acquire, &r, (int)nkeys,
                                 (int)argc, argv, lens);
    if (rc != DLOCK_OK)
        goto done;
    rc = dlock__redis_bad_reply(be->cmd, "the multi-lock script");
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1)
        goto done;
    for (size_t i = 0; i < r->elements; i++)
        if (r->element[i]->type != REDIS_REPLY_INTEGER)
            goto done;
    if (r->element[0]->integer == DLOCK__REDIS_TAKEN && r->elements == n + 1) {
        for (size_t i = 0; i < n; i++) {
            if (r->element[i + 1]->integer <= 0)
                goto done;
            fences[i] = (uint64_t)r->element[i + 1]->integer;
        }
        rc = DLOCK_OK;
    } else if (r->element[0]->integer == DLOCK__REDIS_BUSY && r->elements == 3 && r->element[1]->integer >= 1 &&
               (size_t)r->element[1]->integer <= n) {
        out->busy = (size_t)r->element[1]->integer - 1;
        out->retry_ms = r->element[2]->integer == -2 ? 0 : r->element[2]->integer;
        rc = DLOCK_EBUSY;
    }
done:
    if (r != NULL)
        freeReplyObject(r);
    free(keys);
    free(argv);
    free(lens);
    return rc;
}

/* ---- leader election ------------------------------------------------------ */

int dlock__redis_leader_get(void *arg_be, const char *name, dlock_leader_info *out)
{
    redis_backend *be = arg_be;
    key_buf base;
    const char *argv[1];
    size_t lens[1];
    redisReply *r;
    int rc;

    dlock__redis_key(&base, be, name, "");
    argv[0] = base.buf, lens[0] = base.len;
    if ((rc = dlock__redis_cmd_script(be, &dlock__redis_script_leader_get, &r, 1, 1, argv,
                                      lens)) != DLOCK_OK)
        return rc;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 4 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_INTEGER ||
        r->element[2]->type != REDIS_REPLY_STRING || r->element[3]->type != REDIS_REPLY_INTEGER) {
        freeReplyObject(r);
        return dlock__redis_bad_reply(be->cmd, "the leader script");
    }
    memset(out, 0, sizeof(*out));
    out->held = r->element[0]->integer == 1;
    if (out->held) {
        size_t len = r->element[2]->len < DLOCK_IDENTITY_MAX ? r->element[2]->len
                                                             : DLOCK_IDENTITY_MAX;
        out->ttl_ms = r->element[1]->integer;
        out->fence = r->element[3]->integer > 0 ? (uint64_t)r->element[3]->integer : 0;
        memcpy(out->identity, r->element[2]->str, len);
        out->identity[len] = '\0';
    }
    freeReplyObject(r);
    return DLOCK_OK;
}

int dlock__redis_observe_begin(void *arg_be, const char *name, void **watch)
{
    redis_backend *be = arg_be;
    key_buf chan;

    dlock__redis_key(&chan, be, name, ":leader");
    return dlock__redis_watch_open(be, chan.buf, NULL, NULL, (dlock__redis_watch **)watch);
}
