/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The subscriber thread. It alone does I/O on the subscriber connection: it
 * polls the socket and a wake-up pipe, sends SUBSCRIBE / UNSUBSCRIBE for the
 * channels the waiters ask for, and turns each "message" into a wake-up of
 * one waiter. Waiters only touch the shared tables under the mutex.
 *
 * A channel stays subscribed for LINGER_MS after its last waiter left.
 *
 * Channels are found by name in a hash table, and the thread looks only at
 * those with something to do (a SUBSCRIBE to send, a linger that ended):
 * 10,000 waiters of one client on as many locks cost no walk of them all
 * per message or per new waiter (issue 33).
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
#include "core/hash.h"
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
    int queued;     /* on the watcher's todo list */
    int idle;       /* on the watcher's idle list */
    dlock__redis_waiter *first, *last; /* FIFO of waiters */
    struct channel *hnext;             /* the hash chain */
    struct channel *todo_next;         /* SUBSCRIBE to send, or free */
    struct channel *idle_next, *idle_prev; /* by idle_since, oldest first */
} channel;

struct dlock__redis_waiter {
    channel *chan;
    char *id; /* NULL, or what a targeted message names (a random id) */
    dlock__redis_bell *bell; /* NULL, or rung too (redis_watch.h) */
    void (*notify)(void *); /* NULL, or told of each wake-up too */
    void *notify_arg;
    pthread_cond_t cond;
    int woken;
    dlock__redis_waiter *next, *prev;
};

struct dlock__redis_watcher {
    pthread_mutex_t mu;
    pthread_t thread;
    int running;
    int stopping;
    int pipe_fd[2];
    int64_t command_timeout_ms;
    dlock__redis_conn conn; /* the thread's alone */
    channel **table;        /* by name; table_size a power of two */
    size_t table_size, nchannels;
    channel *todo;          /* new, or to subscribe again */
    channel *idle_first, *idle_last;
    unsigned long failures; /* connection failures, to wake confirm-waiters */
    int64_t (*upkeep)(void *); /* NULL, or called each turn of the thread */
    void *upkeep_arg;
};

/* ---- channels (w->mu held) ------------------------------------------ */

static channel **chain_of(dlock__redis_watcher *w, const char *name)
{
    return &w->table[dlock__hash_str(name) & (w->table_size - 1)];
}

static channel *find_channel(dlock__redis_watcher *w, const char *name)
{
    channel *ch;

    if (w->table == NULL)
        return NULL;
    for (ch = *chain_of(w, name); ch != NULL; ch = ch->hnext)
        if (strcmp(ch->name, name) == 0)
            break;
    return ch;
}

/* Room for one more channel: the table doubles when it is full. */
static int table_reserve(dlock__redis_watcher *w)
{
    size_t size = w->table_size != 0 ? w->table_size * 2 : 64;
    channel **old = w->table, **t;
    size_t old_size = w->table_size;

    if (w->nchannels < w->table_size)
        return 0;
    if ((t = calloc(size, sizeof(*t))) == NULL)
        return -1;
    w->table = t;
    w->table_size = size;
    for (size_t i = 0; i < old_size; i++) {
        while (old[i] != NULL) {
            channel *ch = old[i], **chain;
            old[i] = ch->hnext;
            chain = chain_of(w, ch->name);
            ch->hnext = *chain;
            *chain = ch;
        }
    }
    free(old);
    return 0;
}

static void idle_push(dlock__redis_watcher *w, channel *ch)
{
    ch->idle = 1;
    ch->idle_next = NULL;
    ch->idle_prev = w->idle_last;
    if (w->idle_last != NULL)
        w->idle_last->idle_next = ch;
    else
        w->idle_first = ch;
    w->idle_last = ch;
}

static void idle_remove(dlock__redis_watcher *w, channel *ch)
{
    if (!ch->idle)
        return;
    if (ch->idle_prev != NULL)
        ch->idle_prev->idle_next = ch->idle_next;
    else
        w->idle_first = ch->idle_next;
    if (ch->idle_next != NULL)
        ch->idle_next->idle_prev = ch->idle_prev;
    else
        w->idle_last = ch->idle_prev;
    ch->idle = 0;
}

static void todo_push(dlock__redis_watcher *w, channel *ch)
{
    if (ch->queued)
        return;
    ch->queued = 1;
    ch->todo_next = w->todo;
    w->todo = ch;
}

/* Forget ch (no waiter, not on the todo list). */
static void destroy_channel(dlock__redis_watcher *w, channel *ch)
{
    channel **pp = chain_of(w, ch->name);

    while (*pp != ch)
        pp = &(*pp)->hnext;
    *pp = ch->hnext;
    idle_remove(w, ch);
    w->nchannels--;
    free(ch->name);
    free(ch);
}

/* ---- waiter queue --------------------------------------------------- */

void dlock__redis_bell_ring(dlock__redis_bell *bell)
{
    pthread_mutex_lock(&bell->mu);
    bell->rung = 1;
    pthread_cond_broadcast(&bell->cond);
    if (bell->notify != NULL)
        bell->notify(bell->notify_arg);
    pthread_mutex_unlock(&bell->mu);
}

static void wake_waiter(dlock__redis_waiter *x)
{
    x->woken = 1;
    pthread_cond_signal(&x->cond);
    if (x->notify != NULL)
        x->notify(x->notify_arg);
    if (x->bell != NULL)
        dlock__redis_bell_ring(x->bell);
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
    for (size_t i = 0; i < w->table_size; i++)
        for (channel *ch = w->table[i]; ch != NULL; ch = ch->hnext)
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
    /* The next connection subscribes again to what has waiters; an idle
     * channel, subscribed on no connection now, is let go. */
    for (size_t i = 0; i < w->table_size; i++) {
        channel *ch = w->table[i];
        while (ch != NULL) {
            channel *next = ch->hnext;
            ch->sent = ch->confirmed = 0;
            if (ch->refs > 0)
                todo_push(w, ch);
            else if (!ch->queued)
                destroy_channel(w, ch);
            ch = next;
        }
    }
    w->failures++;
    wake_all(w);
    pthread_mutex_unlock(&w->mu);
}

/* Send SUBSCRIBE for new channels, UNSUBSCRIBE for those idle for
 * LINGER_MS, and free these. Returns the poll timeout until the next
 * channel's linger ends (-1: no channel at all). */
static int sync_subscriptions(dlock__redis_watcher *w)
{
    int64_t now = dlock__now_ms(), next = -1;

    pthread_mutex_lock(&w->mu);
    while (w->todo != NULL) {
        channel *ch = w->todo;
        w->todo = ch->todo_next;
        ch->queued = 0;
        if (ch->refs > 0 && !ch->sent) {
            dlock__redis_tp_append(&w->conn.tp, "SUBSCRIBE %s", ch->name);
            ch->sent = 1;
        } else if (ch->refs == 0 && !ch->sent) {
            destroy_channel(w, ch); /* its waiter left before it was sent */
        }
    }
    while (w->idle_first != NULL && now - w->idle_first->idle_since >= LINGER_MS) {
        channel *ch = w->idle_first;
        if (ch->sent)
            dlock__redis_tp_append(&w->conn.tp, "UNSUBSCRIBE %s", ch->name);
        destroy_channel(w, ch);
    }
    if (w->idle_first != NULL)
        next = w->idle_first->idle_since + LINGER_MS - now;
    else if (w->nchannels > 0)
        /* Channels in use may fall idle without telling us (that would put
         * a wake-up on the waiter's path): look again within a linger. */
        next = LINGER_MS;
    pthread_mutex_unlock(&w->mu);
    return next > INT32_MAX ? INT32_MAX : (int)next;
}

static void handle_reply(dlock__redis_watcher *w, redisReply *r)
{
    const char *kind;
    channel *ch;

    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING)
        return;
    kind = r->element[0]->str;
    pthread_mutex_lock(&w->mu);
    if ((ch = find_channel(w, r->element[1]->str)) != NULL) {
        if (strcmp(kind, "subscribe") == 0) {
            /* Only this channel's waiters wait for it (each on its own
             * condition: 10,000 new waiters are not 10,000 wake-ups each). */
            ch->confirmed = 1;
            for (dlock__redis_waiter *x = ch->first; x != NULL; x = x->next)
                pthread_cond_signal(&x->cond);
        } else if (strcmp(kind, "message") == 0) {
            wake_for(ch, r->element[2]->type == REDIS_REPLY_STRING ? r->element[2]->str : "");
        }
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
        if (w->upkeep != NULL) {
            int64_t next = w->upkeep(w->upkeep_arg);
            if (next >= 0 && (timeout < 0 || next < timeout))
                timeout = next > INT32_MAX ? INT32_MAX : (int)next;
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
    if (pipe2(w->pipe_fd, O_CLOEXEC | O_NONBLOCK) != 0) {
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
    for (size_t i = 0; i < w->table_size; i++) {
        while (w->table[i] != NULL) {
            channel *ch = w->table[i];
            w->table[i] = ch->hnext;
            free(ch->name);
            free(ch);
        }
    }
    free(w->table);
    if (w->pipe_fd[0] >= 0)
        close(w->pipe_fd[0]);
    if (w->pipe_fd[1] >= 0)
        close(w->pipe_fd[1]);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

void dlock__redis_watcher_set_upkeep(dlock__redis_watcher *w, int64_t (*upkeep)(void *),
                                     void *arg)
{
    w->upkeep = upkeep;
    w->upkeep_arg = arg;
}

void dlock__redis_watcher_poke(dlock__redis_watcher *w)
{
    poke(w);
}

int dlock__redis_watcher_running(dlock__redis_watcher *w)
{
    int running;

    pthread_mutex_lock(&w->mu);
    running = w->running;
    pthread_mutex_unlock(&w->mu);
    return running;
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
    if ((ch = find_channel(w, name)) == NULL) {
        ch = calloc(1, sizeof(*ch));
        if (ch == NULL || (ch->name = strdup(name)) == NULL || table_reserve(w) != 0) {
            pthread_mutex_unlock(&w->mu);
            if (ch != NULL)
                free(ch->name);
            free(ch);
            pthread_cond_destroy(&x->cond);
            free(x->id);
            free(x);
            return dlock__fail(DLOCK_ENOMEM, "out of memory");
        }
        {
            channel **chain = chain_of(w, name);
            ch->hnext = *chain;
            *chain = ch;
        }
        w->nchannels++;
        todo_push(w, ch);
    }
    ch->refs++;
    ch->idle_since = 0;
    idle_remove(w, ch);
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
        if (pthread_cond_timedwait(&x->cond, &w->mu, &until) != 0)
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

int dlock__redis_watch_shared(dlock__redis_watcher *w, dlock__redis_waiter *x)
{
    int shared;

    pthread_mutex_lock(&w->mu);
    shared = x->chan->refs > 1;
    pthread_mutex_unlock(&w->mu);
    return shared;
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
    if (--ch->refs == 0) {
        if (!ch->sent && !ch->queued) {
            destroy_channel(w, ch); /* subscribed on no connection */
        } else {
            ch->idle_since = dlock__now_ms(); /* the thread unsubscribes after LINGER_MS */
            idle_push(w, ch);
        }
    }
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

void dlock__redis_watch_notify(dlock__redis_watcher *w, dlock__redis_waiter *x,
                               void (*fn)(void *), void *arg)
{
    pthread_mutex_lock(&w->mu);
    x->notify = fn;
    x->notify_arg = arg;
    if (fn != NULL && x->woken)
        fn(arg); /* a wake-up that came before is told too */
    pthread_mutex_unlock(&w->mu);
}
