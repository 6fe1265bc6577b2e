/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Spare leases: a pool of leases per TTL, granted ahead of need by a thread
 * of the backend's own or given back by releases, so that an uncontended
 * acquire makes one raft write (the put, in its txn) instead of two (grant,
 * put), and a steady cycle no grant at all: a release that sees its key
 * deleted on its spare lease gives the lease back (dlock__etcd_spare_reuse;
 * why that keeps a lease to one held lock at a time: docs/etcd.md, "Spare
 * leases"). The thread grants only when a TTL's pool is empty and no spare
 * of it is in an acquire's hands. And the table of the leases the
 * acquisitions of this client hold, with when each was last found alive,
 * for the release.
 *
 * A spare's lease ID is chosen here (random, bit 62 set, bit 63 clear), so
 * that a grant whose reply was lost is still known: when the grant fails,
 * the thread revokes that ID (best effort), and if that fails too the lease
 * runs out by its own TTL, since nothing keeps it alive. A spare is kept
 * alive while it waits: in the watchdog's renewal request when locks are
 * renewed (its ID added to theirs: no request of its own), else by the
 * thread once half its TTL has gone; the pool of a TTL not used for
 * SPARE_IDLE_MS is revoked. Closing the client revokes the spares; a
 * client that crashes leaves them to run out by their TTL.
 *
 * The acquisitions never ask for a spare themselves: they take their
 * leases from the lease source (etcd_lease.c), which takes a spare here
 * when one is ready, and says there why one granted earlier is safe for an
 * acquisition's lease (the acquire counts the lease from the spare's last
 * confirmation when that is recent, else sends a keepalive of the spare in
 * the same round trip as the put).
 *
 * The thread also keeps the client's waiting lease alive while waiters
 * are queued on it, and deletes again the keys of waiters that left when
 * their delete failed (etcd_session.c, dlock__etcd_waiting_job).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "backends/etcd/etcd_int.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/thread.h"

#define SPARES DLOCK__ETCD_SPARES
#define POOL DLOCK__ETCD_SPARE_POOL
/* A spare unused this long is revoked. */
#define SPARE_IDLE_MS 60000
/* A spare is taken only with this much of its TTL left by its last
 * confirmation (the acquire's keepalive renews it anyway). */
#define SPARE_MARGIN_MS 250

typedef struct {
    int64_t id;
    int64_t ok_ms; /* send time of the grant or keepalive that last confirmed it */
} pooled;

typedef struct {
    int64_t ttl;      /* seconds; 0: the slot is free */
    pooled p[POOL];   /* spares of this TTL, p[0..n) */
    int n;
    int taken;        /* in acquires' hands: they come back or are used up */
    int64_t used_ms;  /* last time an acquire asked for this TTL */
    int64_t retry_at; /* a grant failed: not again before */
} spare;

typedef struct owned {
    char *token;
    int64_t lease; /* 0: not known (an extend whose outcome is unknown) */
    int64_t ttl;
    int64_t ok_ms; /* a spare's: when a keepalive that found it alive was sent; else 0 */
    struct owned *next;
} owned;

/* Leases left to revoke off the caller's path, at most. */
#define LATER 32

struct dlock__etcd_spares {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    pthread_t thread;
    int started, stop;
    spare s[SPARES];
    int64_t later[LATER]; /* leases that back no key, for the thread to revoke */
    int nlater;
    /* The leases the client's acquisitions hold, by token: held_size
     * chains (a power of two), doubled when the entries outnumber them
     * twice. A client may hold thousands; each renewal looks its up. */
    owned **held;
    size_t held_size, nheld;
    dlock__etcd_conn *conn; /* the thread's own */
};

#define HELD_MIN 64

static int64_t random_id(void)
{
    uint64_t v = 0;

    while (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v)) {
    }
    /* Positive, bit 62 set and bit 61 clear: a spare's ID never equals one
     * derived from a token (etcd_keys.c clears both) or a session lease's
     * (both set), and `etcdctl lease list` tells them apart. */
    return (int64_t)((v & (uint64_t)INT64_MAX & ~DLOCK__ETCD_SESSION_BIT) |
                     DLOCK__ETCD_SPARE_BIT);
}

int dlock__etcd_spares_new(dlock__etcd_be *be)
{
    dlock__etcd_spares *sp = calloc(1, sizeof(*sp));

    if (sp == NULL || (sp->held = calloc(HELD_MIN, sizeof(*sp->held))) == NULL) {
        free(sp);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    sp->held_size = HELD_MIN;
    pthread_mutex_init(&sp->mu, NULL);
    pthread_cond_init(&sp->cond, NULL);
    be->spares = sp;
    return dlock__etcd_conn_new(be->http, &sp->conn);
}

/* ---- a slot's pool (under the mutex) ------------------------------------- */

static spare *slot_of(dlock__etcd_spares *sp, int64_t ttl)
{
    for (int i = 0; i < SPARES; i++)
        if (sp->s[i].ttl == ttl)
            return &sp->s[i];
    return NULL;
}

static int pool_find(const spare *s, int64_t id)
{
    for (int i = 0; i < s->n; i++)
        if (s->p[i].id == id)
            return i;
    return -1;
}

static void pool_remove(spare *s, int i)
{
    s->p[i] = s->p[--s->n];
}

/* 1: added; 0: the pool is full (the caller revokes the lease). */
static int pool_add(spare *s, int64_t id, int64_t ok_ms)
{
    if (s->n == POOL)
        return 0;
    s->p[s->n].id = id;
    s->p[s->n].ok_ms = ok_ms;
    s->n++;
    return 1;
}

/* The thread has work on this slot: a spare to grant. */
static int wants_grant(const spare *s)
{
    return s->ttl != 0 && s->n == 0 && s->taken == 0;
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

/* Call with the mutex held, which is let go during the call: revoke. */
static void revoke_unlocked(dlock__etcd_be *be, int64_t id)
{
    dlock__etcd_spares *sp = be->spares;

    pthread_mutex_unlock(&sp->mu);
    dlock__etcd_lease_revoke(be, sp->conn, id);
    pthread_mutex_lock(&sp->mu);
}

/*
 * One job of the thread on slot s, if it has one due (1), else 0 with *next
 * lowered to when it will. Called and returns with the mutex held, let go
 * during the calls; a slot's pool is changed by takes meanwhile, so what a
 * call found is looked up again by lease ID.
 */
static int spare_job(dlock__etcd_be *be, spare *s, int64_t now, int64_t *next)
{
    dlock__etcd_spares *sp = be->spares;
    int64_t ttl = s->ttl, ok = 0, lease;
    int alive = 0, i;

    if (ttl == 0)
        return 0;
    if (now - s->used_ms > SPARE_IDLE_MS && s->taken == 0) {
        spare gone = *s;
        memset(s, 0, sizeof(*s));
        for (i = 0; i < gone.n; i++)
            revoke_unlocked(be, gone.p[i].id);
        return 1;
    }
    if (wants_grant(s) && now < s->retry_at) {
        *next = s->retry_at < *next ? s->retry_at : *next;
        return 0;
    }
    if (wants_grant(s)) {
        pthread_mutex_unlock(&sp->mu);
        lease = grant_spare(be, ttl, &ok);
        pthread_mutex_lock(&sp->mu);
        if (lease != 0 && s->ttl == ttl && pool_add(s, lease, ok))
            return 1;
        if (lease == 0 && s->ttl == ttl)
            s->retry_at = ok + 1000; /* the server is away: not a busy loop */
        else if (lease != 0)
            revoke_unlocked(be, lease); /* the slot went, or filled meanwhile */
        return 1;
    }
    for (i = 0; i < s->n; i++) {
        int64_t due = s->p[i].ok_ms + ttl * 1000 / 2;
        if (now < due) {
            *next = due < *next ? due : *next;
            continue;
        }
        lease = s->p[i].id;
        ok = now;
        pthread_mutex_unlock(&sp->mu);
        if (dlock__etcd_keepalive(be, sp->conn, &lease, 1, &alive) != DLOCK_OK)
            alive = 0;
        pthread_mutex_lock(&sp->mu);
        if (s->ttl == ttl && (i = pool_find(s, lease)) >= 0) {
            if (alive)
                s->p[i].ok_ms = ok;
            else
                pool_remove(s, i); /* gone, or not known: let it run out */
        }
        return 1;
    }
    return 0;
}

/*
 * The thread: grant what is wanted, keep the spares alive every half of
 * their TTL, revoke those left unused.
 */
static void *spare_main(void *arg)
{
    dlock__etcd_be *be = arg;
    dlock__etcd_spares *sp = be->spares;

    pthread_mutex_lock(&sp->mu);
    while (!sp->stop) {
        int64_t now = dlock__now_ms(), next = now + 1000;
        int did = 0;

        /* The waiting lease first: waiters' places hang on it. */
        pthread_mutex_unlock(&sp->mu);
        did = dlock__etcd_waiting_job(be, sp->conn, now, &next);
        pthread_mutex_lock(&sp->mu);
        if (!did && sp->nlater > 0) {
            revoke_unlocked(be, sp->later[--sp->nlater]);
            did = 1;
        }
        for (int i = 0; i < SPARES && !sp->stop && !did; i++)
            did = spare_job(be, &sp->s[i], now, &next);
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

void dlock__etcd_spares_wake(dlock__etcd_be *be)
{
    dlock__etcd_spares *sp = be->spares;

    pthread_mutex_lock(&sp->mu);
    if (!sp->started && !sp->stop) {
        if (dlock__thread_create(&sp->thread, spare_main, be) == 0)
            sp->started = 1;
    } else {
        pthread_cond_signal(&sp->cond);
    }
    pthread_mutex_unlock(&sp->mu);
}

/* A lease that backs no key any more (a waiter's short lease, its key
 * moved onto a spare): revoked by the thread, off the caller's path; on c
 * now when the thread has too many waiting or cannot run (c NULL: never on
 * the caller's thread). Until then it runs out by its TTL, as nothing
 * keeps it alive. */
void dlock__etcd_revoke_later(dlock__etcd_be *be, dlock__etcd_conn *c, int64_t lease)
{
    dlock__etcd_spares *sp = be->spares;
    int queued = 0;

    pthread_mutex_lock(&sp->mu);
    if (sp->started && !sp->stop && sp->nlater < LATER) {
        sp->later[sp->nlater++] = lease;
        pthread_cond_signal(&sp->cond);
        queued = 1;
    }
    pthread_mutex_unlock(&sp->mu);
    if (!queued && c != NULL)
        dlock__etcd_lease_revoke(be, c, lease);
}

/* Stop the thread, revoke the spares and the leases left to revoke,
 * forget the table. */
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
        for (int j = 0; j < sp->s[i].n; j++)
            dlock__etcd_lease_revoke(be, sp->conn, sp->s[i].p[j].id);
    for (int i = 0; i < sp->nlater && sp->conn != NULL; i++)
        dlock__etcd_lease_revoke(be, sp->conn, sp->later[i]);
    for (size_t i = 0; i < sp->held_size; i++)
        while (sp->held[i] != NULL) {
            owned *o = sp->held[i];
            sp->held[i] = o->next;
            free(o->token);
            free(o);
        }
    free(sp->held);
    dlock__etcd_conn_free(sp->conn);
    pthread_cond_destroy(&sp->cond);
    pthread_mutex_destroy(&sp->mu);
    free(sp);
    be->spares = NULL;
}

/*
 * Take a spare of ttl seconds, if there is one the server still has by its
 * last confirmation (its TTL counted from that send time): 1 and *lease,
 * the most recently confirmed. Spares too old for that are forgotten (they
 * run out, as nothing keeps them alive). The thread is woken only when it
 * has a grant to make: no spare left and none in an acquire's hands.
 */
int dlock__etcd_spare_take(dlock__etcd_be *be, int64_t ttl, int64_t *lease, int64_t *ok_ms)
{
    dlock__etcd_spares *sp = be->spares;
    int64_t now = dlock__now_ms();
    spare *s;
    int got = 0, best = -1;

    pthread_mutex_lock(&sp->mu);
    s = slot_of(sp, ttl);
    /* A new TTL takes a free slot, or the one least recently used. */
    if (s == NULL)
        s = slot_of(sp, 0);
    if (s == NULL) {
        s = &sp->s[0];
        for (int i = 1; i < SPARES; i++)
            if (sp->s[i].used_ms < s->used_ms)
                s = &sp->s[i];
        /* Left to run out: the thread never sees them again, and a spare
         * in an acquire's hands is revoked when it comes back. */
        memset(s, 0, sizeof(*s));
    }
    s->ttl = ttl;
    for (int i = 0; i < s->n; i++) {
        if (now >= s->p[i].ok_ms + ttl * 1000 - SPARE_MARGIN_MS)
            pool_remove(s, i--);
        else if (best < 0 || s->p[i].ok_ms > s->p[best].ok_ms)
            best = i;
    }
    if (best >= 0) {
        *lease = s->p[best].id;
        *ok_ms = s->p[best].ok_ms;
        pool_remove(s, best);
        s->taken++;
        got = 1;
    }
    s->used_ms = now;
    if (!sp->started && !sp->stop) {
        if (dlock__thread_create(&sp->thread, spare_main, be) == 0)
            sp->started = 1;
    } else if (wants_grant(s)) {
        pthread_cond_signal(&sp->cond);
    }
    pthread_mutex_unlock(&sp->mu);
    return got;
}

/* A spare comes back to the pool of ttl, alive as of ok_ms, from an
 * acquire that took it (taken: it was in the slot's count) or from a
 * release that confirmed it backs no key any more. Revoked (on c) when
 * the slot is gone or full, or too little of it is left to take it. */
static void give_back(dlock__etcd_be *be, dlock__etcd_conn *c, int64_t ttl, int64_t lease,
                      int64_t ok_ms, int taken)
{
    dlock__etcd_spares *sp = be->spares;
    int64_t now = dlock__now_ms();
    spare *s;
    int kept = 0;

    pthread_mutex_lock(&sp->mu);
    s = slot_of(sp, ttl);
    if (s != NULL && taken && s->taken > 0)
        s->taken--;
    if (s != NULL && now < ok_ms + ttl * 1000 - SPARE_MARGIN_MS)
        kept = pool_add(s, lease, ok_ms);
    pthread_mutex_unlock(&sp->mu);
    if (!kept && c != NULL)
        dlock__etcd_lease_revoke(be, c, lease);
    else if (!kept)
        dlock__etcd_revoke_later(be, NULL, lease);
}

/* A spare that an acquire took but did not use (the lock was busy), alive
 * as of ok_ms. */
void dlock__etcd_spare_return(dlock__etcd_be *be, dlock__etcd_conn *c, int64_t ttl,
                              int64_t lease, int64_t ok_ms)
{
    give_back(be, c, ttl, lease, ok_ms, 1);
}

/*
 * A spare lease an acquisition held, after its release deleted its key
 * (seen in the delete's reply: the key was on this lease), so that it
 * backs no key: the next acquire of this TTL may put its key on it
 * (docs/etcd.md, "Spare leases": why that keeps one lease per acquisition).
 */
void dlock__etcd_spare_reuse(dlock__etcd_be *be, dlock__etcd_conn *c, int64_t ttl,
                             int64_t lease, int64_t ok_ms)
{
    give_back(be, c, ttl, lease, ok_ms, 0);
}

/* The spares to keep alive with the watchdog's renewal: up to max IDs into
 * ids; returns how many. */
size_t dlock__etcd_spares_alive(dlock__etcd_be *be, int64_t *ids, size_t max)
{
    dlock__etcd_spares *sp = be->spares;
    size_t n = 0;

    pthread_mutex_lock(&sp->mu);
    for (int i = 0; i < SPARES; i++)
        for (int j = 0; j < sp->s[i].n && n < max; j++)
            ids[n++] = sp->s[i].p[j].id;
    pthread_mutex_unlock(&sp->mu);
    return n;
}

/* The renewal sent at sent_ms kept spare lease alive (or found it gone). */
void dlock__etcd_spare_renewed(dlock__etcd_be *be, int64_t lease, int alive, int64_t sent_ms)
{
    dlock__etcd_spares *sp = be->spares;

    pthread_mutex_lock(&sp->mu);
    for (int i = 0; i < SPARES; i++) {
        int j = pool_find(&sp->s[i], lease);
        if (j >= 0 && alive && sent_ms > sp->s[i].p[j].ok_ms)
            sp->s[i].p[j].ok_ms = sent_ms;
        else if (j >= 0 && !alive)
            pool_remove(&sp->s[i], j);
    }
    pthread_mutex_unlock(&sp->mu);
}

/* The spare taken for ttl is used up (or lost to an error): the thread
 * grants the next when the pool is empty. */
void dlock__etcd_spare_used(dlock__etcd_be *be, int64_t ttl)
{
    dlock__etcd_spares *sp = be->spares;
    spare *s;

    pthread_mutex_lock(&sp->mu);
    s = slot_of(sp, ttl);
    if (s != NULL && s->taken > 0)
        s->taken--;
    if (s != NULL && wants_grant(s))
        pthread_cond_signal(&sp->cond);
    pthread_mutex_unlock(&sp->mu);
}

/* ---- the leases the acquisitions hold ----------------------------------- */

static size_t held_chain(const dlock__etcd_spares *sp, const char *token)
{
    return dlock__hash_str(token) & (sp->held_size - 1);
}

/* The link that points to token's entry, or the end of its chain. */
static owned **find(dlock__etcd_spares *sp, const char *token)
{
    owned **o = &sp->held[held_chain(sp, token)];

    while (*o != NULL && strcmp((*o)->token, token) != 0)
        o = &(*o)->next;
    return o;
}

/* Room for one entry more: twice the chains when they would average more
 * than two (kept as they are when no memory is left for it). */
static void held_grow(dlock__etcd_spares *sp)
{
    owned **old = sp->held;
    size_t old_size = sp->held_size;

    if (sp->nheld + 1 <= old_size * 2 || (sp->held = calloc(old_size * 2, sizeof(*old))) == NULL) {
        sp->held = old;
        return;
    }
    sp->held_size = old_size * 2;
    for (size_t i = 0; i < old_size; i++)
        while (old[i] != NULL) {
            owned *o = old[i];
            size_t c = held_chain(sp, o->token);
            old[i] = o->next;
            o->next = sp->held[c];
            sp->held[c] = o;
        }
    free(old);
}

int dlock__etcd_held_set(dlock__etcd_be *be, const char *token, int64_t lease, int64_t ttl)
{
    dlock__etcd_spares *sp = be->spares;
    owned **o, *n;

    pthread_mutex_lock(&sp->mu);
    held_grow(sp);
    o = find(sp, token);
    if (*o == NULL) {
        n = calloc(1, sizeof(*n));
        if (n == NULL || (n->token = strdup(token)) == NULL) {
            free(n);
            pthread_mutex_unlock(&sp->mu);
            return dlock__fail(DLOCK_ENOMEM, "out of memory");
        }
        *o = n;
        sp->nheld++;
    }
    if ((*o)->lease != lease)
        (*o)->ok_ms = 0;
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

/* The keepalive sent at ok_ms found token's lease alive (when it is still
 * that lease). */
void dlock__etcd_held_alive(dlock__etcd_be *be, const char *token, int64_t lease, int64_t ok_ms)
{
    dlock__etcd_spares *sp = be->spares;
    owned **o;

    pthread_mutex_lock(&sp->mu);
    o = find(sp, token);
    if (*o != NULL && (*o)->lease == lease && ok_ms > (*o)->ok_ms)
        (*o)->ok_ms = ok_ms;
    pthread_mutex_unlock(&sp->mu);
}

/* held_get and held_drop at once, with the last confirmation of the
 * lease (0: none known). */
int dlock__etcd_held_take(dlock__etcd_be *be, const char *token, int64_t *lease, int64_t *ttl,
                          int64_t *ok_ms)
{
    dlock__etcd_spares *sp = be->spares;
    owned **o, *n;

    pthread_mutex_lock(&sp->mu);
    o = find(sp, token);
    if ((n = *o) != NULL) {
        *o = n->next;
        sp->nheld--;
    }
    pthread_mutex_unlock(&sp->mu);
    *lease = n != NULL ? n->lease : 0;
    *ttl = n != NULL ? n->ttl : 0;
    *ok_ms = n != NULL ? n->ok_ms : 0;
    if (n != NULL)
        free(n->token);
    free(n);
    return n != NULL;
}

void dlock__etcd_held_drop(dlock__etcd_be *be, const char *token)
{
    int64_t lease, ttl, ok_ms;

    dlock__etcd_held_take(be, token, &lease, &ttl, &ok_ms);
}
