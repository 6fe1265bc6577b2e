/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * etcd v3 over libcurl, gRPC or the JSON gateway: the client's set-up (endpoints,
 * TLS files, timeouts), the pool of connections, calls with failover between
 * endpoints and the login that gets the auth token, and the set-up of a
 * streaming request. One request on one endpoint is etcd_request.c's. See
 * etcd_http.h for the contract.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/etcd/etcd_grpc.h"
#include "backends/etcd/etcd_http_int.h"
#include "backends/etcd/etcd_watch.h"
#include <sys/socket.h>

#include "core/clock.h"
#include "core/error.h"

#define DEFAULT_PORT 2379
/* Idle connections kept for reuse; more are closed when handed back. */
#define POOL_MAX 16
/* Pool connections in use at once. Each is a TCP connection (two for a
 * pair) whose calls poll every 20 ms while they wait for their reply, so
 * 10,000 threads waiting on one client would otherwise open 10,000 of them
 * at once, and their polls alone would take the CPU. A caller beyond the
 * limit sleeps until one comes back (each conn_put wakes one), but never a
 * thread that holds one already (out_here), so that a caller that asks for
 * a second one never waits for a thread that waits for its first. */
#define OUT_MAX 16

/* Pool connections this thread holds now. */
static _Thread_local int out_here;
/* A reply larger than this is not an answer to anything dlock asks. */
#define REPLY_MAX (16 * 1024 * 1024)
/* Pause after every endpoint failed once, before the next round. */
#define ROUND_PAUSE_MS 50

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
    /* jansson seeds its hash function on first use; do it before threads
     * race to. */
    json_object_seed(0);
}

/* ---- set-up ------------------------------------------------------------ */

static int check_file(const char *what, const char *path)
{
    if (path[0] == '\0' || access(path, R_OK) != 0)
        return dlock__fail(DLOCK_EINVAL, "etcds URL: %s file '%.200s' cannot be read", what,
                           path);
    return DLOCK_OK;
}

/*
 * proxy=URL: the only way a proxy is used. libcurl would otherwise take one
 * from http_proxy, https_proxy or ALL_PROXY, and send it the login request
 * with the password (common_options turns that off). A proxy's own
 * credentials (user:password@ in proxy=) are refused: the URL's redacted
 * form, in every message, hides only the etcd password.
 */
static int check_proxy(const dlock_url *url)
{
    const char *proxy = dlock_url_param_get(url, "proxy");

    if (proxy == NULL)
        return DLOCK_OK;
    if (proxy[0] == '\0' || strstr(proxy, "://") == NULL)
        return dlock__fail(DLOCK_EINVAL, "%s URL: proxy= wants a proxy URL, like "
                           "proxy=http://host:3128", url->scheme);
    if (strchr(proxy, '@') != NULL)
        return dlock__fail(DLOCK_EINVAL, "%s URL: proxy= with credentials (user:password@) is "
                           "not supported", url->scheme);
    return DLOCK_OK;
}

/*
 * user:password@ on plain etcd:// sends the password, and then the token,
 * in clear text on every request: refused unless insecure_auth=1 says that
 * this is meant (a loopback or otherwise private network).
 */
static int check_insecure_auth(const dlock_url *url, int tls)
{
    const char *v = dlock_url_param_get(url, "insecure_auth");

    if (v != NULL && strcmp(v, "0") != 0 && strcmp(v, "1") != 0)
        return dlock__fail(DLOCK_EINVAL, "%s URL: insecure_auth= is 0 or 1", url->scheme);
    if (!tls && url->user != NULL && (v == NULL || strcmp(v, "1") != 0))
        return dlock__fail(DLOCK_EINVAL, "etcd URL: user:password@ over plain etcd:// would "
                           "send the password in clear text: use etcds://, or add "
                           "?insecure_auth=1 to allow it");
    return DLOCK_OK;
}

int dlock__etcd_new(dlock__etcd **out, const dlock_url *url, const dlock_client_options *opts)
{
    dlock__etcd *e;
    int tls = strcmp(url->scheme, "etcds") == 0;
    int rc;

    *out = NULL;
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK)
        return dlock__fail(DLOCK_ENOMEM, "libcurl cannot be initialised: %s",
                           curl_easy_strerror(curl_init_rc));
    if (url->nhosts == 0)
        return dlock__fail(DLOCK_EINVAL,
                           "%s URL: no endpoint (expected %s://host:2379[,host:2379...])",
                           url->scheme, url->scheme);
    if (url->nhosts > DLOCK__ETCD_MAX_ENDPOINTS)
        return dlock__fail(DLOCK_EINVAL, "%s URL: more than %d endpoints", url->scheme,
                           DLOCK__ETCD_MAX_ENDPOINTS);
    if (url->path != NULL && strcmp(url->path, "/") != 0)
        return dlock__fail(DLOCK_EINVAL, "%s URL: unexpected path '%.64s' (the key prefix is "
                           "the client option key_prefix)", url->scheme, url->path);
    if ((url->user != NULL) != (url->password != NULL))
        return dlock__fail(DLOCK_EINVAL, "%s URL: give both user and password (user:password@)",
                           url->scheme);
    for (size_t i = 0; i < url->nparams; i++) {
        const char *k = url->params[i].key;
        if (strcmp(k, "proxy") == 0 || strcmp(k, "insecure_auth") == 0)
            continue;
        if (strcmp(k, "transport") == 0) {
            const char *v = url->params[i].value;
            if (v == NULL || (strcmp(v, "grpc") != 0 && strcmp(v, "gateway") != 0))
                return dlock__fail(DLOCK_EINVAL, "%s URL: transport= is grpc (the default) or "
                                   "gateway (etcd's JSON gateway, over HTTP/1.1)", url->scheme);
            continue;
        }
        if (strcmp(k, "cacert") != 0 && strcmp(k, "cert") != 0 && strcmp(k, "key") != 0)
            return dlock__fail(DLOCK_EINVAL, "%s URL: unknown parameter '%.32s' (known: cacert, "
                               "cert, key, proxy, insecure_auth, transport)", url->scheme, k);
        if (!tls)
            return dlock__fail(DLOCK_EINVAL, "etcd URL: '%s' is a TLS option: use etcds:// for "
                               "https endpoints", k);
    }
    if ((rc = check_proxy(url)) != DLOCK_OK || (rc = check_insecure_auth(url, tls)) != DLOCK_OK)
        return rc;

    e = calloc(1, sizeof(*e));
    if (e == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    if (pthread_mutex_init(&e->mu, NULL) != 0) {
        free(e);
        return dlock__fail(DLOCK_ENOMEM, "cannot create a mutex");
    }
    if (pthread_mutex_init(&e->login_mu, NULL) != 0) {
        pthread_mutex_destroy(&e->mu);
        free(e);
        return dlock__fail(DLOCK_ENOMEM, "cannot create a mutex");
    }
    if (pthread_cond_init(&e->out_cond, NULL) != 0) {
        pthread_mutex_destroy(&e->login_mu);
        pthread_mutex_destroy(&e->mu);
        free(e);
        return dlock__fail(DLOCK_ENOMEM, "cannot create a condition variable");
    }
    e->neps = url->nhosts;
    for (size_t i = 0; i < url->nhosts; i++) {
        const char *h = url->hosts[i].host;
        int port = url->hosts[i].port != 0 ? url->hosts[i].port : DEFAULT_PORT;
        int v6 = strchr(h, ':') != NULL;
        snprintf(e->eps[i].base, sizeof(e->eps[i].base), v6 ? "%s://[%.255s]:%d" : "%s://%.255s:%d",
                 tls ? "https" : "http", h, port);
        snprintf(e->eps[i].where, sizeof(e->eps[i].where),
                 v6 ? "etcd [%.255s]:%d" : "etcd %.255s:%d", h, port);
    }
    e->tls = tls;
    {
        const char *t = dlock_url_param_get(url, "transport");
        e->grpc = t == NULL || strcmp(t, "grpc") == 0;
    }
    e->cacert = dlock_url_param_get(url, "cacert");
    e->cert = dlock_url_param_get(url, "cert");
    e->key = dlock_url_param_get(url, "key");
    e->proxy = dlock_url_param_get(url, "proxy");
    e->user = url->user;
    e->password = url->password;
    e->connect_timeout_ms = opts->connect_timeout_ms;
    e->command_timeout_ms = opts->command_timeout_ms;
    snprintf(e->user_agent, sizeof(e->user_agent), "dlock/%s (%s)", DLOCK_VERSION,
             opts->client_name != NULL ? opts->client_name : "dlock");
    if ((e->cert != NULL) != (e->key != NULL)) {
        rc = dlock__fail(DLOCK_EINVAL, "etcds URL: give both cert= and key= for a client "
                         "certificate");
        goto err;
    }
    if ((e->cacert != NULL && (rc = check_file("cacert", e->cacert)) != DLOCK_OK) ||
        (e->cert != NULL && (rc = check_file("cert", e->cert)) != DLOCK_OK) ||
        (e->key != NULL && (rc = check_file("key", e->key)) != DLOCK_OK))
        goto err;
    *out = e;
    return DLOCK_OK;

err:
    dlock__etcd_free(e);
    return rc;
}

int dlock__etcd_watch_hub(dlock__etcd *e, dlock__etcd_hub **out)
{
    int rc = DLOCK_OK;

    pthread_mutex_lock(&e->mu);
    if (e->hub == NULL)
        rc = dlock__etcd_hub_new(e, &e->hub);
    *out = e->hub;
    pthread_mutex_unlock(&e->mu);
    return rc;
}

void dlock__etcd_free(dlock__etcd *e)
{
    if (e == NULL)
        return;
    dlock__etcd_hub_free(e->hub);
    while (e->idle != NULL) {
        dlock__etcd_conn *c = e->idle;
        e->idle = c->next;
        dlock__etcd_conn_free(c);
    }
    if (e->token != NULL) {
        explicit_bzero(e->token, strlen(e->token));
        free(e->token);
    }
    pthread_cond_destroy(&e->out_cond);
    pthread_mutex_destroy(&e->login_mu);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

size_t dlock__etcd_current(dlock__etcd *e)
{
    return atomic_load(&e->current);
}

const char *dlock__etcd_where(const dlock__etcd *e, size_t endpoint)
{
    return e->eps[endpoint % e->neps].where;
}

void dlock__etcd_endpoint_failed(dlock__etcd *e, size_t endpoint)
{
    size_t expect = endpoint;

    atomic_compare_exchange_strong(&e->current, &expect, (endpoint + 1) % e->neps);
}

/* ---- connections ----------------------------------------------------- */

static size_t on_data(char *data, size_t size, size_t n, void *arg)
{
    dlock__etcd_conn *c = arg;
    size_t add = size * n;

    if (c->len + add + 1 > c->cap) {
        size_t cap = c->cap ? c->cap : 1024;
        char *grown;
        while (cap < c->len + add + 1)
            cap *= 2;
        if (cap > REPLY_MAX)
            return 0; /* aborts the transfer */
        grown = realloc(c->buf, cap);
        if (grown == NULL)
            return 0;
        c->buf = grown;
        c->cap = cap;
    }
    memcpy(c->buf + c->len, data, add);
    c->len += add;
    c->buf[c->len] = '\0';
    return add;
}

/* Response headers, and over HTTP/2 the trailers too: a gRPC status comes
 * in either (in the headers when the reply has no body). */
static size_t on_header(char *data, size_t size, size_t n, void *arg)
{
    dlock__etcd_conn *c = arg;
    int status = -1;

    if (dlock__etcd_grpc_header(data, size * n, &status, c->grpc_message,
                                sizeof(c->grpc_message)) && status >= 0) {
        c->got_status = 1;
        c->grpc_code = status <= 16 ? (dlock__grpc_status)status : DLOCK__GRPC_UNKNOWN;
    }
    return size * n;
}

/* Sockets close on exec, so that a program run under the lock (dlock run)
 * does not keep the client's connections open. */
static curl_socket_t open_socket(void *arg, curlsocktype purpose, struct curl_sockaddr *a)
{
    (void)arg;
    (void)purpose;
    return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

/* The options every handle of this client shares. */
static void common_options(dlock__etcd *e, CURL *easy)
{
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_OPENSOCKETFUNCTION, open_socket);
    curl_easy_setopt(easy, CURLOPT_USERAGENT, e->user_agent);
    curl_easy_setopt(easy, CURLOPT_TCP_NODELAY, 1L);
    /* Only proxy= chooses a proxy: "" turns off the environment's
     * (http_proxy, https_proxy, ALL_PROXY), and NO_PROXY "*" too. */
    curl_easy_setopt(easy, CURLOPT_PROXY, e->proxy != NULL ? e->proxy : "");
    if (e->proxy == NULL)
        curl_easy_setopt(easy, CURLOPT_NOPROXY, "*");
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(easy, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    if (e->cacert != NULL)
        curl_easy_setopt(easy, CURLOPT_CAINFO, e->cacert);
    if (e->cert != NULL) {
        curl_easy_setopt(easy, CURLOPT_SSLCERT, e->cert);
        curl_easy_setopt(easy, CURLOPT_SSLKEY, e->key);
    }
    if (e->grpc) {
        /* gRPC is HTTP/2 only: h2c straight away on etcd://, ALPN on etcds://.
         * Through a proxy, a CONNECT tunnel carries it. */
        curl_easy_setopt(easy, CURLOPT_HTTP_VERSION,
                         (long)(e->tls ? CURL_HTTP_VERSION_2TLS
                                       : CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE));
        if (e->proxy != NULL)
            curl_easy_setopt(easy, CURLOPT_HTTPPROXYTUNNEL, 1L);
    }
}

dlock__etcd_conn *dlock__etcd_conn_alloc(dlock__etcd *e)
{
    dlock__etcd_conn *c = calloc(1, sizeof(*c));

    if (c == NULL || (c->easy = curl_easy_init()) == NULL) {
        free(c);
        return NULL;
    }
    common_options(e, c->easy);
    curl_easy_setopt(c->easy, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c->easy, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(c->easy, CURLOPT_ERRORBUFFER, c->errbuf);
    c->h2 = &c->h2_state;
    curl_easy_setopt(c->easy, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c->easy, CURLOPT_HEADERDATA, c);
    return c;
}

int dlock__etcd_conn_new(dlock__etcd *e, dlock__etcd_conn **out)
{
    dlock__etcd_conn *c = dlock__etcd_conn_alloc(e);

    *out = NULL;
    /* Every transfer runs through the connection's multi handle, whose
     * cache keeps the connections alive between calls, also the second one
     * a pair of requests (dlock__etcd_call_pair) needs. */
    if (c != NULL && (c->multi = curl_multi_init()) == NULL) {
        dlock__etcd_conn_free(c);
        c = NULL;
    }
    if (c == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory (curl handle)");
    *out = c;
    return DLOCK_OK;
}

void dlock__etcd_conn_free(dlock__etcd_conn *c)
{
    if (c == NULL)
        return;
    dlock__etcd_conn_free(c->twin);
    curl_easy_cleanup(c->easy);
    if (c->multi != NULL)
        curl_multi_cleanup(c->multi);
    dlock__etcd_frames_free(c);
    free(c->buf);
    free(c);
}

int dlock__etcd_conn_get(dlock__etcd *e, dlock__etcd_conn **out)
{
    int rc;

    pthread_mutex_lock(&e->mu);
    while (e->nout >= OUT_MAX && out_here == 0)
        pthread_cond_wait(&e->out_cond, &e->mu);
    e->nout++;
    out_here++;
    *out = e->idle;
    if (*out != NULL) {
        e->idle = (*out)->next;
        e->nidle--;
        (*out)->next = NULL;
    }
    pthread_mutex_unlock(&e->mu);
    if (*out != NULL || (rc = dlock__etcd_conn_new(e, out)) == DLOCK_OK)
        return DLOCK_OK;
    pthread_mutex_lock(&e->mu);
    e->nout--;
    out_here--;
    pthread_cond_signal(&e->out_cond);
    pthread_mutex_unlock(&e->mu);
    return rc;
}

void dlock__etcd_conn_put(dlock__etcd *e, dlock__etcd_conn *c)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&e->mu);
    if (e->nout > 0)
        e->nout--;
    if (out_here > 0)
        out_here--;
    pthread_cond_signal(&e->out_cond);
    if (e->nidle < POOL_MAX) {
        c->next = e->idle;
        e->idle = c;
        e->nidle++;
        c = NULL;
    }
    pthread_mutex_unlock(&e->mu);
    dlock__etcd_conn_free(c);
}

/* ---- calls with failover ----------------------------------------------- */

static int call_body(dlock__etcd *e, dlock__etcd_conn *c, const char *path, const char *body,
                     int with_token, int stream, json_t **out);

/*
 * The login request's body holds the password, and jansson's own copies
 * are freed without being wiped: json_dumps builds the text in a buffer
 * that it grows and frees, and the password's json_t keeps a copy. So the
 * text is written into one buffer of ours, sized for the worst case (every
 * byte escaped as \u00XX) so that it never moves, which the caller wipes;
 * and the json_t's copy is wiped before it is freed (wipe_json_string).
 */
typedef struct {
    char *buf;
    size_t len, cap;
} fixed_buf;

static int append_fixed(const char *chunk, size_t n, void *arg)
{
    fixed_buf *b = arg;

    if (n >= b->cap - b->len)
        return -1;
    memcpy(b->buf + b->len, chunk, n);
    b->len += n;
    b->buf[b->len] = '\0';
    return 0;
}

static char *login_body(const json_t *req, size_t secret_bytes)
{
    fixed_buf b = {NULL, 0, 64 + 6 * secret_bytes};

    if ((b.buf = malloc(b.cap)) == NULL)
        return NULL;
    b.buf[0] = '\0';
    if (json_dump_callback(req, append_fixed, &b, JSON_COMPACT) != 0) {
        explicit_bzero(b.buf, b.cap);
        free(b.buf);
        return NULL;
    }
    return b.buf;
}

static void wipe_json_string(json_t *s)
{
    if (json_is_string(s))
        explicit_bzero((char *)json_string_value(s), json_string_length(s));
}

/* The login's gRPC body, framed, in c->preset. */
static int login_frames(dlock__etcd_conn *c, const json_t *req)
{
    const ProtobufCMethodDescriptor *m;
    char path[64], err[200];
    uint8_t *buf;

    if ((m = dlock__etcd_grpc_method("/v3/auth/authenticate", path, sizeof(path))) == NULL ||
        dlock__etcd_grpc_pack(m->input, req, 1, &buf, &c->preset_len, err, sizeof(err)) != 0)
        return DLOCK_ENOMEM;
    c->preset = buf;
    return DLOCK_OK;
}

/* Log in and keep the token, unless another thread already replaced the
 * token of generation gen. */
static int login(dlock__etcd *e, dlock__etcd_conn *c, unsigned long gen)
{
    json_t *req, *reply = NULL;
    const json_t *token;
    char *body;
    int rc;

    pthread_mutex_lock(&e->login_mu);
    pthread_mutex_lock(&e->mu);
    rc = e->token_gen != gen; /* another thread logged in meanwhile */
    pthread_mutex_unlock(&e->mu);
    if (rc) {
        pthread_mutex_unlock(&e->login_mu);
        return DLOCK_OK;
    }
    req = json_pack("{s:s, s:s}", "name", e->user, "password", e->password);
    body = req != NULL ? login_body(req, strlen(e->user) + strlen(e->password)) : NULL;
    /* gRPC: the message from req itself, as parsing the text again would
     * leave the password in jansson's buffers. */
    if (body != NULL && e->grpc && login_frames(c, req) != DLOCK_OK) {
        explicit_bzero(body, strlen(body));
        free(body);
        body = NULL;
    }
    wipe_json_string(json_object_get(req, "password"));
    json_decref(req);
    if (body == NULL) {
        pthread_mutex_unlock(&e->login_mu);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    rc = call_body(e, c, "/v3/auth/authenticate", body, 0, 0, &reply);
    explicit_bzero(body, strlen(body)); /* a memset before free may be optimised away */
    free(body);
    if (c->preset != NULL) {
        explicit_bzero((uint8_t *)c->preset, c->preset_len);
        free((uint8_t *)c->preset);
        c->preset = NULL;
    }
    if (rc == DLOCK_OK) {
        token = json_object_get(reply, "token");
        if (!json_is_string(token) || json_string_length(token) == 0) {
            rc = dlock__fail(DLOCK_EPROTO, "%s: authenticate reply without a token",
                             dlock__etcd_where(e, dlock__etcd_current(e)));
        } else {
            char *copy = strdup(json_string_value(token));
            if (copy == NULL) {
                rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
            } else {
                pthread_mutex_lock(&e->mu);
                if (e->token != NULL) {
                    explicit_bzero(e->token, strlen(e->token));
                    free(e->token);
                }
                e->token = copy;
                e->token_gen++;
                pthread_mutex_unlock(&e->mu);
            }
        }
    }
    /* The token's other copies: the reply as received, and jansson's. */
    if (c->buf != NULL)
        explicit_bzero(c->buf, c->len);
    wipe_json_string(json_object_get(reply, "token"));
    json_decref(reply);
    pthread_mutex_unlock(&e->login_mu);
    return rc;
}

static void pause_ms(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) != 0)
        ;
}

void dlock__etcd_answered(dlock__etcd *e, size_t idx)
{
    size_t was = atomic_load(&e->current);

    if (was != idx)
        atomic_compare_exchange_strong(&e->current, &was, idx);
}

static int call_body(dlock__etcd *e, dlock__etcd_conn *c, const char *path, const char *body,
                     int with_token, int stream, json_t **out)
{
    int64_t start = dlock__now_ms(), deadline = start + e->command_timeout_ms;
    size_t idx = atomic_load(&e->current), failed = 0, refused = 0;
    int logged_in = 0, rc = DLOCK_ECONN;

    *out = NULL;
    for (;;) {
        int64_t left = deadline - dlock__now_ms(), budget = left;
        unsigned long gen = 0;
        int next;

        if (left <= 0)
            break;
        /* A member that accepts connections but does not answer (stopped,
         * partitioned) must not eat the whole budget while others remain. */
        if (failed + 1 < e->neps && left >= 400)
            budget = left / 2;
        next = dlock__etcd_attempt(e, c, idx, path, body, budget, with_token, stream, &gen, out,
                                   &rc);
        if (next == DLOCK__ETCD_TRY_DONE) {
            if (rc == DLOCK_OK)
                dlock__etcd_answered(e, idx);
            return rc;
        }
        if (next == DLOCK__ETCD_TRY_LOGIN) {
            /* Once; and never for a call without the token (the login's
             * own, under login_mu), whatever its reply says. */
            if (logged_in || !with_token)
                return rc;
            logged_in = 1;
            if ((rc = login(e, c, gen)) != DLOCK_OK)
                return rc;
            continue;
        }
        /* DLOCK__ETCD_TRY_NEXT_ENDPOINT, DLOCK__ETCD_TRY_REFUSED. Every endpoint refusing the
         * connection in a row: nothing runs there, no use waiting. */
        refused = next == DLOCK__ETCD_TRY_REFUSED ? refused + 1 : 0;
        if (refused >= e->neps)
            break;
        failed++;
        if (e->neps > 1) {
            size_t was = idx;
            idx = (idx + 1) % e->neps;
            atomic_compare_exchange_strong(&e->current, &was, idx);
        }
        if (failed % e->neps == 0) {
            int64_t rest = deadline - dlock__now_ms();
            if (rest > 0)
                pause_ms(rest < ROUND_PAUSE_MS ? rest : ROUND_PAUSE_MS);
        }
    }
    if (e->neps > 1) {
        char last[400];
        snprintf(last, sizeof(last), "%s", dlock_error_message());
        if (refused >= e->neps)
            rc = dlock__fail(rc, "%s (and the other %zu endpoints refused too)", last,
                             e->neps - 1);
        else
            rc = dlock__fail(rc, "%s (no endpoint of %zu answered within %lld ms)", last,
                             e->neps, (long long)e->command_timeout_ms);
    }
    return rc;
}

/* Over gRPC the message is packed from req itself: writing it out as text
 * and parsing that again cost a renewal batch most of its time. */
int dlock__etcd_encode(dlock__etcd *e, const char *path, const json_t *req, uint8_t **packed,
                       size_t *len, char **body)
{
    const ProtobufCMethodDescriptor *m;
    char grpc_path[128], err[200];

    *packed = NULL;
    *len = 0;
    *body = NULL;
    if (e->grpc && (m = dlock__etcd_grpc_method(path, grpc_path, sizeof(grpc_path))) != NULL) {
        if (dlock__etcd_grpc_pack(m->input, req, 0, packed, len, err, sizeof(err)) != 0)
            return dlock__fail(DLOCK_EINVAL, "etcd %s request: %s", path, err);
        return DLOCK_OK;
    }
    if ((*body = json_dumps(req, JSON_COMPACT)) == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    return DLOCK_OK;
}

int dlock__etcd_call(dlock__etcd *e, dlock__etcd_conn *c, const char *path, json_t *req,
                     json_t **out)
{
    uint8_t *packed;
    size_t len;
    char *body;
    int rc;

    *out = NULL;
    if ((rc = dlock__etcd_encode(e, path, req, &packed, &len, &body)) != DLOCK_OK)
        return rc;
    c->packed = packed;
    c->packed_len = len;
    rc = call_body(e, c, path, body != NULL ? body : "", 1, 0, out);
    c->packed = NULL;
    c->packed_len = 0;
    free(packed);
    free(body);
    return rc;
}

int dlock__etcd_call_stream(dlock__etcd *e, dlock__etcd_conn *c, const char *path,
                            const char *body, json_t **results)
{
    return call_body(e, c, path, body, 1, 1, results);
}

int dlock__etcd_call_pair(dlock__etcd *e, dlock__etcd_conn *c, dlock__etcd_pair *p)
{
    size_t idx = atomic_load(&e->current);
    int64_t budget = e->command_timeout_ms;
    unsigned long gen;
    int next[2] = {DLOCK__ETCD_TRY_NEXT_ENDPOINT, DLOCK__ETCD_TRY_NEXT_ENDPOINT};
    dlock__etcd_conn *cs[2];

    p->rc[0] = p->rc[1] = DLOCK_ECONN;
    p->out[0] = p->out[1] = NULL;
    if (c->twin == NULL && (c->twin = dlock__etcd_conn_alloc(e)) == NULL)
        return p->rc[0] = p->rc[1] = dlock__fail(DLOCK_ENOMEM, "out of memory (curl handle)");
    c->twin->h2 = c->h2;
    if (dlock__etcd_h2_check(c) != DLOCK_OK)
        return p->rc[0] = p->rc[1] = DLOCK_ENOMEM;
    cs[0] = c;
    cs[1] = c->twin;
    if (dlock__etcd_prepare(e, cs[0], idx, p->path[0], p->body[0], budget, 1, &gen) == DLOCK_OK &&
        dlock__etcd_prepare(e, cs[1], idx, p->path[1], p->body[1], budget, 1, &gen) == DLOCK_OK) {
        CURL *easy[2] = {cs[0]->easy, cs[1]->easy};
        CURLcode res[2];
        dlock__etcd_run(c->multi, easy, 2, res);
        for (int i = 0; i < 2; i++) {
            next[i] = dlock__etcd_finish(e, cs[i], idx, p->path[i], res[i], budget, p->stream[i],
                                         &p->out[i], &p->rc[i]);
            p->grpc_code[i] = cs[i]->grpc_code;
        }
    }
    for (int i = 0; i < 2; i++) {
        if (cs[i]->headers != NULL) {
            curl_easy_setopt(cs[i]->easy, CURLOPT_HTTPHEADER, NULL);
            dlock__etcd_headers_free(cs[i]->headers);
            cs[i]->headers = NULL;
        }
    }
    /* Whatever got no definite answer: again, alone, with failover (both
     * requests are safe to repeat). The twin shares c's multi handle, so it
     * runs its transfers itself only inside a pair: here c does them. */
    for (int i = 0; i < 2; i++) {
        if (next[i] == DLOCK__ETCD_TRY_DONE)
            continue;
        json_decref(p->out[i]);
        p->rc[i] = call_body(e, c, p->path[i], p->body[i], 1, p->stream[i], &p->out[i]);
        p->grpc_code[i] = c->grpc_code;
    }
    return p->rc[0] != DLOCK_OK ? p->rc[0] : p->rc[1];
}

int dlock__etcd_connect(dlock__etcd *e)
{
    dlock__etcd_conn *c;
    int rc;

    if (e->user == NULL)
        return DLOCK_OK;
    if ((rc = dlock__etcd_conn_get(e, &c)) != DLOCK_OK)
        return rc;
    rc = login(e, c, 0);
    dlock__etcd_conn_put(e, c);
    return rc;
}

/* ---- streams ------------------------------------------------------------ */

int dlock__etcd_is_grpc(const dlock__etcd *e)
{
    return e->grpc;
}

int dlock__etcd_setup_stream(dlock__etcd *e, CURL *easy, size_t endpoint, const char *path,
                             const char *body, struct curl_slist **headers)
{
    const ProtobufCMethodDescriptor *m = NULL;
    char url[400], grpc_path[128], err[200];
    unsigned long gen;

    if (e->grpc && (m = dlock__etcd_grpc_method(path, grpc_path, sizeof(grpc_path))) == NULL)
        return dlock__fail(DLOCK_EINVAL, "etcd: no gRPC method for %s", path);
    *headers = dlock__etcd_headers(e, 1, &gen, 1);
    if (*headers == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    if (snprintf(url, sizeof(url), "%s%s", e->eps[endpoint % e->neps].base,
                 e->grpc ? grpc_path : path) >= (int)sizeof(url)) {
        dlock__etcd_headers_free(*headers);
        *headers = NULL;
        return dlock__fail(DLOCK_EINVAL, "etcd: the URL of %s is longer than %zu bytes", path,
                           sizeof(url) - 1);
    }
    common_options(e, easy);
    curl_easy_setopt(easy, CURLOPT_URL, url);
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, *headers);
    if (m != NULL) {
        uint8_t *frames;
        size_t len;
        if (dlock__etcd_grpc_body(m->input, body, 0, &frames, &len, err, sizeof(err)) != 0) {
            dlock__etcd_headers_free(*headers);
            *headers = NULL;
            return dlock__fail(DLOCK_EINVAL, "etcd %s request: %s", path, err);
        }
        curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE, (long)len);
        curl_easy_setopt(easy, CURLOPT_COPYPOSTFIELDS, frames);
        free(frames);
    } else {
        curl_easy_setopt(easy, CURLOPT_COPYPOSTFIELDS, body);
    }
    curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, (long)e->connect_timeout_ms);
    /* The stream may stay quiet for as long as the holder holds: no total
     * timeout, but TCP keepalive notices a peer that vanished. */
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, 0L);
    curl_easy_setopt(easy, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(easy, CURLOPT_TCP_KEEPIDLE, 10L);
    curl_easy_setopt(easy, CURLOPT_TCP_KEEPINTVL, 5L);
    return DLOCK_OK;
}
