/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The hand-off without a confirming try: a waiter whose entry is in the
 * plain mutex's hand-off slot, or whose grant entry a lock of the family
 * keeps (redis_family.c, lib/family.lua), keeps a BLPOP of a list of its
 * own outstanding, PREFIX{NAME}:grant:WAITER-ID, and release.lua (the
 * family's release scripts) pushes the fence there as it hands the lock
 * over. The grant then reaches the waiter's own thread in one trip from
 * the server, with no subscriber thread to wake it and no try
 * to confirm it.
 *
 * The lease. An element can be in the list only after the try that wrote
 * the waiter's entry ran, and a BLPOP answered empty ran before any element
 * it would have taken; Redis answers a BLPOP at once while its list holds an
 * element. So the grant was pushed after the send of the last BLPOP answered
 * empty, or of the wait's first try when none was (w->bound_ms), and the key
 * lives from the push for the confirm window, or the lease when shorter:
 * the lock counts from the bound for that long, no more. The watchdog
 * extends it at once to the full lease (a lock handed with less than a
 * third of its lease left is due for renewal). Not the send of the BLPOP
 * that returned the grant: the element may have waited in the list before
 * it was sent (models/redis_mutex.pml -DLIST_GRANT; the mutant
 * -DLIST_FROM_POP breaks it). A BLPOP lasts a quarter of the window at most,
 * so the bound is never older than half of it when a grant comes. A grant
 * whose bound leaves too little, or a lock without auto_renew whose lease
 * is longer than the window, is confirmed by a try instead (acquire.lua
 * finds the waiter's token in the key and sets its whole lease).
 *
 * A BLPOP whose reply does not come back in time is not one answered empty:
 * its connection is closed and the bound stays. Every failure (the
 * connection, a refusal, a reply the protocol does not allow) ends the
 * listening for the rest of the wait: the waiter tries at once, which
 * finds a lock handed over to it meanwhile (a pushed grant is announced to
 * nobody), and its entry says from then on that it does not listen, so
 * that releases announce their grants to it again. A refused BLPOP (an ACL
 * without it) ends the listening for the client.
 *
 * The waiter's other wake-ups (an interrupt, a plain release, the
 * subscriber's connection lost) still come through the subscriber
 * (redis_watch.c), which writes a byte to a pipe the waiter polls beside
 * its socket.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/redis/redis_int.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/thread.h"
#include "core/token.h"

/* How long one BLPOP waits on the server at most. */
static int64_t listen_ms(int64_t lease_ms)
{
    int64_t t = dlock__redis_handoff_refresh_ms(lease_ms);

    return t < DLOCK__REDIS_HANDOFF_CONFIRM_MS / 4 ? t : DLOCK__REDIS_HANDOFF_CONFIRM_MS / 4;
}

int dlock__redis_listen_on(dlock__redis_be *be)
{
    return !be->no_threads && be->cmd[0].min_replicas == 0 && !atomic_load(&be->listen_off);
}

/* The waiter's other wake-ups, as a byte in its pipe (nonblocking). */
static void ring_pipe(void *arg)
{
    if (write((int)(intptr_t)arg, "", 1) < 0) {
        /* Full: a byte is there already, which is all the listener needs. */
    }
}

/*
 * On a cluster the listener's connection goes to the master of the lock's
 * slot, where its grant list is (it shares the lock's hash tag), as the
 * scripts' slot map knows it now; a connection to another node is closed
 * first. 0 when no master is known. A slot that moves later answers the
 * BLPOP with MOVED (or closes it), which ends the listening for the wait.
 */
static int listen_target(dlock__redis_be *be, dlock__redis_conn *conn, const char *name)
{
    dlock__redis_key_buf key;
    char host[sizeof(conn->master_host)];
    int port;

    if (!be->cmd[0].is_cluster)
        return 1;
    dlock__redis_key(&key, be, name, "");
    if (!dlock__redis_cluster_master_copy(&be->mux.conn, dlock__redis_key_slot(key.buf, key.len),
                                          host, sizeof(host), &port))
        return 0;
    if (conn->ep.host != conn->master_host || conn->ep.port != port ||
        strcmp(conn->master_host, host) != 0) {
        dlock__redis_conn_close(conn);
        memcpy(conn->master_host, host, strlen(host) + 1);
        conn->ep.host = conn->master_host;
        conn->ep.port = port;
    }
    return 1;
}

/* Take a listener's connection and its wake-up pipe (made on first use);
 * 0 when none is free (the waiter then waits as before). */
int dlock__redis_listen_take(dlock__redis_be *be, dlock__redis_watch *w)
{
    int slot = -1, *fds;
    char buf[64];

    pthread_mutex_lock(&be->cmd_mu);
    for (int i = 0; i < DLOCK__REDIS_LISTEN_MAX; i++) {
        if (be->listen_busy[i])
            continue;
        if (slot < 0 || dlock__redis_conn_is_open(&be->listen[i]))
            slot = i;
    }
    if (slot >= 0)
        be->listen_busy[slot] = 1;
    pthread_mutex_unlock(&be->cmd_mu);
    if (slot < 0)
        return 0;
    fds = be->listen_pipe[slot];
    if (!listen_target(be, &be->listen[slot], w->name) ||
        (fds[0] < 0 && pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0)) {
        pthread_mutex_lock(&be->cmd_mu);
        be->listen_busy[slot] = 0;
        pthread_mutex_unlock(&be->cmd_mu);
        return 0;
    }
    /* What the last waiter of this slot left unread is not ours. */
    while (read(fds[0], buf, sizeof(buf)) > 0) {
    }
    w->ln = &be->listen[slot];
    w->ln_slot = slot;
    dlock__redis_watch_notify(be->watcher, w->waiter, ring_pipe, (void *)(intptr_t)fds[1]);
    return 1;
}

void dlock__redis_listen_end(dlock__redis_be *be, dlock__redis_watch *w)
{
    if (w->ln == NULL)
        return;
    dlock__redis_watch_notify(be->watcher, w->waiter, NULL, NULL);
    /* A BLPOP still outstanding may yet pop a grant: nobody reads it, and
     * the next user of the connection must not, so it goes. */
    if (w->ln_out)
        dlock__redis_conn_close(w->ln);
    pthread_mutex_lock(&be->cmd_mu);
    be->listen_busy[w->ln_slot] = 0;
    pthread_mutex_unlock(&be->cmd_mu);
    w->ln = NULL;
    w->ln_out = 0;
}

void dlock__redis_listen_close(dlock__redis_be *be)
{
    for (int i = 0; i < DLOCK__REDIS_LISTEN_MAX; i++) {
        dlock__redis_conn_close(&be->listen[i]);
        for (int k = 0; k < 2; k++)
            if (be->listen_pipe[i][k] >= 0)
                close(be->listen_pipe[i][k]);
    }
}

/* Stop listening for the rest of this wait. Returns DLOCK_OK: the caller
 * tries at once, which finds a lock handed over to it meanwhile (a pushed
 * grant is not announced) and puts its entry in the slot without " L", so
 * that releases announce their grants from then on (acquire.lua). */
static int listen_stop(dlock__redis_be *be, dlock__redis_watch *w)
{
    char *mark = w->entry != NULL ? strstr(w->entry, " L") : NULL;

    /* Closed whatever it was doing: broken, refused or late. */
    dlock__redis_conn_close(w->ln);
    w->ln_out = 0;
    dlock__redis_listen_end(be, w);
    w->listens = 0;
    if (mark != NULL)
        *mark = '\0'; /* "WAITER-ID TOKEN LEASE": hex, hex, digits */
    /* (A waiter of the family's next try drops its grant entry.) */
    return DLOCK_OK;
}

static int send_blpop(dlock__redis_be *be, dlock__redis_watch *w, int64_t now, int64_t ms)
{
    dlock__redis_conn *conn = w->ln;
    dlock__redis_key_buf list;
    const char *argv[3];
    size_t lens[3];
    char secs[32], suffix[8 + DLOCK__TOKEN_LEN + 1];
    dlock__sigpipe_guard guard;
    int ok;

    if (dlock__redis_conn_connect(conn) != DLOCK_OK)
        return -1;
    snprintf(suffix, sizeof(suffix), ":grant:%s", dlock__redis_watch_id(w->waiter));
    dlock__redis_key(&list, be, w->name, suffix);
    /* Seconds with three decimals: 0 would block forever. */
    snprintf(secs, sizeof(secs), "%" PRId64 ".%03" PRId64, ms / 1000, ms % 1000);
    argv[0] = "BLPOP";
    argv[1] = list.buf;
    argv[2] = secs;
    lens[0] = 5;
    lens[1] = list.len;
    lens[2] = strlen(secs);
    w->ln_sent_ms = now;
    dlock__sigpipe_block(&guard);
    ok = dlock__redis_tp_append_argv(&conn->tp, 3, argv, lens) == REDIS_OK &&
         dlock__redis_tp_flush(&conn->tp, now + conn->command_ms) == REDIS_OK;
    dlock__sigpipe_restore(&guard);
    if (!ok)
        return -1;
    w->ln_out = 1;
    w->ln_due_ms = now + ms + conn->command_ms;
    return 0;
}

/* A fence as release.lua pushes it: decimal digits, above 0. */
static uint64_t parse_fence(const redisReply *r)
{
    uint64_t v = 0;

    if (r->type != REDIS_REPLY_STRING || r->len == 0 || r->len > 19)
        return 0;
    for (size_t i = 0; i < r->len; i++) {
        if (r->str[i] < '0' || r->str[i] > '9')
            return 0;
        v = v * 10 + (uint64_t)(r->str[i] - '0');
    }
    return v;
}

/* The BLPOP's reply r (freed): 1 a grant (w->granted), 0 answered empty,
 * -1 a refusal or a reply BLPOP cannot give. */
static int take_reply(dlock__redis_be *be, dlock__redis_watch *w, redisReply *r)
{
    int got = -1;

    w->ln_out = 0;
    if (r->type == REDIS_REPLY_NIL) {
        if (w->ln_sent_ms > w->bound_ms)
            w->bound_ms = w->ln_sent_ms;
        got = 0;
    } else if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
               (w->granted = parse_fence(r->element[1])) != 0) {
        got = 1;
    } else if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOPERM", 6) == 0) {
        /* An ACL without BLPOP: this client's waiters stop asking. (Any
         * other error, a demoted master's READONLY, ends this wait's.) */
        atomic_store(&be->listen_off, 1);
    }
    freeReplyObject(r);
    return got;
}

int dlock__redis_listen_wait(dlock__redis_be *be, dlock__redis_watch *w, int64_t timeout_ms)
{
    int64_t now = dlock__now_ms();
    int64_t until = timeout_ms > INT64_MAX - now ? INT64_MAX : now + timeout_ms;

    if (w->ln == NULL && !dlock__redis_listen_take(be, w)) {
        w->listens = 0;
        return dlock__redis_watch_wait(be->watcher, w->waiter, timeout_ms);
    }
    for (;;) {
        struct pollfd fds[2];
        int64_t end;
        redisReply *r = NULL;

        if (!w->ln_out) {
            int64_t ms = until - now < listen_ms(w->lease_ms) ? until - now
                                                               : listen_ms(w->lease_ms);
            if (ms <= 0)
                return DLOCK_ETIMEOUT;
            if (send_blpop(be, w, now, ms) != 0)
                return listen_stop(be, w);
        }
        end = until < w->ln_due_ms ? until : w->ln_due_ms;
        fds[0].fd = w->ln->tp.fd;
        fds[0].events = POLLIN;
        fds[1].fd = be->listen_pipe[w->ln_slot][0];
        fds[1].events = POLLIN;
        fds[0].revents = fds[1].revents = 0;
        end = end < now ? 0 : end - now;
        if (poll(fds, 2, end > INT32_MAX ? INT32_MAX : (int)end) < 0 && errno != EINTR)
            return listen_stop(be, w);
        now = dlock__now_ms();
        if (fds[0].revents != 0) {
            dlock__sigpipe_guard guard;
            int ok;

            dlock__sigpipe_block(&guard);
            ok = dlock__redis_tp_read(&w->ln->tp, -1) == REDIS_OK &&
                 dlock__redis_tp_get_reply(&w->ln->tp, (void **)&r) == REDIS_OK;
            dlock__sigpipe_restore(&guard);
            if (!ok)
                return listen_stop(be, w);
            if (r == NULL) {
                if (dlock__redis_conn_over_cap(w->ln))
                    return listen_stop(be, w);
            } else {
                int got = take_reply(be, w, r);
                if (got < 0)
                    return listen_stop(be, w);
                if (got > 0)
                    return DLOCK_OK;
            }
        }
        if (fds[1].revents != 0) {
            char buf[64];
            while (read(fds[1].fd, buf, sizeof(buf)) > 0) {
            }
            dlock__redis_watch_consume(be->watcher, w->waiter);
            return DLOCK_OK;
        }
        if (w->ln_out && now >= w->ln_due_ms)
            return listen_stop(be, w); /* overdue: not an empty answer */
        if (now >= until)
            return DLOCK_ETIMEOUT;
    }
}

int dlock__redis_listen_granted(dlock__redis_watch *w, const dlock_request *req,
                                dlock_acquire_result *out)
{
    int64_t cap = req->lease_ms < DLOCK__REDIS_HANDOFF_CONFIRM_MS
                      ? req->lease_ms
                      : DLOCK__REDIS_HANDOFF_CONFIRM_MS;
    int64_t left = w->bound_ms + cap - dlock__now_ms();
    uint64_t fence = w->granted;

    w->granted = 0;
    if (left < cap / 4 || (!req->auto_renew && req->lease_ms > cap))
        return 0;
    out->fence = fence;
    out->handed = 1;
    out->lease_from_ms = w->bound_ms + cap - req->lease_ms;
    w->leave = 0;
    return 1;
}
