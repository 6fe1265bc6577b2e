/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Session leases: the auto-renewed locks of one client and one lease length
 * (TTL) share one lease, as the mutexes of etcd's concurrency.Session do, so
 * that the watchdog keeps them all alive with one keepalive per renewal
 * batch instead of one per lock (issue 33: 10,000 locks on 6 s leases were
 * 5,000 keepalives and, on an etcd before 3.4.25, 5,000 TimeToLive reads a
 * second). docs/etcd.md, "Session leases", has the rules; in short:
 *
 * - Only locks the watchdog renews go on it (dlock_request.auto_renew), and
 *   only the plain queue's (mutex, fair, leader, write; not readers,
 *   semaphores, owner ids or multi-locks, whose releases end by a revoke).
 *   A lock whose lease must run out on the server unless extended keeps a
 *   lease of its own: on a shared lease the renewals of the others would
 *   keep it.
 * - An acquire counts its lease from the session lease's last confirmation
 *   (or sends a keepalive beside its put, as for a spare: etcd_lease.c).
 * - A release deletes its key, by name, and nothing else. No call revokes a
 *   session lease (dlock__etcd_lease_revoke refuses its IDs: an operator's
 *   force release deletes the key alone), but the client's close.
 * - When the lease is found gone (a keepalive, or a put refused with "lease
 *   not found"), every lock on it is lost, each told by the renewal that
 *   finds it (on_lost); the next acquire grants a new one.
 * - A lock given up locally (its renewals failed until its deadline) while
 *   the session lease lives on keeps its key until its release deletes it:
 *   nobody else takes the lock meanwhile, and its holder was told.
 *
 * The ID is chosen here (random, bits 62 and 61 set), so that it tells
 * itself apart from a spare's and a token's, even to another client.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "backends/etcd/etcd_int.h"
#include "core/clock.h"

/* A session lease is taken only with this much of its TTL left by its last
 * confirmation (as a spare: the acquire's keepalive renews it anyway). */
#define SESSION_MARGIN_MS 250

static int64_t session_id(void)
{
    uint64_t v = 0;

    while (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v)) {
    }
    return (int64_t)((v & (uint64_t)INT64_MAX) | DLOCK__ETCD_ID_BITS);
}

void dlock__etcd_sessions_init(dlock__etcd_be *be)
{
    pthread_mutex_init(&be->sessions_mu, NULL);
    memset(be->sessions, 0, sizeof(be->sessions));
}

void dlock__etcd_sessions_free(dlock__etcd_be *be)
{
    dlock__etcd_conn *c = NULL;

    for (int i = 0; i < DLOCK__ETCD_SESSIONS; i++) {
        json_t *reply = NULL;
        int64_t id = be->sessions[i].id;
        if (id == 0 || (c == NULL && dlock__etcd_conn_get(be->http, &c) != DLOCK_OK))
            continue;
        dlock__etcd_be_call(be, c, "/v3/lease/revoke", json_pack("{s:I}", "ID", (json_int_t)id),
                            &reply);
        json_decref(reply);
    }
    if (c != NULL)
        dlock__etcd_conn_put(be->http, c);
    pthread_mutex_destroy(&be->sessions_mu);
}

/* The slot of ttl, a free one, or the one least recently used (its lease is
 * forgotten: the renewals of the locks on it keep it, their releases delete
 * their keys, and then it runs out). Under the mutex. */
static dlock__etcd_session *slot_for(dlock__etcd_be *be, int64_t ttl)
{
    dlock__etcd_session *s = NULL;

    for (int i = 0; i < DLOCK__ETCD_SESSIONS; i++)
        if (be->sessions[i].ttl == ttl)
            return &be->sessions[i];
    for (int i = 0; i < DLOCK__ETCD_SESSIONS; i++)
        if (s == NULL || be->sessions[i].used_ms < s->used_ms)
            s = &be->sessions[i];
    memset(s, 0, sizeof(*s));
    s->ttl = ttl;
    return s;
}

int dlock__etcd_session_get(dlock__etcd_be *be, int64_t ttl, int64_t *lease, int64_t *ok_ms)
{
    int64_t now = dlock__now_ms();
    dlock__etcd_session *s;
    int got = 0;

    pthread_mutex_lock(&be->sessions_mu);
    s = slot_for(be, ttl);
    s->used_ms = now;
    if (s->id != 0 && now < s->ok_ms + ttl * 1000 - SESSION_MARGIN_MS) {
        *lease = s->id;
        *ok_ms = s->ok_ms;
        got = 1;
    }
    pthread_mutex_unlock(&be->sessions_mu);
    return got;
}

int dlock__etcd_session_grant(dlock__etcd_be *be, dlock__etcd_conn *c, int64_t ttl,
                              int64_t *lease, int64_t *ok_ms)
{
    int64_t id = session_id(), sent = dlock__now_ms();
    dlock__etcd_session *s;
    int rc;

    *lease = *ok_ms = 0;
    /* A lost reply leaves a lease nobody knows of: nothing keeps it alive,
     * and it runs out by its TTL with nothing on it. */
    if ((rc = dlock__etcd_grant(be, c, id, ttl)) != DLOCK_OK)
        return rc;
    pthread_mutex_lock(&be->sessions_mu);
    s = slot_for(be, ttl);
    /* Two grants that raced: the later one is the slot's; the other backs
     * the key of its acquire, kept alive by its renewals as well. */
    s->id = id;
    s->ok_ms = sent;
    s->used_ms = sent;
    pthread_mutex_unlock(&be->sessions_mu);
    *lease = id;
    *ok_ms = sent;
    return DLOCK_OK;
}

void dlock__etcd_session_seen(dlock__etcd_be *be, int64_t lease, int alive, int64_t sent_ms)
{
    pthread_mutex_lock(&be->sessions_mu);
    for (int i = 0; i < DLOCK__ETCD_SESSIONS; i++) {
        dlock__etcd_session *s = &be->sessions[i];
        if (s->id != lease || lease == 0)
            continue;
        if (!alive)
            s->id = s->ok_ms = 0;
        else if (sent_ms > s->ok_ms)
            s->ok_ms = sent_ms;
    }
    pthread_mutex_unlock(&be->sessions_mu);
}

void dlock__etcd_session_key_drop(dlock__etcd_be *be, dlock__etcd_conn *c, const char *key)
{
    json_t *reply = NULL;

    if (key == NULL)
        return;
    dlock__etcd_be_call(be, c, "/v3/kv/deleterange", json_pack("{s:o}", "key",
                                                               dlock__etcd_str(key)), &reply);
    json_decref(reply);
}

/* ---- the waiting lease ---------------------------------------------------- */

/* The waiting lease is taken as it is only with this much of its TTL left
 * by its last confirmation; else the taker keeps it alive first. */
#define WAITING_MARGIN_MS 500

void dlock__etcd_waiting_init(dlock__etcd_be *be)
{
    memset(&be->waiting, 0, sizeof(be->waiting));
    pthread_mutex_init(&be->waiting.mu, NULL);
    pthread_cond_init(&be->waiting.cond, NULL);
}

void dlock__etcd_waiting_free(dlock__etcd_be *be)
{
    dlock__etcd_waiting *wl = &be->waiting;
    dlock__etcd_conn *c;

    if (wl->id != 0 && dlock__etcd_conn_get(be->http, &c) == DLOCK_OK) {
        json_t *reply = NULL;
        /* Deletes the keys still on it: those whose delete failed. */
        dlock__etcd_be_call(be, c, "/v3/lease/revoke",
                            json_pack("{s:I}", "ID", (json_int_t)wl->id), &reply);
        json_decref(reply);
        dlock__etcd_conn_put(be->http, c);
    }
    while (wl->drops != NULL) {
        dlock__etcd_drop *d = wl->drops;
        wl->drops = d->next;
        free(d->key);
        free(d);
    }
    pthread_cond_destroy(&wl->cond);
    pthread_mutex_destroy(&wl->mu);
}

/* The lease is gone: forget it and wake every waiter joined, whose key went
 * with it (their next try finds that and queues again). Under the mutex. */
static void waiting_lost(dlock__etcd_be *be)
{
    dlock__etcd_waiting *wl = &be->waiting;

    wl->id = wl->ok_ms = 0;
    for (dlock__etcd_watch *w = wl->list; w != NULL; w = w->wl_next)
        dlock__etcd_watch_wake(be, w);
}

int dlock__etcd_waiting_get(dlock__etcd_be *be, dlock__etcd_conn *c, dlock__etcd_watch *w,
                            int64_t ttl, int64_t *lease, int64_t *ok_ms)
{
    dlock__etcd_waiting *wl = &be->waiting;
    int first = 0, rc = DLOCK_OK;

    pthread_mutex_lock(&wl->mu);
    if (!w->joined) {
        w->joined = 1;
        w->wl_prev = NULL;
        w->wl_next = wl->list;
        if (wl->list != NULL)
            wl->list->wl_prev = w;
        wl->list = w;
        first = wl->n++ == 0;
    }
    for (;;) {
        int64_t now = dlock__now_ms(), id = wl->id, sent;
        int alive = 0;
        if (id != 0 && wl->ttl == ttl && now < wl->ok_ms + ttl * 1000 - WAITING_MARGIN_MS) {
            *lease = id;
            *ok_ms = wl->ok_ms;
            break;
        }
        if (wl->busy) {
            /* Another waiter grants it or keeps it alive: its answer is
             * ours too (its call has a timeout; a second look then). */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&wl->cond, &wl->mu, &ts);
            continue;
        }
        wl->busy = 1;
        pthread_mutex_unlock(&wl->mu);
        sent = dlock__now_ms();
        if (id != 0 && wl->ttl == ttl) {
            rc = dlock__etcd_keepalive(be, c, &id, 1, &alive);
        } else {
            /* A lost grant's reply leaves a lease nobody knows of, which
             * runs out by its TTL with nothing on it. */
            id = session_id();
            rc = dlock__etcd_grant(be, c, id, ttl);
            alive = 1;
        }
        pthread_mutex_lock(&wl->mu);
        wl->busy = 0;
        pthread_cond_broadcast(&wl->cond);
        if (rc != DLOCK_OK)
            break;
        if (!alive) {
            if (wl->id == id)
                waiting_lost(be);
            continue;
        }
        if (wl->id != id) {
            /* A new one (the one before, of another TTL, runs out with
             * the keys still on it: their waiters were woken). */
            if (wl->id != 0)
                waiting_lost(be);
            wl->id = id;
            wl->ttl = ttl;
            first = 1; /* the thread learns of it */
        }
        if (sent > wl->ok_ms)
            wl->ok_ms = sent;
    }
    pthread_mutex_unlock(&wl->mu);
    if (first)
        dlock__etcd_spares_wake(be);
    return rc;
}

void dlock__etcd_waiting_seen(dlock__etcd_be *be, int64_t lease, int alive, int64_t sent_ms)
{
    dlock__etcd_waiting *wl = &be->waiting;

    pthread_mutex_lock(&wl->mu);
    if (lease != 0 && wl->id == lease) {
        if (!alive)
            waiting_lost(be);
        else if (sent_ms > wl->ok_ms)
            wl->ok_ms = sent_ms;
    }
    pthread_mutex_unlock(&wl->mu);
}

void dlock__etcd_waiting_leave(dlock__etcd_be *be, dlock__etcd_watch *w)
{
    dlock__etcd_waiting *wl = &be->waiting;

    pthread_mutex_lock(&wl->mu);
    if (w->joined) {
        if (w->wl_prev != NULL)
            w->wl_prev->wl_next = w->wl_next;
        else
            wl->list = w->wl_next;
        if (w->wl_next != NULL)
            w->wl_next->wl_prev = w->wl_prev;
        w->wl_prev = w->wl_next = NULL;
        w->joined = 0;
        wl->n--;
    }
    pthread_mutex_unlock(&wl->mu);
}

/* Delete key by name: DLOCK_OK when the server answered. */
static int drop_key(dlock__etcd_be *be, dlock__etcd_conn *c, const char *key)
{
    json_t *reply = NULL;
    int rc = dlock__etcd_be_call(be, c, "/v3/kv/deleterange",
                                 json_pack("{s:o}", "key", dlock__etcd_str(key)), &reply);

    json_decref(reply);
    return rc;
}

void dlock__etcd_waiting_drop_key(dlock__etcd_be *be, dlock__etcd_conn *c, const char *key)
{
    dlock__etcd_waiting *wl = &be->waiting;
    dlock__etcd_drop *d;

    if (key == NULL || drop_key(be, c, key) == DLOCK_OK)
        return;
    /* Left to the thread: the other waiters keep the lease, and the key on
     * it, alive. Out of memory: the key goes when the lease runs out. */
    if ((d = calloc(1, sizeof(*d))) == NULL || (d->key = strdup(key)) == NULL) {
        free(d);
        return;
    }
    pthread_mutex_lock(&wl->mu);
    d->next = wl->drops;
    wl->drops = d;
    pthread_mutex_unlock(&wl->mu);
    dlock__etcd_spares_wake(be);
}

int dlock__etcd_waiting_job(dlock__etcd_be *be, dlock__etcd_conn *c, int64_t now, int64_t *next)
{
    dlock__etcd_waiting *wl = &be->waiting;
    dlock__etcd_drop *d = NULL;
    int64_t id = 0, due;
    int alive = 0, rc;

    pthread_mutex_lock(&wl->mu);
    if (wl->id != 0 && wl->n > 0 && !wl->busy) {
        due = wl->ok_ms + wl->ttl * 1000 / 3;
        if (due < wl->ka_retry_at)
            due = wl->ka_retry_at;
        if (now >= due)
            id = wl->id;
        else if (due < *next)
            *next = due;
    }
    if (id == 0 && wl->drops != NULL && now >= wl->drop_retry_at) {
        d = wl->drops;
        wl->drops = d->next;
    }
    if (wl->drops != NULL && wl->drop_retry_at < *next)
        *next = wl->drop_retry_at > now ? wl->drop_retry_at : now;
    pthread_mutex_unlock(&wl->mu);
    if (d != NULL) {
        rc = drop_key(be, c, d->key);
        pthread_mutex_lock(&wl->mu);
        if (rc == DLOCK_OK) {
            free(d->key);
            free(d);
        } else {
            d->next = wl->drops;
            wl->drops = d;
            wl->drop_retry_at = now + 1000;
        }
        pthread_mutex_unlock(&wl->mu);
        return 1;
    }
    if (id == 0)
        return 0;
    rc = dlock__etcd_keepalive(be, c, &id, 1, &alive);
    pthread_mutex_lock(&wl->mu);
    if (wl->id == id) {
        if (rc != DLOCK_OK)
            /* Not known: again soon. Only an answer tells it gone. */
            wl->ka_retry_at = dlock__now_ms() + 200;
        else if (!alive)
            waiting_lost(be);
        else if (now > wl->ok_ms)
            wl->ok_ms = now;
    }
    pthread_mutex_unlock(&wl->mu);
    return 1;
}
