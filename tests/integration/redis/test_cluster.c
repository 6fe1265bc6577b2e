/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * redis-cluster:// against Debian's redis-server: 3 masters on loopback
 * (test_cluster_start, redis-cli --cluster create). The URL's errors; every
 * key of a lock in its name's slot, the fence floor of that slot included,
 * and a fence that stays above a retired counter; multi-locks refused
 * across slots and taken with a shared hash tag; renewals of locks spread
 * over the masters; a held and waited-on lock's slot moved to another
 * master (MOVED, ASK, TRYAGAIN) with the holder keeping it; the hand-off's
 * grant pushed to a waiter listening on the slot's master; a redirection
 * to outside the slot map refused; names with an empty hash tag. The
 * conformance suite runs on a cluster too (core-redis-cluster).
 */
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backends/redis/redis_cluster.h"
#include "test.h"

static void refused(const char *url, const char *needle)
{
    test_url_refused(url, needle);
}

/* Bad Cluster URLs are refused before any I/O, naming what is wrong. */
static void url_errors(void)
{
    refused("redis-cluster:///x", "no node given");
    refused("redis-cluster://127.0.0.1:1/2", "a cluster has no database number");
    refused("redis-cluster://127.0.0.1:1?db=1", "unknown parameter 'db'");
    refused("redis-cluster://127.0.0.1:1?cacert=/x", "use rediss-cluster://");
    refused("rediss-cluster://127.0.0.1:1?insecure=2", "insecure must be 0 or 1");
    refused("redis-cluster://127.0.0.1:1?min_replicas=x", "min_replicas must be a number");
    refused("redis-cluster://127.0.0.1:1?min_replicas=", "min_replicas must be a number");
    refused("rediss-sentinel://127.0.0.1:1/m/x", "expected the master's name as the path");
}

/* No node answers: ECONN naming the cluster. */
static void no_node(void)
{
    dlock_client *c = NULL;
    dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;

    o.connect_timeout_ms = 300;
    CHECK(dlock_client_open(&c, "redis-cluster://127.0.0.1:1,127.0.0.1:2", &o) == DLOCK_ECONN);
    CHECK_CONTAINS(dlock_error_message(), "redis-cluster 127.0.0.1:2");
}

static dlock_client *open_client(const test_cluster *t)
{
    dlock_client *c = NULL;

    CHECK_RC(dlock_client_open(&c, t->url, NULL), DLOCK_OK);
    return c;
}

/* The keys the cluster keeps, on every node, each checked to be served by
 * the node it is on; returns how many there are. */
static long long keys_in_place(test_cluster *t)
{
    long long n = 0;

    for (int i = 0; i < TEST_CLUSTER_NODES; i++) {
        long long k = test_redis_cmd(&t->nodes[i], "DBSIZE");
        CHECK(k >= 0);
        n += k;
    }
    return n;
}

/*
 * Every kind of lock works on the cluster (a script that touched a key of
 * another slot would fail: "non local key"), and each name's keys lie in
 * its slot. The fence floor is per slot: a counter retired into it (by
 * hand made due in its slot's registry) leaves the floor in that slot, and
 * the name's next fence is above every earlier one.
 */
static void one_slot_per_lock(void)
{
    test_cluster t;
    dlock_client *c;
    dlock_lock *l, *r1, *r2, *sem;
    dlock_acquire_options o = test_opts(0, 10000, 0);
    char floor_key[64], reg_key[64];
    int slot;
    uint64_t f;

    test_cluster_start(&t, NULL);
    c = open_client(&t);
    CHECK_RC(dlock_acquire(&l, c, "ff", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(l) == 1);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    o.kind = DLOCK_KIND_READ;
    CHECK_RC(dlock_acquire(&r1, c, "rw", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&r2, c, "rw", &o), DLOCK_OK);
    CHECK_RC(dlock_release(r1), DLOCK_OK);
    CHECK_RC(dlock_release(r2), DLOCK_OK);
    o.kind = DLOCK_KIND_SEMAPHORE;
    o.permits = 2;
    CHECK_RC(dlock_acquire(&sem, c, "sem", &o), DLOCK_OK);
    CHECK_RC(dlock_release(sem), DLOCK_OK);
    o.kind = DLOCK_KIND_MUTEX;
    o.permits = 0;
    CHECK(keys_in_place(&t) > 0);

    /* "ff}x" shares ff's hash tag (dlock:{ff}x} hashes "ff"): a second
     * name of the slot. Its counter is set to 500 and made due in the
     * slot's registry; ff's next upkeep token (128, a multiple of 16)
     * retires it into the slot's floor. */
    slot = test_cluster_slot(&t, "dlock:{ff}");
    CHECK(slot >= 0);
    CHECK_RC(dlock_acquire(&l, c, "ff}x", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(l) == 1);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    for (unsigned n = 0;; n++) {
        snprintf(floor_key, sizeof(floor_key), "dlock:{fence:%u}fence-floor", n);
        snprintf(reg_key, sizeof(reg_key), "dlock:{fence:%u}fence-registry", n);
        if (test_cluster_slot(&t, floor_key) == slot)
            break;
        CHECK(n < 1000000);
    }
    /* The registry of ff's slot lists both counters. */
    CHECK(test_cluster_cmd(&t, "dlock:{ff}", "ZCARD %s", reg_key) == 2);
    CHECK(test_cluster_cmd(&t, "dlock:{ff}", "SET dlock:{ff}x}:fence 500") == 2);
    CHECK(test_cluster_cmd(&t, "dlock:{ff}", "ZADD %s 0 dlock:{ff}x}:fence", reg_key) == 0);
    CHECK(test_cluster_cmd(&t, "dlock:{ff}", "SET dlock:{ff}:fence 127") == 2);
    CHECK_RC(dlock_acquire(&l, c, "ff", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(l) == 128);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(test_cluster_cmd(&t, "dlock:{ff}", "EXISTS dlock:{ff}x}:fence") == 0);
    /* The floor is in the slot and holds the retired counter's value. */
    CHECK(test_cluster_cmd(&t, "dlock:{ff}", "GET %s", floor_key) == 3); /* "500" */
    /* No global floor anywhere. */
    for (int i = 0; i < TEST_CLUSTER_NODES; i++)
        CHECK(test_redis_cmd(&t.nodes[i], "KEYS dlock:fence-floor") == 0);
    CHECK_RC(dlock_acquire(&l, c, "ff}x", &o), DLOCK_OK);
    f = dlock_lock_fence(l);
    fprintf(stderr, "after its counter was retired at 500, the next fence of ff}x is %llu\n",
            (unsigned long long)f);
    CHECK(f == 501);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    test_cluster_stop(&t);
}

/* Names in different slots cannot be taken all-or-none in one script: a
 * clear EINVAL; with a shared hash tag they are one slot and work. */
static void multi_slots(void)
{
    test_cluster t;
    dlock_client *c;
    dlock_lock *m = NULL;
    const char *apart[2] = {"a", "b"};
    const char *tagged[3] = {"{acct}a", "{acct}b", "{acct}c"};
    dlock_acquire_options o = test_opts(0, 10000, 0);

    test_cluster_start(&t, NULL);
    CHECK(test_cluster_slot(&t, "dlock:{a}") != test_cluster_slot(&t, "dlock:{b}"));
    c = open_client(&t);
    CHECK_RC(dlock_acquire_multi(&m, c, apart, 2, &o), DLOCK_EINVAL);
    CHECK(m == NULL);
    fprintf(stderr, "refused as expected: %s\n", dlock_error_message());
    CHECK_CONTAINS(dlock_error_message(), "different hash slots");
    CHECK_CONTAINS(dlock_error_message(), "shared hash tag");
    CHECK(!test_redis_cmd(&t.nodes[0], "EXISTS dlock:{a}") ||
          test_redis_cmd(&t.nodes[0], "EXISTS dlock:{a}") == -1);
    CHECK_RC(dlock_acquire_multi(&m, c, tagged, 3, &o), DLOCK_OK);
    CHECK(dlock_lock_count(m) == 3);
    for (size_t i = 0; i < 3; i++)
        CHECK(dlock_lock_fence_at(m, i) == 1);
    CHECK(test_cluster_cmd(&t, "dlock:{{acct}a}", "EXISTS dlock:{{acct}a} dlock:{{acct}c}") ==
          2);
    CHECK_RC(dlock_release(m), DLOCK_OK);
    dlock_client_free(c);
    test_cluster_stop(&t);
}

/* Locks on every master, renewed by the watchdog (one script per slot)
 * well past their lease. */
static void renew_across_masters(void)
{
    enum { LOCKS = 9 };
    test_cluster t;
    dlock_client *c, *other;
    dlock_lock *locks[LOCKS], *b;
    dlock_acquire_options o = test_opts(0, 300, 1);
    int on[TEST_CLUSTER_NODES] = {0};

    test_cluster_start(&t, NULL);
    c = open_client(&t);
    other = open_client(&t);
    atomic_store(&test_lost_calls, 0);
    o.on_lost = test_count_lost;
    for (int i = 0; i < LOCKS; i++) {
        char name[16], key[32];
        snprintf(name, sizeof(name), "rn%d", i);
        snprintf(key, sizeof(key), "dlock:{%s}", name);
        CHECK_RC(dlock_acquire(&locks[i], c, name, &o), DLOCK_OK);
        on[test_cluster_owner(&t, test_cluster_slot(&t, key))]++;
    }
    for (int i = 0; i < TEST_CLUSTER_NODES; i++)
        CHECK(on[i] > 0);
    test_sleep_ms(300 * 4);
    for (int i = 0; i < LOCKS; i++) {
        char name[16];
        snprintf(name, sizeof(name), "rn%d", i);
        CHECK(!dlock_lock_lost(locks[i]));
        CHECK_RC(dlock_lock_check(locks[i]), DLOCK_OK);
        CHECK_RC(dlock_acquire(&b, other, name, NULL), DLOCK_EBUSY);
    }
    for (int i = 0; i < LOCKS; i++)
        CHECK_RC(dlock_release(locks[i]), DLOCK_OK);
    CHECK(atomic_load(&test_lost_calls) == 0);
    dlock_client_free(c);
    dlock_client_free(other);
    test_cluster_stop(&t);
}

/* How many times the nodes answered with error word (MOVED, ASK, TRYAGAIN)
 * so far: INFO errorstats' errorstat_WORD:count=N, summed over the nodes. */
static long long redirections(test_cluster *t, const char *word)
{
    long long n = 0;
    char needle[64];

    snprintf(needle, sizeof(needle), "errorstat_%s:count=", word);
    for (int i = 0; i < TEST_CLUSTER_NODES; i++) {
        redisContext *c = redisConnect("127.0.0.1", t->nodes[i].port);
        redisReply *r = c != NULL && !c->err ? redisCommand(c, "INFO errorstats") : NULL;
        const char *at;
        CHECK(r != NULL && r->type == REDIS_REPLY_STRING);
        if ((at = strstr(r->str, needle)) != NULL)
            n += atoll(at + strlen(needle));
        freeReplyObject(r);
        redisFree(c);
    }
    return n;
}

/*
 * A held lock's slot moves to another master while a waiter waits on it:
 * its keys are migrated one by one (ASK and TRYAGAIN meanwhile), then the
 * slot is given to the new master (MOVED). The holder keeps the lock, its
 * renewals follow it to the new master, the waiter gets it after the
 * release with a greater fence, and a fresh name of that slot still gets
 * fences above the old ones.
 */
static void slot_moved_while_held(void)
{
    test_cluster t;
    dlock_client *c, *w;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 1000, 1);
    test_acquirer waiter;
    pthread_t th;
    int slot, from, to;
    uint64_t f1;

    test_cluster_start(&t, NULL);
    c = open_client(&t);
    w = open_client(&t);
    atomic_store(&test_lost_calls, 0);
    o.on_lost = test_count_lost;
    CHECK_RC(dlock_acquire(&l, c, "mv", &o), DLOCK_OK);
    f1 = dlock_lock_fence(l);
    test_acquirer_init(&waiter, w, "mv", test_opts(120000, 1000, 1));
    CHECK(pthread_create(&th, NULL, test_acquirer_main, &waiter) == 0);
    /* The waiter has made its hand-off entry (it waits, subscribed). */
    for (int i = 0; i < 3000 && test_cluster_cmd(&t, "dlock:{mv}", "EXISTS dlock:{mv}:next") !=
                                    1; i++)
        test_sleep_ms(10);
    CHECK(test_cluster_cmd(&t, "dlock:{mv}", "EXISTS dlock:{mv}:next") == 1);

    slot = test_cluster_slot(&t, "dlock:{mv}");
    from = test_cluster_owner(&t, slot);
    to = (from + 1) % TEST_CLUSTER_NODES;
    /* 400 ms migrating before the keys move, 100 ms between keys: the
     * watchdog renews (every ~333 ms) across the migration. */
    test_cluster_move_slot(&t, slot, to, 400);
    CHECK(test_cluster_owner(&t, slot) == to);
    CHECK(test_redis_cmd(&t.nodes[to], "EXISTS dlock:{mv}") == 1);
    /* Renewals follow the lock to its new master, past a few leases. */
    test_sleep_ms(3000);
    CHECK(!dlock_lock_lost(l));
    CHECK_RC(dlock_lock_check(l), DLOCK_OK);
    CHECK(test_redis_cmd(&t.nodes[to], "PTTL dlock:{mv}") > 0);
    CHECK(!atomic_load(&waiter.done));
    /* The renewals met the move: redirected by MOVED at least (ASK and
     * TRYAGAIN when one fell in the migration's window). */
    fprintf(stderr, "redirections: MOVED %lld, ASK %lld, TRYAGAIN %lld\n",
            redirections(&t, "MOVED"), redirections(&t, "ASK"), redirections(&t, "TRYAGAIN"));
    CHECK(redirections(&t, "MOVED") > 0);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(pthread_join(th, NULL) == 0);
    CHECK_RC(waiter.rc, DLOCK_OK);
    fprintf(stderr, "fence before the move %llu, the waiter's after it %llu\n",
            (unsigned long long)f1, (unsigned long long)dlock_lock_fence(waiter.lock));
    CHECK(dlock_lock_fence(waiter.lock) > f1);
    CHECK(atomic_load(&test_lost_calls) == 0);
    CHECK_RC(dlock_release(waiter.lock), DLOCK_OK);
    dlock_client_free(c);
    dlock_client_free(w);
    test_cluster_stop(&t);
}

/* The waiter in a lock's hand-off slot listens on a connection to the
 * slot's master (redis_listen.c): the release pushes its grant to the
 * waiter's list there, and the waiter holds the lock without a confirming
 * try. (slot_moved_while_held: a listener whose slot moves stops
 * listening, and its grant is announced.) */
static void hand_off_pushed_to_master(void)
{
    test_cluster t;
    dlock_client *c, *w;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 10000, 0);
    test_acquirer waiter;
    pthread_t th;
    char entry[256], clients[8192];
    int owner;
    long long rpush, scripts;

    test_cluster_start(&t, NULL);
    c = open_client(&t);
    w = open_client(&t);
    CHECK_RC(dlock_acquire(&l, c, "ho", &o), DLOCK_OK);
    owner = test_cluster_owner(&t, test_cluster_slot(&t, "dlock:{ho}"));
    /* No renewal, and a lease within the confirm window: nothing but the
     * release runs a script (listened_grant_without_renewal, test_redis). */
    test_acquirer_init(&waiter, w, "ho", test_opts(20000, 1500, 0));
    CHECK(pthread_create(&th, NULL, test_acquirer_main, &waiter) == 0);
    /* Its entry says it listens, and its BLPOP waits on the slot's master. */
    for (int i = 0; i < 3000; i++) {
        test_redis_text(&t.nodes[owner], entry, sizeof(entry), "GET dlock:{ho}:next");
        test_redis_text(&t.nodes[owner], clients, sizeof(clients), "CLIENT LIST");
        if (strstr(entry, " L") != NULL && strstr(clients, "name=dlock-listener") != NULL &&
            strstr(clients, "cmd=blpop") != NULL)
            break;
        test_sleep_ms(10);
    }
    CHECK(strstr(entry, " L") != NULL);
    CHECK(strstr(clients, "cmd=blpop") != NULL);
    rpush = test_redis_calls(&t.nodes[owner], "rpush");
    scripts = test_redis_calls(&t.nodes[owner], "evalsha");
    test_hand_over(l, &waiter, th);
    /* One push, and one script from the release on: the release's own. */
    CHECK(test_redis_calls(&t.nodes[owner], "rpush") == rpush + 1);
    CHECK(test_redis_calls(&t.nodes[owner], "evalsha") == scripts + 1);
    CHECK_RC(dlock_release(waiter.lock), DLOCK_OK);
    dlock_client_free(c);
    dlock_client_free(w);
    test_cluster_stop(&t);
}

/*
 * Held lock l, whose key is key, through its slot's migration to node to:
 * half migrated, the old master answers ASK and a check and an extend go
 * to the new one with ASKING; then the slot is handed over and the
 * release finds the lock there (MOVED).
 */
static void held_through_migration(test_cluster *t, dlock_lock *l, const char *key, int to)
{
    int slot = test_cluster_slot(t, key);
    long long asks;

    test_cluster_migrate_keys(t, slot, to, 0);
    CHECK(test_redis_cmd(&t->nodes[to], "EXISTS %s", key) == -1); /* MOVED: not its slot */
    asks = redirections(t, "ASK");
    CHECK_RC(dlock_lock_check(l), DLOCK_OK);
    CHECK_RC(dlock_lock_extend(l, 60000), DLOCK_OK);
    fprintf(stderr, "ASK answers during the check and extend: %lld\n",
            redirections(t, "ASK") - asks);
    CHECK(redirections(t, "ASK") - asks >= 2);
    test_cluster_finish_slot(t, slot, to);
    CHECK(test_redis_cmd(&t->nodes[to], "PTTL %s", key) > 30000);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(test_redis_cmd(&t->nodes[to], "EXISTS %s", key) == 0);
}

/* A held lock's slot left half migrated to another master, then handed
 * over (held_through_migration). */
static void ask_while_migrating(void)
{
    test_cluster t;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 30000, 0);
    int from;

    test_cluster_start(&t, NULL);
    c = open_client(&t);
    CHECK_RC(dlock_acquire(&l, c, "ak", &o), DLOCK_OK);
    from = test_cluster_owner(&t, test_cluster_slot(&t, "dlock:{ak}"));
    held_through_migration(&t, l, "dlock:{ak}", (from + 1) % TEST_CLUSTER_NODES);
    dlock_client_free(c);
    test_cluster_stop(&t);
}

/*
 * A slot half migrated in the worst order: a held fair lock's queue has
 * gone to the new master, its base key, fence counter, floor and registry
 * not yet. A waiter's try must not run on the old master then (Redis 7
 * stops the script there with "non local key", an error the router cannot
 * wait out). Its acquire script declares every key it touches, so Redis
 * answers TRYAGAIN, the router retries until the call's timeout, and
 * nothing is left on the old master. Once the slot is over, the waiter
 * gets the lock after the holder's release, with a greater fence.
 */
static void partial_migration(void)
{
    test_cluster t;
    dlock_client *c, *w;
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_lock *h, *h2, *wl = NULL;
    dlock_acquire_options o = test_opts(0, 30000, 0);
    char floor_key[64];
    int slot, from, to, rc;
    uint64_t f1;

    test_cluster_start(&t, NULL);
    c = open_client(&t);
    co.command_timeout_ms = 500;
    CHECK_RC(dlock_client_open(&w, t.url, &co), DLOCK_OK);
    o.kind = DLOCK_KIND_FAIR;
    CHECK_RC(dlock_acquire(&h, c, "pm", &o), DLOCK_OK);
    f1 = dlock_lock_fence(h);
    /* A second waiter, queued: the queue exists. */
    o.wait_ms = 200;
    CHECK_RC(dlock_acquire(&h2, c, "pm", &o), DLOCK_ETIMEOUT);
    slot = test_cluster_slot(&t, "dlock:{pm}");
    from = test_cluster_owner(&t, slot);
    to = (from + 1) % TEST_CLUSTER_NODES;
    /* A floor in the slot (0: no counter retired yet), so that every key
     * the script names itself exists on the old master. */
    for (unsigned n = 0;; n++) {
        snprintf(floor_key, sizeof(floor_key), "dlock:{fence:%u}fence-floor", n);
        if (test_cluster_slot(&t, floor_key) == slot)
            break;
    }
    CHECK(test_cluster_cmd(&t, "dlock:{pm}", "SET %s 0", floor_key) == 2);
    if (test_redis_cmd(&t.nodes[from], "EXISTS dlock:{pm}:queue") == 1) {
        test_cluster_mark_migrating(&t, slot, to);
        test_cluster_migrate_key(&t, slot, to, "dlock:{pm}:queue");
        if (test_redis_cmd(&t.nodes[from], "EXISTS dlock:{pm}:queue-exp") == 1)
            test_cluster_migrate_key(&t, slot, to, "dlock:{pm}:queue-exp");
    } else {
        /* (The queue expired already: a slow machine.) */
        test_cluster_mark_migrating(&t, slot, to);
    }
    o.wait_ms = 300;
    rc = dlock_acquire(&wl, w, "pm", &o);
    fprintf(stderr, "waiter's try in the half-migrated slot: %s (%s)\n", dlock_strerror(rc),
            dlock_error_message());
    CHECK(rc != DLOCK_OK);
    CHECK_CONTAINS(dlock_error_message(), "TRYAGAIN");
    /* Nothing new on the old master: its keys all still migrate. */
    CHECK(test_redis_cmd(&t.nodes[from], "EXISTS dlock:{pm}:queue") != 1);
    test_cluster_migrate_keys(&t, slot, to, 0);
    test_cluster_finish_slot(&t, slot, to);
    o.wait_ms = 0;
    CHECK_RC(dlock_acquire(&wl, w, "pm", &o), DLOCK_EBUSY);
    CHECK_RC(dlock_release(h), DLOCK_OK);
    o.wait_ms = 60000;
    CHECK_RC(dlock_acquire(&wl, w, "pm", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(wl) > f1);
    CHECK_RC(dlock_release(wl), DLOCK_OK);
    dlock_client_free(c);
    dlock_client_free(w);
    test_cluster_stop(&t);
}

typedef struct {
    dlock_lock *lock;
    atomic_int done;
    int rc;
    char msg[512];
} releaser;

static void *release_main(void *arg)
{
    releaser *r = arg;

    r->rc = dlock_release(r->lock);
    snprintf(r->msg, sizeof(r->msg), "%s", dlock_error_message());
    atomic_store(&r->done, 1);
    return NULL;
}

/* The release r answered TRYAGAIN (more than tries so far) and still
 * waiting 3 s later. */
static void wait_tryagain(test_cluster *t, long long tries, releaser *r)
{
    for (int i = 0; i < 3000 && redirections(t, "TRYAGAIN") - tries < 3; i++)
        test_sleep_ms(10);
    CHECK(redirections(t, "TRYAGAIN") - tries >= 3);
    test_sleep_ms(3000);
    if (atomic_load(&r->done))
        fprintf(stderr, "the release returned %s: %s\n", dlock_strerror(r->rc), r->msg);
    CHECK(!atomic_load(&r->done));
}

/*
 * A release in a slot set MIGRATING / IMPORTING by hand (CLUSTER SETSLOT),
 * the lock's keys still on the source: its script declares keys that are
 * there (the lock, its counter) and keys that are not (the hand-off entry),
 * so the source answers TRYAGAIN. The release waits and retries within its
 * command timeout instead of failing: it is still under way 3 s after the
 * first TRYAGAIN answers, and once the keys are moved and the slot handed over
 * it succeeds on the new master (the lock is gone there). The same with
 * a held fair lock (its release script once ran on the source and stopped
 * at its first derived key not there: "non local key") and the migration
 * undone (SETSLOT STABLE on both sides) instead of completed.
 */
static void release_in_half_migrated_slot(void)
{
    test_cluster t;
    dlock_client *c;
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_acquire_options o = test_opts(0, 60000, 0);
    releaser r = {0};
    pthread_t th;
    int slot, from, to;
    long long tries;

    test_cluster_start(&t, NULL);
    co.command_timeout_ms = 60000;
    CHECK_RC(dlock_client_open(&c, t.url, &co), DLOCK_OK);
    CHECK_RC(dlock_acquire(&r.lock, c, "hm", &o), DLOCK_OK);
    slot = test_cluster_slot(&t, "dlock:{hm}");
    from = test_cluster_owner(&t, slot);
    to = (from + 1) % TEST_CLUSTER_NODES;
    test_cluster_mark_migrating(&t, slot, to);
    tries = redirections(&t, "TRYAGAIN");
    CHECK(pthread_create(&th, NULL, release_main, &r) == 0);
    /* TRYAGAIN answers, and 3 s on the release still waits (the router
     * once gave up after 64 tries, 1.3 s). */
    wait_tryagain(&t, tries, &r);
    CHECK(test_redis_cmd(&t.nodes[from], "EXISTS dlock:{hm}") == 1);
    test_cluster_migrate_keys(&t, slot, to, 0);
    test_cluster_finish_slot(&t, slot, to);
    CHECK(pthread_join(th, NULL) == 0);
    fprintf(stderr, "release across the migration: %s after %lld TRYAGAIN answers (%s)\n",
            dlock_strerror(r.rc), redirections(&t, "TRYAGAIN") - tries, r.msg);
    CHECK_RC(r.rc, DLOCK_OK);
    CHECK(test_redis_cmd(&t.nodes[to], "EXISTS dlock:{hm}") == 0);

    /* A fair lock, the migration undone. */
    memset(&r, 0, sizeof(r));
    o.kind = DLOCK_KIND_FAIR;
    CHECK_RC(dlock_acquire(&r.lock, c, "hm", &o), DLOCK_OK);
    from = to;
    to = (from + 1) % TEST_CLUSTER_NODES;
    test_cluster_mark_migrating(&t, slot, to);
    tries = redirections(&t, "TRYAGAIN");
    CHECK(pthread_create(&th, NULL, release_main, &r) == 0);
    wait_tryagain(&t, tries, &r);
    CHECK(test_redis_cmd(&t.nodes[to], "CLUSTER SETSLOT %d STABLE", slot) == 2);
    CHECK(test_redis_cmd(&t.nodes[from], "CLUSTER SETSLOT %d STABLE", slot) == 2);
    CHECK(pthread_join(th, NULL) == 0);
    CHECK_RC(r.rc, DLOCK_OK);
    CHECK(test_redis_cmd(&t.nodes[from], "EXISTS dlock:{hm}") == 0);
    dlock_client_free(c);
    test_cluster_stop(&t);
}

/* Move the keys of key's slot to the next master, the slot left half
 * migrated (its old master answers ASK); returns the new master, *slot and
 * *from set. */
static int half_migrate(test_cluster *t, const char *key, int *slot, int *from)
{
    int to;

    *slot = test_cluster_slot(t, key);
    *from = test_cluster_owner(t, *slot);
    to = (*from + 1) % TEST_CLUSTER_NODES;
    test_cluster_migrate_keys(t, *slot, to, 0);
    return to;
}

/* What a cluster client needs besides the README's and docs/family.md's
 * rules (docs/redis-cluster.md): the slot map and ASK redirections. */
#define CLUSTER_ACL "+cluster|slots +asking"

/* Set an ACL user on every node of the cluster (ACL SETUSER is not
 * propagated between nodes). */
static void acl_setuser_all(test_cluster *t, const char *user, const char *rules)
{
    for (int i = 0; i < TEST_CLUSTER_NODES; i++)
    {
        char pw[64];
        snprintf(pw, sizeof(pw), "pw-%s", user);
        test_acl_setuser(&t->nodes[i], user, pw, rules);
    }
}

/*
 * The minimal ACL on a cluster: a user with exactly the README's rules,
 * docs/family.md's and CLUSTER_ACL, set on every node, runs the lock family
 * (test_acl_scenario) with its fences, also across a slot moved to another
 * master while held (MOVED, ASK: the holder's check and release follow).
 * A user without CLUSTER SLOTS or without ASKING gets DLOCK_EAUTH naming
 * the command, without EVALSHA the same.
 */
static void acl_minimal_user(void)
{
    test_cluster t;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 30000, 0);
    char url[512], msg[1024];
    int code, step, slot, from, to;

    test_cluster_start(&t, NULL);
    acl_setuser_all(&t, "dlock", TEST_ACL_README " " TEST_ACL_FAMILY " " CLUSTER_ACL);
    acl_setuser_all(&t, "noslots", TEST_ACL_README " " TEST_ACL_FAMILY " +asking");
    acl_setuser_all(&t, "noasking", TEST_ACL_README " " TEST_ACL_FAMILY " +cluster|slots");
    acl_setuser_all(&t, "noevalsha", TEST_ACL_README " " TEST_ACL_FAMILY " " CLUSTER_ACL
                                     " -evalsha");
    snprintf(url, sizeof(url), "redis-cluster://dlock:pw-dlock@%s", t.url + 16);
    step = test_acl_scenario(url, 2000, &code, msg, sizeof(msg));
    if (step != 0) {
        fprintf(stderr, "minimal ACL user on a cluster: step %d failed: %s\n", step, msg);
        exit(1);
    }
    /* A held lock's slot half migrated: check and extend follow ASK with
     * ASKING; then the slot is handed over and the release follows MOVED. */
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "acl-mv", &o), DLOCK_OK);
    to = half_migrate(&t, "dlock:{acl-mv}", &slot, &from);
    CHECK_RC(dlock_lock_check(l), DLOCK_OK);
    CHECK_RC(dlock_lock_extend(l, 30000), DLOCK_OK);
    test_cluster_finish_slot(&t, slot, to);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(test_redis_cmd(&t.nodes[to], "EXISTS dlock:{acl-mv}") == 0);

    /* ASK met by a user without ASKING: a clear EAUTH, not a loop. */
    CHECK_RC(dlock_acquire(&l, c, "acl-mv", &o), DLOCK_OK);
    snprintf(url, sizeof(url), "redis-cluster://noasking:pw-noasking@%s", t.url + 16);
    {
        dlock_client *na;
        dlock_lock_info info;
        CHECK_RC(dlock_client_open(&na, url, NULL), DLOCK_OK);
        CHECK_RC(dlock_status(&info, na, "acl-mv"), DLOCK_OK); /* maps the slot */
        test_cluster_migrate_keys(&t, slot, from, 0);
        CHECK_RC(dlock_status(&info, na, "acl-mv"), DLOCK_EAUTH);
        fprintf(stderr, "without ASKING: %s\n", dlock_error_message());
        CHECK_CONTAINS(dlock_error_message(), "'asking'");
        dlock_client_free(na);
    }
    test_cluster_finish_slot(&t, slot, from);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);

    snprintf(url, sizeof(url), "redis-cluster://noslots:pw-noslots@%s", t.url + 16);
    test_acquire_refused(url, DLOCK_EAUTH, "without CLUSTER SLOTS", "'cluster|slots'", "pw-");
    snprintf(url, sizeof(url), "redis-cluster://noevalsha:pw-noevalsha@%s", t.url + 16);
    test_acquire_refused(url, DLOCK_EAUTH, "without EVALSHA", "'evalsha'", "pw-");
    test_cluster_stop(&t);
}

/*
 * rediss-cluster:// against a cluster that speaks TLS only to clients and
 * requires client certificates, its bus and replication over TLS too
 * (tls-cluster yes), created by redis-cli over TLS. The slot map names the
 * nodes' TLS ports; locks on every master with their fences, the lock
 * family (test_acl_scenario, as the default user), a held lock's slot
 * moved (MOVED and ASK followed over TLS) and released on its new master;
 * sni=localhost works on every node; without a client certificate, or
 * with another CA, DLOCK_EAUTH naming the node and the cause.
 */
static void tls_cluster(void)
{
    enum { LOCKS = 9 };
    test_tls t;
    test_cluster c;
    dlock_client *cl;
    dlock_lock *locks[LOCKS], *l;
    dlock_acquire_options o = test_opts(0, 30000, 1);
    int on[TEST_CLUSTER_NODES] = {0}, slot, from, to, code;
    char url[1200], msg[1200];

    test_tls_make(&t);
    test_cluster_start_tls(&c, &t);
    CHECK(strncmp(c.url, "rediss-cluster://", 17) == 0);
    snprintf(url, sizeof(url), "%s&cert=%s", c.url, test_tls_file(&t, "client.crt"));
    snprintf(url + strlen(url), sizeof(url) - strlen(url), "&key=%s",
             test_tls_file(&t, "client.key"));
    CHECK_RC(dlock_client_open(&cl, url, NULL), DLOCK_OK);
    for (int i = 0; i < LOCKS; i++) {
        char name[16], key[32];
        snprintf(name, sizeof(name), "tl%d", i);
        snprintf(key, sizeof(key), "dlock:{%s}", name);
        CHECK_RC(dlock_acquire(&locks[i], cl, name, &o), DLOCK_OK);
        CHECK(dlock_lock_fence(locks[i]) == 1);
        on[test_cluster_owner(&c, test_cluster_slot(&c, key))]++;
        CHECK(test_cluster_cmd(&c, key, "EXISTS %s", key) == 1);
    }
    for (int i = 0; i < TEST_CLUSTER_NODES; i++)
        CHECK(on[i] > 0);
    for (int i = 0; i < LOCKS; i++)
        CHECK_RC(dlock_release(locks[i]), DLOCK_OK);
    if (test_acl_scenario(url, 2000, &code, msg, sizeof(msg)) != 0) {
        fprintf(stderr, "the lock family over TLS: %s\n", msg);
        exit(1);
    }
    /* A held lock's slot moves: ASK, then MOVED, followed over TLS. */
    CHECK_RC(dlock_acquire(&l, cl, "tls-mv", &o), DLOCK_OK);
    to = half_migrate(&c, "dlock:{tls-mv}", &slot, &from);
    CHECK_RC(dlock_lock_check(l), DLOCK_OK);
    test_cluster_finish_slot(&c, slot, to);
    CHECK_RC(dlock_lock_extend(l, 30000), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, cl, "tls-mv", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(l) == 2);
    CHECK(test_redis_cmd(&c.nodes[to], "EXISTS dlock:{tls-mv}") == 1);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(cl);

    snprintf(msg, sizeof(msg), "%s", url);
    CHECK(snprintf(url, sizeof(url), "%s&sni=localhost", msg) < (int)sizeof(url));
    CHECK_RC(dlock_client_open(&cl, url, NULL), DLOCK_OK);
    for (int i = 0; i < LOCKS; i++) {
        char name[16];
        snprintf(name, sizeof(name), "tl%d", i);
        CHECK_RC(dlock_acquire(&locks[i], cl, name, &o), DLOCK_OK);
        CHECK(dlock_lock_fence(locks[i]) == 2);
        CHECK_RC(dlock_release(locks[i]), DLOCK_OK);
    }
    dlock_client_free(cl);

    test_open_refused(c.url, 2000, DLOCK_EAUTH, "no client certificate",
                      "rediss-cluster 127.0.0.1:", "client certificate");
    snprintf(url, sizeof(url), "%.*s?cacert=%s", (int)(strchr(c.url, '?') - c.url), c.url,
             test_tls_file(&t, "other-ca.crt"));
    test_open_refused(url, 2000, DLOCK_EAUTH, "another CA", "rediss-cluster 127.0.0.1:",
                      "unknown CA");
    test_cluster_stop(&c);
    test_tls_remove(&t);
}

/* ---- a master's failover ----------------------------------------------- */

#define HOLDS_MAX 3000

typedef struct {
    dlock_client *c;
    const char *tag;
    atomic_int stop;
    atomic_int n;
    dlock_lock *locks[HOLDS_MAX];
    uint64_t fences[HOLDS_MAX];
    int errors;
    char last_error[300];
} holder;

/* Take locks {TAG}h0, {TAG}h1, ... (one slot, long leases, not renewed)
 * one after another until told to stop, through the failover. */
static void *hold_many(void *arg)
{
    holder *h = arg;
    dlock_acquire_options ao = test_opts(0, 120000, 0);

    while (!atomic_load(&h->stop) && atomic_load(&h->n) < HOLDS_MAX) {
        char name[48];
        int n = atomic_load(&h->n);
        snprintf(name, sizeof(name), "{%s}h%d", h->tag, n);
        if (dlock_acquire(&h->locks[n], h->c, name, &ao) == DLOCK_OK) {
            h->fences[n] = dlock_lock_fence(h->locks[n]);
            atomic_store(&h->n, n + 1);
        } else {
            h->errors++;
            snprintf(h->last_error, sizeof(h->last_error), "%s", dlock_error_message());
        }
    }
    return NULL;
}

/*
 * 3 masters with a replica each. Locks are taken in one slot of a master
 * in a loop while that master is SIGKILLed; its replica is promoted
 * (cluster-node-timeout 2000). The client follows (a refused connection,
 * CLUSTERDOWN: the slot map is asked again, within the call's 30 s
 * timeout); the old master is restarted and rejoins as a replica: a lock
 * taken then is on the promoted replica. Then each hold is checked on it and each name taken again, counting the
 * fences not above the one given before. Returns the holds that survived;
 * *held and *back get the holds taken and the fences that went back.
 */
static int failover_run(int min_replicas, int *held, int *back)
{
    test_cluster t;
    holder *h = calloc(1, sizeof(*h));
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_acquire_options ao = test_opts(0, 120000, 0);
    dlock_lock *l;
    static char tag[16];
    char url[600], name[48], key[64];
    int slot = -1, victim = -1, promoted = -1, survived = 0;

    CHECK(h != NULL);
    test_cluster_start_replicas(&t, "--cluster-node-timeout 2000");
    /* Names {TAG}hN whose slot is on the first master: their keys
     * dlock:{{TAG}hN} hash "{TAG". */
    for (int i = 0; victim < 0 || victim != test_cluster_owner(&t, 0); i++) {
        snprintf(tag, sizeof(tag), "fo%d", i);
        snprintf(key, sizeof(key), "dlock:{{%s}h0}", tag);
        slot = test_cluster_slot(&t, key);
        victim = test_cluster_owner(&t, slot);
        CHECK(i < 1000);
    }
    if (min_replicas > 0) {
        /* WAIT on the slot's master: its one replica acknowledges 1, not
         * 2; the acquire then fails and gives the hold back. */
        dlock_client *c2;
        co.command_timeout_ms = 1000;
        snprintf(url, sizeof(url), "%s?min_replicas=2", t.url);
        CHECK_RC(dlock_client_open(&c2, url, &co), DLOCK_OK);
        snprintf(name, sizeof(name), "{%s}two", tag);
        CHECK_RC(dlock_acquire(&l, c2, name, &ao), DLOCK_ESERVER);
        CHECK_CONTAINS(dlock_error_message(), "1 of 2 replicas acknowledged the write");
        CHECK_CONTAINS(dlock_error_message(), "the lock was released");
        snprintf(key, sizeof(key), "dlock:{{%s}two}", tag);
        CHECK(test_redis_cmd(&t.nodes[victim], "EXISTS %s", key) == 0);
        dlock_client_free(c2);
    }
    snprintf(url, sizeof(url), "%s?min_replicas=%d", t.url, min_replicas);
    co.command_timeout_ms = 30000;
    CHECK_RC(dlock_client_open(&h->c, url, &co), DLOCK_OK);
    h->tag = tag;
    {
        pthread_t th;
        CHECK(pthread_create(&th, NULL, hold_many, h) == 0);
        while (atomic_load(&h->n) < 200)
            test_sleep_ms(5);
        test_redis_kill(&t.nodes[victim]);
        /* Until a replica serves the slot (the killed master answers
         * nothing: test_cluster_owner skips it). */
        for (int i = 0; i < 3000 && promoted < 0; i++) {
            promoted = test_cluster_owner(&t, slot);
            if (promoted < 0)
                test_sleep_ms(20);
        }
        if (promoted < 0) {
            char cmd[128];
            snprintf(cmd, sizeof(cmd), "redis-cli -p %d cluster nodes >&2",
                     t.nodes[(victim + 1) % t.n].port);
            if (system(cmd) != 0)
                fprintf(stderr, "no cluster nodes\n");
        }
        CHECK(promoted >= 0 && promoted != victim);
        /* The old master comes back as the new one's replica: with
         * min_replicas=1 nothing can be written until a replica is there
         * to acknowledge it (DLOCK_ESERVER, the hold given back), so the
         * lock taken after the failover is taken once it is back; with 0,
         * before (the client found the promoted replica by itself). */
        if (min_replicas > 0)
            test_redis_restart(&t.nodes[victim]);
        snprintf(name, sizeof(name), "{%s}after", tag);
        CHECK_RC(dlock_acquire(&l, h->c, name, &ao), DLOCK_OK);
        snprintf(key, sizeof(key), "dlock:{{%s}after}", tag);
        CHECK(test_redis_cmd(&t.nodes[promoted], "EXISTS %s", key) == 1);
        CHECK_RC(dlock_release(l), DLOCK_OK);
        if (min_replicas == 0)
            test_redis_restart(&t.nodes[victim]);
        atomic_store(&h->stop, 1);
        pthread_join(th, NULL);
    }
    *held = atomic_load(&h->n);
    *back = 0;
    for (int i = 0; i < *held; i++) {
        snprintf(name, sizeof(name), "{%s}h%d", tag, i);
        test_retake(h->c, h->locks[i], name, h->fences[i], &survived, back,
                    min_replicas ? "min_replicas=1" : "min_replicas=0");
    }
    printf("cluster failover (SIGKILL of a master, its replica promoted), min_replicas=%d: "
           "%d of %d holds survived, %d fences not above the one given before (%d "
           "acquisitions failed%s%s)\n", min_replicas, survived, *held, *back, h->errors,
           h->errors ? ", last: " : "", h->errors ? h->last_error : "");
    fflush(stdout);
    dlock_client_free(h->c);
    free(h);
    test_cluster_stop(&t);
    return survived;
}

/* min_replicas=1: every hold was acknowledged by the master's replica,
 * which is the one promoted: all survive, and no fence goes back. (And
 * min_replicas=2 with one replica fails, the hold given back.) */
static void failover_min_replicas_1(void)
{
    int held, back, survived = failover_run(1, &held, &back);

    CHECK(held >= 200);
    CHECK(survived == held);
    CHECK(back == 0);
}

/* min_replicas=0: the client follows the promoted replica; the holds
 * that survive are counted and printed, not asserted (a write that had not
 * reached the replica before the SIGKILL is gone). */
static void failover_min_replicas_0(void)
{
    int held, back;

    failover_run(0, &held, &back);
    CHECK(held >= 200);
}

/* ---- redirections to outside the cluster ---------------------------- */

typedef struct {
    const char *word; /* MOVED or ASK */
    int port;         /* where it sends the client */
} redirect;

/* A cluster node that lies: it owns every slot (CLUSTER SLOTS) and answers
 * every other command with a redirection to r->port, outside the map. */
static const char *lying_node(test_fake_node *f, int argc, char **argv, char *buf, size_t size)
{
    const redirect *r = f->arg;

    if (strcasecmp(argv[0], "CLUSTER") == 0 && argc == 2 && strcasecmp(argv[1], "SLOTS") == 0) {
        snprintf(buf, size, "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n",
                 f->port);
        return buf;
    }
    if (strcasecmp(argv[0], "AUTH") == 0 || strcasecmp(argv[0], "CLIENT") == 0 ||
        strcasecmp(argv[0], "ASKING") == 0)
        return "+OK\r\n";
    /* The slot of the script's first key, where the client sends it. */
    snprintf(buf, size, "-%s %u 127.0.0.1:%d\r\n", r->word,
             argc > 3 && (strcasecmp(argv[0], "EVALSHA") == 0 || strcasecmp(argv[0], "EVAL") == 0)
                 ? dlock__redis_key_slot(argv[3], strlen(argv[3])) : 0u,
             r->port);
    return buf;
}

/*
 * A node (here the seed) answers a lock's script with MOVED, then ASK, to
 * an address that is no master of the slot map: the client asks the map
 * again of a known node, still does not find it there, and fails with
 * DLOCK_EPROTO naming the address it refused; nothing, neither a
 * connection nor the password, reaches that address.
 */
static void redirect_outside_refused(void)
{
    const char *words[2] = {"MOVED", "ASK"};

    for (int i = 0; i < 2; i++) {
        test_fake_node outside, liar;
        redirect r = {words[i], 0};
        dlock_client *c;
        dlock_lock *l = NULL;
        dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;
        dlock_acquire_options ao = test_opts(0, 10000, 0);
        char url[200], where[64];

        test_fake_node_start(&outside, NULL, NULL);
        r.port = outside.port;
        test_fake_node_start(&liar, lying_node, &r);
        snprintf(url, sizeof(url), "redis-cluster://dlock:cl-pw@127.0.0.1:%d", liar.port);
        o.connect_timeout_ms = o.command_timeout_ms = 2000;
        CHECK_RC(dlock_client_open(&c, url, &o), DLOCK_OK);
        CHECK_RC(dlock_acquire(&l, c, "outside", &ao), DLOCK_EPROTO);
        fprintf(stderr, "%s outside the map: %s\n", words[i], dlock_error_message());
        CHECK_CONTAINS(dlock_error_message(), "refused to follow");
        snprintf(where, sizeof(where), "127.0.0.1:%d is not a master", outside.port);
        CHECK_CONTAINS(dlock_error_message(), where);
        CHECK(strstr(dlock_error_message(), "cl-pw") == NULL);
        dlock_client_free(c);
        CHECK(atomic_load(&liar.auths) > 0); /* the seed the user named has it */
        CHECK(atomic_load(&outside.conns) == 0);
        CHECK(!test_fake_node_saw(&outside, "cl-pw"));
        test_fake_node_stop(&liar);
        test_fake_node_stop(&outside);
    }
}

/*
 * The one redirection that may name a master outside the slot map: a new
 * master, serving no slot yet, while the first slot migrates onto it. Its
 * ASK is followed, since a node of the map lists it as a master (CLUSTER
 * NODES): a held lock's check and extend go there with ASKING, and the
 * release finds it there once the slot is handed over (MOVED).
 */
static void ask_to_new_master(void)
{
    test_cluster t;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 30000, 0);

    test_cluster_start(&t, NULL);
    c = open_client(&t);
    CHECK_RC(dlock_acquire(&l, c, "newm", &o), DLOCK_OK);
    held_through_migration(&t, l, "dlock:{newm}", test_cluster_add_master(&t));
    dlock_client_free(c);
    test_cluster_stop(&t);
}

/* ---- names whose hash tag would be empty ------------------------------ */

/* Collect dlock_list's names into a string, each followed by '\n'. */
static int listed(const char *name, const dlock_lock_info *info, void *payload)
{
    char *out = payload;

    (void)info;
    if (strlen(out) + strlen(name) + 2 < 512) {
        strcat(out, name);
        strcat(out, "\n");
    }
    return 0;
}

/*
 * A name that starts with '}' ("dlock:{}x}": an empty hash tag, each key
 * hashed whole and CROSSSLOT) works on a cluster: its keys are
 * dlock:}{TAG}{NAME}..., all in TAG's slot, with its fence going up;
 * dlock_list finds it. Names that worked keep their keys (a '}' inside a
 * name: dlock:{a}b}), and a single server keeps dlock:{}x} for '}x'.
 */
static void empty_hash_tag(void)
{
    const char *names[3] = {"}x", "}", "}}{}"};
    const char *keys[3] = {"dlock:}{)x}{}x}", "dlock:}{)}{}}", "dlock:}{))()}{}}{}}"};
    test_cluster t;
    test_redis single;
    dlock_client *c, *c1;
    dlock_lock *l;
    dlock_acquire_options ao = test_opts(0, 10000, 0);
    char list[512] = "";

    test_cluster_start(&t, NULL);
    c = open_client(&t);
    for (int i = 0; i < 3; i++) {
        uint64_t first;
        CHECK_RC(dlock_acquire(&l, c, names[i], &ao), DLOCK_OK);
        first = dlock_lock_fence(l);
        CHECK(test_cluster_cmd(&t, keys[i], "EXISTS %s", keys[i]) == 1);
        if (i == 0) {
            CHECK_RC(dlock_list(c, "", listed, list), DLOCK_OK);
            CHECK_CONTAINS(list, "}x\n");
            list[0] = '\0';
            CHECK_RC(dlock_list(c, "}", listed, list), DLOCK_OK);
            CHECK_CONTAINS(list, "}x\n");
        }
        CHECK_RC(dlock_release(l), DLOCK_OK);
        CHECK(test_cluster_cmd(&t, keys[i], "EXISTS %s", keys[i]) == 0);
        CHECK_RC(dlock_acquire(&l, c, names[i], &ao), DLOCK_OK);
        CHECK(dlock_lock_fence(l) > first);
        CHECK_RC(dlock_release(l), DLOCK_OK);
    }
    CHECK_RC(dlock_acquire(&l, c, "a}b", &ao), DLOCK_OK);
    CHECK(test_cluster_cmd(&t, "dlock:{a}b}", "EXISTS dlock:{a}b}") == 1);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    test_cluster_stop(&t);

    test_redis_start(&single, NULL);
    CHECK_RC(dlock_client_open(&c1, single.url, NULL), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c1, "}x", &ao), DLOCK_OK);
    CHECK(test_redis_cmd(&single, "EXISTS dlock:{}x}") == 1);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c1);
    test_redis_stop(&single);
}

TEST_MAIN({"url_errors", url_errors, NULL}, {"no_node", no_node, NULL},
          {"one_slot_per_lock", one_slot_per_lock, NULL}, {"multi_slots", multi_slots, NULL},
          {"renew_across_masters", renew_across_masters, "watchdog"},
          {"slot_moved_while_held", slot_moved_while_held, "watchdog"},
          {"hand_off_pushed_to_master", hand_off_pushed_to_master, "watchdog"},
          {"ask_while_migrating", ask_while_migrating, NULL},
          {"partial_migration", partial_migration, NULL},
          {"acl_minimal_user", acl_minimal_user, NULL},
          {"release_in_half_migrated_slot", release_in_half_migrated_slot, NULL},
          {"tls_cluster", tls_cluster, "tls"},
          {"failover_min_replicas_1", failover_min_replicas_1, NULL},
          {"failover_min_replicas_0", failover_min_replicas_0, NULL},
          {"redirect_outside_refused", redirect_outside_refused, NULL},
          {"ask_to_new_master", ask_to_new_master, NULL},
          {"empty_hash_tag", empty_hash_tag, NULL})
