/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The Redis backend against a real redis-server. Each test starts its own
 * throwaway server (tests/support), so tests can count its commands, kill it
 * and restart it, and run in parallel.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/redis/redis_scripts.h"
#include "test.h"
#include "test_server.h"

static dlock_client *open_client(const test_redis *r)
{
    dlock_client *c = NULL;

    CHECK_RC(dlock_client_open(&c, r->url, NULL), DLOCK_OK);
    CHECK(c != NULL);
    CHECK(strcmp(dlock_client_backend(c), "redis") == 0);
    return c;
}

static void bad_input_before_network(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *l = NULL;
    dlock_acquire_options o;
    char big[DLOCK_NAME_MAX + 2];
    long long before;

    test_redis_start(&r, NULL);
    c = open_client(&r);
    before = test_redis_calls(&r, "evalsha") + test_redis_calls(&r, "eval");
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    CHECK_RC(dlock_acquire(NULL, c, "n", NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_acquire(&l, NULL, "n", NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_acquire(&l, c, NULL, NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_acquire(&l, c, "", NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "empty");
    CHECK_RC(dlock_acquire(&l, c, big, NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "longer than 512");
    o = test_opts(0, 0, 1);
    CHECK_RC(dlock_acquire(&l, c, "n", &o), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "lease_ms");
    o = test_opts(0, -5, 1);
    CHECK_RC(dlock_acquire(&l, c, "n", &o), DLOCK_EINVAL);
    o = test_opts(0, DLOCK_LEASE_MAX_MS + 1, 1);
    CHECK_RC(dlock_acquire(&l, c, "n", &o), DLOCK_EINVAL);
    o = test_opts(-2, 1000, 1);
    CHECK_RC(dlock_acquire(&l, c, "n", &o), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "wait_ms");
    o = test_opts(0, 1000, 7);
    CHECK_RC(dlock_acquire(&l, c, "n", &o), DLOCK_EINVAL);
    o = test_opts(0, 1000, 1);
    o.version = 0;
    CHECK_RC(dlock_acquire(&l, c, "n", &o), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "DLOCK_ACQUIRE_OPTIONS_INIT");
    CHECK(l == NULL);
    CHECK(test_redis_calls(&r, "evalsha") + test_redis_calls(&r, "eval") == before);

    /* Binary-ish names are fine and kept apart. */
    o = test_opts(0, 1000, 0);
    CHECK_RC(dlock_acquire(&l, c, "a b\x01\xff{}", &o), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    memset(big, 'y', DLOCK_NAME_MAX);
    big[DLOCK_NAME_MAX] = '\0';
    CHECK_RC(dlock_acquire(&l, c, big, &o), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    test_redis_stop(&r);
}

static void on_lost_via_check(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 60000, 1);

    atomic_store(&test_lost_calls, 0);
    test_redis_start(&r, NULL);
    c = open_client(&r);
    o.on_lost = test_count_lost;
    CHECK_RC(dlock_acquire(&l, c, "checked", &o), DLOCK_OK);
    CHECK(test_redis_cmd(&r, "DEL dlock:{checked}") == 1);
    CHECK_RC(dlock_lock_check(l), DLOCK_ELOST); /* long before the next renewal */
    for (int i = 0; i < 100 && atomic_load(&test_lost_calls) == 0; i++)
        test_sleep_ms(10);
    CHECK(atomic_load(&test_lost_calls) == 1);
    CHECK_RC(dlock_release(l), DLOCK_ELOST);
    dlock_client_free(c);
    test_redis_stop(&r);
}

static dlock_lock *misuse_lock;
static atomic_int misuse_rc;

static void release_inside_callback(dlock_lock *l, int reason, void *payload)
{
    (void)reason;
    (void)payload;
    int rc = dlock_release(l);

    misuse_lock = l; /* published by the atomic store below */
    atomic_store(&misuse_rc, rc);
}

static void release_from_on_lost_is_misuse(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 200, 0);

    atomic_store(&misuse_rc, 1);
    test_redis_start(&r, NULL);
    c = open_client(&r);
    o.on_lost = release_inside_callback;
    CHECK_RC(dlock_acquire(&l, c, "cb", &o), DLOCK_OK); /* lost when its lease ends */
    for (int i = 0; i < 100 && atomic_load(&misuse_rc) == 1; i++)
        test_sleep_ms(20);
    CHECK(atomic_load(&misuse_rc) == DLOCK_EMISUSE);
    CHECK(misuse_lock == l);
    CHECK_RC(dlock_release(l), DLOCK_ELOST);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* kill -9 of the server: clear errors, then everything works again after a
 * restart, on the same client, without a crash or leak. */
static void server_killed_and_restarted(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *l, *l2;
    dlock_lock_info info;
    dlock_acquire_options o = test_opts(0, 400, 1);
    dlock_stats st = DLOCK_STATS_INIT;
    char where[64];

    atomic_store(&test_lost_calls, 0);
    test_redis_start(&r, NULL);
    snprintf(where, sizeof(where), "127.0.0.1:%d", r.port);
    c = open_client(&r);
    o.on_lost = test_count_lost;
    CHECK_RC(dlock_acquire(&l, c, "survivor", &o), DLOCK_OK);
    test_redis_kill(&r);
    CHECK_RC(dlock_status(&info, c, "survivor"), DLOCK_ECONN);
    CHECK_CONTAINS(dlock_error_message(), where);
    CHECK_RC(dlock_acquire(&l2, c, "other", NULL), DLOCK_ECONN);
    /* The watchdog cannot renew: the lock is lost once the lease runs out. */
    for (int i = 0; i < 200 && atomic_load(&test_lost_calls) == 0; i++)
        test_sleep_ms(20);
    CHECK(atomic_load(&test_lost_calls) == 1);
    CHECK(atomic_load(&test_lost_reason) == DLOCK_ECONN);
    CHECK(dlock_lock_lost(l));
    /* Refused at once, the renewal is tried again every 40 ms (a tenth of
     * the lease) from the first try at 133 ms to the deadline at 400 ms:
     * 8 tries (10 allows a wake-up a little early), never a hot loop. */
    CHECK_RC(dlock_client_stats(&st, c), DLOCK_OK);
    fprintf(stderr, "renewals that failed: %llu\n", (unsigned long long)st.renew_failures);
    CHECK(st.renew_failures >= 1 && st.renew_failures <= 10);
    test_redis_restart(&r);
    CHECK_RC(dlock_release(l), DLOCK_ELOST);
    CHECK_RC(dlock_acquire(&l2, c, "other", NULL), DLOCK_OK);
    CHECK(dlock_lock_fence(l2) == 1); /* no persistence: the counter restarted */
    CHECK_RC(dlock_release(l2), DLOCK_OK);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* With persistence, the fence survives a restart of the server. */
static void fence_survives_restart_with_aof(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 5000, 0);

    test_redis_start(&r, "--appendonly yes --appendfsync always");
    c = open_client(&r);
    for (int i = 0; i < 5; i++) {
        CHECK_RC(dlock_acquire(&l, c, "durable", &o), DLOCK_OK);
        CHECK_RC(dlock_release(l), DLOCK_OK);
    }
    test_redis_kill(&r);
    test_redis_restart(&r);
    CHECK_RC(dlock_acquire(&l, c, "durable", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(l) == 6);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* A waiter is woken by the release itself: it gets the lock within a wait
 * shorter than the holder's lease, with a handful of commands, not a poll. */
static void waiter_woken_by_release(void)
{
    test_redis r;
    dlock_client *holder_c, *waiter_c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 20000, 0);
    test_acquirer a;
    pthread_t t;
    long long before, used;

    test_redis_start(&r, NULL);
    holder_c = open_client(&r);
    waiter_c = open_client(&r);
    CHECK_RC(dlock_acquire(&l, holder_c, "handoff", &o), DLOCK_OK);
    /* A wait shorter than the holder's 20 s lease. */
    test_acquirer_init(&a, waiter_c, "handoff", test_opts(8000, 10000, 1));
    before = test_redis_calls(&r, "evalsha");
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &a) == 0);
    /* The waiter is on the channel and asleep: subscribed, and both its
     * tries (before and after subscribing) done. */
    for (int i = 0; i < 2000 && (test_redis_numsub(&r, "dlock:{handoff}:release") < 1 ||
                                 test_redis_calls(&r, "evalsha") - before < 2); i++)
        test_sleep_ms(10);
    CHECK(test_redis_numsub(&r, "dlock:{handoff}:release") >= 1);
    CHECK(test_redis_calls(&r, "evalsha") - before >= 2);
    CHECK(!atomic_load(&a.done));
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(a.rc, DLOCK_OK);
    CHECK(dlock_lock_fence(a.lock) == 2);
    used = test_redis_calls(&r, "evalsha") - before;
    /* try, try after subscribing, release, and the try that confirms the
     * hand-off: the release hands the lock over (release.lua), so the
     * waiter's one try after its wake-up finds the lock already its own */
    fprintf(stderr, "scripts during the hand-off: %lld\n", used);
    CHECK(used <= 4);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{handoff}:next") == 0);
    CHECK_RC(dlock_release(a.lock), DLOCK_OK);
    dlock_client_free(holder_c);
    dlock_client_free(waiter_c);
    test_redis_stop(&r);
}


/* What the log callback received (handoff_counted_and_logged). */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_text[4096];

static void record_log(int level, const char *message, void *payload)
{
    (void)payload;
    pthread_mutex_lock(&log_mu);
    snprintf(log_text + strlen(log_text), sizeof(log_text) - strlen(log_text), "%d %s\n", level,
             message);
    pthread_mutex_unlock(&log_mu);
}

/* A hand-off is counted and logged on the waiter's client, and the record
 * of who holds the lock is the waiter's once it confirmed; a connection
 * made again after the server restarted is logged too. */
static void handoff_counted_and_logged(void)
{
    test_redis r;
    dlock_client *holder_c, *waiter_c;
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_acquire_options o = test_opts(0, 20000, 0), wo = test_opts(8000, 10000, 1);
    dlock_stats st = DLOCK_STATS_INIT;
    dlock_lock_info info;
    dlock_lock *l;
    test_acquirer a;
    pthread_t t;

    test_redis_start(&r, NULL);
    holder_c = open_client(&r);
    co.log = record_log;
    CHECK_RC(dlock_client_open(&waiter_c, r.url, &co), DLOCK_OK);
    o.label = "holder";
    CHECK_RC(dlock_acquire(&l, holder_c, "given2", &o), DLOCK_OK);
    wo.label = "waiter";
    test_acquirer_init(&a, waiter_c, "given2", wo);
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &a) == 0);
    for (int i = 0; i < 500 && test_redis_cmd(&r, "EXISTS dlock:{given2}:next") != 1; i++)
        test_sleep_ms(10);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{given2}:next") == 1);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(a.rc, DLOCK_OK);
    CHECK_RC(dlock_client_stats(&st, waiter_c), DLOCK_OK);
    CHECK(st.acquires == 1 && st.waits == 1 && st.handoffs == 1);
    CHECK_CONTAINS(log_text, "1 lock 'given2' was handed over by its holder's release");
    CHECK_RC(dlock_status(&info, holder_c, "given2"), DLOCK_OK);
    CHECK(info.held && info.has_holder && strcmp(info.label, "waiter") == 0);
    /* The holder's client saw no hand-off. */
    CHECK_RC(dlock_client_stats(&st, holder_c), DLOCK_OK);
    CHECK(st.acquires == 1 && st.handoffs == 0);
    CHECK_RC(dlock_release(a.lock), DLOCK_OK);

    test_redis_kill(&r);
    test_redis_restart(&r);
    CHECK_RC(dlock_status(&info, waiter_c, "given2"), DLOCK_OK);
    CHECK_CONTAINS(log_text, "1 redis 127.0.0.1:");
    CHECK_CONTAINS(log_text, ": connected again (cmd connection)");
    dlock_client_free(holder_c);
    dlock_client_free(waiter_c);
    test_redis_stop(&r);
}

/* Many waiters of one client: a release wakes one of them, not all. */
static void release_wakes_one_waiter(void)
{
    enum { WAITERS = 6 };
    test_redis r;
    dlock_client *holder_c, *waiter_c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 30000, 0);
    test_acquirer a[WAITERS];
    pthread_t t[WAITERS];
    long long before, used;
    int winners = 0;

    test_redis_start(&r, NULL);
    holder_c = open_client(&r);
    waiter_c = open_client(&r);
    CHECK_RC(dlock_acquire(&l, holder_c, "crowd", &o), DLOCK_OK);
    for (int i = 0; i < WAITERS; i++) {
        test_acquirer_init(&a[i], waiter_c, "crowd", test_opts(20000, 10000, 1));
        CHECK(pthread_create(&t[i], NULL, test_acquirer_main, &a[i]) == 0);
    }
    /* All waiters did their first two tries. */
    for (int i = 0; i < 500 && test_redis_calls(&r, "evalsha") < 1 + 2 * WAITERS; i++)
        test_sleep_ms(10);
    test_sleep_ms(200);
    before = test_redis_calls(&r, "evalsha");
    CHECK_RC(dlock_release(l), DLOCK_OK);
    for (int i = 0; i < 500 && winners == 0; i++) {
        test_sleep_ms(10);
        for (int j = 0; j < WAITERS; j++)
            winners += atomic_load(&a[j].done);
    }
    test_sleep_ms(300);
    used = test_redis_calls(&r, "evalsha") - before;
    fprintf(stderr, "scripts after one release with %d waiters: %lld\n", WAITERS, used);
    CHECK(winners == 1);
    CHECK(used <= 3); /* the release and one waiter's try, not six */
    /* Hand the lock down the line: every waiter gets it once. */
    for (int round = 0; round < WAITERS; round++) {
        int holder = -1;
        for (int i = 0; i < 1000 && holder < 0; i++) {
            for (int j = 0; j < WAITERS; j++)
                if (atomic_load(&a[j].done) == 1 && a[j].lock != NULL)
                    holder = j;
            if (holder < 0)
                test_sleep_ms(10);
        }
        CHECK(holder >= 0);
        CHECK_RC(a[holder].rc, DLOCK_OK);
        atomic_store(&a[holder].done, 2);
        CHECK_RC(dlock_release(a[holder].lock), DLOCK_OK);
    }
    for (int i = 0; i < WAITERS; i++)
        CHECK(pthread_join(t[i], NULL) == 0);
    dlock_client_free(holder_c);
    dlock_client_free(waiter_c);
    test_redis_stop(&r);
}

/* A hand-off under way: the holder's lock on a name (lease 20 s) and a
 * waiter, on a client of its own, asleep in the lock's hand-off slot. */
typedef struct {
    test_redis r;
    dlock_client *holder_c, *waiter_c;
    dlock_lock *held;
    test_acquirer a;
    pthread_t t;
} hand_off;

static void hand_off_start(hand_off *h, const char *name, dlock_acquire_options wo)
{
    dlock_acquire_options o = test_opts(0, 20000, 0);
    char slot[128];

    test_redis_start(&h->r, NULL);
    h->holder_c = open_client(&h->r);
    h->waiter_c = open_client(&h->r);
    CHECK_RC(dlock_acquire(&h->held, h->holder_c, name, &o), DLOCK_OK);
    test_acquirer_init(&h->a, h->waiter_c, name, wo);
    CHECK(pthread_create(&h->t, NULL, test_acquirer_main, &h->a) == 0);
    snprintf(slot, sizeof(slot), "dlock:{%s}:next", name);
    for (int i = 0; i < 500 && test_redis_cmd(&h->r, "EXISTS %s", slot) != 1; i++)
        test_sleep_ms(10);
    CHECK(test_redis_cmd(&h->r, "EXISTS %s", slot) == 1);
    test_sleep_ms(100);
}

/* The holder releases: the waiter has the lock, with the next fence. */
static void hand_off_release(hand_off *h)
{
    CHECK_RC(dlock_release(h->held), DLOCK_OK);
    CHECK(pthread_join(h->t, NULL) == 0);
    CHECK_RC(h->a.rc, DLOCK_OK);
    CHECK(dlock_lock_fence(h->a.lock) == 2);
}

static void hand_off_end(hand_off *h)
{
    CHECK_RC(dlock_release(h->a.lock), DLOCK_OK);
    dlock_client_free(h->holder_c);
    dlock_client_free(h->waiter_c);
    test_redis_stop(&h->r);
}

/* The release hands the lock to the waiter in the hand-off slot: no try of
 * the waiter's own after the release, the next fence, and a lease the
 * watchdog then keeps. The waiter listens (redis_listen.c): the grant is
 * popped from its list, the key is handed over for the confirm window, the
 * handle believes no more than the server, and the watchdog extends it to
 * the waiter's whole lease at once. */
static void release_hands_over(void)
{
    hand_off h;
    test_redis *r = &h.r;
    dlock_stats st = DLOCK_STATS_INIT;
    long long blpops;

    hand_off_start(&h, "given", test_opts(8000, 10000, 1));
    blpops = test_redis_calls(r, "blpop");
    hand_off_release(&h);
    /* The waiter listened, and the release pushed the grant to its list. */
    CHECK(blpops >= 1 && test_redis_calls(r, "rpush") == 1);
    CHECK(dlock_lock_valid_ms(h.a.lock) <= test_redis_cmd(r, "PTTL dlock:{given}") + 50);
    CHECK_RC(dlock_client_stats(&st, h.waiter_c), DLOCK_OK);
    CHECK(st.handoffs == 1);
    /* The watchdog extends the window to the whole lease at once. */
    for (int i = 0; i < 300 && test_redis_cmd(r, "PTTL dlock:{given}") <= 2000; i++)
        test_sleep_ms(10);
    CHECK(test_redis_cmd(r, "PTTL dlock:{given}") > 2000);
    CHECK(dlock_lock_valid_ms(h.a.lock) <= test_redis_cmd(r, "PTTL dlock:{given}") + 50);
    CHECK(test_redis_cmd(r, "EXISTS dlock:{given}:next") == 0);
    CHECK(test_redis_cmd(r, "KEYS dlock:{given}:grant:*") == 0); /* popped: gone */
    CHECK(!dlock_lock_lost(h.a.lock));
    CHECK_RC(dlock_lock_check(h.a.lock), DLOCK_OK);
    hand_off_end(&h);
}

/* One hand-off to a waiter of lease_ms without auto_renew: the scripts the
 * server ran from the release on (the release, and a confirming try when
 * there is one), checking the lease the handle believes against the key's. */
static long long hand_over_unrenewed(int64_t lease_ms)
{
    hand_off h;
    long long before, used, pttl;

    hand_off_start(&h, "bare", test_opts(8000, lease_ms, 0));
    before = test_redis_calls(&h.r, "evalsha");
    hand_off_release(&h);
    used = test_redis_calls(&h.r, "evalsha") - before;
    pttl = test_redis_cmd(&h.r, "PTTL dlock:{bare}");
    CHECK(pttl > 0 && pttl <= lease_ms);
    CHECK(dlock_lock_valid_ms(h.a.lock) <= pttl + 50);
    hand_off_end(&h);
    return used;
}

/* A waiter whose listening connection is killed under its BLPOP tries at
 * once and puts its entry back without " L": the next release announces
 * its grant (no push), and the waiter confirms it with a try. */
static void listener_lost_falls_back(void)
{
    hand_off h;
    char entry[256], clients[8192], *at;
    long long id;

    hand_off_start(&h, "deaf", test_opts(8000, 10000, 1));
    test_redis_text(&h.r, entry, sizeof(entry), "GET dlock:{deaf}:next");
    CHECK(strstr(entry, " L") != NULL);
    test_redis_text(&h.r, clients, sizeof(clients), "CLIENT LIST");
    CHECK((at = strstr(clients, "name=dlock-listener")) != NULL);
    while (at > clients && at[-1] != '\n')
        at--;
    CHECK(sscanf(at, "id=%lld", &id) == 1);
    CHECK(test_redis_cmd(&h.r, "CLIENT KILL ID %lld", id) == 1);
    for (int i = 0; i < 500; i++) {
        test_redis_text(&h.r, entry, sizeof(entry), "GET dlock:{deaf}:next");
        if (entry[0] != '\0' && strstr(entry, " L") == NULL)
            break;
        test_sleep_ms(10);
    }
    CHECK(entry[0] != '\0' && strstr(entry, " L") == NULL);
    hand_off_release(&h);
    CHECK(test_redis_calls(&h.r, "rpush") == 0);
    CHECK(test_redis_cmd(&h.r, "PTTL dlock:{deaf}") > 2000); /* confirmed: the whole lease */
    hand_off_end(&h);
}

/* Without auto_renew, a lease within the confirm window is the popped
 * grant's, with no try after the release; a longer one, which nothing
 * would extend past the window, is confirmed by one try (that sets it). */
static void listened_grant_without_renewal(void)
{
    long long used;

    used = hand_over_unrenewed(1500);
    fprintf(stderr, "scripts from the release on, lease 1.5 s: %lld\n", used);
    CHECK(used == 1);
    used = hand_over_unrenewed(10000);
    fprintf(stderr, "scripts from the release on, lease 10 s: %lld\n", used);
    CHECK(used == 2);
}

/* A waiter killed while in the hand-off slot: a release may hand it the
 * lock, which then stays taken for that waiter's lease, no longer; the next
 * waiter gets it after, with the next fence. */
static void handed_to_a_dead_waiter(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *l, *l2;
    dlock_acquire_options o = test_opts(0, 20000, 0);
    dlock_acquire_options w = test_opts(15000, 5000, 1);
    pid_t pid;

    test_redis_start(&r, NULL);
    c = open_client(&r);
    CHECK_RC(dlock_acquire(&l, c, "ghost", &o), DLOCK_OK);
    pid = fork();
    if (pid == 0) {
        dlock_client *cc = open_client(&r);
        dlock_lock *x;
        dlock_acquire_options wo = test_opts(DLOCK_WAIT_FOREVER, 1500, 1);
        dlock_acquire(&x, cc, "ghost", &wo);
        _exit(1); /* never gets here: killed while waiting */
    }
    for (int i = 0; i < 500 && test_redis_cmd(&r, "EXISTS dlock:{ghost}:next") != 1; i++)
        test_sleep_ms(10);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{ghost}:next") == 1);
    CHECK(kill(pid, SIGKILL) == 0);
    CHECK(waitpid(pid, NULL, 0) == pid);
    CHECK_RC(dlock_release(l), DLOCK_OK); /* to the dead waiter, if its entry is still there */
    CHECK_RC(dlock_acquire(&l2, c, "ghost", &w), DLOCK_OK);
    /* 2 (handed over) + 1, or 2 when the dead waiter's entry had expired */
    CHECK(dlock_lock_fence(l2) == 3 || dlock_lock_fence(l2) == 2);
    fprintf(stderr, "fence after the dead waiter: %llu\n",
            (unsigned long long)dlock_lock_fence(l2));
    CHECK_RC(dlock_release(l2), DLOCK_OK);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* A waiter that gives up just after a release handed it the lock (the
 * grant came after its last try): its leave gives the lock back and frees
 * the slot. Run on the server state such a race leaves, as watch_end does. */
static void leave_after_hand_over(void)
{
    const dlock__redis_script *s = &dlock__redis_script_mutex_leave;
    const char *entry = "00ff 0123456789abcdef0123456789abcdef 5000";
    const char *token = "0123456789abcdef0123456789abcdef";
    test_redis r;

    test_redis_start(&r, NULL);
    CHECK(test_redis_cmd(&r, "SET dlock:{late} %s PX 5000", token) >= 0);
    CHECK(test_redis_cmd(&r, "SET dlock:{late}:next %s PX 5000", entry) >= 0);
    CHECK(test_redis_cmd(&r, "EVAL %b 1 dlock:{late} %s dlock:{late}:release %s", s->body,
                         s->len, token, entry) == 1);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{late}") == 0);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{late}:next") == 0);
    /* Not handed over: another's lock and another's entry stay. */
    CHECK(test_redis_cmd(&r, "SET dlock:{late} other PX 5000") >= 0);
    CHECK(test_redis_cmd(&r, "SET dlock:{late}:next other-entry PX 5000") >= 0);
    CHECK(test_redis_cmd(&r, "EVAL %b 1 dlock:{late} %s dlock:{late}:release %s", s->body,
                         s->len, token, entry) == 0);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{late}") == 1);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{late}:next") == 1);
    test_redis_stop(&r);
}

/* The fence a hand-over issues (release.lua run as a release does, the
 * waiter's entry listening so that the fence lands in its list), from a
 * counter set to counter ("" for none) and a floor ("" for none): the fence,
 * 0 when the release fell back to a plain one (the key deleted). */
static long long hand_over_fence(test_redis *r, const char *counter, const char *floor)
{
    const dlock__redis_script *s = &dlock__redis_script_release;
    const char *token = "0123456789abcdef0123456789abcdef";
    const char *entry = "00ff fedcba9876543210fedcba9876543210 5000 L host 1 2";
    char pushed[32], want[32];
    long long fence;

    CHECK(test_redis_cmd(r, "FLUSHALL") >= 0);
    CHECK(test_redis_cmd(r, "SET dlock:{ho} %s PX 5000", token) >= 0);
    CHECK(test_redis_cmd(r, "SET dlock:{ho}:next %s PX 5000", entry) >= 0);
    if (counter[0] != '\0')
        CHECK(test_redis_cmd(r, "SET dlock:{ho}:fence %s", counter) >= 0);
    if (floor[0] != '\0')
        CHECK(test_redis_cmd(r, "SET dlock:fence-floor %s", floor) >= 0);
    CHECK(test_redis_cmd(r, "EVAL %b 5 dlock:{ho} dlock:{ho}:fence dlock:fence-floor "
                         "dlock:fence-registry dlock:{ho}:next %s dlock:{ho}:release 2000",
                         s->body, s->len, token) == 1);
    CHECK(test_redis_cmd(r, "EXISTS dlock:{ho}:next") == 0);
    if (test_redis_cmd(r, "EXISTS dlock:{ho}") == 0)
        return 0;
    /* Handed over: the waiter's token and record, for the window. */
    CHECK(test_redis_cmd(r, "STRLEN dlock:{ho}") == 32 + 9); /* "TOKEN host 1 2" */
    CHECK(test_redis_cmd(r, "PTTL dlock:{ho}") > 0 && test_redis_cmd(r, "PTTL dlock:{ho}") <= 2000);
    CHECK(test_redis_cmd(r, "LLEN dlock:{ho}:grant:00ff") == 1);
    test_redis_text(r, pushed, sizeof(pushed), "LINDEX dlock:{ho}:grant:00ff 0");
    fence = atoll(pushed);
    snprintf(want, sizeof(want), "%lld", fence);
    CHECK(strcmp(want, pushed) == 0);
    return fence;
}

/* Each path of the hand-over's fence: the counter's next value; the 16th,
 * which keeps the registry; a counter retired (missing), which starts at the
 * floor; one missing with no floor; one that is not an integer, which makes
 * the release a plain one (nothing handed over, nothing left). */
static void hand_over_fence_paths(void)
{
    test_redis r;

    test_redis_start(&r, NULL);
    CHECK(hand_over_fence(&r, "41", "") == 42);
    CHECK(hand_over_fence(&r, "15", "") == 16);
    CHECK(test_redis_cmd(&r, "ZSCORE dlock:fence-registry dlock:{ho}:fence") > 0);
    CHECK(hand_over_fence(&r, "", "100") == 101);
    CHECK(hand_over_fence(&r, "", "") == 1);
    CHECK(hand_over_fence(&r, "x", "") == 0);
    CHECK(hand_over_fence(&r, "9007199254740991", "") == 0); /* past 2^53 - 1: refused */
    test_redis_stop(&r);
}

/* Threads sharing one client send their scripts on one connection,
 * pipelined (redis_mux.h): eight threads at once open no second one, and
 * their commands reach the server several to a read. */
typedef struct {
    dlock_client *c;
    int id;
    /* A release may answer DLOCK_ELOST: one whose reply a killed
     * connection lost is sent again, and finds the lock gone (its own
     * first try deleted it). */
    int lost_ok;
    int cycles; /* 0: 300 */
    int stop;   /* set (atomically) to stop after the cycle under way */
} cycler_arg;

static void *cycler_main(void *p)
{
    cycler_arg *a = p;
    dlock_acquire_options o = test_opts(0, 5000, 0);
    char name[32];

    snprintf(name, sizeof(name), "pool%d", a->id);
    for (int i = 0; i < (a->cycles ? a->cycles : 300) && !__atomic_load_n(&a->stop, __ATOMIC_ACQUIRE);
         i++) {
        dlock_lock *l;
        int rc;
        CHECK_RC(dlock_acquire(&l, a->c, name, &o), DLOCK_OK);
        rc = dlock_release(l);
        if (!(a->lost_ok && rc == DLOCK_ELOST))
            CHECK_RC(rc, DLOCK_OK);
    }
    return NULL;
}

/* n cyclers on c, each on a thread of t (cycles 0: 300). */
static void start_cyclers(pthread_t *t, cycler_arg *a, int n, dlock_client *c, int lost_ok,
                          int cycles)
{
    for (int i = 0; i < n; i++) {
        a[i].c = c;
        a[i].id = i;
        a[i].lost_ok = lost_ok;
        a[i].cycles = cycles;
        a[i].stop = 0;
        CHECK(pthread_create(&t[i], NULL, cycler_main, &a[i]) == 0);
    }
}

static long long cmd_connections(test_redis *r)
{
    redisContext *ctx = redisConnect("127.0.0.1", r->port);
    redisReply *rep;
    long long n = 0;

    CHECK(ctx != NULL && ctx->err == 0);
    rep = redisCommand(ctx, "CLIENT LIST");
    CHECK(rep != NULL && rep->type == REDIS_REPLY_STRING);
    for (const char *p = rep->str; (p = strstr(p, " name=dlock-cmd ")) != NULL; p++)
        n++;
    freeReplyObject(rep);
    redisFree(ctx);
    return n;
}

/* A counter of INFO stats ("total_reads_processed"). */
static long long info_stat(test_redis *r, const char *field)
{
    redisContext *ctx = redisConnect("127.0.0.1", r->port);
    redisReply *rep;
    const char *p;
    long long v = -1;

    CHECK(ctx != NULL && ctx->err == 0);
    rep = redisCommand(ctx, "INFO stats");
    CHECK(rep != NULL && rep->type == REDIS_REPLY_STRING);
    if ((p = strstr(rep->str, field)) != NULL && p[strlen(field)] == ':')
        v = atoll(p + strlen(field) + 1);
    freeReplyObject(rep);
    redisFree(ctx);
    CHECK(v >= 0);
    return v;
}

static void command_connection_shared(void)
{
    enum { THREADS = 8 };
    test_redis r;
    dlock_client *c;
    pthread_t t[THREADS];
    cycler_arg a[THREADS];
    long long n, cmds, reads;

    test_redis_start(&r, NULL);
    c = open_client(&r);
    start_cyclers(t, a, 1, c, 0, 0);
    CHECK(pthread_join(t[0], NULL) == 0);
    CHECK(cmd_connections(&r) == 1);
    cmds = info_stat(&r, "total_commands_processed");
    reads = info_stat(&r, "total_reads_processed");
    start_cyclers(t, a, THREADS, c, 0, 0);
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_join(t[i], NULL) == 0);
    cmds = info_stat(&r, "total_commands_processed") - cmds;
    reads = info_stat(&r, "total_reads_processed") - reads;
    n = cmd_connections(&r);
    fprintf(stderr, "%d threads: %lld command connection(s), %lld commands in %lld reads\n",
            THREADS, n, cmds, reads);
    CHECK(n == 1);
    /* 4,800 scripts (and the two INFOs): with a connection per call each
     * is a read of its own; pipelined, some share one. */
    CHECK(cmds >= THREADS * 300 * 2);
    CHECK(reads < cmds);
    dlock_client_free(c);
    for (int i = 0; i < 250 && cmd_connections(&r) != 0; i++)
        test_sleep_ms(20); /* the server sees the closes in its own time */
    CHECK(cmd_connections(&r) == 0);
    test_redis_stop(&r);
}

/* The shared connection killed by the server while eight threads use it:
 * every call made again on a new one succeeds (a script is safe to send
 * twice), and one connection is left. */
static void shared_connection_killed(void)
{
    enum { THREADS = 8 };
    test_redis r;
    dlock_client *c;
    dlock_lock *l;
    pthread_t t[THREADS];
    cycler_arg a[THREADS];

    test_redis_start(&r, NULL);
    c = open_client(&r);
    start_cyclers(t, a, THREADS, c, 1, 100000);
    /* Killed 3 times while they run (100,000 cycles a thread take seconds
     * even unsanitized), then each thread stops after its cycle. */
    for (int k = 0; k < 3; k++) {
        test_sleep_ms(100);
        CHECK(test_redis_cmd(&r, "CLIENT KILL TYPE normal SKIPME yes") >= 1);
    }
    for (int i = 0; i < THREADS; i++)
        __atomic_store_n(&a[i].stop, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_join(t[i], NULL) == 0);
    /* The last kill may have come after every thread's last command: one
     * more cycle makes the connection again if so. One, shared. */
    CHECK_RC(dlock_acquire(&l, c, "after", NULL), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(cmd_connections(&r) == 1);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* A thread of shared_connection_timed_out: cycles on names of its own
 * until stop, each name once (a release lost to the pause leaves its lock
 * to run out), counting what succeeded and what timed out. */
typedef struct {
    dlock_client *c;
    int id;
    int stop;
    long ok;        /* cycles that succeeded (read by the main thread) */
    long timed_out; /* calls that failed by the command timeout */
} pause_arg;

static void *pause_cycler(void *p)
{
    pause_arg *a = p;
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;

    o.auto_renew = 0;
    o.lease_ms = 60000;
    for (long i = 0; !__atomic_load_n(&a->stop, __ATOMIC_ACQUIRE); i++) {
        char name[48];
        dlock_lock *l;
        int rc;

        snprintf(name, sizeof(name), "paused-%d-%ld", a->id, i);
        if ((rc = dlock_acquire(&l, a->c, name, &o)) == DLOCK_OK)
            rc = dlock_release(l);
        if (rc == DLOCK_OK) {
            __atomic_add_fetch(&a->ok, 1, __ATOMIC_RELEASE);
            continue;
        }
        CHECK_RC(rc, DLOCK_ECONN);
        CHECK(strstr(dlock_error_message(), "timed out") != NULL);
        __atomic_add_fetch(&a->timed_out, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

/* The shared connection's server stops answering (SIGSTOP) while eight
 * threads use it: every call in flight fails by the command timeout, each
 * caller woken by the reader that saw it (a caller never woken would hang
 * the test), and once the server answers again every thread's calls
 * succeed, on one connection. */
static void shared_connection_timed_out(void)
{
    enum { THREADS = 8 };
    test_redis r;
    dlock_client *c;
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    pthread_t t[THREADS];
    pause_arg a[THREADS];
    long ok_at_resume[THREADS];
    int all;

    test_redis_start(&r, NULL);
    co.command_timeout_ms = 300;
    CHECK_RC(dlock_client_open(&c, r.url, &co), DLOCK_OK);
    memset(a, 0, sizeof(a));
    for (int i = 0; i < THREADS; i++) {
        a[i].c = c;
        a[i].id = i;
        CHECK(pthread_create(&t[i], NULL, pause_cycler, &a[i]) == 0);
    }
    test_sleep_ms(100);
    test__signal(r.pid, 1);
    test_sleep_ms(1200); /* four command timeouts */
    for (int i = 0; i < THREADS; i++)
        ok_at_resume[i] = __atomic_load_n(&a[i].ok, __ATOMIC_ACQUIRE);
    test__signal(r.pid, 0);
    /* Every thread succeeds again (20 s: a sanitized run on a loaded
     * machine; it takes milliseconds). */
    for (int k = 0; k < 1000; k++) {
        all = 1;
        for (int i = 0; i < THREADS; i++)
            all &= __atomic_load_n(&a[i].ok, __ATOMIC_ACQUIRE) > ok_at_resume[i];
        if (all)
            break;
        test_sleep_ms(20);
    }
    for (int i = 0; i < THREADS; i++)
        __atomic_store_n(&a[i].stop, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_join(t[i], NULL) == 0);
    for (int i = 0; i < THREADS; i++) {
        fprintf(stderr, "thread %d: %ld cycles, %ld timed out (%ld cycles before the resume)\n",
                i, a[i].ok, a[i].timed_out, ok_at_resume[i]);
        CHECK(a[i].timed_out >= 1); /* it had a call in flight in the pause */
        CHECK(a[i].ok > ok_at_resume[i]);
    }
    /* The connections that timed out are closed; the server sees the
     * closes in its own time. */
    for (int k = 0; k < 250 && cmd_connections(&r) != 1; k++)
        test_sleep_ms(20);
    CHECK(cmd_connections(&r) == 1);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* Scripts come back after SCRIPT FLUSH (NOSCRIPT), and a connection killed
 * by the server is re-established on next use. */
static void noscript_and_reconnect(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *l;

    test_redis_start(&r, NULL);
    c = open_client(&r);
    CHECK_RC(dlock_acquire(&l, c, "s", NULL), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    test_redis_cmd(&r, "SCRIPT FLUSH");
    CHECK_RC(dlock_acquire(&l, c, "s", NULL), DLOCK_OK);
    CHECK(dlock_lock_fence(l) == 2);
    CHECK(test_redis_cmd(&r, "CLIENT KILL TYPE normal") >= 1);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{s}") == 0);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* The fence dlock_status reports for name through a client of url. */
static uint64_t fence_seen(const char *url, const char *name)
{
    dlock_client *c = NULL;
    dlock_lock_info info;

    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_OK);
    CHECK_RC(dlock_status(&info, c, name), DLOCK_OK);
    dlock_client_free(c);
    return info.fence;
}

static void auth_and_db_and_unix(void)
{
    test_redis r;
    dlock_client *c = NULL;
    dlock_lock *l;
    char url[256], sock[128];

    test_redis_start(&r, NULL);
    snprintf(sock, sizeof(sock), "%s/redis.sock", r.dir);
    test_redis_kill(&r);
    snprintf(r.extra, sizeof(r.extra), "--requirepass s3cret --unixsocket %s", sock);
    test_redis_restart(&r);

    snprintf(url, sizeof(url), "redis://:wrong-pass@127.0.0.1:%d", r.port);
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_EAUTH);
    CHECK(strstr(dlock_error_message(), "wrong-pass") == NULL);
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d", r.port);
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_EAUTH);
    CHECK_CONTAINS(dlock_error_message(), "authentication");

    snprintf(url, sizeof(url), "redis://default:s3cret@127.0.0.1:%d/5", r.port);
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "in-db-5", NULL), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);

    /* unix socket: the same lock, seen through db 5 */
    snprintf(url, sizeof(url), "unix://:s3cret@%s?db=5", sock);
    CHECK(fence_seen(url, "in-db-5") == 1);
    /* db=N on redis:// too (it was read on unix:// alone, and ignored
     * here: the locks went to database 0); database 0 has no such fence */
    snprintf(url, sizeof(url), "redis://default:s3cret@127.0.0.1:%d?db=5", r.port);
    CHECK(fence_seen(url, "in-db-5") == 1);
    snprintf(url, sizeof(url), "redis://default:s3cret@127.0.0.1:%d", r.port);
    CHECK(fence_seen(url, "in-db-5") == 0);
    snprintf(url, sizeof(url), "redis://default:s3cret@127.0.0.1:%d/5?db=6", r.port);
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "the database is given twice, as the path '/5' "
                   "and as db=6: give it once");
    test_redis_stop(&r);
}

static void maxmemory_reached(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *l = NULL;

    test_redis_start(&r, "--maxmemory-policy noeviction");
    char *filler = calloc(1, 65536);

    CHECK(filler != NULL);
    c = open_client(&r);
    /* Fill the server past its limit. */
    for (int i = 0; i < 64; i++)
        test_redis_cmd(&r, "SET filler:%d %b", i, filler, (size_t)65536);
    free(filler);
    test_redis_cmd(&r, "CONFIG SET maxmemory 1mb");
    CHECK_RC(dlock_acquire(&l, c, "full", NULL), DLOCK_ESERVER);
    CHECK_CONTAINS(dlock_error_message(), "maxmemory");
    CHECK(l == NULL);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* The library's sockets are close-on-exec, and a dead server never raises
 * SIGPIPE (this process keeps SIGPIPE's default action, which would kill it). */
static void sockets_cloexec_and_no_sigpipe(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *l, *w;
    dlock_acquire_options o = test_opts(0, 60000, 1);
    dlock_acquire_options wo = test_opts(300, 60000, 1);
    int sockets = 0;

    test_redis_start(&r, NULL);
    c = open_client(&r);
    CHECK_RC(dlock_acquire(&l, c, "fds", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&w, c, "fds", &wo), DLOCK_ETIMEOUT); /* opens the subscriber */
    for (int fd = 0; fd < 1024; fd++) {
        char target[64];
        if (!test_fd_target(fd, target, sizeof(target)) || strncmp(target, "socket:", 7) != 0)
            continue;
        sockets++;
        CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    }
    CHECK(sockets >= 2);
    test_redis_kill(&r);
    for (int i = 0; i < 5; i++) {
        dlock_lock_info info;
        CHECK_RC(dlock_status(&info, c, "fds"), DLOCK_ECONN);
        CHECK(dlock_lock_check(l) == DLOCK_ECONN);
    }
    test_redis_restart(&r);
    CHECK_RC(dlock_release(l), DLOCK_ELOST); /* a restart without persistence forgot it */
    dlock_client_free(c);
    test_redis_stop(&r);
}

/*
 * What a renewal costs the server, measured between two renewal batches
 * (the trace hook runs on the watchdog's thread after a batch's reply and
 * before the next batch is sent, so no renewal is in flight): after a
 * CONFIG RESETSTAT, until 2 x LOCKS plain mutexes have been renewed, each
 * batch is one EVALSHA, each lock in it one GET and one PEXPIRE, no other
 * command reaches the server, and the requests carry 100 bytes a lock at
 * most: its key, token, kind word and lease (88 here), not its token twice
 * (121, before renew_batch sent '' for the owner value the mutex's check
 * does not read).
 */
#define COST_LOCKS 100

static struct {
    test_redis *r;
    redisContext *rc;
    atomic_int phase; /* 0 acquiring, 1 armed, 2 counting, 3 done */
    long calls, items;
    int failed;
    char stats[4096], commands[8192];
} cost;

static void cost_info(const char *section, char *out, size_t size)
{
    redisReply *rep = redisCommand(cost.rc, "INFO %s", section);

    out[0] = '\0';
    if (rep != NULL && rep->type == REDIS_REPLY_STRING)
        snprintf(out, size, "%s", rep->str);
    else
        cost.failed = 1;
    if (rep != NULL)
        freeReplyObject(rep);
}

static void cost_trace(const dlock_trace_event *ev, void *payload)
{
    int phase = atomic_load(&cost.phase);

    (void)payload;
    if (ev->phase != DLOCK_TRACE_END || strcmp(ev->call, "renew") != 0 || phase == 0 ||
        phase == 3)
        return;
    if (ev->result != DLOCK_OK)
        cost.failed = 1;
    if (phase == 1) {
        redisReply *rep = redisCommand(cost.rc, "CONFIG RESETSTAT");
        if (rep == NULL || rep->type != REDIS_REPLY_STATUS)
            cost.failed = 1;
        if (rep != NULL)
            freeReplyObject(rep);
        atomic_store(&cost.phase, 2);
        return;
    }
    cost.calls++;
    cost.items += (long)ev->count;
    if (cost.items >= 2 * COST_LOCKS) {
        /* Stats first: the bytes then include one short INFO request. */
        cost_info("stats", cost.stats, sizeof(cost.stats));
        cost_info("commandstats", cost.commands, sizeof(cost.commands));
        atomic_store(&cost.phase, 3);
    }
}

static long long info_field(const char *text, const char *field)
{
    const char *p = strstr(text, field);

    return p != NULL ? atoll(p + strlen(field)) : -1;
}

static void renewal_batch_cost(void)
{
    test_redis r;
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_client *c;
    dlock_lock *locks[COST_LOCKS];
    dlock_acquire_options o = test_opts(0, 900, 1);
    long long bytes;
    int others = 0;

    test_redis_start(&r, NULL);
    cost.r = &r;
    cost.rc = test__redis_connect(&r);
    CHECK(cost.rc != NULL);
    co.trace = cost_trace;
    CHECK_RC(dlock_client_open(&c, r.url, &co), DLOCK_OK);
    for (int i = 0; i < COST_LOCKS; i++) {
        char name[32];
        snprintf(name, sizeof(name), "batch-%02d", i);
        CHECK_RC(dlock_acquire(&locks[i], c, name, &o), DLOCK_OK);
    }
    atomic_store(&cost.phase, 1);
    for (int i = 0; i < 1000 && atomic_load(&cost.phase) != 3; i++)
        test_sleep_ms(10);
    CHECK(atomic_load(&cost.phase) == 3);
    CHECK(!cost.failed);
    bytes = info_field(cost.stats, "total_net_input_bytes:");
    fprintf(stderr, "%ld locks renewed in %ld batches: evalsha %lld, get %lld, pexpire %lld, "
            "%lld bytes in\n", cost.items, cost.calls,
            info_field(cost.commands, "cmdstat_evalsha:calls="),
            info_field(cost.commands, "cmdstat_get:calls="),
            info_field(cost.commands, "cmdstat_pexpire:calls="), bytes);
    CHECK(info_field(cost.commands, "cmdstat_evalsha:calls=") == cost.calls);
    CHECK(info_field(cost.commands, "cmdstat_get:calls=") == cost.items);
    CHECK(info_field(cost.commands, "cmdstat_pexpire:calls=") == cost.items);
    /* Nothing else but this test's own CONFIG and INFO. */
    for (const char *p = cost.commands; (p = strstr(p, "cmdstat_")) != NULL; p++) {
        if (strncmp(p, "cmdstat_evalsha:", 16) != 0 && strncmp(p, "cmdstat_get:", 12) != 0 &&
            strncmp(p, "cmdstat_pexpire:", 16) != 0 && strncmp(p, "cmdstat_config", 14) != 0 &&
            strncmp(p, "cmdstat_info:", 13) != 0) {
            fprintf(stderr, "unexpected: %.60s\n", p);
            others++;
        }
    }
    CHECK(others == 0);
    CHECK(bytes > 0 && bytes <= 100 * cost.items);
    for (int i = 0; i < COST_LOCKS; i++)
        CHECK_RC(dlock_release(locks[i]), DLOCK_OK);
    dlock_client_free(c);
    redisFree(cost.rc);
    test_redis_stop(&r);
}

/* A wake-up that never comes (the holder's key deleted behind its back, no
 * message) costs a waiter at most a quarter of its lease (README: each
 * sleep is bounded by the holder's lease and by a quarter of the
 * waiter's): the holder's lease is 120 s, the waiter's 12 s, and it has the
 * lock within 3 s of its last try, 2 s allowed for a loaded machine. */
static int64_t mono_ms(void)
{
    return test_clock_ms(CLOCK_MONOTONIC);
}

static void lost_wakeup_costs_a_quarter_lease(void)
{
    test_redis r;
    dlock_client *holder_c, *waiter_c;
    dlock_lock *l;
    test_acquirer a;
    pthread_t t;
    long long before;
    int64_t asleep_at, took;

    test_redis_start(&r, NULL);
    holder_c = open_client(&r);
    waiter_c = open_client(&r);
    {
        dlock_acquire_options o = test_opts(0, 120000, 0);
        CHECK_RC(dlock_acquire(&l, holder_c, "quiet", &o), DLOCK_OK);
    }
    test_acquirer_init(&a, waiter_c, "quiet", test_opts(60000, 12000, 1));
    before = test_redis_calls(&r, "evalsha");
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &a) == 0);
    /* Asleep: subscribed, and its try after subscribing done. */
    for (int i = 0; i < 4000 && (test_redis_numsub(&r, "dlock:{quiet}:release") < 1 ||
                                 test_redis_calls(&r, "evalsha") - before < 2); i++)
        test_sleep_ms(5);
    asleep_at = mono_ms();
    CHECK(test_redis_cmd(&r, "DEL dlock:{quiet}") == 1); /* no release, no message */
    for (int i = 0; i < 3000 && !atomic_load(&a.done); i++)
        test_sleep_ms(10);
    took = mono_ms() - asleep_at;
    fprintf(stderr, "lock taken %lld ms after the waiter's last try (a quarter lease: 3000)\n",
            (long long)took);
    CHECK(atomic_load(&a.done));
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(a.rc, DLOCK_OK);
    CHECK(took <= 3000 + 2000);
    CHECK_RC(dlock_release(a.lock), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_ELOST);
    dlock_client_free(holder_c);
    dlock_client_free(waiter_c);
    test_redis_stop(&r);
}

TEST_MAIN({"sockets_cloexec_and_no_sigpipe", sockets_cloexec_and_no_sigpipe, NULL}, {"bad_input_before_network", bad_input_before_network, NULL},
          {"on_lost_via_check", on_lost_via_check, "watchdog"},
          {"handoff_counted_and_logged", handoff_counted_and_logged, "watchdog"},
          {"release_from_on_lost_is_misuse", release_from_on_lost_is_misuse, "watchdog"},
          {"server_killed_and_restarted", server_killed_and_restarted, "watchdog"},
          {"fence_survives_restart_with_aof", fence_survives_restart_with_aof, NULL},
          {"waiter_woken_by_release", waiter_woken_by_release, "watchdog"},
          {"release_wakes_one_waiter", release_wakes_one_waiter, "watchdog"},
          {"noscript_and_reconnect", noscript_and_reconnect, NULL},
          {"command_connection_shared", command_connection_shared, "watchdog"},
          {"shared_connection_killed", shared_connection_killed, "watchdog"},
          {"shared_connection_timed_out", shared_connection_timed_out, "watchdog"},
          {"release_hands_over", release_hands_over, "watchdog"},
          {"listened_grant_without_renewal", listened_grant_without_renewal, NULL},
          {"listener_lost_falls_back", listener_lost_falls_back, NULL},
          {"handed_to_a_dead_waiter", handed_to_a_dead_waiter, "watchdog"},
          {"leave_after_hand_over", leave_after_hand_over, NULL},
          {"hand_over_fence_paths", hand_over_fence_paths, NULL},
          {"auth_and_db_and_unix", auth_and_db_and_unix, NULL}, {"maxmemory_reached", maxmemory_reached, NULL},
          {"lost_wakeup_costs_a_quarter_lease", lost_wakeup_costs_a_quarter_lease, "watchdog"},
          {"renewal_batch_cost", renewal_batch_cost, "watchdog"})
