/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Requests sent without blocking, for the asynchronous API's loop
 * (etcd_http.h, "without blocking"). One curl multi handle, driven through
 * curl's socket interface: the socket callback says which descriptors curl
 * uses (the loop watches them), and each step hands every one of them to
 * curl_multi_socket_action, which reads what came and sends what waits.
 * Requests to one endpoint share one HTTP/2 connection, several at once.
 *
 * A request is one attempt on the endpoint in use, judged as a blocking
 * call's attempt is (dlock__etcd_finish). What a blocking call would do
 * next, another endpoint, a login, a pause, blocks or takes a while: the
 * request ends there, and the caller hands it to the blocking call
 * (DLOCK_ENOTSUP when it was not done for sure).
 *
 * Locking: mu guards the multi handle, the list of requests and the
 * sockets. Callbacks run with mu let go, so that they may send again.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/etcd/etcd_http_int.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/thread.h"

/* At most this long between steps while a request is on its way: Debian
 * 12's libcurl (7.88) can keep an HTTP/2 reply it already read in its own
 * buffers, with nothing left on the socket to wake the loop (see
 * dlock__etcd_run). */
#define STEP_CAP_MS 20

/* Sockets reported to the loop, at most (one per endpoint connected). */
#define SOCKETS 4

/* Handles kept for the next requests, at most. */
#define IDLE_MAX 16

typedef struct sent {
    dlock__etcd_conn *c; /* its easy handle, on the loop's multi */
    char path[48];
    uint8_t *packed; /* the request, gRPC */
    size_t packed_len;
    char *body;      /* or the gateway's JSON */
    size_t idx;      /* the endpoint */
    int64_t budget_ms;
    dlock__etcd_loop_cb cb; /* NULL: the loop's own (a connection to make) */
    void *arg;
    /* Filled when it ends: */
    int rc;
    json_t *reply;
    dlock__grpc_status grpc_code;
    char msg[400];
    /* In l->flying (prev: the pointer that points here), or in a step's
     * list of ended requests. */
    struct sent *next, **prev;
} sent;

struct dlock__etcd_loop {
    dlock__etcd *e;
    pthread_mutex_t mu;
    CURLM *multi;
    unsigned h2;    /* as dlock__etcd_conn.h2, for the connections of multi */
    unsigned ready; /* bit i: a connection to endpoint i answered, and none failed since */
    sent *flying;
    dlock__etcd_conn *idle; /* handles of requests that ended, for reuse */
    int nidle;
    struct {
        int fd;
        unsigned gen;
        int what; /* CURL_POLL_IN, _OUT, _INOUT */
    } socks[SOCKETS];
    int nsocks;
    unsigned gen;
};

/* curl's socket callback: the descriptors it uses, and for what. */
static int on_socket(CURL *easy, curl_socket_t s, int what, void *arg, void *socketp)
{
    dlock__etcd_loop *l = arg;
    int i;

    (void)easy;
    (void)socketp;
    for (i = 0; i < l->nsocks && l->socks[i].fd != (int)s; i++)
        ;
    if (what == CURL_POLL_REMOVE) {
        if (i < l->nsocks)
            l->socks[i] = l->socks[--l->nsocks];
        return 0;
    }
    if (i == l->nsocks) {
        if (l->nsocks == SOCKETS)
            return 0; /* not watched: the step cap finds what it has */
        l->socks[i].fd = (int)s;
        l->socks[i].gen = ++l->gen;
        l->nsocks++;
    }
    l->socks[i].what = what;
    return 0;
}

static int multi_new(dlock__etcd_loop *l)
{
    if ((l->multi = curl_multi_init()) == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory (curl multi)");
    curl_multi_setopt(l->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(l->multi, CURLMOPT_SOCKETDATA, l);
    /* As many connections as the loop watches: over HTTP/2 one carries the
     * requests side by side; over HTTP/1.1 (the gateway) the rest wait for
     * one to be free, within their timeout, as a pool's callers do. */
    curl_multi_setopt(l->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)SOCKETS);
    l->nsocks = 0;
    l->h2 = 0;
    return DLOCK_OK;
}

int dlock__etcd_loop_new(dlock__etcd *e, dlock__etcd_loop **out)
{
    dlock__etcd_loop *l = calloc(1, sizeof(*l));

    *out = NULL;
    if (l == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    l->e = e;
    if (multi_new(l) != DLOCK_OK) {
        free(l);
        return DLOCK_ENOMEM;
    }
    pthread_mutex_init(&l->mu, NULL);
    *out = l;
    return DLOCK_OK;
}

static void conn_drop(dlock__etcd_conn *c)
{
    c->multi = NULL; /* the loop's */
    dlock__etcd_conn_free(c);
}

/* The handle goes back to the idle list, or is freed when the list holds
 * IDLE_MAX already: a burst of requests leaves no more behind (mu held). */
static void sent_free(dlock__etcd_loop *l, sent *s)
{
    if (s->c != NULL) {
        curl_multi_remove_handle(l->multi, s->c->easy);
        curl_easy_setopt(s->c->easy, CURLOPT_HTTPHEADER, NULL);
        dlock__etcd_headers_free(s->c->headers);
        s->c->headers = NULL;
        dlock__etcd_frames_free(s->c);
        if (l->nidle < IDLE_MAX) {
            s->c->next = l->idle;
            l->idle = s->c;
            l->nidle++;
        } else {
            conn_drop(s->c);
        }
    }
    free(s->packed);
    free(s->body);
    free(s);
}

void dlock__etcd_loop_free(dlock__etcd_loop *l)
{
    if (l == NULL)
        return;
    while (l->flying != NULL) {
        sent *s = l->flying;
        l->flying = s->next;
        sent_free(l, s);
    }
    while (l->idle != NULL) {
        dlock__etcd_conn *c = l->idle;
        l->idle = c->next;
        conn_drop(c);
    }
    curl_multi_cleanup(l->multi);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

/* Hand every socket to curl, and the timeouts due (mu held). */
static void drive(dlock__etcd_loop *l)
{
    dlock__sigpipe_guard guard;
    int fds[SOCKETS], n = l->nsocks, running;

    for (int i = 0; i < n; i++)
        fds[i] = l->socks[i].fd;
    dlock__sigpipe_block(&guard);
    /* 0: curl looks at the socket itself (the loop watched it for reading
     * only). A socket curl has closed meanwhile is ignored. */
    for (int i = 0; i < n; i++)
        curl_multi_socket_action(l->multi, fds[i], 0, &running);
    curl_multi_socket_action(l->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    dlock__sigpipe_restore(&guard);
}

/* A request for path (req consumed), encoded, in *out; not on its way yet. */
static int sent_new(dlock__etcd_loop *l, const char *path, json_t *req, dlock__etcd_loop_cb cb,
                    void *arg, sent **out)
{
    sent *s;
    int rc;

    *out = NULL;
    if (req == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    if ((s = calloc(1, sizeof(*s))) == NULL) {
        json_decref(req);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    rc = dlock__etcd_encode(l->e, path, req, &s->packed, &s->packed_len, &s->body);
    json_decref(req);
    if (rc != DLOCK_OK) {
        free(s);
        return rc;
    }
    snprintf(s->path, sizeof(s->path), "%s", path);
    s->idx = dlock__etcd_current(l->e);
    s->budget_ms = l->e->command_timeout_ms;
    s->cb = cb;
    s->arg = arg;
    *out = s;
    return DLOCK_OK;
}

/* Put s on its way (mu held); on failure s is the caller's to free. */
static int sent_add(dlock__etcd_loop *l, sent *s)
{
    dlock__etcd_conn *c;
    unsigned long gen;
    int rc;

    if ((c = l->idle) != NULL) {
        l->idle = c->next;
        l->nidle--;
        c->next = NULL;
    } else if ((c = dlock__etcd_conn_alloc(l->e)) == NULL) {
        return dlock__fail(DLOCK_ENOMEM, "out of memory (curl handle)");
    } else {
        c->h2 = &l->h2;
        /* Wait for the connection being made rather than make a second. */
        curl_easy_setopt(c->easy, CURLOPT_PIPEWAIT, 1L);
    }
    c->multi = l->multi; /* made afresh since, maybe */
    s->c = c;
    c->packed = s->packed;
    c->packed_len = s->packed_len;
    rc = dlock__etcd_prepare(l->e, c, s->idx, s->path, s->body != NULL ? s->body : "",
                             s->budget_ms, 1, &gen);
    c->packed = NULL;
    c->packed_len = 0;
    if (rc == DLOCK_OK && curl_multi_add_handle(l->multi, c->easy) != CURLM_OK)
        rc = dlock__fail(DLOCK_ENOMEM, "out of memory (curl multi)");
    if (rc != DLOCK_OK)
        return rc;
    /* The request of a transfer that ends, found at once (loop_step). */
    curl_easy_setopt(c->easy, CURLOPT_PRIVATE, (void *)s);
    s->next = l->flying;
    s->prev = &l->flying;
    if (l->flying != NULL)
        l->flying->prev = &s->next;
    l->flying = s;
    drive(l); /* on the wire now, where a connection is ready */
    return DLOCK_OK;
}

int dlock__etcd_loop_send(dlock__etcd_loop *l, const char *path, json_t *req,
                          dlock__etcd_loop_cb cb, void *arg)
{
    sent *s, *warm;
    int rc;

    if ((rc = sent_new(l, path, req, cb, arg, &s)) != DLOCK_OK)
        return rc;
    pthread_mutex_lock(&l->mu);
    if (l->h2 & DLOCK__ETCD_H2_RESET) {
        /* A request failed on a connection of the cache: they all go, as
         * dlock__etcd_h2_check does, once none is in use. */
        if (l->flying != NULL) {
            rc = DLOCK_ENOTSUP;
            goto out;
        }
        curl_multi_cleanup(l->multi);
        l->ready = 0;
        if ((rc = multi_new(l)) != DLOCK_OK)
            goto out;
    }
    if (!(l->ready & 1u << s->idx)) {
        /*
         * No connection known to work: the loop makes one with a request
         * of its own (Maintenance Status; whatever it answers), and this
         * request goes with the blocking call. Making it here would hang
         * the request on steps the loop takes only when a descriptor reads
         * or a timeout falls due; and two requests asking for HTTP/2 with
         * prior knowledge at once would make two connections, or trip
         * Debian 12's libcurl (see dlock__etcd_prepare).
         */
        if (l->flying == NULL &&
            sent_new(l, "/v3/maintenance/status", json_object(), NULL, NULL, &warm) ==
                DLOCK_OK &&
            sent_add(l, warm) != DLOCK_OK)
            sent_free(l, warm);
        rc = DLOCK_ENOTSUP;
        goto out;
    }
    if ((rc = sent_add(l, s)) == DLOCK_OK)
        s = NULL;
out:
    if (s != NULL)
        sent_free(l, s);
    pthread_mutex_unlock(&l->mu);
    return rc;
}

int dlock__etcd_loop_fds(dlock__etcd_loop *l, int *fds, unsigned *gens, int max)
{
    int n = 0;

    pthread_mutex_lock(&l->mu);
    for (int i = 0; i < l->nsocks && n < max; i++) {
        fds[n] = l->socks[i].fd;
        gens[n++] = l->socks[i].gen;
    }
    pthread_mutex_unlock(&l->mu);
    return n;
}

/* Judge s, whose transfer ended with res (mu held). */
static void judge(dlock__etcd_loop *l, sent *s, CURLcode res)
{
    int next = dlock__etcd_finish(l->e, s->c, s->idx, s->path, res, s->budget_ms, 0, &s->reply,
                                  &s->rc);

    s->grpc_code = s->c->grpc_code;
    if (res == CURLE_OK)
        l->ready |= 1u << s->idx;
    else
        l->ready &= ~(1u << s->idx);
    if (next == DLOCK__ETCD_TRY_DONE) {
        if (s->rc == DLOCK_OK)
            dlock__etcd_answered(l->e, s->idx);
    } else if (next == DLOCK__ETCD_TRY_REFUSED || next == DLOCK__ETCD_TRY_LOGIN ||
               next == DLOCK__ETCD_TRY_AGAIN) {
        /* Nothing reached etcd, or etcd did nothing: the blocking call
         * does it, with its failover and its login. */
        s->rc = DLOCK_ENOTSUP;
    }
    /* DLOCK__ETCD_TRY_NEXT_ENDPOINT: rc as it is (DLOCK_ECONN: no reply,
     * or "unavailable", which may have been done). */
    snprintf(s->msg, sizeof(s->msg), "%s", s->rc != DLOCK_OK ? dlock_error_message() : "");
}

int64_t dlock__etcd_loop_step(dlock__etcd_loop *l)
{
    sent *ended = NULL, **tail = &ended;
    CURLMsg *m;
    int left;
    long wait = -1;
    int64_t due = -1;

    pthread_mutex_lock(&l->mu);
    if (l->flying == NULL) {
        pthread_mutex_unlock(&l->mu);
        return -1;
    }
    drive(l);
    while ((m = curl_multi_info_read(l->multi, &left)) != NULL) {
        char *priv = NULL;
        sent *s;
        CURLcode res = m->data.result;

        if (m->msg != CURLMSG_DONE ||
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, &priv) != CURLE_OK ||
            (s = (sent *)(void *)priv) == NULL)
            continue;
        /* Out of flying; onto the ended, in the order they ended. */
        *s->prev = s->next;
        if (s->next != NULL)
            s->next->prev = s->prev;
        s->next = NULL;
        *tail = s;
        tail = &s->next;
        curl_multi_remove_handle(l->multi, s->c->easy);
        judge(l, s, res);
    }
    pthread_mutex_unlock(&l->mu);

    while (ended != NULL) {
        sent *s = ended;
        ended = s->next;
        if (s->rc != DLOCK_OK)
            dlock__fail(s->rc, "%s", s->msg);
        else
            dlock__clear_error();
        if (s->cb != NULL)
            s->cb(s->arg, s->rc, s->reply, s->grpc_code);
        else
            json_decref(s->reply);
        pthread_mutex_lock(&l->mu);
        sent_free(l, s);
        pthread_mutex_unlock(&l->mu);
    }

    pthread_mutex_lock(&l->mu);
    if (l->flying != NULL) {
        due = dlock__now_ms() + STEP_CAP_MS;
        if (curl_multi_timeout(l->multi, &wait) == CURLM_OK && wait >= 0 && wait < STEP_CAP_MS)
            due = dlock__now_ms() + wait;
        /* Connecting, or a request to write: the loop watches for reading
         * only, so look again soon. */
        for (int i = 0; i < l->nsocks; i++)
            if (l->socks[i].what & CURL_POLL_OUT)
                due = dlock__now_ms() + 1;
        if (l->nsocks == 0)
            due = dlock__now_ms() + 1; /* resolving */
    }
    pthread_mutex_unlock(&l->mu);
    return due;
}
