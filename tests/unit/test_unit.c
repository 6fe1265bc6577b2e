/* SPDX-License-Identifier: BSD-3-Clause */
/* Pure logic, no server: URL parsing, durations, the error table, the clock. */
#define _GNU_SOURCE
#include <limits.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/client.h"
#include "core/clock.h"
#include "core/fmt.h"
#include "core/token.h"
#include "dlock/sys/backend.h"
#include "core/url.h"
#include "backends/etcd/etcd_codec.h"
#include "backends/etcd/etcd_grpc.h"
#include "backends/redis/redis_int.h"
#include "test.h"

static void url_redis_full(void)
{
    dlock_url u;

    CHECK_RC(dlock__url_parse(&u, "redis://alice:s%40cret@db.example:6390/3"), DLOCK_OK);
    CHECK(strcmp(u.scheme, "redis") == 0);
    CHECK(strcmp(u.user, "alice") == 0);
    CHECK(strcmp(u.password, "s@cret") == 0);
    CHECK(u.nhosts == 1 && strcmp(u.hosts[0].host, "db.example") == 0 && u.hosts[0].port == 6390);
    CHECK(strcmp(u.path, "/3") == 0);
    CHECK(strstr(u.redacted, "s%40cret") == NULL && strstr(u.redacted, "***") != NULL);
    dlock__url_free(&u);
}

static void url_forms(void)
{
    dlock_url u;

    CHECK_RC(dlock__url_parse(&u, "REDIS://127.0.0.1"), DLOCK_OK);
    CHECK(strcmp(u.scheme, "redis") == 0 && u.hosts[0].port == 0 && u.path == NULL);
    dlock__url_free(&u);
    CHECK_RC(dlock__url_parse(&u, "redis://[::1]:7000"), DLOCK_OK);
    CHECK(strcmp(u.hosts[0].host, "::1") == 0 && u.hosts[0].port == 7000);
    dlock__url_free(&u);
    CHECK_RC(dlock__url_parse(&u, "unix:///run/redis/redis.sock?db=2"), DLOCK_OK);
    CHECK(u.nhosts == 0 && strcmp(u.path, "/run/redis/redis.sock") == 0);
    CHECK(strcmp(dlock_url_param_get(&u, "db"), "2") == 0);
    CHECK(dlock_url_param_get(&u, "nope") == NULL);
    dlock__url_free(&u);
    CHECK_RC(dlock__url_parse(&u, "etcd://a:2379,b:2379,c"), DLOCK_OK);
    CHECK(u.nhosts == 3 && strcmp(u.hosts[2].host, "c") == 0 && u.hosts[1].port == 2379);
    dlock__url_free(&u);
    CHECK_RC(dlock__url_parse(&u, "redis://:onlypass@h"), DLOCK_OK);
    CHECK(u.user == NULL && strcmp(u.password, "onlypass") == 0);
    dlock__url_free(&u);
}

static void url_bad(void)
{
    static const char *bad[] = {
        "", "redis", "://host", "redis://host:", "redis://host:0",
        "redis://host:65536", "redis://host:12a", "redis://ho st", "redis://[::1",
        "redis://[::1]x", "redis://a,", "redis://u:p%zz@h", "redis://u:p%00@h",
        "redis://h/?novalue", "redis://h/?=v", "re dis://h", "redis://h\n",
        "redis://h:6379,,x"};
    dlock_url u;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = dlock__url_parse(&u, bad[i]);
        if (rc != DLOCK_EINVAL) {
            fprintf(stderr, "URL '%s' gave %d\n", bad[i], rc);
            exit(1);
        }
        CHECK(dlock_error_message()[0] != '\0');
        CHECK(u.scheme == NULL && u.hosts == NULL);
    }
    CHECK_RC(dlock__url_parse(&u, NULL), DLOCK_EINVAL);
}

static void url_password_never_in_messages(void)
{
    dlock_url u;

    CHECK_RC(dlock__url_parse(&u, "redis://user:hunter2@host:99999"), DLOCK_EINVAL);
    CHECK(strstr(dlock_error_message(), "hunter2") == NULL);
    CHECK_RC(dlock__url_parse(&u, "redis://user:hunter2@ho$t"), DLOCK_EINVAL);
    CHECK(strstr(dlock_error_message(), "hunter2") == NULL);
}

/* Secrets in the query (issue 26, item 8): the value of password=,
 * sentinel_password=, sslpassword=, key_secret= and of any parameter whose
 * name ends in password, secret or key is "***" in the URL messages show;
 * every other parameter is kept as written. */
static void url_query_secrets_redacted(void)
{
    static const char *const secret[] = {
        "password", "sentinel_password", "sslpassword", "key_secret", "tls-key",
        "My_Secret", "SENTINEL_PASSWORD", "sslkey", "acl", "ACL"};
    dlock_url u;
    char text[256];

    for (size_t i = 0; i < sizeof(secret) / sizeof(secret[0]); i++) {
        snprintf(text, sizeof(text), "redis://u:hunter2@h:1/0?db=2&%s=Zq7-s3cr3t%%26x&ttl=5#f",
                 secret[i]);
        CHECK_RC(dlock__url_parse(&u, text), DLOCK_OK);
        if (strstr(u.redacted, "s3cr3t") != NULL || strstr(u.redacted, "hunter2") != NULL) {
            fprintf(stderr, "%s: %s\n", secret[i], u.redacted);
            CHECK(0);
        }
        snprintf(text, sizeof(text), "redis://u:***@h:1/0?db=2&%s=***&ttl=5#f", secret[i]);
        CHECK(strcmp(u.redacted, text) == 0);
        dlock__url_free(&u);
    }
    /* An empty password is shown as "***" once (it was written again and
     * again past the buffer: fuzz_url). */
    CHECK_RC(dlock__url_parse(&u, "redis://alice:@h:1?password=&x=1"), DLOCK_OK);
    CHECK(strcmp(u.redacted, "redis://alice:***@h:1?password=***&x=1") == 0);
    dlock__url_free(&u);
    /* First in the query, last, empty; a look-alike name is kept. */
    CHECK_RC(dlock__url_parse(&u, "zk://h?password=Zq7-s3cr3t&keys=1&passwords_file=f&key_secret="
                                  "&acls=1&xacl=2"),
             DLOCK_OK);
    CHECK(strcmp(u.redacted,
                 "zk://h?password=***&keys=1&passwords_file=f&key_secret=***&acls=1&xacl=2") == 0);
    dlock__url_free(&u);
}

static void url_huge(void)
{
    size_t n = 1 << 20;
    char *s = malloc(n + 1);
    dlock_url u;

    CHECK(s != NULL);
    memcpy(s, "redis://", 8);
    memset(s + 8, 'a', n - 8);
    s[n] = '\0';
    CHECK_RC(dlock__url_parse(&u, s), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "longer");
    free(s);
}

/* The duration table: what people write (flock -w 1.5, Go's 1h30m) and
 * what the parser must refuse, with the reason it gives. */
static void duration(void)
{
    static const struct {
        const char *text;
        int64_t ms;
    } good[] = {{"250ms", 250}, {"30s", 30000}, {"90s", 90000}, {"2m", 120000},
                {"7", 7000}, {"0", 0}, {"0s", 0}, {"5h", 5 * 3600000}, {"7d", 7 * 86400000LL},
                {"30d", DLOCK_LEASE_MAX_MS}, {"720h", DLOCK_LEASE_MAX_MS},
                {"43200m", DLOCK_LEASE_MAX_MS}, {"1.5s", 1500}, {"1.5", 1500},
                {"0.25s", 250}, {"0.001s", 1}, {"1.500000000s", 1500}, {"1h30m", 5400000},
                {"1h30m15s", 5415000}, {"1m30s500ms", 90500}, {"1d12h", 129600000},
                {"0.25h", 900000}, {"1.5m", 90000}, {"29d23h59m59s999ms", DLOCK_LEASE_MAX_MS - 1},
                {"2s500ms", 2500}, {"0.5d", 43200000}, {"007s", 7000},
                /* fractions below a millisecond that add up to whole ones */
                {"9.00000001s9.99999ms", 9010}, {"1.0005s0.5ms", 1001}};
    static const struct {
        const char *text, *why;
    } bad[] = {{"", "empty"}, {"-1s", "expected a number"}, {"5H", "expected a unit"},
               {"s", "expected a number"}, {"10 s", "expected a unit"},
               {"99999999999999999999", "longer than 30 days"},
               {"43201m", "longer than 30 days"}, {" 5s", "expected a number"},
               {"31d", "longer than 30 days"}, {"721h", "longer than 30 days"},
               {"29d24h1ms", "longer than 30 days"}, {"1w", "unknown unit 'w'"},
               {"1dd", "unknown unit 'dd'"}, {"h", "expected a number"},
               {"2x", "unknown unit 'x'"}, {"30m1h", "longest to the shortest"},
               {"1s1s", "longest to the shortest"}, {"1h30", "without a unit"},
               {"1.s", "digits after '.'"}, {".5s", "expected a number"},
               {"0.5ms", "finer than a millisecond"}, {"0.0001s", "finer than a millisecond"},
               {"1.0005s0.4ms", "finer than a millisecond"},
               {"1.0000000001s", "more than 9 digits"}, {"1,5s", "expected a unit"},
               {"1.5.5s", "expected a unit"}, {"1e3s", "unknown unit 'e'"}, {"+5s", "expected a number"},
               {"1h ", "expected a number"}};
    int64_t ms;

    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        ms = -1;
        if (dlock_duration_parse(&ms, good[i].text) != DLOCK_OK || ms != good[i].ms) {
            fprintf(stderr, "duration '%s': %lld ms (%s), want %lld\n", good[i].text,
                    (long long)ms, dlock_error_message(), (long long)good[i].ms);
            exit(1);
        }
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ms = 42;
        if (dlock_duration_parse(&ms, bad[i].text) != DLOCK_EINVAL || ms != 42 ||
            strstr(dlock_error_message(), bad[i].why) == NULL) {
            fprintf(stderr, "duration '%s': %lld ms, message '%s', want EINVAL saying '%s'\n",
                    bad[i].text, (long long)ms, dlock_error_message(), bad[i].why);
            exit(1);
        }
    }
    CHECK_RC(dlock_duration_parse(NULL, "1s"), DLOCK_EINVAL);
    CHECK_RC(dlock_duration_parse(&ms, NULL), DLOCK_EINVAL);
}

static void error_table(void)
{
    CHECK(strcmp(dlock_strerror(DLOCK_OK), "success") == 0);
    CHECK(strcmp(dlock_strerror(12345), "unknown error") == 0);
    for (int code = 0; code >= DLOCK_ESERVER; code--)
        CHECK(strcmp(dlock_strerror(code), "unknown error") != 0);
    CHECK(strcmp(dlock_version(), DLOCK_VERSION) == 0);
}

static void open_bad_input(void)
{
    dlock_client *c = (dlock_client *)1;
    dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;

    CHECK_RC(dlock_client_open(&c, NULL, NULL), DLOCK_EINVAL);
    CHECK(c == NULL);
    CHECK_RC(dlock_client_open(NULL, "redis://h", NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_client_open(&c, "memcached://h", NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "memcached");
    /* TLS settings are checked before any I/O; never clear text where
     * TLS was asked for (redis:// or redlock without tls=1). */
    CHECK_RC(dlock_client_open(&c, "rediss://h:6380?cert=/c.pem", NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "both cert=FILE and key=FILE");
    CHECK_RC(dlock_client_open(&c, "redis://h:6380?cacert=/ca.pem", NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "use rediss://");
    CHECK_RC(dlock_client_open(&c, "rediss://h:6380?insecure=yes", NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "insecure must be 0 or 1");
    CHECK_RC(dlock_client_open(&c, "rediss://h:6380?insecure=1&cacert=/ca.pem", NULL),
             DLOCK_EINVAL);
    CHECK_RC(dlock_client_open(&c, "rediss://h:6380?cacert=", NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_client_open(&c, "rediss://h:6380?tls=1", NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "cacert, cert, key, sni, insecure");
    CHECK_RC(dlock_client_open(&c, "redlock://a:1,b:2,c:3?cacert=/ca.pem", NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "add tls=1");
    CHECK_RC(dlock_client_open(&c, "redlock://a:1,b:2,c:3?tls=yes", NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_client_open(&c, "redlock://a:1,b:2,c:3?tls=1&key=/k.pem", NULL),
             DLOCK_EINVAL);
    CHECK_RC(dlock_client_open(&c, "redis://a:1,b:2", NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_client_open(&c, "redis://", NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "one host");
    CHECK_RC(dlock_client_open(&c, "redis://h/x", NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_client_open(&c, "redis://h?tls=1", NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_client_open(&c, "unix://host/sock", NULL), DLOCK_EINVAL);
    o.version = 99;
    CHECK_RC(dlock_client_open(&c, "redis://h", &o), DLOCK_EINVAL);
    o.version = DLOCK_CLIENT_OPTIONS_VERSION;
    o.command_timeout_ms = 0;
    CHECK_RC(dlock_client_open(&c, "redis://h", &o), DLOCK_EINVAL);
    o.command_timeout_ms = 100;
    o.client_name = "bad name";
    CHECK_RC(dlock_client_open(&c, "redis://h", &o), DLOCK_EINVAL);
    CHECK(c == NULL);
    dlock_client_free(NULL);
    CHECK_RC(dlock_release(NULL), DLOCK_OK);
}

static void unreachable_is_econn_with_timeout(void)
{
    dlock_client *c = NULL;
    dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;

    o.connect_timeout_ms = 300;
    CHECK_RC(dlock_client_open(&c, "redis://127.0.0.1:1", &o), DLOCK_ECONN);
    CHECK_CONTAINS(dlock_error_message(), "127.0.0.1:1");
    CHECK_RC(dlock_client_open(&c, "unix:///nonexistent/redis.sock", &o), DLOCK_ECONN);
    CHECK_CONTAINS(dlock_error_message(), "/nonexistent/redis.sock");
}

/* The lease clock is CLOCK_BOOTTIME, which goes on counting through a
 * suspend (CLOCK_MONOTONIC stops), and dlock__clock_advance_ms moves it as a
 * suspend would: forward, and only it. */
static void lease_clock_is_boottime(void)
{
    struct timespec ts;
    int64_t boot_ms, lease_ms, mono_ms;

    clock_gettime(CLOCK_BOOTTIME, &ts);
    boot_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    lease_ms = dlock__now_ms();
    CHECK(lease_ms >= boot_ms && lease_ms - boot_ms < 1000);

    clock_gettime(CLOCK_MONOTONIC, &ts);
    mono_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    dlock__clock_advance_ms(3600 * 1000);
    CHECK(dlock__now_ms() - lease_ms >= 3600 * 1000);
    CHECK(dlock__now_ms() - lease_ms < 3600 * 1000 + 1000);
    clock_gettime(CLOCK_MONOTONIC, &ts);
    CHECK((int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 - mono_ms < 1000);
}

/* The _init calls give what the _INIT macros give, for callers that cannot
 * use them; versions are checked. */
static void options_init_calls(void)
{
    const dlock_client_options cm = DLOCK_CLIENT_OPTIONS_INIT;
    const dlock_acquire_options am = DLOCK_ACQUIRE_OPTIONS_INIT;
    dlock_client_options c;
    dlock_acquire_options a;

    memset(&c, 0x5a, sizeof(c));
    memset(&a, 0x5a, sizeof(a));
    CHECK_RC(dlock_client_options_init(&c, DLOCK_CLIENT_OPTIONS_VERSION), DLOCK_OK);
    CHECK(c.version == cm.version && c.connect_timeout_ms == cm.connect_timeout_ms &&
          c.command_timeout_ms == cm.command_timeout_ms && c.key_prefix == NULL &&
          c.client_name == NULL && c.log == NULL && c.log_payload == NULL &&
          c.log_level == DLOCK_LOG_INFO && c.trace == NULL && c.trace_payload == NULL);
    /* A version 2 caller's struct ends before log_level. */
    memset(&c, 0x5a, sizeof(c));
    CHECK_RC(dlock_client_options_init(&c, 2), DLOCK_OK);
    CHECK(c.version == 2 && c.log == NULL && *(unsigned char *)&c.log_level == 0x5a);
    /* A version 1 caller's struct ends before log: init leaves it alone. */
    memset(&c, 0x5a, sizeof(c));
    CHECK_RC(dlock_client_options_init(&c, 1), DLOCK_OK);
    CHECK(c.version == 1 && c.client_name == NULL && *(unsigned char *)&c.log == 0x5a);
    memset(&a, 0x5a, sizeof(a));
    CHECK_RC(dlock_acquire_options_init(&a, 1), DLOCK_OK);
    CHECK(a.version == 1 && a.permits == 0 && *(unsigned char *)&a.label == 0x5a);
    CHECK_RC(dlock_acquire_options_init(&a, DLOCK_ACQUIRE_OPTIONS_VERSION), DLOCK_OK);
    CHECK(a.version == am.version && a.wait_ms == am.wait_ms && a.lease_ms == am.lease_ms &&
          a.auto_renew == am.auto_renew && a.on_lost == NULL && a.payload == NULL &&
          a.kind == am.kind && a.owner == NULL && a.reentrant == 0 && a.permits == 0 &&
          a.label == NULL);
    CHECK_RC(dlock_acquire_options_init(&a, 0), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "version 0");
    CHECK_RC(dlock_acquire_options_init(&a, DLOCK_ACQUIRE_OPTIONS_VERSION + 1), DLOCK_EINVAL);
    CHECK_RC(dlock_client_options_init(NULL, 1), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "NULL");
}

/* dlock_backend_register refuses what it cannot serve, naming what is
 * wrong; a good table is served from then on (its scheme then taken). The
 * plainredis backend of tests/backend passes the conformance suite
 * (core-plainredis.*). */
static int ok_open(void **out, const dlock_url *url, const dlock_client_options *opts)
{
    (void)url, (void)opts;
    *out = NULL;
    return dlock_backend_fail(DLOCK_ECONN, "unit backend: no server here");
}
static void ok_close(void *be) { (void)be; }
static int ok_req(void *be, const dlock_request *req) { (void)be, (void)req; return 0; }
static int ok_acquire(void *be, const dlock_request *req, void *w, dlock_acquire_result *o)
{
    (void)be, (void)req, (void)w, (void)o;
    return 0;
}
static int ok_renew(void *be, dlock_renewal *items, size_t n) { (void)be, (void)items, (void)n; return 0; }
static int ok_watch_begin(void *be, const dlock_request *req, void **w)
{
    (void)be, (void)req, (void)w;
    return 0;
}
static int ok_watch_wait(void *be, void *w, int64_t t) { (void)be, (void)w, (void)t; return 0; }
static void ok_watch_end(void *be, void *w) { (void)be, (void)w; }
static int ok_status(void *be, const char *n, dlock_lock_info *o) { (void)be, (void)n, (void)o; return 0; }

static void backend_register_checks(void)
{
    static const char *const schemes[] = {"unitlock", NULL, NULL};
    dlock_backend b = {DLOCK_BACKEND_VERSION, sizeof(dlock_backend), "unit", schemes,
                       DLOCK_CAP_KIND(DLOCK_KIND_MUTEX), ok_open, ok_close, ok_acquire, ok_req,
                       ok_req, ok_req, ok_renew, ok_watch_begin, ok_watch_wait, ok_watch_end,
                       ok_watch_end, ok_status, ok_status, NULL, NULL, NULL, NULL, NULL, NULL,
                       NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    dlock_backend bad = b;
    dlock_client *c = NULL;

    CHECK_RC(dlock_backend_register(NULL, &b), DLOCK_EINVAL);
    CHECK_RC(dlock_backend_register("unitlock", NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_backend_register("Bad Scheme", &b), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "lower case");
    CHECK_RC(dlock_backend_register("redis", &b), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "already served");
    bad.version = DLOCK_BACKEND_VERSION + 1;
    CHECK_RC(dlock_backend_register("unitlock", &bad), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "built for version");
    bad = b;
    bad.caps = DLOCK_CAP_KIND(DLOCK_KIND_SEMAPHORE);
    CHECK_RC(dlock_backend_register("unitlock", &bad), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "DLOCK_KIND_MUTEX");
    bad.caps |= DLOCK_CAP_KIND(DLOCK_KIND_MUTEX);
    CHECK_RC(dlock_backend_register("unitlock", &bad), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "set_permits");
    bad = b;
    bad.renew = NULL;
    CHECK_RC(dlock_backend_register("unitlock", &bad), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "every call");
    /* Not yet registered: not known. */
    CHECK_RC(dlock_client_open(&c, "unitlock://h", NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "not known");
    CHECK_RC(dlock_backend_register("unitlock", &b), DLOCK_OK);
    /* Served now: its open runs (and fails, with its own message). */
    CHECK_RC(dlock_client_open(&c, "unitlock://h", NULL), DLOCK_ECONN);
    CHECK_CONTAINS(dlock_error_message(), "unit backend: no server here");
    CHECK(c == NULL);
    CHECK_RC(dlock_backend_register("unitlock", &b), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "already served");
}

/* The holder record an acquisition stores, read back as status shows it. */
static void holder_records(void)
{
    dlock_lock_info info;
    static const char *const bad[] = {"", "host", "host 12", "host x 5", "host 12 x", " 12 5",
                                      "host 12 5 \x01", "host 12 5 caf\xc3\xa9",
                                      "host -1 5", "h\xffst 1 2"};

    memset(&info, 0, sizeof(info));
    CHECK_RC(dlock_holder_parse(&info, "web-1 4242 1700000000123", 24), DLOCK_OK);
    CHECK(info.has_holder && strcmp(info.host, "web-1") == 0 && info.pid == 4242 &&
          info.start_ms == 1700000000123LL && info.label[0] == '\0');
    const char *labelled = "db.example 7 8 nightly backup: all tables";
    CHECK_RC(dlock_holder_parse(&info, labelled, strlen(labelled)), DLOCK_OK);
    CHECK(strcmp(info.host, "db.example") == 0 && info.pid == 7 && info.start_ms == 8 &&
          strcmp(info.label, "nightly backup: all tables") == 0);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (dlock_holder_parse(&info, bad[i], strlen(bad[i])) != DLOCK_EPROTO || info.has_holder ||
            info.host[0] != '\0' || info.label[0] != '\0') {
            fprintf(stderr, "holder record '%s' accepted\n", bad[i]);
            exit(1);
        }
    }
    /* Labels are checked before any network call. */
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;
    dlock_lock *l = NULL;
    char longer[DLOCK_LABEL_MAX + 2];
    memset(longer, 'a', sizeof(longer) - 1);
    longer[sizeof(longer) - 1] = '\0';
    const char *const bad_labels[] = {"", "tab\there", "caf\xc3\xa9", longer};
    for (size_t i = 0; i < sizeof(bad_labels) / sizeof(bad_labels[0]); i++) {
        o.label = bad_labels[i];
        CHECK_RC(dlock_acquire(&l, (dlock_client *)&o, "x", &o), DLOCK_EINVAL);
        CHECK_CONTAINS(dlock_error_message(), "label");
    }
}

/* The record an acquisition writes reads back as this process: its host,
 * pid and start, the label after them. */
static void holder_record_written(void)
{
    char host[DLOCK_HOST_MAX + 1] = "";
    dlock_lock_info info;
    struct timespec now;
    char *rec;

    CHECK(gethostname(host, sizeof(host)) == 0);
    clock_gettime(CLOCK_REALTIME, &now);
    for (int i = 0; i < 2; i++) {
        const char *label = i == 0 ? NULL : "nightly payout";

        rec = dlock__holder_new(label);
        CHECK(rec != NULL);
        memset(&info, 0, sizeof(info));
        CHECK_RC(dlock_holder_parse(&info, rec, strlen(rec)), DLOCK_OK);
        CHECK(strcmp(info.host, host) == 0 && info.pid == (int64_t)getpid());
        CHECK(info.start_ms >= (int64_t)now.tv_sec * 1000 &&
              info.start_ms <= (int64_t)now.tv_sec * 1000 + 60000);
        CHECK(strcmp(info.label, label != NULL ? label : "") == 0);
        free(rec);
    }
}

/* dlock__fmt_ll writes what snprintf("%lld") does, at both ends too. */
static void fmt_numbers(void)
{
    static const long long v[] = {0, 7, -1, 9, 10, -10, 30000, 1700000000123LL, LLONG_MAX,
                                  LLONG_MIN, LLONG_MIN + 1};
    char got[DLOCK__FMT_LL_MAX + 1], want[32];

    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        size_t n = dlock__fmt_ll(got, v[i]);

        snprintf(want, sizeof(want), "%lld", v[i]);
        if (strcmp(got, want) != 0 || n != strlen(want)) {
            fprintf(stderr, "dlock__fmt_ll(%s) wrote '%s' (%zu)\n", want, got, n);
            exit(1);
        }
    }
}

#define FORK_TOKENS 64 /* 1 KB of randomness: past the pool's 512 bytes */

/* Tokens come from a pool of the kernel's bytes: a child of fork must not
 * hand out the ones its parent does, and none may repeat. */
static void tokens_fresh_across_fork(void)
{
    char mine[FORK_TOKENS][DLOCK__TOKEN_LEN + 1], theirs[FORK_TOKENS][DLOCK__TOKEN_LEN + 1];
    int fds[2];
    pid_t pid;
    int status;

    /* The pool is full and mostly unused when fork copies it. */
    CHECK_RC(dlock__token_new(mine[0]), DLOCK_OK);
    CHECK(pipe(fds) == 0);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        for (int i = 0; i < FORK_TOKENS; i++)
            if (dlock__token_new(theirs[i]) != DLOCK_OK ||
                write(fds[1], theirs[i], DLOCK__TOKEN_LEN) != DLOCK__TOKEN_LEN)
                _exit(1);
        _exit(0);
    }
    close(fds[1]);
    for (int i = 1; i < FORK_TOKENS; i++)
        CHECK_RC(dlock__token_new(mine[i]), DLOCK_OK);
    for (int i = 0; i < FORK_TOKENS; i++) {
        size_t got = 0;

        while (got < DLOCK__TOKEN_LEN) {
            ssize_t n = read(fds[0], theirs[i] + got, DLOCK__TOKEN_LEN - got);
            CHECK(n > 0);
            got += (size_t)n;
        }
        theirs[i][DLOCK__TOKEN_LEN] = '\0';
    }
    close(fds[0]);
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    for (int i = 0; i < FORK_TOKENS; i++) {
        CHECK(strlen(mine[i]) == DLOCK__TOKEN_LEN &&
              strspn(mine[i], "0123456789abcdef") == DLOCK__TOKEN_LEN);
        for (int j = 0; j < FORK_TOKENS; j++) {
            if (strcmp(mine[i], theirs[j]) == 0 || (j > i && strcmp(mine[i], mine[j]) == 0) ||
                (j > i && strcmp(theirs[i], theirs[j]) == 0)) {
                fprintf(stderr, "token %s handed out twice\n", mine[i]);
                exit(1);
            }
        }
    }
}

/* Stats: the version is checked, and NULL refused. */
static void stats_bad_input(void)
{
    dlock_stats st = DLOCK_STATS_INIT;

    CHECK_RC(dlock_client_stats(NULL, NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_client_stats(&st, NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_list(NULL, "", NULL, NULL), DLOCK_EINVAL);
}

/* dlock_stats_format (issue 32, item 7): JSON and Prometheus' text format
 * of a hand-filled dlock_stats, line by line; snprintf's contract (measure
 * with NULL, cut and NUL-terminated when short); the refusals. */
static void stats_format(void)
{
    dlock_stats st = DLOCK_STATS_INIT;
    static char buf[16384];
    char small[20];
    int n;

    st.acquires = 3;
    st.busy = 2;
    st.waits = 1;
    st.renewals = 5;
    st.renew_failures = 1;
    st.round_trip_us[0] = 1; /* under 1 us */
    st.round_trip_us[1] = 2; /* 1 us */
    st.round_trip_us[3] = 4; /* 4..7 us */
    st.round_trip_us[DLOCK_STATS_BUCKETS - 1] = 1; /* longer than any le */
    st.wait_us[11] = 1; /* 1024..2047 us */
    st.round_trip_us_sum = 274877906999ULL;
    st.wait_us_sum = 1500;

    n = dlock_stats_format(buf, sizeof buf, &st, "redis", DLOCK_STATS_PROMETHEUS);
    CHECK(n > 0 && (size_t)n < sizeof buf && strlen(buf) == (size_t)n);
    CHECK(strncmp(buf, "# HELP dlock_acquires_total ", 28) == 0);
    CHECK(strstr(buf, "\n# TYPE dlock_acquires_total counter\n"
                      "dlock_acquires_total{backend=\"redis\"} 3\n") != NULL);
    CHECK(strstr(buf, "\ndlock_renew_failures_total{backend=\"redis\"} 1\n") != NULL);
    CHECK(strstr(buf, "\ndlock_losses_total{backend=\"redis\"} 0\n") != NULL);
    CHECK(strstr(buf, "\n# TYPE dlock_round_trip_seconds histogram\n"
                      "dlock_round_trip_seconds_bucket{backend=\"redis\",le=\"0.000001\"} 1\n"
                      "dlock_round_trip_seconds_bucket{backend=\"redis\",le=\"0.000002\"} 3\n"
                      "dlock_round_trip_seconds_bucket{backend=\"redis\",le=\"0.000004\"} 3\n"
                      "dlock_round_trip_seconds_bucket{backend=\"redis\",le=\"0.000008\"} 7\n") != NULL);
    /* the last finite bucket, 2^38 us; the longer time only in +Inf */
    CHECK(strstr(buf, "\ndlock_round_trip_seconds_bucket{backend=\"redis\",le=\"274877.906944\"} 7\n"
                      "dlock_round_trip_seconds_bucket{backend=\"redis\",le=\"+Inf\"} 8\n"
                      "dlock_round_trip_seconds_sum{backend=\"redis\"} ") != NULL);
    CHECK(strstr(buf, "\ndlock_wait_seconds_bucket{backend=\"redis\",le=\"0.001024\"} 0\n"
                      "dlock_wait_seconds_bucket{backend=\"redis\",le=\"0.002048\"} 1\n") != NULL);
    CHECK(strstr(buf, "\ndlock_wait_seconds_bucket{backend=\"redis\",le=\"+Inf\"} 1\n"
                      "dlock_wait_seconds_sum{backend=\"redis\"} 0.001500\n"
                      "dlock_wait_seconds_count{backend=\"redis\"} 1\n") != NULL);
    CHECK(strstr(buf, "\ndlock_round_trip_seconds_sum{backend=\"redis\"} 274877.906999\n"
                      "dlock_round_trip_seconds_count{backend=\"redis\"} 8\n") != NULL);
    CHECK(buf[n - 1] == '\n');
    /* measured without a buffer: the same length */
    CHECK(dlock_stats_format(NULL, 0, &st, "redis", DLOCK_STATS_PROMETHEUS) == n);
    /* too small: cut, NUL-terminated, nothing past size, the whole length */
    memset(small, 'x', sizeof small);
    CHECK(dlock_stats_format(small, 16, &st, "redis", DLOCK_STATS_PROMETHEUS) == n);
    CHECK(small[15] == '\0' && strncmp(small, buf, 15) == 0 && small[16] == 'x');
    CHECK(dlock_stats_format(small, 1, &st, "redis", DLOCK_STATS_PROMETHEUS) == n);
    CHECK(small[0] == '\0');

    /* without a backend: no label, or le alone */
    n = dlock_stats_format(buf, sizeof buf, &st, NULL, DLOCK_STATS_PROMETHEUS);
    CHECK(n > 0 && strstr(buf, "\ndlock_acquires_total 3\n") != NULL);
    CHECK(strstr(buf, "\ndlock_wait_seconds_bucket{le=\"+Inf\"} 1\n"
                      "dlock_wait_seconds_sum 0.001500\n"
                      "dlock_wait_seconds_count 1\n") != NULL);
    /* a label value escaped */
    n = dlock_stats_format(buf, sizeof buf, &st, "a\"b\\c\nd", DLOCK_STATS_PROMETHEUS);
    CHECK(n > 0 && strstr(buf, "\ndlock_busy_total{backend=\"a\\\"b\\\\c\\nd\"} 2\n") != NULL);

    n = dlock_stats_format(buf, sizeof buf, &st, "redis", DLOCK_STATS_JSON);
    CHECK(n > 0 && (size_t)n < sizeof buf && strlen(buf) == (size_t)n);
    CHECK(strncmp(buf,
                  "{\"backend\":\"redis\",\"acquires\":3,\"busy\":2,\"waits\":1,\"handoffs\":0,"
                  "\"renewals\":5,\"renew_failures\":1,\"losses\":0,"
                  "\"round_trip_us\":[1,2,0,4,0,0,",
                  136) == 0);
    CHECK(strstr(buf, ",0,0,1],\"wait_us\":[0,0,0,0,0,0,0,0,0,0,0,1,0,") != NULL);
    CHECK(strstr(buf, ",0]," "\"round_trip_us_sum\":274877906999,\"wait_us_sum\":1500}\n") ==
          buf + n - 57);
    CHECK(strchr(buf, '\n') == buf + n - 1);
    CHECK(dlock_stats_format(NULL, 0, &st, "redis", DLOCK_STATS_JSON) == n);
    n = dlock_stats_format(buf, sizeof buf, &st, "a\"\x01", DLOCK_STATS_JSON);
    CHECK(n > 0 && strncmp(buf, "{\"backend\":\"a\\\"\\u0001\",\"acquires\":3,", 36) == 0);
    n = dlock_stats_format(buf, sizeof buf, &st, NULL, DLOCK_STATS_JSON);
    CHECK(n > 0 && strncmp(buf, "{\"acquires\":3,", 14) == 0);

    CHECK(dlock_stats_format(buf, sizeof buf, NULL, "redis", DLOCK_STATS_JSON) == -1);
    CHECK(dlock_stats_format(buf, sizeof buf, &st, "redis", 0) == -1);
    CHECK(dlock_stats_format(buf, sizeof buf, &st, "redis", 3) == -1);
    /* A version 1 dlock_stats has no sums: none written, none read. */
    st.version = 1;
    n = dlock_stats_format(buf, sizeof buf, &st, "redis", DLOCK_STATS_PROMETHEUS);
    CHECK(n > 0 && strstr(buf, "_sum") == NULL &&
          strstr(buf, "\ndlock_wait_seconds_count{backend=\"redis\"} 1\n") != NULL);
    n = dlock_stats_format(buf, sizeof buf, &st, "redis", DLOCK_STATS_JSON);
    CHECK(n > 0 && strstr(buf, "_sum") == NULL && strcmp(buf + n - 5, ",0]}\n") == 0);
    st.version = 0;
    CHECK(dlock_stats_format(buf, sizeof buf, &st, "redis", DLOCK_STATS_JSON) == -1);
}

/* etcd revisions become fences (uint64_t): only 0..INT64_MAX is one. A
 * revision past INT64_MAX, or negative (which the cast would turn into one
 * past it), makes the key malformed. */
static void etcd_revision_range(void)
{
    static const struct {
        const char *rev;
        int want;
    } rows[] = {{"\"7\"", 1},
                {"\"9223372036854775807\"", 1},
                {"\"9223372036854775808\"", -1},
                {"\"18446744073709551615\"", -1},
                {"\"-1\"", -1},
                {"-1", -1},
                {"18446744073709551615", -1}};

    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        char text[256];
        json_error_t err;
        json_t *reply;
        dlock__etcd_kv kv;
        int got;

        snprintf(text, sizeof(text), "{\"kvs\": [{\"key\": \"YQ==\", \"create_revision\": %s}]}",
                 rows[i].rev);
        reply = json_loads(text, 0, &err);
        got = reply != NULL ? dlock__etcd_kv_at(reply, 0, &kv) : -1;
        fprintf(stderr, "create_revision %s -> %d\n", rows[i].rev, got);
        CHECK(got == rows[i].want);
        if (got == 1)
            free(kv.key);
        json_decref(reply);
    }
}

/* Which etcd versions answer a keepalive only as the leader (the fix of
 * etcd-io/etcd#15247): 3.4.25, 3.5.8 and later; a pre-release of those, an
 * older release and anything that is not a version are taken for old. */
static void etcd_version_fixed(void)
{
    static const char *const fixed[] = {"3.4.25", "3.4.26", "3.4.37", "3.5.8", "3.5.21",
                                        "3.6.0",  "3.6.0-alpha.0", "3.7.1", "4.0.0",
                                        "3.5.8+git", "3.10.0"};
    static const char *const old[] = {"3.4.23", "3.4.24", "3.4.0", "3.5.7", "3.5.0", "3.3.27",
                                      "3.2.32", "2.3.8", "3.4.25-rc.0", "3.5.8-rc.1", "",
                                      "garbage", "3", "3.5", "3.5.", "3.5.x", ".5.8", "3..8",
                                      "3.5.8 ", "v3.5.8", "3.5.8.1", "9999999.0.0",
                                      "3.5.99999999"};

    CHECK(!dlock__etcd_version_fixed(NULL));
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
        if (!dlock__etcd_version_fixed(fixed[i])) {
            fprintf(stderr, "%s taken for old\n", fixed[i]);
            CHECK(0);
        }
    for (size_t i = 0; i < sizeof(old) / sizeof(old[0]); i++)
        if (dlock__etcd_version_fixed(old[i])) {
            fprintf(stderr, "%s taken for fixed\n", old[i]);
            CHECK(0);
        }
}

/* ---- etcd's gRPC transcoder (etcd_grpc.c) ------------------------------- */

/* The method of a gateway path: its request or reply type. */
static const ProtobufCMessageDescriptor *grpc_type(const char *path, int reply)
{
    char grpc_path[128];
    const ProtobufCMethodDescriptor *m = dlock__etcd_grpc_method(path, grpc_path,
                                                                 sizeof(grpc_path));

    CHECK(m != NULL);
    return reply ? m->output : m->input;
}

/* JSON text -> framed protobuf bytes. */
static void grpc_pack_text(const char *path, const char *text, uint8_t **buf, size_t *len)
{
    char err[200] = "";
    int rc = dlock__etcd_grpc_body(grpc_type(path, 0), text, 0, buf, len, err, sizeof(err));

    if (rc != 0)
        fprintf(stderr, "%s: %s\n", text, err);
    CHECK(rc == 0);
}

/* The wire bytes of requests, as protoc would write them: these are what
 * etcd itself reads (the integration tests run on them). */
static void etcd_grpc_wire_bytes(void)
{
    static const struct {
        const char *path, *json;
        size_t len;
        const char *bytes;
    } rows[] = {
        /* key = 1 (bytes "a"), value = 2 (bytes "b") */
        {"/v3/kv/put", "{\"key\":\"YQ==\",\"value\":\"Yg==\"}", 11,
         "\x00\x00\x00\x00\x06\x0a\x01\x61\x12\x01\x62"},
        /* TTL = 1, ID = 2, int64 as a string or a number */
        {"/v3/lease/grant", "{\"TTL\":\"5\",\"ID\":7}", 9, "\x00\x00\x00\x00\x04\x08\x05\x10\x07"},
        /* two keepalives of a stream, one frame each */
        {"/v3/lease/keepalive", "{\"ID\":\"1\"}{\"ID\":\"300\"}", 15,
         "\x00\x00\x00\x00\x02\x08\x01\x00\x00\x00\x00\x03\x08\xac\x02"},
        /* an empty message: a frame of length 0 */
        {"/v3/kv/range", "{}", 5, "\x00\x00\x00\x00\x00"},
        /* enum by name: WatchCreateRequest.filters NOPUT = 0, packed */
        {"/v3/watch", "{\"create_request\":{\"key\":\"YQ==\",\"filters\":[\"NODELETE\"]}}", 13,
         "\x00\x00\x00\x00\x08\x0a\x06\x0a\x01\x61\x2a\x01\x01"},
    };

    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        uint8_t *buf = NULL;
        size_t len = 0;
        grpc_pack_text(rows[i].path, rows[i].json, &buf, &len);
        fprintf(stderr, "%s %s: %zu bytes\n", rows[i].path, rows[i].json, len);
        for (size_t k = 0; k < len; k++)
            fprintf(stderr, "%02x", buf[k]);
        fprintf(stderr, "\n");
        CHECK(len == rows[i].len);
        CHECK(memcmp(buf, rows[i].bytes, len) == 0);
        free(buf);
    }
}

/* Request JSON -> protobuf -> JSON as the gateway writes it: int64 as
 * strings, enums by name, zeros left out, but a oneof member that is set
 * is there even at zero. */
static void etcd_grpc_gateway_mapping(void)
{
    static const char *const txn =
        "{\"compare\":[{\"key\":\"YQ==\",\"target\":\"CREATE\",\"result\":\"EQUAL\","
        "\"create_revision\":0}],"
        "\"success\":[{\"request_put\":{\"key\":\"YQ==\",\"value\":\"\",\"lease\":\"42\"}}],"
        "\"failure\":[{\"request_range\":{\"key\":\"YQ==\",\"limit\":1,\"keys_only\":false}}]}";
    static const char *const want =
        "{\"compare\":[{\"key\":\"YQ==\",\"target\":\"CREATE\",\"create_revision\":\"0\"}],"
        "\"success\":[{\"request_put\":{\"key\":\"YQ==\",\"lease\":\"42\"}}],"
        "\"failure\":[{\"request_range\":{\"key\":\"YQ==\",\"limit\":\"1\"}}]}";
    const ProtobufCMessageDescriptor *d = grpc_type("/v3/kv/txn", 0);
    json_error_t jerr;
    json_t *in = json_loads(txn, 0, &jerr), *expect = json_loads(want, 0, &jerr), *out;
    char err[200] = "";
    ProtobufCMessage *m = dlock__etcd_pb_from_json(d, in, err, sizeof(err));
    uint8_t *buf;
    size_t len;
    ProtobufCMessage *back;
    char *text;

    CHECK(m != NULL);
    len = protobuf_c_message_get_packed_size(m);
    buf = malloc(len + 1);
    CHECK(buf != NULL);
    protobuf_c_message_pack(m, buf);
    back = protobuf_c_message_unpack(d, NULL, len, buf);
    CHECK(back != NULL);
    out = dlock__etcd_pb_to_json(back);
    text = json_dumps(out, JSON_COMPACT | JSON_SORT_KEYS);
    fprintf(stderr, "got  %s\n", text);
    CHECK(json_equal(out, expect));
    free(text);
    json_decref(out);
    dlock__etcd_pb_free(back, 0);
    dlock__etcd_pb_free(m, 1);
    free(buf);
    json_decref(in);
    json_decref(expect);

    /* A reply: the helpers of etcd_codec.h read the transcoded JSON. */
    {
        static const char *const range =
            "{\"header\":{\"revision\":\"12\"},\"kvs\":[{\"key\":\"YQ==\",\"create_revision\":\"3\","
            "\"mod_revision\":\"9223372036854775807\",\"lease\":\"99\"}],\"count\":\"1\","
            "\"more\":false}";
        const ProtobufCMessageDescriptor *rd = grpc_type("/v3/kv/range", 1);
        dlock__etcd_kv kv;

        in = json_loads(range, 0, &jerr);
        m = dlock__etcd_pb_from_json(rd, in, err, sizeof(err));
        CHECK(m != NULL);
        out = dlock__etcd_pb_to_json(m);
        CHECK(json_object_get(out, "more") == NULL);
        CHECK(dlock__etcd_revision(out) == 12);
        CHECK(dlock__etcd_kv_at(out, 0, &kv) == 1);
        CHECK(kv.key_len == 1 && kv.key[0] == 'a' && kv.create_revision == 3 &&
              kv.mod_revision == INT64_MAX && kv.lease == 99);
        free(kv.key);
        json_decref(out);
        json_decref(in);
        dlock__etcd_pb_free(m, 0);
    }
}

/* What does not fit the message is refused, naming the field. */
static void etcd_grpc_bad_requests(void)
{
    static const struct {
        const char *path, *json, *named;
    } rows[] = {
        {"/v3/kv/put", "{\"kye\":\"YQ==\"}", "kye"},
        {"/v3/kv/put", "{\"key\":\"not base64!\"}", "key"},
        {"/v3/kv/put", "{\"lease\":\"99999999999999999999\"}", "lease"},
        {"/v3/kv/put", "{\"lease\":\"12x\"}", "lease"},
        {"/v3/kv/put", "{\"prev_kv\":1}", "prev_kv"},
        {"/v3/kv/range", "{\"limit\":{}}", "limit"},
        {"/v3/kv/range", "{\"sort_order\":\"SIDEWAYS\"}", "sort_order"},
        {"/v3/kv/txn", "{\"compare\":{}}", "compare"},
        {"/v3/kv/txn", "{\"compare\":[{\"version\":1,\"mod_revision\":2}]}", "mod_revision"},
        {"/v3/kv/txn", "{\"success\":[{\"request_put\":{\"key\":7}}]}", "key"},
        {"/v3/lease/revoke", "[]", "object"},
        {"/v3/lease/revoke", "{\"ID\":", "JSON"},
    };

    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        uint8_t *buf = NULL;
        size_t len = 0;
        char err[200] = "";
        int rc = dlock__etcd_grpc_body(grpc_type(rows[i].path, 0), rows[i].json, 0, &buf, &len,
                                       err, sizeof(err));
        fprintf(stderr, "%s -> %d: %s\n", rows[i].json, rc, err);
        CHECK(rc == -1 && buf == NULL);
        CHECK_CONTAINS(err, rows[i].named);
    }
    CHECK(dlock__etcd_grpc_method("/v3/nothing", (char[64]){0}, 64) == NULL);
}

/* Frames and the status lines of the headers and trailers. */
static void etcd_grpc_framing(void)
{
    static const uint8_t two[] = {0, 0, 0, 0, 1, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0x08};
    static const uint8_t zipped[] = {1, 0, 0, 0, 1, 0x08};
    const uint8_t *msg;
    size_t pos = 0, n;
    int status = -1;
    char text[64] = "";

    CHECK(dlock__etcd_grpc_frame(two, sizeof(two), &pos, 100, &msg, &n) == 1);
    CHECK(n == 1 && msg == two + 5 && pos == 6);
    CHECK(dlock__etcd_grpc_frame(two, sizeof(two), &pos, 100, &msg, &n) == 1);
    CHECK(n == 0 && pos == 11);
    /* a frame of which 3 of 2+5 bytes came: not yet */
    CHECK(dlock__etcd_grpc_frame(two, sizeof(two), &pos, 100, &msg, &n) == 0 && pos == 11);
    pos = 0;
    CHECK(dlock__etcd_grpc_frame(zipped, sizeof(zipped), &pos, 100, &msg, &n) == -1);
    pos = 11;
    CHECK(dlock__etcd_grpc_frame(two, sizeof(two), &pos, 1, &msg, &n) == -1);

    CHECK(dlock__etcd_grpc_header("grpc-status: 14\r\n", 17, &status, text, sizeof(text)) == 1);
    CHECK(status == 14);
    CHECK(dlock__etcd_grpc_header("Grpc-Message: etcdserver:%20no%20leader\r\n", 41, &status,
                                  text, sizeof(text)) == 1);
    CHECK(strcmp(text, "etcdserver: no leader") == 0);
    CHECK(dlock__etcd_grpc_header("grpc-status: x\r\n", 16, &status, text, sizeof(text)) == 1);
    CHECK(status == 2);
    CHECK(dlock__etcd_grpc_header("content-type: application/grpc\r\n", 32, &status, text,
                                  sizeof(text)) == 0);
}

/* A grant popped from a waiter's list (redis_listen.c): the lock counts
 * from the bound, for the confirm window (the key's PX) or the lease when
 * shorter, and a grant whose bound leaves under a quarter of that, or a
 * longer lease nothing will renew, is confirmed by a try instead. */
static void listen_grant_lease(void)
{
    static const struct {
        int64_t lease_ms, age_ms; /* age: how long ago the bound was */
        int auto_renew, taken;
        int64_t deadline_from_bound; /* lease_from + lease - bound */
    } rows[] = {
        {10000, 100, 1, 1, DLOCK__REDIS_HANDOFF_CONFIRM_MS},
        {10000, 1000, 1, 1, DLOCK__REDIS_HANDOFF_CONFIRM_MS},
        {10000, 1600, 1, 0, 0}, /* 400 ms left of 2,000 */
        {10000, 100, 0, 0, 0},  /* the window would be its whole lease */
        {1500, 100, 0, 1, 1500},
        {1500, 1200, 0, 0, 0},  /* 300 ms left of 1,500 */
        {1500, 1000, 1, 1, 1500},
    };

    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        dlock__redis_watch w = {0};
        dlock_request req = {0};
        dlock_acquire_result out = {0};
        int64_t now = dlock__now_ms();

        w.bound_ms = now - rows[i].age_ms;
        w.granted = 41;
        w.leave = 1;
        req.lease_ms = rows[i].lease_ms;
        req.auto_renew = rows[i].auto_renew;
        out.lease_from_ms = now;
        CHECK(dlock__redis_listen_granted(&w, &req, &out) == rows[i].taken);
        CHECK(w.granted == 0); /* taken, or left to the try */
        if (rows[i].taken) {
            CHECK(out.fence == 41 && out.handed == 1 && w.leave == 0);
            CHECK(out.lease_from_ms + req.lease_ms - w.bound_ms == rows[i].deadline_from_bound);
        } else {
            CHECK(out.fence == 0 && out.lease_from_ms == now && w.leave == 1);
        }
    }
}

TEST_MAIN({"url_redis_full", url_redis_full, NULL}, {"url_forms", url_forms, NULL}, {"url_bad", url_bad, NULL},
          {"url_password_never_in_messages", url_password_never_in_messages, NULL},
          {"url_query_secrets_redacted", url_query_secrets_redacted, NULL},
          {"url_huge", url_huge, NULL}, {"duration", duration, NULL}, {"error_table", error_table, NULL},
          {"open_bad_input", open_bad_input, NULL},
          {"etcd_revision_range", etcd_revision_range, NULL},
          {"etcd_version_fixed", etcd_version_fixed, NULL},
          {"etcd_grpc_wire_bytes", etcd_grpc_wire_bytes, NULL},
          {"etcd_grpc_gateway_mapping", etcd_grpc_gateway_mapping, NULL},
          {"etcd_grpc_bad_requests", etcd_grpc_bad_requests, NULL},
          {"etcd_grpc_framing", etcd_grpc_framing, NULL},
          {"unreachable_is_econn_with_timeout", unreachable_is_econn_with_timeout, NULL},
          {"lease_clock_is_boottime", lease_clock_is_boottime, NULL},
          {"options_init_calls", options_init_calls, NULL},
          {"backend_register_checks", backend_register_checks, NULL},
          {"holder_records", holder_records, NULL},
          {"holder_record_written", holder_record_written, NULL},
          {"fmt_numbers", fmt_numbers, NULL}, {"listen_grant_lease", listen_grant_lease, NULL},
          {"tokens_fresh_across_fork", tokens_fresh_across_fork, NULL}, {"stats_bad_input", stats_bad_input, NULL},
          {"stats_format", stats_format, NULL})
