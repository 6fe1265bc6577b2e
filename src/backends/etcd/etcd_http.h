/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * etcd v3 over libcurl: the endpoint list and failover, the timeouts, TLS,
 * the auth token, and a pool of connections.
 *
 * Every request is written as one JSON object for a /v3/... path of etcd's
 * JSON gateway, and every reply read as the gateway's JSON: bytes fields
 * base64-encoded, int64 fields as strings, every field whose value is zero
 * (false, 0, "", empty list) left out; the helpers in etcd_codec.h read
 * replies that way. By default they travel as gRPC (HTTP/2, protobuf): the
 * path names the method and etcd_grpc.c transcodes both ways; with
 * transport=gateway the JSON itself goes to the gateway over HTTP/1.1.
 *
 * A call has one time budget, command_timeout_ms. When the endpoint in use
 * cannot be reached or answers "unavailable" (no leader, request timed out,
 * leader changed), the next endpoint is tried with what is left of the
 * budget; the endpoint that answered becomes the one in use for every later
 * call of the client. So every request sent through here must be safe to
 * repeat: the backend's requests are written that way (see etcd.c).
 */
#ifndef DLOCK_ETCD_HTTP_H
#define DLOCK_ETCD_HTTP_H

#include <curl/curl.h>
#include <jansson.h>
#include <stdint.h>

#include "dlock/sys/backend.h"

typedef struct dlock__etcd dlock__etcd;

/* gRPC status codes, from grpc-status, or as the gateway reports them in
 * an error reply's "code" (or "grpc_code"). Only those the backend acts on are named. */
typedef enum {
    DLOCK__GRPC_OK = 0,
    DLOCK__GRPC_CANCELLED = 1,
    DLOCK__GRPC_UNKNOWN = 2,
    DLOCK__GRPC_INVALID_ARGUMENT = 3,
    DLOCK__GRPC_DEADLINE_EXCEEDED = 4,
    DLOCK__GRPC_NOT_FOUND = 5,
    DLOCK__GRPC_PERMISSION_DENIED = 7,
    DLOCK__GRPC_RESOURCE_EXHAUSTED = 8,
    DLOCK__GRPC_FAILED_PRECONDITION = 9,
    DLOCK__GRPC_UNAVAILABLE = 14,
    DLOCK__GRPC_UNAUTHENTICATED = 16
} dlock__grpc_status;

/* One HTTP connection (a curl easy handle) and what its last call left. Used
 * by one thread at a time. */
typedef struct dlock__etcd_conn {
    CURL *easy;
    char *buf; /* the reply body */
    size_t len, cap;
    char errbuf[CURL_ERROR_SIZE];
    /* The gRPC status of the last error reply, DLOCK__GRPC_OK when the
     * last call got none. */
    dlock__grpc_status grpc_code;
    char grpc_message[200];
    struct curl_slist *headers; /* of the request in flight */
    /* gRPC: the request's framed messages, its method's reply type, and
     * whether a grpc-status came (in the headers or the trailers). */
    uint8_t *frames;
    size_t frames_len;
    const void *reply_type; /* a ProtobufCMessageDescriptor */
    int got_status;
    int secret; /* the request or reply holds a password or a token */
    /* The endpoints (bit i: endpoint i) to which the connection cache of
     * the multi handle has an HTTP/2 connection; H2_RESET: the cache is to
     * be emptied before the next request. Points into the owner of the
     * multi handle (a twin shares its pair's). See dlock__etcd_prepare for
     * why it matters. */
    unsigned h2_state, *h2;
    const uint8_t *preset; /* a gRPC body built by the caller (the login's) */
    size_t preset_len;
    /* gRPC: the body of dlock__etcd_call's request, packed from its JSON
     * object once for every attempt (a login's preset comes first). */
    const uint8_t *packed;
    size_t packed_len;
    int reusing; /* the request in flight counts on that connection */
    CURLM *multi;                  /* runs the transfers, keeps the connections */
    struct dlock__etcd_conn *twin; /* the second handle of a pair, on multi */
    struct dlock__etcd_conn *next; /* in the idle pool */
} dlock__etcd_conn;

/*
 * Parse the URL (etcd://, etcds://) and options; no I/O. DLOCK_EINVAL for a
 * malformed URL or unknown parameter, DLOCK_ENOMEM.
 */
int dlock__etcd_new(dlock__etcd **out, const dlock_url *url, const dlock_client_options *opts);
void dlock__etcd_free(dlock__etcd *e);

/* Log in (when the URL has a user) and check that an endpoint answers. */
int dlock__etcd_connect(dlock__etcd *e);

/* A connection from the pool (a new one when the pool is empty), and back. */
int dlock__etcd_conn_get(dlock__etcd *e, dlock__etcd_conn **out);
void dlock__etcd_conn_put(dlock__etcd *e, dlock__etcd_conn *c);
/* A connection of one's own (the watchdog's), and its end. */
int dlock__etcd_conn_new(dlock__etcd *e, dlock__etcd_conn **out);
void dlock__etcd_conn_free(dlock__etcd_conn *c);

/*
 * POST req (not consumed) to path ("/v3/kv/txn") and parse the reply into
 * *out (the caller json_decref's it). On an error reply, c->grpc_code and
 * c->grpc_message say which and the return code is:
 *   DLOCK_ECONN    no endpoint could be reached or was available in time
 *   DLOCK_EAUTH    credentials refused, token could not be renewed, or
 *                  permission denied
 *   DLOCK_ESERVER  the server refused the request (c->grpc_code says why)
 *   DLOCK_EPROTO   the reply is not etcd's (not gRPC's framing or HTTP
 *                  status, not the method's message; gateway: not JSON)
 *   DLOCK_EINVAL   req does not fit the method's message (a bug of dlock's:
 *                  the message names the field)
 * with a message naming the endpoint ("etcd 127.0.0.1:2379: ...").
 */
int dlock__etcd_call(dlock__etcd *e, dlock__etcd_conn *c, const char *path, json_t *req,
                     json_t **out);

/*
 * POST body (one or more JSON objects) to a streaming path
 * ("/v3/lease/keepalive") and collect the replies: *results is an array of
 * every {"result": ...} the server sent. Errors as dlock__etcd_call.
 */
int dlock__etcd_call_stream(dlock__etcd *e, dlock__etcd_conn *c, const char *path,
                            const char *body, json_t **results);

/*
 * Two requests at once on c, on one endpoint over two connections: one round trip
 * where two are needed and neither depends on the other (a waiter's keepalive
 * and its txn). A request that fails on the way is sent again alone, with
 * failover, so both must be safe to repeat. rc[i] and out[i] as for
 * dlock__etcd_call (stream[i]: as dlock__etcd_call_stream, body[i] the raw
 * body); returns the first error, or DLOCK_OK.
 */
typedef struct {
    const char *path[2];
    const char *body[2];
    int stream[2];
    json_t *out[2];
    int rc[2];
    dlock__grpc_status grpc_code[2];
} dlock__etcd_pair;

int dlock__etcd_call_pair(dlock__etcd *e, dlock__etcd_conn *c, dlock__etcd_pair *p);

/* ---- without blocking: the asynchronous API's loop (etcd_loop.c) ------- */

/*
 * Requests sent on one curl multi handle of their own, driven by the loop's
 * thread through dlock__etcd_loop_step: several at once multiplexed on one
 * HTTP/2 connection, no thread of the backend's between the caller and the
 * server. Each request goes to the endpoint in use, once, within
 * command_timeout_ms: no failover and no login, which block. Its callback
 * runs from dlock__etcd_loop_step, on the loop's thread, with rc:
 *   DLOCK_OK        reply holds the answer (the callback's to json_decref)
 *   DLOCK_ENOTSUP   not done, for sure (the connection was refused, the
 *                   token is to be renewed, an HTTP/2 connection curl had
 *                   dropped): the blocking call does it, with failover
 *   anything else   as dlock__etcd_call returns it, grpc_code its gRPC
 *                   status (DLOCK_ECONN: it may have been done)
 * and the thread's message set when rc is not DLOCK_OK.
 */
typedef struct dlock__etcd_loop dlock__etcd_loop;
typedef void (*dlock__etcd_loop_cb)(void *arg, int rc, json_t *reply,
                                    dlock__grpc_status grpc_code);

int dlock__etcd_loop_new(dlock__etcd *e, dlock__etcd_loop **out);
/* Requests still on their way are dropped, their callbacks never called. */
void dlock__etcd_loop_free(dlock__etcd_loop *l);

/* Send req (consumed) to path. DLOCK_OK, and cb called once later; else
 * nothing was sent, cb is never called: DLOCK_ENOTSUP when the loop cannot
 * send it now (the first connection to the endpoint is being made for
 * another request, or must be made afresh while others are on their way). */
int dlock__etcd_loop_send(dlock__etcd_loop *l, const char *path, json_t *req,
                          dlock__etcd_loop_cb cb, void *arg);

/* The descriptors to watch for readability (the backend's async_fds), and
 * one step: read what came, run the callbacks of what ended, fail what
 * timed out; returns when to step again at the latest (lease-clock ms), -1
 * when nothing is on its way. */
int dlock__etcd_loop_fds(dlock__etcd_loop *l, int *fds, unsigned *gens, int max);
int64_t dlock__etcd_loop_step(dlock__etcd_loop *l);

/* ---- for the watch streams (etcd_watch.c) ---------------------------- */

/* The endpoint in use now, and its name for messages ("etcd 127.0.0.1:2379"). */
size_t dlock__etcd_current(dlock__etcd *e);
const char *dlock__etcd_where(const dlock__etcd *e, size_t endpoint);
/* The endpoint failed a streaming request: move on to the next one, unless
 * some other call already did. */
void dlock__etcd_endpoint_failed(dlock__etcd *e, size_t endpoint);

/*
 * Prepare easy (a handle of the caller's) for a streaming POST of body to
 * path on endpoint: TLS, auth header, connect timeout, no total timeout. The
 * header list is returned in *headers for the caller to free with
 * dlock__etcd_headers_free after the transfer.
 */
/* Free a header list of this backend's, wiping each line first: one holds
 * the auth token, and curl_slist_free_all frees its copy as it is. NULL is
 * a no-op. */
void dlock__etcd_headers_free(struct curl_slist *headers);

int dlock__etcd_setup_stream(dlock__etcd *e, CURL *easy, size_t endpoint, const char *path,
                             const char *body, struct curl_slist **headers);

/* 1 when the client speaks gRPC (the default), 0 for the JSON gateway
 * (transport=gateway): a stream's body is framed protobuf then. */
int dlock__etcd_is_grpc(const dlock__etcd *e);

#endif
