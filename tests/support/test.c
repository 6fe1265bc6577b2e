/* SPDX-License-Identifier: BSD-3-Clause */
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <stdarg.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "plain_backend.h"
#include "test.h"
#ifdef DLOCK_TEST_POSTGRES
#include "test_pg.h"
#endif

int test_run(const test_case *cases, size_t n, int argc, char **argv)
{
    /* SIGPIPE keeps its default action: the library must never raise it. */
    if (argc != 2) {
        fprintf(stderr, "usage: %s TEST | --list\ntests:", argv[0]);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, " %s", cases[i].name);
        fprintf(stderr, "\n");
        return 2;
    }
    if (strcmp(argv[1], "--list") == 0) {
        for (size_t i = 0; i < n; i++) {
            if (cases[i].labels != NULL && strcmp(cases[i].labels, TEST_CHILD) == 0)
                continue;
            printf("%s %s\n", cases[i].name, cases[i].labels ? cases[i].labels : "");
        }
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (strcmp(cases[i].name, argv[1]) == 0) {
            cases[i].fn();
            printf("ok %s\n", cases[i].name);
            return 0;
        }
    }
    fprintf(stderr, "no test called %s\n", argv[1]);
    return 2;
}

int64_t test_clock_ms(int clock)
{
    struct timespec ts;

    clock_gettime((clockid_t)clock, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int test_fd_target(int fd, char *target, size_t size)
{
    char path[64];
    ssize_t n;

    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    n = readlink(path, target, size - 1);
    if (n <= 0 || (size_t)n >= size - 1)
        return 0;
    target[n] = '\0';
    return 1;
}

void test_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

const char *test_faketime_lib(void)
{
    static const char *const paths[] = {
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/faketime/libfaketimeMT.so.1",
        "/usr/local/lib/faketime/libfaketimeMT.so.1",
    };
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++)
        if (access(paths[i], R_OK) == 0)
            return paths[i];
    return NULL;
}

static int free_port(void)
{
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0), port;

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        perror("free_port");
        exit(1);
    }
    port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static redisContext *connect_raw(test_redis *r)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);

    if (c != NULL && c->err) {
        redisFree(c);
        return NULL;
    }
    return c;
}

/* connect_raw, or exit the test naming who could not connect. */
static redisContext *connect_must(test_redis *r, const char *who)
{
    redisContext *c = connect_raw(r);

    if (c == NULL) {
        fprintf(stderr, "%s: cannot connect to port %d\n", who, r->port);
        exit(1);
    }
    return c;
}

/* Start the server of r; 0 once it answers, -1 when it exited at start
 * (a port taken meanwhile), exit(1) on any other failure. */
static int spawn_try(test_redis *r)
{
    char port[16], tls_port[16], *args[64];
    int n = 0;
    char extra[sizeof(r->extra)];

    snprintf(port, sizeof(port), "%d", r->port);
    if (r->conf[0] != '\0') {
        /* A sentinel: its config file (which it rewrites) comes first. */
        args[n++] = "redis-sentinel";
        args[n++] = r->conf;
    } else {
        args[n++] = "redis-server";
    }
    args[n++] = "--port";
    args[n++] = port;
    args[n++] = "--bind";
    args[n++] = "127.0.0.1";
    args[n++] = "--dir";
    args[n++] = r->dir;
    args[n++] = "--save";
    args[n++] = "";
    args[n++] = "--appendonly";
    args[n++] = "no";
    args[n++] = "--loglevel";
    args[n++] = "warning";
    if (r->tls_port != 0) {
        snprintf(tls_port, sizeof(tls_port), "%d", r->tls_port);
        args[n++] = "--tls-port";
        args[n++] = tls_port;
    }
    snprintf(extra, sizeof(extra), "%s", r->extra);
    for (char *tok = strtok(extra, " "); tok != NULL && n < 62; tok = strtok(NULL, " "))
        args[n++] = tok;
    args[n] = NULL;

    r->pid = fork();
    if (r->pid == 0) {
        /* A test that fails exits at once: take the server with it. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int devnull = open("/dev/null", 1);
        if (devnull >= 0)
            dup2(devnull, 1);
        execvp(args[0], args);
        fprintf(stderr, "cannot run %s: %s (install it: apt-get install %s)\n", args[0],
                strerror(errno), args[0]);
        _exit(127);
    }
    for (int i = 0; i < 500; i++) {
        redisContext *c;
        int status;
        if (waitpid(r->pid, &status, WNOHANG) == r->pid) {
            fprintf(stderr, "redis-server exited at start (status %d)\n", status);
            r->pid = 0;
            return -1;
        }
        if ((c = connect_raw(r)) != NULL) {
            redisReply *rep = redisCommand(c, "PING");
            int ok = rep != NULL && rep->type == REDIS_REPLY_STATUS;
            if (rep)
                freeReplyObject(rep);
            redisFree(c);
            if (ok || strstr(r->extra, "requirepass") != NULL)
                return 0;
        }
        test_sleep_ms(10);
    }
    fprintf(stderr, "redis-server did not start on port %d\n", r->port);
    exit(1);
}

static void spawn(test_redis *r)
{
    if (spawn_try(r) != 0)
        exit(1);
}

/* Servers of this process, removed at exit even when a check failed. */
#define STARTED_MAX 24
static test_redis *started[STARTED_MAX];
static pid_t owner;

static void cleanup_servers(void)
{
    if (getpid() != owner) /* a forked test child exiting */
        return;
    for (int i = 0; i < STARTED_MAX; i++)
        if (started[i] != NULL && started[i]->pid > 0)
            test_redis_stop(started[i]);
}

/* Start a server, on a TLS port too when tls; r->url is redis:// (the
 * caller of a TLS one writes its own). */
static void start_redis_at(test_redis *r, const char *extra_args, int tls, const char *conf,
                           int port)
{
    if (owner == 0) {
        owner = getpid();
        atexit(cleanup_servers);
    }
    for (int i = 0; i < STARTED_MAX; i++)
        if (started[i] == NULL || started[i] == r) {
            started[i] = r;
            break;
        }
    memset(r, 0, sizeof(*r));
    snprintf(r->dir, sizeof(r->dir), "/tmp/dlock-test-XXXXXX");
    if (mkdtemp(r->dir) == NULL) {
        perror("mkdtemp");
        exit(1);
    }
    snprintf(r->extra, sizeof(r->extra), "%s", extra_args ? extra_args : "");
    snprintf(r->conf, sizeof(r->conf), "%s", conf ? conf : "");
    /* A port free when picked can be taken before the server binds it (by
     * another test, or as a connection's local port; a cluster node's bus
     * port too): such a start is tried again, on new ports where they are
     * ours to pick. */
    for (int attempt = 0;; attempt++) {
        r->port = port != 0 ? port : free_port();
        r->tls_port = tls ? free_port() : 0;
        snprintf(r->url, sizeof(r->url), "redis://127.0.0.1:%d", r->port);
        if (spawn_try(r) == 0)
            return;
        if (attempt == 4)
            exit(1);
        fprintf(stderr, "starting it again (try %d of 5)\n", attempt + 2);
        test_sleep_ms(200);
    }
}

static void start_redis(test_redis *r, const char *extra_args, int tls, const char *conf)
{
    start_redis_at(r, extra_args, tls, conf, 0);
}

void test_redis_start(test_redis *r, const char *extra_args)
{
    start_redis(r, extra_args, 0, NULL);
}

/* ---- TLS ---------------------------------------------------------------- */

static void run_sh(const char *cmd)
{
    int rc = system(cmd);

    if (rc != 0) {
        fprintf(stderr, "making TLS certificates failed (status %d; needs openssl and "
                "faketime; see openssl.log in the folder): %s\n", rc, cmd);
        exit(1);
    }
}

const char *test_tls_file(const test_tls *t, const char *name)
{
    static char buf[128];

    snprintf(buf, sizeof(buf), "%s/%s", t->dir, name);
    return buf;
}

void test_tls_make(test_tls *t)
{
    char cmd[512];
    const char *faketime = test_faketime_lib();

    snprintf(t->dir, sizeof(t->dir), "/tmp/dlock-tls-XXXXXX");
    if (mkdtemp(t->dir) == NULL) {
        perror("mkdtemp");
        exit(1);
    }
    if (faketime == NULL) {
        fprintf(stderr, "libfaketime not found (apt-get install faketime): needed for the "
                "expired certificate\n");
        exit(1);
    }
    snprintf(cmd, sizeof(cmd), "sh %s %s %s", DLOCK_TEST_MAKE_CERTS, t->dir, faketime);
    run_sh(cmd);
}

void test_tls_remove(test_tls *t)
{
    char cmd[128];

    if (t->dir[0] == '\0')
        return;
    snprintf(cmd, sizeof(cmd), "rm -rf %s", t->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", t->dir);
    t->dir[0] = '\0';
}

void test_redis_start_tls(test_redis *r, const test_tls *t, const char *cert,
                          const char *extra_args)
{
    char extra[sizeof(r->extra)];

    snprintf(extra, sizeof(extra), "--tls-cert-file %s/%s.crt --tls-key-file %s/%s.key "
             "--tls-ca-cert-file %s/ca.crt %s %s", t->dir, cert, t->dir, cert, t->dir,
             extra_args != NULL && strstr(extra_args, "--tls-auth-clients") != NULL
                 ? "" : "--tls-auth-clients no",
             extra_args != NULL ? extra_args : "");
    start_redis(r, extra, 1, NULL);
    snprintf(r->url, sizeof(r->url), "rediss://127.0.0.1:%d?cacert=%s/ca.crt", r->tls_port,
             t->dir);
}

void test_redis_start_many(test_redis *r, int n, const char *extra_args, char *url,
                           size_t size)
{
    size_t len = (size_t)snprintf(url, size, "redlock://");

    if (n > TEST_REDLOCK_MAX) {
        fprintf(stderr, "test_redis_start_many: at most %d servers\n", TEST_REDLOCK_MAX);
        exit(2);
    }
    for (int i = 0; i < n; i++) {
        test_redis_start(&r[i], extra_args);
        len += (size_t)snprintf(url + len, len < size ? size - len : 0, "%s127.0.0.1:%d",
                                i > 0 ? "," : "", r[i].port);
    }
}

void test_redis_restart(test_redis *r)
{
    spawn(r);
}

void test_redis_kill(test_redis *r)
{
    if (r->pid > 0) {
        kill(r->pid, SIGKILL);
        waitpid(r->pid, NULL, 0);
        r->pid = 0;
    }
}

void test_redis_stop(test_redis *r)
{
    char cmd[128];

    for (int i = 0; i < STARTED_MAX; i++)
        if (started[i] == r)
            started[i] = NULL;
    test_redis_kill(r);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", r->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", r->dir);
}

/* A command's reply as test_redis_cmd tells it (-1: an error or none),
 * freed. */
static long long reply_number(redisReply *rep)
{
    long long v = -1;

    if (rep != NULL) {
        if (rep->type == REDIS_REPLY_INTEGER)
            v = rep->integer;
        else if (rep->type == REDIS_REPLY_STRING || rep->type == REDIS_REPLY_STATUS)
            v = (long long)rep->len;
        else if (rep->type == REDIS_REPLY_ARRAY)
            v = (long long)rep->elements;
        freeReplyObject(rep);
    }
    return v;
}

/* One command on a connection of its own to r (who: for the message when
 * it cannot connect). */
static redisReply *raw_vcommand(test_redis *r, const char *who, const char *fmt, va_list ap)
{
    redisContext *c = connect_must(r, who);
    redisReply *rep = redisvCommand(c, fmt, ap);

    redisFree(c);
    return rep;
}

long long test_redis_cmd(test_redis *r, const char *fmt, ...)
{
    redisReply *rep;
    va_list ap;

    va_start(ap, fmt);
    rep = raw_vcommand(r, "test_redis_cmd", fmt, ap);
    va_end(ap);
    return reply_number(rep);
}

long long test_redis_numsub(test_redis *r, const char *channel)
{
    redisContext *c = connect_raw(r);
    redisReply *rep;
    long long v = -1;

    if (c == NULL) {
        fprintf(stderr, "test_redis_numsub: cannot connect to port %d\n", r->port);
        exit(1);
    }
    /* The reply is [channel, count]: the count is the second element. */
    rep = redisCommand(c, "PUBSUB NUMSUB %s", channel);
    if (rep != NULL && rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
        rep->element[1]->type == REDIS_REPLY_INTEGER)
        v = rep->element[1]->integer;
    if (rep != NULL)
        freeReplyObject(rep);
    redisFree(c);
    if (v < 0) {
        fprintf(stderr, "test_redis_numsub: no count in the reply of PUBSUB NUMSUB %s\n",
                channel);
        exit(1);
    }
    return v;
}

long long test_redis_calls(test_redis *r, const char *command)
{
    redisContext *c = connect_raw(r);
    redisReply *rep;
    long long v = 0;
    char needle[64];

    if (c == NULL) {
        fprintf(stderr, "test_redis_calls: cannot connect\n");
        exit(1);
    }
    rep = redisCommand(c, "INFO commandstats");
    snprintf(needle, sizeof(needle), "cmdstat_%s:calls=", command);
    if (rep != NULL && rep->type == REDIS_REPLY_STRING) {
        const char *p = strstr(rep->str, needle);
        if (p != NULL)
            v = atoll(p + strlen(needle));
    }
    if (rep)
        freeReplyObject(rep);
    redisFree(c);
    return v;
}

/* ------------------------------------------------------------------------
 * etcd members: single node or a cluster on loopback ports
 * ---------------------------------------------------------------------- */

#include <curl/curl.h>
#include <jansson.h>

#include "backends/etcd/etcd_codec.h"

/* Clusters of this process, stopped at exit even when a check failed. */
static test_etcd *etcd_started[4];
static pid_t etcd_owner;

static void etcd_cleanup(void)
{
    if (getpid() != etcd_owner) /* a forked test child exiting */
        return;
    for (int i = 0; i < 4; i++)
        if (etcd_started[i] != NULL)
            test_etcd_stop(etcd_started[i]);
}

typedef struct {
    char *buf;
    size_t len;
} etcd_body;

static size_t etcd_on_data(char *data, size_t size, size_t n, void *arg)
{
    etcd_body *b = arg;
    char *grown = realloc(b->buf, b->len + size * n + 1);

    if (grown == NULL)
        return 0;
    memcpy(grown + b->len, data, size * n);
    b->buf = grown;
    b->len += size * n;
    b->buf[b->len] = '\0';
    return size * n;
}

/* GET (body NULL) or POST on 127.0.0.1:port; the reply body or NULL. */
static char *etcd_http(const test_etcd *e, int port, const char *path, const char *body,
                       long timeout_ms)
{
    CURL *c = curl_easy_init();
    etcd_body b = {NULL, 0};
    char url[128], file[160];
    CURLcode res;

    if (c == NULL)
        return NULL;
    snprintf(url, sizeof(url), "%s://127.0.0.1:%d%s", e->tls[0] ? "https" : "http", port, path);
    if (e->tls[0]) {
        snprintf(file, sizeof(file), "%s/ca.pem", e->tls);
        curl_easy_setopt(c, CURLOPT_CAINFO, file);
        snprintf(file, sizeof(file), "%s/client.pem", e->tls);
        curl_easy_setopt(c, CURLOPT_SSLCERT, file);
        snprintf(file, sizeof(file), "%s/client.key", e->tls);
        curl_easy_setopt(c, CURLOPT_SSLKEY, file);
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROXY, ""); /* never http_proxy: the servers are local */
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, etcd_on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    if (body != NULL)
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    res = curl_easy_perform(c);
    curl_easy_cleanup(c);
    if (res != CURLE_OK) {
        free(b.buf);
        return NULL;
    }
    if (b.buf == NULL)
        b.buf = calloc(1, 1);
    return b.buf;
}

static void etcd_spawn(test_etcd *e, int i)
{
    char name[16], data[96], client[64], peer[64], cluster[512], token[64], logf[96];
    char heartbeat[] = "50", election[] = "500", extra[256], *args[56];
    char cert[160], key[160], ca[160];
    int n = 0;
    size_t used = 0;

    snprintf(name, sizeof(name), "n%d", i);
    snprintf(data, sizeof(data), "%s/m%d", e->dir, i);
    snprintf(logf, sizeof(logf), "%s/m%d.log", e->dir, i);
    snprintf(client, sizeof(client), "%s://127.0.0.1:%d", e->tls[0] ? "https" : "http",
             e->client_port[i]);
    snprintf(peer, sizeof(peer), "http://127.0.0.1:%d", e->peer_port[i]);
    snprintf(token, sizeof(token), "dlock-test-%d-%d", (int)etcd_owner, e->client_port[0]);
    cluster[0] = '\0';
    for (int m = 0; m < e->n; m++)
        used += (size_t)snprintf(cluster + used, sizeof(cluster) - used, "%sn%d=http://127.0.0.1:%d",
                                 m ? "," : "", m, e->peer_port[m]);
    args[n++] = "etcd";
    args[n++] = "--name";
    args[n++] = name;
    args[n++] = "--data-dir";
    args[n++] = data;
    args[n++] = "--listen-client-urls";
    args[n++] = client;
    args[n++] = "--advertise-client-urls";
    args[n++] = client;
    args[n++] = "--listen-peer-urls";
    args[n++] = peer;
    args[n++] = "--initial-advertise-peer-urls";
    args[n++] = peer;
    args[n++] = "--initial-cluster";
    args[n++] = cluster;
    args[n++] = "--initial-cluster-state";
    args[n++] = "new";
    args[n++] = "--initial-cluster-token";
    args[n++] = token;
    /* Fast elections, and a minimum lease TTL of 1 s (3/2 election ticks). */
    args[n++] = "--heartbeat-interval";
    args[n++] = heartbeat;
    args[n++] = "--election-timeout";
    args[n++] = election;
    args[n++] = "--logger";
    args[n++] = "zap";
    args[n++] = "--log-level";
    args[n++] = "warn";
    if (e->tls[0]) {
        snprintf(cert, sizeof(cert), "%s/server.pem", e->tls);
        snprintf(key, sizeof(key), "%s/server.key", e->tls);
        snprintf(ca, sizeof(ca), "%s/ca.pem", e->tls);
        args[n++] = "--cert-file";
        args[n++] = cert;
        args[n++] = "--key-file";
        args[n++] = key;
        args[n++] = "--client-cert-auth";
        args[n++] = "--trusted-ca-file";
        args[n++] = ca;
    }
    snprintf(extra, sizeof(extra), "%s", e->extra);
    for (char *tok = strtok(extra, " "); tok != NULL && n < 54; tok = strtok(NULL, " "))
        args[n++] = tok;
    args[n] = NULL;

    e->pid[i] = fork();
    if (e->pid[i] < 0) {
        perror("fork");
        exit(1);
    }
    if (e->pid[i] == 0) {
        /* A test that fails exits at once: take the member with it. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != etcd_owner)
            _exit(1);
        int fd = open(logf, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execvp("etcd", args);
        fprintf(stderr, "cannot run etcd: %s (install it: apt-get install etcd-server)\n",
                strerror(errno));
        _exit(127);
    }
}

/* A CA, and server (127.0.0.1) and client certificates it signed, in
 * e->dir/tls. */
static void etcd_make_certs(test_etcd *e)
{
    char cmd[2048];

    snprintf(e->tls, sizeof(e->tls), "%s/tls", e->dir);
    snprintf(cmd, sizeof(cmd),
             "set -e; mkdir -p %1$s; cd %1$s; exec >openssl.log 2>&1; "
             "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 "
             "-subj /CN=dlock-test-ca; "
             "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr "
             "-subj /CN=127.0.0.1; "
             "printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' "
             ">server.ext; "
             "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
             "-out server.pem -days 2 -extfile server.ext; "
             "openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr "
             "-subj /CN=dlock-client; "
             "printf 'extendedKeyUsage=clientAuth\n' >client.ext; "
             "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
             "-out client.pem -days 2 -extfile client.ext",
             e->tls);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot make test certificates with openssl in %s (apt-get install "
                "openssl; see %s/openssl.log)\n", e->tls, e->tls);
        exit(1);
    }
}

static int etcd_healthy(test_etcd *e, int i)
{
    char *r = etcd_http(e, e->client_port[i], "/health", NULL, 1000);
    int ok = r != NULL && strstr(r, "\"health\":\"true\"") != NULL;

    free(r);
    return ok;
}

static void etcd_show_log(test_etcd *e, int i)
{
    char cmd[160];

    snprintf(cmd, sizeof(cmd), "tail -n 20 %s/m%d.log >&2", e->dir, i);
    if (system(cmd) != 0)
        fprintf(stderr, "(no log)\n");
}

/* 1 if member i's log says a port was taken. */
static int etcd_port_taken(test_etcd *e, int i)
{
    char path[96], buf[4096];
    FILE *f;
    int taken = 0;

    snprintf(path, sizeof(path), "%s/m%d.log", e->dir, i);
    if ((f = fopen(path, "r")) == NULL)
        return 0;
    while (!taken && fgets(buf, sizeof(buf), f) != NULL)
        taken = strstr(buf, "address already in use") != NULL;
    fclose(f);
    return taken;
}

/* Wait until member i answers healthy (it has a leader). Returns 0, or -1
 * when it exited because a port was taken (the caller may retry); any other
 * failure ends the test. */
static int etcd_wait_healthy(test_etcd *e, int i)
{
    for (int t = 0; t < 600; t++) {
        int status;
        if (waitpid(e->pid[i], &status, WNOHANG) == e->pid[i]) {
            e->pid[i] = 0;
            if (etcd_port_taken(e, i))
                return -1;
            fprintf(stderr, "etcd member %d exited at start (status %d); its log:\n", i, status);
            etcd_show_log(e, i);
            exit(1);
        }
        if (etcd_healthy(e, i))
            return 0;
        test_sleep_ms(50);
    }
    fprintf(stderr, "etcd member %d did not become healthy on port %d; its log:\n", i,
            e->client_port[i]);
    etcd_show_log(e, i);
    exit(1);
}

/* A free loopback port below the kernel's ephemeral range, so that no
 * outgoing connection (of this or a parallel test) takes it between this
 * check and the server's bind (etcd, ZooKeeper). */
void *test_shared_page(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

    CHECK(p != MAP_FAILED);
    memset(p, 0, size);
    return p;
}

int test_free_port(void)
{
    static unsigned seed;
    int low = 32768;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");

    if (f != NULL) {
        if (fscanf(f, "%d", &low) != 1)
            low = 32768;
        fclose(f);
    }
    if (seed == 0)
        seed = (unsigned)getpid() ^ (unsigned)time(NULL);
    for (int tries = 0; low > 12000 && tries < 200; tries++) {
        struct sockaddr_in a;
        int fd = socket(AF_INET, SOCK_STREAM, 0), port, ok;
        port = 10000 + (int)(rand_r(&seed) % (unsigned)(low - 10000));
        memset(&a, 0, sizeof(a));
        a.sin_family = AF_INET;
        a.sin_port = htons((uint16_t)port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
        if (fd >= 0)
            close(fd);
        if (ok)
            return port;
    }
    return free_port();
}

static void etcd_start(test_etcd *e, int members, const char *extra_args, int tls)
{
    size_t used = 0;
    int attempt = 0;

    if (members < 1 || members > TEST_ETCD_MAX) {
        fprintf(stderr, "test_etcd_start: 1..%d members\n", TEST_ETCD_MAX);
        exit(1);
    }
    if (etcd_owner == 0) {
        etcd_owner = getpid();
        atexit(etcd_cleanup);
    }
    for (int i = 0; i < 4; i++)
        if (etcd_started[i] == NULL || etcd_started[i] == e) {
            etcd_started[i] = e;
            break;
        }
    memset(e, 0, sizeof(*e));
    e->n = members;
    snprintf(e->dir, sizeof(e->dir), "/tmp/dlock-etcd-XXXXXX");
    if (mkdtemp(e->dir) == NULL) {
        perror("mkdtemp");
        exit(1);
    }
    snprintf(e->extra, sizeof(e->extra), "%s", extra_args ? extra_args : "");
    if (tls)
        etcd_make_certs(e);
again:
    used = (size_t)snprintf(e->url, sizeof(e->url), tls ? "etcds://" : "etcd://");
    for (int i = 0; i < members; i++) {
        e->client_port[i] = test_free_port();
        e->peer_port[i] = test_free_port();
        snprintf(e->member_url[i], sizeof(e->member_url[i]), "%s://127.0.0.1:%d",
                 tls ? "etcds" : "etcd", e->client_port[i]);
        used += (size_t)snprintf(e->url + used, sizeof(e->url) - used, "%s127.0.0.1:%d",
                                 i ? "," : "", e->client_port[i]);
    }
    if (tls)
        snprintf(e->url + used, sizeof(e->url) - used, "?cacert=%s/ca.pem&cert=%s/client.pem"
                 "&key=%s/client.key", e->tls, e->tls, e->tls);
    for (int i = 0; i < members; i++)
        etcd_spawn(e, i);
    for (int i = 0; i < members; i++) {
        if (etcd_wait_healthy(e, i) == 0)
            continue;
        /* A port was taken meanwhile: everything again on other ports. */
        char cmd[160];
        for (int m = 0; m < members; m++)
            test_etcd_kill(e, m);
        if (++attempt == 5) {
            fprintf(stderr, "etcd: ports taken five times in a row\n");
            exit(1);
        }
        snprintf(cmd, sizeof(cmd), "rm -rf %s/m[0-9] %s/m[0-9].log", e->dir, e->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not clean %s\n", e->dir);
        goto again;
    }
}

void test_etcd_start(test_etcd *e, int members, const char *extra_args)
{
    etcd_start(e, members, extra_args, 0);
}

void test_etcd_start_tls(test_etcd *e, int members)
{
    etcd_start(e, members, NULL, 1);
}

void test_etcd_kill(test_etcd *e, int member)
{
    if (e->pid[member] > 0) {
        kill(e->pid[member], SIGKILL);
        waitpid(e->pid[member], NULL, 0);
        e->pid[member] = 0;
    }
}

void test_etcd_restart(test_etcd *e, int member)
{
    for (int attempt = 0;; attempt++) {
        etcd_spawn(e, member);
        if (etcd_wait_healthy(e, member) == 0)
            return;
        if (attempt == 20) {
            fprintf(stderr, "etcd member %d: its port stays taken\n", member);
            exit(1);
        }
        test_sleep_ms(250); /* a member's ports cannot change: wait for them */
    }
}

void test_etcd_stop(test_etcd *e)
{
    char cmd[128];

    for (int i = 0; i < 4; i++)
        if (etcd_started[i] == e)
            etcd_started[i] = NULL;
    for (int i = 0; i < e->n; i++)
        test_etcd_kill(e, i);
    if (e->dir[0] != '\0') {
        snprintf(cmd, sizeof(cmd), "rm -rf %s", e->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", e->dir);
        e->dir[0] = '\0';
    }
}

char *test_etcd_post(test_etcd *e, int member, const char *path, const char *json)
{
    if (e->pid[member] <= 0)
        return NULL;
    return etcd_http(e, e->client_port[member], path, json, 5000);
}

/* POST to the first live member that answers; the parsed reply. */
static json_t *etcd_post_any(test_etcd *e, const char *path, const char *json)
{
    for (int i = 0; i < e->n; i++) {
        char *r = test_etcd_post(e, i, path, json);
        json_t *j = r != NULL ? json_loads(r, 0, NULL) : NULL;
        free(r);
        if (json_is_object(j) && json_object_get(j, "error") == NULL)
            return j;
        json_decref(j);
    }
    fprintf(stderr, "no etcd member answered %s\n", path);
    exit(1);
}

static long long etcd_field(const json_t *j, const char *field)
{
    const json_t *v = json_object_get(j, field);

    if (json_is_string(v))
        return atoll(json_string_value(v));
    return json_is_integer(v) ? (long long)json_integer_value(v) : 0;
}

static long long etcd_prefix_op(test_etcd *e, const char *path, const char *prefix,
                                const char *what, const char *field)
{
    /* "" is every key: from "\0" to the end of the key space ("\0"). */
    char *k = prefix[0] ? dlock__etcd_b64(prefix, strlen(prefix)) : strdup("AA==");
    char *end = prefix[0] ? dlock__etcd_prefix_end(prefix) : NULL;
    char *kend = end != NULL ? dlock__etcd_b64(end, strlen(end)) : strdup("AA=="), body[1024];
    json_t *j;
    long long v;

    snprintf(body, sizeof(body), "{\"key\":\"%s\",\"range_end\":\"%s\"%s}", k, kend, what);
    free(k);
    free(end);
    free(kend);
    j = etcd_post_any(e, path, body);
    v = etcd_field(j, field);
    json_decref(j);
    return v;
}

long long test_etcd_count(test_etcd *e, const char *prefix)
{
    return etcd_prefix_op(e, "/v3/kv/range", prefix, ",\"count_only\":true", "count");
}

long long test_etcd_delete(test_etcd *e, const char *prefix)
{
    return etcd_prefix_op(e, "/v3/kv/deleterange", prefix, "", "deleted");
}

/* Leases of dlock's etcd backend with bit 62 set are spares, granted ahead
 * of need (etcd_spare.c): *spares counts those with no key attached, the
 * rest are leases in use. */
static long long etcd_leases(test_etcd *e, long long *spares)
{
    json_t *j = etcd_post_any(e, "/v3/lease/leases", "{}");
    const json_t *l = json_object_get(j, "leases");
    long long n = 0;

    *spares = 0;
    for (size_t i = 0; i < json_array_size(l); i++) {
        long long id = etcd_field(json_array_get(l, i), "ID");
        char body[64];
        json_t *t;

        if ((id & (1LL << 62)) == 0) {
            n++;
            continue;
        }
        snprintf(body, sizeof(body), "{\"ID\":\"%lld\",\"keys\":true}", id);
        t = etcd_post_any(e, "/v3/lease/timetolive", body);
        if (json_array_size(json_object_get(t, "keys")) > 0)
            n++;
        else
            (*spares)++;
        json_decref(t);
    }
    json_decref(j);
    return n;
}

long long test_etcd_leases(test_etcd *e)
{
    long long spares;

    return etcd_leases(e, &spares);
}

long long test_etcd_spares(test_etcd *e)
{
    long long spares;

    etcd_leases(e, &spares);
    return spares;
}

int test_etcd_leader(test_etcd *e)
{
    for (int t = 0; t < 200; t++) {
        for (int i = 0; i < e->n; i++) {
            char *r = test_etcd_post(e, i, "/v3/maintenance/status", "{}");
            json_t *j = r != NULL ? json_loads(r, 0, NULL) : NULL;
            long long leader = etcd_field(j, "leader");
            long long me = etcd_field(json_object_get(j, "header"), "member_id");
            free(r);
            json_decref(j);
            if (leader != 0 && leader == me)
                return i;
        }
        test_sleep_ms(50);
    }
    fprintf(stderr, "no etcd member leads after 10 s\n");
    exit(1);
}

long long test_etcd_metric(test_etcd *e, int member, const char *metric)
{
    char *r = etcd_http(e, e->client_port[member], "/metrics", NULL, 5000);
    long long sum = 0;
    size_t n = strlen(metric);

    if (r == NULL) {
        fprintf(stderr, "etcd member %d: no /metrics\n", member);
        exit(1);
    }
    for (char *line = r; line != NULL && *line != '\0';) {
        char *next = strchr(line, '\n');
        if (next != NULL)
            *next++ = '\0';
        if (strncmp(line, metric, n) == 0) {
            char *sp = strrchr(line, ' ');
            if (sp != NULL)
                sum += (long long)strtod(sp + 1, NULL);
        }
        line = next;
    }
    free(r);
    return sum;
}

int test_process_alive(int pid)
{
    char path[64], buf[256];
    FILE *f;
    int alive = 0;

    if (pid <= 0 || kill(pid, 0) != 0)
        return 0;
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    f = fopen(path, "r");
    if (f == NULL)
        return 0;
    if (fgets(buf, sizeof(buf), f) != NULL) {
        char *close_paren = strrchr(buf, ')');
        alive = close_paren != NULL && close_paren[1] == ' ' && close_paren[2] != 'Z';
    }
    fclose(f);
    return alive;
}

/* ------------------------------------------------------------------------
 * Sentinel
 * ---------------------------------------------------------------------- */

/* The port sentinel i names as master of "dlock" (0: none, -1: unreachable). */
static int sentinel_names(test_redis *sen)
{
    redisContext *c = connect_raw(sen);
    redisReply *rep;
    int port = -1;

    if (c == NULL)
        return -1;
    rep = redisCommand(c, "SENTINEL get-master-addr-by-name dlock");
    if (rep != NULL && rep->type == REDIS_REPLY_ARRAY && rep->elements == 2)
        port = atoi(rep->element[1]->str);
    else if (rep != NULL)
        port = 0;
    if (rep != NULL)
        freeReplyObject(rep);
    redisFree(c);
    return port;
}

/* Whether sentinel sen knows both replicas and the other sentinels. */
static int sentinel_ready(test_redis *sen)
{
    redisContext *c = connect_raw(sen);
    redisReply *rep;
    int replicas = -1, others = -1;

    if (c == NULL)
        return 0;
    rep = redisCommand(c, "SENTINEL master dlock");
    for (size_t i = 0; rep != NULL && rep->type == REDIS_REPLY_ARRAY && i + 1 < rep->elements;
         i += 2) {
        if (strcmp(rep->element[i]->str, "num-slaves") == 0)
            replicas = atoi(rep->element[i + 1]->str);
        if (strcmp(rep->element[i]->str, "num-other-sentinels") == 0)
            others = atoi(rep->element[i + 1]->str);
    }
    if (rep != NULL)
        freeReplyObject(rep);
    redisFree(c);
    return replicas == TEST_SENTINEL_REPLICAS && others == TEST_SENTINELS - 1;
}

/* Whether replica r has finished its first sync with the master (or_master:
 * or r is a master; a replica that has not synced cannot be promoted). */
static int replica_synced(test_redis *r, int or_master)
{
    redisContext *c = connect_raw(r);
    redisReply *rep;
    int up;

    if (c == NULL)
        return 0;
    rep = redisCommand(c, "INFO replication");
    up = rep != NULL && rep->type == REDIS_REPLY_STRING &&
         ((or_master && strstr(rep->str, "role:master") != NULL) ||
          (strstr(rep->str, "master_link_status:up") != NULL &&
           strstr(rep->str, "master_sync_in_progress:0") != NULL));
    if (rep != NULL)
        freeReplyObject(rep);
    redisFree(c);
    return up;
}

/* The port a node is reached on by the sentinels and replicas: its TLS
 * port when it has one. */
static int served_port(const test_redis *r)
{
    return r->tls_port != 0 ? r->tls_port : r->port;
}

/* The redis-server / redis-sentinel arguments for TLS with t's "server"
 * certificate, client certificates required (the servers' own links
 * present the same certificate, which has no key usage limits), and TLS
 * for their own connections (replication, the sentinels' links). */
static void tls_args(char *buf, size_t size, const test_tls *t)
{
    snprintf(buf, size, "--tls-cert-file %s/server.crt --tls-key-file %s/server.key "
             "--tls-ca-cert-file %s/ca.crt --tls-auth-clients yes --tls-replication yes",
             t->dir, t->dir, t->dir);
}

static void sentinel_start(test_sentinel *s, const char *extra_args, int failover,
                           const test_tls *t)
{
    char extra[1200], tls[600] = "";
    size_t len;
    int ready = 0;

    char mextra[1200];

    memset(s, 0, sizeof(*s));
    if (t != NULL)
        tls_args(tls, sizeof(tls), t);
    /* Redis 7 waits 5 s before a diskless full sync, in case more replicas
     * come: the replicas would not hold the master's data until then. */
    snprintf(mextra, sizeof(mextra), "%s%s %s", extra_args ? extra_args : "",
             failover == TEST_SENTINEL_SYNCING ? "" : " --repl-diskless-sync-delay 0", tls);
    start_redis(&s->nodes[0], mextra, t != NULL, NULL);
    snprintf(extra, sizeof(extra), "%s --replicaof 127.0.0.1 %d %s",
             extra_args ? extra_args : "", served_port(&s->nodes[0]), tls);

    for (int i = 1; i <= TEST_SENTINEL_REPLICAS; i++)
        start_redis(&s->nodes[i], extra, t != NULL, NULL);
    len = (size_t)snprintf(s->url, sizeof(s->url), t != NULL ? "rediss-sentinel://"
                                                             : "redis-sentinel://");
    for (int i = 0; i < TEST_SENTINELS; i++) {
        test_redis *sen = &s->sentinels[i];
        char conf[sizeof(sen->conf)];
        FILE *f;

        /* The config must exist before the sentinel starts (which
         * rewrites it): in a directory of its own. */
        snprintf(conf, sizeof(conf), "/tmp/dlock-sentinel-XXXXXX");
        if (mkdtemp(conf) == NULL) {
            perror("mkdtemp");
            exit(1);
        }
        snprintf(conf + strlen(conf), sizeof(conf) - strlen(conf), "/sentinel.conf");
        if ((f = fopen(conf, "w")) == NULL) {
            perror(conf);
            exit(1);
        }
        fprintf(f, "sentinel monitor dlock 127.0.0.1 %d 2\n"
                   "sentinel down-after-milliseconds dlock %d\n"
                   "sentinel failover-timeout dlock 3000\n"
                   "sentinel parallel-syncs dlock 2\n", served_port(&s->nodes[0]),
                failover ? 1000 : 600000);
        fclose(f);
        start_redis(sen, tls, t != NULL, conf);
        len += (size_t)snprintf(s->url + len, len < sizeof(s->url) ? sizeof(s->url) - len : 0,
                                "%s127.0.0.1:%d", i > 0 ? "," : "", served_port(sen));
    }
    if (t != NULL)
        snprintf(s->url + len, len < sizeof(s->url) ? sizeof(s->url) - len : 0,
                 "/dlock?cacert=%s/ca.crt", t->dir);
    else
        snprintf(s->url + len, len < sizeof(s->url) ? sizeof(s->url) - len : 0, "/dlock");
    for (int t = 0; t < 3000 && !ready; t++) {
        ready = 1;
        for (int i = 1; i <= TEST_SENTINEL_REPLICAS; i++)
            ready = ready &&
                    (failover == TEST_SENTINEL_SYNCING || replica_synced(&s->nodes[i], 0));
        for (int i = 0; i < TEST_SENTINELS; i++)
            ready = ready && (failover ? sentinel_ready(&s->sentinels[i])
                                       : sentinel_names(&s->sentinels[i]) ==
                                             served_port(&s->nodes[0]));
        if (!ready)
            test_sleep_ms(20);
    }
    if (!ready) {
        fprintf(stderr, "test_sentinel_start: the sentinels did not find the replicas and "
                "each other within 60 s\n");
        exit(1);
    }
}

void test_sentinel_start(test_sentinel *s, const char *extra_args, int failover)
{
    sentinel_start(s, extra_args, failover, NULL);
}

void test_sentinel_start_tls(test_sentinel *s, const test_tls *t, int failover)
{
    sentinel_start(s, NULL, failover, t);
}

void test_sentinel_stop(test_sentinel *s)
{
    for (int i = 0; i < TEST_SENTINELS; i++) {
        char dir[96];
        snprintf(dir, sizeof(dir), "%s", s->sentinels[i].conf);
        test_redis_stop(&s->sentinels[i]);
        if (strrchr(dir, '/') != NULL) {
            char cmd[128];
            *strrchr(dir, '/') = '\0';
            snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
            if (system(cmd) != 0)
                fprintf(stderr, "could not remove %s\n", dir);
        }
    }
    for (int i = 0; i <= TEST_SENTINEL_REPLICAS; i++)
        test_redis_stop(&s->nodes[i]);
}

int test_sentinel_master(test_sentinel *s)
{
    int port = 0;

    for (int i = 0; i < TEST_SENTINELS; i++) {
        int p;
        if (s->sentinels[i].pid <= 0)
            continue;
        p = sentinel_names(&s->sentinels[i]);
        if (p <= 0 || (port != 0 && p != port))
            return -1;
        port = p;
    }
    for (int i = 0; i <= TEST_SENTINEL_REPLICAS; i++)
        if (served_port(&s->nodes[i]) == port)
            return i;
    return -1;
}

int test_sentinel_failover(test_sentinel *s)
{
    int old = test_sentinel_master(s);

    if (old < 0)
        return -1;
    test_redis_kill(&s->nodes[old]);
    for (int t = 0; t < 3000; t++) {
        int now = test_sentinel_master(s);
        if (now >= 0 && now != old)
            return now;
        test_sleep_ms(20);
    }
    return -1;
}

/* ------------------------------------------------------------------------
 * A fake Redis node: RESP commands in, the test's answers out
 * ---------------------------------------------------------------------- */

typedef struct {
    int fd;
    char buf[16384];
    size_t len;
} fake_client;

/* A "*N" or "$N" line at *p (type '*' or '$'): 1 with N in *v and *p past
 * it, 0 when more bytes are needed, -1 when it is not that line. */
static int fake_line(char **p, char *end, char type, long *v)
{
    char *nl;

    if (*p >= end)
        return 0;
    if (**p != type)
        return -1;
    if ((nl = memchr(*p, '\n', (size_t)(end - *p))) == NULL)
        return 0;
    *v = strtol(*p + 1, NULL, 10);
    *p = nl + 1;
    return 1;
}

/* One whole command at the start of c->buf: its length, 0 when more bytes
 * are needed, -1 when it is not RESP (the connection is dropped). */
static long fake_parse(fake_client *c, int *argc, char **argv, int max)
{
    char *p = c->buf, *end = c->buf + c->len;
    long n;
    int ok;

    if ((ok = fake_line(&p, end, '*', &n)) <= 0)
        return ok;
    if (n < 1 || n > max)
        return -1;
    for (long i = 0; i < n; i++) {
        long len;
        if ((ok = fake_line(&p, end, '$', &len)) <= 0)
            return ok;
        if (len < 0 || len > (long)sizeof(c->buf))
            return -1;
        if (end - p < len + 2)
            return 0;
        argv[i] = p;
        p += len + 2;
        argv[i][len] = '\0'; /* over the \r */
    }
    *argc = (int)n;
    return p - c->buf;
}

static void fake_serve(test_fake_node *f, fake_client *c)
{
    ssize_t got = read(c->fd, c->buf + c->len, sizeof(c->buf) - c->len);
    long used;
    int argc;
    char *argv[32], out[8192];

    if (got <= 0) {
        close(c->fd);
        c->fd = -1;
        return;
    }
    pthread_mutex_lock(&f->mu);
    if (f->seen_len < sizeof(f->seen) - 1) {
        size_t take = (size_t)got < sizeof(f->seen) - 1 - f->seen_len
                          ? (size_t)got : sizeof(f->seen) - 1 - f->seen_len;
        /* NULs as dots, so that strstr sees everything. */
        for (size_t i = 0; i < take; i++)
            f->seen[f->seen_len + i] = c->buf[c->len + i] != '\0' ? c->buf[c->len + i] : '.';
        f->seen_len += take;
    }
    pthread_mutex_unlock(&f->mu);
    c->len += (size_t)got;
    while ((used = fake_parse(c, &argc, argv, 32)) > 0) {
        const char *a;
        if (strcasecmp(argv[0], "AUTH") == 0)
            atomic_fetch_add(&f->auths, 1);
        a = f->answer != NULL ? f->answer(f, argc, argv, out, sizeof(out)) : NULL;
        if (a != NULL && write(c->fd, a, strlen(a)) < 0)
            break;
        memmove(c->buf, c->buf + used, c->len - (size_t)used);
        c->len -= (size_t)used;
    }
    if (used < 0 || c->len == sizeof(c->buf)) {
        close(c->fd);
        c->fd = -1;
    }
}

static void *fake_main(void *arg)
{
    test_fake_node *f = arg;
    fake_client cl[16];

    for (int i = 0; i < 16; i++)
        cl[i].fd = -1;
    while (!atomic_load(&f->stop)) {
        struct pollfd p[17];
        int at[17], n = 0;

        p[n].fd = f->fd;
        p[n].events = POLLIN;
        at[n++] = -1;
        for (int i = 0; i < 16; i++)
            if (cl[i].fd >= 0) {
                p[n].fd = cl[i].fd;
                p[n].events = POLLIN;
                at[n++] = i;
            }
        if (poll(p, (nfds_t)n, 20) <= 0)
            continue;
        for (int k = 0; k < n; k++) {
            if (!(p[k].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            if (at[k] >= 0) {
                fake_serve(f, &cl[at[k]]);
                continue;
            }
            int fd = accept(f->fd, NULL, NULL);
            if (fd < 0)
                continue;
            atomic_fetch_add(&f->conns, 1);
            for (int i = 0; i < 16 && fd >= 0; i++)
                if (cl[i].fd < 0) {
                    cl[i].fd = fd;
                    cl[i].len = 0;
                    fd = -1;
                }
            if (fd >= 0)
                close(fd);
        }
    }
    for (int i = 0; i < 16; i++)
        if (cl[i].fd >= 0)
            close(cl[i].fd);
    return NULL;
}

void test_fake_node_start(test_fake_node *f, test_fake_answer *answer, void *arg)
{
    struct sockaddr_in a = {0};
    socklen_t len = sizeof(a);

    memset(f, 0, sizeof(*f));
    f->answer = answer;
    f->arg = arg;
    pthread_mutex_init(&f->mu, NULL);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if ((f->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
        bind(f->fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(f->fd, 16) != 0 ||
        getsockname(f->fd, (struct sockaddr *)&a, &len) != 0 ||
        pthread_create(&f->thread, NULL, fake_main, f) != 0) {
        perror("test_fake_node_start");
        exit(1);
    }
    f->port = ntohs(a.sin_port);
}

void test_fake_node_stop(test_fake_node *f)
{
    atomic_store(&f->stop, 1);
    pthread_join(f->thread, NULL);
    close(f->fd);
    pthread_mutex_destroy(&f->mu);
}

int test_fake_node_saw(test_fake_node *f, const char *needle)
{
    int saw;

    pthread_mutex_lock(&f->mu);
    f->seen[f->seen_len] = '\0';
    saw = strstr(f->seen, needle) != NULL;
    pthread_mutex_unlock(&f->mu);
    return saw;
}

/* ------------------------------------------------------------------------
 * Cluster: 3 masters on loopback
 * ---------------------------------------------------------------------- */

/* Whether port is free on loopback now. */
static int port_free(int port)
{
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), ok;

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

/* Claim port among this machine's test processes: an flock on a file of
 * its own, held until this process exits (parallel tests would otherwise
 * see the same port free and race to start on it). */
static int port_claim(int port)
{
    char path[64];
    int fd;

    snprintf(path, sizeof(path), "/tmp/dlock-test-port-%d.lock", port);
    if ((fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600)) < 0)
        return 0;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        close(fd);
        return 0;
    }
    return 1; /* fd stays open: the claim lasts as long as the process */
}

/* A port of 48200-48299 whose cluster bus port (+10000) is free too,
 * from a random start (parallel tests), skipping taken ones. */
static int cluster_port(const test_cluster *c, int upto)
{
    static unsigned seed;
    if (seed == 0)
        seed = (unsigned)getpid() ^ (unsigned)time(NULL);
    int start = (int)(rand_r(&seed) % 100);
    for (int i = 0; i < 100; i++) {
        int port = 48200 + (start + i) % 100, mine = 0;
        for (int j = 0; j < upto; j++)
            mine = mine || c->nodes[j].port == port;
        if (!mine && port_free(port) && port_free(port + 10000) && port_claim(port))
            return port;
    }
    fprintf(stderr, "test_cluster_start: no free port pair in 48200-48299 (+10000)\n");
    exit(1);
}

static redisReply *cluster_raw(test_redis *r, const char *fmt, ...)
{
    redisReply *rep;
    va_list ap;

    va_start(ap, fmt);
    rep = raw_vcommand(r, "cluster", fmt, ap);
    va_end(ap);
    return rep;
}

static int cluster_ok(test_redis *r)
{
    redisReply *rep = cluster_raw(r, "CLUSTER INFO");
    int ok = rep != NULL && rep->type == REDIS_REPLY_STRING &&
             strstr(rep->str, "cluster_state:ok") != NULL;
    if (rep != NULL)
        freeReplyObject(rep);
    return ok;
}

static void cluster_start(test_cluster *c, const char *extra_args, const test_tls *t,
                          int replicas)
{
    char extra[1024], cmd[1024], tls[600] = "";
    size_t len;

    memset(c, 0, sizeof(*c));
    c->n = replicas ? 2 * TEST_CLUSTER_NODES : TEST_CLUSTER_NODES;
    if (t != NULL)
        tls_args(tls, sizeof(tls), t);
    /* (Redis 7 waits 5 s before a diskless full sync, in case more
     * replicas come.) */
    snprintf(extra, sizeof(extra), "--cluster-enabled yes --cluster-config-file nodes.conf "
             "--cluster-node-timeout 5000 --repl-diskless-sync-delay 0 %s%s%s",
             extra_args ? extra_args : "", tls, t != NULL ? " --tls-cluster yes" : "");
    for (int i = 0; i < c->n; i++)
        start_redis_at(&c->nodes[i], extra, t != NULL, NULL, cluster_port(c, i));
    /* Over TLS, redis-cli reaches the nodes on their TLS ports with the
     * servers' certificate as its client certificate. */
    if (t != NULL)
        len = (size_t)snprintf(cmd, sizeof(cmd), "redis-cli --tls --cacert %s/ca.crt --cert "
                               "%s/server.crt --key %s/server.key --cluster create", t->dir,
                               t->dir, t->dir);
    else
        len = (size_t)snprintf(cmd, sizeof(cmd), "redis-cli --cluster create");
    for (int i = 0; i < c->n; i++)
        len += (size_t)snprintf(cmd + len, sizeof(cmd) - len, " 127.0.0.1:%d",
                                served_port(&c->nodes[i]));
    snprintf(cmd + len, sizeof(cmd) - len, "%s --cluster-yes >%s/create.log 2>&1",
             replicas ? " --cluster-replicas 1" : "", c->nodes[0].dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "test_cluster_start: redis-cli --cluster create failed (%s/create.log)"
                "\n", c->nodes[0].dir);
        exit(1);
    }
    len = (size_t)snprintf(c->url, sizeof(c->url), t != NULL ? "rediss-cluster://"
                                                             : "redis-cluster://");
    for (int i = 0; i < c->n; i++)
        len += (size_t)snprintf(c->url + len, sizeof(c->url) - len, "%s127.0.0.1:%d",
                                i ? "," : "", served_port(&c->nodes[i]));
    if (t != NULL)
        snprintf(c->url + len, sizeof(c->url) - len, "?cacert=%s/ca.crt", t->dir);
    for (int t = 0; t < 3000; t++) { /* up to 60 s on a loaded machine */
        int ok = 1;
        for (int i = 0; i < c->n; i++)
            ok = ok && cluster_ok(&c->nodes[i]) &&
                 (!replicas || replica_synced(&c->nodes[i], 1));
        if (ok)
            return;
        test_sleep_ms(20);
    }
    fprintf(stderr, "test_cluster_start: the cluster did not reach cluster_state:ok\n");
    exit(1);
}

void test_cluster_start(test_cluster *c, const char *extra_args)
{
    cluster_start(c, extra_args, NULL, 0);
}

int test_cluster_add_master(test_cluster *c)
{
    int i = c->n;
    char cmd[512];

    if (i >= 2 * TEST_CLUSTER_NODES) {
        fprintf(stderr, "test_cluster_add_master: no room for node %d\n", i);
        exit(1);
    }
    start_redis_at(&c->nodes[i], "--cluster-enabled yes --cluster-config-file nodes.conf "
                   "--cluster-node-timeout 5000", 0, NULL, cluster_port(c, i));
    snprintf(cmd, sizeof(cmd), "redis-cli --cluster add-node 127.0.0.1:%d 127.0.0.1:%d "
             ">%s/add-node.log 2>&1", c->nodes[i].port, c->nodes[0].port, c->nodes[i].dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "test_cluster_add_master: redis-cli --cluster add-node failed "
                "(%s/add-node.log)\n", c->nodes[i].dir);
        exit(1);
    }
    c->n++;
    for (int t = 0; t < 3000; t++) { /* every node knows it, as a master */
        int ok = cluster_ok(&c->nodes[i]);
        for (int k = 0; k < i && ok; k++) {
            redisReply *rep = cluster_raw(&c->nodes[k], "CLUSTER NODES");
            char needle[32];
            snprintf(needle, sizeof(needle), ":%d@", c->nodes[i].port);
            ok = rep != NULL && rep->type == REDIS_REPLY_STRING &&
                 strstr(rep->str, needle) != NULL;
            if (rep != NULL)
                freeReplyObject(rep);
        }
        if (ok)
            return i;
        test_sleep_ms(20);
    }
    fprintf(stderr, "test_cluster_add_master: the cluster did not take node %d in\n", i);
    exit(1);
}

void test_cluster_start_replicas(test_cluster *c, const char *extra_args)
{
    cluster_start(c, extra_args, NULL, 1);
}

void test_cluster_start_tls(test_cluster *c, const test_tls *t)
{
    cluster_start(c, NULL, t, 0);
}

void test_cluster_stop(test_cluster *c)
{
    for (int i = 0; i < c->n; i++)
        test_redis_stop(&c->nodes[i]);
}

int test_cluster_slot(test_cluster *c, const char *key)
{
    return (int)test_redis_cmd(&c->nodes[0], "CLUSTER KEYSLOT %s", key);
}

/* The node id of node i. */
static void cluster_id(test_cluster *c, int i, char *id, size_t size)
{
    redisReply *rep = cluster_raw(&c->nodes[i], "CLUSTER MYID");
    if (rep == NULL || rep->type != REDIS_REPLY_STRING) {
        fprintf(stderr, "cluster: CLUSTER MYID failed on port %d\n", c->nodes[i].port);
        exit(1);
    }
    snprintf(id, size, "%s", rep->str);
    freeReplyObject(rep);
}

int test_cluster_owner(test_cluster *c, int slot)
{
    /* The node that serves a key of the slot: COUNTKEYSINSLOT answers on
     * every node, so ask each whether it has the slot in its own map. */
    for (int i = 0; i < c->n; i++) {
        redisReply *rep;
        int mine = 0;
        if (c->nodes[i].pid <= 0) /* killed by the test */
            continue;
        rep = cluster_raw(&c->nodes[i], "CLUSTER SLOTS");
        for (size_t e = 0; rep != NULL && rep->type == REDIS_REPLY_ARRAY && e < rep->elements;
             e++) {
            redisReply *r = rep->element[e];
            if (r->element[0]->integer <= slot && slot <= r->element[1]->integer &&
                (r->element[2]->element[1]->integer == c->nodes[i].port ||
                 r->element[2]->element[1]->integer == served_port(&c->nodes[i])))
                mine = 1;
        }
        if (rep != NULL)
            freeReplyObject(rep);
        if (mine)
            return i;
    }
    return -1;
}

static void cluster_must(redisReply *rep, const char *what)
{
    if (rep == NULL || rep->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "cluster: %s failed: %s\n", what,
                rep != NULL ? rep->str : "no reply");
        exit(1);
    }
    freeReplyObject(rep);
}

void test_cluster_mark_migrating(test_cluster *c, int slot, int to)
{
    int from = test_cluster_owner(c, slot);
    char from_id[64], to_id[64];

    if (from < 0 || from == to) {
        fprintf(stderr, "cluster: slot %d is on node %d, cannot move it to %d\n", slot, from,
                to);
        exit(1);
    }
    cluster_id(c, from, from_id, sizeof(from_id));
    cluster_id(c, to, to_id, sizeof(to_id));
    cluster_must(cluster_raw(&c->nodes[to], "CLUSTER SETSLOT %d IMPORTING %s", slot, from_id),
                 "SETSLOT IMPORTING");
    cluster_must(cluster_raw(&c->nodes[from], "CLUSTER SETSLOT %d MIGRATING %s", slot, to_id),
                 "SETSLOT MIGRATING");
}

void test_cluster_migrate_key(test_cluster *c, int slot, int to, const char *key)
{
    cluster_must(cluster_raw(&c->nodes[test_cluster_owner(c, slot)],
                             "MIGRATE 127.0.0.1 %d %s 0 5000", served_port(&c->nodes[to]),
                             key),
                 "MIGRATE");
}

void test_cluster_migrate_keys(test_cluster *c, int slot, int to, int pause_ms)
{
    int from = test_cluster_owner(c, slot);

    test_cluster_mark_migrating(c, slot, to);
    test_sleep_ms(pause_ms);
    for (;;) {
        redisReply *keys = cluster_raw(&c->nodes[from], "CLUSTER GETKEYSINSLOT %d 100", slot);
        size_t n = keys != NULL && keys->type == REDIS_REPLY_ARRAY ? keys->elements : 0;
        for (size_t i = 0; i < n; i++) {
            /* One key at a time: the others of the slot wait meanwhile,
             * as with a reshard's batches. */
            test_cluster_migrate_key(c, slot, to, keys->element[i]->str);
            test_sleep_ms(pause_ms / 4);
        }
        if (keys != NULL)
            freeReplyObject(keys);
        if (n == 0)
            break;
    }
}

void test_cluster_finish_slot(test_cluster *c, int slot, int to)
{
    int from = test_cluster_owner(c, slot);
    char to_id[64];

    cluster_id(c, to, to_id, sizeof(to_id));
    cluster_must(cluster_raw(&c->nodes[to], "CLUSTER SETSLOT %d NODE %s", slot, to_id),
                 "SETSLOT NODE (target)");
    cluster_must(cluster_raw(&c->nodes[from], "CLUSTER SETSLOT %d NODE %s", slot, to_id),
                 "SETSLOT NODE (source)");
    for (int i = 0; i < c->n; i++)
        if (i != from && i != to)
            cluster_must(cluster_raw(&c->nodes[i], "CLUSTER SETSLOT %d NODE %s", slot, to_id),
                         "SETSLOT NODE (other)");
}

void test_cluster_move_slot(test_cluster *c, int slot, int to, int pause_ms)
{
    test_cluster_migrate_keys(c, slot, to, pause_ms);
    test_cluster_finish_slot(c, slot, to);
}

long long test_cluster_cmd(test_cluster *c, const char *key, const char *fmt, ...)
{
    int at = test_cluster_owner(c, test_cluster_slot(c, key));
    redisReply *rep;
    va_list ap;

    if (at < 0) {
        fprintf(stderr, "test_cluster_cmd: no node serves %s\n", key);
        exit(1);
    }
    va_start(ap, fmt);
    rep = raw_vcommand(&c->nodes[at], "test_cluster_cmd", fmt, ap);
    va_end(ap);
    return reply_number(rep);
}

/* ------------------------------------------------------------------------
 * Either backend
 * ---------------------------------------------------------------------- */

void test_server_start(test_server *s, const char *backend)
{
    memset(s, 0, sizeof(*s));
    if (backend != NULL && strcmp(backend, "rediss") == 0) {
        /* The redis backend over TLS: dlock reaches the server only by
         * its TLS port. */
        s->backend = "redis";
        s->tls = 1;
        test_tls_make(&s->certs);
        test_redis_start_tls(&s->redis, &s->certs, "server", NULL);
        s->url = s->redis.url;
        s->short_lease_ms = 300;
        s->dense_fences = 1;
        s->waiter_leftovers = 1;
    } else if (backend != NULL && strcmp(backend, "redis-sentinel") == 0) {
        /* The redis backend on the master the sentinels name; checks read
         * that master (s->redis, a copy of its test_redis). */
        s->backend = "redis";
        if ((s->sentinel = malloc(sizeof(*s->sentinel))) == NULL)
            fprintf(stderr, "out of memory\n"), exit(1);
        test_sentinel_start(s->sentinel, NULL, 0);
        s->redis = s->sentinel->nodes[0];
        s->url = s->sentinel->url;
        s->short_lease_ms = 300;
        s->dense_fences = 1;
        s->waiter_leftovers = 1;
    } else if (backend != NULL && strcmp(backend, "redis-cluster") == 0) {
        /* The redis backend on 3 masters; checks ask the node serving the
         * name's slot. */
        s->backend = "redis";
        if ((s->cluster = malloc(sizeof(*s->cluster))) == NULL)
            fprintf(stderr, "out of memory\n"), exit(1);
        test_cluster_start(s->cluster, NULL);
        s->url = s->cluster->url;
        s->short_lease_ms = 300;
        s->dense_fences = 1;
        s->waiter_leftovers = 1;
    } else if (backend != NULL && strcmp(backend, "redis") == 0) {
        s->backend = "redis";
        test_redis_start(&s->redis, NULL);
        s->url = s->redis.url;
        s->short_lease_ms = 300;
        s->dense_fences = 1;
        s->waiter_leftovers = 1;
    } else if (backend != NULL && strcmp(backend, "plainredis") == 0) {
        /* The out-of-tree backend (tests/backend), registered at run time. */
        s->backend = "plainredis";
        test_redis_start(&s->redis, NULL);
        if (dlock_backend_register("plainredis", &plain_backend) != DLOCK_OK)
            fprintf(stderr, "registering plainredis: %s\n", dlock_error_message()), exit(1);
        snprintf(s->plain_url, sizeof(s->plain_url), "plainredis://127.0.0.1:%d", s->redis.port);
        s->url = s->plain_url;
        s->short_lease_ms = 300;
        s->dense_fences = 1;
    } else if (backend != NULL && strcmp(backend, "etcd") == 0) {
        s->backend = "etcd";
        test_etcd_start(&s->etcd, 1, NULL);
        s->url = s->etcd.url;
        s->short_lease_ms = 1000; /* etcd counts leases in whole seconds */
        s->waiter_leftovers = 2;
    } else if (backend != NULL && strcmp(backend, "redlock") == 0) {
        s->backend = "redlock";
        s->nnodes = 3;
        test_redis_start_many(s->nodes, s->nnodes, NULL, s->redlock_url,
                              sizeof(s->redlock_url));
        s->url = s->redlock_url;
        s->short_lease_ms = 300;
    } else if (backend != NULL && strcmp(backend, "zk") == 0) {
        s->backend = "zk";
        test_zk_start(&s->zk, 1, NULL);
        s->url = s->zk.url;
        /* Up to the 2 s session of the URL: locks live in the short
         * session, whose node goes 2 s after its holder stalls. */
        s->short_lease_ms = 1000;
        s->waiter_leftovers = 1; /* its node in the queue */
#ifdef DLOCK_TEST_POSTGRES
    } else if (backend != NULL && strncmp(backend, "postgres", 8) == 0) {
        test_pg_server_start(s, backend);
#endif
    } else if (backend != NULL && (strcmp(backend, "mysql") == 0 ||
                                   strcmp(backend, "mysql-named") == 0)) {
        s->backend = "mysql";
        s->sql_named = strcmp(backend, "mysql-named") == 0;
        s->conn_bound = s->sql_named;
        test_mariadb_start(&s->mariadb);
        snprintf(s->sql_url, sizeof(s->sql_url), "%s%s", s->mariadb.url,
                 s->sql_named ? "?mode=named" : "");
        s->url = s->sql_url;
        s->short_lease_ms = 1000; /* a statement's round trip is slower than Redis' */
    } else {
        fprintf(stderr, "unknown backend '%s' (redis, rediss, redis-sentinel, plainredis, etcd, "
                "redlock, zk, mysql or mysql-named)\n",
                backend ? backend : "");
        exit(2);
    }
}

/* A Redis server under the built-in backend or the out-of-tree one. */
static int on_redis(const test_server *s)
{
    return strcmp(s->backend, "redis") == 0 || strcmp(s->backend, "plainredis") == 0;
}

static int on_redlock(const test_server *s)
{
    return strcmp(s->backend, "redlock") == 0;
}

static int on_zk(const test_server *s)
{
    return strcmp(s->backend, "zk") == 0;
}

/* The directory of lock name on ZooKeeper (names in the tests need no
 * escaping). */
static const char *zk_dir(char *buf, size_t size, const char *name)
{
    snprintf(buf, size, "/dlock/%s", name);
    return buf;
}

/* The key prefix of s's Redis backend. */
static const char *redis_prefix(const test_server *s)
{
    return strcmp(s->backend, "plainredis") == 0 ? "plain:" : "dlock:";
}

static int on_mysql(const test_server *s)
{
    return strcmp(s->backend, "mysql") == 0;
}

void test_server_stop(test_server *s)
{
#ifdef DLOCK_TEST_POSTGRES
    if (s->pg != NULL) {
        test_pg_stop(s->pg);
        return;
    }
#endif
    if (on_mysql(s)) {
        test_mariadb_stop(&s->mariadb);
        return;
    }
    for (int i = 0; i < s->nnodes; i++)
        test_redis_stop(&s->nodes[i]);
    if (on_redlock(s))
        return;
    if (s->cluster != NULL) {
        test_cluster_stop(s->cluster);
        free(s->cluster);
        s->cluster = NULL;
        return;
    }
    if (s->sentinel != NULL) {
        test_sentinel_stop(s->sentinel);
        free(s->sentinel);
        s->sentinel = NULL;
        return;
    }
    if (on_zk(s))
        test_zk_stop(&s->zk);
    else if (on_redis(s))
        test_redis_stop(&s->redis);
    else
        test_etcd_stop(&s->etcd);
    if (s->tls)
        test_tls_remove(&s->certs);
}

int test_server_held(test_server *s, const char *name)
{
    char key[600];
    int held = 0;

#ifdef DLOCK_TEST_POSTGRES
    if (s->pg != NULL)
        return test_pg_server_held(s, name);
#endif
    if (on_mysql(s))
        return test_mysql_held(s, name);
    if (on_redlock(s)) {
        for (int i = 0; i < s->nnodes; i++)
            held += s->nodes[i].pid > 0 &&
                    test_redis_cmd(&s->nodes[i], "EXISTS dlock:{%s}", name) == 1;
        return held > s->nnodes / 2;
    }
    if (on_zk(s))
        return test_zk_children(&s->zk, zk_dir(key, sizeof(key), name)) > 0;
    if (s->cluster != NULL) {
        snprintf(key, sizeof(key), "dlock:{%s}", name);
        return test_cluster_cmd(s->cluster, key, "EXISTS %s", key) == 1;
    }
    if (on_redis(s))
        return test_redis_cmd(&s->redis, "EXISTS %s{%s}", redis_prefix(s), name) == 1;
    snprintf(key, sizeof(key), "dlock/%s/", name);
    return test_etcd_count(&s->etcd, key) > 0;
}

void test_server_pause(test_server *s, int paused)
{
    int pid = on_redis(s) ? s->redis.pid : on_zk(s) ? s->zk.pid[0] : on_mysql(s) ? s->mariadb.pid
                                                                                : s->etcd.pid[0];

#ifdef DLOCK_TEST_POSTGRES
    if (s->pg != NULL) {
        test_pg_pause(s->pg, paused);
        return;
    }
#endif
    for (int i = 0; i < s->nnodes; i++)
        if (kill(s->nodes[i].pid, paused ? SIGSTOP : SIGCONT) != 0)
            fprintf(stderr, "kill -%s %d: %s\n", paused ? "STOP" : "CONT", s->nodes[i].pid,
                    strerror(errno)), exit(1);
    if (s->cluster != NULL)
        for (int i = 0; i < s->cluster->n; i++)
            if (kill(s->cluster->nodes[i].pid, paused ? SIGSTOP : SIGCONT) != 0)
                fprintf(stderr, "kill: %s\n", strerror(errno)), exit(1);
    if (on_redlock(s) || s->cluster != NULL)
        return;
    if (kill(pid, paused ? SIGSTOP : SIGCONT) != 0)
        fprintf(stderr, "kill -%s %d: %s\n", paused ? "STOP" : "CONT", pid, strerror(errno)),
            exit(1);
}

long long test_server_leftovers(test_server *s, const char *name)
{
    char key[600];
    long long n = 0;

#ifdef DLOCK_TEST_POSTGRES
    if (s->pg != NULL)
        return test_pg_server_leftovers(s, name);
#endif
    if (on_mysql(s))
        return test_mysql_leftovers(s, name);
    if (on_redlock(s)) {
        /* The lock's key on every node that is up (a waiter leaves
         * nothing). Acquire and release return once a quorum answered, so
         * wait (a generous bound) for the others to catch up: until every
         * node that is up has the key, or none has. */
        for (int tries = 0; tries < 500; tries++) {
            int up = 0;
            n = 0;
            for (int i = 0; i < s->nnodes; i++)
                if (s->nodes[i].pid > 0) {
                    up++;
                    n += test_redis_cmd(&s->nodes[i], "EXISTS dlock:{%s}", name);
                }
            if (n == 0 || n == up)
                break;
            test_sleep_ms(10);
        }
        return n;
    }
    if (on_zk(s)) /* the holder's node and the waiters' */
        return test_zk_children(&s->zk, zk_dir(key, sizeof(key), name));
    if (s->cluster != NULL) {
        snprintf(key, sizeof(key), "dlock:{%s}", name);
        return test_cluster_cmd(s->cluster, key, "EXISTS %s %s:next", key, key);
    }
    if (on_redis(s))
        return test_redis_cmd(&s->redis, "EXISTS %s{%s} %s{%s}:next", redis_prefix(s), name,
                              redis_prefix(s), name);
    snprintf(key, sizeof(key), "dlock/%s/", name);
    return test_etcd_count(&s->etcd, key) + test_etcd_leases(&s->etcd);
}

long long test_server_requests(test_server *s)
{
    static const char *const redis_cmds[] = {"evalsha", "eval"};
    /* LeaseKeepAlive: one stream per keepalive request, however many
     * leases it carries. */
    static const char *const etcd_methods[] = {"Txn", "Range", "DeleteRange", "Put",
                                               "LeaseKeepAlive"};
    long long n = 0;
    char metric[160];

    if (on_zk(s)) /* every request the server answered, pings included */
        return test_zk_mntr(&s->zk, 0, "zk_cnt_readlatency") +
               test_zk_mntr(&s->zk, 0, "zk_cnt_updatelatency");
#ifdef DLOCK_TEST_POSTGRES
    if (s->pg != NULL)
        return test_pg_server_requests(s);
#endif
    if (on_mysql(s))
        return test_mysql_requests(s);
    if (s->cluster != NULL) {
        for (int k = 0; k < s->cluster->n; k++)
            for (size_t i = 0; i < sizeof(redis_cmds) / sizeof(redis_cmds[0]); i++)
                n += test_redis_calls(&s->cluster->nodes[k], redis_cmds[i]);
        return n;
    }
    if (on_redis(s) || on_redlock(s)) {
        for (size_t i = 0; i < sizeof(redis_cmds) / sizeof(redis_cmds[0]); i++)
            n += test_redis_calls(on_redlock(s) ? &s->nodes[0] : &s->redis, redis_cmds[i]);
        return n;
    }
    for (size_t i = 0; i < sizeof(etcd_methods) / sizeof(etcd_methods[0]); i++) {
        snprintf(metric, sizeof(metric), "grpc_server_started_total{grpc_method=\"%s\"",
                 etcd_methods[i]);
        n += test_etcd_metric(&s->etcd, 0, metric);
    }
    return n;
}

void test_url_refused(const char *url, const char *needle)
{
    dlock_client *c = NULL;

    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_EINVAL);
    CHECK(c == NULL);
    fprintf(stderr, "refused as expected: %s\n", dlock_error_message());
    CHECK_CONTAINS(dlock_error_message(), needle);
}

dlock_acquire_options test_opts(int64_t wait_ms, int64_t lease_ms, int auto_renew)
{
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;

    o.wait_ms = wait_ms;
    o.lease_ms = lease_ms;
    o.auto_renew = auto_renew;
    return o;
}

void test_wait_child_ok(int pid)
{
    int status;

    CHECK(waitpid(pid, &status, 0) == pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "child %d failed (status %d)\n", pid, status);
        exit(1);
    }
}

atomic_int test_lost_calls;
atomic_int test_lost_reason;

void test_count_lost(dlock_lock *lock, int reason, void *payload)
{
    (void)lock;
    (void)payload;
    atomic_store(&test_lost_reason, reason);
    atomic_fetch_add(&test_lost_calls, 1);
}

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_text[8192];

void test_log_record(int level, const char *message, void *payload)
{
    size_t n;

    (void)payload;
    pthread_mutex_lock(&log_mu);
    n = strlen(log_text);
    snprintf(log_text + n, sizeof(log_text) - n, "%d %s\n", level, message);
    pthread_mutex_unlock(&log_mu);
}

const char *test_log_text(void)
{
    return log_text;
}

void test_log_clear(void)
{
    pthread_mutex_lock(&log_mu);
    log_text[0] = '\0';
    pthread_mutex_unlock(&log_mu);
}

void test_acquirer_init(test_acquirer *a, dlock_client *c, const char *name,
                        dlock_acquire_options o)
{
    memset(a, 0, sizeof(*a));
    a->c = c;
    a->name = name;
    a->o = o;
}

void *test_acquirer_main(void *arg)
{
    test_acquirer *a = arg;
    struct timespec t0, t1;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    a->rc = dlock_acquire(&a->lock, a->c, a->name, &a->o);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    a->took_ms = (int64_t)(t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
    if (a->rc != DLOCK_OK)
        snprintf(a->message, sizeof(a->message), "%s", dlock_error_message());
    atomic_store(&a->done, 1);
    return NULL;
}
