/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Waiting for releases without polling: one subscriber connection per client,
 * driven by one thread, shared by all the client's waiters. Each release
 * PUBLISHes on the lock's channel, and the message says whom to wake:
 *   "all"        every waiter of the channel (a read-write lock can admit
 *                many readers; an election changed leader);
 *   a waiter id  only the waiter registered with that id (the head of a
 *                fair lock's queue), in whichever client it waits; an id
 *                is random and not the waiter's owner token, which never
 *                travels on a channel;
 *   "grant ID FENCE"  the release handed the plain mutex to the waiter
 *                registered with id ID (redis.c, release.lua): it wakes
 *                to confirm the hand-off with a try (the message alone is
 *                never trusted), and where ID is not ours, one waiter of
 *                the channel wakes to look after the confirm window. (A
 *                grant pushed to a waiter that listens, redis_listen.c,
 *                is not announced.)
 *   anything else ("released") one waiter of the channel, the longest
 *                waiting, since one release can only be won once.
 */
#ifndef DLOCK_REDIS_WATCH_H
#define DLOCK_REDIS_WATCH_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/redis/redis_conn.h"

typedef struct dlock__redis_watcher dlock__redis_watcher;
typedef struct dlock__redis_waiter dlock__redis_waiter;

int dlock__redis_watcher_new(dlock__redis_watcher **out, const dlock_url *url,
                             const dlock_client_options *opts);
void dlock__redis_watcher_free(dlock__redis_watcher *w);

/* Have the subscriber thread call upkeep(arg) on each of its turns (it
 * returns the ms until it wants the next, -1 for none), before the first
 * waiter starts the thread. */
void dlock__redis_watcher_set_upkeep(dlock__redis_watcher *w, int64_t (*upkeep)(void *),
                                     void *arg);
/* Have the thread take a turn now (its upkeep has something sooner). */
void dlock__redis_watcher_poke(dlock__redis_watcher *w);
/* 1 when the thread runs (a waiter started it), else 0. */
int dlock__redis_watcher_running(dlock__redis_watcher *w);

/* Subscribe (if no waiter of this client already did) and return once the
 * server has confirmed the subscription, or the command timeout passed.
 * id (copied; NULL for none) is what a targeted message names: a random id
 * of the waiter's own, never its owner token. */
int dlock__redis_watch_begin(dlock__redis_watcher *w, const char *channel, const char *id,
                             dlock__redis_waiter **out);

/*
 * For a waiter on several watchers at once (Redlock: one per node): bell is
 * rung, besides the waiter's own wake-up, whenever any of them is woken.
 * The waiter sleeps on the bell instead of dlock__redis_watch_wait; after
 * the bell rang it clears rung first and then each waiter's wake-up with
 * dlock__redis_watch_consume (in that order, so no wake-up is lost). Lock
 * order: a watcher's mutex, then the bell's.
 */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int rung;
    /* Called, under mu, each time it rings (NULL: nobody): the waiter of
     * the asynchronous API, which sleeps on no condition variable. */
    void (*notify)(void *);
    void *notify_arg;
} dlock__redis_bell;

/* Ring bell: rung, its sleepers woken, its notify called. */
void dlock__redis_bell_ring(dlock__redis_bell *bell);

/* As dlock__redis_watch_begin, and ring bell (borrowed until watch_end). */
int dlock__redis_watch_begin_bell(dlock__redis_watcher *w, const char *channel,
                                  dlock__redis_bell *bell, dlock__redis_waiter **out);
/* Clear the waiter's wake-up, so that the next message wakes it again. */
void dlock__redis_watch_consume(dlock__redis_watcher *w, dlock__redis_waiter *waiter);
/* 1 when another waiter of this watcher waits on the waiter's channel. */
int dlock__redis_watch_shared(dlock__redis_watcher *w, dlock__redis_waiter *waiter);
/* Wake the waiter's current or next dlock__redis_watch_wait. */
void dlock__redis_watch_wake(dlock__redis_watcher *w, dlock__redis_waiter *waiter);
/* The id the waiter was registered with ("" for none). */
const char *dlock__redis_watch_id(const dlock__redis_waiter *waiter);
/* DLOCK_OK when a release woke us, DLOCK_ETIMEOUT after timeout_ms. */
int dlock__redis_watch_wait(dlock__redis_watcher *w, dlock__redis_waiter *waiter,
                            int64_t timeout_ms);
void dlock__redis_watch_end(dlock__redis_watcher *w, dlock__redis_waiter *waiter);

/* Have fn(arg) called, with the watcher's mutex held, each time x is woken,
 * and here at once if it was woken before and has not waited since (its
 * next watch_wait would return at once): the backend's watch_notify (the
 * asynchronous API's waiters), and a waiter that listens for its grant on a
 * socket of its own and polls a pipe beside it (redis_listen.c). fn NULL
 * ends it. */
void dlock__redis_watch_notify(dlock__redis_watcher *w, dlock__redis_waiter *x,
                               void (*fn)(void *), void *arg);

#endif
