/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The etcd backend against real etcd (Debian's etcd-server): a single member
 * for the functional tests, a 3-member cluster on loopback ports for the
 * failure tests. Each test starts its own members (tests/support), so tests
 * can kill and restart them, and run in parallel.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/etcd/etcd_codec.h"
#include "dlock/async.h"
#include "chaos_proxy.h"
#include "test.h"

static dlock_client *open_url(const char *url)
{
    dlock_client *c = NULL;

    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_OK);
    CHECK(c != NULL);
    CHECK(strcmp(dlock_client_backend(c), "etcd") == 0);
    return c;
}

static dlock_client *open_client(const test_etcd *e)
{
    return open_url(e->url);
}

/* Requests etcd served, of one gRPC method ("Txn", "Range", "LeaseGrant"). */
static long long served(test_etcd *e, int member, const char *method)
{
    char metric[160];

    snprintf(metric, sizeof(metric), "grpc_server_started_total{grpc_method=\"%s\"", method);
    return test_etcd_metric(e, member, metric);
}

/* Watchers etcd has now (every watch of every stream). */
static long long watchers(test_etcd *e, int member)
{
    return test_etcd_metric(e, member, "etcd_debugging_mvcc_watcher_total ");
}

/* Requests that read or write keys. */
static long long kv_requests(test_etcd *e, int member)
{
    return served(e, member, "Txn") + served(e, member, "Range") +
           served(e, member, "DeleteRange") + served(e, member, "Put");
}

/* Whether member 0 runs an etcd before 3.4.25 / 3.5.8, by the version its
 * metrics report (etcd_server_version{server_version="..."}). */
static int server_before_keepalive_fix(test_etcd *e)
{
    char metric[96];

    for (int minor = 4; minor <= 5; minor++)
        for (int patch = 0; patch < (minor == 4 ? 25 : 8); patch++) {
            snprintf(metric, sizeof(metric),
                     "etcd_server_version{server_version=\"3.%d.%d\"}", minor, patch);
            if (test_etcd_metric(e, 0, metric) > 0)
                return 1;
        }
    return 0;
}

/* ---------------------------------------------------------------------- */

/* The codec: base64 both ways, int64 as string or number, zero fields left
 * out, and lock directories that never nest. No server. */
static void codec(void)
{
    const char *samples[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar", "\x01\xff\x00"};
    size_t lens[] = {0, 1, 2, 3, 4, 5, 6, 3};
    const char *b64[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy", "Af8A"};
    json_t *j;
    int64_t v;
    char *s, *d;
    size_t n;

    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        s = dlock__etcd_b64(samples[i], lens[i]);
        CHECK(s != NULL && strcmp(s, b64[i]) == 0);
        CHECK(dlock__etcd_unb64(s, &d, &n) == 0 && n == lens[i] && memcmp(d, samples[i], n) == 0);
        free(s);
        free(d);
    }
    CHECK(dlock__etcd_unb64("Zm9v!", &d, &n) == -1);
    j = json_loads("{\"a\":\"9007199254740993\",\"b\":12,\"c\":\"x\"}", 0, NULL);
    CHECK(dlock__etcd_int(j, "a", &v) == 0 && v == 9007199254740993LL);
    CHECK(dlock__etcd_int(j, "b", &v) == 0 && v == 12);
    CHECK(dlock__etcd_int(j, "missing", &v) == 0 && v == 0); /* etcd leaves zeros out */
    CHECK(dlock__etcd_int(j, "c", &v) == -1);
    json_decref(j);

    d = dlock__etcd_dir("dlock/", "a/b%c d");
    CHECK(strcmp(d, "dlock/a%2Fb%25c%20d/") == 0);
    s = dlock__etcd_prefix_end(d);
    CHECK(strcmp(s, "dlock/a%2Fb%25c%20d0") == 0);
    free(s);
    free(d);
    /* "a" and "a/b": neither directory is a prefix of the other. */
    d = dlock__etcd_dir("p/", "a");
    s = dlock__etcd_dir("p/", "a/b");
    CHECK(strncmp(s, d, strlen(d)) != 0);
    free(s);
    free(d);
}

static void url_and_open_errors(void)
{
    test_etcd e;
    dlock_client *c = NULL;
    char url[300], where[64];

    CHECK_RC(dlock_client_open(&c, "etcd://127.0.0.1:2379?nope=1", NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "unknown parameter 'nope'");
    CHECK_RC(dlock_client_open(&c, "etcd://127.0.0.1:2379?cacert=/etc/hosts", NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "etcds://");
    CHECK_RC(dlock_client_open(&c, "etcds://127.0.0.1:2379?cacert=/nonexistent/ca.pem", NULL),
             DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "cannot be read");
    CHECK_RC(dlock_client_open(&c, "etcds://127.0.0.1:2379?cert=/etc/hosts", NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_client_open(&c, "etcd://127.0.0.1:2379/some/path", NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_client_open(&c, "etcd://user@127.0.0.1:2379", NULL), DLOCK_EINVAL);
    CHECK(c == NULL);

    /* Nothing listens: ECONN, naming the endpoint, within the timeouts. */
    test_etcd_start(&e, 1, NULL);
    snprintf(url, sizeof(url), "etcd://127.0.0.1:%d", e.client_port[0]);
    test_etcd_stop(&e);
    {
        dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;
        o.connect_timeout_ms = 300;
        o.command_timeout_ms = 600;
        CHECK_RC(dlock_client_open(&c, url, &o), DLOCK_ECONN);
        snprintf(where, sizeof(where), "etcd 127.0.0.1:%d", e.client_port[0]);
        CHECK_CONTAINS(dlock_error_message(), where);
    }
    CHECK_RC(dlock_client_open(&c, "etcdx://127.0.0.1:1", NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "etcd://");

    /* An HTTP server that is not the v3 gateway: etcd's own peer port (it
     * serves gRPC too, so only the gateway transport can tell). */
    test_etcd_start(&e, 1, NULL);
    snprintf(url, sizeof(url), "etcd://127.0.0.1:%d?transport=gateway", e.peer_port[0]);
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_EPROTO);
    CHECK_CONTAINS(dlock_error_message(), "etcd v3 gateway");
    CHECK(c == NULL);
    test_etcd_stop(&e);
}

/* What etcd keeps for a lock (the core scenarios are in integration/core):
 * one key and one lease per holder; a try leaves nothing; a longer lease
 * moves the key to a new lease with fence and place kept, the same lease is
 * kept alive; release revokes the lease rather than leave it to run out. */
static void leases_follow_the_lock(void)
{
    test_etcd e;
    dlock_client *c;
    dlock_lock *a, *b = (dlock_lock *)1;
    dlock_lock_info info;
    dlock_acquire_options o = test_opts(0, 5000, 0); /* a lease of its own */
    uint64_t first;

    test_etcd_start(&e, 1, NULL);
    c = open_client(&e);
    CHECK_RC(dlock_acquire(&a, c, "job", &o), DLOCK_OK);
    first = dlock_lock_fence(a);
    CHECK(test_etcd_count(&e, "dlock/job/") == 1);
    CHECK(test_etcd_leases(&e) == 1);
    CHECK_RC(dlock_acquire(&b, c, "job", &o), DLOCK_EBUSY);
    CHECK(test_etcd_count(&e, "dlock/job/") == 1); /* the try left nothing */
    CHECK(test_etcd_leases(&e) == 1);
    CHECK_RC(dlock_lock_extend(a, 8000), DLOCK_OK);
    CHECK_RC(dlock_status(&info, c, "job"), DLOCK_OK);
    CHECK(info.held == 1 && info.fence == first && info.ttl_ms > 5000);
    CHECK(test_etcd_leases(&e) == 1); /* the old lease was revoked */
    CHECK_RC(dlock_lock_extend(a, 8000), DLOCK_OK); /* same TTL: a keepalive */
    CHECK(test_etcd_leases(&e) == 1);
    CHECK_RC(dlock_lock_check(a), DLOCK_OK);
    CHECK_RC(dlock_release(a), DLOCK_OK);
    CHECK(test_etcd_count(&e, "dlock/") == 0);
    CHECK(test_etcd_leases(&e) == 0);
    dlock_client_free(c);
    test_etcd_stop(&e);
}

/* etcd's reply (parsed; NULL if none) to a range of the keys under prefix,
 * with more of the request's fields (JSON, from a comma) after them. */
static json_t *range_under(test_etcd *e, const char *prefix, const char *more)
{
    char *k = dlock__etcd_b64(prefix, strlen(prefix)), *end = dlock__etcd_prefix_end(prefix);
    char *kend = dlock__etcd_b64(end, strlen(end)), body[512], *r;
    json_t *j;

    snprintf(body, sizeof(body), "{\"key\":\"%s\",\"range_end\":\"%s\"%s}", k, kend, more);
    r = test_etcd_post(e, 0, "/v3/kv/range", body);
    j = r != NULL ? json_loads(r, 0, NULL) : NULL;
    free(r);
    free(k);
    free(end);
    free(kend);
    return j;
}

/* The lease of the first key under prefix. */
static long long key_lease(test_etcd *e, const char *prefix)
{
    json_t *j = range_under(e, prefix, ""), *kv;
    long long lease = 0;

    kv = json_array_get(json_object_get(j, "kvs"), 0);
    if (json_is_string(json_object_get(kv, "lease")))
        lease = atoll(json_string_value(json_object_get(kv, "lease")));
    json_decref(j);
    return lease;
}

/* The name of the first key under prefix (the holder's, for a lock's
 * directory) into out, or "" when there is none. */
static void first_key(test_etcd *e, const char *prefix, char *out, size_t size)
{
    json_t *j = range_under(e, prefix,
                            ",\"sort_target\":\"CREATE\",\"sort_order\":\"ASCEND\",\"limit\":1");
    char *name = NULL;
    size_t len = 0;

    out[0] = '\0';
    if (dlock__etcd_unb64(json_string_value(json_object_get(
                              json_array_get(json_object_get(j, "kvs"), 0), "key")),
                          &name, &len) == 0)
        snprintf(out, size, "%.*s", (int)len, name);
    free(name);
    json_decref(j);
}

static long long method_count(test_etcd *e, const char *method)
{
    char metric[160];

    snprintf(metric, sizeof(metric), "grpc_server_started_total{grpc_method=\"%s\"", method);
    return test_etcd_metric(e, 0, metric);
}

/*
 * The uncontended cycle makes two raft writes: the put (in the acquire
 * txn, on a spare lease granted ahead of need, with a keepalive beside it,
 * which is no raft write) and the delete that releases. The delete's reply
 * shows the key was on that lease, which then backs no key and goes back
 * to the spare pool: the next cycle puts its key on it again, so no grant
 * and no revoke per cycle (after the first cycle on a spare, which has the
 * thread grant one more), and the client's lease count does not grow. The
 * spares left when the client closes are revoked.
 */
static void two_raft_writes_per_cycle(void)
{
    static const char *const writes[] = {"Txn", "LeaseRevoke", "LeaseGrant", "DeleteRange",
                                         "Put"};
    long long before[5], after[5], lease = 0, first = 0;
    test_etcd e;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 5000, 0);

    test_etcd_start(&e, 1, NULL);
    c = open_client(&e);
    /* The first acquire of a TTL grants its lease itself, and asks for a
     * spare of that TTL. */
    CHECK_RC(dlock_acquire(&l, c, "w", &o), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    for (int i = 0; i < 500 && test_etcd_spares(&e) < 1; i++)
        test_sleep_ms(10);
    CHECK(test_etcd_spares(&e) == 1);
    for (int cycle = 0; cycle < 4; cycle++) {
        for (int i = 0; i < 5; i++)
            before[i] = method_count(&e, writes[i]);
        CHECK_RC(dlock_acquire(&l, c, "w", &o), DLOCK_OK);
        CHECK(test_etcd_leases(&e) == 1); /* the spare, now with our key */
        lease = key_lease(&e, "dlock/w/");
        CHECK(lease & (1LL << 62)); /* granted ahead: a spare */
        if (cycle == 1)
            first = lease;
        /* Taken again from the pool: the same lease, cycle after cycle. */
        CHECK(cycle < 2 || lease == first);
        CHECK_RC(dlock_release(l), DLOCK_OK);
        CHECK(test_etcd_count(&e, "dlock/") == 0);
        for (int i = 0; i < 5; i++)
            after[i] = method_count(&e, writes[i]);
        fprintf(stderr, "cycle %d: txn %lld, revoke %lld, grant %lld, deleterange %lld, put %lld\n",
                cycle, after[0] - before[0], after[1] - before[1], after[2] - before[2],
                after[3] - before[3], after[4] - before[4]);
        CHECK(after[0] - before[0] == 1); /* the acquire txn's put */
        CHECK(after[3] - before[3] == 1); /* the release */
        CHECK(after[1] - before[1] == 0 && after[4] - before[4] == 0);
        /* The first cycle on a spare: the thread grants the next (the pool
         * was empty), off the path; after that, none. */
        CHECK(after[2] - before[2] <= (cycle == 0 ? 1 : 0));
        for (int i = 0; i < 500 && test_etcd_spares(&e) < 2; i++)
            test_sleep_ms(10);
        CHECK(test_etcd_spares(&e) == 2); /* not growing */
    }
    /* A busy try leaves the spare as it was: no write at all. */
    CHECK_RC(dlock_acquire(&l, c, "w", &o), DLOCK_OK);
    {
        dlock_client *c2 = open_client(&e);
        dlock_lock *b;
        CHECK_RC(dlock_acquire(&b, c2, "w", &o), DLOCK_EBUSY); /* asks for c2's spare */
        for (int i = 0; i < 500 && test_etcd_spares(&e) < 2; i++)
            test_sleep_ms(10);
        for (int i = 0; i < 5; i++)
            before[i] = method_count(&e, writes[i]);
        CHECK_RC(dlock_acquire(&b, c2, "w", &o), DLOCK_EBUSY);
        for (int i = 0; i < 5; i++)
            after[i] = method_count(&e, writes[i]);
        fprintf(stderr, "busy try: txn %lld, revoke %lld, grant %lld\n", after[0] - before[0],
                after[1] - before[1], after[2] - before[2]);
        /* The txn (a raft proposal although its compare fails, as it may
         * put), no grant, no revoke. */
        CHECK(after[0] - before[0] == 1 && after[1] - before[1] == 0 && after[2] - before[2] == 0);
        dlock_client_free(c2);
    }
    CHECK_RC(dlock_release(l), DLOCK_OK);
    /* A release whose lease is gone (revoked by a force release; no
     * watchdog to have told the core) is DLOCK_ELOST: the revoke finds
     * no lease, and the delete by name finds no key. */
    {
        dlock_lock_info removed;
        CHECK_RC(dlock_acquire(&l, c, "w", &o), DLOCK_OK);
        CHECK_RC(dlock_force_release(&removed, c, "w"), DLOCK_OK);
        CHECK(removed.held == 1 && removed.fence == dlock_lock_fence(l));
        CHECK_RC(dlock_release(l), DLOCK_ELOST);
    }
    /* Closing revokes the spares. */
    dlock_client_free(c);
    CHECK(test_etcd_spares(&e) == 0);
    CHECK(test_etcd_leases(&e) == 0);
    test_etcd_stop(&e);
}

/* The store's revision now (the header of a read). */
/*
 * A lock taken again and again names the same key: etcd keeps every key
 * ever written in its index until compaction, and an acquire's range over
 * the lock's directory walks them all, so a new key per acquisition made
 * each acquire slower than the last (etcd_keys.c). A released key's id is
 * lent to the client's next acquisition; never to two live acquisitions at
 * once (a lock held on one name while another is taken, a holder and a
 * waiter of one name in one client), and mutual exclusion is as before.
 */
static void wait_queued(test_etcd *e, const char *prefix);

static void keys_reused_across_cycles(void)
{
    test_etcd e;
    dlock_client *c, *c2;
    dlock_lock *l, *l2, *b;
    dlock_acquire_options o = test_opts(0, 5000, 0);
    char first[128], key[128], other[128];
    uint64_t fence = 0;

    test_etcd_start(&e, 1, NULL);
    c = open_client(&e);
    c2 = open_client(&e);
    for (int cycle = 0; cycle < 8; cycle++) {
        CHECK_RC(dlock_acquire(&l, c, "r", &o), DLOCK_OK);
        CHECK(dlock_lock_fence(l) > fence);
        fence = dlock_lock_fence(l);
        first_key(&e, "dlock/r/", cycle == 0 ? first : key, sizeof(key));
        CHECK(strncmp(first, "dlock/r/", 8) == 0 && strlen(first) == 8 + 16);
        CHECK(cycle == 0 || strcmp(key, first) == 0);
        /* Still a lock: the other client is refused while it is held. */
        CHECK_RC(dlock_acquire(&b, c2, "r", &o), DLOCK_EBUSY);
        CHECK_RC(dlock_release(l), DLOCK_OK);
        CHECK(test_etcd_count(&e, "dlock/r/") == 0);
    }
    /* Two live acquisitions of one client: two ids. */
    CHECK_RC(dlock_acquire(&l, c, "r", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l2, c, "s", &o), DLOCK_OK);
    first_key(&e, "dlock/r/", key, sizeof(key));
    first_key(&e, "dlock/s/", other, sizeof(other));
    CHECK(strcmp(key, first) == 0 && strcmp(other + 8, key + 8) != 0);
    CHECK_RC(dlock_release(l2), DLOCK_OK);
    /* A holder and a waiter of one name in one client (the holder's id
     * was reused): the waiter queues a key of its own, and gets the lock
     * when the holder lets go. */
    {
        test_acquirer a;
        pthread_t t;

        test_acquirer_init(&a, c, "r", test_opts(20000, 5000, 0));
        CHECK(pthread_create(&t, NULL, test_acquirer_main, &a) == 0);
        wait_queued(&e, "dlock/r/"); /* two keys: two names */
        first_key(&e, "dlock/r/", key, sizeof(key));
        CHECK(strcmp(key, first) == 0);
        CHECK_RC(dlock_release(l), DLOCK_OK);
        CHECK(pthread_join(t, NULL) == 0);
        CHECK_RC(a.rc, DLOCK_OK);
        first_key(&e, "dlock/r/", other, sizeof(other));
        CHECK(other[0] != '\0' && strcmp(other, first) != 0);
        CHECK_RC(dlock_release(a.lock), DLOCK_OK);
        CHECK(test_etcd_count(&e, "dlock/r/") == 0);
    }
    /* A release that finds its key gone (a force release took it) still
     * knows the key is gone: the id is reused, and the lock holds. */
    {
        dlock_lock_info removed;
        CHECK_RC(dlock_acquire(&l, c, "r", &o), DLOCK_OK);
        first_key(&e, "dlock/r/", other, sizeof(other));
        CHECK_RC(dlock_force_release(&removed, c, "r"), DLOCK_OK);
        CHECK_RC(dlock_release(l), DLOCK_ELOST);
        CHECK_RC(dlock_acquire(&l, c, "r", &o), DLOCK_OK);
        first_key(&e, "dlock/r/", key, sizeof(key));
        CHECK(strcmp(key, other) == 0);
        CHECK_RC(dlock_acquire(&b, c2, "r", &o), DLOCK_EBUSY);
        CHECK_RC(dlock_release(l), DLOCK_OK);
    }
    dlock_client_free(c);
    dlock_client_free(c2);
    test_etcd_stop(&e);
}

static int64_t store_revision(test_etcd *e)
{
    char *r = test_etcd_post(e, 0, "/v3/kv/range", "{\"key\":\"AA==\"}");
    json_t *j = r != NULL ? json_loads(r, 0, NULL) : NULL;
    int64_t rev = 0;

    CHECK(j != NULL && dlock__etcd_int(json_object_get(j, "header"), "revision", &rev) == 0);
    json_decref(j);
    free(r);
    CHECK(rev > 0);
    return rev;
}

/* What status says of the fence on etcd (docs/etcd.md, "Status"): the
 * holder's while the lock is held (not a queued waiter's), 0 when it is
 * free, never the last one issued; an acquisition that begins after the
 * call gets a fence above the store's revision at the call, and a waiter
 * queued before it keeps the fence it queued with. */
static void status_fence_semantics(void)
{
    test_etcd e;
    dlock_client *c, *c2;
    dlock_lock *a, *b;
    dlock_lock_info info;
    test_acquirer w;
    pthread_t t;
    int64_t rev;

    test_etcd_start(&e, 1, NULL);
    c = open_client(&e);
    c2 = open_client(&e);
    CHECK_RC(dlock_status(&info, c, "st"), DLOCK_OK);
    CHECK(info.held == 0 && info.fence == 0 && info.ttl_ms == 0);
    CHECK_RC(dlock_acquire(&a, c, "st", NULL), DLOCK_OK);
    CHECK_RC(dlock_status(&info, c, "st"), DLOCK_OK);
    CHECK(info.held == 1 && info.fence == dlock_lock_fence(a));
    CHECK(info.ttl_ms > 0 && info.ttl_ms <= 30000);
    /* A waiter queued behind: status still shows the holder. */
    test_acquirer_init(&w, c2, "st", test_opts(20000, 5000, 1));
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &w) == 0);
    for (int i = 0; i < 2000 && test_etcd_count(&e, "dlock/st/") < 2; i++)
        test_sleep_ms(10);
    CHECK(test_etcd_count(&e, "dlock/st/") == 2);
    CHECK_RC(dlock_status(&info, c, "st"), DLOCK_OK);
    CHECK(info.held == 1 && info.fence == dlock_lock_fence(a));
    rev = store_revision(&e);
    CHECK_RC(dlock_release(a), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(w.rc, DLOCK_OK);
    CHECK(dlock_lock_fence(w.lock) > info.fence);
    CHECK(dlock_lock_fence(w.lock) <= (uint64_t)rev); /* queued before the call */
    CHECK_RC(dlock_status(&info, c, "st"), DLOCK_OK);
    CHECK(info.held == 1 && info.fence == dlock_lock_fence(w.lock));
    CHECK_RC(dlock_release(w.lock), DLOCK_OK);
    /* Free again: 0, not the last fence. */
    CHECK_RC(dlock_status(&info, c, "st"), DLOCK_OK);
    CHECK(info.held == 0 && info.fence == 0 && info.ttl_ms == 0);
    rev = store_revision(&e);
    CHECK_RC(dlock_acquire(&b, c2, "st", NULL), DLOCK_OK);
    CHECK(dlock_lock_fence(b) > (uint64_t)rev);
    CHECK_RC(dlock_status(&info, c, "st"), DLOCK_OK);
    CHECK(info.held == 1 && info.fence == dlock_lock_fence(b));
    CHECK_RC(dlock_release(b), DLOCK_OK);
    dlock_client_free(c);
    dlock_client_free(c2);
    test_etcd_stop(&e);
}

/* The key deleted behind the holder's back (its lease still alive): the next
 * renewal notices and on_lost fires once. */
static void on_lost_when_key_deleted(void)
{
    test_etcd e;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 1500, 1);

    atomic_store(&test_lost_calls, 0);
    test_etcd_start(&e, 1, NULL);
    c = open_client(&e);
    o.on_lost = test_count_lost;
    CHECK_RC(dlock_acquire(&l, c, "deleted", &o), DLOCK_OK);
    CHECK(test_etcd_delete(&e, "dlock/deleted/") == 1);
    CHECK(test_etcd_sessions(&e) == 1); /* only the key went, not its lease */
    for (int i = 0; i < 200 && atomic_load(&test_lost_calls) == 0; i++)
        test_sleep_ms(20);
    CHECK(atomic_load(&test_lost_calls) == 1);
    CHECK(atomic_load(&test_lost_reason) == DLOCK_ELOST);
    test_sleep_ms(1000); /* more renewal periods: still once */
    CHECK(atomic_load(&test_lost_calls) == 1);
    CHECK_RC(dlock_release(l), DLOCK_ELOST);
    dlock_client_free(c);
    test_etcd_stop(&e);
}

/* Wait until a waiter's key is queued behind the holder's under prefix and
 * its watch stream is open. */
static void wait_queued(test_etcd *e, const char *prefix)
{
    for (int i = 0; i < 500 && test_etcd_count(e, prefix) < 2; i++)
        test_sleep_ms(10);
    CHECK(test_etcd_count(e, prefix) == 2);
    for (int i = 0; i < 500 && watchers(e, 0) < 1; i++)
        test_sleep_ms(10);
}

/* A waiter is woken by the release itself, within a wait shorter than the
 * holder's lease, and asks etcd nothing while it sleeps. */
static void waiter_woken_by_release(void)
{
    test_etcd e;
    dlock_client *holder_c, *waiter_c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 20000, 0);
    test_acquirer a;
    pthread_t t;
    long long before, asleep;
    uint64_t held;
    dlock_lock_info info;

    test_etcd_start(&e, 1, NULL);
    holder_c = open_client(&e);
    waiter_c = open_client(&e);
    CHECK_RC(dlock_acquire(&l, holder_c, "handoff", &o), DLOCK_OK);
    held = dlock_lock_fence(l);
    /* A wait shorter than the holder's 20 s lease; a 3 s lease of its own,
     * which keeps its queued key alive meanwhile. */
    test_acquirer_init(&a, waiter_c, "handoff", test_opts(8000, 3000, 1));
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &a) == 0);
    /* Its key is queued behind the holder's, and its watch is open. */
    wait_queued(&e, "dlock/handoff/");
    before = kv_requests(&e, 0);
    test_sleep_ms(2500); /* more than its lease / 3: it keeps its lease alive */
    asleep = kv_requests(&e, 0) - before;
    CHECK(!atomic_load(&a.done));
    fprintf(stderr, "key requests by the sleeping waiter in 2.5 s: %lld\n", asleep);
    CHECK(asleep == 0);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(a.rc, DLOCK_OK);
    CHECK(dlock_lock_fence(a.lock) > held);
    CHECK_RC(dlock_status(&info, waiter_c, "handoff"), DLOCK_OK);
    CHECK(info.held && info.fence == dlock_lock_fence(a.lock));
    CHECK(test_etcd_count(&e, "dlock/handoff/") == 1);
    CHECK_RC(dlock_release(a.lock), DLOCK_OK);
    CHECK(test_etcd_count(&e, "dlock/handoff/") == 0);
    dlock_client_free(holder_c);
    dlock_client_free(waiter_c);
    test_etcd_stop(&e);
}

/* Release l: the waiter a (in thread t) then holds, with a fence above
 * l's, and releases in turn. */
static void hand_over_and_release(dlock_lock *l, test_acquirer *a, pthread_t t)
{
    test_hand_over(l, a, t);
    CHECK_RC(dlock_release(a->lock), DLOCK_OK);
}

/*
 * The watches of a client are watch_ids on one gRPC Watch stream: four
 * threads of one client waiting for four locks open one stream between
 * them (etcd's own count of Watch calls), each is woken by its own lock's
 * release, and waits that come later ride the same stream.
 */
static void waiters_share_one_watch_stream(void)
{
    enum { N = 4 };
    test_etcd e;
    dlock_client *holder_c, *waiter_c;
    dlock_lock *held[N];
    dlock_acquire_options o = test_opts(0, 20000, 0);
    test_acquirer a[N];
    pthread_t t[N];
    char name[N][16], prefix[32];
    long long watches;

    test_etcd_start(&e, 1, NULL);
    holder_c = open_client(&e);
    waiter_c = open_client(&e);
    watches = served(&e, 0, "Watch");
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++) {
            snprintf(name[i], sizeof(name[i]), "w%d", i);
            CHECK_RC(dlock_acquire(&held[i], holder_c, name[i], &o), DLOCK_OK);
            test_acquirer_init(&a[i], waiter_c, name[i], test_opts(30000, 5000, 0));
            CHECK(pthread_create(&t[i], NULL, test_acquirer_main, &a[i]) == 0);
            snprintf(prefix, sizeof(prefix), "dlock/%s/", name[i]);
            for (int k = 0; k < 500 && test_etcd_count(&e, prefix) < 2; k++)
                test_sleep_ms(10);
            CHECK(test_etcd_count(&e, prefix) == 2);
        }
        test_sleep_ms(300); /* every watch created */
        fprintf(stderr, "round %d: Watch calls %lld for %d waiters\n", round,
                served(&e, 0, "Watch") - watches, N * (round + 1));
        CHECK(served(&e, 0, "Watch") - watches == 1);
        /* Released in reverse order: each waiter gets its own lock. */
        for (int i = N - 1; i >= 0; i--)
            hand_over_and_release(held[i], &a[i], t[i]);
    }
    dlock_client_free(holder_c);
    dlock_client_free(waiter_c);
    test_etcd_stop(&e);
}

/* Many waiters: each watches only the key just ahead, so a release wakes one
 * of them, and the lock goes down the line in queue order. */
static void release_wakes_one_waiter(void)
{
    enum { WAITERS = 5 };
    test_etcd e;
    dlock_client *holder_c, *waiter_c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 30000, 0);
    test_acquirer a[WAITERS];
    pthread_t t[WAITERS];
    long long before, used;
    int winners = 0;
    uint64_t last;

    test_etcd_start(&e, 1, NULL);
    holder_c = open_client(&e);
    waiter_c = open_client(&e);
    CHECK_RC(dlock_acquire(&l, holder_c, "crowd", &o), DLOCK_OK);
    last = dlock_lock_fence(l);
    for (int i = 0; i < WAITERS; i++) {
        test_acquirer_init(&a[i], waiter_c, "crowd", test_opts(30000, 10000, 1));
        CHECK(pthread_create(&t[i], NULL, test_acquirer_main, &a[i]) == 0);
    }
    for (int i = 0; i < 1000 && test_etcd_count(&e, "dlock/crowd/") < 1 + WAITERS; i++)
        test_sleep_ms(10);
    CHECK(test_etcd_count(&e, "dlock/crowd/") == 1 + WAITERS);
    for (int i = 0; i < 500 && watchers(&e, 0) < WAITERS; i++)
        test_sleep_ms(10);
    test_sleep_ms(200);
    before = kv_requests(&e, 0);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    for (int i = 0; i < 500 && winners == 0; i++) {
        test_sleep_ms(10);
        for (int j = 0; j < WAITERS; j++)
            winners += atomic_load(&a[j].done);
    }
    test_sleep_ms(300);
    used = kv_requests(&e, 0) - before;
    fprintf(stderr, "key requests after one release with %d waiters: %lld\n", WAITERS, used);
    CHECK(winners == 1);
    CHECK(used <= 3); /* the release and one waiter's try, not five */
    /* Hand the lock down the line: every waiter gets it once, fences rise. */
    for (int round = 0; round < WAITERS; round++) {
        int holder = -1;
        for (int i = 0; i < 1000 && holder < 0; i++) {
            for (int j = 0; j < WAITERS; j++)
                if (atomic_load(&a[j].done) == 1)
                    holder = j;
            if (holder < 0)
                test_sleep_ms(10);
        }
        CHECK(holder >= 0);
        CHECK_RC(a[holder].rc, DLOCK_OK);
        CHECK(dlock_lock_fence(a[holder].lock) > last);
        last = dlock_lock_fence(a[holder].lock);
        atomic_store(&a[holder].done, 2);
        CHECK_RC(dlock_release(a[holder].lock), DLOCK_OK);
    }
    for (int i = 0; i < WAITERS; i++)
        CHECK(pthread_join(t[i], NULL) == 0);
    CHECK(test_etcd_count(&e, "dlock/") == 0);
    dlock_client_free(holder_c);
    dlock_client_free(waiter_c);
    test_etcd_stop(&e);
}

/* ---- the lock family: fair locks and leader election (the others:
 * test_etcd_family.c) ---------------------------------------------------------- */

/* A multi-lock: the names in one txn, all released together; a busy name
 * leaves nothing taken. */
static void multi_lock(void)
{
    test_etcd e;
    dlock_client *c, *c2;
    dlock_lock *m, *one, *m2 = NULL;
    const char *names[] = {"b", "a", "c"};
    dlock_acquire_options o = test_opts(0, 5000, 1);

    test_etcd_start(&e, 1, NULL);
    c = open_client(&e);
    c2 = open_client(&e);
    CHECK_RC(dlock_acquire_multi(&m, c, names, 3, &o), DLOCK_OK);
    CHECK(dlock_lock_count(m) == 3);
    for (size_t i = 0; i < 3; i++)
        CHECK(dlock_lock_fence_at(m, i) > 0 && strcmp(dlock_lock_name_at(m, i), names[i]) == 0);
    CHECK_RC(dlock_acquire(&one, c2, "a", &o), DLOCK_EBUSY);
    CHECK_RC(dlock_release(m), DLOCK_OK);
    CHECK(test_etcd_count(&e, "dlock/") == 0);
    CHECK_RC(dlock_acquire(&one, c2, "c", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire_multi(&m2, c, names, 3, &o), DLOCK_EBUSY);
    CHECK(m2 == NULL);
    CHECK(test_etcd_count(&e, "dlock/") == 1); /* a and b never taken */
    CHECK_RC(dlock_release(one), DLOCK_OK);
    dlock_client_free(c);
    dlock_client_free(c2);
    test_etcd_stop(&e);
}

/* FAIR: waiters get the lock in the order they began to wait. */
static void fair_lock_in_order(void)
{
    enum { WAITERS = 4 };
    test_etcd e;
    dlock_client *c;
    dlock_lock *l, *t = NULL;
    dlock_acquire_options o = test_opts(0, 10000, 1);
    test_acquirer a[WAITERS];
    pthread_t th[WAITERS];
    char dir[] = "dlock/fair/";

    test_etcd_start(&e, 1, NULL);
    c = open_client(&e);
    o.kind = DLOCK_KIND_FAIR;
    CHECK_RC(dlock_acquire(&l, c, "fair", &o), DLOCK_OK);
    CHECK(dlock_lock_kind(l) == DLOCK_KIND_FAIR);
    for (int i = 0; i < WAITERS; i++) {
        test_acquirer_init(&a[i], c, "fair", test_opts(30000, 10000, 1));
        a[i].o.kind = DLOCK_KIND_FAIR;
        CHECK(pthread_create(&th[i], NULL, test_acquirer_main, &a[i]) == 0);
        /* the next one starts waiting only once this one is queued */
        for (int k = 0; k < 500 && test_etcd_count(&e, dir) < 2 + i; k++)
            test_sleep_ms(10);
        CHECK(test_etcd_count(&e, dir) == 2 + i);
    }
    /* A try while others wait fails, even between two holders. */
    CHECK_RC(dlock_acquire(&t, c, "fair", &o), DLOCK_EBUSY);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    for (int i = 0; i < WAITERS; i++) {
        for (int k = 0; k < 1000 && !atomic_load(&a[i].done); k++)
            test_sleep_ms(10);
        CHECK(atomic_load(&a[i].done));
        for (int j = i + 1; j < WAITERS; j++)
            CHECK(!atomic_load(&a[j].done)); /* nobody behind got ahead */
        CHECK_RC(a[i].rc, DLOCK_OK);
        CHECK_RC(dlock_release(a[i].lock), DLOCK_OK);
        CHECK(pthread_join(th[i], NULL) == 0);
    }
    CHECK(test_etcd_count(&e, "dlock/") == 0);
    dlock_client_free(c);
    test_etcd_stop(&e);
}

typedef struct {
    pthread_mutex_t mu;
    int calls;
    dlock_leader_info last;
} observed;

static void on_leader(const dlock_leader_info *leader, void *payload)
{
    observed *o = payload;

    pthread_mutex_lock(&o->mu);
    o->calls++;
    o->last = *leader;
    pthread_mutex_unlock(&o->mu);
}

/* Wait (at most 20 s) until the observer reports identity ("" for none). */
static void wait_observed(observed *o, const char *identity)
{
    for (int i = 0; i < 2000; i++) {
        int ok;
        pthread_mutex_lock(&o->mu);
        ok = o->calls > 0 && strcmp(o->last.identity, identity) == 0 &&
             o->last.held == (identity[0] != '\0');
        pthread_mutex_unlock(&o->mu);
        if (ok)
            return;
        test_sleep_ms(10);
    }
    fprintf(stderr, "the observer never reported leader '%s' (last '%s')\n", identity,
            o->last.identity);
    exit(1);
}

typedef struct {
    dlock_client *c;
    const char *identity;
    atomic_int done;
    int rc;
    dlock_lock *lock;
} candidate_arg;

static void *candidate_main(void *p)
{
    candidate_arg *a = p;

    a->rc = dlock_campaign(&a->lock, a->c, "election", a->identity, NULL);
    atomic_store(&a->done, 1);
    return NULL;
}

/* Campaign, resign, observe: one leader at a time, its identity seen by
 * dlock_leader and the observer; a resignation hands over at once, and a
 * leader that dies is seen gone when its lease runs out. */
static void leader_election(void)
{
    test_etcd e;
    dlock_client *c, *c2;
    dlock_lock *a;
    dlock_leader_info who;
    dlock_observer *ob;
    observed seen = {PTHREAD_MUTEX_INITIALIZER, 0, {0}};
    candidate_arg b;
    pthread_t t;
    int ready[2], go[2];
    pid_t pid;
    uint64_t fence_a;

    test_etcd_start(&e, 1, NULL);
    /* The candidate that dies, forked before this process has threads (a
     * child of a threaded process may not start threads under TSan). It
     * campaigns when told (go), says when it leads (ready). */
    CHECK(pipe(ready) == 0 && pipe(go) == 0);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dlock_client *cc;
        dlock_lock *l;
        dlock_acquire_options o = test_opts(DLOCK_WAIT_FOREVER, 1000, 1);
        char byte;
        CHECK(read(go[0], &byte, 1) == 1);
        cc = open_client(&e);
        CHECK_RC(dlock_campaign(&l, cc, "election", "gamma", &o), DLOCK_OK);
        CHECK(write(ready[1], "r", 1) == 1);
        pause();
        _exit(0);
    }
    c = open_client(&e);
    c2 = open_client(&e);
    CHECK_RC(dlock_leader(&who, c, "election"), DLOCK_OK);
    CHECK(who.held == 0 && who.fence == 0 && who.identity[0] == '\0');
    CHECK_RC(dlock_observe(&ob, c, "election", on_leader, &seen), DLOCK_OK);
    wait_observed(&seen, "");

    CHECK_RC(dlock_campaign(&a, c, "election", "alpha", NULL), DLOCK_OK);
    fence_a = dlock_lock_fence(a);
    CHECK(dlock_lock_kind(a) == DLOCK_KIND_LEADER);
    CHECK_RC(dlock_leader(&who, c2, "election"), DLOCK_OK);
    CHECK(who.held && who.fence == fence_a && who.ttl_ms > 0 && strcmp(who.identity, "alpha") == 0);
    wait_observed(&seen, "alpha");

    memset(&b, 0, sizeof(b));
    b.c = c2;
    b.identity = "beta";
    CHECK(pthread_create(&t, NULL, candidate_main, &b) == 0);
    for (int i = 0; i < 500 && test_etcd_count(&e, "dlock/election/") < 2; i++)
        test_sleep_ms(10);
    CHECK(test_etcd_count(&e, "dlock/election/") == 2);
    CHECK(!atomic_load(&b.done));
    CHECK_RC(dlock_lock_extend(a, 8000), DLOCK_OK); /* moves the lease, keeps the identity */
    CHECK_RC(dlock_leader(&who, c2, "election"), DLOCK_OK);
    CHECK(who.held && who.fence == fence_a && strcmp(who.identity, "alpha") == 0);
    CHECK_RC(dlock_resign(a), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(b.rc, DLOCK_OK);
    CHECK(dlock_lock_fence(b.lock) > fence_a);
    wait_observed(&seen, "beta");
    CHECK_RC(dlock_resign(b.lock), DLOCK_OK);
    wait_observed(&seen, "");

    /* A leader that dies (kill -9) without resigning. */
    CHECK(write(go[1], "g", 1) == 1);
    {
        struct pollfd pfd = {ready[0], POLLIN, 0};
        char byte;
        CHECK(poll(&pfd, 1, 20000) == 1 && read(ready[0], &byte, 1) == 1);
    }
    wait_observed(&seen, "gamma");
    CHECK(kill(pid, SIGKILL) == 0);
    CHECK(waitpid(pid, NULL, 0) == pid);
    wait_observed(&seen, "");
    dlock_observer_free(ob);
    dlock_client_free(c);
    dlock_client_free(c2);
    test_etcd_stop(&e);
}

/* ---- authentication and TLS ------------------------------------------- */

static void post_ok(test_etcd *e, const char *path, const char *json)
{
    char *r = test_etcd_post(e, 0, path, json);

    if (r == NULL || strstr(r, "\"error\"") != NULL) {
        fprintf(stderr, "%s: %s\n", path, r ? r : "no reply");
        exit(1);
    }
    free(r);
}

/* User and password: refused without or with a wrong password (which no
 * message shows), a token that is renewed when the member forgets it (a
 * restart), and waiting works through the token too. */
static void auth_user_password(void)
{
    test_etcd e;
    dlock_client *c = NULL, *c2;
    dlock_lock *l;
    test_acquirer a;
    pthread_t t;
    char url[300];

    test_etcd_start(&e, 1, NULL);
    post_ok(&e, "/v3/auth/user/add", "{\"name\":\"root\",\"password\":\"s3cret-pw\"}");
    post_ok(&e, "/v3/auth/user/grant", "{\"user\":\"root\",\"role\":\"root\"}");
    post_ok(&e, "/v3/auth/enable", "{}");

    CHECK_RC(dlock_client_open(&c, e.url, NULL), DLOCK_EAUTH);
    CHECK_CONTAINS(dlock_error_message(), "user:password");
    snprintf(url, sizeof(url), "etcd://root:wrong-pass@127.0.0.1:%d?insecure_auth=1", e.client_port[0]);
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_EAUTH);
    CHECK(strstr(dlock_error_message(), "wrong-pass") == NULL);
    CHECK_CONTAINS(dlock_error_message(), "authentication failed");
    CHECK(c == NULL);

    snprintf(url, sizeof(url), "etcd://root:s3cret-pw@127.0.0.1:%d?insecure_auth=1", e.client_port[0]);
    c = open_url(url);
    c2 = open_url(url);
    CHECK_RC(dlock_acquire(&l, c, "guarded", NULL), DLOCK_OK);
    test_acquirer_init(&a, c2, "guarded", test_opts(20000, 10000, 1));
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &a) == 0);
    /* (keys cannot be counted without a token here: its watch tells) */
    for (int i = 0; i < 500 && watchers(&e, 0) < 1; i++)
        test_sleep_ms(10);
    CHECK(!atomic_load(&a.done));
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(a.rc, DLOCK_OK);
    CHECK_RC(dlock_release(a.lock), DLOCK_OK);

    /* A restarted member has forgotten every simple token: log in again. */
    test_etcd_kill(&e, 0);
    test_etcd_restart(&e, 0);
    CHECK_RC(dlock_acquire(&l, c, "guarded", NULL), DLOCK_OK);
    CHECK_RC(dlock_lock_check(l), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    dlock_client_free(c2);
    test_etcd_stop(&e);
}

/* Lock, check and release through c: the client works. */
static void use_client(dlock_client *c)
{
    dlock_lock *l;

    CHECK_RC(dlock_acquire(&l, c, "proxied", NULL), DLOCK_OK);
    CHECK_RC(dlock_lock_check(l), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
}

/*
 * Credentials and proxies (README, Security). The proxy is the chaos
 * harness's TCP relay to the member, which serves a proxy's request
 * ("POST http://127.0.0.1:PORT/v3/...") like any other, and counts the
 * connections it gets:
 * - http_proxy, https_proxy and ALL_PROXY pointing at it are ignored: a
 *   client with user:password@ works and the relay gets no connection;
 * - proxy=http://127.0.0.1:RELAY does go through it (the gateway: the
 *   relay is no CONNECT proxy), and gRPC goes through a CONNECT tunnel;
 * - user:password@ over plain etcd:// without insecure_auth=1 is refused,
 *   naming the parameter, before anything is sent.
 */
static void credentials_and_proxies(void)
{
    static const char *const vars[] = {"http_proxy", "HTTP_PROXY", "https_proxy",
                                       "HTTPS_PROXY", "ALL_PROXY", "all_proxy"};
    test_etcd e;
    chaos_proxy *relay, *tunnel;
    dlock_client *c = NULL;
    char url[300], proxy[64];
    int rc;

    test_etcd_start(&e, 1, NULL);
    post_ok(&e, "/v3/auth/user/add", "{\"name\":\"root\",\"password\":\"s3cret-pw\"}");
    post_ok(&e, "/v3/auth/user/grant", "{\"user\":\"root\",\"role\":\"root\"}");
    post_ok(&e, "/v3/auth/enable", "{}");
    CHECK(chaos_proxy_start(&relay, e.client_port[0]) == 0);
    snprintf(proxy, sizeof(proxy), "http://127.0.0.1:%d", chaos_proxy_port(relay));

    snprintf(url, sizeof(url), "etcd://root:s3cret-pw@127.0.0.1:%d", e.client_port[0]);
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "insecure_auth=1");
    CHECK(strstr(dlock_error_message(), "s3cret-pw") == NULL);
    snprintf(url, sizeof(url), "etcd://root:s3cret-pw@127.0.0.1:%d?insecure_auth=yes",
             e.client_port[0]);
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_EINVAL);
    CHECK(c == NULL);
    CHECK(chaos_proxy_accepted(relay) == 0);

    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
        CHECK(setenv(vars[i], proxy, 1) == 0);
    CHECK(unsetenv("NO_PROXY") == 0 && unsetenv("no_proxy") == 0);
    snprintf(url, sizeof(url), "etcd://root:s3cret-pw@127.0.0.1:%d?insecure_auth=1",
             e.client_port[0]);
    rc = dlock_client_open(&c, url, NULL);
    fprintf(stderr, "connections to the proxy of the environment: %d\n",
            chaos_proxy_accepted(relay));
    CHECK(chaos_proxy_accepted(relay) == 0);
    CHECK_RC(rc, DLOCK_OK);
    use_client(c);
    dlock_client_free(c);
    CHECK(chaos_proxy_accepted(relay) == 0);

    /* proxy= is followed (the environment's proxy is still set: the same).
     * The relay is no CONNECT proxy, which gRPC needs: the gateway, the
     * transport for such a proxy (docs/etcd.md). */
    snprintf(url, sizeof(url),
             "etcd://root:s3cret-pw@127.0.0.1:%d?insecure_auth=1&transport=gateway&proxy=%s",
             e.client_port[0], proxy);
    c = open_url(url);
    use_client(c);
    dlock_client_free(c);
    CHECK(chaos_proxy_accepted(relay) > 0);
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
        CHECK(unsetenv(vars[i]) == 0);

    /* gRPC through proxy=: in a CONNECT tunnel (calls, keepalive and watch
     * streams, and again on the connections reused). */
    CHECK(chaos_proxy_start(&tunnel, e.client_port[0]) == 0);
    chaos_proxy_connect_mode(tunnel);
    snprintf(url, sizeof(url), "etcd://root:s3cret-pw@127.0.0.1:%d?insecure_auth=1&proxy="
             "http://127.0.0.1:%d", e.client_port[0], chaos_proxy_port(tunnel));
    c = open_url(url);
    use_client(c);
    use_client(c);
    dlock_client_free(c);
    fprintf(stderr, "CONNECT tunnels: %d\n", chaos_proxy_connects(tunnel));
    CHECK(chaos_proxy_connects(tunnel) > 0);
    chaos_proxy_stop(tunnel);

    snprintf(url, sizeof(url), "etcd://127.0.0.1:%d?proxy=http://u:p@127.0.0.1:1",
             e.client_port[0]);
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "proxy=");
    chaos_proxy_stop(relay);
    test_etcd_stop(&e);
}

static dlock_client *open_fast(const char *url);

/*
 * The keepalive stream stalled (the fault proxy between client and etcd
 * passes nothing more, the TCP connection stays open): the holder must not
 * go on believing it holds the lock once etcd has let the lease run out.
 * Whenever etcd no longer has the key, dlock_lock_lost() is already true
 * (the handle's deadline comes from the last renewal that was answered, so
 * it falls before the server's expiry); no time bound is assumed.
 */
static void keepalive_stalled_is_lost_in_time(void)
{
    test_etcd e;
    chaos_proxy *px;
    dlock_client *c;
    dlock_lock *l;
    /* A lease of several command timeouts (open_fast: 2.5 s): the renewals
     * that time out have time to be retried before it runs out. */
    dlock_acquire_options o = test_opts(0, 8000, 1);
    char url[200];
    long long renewals;
    int gone = 0;

    test_etcd_start(&e, 1, NULL);
    CHECK(chaos_proxy_start(&px, e.client_port[0]) == 0);
    snprintf(url, sizeof(url), "etcd://127.0.0.1:%d", chaos_proxy_port(px));
    c = open_fast(url);
    CHECK_RC(dlock_acquire(&l, c, "stalled", &o), DLOCK_OK);
    /* Renewals go over keepalive streams through the proxy. */
    renewals = served(&e, 0, "LeaseKeepAlive");
    for (int i = 0; i < 3000 && served(&e, 0, "LeaseKeepAlive") < renewals + 2; i++)
        test_sleep_ms(10);
    CHECK(served(&e, 0, "LeaseKeepAlive") >= renewals + 2);
    CHECK(!dlock_lock_lost(l));

    chaos_proxy_set(px, CHAOS_PROXY_BLACKHOLE, 0);
    for (int i = 0; i < 30000 && !gone; i++) {
        /* count first: a key gone at that moment means the lease had run
         * out on the server, so the handle must say lost from then on. */
        gone = test_etcd_count(&e, "dlock/stalled/") == 0;
        if (gone && !dlock_lock_lost(l))
            fprintf(stderr, "etcd let the lease run out but the handle still holds\n");
        CHECK(!gone || dlock_lock_lost(l));
        test_sleep_ms(10);
    }
    CHECK(gone);
    CHECK(dlock_lock_lost(l));
    chaos_proxy_set(px, CHAOS_PROXY_PASS, 0);
    chaos_proxy_drop(px);
    CHECK_RC(dlock_release(l), DLOCK_ELOST);
    dlock_client_free(c);
    chaos_proxy_stop(px);
    test_etcd_stop(&e);
}

/* The TTL etcd has left for lease id, in seconds; -1 when it has no such
 * lease. */
static long long lease_ttl(test_etcd *e, long long id)
{
    char body[64], *r;
    json_t *j;
    int64_t ttl = -1;

    snprintf(body, sizeof(body), "{\"ID\":\"%lld\"}", id);
    r = test_etcd_post(e, 0, "/v3/lease/timetolive", body);
    j = r != NULL ? json_loads(r, 0, NULL) : NULL;
    CHECK(j != NULL && dlock__etcd_int(j, "TTL", &ttl) == 0);
    json_decref(j);
    free(r);
    return ttl;
}

/* Wait until the client has n spare leases with no key (the spare thread
 * grants off the path). The thread puts a spare in its pool just after
 * etcd's reply to the grant, which etcd shows first: a moment more, so
 * that the next acquire finds it there (on a loaded machine, under ASan,
 * an acquire sometimes came first and granted a lease of its own). */
static void wait_spares(test_etcd *e, long long n)
{
    for (int i = 0; i < 500 && test_etcd_spares(e) != n; i++)
        test_sleep_ms(10);
    CHECK(test_etcd_spares(e) == n);
    test_sleep_ms(200);
}

/*
 * A release whose reply is lost (the fault proxy holds etcd's answer to
 * the delete past the command timeout) cannot tell whether it deleted its
 * key: it revokes the lease, as releases did before spare leases were
 * reused, and the lease never goes back to the pool; the next acquire
 * puts its key on another lease.
 */
static void release_reply_lost_revokes(void)
{
    test_etcd e;
    chaos_proxy *px;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 20000, 0);
    char url[200];
    long long lease, revokes, deletes;

    test_etcd_start(&e, 1, NULL);
    CHECK(chaos_proxy_start(&px, e.client_port[0]) == 0);
    snprintf(url, sizeof(url), "etcd://127.0.0.1:%d", chaos_proxy_port(px));
    c = open_fast(url);
    CHECK_RC(dlock_acquire(&l, c, "lost", &o), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    wait_spares(&e, 1);
    CHECK_RC(dlock_acquire(&l, c, "lost", &o), DLOCK_OK);
    lease = key_lease(&e, "dlock/lost/");
    CHECK(lease & (1LL << 62)); /* a spare */
    wait_spares(&e, 1);         /* the next one, granted by the thread */
    revokes = method_count(&e, "LeaseRevoke");
    deletes = method_count(&e, "DeleteRange");
    /* Longer than the whole command timeout (open_fast: 2.5 s). */
    chaos_proxy_set(px, CHAOS_PROXY_DELAY_ONE_REPLY, 4000);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    fprintf(stderr, "deleterange %lld, revoke %lld\n", method_count(&e, "DeleteRange") - deletes,
            method_count(&e, "LeaseRevoke") - revokes);
    CHECK(method_count(&e, "DeleteRange") > deletes); /* the release's delete */
    CHECK(method_count(&e, "LeaseRevoke") > revokes); /* then the revoke */
    CHECK(test_etcd_count(&e, "dlock/") == 0);
    CHECK(lease_ttl(&e, lease) == -1);
    CHECK_RC(dlock_acquire(&l, c, "lost", &o), DLOCK_OK);
    CHECK(key_lease(&e, "dlock/lost/") != lease);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    CHECK(test_etcd_spares(&e) == 0 && test_etcd_leases(&e) == 0);
    chaos_proxy_stop(px);
    test_etcd_stop(&e);
}

/* Hold l (auto_renew off) until etcd lets its key under prefix go, looking
 * every 10 ms: count first, since a key gone at that moment means the lease
 * had run out on the server, so the handle must say lost from then on. Then
 * release it. */
static void lost_before_gone(test_etcd *e, dlock_lock *l, const char *prefix)
{
    int gone = 0, rc;

    while (!gone) {
        gone = test_etcd_count(e, prefix) == 0;
        if (gone && !dlock_lock_lost(l))
            fprintf(stderr, "etcd let the lease run out but the handle still holds\n");
        CHECK(!gone || dlock_lock_lost(l));
        test_sleep_ms(10);
    }
    rc = dlock_release(l);
    CHECK(rc == DLOCK_ELOST || rc == DLOCK_OK);
}

/*
 * A lease taken again from the pool was last confirmed alive by an earlier
 * acquire or keepalive, maybe most of its TTL ago. The acquire that takes
 * it renews it (the keepalive beside its txn), so etcd keeps the key at
 * least until the client's deadline: whenever the key is gone,
 * dlock_lock_lost() is already true. No time bound is assumed.
 */
static void reused_lease_counts_from_acquire(void)
{
    test_etcd e;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 3000, 0);
    long long used[2], lease;

    test_etcd_start(&e, 1, NULL);
    c = open_client(&e);
    CHECK_RC(dlock_acquire(&l, c, "r", &o), DLOCK_OK); /* grants its own lease */
    CHECK_RC(dlock_release(l), DLOCK_OK);
    wait_spares(&e, 1);
    /* Two cycles on spares: the pool then holds two leases that have both
     * backed a lock. */
    for (int i = 0; i < 2; i++) {
        CHECK_RC(dlock_acquire(&l, c, "r", &o), DLOCK_OK);
        used[i] = key_lease(&e, "dlock/r/");
        CHECK_RC(dlock_release(l), DLOCK_OK);
        wait_spares(&e, 2);
    }
    CHECK(used[0] != used[1]);
    /* Most of their TTL (3 s) gone since their last confirmation, unless
     * the thread renewed one meanwhile. */
    test_sleep_ms(2000);
    CHECK_RC(dlock_acquire(&l, c, "r", &o), DLOCK_OK);
    lease = key_lease(&e, "dlock/r/");
    fprintf(stderr, "reused lease %llx (pool %llx, %llx)\n", lease, used[0], used[1]);
    CHECK(lease == used[0] || lease == used[1]);
    lost_before_gone(&e, l, "dlock/r/");
    dlock_client_free(c);
    test_etcd_stop(&e);
}

/*
 * A spare confirmed alive within a twentieth of its TTL (a release gave it
 * back a moment ago) is taken by the txn alone, without a keepalive, and
 * the lock's lease counts from that confirmation: etcd still keeps the key
 * at least until the client's deadline (key gone => dlock_lock_lost()), and
 * the handle is not lost at once.
 */
static void fresh_spare_needs_no_keepalive(void)
{
    test_etcd e;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 10000, 0), shortl = test_opts(0, 3000, 0);
    long long ka;
    int cycles = 20, gone = 0;

    test_etcd_start(&e, 1, NULL);
    c = open_client(&e);
    CHECK_RC(dlock_acquire(&l, c, "f", &o), DLOCK_OK); /* grants its own lease */
    CHECK_RC(dlock_release(l), DLOCK_OK);
    wait_spares(&e, 1);
    ka = method_count(&e, "LeaseKeepAlive");
    for (int i = 0; i < cycles; i++) {
        CHECK_RC(dlock_acquire(&l, c, "f", &o), DLOCK_OK);
        CHECK(key_lease(&e, "dlock/f/") & (1LL << 62)); /* on a spare */
        CHECK_RC(dlock_release(l), DLOCK_OK);
    }
    ka = method_count(&e, "LeaseKeepAlive") - ka;
    fprintf(stderr, "keepalives in %d cycles on spares: %lld\n", cycles, ka);
    CHECK(ka * 2 < cycles); /* one per 500 ms at most, not one per cycle */
    /* The same with a short lease, held until etcd lets it go. */
    for (int i = 0; i < 200; i++) { /* until the thread granted a spare of 3 s */
        CHECK_RC(dlock_acquire(&l, c, "g", &shortl), DLOCK_OK);
        gone = (key_lease(&e, "dlock/g/") & (1LL << 62)) != 0;
        CHECK_RC(dlock_release(l), DLOCK_OK);
        if (gone)
            break;
        test_sleep_ms(10);
    }
    CHECK(gone);
    gone = 0;
    ka = method_count(&e, "LeaseKeepAlive");
    CHECK_RC(dlock_acquire(&l, c, "g", &shortl), DLOCK_OK);
    CHECK(key_lease(&e, "dlock/g/") & (1LL << 62));
    ka = method_count(&e, "LeaseKeepAlive") - ka;
    fprintf(stderr, "keepalives of the acquire on a spare released a moment ago: %lld\n", ka);
    CHECK(!dlock_lock_lost(l));
    lost_before_gone(&e, l, "dlock/g/");
    dlock_client_free(c);
    test_etcd_stop(&e);
}

/* A member, a holder's client and a waiter's client, the waiter's with two
 * spares of a 10 s lease (as in two_raft_writes_per_cycle), so that its
 * promote does not take the last one, whose taking has the thread grant
 * another. */
static void start_with_spares(test_etcd *e, dlock_client **holder_c, dlock_client **waiter_c)
{
    dlock_acquire_options warm = test_opts(0, 10000, 0);
    dlock_lock *l;

    test_etcd_start(e, 1, NULL);
    *holder_c = open_client(e);
    *waiter_c = open_client(e);
    /* The first cycle asks for a spare; the first cycle on it has the thread
     * grant a second, unless the release gave the first back before the
     * grant was made (the pool was not empty any more): cycles until there
     * are two. */
    for (int i = 0; i < 20 && test_etcd_spares(e) < 2; i++) {
        CHECK_RC(dlock_acquire(&l, *waiter_c, "warm", &warm), DLOCK_OK);
        CHECK_RC(dlock_release(l), DLOCK_OK);
        for (int k = 0; k < 100 && test_etcd_spares(e) < (i == 0 ? 1 : 2); k++)
            test_sleep_ms(10);
    }
    wait_spares(e, 2);
}

/*
 * A waiter at the head of the queue whose lease is longer than the wait's
 * short one moves its key onto a spare lease of its TTL, renewed in the
 * same round trip, instead of granting one: no grant between the release
 * and the new holder, and one txn, which is both the wake-up's check (our
 * key first) and the move. Its release then gives that lease back to the
 * pool.
 */
static void waiter_promoted_onto_spare(void)
{
    test_etcd e;
    dlock_client *holder_c, *waiter_c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 20000, 0);
    test_acquirer a;
    pthread_t t;
    long long grants, revokes, txns, lease;

    start_with_spares(&e, &holder_c, &waiter_c);
    CHECK_RC(dlock_acquire(&l, holder_c, "promote", &o), DLOCK_OK);
    test_acquirer_init(&a, waiter_c, "promote", test_opts(8000, 10000, 0));
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &a) == 0);
    wait_queued(&e, "dlock/promote/");
    grants = method_count(&e, "LeaseGrant");
    txns = method_count(&e, "Txn");
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(a.rc, DLOCK_OK);
    lease = key_lease(&e, "dlock/promote/");
    fprintf(stderr, "in the hand-off: grants %lld, txns %lld; the holder's lease %llx\n",
            method_count(&e, "LeaseGrant") - grants, method_count(&e, "Txn") - txns, lease);
    CHECK(method_count(&e, "Txn") - txns == 1);
    CHECK(lease & (1LL << 62)); /* a spare */
    CHECK(method_count(&e, "LeaseGrant") == grants);
    revokes = method_count(&e, "LeaseRevoke");
    CHECK_RC(dlock_release(a.lock), DLOCK_OK);
    CHECK(method_count(&e, "LeaseRevoke") == revokes); /* a delete */
    CHECK(test_etcd_count(&e, "dlock/promote/") == 0);
    CHECK(lease_ttl(&e, lease) > 0); /* back in the pool */
    dlock_client_free(holder_c);
    dlock_client_free(waiter_c);
    CHECK(test_etcd_spares(&e) == 0 && test_etcd_leases(&e) == 0);
    test_etcd_stop(&e);
}

/*
 * The wake-up's move onto a spare is done only when our key is first: a
 * waiter woken because the waiter ahead of it gave up (its wait ran out)
 * is not first, so its txn moves nothing, and it goes on waiting for the
 * holder, which it gets when the holder releases.
 */
static void woken_not_first_keeps_waiting(void)
{
    test_etcd e;
    dlock_client *holder_c, *waiter_c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 20000, 0);
    test_acquirer gives_up, waits;
    pthread_t t1, t2;
    long long txns;

    start_with_spares(&e, &holder_c, &waiter_c);
    CHECK_RC(dlock_acquire(&l, holder_c, "nf", &o), DLOCK_OK);
    /* Queued first, it gives up after 1.5 s. */
    test_acquirer_init(&gives_up, holder_c, "nf", test_opts(1500, 10000, 0));
    CHECK(pthread_create(&t1, NULL, test_acquirer_main, &gives_up) == 0);
    wait_queued(&e, "dlock/nf/");
    /* Queued behind it, watching its key. */
    test_acquirer_init(&waits, waiter_c, "nf", test_opts(30000, 10000, 0));
    CHECK(pthread_create(&t2, NULL, test_acquirer_main, &waits) == 0);
    for (int i = 0; i < 500 && test_etcd_count(&e, "dlock/nf/") < 3; i++)
        test_sleep_ms(10);
    CHECK(test_etcd_count(&e, "dlock/nf/") == 3);
    txns = method_count(&e, "Txn");
    CHECK(pthread_join(t1, NULL) == 0);
    CHECK_RC(gives_up.rc, DLOCK_ETIMEOUT);
    /* Woken (its wake-up txn sent) and asleep again behind the holder. */
    for (int i = 0; i < 500 && method_count(&e, "Txn") == txns; i++)
        test_sleep_ms(10);
    test_sleep_ms(500);
    fprintf(stderr, "txns after the wake-up: %lld\n", method_count(&e, "Txn") - txns);
    CHECK(method_count(&e, "Txn") > txns);
    CHECK(!atomic_load(&waits.done));
    CHECK(test_etcd_count(&e, "dlock/nf/") == 2);
    CHECK_RC(dlock_lock_check(l), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(pthread_join(t2, NULL) == 0);
    CHECK_RC(waits.rc, DLOCK_OK);
    CHECK(key_lease(&e, "dlock/nf/") & (1LL << 62)); /* moved onto a spare */
    CHECK_RC(dlock_release(waits.lock), DLOCK_OK);
    dlock_client_free(holder_c);
    dlock_client_free(waiter_c);
    test_etcd_stop(&e);
}

/*
 * transport=gateway: etcd's JSON gateway over HTTP/1.1, for a proxy that
 * carries no HTTP/2 (docs/etcd.md). The same client: a lock, a waiter woken
 * through a watch stream, renewals through keepalive streams; and bad
 * values of transport= named.
 */
static void gateway_transport(void)
{
    test_etcd e;
    dlock_client *c, *c2;
    dlock_lock *l;
    test_acquirer a;
    pthread_t t;
    char url[200];
    long long renewals;
    dlock_acquire_options o = test_opts(0, 2000, 1);

    test_etcd_start(&e, 1, NULL);
    snprintf(url, sizeof(url), "etcd://127.0.0.1:%d?transport=gateway", e.client_port[0]);
    c = open_fast(url);
    c2 = open_fast(url);
    CHECK_RC(dlock_acquire(&l, c, "gw", &o), DLOCK_OK);
    renewals = served(&e, 0, "LeaseKeepAlive");
    test_acquirer_init(&a, c2, "gw", test_opts(60000, 2000, 0));
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &a) == 0);
    for (int i = 0; i < 3000 && (test_etcd_count(&e, "dlock/gw/") < 2 ||
                                 served(&e, 0, "LeaseKeepAlive") < renewals + 2); i++)
        test_sleep_ms(10);
    CHECK(test_etcd_count(&e, "dlock/gw/") == 2);
    CHECK(served(&e, 0, "LeaseKeepAlive") >= renewals + 2);
    CHECK(!atomic_load(&a.done));
    CHECK_RC(dlock_lock_check(l), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(a.rc, DLOCK_OK);
    CHECK_RC(dlock_release(a.lock), DLOCK_OK);
    dlock_client_free(c);
    dlock_client_free(c2);

    /* The gateway is what answers: etcd's peer port serves gRPC, but no
     * gateway. */
    snprintf(url, sizeof(url), "etcd://127.0.0.1:%d", e.peer_port[0]);
    c = open_fast(url);
    dlock_client_free(c);
    snprintf(url, sizeof(url), "etcd://127.0.0.1:%d?transport=gateway", e.peer_port[0]);
    c = NULL;
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_EPROTO);

    snprintf(url, sizeof(url), "etcd://127.0.0.1:%d?transport=http3", e.client_port[0]);
    c = NULL;
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "transport=");
    test_etcd_stop(&e);
}

/* etcds:// with a CA, and the client certificate etcd requires. */
static void tls_with_client_certificate(void)
{
    test_etcd e;
    dlock_client *c = NULL;
    dlock_lock *l;
    dlock_lock_info info;
    char url[400];

    test_etcd_start_tls(&e, 1);
    c = open_client(&e);
    CHECK_RC(dlock_acquire(&l, c, "secure", NULL), DLOCK_OK);
    CHECK_RC(dlock_status(&info, c, "secure"), DLOCK_OK);
    CHECK(info.held && info.fence == dlock_lock_fence(l));
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    c = NULL;

    /* Without the client certificate, the server refuses the handshake. */
    snprintf(url, sizeof(url), "etcds://127.0.0.1:%d?cacert=%s/ca.pem", e.client_port[0], e.tls);
    {
        dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;
        o.command_timeout_ms = 1000;
        CHECK_RC(dlock_client_open(&c, url, &o), DLOCK_ECONN);
    }
    /* Plain http to a TLS port is no answer either, and never falls back. */
    snprintf(url, sizeof(url), "etcd://127.0.0.1:%d", e.client_port[0]);
    {
        dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;
        o.command_timeout_ms = 1000;
        int rc = dlock_client_open(&c, url, &o);
        CHECK(rc == DLOCK_ECONN || rc == DLOCK_EPROTO);
    }
    /* A CA that did not sign the server's certificate. */
    snprintf(url, sizeof(url), "etcds://127.0.0.1:%d?cacert=%s/client.pem&cert=%s/client.pem"
             "&key=%s/client.key", e.client_port[0], e.tls, e.tls, e.tls);
    {
        dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;
        o.command_timeout_ms = 1000;
        CHECK_RC(dlock_client_open(&c, url, &o), DLOCK_ECONN);
        CHECK_CONTAINS(dlock_error_message(), "etcd 127.0.0.1:");
    }
    CHECK(c == NULL);
    test_etcd_stop(&e);
}

/* ---- a 3-member cluster --------------------------------------------------- */

static dlock_client *open_fast(const char *url)
{
    dlock_client *c = NULL;
    dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;

    o.connect_timeout_ms = 500;
    o.command_timeout_ms = 2500;
    CHECK_RC(dlock_client_open(&c, url, &o), DLOCK_OK);
    return c;
}

/* etcd://first,others...: the client uses member first until it fails. */
static void url_first(char *out, size_t size, const test_etcd *e, int first, int skip)
{
    size_t used = (size_t)snprintf(out, size, "etcd://127.0.0.1:%d", e->client_port[first]);

    for (int i = 0; i < e->n; i++)
        if (i != first && i != skip)
            used += (size_t)snprintf(out + used, size - used, ",127.0.0.1:%d", e->client_port[i]);
}

/* Every member process of the cluster is gone after the test. */
static void stop_and_check_no_stray(test_etcd *e)
{
    int pids[TEST_ETCD_MAX];

    for (int i = 0; i < e->n; i++)
        pids[i] = e->pid[i];
    test_etcd_stop(e);
    for (int i = 0; i < e->n; i++)
        CHECK(!test_process_alive(pids[i]));
}

/*
 * Hold the lock for about `ms` while a contender on other members keeps
 * trying: whenever the contender gets the lock, the holder must already know
 * its lock is lost (never held by two). Returns 1 if the holder kept it.
 */
static int hold_against_contender(dlock_client *contender, dlock_lock *held, const char *name,
                                  int64_t ms)
{
    dlock_acquire_options o = test_opts(0, 3000, 0);

    for (int64_t waited = 0; waited < ms; waited += 100) {
        dlock_lock *other = NULL;
        int rc = dlock_acquire(&other, contender, name, &o);
        if (rc == DLOCK_OK) {
            CHECK(dlock_lock_lost(held)); /* two holders otherwise */
            CHECK(dlock_lock_fence(other) > dlock_lock_fence(held));
            CHECK_RC(dlock_release(other), DLOCK_OK);
            return 0;
        }
        CHECK(rc == DLOCK_EBUSY || rc == DLOCK_ECONN);
        test_sleep_ms(100);
    }
    return !dlock_lock_lost(held);
}

static void cluster_kill_member_while_holding(void)
{
    test_etcd e;
    dlock_client *holder, *contender;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 3000, 1);
    char url[300];
    int used, kept;
    long long streams;

    atomic_store(&test_lost_calls, 0);
    test_etcd_start(&e, 3, NULL);
    used = (test_etcd_leader(&e) + 1) % 3; /* a follower */
    url_first(url, sizeof(url), &e, used, -1);
    holder = open_fast(url);
    url_first(url, sizeof(url), &e, (used + 1) % 3, used);
    contender = open_fast(url);
    o.on_lost = test_count_lost;
    CHECK_RC(dlock_acquire(&l, holder, "ha", &o), DLOCK_OK);
    streams = served(&e, (used + 1) % 3, "LeaseKeepAlive") +
              served(&e, (used + 2) % 3, "LeaseKeepAlive");
    test_etcd_kill(&e, used);
    /* Over 3 leases: renewals go to the next member. */
    kept = hold_against_contender(contender, l, "ha", 9000);
    /* ... on keepalive streams of the members left (gRPC's, opened anew). */
    CHECK(served(&e, (used + 1) % 3, "LeaseKeepAlive") +
          served(&e, (used + 2) % 3, "LeaseKeepAlive") > streams);
    fprintf(stderr, "holder %s the killing of the member it used\n", kept ? "survived" : "lost its lock at");
    CHECK(kept);
    CHECK(atomic_load(&test_lost_calls) == 0);
    CHECK_RC(dlock_lock_check(l), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, contender, "ha", NULL), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(holder);
    dlock_client_free(contender);
    stop_and_check_no_stray(&e);
}

/*
 * The read-write lock on the cluster: a writer waits for a reader through
 * a follower that is then killed. Its range watch of the reader's key moves
 * to another member, from the same revision, and the reader's release (its
 * lease is renewed, and far longer than the wait so far) lets it in.
 */
static void cluster_rw_writer_waits_through_kill(void)
{
    test_etcd e;
    dlock_client *reader_c, *writer_c;
    dlock_lock *r;
    /* The writer waits for ever: only a wake-up can end its wait (no
     * last try at a deadline), so a watch lost with the member hangs the
     * test until ctest's timeout. */
    dlock_acquire_options ro = test_opts(0, 30000, 1),
                          wo = test_opts(DLOCK_WAIT_FOREVER, 30000, 0);
    test_acquirer a;
    pthread_t t;
    char url[300];
    uint64_t fence;
    int used;

    ro.kind = DLOCK_KIND_READ;
    wo.kind = DLOCK_KIND_WRITE;
    test_etcd_start(&e, 3, NULL);
    used = (test_etcd_leader(&e) + 1) % 3; /* a follower */
    url_first(url, sizeof(url), &e, used, -1);
    writer_c = open_fast(url);
    url_first(url, sizeof(url), &e, (used + 1) % 3, used);
    reader_c = open_fast(url);
    CHECK_RC(dlock_acquire(&r, reader_c, "rwk", &ro), DLOCK_OK);
    fence = dlock_lock_fence(r);
    test_acquirer_init(&a, writer_c, "rwk", wo);
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &a) == 0);
    for (int i = 0; i < 3000 && test_etcd_count(&e, "dlock/rwk/") != 2; i++)
        test_sleep_ms(10);
    CHECK(test_etcd_count(&e, "dlock/rwk/") == 2);
    test_etcd_kill(&e, used);
    CHECK(!atomic_load(&a.done));
    CHECK_RC(dlock_release(r), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(a.rc, DLOCK_OK);
    CHECK(dlock_lock_fence(a.lock) > fence);
    CHECK_RC(dlock_release(a.lock), DLOCK_OK);
    dlock_client_free(reader_c);
    dlock_client_free(writer_c);
    stop_and_check_no_stray(&e);
}

static void cluster_kill_member_while_waiting(void)
{
    test_etcd e;
    dlock_client *holder, *waiter_c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 30000, 0);
    test_acquirer a;
    pthread_t t;
    char url[300];
    int used, other;
    long long watches;

    test_etcd_start(&e, 3, NULL);
    used = test_etcd_leader(&e);
    other = (used + 1) % 3;
    url_first(url, sizeof(url), &e, other, -1);
    holder = open_fast(url);
    CHECK_RC(dlock_acquire(&l, holder, "wq", &o), DLOCK_OK);
    url_first(url, sizeof(url), &e, used, -1);
    waiter_c = open_fast(url);
    /* A wait shorter than the holder's lease: only a release wakes it. */
    test_acquirer_init(&a, waiter_c, "wq", test_opts(25000, 2000, 1));
    watches = served(&e, used, "Watch");
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &a) == 0);
    for (int i = 0; i < 500 && (test_etcd_count(&e, "dlock/wq/") < 2 ||
                                served(&e, used, "Watch") <= watches); i++)
        test_sleep_ms(10);
    CHECK(test_etcd_count(&e, "dlock/wq/") == 2);
    CHECK(served(&e, used, "Watch") > watches); /* its watch is on the member we kill */
    test_etcd_kill(&e, used);
    /* Past the waiter's lease: it keeps its key alive through the others. */
    test_sleep_ms(3000);
    CHECK(!atomic_load(&a.done));
    CHECK(test_etcd_count(&e, "dlock/wq/") == 2);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(a.rc, DLOCK_OK); /* woken through a watch on another member */
    CHECK_RC(dlock_lock_check(a.lock), DLOCK_OK);
    CHECK_RC(dlock_release(a.lock), DLOCK_OK);
    CHECK(test_etcd_count(&e, "dlock/wq/") == 0);
    dlock_client_free(holder);
    dlock_client_free(waiter_c);
    stop_and_check_no_stray(&e);
}

/*
 * The leader is killed under a holder: the lock survives. It can only if
 * the election and the holder's move to another member end before its
 * lease runs out unconfirmed (the client cannot know that etcd extends
 * leases on a leader change: at its deadline it reports the lock lost), so
 * the lease here leaves them 4 s at least (a 3 s lease was lost once in 19
 * runs on a loaded machine). Held past a whole lease after the kill: the
 * lease was renewed through the new leader.
 */
static void cluster_kill_leader(void)
{
    test_etcd e;
    dlock_client *holder, *contender;
    dlock_lock *l, *l2;
    dlock_acquire_options o = test_opts(0, 6000, 1);
    char url[300];
    int leader, next, kept;
    uint64_t fence;

    atomic_store(&test_lost_calls, 0);
    test_etcd_start(&e, 3, NULL);
    leader = test_etcd_leader(&e);
    url_first(url, sizeof(url), &e, leader, -1);
    holder = open_fast(url);
    url_first(url, sizeof(url), &e, (leader + 1) % 3, leader);
    contender = open_fast(url);
    o.on_lost = test_count_lost;
    CHECK_RC(dlock_acquire(&l, holder, "lead", &o), DLOCK_OK);
    fence = dlock_lock_fence(l);
    test_etcd_kill(&e, leader);
    next = test_etcd_leader(&e);
    CHECK(next != leader);
    kept = hold_against_contender(contender, l, "lead", 8000);
    fprintf(stderr, "holder %s the killing of the leader\n", kept ? "survived" : "lost its lock at");
    CHECK(kept);
    CHECK(atomic_load(&test_lost_calls) == 0);
    CHECK_RC(dlock_lock_check(l), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    /* The new leader issues greater fences. */
    CHECK_RC(dlock_acquire(&l2, holder, "lead", NULL), DLOCK_OK);
    CHECK(dlock_lock_fence(l2) > fence);
    CHECK_RC(dlock_release(l2), DLOCK_OK);
    dlock_client_free(holder);
    dlock_client_free(contender);
    stop_and_check_no_stray(&e);
}

/*
 * The member both a holder and a waiter use stops (SIGSTOP): it still
 * accepts connections but answers nothing. Both move to the other members
 * within their calls' budget: the holder keeps its lock, the waiter its
 * place, and the release reaches the waiter through a watch on another
 * member.
 */
static void cluster_stop_member(void)
{
    test_etcd e;
    dlock_client *holder, *waiter_c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 4000, 1);
    test_acquirer a;
    pthread_t t;
    char url[300];
    int used;

    atomic_store(&test_lost_calls, 0);
    test_etcd_start(&e, 3, NULL);
    used = (test_etcd_leader(&e) + 1) % 3; /* a follower */
    url_first(url, sizeof(url), &e, used, -1);
    holder = open_fast(url);
    waiter_c = open_fast(url);
    o.on_lost = test_count_lost;
    CHECK_RC(dlock_acquire(&l, holder, "frozen", &o), DLOCK_OK);
    test_acquirer_init(&a, waiter_c, "frozen", test_opts(30000, 4000, 1));
    CHECK(pthread_create(&t, NULL, test_acquirer_main, &a) == 0);
    for (int i = 0; i < 500 && test_etcd_count(&e, "dlock/frozen/") < 2; i++)
        test_sleep_ms(10);
    CHECK(test_etcd_count(&e, "dlock/frozen/") == 2);
    CHECK(kill(e.pid[used], SIGSTOP) == 0);
    test_sleep_ms(9000); /* more than two leases of both */
    CHECK(!atomic_load(&a.done));
    CHECK(!dlock_lock_lost(l));
    CHECK(atomic_load(&test_lost_calls) == 0);
    CHECK(test_etcd_count(&e, "dlock/frozen/") == 2);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(a.rc, DLOCK_OK);
    CHECK_RC(dlock_release(a.lock), DLOCK_OK);
    kill(e.pid[used], SIGCONT);
    dlock_client_free(holder);
    dlock_client_free(waiter_c);
    stop_and_check_no_stray(&e);
}

/* A member restarted after locks came and went catches up and serves them:
 * with another member down, the cluster needs it for its quorum. */
static void cluster_restart_member(void)
{
    test_etcd e;
    dlock_client *c, *only;
    dlock_lock *held, *l;
    dlock_acquire_options o = test_opts(0, 3000, 1);
    uint64_t last = 0;
    int down;

    test_etcd_start(&e, 3, NULL);
    c = open_fast(e.url);
    CHECK_RC(dlock_acquire(&held, c, "kept", &o), DLOCK_OK);
    down = (test_etcd_leader(&e) + 1) % 3;
    test_etcd_kill(&e, down);
    for (int i = 0; i < 20; i++) {
        CHECK_RC(dlock_acquire(&l, c, "cycled", &o), DLOCK_OK);
        CHECK(dlock_lock_fence(l) > last);
        last = dlock_lock_fence(l);
        CHECK_RC(dlock_release(l), DLOCK_OK);
    }
    test_etcd_restart(&e, down);
    test_etcd_kill(&e, (down + 1) % 3);
    test_etcd_leader(&e);
    only = open_fast(e.member_url[down]);
    CHECK_RC(dlock_acquire(&l, only, "kept", NULL), DLOCK_EBUSY);
    CHECK_RC(dlock_acquire(&l, only, "cycled", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(l) > last);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK_RC(dlock_lock_check(held), DLOCK_OK);
    CHECK(!dlock_lock_lost(held));
    CHECK_RC(dlock_release(held), DLOCK_OK);
    dlock_client_free(c);
    dlock_client_free(only);
    stop_and_check_no_stray(&e);
}

/*
 * Processes increment a counter in a file under the lock while the leader is
 * killed and restarted. A holder writes only while its lock is not known
 * lost; a lost increment means two holders overlapped.
 */
static void cluster_mutual_exclusion_leader_killed(void)
{
    enum { PROCS = 3 };
    test_etcd e;
    char path[] = "/tmp/dlock-counter-XXXXXX";
    int fd = mkstemp(path);
    pid_t pids[PROCS];
    long *shared, total, at_kill, sum = 0;
    int leader;

    CHECK(fd >= 0);
    CHECK(write(fd, "0", 1) == 1);
    close(fd);
    /* shared[p]: increments by process p; shared[PROCS]: stop flag */
    shared = mmap(NULL, sizeof(long) * (PROCS + 1), PROT_READ | PROT_WRITE,
                  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(shared != MAP_FAILED);
    test_etcd_start(&e, 3, NULL);
    for (int p = 0; p < PROCS; p++) {
        pids[p] = fork();
        CHECK(pids[p] >= 0);
        if (pids[p] == 0) {
            char url[300];
            dlock_client *c;
            dlock_acquire_options o = test_opts(DLOCK_WAIT_FOREVER, 2000, 1);
            url_first(url, sizeof(url), &e, p % 3, -1);
            c = open_fast(url);
            while (!__atomic_load_n(&shared[PROCS], __ATOMIC_SEQ_CST)) {
                dlock_lock *l;
                char buf[32] = {0};
                long v;
                int f, rc = dlock_acquire(&l, c, "chaos", &o);
                if (rc == DLOCK_ECONN)
                    continue; /* no quorum for a moment */
                CHECK_RC(rc, DLOCK_OK);
                f = open(path, O_RDWR);
                CHECK(f >= 0 && read(f, buf, sizeof(buf) - 1) > 0);
                v = atol(buf);
                usleep(300);
                if (!dlock_lock_lost(l)) {
                    snprintf(buf, sizeof(buf), "%ld", v + 1);
                    CHECK(pwrite(f, buf, strlen(buf), 0) == (ssize_t)strlen(buf));
                    __atomic_add_fetch(&shared[p], 1, __ATOMIC_SEQ_CST);
                }
                close(f);
                dlock_release(l); /* DLOCK_ELOST or ECONN are possible here */
            }
            dlock_client_free(c);
            _exit(0);
        }
    }
    for (int i = 0; i < 500 && shared[0] + shared[1] + shared[2] < 30; i++)
        test_sleep_ms(10);
    leader = test_etcd_leader(&e);
    test_etcd_kill(&e, leader);
    at_kill = shared[0] + shared[1] + shared[2];
    test_sleep_ms(1500);
    test_etcd_restart(&e, leader);
    test_sleep_ms(1000);
    __atomic_store_n(&shared[PROCS], 1, __ATOMIC_SEQ_CST);
    for (int p = 0; p < PROCS; p++)
        test_wait_child_ok(pids[p]);
    {
        char buf[32] = {0};
        int f = open(path, O_RDONLY);
        CHECK(f >= 0 && read(f, buf, sizeof(buf) - 1) > 0);
        close(f);
        total = atol(buf);
    }
    unlink(path);
    for (int p = 0; p < PROCS; p++)
        sum += shared[p];
    fprintf(stderr, "increments: %ld before the leader was killed, %ld in all\n", at_kill, sum);
    if (total != sum) {
        fprintf(stderr, "counter is %ld, %ld increments: two holders overlapped\n", total, sum);
        exit(1);
    }
    CHECK(sum > at_kill + 10); /* the lock kept working after the kill */
    munmap(shared, sizeof(long) * (PROCS + 1));
    stop_and_check_no_stray(&e);
}

/* ---- the CLI ---------------------------------------------------------------- */

/* dlock run with an etcd:// URL: the command's exit code passes through, it
 * sees DLOCK_FENCE, a held lock gives 75, and a lock lost under the running
 * command stops it and gives 76. */
static void cli_run(void)
{
#ifdef DLOCK_CLI_PATH
    test_etcd e;
    dlock_client *c;
    dlock_lock *l;
    char cmd[1024], out[] = "/tmp/dlock-cli-fence-XXXXXX";
    char buf[64] = {0};
    int fd, status;

    test_etcd_start(&e, 1, NULL);
    fd = mkstemp(out);
    CHECK(fd >= 0);
    snprintf(cmd, sizeof(cmd), "%s --url '%s' run --ttl 3s job -- sh -c "
             "'echo \"$DLOCK_NAME $DLOCK_FENCE\" > %s; exit 7'", DLOCK_CLI_PATH, e.url, out);
    status = system(cmd);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 7);
    CHECK(read(fd, buf, sizeof(buf) - 1) > 0);
    close(fd);
    unlink(out);
    CHECK(strncmp(buf, "job ", 4) == 0 && strtoull(buf + 4, NULL, 10) > 0);
    CHECK(test_etcd_count(&e, "dlock/") == 0); /* released after the command */

    c = open_client(&e);
    CHECK_RC(dlock_acquire(&l, c, "job", NULL), DLOCK_OK);
    snprintf(cmd, sizeof(cmd), "%s --url '%s' run job -- true 2>/dev/null", DLOCK_CLI_PATH, e.url);
    status = system(cmd);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 75);
    snprintf(cmd, sizeof(cmd), "%s --url '%s' status job | grep -q 'held, fence %" PRIu64 "'",
             DLOCK_CLI_PATH, e.url, dlock_lock_fence(l));
    CHECK(system(cmd) == 0);
    CHECK_RC(dlock_release(l), DLOCK_OK);

    /* The lock broken under a running command: it is stopped, exit 76. */
    {
        pid_t pid = fork();
        dlock_lock_info removed;
        CHECK(pid >= 0);
        if (pid == 0) {
            execl(DLOCK_CLI_PATH, "dlock", "--url", e.url, "run", "--ttl", "3s", "--grace",
                  "1s", "broken", "--", "sleep", "60", (char *)NULL);
            _exit(127);
        }
        for (int i = 0; i < 500 && test_etcd_count(&e, "dlock/broken/") == 0; i++)
            test_sleep_ms(10);
        CHECK(test_etcd_count(&e, "dlock/broken/") == 1);
        CHECK_RC(dlock_force_release(&removed, c, "broken"), DLOCK_OK);
        CHECK(removed.held == 1);
        CHECK(waitpid(pid, &status, 0) == pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 76);
    }
    dlock_client_free(c);
    test_etcd_stop(&e);
#else
    fprintf(stderr, "cli_run: built without the dlock command (cli/)\n");
    exit(1);
#endif
}

/*
 * Before 3.4.25 and 3.5.8 a stale leader could answer a keepalive while the
 * real leader let the lease run out (etcd-io/etcd#15247). On such a server
 * (Debian's etcd is 3.4.23) every renewal is confirmed by the lease's TTL,
 * one LeaseTimeToLive a lock after the renewal's linearizable txn, before
 * the deadline moves, and so is an extend's keepalive; on a newer one,
 * none. Acquire and release ask no TTL on either.
 */
static void renewal_confirmed_on_old_server(void)
{
    test_etcd e;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = test_opts(0, 3000, 0);
    dlock_stats st = DLOCK_STATS_INIT;
    long long before, extended;
    int old;

    test_etcd_start(&e, 1, NULL);
    old = server_before_keepalive_fix(&e);
    fprintf(stderr, "etcd before the keepalive fix: %s\n", old ? "yes" : "no");
    c = open_client(&e);
    before = served(&e, 0, "LeaseTimeToLive");
    for (int i = 0; i < 5; i++) {
        CHECK_RC(dlock_acquire(&l, c, "confirm", &o), DLOCK_OK);
        CHECK_RC(dlock_release(l), DLOCK_OK);
    }
    CHECK(served(&e, 0, "LeaseTimeToLive") == before);
    o.auto_renew = 1;
    CHECK_RC(dlock_acquire(&l, c, "confirm", &o), DLOCK_OK);
    for (int i = 0; i < 1000 && st.renewals < 3; i++) {
        test_sleep_ms(10);
        CHECK_RC(dlock_client_stats(&st, c), DLOCK_OK);
    }
    CHECK(st.renewals >= 3);
    CHECK(!dlock_lock_lost(l));
    /* An extend with a keepalive (the same TTL) is confirmed too. */
    extended = served(&e, 0, "LeaseTimeToLive");
    CHECK_RC(dlock_lock_extend(l, 3000), DLOCK_OK);
    extended = served(&e, 0, "LeaseTimeToLive") - extended;
    CHECK(old ? extended >= 1 : extended == 0); /* 2 if a renewal came meanwhile */
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK_RC(dlock_client_stats(&st, c), DLOCK_OK);
    fprintf(stderr, "renewals %llu, LeaseTimeToLive %lld\n", (unsigned long long)st.renewals,
            served(&e, 0, "LeaseTimeToLive") - before);
    if (old)
        CHECK(served(&e, 0, "LeaseTimeToLive") - before >= (long long)st.renewals + 1);
    else
        CHECK(served(&e, 0, "LeaseTimeToLive") == before);
    dlock_client_free(c);
    test_etcd_stop(&e);
}

/* Messages etcd received on a stream method ("LeaseKeepAlive"). */
static long long messages(test_etcd *e, const char *method)
{
    char metric[160];

    snprintf(metric, sizeof(metric), "grpc_server_msg_received_total{grpc_method=\"%s\"", method);
    return test_etcd_metric(e, 0, metric);
}

#define SESSION_BITS (3LL << 61)

/*
 * The auto-renewed locks of a client and a TTL share its session lease
 * (etcd_session.c, issue 33): renewing them is a keepalive per batch, not
 * per lock; a release, or an operator's force release from another
 * client, deletes one key and leaves the others held; a lock with
 * auto_renew off keeps a lease of its own, which runs out on the server
 * while the session lease lives on; a session lease revoked by hand loses
 * every lock on it, each told; and closing the client revokes it.
 */
static void session_lease_shared(void)
{
    enum { N = 40 };
    test_etcd e;
    dlock_client *c, *c2;
    dlock_lock *l[N], *once, *b;
    dlock_acquire_options o = test_opts(0, 3000, 1), off = test_opts(0, 2000, 0);
    dlock_acquire_options wait = test_opts(6000, 2000, 0);
    dlock_lock_info removed;
    char name[32], body[64];
    long long lease, ka;

    atomic_store(&test_lost_calls, 0);
    test_etcd_start(&e, 1, NULL);
    c = open_client(&e);
    c2 = open_client(&e);
    o.on_lost = test_count_lost;
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof(name), "s%d", i);
        CHECK_RC(dlock_acquire(&l[i], c, name, &o), DLOCK_OK);
    }
    CHECK(test_etcd_sessions(&e) == 1);
    lease = key_lease(&e, "dlock/s0/");
    CHECK((lease & SESSION_BITS) == SESSION_BITS);
    for (int i = 1; i < N; i++) {
        snprintf(name, sizeof(name), "dlock/s%d/", i);
        CHECK(key_lease(&e, name) == lease);
    }
    /* auto_renew off: a lease of its own. */
    CHECK_RC(dlock_acquire(&once, c, "once", &off), DLOCK_OK);
    CHECK((key_lease(&e, "dlock/once/") & SESSION_BITS) != SESSION_BITS);

    /* Three renewal periods (a second each): a keepalive per batch, where a
     * lease per lock took one per lock and period (3 * N). */
    ka = messages(&e, "LeaseKeepAlive");
    test_sleep_ms(3000);
    ka = messages(&e, "LeaseKeepAlive") - ka;
    fprintf(stderr, "%d session locks, 3 s: %lld keepalive messages\n", N, ka);
    CHECK(ka > 0 && ka < N);
    CHECK(atomic_load(&test_lost_calls) == 0);

    /* The lock with auto_renew off ran out on the server meanwhile. */
    CHECK_RC(dlock_acquire(&b, c2, "once", &wait), DLOCK_OK);
    CHECK_RC(dlock_release(b), DLOCK_OK);
    CHECK_RC(dlock_release(once), DLOCK_ELOST);

    /* A release deletes its key alone. */
    CHECK_RC(dlock_release(l[0]), DLOCK_OK);
    CHECK(test_etcd_count(&e, "dlock/s0/") == 0);
    CHECK(test_etcd_sessions(&e) == 1);
    CHECK_RC(dlock_lock_check(l[1]), DLOCK_OK);

    /* An operator's force release, from another client: that lock is told,
     * the others stay held. */
    CHECK_RC(dlock_force_release(&removed, c2, "s1"), DLOCK_OK);
    CHECK(removed.held == 1 && removed.fence == dlock_lock_fence(l[1]));
    for (int i = 0; i < 300 && atomic_load(&test_lost_calls) < 1; i++)
        test_sleep_ms(10);
    test_sleep_ms(1200); /* a renewal period more: nobody else lost */
    CHECK(atomic_load(&test_lost_calls) == 1);
    CHECK(test_etcd_sessions(&e) == 1);
    CHECK_RC(dlock_lock_check(l[2]), DLOCK_OK);
    CHECK_RC(dlock_release(l[1]), DLOCK_ELOST);

    /* The session lease revoked by hand: every lock on it is lost, each
     * told once. */
    snprintf(body, sizeof(body), "{\"ID\":\"%lld\"}", lease);
    free(test_etcd_post(&e, 0, "/v3/lease/revoke", body));
    for (int i = 0; i < 500 && atomic_load(&test_lost_calls) < N - 1; i++)
        test_sleep_ms(10);
    CHECK(atomic_load(&test_lost_calls) == N - 1);
    for (int i = 2; i < N; i++) {
        CHECK(dlock_lock_lost(l[i]) == 1);
        CHECK_RC(dlock_release(l[i]), DLOCK_ELOST);
    }

    /* The next acquire grants a new session lease; closing revokes it. */
    CHECK_RC(dlock_acquire(&l[0], c, "s0", &o), DLOCK_OK);
    CHECK(key_lease(&e, "dlock/s0/") != lease);
    CHECK((key_lease(&e, "dlock/s0/") & SESSION_BITS) == SESSION_BITS);
    CHECK_RC(dlock_release(l[0]), DLOCK_OK);
    CHECK(test_etcd_sessions(&e) == 1);
    dlock_client_free(c);
    CHECK(test_etcd_sessions(&e) == 0);
    dlock_client_free(c2);
    test_etcd_stop(&e);
}

/* The lease of the key at index i under prefix, in the order of creation
 * (0 when there is none). */
static long long nth_key_lease(test_etcd *e, const char *prefix, size_t i)
{
    json_t *j = range_under(e, prefix, ",\"sort_order\":\"ASCEND\",\"sort_target\":\"CREATE\""),
           *kv;
    long long lease = 0;

    kv = json_array_get(json_object_get(j, "kvs"), i);
    if (json_is_string(json_object_get(kv, "lease")))
        lease = atoll(json_string_value(json_object_get(kv, "lease")));
    json_decref(j);
    return lease;
}

/*
 * The waiters of one client queue their keys on one waiting lease
 * (etcd_session.c, issue 33), kept alive by one keepalive a period whatever
 * their number, as a concurrency.Session's keys share its lease: N waiters'
 * keys share a lease ID; over 3 s (the lease's TTL) etcd gets fewer
 * keepalives than waiters; one that gives up deletes its own key and the
 * others stay queued past the TTL; the lease revoked by hand wakes them,
 * they queue again on a new one, and each gets its lock.
 */
static void waiters_share_one_lease(void)
{
    enum { N = 10 };
    test_etcd e;
    dlock_client *holder_c, *waiter_c;
    dlock_lock *held[N + 1], *l;
    dlock_acquire_options o = test_opts(0, 20000, 0), give_up = test_opts(700, 6000, 0);
    test_acquirer a[N];
    pthread_t t[N];
    char name[N + 1][16], prefix[256], body[64];
    long long lease, ka;

    test_etcd_start(&e, 1, NULL);
    holder_c = open_client(&e);
    waiter_c = open_client(&e);
    for (int i = 0; i <= N; i++) {
        snprintf(name[i], sizeof(name[i]), "q%d", i);
        CHECK_RC(dlock_acquire(&held[i], holder_c, name[i], &o), DLOCK_OK);
    }
    for (int i = 0; i < N; i++) {
        test_acquirer_init(&a[i], waiter_c, name[i], test_opts(30000, 6000, 0));
        CHECK(pthread_create(&t[i], NULL, test_acquirer_main, &a[i]) == 0);
    }
    for (int i = 0; i < N; i++) {
        snprintf(prefix, sizeof(prefix), "dlock/%s/", name[i]);
        for (int k = 0; k < 500 && test_etcd_count(&e, prefix) < 2; k++)
            test_sleep_ms(10);
        CHECK(test_etcd_count(&e, prefix) == 2);
    }
    lease = nth_key_lease(&e, "dlock/q0/", 1);
    CHECK((lease & SESSION_BITS) == SESSION_BITS);
    for (int i = 1; i < N; i++) {
        snprintf(prefix, sizeof(prefix), "dlock/%s/", name[i]);
        CHECK(nth_key_lease(&e, prefix, 1) == lease);
    }

    /* A waiter that gives up (its wait ends) deletes its key alone. */
    CHECK_RC(dlock_acquire(&l, waiter_c, name[N], &give_up), DLOCK_ETIMEOUT);
    snprintf(prefix, sizeof(prefix), "dlock/%s/", name[N]);
    CHECK(test_etcd_count(&e, prefix) == 1);

    /* Past the waiting lease's TTL (3 s): the keys stay, on that lease,
     * kept alive by fewer keepalives than waiters (one each second). */
    ka = messages(&e, "LeaseKeepAlive");
    test_sleep_ms(3500);
    ka = messages(&e, "LeaseKeepAlive") - ka;
    fprintf(stderr, "%d waiters, 3.5 s: %lld keepalive messages\n", N, ka);
    CHECK(ka > 0 && ka < N);
    for (int i = 0; i < N; i++) {
        snprintf(prefix, sizeof(prefix), "dlock/%s/", name[i]);
        CHECK(test_etcd_count(&e, prefix) == 2);
        CHECK(nth_key_lease(&e, prefix, 1) == lease);
    }

    /* The waiting lease revoked by hand: its keys go; the waiters are woken
     * and queue again, on a new one. */
    snprintf(body, sizeof(body), "{\"ID\":\"%lld\"}", lease);
    free(test_etcd_post(&e, 0, "/v3/lease/revoke", body));
    for (int i = 0; i < N; i++) {
        long long now = 0;
        snprintf(prefix, sizeof(prefix), "dlock/%s/", name[i]);
        for (int k = 0; k < 500; k++) {
            now = nth_key_lease(&e, prefix, 1);
            if (now != 0 && now != lease)
                break;
            test_sleep_ms(10);
        }
        CHECK(now != 0 && now != lease && (now & SESSION_BITS) == SESSION_BITS);
    }
    for (int i = 0; i < N; i++)
        hand_over_and_release(held[i], &a[i], t[i]);
    CHECK_RC(dlock_release(held[N]), DLOCK_OK);
    dlock_client_free(holder_c);
    dlock_client_free(waiter_c);
    test_etcd_stop(&e);
}

/* ---- the asynchronous API on the loop's thread (etcd_async.c) ---------- */

/* Where the tries and releases were traced: on the loop's thread (the
 * test's), or on another (the engine's workers, which make blocking calls). */
typedef struct {
    pthread_t loop;
    atomic_int on_loop, elsewhere;
} traced_where;

static void trace_where(const dlock_trace_event *ev, void *payload)
{
    traced_where *w = payload;

    if (ev->phase != DLOCK_TRACE_END ||
        (strcmp(ev->call, "acquire") != 0 && strcmp(ev->call, "release") != 0))
        return;
    if (pthread_equal(pthread_self(), w->loop))
        w->on_loop++;
    else
        w->elsewhere++;
}

/* Run c's loop until o has its callback (10 s at most). */
static void async_wait(dlock_client *c, test_async_outcome *o)
{
    test_async_until(c, &o->calls, 1, 10000);
}

/* One cycle through the asynchronous API; rc of the acquisition. */
static int async_cycle(dlock_client *c, const char *name, dlock_acquire_options *o,
                       test_async_outcome *got)
{
    test_async_outcome done = {0};

    memset(got, 0, sizeof(*got));
    CHECK_RC(dlock_acquire_async(NULL, c, name, o, test_async_acquired, got), DLOCK_OK);
    async_wait(c, got);
    if (got->rc != DLOCK_OK)
        return got->rc;
    CHECK_RC(dlock_release_async(NULL, got->lock, test_async_done, &done), DLOCK_OK);
    async_wait(c, &done);
    CHECK_RC(done.rc, DLOCK_OK);
    return DLOCK_OK;
}

/*
 * Once the loop's connection is made, the asynchronous API's try that
 * never waits and its release are each one request sent and read on the
 * loop's thread: traced there, none on a worker, one Txn and one
 * DeleteRange a cycle, on a spare lease and on the session lease (auto
 * renewed). A busy try still tells the holder's lease left (a second
 * request, LeaseTimeToLive), from the loop's thread too. Over gRPC, over
 * TLS and over the JSON gateway (transport=gateway).
 */
static void on_the_loop(test_etcd *e, const char *url, const char *label)
{
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    traced_where w = {.loop = pthread_self()};
    dlock_client *c, *other;
    dlock_acquire_options plain = test_opts(0, 30000, 0), renewed = test_opts(0, 30000, 1);
    test_async_outcome got;
    dlock_lock *held, *l;
    long long txn, del, ka, ttl;
    const char *left;
    int cycles = 10;

    co.trace = trace_where;
    co.trace_payload = &w;
    CHECK_RC(dlock_client_open(&c, url, &co), DLOCK_OK);
    /* The first requests make the loop's connection (they themselves may
     * go to the workers meanwhile), and the leases: a spare granted ahead
     * of need, the session lease. */
    for (int i = 0; i < 4; i++) {
        CHECK_RC(async_cycle(c, "a", &plain, &got), DLOCK_OK);
        CHECK_RC(async_cycle(c, "a", &renewed, &got), DLOCK_OK);
    }

    /* Each round right after a blocking cycle on the same lease, as in a
     * steady cycle: a lease confirmed 500 ms ago or more needs a keepalive,
     * which the blocking call sends beside its txn, confirming the lease
     * for the tries after it (fresh_spare_needs_no_keepalive). */
    for (int round = 0; round < 2; round++) {
        dlock_acquire_options *o = round == 0 ? &plain : &renewed;
        CHECK_RC(dlock_acquire(&l, c, "a", o), DLOCK_OK); /* confirms the lease */
        CHECK_RC(dlock_release(l), DLOCK_OK);
        w.on_loop = w.elsewhere = 0;
        txn = method_count(e, "Txn");
        del = method_count(e, "DeleteRange");
        ka = method_count(e, "LeaseKeepAlive");
        for (int i = 0; i < cycles; i++)
            CHECK_RC(async_cycle(c, "a", o, &got), DLOCK_OK);
        txn = method_count(e, "Txn") - txn;
        del = method_count(e, "DeleteRange") - del;
        ka = method_count(e, "LeaseKeepAlive") - ka;
        fprintf(stderr, "%s, %s: %d async cycles: %d calls on the loop's thread, %d "
                "elsewhere; %lld Txn, %lld DeleteRange, %lld LeaseKeepAlive\n", label,
                round == 0 ? "spare lease" : "session lease", cycles, (int)w.on_loop,
                (int)w.elsewhere, txn, del, ka);
        /* Every release on the loop's thread, and every try but one whose
         * lease went 500 ms unconfirmed (a slow machine): a worker's try
         * then sends the keepalive beside its txn. */
        CHECK(w.on_loop + w.elsewhere == 2 * cycles);
        CHECK(w.on_loop >= cycles);
        CHECK(w.elsewhere <= ka);
        CHECK(txn == cycles);
        CHECK(del == cycles);
    }

    /* Busy: the try on the loop's thread, then the holder's lease left. */
    other = open_url(url);
    CHECK_RC(dlock_acquire(&held, other, "b", &plain), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "a", &plain), DLOCK_OK); /* confirms the spare */
    CHECK_RC(dlock_release(l), DLOCK_OK);
    w.on_loop = w.elsewhere = 0;
    ttl = method_count(e, "LeaseTimeToLive");
    ka = method_count(e, "LeaseKeepAlive");
    CHECK_RC(async_cycle(c, "b", &plain, &got), DLOCK_EBUSY);
    ttl = method_count(e, "LeaseTimeToLive") - ttl;
    ka = method_count(e, "LeaseKeepAlive") - ka;
    fprintf(stderr, "%s, busy: %s (%d on the loop's thread, %d elsewhere; %lld "
            "LeaseTimeToLive, %lld LeaseKeepAlive)\n", label, got.msg, (int)w.on_loop,
            (int)w.elsewhere, ttl, ka);
    CHECK(w.on_loop + w.elsewhere == 1);
    CHECK(w.elsewhere <= ka); /* as above */
    CHECK(ttl == 1);
    CHECK((left = strstr(got.msg, "lease left ")) != NULL);
    CHECK(atoll(left + strlen("lease left ")) > 20000);
    CHECK_RC(dlock_release(held), DLOCK_OK);
    CHECK_RC(async_cycle(c, "b", &plain, &got), DLOCK_OK);

    /* Many at once: the loop's requests side by side on its connections
     * (HTTP/2 streams; over the gateway a few connections, the rest
     * waiting for one), the workers taking what the loop does not. */
    {
        enum { MANY = 200 };
        test_async_outcome *all = calloc(MANY, sizeof(*all)), *rel = calloc(MANY, sizeof(*rel));
        int taken = 0, released = 0;
        CHECK(all != NULL && rel != NULL);
        for (int i = 0; i < MANY; i++) {
            char name[32];
            snprintf(name, sizeof(name), "many-%d", i);
            CHECK_RC(dlock_acquire_async(NULL, c, name, &plain, test_async_acquired, &all[i]),
                     DLOCK_OK);
        }
        for (int i = 0; i < MANY; i++) {
            async_wait(c, &all[i]);
            taken += all[i].rc == DLOCK_OK;
        }
        CHECK(test_etcd_count(e, "dlock/many-") == MANY);
        for (int i = 0; i < MANY; i++)
            if (all[i].rc == DLOCK_OK)
                CHECK_RC(dlock_release_async(NULL, all[i].lock, test_async_done, &rel[i]),
                         DLOCK_OK);
        for (int i = 0; i < MANY; i++) {
            if (all[i].rc == DLOCK_OK)
                async_wait(c, &rel[i]);
            released += all[i].rc == DLOCK_OK && rel[i].rc == DLOCK_OK;
        }
        fprintf(stderr, "%s, %d at once: %d taken, %d released\n", label, MANY, taken,
                released);
        CHECK(taken == MANY && released == MANY);
        CHECK(test_etcd_count(e, "dlock/many-") == 0);
        free(all);
        free(rel);
    }
    dlock_client_free(other);
    dlock_client_free(c);
}

static void async_on_the_loop(void)
{
    test_etcd e;
    char url[400];

    test_etcd_start(&e, 1, NULL);
    on_the_loop(&e, e.url, "gRPC");
    snprintf(url, sizeof(url), "etcd://127.0.0.1:%d?transport=gateway", e.client_port[0]);
    on_the_loop(&e, url, "gateway");
    test_etcd_stop(&e);
    test_etcd_start_tls(&e, 1);
    on_the_loop(&e, e.url, "TLS");
    test_etcd_stop(&e);
}

/* Until the client's spares stay as they are for 300 ms (at least one):
 * the spare thread grants nothing meanwhile. */
static void spares_steady(test_etcd *e)
{
    long long was = -1, now;

    for (int i = 0; i < 50; i++, was = now) {
        now = test_etcd_spares(e);
        if (now == was && now > 0)
            return;
        test_sleep_ms(300);
    }
    CHECK(!"the spares never settled");
}

/*
 * The replies of the loop's requests lost (the fault proxy holds etcd's
 * next answer past the command timeout). A try whose put etcd made but
 * whose reply never came: a worker tries again, finds the key on the lost
 * try's lease, which nothing renews, and fails the acquisition as not
 * known, the key given back, rather than take a lock whose key goes with
 * a lease it does not keep. A release whose delete's reply never came:
 * the worker's release finds the key gone, revokes the lease and says so.
 */
static void async_reply_lost(void)
{
    test_etcd e;
    chaos_proxy *px;
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    traced_where w = {.loop = pthread_self()};
    dlock_client *c;
    dlock_acquire_options o = test_opts(0, 20000, 0);
    test_async_outcome got, done = {0};
    char url[200];
    long long lease;
    dlock_lock *l;

    test_etcd_start(&e, 1, NULL);
    CHECK(chaos_proxy_start(&px, e.client_port[0]) == 0);
    snprintf(url, sizeof(url), "etcd://127.0.0.1:%d", chaos_proxy_port(px));
    co.connect_timeout_ms = 500;
    co.command_timeout_ms = 2500;
    co.trace = trace_where;
    co.trace_payload = &w;
    CHECK_RC(dlock_client_open(&c, url, &co), DLOCK_OK);
    /* The loop's connection, and the spares (spares_steady below). */
    for (int i = 0; i < 3; i++)
        CHECK_RC(async_cycle(c, "lost", &o, &got), DLOCK_OK);

    /* The try, right after a cycle that confirmed the spare: the loop's.
     * On a loaded machine the spare can be past its fresh twentieth or
     * being granted again when the try comes, and a worker makes it; then
     * the held reply goes by and the try is made again (three at most). */
    for (int attempt = 0;; attempt++) {
        spares_steady(&e);
        CHECK_RC(dlock_acquire(&l, c, "lost", &o), DLOCK_OK);
        CHECK_RC(dlock_release(l), DLOCK_OK);
        w.on_loop = w.elsewhere = 0;
        chaos_proxy_set(px, CHAOS_PROXY_DELAY_ONE_REPLY, 4000);
        memset(&got, 0, sizeof(got));
        CHECK_RC(dlock_acquire_async(NULL, c, "lost", &o, test_async_acquired, &got), DLOCK_OK);
        async_wait(c, &got);
        fprintf(stderr, "try, its reply lost: %s (%d calls on the loop's thread, %d elsewhere)\n",
                got.msg, (int)w.on_loop, (int)w.elsewhere);
        if (w.on_loop >= 1) { /* the try was the loop's */
            CHECK_RC(got.rc, DLOCK_ECONN);
            CHECK(got.lock == NULL);
            CHECK(test_etcd_count(&e, "dlock/lost/") == 0); /* given back */
        }
        test_sleep_ms(4500); /* the held reply goes by */
        if (got.lock != NULL)
            CHECK_RC(dlock_release(got.lock), DLOCK_OK);
        if (w.on_loop >= 1)
            break;
        CHECK(attempt < 2); /* three tries, none the loop's */
    }
    CHECK_RC(async_cycle(c, "lost", &o, &got), DLOCK_OK);

    /* The release. */
    for (int i = 0; i < 3; i++)
        CHECK_RC(async_cycle(c, "lost", &o, &got), DLOCK_OK);
    spares_steady(&e);
    CHECK_RC(dlock_acquire(&l, c, "lost", &o), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    memset(&got, 0, sizeof(got));
    CHECK_RC(dlock_acquire_async(NULL, c, "lost", &o, test_async_acquired, &got), DLOCK_OK);
    async_wait(c, &got);
    CHECK_RC(got.rc, DLOCK_OK);
    lease = key_lease(&e, "dlock/lost/");
    CHECK(lease & (1LL << 62)); /* a spare */
    w.on_loop = w.elsewhere = 0;
    chaos_proxy_set(px, CHAOS_PROXY_DELAY_ONE_REPLY, 4000);
    CHECK_RC(dlock_release_async(NULL, got.lock, test_async_done, &done), DLOCK_OK);
    async_wait(c, &done);
    fprintf(stderr, "release, its reply lost: rc %d (%d calls on the loop's thread, %d "
            "elsewhere)\n", done.rc, (int)w.on_loop, (int)w.elsewhere);
    CHECK(w.on_loop >= 1 && w.elsewhere >= 1); /* the loop's, then a worker's */
    CHECK_RC(done.rc, DLOCK_OK);
    CHECK(test_etcd_count(&e, "dlock/") == 0);
    CHECK(lease_ttl(&e, lease) == -1); /* revoked: it never goes back to the pool */
    dlock_client_free(c);
    chaos_proxy_stop(px);
    test_etcd_stop(&e);
}

TEST_MAIN({"codec", codec, NULL}, {"url_and_open_errors", url_and_open_errors, NULL},
          {"renewal_confirmed_on_old_server", renewal_confirmed_on_old_server, "watchdog"},
          {"leases_follow_the_lock", leases_follow_the_lock, NULL},
          {"session_lease_shared", session_lease_shared, "watchdog"},
          {"two_raft_writes_per_cycle", two_raft_writes_per_cycle, NULL},
          {"keys_reused_across_cycles", keys_reused_across_cycles, "watchdog"},
          {"on_lost_when_key_deleted", on_lost_when_key_deleted, "watchdog"},
          {"waiter_woken_by_release", waiter_woken_by_release, "watchdog"},
          {"release_wakes_one_waiter", release_wakes_one_waiter, "watchdog"},
          {"waiters_share_one_watch_stream", waiters_share_one_watch_stream, "watchdog"},
          {"waiters_share_one_lease", waiters_share_one_lease, "watchdog"},
          {"fair_lock_in_order", fair_lock_in_order, "watchdog"}, {"leader_election", leader_election, "watchdog"},
          {"status_fence_semantics", status_fence_semantics, NULL},
          {"multi_lock", multi_lock, NULL},
          {"auth_user_password", auth_user_password, "watchdog"},
          {"credentials_and_proxies", credentials_and_proxies, NULL},
          {"keepalive_stalled_is_lost_in_time", keepalive_stalled_is_lost_in_time, "watchdog"},
          {"release_reply_lost_revokes", release_reply_lost_revokes, NULL},
          {"reused_lease_counts_from_acquire", reused_lease_counts_from_acquire, NULL},
          {"fresh_spare_needs_no_keepalive", fresh_spare_needs_no_keepalive, NULL},
          {"waiter_promoted_onto_spare", waiter_promoted_onto_spare, NULL},
          {"woken_not_first_keeps_waiting", woken_not_first_keeps_waiting, NULL},
          {"gateway_transport", gateway_transport, "watchdog"},
          {"tls_with_client_certificate", tls_with_client_certificate, NULL},
          {"cluster_kill_member_while_holding", cluster_kill_member_while_holding, "watchdog"},
          {"cluster_kill_member_while_waiting", cluster_kill_member_while_waiting, "watchdog"},
          {"cluster_rw_writer_waits_through_kill", cluster_rw_writer_waits_through_kill, NULL},
          {"cluster_kill_leader", cluster_kill_leader, "watchdog"},
          {"cluster_restart_member", cluster_restart_member, NULL},
          {"cluster_stop_member", cluster_stop_member, "watchdog"},
          {"cluster_mutual_exclusion_leader_killed", cluster_mutual_exclusion_leader_killed, NULL},
          {"cli_run", cli_run, NULL},
          {"async_on_the_loop", async_on_the_loop, "watchdog"},
          {"async_reply_lost", async_reply_lost, NULL})
