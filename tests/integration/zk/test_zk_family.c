/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What only ZooKeeper has in the lock family (src/backends/zk/zk_family.c)
 * against a real standalone server: Curator's node layouts for the
 * read-write lock, the semaphore, the election and the fair lock, and the
 * holders read back from those nodes. The contracts every backend keeps
 * are family-zk.* (tests/integration/core/test_family_suite.c). Where a
 * test waits for a waiter to queue, it looks at the server's nodes
 * (test_zk_child_names). Interop with real Curator is tests/interop/curator.
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

/* ---- the fair lock and holders ------------------------------------------------ */

/*
 * FAIR is the mutex's queue ("_c_<uuid>-lock-<seq>" nodes, FIFO by
 * sequence; a Curator InterProcessMutex on the path queues with it), with
 * "kind=fair" in the node data so that status tells it from a mutex; a
 * try-once leaves no node behind.
 */
static void fair_is_the_mutex_queue(void)
{
    dlock_client *c = start(), *c2 = another();
    dlock_acquire_options o = kopts(DLOCK_KIND_FAIR, 0);
    dlock_lock *h, *x = NULL;
    dlock_lock_info info;
    test_acquirer wa;
    pthread_t t;
    char names[4][128];

    CHECK_RC(dlock_acquire(&h, c, "fq", &o), DLOCK_OK);
    CHECK(test_zk_child_names(&zk, "/dlock/fq", names, 4) == 1);
    CHECK(strncmp(names[0], "_c_", 3) == 0 && strstr(names[0], "-lock-") != NULL);
    CHECK_RC(dlock_status(&info, c2, "fq"), DLOCK_OK);
    CHECK(info.held && info.kind == DLOCK_KIND_FAIR && info.holders == 1);
    CHECK(info.fence == dlock_lock_fence(h));
    test_acquirer_init(&wa, c2, "fq", kopts(DLOCK_KIND_FAIR, 60000));
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &wa) == 0);
    wait_children("/dlock/fq", 2);
    CHECK_RC(dlock_acquire(&x, c, "fq", &o), DLOCK_EBUSY);
    CHECK(test_zk_children(&zk, "/dlock/fq") == 2);
    CHECK_RC(dlock_status(&info, c, "fq"), DLOCK_OK);
    CHECK(info.holders == 1 && info.fence == dlock_lock_fence(h)); /* the waiter is none */
    CHECK_RC(dlock_release(h), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(wa.rc, DLOCK_OK);
    CHECK_RC(dlock_release(wa.lock), DLOCK_OK);
    wait_children("/dlock/fq", 0);
    dlock_client_free(c2);
    dlock_client_free(c);
}

static int count_holder(const char *name, const dlock_lock_info *info, void *payload)
{
    (void)name;
    (void)info;
    (*(int *)payload)++;
    return 0;
}

/*
 * Who holds, read from the nodes: a writer queued behind two readers is not
 * a holder; a semaphore's waiter, whose lease node is over N while it holds
 * NAME/locks, is not one either; the leader is the first latch node.
 */
static void holders_from_node_data(void)
{
    dlock_client *c = start(), *c2 = another();
    dlock_acquire_options ro = kopts(DLOCK_KIND_READ, 0), so = kopts(DLOCK_KIND_SEMAPHORE, 0);
    dlock_lock *r[2], *p, *lead;
    dlock_lock_info info;
    dlock_leader_info li;
    test_acquirer wa, sa;
    pthread_t tw, ts;
    int n = 0;

    for (int i = 0; i < 2; i++)
        CHECK_RC(dlock_acquire(&r[i], c, "books", &ro), DLOCK_OK);
    test_acquirer_init(&wa, c2, "books", kopts(DLOCK_KIND_WRITE, 60000));
    CHECK(pthread_create(&tw, NULL, test_acquirer_main, &wa) == 0);
    wait_children("/dlock/books", 3);
    CHECK_RC(dlock_status(&info, c, "books"), DLOCK_OK);
    CHECK(info.held && info.kind == DLOCK_KIND_READ && info.holders == 2);
    CHECK(info.fence == dlock_lock_fence(r[0]));
    CHECK_RC(dlock_status_holders(c, "books", count_holder, &n), DLOCK_OK);
    CHECK(n == 2);

    so.permits = 1;
    CHECK_RC(dlock_acquire(&p, c, "seats", &so), DLOCK_OK);
    test_acquirer_init(&sa, c2, "seats", kopts(DLOCK_KIND_SEMAPHORE, 60000));
    CHECK(pthread_create(&ts, NULL, test_acquirer_main, &sa) == 0);
    wait_children("/dlock/seats/leases", 2); /* the waiter's lease, over N */
    CHECK(test_zk_children(&zk, "/dlock/seats/locks") == 1);
    CHECK_RC(dlock_status(&info, c, "seats"), DLOCK_OK);
    CHECK(info.held && info.kind == DLOCK_KIND_SEMAPHORE && info.holders == 1);
    CHECK(info.fence == dlock_lock_fence(p));
    n = 0;
    CHECK_RC(dlock_status_holders(c, "seats", count_holder, &n), DLOCK_OK);
    CHECK(n == 1);

    CHECK_RC(dlock_campaign(&lead, c, "el", "alpha", NULL), DLOCK_OK);
    CHECK_RC(dlock_status(&info, c2, "el"), DLOCK_OK);
    CHECK(info.held && info.kind == DLOCK_KIND_LEADER && info.holders == 1);
    CHECK_RC(dlock_leader(&li, c2, "el"), DLOCK_OK);
    CHECK(info.fence == li.fence && li.fence == dlock_lock_fence(lead));
    CHECK_RC(dlock_resign(lead), DLOCK_OK);

    for (int i = 0; i < 2; i++)
        CHECK_RC(dlock_release(r[i]), DLOCK_OK);
    CHECK(pthread_join(tw, NULL) == 0);
    CHECK_RC(wa.rc, DLOCK_OK);
    CHECK_RC(dlock_status(&info, c, "books"), DLOCK_OK);
    CHECK(info.held && info.kind == DLOCK_KIND_WRITE && info.holders == 1);
    CHECK_RC(dlock_release(wa.lock), DLOCK_OK);
    CHECK_RC(dlock_release(p), DLOCK_OK);
    CHECK(pthread_join(ts, NULL) == 0);
    CHECK_RC(sa.rc, DLOCK_OK);
    CHECK_RC(dlock_release(sa.lock), DLOCK_OK);
    CHECK_RC(dlock_status(&info, c, "seats"), DLOCK_OK);
    CHECK(!info.held && info.holders == 0);
    dlock_client_free(c2);
    dlock_client_free(c);
}

TEST_MAIN({"rw_downgrade_keeps_place", rw_downgrade_keeps_place, "watchdog"},
          {"semaphore_waiter_and_permits", semaphore_waiter_and_permits, NULL},
          {"leader_latch_and_observer", leader_latch_and_observer, "watchdog"},
          {"fair_is_the_mutex_queue", fair_is_the_mutex_queue, NULL},
          {"holders_from_node_data", holders_from_node_data, NULL})
