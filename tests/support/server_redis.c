/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Private redis-servers (test_redis_*), TLS certificates (test_tls_*), and
 * the test servers "redis" and "rediss" (the redis backend over TLS).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_server.h"

redisContext *test__redis_connect(test_redis *r)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);

    if (c != NULL && c->err) {
        redisFree(c);
        return NULL;
    }
    return c;
}

/* test__redis_connect, or exit the test naming who could not connect. */
static redisContext *connect_must(test_redis *r, const char *who)
{
    redisContext *c = test__redis_connect(r);

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
        if ((c = test__redis_connect(r)) != NULL) {
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
void test__redis_start_at(test_redis *r, const char *extra_args, int tls, const char *conf,
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
        r->port = port != 0 ? port : test__kernel_port();
        r->tls_port = tls ? test__kernel_port() : 0;
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
    test__redis_start_at(r, extra_args, tls, conf, 0);
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
long long test__redis_number(redisReply *rep)
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
redisReply *test__redis_vcommand(test_redis *r, const char *who, const char *fmt, va_list ap)
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
    rep = test__redis_vcommand(r, "test_redis_cmd", fmt, ap);
    va_end(ap);
    return test__redis_number(rep);
}

void test_redis_text(test_redis *r, char *buf, size_t size, const char *fmt, ...)
{
    redisReply *rep;
    va_list ap;

    va_start(ap, fmt);
    rep = test__redis_vcommand(r, "test_redis_text", fmt, ap);
    va_end(ap);
    snprintf(buf, size, "%s", rep != NULL && rep->type == REDIS_REPLY_STRING ? rep->str : "");
    if (rep != NULL)
        freeReplyObject(rep);
}

long long test_redis_numsub(test_redis *r, const char *channel)
{
    redisContext *c = test__redis_connect(r);
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
    redisContext *c = test__redis_connect(r);
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


/* Whether replica r has finished its first sync with the master (or_master:
 * or r is a master; a replica that has not synced cannot be promoted). */
int test__redis_synced(test_redis *r, int or_master)
{
    redisContext *c = test__redis_connect(r);
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
int test__redis_served_port(const test_redis *r)
{
    return r->tls_port != 0 ? r->tls_port : r->port;
}

/* The redis-server / redis-sentinel arguments for TLS with t's "server"
 * certificate, client certificates required (the servers' own links
 * present the same certificate, which has no key usage limits), and TLS
 * for their own connections (replication, the sentinels' links). */
void test__redis_tls_args(char *buf, size_t size, const test_tls *t)
{
    snprintf(buf, size, "--tls-cert-file %s/server.crt --tls-key-file %s/server.key "
             "--tls-ca-cert-file %s/ca.crt --tls-auth-clients yes --tls-replication yes",
             t->dir, t->dir, t->dir);
}


long long test__redis_scripts(test_redis *r)
{
    return test_redis_calls(r, "evalsha") + test_redis_calls(r, "eval");
}

/* ---- the test servers "redis" and "rediss" ---- */

static void redis_start(test_server *s)
{
    test_redis_start(&s->redis, NULL);
    s->url = s->redis.url;
}

/* The redis backend over TLS: dlock reaches the server only by its TLS
 * port. */
static void rediss_start(test_server *s)
{
    s->tls = 1;
    test_tls_make(&s->certs);
    test_redis_start_tls(&s->redis, &s->certs, "server", NULL);
    s->url = s->redis.url;
}

static void redis_stop(test_server *s)
{
    test_redis_stop(&s->redis);
    if (s->tls)
        test_tls_remove(&s->certs);
}

void test__redis_server_pause(test_server *s, int paused)
{
    test__signal(s->redis.pid, paused);
}

int test__redis_server_held(test_server *s, const char *name)
{
    return test_redis_cmd(&s->redis, "EXISTS dlock:{%s}", name) == 1;
}

long long test__redis_server_leftovers(test_server *s, const char *name)
{
    return test_redis_cmd(&s->redis, "EXISTS dlock:{%s} dlock:{%s}:next", name, name);
}

long long test__redis_server_requests(test_server *s)
{
    return test__redis_scripts(&s->redis);
}

const test_server_ops test_server_redis = {
    .name = "redis",
    .backend = "redis",
    .short_lease_ms = 300,
    .dense_fences = 1,
    .waiter_leftovers = 1,
    .start = redis_start,
    .stop = redis_stop,
    .pause = test__redis_server_pause,
    .held = test__redis_server_held,
    .leftovers = test__redis_server_leftovers,
    .requests = test__redis_server_requests,
};

const test_server_ops test_server_rediss = {
    .name = "rediss",
    .backend = "redis",
    .short_lease_ms = 300,
    .dense_fences = 1,
    .waiter_leftovers = 1,
    .start = rediss_start,
    .stop = redis_stop,
    .pause = test__redis_server_pause,
    .held = test__redis_server_held,
    .leftovers = test__redis_server_leftovers,
    .requests = test__redis_server_requests,
};
