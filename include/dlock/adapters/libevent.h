/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The asynchronous API (dlock/async.h) on a libevent 2 event_base, in one
 * call:
 *
 *     dlock_libevent_attach(client, base);
 *     dlock_acquire_async(NULL, client, "jobs", &opts, on_acquired, job);
 *     event_base_dispatch(base);
 *
 * Header-only (static inline functions, after hiredis' adapters/libevent.h):
 * it needs libevent's headers and library in the program that includes it,
 * not in libdlock. Link with libevent 2.0 or later (pkg-config libevent).
 * Under -std=c11 (without GNU extensions) define _POSIX_C_SOURCE 200809L
 * before the first include, for suseconds_t.
 *
 * What it does: an EV_READ|EV_PERSIST event watches dlock_async_fd(client)
 * and a timer event fires after dlock_async_timeout_ms(client); either runs
 * dlock_async_process(client), so every dlock callback runs on the loop's
 * thread, from inside event_base_dispatch. The timer is armed again after
 * every dlock_async_process, and left off while the client asks for none.
 *
 * Lifetime: the two events belong to the client. dlock_client_free (also
 * from inside a dlock callback) deletes and frees them through the client's
 * detach hook (dlock_async_set_detach): free the client before
 * event_base_free. While the client lives its event keeps
 * event_base_dispatch running; free the client to let the loop end.
 *
 * Threading: as dlock/async.h, the loop's thread only.
 */
#ifndef DLOCK_ADAPTERS_LIBEVENT_H
#define DLOCK_ADAPTERS_LIBEVENT_H

#include <event2/event.h>
#include <stdlib.h>

#include "dlock/async.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One per attached client. This and the dlock__ functions below are the
 * adapter's insides, not API: only the attach call is. */
typedef struct {
    dlock_client *client;
    struct event *read_ev;
    struct event *timer_ev;
    /* Inside our own handler: the detach hook must then leave the struct to
     * the handler, which is still using it. */
    int entered;
    /* Set by the detach hook: the client is being freed, or gone. Nothing
     * may touch client once it is set, not even after a
     * dlock_async_process that was running when it was set. */
    int detached;
} dlock__libevent_ctx;

/* Delete and free the events (libevent 2 allows it from inside their own
 * callbacks), and the struct unless a handler still runs on it. */
static inline void dlock__libevent_close(dlock__libevent_ctx *ctx)
{
    ctx->detached = 1;
    if (ctx->read_ev != NULL)
        event_free(ctx->read_ev);
    if (ctx->timer_ev != NULL)
        event_free(ctx->timer_ev);
    ctx->read_ev = ctx->timer_ev = NULL;
    if (!ctx->entered)
        free(ctx);
}

/* The client's detach hook: called once by dlock_client_free, perhaps from
 * inside our own dlock_async_process. */
static inline void dlock__libevent_on_detach(void *arg)
{
    dlock__libevent_close((dlock__libevent_ctx *)arg);
}

/* Arm the timer for the client's next deadline, or stop it when it has
 * none. Nothing once detached. */
static inline void dlock__libevent_arm(dlock__libevent_ctx *ctx)
{
    int64_t ms = dlock_async_timeout_ms(ctx->client);
    struct timeval tv;

    if (ctx->detached)
        return;
    if (ms < 0) {
        evtimer_del(ctx->timer_ev);
        return;
    }
    tv.tv_sec = (time_t)(ms / 1000);
    tv.tv_usec = (suseconds_t)(ms % 1000) * 1000;
    evtimer_add(ctx->timer_ev, &tv);
}

/* For both events: the descriptor is readable, or the timer ran out. */
static inline void dlock__libevent_on_event(evutil_socket_t fd, short what, void *arg)
{
    dlock__libevent_ctx *ctx = (dlock__libevent_ctx *)arg;

    (void)fd;
    (void)what;
    if (ctx->detached)
        return;
    ctx->entered = 1;
    dlock_async_process(ctx->client);
    /* A callback may have freed the client: then the hook has run and the
     * events are gone. */
    if (!ctx->detached)
        dlock__libevent_arm(ctx);
    ctx->entered = 0;
    if (ctx->detached) /* the hook left the struct to us */
        free(ctx);
}

#if LIBEVENT_VERSION_NUMBER >= 0x02010000
/* For event_base_foreach_event: is this our event on the descriptor? */
static inline int dlock__libevent_find(const struct event_base *base, const struct event *ev,
                                      void *arg)
{
    (void)base;
    return event_get_callback(ev) == dlock__libevent_on_event &&
           event_get_fd(ev) == *(const int *)arg;
}
#endif

/*
 * Run client's asynchronous requests on base: watch its descriptor and its
 * deadlines there until dlock_client_free. One event_base per client,
 * attached once; call it before the first request, or at any time from the
 * loop's thread (what is already done runs at the loop's next turn).
 *
 * Returns DLOCK_OK, or, with nothing attached:
 *   DLOCK_EINVAL   NULL client or base
 *   DLOCK_EMISUSE  the client is already attached to this base (libevent
 *                  2.1 and later tell), or the library refused the detach
 *                  hook
 *   DLOCK_ENOMEM   no memory (or libevent refused the events), or
 *                  dlock_async_fd failed: no descriptor could be made, or
 *                  the client is being freed (dlock_error_message() says
 *                  which)
 */
static inline int dlock_libevent_attach(dlock_client *client, struct event_base *base)
{
    dlock__libevent_ctx *ctx;
    int fd, rc;

    if (client == NULL || base == NULL)
        return DLOCK_EINVAL;
    fd = dlock_async_fd(client);
    if (fd < 0)
        return DLOCK_ENOMEM;
#if LIBEVENT_VERSION_NUMBER >= 0x02010000
    /* Two events on one descriptor are allowed by libevent, but two hooks
     * on one client are not: the first would outlive the client. */
    if (event_base_foreach_event(base, dlock__libevent_find, &fd) != 0)
        return DLOCK_EMISUSE;
#endif
    ctx = (dlock__libevent_ctx *)calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        return DLOCK_ENOMEM;
    ctx->client = client;
    ctx->read_ev = event_new(base, fd, EV_READ | EV_PERSIST, dlock__libevent_on_event, ctx);
    ctx->timer_ev = evtimer_new(base, dlock__libevent_on_event, ctx);
    if (ctx->read_ev == NULL || ctx->timer_ev == NULL || event_add(ctx->read_ev, NULL) != 0) {
        dlock__libevent_close(ctx);
        return DLOCK_ENOMEM;
    }
    rc = dlock_async_set_detach(client, dlock__libevent_on_detach, ctx);
    if (rc != DLOCK_OK) {
        dlock__libevent_close(ctx);
        return rc;
    }
    dlock__libevent_arm(ctx);
    return DLOCK_OK;
}

#ifdef __cplusplus
}
#endif

#endif
