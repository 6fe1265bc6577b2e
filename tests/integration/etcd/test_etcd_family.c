/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What only etcd has in the lock family (src/backends/etcd/etcd_family.c)
 * against a real single-member etcd: the queue's keys behind owner ids and
 * nested reads, and the multi-lock's one txn. The contracts every backend
 * keeps are family-etcd.* (tests/integration/core/test_family_suite.c). A
 * test that waits for a waiter to queue counts the keys on the server; no
 * test decides by how long something took.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"
#include "test_family.h"

static test_etcd etcd;

static dlock_client *another(void)
{
    dlock_client *c = NULL;

    CHECK_RC(dlock_client_open(&c, etcd.url, NULL), DLOCK_OK);
    return c;
}

static dlock_client *start(void)
{
    test_etcd_start(&etcd, 1, NULL);
    return another();
}

static dlock_acquire_options kind_opts(int kind, int64_t wait_ms)
{
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;

    o.kind = kind;
    o.wait_ms = wait_ms;
    o.lease_ms = 2000;
    return o;
}

/* Queued keys of lock name (holders and waiters; not a semaphore's N nor
 * an owner's hold keys, NAME/x...). */
static long long queued(const char *name)
{
    char dir[128], permits[160], holds[160];

    snprintf(dir, sizeof(dir), "dlock/%s/", name);
    snprintf(permits, sizeof(permits), "dlock/%s/permits", name);
    snprintf(holds, sizeof(holds), "dlock/%s/x", name);
    return test_etcd_count(&etcd, dir) - test_etcd_count(&etcd, permits) -
           test_etcd_count(&etcd, holds);
}

/* Wait (at most 30 s) until lock name has want keys queued. */
static void wait_queued(const char *name, long long want)
{
    for (int i = 0; i < 3000 && queued(name) != want; i++)
        test_sleep_ms(10);
    if (queued(name) != want) {
        fprintf(stderr, "lock %s never had %lld keys (has %lld)\n", name, want, queued(name));
        exit(1);
    }
}

/* ---- owner ids -------------------------------------------------------------- */

/*
 * etcd keeps an owner's re-entries as hold keys beside the queue's one key
 * (the contract is family-etcd.reentrant_counts): one key each, for the
 * mutex and the fair lock, gone with the last release.
 */
static void owner_hold_keys(void)
{
    dlock_client *c = start(), *c2 = another();
    dlock_acquire_options o = kind_opts(DLOCK_KIND_MUTEX, 0);
    dlock_lock *h[3];

    o.owner = "job-42";
    o.reentrant = 1;
    for (int i = 0; i < 3; i++)
        CHECK_RC(dlock_acquire(&h[i], i == 1 ? c2 : c, "re", &o), DLOCK_OK);
    CHECK(queued("re") == 1);
    CHECK(test_etcd_count(&etcd, "dlock/re/x") == 3);
    CHECK_RC(dlock_release(h[0]), DLOCK_OK);
    CHECK_RC(dlock_release(h[2]), DLOCK_OK);
    CHECK(queued("re") == 1);
    CHECK(test_etcd_count(&etcd, "dlock/re/x") == 1);
    CHECK_RC(dlock_release(h[1]), DLOCK_OK);
    CHECK(test_etcd_count(&etcd, "dlock/re/") == 0);

    o.kind = DLOCK_KIND_FAIR;
    CHECK_RC(dlock_acquire(&h[0], c, "re-fair", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&h[1], c2, "re-fair", &o), DLOCK_OK);
    CHECK(test_etcd_count(&etcd, "dlock/re-fair/x") == 2);
    CHECK_RC(dlock_release(h[0]), DLOCK_OK);
    CHECK(queued("re-fair") == 1);
    CHECK_RC(dlock_release(h[1]), DLOCK_OK);
    CHECK(test_etcd_count(&etcd, "dlock/re-fair/") == 0);
    dlock_client_free(c2);
    dlock_client_free(c);
}

/*
 * A nested read (a second read of an owner id that reads) passes a writer
 * waiting behind the first: it queues no key of its own (the queue keeps
 * the first read's key and the writer's), gets the first read's fence, and
 * keeps the first read's key, and so the writer, out after the first read
 * is released; the writer gets in once both are.
 */
static void rw_nested_read_passes_waiting_writer(void)
{
    dlock_client *c = start(), *c2 = another();
    dlock_acquire_options ro = kind_opts(DLOCK_KIND_READ, 0), other = ro;
    dlock_lock *r1, *r2, *x = NULL;
    test_acquirer wa;
    pthread_t t;

    ro.owner = "alice";
    ro.auto_renew = 1;
    CHECK_RC(dlock_acquire(&r1, c, "nest", &ro), DLOCK_OK);
    test_acquirer_init(&wa, c2, "nest", kind_opts(DLOCK_KIND_WRITE, 60000));
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &wa) == 0);
    wait_queued("nest", 2);
    CHECK_RC(dlock_acquire(&x, c2, "nest", &other), DLOCK_EBUSY);
    CHECK_RC(dlock_acquire(&r2, c2, "nest", &ro), DLOCK_OK); /* from another client */
    CHECK(dlock_lock_fence(r2) == dlock_lock_fence(r1));
    CHECK(queued("nest") == 2);
    CHECK(test_etcd_count(&etcd, "dlock/nest/x") == 2);
    /* A nested read shares the first read's lease: no longer one. */
    ro.lease_ms = 10000;
    CHECK_RC(dlock_acquire(&x, c, "nest", &ro), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "nested read");
    /* The first read goes; its key stays with the nested one. */
    CHECK_RC(dlock_release(r1), DLOCK_OK);
    CHECK(queued("nest") == 2);
    CHECK(test_etcd_count(&etcd, "dlock/nest/x") == 1);
    CHECK_RC(dlock_lock_check(r2), DLOCK_OK);
    CHECK(!atomic_load(&wa.done));
    test_hand_over(r2, &wa, t);
    CHECK(test_etcd_count(&etcd, "dlock/nest/x") == 0);
    CHECK_RC(dlock_release(wa.lock), DLOCK_OK);
    wait_queued("nest", 0);
    dlock_client_free(c2);
    dlock_client_free(c);
}

/*
 * Nested reads racing: four processes read as one owner id, so their reads
 * nest into whichever of the owner's reader keys holds and are released in
 * any order, while two writers take turns; no writer is ever inside with a
 * reader or a writer.
 */
static void rw_nested_reads_race_writers(void)
{
    static const int kinds[] = {DLOCK_KIND_WRITE, DLOCK_KIND_WRITE, DLOCK_KIND_READ,
                                DLOCK_KIND_READ,  DLOCK_KIND_READ,  DLOCK_KIND_READ};
    test_contend_opts o = {0};
    test_contend_result r;

    dlock_client_free(start());
    o.url = etcd.url;
    o.name = "race";
    o.kinds = kinds;
    o.procs = 6;
    o.turns = 12;
    o.reader_owner = "one-owner";
    o.lease_ms = 2000;
    o.hold_us = 5000;
    test_contend_run(&o, &r);
    wait_queued("race", 0);
    CHECK(test_etcd_count(&etcd, "dlock/race/x") == 0);
}

/*
 * An owner's reads die with its process: a child reads and reads again
 * (nested) and is killed with SIGKILL while a writer waits; the writer
 * gets in when the shared lease runs out, and no hold key is left.
 */
static void rw_nested_reads_go_with_the_lease(void)
{
    dlock_acquire_options ro = kind_opts(DLOCK_KIND_READ, 0);
    dlock_client *c;
    dlock_lock *l;
    pid_t pid;

    test_etcd_start(&etcd, 1, NULL);
    ro.owner = "bob";
    ro.auto_renew = 1; /* held until killed */
    pid = fork();
    if (pid == 0) {
        dlock_client *cc = another();
        CHECK_RC(dlock_acquire(&l, cc, "gone", &ro), DLOCK_OK);
        CHECK_RC(dlock_acquire(&l, cc, "gone", &ro), DLOCK_OK);
        for (;;)
            pause();
    }
    CHECK(pid > 0);
    for (int i = 0; i < 3000 && test_etcd_count(&etcd, "dlock/gone/x") != 2; i++)
        test_sleep_ms(10);
    CHECK(test_etcd_count(&etcd, "dlock/gone/x") == 2);
    CHECK(queued("gone") == 1);
    c = another();
    {
        dlock_acquire_options wo = kind_opts(DLOCK_KIND_WRITE, 0);
        CHECK_RC(dlock_acquire(&l, c, "gone", &wo), DLOCK_EBUSY);
        CHECK(kill(pid, SIGKILL) == 0 && waitpid(pid, NULL, 0) == pid);
        wo.wait_ms = 60000;
        CHECK_RC(dlock_acquire(&l, c, "gone", &wo), DLOCK_OK);
    }
    CHECK(queued("gone") == 1);
    CHECK(test_etcd_count(&etcd, "dlock/gone/x") == 0);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
}

/* ---- multi-lock ------------------------------------------------------------- */

typedef struct {
    dlock_client *c;
    dlock_lock *lock;
    int rc;
    atomic_int done;
} multi_waiter;

static void *multi_main(void *p)
{
    multi_waiter *m = p;
    const char *names[] = {"ma", "mb", "mc"};
    dlock_acquire_options o = kind_opts(DLOCK_KIND_MUTEX, 60000);

    m->rc = dlock_acquire_multi(&m->lock, m->c, names, 3, &o);
    atomic_store(&m->done, 1);
    return NULL;
}

/*
 * All or nothing in one txn: while one name is held, a waiting multi-lock
 * holds none of the others (another client takes and gives back one of
 * them meanwhile); the holder's release lets it take all three at once,
 * at one revision, so every name's fence is the same and above the old
 * holder's.
 */
static void multi_all_at_once(void)
{
    dlock_client *c = start(), *c2 = another();
    dlock_acquire_options o = kind_opts(DLOCK_KIND_MUTEX, 0);
    multi_waiter m = {0};
    dlock_lock *held, *b;
    pthread_t t;
    uint64_t fence;

    CHECK_RC(dlock_acquire(&held, c2, "mc", &o), DLOCK_OK);
    m.c = c;
    CHECK(pthread_create(&t, NULL, multi_main, &m) == 0);
    for (int i = 0; i < 5; i++) {
        test_sleep_ms(100);
        CHECK(!atomic_load(&m.done));
        CHECK(queued("ma") == 0 && queued("mb") == 0);
    }
    CHECK_RC(dlock_acquire(&b, c2, "mb", &o), DLOCK_OK);
    CHECK_RC(dlock_release(b), DLOCK_OK);
    fence = dlock_lock_fence(held);
    CHECK_RC(dlock_release(held), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(m.rc, DLOCK_OK);
    CHECK(dlock_lock_fence_at(m.lock, 0) == dlock_lock_fence_at(m.lock, 2));
    CHECK(dlock_lock_fence_at(m.lock, 1) == dlock_lock_fence_at(m.lock, 2));
    CHECK(dlock_lock_fence_at(m.lock, 2) > fence);
    CHECK_RC(dlock_acquire(&b, c2, "ma", &o), DLOCK_EBUSY);
    CHECK_RC(dlock_release(m.lock), DLOCK_OK);
    CHECK(queued("ma") + queued("mb") + queued("mc") == 0);
    dlock_client_free(c2);
    dlock_client_free(c);
}

TEST_MAIN({"owner_hold_keys", owner_hold_keys, NULL},
          {"rw_nested_read_passes_waiting_writer", rw_nested_read_passes_waiting_writer,
           "watchdog"},
          {"rw_nested_reads_go_with_the_lease", rw_nested_reads_go_with_the_lease, NULL},
          {"rw_nested_reads_race_writers", rw_nested_reads_race_writers, NULL},
          {"multi_all_at_once", multi_all_at_once, NULL})
