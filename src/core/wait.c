/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The one acquire loop, for a single lock and for a multi-lock taken in one
 * atomic step: try; if busy and the caller waits, watch the lock that was
 * busy and try again at once (a release between the try and the watch's
 * registration is then not missed), then sleep until a release is
 * announced or the holder's lease should have run out, and try again.
 */
#include <stdio.h>
#include <time.h>

#include "core/client.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/wait.h"

/* A holder's key with no expiry (set by hand) announces nothing: look again
 * this often rather than sleep forever. */
#define NO_TTL_RECHECK_MS 1000
/* A blocking wait of a client without threads tries again this often, at
 * most (the asynchronous API's waits too: async.c's POLL_MS). */
#define NO_THREADS_POLL_MS 100

int dlock__outcome_unknown(int rc)
{
    return rc == DLOCK_ECONN || rc == DLOCK_ETIMEOUT || rc == DLOCK_EPROTO;
}

int dlock__busy_fail(const char *name, int64_t wait_ms, const dlock_acquire_result *res)
{
    char shown[80];

    dlock__printable(shown, sizeof(shown), name);
    if (wait_ms == 0)
        return dlock__fail(DLOCK_EBUSY, "lock '%s' is held by another owner (lease left %lld ms)",
                           shown, (long long)res->retry_ms);
    return dlock__fail(DLOCK_ETIMEOUT, "lock '%s' still held by another owner after waiting "
                       "%lld ms", shown, (long long)wait_ms);
}

int64_t dlock__busy_sleep_ms(int64_t deadline, int64_t now, const dlock_acquire_result *res)
{
    int64_t sleep_ms = deadline - now;
    int64_t retry = res->retry_ms < 0 ? NO_TTL_RECHECK_MS : res->retry_ms;

    /* +1: wake just after the holder's lease, not just before it. */
    if (retry < INT64_MAX && retry + 1 < sleep_ms)
        sleep_ms = retry + 1;
    return sleep_ms;
}

/* Begin watching req, ending the watch held so far. */
static int watch_again(dlock_client *c, dlock__waiter *waiter, void **watch,
                       const dlock_request *req)
{
    int rc;

    if (*watch != NULL) {
        dlock__waiting_remove(c, waiter);
        c->backend->watch_end(c->be, *watch);
        *watch = NULL;
    }
    if ((rc = dlock__interrupt_ready(c)) != DLOCK_OK)
        return rc;
    rc = c->backend->watch_begin(c->be, req, watch);
    if (rc == DLOCK_OK)
        dlock__waiting_add(c, waiter, *watch);
    return rc;
}

int dlock__acquire_loop(dlock_client *c, const dlock__attempt *a, int64_t wait_ms,
                        dlock_acquire_result *res)
{
    const dlock_backend *b = c->backend;
    /* The start's millisecond rounded up: a wait that times out lasted
     * wait_ms at least, to the microsecond (the statistics' wait time). */
    int64_t start_us = dlock__now_us(), start = (start_us + 999) / 1000;
    int waited = 0;
    int64_t deadline = wait_ms == DLOCK_WAIT_FOREVER ? INT64_MAX : start + wait_ms;
    const dlock_request *watched = NULL;
    dlock__waiter waiter;
    void *watch = NULL;
    char shown[80];
    int rc;

    /* A backend whose queued try is as cheap as its try-once: join the
     * queue at once instead of trying, undoing and joining. */
    if (a->queue_first != NULL && wait_ms != 0 && (b->caps & DLOCK_CAP_QUEUE_FIRST) &&
        !c->no_threads) {
        if ((rc = watch_again(c, &waiter, &watch, a->queue_first)) != DLOCK_OK)
            return rc;
        watched = a->queue_first;
    }
    for (;;) {
        const dlock_request *busy;
        int64_t now, sleep_ms;

        if (watch != NULL && (rc = dlock__check_interrupt(c, watched->name)) != DLOCK_OK)
            break;
        res->lease_from_ms = dlock__now_ms();
        res->retry_ms = -1;
        res->handed = 0;
        rc = a->try_once(a->ctx, watch, res);
        /* A try-once whose reply never came may have taken the lock: give
         * it back (a waiting try's leave, in watch_end, does the same). */
        if (watch == NULL && dlock__outcome_unknown(rc))
            a->give_back(a->ctx);
        if (rc != DLOCK_EBUSY)
            break;
        dlock__count(c, busy);
        busy = a->busy(a->ctx, res);
        now = dlock__now_ms();
        if (wait_ms == 0 || now >= deadline) {
            rc = dlock__busy_fail(busy->name, wait_ms, res);
            break;
        }
        if (!waited) {
            waited = 1;
            dlock__count(c, waits);
        }
        if (c->no_threads) {
            /* No thread to subscribe with (DLOCK_CLIENT_NO_THREADS): try
             * again after a while, no queue joined. */
            struct timespec ts;
            if (busy->kind != DLOCK_KIND_MUTEX) {
                rc = dlock__fail(DLOCK_ENOTSUP, "waiting for lock '%s': a wait for a lock of "
                                 "the family (fair, read-write, semaphore) keeps a place in "
                                 "its queue, which needs the client's threads: not with "
                                 "DLOCK_CLIENT_NO_THREADS (a try, wait_ms 0, is served)",
                                 dlock__printable(shown, sizeof(shown), busy->name));
                break;
            }
            if ((rc = dlock__check_interrupt(c, busy->name)) != DLOCK_OK)
                break;
            sleep_ms = dlock__busy_sleep_ms(deadline, now, res);
            sleep_ms = sleep_ms < NO_THREADS_POLL_MS ? sleep_ms : NO_THREADS_POLL_MS;
            ts.tv_sec = (time_t)(sleep_ms / 1000);
            ts.tv_nsec = (long)(sleep_ms % 1000) * 1000000L;
            nanosleep(&ts, NULL);
            continue;
        }
        if (watch == NULL || busy != watched) {
            if ((rc = watch_again(c, &waiter, &watch, busy)) != DLOCK_OK)
                break;
            watched = busy;
            continue;
        }
        sleep_ms = dlock__busy_sleep_ms(deadline, now, res);
        rc = b->watch_wait(c->be, watch, sleep_ms);
        if (rc != DLOCK_OK && rc != DLOCK_ETIMEOUT)
            break;
    }
    if (watch != NULL) {
        char msg[512];
        /* The caller reports why it stopped waiting, not how leaving went. */
        snprintf(msg, sizeof(msg), "%s", dlock_error_message());
        dlock__waiting_remove(c, &waiter);
        b->watch_end(c->be, watch);
        if (rc != DLOCK_OK)
            dlock__fail(rc, "%s", msg);
        else
            dlock__clear_error();
    }
    if (waited)
        dlock__histogram_add(c->stats.wait_us, &c->stats.wait_us_sum, dlock__now_us() - start_us);
    if (rc == DLOCK_OK) {
        dlock__count(c, acquires);
        if (res->handed) {
            dlock__count(c, handoffs);
            dlock__log(c, DLOCK_LOG_INFO, "lock '%s' was handed over by its holder's release",
                       dlock__printable(shown, sizeof(shown), a->busy(a->ctx, res)->name));
        }
    }
    return rc;
}
