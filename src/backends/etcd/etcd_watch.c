/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A watch stream: etcd's Watch method over gRPC, its WatchResponse
 * messages transcoded into the gateway's JSON (etcd_grpc.h), or with
 * transport=gateway the gateway itself, which answers a POST to /v3/watch
 * with one JSON object per line, for as long as the connection stays open:
 *   {"result":{"header":{...},"created":true}}
 *   {"result":{"header":{...},"events":[{"type":"DELETE","kv":{"key":"..."}}]}}
 *   {"result":{...,"canceled":true,"compact_revision":"41"}}
 *   {"error":{"grpc_code":14,"message":"etcdserver: no leader"}}
 * PUT events are filtered out on the server (NOPUT); "type" is left out for
 * them anyway, as PUT is the enum's zero.
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
#include "backends/etcd/etcd_watch.h"
#include "etcd/etcdserver/etcdserverpb/rpc.pb-c.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/thread.h"

/* A line longer than this is not a watch reply for one key. */
#define LINE_MAX_BYTES (1024 * 1024)

struct dlock__etcd_stream {
    /* Over gRPC, a watch of the client's one Watch stream (the hub, below):
     * state, next_rev and error are the hub's to change, under its mutex,
     * and efd is written when state changes. */
    dlock__etcd_hub *hub;
    int64_t id;      /* its watch_id on the hub's stream */
    int efd;
    int listed;      /* in the hub's list (not after the stream failed) */
    int queued;      /* its create request is on the stream up now */
    unsigned long gen; /* the hub stream it was created on */
    dlock__etcd_stream *next;
    CURLM *multi;
    CURL *easy;
    struct curl_slist *headers;
    size_t endpoint;
    char *key;
    size_t key_len;
    char *range_end;  /* any change under a range; NULL: one key's deletion */
    int64_t next_rev; /* watch from here after a reconnect */
    int state;
    char *line; /* the part of the body not yet split into lines */
    size_t len, cap;
    char error[200];
    int grpc;        /* messages framed, else the gateway's JSON lines */
    int grpc_status; /* of the trailers, -1 until they come */
    char grpc_message[200];
};

static void set_failed(dlock__etcd_stream *s, const char *why)
{
    if (s->state == DLOCK__ETCD_STREAM_RUNNING) {
        s->state = DLOCK__ETCD_STREAM_FAILED;
        snprintf(s->error, sizeof(s->error), "%s", why);
    }
}

/* One WatchResponse, in the gateway's JSON (over gRPC: transcoded). */
static void handle_result(dlock__etcd_stream *s, const json_t *result)
{
    const json_t *events;

    events = json_object_get(result, "events");
    for (size_t i = 0; json_is_array(events) && i < json_array_size(events); i++) {
        const json_t *ev = json_array_get(events, i);
        const json_t *type = json_object_get(ev, "type");
        const json_t *kv = json_object_get(ev, "kv");
        const json_t *key = json_object_get(kv, "key");
        char *k = NULL;
        size_t klen = 0;
        int64_t rev = 0;

        if (dlock__etcd_int(kv, "mod_revision", &rev) == 0 && rev >= s->next_rev &&
            rev < INT64_MAX)
            s->next_rev = rev + 1;
        if (s->range_end != NULL) {
            if (s->state == DLOCK__ETCD_STREAM_RUNNING)
                s->state = DLOCK__ETCD_STREAM_DELETED;
            continue;
        }
        if (!json_is_string(type) || strcmp(json_string_value(type), "DELETE") != 0 ||
            !json_is_string(key))
            continue;
        if (dlock__etcd_unb64(json_string_value(key), &k, &klen) == 0 && klen == s->key_len &&
            memcmp(k, s->key, klen) == 0 && s->state == DLOCK__ETCD_STREAM_RUNNING)
            s->state = DLOCK__ETCD_STREAM_DELETED;
        free(k);
    }
    if (json_is_true(json_object_get(result, "canceled")) &&
        s->state == DLOCK__ETCD_STREAM_RUNNING)
        s->state = DLOCK__ETCD_STREAM_CANCELED;
}

/* The gateway's line: {"result": {...}} or {"error": {...}}. */
static void handle_line(dlock__etcd_stream *s, const char *text, size_t n)
{
    json_error_t jerr;
    json_t *j = json_loadb(text, n, 0, &jerr);
    const json_t *result, *err;

    if (!json_is_object(j)) {
        json_decref(j);
        set_failed(s, "not a JSON watch reply");
        return;
    }
    err = json_object_get(j, "error");
    result = json_object_get(j, "result");
    if (err != NULL || !json_is_object(result)) {
        const json_t *m = json_is_object(err) ? json_object_get(err, "message") : err;
        set_failed(s, json_is_string(m) ? json_string_value(m) : "watch refused");
        json_decref(j);
        return;
    }
    handle_result(s, result);
    json_decref(j);
}

/* A WatchResponse message in the gateway's JSON; NULL with *why. */
static json_t *watch_response(const uint8_t *msg, size_t len, const char **why)
{
    ProtobufCMessage *m =
        protobuf_c_message_unpack(&etcdserverpb__watch_response__descriptor, NULL, len, msg);
    json_t *j = m != NULL ? dlock__etcd_pb_to_json(m) : NULL;

    *why = m == NULL ? "not a WatchResponse" : "out of memory";
    dlock__etcd_pb_free(m, 0);
    return j;
}

/* Whole gRPC messages at the start of the buffer; returns the bytes used. */
static size_t handle_frames(dlock__etcd_stream *s)
{
    const uint8_t *buf = (const uint8_t *)s->line, *msg;
    size_t pos = 0, len;
    int got;

    while ((got = dlock__etcd_grpc_frame(buf, s->len, &pos, LINE_MAX_BYTES, &msg, &len)) == 1) {
        const char *why;
        json_t *j = watch_response(msg, len, &why);
        if (j == NULL) {
            set_failed(s, why);
            return pos;
        }
        handle_result(s, j);
        json_decref(j);
    }
    if (got < 0)
        set_failed(s, "watch reply too long or compressed");
    return pos;
}

/* gRPC's status and message, in the trailers when etcd ends a stream:
 * the first status that is not OK is kept. */
static void read_trailer(const char *data, size_t n, int *status, char *message, size_t size)
{
    int got = -1;

    dlock__etcd_grpc_header(data, n, &got, message, size);
    if (got > 0 && *status <= 0)
        *status = got;
}

/* Why a stream that curl finished ended. */
static const char *end_reason(CURLcode res, int grpc_status, const char *grpc_message)
{
    return res != CURLE_OK ? curl_easy_strerror(res)
           : grpc_status > 0 && grpc_message[0] != '\0' ? grpc_message
                                                        : "the server ended the watch stream";
}

/* Add n bytes to the buffer *buf (*len used of *cap), growing it up to max
 * bytes: 0, or -1 when it would be longer or memory ran out. */
static int append(char **buf, size_t *len, size_t *cap, const char *data, size_t n, size_t max)
{
    if (*len + n > *cap) {
        size_t c = *cap ? *cap : 1024;
        char *grown;
        while (c < *len + n)
            c *= 2;
        if (c > max || (grown = realloc(*buf, c)) == NULL)
            return -1;
        *buf = grown;
        *cap = c;
    }
    memcpy(*buf + *len, data, n);
    *len += n;
    return 0;
}

static size_t on_header(char *data, size_t size, size_t n, void *arg)
{
    dlock__etcd_stream *s = arg;

    read_trailer(data, size * n, &s->grpc_status, s->grpc_message, sizeof(s->grpc_message));
    return size * n;
}

static size_t on_data(char *data, size_t size, size_t n, void *arg)
{
    dlock__etcd_stream *s = arg;
    size_t add = size * n, start = 0;

    if (append(&s->line, &s->len, &s->cap, data, add, LINE_MAX_BYTES) != 0) {
        set_failed(s, "watch reply too long");
        return 0;
    }
    if (s->grpc) {
        start = handle_frames(s);
        memmove(s->line, s->line + start, s->len - start);
        s->len -= start;
        return add;
    }
    for (size_t i = 0; i < s->len; i++) {
        if (s->line[i] != '\n')
            continue;
        if (i > start)
            handle_line(s, s->line + start, i - start);
        start = i + 1;
    }
    memmove(s->line, s->line + start, s->len - start);
    s->len -= start;
    return add;
}

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

static void notify(dlock__etcd_stream *s)
{
    uint64_t one = 1;
    ssize_t n = write(s->efd, &one, sizeof(one));
    (void)n; /* a full counter is a pending wake-up all the same */
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

/* s's WatchCreateRequest: from its next revision, with its watch_id when
 * it has one (on the hub's stream). */
static json_t *create_request(const dlock__etcd_stream *s)
{
    json_t *req = json_pack("{s:o, s:I}", "key", dlock__etcd_str(s->key), "start_revision",
                            (json_int_t)s->next_rev);

    if (req != NULL && s->id != 0)
        json_object_set_new(req, "watch_id", json_integer((json_int_t)s->id));
    if (req != NULL && s->range_end != NULL)
        json_object_set_new(req, "range_end", dlock__etcd_str(s->range_end));
    else if (req != NULL)
        json_object_set_new(req, "filters", json_pack("[s]", "NOPUT"));
    return req != NULL ? json_pack("{s:o}", "create_request", req) : NULL;
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
        set_failed(s, why);
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
    if (append(&h->in, &h->ilen, &h->icap, data, add, 4 * LINE_MAX_BYTES) != 0)
        return 0;
    while ((got = dlock__etcd_grpc_frame((const uint8_t *)h->in, h->ilen, &pos, LINE_MAX_BYTES,
                                         &msg, &len)) == 1) {
        const char *why;
        json_t *j = watch_response(msg, len, &why);
        int64_t id = 0;
        dlock__etcd_stream *s;

        if (j == NULL)
            return 0;
        /* watch_id 0 is left out of the JSON (a zero field): no watch of
         * ours has it, ids start at 1. */
        if (dlock__etcd_int(j, "watch_id", &id) == 0 && (s = hub_find(h, id)) != NULL) {
            int before = s->state;
            handle_result(s, j);
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

    read_trailer(data, size * n, &h->grpc_status, h->grpc_message, sizeof(h->grpc_message));
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
        if (hub_queue(h, create_request(s)) != DLOCK_OK) {
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
                         end_reason(msg->data.result, h->grpc_status, h->grpc_message));
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
static int hub_open(dlock__etcd_hub *h, dlock__etcd_stream *s)
{
    int rc = DLOCK_OK;

    if ((s->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0)
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
            rc = hub_queue(h, create_request(s));
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
static void hub_close(dlock__etcd_stream *s)
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

static int hub_wait(dlock__etcd_stream *s, int64_t timeout_ms, int wake_fd)
{
    int64_t end = dlock__now_ms() + (timeout_ms > 0 ? timeout_ms : 0);

    for (int woken = 0;;) {
        struct pollfd fds[2] = {{s->efd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
        int64_t left;
        uint64_t v;
        int state;

        pthread_mutex_lock(&s->hub->mu);
        state = s->state;
        pthread_mutex_unlock(&s->hub->mu);
        left = end - dlock__now_ms();
        if (state != DLOCK__ETCD_STREAM_RUNNING || left <= 0 || woken)
            return state;
        if (poll(fds, wake_fd >= 0 ? 2 : 1, left > INT32_MAX ? INT32_MAX : (int)left) < 0 &&
            errno != EINTR)
            return state;
        if (fds[0].revents != 0 && read(s->efd, &v, sizeof(v)) < 0) {
            /* nothing: the look at the state comes next */
        }
        woken = wake_fd >= 0 && fds[1].revents != 0;
    }
}

int dlock__etcd_stream_open(dlock__etcd_stream **out, dlock__etcd *e, const char *key,
                            const char *range_end, int64_t start_rev)
{
    dlock__etcd_stream *s;
    json_t *req;
    char *body = NULL;
    int rc;

    *out = NULL;
    s = calloc(1, sizeof(*s));
    if (s == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    s->efd = -1;
    s->key_len = strlen(key);
    s->key = strdup(key);
    s->range_end = range_end != NULL ? strdup(range_end) : NULL;
    s->endpoint = dlock__etcd_current(e);
    s->next_rev = start_rev;
    s->grpc = dlock__etcd_is_grpc(e);
    s->grpc_status = -1;
    if (s->grpc) {
        dlock__etcd_hub *h = NULL;
        if (s->key == NULL || (range_end != NULL && s->range_end == NULL))
            rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
        else if ((rc = dlock__etcd_watch_hub(e, &h)) == DLOCK_OK)
            rc = hub_open(h, s);
        if (rc != DLOCK_OK) {
            dlock__etcd_stream_close(s);
            return rc;
        }
        *out = s;
        return DLOCK_OK;
    }
    req = s->key != NULL && (range_end == NULL || s->range_end != NULL) ? create_request(s) : NULL;
    if (req != NULL)
        body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    s->multi = curl_multi_init();
    s->easy = curl_easy_init();
    if (s->key == NULL || body == NULL || s->multi == NULL || s->easy == NULL) {
        rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
        goto err;
    }
    if ((rc = dlock__etcd_setup_stream(e, s->easy, s->endpoint, "/v3/watch", body,
                                       &s->headers)) != DLOCK_OK)
        goto err;
    curl_easy_setopt(s->easy, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(s->easy, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(s->easy, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(s->easy, CURLOPT_HEADERDATA, s);
    if (curl_multi_add_handle(s->multi, s->easy) != CURLM_OK) {
        rc = dlock__fail(DLOCK_ENOMEM, "cannot start a watch stream");
        goto err;
    }
    free(body);
    *out = s;
    return DLOCK_OK;

err:
    free(body);
    dlock__etcd_stream_close(s);
    return rc;
}

int dlock__etcd_stream_wait(dlock__etcd_stream *s, int64_t timeout_ms, int wake_fd)
{
    int64_t end = dlock__now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    struct curl_waitfd extra = {wake_fd, CURL_WAIT_POLLIN, 0};

    if (s->hub != NULL)
        return hub_wait(s, timeout_ms, wake_fd);

    for (;;) {
        int running = 0, left_msgs;
        dlock__sigpipe_guard guard;
        CURLMsg *msg;
        int64_t left;
        CURLMcode mrc;

        dlock__sigpipe_block(&guard);
        mrc = curl_multi_perform(s->multi, &running);
        dlock__sigpipe_restore(&guard);
        if (mrc != CURLM_OK)
            set_failed(s, "curl multi failed");
        while ((msg = curl_multi_info_read(s->multi, &left_msgs)) != NULL) {
            if (msg->msg == CURLMSG_DONE)
                set_failed(s, end_reason(msg->data.result, s->grpc_status, s->grpc_message));
        }
        if (s->state != DLOCK__ETCD_STREAM_RUNNING)
            return s->state;
        left = end - dlock__now_ms();
        if (left <= 0)
            return s->state;
        extra.revents = 0;
        /* 100 ms at most: libcurl 7.88 can hold an HTTP/2 frame it already
         * read without the socket waking the poll (etcd_request.c,
         * dlock__etcd_run); a watch event must not wait for the next one. */
        if (curl_multi_poll(s->multi, wake_fd >= 0 ? &extra : NULL, wake_fd >= 0 ? 1 : 0,
                            left > 100 ? 100 : (int)left, NULL) != CURLM_OK)
            set_failed(s, "curl multi poll failed");
        if (extra.revents != 0)
            return s->state;
    }
}

/* A stream on the hub is the hub thread's to change: its fields are read
 * and written under the hub's mutex. */
static void guard_lock(const dlock__etcd_stream *s)
{
    if (s->hub != NULL)
        pthread_mutex_lock(&s->hub->mu);
}

static void guard_unlock(const dlock__etcd_stream *s)
{
    if (s->hub != NULL)
        pthread_mutex_unlock(&s->hub->mu);
}

void dlock__etcd_stream_rearm(dlock__etcd_stream *s)
{
    guard_lock(s);
    if (s->state == DLOCK__ETCD_STREAM_DELETED)
        s->state = DLOCK__ETCD_STREAM_RUNNING;
    guard_unlock(s);
}

int64_t dlock__etcd_stream_next_rev(const dlock__etcd_stream *s)
{
    int64_t rev;

    guard_lock(s);
    rev = s->next_rev;
    guard_unlock(s);
    return rev;
}

size_t dlock__etcd_stream_endpoint(const dlock__etcd_stream *s)
{
    size_t endpoint;

    guard_lock(s);
    endpoint = s->endpoint;
    guard_unlock(s);
    return endpoint;
}

void dlock__etcd_stream_close(dlock__etcd_stream *s)
{
    if (s == NULL)
        return;
    if (s->hub != NULL)
        hub_close(s);
    if (s->efd >= 0)
        close(s->efd);
    free(s->range_end);
    if (s->multi != NULL && s->easy != NULL)
        curl_multi_remove_handle(s->multi, s->easy);
    if (s->easy != NULL)
        curl_easy_cleanup(s->easy);
    if (s->multi != NULL)
        curl_multi_cleanup(s->multi);
    dlock__etcd_headers_free(s->headers);
    free(s->key);
    free(s->line);
    free(s);
}
