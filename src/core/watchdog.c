/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The watchdog: one thread per client renews every auto-renewed lock at a
 * third of its lease (Redisson's rule), batching the locks that are due at
 * about the same time into one backend call, and calls on_lost exactly once
 * for each lock it, or a caller, finds lost.
 *
 * Locking: everything the thread and the callers share is guarded by the
 * client's mutex. The thread never holds the mutex across I/O or a callback;
 * instead it marks the locks it has in hand busy, and dlock_release waits for
 * busy to clear before it frees a lock, so a renewal can never touch freed
 * memory nor run after release.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/thread.h"

/* Most locks renewed in one backend call. */
#define BATCH_MAX 128
/* Most batches taken from one look at the client's locks. Each look visits
 * every lock, so a client holding 10,000 would otherwise walk them all for
 * every 128 it renews (79 walks a renewal period: most of its CPU, issue
 * 33). A lock of a later batch that a caller wants meanwhile (a release,
 * an extend) is let go before its batch is sent: the caller waits for the
 * batch in flight only, as with one batch a look. */
#define BATCHES_PER_LOOK 32

/* An idle watchdog wakes no more often than this (client.h, idle_period_ms):
 * a client with short leases pays a wake-up per acquisition instead. */
#define IDLE_WAKE_MIN_MS 1000

/* Is this the thread that runs the watchdog's calls (its own, or the loop's
 * inside dlock_async_process without threads)? c->mu held. */
static int on_watchdog(const dlock_client *c)
{
    return (c->thread_running && pthread_equal(pthread_self(), c->thread)) ||
           (c->stepping && pthread_equal(pthread_self(), c->step_thread));
}

/* Wait until l leaves the watchdog's hands, c->mu held. Without threads a
 * renewal in flight is answered only when someone reads the connection:
 * read it here (dlock_async_process may be the caller), a poll at a time. */
static void wait_not_busy(dlock_client *c, dlock_lock *l)
{
    while (l->busy) {
        if (c->no_threads && c->wd_inflight) {
            int fds[4];
            unsigned gens[4];
            struct pollfd p[4];
            int n;

            pthread_mutex_unlock(&c->mu);
            n = c->backend->async_fds(c->be, fds, gens, 4);
            for (int i = 0; i < n; i++)
                p[i] = (struct pollfd){fds[i], POLLIN, 0};
            poll(p, (nfds_t)n, 10);
            c->backend->async_step(c->be);
            pthread_mutex_lock(&c->mu);
        } else {
            pthread_cond_wait(&c->idle, &c->mu);
        }
    }
}

void dlock__lock_mark_lost(dlock_lock *l, int reason, const char *message)
{
    char shown[80];

    if (atomic_load(&l->lost_reason) != 0)
        return;
    snprintf(l->lost_message, sizeof(l->lost_message), "%s", message);
    atomic_store(&l->lost_reason, reason);
    if (l->client != NULL) {
        dlock__count(l->client, losses);
        dlock__log(l->client, DLOCK_LOG_ERROR, "lock '%s' lost: %s",
                   dlock__printable(shown, sizeof(shown), l->name), message);
    }
    l->callback_due = l->on_lost != NULL;
    if (l->callback_due && l->client != NULL)
        l->client->callbacks_pending = 1;
}

/* Is the lock's renewal due now? Locks due within a sixth of their lease are
 * renewed together with the one that woke us, to save round trips. A lock
 * whose renewal failed waits out its whole pause before it tries again: its
 * pause (a tenth of the lease at most) is shorter than that sixth, so with
 * the slack it would be due at once, and a server that refuses at once (a
 * dropped connection, a ZooKeeper client between servers) would be asked in
 * a hot loop that starves the reconnect it waits for. */
static int renewal_due(const dlock_lock *l, int64_t now)
{
    int64_t slack = l->retry_count > 0 ? 0 : l->lease_ms / 6;

    return l->auto_renew && l->next_event_ms - slack <= now;
}

/* What a renewal batch's answer means for each of its locks (sent: when
 * it was sent, now: when it was answered), c->mu held: the lease counted
 * from the send, or the lock lost, or a retry planned. Lets them go (busy). */
static void renew_apply(dlock_client *c, dlock_lock **batch, const dlock_renewal *items,
                        size_t n, int rc, int64_t sent, int64_t now)
{
    for (size_t i = 0; i < n; i++) {
        dlock_lock *l = batch[i];
        char msg[256];

        l->busy = 0;
        if (rc == DLOCK_OK && items[i].result == DLOCK_OK &&
            now >= atomic_load(&l->deadline_ms)) {
            /* The lease ran out by the handle's deadline before the reply
             * came: dlock_lock_lost() may have said 1 already, and a lost
             * lock stays lost (dlock.h), with its on_lost. The server's
             * lease, renewed, runs out or is released. */
            snprintf(msg, sizeof(msg), "the lease ran out before its renewal was answered "
                     "(%lld ms after the renewal was sent, lease %lld ms)",
                     (long long)(now - sent), (long long)l->lease_ms);
            dlock__lock_mark_lost(l, DLOCK_ELOST, msg);
        } else if (rc == DLOCK_OK && items[i].result == DLOCK_OK) {
            /* Counted before the deadline moves: whoever sees the lease
             * grow (dlock_lock_valid_ms, without the mutex) sees it counted. */
            dlock__count(c, renewals);
            dlock__lock_start(l, sent);
        } else if (rc == DLOCK_OK) {
            dlock__lock_mark_lost(l, DLOCK_ELOST, "renewal found the lock gone or owned by "
                                  "another (lease expired or taken over)");
        } else if (now >= atomic_load(&l->deadline_ms)) {
            dlock__count(c, renew_failures);
            snprintf(msg, sizeof(msg), "could not renew before the lease ran out: %s",
                     dlock_error_message());
            dlock__lock_mark_lost(l, DLOCK_ECONN, msg);
        } else {
            char shown[80];
            dlock__count(c, renew_failures);
            dlock__log(c, DLOCK_LOG_WARN, "renewal of lock '%s' failed, retrying until its "
                       "lease runs out in %lld ms: %s",
                       dlock__printable(shown, sizeof(shown), l->name),
                       (long long)(atomic_load(&l->deadline_ms) - now), dlock_error_message());
            /* Try again soon, but never later than the deadline. */
            int64_t retry = l->lease_ms / 10 > 1000 ? 1000 : l->lease_ms / 10;
            int64_t next = now + (retry < 20 ? 20 : retry);
            int64_t deadline = atomic_load(&l->deadline_ms);
            l->next_event_ms = next < deadline ? next : deadline;
            l->retry_count++;
        }
    }
    pthread_cond_broadcast(&c->idle);
}

/* A look at l, c->mu held: 1 when it is not one to renew now (in a
 * caller's or the watchdog's hands, lost, or not auto-renewed: then only
 * told when its lease ends, that moment planned in *next). */
static int not_renewed(dlock_lock *l, int64_t now, int64_t *next)
{
    if (l->releasing || l->busy || l->claimers > 0 || atomic_load(&l->lost_reason) != 0)
        return 1;
    if (l->auto_renew)
        return 0;
    if (l->on_lost == NULL)
        return 1;
    if (now >= atomic_load(&l->deadline_ms))
        dlock__lock_mark_lost(l, DLOCK_ELOST, "lease ran out (auto_renew is off)");
    else if (l->next_event_ms < *next)
        *next = l->next_event_ms;
    return 1;
}

static void renew_batch(dlock_client *c, dlock_lock **batch, size_t n)
{
    dlock_request reqs[BATCH_MAX];
    dlock_renewal items[BATCH_MAX];
    dlock__call k;
    int64_t sent, now;
    int rc;

    /* The requests borrow the locks' strings, which live while busy. */
    for (size_t i = 0; i < n; i++) {
        dlock__lock_request(&reqs[i], batch[i]);
        items[i].req = &reqs[i];
        items[i].result = DLOCK_EPROTO;
    }
    pthread_mutex_unlock(&c->mu);
    sent = dlock__now_ms();
    dlock__call_begin(c, &k, "renew", n == 1 ? reqs[0].name : NULL, n, DLOCK__CALL_TIMED);
    rc = dlock__call_end(c, &k, c->backend->renew(c->be, items, n));
    now = dlock__now_ms();
    pthread_mutex_lock(&c->mu);
    renew_apply(c, batch, items, n, rc, sent, now);
}

/* Call on_lost for every lock that has one due, one at a time, without the
 * mutex. Returns 1 if it called any. */
static int fire_callbacks(dlock_client *c)
{
    int seen = 0;

    if (!c->callbacks_pending)
        return 0;
    for (dlock_lock *l = c->locks; l != NULL; l = l->next) {
        if (!l->callback_due)
            continue;
        seen = 1;
        if (l->releasing || l->busy)
            continue; /* busy: claimed by a caller, who pokes us after */
        l->callback_due = 0;
        l->busy = 1;
        pthread_mutex_unlock(&c->mu);
        l->on_lost(l, atomic_load(&l->lost_reason), l->payload);
        pthread_mutex_lock(&c->mu);
        l->busy = 0;
        pthread_cond_broadcast(&c->idle);
        return 1; /* the list may have changed meanwhile: start over */
    }
    c->callbacks_pending = seen;
    return 0;
}

static void *watchdog_main(void *arg)
{
    dlock_client *c = arg;

    pthread_mutex_lock(&c->mu);
    while (!c->stopping) {
        dlock_lock *batch[BATCH_MAX * BATCHES_PER_LOOK];
        size_t n = 0;
        int64_t now = dlock__now_ms(), next = INT64_MAX;

        if (fire_callbacks(c))
            continue;

        for (dlock_lock *l = c->locks; l != NULL; l = l->next) {
            if (not_renewed(l, now, &next))
                continue;
            if (renewal_due(l, now) && n < BATCH_MAX * BATCHES_PER_LOOK) {
                l->busy = 1;
                batch[n++] = l;
            } else if (l->next_event_ms < next) {
                next = l->next_event_ms;
            }
        }
        for (size_t from = 0; from < n; from += BATCH_MAX) {
            size_t k = 0, end = n - from < BATCH_MAX ? n : from + BATCH_MAX;
            int freed = 0;
            /* Those a caller (or the close) waits for meanwhile are left. */
            for (size_t i = from; i < end; i++) {
                dlock_lock *l = batch[i];
                if (c->stopping || l->releasing || l->claimers > 0) {
                    l->busy = 0;
                    freed = 1;
                } else {
                    batch[from + k++] = l;
                }
            }
            if (freed)
                pthread_cond_broadcast(&c->idle);
            if (k > 0)
                renew_batch(c, batch + from, k);
        }
        if (n > 0)
            continue;
        if (fire_callbacks(c))
            continue;
        if (next == INT64_MAX && c->idle_period_ms > 0)
            next = now + (c->idle_period_ms > IDLE_WAKE_MIN_MS ? c->idle_period_ms
                                                                : IDLE_WAKE_MIN_MS);
        c->sleep_until_ms = next;
        if (next == INT64_MAX) {
            pthread_cond_wait(&c->wake, &c->mu);
        } else if (next > now) {
            struct timespec ts = dlock__deadline_ts(next - now);
            pthread_cond_timedwait(&c->wake, &c->mu, &ts);
        }
        c->sleep_until_ms = -1;
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

void dlock__watchdog_poke(dlock_client *c, const dlock_lock *l)
{
    if (c->no_threads) {
        /* The loop times the next step: have it look again. */
        if (l->auto_renew || l->on_lost != NULL || l->callback_due)
            dlock__async_wake(c);
        return;
    }
    if ((l->auto_renew || l->on_lost != NULL || l->callback_due) && c->sleep_until_ms >= 0 &&
        (l->callback_due || l->next_event_ms < c->sleep_until_ms))
        pthread_cond_signal(&c->wake);
}

int dlock__client_register(dlock_client *c, dlock_lock *l)
{
    int rc = DLOCK_OK;

    pthread_mutex_lock(&c->mu);
    if (!c->thread_running && !c->no_threads && (l->auto_renew || l->on_lost != NULL)) {
        if (dlock__thread_create(&c->thread, watchdog_main, c) != 0)
            rc = dlock__fail(DLOCK_ENOMEM, "cannot start the watchdog thread");
        else
            c->thread_running = 1;
    }
    if (rc == DLOCK_OK) {
        int64_t period = l->next_event_ms - dlock__now_ms();
        if (period > 0 && (c->idle_period_ms == 0 || period < c->idle_period_ms))
            c->idle_period_ms = period;
        l->next = c->locks;
        if (c->locks != NULL)
            c->locks->prev = l;
        c->locks = l;
        dlock__watchdog_poke(c, l);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int dlock__client_unregister(dlock_client *c, dlock_lock *l)
{
    pthread_mutex_lock(&c->mu);
    if (l->busy && on_watchdog(c)) {
        pthread_mutex_unlock(&c->mu);
        return dlock__fail(DLOCK_EMISUSE, "dlock_release: called from inside the lock's on_lost "
                           "callback; release it after the callback returns");
    }
    l->releasing = 1;
    wait_not_busy(c, l);
    if (l->prev != NULL)
        l->prev->next = l->next;
    else
        c->locks = l->next;
    if (l->next != NULL)
        l->next->prev = l->prev;
    l->prev = l->next = NULL;
    pthread_mutex_unlock(&c->mu);
    return DLOCK_OK;
}

int dlock__client_in_callback(dlock_client *c, const dlock_lock *l)
{
    int in;

    pthread_mutex_lock(&c->mu);
    in = l->busy && on_watchdog(c);
    pthread_mutex_unlock(&c->mu);
    return in;
}

int dlock__client_claim(dlock_client *c, dlock_lock *l)
{
    pthread_mutex_lock(&c->mu);
    if (l->busy && on_watchdog(c)) {
        pthread_mutex_unlock(&c->mu);
        return dlock__fail(DLOCK_EMISUSE, "called from inside the lock's on_lost callback");
    }
    /* While we wait, the watchdog leaves the lock alone: with a lease as
     * short as a round trip or two, it would otherwise renew it back to
     * back and never let us have it. */
    l->claimers++;
    wait_not_busy(c, l);
    l->claimers--;
    l->busy = 1;
    pthread_mutex_unlock(&c->mu);
    return DLOCK_OK;
}

void dlock__client_unclaim(dlock_client *c, dlock_lock *l)
{
    pthread_mutex_lock(&c->mu);
    l->busy = 0;
    pthread_cond_broadcast(&c->idle);
    dlock__watchdog_poke(c, l);
    pthread_mutex_unlock(&c->mu);
}

void dlock__watchdog_stop(dlock_client *c)
{
    int running;

    pthread_mutex_lock(&c->mu);
    /* Without threads: the renewal in flight is read (or times out) before
     * the connection closes under it. */
    for (dlock_lock *l = c->locks; l != NULL && c->wd_inflight; l = l->next)
        wait_not_busy(c, l);
    free(c->wd_batch);
    c->wd_batch = NULL;
    c->stopping = 1;
    running = c->thread_running;
    pthread_cond_signal(&c->wake);
    pthread_mutex_unlock(&c->mu);
    if (running)
        pthread_join(c->thread, NULL);
    c->thread_running = 0;
}

/* ---- without a thread of its own (DLOCK_CLIENT_NO_THREADS) ---------------- */

/* The renewal batch in flight: the locks in hand (busy), their requests. */
struct dlock__wd_batch {
    dlock_client *c;
    size_t n;
    int rc, answered, ended;
    int64_t sent;
    dlock__call call;
    dlock_lock *locks[BATCH_MAX];
    dlock_request reqs[BATCH_MAX];
    dlock_renewal items[BATCH_MAX];
};

/* Its answer, on whichever thread read it (the backend's mutex held). */
static void batch_done(void *arg, int rc)
{
    struct dlock__wd_batch *b = arg;
    dlock_client *c = b->c;
    int64_t now = dlock__now_ms();

    pthread_mutex_lock(&c->mu);
    renew_apply(c, b->locks, b->items, b->n, rc, b->sent, now);
    b->rc = rc;
    b->answered = 1;
    c->wd_inflight = 0;
    pthread_mutex_unlock(&c->mu);
    /* The next step plans the next renewal. */
    dlock__async_wake(c);
}

int64_t dlock__watchdog_step(dlock_client *c)
{
    struct dlock__wd_batch *b;
    int64_t now, next = INT64_MAX;
    size_t n = 0;
    int rc;

    pthread_mutex_lock(&c->mu);
    c->stepping = 1;
    c->step_thread = pthread_self();
    while (fire_callbacks(c))
        ;
    if ((b = c->wd_batch) != NULL && b->answered && !b->ended) {
        b->ended = 1;
        pthread_mutex_unlock(&c->mu);
        dlock__call_end(c, &b->call, b->rc);
        pthread_mutex_lock(&c->mu);
    }
    if (!c->wd_inflight && b == NULL && (b = calloc(1, sizeof(*b))) != NULL)
        c->wd_batch = b;
    now = dlock__now_ms();
    for (dlock_lock *l = c->locks; l != NULL; l = l->next) {
        if (not_renewed(l, now, &next))
            continue;
        if (renewal_due(l, now) && !c->wd_inflight && b != NULL && n < BATCH_MAX) {
            l->busy = 1;
            b->locks[n] = l;
            dlock__lock_request(&b->reqs[n], l);
            b->items[n] = (dlock_renewal){&b->reqs[n], DLOCK_EPROTO};
            n++;
        } else if (renewal_due(l, now)) {
            next = now; /* the next batch, once this one is answered */
        } else if (l->next_event_ms < next) {
            next = l->next_event_ms;
        }
    }
    if (n > 0) {
        b->c = c;
        b->n = n;
        b->answered = b->ended = 0;
        c->wd_inflight = 1;
        pthread_mutex_unlock(&c->mu);
        b->sent = dlock__now_ms();
        dlock__call_begin(c, &b->call, "renew", n == 1 ? b->reqs[0].name : NULL, n,
                          DLOCK__CALL_TIMED);
        rc = c->backend->renew_start(c->be, b->items, n, batch_done, b);
        pthread_mutex_lock(&c->mu);
        if (rc != DLOCK_OK) {
            renew_apply(c, b->locks, b->items, n, rc, b->sent, dlock__now_ms());
            c->wd_inflight = 0;
            b->ended = 1;
            pthread_mutex_unlock(&c->mu);
            dlock__call_end(c, &b->call, rc);
            pthread_mutex_lock(&c->mu);
            next = now;
        }
    }
    while (fire_callbacks(c))
        ;
    c->stepping = 0;
    pthread_mutex_unlock(&c->mu);
    return next == INT64_MAX ? -1 : next;
}
