/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The lock family's conformance suite (docs/family.md): one list of cases,
 * run once per backend (`test_family_suite redis CASE`), as test_core is
 * for the mutex. A case for a kind runs when the backend declares the kind,
 * which the case finds out as a user would: a try-once acquisition of it,
 * which the core answers DLOCK_ENOTSUP for a kind outside the backend's
 * caps (owner ids for the reentrant cases, dlock_campaign for elections,
 * dlock_acquire_multi for multi-locks). A case whose kind is not declared
 * says so and passes; any other way out of a case is a failure, so a
 * backend that declares a kind gets its contract checked.
 *
 * The contracts are those of include/dlock/dlock.h ("Lock kinds" and "The
 * lock family"), each under one name here. What only one backend has (the
 * keys, nodes and command counts behind a kind) stays in
 * integration/<backend>. Contention is processes on a shared page
 * (tests/support/test_family.c); a waiter is known to be queued when its
 * client's counters say the server found the lock busy twice: the core's
 * first try leaves nothing, the second is made with the waiter's watch.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test.h"
#include "test_family.h"

static const char *backend; /* argv[1] */

/* Not a kind: owner ids and reentrancy (DLOCK_CAP_OWNER_IDS). */
#define OWNER_IDS 100

static const char *kind_name(int kind)
{
    switch (kind) {
    case DLOCK_KIND_FAIR: return "the fair lock (DLOCK_KIND_FAIR)";
    case DLOCK_KIND_READ: return "the read-write lock (DLOCK_KIND_READ)";
    case DLOCK_KIND_WRITE: return "the read-write lock (DLOCK_KIND_WRITE)";
    case DLOCK_KIND_SEMAPHORE: return "the semaphore (DLOCK_KIND_SEMAPHORE)";
    case DLOCK_KIND_LEADER: return "leader election (dlock_campaign)";
    case DLOCK_KIND_MULTI: return "the multi-lock (dlock_acquire_multi)";
    case OWNER_IDS: return "owner ids and reentrancy";
    default: return "?";
    }
}

static dlock_client *open_client(const test_server *s)
{
    dlock_client *c = NULL;

    CHECK_RC(dlock_client_open(&c, s->url, NULL), DLOCK_OK);
    return c;
}

/* 1 if the backend behind c declares kind: a try-once of it is anything
 * but DLOCK_ENOTSUP (and must then succeed: the probe's names are free). */
static int declares(dlock_client *c, int kind)
{
    dlock_acquire_options o = test_opts(0, 5000, 0);
    dlock_lock *l = NULL;
    char name[32];
    int rc;

    snprintf(name, sizeof(name), "declared-%d", kind);
    if (kind == DLOCK_KIND_LEADER) {
        rc = dlock_campaign(&l, c, name, "probe", &o);
    } else if (kind == DLOCK_KIND_MULTI) {
        const char *names[2] = {"declared-m1", "declared-m2"};
        rc = dlock_acquire_multi(&l, c, names, 2, &o);
    } else if (kind == OWNER_IDS) {
        o.owner = "probe";
        o.reentrant = 1;
        rc = dlock_acquire(&l, c, name, &o);
    } else {
        o.kind = kind;
        o.permits = kind == DLOCK_KIND_SEMAPHORE ? 1 : 0;
        rc = dlock_acquire(&l, c, name, &o);
    }
    if (rc == DLOCK_ENOTSUP)
        return 0;
    CHECK_RC(rc, DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    return 1;
}

/*
 * Start the backend's server and probe kinds (up to two; -1 for none). 1
 * when all are declared; else print which is not, stop the server and
 * return 0 (the case then passes: it does not apply). The probe's client
 * is freed before the case goes on, so that the case may fork before it
 * has threads of the library's.
 */
static int begin(test_server *s, int kind, int kind2)
{
    dlock_client *c;
    int missing = -1;

    test_server_start(s, backend);
    c = open_client(s);
    if (!declares(c, kind))
        missing = kind;
    else if (kind2 >= 0 && !declares(c, kind2))
        missing = kind2;
    dlock_client_free(c);
    if (missing < 0)
        return 1;
    printf("not declared: backend %s does not serve %s (the core answers DLOCK_ENOTSUP): "
           "this case does not apply\n", s->backend, kind_name(missing));
    test_server_stop(s);
    return 0;
}

/* Wait (at most 20 s) until name is free, as dlock_status reads it. */
static void wait_free(dlock_client *c, const char *name)
{
    dlock_lock_info info;

    for (int i = 0; i < 2000; i++) {
        CHECK_RC(dlock_status(&info, c, name), DLOCK_OK);
        if (!info.held)
            return;
        test_sleep_ms(10);
    }
    fprintf(stderr, "'%s' is still held after 20 s\n", name);
    exit(1);
}

static void kill_child(pid_t pid)
{
    CHECK(kill(pid, SIGKILL) == 0);
    CHECK(waitpid(pid, NULL, 0) == pid);
}

static dlock_acquire_options kopts(int kind, int64_t wait_ms, int64_t lease_ms)
{
    dlock_acquire_options o = test_opts(wait_ms, lease_ms, 1);

    o.kind = kind;
    return o;
}

/* ---------------------------------------------------------------------- */
/* Reentrant */

/*
 * One owner id takes the lock again at once, from another client and
 * thread too, with the same fence; the watchdog keeps every hold; status
 * counts the holds; the lock is free after the last release, not before;
 * another owner, or no owner, waits. Without reentrant an owner that holds
 * it is told at once. A hold whose lease ran out stays lost when the owner
 * takes the lock again, and cannot release the new hold.
 */
static void reentrant_counts(void)
{
    test_server s;
    dlock_client *c, *c2;
    dlock_lock *h[3], *other = NULL, *old, *cur;
    dlock_acquire_options o, plain, stale;
    dlock_lock_info info;
    test_acquirer a3;
    pthread_t t;
    char owner[DLOCK_OWNER_GENERATED_LEN + 1];
    uint64_t fence;

    if (!begin(&s, OWNER_IDS, -1))
        return;
    c = open_client(&s);
    c2 = open_client(&s);
    o = kopts(DLOCK_KIND_MUTEX, 0, s.short_lease_ms);
    plain = kopts(DLOCK_KIND_MUTEX, 0, 5000);
    CHECK_RC(dlock_owner_generate(owner, sizeof(owner)), DLOCK_OK);
    o.owner = owner;
    o.reentrant = 1;
    CHECK_RC(dlock_acquire(&h[0], c, "re", &o), DLOCK_OK);
    fence = dlock_lock_fence(h[0]);
    CHECK_RC(dlock_acquire(&h[1], c, "re", &o), DLOCK_OK);
    CHECK(h[1] != h[0] && dlock_lock_fence(h[1]) == fence);
    test_acquirer_init(&a3, c2, "re", o); /* another thread, another client */
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &a3) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(a3.rc, DLOCK_OK);
    h[2] = a3.lock;
    CHECK(dlock_lock_fence(h[2]) == fence && dlock_lock_kind(h[2]) == DLOCK_KIND_MUTEX);
    CHECK_RC(dlock_status(&info, c2, "re"), DLOCK_OK);
    /* The three handles, or 1 where the backend does not count an owner's
     * handles (the header allows it: etcd keeps re-entries beside the
     * queue, and counts the queue's holder). */
    CHECK(info.held && (info.holders == 3 || info.holders == 1));
    if (info.holders == 1)
        printf("%s counts a reentrant owner's 3 handles as 1 holder\n", s.backend);
    CHECK_RC(dlock_acquire(&other, c2, "re", &plain), DLOCK_EBUSY);
    plain.owner = "someone-else";
    plain.reentrant = 1;
    CHECK_RC(dlock_acquire(&other, c2, "re", &plain), DLOCK_EBUSY);
    /* Past two leases (six renewals): the watchdog renews every hold. */
    test_sleep_ms(2 * s.short_lease_ms);
    for (int i = 0; i < 3; i++)
        CHECK_RC(dlock_lock_check(h[i]), DLOCK_OK);
    CHECK_RC(dlock_release(h[1]), DLOCK_OK);
    CHECK_RC(dlock_acquire(&other, c2, "re", &plain), DLOCK_EBUSY);
    CHECK_RC(dlock_release(h[0]), DLOCK_OK);
    CHECK_RC(dlock_acquire(&other, c2, "re", &plain), DLOCK_EBUSY);
    CHECK_RC(dlock_lock_check(h[2]), DLOCK_OK);
    CHECK_RC(dlock_release(h[2]), DLOCK_OK);
    CHECK_RC(dlock_acquire(&other, c2, "re", &plain), DLOCK_OK);
    CHECK(dlock_lock_fence(other) > fence);
    CHECK_RC(dlock_release(other), DLOCK_OK);

    /* Without reentrant: told at once, not after 5 s of waiting for itself. */
    o = kopts(DLOCK_KIND_MUTEX, 5000, 5000);
    o.owner = "solo";
    CHECK_RC(dlock_acquire(&h[0], c, "solo", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&h[1], c2, "solo", &o), DLOCK_EMISUSE);
    CHECK_CONTAINS(dlock_error_message(), "reentrant");
    CHECK_RC(dlock_release(h[0]), DLOCK_OK);

    /* Holds are per handle: a stale one stays lost. */
    stale = kopts(DLOCK_KIND_MUTEX, 0, s.short_lease_ms);
    stale.owner = "worker-7";
    stale.reentrant = 1;
    stale.auto_renew = 0;
    CHECK_RC(dlock_acquire(&old, c, "stale", &stale), DLOCK_OK);
    wait_free(c2, "stale"); /* its lease ran out, unrenewed */
    stale.lease_ms = 5000;
    CHECK_RC(dlock_acquire(&cur, c, "stale", &stale), DLOCK_OK);
    CHECK(dlock_lock_fence(cur) > dlock_lock_fence(old));
    CHECK_RC(dlock_lock_check(old), DLOCK_ELOST);
    CHECK_RC(dlock_release(old), DLOCK_ELOST);
    CHECK_RC(dlock_lock_check(cur), DLOCK_OK);
    CHECK_RC(dlock_release(cur), DLOCK_OK);
    wait_free(c2, "stale");
    dlock_client_free(c);
    dlock_client_free(c2);
    test_server_stop(&s);
}

/* ---------------------------------------------------------------------- */
/* Fair */

enum { FIFO_WAITERS = 5 };

typedef struct {
    atomic_int turn;                 /* the waiter that may begin to wait */
    atomic_int queued[FIFO_WAITERS]; /* its first busy try is done */
    atomic_int next;
    int order[FIFO_WAITERS];
} fifo_page;

typedef struct {
    dlock_client *c;
    atomic_int *flag;
    atomic_int stop;
} busy_watch;

/* In a waiter: set *flag once the client's try with its watch found the
 * lock busy (its place in the queue is taken: test_tries_to_queue). */
static void *busy_watch_main(void *p)
{
    busy_watch *b = p;

    while (!atomic_load(&b->stop)) {
        if (test_busy_tries(b->c) >= test_tries_to_queue(b->c)) {
            atomic_store(b->flag, 1);
            break;
        }
        usleep(2000);
    }
    return NULL;
}

/*
 * Waiters, each a process, begin to wait one after the other and get the
 * lock in that order; a try does not jump the queue. A reentrant owner
 * skips it (owner ids declared).
 */
static void fair_fifo_order(void)
{
    test_server s;
    fifo_page *pg = test_shared_page(sizeof(fifo_page));
    pid_t pids[FIFO_WAITERS];
    dlock_client *c, *c2;
    dlock_lock *holder, *l = NULL;
    dlock_acquire_options o;
    int owner_ids;

    if (!begin(&s, DLOCK_KIND_FAIR, -1))
        return;
    /* The waiters are forked before this process has threads. */
    atomic_store(&pg->turn, -1);
    for (int i = 0; i < FIFO_WAITERS; i++) {
        pids[i] = fork();
        CHECK(pids[i] >= 0);
        if (pids[i] == 0) {
            dlock_acquire_options w = kopts(DLOCK_KIND_FAIR, 60000, 5000);
            busy_watch b = {NULL, &pg->queued[i], 0};
            pthread_t t;
            alarm(100);
            test_wait_atomic(&pg->turn, i, "the waiter's turn");
            b.c = open_client(&s);
            CHECK(pthread_create(&t, NULL, busy_watch_main, &b) == 0);
            CHECK_RC(dlock_acquire(&l, b.c, "fifo", &w), DLOCK_OK);
            atomic_store(&b.stop, 1);
            CHECK(pthread_join(t, NULL) == 0);
            pg->order[atomic_fetch_add(&pg->next, 1)] = i;
            test_sleep_ms(10);
            CHECK_RC(dlock_release(l), DLOCK_OK);
            dlock_client_free(b.c);
            _exit(0);
        }
    }
    c = open_client(&s);
    o = kopts(DLOCK_KIND_FAIR, 0, 10000);
    CHECK_RC(dlock_acquire(&holder, c, "fifo", &o), DLOCK_OK);
    for (int i = 0; i < FIFO_WAITERS; i++) {
        atomic_store(&pg->turn, i);
        test_wait_atomic(&pg->queued[i], 1, "a waiter queued"); /* then the next one starts */
    }
    CHECK_RC(dlock_acquire(&l, c, "fifo", &o), DLOCK_EBUSY); /* no barging */
    CHECK_RC(dlock_release(holder), DLOCK_OK);
    for (int i = 0; i < FIFO_WAITERS; i++)
        test_wait_child_ok(pids[i]);
    for (int i = 0; i < FIFO_WAITERS; i++)
        if (pg->order[i] != i) {
            fprintf(stderr, "place %d went to waiter %d:", i, pg->order[i]);
            for (int j = 0; j < FIFO_WAITERS; j++)
                fprintf(stderr, " %d", pg->order[j]);
            fprintf(stderr, "\n");
            exit(1);
        }
    wait_free(c, "fifo");

    /* A reentrant owner re-enters a fair lock at once. */
    owner_ids = declares(c, OWNER_IDS);
    if (owner_ids) {
        dlock_lock *a, *b;
        c2 = open_client(&s);
        o.owner = "fair-owner";
        o.reentrant = 1;
        CHECK_RC(dlock_acquire(&a, c, "re-fair", &o), DLOCK_OK);
        CHECK_RC(dlock_acquire(&b, c2, "re-fair", &o), DLOCK_OK);
        CHECK(dlock_lock_fence(a) == dlock_lock_fence(b));
        CHECK(dlock_lock_kind(b) == DLOCK_KIND_FAIR);
        CHECK_RC(dlock_release(a), DLOCK_OK);
        o.owner = NULL;
        o.reentrant = 0;
        CHECK_RC(dlock_acquire(&l, c2, "re-fair", &o), DLOCK_EBUSY);
        CHECK_RC(dlock_release(b), DLOCK_OK);
        CHECK_RC(dlock_acquire(&l, c2, "re-fair", &o), DLOCK_OK);
        CHECK_RC(dlock_release(l), DLOCK_OK);
        dlock_client_free(c2);
    } else {
        printf("owner ids not declared by %s: the fair lock's re-entry is not checked\n",
               s.backend);
    }
    dlock_client_free(c);
    test_server_stop(&s);
}

/* ---------------------------------------------------------------------- */
/* Read-write */

/* Five readers are inside at once; then writers and readers take turns,
 * and no writer is ever inside with anyone. */
static void rw_readers_share_writer_excludes(void)
{
    static const int readers[5] = {DLOCK_KIND_READ, DLOCK_KIND_READ, DLOCK_KIND_READ,
                                   DLOCK_KIND_READ, DLOCK_KIND_READ};
    static const int mixed[6] = {DLOCK_KIND_WRITE, DLOCK_KIND_READ, DLOCK_KIND_WRITE,
                                 DLOCK_KIND_READ,  DLOCK_KIND_WRITE, DLOCK_KIND_READ};
    test_server s;
    test_contend_opts o = {0};
    test_contend_result r;

    if (!begin(&s, DLOCK_KIND_READ, DLOCK_KIND_WRITE))
        return;
    o.url = s.url;
    o.name = "rw";
    o.kinds = readers;
    o.procs = 5;
    o.turns = 1;
    o.meet = 5; /* a lock that let fewer readers in would never get there */
    test_contend_run(&o, &r);
    CHECK(r.max_shared == 5);
    o.kinds = mixed;
    o.procs = 6;
    o.turns = 10;
    o.meet = 0;
    o.hold_us = 300;
    test_contend_run(&o, &r);
    test_server_stop(&s);
}

enum { STREAM_READERS = 4, STREAM_SLOT_MS = 10, STREAM_HOLD_MS = 35 };

typedef struct {
    dlock_client *c;
    int index;
    int64_t t0_ms;
    atomic_int *stop, *inside;
    atomic_long reads;
    int rc;
} reader_stream_arg;

static int64_t mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_until_ms(int64_t t)
{
    int64_t now = mono_ms();

    if (t > now)
        test_sleep_ms(t - now);
}

/*
 * A stream of readers without a gap: reader i takes its k-th read at slot
 * 4k + i (a slot every 10 ms) and holds it 35 ms, so three or four reads
 * overlap at any time and the readers as a whole never let go. Without a
 * writer preference, a writer would wait for ever.
 */
static void *reader_stream(void *p)
{
    reader_stream_arg *a = p;
    dlock_acquire_options o = kopts(DLOCK_KIND_READ, DLOCK_WAIT_FOREVER, 5000);

    for (long k = 0; !atomic_load(a->stop); k++) {
        int64_t slot = a->t0_ms + (STREAM_READERS * k + a->index) * STREAM_SLOT_MS;
        dlock_lock *l;
        sleep_until_ms(slot);
        if ((a->rc = dlock_acquire(&l, a->c, "busy-rw", &o)) != DLOCK_OK)
            return NULL;
        atomic_fetch_add(a->inside, 1);
        a->reads++;
        sleep_until_ms(slot + STREAM_HOLD_MS);
        atomic_fetch_sub(a->inside, 1);
        if ((a->rc = dlock_release(l)) != DLOCK_OK)
            return NULL;
    }
    return NULL;
}

/*
 * Writer preference. A writer waiting behind a reader holds back a reader
 * that comes after it (a try fails; a waiter waits), gets the lock when the
 * first reader leaves, and the late reader gets it after the writer, each
 * with a greater fence. And readers overlapping without a gap, for ever,
 * still let a writer in, with none of them inside while it holds.
 */
static void rw_writer_not_starved(void)
{
    test_server s;
    dlock_client *c, *c2, *c3, *rcs[STREAM_READERS];
    dlock_acquire_options ro;
    dlock_lock *r1, *r2 = NULL, *w;
    test_acquirer wa, ra;
    pthread_t tw, tr, t[STREAM_READERS];
    reader_stream_arg a[STREAM_READERS];
    atomic_int stop = 0, inside = 0;
    long reads_before = 0, reads_after = 0;
    int64_t t0;
    uint64_t fence;

    if (!begin(&s, DLOCK_KIND_READ, DLOCK_KIND_WRITE))
        return;
    c = open_client(&s);
    c2 = open_client(&s);
    c3 = open_client(&s);
    ro = kopts(DLOCK_KIND_READ, 0, 5000);
    CHECK_RC(dlock_acquire(&r1, c, "order", &ro), DLOCK_OK);
    test_acquirer_init(&wa, c2, "order", kopts(DLOCK_KIND_WRITE, 60000, 5000));
    CHECK(pthread_create(&tw, NULL, test_acquirer_main, &wa) == 0);
    test_wait_busy(c2, test_tries_to_queue(c2), "the writer");
    CHECK_RC(dlock_acquire(&r2, c3, "order", &ro), DLOCK_EBUSY);
    test_acquirer_init(&ra, c3, "order", kopts(DLOCK_KIND_READ, 60000, 5000));
    CHECK(pthread_create(&tr, NULL, test_acquirer_main, &ra) == 0);
    test_wait_busy(c3, 1 + test_tries_to_queue(c3), "the late reader");
    CHECK(!atomic_load(&wa.done) && !atomic_load(&ra.done));
    fence = dlock_lock_fence(r1);
    CHECK_RC(dlock_release(r1), DLOCK_OK);
    CHECK(pthread_join(tw, NULL) == 0);
    CHECK_RC(wa.rc, DLOCK_OK);
    CHECK(dlock_lock_fence(wa.lock) > fence);
    fence = dlock_lock_fence(wa.lock);
    CHECK(!atomic_load(&ra.done)); /* the writer holds */
    CHECK_RC(dlock_release(wa.lock), DLOCK_OK);
    CHECK(pthread_join(tr, NULL) == 0);
    CHECK_RC(ra.rc, DLOCK_OK);
    CHECK(dlock_lock_fence(ra.lock) > fence);
    CHECK_RC(dlock_release(ra.lock), DLOCK_OK);

    /* The stream. */
    t0 = mono_ms() + 50;
    for (int i = 0; i < STREAM_READERS; i++) {
        rcs[i] = open_client(&s);
        a[i].c = rcs[i];
        a[i].index = i;
        a[i].t0_ms = t0;
        a[i].stop = &stop;
        a[i].inside = &inside;
        atomic_store(&a[i].reads, 0);
        a[i].rc = DLOCK_OK;
        CHECK(pthread_create(&t[i], NULL, reader_stream, &a[i]) == 0);
    }
    test_wait_atomic(&inside, 1, "a reader inside");
    ro = kopts(DLOCK_KIND_WRITE, 20000, 5000);
    CHECK_RC(dlock_acquire(&w, c2, "busy-rw", &ro), DLOCK_OK);
    CHECK(atomic_load(&inside) == 0); /* no reader inside while the writer holds */
    for (int i = 0; i < STREAM_READERS; i++)
        reads_before += atomic_load(&a[i].reads);
    test_sleep_ms(20);
    CHECK(atomic_load(&inside) == 0);
    CHECK_RC(dlock_release(w), DLOCK_OK);
    for (int i = 0; i < 2000; i++) { /* a read that began after the writer */
        long reads = 0;
        for (int k = 0; k < STREAM_READERS; k++)
            reads += atomic_load(&a[k].reads);
        if (reads > reads_before)
            break;
        test_sleep_ms(10);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < STREAM_READERS; i++) {
        CHECK(pthread_join(t[i], NULL) == 0);
        CHECK_RC(a[i].rc, DLOCK_OK);
        reads_after += atomic_load(&a[i].reads);
        dlock_client_free(rcs[i]);
    }
    CHECK(reads_after > reads_before);
    dlock_client_free(c3);
    dlock_client_free(c2);
    dlock_client_free(c);
    test_server_stop(&s);
}

/* The backends that refuse a read-write upgrade by owner id. ZooKeeper's
 * read-write lock ignores owner ids, as Curator's does
 * (docs/zookeeper.md): there an owner's read under its own write lock
 * waits for the writer like anyone's. */
static int refuses_upgrade(const test_server *s, int owner_ids)
{
    return owner_ids && strcmp(s->backend, "zk") != 0;
}

/*
 * Downgrade: in place, with the same fence, to DLOCK_KIND_READ (again:
 * DLOCK_EMISUSE; a mutex: DLOCK_EMISUSE); other readers share it then, a
 * writer does not; a writer that was queued behind the write lock keeps
 * waiting for the read lock, holding back new readers, and gets in on its
 * release with a greater fence. Upgrade, by owner id: refused at once,
 * even with an endless wait, and so is a read under one's own write lock.
 */
static void rw_downgrade_and_upgrade(void)
{
    test_server s;
    dlock_client *c, *c2;
    dlock_acquire_options wo, ro;
    dlock_lock *w, *rd, *x = NULL;
    dlock_lock_info info;
    test_acquirer wa;
    pthread_t t;
    uint64_t fence, busy;
    int owner_ids;

    if (!begin(&s, DLOCK_KIND_READ, DLOCK_KIND_WRITE))
        return;
    c = open_client(&s);
    c2 = open_client(&s);
    owner_ids = declares(c, OWNER_IDS);
    wo = kopts(DLOCK_KIND_WRITE, 0, 5000);
    ro = kopts(DLOCK_KIND_READ, 0, 5000);
    wo.owner = owner_ids ? "alice" : NULL;
    CHECK_RC(dlock_acquire(&w, c, "grade", &wo), DLOCK_OK);
    fence = dlock_lock_fence(w);
    CHECK_RC(dlock_acquire(&rd, c2, "grade", &ro), DLOCK_EBUSY);
    if (refuses_upgrade(&s, owner_ids)) {
        ro.owner = "alice";
        CHECK_RC(dlock_acquire(&rd, c, "grade", &ro), DLOCK_EMISUSE);
        CHECK_CONTAINS(dlock_error_message(), "downgrade");
        CHECK_RC(dlock_acquire(&x, c, "grade", &wo), DLOCK_EMISUSE);
        ro.owner = NULL;
    }
    CHECK_RC(dlock_lock_downgrade(w), DLOCK_OK);
    CHECK(dlock_lock_kind(w) == DLOCK_KIND_READ && dlock_lock_fence(w) == fence);
    CHECK_RC(dlock_lock_downgrade(w), DLOCK_EMISUSE);
    CHECK_RC(dlock_lock_check(w), DLOCK_OK);
    CHECK_RC(dlock_status(&info, c2, "grade"), DLOCK_OK);
    CHECK(info.held && info.kind == DLOCK_KIND_READ);
    CHECK_RC(dlock_acquire(&rd, c2, "grade", &ro), DLOCK_OK); /* readers share now */
    CHECK(dlock_lock_fence(rd) > fence);
    wo.owner = NULL;
    CHECK_RC(dlock_acquire(&x, c2, "grade", &wo), DLOCK_EBUSY);
    CHECK_RC(dlock_lock_extend(w, 5000), DLOCK_OK); /* renewed as a read lock */
    CHECK_RC(dlock_release(rd), DLOCK_OK);
    if (refuses_upgrade(&s, owner_ids)) {
        wo.owner = "alice";
        wo.wait_ms = DLOCK_WAIT_FOREVER;
        CHECK_RC(dlock_acquire(&x, c, "grade", &wo), DLOCK_EMISUSE);
        CHECK_CONTAINS(dlock_error_message(), "upgrade");
        wo.owner = NULL;
        wo.wait_ms = 0;
    }
    CHECK_RC(dlock_release(w), DLOCK_OK);

    /* A writer queued behind the write lock before the downgrade. */
    CHECK_RC(dlock_acquire(&w, c, "grade2", &wo), DLOCK_OK);
    fence = dlock_lock_fence(w);
    test_acquirer_init(&wa, c2, "grade2", kopts(DLOCK_KIND_WRITE, 60000, 5000));
    /* The count before the waiter starts: one taken after may include its
     * first try, and the wait would then last to its next (the lease). */
    busy = test_busy_tries(c2);
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &wa) == 0);
    test_wait_busy(c2, busy + test_tries_to_queue(c2), "the queued writer");
    CHECK_RC(dlock_lock_downgrade(w), DLOCK_OK);
    CHECK(dlock_lock_kind(w) == DLOCK_KIND_READ && dlock_lock_fence(w) == fence);
    CHECK_RC(dlock_lock_check(w), DLOCK_OK);
    CHECK(!atomic_load(&wa.done));
    CHECK_RC(dlock_acquire(&rd, c2, "grade2", &ro), DLOCK_EBUSY); /* behind the writer */
    test_sleep_ms(50);
    CHECK(!atomic_load(&wa.done));
    CHECK_RC(dlock_release(w), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(wa.rc, DLOCK_OK);
    CHECK(dlock_lock_kind(wa.lock) == DLOCK_KIND_WRITE && dlock_lock_fence(wa.lock) > fence);
    CHECK_RC(dlock_release(wa.lock), DLOCK_OK);
    {
        dlock_lock *m;
        dlock_acquire_options mo = kopts(DLOCK_KIND_MUTEX, 0, 5000);
        CHECK_RC(dlock_acquire(&m, c, "plain", &mo), DLOCK_OK);
        CHECK_RC(dlock_lock_downgrade(m), DLOCK_EMISUSE);
        CHECK_RC(dlock_release(m), DLOCK_OK);
    }
    dlock_client_free(c2);
    dlock_client_free(c);
    test_server_stop(&s);
}

/*
 * Each reader's lease is its own: a reader killed with SIGKILL holds the
 * lock for its own (short) lease only, whatever the living reader's (20 s)
 * does: the living one keeps a writer out, and once it leaves, a writer
 * gets in well before a lease the two shared would have ended.
 */
static void rw_reader_lease_is_its_own(void)
{
    test_server s;
    atomic_int *in = test_shared_page(sizeof(atomic_int));
    dlock_client *c;
    dlock_lock *alive, *w;
    dlock_acquire_options ro = kopts(DLOCK_KIND_READ, 0, 20000), wo;
    pid_t dead;

    if (!begin(&s, DLOCK_KIND_READ, DLOCK_KIND_WRITE))
        return;
    dead = fork(); /* before this process has threads */
    CHECK(dead >= 0);
    if (dead == 0) {
        dlock_client *cc = open_client(&s);
        dlock_acquire_options o = kopts(DLOCK_KIND_READ, 0, s.short_lease_ms);
        dlock_lock *l;
        alarm(100);
        CHECK_RC(dlock_acquire(&l, cc, "leases", &o), DLOCK_OK);
        atomic_store(in, 1);
        for (;;)
            pause();
    }
    test_wait_atomic(in, 1, "the reader to be killed");
    c = open_client(&s);
    CHECK_RC(dlock_acquire(&alive, c, "leases", &ro), DLOCK_OK);
    kill_child(dead);
    wo = kopts(DLOCK_KIND_WRITE, 0, 5000);
    CHECK_RC(dlock_acquire(&w, c, "leases", &wo), DLOCK_EBUSY); /* ours counts */
    CHECK_RC(dlock_release(alive), DLOCK_OK);
    wo.wait_ms = 8000; /* under the 20 s a shared lease would keep it */
    CHECK_RC(dlock_acquire(&w, c, "leases", &wo), DLOCK_OK);
    CHECK_RC(dlock_release(w), DLOCK_OK);
    dlock_client_free(c);
    test_server_stop(&s);
}

/* ---------------------------------------------------------------------- */
/* Semaphore */

/* Ten processes, 3 permits: never more than 3 holders at once, 3 at once
 * at some point, and every permit's fence is issued once. */
static void semaphore_never_exceeds_n(void)
{
    static const int kinds[10] = {
        DLOCK_KIND_SEMAPHORE, DLOCK_KIND_SEMAPHORE, DLOCK_KIND_SEMAPHORE, DLOCK_KIND_SEMAPHORE,
        DLOCK_KIND_SEMAPHORE, DLOCK_KIND_SEMAPHORE, DLOCK_KIND_SEMAPHORE, DLOCK_KIND_SEMAPHORE,
        DLOCK_KIND_SEMAPHORE, DLOCK_KIND_SEMAPHORE};
    test_server s;
    test_contend_opts o = {0};
    test_contend_result r;

    if (!begin(&s, DLOCK_KIND_SEMAPHORE, -1))
        return;
    o.url = s.url;
    o.name = "pool";
    o.kinds = kinds;
    o.procs = 10;
    o.turns = 6;
    o.permits = 3;
    o.hold_us = 2000;
    o.meet = 3; /* a semaphore that let fewer in at once would never get there */
    test_contend_run(&o, &r);
    CHECK(r.max_shared == 3);
    test_server_stop(&s);
}

/*
 * N: required on first use; stored, and winning over later options; one
 * holder may hold several permits; raising N with set_permits wakes a
 * waiter; lowering it takes no permit away and grants none until fewer
 * than N are held; status counts the holders.
 */
static void semaphore_permits_and_set_permits(void)
{
    test_server s;
    dlock_client *c, *c2;
    dlock_acquire_options o;
    dlock_lock *p[3], *x = NULL, *a, *h2;
    dlock_lock_info info;
    test_acquirer wa;
    pthread_t t;
    uint64_t busy;

    if (!begin(&s, DLOCK_KIND_SEMAPHORE, -1))
        return;
    c = open_client(&s);
    c2 = open_client(&s);
    o = kopts(DLOCK_KIND_SEMAPHORE, 0, 5000);
    CHECK_RC(dlock_acquire(&a, c, "permits", &o), DLOCK_EINVAL); /* no N yet */
    CHECK_CONTAINS(dlock_error_message(), "permits");

    /* Several permits for one holder (one client, one owner). */
    o.permits = 3;
    for (int i = 0; i < 3; i++) {
        CHECK_RC(dlock_acquire(&p[i], c, "seats", &o), DLOCK_OK);
        CHECK(dlock_lock_kind(p[i]) == DLOCK_KIND_SEMAPHORE);
        CHECK(i == 0 || dlock_lock_fence(p[i]) > dlock_lock_fence(p[i - 1]));
    }
    CHECK_RC(dlock_acquire(&x, c2, "seats", &o), DLOCK_EBUSY);
    CHECK(x == NULL);
    CHECK_RC(dlock_status(&info, c2, "seats"), DLOCK_OK);
    CHECK(info.held && info.holders == 3 && info.kind == DLOCK_KIND_SEMAPHORE);
    CHECK_RC(dlock_release(p[1]), DLOCK_OK);
    CHECK_RC(dlock_acquire(&x, c2, "seats", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(x) > dlock_lock_fence(p[2]));
    CHECK_RC(dlock_release(x), DLOCK_OK);
    CHECK_RC(dlock_release(p[0]), DLOCK_OK);
    CHECK_RC(dlock_release(p[2]), DLOCK_OK);

    /* N stored, then changed at run time. */
    o.permits = 1;
    CHECK_RC(dlock_acquire(&a, c, "permits", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&x, c2, "permits", &o), DLOCK_EBUSY);
    o.permits = 5; /* the stored 1 wins */
    CHECK_RC(dlock_acquire(&x, c2, "permits", &o), DLOCK_EBUSY);
    test_acquirer_init(&wa, c2, "permits", kopts(DLOCK_KIND_SEMAPHORE, 60000, 5000));
    busy = test_busy_tries(c2); /* before the waiter starts, as above */
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &wa) == 0);
    test_wait_busy(c2, busy + test_tries_to_queue(c2), "the permit waiter");
    CHECK(!atomic_load(&wa.done));
    CHECK_RC(dlock_semaphore_set_permits(c, "permits", 2), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(wa.rc, DLOCK_OK);
    CHECK(dlock_lock_fence(wa.lock) > dlock_lock_fence(a));
    /* Lowered: holders keep theirs; nobody new until fewer than N hold. */
    o.permits = 0;
    CHECK_RC(dlock_semaphore_set_permits(c, "permits", 1), DLOCK_OK);
    CHECK_RC(dlock_lock_check(a), DLOCK_OK);
    CHECK_RC(dlock_lock_check(wa.lock), DLOCK_OK);
    CHECK_RC(dlock_acquire(&h2, c, "permits", &o), DLOCK_EBUSY);
    CHECK_RC(dlock_release(a), DLOCK_OK);
    CHECK_RC(dlock_acquire(&h2, c, "permits", &o), DLOCK_EBUSY);
    CHECK_RC(dlock_release(wa.lock), DLOCK_OK);
    CHECK_RC(dlock_acquire(&h2, c, "permits", &o), DLOCK_OK);
    CHECK_RC(dlock_release(h2), DLOCK_OK);
    CHECK_RC(dlock_semaphore_set_permits(c, "permits", 0), DLOCK_EINVAL);
    dlock_client_free(c2);
    dlock_client_free(c);
    test_server_stop(&s);
}

/* A holder killed with SIGKILL gives its permit back when its lease ends:
 * a waiter gets it, with a greater fence. */
static void semaphore_killed_holder_permit_returns(void)
{
    test_server s;
    struct {
        atomic_int in;
        uint64_t fence;
    } *pg = test_shared_page(4096);
    dlock_client *c;
    dlock_lock *l = NULL;
    dlock_acquire_options o;
    pid_t dead;

    if (!begin(&s, DLOCK_KIND_SEMAPHORE, -1))
        return;
    dead = fork();
    CHECK(dead >= 0);
    if (dead == 0) {
        dlock_client *cc = open_client(&s);
        dlock_acquire_options k = kopts(DLOCK_KIND_SEMAPHORE, 0, s.short_lease_ms);
        alarm(100);
        k.permits = 1;
        CHECK_RC(dlock_acquire(&l, cc, "killed", &k), DLOCK_OK);
        pg->fence = dlock_lock_fence(l);
        atomic_store(&pg->in, 1);
        for (;;)
            pause();
    }
    test_wait_atomic(&pg->in, 1, "the permit holder to be killed");
    c = open_client(&s);
    o = kopts(DLOCK_KIND_SEMAPHORE, 0, 5000);
    CHECK_RC(dlock_acquire(&l, c, "killed", &o), DLOCK_EBUSY);
    kill_child(dead);
    o.wait_ms = 30000;
    CHECK_RC(dlock_acquire(&l, c, "killed", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(l) > pg->fence);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    test_server_stop(&s);
}

/* ---------------------------------------------------------------------- */
/* Multi-lock */

static atomic_int multi_lost_calls;
static dlock_lock *multi_lost_handle;

static void count_multi_lost(dlock_lock *l, int reason, void *payload)
{
    (void)payload;
    if (reason != DLOCK_ELOST || dlock_release(l) != DLOCK_EMISUSE)
        abort();
    multi_lost_handle = l;
    atomic_fetch_add(&multi_lost_calls, 1);
}

static int held(dlock_client *c, const char *name)
{
    dlock_lock_info info;

    CHECK_RC(dlock_status(&info, c, name), DLOCK_OK);
    return info.held;
}

/*
 * All or nothing: while one name is held none is taken, and the error
 * names it; then all are, with a fence each, in the caller's order;
 * check, extend and release act on all. A lost part makes the whole
 * handle lost: on_lost fires once, with the multi handle.
 */
static void multi_all_or_nothing(void)
{
    test_server s;
    dlock_client *c;
    dlock_lock *h, *m = NULL, *x = NULL;
    dlock_acquire_options o;
    const char *names[3] = {"y", "z", "x"};
    const char *parts[3] = {"m1", "m2", "m3"};

    if (!begin(&s, DLOCK_KIND_MULTI, -1))
        return;
    c = open_client(&s);
    o = kopts(DLOCK_KIND_MUTEX, 0, 5000);
    CHECK_RC(dlock_acquire(&h, c, "z", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire_multi(&m, c, names, 3, &o), DLOCK_EBUSY);
    CHECK(m == NULL);
    CHECK_CONTAINS(dlock_error_message(), "'z'");
    CHECK(!held(c, "x") && !held(c, "y"));
    CHECK_RC(dlock_release(h), DLOCK_OK);
    CHECK_RC(dlock_acquire_multi(&m, c, names, 3, &o), DLOCK_OK);
    CHECK(dlock_lock_kind(m) == DLOCK_KIND_MULTI && dlock_lock_count(m) == 3);
    for (int i = 0; i < 3; i++) {
        CHECK(strcmp(dlock_lock_name_at(m, (size_t)i), names[i]) == 0);
        CHECK(dlock_lock_fence_at(m, (size_t)i) > 0);
        CHECK(held(c, names[i]));
    }
    CHECK(dlock_lock_fence(m) == dlock_lock_fence_at(m, 0));
    CHECK(strcmp(dlock_lock_name(m), "y") == 0);
    CHECK(dlock_lock_name_at(m, 3) == NULL && dlock_lock_fence_at(m, 3) == 0);
    CHECK_RC(dlock_acquire(&x, c, "x", &o), DLOCK_EBUSY);
    CHECK_RC(dlock_lock_check(m), DLOCK_OK);
    CHECK_RC(dlock_lock_extend(m, 8000), DLOCK_OK);
    CHECK_RC(dlock_release(m), DLOCK_OK);
    for (int i = 0; i < 3; i++)
        CHECK(!held(c, names[i]));

    o = kopts(DLOCK_KIND_MUTEX, 0, s.short_lease_ms);
    o.on_lost = count_multi_lost;
    CHECK_RC(dlock_acquire_multi(&m, c, parts, 3, &o), DLOCK_OK);
    CHECK_RC(dlock_force_release(NULL, c, "m2"), DLOCK_OK);
    test_wait_atomic(&multi_lost_calls, 1, "on_lost calls");
    test_sleep_ms(s.short_lease_ms); /* three renewals more: no second call */
    CHECK(atomic_load(&multi_lost_calls) == 1);
    CHECK(multi_lost_handle == m);
    CHECK(dlock_lock_lost(m));
    CHECK_RC(dlock_lock_check(m), DLOCK_ELOST);
    CHECK_RC(dlock_release(m), DLOCK_ELOST);
    CHECK(!held(c, "m1") && !held(c, "m3")); /* the other parts were released */
    dlock_client_free(c);
    test_server_stop(&s);
}

/* Processes lock {a,b} and {b,a} in turns: none deadlocks (a wait that
 * runs out fails the test) and each pair is held by one at a time, each
 * name's fences increasing. */
static void multi_no_deadlock(void)
{
    static const int kinds[6] = {DLOCK_KIND_MULTI, DLOCK_KIND_MULTI, DLOCK_KIND_MULTI,
                                 DLOCK_KIND_MULTI, DLOCK_KIND_MULTI, DLOCK_KIND_MULTI};
    static const char *const names[2] = {"a", "b"};
    test_server s;
    test_contend_opts o = {0};
    test_contend_result r;

    if (!begin(&s, DLOCK_KIND_MULTI, -1))
        return;
    o.url = s.url;
    o.names = names;
    o.kinds = kinds;
    o.procs = 6;
    o.turns = 12;
    o.hold_us = 200;
    test_contend_run(&o, &r);
    test_server_stop(&s);
}

/* ---------------------------------------------------------------------- */
/* Leader election */

/* Candidates in five processes lead in turns: one leader at a time, each
 * reading itself as leader with its own fence, fences increasing; an
 * observer sees no leader before and after, and leaders between. */
static void leader_one_at_a_time(void)
{
    static const int kinds[5] = {DLOCK_KIND_LEADER, DLOCK_KIND_LEADER, DLOCK_KIND_LEADER,
                                 DLOCK_KIND_LEADER, DLOCK_KIND_LEADER};
    test_server s;
    test_contend_opts o = {0};
    test_contend_result r;
    test_contend *t;
    test_leader_watch w;
    dlock_client *c;

    if (!begin(&s, DLOCK_KIND_LEADER, -1))
        return;
    o.url = s.url;
    o.name = "sched";
    o.kinds = kinds;
    o.procs = 5;
    o.turns = 5;
    o.hold_us = 2000;
    t = test_contend_start(&o); /* before this process has threads */
    c = open_client(&s);
    test_leader_watch_start(&w, c, "sched");
    test_leader_watch_wait(&w, "");
    test_contend_go(t);
    test_contend_finish(t, &r);
    CHECK(r.violations == 0 && r.turns == 25);
    test_leader_watch_wait(&w, "");
    pthread_mutex_lock(&w.mu);
    fprintf(stderr, "observer calls: %d for 25 terms\n", w.calls);
    {
        int leaders = 0;
        uint64_t last = 0;
        for (int i = 0; i < w.calls && i < TEST_LEADER_SEEN; i++)
            if (w.seen[i][0] != '\0') {
                CHECK(strncmp(w.seen[i], "candidate-", 10) == 0);
                CHECK(w.fences[i] > last);
                last = w.fences[i];
                leaders++;
            }
        CHECK(leaders >= 1);
    }
    pthread_mutex_unlock(&w.mu);
    test_leader_watch_stop(&w);
    dlock_client_free(c);
    test_server_stop(&s);
}

typedef struct {
    dlock_client *c;
    int64_t lease_ms;
    int rc;
    dlock_lock *lock;
} campaign_arg;

static void *campaign_main(void *p)
{
    campaign_arg *a = p;
    dlock_acquire_options o = test_opts(30000, a->lease_ms, 1);

    a->rc = dlock_campaign(&a->lock, a->c, "jobs", "beta", &o);
    return NULL;
}

/*
 * The leader is killed with SIGKILL: a waiting candidate takes over once
 * its lease has run out, with a greater fence, and the observer reports
 * each change; a try while another leads is DLOCK_EBUSY; resigning is seen
 * at once.
 */
static void leader_killed_new_leader(void)
{
    test_server s;
    atomic_int *in = test_shared_page(sizeof(atomic_int));
    dlock_client *c, *c2;
    test_leader_watch w;
    campaign_arg ca = {0};
    dlock_leader_info info;
    dlock_lock *x = NULL;
    dlock_acquire_options once = test_opts(0, 5000, 1);
    uint64_t alpha_fence;
    pthread_t t;
    pid_t alpha;

    if (!begin(&s, DLOCK_KIND_LEADER, -1))
        return;
    alpha = fork(); /* before this process has threads */
    CHECK(alpha >= 0);
    if (alpha == 0) {
        dlock_client *cc = open_client(&s);
        dlock_acquire_options o = test_opts(0, s.short_lease_ms, 1);
        dlock_lock *l;
        alarm(100);
        CHECK_RC(dlock_campaign(&l, cc, "jobs", "alpha", &o), DLOCK_OK);
        atomic_store(in, 1);
        for (;;)
            pause();
    }
    test_wait_atomic(in, 1, "alpha leads");
    c = open_client(&s);
    c2 = open_client(&s);
    test_leader_watch_start(&w, c, "jobs");
    alpha_fence = test_leader_watch_wait(&w, "alpha");
    CHECK(alpha_fence > 0);
    CHECK_RC(dlock_campaign(&x, c2, "jobs", "beta", &once), DLOCK_EBUSY);
    ca.c = c2;
    ca.lease_ms = s.short_lease_ms;
    CHECK(pthread_create(&t, NULL, campaign_main, &ca) == 0);
    test_wait_busy(c2, 1 + test_tries_to_queue(c2), "beta campaigns");
    CHECK_RC(dlock_leader(&info, c, "jobs"), DLOCK_OK);
    CHECK(info.held && strcmp(info.identity, "alpha") == 0 && info.fence == alpha_fence);
    kill_child(alpha);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(ca.rc, DLOCK_OK);
    CHECK(dlock_lock_kind(ca.lock) == DLOCK_KIND_LEADER);
    CHECK(dlock_lock_fence(ca.lock) > alpha_fence);
    CHECK(test_leader_watch_wait(&w, "beta") == dlock_lock_fence(ca.lock));
    CHECK_RC(dlock_leader(&info, c, "jobs"), DLOCK_OK);
    CHECK(info.held && strcmp(info.identity, "beta") == 0);
    CHECK_RC(dlock_resign(ca.lock), DLOCK_OK);
    test_leader_watch_wait(&w, "");
    CHECK_RC(dlock_leader(&info, c, "jobs"), DLOCK_OK);
    CHECK(!info.held && info.identity[0] == '\0');
    test_leader_watch_stop(&w);
    dlock_client_free(c2);
    dlock_client_free(c);
    test_server_stop(&s);
}

/* ---------------------------------------------------------------------- */
/* Holders */

typedef struct {
    int calls, kind, holders, mine;
    uint64_t fences[8];
    char labels[8][DLOCK_LABEL_MAX + 1];
} seen_holders;

static int note_holder(const char *name, const dlock_lock_info *info, void *payload)
{
    seen_holders *s = payload;
    char host[DLOCK_HOST_MAX + 1] = "";

    (void)name;
    gethostname(host, sizeof(host) - 1);
    if (s->calls < 8) {
        s->fences[s->calls] = info->fence;
        snprintf(s->labels[s->calls], sizeof(s->labels[0]), "%s",
                 info->has_holder ? info->label : "");
    }
    s->mine += info->has_holder && info->pid == getpid() && strcmp(info->host, host) == 0;
    s->kind = info->kind;
    s->holders = info->holders;
    s->calls++;
    return 0;
}

/* Each of n holders (locks[i], labelled label-i) is seen once, with its own
 * fence, label, host and pid. */
static void check_holders(dlock_client *c, const char *name, dlock_lock **locks, int n, int kind,
                          const char *label)
{
    seen_holders seen = {0};

    CHECK_RC(dlock_status_holders(c, name, note_holder, &seen), DLOCK_OK);
    if (seen.calls != n || seen.kind != kind || seen.holders != n || seen.mine != n) {
        fprintf(stderr, "%s: %d holders seen (of kind %d, counted %d, %d ours), wanted %d of kind "
                "%d\n", name, seen.calls, seen.kind, seen.holders, seen.mine, n, kind);
        exit(1);
    }
    for (int i = 0; i < n; i++) {
        char want[32];
        int found = 0;
        snprintf(want, sizeof(want), "%s-%d", label, i);
        for (int j = 0; j < n; j++)
            found += seen.fences[j] == dlock_lock_fence(locks[i]) && strcmp(seen.labels[j], want) == 0;
        if (found != 1) {
            fprintf(stderr, "%s: holder %s (fence %llu) seen %d times\n", name, want,
                    (unsigned long long)dlock_lock_fence(locks[i]), found);
            exit(1);
        }
    }
}

/*
 * Who holds each kind: status counts the readers and permit holders with
 * their kind (the oldest holder's record), dlock_status_holders gives each
 * with its own fence, label, host and pid, the writer is one holder of kind
 * WRITE; a force release breaks every reader.
 */
static void holders_of_every_kind(void)
{
    test_server s;
    dlock_client *c, *c2;
    dlock_acquire_options ro, so, wo;
    dlock_lock *r[3], *p[2], *w;
    dlock_lock_info info, removed;
    char label[16];
    int rw, sem;

    test_server_start(&s, backend);
    c = open_client(&s);
    rw = declares(c, DLOCK_KIND_READ) && declares(c, DLOCK_KIND_WRITE);
    sem = declares(c, DLOCK_KIND_SEMAPHORE);
    if (!rw && !sem) {
        printf("not declared: backend %s serves neither %s nor %s: this case does not apply\n",
               s.backend, kind_name(DLOCK_KIND_READ), kind_name(DLOCK_KIND_SEMAPHORE));
        dlock_client_free(c);
        test_server_stop(&s);
        return;
    }
    c2 = open_client(&s);
    /* Not renewed: leases that outlast the case on a loaded machine. */
    ro = kopts(DLOCK_KIND_READ, 0, 30000);
    so = kopts(DLOCK_KIND_SEMAPHORE, 0, 30000);
    wo = kopts(DLOCK_KIND_WRITE, 0, 30000);
    ro.auto_renew = so.auto_renew = wo.auto_renew = 0;
    if (rw) {
        for (int i = 0; i < 3; i++) {
            snprintf(label, sizeof(label), "reader-%d", i);
            ro.label = label;
            CHECK_RC(dlock_acquire(&r[i], i == 1 ? c2 : c, "books", &ro), DLOCK_OK);
        }
        CHECK_RC(dlock_status(&info, c2, "books"), DLOCK_OK);
        CHECK(info.held && info.holders == 3 && info.kind == DLOCK_KIND_READ && info.ttl_ms > 0);
        CHECK(info.has_holder && strcmp(info.label, "reader-0") == 0);
        check_holders(c2, "books", r, 3, DLOCK_KIND_READ, "reader");
        wo.label = "writer-0";
        CHECK_RC(dlock_acquire(&w, c, "ledger", &wo), DLOCK_OK);
        CHECK_RC(dlock_status(&info, c2, "ledger"), DLOCK_OK);
        CHECK(info.held && info.holders == 1 && info.kind == DLOCK_KIND_WRITE);
        CHECK(info.has_holder && strcmp(info.label, "writer-0") == 0);
        check_holders(c2, "ledger", &w, 1, DLOCK_KIND_WRITE, "writer");
        CHECK_RC(dlock_release(w), DLOCK_OK);
        CHECK_RC(dlock_force_release(&removed, c2, "books"), DLOCK_OK);
        CHECK(removed.held && removed.holders == 3);
        for (int i = 0; i < 3; i++) {
            CHECK_RC(dlock_lock_check(r[i]), DLOCK_ELOST);
            CHECK_RC(dlock_release(r[i]), DLOCK_ELOST);
        }
        CHECK(!held(c2, "books"));
    } else {
        printf("%s not declared by %s: not checked\n", kind_name(DLOCK_KIND_READ), s.backend);
    }
    if (sem) {
        so.permits = 4;
        for (int i = 0; i < 2; i++) {
            snprintf(label, sizeof(label), "seat-%d", i);
            so.label = label;
            CHECK_RC(dlock_acquire(&p[i], i ? c2 : c, "seats", &so), DLOCK_OK);
        }
        CHECK_RC(dlock_status(&info, c2, "seats"), DLOCK_OK);
        CHECK(info.held && info.holders == 2 && info.kind == DLOCK_KIND_SEMAPHORE);
        CHECK(info.has_holder && strcmp(info.label, "seat-0") == 0);
        check_holders(c2, "seats", p, 2, DLOCK_KIND_SEMAPHORE, "seat");
        for (int i = 0; i < 2; i++)
            CHECK_RC(dlock_release(p[i]), DLOCK_OK);
        CHECK(!held(c2, "seats"));
    } else {
        printf("%s not declared by %s: not checked\n", kind_name(DLOCK_KIND_SEMAPHORE),
               s.backend);
    }
    dlock_client_free(c2);
    dlock_client_free(c);
    test_server_stop(&s);
}

static const test_case cases[] = {
    {"reentrant_counts", reentrant_counts, "watchdog"},
    {"fair_fifo_order", fair_fifo_order, NULL},
    {"rw_readers_share_writer_excludes", rw_readers_share_writer_excludes, NULL},
    {"rw_writer_not_starved", rw_writer_not_starved, "watchdog"},
    {"rw_downgrade_and_upgrade", rw_downgrade_and_upgrade, "watchdog"},
    {"rw_reader_lease_is_its_own", rw_reader_lease_is_its_own, NULL},
    {"semaphore_never_exceeds_n", semaphore_never_exceeds_n, NULL},
    {"semaphore_permits_and_set_permits", semaphore_permits_and_set_permits, "watchdog"},
    {"semaphore_killed_holder_permit_returns", semaphore_killed_holder_permit_returns, NULL},
    {"multi_all_or_nothing", multi_all_or_nothing, "watchdog"},
    {"multi_no_deadlock", multi_no_deadlock, NULL},
    {"leader_one_at_a_time", leader_one_at_a_time, "watchdog"},
    {"leader_killed_new_leader", leader_killed_new_leader, "watchdog"},
    {"holders_of_every_kind", holders_of_every_kind, NULL},
};

/* test_family_suite BACKEND CASE, or test_family_suite --list */
int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    return test_run_on(cases, sizeof(cases) / sizeof(cases[0]), argc, argv, &backend);
}
