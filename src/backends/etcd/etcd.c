/*
 * The etcd backend: etcd v3 through its JSON gateway, with a queue of keys
 * per lock like etcd's own concurrency.Mutex, and the holder's create
 * revision as the fence. docs/etcd.md tells the whole design; in short:
 *
 * Keys, for lock NAME and the default prefix "dlock/":
 *   dlock/NAME/<id>   one per acquisition (holder or waiter), <id> 16 hex
 *                     digits derived from the owner token; attached to the
 *                     acquisition's lease. NAME has '/', '%' and bytes
 *                     outside printable ASCII %-escaped, so no lock's
 *                     directory is a prefix of another's.
 * The holder is the key of the directory with the lowest create revision.
 * Revisions only grow, so the holder's create revision is a fence that is
 * strictly greater than every earlier holder's.
 *
 * One lease per acquisition, not one per client session as in etcd's
 * Mutex: dlock's leases, auto_renew and dlock_lock_extend are per lock, and
 * a lease shared by the client's locks would be kept alive by the renewals of
 * one lock on behalf of another whose holder stopped renewing it. The lease ID
 * is derived from the owner token and the TTL, so every call can name the key
 * and the lease of (name, owner) without keeping a table, and a retried grant
 * or put after a lost reply finds its own earlier work ("lease already
 * exists", "key exists") instead of doing it twice.
 *
 * Connections: callers take one from the pool; the watchdog has its own; each
 * waiting acquisition has a watch stream of its own (etcd_watch.c).
 */
#include <inttypes.h>
#include <poll.h>
#include <stdatomic.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/etcd/etcd_codec.h"
#include "backends/etcd/etcd_http.h"
#include "backends/etcd/etcd_watch.h"
#include "core/clock.h"
#include "core/error.h"

/* Lease IDs kept alive per keepalive request; the request body stays small
 * enough to reach the gateway in one piece (it stops reading the body once it
 * answers). */
#define KEEPALIVE_CHUNK 32
/* Key reads per renewal txn (etcd's default --max-txn-ops is 128). */
#define TXN_CHUNK 64
/* A waiter's key lives on a lease of this many seconds (or the holder's, if
 * shorter), kept alive every third of it while the waiter waits, and moved
 * to the holder's lease when it reaches the head of the queue: a waiter that
 * dies (SIGKILL, a lost machine) blocks the queue for this long, not for the
 * lease it asked for. etcd may round it up to its minimum TTL (1.5 x its
 * election timeout). */
#define WAIT_TTL_S 3

typedef struct {
    dlock__etcd *http;
    char *prefix;
    char *value;          /* what every lock key holds: the client name */
    dlock__etcd_conn *wd; /* the watchdog thread's alone */
} etcd_backend;

/* ---- names ------------------------------------------------------------- */

static uint64_t hex64(const char *s)
{
    uint64_t v = 0;

    for (int i = 0; i < 16 && s[i] != '\0'; i++) {
        char ch = s[i];
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : 0;
        v = v << 4 | (uint64_t)d;
    }
    return v;
}

/* splitmix64's finaliser: spreads the TTL over all bits. */
static uint64_t mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ x >> 31;
}

static int64_t positive(uint64_t v)
{
    v &= (uint64_t)INT64_MAX;
    return v != 0 ? (int64_t)v : 1;
}

/* etcd leases are whole seconds, at least 1: round up, so that the server
 * never lets a lease go before the client's deadline. */
static int64_t ttl_of(int64_t lease_ms)
{
    int64_t s = (lease_ms + 999) / 1000;
    return s > 0 ? s : 1;
}

static int64_t lease_for(const char *owner, int64_t ttl)
{
    return positive(hex64(owner) ^ mix(hex64(owner + 16) + (uint64_t)ttl));
}

typedef struct {
    char *dir;     /* prefix + escaped name + '/' */
    char *dir_end; /* end of the directory's key range */
    char *key;     /* dir + id: this owner's key */
    int64_t ttl;   /* seconds */
    int64_t lease;
    const char *value; /* what the key holds: the client name, or a leader's
                        * identity (borrowed) */
} lock_keys;

static void keys_free(lock_keys *k)
{
    free(k->dir);
    free(k->dir_end);
    free(k->key);
    memset(k, 0, sizeof(*k));
}

/* owner may be NULL (status, force release: the directory only). */
static int keys_make(lock_keys *k, const etcd_backend *be, const char *name, const char *owner,
                     int64_t lease_ms)
{
    memset(k, 0, sizeof(*k));
    k->value = be->value;
    k->dir = dlock__etcd_dir(be->prefix, name);
    k->dir_end = k->dir != NULL ? dlock__etcd_prefix_end(k->dir) : NULL;
    if (k->dir_end == NULL)
        goto oom;
    if (owner != NULL) {
        size_t n = strlen(k->dir) + 17;
        k->key = malloc(n);
        if (k->key == NULL)
            goto oom;
        snprintf(k->key, n, "%s%016" PRIx64, k->dir, (uint64_t)positive(hex64(owner)));
        k->ttl = ttl_of(lease_ms);
        k->lease = lease_for(owner, k->ttl);
    }
    return DLOCK_OK;
oom:
    keys_free(k);
    return dlock__fail(DLOCK_ENOMEM, "out of memory");
}

static int same_key(const dlock__etcd_kv *kv, const char *key)
{
    return kv->key != NULL && kv->key_len == strlen(key) && memcmp(kv->key, key, kv->key_len) == 0;
}

/* ---- requests ------------------------------------------------------------ */

static int bad_reply(etcd_backend *be, const char *what)
{
    return dlock__fail(DLOCK_EPROTO, "%s: unexpected reply to %s",
                       dlock__etcd_where(be->http, dlock__etcd_current(be->http)), what);
}

/* Run req (consumed) on path. */
static int call(etcd_backend *be, dlock__etcd_conn *c, const char *path, json_t *req,
                json_t **reply)
{
    int rc;

    *reply = NULL;
    if (req == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    rc = dlock__etcd_call(be->http, c, path, req, reply);
    json_decref(req);
    return rc;
}

/* Range requests, bare (for /v3/kv/range) or as a txn operation. */
static json_t *as_op(json_t *range)
{
    return range != NULL ? json_pack("{s:o}", "request_range", range) : NULL;
}

/* The first key of the directory by create revision: the holder. */
static json_t *range_first(const lock_keys *k)
{
    return json_pack("{s:o, s:o, s:s, s:s, s:I, s:b}", "key", dlock__etcd_str(k->dir),
                     "range_end", dlock__etcd_str(k->dir_end), "sort_order", "ASCEND",
                     "sort_target", "CREATE", "limit", (json_int_t)1, "keys_only", 1);
}

/* The key just ahead of create revision rev: the one to wait for. */
static json_t *range_ahead(const lock_keys *k, int64_t rev)
{
    return json_pack("{s:o, s:o, s:s, s:s, s:I, s:I, s:b}", "key", dlock__etcd_str(k->dir),
                     "range_end", dlock__etcd_str(k->dir_end), "sort_order", "DESCEND",
                     "sort_target", "CREATE", "max_create_revision", (json_int_t)(rev - 1),
                     "limit", (json_int_t)1, "keys_only", 1);
}

static json_t *range_key(const char *key)
{
    return json_pack("{s:o, s:b}", "key", dlock__etcd_str(key), "keys_only", 1);
}

/* Grant the lease; one that exists already is ours (a retry). */
static int grant(etcd_backend *be, dlock__etcd_conn *c, int64_t lease, int64_t ttl)
{
    json_t *reply;
    int rc;

    rc = call(be, c, "/v3/lease/grant",
              json_pack("{s:I, s:I}", "ID", (json_int_t)lease, "TTL", (json_int_t)ttl), &reply);
    json_decref(reply);
    if (rc == DLOCK_ESERVER && c->grpc_code == 9 && strstr(c->grpc_message, "exists") != NULL)
        return DLOCK_OK;
    return rc;
}

/* Revoke the lease, deleting what is attached. A lease already gone is fine. */
static int lease_revoke(etcd_backend *be, dlock__etcd_conn *c, int64_t lease)
{
    json_t *reply;
    int rc;

    rc = call(be, c, "/v3/lease/revoke", json_pack("{s:I}", "ID", (json_int_t)lease), &reply);
    json_decref(reply);
    if (rc == DLOCK_ESERVER && c->grpc_code == 5)
        return DLOCK_OK;
    return rc;
}

/* Lease left in ms: -1 for no lease (a key set by hand), 0 when expired. */
static int lease_left(etcd_backend *be, dlock__etcd_conn *c, int64_t lease, int64_t *left_ms)
{
    json_t *reply;
    int64_t ttl = 0;
    int rc;

    *left_ms = -1;
    if (lease == 0)
        return DLOCK_OK;
    rc = call(be, c, "/v3/lease/timetolive", json_pack("{s:I}", "ID", (json_int_t)lease), &reply);
    /* etcd's longest TTL is 9e9 s; one whose ms do not fit is not etcd's. */
    if (rc == DLOCK_OK && (dlock__etcd_int(reply, "TTL", &ttl) != 0 || ttl > INT64_MAX / 1000))
        rc = bad_reply(be, "lease timetolive");
    json_decref(reply);
    if (rc == DLOCK_ESERVER && c->grpc_code == 5) {
        *left_ms = 0;
        return DLOCK_OK;
    }
    if (rc == DLOCK_OK)
        *left_ms = ttl > 0 ? ttl * 1000 : 0;
    return rc;
}

/* Read the answers of a keepalive stream: alive[i] 1 for a lease renewed,
 * 0 for one gone (no TTL, or TTL 0), left as it was (-1) when unanswered. */
static int keepalive_results(etcd_backend *be, const json_t *results, const int64_t *ids,
                             size_t n, int *alive)
{
    for (size_t r = 0; r < json_array_size(results); r++) {
        const json_t *res = json_array_get(results, r);
        int64_t id = 0, ttl = 0;
        if (dlock__etcd_int(res, "ID", &id) != 0 || dlock__etcd_int(res, "TTL", &ttl) != 0)
            return bad_reply(be, "lease keepalive");
        for (size_t i = 0; i < n; i++)
            if (ids[i] == id && alive[i] < 0)
                alive[i] = ttl > 0;
    }
    return DLOCK_OK;
}

/*
 * Keep leases ids[0..n) alive: alive[i] is 1 when the server renewed it, 0
 * when it is gone (a reply without TTL, or TTL 0). The IDs go in chunks of
 * several requests per HTTP request; an ID whose answer is missing is asked
 * again on its own.
 */
static int keepalive(etcd_backend *be, dlock__etcd_conn *c, const int64_t *ids, size_t n,
                     int *alive)
{
    char *body = malloc(KEEPALIVE_CHUNK * 32 + 1);
    int rc = DLOCK_OK;

    if (body == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        alive[i] = -1;
    for (size_t from = 0; from < n && rc == DLOCK_OK;) {
        size_t to = from, len = 0;
        json_t *results = NULL;

        /* One by one for the IDs a batch left unanswered. */
        for (; to < n && to - from < KEEPALIVE_CHUNK; to++)
            len += (size_t)sprintf(body + len, "{\"ID\":\"%" PRId64 "\"}", ids[to]);
        rc = dlock__etcd_call_stream(be->http, c, "/v3/lease/keepalive", body, &results);
        if (rc == DLOCK_OK)
            rc = keepalive_results(be, results, ids + from, to - from, alive + from);
        json_decref(results);
        if (rc != DLOCK_OK)
            break;
        /* Unanswered IDs: again, alone. */
        for (size_t i = from; i < to && rc == DLOCK_OK; i++) {
            if (alive[i] >= 0)
                continue;
            if (to - from == 1) {
                rc = bad_reply(be, "lease keepalive (no answer for the lease)");
                break;
            }
            rc = keepalive(be, c, &ids[i], 1, &alive[i]);
        }
        from = to;
    }
    free(body);
    return rc;
}

/* ---- open / close ----------------------------------------------------- */

static void etcd_close(void *arg)
{
    etcd_backend *be = arg;

    if (be == NULL)
        return;
    dlock__etcd_conn_free(be->wd);
    dlock__etcd_free(be->http);
    free(be->prefix);
    free(be->value);
    free(be);
}

static int etcd_open(void **out, const dlock_url *url, const dlock_client_options *opts)
{
    etcd_backend *be;
    dlock__etcd_conn *c = NULL;
    json_t *reply = NULL;
    int rc;

    *out = NULL;
    be = calloc(1, sizeof(*be));
    if (be == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    be->prefix = strdup(opts->key_prefix != NULL ? opts->key_prefix : "dlock/");
    be->value = strdup(opts->client_name != NULL ? opts->client_name : "dlock");
    if (be->prefix == NULL || be->value == NULL) {
        rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
        goto err;
    }
    if ((rc = dlock__etcd_new(&be->http, url, opts)) != DLOCK_OK ||
        (rc = dlock__etcd_conn_new(be->http, &be->wd)) != DLOCK_OK ||
        (rc = dlock__etcd_connect(be->http)) != DLOCK_OK ||
        (rc = dlock__etcd_conn_get(be->http, &c)) != DLOCK_OK)
        goto err;
    /* Check now that an endpoint answers and lets us read our keys. */
    rc = call(be, c, "/v3/kv/range",
              json_pack("{s:o, s:b}", "key", dlock__etcd_str(be->prefix), "count_only", 1),
              &reply);
    json_decref(reply);
    dlock__etcd_conn_put(be->http, c);
    if (rc != DLOCK_OK)
        goto err;
    *out = be;
    return DLOCK_OK;

err:
    etcd_close(be);
    return rc;
}

/* ---- acquire ------------------------------------------------------------ */

/*
 * What a waiting acquisition keeps between its tries: its key and lease, its
 * place in the queue (the key's create revision), the key just ahead and the
 * stream watching it.
 */
typedef struct {
    lock_keys k; /* k.key is NULL until the first acquire through the watch;
                  * k.lease and k.ttl are the short lease the key waits on */
    int64_t hold_ttl;   /* the holder's lease (seconds), which the key moves */
    int64_t hold_lease; /* to at the head of the queue (promote) */
    int hold_granted;   /* hold_lease may exist and is not yet ours for good */
    char *name;
    int granted;           /* the lease exists, as far as we know */
    int64_t lease_ok_ms;   /* when the last grant or keepalive that succeeded was sent */
    int64_t keepalive_at;  /* next keepalive while waiting */
    int64_t myrev;         /* our key's create revision, 0 when not known */
    int won;               /* the last acquire through this watch took the lock */
    char *ahead;           /* the key to wait for, NULL when none */
    int64_t ahead_from;    /* watch it from this revision */
    dlock__etcd_stream *stream;
    int stream_failures;   /* in a row, for the back-off */
    int64_t stream_retry_at;
    char *value;           /* a leader's identity (k.value points here) */

    /* watch_wake from another thread (dlock_client_interrupt, an observer's
     * stop) sets woken and writes to wake_fd, which every sleep polls. An
     * election's observer is also woken by any change of the directory. */
    int observe;
    int wake_fd;
    atomic_int woken;
} etcd_watch;

/* The holder (first key) and our key's revision out of a txn reply. */
static int read_kv(etcd_backend *be, const json_t *range, dlock__etcd_kv *kv, const char *what)
{
    int found = dlock__etcd_kv_at(range, 0, kv);

    if (found < 0)
        return bad_reply(be, what);
    return found;
}

/*
 * Try once, for a caller that will not wait: take the lock only if the
 * directory is empty (no holder, nobody queued), so that a try never jumps
 * the queue and never leaves a key behind. The lease is granted first (the
 * put needs it) and revoked again when the lock is busy.
 */
static int try_once(etcd_backend *be, dlock__etcd_conn *c, const lock_keys *k, uint64_t *fence,
                    int64_t *retry_ms)
{
    json_t *reply;
    dlock__etcd_kv first;
    int rc, found;

    if ((rc = grant(be, c, k->lease, k->ttl)) != DLOCK_OK)
        return rc;
    rc = call(be, c, "/v3/kv/txn",
              json_pack("{s:[{s:o, s:o, s:s, s:s, s:I}], s:[{s:{s:o, s:o, s:I}}], s:[o]}",
                        "compare", "key", dlock__etcd_str(k->dir), "range_end",
                        dlock__etcd_str(k->dir_end), "target", "CREATE", "result", "EQUAL",
                        "create_revision", (json_int_t)0, "success", "request_put", "key",
                        dlock__etcd_str(k->key), "value", dlock__etcd_str(k->value), "lease",
                        (json_int_t)k->lease, "failure", as_op(range_first(k))),
              &reply);
    if (rc != DLOCK_OK)
        return rc;
    if (json_is_true(json_object_get(reply, "succeeded"))) {
        int64_t rev = dlock__etcd_revision(reply);
        json_decref(reply);
        if (rev <= 0)
            return bad_reply(be, "the acquire txn (no revision)");
        *fence = (uint64_t)rev;
        return DLOCK_OK;
    }
    found = read_kv(be, dlock__etcd_txn_op(reply, 0, "response_range"), &first, "the acquire txn");
    json_decref(reply);
    if (found < 0)
        return found;
    if (found == 1 && same_key(&first, k->key) && first.create_revision > 0) {
        /* Our own put, whose reply was lost before a retry. */
        *fence = (uint64_t)first.create_revision;
        free(first.key);
        return DLOCK_OK;
    }
    /* Busy (or emptied just now: found == 0, try again at once). */
    lease_revoke(be, c, k->lease);
    *retry_ms = 0;
    if (found == 1)
        lease_left(be, c, first.lease, retry_ms);
    free(first.key);
    return DLOCK_EBUSY;
}

/* Put our key at the end of the queue (or find it there, after a lost
 * reply): sets w->myrev and *first to the holder. */
static int enqueue(etcd_backend *be, dlock__etcd_conn *c, etcd_watch *w, dlock__etcd_kv *first)
{
    const lock_keys *k = &w->k;
    json_t *reply = NULL;
    dlock__etcd_kv mine;
    int rc, found;

    for (int attempt = 0;; attempt++) {
        rc = call(be, c, "/v3/kv/txn",
                  json_pack("{s:[{s:o, s:s, s:s, s:I}], s:[{s:{s:o, s:o, s:I}}, o], s:[o, o]}",
                            "compare", "key", dlock__etcd_str(k->key), "target", "CREATE",
                            "result", "EQUAL", "create_revision", (json_int_t)0, "success",
                            "request_put", "key", dlock__etcd_str(k->key), "value",
                            dlock__etcd_str(k->value), "lease", (json_int_t)k->lease,
                            as_op(range_first(k)), "failure", as_op(range_key(k->key)),
                            as_op(range_first(k))),
                  &reply);
        if (rc == DLOCK_ESERVER && c->grpc_code == 5 && attempt == 0) {
            /* "requested lease not found": it ran out while we were not
             * looking (a stall); a new one with the same ID. */
            w->granted = 0;
            int64_t sent = dlock__now_ms();
            if ((rc = grant(be, c, k->lease, k->ttl)) != DLOCK_OK)
                return rc;
            w->granted = 1;
            w->lease_ok_ms = sent;
            continue;
        }
        break;
    }
    if (rc != DLOCK_OK)
        return rc;
    if (json_is_true(json_object_get(reply, "succeeded"))) {
        w->myrev = dlock__etcd_revision(reply);
        found = read_kv(be, dlock__etcd_txn_op(reply, 1, "response_range"), first,
                        "the enqueue txn");
    } else {
        found = read_kv(be, dlock__etcd_txn_op(reply, 0, "response_range"), &mine,
                        "the enqueue txn");
        if (found == 1)
            w->myrev = mine.create_revision;
        free(mine.key);
        if (found == 1)
            found = read_kv(be, dlock__etcd_txn_op(reply, 1, "response_range"), first,
                            "the enqueue txn");
        else if (found == 0)
            found = bad_reply(be, "the enqueue txn (our key vanished)");
    }
    json_decref(reply);
    if (found < 0)
        return found;
    if (found == 0 || w->myrev <= 0) {
        free(first->key);
        first->key = NULL;
        return bad_reply(be, "the enqueue txn (empty queue after our put)");
    }
    return DLOCK_OK;
}

/*
 * Our key reached the head of the queue on the short lease it waited on:
 * move it to the holder's lease, granted now at its full length (after the
 * core noted the time of this try, so the server's lease outlasts the core's
 * deadline), keeping its create revision, which is the fence; then revoke
 * the short lease, which has nothing left on it, so that a release leaves no
 * lease behind. DLOCK_ELOST when the key went meanwhile (its short lease ran
 * out in a stall). Three raft writes on the way to the lock, paid only when
 * the holder's lease is longer than WAIT_TTL_S.
 */
static int promote(etcd_backend *be, dlock__etcd_conn *c, etcd_watch *w)
{
    const lock_keys *k = &w->k;
    json_t *reply = NULL;
    int rc, alive = 0;

    w->hold_granted = 1;
    rc = call(be, c, "/v3/lease/grant",
              json_pack("{s:I, s:I}", "ID", (json_int_t)w->hold_lease, "TTL",
                        (json_int_t)w->hold_ttl),
              &reply);
    json_decref(reply);
    reply = NULL;
    if (rc == DLOCK_ESERVER && c->grpc_code == 9 && strstr(c->grpc_message, "exists") != NULL) {
        /* Ours from an earlier try whose reply was lost: refresh it to its
         * full length. */
        rc = keepalive(be, c, &w->hold_lease, 1, &alive);
        if (rc == DLOCK_OK && !alive)
            rc = bad_reply(be, "lease keepalive (the lease just granted is gone)");
    }
    if (rc != DLOCK_OK)
        return rc;
    rc = call(be, c, "/v3/kv/txn",
              json_pack("{s:[{s:o, s:s, s:s, s:I}], s:[{s:{s:o, s:b, s:I}}]}", "compare", "key",
                        dlock__etcd_str(k->key), "target", "CREATE", "result", "EQUAL",
                        "create_revision", (json_int_t)w->myrev, "success", "request_put",
                        "key", dlock__etcd_str(k->key), "ignore_value", 1, "lease",
                        (json_int_t)w->hold_lease),
              &reply);
    if (rc == DLOCK_OK && !json_is_true(json_object_get(reply, "succeeded")))
        rc = DLOCK_ELOST;
    json_decref(reply);
    if (rc == DLOCK_ELOST) {
        lease_revoke(be, c, w->hold_lease); /* nothing is attached to it */
        w->hold_granted = 0;
    } else if (rc == DLOCK_OK && lease_revoke(be, c, k->lease) == DLOCK_OK) {
        w->granted = 0;
    }
    return rc;
}

/*
 * A try of a waiting acquisition. The lease is refreshed in it (granted on
 * the first try, kept alive on later ones), after the core noted the time it
 * sent this try: the server's lease then runs out no earlier than the
 * deadline the core computes. One txn reads, at one revision, that our key is
 * still there with the revision we queued at, which key holds the lock, and
 * which is just ahead of ours; on later tries it goes together with the
 * keepalive, and success needs both: the lease alive, and our key first. So
 * success is only reported while our key exists (etcd 3.4's own lock did not
 * check that after a wait).
 */
static int try_queued(etcd_backend *be, dlock__etcd_conn *c, etcd_watch *w, uint64_t *fence,
                      int64_t *retry_ms)
{
    const lock_keys *k = &w->k;
    dlock__etcd_kv first = {0}, ahead = {0};
    json_t *reply = NULL;
    int64_t sent = dlock__now_ms(), rev;
    int rc, found;

    if (w->granted && w->myrev > 0) {
        /* The keepalive and a read-only txn (no raft write), at once: one
         * round trip after the wake-up, not two. */
        char ka[48];
        json_t *txn = json_pack("{s:[{s:o, s:s, s:s, s:I}], s:[o, o]}", "compare", "key",
                                dlock__etcd_str(k->key), "target", "CREATE", "result", "EQUAL",
                                "create_revision", (json_int_t)w->myrev, "success",
                                as_op(range_first(k)), as_op(range_ahead(k, w->myrev)));
        char *body = txn != NULL ? json_dumps(txn, JSON_COMPACT) : NULL;
        dlock__etcd_pair p = {{"/v3/lease/keepalive", "/v3/kv/txn"}, {ka, body}, {1, 0},
                              {NULL, NULL}, {0, 0}, {0, 0}};
        int alive = -1;

        json_decref(txn);
        if (body == NULL)
            return dlock__fail(DLOCK_ENOMEM, "out of memory");
        snprintf(ka, sizeof(ka), "{\"ID\":\"%" PRId64 "\"}", k->lease);
        rc = dlock__etcd_call_pair(be->http, c, &p);
        free(body);
        if (rc == DLOCK_OK)
            rc = keepalive_results(be, p.out[0], &k->lease, 1, &alive);
        if (rc == DLOCK_OK && alive < 0)
            rc = bad_reply(be, "lease keepalive (no answer for the lease)");
        json_decref(p.out[0]);
        reply = p.out[1];
        if (rc != DLOCK_OK) {
            json_decref(reply);
            return rc;
        }
        if (alive)
            w->lease_ok_ms = sent;
        else
            w->granted = 0; /* the key went with the lease */
        w->keepalive_at = w->lease_ok_ms + k->ttl * 1000 / 3;
        if (!alive || !json_is_true(json_object_get(reply, "succeeded"))) {
            /* Our key is gone (lease ran out in a stall, or an
             * administrator broke it): queue again. */
            json_decref(reply);
            reply = NULL;
            w->myrev = 0;
        } else {
            found = read_kv(be, dlock__etcd_txn_op(reply, 0, "response_range"), &first,
                            "the acquire txn");
            if (found == 1)
                found = read_kv(be, dlock__etcd_txn_op(reply, 1, "response_range"), &ahead,
                                "the acquire txn");
            rev = dlock__etcd_revision(reply);
            json_decref(reply);
            if (found < 0) {
                free(first.key);
                return found;
            }
            goto decide;
        }
    } else if (w->granted) {
        int alive = 0;
        if ((rc = keepalive(be, c, &k->lease, 1, &alive)) != DLOCK_OK)
            return rc;
        if (alive)
            w->lease_ok_ms = sent;
        else
            w->granted = 0;
    }
    if (!w->granted) {
        if ((rc = grant(be, c, k->lease, k->ttl)) != DLOCK_OK)
            return rc;
        w->granted = 1;
        w->lease_ok_ms = sent;
        w->myrev = 0;
    }
    w->keepalive_at = w->lease_ok_ms + k->ttl * 1000 / 3;

    if ((rc = enqueue(be, c, w, &first)) != DLOCK_OK)
        return rc;
    if (first.create_revision != w->myrev) {
        /* Not first: find the key just ahead, to watch it. */
        rc = call(be, c, "/v3/kv/range", range_ahead(k, w->myrev), &reply);
        if (rc != DLOCK_OK) {
            free(first.key);
            return rc;
        }
        found = read_kv(be, reply, &ahead, "the range of the key ahead");
        rev = dlock__etcd_revision(reply);
        json_decref(reply);
        if (found < 0) {
            free(first.key);
            return found;
        }
    } else {
        rev = 0;
    }

decide:
    if (first.create_revision == w->myrev && same_key(&first, k->key)) {
        free(first.key);
        free(ahead.key);
        if (w->hold_lease != k->lease && (rc = promote(be, c, w)) != DLOCK_OK) {
            if (rc != DLOCK_ELOST)
                return rc;
            /* Our key is gone: queue again, at once. */
            w->myrev = 0;
            *retry_ms = 0;
            return DLOCK_EBUSY;
        }
        w->won = 1;
        *fence = (uint64_t)w->myrev;
        return DLOCK_OK;
    }
    free(first.key);
    free(w->ahead);
    w->ahead = NULL;
    if (ahead.key != NULL && strlen(ahead.key) == ahead.key_len) {
        /* The watch from the next revision on cannot miss its deletion. */
        w->ahead = ahead.key;
        w->ahead_from = rev + 1;
        *retry_ms = INT64_MAX;
    } else {
        /* The key ahead left between our reads: look again at once. */
        free(ahead.key);
        *retry_ms = 0;
    }
    return DLOCK_EBUSY;
}

/* value: what the key holds (NULL: the client name). */
static int acquire_as(etcd_backend *be, const char *name, const char *owner, int64_t lease_ms,
                      const char *value, etcd_watch *w, uint64_t *fence, int64_t *retry_ms)
{
    dlock__etcd_conn *c;
    lock_keys k;
    int rc = DLOCK_OK;

    if ((rc = dlock__etcd_conn_get(be->http, &c)) != DLOCK_OK)
        return rc;
    if (w == NULL) {
        if ((rc = keys_make(&k, be, name, owner, lease_ms)) == DLOCK_OK) {
            if (value != NULL)
                k.value = value;
            rc = try_once(be, c, &k, fence, retry_ms);
        }
        keys_free(&k);
    } else {
        if (w->k.key == NULL) {
            rc = keys_make(&w->k, be, name, owner, lease_ms);
            /* The key waits on a short lease of its own (WAIT_TTL_S). */
            w->hold_ttl = w->k.ttl;
            w->hold_lease = w->k.lease;
            if (rc == DLOCK_OK && w->k.ttl > WAIT_TTL_S) {
                w->k.ttl = WAIT_TTL_S;
                w->k.lease = lease_for(owner, WAIT_TTL_S);
            }
            if (rc == DLOCK_OK && value != NULL) {
                if ((w->value = strdup(value)) == NULL)
                    rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
                else
                    w->k.value = w->value;
            }
        }
        if (rc == DLOCK_OK)
            rc = try_queued(be, c, w, fence, retry_ms);
    }
    dlock__etcd_conn_put(be->http, c);
    return rc;
}

/* Every kind etcd serves (caps) is a queue of keys: the plain mutex, the
 * fair lock (the same queue), and an election, whose keys hold the
 * candidates' identities. */
static int etcd_acquire(void *be, const dlock_request *req, void *watch,
                        dlock_acquire_result *out)
{
    return acquire_as(be, req->name, req->token, req->lease_ms,
                      req->kind == DLOCK_KIND_LEADER ? req->identity : NULL, watch, &out->fence,
                      &out->retry_ms);
}

/* ---- release, extend, check --------------------------------------------- */

static int etcd_release(void *arg, const dlock_request *req)
{
    etcd_backend *be = arg;
    const char *name = req->name, *owner = req->token;
    dlock__etcd_conn *c;
    lock_keys k;
    json_t *reply = NULL;
    dlock__etcd_kv prev = {0};
    int64_t deleted = 0;
    int rc, found = 0;

    if ((rc = keys_make(&k, be, name, owner, 1)) != DLOCK_OK)
        return rc;
    if ((rc = dlock__etcd_conn_get(be->http, &c)) != DLOCK_OK) {
        keys_free(&k);
        return rc;
    }
    /* Our key exists only while it is ours: its name is this owner's alone,
     * and it goes when its lease does. */
    rc = call(be, c, "/v3/kv/deleterange",
              json_pack("{s:o, s:b}", "key", dlock__etcd_str(k.key), "prev_kv", 1), &reply);
    if (rc == DLOCK_OK &&
        (dlock__etcd_int(reply, "deleted", &deleted) != 0 ||
         (deleted > 0 && (found = dlock__etcd_kv_in(reply, "prev_kvs", 0, &prev)) != 1)))
        rc = bad_reply(be, "deleterange");
    json_decref(reply);
    if (rc == DLOCK_OK && deleted == 0)
        rc = DLOCK_ELOST;
    /* No lock of this acquisition remains: end its lease now rather than
     * let it run out. */
    if (rc == DLOCK_OK && prev.lease != 0)
        lease_revoke(be, c, prev.lease);
    free(prev.key);
    dlock__etcd_conn_put(be->http, c);
    keys_free(&k);
    return rc;
}

/* Our key, read: 1 present (*kv filled), 0 gone. */
static int read_own_key(etcd_backend *be, dlock__etcd_conn *c, const char *key, dlock__etcd_kv *kv)
{
    json_t *reply;
    int rc;

    rc = call(be, c, "/v3/kv/range", range_key(key), &reply);
    if (rc != DLOCK_OK)
        return rc;
    rc = read_kv(be, reply, kv, "range");
    json_decref(reply);
    return rc;
}

static int etcd_check(void *arg, const dlock_request *req)
{
    etcd_backend *be = arg;
    const char *name = req->name, *owner = req->token;
    dlock__etcd_conn *c;
    dlock__etcd_kv kv = {0};
    lock_keys k;
    int rc;

    if ((rc = keys_make(&k, be, name, owner, 1)) != DLOCK_OK)
        return rc;
    if ((rc = dlock__etcd_conn_get(be->http, &c)) == DLOCK_OK) {
        rc = read_own_key(be, c, k.key, &kv);
        rc = rc == 1 ? DLOCK_OK : rc == 0 ? DLOCK_ELOST : rc;
        dlock__etcd_conn_put(be->http, c);
    }
    free(kv.key);
    keys_free(&k);
    return rc;
}

/*
 * Move our key kv onto the lease k->lease, granted now for k->ttl: a put
 * keeps the key's create revision, so the fence and the place in the queue
 * stay. The old lease is revoked. DLOCK_ELOST if the key is no longer the
 * one we read.
 */
static int move_to_lease(etcd_backend *be, dlock__etcd_conn *c, const lock_keys *k,
                         const dlock__etcd_kv *kv)
{
    json_t *reply = NULL;
    int rc;

    rc = grant(be, c, k->lease, k->ttl);
    if (rc == DLOCK_OK)
        rc = call(be, c, "/v3/kv/txn",
                  json_pack("{s:[{s:o, s:s, s:s, s:I}], s:[{s:{s:o, s:b, s:I}}]}", "compare",
                            "key", dlock__etcd_str(k->key), "target", "CREATE", "result",
                            "EQUAL", "create_revision", (json_int_t)kv->create_revision,
                            "success", "request_put", "key", dlock__etcd_str(k->key),
                            "ignore_value", 1, "lease", (json_int_t)k->lease),
                  &reply);
    if (rc == DLOCK_OK && !json_is_true(json_object_get(reply, "succeeded"))) {
        rc = DLOCK_ELOST;
        lease_revoke(be, c, k->lease);
    } else if (rc == DLOCK_OK && kv->lease != 0) {
        lease_revoke(be, c, kv->lease);
    }
    json_decref(reply);
    return rc;
}

/*
 * A lease's TTL is fixed when it is granted. The same TTL: keep the lease
 * alive. Another: move the key onto the lease of that TTL.
 */
static int etcd_extend(void *arg, const dlock_request *req)
{
    etcd_backend *be = arg;
    const char *name = req->name, *owner = req->token;
    int64_t lease_ms = req->lease_ms;
    dlock__etcd_conn *c;
    dlock__etcd_kv kv = {0};
    lock_keys k;
    int rc, alive = 0;

    if ((rc = keys_make(&k, be, name, owner, lease_ms)) != DLOCK_OK)
        return rc;
    if ((rc = dlock__etcd_conn_get(be->http, &c)) != DLOCK_OK) {
        keys_free(&k);
        return rc;
    }
    rc = read_own_key(be, c, k.key, &kv);
    if (rc == 0) {
        rc = DLOCK_ELOST;
    } else if (rc == 1 && kv.lease == k.lease) {
        rc = keepalive(be, c, &k.lease, 1, &alive);
        if (rc == DLOCK_OK && !alive)
            rc = DLOCK_ELOST;
    } else if (rc == 1) {
        rc = move_to_lease(be, c, &k, &kv);
    }
    free(kv.key);
    dlock__etcd_conn_put(be->http, c);
    keys_free(&k);
    return rc;
}

/*
 * The watchdog's renewal: keep every lock's lease alive, then read every
 * lock's key in one txn, because a key can be deleted while its lease lives
 * (an administrator's force release). A lock is still ours when its key
 * exists on our lease, alive. A key on another lease is one an extend whose
 * reply was lost may have moved (to a lease nobody keeps alive, perhaps
 * shorter than ours): it is moved back onto the lease renewed here.
 */
static int etcd_renew(void *arg, dlock_renewal *items, size_t n)
{
    etcd_backend *be = arg;
    lock_keys *keys = calloc(n, sizeof(*keys));
    int64_t *ids = calloc(n, sizeof(*ids));
    int *alive = calloc(n, sizeof(*alive));
    int rc = DLOCK_OK;

    if (keys == NULL || ids == NULL || alive == NULL) {
        rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n && rc == DLOCK_OK; i++) {
        rc = keys_make(&keys[i], be, items[i].req->name, items[i].req->token,
                       items[i].req->lease_ms);
        ids[i] = keys[i].lease;
    }
    if (rc == DLOCK_OK)
        rc = keepalive(be, be->wd, ids, n, alive);
    for (size_t from = 0; from < n && rc == DLOCK_OK; from += TXN_CHUNK) {
        size_t to = from + TXN_CHUNK < n ? from + TXN_CHUNK : n;
        json_t *ops = json_array(), *reply = NULL;

        for (size_t i = from; ops != NULL && i < to; i++)
            if (json_array_append_new(ops, as_op(range_key(keys[i].key))) != 0) {
                json_decref(ops);
                ops = NULL;
            }
        if (ops == NULL) {
            rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
            break;
        }
        rc = call(be, be->wd, "/v3/kv/txn", json_pack("{s:o}", "success", ops), &reply);
        for (size_t i = from; rc == DLOCK_OK && i < to; i++) {
            dlock__etcd_kv kv;
            int found = dlock__etcd_kv_at(dlock__etcd_txn_op(reply, i - from, "response_range"),
                                          0, &kv);
            if (found < 0) {
                rc = bad_reply(be, "the renewal txn");
                break;
            }
            if (found != 1 || !same_key(&kv, keys[i].key))
                items[i].result = DLOCK_ELOST;
            else if (kv.lease == keys[i].lease)
                items[i].result = alive[i] == 1 ? DLOCK_OK : DLOCK_ELOST;
            else {
                int moved = move_to_lease(be, be->wd, &keys[i], &kv);
                if (moved == DLOCK_OK || moved == DLOCK_ELOST)
                    items[i].result = moved;
                else
                    rc = moved;
            }
            free(kv.key);
        }
        json_decref(reply);
    }
done:
    for (size_t i = 0; keys != NULL && i < n; i++)
        keys_free(&keys[i]);
    free(keys);
    free(ids);
    free(alive);
    return rc;
}

/* ---- status ---------------------------------------------------------------- */

/*
 * The holder is the first key of the directory; its create revision is the
 * fence. etcd keeps no counter per name: when nobody holds the lock, the
 * fence of the last holder is not known and 0 is reported (docs/etcd.md).
 */
static int read_holder(etcd_backend *be, dlock__etcd_conn *c, const lock_keys *k,
                       dlock_lock_info *out, dlock__etcd_kv *holder)
{
    json_t *reply;
    int rc, found;

    memset(out, 0, sizeof(*out));
    rc = call(be, c, "/v3/kv/range", range_first(k), &reply);
    if (rc != DLOCK_OK)
        return rc;
    found = read_kv(be, reply, holder, "range");
    json_decref(reply);
    if (found <= 0)
        return found;
    out->held = 1;
    out->fence = (uint64_t)holder->create_revision;
    if ((rc = lease_left(be, c, holder->lease, &out->ttl_ms)) != DLOCK_OK)
        return rc;
    return DLOCK_OK;
}

static int etcd_status(void *arg, const char *name, dlock_lock_info *out)
{
    etcd_backend *be = arg;
    dlock__etcd_conn *c;
    dlock__etcd_kv holder = {0};
    lock_keys k;
    int rc;

    if ((rc = keys_make(&k, be, name, NULL, 0)) != DLOCK_OK)
        return rc;
    if ((rc = dlock__etcd_conn_get(be->http, &c)) == DLOCK_OK) {
        rc = read_holder(be, c, &k, out, &holder);
        dlock__etcd_conn_put(be->http, c);
    }
    free(holder.key);
    keys_free(&k);
    return rc;
}

/* Delete the holder's key (if it is still the same key) and its lease. The
 * next in the queue, watching it, then holds the lock. */
static int etcd_force_release(void *arg, const char *name, dlock_lock_info *removed)
{
    etcd_backend *be = arg;
    dlock__etcd_conn *c;
    dlock__etcd_kv holder = {0};
    json_t *reply = NULL;
    lock_keys k;
    int rc;

    if ((rc = keys_make(&k, be, name, NULL, 0)) != DLOCK_OK)
        return rc;
    if ((rc = dlock__etcd_conn_get(be->http, &c)) != DLOCK_OK) {
        keys_free(&k);
        return rc;
    }
    rc = read_holder(be, c, &k, removed, &holder);
    if (rc == DLOCK_OK && removed->held) {
        rc = call(be, c, "/v3/kv/txn",
                  json_pack("{s:[{s:o, s:s, s:s, s:I}], s:[{s:{s:o}}]}", "compare", "key",
                            dlock__etcd_bytes(holder.key, holder.key_len), "target", "CREATE",
                            "result", "EQUAL", "create_revision",
                            (json_int_t)holder.create_revision, "success",
                            "request_delete_range", "key",
                            dlock__etcd_bytes(holder.key, holder.key_len)),
                  &reply);
        json_decref(reply);
        if (rc == DLOCK_OK && holder.lease != 0)
            lease_revoke(be, c, holder.lease);
    }
    dlock__etcd_conn_put(be->http, c);
    free(holder.key);
    keys_free(&k);
    return rc;
}

/* ---- waiting -------------------------------------------------------------- */

static int watch_new(const char *name, etcd_watch **out)
{
    etcd_watch *w = calloc(1, sizeof(*w));

    *out = NULL;
    if (w == NULL || (w->name = strdup(name)) == NULL) {
        free(w);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    w->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (w->wake_fd < 0) {
        free(w->name);
        free(w);
        return dlock__fail(DLOCK_ENOMEM, "cannot create an eventfd");
    }
    *out = w;
    return DLOCK_OK;
}

/* A watch_wake since the last look: consume it. */
static int take_wake(etcd_watch *w)
{
    uint64_t n;

    if (!atomic_exchange(&w->woken, 0))
        return 0;
    if (read(w->wake_fd, &n, sizeof(n)) < 0) {
        /* nothing pending: fine */
    }
    return 1;
}

static int etcd_watch_begin(void *arg, const dlock_request *req, void **watch)
{
    const char *name = req->name;

    (void)arg;
    /* Nothing to register yet: the first try queues our key, and the watch
     * of the key ahead starts from the revision that try read, so no
     * deletion after it can be missed. */
    return watch_new(name, (etcd_watch **)watch);
}

static void close_stream(etcd_watch *w)
{
    dlock__etcd_stream_close(w->stream);
    w->stream = NULL;
}

/* Sleep ms, or until watch_wake. */
static void sleep_ms(etcd_watch *w, int64_t ms)
{
    struct pollfd pfd = {w->wake_fd, POLLIN, 0};

    if (ms > 0)
        poll(&pfd, 1, ms > 1000000 ? 1000000 : (int)ms);
}

/*
 * Sleep until the key ahead is deleted (DLOCK_OK), watch_wake (DLOCK_OK) or
 * timeout_ms passes (DLOCK_ETIMEOUT). Meanwhile keep our own lease alive,
 * since our key holds our place; if it cannot be kept, return DLOCK_OK so
 * that the next try finds out (and queues again, or reports the connection
 * error). A broken stream is opened again, on the endpoint now in use, from
 * the same revision.
 */
static int observe_wait(etcd_backend *be, etcd_watch *w, int64_t end);

static int etcd_watch_wait(void *arg, void *watch, int64_t timeout_ms)
{
    etcd_backend *be = arg;
    etcd_watch *w = watch;
    int64_t now = dlock__now_ms();
    int64_t end = timeout_ms >= INT64_MAX - now ? INT64_MAX : now + timeout_ms;

    if (w->observe)
        return observe_wait(be, w, end);
    for (;;) {
        int64_t until;
        int state;

        if (take_wake(w))
            return DLOCK_OK;
        now = dlock__now_ms();
        if (now >= end)
            return DLOCK_ETIMEOUT;
        if (w->k.key == NULL || !w->granted) {
            sleep_ms(w, end - now < 1000 ? end - now : 1000);
            return DLOCK_ETIMEOUT;
        }
        if (now >= w->keepalive_at) {
            dlock__etcd_conn *c;
            int alive = 0, rc;
            if ((rc = dlock__etcd_conn_get(be->http, &c)) != DLOCK_OK)
                return rc;
            rc = keepalive(be, c, &w->k.lease, 1, &alive);
            dlock__etcd_conn_put(be->http, c);
            if (rc == DLOCK_OK && !alive) {
                w->granted = 0;
                close_stream(w);
                return DLOCK_OK;
            }
            if (rc == DLOCK_OK) {
                w->lease_ok_ms = now;
                w->keepalive_at = now + w->k.ttl * 1000 / 3;
            } else if (now >= w->lease_ok_ms + w->k.ttl * 1000) {
                close_stream(w);
                return DLOCK_OK;
            } else {
                w->keepalive_at = now + 200;
            }
            /* Calls went elsewhere: the stream's member may be the reason. */
            if (w->stream != NULL &&
                dlock__etcd_stream_endpoint(w->stream) != dlock__etcd_current(be->http))
                close_stream(w);
            continue;
        }
        until = end < w->keepalive_at ? end : w->keepalive_at;
        if (w->ahead == NULL) {
            sleep_ms(w, until - now);
            continue;
        }
        if (w->stream == NULL) {
            if (now < w->stream_retry_at) {
                sleep_ms(w, (until < w->stream_retry_at ? until : w->stream_retry_at) - now);
                continue;
            }
            if (dlock__etcd_stream_open(&w->stream, be->http, w->ahead, NULL, w->ahead_from) !=
                DLOCK_OK) {
                w->stream_retry_at = now + 100;
                continue;
            }
        }
        state = dlock__etcd_stream_wait(w->stream, until - now, w->wake_fd);
        if (state == DLOCK__ETCD_STREAM_DELETED || state == DLOCK__ETCD_STREAM_CANCELED) {
            close_stream(w);
            free(w->ahead);
            w->ahead = NULL;
            w->stream_failures = 0;
            return DLOCK_OK;
        }
        if (state == DLOCK__ETCD_STREAM_FAILED) {
            int64_t pause = 50LL << (w->stream_failures < 5 ? w->stream_failures : 5);
            dlock__etcd_endpoint_failed(be->http, dlock__etcd_stream_endpoint(w->stream));
            close_stream(w);
            w->stream_failures++;
            w->stream_retry_at = dlock__now_ms() + (pause < 1000 ? pause : 1000);
            /* Watches keep failing (a proxy that cuts streams ...): let the
             * caller look for itself, about once a second, rather than
             * sleep on a watch that may never work. */
            if (w->stream_failures >= 3)
                return DLOCK_OK;
        }
    }
}

/* Leave the queue unless the last try took the lock: revoking the lease
 * deletes our key with it (and the holder's lease, if a promote that failed
 * may have moved the key there). */
static void etcd_watch_end(void *arg, void *watch)
{
    etcd_backend *be = arg;
    etcd_watch *w = watch;
    dlock__etcd_conn *c;

    if (w == NULL)
        return;
    close_stream(w);
    if (!w->won && w->k.key != NULL && dlock__etcd_conn_get(be->http, &c) == DLOCK_OK) {
        char keep[512];
        snprintf(keep, sizeof(keep), "%s", dlock_error_message());
        lease_revoke(be, c, w->k.lease);
        if (w->hold_granted && w->hold_lease != w->k.lease)
            lease_revoke(be, c, w->hold_lease);
        dlock__fail(0, "%s", keep); /* the caller's message is the one to keep */
        dlock__etcd_conn_put(be->http, c);
    }
    if (w->wake_fd >= 0)
        close(w->wake_fd);
    keys_free(&w->k);
    free(w->ahead);
    free(w->value);
    free(w->name);
    free(w);
}

/* ---- leader election ------------------------------------------------------ */

/* The leader is the first key of the election's directory; its value is the
 * identity. */
static int etcd_leader_get(void *arg, const char *name, dlock_leader_info *out)
{
    etcd_backend *be = arg;
    dlock__etcd_conn *c;
    dlock__etcd_kv first = {0};
    json_t *reply = NULL, *req;
    lock_keys k;
    int rc, found = 0;

    memset(out, 0, sizeof(*out));
    if ((rc = keys_make(&k, be, name, NULL, 0)) != DLOCK_OK)
        return rc;
    if ((rc = dlock__etcd_conn_get(be->http, &c)) != DLOCK_OK) {
        keys_free(&k);
        return rc;
    }
    req = range_first(&k);
    if (req != NULL)
        json_object_del(req, "keys_only");
    rc = call(be, c, "/v3/kv/range", req, &reply);
    if (rc == DLOCK_OK && (found = read_kv(be, reply, &first, "range")) < 0)
        rc = found;
    if (rc == DLOCK_OK && found == 1) {
        char *value = NULL;
        size_t len = 0;
        out->held = 1;
        out->fence = (uint64_t)first.create_revision;
        if (dlock__etcd_kv_value_at(reply, 0, &value, &len) != 0) {
            rc = bad_reply(be, "range (value)");
        } else {
            if (len > DLOCK_IDENTITY_MAX)
                len = DLOCK_IDENTITY_MAX;
            memcpy(out->identity, value, len);
            out->identity[len] = '\0';
            rc = lease_left(be, c, first.lease, &out->ttl_ms);
        }
        free(value);
    }
    json_decref(reply);
    free(first.key);
    dlock__etcd_conn_put(be->http, c);
    keys_free(&k);
    if (rc != DLOCK_OK)
        memset(out, 0, sizeof(*out));
    return rc;
}

/* An observer watches the whole directory: every campaigner's key coming
 * and going, the leader's included, also when its lease runs out. From the
 * revision read here on, so no change after observe_begin returns is
 * missed. */
static int etcd_observe_begin(void *arg, const char *name, void **watch)
{
    etcd_backend *be = arg;
    dlock__etcd_conn *c;
    json_t *reply = NULL;
    etcd_watch *w;
    int rc;

    *watch = NULL;
    if ((rc = watch_new(name, &w)) != DLOCK_OK)
        return rc;
    w->observe = 1;
    if ((rc = keys_make(&w->k, be, name, NULL, 0)) != DLOCK_OK ||
        (rc = dlock__etcd_conn_get(be->http, &c)) != DLOCK_OK)
        goto err;
    rc = call(be, c, "/v3/kv/range",
              json_pack("{s:o, s:o, s:b}", "key", dlock__etcd_str(w->k.dir), "range_end",
                        dlock__etcd_str(w->k.dir_end), "count_only", 1),
              &reply);
    dlock__etcd_conn_put(be->http, c);
    if (rc == DLOCK_OK)
        w->ahead_from = dlock__etcd_revision(reply) + 1;
    json_decref(reply);
    if (rc != DLOCK_OK)
        goto err;
    *watch = w;
    return DLOCK_OK;
err:
    etcd_watch_end(be, w);
    return rc;
}

static void etcd_watch_wake(void *arg, void *watch)
{
    etcd_watch *w = watch;
    uint64_t one = 1;

    (void)arg;
    atomic_store(&w->woken, 1);
    if (w->wake_fd >= 0 && write(w->wake_fd, &one, sizeof(one)) < 0) {
        /* the counter is full: a wake-up is pending anyway */
    }
}

/*
 * An observer's sleep: until something in the directory changes (DLOCK_OK),
 * watch_wake, or end (DLOCK_ETIMEOUT). The stream stays open between sleeps;
 * a broken one is opened again, on the endpoint in use, from the revision
 * after the last change it reported.
 */
static int observe_wait(etcd_backend *be, etcd_watch *w, int64_t end)
{
    for (;;) {
        int64_t now = dlock__now_ms();
        int state;

        if (take_wake(w))
            return DLOCK_OK;
        if (now >= end)
            return DLOCK_ETIMEOUT;
        if (w->stream == NULL) {
            struct pollfd pfd = {w->wake_fd, POLLIN, 0};
            if (now < w->stream_retry_at) {
                int64_t until = end < w->stream_retry_at ? end : w->stream_retry_at;
                poll(&pfd, 1, (int)(until - now));
                continue;
            }
            if (dlock__etcd_stream_open(&w->stream, be->http, w->k.dir, w->k.dir_end,
                                        w->ahead_from) != DLOCK_OK) {
                w->stream_retry_at = now + 100;
                continue;
            }
        }
        state = dlock__etcd_stream_wait(w->stream, end - now > 1000000 ? 1000000 : end - now,
                                        w->wake_fd);
        w->ahead_from = dlock__etcd_stream_next_rev(w->stream);
        if (state == DLOCK__ETCD_STREAM_DELETED) {
            dlock__etcd_stream_rearm(w->stream);
            w->stream_failures = 0;
            return DLOCK_OK;
        }
        if (state == DLOCK__ETCD_STREAM_CANCELED) {
            /* Compacted past our revision: the next read is the news. */
            close_stream(w);
            return DLOCK_OK;
        }
        if (state == DLOCK__ETCD_STREAM_FAILED) {
            int64_t pause = 50LL << (w->stream_failures < 5 ? w->stream_failures : 5);
            dlock__etcd_endpoint_failed(be->http, dlock__etcd_stream_endpoint(w->stream));
            close_stream(w);
            w->stream_failures++;
            w->stream_retry_at = dlock__now_ms() + (pause < 1000 ? pause : 1000);
        }
    }
}

static const char *const etcd_schemes[] = {"etcd", "etcds", NULL};

/* Designated: the calls this backend leaves out (downgrade, permits, atomic
 * multi-locks) stay NULL, and the core answers them with DLOCK_ENOTSUP or
 * does without them. */
const dlock_backend dlock__etcd_backend = {
    .version = DLOCK_BACKEND_VERSION,
    .size = sizeof(dlock_backend),
    .name = "etcd",
    .schemes = etcd_schemes,
    /* Owner ids, read-write locks and semaphores are not implemented on
     * etcd (docs/etcd.md); a fair lock is the plain queue. */
    .caps = DLOCK_CAP_KIND(DLOCK_KIND_MUTEX) | DLOCK_CAP_KIND(DLOCK_KIND_FAIR) |
            DLOCK_CAP_KIND(DLOCK_KIND_LEADER),
    .open = etcd_open,
    .close = etcd_close,
    .acquire = etcd_acquire,
    .release = etcd_release,
    .extend = etcd_extend,
    .check = etcd_check,
    .renew = etcd_renew,
    .watch_begin = etcd_watch_begin,
    .watch_wait = etcd_watch_wait,
    .watch_end = etcd_watch_end,
    .watch_wake = etcd_watch_wake,
    .status = etcd_status,
    .force_release = etcd_force_release,
    .leader_get = etcd_leader_get,
    .observe_begin = etcd_observe_begin,
};
