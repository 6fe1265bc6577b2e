/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The asynchronous API (dlock/async.h) on a libuv loop, in one call:
 *
 *     dlock_libuv_attach(client, uv_default_loop());
 *     dlock_acquire_async(NULL, client, "jobs", &opts, on_acquired, job);
 *     uv_run(uv_default_loop(), UV_RUN_DEFAULT);
 *
 * Header-only (static inline functions, after hiredis' adapters/libuv.h):
 * it needs libuv's headers and library in the program that includes it,
 * not in libdlock. Link with libuv (pkg-config libuv). Under -std=c11
 * (without GNU extensions) uv.h needs POSIX's types: define
 * _POSIX_C_SOURCE 200809L before the first include.
 *
 * What it does: a uv_poll_t watches dlock_async_fd(client) for
 * readability and a uv_timer_t fires after dlock_async_timeout_ms(client);
 * either runs dlock_async_process(client), so every dlock callback runs on
 * the loop's thread, from inside uv_run. The timer is armed again after
 * every dlock_async_process, and stopped while the client asks for none.
 *
 * Lifetime: the two handles belong to the client. dlock_client_free (also
 * from inside a dlock callback) closes them through the client's detach
 * hook (dlock_async_set_detach), and their memory is freed by the loop's
 * close callbacks: so free the client before the loop stops, and let the
 * loop run once more before uv_loop_close (uv_run returns when nothing
 * else is open). While the client lives its handles keep uv_run running:
 * free the client to let the loop end.
 *
 * Threading: as dlock/async.h, the loop's thread only.
 */
#ifndef DLOCK_ADAPTERS_LIBUV_H
#define DLOCK_ADAPTERS_LIBUV_H

#include <stdlib.h>
#include <uv.h>

#include "dlock/async.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One per attached client. This and the dlock__ functions below are the
 * adapter's insides, not API: only the attach call is. */
typedef struct {
    dlock_client *client;
    uv_poll_t poll;
    uv_timer_t timer;
    /* Set by the detach hook: the client is being freed, or gone. Nothing
     * may touch client once it is set, not even after a
     * dlock_async_process that was running when it was set. */
    int detached;
    /* Handles not closed yet; the struct is freed when it falls to 0. */
    int open_handles;
} dlock__libuv_ctx;

static inline void dlock__libuv_on_close(uv_handle_t *handle)
{
    dlock__libuv_ctx *ctx = (dlock__libuv_ctx *)handle->data;
    if (--ctx->open_handles == 0)
        free(ctx);
}

/* Close both handles; their close callbacks free ctx. uv_close never calls
 * them from inside this call, so ctx stays valid until the loop runs them,
 * after whatever libuv callback we are in has returned. */
static inline void dlock__libuv_close(dlock__libuv_ctx *ctx)
{
    ctx->detached = 1;
    if (!uv_is_closing((uv_handle_t *)&ctx->poll))
        uv_close((uv_handle_t *)&ctx->poll, dlock__libuv_on_close);
    if (!uv_is_closing((uv_handle_t *)&ctx->timer))
        uv_close((uv_handle_t *)&ctx->timer, dlock__libuv_on_close);
}

/* The client's detach hook: called once by dlock_client_free, perhaps from
 * inside our own dlock_async_process. */
static inline void dlock__libuv_on_detach(void *arg)
{
    dlock__libuv_close((dlock__libuv_ctx *)arg);
}

static inline void dlock__libuv_on_timer(uv_timer_t *timer);

/* Arm the timer for the client's next deadline, or stop it when it has
 * none. Nothing once detached. */
static inline void dlock__libuv_arm(dlock__libuv_ctx *ctx)
{
    int64_t ms = dlock_async_timeout_ms(ctx->client);
    if (ctx->detached)
        return;
    if (ms < 0)
        uv_timer_stop(&ctx->timer);
    else
        uv_timer_start(&ctx->timer, dlock__libuv_on_timer, (uint64_t)ms, 0);
}

static inline void dlock__libuv_process(dlock__libuv_ctx *ctx)
{
    if (ctx->detached)
        return;
    dlock_async_process(ctx->client);
    /* A callback may have freed the client: then the hook has run and the
     * handles are closing. */
    if (!ctx->detached)
        dlock__libuv_arm(ctx);
}

static inline void dlock__libuv_on_poll(uv_poll_t *poll, int status, int events)
{
    /* On an error status too: dlock_async_process finds nothing to do on a
     * quiet descriptor, and the client's own errors reach its callbacks. */
    (void)status;
    (void)events;
    dlock__libuv_process((dlock__libuv_ctx *)poll->data);
}

static inline void dlock__libuv_on_timer(uv_timer_t *timer)
{
    dlock__libuv_process((dlock__libuv_ctx *)timer->data);
}

/*
 * Run client's asynchronous requests on loop: watch its descriptor and its
 * deadlines there until dlock_client_free. One loop per client, attached
 * once; call it before the first request, or at any time from the loop's
 * thread (what is already done runs at the loop's next turn).
 *
 * Returns DLOCK_OK, or, with nothing attached:
 *   DLOCK_EINVAL   NULL client or loop
 *   DLOCK_EMISUSE  the client is already attached to this loop, or the
 *                  library refused the detach hook
 *   DLOCK_ENOMEM   no memory, or dlock_async_fd failed: no descriptor
 *                  could be made, or the client is being freed
 *                  (dlock_error_message() says which)
 */
static inline int dlock_libuv_attach(dlock_client *client, uv_loop_t *loop)
{
    dlock__libuv_ctx *ctx;
    int fd, rc;

    if (client == NULL || loop == NULL)
        return DLOCK_EINVAL;
    fd = dlock_async_fd(client);
    if (fd < 0)
        return DLOCK_ENOMEM;
    ctx = (dlock__libuv_ctx *)calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        return DLOCK_ENOMEM;
    ctx->client = client;
    /* libuv refuses a second poll handle on one descriptor of one loop
     * (UV_EEXIST): the client is attached there already. */
    rc = uv_poll_init(loop, &ctx->poll, fd);
    if (rc != 0) {
        free(ctx);
        return rc == UV_EEXIST ? DLOCK_EMISUSE : DLOCK_ENOMEM;
    }
    ctx->poll.data = ctx;
    ctx->open_handles = 1;
    if (uv_timer_init(loop, &ctx->timer) != 0) {
        uv_close((uv_handle_t *)&ctx->poll, dlock__libuv_on_close);
        return DLOCK_ENOMEM;
    }
    ctx->timer.data = ctx;
    ctx->open_handles = 2;
    if (uv_poll_start(&ctx->poll, UV_READABLE, dlock__libuv_on_poll) != 0) {
        dlock__libuv_close(ctx);
        return DLOCK_ENOMEM;
    }
    rc = dlock_async_set_detach(client, dlock__libuv_on_detach, ctx);
    if (rc != DLOCK_OK) {
        dlock__libuv_close(ctx);
        return rc;
    }
    dlock__libuv_arm(ctx);
    return DLOCK_OK;
}

#ifdef __cplusplus
}
#endif

#endif
