/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The MySQL backend's waiting. MySQL has no LISTEN/NOTIFY; what it has that
 * a session can block on and another session's release (or death) ends is
 * a user-level lock, so each watch is a connection blocked in GET_LOCK:
 *
 *   named mode  on the lock itself: the server queues the waiters, and the
 *               first in line is granted the lock as the holder lets go
 *               (or its connection dies). The grant stays on the watch's
 *               connection, which the next acquire takes over (a hand-off
 *               in the server's order, no herd).
 *   lease mode  on the lease's wake channel, which the holding client holds
 *               on its wake connection while it holds the lease
 *               (mysql_lease.c): "SELECT IS_FREE_LOCK(w), GET_LOCK(w, s),
 *               RELEASE_LOCK(w)" returns as the holder releases, crashes or
 *               loses its connection, and lets go of the channel at once.
 *               Every waiter wakes and tries; the losers wait again. A
 *               channel found free twice in a row means a holder without
 *               one (another program, or not yet): the waiter then pauses,
 *               10 ms doubling to 500 ms, within the holder's expiry (the
 *               core bounds every wait by it), never a tight loop.
 *
 *   observer    an election's observer (lease mode) blocks on the leader's
 *               channel while a leader lives; while none does it SLEEPs in a
 *               statement tagged with the election's name, and a new leader
 *               ends that SLEEP with KILL QUERY (dlock__my_observe_sql).
 *
 * The statement is sent and its reply polled for beside the watch's
 * eventfd (watch_wake), so a wake does not wait for the server; a
 * statement still running then stays in flight and the next watch_wait
 * goes on reading it. GET_LOCK's own timeout (at most 60 s a slice) and the
 * read timeout bound how long a statement can stay in flight.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "mysql_int.h"

typedef struct {
    MYSQL *c;            /* the watch's connection; NULL while broken */
    int wake_fd;         /* eventfd: watch_wake rings it */
    char *name;
    char expr[DLOCK__MY_LOCKEXPR_MAX];
    int pending;         /* a GET_LOCK is in flight on c */
    int64_t pending_until; /* ... and should have answered by then */
    int granted;         /* named: c holds the lock */
    int free_seen;       /* lease: the channel was free last time */
    int64_t free_pause;  /* lease: the last sleep for a channel found free twice */
    char *lost_token;    /* lease: the last try's token if its outcome is unknown */
    char *fam_token;     /* lease: a family acquisition's token (its place to leave) */
    int fam_queues;      /* ... of a kind that queues (fair, write) */
    int observe;         /* an election's observer (below) */
    char *key;           /* observer: the stored name as X'hex' */
} my_watch;

int dlock__my_watch_begin(void *arg, const dlock_request *req, void **watch)
{
    dlock__my_be *be = arg;
    my_watch *w;
    int rc;

    *watch = NULL;
    if ((w = calloc(1, sizeof(*w))) == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    w->wake_fd = -1;
    if ((rc = dlock__my_lock_expr(be, req->name, be->named ? 'n' : 'w', w->expr)) != DLOCK_OK)
        goto err;
    if ((w->name = strdup(req->name)) == NULL) {
        rc = dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
        goto err;
    }
    if ((w->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
        rc = dlock_backend_fail(DLOCK_ENOMEM, "%s: cannot make an eventfd: %s", be->where,
                                strerror(errno));
        goto err;
    }
    /* The connection now, so a server that cannot be reached is reported
     * here. Nothing can be missed before the first GET_LOCK: it finds the
     * lock (or channel) free and returns at once. The family's waiter
     * connects in its first watch_wait instead (which then returns at once,
     * a reason to try): its next try, which takes its place in a fair
     * queue, follows its first busy one without a connection's delay. */
    if (!(!be->named && dlock__my_family_request(req)) &&
        (rc = dlock__my_connect(be, &w->c)) != DLOCK_OK)
        goto err;
    *watch = w;
    return DLOCK_OK;
err:
    if (w->wake_fd >= 0)
        close(w->wake_fd);
    free(w->name);
    free(w);
    return rc;
}

void dlock__my_watch_note_family(void *watch, const char *token, int queues)
{
    my_watch *w = watch;

    if (w->fam_token == NULL)
        w->fam_token = strdup(token); /* NULL: out of memory; the place expires */
    w->fam_queues |= queues;
}

int dlock__my_observe_begin(void *arg, const char *name, void **watch)
{
    dlock_request req;
    int rc;

    char key[DLOCK__MY_HEX_MAX];
    my_watch *w;

    memset(&req, 0, sizeof(req));
    req.name = name;
    if ((rc = dlock__my_key_hex(arg, name, key)) != DLOCK_OK ||
        (rc = dlock__my_watch_begin(arg, &req, watch)) != DLOCK_OK)
        return rc;
    w = *watch;
    w->observe = 1;
    if ((w->key = strdup(key)) == NULL) {
        dlock__my_watch_end(arg, w);
        *watch = NULL;
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    }
    return DLOCK_OK;
}

void dlock__my_watch_note_try(void *watch, const char *token, int unknown)
{
    my_watch *w = watch;

    free(w->lost_token);
    w->lost_token = unknown ? strdup(token) : NULL;
}

MYSQL *dlock__my_watch_take_granted(void *watch)
{
    my_watch *w = watch;
    MYSQL *c;

    if (w == NULL || !w->granted)
        return NULL;
    c = w->c;
    w->c = NULL;
    w->granted = 0;
    return c;
}

static int drain_wake(my_watch *w)
{
    uint64_t count;

    /* EAGAIN: another read took it; woken all the same. */
    return read(w->wake_fd, &count, sizeof(count)) < 0 ? 0 : 1;
}

/* Read the reply of the statement in flight: the GET_LOCK result into
 * *got, IS_FREE_LOCK's into *was_free (lease mode). -1 when the
 * connection broke. */
static int read_reply(my_watch *w, int named, int *got, int *was_free, int *slept)
{
    MYSQL_RES *res;
    MYSQL_ROW row;

    w->pending = 0;
    if (mysql_read_query_result(w->c) != 0 || (res = mysql_store_result(w->c)) == NULL)
        return -1;
    row = mysql_fetch_row(res);
    if (row == NULL || mysql_num_fields(res) < (named ? 1u : 3u)) {
        mysql_free_result(res);
        return -1;
    }
    if (named) {
        *was_free = 0;
        *got = row[0] != NULL && strcmp(row[0], "1") == 0;
    } else {
        *was_free = row[0] != NULL && strcmp(row[0], "1") == 0;
        *got = row[1] != NULL && strcmp(row[1], "1") == 0;
        /* An observer's SLEEP, ended or cut short by a new leader. */
        *slept = row[1] != NULL && (strcmp(row[1], "2") == 0 || strcmp(row[1], "3") == 0);
    }
    mysql_free_result(res);
    while (mysql_next_result(w->c) == 0) {
        res = mysql_store_result(w->c);
        if (res != NULL)
            mysql_free_result(res);
    }
    return 0;
}

static int send_wait(dlock__my_be *be, my_watch *w, int64_t timeout_ms)
{
    char sql[3 * DLOCK__MY_LOCKEXPR_MAX + 3 * DLOCK__MY_HEX_MAX + 512];
    int64_t s = (timeout_ms + 999) / 1000;

    if (s < 1)
        s = 1;
    if (s > 60)
        s = 60;
    if (be->named)
        snprintf(sql, sizeof(sql), "SELECT GET_LOCK(%s, %lld)", w->expr, (long long)s);
    else if (w->observe)
        dlock__my_observe_sql(sql, sizeof(sql), w->key, w->expr, s > 5 ? 5 : s);
    else
        snprintf(sql, sizeof(sql), "SELECT IS_FREE_LOCK(%s), GET_LOCK(%s, %lld), RELEASE_LOCK(%s)",
                 w->expr, w->expr, (long long)s, w->expr);
    if (mysql_send_query(w->c, sql, (unsigned long)strlen(sql)) != 0)
        return -1;
    w->pending = 1;
    w->pending_until = dlock__my_now_ms() + s * 1000 + be->command_ms;
    return 0;
}

/* Sleep on the eventfd alone until deadline (-1: none). */
static int sleep_only(my_watch *w, int64_t deadline)
{
    struct pollfd pf = {.fd = w->wake_fd, .events = POLLIN};
    int64_t left = deadline < 0 ? -1 : deadline - dlock__my_now_ms();

    if (deadline >= 0 && left < 0)
        left = 0;
    if (poll(&pf, 1, left > INT_MAX ? INT_MAX : (int)left) > 0) {
        drain_wake(w);
        return DLOCK_OK;
    }
    return deadline >= 0 && dlock__my_now_ms() >= deadline ? DLOCK_ETIMEOUT : DLOCK_OK;
}

int dlock__my_watch_wait(void *arg, void *watch, int64_t timeout_ms)
{
    dlock__my_be *be = arg;
    my_watch *w = watch;
    /* A timeout past any deadline (the core's wait forever) is none. */
    int64_t deadline =
        timeout_ms < 0 || timeout_ms > INT64_MAX / 2 ? -1 : dlock__my_now_ms() + timeout_ms;

    if (w->granted)
        return DLOCK_OK; /* the next acquire takes it */
    for (;;) {
        struct pollfd fds[2];
        int64_t now = dlock__my_now_ms(), left = deadline < 0 ? -1 : deadline - now;
        int got = 0, was_free = 0, slept = 0, n;

        if (w->c == NULL) {
            /* Broken: a release may have gone unseen, so a reconnection
             * that works is a reason to try; until one works, look again
             * every second. */
            if (dlock__my_connect(be, &w->c) == DLOCK_OK)
                return DLOCK_OK;
            if (left < 0 || left > 1000)
                left = 1000;
            if (sleep_only(w, now + left) == DLOCK_OK &&
                (deadline < 0 || dlock__my_now_ms() < deadline))
                return DLOCK_OK;
            if (deadline >= 0 && dlock__my_now_ms() >= deadline)
                return DLOCK_ETIMEOUT;
            continue;
        }
        if (!w->pending) {
            if (!be->named && w->free_seen == 2) {
                /* Found free twice with a busy try between: the lock
                 * passed from hand to hand faster than holders took its
                 * channel, or its holder keeps none (another program). A
                 * pause that doubles, 10 ms to 500 ms, and the holder's
                 * expiry (the core's deadline) bound this: where the lock
                 * changes hands every millisecond, sleeping to the expiry
                 * cost 5 s a time. */
                int64_t until;
                w->free_seen = 0;
                w->free_pause = w->free_pause == 0 ? 10
                                : w->free_pause >= 250 ? 500 : 2 * w->free_pause;
                until = dlock__my_now_ms() + w->free_pause;
                return sleep_only(w, deadline >= 0 && deadline < until ? deadline : until);
            }
            if (send_wait(be, w, left < 0 ? 60000 : left) != 0) {
                dlock__my_drop(&w->c);
                return DLOCK_OK;
            }
        }
        if (deadline >= 0 && left < 0)
            left = 0;
        if (now >= w->pending_until) {
            dlock__my_drop(&w->c); /* no answer from the server in time */
            w->pending = 0;
            return DLOCK_OK;
        }
        if (left < 0 || left > w->pending_until - now)
            left = w->pending_until - now;
        fds[0].fd = w->wake_fd;
        fds[0].events = POLLIN;
        fds[0].revents = 0;
        fds[1].fd = (int)mysql_get_socket(w->c);
        fds[1].events = POLLIN;
        fds[1].revents = 0;
        n = poll(fds, 2, left > INT_MAX ? INT_MAX : (int)left);
        if (n < 0 && errno != EINTR)
            return DLOCK_OK; /* cannot sleep: let the core look */
        if (fds[0].revents & POLLIN) {
            drain_wake(w);
            return DLOCK_OK;
        }
        if (fds[1].revents != 0) {
            if (read_reply(w, be->named, &got, &was_free, &slept) != 0) {
                dlock__my_drop(&w->c); /* also a SLEEP a new leader killed with an error */
                return DLOCK_OK;
            }
            if (be->named && got) {
                w->granted = 1;
                return DLOCK_OK;
            }
            if (w->observe && was_free && got) {
                /* A leader whose client holds no channel (it crashed, or
                 * lost the race for it): look again in a second. */
                int64_t until = dlock__my_now_ms() + 1000;
                if (deadline >= 0 && deadline < until)
                    until = deadline;
                return sleep_only(w, until);
            }
            if (w->observe)
                return DLOCK_OK; /* the leader went, or one came */
            if (!be->named && was_free) {
                /* Free the first time: maybe released just now, so try;
                 * free again after a busy try: no channel to wait on. */
                w->free_seen = w->free_seen ? 2 : 1;
                if (w->free_seen == 1)
                    return DLOCK_OK;
                continue;
            }
            w->free_seen = 0;
            w->free_pause = 0; /* a holder with a channel */
            if (got)
                return DLOCK_OK; /* the holder let go of the channel */
        }
        if (deadline >= 0 && dlock__my_now_ms() >= deadline)
            return DLOCK_ETIMEOUT;
    }
}

void dlock__my_watch_end(void *arg, void *watch)
{
    dlock__my_be *be = arg;
    my_watch *w = watch;

    if (w == NULL)
        return;
    if (w->fam_token != NULL && !be->named) {
        if (w->fam_queues || w->lost_token != NULL) /* best effort */
            dlock__my_fam_leave(be, w->name, w->fam_token, w->lost_token != NULL);
    } else if (w->lost_token != NULL && !be->named)
        dlock__my_lease_release_token(be, w->name, w->lost_token); /* best effort */
    /* A GET_LOCK in flight is ended on the server first, and its answer
     * read: a session blocked in GET_LOCK does not notice that its client
     * has gone, and would be granted the lock at the holder's release and
     * keep it until it tried to answer. A lock granted (before the kill,
     * or not taken by an acquire) is given back before the connection is
     * closed, whose end the server handles only later. */
    if (w->pending && w->c != NULL) {
        char sql[48];
        struct pollfd pf = {.fd = (int)mysql_get_socket(w->c), .events = POLLIN};
        int got = 0, was_free = 0, slept = 0;
        int64_t until = dlock__my_now_ms() + be->command_ms, slice = 20;

        /* A KILL QUERY that reaches the server before the statement began
         * ends nothing (the statement then blocks as if never killed): it
         * is sent again after 20 ms, 40, ... 320 at most, until the
         * answer comes, and a last time when the command timeout ends,
         * since the server does not notice the connection closed after.
         * With a single KILL, about one leave in ten waited out the
         * command timeout (5 s). */
        snprintf(sql, sizeof(sql), "KILL QUERY %lu", mysql_thread_id(w->c));
        for (;;) {
            int64_t left = until - dlock__my_now_ms();
            dlock__my_cmd(be, sql, NULL, NULL); /* best effort; the core keeps its message */
            if (left <= 0)
                break;
            if (poll(&pf, 1, (int)(left < slice ? left : slice)) > 0) {
                if (read_reply(w, be->named, &got, &was_free, &slept) == 0 && be->named && got)
                    w->granted = 1;
                break;
            }
            slice = slice < 320 ? 2 * slice : 320;
        }
        w->pending = 0;
    }
    if (w->granted && w->c != NULL)
        dlock__my_query(be, &w->c, "DO RELEASE_ALL_LOCKS()", NULL, NULL);
    dlock__my_drop(&w->c);
    free(w->lost_token);
    free(w->fam_token);
    free(w->key);
    close(w->wake_fd);
    free(w->name);
    free(w);
}

void dlock__my_watch_wake(void *arg, void *watch)
{
    my_watch *w = watch;
    uint64_t one = 1;

    (void)arg;
    /* EAGAIN: the counter is full, so the waiter wakes anyway. */
    if (write(w->wake_fd, &one, sizeof(one)) < 0) {
    }
}
