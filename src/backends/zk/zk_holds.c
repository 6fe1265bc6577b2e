/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The holds table of the ZooKeeper backend and its reaper: each lock taken
 * (token -> node, session, lease) for release, renew and status, and the
 * orphans, nodes that may exist but that nobody will release. The reaper
 * thread deletes the node of a hold whose lease ran out unrenewed, and
 * each orphan while its session may keep it (zk.c, "The lease").
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zk_int.h"

void dlock__zk_hold_free(dlock__zk_hold *h)
{
    if (h == NULL)
        return;
    free(h->token);
    free(h->node);
    free(h->dir);
    free(h);
}

#define ORPHAN_RETRY_MS 1000

/* ---- the table ------------------------------------------------------------ */

/* The table starts with this many chains, and doubles when the holds
 * outnumber them twice. */
#define TABLE_MIN 64

static dlock__zk_hold **chain_of(dlock__zk_be *be, const char *token)
{
    return &be->table[dlock__zk_hash_str(token) & (be->table_size - 1)];
}

/* Put h in the list and the table (be->mu held); 0 when the table cannot
 * be made. Holds of one token (an orphan beside a hold) chain newest
 * first, as hold_find expects. */
static int hold_link(dlock__zk_be *be, dlock__zk_hold *h)
{
    dlock__zk_hold **chain;

    if (be->table == NULL || be->nholds + 1 > be->table_size * 2) {
        size_t size = be->table == NULL ? TABLE_MIN : be->table_size * 2;
        dlock__zk_hold **table = calloc(size, sizeof(*table));
        if (table == NULL) {
            if (be->table == NULL)
                return 0;
        } else {
            /* Oldest first, so that each chain keeps newest first. */
            dlock__zk_hold *last = be->holds;
            while (last != NULL && last->next != NULL)
                last = last->next;
            free(be->table);
            be->table = table;
            be->table_size = size;
            for (dlock__zk_hold *o = last; o != NULL; o = o->prev) {
                chain = chain_of(be, o->token);
                o->hnext = *chain;
                *chain = o;
            }
        }
    }
    chain = chain_of(be, h->token);
    h->hnext = *chain;
    *chain = h;
    h->prev = NULL;
    h->next = be->holds;
    if (be->holds != NULL)
        be->holds->prev = h;
    be->holds = h;
    be->nholds++;
    return 1;
}

/* Take h out of the list and the table (be->mu held). */
static void hold_unlink(dlock__zk_be *be, dlock__zk_hold *h)
{
    for (dlock__zk_hold **p = chain_of(be, h->token); *p != NULL; p = &(*p)->hnext)
        if (*p == h) {
            *p = h->hnext;
            break;
        }
    if (h->prev != NULL)
        h->prev->next = h->next;
    else
        be->holds = h->next;
    if (h->next != NULL)
        h->next->prev = h->prev;
    h->next = h->prev = h->hnext = NULL;
    be->nholds--;
}

/* be->mu held. */
static dlock__zk_hold *hold_find(dlock__zk_be *be, const char *token)
{
    if (be->table == NULL)
        return NULL;
    for (dlock__zk_hold *h = *chain_of(be, token); h != NULL; h = h->hnext)
        if (strcmp(h->token, token) == 0)
            return h;
    return NULL;
}

void dlock__zk_holds_free(dlock__zk_be *be)
{
    while (be->holds != NULL) {
        dlock__zk_hold *h = be->holds;
        be->holds = h->next;
        dlock__zk_hold_free(h);
    }
    free(be->table);
    be->table = NULL;
    be->table_size = be->nholds = 0;
}

/* Take the hold of token out of the table (NULL if none). */
dlock__zk_hold *dlock__zk_hold_take(dlock__zk_be *be, const char *token)
{
    dlock__zk_hold *h;

    pthread_mutex_lock(&be->mu);
    if ((h = hold_find(be, token)) != NULL)
        hold_unlink(be, h);
    pthread_mutex_unlock(&be->mu);
    return h;
}

/* A copy of token's hold (node and session), for a call without be->mu. */
int dlock__zk_hold_copy(dlock__zk_be *be, const char *token, dlock__zk_hold *out)
{
    dlock__zk_hold *h;
    int found = 0;

    memset(out, 0, sizeof(*out));
    pthread_mutex_lock(&be->mu);
    if ((h = hold_find(be, token)) != NULL && !h->orphan && h->node != NULL &&
        (out->node = strdup(h->node)) != NULL) {
        out->sess = h->sess;
        out->gen = h->gen;
        out->czxid = h->czxid;
        out->lease_ms = h->lease_ms;
        out->expires_ms = h->expires_ms;
        found = 1;
    }
    pthread_mutex_unlock(&be->mu);
    return found;
}

dlock__zk_hold *dlock__zk_hold_get(dlock__zk_be *be, const char *token)
{
    dlock__zk_hold *h = hold_find(be, token);
    return h != NULL && !h->orphan && h->node != NULL ? h : NULL;
}

void dlock__zk_hold_touch_locked(dlock__zk_be *be, dlock__zk_hold *h, int64_t lease_ms)
{
    h->lease_ms = lease_ms;
    h->expires_ms = dlock__zk_now_ms() + lease_ms;
    if (be->reap_at >= 0 && h->expires_ms < be->reap_at)
        pthread_cond_signal(&be->reap_cv);
}

/* The lease of token's hold runs lease_ms from now (a renewal that was
 * sent at sent_ms succeeded: count from its reply, which is later). */
void dlock__zk_hold_touch(dlock__zk_be *be, const char *token, int64_t lease_ms)
{
    dlock__zk_hold *h;

    pthread_mutex_lock(&be->mu);
    if ((h = hold_find(be, token)) != NULL && !h->orphan) {
        h->lease_ms = lease_ms;
        h->expires_ms = dlock__zk_now_ms() + lease_ms;
        /* Later than before, as a rule: the reaper, waking for the old
         * time, finds nothing due and sleeps again. Only a shorter lease
         * may need it sooner. Waking it on every renewal made it scan
         * every hold thousands of times a second. */
        if (be->reap_at >= 0 && h->expires_ms < be->reap_at)
            pthread_cond_signal(&be->reap_cv);
    }
    pthread_mutex_unlock(&be->mu);
}

/* Delete h's node (found by its protection id if not known). 1 done (or
 * nothing to delete), 0 when the server could not be reached. */
static int reap(dlock__zk_hold *h)
{
    int rc;

    if (h->node == NULL && h->dir != NULL) {
        struct String_vector kids = {0, NULL};
        int i;
        rc = dlock__zk_children(h->sess, h->dir, &kids);
        if (rc == ZNONODE)
            return 1;
        if (rc != ZOK)
            return rc != ZCONNECTIONLOSS && rc != ZOPERATIONTIMEOUT && rc != ZINVALIDSTATE;
        i = dlock__zk_find_protected(&kids, h->uuid);
        if (i >= 0)
            h->node = dlock__zk_join(h->dir, kids.data[i]);
        deallocate_String_vector(&kids);
        if (h->node == NULL)
            return 1;
    }
    if (h->node == NULL)
        return 1;
    rc = dlock__zk_delete(h->sess, h->node, -1);
    return rc != ZCONNECTIONLOSS && rc != ZOPERATIONTIMEOUT && rc != ZINVALIDSTATE;
}

/*
 * The reaper: deletes the node of each hold whose lease ran out without a
 * renewal (auto_renew off, or renewals that failed), so that a live holder
 * frees the lock at the end of its lease as on the other backends. It
 * counts from after the reply that set the lease, so it never deletes
 * before the core's deadline, which counts from before the request.
 */
static void *reaper_main(void *arg)
{
    dlock__zk_be *be = arg;

    pthread_mutex_lock(&be->mu);
    while (!be->stopping) {
        int64_t now = dlock__zk_now_ms(), next = INT64_MAX;
        dlock__zk_hold *due = NULL;

        be->reap_at = -1;
        for (dlock__zk_hold *h = be->holds; h != NULL; h = h->next) {
            if (h->expires_ms <= now) {
                due = h;
                hold_unlink(be, due);
                break;
            }
            if (h->expires_ms < next)
                next = h->expires_ms;
        }
        if (due != NULL) {
            int gone = 1;
            pthread_mutex_unlock(&be->mu);
            /* Not sess_alive: a session cut off past its timeout by our
             * clock may live on at the server (dlock__zk_sess_open); a
             * node dropped here would stay ahead of every waiter for as
             * long as this process lives (chaos zk3 leader-kill). */
            if (dlock__zk_sess_open(due->sess, due->gen))
                gone = reap(due);
            pthread_mutex_lock(&be->mu);
            if (gone) {
                dlock__zk_hold_free(due);
            } else {
                /* The server could not be reached: again in a second. */
                due->orphan = 1;
                due->expires_ms = dlock__zk_now_ms() + ORPHAN_RETRY_MS;
                if (!hold_link(be, due)) /* no table to grow into: given up */
                    dlock__zk_hold_free(due);
            }
            continue;
        }
        be->reap_at = next;
        if (next == INT64_MAX) {
            pthread_cond_wait(&be->reap_cv, &be->mu);
        } else {
            struct timespec ts;
            int64_t at = dlock__zk_mono_ms() + (next - now);
            ts.tv_sec = at / 1000;
            ts.tv_nsec = (long)(at % 1000) * 1000000;
            pthread_cond_timedwait(&be->reap_cv, &be->mu, &ts);
        }
    }
    pthread_mutex_unlock(&be->mu);
    return NULL;
}

/* Start the reaper if it is not running, and wake it if h is due before
 * it planned to wake (be->mu held). */
static int reaper_poke(dlock__zk_be *be, const dlock__zk_hold *h)
{
    int rc = DLOCK_OK;

    if (!be->reaper_running) {
        be->reap_at = -1;
        if (pthread_create(&be->reaper, NULL, reaper_main, be) == 0)
            be->reaper_running = 1;
        else
            rc = dlock_backend_fail(DLOCK_ENOMEM, "zk: cannot start the lease reaper thread");
    }
    if (be->reap_at >= 0 && h->expires_ms < be->reap_at)
        pthread_cond_signal(&be->reap_cv);
    return rc;
}

int dlock__zk_hold_add(dlock__zk_be *be, const dlock_request *req, dlock__zk_sess *s,
                       uint64_t gen, const char *node, uint64_t czxid)
{
    dlock__zk_hold *h;
    int rc = DLOCK_OK;

    pthread_mutex_lock(&be->mu);
    if ((h = hold_find(be, req->token)) == NULL) {
        if ((h = calloc(1, sizeof(*h))) == NULL || (h->token = strdup(req->token)) == NULL ||
            (h->node = strdup(node)) == NULL) {
            dlock__zk_hold_free(h);
            pthread_mutex_unlock(&be->mu);
            return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
        }
        if (!hold_link(be, h)) {
            dlock__zk_hold_free(h);
            pthread_mutex_unlock(&be->mu);
            return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
        }
    }
    if (h->node == NULL || strcmp(h->node, node) != 0) {
        free(h->node);
        h->armed = 0;
        h->gone = 0;
        if ((h->node = strdup(node)) == NULL) {
            pthread_mutex_unlock(&be->mu);
            return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
        }
    }
    if (h->orphan || h->sess != s || h->gen != gen) {
        h->armed = 0; /* a node of its own: its watch is set at the next renewal */
        h->gone = 0;
    }
    h->orphan = 0;
    h->sess = s;
    h->gen = gen;
    h->czxid = czxid;
    h->lease_ms = req->lease_ms;
    h->expires_ms = dlock__zk_now_ms() + req->lease_ms;
    rc = reaper_poke(be, h);
    pthread_mutex_unlock(&be->mu);
    return rc;
}

int dlock__zk_orphan_add(dlock__zk_be *be, const char *token, dlock__zk_sess *s, uint64_t gen,
                         const char *dir, const char *uuid, const char *node)
{
    dlock__zk_hold *h = calloc(1, sizeof(*h));
    int rc = DLOCK_OK;

    if (h == NULL || (h->token = strdup(token != NULL ? token : uuid)) == NULL ||
        (dir != NULL && (h->dir = strdup(dir)) == NULL) ||
        (node != NULL && (h->node = strdup(node)) == NULL)) {
        dlock__zk_hold_free(h);
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    }
    snprintf(h->uuid, sizeof(h->uuid), "%s", uuid);
    h->orphan = 1;
    h->sess = s;
    h->gen = gen;
    h->expires_ms = dlock__zk_now_ms() + ORPHAN_RETRY_MS;
    pthread_mutex_lock(&be->mu);
    if (!hold_link(be, h)) {
        pthread_mutex_unlock(&be->mu);
        dlock__zk_hold_free(h);
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    }
    rc = reaper_poke(be, h);
    pthread_mutex_unlock(&be->mu);
    return rc;
}

int dlock__zk_hold_find(dlock__zk_be *be, const char *token, dlock__zk_sess **s, uint64_t *gen,
                        char **node)
{
    dlock__zk_hold h;

    if (!dlock__zk_hold_copy(be, token, &h) || !dlock__zk_sess_alive(h.sess, h.gen)) {
        free(h.node);
        return dlock_backend_fail(DLOCK_ELOST, "zk %s: the lock is no longer ours", be->shown);
    }
    *s = h.sess;
    *gen = h.gen;
    *node = h.node;
    return DLOCK_OK;
}

int dlock__zk_hold_move(dlock__zk_be *be, const char *token, const char *node)
{
    char *copy = strdup(node);
    dlock__zk_hold *h;

    if (copy == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    pthread_mutex_lock(&be->mu);
    if ((h = hold_find(be, token)) != NULL) {
        free(h->node);
        h->node = copy;
        h->armed = 0;
        h->gone = 0;
        copy = NULL;
    }
    pthread_mutex_unlock(&be->mu);
    free(copy);
    return h != NULL ? DLOCK_OK : dlock_backend_fail(DLOCK_ELOST, "zk %s: the lock is no "
                                                     "longer ours", be->shown);
}

void dlock__zk_hold_event(dlock__zk_be *be, dlock__zk_sess *s, uint64_t gen, int type,
                          const char *path)
{
    const char *name = strrchr(path, '/'), *u;
    char token[DLOCK__ZK_UUID_LEN + 1];
    size_t t = 0;

    /* Our nodes are "_c_<uuid>-...", the uuid being the hold's token
     * (dlock__zk_uuid): the token back, then the hold by token. A hold
     * whose token does not come back so is never taken as watched (zk.c,
     * renew). */
    if (name == NULL || strncmp(name + 1, DLOCK__ZK_PROTECT, strlen(DLOCK__ZK_PROTECT)) != 0)
        return;
    u = name + 1 + strlen(DLOCK__ZK_PROTECT);
    for (size_t i = 0; i < DLOCK__ZK_UUID_LEN; i++) {
        if (u[i] == '\0')
            return;
        if (u[i] != '-')
            token[t++] = u[i];
    }
    token[t] = '\0';
    pthread_mutex_lock(&be->mu);
    for (dlock__zk_hold *h = be->table != NULL ? *chain_of(be, token) : NULL; h != NULL;
         h = h->hnext)
        if (!h->orphan && h->sess == s && h->gen == gen && h->node != NULL &&
            strcmp(h->token, token) == 0 && strcmp(h->node, path) == 0) {
            /* Any event ends the watch (ZooKeeper's watches fire once). */
            h->events++;
            h->armed = 0;
            if (type == ZOO_DELETED_EVENT)
                h->gone = 1;
        }
    pthread_mutex_unlock(&be->mu);
}

void dlock__zk_hold_arm(dlock__zk_be *be, const char *token)
{
    dlock__zk_hold *h;
    dlock__zk_sess *s;
    char *node;
    uint64_t gen, epoch, after;
    unsigned events;
    int zrc;

    pthread_mutex_lock(&be->mu);
    if ((h = dlock__zk_hold_get(be, token)) == NULL || h->armed != 0 || h->gone ||
        !dlock__zk_hold_watchable(h) || (node = strdup(h->node)) == NULL) {
        pthread_mutex_unlock(&be->mu);
        return;
    }
    s = h->sess;
    gen = h->gen;
    events = h->events;
    pthread_mutex_unlock(&be->mu);
    pthread_mutex_lock(&s->mu);
    epoch = s->gen == gen && s->connected ? s->conn_epoch : 0;
    pthread_mutex_unlock(&s->mu);
    /* As a renewal's exists (zk.c, "Renewal"): the watch counts when it
     * was set on this connection and no event came for the node since
     * events was read (the watcher counts each under be->mu). */
    zrc = epoch != 0 ? dlock__zk_exists_now(s, node, 1, NULL) : ZINVALIDSTATE;
    pthread_mutex_lock(&s->mu);
    after = s->gen == gen ? s->conn_epoch : 0;
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&be->mu);
    if (zrc == ZOK && after == epoch && (h = dlock__zk_hold_get(be, token)) != NULL &&
        h->sess == s && h->gen == gen && !h->gone && h->events == events &&
        strcmp(h->node, node) == 0)
        h->armed = epoch;
    pthread_mutex_unlock(&be->mu);
    free(node);
}

/* 1 when a watch event for h's node finds h: the node's name is
 * "_c_<uuid>-...", the uuid made of h's token (dlock__zk_uuid), and the
 * token comes back from it as dlock__zk_hold_event reads it. */
int dlock__zk_hold_watchable(const dlock__zk_hold *h)
{
    char uuid[DLOCK__ZK_UUID_LEN + 1];
    const char *name = h->node != NULL ? strrchr(h->node, '/') : NULL;
    size_t t = 0;

    if (name == NULL || strlen(h->token) != 32)
        return 0;
    dlock__zk_uuid(h->token, uuid);
    for (size_t i = 0; i < DLOCK__ZK_UUID_LEN; i++)
        if (uuid[i] != '-' && uuid[i] != h->token[t++])
            return 0;
    name++;
    return strncmp(name, DLOCK__ZK_PROTECT, strlen(DLOCK__ZK_PROTECT)) == 0 &&
           strncmp(name + strlen(DLOCK__ZK_PROTECT), uuid, DLOCK__ZK_UUID_LEN) == 0;
}
