/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the two files of the etcd watch share (etcd_watch.h): a stream's
 * state, reading its replies (etcd_watch.c), and putting it on the hub's
 * Watch stream (etcd_watch_hub.c). Private to src/backends/etcd.
 */
#ifndef DLOCK_ETCD_WATCH_INT_H
#define DLOCK_ETCD_WATCH_INT_H

#include <jansson.h>
#include <stdint.h>

#include "backends/etcd/etcd_watch.h"

/* A line longer than this is not a watch reply for one key. */
#define DLOCK__ETCD_WATCH_LINE_MAX (1024 * 1024)

struct dlock__etcd_stream {
    /* Over gRPC, a watch of the client's one Watch stream (the hub, etcd_watch_hub.c):
     * state, next_rev and error are the hub's to change, under its mutex,
     * and efd is written when state changes. */
    dlock__etcd_hub *hub;
    int64_t id;      /* its watch_id on the hub's stream */
    int efd;         /* wake_fd when the caller gave one (not ours to close);
                      * -1 when notify alone tells of a change */
    int wake_fd;
    void (*notify)(void *); /* dlock__etcd_stream_open's, called by the hub */
    void *notify_arg;
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

/* ---- etcd_watch.c: a stream's replies ------------------------------------ */

void dlock__etcd_stream_set_failed(dlock__etcd_stream *s, const char *why);
/* One WatchResponse, in the gateway's JSON (over gRPC: transcoded). */
void dlock__etcd_stream_handle_result(dlock__etcd_stream *s, const json_t *result);
/* A WatchResponse message in the gateway's JSON; NULL with *why. */
json_t *dlock__etcd_watch_response(const uint8_t *msg, size_t len, const char **why);
/* gRPC's status and message, in the trailers when etcd ends a stream:
 * the first status that is not OK is kept. */
void dlock__etcd_watch_read_trailer(const char *data, size_t n, int *status, char *message,
                                    size_t size);
/* Why a stream that curl finished ended. */
const char *dlock__etcd_watch_end_reason(CURLcode res, int grpc_status,
                                         const char *grpc_message);
/* Add n bytes to the buffer *buf (*len used of *cap), growing it up to max
 * bytes: 0, or -1 when it would be longer or memory ran out. */
int dlock__etcd_watch_append(char **buf, size_t *len, size_t *cap, const char *data, size_t n,
                             size_t max);
/* s's WatchCreateRequest: from its next revision, with its watch_id when
 * it has one (on the hub's stream). */
json_t *dlock__etcd_watch_create_request(const dlock__etcd_stream *s);

/* ---- etcd_watch_hub.c: the hub ------------------------------------------- */

/* Put s on the client's stream (started if need be). */
int dlock__etcd_hub_open(dlock__etcd_hub *h, dlock__etcd_stream *s);
/* Take s off the stream: a cancel request when it is still on it. */
void dlock__etcd_hub_close(dlock__etcd_stream *s);
int dlock__etcd_hub_wait(dlock__etcd_stream *s, int64_t timeout_ms, int wake_fd);
/* A stream on the hub is the hub thread's to change: its fields are read
 * and written under the hub's mutex. */
void dlock__etcd_stream_guard_lock(const dlock__etcd_stream *s);
void dlock__etcd_stream_guard_unlock(const dlock__etcd_stream *s);

#endif
