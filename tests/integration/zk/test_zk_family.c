/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The lock family on ZooKeeper (src/backends/zk/zk_family.c) against a real
 * standalone server: read-write locks, semaphores, leader election and
 * multi-locks in Curator's layouts. Where a property needs several holders
 * at once, they are processes sharing a MAP_SHARED page of atomics, so any
 * overlap the lock should prevent is seen; where a test waits for a waiter
 * to queue, it looks at the server's nodes (test_zk_child_names). No test
 * decides by how long something took. Interop with real Curator is
 * tests/interop/curator.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

static test_zk zk;

static dlock_client *start(void)
{
    dlock_client *c = NULL;

    test_zk_start(&zk, 1, NULL);
    CHECK_RC(dlock_client_open(&c, zk.url, NULL), DLOCK_OK);
    return c;
}

static dlock_client *another(void)
{
    dlock_client *c = NULL;

    CHECK_RC(dlock_client_open(&c, zk.url, NULL), DLOCK_OK);
    return c;
}

static dlock_acquire_options kopts(int kind, int64_t wait_ms)
{
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;

    o.kind = kind;
    o.wait_ms = wait_ms;
    o.lease_ms = 1500;
    return o;
}

/* Wait (at most 30 s) until path has want children. */
static void wait_children(const char *path, long long want)
{
    for (int i = 0; i < 3000; i++) {
        if (test_zk_children(&zk, path) == want)
            return;
        test_sleep_ms(10);
    }
    fprintf(stderr, "%s never had %lld children (has %lld)\n", path, want,
            test_zk_children(&zk, path));
    exit(1);
}

/* ---- read-write ----------------------------------------------------------- */

typedef struct {
    atomic_int readers, writers, max_readers, bad;
} rw_page;

/* Readers and writers in 6 processes, 15 turns each: a writer is alone,
 * readers share. */
static void rw_readers_share_writers_alone(void)
{
    rw_page *pg = test_shared_page(sizeof(*pg));
    pid_t pids[6];

    dlock_client_free(start()); /* the server runs; each process opens its own */
    for (int p = 0; p < 6; p++) {
        if ((pids[p] = fork()) == 0) {
            dlock_client *c = another();
            int writer = p < 2;
            for (int i = 0; i < 15; i++) {
                dlock_acquire_options o =
                    kopts(writer ? DLOCK_KIND_WRITE : DLOCK_KIND_READ, DLOCK_WAIT_FOREVER);
                dlock_lock *l;
                CHECK_RC(dlock_acquire(&l, c, "rw", &o), DLOCK_OK);
                if (writer) {
                    if (atomic_fetch_add(&pg->writers, 1) != 0 || atomic_load(&pg->readers) != 0)
                        atomic_fetch_add(&pg->bad, 1);
                    test_sleep_ms(5);
                    atomic_fetch_sub(&pg->writers, 1);
                } else {
                    int n = atomic_fetch_add(&pg->readers, 1) + 1, m;
                    if (atomic_load(&pg->writers) != 0)
                        atomic_fetch_add(&pg->bad, 1);
                    while ((m = atomic_load(&pg->max_readers)) < n &&
                           !atomic_compare_exchange_weak(&pg->max_readers, &m, n))
                        ;
                    test_sleep_ms(5);
                    atomic_fetch_sub(&pg->readers, 1);
                }
                CHECK_RC(dlock_release(l), DLOCK_OK);
            }
            dlock_client_free(c);
            _exit(0);
        }
        CHECK(pids[p] > 0);
    }
    for (int p = 0; p < 6; p++)
        test_wait_child_ok(pids[p]);
    CHECK(atomic_load(&pg->bad) == 0);
    wait_children("/dlock/rw", 0);
}

/*
 * Curator's order: a reader waits for the first writer queued before it,
 * so a queued writer holds back readers that come after it (a stream of
 * readers cannot starve it), and the readers before it keep their lock.
 */
static void rw_queued_writer_holds_back_new_readers(void)
{
    dlock_client *c = start(), *c2 = another();
    dlock_acquire_options ro = kopts(DLOCK_KIND_READ, 0);
    dlock_lock *r1, *r2;
    test_acquirer wa;
    pthread_t t;

    CHECK_RC(dlock_acquire(&r1, c, "order", &ro), DLOCK_OK);
    test_acquirer_init(&wa, c2, "order", kopts(DLOCK_KIND_WRITE, 60000));
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &wa) == 0);
    wait_children("/dlock/order", 2); /* the writer queued */
    CHECK_RC(dlock_acquire(&r2, c, "order", &ro), DLOCK_EBUSY);
    wait_children("/dlock/order", 2); /* the try left nothing */
    CHECK(!atomic_load(&wa.done));
    CHECK_RC(dlock_release(r1), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(wa.rc, DLOCK_OK);
    CHECK_RC(dlock_release(wa.lock), DLOCK_OK);
    wait_children("/dlock/order", 0);
    dlock_client_free(c2);
    dlock_client_free(c);
}

/*
 * Downgrade: the read node takes the write node's own sequence, so a writer
 * queued behind keeps waiting (for the read lock now), the fence stays, and
 * the writer gets in when the read lock is released.
 */
static void rw_downgrade_keeps_place(void)
{
    dlock_client *c = start(), *c2 = another();
    dlock_acquire_options wo = kopts(DLOCK_KIND_WRITE, 0);
    char names[4][128];
    dlock_lock *w, *rd;
    test_acquirer wa;
    pthread_t t;
    uint64_t fence;
    const char *seq;
    int n;

    CHECK_RC(dlock_acquire(&w, c, "grade", &wo), DLOCK_OK);
    fence = dlock_lock_fence(w);
    n = test_zk_child_names(&zk, "/dlock/grade", names, 4);
    CHECK(n == 1 && strstr(names[0], "-__WRIT__") != NULL);
    seq = strstr(names[0], "__WRIT__") + 8;
    {
        char want[32];
        snprintf(want, sizeof(want), "-__READ__%s", seq);
        test_acquirer_init(&wa, c2, "grade", kopts(DLOCK_KIND_WRITE, 60000));
        CHECK(pthread_create(&t, NULL, test_acquirer_main, &wa) == 0);
        wait_children("/dlock/grade", 2);
        CHECK_RC(dlock_lock_downgrade(w), DLOCK_OK);
        CHECK(dlock_lock_fence(w) == fence);
        CHECK(dlock_lock_kind(w) == DLOCK_KIND_READ);
        n = test_zk_child_names(&zk, "/dlock/grade", names, 4);
        CHECK(n == 2);
        CHECK(strstr(names[0], want) != NULL || strstr(names[1], want) != NULL);
    }
    CHECK_RC(dlock_lock_check(w), DLOCK_OK);
    CHECK(!atomic_load(&wa.done)); /* still held: a reader, queued first */
    /* A new reader is behind the waiting writer. */
    {
        dlock_acquire_options ro = kopts(DLOCK_KIND_READ, 0);
        CHECK_RC(dlock_acquire(&rd, c2, "grade", &ro), DLOCK_EBUSY);
    }
    CHECK_RC(dlock_release(w), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(wa.rc, DLOCK_OK);
    CHECK(dlock_lock_fence(wa.lock) > fence);
    CHECK_RC(dlock_release(wa.lock), DLOCK_OK);
    wait_children("/dlock/grade", 0);
    dlock_client_free(c2);
    dlock_client_free(c);
}

/* ---- semaphore -------------------------------------------------------------- */

typedef struct {
    atomic_int inside, max, bad;
} sem_page;

static void semaphore_never_exceeds_n(void)
{
    sem_page *pg = test_shared_page(sizeof(*pg));
    pid_t pids[8];

    dlock_client_free(start());
    for (int p = 0; p < 8; p++) {
        if ((pids[p] = fork()) == 0) {
            dlock_client *c = another();
            for (int i = 0; i < 10; i++) {
                dlock_acquire_options o = kopts(DLOCK_KIND_SEMAPHORE, DLOCK_WAIT_FOREVER);
                dlock_lock *l;
                int n, m;
                o.permits = 3;
                CHECK_RC(dlock_acquire(&l, c, "sem", &o), DLOCK_OK);
                n = atomic_fetch_add(&pg->inside, 1) + 1;
                if (n > 3)
                    atomic_fetch_add(&pg->bad, 1);
                while ((m = atomic_load(&pg->max)) < n &&
                       !atomic_compare_exchange_weak(&pg->max, &m, n))
                    ;
                test_sleep_ms(10);
                atomic_fetch_sub(&pg->inside, 1);
                CHECK_RC(dlock_release(l), DLOCK_OK);
            }
            dlock_client_free(c);
            _exit(0);
        }
        CHECK(pids[p] > 0);
    }
    for (int p = 0; p < 8; p++)
        test_wait_child_ok(pids[p]);
    CHECK(atomic_load(&pg->bad) == 0);
    CHECK(atomic_load(&pg->max) <= 3);
    wait_children("/dlock/sem/leases", 0);
    wait_children("/dlock/sem/locks", 0);
}

/*
 * A waiter holds NAME/locks while it waits for a permit (Curator's way),
 * a try-once leaves nothing behind, raising N lets the waiter in, and a
 * killed holder's permit comes back with its session.
 */
static void semaphore_waiter_and_permits(void)
{
    dlock_client *c = start(), *c2 = another();
    dlock_acquire_options o = kopts(DLOCK_KIND_SEMAPHORE, 0);
    dlock_lock *a, *b;
    test_acquirer wa;
    pthread_t t;

    o.permits = 1;
    CHECK_RC(dlock_acquire(&a, c, "permits", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&b, c2, "permits", &o), DLOCK_EBUSY);
    CHECK(test_zk_children(&zk, "/dlock/permits/leases") == 1);
    CHECK(test_zk_children(&zk, "/dlock/permits/locks") == 0);
    /* The stored N wins over the options'. */
    o.permits = 5;
    CHECK_RC(dlock_acquire(&b, c2, "permits", &o), DLOCK_EBUSY);
    test_acquirer_init(&wa, c2, "permits", kopts(DLOCK_KIND_SEMAPHORE, 60000));
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &wa) == 0);
    wait_children("/dlock/permits/leases", 2); /* its lease, over N */
    CHECK(test_zk_children(&zk, "/dlock/permits/locks") == 1);
    CHECK(!atomic_load(&wa.done));
    CHECK_RC(dlock_semaphore_set_permits(c, "permits", 2), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(wa.rc, DLOCK_OK);
    CHECK(dlock_lock_fence(wa.lock) > dlock_lock_fence(a));
    wait_children("/dlock/permits/locks", 0);
    CHECK_RC(dlock_release(wa.lock), DLOCK_OK);
    CHECK_RC(dlock_release(a), DLOCK_OK);
    dlock_client_free(c2);
    dlock_client_free(c);
}

/* A killed holder's permit comes back with its session (2 s here). The
 * holder is forked before the parent has a client (threads). */
static void semaphore_killed_holder_permit_returns(void)
{
    dlock_acquire_options o = kopts(DLOCK_KIND_SEMAPHORE, 60000);
    dlock_client *c;
    dlock_lock *b;
    pid_t pid;

    test_zk_start(&zk, 1, NULL);
    if ((pid = fork()) == 0) {
        dlock_client *ck = another();
        dlock_acquire_options ko = kopts(DLOCK_KIND_SEMAPHORE, 0);
        dlock_lock *k;
        ko.permits = 1;
        CHECK_RC(dlock_acquire(&k, ck, "killed", &ko), DLOCK_OK);
        for (;;)
            pause();
    }
    CHECK(pid > 0);
    wait_children("/dlock/killed/leases", 1);
    c = another();
    {
        dlock_acquire_options once = kopts(DLOCK_KIND_SEMAPHORE, 0);
        CHECK_RC(dlock_acquire(&b, c, "killed", &once), DLOCK_EBUSY);
    }
    CHECK(kill(pid, SIGKILL) == 0);
    CHECK(waitpid(pid, NULL, 0) == pid);
    CHECK_RC(dlock_acquire(&b, c, "killed", &o), DLOCK_OK);
    CHECK_RC(dlock_release(b), DLOCK_OK);
    dlock_client_free(c);
}

/* ---- leader election ------------------------------------------------------------ */

typedef struct {
    pthread_mutex_t mu;
    char seen[8][DLOCK_IDENTITY_MAX + 1];
    uint64_t fences[8];
    int n;
} observed;

static void on_leader(const dlock_leader_info *li, void *payload)
{
    observed *ob = payload;

    pthread_mutex_lock(&ob->mu);
    if (ob->n < 8) {
        snprintf(ob->seen[ob->n], sizeof(ob->seen[0]), "%s", li->held ? li->identity : "-");
        ob->fences[ob->n] = li->fence;
        ob->n++;
    }
    pthread_mutex_unlock(&ob->mu);
}

static int seen_count(observed *ob)
{
    int n;
    pthread_mutex_lock(&ob->mu);
    n = ob->n;
    pthread_mutex_unlock(&ob->mu);
    return n;
}

static void wait_seen(observed *ob, int n)
{
    for (int i = 0; i < 3000 && seen_count(ob) < n; i++)
        test_sleep_ms(10);
    CHECK(seen_count(ob) >= n);
}

/*
 * LeaderLatch's layout: the first latch- node leads and holds the
 * identity; a second candidate waits; the observer is told of each change
 * by the server (a children watch set again after every event).
 */
static void leader_latch_and_observer(void)
{
    dlock_client *c = start(), *c2 = another();
    observed ob = {PTHREAD_MUTEX_INITIALIZER, {{0}}, {0}, 0};
    dlock_observer *obs;
    dlock_leader_info li;
    dlock_lock *a, *b;
    dlock_acquire_options wo = DLOCK_ACQUIRE_OPTIONS_INIT;
    char names[4][128];

    CHECK_RC(dlock_observe(&obs, c2, "el", on_leader, &ob), DLOCK_OK);
    wait_seen(&ob, 1);
    CHECK(strcmp(ob.seen[0], "-") == 0);
    CHECK_RC(dlock_campaign(&a, c, "el", "alpha", NULL), DLOCK_OK);
    CHECK(test_zk_child_names(&zk, "/dlock/el", names, 4) == 1);
    CHECK(strstr(names[0], "-latch-") != NULL && strncmp(names[0], "_c_", 3) == 0);
    CHECK_RC(dlock_leader(&li, c2, "el"), DLOCK_OK);
    CHECK(li.held && strcmp(li.identity, "alpha") == 0 && li.fence == dlock_lock_fence(a));
    wait_seen(&ob, 2);
    CHECK(strcmp(ob.seen[1], "alpha") == 0);
    wo.wait_ms = 0;
    CHECK_RC(dlock_campaign(&b, c2, "el", "beta", &wo), DLOCK_EBUSY);
    CHECK(test_zk_children(&zk, "/dlock/el") == 1);
    CHECK_RC(dlock_resign(a), DLOCK_OK);
    wait_seen(&ob, 3);
    CHECK(strcmp(ob.seen[2], "-") == 0);
    CHECK_RC(dlock_campaign(&b, c2, "el", "beta", NULL), DLOCK_OK);
    wait_seen(&ob, 4);
    CHECK(strcmp(ob.seen[3], "beta") == 0 && ob.fences[3] > ob.fences[1]);
    CHECK_RC(dlock_resign(b), DLOCK_OK);
    dlock_observer_free(obs);
    dlock_client_free(c2);
    dlock_client_free(c);
}

/* ---- multi-lock --------------------------------------------------------------------- */

/* {a,b} against {b,a} in two processes, 20 turns each: the core's global
 * order, one name at a time on ZooKeeper, never deadlocks. */
static void multi_no_deadlock(void)
{
    pid_t pids[2];

    dlock_client_free(start());
    for (int p = 0; p < 2; p++) {
        if ((pids[p] = fork()) == 0) {
            dlock_client *c = another();
            const char *ab[] = {"ma", "mb"}, *ba[] = {"mb", "ma"};
            for (int i = 0; i < 20; i++) {
                dlock_acquire_options o = kopts(DLOCK_KIND_MUTEX, 60000);
                dlock_lock *l;
                CHECK_RC(dlock_acquire_multi(&l, c, p ? ba : ab, 2, &o), DLOCK_OK);
                CHECK(dlock_lock_fence_at(l, 0) > 0 && dlock_lock_fence_at(l, 1) > 0);
                CHECK_RC(dlock_release(l), DLOCK_OK);
            }
            dlock_client_free(c);
            _exit(0);
        }
        CHECK(pids[p] > 0);
    }
    test_wait_child_ok(pids[0]);
    test_wait_child_ok(pids[1]);
}

TEST_MAIN({"rw_readers_share_writers_alone", rw_readers_share_writers_alone, NULL},
          {"rw_queued_writer_holds_back_new_readers", rw_queued_writer_holds_back_new_readers,
           NULL},
          {"rw_downgrade_keeps_place", rw_downgrade_keeps_place, "watchdog"},
          {"semaphore_never_exceeds_n", semaphore_never_exceeds_n, NULL},
          {"semaphore_waiter_and_permits", semaphore_waiter_and_permits, NULL},
          {"semaphore_killed_holder_permit_returns", semaphore_killed_holder_permit_returns,
           NULL},
          {"leader_latch_and_observer", leader_latch_and_observer, "watchdog"},
          {"multi_no_deadlock", multi_no_deadlock, NULL})
