/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The hub of the etcd watches over gRPC: one Watch stream per client, kept
 * by a thread of its own, on which each watch is a watch_id (etcd_watch.h).
 * The replies are read with the stream's calls of etcd_watch.c.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "backends/etcd/etcd_codec.h"
#include "backends/etcd/etcd_grpc.h"
#include "backends/etcd/etcd_watch_int.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/thread.h"

/* ---- the hub: one Watch stream for all the watches of a client ---------- */

/*
 * Over gRPC, every watch of a client (its waiters', its observers') is one
 * watch_id on one Watch stream, kept by a thread of the hub's own: a watch
 * is a WatchCreateRequest with a watch_id the client chose (etcd 3.4 takes
 * it), written into the open stream, and a WatchCancelRequest when it is
 * closed; each WatchResponse goes to the watch its watch_id names. The
 * upload of the stream stays open: libcurl's read callback pauses it when
 * there is nothing to send, and the thread resumes it when a request is
 * queued (curl_multi_wakeup). When the stream fails or ends, every watch on
 * it is told (FAILED) and leaves the hub: its waiter opens a new one, from
 * its next revision, which starts a new stream (on the endpoint in use).
 * The stream is closed when the last watch is. The JSON gateway (HTTP/1.1)
 * keeps a stream per watch, as before.
 */
struct dlock__etcd_hub {
    dlock__etcd *e;
    pthread_mutex_t mu;
    pthread_t thread;
    int started, stop;
    CURLM *multi;
    CURL *easy;        /* the stream; NULL when down */
    struct curl_slist *headers;
    size_t endpoint;
    unsigned long gen; /* of the stream up now */
    uint8_t *out;      /* requests not yet taken by the read callback */
    size_t olen, opos, ocap;
    int paused, resume;
    char *in;          /* the part of the replies not yet whole messages */
    size_t ilen, icap;
    int grpc_status;
    char grpc_message[200];
    dlock__etcd_stream *list; /* the watches on the stream, or waiting for it */
    int64_t next_id;
    int moved;          /* calls went to another member: a new stream */
    int64_t idle_since; /* the list emptied then (0: not empty) */
};

/* A stream without watches is kept this long, for the next waiter. */
#define HUB_IDLE_MS 30000

static const ProtobufCMethodDescriptor *watch_method(void)
{
    char path[128];
    return dlock__etcd_grpc_method("/v3/watch", path, sizeof(path));
}

/* s's state changed: its waiter is told, by its eventfd, or by its own
 * call when nobody sleeps on the stream (a waiter of the async engine). */
static void notify(dlock__etcd_stream *s)
{
    uint64_t one = 1;

    if (s->efd >= 0) {
        ssize_t n = write(s->efd, &one, sizeof(one));
        (void)n; /* a full counter is a pending wake-up all the same */
    }
    if (s->notify != NULL)
        s->notify(s->notify_arg);
}

/* Queue a WatchRequest (JSON) for the stream; under the mutex. */
static int hub_queue(dlock__etcd_hub *h, json_t *req)
{
    char *text = req != NULL ? json_dumps(req, JSON_COMPACT) : NULL, err[160];
    uint8_t *frames = NULL;
    size_t len = 0;

    json_decref(req);
    if (text == NULL || dlock__etcd_grpc_body(watch_method()->input, text, 0, &frames, &len, err,
                                              sizeof(err)) != 0) {
        free(text);
        return dlock__fail(DLOCK_ENOMEM, "etcd watch request: %s", text ? err : "out of memory");
    }
    free(text);
    if (h->olen + len > h->ocap) {
        size_t cap = h->ocap ? h->ocap : 1024;
        uint8_t *grown;
        while (cap < h->olen + len)
            cap *= 2;
        if ((grown = realloc(h->out, cap)) == NULL) {
            free(frames);
            return dlock__fail(DLOCK_ENOMEM, "out of memory");
        }
        h->out = grown;
        h->ocap = cap;
    }
    memcpy(h->out + h->olen, frames, len);
    h->olen += len;
    h->resume = 1;
    free(frames);
    return DLOCK_OK;
}

/* Every watch on the stream is told it failed, and leaves; the stream goes.
 * Under the mutex, in the thread (or at the end). */
static void hub_down(dlock__etcd_hub *h, const char *why)
{
    dlock__etcd_stream **p = &h->list;

    while (*p != NULL) {
        dlock__etcd_stream *s = *p;
        if (!s->queued) { /* not on this stream: for the next */
            p = &s->next;
            continue;
        }
        *p = s->next;
        s->next = NULL;
        s->listed = 0;
        dlock__etcd_stream_set_failed(s, why);
        notify(s);
    }
    if (h->list == NULL && h->idle_since == 0)
        h->idle_since = dlock__now_ms();
    if (h->easy != NULL) {
        curl_multi_remove_handle(h->multi, h->easy);
        curl_easy_cleanup(h->easy);
        h->easy = NULL;
    }
    dlock__etcd_headers_free(h->headers);
    h->headers = NULL;
    h->olen = h->opos = h->ilen = 0;
    h->paused = h->resume = 0;
}

static size_t hub_read(char *buf, size_t size, size_t n, void *arg)
{
    dlock__etcd_hub *h = arg;
    size_t k = h->olen - h->opos;

    if (k == 0) {
        h->olen = h->opos = 0;
        h->paused = 1;
        return CURL_READFUNC_PAUSE;
    }
    if (k > size * n)
        k = size * n;
    memcpy(buf, h->out + h->opos, k);
    h->opos += k;
    return k;
}

static dlock__etcd_stream *hub_find(dlock__etcd_hub *h, int64_t id)
{
    for (dlock__etcd_stream *s = h->list; s != NULL; s = s->next)
        if (s->id == id)
            return s;
    return NULL;
}

static size_t hub_data(char *data, size_t size, size_t n, void *arg)
{
    dlock__etcd_hub *h = arg;
    size_t add = size * n, pos = 0, len;
    const uint8_t *msg;
    int got;

    /* 0 returned: curl fails the stream, and every watch is told. */
    if (dlock__etcd_watch_append(&h->in, &h->ilen, &h->icap, data, add,
                                 4 * DLOCK__ETCD_WATCH_LINE_MAX) != 0)
        return 0;
    while ((got = dlock__etcd_grpc_frame((const uint8_t *)h->in, h->ilen, &pos,
                                         DLOCK__ETCD_WATCH_LINE_MAX, &msg, &len)) == 1) {
        const char *why;
        json_t *j = dlock__etcd_watch_response(msg, len, &why);
        int64_t id = 0;
        dlock__etcd_stream *s;

        if (j == NULL)
            return 0;
        /* watch_id 0 is left out of the JSON (a zero field): no watch of
         * ours has it, ids start at 1. */
        if (dlock__etcd_int(j, "watch_id", &id) == 0 && (s = hub_find(h, id)) != NULL) {
            int before = s->state;
            dlock__etcd_stream_handle_result(s, j);
            if (s->state != before)
                notify(s);
        }
        json_decref(j);
    }
    if (got < 0)
        return 0;
    memmove(h->in, h->in + pos, h->ilen - pos);
    h->ilen -= pos;
    return add;
}

static size_t hub_header(char *data, size_t size, size_t n, void *arg)
{
    dlock__etcd_hub *h = arg;

    dlock__etcd_watch_read_trailer(data, size * n, &h->grpc_status, h->grpc_message,
                                   sizeof(h->grpc_message));
    return size * n;
}

/* Open the stream on the endpoint in use, with a create request for every
 * watch of the list; under the mutex, in the thread. */
static void hub_up(dlock__etcd_hub *h)
{
    char why[200];

    h->endpoint = dlock__etcd_current(h->e);
    h->gen++;
    h->grpc_status = -1;
    h->grpc_message[0] = '\0';
    h->olen = h->opos = h->ilen = 0;
    if ((h->easy = curl_easy_init()) == NULL ||
        dlock__etcd_setup_stream(h->e, h->easy, h->endpoint, "/v3/watch", "{}", &h->headers) !=
            DLOCK_OK) {
        snprintf(why, sizeof(why), "cannot start the watch stream: %s", dlock_error_message());
        hub_down(h, why);
        return;
    }
    /* The body is ours to write, for as long as the stream lives. */
    curl_easy_setopt(h->easy, CURLOPT_POSTFIELDS, NULL);
    curl_easy_setopt(h->easy, CURLOPT_POSTFIELDSIZE, -1L);
    curl_easy_setopt(h->easy, CURLOPT_POST, 1L);
    curl_easy_setopt(h->easy, CURLOPT_READFUNCTION, hub_read);
    curl_easy_setopt(h->easy, CURLOPT_READDATA, h);
    curl_easy_setopt(h->easy, CURLOPT_WRITEFUNCTION, hub_data);
    curl_easy_setopt(h->easy, CURLOPT_WRITEDATA, h);
    curl_easy_setopt(h->easy, CURLOPT_HEADERFUNCTION, hub_header);
    curl_easy_setopt(h->easy, CURLOPT_HEADERDATA, h);
    for (dlock__etcd_stream *s = h->list; s != NULL; s = s->next) {
        s->gen = h->gen;
        s->endpoint = h->endpoint;
        s->queued = 1;
        if (hub_queue(h, dlock__etcd_watch_create_request(s)) != DLOCK_OK) {
            hub_down(h, "out of memory");
            return;
        }
    }
    if (curl_multi_add_handle(h->multi, h->easy) != CURLM_OK)
        hub_down(h, "cannot start the watch stream");
}

static void *hub_main(void *arg)
{
    dlock__etcd_hub *h = arg;

    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        int running = 0, left;
        dlock__sigpipe_guard guard;
        CURLMsg *msg;

        if (h->easy != NULL && h->moved)
            hub_down(h, "the client moved to another endpoint");
        h->moved = 0;
        if (h->easy == NULL && h->list != NULL)
            hub_up(h);
        else if (h->easy != NULL && h->list == NULL &&
                 dlock__now_ms() - h->idle_since > HUB_IDLE_MS)
            hub_down(h, "");
        if (h->easy != NULL && h->resume && h->paused) {
            h->resume = h->paused = 0;
            curl_easy_pause(h->easy, CURLPAUSE_CONT);
        }
        h->resume = 0;
        dlock__sigpipe_block(&guard);
        if (curl_multi_perform(h->multi, &running) != CURLM_OK)
            hub_down(h, "curl multi failed");
        dlock__sigpipe_restore(&guard);
        while ((msg = curl_multi_info_read(h->multi, &left)) != NULL) {
            if (msg->msg == CURLMSG_DONE && msg->easy_handle == h->easy) {
                char why[200];
                snprintf(why, sizeof(why), "%s",
                         dlock__etcd_watch_end_reason(msg->data.result, h->grpc_status,
                                                      h->grpc_message));
                hub_down(h, why);
                break;
            }
        }
        pthread_mutex_unlock(&h->mu);
        /* 50 ms at most: libcurl 7.88 can hold an HTTP/2 frame it already
         * read without the socket waking the poll (etcd_request.c). */
        curl_multi_poll(h->multi, NULL, 0, 50, NULL);
        pthread_mutex_lock(&h->mu);
    }
    hub_down(h, "the client is closing");
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

void dlock__etcd_hub_free(dlock__etcd_hub *h)
{
    if (h == NULL)
        return;
    pthread_mutex_lock(&h->mu);
    h->stop = 1;
    pthread_mutex_unlock(&h->mu);
    if (h->started) {
        curl_multi_wakeup(h->multi);
        pthread_join(h->thread, NULL);
    }
    curl_multi_cleanup(h->multi);
    pthread_mutex_destroy(&h->mu);
    free(h->out);
    free(h->in);
    free(h);
}

int dlock__etcd_hub_new(dlock__etcd *e, dlock__etcd_hub **out)
{
    dlock__etcd_hub *h = calloc(1, sizeof(*h));

    *out = NULL;
    if (h == NULL || (h->multi = curl_multi_init()) == NULL) {
        free(h);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    h->e = e;
    pthread_mutex_init(&h->mu, NULL);
    *out = h;
    return DLOCK_OK;
}

/* Put s on the client's stream (started if need be). */
int dlock__etcd_hub_open(dlock__etcd_hub *h, dlock__etcd_stream *s)
{
    int rc = DLOCK_OK;

    if (s->wake_fd >= 0)
        s->efd = s->wake_fd;
    else if (s->notify == NULL && (s->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0)
        return dlock__fail(DLOCK_ENOMEM, "eventfd: %s", strerror(errno));
    pthread_mutex_lock(&h->mu);
    if (!h->started) {
        if (dlock__thread_create(&h->thread, hub_main, h) != 0)
            rc = dlock__fail(DLOCK_ENOMEM, "cannot start the etcd watch thread");
        else
            h->started = 1;
    }
    if (rc == DLOCK_OK && h->easy != NULL && h->endpoint != dlock__etcd_current(h->e))
        /* Calls went to another member: the thread opens a stream there,
         * with this watch on it. */
        h->moved = 1;
    if (rc == DLOCK_OK) {
        s->hub = h;
        s->id = ++h->next_id;
        s->endpoint = h->easy != NULL && !h->moved ? h->endpoint : dlock__etcd_current(h->e);
        s->gen = h->gen;
        s->queued = h->easy != NULL && !h->moved;
        if (s->queued)
            rc = hub_queue(h, dlock__etcd_watch_create_request(s));
    }
    if (rc == DLOCK_OK) {
        s->next = h->list;
        h->list = s;
        s->listed = 1;
        h->idle_since = 0;
    }
    pthread_mutex_unlock(&h->mu);
    if (rc == DLOCK_OK)
        curl_multi_wakeup(h->multi);
    return rc;
}

/* Take s off the stream: a cancel request when it is still on it. */
void dlock__etcd_hub_close(dlock__etcd_stream *s)
{
    dlock__etcd_hub *h = s->hub;

    pthread_mutex_lock(&h->mu);
    if (s->listed) {
        dlock__etcd_stream **p = &h->list;
        while (*p != s)
            p = &(*p)->next;
        *p = s->next;
        s->listed = 0;
        if (h->easy != NULL && s->queued && s->gen == h->gen)
            hub_queue(h, json_pack("{s:{s:I}}", "cancel_request", "watch_id", (json_int_t)s->id));
        if (h->list == NULL)
            h->idle_since = dlock__now_ms();
    }
    pthread_mutex_unlock(&h->mu);
    curl_multi_wakeup(h->multi);
}

int dlock__etcd_hub_wait(dlock__etcd_stream *s, int64_t timeout_ms, int wake_fd)
{
    int64_t end = dlock__now_ms() + (timeout_ms > 0 ? timeout_ms : 0);

    for (int woken = 0;;) {
        struct pollfd fds[2] = {{s->efd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
        int one = wake_fd < 0 || wake_fd == s->efd; /* one descriptor to poll */
        int64_t left;
        uint64_t v;
        int state;

        pthread_mutex_lock(&s->hub->mu);
        state = s->state;
        pthread_mutex_unlock(&s->hub->mu);
        left = end - dlock__now_ms();
        if (state != DLOCK__ETCD_STREAM_RUNNING || left <= 0 || woken)
            return state;
        if (poll(fds, one ? 1 : 2, left > INT32_MAX ? INT32_MAX : (int)left) < 0 &&
            errno != EINTR)
            return state;
        if (fds[0].revents != 0 && read(s->efd, &v, sizeof(v)) < 0) {
            /* nothing: the look at the state comes next */
        }
        /* The caller's own descriptor: a wake-up of the caller's (whose
         * flag it reads) or a change of state, told apart by the caller. */
        woken = wake_fd >= 0 && (wake_fd == s->efd ? fds[0].revents != 0 : fds[1].revents != 0);
    }
}

/* A stream on the hub is the hub thread's to change: its fields are read
 * and written under the hub's mutex. */
void dlock__etcd_stream_guard_lock(const dlock__etcd_stream *s)
{
    if (s->hub != NULL)
        pthread_mutex_lock(&s->hub->mu);
}

void dlock__etcd_stream_guard_unlock(const dlock__etcd_stream *s)
{
    if (s->hub != NULL)
        pthread_mutex_unlock(&s->hub->mu);
}
