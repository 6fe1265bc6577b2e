/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The mutex, as Curator's InterProcessMutex with protection takes it: each
 * acquisition creates one EPHEMERAL_SEQUENTIAL child of the lock's
 * directory, "_c_<uuid>-lock-<seq>"; the child with the lowest sequence
 * holds the lock, and a waiter watches only the child just before its own,
 * so a release wakes one waiter. The fence is the holder node's czxid: the
 * zxid of the transaction that created it, which only grows.
 *
 * A try that will not wait creates its node and keeps it only if it is the
 * lowest (two round trips, as Curator's); otherwise it deletes it at once,
 * so it never jumps the queue and leaves nothing behind.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zk_int.h"

/* ---- watches -------------------------------------------------------------- */

/* The table of targets starts with this many chains, and doubles when the
 * watches outnumber them twice. */
#define WTAB_MIN 64

/* Put w in its target's chain (s->mu held, s->wtab not NULL). */
static void target_link(dlock__zk_sess *s, dlock__zk_watch *w)
{
    dlock__zk_watch **chain = &s->wtab[dlock__zk_hash_str(w->target) & (s->wtab_size - 1)];

    w->tprev = NULL;
    w->tnext = *chain;
    if (*chain != NULL)
        (*chain)->tprev = w;
    *chain = w;
}

/* Take w out of its target's chain (s->mu held). */
static void target_unlink(dlock__zk_sess *s, dlock__zk_watch *w)
{
    if (s->wtab == NULL || w->target == NULL)
        return;
    if (w->tprev != NULL)
        w->tprev->tnext = w->tnext;
    else
        s->wtab[dlock__zk_hash_str(w->target) & (s->wtab_size - 1)] = w->tnext;
    if (w->tnext != NULL)
        w->tnext->tprev = w->tprev;
    w->tnext = w->tprev = NULL;
}

/* Grow the table for one more watch (s->mu held). Without memory the table
 * stays as it is (longer chains), or absent: dlock__zk_watch_fire then
 * walks every watch. */
static void wtab_grow(dlock__zk_sess *s)
{
    size_t size;
    dlock__zk_watch **table;

    if (s->wtab != NULL && s->nwatches + 1 <= s->wtab_size * 2)
        return;
    size = s->wtab == NULL ? WTAB_MIN : s->wtab_size * 2;
    if ((table = calloc(size, sizeof(*table))) == NULL)
        return;
    free(s->wtab);
    s->wtab = table;
    s->wtab_size = size;
    for (dlock__zk_watch *o = s->watches; o != NULL; o = o->next)
        if (o->target != NULL)
            target_link(s, o);
}

void dlock__zk_watch_table_free(dlock__zk_sess *s)
{
    free(s->wtab);
    s->wtab = NULL;
    s->wtab_size = 0;
}

void dlock__zk_watch_retarget(dlock__zk_watch *w, char *path)
{
    dlock__zk_sess *s = w->sess;

    target_unlink(s, w);
    free(w->target);
    w->target = path;
    if (path != NULL && s->wtab != NULL)
        target_link(s, w);
}

void dlock__zk_watch_fire(dlock__zk_sess *s, const char *path)
{
    dlock__zk_watch *w = s->wtab != NULL
                             ? s->wtab[dlock__zk_hash_str(path) & (s->wtab_size - 1)]
                             : s->watches;

    for (; w != NULL; w = s->wtab != NULL ? w->tnext : w->next)
        if (w->target != NULL && strcmp(w->target, path) == 0) {
            w->fired = 1;
            dlock__zk_watch_signal(w);
        }
}

void dlock__zk_watch_signal(dlock__zk_watch *w)
{
    pthread_cond_signal(&w->cv);
    if (w->notify != NULL)
        w->notify(w->notify_arg);
}

/* The asynchronous API's waiter sleeps as a record of the engine's: its
 * wake-ups (the node ahead deleted, the session's state changed, a
 * watch_wake) call fn, from the ZooKeeper client's thread or the waker's,
 * under the session's mutex; fn only takes the engine's. watch_free
 * unlinks the watch under that mutex, after which nobody calls it. */
void dlock__zk_watch_notify(void *arg, void *watch, void (*fn)(void *), void *fn_arg)
{
    dlock__zk_watch *w = watch;

    (void)arg;
    pthread_mutex_lock(&w->sess->mu);
    w->notify = fn;
    w->notify_arg = fn_arg;
    pthread_mutex_unlock(&w->sess->mu);
}

int dlock__zk_watch_new(dlock__zk_sess *s, dlock__zk_watch **out)
{
    dlock__zk_watch *w = calloc(1, sizeof(*w));
    pthread_condattr_t a;

    if (w == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    w->sess = s;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &a);
    pthread_condattr_destroy(&a);
    pthread_mutex_lock(&s->mu);
    wtab_grow(s);
    w->prev = NULL;
    w->next = s->watches;
    if (s->watches != NULL)
        s->watches->prev = w;
    s->watches = w;
    s->nwatches++;
    pthread_mutex_unlock(&s->mu);
    *out = w;
    return DLOCK_OK;
}

void dlock__zk_watch_free(dlock__zk_watch *w)
{
    dlock__zk_sess *s;

    if (w == NULL)
        return;
    s = w->sess;
    pthread_mutex_lock(&s->mu);
    target_unlink(s, w);
    if (w->prev != NULL)
        w->prev->next = w->next;
    else
        s->watches = w->next;
    if (w->next != NULL)
        w->next->prev = w->prev;
    s->nwatches--;
    pthread_mutex_unlock(&s->mu);
    if (w->extra_free != NULL)
        w->extra_free(w->extra);
    pthread_cond_destroy(&w->cv);
    free(w->target);
    free(w->name);
    free(w->dir);
    free(w->node);
    free(w);
}

int dlock__zk_watch_target(dlock__zk_watch *w, const char *path)
{
    dlock__zk_sess *s = w->sess;
    char *copy = strdup(path);
    int rc;

    if (copy == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    /* Target first: an event that comes before exists returns is ours. */
    pthread_mutex_lock(&s->mu);
    dlock__zk_watch_retarget(w, copy);
    pthread_mutex_unlock(&s->mu);
    rc = dlock__zk_exists(s, path, 1, NULL);
    if (rc == ZOK)
        return 1;
    if (rc == ZNONODE)
        return 0;
    return dlock__zk_fail(s, rc, "watch", path);
}

/* The longest one watch_sleep waits; the caller then tries again. */
#define MAX_SLEEP_MS (24 * 3600 * 1000LL)

int dlock__zk_watch_sleep(dlock__zk_watch *w, int64_t timeout_ms)
{
    dlock__zk_sess *s = w->sess;
    int64_t deadline;
    struct timespec ts;
    int rc;

    /* The core passes up to INT64_MAX (a watch certain to announce the
     * release): a day is as good as forever here, and the sum stays
     * within int64_t (UBSan found the overflow). */
    if (timeout_ms > MAX_SLEEP_MS)
        timeout_ms = MAX_SLEEP_MS;
    deadline = dlock__zk_mono_ms() + timeout_ms;

    ts.tv_sec = deadline / 1000;
    ts.tv_nsec = (long)(deadline % 1000) * 1000000;
    pthread_mutex_lock(&s->mu);
    while (!w->fired && !w->woken)
        if (pthread_cond_timedwait(&w->cv, &s->mu, &ts) != 0 && dlock__zk_mono_ms() >= deadline)
            break;
    rc = w->fired || w->woken ? DLOCK_OK : DLOCK_ETIMEOUT;
    w->fired = w->woken = 0;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ---- node data -------------------------------------------------------------- */

char *dlock__zk_node_data_fenced(const dlock_request *req, int64_t lease_ms, uint64_t fence,
                                 int *len)
{
    static const char hex[] = "0123456789abcdef";
    const char *holder = req->holder != NULL ? req->holder : "";
    size_t hlen = strlen(holder), olen = req->owner != NULL ? strlen(req->owner) : 0, n;
    char *out = malloc(hlen + 2 * olen + 128);

    if (out == NULL)
        return NULL;
    memcpy(out, holder, hlen);
    n = hlen;
    n += (size_t)sprintf(out + n, "%clease_ms=%" PRId64, '\0', lease_ms);
    if (req->owner != NULL) {
        /* In hex: an owner id is any bytes but NUL, and NUL ends a field. */
        n += (size_t)sprintf(out + n, "%cowner=", '\0');
        for (size_t i = 0; i < olen; i++) {
            out[n++] = hex[(unsigned char)req->owner[i] >> 4];
            out[n++] = hex[(unsigned char)req->owner[i] & 15];
        }
    }
    if (fence > 0)
        n += (size_t)sprintf(out + n, "%cfence=%" PRIu64, '\0', fence);
    if (req->kind == DLOCK_KIND_FAIR)
        /* For status: the nodes are the mutex's, the kind is not in them. */
        n += (size_t)sprintf(out + n, "%ckind=fair", '\0');
    out[n] = '\0';
    *len = (int)n;
    return out;
}

char *dlock__zk_node_data(const dlock_request *req, int64_t lease_ms, int *len)
{
    return dlock__zk_node_data_fenced(req, lease_ms, 0, len);
}

/* The value of field key ("owner=") in node data, *vlen its length; NULL
 * if none. The fields follow the holder record, each after a NUL. */
static const char *data_field(const char *data, int len, const char *key, size_t *vlen)
{
    size_t klen = strlen(key), at;

    if (data == NULL || len <= 0)
        return NULL;
    for (at = strnlen(data, (size_t)len); at < (size_t)len; ) {
        const char *f = data + at + 1;
        size_t flen = strnlen(f, (size_t)len - at - 1);
        if (flen >= klen && memcmp(f, key, klen) == 0) {
            *vlen = flen - klen;
            return f + klen;
        }
        at += 1 + flen;
    }
    return NULL;
}

/* A field's decimal value, digits only, up to INT64_MAX (a czxid), or -1:
 * sscanf's %llu would take "-2" as a fence of 2^64 - 2. */
static int64_t data_num(const char *v, size_t vlen)
{
    int64_t n = 0;

    if (vlen == 0)
        return -1;
    for (size_t i = 0; i < vlen; i++) {
        if (v[i] < '0' || v[i] > '9' || n > (INT64_MAX - (v[i] - '0')) / 10)
            return -1;
        n = n * 10 + (v[i] - '0');
    }
    return n;
}

void dlock__zk_parse_data(const char *data, int len, dlock_lock_info *out)
{
    size_t hlen = data != NULL ? strnlen(data, (size_t)len) : 0, vlen;
    const char *v;
    int64_t lease, fence;

    out->ttl_ms = -1; /* a node dlock did not write: held while its session lives */
    if (data == NULL || len <= 0)
        return;
    if (hlen > 0)
        dlock_holder_parse(out, data, hlen);
    v = data_field(data, len, "lease_ms=", &vlen);
    if (v != NULL && (lease = data_num(v, vlen)) > 0)
        out->ttl_ms = lease;
    v = data_field(data, len, "fence=", &vlen);
    if (v != NULL && (fence = data_num(v, vlen)) > 0)
        out->fence = (uint64_t)fence;
    v = data_field(data, len, "kind=", &vlen);
    if (v != NULL && vlen == 4 && memcmp(v, "fair", 4) == 0)
        out->kind = DLOCK_KIND_FAIR;
}

int dlock__zk_data_owner_is(const char *data, int len, const char *owner)
{
    static const char hex[] = "0123456789abcdef";
    size_t vlen, olen = strlen(owner);
    const char *v = data_field(data, len, "owner=", &vlen);

    if (v == NULL || vlen != 2 * olen)
        return 0;
    for (size_t i = 0; i < olen; i++)
        if (v[2 * i] != hex[(unsigned char)owner[i] >> 4] ||
            v[2 * i + 1] != hex[(unsigned char)owner[i] & 15])
            return 0;
    return 1;
}

/* ---- acquiring ------------------------------------------------------------ */

/* The children of dir in sequence order; ZNONODE gives none. now: without
 * waiting for a turn (dlock__zk_children_now). */
static int sorted_children_now(dlock__zk_sess *s, const char *dir, struct String_vector *kids,
                               int now)
{
    int rc = now ? dlock__zk_children_now(s, dir, kids) : dlock__zk_children(s, dir, kids);

    if (rc == ZNONODE) {
        kids->count = 0;
        kids->data = NULL;
        return DLOCK_OK;
    }
    if (rc != ZOK)
        return dlock__zk_fail(s, rc, "list", dir);
    dlock__zk_sort_children(kids, DLOCK__ZK_LOCK_NAME);
    return DLOCK_OK;
}

static int sorted_children(dlock__zk_sess *s, const char *dir, struct String_vector *kids)
{
    return sorted_children_now(s, dir, kids, 0);
}

/* The children a create listed behind it (listed: in *kids already), in
 * sequence order, or listed now. */
static int listed_children(dlock__zk_sess *s, const char *dir, struct String_vector *kids,
                           int listed, int now)
{
    if (!listed)
        return sorted_children_now(s, dir, kids, now);
    dlock__zk_sort_children(kids, DLOCK__ZK_LOCK_NAME);
    return DLOCK_OK;
}

/* The index of node (a full path) among kids, or -1. */
static int index_of(const struct String_vector *kids, const char *node)
{
    const char *base = strrchr(node, '/');
    base = base != NULL ? base + 1 : node;
    for (int i = 0; i < kids->count; i++)
        if (strcmp(kids->data[i], base) == 0)
            return i;
    return -1;
}

/* ---- re-entry by owner id ------------------------------------------------ */

/* reenter's own: the holder's node went between the read and the create. */
#define LOOK_AGAIN 2

/*
 * Re-entry (docs/zookeeper.md, "Owner ids"). When the holder's node names
 * req->owner as its owner id, the acquisition makes an EPHEMERAL node of its
 * own at the holder's sequence, "_c_<uuid>-lock-<S>" (not sequential: the
 * directory's counter is past S, so the name is free and no later node
 * gets S), in one transaction with a check that the holder's node is still
 * there: so the lock never changes hands in between. Every node at S holds
 * the lock together (a waiter, dlock's or Curator's, waits for the last of
 * them: it watches the one just before its own, then the next); each is one
 * hold, with its own session, lease and release. The fence is the
 * holder's, stored in the new node's data ("fence=N"), since its czxid is
 * newer.
 *
 * 1 re-entered (out->fence, hold added), 0 not held by req->owner (go on
 * as usual), or an error: DLOCK_EMISUSE when reentrant is off.
 */
static int reenter(dlock__zk_be *be, const dlock_request *req, dlock__zk_sess *s, uint64_t gen,
                   const char *dir, const char *uuid, dlock_acquire_result *out)
{
    if (req->owner == NULL)
        return 0;
    for (int attempt = 0; attempt < 5; attempt++) {
        struct String_vector kids = {0, NULL};
        struct Stat st;
        dlock_lock_info info;
        char *first = NULL, *mine = NULL, *data = NULL, *nd = NULL, name[80];
        const char *seq;
        int rc, zrc, len = 0, ndlen = 0, owned;

        if ((rc = sorted_children(s, dir, &kids)) != DLOCK_OK)
            return rc;
        if (kids.count == 0 || (seq = dlock__zk_mutex_seq(kids.data[0])) == NULL) {
            deallocate_String_vector(&kids);
            return 0;
        }
        /* A node of ours at the holder's sequence already: a try whose
         * reply was lost. */
        for (int i = 0; i < kids.count && mine == NULL; i++) {
            const char *q = dlock__zk_mutex_seq(kids.data[i]);
            if (q == NULL || strcmp(q, seq) != 0)
                break;
            if (strncmp(kids.data[i], DLOCK__ZK_PROTECT, strlen(DLOCK__ZK_PROTECT)) == 0 &&
                strncmp(kids.data[i] + strlen(DLOCK__ZK_PROTECT), uuid, DLOCK__ZK_UUID_LEN) == 0 &&
                (mine = dlock__zk_join(dir, kids.data[i])) == NULL)
                rc = DLOCK_ENOMEM;
        }
        snprintf(name, sizeof(name), DLOCK__ZK_PROTECT "%s-" DLOCK__ZK_LOCK_NAME "%s", uuid, seq);
        first = dlock__zk_join(dir, kids.data[0]);
        deallocate_String_vector(&kids);
        if (rc != DLOCK_OK || first == NULL) {
            free(first);
            free(mine);
            return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
        }
        zrc = dlock__zk_get(s, first, &data, &len, &st);
        if (zrc == ZNONODE) {
            free(first);
            free(mine);
            continue; /* released meanwhile: look again */
        }
        if (zrc != ZOK) {
            rc = dlock__zk_fail(s, zrc, "get", first);
            free(first);
            free(mine);
            return rc;
        }
        memset(&info, 0, sizeof(info));
        info.fence = (uint64_t)st.czxid;
        dlock__zk_parse_data(data, len, &info);
        owned = dlock__zk_data_owner_is(data, len, req->owner);
        free(data);
        if (mine != NULL) {
            free(first);
            rc = dlock__zk_hold_add(be, req, s, gen, mine, info.fence);
            free(mine);
            out->fence = info.fence;
            return rc == DLOCK_OK ? 1 : rc;
        }
        if (!owned) {
            free(first);
            return 0;
        }
        if (!req->reentrant) {
            free(first);
            return dlock_backend_fail(DLOCK_EMISUSE, "zk %s: lock '%s' is already held by this "
                                      "owner id and reentrant is off: set reentrant to take it "
                                      "again", be->shown, req->name);
        }
        if ((mine = dlock__zk_join(dir, name)) == NULL ||
            (nd = dlock__zk_node_data_fenced(req, req->lease_ms, info.fence, &ndlen)) == NULL) {
            free(first);
            free(mine);
            return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
        }
        zrc = dlock__zk_check_create(s, first, mine, nd, ndlen, ZOO_EPHEMERAL);
        free(nd);
        if (zrc == ZOK || zrc == ZNODEEXISTS) {
            /* ZNODEEXISTS: made by an earlier try of ours whose reply was
             * lost (the name holds our uuid). */
            rc = dlock__zk_hold_add(be, req, s, gen, mine, info.fence);
            out->fence = info.fence;
            rc = rc == DLOCK_OK ? 1 : rc;
        } else if (zrc == ZNONODE) {
            rc = LOOK_AGAIN; /* the holder released meanwhile */
        } else {
            rc = dlock__zk_fail(s, zrc, "re-enter", mine);
            if (zrc == ZOPERATIONTIMEOUT || zrc == ZCONNECTIONLOSS)
                /* It may have been made: the reaper deletes it by uuid. */
                dlock__zk_orphan_add(be, req->token, s, gen, dir, uuid, NULL);
        }
        free(first);
        free(mine);
        if (rc != LOOK_AGAIN)
            return rc;
    }
    return dlock_backend_fail(DLOCK_ESERVER, "zk %s: '%s': the holder changed five times while "
                              "re-entering", be->shown, req->name);
}

/* A try that will not wait: create, keep if lowest, else delete. */
static int try_once(dlock__zk_be *be, const dlock_request *req, dlock_acquire_result *out)
{
    dlock__zk_sess *s;
    uint64_t gen;
    struct String_vector kids = {0, NULL};
    struct Stat st;
    char uuid[DLOCK__ZK_UUID_LEN + 1], *dir = NULL, *node = NULL, *data = NULL;
    int rc, len = 0, maybe = 0, listed = 0, at;

    if ((rc = dlock__zk_sess_for(be, req->lease_ms, &s, &gen)) != DLOCK_OK)
        return rc;
    dlock__zk_uuid(req->token, uuid);
    if ((dir = dlock__zk_dir(be, req->name)) == NULL ||
        (data = dlock__zk_node_data(req, req->lease_ms, &len)) == NULL) {
        rc = dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = reenter(be, req, s, gen, dir, uuid, out)) != 0) {
        rc = rc == 1 ? DLOCK_OK : rc;
        goto out;
    }
    /* The node made and the queue listed in one round trip (the list
     * rides behind the create), as Curator's create and getChildren in two.
     * A waiting acquisition does not come here: it queues at once
     * (DLOCK_CAP_QUEUE_FIRST, try_queued), so a busy try's create and
     * delete are a try-once's alone. */
    rc = dlock__zk_create_protected_list(s, dir, uuid, DLOCK__ZK_LOCK_NAME, data, len,
                                         ZOO_EPHEMERAL_SEQUENTIAL, &maybe, &node, &st, &kids,
                                         &listed);
    if (rc != DLOCK_OK) {
        /* A create whose reply was lost may have made the node (and so may
         * hold the lock): the core gives it back with release, which finds
         * it by uuid; if that cannot reach the server either, the reaper
         * keeps trying. */
        if (maybe)
            dlock__zk_orphan_add(be, req->token, s, gen, dir, uuid, NULL);
        goto out;
    }
    if ((rc = listed_children(s, dir, &kids, listed, 0)) != DLOCK_OK) {
        dlock__zk_orphan_add(be, req->token, s, gen, dir, uuid, node);
        goto out;
    }
    at = index_of(&kids, node);
    if (at == 0) {
        out->fence = (uint64_t)st.czxid;
        rc = dlock__zk_hold_add(be, req, s, gen, node, (uint64_t)st.czxid);
        goto out;
    }
    /* Busy: leave nothing behind. */
    rc = dlock__zk_delete(s, node, -1);
    if (rc != ZOK && rc != ZNONODE) {
        rc = dlock__zk_fail(s, rc, "delete", node);
        dlock__zk_orphan_add(be, req->token, s, gen, dir, uuid, node);
        goto out;
    }
    out->retry_ms = at < 0 ? 0 : -1;
    rc = DLOCK_EBUSY;
out:
    deallocate_String_vector(&kids);
    free(dir);
    free(node);
    free(data);
    return rc;
}

/* A try of a waiting acquisition: queue (once), then see whether we lead;
 * if not, watch the node just before ours. */
static int try_queued(dlock__zk_be *be, const dlock_request *req, dlock__zk_watch *w,
                      dlock_acquire_result *out)
{
    dlock__zk_sess *s = w->sess;
    struct String_vector kids = {0, NULL};
    struct Stat st;
    uint64_t gen;
    int rc, at, queued, listed = 0;

    if ((rc = dlock__zk_sess_ready(s, &gen)) != DLOCK_OK)
        return rc;
    if (w->node != NULL && w->gen != gen) {
        /* The session that kept our node expired: the node went with it. */
        free(w->node);
        w->node = NULL;
        w->maybe = 0;
    }
    if (w->node == NULL && !w->maybe) {
        /* A re-entry skips the queue. */
        if ((rc = reenter(be, req, s, gen, w->dir, w->uuid, out)) == 1) {
            w->won = 1;
            return DLOCK_OK;
        }
        if (rc != 0)
            return rc;
    }
    queued = w->node != NULL;
    if (w->node == NULL) {
        char *data;
        int len;
        if ((data = dlock__zk_node_data(req, req->lease_ms, &len)) == NULL)
            return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
        if (w->maybe && w->gen != gen)
            w->maybe = 0;
        w->gen = gen;
        /* Queued and listed in one round trip (the list behind the
         * create). */
        rc = dlock__zk_create_protected_list(s, w->dir, w->uuid, DLOCK__ZK_LOCK_NAME, data, len,
                                             ZOO_EPHEMERAL_SEQUENTIAL, &w->maybe, &w->node, &st,
                                             &kids, &listed);
        free(data);
        if (rc != DLOCK_OK) {
            deallocate_String_vector(&kids);
            return rc;
        }
        w->czxid = (uint64_t)st.czxid;
    }
    /* Queued already: a look after a wake-up (one per release), which
     * does not wait behind the callers queueing (zk_call.c, "In flight"). */
    if ((rc = listed_children(s, w->dir, &kids, listed, queued)) != DLOCK_OK)
        return rc;
    at = index_of(&kids, w->node);
    if (at == 0) {
        deallocate_String_vector(&kids);
        if ((rc = dlock__zk_hold_add(be, req, s, w->gen, w->node, w->czxid)) != DLOCK_OK)
            return rc;
        /* A winner after a wait sets its node's watch now (thousands
         * taken together would otherwise cost the first renewal an exists
         * each); one that won at once, as a try-once, leaves it to the
         * first renewal. */
        if (queued)
            dlock__zk_hold_arm(be, req->token);
        w->won = 1;
        out->fence = w->czxid;
        return DLOCK_OK;
    }
    if (at < 0) {
        /* Our node is gone (broken by an operator, or its session ended):
         * queue again at once. */
        deallocate_String_vector(&kids);
        free(w->node);
        w->node = NULL;
        out->retry_ms = 0;
        return DLOCK_EBUSY;
    }
    {
        char *ahead = dlock__zk_join(w->dir, kids.data[at - 1]);
        deallocate_String_vector(&kids);
        if (ahead == NULL)
            return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
        rc = dlock__zk_watch_target(w, ahead);
        free(ahead);
    }
    if (rc < 0)
        return rc;
    /* 1: watching it, its deletion wakes us; 0: gone already. */
    out->retry_ms = rc == 1 ? INT64_MAX : 0;
    return DLOCK_EBUSY;
}

int dlock__zk_acquire(void *arg, const dlock_request *req, void *watch, dlock_acquire_result *out)
{
    dlock__zk_be *be = arg;

    /* FAIR is the mutex: its queue of sequential nodes is FIFO already,
     * a try-once never jumps it (a node ahead of ours is a waiter's too),
     * and a release wakes only the node just behind. */
    if (req->kind != DLOCK_KIND_MUTEX && req->kind != DLOCK_KIND_FAIR)
        return dlock__zk_family_acquire(be, req, watch, out);
    if (watch == NULL)
        return try_once(be, req, out);
    return try_queued(be, req, watch, out);
}

/* ---- the backend's watch calls ---------------------------------------------- */

int dlock__zk_watch_begin(void *arg, const dlock_request *req, void **watch)
{
    dlock__zk_be *be = arg;
    dlock__zk_sess *s;
    dlock__zk_watch *w = NULL;
    uint64_t gen;
    int rc;

    if ((rc = dlock__zk_sess_for(be, req->lease_ms, &s, &gen)) != DLOCK_OK)
        return rc;
    if ((rc = dlock__zk_watch_new(s, &w)) != DLOCK_OK)
        return rc;
    w->kind = req->kind;
    w->gen = gen;
    dlock__zk_uuid(req->token, w->uuid);
    if ((w->name = strdup(req->name)) == NULL || (w->dir = dlock__zk_dir(be, req->name)) == NULL) {
        dlock__zk_watch_free(w);
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    }
    if (req->kind != DLOCK_KIND_MUTEX && req->kind != DLOCK_KIND_FAIR &&
        (rc = dlock__zk_family_watch_begin(w, be, req)) != DLOCK_OK) {
        dlock__zk_watch_free(w);
        return rc;
    }
    *watch = w;
    return DLOCK_OK;
}

int dlock__zk_watch_wait(void *arg, void *watch, int64_t timeout_ms)
{
    (void)arg;
    if (dlock__zk_is_observe(watch))
        return dlock__zk_observe_wait(watch, timeout_ms);
    return dlock__zk_watch_sleep(watch, timeout_ms);
}

void dlock__zk_watch_end(void *arg, void *watch)
{
    dlock__zk_be *be = arg;
    dlock__zk_watch *w = watch;
    uint64_t gen = 0;

    if (w == NULL)
        return;
    if (w->extra != NULL) {
        dlock__zk_family_watch_end(w);
        return;
    }
    if (!w->won && (w->node != NULL || w->maybe) && !dlock__zk_sess_alive(w->sess, w->gen) &&
        dlock__zk_sess_open(w->sess, w->gen)) {
        /* Cut off past its timeout by our clock, but the server may keep
         * the session and its node in the queue (dlock__zk_sess_open):
         * the reaper deletes it once it can. */
        dlock__zk_orphan_add(be, NULL, w->sess, w->gen, w->dir, w->uuid, w->node);
    } else if (!w->won && (w->node != NULL || w->maybe) &&
               dlock__zk_sess_alive(w->sess, w->gen)) {
        int rc = dlock__zk_sess_ready(w->sess, &gen) == DLOCK_OK && gen == w->gen ? ZOK
                                                                                   : ZINVALIDSTATE;
        if (rc == ZOK && w->node == NULL) {
            /* A create whose reply was lost: find it by its protection id. */
            struct String_vector kids = {0, NULL};
            int i;
            rc = dlock__zk_children(w->sess, w->dir, &kids);
            if (rc == ZOK && (i = dlock__zk_find_protected(&kids, w->uuid)) >= 0)
                w->node = dlock__zk_join(w->dir, kids.data[i]);
            deallocate_String_vector(&kids);
            if (rc == ZNONODE)
                rc = ZOK;
        }
        if (rc == ZOK && w->node != NULL)
            rc = dlock__zk_delete(w->sess, w->node, -1);
        if (rc != ZOK && rc != ZNONODE)
            /* The server could not be reached: a node left in the queue
             * would be handed the lock one day, with nobody to release it.
             * The reaper deletes it once it can. */
            dlock__zk_orphan_add(be, NULL, w->sess, w->gen, w->dir, w->uuid, w->node);
    }
    dlock__zk_watch_free(w);
}

void dlock__zk_watch_wake(void *arg, void *watch)
{
    dlock__zk_watch *w = watch;

    (void)arg;
    pthread_mutex_lock(&w->sess->mu);
    w->woken = 1;
    dlock__zk_watch_signal(w);
    pthread_mutex_unlock(&w->sess->mu);
}
