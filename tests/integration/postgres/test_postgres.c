/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What only the PostgreSQL backend has (docs/postgres.md): expiry by the
 * server's clock, the same token twice (a lost reply), NOTIFY waking a
 * waiter, a session killed from the server (advisory), the lease of a
 * stopped holder's session, the server restarted under a held lock, owner
 * ids, and bad URLs and credentials. Each case starts its own server
 * (tests/support/test_pg.c).
 */
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "dlock/sys/backend.h"
#include "test_pg.h"

extern const dlock_backend *dlock_postgres_backend(void); /* the static twin's table */

static dlock_client *open_url(const char *url)
{
    dlock_client *c = NULL;
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_OK);
    return c;
}

static char *url_with(const test_pg *p, const char *query)
{
    static char buf[4][256];
    static int i;
    char *u = buf[i++ % 4];
    snprintf(u, 256, "%s%s", p->url, query);
    return u;
}

/* The holder's lease ends when the server's clock says so: a row whose
 * expiry is in the past is free to take, whatever the holder believes. */
static void expiry_by_server_clock(void)
{
    test_pg p;
    dlock_client *a, *b;
    dlock_lock *la, *lb;
    dlock_acquire_options o = test_opts(0, 600000, 0);

    test_pg_start(&p);
    a = open_url(p.url);
    b = open_url(p.url);
    CHECK_RC(dlock_acquire(&la, a, "clock", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&lb, b, "clock", &o), DLOCK_EBUSY);
    CHECK(test_pg_query(&p, "UPDATE dlock_locks SET expires = clock_timestamp() - "
                            "interval '1 second' WHERE name = 'dlock:clock'::bytea") == 0);
    CHECK_RC(dlock_acquire(&lb, b, "clock", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(lb) > dlock_lock_fence(la));
    /* The holder still believes its 10 minutes; the server says no. */
    CHECK(!dlock_lock_lost(la));
    CHECK_RC(dlock_lock_check(la), DLOCK_ELOST);
    CHECK_RC(dlock_lock_extend(la, 1000), DLOCK_ELOST);
    CHECK_RC(dlock_release(la), DLOCK_ELOST);
    CHECK_RC(dlock_release(lb), DLOCK_OK);
    dlock_client_free(a);
    dlock_client_free(b);
    test_pg_stop(&p);
}

/* The table called directly: the same token again (a retry after a lost
 * reply) gets the fence already issued; another token is busy with the
 * holder's lease left; the sequence is NO CYCLE. */
static void lost_reply_idempotent(void)
{
    test_pg p;
    dlock_url_host h = {"127.0.0.1", 0};
    dlock_url u;
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_request req;
    dlock_acquire_result r1, r2, r3;
    void *be;

    test_pg_start(&p);
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
    req.kind = DLOCK_KIND_MUTEX;
    req.name = "retry";
    req.token = "0123456789abcdef0123456789abcdef";
    req.lease_ms = 60000;
    memset(&r1, 0, sizeof(r1));
    memset(&r2, 0, sizeof(r2));
    memset(&r3, 0, sizeof(r3));
    CHECK_RC(dlock_postgres_backend()->acquire(be, &req, NULL, &r1), DLOCK_OK);
    CHECK_RC(dlock_postgres_backend()->acquire(be, &req, NULL, &r2), DLOCK_OK);
    CHECK(r1.fence > 0 && r2.fence == r1.fence);
    req.token = "fedcba9876543210fedcba9876543210";
    CHECK_RC(dlock_postgres_backend()->acquire(be, &req, NULL, &r3), DLOCK_EBUSY);
    CHECK(r3.retry_ms > 50000 && r3.retry_ms <= 60000);
    CHECK(test_pg_query(&p, "SELECT count(*) FROM pg_sequences WHERE sequencename = "
                            "'dlock_locks_fence' AND NOT cycle") == 1);
    req.token = "0123456789abcdef0123456789abcdef";
    CHECK_RC(dlock_postgres_backend()->release(be, &req), DLOCK_OK);
    CHECK_RC(dlock_postgres_backend()->release(be, &req), DLOCK_ELOST);
    dlock_postgres_backend()->close(be);
    test_pg_stop(&p);
}

/* A waiter sleeps until the release's NOTIFY: the holder's lease is 10
 * minutes and the waiter waits 5 at most, so only the notification can
 * hand it the lock. Its client has one LISTEN connection. */
static void notify_wakes_waiter(void)
{
    test_pg p;
    dlock_client *a, *b;
    dlock_lock *la;
    dlock_acquire_options o = test_opts(0, 600000, 1);
    test_acquirer w;
    pthread_t t;
    uint64_t first;

    test_pg_start(&p);
    a = open_url(p.url);
    b = open_url(p.url);
    CHECK_RC(dlock_acquire(&la, a, "nt", &o), DLOCK_OK);
    test_acquirer_init(&w, b, "nt", test_opts(300000, 600000, 1));
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &w) == 0);
    for (int i = 0; i < 1000 && test_pg_query(&p, "SELECT count(*) FROM pg_stat_activity "
                                                   "WHERE query LIKE 'LISTEN%%'") == 0; i++)
        test_sleep_ms(20);
    CHECK(test_pg_query(&p, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE "
                            "'LISTEN%%'") == 1);
    test_sleep_ms(200);
    CHECK(!atomic_load(&w.done));
    first = dlock_lock_fence(la);
    CHECK_RC(dlock_release(la), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(w.rc, DLOCK_OK);
    /* Woken by the NOTIFY, not by its own deadline's last try. */
    CHECK(w.took_ms < w.o.wait_ms);
    CHECK(dlock_lock_fence(w.lock) > first);
    CHECK_RC(dlock_release(w.lock), DLOCK_OK);
    dlock_client_free(a);
    dlock_client_free(b);
    test_pg_stop(&p);
}

/* A holder killed with SIGKILL: its row's lease runs out by the server's
 * clock and a waiter takes the lock (no NOTIFY came: the lease bound it). */
static void killed_holder_lease_expires(void)
{
    test_pg p;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(120000, 1000, 1);
    int pid, status, fds[2];
    char byte;

    test_pg_start(&p);
    CHECK(pipe(fds) == 0);
    pid = fork();
    if (pid == 0) {
        dlock_client *h = open_url(p.url);
        dlock_lock *hl;
        CHECK_RC(dlock_acquire(&hl, h, "killed", &o), DLOCK_OK);
        CHECK(write(fds[1], "x", 1) == 1);
        for (;;)
            pause();
    }
    CHECK(read(fds[0], &byte, 1) == 1);
    CHECK(test_pg_query(&p, "SELECT count(*) FROM dlock_locks WHERE tokens IS NOT NULL") == 1);
    kill(pid, SIGKILL);
    CHECK(waitpid(pid, &status, 0) == pid);
    c = open_url(p.url);
    CHECK_RC(dlock_acquire(&l, c, "killed", &o), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    test_pg_stop(&p);
}

/* Owner ids: the same owner re-enters with the same fence (reentrant), is
 * refused without reentrant; another owner waits for the last release. */
static void reentrant_by_owner(void)
{
    test_pg p;
    dlock_client *c;
    dlock_lock *a, *b, *x;
    dlock_acquire_options o = test_opts(0, 30000, 1);
    uint64_t first;

    test_pg_start(&p);
    c = open_url(p.url);
    o.owner = "worker-1";
    o.reentrant = 1;
    CHECK_RC(dlock_acquire(&a, c, "re", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&b, c, "re", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(a) == dlock_lock_fence(b));
    o.reentrant = 0;
    CHECK_RC(dlock_acquire(&x, c, "re", &o), DLOCK_EMISUSE);
    o.owner = "worker-2";
    CHECK_RC(dlock_acquire(&x, c, "re", &o), DLOCK_EBUSY);
    CHECK_RC(dlock_release(a), DLOCK_OK);
    CHECK_RC(dlock_acquire(&x, c, "re", &o), DLOCK_EBUSY);
    CHECK_RC(dlock_lock_check(b), DLOCK_OK);
    first = dlock_lock_fence(b);
    CHECK_RC(dlock_release(b), DLOCK_OK);
    CHECK_RC(dlock_acquire(&x, c, "re", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(x) > first);
    CHECK_RC(dlock_release(x), DLOCK_OK);
    dlock_client_free(c);
    test_pg_stop(&p);
}

/* The server restarted while a lock is held: the row survives (a
 * checkpoint first: the tests run with fsync off), the watchdog connects
 * again and keeps the lock; nobody else gets it. */
static void server_restart_keeps_lock(void)
{
    test_pg p;
    dlock_client *a, *b;
    dlock_lock *la, *lb;
    dlock_acquire_options o = test_opts(0, 3000, 1);
    dlock_stats st = DLOCK_STATS_INIT;

    atomic_store(&test_lost_calls, 0);
    test_pg_start(&p);
    a = open_url(p.url);
    o.on_lost = test_count_lost;
    CHECK_RC(dlock_acquire(&la, a, "rs", &o), DLOCK_OK);
    test_pg_query(&p, "CHECKPOINT");
    test_pg_restart(&p);
    b = open_url(p.url);
    CHECK_RC(dlock_acquire(&lb, b, "rs", &o), DLOCK_EBUSY);
    for (int i = 0; i < 600; i++) {
        CHECK_RC(dlock_client_stats(&st, a), DLOCK_OK);
        if (st.renewals >= 3)
            break;
        test_sleep_ms(50);
    }
    CHECK(st.renewals >= 3);
    CHECK(atomic_load(&test_lost_calls) == 0);
    CHECK_RC(dlock_lock_check(la), DLOCK_OK);
    CHECK_RC(dlock_release(la), DLOCK_OK);
    dlock_client_free(a);
    dlock_client_free(b);
    test_pg_stop(&p);
}

/* Advisory mode: the holder's session terminated from the server
 * (pg_terminate_backend) loses the lock: the watchdog's keepalive finds
 * the session gone and on_lost fires; another client takes the lock. */
static void advisory_killed_session(void)
{
    test_pg p;
    dlock_client *a, *b;
    dlock_lock *la, *lb;
    dlock_acquire_options o = test_opts(0, 900, 1);
    unsigned long long k = test_pg_advisory_key("adv");

    atomic_store(&test_lost_calls, 0);
    test_pg_start(&p);
    a = open_url(url_with(&p, "?mode=advisory"));
    b = open_url(url_with(&p, "?mode=advisory"));
    o.on_lost = test_count_lost;
    CHECK_RC(dlock_acquire(&la, a, "adv", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(la) > 0);
    CHECK_RC(dlock_acquire(&lb, b, "adv", &o), DLOCK_EBUSY);
    CHECK(test_pg_query(&p, "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE "
                            "locktype = 'advisory' AND classid = %u AND objid = %u",
                            (unsigned)(k >> 32), (unsigned)(k & 0xffffffffu)) == 1);
    for (int i = 0; i < 500 && atomic_load(&test_lost_calls) == 0; i++)
        test_sleep_ms(20);
    CHECK(atomic_load(&test_lost_calls) == 1);
    CHECK(atomic_load(&test_lost_reason) == DLOCK_ELOST);
    CHECK_RC(dlock_acquire(&lb, b, "adv", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(lb) > dlock_lock_fence(la)); /* la not released yet */
    CHECK_RC(dlock_release(la), DLOCK_ELOST);
    CHECK_RC(dlock_release(lb), DLOCK_OK);
    /* Owner ids are a lease-mode feature. */
    o.owner = "me";
    CHECK_RC(dlock_acquire(&lb, b, "adv", &o), DLOCK_ENOTSUP);
    CHECK_CONTAINS(dlock_error_message(), "advisory");
    dlock_client_free(a);
    dlock_client_free(b);
    test_pg_stop(&p);
}

/* Advisory mode: a stopped holder's session ends after its lease (the
 * server's idle_session_timeout), and the lock with it. */
static void advisory_stopped_holder(void)
{
    test_pg p;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 600, 0);
    int pid, status;

    test_pg_start(&p);
    pid = fork();
    if (pid == 0) {
        dlock_client *h = open_url(url_with(&p, "?mode=advisory"));
        dlock_lock *hl;
        CHECK_RC(dlock_acquire(&hl, h, "stopped", &o), DLOCK_OK);
        raise(SIGSTOP);
        _exit(0);
    }
    CHECK(waitpid(pid, &status, WUNTRACED) == pid && WIFSTOPPED(status));
    c = open_url(url_with(&p, "?mode=advisory"));
    o.wait_ms = 60000;
    CHECK_RC(dlock_acquire(&l, c, "stopped", &o), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    dlock_client_free(c);
    test_pg_stop(&p);
}

/* What the holder's session was last told its idle_session_timeout is,
 * read from its last statement in pg_stat_activity (0: none): the
 * acquire's set_config('idle_session_timeout', 'N', ...) or the renewal's
 * SET idle_session_timeout = N. */
static long long told_timeout(test_pg *p)
{
    return test_pg_query(p, "SELECT max(substring(query from "
                            "'idle_session_timeout[ ='', ]+([0-9]+)')::bigint) FROM "
                            "pg_stat_activity WHERE pid <> pg_backend_pid()");
}

/* Advisory mode: the lease is the session's idle_session_timeout, which the
 * server takes up to 2^31-1 ms. A longer lease (up to dlock's 30 days) is
 * refused by acquire and extend, rather than believed for longer than the
 * server keeps the session; the handle's validity never exceeds what the
 * session was told. */
static void advisory_lease_within_server_cap(void)
{
    test_pg p;
    dlock_client *c;
    dlock_lock *l = NULL;
    dlock_acquire_options o = test_opts(0, 2592000000LL, 0);

    test_pg_start(&p);
    c = open_url(url_with(&p, "?mode=advisory"));
    CHECK_RC(dlock_acquire(&l, c, "cap", &o), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "lease_ms is 2592000000, over 2147483647, the "
                                          "longest idle_session_timeout");
    CHECK(l == NULL);
    o.lease_ms = 2147483648LL;
    CHECK_RC(dlock_acquire(&l, c, "cap", &o), DLOCK_EINVAL);
    CHECK(l == NULL);
    o.lease_ms = 2147483647LL;
    CHECK_RC(dlock_acquire(&l, c, "cap", &o), DLOCK_OK);
    CHECK(told_timeout(&p) == 2147483647LL);
    CHECK(dlock_lock_valid_ms(l) <= told_timeout(&p));
    CHECK_RC(dlock_lock_extend(l, 2592000000LL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "mode=lease takes leases up to 30 days");
    CHECK(dlock_lock_valid_ms(l) <= 2147483647LL);
    CHECK_RC(dlock_lock_extend(l, 5000), DLOCK_OK);
    CHECK(told_timeout(&p) == 5000);
    CHECK(dlock_lock_valid_ms(l) <= 5000);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    test_pg_stop(&p);
}

static void open_fails(const char *url, int want, const char *text)
{
    dlock_client *c = NULL;

    CHECK_RC(dlock_client_open(&c, url, NULL), want);
    CHECK(c == NULL);
    CHECK_CONTAINS(dlock_error_message(), text);
    CHECK(strstr(dlock_error_message(), "s3cret") == NULL);
    CHECK(strstr(dlock_error_message(), "wrong") == NULL);
}

static void bad_url_and_credentials(void)
{
    test_pg p;
    char u[256];
    dlock_client *c;

    test_pg_start(&p);
    open_fails(url_with(&p, "?mode=bogus"), DLOCK_EINVAL, "mode must be lease or advisory");
    open_fails(url_with(&p, "?create=2"), DLOCK_EINVAL, "create must be 0 or 1");
    open_fails(url_with(&p, "?table=Bad-Name"), DLOCK_EINVAL, "table must be");
    open_fails(url_with(&p, "?colour=red"), DLOCK_EINVAL, "unknown parameter 'colour'");
    open_fails(url_with(&p, "?sslmode=sometimes"), DLOCK_EINVAL, "sslmode");
    /* create=0 on a database without the table names it. */
    open_fails(url_with(&p, "?create=0&table=mine"), DLOCK_ESERVER,
               "mine_fence does not exist, and create=0");
    snprintf(u, sizeof(u), "postgres://secret:wrong@127.0.0.1:%d/postgres", p.port);
    open_fails(u, DLOCK_EAUTH, "password authentication failed");
    snprintf(u, sizeof(u), "postgres://secret:s3cret@127.0.0.1:%d/nosuchdb", p.port);
    open_fails(u, DLOCK_ESERVER, "nosuchdb");
    snprintf(u, sizeof(u), "postgresql://secret:s3cret@127.0.0.1:%d/postgres?sslmode=disable",
             p.port);
    c = open_url(u);
    CHECK(strcmp(dlock_client_backend(c), "postgres") == 0);
    dlock_client_free(c);
    /* After the tables exist, create=0 is happy. */
    c = open_url(url_with(&p, "?create=0"));
    dlock_client_free(c);
    test_pg_stop(&p);
    /* Nobody listens there now. */
    open_fails(p.url, DLOCK_ECONN, "127.0.0.1");
}

/* ---- passwords and TLS (pg.c, secure_transport) -------------------------- */

/* URL of p as user:password at host HOST (reached at 127.0.0.1 through
 * hostaddr, so that no name is looked up), then query. */
static char *remote_url(const test_pg *p, const char *userpass, const char *host,
                        const char *query)
{
    static char buf[4][512];
    static int i;
    char *u = buf[i++ % 4];
    snprintf(u, 512, "postgres://%s@%s:%d/postgres?hostaddr=127.0.0.1%s", userpass, host,
             p->port, query);
    return u;
}

/* Sessions of user from dlock (application_name dlock) with and without TLS. */
static long long sessions(test_pg *p, const char *user, int ssl)
{
    return test_pg_query(p,
                         "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)"
                         " WHERE a.usename = '%s' AND a.application_name = 'dlock' AND s.ssl = %s",
                         user, ssl ? "true" : "false");
}

/* A password to a host that is not loopback never goes where a man in the
 * middle could read it. The server has no TLS: a password (or a client
 * certificate) asks for verify-full, so the open fails where libpq's
 * default (prefer) went on in clear text; an sslmode below verify-ca is
 * refused before any I/O (a port where nothing listens answers EINVAL, not
 * ECONN) unless insecure_auth=1; the host that counts is hostaddr's too.
 * Loopback URLs keep working without TLS. */
static void password_needs_verified_tls(void)
{
    test_pg p;
    char closed[256];
    dlock_client *c;

    test_pg_start(&p);
    open_fails(remote_url(&p, "secret:s3cret", "db.example", ""), DLOCK_ECONN,
               "sslmode=verify-full");
    open_fails(remote_url(&p, "clear:c1ear", "db.example", ""), DLOCK_ECONN, "SSL");
    open_fails(remote_url(&p, "dlock", "db.example", "&sslcert=/nonexistent/client.crt"),
               DLOCK_ECONN, "sslmode=verify-full");
    CHECK(strstr(dlock_error_message(), "c1ear") == NULL);
    for (int i = 0; i < 4; i++) {
        static const char *const weak[] = {"disable", "allow", "prefer", "require"};
        char q[64], want[64];
        snprintf(q, sizeof(q), "&sslmode=%s", weak[i]);
        snprintf(want, sizeof(want), "a password with sslmode=%s", weak[i]);
        open_fails(remote_url(&p, "clear:c1ear", "db.example", q), DLOCK_EINVAL, want);
        CHECK_CONTAINS(dlock_error_message(), "insecure_auth=1");
    }
    snprintf(closed, sizeof(closed),
             "postgres://secret:s3cret@db.example:1/postgres?hostaddr=127.0.0.1&sslmode=prefer");
    open_fails(closed, DLOCK_EINVAL, "sslmode=prefer");
    /* What counts as this machine: no I/O before the refusal, ECONN after. */
    open_fails("postgres://secret:s3cret@10.0.0.1:1/postgres?sslmode=prefer", DLOCK_EINVAL,
               "sslmode=prefer");
    open_fails("postgres://secret:s3cret@localhost.example:1/postgres?sslmode=prefer",
               DLOCK_EINVAL, "sslmode=prefer");
    open_fails("postgres://secret:s3cret@[::1]:1/postgres?sslmode=prefer", DLOCK_ECONN, "::1");
    open_fails("postgres://secret:s3cret@127.1.2.3:1/postgres?sslmode=prefer", DLOCK_ECONN,
               "127.1.2.3");
    open_fails("postgres://secret:s3cret@LocalHost:1/postgres?sslmode=prefer", DLOCK_ECONN,
               "LocalHost");
    /* hostaddr decides where the password goes, whatever host says. */
    snprintf(closed, sizeof(closed),
             "postgres://secret:s3cret@localhost:1/postgres?hostaddr=192.0.2.1&sslmode=prefer");
    open_fails(closed, DLOCK_EINVAL, "sslmode=prefer");
    snprintf(closed, sizeof(closed),
             "postgres://secret:s3cret@/postgres?host=db.example&hostaddr=127.0.0.1&port=1"
             "&sslmode=disable");
    open_fails(closed, DLOCK_EINVAL, "sslmode=disable");
    open_fails(remote_url(&p, "clear:c1ear", "db.example", "&sslmode=prefer&insecure_auth=2"),
               DLOCK_EINVAL, "insecure_auth= is 0 or 1");
    /* PGPASSWORD is a password too. */
    setenv("PGPASSWORD", "c1ear", 1);
    open_fails(remote_url(&p, "clear", "db.example", "&sslmode=prefer"), DLOCK_EINVAL,
               "sslmode=prefer");
    unsetenv("PGPASSWORD");
    /* Said on purpose: the password goes in clear text. */
    c = open_url(remote_url(&p, "clear:c1ear", "db.example", "&sslmode=prefer&insecure_auth=1"));
    CHECK(sessions(&p, "clear", 0) > 0);
    dlock_client_free(c);
    /* This machine: libpq's defaults, as before. */
    snprintf(closed, sizeof(closed), "postgres://clear:c1ear@127.0.0.1:%d/postgres", p.port);
    dlock_client_free(open_url(closed));
    snprintf(closed, sizeof(closed),
             "postgres://secret:s3cret@localhost:%d/postgres?sslmode=prefer", p.port);
    dlock_client_free(open_url(closed));
    snprintf(closed, sizeof(closed),
             "postgres://secret:s3cret@/postgres?host=localhost,127.0.0.1"
             "&hostaddr=127.0.0.2,127.0.0.1&port=%d,%d",
             p.port, p.port);
    dlock_client_free(open_url(closed));
    test_pg_stop(&p);
}

/* Against a server with TLS whose certificate is for db.example: with a
 * password and no sslmode, the server's certificate and name are verified
 * (verify-full) and the sessions use TLS; another name or another CA is
 * refused, where libpq's default went on. */
static void password_over_verified_tls(void)
{
    test_tls t;
    test_pg p;
    char q[256];
    dlock_client *c;

    test_tls_make(&t);
    test_pg_start_tls(&p, &t);
    snprintf(q, sizeof(q), "&sslrootcert=%s", test_tls_file(&t, "ca.crt"));
    c = open_url(remote_url(&p, "secret:s3cret", "db.example", q));
    CHECK(sessions(&p, "secret", 1) > 0 && sessions(&p, "secret", 0) == 0);
    dlock_client_free(c);
    open_fails(remote_url(&p, "secret:s3cret", "other.example", q), DLOCK_EAUTH,
               "does not match host name");
    CHECK_CONTAINS(dlock_error_message(), "verify-full");
    snprintf(q, sizeof(q), "&sslrootcert=%s", test_tls_file(&t, "other-ca.crt"));
    open_fails(remote_url(&p, "secret:s3cret", "db.example", q), DLOCK_EAUTH,
               "certificate verify failed");
    /* No CA at all (no sslrootcert=, no ~/.postgresql/root.crt): bad input. */
    snprintf(q, sizeof(q), "&sslrootcert=%s/none.crt", t.dir);
    open_fails(remote_url(&p, "secret:s3cret", "db.example", q), DLOCK_EINVAL,
               "root certificate file");
    test_pg_stop(&p);
    test_tls_remove(&t);
}

/* Over TLS a password is answered only to SCRAM bound to the channel
 * (channel_binding=require): a server that asks for it in clear text (user
 * clear: pg_hba's "password") is refused before the password is sent, where
 * libpq's default sent it; SCRAM works; channel_binding=prefer in the URL
 * allows the clear-text one. */
static void password_only_to_channel_bound_scram(void)
{
    test_tls t;
    test_pg p;
    char q[256], q2[300];
    dlock_client *c;

    test_tls_make(&t);
    test_pg_start_tls(&p, &t);
    snprintf(q, sizeof(q), "&sslrootcert=%s", test_tls_file(&t, "ca.crt"));
    open_fails(remote_url(&p, "clear:c1ear", "db.example", q), DLOCK_EAUTH, "channel binding");
    CHECK_CONTAINS(dlock_error_message(), "channel_binding=prefer");
    c = open_url(remote_url(&p, "secret:s3cret", "db.example", q));
    dlock_client_free(c);
    snprintf(q2, sizeof(q2), "%s&channel_binding=prefer", q);
    c = open_url(remote_url(&p, "clear:c1ear", "db.example", q2));
    CHECK(sessions(&p, "clear", 1) > 0);
    dlock_client_free(c);
    /* Loopback keeps libpq's defaults (channel_binding=prefer). */
    snprintf(q2, sizeof(q2), "postgres://clear:c1ear@127.0.0.1:%d/postgres", p.port);
    dlock_client_free(open_url(q2));
    test_pg_stop(&p);
    test_tls_remove(&t);
}

/* ---- key_secret (advisory mode) ----------------------------------------- */

/* Any account can take pg_advisory_lock(KEY) (no grant needed) and so block
 * a name whose key it can compute. With key_secret the key is an HMAC:
 * holders of the secret exclude each other, a raw lock on the plain key
 * and a client without the secret do not block them. */
#define RAW_ALIVE "SELECT count(*) FROM pg_stat_activity WHERE pid = %d"

static void advisory_key_secret(void)
{
    test_pg p;
    dlock_client *a, *b, *plain;
    dlock_lock *la, *lb, *lp;
    dlock_acquire_options o = test_opts(0, 60000, 0);
    PGconn *raw;
    PGresult *r;
    char sql[128];
    int pid;

    test_pg_start(&p);
    a = open_url(url_with(&p, "?mode=advisory&key_secret=t0psecret"));
    b = open_url(url_with(&p, "?mode=advisory&key_secret=t0psecret"));
    plain = open_url(url_with(&p, "?mode=advisory"));
    /* The attack: a session of any account holds the name's plain key. */
    raw = PQconnectdb(p.url);
    CHECK(PQstatus(raw) == CONNECTION_OK);
    snprintf(sql, sizeof(sql), "SELECT pg_advisory_lock(%lld)",
             (long long)test_pg_advisory_key("job"));
    r = PQexec(raw, sql);
    CHECK(PQresultStatus(r) == PGRES_TUPLES_OK);
    PQclear(r);
    CHECK_RC(dlock_acquire(&lp, plain, "job", &o), DLOCK_EBUSY);
    /* The secret's holders are not blocked, and exclude each other. */
    CHECK_RC(dlock_acquire(&la, a, "job", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&lb, b, "job", &o), DLOCK_EBUSY);
    pid = PQbackendPID(raw);
    PQfinish(raw);
    /* The server lets go of raw's lock when its backend has exited, a
     * moment after the close: the next acquire, on a session kept from the
     * try above, can be quicker than that. */
    for (int i = 0; i < 500 && test_pg_query(&p, RAW_ALIVE, pid) != 0; i++)
        test_sleep_ms(10);
    CHECK(test_pg_query(&p, RAW_ALIVE, pid) == 0);
    /* Nor does a client without the secret block them, or they it. */
    CHECK_RC(dlock_acquire(&lp, plain, "job", &o), DLOCK_OK);
    CHECK_RC(dlock_release(la), DLOCK_OK);
    CHECK_RC(dlock_acquire(&lb, b, "job", &o), DLOCK_OK);
    CHECK_RC(dlock_release(lb), DLOCK_OK);
    CHECK_RC(dlock_release(lp), DLOCK_OK);
    dlock_client_free(a);
    dlock_client_free(b);
    dlock_client_free(plain);
    open_fails(url_with(&p, "?key_secret=t0psecret"), DLOCK_EINVAL, "key_secret= is for "
                                                                    "mode=advisory");
    CHECK(strstr(dlock_error_message(), "t0psecret") == NULL);
    open_fails(url_with(&p, "?mode=advisory&key_secret="), DLOCK_EINVAL, "key_secret= is empty");
    test_pg_stop(&p);
}

TEST_MAIN({"expiry_by_server_clock", expiry_by_server_clock, NULL},
          {"lost_reply_idempotent", lost_reply_idempotent, NULL},
          {"notify_wakes_waiter", notify_wakes_waiter, "watchdog"},
          {"killed_holder_lease_expires", killed_holder_lease_expires, NULL},
          {"reentrant_by_owner", reentrant_by_owner, NULL},
          {"server_restart_keeps_lock", server_restart_keeps_lock, "watchdog"},
          {"advisory_killed_session", advisory_killed_session, "watchdog"},
          {"advisory_stopped_holder", advisory_stopped_holder, NULL},
          {"advisory_lease_within_server_cap", advisory_lease_within_server_cap, NULL},
          {"bad_url_and_credentials", bad_url_and_credentials, NULL},
          {"password_needs_verified_tls", password_needs_verified_tls, NULL},
          {"password_over_verified_tls", password_over_verified_tls, NULL},
          {"password_only_to_channel_bound_scram", password_only_to_channel_bound_scram, NULL},
          {"advisory_key_secret", advisory_key_secret, NULL})
