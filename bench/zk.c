/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock-bench --zk: what a dlock cycle costs on ZooKeeper, beside Curator's
 * InterProcessMutex (bench/CuratorCycle.java on Debian's Curator jars, the
 * peer issue 28 names) and beside the raw calls of the ZooKeeper C client
 * dlock is built on, all on the same server, in the same rounds:
 *
 *   raw exists        one round trip (zoo_exists of "/")
 *   raw recipe        Curator's cycle by hand: create an ephemeral
 *                     sequential node, list the directory, delete the node,
 *                     each after the last one's reply (3 round trips)
 *   dlock try-once    dlock_acquire (wait 0) + dlock_release
 *   dlock waiting     the same with wait 5 s (it queues at once)
 *   Curator           InterProcessMutex acquire() + release()
 *
 * Issue 28's target: the dlock cycle <= 0.8 x Curator's. Without --url it
 * starts a throwaway standalone ZooKeeper (Debian's zookeeper package, on
 * java) on a free loopback port, its data in a mkdtemp directory removed at
 * the end.
 */
#include "bench.h"

#include <dlock/dlock.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define THREADED 1 /* the synchronous calls of the multithreaded client */
#include <zookeeper/zookeeper.h>

#define ZK_JARS "/usr/share/java"
/* What Curator needs at run time (tests/interop/curator/interop.sh). */
#define CURATOR_CP                                                                                 \
    ZK_JARS "/curator-recipes.jar:" ZK_JARS "/curator-framework.jar:" ZK_JARS                      \
            "/curator-client.jar:" ZK_JARS "/zookeeper.jar:" ZK_JARS "/zookeeper-jute.jar:" ZK_JARS \
            "/guava.jar:" ZK_JARS "/slf4j-api.jar:" ZK_JARS "/slf4j-nop.jar"

static char work[64];   /* the throwaway server's directory and the peer's classes */
static pid_t zk_pid;

/* ---- the throwaway ZooKeeper ----------------------------------------------- */

static void zk_stop(void)
{
    pid_t pids[1] = {zk_pid};
    int n = zk_pid > 0;

    bench_stop_children(pids, &n, work);
    zk_pid = 0;
}

static void zk_start(char *hostport, size_t size)
{
    char cfg[128], conf[512], log[128], cp[256];
    int port = bench_free_port();

    snprintf(cfg, sizeof cfg, "%s/zoo.cfg", work);
    snprintf(conf, sizeof conf,
             "tickTime=2000\ndataDir=%s/data\nclientPort=%d\nclientPortAddress=127.0.0.1\n"
             "maxClientCnxns=0\nadmin.enableServer=false\n4lw.commands.whitelist=*\n",
             work, port);
    bench_write_conf(cfg, conf);
    snprintf(log, sizeof log, "%s/zk.log", work);
    snprintf(cp, sizeof cp, "%s:" ZK_JARS "/zookeeper.jar:" ZK_JARS "/*", work);
    zk_pid = fork();
    if (zk_pid < 0)
        bench_die("fork: %s", strerror(errno));
    if (zk_pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0)
            _exit(127);
        dup2(fd, 1);
        dup2(fd, 2);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execlp("java", "java", "-cp", cp, "org.apache.zookeeper.server.ZooKeeperServerMain", cfg,
               (char *)NULL);
        _exit(127);
    }
    snprintf(hostport, size, "127.0.0.1:%d", port);
}

/* ---- the raw client ---------------------------------------------------------- */

static void quiet_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    (void)zh, (void)type, (void)state, (void)path, (void)ctx;
}

/* A connected raw handle, waiting up to 60 s (a JVM starting). */
static zhandle_t *raw_open(const char *hostport)
{
    /* Quiet while the server starts (each refused connection is an
     * error line), its errors after. */
    zoo_set_debug_level((ZooLogLevel)0);
    for (int i = 0; i < 600; i++) {
        zhandle_t *zh = zookeeper_init(hostport, quiet_watcher, 10000, NULL, NULL, 0);
        for (int j = 0; zh != NULL && j < 20; j++) {
            struct Stat st;
            if (zoo_state(zh) == ZOO_CONNECTED_STATE && zoo_exists(zh, "/", 0, &st) == ZOK) {
                zoo_set_debug_level(ZOO_LOG_LEVEL_ERROR);
                return zh;
            }
            usleep(50000);
        }
        if (zh != NULL)
            zookeeper_close(zh);
        if (zk_pid > 0 && waitpid(zk_pid, NULL, WNOHANG) == zk_pid) {
            zk_pid = 0;
            bench_die("the throwaway ZooKeeper exited (its log: %s/zk.log; apt-get install "
                      "zookeeper default-jre-headless)", work);
        }
    }
    bench_die("ZooKeeper at %s: not connected within 60 s", hostport);
}

static void raw_exists(zhandle_t *zh, bench_series *s)
{
    struct Stat st;
    int64_t t0 = bench_now_ns();

    if (zoo_exists(zh, "/", 0, &st) != ZOK)
        bench_die("raw exists failed");
    if (s != NULL)
        bench_series_add(s, bench_now_ns() - t0);
}

/* Curator's three calls, one after another. */
static void raw_recipe(zhandle_t *zh, bench_series *s)
{
    char node[256];
    struct String_vector kids = {0, NULL};
    int64_t t0 = bench_now_ns();

    if (zoo_create(zh, "/dlock-bench/raw/_c_x-lock-", "", 0, &ZOO_OPEN_ACL_UNSAFE,
                   ZOO_EPHEMERAL_SEQUENTIAL, node, sizeof node) != ZOK ||
        zoo_get_children(zh, "/dlock-bench/raw", 0, &kids) != ZOK ||
        zoo_delete(zh, node, -1) != ZOK)
        bench_die("raw create, list, delete failed");
    bench_series_add(s, bench_now_ns() - t0);
    deallocate_String_vector(&kids);
}

/* ---- Curator ------------------------------------------------------------------- */

/* Compile CuratorCycle.java into work and start it (bench/peer.c): ready,
 * or stopped with why. */
static void peer_start(bench_peer *p, const char *hostport)
{
    char cmd[1024], classes[96], cp[512];

    snprintf(classes, sizeof classes, "%s/classes", work);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && javac -nowarn -d '%s' -cp '" CURATOR_CP
             "' '" DLOCK_BENCH_CURATOR_SOURCE "' 2>'%s/javac.log'",
             classes, classes, work);
    if (system(cmd) != 0) {
        memset(p, 0, sizeof *p);
        snprintf(p->why, sizeof p->why, "javac CuratorCycle.java failed (%s/javac.log; "
                 "apt-get install default-jdk-headless libcurator-recipes-java)", work);
        return;
    }
    snprintf(cp, sizeof cp, "%s:" CURATOR_CP, classes);
    {
        char *argv[] = {"java", "-cp", cp, "CuratorCycle", (char *)hostport, NULL};
        bench_peer_start(p, argv, NULL, "CuratorCycle ended early (is java installed?)");
    }
}

/* ---- the table ----------------------------------------------------------------- */

static void cycle_waiting(dlock_client *c, const char *name, bench_series *s)
{
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;
    dlock_lock *l = NULL;
    int64_t t0;
    int rc;

    o.wait_ms = 5000;
    o.lease_ms = 10000;
    o.auto_renew = 0;
    t0 = bench_now_ns();
    if ((rc = dlock_acquire(&l, c, name, &o)) != DLOCK_OK)
        bench_die("dlock_acquire: %s (%s)", dlock_strerror(rc), dlock_error_message());
    if ((rc = dlock_release(l)) != DLOCK_OK)
        bench_die("dlock_release: %s (%s)", dlock_strerror(rc), dlock_error_message());
    if (s != NULL)
        bench_series_add(s, bench_now_ns() - t0);
}

static void row(const char *what, bench_series *s, double base, const char *base_name)
{
    double p50 = bench_series_us(s, 50), p99 = bench_series_us(s, 99);

    if (base > 0)
        printf("%-28s %9.1f %9.1f   %5.2f x %s\n", what, p50, p99, p50 / base, base_name);
    else
        printf("%-28s %9.1f %9.1f\n", what, p50, p99);
}

int bench_zk(const char *url, long iterations)
{
    enum { ROUNDS = 10 };
    char hostport[256], dlock_url[300];
    bench_series ex = {0}, rec = {0}, once = {0}, wait = {0};
    long per = iterations / ROUNDS > 0 ? iterations / ROUNDS : 1;
    dlock_client *c = NULL;
    double cur[2] = {0, 0}, ex50, rec50, once50, wait50;
    zhandle_t *zh;
    bench_peer curator;
    int rc;

    snprintf(work, sizeof work, "/tmp/dlock-bench-zk.XXXXXX");
    if (mkdtemp(work) == NULL)
        bench_die("mkdtemp: %s", strerror(errno));
    if (url == NULL) {
        zk_start(hostport, sizeof hostport);
    } else if (sscanf(url, "zk://%255[^/?]", hostport) != 1) {
        bench_die("--zk --url: zk://HOST:PORT, not %s", url);
    }
    snprintf(dlock_url, sizeof dlock_url, "zk://%s", hostport);
    zh = raw_open(hostport);
    if (zoo_create(zh, "/dlock-bench", "", 0, &ZOO_OPEN_ACL_UNSAFE, 0, NULL, 0) != ZOK ||
        zoo_create(zh, "/dlock-bench/raw", "", 0, &ZOO_OPEN_ACL_UNSAFE, 0, NULL, 0) != ZOK) {
        /* There from an earlier run on the same server: fine. */
    }
    if ((rc = dlock_client_open(&c, dlock_url, NULL)) != DLOCK_OK)
        bench_die("dlock_client_open %s: %s (%s)", dlock_url, dlock_strerror(rc),
                  dlock_error_message());
    peer_start(&curator, hostport);

    printf("== ZooKeeper %s: %ld cycles of each, in %d rounds (docs/bench.md)\n", hostport,
           per * ROUNDS, ROUNDS);
    for (long i = 0; i < per; i++) { /* warm-up */
        raw_exists(zh, NULL);
        bench_cycle(c, "dlock-bench-zk-once", NULL);
        cycle_waiting(c, "dlock-bench-zk-wait", NULL);
    }
    for (int r = 0; r < ROUNDS; r++) {
        for (long i = 0; i < per; i++)
            raw_exists(zh, &ex);
        for (long i = 0; i < per; i++)
            raw_recipe(zh, &rec);
        for (long i = 0; i < per; i++)
            bench_cycle(c, "dlock-bench-zk-once", &once);
        for (long i = 0; i < per; i++)
            cycle_waiting(c, "dlock-bench-zk-wait", &wait);
        bench_peer_cmd(&curator, "cycles", per);
    }
    ex50 = bench_series_us(&ex, 50);
    rec50 = bench_series_us(&rec, 50);
    once50 = bench_series_us(&once, 50);
    wait50 = bench_series_us(&wait, 50);
    printf("%-28s %9s %9s\n", "", "p50 us", "p99 us");
    row("raw exists (1 round trip)", &ex, 0, NULL);
    row("raw create, list, delete", &rec, ex50, "exists");
    row("dlock cycle, try-once", &once, ex50, "exists");
    row("dlock cycle, waiting", &wait, ex50, "exists");
    if (bench_peer_report(&curator, cur, 2)) {
        printf("%-28s %9.1f %9.1f   %5.2f x exists\n", "Curator InterProcessMutex", cur[0], cur[1],
               cur[0] / ex50);
        printf("\ndlock / Curator (p50): try-once %.2fx, waiting %.2fx (target <= 0.80: %s)\n",
               once50 / cur[0], wait50 / cur[0],
               once50 / cur[0] <= 0.8 && wait50 / cur[0] <= 0.8 ? "met" : "not met");
    } else {
        printf("\nCurator: not measured: %s\n", curator.why);
    }
    printf("dlock / the raw recipe (p50): try-once %.2fx, waiting %.2fx\n", once50 / rec50,
           wait50 / rec50);
    dlock_client_free(c);
    zookeeper_close(zh);
    zk_stop();
    free(ex.v);
    free(rec.v);
    free(once.v);
    free(wait.v);
    return 0;
}
