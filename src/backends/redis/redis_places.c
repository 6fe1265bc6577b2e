/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The places of a client's fair waiters, kept alive in batches.
 *
 * A fair waiter's place in its lock's queue expires unless it is renewed
 * (excl_acquire.lua): a waiter that died must not keep the queue waiting.
 * Each waiter used to renew its own, by a try each third of the expiry;
 * 10,000 waiters of one client were then 10,000 scripts every second or
 * so, most of a core (issue 33). Now the subscriber thread (redis_watch.c)
 * renews every due place of the client in scripts of up to PLACES_BATCH
 * (fair_keep.lua), and wakes the waiters whose turn it may be: the head of
 * the queue of a free lock (its holder's lease ran out without a release),
 * or a waiter whose place is gone. Between those, a waiter sleeps until a
 * release names it on the channel, as before.
 *
 * Places are kept this way on a single server and behind Sentinel; on a
 * cluster, whose keys of different locks live on different nodes, each
 * waiter keeps its own place as before.
 */
#include <stdlib.h>
#include <string.h>

#include "backends/redis/redis_int.h"
#include "core/clock.h"
#include "core/error.h"

/* Places renewed by one script. */
#define PLACES_BATCH 128

/* A waiter with a place kept for it tries on its own this often at least
 * (the upkeep wakes it when its turn may have come; this is a floor under
 * a fault the upkeep cannot see). */
#define PLACE_RECHECK_MS 60000

struct dlock__redis_place {
    dlock__redis_watch *watch; /* NULL once its waiter left (dead) */
    char *key;                 /* the lock's base key */
    char *wid;                 /* the waiter's id, its place in the queue */
    int64_t ttl_ms, due_ms;    /* the place's expiry; when to renew it */
    int busy;                  /* in a batch being sent */
    dlock__redis_place *next, *prev;
};

static int64_t refresh_ms(int64_t ttl_ms)
{
    return ttl_ms / 3 > 0 ? ttl_ms / 3 : 1; /* dlock_refresh_ms (lib/family.lua) */
}

int dlock__redis_places_init(dlock__redis_places *ps)
{
    memset(ps, 0, sizeof(*ps));
    ps->next_due_ms = INT64_MAX;
    if (pthread_mutex_init(&ps->mu, NULL) != 0)
        return dlock__fail(DLOCK_ENOMEM, "cannot create a mutex");
    ps->ready = 1;
    return DLOCK_OK;
}

void dlock__redis_places_destroy(dlock__redis_places *ps)
{
    if (!ps->ready)
        return;
    /* Every watch dropped its place (watch_close) before the client closes. */
    while (ps->first != NULL) {
        dlock__redis_place *p = ps->first;
        ps->first = p->next;
        free(p->key);
        free(p->wid);
        free(p);
    }
    pthread_mutex_destroy(&ps->mu);
    ps->ready = 0;
}

static void unlink_place(dlock__redis_places *ps, dlock__redis_place *p)
{
    if (p->prev != NULL)
        p->prev->next = p->next;
    else
        ps->first = p->next;
    if (p->next != NULL)
        p->next->prev = p->prev;
    free(p->key);
    free(p->wid);
    free(p);
}

int dlock__redis_place_keep(dlock__redis_be *be, dlock__redis_watch *w, const char *key,
                            int64_t ttl_ms, int64_t *retry_ms)
{
    dlock__redis_places *ps = &be->places;
    dlock__redis_place *p = w->place;
    int64_t due = dlock__now_ms() + refresh_ms(ttl_ms);
    int poke = 0;

    if (be->cmd[0].is_cluster || !ps->ready || !dlock__redis_watcher_running(be->watcher))
        return 0;
    pthread_mutex_lock(&ps->mu);
    if (p == NULL) {
        p = calloc(1, sizeof(*p));
        if (p == NULL || (p->key = strdup(key)) == NULL ||
            (p->wid = strdup(dlock__redis_watch_id(w->waiter))) == NULL) {
            pthread_mutex_unlock(&ps->mu);
            if (p != NULL)
                free(p->key);
            free(p);
            return 0; /* the waiter keeps its own place */
        }
        p->watch = w;
        p->next = ps->first;
        if (p->next != NULL)
            p->next->prev = p;
        ps->first = p;
        w->place = p;
    }
    p->ttl_ms = ttl_ms;
    p->due_ms = due;
    if (due < ps->next_due_ms) {
        ps->next_due_ms = due;
        poke = 1;
    }
    pthread_mutex_unlock(&ps->mu);
    if (poke)
        dlock__redis_watcher_poke(be->watcher);
    /* Not at the holder's lease either: the upkeep looks after that. */
    *retry_ms = PLACE_RECHECK_MS;
    return 1;
}

void dlock__redis_place_drop(dlock__redis_be *be, dlock__redis_watch *w)
{
    dlock__redis_places *ps = &be->places;
    dlock__redis_place *p = w->place;

    if (p == NULL)
        return;
    pthread_mutex_lock(&ps->mu);
    if (p->busy)
        p->watch = NULL; /* the upkeep frees it when its batch is back */
    else
        unlink_place(ps, p);
    w->place = NULL;
    pthread_mutex_unlock(&ps->mu);
}

/* Renew the places of batch[0..n) in one script (none when send is 0);
 * wake the waiters whose turn it may be, and all of them when the script
 * failed or was not sent (each then tries on its own, which renews its
 * place). Returns the script's result. */
static int keep_batch(dlock__redis_be *be, dlock__redis_place **batch, size_t n, int send)
{
    dlock__redis_places *ps = &be->places;
    const char *argv[3 * PLACES_BATCH];
    size_t lens[3 * PLACES_BATCH];
    char ttls[PLACES_BATCH][24];
    int64_t sent = dlock__now_ms();
    redisReply *r = NULL;
    const char *verdict = NULL;
    int rc = DLOCK_ECONN;

    for (size_t i = 0; send && i < n; i++) {
        argv[i] = batch[i]->key;
        lens[i] = strlen(batch[i]->key);
        argv[n + 2 * i] = batch[i]->wid;
        lens[n + 2 * i] = strlen(argv[n + 2 * i]);
        snprintf(ttls[i], sizeof(ttls[i]), "%lld", (long long)batch[i]->ttl_ms);
        argv[n + 2 * i + 1] = ttls[i];
        lens[n + 2 * i + 1] = strlen(ttls[i]);
    }
    if (send)
        rc = dlock__redis_cmd_script(be, &dlock__redis_script_fair_keep, &r, (int)n,
                                     (int)(3 * n), argv, lens);
    if (rc == DLOCK_OK && (r->type != REDIS_REPLY_STRING || r->len != n)) {
        dlock__redis_bad_reply(be->cmd, "fair_keep.lua (not one character a place)");
        rc = DLOCK_EPROTO;
    }
    if (rc == DLOCK_OK)
        verdict = r->str;
    pthread_mutex_lock(&ps->mu);
    for (size_t i = 0; i < n; i++) {
        dlock__redis_place *p = batch[i];
        p->busy = 0;
        if (p->watch == NULL) {
            unlink_place(ps, p);
            continue;
        }
        p->due_ms = sent + refresh_ms(p->ttl_ms);
        if (p->due_ms < ps->next_due_ms)
            ps->next_due_ms = p->due_ms;
        if (verdict == NULL || verdict[i] == '1')
            dlock__redis_watch_wake(be->watcher, p->watch->waiter);
    }
    pthread_mutex_unlock(&ps->mu);
    if (r != NULL)
        freeReplyObject(r);
    return rc;
}

/* The subscriber thread's upkeep (dlock__redis_watcher_set_upkeep): renew
 * the places due now, and those due within half a renewal, so that places
 * fall into step and few scripts carry them all. One walk of the places
 * finds all that are due. Returns the ms until the next place is due, -1
 * for none. */
int64_t dlock__redis_places_upkeep(void *arg)
{
    dlock__redis_be *be = arg;
    dlock__redis_places *ps = &be->places;
    dlock__redis_place *stack[PLACES_BATCH], **due = stack;
    int64_t now = dlock__now_ms(), next = INT64_MAX;
    size_t n = 0, cap = PLACES_BATCH;

    pthread_mutex_lock(&ps->mu);
    if (ps->next_due_ms > now) {
        next = ps->next_due_ms;
        pthread_mutex_unlock(&ps->mu);
        return next == INT64_MAX ? -1 : next - now;
    }
    for (dlock__redis_place *p = ps->first; p != NULL; p = p->next) {
        if (p->busy || p->watch == NULL)
            continue;
        if (p->due_ms > now + refresh_ms(p->ttl_ms) / 2) {
            if (p->due_ms < next)
                next = p->due_ms;
            continue;
        }
        if (n == cap) {
            dlock__redis_place **more =
                malloc(2 * cap * sizeof(*more)); /* no memory: the rest next turn */
            if (more == NULL) {
                next = now;
                break;
            }
            memcpy(more, due, n * sizeof(*more));
            if (due != stack)
                free(due);
            due = more;
            cap *= 2;
        }
        p->busy = 1;
        due[n++] = p;
    }
    ps->next_due_ms = next; /* keep_batch lowers it to the renewed places' */
    pthread_mutex_unlock(&ps->mu);
    /* After a failed script the rest are not sent: with the server down,
     * each would hold this thread (and the client's close) for a command
     * timeout. Their waiters try on their own meanwhile. */
    for (size_t from = 0, ok = 1; from < n; from += PLACES_BATCH)
        ok = keep_batch(be, due + from, n - from < PLACES_BATCH ? n - from : PLACES_BATCH,
                        (int)ok) == DLOCK_OK;
    if (due != stack)
        free(due);
    pthread_mutex_lock(&ps->mu);
    next = ps->next_due_ms;
    pthread_mutex_unlock(&ps->mu);
    now = dlock__now_ms();
    return next == INT64_MAX ? -1 : next > now ? next - now : 0;
}
