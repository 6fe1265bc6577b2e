/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What only the MySQL / MariaDB backend has (docs/mysql.md), against a real
 * mariadbd each test starts (tests/support/test_mysql.c): the server's
 * clock decides a lease, a holder's connection killed from the server,
 * a retry after a lost reply, the wake channel, the long-name hash, a
 * server restarted under a held lock, bad URLs and credentials, TLS that
 * cannot be downgraded, no clear-text password for a server that asks for
 * one (a fake server in this file), and key_secret's lock names.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mysql.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "dlock/sys/backend.h"
#include "test.h"

extern const dlock_backend *dlock_mysql_backend(void); /* the static twin's table */

static dlock_client *open_url(const char *url)
{
    dlock_client *c = NULL;

    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_OK);
    CHECK(strcmp(dlock_client_backend(c), "mysql") == 0);
    return c;
}

static void named_url(const test_mariadb *m, char *out, size_t size)
{
    snprintf(out, size, "%s?mode=named", m->url);
}

/* ---- the server's clock decides ----------------------------------------- */

/* The row's expiry is the server's UTC_TIMESTAMP(6) plus the lease, and a
 * lease the server's clock has passed is free to take, whatever the
 * holder's own clock says. */
static void expiry_by_server_clock(void)
{
    test_mariadb m;
    dlock_client *c, *other;
    dlock_lock *a, *b;
    dlock_acquire_options o = test_opts(0, 30000, 0);
    long long left_us;

    test_mariadb_start(&m);
    c = open_url(m.url);
    other = open_url(m.url);
    CHECK_RC(dlock_acquire(&a, c, "clock", &o), DLOCK_OK);
    left_us = test_mariadb_query(&m, "SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires)"
                                     " FROM dlock_locks WHERE name = 'dlock:clock'");
    CHECK(left_us > 20000000 && left_us <= 30000000);
    CHECK_RC(dlock_acquire(&b, other, "clock", &o), DLOCK_EBUSY);
    /* The server's clock passes the expiry (as if 30 s went by there). */
    CHECK(test_mariadb_query(&m, "UPDATE dlock_locks SET expires = UTC_TIMESTAMP(6) - INTERVAL 1"
                                 " SECOND WHERE name = 'dlock:clock'") == 1);
    CHECK_RC(dlock_lock_check(a), DLOCK_ELOST);
    CHECK_RC(dlock_acquire(&b, other, "clock", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(b) > dlock_lock_fence(a));
    CHECK_RC(dlock_release(a), DLOCK_ELOST);
    CHECK_RC(dlock_lock_check(b), DLOCK_OK);
    CHECK_RC(dlock_release(b), DLOCK_OK);
    dlock_client_free(c);
    dlock_client_free(other);
    test_mariadb_stop(&m);
}

/* ---- a holder's connection killed ---------------------------------------- */

/* Named mode: KILL the connection that holds the lock; the server lets go
 * of it, a waiter gets it, and the stale handle's on_lost fires. */
static void named_killed_connection_loses_lock(void)
{
    test_mariadb m;
    char url[256];
    dlock_client *c, *other;
    dlock_lock *a, *b;
    dlock_acquire_options o = test_opts(0, 3000, 1), w = test_opts(30000, 3000, 0);
    long long conn;

    atomic_store(&test_lost_calls, 0);
    test_mariadb_start(&m);
    named_url(&m, url, sizeof(url));
    c = open_url(url);
    other = open_url(url);
    o.on_lost = test_count_lost;
    CHECK_RC(dlock_acquire(&a, c, "victim", &o), DLOCK_OK);
    conn = test_mariadb_query(&m, "SELECT IS_USED_LOCK('dlock:victim')");
    CHECK(conn > 0);
    CHECK(test_mariadb_query(&m, "SELECT conn FROM dlock_named WHERE name = 'dlock:victim'") ==
          conn);
    CHECK(test_mariadb_query(&m, "KILL CONNECTION %lld", conn) >= 0);
    CHECK_RC(dlock_acquire(&b, other, "victim", &w), DLOCK_OK);
    CHECK(dlock_lock_fence(b) > dlock_lock_fence(a));
    for (int i = 0; i < 500 && atomic_load(&test_lost_calls) == 0; i++)
        test_sleep_ms(20);
    CHECK(atomic_load(&test_lost_calls) == 1);
    CHECK(atomic_load(&test_lost_reason) == DLOCK_ELOST);
    CHECK(dlock_lock_lost(a));
    CHECK_RC(dlock_release(a), DLOCK_ELOST);
    CHECK_RC(dlock_lock_check(b), DLOCK_OK);
    CHECK_RC(dlock_release(b), DLOCK_OK);
    CHECK(test_mariadb_query(&m, "SELECT IS_USED_LOCK('dlock:victim') IS NULL") == 1);
    dlock_client_free(c);
    dlock_client_free(other);
    test_mariadb_stop(&m);
}

/* Lease mode: a holder killed (SIGKILL) leaves its row until the lease
 * runs out on the server; its connections die with it, which wakes the
 * waiter early, and the waiter then waits for the expiry. */
static void lease_killed_holder_expires(void)
{
    test_mariadb m;
    dlock_client *c;
    dlock_lock *b;
    dlock_acquire_options w = test_opts(30000, 5000, 0);
    int pipefd[2], pid;
    int64_t before;
    char ok;

    test_mariadb_start(&m);
    CHECK(pipe(pipefd) == 0);
    before = test_clock_ms(CLOCK_REALTIME);
    pid = fork();
    if (pid == 0) {
        dlock_client *hc = open_url(m.url);
        dlock_lock *a;
        dlock_acquire_options o = test_opts(0, 1500, 0);
        CHECK_RC(dlock_acquire(&a, hc, "crash", &o), DLOCK_OK);
        if (write(pipefd[1], "k", 1) != 1)
            _exit(1);
        pause();
        _exit(0);
    }
    CHECK(read(pipefd[0], &ok, 1) == 1);
    c = open_url(m.url);
    CHECK(test_mariadb_query(&m, "SELECT COUNT(*) FROM dlock_locks WHERE name = 'dlock:crash'"
                                 " AND token <> '' AND expires > UTC_TIMESTAMP(6)") == 1);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    CHECK_RC(dlock_acquire(&b, c, "crash", &w), DLOCK_OK);
    /* Taken over only once the server's clock passed the dead lease, which
     * it began after `before` (same machine, same clock; 100 ms slack for
     * the rounding of the two clocks). */
    CHECK(test_clock_ms(CLOCK_REALTIME) - before >= 1400);
    CHECK_RC(dlock_release(b), DLOCK_OK);
    dlock_client_free(c);
    test_mariadb_stop(&m);
}

/* ---- a retry after a lost reply ------------------------------------------ */

static void url_of(dlock_url *u, dlock_url_host *h, dlock_url_param *p, test_mariadb *m,
                   int named)
{
    static char scheme[] = "mysql", user[] = "dlock", pw[] = "dlockpw", host[] = "127.0.0.1",
                path[] = "/dlock_test", mode[] = "mode", namedv[] = "named";

    memset(u, 0, sizeof(*u));
    h->host = host;
    h->port = m->port;
    p->key = mode;
    p->value = namedv;
    u->scheme = scheme;
    u->user = user;
    u->password = pw;
    u->hosts = h;
    u->nhosts = 1;
    u->path = path;
    u->params = p;
    u->nparams = named ? 1 : 0;
    u->redacted = m->url;
}

/* The same token tried again (its reply lost) gets the fence it was given,
 * in both modes; another token is refused. */
static void same_token_same_fence(void)
{
    test_mariadb m;
    const dlock_backend *b = dlock_mysql_backend();

    test_mariadb_start(&m);
    for (int named = 0; named < 2; named++) {
        dlock_url u;
        dlock_url_host h;
        dlock_url_param p;
        void *be = NULL;
        dlock_request r = {0}, r2;
        dlock_acquire_result out = {0}, out2 = {0};

        url_of(&u, &h, &p, &m, named);
        CHECK_RC(b->open(&be, &u, NULL), DLOCK_OK);
        r.kind = DLOCK_KIND_MUTEX;
        r.name = named ? "idem-n" : "idem";
        r.token = "0123456789abcdef0123456789abcdef";
        r.lease_ms = 5000;
        r.holder = "testhost 42 1700000000000 lbl";
        CHECK_RC(b->acquire(be, &r, NULL, &out), DLOCK_OK);
        CHECK(out.fence > 0);
        CHECK_RC(b->acquire(be, &r, NULL, &out2), DLOCK_OK);
        CHECK(out2.fence == out.fence);
        r2 = r;
        r2.token = "fedcba9876543210fedcba9876543210";
        CHECK_RC(b->acquire(be, &r2, NULL, &out2), DLOCK_EBUSY);
        CHECK_RC(b->release(be, &r2), DLOCK_ELOST);
        CHECK_RC(b->check(be, &r), DLOCK_OK);
        CHECK_RC(b->release(be, &r), DLOCK_OK);
        CHECK_RC(b->release(be, &r), DLOCK_ELOST);
        CHECK_RC(b->acquire(be, &r2, NULL, &out2), DLOCK_OK);
        CHECK(out2.fence > out.fence);
        CHECK_RC(b->release(be, &r2), DLOCK_OK);
        b->close(be);
    }
    test_mariadb_stop(&m);
}

/* ---- waiting -------------------------------------------------------------- */

typedef struct {
    dlock_client *c;
    const char *name;
    int rc;
    uint64_t fence;
    atomic_int done;
} waiter;

static void *wait_main(void *arg)
{
    waiter *w = arg;
    dlock_lock *l;
    /* Waits up to 20 s for a lock whose lease is 60 s: only a wake-up on
     * release gets it. */
    dlock_acquire_options o = test_opts(20000, 5000, 0);

    w->rc = dlock_acquire(&l, w->c, w->name, &o);
    if (w->rc == DLOCK_OK) {
        w->fence = dlock_lock_fence(l);
        dlock_release(l);
    }
    atomic_store(&w->done, 1);
    return NULL;
}

/* The wake channel of lock "late" in lease mode. */
#define LATE_CHANNEL "CONCAT('dlckw#', LEFT(SHA2('dlock:late', 256), 58))"

/* A waiter's look at the channel (mysql_wait.c), made slow: it holds the
 * channel 80 ms. */
static void *hold_channel_main(void *arg)
{
    test_mariadb *m = arg;

    CHECK(test_mariadb_query(m, "SELECT GET_LOCK(" LATE_CHANNEL ", 0) + SLEEP(0.08) +"
                                " RELEASE_LOCK(" LATE_CHANNEL ")") == 2);
    return NULL;
}

/* An acquire that wins while another session holds the channel for a
 * moment (a waiter's look, or the last holder's RELEASE_LOCK not run yet)
 * still ends up holding it: its GET_LOCK(w, 0) beside the CALL fails, and
 * the take after it waits for the channel (200 ms at most here). Without
 * the channel its release would wake nobody. */
static void channel_taken_after_a_momentary_hold(void)
{
    test_mariadb m;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 60000, 0);
    pthread_t t;
    int i;

    test_mariadb_start(&m);
    c = open_url(m.url);
    CHECK(pthread_create(&t, NULL, hold_channel_main, &m) == 0);
    for (i = 0; i < 500 && test_mariadb_query(&m, "SELECT IS_USED_LOCK(" LATE_CHANNEL ")"
                                                  " IS NOT NULL") != 1; i++)
        test_sleep_ms(2);
    CHECK_RC(dlock_acquire(&l, c, "late", &o), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(test_mariadb_query(&m, "SELECT IS_USED_LOCK(" LATE_CHANNEL ") IS NOT NULL") == 1);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(test_mariadb_query(&m, "SELECT IS_USED_LOCK(" LATE_CHANNEL ") IS NULL") == 1);
    dlock_client_free(c);
    test_mariadb_stop(&m);
}

/* A holder that keeps no wake channel (another program, here the
 * procedure called by hand) holds the row for a minute and lets go after
 * a second. The waiter finds the channel free, tries, finds it free again:
 * it pauses, 10 ms doubling to 500 ms, and so takes the lock within a
 * second of the release (the test allows 5 s), where it slept to the
 * holder's expiry (its own 30 s wait's end here) before. */
static void holder_without_channel_found_soon(void)
{
    test_mariadb m;
    dlock_client *c;
    test_acquirer w;
    pthread_t t;
    int i;

    test_mariadb_start(&m);
    c = open_url(m.url);
    test_mariadb_query(&m, "CALL dlock_acquire_v1('dlock:bare', 'by-hand', 60000, NULL)");
    CHECK(test_mariadb_query(&m, "SELECT COUNT(*) FROM dlock_locks WHERE name = 'dlock:bare'"
                                 " AND token = 'by-hand'") == 1);
    test_acquirer_init(&w, c, "bare", test_opts(30000, 60000, 0));
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &w) == 0);
    test_sleep_ms(1000);
    CHECK(!atomic_load(&w.done));
    CHECK(test_mariadb_query(&m, "UPDATE dlock_locks SET token = '', expires = UTC_TIMESTAMP(6)"
                                 " WHERE name = 'dlock:bare' AND token = 'by-hand'") == 1);
    for (i = 0; i < 500 && !atomic_load(&w.done); i++)
        test_sleep_ms(10);
    CHECK(atomic_load(&w.done));
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(w.rc, DLOCK_OK);
    CHECK_RC(dlock_release(w.lock), DLOCK_OK);
    dlock_client_free(c);
    test_mariadb_stop(&m);
}

/* A release wakes the waiters (the GET_LOCK channel), long before the
 * holder's lease would have run out. */
static void release_wakes_waiters(void)
{
    test_mariadb m;
    char url[256];

    test_mariadb_start(&m);
    for (int named = 0; named < 2; named++) {
        dlock_client *c, *wc[2];
        dlock_lock *a;
        dlock_acquire_options o = test_opts(0, 60000, 0);
        waiter w[2];
        pthread_t t[2];
        uint64_t held;

        if (named)
            named_url(&m, url, sizeof(url));
        else
            snprintf(url, sizeof(url), "%s", m.url);
        c = open_url(url);
        CHECK_RC(dlock_acquire(&a, c, "handoff", &o), DLOCK_OK);
        for (int i = 0; i < 2; i++) {
            wc[i] = open_url(url);
            memset(&w[i], 0, sizeof(w[i]));
            w[i].c = wc[i];
            w[i].name = "handoff";
            CHECK(pthread_create(&t[i], NULL, wait_main, &w[i]) == 0);
        }
        /* Both waiting, each blocked in GET_LOCK on the server (a waiter
         * without a channel to block on would sleep to the expiry). */
        for (int i = 0; i < 500 && test_mariadb_query(&m, "SELECT COUNT(*) FROM"
                                                          " information_schema.PROCESSLIST"
                                                          " WHERE STATE = 'User lock'") < 2;
             i++)
            test_sleep_ms(20);
        CHECK(test_mariadb_query(&m, "SELECT COUNT(*) FROM information_schema.PROCESSLIST"
                                     " WHERE STATE = 'User lock'") == 2);
        CHECK(!atomic_load(&w[0].done) && !atomic_load(&w[1].done));
        held = dlock_lock_fence(a);
        CHECK_RC(dlock_release(a), DLOCK_OK);
        for (int i = 0; i < 2; i++) {
            pthread_join(t[i], NULL);
            CHECK_RC(w[i].rc, DLOCK_OK);
            CHECK(w[i].fence > held);
            dlock_client_free(wc[i]);
        }
        CHECK(w[0].fence != w[1].fence);
        dlock_client_free(c);
    }
    test_mariadb_stop(&m);
}

/* A waiter that gives up (interrupted) leaves no session blocked in
 * GET_LOCK on the server, in both modes: a session left there would be
 * granted the named lock at the holder's release and keep it for a while. */
static void interrupted_waiter_leaves_no_session(void)
{
    test_mariadb m;
    char url[256];

    test_mariadb_start(&m);
    for (int named = 0; named < 2; named++) {
        dlock_client *c, *wc;
        dlock_lock *a;
        dlock_acquire_options o = test_opts(0, 60000, 0);
        test_acquirer w;
        pthread_t t;
        long long blocked = 0;

        if (named)
            named_url(&m, url, sizeof(url));
        else
            snprintf(url, sizeof(url), "%s", m.url);
        c = open_url(url);
        wc = open_url(url);
        CHECK_RC(dlock_acquire(&a, c, "gone", &o), DLOCK_OK);
        test_acquirer_init(&w, wc, "gone", test_opts(50000, 5000, 0));
        CHECK(pthread_create(&t, NULL, test_acquirer_main, &w) == 0);
        for (int i = 0; i < 500 && (blocked = test_mariadb_query(
                                        &m, "SELECT COUNT(*) FROM information_schema.PROCESSLIST"
                                            " WHERE STATE = 'User lock'")) < 1;
             i++)
            test_sleep_ms(20);
        CHECK(blocked == 1);
        dlock_client_interrupt(wc);
        pthread_join(t, NULL);
        CHECK_RC(w.rc, DLOCK_EINTR);
        for (int i = 0; i < 500 && (blocked = test_mariadb_query(
                                        &m, "SELECT COUNT(*) FROM information_schema.PROCESSLIST"
                                            " WHERE STATE = 'User lock'")) > 0;
             i++)
            test_sleep_ms(20);
        CHECK(blocked == 0);
        CHECK_RC(dlock_release(a), DLOCK_OK);
        dlock_client_free(wc);
        dlock_client_free(c);
    }
    test_mariadb_stop(&m);
}

/* ---- names past GET_LOCK's 64 characters ---------------------------------- */

static void long_name_is_hashed(void)
{
    test_mariadb m;
    char url[256], name[301];
    dlock_client *c, *other;
    dlock_lock *a, *b;
    dlock_lock_info info;
    dlock_acquire_options o = test_opts(0, 5000, 0);

    memset(name, 'x', 300);
    name[300] = '\0';
    test_mariadb_start(&m);
    named_url(&m, url, sizeof(url));
    c = open_url(url);
    other = open_url(url);
    CHECK_RC(dlock_acquire(&a, c, name, &o), DLOCK_OK);
    CHECK(test_mariadb_query(&m, "SELECT IS_USED_LOCK(CONCAT('dlock#', LEFT(SHA2("
                                 "CONCAT('dlock:', REPEAT('x', 300)), 256), 58))) IS NOT NULL") ==
          1);
    CHECK_RC(dlock_acquire(&b, other, name, &o), DLOCK_EBUSY);
    /* One character less: another lock. */
    name[299] = '\0';
    CHECK_RC(dlock_acquire(&b, other, name, &o), DLOCK_OK);
    CHECK_RC(dlock_release(b), DLOCK_OK);
    name[299] = 'x';
    CHECK_RC(dlock_status(&info, other, name), DLOCK_OK);
    CHECK(info.held == 1 && info.fence == dlock_lock_fence(a));
    CHECK_RC(dlock_release(a), DLOCK_OK);
    dlock_client_free(c);
    dlock_client_free(other);
    test_mariadb_stop(&m);
}

/* ---- the server restarted under a held lock ------------------------------- */

/* Lease mode: the row and the fence counter survive a kill -9 (InnoDB, a
 * durable commit per acquisition): the holder's renewals go on after the
 * restart, nobody else gets the lock meanwhile, and the next fence is
 * greater. */
static void server_restart_keeps_lease_and_fence(void)
{
    test_mariadb m;
    dlock_client *c, *other;
    dlock_lock *a, *b;
    dlock_acquire_options o = test_opts(0, 20000, 1);
    uint64_t fence;

    test_mariadb_start(&m);
    c = open_url(m.url);
    CHECK_RC(dlock_acquire(&a, c, "durable", &o), DLOCK_OK);
    fence = dlock_lock_fence(a);
    test_mariadb_kill(&m);
    test_mariadb_restart(&m);
    other = open_url(m.url);
    CHECK_RC(dlock_acquire(&b, other, "durable", NULL), DLOCK_EBUSY);
    CHECK_RC(dlock_lock_check(a), DLOCK_OK); /* reconnects */
    CHECK_RC(dlock_release(a), DLOCK_OK);
    CHECK_RC(dlock_acquire(&b, other, "durable", NULL), DLOCK_OK);
    CHECK(dlock_lock_fence(b) > fence);
    CHECK_RC(dlock_release(b), DLOCK_OK);
    dlock_client_free(c);
    dlock_client_free(other);
    test_mariadb_stop(&m);
}

/* ---- bad URLs and credentials ---------------------------------------------- */

static void expect_open(const char *url, int rc, const char *text)
{
    dlock_client *c = (dlock_client *)1;

    CHECK_RC(dlock_client_open(&c, url, NULL), rc);
    CHECK(c == NULL);
    CHECK_CONTAINS(dlock_error_message(), text);
    /* The password never shows. */
    CHECK(strstr(dlock_error_message(), "wrongpw") == NULL);
}

static void bad_url_and_credentials(void)
{
    test_mariadb m;
    char url[300];

    static const struct {
        const char *url; /* %d: the port */
        int rc;
        const char *text;
    } bad[] = {
        {"mysql://dlock:wrongpw@127.0.0.1:%d/dlock_test", DLOCK_EAUTH, "Access denied"},
        {"mysql://dlock:dlockpw@127.0.0.1:%d/nosuchdb", DLOCK_ESERVER, "nosuchdb"},
        {"mysql://dlock:dlockpw@127.0.0.1:%d/", DLOCK_EINVAL, "names no database"},
        {"mysql://dlock:dlockpw@127.0.0.1:%d/dlock_test?mode=advisory", DLOCK_EINVAL,
         "mode must be lease or named"},
        {"mysql://dlock:dlockpw@127.0.0.1:%d/dlock_test?sslmode=require", DLOCK_EINVAL,
         "unknown parameter 'sslmode'"},
        {"mysql://dlock:dlockpw@127.0.0.1:%d/dlock_test?create=maybe", DLOCK_EINVAL,
         "create must be 0 or 1"},
        {"mysql://dlock:dlockpw@127.0.0.1:%d/dlock_test?allow_cleartext=yes", DLOCK_EINVAL,
         "allow_cleartext must be 0 or 1"},
        {"mysql://dlock:dlockpw@127.0.0.1:%d/dlock_test?ssl=true", DLOCK_EINVAL,
         "ssl must be 0 or 1"},
    };

    test_mariadb_start(&m);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(url, sizeof(url), bad[i].url, m.port);
        expect_open(url, bad[i].rc, bad[i].text);
    }
    /* create=0 on a database without the schema. */
    CHECK(test_mariadb_query(&m, "CREATE DATABASE bare") >= 0);
    snprintf(url, sizeof(url), "mysql://dlock:dlockpw@127.0.0.1:%d/bare?create=0", m.port);
    expect_open(url, DLOCK_ESERVER, "docs/mysql.md");
    /* The socket parameter, and the same database by it. */
    snprintf(url, sizeof(url), "mysql://dlock:dlockpw@localhost/dlock_test?socket=%s", m.sock);
    dlock_client_free(open_url(url));
    snprintf(url, sizeof(url), "mariadb://dlock:dlockpw@127.0.0.1:%d/dlock_test", m.port);
    dlock_client_free(open_url(url));
    test_mariadb_stop(&m);
    /* Nobody listening. */
    snprintf(url, sizeof(url), "mysql://dlock:dlockpw@127.0.0.1:%d/dlock_test", m.port);
    expect_open(url, DLOCK_ECONN, "cannot connect");
}

/* ---- the resource side ------------------------------------------------------ */

static MYSQL *root_session(const test_mariadb *m, unsigned long flags)
{
    MYSQL *c = mysql_init(NULL);
    unsigned t = 10;

    mysql_options(c, MYSQL_OPT_READ_TIMEOUT, &t);
    CHECK(mysql_real_connect(c, "localhost", "root", NULL, "dlock_test", 0, m->sock, flags) !=
          NULL);
    return c;
}

/* One integer from a statement on c. */
static long long one(MYSQL *c, const char *sql)
{
    MYSQL_RES *r;
    MYSQL_ROW row;
    long long v = -1;

    if (mysql_query(c, sql) != 0) {
        fprintf(stderr, "%s: %s\n", sql, mysql_error(c));
        exit(1);
    }
    CHECK((r = mysql_store_result(c)) != NULL);
    if ((row = mysql_fetch_row(r)) != NULL && row[0] != NULL)
        v = strtoll(row[0], NULL, 10);
    mysql_free_result(r);
    return v;
}

/* examples/mysql_fence.sql as it stands: the fence row takes fence 17 and
 * its write, refuses the stale fence 16; and SKIP LOCKED gives two workers
 * two different jobs without either waiting. */
static void resource_fence_and_skip_locked(void)
{
    test_mariadb m;
    MYSQL *c, *a, *b;
    FILE *f;
    char *sql;
    long n;

    test_mariadb_start(&m);
    CHECK((f = fopen(DLOCK_SOURCE_DIR "/examples/mysql_fence.sql", "r")) != NULL);
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    rewind(f);
    CHECK((sql = calloc(1, (size_t)n + 1)) != NULL);
    CHECK(fread(sql, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    c = root_session(&m, CLIENT_MULTI_STATEMENTS);
    if (mysql_query(c, sql) != 0) {
        fprintf(stderr, "examples/mysql_fence.sql: %s\n", mysql_error(c));
        exit(1);
    }
    for (int more = 0; more == 0; more = mysql_next_result(c)) {
        MYSQL_RES *r = mysql_store_result(c);
        if (r != NULL)
            mysql_free_result(r);
        CHECK(mysql_errno(c) == 0);
    }
    free(sql);
    CHECK(one(c, "SELECT @stale_accepted") == 0);
    CHECK(one(c, "SELECT @job") == 1);
    CHECK(one(c, "SELECT fence FROM resource_fence WHERE resource = 'payout:42'") == 17);
    CHECK(one(c, "SELECT balance FROM accounts WHERE id = 42") == 900);
    mysql_close(c);

    /* Two workers at once: each gets a job of its own, neither waits (a
     * lock wait would fail after 1 s instead of skipping). */
    a = root_session(&m, 0);
    b = root_session(&m, 0);
    CHECK(mysql_query(a, "SET SESSION innodb_lock_wait_timeout = 1") == 0);
    CHECK(mysql_query(b, "SET SESSION innodb_lock_wait_timeout = 1") == 0);
    CHECK(mysql_query(a, "START TRANSACTION") == 0);
    CHECK(mysql_query(b, "START TRANSACTION") == 0);
    CHECK(one(a, "SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT 1"
                 " FOR UPDATE SKIP LOCKED") == 2);
    CHECK(one(b, "SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT 1"
                 " FOR UPDATE SKIP LOCKED") == 3);
    CHECK(mysql_query(a, "COMMIT") == 0);
    CHECK(mysql_query(b, "COMMIT") == 0);
    mysql_close(a);
    mysql_close(b);
    test_mariadb_stop(&m);
}


/* ---- TLS that cannot be downgraded ----------------------------------------- */

/* Asking for TLS any way makes it required: against a server without TLS
 * (mariadbd started without certificates) every form is refused, where
 * the client library would carry on in clear text. */
static void tls_required_refuses_clear_text(void)
{
    test_mariadb m;
    test_tls t;
    char url[800], ca[200], cert[200], key[200];
    const char *forms[] = {"ssl=1", "ssl-ca=%s", "ssl-capath=%s", "ssl-cert=%s&ssl-key=%s",
                           "ssl-verify=1"};

    test_tls_make(&t);
    snprintf(ca, sizeof(ca), "%s", test_tls_file(&t, "ca.crt"));
    snprintf(cert, sizeof(cert), "%s", test_tls_file(&t, "client.crt"));
    snprintf(key, sizeof(key), "%s", test_tls_file(&t, "client.key"));
    test_mariadb_start(&m);
    CHECK(test_mariadb_query(&m, "SELECT @@have_ssl = 'YES'") == 0);
    for (size_t i = 0; i < sizeof(forms) / sizeof(forms[0]); i++) {
        char q[500];
        dlock_client *c = (dlock_client *)1;
        if (i == 1)
            snprintf(q, sizeof(q), forms[i], ca);
        else if (i == 2)
            snprintf(q, sizeof(q), forms[i], t.dir);
        else if (i == 3)
            snprintf(q, sizeof(q), forms[i], cert, key);
        else
            snprintf(q, sizeof(q), "%s", forms[i]);
        snprintf(url, sizeof(url), "%s?%s", m.url, q);
        CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_ECONN);
        CHECK(c == NULL);
        CHECK_CONTAINS(dlock_error_message(), "TLS was required");
    }
    /* ssl=0 beside a TLS parameter is a contradiction, not clear text. */
    snprintf(url, sizeof(url), "%s?ssl=0&ssl-ca=%s", m.url, ca);
    expect_open(url, DLOCK_EINVAL, "ssl=0");
    /* Without any, clear text as before. */
    dlock_client_free(open_url(m.url));
    test_mariadb_stop(&m);
    test_tls_remove(&t);
}

static long long tls_sessions(test_mariadb *m)
{
    return test_mariadb_query(m, "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS"
                                 " WHERE VARIABLE_NAME = 'SSL_FINISHED_ACCEPTS'");
}

/* A CA given verifies the server's certificate and name: another CA's
 * certificate, and a certificate of the right CA for another name, are
 * refused; the right one gives an encrypted session (the server counts
 * it), and ssl-verify=0 cannot turn the check off. */
static void tls_ca_verifies_server(void)
{
    test_mariadb m, wrong_name;
    test_tls t;
    char url[600], ca[200], other_ca[200];
    long long before;
    dlock_client *c;
    dlock_lock *l;

    test_tls_make(&t);
    snprintf(ca, sizeof(ca), "%s", test_tls_file(&t, "ca.crt"));
    snprintf(other_ca, sizeof(other_ca), "%s", test_tls_file(&t, "other-ca.crt"));
    test_mariadb_start_tls(&m, &t, "server");
    CHECK(test_mariadb_query(&m, "SELECT @@have_ssl = 'YES'") == 1);
    snprintf(url, sizeof(url), "%s?ssl-ca=%s", m.url, other_ca);
    expect_open(url, DLOCK_ECONN, "cannot connect");
    snprintf(url, sizeof(url), "%s?ssl-ca=%s&ssl-verify=0", m.url, ca);
    expect_open(url, DLOCK_EINVAL, "ssl-verify=0");
    before = tls_sessions(&m);
    snprintf(url, sizeof(url), "%s?ssl-ca=%s&mode=named", m.url, ca);
    c = open_url(url);
    CHECK_RC(dlock_acquire(&l, c, "tls", NULL), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    CHECK(tls_sessions(&m) >= before + 2); /* the command and the lock's connection */
    /* ssl=1 alone: encrypted, not verified (docs/mysql.md). */
    before = tls_sessions(&m);
    snprintf(url, sizeof(url), "%s?ssl=1", m.url);
    dlock_client_free(open_url(url));
    CHECK(tls_sessions(&m) == before + 1);
    test_mariadb_stop(&m);
    /* The CA's certificate for another name (dlock-client). */
    test_mariadb_start_tls(&wrong_name, &t, "client");
    snprintf(url, sizeof(url), "%s?ssl-ca=%s", wrong_name.url, ca);
    expect_open(url, DLOCK_ECONN, "cannot connect");
    test_mariadb_stop(&wrong_name);
    test_tls_remove(&t);
}

/* ---- a server that asks for the password in clear text --------------------- */

#define FAKE_PW "Fake-Server-Gets-This-9f3"

/* A fake MySQL server on a loopback port: it greets, reads the client's
 * handshake response, switches authentication to plugin, and keeps every
 * byte the client sends until it closes (or 10 s pass). */
typedef struct {
    const char *plugin;
    int lfd, port;
    char got[8192];
    size_t ngot;
} fake_server;

static void put_packet(int fd, uint8_t seq, const void *payload, size_t len)
{
    uint8_t head[4] = {(uint8_t)len, (uint8_t)(len >> 8), (uint8_t)(len >> 16), seq};

    CHECK(write(fd, head, 4) == 4);
    CHECK(write(fd, payload, len) == (ssize_t)len);
}

/* Bytes the client sends, into f->got, for at most ms; 0 at EOF. */
static ssize_t take(fake_server *f, int fd, int ms)
{
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    ssize_t n;

    if (poll(&pf, 1, ms) <= 0 || f->ngot == sizeof(f->got))
        return -1;
    n = read(fd, f->got + f->ngot, sizeof(f->got) - f->ngot);
    if (n > 0)
        f->ngot += (size_t)n;
    return n;
}

static void *fake_main(void *arg)
{
    fake_server *f = arg;
    static const char version[] = "5.5.5-10.11.0-MariaDB";
    static const char salt[] = "abcdefgh12345678ABCD"; /* 20 bytes */
    uint8_t p[256], sw[128];
    size_t n = 0, m = 0;
    /* As MariaDB 10.11 greets, less CLIENT_SSL: protocol 4.1, plugin auth
     * (bit 0 clear: a MariaDB server). */
    uint32_t caps = 0x0002 | 0x0004 | 0x0008 | 0x0200 | 0x2000 | 0x8000 | 0x00010000 |
                    0x00020000 | 0x00080000 | 0x00200000;
    struct pollfd pf = {.fd = f->lfd, .events = POLLIN};
    int fd;

    if (poll(&pf, 1, 10000) <= 0 || (fd = accept(f->lfd, NULL, NULL)) < 0)
        return NULL;
    p[n++] = 10;
    memcpy(p + n, version, sizeof(version)), n += sizeof(version);
    memcpy(p + n, "\x01\x00\x00\x00", 4), n += 4;
    memcpy(p + n, salt, 8), n += 8;
    p[n++] = 0;
    p[n++] = (uint8_t)caps, p[n++] = (uint8_t)(caps >> 8);
    p[n++] = 45; /* utf8mb4 */
    p[n++] = 2, p[n++] = 0;
    p[n++] = (uint8_t)(caps >> 16), p[n++] = (uint8_t)(caps >> 24);
    p[n++] = 21;
    memset(p + n, 0, 10), n += 10;
    memcpy(p + n, salt + 8, 12), n += 12;
    p[n++] = 0;
    memcpy(p + n, "mysql_native_password", 22), n += 22;
    put_packet(fd, 0, p, n);
    /* The handshake response (a header and its payload). */
    while (f->ngot < 4 || f->ngot < 4 + (size_t)(f->got[0] & 0xff))
        if (take(f, fd, 10000) <= 0)
            goto out;
    sw[m++] = 0xfe;
    memcpy(sw + m, f->plugin, strlen(f->plugin) + 1), m += strlen(f->plugin) + 1;
    memcpy(sw + m, salt, 20), m += 20;
    sw[m++] = 0;
    put_packet(fd, (uint8_t)(f->got[3] + 1), sw, m);
    /* Whatever comes back: the password if the client answers. Then an
     * access-denied error, so that the client ends at once either way. */
    if (take(f, fd, 10000) > 0) {
        static const char err[] = "\xff\x15\x04#28000Access denied";
        put_packet(fd, (uint8_t)(f->got[3] + 3), err, sizeof(err) - 1);
        while (take(f, fd, 10000) > 0) {
        }
    }
out:
    close(fd);
    return NULL;
}

static void fake_start(fake_server *f, pthread_t *t, const char *plugin)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);

    memset(f, 0, sizeof(*f));
    f->plugin = plugin;
    CHECK((f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) >= 0);
    CHECK(bind(f->lfd, (struct sockaddr *)&a, sizeof(a)) == 0);
    CHECK(listen(f->lfd, 1) == 0);
    CHECK(getsockname(f->lfd, (struct sockaddr *)&a, &len) == 0);
    f->port = ntohs(a.sin_port);
    CHECK(pthread_create(t, NULL, fake_main, f) == 0);
}

/* The client never answers a switch to clear-text authentication: the
 * fake server's bytes hold no password, and open says why; with
 * allow_cleartext=1 the same server gets the password (so the check above
 * can fail). A switch to caching_sha2_password (which, without verified
 * TLS, would send the password encrypted to a key the server supplies) is
 * refused alike, but to this machine. */
static void cleartext_auth_switch_refused(void)
{
    /* Cases 0-2 reach the fake server as a host that is not this machine
     * (an IPv4-mapped address is not a loopback name: no man in the middle
     * is ruled out); case 3 as 127.0.0.1, where caching_sha2_password is
     * answered (with its scramble, not the password). */
    for (int allow = 0; allow < 4; allow++) {
        fake_server f;
        pthread_t t;
        char url[300];
        dlock_client *c = (dlock_client *)1;

        fake_start(&f, &t, allow >= 2 ? "caching_sha2_password" : "mysql_clear_password");
        snprintf(url, sizeof(url), "mysql://dlock:" FAKE_PW "@%s:%d/db%s",
                 allow == 3 ? "127.0.0.1" : "[::ffff:127.0.0.1]", f.port,
                 allow == 1 ? "?allow_cleartext=1" : "");
        CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_EAUTH);
        CHECK(c == NULL);
        pthread_join(t, NULL);
        close(f.lfd);
        CHECK(f.ngot > 0); /* it spoke to the fake server */
        CHECK(strstr(dlock_error_message(), FAKE_PW) == NULL);
        if (allow == 1) {
            CHECK(memmem(f.got, f.ngot, FAKE_PW, strlen(FAKE_PW)) != NULL);
            CHECK_CONTAINS(dlock_error_message(), "Access denied");
        } else if (allow == 3) {
            /* Answered: more than the handshake response, no password. */
            CHECK(f.ngot > 4 + (size_t)((uint8_t)f.got[0] | (uint8_t)f.got[1] << 8));
            CHECK(memmem(f.got, f.ngot, FAKE_PW, strlen(FAKE_PW)) == NULL);
            CHECK_CONTAINS(dlock_error_message(), "Access denied");
        } else {
            /* Nothing after its handshake response (a scramble). */
            CHECK(f.ngot == 4 + (size_t)((uint8_t)f.got[0] | (uint8_t)f.got[1] << 8));
            CHECK(memmem(f.got, f.ngot, FAKE_PW, strlen(FAKE_PW)) == NULL);
            CHECK_CONTAINS(dlock_error_message(), "give the password away");
            CHECK_CONTAINS(dlock_error_message(), "allow_cleartext=1");
        }
    }
}

/* ---- key_secret: lock names only the secret's holders can compute --------- */

/* The GET_LOCK name docs/mysql.md gives for key_secret, for clients in
 * other languages: tag ('dlock$' or 'dlckw$') and the first 58 hex digits
 * of HMAC-SHA256(secret, key_prefix + name). */
static void secret_lock_name(char *out, size_t size, const char *tag, const char *secret,
                             const char *key)
{
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned mlen = 0;
    char hex[59];

    CHECK(HMAC(EVP_sha256(), secret, (int)strlen(secret), (const unsigned char *)key,
               strlen(key), mac, &mlen) != NULL);
    for (int i = 0; i < 29; i++)
        snprintf(hex + 2 * i, 3, "%02x", mac[i]);
    snprintf(out, size, "%s%s", tag, hex);
}

/* Named mode with key_secret: two clients with the same secret exclude each
 * other; a raw GET_LOCK on the plain name, or a client without the secret
 * (which takes the plain name), does not block the secret's holders; the
 * lock, and lease mode's wake channel, have the documented HMAC names; and
 * the secret shows in no message. */
static void key_secret_hides_lock_names(void)
{
    test_mariadb m;
    char url[400], bad[400], lockname[80];
    dlock_client *a, *b, *plain;
    dlock_lock *la, *lb, *lp;
    MYSQL *raw;
    dlock_acquire_options o = test_opts(0, 5000, 0);

    test_mariadb_start(&m);
    snprintf(url, sizeof(url), "%s?mode=named&key_secret=Sekrit-Of-The-Team", m.url);
    a = open_url(url);
    b = open_url(url);
    /* Another account's session takes the plain lock name first. */
    raw = root_session(&m, 0);
    CHECK(one(raw, "SELECT GET_LOCK('dlock:guarded', 0)") == 1);
    CHECK_RC(dlock_acquire(&la, a, "guarded", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&lb, b, "guarded", &o), DLOCK_EBUSY);
    secret_lock_name(lockname, sizeof(lockname), "dlock$", "Sekrit-Of-The-Team", "dlock:guarded");
    CHECK(test_mariadb_query(&m, "SELECT IS_USED_LOCK('%s') IS NOT NULL", lockname) == 1);
    /* Neither the name nor the prefix: no GET_LOCK name of ours in clear. */
    CHECK(test_mariadb_query(&m, "SELECT COUNT(*) FROM dlock_named WHERE lockname LIKE"
                                 " '%%guarded%%'") == 0);
    /* Released in so many words: a closed session's locks go a moment
     * later, when the server has torn it down (a try-once acquire raced it). */
    CHECK(one(raw, "SELECT RELEASE_LOCK('dlock:guarded')") == 1);
    mysql_close(raw);
    /* A client without the secret uses the plain name: no exclusion with
     * the secret's holders either way. */
    snprintf(bad, sizeof(bad), "%s?mode=named", m.url);
    plain = open_url(bad);
    CHECK_RC(dlock_acquire(&lp, plain, "guarded", &o), DLOCK_OK);
    CHECK_RC(dlock_release(la), DLOCK_OK);
    CHECK_RC(dlock_acquire(&lb, b, "guarded", &o), DLOCK_OK);
    CHECK_RC(dlock_release(lb), DLOCK_OK);
    CHECK_RC(dlock_release(lp), DLOCK_OK);
    dlock_client_free(plain);
    dlock_client_free(a);
    dlock_client_free(b);
    /* Lease mode: the wake channel a holder keeps is named alike. */
    snprintf(bad, sizeof(bad), "%s?key_secret=Sekrit-Of-The-Team", m.url);
    a = open_url(bad);
    CHECK_RC(dlock_acquire(&la, a, "guarded", &o), DLOCK_OK);
    secret_lock_name(lockname, sizeof(lockname), "dlckw$", "Sekrit-Of-The-Team", "dlock:guarded");
    CHECK(test_mariadb_query(&m, "SELECT IS_USED_LOCK('%s') IS NOT NULL", lockname) == 1);
    CHECK_RC(dlock_release(la), DLOCK_OK);
    dlock_client_free(a);
    /* Never printed: not in a refusal that prints the URL. */
    snprintf(bad, sizeof(bad), "%s?mode=nope&key_secret=Sekrit-Of-The-Team", m.url);
    expect_open(bad, DLOCK_EINVAL, "mode must be");
    CHECK(strstr(dlock_error_message(), "Sekrit") == NULL);
    snprintf(bad, sizeof(bad), "%s?key_secret=", m.url);
    expect_open(bad, DLOCK_EINVAL, "key_secret");
    test_mariadb_stop(&m);
}

TEST_MAIN({"expiry_by_server_clock", expiry_by_server_clock, NULL},
          {"named_killed_connection_loses_lock", named_killed_connection_loses_lock, "watchdog"},
          {"lease_killed_holder_expires", lease_killed_holder_expires, NULL},
          {"same_token_same_fence", same_token_same_fence, NULL},
          {"release_wakes_waiters", release_wakes_waiters, NULL},
          {"channel_taken_after_a_momentary_hold", channel_taken_after_a_momentary_hold, NULL},
          {"holder_without_channel_found_soon", holder_without_channel_found_soon, NULL},
          {"interrupted_waiter_leaves_no_session", interrupted_waiter_leaves_no_session, NULL},
          {"long_name_is_hashed", long_name_is_hashed, NULL},
          {"server_restart_keeps_lease_and_fence", server_restart_keeps_lease_and_fence, NULL},
          {"bad_url_and_credentials", bad_url_and_credentials, NULL},
          {"resource_fence_and_skip_locked", resource_fence_and_skip_locked, NULL},
          {"tls_required_refuses_clear_text", tls_required_refuses_clear_text, "tls"},
          {"tls_ca_verifies_server", tls_ca_verifies_server, "tls"},
          {"cleartext_auth_switch_refused", cleartext_auth_switch_refused, NULL},
          {"key_secret_hides_lock_names", key_secret_hides_lock_names, NULL})
