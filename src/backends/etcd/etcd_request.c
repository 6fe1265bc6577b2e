/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * One request on one endpoint, gRPC or the JSON gateway: its headers (the auth
 * token among them), running the transfers on a connection's multi handle,
 * and judging what came back: the reply parsed, a gRPC error classified into
 * a dlock error and what the caller does next (etcd_http_int.h). Failover
 * between endpoints and the login are etcd_http.c's.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/etcd/etcd_grpc.h"
#include "backends/etcd/etcd_http_int.h"
#include "core/error.h"
#include "core/thread.h"

/* Build the header list: JSON, no "Expect: 100-continue" (a round trip for
 * nothing), and the auth token with its generation. */
struct curl_slist *dlock__etcd_headers(dlock__etcd *e, int with_token, unsigned long *gen,
                                       int stream)
{
    struct curl_slist *h = NULL, *t;

    /* gRPC: "te: trailers" is what tells a server that the client reads
     * trailers, where the status comes. */
    h = curl_slist_append(h, e->grpc ? "Content-Type: application/grpc"
                                     : "Content-Type: application/json");
    if (h == NULL || (t = curl_slist_append(h, "Expect:")) == NULL)
        goto oom;
    h = t;
    if (e->grpc && (t = curl_slist_append(h, "TE: trailers")) == NULL)
        goto oom;
    h = t;
    if (stream) {
        /* etcd then ends the stream when its member loses the leader,
         * instead of keeping a watch that may never fire. gRPC metadata is
         * a header; the gateway forwards Grpc-Metadata-*. */
        if ((t = curl_slist_append(h, e->grpc ? "hasleader: true"
                                              : "Grpc-Metadata-hasleader: true")) == NULL)
            goto oom;
        h = t;
    }
    pthread_mutex_lock(&e->mu);
    *gen = e->token_gen;
    if (with_token && e->token != NULL) {
        size_t n = strlen(e->token) + 32;
        char *line = malloc(n);
        if (line != NULL) {
            /* gRPC takes the token as the metadata "token"; the gateway
             * turns Authorization into it. */
            snprintf(line, n, "%s: %s", e->grpc ? "token" : "Authorization", e->token);
            t = curl_slist_append(h, line);
            explicit_bzero(line, n); /* a memset before free may be optimised away */
            free(line);
        }
        if (line == NULL || t == NULL) {
            pthread_mutex_unlock(&e->mu);
            goto oom;
        }
        h = t;
    }
    pthread_mutex_unlock(&e->mu);
    return h;

oom:
    dlock__etcd_headers_free(h);
    return NULL;
}

void dlock__etcd_headers_free(struct curl_slist *headers)
{
    for (struct curl_slist *l = headers; l != NULL; l = l->next)
        explicit_bzero(l->data, strlen(l->data));
    curl_slist_free_all(headers);
}

/* curl's message, for "etcd host: message": its first letter lower-cased,
 * trailing blanks cut. */
static const char *curl_text(const dlock__etcd_conn *c, CURLcode res, char *buf, size_t size)
{
    size_t n;

    snprintf(buf, size, "%s", c->errbuf[0] != '\0' ? c->errbuf : curl_easy_strerror(res));
    if (buf[0] >= 'A' && buf[0] <= 'Z')
        buf[0] = (char)(buf[0] - 'A' + 'a');
    /* OpenSSL's texts end in a space or a newline. */
    for (n = strlen(buf); n > 0 && (buf[n - 1] == ' ' || buf[n - 1] == '\n'); n--)
        buf[n - 1] = '\0';
    return buf;
}

/*
 * Classify a gRPC error reply. Unavailable (no leader, request timed out,
 * leader changed) and the like go to the next endpoint; an invalid or stale
 * token asks for a new login; the rest is the server's answer.
 */
static int classify(dlock__etcd *e, dlock__etcd_conn *c, size_t idx, int *rc)
{
    const char *where = e->eps[idx].where, *m = c->grpc_message;

    switch (c->grpc_code) {
    case DLOCK__GRPC_UNAVAILABLE:
    case DLOCK__GRPC_DEADLINE_EXCEEDED:
    case DLOCK__GRPC_CANCELLED:
        *rc = dlock__fail(DLOCK_ECONN, "%s: %s", where, m);
        return DLOCK__ETCD_TRY_NEXT_ENDPOINT;
    case DLOCK__GRPC_UNAUTHENTICATED:
        if (strstr(m, "invalid auth token") != NULL && e->user != NULL) {
            *rc = dlock__fail(DLOCK_EAUTH, "%s: %s", where, m);
            return DLOCK__ETCD_TRY_LOGIN;
        }
        *rc = dlock__fail(DLOCK_EAUTH, "%s: authentication failed: %s", where, m);
        return DLOCK__ETCD_TRY_DONE;
    case DLOCK__GRPC_PERMISSION_DENIED:
        *rc = dlock__fail(DLOCK_EAUTH, "%s: %s (the user needs read-write on the key prefix)",
                          where, m);
        return DLOCK__ETCD_TRY_DONE;
    case DLOCK__GRPC_INVALID_ARGUMENT: /* several auth errors are reported this way */
        if (strstr(m, "revision of auth store is old") != NULL && e->user != NULL) {
            *rc = dlock__fail(DLOCK_EAUTH, "%s: %s", where, m);
            return DLOCK__ETCD_TRY_LOGIN;
        }
        if (strstr(m, "user name is empty") != NULL) {
            *rc = dlock__fail(DLOCK_EAUTH, "%s: authentication failed: the server requires a "
                              "user (give user:password@ in the URL)", where);
            return DLOCK__ETCD_TRY_DONE;
        }
        if (strstr(m, "authentication failed") != NULL) {
            *rc = dlock__fail(DLOCK_EAUTH, "%s: authentication failed: invalid user or password",
                              where);
            return DLOCK__ETCD_TRY_DONE;
        }
        break;
    case DLOCK__GRPC_FAILED_PRECONDITION:
        if (strstr(m, "authentication is not enabled") != NULL) {
            *rc = dlock__fail(DLOCK_EAUTH, "%s: authentication failed: the server has no "
                              "authentication enabled but the URL gives a user", where);
            return DLOCK__ETCD_TRY_DONE;
        }
        break;
    case DLOCK__GRPC_RESOURCE_EXHAUSTED:
        if (strstr(m, "too many requests") != NULL) {
            *rc = dlock__fail(DLOCK_ECONN, "%s: %s", where, m);
            return DLOCK__ETCD_TRY_NEXT_ENDPOINT;
        }
        *rc = dlock__fail(DLOCK_ESERVER, "%s: server refused the request: %s%s", where, m,
                          strstr(m, "space exceeded") ? " (compact and defragment the "
                          "database, or raise --quota-backend-bytes)" : "");
        return DLOCK__ETCD_TRY_DONE;
    default:
        break;
    }
    *rc = dlock__fail(DLOCK_ESERVER, "%s: server refused the request: %s", where, m);
    return DLOCK__ETCD_TRY_DONE;
}

/* Find a gRPC error in a reply: {"error":"text","code":N,"message":"text"}
 * for a unary call, {"error":{"grpc_code":N,"message":"text"}} in a stream.
 * Returns 1 and fills c->grpc_* when there is one. */
static int find_error(dlock__etcd_conn *c, const json_t *j)
{
    const json_t *err = json_object_get(j, "error");
    const json_t *code = json_object_get(j, "code"), *msg = json_object_get(j, "message");

    if (err == NULL && code == NULL)
        return 0;
    if (json_is_object(err)) {
        /* grpc-gateway v1 (etcd 3.4, 3.5) says grpc_code, v2 (3.6) code. */
        code = json_object_get(err, "grpc_code");
        if (code == NULL)
            code = json_object_get(err, "code");
        msg = json_object_get(err, "message");
    } else if (!json_is_string(msg) && json_is_string(err)) {
        msg = err;
    }
    /* gRPC defines codes 0..16; anything else is an unknown error. */
    c->grpc_code = DLOCK__GRPC_UNKNOWN;
    if (json_is_integer(code) && json_integer_value(code) >= 0 && json_integer_value(code) <= 16)
        c->grpc_code = (dlock__grpc_status)json_integer_value(code);
    if (c->grpc_code == DLOCK__GRPC_OK)
        return 0;
    snprintf(c->grpc_message, sizeof(c->grpc_message), "%s",
             json_is_string(msg) ? json_string_value(msg) : "unknown error");
    return 1;
}

/*
 * Parse the body: one JSON object, or for a stream (stream = 1) one object
 * per line, each {"result": ...} or {"error": ...}, turned into an array of
 * the results.
 */
static int parse_body(dlock__etcd *e, dlock__etcd_conn *c, size_t idx, long http, int stream,
                      json_t **out)
{
    const char *where = e->eps[idx].where;
    json_error_t jerr;
    json_t *j;

    if (!stream) {
        j = json_loadb(c->buf != NULL ? c->buf : "", c->len, 0, &jerr);
        if (!json_is_object(j)) {
            json_decref(j);
            return dlock__fail(DLOCK_EPROTO, "%s: HTTP %ld and not a JSON reply: is this the "
                               "etcd v3 gateway (etcd 3.4 or newer)?", where, http);
        }
        *out = j;
        return DLOCK_OK;
    }
    *out = json_array();
    if (*out == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    for (size_t pos = 0; pos < c->len;) {
        const json_t *result;
        while (pos < c->len && (c->buf[pos] == '\n' || c->buf[pos] == '\r' || c->buf[pos] == ' '))
            pos++;
        if (pos >= c->len)
            break;
        j = json_loadb(c->buf + pos, c->len - pos, JSON_DISABLE_EOF_CHECK, &jerr);
        if (j == NULL || !json_is_object(j)) {
            json_decref(j);
            json_decref(*out);
            *out = NULL;
            return dlock__fail(DLOCK_EPROTO, "%s: HTTP %ld and not a JSON stream: is this the "
                               "etcd v3 gateway (etcd 3.4 or newer)?", where, http);
        }
        pos += (size_t)jerr.position;
        result = json_object_get(j, "result");
        if (result != NULL)
            json_array_append(*out, (json_t *)result);
        else if (find_error(c, j)) {
            /* Report it the same way as a unary error. */
            json_decref(*out);
            *out = j;
            return DLOCK_OK;
        }
        json_decref(j);
    }
    return DLOCK_OK;
}

int dlock__etcd_h2_check(dlock__etcd_conn *c)
{
    if (!(*c->h2 & DLOCK__ETCD_H2_RESET))
        return DLOCK_OK;
    /* Closing every connection is the only way to be sure none is left
     * for a request with prior knowledge to trip on. */
    curl_multi_cleanup(c->multi);
    c->multi = curl_multi_init();
    *c->h2 = 0;
    return c->multi != NULL ? DLOCK_OK : dlock__fail(DLOCK_ENOMEM, "out of memory (curl multi)");
}

void dlock__etcd_frames_free(dlock__etcd_conn *c)
{
    if (c->frames != NULL && c->secret)
        explicit_bzero(c->frames, c->frames_len);
    free(c->frames);
    c->frames = NULL;
    c->frames_len = 0;
}

/* Set up c for one request; the headers are kept in c until dlock__etcd_finish. */
int dlock__etcd_prepare(dlock__etcd *e, dlock__etcd_conn *c, size_t idx, const char *path,
                        const char *body, int64_t budget_ms, int with_token, unsigned long *gen)
{
    char url[400], grpc_path[128], err[200];
    const ProtobufCMethodDescriptor *m = NULL;

    c->grpc_code = DLOCK__GRPC_OK;
    c->grpc_message[0] = '\0';
    c->errbuf[0] = '\0';
    c->len = 0;
    c->got_status = 0;
    dlock__etcd_frames_free(c);
    /* Only the login goes without the token: its request holds the
     * password and its reply the token. */
    c->secret = !with_token;
    if (e->grpc) {
        if ((m = dlock__etcd_grpc_method(path, grpc_path, sizeof(grpc_path))) == NULL)
            return dlock__fail(DLOCK_EINVAL, "etcd: no gRPC method for %s", path);
        c->reply_type = m->output;
    }
    if (e->grpc && c->preset != NULL) {
        if ((c->frames = malloc(c->preset_len)) == NULL)
            return dlock__fail(DLOCK_ENOMEM, "out of memory");
        memcpy(c->frames, c->preset, c->preset_len);
        c->frames_len = c->preset_len;
    } else if (e->grpc && c->packed != NULL) {
        if ((c->frames = malloc(c->packed_len)) == NULL)
            return dlock__fail(DLOCK_ENOMEM, "out of memory");
        memcpy(c->frames, c->packed, c->packed_len);
        c->frames_len = c->packed_len;
    } else if (e->grpc) {
        if (dlock__etcd_grpc_body(m->input, body, c->secret, &c->frames, &c->frames_len, err,
                                  sizeof(err)) != 0)
            return dlock__fail(DLOCK_EINVAL, "etcd %s request: %s", path, err);
    }
    c->headers = dlock__etcd_headers(e, with_token, gen, 0);
    if (c->headers == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    if (snprintf(url, sizeof(url), "%s%s", e->eps[idx].base, e->grpc ? grpc_path : path) >=
        (int)sizeof(url))
        return dlock__fail(DLOCK_EINVAL, "etcd: the URL of %s is longer than %zu bytes", path,
                           sizeof(url) - 1);
    curl_easy_setopt(c->easy, CURLOPT_URL, url);
    curl_easy_setopt(c->easy, CURLOPT_HTTPHEADER, c->headers);
    if (e->grpc) {
        /*
         * Debian 12's libcurl (7.88.1) fails a request that reuses an
         * HTTP/2 connection made with prior knowledge when it asks for
         * prior knowledge again ("error in the HTTP2 framing layer", curl
         * issue 10634, fixed in 8.0). So prior knowledge only while no
         * connection to the endpoint is known; then plain HTTP/2, which
         * reuses it. Should curl have dropped it meanwhile, a new one
         * speaks HTTP/1.1, which etcd answers 404 without doing anything:
         * dlock__etcd_finish asks for the request again, with prior
         * knowledge. (https: ALPN, no such bug.)
         */
        c->reusing = !e->tls && (*c->h2 & 1u << idx) != 0;
        if (!e->tls)
            curl_easy_setopt(c->easy, CURLOPT_HTTP_VERSION,
                             (long)(c->reusing ? CURL_HTTP_VERSION_2_0
                                               : CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE));
        curl_easy_setopt(c->easy, CURLOPT_POSTFIELDS, c->frames);
        curl_easy_setopt(c->easy, CURLOPT_POSTFIELDSIZE, (long)c->frames_len);
    } else {
        curl_easy_setopt(c->easy, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c->easy, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    curl_easy_setopt(c->easy, CURLOPT_TIMEOUT_MS, (long)budget_ms);
    curl_easy_setopt(c->easy, CURLOPT_CONNECTTIMEOUT_MS,
                     (long)(e->connect_timeout_ms < budget_ms ? e->connect_timeout_ms : budget_ms));
    return DLOCK_OK;
}

/*
 * etcds:// to an endpoint that speaks plain http: the TCP connection is
 * made, and the TLS handshake fails as the server answers the ClientHello
 * with something else or hangs up ("wrong version number", "connection
 * reset by peer", SSL_ERROR_SYSCALL), which says nothing of the cause. Say
 * what was expected. A certificate that does not verify has other codes,
 * and clear messages of its own.
 */
static const char *tls_hint(const dlock__etcd *e, CURLcode res)
{
    if (!e->tls || res != CURLE_SSL_CONNECT_ERROR)
        return "";
    return " (TLS was expected, as the URL is etcds://, but the TLS handshake failed: is "
           "this a plain-http endpoint, for etcd://?)";
}

/*
 * The reply of a gRPC call: HTTP 200 with a grpc-status (in the trailers,
 * or in the headers for a reply without messages), and the messages framed.
 * A status other than OK is classified as the gateway's error replies are;
 * the messages are decoded into the gateway's JSON: one object for a unary
 * call, an array of them for a stream (as parse_body gives).
 */
static int finish_grpc(dlock__etcd *e, dlock__etcd_conn *c, size_t idx, const char *path,
                       long http, int stream, json_t **out, int *rc)
{
    const char *where = e->eps[idx].where;
    const uint8_t *buf = (const uint8_t *)c->buf, *msg;
    size_t pos = 0, len;
    json_t *all = NULL;
    int got;

    dlock__etcd_frames_free(c);
    if (http != 200) {
        *rc = dlock__fail(DLOCK_EPROTO, "%s: HTTP %ld for gRPC %s: is this etcd's client port "
                          "(etcd 3.4 or newer)?", where, http, path);
        return http >= 500 ? DLOCK__ETCD_TRY_NEXT_ENDPOINT : DLOCK__ETCD_TRY_DONE;
    }
    if (!c->got_status) {
        *rc = dlock__fail(DLOCK_EPROTO, "%s: gRPC reply to %s without a grpc-status", where,
                          path);
        return DLOCK__ETCD_TRY_NEXT_ENDPOINT;
    }
    if (c->grpc_code != DLOCK__GRPC_OK) {
        if (c->grpc_message[0] == '\0')
            snprintf(c->grpc_message, sizeof(c->grpc_message), "gRPC status %d",
                     (int)c->grpc_code);
        return classify(e, c, idx, rc);
    }
    if (stream && (all = json_array()) == NULL) {
        *rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
        return DLOCK__ETCD_TRY_DONE;
    }
    while ((got = dlock__etcd_grpc_frame(buf, c->len, &pos, c->len, &msg, &len)) == 1) {
        const ProtobufCMessageDescriptor *type = c->reply_type;
        ProtobufCMessage *m = protobuf_c_message_unpack(type, NULL, len, msg);
        json_t *j = m != NULL ? dlock__etcd_pb_to_json(m) : NULL;

        dlock__etcd_pb_free(m, c->secret);
        if (m == NULL) {
            json_decref(all);
            *rc = dlock__fail(DLOCK_EPROTO, "%s: gRPC reply to %s is not a %s", where, path,
                              type->name);
            return DLOCK__ETCD_TRY_DONE;
        }
        if (j == NULL || (stream && json_array_append_new(all, j) != 0)) {
            json_decref(all);
            *rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
            return DLOCK__ETCD_TRY_DONE;
        }
        if (!stream && all != NULL) { /* a second reply to a unary call */
            json_decref(j);
            got = -1;
            break;
        }
        if (!stream)
            all = j;
    }
    if (got != 0 || pos != c->len || all == NULL) {
        json_decref(all);
        *rc = dlock__fail(DLOCK_EPROTO, "%s: gRPC reply to %s is not %s", where, path,
                          stream ? "a series of whole messages" : "one whole message");
        return DLOCK__ETCD_TRY_DONE;
    }
    *out = all;
    *rc = DLOCK_OK;
    return DLOCK__ETCD_TRY_DONE;
}

/* Judge a finished transfer: what to do next, *rc and *out. */
int dlock__etcd_finish(dlock__etcd *e, dlock__etcd_conn *c, size_t idx, const char *path,
                       CURLcode res, int64_t budget_ms, int stream, json_t **out, int *rc)
{
    const char *where = e->eps[idx].where;
    char text[CURL_ERROR_SIZE + 32];
    long http = 0;
    json_t *j = NULL;

    *out = NULL;
    curl_easy_setopt(c->easy, CURLOPT_HTTPHEADER, NULL);
    dlock__etcd_headers_free(c->headers);
    c->headers = NULL;
    if (res != CURLE_OK && e->grpc)
        *c->h2 = DLOCK__ETCD_H2_RESET;
    if (res == CURLE_OUT_OF_MEMORY) {
        *rc = dlock__fail(DLOCK_ENOMEM, "%s: out of memory", where);
        return DLOCK__ETCD_TRY_DONE;
    }
    if (res == CURLE_OPERATION_TIMEDOUT) {
        *rc = dlock__fail(DLOCK_ECONN, "%s: no reply within %lld ms", where,
                          (long long)budget_ms);
        return DLOCK__ETCD_TRY_NEXT_ENDPOINT;
    }
    if (res != CURLE_OK) {
        *rc = dlock__fail(DLOCK_ECONN, "%s: %s%s", where, curl_text(c, res, text, sizeof(text)),
                          tls_hint(e, res));
        /* A handshake that fails is, like a refused connection, nothing to
         * wait for on this endpoint. */
        return res == CURLE_COULDNT_CONNECT || res == CURLE_SSL_CONNECT_ERROR
                   ? DLOCK__ETCD_TRY_REFUSED
                   : DLOCK__ETCD_TRY_NEXT_ENDPOINT;
    }
    curl_easy_getinfo(c->easy, CURLINFO_RESPONSE_CODE, &http);
    if (e->grpc) {
        long version = 0;
        curl_easy_getinfo(c->easy, CURLINFO_HTTP_VERSION, &version);
        if (version != CURL_HTTP_VERSION_2_0 && c->reusing) {
            *c->h2 = DLOCK__ETCD_H2_RESET; /* it was gone (see dlock__etcd_prepare) */
            *rc = dlock__fail(DLOCK_ECONN, "%s: HTTP/2 connection lost", where);
            return DLOCK__ETCD_TRY_AGAIN;
        }
        if (version == CURL_HTTP_VERSION_2_0)
            *c->h2 |= 1u << idx;
        return finish_grpc(e, c, idx, path, http, stream, out, rc);
    }
    if ((*rc = parse_body(e, c, idx, http, stream, &j)) != DLOCK_OK)
        return http >= 500 ? DLOCK__ETCD_TRY_NEXT_ENDPOINT : DLOCK__ETCD_TRY_DONE;
    if (json_is_object(j) && find_error(c, j)) {
        json_decref(j);
        return classify(e, c, idx, rc);
    }
    if (http != 200) {
        json_decref(j);
        *rc = dlock__fail(DLOCK_EPROTO, "%s: HTTP %ld for %s", where, http, path);
        return http >= 500 ? DLOCK__ETCD_TRY_NEXT_ENDPOINT : DLOCK__ETCD_TRY_DONE;
    }
    *out = j;
    *rc = DLOCK_OK;
    return DLOCK__ETCD_TRY_DONE;
}

/*
 * Run the transfers of easy[0..n) (added to multi) to their end; each one's
 * own CURLOPT_TIMEOUT_MS bounds it. res[i] is its result.
 */
void dlock__etcd_run(CURLM *multi, CURL **easy, size_t n, CURLcode *res)
{
    dlock__sigpipe_guard guard;
    int running = 1, left;
    CURLMsg *msg;

    for (size_t i = 0; i < n; i++)
        res[i] = curl_multi_add_handle(multi, easy[i]) == CURLM_OK ? CURLE_AGAIN
                                                                    : CURLE_OUT_OF_MEMORY;
    dlock__sigpipe_block(&guard);
    while (running > 0) {
        if (curl_multi_perform(multi, &running) != CURLM_OK)
            break;
        while ((msg = curl_multi_info_read(multi, &left)) != NULL)
            for (size_t i = 0; i < n; i++)
                if (msg->msg == CURLMSG_DONE && msg->easy_handle == easy[i])
                    res[i] = msg->data.result;
        /* At most 20 ms between looks: Debian 12's libcurl (7.88) can keep
         * an HTTP/2 reply it already read in its own buffers, with nothing
         * left on the socket to wake the poll, until the poll times out.
         * With 1000 ms here a renewal sometimes came back after a 1 s lease
         * had run out on the client (core-etcd.threads_share_a_client under
         * ASan, about 1 run in 4; none in 10 with 20 ms). A transfer that
         * works takes a few ms, so the cap costs nothing then. */
        if (running > 0 && curl_multi_poll(multi, NULL, 0, 20, NULL) != CURLM_OK)
            break;
    }
    dlock__sigpipe_restore(&guard);
    for (size_t i = 0; i < n; i++) {
        curl_multi_remove_handle(multi, easy[i]);
        if (res[i] == CURLE_AGAIN) /* the loop broke off */
            res[i] = CURLE_RECV_ERROR;
    }
}

int dlock__etcd_attempt(dlock__etcd *e, dlock__etcd_conn *c, size_t idx, const char *path,
                        const char *body, int64_t budget_ms, int with_token, int stream,
                        unsigned long *gen, json_t **out, int *rc)
{
    CURLcode res;
    int next = DLOCK__ETCD_TRY_AGAIN;

    *out = NULL;
    for (int tries = 0; next == DLOCK__ETCD_TRY_AGAIN && tries < 2; tries++) {
        if ((*rc = dlock__etcd_h2_check(c)) != DLOCK_OK)
            return DLOCK__ETCD_TRY_DONE;
        *rc = dlock__etcd_prepare(e, c, idx, path, body, budget_ms, with_token, gen);
        if (*rc != DLOCK_OK)
            return DLOCK__ETCD_TRY_DONE;
        dlock__etcd_run(c->multi, &c->easy, 1, &res);
        next = dlock__etcd_finish(e, c, idx, path, res, budget_ms, stream, out, rc);
    }
    return next == DLOCK__ETCD_TRY_AGAIN ? DLOCK__ETCD_TRY_NEXT_ENDPOINT : next;
}

