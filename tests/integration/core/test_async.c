/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The asynchronous API (include/dlock/async.h) on every backend: one suite,
 * run once per backend (`test_async redis CASE`), each case on a throwaway
 * server. The loop is the test's own: poll(2) on dlock_async_fd, then
 * dlock_async_process, on the main thread, where every callback must run.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "dlock/async.h"
#include "test.h"

static const char *backend; /* argv[1] */
static pthread_t loop_thread;

static dlock_client *open_client(const test_server *s)
{
    dlock_client *c = NULL;

    CHECK_RC(dlock_client_open(&c, s->url, NULL), DLOCK_OK);
    return c;
}

/* One acquisition's outcome, as its callback saw it (tests/support), the
 * callbacks also checked to run on the loop's thread. */
typedef test_async_outcome outcome;

static void on_acquired(int rc, dlock_lock *lock, void *arg)
{
    CHECK(pthread_equal(pthread_self(), loop_thread));
    test_async_acquired(rc, lock, arg);
}

static void on_done(int rc, void *arg)
{
    CHECK(pthread_equal(pthread_self(), loop_thread));
    test_async_done(rc, arg);
}

static void loop_turn(dlock_client *c)
{
    test_async_turn(c, 10);
}

static void loop_until(dlock_client *c, const int *calls, int want, int64_t ms)
{
    test_async_until(c, calls, want, ms);
}

/* Run c's loop for ms, whatever comes. */
static void loop_for(dlock_client *c, int64_t ms)
{
    struct timespec t0, t;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        loop_turn(c);
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < ms);
}

static dlock_lock *acquire_now(dlock_client *c, const char *name, dlock_acquire_options *o)
{
    outcome got = {0};

    CHECK_RC(dlock_acquire_async(NULL, c, name, o, on_acquired, &got), DLOCK_OK);
    loop_until(c, &got.calls, 1, 10000);
    CHECK_RC(got.rc, DLOCK_OK);
    return got.lock;
}

static void release_now(dlock_client *c, dlock_lock *l, int want)
{
    outcome done = {0};

    CHECK_RC(dlock_release_async(NULL, l, on_done, &done), DLOCK_OK);
    loop_until(c, &done.calls, 1, 10000);
    CHECK(done.calls == 1);
    CHECK_RC(done.rc, want);
}

/* Extend l to lease_ms, and check it then has more than more_than_ms left. */
static void extend_now(dlock_client *c, dlock_lock *l, int64_t lease_ms, int64_t more_than_ms)
{
    outcome ext = {0};

    CHECK_RC(dlock_extend_async(NULL, l, lease_ms, on_done, &ext), DLOCK_OK);
    loop_until(c, &ext.calls, 1, 10000);
    CHECK(ext.calls == 1);
    CHECK_RC(ext.rc, DLOCK_OK);
    CHECK(dlock_lock_valid_ms(l) > more_than_ms);
}

/* ---------------------------------------------------------------------- */

/* Try, busy, extend, release; fences as the blocking calls give them. */
static void cycle(void)
{
    test_server s;
    dlock_client *c, *other;
    dlock_acquire_options o = test_opts(0, 5000, 1);
    dlock_lock *l, *blocking;
    outcome busy = {0};
    uint64_t first;

    test_server_start(&s, backend);
    c = open_client(&s);
    other = open_client(&s);
    l = acquire_now(c, "job", &o);
    first = dlock_lock_fence(l);
    CHECK(first > 0 && !dlock_lock_lost(l) && dlock_lock_valid_ms(l) > 0);
    CHECK(test_server_held(&s, "job"));
    CHECK_RC(dlock_acquire_async(NULL, c, "job", &o, on_acquired, &busy), DLOCK_OK);
    loop_until(c, &busy.calls, 1, 10000);
    CHECK_RC(busy.rc, DLOCK_EBUSY);
    CHECK_CONTAINS(busy.msg, "'job' is held by another owner");
    extend_now(c, l, 8000, 5000);
    release_now(c, l, DLOCK_OK);
    CHECK(!test_server_held(&s, "job"));
    /* The blocking API on another client sees the next fence. */
    CHECK_RC(dlock_acquire(&blocking, other, "job", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(blocking) > first);
    CHECK_RC(dlock_release(blocking), DLOCK_OK);
    l = acquire_now(c, "job", &o);
    CHECK(dlock_lock_fence(l) > first + 1 || !s.dense_fences);
    release_now(c, l, DLOCK_OK);
    CHECK(test_server_leftovers(&s, "job") == 0);
    dlock_client_free(other);
    dlock_client_free(c);
    test_server_stop(&s);
}

/* A waiter is granted the lock when the holder (another client, blocking
 * API) releases it. */
static void wait_handoff(void)
{
    test_server s;
    dlock_client *c, *holder_c;
    dlock_acquire_options o = test_opts(10000, 5000, 1);
    dlock_lock *held;
    outcome got = {0};

    test_server_start(&s, backend);
    c = open_client(&s);
    holder_c = open_client(&s);
    CHECK_RC(dlock_acquire(&held, holder_c, "job", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire_async(NULL, c, "job", &o, on_acquired, &got), DLOCK_OK);
    loop_for(c, 300);
    CHECK(got.calls == 0);
    CHECK_RC(dlock_release(held), DLOCK_OK);
    loop_until(c, &got.calls, 1, 5000);
    CHECK_RC(got.rc, DLOCK_OK);
    CHECK(got.lock != NULL && test_server_held(&s, "job"));
    release_now(c, got.lock, DLOCK_OK);
    CHECK(test_server_leftovers(&s, "job") == 0);
    dlock_client_free(holder_c);
    dlock_client_free(c);
    test_server_stop(&s);
}

/* A wait that runs out: DLOCK_ETIMEOUT with the blocking call's message,
 * and nothing left queued. */
static void wait_timeout(void)
{
    test_server s;
    dlock_client *c, *holder_c;
    dlock_acquire_options o = test_opts(0, 5000, 1), w = test_opts(400, 5000, 1);
    dlock_lock *held;
    outcome got = {0};

    test_server_start(&s, backend);
    c = open_client(&s);
    holder_c = open_client(&s);
    CHECK_RC(dlock_acquire(&held, holder_c, "job", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire_async(NULL, c, "job", &w, on_acquired, &got), DLOCK_OK);
    loop_until(c, &got.calls, 1, 5000);
    CHECK_RC(got.rc, DLOCK_ETIMEOUT);
    CHECK_CONTAINS(got.msg, "still held by another owner after waiting 400 ms");
    loop_for(c, 100);
    CHECK(got.calls == 1);
    CHECK_RC(dlock_release(held), DLOCK_OK);
    CHECK(test_server_leftovers(&s, "job") == 0);
    dlock_client_free(holder_c);
    dlock_client_free(c);
    test_server_stop(&s);
}

/* A queued waiter canceled: DLOCK_ECANCELED once, its place left, and the
 * next waiter (blocking, another client) gets the lock at the release. */
static void cancel_queued(void)
{
    test_server s;
    dlock_client *c, *holder_c;
    dlock_acquire_options w = test_opts(20000, 5000, 1);
    dlock_request_handle *req;
    dlock_lock *held;
    outcome got = {0};

    test_server_start(&s, backend);
    c = open_client(&s);
    holder_c = open_client(&s);
    CHECK_RC(dlock_acquire(&held, holder_c, "job", &w), DLOCK_OK);
    CHECK_RC(dlock_acquire_async(&req, c, "job", &w, on_acquired, &got), DLOCK_OK);
    CHECK(req != NULL);
    loop_for(c, 300);
    CHECK(got.calls == 0);
    CHECK_RC(dlock_request_cancel(req), DLOCK_OK);
    CHECK_RC(dlock_request_cancel(req), DLOCK_OK); /* twice: nothing more */
    CHECK(got.calls == 0); /* never from inside the cancel */
    loop_until(c, &got.calls, 1, 5000);
    CHECK_RC(got.rc, DLOCK_ECANCELED);
    CHECK_CONTAINS(got.msg, "was canceled (dlock_request_cancel)");
    loop_for(c, 200);
    CHECK(got.calls == 1);
    CHECK_RC(dlock_release(held), DLOCK_OK);
    CHECK(!test_server_held(&s, "job"));
    CHECK(test_server_leftovers(&s, "job") == 0);
    dlock_client_free(holder_c);
    dlock_client_free(c);
    test_server_stop(&s);
}

/* Granted but not yet delivered (the server holds it, no process yet),
 * then canceled: the lock is given back, the callback gets ECANCELED. */
static void cancel_granted(void)
{
    test_server s;
    dlock_client *c;
    dlock_acquire_options o = test_opts(0, 5000, 1);
    dlock_request_handle *req;
    outcome got = {0};
    struct pollfd p;

    test_server_start(&s, backend);
    c = open_client(&s);
    /* Its scripts loaded, so that the try needs no answer read first. */
    release_now(c, acquire_now(c, "warm", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire_async(&req, c, "job", &o, on_acquired, &got), DLOCK_OK);
    p.fd = dlock_async_fd(c);
    p.events = POLLIN;
    CHECK(poll(&p, 1, 10000) == 1);
    for (int i = 0; i < 1000 && !test_server_held(&s, "job"); i++)
        usleep(10 * 1000);
    CHECK(test_server_held(&s, "job"));
    CHECK_RC(dlock_request_cancel(req), DLOCK_OK);
    loop_until(c, &got.calls, 1, 10000);
    CHECK_RC(got.rc, DLOCK_ECANCELED);
    CHECK(got.lock == NULL);
    CHECK(!test_server_held(&s, "job"));
    CHECK(test_server_leftovers(&s, "job") == 0);
    dlock_client_free(c);
    test_server_stop(&s);
}

/* Canceled while its try is in flight (the server paused): the try's lock,
 * once it comes, is given back. */
static void cancel_in_flight(void)
{
    test_server s;
    dlock_client *c;
    dlock_acquire_options o = test_opts(0, 5000, 1);
    dlock_request_handle *req;
    outcome got = {0};

    test_server_start(&s, backend);
    c = open_client(&s);
    /* Connected first, so that the pause holds the try, not the connect. */
    release_now(c, acquire_now(c, "warm", &o), DLOCK_OK);
    test_server_pause(&s, 1);
    CHECK_RC(dlock_acquire_async(&req, c, "job", &o, on_acquired, &got), DLOCK_OK);
    usleep(200 * 1000);
    CHECK_RC(dlock_request_cancel(req), DLOCK_OK);
    test_server_pause(&s, 0);
    loop_until(c, &got.calls, 1, 15000);
    CHECK_RC(got.rc, DLOCK_ECANCELED);
    CHECK(!test_server_held(&s, "job"));
    dlock_client_free(c);
    test_server_stop(&s);
}

/* on_lost of a lock acquired here runs on the loop's thread, and may
 * release the lock there. */
static int lost_calls;
static void lost_on_loop(dlock_lock *l, int reason, void *payload)
{
    CHECK(pthread_equal(pthread_self(), loop_thread));
    CHECK(payload == &lost_calls);
    CHECK(reason == DLOCK_ELOST);
    lost_calls++;
    CHECK_RC(dlock_release(l), DLOCK_ELOST);
}

static void on_lost_loop(void)
{
    test_server s;
    dlock_client *c, *admin;
    dlock_acquire_options o;
    dlock_lock *l;

    test_server_start(&s, backend);
    o = test_opts(0, s.short_lease_ms > 900 ? s.short_lease_ms : 900, 1);
    o.on_lost = lost_on_loop;
    o.payload = &lost_calls;
    c = open_client(&s);
    admin = open_client(&s);
    l = acquire_now(c, "job", &o);
    CHECK_RC(dlock_force_release(NULL, admin, "job"), DLOCK_OK);
    loop_until(c, &lost_calls, 1, 20000);
    loop_for(c, 200);
    CHECK(lost_calls == 1);
    (void)l;
    dlock_client_free(admin);
    dlock_client_free(c);
    test_server_stop(&s);
}

/* Freeing the client with requests in flight: each waiter's callback once
 * with ECANCELED (on this thread, inside the free), nothing left queued;
 * a lock acquired here stays a valid handle, as with the blocking API. */
static void free_outstanding(void)
{
    test_server s;
    dlock_client *c, *holder_c;
    dlock_acquire_options w = test_opts(DLOCK_WAIT_FOREVER, 5000, 1), o = test_opts(0, 5000, 1);
    dlock_lock *held, *mine;
    outcome got[3] = {{0}};

    test_server_start(&s, backend);
    c = open_client(&s);
    holder_c = open_client(&s);
    CHECK_RC(dlock_acquire(&held, holder_c, "job", &o), DLOCK_OK);
    mine = acquire_now(c, "mine", &o);
    for (int i = 0; i < 3; i++)
        CHECK_RC(dlock_acquire_async(NULL, c, "job", &w, on_acquired, &got[i]), DLOCK_OK);
    loop_for(c, 300);
    dlock_client_free(c);
    for (int i = 0; i < 3; i++) {
        CHECK(got[i].calls == 1);
        CHECK_RC(got[i].rc, DLOCK_ECANCELED);
        CHECK_CONTAINS(got[i].msg, "(dlock_client_free)");
    }
    CHECK_RC(dlock_release(mine), DLOCK_EMISUSE);
    CHECK_RC(dlock_release(held), DLOCK_OK);
    CHECK(test_server_leftovers(&s, "job") == 0);
    dlock_client_free(holder_c);
    test_server_stop(&s);
}

/* dlock_client_free from inside a callback: the free completes when the
 * callback returns; the other waiters get ECANCELED. */
static dlock_client *freed_in_callback;
static outcome in_cb[3];

static void free_from_callback(int rc, dlock_lock *lock, void *arg)
{
    on_acquired(rc, lock, arg);
    CHECK_RC(rc, DLOCK_OK);
    CHECK_RC(dlock_release(lock), DLOCK_OK);
    dlock_client_free(freed_in_callback);
    /* The client is still there until this callback returns. */
}

static void free_in_callback(void)
{
    test_server s;
    dlock_client *c, *holder_c;
    dlock_acquire_options w = test_opts(DLOCK_WAIT_FOREVER, 5000, 1), o = test_opts(0, 5000, 1);
    dlock_lock *held;
    int fd;

    test_server_start(&s, backend);
    c = freed_in_callback = open_client(&s);
    holder_c = open_client(&s);
    CHECK_RC(dlock_acquire(&held, holder_c, "other", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire_async(NULL, c, "job", &o, free_from_callback, &in_cb[0]), DLOCK_OK);
    CHECK_RC(dlock_acquire_async(NULL, c, "other", &w, on_acquired, &in_cb[1]), DLOCK_OK);
    CHECK_RC(dlock_acquire_async(NULL, c, "other", &w, on_acquired, &in_cb[2]), DLOCK_OK);
    fd = dlock_async_fd(c);
    while (in_cb[0].calls == 0) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 10000) > 0)
            dlock_async_process(c); /* may free c: the loop ends then */
    }
    for (int i = 1; i < 3; i++) {
        CHECK(in_cb[i].calls == 1);
        CHECK_RC(in_cb[i].rc, DLOCK_ECANCELED);
    }
    CHECK_RC(dlock_release(held), DLOCK_OK);
    CHECK(test_server_leftovers(&s, "other") == 0);
    CHECK(test_server_leftovers(&s, "job") == 0);
    dlock_client_free(holder_c);
    test_server_stop(&s);
}

/* Bad input: the same codes and messages as the blocking calls, no
 * callback, nothing started. */
static void bad_input(void)
{
    test_server s;
    dlock_client *c;
    dlock_acquire_options bad = test_opts(0, -5, 1), ok = test_opts(0, 5000, 1);
    dlock_request_handle *req = (dlock_request_handle *)1;
    dlock_lock *l = (dlock_lock *)1;
    outcome got = {0};
    char blocking[512];

    test_server_start(&s, backend);
    c = open_client(&s);
    CHECK_RC(dlock_acquire(&l, c, "job", &bad), DLOCK_EINVAL);
    snprintf(blocking, sizeof(blocking), "%s", dlock_error_message());
    CHECK_RC(dlock_acquire_async(&req, c, "job", &bad, on_acquired, &got), DLOCK_EINVAL);
    CHECK(req == NULL);
    CHECK(strcmp(dlock_error_message(), blocking) == 0);
    CHECK_RC(dlock_acquire_async(NULL, c, "", &ok, on_acquired, &got), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "dlock_acquire_async");
    CHECK_RC(dlock_acquire_async(NULL, c, "job", &ok, NULL, &got), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "cb is NULL");
    CHECK_RC(dlock_acquire_async(NULL, NULL, "job", &ok, on_acquired, &got), DLOCK_EINVAL);
    CHECK_RC(dlock_release_async(NULL, NULL, on_done, &got), DLOCK_EINVAL);
    CHECK_RC(dlock_request_cancel(NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_async_process(NULL), DLOCK_EINVAL);
    CHECK(dlock_async_fd(NULL) == -1);
    l = acquire_now(c, "job", &ok);
    CHECK_RC(dlock_extend_async(NULL, l, 0, on_done, &got), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "lease_ms is 0");
    {
        /* A release cannot be canceled; its callback comes as usual. */
        outcome done = {0};
        CHECK_RC(dlock_release_async(&req, l, on_done, &done), DLOCK_OK);
        CHECK_RC(dlock_request_cancel(req), DLOCK_EMISUSE);
        loop_until(c, &done.calls, 1, 10000);
        CHECK_RC(done.rc, DLOCK_OK);
    }
    loop_for(c, 100);
    CHECK(got.calls == 0);
    dlock_client_free(c);
    test_server_stop(&s);
}

/* Waiters on one thread, granted in the order they queued (fair locks,
 * where the backend has them), on as many threads as the engine has. */
static void fair_order(void)
{
    enum { N = 12 };
    test_server s;
    dlock_client *c, *holder_c;
    dlock_acquire_options o = test_opts(0, 5000, 1), w = test_opts(20000, 5000, 1);
    dlock_lock *held;
    outcome got[N] = {{0}};
    int rc;

    test_server_start(&s, backend);
    c = open_client(&s);
    holder_c = open_client(&s);
    o.kind = w.kind = DLOCK_KIND_FAIR;
    rc = dlock_acquire(&held, holder_c, "job", &o);
    if (rc == DLOCK_ENOTSUP) {
        /* The async call refuses it the same way, at once. */
        CHECK_RC(dlock_acquire_async(NULL, c, "job", &w, on_acquired, &got[0]), DLOCK_ENOTSUP);
        dlock_client_free(holder_c);
        dlock_client_free(c);
        test_server_stop(&s);
        return;
    }
    CHECK_RC(rc, DLOCK_OK);
    /* Back to back: the engine's workers may not let a later one's first
     * try pass an earlier one's. */
    for (int i = 0; i < N; i++)
        CHECK_RC(dlock_acquire_async(NULL, c, "job", &w, on_acquired, &got[i]), DLOCK_OK);
    loop_for(c, 500);
    CHECK_RC(dlock_release(held), DLOCK_OK);
    for (int i = 0; i < N; i++) {
        loop_until(c, &got[i].calls, 1, 10000);
        CHECK_RC(got[i].rc, DLOCK_OK);
        for (int j = i + 1; j < N; j++)
            CHECK(got[j].calls == 0);
        release_now(c, got[i].lock, DLOCK_OK);
    }
    CHECK(test_server_leftovers(&s, "job") == 0);
    dlock_client_free(holder_c);
    dlock_client_free(c);
    test_server_stop(&s);
}

/* Many waiters on one client and one thread: each granted once, none
 * lost, and the client's threads stay few where the backend announces
 * releases (prints the memory per waiter). */

/* A number of /proc/self/status, as "Field: N" has it (Threads, VmRSS in
 * KiB). */
static long proc_status(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    size_t n = strlen(field);
    char line[256];
    long v = -1;

    CHECK(f != NULL);
    while (fgets(line, sizeof(line), f) != NULL)
        if (strncmp(line, field, n) == 0 && line[n] == ':' && sscanf(line + n + 1, "%ld", &v) == 1)
            break;
    fclose(f);
    return v;
}

static outcome *many;
static int many_n, many_granted;
static dlock_client *many_c;

static void many_released(int rc, void *arg)
{
    (void)arg;
    CHECK_RC(rc, DLOCK_OK);
}

static void many_acquired(int rc, dlock_lock *lock, void *arg)
{
    on_acquired(rc, lock, arg);
    CHECK_RC(rc, DLOCK_OK);
    many_granted++;
    CHECK_RC(dlock_release_async(NULL, lock, many_released, NULL), DLOCK_OK);
}

static void wait_many(void)
{
    const char *env = getenv("DLOCK_TEST_ASYNC_WAITERS");
    /* Where releases are announced to the client (all but MySQL), waiters
     * cost records; on MySQL each waits on a thread and a connection of
     * its own (GET_LOCK). */
    int notified = strcmp(backend, "mysql") != 0;
    int n = env != NULL ? atoi(env) : notified ? 1000 : 100;
    test_server s;
    dlock_client *holder_c;
    dlock_acquire_options o = test_opts(0, 30000, 1),
                          w = test_opts(env != NULL ? 3600000 : 120000, 30000, 1);
    dlock_lock *held;
    int threads_before, threads_waiting, fair;
    long rss_before, rss_waiting;

    test_server_start(&s, backend);
    many_c = open_client(&s);
    holder_c = open_client(&s);
    many_n = n;
    many = calloc((size_t)n, sizeof(*many));
    CHECK(many != NULL);
    /* Fair waiters, granted in the order they were made, where they wait
     * without a thread (Redlock has no fair kind; MySQL's 100 fair waiters
     * on threads of their own pass the lock on too slowly for the test). */
    fair = notified && strcmp(dlock_client_backend(many_c), "redlock") != 0;
    o.kind = w.kind = fair ? DLOCK_KIND_FAIR : DLOCK_KIND_MUTEX;
    CHECK_RC(dlock_acquire(&held, holder_c, "job", &o), DLOCK_OK);
    release_now(many_c, acquire_now(many_c, "warm", &o), DLOCK_OK);
    threads_before = (int)proc_status("Threads");
    rss_before = proc_status("VmRSS");
    for (int i = 0; i < n; i++)
        CHECK_RC(dlock_acquire_async(NULL, many_c, "job", &w, many_acquired, &many[i]),
                 DLOCK_OK);
    loop_for(many_c, 2000);
    threads_waiting = (int)proc_status("Threads");
    rss_waiting = proc_status("VmRSS");
    CHECK(many_granted == 0);
    printf("%d waiters: %d threads (%d before), RSS +%ld KiB (%.0f B a waiter)\n", n,
           threads_waiting, threads_before, rss_waiting - rss_before,
           1024.0 * (double)(rss_waiting - rss_before) / n);
    /* The engine's workers, the subscriber's and the interrupt's threads;
     * on etcd the watch hub's and the spare thread's instead of the
     * subscriber's; on ZooKeeper its client's two of the waiters' session. */
    if (strcmp(dlock_client_backend(many_c), "redis") == 0)
        CHECK(threads_waiting <= threads_before + 6);
    else if (strcmp(dlock_client_backend(many_c), "etcd") == 0 ||
             strcmp(dlock_client_backend(many_c), "zk") == 0)
        CHECK(threads_waiting <= threads_before + 8);
    else if (strcmp(dlock_client_backend(many_c), "redlock") == 0)
        CHECK(threads_waiting <= threads_before + 10); /* a subscriber a node */
    else if (strcmp(dlock_client_backend(many_c), "postgres") == 0)
        CHECK(threads_waiting <= threads_before + 8); /* the LISTEN connection's */
    CHECK_RC(dlock_release(held), DLOCK_OK);
    /* A longer run (DLOCK_TEST_ASYNC_WAITERS) may take as long as it needs:
     * etcd's queue grants n waiters in n squared (docs/async.md). */
    loop_until(many_c, &many_granted, n, env != NULL ? 3600000 : 240000);
    for (int i = 0; i < n; i++) {
        CHECK(many[i].calls == 1);
        CHECK(!fair || i == 0 || many[i].order > many[i - 1].order);
    }
    loop_for(many_c, 200);
    CHECK(test_server_leftovers(&s, "job") == 0);
    free(many);
    dlock_client_free(holder_c);
    dlock_client_free(many_c);
    test_server_stop(&s);
}

/* DLOCK_CLIENT_NO_THREADS: on Redis the client starts no thread of its own
 * while it renews (from dlock_async_process), waits (a poll from the loop),
 * is told of a loss, extends, and is canceled; elsewhere dlock_client_open
 * says it cannot. */
static int nt_lost;

static void nt_on_lost(dlock_lock *l, int reason, void *payload)
{
    (void)l;
    CHECK(pthread_equal(pthread_self(), loop_thread));
    CHECK(payload == &nt_lost);
    CHECK(reason == DLOCK_ELOST);
    nt_lost++;
}

static void no_threads(void)
{
    test_server s;
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_client *c = NULL, *other, *admin;
    dlock_acquire_options o = test_opts(0, 600, 1), w = test_opts(5000, 5000, 1);
    dlock_acquire_options w2 = test_opts(0, 5000, 0);
    dlock_stats st = DLOCK_STATS_INIT;
    dlock_lock *l, *held, *gone;
    outcome granted = {0}, canceled = {0};
    dlock_request_handle *req = NULL;
    long threads;

    test_server_start(&s, backend);
    co.flags = 0x80;
    CHECK_RC(dlock_client_open(&c, s.url, &co), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "unknown bits 0x80");
    co.flags = DLOCK_CLIENT_NO_THREADS;
    if (strcmp(backend, "redis") != 0) {
        CHECK_RC(dlock_client_open(&c, s.url, &co), DLOCK_ENOTSUP);
        CHECK(c == NULL);
        CHECK_CONTAINS(dlock_error_message(), "DLOCK_CLIENT_NO_THREADS");
        test_server_stop(&s);
        return;
    }
    other = open_client(&s);
    admin = open_client(&s);
    threads = proc_status("Threads");
    CHECK_RC(dlock_client_open(&c, s.url, &co), DLOCK_OK);

    /* Renewed by the loop alone: a 600 ms lease held for 2 s. */
    l = acquire_now(c, "job", &o);
    loop_for(c, 2000);
    CHECK(!dlock_lock_lost(l) && dlock_lock_valid_ms(l) > 0);
    CHECK(test_server_held(&s, "job"));
    CHECK_RC(dlock_client_stats(&st, c), DLOCK_OK);
    CHECK(st.renewals >= 3);
    /* Extended without a thread, and released. */
    extend_now(c, l, 4000, 600);
    release_now(c, l, DLOCK_OK);
    CHECK(!test_server_held(&s, "job"));

    /* A wait, granted once the holder (another client) lets go. */
    CHECK_RC(dlock_acquire(&held, other, "wait", &w2), DLOCK_OK); /* no watchdog thread */
    CHECK_RC(dlock_acquire_async(NULL, c, "wait", &w, on_acquired, &granted), DLOCK_OK);
    loop_for(c, 300);
    CHECK(granted.calls == 0);
    /* A second waiter, canceled while it sleeps: once, ECANCELED. */
    CHECK_RC(dlock_acquire_async(&req, c, "wait", &w, on_acquired, &canceled), DLOCK_OK);
    loop_for(c, 150);
    CHECK_RC(dlock_request_cancel(req), DLOCK_OK);
    loop_until(c, &canceled.calls, 1, 5000);
    CHECK_RC(canceled.rc, DLOCK_ECANCELED);
    {
        uint64_t fence = dlock_lock_fence(held);
        CHECK_RC(dlock_release(held), DLOCK_OK);
        loop_until(c, &granted.calls, 1, 5000);
        CHECK_RC(granted.rc, DLOCK_OK);
        CHECK(dlock_lock_fence(granted.lock) > fence);
    }
    loop_for(c, 200);
    CHECK(canceled.calls == 1 && granted.calls == 1);

    /* A loss told on the loop's thread: the lock broken by another. */
    o.on_lost = nt_on_lost;
    o.payload = &nt_lost;
    gone = acquire_now(c, "gone", &o);
    CHECK_RC(dlock_force_release(NULL, admin, "gone"), DLOCK_OK);
    loop_until(c, &nt_lost, 1, 10000);
    CHECK(dlock_lock_lost(gone));
    release_now(c, gone, DLOCK_ELOST);
    release_now(c, granted.lock, DLOCK_OK);

    /* All of it without a thread of the client's. */
    CHECK(proc_status("Threads") == threads);
    dlock_client_free(c);
    dlock_client_free(admin);
    dlock_client_free(other);
    test_server_stop(&s);
}

int main(int argc, char **argv)
{
    static const test_case cases[] = {
        {"cycle", cycle, NULL},
        {"wait_handoff", wait_handoff, NULL},
        {"wait_timeout", wait_timeout, NULL},
        {"cancel_queued", cancel_queued, NULL},
        {"cancel_granted", cancel_granted, NULL},
        {"cancel_in_flight", cancel_in_flight, NULL},
        {"on_lost_loop", on_lost_loop, "watchdog"},
        {"free_outstanding", free_outstanding, NULL},
        {"free_in_callback", free_in_callback, NULL},
        {"bad_input", bad_input, NULL},
        {"fair_order", fair_order, NULL},
        {"wait_many", wait_many, NULL},
        {"no_threads", no_threads, "watchdog"},
    };

    loop_thread = pthread_self();
    return test_run_on(cases, sizeof(cases) / sizeof(cases[0]), argc, argv, &backend);
}
