/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What only the ZooKeeper backend has: Curator's node names, a create whose
 * reply was lost, sessions (a stalled holder, a killed waiter), and an
 * ensemble losing the member the client is on, then its leader. Each case
 * starts its own servers (tests/support/test_zk.c).
 */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define THREADED 1 /* the synchronous calls of the mt library */
#include <zookeeper/zookeeper.h>

#include "dlock/sys/backend.h"
#include "test.h"

static void log_stderr(int level, const char *message, void *payload)
{
    (void)payload;
    fprintf(stderr, "dlock log %d: %s\n", level, message);
}

static dlock_client *open_url(const char *url, int64_t command_timeout_ms)
{
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_client *c = NULL;

    co.command_timeout_ms = command_timeout_ms;
    co.log = log_stderr;
    CHECK_RC(dlock_client_open(&c, url, &co), DLOCK_OK);
    CHECK(strcmp(dlock_client_backend(c), "zk") == 0);
    return c;
}

/* Nodes are named as Curator's InterProcessMutex with protection names
 * them, under /dlock/NAME; the fence is the holder node's czxid, so it
 * grows across holders. */
static void curator_node_names(void)
{
    test_zk z;
    dlock_client *c;
    dlock_lock *l, *m;
    char names[4][128];
    uint64_t f1;

    test_zk_start(&z, 1, NULL);
    c = open_url(z.url, 5000);
    CHECK_RC(dlock_acquire(&l, c, "names", NULL), DLOCK_OK);
    CHECK(test_zk_child_names(&z, "/dlock/names", names, 4) == 1);
    /* _c_ + 8-4-4-4-12 uuid + "-lock-" + 10 digits */
    fprintf(stderr, "node: %s\n", names[0]);
    CHECK(strncmp(names[0], "_c_", 3) == 0 && strlen(names[0]) == 3 + 36 + 6 + 10);
    CHECK(names[0][11] == '-' && names[0][16] == '-' && names[0][21] == '-' &&
          names[0][26] == '-' && strncmp(names[0] + 39, "-lock-", 6) == 0);
    f1 = dlock_lock_fence(l);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(test_zk_children(&z, "/dlock/names") == 0);
    CHECK_RC(dlock_acquire(&m, c, "names", NULL), DLOCK_OK);
    CHECK(dlock_lock_fence(m) > f1); /* a later czxid */
    /* A name with '/' is one component, escaped. */
    CHECK_RC(dlock_acquire(&l, c, "a/b", NULL), DLOCK_OK);
    CHECK(test_zk_children(&z, "/dlock/a%2Fb") == 1);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK_RC(dlock_release(m), DLOCK_OK);
    dlock_client_free(c);
    test_zk_stop(&z);
}

/* How many children of dir carry protection id uuid's prefix "_c_". */
static int count_nodes(test_zk *z, const char *dir)
{
    char names[8][128];
    return test_zk_child_names(z, dir, names, 8);
}

/*
 * A create the server made but whose reply was lost (the server paused
 * past the command timeout, then let go) is found again by its protection
 * id on the next try and never duplicated; the waiter then gets the lock
 * with that node's fence. And a try (wait 0) whose reply was lost leaves
 * nothing behind: the core gives it back, and what cannot reach the server
 * then, the reaper deletes later.
 */
typedef struct {
    dlock_client *c;
    dlock_lock *l;
    int rc;
    atomic_int done;
} waiter_arg;

static void *waiter_main(void *p)
{
    waiter_arg *a = p;
    dlock_acquire_options o = test_opts(30000, 20000, 1);
    a->rc = dlock_acquire(&a->l, a->c, "lost-reply", &o);
    atomic_store(&a->done, 1);
    return NULL;
}

static void lost_create_reply(void)
{
    test_zk z;
    dlock_client *holder, *c;
    dlock_lock *h, *t = NULL;
    dlock_acquire_options once = test_opts(0, 20000, 1);
    waiter_arg a;
    pthread_t th;
    char names[4][128];

    test_zk_start(&z, 1, NULL);
    holder = open_url(z.url, 5000);
    c = open_url(z.url, 700);
    CHECK_RC(dlock_acquire(&h, holder, "lost-reply", NULL), DLOCK_OK);

    /* The try: its create reaches the paused server, whose reply comes
     * after the 700 ms command timeout. */
    test_zk_pause(&z, 0, 1);
    CHECK(dlock_acquire(&t, c, "lost-reply", &once) == DLOCK_ECONN);
    test_zk_pause(&z, 0, 0);
    /* The node it made is deleted (by the reaper, at the latest a second
     * or so later): only the holder's is left. */
    for (int i = 0; i < 200 && count_nodes(&z, "/dlock/lost-reply") != 1; i++)
        test_sleep_ms(50);
    CHECK(count_nodes(&z, "/dlock/lost-reply") == 1);
    CHECK_RC(dlock_status(&(dlock_lock_info){0}, c, "lost-reply"), DLOCK_OK);

    /* The waiter: queued; the server pauses, the waiter is woken (its
     * predecessor's release is lost on the way? no: we force a retry by
     * pausing while the waiter's first queued create is sent). */
    memset(&a, 0, sizeof(a));
    a.c = c;
    test_zk_pause(&z, 0, 1);
    CHECK(pthread_create(&th, NULL, waiter_main, &a) == 0);
    test_sleep_ms(1500); /* its try's create and queued create time out */
    test_zk_pause(&z, 0, 0);
    CHECK(pthread_join(th, NULL) == 0);
    /* The wait failed on the lost reply (DLOCK_ECONN): its queued node,
     * made late, is found by uuid and removed; no duplicate stays. */
    fprintf(stderr, "waiter: %d (%s)\n", a.rc, dlock_strerror(a.rc));
    for (int i = 0; i < 200 && count_nodes(&z, "/dlock/lost-reply") != 1; i++)
        test_sleep_ms(50);
    CHECK(count_nodes(&z, "/dlock/lost-reply") == 1);
    CHECK(test_zk_child_names(&z, "/dlock/lost-reply", names, 4) == 1);
    CHECK_RC(dlock_release(h), DLOCK_OK);
    CHECK(test_zk_children(&z, "/dlock/lost-reply") == 0);
    dlock_client_free(c);
    dlock_client_free(holder);
    test_zk_stop(&z);
}

/* The same through the backend's own calls, where a test can hold a waiting
 * acquisition across the lost reply: the next try with the same token finds
 * the node by its protection id and does not create a second one. */
static void lost_create_reply_found_again(void)
{
    extern const dlock_backend *dlock_zk_backend(void);
    const dlock_backend *b = dlock_zk_backend();
    test_zk z;
    dlock_client *holder;
    dlock_lock *h;
    dlock_url_host host = {"127.0.0.1", 0};
    dlock_url_param param = {"session_timeout_ms", "2000"};
    dlock_url url = {"zk", NULL, NULL, &host, 1, NULL, &param, 1, "zk://test"};
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_request req = {0};
    dlock_acquire_result res;
    void *be = NULL, *w = NULL;
    char names[4][128];
    int rc, mine = -1;

    test_zk_start(&z, 1, NULL);
    host.port = z.client_port[0];
    holder = open_url(z.url, 5000);
    CHECK_RC(dlock_acquire(&h, holder, "again", NULL), DLOCK_OK);
    co.command_timeout_ms = 700;
    CHECK_RC(b->open(&be, &url, &co), DLOCK_OK);
    req.kind = DLOCK_KIND_MUTEX;
    req.name = "again";
    req.token = "0123456789abcdef0123456789abcdef";
    req.lease_ms = 20000;
    req.holder = "host 1 2";
    CHECK_RC(b->watch_begin(be, &req, &w), DLOCK_OK);
    test_zk_pause(&z, 0, 1);
    test_sleep_ms(200); /* stopped for sure before the create is sent */
    memset(&res, 0, sizeof(res));
    rc = b->acquire(be, &req, w, &res);
    fprintf(stderr, "paused: %s\n", dlock_error_message());
    CHECK(rc == DLOCK_ECONN);
    CHECK_CONTAINS(dlock_error_message(), "create");
    test_zk_pause(&z, 0, 0);
    /* The server made the node after all. */
    for (int i = 0; i < 200 && count_nodes(&z, "/dlock/again") != 2; i++)
        test_sleep_ms(50);
    CHECK(count_nodes(&z, "/dlock/again") == 2);
    memset(&res, 0, sizeof(res));
    CHECK_RC(b->acquire(be, &req, w, &res), DLOCK_EBUSY);
    CHECK(res.retry_ms == INT64_MAX); /* queued, watching the holder */
    CHECK(test_zk_child_names(&z, "/dlock/again", names, 4) == 2); /* not 3 */
    for (int i = 0; i < 2; i++)
        if (strncmp(names[i], "_c_01234567-89ab-cdef-0123-456789abcdef-lock-", 45) == 0)
            mine = i;
    CHECK(mine >= 0);
    CHECK_RC(dlock_release(h), DLOCK_OK);
    CHECK_RC(b->watch_wait(be, w, 10000), DLOCK_OK);
    memset(&res, 0, sizeof(res));
    CHECK_RC(b->acquire(be, &req, w, &res), DLOCK_OK);
    CHECK(res.fence > 0);
    b->watch_end(be, w);
    CHECK_RC(b->release(be, &req), DLOCK_OK);
    CHECK(test_zk_children(&z, "/dlock/again") == 0);
    b->close(be);
    dlock_client_free(holder);
    test_zk_stop(&z);
}

/* A holder stopped past its session timeout: its node vanishes, the waiter
 * queued behind it gets the lock, and after SIGCONT the stale holder's
 * on_lost fires (DLOCK_ELOST) and its release changes nothing. */
static int lost_pipe[2];

static void lost_to_pipe(dlock_lock *l, int reason, void *payload)
{
    char ch = (char)(reason == DLOCK_ELOST ? 'L' : 'C');
    (void)l, (void)payload;
    if (write(lost_pipe[1], &ch, 1) != 1)
        abort();
}

static void sigstop_holder(void)
{
    test_zk z;
    int ready[2];
    pid_t pid;

    test_zk_start(&z, 1, NULL);
    CHECK(pipe(ready) == 0 && pipe(lost_pipe) == 0);
    pid = fork();
    if (pid == 0) {
        dlock_client *c = open_url(z.url, 5000);
        dlock_lock *l;
        dlock_acquire_options o = test_opts(0, 1500, 1);
        struct pollfd pfd = {lost_pipe[0], POLLIN, 0};
        char why = 0;
        o.on_lost = lost_to_pipe;
        CHECK_RC(dlock_acquire(&l, c, "stopped", &o), DLOCK_OK);
        CHECK(write(ready[1], "r", 1) == 1);
        CHECK(poll(&pfd, 1, 30000) == 1);
        CHECK(read(lost_pipe[0], &why, 1) == 1);
        fprintf(stderr, "stale holder: on_lost %c\n", why);
        CHECK(why == 'L');
        CHECK(dlock_lock_lost(l));
        CHECK_RC(dlock_release(l), DLOCK_ELOST);
        test_sleep_ms(300);
        CHECK(poll(&pfd, 1, 0) == 0); /* once */
        dlock_client_free(c);
        _exit(0);
    }
    {
        char byte;
        dlock_client *c = open_url(z.url, 5000);
        test_acquirer a;
        pthread_t t;
        CHECK(read(ready[0], &byte, 1) == 1);
        test_acquirer_init(&a, c, "stopped", test_opts(30000, 1500, 1));
        CHECK(pthread_create(&t, NULL, test_acquirer_main, &a) == 0);
        for (int i = 0; i < 400 && test_zk_children(&z, "/dlock/stopped") != 2; i++)
            test_sleep_ms(25);
        CHECK(test_zk_children(&z, "/dlock/stopped") == 2); /* holder and waiter */
        CHECK(kill(pid, SIGSTOP) == 0);
        CHECK(pthread_join(t, NULL) == 0);
        CHECK_RC(a.rc, DLOCK_OK);
        fprintf(stderr, "waiter got the lock %lld ms after it began\n", (long long)a.took_ms);
        CHECK(test_zk_children(&z, "/dlock/stopped") == 1); /* the stale node vanished */
        CHECK(kill(pid, SIGCONT) == 0);
        test_wait_child_ok(pid);
        CHECK_RC(dlock_lock_check(a.lock), DLOCK_OK);
        CHECK_RC(dlock_release(a.lock), DLOCK_OK);
        dlock_client_free(c);
    }
    test_zk_stop(&z);
}

/* Run by killed_waiter_leaves_queue in a process of its own: waits for
 * lock "killed" on DLOCK_TEST_ZK_URL for ever, until it is killed. Not a
 * test by itself (TEST_CHILD). */
static void killed_waiter_child(void)
{
    const char *url = getenv("DLOCK_TEST_ZK_URL");
    dlock_client *w;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(DLOCK_WAIT_FOREVER, 1000, 1);

    CHECK(url != NULL);
    w = open_url(url, 5000);
    dlock_acquire(&l, w, "killed", &o);
    _exit(3);
}

/* A waiter killed (SIGKILL: no leave) leaves the queue when its session
 * times out; the next waiter then gets the lock from the holder. */
static void killed_waiter_leaves_queue(void)
{
    test_zk z;
    dlock_client *c;
    dlock_lock *h, *n;
    int64_t until;
    pid_t pid;

    test_zk_start(&z, 1, NULL);
    c = open_url(z.url, 5000);
    CHECK_RC(dlock_acquire(&h, c, "killed", NULL), DLOCK_OK);
    /* The waiter is a fresh program (exec), not a fork of this one: a fork
     * of a process with libzookeeper's I/O threads running could inherit a
     * lock one of them held, and hang before it queued (seen in CI: the
     * case ran into ctest's timeout). */
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* kept across exec */
        setenv("DLOCK_TEST_ZK_URL", z.url, 1);
        execl("/proc/self/exe", "test_zk", "killed_waiter_child", (char *)NULL);
        _exit(127);
    }
    /* The child's session and queue node: up to 60 s, for a loaded
     * machine, counted by the clock (each look opens a ZooKeeper session of
     * its own, which takes a while). Should they never come, the child is
     * killed before the check fails. */
    until = test_clock_ms(CLOCK_MONOTONIC) + 60000;
    while (test_clock_ms(CLOCK_MONOTONIC) < until && test_zk_children(&z, "/dlock/killed") != 2)
        test_sleep_ms(25);
    if (test_zk_children(&z, "/dlock/killed") != 2)
        kill(pid, SIGKILL);
    CHECK(test_zk_children(&z, "/dlock/killed") == 2);
    CHECK(kill(pid, SIGKILL) == 0);
    CHECK(waitpid(pid, NULL, 0) == pid);
    /* Its session (2 s) times out on the server. */
    until = test_clock_ms(CLOCK_MONOTONIC) + 20000;
    while (test_clock_ms(CLOCK_MONOTONIC) < until && test_zk_children(&z, "/dlock/killed") != 1)
        test_sleep_ms(25);
    CHECK(test_zk_children(&z, "/dlock/killed") == 1);
    CHECK_RC(dlock_release(h), DLOCK_OK);
    CHECK_RC(dlock_acquire(&n, c, "killed", NULL), DLOCK_OK);
    CHECK_RC(dlock_release(n), DLOCK_OK);
    dlock_client_free(c);
    test_zk_stop(&z);
}

/* ---- owner ids ------------------------------------------------------------ */

typedef struct {
    const char *url;
    uint64_t fence;
    int rc;
    atomic_int done;
} re_waiter;

static void *re_waiter_main(void *p)
{
    re_waiter *a = p;
    dlock_client *c = open_url(a->url, 5000);
    dlock_acquire_options o = test_opts(60000, 3000, 1);

    dlock_lock *l;

    a->rc = dlock_acquire(&l, c, "re", &o);
    atomic_store(&a->done, 1);
    if (a->rc == DLOCK_OK) {
        a->fence = dlock_lock_fence(l);
        CHECK_RC(dlock_release(l), DLOCK_OK);
    }
    dlock_client_free(c);
    return NULL;
}

/*
 * Re-entry by owner id: the same owner takes the lock again from another
 * client and from another process, each with a node of its own at the
 * holder's sequence and the holder's fence; another owner, no owner, and
 * the owner without reentrant are kept out; a waiter (behind all of them)
 * gets the lock only when the last hold is released, with a higher fence.
 */
static void reentrant_by_owner(void)
{
    test_zk z;
    dlock_client *c, *c2;
    dlock_lock *a1, *a2, *x = NULL;
    dlock_acquire_options o = test_opts(0, 3000, 1), plain = test_opts(0, 3000, 1);
    dlock_lock_info info;
    re_waiter w = {0};
    pthread_t t;
    uint64_t fence, child_fence = 0;
    int go[2], back[2], st;
    pid_t pid;

    test_zk_start(&z, 1, NULL);
    o.owner = "worker-1";
    o.reentrant = 1;
    CHECK(pipe(go) == 0 && pipe(back) == 0);
    /* Forked before this process has a client (a fork beside the
     * ZooKeeper client's threads could hang the child). */
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dlock_client *cc;
        dlock_lock *l;
        uint64_t f;
        char b;
        close(go[1]);
        close(back[0]);
        if (read(go[0], &b, 1) != 1)
            _exit(2);
        cc = open_url(z.url, 5000);
        if (dlock_acquire(&l, cc, "re", &o) != DLOCK_OK)
            _exit(3);
        f = dlock_lock_fence(l);
        if (write(back[1], &f, sizeof(f)) != (ssize_t)sizeof(f) || read(go[0], &b, 1) != 1)
            _exit(4);
        if (dlock_release(l) != DLOCK_OK)
            _exit(5);
        dlock_client_free(cc);
        _exit(0);
    }
    close(go[0]);
    close(back[1]);
    c = open_url(z.url, 5000);
    c2 = open_url(z.url, 5000);
    CHECK_RC(dlock_acquire(&a1, c, "re", &o), DLOCK_OK);
    fence = dlock_lock_fence(a1);
    o.wait_ms = 10000; /* a waiting acquisition re-enters too, skipping the queue */
    CHECK_RC(dlock_acquire(&a2, c2, "re", &o), DLOCK_OK);
    o.wait_ms = 0;
    CHECK(dlock_lock_fence(a2) == fence);
    CHECK(test_zk_children(&z, "/dlock/re") == 2);
    CHECK(write(go[1], "g", 1) == 1);
    CHECK(read(back[0], &child_fence, sizeof(child_fence)) == (ssize_t)sizeof(child_fence));
    CHECK(child_fence == fence);
    CHECK(test_zk_children(&z, "/dlock/re") == 3);

    CHECK_RC(dlock_acquire(&x, c2, "re", &plain), DLOCK_EBUSY);
    plain.owner = "worker-2";
    plain.reentrant = 1;
    CHECK_RC(dlock_acquire(&x, c2, "re", &plain), DLOCK_EBUSY);
    o.reentrant = 0;
    CHECK_RC(dlock_acquire(&x, c2, "re", &o), DLOCK_EMISUSE);
    CHECK_CONTAINS(dlock_error_message(), "reentrant is off");
    o.reentrant = 1;
    CHECK(test_zk_children(&z, "/dlock/re") == 3);

    /* A waiter queues behind the three holds. */
    w.url = z.url;
    CHECK(pthread_create(&t, NULL, re_waiter_main, &w) == 0);
    for (int i = 0; i < 1200 && test_zk_children(&z, "/dlock/re") != 4; i++)
        test_sleep_ms(25);
    CHECK(test_zk_children(&z, "/dlock/re") == 4);
    /* The watchdog renews each hold past its lease. */
    test_sleep_ms(3500);
    CHECK_RC(dlock_lock_check(a1), DLOCK_OK);
    CHECK_RC(dlock_lock_check(a2), DLOCK_OK);

    /* The first hold goes: the others keep the lock, with its fence. */
    CHECK_RC(dlock_release(a1), DLOCK_OK);
    CHECK_RC(dlock_status(&info, c, "re"), DLOCK_OK);
    CHECK(info.held && info.fence == fence);
    CHECK_RC(dlock_release(a2), DLOCK_OK);
    CHECK_RC(dlock_acquire(&x, c, "re", &o), DLOCK_OK); /* the child's hold, re-entered */
    CHECK(dlock_lock_fence(x) == fence);
    CHECK_RC(dlock_release(x), DLOCK_OK);
    test_sleep_ms(300);
    CHECK(!atomic_load(&w.done));
    CHECK(write(go[1], "g", 1) == 1);
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(w.rc, DLOCK_OK);
    CHECK(w.fence > fence);
    CHECK_RC(dlock_status(&info, c, "re"), DLOCK_OK);
    CHECK(!info.held);

    /* A force release takes the owner's re-entries with the holder's node:
     * the lock is free, and every hold of the owner lost. */
    CHECK_RC(dlock_acquire(&a1, c, "re", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&a2, c2, "re", &o), DLOCK_OK);
    CHECK_RC(dlock_force_release(&info, c2, "re"), DLOCK_OK);
    CHECK(info.held && info.fence == dlock_lock_fence(a1));
    CHECK(test_zk_children(&z, "/dlock/re") == 0);
    plain.owner = NULL;
    plain.reentrant = 0;
    CHECK_RC(dlock_acquire(&x, c2, "re", &plain), DLOCK_OK);
    CHECK_RC(dlock_lock_check(a1), DLOCK_ELOST);
    CHECK_RC(dlock_lock_check(a2), DLOCK_ELOST);
    CHECK_RC(dlock_release(x), DLOCK_OK);
    dlock_release(a1);
    dlock_release(a2);
    close(go[1]);
    close(back[0]);
    dlock_client_free(c);
    dlock_client_free(c2);
    test_zk_stop(&z);
}

/* The member whose connection list shows the most client sessions: the
 * one our client is on (the others only see this 4lw connection). */
static int member_of_client(test_zk *z)
{
    int best = -1, most = 0;

    for (int i = 0; i < z->n; i++) {
        char *r = z->pid[i] > 0 ? test_zk_4lw(z, i, "cons") : NULL;
        int n = 0;
        for (char *p = r; p != NULL && (p = strstr(p, "sid=0x")) != NULL; p += 6)
            if (strncmp(p, "sid=0x0,", 8) != 0 && strncmp(p, "sid=0x0)", 8) != 0)
                n++;
        free(r);
        if (n > most)
            most = n, best = i;
    }
    return best;
}

/* An ensemble of 3: kill the member the client is on, then (with it back)
 * the leader; the lock is kept (the session moves to a live member within
 * its timeout), not lost, and still excludes others. */
static void ensemble_member_and_leader_killed(void)
{
    test_zk z;
    dlock_client *c, *other;
    dlock_lock *l, *x = NULL;
    dlock_acquire_options o = test_opts(0, 8000, 1);
    char url[400];
    uint64_t fence;
    int on, leader;

    atomic_store(&test_lost_calls, 0);
    test_zk_start(&z, 3, NULL);
    snprintf(url, sizeof(url), "zk://%s?session_timeout_ms=10000", z.hosts);
    c = open_url(url, 5000);
    other = open_url(url, 5000);
    o.on_lost = test_count_lost;
    CHECK_RC(dlock_acquire(&l, c, "ens", &o), DLOCK_OK);

    on = member_of_client(&z);
    CHECK(on >= 0);
    fprintf(stderr, "client on member %d; killing it\n", on);
    test_zk_kill(&z, on);
    test_sleep_ms(12000); /* past the session timeout and the lease */
    CHECK(atomic_load(&test_lost_calls) == 0);
    CHECK(!dlock_lock_lost(l));
    CHECK_RC(dlock_lock_check(l), DLOCK_OK);
    CHECK_RC(dlock_acquire(&x, other, "ens", NULL), DLOCK_EBUSY);

    test_zk_restart(&z, on);
    leader = test_zk_leader(&z);
    fprintf(stderr, "killing the leader, member %d\n", leader);
    test_zk_kill(&z, leader);
    test_sleep_ms(12000);
    CHECK(atomic_load(&test_lost_calls) == 0);
    CHECK(!dlock_lock_lost(l));
    CHECK_RC(dlock_lock_check(l), DLOCK_OK);
    /* The other client may still be finding a member that serves. */
    for (int i = 0; i < 60 && dlock_acquire(&x, other, "ens", NULL) == DLOCK_ECONN; i++)
        test_sleep_ms(500);
    CHECK_RC(dlock_acquire(&x, other, "ens", NULL), DLOCK_EBUSY);
    fence = dlock_lock_fence(l);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK_RC(dlock_acquire(&x, other, "ens", NULL), DLOCK_OK);
    CHECK(dlock_lock_fence(x) > fence); /* czxids grow across leaders */
    CHECK_RC(dlock_release(x), DLOCK_OK);
    dlock_client_free(c);
    dlock_client_free(other);
    test_zk_stop(&z);
}

/* ---- ACLs: zk://user:password@ ------------------------------------------ */

/* A raw C client handle, authenticated as auth ("user:password") or not
 * (NULL): the attacker, or an operator's view. */
static void raw_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    (void)zh, (void)type, (void)state, (void)path, (void)ctx;
}

static void raw_log(const char *m)
{
    (void)m;
}

static zhandle_t *raw_open(test_zk *z, const char *auth)
{
    zhandle_t *zh = zookeeper_init2(z->hosts, raw_watcher, 10000, NULL, NULL, 0, raw_log);
    int t;

    for (t = 0; zh != NULL && t < 400 && zoo_state(zh) != ZOO_CONNECTED_STATE; t++)
        test_sleep_ms(50);
    CHECK(zh != NULL && zoo_state(zh) == ZOO_CONNECTED_STATE);
    if (auth != NULL) /* the synchronous add_auth waits for the server's answer */
        CHECK_RC(zoo_add_auth(zh, "digest", auth, (int)strlen(auth), NULL, NULL), ZOK);
    return zh;
}

/*
 * Every node under path (path included, depth first) through zh: its ACL
 * must give world nothing but read (world_read: exactly read, else no
 * world entry at all), and give the digest user everything. Returns the
 * number of nodes seen.
 */
static int acl_walk(zhandle_t *zh, const char *path, const char *user, int world_read)
{
    struct ACL_vector acl = {0, NULL};
    struct String_vector kids = {0, NULL};
    struct Stat st;
    int n = 1, world = 0, mine = 0;
    size_t ulen = strlen(user);

    CHECK_RC(zoo_get_acl(zh, path, &acl, &st), ZOK);
    for (int i = 0; i < acl.count; i++) {
        const struct ACL *a = &acl.data[i];
        fprintf(stderr, "acl %s: %s:%s:%d\n", path, a->id.scheme, a->id.id, a->perms);
        if (strcmp(a->id.scheme, "world") == 0) {
            world = 1;
            CHECK(world_read && a->perms == ZOO_PERM_READ);
        }
        if (strcmp(a->id.scheme, "digest") == 0 && strncmp(a->id.id, user, ulen) == 0 &&
            a->id.id[ulen] == ':' && a->perms == ZOO_PERM_ALL)
            mine = 1;
    }
    CHECK(mine);
    CHECK(world == world_read);
    deallocate_ACL_vector(&acl);
    CHECK_RC(zoo_get_children(zh, path, 0, &kids), ZOK);
    for (int i = 0; i < kids.count; i++) {
        char child[512];
        snprintf(child, sizeof(child), "%s/%s", path, kids.data[i]);
        n += acl_walk(zh, child, user, world_read);
    }
    deallocate_String_vector(&kids);
    return n;
}

static dlock_client *open_as(test_zk *z, const char *userinfo, const char *query)
{
    char url[512];
    snprintf(url, sizeof(url), "zk://%s%s%s?session_timeout_ms=2000%s%s", userinfo != NULL ?
             userinfo : "", userinfo != NULL ? "@" : "", z->hosts, query != NULL ? "&" : "",
             query != NULL ? query : "");
    return open_url(url, 5000);
}

/*
 * With credentials, a holder's node and its directory can be neither
 * deleted nor re-permissioned by a client without them or with others, and
 * nobody else gets in: before, every node had the open ACL, an
 * unauthenticated zoo_delete removed the holder's node and a second holder
 * got in.
 */
static void acl_holder_node_protected(void)
{
    test_zk z;
    dlock_client *alice, *anon, *mallory;
    dlock_lock *l, *x = NULL;
    dlock_acquire_options once = test_opts(0, 20000, 1);
    zhandle_t *mine, *nobody, *other;
    struct String_vector kids = {0, NULL};
    char node[512];
    int rc;

    test_zk_start(&z, 1, NULL);
    alice = open_as(&z, "alice:secret", NULL);
    anon = open_as(&z, NULL, NULL);
    CHECK_RC(dlock_acquire(&l, alice, "guarded", NULL), DLOCK_OK);

    mine = raw_open(&z, "alice:secret");
    nobody = raw_open(&z, NULL);
    other = raw_open(&z, "mallory:other");
    CHECK_RC(zoo_get_children(mine, "/dlock/guarded", 0, &kids), ZOK);
    CHECK(kids.count == 1);
    snprintf(node, sizeof(node), "/dlock/guarded/%s", kids.data[0]);
    deallocate_String_vector(&kids);

    for (int i = 0; i < 2; i++) {
        zhandle_t *zh = i == 0 ? nobody : other;
        char made[256];
        /* DELETE on a node is the parent's permission; both refuse. */
        CHECK_RC(zoo_delete(zh, node, -1), ZNOAUTH);
        CHECK_RC(zoo_set_acl(zh, node, -1, &ZOO_OPEN_ACL_UNSAFE), ZNOAUTH);
        CHECK_RC(zoo_set_acl(zh, "/dlock/guarded", -1, &ZOO_OPEN_ACL_UNSAFE), ZNOAUTH);
        CHECK_RC(zoo_set_acl(zh, "/dlock", -1, &ZOO_OPEN_ACL_UNSAFE), ZNOAUTH);
        CHECK_RC(zoo_create(zh, "/dlock/guarded/_c_00000000-0000-0000-0000-000000000000-lock-",
                            NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_EPHEMERAL_SEQUENTIAL, made,
                            (int)sizeof(made)),
                 ZNOAUTH);
        CHECK_RC(zoo_create(zh, "/dlock/squat", NULL, -1, &ZOO_OPEN_ACL_UNSAFE, 0, made,
                            (int)sizeof(made)),
                 ZNOAUTH);
        CHECK_RC(zoo_set(zh, node, "x", 1, -1), ZNOAUTH);
        CHECK_RC(zoo_get_children(zh, "/dlock/guarded", 0, &kids), ZNOAUTH);
    }
    /* Nobody else gets in; the holder still holds. */
    rc = dlock_acquire(&x, anon, "guarded", &once);
    CHECK(rc != DLOCK_OK);
    fprintf(stderr, "without credentials: %s\n", dlock_error_message());
    /* Other credentials: refused at open, where /dlock is checked. */
    snprintf(node, sizeof(node), "zk://mallory:other@%s", z.hosts);
    CHECK_RC(dlock_client_open(&mallory, node, NULL), DLOCK_EAUTH);
    CHECK_CONTAINS(dlock_error_message(), "read the ACL of /dlock");
    CHECK_RC(dlock_lock_check(l), DLOCK_OK);
    /* Nothing but dlock's own node and the tree it made, all alice's. */
    CHECK(acl_walk(mine, "/dlock", "alice", 0) == 3);
    CHECK_RC(dlock_release(l), DLOCK_OK);

    zookeeper_close(mine);
    zookeeper_close(nobody);
    zookeeper_close(other);
    dlock_client_free(anon);
    dlock_client_free(alice);
    test_zk_stop(&z);
}

/*
 * The prefix's node is where lock directories are made, and ZooKeeper
 * checks DELETE on the parent: one that lets anyone create in it (made
 * earlier without credentials, or the root for a prefix without '/') is
 * refused at open, naming the fix; a prefix of one's own works, and is
 * made persistent with the client's ACL.
 */
static void acl_open_prefix_refused(void)
{
    test_zk z;
    dlock_client *c = NULL;
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_lock *l;
    zhandle_t *nobody, *mine;
    char url[512], made[64];
    struct Stat st;

    test_zk_start(&z, 1, NULL);
    nobody = raw_open(&z, NULL);
    CHECK_RC(zoo_create(nobody, "/dlock", NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_CONTAINER, made,
                        (int)sizeof(made)),
             ZOK);
    snprintf(url, sizeof(url), "zk://alice:secret@%s", z.hosts);
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_EAUTH);
    CHECK_CONTAINS(dlock_error_message(), "/dlock lets anyone create or delete in it");
    CHECK_CONTAINS(dlock_error_message(), "setAcl /dlock auth::cdrwa");
    co.key_prefix = "locks-";
    CHECK_RC(dlock_client_open(&c, url, &co), DLOCK_EAUTH);
    CHECK_CONTAINS(dlock_error_message(), ": / lets anyone create");
    co.key_prefix = "team-a/locks/";
    CHECK_RC(dlock_client_open(&c, url, &co), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "x", NULL), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    mine = raw_open(&z, "alice:secret");
    CHECK_RC(zoo_exists(mine, "/team-a/locks", 0, &st), ZOK);
    CHECK(st.ephemeralOwner == 0);
    CHECK(acl_walk(mine, "/team-a", "alice", 0) >= 2);
    CHECK_RC(zoo_delete(nobody, "/team-a/locks/x", -1), ZNOAUTH);
    zookeeper_close(mine);
    zookeeper_close(nobody);
    dlock_client_free(c);
    test_zk_stop(&z);
}

/*
 * Every kind of node the family makes carries the ACL (no world entry, the
 * creator all perms): mutex, re-entry, read and write, semaphore (locks,
 * leases and the count), leader, and their parents; two clients of the
 * same identity still exclude each other and hand the lock over.
 */
static void acl_every_node_kind(void)
{
    test_zk z;
    dlock_client *a, *b;
    dlock_lock *m, *re, *r, *w, *sem, *lead, *busy = NULL;
    dlock_acquire_options o = test_opts(0, 20000, 1);
    test_acquirer wa;
    dlock_acquire_options wo = test_opts(20000, 20000, 1);
    pthread_t th;
    zhandle_t *mine;
    int n;

    test_zk_start(&z, 1, NULL);
    a = open_as(&z, "alice:secret", NULL);
    b = open_as(&z, "alice:secret", NULL);
    o.owner = "job-7";
    o.reentrant = 1;
    CHECK_RC(dlock_acquire(&m, a, "mutex", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&re, b, "mutex", &o), DLOCK_OK); /* a re-entry node */
    o.owner = NULL;
    o.reentrant = 0;
    o.kind = DLOCK_KIND_READ;
    CHECK_RC(dlock_acquire(&r, a, "rw", &o), DLOCK_OK);
    o.kind = DLOCK_KIND_WRITE;
    CHECK_RC(dlock_acquire(&w, b, "rw-w", &o), DLOCK_OK);
    o.kind = DLOCK_KIND_SEMAPHORE;
    o.permits = 2;
    CHECK_RC(dlock_acquire(&sem, b, "sem", &o), DLOCK_OK);
    CHECK_RC(dlock_campaign(&lead, a, "el", "alpha", NULL), DLOCK_OK);

    mine = raw_open(&z, "alice:secret");
    n = acl_walk(mine, "/dlock", "alice", 0);
    fprintf(stderr, "%d nodes\n", n);
    /* /dlock, 5 directories, 2 mutex nodes, read, write, locks, leases and
     * a lease, latch */
    CHECK(n >= 14);

    /* Same identity: still excluded, and handed over. */
    o = test_opts(0, 20000, 1);
    o.kind = DLOCK_KIND_WRITE;
    CHECK_RC(dlock_acquire(&busy, b, "rw-w", &o), DLOCK_EBUSY);
    wo.kind = DLOCK_KIND_WRITE;
    test_acquirer_init(&wa, a, "rw-w", wo);
    CHECK(pthread_create(&th, NULL, test_acquirer_main, &wa) == 0);
    test_sleep_ms(300);
    CHECK_RC(dlock_release(w), DLOCK_OK);
    pthread_join(th, NULL);
    CHECK_RC(wa.rc, DLOCK_OK);
    CHECK_RC(dlock_release(wa.lock), DLOCK_OK);

    CHECK_RC(dlock_release(re), DLOCK_OK);
    CHECK_RC(dlock_release(m), DLOCK_OK);
    CHECK_RC(dlock_release(r), DLOCK_OK);
    CHECK_RC(dlock_release(sem), DLOCK_OK);
    CHECK_RC(dlock_resign(lead), DLOCK_OK);
    zookeeper_close(mine);
    dlock_client_free(b);
    dlock_client_free(a);
    test_zk_stop(&z);
}

/*
 * acl= adds identities: world:anyone:r lets an operator without
 * credentials list and read (never delete), and a shared digest identity
 * may delete (here: a force release by the team's account).
 */
static void acl_option_adds_identities(void)
{
    test_zk z;
    dlock_client *a;
    dlock_lock *l;
    zhandle_t *nobody, *team;
    struct String_vector kids = {0, NULL};
    char node[512];

    test_zk_start(&z, 1, NULL);
    /* team:teampw's digest */
    a = open_as(&z, "alice:secret",
                "acl=world:anyone:r,digest:team:gNORL9jQUMOKvYwzh1leeZo3btc=:cdrwa");
    CHECK_RC(dlock_acquire(&l, a, "shared", NULL), DLOCK_OK);
    nobody = raw_open(&z, NULL);
    team = raw_open(&z, "team:teampw");
    CHECK(acl_walk(team, "/dlock", "alice", 1) == 3);
    CHECK_RC(zoo_get_children(nobody, "/dlock/shared", 0, &kids), ZOK);
    CHECK(kids.count == 1);
    snprintf(node, sizeof(node), "/dlock/shared/%s", kids.data[0]);
    deallocate_String_vector(&kids);
    CHECK_RC(zoo_delete(nobody, node, -1), ZNOAUTH);
    CHECK_RC(zoo_delete(team, node, -1), ZOK);
    CHECK_RC(dlock_lock_check(l), DLOCK_ELOST);
    dlock_release(l);
    zookeeper_close(team);
    zookeeper_close(nobody);
    dlock_client_free(a);
    test_zk_stop(&z);
}

/* Bad acl= values are refused before anything is sent, naming the entry
 * and what is wrong, never showing a digest's hash. */
static void acl_option_errors(void)
{
    static const struct {
        const char *url, *says;
    } bad[] = {
        {"zk://127.0.0.1:1?acl=world:anyone:r", "acl= needs user:password@"},
        {"zk://u:p@127.0.0.1:1?session_timeout_ms=1000&acl=digest:team:SECRETHASH:r",
         "?session_timeout_ms=1000&acl=***': acl entry 1 (digest): the id must be"},
        {"zk://u:p@127.0.0.1:1?acl=digest:team:SECRETHASH:r&x=1",
         "?acl=***&x=1': unknown parameter 'x'"},
        {"zk://u:p@127.0.0.1:1?acl=", "acl entry 1 must be SCHEME:ID:PERMS"},
        {"zk://u:p@127.0.0.1:1?acl=world:anyone:r,,ip:10.0.0.1:r", "acl entry 2 must be"},
        {"zk://u:p@127.0.0.1:1?acl=world:r", "acl entry 1 must be SCHEME:ID:PERMS"},
        {"zk://u:p@127.0.0.1:1?acl=sasl:bob:r", "unknown scheme 'sasl' (world, digest or ip)"},
        {"zk://u:p@127.0.0.1:1?acl=world:anyone:rx", "perms 'rx' must be one or more of"},
        {"zk://u:p@127.0.0.1:1?acl=world:anyone:rr", "each once"},
        {"zk://u:p@127.0.0.1:1?acl=world:nobody:r", "world's only id is 'anyone'"},
        {"zk://u:p@127.0.0.1:1?acl=world:anyone:rd", "world may only read (perms r)"},
        {"zk://u:p@127.0.0.1:1?acl=world:anyone:cdrwa", "anyone who can reach the ensemble"},
        {"zk://u:p@127.0.0.1:1?acl=digest:team:SECRETHASH:r", "the id must be USER:HASH"},
        {"zk://u:p@127.0.0.1:1?acl=ip:10.0.0.1;x:r", "'10.0.0.1;x' is not an ADDRESS"},
        {"zk://u:p@127.0.0.1:1?acl=ip:1:r,ip:2:r,ip:3:r,ip:4:r,ip:5:r,ip:6:r,ip:7:r,ip:8:r,"
         "ip:9:r,ip:10:r,ip:11:r,ip:12:r,ip:13:r,ip:14:r,ip:15:r,ip:16:r,ip:17:r",
         "more than 16 entries"},
    };
    dlock_client *c = NULL;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        CHECK_RC(dlock_client_open(&c, bad[i].url, NULL), DLOCK_EINVAL);
        fprintf(stderr, "%s\n", dlock_error_message());
        CHECK_CONTAINS(dlock_error_message(), bad[i].says);
        CHECK(strstr(dlock_error_message(), "SECRETHASH:") == NULL);
    }
}

/* Bad URLs are refused with a message naming what is wrong. */
static void bad_urls(void)
{
    dlock_client *c = NULL;

    CHECK_RC(dlock_client_open(&c, "zk://127.0.0.1:1?session_timeout_ms=abc", NULL),
             DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "session_timeout_ms");
    CHECK_RC(dlock_client_open(&c, "zk://127.0.0.1:1?sesion_timeout_ms=1000", NULL),
             DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "unknown parameter 'sesion_timeout_ms'");
}

/*
 * A reconnect may negotiate a shorter session timeout than the lease was
 * taken under: a standalone server restarted (same data: the session
 * survives) with maxSessionTimeout 10 s, under a lock of 20 s lease in the
 * client's long session (30 s before). After the reconnect the lock is
 * reported lost at the first renewal, rather than renewed for 20 s in a
 * session the server keeps 10 s past the last contact: never a validity
 * beyond the new timeout. On a loaded machine the client may still be
 * between servers when the lease runs out (the C client's pause before a
 * reconnect grows with the session timeout): lost then too.
 */
static void session_timeout_shrinks_on_reconnect(void)
{
    test_zk z;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 20000, 1);
    dlock_stats st = DLOCK_STATS_INIT;
    char cfg[128];
    FILE *f;
    uint64_t renewed, failed;
    int64_t from;

    atomic_store(&test_lost_calls, 0);
    /* Sessions up to 30 s: with the usual hour, the C client did not
     * reconnect within 20 s (its pause before a reconnect grows with the
     * session timeout). */
    test_zk_start(&z, 1, "maxSessionTimeout=30000\n");
    c = open_url(z.url, 2000);
    o.on_lost = test_count_lost;
    CHECK_RC(dlock_acquire(&l, c, "shrink", &o), DLOCK_OK);
    /* A later line of zoo.cfg wins: the restart reads the lower maximum. */
    snprintf(cfg, sizeof(cfg), "%s/m0/zoo.cfg", z.dir);
    CHECK((f = fopen(cfg, "a")) != NULL);
    fprintf(f, "maxSessionTimeout=10000\n");
    fclose(f);
    CHECK_RC(dlock_client_stats(&st, c), DLOCK_OK);
    renewed = st.renewals;
    failed = st.renew_failures;
    from = test_clock_ms(CLOCK_MONOTONIC);
    test_zk_restart(&z, 0);
    /* Until the watchdog has renewed after the reconnect, or lost the lock. */
    for (int i = 0; i < 3000 && !dlock_lock_lost(l); i++) {
        CHECK_RC(dlock_client_stats(&st, c), DLOCK_OK);
        if (st.renewals > renewed)
            break;
        test_sleep_ms(10);
    }
    fprintf(stderr, "renewals after the restart: %llu, lost: %d, valid %lld ms\n",
            (unsigned long long)(st.renewals - renewed), dlock_lock_lost(l),
            (long long)dlock_lock_valid_ms(l));
    CHECK(dlock_lock_lost(l) || dlock_lock_valid_ms(l) <= 10000 + 1);
    CHECK(dlock_lock_lost(l));
    /* on_lost comes from the watchdog's thread just after the lock is seen
     * lost (under TSan, a little after). */
    for (int i = 0; i < 500 && atomic_load(&test_lost_calls) == 0; i++)
        test_sleep_ms(10);
    CHECK(atomic_load(&test_lost_calls) == 1);
    /* While the client is between servers its renewals fail at once: they
     * are tried again once a second (a tenth of the lease, 1 s at most),
     * never in a hot loop that would starve the reconnect. */
    CHECK_RC(dlock_client_stats(&st, c), DLOCK_OK);
    CHECK(st.renew_failures - failed <= (uint64_t)(test_clock_ms(CLOCK_MONOTONIC) - from) / 1000 + 2);
    CHECK_RC(dlock_release(l), DLOCK_ELOST);
    /* A lease within the new timeout is taken and kept as before. The lost
     * lock's node goes when the client, connected again, deletes it, or
     * with the old session (10 s now): wait for it. */
    o.lease_ms = 5000;
    o.wait_ms = 30000;
    o.on_lost = NULL;
    CHECK_RC(dlock_acquire(&l, c, "shrink", &o), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    test_zk_stop(&z);
}

/* ---- renewal: the session, not each node (issue 33) ------------------------ */

static atomic_long renew_calls;

static void count_renew(const dlock_trace_event *ev, void *payload)
{
    (void)payload;
    if (ev->phase == DLOCK_TRACE_END && strcmp(ev->call, "renew") == 0 &&
        ev->result == DLOCK_OK)
        atomic_fetch_add(&renew_calls, 1);
}

/*
 * A renewal confirms the session with one request whatever the number of
 * locks: 40 locks held (lease 1.5 s, renewed every 0.5 s in one batch),
 * once their watches are set, cost the server a few dozen bytes per
 * renewal, where a check per lock (the multi of before) sent ~85 bytes per
 * lock, 3.4 KB per renewal.
 */
static void renewal_is_one_request(void)
{
    enum { LOCKS = 40 };
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_acquire_options o = test_opts(0, 1500, 1);
    dlock_client *c = NULL;
    dlock_lock *locks[LOCKS];
    long long b0, b1;
    long calls;
    test_zk z;

    test_zk_start(&z, 1, NULL);
    co.trace = count_renew;
    co.log = log_stderr;
    CHECK_RC(dlock_client_open(&c, z.url, &co), DLOCK_OK);
    o.on_lost = test_count_lost;
    atomic_store(&test_lost_calls, 0);
    for (int i = 0; i < LOCKS; i++) {
        char name[16];
        snprintf(name, sizeof(name), "one%d", i);
        CHECK_RC(dlock_acquire(&locks[i], c, name, &o), DLOCK_OK);
    }
    /* The first renewal sets each node's watch (one exists per lock, once). */
    test_sleep_ms(1200);
    b0 = test_zk_mntr(&z, 0, "zk_bytes_received_count");
    atomic_store(&renew_calls, 0);
    test_sleep_ms(2000);
    calls = atomic_load(&renew_calls);
    b1 = test_zk_mntr(&z, 0, "zk_bytes_received_count");
    fprintf(stderr, "%ld renewals of %d locks: %lld bytes to the server\n", calls, LOCKS,
            b1 - b0);
    CHECK(b0 >= 0 && b1 >= b0);
    CHECK(calls >= 3);
    CHECK(b1 - b0 < calls * 200); /* one request each (and the session's pings) */
    for (int i = 0; i < LOCKS; i++) {
        CHECK(!dlock_lock_lost(locks[i]));
        CHECK_RC(dlock_release(locks[i]), DLOCK_OK);
    }
    CHECK(atomic_load(&test_lost_calls) == 0);
    dlock_client_free(c);
    test_zk_stop(&z);
}

/*
 * Waiters cost the server little (issue 33: 10,000 waiters on one client).
 * A try that finds the lock held makes no node (one read, where a create
 * and a delete were two writes and a watch event for the queue): the
 * directory's children version stays. And a waiter that wins sets its
 * node's watch as it takes the lock, so that the first renewal of 20
 * locks taken together is a sync, not 20 exists sent by the watchdog.
 */
enum { LIGHT_WAITERS = 20 };

typedef struct {
    dlock_client *c;
    int i;
    dlock_lock *l;
    int rc;
} light_waiter;

static void *light_wait(void *arg)
{
    light_waiter *w = arg;
    dlock_acquire_options o = test_opts(20000, 1500, 1);
    char name[16];

    o.on_lost = test_count_lost;
    snprintf(name, sizeof(name), "light%d", w->i);
    w->rc = dlock_acquire(&w->l, w->c, name, &o);
    return NULL;
}

static void waiters_queue_lightly(void)
{
    dlock_acquire_options o = test_opts(0, 1500, 1);
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_client *holder, *c = NULL;
    dlock_lock *held[LIGHT_WAITERS], *l = NULL;
    light_waiter w[LIGHT_WAITERS];
    pthread_t t[LIGHT_WAITERS];
    struct Stat st0, st1;
    zhandle_t *zh;
    long long b0, b1;
    long calls;
    test_zk z;

    test_zk_start(&z, 1, NULL);
    holder = open_url(z.url, 5000);
    co.trace = count_renew;
    co.log = log_stderr;
    CHECK_RC(dlock_client_open(&c, z.url, &co), DLOCK_OK);
    atomic_store(&test_lost_calls, 0);
    for (int i = 0; i < LIGHT_WAITERS; i++) {
        char name[16];
        snprintf(name, sizeof(name), "light%d", i);
        CHECK_RC(dlock_acquire(&held[i], holder, name, &o), DLOCK_OK);
    }
    /* A try-once that finds the lock busy leaves nothing behind. */
    CHECK_RC(dlock_acquire(&l, c, "light0", &o), DLOCK_EBUSY);
    CHECK(test_zk_children(&z, "/dlock/light0") == 1);
    zh = raw_open(&z, NULL);
    CHECK_RC(zoo_exists(zh, "/dlock/light0", 0, &st0), ZOK);

    for (int i = 0; i < LIGHT_WAITERS; i++) {
        w[i] = (light_waiter){c, i, NULL, DLOCK_EPROTO};
        CHECK(pthread_create(&t[i], NULL, light_wait, &w[i]) == 0);
    }
    for (int i = 0; i < 200; i++) {
        dlock_stats st = DLOCK_STATS_INIT;
        CHECK_RC(dlock_client_stats(&st, c), DLOCK_OK);
        if (st.busy >= LIGHT_WAITERS + 1) /* each: its queued try */
            break;
        test_sleep_ms(20);
    }
    test_sleep_ms(200);
    /* Each waiter joined its queue with one write, its node: no try's
     * create and delete before it (DLOCK_CAP_QUEUE_FIRST). */
    CHECK_RC(zoo_exists(zh, "/dlock/light0", 0, &st1), ZOK);
    fprintf(stderr, "a waiter queueing: children version %d -> %d\n", st0.cversion, st1.cversion);
    CHECK(st1.cversion == st0.cversion + 1);
    CHECK(test_zk_children(&z, "/dlock/light0") == 2);
    zookeeper_close(zh);
    for (int i = 0; i < LIGHT_WAITERS; i++)
        CHECK_RC(dlock_release(held[i]), DLOCK_OK);
    for (int i = 0; i < LIGHT_WAITERS; i++) {
        CHECK(pthread_join(t[i], NULL) == 0);
        CHECK_RC(w[i].rc, DLOCK_OK);
    }
    dlock_client_free(holder);
    /* Taken within a few ms of each other: their first renewal (a third of
     * the lease on) is one batch. */
    b0 = test_zk_mntr(&z, 0, "zk_bytes_received_count");
    atomic_store(&renew_calls, 0);
    test_sleep_ms(1200);
    calls = atomic_load(&renew_calls);
    b1 = test_zk_mntr(&z, 0, "zk_bytes_received_count");
    fprintf(stderr, "%ld renewals of %d locks just taken by waiters: %lld bytes to the server\n",
            calls, LIGHT_WAITERS, b1 - b0);
    CHECK(b0 >= 0 && b1 >= b0);
    CHECK(calls >= 2);
    CHECK(b1 - b0 < calls * 200); /* one request each (and the session's pings) */
    for (int i = 0; i < LIGHT_WAITERS; i++) {
        CHECK(!dlock_lock_lost(w[i].l));
        CHECK_RC(dlock_release(w[i].l), DLOCK_OK);
    }
    CHECK(atomic_load(&test_lost_calls) == 0);
    dlock_client_free(c);
    test_zk_stop(&z);
}

/* Reads and writes the server answered (the test server's requests). */
static long long zk_requests(test_zk *z)
{
    return test_zk_mntr(z, 0, "zk_cnt_readlatency") + test_zk_mntr(z, 0, "zk_cnt_updatelatency");
}

/*
 * An uncontended cycle costs the server what one of Curator's
 * InterProcessMutex does: a create and a list to acquire, a delete to
 * release, whether the acquisition would wait or not. The list is sent
 * right behind the create (one round trip, where Curator waits for the
 * create's reply first), and nothing is read before the create: 4 requests
 * a cycle before, when a try looked at the queue first.
 */
static void cycle_is_curators_requests(void)
{
    enum { CYCLES = 100 };
    test_zk z;
    dlock_client *c;

    test_zk_start(&z, 1, NULL);
    c = open_url(z.url, 5000);
    for (int waits = 0; waits < 2; waits++) {
        dlock_acquire_options o = test_opts(waits ? 5000 : 0, 10000, 0);
        dlock_lock *l;
        long long r0, r1;

        /* The first makes the lock's directory. */
        CHECK_RC(dlock_acquire(&l, c, "cycle", &o), DLOCK_OK);
        CHECK_RC(dlock_release(l), DLOCK_OK);
        r0 = zk_requests(&z);
        for (int i = 0; i < CYCLES; i++) {
            CHECK_RC(dlock_acquire(&l, c, "cycle", &o), DLOCK_OK);
            CHECK_RC(dlock_release(l), DLOCK_OK);
        }
        r1 = zk_requests(&z);
        fprintf(stderr, "%d cycles (%s): %lld requests\n", CYCLES,
                waits ? "waiting acquisitions" : "try-once", r1 - r0);
        CHECK(r0 >= 0 && r1 - r0 >= 3 * CYCLES);
        CHECK(r1 - r0 <= 3 * CYCLES + CYCLES / 10); /* and the session's pings */
    }
    dlock_client_free(c);
    test_zk_stop(&z);
}

/*
 * An operator deletes a held node behind the holder's back (zkCli's
 * delete, or dlock_force_release from another process): the node's watch
 * tells the holder, whose next renewal reports the lock lost, within a
 * renewal period, though the session lives on. Each of three locks is
 * deleted at a time of its own: before its first renewal (no watch yet:
 * that renewal's exists finds it gone), after it (the watch tells), and
 * after the lease was extended (the data change ended the watch, set
 * again at the next renewal).
 */
static void deleted_node_is_lost(void)
{
    test_zk z;
    dlock_client *c;
    dlock_acquire_options o = test_opts(0, 1500, 1);
    dlock_lock *l[3], *keep;
    zhandle_t *zh;
    char names[4][128], path[256];

    test_zk_start(&z, 1, NULL);
    c = open_url(z.url, 5000);
    o.on_lost = test_count_lost;
    atomic_store(&test_lost_calls, 0);
    CHECK_RC(dlock_acquire(&keep, c, "del-keep", &o), DLOCK_OK);
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof(name), "del%d", i);
        CHECK_RC(dlock_acquire(&l[i], c, name, &o), DLOCK_OK);
    }
    zh = raw_open(&z, NULL);
    /* 0: before any renewal. */
    CHECK(test_zk_child_names(&z, "/dlock/del0", names, 4) == 1);
    snprintf(path, sizeof(path), "/dlock/del0/%s", names[0]);
    CHECK_RC(zoo_delete(zh, path, -1), ZOK);
    /* 1: after two renewals (its watch set). */
    test_sleep_ms(1100);
    CHECK(!dlock_lock_lost(l[1]) && !dlock_lock_lost(l[2]));
    CHECK(test_zk_child_names(&z, "/dlock/del1", names, 4) == 1);
    snprintf(path, sizeof(path), "/dlock/del1/%s", names[0]);
    CHECK_RC(zoo_delete(zh, path, -1), ZOK);
    /* 2: extended (a data change, which ends its watch), then deleted
     * before the next renewal could set it again. */
    CHECK_RC(dlock_lock_extend(l[2], 1500), DLOCK_OK);
    CHECK(test_zk_child_names(&z, "/dlock/del2", names, 4) == 1);
    snprintf(path, sizeof(path), "/dlock/del2/%s", names[0]);
    CHECK_RC(zoo_delete(zh, path, -1), ZOK);
    /* Reported within a renewal period (0.5 s) and some slack. */
    for (int t = 0; t < 40 && atomic_load(&test_lost_calls) < 3; t++)
        test_sleep_ms(50);
    for (int i = 0; i < 3; i++) {
        CHECK(dlock_lock_lost(l[i]));
        CHECK_RC(dlock_release(l[i]), DLOCK_ELOST);
    }
    CHECK(atomic_load(&test_lost_calls) == 3);
    /* The session and the other lock live on. */
    CHECK(!dlock_lock_lost(keep));
    CHECK_RC(dlock_lock_check(keep), DLOCK_OK);
    CHECK_RC(dlock_release(keep), DLOCK_OK);
    zookeeper_close(zh);
    dlock_client_free(c);
    test_zk_stop(&z);
}

TEST_MAIN({"curator_node_names", curator_node_names, NULL},
          {"session_timeout_shrinks_on_reconnect", session_timeout_shrinks_on_reconnect,
           "watchdog"},
          {"lost_create_reply", lost_create_reply, NULL},
          {"lost_create_reply_found_again", lost_create_reply_found_again, NULL},
          {"sigstop_holder", sigstop_holder, "watchdog"},
          {"killed_waiter_leaves_queue", killed_waiter_leaves_queue, NULL},
          {"killed_waiter_child", killed_waiter_child, TEST_CHILD},
          {"ensemble_member_and_leader_killed", ensemble_member_and_leader_killed, "ensemble"},
          {"reentrant_by_owner", reentrant_by_owner, "watchdog"},
          {"bad_urls", bad_urls, NULL},
          {"renewal_is_one_request", renewal_is_one_request, "watchdog"},
          {"waiters_queue_lightly", waiters_queue_lightly, NULL},
          {"cycle_is_curators_requests", cycle_is_curators_requests, NULL},
          {"deleted_node_is_lost", deleted_node_is_lost, "watchdog"},
          {"acl_holder_node_protected", acl_holder_node_protected, NULL},
          {"acl_open_prefix_refused", acl_open_prefix_refused, NULL},
          {"acl_every_node_kind", acl_every_node_kind, NULL},
          {"acl_option_adds_identities", acl_option_adds_identities, NULL},
          {"acl_option_errors", acl_option_errors, NULL})
