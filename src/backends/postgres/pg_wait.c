/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Waiting without polling: LISTEN/NOTIFY. A release (and a force release)
 * sends pg_notify(TABLE, hex of the row's name) in its statement (a fair
 * lock's release adds the waiter id of its queue's head, which wakes that
 * waiter alone: pg_family.c); the notification is delivered when it
 * commits. Each client has one listener
 * connection, LISTENing on TABLE, opened by the first watch_begin; a
 * thread of the client's reads it (blocked in poll() on its socket and an
 * eventfd, never a timer) and wakes the watches of the name. A wait is also
 * bounded by the holder's lease (the core sleeps at most retry_ms, the
 * lease the holder had left), since a lease that runs out sends nothing.
 *
 * Locking: l->mu guards the connection pointer, the watch list and each
 * watch's woken flag; the thread reads the socket without it (only the
 * thread touches a live connection; watch_begin only installs a new one
 * when there is none).
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <openssl/rand.h>

#include "pg_int.h"

typedef struct pg_watch {
    struct pg_watch *next;
    char *hex; /* the row name the watch waits for; NULL: an election-less
                * watch woken by watch_wake only */
    int woken;
    char *name;       /* the lock's name */
    char *lost_token; /* the last try's token when its outcome is unknown */
    int kind;         /* the request's DLOCK_KIND_* */
    char id[33];      /* the waiter's id: its place in a family queue */
    int queued;       /* a try left a place under id (watch_end removes it) */
    /* watch_notify's (under l->mu): called whenever woken is set, for the
     * asynchronous API's waiter, which sleeps in no thread. */
    void (*notify)(void *);
    void *notify_arg;
} pg_watch;

struct dlock__pg_listener {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC */
    pthread_t thread;
    int started, stop;
    int efd; /* rings the thread: stop, or a new connection */
    PGconn *conn;
    pg_watch *watches;
};

static dlock__pg_listener *listener_get(dlock__pg_be *be)
{
    dlock__pg_listener *l;
    pthread_condattr_t ca;

    pthread_mutex_lock(&be->mu);
    if ((l = be->listener) == NULL && (l = calloc(1, sizeof(*l))) != NULL) {
        l->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (l->efd < 0) {
            free(l);
            l = NULL;
        } else {
            pthread_mutex_init(&l->mu, NULL);
            pthread_condattr_init(&ca);
            pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
            pthread_cond_init(&l->cv, &ca);
            pthread_condattr_destroy(&ca);
            be->listener = l;
        }
    }
    pthread_mutex_unlock(&be->mu);
    return l;
}

static void ring(dlock__pg_listener *l)
{
    uint64_t one = 1;
    ssize_t n = write(l->efd, &one, sizeof(one));
    (void)n;
}

/* Wake w (its sleeper is woken by the caller's broadcast), l->mu held. */
static void wake(pg_watch *w)
{
    w->woken = 1;
    if (w->notify != NULL)
        w->notify(w->notify_arg);
}

/* Every watch may have missed a release: wake them all. l->mu held. */
static void wake_all(dlock__pg_listener *l)
{
    for (pg_watch *w = l->watches; w != NULL; w = w->next)
        wake(w);
    pthread_cond_broadcast(&l->cv);
}

static void *listener_main(void *arg)
{
    dlock__pg_listener *l = arg;

    pthread_mutex_lock(&l->mu);
    while (!l->stop) {
        PGconn *c = l->conn;
        struct pollfd p[2];
        PGnotify *nt;
        int broke = 0;

        if (c == NULL) {
            pthread_cond_wait(&l->cv, &l->mu);
            continue;
        }
        pthread_mutex_unlock(&l->mu);
        p[0].fd = l->efd;
        p[0].events = POLLIN;
        p[1].fd = PQsocket(c);
        p[1].events = POLLIN;
        p[0].revents = p[1].revents = 0;
        if (poll(p, 2, -1) < 0 && errno != EINTR)
            broke = 1;
        if (p[0].revents) {
            uint64_t v;
            ssize_t n = read(l->efd, &v, sizeof(v));
            (void)n;
        }
        if (p[1].revents && !PQconsumeInput(c))
            broke = 1;
        pthread_mutex_lock(&l->mu);
        while ((nt = PQnotifies(c)) != NULL) {
            /* "HEX": every watch of the name; "HEX WAITER-ID": that
             * waiter's alone (a fair lock's head). */
            const char *sp = strchr(nt->extra, ' ');
            size_t n = sp != NULL ? (size_t)(sp - nt->extra) : strlen(nt->extra);
            for (pg_watch *w = l->watches; w != NULL; w = w->next)
                if (w->hex != NULL && strlen(w->hex) == n &&
                    memcmp(w->hex, nt->extra, n) == 0 &&
                    (sp == NULL || strcmp(w->id, sp + 1) == 0))
                    wake(w);
            PQfreemem(nt);
            pthread_cond_broadcast(&l->cv);
        }
        if (broke || PQstatus(c) == CONNECTION_BAD) {
            PQfinish(c);
            l->conn = NULL;
            wake_all(l);
        }
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* Make sure the listener is connected and LISTENing. Returns DLOCK_OK
 * (and *fresh 1 when it had to connect: a release may have been missed). */
static int listener_up(dlock__pg_be *be, dlock__pg_listener *l, int *fresh)
{
    char sql[DLOCK__PG_IDENT_MAX + 16];
    PGconn *c = NULL;
    PGresult *r;
    int rc;

    *fresh = 0;
    pthread_mutex_lock(&l->mu);
    if (l->conn != NULL) {
        pthread_mutex_unlock(&l->mu);
        return DLOCK_OK;
    }
    pthread_mutex_unlock(&l->mu);
    snprintf(sql, sizeof(sql), "LISTEN %s", be->table);
    if ((rc = dlock__pg_exec(be, &c, sql, 0, NULL, &r)) != DLOCK_OK)
        return rc;
    PQclear(r);
    *fresh = 1;
    pthread_mutex_lock(&l->mu);
    if (l->conn != NULL) {
        /* Another waiter was quicker: its LISTEN is as good. */
        pthread_mutex_unlock(&l->mu);
        PQfinish(c);
        return DLOCK_OK;
    }
    l->conn = c;
    if (!l->started) {
        if (pthread_create(&l->thread, NULL, listener_main, l) != 0) {
            l->conn = NULL;
            pthread_mutex_unlock(&l->mu);
            PQfinish(c);
            return dlock_backend_fail(DLOCK_ENOMEM, "%s: cannot start the listener thread",
                                      be->where);
        }
        l->started = 1;
    }
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    ring(l);
    return DLOCK_OK;
}

int dlock__pg_watch_begin(void *vbe, const dlock_request *req, void **watch)
{
    dlock__pg_be *be = vbe;
    dlock__pg_listener *l = listener_get(be);
    pg_watch *w;
    int rc, fresh;

    *watch = NULL;
    if (l == NULL || (w = calloc(1, sizeof(*w))) == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    if (req != NULL && ((w->hex = dlock__pg_key_hex(be, req->name)) == NULL ||
                        (w->name = strdup(req->name)) == NULL)) {
        free(w->hex);
        free(w);
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    }
    if (req != NULL) {
        /* Random, apart from the token: a place is named on the channel
         * (and in the table) where anyone allowed to LISTEN can read it. */
        unsigned char raw[16];
        if (RAND_bytes(raw, sizeof(raw)) != 1) {
            free(w->name);
            free(w->hex);
            free(w);
            return dlock_backend_fail(DLOCK_ENOMEM, "%s: no random bytes for a waiter id",
                                      be->where);
        }
        dlock__pg_hex(w->id, raw, sizeof(raw));
        w->kind = req->kind;
    }
    /* Registered before LISTEN is known to be active, so that a
     * notification that comes in between is not dropped. */
    pthread_mutex_lock(&l->mu);
    w->next = l->watches;
    l->watches = w;
    pthread_mutex_unlock(&l->mu);
    if ((rc = listener_up(be, l, &fresh)) != DLOCK_OK) {
        dlock__pg_watch_end(be, w);
        return rc;
    }
    *watch = w;
    return DLOCK_OK;
}

int dlock__pg_watch_wait(void *vbe, void *watch, int64_t timeout_ms)
{
    dlock__pg_be *be = vbe;
    dlock__pg_listener *l = be->listener;
    pg_watch *w = watch;
    struct timespec dl;
    int fresh = 0, broken;

    if (timeout_ms > DLOCK_LEASE_MAX_MS)
        timeout_ms = DLOCK_LEASE_MAX_MS;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&l->mu);
    while (!w->woken) {
        if (l->conn == NULL) {
            /* The registration broke: restore it, and try (a release may
             * have come in between). */
            pthread_mutex_unlock(&l->mu);
            listener_up(be, l, &fresh);
            return DLOCK_OK;
        }
        if (pthread_cond_timedwait(&l->cv, &l->mu, &dl) == ETIMEDOUT && !w->woken) {
            pthread_mutex_unlock(&l->mu);
            return DLOCK_ETIMEOUT;
        }
    }
    w->woken = 0;
    broken = l->conn == NULL;
    pthread_mutex_unlock(&l->mu);
    /* An asynchronous waiter sleeps in no thread, so nobody made its
     * registration again when it broke (the wake-up it is taking): before
     * its next try, here. */
    if (broken && w->notify != NULL)
        listener_up(be, l, &fresh);
    return DLOCK_OK;
}

void dlock__pg_watch_end(void *vbe, void *watch)
{
    dlock__pg_be *be = vbe;
    dlock__pg_listener *l = be->listener;
    pg_watch *w = watch, **pp;

    if (w == NULL)
        return;
    pthread_mutex_lock(&l->mu);
    for (pp = &l->watches; *pp != NULL; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    pthread_mutex_unlock(&l->mu);
    if (w->lost_token != NULL) {
        /* A try whose reply was lost may have taken the lock: give it back. */
        dlock_request req;
        memset(&req, 0, sizeof(req));
        req.kind = w->kind;
        req.name = w->name;
        req.token = w->lost_token;
        dlock__pg_release(be, &req);
        free(w->lost_token);
    }
    /* A waiter that gives up leaves its place (a taken lock has already
     * removed it; then this finds nothing). */
    if (w->queued && w->name != NULL)
        dlock__pg_fam_leave(be, w->name, w->id);
    free(w->name);
    free(w->hex);
    free(w);
}

void dlock__pg_watch_note(void *watch, const char *token)
{
    pg_watch *w = watch;

    if (w == NULL)
        return;
    free(w->lost_token);
    w->lost_token = token != NULL ? strdup(token) : NULL;
}

const char *dlock__pg_watch_id(void *watch)
{
    pg_watch *w = watch;
    return w != NULL ? w->id : NULL;
}

void dlock__pg_watch_queued(void *watch)
{
    pg_watch *w = watch;
    if (w != NULL)
        w->queued = 1;
}

void dlock__pg_watch_wake(void *vbe, void *watch)
{
    dlock__pg_be *be = vbe;
    dlock__pg_listener *l = be->listener;
    pg_watch *w = watch;

    if (l == NULL || w == NULL)
        return;
    pthread_mutex_lock(&l->mu);
    wake(w);
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

/* The asynchronous API's waiter: fn called each time the watch is woken,
 * by the listener's thread or the waker, under l->mu; watch_end takes it
 * off the list under l->mu, after which nobody calls it. */
void dlock__pg_watch_notify(void *vbe, void *watch, void (*fn)(void *), void *fn_arg)
{
    dlock__pg_listener *l = ((dlock__pg_be *)vbe)->listener;
    pg_watch *w = watch;

    pthread_mutex_lock(&l->mu);
    w->notify = fn;
    w->notify_arg = fn_arg;
    pthread_mutex_unlock(&l->mu);
}

void dlock__pg_listener_free(dlock__pg_be *be)
{
    dlock__pg_listener *l = be->listener;

    if (l == NULL)
        return;
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    ring(l);
    if (l->started)
        pthread_join(l->thread, NULL);
    PQfinish(l->conn);
    close(l->efd);
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    free(l);
    be->listener = NULL;
}
