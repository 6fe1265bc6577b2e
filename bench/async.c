/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock-bench --async: the asynchronous API (include/dlock/async.h, issue
 * 30) beside the blocking one, in one unpinned run against one server (the
 * throwaway redis-server, or --url: any backend; on one whose clients need
 * threads, etcd's for one, the row without threads is left out),
 * interleaved in rounds so that a slow spell of the machine hits both
 * alike:
 *
 *   1. the uncontended cycle, acquire (wait_ms 0, 30 s lease, auto_renew)
 *      + release; the async one driven to each callback by a poll(2) loop
 *      on the measuring thread. Target: async p50 <= 1.10 x blocking p50.
 *   2. the hand-off, from just before the holder's dlock_release to the
 *      waiter's grant. The holder is the measuring thread; both waiters
 *      run on one thread of their own, the blocking one asleep in
 *      dlock_acquire, the async one in poll(2) on its client's descriptor,
 *      its grant its callback: each as a program on its API would wait, on
 *      a thread with nothing else to do. Target: async p50 <= 1.20 x
 *      blocking p50.
 *   3. N fair waiters on one client and one loop thread, for a lock
 *      another client holds: RSS and threads while they wait, then the
 *      time until each was granted in turn (each callback releases with
 *      dlock_release_async). Target: <= 2048 B a waiter.
 *
 * Exits 1 when a call fails, a waiter is granted before the holder
 * released, or a waiter is granted twice or never.
 */
#include "bench.h"

#include <dlock/async.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ROUNDS 10
#define HOLD_MS 5 /* the holder's hold: the waiter's try has failed, it waits */
#define TARGET_CYCLE 1.10
#define TARGET_HANDOFF 1.20
#define TARGET_WAITER_BYTES 2048.0

static void die_rc(const char *what, int rc)
{
    bench_die("%s: %s (%s)", what, dlock_strerror(rc), dlock_error_message());
}

static void pause_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static dlock_client *open_client(const char *url)
{
    dlock_client *c = NULL;
    int rc;

    if ((rc = dlock_client_open(&c, url, NULL)) != DLOCK_OK)
        die_rc("dlock_client_open", rc);
    return c;
}

/* ---- the loop ------------------------------------------------------------ */

/* A request's outcome, as its callback saw it, and when. */
typedef struct {
    long calls;
    int rc;
    dlock_lock *lock;
    int64_t at;
} outcome;

static void on_acquired(int rc, dlock_lock *lock, void *arg)
{
    outcome *o = arg;
    o->at = bench_now_ns();
    o->calls++;
    o->rc = rc;
    o->lock = lock;
}

static void on_done(int rc, void *arg)
{
    on_acquired(rc, NULL, arg);
}

/*
 * One turn of c's loop: wait for its descriptor (for the time
 * dlock_async_timeout_ms asks, at most max_ms) and run what is due. Returns
 * the number of callbacks run.
 */
static int loop_once(dlock_client *c, int max_ms)
{
    int fd = dlock_async_fd(c);
    if (fd < 0)
        bench_die("dlock_async_fd: %s", dlock_error_message());
    int64_t due = dlock_async_timeout_ms(c);
    struct pollfd p = {fd, POLLIN, 0};
    int r = poll(&p, 1, due >= 0 && due < max_ms ? (int)due : max_ms);
    if (r < 0 && errno != EINTR)
        bench_die("poll: %s", strerror(errno));
    if (r <= 0 && due < 0)
        return 0;
    int n = dlock_async_process(c);
    if (n < 0)
        die_rc("dlock_async_process", n);
    return n;
}

/* Run c's loop until *count reaches want; die after ms. */
static void loop_until(dlock_client *c, const long *count, long want, int64_t ms)
{
    int64_t end = bench_now_ns() + ms * 1000000;
    while (*count < want) {
        if (bench_now_ns() > end)
            bench_die("async: %ld of %ld callbacks after %lld ms", *count, want, (long long)ms);
        loop_once(c, 100);
    }
}

/* Run c's loop for ms, whatever comes. */
static void loop_for(dlock_client *c, int64_t ms)
{
    int64_t end = bench_now_ns() + ms * 1000000;
    for (int64_t now = bench_now_ns(); now < end; now = bench_now_ns())
        loop_once(c, (int)((end - now) / 1000000) + 1);
}

/* Start acquiring name and run c's loop until the callback ran. */
static void async_acquire(dlock_client *c, const char *name, const dlock_acquire_options *o,
                          outcome *got)
{
    int rc = dlock_acquire_async(NULL, c, name, o, on_acquired, got);
    if (rc != DLOCK_OK)
        die_rc("dlock_acquire_async", rc);
    loop_until(c, &got->calls, 1, 20000);
    if (got->rc != DLOCK_OK)
        die_rc("dlock_acquire_async's callback", got->rc);
}

/* Release l and run c's loop until the callback ran: when it ran. */
static int64_t async_release(dlock_client *c, dlock_lock *l)
{
    outcome done = {0};
    int rc = dlock_release_async(NULL, l, on_done, &done);
    if (rc != DLOCK_OK)
        die_rc("dlock_release_async", rc);
    loop_until(c, &done.calls, 1, 20000);
    if (done.rc != DLOCK_OK)
        die_rc("dlock_release_async's callback", done.rc);
    return done.at;
}

/* ---- 1. the uncontended cycle -------------------------------------------- */

/* One cycle (wait_ms 0, a 30 s lease, auto_renew: the defaults), its time
 * in s[0] and its acquire's in s[1] (s NULL: a warm-up). */
static void cycle(dlock_client *c, const char *name, int use_async, bench_series *s)
{
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;
    int64_t t0 = bench_now_ns(), t1, t2;
    if (use_async) {
        outcome got = {0};
        async_acquire(c, name, &o, &got);
        t1 = got.at;
        t2 = async_release(c, got.lock);
    } else {
        dlock_lock *l = NULL;
        int rc = dlock_acquire(&l, c, name, &o);
        t1 = bench_now_ns();
        if (rc != DLOCK_OK || (rc = dlock_release(l)) != DLOCK_OK)
            die_rc("uncontended dlock_acquire + dlock_release", rc);
        t2 = bench_now_ns();
    }
    if (s) {
        bench_series_add(&s[0], t2 - t0);
        bench_series_add(&s[1], t1 - t0);
    }
}

/* ---- 2. the hand-off ----------------------------------------------------- */

/* The waiter's thread: one hand-off per go, with the API use_async says. */
typedef struct {
    dlock_client *blocking, *async; /* one client per API */
    const char *name;
    int use_async, quit;
    sem_t go, done;
    int64_t end;    /* the grant: dlock_acquire returned, or the callback ran */
    uint64_t fence; /* the lock's */
} waiter;

static void *waiter_main(void *arg)
{
    waiter *w = arg;
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;
    o.wait_ms = 10000;
    for (;;) {
        while (sem_wait(&w->go) != 0) {
        }
        if (w->quit)
            return NULL;
        if (w->use_async) {
            outcome got = {0};
            async_acquire(w->async, w->name, &o, &got);
            w->end = got.at;
            w->fence = dlock_lock_fence(got.lock);
            async_release(w->async, got.lock);
        } else {
            dlock_lock *l = NULL;
            int rc = dlock_acquire(&l, w->blocking, w->name, &o);
            w->end = bench_now_ns();
            w->fence = rc == DLOCK_OK ? dlock_lock_fence(l) : 0;
            if (rc != DLOCK_OK || (rc = dlock_release(l)) != DLOCK_OK)
                die_rc("hand-off: the waiter's dlock_acquire + dlock_release", rc);
        }
        sem_post(&w->done);
    }
}

/* The holder (this thread) takes the lock, lets the waiter start, holds it
 * HOLD_MS and releases it: the release's start to the grant goes to s. */
static void handoff(dlock_client *holder, waiter *w, int use_async, bench_series *s)
{
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;
    dlock_lock *l = NULL;
    int rc = dlock_acquire(&l, holder, w->name, &o);
    if (rc != DLOCK_OK)
        die_rc("hand-off: the holder's dlock_acquire", rc);
    uint64_t fence = dlock_lock_fence(l);
    w->use_async = use_async;
    sem_post(&w->go);
    pause_ms(HOLD_MS);
    int64_t t0 = bench_now_ns();
    rc = dlock_release(l);
    if (rc != DLOCK_OK)
        die_rc("hand-off: the holder's dlock_release", rc);
    while (sem_wait(&w->done) != 0) {
    }
    if (w->end < t0)
        bench_die("hand-off (%s): the waiter got the lock before the holder released it",
                  use_async ? "async" : "blocking");
    if (w->fence <= fence)
        bench_die("hand-off: the waiter's fence %llu is not above the holder's %llu",
                  (unsigned long long)w->fence, (unsigned long long)fence);
    if (s)
        bench_series_add(s, w->end - t0);
}

/* ---- 3. many waiters ----------------------------------------------------- */

/* A line of /proc/self/status ("VmRSS:", "Threads:"): its number. */
static long status_field(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    if (f == NULL)
        bench_die("/proc/self/status: %s", strerror(errno));
    while (fgets(line, sizeof line, f) != NULL)
        if (strncmp(line, field, strlen(field)) == 0) {
            v = strtol(line + strlen(field), NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

static struct {
    long n, granted, released;
    int *calls; /* per waiter, by submission */
    long *order; /* order[k]: the waiter granted k-th */
    int64_t last; /* the last grant */
} many;

static void many_released(int rc, void *arg)
{
    (void)arg;
    if (rc != DLOCK_OK)
        die_rc("many waiters: dlock_release_async's callback", rc);
    many.released++;
}

static void many_acquired(int rc, dlock_lock *lock, void *arg)
{
    long i = (long)(intptr_t)arg;
    if (rc != DLOCK_OK)
        die_rc("many waiters: dlock_acquire_async's callback", rc);
    many.last = bench_now_ns();
    if (many.calls[i]++ == 0 && many.granted < many.n)
        many.order[many.granted] = i;
    many.granted++;
    rc = dlock_release_async(NULL, lock, many_released, NULL);
    if (rc != DLOCK_OK)
        die_rc("many waiters: dlock_release_async", rc);
}

static void many_waiters(const char *url, const char *name, long n)
{
    dlock_client *c = open_client(url), *holder_c = open_client(url);
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT, w = DLOCK_ACQUIRE_OPTIONS_INIT;
    dlock_lock *held = NULL;

    o.kind = w.kind = DLOCK_KIND_FAIR;
    w.wait_ms = 120000;
    int rc = dlock_acquire(&held, holder_c, name, &o);
    if (rc != DLOCK_OK)
        die_rc("many waiters: the holder's dlock_acquire", rc);
    /* The client connected and its engine started, as a program's would be. */
    char warm[160];
    snprintf(warm, sizeof warm, "%s:warm", name);
    for (int i = 0; i < 20; i++)
        cycle(c, warm, 1, NULL);
    many.n = n;
    many.calls = calloc((size_t)n, sizeof *many.calls);
    many.order = calloc((size_t)n, sizeof *many.order);
    if (many.calls == NULL || many.order == NULL)
        bench_die("out of memory");

    long threads0 = status_field("Threads:"), rss0 = status_field("VmRSS:");
    for (long i = 0; i < n; i++) {
        rc = dlock_acquire_async(NULL, c, name, &w, many_acquired, (void *)(intptr_t)i);
        if (rc != DLOCK_OK)
            die_rc("many waiters: dlock_acquire_async", rc);
    }
    loop_for(c, 2000);
    long threads1 = status_field("Threads:"), rss1 = status_field("VmRSS:");
    if (many.granted != 0)
        bench_die("many waiters: %ld granted while the holder held the lock", many.granted);

    int64_t t0 = bench_now_ns();
    rc = dlock_release(held);
    if (rc != DLOCK_OK)
        die_rc("many waiters: the holder's dlock_release", rc);
    loop_until(c, &many.granted, n, 240000);
    double all_s = (double)(many.last - t0) / 1e9;
    loop_until(c, &many.released, n, 20000);
    loop_for(c, 200); /* a late second grant would show here */

    /* Order: how many grants came after a later-submitted one, and the
     * farthest a waiter moved from its place in the submission order. */
    long missed = 0, twice = 0, behind = 0, moved = 0;
    for (long k = 0; k < n; k++) {
        missed += many.calls[k] == 0;
        twice += many.calls[k] > 1;
        behind += k > 0 && many.order[k] < many.order[k - 1];
        long d = labs(many.order[k] - k);
        moved = d > moved ? d : moved;
    }
    double per = 1024.0 * (double)(rss1 - rss0) / (double)n;
    printf("%ld async waiters (fair lock, wait_ms 120000), one client, one loop thread:\n", n);
    printf("  RSS while they wait (after 2 s of the loop): +%ld KiB, %.0f B a waiter; target "
           "<= %.0f B a waiter: %s\n",
           rss1 - rss0, per, TARGET_WAITER_BYTES, per <= TARGET_WAITER_BYTES ? "met" : "NOT MET");
    printf("  the process's threads: %ld before queueing, %ld while they wait\n", threads0,
           threads1);
    printf("  all granted in turn %.2f s after the release (%.0f us a hand-off), each "
           "callback releasing with dlock_release_async\n",
           all_s, all_s * 1e6 / (double)n);
    printf("  granted once each: %ld missed, %ld twice (must be 0); in submission order: %s\n"
           "  (%ld grants after a later-submitted waiter's; a waiter moved %ld places at most)\n",
           missed, twice, behind ? "no" : "yes", behind, moved);
    free(many.calls);
    free(many.order);
    dlock_client_free(c);
    dlock_client_free(holder_c);
    if (missed || twice)
        bench_die("many waiters: a waiter missed or granted twice");
}

/* ---- the section --------------------------------------------------------- */

/* The blocking row, then the async one against it with its target. */
static void rows(const char *what, bench_series *b, bench_series *a, double target)
{
    char label[96], base[64];
    double b50 = bench_series_us(b, 50), a50 = bench_series_us(a, 50);
    snprintf(label, sizeof label, "%s, blocking", what);
    bench_print_row(label, b50, bench_series_us(b, 99), -1, NULL, -1, 0);
    snprintf(label, sizeof label, "%s, async", what);
    snprintf(base, sizeof base, "blocking %.1f", b50);
    bench_print_row(label, a50, bench_series_us(a, 99), -1, base, a50 / b50, target);
    free(b->v);
    free(a->v);
}

int bench_async(const char *given_url, long iterations, long waiters)
{
    char url[1024], name[3][128];
    long n = iterations, hand = iterations / 10 < 50 ? 50 : iterations / 10;
    /* [0] blocking, [1] async, [2] async without threads (cycles only) */
    bench_series cyc[3][2] = {{{0}}}, ho[2] = {{0}};
    long pid = (long)getpid();

    if (given_url)
        snprintf(url, sizeof url, "%s", given_url);
    else
        bench_server_start(url, sizeof url);
    printf("dlock-bench --async: dlock %s at %s%s; not pinned\n", dlock_version(),
           bench_redacted(url), given_url ? "" : " (started by this run)");
    printf("  %ld cycles and %ld hand-offs each API, interleaved in %d rounds; %ld waiters\n", n,
           hand, ROUNDS, waiters);

    /* 1. A client per API: the async one's workers stay out of the
     * blocking figure. The loop runs on this thread. */
    dlock_client *c[3] = {open_client(url), open_client(url), NULL};
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    co.flags = DLOCK_CLIENT_NO_THREADS;
    /* A backend that needs threads (etcd, ZooKeeper, SQL) refuses the third. */
    int rc = dlock_client_open(&c[2], url, &co), napi = rc == DLOCK_OK ? 3 : 2;
    if (rc != DLOCK_OK && rc != DLOCK_ENOTSUP)
        die_rc("dlock_client_open", rc);
    for (int a = 0; a < napi; a++)
        snprintf(name[a], sizeof name[a], "dlock-bench:%ld:async:cycle%d", pid, a);
    for (long i = 0; i < n / 10 + 50; i++) /* connections, scripts, workers */
        for (int a = 0; a < napi; a++)
            cycle(c[a], name[a], a > 0, NULL);
    for (int round = 0; round < ROUNDS; round++)
        for (int a = 0; a < napi; a++)
            for (long i = 0; i < n / ROUNDS + (round < n % ROUNDS); i++)
                cycle(c[a], name[a], a > 0, cyc[a]);
    for (int a = 0; a < napi; a++)
        dlock_client_free(c[a]);

    /* 2. The holder on this thread, the waiter's two clients on its own. */
    waiter w;
    pthread_t tw;
    memset(&w, 0, sizeof w);
    snprintf(name[0], sizeof name[0], "dlock-bench:%ld:async:h", pid);
    dlock_client *holder = open_client(url);
    w.blocking = open_client(url);
    w.async = open_client(url);
    w.name = name[0];
    sem_init(&w.go, 0, 0);
    sem_init(&w.done, 0, 0);
    if (pthread_create(&tw, NULL, waiter_main, &w) != 0)
        bench_die("pthread_create failed");
    for (int i = 0; i < 40; i++) /* each waiter subscribed, its workers started */
        handoff(holder, &w, i % 2, NULL);
    for (int round = 0; round < ROUNDS; round++)
        for (int a = 0; a < 2; a++)
            for (long i = 0; i < hand / ROUNDS + (round < hand % ROUNDS); i++)
                handoff(holder, &w, a, &ho[a]);
    w.quit = 1;
    sem_post(&w.go);
    pthread_join(tw, NULL);
    dlock_client_free(w.blocking);
    dlock_client_free(w.async);
    dlock_client_free(holder);

    printf("\n");
    bench_print_header();
    if (napi == 3) {
        /* Printed first: rows() frees the blocking series it compares. */
        double b50 = bench_series_us(&cyc[0][0], 50), t50 = bench_series_us(&cyc[2][0], 50);
        char base[64];
        snprintf(base, sizeof base, "blocking %.1f", b50);
        bench_print_row("cycle, async without threads", t50, bench_series_us(&cyc[2][0], 99),
                        -1, base, t50 / b50, TARGET_CYCLE);
        free(cyc[2][0].v);
        free(cyc[2][1].v);
    }
    rows("cycle", &cyc[0][0], &cyc[1][0], TARGET_CYCLE);
    rows("  of which acquire", &cyc[0][1], &cyc[1][1], 0);
    rows("hand-off", &ho[0], &ho[1], TARGET_HANDOFF);
    printf("cycle: acquire (wait_ms 0, 30 s lease, auto_renew) + release, async driven by a\n"
           "  poll(2) loop on the measuring thread; hand-off: the holder's dlock_release\n"
           "  begins -> the waiter's dlock_acquire returns / its callback runs, each waiter\n"
           "  on a thread of its own (wait_ms 10000), held %d ms.\n\n",
           HOLD_MS);

    /* 3. */
    snprintf(name[0], sizeof name[0], "dlock-bench:%ld:async:many", pid);
    many_waiters(url, name[0], waiters);
    bench_server_stop();
    return 0;
}
