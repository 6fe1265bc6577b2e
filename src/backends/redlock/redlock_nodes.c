/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * One request to every node at once. Each node's connection is the Redis
 * backend's (redis_conn.c: timeouts, credentials, database, bounded
 * replies); the requests are written to all of them first, then one poll
 * over all their sockets reads the replies until the per-node timeout, so a
 * round costs the slowest answering node's round trip, not the sum. With a
 * ring, io_uring does the writes and the waiting (redlock_ring.c).
 *
 * A fan-out returns as soon as its outcome is decided (the caller's
 * decided function: a quorum granted, or no quorum can any more), without
 * waiting for the slowest nodes. A node that did not answer in time, or was
 * not waited for, keeps its connection: the request is owed, its reply will
 * come in order before the next one's and is skipped then
 * (dlock__redlock_link.owed), taken off the socket by the next fan-out's
 * poll. So a release sent after an acquire whose reply was not read runs
 * there after it, on the same connection, and a late grant is released (or
 * renewed) with the rest: nothing is left behind.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/redlock/redlock_int.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/thread.h"

/* The scripts a connection may run, loaded ahead on each new one. */
static const dlock__redis_script *const preload[] = {
    &dlock__redlock_script_acquire, &dlock__redlock_script_confirm,
    &dlock__redlock_script_release, &dlock__redlock_script_renew,
    &dlock__redlock_script_reset,   &dlock__redis_script_status,
};

static void note(dlock__redlock_answer *a, int code)
{
    a->code = code;
    snprintf(a->why, sizeof(a->why), "%s", dlock_error_message());
}

/* The thread's message, kept across a fan-out, which sets one per failing
 * node: copied and put back only when it changed (no printf on the common
 * path). */
void dlock__redlock_message_save(char *saved, size_t size)
{
    const char *m = dlock_error_message();
    size_t n = strlen(m);

    if (n >= size)
        n = size - 1;
    memcpy(saved, m, n);
    saved[n] = '\0';
}

void dlock__redlock_message_restore(const char *saved)
{
    if (strcmp(dlock_error_message(), saved) != 0)
        dlock__fail(DLOCK_OK, "%s", saved);
}

static int link_open(const dlock__redlock_link *l)
{
    return dlock__redis_conn_is_open(&l->conn);
}

/* One more reply owed on l, to a request of token (NULL: none's). A
 * token's that cannot be noted (out of memory) closes the connection, as
 * for a node that owes too many (the corner docs/redlock.md names). */
static void owe(dlock__redlock_link *l, const char *token)
{
    if (token != NULL && l->whose == NULL) {
        /* The replies owed so far were none's: zeroed slots. */
        if ((l->whose = calloc(DLOCK__REDLOCK_OWED_SLOTS, sizeof(*l->whose))) == NULL) {
            dlock__redis_conn_close(&l->conn);
            return;
        }
        l->first = 0;
    }
    if (l->whose != NULL) {
        char *slot = l->whose[(l->first + l->owed) % DLOCK__REDLOCK_OWED_SLOTS];
        snprintf(slot, DLOCK_BACKEND_TOKEN_LEN + 1, "%s", token != NULL ? token : "");
    }
    l->owed++;
}

/* Connect, and queue SCRIPT LOAD of every script (sent with the first
 * request; their replies are owed, and skipped). A new connection owes
 * nothing else. */
static int connect_link(dlock__redlock_link *l)
{
    int rc;

    l->owed = 0;
    l->first = 0;
    if ((rc = dlock__redis_conn_connect(&l->conn)) != DLOCK_OK)
        return rc;
    for (size_t i = 0; i < sizeof(preload) / sizeof(preload[0]); i++) {
        const char *av[3] = {"SCRIPT", "LOAD", preload[i]->body};
        size_t al[3] = {6, 4, preload[i]->len};
        if (dlock__redis_tp_append_argv(&l->conn.tp, 3, av, al) != REDIS_OK)
            return dlock__redis_conn_io_error(&l->conn);
        owe(l, NULL);
    }
    return DLOCK_OK;
}

typedef struct {
    dlock__redlock_link *link;
    dlock__redlock_answer *ans;
    pthread_t thread;
} connect_job;

static void *connect_main(void *arg)
{
    connect_job *j = arg;

    if ((j->ans->code = connect_link(j->link)) != DLOCK_OK)
        note(j->ans, j->ans->code);
    return NULL;
}

void dlock__redlock_connect(dlock__redlock_be *be, int set, unsigned mask,
                            dlock__redlock_answer *ans)
{
    connect_job jobs[DLOCK__REDLOCK_NODES_MAX];
    size_t n = 0;

    for (size_t i = 0; i < be->n; i++) {
        dlock__redlock_link *l = &be->nodes[i].link[set];
        if (!(mask & (1u << i)))
            continue;
        ans[i].code = DLOCK_OK;
        ans[i].why[0] = '\0';
        if (link_open(l))
            continue;
        jobs[n].link = l;
        jobs[n].ans = &ans[i];
        n++;
    }
    if (n == 1) {
        connect_main(&jobs[0]);
        return;
    }
    for (size_t k = 0; k < n; k++) {
        if (dlock__thread_create(&jobs[k].thread, connect_main, &jobs[k]) != 0) {
            connect_main(&jobs[k]); /* no thread to be had: here, in turn */
            jobs[k].thread = pthread_self();
        }
    }
    for (size_t k = 0; k < n; k++)
        if (!pthread_equal(jobs[k].thread, pthread_self()))
            pthread_join(jobs[k].thread, NULL);
}

/* EVAL the script (the node answered NOSCRIPT to the EVALSHA). */
static int send_eval(dlock__redis_conn *conn, const dlock__redis_script *s, int nkeys,
                     int argc, const char **argv, const size_t *lens)
{
    dlock__redis_script_cmd c;
    int rc;

    if ((rc = dlock__redis_script_cmd_init(&c, s, 1, nkeys, argc, argv, lens)) != DLOCK_OK)
        return rc;
    if (dlock__redis_tp_append_argv(&conn->tp, c.argc, c.av, c.al) != REDIS_OK ||
        dlock__redis_tp_flush(&conn->tp, dlock__now_ms() + conn->command_ms) != REDIS_OK)
        rc = dlock__redis_conn_io_error(conn);
    dlock__redis_script_cmd_free(&c);
    return rc;
}

static int request_init(dlock__redlock_request *q, const dlock__redis_script *s, int nkeys,
                        int argc, const char **argv, const size_t *lens)
{
    dlock__redis_script_cmd c;
    int rc;

    q->bytes = q->stack;
    if ((rc = dlock__redis_script_cmd_init(&c, s, 0, nkeys, argc, argv, lens)) != DLOCK_OK)
        return rc;
    q->len = dlock__redis_resp_len(c.argc, c.al);
    q->bytes = q->len <= sizeof(q->stack) ? q->stack : malloc(q->len);
    if (q->bytes == NULL) {
        dlock__redis_script_cmd_free(&c);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    dlock__redis_resp_write(q->bytes, c.argc, c.av, c.al);
    dlock__redis_script_cmd_free(&c);
    return DLOCK_OK;
}

static void request_free(dlock__redlock_request *q)
{
    if (q->bytes != q->stack)
        free(q->bytes);
}

/* Connect if needed and queue the request (after the scripts loaded ahead
 * on a new connection). by_ring: when nothing else is queued, leave the
 * writing to the ring (queued set); otherwise write it all out now: one
 * write. */
int dlock__redlock_node_start(dlock__redlock_node_state *st, const dlock__redlock_request *q,
                              int by_ring)
{
    dlock__redlock_link *l = st->link;
    dlock__redis_conn *conn = &l->conn;
    int rc;

    if (!link_open(l) && (rc = connect_link(l)) != DLOCK_OK)
        return rc;
    if (by_ring && conn->tp.opos == conn->tp.olen) {
        st->queued = 1;
        st->waiting = 1;
        return DLOCK_OK;
    }
    /* A request this small goes into the socket's empty send buffer at
     * once; the command timeout bounds a full one. */
    if (dlock__redis_tp_append_resp(&conn->tp, q->bytes, q->len) != REDIS_OK ||
        dlock__redis_tp_flush(&conn->tp, dlock__now_ms() + conn->command_ms) != REDIS_OK)
        return dlock__redis_conn_io_error(conn);
    st->waiting = 1;
    return DLOCK_OK;
}

/*
 * The next reply of ours among what the node sent (read into its
 * transport's reader). DLOCK_OK with *out NULL while it has not come, with
 * *out set once it has; a code on failure (the connection closed).
 */
static int next_reply(dlock__redlock_node_state *st, redisReply **out)
{
    dlock__redis_conn *conn = &st->link->conn;
    void *r;

    *out = NULL;
    for (;;) {
        r = NULL;
        if (dlock__redis_tp_get_reply(&conn->tp, &r) != REDIS_OK)
            return dlock__redis_conn_io_error(conn);
        if (r == NULL)
            return dlock__redis_conn_over_cap(conn) ? dlock__redis_conn_io_error(conn)
                                                     : DLOCK_OK;
        if (st->link->owed > 0) {
            /* A script loaded ahead, or the reply to a request of an
             * earlier round that timed out or was not waited for. */
            st->link->owed--;
            st->link->first = (st->link->first + 1) % DLOCK__REDLOCK_OWED_SLOTS;
            freeReplyObject(r);
            continue;
        }
        *out = r;
        return DLOCK_OK;
    }
}

/* Node i's answer is final: ask whether the outcome is decided. */
static void answered(dlock__redlock_round *f, size_t i)
{
    if (f->decided != NULL && f->decided(f->ctx, f->ans, i))
        f->done = 1;
}

void dlock__redlock_node_failed(dlock__redlock_round *f, size_t i, int code)
{
    f->st[i].waiting = 0;
    note(&f->ans[i], code);
    answered(f, i);
}

/* The node closed a connection that looked open (it restarted): the
 * request never ran there, and may be sent again, once. */
static int may_resend(const dlock__redlock_node_state *x)
{
    return x->reused && !x->resent && !x->link->conn.timed_out && x->link->owed == 0;
}

/*
 * Node i sent something, now in its reader (rc: DLOCK_OK, or why reading
 * failed): take our reply if it came, and ask whether the outcome is
 * decided. by_ring: a request to send again is left to the ring (resend).
 */
void dlock__redlock_node_input(dlock__redlock_round *f, size_t i, int rc, int by_ring)
{
    dlock__redlock_node_state *x = &f->st[i];
    redisReply *r = NULL;

    if (rc == DLOCK_OK)
        rc = next_reply(x, &r);
    if (rc == DLOCK_ECONN && may_resend(x)) {
        x->resent = 1;
        x->reused = 0;
        if (by_ring) {
            x->resend = 1; /* once the ring has let go of the old socket */
            return;
        }
        x->waiting = 0;
        if ((rc = dlock__redlock_node_start(x, &f->q, 0)) == DLOCK_OK)
            return;
    }
    if (rc != DLOCK_OK) {
        dlock__redlock_node_failed(f, i, rc);
        return;
    }
    if (r == NULL)
        return;
    if (r->type == REDIS_REPLY_ERROR && !x->reloaded && r->len >= 8 &&
        strncmp(r->str, "NOSCRIPT", 8) == 0) {
        /* The node flushed its scripts: EVAL loads it. */
        freeReplyObject(r);
        x->reloaded = 1;
        if ((rc = send_eval(&x->link->conn, f->s, f->nkeys, f->argc, f->argv, f->lens)) !=
            DLOCK_OK)
            dlock__redlock_node_failed(f, i, rc);
        return;
    }
    x->waiting = 0;
    if (r->type == REDIS_REPLY_ERROR) {
        note(&f->ans[i], dlock__redis_conn_reply_error(&x->link->conn, r));
        freeReplyObject(r);
    } else {
        f->ans[i].reply = r;
        f->replied++;
    }
    answered(f, i);
}

/* Wait for the nodes with poll(2), reading each when it is ready. */
static void wait_poll(dlock__redlock_round *f, int64_t deadline)
{
    struct pollfd fds[DLOCK__REDLOCK_NODES_MAX];
    size_t idx[DLOCK__REDLOCK_NODES_MAX];

    while (!f->done) {
        size_t k = 0;
        int64_t left = deadline - dlock__now_ms();
        int n;

        for (size_t i = 0; i < f->be->n; i++)
            if (f->st[i].waiting) {
                fds[k].fd = f->st[i].link->conn.tp.fd;
                fds[k].events = POLLIN;
                fds[k].revents = 0;
                idx[k++] = i;
            }
        if (k == 0 || left <= 0)
            break;
        n = poll(fds, k, (int)(left > 60000 ? 60000 : left));
        if (n < 0 && errno != EINTR)
            break;
        /* Every node that is ready, before asking whether it is decided:
         * replies owed from earlier rounds are taken off the sockets too. */
        for (size_t j = 0; n > 0 && j < k; j++) {
            dlock__redis_conn *conn = &f->st[idx[j]].link->conn;
            if (fds[j].revents == 0)
                continue;
            dlock__redlock_node_input(f, idx[j],
                                      dlock__redis_tp_read(&conn->tp, -1) == REDIS_OK
                                          ? DLOCK_OK
                                          : dlock__redis_conn_io_error(conn),
                                      0);
        }
    }
}

size_t dlock__redlock_fanout(dlock__redlock_be *be, int set, const char *token, unsigned mask,
                             const dlock__redis_script *s, int nkeys, int argc,
                             const char **argv, const size_t *lens, int64_t timeout_ms,
                             dlock__redlock_decided_fn decided, void *ctx,
                             dlock__redlock_answer *ans)
{
    dlock__redlock_round f;
    int64_t deadline;
    dlock__redlock_ring *ring = dlock__redlock_ring_usable(be->ring[set]);
    dlock__sigpipe_guard guard;
    char saved[512];
    int qrc;

    dlock__redlock_message_save(saved, sizeof(saved));
    /* OpenSSL writes with write(2): a node gone away must not raise
     * SIGPIPE in the application. Clear text is sent with MSG_NOSIGNAL. */
    if (be->tls)
        dlock__sigpipe_block(&guard);
    f.be = be;
    f.s = s;
    f.nkeys = nkeys;
    f.argc = argc;
    f.argv = argv;
    f.lens = lens;
    f.decided = decided;
    f.ctx = ctx;
    f.ans = ans;
    f.replied = 0;
    f.done = 0;
    qrc = request_init(&f.q, s, nkeys, argc, argv, lens);
    for (size_t i = 0; i < be->n; i++) {
        memset(&f.st[i], 0, sizeof(f.st[i]));
        ans[i].reply = NULL;
        ans[i].code = DLOCK_OK;
        ans[i].pending = 0;
        ans[i].why[0] = '\0';
        if (!(mask & (1u << i)))
            continue;
        f.st[i].link = &be->nodes[i].link[set];
        f.st[i].reused = link_open(f.st[i].link);
    }
    /* The nodes without a connection, all at once. The replies are waited
     * for from then on: a node slow to answer its connection's set-up
     * (a set's first call, a reconnection) costs the round its connect,
     * not every node's reply. */
    dlock__redlock_connect(be, set, mask, ans);
    deadline = dlock__now_ms() + timeout_ms;
    for (size_t i = 0; i < be->n; i++) {
        int rc;
        if (!(mask & (1u << i)))
            continue;
        rc = ans[i].code;
        if (rc == DLOCK_OK)
            rc = qrc;
        if (rc == DLOCK_OK)
            rc = dlock__redlock_node_start(&f.st[i], &f.q, ring != NULL);
        if (rc != DLOCK_OK && rc != qrc && f.st[i].reused) {
            /* Dead before we used it (the node restarted): once more. */
            f.st[i].reused = 0;
            rc = dlock__redlock_node_start(&f.st[i], &f.q, ring != NULL);
        }
        if (rc != DLOCK_OK) {
            f.st[i].waiting = 0;
            if (ans[i].code == DLOCK_OK)
                note(&ans[i], rc);
            answered(&f, i);
        }
    }

#ifdef DLOCK_HAVE_LIBURING
    if (ring != NULL)
        dlock__redlock_wait_ring(&f, ring, deadline);
    else
#endif
        wait_poll(&f, deadline);

    for (size_t i = 0; i < be->n; i++) {
        if (!f.st[i].waiting)
            continue;
        if (f.done) {
            /* No text: a node not waited for is named in no message
             * (dlock__redlock_fail_quorum), and this is the common case. */
            ans[i].pending = 1;
            ans[i].code = DLOCK_ETIMEOUT;
        } else {
            dlock__fail(DLOCK_ETIMEOUT, "%s: no reply within %lld ms",
                        f.st[i].link->conn.where, (long long)timeout_ms);
            note(&ans[i], DLOCK_ETIMEOUT);
        }
        /* A NOSCRIPT still to come for this request is skipped with the
         * rest: the scripts are loaded ahead on every connection. */
        owe(f.st[i].link, token);
        if (f.st[i].link->owed > DLOCK__REDLOCK_OWED_MAX)
            dlock__redis_conn_close(&f.st[i].link->conn);
    }
    request_free(&f.q);
    if (be->tls)
        dlock__sigpipe_restore(&guard);
    /* The caller reports the round as a whole (dlock__redlock_fail_quorum). */
    dlock__redlock_message_restore(saved);
    return f.replied;
}

void dlock__redlock_answers_free(dlock__redlock_answer *ans, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (ans[i].reply != NULL)
            freeReplyObject(ans[i].reply);
        ans[i].reply = NULL;
    }
}

int dlock__redlock_fail_quorum(const dlock__redlock_be *be, const char *what, size_t agreed,
                               const dlock__redlock_answer *ans, unsigned mask, int fallback)
{
    char text[1024];
    size_t len;
    int code = fallback;

    len = (size_t)snprintf(text, sizeof(text), "redlock: %s: %zu of %zu nodes (quorum %zu)",
                           what, agreed, be->n, be->quorum);
    for (size_t i = 0; i < be->n && len < sizeof(text); i++) {
        if (!(mask & (1u << i)) || ans[i].code == DLOCK_OK || ans[i].pending)
            continue;
        if (code == fallback)
            code = ans[i].code;
        len += (size_t)snprintf(text + len, sizeof(text) - len, "; %s", ans[i].why);
    }
    if (code == DLOCK_ETIMEOUT)
        code = DLOCK_ECONN; /* a node that does not answer is a network failure */
    return dlock__fail(code, "%s", text);
}
