/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Spare leases: one lease per TTL granted ahead of need by a thread of the
 * backend's own, so that an uncontended acquire makes one raft write (the
 * put, in its txn) instead of two (grant, put). And the table of the leases
 * the acquisitions of this client hold, so that a release is one revoke,
 * which deletes the key with its lease.
 *
 * A spare's lease ID is chosen here (random, bit 62 set, bit 63 clear), so
 * that a grant whose reply was lost is still known: when the grant fails,
 * the thread revokes that ID (best effort), and if that fails too the lease
 * runs out by its own TTL, since nothing keeps it alive. A spare is kept
 * alive while it waits: in the watchdog's renewal request when locks are
 * renewed (its ID added to theirs: no request of its own), else by the
 * thread once half its TTL has gone; one not used for SPARE_IDLE_MS is
 * revoked. Closing the client revokes the spares; a
 * client that crashes leaves them to run out by their TTL.
 *
 * Why a spare granted earlier is safe for an acquisition's lease: see
 * try_spare in etcd_queue.c (the acquire sends a keepalive of the spare in
 * the same round trip as the put, after the core noted the send time).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "backends/etcd/etcd_int.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/thread.h"

#define SPARES DLOCK__ETCD_SPARES
/* A spare unused this long is revoked. */
#define SPARE_IDLE_MS 60000
/* The slot's spare is in an acquire's hands: it comes back (the lock was
 * busy) or is used up (dlock__etcd_spare_used). */
#define TAKEN (-1)

typedef struct {
    int64_t ttl;     /* seconds; 0: the slot is free */
    int64_t lease;   /* 0: wanted, not granted yet; TAKEN: an acquire has it */
    int64_t ok_ms;   /* send time of the grant or keepalive that last confirmed it */
    int64_t used_ms; /* last time an acquire asked for this TTL */
    int64_t retry_at; /* a grant failed: not again before */
} spare;

typedef struct owned {
    char *token;
    int64_t lease; /* 0: not known (an extend whose outcome is unknown) */
    int64_t ttl;
    struct owned *next;
} owned;

struct dlock__etcd_spares {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    pthread_t thread;
    int started, stop;
    spare s[SPARES];
    owned *held;
    dlock__etcd_conn *conn; /* the thread's own */
};

static int64_t random_id(void)
{
    uint64_t v = 0;

    while (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v)) {
    }
    /* Positive, and bit 62 set: a spare's ID never equals one derived from
     * a token (etcd_keys.c clears that bit), and `etcdctl lease list`
     * tells them apart. */
    return (int64_t)((v & (uint64_t)INT64_MAX) | DLOCK__ETCD_SPARE_BIT);
}

int dlock__etcd_spares_new(dlock__etcd_be *be)
{
    dlock__etcd_spares *sp = calloc(1, sizeof(*sp));

    if (sp == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    pthread_mutex_init(&sp->mu, NULL);
    pthread_cond_init(&sp->cond, NULL);
    be->spares = sp;
    return dlock__etcd_conn_new(be->http, &sp->conn);
}

/* Grant a spare of ttl seconds; 0 when it failed (its ID revoked, best
 * effort: a lease whose grant reply was lost may exist). */
static int64_t grant_spare(dlock__etcd_be *be, int64_t ttl, int64_t *ok_ms)
{
    dlock__etcd_spares *sp = be->spares;
    int64_t id = random_id();

    *ok_ms = dlock__now_ms();
    if (dlock__etcd_grant(be, sp->conn, id, ttl) == DLOCK_OK)
        return id;
    dlock__etcd_lease_revoke(be, sp->conn, id);
    return 0;
}

/*
 * The thread: grant what is wanted, keep the spares alive every third of
 * their TTL, revoke those left unused. Calls are made without the mutex; a
 * slot is only ever granted or kept alive here, and an acquire that takes a
 * spare empties its slot under the mutex first.
 */
static void *spare_main(void *arg)
{
    dlock__etcd_be *be = arg;
    dlock__etcd_spares *sp = be->spares;

    pthread_mutex_lock(&sp->mu);
    while (!sp->stop) {
        int64_t now = dlock__now_ms(), next = now + 1000;
        int did = 0;

        for (int i = 0; i < SPARES && !sp->stop && !did; i++) {
            spare *s = &sp->s[i];
            int64_t ttl = s->ttl, lease = s->lease, ok = 0;
            int alive = 0;

            if (ttl == 0 || lease == TAKEN)
                continue;
            if (now - s->used_ms > SPARE_IDLE_MS) {
                memset(s, 0, sizeof(*s));
                pthread_mutex_unlock(&sp->mu);
                if (lease != 0)
                    dlock__etcd_lease_revoke(be, sp->conn, lease);
                pthread_mutex_lock(&sp->mu);
                did = 1;
            } else if (lease == 0 && now < s->retry_at) {
                next = s->retry_at < next ? s->retry_at : next;
            } else if (lease == 0) {
                pthread_mutex_unlock(&sp->mu);
                lease = grant_spare(be, ttl, &ok);
                pthread_mutex_lock(&sp->mu);
                if (lease != 0 && s->ttl == ttl && s->lease == 0) {
                    s->lease = lease;
                    s->ok_ms = ok;
                } else if (lease == 0 && s->ttl == ttl) {
                    s->retry_at = ok + 1000; /* the server is away: not a busy loop */
                } else if (lease != 0) {
                    pthread_mutex_unlock(&sp->mu);
                    dlock__etcd_lease_revoke(be, sp->conn, lease);
                    pthread_mutex_lock(&sp->mu);
                }
                did = 1;
            } else if (now >= s->ok_ms + ttl * 1000 / 2) {
                ok = now;
                pthread_mutex_unlock(&sp->mu);
                if (dlock__etcd_keepalive(be, sp->conn, &lease, 1, &alive) != DLOCK_OK)
                    alive = 0;
                pthread_mutex_lock(&sp->mu);
                if (s->lease == lease && alive) {
                    s->ok_ms = ok;
                } else if (s->lease == lease) {
                    s->lease = 0; /* gone, or not known: a new one */
                }
                did = 1;
            } else if (s->ok_ms + ttl * 1000 / 2 < next) {
                next = s->ok_ms + ttl * 1000 / 2;
            }
        }
        if (!did && !sp->stop) {
            struct timespec ts;
            int64_t wait = next - now < 10 ? 10 : next - now;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += (time_t)(wait / 1000);
            ts.tv_nsec += (long)(wait % 1000) * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&sp->cond, &sp->mu, &ts);
        }
    }
    pthread_mutex_unlock(&sp->mu);
    return NULL;
}

/* Stop the thread, revoke the spares, forget the table. */
void dlock__etcd_spares_free(dlock__etcd_be *be)
{
    dlock__etcd_spares *sp = be->spares;

    if (sp == NULL)
        return;
    pthread_mutex_lock(&sp->mu);
    sp->stop = 1;
    pthread_cond_signal(&sp->cond);
    pthread_mutex_unlock(&sp->mu);
    if (sp->started)
        pthread_join(sp->thread, NULL);
    for (int i = 0; i < SPARES && sp->conn != NULL; i++)
        if (sp->s[i].lease > 0)
            dlock__etcd_lease_revoke(be, sp->conn, sp->s[i].lease);
    while (sp->held != NULL) {
        owned *o = sp->held;
        sp->held = o->next;
        free(o->token);
        free(o);
    }
    dlock__etcd_conn_free(sp->conn);
    pthread_cond_destroy(&sp->cond);
    pthread_mutex_destroy(&sp->mu);
    free(sp);
    be->spares = NULL;
}

/*
 * Take the spare of ttl seconds, if there is one the server still has by
 * the last confirmation (its TTL counted from that send time): 1 and *lease.
 * Either way the thread is asked for the next one.
 */
int dlock__etcd_spare_take(dlock__etcd_be *be, int64_t ttl, int64_t *lease)
{
    dlock__etcd_spares *sp = be->spares;
    int64_t now = dlock__now_ms();
    spare *s = NULL;
    int got = 0;

    pthread_mutex_lock(&sp->mu);
    for (int i = 0; i < SPARES && s == NULL; i++)
        if (sp->s[i].ttl == ttl)
            s = &sp->s[i];
    /* A new TTL takes a free slot, or the one least recently used. */
    for (int i = 0; i < SPARES && s == NULL; i++)
        if (sp->s[i].ttl == 0)
            s = &sp->s[i];
    if (s == NULL) {
        s = &sp->s[0];
        for (int i = 1; i < SPARES; i++)
            if (sp->s[i].used_ms < s->used_ms)
                s = &sp->s[i];
        /* Left to run out: the thread never sees it again. */
        memset(s, 0, sizeof(*s));
    }
    if (s->ttl == ttl && s->lease > 0 && now < s->ok_ms + ttl * 1000 - 250) {
        *lease = s->lease;
        got = 1;
    }
    s->ttl = ttl;
    /* Taken: the next one is asked for only when this one is used, so that
     * a busy try, which gives it back, costs no grant. */
    s->lease = got ? TAKEN : s->lease == TAKEN ? TAKEN : 0;
    s->used_ms = now;
    if (!sp->started && !sp->stop) {
        if (dlock__thread_create(&sp->thread, spare_main, be) == 0)
            sp->started = 1;
    }
    pthread_cond_signal(&sp->cond);
    pthread_mutex_unlock(&sp->mu);
    return got;
}

/* A spare that an acquire took but did not use (the lock was busy), alive
 * as of ok_ms: back into its slot, unless the thread granted another
 * meanwhile, in which case it is revoked. */
void dlock__etcd_spare_return(dlock__etcd_be *be, dlock__etcd_conn *c, int64_t ttl,
                              int64_t lease, int64_t ok_ms)
{
    dlock__etcd_spares *sp = be->spares;
    int kept = 0;

    pthread_mutex_lock(&sp->mu);
    for (int i = 0; i < SPARES && !kept; i++)
        if (sp->s[i].ttl == ttl && sp->s[i].lease == TAKEN) {
            sp->s[i].lease = lease;
            sp->s[i].ok_ms = ok_ms;
            kept = 1;
        }
    pthread_mutex_unlock(&sp->mu);
    if (!kept)
        dlock__etcd_lease_revoke(be, c, lease);
}

/* The spares to keep alive with the watchdog's renewal: up to max IDs into
 * ids; returns how many. */
size_t dlock__etcd_spares_alive(dlock__etcd_be *be, int64_t *ids, size_t max)
{
    dlock__etcd_spares *sp = be->spares;
    size_t n = 0;

    pthread_mutex_lock(&sp->mu);
    for (int i = 0; i < SPARES && n < max; i++)
        if (sp->s[i].lease > 0)
            ids[n++] = sp->s[i].lease;
    pthread_mutex_unlock(&sp->mu);
    return n;
}

/* The renewal sent at sent_ms kept spare lease alive (or found it gone). */
void dlock__etcd_spare_renewed(dlock__etcd_be *be, int64_t lease, int alive, int64_t sent_ms)
{
    dlock__etcd_spares *sp = be->spares;

    pthread_mutex_lock(&sp->mu);
    for (int i = 0; i < SPARES; i++)
        if (sp->s[i].lease == lease) {
            if (alive)
                sp->s[i].ok_ms = sent_ms;
            else
                sp->s[i].lease = 0;
        }
    pthread_cond_signal(&sp->cond);
    pthread_mutex_unlock(&sp->mu);
}

/* The spare taken for ttl is used up (or lost to an error): ask the thread
 * for the next. */
void dlock__etcd_spare_used(dlock__etcd_be *be, int64_t ttl)
{
    dlock__etcd_spares *sp = be->spares;

    pthread_mutex_lock(&sp->mu);
    for (int i = 0; i < SPARES; i++)
        if (sp->s[i].ttl == ttl && sp->s[i].lease == TAKEN)
            sp->s[i].lease = 0;
    pthread_cond_signal(&sp->cond);
    pthread_mutex_unlock(&sp->mu);
}

/* ---- the leases the acquisitions hold ----------------------------------- */

static owned **find(dlock__etcd_spares *sp, const char *token)
{
    owned **o = &sp->held;

    while (*o != NULL && strcmp((*o)->token, token) != 0)
        o = &(*o)->next;
    return o;
}

int dlock__etcd_held_set(dlock__etcd_be *be, const char *token, int64_t lease, int64_t ttl)
{
    dlock__etcd_spares *sp = be->spares;
    owned **o, *n;

    pthread_mutex_lock(&sp->mu);
    o = find(sp, token);
    if (*o == NULL) {
        n = calloc(1, sizeof(*n));
        if (n == NULL || (n->token = strdup(token)) == NULL) {
            free(n);
            pthread_mutex_unlock(&sp->mu);
            return dlock__fail(DLOCK_ENOMEM, "out of memory");
        }
        *o = n;
    }
    (*o)->lease = lease;
    (*o)->ttl = ttl;
    pthread_mutex_unlock(&sp->mu);
    return DLOCK_OK;
}

int dlock__etcd_held_get(dlock__etcd_be *be, const char *token, int64_t *lease, int64_t *ttl)
{
    dlock__etcd_spares *sp = be->spares;
    owned **o;
    int found;

    pthread_mutex_lock(&sp->mu);
    o = find(sp, token);
    found = *o != NULL;
    *lease = found ? (*o)->lease : 0;
    *ttl = found ? (*o)->ttl : 0;
    pthread_mutex_unlock(&sp->mu);
    return found;
}

void dlock__etcd_held_drop(dlock__etcd_be *be, const char *token)
{
    dlock__etcd_spares *sp = be->spares;
    owned **o, *n;

    pthread_mutex_lock(&sp->mu);
    o = find(sp, token);
    if ((n = *o) != NULL)
        *o = n->next;
    pthread_mutex_unlock(&sp->mu);
    if (n != NULL)
        free(n->token);
    free(n);
}
