/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * "A lease is counted from the request's send time", checked on every
 * backend that has a lease to read (`test_lease_clock BACKEND CASE`).
 *
 * The server starts its lease when the request reaches it, after the
 * client sent it; the reply may come back much later. A holder that counted
 * from the reply's arrival would believe its lock for as long as the reply
 * was late after the server had let it go. Here dlock reaches the server
 * through the fault proxy (tests/chaos/chaos_proxy.c), which holds the
 * replies of one acquisition, then of one renewal, by a known delay; right
 * after, the server's remaining lease is read (tests/support/test_ttl.c) and
 * then dlock_lock_valid_ms(), which must not be the greater (1 ms for
 * rounding). In that order the check holds whatever the time between the
 * reads, and a lease counted from the reply fails it by about the delay.
 */
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "chaos_proxy.h"
#include "test.h"
#include "test_ttl.h"
#ifdef DLOCK_TEST_POSTGRES
#include "test_pg.h"
#endif

static const char *backend; /* argv[1] */

/* dlock through proxies to the server of backend, and the fault to use. */
typedef struct {
    test_server s;
    chaos_proxy *px[TEST_REDLOCK_MAX];
    int npx;
    char url[512];
    int64_t lease_ms;
    int delay_ms;
} rig;

static int proxy_to(rig *r, int port)
{
    CHECK(r->npx < TEST_REDLOCK_MAX);
    CHECK(chaos_proxy_start(&r->px[r->npx], port) == 0);
    return chaos_proxy_port(r->px[r->npx++]);
}

static void rig_start(rig *r)
{
    memset(r, 0, sizeof(*r));
    test_server_start(&r->s, backend);
    /* Long enough that the next renewal comes well after the late one
     * and the reads that check it. */
    r->lease_ms = 3000;
    r->delay_ms = 300;
    if (strcmp(backend, "redis") == 0) {
        snprintf(r->url, sizeof(r->url), "redis://127.0.0.1:%d", proxy_to(r, r->s.redis.port));
    } else if (strcmp(backend, "redlock") == 0) {
        size_t n = (size_t)snprintf(r->url, sizeof(r->url), "redlock://");
        for (int i = 0; i < r->s.nnodes; i++)
            n += (size_t)snprintf(r->url + n, sizeof(r->url) - n, "%s127.0.0.1:%d",
                                  i ? "," : "", proxy_to(r, r->s.nodes[i].port));
        /* A node's reply is waited for a tenth of the lease by default. */
        snprintf(r->url + n, sizeof(r->url) - n, "?node_timeout_ms=1000");
    } else if (strcmp(backend, "etcd") == 0) {
        /* Leases in whole seconds (dlock asks for ceil(lease_ms / 1000) s:
         * no slack to hide an error in). */
        snprintf(r->url, sizeof(r->url), "etcd://127.0.0.1:%d",
                 proxy_to(r, r->s.etcd.client_port[0]));
        /* A renewal may be three round trips (docs/etcd.md), and reading
         * the TTL up to a second. */
        r->lease_ms = 12000;
    } else if (strcmp(backend, "zk") == 0) {
        /* A lease as long as its session, so that the session is what ends
         * it; the server's bound has a tick (250 ms) of slack, so the delay
         * is more than that each way. */
        snprintf(r->url, sizeof(r->url), "zk://127.0.0.1:%d?session_timeout_ms=6000",
                 proxy_to(r, r->s.zk.client_port[0]));
        r->lease_ms = 6000;
        r->delay_ms = 600;
    } else if (strcmp(backend, "mysql") == 0 && !r->s.sql_named) {
        snprintf(r->url, sizeof(r->url), "mysql://dlock:dlockpw@127.0.0.1:%d/dlock_test",
                 proxy_to(r, r->s.mariadb.port));
        r->lease_ms = 5000; /* an acquisition is a few statements */
#ifdef DLOCK_TEST_POSTGRES
    } else if (strcmp(backend, "postgres") == 0) {
        snprintf(r->url, sizeof(r->url), "postgres://dlock@127.0.0.1:%d/postgres",
                 proxy_to(r, r->s.pg->port));
        r->lease_ms = 5000;
#endif
    } else {
        fprintf(stderr, "test_lease_clock: no lease to read on %s\n", backend);
        exit(2);
    }
}

static void rig_stop(rig *r)
{
    for (int i = 0; i < r->npx; i++)
        chaos_proxy_stop(r->px[i]);
    test_server_stop(&r->s);
}

/* Every chunk late by delay_ms, both ways (on, else none): a request
 * reaches the server late and its reply comes back later still, so that
 * the last reply of an acquisition of several requests is late too, and
 * whichever connection the client uses. */
static void fault(rig *r, int on)
{
    for (int i = 0; i < r->npx; i++)
        chaos_proxy_set(r->px[i], on ? CHAOS_PROXY_DELAY : CHAOS_PROXY_PASS, r->delay_ms);
}

static uint64_t renewals(dlock_client *c)
{
    dlock_stats st = DLOCK_STATS_INIT;

    CHECK_RC(dlock_client_stats(&st, c), DLOCK_OK);
    return st.renewals;
}

/* Round trips the client timed at delay_ms or more (dlock_client_stats). */
static uint64_t slow_round_trips(rig *r, dlock_client *c)
{
    dlock_stats st = DLOCK_STATS_INIT;
    uint64_t n = 0;

    CHECK_RC(dlock_client_stats(&st, c), DLOCK_OK);
    /* Bucket i >= 1 counts [2^(i-1), 2^i) us. */
    for (int i = 1; i < DLOCK_STATS_BUCKETS; i++)
        if ((1ULL << (i - 1)) >= (uint64_t)r->delay_ms * 1000 / 2)
            n += st.round_trip_us[i];
    return n;
}

/* The server's remaining lease first, then the holder's belief: the belief
 * is read later, so it can only have shrunk more. */
static void check_within_server(rig *r, dlock_lock *l, const char *when)
{
    int64_t server = test_server_ttl_ms(&r->s, "clock");
    int64_t mine = dlock_lock_valid_ms(l);

    fprintf(stderr, "%s: dlock believes %lld ms, the server keeps the lock %lld ms\n", when,
            (long long)mine, (long long)server);
    CHECK(server >= 0);
    CHECK(mine <= server + 1);
}

/* What the client logs (a renewal that failed) goes with the test's output. */
static void log_stderr(int level, const char *message, void *payload)
{
    (void)payload;
    fprintf(stderr, "dlock log %d: %s\n", level, message);
}

static dlock_client *open_warm(rig *r)
{
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_client *c = NULL;
    dlock_acquire_options o = test_opts(0, r->lease_ms, 0);
    dlock_lock *l;

    co.command_timeout_ms = 10000; /* a late reply is late, not lost */
    co.log = log_stderr;
    CHECK_RC(dlock_client_open(&c, r->url, &co), DLOCK_OK);
    /* Connections open and the schema made before the fault. */
    CHECK_RC(dlock_acquire(&l, c, "clock", &o), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    return c;
}

/* Until l's next renewal succeeded: only a renewal makes the belief grow. */
static void wait_renewal(dlock_lock *l)
{
    int64_t before = dlock_lock_valid_ms(l), now;

    while ((now = dlock_lock_valid_ms(l)) <= before) {
        CHECK(now > 0 && !dlock_lock_lost(l));
        before = now;
        test_sleep_ms(2);
    }
}

/* ---------------------------------------------------------------------- */

static void acquire_counts_from_send(void)
{
    rig r;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o;
    int64_t took;

    rig_start(&r);
    c = open_warm(&r);
    o = test_opts(0, r.lease_ms, 0);
    fault(&r, 1);
    took = test_clock_ms(CLOCK_MONOTONIC);
    CHECK_RC(dlock_acquire(&l, c, "clock", &o), DLOCK_OK);
    took = test_clock_ms(CLOCK_MONOTONIC) - took;
    fault(&r, 0);
    CHECK(took >= r.delay_ms); /* the fault held this acquisition's reply */
    check_within_server(&r, l, "after a late acquire reply");
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    rig_stop(&r);
}

static void renewal_counts_from_send(void)
{
    rig r;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o;
    uint64_t slow, done;

    rig_start(&r);
    /* etcd before 3.4.25 confirms each renewal with the lease's TTL: four
     * late round trips, then up to a second of TTL reads, must end before
     * the next renewal, a third of the lease later (12 s was too short on
     * a loaded CI machine, and 18 s once under TSan: the next renewal came
     * before the check ended). */
    if (strcmp(backend, "etcd") == 0)
        r.lease_ms = 30000;
    /* Likewise the late renewal and the reads after it within a third of
     * the lease under TSan (3 s was too short there: the next renewal came). */
    else if (r.lease_ms < 6000)
        r.lease_ms = 6000;
    c = open_warm(&r);
    o = test_opts(0, r.lease_ms, 1);
    CHECK_RC(dlock_acquire(&l, c, "clock", &o), DLOCK_OK);
    /* The watchdog renews a third into the lease. Its first renewal opens
     * what it renews on; the second one is held. */
    wait_renewal(l);
    /* The check must see the late renewal, not the next one. Under TSan
     * on a loaded machine the next one has come first (ZooKeeper: a third
     * of 6 s, less the 1.2 s the late one took); each check holds either
     * way, so a try that raced the next renewal is made again. */
    for (int tries = 1;; tries++) {
        slow = slow_round_trips(&r, c);
        fault(&r, 1);
        wait_renewal(l);
        fault(&r, 0);
        CHECK(slow_round_trips(&r, c) > slow); /* the fault held this renewal */
        done = renewals(c);
        check_within_server(&r, l, "after a late renewal reply");
        CHECK(!dlock_lock_lost(l));
        if (renewals(c) == done)
            break;
        fprintf(stderr, "the next renewal came before the check ended (try %d)\n", tries);
        CHECK(tries < 5);
    }
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    rig_stop(&r);
}

static void note_lost(dlock_lock *l, int reason, void *payload)
{
    (void)l;
    (void)reason;
    atomic_store((atomic_int *)payload, 1);
}

/* A renewal that reaches the server in time but whose reply comes back
 * after the handle's deadline: dlock_lock_lost() has said 1 by then, and
 * the reply must not make it 0 again. The lock is lost, with its on_lost
 * (a chaos finding: the reply used to revive the lock, on_lost never
 * came). Each chunk is late by half a lease: the renewal, sent a third into
 * the lease, reaches the server at five sixths, its reply comes back after
 * the lease. */
static void renewal_answered_late_is_lost(void)
{
    rig r;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o;
    atomic_int lost = 0;
    int64_t until;

    rig_start(&r);
    c = open_warm(&r);
    o = test_opts(0, r.lease_ms, 1);
    o.on_lost = note_lost;
    o.payload = &lost;
    CHECK_RC(dlock_acquire(&l, c, "clock", &o), DLOCK_OK);
    wait_renewal(l);
    r.delay_ms = (int)(r.lease_ms / 2);
    fault(&r, 1);
    until = test_clock_ms(CLOCK_MONOTONIC) + 3 * r.lease_ms;
    while (!dlock_lock_lost(l)) {
        CHECK(test_clock_ms(CLOCK_MONOTONIC) < until);
        test_sleep_ms(2);
    }
    fault(&r, 0);
    /* Lost it stays, and on_lost comes (when the late reply does). */
    until = test_clock_ms(CLOCK_MONOTONIC) + 3 * r.lease_ms;
    while (!atomic_load(&lost)) {
        CHECK(dlock_lock_lost(l));
        CHECK(test_clock_ms(CLOCK_MONOTONIC) < until);
        test_sleep_ms(2);
    }
    CHECK(dlock_lock_lost(l));
    CHECK(dlock_lock_valid_ms(l) == 0);
    CHECK_RC(dlock_release(l), DLOCK_ELOST);
    dlock_client_free(c);
    rig_stop(&r);
}

static const test_case cases[] = {
    {"acquire_counts_from_send", acquire_counts_from_send, NULL},
    {"renewal_counts_from_send", renewal_counts_from_send, "watchdog"},
    {"renewal_answered_late_is_lost", renewal_answered_late_is_lost, "watchdog"},
};

/* test_lease_clock BACKEND CASE, or test_lease_clock --list */
int main(int argc, char **argv)
{
    return test_run_on(cases, sizeof(cases) / sizeof(cases[0]), argc, argv, &backend);
}
