/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock-bench --etcd: what a dlock call costs on etcd, beside the raw round
 * trip of a /v3/kv/range (a linearizable read) and of a /v3/kv/put (a raft
 * write) through the same kind of connection dlock uses (libcurl, keep-alive),
 * measured in the same run, interleaved. And python-etcd3's Lock (a Python
 * library over gRPC: bench/etcd3_lock.py, Debian's python3-etcd3) on the
 * same etcd, its cycles in the same rounds as dlock's, and its hand-offs
 * after dlock's, with the ratios to dlock's and to the raw put.
 *
 * Without --url it starts a throwaway single-member etcd from PATH on free
 * loopback ports, with its data in a mkdtemp directory (on disk: every write
 * is fsynced, as in production), with authentication on: a root user with a
 * random password, which dlock, the raw requests (their token) and
 * python-etcd3 use alike, so that no other local user can reach it (the
 * bench checks that a request without the token is refused). A janitor
 * process owns that etcd and stops it and removes the directory when the
 * bench exits, whatever the way, even with SIGKILL: it notices the bench is
 * gone when a pipe closes.
 */
#include "bench.h"

#include <dlock/dlock.h>

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define HOLD_MS 1 /* between looks at whether B waits, in the hand-off */

static int etcd_port;
static char base_url[128]; /* http://127.0.0.1:PORT */
static char root_pw[33];     /* the throwaway etcd's root password, or "" */
static char auth_token[512]; /* its token for the raw requests, or "" */
static int janitor_pipe = -1;
static pid_t janitor_pid;

/* ---- the throwaway etcd ------------------------------------------------- */

int bench_bind_port(int port)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    port = ntohs(a.sin_port);
    close(fd);
    return port;
}

int bench_free_port(void)
{
    int port = bench_bind_port(0);

    if (port < 0)
        bench_die("cannot find a free port: %s", strerror(errno));
    return port;
}

static size_t sink(char *data, size_t size, size_t n, void *arg)
{
    (void)data;
    (void)arg;
    return size * n;
}

/* POST body to path on the etcd, on handle h (keep-alive). 0 when it
 * answered 200. */
static int post(CURL *h, const char *path, const char *body)
{
    char url[256];
    long code = 0;

    snprintf(url, sizeof url, "%s%s", base_url, path);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    if (curl_easy_perform(h) != CURLE_OK)
        return -1;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    return code == 200 ? 0 : -1;
}

/* gRPC: whether the reply's trailers said grpc-status 0. */
static size_t grpc_ok_header(char *data, size_t size, size_t n, void *arg)
{
    if (size * n >= 14 && strncmp(data, "grpc-status: 0", 14) == 0)
        *(int *)arg = 1;
    return size * n;
}

/*
 * The raw gRPC put: KV/Put of key "dlock-bench-raw", value "x", over HTTP/2
 * on handle g. The first call asks for HTTP/2 by prior knowledge, the later
 * ones for HTTP/2 only, which reuses that connection: Debian 12's libcurl
 * fails a second prior-knowledge request on one connection (curl #10634;
 * etcd_request.c has the same rule).
 */
static int post_grpc_put(CURL *g)
{
    static const char body[] = "\x00\x00\x00\x00\x14\x0a\x0f" "dlock-bench-raw" "\x12\x01x";
    static int connected;
    char url[256];
    long code = 0;
    int ok = 0;

    snprintf(url, sizeof url, "%s/etcdserverpb.KV/Put", base_url);
    curl_easy_setopt(g, CURLOPT_URL, url);
    curl_easy_setopt(g, CURLOPT_HTTP_VERSION, connected ? (long)CURL_HTTP_VERSION_2_0
                                                        : (long)CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE);
    curl_easy_setopt(g, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(g, CURLOPT_POSTFIELDSIZE, (long)(sizeof body - 1));
    curl_easy_setopt(g, CURLOPT_HEADERFUNCTION, grpc_ok_header);
    curl_easy_setopt(g, CURLOPT_HEADERDATA, &ok);
    if (curl_easy_perform(g) != CURLE_OK)
        return -1;
    connected = 1;
    curl_easy_getinfo(g, CURLINFO_RESPONSE_CODE, &code);
    return code == 200 && ok ? 0 : -1;
}

static CURL *handle(void)
{
    CURL *h = curl_easy_init();

    if (h == NULL)
        bench_die("curl_easy_init failed");
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 5000L);
    /* As dlock: no proxy from the environment, so both sides go direct. */
    curl_easy_setopt(h, CURLOPT_PROXY, "");
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink);
    if (auth_token[0]) {
        static struct curl_slist *auth;
        static char line[sizeof auth_token + 32];
        if (auth == NULL) {
            snprintf(line, sizeof line, "Authorization: %s", auth_token);
            if ((auth = curl_slist_append(NULL, line)) == NULL)
                bench_die("out of memory");
        }
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, auth);
    }
    return h;
}

/*
 * The janitor: starts etcd, then waits until the bench closes the pipe (or
 * dies), kills etcd and removes the directory.
 */
static void janitor(int rd, const char *dir, char *const argv[])
{
    char buf[16], cmd[600];
    pid_t etcd;
    sigset_t none;

    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGINT, SIG_IGN); /* the bench decides; we follow the pipe */
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    etcd = fork();
    if (etcd == 0) {
        char logp[400];
        snprintf(logp, sizeof logp, "%s/etcd.log", dir);
        int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
        }
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execvp("etcd", argv);
        _exit(127);
    }
    while (read(rd, buf, sizeof buf) > 0 || errno == EINTR) {
    }
    if (etcd > 0) {
        kill(etcd, SIGKILL);
        waitpid(etcd, NULL, 0);
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) {
        /* nothing more to do */
    }
    _exit(0);
}

static void stop_etcd(void)
{
    if (janitor_pipe >= 0) {
        close(janitor_pipe);
        janitor_pipe = -1;
        waitpid(janitor_pid, NULL, 0);
    }
}

static void start_etcd(char *url, size_t url_size)
{
    static char dir[] = "/tmp/dlock-bench-etcd-XXXXXX";
    char data[96], client[64], peer[64], cluster[96];
    int peer_port, fds[2];

    if (mkdtemp(dir) == NULL)
        bench_die("mkdtemp: %s", strerror(errno));
    etcd_port = bench_free_port();
    peer_port = bench_free_port();
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(client, sizeof client, "http://127.0.0.1:%d", etcd_port);
    snprintf(peer, sizeof peer, "http://127.0.0.1:%d", peer_port);
    snprintf(cluster, sizeof cluster, "b=%s", peer);
    char *argv[] = {"etcd", "--name", "b", "--data-dir", data, "--listen-client-urls", client,
                    "--advertise-client-urls", client, "--listen-peer-urls", peer,
                    "--initial-advertise-peer-urls", peer, "--initial-cluster", cluster,
                    "--logger", "zap", "--log-level", "warn", NULL};
    if (pipe2(fds, O_CLOEXEC) != 0)
        bench_die("pipe: %s", strerror(errno));
    janitor_pid = fork();
    if (janitor_pid < 0)
        bench_die("fork: %s", strerror(errno));
    if (janitor_pid == 0) {
        close(fds[1]);
        janitor(fds[0], dir, argv);
    }
    close(fds[0]);
    janitor_pipe = fds[1];
    atexit(stop_etcd);
    snprintf(base_url, sizeof base_url, "%s", client);
    snprintf(url, url_size, "etcd://127.0.0.1:%d", etcd_port);

    CURL *h = handle();
    for (int i = 0; i < 200; i++) {
        if (post(h, "/v3/kv/range", "{\"key\":\"AA==\"}") == 0) {
            curl_easy_cleanup(h);
            return;
        }
        usleep(50 * 1000);
    }
    bench_die("etcd did not start (is etcd-server installed? see %s/etcd.log)", dir);
}

/* ---- what a cycle sends: etcd's own request counters -------------------- */

typedef struct {
    long long grant, revoke, keepalive, txn, range, del, put, watch;
    long long watchers; /* etcd's watchers now (a gauge, not a count) */
} reqs;

static size_t collect(char *data, size_t size, size_t n, void *arg)
{
    char **buf = arg;
    size_t old = *buf ? strlen(*buf) : 0;
    char *grown = realloc(*buf, old + size * n + 1);

    if (grown == NULL)
        return 0;
    memcpy(grown + old, data, size * n);
    grown[old + size * n] = 0;
    *buf = grown;
    return size * n;
}

static long long metric(const char *text, const char *method)
{
    char needle[128];
    long long sum = 0;
    const char *p = text;

    snprintf(needle, sizeof needle, "grpc_server_started_total{grpc_method=\"%s\"", method);
    while ((p = strstr(p, needle)) != NULL) {
        const char *sp = strchr(p, '}');
        if (sp != NULL)
            sum += (long long)strtod(sp + 1, NULL);
        p += strlen(needle);
    }
    return sum;
}

static void reqs_take(reqs *r)
{
    CURL *h = handle();
    char *text = NULL, url[256];

    snprintf(url, sizeof url, "%s/metrics", base_url);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &text);
    memset(r, 0, sizeof *r);
    if (curl_easy_perform(h) == CURLE_OK && text != NULL) {
        r->grant = metric(text, "LeaseGrant");
        r->revoke = metric(text, "LeaseRevoke");
        r->keepalive = metric(text, "LeaseKeepAlive");
        r->txn = metric(text, "Txn");
        r->range = metric(text, "Range");
        r->del = metric(text, "DeleteRange");
        r->put = metric(text, "Put");
        r->watch = metric(text, "Watch");
        static const char gauge[] = "\netcd_debugging_mvcc_watcher_total ";
        const char *w = strstr(text, gauge);
        r->watchers = w != NULL ? (long long)strtod(w + sizeof(gauge) - 1, NULL) : 0;
    }
    free(text);
    curl_easy_cleanup(h);
}

/* *sum += b - a, counter by counter (sum may be a). */
static void reqs_add(reqs *sum, const reqs *a, const reqs *b)
{
    sum->grant += b->grant - a->grant;
    sum->revoke += b->revoke - a->revoke;
    sum->keepalive += b->keepalive - a->keepalive;
    sum->txn += b->txn - a->txn;
    sum->range += b->range - a->range;
    sum->del += b->del - a->del;
    sum->put += b->put - a->put;
    sum->watch += b->watch - a->watch;
}

static void reqs_print(const char *label, const reqs *a, const reqs *b, long units)
{
    double u = (double)units;

    printf("  %-30s grant %.2f, txn %.2f, range %.2f, deleterange %.2f, revoke %.2f, "
           "keepalive %.2f, watch %.2f\n",
           label, (b->grant - a->grant) / u, (b->txn - a->txn) / u, (b->range - a->range) / u,
           (b->del - a->del) / u, (b->revoke - a->revoke) / u,
           (b->keepalive - a->keepalive) / u, (b->watch - a->watch) / u);
}

/* ---- python-etcd3 --------------------------------------------------------- */

/* etcd3_lock.py on the etcd at base_url (bench/peer.c): its cycles run
 * between dlock's, round by round (bench_etcd). Ready, or stopped with
 * why. */
static void py_start(bench_peer *py)
{
    char host[128], port[16];
    int p = 0;

    if (sscanf(base_url, "http://%127[^:]:%d", host, &p) != 2) {
        memset(py, 0, sizeof *py);
        snprintf(py->why, sizeof py->why, "cannot read host:port from %s", base_url);
        return;
    }
    snprintf(port, sizeof port, "%d", p);
    {
        /* Debian's python3, where python3-etcd3 is, whatever PATH says;
         * the root password, if any, by the environment. */
        char *argv[] = {"/usr/bin/python3", DLOCK_BENCH_ETCD3_SCRIPT, host, port, NULL};
        char *env[] = {"DLOCK_BENCH_ETCD_USER", "root", "DLOCK_BENCH_ETCD_PASSWORD", root_pw,
                       NULL};
        bench_peer_start(py, argv, root_pw[0] ? env : NULL,
                         "etcd3_lock.py failed (is python3-etcd3 installed?)");
    }
}

/* ---- measurements ---------------------------------------------------------- */

/* One acquire+release into s; with split, the acquire alone into split[0]
 * and the release alone into split[1] (where the cycle's time goes). */
static void cycle(dlock_client *c, const char *name, int auto_renew, bench_series *s,
                  bench_series *split)
{
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;
    dlock_lock *l = NULL;
    int64_t t0, t1;
    int rc;

    o.auto_renew = auto_renew;
    t0 = bench_now_ns();
    rc = dlock_acquire(&l, c, name, &o);
    if (rc != DLOCK_OK)
        bench_die("dlock_acquire: %s (%s)", dlock_strerror(rc), dlock_error_message());
    t1 = bench_now_ns();
    rc = dlock_release(l);
    if (rc != DLOCK_OK)
        bench_die("dlock_release: %s (%s)", dlock_strerror(rc), dlock_error_message());
    if (s != NULL)
        bench_series_add(s, bench_now_ns() - t0);
    if (split != NULL) {
        bench_series_add(&split[0], t1 - t0);
        bench_series_add(&split[1], bench_now_ns() - t1);
    }
}

static void raw(CURL *h, const char *path, const char *body, bench_series *s)
{
    int64_t t0 = bench_now_ns();

    if (post(h, path, body) != 0)
        bench_die("raw %s failed", path);
    if (s != NULL)
        bench_series_add(s, bench_now_ns() - t0);
}

static void raw_grpc_put(CURL *g, bench_series *s)
{
    int64_t t0 = bench_now_ns();

    if (post_grpc_put(g) != 0)
        bench_die("raw gRPC KV/Put failed");
    if (s != NULL)
        bench_series_add(s, bench_now_ns() - t0);
}

void *bench_waiter_main(void *arg)
{
    bench_waiter *w = arg;
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;

    o.wait_ms = DLOCK_WAIT_FOREVER;
    if (w->lease_ms)
        o.lease_ms = w->lease_ms;
    for (long i = 0; i < w->count; i++) {
        dlock_lock *l = NULL;
        int rc;
        while (sem_wait(&w->go) != 0) {
        }
        rc = dlock_acquire(&l, w->c, w->name, &o);
        w->end = bench_now_ns();
        if (rc != DLOCK_OK)
            bench_die("hand-off: B's dlock_acquire: %s (%s)", dlock_strerror(rc),
                      dlock_error_message());
        w->fence = dlock_lock_fence(l);
        if (dlock_release(l) != DLOCK_OK)
            bench_die("hand-off: B's dlock_release: %s", dlock_error_message());
        sem_post(&w->done);
    }
    return NULL;
}

/*
 * Turn authentication on in the throwaway etcd: a root user with a random
 * password (root_pw), and a token for the raw requests (auth_token); then
 * check that a request without the token is refused. url gets the
 * password, and insecure_auth=1: the etcd is on loopback.
 */
static void enable_auth(char *url, size_t url_size)
{
    CURL *h = handle();
    char body[256], *reply = NULL;
    long code = 0;
    const char *t;

    bench_random_password(root_pw);
    snprintf(body, sizeof body, "{\"name\":\"root\",\"password\":\"%s\"}", root_pw);
    if (post(h, "/v3/auth/user/add", body) != 0)
        bench_die("etcd: cannot add the root user");
    (void)post(h, "/v3/auth/role/add", "{\"name\":\"root\"}"); /* may exist already */
    if (post(h, "/v3/auth/user/grant", "{\"user\":\"root\",\"role\":\"root\"}") != 0 ||
        post(h, "/v3/auth/enable", "{}") != 0)
        bench_die("etcd: cannot enable authentication");
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &reply);
    if (post(h, "/v3/auth/authenticate", body) != 0 || reply == NULL ||
        (t = strstr(reply, "\"token\":\"")) == NULL)
        bench_die("etcd: cannot authenticate as root");
    t += 9;
    snprintf(auth_token, sizeof auth_token, "%.*s", (int)strcspn(t, "\""), t);
    free(reply);
    curl_easy_cleanup(h);
    /* Refused without the token: an unauthenticated read. */
    h = handle(); /* with the token */
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
    snprintf(body, sizeof body, "%s/v3/kv/range", base_url);
    curl_easy_setopt(h, CURLOPT_URL, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, "{\"key\":\"AA==\"}");
    if (curl_easy_perform(h) != CURLE_OK)
        bench_die("etcd: no answer after enabling authentication");
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(h);
    if (code == 200)
        bench_die("etcd at %s answers a client without a token", base_url);
    snprintf(url, url_size, "etcd://root:%s@127.0.0.1:%d?insecure_auth=1", root_pw, etcd_port);
}

int bench_etcd(const char *given_url, long iterations)
{
    char url[1024], name[2][96], hname[96], rawkey[160];
    long n = iterations / 5 < 20 ? 20 : iterations / 5, handoffs = n / 10 < 20 ? 20 : n / 10;
    dlock_client *client[2] = {NULL, NULL}, *ca = NULL, *cb = NULL;
    bench_series range = {0}, put = {0}, gput = {0}, cyc[2] = {{0}, {0}}, hand = {0};
    bench_series split[2] = {{0}, {0}}; /* acquire, release (auto_renew 0) */
    CURL *g;
    struct curl_slist *grpc_headers = NULL;
    reqs r0, r1, r2;
    CURL *h;
    bench_waiter w;
    pthread_t tb;
    int own = given_url == NULL, py_ok;
    double py[4] = {0, 0, 0, 0};
    bench_peer peer;

    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (own) {
        start_etcd(url, sizeof url);
        enable_auth(url, sizeof url);
    } else {
        const char *p = strstr(given_url, "://"), *q = strchr(given_url, '?');
        snprintf(url, sizeof url, "%s", given_url);
        /* ?transport=gateway: dlock over the JSON gateway, for comparison. */
        if (strncmp(given_url, "etcd://", 7) != 0 || strpbrk(p + 3, ",@") != NULL ||
            (q != NULL && (strncmp(q, "?transport=", 11) != 0 || strchr(q, '&') != NULL)))
            bench_die("--etcd --url wants etcd://host:port[?transport=grpc|gateway] (one "
                      "endpoint, no TLS or user)");
        snprintf(base_url, sizeof base_url, "http://%.100s", p + 3);
        base_url[strcspn(base_url + 7, "/?") + 7] = 0;
    }
    for (int a = 0; a < 2; a++)
        if (dlock_client_open(&client[a], url, NULL) != DLOCK_OK)
            bench_die("dlock_client_open: %s", dlock_error_message());
    h = handle();
    g = handle();
    grpc_headers = curl_slist_append(grpc_headers, "Content-Type: application/grpc");
    grpc_headers = curl_slist_append(grpc_headers, "TE: trailers");
    if (auth_token[0]) {
        char line[sizeof auth_token + 32];
        snprintf(line, sizeof line, "authorization: %s", auth_token);
        grpc_headers = curl_slist_append(grpc_headers, line);
    }
    if (grpc_headers == NULL)
        bench_die("out of memory");
    curl_easy_setopt(g, CURLOPT_HTTPHEADER, grpc_headers);
    snprintf(name[0], sizeof name[0], "bench-%ld-renew0", (long)getpid());
    snprintf(name[1], sizeof name[1], "bench-%ld-renew1", (long)getpid());
    snprintf(hname, sizeof hname, "bench-%ld-handoff", (long)getpid());
    /* base64 of "dlock-bench-raw" */
    snprintf(rawkey, sizeof rawkey, "{\"key\":\"ZGxvY2stYmVuY2gtcmF3\"}");

    printf("dlock-bench --etcd: dlock %s, etcd at %s%s\n", dlock_version(), bench_redacted(url),
           own ? " (started by this run, data on disk)" : "");
    printf("  %ld latency samples each, %ld hand-offs\n", n, handoffs);

    py_start(&peer);
    for (long i = 0; i < n / 10 + 20; i++) { /* warm-up */
        raw(h, "/v3/kv/range", rawkey, NULL);
        raw_grpc_put(g, NULL);
        cycle(client[1], name[1], 1, NULL, NULL);
        cycle(client[0], name[0], 0, NULL, NULL);
    }
    for (int round = 0; round < 10; round++) {
        long per = n / 10 + (round < n % 10);
        for (long i = 0; i < per; i++)
            raw(h, "/v3/kv/range", rawkey, &range);
        for (long i = 0; i < per; i++)
            raw(h, "/v3/kv/put", "{\"key\":\"ZGxvY2stYmVuY2gtcmF3\",\"value\":\"eA==\"}", &put);
        for (long i = 0; i < per; i++)
            raw_grpc_put(g, &gput);
        for (long i = 0; i < per; i++)
            cycle(client[1], name[1], 1, &cyc[1], NULL);
        for (long i = 0; i < per; i++)
            cycle(client[0], name[0], 0, &cyc[0], split);
        bench_peer_cmd(&peer, "cycles", per); /* python-etcd3's, in the same round */
    }
    raw(h, "/v3/kv/deleterange", rawkey, NULL);
    /* What the cycles send, counted apart from the raw calls. */
    reqs_take(&r0);
    for (int i = 0; i < 50; i++) {
        cycle(client[1], name[1], 1, NULL, NULL);
        cycle(client[0], name[0], 0, NULL, NULL);
    }
    reqs_take(&r1);

    /* Hand-off: A holds, B waits; A releases at t0, B's acquire returns at t1. */
    long chunk = handoffs / 5 > 0 ? handoffs / 5 : 1;
    reqs py_sent = {0}, none = {0}, r1h;
    if (dlock_client_open(&ca, url, NULL) != DLOCK_OK || dlock_client_open(&cb, url, NULL) != DLOCK_OK)
        bench_die("dlock_client_open: %s", dlock_error_message());
    memset(&w, 0, sizeof w);
    w.c = cb;
    w.name = hname;
    w.count = handoffs + 5;
    sem_init(&w.go, 0, 0);
    sem_init(&w.done, 0, 0);
    if (pthread_create(&tb, NULL, bench_waiter_main, &w) != 0)
        bench_die("pthread_create failed");
    for (long i = 0; i < handoffs + 5; i++) {
        dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;
        dlock_lock *l = NULL;
        struct timespec hold = {0, HOLD_MS * 1000000L};
        reqs before;
        int64_t t0;
        /* The previous round's watcher is gone (its cancel reached etcd). */
        for (int k = 0; k < 5000; k++) {
            reqs_take(&before);
            if (before.watchers == 0)
                break;
            nanosleep(&hold, NULL);
        }
        if (dlock_acquire(&l, ca, hname, &o) != DLOCK_OK)
            bench_die("hand-off: A's dlock_acquire: %s", dlock_error_message());
        reqs_take(&before);
        sem_post(&w.go);
        /* B must be queued and asleep in its watch before A lets go: etcd
         * counts B's watcher once it reached the server (a watch of the
         * client's one Watch stream). */
        for (int k = 0; k < 5000; k++) {
            reqs now;
            nanosleep(&hold, NULL);
            reqs_take(&now);
            if (now.watchers > before.watchers)
                break;
        }
        t0 = bench_now_ns();
        if (dlock_release(l) != DLOCK_OK)
            bench_die("hand-off: A's dlock_release: %s", dlock_error_message());
        while (sem_wait(&w.done) != 0) {
        }
        if (w.end < t0)
            bench_die("hand-off: B got the lock before A released it");
        if (i >= 5)
            bench_series_add(&hand, w.end - t0);
        /* python-etcd3's hand-offs in the same rounds, five of them; what
         * they send is kept out of dlock's counts. */
        if (i >= 5 && ((i - 4) % chunk == 0 || i == handoffs + 4)) {
            reqs pb, pa;
            reqs_take(&pb);
            bench_peer_cmd(&peer, "handoffs", (i - 4) % chunk == 0 ? chunk : (i - 4) % chunk);
            reqs_take(&pa);
            reqs_add(&py_sent, &pb, &pa);
        }
    }
    pthread_join(tb, NULL);
    reqs_take(&r2);
    r1h = r1; /* r1 + python's: dlock's alone from there to r2 */
    reqs_add(&r1h, &none, &py_sent);
    py_ok = bench_peer_report(&peer, py, 4);

    {
        double r50 = bench_series_us(&range, 50), p50 = bench_series_us(&put, 50);
        double g50 = bench_series_us(&gput, 50);
        printf("\n%-38s %9s %9s  %s\n", "measurement", "p50 us", "p99 us", "p50 / range p50");
        printf("%-38s %9.1f %9.1f  %6.2f\n", "raw /v3/kv/range (libcurl)", r50, bench_series_us(&range, 99),
               1.0);
        printf("%-38s %9.1f %9.1f  %6.2f\n", "raw /v3/kv/put (raft write)", p50, bench_series_us(&put, 99),
               p50 / r50);
        printf("%-38s %9.1f %9.1f  %6.2f\n", "raw gRPC KV/Put (raft write)", g50,
               bench_series_us(&gput, 99), g50 / r50);
        for (int a = 1; a >= 0; a--) {
            char label[64];
            double c50 = bench_series_us(&cyc[a], 50);
            snprintf(label, sizeof label, "cycle acquire+release, auto_renew=%d", a);
            printf("%-38s %9.1f %9.1f  %6.2f   (%.2f x put)\n", label, c50, bench_series_us(&cyc[a], 99),
                   c50 / r50, c50 / p50);
        }
        for (int k = 0; k < 2; k++) {
            double s50 = bench_series_us(&split[k], 50);
            printf("%-38s %9.1f %9.1f  %6.2f   (%.2f x put)\n",
                   k == 0 ? "  of which acquire (auto_renew=0)" : "  of which release (auto_renew=0)",
                   s50, bench_series_us(&split[k], 99), s50 / r50, s50 / p50);
        }
        printf("%-38s %9.1f %9.1f  %6.2f   (%.2f x put)\n", "hand-off release -> next holder",
               bench_series_us(&hand, 50), bench_series_us(&hand, 99), bench_series_us(&hand, 50) / r50, bench_series_us(&hand, 50) / p50);
        if (py_ok) {
            double c0 = bench_series_us(&cyc[0], 50), h50 = bench_series_us(&hand, 50);
            printf("%-38s %9.1f %9.1f  %6.2f   (%.2f x put)\n", "python-etcd3 Lock cycle", py[0], py[1],
                   py[0] / r50, py[0] / p50);
            printf("%-38s %9.1f %9.1f  %6.2f   (%.2f x put)\n", "python-etcd3 Lock hand-off", py[2],
                   py[3], py[2] / r50, py[2] / p50);
            printf("\ndlock / python-etcd3 (p50): cycle (auto_renew=0) %.2fx, hand-off %.2fx "
                   "(the goal: at most 0.6x)\n", c0 / py[0], h50 / py[2]);
            printf("to the raw gRPC put (p50): dlock cycle %.2fx, hand-off %.2fx; python-etcd3 "
                   "cycle %.2fx, hand-off %.2fx\n", c0 / g50, h50 / g50, py[0] / g50, py[2] / g50);
        } else {
            printf("\npython-etcd3: not measured: %s\n", peer.why);
        }
        printf("\netcd requests per unit (etcd's grpc_server_started_total):\n");
        reqs_print("per cycle:", &r0, &r1, 100);
        reqs_print("per hand-off (A and B):", &r1h, &r2, handoffs + 5);
    }

    curl_easy_cleanup(h);
    curl_easy_cleanup(g);
    curl_slist_free_all(grpc_headers);
    dlock_client_free(ca);
    dlock_client_free(cb);
    dlock_client_free(client[0]);
    dlock_client_free(client[1]);
    free(range.v);
    free(put.v);
    free(gput.v);
    free(cyc[0].v);
    free(cyc[1].v);
    free(hand.v);
    free(split[0].v);
    free(split[1].v);
    stop_etcd();
    return 0;
}
