/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Waiting between the tries of an etcd acquisition: sleeping on a watch of
 * the key just ahead in the queue while keeping our own key's lease alive,
 * an election observer's watch of the whole directory, leaving the queue,
 * and the wake-up another thread can send.
 */
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "backends/etcd/etcd_int.h"
#include "core/clock.h"
#include "core/error.h"

/* ---- waiting -------------------------------------------------------------- */

int dlock__etcd_watch_new(const char *name, dlock__etcd_watch **out)
{
    dlock__etcd_watch *w = calloc(1, sizeof(*w));

    *out = NULL;
    if (w == NULL || (w->name = strdup(name)) == NULL) {
        free(w);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    w->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (w->wake_fd < 0) {
        free(w->name);
        free(w);
        return dlock__fail(DLOCK_ENOMEM, "cannot create an eventfd");
    }
    *out = w;
    return DLOCK_OK;
}

/* A watch_wake since the last look: consume it. */
static int take_wake(dlock__etcd_watch *w)
{
    uint64_t n;

    if (!atomic_exchange(&w->woken, 0))
        return 0;
    if (w->wake_fd >= 0 && read(w->wake_fd, &n, sizeof(n)) < 0) {
        /* nothing pending: fine */
    }
    return 1;
}

int dlock__etcd_watch_begin(void *arg, const dlock_request *req, void **watch)
{
    (void)arg;
    /* Nothing to register yet: the first try queues our key, and the watch
     * of the key ahead starts from the revision that try read, so no
     * deletion after it can be missed. */
    return dlock__etcd_watch_new(req->name, (dlock__etcd_watch **)watch);
}

static void close_stream(dlock__etcd_watch *w)
{
    dlock__etcd_stream_close(w->stream);
    w->stream = NULL;
}

/* The stream broke or was refused: the next call goes to the next endpoint,
 * and the stream is opened again after a back-off that doubles from 50 ms
 * with each failure in a row, up to 1 s. */
static void stream_failed(dlock__etcd_be *be, dlock__etcd_watch *w)
{
    int64_t pause = 50LL << (w->stream_failures < 5 ? w->stream_failures : 5);

    dlock__etcd_endpoint_failed(be->http, dlock__etcd_stream_endpoint(w->stream));
    close_stream(w);
    w->stream_failures++;
    w->stream_retry_at = dlock__now_ms() + (pause < 1000 ? pause : 1000);
}

/* Sleep ms, or until watch_wake. The eventfd is drained: a watch of the
 * client's gRPC stream writes it too (dlock__etcd_stream_open), and a
 * watch_wake is told by the woken flag, not by the counter. */
static void sleep_ms(dlock__etcd_watch *w, int64_t ms)
{
    struct pollfd pfd = {w->wake_fd, POLLIN, 0};
    uint64_t n;

    if (ms > 0 && poll(&pfd, 1, ms > 1000000 ? 1000000 : (int)ms) > 0 &&
        read(w->wake_fd, &n, sizeof(n)) < 0) {
        /* nothing pending: fine */
    }
}

/*
 * Sleep until the key ahead is deleted (DLOCK_OK), watch_wake (DLOCK_OK) or
 * timeout_ms passes (DLOCK_ETIMEOUT). Meanwhile keep our own lease alive,
 * since our key holds our place; if it cannot be kept, return DLOCK_OK so
 * that the next try finds out (and queues again, or reports the connection
 * error). A broken stream is opened again, on the endpoint now in use, from
 * the same revision.
 */
static int observe_wait(dlock__etcd_be *be, dlock__etcd_watch *w, int64_t end);

/* For a waiter with no key in the queue: the holder's key as the key to
 * wait for, from the revision of the read on. 1 when the lock is free. */
static int watch_holder(dlock__etcd_be *be, dlock__etcd_watch *w)
{
    dlock__etcd_conn *c;
    dlock__etcd_keys k;
    dlock__etcd_kv first = {0};
    json_t *reply = NULL;
    int rc;

    if ((rc = dlock__etcd_keys_make(&k, be, w->name, NULL, 0)) != DLOCK_OK)
        return rc;
    if ((rc = dlock__etcd_conn_get(be->http, &c)) == DLOCK_OK) {
        rc = dlock__etcd_be_call(be, c, "/v3/kv/range", dlock__etcd_range_first(&k), &reply);
        dlock__etcd_conn_put(be->http, c);
    }
    if (rc == DLOCK_OK)
        rc = dlock__etcd_read_kv(be, reply, &first, "range");
    if (rc == 1 && strlen(first.key) == first.key_len) {
        w->ahead = first.key;
        w->ahead_from = dlock__etcd_revision(reply) + 1;
        first.key = NULL;
        rc = 0;
    } else if (rc == 1) {
        rc = -1;
    } else if (rc == 0) {
        rc = 1;
    }
    free(first.key);
    json_decref(reply);
    dlock__etcd_keys_free(&k);
    return rc;
}

static int queue_wait(dlock__etcd_be *be, dlock__etcd_watch *w, int64_t end);

int dlock__etcd_watch_wait(void *arg, void *watch, int64_t timeout_ms)
{
    dlock__etcd_be *be = arg;
    dlock__etcd_watch *w = watch;
    int64_t now = dlock__now_ms();
    int64_t end = timeout_ms >= INT64_MAX - now ? INT64_MAX : now + timeout_ms;
    int rc;

    if (w->observe)
        return observe_wait(be, w, end);
    /* One the try did not use (a multi-lock's takes its own): not kept
     * while asleep, when others may need it. */
    dlock__etcd_conn_put(be->http, w->conn);
    w->conn = NULL;
    rc = queue_wait(be, w, end);
    /* A try follows: its connection now, before the core notes the time
     * of the try (a failure: the try takes one itself). */
    if ((rc == DLOCK_OK || rc == DLOCK_ETIMEOUT) && w->conn == NULL &&
        dlock__etcd_conn_get(be->http, &w->conn) != DLOCK_OK)
        w->conn = NULL;
    return rc;
}

/* The sleep of a waiter with a key in the queue (or watching the holder's). */
static int queue_wait(dlock__etcd_be *be, dlock__etcd_watch *w, int64_t end)
{
    int64_t now;

    for (;;) {
        int64_t until;
        int state;

        if (take_wake(w))
            return DLOCK_OK;
        now = dlock__now_ms();
        if (now >= end)
            return DLOCK_ETIMEOUT;
        if (w->k.key == NULL && w->ahead == NULL) {
            /* No key of ours queued (an atomic multi-lock's waiter): watch
             * the holder's key. */
            int free_now = watch_holder(be, w);
            if (free_now == 1)
                return DLOCK_OK;
            if (free_now < 0) {
                sleep_ms(w, end - now < 1000 ? end - now : 1000);
                return DLOCK_ETIMEOUT;
            }
        }
        if (w->k.key != NULL && !w->granted) {
            sleep_ms(w, end - now < 1000 ? end - now : 1000);
            return DLOCK_ETIMEOUT;
        }
        if (w->k.key == NULL) {
            w->keepalive_at = INT64_MAX; /* no lease of ours to keep alive */
        } else if (now >= w->keepalive_at) {
            dlock__etcd_conn *c;
            int alive = 0, rc;
            if ((rc = dlock__etcd_conn_get(be->http, &c)) != DLOCK_OK)
                return rc;
            rc = dlock__etcd_keepalive(be, c, &w->k.lease, 1, &alive);
            dlock__etcd_conn_put(be->http, c);
            if (rc == DLOCK_OK && !alive) {
                w->granted = 0;
                close_stream(w);
                return DLOCK_OK;
            }
            if (rc == DLOCK_OK) {
                w->lease_ok_ms = now;
                w->keepalive_at = now + w->k.ttl * 1000 / 3;
            } else if (now >= w->lease_ok_ms + w->k.ttl * 1000) {
                close_stream(w);
                return DLOCK_OK;
            } else {
                w->keepalive_at = now + 200;
            }
            /* Calls went elsewhere: the stream's member may be the reason. */
            if (w->stream != NULL &&
                dlock__etcd_stream_endpoint(w->stream) != dlock__etcd_current(be->http))
                close_stream(w);
            continue;
        }
        until = end < w->keepalive_at ? end : w->keepalive_at;
        /* A waiter on the waiting lease keeps none alive (keepalive_at is
         * INT64_MAX) and may wait for ever: a look at least every 1000 s,
         * so that the times below stay far from overflowing. */
        if (until - now > 1000000)
            until = now + 1000000;
        if (w->ahead == NULL) {
            sleep_ms(w, until - now);
            continue;
        }
        if (w->stream == NULL) {
            if (now < w->stream_retry_at) {
                sleep_ms(w, (until < w->stream_retry_at ? until : w->stream_retry_at) - now);
                continue;
            }
            if (dlock__etcd_stream_open(&w->stream, be->http, w->ahead, w->ahead_end,
                                        w->ahead_from, w->wake_fd, NULL, NULL) != DLOCK_OK) {
                w->stream_retry_at = now + 100;
                continue;
            }
        }
        state = dlock__etcd_stream_wait(w->stream, until - now, w->wake_fd);
        if (state == DLOCK__ETCD_STREAM_DELETED || state == DLOCK__ETCD_STREAM_CANCELED) {
            close_stream(w);
            free(w->ahead);
            free(w->ahead_end);
            w->ahead = w->ahead_end = NULL;
            w->stream_failures = 0;
            return DLOCK_OK;
        }
        if (state == DLOCK__ETCD_STREAM_FAILED) {
            stream_failed(be, w);
            /* Watches keep failing (a proxy that cuts streams ...): let the
             * caller look for itself, about once a second, rather than
             * sleep on a watch that may never work. */
            if (w->stream_failures >= 3)
                return DLOCK_OK;
        }
    }
}

/* Leave the queue unless the last try took the lock: revoking the lease
 * deletes our key with it (and the holder's lease, if a promote that failed
 * may have moved the key there; a session lease is not revoked, so the key
 * is deleted by name). */
void dlock__etcd_watch_end(void *arg, void *watch)
{
    dlock__etcd_be *be = arg;
    dlock__etcd_watch *w = watch;
    dlock__etcd_conn *c;

    if (w == NULL)
        return;
    close_stream(w);
    c = w->conn; /* a wait's, for a try that did not come */
    w->conn = NULL;
    if (!w->won && w->k.key != NULL &&
        (c != NULL || dlock__etcd_conn_get(be->http, &c) == DLOCK_OK)) {
        char keep[512];
        snprintf(keep, sizeof(keep), "%s", dlock_error_message());
        if (w->shared_wait) {
            /* The waiting lease backs the other waiters' keys: ours alone
             * goes, by its name (this acquisition's only), wherever a
             * promote in doubt may have moved it. */
            if (w->joined || w->hold.id != 0)
                dlock__etcd_waiting_drop_key(be, c, w->k.key);
        } else {
            dlock__etcd_lease_revoke(be, c, w->k.lease);
            if (w->hold.session && w->hold.id != 0)
                dlock__etcd_session_key_drop(be, c, w->k.key);
        }
        if (w->hold.id != w->k.lease)
            dlock__etcd_lease_give_back(be, c, &w->hold);
        dlock__fail(0, "%s", keep); /* the caller's message is the one to keep */
    } else if (!w->won && w->shared_wait && w->joined) {
        dlock__etcd_waiting_drop_key(be, NULL, w->k.key); /* the thread deletes it */
    }
    /* Off the waiting lease's list before w goes (its loss wakes those on it). */
    dlock__etcd_waiting_leave(be, w);
    dlock__etcd_conn_put(be->http, c);
    /* Left without the lock: the acquisition ends, and its key id with it
     * (a revoke does not say whether the key was still there). */
    if (w->token[0] != '\0' && !w->took)
        dlock__etcd_key_id_drop(be, w->token);
    if (w->wake_fd >= 0)
        close(w->wake_fd);
    dlock__etcd_keys_free(&w->k);
    free(w->ahead);
    free(w->ahead_end);
    free(w->value);
    free(w->name);
    free(w);
}

void dlock__etcd_watch_wake(void *arg, void *watch)
{
    dlock__etcd_watch *w = watch;
    uint64_t one = 1;

    (void)arg;
    atomic_store(&w->woken, 1);
    if (w->wake_fd >= 0 && write(w->wake_fd, &one, sizeof(one)) < 0) {
        /* the counter is full: a wake-up is pending anyway */
    }
    if (w->notify != NULL)
        w->notify(w->notify_arg);
}

/* ---- waiting without a thread (watch_notify) ------------------------------ */

/*
 * With watch_notify (the async engine's waiters) nobody sleeps in
 * watch_wait: the engine keeps the waiter as a record until w->notify is
 * called or the time the busy try's *retry_ms asks for has passed, then
 * takes the wake-up with watch_wait(w, 0) and tries again. So the busy try
 * arms the sleep itself, at its end, on the worker that ran it
 * (dlock__etcd_watch_arm): over gRPC the key ahead is watched on the hub,
 * a create request queued for the hub's thread, which calls w->notify when
 * the key is deleted, the watch canceled or the stream broken. The watch
 * starts at the revision after the try's read, so a deletion between that
 * read and the arming is reported all the same. watch_end closes the
 * stream, and the hub calls nobody for it once that returns.
 *
 * What a sleeping thread did besides is left to the engine's timer, through
 * *retry_ms: the keepalive of a key on a lease of its own (a lock of
 * WAIT_TTL_S or less, etcd_queue.c), which the next try's check makes (the
 * keys on the waiting lease need none: the spare thread keeps it alive for
 * them all); the back-off after a stream that broke; and over the JSON
 * gateway, whose streams only a thread waiting on them drives, a look every
 * NOTIFY_POLL_MS instead of a watch.
 */

/* The JSON gateway's waiter with watch_notify looks this often. */
#define NOTIFY_POLL_MS 1000

void dlock__etcd_watch_notify(void *arg, void *watch, void (*fn)(void *), void *fn_arg)
{
    dlock__etcd_watch *w = watch;

    (void)arg;
    w->notify = fn;
    w->notify_arg = fn_arg;
    /* Nothing will sleep on it: 10,000 waiters need no 10,000 descriptors. */
    if (w->wake_fd >= 0)
        close(w->wake_fd);
    w->wake_fd = -1;
}

void dlock__etcd_watch_settle(dlock__etcd_be *be, dlock__etcd_watch *w)
{
    int state;

    if (w->stream == NULL)
        return;
    /* A notified waiter has not looked at its stream's end yet: a look,
     * without waiting. */
    state = dlock__etcd_stream_wait(w->stream, 0, -1);
    if (state == DLOCK__ETCD_STREAM_FAILED) {
        stream_failed(be, w);
        return;
    }
    if (state != DLOCK__ETCD_STREAM_RUNNING)
        w->stream_failures = 0;
    close_stream(w);
}

void dlock__etcd_watch_arm(dlock__etcd_be *be, dlock__etcd_watch *w, int64_t *retry_ms)
{
    int64_t now = dlock__now_ms(), at = INT64_MAX;

    if (w->k.key != NULL && !w->shared_wait)
        at = w->keepalive_at;
    if (w->ahead != NULL && *retry_ms != 0) {
        int64_t look = INT64_MAX;
        if (!dlock__etcd_is_grpc(be->http))
            look = now + NOTIFY_POLL_MS;
        else if (now < w->stream_retry_at)
            look = w->stream_retry_at;
        else if (dlock__etcd_stream_open(&w->stream, be->http, w->ahead, w->ahead_end,
                                         w->ahead_from, -1, w->notify,
                                         w->notify_arg) != DLOCK_OK)
            look = w->stream_retry_at = now + 100;
        at = look < at ? look : at;
    }
    if (at < INT64_MAX) {
        int64_t left = at > now ? at - now : 0;
        if (*retry_ms < 0 || left < *retry_ms)
            *retry_ms = left;
    }
}

/*
 * An observer's sleep: until something in the directory changes (DLOCK_OK),
 * watch_wake, or end (DLOCK_ETIMEOUT). The stream stays open between sleeps;
 * a broken one is opened again, on the endpoint in use, from the revision
 * after the last change it reported.
 */
static int observe_wait(dlock__etcd_be *be, dlock__etcd_watch *w, int64_t end)
{
    for (;;) {
        int64_t now = dlock__now_ms();
        int state;

        if (take_wake(w))
            return DLOCK_OK;
        if (now >= end)
            return DLOCK_ETIMEOUT;
        if (w->stream == NULL) {
            if (now < w->stream_retry_at) {
                int64_t until = end < w->stream_retry_at ? end : w->stream_retry_at;
                sleep_ms(w, until - now);
                continue;
            }
            if (dlock__etcd_stream_open(&w->stream, be->http, w->k.dir, w->k.dir_end,
                                        w->ahead_from, w->wake_fd, NULL, NULL) != DLOCK_OK) {
                w->stream_retry_at = now + 100;
                continue;
            }
        }
        state = dlock__etcd_stream_wait(w->stream, end - now > 1000000 ? 1000000 : end - now,
                                        w->wake_fd);
        w->ahead_from = dlock__etcd_stream_next_rev(w->stream);
        if (state == DLOCK__ETCD_STREAM_DELETED) {
            dlock__etcd_stream_rearm(w->stream);
            w->stream_failures = 0;
            return DLOCK_OK;
        }
        if (state == DLOCK__ETCD_STREAM_CANCELED) {
            /* Compacted past our revision: the next read is the news. */
            close_stream(w);
            return DLOCK_OK;
        }
        if (state == DLOCK__ETCD_STREAM_FAILED)
            stream_failed(be, w);
    }
}

