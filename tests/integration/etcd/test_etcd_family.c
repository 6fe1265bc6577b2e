/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The lock family on etcd (src/backends/etcd/etcd_family.c) against a real
 * single-member etcd: read-write locks and semaphores in the queue of keys,
 * their holders in status, list and force release. Several holders at once
 * are processes sharing a MAP_SHARED page of atomics, so any overlap the
 * lock should prevent is seen; a test that waits for a waiter to queue
 * counts the keys on the server. No test decides by how long something
 * took.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

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

/* Release l: the waiter a (in thread t) then holds, with a fence above
 * l's. */
static void hand_over(dlock_lock *l, test_acquirer *a, pthread_t t)
{
    uint64_t fence = dlock_lock_fence(l);

    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(a->rc, DLOCK_OK);
    CHECK(dlock_lock_fence(a->lock) > fence);
}

/* ---- who is inside, across processes -------------------------------------- */

typedef struct {
    atomic_int readers, writers, permit_holders, overlaps;
} inside_counts;

/*
 * procs processes (at most 8) take lock name turns times each, process p
 * as kinds[p] (a semaphore with permits), and count who is inside on a
 * shared page: a writer with anyone, a reader with a writer, or a permit
 * holder beyond permits is an overlap, and there must be none. Readers
 * read as reader_owner (NULL: none).
 */
static void contend(const char *name, const int *kinds, int procs, int turns, int permits,
                    const char *reader_owner)
{
    inside_counts *pg = test_shared_page(sizeof(*pg));
    pid_t pids[8];

    dlock_client_free(start());
    for (int p = 0; p < procs; p++) {
        if ((pids[p] = fork()) != 0) {
            CHECK(pids[p] > 0);
            continue;
        }
        dlock_client *c = another();
        int kind = kinds[p];
        atomic_int *mine = kind == DLOCK_KIND_WRITE  ? &pg->writers
                           : kind == DLOCK_KIND_READ ? &pg->readers
                                                     : &pg->permit_holders;
        for (int turn = 0; turn < turns; turn++) {
            dlock_acquire_options o = kind_opts(kind, DLOCK_WAIT_FOREVER);
            dlock_lock *l;
            o.permits = kind == DLOCK_KIND_SEMAPHORE ? permits : 0;
            o.owner = kind == DLOCK_KIND_READ ? reader_owner : NULL;
            CHECK_RC(dlock_acquire(&l, c, name, &o), DLOCK_OK);
            int before = atomic_fetch_add(mine, 1);
            if ((kind == DLOCK_KIND_WRITE && (before > 0 || atomic_load(&pg->readers) > 0)) ||
                (kind == DLOCK_KIND_READ && atomic_load(&pg->writers) > 0) ||
                (kind == DLOCK_KIND_SEMAPHORE && before >= permits))
                atomic_fetch_add(&pg->overlaps, 1);
            test_sleep_ms(5);
            atomic_fetch_sub(mine, 1);
            CHECK_RC(dlock_release(l), DLOCK_OK);
        }
        dlock_client_free(c);
        _exit(0);
    }
    for (int p = 0; p < procs; p++)
        test_wait_child_ok(pids[p]);
    CHECK(atomic_load(&pg->overlaps) == 0);
    wait_queued(name, 0);
}

/* ---- read-write ----------------------------------------------------------- */

/* Two writers and four readers, 12 turns each. */
static void rw_exclusion_processes(void)
{
    static const int kinds[] = {DLOCK_KIND_WRITE, DLOCK_KIND_WRITE, DLOCK_KIND_READ,
                                DLOCK_KIND_READ,  DLOCK_KIND_READ,  DLOCK_KIND_READ};

    contend("rw", kinds, 6, 12, 0, NULL);
}

/*
 * Writer preference: a writer queued behind a reader holds back a reader
 * that comes after it (a try fails and leaves nothing; a waiter waits for
 * the writer), and gets the lock when the first reader leaves; the late
 * reader gets it when the writer leaves, with a greater fence.
 */
static void rw_waiting_writer_holds_back_readers(void)
{
    dlock_client *c = start(), *c2 = another(), *c3 = another();
    dlock_acquire_options ro = kind_opts(DLOCK_KIND_READ, 0);
    dlock_lock *r1, *r2;
    test_acquirer wa, ra;
    pthread_t tw, tr;

    CHECK_RC(dlock_acquire(&r1, c, "order", &ro), DLOCK_OK);
    test_acquirer_init(&wa, c2, "order", kind_opts(DLOCK_KIND_WRITE, 60000));
    CHECK(pthread_create(&tw, NULL, test_acquirer_main, &wa) == 0);
    wait_queued("order", 2);
    CHECK_RC(dlock_acquire(&r2, c, "order", &ro), DLOCK_EBUSY);
    CHECK(queued("order") == 2);
    test_acquirer_init(&ra, c3, "order", kind_opts(DLOCK_KIND_READ, 60000));
    CHECK(pthread_create(&tr, NULL, test_acquirer_main, &ra) == 0);
    wait_queued("order", 3);
    CHECK(!atomic_load(&wa.done) && !atomic_load(&ra.done));
    hand_over(r1, &wa, tw);
    CHECK(!atomic_load(&ra.done));
    hand_over(wa.lock, &ra, tr);
    CHECK_RC(dlock_release(ra.lock), DLOCK_OK);
    wait_queued("order", 0);
    dlock_client_free(c3);
    dlock_client_free(c2);
    dlock_client_free(c);
}

/*
 * A holder of kind held_kind in a process killed with SIGKILL keeps an
 * acquisition of want_kind out (a try fails) until its own lease runs out
 * on the server; then a waiter is in, and the killed holder's key is gone.
 */
static void killed_holder_lets_waiter_in(const char *name, int held_kind, int want_kind)
{
    dlock_acquire_options held = kind_opts(held_kind, 0), want = kind_opts(want_kind, 0);
    dlock_client *c;
    dlock_lock *l;
    pid_t pid;

    held.permits = held_kind == DLOCK_KIND_SEMAPHORE ? 1 : 0;
    test_etcd_start(&etcd, 1, NULL);
    pid = fork();
    if (pid == 0) {
        CHECK_RC(dlock_acquire(&l, another(), name, &held), DLOCK_OK);
        for (;;)
            pause();
    }
    CHECK(pid > 0);
    wait_queued(name, 1);
    c = another();
    CHECK_RC(dlock_acquire(&l, c, name, &want), DLOCK_EBUSY);
    CHECK(kill(pid, SIGKILL) == 0 && waitpid(pid, NULL, 0) == pid);
    want.wait_ms = 60000;
    CHECK_RC(dlock_acquire(&l, c, name, &want), DLOCK_OK);
    CHECK(queued(name) == 1);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
}

/* A killed reader's lease is its own: a waiting writer gets in when it
 * runs out. */
static void rw_dead_reader_lease_lets_writer_in(void)
{
    killed_holder_lets_waiter_in("dead", DLOCK_KIND_READ, DLOCK_KIND_WRITE);
}

/*
 * Downgrade changes the key's kind in place: the fence and the place stay,
 * so a writer queued behind keeps waiting (for a reader now), a new reader
 * still waits behind that writer, and the writer gets in on the release.
 */
static void rw_downgrade_in_place(void)
{
    dlock_client *c = start(), *c2 = another();
    dlock_acquire_options wo = kind_opts(DLOCK_KIND_WRITE, 0);
    dlock_lock *w, *rd;
    test_acquirer wa;
    pthread_t t;
    uint64_t fence;
    dlock_lock_info info;

    wo.auto_renew = 1;
    CHECK_RC(dlock_acquire(&w, c, "grade", &wo), DLOCK_OK);
    fence = dlock_lock_fence(w);
    test_acquirer_init(&wa, c2, "grade", kind_opts(DLOCK_KIND_WRITE, 60000));
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &wa) == 0);
    wait_queued("grade", 2);
    CHECK_RC(dlock_lock_downgrade(w), DLOCK_OK);
    CHECK(dlock_lock_fence(w) == fence);
    CHECK(dlock_lock_kind(w) == DLOCK_KIND_READ);
    CHECK_RC(dlock_status(&info, c2, "grade"), DLOCK_OK);
    CHECK(info.held && info.kind == DLOCK_KIND_READ && info.fence == fence);
    CHECK_RC(dlock_lock_check(w), DLOCK_OK);
    CHECK(!atomic_load(&wa.done));
    {
        dlock_acquire_options ro = kind_opts(DLOCK_KIND_READ, 0);
        CHECK_RC(dlock_acquire(&rd, c2, "grade", &ro), DLOCK_EBUSY);
    }
    hand_over(w, &wa, t);
    CHECK_RC(dlock_release(wa.lock), DLOCK_OK);
    wait_queued("grade", 0);
    dlock_client_free(c2);
    dlock_client_free(c);
}

/* ---- semaphore -------------------------------------------------------------- */

/* 8 processes, 3 permits, 8 turns each. */
static void semaphore_at_most_n_processes(void)
{
    static const int kinds[8] = {DLOCK_KIND_SEMAPHORE, DLOCK_KIND_SEMAPHORE, DLOCK_KIND_SEMAPHORE,
                                 DLOCK_KIND_SEMAPHORE, DLOCK_KIND_SEMAPHORE, DLOCK_KIND_SEMAPHORE,
                                 DLOCK_KIND_SEMAPHORE, DLOCK_KIND_SEMAPHORE};

    contend("sem", kinds, 8, 8, 3, NULL);
}

/*
 * N is stored by the first acquisition and wins over later options; a try
 * that finds no permit leaves nothing; without N anywhere the error says
 * what to give; raising N lets a waiter in.
 */
static void semaphore_stored_n_and_set_permits(void)
{
    dlock_client *c = start(), *c2 = another();
    dlock_acquire_options o = kind_opts(DLOCK_KIND_SEMAPHORE, 0);
    dlock_lock *a, *b;
    test_acquirer wa;
    pthread_t t;

    CHECK_RC(dlock_acquire(&a, c, "permits", &o), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "permits");
    o.permits = 1;
    CHECK_RC(dlock_acquire(&a, c, "permits", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&b, c2, "permits", &o), DLOCK_EBUSY);
    CHECK(queued("permits") == 1);
    o.permits = 5; /* the stored 1 wins */
    CHECK_RC(dlock_acquire(&b, c2, "permits", &o), DLOCK_EBUSY);
    test_acquirer_init(&wa, c2, "permits", kind_opts(DLOCK_KIND_SEMAPHORE, 60000));
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &wa) == 0);
    wait_queued("permits", 2);
    CHECK(!atomic_load(&wa.done));
    CHECK_RC(dlock_semaphore_set_permits(c, "permits", 2), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(wa.rc, DLOCK_OK);
    CHECK(dlock_lock_fence(wa.lock) > dlock_lock_fence(a));
    CHECK_RC(dlock_release(wa.lock), DLOCK_OK);
    CHECK_RC(dlock_release(a), DLOCK_OK);
    wait_queued("permits", 0);
    dlock_client_free(c2);
    dlock_client_free(c);
}

/* A killed permit holder's permit comes back with its lease. */
static void semaphore_dead_holder_permit_returns(void)
{
    killed_holder_lets_waiter_in("gone", DLOCK_KIND_SEMAPHORE, DLOCK_KIND_SEMAPHORE);
}

/* ---- holders ------------------------------------------------------------------ */

typedef struct {
    int calls, kind, holders;
    uint64_t fences[8];
    char labels[8][DLOCK_LABEL_MAX + 1];
} seen_holders;

static int note_holder(const char *name, const dlock_lock_info *info, void *payload)
{
    seen_holders *s = payload;

    (void)name;
    if (s->calls < 8) {
        s->fences[s->calls] = info->fence;
        snprintf(s->labels[s->calls], sizeof(s->labels[0]), "%s",
                 info->has_holder ? info->label : "");
    }
    s->kind = info->kind;
    s->holders = info->holders;
    s->calls++;
    return 0;
}

/* Three readers, two permit holders, a writer: status counts them with
 * their kind, dlock_status_holders gives each with its own fence and
 * label, list shows each lock once, and a force release breaks every
 * reader. */
static void holders_of_every_kind(void)
{
    dlock_client *c = start();
    dlock_acquire_options ro = kind_opts(DLOCK_KIND_READ, 0);
    dlock_acquire_options so = kind_opts(DLOCK_KIND_SEMAPHORE, 0);
    dlock_acquire_options wo = kind_opts(DLOCK_KIND_WRITE, 0);
    dlock_lock *r[3], *s[2], *w;
    dlock_lock_info info, removed;
    seen_holders seen = {0};
    char label[16];

    /* Not renewed: leases that outlast the test on a loaded machine (2 s
     * ran out under ASan before dlock_list, which saw fewer locks). */
    ro.lease_ms = so.lease_ms = wo.lease_ms = 30000;
    for (int i = 0; i < 3; i++) {
        snprintf(label, sizeof(label), "reader-%d", i);
        ro.label = label;
        CHECK_RC(dlock_acquire(&r[i], c, "books", &ro), DLOCK_OK);
    }
    so.permits = 4;
    for (int i = 0; i < 2; i++)
        CHECK_RC(dlock_acquire(&s[i], c, "seats", &so), DLOCK_OK);
    CHECK_RC(dlock_acquire(&w, c, "ledger", &wo), DLOCK_OK);

    CHECK_RC(dlock_status(&info, c, "books"), DLOCK_OK);
    CHECK(info.held && info.holders == 3 && info.kind == DLOCK_KIND_READ);
    CHECK(info.fence == dlock_lock_fence(r[0]) && info.ttl_ms > 0);
    CHECK(info.has_holder && strcmp(info.label, "reader-0") == 0);
    CHECK_RC(dlock_status_holders(c, "books", note_holder, &seen), DLOCK_OK);
    CHECK(seen.calls == 3 && seen.kind == DLOCK_KIND_READ && seen.holders == 3);
    for (int i = 0; i < 3; i++) {
        snprintf(label, sizeof(label), "reader-%d", i);
        CHECK(seen.fences[i] == dlock_lock_fence(r[i]) && strcmp(seen.labels[i], label) == 0);
    }
    CHECK_RC(dlock_status(&info, c, "seats"), DLOCK_OK);
    CHECK(info.held && info.holders == 2 && info.kind == DLOCK_KIND_SEMAPHORE);
    CHECK_RC(dlock_status(&info, c, "ledger"), DLOCK_OK);
    CHECK(info.held && info.holders == 1 && info.kind == DLOCK_KIND_WRITE);

    memset(&seen, 0, sizeof(seen));
    CHECK_RC(dlock_list(c, "", note_holder, &seen), DLOCK_OK);
    CHECK(seen.calls == 3); /* books, ledger, seats: once each */

    CHECK_RC(dlock_force_release(&removed, c, "books"), DLOCK_OK);
    CHECK(removed.held && removed.holders == 3);
    for (int i = 0; i < 3; i++) {
        CHECK_RC(dlock_lock_check(r[i]), DLOCK_ELOST);
        CHECK_RC(dlock_release(r[i]), DLOCK_ELOST);
    }
    CHECK(queued("books") == 0);
    for (int i = 0; i < 2; i++)
        CHECK_RC(dlock_release(s[i]), DLOCK_OK);
    CHECK_RC(dlock_release(w), DLOCK_OK);
    dlock_client_free(c);
}

/* ---- owner ids -------------------------------------------------------------- */

/*
 * Three holds of one owner (two clients): one hold key each beside the
 * queue's one key, all with the tenure's fence; the watchdog renews the
 * shared lease; the lock is free only after the last release, in any
 * order; a fair lock re-enters too.
 */
static void owner_holds_counted(void)
{
    dlock_client *c = start(), *c2 = another();
    dlock_acquire_options o = kind_opts(DLOCK_KIND_MUTEX, 0), plain = kind_opts(0, 0);
    dlock_lock *h[3], *other;
    uint64_t fence;

    o.owner = "job-42";
    o.reentrant = 1;
    o.auto_renew = 1;
    o.lease_ms = 1500;
    for (int i = 0; i < 3; i++) {
        CHECK_RC(dlock_acquire(&h[i], i == 1 ? c2 : c, "re", &o), DLOCK_OK);
        CHECK(dlock_lock_fence(h[i]) == dlock_lock_fence(h[0]));
    }
    fence = dlock_lock_fence(h[0]);
    CHECK(queued("re") == 1);
    CHECK(test_etcd_count(&etcd, "dlock/re/x") == 3);
    CHECK_RC(dlock_acquire(&other, c2, "re", &plain), DLOCK_EBUSY);
    /* Past several leases: every hold renewed. */
    test_sleep_ms(3000);
    for (int i = 0; i < 3; i++)
        CHECK_RC(dlock_lock_check(h[i]), DLOCK_OK);
    CHECK_RC(dlock_release(h[0]), DLOCK_OK);
    CHECK_RC(dlock_release(h[2]), DLOCK_OK);
    CHECK_RC(dlock_acquire(&other, c2, "re", &plain), DLOCK_EBUSY);
    CHECK(test_etcd_count(&etcd, "dlock/re/x") == 1);
    CHECK_RC(dlock_lock_check(h[1]), DLOCK_OK);
    CHECK_RC(dlock_release(h[1]), DLOCK_OK);
    CHECK(test_etcd_count(&etcd, "dlock/re/") == 0);
    CHECK_RC(dlock_acquire(&other, c2, "re", &plain), DLOCK_OK);
    CHECK(dlock_lock_fence(other) > fence);
    CHECK_RC(dlock_release(other), DLOCK_OK);

    o.kind = DLOCK_KIND_FAIR;
    CHECK_RC(dlock_acquire(&h[0], c, "re-fair", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&h[1], c2, "re-fair", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(h[0]) == dlock_lock_fence(h[1]));
    CHECK_RC(dlock_release(h[0]), DLOCK_OK);
    CHECK(queued("re-fair") == 1);
    CHECK_RC(dlock_release(h[1]), DLOCK_OK);
    CHECK(test_etcd_count(&etcd, "dlock/re-fair/") == 0);
    dlock_client_free(c2);
    dlock_client_free(c);
}

/*
 * Owner ids on a read-write lock: reading under one's own write lock is
 * refused (downgrade instead); after the downgrade, writing under one's own
 * read lock is refused at once even with an endless wait (an upgrade would
 * wait for itself). The downgraded lock keeps its hold key, as a read's;
 * a second read of the owner passes a writer waiting behind the first
 * (a nested read), with its fence, where another owner's read waits.
 */
static void rw_owner_upgrade_refused(void)
{
    dlock_client *c = start(), *c2 = another();
    dlock_acquire_options wo = kind_opts(DLOCK_KIND_WRITE, 0), ro = kind_opts(DLOCK_KIND_READ, 0);
    dlock_lock *w, *rd, *x = NULL;
    test_acquirer wa;
    pthread_t t;

    wo.owner = "alice";
    CHECK_RC(dlock_acquire(&w, c, "grade", &wo), DLOCK_OK);
    ro.owner = "alice";
    CHECK_RC(dlock_acquire(&rd, c, "grade", &ro), DLOCK_EMISUSE);
    CHECK_CONTAINS(dlock_error_message(), "downgrade");
    CHECK_RC(dlock_acquire(&x, c, "grade", &wo), DLOCK_EMISUSE);
    CHECK_RC(dlock_lock_downgrade(w), DLOCK_OK);
    CHECK(test_etcd_count(&etcd, "dlock/grade/x") == 1);
    wo.wait_ms = DLOCK_WAIT_FOREVER;
    CHECK_RC(dlock_acquire(&x, c, "grade", &wo), DLOCK_EMISUSE);
    CHECK_CONTAINS(dlock_error_message(), "upgrade");

    test_acquirer_init(&wa, c2, "grade", kind_opts(DLOCK_KIND_WRITE, 60000));
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &wa) == 0);
    wait_queued("grade", 2);
    {
        dlock_acquire_options other = kind_opts(DLOCK_KIND_READ, 0);
        CHECK_RC(dlock_acquire(&rd, c2, "grade", &other), DLOCK_EBUSY);
    }
    CHECK_RC(dlock_acquire(&rd, c, "grade", &ro), DLOCK_OK);
    CHECK(dlock_lock_fence(rd) == dlock_lock_fence(w));
    CHECK_RC(dlock_release(rd), DLOCK_OK);
    CHECK(!atomic_load(&wa.done));
    hand_over(w, &wa, t);
    CHECK_RC(dlock_release(wa.lock), DLOCK_OK);
    wait_queued("grade", 0);
    CHECK(test_etcd_count(&etcd, "dlock/grade/x") == 0);
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
    hand_over(r2, &wa, t);
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

    contend("race", kinds, 6, 12, 0, "one-owner");
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

TEST_MAIN({"rw_exclusion_processes", rw_exclusion_processes, NULL},
          {"rw_waiting_writer_holds_back_readers", rw_waiting_writer_holds_back_readers, NULL},
          {"rw_dead_reader_lease_lets_writer_in", rw_dead_reader_lease_lets_writer_in, NULL},
          {"rw_downgrade_in_place", rw_downgrade_in_place, "watchdog"},
          {"semaphore_at_most_n_processes", semaphore_at_most_n_processes, NULL},
          {"semaphore_stored_n_and_set_permits", semaphore_stored_n_and_set_permits, NULL},
          {"semaphore_dead_holder_permit_returns", semaphore_dead_holder_permit_returns, NULL},
          {"holders_of_every_kind", holders_of_every_kind, NULL},
          {"owner_holds_counted", owner_holds_counted, "watchdog"},
          {"rw_owner_upgrade_refused", rw_owner_upgrade_refused, NULL},
          {"rw_nested_read_passes_waiting_writer", rw_nested_read_passes_waiting_writer,
           "watchdog"},
          {"rw_nested_reads_go_with_the_lease", rw_nested_reads_go_with_the_lease, NULL},
          {"rw_nested_reads_race_writers", rw_nested_reads_race_writers, NULL},
          {"multi_all_at_once", multi_all_at_once, NULL})
