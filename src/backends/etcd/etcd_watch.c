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
 *
 * Here: reading a stream's replies, and a stream's calls (etcd_watch.h);
 * over gRPC the stream is a watch on the client's hub (etcd_watch_hub.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/etcd/etcd_codec.h"
#include "backends/etcd/etcd_grpc.h"
#include "backends/etcd/etcd_watch_int.h"
#include "etcd/etcdserver/etcdserverpb/rpc.pb-c.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/thread.h"

void dlock__etcd_stream_set_failed(dlock__etcd_stream *s, const char *why)
{
    if (s->state == DLOCK__ETCD_STREAM_RUNNING) {
        s->state = DLOCK__ETCD_STREAM_FAILED;
        snprintf(s->error, sizeof(s->error), "%s", why);
    }
}

/* One WatchResponse, in the gateway's JSON (over gRPC: transcoded). */
void dlock__etcd_stream_handle_result(dlock__etcd_stream *s, const json_t *result)
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
        dlock__etcd_stream_set_failed(s, "not a JSON watch reply");
        return;
    }
    err = json_object_get(j, "error");
    result = json_object_get(j, "result");
    if (err != NULL || !json_is_object(result)) {
        const json_t *m = json_is_object(err) ? json_object_get(err, "message") : err;
        dlock__etcd_stream_set_failed(s, json_is_string(m) ? json_string_value(m)
                                                           : "watch refused");
        json_decref(j);
        return;
    }
    dlock__etcd_stream_handle_result(s, result);
    json_decref(j);
}

/* A WatchResponse message in the gateway's JSON; NULL with *why. */
json_t *dlock__etcd_watch_response(const uint8_t *msg, size_t len, const char **why)
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

    while ((got = dlock__etcd_grpc_frame(buf, s->len, &pos, DLOCK__ETCD_WATCH_LINE_MAX, &msg,
                                         &len)) == 1) {
        const char *why;
        json_t *j = dlock__etcd_watch_response(msg, len, &why);
        if (j == NULL) {
            dlock__etcd_stream_set_failed(s, why);
            return pos;
        }
        dlock__etcd_stream_handle_result(s, j);
        json_decref(j);
    }
    if (got < 0)
        dlock__etcd_stream_set_failed(s, "watch reply too long or compressed");
    return pos;
}

/* gRPC's status and message, in the trailers when etcd ends a stream:
 * the first status that is not OK is kept. */
void dlock__etcd_watch_read_trailer(const char *data, size_t n, int *status, char *message,
                                    size_t size)
{
    int got = -1;

    dlock__etcd_grpc_header(data, n, &got, message, size);
    if (got > 0 && *status <= 0)
        *status = got;
}

/* Why a stream that curl finished ended. */
const char *dlock__etcd_watch_end_reason(CURLcode res, int grpc_status,
                                         const char *grpc_message)
{
    return res != CURLE_OK ? curl_easy_strerror(res)
           : grpc_status > 0 && grpc_message[0] != '\0' ? grpc_message
                                                        : "the server ended the watch stream";
}

/* Add n bytes to the buffer *buf (*len used of *cap), growing it up to max
 * bytes: 0, or -1 when it would be longer or memory ran out. */
int dlock__etcd_watch_append(char **buf, size_t *len, size_t *cap, const char *data, size_t n,
                             size_t max)
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

    dlock__etcd_watch_read_trailer(data, size * n, &s->grpc_status, s->grpc_message,
                                   sizeof(s->grpc_message));
    return size * n;
}

static size_t on_data(char *data, size_t size, size_t n, void *arg)
{
    dlock__etcd_stream *s = arg;
    size_t add = size * n, start = 0;

    if (dlock__etcd_watch_append(&s->line, &s->len, &s->cap, data, add,
                                 DLOCK__ETCD_WATCH_LINE_MAX) != 0) {
        dlock__etcd_stream_set_failed(s, "watch reply too long");
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

/* s's WatchCreateRequest: from its next revision, with its watch_id when
 * it has one (on the hub's stream). */
json_t *dlock__etcd_watch_create_request(const dlock__etcd_stream *s)
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

int dlock__etcd_stream_open(dlock__etcd_stream **out, dlock__etcd *e, const char *key,
                            const char *range_end, int64_t start_rev, int wake_fd,
                            void (*notify)(void *), void *arg)
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
    s->wake_fd = wake_fd;
    s->notify = notify;
    s->notify_arg = arg;
    s->key_len = strlen(key);
    s->key = strdup(key);
    s->range_end = range_end != NULL ? strdup(range_end) : NULL;
    s->endpoint = dlock__etcd_current(e);
    s->next_rev = start_rev;
    s->grpc = dlock__etcd_is_grpc(e);
    s->grpc_status = -1;
    if (notify != NULL && !s->grpc) {
        dlock__etcd_stream_close(s);
        return dlock__fail(DLOCK_EMISUSE, "a gateway watch stream tells nobody of a change");
    }
    if (s->grpc) {
        dlock__etcd_hub *h = NULL;
        if (s->key == NULL || (range_end != NULL && s->range_end == NULL))
            rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
        else if ((rc = dlock__etcd_watch_hub(e, &h)) == DLOCK_OK)
            rc = dlock__etcd_hub_open(h, s);
        if (rc != DLOCK_OK) {
            dlock__etcd_stream_close(s);
            return rc;
        }
        *out = s;
        return DLOCK_OK;
    }
    req = s->key != NULL && (range_end == NULL || s->range_end != NULL)
              ? dlock__etcd_watch_create_request(s)
              : NULL;
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
        return dlock__etcd_hub_wait(s, timeout_ms, wake_fd);

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
            dlock__etcd_stream_set_failed(s, "curl multi failed");
        while ((msg = curl_multi_info_read(s->multi, &left_msgs)) != NULL) {
            if (msg->msg == CURLMSG_DONE)
                dlock__etcd_stream_set_failed(
                    s, dlock__etcd_watch_end_reason(msg->data.result, s->grpc_status,
                                                    s->grpc_message));
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
            dlock__etcd_stream_set_failed(s, "curl multi poll failed");
        if (extra.revents != 0)
            return s->state;
    }
}


void dlock__etcd_stream_rearm(dlock__etcd_stream *s)
{
    dlock__etcd_stream_guard_lock(s);
    if (s->state == DLOCK__ETCD_STREAM_DELETED)
        s->state = DLOCK__ETCD_STREAM_RUNNING;
    dlock__etcd_stream_guard_unlock(s);
}

int64_t dlock__etcd_stream_next_rev(const dlock__etcd_stream *s)
{
    int64_t rev;

    dlock__etcd_stream_guard_lock(s);
    rev = s->next_rev;
    dlock__etcd_stream_guard_unlock(s);
    return rev;
}

size_t dlock__etcd_stream_endpoint(const dlock__etcd_stream *s)
{
    size_t endpoint;

    dlock__etcd_stream_guard_lock(s);
    endpoint = s->endpoint;
    dlock__etcd_stream_guard_unlock(s);
    return endpoint;
}

void dlock__etcd_stream_close(dlock__etcd_stream *s)
{
    if (s == NULL)
        return;
    if (s->hub != NULL)
        dlock__etcd_hub_close(s);
    if (s->efd >= 0 && s->efd != s->wake_fd)
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
