/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What only the Redlock backend has, on 5 real redis-servers: a minority of
 * nodes down changes nothing, a majority down is a clear error that leaves
 * nothing held; a node that restarts empty is set again by the renewal; a
 * holder paused past its validity loses the lock to one with a greater
 * fence; fences increase across many holders while nodes die and come back
 * (with appendfsync always); a release reaches the node that answered the
 * acquire too late (delayed by the chaos proxy). The conformance suite runs
 * on 3 nodes as core-redlock.*.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "chaos_proxy.h"
#include "test.h"

#define NODES 5

/* test_redlock_poll is this file built with TEST_REDLOCK_IO "poll": every
 * case then runs with io=poll; test_redlock runs them with the default
 * (io_uring where the kernel allows it). */
#ifndef TEST_REDLOCK_IO
#define TEST_REDLOCK_IO ""
#endif

/* url with io=TEST_REDLOCK_IO added, in buf. */
static const char *with_io(const char *url, char *buf, size_t size)
{
    if (TEST_REDLOCK_IO[0] == '\0')
        return url;
    snprintf(buf, size, "%s%cio=%s", url, strchr(url, '?') != NULL ? '&' : '?',
             TEST_REDLOCK_IO);
    return buf;
}

typedef struct {
    test_redis r[NODES];
    char url[256];
} cluster;

static void start(cluster *cl, const char *extra)
{
    test_redis_start_many(cl->r, NODES, extra, cl->url, sizeof(cl->url));
}

static void stop(cluster *cl)
{
    for (int i = 0; i < NODES; i++)
        test_redis_stop(&cl->r[i]);
}

static dlock_client *open_with(const char *url, int64_t command_timeout_ms)
{
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_client *c = NULL;
    char buf[400];

    co.command_timeout_ms = command_timeout_ms;
    CHECK_RC(dlock_client_open(&c, with_io(url, buf, sizeof(buf)), &co), DLOCK_OK);
    return c;
}

static dlock_client *open_url(const char *url)
{
    return open_with(url, 2000);
}

/* Nodes that are up and hold name's key now. */
static int holders(cluster *cl, const char *name)
{
    int n = 0;

    for (int i = 0; i < NODES; i++)
        n += cl->r[i].pid > 0 && test_redis_cmd(&cl->r[i], "EXISTS dlock:{%s}", name) == 1;
    return n;
}

/* Wait (a generous bound) until want nodes hold name's key; how many do.
 * Acquire and release return once a quorum answered: the other nodes run
 * the request when it reaches them. */
static int wait_holders(cluster *cl, const char *name, int want)
{
    int i, n;

    for (i = 0; i < 1000 && (n = holders(cl, name)) != want; i++)
        test_sleep_ms(10);
    return n;
}

/* A malformed redlock URL is refused before any I/O. */
static void url_checked(void)
{
    dlock_client *c = NULL;

    CHECK_RC(dlock_client_open(&c, "redlock://127.0.0.1:1,127.0.0.1:2", NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "odd number of nodes");
    CHECK_RC(dlock_client_open(&c, "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3,127.0.0.1:4",
                               NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_client_open(&c, "redlock://a:1,b:2,c:3?drift=1", NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "unknown parameter 'drift'");
    CHECK_RC(dlock_client_open(&c, "redlock://a:1,b:2,c:3?drift_ms=x", NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_client_open(&c, "redlock://a:1,b:2,c:3?io=epoll", NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "io must be auto, poll or io_uring, got 'epoll'");
    CHECK_RC(dlock_client_open(&c, "redlock://a:1,b:2,c:3?strict=yes", NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "strict must be 0 or 1, got 'yes'");
    CHECK_RC(dlock_client_open(&c, "redlock://a:1,b:2,c:3?io=io_uring&tls=1", NULL),
             DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "io=io_uring is for clear text");
    CHECK(c == NULL);
}

/* The process's io_uring instances (/proc/self/fd), and the requests
 * submitted to them so far (their SqTail in /proc/self/fdinfo). */
static int rings(unsigned long long *submitted)
{
    int n = 0;

    *submitted = 0;
    for (int fd = 0; fd < 1024; fd++) {
        char path[64], target[64], line[128];
        FILE *f;
        if (!test_fd_target(fd, target, sizeof(target)) ||
            strcmp(target, "anon_inode:[io_uring]") != 0)
            continue;
        n++;
        snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
        CHECK((f = fopen(path, "r")) != NULL);
        while (fgets(line, sizeof(line), f) != NULL)
            if (strncmp(line, "SqTail:", 7) == 0)
                *submitted += strtoull(line + 7, NULL, 10);
        fclose(f);
    }
    return n;
}

/* How the fan-outs wait: io_uring by default, two rings a client (the
 * callers' and the watchdog's) through which every node's request goes;
 * with io=poll (test_redlock_poll) none. The same cycles either way. */
static void fanouts_use_the_ring(void)
{
    cluster cl;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 5000, 0);
    unsigned long long before, after;
    int n0 = rings(&before), poll_only = strcmp(TEST_REDLOCK_IO, "poll") == 0;

    start(&cl, NULL);
    c = open_url(cl.url);
    CHECK(rings(&before) == n0 + (poll_only ? 0 : 2));
    for (int i = 0; i < 10; i++) {
        CHECK_RC(dlock_acquire(&l, c, "ring", &o), DLOCK_OK);
        CHECK(dlock_lock_fence(l) == (uint64_t)i + 1);
        CHECK_RC(dlock_release(l), DLOCK_OK);
    }
    CHECK(rings(&after) == n0 + (poll_only ? 0 : 2));
    /* A send to each of the 5 nodes in each of the 2 rounds of a cycle, and
     * a receive from each node that answered. */
    if (!poll_only)
        CHECK(after - before >= 10 * 2 * NODES);
    dlock_client_free(c);
    CHECK(rings(&after) == n0);
    stop(&cl);
}

/* Two of five nodes down: acquire, renewals and release work on the other
 * three. A lease of 1.5 s gives each node 150 ms to answer (a tenth of it):
 * with 600 ms, 60 ms was too short for a first request on a loaded machine. */
static void two_killed_still_works(void)
{
    cluster cl;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 1500, 1);

    start(&cl, NULL);
    c = open_url(cl.url);
    test_redis_kill(&cl.r[1]);
    test_redis_kill(&cl.r[3]);
    CHECK_RC(dlock_acquire(&l, c, "two", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(l) > 0);
    CHECK(wait_holders(&cl, "two", 3) == 3);
    /* Several renewal periods: the watchdog keeps it on the three. */
    test_sleep_ms(2000);
    CHECK(!dlock_lock_lost(l));
    CHECK_RC(dlock_lock_check(l), DLOCK_OK);
    CHECK(wait_holders(&cl, "two", 3) == 3);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(wait_holders(&cl, "two", 0) == 0);
    dlock_client_free(c);
    stop(&cl);
}

/* Three of five down: no quorum. The acquire fails with a message that
 * says so and names the nodes, and leaves nothing on the two alive. */
static void three_killed_clear_error(void)
{
    cluster cl;
    dlock_client *c;
    dlock_lock *l = (dlock_lock *)1, *held;
    dlock_acquire_options o = test_opts(0, 5000, 1);

    start(&cl, NULL);
    c = open_url(cl.url);
    CHECK_RC(dlock_acquire(&held, c, "kept", &o), DLOCK_OK);
    for (int i = 0; i < 3; i++)
        test_redis_kill(&cl.r[i]);
    CHECK_RC(dlock_acquire(&l, c, "three", &o), DLOCK_ECONN);
    CHECK(l == NULL);
    CHECK_CONTAINS(dlock_error_message(), "redlock: acquiring: 2 of 5 nodes (quorum 3)");
    CHECK_CONTAINS(dlock_error_message(), "connection refused");
    CHECK(wait_holders(&cl, "three", 0) == 0);
    /* A held lock cannot be released on a quorum either: an error, not
     * "released"; the two alive nodes give it up all the same. */
    CHECK_RC(dlock_release(held), DLOCK_ECONN);
    CHECK_CONTAINS(dlock_error_message(), "redlock: releasing: 2 of 5 nodes (quorum 3)");
    CHECK(wait_holders(&cl, "kept", 0) == 0);
    /* A client opened now is refused: fewer than a quorum reachable. */
    dlock_client *late = NULL;
    char buf[400];
    CHECK_RC(dlock_client_open(&late, with_io(cl.url, buf, sizeof(buf)), NULL), DLOCK_ECONN);
    CHECK_CONTAINS(dlock_error_message(), "only 2 of 5 nodes reachable (quorum 3)");
    dlock_client_free(c);
    stop(&cl);
}

/* Another token holds a majority: a try is busy, with the holder's time
 * left, and the keys it took on the other nodes are given back. */
static void busy_gives_back_the_minority(void)
{
    cluster cl;
    dlock_client *c;
    dlock_lock *l = (dlock_lock *)1;
    dlock_acquire_options o = test_opts(0, 5000, 0);

    start(&cl, NULL);
    c = open_url(cl.url);
    for (int i = 0; i < 3; i++)
        CHECK(test_redis_cmd(&cl.r[i], "SET dlock:{minor} someone-else PX 20000") == 2);
    CHECK_RC(dlock_acquire(&l, c, "minor", &o), DLOCK_EBUSY);
    CHECK(l == NULL);
    CHECK(test_redis_cmd(&cl.r[3], "EXISTS dlock:{minor}") == 0);
    CHECK(test_redis_cmd(&cl.r[4], "EXISTS dlock:{minor}") == 0);
    CHECK(wait_holders(&cl, "minor", 3) == 3);
    dlock_client_free(c);
    stop(&cl);
}

/* A node restarted empty while the lock is held (no persistence): the next
 * renewal finds the key missing there while a quorum holds it, and sets it
 * again. */
static void restarted_node_set_again(void)
{
    cluster cl;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 1500, 1);
    int i;

    start(&cl, NULL);
    c = open_url(cl.url);
    CHECK_RC(dlock_acquire(&l, c, "restart", &o), DLOCK_OK);
    CHECK(wait_holders(&cl, "restart", NODES) == NODES);
    test_redis_kill(&cl.r[2]);
    test_redis_restart(&cl.r[2]);
    CHECK(test_redis_cmd(&cl.r[2], "EXISTS dlock:{restart}") == 0);
    for (i = 0; i < 1000 && test_redis_cmd(&cl.r[2], "EXISTS dlock:{restart}") != 1; i++)
        test_sleep_ms(10);
    CHECK(test_redis_cmd(&cl.r[2], "EXISTS dlock:{restart}") == 1);
    CHECK(!dlock_lock_lost(l));
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(wait_holders(&cl, "restart", 0) == 0);
    dlock_client_free(c);
    stop(&cl);
}

/* A node restarted between two cycles: the client's connection to it looks
 * open until the next request finds it closed, and that request is sent
 * again on a new connection, in the same acquire (no renewal here to set
 * the key later): the restarted node holds the key too. */
static void request_sent_again_after_restart(void)
{
    cluster cl;
    dlock_client *c;
    dlock_lock *l;
    dlock_lock_info info;
    dlock_acquire_options o = test_opts(0, 5000, 0);
    int i;

    start(&cl, NULL);
    c = open_url(cl.url);
    CHECK_RC(dlock_acquire(&l, c, "again", &o), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    /* Status waits for every node: no reply is owed to the client after it
     * (a connection that owes one is not used again, it is made again). */
    CHECK_RC(dlock_status(&info, c, "again"), DLOCK_OK);
    test_redis_kill(&cl.r[2]);
    test_redis_restart(&cl.r[2]);
    CHECK_RC(dlock_acquire(&l, c, "again", &o), DLOCK_OK);
    for (i = 0; i < 200 && test_redis_cmd(&cl.r[2], "EXISTS dlock:{again}") != 1; i++)
        test_sleep_ms(10);
    CHECK(test_redis_cmd(&cl.r[2], "EXISTS dlock:{again}") == 1);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(wait_holders(&cl, "again", 0) == 0);
    dlock_client_free(c);
    stop(&cl);
}

/* A holder stopped (SIGSTOP) past its validity loses the lock: the next
 * holder gets it with a greater fence, and the stopped one, resumed, finds
 * it lost. */
static void paused_holder_loses_lock(void)
{
    cluster cl;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options w = test_opts(20000, 5000, 0);
    uint64_t first = 0;
    int fds[2], status, pid;

    start(&cl, NULL);
    CHECK(pipe(fds) == 0);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dlock_client *cc = open_url(cl.url);
        dlock_lock *cl_lock;
        dlock_acquire_options o = test_opts(0, 400, 1);
        uint64_t f;
        CHECK_RC(dlock_acquire(&cl_lock, cc, "paused", &o), DLOCK_OK);
        f = dlock_lock_fence(cl_lock);
        CHECK(write(fds[1], &f, sizeof(f)) == (ssize_t)sizeof(f));
        /* Resumed: the renewal finds the key another's. */
        for (int i = 0; i < 2000 && !dlock_lock_lost(cl_lock); i++)
            test_sleep_ms(10);
        _exit(dlock_lock_lost(cl_lock) && dlock_release(cl_lock) == DLOCK_ELOST ? 0 : 3);
    }
    CHECK(read(fds[0], &first, sizeof(first)) == (ssize_t)sizeof(first));
    CHECK(kill(pid, SIGSTOP) == 0);
    c = open_url(cl.url);
    CHECK_RC(dlock_acquire(&l, c, "paused", &w), DLOCK_OK);
    fprintf(stderr, "fences: stopped holder %llu, next %llu\n", (unsigned long long)first,
            (unsigned long long)dlock_lock_fence(l));
    CHECK(dlock_lock_fence(l) > first);
    CHECK(kill(pid, SIGCONT) == 0);
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK_RC(dlock_lock_check(l), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    stop(&cl);
}

/*
 * 4 processes take the lock 200 times in all while the parent kills a
 * random node and restarts it (appendonly with appendfsync always: it comes
 * back with its marks). Each holder appends its fence to a shared log while
 * it holds the lock; the log must be strictly increasing.
 */
#define PROCS 4
#define ROUNDS 50
static void fences_increase_across_restarts(void)
{
    cluster cl;
    struct shared {
        atomic_int n;
        uint64_t fence[PROCS * ROUNDS];
    } *sh;
    start(&cl, "--appendonly yes --appendfsync always");
    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(sh != MAP_FAILED);
    memset(sh, 0, sizeof(*sh));
    for (int p = 0; p < PROCS; p++) {
        int pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            dlock_client *c = open_url(cl.url);
            dlock_acquire_options o = test_opts(30000, 3000, 0);
            for (int i = 0; i < ROUNDS; i++) {
                dlock_lock *l;
                int rc = dlock_acquire(&l, c, "fenced", &o);
                if (rc != DLOCK_OK) {
                    fprintf(stderr, "acquire: %s\n", dlock_error_message());
                    _exit(4);
                }
                sh->fence[atomic_fetch_add(&sh->n, 1)] = dlock_lock_fence(l);
                test_sleep_ms(2);
                if (dlock_release(l) != DLOCK_OK)
                    fprintf(stderr, "release: %s\n", dlock_error_message());
            }
            dlock_client_free(c);
            _exit(0);
        }
    }
    srand((unsigned)getpid());
    for (int left = PROCS; left > 0;) {
        int victim = rand() % NODES, status, pid;
        test_sleep_ms(50 + rand() % 100);
        test_redis_kill(&cl.r[victim]);
        test_sleep_ms(50 + rand() % 100);
        test_redis_restart(&cl.r[victim]);
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
            left--;
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                fprintf(stderr, "child %d failed (status %d)\n", pid, status);
                exit(1);
            }
        }
    }
    CHECK(atomic_load(&sh->n) == PROCS * ROUNDS);
    for (int i = 1; i < PROCS * ROUNDS; i++)
        if (sh->fence[i] <= sh->fence[i - 1]) {
            fprintf(stderr, "fence %d: %llu after %llu\n", i,
                    (unsigned long long)sh->fence[i], (unsigned long long)sh->fence[i - 1]);
            CHECK(sh->fence[i] > sh->fence[i - 1]);
        }
    munmap(sh, sizeof(*sh));
    stop(&cl);
}

/*
 * One node answers only after the per-node timeout (the chaos proxy delays
 * it): the lock is held on the other four, and the late node sets the key
 * when the request reaches it. The release reaches it too, after the
 * acquire on the same connection: nothing is left anywhere.
 */
static void release_reaches_the_late_node(void)
{
    cluster cl;
    chaos_proxy *p[3];
    dlock_client *c;
    dlock_lock *l = NULL;
    dlock_acquire_options o = test_opts(0, 1000, 0);
    char url[256];
    int i;

    start(&cl, NULL);
    for (i = 0; i < 3; i++)
        CHECK(chaos_proxy_start(&p[i], cl.r[i].port) == 0);
    snprintf(url, sizeof(url), "redlock://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d,"
             "127.0.0.1:%d,127.0.0.1:%d", chaos_proxy_port(p[0]), chaos_proxy_port(p[1]),
             chaos_proxy_port(p[2]), cl.r[3].port, cl.r[4].port);
    c = open_url(url);
    /* Once without delay, so that the nodes have the scripts (a NOSCRIPT
     * answered late would leave nothing there to release). */
    CHECK_RC(dlock_acquire(&l, c, "late", &o), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    /* Node timeout: 1000 / 10 = 100 ms; the proxy delays node 0 by 400. */
    chaos_proxy_set(p[0], CHAOS_PROXY_DELAY, 400);
    CHECK_RC(dlock_acquire(&l, c, "late", &o), DLOCK_OK);
    for (i = 0; i < 1000 && holders(&cl, "late") < 4; i++)
        test_sleep_ms(10);
    CHECK(holders(&cl, "late") >= 4);
    for (i = 0; i < 500 && test_redis_cmd(&cl.r[0], "EXISTS dlock:{late}") != 1; i++)
        test_sleep_ms(10);
    CHECK(test_redis_cmd(&cl.r[0], "EXISTS dlock:{late}") == 1);
    /* The release returns once a quorum gave the lock up; the late node
     * runs it when it comes, after the acquire. */
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(wait_holders(&cl, "late", 0) == 0);

    /* Three nodes late: no quorum in time, the acquire fails, and the late
     * nodes set the key after it gave up. Its release, sent after the
     * acquire on each of their connections, takes the keys away there too:
     * within the lease (1 s + drift), nothing is left anywhere. */
    chaos_proxy_set(p[1], CHAOS_PROXY_DELAY, 400);
    chaos_proxy_set(p[2], CHAOS_PROXY_DELAY, 400);
    CHECK(dlock_acquire(&l, c, "late2", &o) != DLOCK_OK);
    for (i = 0; i < 3; i++)
        chaos_proxy_set(p[i], CHAOS_PROXY_PASS, 0);
    test_sleep_ms(900);
    CHECK(wait_holders(&cl, "late2", 0) == 0);
    dlock_client_free(c);
    for (i = 0; i < 3; i++)
        chaos_proxy_stop(p[i]);
    stop(&cl);
}

/* ---- one round, and returning at quorum ---- */

/* Script calls (EVALSHA and EVAL) all nodes have run. */
static long long script_calls(cluster *cl)
{
    long long n = 0;

    for (int i = 0; i < NODES; i++)
        n += test_redis_calls(&cl->r[i], "evalsha") + test_redis_calls(&cl->r[i], "eval");
    return n;
}

/* With every node's mark alike (no node restarted, no split), a cycle is
 * round 1 and the release on each node: no round 2. Each grant raised every
 * node's mark by one, so the fences follow one another. */
#define CYCLES 20
static void one_round_when_marks_agree(void)
{
    cluster cl;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 10000, 0);
    uint64_t last = 0;
    long long calls;
    int i;

    start(&cl, NULL);
    c = open_url(cl.url);
    for (i = 0; i < NODES; i++)
        CHECK(test_redis_cmd(&cl.r[i], "CONFIG RESETSTAT") >= 0);
    for (i = 0; i < CYCLES; i++) {
        CHECK_RC(dlock_acquire(&l, c, "one", &o), DLOCK_OK);
        CHECK(i == 0 || dlock_lock_fence(l) == last + 1);
        last = dlock_lock_fence(l);
        CHECK_RC(dlock_release(l), DLOCK_OK);
    }
    /* The slowest nodes' last requests may still be on their way. */
    for (i = 0; i < 1000 && script_calls(&cl) < 2LL * NODES * CYCLES; i++)
        test_sleep_ms(10);
    calls = script_calls(&cl);
    fprintf(stderr, "%d cycles on %d nodes: %lld script calls\n", CYCLES, NODES, calls);
    CHECK(calls == 2LL * NODES * CYCLES);
    dlock_client_free(c);
    stop(&cl);
}

/* A client whose node and command timeouts are ten minutes: every call
 * that returns while a node is stopped returned without waiting for it. */
static dlock_client *open_patient(cluster *cl)
{
    char url[300];

    snprintf(url, sizeof(url), "%s?node_timeout_ms=600000", cl->url);
    return open_with(url, 600000);
}

/* One node stopped (SIGSTOP): acquire, extend and release return once a
 * quorum answered, not after the node's timeout (ten minutes here; without
 * it the case runs into ctest's timeout). Resumed, the node runs what it
 * was sent in order: the late grant is ours, and the release sent after it
 * takes it away; nothing is left. */
static void stopped_node_not_waited_for(void)
{
    cluster cl;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 3600000, 0);

    start(&cl, NULL);
    c = open_patient(&cl);
    CHECK(kill(cl.r[4].pid, SIGSTOP) == 0);
    CHECK_RC(dlock_acquire(&l, c, "slow", &o), DLOCK_OK);
    CHECK_RC(dlock_lock_extend(l, 3600000), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(kill(cl.r[4].pid, SIGCONT) == 0);
    CHECK(wait_holders(&cl, "slow", 0) == 0);
    /* It granted late (its mark was raised), then gave the key up. */
    CHECK(test_redis_cmd(&cl.r[4], "GET dlock:{slow}:fence") > 0);
    /* The next acquisition reads the replies it owes off its connection. */
    CHECK_RC(dlock_acquire(&l, c, "slow", &o), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(wait_holders(&cl, "slow", 0) == 0);
    dlock_client_free(c);
    stop(&cl);
}

/*
 * Nodes 0 and 1 (a minority) have marks far above the rest, so the values
 * a quorum of granting nodes reply differ: with node 4 stopped, A's quorum
 * is 3 of nodes 0-3, and includes 0 or 1. A's fence must be recorded on
 * the nodes that granted (round 2) before A gets it: B, granted by nodes
 * 2, 3 and 4 only (0 and 1 stopped), must get a greater fence. Taking the
 * highest value without round 2 would leave it on nodes 0 and 1 alone.
 */
static void fence_when_marks_disagree(void)
{
    cluster cl;
    dlock_client *c;
    dlock_lock *a, *b;
    dlock_acquire_options o = test_opts(0, 3600000, 0);
    uint64_t fa, fb;

    start(&cl, NULL);
    c = open_patient(&cl);
    CHECK(test_redis_cmd(&cl.r[0], "SET dlock:{split}:fence 100") >= 0);
    CHECK(test_redis_cmd(&cl.r[1], "SET dlock:{split}:fence 100") >= 0);
    CHECK(kill(cl.r[4].pid, SIGSTOP) == 0);
    CHECK_RC(dlock_acquire(&a, c, "split", &o), DLOCK_OK);
    fa = dlock_lock_fence(a);
    CHECK(fa == 101);
    CHECK_RC(dlock_release(a), DLOCK_OK);
    CHECK(kill(cl.r[0].pid, SIGSTOP) == 0);
    CHECK(kill(cl.r[1].pid, SIGSTOP) == 0);
    CHECK(kill(cl.r[4].pid, SIGCONT) == 0);
    CHECK_RC(dlock_acquire(&b, c, "split", &o), DLOCK_OK);
    fb = dlock_lock_fence(b);
    fprintf(stderr, "fences: A %llu, B %llu\n", (unsigned long long)fa, (unsigned long long)fb);
    CHECK(fb > fa);
    CHECK_RC(dlock_release(b), DLOCK_OK);
    CHECK(kill(cl.r[0].pid, SIGCONT) == 0);
    CHECK(kill(cl.r[1].pid, SIGCONT) == 0);
    CHECK(wait_holders(&cl, "split", 0) == 0);
    dlock_client_free(c);
    stop(&cl);
}

/* The acquire script's EVALSHA has run on node i (it counts once done). */
static int wait_evalsha(cluster *cl, int i, long long calls)
{
    int k;

    for (k = 0; k < 1000 && test_redis_calls(&cl->r[i], "evalsha") < calls; k++)
        test_sleep_ms(10);
    return test_redis_calls(&cl->r[i], "evalsha") >= calls;
}

/* A fence mark another program wrote, not a non-negative integer: that
 * node answers an error and keeps neither the key (no lock without a
 * fence) nor a changed mark; the other nodes grant. acquire.lua takes a free
 * key with SET NX and then INCR, so it must give the key back when the
 * INCR fails, and move a negative mark back. */
static void broken_mark_leaves_no_key(void)
{
    cluster cl;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 3600000, 0);

    start(&cl, NULL);
    c = open_url(cl.url);
    CHECK(test_redis_cmd(&cl.r[0], "SET dlock:{bad}:fence not-a-number") >= 0);
    CHECK(test_redis_cmd(&cl.r[1], "SET dlock:{bad}:fence -5") >= 0);
    CHECK_RC(dlock_acquire(&l, c, "bad", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(l) == 1);
    /* Nodes 0 and 1 may not have been waited for: until their script ran. */
    CHECK(wait_evalsha(&cl, 0, 1));
    CHECK(wait_evalsha(&cl, 1, 1));
    CHECK(test_redis_cmd(&cl.r[0], "EXISTS dlock:{bad}") == 0);
    CHECK(test_redis_cmd(&cl.r[1], "EXISTS dlock:{bad}") == 0);
    CHECK(test_redis_cmd(&cl.r[0], "STRLEN dlock:{bad}:fence") == 12);
    CHECK(test_redis_cmd(&cl.r[1], "INCRBY dlock:{bad}:fence 0") == -5);
    CHECK(wait_holders(&cl, "bad", 3) == 3);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(wait_holders(&cl, "bad", 0) == 0);
    dlock_client_free(c);
    stop(&cl);
}

/* The next message on a subscribed connection: its payload is "released"
 * (1), something else (0), or nothing came in 60 s (-1). */
static int next_message_is_release(redisContext *sub)
{
    redisReply *r = NULL;
    int is = -1;

    if (redisGetReply(sub, (void **)&r) == REDIS_OK && r != NULL &&
        r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
        r->element[2]->type == REDIS_REPLY_STRING)
        is = strcmp(r->element[2]->str, "released") == 0;
    if (r != NULL)
        freeReplyObject(r);
    return is;
}

/* A release is announced (PUBLISH) on a node only when a waiter found the
 * key busy there (it set dlock:{NAME}:waiters): no one waiting, no message;
 * a waiter subscribed and flagged, the message, and the waiter gets the
 * lock at once rather than at its next try (a quarter of its hour-long
 * lease). */
static void release_announced_to_waiters_only(void)
{
    cluster cl;
    dlock_client *a, *b;
    dlock_lock *l, *l2 = NULL;
    dlock_acquire_options o = test_opts(0, 3600000, 0);
    redisContext *sub;
    redisReply *r;
    struct timeval patience = {60, 0};
    test_acquirer w;
    pthread_t t;
    int i;

    start(&cl, NULL);
    a = open_url(cl.url);
    b = open_url(cl.url);
    sub = redisConnect("127.0.0.1", cl.r[0].port);
    CHECK(sub != NULL && sub->err == 0);
    CHECK(redisSetTimeout(sub, patience) == REDIS_OK);
    r = redisCommand(sub, "SUBSCRIBE dlock:{ann}:release");
    CHECK(r != NULL && r->type == REDIS_REPLY_ARRAY);
    freeReplyObject(r);

    /* No waiter: the release publishes nothing, so the first message is
     * the one published by hand after it. */
    CHECK_RC(dlock_acquire(&l, a, "ann", &o), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(wait_holders(&cl, "ann", 0) == 0);
    CHECK(test_redis_cmd(&cl.r[0], "PUBLISH dlock:{ann}:release by-hand") == 1);
    CHECK(next_message_is_release(sub) == 0);

    /* B waits: once its try flagged node 0, A's release is announced. */
    CHECK_RC(dlock_acquire(&l, a, "ann", &o), DLOCK_OK);
    o.wait_ms = DLOCK_WAIT_FOREVER;
    test_acquirer_init(&w, b, "ann", o);
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &w) == 0);
    for (i = 0; i < 1000 && test_redis_cmd(&cl.r[0], "EXISTS dlock:{ann}:waiters") != 1; i++)
        test_sleep_ms(10);
    CHECK(test_redis_cmd(&cl.r[0], "EXISTS dlock:{ann}:waiters") == 1);
    /* A waiter with a short lease does not cut B's flag short (B tries
     * again only every quarter of its hour). */
    o = test_opts(50, 1000, 0);
    CHECK_RC(dlock_acquire(&l2, a, "ann", &o), DLOCK_ETIMEOUT);
    CHECK(test_redis_cmd(&cl.r[0], "PTTL dlock:{ann}:waiters") > 3600000);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(next_message_is_release(sub) == 1);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(w.rc, DLOCK_OK);
    CHECK_RC(dlock_release(w.lock), DLOCK_OK);
    redisFree(sub);
    dlock_client_free(a);
    dlock_client_free(b);
    stop(&cl);
}

/* Two threads of one client wait for a lock with an hour's lease. A release
 * wakes one waiter of the client and takes the nodes' flags: the winner's
 * try flags them again, since the other still waits, so its release wakes
 * the other at once. Without that, the other would sleep out its quarter
 * lease (15 minutes), here until the end of its 60 s wait. */
static void waiters_of_one_client_each_told(void)
{
    cluster cl;
    dlock_client *a, *b;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 3600000, 0);
    test_acquirer w[2];
    pthread_t t[2];
    long long base;
    uint64_t fence;
    int first, i;

    start(&cl, NULL);
    a = open_url(cl.url);
    b = open_url(cl.url);
    CHECK_RC(dlock_acquire(&l, a, "told", &o), DLOCK_OK);
    base = test_redis_calls(&cl.r[0], "evalsha");
    o.wait_ms = 60000;
    for (i = 0; i < 2; i++) {
        test_acquirer_init(&w[i], b, "told", o);
        CHECK(pthread_create(&t[i], NULL, test_acquirer_main, &w[i]) == 0);
    }
    /* Each waiter tries once before it subscribes and once after. */
    for (i = 0; i < 1000 && test_redis_calls(&cl.r[0], "evalsha") < base + 4; i++)
        test_sleep_ms(10);
    CHECK(test_redis_calls(&cl.r[0], "evalsha") >= base + 4);
    CHECK(!atomic_load(&w[0].done) && !atomic_load(&w[1].done));
    /* Announced by node 0 alone: one wake-up, for the first waiter (the
     * other nodes' messages would come to it too, after it used the first,
     * and it would pass them on). */
    for (i = 1; i < NODES; i++)
        CHECK(test_redis_cmd(&cl.r[i], "DEL dlock:{told}:waiters") == 1);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    for (i = 0; i < 2000 && !atomic_load(&w[0].done) && !atomic_load(&w[1].done); i++)
        test_sleep_ms(10);
    first = atomic_load(&w[0].done) ? 0 : 1;
    CHECK(pthread_join(t[first], NULL) == 0);
    CHECK_RC(w[first].rc, DLOCK_OK);
    CHECK(!atomic_load(&w[1 - first].done));
    fence = dlock_lock_fence(w[first].lock);
    CHECK_RC(dlock_release(w[first].lock), DLOCK_OK);
    /* Woken, not at the end of its wait (a minute) nor of a quarter lease
     * (15 minutes). */
    for (i = 0; i < 2000 && !atomic_load(&w[1 - first].done); i++)
        test_sleep_ms(10);
    CHECK(atomic_load(&w[1 - first].done));
    CHECK(pthread_join(t[1 - first], NULL) == 0);
    if (w[1 - first].rc != DLOCK_OK)
        fprintf(stderr, "second waiter: %s\n", w[1 - first].message);
    CHECK_RC(w[1 - first].rc, DLOCK_OK);
    CHECK(dlock_lock_fence(w[1 - first].lock) > fence);
    CHECK_RC(dlock_release(w[1 - first].lock), DLOCK_OK);
    dlock_client_free(a);
    dlock_client_free(b);
    stop(&cl);
}

/* ---- the lock family: reentrancy by owner id; the rest not offered ---- */

/* Holds of name on node i: the length of its :holds hash. */
static long long holds_on(cluster *cl, int i, const char *name)
{
    return test_redis_cmd(&cl->r[i], "HLEN dlock:{%s}:holds", name);
}

static dlock_acquire_options owned(const char *owner, int reentrant, int64_t lease_ms)
{
    dlock_acquire_options o = test_opts(0, lease_ms, 1);

    o.owner = owner;
    o.reentrant = reentrant;
    return o;
}

/* An owner re-enters at once with a handle of its own and the same fence;
 * the lock stays on the quorum until its last handle is released; another
 * owner (or a plain mutex) is refused meanwhile, and the same owner
 * without reentrant is told it would wait for itself. The next holder's
 * fence is greater. */
static void reentrant_counts(void)
{
    cluster cl;
    dlock_client *c;
    dlock_lock *h1, *h2, *l = (dlock_lock *)1;
    dlock_acquire_options mine = owned("job-1", 1, 5000), other = owned("job-2", 1, 5000);
    dlock_acquire_options plain = test_opts(0, 5000, 0), again = owned("job-1", 0, 5000);
    uint64_t fence;

    start(&cl, NULL);
    c = open_url(cl.url);
    CHECK_RC(dlock_acquire(&h1, c, "re", &mine), DLOCK_OK);
    CHECK_RC(dlock_acquire(&h2, c, "re", &mine), DLOCK_OK);
    fence = dlock_lock_fence(h1);
    CHECK(fence > 0);
    CHECK(dlock_lock_fence(h2) == fence); /* one tenure, one fence */
    for (int i = 0; i < NODES; i++)
        CHECK(holds_on(&cl, i, "re") == 2);
    CHECK_RC(dlock_acquire(&l, c, "re", &other), DLOCK_EBUSY);
    CHECK_RC(dlock_acquire(&l, c, "re", &plain), DLOCK_EBUSY);
    CHECK_RC(dlock_acquire(&l, c, "re", &again), DLOCK_EMISUSE);
    CHECK_CONTAINS(dlock_error_message(), "already held by this owner id");
    CHECK(l == NULL);

    CHECK_RC(dlock_release(h1), DLOCK_OK);
    CHECK(wait_holders(&cl, "re", NODES) == NODES);
    CHECK_RC(dlock_acquire(&l, c, "re", &other), DLOCK_EBUSY);
    CHECK_RC(dlock_lock_check(h2), DLOCK_OK);
    CHECK_RC(dlock_release(h2), DLOCK_OK);
    CHECK(wait_holders(&cl, "re", 0) == 0);

    CHECK_RC(dlock_acquire(&l, c, "re", &other), DLOCK_OK);
    CHECK(dlock_lock_fence(l) > fence);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    stop(&cl);
}

/* A waiting owner gets the lock when the other owner's last handle is
 * released, not at its first. */
static void reentrant_other_owner_waits_for_last(void)
{
    cluster cl;
    dlock_client *c;
    dlock_lock *h1, *h2;
    dlock_acquire_options mine = owned("job-1", 1, 5000);
    int fds[2], pid;
    char b;

    start(&cl, NULL);
    c = open_url(cl.url);
    CHECK_RC(dlock_acquire(&h1, c, "rw8", &mine), DLOCK_OK);
    CHECK_RC(dlock_acquire(&h2, c, "rw8", &mine), DLOCK_OK);
    CHECK(pipe(fds) == 0);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dlock_client *cc = open_url(cl.url);
        dlock_lock *l;
        dlock_acquire_options w = owned("job-2", 1, 5000);
        w.wait_ms = 30000;
        CHECK_RC(dlock_acquire(&l, cc, "rw8", &w), DLOCK_OK);
        CHECK(write(fds[1], "x", 1) == 1);
        CHECK_RC(dlock_release(l), DLOCK_OK);
        _exit(0);
    }
    close(fds[1]);
    CHECK_RC(dlock_release(h1), DLOCK_OK);
    /* The waiter is still waiting a while after the first release. */
    test_sleep_ms(300);
    CHECK_RC(dlock_lock_check(h2), DLOCK_OK);
    CHECK(holds_on(&cl, 0, "rw8") == 1);
    CHECK_RC(dlock_release(h2), DLOCK_OK);
    CHECK(read(fds[0], &b, 1) == 1);
    test_wait_child_ok(pid);
    dlock_client_free(c);
    stop(&cl);
}

/*
 * Two handles of one owner while three of the five nodes, one after the
 * other, restart empty: each time the renewals set the owner's key and both
 * holds again there, so the lock never drops below a quorum (without that
 * the last restart would leave it on two nodes). Another owner stays
 * refused; one release keeps it, the second frees it. A re-entry now gets a
 * new, greater fence: the restarted nodes do not vouch for the owner's
 * first fence, and the two that do are no quorum.
 */
static void reentrant_survives_restarts(void)
{
    cluster cl;
    dlock_client *c;
    dlock_lock *h1, *h2, *h3, *l = (dlock_lock *)1;
    dlock_acquire_options mine = owned("job-1", 1, 600), other = owned("job-2", 1, 600);
    int i;

    start(&cl, NULL);
    c = open_url(cl.url);
    CHECK_RC(dlock_acquire(&h1, c, "rs", &mine), DLOCK_OK);
    CHECK_RC(dlock_acquire(&h2, c, "rs", &mine), DLOCK_OK);
    for (int n = 0; n < 3; n++) {
        test_redis_kill(&cl.r[n]);
        test_redis_restart(&cl.r[n]);
        for (i = 0; i < 1000 && holds_on(&cl, n, "rs") != 2; i++)
            test_sleep_ms(10);
        CHECK(holds_on(&cl, n, "rs") == 2);
        CHECK(test_redis_cmd(&cl.r[n], "GET dlock:{rs}") == (long long)strlen("job-1"));
    }
    CHECK(!dlock_lock_lost(h1) && !dlock_lock_lost(h2));
    CHECK_RC(dlock_acquire(&l, c, "rs", &other), DLOCK_EBUSY);

    CHECK_RC(dlock_acquire(&h3, c, "rs", &mine), DLOCK_OK);
    CHECK(dlock_lock_fence(h3) > dlock_lock_fence(h1));
    CHECK_RC(dlock_release(h3), DLOCK_OK);

    CHECK_RC(dlock_release(h1), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "rs", &other), DLOCK_EBUSY);
    CHECK_RC(dlock_lock_check(h2), DLOCK_OK);
    CHECK_RC(dlock_release(h2), DLOCK_OK);
    CHECK(wait_holders(&cl, "rs", 0) == 0);
    CHECK_RC(dlock_acquire(&l, c, "rs", &other), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    stop(&cl);
}

/* What a quorum of plain keys cannot give soundly is refused with
 * DLOCK_ENOTSUP and a message naming the backend, before any node is
 * asked. */
static void family_kinds_not_offered(void)
{
    static const struct {
        int kind;
        const char *what;
    } kinds[] = {
        {DLOCK_KIND_READ, "read-write locks"},
        {DLOCK_KIND_WRITE, "read-write locks"},
        {DLOCK_KIND_SEMAPHORE, "semaphores"},
        {DLOCK_KIND_FAIR, "fair locks"},
    };
    cluster cl;
    dlock_client *c;
    dlock_lock *l = NULL;
    dlock_leader_info li;

    start(&cl, NULL);
    c = open_url(cl.url);
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        dlock_acquire_options o = test_opts(1000, 2000, 1);
        o.kind = kinds[k].kind;
        o.permits = kinds[k].kind == DLOCK_KIND_SEMAPHORE ? 2 : 0;
        CHECK_RC(dlock_acquire(&l, c, "fam", &o), DLOCK_ENOTSUP);
        CHECK_CONTAINS(dlock_error_message(), "redlock backend does not implement");
        CHECK_CONTAINS(dlock_error_message(), kinds[k].what);
        CHECK(l == NULL);
    }
    CHECK_RC(dlock_campaign(&l, c, "fam", "me", NULL), DLOCK_ENOTSUP);
    CHECK_CONTAINS(dlock_error_message(), "redlock backend does not implement leader election");
    CHECK_RC(dlock_leader(&li, c, "fam"), DLOCK_ENOTSUP);
    CHECK_RC(dlock_semaphore_set_permits(c, "fam", 3), DLOCK_ENOTSUP);
    CHECK_CONTAINS(dlock_error_message(), "redlock backend does not implement semaphores");
    for (int i = 0; i < NODES; i++)
        CHECK(test_redis_cmd(&cl.r[i], "DBSIZE") == 0);
    dlock_client_free(c);
    stop(&cl);
}

/* dlock_client_open of cl's URL (with strict=1 when strict) with the log
 * recorded in test_log_text, emptied first; its code, *c the client or NULL. */
static int open_logged(cluster *cl, int strict, dlock_client **c)
{
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    char url[300], buf[400];

    co.log = test_log_record;
    test_log_clear();
    snprintf(url, sizeof(url), "%s%s", cl->url, strict ? "?strict=1" : "");
    return dlock_client_open(c, with_io(url, buf, sizeof(buf)), &co);
}

/* The fence holds while every node keeps its marks: open asks each node
 * for appendonly, appendfsync and maxmemory-policy. Redis's defaults (no
 * AOF) are a warning naming each node, and refused with strict=1; AOF with
 * appendfsync always and noeviction open quietly, strict or not; an
 * allkeys-* policy on one node is refused naming it; a node whose ACL
 * refuses CONFIG is logged and not refused. */
static void node_settings_checked(void)
{
    cluster cl;
    dlock_client *c = NULL;
    char port[96];

    start(&cl, NULL);
    CHECK_RC(open_logged(&cl, 0, &c), DLOCK_OK);
    dlock_client_free(c);
    for (int i = 0; i < NODES; i++) {
        snprintf(port, sizeof(port), ":%d has appendonly no", cl.r[i].port);
        CHECK_CONTAINS(test_log_text(), port);
    }
    CHECK_CONTAINS(test_log_text(), "2 redlock: redis 127.0.0.1:");
    CHECK_CONTAINS(test_log_text(), "has appendfsync everysec: a crash of the machine can lose");
    CHECK_RC(open_logged(&cl, 1, &c), DLOCK_ESERVER);
    CHECK(c == NULL);
    CHECK_CONTAINS(dlock_error_message(), "redlock: redis 127.0.0.1:");
    CHECK_CONTAINS(dlock_error_message(), " has append");
    CHECK_CONTAINS(dlock_error_message(), "(strict=1)");

    for (int i = 0; i < NODES; i++) {
        CHECK(test_redis_cmd(&cl.r[i], "CONFIG SET appendonly yes") == 2);
        CHECK(test_redis_cmd(&cl.r[i], "CONFIG SET appendfsync always") == 2);
        CHECK(test_redis_cmd(&cl.r[i], "CONFIG SET maxmemory-policy noeviction") == 2);
    }
    CHECK_RC(open_logged(&cl, 0, &c), DLOCK_OK);
    dlock_client_free(c);
    CHECK(strstr(test_log_text(), "redlock:") == NULL);
    CHECK_RC(open_logged(&cl, 1, &c), DLOCK_OK);
    dlock_client_free(c);

    CHECK(test_redis_cmd(&cl.r[0], "CONFIG SET maxmemory-policy volatile-lru") == 2);
    CHECK_RC(open_logged(&cl, 1, &c), DLOCK_OK);
    dlock_client_free(c);
    CHECK(test_redis_cmd(&cl.r[0], "CONFIG SET maxmemory-policy allkeys-lru") == 2);
    CHECK_RC(open_logged(&cl, 1, &c), DLOCK_ESERVER);
    snprintf(port, sizeof(port), ":%d has maxmemory-policy allkeys-lru", cl.r[0].port);
    CHECK_CONTAINS(dlock_error_message(), port);
    CHECK_CONTAINS(dlock_error_message(), "may be evicted");
    CHECK(test_redis_cmd(&cl.r[0], "CONFIG SET maxmemory-policy noeviction") == 2);

    CHECK(test_redis_cmd(&cl.r[1], "ACL SETUSER default -config") == 2);
    CHECK_RC(open_logged(&cl, 1, &c), DLOCK_OK);
    dlock_client_free(c);
    snprintf(port, sizeof(port), "cannot check that redis 127.0.0.1:%d", cl.r[1].port);
    CHECK_CONTAINS(test_log_text(), port);
    CHECK_CONTAINS(test_log_text(), "NOPERM");
    stop(&cl);
}

/* ---- threads sharing a client ---- */

/* Connections named name on node r now (CLIENT LIST). */
static int named_connections(test_redis *r, const char *name)
{
    char list[16384], want[64];
    int n = 0;

    test_redis_text(r, list, sizeof(list), "CLIENT LIST");
    snprintf(want, sizeof(want), " name=%s ", name);
    for (const char *at = list; (at = strstr(at, want)) != NULL; at++)
        n++;
    return n;
}

/* Proxies in front of every node, their URL in url. */
static void proxied(cluster *cl, chaos_proxy **p, char *url, size_t size)
{
    int len = snprintf(url, size, "redlock://");

    for (int i = 0; i < NODES; i++) {
        CHECK(chaos_proxy_start(&p[i], cl->r[i].port) == 0);
        len += snprintf(url + len, size - (size_t)len, "%s127.0.0.1:%d", i ? "," : "",
                        chaos_proxy_port(p[i]));
    }
}

typedef struct {
    dlock_client *c;
    pthread_barrier_t *go;
    char name[32];
    int rc;
    uint64_t fence;
    char msg[256];
} overlap_arg;

static void *overlap_main(void *arg)
{
    overlap_arg *a = arg;
    dlock_acquire_options o = test_opts(0, 60000, 0);
    dlock_lock *l = NULL;

    pthread_barrier_wait(a->go);
    if ((a->rc = dlock_acquire(&l, a->c, a->name, &o)) == DLOCK_OK) {
        a->fence = dlock_lock_fence(l);
        a->rc = dlock_release(l);
    }
    snprintf(a->msg, sizeof(a->msg), "%s", dlock_error_message());
    return NULL;
}

/*
 * Calls of a client's threads that overlap run at once, each on a set of
 * connections of its own, at most four sets: six threads, each a cycle on
 * a lock of its own, while every node answers 300 ms late (the chaos
 * proxy; the node timeout is 5 s, for the new sets' connections, whose
 * replies to the set-up and the scripts loaded ahead are late too). A client serializing its callers would have one command
 * connection per node; this one has more, and no more than four. A client
 * used by one thread at a time keeps one.
 */
static void overlapping_calls_run_at_once(void)
{
    enum { THREADS = 6 };
    cluster cl;
    chaos_proxy *p[NODES];
    dlock_client *c;
    dlock_acquire_options o = test_opts(0, 60000, 0);
    dlock_lock *l;
    pthread_barrier_t go;
    pthread_t t[THREADS];
    overlap_arg a[THREADS];
    char url[256];

    start(&cl, NULL);
    proxied(&cl, p, url, sizeof(url));
    c = open_with(url, 5000);
    for (int k = 0; k < 3; k++) {
        CHECK_RC(dlock_acquire(&l, c, "one", &o), DLOCK_OK);
        CHECK_RC(dlock_release(l), DLOCK_OK);
    }
    for (int i = 0; i < NODES; i++)
        CHECK(named_connections(&cl.r[i], "dlock-cmd") == 1);

    for (int i = 0; i < NODES; i++)
        chaos_proxy_set(p[i], CHAOS_PROXY_DELAY, 300);
    CHECK(pthread_barrier_init(&go, NULL, THREADS) == 0);
    for (int k = 0; k < THREADS; k++) {
        a[k] = (overlap_arg){.c = c, .go = &go, .rc = -1};
        snprintf(a[k].name, sizeof(a[k].name), "overlap-%d", k);
        CHECK(pthread_create(&t[k], NULL, overlap_main, &a[k]) == 0);
    }
    for (int k = 0; k < THREADS; k++) {
        CHECK(pthread_join(t[k], NULL) == 0);
        if (a[k].rc != DLOCK_OK)
            fprintf(stderr, "thread %d: %s\n", k, a[k].msg);
        CHECK_RC(a[k].rc, DLOCK_OK);
        CHECK(a[k].fence > 0);
    }
    pthread_barrier_destroy(&go);
    for (int i = 0; i < NODES; i++) {
        int n = named_connections(&cl.r[i], "dlock-cmd");
        fprintf(stderr, "node %d: %d command connections\n", i, n);
        CHECK(n >= 2 && n <= 4);
    }
    for (int i = 0; i < NODES; i++)
        chaos_proxy_set(p[i], CHAOS_PROXY_PASS, 0);
    /* Every key given back, on every node. */
    for (int k = 0; k < THREADS; k++)
        CHECK(wait_holders(&cl, a[k].name, 0) == 0);
    dlock_client_free(c);
    for (int i = 0; i < NODES; i++)
        chaos_proxy_stop(p[i]);
    stop(&cl);
}

/*
 * A lock's requests reach each node in the order they were sent, whatever
 * set of connections a call of its token takes (docs/redlock.md, fact 3):
 * an acquire granted without node 0, whose reply there is still owed on
 * the set it ran on, is released on that same set, waiting for it while
 * another thread's call has it, rather than on a free set of its own.
 */
static void owed_token_keeps_its_set(void)
{
    cluster cl;
    chaos_proxy *p[NODES];
    dlock_client *c;
    dlock_acquire_options o = test_opts(0, 3000, 0); /* node timeout: 300 ms */
    dlock_lock *l;
    pthread_barrier_t go;
    pthread_t t;
    overlap_arg b;
    char url[256];

    start(&cl, NULL);
    proxied(&cl, p, url, sizeof(url));
    c = open_with(url, 5000);
    for (int k = 0; k < 3; k++) {
        CHECK_RC(dlock_acquire(&l, c, "late", &o), DLOCK_OK);
        CHECK_RC(dlock_release(l), DLOCK_OK);
    }
    chaos_proxy_set(p[0], CHAOS_PROXY_DELAY, 600);
    CHECK_RC(dlock_acquire(&l, c, "late", &o), DLOCK_OK); /* node 0's reply owed */
    for (int i = 0; i < NODES; i++)
        chaos_proxy_set(p[i], CHAOS_PROXY_DELAY, 200);
    /* Another thread's call takes the set meanwhile. */
    CHECK(pthread_barrier_init(&go, NULL, 1) == 0);
    b = (overlap_arg){.c = c, .go = &go, .rc = -1};
    snprintf(b.name, sizeof(b.name), "other");
    CHECK(pthread_create(&t, NULL, overlap_main, &b) == 0);
    test_sleep_ms(50);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(b.rc, DLOCK_OK);
    pthread_barrier_destroy(&go);
    for (int i = 1; i < NODES; i++)
        CHECK(named_connections(&cl.r[i], "dlock-cmd") == 1);
    for (int i = 0; i < NODES; i++)
        chaos_proxy_set(p[i], CHAOS_PROXY_PASS, 0);
    CHECK(wait_holders(&cl, "late", 0) == 0);
    CHECK(wait_holders(&cl, "other", 0) == 0);
    dlock_client_free(c);
    for (int i = 0; i < NODES; i++)
        chaos_proxy_stop(p[i]);
    stop(&cl);
}

/* Threads of one client contending for one lock (contend_main), each
 * CONTENDS times. */
#define CONTENDS 12
typedef struct {
    dlock_client *c;
    pthread_mutex_t mu;
    int holder;         /* the thread in it, 0 for none */
    uint64_t last;      /* the fence of the last holder */
    int overlaps, backwards, failures, held;
    char why[256];
} contention;

typedef struct {
    contention *ct;
    int id;
} contender;

static void *contend_main(void *arg)
{
    contender *me = arg;
    contention *ct = me->ct;
    dlock_acquire_options o = test_opts(20000, 5000, 0); /* node timeout: 500 ms */

    for (int k = 0; k < CONTENDS; k++) {
        dlock_lock *l = NULL;
        int rc = dlock_acquire(&l, ct->c, "contended", &o);

        pthread_mutex_lock(&ct->mu);
        if (rc != DLOCK_OK) {
            ct->failures++;
            snprintf(ct->why, sizeof(ct->why), "%s", dlock_error_message());
            pthread_mutex_unlock(&ct->mu);
            continue;
        }
        ct->overlaps += ct->holder != 0;
        ct->backwards += dlock_lock_fence(l) <= ct->last;
        ct->holder = me->id;
        ct->last = dlock_lock_fence(l);
        ct->held++;
        pthread_mutex_unlock(&ct->mu);
        test_sleep_ms(1);
        pthread_mutex_lock(&ct->mu);
        ct->holder = 0;
        pthread_mutex_unlock(&ct->mu);
        if (dlock_release(l) != DLOCK_OK) {
            pthread_mutex_lock(&ct->mu);
            ct->failures++;
            snprintf(ct->why, sizeof(ct->why), "%s", dlock_error_message());
            pthread_mutex_unlock(&ct->mu);
        }
    }
    return NULL;
}

/*
 * Four threads of one client take one lock in turn, 48 times in all,
 * while one node after another answers later than the node timeout (the
 * chaos proxy, a node for 300 ms each, its late replies still coming as
 * the next one's are held: at most two late at once): their calls overlap
 * on sets of their own,
 * leave replies owed, retry and release on the sets they owe on. One
 * holder at a time, each with a fence above the last holder's, no call
 * failed, and nothing left on any node.
 */
static void threads_contend_through_late_nodes(void)
{
    enum { THREADS = 4 };
    cluster cl;
    chaos_proxy *p[NODES];
    contention ct = {0};
    contender who[THREADS];
    pthread_t t[THREADS];
    char url[256];
    int running = THREADS;

    start(&cl, NULL);
    proxied(&cl, p, url, sizeof(url));
    ct.c = open_with(url, 2000);
    CHECK(pthread_mutex_init(&ct.mu, NULL) == 0);
    for (int k = 0; k < THREADS; k++) {
        who[k] = (contender){&ct, k + 1};
        CHECK(pthread_create(&t[k], NULL, contend_main, &who[k]) == 0);
    }
    for (int round = 0; running > 0; round++) {
        chaos_proxy_set(p[round % NODES], CHAOS_PROXY_DELAY, 600);
        test_sleep_ms(300);
        chaos_proxy_set(p[round % NODES], CHAOS_PROXY_PASS, 0);
        pthread_mutex_lock(&ct.mu);
        running = ct.held + ct.failures < THREADS * CONTENDS;
        pthread_mutex_unlock(&ct.mu);
        CHECK(round < 2000);
    }
    for (int k = 0; k < THREADS; k++)
        CHECK(pthread_join(t[k], NULL) == 0);
    fprintf(stderr, "held %d, failures %d (%s), overlaps %d, fences not above %d\n", ct.held,
            ct.failures, ct.why, ct.overlaps, ct.backwards);
    CHECK(ct.held == THREADS * CONTENDS);
    CHECK(ct.overlaps == 0);
    CHECK(ct.backwards == 0);
    CHECK(wait_holders(&cl, "contended", 0) == 0);
    pthread_mutex_destroy(&ct.mu);
    dlock_client_free(ct.c);
    for (int i = 0; i < NODES; i++)
        chaos_proxy_stop(p[i]);
    stop(&cl);
}

TEST_MAIN({"url_checked", url_checked, "unit"},
          {"node_settings_checked", node_settings_checked, NULL},
          {"fanouts_use_the_ring", fanouts_use_the_ring, NULL},
          {"one_round_when_marks_agree", one_round_when_marks_agree, NULL},
          {"stopped_node_not_waited_for", stopped_node_not_waited_for, NULL},
          {"fence_when_marks_disagree", fence_when_marks_disagree, NULL},
          {"broken_mark_leaves_no_key", broken_mark_leaves_no_key, NULL},
          {"release_announced_to_waiters_only", release_announced_to_waiters_only, NULL},
          {"waiters_of_one_client_each_told", waiters_of_one_client_each_told, NULL},
          {"two_killed_still_works", two_killed_still_works, "watchdog"},
          {"three_killed_clear_error", three_killed_clear_error, NULL},
          {"busy_gives_back_the_minority", busy_gives_back_the_minority, NULL},
          {"restarted_node_set_again", restarted_node_set_again, "watchdog"},
          {"request_sent_again_after_restart", request_sent_again_after_restart, NULL},
          {"paused_holder_loses_lock", paused_holder_loses_lock, "watchdog"},
          {"fences_increase_across_restarts", fences_increase_across_restarts, NULL},
          {"release_reaches_the_late_node", release_reaches_the_late_node, NULL},
          {"reentrant_counts", reentrant_counts, NULL},
          {"reentrant_other_owner_waits_for_last", reentrant_other_owner_waits_for_last, NULL},
          {"reentrant_survives_restarts", reentrant_survives_restarts, "watchdog"},
          {"family_kinds_not_offered", family_kinds_not_offered, NULL},
          {"overlapping_calls_run_at_once", overlapping_calls_run_at_once, "watchdog"},
          {"owed_token_keeps_its_set", owed_token_keeps_its_set, "watchdog"},
          {"threads_contend_through_late_nodes", threads_contend_through_late_nodes, "watchdog"})
