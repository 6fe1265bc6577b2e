/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the lock family on MySQL / MariaDB's lease mode (docs/mysql.md, "The
 * lock family") has of its own, against a real mariadbd each test starts:
 * owner ids beside the plain mutex, fences strictly increasing across kinds
 * on one name, a retry of the same token given its fence, the fair queue's
 * places in dlock_holds, and named mode refusing the family. What every
 * backend that declares a kind must do (readers together and writers alone,
 * at most N permits, one leader and its observers, holders listed) is the
 * family suite's, run on MySQL as family-mysql.* (test_family_suite.c).
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

typedef struct {
    atomic_int inside, violations, next;
    atomic_int order[32];
} shared;

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

/* ---- the fair queue's places ----------------------------------------- */

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
          {"fair_fifo_processes", fair_fifo_processes, NULL},
          {"named_mode_refuses_family", named_mode_refuses_family, NULL})
