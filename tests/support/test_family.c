/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The lock family's shared test code (test_family.h): contending processes
 * that count violations on a shared page, waits for a waiter read from the
 * client's counters, and election observers.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_family.h"

/* ---- contending processes ---------------------------------------------- */

typedef struct {
    atomic_int go;
    atomic_int excl, shared, violations, max_shared, turns;
    atomic_ullong last_fence[2]; /* exclusive holders' (a multi-lock: per name) */
    atomic_int nfences;
    uint64_t fences[TEST_CONTEND_MAX_TURNS]; /* permits' */
} contend_page;

struct test_contend {
    contend_page *pg;
    pid_t pids[TEST_CONTEND_MAX_PROCS];
    int procs;
};

static int64_t mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void violation(contend_page *pg, int p, const char *what)
{
    atomic_fetch_add(&pg->violations, 1);
    fprintf(stderr, "process %d: %s\n", p, what);
}

static int exclusive_kind(int kind)
{
    return kind != DLOCK_KIND_READ && kind != DLOCK_KIND_SEMAPHORE;
}

/* An exclusive holder's fences must be above every one before it. */
static void check_fence(contend_page *pg, int p, int slot, uint64_t fence)
{
    uint64_t last = atomic_load(&pg->last_fence[slot]);

    if (fence <= last)
        violation(pg, p, "an exclusive holder's fence is not above the last holder's");
    atomic_store(&pg->last_fence[slot], fence);
}

static int acquire(dlock_lock **l, dlock_client *c, const test_contend_opts *o, int p, int kind)
{
    dlock_acquire_options a = DLOCK_ACQUIRE_OPTIONS_INIT;
    char id[32];

    a.wait_ms = o->wait_ms != 0 ? o->wait_ms : 30000;
    a.lease_ms = o->lease_ms != 0 ? o->lease_ms : 5000;
    if (kind == DLOCK_KIND_LEADER) {
        snprintf(id, sizeof(id), "candidate-%d", p);
        return dlock_campaign(l, c, o->name, id, &a);
    }
    if (kind == DLOCK_KIND_MULTI) {
        const char *names[2] = {o->names[p % 2], o->names[1 - p % 2]};
        return dlock_acquire_multi(l, c, names, 2, &a);
    }
    a.kind = kind;
    a.permits = kind == DLOCK_KIND_SEMAPHORE ? o->permits : 0;
    a.owner = kind == DLOCK_KIND_READ ? o->reader_owner : NULL;
    return dlock_acquire(l, c, o->name, &a);
}

static void child(const test_contend_opts *o, contend_page *pg, int p)
{
    int kind = o->kinds[p];
    int hold_us = o->hold_us > 0 ? o->hold_us : 1000;
    dlock_client *c = NULL;
    int64_t until = mono_ms() + 60000;
    int rc;

    alarm(110); /* the parent gives up at 90 s; never outlive it */
    while (!atomic_load(&pg->go)) {
        if (mono_ms() > until)
            _exit(4);
        usleep(1000);
    }
    if ((rc = dlock_client_open(&c, o->url, NULL)) != DLOCK_OK) {
        fprintf(stderr, "process %d: open: %s\n", p, dlock_error_message());
        _exit(2);
    }
    for (int turn = 0; turn < o->turns; turn++) {
        dlock_lock *l;
        uint64_t fence;

        if ((rc = acquire(&l, c, o, p, kind)) != DLOCK_OK) {
            fprintf(stderr, "process %d turn %d: acquire: %s: %s\n", p, turn, dlock_strerror(rc),
                    dlock_error_message());
            _exit(3);
        }
        fence = dlock_lock_fence(l);
        if (exclusive_kind(kind)) {
            if (atomic_fetch_add(&pg->excl, 1) != 0 || atomic_load(&pg->shared) != 0)
                violation(pg, p, "an exclusive holder is inside with another holder");
            if (kind == DLOCK_KIND_MULTI) {
                for (size_t i = 0; i < dlock_lock_count(l); i++)
                    check_fence(pg, p, strcmp(dlock_lock_name_at(l, i), o->names[0]) != 0,
                                dlock_lock_fence_at(l, i));
            } else {
                check_fence(pg, p, 0, fence);
            }
            if (kind == DLOCK_KIND_LEADER) {
                dlock_leader_info li;
                char id[32];
                snprintf(id, sizeof(id), "candidate-%d", p);
                if (dlock_leader(&li, c, o->name) != DLOCK_OK || !li.held ||
                    strcmp(li.identity, id) != 0 || li.fence != fence)
                    violation(pg, p, "the leader does not read itself as leader");
            }
            usleep((useconds_t)hold_us);
            if (atomic_load(&pg->shared) != 0)
                violation(pg, p, "a reader came in while an exclusive holder was inside");
            atomic_fetch_sub(&pg->excl, 1);
        } else {
            int n = atomic_fetch_add(&pg->shared, 1) + 1, m = atomic_load(&pg->max_shared);
            if (kind == DLOCK_KIND_READ && atomic_load(&pg->excl) != 0)
                violation(pg, p, "a reader is inside with a writer");
            if (kind == DLOCK_KIND_SEMAPHORE && n > o->permits)
                violation(pg, p, "more permit holders than permits");
            while (n > m && !atomic_compare_exchange_weak(&pg->max_shared, &m, n))
                ;
            if (kind == DLOCK_KIND_SEMAPHORE) {
                int i = atomic_fetch_add(&pg->nfences, 1);
                if (i < TEST_CONTEND_MAX_TURNS)
                    pg->fences[i] = fence;
            }
            if (o->meet > 0 && turn == 0) {
                int64_t meet_until = mono_ms() + 20000;
                while (atomic_load(&pg->max_shared) < o->meet && mono_ms() < meet_until)
                    usleep(1000);
                /* Stay a while, full: whoever else tries now must wait. */
                usleep(200000);
            }
            usleep((useconds_t)hold_us);
            if (kind == DLOCK_KIND_READ && atomic_load(&pg->excl) != 0)
                violation(pg, p, "a writer came in while a reader was inside");
            atomic_fetch_sub(&pg->shared, 1);
        }
        if ((rc = dlock_release(l)) != DLOCK_OK) {
            fprintf(stderr, "process %d turn %d: release: %s: %s\n", p, turn, dlock_strerror(rc),
                    dlock_error_message());
            _exit(3);
        }
        atomic_fetch_add(&pg->turns, 1);
    }
    dlock_client_free(c);
    _exit(0);
}

test_contend *test_contend_start(const test_contend_opts *o)
{
    test_contend *t = calloc(1, sizeof(*t));

    CHECK(t != NULL);
    CHECK(o->procs > 0 && o->procs <= TEST_CONTEND_MAX_PROCS);
    CHECK(o->procs * o->turns <= TEST_CONTEND_MAX_TURNS);
    t->pg = test_shared_page(sizeof(contend_page));
    t->procs = o->procs;
    fflush(NULL);
    for (int p = 0; p < o->procs; p++) {
        t->pids[p] = fork();
        CHECK(t->pids[p] >= 0);
        if (t->pids[p] == 0)
            child(o, t->pg, p);
    }
    return t;
}

void test_contend_go(test_contend *t)
{
    atomic_store(&t->pg->go, 1);
}

void test_contend_finish(test_contend *t, test_contend_result *out)
{
    int64_t until = mono_ms() + 90000;
    int left = t->procs, failed = 0, n;
    contend_page *pg = t->pg;

    while (left > 0) {
        /* Our children only: the servers the test started are children too. */
        for (int p = 0; p < t->procs; p++) {
            int status;
            pid_t pid;
            if (t->pids[p] <= 0)
                continue;
            pid = waitpid(t->pids[p], &status, WNOHANG);
            CHECK(pid >= 0 || errno == EINTR);
            if (pid != t->pids[p])
                continue;
            t->pids[p] = 0;
            left--;
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                fprintf(stderr, "contending process %d failed (status %d)\n", p, status);
                failed = 1;
            }
        }
        if (left == 0)
            break;
        if (mono_ms() > until) {
            for (int p = 0; p < t->procs; p++)
                if (t->pids[p] > 0) {
                    fprintf(stderr, "contending process %d still runs after 90 s: killed\n", p);
                    kill(t->pids[p], SIGKILL);
                    waitpid(t->pids[p], NULL, 0);
                }
            exit(1);
        }
        usleep(5000);
    }
    CHECK(!failed);
    n = atomic_load(&pg->nfences);
    n = n < TEST_CONTEND_MAX_TURNS ? n : TEST_CONTEND_MAX_TURNS;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (pg->fences[i] == pg->fences[j] || pg->fences[i] == 0)
                violation(pg, -1, "a permit's fence was issued twice (or is 0)");
    out->violations = atomic_load(&pg->violations);
    out->max_shared = atomic_load(&pg->max_shared);
    out->turns = atomic_load(&pg->turns);
    munmap(pg, sizeof(*pg));
    free(t);
}

void test_contend_run(const test_contend_opts *o, test_contend_result *out)
{
    test_contend *t = test_contend_start(o);

    test_contend_go(t);
    test_contend_finish(t, out);
    fprintf(stderr, "%d processes, %d turns: %d violations, at most %d shared holders\n",
            o->procs, out->turns, out->violations, out->max_shared);
    CHECK(out->violations == 0);
    CHECK(out->turns == o->procs * o->turns);
}

/* ---- waiting for a waiter ------------------------------------------------ */

uint64_t test_busy_tries(const dlock_client *c)
{
    dlock_stats st = DLOCK_STATS_INIT;

    CHECK_RC(dlock_client_stats(&st, c), DLOCK_OK);
    return st.busy;
}

uint64_t test_tries_to_queue(const dlock_client *c)
{
    return strcmp(dlock_client_backend(c), "zk") == 0 ? 1 : 2;
}

void test_wait_busy(const dlock_client *c, uint64_t want, const char *what)
{
    for (int i = 0; i < 3000; i++) {
        if (test_busy_tries(c) >= want)
            return;
        test_sleep_ms(10);
    }
    fprintf(stderr, "%s: never found the lock busy %llu times (%llu)\n", what,
            (unsigned long long)want, (unsigned long long)test_busy_tries(c));
    exit(1);
}

void test_wait_atomic(atomic_int *v, int want, const char *what)
{
    for (int i = 0; i < 3000; i++) {
        if (atomic_load(v) >= want)
            return;
        test_sleep_ms(10);
    }
    fprintf(stderr, "%s: %d, never reached %d\n", what, atomic_load(v), want);
    exit(1);
}

/* ---- election observers ------------------------------------------------ */

static void on_leader(const dlock_leader_info *leader, void *payload)
{
    test_leader_watch *w = payload;

    pthread_mutex_lock(&w->mu);
    if (w->calls < TEST_LEADER_SEEN) {
        snprintf(w->seen[w->calls], sizeof(w->seen[0]), "%s", leader->held ? leader->identity : "");
        w->fences[w->calls] = leader->held ? leader->fence : 0;
    }
    w->calls++;
    w->last = *leader;
    pthread_mutex_unlock(&w->mu);
}

void test_leader_watch_start(test_leader_watch *w, dlock_client *c, const char *name)
{
    memset(w, 0, sizeof(*w));
    pthread_mutex_init(&w->mu, NULL);
    CHECK_RC(dlock_observe(&w->obs, c, name, on_leader, w), DLOCK_OK);
}

uint64_t test_leader_watch_wait(test_leader_watch *w, const char *identity)
{
    for (int i = 0; i < 3000; i++) {
        uint64_t fence = 0;
        int ok;
        pthread_mutex_lock(&w->mu);
        ok = w->calls > 0 && w->last.held == (identity[0] != '\0') &&
             (!w->last.held || strcmp(w->last.identity, identity) == 0);
        fence = w->last.fence;
        pthread_mutex_unlock(&w->mu);
        if (ok)
            return fence;
        test_sleep_ms(10);
    }
    pthread_mutex_lock(&w->mu);
    fprintf(stderr, "the observer never reported leader '%s' (last '%s', held %d, %d calls)\n",
            identity, w->last.identity, w->last.held, w->calls);
    pthread_mutex_unlock(&w->mu);
    exit(1);
}

int test_leader_watch_calls(test_leader_watch *w)
{
    int n;

    pthread_mutex_lock(&w->mu);
    n = w->calls;
    pthread_mutex_unlock(&w->mu);
    return n;
}

void test_leader_watch_stop(test_leader_watch *w)
{
    dlock_observer_free(w->obs);
    w->obs = NULL;
    pthread_mutex_destroy(&w->mu);
}
