/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Private etcd members (test_etcd_*): a single node or a cluster on
 * loopback ports, and the test server "etcd" on one member.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "backends/etcd/etcd_codec.h"
#include "test_server.h"

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

/* Leases of dlock's etcd backend with bit 62 set are spares (bit 61 clear,
 * granted ahead of need: etcd_spare.c) or session leases (bit 61 set, the
 * client's auto-renewed locks': etcd_session.c): in use while a key is on
 * them. *spares counts the spares with no key attached; a session lease
 * with none is the client's until it closes (test_etcd_sessions). */
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
        else if ((id & (1LL << 61)) == 0)
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

/* Session leases of dlock's etcd backend (bits 62 and 61 set). */
long long test_etcd_sessions(test_etcd *e)
{
    json_t *j = etcd_post_any(e, "/v3/lease/leases", "{}");
    const json_t *l = json_object_get(j, "leases");
    long long n = 0;

    for (size_t i = 0; i < json_array_size(l); i++)
        if ((etcd_field(json_array_get(l, i), "ID") & (3LL << 61)) == (3LL << 61))
            n++;
    json_decref(j);
    return n;
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

/* ---- the test server "etcd" ---- */

static void etcd_server_start(test_server *s)
{
    test_etcd_start(&s->etcd, 1, NULL);
    s->url = s->etcd.url;
}

static void etcd_server_stop(test_server *s)
{
    test_etcd_stop(&s->etcd);
}

static void etcd_server_pause(test_server *s, int paused)
{
    test__signal(s->etcd.pid[0], paused);
}

static int etcd_server_held(test_server *s, const char *name)
{
    char key[600];

    snprintf(key, sizeof(key), "dlock/%s/", name);
    return test_etcd_count(&s->etcd, key) > 0;
}

/* The keys under dlock/NAME/ (holder and queued waiters) plus every lease
 * there is. */
static long long etcd_server_leftovers(test_server *s, const char *name)
{
    char key[600];

    snprintf(key, sizeof(key), "dlock/%s/", name);
    return test_etcd_count(&s->etcd, key) + test_etcd_leases(&s->etcd);
}

static long long etcd_server_requests(test_server *s)
{
    /* LeaseKeepAlive: one stream per keepalive request, however many
     * leases it carries. */
    static const char *const methods[] = {"Txn", "Range", "DeleteRange", "Put",
                                          "LeaseKeepAlive"};
    char metric[160];
    long long n = 0;

    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
        snprintf(metric, sizeof(metric), "grpc_server_started_total{grpc_method=\"%s\"",
                 methods[i]);
        n += test_etcd_metric(&s->etcd, 0, metric);
    }
    return n;
}

const test_server_ops test_server_etcd = {
    .name = "etcd",
    .backend = "etcd",
    .short_lease_ms = 1000, /* etcd counts leases in whole seconds */
    .waiter_leftovers = 2,
    .start = etcd_server_start,
    .stop = etcd_server_stop,
    .pause = etcd_server_pause,
    .held = etcd_server_held,
    .leftovers = etcd_server_leftovers,
    .requests = etcd_server_requests,
};
