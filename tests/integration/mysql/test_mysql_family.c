/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The lock family on MySQL / MariaDB's lease mode (docs/mysql.md, "The lock
 * family") against a real mariadbd each test starts: owner ids and
 * reentrancy beside the plain mutex, the fair queue's order, readers
 * together and writers alone, at most N permits, one leader, fences
 * strictly increasing across kinds on one name, a retry of the same token
 * given its fence, holders listed, and named mode refusing the family.
 * Where exclusion matters the holders are processes counting overlaps in a
 * MAP_SHARED page: two clients that both passed the check would show there.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dlock/sys/backend.h"
#include "test.h"

extern const dlock_backend *dlock_mysql_backend(void); /* the static twin's table */

static dlock_client *open_url(const char *url)
{
    dlock_client *c = NULL;

    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_OK);
    return c;
}

static dlock_acquire_options kopts(int kind, int64_t wait_ms, int64_t lease_ms)
{
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;

    o.kind = kind;
    o.wait_ms = wait_ms;
    o.lease_ms = lease_ms;
    return o;
}

static void *shared_page(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

    CHECK(p != MAP_FAILED);
    memset(p, 0, size);
    return p;
}

static void wait_atomic(atomic_int *v, int want, const char *what)
{
    for (int i = 0; i < 2000 && atomic_load(v) < want; i++)
        usleep(10000);
    if (atomic_load(v) < want) {
        fprintf(stderr, "timed out waiting for %s (%d of %d)\n", what, atomic_load(v), want);
        CHECK(0);
    }
}

typedef struct {
    atomic_int inside, readers, writers, most, violations, ready, next;
    atomic_int order[32];
} shared;

static void note_most(shared *s, int n)
{
    int m = atomic_load(&s->most);

    while (n > m && !atomic_compare_exchange_weak(&s->most, &m, n))
        ;
}

/* ---- owner ids ---------------------------------------------------------- */

/*
 * An owner id re-enters with the same fence from another client; without
 * reentrant it is told at once; the plain mutex (no owner) is kept out by
 * the family's hold and the family by a plain holder, on one name's row;
 * the lock is free after the owner's last release, with a higher fence.
 */
static void owner_ids_beside_plain_mutex(void)
{
    test_mariadb m;
    dlock_client *c1, *c2;
    dlock_acquire_options o = kopts(DLOCK_KIND_MUTEX, 0, 3000), plain = kopts(0, 0, 3000);
    dlock_lock *a, *b, *x = NULL;
    uint64_t fence;

    test_mariadb_start(&m);
    c1 = open_url(m.url);
    c2 = open_url(m.url);
    o.owner = "job-7";
    o.reentrant = 1;
    CHECK_RC(dlock_acquire(&a, c1, "own", &o), DLOCK_OK);
    fence = dlock_lock_fence(a);
    CHECK_RC(dlock_acquire(&b, c2, "own", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(b) == fence);
    o.reentrant = 0;
    CHECK_RC(dlock_acquire(&x, c2, "own", &o), DLOCK_EMISUSE);
    CHECK_CONTAINS(dlock_error_message(), "not reentrant");
    CHECK_RC(dlock_acquire(&x, c2, "own", &plain), DLOCK_EBUSY);
    CHECK_RC(dlock_release(a), DLOCK_OK);
    CHECK_RC(dlock_acquire(&x, c2, "own", &plain), DLOCK_EBUSY); /* b still holds */
    CHECK_RC(dlock_release(b), DLOCK_OK);
    CHECK_RC(dlock_acquire(&x, c2, "own", &plain), DLOCK_OK);
    CHECK(dlock_lock_fence(x) > fence);
    /* And the other way: a plain holder keeps the owner out. */
    o.reentrant = 1;
    CHECK_RC(dlock_acquire(&a, c1, "own", &o), DLOCK_EBUSY);
    CHECK_RC(dlock_release(x), DLOCK_OK);
    CHECK_RC(dlock_acquire(&a, c1, "own", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(a) > fence);
    CHECK_RC(dlock_release(a), DLOCK_OK);
    dlock_client_free(c1);
    dlock_client_free(c2);
    test_mariadb_stop(&m);
}

/* ---- fences across kinds, and a retry of the same token ---------------- */

/* One name taken by each kind in turn: every fence above the last. */
static void fences_increase_across_kinds(void)
{
    static const int kinds[] = {DLOCK_KIND_MUTEX, DLOCK_KIND_FAIR,      DLOCK_KIND_WRITE,
                                DLOCK_KIND_READ,  DLOCK_KIND_SEMAPHORE, DLOCK_KIND_MUTEX};
    test_mariadb m;
    dlock_client *c;
    dlock_lock *l, *leader;
    uint64_t last = 0;

    test_mariadb_start(&m);
    c = open_url(m.url);
    for (int round = 0; round < 2; round++)
        for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
            dlock_acquire_options o = kopts(kinds[i], 0, 2000);
            o.permits = kinds[i] == DLOCK_KIND_SEMAPHORE ? 2 : 0;
            o.owner = i == 5 ? "owner" : NULL; /* the owner id's mutex is the family's */
            CHECK_RC(dlock_acquire(&l, c, "kinds", &o), DLOCK_OK);
            CHECK(dlock_lock_fence(l) > last);
            last = dlock_lock_fence(l);
            CHECK_RC(dlock_release(l), DLOCK_OK);
            {
                dlock_acquire_options lo = kopts(0, 0, 2000);
                CHECK_RC(dlock_campaign(&leader, c, "kinds", "me", &lo), DLOCK_OK);
                CHECK(dlock_lock_fence(leader) > last);
                last = dlock_lock_fence(leader);
                CHECK_RC(dlock_resign(leader), DLOCK_OK);
            }
        }
    dlock_client_free(c);
    test_mariadb_stop(&m);
}

static void url_of(dlock_url *u, dlock_url_host *h, test_mariadb *m)
{
    static char scheme[] = "mysql", user[] = "dlock", pw[] = "dlockpw", host[] = "127.0.0.1",
                path[] = "/dlock_test";

    memset(u, 0, sizeof(*u));
    h->host = host;
    h->port = m->port;
    u->scheme = scheme;
    u->user = user;
    u->password = pw;
    u->hosts = h;
    u->nhosts = 1;
    u->path = path;
    u->redacted = m->url;
}

/* Each kind's try repeated with its token (a lost reply) gets the fence it
 * was given; another token of an exclusive kind is refused. */
static void same_token_same_fence_every_kind(void)
{
    static const int kinds[] = {DLOCK_KIND_MUTEX, DLOCK_KIND_FAIR, DLOCK_KIND_WRITE,
                                DLOCK_KIND_READ, DLOCK_KIND_SEMAPHORE, DLOCK_KIND_LEADER};
    const dlock_backend *b = dlock_mysql_backend();
    test_mariadb m;
    dlock_url u;
    dlock_url_host h;
    void *be = NULL;

    test_mariadb_start(&m);
    url_of(&u, &h, &m);
    CHECK_RC(b->open(&be, &u, NULL), DLOCK_OK);
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        dlock_request r = {0}, r2;
        dlock_acquire_result out = {0}, out2 = {0};
        r.kind = kinds[i];
        r.name = "idem";
        r.token = "0123456789abcdef0123456789abcdef";
        r.owner = kinds[i] == DLOCK_KIND_MUTEX ? "o" : NULL;
        r.lease_ms = 3000;
        r.permits = 1;
        r.identity = "me";
        r.holder = "testhost 42 1700000000000 lbl";
        CHECK_RC(b->acquire(be, &r, NULL, &out), DLOCK_OK);
        CHECK(out.fence > 0);
        CHECK_RC(b->acquire(be, &r, NULL, &out2), DLOCK_OK);
        CHECK(out2.fence == out.fence);
        r2 = r;
        r2.token = "fedcba9876543210fedcba9876543210";
        r2.owner = NULL;
        if (kinds[i] != DLOCK_KIND_READ) {
            CHECK_RC(b->acquire(be, &r2, NULL, &out2), DLOCK_EBUSY);
            CHECK(out2.retry_ms > 0 && out2.retry_ms <= 3000);
        }
        CHECK_RC(b->release(be, &r2), DLOCK_ELOST);
        CHECK_RC(b->check(be, &r), DLOCK_OK);
        CHECK_RC(b->release(be, &r), DLOCK_OK);
        CHECK_RC(b->release(be, &r), DLOCK_ELOST);
        CHECK_RC(b->check(be, &r), DLOCK_ELOST);
    }
    b->close(be);
    test_mariadb_stop(&m);
}

/* ---- exclusion with several processes ----------------------------------- */

/* Readers together, writers alone: 3 readers and 3 writers in a loop;
 * then all readers inside at once. */
static void rw_processes(void)
{
    enum { PROCS = 6, ITERS = 12, READERS = 4 };
    test_mariadb m;
    shared *s = shared_page(4096);
    pid_t pids[PROCS];

    test_mariadb_start(&m);
    for (int p = 0; p < PROCS; p++) {
        pids[p] = fork();
        if (pids[p] == 0) {
            dlock_client *c = open_url(m.url);
            int writer = p % 2 == 0;
            dlock_acquire_options o =
                kopts(writer ? DLOCK_KIND_WRITE : DLOCK_KIND_READ, 30000, 2000);
            for (int i = 0; i < ITERS; i++) {
                dlock_lock *l;
                CHECK_RC(dlock_acquire(&l, c, "rw", &o), DLOCK_OK);
                if (writer) {
                    if (atomic_fetch_add(&s->writers, 1) != 0 || atomic_load(&s->readers) != 0)
                        atomic_fetch_add(&s->violations, 1);
                    usleep(2000);
                    if (atomic_load(&s->readers) != 0)
                        atomic_fetch_add(&s->violations, 1);
                    atomic_fetch_sub(&s->writers, 1);
                } else {
                    note_most(s, atomic_fetch_add(&s->readers, 1) + 1);
                    if (atomic_load(&s->writers) != 0)
                        atomic_fetch_add(&s->violations, 1);
                    usleep(2000);
                    atomic_fetch_sub(&s->readers, 1);
                }
                CHECK_RC(dlock_release(l), DLOCK_OK);
            }
            dlock_client_free(c);
            _exit(0);
        }
    }
    for (int p = 0; p < PROCS; p++)
        test_wait_child_ok(pids[p]);
    fprintf(stderr, "violations %d\n", atomic_load(&s->violations));
    CHECK(atomic_load(&s->violations) == 0);
    /* All readers inside together: each waits for the others first. */
    atomic_store(&s->most, 0);
    for (int p = 0; p < READERS; p++) {
        pids[p] = fork();
        if (pids[p] == 0) {
            dlock_client *c = open_url(m.url);
            dlock_acquire_options o = kopts(DLOCK_KIND_READ, 10000, 3000);
            dlock_lock *l;
            CHECK_RC(dlock_acquire(&l, c, "rw", &o), DLOCK_OK);
            note_most(s, atomic_fetch_add(&s->readers, 1) + 1);
            wait_atomic(&s->readers, READERS, "readers inside together");
            atomic_fetch_add(&s->ready, 1);
            wait_atomic(&s->ready, READERS, "readers done");
            CHECK_RC(dlock_release(l), DLOCK_OK);
            dlock_client_free(c);
            _exit(0);
        }
    }
    for (int p = 0; p < READERS; p++)
        test_wait_child_ok(pids[p]);
    CHECK(atomic_load(&s->most) == READERS);
    test_mariadb_stop(&m);
}

/* A writer downgrades to a read lock with its fence; another reader comes
 * in beside it; a writer waits until both are gone; an owner's upgrade is
 * refused at once. */
static void rw_downgrade_and_upgrade(void)
{
    test_mariadb m;
    dlock_client *c1, *c2;
    dlock_acquire_options w = kopts(DLOCK_KIND_WRITE, 0, 3000), r = kopts(DLOCK_KIND_READ, 0, 3000);
    dlock_lock *wl, *rl, *x = NULL;
    uint64_t fence;

    test_mariadb_start(&m);
    c1 = open_url(m.url);
    c2 = open_url(m.url);
    CHECK_RC(dlock_acquire(&wl, c1, "dg", &w), DLOCK_OK);
    fence = dlock_lock_fence(wl);
    CHECK_RC(dlock_acquire(&rl, c2, "dg", &r), DLOCK_EBUSY);
    CHECK_RC(dlock_lock_downgrade(wl), DLOCK_OK);
    CHECK(dlock_lock_kind(wl) == DLOCK_KIND_READ);
    CHECK(dlock_lock_fence(wl) == fence);
    CHECK_RC(dlock_lock_check(wl), DLOCK_OK);
    CHECK_RC(dlock_acquire(&rl, c2, "dg", &r), DLOCK_OK);
    CHECK_RC(dlock_acquire(&x, c2, "dg", &w), DLOCK_EBUSY);
    CHECK_RC(dlock_release(wl), DLOCK_OK);
    CHECK_RC(dlock_acquire(&x, c2, "dg", &w), DLOCK_EBUSY);
    CHECK_RC(dlock_release(rl), DLOCK_OK);
    CHECK_RC(dlock_acquire(&x, c2, "dg", &w), DLOCK_OK);
    CHECK(dlock_lock_fence(x) > fence);
    CHECK_RC(dlock_release(x), DLOCK_OK);
    /* Upgrade by an owner: refused, not waited for. */
    r.owner = w.owner = "alice";
    w.wait_ms = 10000;
    CHECK_RC(dlock_acquire(&rl, c1, "dg", &r), DLOCK_OK);
    CHECK_RC(dlock_acquire(&x, c2, "dg", &w), DLOCK_EMISUSE);
    CHECK_CONTAINS(dlock_error_message(), "upgrade");
    CHECK_RC(dlock_release(rl), DLOCK_OK);
    dlock_client_free(c1);
    dlock_client_free(c2);
    test_mariadb_stop(&m);
}

/* At most N permits with many processes; raising N lets more in. */
static void semaphore_processes(void)
{
    enum { PROCS = 8, ITERS = 6, N = 3 };
    test_mariadb m;
    shared *s = shared_page(4096);
    pid_t pids[PROCS];
    dlock_client *c;
    dlock_lock *l[4];
    dlock_acquire_options o = kopts(DLOCK_KIND_SEMAPHORE, 0, 3000);

    test_mariadb_start(&m);
    for (int p = 0; p < PROCS; p++) {
        pids[p] = fork();
        if (pids[p] == 0) {
            dlock_client *pc = open_url(m.url);
            dlock_acquire_options po = kopts(DLOCK_KIND_SEMAPHORE, 30000, 2000);
            po.permits = N;
            for (int i = 0; i < ITERS; i++) {
                dlock_lock *pl;
                CHECK_RC(dlock_acquire(&pl, pc, "sem", &po), DLOCK_OK);
                int n = atomic_fetch_add(&s->inside, 1) + 1;
                note_most(s, n);
                if (n > N)
                    atomic_fetch_add(&s->violations, 1);
                usleep(3000);
                atomic_fetch_sub(&s->inside, 1);
                CHECK_RC(dlock_release(pl), DLOCK_OK);
            }
            dlock_client_free(pc);
            _exit(0);
        }
    }
    for (int p = 0; p < PROCS; p++)
        test_wait_child_ok(pids[p]);
    fprintf(stderr, "violations %d, most inside %d\n", atomic_load(&s->violations),
            atomic_load(&s->most));
    CHECK(atomic_load(&s->violations) == 0);
    CHECK(atomic_load(&s->most) <= N);
    /* The stored N wins over the options; set_permits changes it. */
    c = open_url(m.url);
    o.permits = 100;
    for (int i = 0; i < N; i++)
        CHECK_RC(dlock_acquire(&l[i], c, "sem", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l[3], c, "sem", &o), DLOCK_EBUSY);
    CHECK_RC(dlock_semaphore_set_permits(c, "sem", N + 1), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l[3], c, "sem", &o), DLOCK_OK);
    for (int i = 0; i < 4; i++)
        CHECK_RC(dlock_release(l[i]), DLOCK_OK);
    dlock_client_free(c);
    test_mariadb_stop(&m);
}

/* Fair: waiters queued one after another get the lock in that order, each
 * in its own process; a try-once does not barge past them. */
static void fair_fifo_processes(void)
{
    enum { WAITERS = 4 };
    test_mariadb m;
    shared *s = shared_page(4096);
    pid_t pids[WAITERS];
    dlock_client *c;
    dlock_lock *l, *x = NULL;
    dlock_acquire_options o = kopts(DLOCK_KIND_FAIR, 0, 5000);

    test_mariadb_start(&m);
    o.auto_renew = 0; /* no watchdog thread in this process when it forks */
    c = open_url(m.url);
    CHECK_RC(dlock_acquire(&l, c, "fair", &o), DLOCK_OK);
    for (int p = 0; p < WAITERS; p++) {
        pids[p] = fork();
        if (pids[p] == 0) {
            dlock_client *pc = open_url(m.url);
            dlock_acquire_options po = kopts(DLOCK_KIND_FAIR, 30000, 3000);
            dlock_lock *pl;
            CHECK_RC(dlock_acquire(&pl, pc, "fair", &po), DLOCK_OK);
            if (atomic_fetch_add(&s->inside, 1) != 0)
                atomic_fetch_add(&s->violations, 1);
            atomic_store(&s->order[atomic_fetch_add(&s->next, 1)], p + 1);
            usleep(20000);
            atomic_fetch_sub(&s->inside, 1);
            CHECK_RC(dlock_release(pl), DLOCK_OK);
            dlock_client_free(pc);
            _exit(0);
        }
        /* The next one queues behind this one's place. */
        for (int i = 0; i < 500 && test_mariadb_query(&m, "SELECT COUNT(*) FROM dlock_holds"
                                                          " WHERE waiting = 1") < p + 1;
             i++)
            usleep(10000);
        CHECK(test_mariadb_query(&m, "SELECT COUNT(*) FROM dlock_holds WHERE waiting = 1") ==
              p + 1);
    }
    CHECK_RC(dlock_release(l), DLOCK_OK);
    /* No barging: a try-once finds the queue. */
    CHECK_RC(dlock_acquire(&x, c, "fair", &o), DLOCK_EBUSY);
    for (int p = 0; p < WAITERS; p++)
        test_wait_child_ok(pids[p]);
    CHECK(atomic_load(&s->violations) == 0);
    for (int p = 0; p < WAITERS; p++)
        CHECK(atomic_load(&s->order[p]) == p + 1);
    CHECK(test_mariadb_query(&m, "SELECT COUNT(*) FROM dlock_holds") == 0);
    dlock_client_free(c);
    test_mariadb_stop(&m);
}

typedef struct {
    atomic_int calls;
    atomic_llong fence;
    atomic_int held;
} observed;

static void on_leader(const dlock_leader_info *leader, void *payload)
{
    observed *o = payload;

    atomic_store(&o->held, leader->held);
    atomic_store(&o->fence, (long long)leader->fence);
    atomic_fetch_add(&o->calls, 1);
}

/* One leader among processes campaigning in turns; an observer sees a new
 * leader and the resignation. */
static void leader_processes(void)
{
    enum { PROCS = 4, TERMS = 3 };
    test_mariadb m;
    shared *s = shared_page(4096);
    pid_t pids[PROCS];
    dlock_client *c;
    dlock_observer *ob;
    dlock_leader_info now;
    dlock_lock *lead;
    dlock_acquire_options o = kopts(0, 0, 3000);
    observed seen = {0};

    test_mariadb_start(&m);
    for (int p = 0; p < PROCS; p++) {
        pids[p] = fork();
        if (pids[p] == 0) {
            dlock_client *pc = open_url(m.url);
            dlock_acquire_options po = kopts(0, 30000, 2000);
            for (int i = 0; i < TERMS; i++) {
                dlock_lock *pl;
                CHECK_RC(dlock_campaign(&pl, pc, "elect", "candidate", &po), DLOCK_OK);
                if (atomic_fetch_add(&s->inside, 1) != 0)
                    atomic_fetch_add(&s->violations, 1);
                usleep(5000);
                atomic_fetch_sub(&s->inside, 1);
                CHECK_RC(dlock_resign(pl), DLOCK_OK);
            }
            dlock_client_free(pc);
            _exit(0);
        }
    }
    for (int p = 0; p < PROCS; p++)
        test_wait_child_ok(pids[p]);
    CHECK(atomic_load(&s->violations) == 0);
    c = open_url(m.url);
    CHECK_RC(dlock_leader(&now, c, "elect"), DLOCK_OK);
    CHECK(!now.held);
    CHECK_RC(dlock_observe(&ob, c, "elect", on_leader, &seen), DLOCK_OK);
    for (int i = 0; i < 500 && atomic_load(&seen.calls) < 1; i++)
        usleep(10000);
    CHECK(atomic_load(&seen.calls) >= 1 && !atomic_load(&seen.held));
    CHECK_RC(dlock_campaign(&lead, c, "elect", "boss", &o), DLOCK_OK);
    CHECK_RC(dlock_leader(&now, c, "elect"), DLOCK_OK);
    CHECK(now.held && now.fence == dlock_lock_fence(lead) && strcmp(now.identity, "boss") == 0);
    for (int i = 0; i < 500 && atomic_load(&seen.fence) != (long long)dlock_lock_fence(lead); i++)
        usleep(10000);
    CHECK(atomic_load(&seen.held) && atomic_load(&seen.fence) == (long long)dlock_lock_fence(lead));
    CHECK_RC(dlock_resign(lead), DLOCK_OK);
    for (int i = 0; i < 500 && atomic_load(&seen.held); i++)
        usleep(10000);
    CHECK(!atomic_load(&seen.held));
    dlock_observer_free(ob);
    dlock_client_free(c);
    test_mariadb_stop(&m);
}

/* ---- who holds it ------------------------------------------------------- */

typedef struct {
    int n;
    int64_t pids[8];
    char labels[8][16];
    uint64_t fences[8];
    int kinds[8];
} holder_list;

static int collect(const char *name, const dlock_lock_info *info, void *payload)
{
    holder_list *h = payload;

    (void)name;
    if (h->n < 8) {
        h->pids[h->n] = info->has_holder ? info->pid : -1;
        snprintf(h->labels[h->n], sizeof(h->labels[0]), "%.15s", info->label);
        h->fences[h->n] = info->fence;
        h->kinds[h->n] = info->kind;
    }
    h->n++;
    return 0;
}

/* Each reader and each permit holder listed with its record and fence;
 * status counts them; a writer is one. */
static void holders_listed(void)
{
    static const int kinds[] = {DLOCK_KIND_READ, DLOCK_KIND_SEMAPHORE};
    test_mariadb m;
    dlock_client *c;
    dlock_lock_info info;

    test_mariadb_start(&m);
    c = open_url(m.url);
    for (size_t k = 0; k < 2; k++) {
        const char *name = k ? "sem-h" : "rw-h";
        dlock_lock *l[3];
        holder_list h = {0};
        for (int i = 0; i < 3; i++) {
            dlock_acquire_options o = kopts(kinds[k], 0, 3000);
            char label[16];
            snprintf(label, sizeof(label), "part-%d", i);
            o.label = label;
            o.permits = kinds[k] == DLOCK_KIND_SEMAPHORE ? 5 : 0;
            CHECK_RC(dlock_acquire(&l[i], c, name, &o), DLOCK_OK);
        }
        CHECK_RC(dlock_status(&info, c, name), DLOCK_OK);
        CHECK(info.held && info.holders == 3 && info.kind == kinds[k]);
        CHECK(info.has_holder && info.pid == getpid() && strcmp(info.label, "part-0") == 0);
        CHECK(info.ttl_ms > 0 && info.ttl_ms <= 3000);
        CHECK_RC(dlock_status_holders(c, name, collect, &h), DLOCK_OK);
        CHECK(h.n == 3);
        for (int i = 0; i < 3; i++) {
            char want[16];
            snprintf(want, sizeof(want), "part-%d", i);
            CHECK(h.pids[i] == getpid() && strcmp(h.labels[i], want) == 0);
            CHECK(h.fences[i] == dlock_lock_fence(l[i]) && h.kinds[i] == kinds[k]);
        }
        CHECK_RC(dlock_release(l[0]), DLOCK_OK);
        CHECK_RC(dlock_status(&info, c, name), DLOCK_OK);
        CHECK(info.holders == 2 && strcmp(info.label, "part-1") == 0);
        for (int i = 1; i < 3; i++)
            CHECK_RC(dlock_release(l[i]), DLOCK_OK);
        CHECK_RC(dlock_status(&info, c, name), DLOCK_OK);
        CHECK(!info.held && info.holders == 0);
    }
    dlock_client_free(c);
    test_mariadb_stop(&m);
}

/* ---- named mode --------------------------------------------------------- */

/* mode=named keeps the plain mutex and refuses the rest, naming the mode. */
static void named_mode_refuses_family(void)
{
    static const int kinds[] = {DLOCK_KIND_FAIR, DLOCK_KIND_READ, DLOCK_KIND_WRITE,
                                DLOCK_KIND_SEMAPHORE};
    test_mariadb m;
    char url[256];
    dlock_client *c;
    dlock_lock *l;
    dlock_leader_info info;
    dlock_observer *ob = NULL;
    dlock_acquire_options o = kopts(DLOCK_KIND_MUTEX, 0, 3000);
    observed seen = {0};

    test_mariadb_start(&m);
    snprintf(url, sizeof(url), "%s?mode=named", m.url);
    c = open_url(url);
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        dlock_acquire_options k = kopts(kinds[i], 0, 3000);
        k.permits = kinds[i] == DLOCK_KIND_SEMAPHORE ? 2 : 0;
        CHECK_RC(dlock_acquire(&l, c, "n", &k), DLOCK_ENOTSUP);
        CHECK_CONTAINS(dlock_error_message(), "mode=named serves the plain mutex only");
    }
    CHECK_RC(dlock_campaign(&l, c, "n", "me", &o), DLOCK_ENOTSUP);
    CHECK_CONTAINS(dlock_error_message(), "leader election");
    o.owner = "me";
    CHECK_RC(dlock_acquire(&l, c, "n", &o), DLOCK_ENOTSUP);
    CHECK_CONTAINS(dlock_error_message(), "owner ids");
    CHECK_RC(dlock_semaphore_set_permits(c, "n", 2), DLOCK_ENOTSUP);
    CHECK_RC(dlock_leader(&info, c, "n"), DLOCK_ENOTSUP);
    CHECK_CONTAINS(dlock_error_message(), "leader election");
    CHECK_RC(dlock_observe(&ob, c, "n", on_leader, &seen), DLOCK_ENOTSUP);
    o.owner = NULL;
    CHECK_RC(dlock_acquire(&l, c, "n", &o), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    test_mariadb_stop(&m);
}

TEST_MAIN({"owner_ids_beside_plain_mutex", owner_ids_beside_plain_mutex, NULL},
          {"fences_increase_across_kinds", fences_increase_across_kinds, NULL},
          {"same_token_same_fence_every_kind", same_token_same_fence_every_kind, NULL},
          {"rw_processes", rw_processes, NULL},
          {"rw_downgrade_and_upgrade", rw_downgrade_and_upgrade, NULL},
          {"semaphore_processes", semaphore_processes, NULL},
          {"fair_fifo_processes", fair_fifo_processes, NULL},
          {"leader_processes", leader_processes, NULL},
          {"holders_listed", holders_listed, NULL},
          {"named_mode_refuses_family", named_mode_refuses_family, NULL})
