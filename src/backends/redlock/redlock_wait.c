/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Waiting without polling: a waiter subscribes to the lock's release
 * channel on every node (each node's subscriber thread, redis_watch.c) and
 * sleeps on one bell that any of them rings. A holder held a quorum and
 * releases on every node; the waiter is subscribed on a quorum at least
 * (watch_begin fails otherwise), and two quorums meet: some node the
 * waiter listens to announces the release. A node that is down announces
 * nothing, so the core also wakes at the holder's validity (retry_ms, at
 * most a quarter of the waiter's own lease: redlock.c).
 */
#include <stdlib.h>
#include <string.h>

#include "backends/redlock/redlock_int.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/thread.h"

typedef struct {
    dlock__redis_bell bell;
    dlock__redis_waiter *waiters[DLOCK__REDLOCK_NODES_MAX];
} redlock_watch;

static void free_watch(dlock__redlock_be *be, redlock_watch *w)
{
    for (size_t i = 0; i < be->n; i++)
        if (w->waiters[i] != NULL)
            dlock__redis_watch_end(be->nodes[i].watcher, w->waiters[i]);
    pthread_cond_destroy(&w->bell.cond);
    pthread_mutex_destroy(&w->bell.mu);
    free(w);
}

int dlock__redlock_watch_begin(void *arg, const dlock_request *req, void **watch)
{
    dlock__redlock_be *be = arg;
    redlock_watch *w;
    char chan[128 + DLOCK_NAME_MAX + 32];
    size_t ok = 0;
    int rc = DLOCK_OK;

    *watch = NULL;
    w = calloc(1, sizeof(*w));
    if (w == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    if (pthread_mutex_init(&w->bell.mu, NULL) != 0) {
        free(w);
        return dlock__fail(DLOCK_ENOMEM, "cannot create a mutex");
    }
    if (dlock__cond_init(&w->bell.cond) != 0) {
        pthread_mutex_destroy(&w->bell.mu);
        free(w);
        return dlock__fail(DLOCK_ENOMEM, "cannot create a condition variable");
    }
    snprintf(chan, sizeof(chan), "%s{%s}:release", be->prefix, req->name);
    for (size_t i = 0; i < be->n; i++) {
        int r = dlock__redis_watch_begin_bell(be->nodes[i].watcher, chan, &w->bell,
                                              &w->waiters[i]);
        if (r == DLOCK_OK)
            ok++;
        else if (rc == DLOCK_OK)
            rc = r;
    }
    /* A node that is down confirms nothing but is still registered: its
     * subscriber wakes us when it is back. Only resources can fail here. */
    if (ok < be->n) {
        free_watch(be, w);
        return rc;
    }
    *watch = w;
    return DLOCK_OK;
}

int dlock__redlock_watch_wait(void *arg, void *watch, int64_t timeout_ms)
{
    dlock__redlock_be *be = arg;
    redlock_watch *w = watch;
    struct timespec until = dlock__deadline_ts(timeout_ms);
    int rc = DLOCK_OK;

    pthread_mutex_lock(&w->bell.mu);
    while (!w->bell.rung)
        if (pthread_cond_timedwait(&w->bell.cond, &w->bell.mu, &until) != 0) {
            rc = DLOCK_ETIMEOUT;
            break;
        }
    w->bell.rung = 0;
    pthread_mutex_unlock(&w->bell.mu);
    /* After rung is cleared: a wake-up from now on rings again. */
    for (size_t i = 0; i < be->n; i++)
        dlock__redis_watch_consume(be->nodes[i].watcher, w->waiters[i]);
    return rc;
}

void dlock__redlock_watch_end(void *arg, void *watch)
{
    if (watch != NULL)
        free_watch(arg, watch);
}

void dlock__redlock_watch_wake(void *arg, void *watch)
{
    (void)arg;
    dlock__redis_bell_ring(&((redlock_watch *)watch)->bell);
}

/* A release is announced to a client as one wake-up (its subscriber wakes
 * the first of its waiters), and it takes the nodes' flags with it
 * (release.lua). A waiter woken so that wins must flag the nodes again
 * when others of the client still wait, or nothing sets the flags before
 * its release and that release is announced to no one: the others, which
 * made no try since, would sleep out their quarter lease. */
int dlock__redlock_watch_shared(dlock__redlock_be *be, void *watch)
{
    redlock_watch *w = watch;

    for (size_t i = 0; i < be->n; i++)
        if (w->waiters[i] != NULL &&
            dlock__redis_watch_shared(be->nodes[i].watcher, w->waiters[i]))
            return 1;
    return 0;
}

/* The asynchronous API's waiter: the bell calls fn each time it rings,
 * from a node's subscriber thread or the waker's (watch_end unhooks every
 * node's waiter first, so nobody calls it after). */
void dlock__redlock_watch_notify(void *arg, void *watch, void (*fn)(void *), void *fn_arg)
{
    redlock_watch *w = watch;

    (void)arg;
    pthread_mutex_lock(&w->bell.mu);
    w->bell.notify = fn;
    w->bell.notify_arg = fn_arg;
    pthread_mutex_unlock(&w->bell.mu);
}
