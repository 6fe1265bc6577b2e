/* SPDX-License-Identifier: BSD-3-Clause */
/* The one acquire loop (wait.c), for single locks and atomic multi-locks. */
#ifndef DLOCK_CORE_WAIT_H
#define DLOCK_CORE_WAIT_H

#include "dlock/sys/backend.h"

struct dlock_client;

/* What the loop tries, for whom. */
typedef struct {
    /* One try with watch (NULL before the caller waits): the backend's
     * acquire or multi_acquire. */
    int (*try_once)(void *ctx, void *watch, dlock_acquire_result *res);
    /* The request whose release to wait for after a busy try. */
    const dlock_request *(*busy)(void *ctx, const dlock_acquire_result *res);
    /* Give back, by token, whatever a try whose reply never came may have
     * taken; best effort. */
    void (*give_back)(void *ctx);
    void *ctx;
    /* The one lock a waiting acquisition may queue for before its first
     * try (DLOCK_CAP_QUEUE_FIRST), or NULL (a multi-lock). */
    const dlock_request *queue_first;
} dlock__attempt;

/*
 * Try, and while busy wait up to wait_ms (0: try once; DLOCK_WAIT_FOREVER)
 * for a release. DLOCK_OK with *res of the winning try (its lease_from_ms is
 * when it was sent); DLOCK_EBUSY (wait_ms 0), DLOCK_ETIMEOUT, DLOCK_EINTR
 * (dlock_client_interrupt) or the backend's error, with a message naming
 * the busy lock. Whatever a wait queued is left before it returns.
 */
int dlock__acquire_loop(struct dlock_client *c, const dlock__attempt *a, int64_t wait_ms,
                        dlock_acquire_result *res);

/* Could the server have run a request whose call failed with rc? */
int dlock__outcome_unknown(int rc);

/* A busy try's failure once the caller stops: DLOCK_EBUSY for a try-once
 * (wait_ms 0), else DLOCK_ETIMEOUT, with the message naming the lock. */
int dlock__busy_fail(const char *name, int64_t wait_ms, const dlock_acquire_result *res);

/* How long a waiter sleeps after a busy try (res) before it tries again
 * unless a release is announced: to the deadline, or just past the
 * holder's lease. */
int64_t dlock__busy_sleep_ms(int64_t deadline, int64_t now, const dlock_acquire_result *res);

#endif
