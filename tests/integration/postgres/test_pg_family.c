/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The lock family on PostgreSQL in lease mode (docs/postgres.md, "The lock
 * family"), against a private server each case starts: the companion table
 * and its function, fences of every kind from the one sequence, the same
 * token twice (a lost reply), exclusion among processes (a MAP_SHARED page
 * of counters sees any overlap), FIFO and writer wake-ups by NOTIFY well
 * before any lease or refresh would have woken the waiter, holders listed
 * with their records, leader election with an observer, and advisory mode
 * refusing every kind but the mutex.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dlock/sys/backend.h"
#include "test_pg.h"

extern const dlock_backend *dlock_postgres_backend(void); /* the static twin's table */

static dlock_client *open_url(const char *url)
{
    dlock_client *c = NULL;
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_OK);
    return c;
}

static dlock_acquire_options kopts(int kind, int64_t wait_ms, int64_t lease_ms)
{
    dlock_acquire_options o = test_opts(wait_ms, lease_ms, 1);
    o.kind = kind;
    return o;
}

static void *shared_page(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    memset(p, 0, size);
    return p;
}

/* Waiters' places in the name's queue (fair waiters, waiting writers). */
static long long places(test_pg *p, const char *name)
{
    return test_pg_query(p, "SELECT count(*) FROM dlock_locks_family WHERE name = "
                            "convert_to('dlock:%s', 'UTF8') AND arrival IS NOT NULL",
                         name);
}

static void wait_places(test_pg *p, const char *name, long long want)
{
    for (int i = 0; i < 1000 && places(p, name) != want; i++)
        test_sleep_ms(10);
    CHECK(places(p, name) == want);
}

/* ---- schema, fences, lost replies ---------------------------------------- */

static int count_held(const char *name, const dlock_lock_info *info, void *arg)
{
    (void)name;
    CHECK(info->held && info->kind == DLOCK_KIND_MUTEX);
    ++*(int *)arg;
    return 0;
}

/*
 * Opening makes the companion table and its function; one name taken as
 * every kind in turn gets fences strictly increasing across the kinds (one
 * sequence); the same token again (a retry after a lost reply) gets the
 * fence it already had, for a reader and a permit; a table whose family
 * is missing with create=0 keeps serving the mutex and says why the family
 * cannot run.
 */
static void schema_and_fences(void)
{
    static const int kinds[] = {DLOCK_KIND_MUTEX, DLOCK_KIND_FAIR, DLOCK_KIND_READ,
                                DLOCK_KIND_WRITE, DLOCK_KIND_SEMAPHORE, DLOCK_KIND_MUTEX};
    test_pg p;
    dlock_client *c;
    dlock_lock *l;
    uint64_t last = 0;
    dlock_url_host h = {"127.0.0.1", 0};
    dlock_url u;
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_request req;
    dlock_acquire_result r1, r2;
    void *be;
    char url[256];
    int held = 0;

    test_pg_start(&p);
    c = open_url(p.url);
    CHECK(test_pg_query(&p, "SELECT count(*) FROM pg_class WHERE relname = "
                            "'dlock_locks_family'") == 1);
    CHECK(test_pg_query(&p, "SELECT count(*) FROM pg_proc WHERE proname = "
                            "'dlock_locks_family_acquire'") == 1);
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        dlock_acquire_options o = kopts(kinds[i], 0, 3000);
        o.permits = kinds[i] == DLOCK_KIND_SEMAPHORE ? 2 : 0;
        CHECK_RC(dlock_acquire(&l, c, "every", &o), DLOCK_OK);
        CHECK(dlock_lock_fence(l) > last);
        last = dlock_lock_fence(l);
        CHECK_RC(dlock_release(l), DLOCK_OK);
    }
    CHECK_RC(dlock_campaign(&l, c, "every", "me", NULL), DLOCK_OK);
    CHECK(dlock_lock_fence(l) > last);
    CHECK_RC(dlock_resign(l), DLOCK_OK);
    dlock_client_free(c);

    /* The backend called directly: the same token twice. */
    h.port = p.port;
    memset(&u, 0, sizeof(u));
    u.scheme = "postgres";
    u.user = "dlock";
    u.hosts = &h;
    u.nhosts = 1;
    u.path = "/postgres";
    u.redacted = p.url;
    CHECK_RC(dlock_postgres_backend()->open(&be, &u, &co), DLOCK_OK);
    memset(&req, 0, sizeof(req));
    req.name = "retry";
    req.token = "0123456789abcdef0123456789abcdef";
    req.lease_ms = 3000;
    for (int k = DLOCK_KIND_READ; k <= DLOCK_KIND_SEMAPHORE; k += 2) {
        req.kind = k;
        req.name = k == DLOCK_KIND_READ ? "retry-r" : "retry-s";
        req.permits = k == DLOCK_KIND_SEMAPHORE ? 1 : 0;
        memset(&r1, 0, sizeof(r1));
        memset(&r2, 0, sizeof(r2));
        CHECK_RC(dlock_postgres_backend()->acquire(be, &req, NULL, &r1), DLOCK_OK);
        CHECK_RC(dlock_postgres_backend()->acquire(be, &req, NULL, &r2), DLOCK_OK);
        CHECK(r1.fence > 0 && r2.fence == r1.fence);
        CHECK_RC(dlock_postgres_backend()->release(be, &req), DLOCK_OK);
        CHECK_RC(dlock_postgres_backend()->release(be, &req), DLOCK_ELOST);
    }
    dlock_postgres_backend()->close(be);

    /* The longest table name (48): its function's name is 63 bytes,
     * PostgreSQL's longest, not cut short (which would call another). */
    snprintf(url, sizeof(url), "%s?table=%s", p.url,
             "t23456789_123456789_123456789_123456789_12345678");
    c = open_url(url);
    {
        dlock_acquire_options o = kopts(DLOCK_KIND_READ, 0, 3000);
        CHECK_RC(dlock_acquire(&l, c, "long", &o), DLOCK_OK);
        CHECK_RC(dlock_release(l), DLOCK_OK);
    }
    dlock_client_free(c);
    CHECK(test_pg_query(&p, "SELECT count(*) FROM pg_proc WHERE proname = "
                            "'t23456789_123456789_123456789_123456789_12345678_family_acquire'") ==
          1);

    /* A table made before the family (create=0): the mutex still works. */
    test_pg_query(&p, "DROP TABLE dlock_locks_family CASCADE");
    snprintf(url, sizeof(url), "%s?create=0", p.url);
    c = open_url(url);
    CHECK_RC(dlock_acquire(&l, c, "old", NULL), DLOCK_OK);
    CHECK_RC(dlock_status_holders(c, "old", count_held, &held), DLOCK_OK);
    CHECK(held == 1);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    {
        dlock_acquire_options o = kopts(DLOCK_KIND_READ, 0, 3000);
        CHECK_RC(dlock_acquire(&l, c, "old", &o), DLOCK_ESERVER);
        CHECK_CONTAINS(dlock_error_message(), "dlock_locks_family");
        CHECK_CONTAINS(dlock_error_message(), "create=0");
    }
    dlock_client_free(c);
    test_pg_stop(&p);
}

/* ---- exclusion among processes --------------------------------------------- */

typedef struct {
    atomic_int writers, readers, permits; /* holding now */
    atomic_int violations, max_readers, max_permits, taken;
} counts;

static void note_max(atomic_int *max, int v)
{
    int m = atomic_load(max);
    while (v > m && !atomic_compare_exchange_weak(max, &m, v))
        ;
}

/*
 * Child i of 7: 0 and 1 write, 2 and 3 read, 4, 5 and 6 take permits of a
 * semaphore of 2, each for a few rounds; every overlap a lock forbids is
 * counted in the shared page.
 */
static void exclusion_child(const char *url, counts *s, int i)
{
    dlock_client *c = open_url(url);

    for (int round = 0; round < 12; round++) {
        dlock_lock *l;
        int kind = i < 2 ? DLOCK_KIND_WRITE : i < 4 ? DLOCK_KIND_READ : DLOCK_KIND_SEMAPHORE;
        dlock_acquire_options o = kopts(kind, 20000, 2000);
        const char *name = kind == DLOCK_KIND_SEMAPHORE ? "sem" : "rw";

        o.permits = kind == DLOCK_KIND_SEMAPHORE ? 2 : 0;
        CHECK_RC(dlock_acquire(&l, c, name, &o), DLOCK_OK);
        atomic_fetch_add(&s->taken, 1);
        if (kind == DLOCK_KIND_WRITE) {
            if (atomic_fetch_add(&s->writers, 1) != 0 || atomic_load(&s->readers) != 0)
                atomic_fetch_add(&s->violations, 1);
            usleep(5000);
            atomic_fetch_sub(&s->writers, 1);
        } else if (kind == DLOCK_KIND_READ) {
            note_max(&s->max_readers, atomic_fetch_add(&s->readers, 1) + 1);
            if (atomic_load(&s->writers) != 0)
                atomic_fetch_add(&s->violations, 1);
            usleep(10000);
            atomic_fetch_sub(&s->readers, 1);
        } else {
            int n = atomic_fetch_add(&s->permits, 1) + 1;
            note_max(&s->max_permits, n);
            if (n > 2)
                atomic_fetch_add(&s->violations, 1);
            usleep(8000);
            atomic_fetch_sub(&s->permits, 1);
        }
        CHECK_RC(dlock_release(l), DLOCK_OK);
    }
    dlock_client_free(c);
}

/* Writers alone, readers together, at most N permits, across processes. */
static void exclusion_across_processes(void)
{
    test_pg p;
    counts *s = shared_page(sizeof(counts));
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = kopts(DLOCK_KIND_SEMAPHORE, 0, 3000);
    int pids[7];

    test_pg_start(&p);
    /* Made once first: seven processes creating the schema at once is
     * another test's business (dlock__pg_create's advisory lock). */
    c = open_url(p.url);
    o.permits = 2;
    CHECK_RC(dlock_acquire(&l, c, "sem", &o), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    /* Freed before the forks, and its watchdog thread with it: a child
     * forked while another thread holds a lock (a libc or sanitizer
     * allocator's) may wait for it for ever, the likely cause of this
     * case's one 120 s timeout in CI, under ASan. */
    dlock_client_free(c);
    for (int i = 0; i < 7; i++) {
        if ((pids[i] = fork()) == 0) {
            exclusion_child(p.url, s, i);
            _exit(0);
        }
        CHECK(pids[i] > 0);
    }
    for (int i = 0; i < 7; i++)
        test_wait_child_ok(pids[i]);
    CHECK(atomic_load(&s->taken) == 7 * 12);
    CHECK(atomic_load(&s->violations) == 0);
    CHECK(atomic_load(&s->max_permits) <= 2);
    /* Nothing left behind: no hold, no place. */
    CHECK(test_pg_query(&p, "SELECT count(*) FROM dlock_locks_family WHERE id <> ''") == 0);
    test_pg_stop(&p);
}

/* ---- fair: FIFO by NOTIFY ------------------------------------------------- */

typedef struct {
    dlock_client *c;
    int index;
    atomic_int *order; /* order[0] the next slot, order[1..] who came */
    int rc;
} fair_waiter;

static void *fair_main(void *arg)
{
    fair_waiter *w = arg;
    dlock_acquire_options o = kopts(DLOCK_KIND_FAIR, 20000, 60000);
    dlock_lock *l;

    if ((w->rc = dlock_acquire(&l, w->c, "fifo", &o)) != DLOCK_OK)
        return NULL;
    atomic_store(&w->order[1 + atomic_fetch_add(&w->order[0], 1)], w->index);
    test_sleep_ms(20);
    w->rc = dlock_release(l);
    return NULL;
}

/*
 * Three waiters queue behind a holder of a minute's lease, one after the
 * other (each seen in the queue before the next starts); they get the lock
 * in that order, each woken by the NOTIFY of a release: the four hand-offs
 * take well under the 10 s a waiter sleeps between refreshes of its place
 * (W/3 with W = 30 s), and each release wakes the head alone. A try-once
 * while they wait is refused (no barging), a waiter that gives up leaves
 * the queue, and one killed at its head leaves it W after its last
 * refresh.
 */
static void fair_fifo_by_notify(void)
{
    test_pg p;
    dlock_client *holder, *cs[3], *late;
    dlock_acquire_options o = kopts(DLOCK_KIND_FAIR, 0, 60000);
    dlock_lock *l, *x;
    fair_waiter w[3];
    pthread_t t[3];
    atomic_int order[4] = {0};
    int64_t start;
    test_acquirer next;
    pid_t dead;

    test_pg_start(&p);
    holder = open_url(p.url);
    late = open_url(p.url);
    CHECK_RC(dlock_acquire(&l, holder, "fifo", &o), DLOCK_OK);
    for (int i = 0; i < 3; i++) {
        cs[i] = open_url(p.url);
        w[i] = (fair_waiter){cs[i], i, order, -1};
        CHECK(pthread_create(&t[i], NULL, fair_main, &w[i]) == 0);
        wait_places(&p, "fifo", i + 1);
    }
    /* A waiter that gives up leaves its place. */
    o.wait_ms = 300;
    CHECK_RC(dlock_acquire(&x, late, "fifo", &o), DLOCK_ETIMEOUT);
    CHECK(places(&p, "fifo") == 3);
    start = test_clock_ms(CLOCK_MONOTONIC);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    /* No barging: a try while the queue's head is on its way is busy
     * (or, if the queue is through already, taken and given back). */
    o.wait_ms = 0;
    if (dlock_acquire(&x, late, "fifo", &o) == DLOCK_OK) {
        CHECK(atomic_load(&order[0]) == 3);
        CHECK_RC(dlock_release(x), DLOCK_OK);
    }
    for (int i = 0; i < 3; i++) {
        CHECK(pthread_join(t[i], NULL) == 0);
        CHECK_RC(w[i].rc, DLOCK_OK);
    }
    CHECK(test_clock_ms(CLOCK_MONOTONIC) - start < 5000);
    for (int i = 0; i < 3; i++)
        CHECK(atomic_load(&order[1 + i]) == i);
    CHECK(places(&p, "fifo") == 0);
    /* Each release woke the head alone: every waiter found the lock busy
     * twice (its try before watching, and the one that took its place),
     * then took it at its next. Woken by every release, the later ones
     * would have tried (and been refused) once more per release. */
    for (int i = 0; i < 3; i++) {
        dlock_stats st = DLOCK_STATS_INIT;
        CHECK_RC(dlock_client_stats(&st, cs[i]), DLOCK_OK);
        CHECK(st.busy == 2);
    }

    /* A waiter killed at the head of the queue (W = 1 s for its 1 s lease)
     * holds up the next one until its place expires, not for ever: the
     * release names the dead head, and the next waiter's refresh (every
     * W/3) finds its place gone. */
    o = kopts(DLOCK_KIND_FAIR, 0, 60000);
    CHECK_RC(dlock_acquire(&l, holder, "dead", &o), DLOCK_OK);
    if ((dead = fork()) == 0) {
        dlock_client *dc = open_url(p.url);
        dlock_acquire_options d = kopts(DLOCK_KIND_FAIR, 60000, 1000);
        dlock_acquire(&x, dc, "dead", &d);
        _exit(1);
    }
    CHECK(dead > 0);
    wait_places(&p, "dead", 1);
    CHECK(kill(dead, SIGKILL) == 0);
    CHECK(waitpid(dead, NULL, 0) == dead);
    test_acquirer_init(&next, cs[0], "dead", kopts(DLOCK_KIND_FAIR, 20000, 1000));
    CHECK(pthread_create(&t[0], NULL, test_acquirer_main, &next) == 0);
    /* In line (its try with a watch was refused: 2 more busy tries). */
    for (int i = 0; i < 1000; i++) {
        dlock_stats st = DLOCK_STATS_INIT;
        CHECK_RC(dlock_client_stats(&st, cs[0]), DLOCK_OK);
        if (st.busy >= 4)
            break;
        test_sleep_ms(10);
    }
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(pthread_join(t[0], NULL) == 0);
    CHECK_RC(next.rc, DLOCK_OK);
    CHECK(next.took_ms < 5000);
    CHECK_RC(dlock_release(next.lock), DLOCK_OK);
    for (int i = 0; i < 3; i++)
        dlock_client_free(cs[i]);
    dlock_client_free(holder);
    dlock_client_free(late);
    test_pg_stop(&p);
}

/* ---- read-write: writer preference, downgrade, holders ----------------------- */

typedef struct {
    char labels[4][DLOCK_LABEL_MAX + 1];
    int kinds[4];
    int n, holders;
} seen;

static int see(const char *name, const dlock_lock_info *info, void *arg)
{
    seen *s = arg;

    (void)name;
    CHECK(info->held && info->has_holder && info->pid == getpid());
    if (s->n < 4) {
        snprintf(s->labels[s->n], sizeof(s->labels[0]), "%s", info->label);
        s->kinds[s->n] = info->kind;
    }
    s->n++;
    s->holders = info->holders;
    return 0;
}

static int has_label(const seen *s, const char *label)
{
    for (int i = 0; i < s->n && i < 4; i++)
        if (strcmp(s->labels[i], label) == 0)
            return 1;
    return 0;
}

/*
 * A reader holds; a writer waits (a lease of a minute: only the NOTIFY of
 * the reader's release can wake it before its refresh, 10 s away); a new
 * reader is kept out meanwhile (writer preference); the reader's release
 * lets the writer in within a second; the writer downgrades, keeping its
 * fence, and the new reader gets in beside it; holders lists both readers
 * with their labels; an owner id that reads may not upgrade; a force
 * release breaks every reader.
 */
static void rw_preference_downgrade_holders(void)
{
    test_pg p;
    dlock_client *a, *b;
    dlock_acquire_options ro = kopts(DLOCK_KIND_READ, 0, 60000), wo;
    dlock_lock *r1, *r2, *x;
    test_acquirer w;
    pthread_t t;
    dlock_lock_info info;
    seen s = {0};
    uint64_t fence;
    int64_t start;

    test_pg_start(&p);
    a = open_url(p.url);
    b = open_url(p.url);
    ro.label = "first reader";
    CHECK_RC(dlock_acquire(&r1, a, "rw", &ro), DLOCK_OK);
    wo = kopts(DLOCK_KIND_WRITE, 20000, 60000);
    wo.label = "the writer";
    test_acquirer_init(&w, b, "rw", wo);
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &w) == 0);
    wait_places(&p, "rw", 1);
    ro.label = "second reader";
    CHECK_RC(dlock_acquire(&r2, a, "rw", &ro), DLOCK_EBUSY);
    test_sleep_ms(100);
    CHECK(!atomic_load(&w.done));
    start = test_clock_ms(CLOCK_MONOTONIC);
    CHECK_RC(dlock_release(r1), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(w.rc, DLOCK_OK);
    CHECK(test_clock_ms(CLOCK_MONOTONIC) - start < 1500);
    CHECK(places(&p, "rw") == 0);
    CHECK_RC(dlock_status(&info, a, "rw"), DLOCK_OK);
    CHECK(info.held && info.kind == DLOCK_KIND_WRITE && info.holders == 1);
    CHECK_RC(dlock_acquire(&r2, a, "rw", &ro), DLOCK_EBUSY);
    fence = dlock_lock_fence(w.lock);
    CHECK_RC(dlock_lock_downgrade(w.lock), DLOCK_OK);
    CHECK(dlock_lock_kind(w.lock) == DLOCK_KIND_READ && dlock_lock_fence(w.lock) == fence);
    CHECK_RC(dlock_acquire(&r2, a, "rw", &ro), DLOCK_OK);
    CHECK(dlock_lock_fence(r2) > fence);
    CHECK_RC(dlock_status_holders(a, "rw", see, &s), DLOCK_OK);
    CHECK(s.n == 2 && s.holders == 2);
    CHECK(has_label(&s, "the writer") && has_label(&s, "second reader"));
    CHECK(s.kinds[0] == DLOCK_KIND_READ && s.kinds[1] == DLOCK_KIND_READ);
    CHECK_RC(dlock_status(&info, a, "rw"), DLOCK_OK);
    CHECK(info.held && info.kind == DLOCK_KIND_READ && info.holders == 2);
    CHECK(strcmp(info.label, "the writer") == 0); /* the oldest: the lowest fence */
    /* An owner that reads may not upgrade, at once. */
    ro.owner = "alice";
    ro.label = NULL;
    CHECK_RC(dlock_acquire(&x, b, "rw-own", &ro), DLOCK_OK);
    wo = kopts(DLOCK_KIND_WRITE, 20000, 3000);
    wo.owner = "alice";
    CHECK_RC(dlock_acquire(&r1, b, "rw-own", &wo), DLOCK_EMISUSE);
    CHECK_CONTAINS(dlock_error_message(), "upgrade is refused");
    CHECK_RC(dlock_release(x), DLOCK_OK);
    /* A force release breaks both readers. */
    CHECK_RC(dlock_force_release(&info, a, "rw"), DLOCK_OK);
    CHECK(info.held && info.holders == 2);
    CHECK_RC(dlock_lock_check(r2), DLOCK_ELOST);
    CHECK_RC(dlock_release(w.lock), DLOCK_ELOST);
    CHECK_RC(dlock_release(r2), DLOCK_ELOST);
    dlock_client_free(a);
    dlock_client_free(b);
    test_pg_stop(&p);
}

/* ---- semaphore and leader ---------------------------------------------------- */

typedef struct {
    pthread_mutex_t mu;
    dlock_leader_info last;
    int calls;
} observed;

static void on_leader(const dlock_leader_info *leader, void *payload)
{
    observed *o = payload;

    pthread_mutex_lock(&o->mu);
    o->last = *leader;
    o->calls++;
    pthread_mutex_unlock(&o->mu);
}

static void wait_observed(observed *o, int held, const char *identity)
{
    for (int i = 0; i < 300; i++) {
        int ok;
        pthread_mutex_lock(&o->mu);
        ok = o->last.held == held && strcmp(o->last.identity, identity) == 0;
        pthread_mutex_unlock(&o->mu);
        if (ok)
            return;
        test_sleep_ms(10);
    }
    fprintf(stderr, "the observer never saw held=%d '%s'\n", held, identity);
    exit(1);
}

/*
 * Semaphore: N set by the first acquisition, the stored N wins, a third
 * permit waits until set_permits raises N (its NOTIFY wakes the waiter),
 * each permit holder listed with its label, no N at all refused.
 * Leader: one leads, a second campaign waits, the observer sees each
 * leader within 3 s (woken by NOTIFY: the leases are a minute), resign
 * hands over with a higher fence.
 */
static void semaphore_and_leader(void)
{
    test_pg p;
    dlock_client *a, *b;
    dlock_acquire_options so = kopts(DLOCK_KIND_SEMAPHORE, 0, 60000), lo;
    dlock_lock *s1, *s2, *x, *lead;
    test_acquirer w;
    pthread_t t;
    dlock_leader_info li;
    observed ob = {PTHREAD_MUTEX_INITIALIZER, {0}, 0};
    dlock_observer *obs;
    seen s = {0};
    char label[16];
    uint64_t fence;

    test_pg_start(&p);
    a = open_url(p.url);
    b = open_url(p.url);
    CHECK_RC(dlock_acquire(&x, a, "sem", &so), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "no number of permits");
    so.permits = 2;
    so.label = "permit 1";
    CHECK_RC(dlock_acquire(&s1, a, "sem", &so), DLOCK_OK);
    so.permits = 5; /* the stored N wins */
    so.label = "permit 2";
    CHECK_RC(dlock_acquire(&s2, a, "sem", &so), DLOCK_OK);
    CHECK(dlock_lock_fence(s2) > dlock_lock_fence(s1));
    CHECK_RC(dlock_acquire(&x, a, "sem", &so), DLOCK_EBUSY);
    so.wait_ms = 20000;
    so.label = "permit 3";
    test_acquirer_init(&w, b, "sem", so);
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &w) == 0);
    test_sleep_ms(300);
    CHECK(!atomic_load(&w.done));
    CHECK_RC(dlock_semaphore_set_permits(a, "sem", 3), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(w.rc, DLOCK_OK);
    CHECK(w.took_ms < 3000);
    CHECK_RC(dlock_status_holders(a, "sem", see, &s), DLOCK_OK);
    CHECK(s.n == 3 && s.holders == 3);
    for (int i = 1; i <= 3; i++) {
        snprintf(label, sizeof(label), "permit %d", i);
        CHECK(has_label(&s, label));
        CHECK(s.kinds[i - 1] == DLOCK_KIND_SEMAPHORE);
    }
    CHECK_RC(dlock_release(s1), DLOCK_OK);
    CHECK_RC(dlock_release(s2), DLOCK_OK);
    CHECK_RC(dlock_release(w.lock), DLOCK_OK);

    CHECK_RC(dlock_observe(&obs, b, "boss", on_leader, &ob), DLOCK_OK);
    wait_observed(&ob, 0, "");
    lo = test_opts(0, 60000, 1);
    CHECK_RC(dlock_campaign(&lead, a, "boss", "alpha", &lo), DLOCK_OK);
    fence = dlock_lock_fence(lead);
    wait_observed(&ob, 1, "alpha");
    CHECK_RC(dlock_leader(&li, b, "boss"), DLOCK_OK);
    CHECK(li.held && li.fence == fence && strcmp(li.identity, "alpha") == 0);
    CHECK_RC(dlock_campaign(&x, b, "boss", "beta", &lo), DLOCK_EBUSY);
    lo.wait_ms = 20000;
    {
        dlock_lock *next;
        CHECK_RC(dlock_resign(lead), DLOCK_OK);
        wait_observed(&ob, 0, "");
        CHECK_RC(dlock_campaign(&next, b, "boss", "beta", &lo), DLOCK_OK);
        CHECK(dlock_lock_fence(next) > fence);
        wait_observed(&ob, 1, "beta");
        CHECK_RC(dlock_resign(next), DLOCK_OK);
    }
    dlock_observer_free(obs);
    dlock_client_free(a);
    dlock_client_free(b);
    test_pg_stop(&p);
}

/* ---- advisory mode ---------------------------------------------------------- */

/* Advisory mode keeps the mutex and refuses the rest, saying why. */
static void advisory_refuses_family(void)
{
    static const int kinds[] = {DLOCK_KIND_FAIR, DLOCK_KIND_READ, DLOCK_KIND_WRITE,
                                DLOCK_KIND_SEMAPHORE};
    test_pg p;
    dlock_client *c;
    dlock_lock *l;
    dlock_leader_info li;
    dlock_observer *obs;
    observed ob = {PTHREAD_MUTEX_INITIALIZER, {0}, 0};
    char url[256];
    int n = 0;

    test_pg_start(&p);
    snprintf(url, sizeof(url), "%s?mode=advisory", p.url);
    c = open_url(url);
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        dlock_acquire_options o = kopts(kinds[i], 0, 3000);
        o.permits = kinds[i] == DLOCK_KIND_SEMAPHORE ? 2 : 0;
        CHECK_RC(dlock_acquire(&l, c, "k", &o), DLOCK_ENOTSUP);
        CHECK_CONTAINS(dlock_error_message(), "mode=advisory serves the plain mutex only");
    }
    CHECK_RC(dlock_campaign(&l, c, "k", "me", NULL), DLOCK_ENOTSUP);
    CHECK_CONTAINS(dlock_error_message(), "leader election");
    CHECK_RC(dlock_leader(&li, c, "k"), DLOCK_ENOTSUP);
    CHECK_RC(dlock_observe(&obs, c, "k", on_leader, &ob), DLOCK_ENOTSUP);
    CHECK_RC(dlock_semaphore_set_permits(c, "k", 2), DLOCK_ENOTSUP);
    CHECK_CONTAINS(dlock_error_message(), "mode=lease");
    /* The mutex still is, and its one holder is listed (a session keeps
     * no record of who it is). */
    CHECK_RC(dlock_acquire(&l, c, "k", NULL), DLOCK_OK);
    CHECK_RC(dlock_status_holders(c, "k", count_held, &n), DLOCK_OK);
    CHECK(n == 1);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    /* Nothing of the family was made in advisory mode. */
    CHECK(test_pg_query(&p, "SELECT count(*) FROM pg_class WHERE relname = "
                            "'dlock_locks_family'") == 0);
    dlock_client_free(c);
    test_pg_stop(&p);
}

TEST_MAIN({"schema_and_fences", schema_and_fences, NULL},
          {"exclusion_across_processes", exclusion_across_processes, NULL},
          {"fair_fifo_by_notify", fair_fifo_by_notify, NULL},
          {"rw_preference_downgrade_holders", rw_preference_downgrade_holders, "watchdog"},
          {"semaphore_and_leader", semaphore_and_leader, NULL},
          {"advisory_refuses_family", advisory_refuses_family, NULL})
