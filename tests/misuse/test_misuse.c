/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Bad input and misuse, each case a row of docs/errors.md: what the caller
 * gets (code and message) for inputs and situations the library must survive.
 * Cases already covered by tests/unit and tests/integration/redis are not
 * repeated here; docs/errors.md points at them.
 *
 * Servers are real throwaway redis-servers (tests/support), except the
 * fake_server, whose whole point is to answer what no Redis would.
 */
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dlock/sys/backend.h"
#include "fake_server.h"
#include "test.h"

/* A password that cannot turn up in a message by accident. */
#define SECRET "Zq7-s3cr3t-Pw"

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static dlock_client_options short_timeouts(int64_t ms)
{
    dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;

    o.connect_timeout_ms = ms;
    o.command_timeout_ms = ms;
    return o;
}

static dlock_client *open_url(const char *url)
{
    dlock_client *c = NULL;

    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_OK);
    return c;
}

/* The message of the last failure names a cause: not empty, not a bare
 * "error", and never the password. */
#define CHECK_MESSAGE_CLEAN()                                                                      \
    do {                                                                                           \
        const char *m_ = dlock_error_message();                                                    \
        CHECK(m_[0] != '\0');                                                                      \
        CHECK(strcmp(m_, "error") != 0);                                                           \
        CHECK(strstr(m_, SECRET) == NULL);                                                         \
        CHECK(strstr(m_, "s3cr3t") == NULL);                                                       \
    } while (0)

/* Run one command on the server as the default user, argv-style (no
 * splitting on spaces); exits on an error reply unless allow_error. */
static void admin(test_redis *r, int allow_error, int argc, const char **argv)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    redisReply *rep;

    CHECK(c != NULL && c->err == 0);
    rep = redisCommandArgv(c, argc, argv, NULL);
    CHECK(rep != NULL);
    if (rep->type == REDIS_REPLY_ERROR && !allow_error) {
        fprintf(stderr, "admin %s: %s\n", argv[0], rep->str);
        exit(1);
    }
    freeReplyObject(rep);
    redisFree(c);
}

static void acl_setuser(test_redis *r, const char *user, const char *pass, const char *rules)
{
    test_acl_setuser(r, user, pass, rules);
}

/* ---------------------------------------------------------------------- */
/* Names */

static void names_huge_and_binary(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *l = (dlock_lock *)1, *a, *b, *d;
    dlock_lock_info info;
    dlock_acquire_options o = test_opts(0, 5000, 0);
    size_t huge = 1 << 20;
    char *name = malloc(huge + 1), chunk[256];
    long long before;

    CHECK(name != NULL);
    test_redis_start(&r, NULL);
    c = open_url(r.url);

    /* 1 MiB name: refused before any network call, for every call taking a
     * name, and the length scan stops at the limit. */
    memset(name, 'n', huge);
    name[huge] = '\0';
    before = test_redis_calls(&r, "evalsha") + test_redis_calls(&r, "eval");
    CHECK_RC(dlock_acquire(&l, c, name, &o), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "longer than 512 bytes");
    CHECK(l == NULL);
    CHECK_RC(dlock_status(&info, c, name), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "longer than 512 bytes");
    CHECK_RC(dlock_force_release(&info, c, name), DLOCK_EINVAL);
    CHECK(test_redis_calls(&r, "evalsha") + test_redis_calls(&r, "eval") == before);
    free(name);

    /* Every byte value but NUL, in names: each is its own lock. */
    for (int start = 1; start < 256; start += 255 / 3) {
        int n = 0;
        for (int ch = start; ch < start + 255 / 3 && ch < 256; ch++)
            chunk[n++] = (char)ch;
        chunk[n] = '\0';
        CHECK_RC(dlock_acquire(&a, c, chunk, &o), DLOCK_OK);
        CHECK(strcmp(dlock_lock_name(a), chunk) == 0);
        CHECK_RC(dlock_status(&info, c, chunk), DLOCK_OK);
        CHECK(info.held == 1 && info.fence == 1);
        CHECK_RC(dlock_release(a), DLOCK_OK);
    }

    /* Names built to collide with another lock's keys or channel do not:
     * "job}:fence" is not the fence counter of "job", "*" is not a pattern. */
    CHECK_RC(dlock_acquire(&a, c, "job", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&b, c, "job}:fence", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&d, c, "job}", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(a) == 1 && dlock_lock_fence(b) == 1 && dlock_lock_fence(d) == 1);
    CHECK_RC(dlock_release(b), DLOCK_OK);
    CHECK_RC(dlock_release(d), DLOCK_OK);
    CHECK_RC(dlock_lock_check(a), DLOCK_OK);
    CHECK_RC(dlock_release(a), DLOCK_OK);
    CHECK_RC(dlock_acquire(&a, c, "*", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&b, c, "?", &o), DLOCK_OK);
    CHECK_RC(dlock_release(a), DLOCK_OK);
    CHECK_RC(dlock_lock_check(b), DLOCK_OK);
    CHECK_RC(dlock_release(b), DLOCK_OK);
    CHECK_RC(dlock_status(&info, c, "job"), DLOCK_OK);
    CHECK(info.held == 0 && info.fence == 1);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* ---------------------------------------------------------------------- */
/* Leases and waits */

static void absurd_leases_and_waits(void)
{
    static const int64_t bad_leases[] = {INT64_MIN, -1, DLOCK_LEASE_MAX_MS * 1000, INT64_MAX};
    static const int64_t bad_waits[] = {INT64_MIN, -3, DLOCK_LEASE_MAX_MS + 1, INT64_MAX};
    test_redis r;
    dlock_client *c;
    dlock_lock *l = NULL, *t;
    dlock_acquire_options o;
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    char prefix[200];
    long long scripts, subscribes;

    test_redis_start(&r, NULL);
    c = open_url(r.url);
    for (size_t i = 0; i < sizeof(bad_leases) / sizeof(bad_leases[0]); i++) {
        o = test_opts(0, bad_leases[i], 1);
        CHECK_RC(dlock_acquire(&l, c, "absurd", &o), DLOCK_EINVAL);
        CHECK_CONTAINS(dlock_error_message(), "lease_ms");
    }
    for (size_t i = 0; i < sizeof(bad_waits) / sizeof(bad_waits[0]); i++) {
        o = test_opts(bad_waits[i], 1000, 1);
        CHECK_RC(dlock_acquire(&l, c, "absurd", &o), DLOCK_EINVAL);
        CHECK_CONTAINS(dlock_error_message(), "wait_ms");
    }
    CHECK(l == NULL);

    /* The largest lease and wait are accepted and reach the server as is. */
    o = test_opts(DLOCK_LEASE_MAX_MS, DLOCK_LEASE_MAX_MS, 1);
    CHECK_RC(dlock_acquire(&l, c, "absurd", &o), DLOCK_OK);
    CHECK(test_redis_cmd(&r, "PTTL dlock:{absurd}") > DLOCK_LEASE_MAX_MS - 60000);
    CHECK_RC(dlock_lock_extend(l, 0), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "lease_ms");
    CHECK_RC(dlock_lock_extend(l, INT64_MIN), DLOCK_EINVAL);
    CHECK_RC(dlock_lock_extend(l, INT64_MAX), DLOCK_EINVAL);
    CHECK_RC(dlock_lock_extend(l, DLOCK_LEASE_MAX_MS), DLOCK_OK);
    /* A waiter with the longest wait still times out only when told: a
     * try-once on the held lock answers after one try, without waiting
     * (no subscription, no second try). */
    scripts = test_redis_calls(&r, "evalsha") + test_redis_calls(&r, "eval");
    subscribes = test_redis_calls(&r, "subscribe");
    o = test_opts(0, 1000, 1);
    CHECK_RC(dlock_acquire(&t, c, "absurd", &o), DLOCK_EBUSY);
    CHECK(test_redis_calls(&r, "evalsha") + test_redis_calls(&r, "eval") - scripts == 1);
    CHECK(test_redis_calls(&r, "subscribe") == subscribes);
    CHECK_RC(dlock_release(l), DLOCK_OK);

    /* A 1 ms lease, renewed: it cannot be kept over a real network round
     * trip; it is lost, on_lost says so once, release says ELOST. Nothing
     * hangs. */
    atomic_store(&test_lost_calls, 0);
    o = test_opts(0, 1, 1);
    o.on_lost = test_count_lost;
    CHECK_RC(dlock_acquire(&l, c, "tiny", &o), DLOCK_OK);
    for (int i = 0; i < 200 && atomic_load(&test_lost_calls) == 0; i++)
        test_sleep_ms(10);
    CHECK(atomic_load(&test_lost_calls) == 1);
    CHECK(dlock_lock_lost(l));
    CHECK_RC(dlock_release(l), DLOCK_ELOST);
    dlock_client_free(c);

    /* Client options out of range. */
    co.connect_timeout_ms = INT64_MAX;
    CHECK_RC(dlock_client_open(&c, r.url, &co), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "connect_timeout_ms");
    co.connect_timeout_ms = -1;
    CHECK_RC(dlock_client_open(&c, r.url, &co), DLOCK_EINVAL);
    co = (dlock_client_options)DLOCK_CLIENT_OPTIONS_INIT;
    memset(prefix, 'p', sizeof(prefix) - 1);
    prefix[sizeof(prefix) - 1] = '\0';
    co.key_prefix = prefix;
    CHECK_RC(dlock_client_open(&c, r.url, &co), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "key_prefix");
    co.key_prefix = NULL;
    co.client_name = "";
    CHECK_RC(dlock_client_open(&c, r.url, &co), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "client_name");
    test_redis_stop(&r);
}

/* ---------------------------------------------------------------------- */
/* Credentials */

static void expect_open_fails(const char *url, int want, const dlock_client_options *co)
{
    dlock_client *c = (dlock_client *)1;
    int rc = dlock_client_open(&c, url, co);

    if (rc != want) {
        fprintf(stderr, "open of a URL with a password gave %d (%s), wanted %d: %s\n", rc,
                dlock_strerror(rc), want, dlock_error_message());
        exit(1);
    }
    CHECK(c == NULL);
    CHECK_MESSAGE_CLEAN();
}

static void credentials_never_in_messages(void)
{
    test_redis plain, guarded;
    dlock_client_options co = short_timeouts(500);
    dlock_client *c;
    dlock_lock *l;
    dlock_lock_info info;
    dlock_acquire_options o = test_opts(0, 300, 1);
    char url[256];

    /* Refused by the parser or the backend, before any I/O. */
    expect_open_fails("memcached://u:" SECRET "@h", DLOCK_EINVAL, NULL);
    expect_open_fails("rediss://u:" SECRET "@h:6380?cert=/c.pem", DLOCK_EINVAL, NULL);
    expect_open_fails("redis://u:" SECRET "@h:99999", DLOCK_EINVAL, NULL);
    expect_open_fails("redis://u:" SECRET "@h?timeout=1", DLOCK_EINVAL, NULL);
    expect_open_fails("redis://u:" SECRET "@h/db9", DLOCK_EINVAL, NULL);
    expect_open_fails("redis://u:" SECRET "@a,b", DLOCK_EINVAL, NULL);
    expect_open_fails("redis://u:Zq7%2Ds3cr3t%2DPw%zz@h", DLOCK_EINVAL, NULL);
    expect_open_fails("redis://u:Zq7%2Ds3cr3t%2DPw@ho$t", DLOCK_EINVAL, NULL);
    /* Secrets in the query (issue 26, item 8): the URL these messages show
     * has "***" for each. */
    expect_open_fails("zk://h?session_timeout_ms=5&password=" SECRET, DLOCK_EINVAL, NULL);
    CHECK_CONTAINS(dlock_error_message(), "password=***");
    expect_open_fails("zk://h?sentinel_password=" SECRET "&session_timeout_ms=5", DLOCK_EINVAL,
                      NULL);
    expect_open_fails("zk://h?sslpassword=" SECRET "&key_secret=" SECRET "&session_timeout_ms=5",
                      DLOCK_EINVAL, NULL);
    /* Refused by the network. */
    expect_open_fails("redis://u:" SECRET "@127.0.0.1:1", DLOCK_ECONN, &co);
    expect_open_fails("unix://:" SECRET "@/nonexistent/redis.sock", DLOCK_ECONN, &co);

    /* Refused by the server: no password set, or another one. (A wrong
     * requirepass password is in test_redis auth_and_db_and_unix.) */
    test_redis_start(&plain, NULL);
    snprintf(url, sizeof(url), "redis://:" SECRET "@127.0.0.1:%d", plain.port);
    expect_open_fails(url, DLOCK_EAUTH, &co);
    CHECK_CONTAINS(dlock_error_message(), "no password set");
    snprintf(url, sizeof(url), "redis://nobody:" SECRET "@127.0.0.1:%d", plain.port);
    expect_open_fails(url, DLOCK_EAUTH, &co);

    /* Failures of a connected client, and the text on_lost leaves behind. */
    test_redis_start(&guarded, "--requirepass " SECRET);
    snprintf(url, sizeof(url), "redis://:" SECRET "@127.0.0.1:%d/2", guarded.port);
    CHECK_RC(dlock_client_open(&c, url, &co), DLOCK_OK);
    atomic_store(&test_lost_calls, 0);
    o.on_lost = test_count_lost;
    CHECK_RC(dlock_acquire(&l, c, "guarded", &o), DLOCK_OK);
    test_redis_kill(&guarded);
    CHECK_RC(dlock_status(&info, c, "guarded"), DLOCK_ECONN);
    CHECK_MESSAGE_CLEAN();
    CHECK_RC(dlock_lock_check(l), DLOCK_ECONN);
    CHECK_MESSAGE_CLEAN();
    for (int i = 0; i < 300 && atomic_load(&test_lost_calls) == 0; i++)
        test_sleep_ms(10);
    CHECK(atomic_load(&test_lost_calls) == 1);
    test_redis_restart(&guarded);
    CHECK_RC(dlock_release(l), DLOCK_ELOST); /* carries the on_lost text */
    CHECK_MESSAGE_CLEAN();
    dlock_client_free(c);
    test_redis_stop(&guarded);
    test_redis_stop(&plain);
}

/*
 * A server that does not know AUTH (renamed away, an older or a Redis-like
 * server, a proxy) answers "ERR unknown command 'AUTH', with args beginning
 * with: 'user' 'password'". The password must not reach the message.
 */
static void password_echoed_by_server_is_hidden(void)
{
    static const char *const echo[] = {FAKE_ECHO, FAKE_ECHO, FAKE_ECHO, NULL};
    test_redis r;
    fake_server f;
    dlock_client_options co = short_timeouts(1000);
    dlock_client *c = NULL;
    char url[256];
    int rc;

    test_redis_start(&r, "--rename-command AUTH \"\"");
    snprintf(url, sizeof(url), "redis://dlock:" SECRET "@127.0.0.1:%d", r.port);
    rc = dlock_client_open(&c, url, &co);
    fprintf(stderr, "renamed AUTH: %d (%s): %s\n", rc, dlock_strerror(rc), dlock_error_message());
    CHECK(rc == DLOCK_EAUTH);
    CHECK_MESSAGE_CLEAN();
    test_redis_stop(&r);

    memset(&f, 0, sizeof(f));
    f.scripts[0] = echo;
    f.nscripts = 1;
    fake_start(&f);
    snprintf(url, sizeof(url), "redis://:" SECRET "@127.0.0.1:%d", f.port);
    rc = dlock_client_open(&c, url, &co);
    fprintf(stderr, "echoing server: %d (%s): %s\n", rc, dlock_strerror(rc),
            dlock_error_message());
    CHECK(rc == DLOCK_EAUTH);
    CHECK_MESSAGE_CLEAN();
    fake_stop(&f);
}

static void wrong_password(void)
{
    test_redis r;
    dlock_client_options co = short_timeouts(1000);
    char url[256];

    test_redis_start(&r, NULL);
    acl_setuser(&r, "alice", "right", "~dlock:* &dlock:* +@all");
    acl_setuser(&r, "bob", "right", "~dlock:* &dlock:* +@all");
    admin(&r, 0, 4, (const char *[]){"ACL", "SETUSER", "bob", "off"});
    snprintf(url, sizeof(url), "redis://alice:" SECRET "@127.0.0.1:%d", r.port);
    expect_open_fails(url, DLOCK_EAUTH, &co);
    CHECK_CONTAINS(dlock_error_message(), "authentication failed");
    CHECK_CONTAINS(dlock_error_message(), "WRONGPASS");
    snprintf(url, sizeof(url), "redis://bob:right@127.0.0.1:%d", r.port);
    expect_open_fails(url, DLOCK_EAUTH, &co); /* user disabled */
    snprintf(url, sizeof(url), "redis://alice:right@127.0.0.1:%d", r.port);
    dlock_client_free(open_url(url));
    test_redis_stop(&r);
}

/* ---------------------------------------------------------------------- */
/* Servers that do not answer, or answer garbage */

static void unreachable_and_silent_server(void)
{
    static const char *const silent[] = {FAKE_SILENT, NULL};
    static const char *const hangup[] = {FAKE_CLOSE, NULL};
    static const char *const silent_later[] = {"+OK\r\n", FAKE_SILENT, NULL};
    fake_server f;
    dlock_client_options co = short_timeouts(300);
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    int64_t t0, took;

    /* Accepts, never answers: the handshake times out. */
    memset(&f, 0, sizeof(f));
    f.scripts[0] = silent;
    f.nscripts = 1;
    fake_start(&f);
    t0 = now_ms();
    CHECK_RC(dlock_client_open(&c, f.url, &co), DLOCK_ECONN);
    took = now_ms() - t0;
    CHECK_CONTAINS(dlock_error_message(), "timed out");
    CHECK_CONTAINS(dlock_error_message(), f.url + strlen("redis://"));
    /* It waited for its timeout (a clock cannot make that shorter), and
     * gave up then: one connection, and no hang (the bound is for a
     * loaded machine, 30 timeouts; without one it would wait for ever). */
    CHECK(took >= 250 && took < 30 * 300);
    fake_stop(&f);
    CHECK(f.accepted == 1);

    /* Accepts and hangs up. */
    memset(&f, 0, sizeof(f));
    f.scripts[0] = hangup;
    f.nscripts = 1;
    fake_start(&f);
    CHECK_RC(dlock_client_open(&c, f.url, &co), DLOCK_ECONN);
    CHECK_CONTAINS(dlock_error_message(), "closed the connection");
    fake_stop(&f);

    /* Goes silent after the handshake: a call returns ECONN within the
     * command timeout (once more for the one reconnect-and-retry). */
    memset(&f, 0, sizeof(f));
    f.scripts[0] = silent_later;
    f.nscripts = 1;
    fake_start(&f);
    CHECK_RC(dlock_client_open(&c, f.url, &co), DLOCK_OK);
    t0 = now_ms();
    CHECK_RC(dlock_acquire(&l, c, "x", NULL), DLOCK_ECONN);
    took = now_ms() - t0;
    fprintf(stderr, "acquire against a silent server, command timeout 300 ms: %lld ms\n",
            (long long)took);
    CHECK_CONTAINS(dlock_error_message(), "timed out");
    CHECK(took >= 300 && took < 30 * 300);
    CHECK(l == NULL);
    dlock_client_free(c);
    fake_stop(&f);
    /* One reconnect-and-retry at most (docs/errors.md): two connections. */
    CHECK(f.accepted <= 2);
}

typedef struct {
    const char *what;
    const char *const *script;
    int op;      /* 0 open, 1 acquire, 2 release, 3 status, 4 check */
    int want;
    const char *needle;
} garbage_case;

/* A fake server whose first connection is told first, the others second. */
static void fake_start_two(fake_server *f, const char *const *first, const char *const *second)
{
    memset(f, 0, sizeof(*f));
    f->scripts[0] = first;
    f->scripts[1] = second;
    f->nscripts = 2;
    fake_start(f);
}

#define OK "+OK\r\n"
#define ACQ_OK "*2\r\n:1\r\n:7\r\n"

static void garbage_server(void)
{
    static const char *const http[] = {"HTTP/1.1 400 Bad Request\r\n\r\n", NULL};
    static const char *const int_hello[] = {":1\r\n", NULL};
    static const char *const nested[] = {"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
                                         NULL};
    /* hiredis would allocate 16 GB of element pointers on the header alone;
     * the 1M-element arrays below stay within the limit one at a time. */
    static const char *const huge_array[] = {OK, "*2000000000\r\n", NULL};
    static const char *const arrays_adding_up[] = {
        OK, "*2\r\n*1048576\r\n:1\r\n*1048576\r\n:1\r\n", NULL};
    static const char *const status_to_eval[] = {OK, "+OK\r\n", NULL};
    static const char *const fence_zero[] = {OK, "*2\r\n:1\r\n:0\r\n", NULL};
    static const char *const fence_negative[] = {OK, "*2\r\n:1\r\n:-4\r\n", NULL};
    static const char *const fence_string[] = {OK, "*2\r\n:1\r\n$1\r\n7\r\n", NULL};
    /* Integers outside int64_t: hiredis 0.14 refuses them (its parser checks
     * the range; a parser without the check would read -1, INT64_MIN and 5). */
    static const char *const fence_u64_max[] = {OK, "*2\r\n:1\r\n:18446744073709551615\r\n",
                                                NULL};
    static const char *const fence_int64_max_plus_1[] = {
        OK, "*2\r\n:1\r\n:9223372036854775808\r\n", NULL};
    static const char *const fence_wraps_to_5[] = {OK, "*2\r\n:1\r\n:18446744073709551621\r\n",
                                                   NULL};
    static const char *const short_array[] = {OK, "*1\r\n:1\r\n", NULL};
    static const char *const error_reply[] = {OK, "-ERR kaboom\r\n", NULL};
    static const char *const half_reply[] = {OK, FAKE_CLOSE_AFTER "*2\r\n:1\r\n", NULL};
    static const char *const release_bulk[] = {OK, ACQ_OK, "$3\r\nfoo\r\n", NULL};
    static const char *const release_nil[] = {OK, ACQ_OK, "$-1\r\n", NULL};
    static const char *const status_short[] = {OK, "*2\r\n:1\r\n:1\r\n", NULL};
    static const char *const check_int[] = {OK, ACQ_OK, ":5\r\n", NULL};
    static const char *const noscript_then_ok[] = {OK, "-NOSCRIPT No matching script\r\n",
                                                   "*2\r\n:1\r\n:3\r\n", "+OK\r\n", NULL};
    static const garbage_case cases[] = {
        {"HTTP server", http, 0, DLOCK_EPROTO, "not a Redis reply"},
        {"integer to CLIENT SETNAME", int_hello, 0, DLOCK_EPROTO, "handshake"},
        {"nesting past hiredis' limit", nested, 0, DLOCK_EPROTO, "not a Redis reply"},
        {"array header of 2e9 elements", huge_array, 1, DLOCK_EPROTO, "array elements, refused"},
        {"nested arrays adding up past the limit", arrays_adding_up, 1, DLOCK_EPROTO,
         "array elements, refused"},
        {"status line to EVALSHA", status_to_eval, 1, DLOCK_EPROTO, "acquire script"},
        {"fence 0", fence_zero, 1, DLOCK_EPROTO, "fence <= 0"},
        {"negative fence", fence_negative, 1, DLOCK_EPROTO, "fence <= 0"},
        {"fence as a string", fence_string, 1, DLOCK_EPROTO, "acquire script"},
        {"fence 2^64-1", fence_u64_max, 1, DLOCK_EPROTO, "Bad integer value"},
        {"fence 2^63", fence_int64_max_plus_1, 1, DLOCK_EPROTO, "Bad integer value"},
        {"fence 2^64+5", fence_wraps_to_5, 1, DLOCK_EPROTO, "Bad integer value"},
        {"one-element array", short_array, 1, DLOCK_EPROTO, "acquire script"},
        {"error reply", error_reply, 1, DLOCK_ESERVER, "ERR kaboom"},
        {"half a reply, then hang up", half_reply, 1, DLOCK_ECONN, "closed the connection"},
        {"bulk string to release", release_bulk, 2, DLOCK_EPROTO, "release script"},
        {"nil to release", release_nil, 2, DLOCK_EPROTO, "release script"},
        {"short status array", status_short, 3, DLOCK_EPROTO, "status script"},
        {"integer to GET", check_int, 4, DLOCK_EPROTO, "GET"},
        {"NOSCRIPT, then the EVAL answer", noscript_then_ok, 1, DLOCK_OK, ""},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const garbage_case *gc = &cases[i];
        dlock_client_options co = short_timeouts(500);
        dlock_acquire_options o = test_opts(0, 60000, 0);
        dlock_client *c = NULL;
        dlock_lock *l = NULL;
        dlock_lock_info info;
        fake_server f;
        int rc;

        memset(&f, 0, sizeof(f));
        f.scripts[0] = gc->script;
        f.nscripts = 1;
        fake_start(&f);
        rc = dlock_client_open(&c, f.url, &co);
        if (gc->op > 0) {
            CHECK_RC(rc, DLOCK_OK);
            rc = dlock_acquire(&l, c, "g", &o);
            if (gc->op > 1 && gc->op != 3)
                CHECK_RC(rc, DLOCK_OK);
            if (gc->op == 2) {
                rc = dlock_release(l); /* frees the handle whatever the reply */
                l = NULL;
            } else if (gc->op == 3) {
                rc = dlock_status(&info, c, "g");
            } else if (gc->op == 4) {
                rc = dlock_lock_check(l);
            }
        }
        fprintf(stderr, "%-32s -> %d (%s): %s\n", gc->what, rc, dlock_strerror(rc),
                dlock_error_message());
        if (rc != gc->want) {
            fprintf(stderr, "  wanted %d (%s)\n", gc->want, dlock_strerror(gc->want));
            exit(1);
        }
        if (rc != DLOCK_OK) {
            CHECK_MESSAGE_CLEAN();
            CHECK_CONTAINS(dlock_error_message(), gc->needle);
            CHECK_CONTAINS(dlock_error_message(), f.url + strlen("redis://"));
        } else {
            CHECK(dlock_lock_fence(l) == 3);
        }
        if (l != NULL)
            dlock_release(l);
        dlock_client_free(c);
        fake_stop(&f);
    }
}

/* A 60 MB bulk string where a script's reply belongs: the client refuses it
 * once a reply passes its cap (1 MiB) and hangs up, long before the server
 * has sent it all, and the next call connects again. */
static void huge_bulk_reply_refused(void)
{
    static const char *const big[] = {OK, FAKE_BIG_BULK, NULL};
    static const char *const then_ok[] = {OK, ACQ_OK, NULL};
    dlock_client_options co = short_timeouts(5000);
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    fake_server f;
    size_t sent;

    fake_start_two(&f, big, then_ok);
    CHECK_RC(dlock_client_open(&c, f.url, &co), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "g", NULL), DLOCK_EPROTO);
    fprintf(stderr, "60 MB bulk: %s\n", dlock_error_message());
    CHECK_CONTAINS(dlock_error_message(), "longer than 1048576 bytes, refused");
    CHECK_CONTAINS(dlock_error_message(), f.url + strlen("redis://"));
    CHECK(l == NULL);
    /* The connection was dropped: the next call opens a new one, which the
     * fake server answers with its second script. */
    CHECK_RC(dlock_acquire(&l, c, "g", NULL), DLOCK_OK);
    dlock_release(l); /* the script is over: the server hangs up */
    dlock_client_free(c);
    fake_stop(&f);
    sent = __atomic_load_n(&f.big_sent, __ATOMIC_SEQ_CST);
    fprintf(stderr, "the server sent %zu of %d bytes before the client hung up\n", sent,
            FAKE_BIG_BYTES);
    CHECK(f.big_cut);
    CHECK(sent < FAKE_BIG_BYTES);
}

/* The id of the server's connection named name (CLIENT LIST), 0 if none. */
static long long client_id(test_redis *r, const char *name)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    redisReply *rep;
    char want[64];
    long long id = 0;

    CHECK(c != NULL && c->err == 0);
    rep = redisCommand(c, "CLIENT LIST");
    CHECK(rep != NULL && rep->type == REDIS_REPLY_STRING);
    snprintf(want, sizeof(want), " name=%s ", name);
    for (char *line = rep->str; line != NULL && *line != '\0';) {
        char *end = strchr(line, '\n');
        if (end != NULL)
            *end = '\0';
        if (strstr(line, want) != NULL)
            sscanf(line, "id=%lld", &id);
        line = end != NULL ? end + 1 : NULL;
    }
    freeReplyObject(rep);
    redisFree(c);
    return id;
}

/* The same cap on the subscriber's connection: a 2 MB message on a lock's
 * channel (anyone who may PUBLISH there can send one) makes the subscriber
 * hang up and connect again; its waiter is woken, sleeps again, and still
 * gets the lock when the holder releases it. */
static void huge_message_drops_subscriber(void)
{
    enum { BIG = 2 * 1024 * 1024 };
    test_redis r;
    dlock_client *ch, *cw;
    dlock_lock *h;
    test_acquirer w;
    pthread_t t;
    char *big = malloc(BIG);
    long long sub;

    CHECK(big != NULL);
    memset(big, 'x', BIG);
    test_redis_start(&r, NULL);
    ch = open_url(r.url);
    cw = open_url(r.url);
    CHECK_RC(dlock_acquire(&h, ch, "m", NULL), DLOCK_OK);
    test_acquirer_init(&w, cw, "m", test_opts(60000, 30000, 1));
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &w) == 0);
    for (int i = 0; i < 2000 && test_redis_numsub(&r, "dlock:{m}:release") != 1; i++)
        test_sleep_ms(10);
    CHECK(test_redis_numsub(&r, "dlock:{m}:release") == 1);
    sub = client_id(&r, "dlock-sub");
    CHECK(sub != 0);
    CHECK(test_redis_cmd(&r, "PUBLISH dlock:{m}:release %b", big, (size_t)BIG) == 1);
    /* The subscriber hung up and is back, subscribed again. */
    for (int i = 0; i < 2000; i++) {
        long long now = client_id(&r, "dlock-sub");
        if (now != 0 && now != sub && test_redis_numsub(&r, "dlock:{m}:release") == 1)
            break;
        test_sleep_ms(10);
    }
    fprintf(stderr, "subscriber connection: id %lld, after the 2 MB message %lld\n", sub,
            client_id(&r, "dlock-sub"));
    CHECK(client_id(&r, "dlock-sub") != sub);
    CHECK(!atomic_load(&w.done));
    CHECK_RC(dlock_release(h), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(w.rc, DLOCK_OK);
    CHECK_RC(dlock_release(w.lock), DLOCK_OK);
    dlock_client_free(ch);
    dlock_client_free(cw);
    free(big);
    test_redis_stop(&r);
}

/* Garbage in the watchdog's renewals: the lock is kept while the lease
 * lasts, then reported lost (reason ECONN) with the cause in the text. */
static void garbage_renewal(void)
{
    static const char *const cmd[] = {OK, ACQ_OK, ":1\r\n", NULL};
    static const char *const wd[] = {OK, "$1\r\nx\r\n", "$1\r\nx\r\n", "$1\r\nx\r\n",
                                     "$1\r\nx\r\n", "$1\r\nx\r\n", "$1\r\nx\r\n", NULL};
    fake_server f;
    dlock_client_options co = short_timeouts(500);
    dlock_acquire_options o = test_opts(0, 300, 1);
    dlock_client *c;
    dlock_lock *l;
    int64_t t0;

    fake_start_two(&f, cmd, wd);
    CHECK_RC(dlock_client_open(&c, f.url, &co), DLOCK_OK);
    atomic_store(&test_lost_calls, 0);
    o.on_lost = test_count_lost;
    t0 = now_ms();
    CHECK_RC(dlock_acquire(&l, c, "g", &o), DLOCK_OK);
    for (int i = 0; i < 300 && atomic_load(&test_lost_calls) == 0; i++)
        test_sleep_ms(10);
    CHECK(atomic_load(&test_lost_calls) == 1);
    CHECK(atomic_load(&test_lost_reason) == DLOCK_ECONN);
    CHECK(now_ms() - t0 >= 290);
    CHECK_RC(dlock_release(l), DLOCK_ELOST);
    CHECK_CONTAINS(dlock_error_message(), "renew script");
    dlock_client_free(c);
    fake_stop(&f);
}

/* A server's text carries terminal escapes, a bell, DEL, a lone carriage
 * return and a newline (a Redis error line ends only at "\r\n"). */
#define HOSTILE_ERR "-ERR \x1b]0;owned\x07\x1b[2J\x1b[31mred\x1b[0m\nforged line\rx\x08\x7f\x01 end\r\n"

/* 1 if s holds a control character (below 0x20, or DEL). */
static int has_control(const char *s)
{
    for (; *s != '\0'; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return 1;
    return 0;
}

/* Start f with script for the first connection, and then (if not NULL)
 * for the second (the watchdog's). */
static void serve(fake_server *f, const char *const *first, const char *const *second)
{
    memset(f, 0, sizeof(*f));
    f->scripts[0] = first;
    f->scripts[1] = second;
    f->nscripts = second != NULL ? 2 : 1;
    fake_start(f);
}

static void check_sanitised(const char *what)
{
    const char *m = dlock_error_message();

    fprintf(stderr, "%s: %s\n", what, m);
    CHECK(!has_control(m));
    /* Shown, not dropped: the text around the control characters stays. */
    CHECK_CONTAINS(m, "ERR ");
    CHECK_CONTAINS(m, "forged line");
    CHECK_CONTAINS(m, " end");
}

/*
 * A hostile server's error text never brings a control character into a
 * message (issue 19, item 10): not in the handshake, not in a call's
 * error, not in the text the watchdog keeps for a lost lock. Every message
 * is written by one function (dlock_backend_fail), which is also checked
 * directly with what etcd's grpc_message could hold.
 */
static void hostile_error_text(void)
{
    static const char *const handshake[] = {HOSTILE_ERR, NULL};
    static const char *const call[] = {OK, HOSTILE_ERR, NULL};
    static const char *const cmd[] = {OK, ACQ_OK, ":1\r\n", NULL};
    static const char *const wd[] = {OK, HOSTILE_ERR, HOSTILE_ERR, HOSTILE_ERR, HOSTILE_ERR,
                                     HOSTILE_ERR, HOSTILE_ERR, HOSTILE_ERR, HOSTILE_ERR, NULL};
    dlock_client_options co = short_timeouts(500);
    dlock_acquire_options o = test_opts(0, 60000, 0);
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    fake_server f;
    char text[64];

    serve(&f, handshake, NULL);
    CHECK(dlock_client_open(&c, f.url, &co) != DLOCK_OK);
    check_sanitised("handshake");
    fake_stop(&f);

    serve(&f, call, NULL);
    CHECK_RC(dlock_client_open(&c, f.url, &co), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "h", &o), DLOCK_ESERVER);
    check_sanitised("acquire");
    dlock_client_free(c);
    fake_stop(&f);

    /* The watchdog's renewals get the text until the lease runs out. */
    serve(&f, cmd, wd);
    CHECK_RC(dlock_client_open(&c, f.url, &co), DLOCK_OK);
    o = test_opts(0, 300, 1);
    atomic_store(&test_lost_calls, 0);
    o.on_lost = test_count_lost;
    CHECK_RC(dlock_acquire(&l, c, "h", &o), DLOCK_OK);
    for (int i = 0; i < 3000 && atomic_load(&test_lost_calls) == 0; i++)
        test_sleep_ms(10);
    CHECK(atomic_load(&test_lost_calls) == 1);
    CHECK_RC(dlock_release(l), DLOCK_ELOST);
    check_sanitised("lost lock's text, through release");
    dlock_client_free(c);
    fake_stop(&f);

    /* etcd's grpc_message is put in messages by the same function. */
    for (int ch = 1; ch < 0x20; ch++) {
        snprintf(text, sizeof(text), "ERR forged line%c end", ch);
        CHECK_RC(dlock_backend_fail(DLOCK_ESERVER, "etcd 127.0.0.1:2379: %s", text),
                 DLOCK_ESERVER);
        CHECK(!has_control(dlock_error_message()));
    }
    CHECK_RC(dlock_backend_fail(DLOCK_ESERVER, "etcd 127.0.0.1:2379: %s",
                                "ERR \x1b[2J\x7f forged line\n\r end"), DLOCK_ESERVER);
    check_sanitised("etcd-style text");
}

/* ---------------------------------------------------------------------- */
/* Handles: release, client free, threads */

static atomic_int released_flag;
static atomic_int late_callbacks;

static void late_check(dlock_lock *l, int reason, void *payload)
{
    (void)l;
    (void)reason;
    (void)payload;
    if (atomic_load(&released_flag))
        atomic_fetch_add(&late_callbacks, 1);
    atomic_fetch_add(&test_lost_calls, 1);
}

/*
 * Releasing twice is a use after free by contract (the first release frees
 * the handle), so it is not called here. What is checked is what the
 * contract promises instead: release(NULL) is a no-op, and after release
 * returns, on_lost never runs, even when the lock is lost during the
 * release.
 */
static void no_on_lost_after_release(void)
{
    test_redis r;
    dlock_client *c, *breaker;
    int elost = 0;

    test_redis_start(&r, NULL);
    c = open_url(r.url);
    breaker = open_url(r.url);
    CHECK_RC(dlock_release(NULL), DLOCK_OK);
    CHECK(dlock_error_message()[0] == '\0');
    atomic_store(&test_lost_calls, 0);
    for (int i = 0; i < 60; i++) {
        dlock_acquire_options o = test_opts(0, 15 + i % 20, i % 2);
        dlock_lock *l;
        int rc;

        o.on_lost = late_check;
        atomic_store(&released_flag, 0);
        CHECK_RC(dlock_acquire(&l, c, "race", &o), DLOCK_OK);
        if (i % 3 == 0)
            CHECK_RC(dlock_force_release(NULL, breaker, "race"), DLOCK_OK);
        test_sleep_ms(i % 25);
        rc = dlock_release(l);
        atomic_store(&released_flag, 1);
        CHECK(rc == DLOCK_OK || rc == DLOCK_ELOST);
        elost += rc == DLOCK_ELOST;
        test_sleep_ms(5);
    }
    test_sleep_ms(100);
    fprintf(stderr, "60 releases: %d ELOST, %d on_lost, %d after release\n", elost,
            atomic_load(&test_lost_calls), atomic_load(&late_callbacks));
    CHECK(atomic_load(&late_callbacks) == 0);
    CHECK(elost > 0);
    dlock_client_free(breaker);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* Beyond test_redis client_freed_before_release: every call on the orphan
 * handle is answered, and its on_lost never runs. */
static void handle_after_client_free(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 200, 1);

    test_redis_start(&r, NULL);
    c = open_url(r.url);
    atomic_store(&test_lost_calls, 0);
    o.on_lost = test_count_lost;
    CHECK_RC(dlock_acquire(&l, c, "orphan", &o), DLOCK_OK);
    dlock_client_free(c);
    CHECK_RC(dlock_lock_extend(l, 1000), DLOCK_EMISUSE);
    CHECK_CONTAINS(dlock_error_message(), "already freed");
    CHECK_RC(dlock_lock_check(l), DLOCK_EMISUSE);
    CHECK_CONTAINS(dlock_error_message(), "already freed");
    CHECK(dlock_lock_fence(l) == 1);
    CHECK(strcmp(dlock_lock_name(l), "orphan") == 0);
    test_sleep_ms(400); /* the lease runs out, unrenewed */
    CHECK(dlock_lock_lost(l));
    CHECK(dlock_lock_valid_ms(l) == 0);
    CHECK(atomic_load(&test_lost_calls) == 0);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{orphan}") == 0);
    CHECK_RC(dlock_release(l), DLOCK_EMISUSE);
    test_redis_stop(&r);
}

typedef struct {
    dlock_lock *lock;
    atomic_int stop;
    int extends;
} other_arg;

static void *other_thread(void *p)
{
    other_arg *a = p;

    for (int i = 0; i < 150; i++) {
        CHECK_RC(dlock_lock_extend(a->lock, 2000 + (i % 3) * 500), DLOCK_OK);
        CHECK_RC(dlock_lock_check(a->lock), DLOCK_OK);
        a->extends++;
        usleep(2000 + (i % 7) * 1000);
    }
    return NULL;
}

static void *reader_thread(void *p)
{
    other_arg *a = p;
    uint64_t fence = dlock_lock_fence(a->lock);

    while (!atomic_load(&a->stop)) {
        CHECK(dlock_lock_fence(a->lock) == fence);
        CHECK(!dlock_lock_lost(a->lock));
        CHECK(dlock_lock_valid_ms(a->lock) > 0);
        CHECK(strcmp(dlock_lock_name(a->lock), "shared") == 0);
        usleep(100); /* thousands of looks, and a core left for the others */
    }
    return NULL;
}

/* A lock acquired on one thread, extended and checked from a second while
 * the watchdog renews it, read from a third (never lost, all along),
 * released from the first. Leases of 2-3 s: a renewal may come a second
 * or more late on a loaded machine before the lock is at risk, and the
 * test waits for renewals, not for a time. */
static void lock_used_from_other_thread(void)
{
    test_redis r;
    dlock_client *c;
    dlock_acquire_options o = test_opts(0, 2000, 1);
    other_arg a;
    pthread_t t, reader;
    long long scripts;
    int i;

    test_redis_start(&r, NULL);
    c = open_url(r.url);
    atomic_store(&test_lost_calls, 0);
    o.on_lost = test_count_lost;
    memset(&a, 0, sizeof(a));
    CHECK_RC(dlock_acquire(&a.lock, c, "shared", &o), DLOCK_OK);
    CHECK(pthread_create(&reader, NULL, reader_thread, &a) == 0);
    CHECK(pthread_create(&t, NULL, other_thread, &a) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    /* Three renewals of the watchdog's alone (the only scripts now). */
    scripts = test_redis_calls(&r, "evalsha");
    for (i = 0; i < 3000 && test_redis_calls(&r, "evalsha") - scripts < 3; i++)
        test_sleep_ms(10);
    CHECK(test_redis_calls(&r, "evalsha") - scripts >= 3);
    atomic_store(&a.stop, 1);
    CHECK(pthread_join(reader, NULL) == 0);
    CHECK(atomic_load(&test_lost_calls) == 0);
    CHECK_RC(dlock_release(a.lock), DLOCK_OK);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{shared}") == 0);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* Beyond test_redis maxmemory_reached: a lock held when the server fills up
 * is kept (renewals, extend and release write nothing new), only new
 * acquisitions are refused, and acquisitions work again once memory is
 * freed. */
static void maxmemory_held_lock(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *held, *l = NULL;
    dlock_lock_info info;
    dlock_acquire_options o = test_opts(0, 300, 1);
    char *filler = calloc(1, 65536);

    CHECK(filler != NULL);
    test_redis_start(&r, "--maxmemory-policy noeviction");
    c = open_url(r.url);
    atomic_store(&test_lost_calls, 0);
    o.on_lost = test_count_lost;
    CHECK_RC(dlock_acquire(&held, c, "kept", &o), DLOCK_OK);
    for (int i = 0; i < 64; i++)
        test_redis_cmd(&r, "SET filler:%d %b", i, filler, (size_t)65536);
    free(filler);
    test_redis_cmd(&r, "CONFIG SET maxmemory 1mb");
    CHECK_RC(dlock_acquire(&l, c, "new", &o), DLOCK_ESERVER);
    CHECK_CONTAINS(dlock_error_message(), "maxmemory");
    CHECK(l == NULL);
    test_sleep_ms(1000); /* three leases: renewals go on */
    CHECK(atomic_load(&test_lost_calls) == 0);
    CHECK_RC(dlock_lock_check(held), DLOCK_OK);
    CHECK_RC(dlock_lock_extend(held, 500), DLOCK_OK);
    CHECK_RC(dlock_status(&info, c, "kept"), DLOCK_OK);
    CHECK(info.held == 1 && info.fence == 1);
    CHECK_RC(dlock_release(held), DLOCK_OK);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{kept}") == 0);
    test_redis_cmd(&r, "CONFIG SET maxmemory 0");
    CHECK_RC(dlock_acquire(&l, c, "new", &o), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* ---------------------------------------------------------------------- */
/* The minimal Redis ACL (README, Security) */

/* Commands the client sends itself, and those its Lua scripts call (Redis 7
 * checks a script's calls against the user's ACL too). SELECT only for a
 * database other than 0. AUTH needs no permission. */
#define ACL_COMMANDS                                                                               \
    "+evalsha +eval +get +set +incr +pexpire +pttl +del +publish +exists +subscribe "              \
    "+unsubscribe +client|setname +select +rpush +blpop"
#define ACL_KEYS "resetkeys ~dlock:* resetchannels &dlock:* -@all"

/*
 * The core scenario, step by step; returns 0 when every step worked, else
 * the number of the first step that did not, with its code in *code. A
 * waiter not woken by the release (no pub/sub) fails step 6: it would look
 * again by itself only at the holder's lease end (20 s), after a quarter of
 * its own (15 s), or when its 8 s wait runs out, while woken it has the
 * lock within milliseconds of the release; step 6 wants it within 5 s of
 * starting to wait (the release comes within about 2 s).
 */
static int scenario(test_redis *r, const char *url, int *code, char *msg, size_t msgsize)
{
    dlock_client_options co = short_timeouts(600);
    dlock_acquire_options o = test_opts(0, 20000, 1);
    dlock_client *c = NULL, *c2 = NULL;
    dlock_lock *a = NULL, *b = NULL;
    dlock_lock_info info;
    test_acquirer w;
    pthread_t t;
    long long scripts;
    int step = 0, rc;

#define STEP(expr, want)                                                                           \
    do {                                                                                           \
        step++;                                                                                    \
        if ((rc = (expr)) != (want)) {                                                             \
            *code = rc;                                                                            \
            snprintf(msg, msgsize, "%s", dlock_error_message());                                   \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

    admin(r, 0, 2, (const char *[]){"SCRIPT", "FLUSH"}); /* EVAL is needed after a restart */
    admin(r, 0, 1, (const char *[]){"FLUSHALL"});
    STEP(dlock_client_open(&c, url, &co), DLOCK_OK);                  /* 1 */
    STEP(dlock_client_open(&c2, url, &co), DLOCK_OK);                 /* 2 */
    STEP(dlock_acquire(&a, c, "core", &o), DLOCK_OK);                 /* 3 */
    STEP(dlock_lock_check(a), DLOCK_OK);                              /* 4 */
    STEP(dlock_acquire(&b, c2, "core", &o), DLOCK_EBUSY);             /* 5 */
    test_acquirer_init(&w, c2, "core", test_opts(8000, 60000, 1));
    step++;                                                            /* 6 */
    scripts = test_redis_calls(r, "evalsha") + test_redis_calls(r, "eval");
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &w) == 0);
    /* Until it is asleep on the channel: subscribed, both tries done (or
     * 2 s, for a user whose SUBSCRIBE is refused). */
    for (int i = 0; i < 200 && (test_redis_numsub(r, "dlock:{core}:release") < 1 ||
                                test_redis_calls(r, "evalsha") +
                                        test_redis_calls(r, "eval") - scripts < 2); i++)
        test_sleep_ms(10);
    rc = dlock_lock_extend(a, 20000);
    if (rc == DLOCK_OK)
        rc = dlock_release(a);
    else
        dlock_release(a);
    a = NULL;
    CHECK(pthread_join(t, NULL) == 0);
    if (rc != DLOCK_OK || w.rc != DLOCK_OK || w.took_ms >= 5000) {
        *code = rc != DLOCK_OK ? rc : w.rc;
        snprintf(msg, msgsize, "extend/release %d, waiter %d after %lld ms", rc, w.rc,
                 (long long)w.took_ms);
        if (w.lock != NULL)
            dlock_release(w.lock);
        goto out;
    }
    b = w.lock;
    test_sleep_ms(800);
    STEP(dlock_lock_check(b), DLOCK_OK);                              /* 7 */
    STEP(dlock_status(&info, c, "core"), DLOCK_OK);                   /* 8 */
    step++;                                                            /* 9 */
    if (info.held != 1 || info.fence != 2) {
        *code = DLOCK_EPROTO;
        snprintf(msg, msgsize, "status held %d fence %llu", info.held,
                 (unsigned long long)info.fence);
        goto out;
    }
    STEP(dlock_force_release(&info, c, "core"), DLOCK_OK);            /* 10 */
    STEP(dlock_release(b), DLOCK_ELOST);                              /* 11 */
    b = NULL;
    step = 0;
out:
    if (a != NULL)
        dlock_release(a);
    if (b != NULL)
        dlock_release(b);
    dlock_client_free(c);
    dlock_client_free(c2);
    return step;
#undef STEP
}

static void acl_minimal_user(void)
{
    test_redis r;
    char url[256], msg[512];
    int code = 0, step;

    test_redis_start(&r, NULL);
    acl_setuser(&r, "dlock", SECRET, ACL_KEYS " " ACL_COMMANDS);
    snprintf(url, sizeof(url), "redis://dlock:" SECRET "@127.0.0.1:%d/3", r.port);
    step = scenario(&r, url, &code, msg, sizeof(msg));
    if (step != 0) {
        fprintf(stderr, "minimal ACL user: step %d failed: %d (%s): %s\n", step, code,
                dlock_strerror(code), msg);
        exit(1);
    }
    /* Only dlock:* keys: the ACL really is narrow. */
    {
        dlock_client *c = open_url(url);
        dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
        dlock_lock *l = NULL;
        co.key_prefix = "other:";
        dlock_client_free(c);
        CHECK_RC(dlock_client_open(&c, url, &co), DLOCK_OK);
        CHECK_RC(dlock_acquire(&l, c, "core", NULL), DLOCK_EAUTH);
        CHECK_CONTAINS(dlock_error_message(), "NOPERM");
        CHECK_MESSAGE_CLEAN();
        dlock_client_free(c);
    }
    test_redis_stop(&r);
}

/* The same over rediss://: the minimal user runs the core scenario through
 * TLS; without EVALSHA, or outside its key pattern, a clear DLOCK_EAUTH. */
static void acl_over_tls(void)
{
    test_tls t;
    test_redis r;
    dlock_client *c;
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_lock *l = NULL;
    char url[1024], msg[512];
    int code = 0, step;

    test_tls_make(&t);
    test_redis_start_tls(&r, &t, "server", NULL);
    acl_setuser(&r, "dlock", SECRET, ACL_KEYS " " ACL_COMMANDS);
    acl_setuser(&r, "noevalsha", SECRET, ACL_KEYS " +eval +get +set +incr +pexpire +pttl +del "
                "+publish +exists +subscribe +unsubscribe +client|setname +select");
    snprintf(url, sizeof(url), "rediss://dlock:" SECRET "@127.0.0.1:%d/3?cacert=%s",
             r.tls_port, test_tls_file(&t, "ca.crt"));
    step = scenario(&r, url, &code, msg, sizeof(msg));
    if (step != 0) {
        fprintf(stderr, "minimal ACL user over TLS: step %d failed: %d (%s): %s\n", step, code,
                dlock_strerror(code), msg);
        exit(1);
    }
    co.key_prefix = "other:";
    CHECK_RC(dlock_client_open(&c, url, &co), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "core", NULL), DLOCK_EAUTH);
    CHECK_CONTAINS(dlock_error_message(), "NOPERM");
    CHECK_MESSAGE_CLEAN();
    dlock_client_free(c);
    snprintf(url, sizeof(url), "rediss://noevalsha:" SECRET "@127.0.0.1:%d?cacert=%s",
             r.tls_port, test_tls_file(&t, "ca.crt"));
    c = open_url(url);
    CHECK_RC(dlock_acquire(&l, c, "core", NULL), DLOCK_EAUTH);
    fprintf(stderr, "without EVALSHA: %s\n", dlock_error_message());
    CHECK_CONTAINS(dlock_error_message(), "rediss 127.0.0.1:");
    CHECK_CONTAINS(dlock_error_message(), "'evalsha'");
    CHECK_MESSAGE_CLEAN();
    dlock_client_free(c);
    /* A wrong password over TLS is the same EAUTH as in clear text. */
    snprintf(url, sizeof(url), "rediss://dlock:wrong@127.0.0.1:%d?cacert=%s", r.tls_port,
             test_tls_file(&t, "ca.crt"));
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_EAUTH);
    CHECK_CONTAINS(dlock_error_message(), "WRONGPASS");
    test_redis_stop(&r);
    test_tls_remove(&t);
}

/* Each command of the minimal set, taken away alone: what breaks. */
static void acl_each_command_needed(void)
{
    static const struct {
        const char *command;
        int step; /* the step that must fail; 0 = none (not needed) */
        const char *effect;
    } rows[] = {
        {"evalsha", 3, "acquire refused"},
        {"eval", 3, "acquire refused while the script cache is empty (after a restart)"},
        {"get", 3, "acquire refused (its script reads the counter)"},
        {"set", 3, "acquire refused"},
        {"incr", 3, "acquire refused"},
        {"pttl", 5, "try-once on a held lock refused"},
        {"pexpire", 6, "extend refused"},
        {"del", 6, "release refused"},
        {"publish", 10, "force release refused, and every release that wakes a waiter (a hand-over "
                        "pushed to a waiter that pops it publishes nothing: step 6 passes)"},
        {"subscribe", 0, "the waiter in the hand-off slot pops its grant; the others are not woken by a "
                         "release: they look again after a quarter of their lease"},
        {"exists", 8, "status refused"},
        {"client|setname", 1, "connection refused"},
        {"select", 1, "connection to a database other than 0 refused"},
        {"unsubscribe", 0, "nothing in a short run: idle channels stay subscribed (harmless)"},
        {"rpush", 0, "the hand-off's grant is announced, not pushed: the waiter confirms it with a try"},
        {"blpop", 0, "waiters wait for the grant's message instead of popping it, and confirm it"},
    };
    test_redis r;
    char url[256], msg[1024], rules[512];
    int failures = 0;

    test_redis_start(&r, NULL);
    fprintf(stderr, "%-15s %-5s %-8s %s\n", "without", "step", "code", "effect");
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        char want[64], user[32];
        const char *p;
        int code = 0, step, n;

        /* The minimal set less this one command. */
        snprintf(want, sizeof(want), "+%s ", rows[i].command);
        snprintf(rules, sizeof(rules), "%s ", ACL_COMMANDS);
        p = strstr(rules, want);
        CHECK(p != NULL);
        n = (int)strlen(want);
        memmove((char *)p, p + n, strlen(p + n) + 1);
        snprintf(user, sizeof(user), "u%zu", i);
        snprintf(msg, sizeof(msg), "%s %s", ACL_KEYS, rules);
        acl_setuser(&r, user, SECRET, msg);
        snprintf(url, sizeof(url), "redis://%s:" SECRET "@127.0.0.1:%d/%d", user, r.port,
                 strcmp(rows[i].command, "select") == 0 ? 3 : 0);
        msg[0] = '\0';
        step = scenario(&r, url, &code, msg, sizeof(msg));
        fprintf(stderr, "%-15s %-5d %-8s %s\n    %s\n", rows[i].command, step,
                step ? dlock_strerror(code) : "-", rows[i].effect, msg);
        if (step != rows[i].step) {
            fprintf(stderr, "    expected step %d to fail\n", rows[i].step);
            failures++;
        }
        if (step != 0 && code != DLOCK_OK && strstr(msg, SECRET) != NULL) {
            fprintf(stderr, "    the message holds the password\n");
            failures++;
        }
    }
    CHECK(failures == 0);
    test_redis_stop(&r);
}

/*
 * The acquire script SETs the key, then INCRs the counter. If INCR fails
 * (an ACL without it, or any error past the SET), the key stays, with no
 * fence issued and no owner able to release it: the lock is stuck until its
 * lease runs out. A failed acquisition must leave no lock behind.
 */
static void failed_acquire_leaves_no_lock(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *l = NULL;
    char url[256];
    int rc;

    test_redis_start(&r, NULL);
    acl_setuser(&r, "noincr", SECRET, ACL_KEYS " +evalsha +eval +get +set +pexpire +pttl "
                "+del +publish +exists +subscribe +unsubscribe +client|setname");
    snprintf(url, sizeof(url), "redis://noincr:" SECRET "@127.0.0.1:%d", r.port);
    c = open_url(url);
    rc = dlock_acquire(&l, c, "half", NULL);
    fprintf(stderr, "acquire without INCR: %d (%s): %s\n", rc, dlock_strerror(rc),
            dlock_error_message());
    CHECK(rc == DLOCK_EAUTH || rc == DLOCK_ESERVER);
    CHECK(l == NULL);
    fprintf(stderr, "after the failed acquire: EXISTS dlock:{half} = %lld, PTTL = %lld\n",
            test_redis_cmd(&r, "EXISTS dlock:{half}"), test_redis_cmd(&r, "PTTL dlock:{half}"));
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{half}") == 0);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* A fence counter or floor that is not an integer (another program wrote
 * it): the acquire fails naming the key, and leaves neither a lock without a
 * fence nor a counter it made; a sound floor starts a new name above it. */
static void broken_fence_state(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *l = NULL;

    test_redis_start(&r, NULL);
    c = open_url(r.url);
    CHECK(test_redis_cmd(&r, "SET dlock:{bc}:fence abc") >= 0);
    CHECK_RC(dlock_acquire(&l, c, "bc", NULL), DLOCK_ESERVER);
    CHECK_CONTAINS(dlock_error_message(), "fence counter dlock:{bc}:fence is not an integer");
    CHECK(l == NULL);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{bc}") == 0);

    CHECK(test_redis_cmd(&r, "SET dlock:fence-floor 4.5") >= 0);
    CHECK_RC(dlock_acquire(&l, c, "bf", NULL), DLOCK_ESERVER);
    CHECK_CONTAINS(dlock_error_message(), "fence floor dlock:fence-floor is not an integer");
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{bf} dlock:{bf}:fence") == 0);

    CHECK(test_redis_cmd(&r, "SET dlock:fence-floor 41") >= 0);
    CHECK_RC(dlock_acquire(&l, c, "bf", NULL), DLOCK_OK);
    CHECK(dlock_lock_fence(l) == 42);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "bf", NULL), DLOCK_OK);
    CHECK(dlock_lock_fence(l) == 43);
    CHECK_RC(dlock_release(l), DLOCK_OK);

    /* A counter SET by hand up to 2^53 - 1, the highest fence a script
     * returns exactly (Lua numbers are doubles): that fence is issued, the
     * next is refused, and no lock is left without a fence. */
    CHECK(test_redis_cmd(&r, "SET dlock:{max}:fence 9007199254740990") >= 0);
    CHECK_RC(dlock_acquire(&l, c, "max", NULL), DLOCK_OK);
    CHECK(dlock_lock_fence(l) == 9007199254740991ULL);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "max", NULL), DLOCK_ESERVER);
    CHECK_CONTAINS(dlock_error_message(), "dlock:{max}:fence would pass 9007199254740991");
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{max}") == 0);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* ---------------------------------------------------------------------- */
/* dlock run: the password reaches neither COMMAND's environment nor the
 * command line COMMAND can read (/proc/PPID/cmdline). */

static void run_cli(const char *url_arg, const char *env_url, char *out, size_t size, int *status)
{
    const char *cli = getenv("DLOCK_CLI");
#ifdef DLOCK_CLI_PATH
    if (cli == NULL)
        cli = DLOCK_CLI_PATH;
#endif
    int fds[2];
    pid_t pid;
    size_t got = 0;

    CHECK(cli != NULL && cli[0] != '\0');
    CHECK(pipe(fds) == 0);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        if (env_url != NULL)
            setenv("DLOCK_URL", env_url, 1);
        else
            unsetenv("DLOCK_URL");
        if (url_arg != NULL)
            execl(cli, "dlock", "--url", url_arg, "run", "envcheck", "--", "/bin/sh", "-c",
                  "env; echo; tr '\\0' ' ' </proc/$PPID/cmdline; echo", (char *)NULL);
        else
            execl(cli, "dlock", "run", "envcheck", "--", "/bin/sh", "-c",
                  "env; echo; tr '\\0' ' ' </proc/$PPID/cmdline; echo", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    for (;;) {
        ssize_t n = read(fds[0], out + got, size - 1 - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    out[got] = '\0';
    close(fds[0]);
    CHECK(waitpid(pid, status, 0) == pid);
}

static void cli_run_hides_password(void)
{
    test_redis r;
    char url[256], out[65536];
    int status;

    test_redis_start(&r, "--requirepass " SECRET);
    snprintf(url, sizeof(url), "redis://:" SECRET "@127.0.0.1:%d", r.port);
    run_cli(url, NULL, out, sizeof(out), &status);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK_CONTAINS(out, "DLOCK_FENCE=1");
    CHECK(strstr(out, SECRET) == NULL);
    run_cli(NULL, url, out, sizeof(out), &status);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK_CONTAINS(out, "DLOCK_FENCE=2");
    CHECK(strstr(out, SECRET) == NULL);
    /* No DLOCK_URL variable (a line of env's; DLOCK_TEST_REDLOCK_URL, which
     * scripts/test.sh exports, ends in the same letters). */
    CHECK(strncmp(out, "DLOCK_URL=", 10) != 0 && strstr(out, "\nDLOCK_URL=") == NULL);
    test_redis_stop(&r);
}

#ifdef DLOCK_HAVE_DEMO
/* dlock demo: --url and --store (both forms, --opt VALUE and --opt=VALUE)
 * are blanked from its command line. Read when the demo connects to the
 * lock server, which it does after parsing its options: the "server" is a
 * socket of the test's that never answers, so the demo then fails. */
static void demo_hides_url_and_store(void)
{
    const char *cli = getenv("DLOCK_CLI");
#ifdef DLOCK_CLI_PATH
    if (cli == NULL)
        cli = DLOCK_CLI_PATH;
#endif
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    struct pollfd pfd;
    char url[256], store[256], path[64], cmdline[4096];
    int lfd, cfd, status;
    ssize_t n;
    pid_t pid;

    CHECK(cli != NULL && cli[0] != '\0');
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK((lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) >= 0);
    CHECK(bind(lfd, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(lfd, 4) == 0);
    CHECK(getsockname(lfd, (struct sockaddr *)&a, &len) == 0);
    snprintf(url, sizeof(url), "--url=redis://:" SECRET "@127.0.0.1:%d", ntohs(a.sin_port));
    snprintf(store, sizeof(store), "/nonexistent/store-" SECRET ".db");
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1);
        execl(cli, "dlock", "demo", "payout", url, "--store", store, "--rounds", "1",
              (char *)NULL);
        _exit(127);
    }
    pfd.fd = lfd;
    pfd.events = POLLIN;
    CHECK(poll(&pfd, 1, 60000) == 1); /* a bound for a hung demo, not a timing */
    CHECK((cfd = accept(lfd, NULL, NULL)) >= 0);
    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    n = read(fd, cmdline, sizeof(cmdline) - 1);
    close(fd);
    CHECK(n > 0);
    for (ssize_t i = 0; i < n; i++)
        if (cmdline[i] == '\0')
            cmdline[i] = ' ';
    cmdline[n] = '\0';
    fprintf(stderr, "the demo's command line: %s\n", cmdline);
    CHECK(strstr(cmdline, "s3cr3t") == NULL);
    CHECK(strstr(cmdline, "redis://") == NULL && strstr(cmdline, "store-") == NULL);
    CHECK_CONTAINS(cmdline, "--url=*****");
    CHECK_CONTAINS(cmdline, "--store *****");
    close(cfd);
    close(lfd);
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 69);
}
#else
/* Built without the demo (-DDLOCK_BUILD_DEMO=OFF): `dlock demo` says that
 * it is not installed, exits 69, and does not show the URL's password. */
static void demo_hides_url_and_store(void)
{
    const char *cli = getenv("DLOCK_CLI");
    char cmd[1024], out[4096];
    size_t n;
    FILE *p;

    if (cli == NULL)
        cli = DLOCK_CLI_PATH;
    snprintf(cmd, sizeof(cmd), "'%s' demo payout --url=redis://:" SECRET "@127.0.0.1:1 2>&1", cli);
    CHECK((p = popen(cmd, "r")) != NULL);
    n = fread(out, 1, sizeof(out) - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    fprintf(stderr, "dlock demo without the demo: %s", out);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 69);
    CHECK_CONTAINS(out, "not installed");
    CHECK(strstr(out, SECRET) == NULL);
}
#endif

TEST_MAIN({"names_huge_and_binary", names_huge_and_binary, NULL},
          {"absurd_leases_and_waits", absurd_leases_and_waits, NULL},
          {"credentials_never_in_messages", credentials_never_in_messages, NULL},
          {"password_echoed_by_server_is_hidden", password_echoed_by_server_is_hidden, NULL},
          {"wrong_password", wrong_password, NULL},
          {"unreachable_and_silent_server", unreachable_and_silent_server, NULL},
          {"garbage_server", garbage_server, NULL}, {"garbage_renewal", garbage_renewal, NULL},
          {"hostile_error_text", hostile_error_text, NULL},
          {"huge_bulk_reply_refused", huge_bulk_reply_refused, NULL},
          {"huge_message_drops_subscriber", huge_message_drops_subscriber, NULL},
          {"no_on_lost_after_release", no_on_lost_after_release, "watchdog"},
          {"handle_after_client_free", handle_after_client_free, NULL},
          {"lock_used_from_other_thread", lock_used_from_other_thread, "watchdog"},
          {"maxmemory_held_lock", maxmemory_held_lock, NULL}, {"acl_minimal_user", acl_minimal_user, NULL},
          {"acl_each_command_needed", acl_each_command_needed, NULL},
          {"acl_over_tls", acl_over_tls, "tls"},
          {"failed_acquire_leaves_no_lock", failed_acquire_leaves_no_lock, NULL},
          {"broken_fence_state", broken_fence_state, NULL},
          {"cli_run_hides_password", cli_run_hides_password, "cli"},
          {"demo_hides_url_and_store", demo_hides_url_and_store, "cli"})
