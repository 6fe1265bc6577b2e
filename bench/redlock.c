/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock-bench --redlock: what a Redlock cycle and hand-off cost over 5
 * independent Redis masters, beside 5 raw PINGs sent in parallel (the floor
 * of any round over the nodes) and beside node-redlock (npm's redlock v5 on
 * ioredis) on the same servers in the same run.
 *
 * Without --url it starts 5 throwaway redis-servers on free loopback ports,
 * without persistence, in a mkdtemp folder, each with a random password (a
 * TCP port is open to every local user; node-redlock needs TCP), given in a
 * 0600 config file, not on the command line, and checked: a client without
 * it is refused. They die
 * with the bench (PR_SET_PDEATHSIG) and are stopped when it exits.
 *
 * node-redlock runs as `node bench/node_redlock.js` with NODE_PATH set to
 * DLOCK_BENCH_NODE_MODULES, or by default build/node-redlock/node_modules,
 * where `make bench-redlock` installs it. Without node or the modules the
 * bench says so and measures dlock alone.
 */
#include "bench.h"

#include <dlock/dlock.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NODES 5
#define TARGET_NODE_RATIO 0.6 /* issue 13: dlock's cycle <= 0.6 x node-redlock's */
#define LEASE_MS 10000
#define HOLD_MS 2 /* A holds this long once B is subscribed */

static char dir[256];
static pid_t server_pid[NODES];
static int nservers;

/* The 1, 5 and 15 minute load averages, to print beside the figures. */
static const char *load_average(char *buf, size_t size)
{
    FILE *f = fopen("/proc/loadavg", "r");
    double a = 0, b = 0, c = 0;

    if (f == NULL || fscanf(f, "%lf %lf %lf", &a, &b, &c) != 3)
        snprintf(buf, size, "unknown");
    else
        snprintf(buf, size, "%.2f %.2f %.2f", a, b, c);
    if (f != NULL)
        fclose(f);
    return buf;
}

/* ---- the throwaway servers ------------------------------------------------ */

/* In a child before exec: the bench blocks SIGTERM and friends in every
 * thread (bench_signals_init), and a blocked mask survives exec, so unblock
 * them, or the servers would ignore the SIGTERM that stops them. Die with
 * the bench. */
static void child_signals(void)
{
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_UNBLOCK, &all, NULL);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
}

static void stop_servers(void)
{
    bench_stop_children(server_pid, &nservers, dir);
}

static void start_servers(int port[NODES], const char *password)
{
    snprintf(dir, sizeof dir, "%s/dlock-bench-redlock-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(dir) == NULL)
        bench_die("mkdtemp: %s", strerror(errno));
    for (int i = 0; i < NODES; i++) {
        char p[16], logf[320], conf[320], text[64];
        port[i] = bench_free_port();
        snprintf(p, sizeof p, "%d", port[i]);
        snprintf(logf, sizeof logf, "%s/redis-%d.log", dir, i);
        /* The password in a 0600 file, not on the command line. */
        snprintf(conf, sizeof conf, "%s/redis-%d.conf", dir, i);
        snprintf(text, sizeof text, "requirepass %s\n", password);
        bench_write_conf(conf, text);
        pid_t pid = fork();
        if (pid < 0)
            bench_die("fork: %s", strerror(errno));
        if (pid == 0) {
            child_signals();
            execlp("redis-server", "redis-server", conf, "--port", p, "--bind", "127.0.0.1",
                   "--save", "", "--appendonly", "no", "--dir", dir, "--logfile", logf,
                   (char *)NULL);
            _exit(127);
        }
        server_pid[nservers++] = pid;
    }
    /* Wait until each answers (generous: a loaded machine starts slowly). */
    for (int i = 0; i < NODES; i++) {
        int up = 0;
        for (int k = 0; k < 1000 && !up; k++) {
            redisContext *c = redisConnect("127.0.0.1", port[i]);
            if (c && !c->err) {
                redisReply *r = redisCommand(c, "AUTH %s", password);
                up = r && r->type == REDIS_REPLY_STATUS;
                freeReplyObject(r);
            }
            redisFree(c);
            if (!up) {
                struct timespec ts = {0, 10 * 1000000L};
                nanosleep(&ts, NULL);
            }
        }
        if (!up)
            bench_die("redis-server on port %d did not start (see %s)", port[i], dir);
        bench_require_auth("127.0.0.1", port[i], "redis-server");
    }
}

/* ---- measurements ------------------------------------------------------------ */

/* PING to every node at once; the time until the last reply. */
static void parallel_ping(redisContext *c[NODES], bench_series *s)
{
    int64_t t0 = bench_now_ns();
    for (int i = 0; i < NODES; i++)
        if (redisAppendCommand(c[i], "PING") != REDIS_OK)
            bench_die("PING: %s", c[i]->errstr);
    /* Written to every node before any reply is read (redisGetReply would
     * write one, then wait for its reply, then write the next). */
    for (int i = 0; i < NODES; i++)
        for (int done = 0; !done;)
            if (redisBufferWrite(c[i], &done) != REDIS_OK)
                bench_die("PING: %s", c[i]->errstr);
    for (int i = 0; i < NODES; i++) {
        redisReply *r = NULL;
        if (redisGetReply(c[i], (void **)&r) != REDIS_OK || r->type != REDIS_REPLY_STATUS)
            bench_die("PING: %s", r ? "unexpected reply" : c[i]->errstr);
        freeReplyObject(r);
    }
    if (s)
        bench_series_add(s, bench_now_ns() - t0);
}

static void cycle(dlock_client *c, const char *name, int auto_renew, bench_series *s)
{
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;
    dlock_lock *l = NULL;
    o.wait_ms = 0;
    o.lease_ms = LEASE_MS;
    o.auto_renew = auto_renew;
    int64_t t0 = bench_now_ns();
    int rc = dlock_acquire(&l, c, name, &o);
    if (rc != DLOCK_OK)
        bench_die("dlock_acquire: %s (%s)", dlock_strerror(rc), dlock_error_message());
    if (dlock_lock_fence(l) == 0)
        bench_die("dlock_acquire gave a lock with fence 0");
    rc = dlock_release(l);
    if (rc != DLOCK_OK)
        bench_die("dlock_release: %s (%s)", dlock_strerror(rc), dlock_error_message());
    if (s)
        bench_series_add(s, bench_now_ns() - t0);
}

/* Throughput (bench_throughput, a second): threads cycling on one client
 * (each its own name), or doing parallel PINGs on raw connections of their
 * own. */
#define TP_THREADS 8

typedef struct {
    dlock_client *c;        /* cycles, or */
    redisContext *raw[NODES]; /* PING rounds */
    char name[64];
} tp_arg;

static void tp_op(void *p)
{
    tp_arg *a = p;

    if (a->c != NULL)
        cycle(a->c, a->name, 0, NULL);
    else
        parallel_ping(a->raw, NULL);
}

/* Operations a second over threads threads (t[k] set up by the caller). */
static double tp_run(tp_arg *t, int threads)
{
    void *args[TP_THREADS];

    for (int k = 0; k < threads; k++)
        args[k] = &t[k];
    return bench_throughput(threads, 1.0, tp_op, args);
}

/* Subscribers to the lock's release channel on node 0: B's watch is there. */
static long long subscribers(redisContext *c, const char *name)
{
    redisReply *r = redisCommand(c, "PUBSUB NUMSUB dlock:{%s}:release", name);
    long long n = 0;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[1]->type == REDIS_REPLY_INTEGER)
        n = r->element[1]->integer;
    freeReplyObject(r);
    return n;
}

/* A holds, B waits (subscribed), A releases at t0, B's acquire returns at t1;
 * B must not get the lock before t0, and its fence must be above A's. */
static void handoff(const char *url, redisContext *node0, const char *name, long count,
                    bench_series *s)
{
    dlock_client *ca = NULL, *cb = NULL;
    bench_waiter w;
    pthread_t tb;
    if (dlock_client_open(&ca, url, NULL) != DLOCK_OK ||
        dlock_client_open(&cb, url, NULL) != DLOCK_OK)
        bench_die("dlock_client_open: %s", dlock_error_message());
    memset(&w, 0, sizeof w);
    w.c = cb;
    w.name = name;
    w.count = count + 5;
    w.lease_ms = LEASE_MS;
    sem_init(&w.go, 0, 0);
    sem_init(&w.done, 0, 0);
    if (pthread_create(&tb, NULL, bench_waiter_main, &w) != 0)
        bench_die("pthread_create failed");
    for (long i = 0; i < count + 5; i++) {
        dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;
        dlock_lock *l = NULL;
        o.lease_ms = LEASE_MS;
        if (dlock_acquire(&l, ca, name, &o) != DLOCK_OK)
            bench_die("hand-off: A's dlock_acquire: %s", dlock_error_message());
        uint64_t fa = dlock_lock_fence(l);
        struct timespec ms = {0, 1000000L}, hold = {0, HOLD_MS * 1000000L};
        sem_post(&w.go);
        /* B subscribes on every node once and stays subscribed: wait for
         * that, then give its try time to find the lock busy and sleep. */
        for (int k = 0; k < 5000 && subscribers(node0, name) < 1; k++)
            nanosleep(&ms, NULL);
        nanosleep(&hold, NULL);
        int64_t t0 = bench_now_ns();
        if (dlock_release(l) != DLOCK_OK)
            bench_die("hand-off: A's dlock_release: %s", dlock_error_message());
        while (sem_wait(&w.done) != 0) {
        }
        if (w.end < t0)
            bench_die("hand-off: B got the lock before A released it");
        if (w.fence <= fa)
            bench_die("hand-off: B's fence %llu is not above A's %llu",
                      (unsigned long long)w.fence, (unsigned long long)fa);
        if (i >= 5)
            bench_series_add(s, w.end - t0);
    }
    pthread_join(tb, NULL);
    dlock_client_free(ca);
    dlock_client_free(cb);
}

/* ---- node-redlock --------------------------------------------------------------- */

/* node_redlock.js in serve mode: its pid, the pipe to its stdin and the one
 * from its stdout, and what it wrote that is not read yet. */
typedef struct {
    pid_t pid;
    int in, out;
    char buf[1 << 16];
    size_t len;
} node_proc;

/* One line from node (without its newline) into line, waiting up to 120 s
 * for it (a loaded machine; node is never that slow when it works). */
static int node_line(node_proc *np, char *line, size_t size, char *why, size_t why_size)
{
    for (;;) {
        char *nl = memchr(np->buf, '\n', np->len);
        if (nl != NULL) {
            size_t n = (size_t)(nl - np->buf);
            snprintf(line, size, "%.*s", (int)n, np->buf);
            memmove(np->buf, nl + 1, np->len - n - 1);
            np->len -= n + 1;
            return 0;
        }
        struct pollfd pfd = {np->out, POLLIN, 0};
        int r = poll(&pfd, 1, 120000);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0 || np->len == sizeof np->buf) {
            snprintf(why, why_size, "node %s: no answer in 120 s", DLOCK_BENCH_NODE_SCRIPT);
            return -1;
        }
        ssize_t got = read(np->out, np->buf + np->len, sizeof np->buf - np->len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            snprintf(why, why_size, "node %s exited (see its stderr above)",
                     DLOCK_BENCH_NODE_SCRIPT);
            return -1;
        }
        np->len += (size_t)got;
    }
}

/* Start node_redlock.js serve on the servers, warmed up; -1 with why. */
static int node_start(node_proc *np, const char *hosts, const char *password, char *why,
                      size_t why_size)
{
    const char *modules = getenv("DLOCK_BENCH_NODE_MODULES");
    if (modules == NULL)
        modules = DLOCK_BENCH_NODE_MODULES_DEFAULT;
    char probe[1200], line[64];
    snprintf(probe, sizeof probe, "%s/redlock/package.json", modules);
    struct stat st;
    memset(np, 0, sizeof *np);
    np->pid = -1;
    if (stat(probe, &st) != 0) {
        snprintf(why, why_size, "no %s (make bench-redlock installs it with npm)", probe);
        return -1;
    }
    int to[2], from[2];
    if (pipe(to) != 0 || pipe(from) != 0)
        bench_die("pipe: %s", strerror(errno));
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        bench_die("fork: %s", strerror(errno));
    if (pid == 0) {
        dup2(to[0], 0);
        dup2(from[1], 1);
        close(to[0]);
        close(to[1]);
        close(from[0]);
        close(from[1]);
        child_signals();
        setenv("NODE_PATH", modules, 1);
        if (password[0])
            setenv("DLOCK_BENCH_REDIS_PASSWORD", password, 1);
        execlp("node", "node", DLOCK_BENCH_NODE_SCRIPT, "serve", hosts, (char *)NULL);
        _exit(127);
    }
    close(to[0]);
    close(from[1]);
    np->pid = pid;
    np->in = to[1];
    np->out = from[0];
    if (node_line(np, line, sizeof line, why, why_size) != 0 || strcmp(line, "ready") != 0) {
        if (why[0] == 0)
            snprintf(why, why_size, "node %s: unexpected '%.32s'", DLOCK_BENCH_NODE_SCRIPT,
                     line);
        return -1;
    }
    return 0;
}

/* n node-redlock cycles, their times added to s; -1 with why. */
static int node_chunk(node_proc *np, long n, bench_series *s, char *why, size_t why_size)
{
    static char line[1 << 16];
    char cmd[32];
    int len = snprintf(cmd, sizeof cmd, "%ld\n", n);
    long got = 0;

    if (write(np->in, cmd, (size_t)len) != len) {
        snprintf(why, why_size, "node %s: cannot write to it", DLOCK_BENCH_NODE_SCRIPT);
        return -1;
    }
    if (node_line(np, line, sizeof line, why, why_size) != 0)
        return -1;
    for (char *p = line, *end; *p; p = end) {
        double us = strtod(p, &end);
        if (end == p)
            break;
        bench_series_add(s, (int64_t)(us * 1000));
        got++;
    }
    if (got != n) {
        snprintf(why, why_size, "node %s: %ld samples for %ld cycles", DLOCK_BENCH_NODE_SCRIPT,
                 got, n);
        return -1;
    }
    return 0;
}

static void node_stop(node_proc *np)
{
    int status;

    if (np->pid <= 0)
        return;
    close(np->in);
    close(np->out);
    waitpid(np->pid, &status, 0);
    np->pid = -1;
}

/* Split redlock://[user:password@]h1:p1,...[/db][?...] into the host list
 * and the password. */
static void split_url(const char *url, char *hosts, size_t hosts_size, char *password,
                      size_t password_size)
{
    const char *p = url + strlen("redlock://");
    const char *at = strchr(p, '@');
    password[0] = 0;
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (colon)
            snprintf(password, password_size, "%.*s", (int)(at - colon - 1), colon + 1);
        p = at + 1;
    }
    snprintf(hosts, hosts_size, "%.*s", (int)strcspn(p, "/?"), p);
}

/* ---- the section ------------------------------------------------------------------ */

/* A raw connection to each node of hosts ("h:p,h:p,..."), authenticated. */
static void raw_connect(const char *hosts, const char *password, redisContext *raw[NODES])
{
    int nraw = 0;

    for (const char *h = hosts; *h && nraw < NODES;) {
        size_t hl = strcspn(h, ",");
        char host[256];
        snprintf(host, sizeof host, "%.*s", (int)hl, h);
        char *colon = strrchr(host, ':');
        if (colon == NULL)
            bench_die("--url: %s has no port", host);
        *colon = 0;
        raw[nraw] = redisConnect(host, atoi(colon + 1));
        if (raw[nraw] == NULL || raw[nraw]->err)
            bench_die("connect %s: %s", host, raw[nraw] ? raw[nraw]->errstr : "out of memory");
        if (password[0])
            bench_raw_expect(raw[nraw], REDIS_REPLY_STATUS, "OK", "AUTH %s", password);
        nraw++;
        h += hl + (h[hl] == ',');
    }
    if (nraw != NODES)
        bench_die("--redlock measures %d nodes; the URL has %d", NODES, nraw);
}

int bench_redlock(const char *given_url, long iterations)
{
    char url[2048], hosts[1024], password[256], loadavg[64];
    int port[NODES];
    long n = iterations / 2 < 200 ? 200 : iterations / 2;
    long handoffs = n / 10 < 20 ? 20 : n / 10;

    if (given_url) {
        if (strncmp(given_url, "redlock://", 10) != 0)
            bench_die("--redlock --url wants a redlock:// URL");
        snprintf(url, sizeof url, "%s", given_url);
    } else {
        char pw[33];
        bench_random_password(pw);
        start_servers(port, pw);
        int len = snprintf(url, sizeof url, "redlock://:%s@", pw);
        for (int i = 0; i < NODES; i++)
            len += snprintf(url + len, sizeof url - (size_t)len, "%s127.0.0.1:%d", i ? "," : "",
                            port[i]);
    }
    atexit(stop_servers);
    split_url(url, hosts, sizeof hosts, password, sizeof password);

    /* client[2]: the fan-outs on poll(2) (io=poll), beside the default
     * (io_uring where the kernel allows it). */
    dlock_client *client[3] = {NULL, NULL, NULL};
    char poll_url[2100];
    snprintf(poll_url, sizeof poll_url, "%s%cio=poll", url, strchr(url, '?') ? '&' : '?');
    for (int a = 0; a < 3; a++)
        if (dlock_client_open(&client[a], a < 2 ? url : poll_url, NULL) != DLOCK_OK)
            bench_die("dlock_client_open: %s", dlock_error_message());
    redisContext *raw[NODES];
    raw_connect(hosts, password, raw);

    char name[3][64], hname[64];
    for (int a = 0; a < 3; a++)
        snprintf(name[a], sizeof name[a], "dlock-bench:%ld:redlock%d", (long)getpid(), a);
    snprintf(hname, sizeof hname, "dlock-bench:%ld:redlock-handoff", (long)getpid());

    printf("dlock-bench --redlock: dlock %s, %d redis-servers %s (%s)\n", dlock_version(), NODES,
           bench_redacted(url), given_url ? "given" : "started by this run, loopback TCP");
    printf("  %ld cycles each, %ld hand-offs, lease %d ms; not pinned; load average %s\n", n,
           handoffs, LEASE_MS, load_average(loadavg, sizeof loadavg));

    bench_series ping = {0}, cyc[3] = {{0}, {0}, {0}}, hand = {0};
    for (long i = 0; i < n / 10 + 50; i++) { /* warm-up */
        parallel_ping(raw, NULL);
        cycle(client[1], name[1], 1, NULL);
        cycle(client[0], name[0], 0, NULL);
        cycle(client[2], name[2], 0, NULL);
    }
    /* node-redlock runs in the same 10 rounds, a chunk of its cycles after
     * dlock's in each (node idle meanwhile), so that a slow spell of the
     * machine is as likely to hit either; both percentiles are computed
     * here, the same way. */
    bench_series nodes = {0};
    node_proc np;
    char why[1400] = "";
    int node_ok = node_start(&np, hosts, password, why, sizeof why);
    for (int round = 0; round < 10; round++) {
        long per = n / 10 + (round < n % 10);
        for (long i = 0; i < per; i++)
            parallel_ping(raw, &ping);
        for (long i = 0; i < per; i++)
            cycle(client[0], name[0], 0, &cyc[0]);
        for (long i = 0; i < per; i++)
            cycle(client[1], name[1], 1, &cyc[1]);
        for (long i = 0; i < per; i++)
            cycle(client[2], name[2], 0, &cyc[2]);
        if (node_ok == 0)
            node_ok = node_chunk(&np, per, &nodes, why, sizeof why);
    }
    node_stop(&np);
    double node50 = node_ok == 0 ? bench_series_us(&nodes, 50) : 0;
    double node99 = node_ok == 0 ? bench_series_us(&nodes, 99) : 0;
    handoff(url, raw[0], hname, handoffs, &hand);

    /* Throughput: 1 and 8 threads on one client, 8 threads of parallel
     * PINGs on connections of their own as the floor. */
    tp_arg tp[TP_THREADS];
    double tp_one, tp_eight, tp_ping;
    memset(tp, 0, sizeof tp);
    for (int k = 0; k < TP_THREADS; k++) {
        tp[k].c = client[0];
        snprintf(tp[k].name, sizeof tp[k].name, "dlock-bench:%ld:redlock-tp%d", (long)getpid(), k);
    }
    tp_one = tp_run(tp, 1);
    tp_eight = tp_run(tp, TP_THREADS);
    for (int k = 0; k < TP_THREADS; k++) {
        tp[k].c = NULL;
        raw_connect(hosts, password, tp[k].raw);
    }
    tp_ping = tp_run(tp, TP_THREADS);
    for (int k = 0; k < TP_THREADS; k++)
        for (int i = 0; i < NODES; i++)
            redisFree(tp[k].raw[i]);

    double p50 = bench_series_us(&ping, 50);
    char base[64];
    printf("\n");
    snprintf(base, sizeof base, "%d PINGs in parallel", NODES);
    bench_print_row(base, p50, bench_series_us(&ping, 99), -1, NULL, 1.0, 0);
    snprintf(base, sizeof base, "parallel PING %.1f", p50);
    for (int a = 0; a < 2; a++) {
        char label[64];
        snprintf(label, sizeof label, "dlock cycle, auto_renew=%d", a);
        bench_print_row(label, bench_series_us(&cyc[a], 50), bench_series_us(&cyc[a], 99), -1, base, bench_series_us(&cyc[a], 50) / p50,
                        0);
    }
    bench_print_row("dlock cycle, auto_renew=0, io=poll", bench_series_us(&cyc[2], 50),
                    bench_series_us(&cyc[2], 99), -1, base, bench_series_us(&cyc[2], 50) / p50, 0);
    bench_print_row("dlock hand-off release -> waiter", bench_series_us(&hand, 50), bench_series_us(&hand, 99), -1, base,
                    bench_series_us(&hand, 50) / p50, 0);
    {
        char tb[64];
        snprintf(tb, sizeof tb, "PING rounds/2 %.0f/s", tp_ping / 2);
        bench_print_row("throughput cycle, 1 thread", -1, -1, tp_one, NULL, -1, 0);
        bench_print_row("throughput cycle, 8 threads, 1 client", -1, -1, tp_eight, tb,
                        tp_eight / (tp_ping / 2), 0);
        snprintf(tb, sizeof tb, "1 thread %.0f/s", tp_one);
        bench_print_row("  the same, against 1 thread", -1, -1, -1, tb, tp_eight / tp_one, 0);
    }
    if (node_ok == 0) {
        char nb[64];
        bench_print_row("node-redlock cycle (redlock v5, ioredis)", node50, node99, -1, base,
                        node50 / p50, 0);
        snprintf(nb, sizeof nb, "node-redlock %.1f", node50);
        bench_print_row("dlock cycle (auto_renew=0) vs node-redlock", -1, -1, -1, nb,
                        bench_series_us(&cyc[0], 50) / node50, TARGET_NODE_RATIO);
        bench_print_row("dlock cycle (auto_renew=1) vs node-redlock", -1, -1, -1, nb,
                        bench_series_us(&cyc[1], 50) / node50, TARGET_NODE_RATIO);
    } else {
        printf("node-redlock: not measured: %s\n", why);
    }
    printf("\nratios: p50 / the parallel PING's p50; the last lines dlock's cycle p50 / "
           "node-redlock's.\n  a dlock cycle is 2 rounds over the nodes when their fence marks "
           "agree (round 1, release;\n  round 2 only when they differ), each returning once a "
           "quorum answered; node-redlock's\n  is 2 (acquire, release), waiting for every node, "
           "with no fence.\n  load average at the end: %s\n",
           load_average(loadavg, sizeof loadavg));

    for (int i = 0; i < NODES; i++)
        redisFree(raw[i]);
    for (int a = 0; a < 3; a++) {
        dlock_client_free(client[a]);
        free(cyc[a].v);
    }
    free(ping.v);
    free(hand.v);
    free(nodes.v);
    return 0;
}
