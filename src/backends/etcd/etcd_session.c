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
