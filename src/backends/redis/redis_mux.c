/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The shared, pipelined command connection (redis_mux.h).
 *
 * Locking: mu guards the connection's state (its transport, the queue of
 * requests, who reads) and every use of the transport but one: the reader
 * polls the socket without mu, so that others may append and write their
 * commands meanwhile. While a reader polls, nobody closes or re-opens the
 * transport (its descriptor could be reused under the poll): a caller that
 * finds it failed waits on idle until the reader has let go of it; a
 * writer whose write failed shuts the socket down, which ends the poll.
 * Callers waiting for their replies are woken after mu is let go (tell,
 * unlock).
 */
#include <errno.h>
#include <poll.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "backends/redis/redis_mux.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/thread.h"

struct dlock__redis_mux_req {
    dlock__redis_mux_req *next;
    sem_t done_sem; /* posted (tell) when its reply is in, it failed, or it reads now */
    int posted;     /* 1: a post is owed to its caller, not taken yet */
    dlock__redis_mux_req *told_next; /* in mux->told: to post when mu is let go */
    int64_t deadline_ms;    /* its reply is due by then (the command timeout) */
    redisReply *reply;
    redisReply *wait_reply; /* WAIT min_replicas's, when wait */
    int wait;               /* a WAIT follows the command */
    int asking;             /* an ASKING goes before it: its reply comes first, */
    redisReply *asking_reply; /* here */
    unsigned gen;           /* the connection it went out on (mux->gen) */
    atomic_int done; /* 1: reply, or failed with rc (all set before it) */
    int rc;        /* DLOCK_OK or the failure's code */
    int timed_out; /* it failed by a timeout, not a dead connection */
    char msg[320]; /* the failure's message, for the caller's thread */
    /* Asynchronous (dlock__redis_mux_send_async): nobody waits on done_sem;
     * cb is told instead, and the request freed. */
    dlock__redis_mux_cb cb;
    void *cb_arg;
};

static void unlock(dlock__redis_mux *mux);

int dlock__redis_mux_init(dlock__redis_mux *mux, const dlock__redis_conn *conn)
{
    int rc;

    memset(mux, 0, sizeof(*mux));
    if (pthread_mutex_init(&mux->mu, NULL) != 0)
        return dlock__fail(DLOCK_ENOMEM, "cannot create a mutex");
    if (dlock__cond_init(&mux->idle) != 0) {
        pthread_mutex_destroy(&mux->mu);
        return dlock__fail(DLOCK_ENOMEM, "cannot create a condition variable");
    }
    if ((mux->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
        pthread_cond_destroy(&mux->idle);
        pthread_mutex_destroy(&mux->mu);
        return dlock__fail(DLOCK_ENOMEM, "cannot create an eventfd");
    }
    /* Not open yet: the copy shares only the URL's strings. */
    mux->conn = *conn;
    memset(&mux->conn.tp, 0, sizeof(mux->conn.tp));
    mux->conn.tp.fd = -1;
    /* A cluster's: one routing state for every caller, each master's
     * commands on a mux of its own (redis_cluster.c). */
    mux->conn.cluster = NULL;
    if (conn->is_cluster && (rc = dlock__redis_cluster_share(&mux->conn)) != DLOCK_OK) {
        close(mux->wake_fd);
        pthread_cond_destroy(&mux->idle);
        pthread_mutex_destroy(&mux->mu);
        return rc;
    }
    mux->on = 1;
    return DLOCK_OK;
}

void dlock__redis_mux_destroy(dlock__redis_mux *mux)
{
    if (!mux->on)
        return;
    dlock__redis_conn_close(&mux->conn);
    close(mux->wake_fd);
    pthread_cond_destroy(&mux->idle);
    pthread_mutex_destroy(&mux->mu);
    mux->on = 0;
}

int dlock__redis_mux_connect(dlock__redis_mux *mux)
{
    int rc;

    pthread_mutex_lock(&mux->mu);
    while (mux->reading && !dlock__redis_conn_is_open(&mux->conn))
        pthread_cond_wait(&mux->idle, &mux->mu);
    rc = dlock__redis_conn_connect(&mux->conn);
    unlock(mux);
    return rc;
}

/* ---- under mu ---------------------------------------------------------------- */

/* Wakes q's caller, which waits in send_once, once mu is let go (unlock):
 * its reply is in, or it failed, or it is to read. Woken while the reader
 * still held mu, the caller would preempt the reader only to wait for mu
 * (three context switches where one will do: docs/bench.md). And a
 * semaphore, not a condition variable: the caller finds done set without
 * taking mu again. One post owed at a time (posted, 1 until the caller
 * has taken it), so that a caller that took one and finds done set knows
 * none is still to come, and may let go of the request; sem_post touches
 * the semaphore only through the futex once the caller may go. */
static void tell(dlock__redis_mux *mux, dlock__redis_mux_req *q)
{
    if (!q->posted) {
        q->posted = 1;
        q->told_next = mux->told;
        mux->told = q;
    }
}

/* Lets go of mu, then wakes the callers told meanwhile. */
static void unlock(dlock__redis_mux *mux)
{
    dlock__redis_mux_req *q = mux->told;

    mux->told = NULL;
    pthread_mutex_unlock(&mux->mu);
    while (q != NULL) {
        dlock__redis_mux_req *next = q->told_next; /* q may be gone after its post */
        sem_post(&q->done_sem);
        q = next;
    }
}

/* Ends every request in flight with the connection's failure (its code and
 * message, made on this thread), and closes it. Only by whoever may close
 * it: the reader, or a writer when nobody reads. */
static void fail_all(dlock__redis_mux *mux)
{
    int code = dlock__redis_conn_io_error(&mux->conn); /* closes it */
    const char *msg = dlock_error_message();
    int timed_out = mux->conn.timed_out;

    mux->gen++;
    for (dlock__redis_mux_req *q = mux->head, *next; q != NULL; q = next) {
        next = q->next;
        if (q->cb != NULL) {
            q->cb(q->cb_arg, code, NULL); /* this thread's message is the failure's */
            free(q);
            continue;
        }
        if (q->asking_reply != NULL) { /* the command's own reply never came */
            freeReplyObject(q->asking_reply);
            q->asking_reply = NULL;
        }
        if (q->reply != NULL) { /* its WAIT's reply never came */
            freeReplyObject(q->reply);
            q->reply = NULL;
        }
        q->rc = code;
        q->timed_out = timed_out;
        snprintf(q->msg, sizeof(q->msg), "%s", msg);
        atomic_store(&q->done, 1);
        tell(mux, q);
    }
    mux->head = mux->tail = NULL;
}

/* Hands each complete reply read so far to its request, in order. REDIS_ERR
 * when the transport failed (a reply refused, or one that came with
 * nobody waiting for it). */
static int dispatch(dlock__redis_mux *mux)
{
    for (;;) {
        void *r = NULL;
        dlock__redis_mux_req *q;

        if (dlock__redis_tp_get_reply(&mux->conn.tp, &r) != REDIS_OK)
            return REDIS_ERR;
        if (r == NULL)
            return dlock__redis_conn_over_cap(&mux->conn) ? REDIS_ERR : REDIS_OK;
        if ((q = mux->head) == NULL) {
            freeReplyObject(r);
            dlock__redis_tp_fail(&mux->conn.tp, REDIS_ERR_PROTOCOL, "a reply nobody asked for");
            return REDIS_ERR;
        }
        if (q->asking && q->asking_reply == NULL) {
            q->asking_reply = r; /* the command's own reply is next */
            continue;
        }
        if (q->reply == NULL) {
            q->reply = r;
            if (q->wait)
                continue; /* WAIT's reply comes next */
        } else {
            q->wait_reply = r;
        }
        mux->head = q->next;
        if (mux->head == NULL)
            mux->tail = NULL;
        mux->answered++;
        if (q->cb != NULL) {
            q->cb(q->cb_arg, DLOCK_OK, q->reply);
            free(q);
            continue;
        }
        atomic_store(&q->done, 1);
        tell(mux, q);
    }
}

/* The first caller that waits for its reply, woken to read for itself and
 * those behind it (asynchronous requests have none: the loop reads for
 * them, dlock__redis_mux_pump). */
static void wake_next_reader(dlock__redis_mux *mux)
{
    for (dlock__redis_mux_req *q = mux->head; q != NULL; q = q->next) {
        if (q->cb == NULL) {
            tell(mux, q);
            return;
        }
    }
}

/* What the socket has, into the reader. OpenSSL reads and writes with
 * read(2) and write(2): a server gone away must not raise SIGPIPE. */
static int read_some(dlock__redis_tp *tp)
{
    dlock__sigpipe_guard guard;
    int rc;

    if (tp->ssl == NULL)
        return dlock__redis_tp_read(tp, -1);
    dlock__sigpipe_block(&guard);
    rc = dlock__redis_tp_read(tp, -1);
    dlock__sigpipe_restore(&guard);
    return rc;
}

static int flush(dlock__redis_tp *tp, int64_t deadline_ms)
{
    dlock__sigpipe_guard guard;
    int rc;

    if (tp->ssl == NULL) /* send(2) with MSG_NOSIGNAL */
        return dlock__redis_tp_flush(tp, deadline_ms);
    dlock__sigpipe_block(&guard);
    rc = dlock__redis_tp_flush(tp, deadline_ms);
    dlock__sigpipe_restore(&guard);
    return rc;
}

/* Reads replies until me's is in (or the connection failed), polling
 * without mu. */
static void read_replies(dlock__redis_mux *mux, dlock__redis_mux_req *me)
{
    dlock__redis_tp *tp = &mux->conn.tp;

    mux->reading = 1;
    while (!me->done) {
        struct pollfd p[2] = {{.fd = tp->fd, .events = POLLIN, .revents = 0},
                              {.fd = mux->wake_fd, .events = POLLIN, .revents = 0}};
        int64_t left = mux->head->deadline_ms - dlock__now_ms();
        uint64_t count;
        int n;

        unlock(mux);
        n = left > 0 ? poll(p, 2, left > 60000 ? 60000 : (int)left) : 0;
        pthread_mutex_lock(&mux->mu);
        if (p[1].revents != 0 && read(mux->wake_fd, &count, sizeof(count)) < 0) {
            /* drained by another reader before: fine */
        }
        if (me->done)
            break; /* the loop read it meanwhile (dlock__redis_mux_pump) */
        if (n < 0 && errno == EINTR)
            continue;
        if (!dlock__redis_tp_ok(tp)) {
            /* A writer's write failed (and shut the socket down). */
        } else if (n < 0) {
            dlock__redis_tp_fail(tp, REDIS_ERR_IO, "poll failed");
        } else if (n == 0) {
            if (mux->head->deadline_ms > dlock__now_ms())
                continue; /* the 60 s slice of a longer timeout */
            dlock__redis_tp_fail(tp, REDIS_ERR_IO, "timed out (read)");
            tp->timed_out = 1;
        } else if (read_some(tp) == REDIS_OK && dispatch(mux) == REDIS_OK) {
            continue;
        }
        fail_all(mux);
        pthread_cond_broadcast(&mux->idle);
    }
    mux->reading = 0;
    /* The next in line reads for itself and those behind it. */
    wake_next_reader(mux);
}

/* Takes the post owed to me (tell). */
static void sem_take(dlock__redis_mux_req *me)
{
    while (sem_wait(&me->done_sem) != 0 && errno == EINTR)
        ;
}

/* Sends one command and waits for its reply, on the connection as it is
 * now (made if need be). *fresh: this call opened the connection. */
static int send_once(dlock__redis_mux *mux, int argc, const char **argv, const size_t *lens,
                     int wait, int asking, dlock__redis_mux_req *me, int *fresh)
{
    dlock__redis_tp *tp = &mux->conn.tp;
    int rc, owed;

    memset(me, 0, sizeof(*me));
    /* Waited on without a timeout: the reader's poll has the deadline. */
    if (sem_init(&me->done_sem, 0, 0) != 0)
        return dlock__fail(DLOCK_ENOMEM, "cannot create a semaphore");
    pthread_mutex_lock(&mux->mu);
    while (mux->reading && !dlock__redis_tp_ok(tp))
        pthread_cond_wait(&mux->idle, &mux->mu);
    *fresh = !dlock__redis_tp_ok(tp);
    if (*fresh && (rc = dlock__redis_conn_connect(&mux->conn)) != DLOCK_OK) {
        unlock(mux);
        sem_destroy(&me->done_sem);
        return rc;
    }
    /* ASKING applies to the next command on the connection: the two go
     * out together, nothing between them. */
    if ((asking && dlock__redis_tp_append(tp, "ASKING") != REDIS_OK) ||
        dlock__redis_tp_append_argv(tp, argc, argv, lens) != REDIS_OK ||
        (wait && dlock__redis_tp_append(tp, "WAIT %d %lld", mux->conn.min_replicas,
                                        (long long)mux->conn.wait_ms) != REDIS_OK)) {
        unlock(mux);
        sem_destroy(&me->done_sem);
        return dlock__fail(DLOCK_ENOMEM, "%s: out of memory", mux->conn.where);
    }
    me->deadline_ms = dlock__now_ms() + mux->conn.command_ms;
    me->wait = wait;
    me->asking = asking;
    me->gen = mux->gen;
    if (mux->tail != NULL)
        mux->tail->next = me;
    else
        mux->head = me;
    mux->tail = me;
    if (flush(tp, me->deadline_ms) != REDIS_OK) {
        if (mux->reading)
            shutdown(tp->fd, SHUT_RDWR); /* the reader's poll ends, and it fails us all */
        else
            fail_all(mux);
    }
    /* Wait for the reply, reading when nobody else does. posted is 1 while
     * a post is owed to us (tell): one at a time, and every one is taken
     * before the semaphore goes, or a late post would land on a request
     * no longer there. */
    while (!me->done) {
        if (!mux->reading) {
            read_replies(mux, me);
            continue;
        }
        unlock(mux);
        sem_take(me);
        /* The one post owed: done set (nothing more can be owed, as
         * posted stays 1), or told to read (wake_next_reader). */
        if (atomic_load(&me->done))
            goto got;
        pthread_mutex_lock(&mux->mu);
        me->posted = 0;
    }
    owed = me->posted; /* a tell while we read, or after we were told to read */
    unlock(mux);
    if (owed)
        sem_take(me);
got:
    sem_destroy(&me->done_sem);
    if (me->rc != DLOCK_OK)
        return dlock__fail(me->rc, "%s", me->msg);
    return DLOCK_OK;
}

/* Closes the connection gen, which answered READONLY: its server is a
 * master demoted by a failover, and the next connect asks the sentinels.
 * What else is in flight on it fails, and is sent again. */
static void drop(dlock__redis_mux *mux, unsigned gen)
{
    dlock__redis_tp *tp = &mux->conn.tp;

    pthread_mutex_lock(&mux->mu);
    if (mux->gen == gen && dlock__redis_tp_ok(tp)) {
        dlock__redis_tp_fail(tp, REDIS_ERR_EOF, "the master was demoted (READONLY)");
        if (mux->reading)
            shutdown(tp->fd, SHUT_RDWR); /* the reader fails those in flight */
        else
            fail_all(mux);
    }
    unlock(mux);
}

int dlock__redis_mux_call(dlock__redis_mux *mux, redisReply **out, redisReply **wait_out,
                          int argc, const char **argv, const size_t *lens, int wait, int asking,
                          int *timed_out)
{
    dlock__redis_mux_req me;
    int fresh = 0;
    int rc = send_once(mux, argc, argv, lens, wait, asking, &me, &fresh);

    *timed_out = rc != DLOCK_OK && me.timed_out;
    *out = *wait_out = NULL;
    if (rc != DLOCK_OK)
        return rc;
    if (me.asking_reply != NULL && me.asking_reply->type == REDIS_REPLY_ERROR) {
        /* ASKING refused (an ACL user without it): its error is the
         * answer; the command, run without it, was redirected back. */
        freeReplyObject(me.reply);
        if (me.wait_reply != NULL)
            freeReplyObject(me.wait_reply);
        *out = me.asking_reply;
        return DLOCK_OK;
    }
    if (me.asking_reply != NULL)
        freeReplyObject(me.asking_reply);
    *out = me.reply;
    *wait_out = me.wait_reply;
    return DLOCK_OK;
}

/* The replies of one command (r) and its WAIT (w, NULL without one), made
 * the command's result: an error reply a code and message (DLOCK_ENOTSUP
 * for NOSCRIPT, for the caller to send EVAL), WAIT's for
 * dlock__redis_wait_short. where: the connection that answered. */
static int result(const dlock__redis_conn *where, redisReply *r, redisReply *w, redisReply **out)
{
    int rc = DLOCK_OK;

    if (r->type == REDIS_REPLY_ERROR)
        rc = r->len >= 8 && strncmp(r->str, "NOSCRIPT", 8) == 0
                 ? dlock__fail(DLOCK_ENOTSUP, "%s: NOSCRIPT", where->where)
                 : dlock__redis_conn_reply_error(where, r);
    else if (w != NULL)
        rc = dlock__redis_wait_reply(where, w);
    return dlock__redis_reply_keep(rc, r, w, out);
}

/* One command, and its WAIT when wait (see result). Sent once more on a new
 * connection (see redis_mux.h) when the one it went out on was found dead,
 * or, on a Sentinel URL, when its master was demoted or went away (the new
 * connection asks the sentinels). On a cluster, routed to the master of
 * slot (redis_cluster.c). */
static int command(dlock__redis_mux *mux, redisReply **out, int argc, const char **argv,
                   const size_t *lens, int wait, int slot)
{
    int sentinel = mux->conn.master_name != NULL;
    int fresh = 0, rc;

    *out = NULL;
    if (mux->conn.is_cluster) {
        const dlock__redis_conn *where = &mux->conn;
        redisReply *r = NULL, *w = NULL;

        if ((rc = dlock__redis_cluster_mux_command(&mux->conn, &r, &w, argc, argv, lens, slot,
                                                   wait, &where)) != DLOCK_OK)
            return rc;
        return result(where, r, w, out);
    }
    for (int attempt = 0;; attempt++) {
        dlock__redis_mux_req me;
        int readonly;

        rc = send_once(mux, argc, argv, lens, wait, 0, &me, &fresh);
        if (rc == DLOCK_ECONN && (sentinel || !fresh) && !me.timed_out && me.done &&
            attempt == 0)
            continue;
        if (rc != DLOCK_OK)
            return rc;
        readonly = me.reply->type == REDIS_REPLY_ERROR && strstr(me.reply->str, "READONLY");
        if (readonly && sentinel && attempt == 0) {
            freeReplyObject(me.reply);
            if (me.wait_reply != NULL)
                freeReplyObject(me.wait_reply);
            drop(mux, me.gen);
            continue;
        }
        return result(&mux->conn, me.reply, me.wait_reply, out);
    }
}

/* dlock__redis_mux_script's way to send: command() with its WAIT and slot. */
typedef struct {
    dlock__redis_mux *mux;
    int wait, slot;
} mux_send;

static int send_on_mux(void *ctx, redisReply **out, int argc, const char **argv,
                       const size_t *lens)
{
    mux_send *ms = ctx;

    return command(ms->mux, out, argc, argv, lens, ms->wait, ms->slot);
}

int dlock__redis_mux_script(dlock__redis_mux *mux, const dlock__redis_script *script,
                            redisReply **out, int nkeys, int argc, const char **argv,
                            const size_t *lens)
{
    /* A script's keys all share one slot (redis_family.c, redis.c): the
     * first one routes it on a cluster. */
    mux_send ms = {mux, dlock__redis_script_waits(&mux->conn, script),
                   nkeys > 0 ? (int)dlock__redis_key_slot(argv[0], lens[0]) : -1};

    dlock__redis_wait_clear();
    return dlock__redis_script_send(script, out, nkeys, argc, argv, lens, send_on_mux, &ms);
}

/* ---- asynchronous requests ------------------------------------------------ */

/* dlock__redis_mux_send_async with mu held. failed: what a write that
 * failed does (fail_all, or have the reader do it); from inside a cb, the
 * reader that called it fails us all when it reads next. */
static int send_async(dlock__redis_mux *mux, int argc, const char **argv, const size_t *lens,
                      dlock__redis_mux_cb cb, void *arg, int in_cb)
{
    dlock__redis_tp *tp = &mux->conn.tp;
    dlock__redis_mux_req *q;

    if (!dlock__redis_tp_ok(tp) || mux->conn.is_cluster)
        return DLOCK_ENOTSUP; /* connecting blocks: the caller's blocking way does it */
    if ((q = calloc(1, sizeof(*q))) == NULL ||
        dlock__redis_tp_append_argv(tp, argc, argv, lens) != REDIS_OK) {
        free(q);
        return dlock__fail(DLOCK_ENOMEM, "%s: out of memory", mux->conn.where);
    }
    q->cb = cb;
    q->cb_arg = arg;
    q->deadline_ms = dlock__now_ms() + mux->conn.command_ms;
    q->gen = mux->gen;
    if (mux->tail != NULL)
        mux->tail->next = q;
    else
        mux->head = q;
    mux->tail = q;
    if (flush(tp, q->deadline_ms) != REDIS_OK) {
        if (mux->reading)
            shutdown(tp->fd, SHUT_RDWR); /* the reader fails us all, cb included */
        else if (!in_cb)
            fail_all(mux);
    }
    return DLOCK_OK;
}

int dlock__redis_mux_send_async(dlock__redis_mux *mux, int argc, const char **argv,
                                const size_t *lens, dlock__redis_mux_cb cb, void *arg)
{
    int rc;

    pthread_mutex_lock(&mux->mu);
    rc = send_async(mux, argc, argv, lens, cb, arg, 0);
    unlock(mux);
    return rc;
}

int dlock__redis_mux_send_again(dlock__redis_mux *mux, int argc, const char **argv,
                                const size_t *lens, dlock__redis_mux_cb cb, void *arg)
{
    return send_async(mux, argc, argv, lens, cb, arg, 1);
}

int64_t dlock__redis_mux_pump(dlock__redis_mux *mux)
{
    dlock__redis_tp *tp = &mux->conn.tp;
    int64_t due = -1;

    pthread_mutex_lock(&mux->mu);
    /* Read what the socket has, without waiting (it does not block), also
     * while a caller polls it (or the loop would find it readable again and
     * again until that caller reads): under mu, one reads at a time, and
     * the caller finds nothing left when its poll returns. But while it
     * polls nobody closes the socket under it: a failure shuts it down, and
     * that caller fails everyone, as after a writer's failure; and its poll
     * keeps the deadlines. */
    if (mux->reading && mux->head != NULL && dlock__redis_tp_ok(tp)) {
        unsigned long answered = mux->answered;
        uint64_t one = 1;
        if (read_some(tp) != REDIS_OK || dispatch(mux) != REDIS_OK)
            shutdown(tp->fd, SHUT_RDWR);
        /* Its own reply may be among those read: wake its poll. */
        if (mux->answered != answered && write(mux->wake_fd, &one, sizeof(one)) < 0) {
            /* the counter is full: it is woken anyway */
        }
    } else if (!mux->reading && mux->head != NULL && dlock__redis_tp_ok(tp)) {
        if (read_some(tp) != REDIS_OK || dispatch(mux) != REDIS_OK) {
            fail_all(mux);
            pthread_cond_broadcast(&mux->idle);
        } else if (mux->head != NULL && mux->head->deadline_ms <= dlock__now_ms()) {
            dlock__redis_tp_fail(tp, REDIS_ERR_IO, "timed out (read)");
            tp->timed_out = 1;
            fail_all(mux);
            pthread_cond_broadcast(&mux->idle);
        }
    }
    for (dlock__redis_mux_req *q = mux->head; q != NULL; q = q->next) {
        if (q->cb != NULL) {
            due = mux->head->deadline_ms; /* the first in line times out first */
            break;
        }
    }
    unlock(mux);
    return due;
}

int dlock__redis_mux_fd(dlock__redis_mux *mux, unsigned *gen)
{
    int fd;

    pthread_mutex_lock(&mux->mu);
    fd = mux->on && dlock__redis_tp_ok(&mux->conn.tp) ? mux->conn.tp.fd : -1;
    *gen = mux->gen;
    unlock(mux);
    return fd;
}
