/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * redis-sentinel:// against Debian's redis-server and redis-sentinel: a
 * master, 2 replicas and 3 sentinels on loopback (test_sentinel_start). The
 * URL's errors, min_replicas's WAIT, and a SIGKILLed master while locks are
 * held: the client follows the new master, holds that survive are counted
 * (printed for min_replicas=0 and 1), and with 1 no fence goes back. A
 * sentinel an attacker reconfigured is outvoted by the other two; the
 * sentinels' password and ACL user. The conformance suite runs on a
 * Sentinel URL too (core-redis-sentinel).
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "test.h"

static void refused(const char *url, const char *needle)
{
    test_url_refused(url, needle);
}

/* Bad Sentinel URLs are refused before any I/O, naming what is wrong. */
static void url_errors(void)
{
    refused("redis-sentinel://127.0.0.1:1", "expected the master's name as the path");
    refused("redis-sentinel://127.0.0.1:1/a/b", "expected the master's name as the path");
    refused("redis-sentinel://127.0.0.1:1/m?min_replicas=x", "min_replicas must be a number");
    refused("redis-sentinel://127.0.0.1:1/m?min_replicas=-1", "min_replicas must be a number");
    refused("redis-sentinel://u:p@127.0.0.1:1/m?password=q", "password is given twice");
    refused("redis-sentinel://127.0.0.1:1/m?sentinel_password=", "sentinel_password= is empty");
    refused("redis-sentinel://127.0.0.1:1/m?db=1&wait=3", "unknown parameter 'wait'");
    refused("redis-sentinel://127.0.0.1:1/m?cacert=/x", "use rediss-sentinel://");
    refused("rediss-sentinel://127.0.0.1:1/m?insecure=2", "insecure must be 0 or 1");
}

/* No sentinel knows the master: ECONN after the connect timeout, saying so. */
static void unknown_master(void)
{
    test_sentinel s;
    dlock_client *c = NULL;
    dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;
    char url[600];

    test_sentinel_start(&s, NULL, 0);
    snprintf(url, sizeof(url), "%.*s/other", (int)(strrchr(s.url, '/') - s.url), s.url);
    o.connect_timeout_ms = 500;
    CHECK_RC(dlock_client_open(&c, url, &o), DLOCK_ECONN);
    CHECK_CONTAINS(dlock_error_message(), "does not know this master name");
    test_sentinel_stop(&s);
}

/* min_replicas=N: N replicas acknowledge (2 of 2), or the acquire fails
 * with DLOCK_ESERVER and the key is gone from the master (3 of 2). */
static void min_replicas_wait(void)
{
    test_sentinel s;
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    dlock_acquire_options ao = test_opts(0, 10000, 1);
    char url[600];

    test_sentinel_start(&s, NULL, 0);
    snprintf(url, sizeof(url), "%s?min_replicas=2", s.url);
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "two", &ao), DLOCK_OK);
    /* acknowledged by both: the replicas hold it as the master does */
    for (int i = 1; i <= TEST_SENTINEL_REPLICAS; i++)
        CHECK(test_redis_cmd(&s.nodes[i], "EXISTS dlock:{two}") == 1);
    CHECK_RC(dlock_lock_extend(l, 10000), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);

    snprintf(url, sizeof(url), "%s?min_replicas=3", s.url);
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "three", &ao), DLOCK_ESERVER);
    CHECK(l == NULL);
    CHECK_CONTAINS(dlock_error_message(), "2 of 3 replicas acknowledged the write");
    CHECK_CONTAINS(dlock_error_message(), "the lock was released");
    CHECK(test_redis_cmd(&s.nodes[0], "EXISTS dlock:{three}") == 0);
    dlock_client_free(c);
    test_sentinel_stop(&s);
}

/* ---- a failover while locks are held ------------------------------------ */

#define HOLDS_MAX 3000

typedef struct {
    dlock_client *c;
    atomic_int stop;
    atomic_int n; /* locks held, read by the main thread while they are taken */
    dlock_lock *locks[HOLDS_MAX];
    uint64_t fences[HOLDS_MAX];
    int errors;
} holder;

/* Take locks h0, h1, ... one after another (long leases, not renewed)
 * until told to stop, through the failover. */
static void *hold_many(void *arg)
{
    holder *h = arg;
    dlock_acquire_options ao = test_opts(0, 120000, 0);

    while (!atomic_load(&h->stop) && h->n < HOLDS_MAX) {
        char name[32];
        snprintf(name, sizeof(name), "h%d", h->n);
        if (dlock_acquire(&h->locks[h->n], h->c, name, &ao) == DLOCK_OK) {
            h->fences[h->n] = dlock_lock_fence(h->locks[h->n]);
            h->n++;
        } else {
            h->errors++;
        }
    }
    return NULL;
}

typedef struct {
    int held, survived, fences_back, follow_ok;
} failover_count;

/*
 * Hold locks while the master is SIGKILLed and the sentinels promote a
 * replica; then count the holds the new master still has (dlock_lock_check)
 * and, taking each name again, the fences not above the one given before.
 */
static failover_count failover_run(int min_replicas, int mode)
{
    test_sentinel s;
    holder *h = calloc(1, sizeof(*h));
    dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_acquire_options ao = test_opts(0, 120000, 0);
    failover_count n = {0};
    pthread_t t;
    char url[600];
    int promoted;

    CHECK(h != NULL);
    test_sentinel_start(&s, NULL, mode);
    snprintf(url, sizeof(url), "%s?min_replicas=%d", s.url, min_replicas);
    /* The failover takes a few seconds (down-after-milliseconds 1000):
     * a call that meets it waits for the new master this long. */
    o.connect_timeout_ms = 30000;
    CHECK_RC(dlock_client_open(&h->c, url, &o), DLOCK_OK);
    CHECK(pthread_create(&t, NULL, hold_many, h) == 0);
    while (h->n < 200)
        test_sleep_ms(5);
    promoted = test_sentinel_failover(&s);
    CHECK(promoted > 0);
    /* The client follows: a lock taken now is on the new master. */
    {
        dlock_lock *l = NULL;
        CHECK_RC(dlock_acquire(&l, h->c, "after", &ao), DLOCK_OK);
        CHECK(test_redis_cmd(&s.nodes[promoted], "EXISTS dlock:{after}") == 1);
        CHECK_RC(dlock_release(l), DLOCK_OK);
        n.follow_ok = 1;
    }
    atomic_store(&h->stop, 1);
    pthread_join(t, NULL);
    n.held = h->n;
    for (int i = 0; i < h->n; i++) {
        char name[32];

        snprintf(name, sizeof(name), "h%d", i);
        test_retake(h->c, h->locks[i], name, h->fences[i], &n.survived, &n.fences_back,
                    min_replicas ? "min_replicas=1" : "min_replicas=0");
    }
    printf("sentinel failover (SIGKILL of the master), replicas %s, min_replicas=%d: %d of "
           "%d holds survived, %d fences not above the one given before (%d acquisitions "
           "failed)\n", mode == TEST_SENTINEL_SYNCING ? "in their first sync" : "in sync",
           min_replicas, n.survived, n.held, n.fences_back, h->errors);
    fflush(stdout);
    dlock_client_free(h->c);
    free(h);
    test_sentinel_stop(&s);
    return n;
}

/* min_replicas=1: every hold acknowledged by a replica survives the
 * failover to that replica (Sentinel promotes the most advanced one), and
 * no fence goes back. */
static void check_min_replicas_1(int mode)
{
    failover_count n = failover_run(1, mode);

    CHECK(n.follow_ok);
    CHECK(n.held >= 200);
    CHECK(n.survived == n.held);
    CHECK(n.fences_back == 0);
}

/* min_replicas=0: the client follows the new master; how many holds
 * survive is counted and printed, not asserted (writes that had not
 * reached a replica before the SIGKILL are gone). */
static void check_min_replicas_0(int mode)
{
    failover_count n = failover_run(0, mode);

    CHECK(n.follow_ok);
    CHECK(n.held >= 200);
}

static void failover_synced_1(void)
{
    check_min_replicas_1(1);
}

static void failover_synced_0(void)
{
    check_min_replicas_0(1);
}

/* The master dies while the replicas have not finished their first sync
 * (a replica just added or restarted). */
static void failover_syncing_1(void)
{
    check_min_replicas_1(TEST_SENTINEL_SYNCING);
}

static void failover_syncing_0(void)
{
    check_min_replicas_0(TEST_SENTINEL_SYNCING);
}

/* ---- a waiter across a failover ----------------------------------------- */

/* Subscribers of the channel on node i (0 when it is down). */
static long long subscribers(test_sentinel *s, int i, const char *channel)
{
    return s->nodes[i].pid > 0 ? test_redis_numsub(&s->nodes[i], channel) : 0;
}

/*
 * A dlock_acquire waiting (subscribed to the lock's release channel on the
 * master) when the master is SIGKILLed: its subscriber connection finds
 * the promoted master and subscribes there again, and it gets the lock
 * when the holder releases on the new master, with a greater fence, within
 * its wait. A second waiter gets the lock when its holder dies without a
 * release and the lease (kept on the new master) runs out.
 */
static void waiter_across_failover(void)
{
    test_sentinel s;
    dlock_client *h, *w, *w2;
    dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_lock *l, *dead;
    dlock_acquire_options ao;
    test_acquirer waiter, waiter2;
    pthread_t th, th2;
    char url[700];
    int promoted;
    uint64_t f1;

    test_sentinel_start(&s, NULL, 1);
    snprintf(url, sizeof(url), "%s?min_replicas=1", s.url);
    o.connect_timeout_ms = 30000;
    CHECK_RC(dlock_client_open(&h, url, &o), DLOCK_OK);
    CHECK_RC(dlock_client_open(&w, url, &o), DLOCK_OK);
    /* The second waiter takes its lock when the dead hold's lease runs
     * out, a fixed time after it was taken: the remaining replica may still
     * be in its first sync with the promoted master then (it was under
     * ASan in CI), and with min_replicas=1 that acquire would fail with
     * its distinct error, as documented. What this waiter shows is the
     * lease kept across the failover, so it asks for no acknowledgement. */
    CHECK_RC(dlock_client_open(&w2, s.url, &o), DLOCK_OK);
    ao = test_opts(0, 4000, 1);
    CHECK_RC(dlock_acquire(&l, h, "wf", &ao), DLOCK_OK);
    f1 = dlock_lock_fence(l);
    /* A hold that is never renewed nor released: its holder "died". */
    ao = test_opts(0, 6000, 0);
    CHECK_RC(dlock_acquire(&dead, h, "wf2", &ao), DLOCK_OK);
    test_acquirer_init(&waiter, w, "wf", test_opts(120000, 4000, 1));
    test_acquirer_init(&waiter2, w2, "wf2", test_opts(120000, 4000, 1));
    CHECK(pthread_create(&th, NULL, test_acquirer_main, &waiter) == 0);
    CHECK(pthread_create(&th2, NULL, test_acquirer_main, &waiter2) == 0);
    for (int i = 0; i < 3000 && (subscribers(&s, 0, "dlock:{wf}:release") < 1 ||
                                 subscribers(&s, 0, "dlock:{wf2}:release") < 1); i++)
        test_sleep_ms(10);
    CHECK(subscribers(&s, 0, "dlock:{wf}:release") == 1);
    CHECK(subscribers(&s, 0, "dlock:{wf2}:release") == 1);
    promoted = test_sentinel_failover(&s);
    CHECK(promoted > 0);
    /* The waiter subscribes again on the new master. */
    for (int i = 0; i < 6000 && subscribers(&s, promoted, "dlock:{wf}:release") < 1; i++)
        test_sleep_ms(10);
    CHECK(subscribers(&s, promoted, "dlock:{wf}:release") == 1);
    CHECK(!atomic_load(&waiter.done));
    /* The holder's hold was acknowledged: it is still the holder, renewed
     * on the new master, and its release wakes the waiter there. */
    CHECK_RC(dlock_lock_check(l), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(pthread_join(th, NULL) == 0);
    fprintf(stderr, "waiter after the failover: %s in %lld ms, fence %llu (the holder's %llu)\n",
            dlock_strerror(waiter.rc), (long long)waiter.took_ms,
            (unsigned long long)dlock_lock_fence(waiter.lock), (unsigned long long)f1);
    CHECK_RC(waiter.rc, DLOCK_OK);
    CHECK(dlock_lock_fence(waiter.lock) > f1);
    CHECK(test_redis_cmd(&s.nodes[promoted], "EXISTS dlock:{wf}") == 1);
    CHECK_RC(dlock_release(waiter.lock), DLOCK_OK);
    /* The dead holder's lease runs out on the new master: the other
     * waiter gets its lock. */
    CHECK(pthread_join(th2, NULL) == 0);
    if (waiter2.rc != DLOCK_OK)
        fprintf(stderr, "the second waiter: %s\n", waiter2.message);
    CHECK_RC(waiter2.rc, DLOCK_OK);
    CHECK(dlock_lock_fence(waiter2.lock) > dlock_lock_fence(dead));
    CHECK_RC(dlock_release(waiter2.lock), DLOCK_OK);
    CHECK_RC(dlock_release(dead), DLOCK_ELOST);
    dlock_client_free(h);
    dlock_client_free(w);
    dlock_client_free(w2);
    test_sentinel_stop(&s);
}

/* ---- ACL users and the sentinels' password ------------------------------ */

/* What a Sentinel client needs on the master besides the README's and
 * docs/family.md's rules (docs/redis-sentinel.md): ROLE, to check that the
 * node a sentinel named is the master, and WAIT for min_replicas. */
#define SENTINEL_ACL "+role +wait"

/* Set an ACL user on the master and both replicas (ACL SETUSER is not
 * replicated: a promoted replica must have it already). */
static void acl_setuser_all(test_sentinel *s, const char *user, const char *rules)
{
    for (int i = 0; i <= TEST_SENTINEL_REPLICAS; i++) {
        char pw[64];
        snprintf(pw, sizeof(pw), "pw-%s", user);
        test_acl_setuser(&s->nodes[i], user, pw, rules);
    }
}

static void acl_scenario_or_fail(const char *url, const char *when)
{
    char msg[1024];
    int code, step = test_acl_scenario(url, 30000, &code, msg, sizeof(msg));

    if (step != 0) {
        fprintf(stderr, "minimal ACL user on Sentinel, %s: step %d failed: %s\n", when, step,
                msg);
        exit(1);
    }
}

/*
 * The minimal ACL through Sentinel: a user with exactly the README's rules,
 * docs/family.md's and SENTINEL_ACL, on the master and both replicas, runs
 * the lock family with its fences (test_acl_scenario); the master is
 * SIGKILLed and the same user runs it again on the promoted replica, with
 * the fences going on. A user without ROLE gets DLOCK_EAUTH naming it,
 * without EVALSHA the same, without WAIT (min_replicas=1) too and its hold
 * is gone; no message holds the password.
 */
static void acl_minimal_user(void)
{
    test_sentinel s;
    dlock_client *c;
    dlock_lock *l = NULL;
    dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_acquire_options ao = test_opts(0, 120000, 0);
    char url[700];
    const char *hosts;
    uint64_t before;
    int promoted;

    test_sentinel_start(&s, NULL, 1);
    hosts = s.url + strlen("redis-sentinel://");
    acl_setuser_all(&s, "dlock", TEST_ACL_README " " TEST_ACL_FAMILY " " SENTINEL_ACL);
    acl_setuser_all(&s, "norole", TEST_ACL_README " " TEST_ACL_FAMILY " +wait");
    acl_setuser_all(&s, "nowait", TEST_ACL_README " " TEST_ACL_FAMILY " +role");
    acl_setuser_all(&s, "noevalsha", TEST_ACL_README " " TEST_ACL_FAMILY " " SENTINEL_ACL
                                     " -evalsha");
    snprintf(url, sizeof(url), "redis-sentinel://dlock:pw-dlock@%s?min_replicas=1", hosts);
    acl_scenario_or_fail(url, "before a failover");
    o.connect_timeout_ms = 30000;
    CHECK_RC(dlock_client_open(&c, url, &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "acl-held", &ao), DLOCK_OK);
    before = dlock_lock_fence(l);
    promoted = test_sentinel_failover(&s);
    CHECK(promoted > 0);
    /* The hold was acknowledged by a replica (min_replicas=1): it is on the
     * new master, and the same user checks and releases it there. */
    CHECK_RC(dlock_lock_check(l), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "acl-held", &ao), DLOCK_OK);
    CHECK(dlock_lock_fence(l) > before);
    CHECK(test_redis_cmd(&s.nodes[promoted], "EXISTS dlock:{acl-held}") == 1);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    acl_scenario_or_fail(url, "after a failover");

    snprintf(url, sizeof(url), "redis-sentinel://norole:pw-norole@%s", hosts);
    test_open_refused(url, 2000, DLOCK_EAUTH, "without ROLE", "redis-sentinel dlock", "'role'");
    snprintf(url, sizeof(url), "redis-sentinel://noevalsha:pw-noevalsha@%s", hosts);
    test_acquire_refused(url, DLOCK_EAUTH, "without EVALSHA", "'evalsha'", "pw-");
    /* min_replicas without WAIT: the acquire fails naming it, and the hold
     * its script wrote is not left behind. */
    snprintf(url, sizeof(url), "redis-sentinel://nowait:pw-nowait@%s?min_replicas=1", hosts);
    test_acquire_refused(url, DLOCK_EAUTH, "without WAIT", "'wait'", "pw-");
    CHECK(test_redis_cmd(&s.nodes[promoted], "EXISTS dlock:{refused}") == 0);
    test_sentinel_stop(&s);
}

/*
 * Sentinels that require a password (requirepass, set on each running
 * sentinel with ACL SETUSER default): sentinel_password= is sent to them
 * and the client finds the master; without it, or with a wrong one,
 * DLOCK_EAUTH (not ECONN after trying the sentinels until the connect
 * timeout), naming the sentinel and not the password. The master's own password (requirepass
 * on the master and replicas, a different one) goes to the master only.
 */
static void sentinel_password(void)
{
    test_sentinel s;
    dlock_client *c;
    dlock_lock *l;
    dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;
    char url[700], base[600];

    test_sentinel_start(&s, NULL, 0);
    snprintf(base, sizeof(base), "%.*s", (int)(strrchr(s.url, '/') - s.url), s.url);
    for (int i = 0; i < TEST_SENTINELS; i++)
        test_acl_setuser(&s.sentinels[i], "default", "sen-pw", "+@all ~* &*");
    for (int i = 0; i <= TEST_SENTINEL_REPLICAS; i++)
        test_acl_setuser(&s.nodes[i], "dlock", "master-pw", TEST_ACL_README " " SENTINEL_ACL);
    o.connect_timeout_ms = 10000;

    snprintf(url, sizeof(url), "redis-sentinel://dlock:master-pw@%s/dlock?sentinel_password="
             "sen-pw", base + strlen("redis-sentinel://"));
    CHECK_RC(dlock_client_open(&c, url, &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "spw", NULL), DLOCK_OK);
    CHECK(test_redis_cmd(&s.nodes[0], "EXISTS dlock:{spw}") == 1);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);

    snprintf(url, sizeof(url), "redis-sentinel://dlock:master-pw@%s/dlock",
             base + strlen("redis-sentinel://"));
    CHECK_RC(dlock_client_open(&c, url, &o), DLOCK_EAUTH);
    fprintf(stderr, "no sentinel_password: %s\n", dlock_error_message());
    CHECK_CONTAINS(dlock_error_message(), "sentinel 127.0.0.1:");
    CHECK_CONTAINS(dlock_error_message(), "NOAUTH");
    snprintf(url, sizeof(url), "redis-sentinel://dlock:master-pw@%s/dlock?sentinel_password="
             "wrong-pw", base + strlen("redis-sentinel://"));
    CHECK_RC(dlock_client_open(&c, url, &o), DLOCK_EAUTH);
    fprintf(stderr, "wrong sentinel_password: %s\n", dlock_error_message());
    CHECK_CONTAINS(dlock_error_message(), "sentinel 127.0.0.1:");
    CHECK(strstr(dlock_error_message(), "wrong-pw") == NULL);
    /* The sentinels' password is not the master's. */
    snprintf(url, sizeof(url), "redis-sentinel://dlock:sen-pw@%s/dlock?sentinel_password="
             "sen-pw", base + strlen("redis-sentinel://"));
    CHECK_RC(dlock_client_open(&c, url, &o), DLOCK_EAUTH);
    CHECK_CONTAINS(dlock_error_message(), "WRONGPASS");
    CHECK_CONTAINS(dlock_error_message(), "master");
    test_sentinel_stop(&s);
}

/* The sentinels' part of a URL: "redis-sentinel://" cut, "/dlock" kept. */
static const char *sentinel_hosts(const test_sentinel *s)
{
    return s->url + strlen("redis-sentinel://");
}

/*
 * An attacker who can reach one sentinel (no sentinel password) points it
 * at a master of their own: SENTINEL REMOVE and SENTINEL MONITOR on the
 * first sentinel of the URL, the one dlock asks first. The other two still
 * name the real master, a majority of the 3: the client finds it, and the
 * fake master sees no AUTH, no password and no client of dlock's. With one
 * honest sentinel down, the lying one and the last honest one disagree: no
 * majority, DLOCK_ECONN saying who named what, and still nothing sent to
 * the fake.
 */
static void lying_sentinel(void)
{
    test_sentinel s;
    test_fake_node fake;
    dlock_client *c;
    dlock_lock *l;
    dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;
    char url[700];

    test_sentinel_start(&s, NULL, 0);
    for (int i = 0; i <= TEST_SENTINEL_REPLICAS; i++)
        test_acl_setuser(&s.nodes[i], "dlock", "master-pw", TEST_ACL_README " " SENTINEL_ACL);
    test_fake_node_start(&fake, NULL, NULL);
    test_redis_cmd(&s.sentinels[0], "SENTINEL REMOVE dlock");
    test_redis_cmd(&s.sentinels[0], "SENTINEL MONITOR dlock 127.0.0.1 %d 1", fake.port);
    CHECK(test_sentinel_master(&s) == -1); /* the sentinels disagree */

    snprintf(url, sizeof(url), "redis-sentinel://dlock:master-pw@%s", sentinel_hosts(&s));
    o.connect_timeout_ms = 5000;
    CHECK_RC(dlock_client_open(&c, url, &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "lying", NULL), DLOCK_OK);
    CHECK(test_redis_cmd(&s.nodes[0], "EXISTS dlock:{lying}") == 1);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);

    test_redis_kill(&s.sentinels[2]);
    o.connect_timeout_ms = 1000;
    CHECK_RC(dlock_client_open(&c, url, &o), DLOCK_ECONN);
    fprintf(stderr, "one lying, one down: %s\n", dlock_error_message());
    CHECK_CONTAINS(dlock_error_message(), "no address named by a majority of the 3 sentinels");
    CHECK_CONTAINS(dlock_error_message(), "2 needed");

    CHECK(atomic_load(&fake.auths) == 0);
    CHECK(!test_fake_node_saw(&fake, "master-pw"));
    CHECK(!test_fake_node_saw(&fake, "dlock-"));
    test_fake_node_stop(&fake);
    test_sentinel_stop(&s);
}

/* One sentinel of 3 down: the other two are a majority and agree; db=N
 * is the master's database. */
static void one_sentinel_down(void)
{
    test_sentinel s;
    dlock_client *c;
    dlock_lock *l;
    dlock_lock_info info;
    dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;
    char url[600];

    test_sentinel_start(&s, NULL, 0);
    test_redis_kill(&s.sentinels[0]);
    o.connect_timeout_ms = 5000;
    CHECK_RC(dlock_client_open(&c, s.url, &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "one-down", NULL), DLOCK_OK);
    CHECK(test_redis_cmd(&s.nodes[0], "EXISTS dlock:{one-down}") == 1);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    /* db=N selects the master's database: the lock is not in database 0. */
    snprintf(url, sizeof(url), "%s?db=3", s.url);
    CHECK_RC(dlock_client_open(&c, url, &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "in-db-3", NULL), DLOCK_OK);
    CHECK(test_redis_cmd(&s.nodes[0], "EXISTS dlock:{in-db-3}") == 0);
    CHECK_RC(dlock_status(&info, c, "in-db-3"), DLOCK_OK);
    CHECK(info.held && info.fence == 1);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    test_sentinel_stop(&s);
}

/* What a client needs of a sentinel (docs/redis-sentinel.md). */
#define SENTINEL_USER_ACL "-@all +sentinel|get-master-addr-by-name +client|setname " \
                          "+subscribe resetchannels &+switch-master"

/*
 * Sentinels with an ACL user for clients (Redis 7) and the default user
 * behind a password: sentinel_user= and sentinel_password= log in as that
 * user, who needs only SENTINEL_USER_ACL; a wrong user or password is
 * DLOCK_EAUTH naming the sentinel, without the password; sentinel_user=
 * without sentinel_password= is refused before any I/O.
 */
static void sentinel_acl_user(void)
{
    test_sentinel s;
    dlock_client *c;
    dlock_lock *l;
    dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;
    char url[700];

    refused("redis-sentinel://127.0.0.1:1/m?sentinel_user=u",
            "sentinel_user= needs sentinel_password=");
    test_sentinel_start(&s, NULL, 0);
    for (int i = 0; i < TEST_SENTINELS; i++) {
        test_acl_setuser(&s.sentinels[i], "watcher", "watch-pw", SENTINEL_USER_ACL);
        test_acl_setuser(&s.sentinels[i], "default", "sen-pw", "+@all ~* &*");
    }
    o.connect_timeout_ms = 5000;
    snprintf(url, sizeof(url), "redis-sentinel://%s?sentinel_user=watcher&sentinel_password="
             "watch-pw", sentinel_hosts(&s));
    CHECK_RC(dlock_client_open(&c, url, &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "acl-sentinel", NULL), DLOCK_OK);
    CHECK(test_redis_cmd(&s.nodes[0], "EXISTS dlock:{acl-sentinel}") == 1);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);

    snprintf(url, sizeof(url), "redis-sentinel://%s?sentinel_user=watcher&sentinel_password="
             "wrong-pw", sentinel_hosts(&s));
    CHECK_RC(dlock_client_open(&c, url, &o), DLOCK_EAUTH);
    fprintf(stderr, "wrong sentinel user password: %s\n", dlock_error_message());
    CHECK_CONTAINS(dlock_error_message(), "sentinel 127.0.0.1:");
    CHECK_CONTAINS(dlock_error_message(), "WRONGPASS");
    CHECK(strstr(dlock_error_message(), "wrong-pw") == NULL);
    /* The user's password is not the default user's. */
    snprintf(url, sizeof(url), "redis-sentinel://%s?sentinel_password=watch-pw",
             sentinel_hosts(&s));
    CHECK_RC(dlock_client_open(&c, url, &o), DLOCK_EAUTH);
    test_sentinel_stop(&s);
}

/* ---- TLS: rediss-sentinel:// ------------------------------------------- */

/*
 * Sentinels and servers that speak only TLS to clients and require client
 * certificates (test_sentinel_start_tls: replication and the sentinels'
 * links over TLS too). cacert=, cert= and key= apply to the sentinels and
 * to the master: a lock cycle works, a failover is followed over TLS and
 * an acknowledged hold survives it; without a client certificate, with the
 * wrong CA, or with an sni= the certificates do not carry, the sentinels
 * refuse (DLOCK_EAUTH, naming the sentinel and the cause); sni=localhost
 * (a name the certificates carry) works for the sentinels and the master.
 */
static void tls_sentinels(void)
{
    test_tls t;
    test_sentinel s;
    dlock_client *c;
    dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_lock *l, *l2;
    dlock_acquire_options ao = test_opts(0, 120000, 0);
    char url[1200], certs[600];
    int promoted;

    test_tls_make(&t);
    test_sentinel_start_tls(&s, &t, 1);
    CHECK(strncmp(s.url, "rediss-sentinel://", 18) == 0);
    snprintf(certs, sizeof(certs), "&cert=%s", test_tls_file(&t, "client.crt"));
    snprintf(certs + strlen(certs), sizeof(certs) - strlen(certs), "&key=%s",
             test_tls_file(&t, "client.key"));

    o.connect_timeout_ms = 30000;
    snprintf(url, sizeof(url), "%s%s&min_replicas=1", s.url, certs);
    CHECK_RC(dlock_client_open(&c, url, &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "tls-a", &ao), DLOCK_OK);
    CHECK(test_redis_cmd(&s.nodes[0], "EXISTS dlock:{tls-a}") == 1);
    /* The client's connection to the master is TLS: none of the master's
     * plain clients is named dlock. */
    promoted = test_sentinel_failover(&s);
    CHECK(promoted > 0);
    CHECK_RC(dlock_lock_check(l), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l2, c, "tls-b", &ao), DLOCK_OK);
    CHECK(test_redis_cmd(&s.nodes[promoted], "EXISTS dlock:{tls-b}") == 1);
    CHECK(dlock_lock_fence(l2) == 1);
    CHECK_RC(dlock_release(l2), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);

    snprintf(url, sizeof(url), "%s%s&sni=localhost", s.url, certs);
    CHECK_RC(dlock_client_open(&c, url, &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "tls-a", &ao), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);

    test_open_refused(s.url, 3000, DLOCK_EAUTH, "no client certificate", "sentinel 127.0.0.1:",
                      "client certificate");
    snprintf(url, sizeof(url), "%s%s&sni=redis.example.com", s.url, certs);
    test_open_refused(url, 3000, DLOCK_EAUTH, "sni not in the certificates",
                      "sentinel 127.0.0.1:", "name mismatch");
    snprintf(url, sizeof(url), "rediss-sentinel://%.*s?cacert=%s%s",
             (int)(strchr(s.url, '?') - s.url - 18), s.url + 18,
             test_tls_file(&t, "other-ca.crt"), certs);
    test_open_refused(url, 3000, DLOCK_EAUTH, "another CA", "sentinel 127.0.0.1:", "unknown CA");
    test_sentinel_stop(&s);
    test_tls_remove(&t);
}

TEST_MAIN({"url_errors", url_errors, NULL}, {"unknown_master", unknown_master, NULL},
          {"min_replicas_wait", min_replicas_wait, NULL},
          {"failover_synced_1", failover_synced_1, NULL},
          {"failover_synced_0", failover_synced_0, NULL},
          {"failover_syncing_1", failover_syncing_1, NULL},
          {"failover_syncing_0", failover_syncing_0, NULL},
          {"acl_minimal_user", acl_minimal_user, NULL},
          {"sentinel_password", sentinel_password, NULL},
          {"lying_sentinel", lying_sentinel, NULL},
          {"one_sentinel_down", one_sentinel_down, NULL},
          {"sentinel_acl_user", sentinel_acl_user, NULL},
          {"tls_sentinels", tls_sentinels, "tls"},
          {"waiter_across_failover", waiter_across_failover, "watchdog"})
