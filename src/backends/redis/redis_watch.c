/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The subscriber thread. It alone does I/O on the subscriber connection: it
 * polls the socket and a wake-up pipe, sends SUBSCRIBE / UNSUBSCRIBE for the
 * channels the waiters ask for, and turns each "message" into a wake-up of
 * one waiter. Waiters only touch the shared tables under the mutex.
 *
 * A channel stays subscribed for LINGER_MS after its last waiter left.
 *
 * If the connection drops, every waiter is woken (a release may have been
 * missed while it was down) and the thread reconnects and subscribes again.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/redis/redis_watch.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/thread.h"

/* A channel nobody waits on stays subscribed this long, so that waiting
 * again on a busy lock costs no SUBSCRIBE round trip. */
#define LINGER_MS 10000

typedef struct channel {
    char *name;
    int refs;       /* waiters registered */
    int64_t idle_since; /* when refs dropped to 0 */
    int sent;       /* SUBSCRIBE sent on the current connection */
    int confirmed;  /* the server confirmed it */
    dlock__redis_waiter *first, *last; /* FIFO of waiters */
    struct channel *next;
} channel;

struct dlock__redis_waiter {
    channel *chan;
    char *id; /* NULL, or what a targeted message names (a random id) */
    dlock__redis_bell *bell; /* NULL, or rung too (redis_watch.h) */
    pthread_cond_t cond;
    int woken;
    dlock__redis_waiter *next, *prev;
};

struct dlock__redis_watcher {
    pthread_mutex_t mu;
    pthread_cond_t confirmed; /* a subscription was confirmed or failed */
    pthread_t thread;
    int running;
    int stopping;
    int pipe_fd[2];
    int64_t command_timeout_ms;
    dlock__redis_conn conn; /* the thread's alone */
    channel *channels;
    unsigned long failures; /* connection failures, to wake confirm-waiters */
};

/* ---- waiter queue --------------------------------------------------- */

static void wake_waiter(dlock__redis_waiter *x)
{
    x->woken = 1;
    pthread_cond_signal(&x->cond);
    if (x->bell != NULL) {
        pthread_mutex_lock(&x->bell->mu);
        x->bell->rung = 1;
        pthread_cond_broadcast(&x->bell->cond);
        pthread_mutex_unlock(&x->bell->mu);
    }
}

static void wake_one(channel *ch)
{
    for (dlock__redis_waiter *x = ch->first; x != NULL; x = x->next) {
        if (!x->woken) {
            wake_waiter(x);
            return;
        }
    }
}

/*
 * "grant ID FENCE": the release handed the lock to waiter ID. Only a wake-up:
 * the waiter's next try confirms the hand-off on the server (release.lua),
 * because this message may arrive after the handed-over key has expired.
 * When ID is none of ours, one of our waiters looks too: the hand-off is
 * confirmed or lapses within the confirm window, and if that waiter died,
 * ours should not sleep a quarter of its own lease before it finds the lock
 * free.
 */
static void grant(channel *ch, const char *text)
{
    const char *id = text + strlen("grant ");
    const char *space = strchr(id, ' ');

    if (space == NULL)
        return;
    for (dlock__redis_waiter *x = ch->first; x != NULL; x = x->next) {
        if (x->id != NULL && strlen(x->id) == (size_t)(space - id) &&
            memcmp(x->id, id, (size_t)(space - id)) == 0) {
            wake_waiter(x);
            return;
        }
    }
    wake_one(ch);
}

/* A message on ch: wake whom its text names (see redis_watch.h). */
static void wake_for(channel *ch, const char *text)
{
    if (strncmp(text, "grant ", 6) == 0) {
        grant(ch, text);
        return;
    }
    if (strcmp(text, "all") == 0) {
        for (dlock__redis_waiter *x = ch->first; x != NULL; x = x->next)
            wake_waiter(x);
        return;
    }
    for (dlock__redis_waiter *x = ch->first; x != NULL; x = x->next) {
        if (x->id != NULL && strcmp(x->id, text) == 0) {
            wake_waiter(x);
            return;
        }
    }
    /* Waiter ids are hex digits: a text that names none of ours is either
     * a waiter of another client, or a plain release. */
    if (strspn(text, "0123456789abcdef") != strlen(text) || text[0] == '\0')
        wake_one(ch);
}

static void wake_all(dlock__redis_watcher *w)
{
    for (channel *ch = w->channels; ch != NULL; ch = ch->next)
        for (dlock__redis_waiter *x = ch->first; x != NULL; x = x->next)
            wake_waiter(x);
}

static void poke(dlock__redis_watcher *w)
{
    ssize_t n;

    do
        n = write(w->pipe_fd[1], "x", 1);
    while (n < 0 && errno == EINTR);
    /* EAGAIN: the pipe is full, so the thread will wake anyway. */
}

/* ---- the thread ----------------------------------------------------- */

static void drop_connection(dlock__redis_watcher *w)
{
    dlock__redis_conn_close(&w->conn);
    pthread_mutex_lock(&w->mu);
    for (channel *ch = w->channels; ch != NULL; ch = ch->next)
        ch->sent = ch->confirmed = 0;
    w->failures++;
    wake_all(w);
    pthread_cond_broadcast(&w->confirmed);
    pthread_mutex_unlock(&w->mu);
}

/* Queue SUBSCRIBE/UNSUBSCRIBE for what changed and free channels idle for
 * LINGER_MS. Returns the poll timeout until the next channel's linger ends
 * (-1: none lingers). */
static int sync_subscriptions(dlock__redis_watcher *w)
{
    channel **pp = &w->channels;
    int64_t now = dlock__now_ms(), next = -1;

    pthread_mutex_lock(&w->mu);
    while (*pp != NULL) {
        channel *ch = *pp;
        if (ch->refs > 0 && !ch->sent) {
            dlock__redis_tp_append(&w->conn.tp, "SUBSCRIBE %s", ch->name);
            ch->sent = 1;
        } else if (ch->refs == 0 && (!ch->sent || now - ch->idle_since >= LINGER_MS)) {
            if (ch->sent)
                dlock__redis_tp_append(&w->conn.tp, "UNSUBSCRIBE %s", ch->name);
            *pp = ch->next;
            free(ch->name);
            free(ch);
            continue;
        } else {
            /* Channels in use may fall idle without telling us (that would
             * put a wake-up on the waiter's path): look again within a linger. */
            int64_t left = ch->refs == 0 ? ch->idle_since + LINGER_MS - now : LINGER_MS;
            if (next < 0 || left < next)
                next = left;
        }
        pp = &ch->next;
    }
    pthread_mutex_unlock(&w->mu);
    return next > INT32_MAX ? INT32_MAX : (int)next;
}

static void handle_reply(dlock__redis_watcher *w, redisReply *r)
{
    const char *kind;

    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING)
        return;
    kind = r->element[0]->str;
    pthread_mutex_lock(&w->mu);
    for (channel *ch = w->channels; ch != NULL; ch = ch->next) {
        if (strcmp(ch->name, r->element[1]->str) != 0)
            continue;
        if (strcmp(kind, "subscribe") == 0) {
            ch->confirmed = 1;
            pthread_cond_broadcast(&w->confirmed);
        } else if (strcmp(kind, "message") == 0) {
            wake_for(ch, r->element[2]->type == REDIS_REPLY_STRING ? r->element[2]->str : "");
        }
        break;
    }
    pthread_mutex_unlock(&w->mu);
}

/* Read what the socket has and handle every complete reply. */
static int read_replies(dlock__redis_watcher *w)
{
    redisReply *r;

    if (dlock__redis_tp_read(&w->conn.tp, -1) != REDIS_OK)
        return -1;
    for (;;) {
        r = NULL;
        if (dlock__redis_tp_get_reply(&w->conn.tp, (void **)&r) != REDIS_OK)
            return -1;
        if (r == NULL)
            /* What is left is one reply still arriving: a message too
             * long for any dlock channel drops the connection. */
            return dlock__redis_conn_over_cap(&w->conn) ? -1 : 0;
        handle_reply(w, r);
        freeReplyObject(r);
    }
}

static int flush_writes(dlock__redis_watcher *w)
{
    return dlock__redis_tp_flush(&w->conn.tp, dlock__now_ms() + w->conn.command_ms) == REDIS_OK
               ? 0
               : -1;
}

static void *watcher_main(void *arg)
{
    dlock__redis_watcher *w = arg;
    int64_t backoff = 50;

    for (;;) {
        struct pollfd fds[2];
        int stopping, timeout;

        pthread_mutex_lock(&w->mu);
        stopping = w->stopping;
        pthread_mutex_unlock(&w->mu);
        if (stopping)
            break;

        if (!dlock__redis_conn_is_open(&w->conn)) {
            if (dlock__redis_conn_connect(&w->conn) != DLOCK_OK) {
                drop_connection(w);
                /* Wait before the next try, but wake at once to stop. */
                fds[0].fd = w->pipe_fd[0];
                fds[0].events = POLLIN;
                poll(fds, 1, (int)backoff);
                backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
                goto drain;
            }
            backoff = 50;
        }
        timeout = sync_subscriptions(w);
        if (flush_writes(w) != 0) {
            drop_connection(w);
            continue;
        }
        fds[0].fd = w->conn.tp.fd;
        fds[0].events = POLLIN;
        fds[1].fd = w->pipe_fd[0];
        fds[1].events = POLLIN;
        fds[0].revents = fds[1].revents = 0;
        if (poll(fds, 2, timeout) < 0 && errno != EINTR)
            break;
        if ((fds[0].revents & (POLLIN | POLLERR | POLLHUP)) && read_replies(w) != 0) {
            drop_connection(w);
            continue;
        }
    drain:
        for (;;) {
            char buf[64];
            if (read(w->pipe_fd[0], buf, sizeof(buf)) <= 0)
                break;
        }
    }
    return NULL;
}

/* ---- the waiters' side ---------------------------------------------- */

int dlock__redis_watcher_new(dlock__redis_watcher **out, const dlock_url *url,
                             const dlock_client_options *opts)
{
    dlock__redis_watcher *w = calloc(1, sizeof(*w));
    int rc;

    *out = NULL;
    if (w == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    w->pipe_fd[0] = w->pipe_fd[1] = -1;
    if ((rc = dlock__redis_conn_init(&w->conn, url, opts, "sub")) != DLOCK_OK) {
        free(w);
        return rc;
    }
    w->command_timeout_ms = opts->command_timeout_ms;
    if (pthread_mutex_init(&w->mu, NULL) != 0) {
        free(w);
        return dlock__fail(DLOCK_ENOMEM, "cannot create a mutex");
    }
    if (dlock__cond_init(&w->confirmed) != 0 ||
        pipe2(w->pipe_fd, O_CLOEXEC | O_NONBLOCK) != 0) {
        dlock__redis_watcher_free(w);
        return dlock__fail(DLOCK_ENOMEM, "cannot create the subscriber's wake-up pipe");
    }
    *out = w;
    return DLOCK_OK;
}

void dlock__redis_watcher_free(dlock__redis_watcher *w)
{
    if (w == NULL)
        return;
    if (w->running) {
        pthread_mutex_lock(&w->mu);
        w->stopping = 1;
        pthread_mutex_unlock(&w->mu);
        poke(w);
        pthread_join(w->thread, NULL);
    }
    dlock__redis_conn_close(&w->conn);
    while (w->channels != NULL) {
        channel *ch = w->channels;
        w->channels = ch->next;
        free(ch->name);
        free(ch);
    }
    if (w->pipe_fd[0] >= 0)
        close(w->pipe_fd[0]);
    if (w->pipe_fd[1] >= 0)
        close(w->pipe_fd[1]);
    pthread_cond_destroy(&w->confirmed);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

static int begin(dlock__redis_watcher *w, const char *name, const char *id,
                 dlock__redis_bell *bell, dlock__redis_waiter **out)
{
    dlock__redis_waiter *x;
    channel *ch;
    struct timespec until;
    unsigned long failures;

    *out = NULL;
    x = calloc(1, sizeof(*x));
    if (x == NULL || (id != NULL && (x->id = strdup(id)) == NULL)) {
        free(x);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    if (dlock__cond_init(&x->cond) != 0) {
        free(x->id);
        free(x);
        return dlock__fail(DLOCK_ENOMEM, "cannot create a condition variable");
    }
    x->bell = bell;

    pthread_mutex_lock(&w->mu);
    for (ch = w->channels; ch != NULL; ch = ch->next)
        if (strcmp(ch->name, name) == 0)
            break;
    if (ch == NULL) {
        ch = calloc(1, sizeof(*ch));
        if (ch == NULL || (ch->name = strdup(name)) == NULL) {
            pthread_mutex_unlock(&w->mu);
            free(ch);
            pthread_cond_destroy(&x->cond);
            free(x->id);
            free(x);
            return dlock__fail(DLOCK_ENOMEM, "out of memory");
        }
        ch->next = w->channels;
        w->channels = ch;
    }
    ch->refs++;
    ch->idle_since = 0;
    x->chan = ch;
    x->prev = ch->last;
    if (ch->last != NULL)
        ch->last->next = x;
    else
        ch->first = x;
    ch->last = x;

    if (!w->running) {
        if (dlock__thread_create(&w->thread, watcher_main, w) == 0)
            w->running = 1;
    }
    /* Wait for the server's confirmation: only then is no release missed.
     * If the connection fails meanwhile, go on: each sleep is still bounded
     * by the holder's lease, and the thread wakes every waiter when it is
     * back. */
    failures = w->failures;
    until = dlock__deadline_ts(w->command_timeout_ms);
    if (!ch->sent)
        poke(w);
    while (!ch->confirmed && w->failures == failures && w->running)
        if (pthread_cond_timedwait(&w->confirmed, &w->mu, &until) != 0)
            break;
    pthread_mutex_unlock(&w->mu);
    *out = x;
    return DLOCK_OK;
}

int dlock__redis_watch_begin(dlock__redis_watcher *w, const char *name, const char *id,
                             dlock__redis_waiter **out)
{
    return begin(w, name, id, NULL, out);
}

int dlock__redis_watch_begin_bell(dlock__redis_watcher *w, const char *name,
                                  dlock__redis_bell *bell, dlock__redis_waiter **out)
{
    return begin(w, name, NULL, bell, out);
}

void dlock__redis_watch_consume(dlock__redis_watcher *w, dlock__redis_waiter *x)
{
    pthread_mutex_lock(&w->mu);
    x->woken = 0;
    pthread_mutex_unlock(&w->mu);
}

int dlock__redis_watch_wait(dlock__redis_watcher *w, dlock__redis_waiter *x, int64_t timeout_ms)
{
    struct timespec until = dlock__deadline_ts(timeout_ms);
    int rc = DLOCK_OK;

    pthread_mutex_lock(&w->mu);
    while (!x->woken) {
        if (pthread_cond_timedwait(&x->cond, &w->mu, &until) != 0) {
            rc = DLOCK_ETIMEOUT;
            break;
        }
    }
    x->woken = 0;
    pthread_mutex_unlock(&w->mu);
    return rc;
}

void dlock__redis_watch_end(dlock__redis_watcher *w, dlock__redis_waiter *x)
{
    channel *ch;
    int pass_on;

    if (x == NULL)
        return;
    pthread_mutex_lock(&w->mu);
    ch = x->chan;
    /* A wake-up we did not use belongs to the next waiter. */
    pass_on = x->woken;
    if (x->prev != NULL)
        x->prev->next = x->next;
    else
        ch->first = x->next;
    if (x->next != NULL)
        x->next->prev = x->prev;
    else
        ch->last = x->prev;
    if (pass_on)
        wake_one(ch);
    if (--ch->refs == 0)
        ch->idle_since = dlock__now_ms(); /* the thread unsubscribes after LINGER_MS */
    pthread_mutex_unlock(&w->mu);
    pthread_cond_destroy(&x->cond);
    free(x->id);
    free(x);
}

const char *dlock__redis_watch_id(const dlock__redis_waiter *x)
{
    return x->id != NULL ? x->id : "";
}

void dlock__redis_watch_wake(dlock__redis_watcher *w, dlock__redis_waiter *x)
{
    pthread_mutex_lock(&w->mu);
    wake_waiter(x);
    pthread_mutex_unlock(&w->mu);
}
