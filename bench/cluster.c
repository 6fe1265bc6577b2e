/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock-bench --cluster: the dlock cycle (acquire + release) on Redis
 * Cluster beside a raw PING to the master that serves the lock's slot, and
 * their ratio, as for one Redis node.
 *
 * Without --url it starts 3 cluster-enabled redis-servers on free ports of
 * 48200-48299 whose cluster bus ports (+10000) are free too, in a mkdtemp
 * folder, with a random password (requirepass and masterauth in each
 * node's config file, never on a command line; checked: a client without it
 * is refused), joins them with redis-cli --cluster create and waits for
 * cluster_state:ok; they die with the bench (PR_SET_PDEATHSIG) and are
 * stopped when it exits. With --url redis-cluster://... it measures that.
 */
#include "bench.h"

#include <dlock/dlock.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NODES 3

static char dir[256], password[256]; /* the URL's, "" for none */
static pid_t pids[NODES];
static int nprocs;

static void stop_all(void)
{
    bench_stop_children(pids, &nprocs, dir);
}

static void pause_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int cluster_ok(int port)
{
    redisContext *c = bench_connect_auth("127.0.0.1", port, password);
    redisReply *r = c ? redisCommand(c, "CLUSTER INFO") : NULL;
    int ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return ok;
}

static void start_all(char *url, size_t size)
{
    int port[NODES], n = 0;
    char cmd[512], conf_text[600];
    size_t len;

    snprintf(dir, sizeof dir, "%s/dlock-bench-cluster-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(dir) == NULL)
        bench_die("mkdtemp: %s", strerror(errno));
    for (int p = 48200; p < 48300 && n < NODES; p++)
        if (bench_bind_port(p) == p && bench_bind_port(p + 10000) == p + 10000)
            port[n++] = p;
    if (n < NODES)
        bench_die("no 3 free port pairs in 48200-48299 (+10000 for the cluster bus)");
    bench_random_password(password);
    snprintf(conf_text, sizeof conf_text, "requirepass %s\nmasterauth %s\n", password, password);
    for (int i = 0; i < NODES; i++) {
        char p[16], ndir[300], logf[320], conf[320];
        snprintf(p, sizeof p, "%d", port[i]);
        snprintf(ndir, sizeof ndir, "%s/n%d", dir, i);
        snprintf(logf, sizeof logf, "%s/redis.log", ndir);
        snprintf(conf, sizeof conf, "%s/redis.conf", ndir);
        if (mkdir(ndir, 0700) != 0)
            bench_die("mkdir %s: %s", ndir, strerror(errno));
        bench_write_conf(conf, conf_text);
        char *argv[] = {"redis-server", conf, "--port", p, "--bind", "127.0.0.1", "--save", "",
                        "--appendonly", "no", "--dir", ndir, "--logfile", logf,
                        "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                        NULL};
        bench_spawn(pids, &nprocs, argv);
    }
    for (int i = 0; i < NODES; i++) {
        int up = 0;
        for (int k = 0; k < 1500 && !up; k++) {
            redisContext *c = bench_connect_auth("127.0.0.1", port[i], password);
            up = c != NULL;
            redisFree(c);
            if (!up)
                pause_ms(10);
        }
        if (!up)
            bench_die("redis-server on port %d did not start (see %s)", port[i], dir);
        bench_require_auth("127.0.0.1", port[i], "cluster node");
    }
    /* redis-cli takes the password from its environment, not argv. */
    len = (size_t)snprintf(cmd, sizeof cmd,
                           "REDISCLI_AUTH=$DLOCK_BENCH_PW redis-cli --cluster create");
    for (int i = 0; i < NODES; i++)
        len += (size_t)snprintf(cmd + len, sizeof cmd - len, " 127.0.0.1:%d", port[i]);
    snprintf(cmd + len, sizeof cmd - len, " --cluster-yes >%s/create.log 2>&1", dir);
    setenv("DLOCK_BENCH_PW", password, 1);
    int created = system(cmd);
    unsetenv("DLOCK_BENCH_PW");
    if (created != 0)
        bench_die("redis-cli --cluster create failed (see %s/create.log)", dir);
    for (int i = 0; i < NODES; i++) {
        int k = 0;
        while (!cluster_ok(port[i]) && k++ < 3000)
            pause_ms(20);
        if (!cluster_ok(port[i]))
            bench_die("port %d: no cluster_state:ok (see %s)", port[i], dir);
    }
    snprintf(url, size, "redis-cluster://:%s@127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", password,
             port[0], port[1], port[2]);
}

/* The master serving key: asked of the first node, followed once if MOVED. */
static redisContext *master_of(const char *url, const char *key, char *where, size_t size)
{
    const char *hosts = url + strlen("redis-cluster://");
    char first[256];

    if (strchr(hosts, '@') != NULL && strchr(hosts, '@') < hosts + strcspn(hosts, "/?"))
        hosts = strchr(hosts, '@') + 1;
    snprintf(first, sizeof first, "%.*s", (int)strcspn(hosts, ",/?"), hosts);
    char *colon = strrchr(first, ':');
    if (colon == NULL)
        bench_die("--url: no port in '%s'", first);
    *colon = 0;
    redisContext *c = bench_connect_auth(first, atoi(colon + 1), password);
    if (c == NULL)
        bench_die("connect %s: not reached, or the URL's password refused", first);
    snprintf(where, size, "%s:%s", first, colon + 1);
    redisReply *r = redisCommand(c, "EXISTS %s", key);
    if (r && r->type == REDIS_REPLY_ERROR && strncmp(r->str, "MOVED ", 6) == 0) {
        char *addr = strrchr(r->str, ' ') + 1, *pc = strrchr(addr, ':');
        *pc = 0;
        redisFree(c);
        c = bench_connect_auth(addr, atoi(pc + 1), password);
        if (c == NULL)
            bench_die("connect %s: not reached, or the URL's password refused", addr);
        snprintf(where, size, "%s:%s", addr, pc + 1);
    }
    if (r)
        freeReplyObject(r);
    return c;
}

int bench_cluster(const char *given_url, long iterations)
{
    char url[1024], name[64], key[96], where[300];
    long n = iterations < 200 ? 200 : iterations;
    dlock_client *client = NULL;
    bench_series ping = {0}, cyc = {0};

    if (given_url) {
        if (strncmp(given_url, "redis-cluster://", 16) != 0)
            bench_die("--cluster --url wants redis-cluster://HOST:PORT,...");
        snprintf(url, sizeof url, "%s", given_url);
        bench_url_password(url, password, sizeof password);
    } else {
        atexit(stop_all);
        start_all(url, sizeof url);
    }
    if (dlock_client_open(&client, url, NULL) != DLOCK_OK)
        bench_die("dlock_client_open %s: %s", bench_redacted(url), dlock_error_message());
    snprintf(name, sizeof name, "dlock-bench:%ld:cluster", (long)getpid());
    snprintf(key, sizeof key, "dlock:{%s}", name);
    redisContext *raw = master_of(url, key, where, sizeof where);

    printf("dlock-bench --cluster: dlock %s, %s (%s), the lock's master %s\n", dlock_version(),
           bench_redacted(url), given_url ? "given" : "3 masters started by this run, "
           "loopback TCP", where);
    printf("  %ld cycles (acquire + release, auto_renew=0); not pinned\n", n);
    for (long i = 0; i < n / 10 + 50; i++) { /* warm-up: the slot map, the scripts */
        redisReply *r = redisCommand(raw, "PING");
        freeReplyObject(r);
        bench_cycle(client, name, NULL);
    }
    for (int round = 0; round < 10; round++) {
        long per = n / 10 + (round < n % 10);
        for (long i = 0; i < per; i++)
            bench_timed_ping(raw, &ping);
        for (long i = 0; i < per; i++)
            bench_cycle(client, name, &cyc);
    }
    double p50 = bench_series_us(&ping, 50), c50 = bench_series_us(&cyc, 50);
    char base[64];
    printf("\n");
    bench_print_row("raw PING to the lock's master", p50, bench_series_us(&ping, 99), -1, NULL,
                    1.0, 0);
    snprintf(base, sizeof base, "PING %.1f", p50);
    bench_print_row("dlock cycle on the cluster", c50, bench_series_us(&cyc, 99), -1, base,
                    c50 / p50, 0);
    /* A cycle is two round trips (acquire, release), as on one node. */
    snprintf(base, sizeof base, "2 x PING %.1f", 2 * p50);
    bench_print_row("cycle vs two raw round trips", -1, -1, -1, base, c50 / (2 * p50), 0);
    redisFree(raw);
    dlock_client_free(client);
    free(ping.v);
    free(cyc.v);
    return 0;
}
