/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock-bench --sentinel: what min_replicas=1 costs on a Sentinel URL: the
 * cycle (acquire + release) with min_replicas=1 (the acquire's script and
 * WAIT 1 in one round trip) beside min_replicas=0 and beside a raw PING to
 * the master, with their ratios.
 *
 * Without --url it starts a master, 2 replicas and one sentinel (quorum 1)
 * on free loopback ports in a mkdtemp folder, all with one random password
 * (requirepass, masterauth and the sentinel's auth-pass in config files,
 * never on a command line; checked: a client without it is refused), the
 * URL giving it as the master's and as sentinel_password; they die with the bench
 * (PR_SET_PDEATHSIG) and are stopped when it exits. With --url
 * redis-sentinel://[:PASSWORD@]...[/MASTER][?sentinel_password=...] (no
 * min_replicas=) it measures that.
 */
#include "bench.h"

#include <dlock/dlock.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PROCS 4 /* master, 2 replicas, sentinel */

static char dir[256], password[256]; /* the master's, "" for none */
static char sentinel_pw[256];           /* the sentinels', "" for none */
static pid_t pids[PROCS];
static int nprocs;

static void stop_all(void)
{
    bench_stop_children(pids, &nprocs, dir);
}

static void spawn(char *const argv[])
{
    bench_spawn(pids, &nprocs, argv);
}

/* A reply to cmd on port (AUTH with pw), the reply's text (status or bulk)
 * into out. */
static int ask(int port, const char *pw, const char *cmd, char *out, size_t size)
{
    redisContext *c = bench_connect_auth("127.0.0.1", port, pw);
    redisReply *r = NULL;
    int ok = 0;

    if (c != NULL && (r = redisCommand(c, cmd)) != NULL) {
        if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) {
            snprintf(out, size, "%s", r->str);
            ok = 1;
        } else if (r->type == REDIS_REPLY_ARRAY && r->elements == 2) {
            snprintf(out, size, "%s", r->element[1]->str);
            ok = 1;
        }
    }
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return ok;
}

static void wait_for(int port, const char *pw, const char *cmd, const char *want)
{
    char got[4096] = "";
    for (int k = 0; k < 3000; k++) {
        if (ask(port, pw, cmd, got, sizeof got) && strstr(got, want) != NULL)
            return;
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    bench_die("port %d: '%s' never answered '%s' (see %s)", port, cmd, want, dir);
}

static void start_all(char *url, size_t size)
{
    int port[PROCS];
    char p[PROCS][16], conf[320], mport[16], text[1200];

    snprintf(dir, sizeof dir, "%s/dlock-bench-sentinel-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(dir) == NULL)
        bench_die("mkdtemp: %s", strerror(errno));
    for (int i = 0; i < PROCS; i++) {
        port[i] = bench_free_port();
        snprintf(p[i], sizeof p[i], "%d", port[i]);
    }
    snprintf(mport, sizeof mport, "%d", port[0]);
    bench_random_password(password);
    snprintf(sentinel_pw, sizeof sentinel_pw, "%s", password);
    for (int i = 0; i < 3; i++) {
        char logf[320], rconf[320];
        snprintf(logf, sizeof logf, "%s/redis-%d.log", dir, i);
        snprintf(rconf, sizeof rconf, "%s/redis-%d.conf", dir, i);
        snprintf(text, sizeof text, "requirepass %s\nmasterauth %s\n", password, password);
        bench_write_conf(rconf, text);
        char *argv[] = {"redis-server", rconf, "--port", p[i], "--bind", "127.0.0.1", "--save", "",
                        "--appendonly", "no", "--dir", dir, "--logfile", logf,
                        "--repl-diskless-sync-delay", "0", i ? "--replicaof" : NULL,
                        "127.0.0.1", mport, NULL};
        spawn(argv);
    }
    snprintf(conf, sizeof conf, "%s/sentinel.conf", dir);
    /* The sentinel rewrites its file: it must stay writable (0600). */
    snprintf(text, sizeof text, "port %d\nbind 127.0.0.1\ndir %s\nlogfile %s/sentinel.log\n"
             "requirepass %s\nsentinel monitor bench 127.0.0.1 %d 1\n"
             "sentinel auth-pass bench %s\n", port[3], dir, dir, password, port[0], password);
    bench_write_conf(conf, text);
    char *sargv[] = {"redis-sentinel", conf, NULL};
    spawn(sargv);
    for (int i = 1; i < 3; i++)
        wait_for(port[i], password, "INFO replication", "master_link_status:up");
    wait_for(port[3], password, "SENTINEL get-master-addr-by-name bench", mport);
    for (int i = 0; i < PROCS; i++)
        bench_require_auth("127.0.0.1", port[i], i < 3 ? "redis-server" : "redis-sentinel");
    snprintf(url, size, "redis-sentinel://:%s@127.0.0.1:%d/bench?sentinel_password=%s", password,
             port[3], password);
}

int bench_sentinel(const char *given_url, long iterations)
{
    char url[1024], u[2][1100], host[256] = "", portstr[16] = "", name[64];
    long n = iterations / 2 < 200 ? 200 : iterations / 2;
    dlock_client *client[2] = {NULL, NULL};
    bench_series ping = {0}, cyc[2] = {{0}, {0}};

    if (given_url) {
        const char *q = strchr(given_url, '?');
        if (strncmp(given_url, "redis-sentinel://", 17) != 0 ||
            (q != NULL && strstr(q, "min_replicas=") != NULL))
            bench_die("--sentinel --url wants redis-sentinel://HOST:PORT,.../MASTER (no "
                      "min_replicas=: the bench adds it)");
        snprintf(url, sizeof url, "%s", given_url);
        bench_url_password(url, password, sizeof password);
        if (q != NULL && (q = strstr(q, "sentinel_password=")) != NULL)
            snprintf(sentinel_pw, sizeof sentinel_pw, "%.*s", (int)strcspn(q + 18, "&#"), q + 18);
    } else {
        atexit(stop_all);
        start_all(url, sizeof url);
    }
    for (int m = 0; m < 2; m++) {
        snprintf(u[m], sizeof u[m], "%s%cmin_replicas=%d", url, strchr(url, '?') ? '&' : '?', m);
        if (dlock_client_open(&client[m], u[m], NULL) != DLOCK_OK)
            bench_die("dlock_client_open %s: %s", bench_redacted(u[m]), dlock_error_message());
    }
    /* The master, as the sentinels name it, for the raw PING. */
    {
        const char *hosts = url + 17, *slash;
        char first[256], cmd[300];
        if (strchr(hosts, '@') != NULL && strchr(hosts, '@') < hosts + strcspn(hosts, "/?"))
            hosts = strchr(hosts, '@') + 1;
        slash = strchr(hosts, '/');
        snprintf(first, sizeof first, "%.*s", (int)strcspn(hosts, ",/?"), hosts);
        char *colon = strrchr(first, ':');
        if (colon == NULL || slash == NULL)
            bench_die("--url: no sentinel port or master name");
        *colon = 0;
        redisContext *s = bench_connect_auth(first, atoi(colon + 1), sentinel_pw);
        snprintf(cmd, sizeof cmd, "SENTINEL get-master-addr-by-name %.*s",
                 (int)strcspn(slash + 1, "?"), slash + 1);
        redisReply *r = s ? redisCommand(s, cmd) : NULL;
        if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 2)
            bench_die("sentinel %s: no master address", first);
        snprintf(host, sizeof host, "%s", r->element[0]->str);
        snprintf(portstr, sizeof portstr, "%s", r->element[1]->str);
        freeReplyObject(r);
        redisFree(s);
    }
    redisContext *raw = bench_connect_auth(host, atoi(portstr), password);
    if (raw == NULL)
        bench_die("connect %s:%s: not reached, or the URL's password refused", host, portstr);
    snprintf(name, sizeof name, "dlock-bench:%ld:sentinel", (long)getpid());

    printf("dlock-bench --sentinel: dlock %s, %s (%s), master %s:%s\n", dlock_version(),
           bench_redacted(url), given_url ? "given" : "a master, 2 replicas and a sentinel "
           "started by this run, loopback TCP", host, portstr);
    printf("  %ld cycles each (acquire + release, auto_renew=0); not pinned\n", n);
    for (long i = 0; i < n / 10 + 50; i++) { /* warm-up */
        redisReply *r = redisCommand(raw, "PING");
        freeReplyObject(r);
        bench_cycle(client[0], name, NULL);
        bench_cycle(client[1], name, NULL);
    }
    /* Interleaved rounds: a slow spell of the machine hits each alike. */
    for (int round = 0; round < 10; round++) {
        long per = n / 10 + (round < n % 10);
        for (long i = 0; i < per; i++)
            bench_timed_ping(raw, &ping);
        for (long i = 0; i < per; i++)
            bench_cycle(client[0], name, &cyc[0]);
        for (long i = 0; i < per; i++)
            bench_cycle(client[1], name, &cyc[1]);
    }
    double p50 = bench_series_us(&ping, 50), c0 = bench_series_us(&cyc[0], 50);
    char base[64], base0[64];
    printf("\n");
    bench_print_row("raw PING to the master", p50, bench_series_us(&ping, 99), -1, NULL, 1.0, 0);
    snprintf(base, sizeof base, "PING %.1f", p50);
    snprintf(base0, sizeof base0, "min_replicas=0 %.1f", c0);
    bench_print_row("dlock cycle, min_replicas=0", c0, bench_series_us(&cyc[0], 99), -1, base,
                    c0 / p50, 0);
    bench_print_row("dlock cycle, min_replicas=1", bench_series_us(&cyc[1], 50),
                    bench_series_us(&cyc[1], 99), -1, base, bench_series_us(&cyc[1], 50) / p50,
                    0);
    bench_print_row("min_replicas=1 vs 0", -1, -1, -1, base0, bench_series_us(&cyc[1], 50) / c0,
                    0);
    redisFree(raw);
    for (int m = 0; m < 2; m++)
        dlock_client_free(client[m]);
    free(ping.v);
    free(cyc[0].v);
    free(cyc[1].v);
    return 0;
}
