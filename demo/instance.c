/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * One instance of the payout service: a process of its own, with its own
 * dlock client and its own store connection, running the payout job each
 * time the scheduler fires it.
 *
 * The job, as a service would write it:
 *
 *     lock = try the lock (wait 0, lease --ttl, renewed by the watchdog)
 *     [fence] register the lock's fence at the store
 *     orders = the pending orders
 *     for each order:
 *         prepare the transfer (takes --pay-time)
 *         stop if the lock is known lost (dlock_lock_lost: no I/O)
 *         commit the transfer (a ledger row) and mark the order paid
 *     release the lock
 *
 * Checking dlock_lock_lost() before every write is the best a lease alone
 * can do, and it still leaves a gap between the check and the write. The
 * scheduler freezes the holder exactly there (the instance tells it when it
 * reaches the chosen order and waits for its word), so every pause lands on
 * the worst spot rather than on a lucky one.
 */
#include "demo_int.h"

#include <dlock/dlock.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    const demo_instance_config *cfg;
    dlock_client *client;
    demo_store *store;
    int round;
} instance;

/* What on_lost needs, fixed for the lock's lifetime (the watchdog thread
 * reads it while the main thread moves on). */
typedef struct {
    const demo_instance_config *cfg;
    int round;
} lost_ctx;

static void emit(const demo_instance_config *cfg, demo_event *ev)
{
    ev->instance = cfg->index;
    ev->at_us = demo_now_us();
    /* One write of less than PIPE_BUF bytes: atomic, even when the watchdog
     * thread reports at the same moment. A failure means the scheduler is
     * gone, and the next read of a command will end this process. */
    (void)demo_write_all(cfg->ev_fd, ev, sizeof *ev);
}

static void emit_simple(instance *in, demo_event_type type, int64_t order, uint64_t fence, int code)
{
    demo_event ev;
    memset(&ev, 0, sizeof ev);
    ev.type = type;
    ev.round = in->round;
    ev.order = order;
    ev.fence = fence;
    ev.code = code;
    emit(in->cfg, &ev);
}

static void emit_error(instance *in, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void emit_error(instance *in, int code, const char *fmt, ...)
{
    demo_event ev;
    memset(&ev, 0, sizeof ev);
    ev.type = EV_ERROR;
    ev.round = in->round;
    ev.code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ev.text, sizeof ev.text, fmt, ap);
    va_end(ap);
    emit(in->cfg, &ev);
}

/* From the watchdog thread: report only (it must return quickly). */
static void on_lost(dlock_lock *lock, int reason, void *payload)
{
    const lost_ctx *lc = payload;
    demo_event ev;
    memset(&ev, 0, sizeof ev);
    ev.type = EV_LOST;
    ev.round = lc->round;
    ev.code = reason;
    ev.fence = dlock_lock_fence(lock);
    emit(lc->cfg, &ev);
}

/* Read one command; 0, or -1 when the scheduler is gone. */
static int read_command(int fd, demo_command *cmd)
{
    size_t got = 0;
    while (got < sizeof *cmd) {
        ssize_t n = read(fd, (char *)cmd + got, sizeof *cmd - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

/* Returns -1 when the scheduler said quit or went away. */
static int run_job(instance *in, int pause_at)
{
    const demo_instance_config *cfg = in->cfg;
    dlock_lock *lock = NULL;
    uint64_t fence = 0;
    int64_t *ids = NULL;
    size_t n = 0;
    int quit = 0;
    /* Outlives the lock: on_lost is never called after dlock_release. */
    lost_ctx lc = {cfg, in->round};

    if (cfg->mode != DEMO_NOLOCK) {
        dlock_acquire_options ao = DLOCK_ACQUIRE_OPTIONS_INIT;
        ao.wait_ms = 0;
        ao.lease_ms = cfg->ttl_ms;
        ao.auto_renew = 1;
        ao.on_lost = on_lost;
        ao.payload = &lc;
        int64_t t = demo_now_us();
        int rc = dlock_acquire(&lock, in->client, cfg->lock_name, &ao);
        int64_t latency = demo_now_us() - t;
        if (rc == DLOCK_EBUSY) {
            demo_event ev;
            memset(&ev, 0, sizeof ev);
            ev.type = EV_BUSY;
            ev.round = in->round;
            ev.latency_us = latency;
            emit(cfg, &ev);
            goto done;
        }
        if (rc != DLOCK_OK) {
            emit_error(in, rc, "acquire %s: %s", cfg->lock_name, dlock_error_message());
            goto done;
        }
        fence = dlock_lock_fence(lock);
        demo_event ev;
        memset(&ev, 0, sizeof ev);
        ev.type = EV_ACQUIRED;
        ev.round = in->round;
        ev.fence = fence;
        ev.latency_us = latency;
        emit(cfg, &ev);

        if (cfg->mode == DEMO_FENCE) {
            /* Before reading anything: from now on the store refuses every
             * holder with a lower fence. */
            demo_store_result r = demo_store_register(in->store, fence);
            if (r == STORE_REFUSED) {
                emit_simple(in, EV_REG_REFUSED, 0, fence, 0);
                goto done;
            }
            if (r == STORE_ERROR) {
                emit_error(in, 0, "store: %s", demo_store_error(in->store));
                goto done;
            }
        }
    }

    if (demo_store_pending(in->store, &ids, &n) != 0) {
        emit_error(in, 0, "store: %s", demo_store_error(in->store));
        goto done;
    }
    emit_simple(in, EV_READ, (int64_t)n, fence, 0);

    size_t pause_idx = (size_t)-1;
    if (pause_at >= 0 && n > 0)
        pause_idx = (size_t)pause_at < n ? (size_t)pause_at : n - 1;

    for (size_t i = 0; i < n; i++) {
        demo_sleep_us(cfg->pay_ms * 1000); /* preparing the transfer */
        if (lock != NULL && dlock_lock_lost(lock))
            break;
        if (i == pause_idx) {
            demo_command cmd;
            emit_simple(in, EV_PAUSE_POINT, ids[i], fence, 0);
            if (read_command(cfg->cmd_fd, &cmd) != 0 || cmd.type == CMD_QUIT) {
                quit = 1;
                break;
            }
        }
        demo_store_result r = demo_store_pay(in->store, cfg->mode, ids[i], fence, cfg->index);
        if (r == STORE_ERROR) {
            emit_error(in, 0, "store: %s", demo_store_error(in->store));
            break;
        }
        emit_simple(in, r == STORE_OK ? EV_PAID : EV_REFUSED, ids[i], fence, 0);
        if (r == STORE_REFUSED && cfg->mode == DEMO_FENCE)
            break; /* a newer holder exists: this one's batch is over */
    }

done:
    free(ids);
    {
        int rc = lock != NULL ? dlock_release(lock) : DLOCK_OK;
        emit_simple(in, EV_DONE, 0, fence, rc);
    }
    return quit ? -1 : 0;
}

int demo_instance_run(const demo_instance_config *cfg)
{
    instance in;
    memset(&in, 0, sizeof in);
    in.cfg = cfg;
    int status = DEMO_EXIT_SOFTWARE;

    if (cfg->mode != DEMO_NOLOCK) {
        char name[64];
        snprintf(name, sizeof name, "dlock-demo-%d", cfg->index);
        dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
        co.client_name = name;
        int rc = dlock_client_open(&in.client, cfg->url, &co);
        if (rc != DLOCK_OK) {
            emit_error(&in, rc, "instance %d: %s", cfg->index, dlock_error_message());
            status = DEMO_EXIT_UNAVAILABLE;
            goto out;
        }
    }
    char err[512];
    in.store = demo_store_open(cfg->store_spec, cfg->store_ns, err, sizeof err);
    if (in.store == NULL) {
        emit_error(&in, 0, "instance %d: %s", cfg->index, err);
        goto out;
    }
    emit_simple(&in, EV_READY, 0, 0, 0);

    for (;;) {
        demo_command cmd;
        if (read_command(cfg->cmd_fd, &cmd) != 0 || cmd.type == CMD_QUIT)
            break;
        if (cmd.type != CMD_ROUND)
            continue;
        in.round = cmd.round;
        if (run_job(&in, cmd.pause_at) != 0)
            break;
    }
    status = DEMO_EXIT_OK;
out:
    demo_store_close(in.store);
    dlock_client_free(in.client);
    return status;
}
