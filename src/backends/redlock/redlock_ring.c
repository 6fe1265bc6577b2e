/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A fan-out's wait on io_uring (redlock_nodes.c starts the round and waits
 * with poll(2) where there is no ring).
 *
 * With a ring, a round is one or two io_uring_enter where poll(2) took a
 * send, a poll and a recv per node: the sends and receives of every node
 * go in together, and the call returns with the first replies. On 2 vCPUs
 * shared with the 5 redis-servers each system call and each wake-up costs
 * the client the time the servers need (docs/bench.md, "Redlock"). Between
 * fan-outs nothing is in flight: dlock__redlock_wait_ring cancels what is
 * left before it returns, so connections are closed and reopened as with
 * poll, and each ring is used under the lock of its connections (cmd_mu, or
 * the watchdog's one call at a time).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#ifdef DLOCK_HAVE_LIBURING
#include <liburing.h>
#endif

#include "backends/redlock/redlock_int.h"
#include "core/clock.h"
#include "core/error.h"

#ifdef DLOCK_HAVE_LIBURING

/* A round queues at most a send, a receive and two cancellations per node
 * between two submissions. */
#define RING_ENTRIES (4 * DLOCK__REDLOCK_NODES_MAX + 4)
#define RING_BUF 4096

enum { OP_SEND = 1, OP_RECV, OP_CANCEL };

struct dlock__redlock_ring {
    struct io_uring ring;
    unsigned sending, receiving; /* nodes with a send, a receive in flight */
    size_t cancels;              /* cancellations in flight */
    int broken; /* something would not stop: poll from now on */
    char buf[][RING_BUF]; /* each node's receive */
};

static uint64_t op_data(int op, size_t node)
{
    return (uint64_t)op << 8 | (uint64_t)node;
}

int dlock__redlock_ring_open(dlock__redlock_ring **out, size_t nodes)
{
    dlock__redlock_ring *r = calloc(1, sizeof(*r) + nodes * RING_BUF);
    int rc;

    *out = NULL;
    if (r == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    /* COOP_TASKRUN (Linux 5.19): completions are posted when we enter the
     * kernel to wait, not by interrupting us. */
    rc = io_uring_queue_init(RING_ENTRIES, &r->ring, IORING_SETUP_COOP_TASKRUN);
    if (rc == -EINVAL)
        rc = io_uring_queue_init(RING_ENTRIES, &r->ring, 0);
    if (rc < 0) {
        free(r);
        return dlock__fail(DLOCK_ENOTSUP, "io_uring_setup: %s", strerror(-rc));
    }
    /* The wait's timeout as an argument (Linux 5.11), not as a request of
     * its own in the ring. */
    if (!(r->ring.features & IORING_FEAT_EXT_ARG)) {
        io_uring_queue_exit(&r->ring);
        free(r);
        return dlock__fail(DLOCK_ENOTSUP, "io_uring: the kernel has no IORING_FEAT_EXT_ARG "
                           "(Linux 5.11)");
    }
    *out = r;
    return DLOCK_OK;
}

void dlock__redlock_ring_close(dlock__redlock_ring *r)
{
    if (r == NULL)
        return;
    io_uring_queue_exit(&r->ring);
    free(r);
}

dlock__redlock_ring *dlock__redlock_ring_usable(dlock__redlock_ring *r)
{
    return r != NULL && !r->broken ? r : NULL;
}

/* A free entry: the queue holds RING_ENTRIES, more than a round queues
 * between two submissions, so this submits only if that ever changes. */
static struct io_uring_sqe *ring_sqe(dlock__redlock_ring *r)
{
    struct io_uring_sqe *e = io_uring_get_sqe(&r->ring);

    if (e == NULL && io_uring_submit(&r->ring) >= 0)
        e = io_uring_get_sqe(&r->ring);
    return e;
}

static int ring_send(dlock__redlock_round *f, dlock__redlock_ring *r, size_t i)
{
    struct io_uring_sqe *e = ring_sqe(r);

    f->st[i].queued = 0;
    if (e == NULL)
        return dlock__fail(DLOCK_ENOMEM, "io_uring: no free submission entry");
    io_uring_prep_send(e, f->st[i].link->conn.tp.fd, f->q.bytes, f->q.len, MSG_NOSIGNAL);
    io_uring_sqe_set_data64(e, op_data(OP_SEND, i));
    r->sending |= 1u << i;
    return DLOCK_OK;
}

static int ring_recv(dlock__redlock_ring *r, int fd, size_t i)
{
    struct io_uring_sqe *e = ring_sqe(r);

    if (e == NULL)
        return dlock__fail(DLOCK_ENOMEM, "io_uring: no free submission entry");
    io_uring_prep_recv(e, fd, r->buf[i], RING_BUF, 0);
    io_uring_sqe_set_data64(e, op_data(OP_RECV, i));
    r->receiving |= 1u << i;
    return DLOCK_OK;
}

/* Cancel node i's send or receive (op); 0 when no entry was free (it is
 * then waited for all the same). */
static int ring_cancel(dlock__redlock_ring *r, int op, size_t i)
{
    struct io_uring_sqe *e = ring_sqe(r);

    if (e == NULL)
        return 0;
    io_uring_prep_cancel64(e, op_data(op, i), 0);
    io_uring_sqe_set_data64(e, op_data(OP_CANCEL, i));
    r->cancels++;
    return 1;
}

/* One completion. draining: what a node sends is only fed to its reader
 * (the outcome is known), its reply skipped later as owed. */
static void ring_done(dlock__redlock_round *f, dlock__redlock_ring *r, uint64_t data, int res,
                      int draining)
{
    size_t i = (size_t)(data & 0xff);
    dlock__redlock_node_state *x = &f->st[i];
    dlock__redis_conn *conn;
    int rc;

    if ((data >> 8) == OP_CANCEL) {
        r->cancels--;
        return;
    }
    conn = &x->link->conn;
    if ((data >> 8) == OP_SEND) {
        r->sending &= ~(1u << i);
        if (res == (int)f->q.len)
            return;
        rc = DLOCK_OK;
        if (res >= 0) {
            /* A short write: the rest as poll would write it. */
            if (dlock__redis_tp_append_resp(&conn->tp, f->q.bytes + res, f->q.len - (size_t)res) !=
                    REDIS_OK ||
                dlock__redis_tp_flush(&conn->tp, dlock__now_ms() + conn->command_ms) != REDIS_OK)
                rc = dlock__redis_conn_io_error(conn);
        } else {
            /* Failed or cancelled: what reached the node is not known, so
             * the connection is not used again (a new one owes nothing). */
            dlock__redis_tp_fail_errno(&conn->tp, -res);
            rc = dlock__redis_conn_io_error(conn);
        }
        if (rc != DLOCK_OK && x->waiting && !draining)
            dlock__redlock_node_input(f, i, rc, 1);
        return;
    }
    r->receiving &= ~(1u << i);
    if (res == -ECANCELED)
        return;
    rc = dlock__redis_tp_took(&conn->tp, r->buf[i], res) == REDIS_OK
             ? DLOCK_OK
             : dlock__redis_conn_io_error(conn);
    if (x->waiting && !draining && !x->resend && res != -EAGAIN)
        dlock__redlock_node_input(f, i, rc, 1);
}

/* Take every completion there is. */
static void ring_reap(dlock__redlock_round *f, dlock__redlock_ring *r, int draining)
{
    struct io_uring_cqe *c;
    unsigned head, seen = 0;

    io_uring_for_each_cqe(&r->ring, head, c)
    {
        ring_done(f, r, io_uring_cqe_get_data64(c), c->res, draining);
        seen++;
    }
    io_uring_cq_advance(&r->ring, seen);
}

/* Submit what is queued and wait up to deadline for a completion or
 * more (waiting in the kernel for as many as a decision takes, a quorum,
 * was no faster). 0, or -errno (-ETIME: the deadline passed). */
static int ring_wait(dlock__redlock_ring *r, int64_t deadline)
{
    struct __kernel_timespec ts;
    struct io_uring_cqe *c;
    int64_t left = deadline - dlock__now_ms();
    int rc;

    if (left < 0)
        left = 0;
    ts.tv_sec = left / 1000;
    ts.tv_nsec = (left % 1000) * 1000000;
    rc = io_uring_submit_and_wait_timeout(&r->ring, &c, 1, &ts, NULL);
    return rc == -EINTR ? 0 : rc < 0 ? rc : 0;
}

/*
 * Cancel what is still in flight and wait for it: a node's receive still
 * posted when the outcome was decided, a send to a full socket. Bounded by
 * the command timeout; a ring that will not let go is given up (broken),
 * and the connections it still used are closed.
 */
static void ring_drain(dlock__redlock_round *f, dlock__redlock_ring *r)
{
    unsigned left = r->sending | r->receiving;
    int64_t deadline = dlock__now_ms() + f->be->command_timeout_ms;

    for (size_t i = 0; i < f->be->n; i++) {
        for (int op = OP_SEND; op <= OP_RECV; op++)
            if ((op == OP_SEND ? r->sending : r->receiving) & (1u << i))
                ring_cancel(r, op, i);
    }
    while ((r->sending | r->receiving) != 0 || r->cancels > 0) {
        int rc = ring_wait(r, deadline);
        ring_reap(f, r, 1);
        if (rc < 0 && rc != -ETIME)
            break;
        if (rc == -ETIME && dlock__now_ms() >= deadline)
            break;
    }
    if ((r->sending | r->receiving) == 0 && r->cancels == 0)
        return;
    r->broken = 1;
    for (size_t i = 0; i < f->be->n; i++)
        if (left & (1u << i))
            dlock__redis_conn_close(&f->st[i].link->conn);
}

void dlock__redlock_wait_ring(dlock__redlock_round *f, dlock__redlock_ring *r, int64_t deadline)
{
    size_t n = f->be->n;
    int rc;

    for (size_t i = 0; i < n; i++)
        if (f->st[i].queued && (rc = ring_send(f, r, i)) != DLOCK_OK)
            dlock__redlock_node_failed(f, i, rc);
    for (;;) {
        int any = 0;
        for (size_t i = 0; i < n; i++) {
            dlock__redlock_node_state *x = &f->st[i];
            unsigned bit = 1u << i;
            if (x->resend && (r->receiving & bit) && !x->cancelled)
                /* The old socket may never be readable again. */
                x->cancelled = ring_cancel(r, OP_RECV, i);
            if (x->resend && !((r->sending | r->receiving) & bit)) {
                /* On a fresh connection (redlock_nodes.c's connect_link
                 * writes it with the scripts loaded ahead). */
                x->resend = 0;
                x->waiting = 0;
                if ((rc = dlock__redlock_node_start(x, &f->q, 1)) == DLOCK_OK && x->queued)
                    rc = ring_send(f, r, i);
                if (rc != DLOCK_OK)
                    dlock__redlock_node_failed(f, i, rc);
            }
            if (x->waiting && !x->resend && !(r->receiving & bit) &&
                (rc = ring_recv(r, x->link->conn.tp.fd, i)) != DLOCK_OK)
                dlock__redlock_node_failed(f, i, rc);
            any |= x->waiting;
        }
        if (f->done || !any || dlock__now_ms() >= deadline)
            break;
        rc = ring_wait(r, deadline);
        ring_reap(f, r, 0);
        if (rc < 0 && rc != -ETIME) {
            /* The ring itself failed: every node still waited for. */
            dlock__fail(DLOCK_ECONN, "io_uring_enter: %s", strerror(-rc));
            for (size_t i = 0; i < n; i++)
                if (f->st[i].waiting)
                    dlock__redlock_node_failed(f, i, DLOCK_ECONN);
        }
    }
    ring_drain(f, r);
}

#else

int dlock__redlock_ring_open(dlock__redlock_ring **out, size_t nodes)
{
    (void)nodes;
    *out = NULL;
    return dlock__fail(DLOCK_ENOTSUP, "this dlock was built without io_uring (liburing)");
}

void dlock__redlock_ring_close(dlock__redlock_ring *r)
{
    (void)r;
}

dlock__redlock_ring *dlock__redlock_ring_usable(dlock__redlock_ring *r)
{
    (void)r;
    return NULL;
}

#endif
