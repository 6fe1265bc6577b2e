/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The core scenarios of issue 2, which every backend must pass: one suite,
 * run once per backend (`test_core redis CASE`, `test_core etcd CASE`). The
 * server is seen only through test_server (tests/support), so a new backend
 * is one more starter there and one more list in tests/CMakeLists.txt.
 *
 * What only one backend has (Redis' command counts per hand-off, etcd's
 * queue keys and clusters) stays in integration/redis and integration/etcd.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dlock/async.h"
#include "dlock/sys/backend.h"
#include "test.h"

static const char *backend; /* argv[1] */

/* ---- the asynchronous API's driver ---------------------------------------
 *
 * `test_core async:BACKEND CASE` runs the case with its acquisitions,
 * releases and extensions made through include/dlock/async.h (issue 30): a
 * loop thread, as an event-loop program has, polls the descriptors of the
 * clients the case opened and runs dlock_async_process; a caller starts its
 * request and sleeps until the callback, run on the loop thread, has
 * answered. One mutex makes the calls of async.h one thread's at a time, as
 * the header asks. Calls from the loop thread itself (an on_lost that
 * releases) and on a lock whose client is gone use the blocking calls. A
 * forked child starts a loop of its own at its first call. The loop starts
 * with the first call, not before: a case that forks does so before it
 * makes one (TSan does not follow a fork of a process with threads). */

static int via_async;
/* `test_core nothreads:BACKEND CASE`: the same, every client opened with
 * DLOCK_CLIENT_NO_THREADS, so that the loop thread renews its locks too;
 * the calls the asynchronous API does not serve so (the family's kinds)
 * are made blocking, beside the loop. */
static int via_nothreads;

#define DRIVER_CLIENTS 16
static pthread_mutex_t driver_start_mu = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int driver_is_loop;
static struct {
    _Atomic pid_t pid; /* the process that started the loop thread */
    pthread_mutex_t mu;
    pthread_cond_t answered;
    pthread_t loop;
    dlock_client *clients[DRIVER_CLIENTS];
} drv;

typedef struct {
    int done, rc;
    dlock_lock *lock;
    char msg[512];
} driver_call;

static void driver_acquired(int rc, dlock_lock *lock, void *arg)
{
    driver_call *k = arg;

    k->rc = rc;
    k->lock = lock;
    snprintf(k->msg, sizeof(k->msg), "%s", dlock_error_message());
    k->done = 1;
    pthread_cond_broadcast(&drv.answered);
}

static void driver_done(int rc, void *arg)
{
    driver_acquired(rc, NULL, arg);
}

/* The loop: poll every client's descriptor, process the readable ones. The
 * mutex is held while it polls, for at most a millisecond at a time. */
static void *driver_loop(void *arg)
{
    (void)arg;
    driver_is_loop = 1;
    for (;;) {
        struct pollfd p[DRIVER_CLIENTS];
        dlock_client *who[DRIVER_CLIENTS];
        int n = 0;

        pthread_mutex_lock(&drv.mu);
        for (int i = 0; i < DRIVER_CLIENTS; i++) {
            if (drv.clients[i] == NULL)
                continue;
            p[n].fd = dlock_async_fd(drv.clients[i]);
            p[n].events = POLLIN;
            p[n].revents = 0;
            who[n++] = drv.clients[i];
        }
        /* Readable, or its timeout come (what it sent itself fails then). */
        poll(p, (nfds_t)n, 1);
        for (int i = 0; i < n; i++)
            if (p[i].revents != 0 || dlock_async_timeout_ms(who[i]) == 0)
                CHECK(dlock_async_process(who[i]) >= 0);
        pthread_mutex_unlock(&drv.mu);
        usleep(100); /* let the callers have the mutex */
    }
    return NULL;
}

static void driver_start(void)
{
    pthread_mutex_lock(&driver_start_mu);
    if (drv.pid != getpid()) {
        /* A forked child's copy is its parent's: start afresh. */
        memset(drv.clients, 0, sizeof(drv.clients));
        CHECK(pthread_mutex_init(&drv.mu, NULL) == 0);
        CHECK(pthread_cond_init(&drv.answered, NULL) == 0);
        CHECK(pthread_create(&drv.loop, NULL, driver_loop, NULL) == 0);
        CHECK(pthread_detach(drv.loop) == 0);
        drv.pid = getpid();
    }
    pthread_mutex_unlock(&driver_start_mu);
}

static int on_loop_thread(void)
{
    return driver_is_loop;
}

/* Watch c's descriptor (drv.mu held). */
static void driver_watch(dlock_client *c)
{
    int free_slot = -1;

    for (int i = 0; i < DRIVER_CLIENTS; i++) {
        if (drv.clients[i] == c)
            return;
        if (drv.clients[i] == NULL && free_slot < 0)
            free_slot = i;
    }
    CHECK(free_slot >= 0);
    drv.clients[free_slot] = c;
}

/* Wait for the callback (drv.mu held), and give its message to this thread. */
static int driver_wait(driver_call *k)
{
    while (!k->done)
        pthread_cond_wait(&drv.answered, &drv.mu);
    pthread_mutex_unlock(&drv.mu);
    if (k->rc != DLOCK_OK)
        dlock_backend_fail(k->rc, "%s", k->msg);
    return k->rc;
}

static int core_acquire(dlock_lock **out, dlock_client *c, const char *name,
                        const dlock_acquire_options *o)
{
    driver_call k = {0};
    int rc;

    if (!via_async || on_loop_thread() || out == NULL || c == NULL)
        return dlock_acquire(out, c, name, o);
    driver_start();
    if (via_nothreads && o != NULL && (o->kind != DLOCK_KIND_MUTEX || o->owner != NULL)) {
        pthread_mutex_lock(&drv.mu);
        driver_watch(c); /* renewed by the loop */
        pthread_mutex_unlock(&drv.mu);
        return dlock_acquire(out, c, name, o);
    }
    *out = NULL;
    pthread_mutex_lock(&drv.mu);
    driver_watch(c);
    if ((rc = dlock_acquire_async(NULL, c, name, o, driver_acquired, &k)) != DLOCK_OK) {
        pthread_mutex_unlock(&drv.mu);
        return rc;
    }
    rc = driver_wait(&k);
    *out = k.lock;
    return rc;
}

static int core_release(dlock_lock *l)
{
    driver_call k = {0};
    int rc;

    if (!via_async || on_loop_thread() || l == NULL || drv.pid != getpid())
        return dlock_release(l);
    pthread_mutex_lock(&drv.mu);
    if ((rc = dlock_release_async(NULL, l, driver_done, &k)) != DLOCK_OK) {
        pthread_mutex_unlock(&drv.mu);
        if (rc == DLOCK_ENOTSUP && via_nothreads)
            return dlock_release(l); /* a kind served blocking only */
        return rc; /* a lock whose client is gone: released and freed */
    }
    return driver_wait(&k);
}

static int core_extend(dlock_lock *l, int64_t lease_ms)
{
    driver_call k = {0};
    int rc;

    if (!via_async || on_loop_thread() || l == NULL || drv.pid != getpid())
        return dlock_lock_extend(l, lease_ms);
    pthread_mutex_lock(&drv.mu);
    if ((rc = dlock_extend_async(NULL, l, lease_ms, driver_done, &k)) != DLOCK_OK) {
        pthread_mutex_unlock(&drv.mu);
        if (rc == DLOCK_ENOTSUP && via_nothreads)
            return dlock_lock_extend(l, lease_ms);
        return rc;
    }
    return driver_wait(&k);
}

static void core_client_free(dlock_client *c)
{
    if (via_async && drv.pid == getpid() && !on_loop_thread()) {
        pthread_mutex_lock(&drv.mu);
        for (int i = 0; i < DRIVER_CLIENTS; i++)
            if (drv.clients[i] == c)
                drv.clients[i] = NULL;
        dlock_client_free(c);
        pthread_mutex_unlock(&drv.mu);
        return;
    }
    dlock_client_free(c);
}

#define dlock_acquire core_acquire
#define dlock_release core_release
#define dlock_lock_extend core_extend
#define dlock_client_free core_client_free

static dlock_client *open_client(const test_server *s)
{
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_client *c = NULL;

    co.flags = via_nothreads ? DLOCK_CLIENT_NO_THREADS : 0;
    CHECK_RC(dlock_client_open(&c, s->url, &co), DLOCK_OK);
    CHECK(c != NULL);
    CHECK(strcmp(dlock_client_backend(c), s->backend) == 0);
    return c;
}

/* The fence after prev: the next integer where fences are dense, else any
 * larger one. */
static int fence_follows(const test_server *s, uint64_t prev, uint64_t fence)
{
    return s->dense_fences ? fence == prev + 1 : fence > prev;
}

/* ---------------------------------------------------------------------- */

static void basic_cycle(void)
{
    test_server s;
    dlock_client *c;
    dlock_lock *a, *b = (dlock_lock *)1;
    dlock_lock_info info;
    dlock_acquire_options o = test_opts(0, 5000, 1);
    uint64_t first;

    test_server_start(&s, backend);
    c = open_client(&s);
    CHECK_RC(dlock_acquire(&a, c, "job", &o), DLOCK_OK);
    first = dlock_lock_fence(a);
    CHECK(s.dense_fences ? first == 1 : first > 0);
    CHECK(strcmp(dlock_lock_name(a), "job") == 0);
    CHECK(!dlock_lock_lost(a));
    CHECK(dlock_lock_valid_ms(a) > 0 && dlock_lock_valid_ms(a) <= 5000);
    CHECK(test_server_held(&s, "job"));
    CHECK_RC(dlock_acquire(&b, c, "job", &o), DLOCK_EBUSY);
    CHECK(b == NULL);
    CHECK_CONTAINS(dlock_error_message(), "'job' is held by another owner");
    CHECK_RC(dlock_status(&info, c, "job"), DLOCK_OK);
    CHECK(info.held == 1 && info.fence == first && info.ttl_ms > 0 && info.ttl_ms <= 5000);
    CHECK_RC(dlock_lock_check(a), DLOCK_OK);
    CHECK_RC(dlock_lock_extend(a, 8000), DLOCK_OK);
    CHECK_RC(dlock_status(&info, c, "job"), DLOCK_OK);
    CHECK(info.held == 1 && info.fence == first && info.ttl_ms > 5000);
    CHECK_RC(dlock_lock_check(a), DLOCK_OK);
    CHECK_RC(dlock_release(a), DLOCK_OK);
    CHECK(test_server_leftovers(&s, "job") == 0);
    CHECK_RC(dlock_status(&info, c, "job"), DLOCK_OK);
    CHECK(info.held == 0 && info.ttl_ms == 0);
    CHECK_RC(dlock_acquire(&a, c, "job", &o), DLOCK_OK);
    CHECK(fence_follows(&s, first, dlock_lock_fence(a)));
    CHECK_RC(dlock_release(a), DLOCK_OK);

    /* Names with '/', braces and odd bytes are kept apart. */
    o = test_opts(0, 2000, 0);
    CHECK_RC(dlock_acquire(&a, c, "a", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&b, c, "a/b", &o), DLOCK_OK);
    CHECK_RC(dlock_status(&info, c, "a/b"), DLOCK_OK);
    CHECK(info.held && info.fence == dlock_lock_fence(b));
    CHECK_RC(dlock_release(a), DLOCK_OK);
    CHECK_RC(dlock_release(b), DLOCK_OK);
    CHECK_RC(dlock_acquire(&a, c, "x y\x01\xff%{}", &o), DLOCK_OK);
    CHECK_RC(dlock_release(a), DLOCK_OK);
    dlock_client_free(c);
    test_server_stop(&s);
}

/* Several processes do a non-atomic read-modify-write of a counter in a
 * file under the lock; any overlap loses an increment. */
static void mutual_exclusion_processes(void)
{
    enum { PROCS = 5, ITERS = 40 };
    test_server s;
    char path[] = "/tmp/dlock-counter-XXXXXX";
    int fd = mkstemp(path);
    pid_t pids[PROCS];
    long total;

    CHECK(fd >= 0);
    CHECK(write(fd, "0", 1) == 1);
    close(fd);
    test_server_start(&s, backend);
    for (int p = 0; p < PROCS; p++) {
        pids[p] = fork();
        CHECK(pids[p] >= 0);
        if (pids[p] == 0) {
            dlock_client *c = open_client(&s);
            dlock_acquire_options o = test_opts(DLOCK_WAIT_FOREVER, 5000, 1);
            for (int i = 0; i < ITERS; i++) {
                dlock_lock *l;
                char buf[32] = {0};
                long v;
                int f;
                CHECK_RC(dlock_acquire(&l, c, "counter", &o), DLOCK_OK);
                f = open(path, O_RDWR);
                CHECK(f >= 0 && read(f, buf, sizeof(buf) - 1) > 0);
                v = atol(buf);
                usleep(200); /* widen the race window */
                snprintf(buf, sizeof(buf), "%ld", v + 1);
                CHECK(pwrite(f, buf, strlen(buf), 0) == (ssize_t)strlen(buf));
                close(f);
                CHECK_RC(dlock_release(l), DLOCK_OK);
            }
            dlock_client_free(c);
            _exit(0);
        }
    }
    for (int p = 0; p < PROCS; p++)
        test_wait_child_ok(pids[p]);
    {
        char buf[32] = {0};
        int f = open(path, O_RDONLY);
        CHECK(f >= 0 && read(f, buf, sizeof(buf) - 1) > 0);
        close(f);
        total = atol(buf);
    }
    unlink(path);
    if (total != PROCS * ITERS) {
        fprintf(stderr, "counter is %ld, wanted %d: two holders overlapped\n", total,
                PROCS * ITERS);
        exit(1);
    }
    CHECK(test_server_leftovers(&s, "counter") == 0); /* no waiter left anything */
    test_server_stop(&s);
}

/* Fences strictly increase in the order the lock is held, across processes
 * (each holder compares its fence with the last one written under the
 * lock), and no fence is issued twice; where fences are dense, every one of
 * 1..N is issued exactly once. */
static void fences_strictly_increase(void)
{
    enum { PROCS = 4, ITERS = 150 };
    test_server s;
    uint64_t *shared;
    pid_t pids[PROCS];

    test_server_start(&s, backend);
    shared = mmap(NULL, sizeof(uint64_t) * (1 + PROCS * ITERS), PROT_READ | PROT_WRITE,
                  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(shared != MAP_FAILED);
    for (int p = 0; p < PROCS; p++) {
        pids[p] = fork();
        if (pids[p] == 0) {
            dlock_client *c = open_client(&s);
            dlock_acquire_options o = test_opts(DLOCK_WAIT_FOREVER, 5000, 0);
            for (int i = 0; i < ITERS; i++) {
                dlock_lock *l;
                uint64_t f;
                CHECK_RC(dlock_acquire(&l, c, "fenced", &o), DLOCK_OK);
                f = dlock_lock_fence(l);
                /* shared[0]: the last holder's fence (written under the lock) */
                CHECK(f > __atomic_load_n(&shared[0], __ATOMIC_SEQ_CST));
                __atomic_store_n(&shared[0], f, __ATOMIC_SEQ_CST);
                shared[1 + p * ITERS + i] = f;
                CHECK_RC(dlock_release(l), DLOCK_OK);
            }
            dlock_client_free(c);
            _exit(0);
        }
    }
    for (int p = 0; p < PROCS; p++)
        test_wait_child_ok(pids[p]);
    for (int i = 0; i < PROCS * ITERS; i++) {
        CHECK(!s.dense_fences || (shared[1 + i] >= 1 && shared[1 + i] <= PROCS * ITERS));
        for (int j = i + 1; j < PROCS * ITERS; j++)
            CHECK(shared[1 + i] != shared[1 + j]);
    }
    munmap(shared, sizeof(uint64_t) * (1 + PROCS * ITERS));
    test_server_stop(&s);
}

/* Wait until the server holds name for nobody (a lease ran out), up to 10 s. */
static void wait_not_held(test_server *s, const char *name)
{
    for (int i = 0; i < 500 && test_server_held(s, name); i++)
        test_sleep_ms(20);
    CHECK(!test_server_held(s, name));
}

/* The backends that serve owner ids (DLOCK_CAP_OWNER_IDS): all but MySQL's
 * named mode and the out-of-tree plainredis. */
static int serves_owner_ids(const test_server *s)
{
    return strcmp(s->backend, "plainredis") != 0 &&
           !(strcmp(s->backend, "mysql") == 0 && s->sql_named);
}

/* Owner ids: the same owner re-enters from another client with the same
 * fence; without reentrant it is told at once (DLOCK_EMISUSE); another
 * owner, and no owner, are kept out until the owner's last release; the
 * next holder's fence is higher. A backend without owner ids refuses them
 * with DLOCK_ENOTSUP, naming them. */
static void owner_reentry(void)
{
    test_server s;
    dlock_client *c1, *c2;
    dlock_lock *a, *b, *x = NULL;
    dlock_acquire_options o, other;
    uint64_t fence;

    test_server_start(&s, backend);
    o = test_opts(0, 5000, 1);
    other = test_opts(0, 5000, 1);
    o.owner = "worker-1";
    o.reentrant = 1;
    c1 = open_client(&s);
    c2 = open_client(&s);
    if (!serves_owner_ids(&s)) {
        CHECK_RC(dlock_acquire(&a, c1, "own", &o), DLOCK_ENOTSUP);
        CHECK_CONTAINS(dlock_error_message(), "owner ids");
        goto out;
    }
    CHECK_RC(dlock_acquire(&a, c1, "own", &o), DLOCK_OK);
    fence = dlock_lock_fence(a);
    CHECK_RC(dlock_acquire(&b, c2, "own", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(b) == fence);
    o.reentrant = 0;
    CHECK_RC(dlock_acquire(&x, c2, "own", &o), DLOCK_EMISUSE);
    CHECK_CONTAINS(dlock_error_message(), "reentrant");
    CHECK_RC(dlock_acquire(&x, c2, "own", &other), DLOCK_EBUSY);
    other.owner = "worker-2";
    other.reentrant = 1;
    CHECK_RC(dlock_acquire(&x, c2, "own", &other), DLOCK_EBUSY);
    CHECK_RC(dlock_release(a), DLOCK_OK);
    CHECK_RC(dlock_acquire(&x, c2, "own", &other), DLOCK_EBUSY);
    CHECK_RC(dlock_lock_check(b), DLOCK_OK);
    CHECK_RC(dlock_release(b), DLOCK_OK);
    CHECK_RC(dlock_acquire(&x, c2, "own", &other), DLOCK_OK);
    CHECK(dlock_lock_fence(x) > fence);
    CHECK_RC(dlock_release(x), DLOCK_OK);
out:
    dlock_client_free(c1);
    dlock_client_free(c2);
    test_server_stop(&s);
}

/* The backends that serve nested reads: Redis in every mode and etcd.
 * ZooKeeper's read-write lock ignores owner ids (docs/zookeeper.md, as
 * Curator's), so its nested read waits for the writer; the others serve no
 * read-write lock. */
static int serves_nested_reads(const test_server *s)
{
    return strncmp(s->backend, "redis", 5) == 0 || strcmp(s->backend, "rediss") == 0 ||
           strcmp(s->backend, "etcd") == 0 || strcmp(s->backend, "postgres") == 0 ||
           (strcmp(s->backend, "mysql") == 0 && !s->sql_named);
}

typedef struct {
    dlock_client *c;
    atomic_int *reading; /* 1 while the owner's nested read is held */
    atomic_int done, overlap;
    int rc;
    dlock_lock *lock;
    uint64_t fence;
} nested_writer;

static void *nested_writer_main(void *p)
{
    nested_writer *w = p;
    dlock_acquire_options o = test_opts(20000, 5000, 0);

    o.kind = DLOCK_KIND_WRITE;
    w->rc = dlock_acquire(&w->lock, w->c, "nest", &o);
    if (w->rc == DLOCK_OK && atomic_load(w->reading))
        atomic_store(&w->overlap, 1);
    atomic_store(&w->done, 1);
    return NULL;
}

/*
 * Nested reads: an owner id that reads reads again while a writer waits
 * behind its first read, and is let in (another owner's read is not:
 * writer preference); the writer stays out while either read is held,
 * the first released before the nested one, and gets in after both, with
 * a higher fence.
 */
static void rw_nested_read(void)
{
    test_server s;
    dlock_client *c1, *c2;
    dlock_acquire_options ro = test_opts(0, 5000, 1), other;
    dlock_lock *r1, *r2, *x = NULL;
    nested_writer w = {0};
    atomic_int reading = 0;
    pthread_t t;
    int busy = 0;

    test_server_start(&s, backend);
    c1 = open_client(&s);
    c2 = open_client(&s);
    ro.kind = DLOCK_KIND_READ;
    ro.owner = "alice";
    other = ro;
    other.owner = NULL;
    if (!serves_nested_reads(&s)) {
        CHECK_RC(dlock_acquire(&r1, c1, "nest", &ro),
                 strcmp(s.backend, "zk") == 0 ? DLOCK_OK : DLOCK_ENOTSUP);
        if (strcmp(s.backend, "zk") == 0)
            CHECK_RC(dlock_release(r1), DLOCK_OK);
        goto out;
    }
    if (via_nothreads) {
        /* A writer's wait keeps a place in the queue, which needs the
         * subscriber's thread: refused, the read untouched. */
        dlock_acquire_options wo = test_opts(2000, 5000, 0);
        wo.kind = DLOCK_KIND_WRITE;
        CHECK_RC(dlock_acquire(&r1, c1, "nest", &ro), DLOCK_OK);
        CHECK_RC(dlock_acquire(&x, c2, "nest", &wo), DLOCK_ENOTSUP);
        CHECK_CONTAINS(dlock_error_message(), "DLOCK_CLIENT_NO_THREADS");
        CHECK(dlock_lock_valid_ms(r1) > 0);
        CHECK_RC(dlock_release(r1), DLOCK_OK);
        goto out;
    }
    CHECK_RC(dlock_acquire(&r1, c1, "nest", &ro), DLOCK_OK);
    w.c = c2;
    w.reading = &reading;
    CHECK(pthread_create(&t, NULL, nested_writer_main, &w) == 0);
    /* The writer waits once another owner's read is kept out. */
    for (int i = 0; i < 1000 && !busy; i++) {
        int rc = dlock_acquire(&x, c2, "nest", &other);
        if (rc == DLOCK_OK)
            CHECK_RC(dlock_release(x), DLOCK_OK);
        busy = rc == DLOCK_EBUSY;
        if (!busy)
            test_sleep_ms(10);
    }
    CHECK(busy);
    CHECK_RC(dlock_acquire(&r2, c1, "nest", &ro), DLOCK_OK);
    atomic_store(&reading, 1);
    CHECK(!atomic_load(&w.done));
    CHECK_RC(dlock_release(r1), DLOCK_OK);
    /* A writer let in now would overlap the nested read: give it time to. */
    test_sleep_ms(300);
    CHECK(!atomic_load(&w.done));
    CHECK_RC(dlock_lock_check(r2), DLOCK_OK);
    atomic_store(&reading, 0);
    w.fence = dlock_lock_fence(r2);
    CHECK_RC(dlock_release(r2), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(w.rc, DLOCK_OK);
    CHECK(!atomic_load(&w.overlap));
    CHECK(dlock_lock_fence(w.lock) > w.fence);
    CHECK_RC(dlock_release(w.lock), DLOCK_OK);
out:
    dlock_client_free(c1);
    dlock_client_free(c2);
    test_server_stop(&s);
}

/* A holder whose lease ran out cannot release the next holder's lock. */
static void release_by_non_owner_refused(void)
{
    test_server s;
    dlock_client *c1, *c2;
    dlock_lock *old, *cur;
    dlock_acquire_options o, w;

    test_server_start(&s, backend);
    o = test_opts(0, s.short_lease_ms, 0);
    w = test_opts(8000, 5000, 1);
    c1 = open_client(&s);
    c2 = open_client(&s);
    CHECK_RC(dlock_acquire(&old, c1, "shared", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&cur, c2, "shared", &w), DLOCK_OK); /* after the lease ran out */
    CHECK(dlock_lock_fence(cur) > dlock_lock_fence(old));
    CHECK(dlock_lock_lost(old));
    CHECK_RC(dlock_lock_extend(old, 5000), DLOCK_ELOST);
    CHECK_RC(dlock_lock_check(old), DLOCK_ELOST);
    CHECK_RC(dlock_release(old), DLOCK_ELOST);
    CHECK_CONTAINS(dlock_error_message(), "no longer ours");
    CHECK(test_server_held(&s, "shared"));
    CHECK_RC(dlock_lock_check(cur), DLOCK_OK);
    CHECK_RC(dlock_release(cur), DLOCK_OK);
    CHECK(test_server_leftovers(&s, "shared") == 0);
    dlock_client_free(c1);
    dlock_client_free(c2);
    test_server_stop(&s);
}

static void expiry_frees_the_lock(void)
{
    test_server s;
    dlock_client *c;
    dlock_lock *a, *b;
    dlock_acquire_options o;

    test_server_start(&s, backend);
    o = test_opts(0, s.short_lease_ms, 0);
    c = open_client(&s);
    CHECK_RC(dlock_acquire(&a, c, "exp", &o), DLOCK_OK);
    /* The client counts the lease from before its request: lost locally no
     * later than on the server. */
    wait_not_held(&s, "exp");
    CHECK(dlock_lock_lost(a));
    CHECK(dlock_lock_valid_ms(a) == 0);
    CHECK_RC(dlock_acquire(&b, c, "exp", &o), DLOCK_OK);
    /* the fence did not go back with the key */
    CHECK(fence_follows(&s, dlock_lock_fence(a), dlock_lock_fence(b)));
    CHECK_RC(dlock_release(a), DLOCK_ELOST);
    CHECK_RC(dlock_release(b), DLOCK_OK);
    CHECK(test_server_leftovers(&s, "exp") == 0);
    dlock_client_free(c);
    test_server_stop(&s);
}

/* The watchdog keeps locks far past their lease, with renewals batched: 20
 * locks renewed one by one every lease/3 would take about 3.5 x 3 x 20
 * requests (on etcd keepalive requests count too: one per lock would be as
 * many). No renewal after release. On Redis Cluster a batch is one script
 * per hash slot, so there the names share a hash tag ({wd}N): one slot, one
 * script (test_cluster.c renews locks spread over the masters). */
static void watchdog_keeps_lock(void)
{
    enum { LOCKS = 20 };
    test_server s;
    dlock_client *c, *other;
    dlock_lock *locks[LOCKS], *b;
    dlock_acquire_options o;
    long long before, renewals;

    atomic_store(&test_lost_calls, 0);
    test_server_start(&s, backend);
    o = test_opts(0, s.short_lease_ms, 1);
    c = open_client(&s);
    other = open_client(&s);
    o.on_lost = test_count_lost;
    const char *wd0 = s.cluster != NULL ? "{wd}0" : "wd0";
    for (int i = 0; i < LOCKS; i++) {
        char name[16];
        snprintf(name, sizeof(name), s.cluster != NULL ? "{wd}%d" : "wd%d", i);
        CHECK_RC(dlock_acquire(&locks[i], c, name, &o), DLOCK_OK);
    }
    before = test_server_requests(&s);
    test_sleep_ms(s.short_lease_ms * 7 / 2);
    renewals = test_server_requests(&s) - before;
    for (int i = 0; i < LOCKS; i++) {
        CHECK(!dlock_lock_lost(locks[i]));
        CHECK_RC(dlock_lock_check(locks[i]), DLOCK_OK);
    }
    CHECK_RC(dlock_acquire(&b, other, wd0, NULL), DLOCK_EBUSY);
    fprintf(stderr, "renewal requests for %d locks over 3.5 leases: %lld\n", LOCKS, renewals);
    CHECK(renewals >= 3);
    CHECK(s.conn_bound || renewals < LOCKS * 2); /* else one statement per lock */
    for (int i = 0; i < LOCKS; i++)
        CHECK_RC(dlock_release(locks[i]), DLOCK_OK);
    CHECK(atomic_load(&test_lost_calls) == 0);
    test_sleep_ms(s.short_lease_ms);
    CHECK(!test_server_held(&s, wd0));
    CHECK(test_server_leftovers(&s, wd0) == 0);
    dlock_client_free(c);
    dlock_client_free(other);
    test_server_stop(&s);
}

/* on_lost fires once when an administrator breaks the lock; extend, check
 * and release report it too. */
static void on_lost_once_after_force_release(void)
{
    test_server s;
    dlock_client *c;
    dlock_lock *l;
    dlock_lock_info removed;
    dlock_acquire_options o;

    atomic_store(&test_lost_calls, 0);
    test_server_start(&s, backend);
    o = test_opts(0, s.short_lease_ms * 3 / 2, 1);
    c = open_client(&s);
    o.on_lost = test_count_lost;
    CHECK_RC(dlock_acquire(&l, c, "victim", &o), DLOCK_OK);
    CHECK_RC(dlock_force_release(&removed, c, "victim"), DLOCK_OK);
    CHECK(removed.held == 1 && removed.fence == dlock_lock_fence(l) && removed.ttl_ms > 0);
    CHECK(!test_server_held(&s, "victim"));
    for (int i = 0; i < 200 && atomic_load(&test_lost_calls) == 0; i++)
        test_sleep_ms(20);
    CHECK(atomic_load(&test_lost_calls) == 1);
    CHECK(atomic_load(&test_lost_reason) == DLOCK_ELOST);
    CHECK(dlock_lock_lost(l));
    CHECK_RC(dlock_lock_check(l), DLOCK_ELOST);
    CHECK_RC(dlock_lock_extend(l, 1000), DLOCK_ELOST);
    test_sleep_ms(s.short_lease_ms); /* more renewal periods: still once */
    CHECK(atomic_load(&test_lost_calls) == 1);
    CHECK_RC(dlock_release(l), DLOCK_ELOST);
    CHECK_RC(dlock_force_release(&removed, c, "victim"), DLOCK_OK);
    CHECK(removed.held == 0);
    dlock_client_free(c);
    test_server_stop(&s);
}

/* A holder frozen past its lease loses the lock to another process; when it
 * resumes, its on_lost fires and its release returns DLOCK_ELOST. */
static int stop_pipe[2];

static void lost_to_pipe(dlock_lock *l, int reason, void *payload)
{
    char ch = (char)(reason == DLOCK_ELOST ? 'L' : 'C');
    (void)l;
    (void)payload;
    if (write(stop_pipe[1], &ch, 1) != 1)
        abort();
}

static void sigstop_holder_loses_lock(void)
{
    test_server s;
    int ready[2];
    pid_t pid;
    uint64_t *shared;

    test_server_start(&s, backend);
    shared = mmap(NULL, sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                  -1, 0);
    CHECK(shared != MAP_FAILED);
    CHECK(pipe(ready) == 0 && pipe(stop_pipe) == 0);
    pid = fork();
    if (pid == 0) {
        dlock_client *c = open_client(&s);
        dlock_lock *l;
        dlock_acquire_options o = test_opts(0, s.short_lease_ms, 1);
        struct pollfd pfd = {stop_pipe[0], POLLIN, 0};
        char why = 0;
        o.on_lost = lost_to_pipe;
        CHECK_RC(dlock_acquire(&l, c, "paused", &o), DLOCK_OK);
        *shared = dlock_lock_fence(l);
        CHECK(write(ready[1], "r", 1) == 1);
        /* The parent freezes us here; after SIGCONT the watchdog must notice:
         * the lock is gone (L), or could not be renewed in time (C). */
        CHECK(poll(&pfd, 1, 30000) == 1);
        CHECK(read(stop_pipe[0], &why, 1) == 1);
        CHECK(why == 'L' || why == 'C');
        CHECK(dlock_lock_lost(l));
        CHECK_RC(dlock_release(l), DLOCK_ELOST);
        dlock_client_free(c);
        _exit(0);
    }
    {
        char byte;
        dlock_client *c;
        dlock_lock *l;
        dlock_acquire_options o = test_opts(15000, 5000, 1);
        CHECK(read(ready[0], &byte, 1) == 1);
        CHECK(kill(pid, SIGSTOP) == 0);
        c = open_client(&s);
        CHECK_RC(dlock_acquire(&l, c, "paused", &o), DLOCK_OK); /* the frozen lease runs out */
        CHECK(fence_follows(&s, *shared, dlock_lock_fence(l)));
        CHECK(kill(pid, SIGCONT) == 0);
        test_wait_child_ok(pid);
        /* The stale holder's release did not touch ours. */
        CHECK_RC(dlock_lock_check(l), DLOCK_OK);
        CHECK_RC(dlock_release(l), DLOCK_OK);
        dlock_client_free(c);
    }
    munmap(shared, sizeof(uint64_t));
    test_server_stop(&s);
}

/*
 * dlock_release reports a lease that ran out by the handle's own deadline
 * as DLOCK_ELOST, whatever the server answers (issue 19, item 1): the holder
 * may have worked while another held the lock. First with the server
 * paused, so that the release times out (it used to return DLOCK_ECONN);
 * no on_lost and no auto_renew, so that nothing but the deadline tells.
 * Then with the server answering and the key still ours there (the handle
 * believes a shorter lease than the server: an extend that failed): the
 * release still deletes the key, so that nothing stays locked, and reports
 * the loss all the same.
 */
static void release_after_deadline_is_lost(void)
{
    test_server s;
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_client *c = NULL;
    dlock_lock *l;
    dlock_acquire_options o;

    test_server_start(&s, backend);
    co.command_timeout_ms = 3000;
    co.flags = via_nothreads ? DLOCK_CLIENT_NO_THREADS : 0;
    CHECK_RC(dlock_client_open(&c, s.url, &co), DLOCK_OK);

    o = test_opts(0, s.short_lease_ms, 0);
    CHECK_RC(dlock_acquire(&l, c, "lapsed", &o), DLOCK_OK);
    test_server_pause(&s, 1);
    while (!dlock_lock_lost(l))
        test_sleep_ms(10);
    CHECK_RC(dlock_release(l), DLOCK_ELOST);
    CHECK_CONTAINS(dlock_error_message(), "ran out");
    test_server_pause(&s, 0);

    o = test_opts(0, 60000, 0);
    CHECK_RC(dlock_acquire(&l, c, "kept", &o), DLOCK_OK);
    test_server_pause(&s, 1);
    /* Fails (times out): the handle keeps the shorter lease, 2 s from
     * the request. The server may apply it when it resumes, 3 s after the
     * request: the key stays there 3 s past the handle's deadline. */
    CHECK(dlock_lock_extend(l, 2000) != DLOCK_OK);
    test_server_pause(&s, 0);
    while (!dlock_lock_lost(l))
        test_sleep_ms(10);
    if (s.conn_bound)
        wait_not_held(&s, "kept"); /* the failed extend closed its connection */
    else if (strcmp(s.backend, "mysql") != 0)
        CHECK(test_server_held(&s, "kept"));
    /* MariaDB runs the late extend when it resumes: 2 s from then, and a
     * fresh connection to a resumed mariadbd can take longer than that
     * (seen in CI at load 2.6), so whether it is still held is not known
     * there. The handle's answers below are what must hold everywhere. */
    CHECK_RC(dlock_release(l), DLOCK_ELOST);
    /* conn_bound: the extend that failed said so ("no longer ours"). */
    CHECK_CONTAINS(dlock_error_message(), s.conn_bound ? "no longer ours" : "ran out");
    CHECK(!test_server_held(&s, "kept"));
    dlock_client_free(c);
    test_server_stop(&s);
}

/* A waiter that gives up leaves nothing behind (no queued key, no hand-off
 * entry, no lease); a try leaves nothing either. */
static void wait_times_out(void)
{
    test_server s;
    dlock_client *c;
    dlock_lock *l, *l2 = (dlock_lock *)1;
    dlock_acquire_options o = test_opts(0, 10000, 1);
    dlock_acquire_options w = test_opts(700, 10000, 1);
    long long held;

    test_server_start(&s, backend);
    c = open_client(&s);
    CHECK_RC(dlock_acquire(&l, c, "busy", &o), DLOCK_OK);
    held = test_server_leftovers(&s, "busy");
    CHECK_RC(dlock_acquire(&l2, c, "busy", &w), DLOCK_ETIMEOUT);
    CHECK(l2 == NULL);
    CHECK_CONTAINS(dlock_error_message(), "after waiting 700 ms");
    CHECK(test_server_leftovers(&s, "busy") == held);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(test_server_leftovers(&s, "busy") == 0);
    dlock_client_free(c);
    test_server_stop(&s);
}

/* dlock_client_interrupt: a waiter gives up at once with DLOCK_EINTR and
 * leaves what a waiter that times out leaves (nothing); later waiting calls
 * on that client fail the same way, while tries and releases still work. */
static void interrupt_leaves_the_queue(void)
{
    test_server s;
    dlock_client *c, *c2;
    dlock_lock *l, *l2 = (dlock_lock *)1;
    test_acquirer a;
    pthread_t t;
    long long held, queued;

    test_server_start(&s, backend);
    c = open_client(&s);
    c2 = open_client(&s);
    dlock_client_interrupt(NULL);
    CHECK_RC(dlock_acquire(&l, c, "intr", NULL), DLOCK_OK);
    held = test_server_leftovers(&s, "intr");
    /* Queued: Redis keeps the waiter's hand-off entry, etcd its key and
     * lease (the first try's lease comes and goes before). */
    queued = held + (via_nothreads ? 0 : s.waiter_leftovers); /* nothreads: a poll */
    /* A lease far longer than the test: only leaving frees the queue. */
    test_acquirer_init(&a, c2, "intr", test_opts(DLOCK_WAIT_FOREVER, 60000, 1));
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &a) == 0);
    for (int i = 0; i < 1000 && test_server_leftovers(&s, "intr") != queued; i++)
        test_sleep_ms(10);
    CHECK(test_server_leftovers(&s, "intr") == queued);
    CHECK(!atomic_load(&a.done));
    dlock_client_interrupt(c2);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(a.rc, DLOCK_EINTR);
    CHECK(a.lock == NULL);
    CHECK(test_server_leftovers(&s, "intr") == held);
    /* For good: a later wait on c2 fails at once, a try still tries. */
    CHECK_RC(dlock_acquire(&l2, c2, "intr", &a.o), DLOCK_EINTR);
    CHECK(l2 == NULL);
    CHECK_CONTAINS(dlock_error_message(), "interrupted");
    CHECK(test_server_leftovers(&s, "intr") == held);
    CHECK_RC(dlock_acquire(&l2, c2, "intr", NULL), DLOCK_EBUSY);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l2, c2, "intr", NULL), DLOCK_OK);
    CHECK_RC(dlock_release(l2), DLOCK_OK);
    CHECK(test_server_leftovers(&s, "intr") == 0);
    dlock_client_free(c);
    dlock_client_free(c2);
    test_server_stop(&s);
}

static void try_once_leaves_nothing(void)
{
    test_server s;
    dlock_client *c, *c2;
    dlock_lock *l, *l2 = (dlock_lock *)1;
    dlock_acquire_options o = test_opts(0, 4000, 1);
    long long held;

    test_server_start(&s, backend);
    c = open_client(&s);
    c2 = open_client(&s);
    CHECK_RC(dlock_acquire(&l, c, "once", &o), DLOCK_OK);
    held = test_server_leftovers(&s, "once");
    for (int i = 0; i < 20; i++) {
        CHECK_RC(dlock_acquire(&l2, c2, "once", &o), DLOCK_EBUSY);
        CHECK(l2 == NULL);
        CHECK_CONTAINS(dlock_error_message(), "lease left");
    }
    CHECK(test_server_leftovers(&s, "once") == held);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l2, c2, "once", &o), DLOCK_OK);
    CHECK_RC(dlock_release(l2), DLOCK_OK);
    CHECK(test_server_leftovers(&s, "once") == 0);
    dlock_client_free(c);
    dlock_client_free(c2);
    test_server_stop(&s);
}

static void client_freed_before_release(void)
{
    test_server s;
    dlock_client *c;
    dlock_lock *l;

    test_server_start(&s, backend);
    c = open_client(&s);
    CHECK_RC(dlock_acquire(&l, c, "orphan", NULL), DLOCK_OK);
    dlock_client_free(c);
    CHECK(dlock_lock_fence(l) > 0);
    CHECK_RC(dlock_release(l), DLOCK_EMISUSE);
    CHECK_CONTAINS(dlock_error_message(), "already freed");
    test_server_stop(&s);
}

/* One client shared by many threads, with the watchdog renewing. */
typedef struct {
    dlock_client *c;
    atomic_long *counter;
    int64_t lease_ms;
} shared_arg;

static void *shared_main(void *p)
{
    shared_arg *a = p;
    dlock_acquire_options o = test_opts(DLOCK_WAIT_FOREVER, a->lease_ms, 1);

    for (int i = 0; i < 30; i++) {
        dlock_lock *l;
        long v;
        CHECK_RC(dlock_acquire(&l, a->c, "threads", &o), DLOCK_OK);
        v = atomic_load_explicit(a->counter, memory_order_relaxed);
        if (i % 10 == 0)
            usleep((useconds_t)(a->lease_ms * 400)); /* the watchdog renews meanwhile */
        CHECK(!dlock_lock_lost(l));
        CHECK(dlock_lock_valid_ms(l) > 0);
        atomic_store_explicit(a->counter, v + 1, memory_order_relaxed);
        CHECK_RC(dlock_release(l), DLOCK_OK);
    }
    return NULL;
}

static void threads_share_a_client(void)
{
    enum { THREADS = 6 };
    test_server s;
    dlock_client *c;
    pthread_t t[THREADS];
    shared_arg a[THREADS];
    atomic_long counter = 0;

    test_server_start(&s, backend);
    c = open_client(&s);
    for (int i = 0; i < THREADS; i++) {
        a[i].c = c;
        a[i].counter = &counter;
        a[i].lease_ms = s.short_lease_ms;
        CHECK(pthread_create(&t[i], NULL, shared_main, &a[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_join(t[i], NULL) == 0);
    CHECK(atomic_load(&counter) == THREADS * 30);
    CHECK(test_server_leftovers(&s, "threads") == 0);
    dlock_client_free(c);
    test_server_stop(&s);
}


/* ---- the operator's view (issue 16) ------------------------------------ */

/* The backends that keep holder records and list locks: Redis, etcd and
 * ZooKeeper and MySQL. Redlock and the out-of-tree backend keep none
 * (docs/redlock.md). */
static int records_holders(const test_server *s)
{
    return strcmp(s->backend, "redis") == 0 || strcmp(s->backend, "etcd") == 0 ||
           strcmp(s->backend, "zk") == 0 || strcmp(s->backend, "mysql") == 0 ||
           (s->pg != NULL && strstr(s->url, "mode=advisory") == NULL); /* postgres lease */
}

typedef struct {
    int n;
    char names[8][32];
    dlock_lock_info info[8];
} listing;

static int collect(const char *name, const dlock_lock_info *info, void *payload)
{
    listing *l = payload;

    if (l->n < 8) {
        snprintf(l->names[l->n], sizeof(l->names[0]), "%s", name);
        l->info[l->n] = *info;
    }
    l->n++;
    return 0;
}

static int listed(const listing *l, const char *name)
{
    for (int i = 0; i < l->n && i < 8; i++)
        if (strcmp(l->names[i], name) == 0)
            return i;
    return -1;
}

static int64_t wall_ms(void)
{
    return test_clock_ms(CLOCK_REALTIME);
}

/* Each acquisition records who holds it; status and list show it. */
static void holder_in_status_and_list(void)
{
    test_server s;
    dlock_client *c, *other;
    dlock_lock *a, *b, *gone;
    dlock_lock_info info;
    dlock_acquire_options o = test_opts(0, 20000, 1);
    char host[256] = "";
    listing l;
    int64_t before = wall_ms(), after;
    int i;

    CHECK(gethostname(host, sizeof(host)) == 0);
    test_server_start(&s, backend);
    c = open_client(&s);
    other = open_client(&s);
    o.label = "nightly backup";
    CHECK_RC(dlock_acquire(&a, c, "ls-a", &o), DLOCK_OK);
    after = wall_ms();
    o.label = NULL;
    CHECK_RC(dlock_acquire(&b, c, "ls-b", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&gone, c, "ls-c", &o), DLOCK_OK);
    CHECK_RC(dlock_release(gone), DLOCK_OK);

    CHECK_RC(dlock_status(&info, other, "ls-a"), DLOCK_OK);
    CHECK(info.held && info.fence == dlock_lock_fence(a) && info.holders == 1);
    /* One holder, also from a backend without a list of holders (the core
     * answers with status). */
    memset(&l, 0, sizeof(l));
    CHECK_RC(dlock_status_holders(other, "ls-a", collect, &l), DLOCK_OK);
    CHECK(l.n == 1 && strcmp(l.names[0], "ls-a") == 0 && l.info[0].held &&
          l.info[0].has_holder == info.has_holder);
    memset(&l, 0, sizeof(l));
    CHECK_RC(dlock_status_holders(other, "ls-c", collect, &l), DLOCK_OK);
    CHECK(l.n == 0);
    CHECK_RC(dlock_status_holders(other, "ls-a", NULL, NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_status_holders(NULL, "ls-a", collect, &l), DLOCK_EINVAL);
    CHECK_RC(dlock_status_holders(other, "", collect, &l), DLOCK_EINVAL);
    if (!records_holders(&s)) {
        /* No record and no listing: status says so, list is not supported. */
        CHECK(!info.has_holder && info.host[0] == '\0' && info.label[0] == '\0');
        memset(&l, 0, sizeof(l));
        CHECK_RC(dlock_list(other, "", collect, &l), DLOCK_ENOTSUP);
        CHECK_CONTAINS(dlock_error_message(), "listing");
        goto out;
    }
    CHECK(info.has_holder);
    CHECK(strcmp(info.host, host) == 0);
    CHECK(info.pid == getpid());
    CHECK(info.start_ms >= before && info.start_ms <= after);
    CHECK(strcmp(info.label, "nightly backup") == 0);
    CHECK_RC(dlock_status(&info, other, "ls-b"), DLOCK_OK);
    CHECK(info.has_holder && info.label[0] == '\0' && info.pid == getpid());
    /* A renewal keeps the record as long as the lock (Redis: its expiry). */
    CHECK_RC(dlock_lock_extend(a, 30000), DLOCK_OK);
    CHECK_RC(dlock_status(&info, other, "ls-a"), DLOCK_OK);
    CHECK(info.has_holder && info.ttl_ms > 20000);
    CHECK_RC(dlock_status(&info, other, "ls-c"), DLOCK_OK);
    CHECK(!info.held && !info.has_holder && info.holders == 0 && info.kind == -1);

    memset(&l, 0, sizeof(l));
    CHECK_RC(dlock_list(other, NULL, collect, &l), DLOCK_OK);
    CHECK(l.n == 2);
    CHECK((i = listed(&l, "ls-a")) >= 0);
    CHECK(l.info[i].held && l.info[i].fence == dlock_lock_fence(a) && l.info[i].ttl_ms > 0 &&
          l.info[i].has_holder && l.info[i].pid == getpid() &&
          strcmp(l.info[i].label, "nightly backup") == 0 && strcmp(l.info[i].host, host) == 0);
    CHECK((i = listed(&l, "ls-b")) >= 0);
    CHECK(l.info[i].fence == dlock_lock_fence(b) && l.info[i].has_holder);
    CHECK(listed(&l, "ls-c") < 0);
    /* A prefix, and one with glob characters that must match as bytes. */
    memset(&l, 0, sizeof(l));
    CHECK_RC(dlock_list(other, "ls-b", collect, &l), DLOCK_OK);
    CHECK(l.n == 1 && listed(&l, "ls-b") == 0);
    memset(&l, 0, sizeof(l));
    CHECK_RC(dlock_list(other, "ls-*", collect, &l), DLOCK_OK);
    CHECK(l.n == 0);

    /* A force release takes the record with the lock. */
    CHECK_RC(dlock_force_release(&info, other, "ls-b"), DLOCK_OK);
    CHECK(info.held && info.has_holder);
    CHECK_RC(dlock_status(&info, other, "ls-b"), DLOCK_OK);
    CHECK(!info.held && !info.has_holder);
out:
    CHECK_RC(dlock_release(a), DLOCK_OK);
    dlock_release(b);
    CHECK(test_server_leftovers(&s, "ls-a") == 0);
    dlock_client_free(c);
    dlock_client_free(other);
    test_server_stop(&s);
}

static uint64_t bucket_sum(const uint64_t *h)
{
    uint64_t n = 0;
    for (int i = 0; i < DLOCK_STATS_BUCKETS; i++)
        n += h[i];
    return n;
}

/* What the log callback received. */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_text[65536];
static int log_levels[4];

static void record_log(int level, const char *message, void *payload)
{
    (void)payload;
    pthread_mutex_lock(&log_mu);
    if (level >= 0 && level < 4)
        log_levels[level]++;
    snprintf(log_text + strlen(log_text), sizeof(log_text) - strlen(log_text), "%d %s\n", level,
             message);
    pthread_mutex_unlock(&log_mu);
}

static int log_count(int level)
{
    int n;
    pthread_mutex_lock(&log_mu);
    n = log_levels[level];
    pthread_mutex_unlock(&log_mu);
    return n;
}

/* The trace hook's events, in order (client options' trace). */
#define TRACE_MAX 4096
static dlock_trace_event trace_ev[TRACE_MAX];
static char trace_names[TRACE_MAX][16];
static int trace_n;

static void record_trace(const dlock_trace_event *ev, void *payload)
{
    (void)payload;
    pthread_mutex_lock(&log_mu);
    if (trace_n < TRACE_MAX) {
        trace_ev[trace_n] = *ev;
        snprintf(trace_names[trace_n], sizeof(trace_names[0]), "%s",
                 ev->name != NULL ? ev->name : "");
        trace_ev[trace_n].name = NULL; /* borrowed: the copy above stays */
        trace_n++;
    }
    pthread_mutex_unlock(&log_mu);
}

/* The ENDs of call since event from (all calls: NULL), and of those the
 * ones with result rc (any: 1). Every END follows its BEGIN, same id,
 * same call, same name. */
static int trace_ends(int from, const char *call, int rc)
{
    int n = 0;

    pthread_mutex_lock(&log_mu);
    for (int i = from; i < trace_n; i++) {
        const dlock_trace_event *e = &trace_ev[i];
        if (e->phase != DLOCK_TRACE_END)
            continue;
        int begun = 0;
        for (int j = i - 1; j >= 0 && !begun; j--)
            begun = trace_ev[j].phase == DLOCK_TRACE_BEGIN && trace_ev[j].id == e->id &&
                    strcmp(trace_ev[j].call, e->call) == 0 &&
                    strcmp(trace_names[j], trace_names[i]) == 0 && trace_ev[j].count == e->count;
        CHECK(begun && e->duration_us >= 0);
        if ((call == NULL || strcmp(e->call, call) == 0) && (rc == 1 || e->result == rc))
            n++;
    }
    pthread_mutex_unlock(&log_mu);
    return n;
}

/* The counters after a known sequence of calls; the trace hook's events
 * and the DLOCK_LOG_DEBUG lines of the same calls. */
static void stats_count_exactly(void)
{
    test_server s;
    dlock_client *c, *other, *refused = NULL;
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_lock *a, *b = NULL;
    dlock_acquire_options o = test_opts(0, 20000, 0);
    dlock_stats st = DLOCK_STATS_INIT;
    int mark;

    test_server_start(&s, backend);
    co.trace = record_trace;
    co.log = record_log;
    co.log_level = DLOCK_LOG_DEBUG;
    co.flags = via_nothreads ? DLOCK_CLIENT_NO_THREADS : 0;
    CHECK_RC(dlock_client_open(&c, s.url, &co), DLOCK_OK);
    other = open_client(&s);
    CHECK_RC(dlock_client_stats(&st, c), DLOCK_OK);
    CHECK(st.acquires == 0 && st.busy == 0 && bucket_sum(st.round_trip_us) == 0);
    CHECK(st.round_trip_us_sum == 0 && st.wait_us_sum == 0);
    pthread_mutex_lock(&log_mu);
    trace_n = 0;
    log_text[0] = '\0';
    memset(log_levels, 0, sizeof(log_levels));
    pthread_mutex_unlock(&log_mu);

    CHECK_RC(dlock_acquire(&a, c, "st", &o), DLOCK_OK);            /* 1 try */
    CHECK_RC(dlock_acquire(&b, c, "st", &o), DLOCK_EBUSY);         /* 1 try, busy */
    o.wait_ms = 300;
    CHECK_RC(dlock_acquire(&b, c, "st", &o), DLOCK_ETIMEOUT);      /* waits: busy tries */
    CHECK_RC(dlock_lock_check(a), DLOCK_OK);                       /* 1 round trip */
    CHECK_RC(dlock_release(a), DLOCK_OK);                          /* 1 round trip */
    CHECK_RC(dlock_client_stats(&st, c), DLOCK_OK);
    CHECK(st.acquires == 1);
    CHECK(st.waits == 1);
    CHECK(st.busy >= 3); /* the try, and the wait's first two tries at least */
    CHECK(st.handoffs == 0 && st.renewals == 0 && st.renew_failures == 0 && st.losses == 0);
    CHECK(bucket_sum(st.wait_us) == 1);
    /* The timed-out wait lasted 300 ms at least: 2^18 us = 262 ms. */
    for (int i = 0; i < 19; i++)
        CHECK(st.wait_us[i] == 0);
    /* Every try is a round trip; so are check and release. */
    CHECK(bucket_sum(st.round_trip_us) == st.acquires + st.busy + 2);
    /* Their times' sum: the wait's 300 ms at least, round trips over 0. */
    CHECK(st.wait_us_sum >= 300000 && st.round_trip_us_sum > 0);
    /* Traced: each try, the check and the release, BEGIN then END. */
    CHECK(trace_ends(0, "acquire", DLOCK_OK) == 1);
    CHECK(trace_ends(0, "acquire", DLOCK_EBUSY) == (int)st.busy);
    CHECK(trace_ends(0, "check", DLOCK_OK) == 1 && trace_ends(0, "release", DLOCK_OK) == 1);
    CHECK(trace_ends(0, NULL, 1) == (int)bucket_sum(st.round_trip_us));
    pthread_mutex_lock(&log_mu);
    CHECK(trace_n == 2 * (int)bucket_sum(st.round_trip_us) && trace_ev[0].id == trace_ev[1].id);
    CHECK(trace_ev[0].phase == DLOCK_TRACE_BEGIN && strcmp(trace_ev[0].call, "acquire") == 0 &&
          strcmp(trace_names[0], "st") == 0 && trace_ev[0].count == 1);
    /* One DEBUG line per call, and nothing else logged. */
    CHECK(log_levels[DLOCK_LOG_DEBUG] == (int)bucket_sum(st.round_trip_us));
    CHECK_CONTAINS(log_text, "0 acquire 'st': ok in ");
    CHECK_CONTAINS(log_text, "0 acquire 'st': lock is held by another owner in ");
    CHECK_CONTAINS(log_text, "0 release 'st': ok in ");
    mark = trace_n;
    pthread_mutex_unlock(&log_mu);

    /* A loss counts once, whoever finds it. */
    o = test_opts(0, 20000, 1);
    o.on_lost = test_count_lost;
    CHECK_RC(dlock_acquire(&a, c, "st-lost", &o), DLOCK_OK);
    CHECK_RC(dlock_force_release(NULL, other, "st-lost"), DLOCK_OK);
    CHECK_RC(dlock_lock_check(a), DLOCK_ELOST);
    CHECK_RC(dlock_lock_check(a), DLOCK_ELOST);
    CHECK_RC(dlock_release(a), DLOCK_ELOST);
    CHECK_RC(dlock_client_stats(&st, c), DLOCK_OK);
    CHECK(st.acquires == 2 && st.losses == 1);
    /* The other client's call is traced by none: it has no hook. */
    CHECK(trace_ends(mark, "force_release", 1) == 0);
    CHECK(trace_ends(mark, "check", DLOCK_ELOST) >= 1);
    /* A status is traced and logged, not timed as a lock's round trip. */
    {
        dlock_lock_info info;
        uint64_t before = bucket_sum(st.round_trip_us);
        CHECK_RC(dlock_status(&info, c, "st-lost"), DLOCK_OK);
        CHECK(trace_ends(mark, "status", DLOCK_OK) == 1);
        CHECK_RC(dlock_client_stats(&st, c), DLOCK_OK);
        CHECK(bucket_sum(st.round_trip_us) == before);
        pthread_mutex_lock(&log_mu);
        CHECK_CONTAINS(log_text, "0 status 'st-lost': ok in ");
        pthread_mutex_unlock(&log_mu);
    }

    /* Renewals: the watchdog's, one per lock per renewal. */
    o = test_opts(0, s.short_lease_ms * 3, 1);
    CHECK_RC(dlock_acquire(&a, c, "st-renew", &o), DLOCK_OK);
    for (int i = 0; i < 600; i++) {
        CHECK_RC(dlock_client_stats(&st, c), DLOCK_OK);
        if (st.renewals >= 2)
            break;
        test_sleep_ms(50);
    }
    CHECK(st.renewals >= 2 && st.renew_failures == 0 && st.losses == 1);
    CHECK_RC(dlock_release(a), DLOCK_OK);
    /* The watchdog's renewals, traced from its thread: one lock each. */
    CHECK(trace_ends(mark, "renew", DLOCK_OK) >= 2);
    pthread_mutex_lock(&log_mu);
    CHECK_CONTAINS(log_text, "0 renew 'st-renew': ok in ");
    pthread_mutex_unlock(&log_mu);
    /* The other client's counters are its own. */
    CHECK_RC(dlock_client_stats(&st, other), DLOCK_OK);
    CHECK(st.acquires == 0 && st.busy == 0 && bucket_sum(st.round_trip_us) == 0);
    st.version = 99;
    CHECK_RC(dlock_client_stats(&st, c), DLOCK_EINVAL);
    /* A version 1 reader gets no sums, and nothing is written past them. */
    memset(&st, 0x5a, sizeof(st));
    st.version = 1;
    CHECK_RC(dlock_client_stats(&st, c), DLOCK_OK);
    CHECK(st.acquires == 3 && *(unsigned char *)&st.round_trip_us_sum == 0x5a);
    /* An unknown level is refused, naming the field. */
    co.log_level = 7;
    CHECK_RC(dlock_client_open(&refused, s.url, &co), DLOCK_EINVAL);
    CHECK(refused == NULL);
    CHECK_CONTAINS(dlock_error_message(), "log_level");
    dlock_client_free(c);
    dlock_client_free(other);
    test_server_stop(&s);
}

/* A renewal that cannot reach the server is a warning; the loss an error. */
static void log_renew_failure_and_loss(void)
{
    test_server s;
    dlock_client *c, *other;
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_acquire_options o = test_opts(0, 6000, 1);
    dlock_stats st = DLOCK_STATS_INIT;
    dlock_lock *a;
    int rc;

    test_server_start(&s, backend);
    co.command_timeout_ms = 300;
    co.log = record_log;
    co.flags = via_nothreads ? DLOCK_CLIENT_NO_THREADS : 0;
    CHECK_RC(dlock_client_open(&c, s.url, &co), DLOCK_OK);
    /* What open itself logged (Redlock: nodes that do not keep their fence
     * marks, test_redlock node_settings_checked) is not this test's. */
    pthread_mutex_lock(&log_mu);
    log_text[0] = '\0';
    memset(log_levels, 0, sizeof(log_levels));
    pthread_mutex_unlock(&log_mu);
    other = open_client(&s);
    o.on_lost = test_count_lost;
    CHECK_RC(dlock_acquire(&a, c, "logged", &o), DLOCK_OK);
    /* The renewal due after 2 s times out after 300 ms, well before the
     * lease runs out at 6 s. */
    test_server_pause(&s, 1);
    if (s.conn_bound) {
        /* The renewal that times out closes the lock's connection, and the
         * server ends the lock with it: lost at once, an error. */
        for (int i = 0; i < 400 && atomic_load(&test_lost_calls) == 0; i++)
            test_sleep_ms(50);
        test_server_pause(&s, 0);
        CHECK(atomic_load(&test_lost_calls) == 1);
        CHECK(log_count(DLOCK_LOG_ERROR) == 1);
        CHECK_CONTAINS(log_text, "3 lock 'logged' lost: ");
        CHECK_RC(dlock_release(a), DLOCK_ELOST);
        wait_not_held(&s, "logged");
        dlock_client_free(c);
        dlock_client_free(other);
        test_server_stop(&s);
        return;
    }
    for (int i = 0; i < 400 && log_count(DLOCK_LOG_WARN) == 0; i++)
        test_sleep_ms(50);
    test_server_pause(&s, 0);
    CHECK(log_count(DLOCK_LOG_WARN) >= 1);
    CHECK_CONTAINS(log_text, "2 renewal of lock 'logged' failed");
    CHECK_RC(dlock_client_stats(&st, c), DLOCK_OK);
    CHECK(st.renew_failures >= 1);
    /* Broken by another: the next renewal finds it gone. other's connection
     * may have died in the pause unnoticed (ZooKeeper: its first request
     * after it finds "connection loss" and connects again): a transient
     * DLOCK_ECONN, tried again as a user would. */
    rc = dlock_force_release(NULL, other, "logged");
    for (int i = 0; i < 100 && rc == DLOCK_ECONN; i++) {
        test_sleep_ms(50);
        rc = dlock_force_release(NULL, other, "logged");
    }
    CHECK_RC(rc, DLOCK_OK);
    for (int i = 0; i < 400 && atomic_load(&test_lost_calls) == 0; i++)
        test_sleep_ms(50);
    CHECK(atomic_load(&test_lost_calls) == 1);
    CHECK(log_count(DLOCK_LOG_ERROR) == 1);
    CHECK_CONTAINS(log_text, "3 lock 'logged' lost: ");
    CHECK_RC(dlock_release(a), DLOCK_ELOST);
    dlock_client_free(c);
    dlock_client_free(other);
    test_server_stop(&s);
}

/* dlock_client_interrupt from a signal handler stops a blocked wait. */
static dlock_client *alarm_client;

static void on_alarm(int sig)
{
    (void)sig;
    dlock_client_interrupt(alarm_client);
}

static void interrupt_from_signal_handler(void)
{
    test_server s;
    dlock_client *c, *holder;
    dlock_lock *h, *l = NULL;
    dlock_acquire_options o = test_opts(0, 600000, 1);
    struct sigaction sa;
    struct itimerval it = {{0, 0}, {0, 300000}};
    int64_t took;
    long long held;

    test_server_start(&s, backend);
    holder = open_client(&s);
    c = open_client(&s);
    CHECK_RC(dlock_acquire(&h, holder, "sig", &o), DLOCK_OK);
    held = test_server_leftovers(&s, "sig");
    alarm_client = c;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGALRM, &sa, NULL) == 0);
    CHECK(setitimer(ITIMER_REAL, &it, NULL) == 0);
    /* The holder's lease is 10 min (and a Redis waiter comes back after a
     * quarter of it): only the interruption ends this wait before wait_ms. */
    o.wait_ms = 60000;
    took = test_clock_ms(CLOCK_MONOTONIC);
    CHECK_RC(dlock_acquire(&l, c, "sig", &o), DLOCK_EINTR);
    took = test_clock_ms(CLOCK_MONOTONIC) - took;
    CHECK(l == NULL);
    CHECK(took < 60000);
    CHECK_CONTAINS(dlock_error_message(), "interrupted");
    CHECK(test_server_leftovers(&s, "sig") == held); /* the waiter left the queue */
    /* For good: the next wait returns at once. */
    CHECK_RC(dlock_acquire(&l, c, "sig", &o), DLOCK_EINTR);
    CHECK_RC(dlock_release(h), DLOCK_OK);
    dlock_client_free(c);
    dlock_client_free(holder);
    test_server_stop(&s);
}

static const test_case cases[] = {
    {"basic_cycle", basic_cycle, NULL},
    {"mutual_exclusion_processes", mutual_exclusion_processes, NULL},
    {"fences_strictly_increase", fences_strictly_increase, NULL},
    {"release_by_non_owner_refused", release_by_non_owner_refused, NULL},
    {"owner_reentry", owner_reentry, NULL},
    {"rw_nested_read", rw_nested_read, "watchdog"},
    {"expiry_frees_the_lock", expiry_frees_the_lock, NULL},
    {"watchdog_keeps_lock", watchdog_keeps_lock, "watchdog"},
    {"on_lost_once_after_force_release", on_lost_once_after_force_release, "watchdog"},
    {"sigstop_holder_loses_lock", sigstop_holder_loses_lock, "watchdog"},
    {"release_after_deadline_is_lost", release_after_deadline_is_lost, NULL},
    {"wait_times_out", wait_times_out, NULL},
    {"interrupt_leaves_the_queue", interrupt_leaves_the_queue, NULL},
    {"try_once_leaves_nothing", try_once_leaves_nothing, NULL},
    {"client_freed_before_release", client_freed_before_release, NULL},
    {"threads_share_a_client", threads_share_a_client, "watchdog"},
    {"holder_in_status_and_list", holder_in_status_and_list, NULL},
    {"stats_count_exactly", stats_count_exactly, "watchdog"},
    {"log_renew_failure_and_loss", log_renew_failure_and_loss, "watchdog"},
    {"interrupt_from_signal_handler", interrupt_from_signal_handler, NULL},
};

/* test_core BACKEND CASE, or test_core --list */
int main(int argc, char **argv)
{
    if (argc > 1 && strncmp(argv[1], "async:", 6) == 0) {
        via_async = 1;
        argv[1] += 6;
    } else if (argc > 1 && strncmp(argv[1], "nothreads:", 10) == 0) {
        via_async = via_nothreads = 1;
        argv[1] += 10;
    }
    return test_run_on(cases, sizeof(cases) / sizeof(cases[0]), argc, argv, &backend);
}
