/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What etcd_http.c (the client: endpoints, connection pool, failover, login)
 * and etcd_request.c (one request on one endpoint) share: the client's
 * state, and the steps of one attempt with what the caller does after it.
 * Private to those two files; the rest of the backend uses etcd_http.h.
 */
#ifndef DLOCK_ETCD_HTTP_INT_H
#define DLOCK_ETCD_HTTP_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "backends/etcd/etcd_http.h"

#define DLOCK__ETCD_MAX_ENDPOINTS 16

typedef struct {
    char base[320];  /* "http://127.0.0.1:2379" */
    char where[300]; /* "etcd 127.0.0.1:2379" */
} dlock__etcd_endpoint;

struct dlock__etcd {
    dlock__etcd_endpoint eps[DLOCK__ETCD_MAX_ENDPOINTS];
    size_t neps;
    atomic_size_t current;
    int tls;                          /* etcds:// */
    int grpc;                         /* gRPC; 0: the JSON gateway (transport=gateway) */
    const char *cacert, *cert, *key; /* borrowed from the client's URL */
    const char *proxy;               /* proxy=, borrowed too; NULL: none */
    const char *user, *password;
    int64_t connect_timeout_ms;
    int64_t command_timeout_ms;
    char user_agent[128];

    pthread_mutex_t mu; /* guards idle, nidle, token, token_gen */
    dlock__etcd_conn *idle;
    int nidle;
    /* Connections of the pool in callers' hands (conn_get until conn_put),
     * at most OUT_MAX at a time: a caller beyond waits on out_cond. */
    int nout;
    pthread_cond_t out_cond;
    char *token;
    unsigned long token_gen;
    pthread_mutex_t login_mu; /* one login at a time */
    struct dlock__etcd_hub *hub; /* the watches' stream (etcd_watch_hub.c); under mu */
};

/* What to do after an attempt. DLOCK__ETCD_TRY_REFUSED is
 * DLOCK__ETCD_TRY_NEXT_ENDPOINT for an endpoint where nothing listens. */
enum {
    DLOCK__ETCD_TRY_DONE,
    DLOCK__ETCD_TRY_NEXT_ENDPOINT,
    DLOCK__ETCD_TRY_REFUSED,
    DLOCK__ETCD_TRY_LOGIN,
    DLOCK__ETCD_TRY_AGAIN /* at once, on the same endpoint (a new connection) */
};

/* Endpoint idx answered a call: the one in use from now on, for the
 * client's later calls. */
void dlock__etcd_answered(dlock__etcd *e, size_t idx);

/* A connection without a multi handle (the caller sets multi and h2). */
dlock__etcd_conn *dlock__etcd_conn_alloc(dlock__etcd *e);

/* req for path as it travels: packed (gRPC; free it) or body (the
 * gateway's JSON, or a method gRPC does not know; free it). */
int dlock__etcd_encode(dlock__etcd *e, const char *path, const json_t *req, uint8_t **packed,
                       size_t *len, char **body);

/* The header list of a request (stream: of a watch or keepalive stream),
 * with the auth token when with_token and its generation in *gen. NULL when
 * out of memory. */
struct curl_slist *dlock__etcd_headers(dlock__etcd *e, int with_token, unsigned long *gen,
                                       int stream);

/* In dlock__etcd_conn.h2: the connections of the cache are in a state
 * unknown (a request failed on one, or one was lost): close them all. */
#define DLOCK__ETCD_H2_RESET 0x80000000u

/* Empty c's connection cache when DLOCK__ETCD_H2_RESET says so. */
int dlock__etcd_h2_check(dlock__etcd_conn *c);

/* Free c's gRPC request body, wiped first when it held a secret. */
void dlock__etcd_frames_free(dlock__etcd_conn *c);

/* Set up c for one request to endpoint idx; the headers are kept in c until
 * dlock__etcd_finish. */
int dlock__etcd_prepare(dlock__etcd *e, dlock__etcd_conn *c, size_t idx, const char *path,
                        const char *body, int64_t budget_ms, int with_token, unsigned long *gen);

/* Run the transfers of easy[0..n) on multi to their end; res[i] is each
 * one's result. */
void dlock__etcd_run(CURLM *multi, CURL **easy, size_t n, CURLcode *res);

/* Judge a finished transfer: returns what to do next (DLOCK__ETCD_TRY_*),
 * sets *rc and *out. */
int dlock__etcd_finish(dlock__etcd *e, dlock__etcd_conn *c, size_t idx, const char *path,
                       CURLcode res, int64_t budget_ms, int stream, json_t **out, int *rc);

/* prepare, run and finish one request on endpoint idx. */
int dlock__etcd_attempt(dlock__etcd *e, dlock__etcd_conn *c, size_t idx, const char *path,
                        const char *body, int64_t budget_ms, int with_token, int stream,
                        unsigned long *gen, json_t **out, int *rc);

#endif
