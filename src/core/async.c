/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The asynchronous API's engine (include/dlock/async.h).
 *
 * A request is a record that moves between lists under the engine's mutex:
 *
 *   jobs      ready for a worker: its next step is a call to the server
 *   sleepers  an acquisition waiting for a release: woken by the backend's
 *             watch_notify (a release announced) or by its time (the
 *             holder's lease, the wait's end), kept in a heap by time
 *   done      finished, its callback due on the loop's thread
 *
 * and, while a worker runs its step, in none. Workers (at most MAX_WORKERS,
 * started as jobs need them) take jobs and run the blocking calls of the
 * core (the same try, watch and release as dlock_acquire's loop, wait.c);
 * an idle worker also sleeps until the first sleeper is due. So a waiting
 * acquisition holds no thread: it is a record in the heap and a watch in
 * the backend. Where the backend has no watch_notify, a waiting acquisition
 * runs on a thread of its own instead, blocked in watch_wait as a blocking
 * caller would be.
 *
 * The loop learns that done has something through an eventfd
 * (dlock_async_fd), written when done turns non-empty and drained by
 * dlock_async_process, which runs the callbacks on its thread. The on_lost
 * of a lock acquired here goes the same way: the watchdog calls the lock's
 * relay, which queues it for the loop.
 *
 * Locking: the engine's mutex (e->mu) is never held across a call to the
 * backend or a callback, and never taken before the client's (c->mu): the
 * backend calls watch_notify's function with its own mutex held, and that
 * function takes e->mu.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core/client.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/thread.h"
#include "core/wait.h"
#include "dlock/async.h"

#define MAX_WORKERS 4

/* OP_RELEASE_REST: a release begun on the loop's thread (taken from the
 * watchdog), its call to the server made by a worker. */
enum { OP_ACQUIRE, OP_RELEASE, OP_EXTEND, OP_RELEASE_REST };
enum { ST_JOB, ST_RUNNING, ST_SLEEPING, ST_DONE };

struct dlock_request_handle {
    dlock_client *c;
    int op, state;
    int canceled;  /* dlock_request_cancel or the client's free */
    int notified;  /* a release was announced while it ran */
    int own_thread; /* waits on a thread of its own (no watch_notify) */
    dlock_request_handle *next, *prev; /* in jobs or done */
    dlock_request_handle *live_next, *live_prev; /* an acquisition, until delivered */
    /* A fair acquisition, from its start until its first try queued it (or
     * it ended): on the engine's entry list, in the order they started; the
     * later ones of its name wait in its blocked queue meanwhile. */
    dlock_request_handle *entry_next, *entry_prev;
    int in_entry;
    dlock_request_handle *blocked_first, *blocked_last;
    size_t slot;    /* its index in the sleepers' heap */
    int64_t wake_at; /* sleeping: try again then (lease clock ms) */

    /* An acquisition: the handle it fills, the request, the wait. */
    dlock_lock *lock;
    dlock_request req;
    int64_t wait_ms, deadline, start_us;
    int started, waited, listed;
    int taken; /* the lock is held: given back if canceled before delivery */
    void *watch;
    dlock__waiter waiter;
    dlock_acquire_result res;
    dlock_acquire_cb acquired;

    /* A release or an extension (without threads, sent as a renewal of one:
     * item). */
    int64_t lease_ms;
    dlock_renewal item;
    dlock_done_cb finished;
    void *arg;

    /* Sent by the backend's start on the loop's thread (no worker): its
     * answer, its trace span, and for a release when it was called. */
    int fast, fast_rc, maybe_taken;
    dlock__call call;
    int64_t called;

    int rc;
    char *msg; /* the failure's message, for the loop's thread */
};

/* What carries a lock's on_lost to the loop (the lock's own on_lost and
 * payload point here). */
typedef struct dlock__relay {
    struct dlock__async *engine; /* NULL once the client was freed */
    dlock_lock *lock;
    dlock_lost_cb on_lost;
    void *payload;
    int reason;
    int queued, dead, announced;
    int held; /* lost before its acquisition's callback ran */
    struct dlock__relay *next;
} relay;

typedef struct {
    dlock_request_handle *first, *last;
} queue;

struct dlock__async {
    pthread_mutex_t mu;
    pthread_cond_t work;  /* a job, or a sleeper due sooner */
    pthread_cond_t quiet; /* a step ended, or a relay was delivered */
    int efd, signaled;
    pthread_t workers[MAX_WORKERS];
    int nworkers, idle;
    queue jobs, done;
    queue fast;       /* sent on the loop's thread, answered: to finish there */
    int fast_inflight; /* sent on the loop's thread, not answered yet */
    int epfd;         /* what the loop watches: efd and the backend's descriptors */
    struct {
        int fd;
        unsigned gen;
    } watched[4];
    int nwatched;
    int64_t due_ms; /* the backend's async_step must run by then (-1: no need) */
    int sent_in_process; /* a callback sent a request: step once more after them */
    /* Without threads: the watchdog's next step (-1: when told), and
     * whether it must be planned again (dlock__async_wake). */
    int64_t wd_next_ms;
    int wd_dirty;
    dlock_request_handle *live; /* the acquisitions not yet delivered */
    dlock_request_handle *entry_first, *entry_last;
    pthread_cond_t entered; /* a fair acquisition left the entry list */
    dlock_request_handle **heap; /* sleepers, by wake_at */
    size_t nheap, heap_cap;
    relay *lost_first, *lost_last;
    int running;     /* steps on workers and requests on threads of their own */
    int stopping;    /* workers: leave once nothing is left */
    int closing;     /* the client is being freed: no new request */
    int in_process;  /* dlock_async_process runs callbacks */
    int collecting;  /* ... and its deliver_all has not taken done yet */
    int free_pending; /* dlock_client_free was called from one of them */
    pthread_t process_thread;
    relay *delivering;
    dlock_async_detach_cb detach;
    void *detach_arg;
};

typedef struct dlock__async engine;

/* ---- lists, under e->mu ---------------------------------------------------- */

static void push(queue *q, dlock_request_handle *h)
{
    h->next = NULL;
    h->prev = q->last;
    if (q->last != NULL)
        q->last->next = h;
    else
        q->first = h;
    q->last = h;
}

static void unlink_from(queue *q, dlock_request_handle *h)
{
    if (h->prev != NULL)
        h->prev->next = h->next;
    else
        q->first = h->next;
    if (h->next != NULL)
        h->next->prev = h->prev;
    else
        q->last = h->prev;
    h->next = h->prev = NULL;
}

static void heap_set(engine *e, size_t i, dlock_request_handle *h)
{
    e->heap[i] = h;
    h->slot = i;
}

static void heap_up(engine *e, size_t i)
{
    dlock_request_handle *h = e->heap[i];

    while (i > 0 && e->heap[(i - 1) / 2]->wake_at > h->wake_at) {
        heap_set(e, i, e->heap[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    heap_set(e, i, h);
}

static void heap_down(engine *e, size_t i)
{
    dlock_request_handle *h = e->heap[i];

    for (;;) {
        size_t l = 2 * i + 1, m = i;
        int64_t at = h->wake_at;
        if (l < e->nheap && e->heap[l]->wake_at < at)
            m = l, at = e->heap[l]->wake_at;
        if (l + 1 < e->nheap && e->heap[l + 1]->wake_at < at)
            m = l + 1;
        if (m == i)
            break;
        heap_set(e, i, e->heap[m]);
        i = m;
    }
    heap_set(e, i, h);
}

static int heap_push(engine *e, dlock_request_handle *h)
{
    if (e->nheap == e->heap_cap) {
        size_t cap = e->heap_cap != 0 ? e->heap_cap * 2 : 64;
        dlock_request_handle **grown = realloc(e->heap, cap * sizeof(*grown));
        if (grown == NULL)
            return -1;
        e->heap = grown;
        e->heap_cap = cap;
    }
    heap_set(e, e->nheap++, h);
    heap_up(e, e->nheap - 1);
    return 0;
}

static void heap_remove(engine *e, dlock_request_handle *h)
{
    size_t i = h->slot;

    if (--e->nheap != i) {
        heap_set(e, i, e->heap[e->nheap]);
        heap_up(e, i);
        heap_down(e, e->heap[i]->slot);
    }
}

/* The loop is told there is something to process. */
static void signal_loop(engine *e)
{
    uint64_t one = 1;

    if (e->signaled)
        return;
    e->signaled = 1;
    while (write(e->efd, &one, sizeof(one)) < 0 && errno == EINTR)
        ;
}

static void entry_leave(engine *e, dlock_request_handle *h);

static void finished(engine *e, dlock_request_handle *h)
{
    entry_leave(e, h);
    h->state = ST_DONE;
    push(&e->done, h);
    /* Finished by the loop's own dlock_async_process before it takes
     * done (a reply its fast_pump read): delivered by that same call, so
     * the loop need not be woken again (an eventfd write and read). */
    if (e->collecting && pthread_equal(e->process_thread, pthread_self()))
        return;
    signal_loop(e);
}

static void *worker_main(void *arg);

/* A job for the workers, starting one if none is idle. */
static void add_job(engine *e, dlock_request_handle *h)
{
    h->state = ST_JOB;
    push(&e->jobs, h);
    if (e->idle > 0) {
        pthread_cond_signal(&e->work);
    } else if (e->nworkers < MAX_WORKERS &&
               dlock__thread_create(&e->workers[e->nworkers], worker_main, e) == 0) {
        e->nworkers++;
    } else {
        /* The busy workers take it when their steps end. */
        pthread_cond_signal(&e->work);
    }
}

/*
 * Fair order. A client's fair acquisitions of one name must reach the
 * server's queue in the order they were made, but the workers run up to 4
 * first tries at once. So a fair acquisition is on the entry list from its
 * start until its first try has queued it (or it ended), and it may begin
 * only when none of its name is ahead of it there: a worker that picks one
 * that may not sets it aside in the blocked queue of the one ahead, which
 * puts them back first in line when it leaves.
 */
static int is_fair_wait(const dlock_request_handle *h)
{
    return h->op == OP_ACQUIRE && h->req.kind == DLOCK_KIND_FAIR && h->wait_ms != 0;
}

static void entry_add(engine *e, dlock_request_handle *h)
{
    h->in_entry = 1;
    h->entry_prev = e->entry_last;
    if (e->entry_last != NULL)
        e->entry_last->entry_next = h;
    else
        e->entry_first = h;
    e->entry_last = h;
}

/* The first fair acquisition of h's name ahead of h on the entry list. */
static dlock_request_handle *entry_ahead(engine *e, const dlock_request_handle *h)
{
    for (dlock_request_handle *x = e->entry_first; x != NULL && x != h; x = x->entry_next)
        if (strcmp(x->req.name, h->req.name) == 0)
            return x;
    return NULL;
}

/* h's first try queued it, or it ended: the next of its name may go. */
static void entry_leave(engine *e, dlock_request_handle *h)
{
    if (!h->in_entry)
        return;
    h->in_entry = 0;
    if (h->entry_prev != NULL)
        h->entry_prev->entry_next = h->entry_next;
    else
        e->entry_first = h->entry_next;
    if (h->entry_next != NULL)
        h->entry_next->entry_prev = h->entry_prev;
    else
        e->entry_last = h->entry_prev;
    if (h->blocked_first != NULL) {
        /* First in line again, in their order. */
        h->blocked_last->next = e->jobs.first;
        if (e->jobs.first != NULL)
            e->jobs.first->prev = h->blocked_last;
        else
            e->jobs.last = h->blocked_last;
        e->jobs.first = h->blocked_first;
        h->blocked_first = h->blocked_last = NULL;
        pthread_cond_broadcast(&e->work);
    }
    pthread_cond_broadcast(&e->entered);
}

static void entry_leave_locking(engine *e, dlock_request_handle *h)
{
    pthread_mutex_lock(&e->mu);
    entry_leave(e, h);
    pthread_mutex_unlock(&e->mu);
}

/* Off the list of acquisitions not yet delivered. */
static void live_unlink(engine *e, dlock_request_handle *h)
{
    if (h->live_prev != NULL)
        h->live_prev->live_next = h->live_next;
    else if (e->live == h)
        e->live = h->live_next;
    if (h->live_next != NULL)
        h->live_next->live_prev = h->live_prev;
    h->live_next = h->live_prev = NULL;
}

/* ---- the steps, on a worker (or a request's own thread) --------------------- */

static void keep_message(dlock_request_handle *h, int rc)
{
    free(h->msg);
    h->msg = rc != DLOCK_OK ? strdup(dlock_error_message()) : NULL;
}

static void notified(void *arg)
{
    dlock_request_handle *h = arg;
    engine *e = h->c->async;

    pthread_mutex_lock(&e->mu);
    if (h->state == ST_SLEEPING) {
        heap_remove(e, h);
        add_job(e, h);
    } else {
        h->notified = 1;
    }
    pthread_mutex_unlock(&e->mu);
}

/* Watch the lock (as wait.c's watch_again), told of releases by notified()
 * where the backend can. */
static int watch(dlock_request_handle *h)
{
    dlock_client *c = h->c;
    int rc;

    if ((rc = dlock__interrupt_ready(c)) != DLOCK_OK)
        return rc;
    if ((rc = c->backend->watch_begin(c->be, &h->req, &h->watch)) != DLOCK_OK)
        return rc;
    if (!h->own_thread)
        c->backend->watch_notify(c->be, h->watch, notified, h);
    dlock__waiting_add(c, &h->waiter, h->watch);
    h->listed = 1;
    return DLOCK_OK;
}

/* The try, as wait.c's single lock makes it. */
static int try_once(dlock_request_handle *h)
{
    dlock_client *c = h->c;
    dlock__call k;

    h->res.lease_from_ms = dlock__now_ms();
    h->res.retry_ms = -1;
    h->res.handed = 0;
    dlock__call_begin(c, &k, "acquire", h->req.name, 1, DLOCK__CALL_TIMED);
    return dlock__call_end(c, &k, c->backend->acquire(c->be, &h->req, h->watch, &h->res));
}

static int canceled_fail(dlock_request_handle *h)
{
    engine *e = h->c->async;
    char shown[80];
    int closing;

    pthread_mutex_lock(&e->mu);
    closing = e->closing;
    pthread_mutex_unlock(&e->mu);
    return dlock__fail(DLOCK_ECANCELED, "the acquisition of lock '%s' was canceled (%s)",
                       dlock__printable(shown, sizeof(shown), h->req.name),
                       closing ? "dlock_client_free" : "dlock_request_cancel");
}

/*
 * The acquisition's steps from where it stands: tries, watches, and on a
 * thread of its own the sleeps too, until it ends (1) or sleeps in the heap
 * (0). As dlock__acquire_loop, whose rules (the lease counted from the
 * winning try's send, what a failed try-once gives back) hold the same.
 */
static int acquire_steps(dlock_request_handle *h)
{
    dlock_client *c = h->c;
    const dlock_backend *b = c->backend;
    engine *e = c->async;
    int rc;

    if (!h->started) {
        h->started = 1;
        h->start_us = dlock__now_us();
        h->deadline = h->wait_ms == DLOCK_WAIT_FOREVER ? INT64_MAX
                                                        : (h->start_us + 999) / 1000 + h->wait_ms;
        if (h->wait_ms != 0 && (b->caps & DLOCK_CAP_QUEUE_FIRST) && (rc = watch(h)) != DLOCK_OK)
            return h->rc = rc, 1;
    }
    for (;;) {
        int64_t now;
        int cancel;

        pthread_mutex_lock(&e->mu);
        cancel = h->canceled;
        h->notified = 0;
        pthread_mutex_unlock(&e->mu);
        if (cancel) {
            if (h->maybe_taken) /* its answer was lost on the way */
                dlock__give_back(c, &h->req, 1);
            return h->rc = canceled_fail(h), 1;
        }
        if (h->watch != NULL) {
            if ((rc = dlock__check_interrupt(c, h->req.name)) != DLOCK_OK)
                return h->rc = rc, 1;
            if (!h->own_thread)
                b->watch_wait(c->be, h->watch, 0); /* the wake-up that brought us here */
        }
        rc = try_once(h);
        if (h->watch == NULL && dlock__outcome_unknown(rc))
            dlock__give_back(c, &h->req, 1);
        if (rc != DLOCK_EBUSY)
            return h->rc = rc, 1;
        dlock__count(c, busy);
        now = dlock__now_ms();
        if (h->wait_ms == 0 || now >= h->deadline)
            return h->rc = dlock__busy_fail(h->req.name, h->wait_ms, &h->res), 1;
        if (!h->waited) {
            h->waited = 1;
            dlock__count(c, waits);
        }
        if (h->watch == NULL) {
            if ((rc = watch(h)) != DLOCK_OK)
                return h->rc = rc, 1;
            continue; /* a release before the watch began is not missed */
        }
        if (h->own_thread) {
            entry_leave_locking(e, h); /* queued now */
            rc = b->watch_wait(c->be, h->watch, dlock__busy_sleep_ms(h->deadline, now, &h->res));
            if (rc != DLOCK_OK && rc != DLOCK_ETIMEOUT)
                return h->rc = rc, 1;
            continue;
        }
        pthread_mutex_lock(&e->mu);
        if (h->notified || h->canceled) {
            pthread_mutex_unlock(&e->mu);
            continue;
        }
        h->wake_at = now + dlock__busy_sleep_ms(h->deadline, now, &h->res);
        if (heap_push(e, h) != 0) {
            pthread_mutex_unlock(&e->mu);
            return h->rc = dlock__fail(DLOCK_ENOMEM, "out of memory"), 1;
        }
        h->state = ST_SLEEPING;
        entry_leave(e, h); /* queued now */
        pthread_cond_signal(&e->work); /* an idle worker times the heap's first */
        pthread_mutex_unlock(&e->mu);
        return 0;
    }
}

/* The acquisition ended with h->rc: leave the queue, and on success start
 * the lock's lease and put it under the watchdog, as dlock__acquire does. */
static void acquire_end(dlock_request_handle *h)
{
    dlock_client *c = h->c;
    dlock_lock *l = h->lock;
    int rc = h->rc;
    char msg[512];

    snprintf(msg, sizeof(msg), "%s", dlock_error_message());
    if (h->watch != NULL) {
        if (h->listed)
            dlock__waiting_remove(c, &h->waiter);
        c->backend->watch_end(c->be, h->watch);
        h->watch = NULL;
        h->listed = 0;
    }
    if (h->waited)
        dlock__histogram_add(c->stats.wait_us, &c->stats.wait_us_sum,
                             dlock__now_us() - h->start_us);
    if (rc == DLOCK_OK) {
        dlock__count(c, acquires);
        if (h->res.handed)
            dlock__count(c, handoffs);
        l->fence = h->res.fence;
        dlock__lock_start(l, h->res.lease_from_ms);
        if ((rc = dlock__client_register(c, l)) != DLOCK_OK) {
            snprintf(msg, sizeof(msg), "%s", dlock_error_message());
            dlock__give_back(c, &h->req, 1);
        } else {
            h->taken = 1;
        }
    }
    if (rc != DLOCK_OK)
        dlock__fail(rc, "%s", msg);
    h->rc = rc;
    keep_message(h, rc);
}

/* The lock taken for an acquisition that was canceled since: released. */
static void undo(dlock_request_handle *h)
{
    dlock_lock *l = h->lock;

    h->rc = canceled_fail(h);
    keep_message(h, h->rc); /* before the release frees the name */
    h->lock = NULL;
    h->taken = 0;
    h->req.name = NULL;
    dlock__async_forget(l);
    dlock_release(l);
}

/* acquire_end, and undo when the acquisition was canceled meanwhile. */
static void acquire_end_canceled(dlock_request_handle *h)
{
    engine *e = h->c->async;
    int cancel;

    acquire_end(h);
    if (!h->taken)
        return;
    pthread_mutex_lock(&e->mu);
    cancel = h->canceled;
    pthread_mutex_unlock(&e->mu);
    if (cancel)
        undo(h);
}

/* One job: run h's step, then file it (done, or back in the heap). */
static void run(engine *e, dlock_request_handle *h)
{
    int ended = 1;

    switch (h->op) {
    case OP_ACQUIRE:
        if (h->taken) {
            undo(h); /* taken, then canceled before its callback ran */
            break;
        }
        if ((ended = acquire_steps(h)) != 0)
            acquire_end_canceled(h);
        break;
    case OP_RELEASE:
        h->rc = dlock_release(h->lock);
        h->lock = NULL;
        keep_message(h, h->rc);
        break;
    case OP_EXTEND:
        h->rc = dlock_lock_extend(h->lock, h->lease_ms);
        keep_message(h, h->rc);
        break;
    case OP_RELEASE_REST: {
        dlock_client *c = h->c;
        dlock__call k;
        dlock__call_begin(c, &k, "release", h->req.name, 1, DLOCK__CALL_TIMED);
        h->rc = dlock__call_end(c, &k, c->backend->release(c->be, &h->req));
        h->rc = dlock__release_end(h->lock, h->called, h->rc);
        h->lock = NULL;
        keep_message(h, h->rc);
        break;
    }
    }
    pthread_mutex_lock(&e->mu);
    if (ended)
        finished(e, h);
    e->running--;
    pthread_cond_broadcast(&e->quiet);
    pthread_mutex_unlock(&e->mu);
}

static void *worker_main(void *arg)
{
    engine *e = arg;

    pthread_mutex_lock(&e->mu);
    for (;;) {
        int64_t now = dlock__now_ms();
        dlock_request_handle *h;

        while (e->nheap > 0 && e->heap[0]->wake_at <= now) {
            h = e->heap[0];
            heap_remove(e, h);
            add_job(e, h);
        }
        if ((h = e->jobs.first) != NULL) {
            dlock_request_handle *ahead;
            unlink_from(&e->jobs, h);
            if (h->in_entry && !h->started && (ahead = entry_ahead(e, h)) != NULL) {
                /* Set aside until the one ahead is queued. */
                h->next = NULL;
                h->prev = ahead->blocked_last;
                if (ahead->blocked_last != NULL)
                    ahead->blocked_last->next = h;
                else
                    ahead->blocked_first = h;
                ahead->blocked_last = h;
                continue;
            }
            h->state = ST_RUNNING;
            e->running++;
            pthread_mutex_unlock(&e->mu);
            run(e, h);
            pthread_mutex_lock(&e->mu);
            continue;
        }
        if (e->stopping)
            break;
        e->idle++;
        if (e->nheap > 0) {
            struct timespec until = dlock__deadline_ts(e->heap[0]->wake_at - now);
            pthread_cond_timedwait(&e->work, &e->mu, &until);
        } else {
            pthread_cond_wait(&e->work, &e->mu);
        }
        e->idle--;
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* A waiting acquisition on a backend without watch_notify: all its steps on
 * a thread of its own. */
static void *own_thread_main(void *arg)
{
    dlock_request_handle *h = arg;
    engine *e = h->c->async;

    pthread_mutex_lock(&e->mu);
    while (h->in_entry && entry_ahead(e, h) != NULL)
        pthread_cond_wait(&e->entered, &e->mu);
    pthread_mutex_unlock(&e->mu);
    acquire_steps(h);
    acquire_end_canceled(h);
    pthread_mutex_lock(&e->mu);
    finished(e, h);
    e->running--;
    pthread_cond_broadcast(&e->quiet);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ---- the engine ------------------------------------------------------------ */

static engine *engine_get(dlock_client *c)
{
    engine *e;

    pthread_mutex_lock(&c->mu);
    if ((e = c->async) != NULL)
        goto out;
    if ((e = calloc(1, sizeof(*e))) == NULL) {
        dlock__fail(DLOCK_ENOMEM, "out of memory");
        goto out;
    }
    e->due_ms = -1;
    e->wd_next_ms = -1;
    e->wd_dirty = c->no_threads; /* locks taken before: plan their renewals */
    e->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    e->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (e->efd >= 0 && e->epfd >= 0) {
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = e->efd};
        if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, e->efd, &ev) != 0) {
            close(e->epfd);
            e->epfd = -1;
        }
    }
    if (e->efd < 0 || e->epfd < 0 || pthread_mutex_init(&e->mu, NULL) != 0) {
        dlock__fail(DLOCK_ENOMEM, "cannot make the async descriptor: %s", strerror(errno));
        if (e->efd >= 0)
            close(e->efd);
        if (e->epfd >= 0)
            close(e->epfd);
        free(e);
        e = NULL;
        goto out;
    }
    if (dlock__cond_init(&e->work) != 0 || dlock__cond_init(&e->quiet) != 0 ||
        dlock__cond_init(&e->entered) != 0) {
        dlock__fail(DLOCK_ENOMEM, "cannot create a condition variable");
        close(e->efd);
        close(e->epfd);
        pthread_mutex_destroy(&e->mu);
        free(e);
        e = NULL;
        goto out;
    }
    /* Read without c->mu by dlock__async_wake. */
    __atomic_store_n(&c->async, e, __ATOMIC_RELEASE);
out:
    pthread_mutex_unlock(&c->mu);
    return e;
}

static dlock_request_handle *request_new(dlock_client *c, int op, void *arg)
{
    dlock_request_handle *h = calloc(1, sizeof(*h));

    if (h == NULL) {
        dlock__fail(DLOCK_ENOMEM, "out of memory");
        return NULL;
    }
    h->c = c;
    h->op = op;
    h->arg = arg;
    return h;
}

static void request_free(dlock_request_handle *h)
{
    free(h->msg);
    free(h);
}

/* Queue h (its first step) unless the client is being freed. */
static int fast_send(engine *e, dlock_request_handle *h, int op);

/* Start h, unless the client is being freed: sent on this thread where the
 * backend can (fast_op, 0 for none), else queued for the workers, or a
 * thread of its own. */
static int start(engine *e, dlock_request_handle *h, int fast_op, const char *what)
{
    int rc = DLOCK_OK;

    pthread_mutex_lock(&e->mu);
    if (e->closing) {
        pthread_mutex_unlock(&e->mu);
        return dlock__fail(DLOCK_EMISUSE, "%s: the client is being freed", what);
    }
    if (h->op == OP_ACQUIRE) {
        h->live_next = e->live;
        if (e->live != NULL)
            e->live->live_prev = h;
        e->live = h;
    }
    pthread_mutex_unlock(&e->mu);
    if (fast_op != 0 && (rc = fast_send(e, h, fast_op)) == DLOCK_OK)
        return DLOCK_OK;
    pthread_mutex_lock(&e->mu);
    if (h->c->no_threads) {
        /* No worker to hand it to: refused, with the backend's reason. */
        live_unlink(e, h);
        pthread_mutex_unlock(&e->mu);
        return rc != DLOCK_OK ? rc : dlock__fail(DLOCK_ENOTSUP, "%s: not served without "
                                                 "threads", what);
    }
    rc = DLOCK_OK;
    if (is_fair_wait(h))
        entry_add(e, h);
    if (h->own_thread) {
        pthread_t t;
        if (dlock__thread_create(&t, own_thread_main, h) != 0) {
            entry_leave(e, h);
            live_unlink(e, h);
            rc = dlock__fail(DLOCK_ENOMEM, "%s: cannot start a thread to wait on", what);
        } else {
            pthread_detach(t);
            h->state = ST_RUNNING;
            e->running++;
        }
    } else {
        add_job(e, h);
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

static void lost_queue(engine *e, relay *r);

/* The relay, called by the watchdog as the lock's on_lost. */
static void relay_lost(dlock_lock *l, int reason, void *payload)
{
    relay *r = payload;
    engine *e = r->engine;

    (void)l;
    if (e == NULL)
        return;
    pthread_mutex_lock(&e->mu);
    if (!r->dead && !r->queued) {
        r->reason = reason;
        lost_queue(e, r);
    }
    pthread_mutex_unlock(&e->mu);
}

static void lost_unlink(engine *e, relay *r)
{
    relay *prev = NULL;

    for (relay *x = e->lost_first; x != NULL; prev = x, x = x->next) {
        if (x != r)
            continue;
        if (prev != NULL)
            prev->next = r->next;
        else
            e->lost_first = r->next;
        if (e->lost_last == r)
            e->lost_last = prev;
        break;
    }
    r->queued = 0;
    r->next = NULL;
}

void dlock__async_forget(dlock_lock *l)
{
    relay *r = l->relay;
    engine *e;

    if (r == NULL || (e = r->engine) == NULL)
        return;
    pthread_mutex_lock(&e->mu);
    r->dead = 1;
    if (r->queued)
        lost_unlink(e, r);
    /* Its on_lost running on the loop's thread now: wait for it (unless
     * this is that thread, releasing from inside it). */
    while (e->delivering == r && !pthread_equal(e->process_thread, pthread_self()))
        pthread_cond_wait(&e->quiet, &e->mu);
    pthread_mutex_unlock(&e->mu);
}

void dlock__async_relay_free(dlock_lock *l)
{
    free(l->relay);
    l->relay = NULL;
}

/* ---- on the loop's thread: the backend's start ------------------------------ */

/* Watch the backend's descriptors on epfd as they are now: a connection
 * made again (another generation) is watched afresh. The loop's thread. */
static void sync_fds(dlock_client *c, engine *e)
{
    int fds[4];
    unsigned gens[4];
    int n = c->backend->async_fds(c->be, fds, gens, 4);

    for (int i = 0; i < e->nwatched;) {
        int listed = 0;
        for (int j = 0; j < n; j++)
            listed |= fds[j] == e->watched[i].fd && gens[j] == e->watched[i].gen;
        if (listed) {
            i++;
            continue;
        }
        /* Closed already, most likely (and so gone from epfd): no matter. */
        epoll_ctl(e->epfd, EPOLL_CTL_DEL, e->watched[i].fd, NULL);
        e->watched[i] = e->watched[--e->nwatched];
    }
    for (int j = 0; j < n; j++) {
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = fds[j]};
        int known = 0;
        for (int i = 0; i < e->nwatched; i++)
            known |= e->watched[i].fd == fds[j];
        if (known || e->nwatched == 4)
            continue;
        if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, fds[j], &ev) != 0 &&
            (errno != EEXIST || epoll_ctl(e->epfd, EPOLL_CTL_MOD, fds[j], &ev) != 0))
            continue;
        e->watched[e->nwatched].fd = fds[j];
        e->watched[e->nwatched++].gen = gens[j];
    }
}

/* The backend's answer to a request its start sent: on whichever thread
 * read it (the backend's mutex held), kept for the loop to finish. */
static void fast_done(void *arg, int rc)
{
    dlock_request_handle *h = arg;
    engine *e = h->c->async;

    h->fast_rc = rc;
    keep_message(h, rc);
    pthread_mutex_lock(&e->mu);
    push(&e->fast, h);
    /* Read by the loop's own fast_pump, which finishes it next: no need
     * to wake the loop for it. */
    if (!e->in_process || !pthread_equal(e->process_thread, pthread_self()))
        signal_loop(e);
    pthread_mutex_unlock(&e->mu);
}

/* Send h (a try-once acquisition or a release, op) on this thread, the
 * loop's, where the backend can: DLOCK_OK, or DLOCK_ENOTSUP (the workers
 * then send it). */
static int fast_send(engine *e, dlock_request_handle *h, int op)
{
    dlock_client *c = h->c;
    int rc;

    if (c->backend->start == NULL)
        return DLOCK_ENOTSUP;
    h->res.lease_from_ms = dlock__now_ms();
    h->res.retry_ms = -1;
    h->res.handed = 0;
    pthread_mutex_lock(&e->mu);
    e->fast_inflight++;
    h->fast = 1;
    h->state = ST_RUNNING;
    pthread_mutex_unlock(&e->mu);
    if ((rc = c->backend->start(c->be, op, &h->req, &h->res, fast_done, h)) != DLOCK_OK) {
        pthread_mutex_lock(&e->mu);
        e->fast_inflight--;
        h->fast = 0;
        pthread_mutex_unlock(&e->mu);
        if (c->no_threads)
            return rc; /* no worker to do it instead: the reason stands */
        dlock__clear_error();
        return DLOCK_ENOTSUP;
    }
    dlock__call_begin(c, &h->call, op == DLOCK_BACKEND_OP_ACQUIRE ? "acquire" : "release",
                      h->req.name, 1, DLOCK__CALL_TIMED);
    sync_fds(c, e);
    pthread_mutex_lock(&e->mu);
    if (e->in_process && pthread_equal(e->process_thread, pthread_self()))
        e->sent_in_process = 1;
    pthread_mutex_unlock(&e->mu);
    if (e->due_ms < 0 && !e->in_process) {
        /* Its timeout is the loop's to keep now: have the loop ask
         * dlock_async_timeout_ms again. */
        pthread_mutex_lock(&e->mu);
        signal_loop(e);
        pthread_mutex_unlock(&e->mu);
    }
    return DLOCK_OK;
}

/* ---- without threads (DLOCK_CLIENT_NO_THREADS) ------------------------------ */

/* How often a waiting acquisition tries again without threads, at most:
 * no subscriber tells it of a release (its holder's lease, when shorter,
 * decides). */
#define POLL_MS 100

static void given_back(void *arg, int rc)
{
    (void)arg;
    (void)rc;
}

/* A try whose answer was lost may hold the lock: its release sent, its
 * answer not waited for (the lease ends it otherwise). */
static void give_back_async(dlock_client *c, const dlock_request *req)
{
    char msg[512];

    snprintf(msg, sizeof(msg), "%s", dlock_error_message());
    if (c->backend->start(c->be, DLOCK_BACKEND_OP_RELEASE, req, NULL, given_back, NULL) !=
        DLOCK_OK)
        dlock__clear_error();
    dlock__fail(DLOCK_ECONN, "%s", msg);
}

/* A busy try of a waiting acquisition: asleep in the heap until its next
 * try (1), or not (0: its wait is over, or it was canceled). */
static int sleep_or_fail(engine *e, dlock_request_handle *h, int cancel)
{
    int64_t now = dlock__now_ms(), sleep_ms;

    if (h->wait_ms == 0 || cancel || now >= h->deadline)
        return 0;
    if (!h->waited) {
        h->waited = 1;
        dlock__count(h->c, waits);
    }
    sleep_ms = dlock__busy_sleep_ms(h->deadline, now, &h->res);
    h->wake_at = now + (sleep_ms < POLL_MS ? sleep_ms : POLL_MS);
    pthread_mutex_lock(&e->mu);
    if (heap_push(e, h) != 0) {
        pthread_mutex_unlock(&e->mu);
        return 0;
    }
    h->state = ST_SLEEPING;
    pthread_mutex_unlock(&e->mu);
    return 1;
}

/* The sleepers whose time came: tried again, on this thread. */
static void sleepers_due(engine *e)
{
    int64_t now = dlock__now_ms();

    pthread_mutex_lock(&e->mu);
    while (e->nheap > 0 && e->heap[0]->wake_at <= now) {
        dlock_request_handle *h = e->heap[0];
        int rc;

        heap_remove(e, h);
        h->state = ST_RUNNING;
        pthread_mutex_unlock(&e->mu);
        if ((rc = dlock__check_interrupt(h->c, h->req.name)) != DLOCK_OK ||
            (rc = fast_send(e, h, DLOCK_BACKEND_OP_ACQUIRE)) != DLOCK_OK) {
            h->rc = rc;
            acquire_end(h);
            pthread_mutex_lock(&e->mu);
            finished(e, h);
            continue;
        }
        pthread_mutex_lock(&e->mu);
    }
    pthread_mutex_unlock(&e->mu);
}

/* An extension sent as a renewal of one, claimed from the watchdog until
 * its answer (fast_finish). DLOCK_OK, or the error with the lock as it was. */
static int extend_send(engine *e, dlock_request_handle *h)
{
    dlock_client *c = h->c;
    int rc;

    if ((rc = dlock__extend_begin(h->lock, h->lease_ms, &h->called)) != DLOCK_OK)
        return rc;
    dlock__lock_request(&h->req, h->lock);
    h->req.lease_ms = h->lease_ms;
    h->item = (dlock_renewal){&h->req, DLOCK_EPROTO};
    pthread_mutex_lock(&e->mu);
    e->fast_inflight++;
    h->fast = 1;
    h->state = ST_RUNNING;
    pthread_mutex_unlock(&e->mu);
    dlock__call_begin(c, &h->call, "extend", h->req.name, 1, DLOCK__CALL_TIMED);
    if ((rc = c->backend->renew_start(c->be, &h->item, 1, fast_done, h)) != DLOCK_OK) {
        pthread_mutex_lock(&e->mu);
        e->fast_inflight--;
        h->fast = 0;
        pthread_mutex_unlock(&e->mu);
        dlock__call_end(c, &h->call, rc);
        return dlock__extend_end(h->lock, h->lease_ms, h->called, rc);
    }
    sync_fds(c, e);
    pthread_mutex_lock(&e->mu);
    if (!e->in_process)
        signal_loop(e); /* its timeout is the loop's to keep */
    pthread_mutex_unlock(&e->mu);
    return DLOCK_OK;
}

void dlock__async_wake(dlock_client *c)
{
    engine *e = __atomic_load_n(&c->async, __ATOMIC_ACQUIRE);

    if (e == NULL)
        return;
    pthread_mutex_lock(&e->mu);
    e->wd_dirty = 1;
    /* dlock_async_process plans again before it returns. */
    if (!e->in_process || !pthread_equal(e->process_thread, pthread_self()))
        signal_loop(e);
    pthread_mutex_unlock(&e->mu);
}

/* The watchdog's step, planned (the loop's thread). */
static void watchdog_step(dlock_client *c, engine *e)
{
    int64_t next;

    pthread_mutex_lock(&e->mu);
    e->wd_dirty = 0;
    pthread_mutex_unlock(&e->mu);
    next = dlock__watchdog_step(c);
    pthread_mutex_lock(&e->mu);
    e->wd_next_ms = next;
    pthread_mutex_unlock(&e->mu);
}

/* Finish, on the loop's thread, what fast_send sent and the backend
 * answered: as the workers' steps would (acquire_end, release_one's end),
 * or handed to them when the backend said to do it the blocking way, or
 * the outcome is not known (their call is sent again, as the blocking
 * call's own retry would; a try's lock it may hold is theirs to give back
 * if canceled). Done ones go to the done list. */
static void fast_finish(engine *e, dlock_request_handle *h)
{
    dlock_client *c = h->c;
    int rc = h->fast_rc, cancel, redo;

    if (rc != DLOCK_OK)
        dlock__fail(rc, "%s", h->msg != NULL ? h->msg : dlock_strerror(rc));
    dlock__call_end(c, &h->call, rc);
    pthread_mutex_lock(&e->mu);
    cancel = h->canceled;
    h->fast = 0;
    pthread_mutex_unlock(&e->mu);
    redo = !c->no_threads && (rc == DLOCK_ENOTSUP || dlock__outcome_unknown(rc));
    if (h->op == OP_ACQUIRE) {
        if (redo) {
            h->maybe_taken = rc != DLOCK_ENOTSUP;
            h->started = 0;
            pthread_mutex_lock(&e->mu);
            add_job(e, h);
            pthread_mutex_unlock(&e->mu);
            return;
        }
        if (c->no_threads && dlock__outcome_unknown(rc))
            give_back_async(c, &h->req);
        if (rc == DLOCK_EBUSY) {
            dlock__count(c, busy);
            if (c->no_threads && h->wait_ms != 0 &&
                (rc = dlock__check_interrupt(c, h->req.name)) != DLOCK_OK) {
                /* dlock_client_interrupt: no more waiting */
            } else if (c->no_threads && sleep_or_fail(e, h, cancel)) {
                return;
            } else {
                rc = dlock__busy_fail(h->req.name, h->wait_ms, &h->res);
            }
        }
        h->rc = rc;
        acquire_end(h);
        if (h->taken && cancel) {
            if (c->no_threads) {
                undo(h); /* on this thread: no worker */
            } else {
                pthread_mutex_lock(&e->mu);
                add_job(e, h); /* run() gives it back */
                pthread_mutex_unlock(&e->mu);
                return;
            }
        }
        if (cancel && h->rc != DLOCK_OK) {
            h->rc = canceled_fail(h);
            keep_message(h, h->rc);
        }
    } else if (h->op == OP_EXTEND) {
        /* Without threads only: a renewal of one. */
        h->rc = dlock__extend_end(h->lock, h->lease_ms, h->called,
                                  rc == DLOCK_OK ? h->item.result : rc);
        keep_message(h, h->rc);
    } else {
        if (redo) {
            h->op = OP_RELEASE_REST;
            pthread_mutex_lock(&e->mu);
            add_job(e, h);
            pthread_mutex_unlock(&e->mu);
            return;
        }
        h->rc = dlock__release_end(h->lock, h->called, rc);
        h->lock = NULL;
        keep_message(h, h->rc);
    }
    pthread_mutex_lock(&e->mu);
    finished(e, h);
    pthread_mutex_unlock(&e->mu);
}

/* Read what the backend's descriptors have and finish what was answered. */
static void fast_pump(dlock_client *c, engine *e)
{
    queue answered;

    if (c->backend->async_step == NULL)
        return;
    e->due_ms = c->backend->async_step(c->be);
    sync_fds(c, e); /* a connection made or closed by the step */
    pthread_mutex_lock(&e->mu);
    answered = e->fast;
    e->fast.first = e->fast.last = NULL;
    pthread_mutex_unlock(&e->mu);
    while (answered.first != NULL) {
        dlock_request_handle *h = answered.first;
        unlink_from(&answered, h);
        pthread_mutex_lock(&e->mu);
        e->fast_inflight--;
        pthread_mutex_unlock(&e->mu);
        fast_finish(e, h);
    }
}

/* ---- the public calls ---------------------------------------------------- */

int dlock_acquire_async(dlock_request_handle **out, dlock_client *c, const char *name,
                        const dlock_acquire_options *opts, dlock_acquire_cb cb, void *arg)
{
    dlock_acquire_options o;
    dlock_request_handle *h;
    engine *e;
    int rc;

    dlock__clear_error();
    if (out != NULL)
        *out = NULL;
    if (c == NULL || cb == NULL)
        return dlock__fail(DLOCK_EINVAL, "dlock_acquire_async: %s is NULL",
                           c == NULL ? "client" : "cb");
    if ((rc = dlock__check_name(name, "dlock_acquire_async")) != DLOCK_OK ||
        (rc = dlock__check_acquire_options(&o, opts)) != DLOCK_OK)
        return rc;
    if (o.kind == DLOCK_KIND_LEADER)
        return dlock__fail(DLOCK_EINVAL, "dlock_acquire_async: DLOCK_KIND_LEADER is for "
                           "dlock_campaign, which publishes the leader's identity");
    if (c->no_threads && (o.kind != DLOCK_KIND_MUTEX || o.owner != NULL))
        return dlock__fail(DLOCK_ENOTSUP, "dlock_acquire_async: a client opened with "
                           "DLOCK_CLIENT_NO_THREADS serves plain mutexes only (kind "
                           "DLOCK_KIND_MUTEX, no owner)");
    if ((e = engine_get(c)) == NULL || (h = request_new(c, OP_ACQUIRE, arg)) == NULL)
        return DLOCK_ENOMEM;
    h->acquired = cb;
    h->wait_ms = o.wait_ms;
    if (o.on_lost != NULL) {
        relay *r = calloc(1, sizeof(*r));
        if (r == NULL) {
            request_free(h);
            return dlock__fail(DLOCK_ENOMEM, "out of memory");
        }
        r->engine = e;
        r->on_lost = o.on_lost;
        r->payload = o.payload;
        o.on_lost = relay_lost;
        o.payload = r;
        if ((rc = dlock__lock_new(&h->lock, c, name, &o, NULL)) != DLOCK_OK) {
            free(r);
            request_free(h);
            return rc;
        }
        r->lock = h->lock;
        h->lock->relay = r;
    } else if ((rc = dlock__lock_new(&h->lock, c, name, &o, NULL)) != DLOCK_OK) {
        request_free(h);
        return rc;
    }
    if ((rc = dlock__lock_supported(c, h->lock)) != DLOCK_OK)
        goto err;
    dlock__lock_request(&h->req, h->lock);
    h->own_thread = o.wait_ms != 0 && c->backend->watch_notify == NULL && !c->no_threads;
    if (c->no_threads) {
        /* Its tries are sent from this thread (sleep_or_fail): timed now. */
        h->started = 1;
        h->start_us = dlock__now_us();
        h->deadline = h->wait_ms == DLOCK_WAIT_FOREVER ? INT64_MAX
                                                        : (h->start_us + 999) / 1000 + h->wait_ms;
    }
    if ((rc = start(e, h, o.wait_ms == 0 || c->no_threads ? DLOCK_BACKEND_OP_ACQUIRE : 0,
                    "dlock_acquire_async")) != DLOCK_OK)
        goto err;
    if (out != NULL)
        *out = h;
    return DLOCK_OK;
err:
    dlock__lock_free(h->lock);
    request_free(h);
    return rc;
}

/* A release's or an extension's request on l. */
static int on_lock(dlock_request_handle **out, dlock_lock *l, int op, int64_t lease_ms,
                   dlock_done_cb cb, void *arg, const char *what)
{
    dlock_request_handle *h;
    engine *e;
    int rc;

    dlock__clear_error();
    if (out != NULL)
        *out = NULL;
    if (l == NULL || cb == NULL)
        return dlock__fail(DLOCK_EINVAL, "%s: %s is NULL", what, l == NULL ? "lock" : "cb");
    if (l->parts != NULL || l->parent != NULL || l->kind == DLOCK_KIND_LEADER)
        return dlock__fail(DLOCK_ENOTSUP, "%s: a multi-lock or an election's lock is released "
                           "and extended with the blocking calls", what);
    if (op == OP_EXTEND && (lease_ms <= 0 || lease_ms > DLOCK_LEASE_MAX_MS))
        return dlock__fail(DLOCK_EINVAL, "%s: lease_ms is %lld, must be 1..%lld", what,
                           (long long)lease_ms, (long long)DLOCK_LEASE_MAX_MS);
    if (l->client == NULL) {
        /* No loop to call cb: told and freed now, as dlock_release does. */
        if (op == OP_RELEASE)
            return dlock_release(l);
        return dlock__fail(DLOCK_EMISUSE, "%s: the lock's client was already freed", what);
    }
    if (l->client->no_threads && (atomic_load(&l->kind) != DLOCK_KIND_MUTEX || l->owner != NULL))
        return dlock__fail(DLOCK_ENOTSUP, "%s: a client opened with DLOCK_CLIENT_NO_THREADS "
                           "serves plain mutexes only: use the blocking call for this lock",
                           what);
    if ((e = engine_get(l->client)) == NULL || (h = request_new(l->client, op, arg)) == NULL)
        return DLOCK_ENOMEM;
    h->lock = l;
    h->lease_ms = lease_ms;
    h->finished = cb;
    if (op == OP_RELEASE && e->closing) {
        request_free(h);
        return dlock__fail(DLOCK_EMISUSE, "%s: the client is being freed", what);
    }
    if (op == OP_RELEASE && l->client->backend->start != NULL) {
        /* Out of the watchdog's hands here; the call to the server sent
         * from this thread, or by a worker (the rest of dlock_release). */
        if ((rc = dlock__release_begin(l, &h->called)) != DLOCK_OK) {
            request_free(h);
            return rc;
        }
        h->op = OP_RELEASE_REST;
        dlock__lock_request(&h->req, l);
        rc = start(e, h, DLOCK_BACKEND_OP_RELEASE, what);
    } else if (op == OP_EXTEND && l->client->no_threads) {
        rc = extend_send(e, h);
    } else {
        if (op == OP_RELEASE)
            dlock__async_forget(l);
        rc = start(e, h, 0, what);
    }
    if (rc != DLOCK_OK) {
        request_free(h);
        return rc;
    }
    if (out != NULL)
        *out = h;
    return DLOCK_OK;
}

int dlock_release_async(dlock_request_handle **out, dlock_lock *l, dlock_done_cb cb, void *arg)
{
    return on_lock(out, l, OP_RELEASE, 0, cb, arg, "dlock_release_async");
}

int dlock_extend_async(dlock_request_handle **out, dlock_lock *l, int64_t lease_ms,
                       dlock_done_cb cb, void *arg)
{
    return on_lock(out, l, OP_EXTEND, lease_ms, cb, arg, "dlock_extend_async");
}

/* h's outcome: DLOCK_ECANCELED, e->mu held (so not canceled_fail). */
static void set_canceled(dlock_request_handle *h)
{
    char shown[80];

    h->rc = DLOCK_ECANCELED;
    free(h->msg);
    if ((h->msg = malloc(160)) != NULL)
        snprintf(h->msg, 160, "the acquisition of lock '%s' was canceled",
                 dlock__printable(shown, sizeof(shown), h->req.name));
}

/* Cancel h (an acquisition), e->mu held; the waking of a watch blocked on
 * a thread of its own is left to the caller (*wake). */
static void cancel_locked(engine *e, dlock_request_handle *h, int *wake)
{
    if (h->canceled)
        return;
    h->canceled = 1;
    switch (h->state) {
    case ST_SLEEPING:
        heap_remove(e, h);
        if (h->c->no_threads) {
            /* No worker: it ends here (as a wait that ran out, nothing
             * joined on the server). */
            set_canceled(h);
            finished(e, h);
        } else {
            add_job(e, h);
        }
        break;
    case ST_DONE:
        if (h->taken && h->c->no_threads) {
            /* deliver() gives it back, on the loop's thread. */
        } else if (h->taken) {
            /* Taken, its callback not run: give the lock back first. */
            unlink_from(&e->done, h);
            add_job(e, h);
        } else if (h->rc != DLOCK_ECANCELED) {
            set_canceled(h);
        }
        break;
    case ST_RUNNING:
        *wake |= h->own_thread;
        break;
    default: /* ST_JOB: its worker finds it canceled */
        break;
    }
}

int dlock_request_cancel(dlock_request_handle *h)
{
    engine *e;
    int wake = 0;

    dlock__clear_error();
    if (h == NULL)
        return dlock__fail(DLOCK_EINVAL, "dlock_request_cancel: req is NULL");
    if (h->op != OP_ACQUIRE)
        return dlock__fail(DLOCK_EMISUSE, "dlock_request_cancel: a %s cannot be stopped; its "
                           "callback comes as usual", h->op == OP_EXTEND ? "extension"
                                                                         : "release");
    e = h->c->async;
    pthread_mutex_lock(&e->mu);
    cancel_locked(e, h, &wake);
    pthread_mutex_unlock(&e->mu);
    if (wake)
        dlock__waiting_wake_all(h->c); /* those on threads of their own */
    return DLOCK_OK;
}

int dlock_async_fd(dlock_client *c)
{
    engine *e;

    dlock__clear_error();
    if (c == NULL) {
        dlock__fail(DLOCK_EINVAL, "dlock_async_fd: client is NULL");
        return -1;
    }
    if ((e = engine_get(c)) == NULL)
        return -1;
    if (e->closing) {
        dlock__fail(DLOCK_EMISUSE, "dlock_async_fd: the client is being freed");
        return -1;
    }
    return e->epfd;
}

int64_t dlock_async_timeout_ms(dlock_client *c)
{
    engine *e;
    int64_t due, left;

    /* The workers keep the time of the waits; the loop, that of what it
     * sent itself (the backend's async_step fails it at its timeout), and
     * without threads that of the waits and the watchdog too. */
    if (c == NULL || (e = c->async) == NULL)
        return -1;
    pthread_mutex_lock(&e->mu);
    due = e->due_ms;
    if (c->no_threads) {
        if (e->wd_next_ms >= 0 && (due < 0 || e->wd_next_ms < due))
            due = e->wd_next_ms;
        if (e->nheap > 0 && (due < 0 || e->heap[0]->wake_at < due))
            due = e->heap[0]->wake_at;
        if (e->wd_dirty)
            due = 0;
    }
    pthread_mutex_unlock(&e->mu);
    if (due < 0)
        return -1;
    left = due - dlock__now_ms();
    return left > 0 ? left : 0;
}

int dlock_async_set_detach(dlock_client *c, dlock_async_detach_cb cb, void *arg)
{
    engine *e;

    dlock__clear_error();
    if (c == NULL)
        return dlock__fail(DLOCK_EINVAL, "dlock_async_set_detach: client is NULL");
    if ((e = engine_get(c)) == NULL)
        return DLOCK_ENOMEM;
    pthread_mutex_lock(&e->mu);
    if (cb != NULL && e->detach != NULL) {
        pthread_mutex_unlock(&e->mu);
        return dlock__fail(DLOCK_EMISUSE, "dlock_async_set_detach: the client has a detach "
                           "hook already (attached to a loop: one loop per client)");
    }
    e->detach = cb;
    e->detach_arg = arg;
    pthread_mutex_unlock(&e->mu);
    return DLOCK_OK;
}

/* Run one done request's callback, and free it. */
static void deliver(engine *e, dlock_request_handle *h)
{
    if (h->op == OP_ACQUIRE) {
        pthread_mutex_lock(&e->mu);
        live_unlink(e, h);
        pthread_mutex_unlock(&e->mu);
    }
    if (h->rc != DLOCK_OK)
        dlock__fail(h->rc, "%s", h->msg != NULL ? h->msg : dlock_strerror(h->rc));
    else
        dlock__clear_error();
    if (h->op == OP_ACQUIRE && h->taken && h->canceled)
        undo(h); /* without threads: taken as it was canceled */
    if (h->op == OP_ACQUIRE) {
        dlock_lock *l = h->rc == DLOCK_OK ? h->lock : NULL;
        if (h->rc != DLOCK_OK && h->lock != NULL)
            dlock__lock_free(h->lock);
        if (l != NULL && l->relay != NULL) {
            pthread_mutex_lock(&e->mu);
            l->relay->announced = 1;
            if (l->relay->held && !l->relay->dead && !l->relay->queued)
                lost_queue(e, l->relay);
            pthread_mutex_unlock(&e->mu);
        }
        h->acquired(h->rc, l, h->arg);
    } else {
        h->finished(h->rc, h->arg);
    }
    request_free(h);
}

/* Queue r's on_lost for the loop, e->mu held. */
static void lost_queue(engine *e, relay *r)
{
    r->queued = 1;
    r->next = NULL;
    if (e->lost_last != NULL)
        e->lost_last->next = r;
    else
        e->lost_first = r;
    e->lost_last = r;
    signal_loop(e);
}

/* Run the callbacks due now, in order: the requests', then the on_lost of
 * locks acquired here. Stops after a callback that freed the client, and
 * puts back what it did not run. */
static int deliver_all(engine *e)
{
    queue due;
    relay *lost;
    int n = 0;

    pthread_mutex_lock(&e->mu);
    due = e->done;
    e->done.first = e->done.last = NULL;
    e->collecting = 0;
    lost = e->lost_first;
    e->lost_first = e->lost_last = NULL;
    for (relay *r = lost; r != NULL; r = r->next)
        r->queued = 0;
    if (e->signaled) {
        uint64_t count;
        if (read(e->efd, &count, sizeof(count)) < 0) {
            /* EAGAIN: nothing was pending */
        }
        e->signaled = 0;
    }
    pthread_mutex_unlock(&e->mu);

    while (due.first != NULL && !e->free_pending) {
        dlock_request_handle *h = due.first;
        unlink_from(&due, h);
        deliver(e, h);
        n++;
    }
    while (lost != NULL && !e->free_pending) {
        relay *r = lost;
        lost = r->next;
        pthread_mutex_lock(&e->mu);
        if (r->dead || r->queued) {
            pthread_mutex_unlock(&e->mu);
            continue;
        }
        if (!r->announced) {
            /* Lost before its acquisition's callback ran: after it. */
            r->held = 1;
            pthread_mutex_unlock(&e->mu);
            continue;
        }
        e->delivering = r;
        pthread_mutex_unlock(&e->mu);
        dlock__clear_error();
        r->on_lost(r->lock, r->reason, r->payload);
        n++;
        pthread_mutex_lock(&e->mu);
        e->delivering = NULL;
        pthread_cond_broadcast(&e->quiet);
        pthread_mutex_unlock(&e->mu);
    }
    if (due.first != NULL) {
        /* The client's free runs them (canceled where they can be). */
        pthread_mutex_lock(&e->mu);
        while (due.last != NULL) {
            dlock_request_handle *h = due.last;
            unlink_from(&due, h);
            h->next = e->done.first;
            if (e->done.first != NULL)
                e->done.first->prev = h;
            else
                e->done.last = h;
            e->done.first = h;
        }
        pthread_mutex_unlock(&e->mu);
    }
    return n;
}

int dlock_async_process(dlock_client *c)
{
    engine *e;
    int n;

    dlock__clear_error();
    if (c == NULL)
        return dlock__fail(DLOCK_EINVAL, "dlock_async_process: client is NULL");
    if ((e = c->async) == NULL)
        return 0;
    if (e->in_process)
        return dlock__fail(DLOCK_EMISUSE, "dlock_async_process: called from inside one of "
                           "its own callbacks");
    pthread_mutex_lock(&e->mu);
    e->in_process = 1;
    e->collecting = 1;
    e->process_thread = pthread_self();
    pthread_mutex_unlock(&e->mu);
    fast_pump(c, e);
    if (c->no_threads) {
        sleepers_due(e);
        watchdog_step(c, e);
    }
    n = deliver_all(e);
    if (!c->no_threads && !e->free_pending && e->sent_in_process) {
        /* What the callbacks sent: its timeout kept in due_ms, and what the
         * backend's step must do at once (a connection to make). */
        e->sent_in_process = 0;
        fast_pump(c, e);
    }
    if (c->no_threads && !e->free_pending) {
        int dirty;
        pthread_mutex_lock(&e->mu);
        dirty = e->wd_dirty;
        pthread_mutex_unlock(&e->mu);
        if (dirty)
            watchdog_step(c, e); /* a callback took or released a lock */
        /* What this call sent (tries, renewals, and the callbacks'
         * requests): its timeout kept in due_ms. */
        fast_pump(c, e);
    }
    pthread_mutex_lock(&e->mu);
    e->in_process = 0;
    pthread_mutex_unlock(&e->mu);
    if (e->free_pending) {
        e->free_pending = 0;
        dlock_client_free(c);
    }
    return n;
}

/* ---- the client's free ------------------------------------------------------ */

int dlock__async_free_begin(dlock_client *c)
{
    engine *e = c->async;
    int wake = 0;

    if (e == NULL)
        return 0;
    if (e->closing)
        return 1; /* from a callback the free below runs: it goes on */
    if (e->in_process) {
        e->free_pending = 1;
        return 1;
    }
    pthread_mutex_lock(&e->mu);
    e->closing = 1;
    for (dlock_request_handle *h = e->live; h != NULL; h = h->live_next)
        cancel_locked(e, h, &wake);
    wake |= e->running > 0;
    pthread_mutex_unlock(&e->mu);
    if (wake)
        dlock__waiting_wake_all(c);
    /* What this thread sent is answered by the server or by its timeout:
     * read it here, the loop is not running now. */
    for (;;) {
        struct pollfd p = {e->epfd, POLLIN, 0};
        int inflight;
        pthread_mutex_lock(&e->mu);
        inflight = e->fast_inflight;
        pthread_mutex_unlock(&e->mu);
        fast_pump(c, e);
        if (inflight == 0)
            break;
        poll(&p, 1, 10);
    }
    /* Steps running now see the cancel when they end: wait for every one,
     * and for the jobs (gives back, releases) the workers still have. */
    pthread_mutex_lock(&e->mu);
    while (e->running > 0 || e->jobs.first != NULL || e->nheap > 0) {
        if (e->running == 0 && e->nworkers == 0)
            break; /* no worker could ever be started: nothing will run them */
        pthread_cond_wait(&e->quiet, &e->mu);
    }
    e->stopping = 1;
    pthread_cond_broadcast(&e->work);
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; i < e->nworkers; i++)
        pthread_join(e->workers[i], NULL);
    e->nworkers = 0;
    /* Every callback now, on this thread; no on_lost after the free. */
    pthread_mutex_lock(&e->mu);
    e->in_process = 1;
    e->process_thread = pthread_self();
    for (relay *r = e->lost_first; r != NULL; r = r->next)
        r->queued = 0;
    e->lost_first = e->lost_last = NULL;
    pthread_mutex_unlock(&e->mu);
    while (e->done.first != NULL) {
        dlock_request_handle *h = e->done.first;
        unlink_from(&e->done, h);
        if (h->taken)
            undo(h); /* no worker left to give it back */
        deliver(e, h);
    }
    if (e->detach != NULL)
        e->detach(e->detach_arg);
    return 0;
}

void dlock__async_free_end(dlock_client *c)
{
    engine *e = c->async;

    if (e == NULL)
        return;
    /* The watchdog is stopped: no relay is called any more. The handles
     * the caller still holds keep theirs, unhooked. */
    for (dlock_lock *l = c->locks; l != NULL; l = l->next)
        if (l->relay != NULL)
            l->relay->engine = NULL;
    close(e->efd);
    close(e->epfd);
    pthread_cond_destroy(&e->work);
    pthread_cond_destroy(&e->quiet);
    pthread_cond_destroy(&e->entered);
    pthread_mutex_destroy(&e->mu);
    free(e->heap);
    free(e);
    c->async = NULL;
}
