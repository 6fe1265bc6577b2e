/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock-bench: what a dlock call costs, beside the raw Redis round trip
 * measured in the same run.
 *
 *   dlock-bench [--url URL] [--iterations N] [--seconds S] [--no-pin]
 *
 * Without --url it starts its own throwaway redis-server. It is a program,
 * not a test: it prints figures and whether each target is met, and exits 0
 * whatever they are (1 only when something fails outright). docs/bench.md
 * explains every line.
 */
#include "bench.h"
#include "redact.h"

#include <dlock/dlock.h>

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Targets of issue 2, section 4. */
#define TARGET_CYCLE_RATIO 1.2  /* cycle p50 <= 1.2 x (2 x PING p50) */
#define TARGET_HANDOFF_RATIO 3.0 /* hand-off p50 <= 3 x PING p50 */

#define ROUNDS 10               /* latency loops are interleaved in this many rounds */
#define HANDOFF_HOLD_MS 2       /* how long A holds the lock while B waits */
#define MAX_THREADS 8

static char url[1024];
static bench_endpoint endpoint;
static long iterations = 5000;
static int pin = 1;
static int etcd; /* --etcd: the etcd section (bench/etcd.c) instead */
static int postgres; /* --postgres: the PostgreSQL section (bench/postgres.c) instead */
static int mysql;    /* --mysql: the MySQL/MariaDB section (bench/mysql.c) instead */
static int zk;       /* --zk: the ZooKeeper section (bench/zk.c) instead */
static int redlock; /* --redlock: the Redlock section (bench/redlock.c) instead */
static int sentinel; /* --sentinel: min_replicas's cost (bench/sentinel.c) instead */
static int cluster;  /* --cluster: the cycle on Redis Cluster (bench/cluster.c) instead */
static int async;    /* --async: the async API beside the blocking one (bench/async.c) */
static long waiters = 10000; /* --waiters: async waiters on one client, for --async */
static double seconds = 2.0;
static char key_base[64]; /* unique per run, so runs against one server never meet */

/* ------------------------------------------------------------------------
 * Helpers: time, failure
 * ---------------------------------------------------------------------- */

int64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void bench_die(const char *fmt, ...)
{
    static pthread_mutex_t once = PTHREAD_MUTEX_INITIALIZER;
    if (atomic_load(&bench_interrupted)) {
        /* The failure is the clean-up's doing: the signal thread exits. */
        for (;;)
            pause();
    }
    pthread_mutex_lock(&once); /* one message, even if two threads fail */
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    fputs("dlock-bench: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    bench_server_stop();
    _exit(1);
}

static void die_dlock(const char *what, int rc)
{
    bench_die("%s: %s (%s)", what, dlock_strerror(rc), dlock_error_message());
}

static void sleep_ns(int64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
    while (clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) == EINTR) {
    }
}

/* ------------------------------------------------------------------------
 * The table
 * ---------------------------------------------------------------------- */

#define NA (-1.0)

static void print_header(void)
{
    printf("%-40s %8s %8s %9s  %-20s %6s  %-7s %s\n", "measurement", "p50 us", "p99 us", "ops/s",
           "baseline", "ratio", "target", "result");
    printf("%-40s %8s %8s %9s  %-20s %6s  %-7s %s\n", "-----------", "------", "------", "-----",
           "--------", "-----", "------", "------");
}

/* One line. Numbers < 0 print as "-"; target <= 0 means none. */
static void print_row(const char *name, double p50, double p99, double ops, const char *baseline,
                      double ratio, double target)
{
    char a[32] = "-", b[32] = "-", c[32] = "-", r[32] = "-", t[32] = "-";
    const char *result = "-";
    if (p50 >= 0)
        snprintf(a, sizeof a, "%.1f", p50);
    if (p99 >= 0)
        snprintf(b, sizeof b, "%.1f", p99);
    if (ops >= 0)
        snprintf(c, sizeof c, "%.0f", ops);
    if (ratio >= 0)
        snprintf(r, sizeof r, "%.2f", ratio);
    if (target > 0) {
        snprintf(t, sizeof t, "<= %.1f", target);
        result = ratio <= target ? "met" : "NOT MET";
    }
    printf("%-40s %8s %8s %9s  %-20s %6s  %-7s %s\n", name, a, b, c, baseline ? baseline : "-", r,
           t, result);
    fflush(stdout);
}

void bench_print_header(void)
{
    print_header();
}

void bench_print_row(const char *name, double p50, double p99, double ops, const char *baseline,
                     double ratio, double target)
{
    print_row(name, p50, p99, ops, baseline, ratio, target);
}

/* ------------------------------------------------------------------------
 * Server-side command counts (INFO commandstats), to show what a dlock call
 * sends: the top-level commands and, for scripts, what runs inside them.
 * ---------------------------------------------------------------------- */

#define MAX_CMDS 64

typedef struct {
    int n;
    char name[MAX_CMDS][32];
    long long calls[MAX_CMDS];
} cmdstats;

static void cmdstats_take(cmdstats *out, redisContext *c)
{
    out->n = 0;
    redisReply *r = redisCommand(c, "INFO commandstats");
    if (!r || r->type != REDIS_REPLY_STRING)
        bench_die("INFO commandstats: %s", r ? "unexpected reply" : c->errstr);
    const char *p = r->str;
    while ((p = strstr(p, "cmdstat_")) != NULL && out->n < MAX_CMDS) {
        p += strlen("cmdstat_");
        size_t len = strcspn(p, ":");
        const char *calls = strstr(p, "calls=");
        if (len < sizeof out->name[0] && calls) {
            memcpy(out->name[out->n], p, len);
            out->name[out->n][len] = 0;
            out->calls[out->n] = strtoll(calls + 6, NULL, 10);
            out->n++;
        }
    }
    freeReplyObject(r);
}

static long long cmdstats_get(const cmdstats *s, const char *name)
{
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->name[i], name) == 0)
            return s->calls[i];
    return 0;
}

/* "evalsha 2.00, set 1.00, ..." per unit, leaving out our own INFO. */
static void cmdstats_print(const char *label, const cmdstats *before, const cmdstats *after,
                           long units)
{
    printf("  %-34s", label);
    int any = 0;
    for (int i = 0; i < after->n; i++) {
        if (strcmp(after->name[i], "info") == 0)
            continue;
        long long d = after->calls[i] - cmdstats_get(before, after->name[i]);
        if (d <= 0)
            continue;
        printf("%s%s %.2f", any ? ", " : " ", after->name[i], (double)d / (double)units);
        any = 1;
    }
    printf("%s\n", any ? "" : " (none)");
}

/* ------------------------------------------------------------------------
 * Latency: raw round trips and uncontended dlock cycles, interleaved
 * ---------------------------------------------------------------------- */

typedef struct {
    bench_series ping, set, del;
    bench_series cycle[2], acquire[2], release[2]; /* [auto_renew] */
} latency;

static void raw_ping(redisContext *c, bench_series *s)
{
    int64_t t0 = bench_now_ns();
    redisReply *r = redisCommand(c, "PING");
    int64_t t1 = bench_now_ns();
    if (!r || r->type != REDIS_REPLY_STATUS || strcmp(r->str, "PONG") != 0)
        bench_die("PING: %s", r ? "unexpected reply" : c->errstr);
    freeReplyObject(r);
    if (s)
        bench_series_add(s, t1 - t0);
}

static void raw_set_del(redisContext *c, const char *key, bench_series *set, bench_series *del)
{
    int64_t t0 = bench_now_ns();
    redisReply *r = redisCommand(c, "SET %s v NX PX 30000", key);
    int64_t t1 = bench_now_ns();
    if (!r || r->type != REDIS_REPLY_STATUS)
        bench_die("SET %s NX PX: %s", key, r ? "unexpected reply (key exists?)" : c->errstr);
    freeReplyObject(r);
    int64_t t2 = bench_now_ns();
    r = redisCommand(c, "DEL %s", key);
    int64_t t3 = bench_now_ns();
    if (!r || r->type != REDIS_REPLY_INTEGER || r->integer != 1)
        bench_die("DEL %s: %s", key, r ? "unexpected reply" : c->errstr);
    freeReplyObject(r);
    if (set)
        bench_series_add(set, t1 - t0);
    if (del)
        bench_series_add(del, t3 - t2);
}

/* One uncontended acquire (try once) + release. */
static void dlock_cycle(dlock_client *client, const char *name, int auto_renew, bench_series *cycle,
                        bench_series *acq, bench_series *rel)
{
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;
    o.wait_ms = 0;
    o.auto_renew = auto_renew;
    dlock_lock *lock = NULL;

    int64_t t0 = bench_now_ns();
    int rc = dlock_acquire(&lock, client, name, &o);
    int64_t t1 = bench_now_ns();
    if (rc != DLOCK_OK)
        die_dlock("dlock_acquire (uncontended)", rc);
    if (dlock_lock_fence(lock) == 0)
        bench_die("dlock_acquire gave a lock with fence 0");
    rc = dlock_release(lock);
    int64_t t2 = bench_now_ns();
    if (rc != DLOCK_OK)
        die_dlock("dlock_release (uncontended)", rc);
    if (cycle) {
        bench_series_add(cycle, t2 - t0);
        bench_series_add(acq, t1 - t0);
        bench_series_add(rel, t2 - t1);
    }
}

/* client[a] is used for the cycles with auto_renew = a: a client that never
 * holds an auto-renewed lock never starts its watchdog thread. */
static void measure_latency(latency *L, redisContext *raw, dlock_client *client[2])
{
    char raw_key[128], name[2][128];
    snprintf(raw_key, sizeof raw_key, "%s:raw", key_base);
    snprintf(name[0], sizeof name[0], "%s:cycle:renew0", key_base);
    snprintf(name[1], sizeof name[1], "%s:cycle:renew1", key_base);

    memset(L, 0, sizeof *L);

    /* Warm-up: connections, the scripts loaded (NOSCRIPT path), caches. */
    long warm = iterations / 10 < 200 ? 200 : iterations / 10;
    for (long i = 0; i < warm; i++) {
        raw_ping(raw, NULL);
        raw_set_del(raw, raw_key, NULL, NULL);
        dlock_cycle(client[1], name[1], 1, NULL, NULL, NULL);
        dlock_cycle(client[0], name[0], 0, NULL, NULL, NULL);
    }

    /* Interleaved, so a slow spell of the machine hits all of them alike. */
    for (int round = 0; round < ROUNDS; round++) {
        long per = iterations / ROUNDS + (round < iterations % ROUNDS);
        for (long i = 0; i < per; i++)
            raw_ping(raw, &L->ping);
        for (long i = 0; i < per; i++)
            raw_set_del(raw, raw_key, &L->set, &L->del);
        for (long i = 0; i < per; i++)
            dlock_cycle(client[1], name[1], 1, &L->cycle[1], &L->acquire[1], &L->release[1]);
        for (long i = 0; i < per; i++)
            dlock_cycle(client[0], name[0], 0, &L->cycle[0], &L->acquire[0], &L->release[0]);
    }
}

static void latency_free(latency *L)
{
    free(L->ping.v);
    free(L->set.v);
    free(L->del.v);
    for (int a = 0; a < 2; a++) {
        free(L->cycle[a].v);
        free(L->acquire[a].v);
        free(L->release[a].v);
    }
}

/* ------------------------------------------------------------------------
 * Throughput: threads looping until told to stop
 * ---------------------------------------------------------------------- */

enum { TP_PING, TP_CYCLE };

typedef struct {
    int kind;
    redisContext *raw;
    dlock_client *client;
    char name[128];
} tp_worker;

static void tp_op(void *arg)
{
    tp_worker *w = arg;

    if (w->kind == TP_PING)
        raw_ping(w->raw, NULL);
    else
        dlock_cycle(w->client, w->name, 1, NULL, NULL, NULL);
}

/*
 * Operations per second with nthreads threads (bench_throughput). For
 * TP_PING each thread has its own hiredis connection; for TP_CYCLE each
 * thread has its own lock name and either one shared client or a client of
 * its own.
 */
static double measure_throughput(int kind, int nthreads, int shared_client)
{
    tp_worker w[MAX_THREADS];
    void *args[MAX_THREADS];
    dlock_client *shared = NULL;

    if (kind == TP_CYCLE && shared_client) {
        int rc = dlock_client_open(&shared, url, NULL);
        if (rc != DLOCK_OK)
            die_dlock("dlock_client_open", rc);
    }
    for (int i = 0; i < nthreads; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].kind = kind;
        snprintf(w[i].name, sizeof w[i].name, "%s:tp:%d", key_base, i);
        if (kind == TP_PING) {
            w[i].raw = bench_raw_connect(&endpoint);
        } else if (shared) {
            w[i].client = shared;
        } else {
            int rc = dlock_client_open(&w[i].client, url, NULL);
            if (rc != DLOCK_OK)
                die_dlock("dlock_client_open", rc);
        }
        args[i] = &w[i];
    }
    double median = bench_throughput(nthreads, seconds, tp_op, args);
    for (int i = 0; i < nthreads; i++) {
        if (w[i].raw)
            redisFree(w[i].raw);
        if (!shared)
            dlock_client_free(w[i].client);
    }
    dlock_client_free(shared);
    return median;
}

/* ------------------------------------------------------------------------
 * Contended hand-off: A releases, B (blocked in dlock_acquire) gets it
 * ---------------------------------------------------------------------- */

typedef struct {
    dlock_client *client;
    const char *name;
    long count;
    sem_t go, done;
    int64_t b_start, b_end; /* written by B before it posts done */
} handoff;

static void *handoff_b(void *arg)
{
    handoff *h = arg;
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;
    o.wait_ms = 30000;
    for (long i = 0; i < h->count; i++) {
        while (sem_wait(&h->go) != 0) {
        }
        dlock_lock *lock = NULL;
        h->b_start = bench_now_ns();
        int rc = dlock_acquire(&lock, h->client, h->name, &o);
        h->b_end = bench_now_ns();
        if (rc != DLOCK_OK)
            die_dlock("hand-off: B's dlock_acquire", rc);
        rc = dlock_release(lock);
        if (rc != DLOCK_OK)
            die_dlock("hand-off: B's dlock_release", rc);
        sem_post(&h->done);
    }
    return NULL;
}

/*
 * The same hand-off done by hand with hiredis, as the floor any pub/sub
 * design can reach: B's connection stays subscribed throughout, A deletes
 * the key and publishes in one script, B answers the message with SET NX PX.
 */
typedef struct {
    redisContext *sub, *cmd;
    const char *key;
    long count;
    sem_t go, done;
    int64_t b_end;
} raw_handoff;

static void *raw_handoff_b(void *arg)
{
    raw_handoff *h = arg;
    for (long i = 0; i < h->count; i++) {
        while (sem_wait(&h->go) != 0) {
        }
        redisReply *r = NULL;
        if (redisGetReply(h->sub, (void **)&r) != REDIS_OK || r->type != REDIS_REPLY_ARRAY)
            bench_die("raw hand-off: waiting for the message: %s", h->sub->errstr);
        freeReplyObject(r);
        r = redisCommand(h->cmd, "SET %s b NX PX 30000", h->key);
        h->b_end = bench_now_ns();
        if (!r || r->type != REDIS_REPLY_STATUS)
            bench_die("raw hand-off: B's SET NX PX: %s", r ? "key still there" : h->cmd->errstr);
        freeReplyObject(r);
        bench_raw_expect(h->cmd, REDIS_REPLY_INTEGER, NULL, "DEL %s", h->key);
        sem_post(&h->done);
    }
    return NULL;
}

static void measure_raw_handoff(bench_series *lat, long count, long warm, redisContext *raw)
{
    char key[128], chan[160];
    snprintf(key, sizeof key, "%s:rawhandoff", key_base);
    snprintf(chan, sizeof chan, "%s:released", key);
    raw_handoff h;
    memset(&h, 0, sizeof h);
    h.sub = bench_raw_connect(&endpoint);
    h.cmd = bench_raw_connect(&endpoint);
    h.key = key;
    h.count = count + warm;
    bench_raw_expect(h.sub, REDIS_REPLY_ARRAY, NULL, "SUBSCRIBE %s", chan);
    sem_init(&h.go, 0, 0);
    sem_init(&h.done, 0, 0);
    pthread_t tb;
    if (pthread_create(&tb, NULL, raw_handoff_b, &h) != 0)
        bench_die("pthread_create failed");

    memset(lat, 0, sizeof *lat);
    for (long i = 0; i < count + warm; i++) {
        bench_raw_expect(raw, REDIS_REPLY_STATUS, "OK", "SET %s a NX PX 30000", key);
        sem_post(&h.go);
        sleep_ns((int64_t)HANDOFF_HOLD_MS * 1000000);
        int64_t t0 = bench_now_ns();
        bench_raw_expect(raw, REDIS_REPLY_INTEGER, NULL,
                         "EVAL %s 2 %s %s",
                         "redis.call('DEL', KEYS[1]) return redis.call('PUBLISH', KEYS[2], 'r')",
                         key, chan);
        while (sem_wait(&h.done) != 0) {
        }
        if (i >= warm)
            bench_series_add(lat, h.b_end - t0);
    }
    pthread_join(tb, NULL);
    sem_destroy(&h.go);
    sem_destroy(&h.done);
    redisFree(h.sub);
    redisFree(h.cmd);
}

typedef struct {
    bench_series lat;
    long early;        /* B got the lock before A released: must stay 0 */
    double min_wait_us; /* shortest time B spent inside dlock_acquire */
} handoff_result;

/*
 * Thread A (this one) takes the lock and lets B start waiting for it; after
 * HANDOFF_HOLD_MS, long enough for B to have failed its first try and to be
 * asleep in its wait, A notes t0 and releases. B notes t1 as its acquire
 * returns. The figure is t1 - t0. B uses a client of its own.
 */
static void measure_handoff(handoff_result *res, long count, long warm, cmdstats *before,
                            cmdstats *after, redisContext *raw)
{
    char name[128];
    snprintf(name, sizeof name, "%s:handoff", key_base);
    dlock_client *ca = NULL, *cb = NULL;
    int rc = dlock_client_open(&ca, url, NULL);
    if (rc == DLOCK_OK)
        rc = dlock_client_open(&cb, url, NULL);
    if (rc != DLOCK_OK)
        die_dlock("dlock_client_open", rc);

    handoff h;
    memset(&h, 0, sizeof h);
    h.client = cb;
    h.name = name;
    h.count = count + warm;
    sem_init(&h.go, 0, 0);
    sem_init(&h.done, 0, 0);
    pthread_t tb;
    if (pthread_create(&tb, NULL, handoff_b, &h) != 0)
        bench_die("pthread_create failed");

    memset(&res->lat, 0, sizeof res->lat);
    res->early = 0;
    res->min_wait_us = 1e18;
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;
    o.wait_ms = 0;
    for (long i = 0; i < count + warm; i++) {
        if (i == warm)
            cmdstats_take(before, raw);
        dlock_lock *lock = NULL;
        rc = dlock_acquire(&lock, ca, name, &o);
        if (rc != DLOCK_OK)
            die_dlock("hand-off: A's dlock_acquire", rc);
        sem_post(&h.go);
        sleep_ns((int64_t)HANDOFF_HOLD_MS * 1000000);
        int64_t t0 = bench_now_ns();
        rc = dlock_release(lock);
        if (rc != DLOCK_OK)
            die_dlock("hand-off: A's dlock_release", rc);
        while (sem_wait(&h.done) != 0) {
        }
        if (i < warm)
            continue;
        if (h.b_end < t0)
            res->early++;
        bench_series_add(&res->lat, h.b_end - t0);
        double waited = (double)(h.b_end - h.b_start) / 1000.0;
        if (waited < res->min_wait_us)
            res->min_wait_us = waited;
    }
    cmdstats_take(after, raw);
    pthread_join(tb, NULL);
    sem_destroy(&h.go);
    sem_destroy(&h.done);
    dlock_client_free(ca);
    dlock_client_free(cb);
}

/* ------------------------------------------------------------------------
 * Outside load: on a shared machine the figures mean little if other
 * processes (or the hypervisor) took CPU during the run, so say how much.
 * ---------------------------------------------------------------------- */

typedef struct {
    int ok;
    double busy_s;  /* all CPUs, all processes, from /proc/stat */
    double steal_s; /* taken by the hypervisor */
    double own_s;   /* this process and its redis-server */
    int64_t wall_ns;
} load_snap;

/* utime + stime of a process, in seconds, from /proc/PID/stat. */
static double proc_cpu_s(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    unsigned long long utime = 0, stime = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime,
                     &stime) != 2)
        return 0;
    return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

static void load_take(load_snap *s)
{
    memset(s, 0, sizeof *s);
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return;
    unsigned long long v[8] = {0};
    int got = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
                     &v[3], &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (got < 7)
        return;
    double tick = (double)sysconf(_SC_CLK_TCK);
    s->busy_s = (double)(v[0] + v[1] + v[2] + v[5] + v[6]) / tick;
    s->steal_s = got == 8 ? (double)v[7] / tick : 0;
    s->own_s = proc_cpu_s(getpid());
    pid_t server = bench_server_pid();
    if (server)
        s->own_s += proc_cpu_s(server);
    s->wall_ns = bench_now_ns();
    s->ok = 1;
}

static void load_print(const load_snap *a, const load_snap *b)
{
    if (!a->ok || !b->ok)
        return;
    double wall = (double)(b->wall_ns - a->wall_ns) / 1e9;
    double other = (b->busy_s - a->busy_s - (b->own_s - a->own_s)) / wall;
    double steal = (b->steal_s - a->steal_s) / wall;
    if (other < 0)
        other = 0;
    printf("outside load: %.2f CPUs busy with other processes%s and %.2f CPUs stolen by\n"
           "  the hypervisor, on average over the %.1f s run. Much more than 0.05 of either\n"
           "  disturbs the figures: run again on a quiet machine.\n",
           other, bench_server_pid() ? "" : " (a local server included)", steal, wall);
}

/* ------------------------------------------------------------------------
 * main
 * ---------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dlock-bench [--url URL] [--iterations N] [--seconds S] [--no-pin] [--etcd]\n"
            "                   [--redlock] [--sentinel] [--cluster] [--postgres] [--mysql]\n"
            "                   [--zk] [--async [--waiters N]]\n"
            "\n"
            "  --url URL         the Redis server to measure (default: start a throwaway\n"
            "                    redis-server from PATH on a unix socket in a 0700 folder)\n"
            "  --iterations N    latency samples per measurement (default 5000);\n"
            "                    the hand-off is measured N/10 times (at least 10)\n"
            "  --seconds S       length of each throughput run (default 2)\n"
            "  --no-pin          with its own server, do not pin server and client to\n"
            "                    CPUs (default: table A on two CPUs, table B on one)\n"
            "  --postgres        measure PostgreSQL's lease and advisory modes beside the\n"
            "                    same statements sent raw through libpq (--url\n"
            "                    postgres://..., or a throwaway PostgreSQL); see\n"
            "                    bench/postgres.c\n"
            "  --mysql           the same on MySQL/MariaDB, lease and named modes, through\n"
            "                    libmariadb (--url mysql://..., or a throwaway MariaDB);\n"
            "                    see bench/mysql.c\n"
            "  --zk              measure ZooKeeper beside Curator's InterProcessMutex\n"
            "                    (--url zk://host:port, or a throwaway ZooKeeper on java);\n"
            "                    see bench/zk.c\n"
            "  --etcd            measure etcd instead (--url etcd://host:port, or a\n"
            "                    throwaway etcd from PATH); see bench/etcd.c\n"
            "  --sentinel        measure min_replicas=1 beside 0 on a Sentinel URL instead\n"
            "                    (--url redis-sentinel://..., or a master, 2 replicas and\n"
            "                    a sentinel started by the run); see bench/sentinel.c\n"
            "  --cluster         measure the cycle on Redis Cluster beside a raw PING to\n"
            "                    the lock's master (--url redis-cluster://..., or 3\n"
            "                    masters started by the run); see bench/cluster.c\n"
            "  --async           measure the async API (async.h) beside the blocking one:\n"
            "                    cycle, hand-off, and --waiters N (default 10000) async\n"
            "                    waiters on one client and one loop thread (--url of\n"
            "                    any backend, or the throwaway redis-server); see\n"
            "                    bench/async.c\n"
            "  --redlock         measure Redlock on 5 nodes beside node-redlock instead\n"
            "                    (--url redlock://..., or 5 throwaway redis-servers);\n"
            "                    see bench/redlock.c and `make bench-redlock`\n"
            "\n"
            "Prints p50/p99 latencies and throughputs beside the raw hiredis round trip\n"
            "of the same run, and whether the targets are met. See docs/bench.md.\n");
}

static void parse_args(int argc, char **argv)
{
    static const struct option longopts[] = {{"url", required_argument, NULL, 'u'},
                                             {"iterations", required_argument, NULL, 'n'},
                                             {"seconds", required_argument, NULL, 's'},
                                             {"no-pin", no_argument, NULL, 'p'},
                                             {"etcd", no_argument, NULL, 'e'},
                                             {"redlock", no_argument, NULL, 'r'},
                                             {"sentinel", no_argument, NULL, 'S'},
                                             {"cluster", no_argument, NULL, 'C'},
                                             {"postgres", no_argument, NULL, 'g'},
                                             {"mysql", no_argument, NULL, 'm'},
                                             {"zk", no_argument, NULL, 'z'},
                                             {"async", no_argument, NULL, 'A'},
                                             {"waiters", required_argument, NULL, 'w'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    int opt;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        char *end;
        switch (opt) {
        case 'u':
            if (strlen(optarg) >= sizeof url) {
                fprintf(stderr, "dlock-bench: --url too long\n");
                exit(64);
            }
            strcpy(url, optarg);
            break;
        case 'n':
            errno = 0;
            iterations = strtol(optarg, &end, 10);
            if (errno || *end || iterations < ROUNDS || iterations > 10000000) {
                fprintf(stderr, "dlock-bench: --iterations wants an integer from %d to 10000000\n",
                        ROUNDS);
                exit(64);
            }
            break;
        case 's':
            errno = 0;
            seconds = strtod(optarg, &end);
            if (errno || *end || !(seconds >= 0.1 && seconds <= 3600)) {
                fprintf(stderr, "dlock-bench: --seconds wants a number from 0.1 to 3600\n");
                exit(64);
            }
            break;
        case 'p':
            pin = 0;
            break;
        case 'e':
            etcd = 1;
            break;
        case 'r':
            redlock = 1;
            break;
        case 'C':
            cluster = 1;
            break;
        case 'S':
            sentinel = 1;
            break;
        case 'g':
            postgres = 1;
            break;
        case 'm':
            mysql = 1;
            break;
        case 'z':
            zk = 1;
            break;
        case 'A':
            async = 1;
            break;
        case 'w':
            errno = 0;
            waiters = strtol(optarg, &end, 10);
            if (errno || *end || waiters < 1 || waiters > 1000000) {
                fprintf(stderr, "dlock-bench: --waiters wants an integer from 1 to 1000000\n");
                exit(64);
            }
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            exit(64);
        }
    }
    if (optind < argc) {
        fprintf(stderr, "dlock-bench: unexpected argument %s\n", argv[optind]);
        usage(stderr);
        exit(64);
    }
}

/* url with its secrets (a password, secret query parameters) shown as
 * "***" (cli_redact): what the bench prints. */
const char *bench_redacted(const char *text)
{
    static char out[1100];

    cli_redact(out, sizeof out, text);
    return out;
}


/*
 * One table: uncontended latency, optionally throughput, and the hand-off,
 * all under the CPU placement the caller has set up. Returns how many
 * hand-offs broke mutual exclusion (must be 0).
 */
static long run_section(const char *title, redisContext *raw, dlock_client *client[2],
                        int with_throughput, int with_diagnostics)
{
    printf("\n%s\n", title);
    print_header();

    /* Uncontended latency, raw and dlock, interleaved. */
    latency L;
    measure_latency(&L, raw, client);
    double ping50 = bench_series_us(&L.ping, 50);
    char base[64];
    print_row("raw PING (hiredis)", ping50, bench_series_us(&L.ping, 99), NA, NULL, NA, 0);
    print_row("raw SET NX PX 30000 (hiredis)", bench_series_us(&L.set, 50),
              bench_series_us(&L.set, 99), NA, NULL, NA, 0);
    print_row("raw DEL (hiredis)", bench_series_us(&L.del, 50), bench_series_us(&L.del, 99), NA,
              NULL, NA, 0);
    for (int a = 1; a >= 0; a--) {
        char label[96];
        double c50 = bench_series_us(&L.cycle[a], 50);
        snprintf(base, sizeof base, "2x PING p50 %.1f", 2 * ping50);
        snprintf(label, sizeof label, "cycle acquire+release, auto_renew=%d", a);
        print_row(label, c50, bench_series_us(&L.cycle[a], 99), NA, base, c50 / (2 * ping50),
                  TARGET_CYCLE_RATIO);
        snprintf(base, sizeof base, "PING p50 %.1f", ping50);
        double a50 = bench_series_us(&L.acquire[a], 50), r50 = bench_series_us(&L.release[a], 50);
        snprintf(label, sizeof label, "  of which acquire, auto_renew=%d", a);
        print_row(label, a50, bench_series_us(&L.acquire[a], 99), NA, base, a50 / ping50, 0);
        snprintf(label, sizeof label, "  of which release, auto_renew=%d", a);
        print_row(label, r50, bench_series_us(&L.release[a], 99), NA, base, r50 / ping50, 0);
    }
    latency_free(&L);

    if (with_throughput) {
        double ping_tp[2];
        int threads[2] = {1, MAX_THREADS};
        for (int i = 0; i < 2; i++) {
            char label[96];
            ping_tp[i] = measure_throughput(TP_PING, threads[i], 0);
            snprintf(label, sizeof label, "throughput raw PING, %d thread%s", threads[i],
                     threads[i] > 1 ? "s" : "");
            print_row(label, NA, NA, ping_tp[i], NULL, NA, 0);
        }
        double tp = measure_throughput(TP_CYCLE, 1, 1);
        snprintf(base, sizeof base, "PING/2 %.0f/s", ping_tp[0] / 2);
        print_row("throughput cycle, 1 thread", NA, NA, tp, base, ping_tp[0] / (2 * tp), 0);
        snprintf(base, sizeof base, "PING/2 %.0f/s", ping_tp[1] / 2);
        tp = measure_throughput(TP_CYCLE, MAX_THREADS, 1);
        print_row("throughput cycle, 8 threads, 1 client", NA, NA, tp, base,
                  ping_tp[1] / (2 * tp), 0);
        tp = measure_throughput(TP_CYCLE, MAX_THREADS, 0);
        print_row("throughput cycle, 8 threads, 8 clients", NA, NA, tp, base,
                  ping_tp[1] / (2 * tp), 0);
    }

    /* Contended hand-off, raw and through dlock. */
    long handoffs = iterations / 10 < 10 ? 10 : iterations / 10;
    bench_series raw_h;
    measure_raw_handoff(&raw_h, handoffs, 20, raw);
    double rh50 = bench_series_us(&raw_h, 50);
    snprintf(base, sizeof base, "PING p50 %.1f", ping50);
    print_row("raw hand-off (hiredis, pub/sub)", rh50, bench_series_us(&raw_h, 99), NA, base,
              rh50 / ping50, 0);
    free(raw_h.v);
    handoff_result H;
    cmdstats hs0, hs1;
    measure_handoff(&H, handoffs, 20, &hs0, &hs1, raw);
    double h50 = bench_series_us(&H.lat, 50);
    print_row("hand-off release -> waiter's acquire", h50, bench_series_us(&H.lat, 99), NA, base,
              h50 / ping50, TARGET_HANDOFF_RATIO);
    snprintf(base, sizeof base, "raw hand-off %.1f", rh50);
    print_row("  the same, against the raw hand-off", NA, NA, NA, base, h50 / rh50, 0);
    free(H.lat.v);
    printf("hand-off check: B got the lock before A released it in %ld of %ld hand-offs "
           "(must be 0);\n  B's shortest time inside dlock_acquire was %.0f us (A holds %d ms)\n",
           H.early, handoffs, H.min_wait_us, HANDOFF_HOLD_MS);
    /* The lock family (family.c): the same hand-off for its kinds. */
    H.early += bench_family(url, key_base, handoffs, ping50, h50);

    if (with_diagnostics) {
        /* What the server saw, per operation (untimed passes). */
        printf("server commands per operation (INFO commandstats; script internals "
               "included):\n");
        for (int a = 1; a >= 0; a--) {
            char label[64], name[128];
            snprintf(name, sizeof name, "%s:cycle:renew%d", key_base, a);
            snprintf(label, sizeof label, "cycle, auto_renew=%d:", a);
            cmdstats s0, s1;
            long n = 1000;
            cmdstats_take(&s0, raw);
            for (long i = 0; i < n; i++)
                dlock_cycle(client[a], name, a, NULL, NULL, NULL);
            cmdstats_take(&s1, raw);
            cmdstats_print(label, &s0, &s1, n);
        }
        cmdstats_print("hand-off (A's and B's calls):", &hs0, &hs1, handoffs);
        if (!bench_server_pid())
            printf("  (other clients of %s count too)\n", bench_redacted(url));
    }
    return H.early;
}

/*
 * rediss://: the cycle beside the raw TLS round trip (a PING over dlock's
 * own transport), interleaved in 10 rounds as the plain table is. One
 * unpinned table: the server is the one the URL names.
 */
static int run_tls(dlock_client *client[2])
{
    char err[256];
    bench_series ping = {0}, cycle[2] = {{0}, {0}}, acq[2] = {{0}, {0}}, rel[2] = {{0}, {0}};
    char name[128], base[64];

    if (bench_endpoint_parse(&endpoint, url, err, sizeof err) != 0)
        bench_die("%s", err);
    void *raw = bench_tls_connect(&endpoint);
    snprintf(name, sizeof name, "%s:tls", key_base);
    printf("dlock-bench: dlock %s over TLS at %s\n", dlock_version(), bench_redacted(url));
    printf("  %ld latency samples each (unpinned)\n", iterations);
    for (long i = 0; i < iterations / 10; i++) { /* warm-up: scripts loaded */
        bench_tls_ping(raw);
        dlock_cycle(client[0], name, 0, NULL, NULL, NULL);
        dlock_cycle(client[1], name, 1, NULL, NULL, NULL);
    }
    for (int round = 0; round < 10; round++) {
        long n = iterations / 10;
        for (long i = 0; i < n; i++)
            bench_series_add(&ping, bench_tls_ping(raw));
        for (int a = 1; a >= 0; a--)
            for (long i = 0; i < n; i++)
                dlock_cycle(client[a], name, a, &cycle[a], &acq[a], &rel[a]);
    }
    print_header();
    double ping50 = bench_series_us(&ping, 50);
    print_row("raw PING (dlock's TLS transport)", ping50, bench_series_us(&ping, 99), NA, NULL, NA,
              0);
    snprintf(base, sizeof base, "2x PING p50 %.1f", 2 * ping50);
    for (int a = 1; a >= 0; a--) {
        char label[96];
        snprintf(label, sizeof label, "TLS cycle acquire+release, auto_renew=%d", a);
        print_row(label, bench_series_us(&cycle[a], 50), bench_series_us(&cycle[a], 99), NA, base,
                  bench_series_us(&cycle[a], 50) / (2 * ping50), 0);
    }
    bench_tls_close(raw);
    free(ping.v);
    for (int a = 0; a < 2; a++) {
        free(cycle[a].v);
        free(acq[a].v);
        free(rel[a].v);
        dlock_client_free(client[a]);
    }
    return 0;
}

int main(int argc, char **argv)
{
    parse_args(argc, argv);
    bench_signals_init();
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (etcd)
        return bench_etcd(url[0] ? url : NULL, iterations);
    if (redlock)
        return bench_redlock(url[0] ? url : NULL, iterations);
    if (sentinel)
        return bench_sentinel(url[0] ? url : NULL, iterations);
    if (cluster)
        return bench_cluster(url[0] ? url : NULL, iterations);
    if (async)
        return bench_async(url[0] ? url : NULL, iterations, waiters);
#ifdef DLOCK_BENCH_HAVE_ZK
    if (zk)
        return bench_zk(url[0] ? url : NULL, iterations);
#else
    if (zk) {
        fprintf(stderr, "dlock-bench: built without the ZooKeeper client (DLOCK_WITH_ZK)\n");
        return 69;
    }
#endif
#ifdef DLOCK_BENCH_HAVE_PG
    if (postgres)
        return bench_postgres(url[0] ? url : NULL, iterations);
#else
    if (postgres) {
        fprintf(stderr, "dlock-bench: built without libpq (apt-get install libpq-dev)\n");
        return 69;
    }
#endif
#ifdef DLOCK_BENCH_HAVE_MYSQL
    if (mysql)
        return bench_mysql(url[0] ? url : NULL, iterations);
#else
    if (mysql) {
        fprintf(stderr, "dlock-bench: built without libmariadb (apt-get install "
                        "libmariadb-dev)\n");
        return 69;
    }
#endif

    int own_server = url[0] == 0;
    if (own_server)
        bench_server_start(url, sizeof url);
    snprintf(key_base, sizeof key_base, "dlock-bench:%ld", (long)getpid());

    /* The library judges the URL first: its message is the one to see. */
    dlock_client *client[2] = {NULL, NULL};
    for (int a = 0; a < 2; a++) {
        int rc = dlock_client_open(&client[a], url, NULL);
        if (rc != DLOCK_OK)
            die_dlock("dlock_client_open", rc);
    }
    if (strncmp(url, "rediss://", 9) == 0)
        return run_tls(client);
    char err[256];
    if (bench_endpoint_parse(&endpoint, url, err, sizeof err) != 0)
        bench_die("%s", err);
    redisContext *raw = bench_raw_connect(&endpoint);

    int cpu0 = 0, cpu1 = 0;
    int ncpus = bench_cpus(&cpu0, &cpu1);
    int pinned = own_server && pin && ncpus >= 2;
    printf("dlock-bench: dlock %s, redis %s at %s%s\n", dlock_version(),
           bench_server_version(raw), url, own_server ? " (started by this run)" : "");
    printf("  %d CPUs; %ld latency samples each, %ld hand-offs, %.1f s per throughput run\n",
           ncpus, iterations, iterations / 10 < 10 ? 10 : iterations / 10, seconds);

    load_snap load0, load1;
    load_take(&load0);
    long early = 0;
    char title[160];
    if (pinned) {
        /* A wake-up across CPUs costs about what a LAN hop does on some
         * virtual machines, one on the same CPU almost nothing: measured
         * apart, each table compares like with like. */
        pid_t server = bench_server_pid();
        bench_pin(server, cpu0);
        bench_pin(0, cpu1);
        snprintf(title, sizeof title,
                 "[A] client and server on different CPUs (redis-server on CPU %d, "
                 "dlock-bench on CPU %d)",
                 cpu0, cpu1);
        early += run_section(title, raw, client, 1, 1);

        bench_pin(0, cpu0);
        snprintf(title, sizeof title,
                 "[B] client and server on one CPU (both on CPU %d): CPU cost shows, "
                 "round trips are cheap",
                 cpu0);
        early += run_section(title, raw, client, 0, 0);
        bench_pin(0, -1);
        bench_pin(server, -1);
    } else {
        snprintf(title, sizeof title, "client and server placed by the scheduler (not pinned)");
        early += run_section(title, raw, client, 1, 1);
        printf("\nnot pinned: where a wake-up on another CPU costs much more than one on the "
               "same CPU\n(virtual machines), each line may have run under a different "
               "placement and the\nratios mix the two; see docs/bench.md.\n");
    }

    load_take(&load1);
    printf("\nratios: cycle = p50 / (2 x PING p50); acquire, release, hand-offs = p50 / PING p50;"
           "\n        throughput = (PING/s / 2) / cycles/s, both with the same number of "
           "threads.\n");
    load_print(&load0, &load1);

    redisFree(raw);
    dlock_client_free(client[0]);
    dlock_client_free(client[1]);
    bench_server_stop();
    return early ? 1 : 0;
}
