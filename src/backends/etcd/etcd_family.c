/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The read-write lock and the semaphore on etcd: the same queue of keys as
 * the mutex (one key per acquisition under NAME/, ordered by create
 * revision, each on its acquisition's lease), with the kind in the key's
 * value, "=r ", "=w " or "=s " before the client name (which never starts
 * with '='), so that a downgrade can change it in place, keeping the key's
 * create revision: its fence and its place.
 *
 *   writer     holds when its key is first (the mutex's rule: it waits for
 *              every key ahead, readers included);
 *   reader     holds when no writer's key is ahead of its own: a writer
 *              that queued holds back every reader that comes after it
 *              (writer preference, as on Redis), and waits for the readers
 *              ahead of it;
 *   semaphore  holds when fewer than N keys are ahead of its own. N is the
 *              key NAME/permits, outside the queue's range (etcd_keys.c),
 *              on a lease of a day (or 10 leases), set by the first
 *              acquisition or by dlock_semaphore_set_permits; the stored N
 *              wins over the options', as on Redis.
 *
 * A waiting reader watches the last writer ahead of it (its deletion, or
 * its downgrade to a reader); a waiting permit holder watches the whole
 * directory, N included, since any key ahead going lets it in. Every
 * decision is made from one read at one revision, and the watch starts at
 * the next revision, so no change between the read and the watch is
 * missed.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/etcd/etcd_int.h"
#include "core/error.h"

/* A semaphore's N is kept this long after it was last set (or 10 leases). */
#define PERMITS_TTL_S 86400

int dlock__etcd_shared_kind(int kind)
{
    return kind == DLOCK_KIND_READ || kind == DLOCK_KIND_SEMAPHORE;
}

int dlock__etcd_value_kind(const char *value, size_t len, size_t *rest)
{
    *rest = 0;
    if (len < 3 || value[0] != '=' || value[2] != ' ')
        return DLOCK_KIND_MUTEX;
    *rest = 3;
    switch (value[1]) {
    case 'r':
        return DLOCK_KIND_READ;
    case 'w':
        return DLOCK_KIND_WRITE;
    case 's':
        return DLOCK_KIND_SEMAPHORE;
    default:
        *rest = 0;
        return DLOCK_KIND_MUTEX;
    }
}

/* The owner id a reader's value ends with ("=r CLIENT HOLDER\nOWNER-ID";
 * a holder record is printable ASCII, so the newline is not in it), or
 * NULL. */
const char *dlock__etcd_value_owner(const char *v, size_t len, size_t *olen)
{
    const char *nl = memchr(v, '\n', len);

    if (nl == NULL)
        return NULL;
    *olen = len - (size_t)(nl + 1 - v);
    return nl + 1;
}

static char *permits_key(const dlock__etcd_keys *k)
{
    char *key = NULL;

    if (asprintf(&key, "%spermits", k->dir) < 0)
        return NULL;
    return key;
}

/* The range of one key with its value. */
static json_t *range_value(const char *key)
{
    return json_pack("{s:o}", "key", dlock__etcd_str(key));
}

/* The error for a semaphore without N, naming it (its directory, without
 * the '/'). */
static int no_permits(const dlock__etcd_keys *k)
{
    return dlock__fail(DLOCK_EINVAL,
                       "semaphore '%.*s' has no number of permits yet: give options.permits (or "
                       "call dlock_semaphore_set_permits)",
                       (int)strlen(k->dir) - 1, k->dir);
}

json_t *dlock__etcd_look_ops(const dlock__etcd_keys *k, int64_t rev)
{
    char *pk = permits_key(k);
    json_t *ahead, *ops;

    if (pk == NULL)
        return NULL;
    ahead = json_pack("{s:o, s:o, s:s, s:s}", "key", dlock__etcd_str(k->dir), "range_end",
                      dlock__etcd_str(k->dir_end), "sort_order", "ASCEND", "sort_target",
                      "CREATE");
    if (ahead != NULL && rev > 0)
        json_object_set_new(ahead, "max_create_revision", json_integer(rev - 1));
    ops = json_pack("[o, o]", dlock__etcd_as_op(ahead), dlock__etcd_as_op(range_value(pk)));
    free(pk);
    return ops;
}

/* N from the permits key's range reply: 0 when none is stored. */
static int stored_permits(const json_t *range)
{
    char *v = NULL;
    size_t len = 0;
    int n = 0;
    dlock__etcd_kv kv;

    if (dlock__etcd_kv_at(range, 0, &kv) != 1)
        return 0;
    free(kv.key);
    if (dlock__etcd_kv_value_at(range, 0, &v, &len) == 0)
        n = atoi(v);
    free(v);
    return n > 0 ? n : 0;
}

int dlock__etcd_look_decide(dlock__etcd_be *be, dlock__etcd_watch *w, const json_t *reply,
                            size_t at, int64_t myrev)
{
    const json_t *range = dlock__etcd_txn_op(reply, at, "response_range");
    int n = stored_permits(dlock__etcd_txn_op(reply, at + 1, "response_range"));
    int64_t rev = dlock__etcd_revision(reply);
    dlock__etcd_kv writer = {0};
    size_t ahead = 0;

    free(w->ahead);
    free(w->ahead_end);
    w->ahead = w->ahead_end = NULL;
    for (size_t i = 0;; i++) {
        dlock__etcd_kv kv;
        char *v = NULL;
        size_t len = 0, rest;
        int found = dlock__etcd_kv_at(range, i, &kv);

        if (found < 0) {
            free(writer.key);
            return dlock__etcd_bad_reply(be, "the range of the keys ahead");
        }
        if (found == 0)
            break;
        if (kv.create_revision >= myrev) {
            free(kv.key);
            continue;
        }
        ahead++;
        /* Any kind but a reader's keeps a reader out. (A nested read of an
         * owner id never queues: etcd_owner.c.) */
        if (w->kind == DLOCK_KIND_READ && dlock__etcd_kv_value_at(range, i, &v, &len) == 0 &&
            dlock__etcd_value_kind(v, len, &rest) != DLOCK_KIND_READ) {
            free(writer.key);
            writer = kv;
            kv.key = NULL;
        }
        free(v);
        free(kv.key);
    }
    if (w->kind == DLOCK_KIND_SEMAPHORE) {
        if (n == 0)
            n = w->permits; /* N ran out (a day unused) while we waited */
        if (n <= 0)
            return no_permits(&w->k);
        if (ahead < (size_t)n)
            return 1;
        /* Any key ahead going, or N raised, may let us in. */
        w->ahead = strdup(w->k.dir);
        w->ahead_end = strdup(w->k.dir_all);
    } else {
        if (writer.key == NULL)
            return 1;
        /* Its deletion, or its downgrade to a reader (a put of the key). */
        if (strlen(writer.key) == writer.key_len) {
            w->ahead = writer.key;
            w->ahead_end = dlock__etcd_prefix_end(writer.key);
            writer.key = NULL;
        }
        free(writer.key);
    }
    if (w->ahead != NULL && w->ahead_end == NULL) {
        free(w->ahead);
        w->ahead = NULL;
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    w->ahead_from = rev + 1;
    return 0;
}

/* ---- a semaphore's N ------------------------------------------------------ */

/* Put N on a lease of its own (a day, or 10 leases if longer); only_new:
 * only if none is stored. The lease of the N it replaces is revoked. */
static int store_permits(dlock__etcd_be *be, dlock__etcd_conn *c, const dlock__etcd_keys *k,
                         int permits, int only_new)
{
    char *pk = permits_key(k), num[16];
    json_t *reply = NULL, *put;
    int64_t lease = 0, ttl = k->ttl * 10 > PERMITS_TTL_S ? k->ttl * 10 : PERMITS_TTL_S;
    int64_t prev_lease = 0;
    int rc;

    if (pk == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    rc = dlock__etcd_be_call(be, c, "/v3/lease/grant",
                             json_pack("{s:I, s:I}", "ID", (json_int_t)0, "TTL", (json_int_t)ttl),
                             &reply);
    if (rc == DLOCK_OK && (dlock__etcd_int(reply, "ID", &lease) != 0 || lease == 0))
        rc = dlock__etcd_bad_reply(be, "lease grant (no ID)");
    json_decref(reply);
    reply = NULL;
    if (rc != DLOCK_OK) {
        free(pk);
        return rc;
    }
    snprintf(num, sizeof(num), "%d", permits);
    put = json_pack("{s:o, s:o, s:I, s:b}", "key", dlock__etcd_str(pk), "value",
                    dlock__etcd_str(num), "lease", (json_int_t)lease, "prev_kv", 1);
    if (only_new)
        rc = dlock__etcd_be_call(
            be, c, "/v3/kv/txn",
            json_pack("{s:[{s:o, s:s, s:s, s:I}], s:[{s:o}]}", "compare", "key",
                      dlock__etcd_str(pk), "target", "CREATE", "result", "EQUAL",
                      "create_revision", (json_int_t)0, "success", "request_put", put),
            &reply);
    else
        rc = dlock__etcd_be_call(be, c, "/v3/kv/put", put, &reply);
    if (rc == DLOCK_OK && only_new && !json_is_true(json_object_get(reply, "succeeded")))
        dlock__etcd_lease_revoke(be, c, lease); /* another set it first: it wins */
    else if (rc == DLOCK_OK && !only_new &&
             dlock__etcd_int(json_object_get(reply, "prev_kv"), "lease", &prev_lease) == 0 &&
             prev_lease != 0 && prev_lease != lease)
        dlock__etcd_lease_revoke(be, c, prev_lease);
    json_decref(reply);
    free(pk);
    return rc;
}

int dlock__etcd_permits_ensure(dlock__etcd_be *be, dlock__etcd_conn *c, const dlock__etcd_keys *k,
                               int permits)
{
    char *pk = permits_key(k);
    json_t *reply = NULL;
    int rc;

    if (pk == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    rc = dlock__etcd_be_call(be, c, "/v3/kv/range", range_value(pk), &reply);
    free(pk);
    if (rc != DLOCK_OK)
        return rc;
    rc = stored_permits(reply) > 0 ? 1 : 0;
    json_decref(reply);
    if (rc == 1)
        return DLOCK_OK;
    if (permits <= 0)
        return no_permits(k);
    return store_permits(be, c, k, permits, 1);
}

int dlock__etcd_set_permits(void *arg, const char *name, int permits)
{
    dlock__etcd_be *be = arg;
    dlock__etcd_conn *c;
    dlock__etcd_keys k;
    int rc;

    if ((rc = dlock__etcd_keys_make(&k, be, name, NULL, 0)) != DLOCK_OK)
        return rc;
    if ((rc = dlock__etcd_conn_get(be->http, &c)) == DLOCK_OK) {
        rc = store_permits(be, c, &k, permits, 0);
        dlock__etcd_conn_put(be->http, c);
    }
    dlock__etcd_keys_free(&k);
    return rc;
}

/* ---- a try that will not wait ------------------------------------------------ */

/*
 * Read the queue and N; when they keep us out, busy, with nothing written.
 * Else queue our key and read, in the same txn and so at the same
 * revision, the keys of the queue and N again; keep the key if it holds,
 * else revoke its lease, which takes the key with it: a busy try leaves
 * nothing behind. The key may be seen by others for the moment it exists;
 * it is behind all of them, so it can only keep out a try that comes after
 * it, never let anyone in.
 */
int dlock__etcd_try_shared(dlock__etcd_be *be, dlock__etcd_conn *c, const dlock__etcd_keys *k,
                           int kind, const char *owner, uint64_t *fence, int64_t *retry_ms)
{
    dlock__etcd_watch w;
    json_t *reply = NULL, *put, *look, *ops;
    int64_t myrev = 0;
    int rc, held;

    memset(&w, 0, sizeof(w));
    w.kind = kind;
    w.k = *k;
    *retry_ms = -1;
    /* First a read: when the queue as it is already keeps us out, the try
     * is busy without a write, and no key of ours ever shows. */
    rc = dlock__etcd_be_call(be, c, "/v3/kv/txn",
                             json_pack("{s:o}", "success", dlock__etcd_look_ops(k, 0)), &reply);
    if (rc != DLOCK_OK)
        return rc;
    held = dlock__etcd_look_decide(be, &w, reply, 0, INT64_MAX);
    json_decref(reply);
    reply = NULL;
    free(w.ahead);
    free(w.ahead_end);
    w.ahead = w.ahead_end = NULL;
    if (held != 1)
        return held < 0 ? held : DLOCK_EBUSY;
    if ((rc = dlock__etcd_grant(be, c, k->lease, k->ttl)) != DLOCK_OK)
        return rc;
    put = json_pack("{s:{s:o, s:o, s:I}}", "request_put", "key", dlock__etcd_str(k->key),
                    "value", dlock__etcd_str(k->value), "lease", (json_int_t)k->lease);
    look = dlock__etcd_look_ops(k, 0);
    ops = json_pack("[o]", put);
    if (ops == NULL || look == NULL || json_array_extend(ops, look) != 0) {
        json_decref(ops);
        json_decref(look);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    /* The failure side (our key exists: a retry after a lost reply) reads
     * our key first, then the same. */
    json_array_insert_new(look, 0, dlock__etcd_as_op(dlock__etcd_range_key(k->key)));
    rc = dlock__etcd_be_call(
        be, c, "/v3/kv/txn",
        json_pack("{s:[{s:o, s:s, s:s, s:I}], s:o, s:o}", "compare", "key",
                  dlock__etcd_str(k->key), "target", "CREATE", "result", "EQUAL",
                  "create_revision", (json_int_t)0, "success", ops, "failure", look),
        &reply);
    if (rc != DLOCK_OK)
        return rc;
    if (json_is_true(json_object_get(reply, "succeeded"))) {
        myrev = dlock__etcd_revision(reply);
    } else {
        dlock__etcd_kv mine;
        if (dlock__etcd_kv_at(dlock__etcd_txn_op(reply, 0, "response_range"), 0, &mine) == 1) {
            myrev = mine.create_revision;
            free(mine.key);
        }
    }
    if (myrev <= 0) {
        json_decref(reply);
        dlock__etcd_lease_revoke(be, c, k->lease);
        return dlock__etcd_bad_reply(be, "the acquire txn (no revision)");
    }
    held = dlock__etcd_look_decide(be, &w, reply, 1, myrev);
    json_decref(reply);
    free(w.ahead);
    free(w.ahead_end);
    if (held == 1) {
        *fence = (uint64_t)myrev;
        return dlock__etcd_held_set(be, owner, k->lease, k->ttl);
    }
    dlock__etcd_lease_revoke(be, c, k->lease);
    return held < 0 ? held : DLOCK_EBUSY;
}

/* ---- downgrade ------------------------------------------------------------ */

/* The writer's key becomes a reader's, in place: one put guarded by the
 * key's create and mod revisions, keeping its lease (and so its create
 * revision, the fence, and its place ahead of every waiter). */
int dlock__etcd_downgrade(void *arg, const dlock_request *req)
{
    dlock__etcd_be *be = arg;
    dlock__etcd_conn *c;
    dlock__etcd_keys k;
    dlock__etcd_kv kv = {0};
    json_t *reply = NULL;
    char *v = NULL;
    size_t len = 0, rest;
    int rc, found;

    if ((rc = dlock__etcd_keys_make(&k, be, req->name, req->token, req->lease_ms)) != DLOCK_OK)
        return rc;
    if ((rc = dlock__etcd_conn_get(be->http, &c)) != DLOCK_OK) {
        dlock__etcd_keys_free(&k);
        return rc;
    }
    rc = dlock__etcd_be_call(be, c, "/v3/kv/range",
                             json_pack("{s:o}", "key", dlock__etcd_str(k.key)), &reply);
    found = rc == DLOCK_OK ? dlock__etcd_read_kv(be, reply, &kv, "range") : rc;
    if (found == 1 && dlock__etcd_kv_value_at(reply, 0, &v, &len) != 0)
        found = dlock__fail(DLOCK_ENOMEM, "out of memory");
    json_decref(reply);
    reply = NULL;
    if (found == 1 && dlock__etcd_value_kind(v, len, &rest) == DLOCK_KIND_WRITE) {
        char *rv = NULL;
        int n;
        json_t *ops;
        v[1] = 'r';
        /* A reader's value ends with its owner id (nested reads, upgrades
         * refused); the write lock's hold key stays, as the read's
         * (etcd_owner.c: a reader with an owner id keeps one too). */
        n = req->owner != NULL ? asprintf(&rv, "%.*s\n%s", (int)len, v, req->owner)
                               : asprintf(&rv, "%.*s", (int)len, v);
        ops = n < 0 ? NULL
                    : json_pack("[{s:{s:o, s:o, s:b}}]", "request_put", "key",
                                dlock__etcd_str(k.key), "value", dlock__etcd_bytes(rv, (size_t)n),
                                "ignore_lease", 1);
        free(rv);
        rc = dlock__etcd_be_call(
            be, c, "/v3/kv/txn",
            json_pack("{s:[{s:o, s:s, s:s, s:I}, {s:o, s:s, s:s, s:I}], s:o}", "compare", "key",
                      dlock__etcd_bytes(kv.key, kv.key_len), "target", "CREATE", "result",
                      "EQUAL", "create_revision", (json_int_t)kv.create_revision, "key",
                      dlock__etcd_bytes(kv.key, kv.key_len), "target", "MOD", "result", "EQUAL",
                      "mod_revision", (json_int_t)kv.mod_revision, "success", ops),
            &reply);
        if (rc == DLOCK_OK && !json_is_true(json_object_get(reply, "succeeded")))
            rc = DLOCK_ELOST;
        json_decref(reply);
    } else if (found == 1 || found == 0) {
        rc = DLOCK_ELOST; /* gone, or not a write lock of ours */
    } else {
        rc = found;
    }
    free(v);
    free(kv.key);
    dlock__etcd_conn_put(be->http, c);
    dlock__etcd_keys_free(&k);
    return rc;
}

/* ---- holders --------------------------------------------------------------- */

void dlock__etcd_holders_free(dlock__etcd_holder *h, size_t n)
{
    for (size_t i = 0; h != NULL && i < n; i++)
        free(h[i].kv.key);
    free(h);
}

/*
 * One txn reads the queue with its values and N. The first key holds; a
 * reader's, with every reader after it up to the first writer; a permit
 * holder's, with the keys after it up to N in all.
 */
int dlock__etcd_holders_read(dlock__etcd_be *be, dlock__etcd_conn *c, const dlock__etcd_keys *k,
                             int ttl, dlock__etcd_holder **out, size_t *n)
{
    json_t *reply = NULL, *ops = dlock__etcd_look_ops(k, 0);
    const json_t *range;
    dlock__etcd_holder *h = NULL;
    size_t count = 0, max = SIZE_MAX;
    int rc, first_kind = -1;

    *out = NULL;
    *n = 0;
    if (ops == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    rc = dlock__etcd_be_call(be, c, "/v3/kv/txn", json_pack("{s:o}", "success", ops), &reply);
    if (rc != DLOCK_OK)
        return rc;
    range = dlock__etcd_txn_op(reply, 0, "response_range");
    for (size_t i = 0; rc == DLOCK_OK && count < max; i++) {
        dlock__etcd_kv kv;
        char *v = NULL;
        size_t len = 0, rest = 0;
        int found = dlock__etcd_kv_at(range, i, &kv), kind;

        if (found <= 0) {
            if (found < 0)
                rc = dlock__etcd_bad_reply(be, "range");
            break;
        }
        if (dlock__etcd_kv_value_at(range, i, &v, &len) != 0) {
            free(kv.key);
            rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
            break;
        }
        kind = dlock__etcd_value_kind(v, len, &rest);
        if (first_kind < 0) {
            first_kind = kind;
            if (kind == DLOCK_KIND_SEMAPHORE) {
                int permits = stored_permits(dlock__etcd_txn_op(reply, 1, "response_range"));
                max = permits > 0 ? (size_t)permits : SIZE_MAX;
            } else if (kind != DLOCK_KIND_READ) {
                max = 1;
            }
        } else if (first_kind == DLOCK_KIND_READ && kind != DLOCK_KIND_READ) {
            free(v);
            free(kv.key);
            break; /* the first writer: readers behind it wait */
        }
        dlock__etcd_holder *more = realloc(h, (count + 1) * sizeof(*h));
        if (more == NULL) {
            free(v);
            free(kv.key);
            rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
            break;
        }
        h = more;
        memset(&h[count], 0, sizeof(h[count]));
        h[count].kv = kv;
        h[count].info.held = 1;
        h[count].info.fence = (uint64_t)kv.create_revision;
        h[count].info.kind = kind;
        /* "CLIENT-NAME HOLDER" after the kind's mark (etcd_acquire); a value
         * without one (a candidate's identity, an older dlock) has none. */
        char *sp = memchr(v + rest, ' ', len - rest), *nl = memchr(v, '\n', len);
        size_t end = nl != NULL ? (size_t)(nl - v) : len;
        if (sp != NULL && (size_t)(sp + 1 - v) <= end)
            dlock_holder_parse(&h[count].info, sp + 1, end - (size_t)(sp + 1 - v));
        free(v);
        count++;
    }
    json_decref(reply);
    for (size_t i = 0; rc == DLOCK_OK && ttl && i < count; i++)
        rc = dlock__etcd_lease_left(be, c, h[i].kv.lease, &h[i].info.ttl_ms);
    if (rc != DLOCK_OK) {
        dlock__etcd_holders_free(h, count);
        return rc;
    }
    *out = h;
    *n = count;
    return DLOCK_OK;
}
