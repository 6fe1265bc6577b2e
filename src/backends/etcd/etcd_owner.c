/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Owner ids and reentrancy on etcd (the mutex, the fair lock and the write
 * lock; nested reads below). The lock is held as before by the first key of the queue, the
 * tenure; every acquisition that gives an owner id also writes a hold key
 *
 *   NAME/x<id>   "FENCE TTL OWNER-ID", on the tenure's lease
 *
 * <id> that of its queue key (etcd_keys.c). Hold keys sort
 * after the queue's range (etcd_keys.c: the queue ends at "g"), so nobody
 * waits for them and nobody counts them as holders. A re-entry (the first
 * hold key names our owner id) writes its hold key in one txn guarded by
 * that key's create revision: the lock cannot change hands in between, and
 * it gets the tenure's fence. All holds share the tenure's lease, as on
 * Redis, which each handle's watchdog renews, so a hold lasts while any of
 * its owner's handles lives; a re-entry cannot ask for a longer lease than
 * the tenure has. A release deletes its hold key, and the last one (a txn
 * that finds no other hold key) revokes the lease, which takes the tenure's
 * queue key with it: the next waiter holds.
 *
 * Readers with an owner id keep hold keys too (nested reads, as on Redis):
 * the tenure is the owner's reader key, and a second read of the owner
 * does not queue a key of its own but writes its hold key on that key's
 * lease, in a txn guarded by the key's create and mod revisions, so it
 * lives and dies with the first read's key and passes a writer that waits
 * behind it. Unlike a mutex's, a reader's hold keys share the hold range
 * with other owners' readers, so "the last hold" cannot be read off the
 * range: every change of a reader tenure's holds (a hold added, one
 * released) also puts the tenure's key (ignore_value, ignore_lease), so
 * that its mod revision moves on, and the last release deletes the key in
 * a txn guarded by the mod revision it read with the holds. A hold that
 * came in after that read makes the txn fail and the release look again;
 * none can come in after the key is gone.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/etcd/etcd_int.h"
#include "core/error.h"

int dlock__etcd_owner_mode(const dlock_request *req)
{
    return req->owner != NULL && req->kind != DLOCK_KIND_LEADER &&
           req->kind != DLOCK_KIND_SEMAPHORE;
}

int dlock__etcd_hold_key(dlock__etcd_keys *k, const dlock_request *req)
{
    char *x = NULL;

    if (!dlock__etcd_owner_mode(req) || k->key == NULL)
        return DLOCK_OK;
    if (asprintf(&x, "%sx%s", k->dir, k->key + strlen(k->dir)) < 0)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    free(k->key);
    k->key = x;
    return DLOCK_OK;
}

/* The hold keys' range: [dir "x", dir "y"). */
static json_t *holds_range(const dlock__etcd_keys *k, const char *from, size_t from_len,
                           int limit)
{
    char *end = NULL;
    json_t *r;

    if (asprintf(&end, "%sy", k->dir) < 0)
        return NULL;
    r = json_pack("{s:o, s:o}", "key", dlock__etcd_bytes(from, from_len), "range_end",
                  dlock__etcd_str(end));
    if (r != NULL && limit > 0)
        json_object_set_new(r, "limit", json_integer(limit));
    free(end);
    return r;
}

/* "FENCE TTL OWNER-ID" of a hold key's value. */
static int parse_hold(const char *v, size_t len, uint64_t *fence, int64_t *ttl,
                      const char **owner)
{
    char *end;
    unsigned long long f = strtoull(v, &end, 10);
    long long t;

    if (end == v || *end != ' ')
        return -1;
    t = strtoll(end + 1, &end, 10);
    if (*end != ' ' || (size_t)(end + 1 - v) > len)
        return -1;
    *fence = f;
    *ttl = t;
    *owner = end + 1;
    return 0;
}

static char *hold_value(uint64_t fence, int64_t ttl, const char *owner, size_t *len)
{
    char *v = NULL;
    int n = asprintf(&v, "%" PRIu64 " %" PRId64 " %s", fence, ttl, owner);

    if (n < 0)
        return NULL;
    *len = (size_t)n;
    return v;
}

/* The op that puts key again as it is (ignore_value, ignore_lease): its
 * mod revision moves on, nothing else changes. */
static json_t *touch_op(const dlock__etcd_kv *kv)
{
    return json_pack("{s:{s:o, s:b, s:b}}", "request_put", "key",
                     dlock__etcd_bytes(kv->key, kv->key_len), "ignore_value", 1, "ignore_lease", 1);
}

static json_t *compare_rev(const dlock__etcd_kv *kv, const char *target, int64_t rev)
{
    return json_pack("{s:o, s:s, s:s, s:I}", "key", dlock__etcd_bytes(kv->key, kv->key_len),
                     "target", target, "result", "EQUAL",
                     strcmp(target, "MOD") == 0 ? "mod_revision" : "create_revision",
                     (json_int_t)rev);
}

/* Put our hold key on lease, if the key guard still has its create
 * revision. For a reader's tenure (reader), the guard's mod revision too,
 * when it is known (not 0), and the guard is touched in the same txn (see
 * the top). 1 put, 0 the guard is gone or changed, or an error. */
static int put_hold(dlock__etcd_be *be, dlock__etcd_conn *c, const char *key,
                    const dlock__etcd_kv *guard, int reader, int64_t lease, uint64_t fence,
                    int64_t ttl, const char *owner)
{
    size_t len = 0;
    char *v = hold_value(fence, ttl, owner, &len);
    json_t *reply = NULL, *cmp, *ops;
    int rc;

    if (v == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    cmp = json_pack("[o]", compare_rev(guard, "CREATE", guard->create_revision));
    ops = json_pack("[{s:{s:o, s:o, s:I}}]", "request_put", "key", dlock__etcd_str(key), "value",
                    dlock__etcd_bytes(v, len), "lease", (json_int_t)lease);
    free(v);
    if (cmp != NULL && ops != NULL && reader) {
        if (guard->mod_revision > 0)
            json_array_append_new(cmp, compare_rev(guard, "MOD", guard->mod_revision));
        json_array_append_new(ops, touch_op(guard));
    }
    if (cmp == NULL || ops == NULL) {
        json_decref(cmp);
        json_decref(ops);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    rc = dlock__etcd_be_call(be, c, "/v3/kv/txn",
                             json_pack("{s:o, s:o}", "compare", cmp, "success", ops), &reply);
    if (rc == DLOCK_OK)
        rc = json_is_true(json_object_get(reply, "succeeded")) ? 1 : 0;
    json_decref(reply);
    return rc;
}

/* The keys of req with its hold key, and a connection: both to give
 * back with hold_close. */
static int hold_open(dlock__etcd_be *be, const dlock_request *req, int64_t lease_ms,
                     dlock__etcd_keys *k, dlock__etcd_conn **c)
{
    int rc;

    if ((rc = dlock__etcd_keys_make(k, be, req->name, req->token, lease_ms)) != DLOCK_OK)
        return rc;
    if ((rc = dlock__etcd_hold_key(k, req)) != DLOCK_OK ||
        (rc = dlock__etcd_conn_get(be->http, c)) != DLOCK_OK)
        dlock__etcd_keys_free(k);
    return rc;
}

static void hold_close(dlock__etcd_be *be, dlock__etcd_keys *k, dlock__etcd_conn *c)
{
    dlock__etcd_conn_put(be->http, c);
    dlock__etcd_keys_free(k);
}

/* ---- nested reads ---------------------------------------------------------- */

/* What reader_look found, at one revision. */
typedef struct {
    dlock__etcd_kv tenure; /* the reader key the holds are on; key NULL: none */
    dlock__etcd_kv mine;   /* our hold key; key NULL: none */
    uint64_t mine_fence;   /* the fence our hold key names */
    int64_t ttl;           /* the tenure's TTL (s) from a hold of its owner; 0: none */
    size_t holds;          /* hold keys on the tenure's lease, ours included */
} reader_view;

static void reader_view_free(reader_view *rv)
{
    free(rv->tenure.key);
    free(rv->mine.key);
    memset(rv, 0, sizeof(*rv));
}

/* The reader key of the queue range that is the tenure: with owner, the
 * first reader key of that owner that holds (no writer ahead of it); else
 * the key of create revision rev. 1 found (*out), 0 none, or an error. */
static int find_tenure(dlock__etcd_be *be, const json_t *queue, const char *owner, int64_t rev,
                       dlock__etcd_kv *out)
{
    size_t olen = owner != NULL ? strlen(owner) : 0;
    int writer_ahead = 0;

    for (size_t i = 0;; i++) {
        dlock__etcd_kv kv;
        char *v = NULL;
        size_t len = 0, rest, l = 0;
        const char *o;
        int found = dlock__etcd_kv_at(queue, i, &kv), kind, hit;

        if (found <= 0)
            return found < 0 ? dlock__etcd_bad_reply(be, "the range of the queue") : 0;
        if (dlock__etcd_kv_value_at(queue, i, &v, &len) != 0) {
            free(kv.key);
            return dlock__fail(DLOCK_ENOMEM, "out of memory");
        }
        kind = dlock__etcd_value_kind(v, len, &rest);
        o = kind == DLOCK_KIND_READ ? dlock__etcd_value_owner(v, len, &l) : NULL;
        if (owner != NULL)
            hit = !writer_ahead && o != NULL && l == olen && memcmp(o, owner, olen) == 0;
        else
            hit = kv.create_revision == rev && kind == DLOCK_KIND_READ;
        free(v);
        if (hit) {
            *out = kv;
            return 1;
        }
        free(kv.key);
        if (kind != DLOCK_KIND_READ)
            writer_ahead = 1;
    }
}

/*
 * One read txn: our hold key (k->key), the queue, and every hold key. The
 * tenure is, with owner, the owner's reader key that holds (a nested
 * read's); without, the one our own hold key names (a release's). Then
 * the hold keys on the tenure's lease are counted, and the tenure's TTL
 * read off a hold of its owner naming it.
 */
static int reader_look(dlock__etcd_be *be, dlock__etcd_conn *c, const dlock__etcd_keys *k,
                       const char *owner, reader_view *rv)
{
    json_t *ops = dlock__etcd_look_ops(k, 0), *reply = NULL;
    const json_t *holds;
    char *start = NULL;
    const char *o;
    int rc, found;

    memset(rv, 0, sizeof(*rv));
    if (ops == NULL || asprintf(&start, "%sx", k->dir) < 0) {
        json_decref(ops);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    json_array_insert_new(ops, 0, dlock__etcd_as_op(json_pack("{s:o}", "key",
                                                              dlock__etcd_str(k->key))));
    json_array_append_new(ops, dlock__etcd_as_op(holds_range(k, start, strlen(start), 0)));
    free(start);
    rc = dlock__etcd_be_call(be, c, "/v3/kv/txn", json_pack("{s:o}", "success", ops), &reply);
    if (rc != DLOCK_OK)
        return rc;
    found = dlock__etcd_read_kv(be, dlock__etcd_txn_op(reply, 0, "response_range"), &rv->mine,
                                "our hold key");
    if (found == 1) {
        char *v = NULL;
        size_t len = 0;
        int64_t t;
        if (dlock__etcd_kv_value_at(dlock__etcd_txn_op(reply, 0, "response_range"), 0, &v,
                                    &len) != 0 ||
            parse_hold(v, len, &rv->mine_fence, &t, &o) != 0)
            found = dlock__etcd_bad_reply(be, "a hold key (not FENCE TTL OWNER)");
        free(v);
    }
    if (found >= 0 && (owner != NULL || rv->mine.key != NULL))
        found = find_tenure(be, dlock__etcd_txn_op(reply, 1, "response_range"), owner,
                            (int64_t)rv->mine_fence, &rv->tenure);
    holds = dlock__etcd_txn_op(reply, 3, "response_range");
    for (size_t i = 0; found == 1; i++) {
        dlock__etcd_kv kv;
        char *v = NULL;
        size_t len = 0;
        uint64_t f;
        int64_t t;
        int at = dlock__etcd_kv_at(holds, i, &kv);

        if (at <= 0) {
            found = at < 0 ? dlock__etcd_bad_reply(be, "the range of the hold keys") : 1;
            break;
        }
        if (kv.lease == rv->tenure.lease && kv.lease != 0) {
            rv->holds++;
            if (dlock__etcd_kv_value_at(holds, i, &v, &len) == 0 &&
                parse_hold(v, len, &f, &t, &o) == 0 &&
                f == (uint64_t)rv->tenure.create_revision)
                rv->ttl = t;
        }
        free(v);
        free(kv.key);
    }
    json_decref(reply);
    if (found < 0) {
        reader_view_free(rv);
        return found;
    }
    return DLOCK_OK;
}

/*
 * A read by an owner id that already reads the name: our hold key on the
 * tenure's lease, guarded by its create and mod revisions (put_hold), with
 * the tenure's fence, at once, past any writer waiting behind the tenure.
 * 1 (and *fence), 0 not a nested read (no tenure of the owner holds, or
 * its first hold is not noted yet: go on as usual), or an error.
 */
static int reader_reenter(dlock__etcd_be *be, dlock__etcd_conn *c, const dlock_request *req,
                          const dlock__etcd_keys *k, uint64_t *fence)
{
    int rc = 0;

    for (int attempt = 0; attempt < 5; attempt++) {
        reader_view rv;

        if ((rc = reader_look(be, c, k, req->owner, &rv)) != DLOCK_OK)
            return rc;
        if (rv.mine.key != NULL && rv.tenure.key != NULL &&
            rv.mine.lease == rv.tenure.lease)
            rc = 1; /* ours: a retry after a lost reply */
        else if (rv.tenure.key == NULL || rv.ttl == 0)
            rc = 0;
        else if (k->ttl > rv.ttl)
            rc = dlock__fail(DLOCK_EINVAL,
                             "etcd: lock '%s': a nested read shares the lease of the owner's "
                             "read (%" PRId64 " s) and cannot ask for a longer one (%" PRId64
                             " s)",
                             req->name, rv.ttl, k->ttl);
        else
            rc = put_hold(be, c, k->key, &rv.tenure, 1, rv.tenure.lease,
                          (uint64_t)rv.tenure.create_revision, rv.ttl, req->owner);
        if (rc == 1) {
            *fence = (uint64_t)rv.tenure.create_revision;
            rc = dlock__etcd_held_set(be, req->token, rv.tenure.lease, k->ttl);
            rc = rc == DLOCK_OK ? 1 : rc;
        }
        reader_view_free(&rv);
        if (rc != 0 || attempt == 4)
            break;
        /* The tenure changed between the read and the put (a hold came or
         * went): look again. */
    }
    return rc == 0 ? 0 : rc;
}

/*
 * The release of a reader's hold: delete our hold key, and, in the same
 * txn guarded by the tenure's create and mod revisions, touch the tenure
 * when other holds remain, or delete it when ours is the last (then its
 * lease is revoked, for anything left on it). A changed mod revision is a
 * hold that came or went since the read: look again.
 */
static int reader_release(dlock__etcd_be *be, dlock__etcd_conn *c, const dlock__etcd_keys *k)
{
    for (int attempt = 0; attempt < 20; attempt++) {
        reader_view rv;
        json_t *reply = NULL, *ops;
        int rc, last;

        if ((rc = reader_look(be, c, k, NULL, &rv)) != DLOCK_OK)
            return rc;
        if (rv.mine.key == NULL) {
            reader_view_free(&rv);
            return DLOCK_ELOST;
        }
        if (rv.tenure.key == NULL || rv.mine.lease != rv.tenure.lease) {
            /* The tenure's key went (broken by hand): the hold went with it. */
            rc = dlock__etcd_lease_revoke(be, c, rv.mine.lease);
            reader_view_free(&rv);
            return rc == DLOCK_OK ? DLOCK_ELOST : rc;
        }
        last = rv.holds <= 1;
        ops = json_pack("[{s:{s:o}}, o]", "request_delete_range", "key", dlock__etcd_str(k->key),
                        last ? json_pack("{s:{s:o}}", "request_delete_range", "key",
                                         dlock__etcd_bytes(rv.tenure.key, rv.tenure.key_len))
                             : touch_op(&rv.tenure));
        rc = dlock__etcd_be_call(
            be, c, "/v3/kv/txn",
            json_pack("{s:[o, o], s:o}", "compare",
                      compare_rev(&rv.tenure, "CREATE", rv.tenure.create_revision),
                      compare_rev(&rv.tenure, "MOD", rv.tenure.mod_revision), "success", ops),
            &reply);
        if (rc == DLOCK_OK && json_is_true(json_object_get(reply, "succeeded"))) {
            if (last)
                dlock__etcd_lease_revoke(be, c, rv.tenure.lease);
            json_decref(reply);
            reader_view_free(&rv);
            return DLOCK_OK;
        }
        json_decref(reply);
        reader_view_free(&rv);
        if (rc != DLOCK_OK)
            return rc;
    }
    return dlock__fail(DLOCK_ESERVER, "etcd: the release of a read lock kept finding its "
                       "holds changed (20 tries)");
}

int dlock__etcd_reenter(dlock__etcd_be *be, const dlock_request *req, uint64_t *fence)
{
    dlock__etcd_conn *c;
    dlock__etcd_keys k;
    int rc;

    if (!dlock__etcd_owner_mode(req))
        return 0;
    if ((rc = hold_open(be, req, req->lease_ms, &k, &c)) != DLOCK_OK)
        return rc;
    if (req->kind == DLOCK_KIND_READ) {
        rc = reader_reenter(be, c, req, &k, fence);
        hold_close(be, &k, c);
        return rc;
    }
    for (int attempt = 0; attempt < 5; attempt++) {
        char *start = NULL;
        json_t *reply = NULL;
        dlock__etcd_kv first = {0};
        char *v = NULL;
        size_t len = 0;
        const char *owner;
        uint64_t f = 0;
        int64_t ttl = 0;
        int found, again = 0;

        if (asprintf(&start, "%sx", k.dir) < 0) {
            rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
            break;
        }
        rc = dlock__etcd_be_call(be, c, "/v3/kv/range", holds_range(&k, start, strlen(start), 1),
                                 &reply);
        free(start);
        if (rc != DLOCK_OK)
            break;
        found = dlock__etcd_read_kv(be, reply, &first, "range");
        if (found == 1 && dlock__etcd_kv_value_at(reply, 0, &v, &len) != 0)
            found = dlock__fail(DLOCK_ENOMEM, "out of memory");
        json_decref(reply);
        rc = found;
        if (found == 1 && (parse_hold(v, len, &f, &ttl, &owner) != 0 ||
                           strlen(req->owner) != len - (size_t)(owner - v) ||
                           memcmp(owner, req->owner, strlen(req->owner)) != 0))
            rc = 0; /* another owner's (or not dlock's): go on as usual */
        else if (found == 1 && dlock__etcd_same_key(&first, k.key))
            rc = 1; /* ours: a retry after a lost reply */
        else if (found == 1 && !req->reentrant)
            rc = dlock__fail(DLOCK_EMISUSE,
                             "etcd: lock '%s' is already held by this owner id and reentrant "
                             "is off: set reentrant to take it again",
                             req->name);
        else if (found == 1 && k.ttl > ttl)
            rc = dlock__fail(DLOCK_EINVAL,
                             "etcd: lock '%s': a re-entry shares the lease of the hold it "
                             "re-enters (%" PRId64 " s) and cannot ask for a longer one (%" PRId64
                             " s)",
                             req->name, ttl, k.ttl);
        else if (found == 1 && (rc = put_hold(be, c, k.key, &first, 0, first.lease, f, ttl,
                                              req->owner)) == 0)
            again = 1;
        if (rc == 1) {
            *fence = f;
            rc = dlock__etcd_held_set(be, req->token, first.lease, k.ttl);
            rc = rc == DLOCK_OK ? 1 : rc;
        }
        free(v);
        free(first.key);
        if (!again)
            break;
        /* The hold we re-entered went between the read and the put: look
         * again (the tenure may have ended; then we queue as usual). */
    }
    hold_close(be, &k, c);
    return rc;
}

int dlock__etcd_hold_add(dlock__etcd_be *be, const dlock_request *req, uint64_t fence)
{
    dlock__etcd_conn *c;
    dlock__etcd_keys k;
    int64_t lease = 0, ttl = 0;
    char *queue_key;
    int rc;

    if (!dlock__etcd_owner_mode(req))
        return DLOCK_OK;
    if ((rc = dlock__etcd_keys_make(&k, be, req->name, req->token, req->lease_ms)) != DLOCK_OK)
        return rc;
    queue_key = k.key;
    k.key = NULL;
    if ((k.key = strdup(queue_key)) == NULL || (rc = dlock__etcd_hold_key(&k, req)) != DLOCK_OK) {
        free(queue_key);
        dlock__etcd_keys_free(&k);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    dlock__etcd_held_get(be, req->token, &lease, &ttl);
    if ((rc = dlock__etcd_conn_get(be->http, &c)) == DLOCK_OK) {
        dlock__etcd_kv guard = {queue_key, strlen(queue_key), (int64_t)fence, 0, 0};
        rc = put_hold(be, c, k.key, &guard, req->kind == DLOCK_KIND_READ, lease, fence, ttl,
                      req->owner);
        if (rc == 0)
            rc = dlock__fail(DLOCK_ELOST, "etcd: lock '%s' was lost before its hold was noted",
                             req->name);
        if (rc != 1) /* the core counts the lock as not taken: give it back */
            dlock__etcd_lease_revoke(be, c, lease);
        dlock__etcd_conn_put(be->http, c);
    }
    free(queue_key);
    dlock__etcd_keys_free(&k);
    return rc == 1 ? DLOCK_OK : rc;
}

int dlock__etcd_hold_release(dlock__etcd_be *be, const dlock_request *req)
{
    dlock__etcd_conn *c;
    dlock__etcd_keys k;
    json_t *reply = NULL, *del;
    int64_t deleted = 0, lease = 0;
    char *start = NULL, *after = NULL;
    size_t key_len;
    int rc;

    dlock__etcd_held_drop(be, req->token);
    if ((rc = hold_open(be, req, 1, &k, &c)) != DLOCK_OK)
        return rc;
    if (req->kind == DLOCK_KIND_READ) {
        rc = reader_release(be, c, &k);
        hold_close(be, &k, c);
        return rc;
    }
    key_len = strlen(k.key);
    if (asprintf(&start, "%sx", k.dir) < 0 || (after = malloc(key_len + 1)) == NULL) {
        rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
        goto out;
    }
    memcpy(after, k.key, key_len);
    after[key_len] = '\0'; /* the first key after ours: ours and a NUL */
    /* The last hold (no other hold key before or after ours): the lease
     * goes after, with the tenure. */
    del = json_pack("{s:{s:o, s:b}}", "request_delete_range", "key", dlock__etcd_str(k.key),
                    "prev_kv", 1);
    {
        json_t *before = holds_range(&k, start, strlen(start), 0);
        json_t *behind = holds_range(&k, after, key_len + 1, 0);
        json_object_set_new(before, "range_end", dlock__etcd_str(k.key));
        rc = dlock__etcd_be_call(
            be, c, "/v3/kv/txn",
            json_pack("{s:[{s:o, s:o, s:s, s:s, s:I}, {s:o, s:o, s:s, s:s, s:I}], s:[O], s:[o]}",
                      "compare", "key", json_incref(json_object_get(before, "key")), "range_end",
                      json_incref(json_object_get(before, "range_end")), "target", "CREATE",
                      "result", "EQUAL", "create_revision", (json_int_t)0, "key",
                      json_incref(json_object_get(behind, "key")), "range_end",
                      json_incref(json_object_get(behind, "range_end")), "target", "CREATE",
                      "result", "EQUAL", "create_revision", (json_int_t)0, "success", del,
                      "failure", del),
            &reply);
        json_decref(before);
        json_decref(behind);
    }
    if (rc == DLOCK_OK) {
        const json_t *d = dlock__etcd_txn_op(reply, 0, "response_delete_range");
        dlock__etcd_kv prev = {0};
        if (dlock__etcd_int(d, "deleted", &deleted) != 0 ||
            (deleted > 0 && dlock__etcd_kv_in(d, "prev_kvs", 0, &prev) != 1))
            rc = dlock__etcd_bad_reply(be, "the release txn");
        lease = prev.lease;
        free(prev.key);
        if (rc == DLOCK_OK && deleted == 0)
            rc = DLOCK_ELOST;
        else if (rc == DLOCK_OK && json_is_true(json_object_get(reply, "succeeded")) && lease != 0)
            rc = dlock__etcd_lease_revoke(be, c, lease);
    }
    json_decref(reply);
out:
    free(start);
    free(after);
    hold_close(be, &k, c);
    return rc;
}

int dlock__etcd_hold_extend(dlock__etcd_be *be, const dlock_request *req)
{
    dlock__etcd_conn *c;
    dlock__etcd_keys k;
    dlock__etcd_kv kv = {0};
    json_t *reply = NULL;
    char *v = NULL;
    size_t len = 0;
    const char *owner;
    uint64_t f;
    int64_t ttl = 0;
    int rc, alive = 0;

    if ((rc = hold_open(be, req, req->lease_ms, &k, &c)) != DLOCK_OK)
        return rc;
    rc = dlock__etcd_be_call(be, c, "/v3/kv/range",
                             json_pack("{s:o}", "key", dlock__etcd_str(k.key)), &reply);
    if (rc == DLOCK_OK) {
        rc = dlock__etcd_read_kv(be, reply, &kv, "range");
        if (rc == 1 && dlock__etcd_kv_value_at(reply, 0, &v, &len) != 0)
            rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    json_decref(reply);
    if (rc == 0)
        rc = DLOCK_ELOST;
    if (rc == 1 && parse_hold(v, len, &f, &ttl, &owner) != 0)
        rc = dlock__etcd_bad_reply(be, "a hold key (not FENCE TTL OWNER)");
    if (rc == 1 && k.ttl > ttl)
        rc = dlock__fail(DLOCK_EINVAL,
                         "etcd: lock '%s' is held with an owner id, whose holds share one "
                         "lease of %" PRId64 " s: it cannot be extended to %" PRId64 " s",
                         req->name, ttl, k.ttl);
    if (rc == 1) {
        /* The shared lease, at its own length: at least the one asked for. */
        rc = dlock__etcd_keepalive(be, c, &kv.lease, 1, &alive);
        if (rc == DLOCK_OK && !alive)
            rc = DLOCK_ELOST;
        if (rc == DLOCK_OK)
            rc = dlock__etcd_held_set(be, req->token, kv.lease, k.ttl);
    }
    free(v);
    free(kv.key);
    hold_close(be, &k, c);
    return rc;
}

/* The kind of the queue key of create revision rev in a range reply of the
 * queue; -1 when none is. */
static int queue_kind(const json_t *queue, int64_t rev)
{
    for (size_t i = 0;; i++) {
        dlock__etcd_kv kv;
        char *v = NULL;
        size_t len = 0, rest;
        int kind = -1;

        if (dlock__etcd_kv_at(queue, i, &kv) != 1)
            return -1;
        free(kv.key);
        if (kv.create_revision != rev)
            continue;
        if (dlock__etcd_kv_value_at(queue, i, &v, &len) == 0)
            kind = dlock__etcd_value_kind(v, len, &rest);
        free(v);
        return kind;
    }
}

int dlock__etcd_owner_conflict(dlock__etcd_be *be, const dlock_request *req)
{
    dlock__etcd_conn *c;
    dlock__etcd_keys k;
    json_t *reply = NULL, *ops;
    char *start = NULL;
    size_t olen = strlen(req->owner != NULL ? req->owner : "");
    int rc, mine = 0;

    if (req->owner == NULL || (req->kind != DLOCK_KIND_READ && req->kind != DLOCK_KIND_WRITE))
        return DLOCK_OK;
    if ((rc = dlock__etcd_keys_make(&k, be, req->name, NULL, 0)) != DLOCK_OK)
        return rc;
    if (asprintf(&start, "%sx", k.dir) < 0) {
        dlock__etcd_keys_free(&k);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    /* The queue (readers' owner ids) and the hold keys (a writer's). */
    ops = dlock__etcd_look_ops(&k, 0);
    if (ops != NULL)
        json_array_append_new(ops, dlock__etcd_as_op(holds_range(&k, start, strlen(start), 0)));
    free(start);
    if ((rc = dlock__etcd_conn_get(be->http, &c)) != DLOCK_OK) {
        json_decref(ops);
        dlock__etcd_keys_free(&k);
        return rc;
    }
    rc = dlock__etcd_be_call(be, c, "/v3/kv/txn", json_pack("{s:o}", "success", ops), &reply);
    dlock__etcd_conn_put(be->http, c);
    for (size_t op = 0; rc == DLOCK_OK && !mine && op < 3; op += 2) {
        const json_t *range = dlock__etcd_txn_op(reply, op, "response_range");
        for (size_t i = 0; !mine; i++) {
            char *v = NULL;
            size_t len = 0, l = 0, rest;
            const char *owner = NULL;
            if (dlock__etcd_kv_value_at(range, i, &v, &len) != 0 || json_array_size(
                    json_object_get(range, "kvs")) <= i) {
                free(v);
                break;
            }
            if (op == 0 && dlock__etcd_value_kind(v, len, &rest) == DLOCK_KIND_READ)
                owner = dlock__etcd_value_owner(v, len, &l);
            else if (op == 2) {
                uint64_t f;
                int64_t ttl;
                /* A hold of ours is a write lock's unless the key it
                 * names is a reader (a read of ours: nested reads). */
                if (parse_hold(v, len, &f, &ttl, &owner) == 0 &&
                    queue_kind(dlock__etcd_txn_op(reply, 0, "response_range"), (int64_t)f) !=
                        DLOCK_KIND_READ)
                    l = len - (size_t)(owner - v);
                else
                    owner = NULL;
            }
            /* A reader of ours when we want to write; a hold of ours (a
             * write lock) when we want to read. */
            mine = owner != NULL && l == olen && memcmp(owner, req->owner, olen) == 0 &&
                   (op == 0) == (req->kind == DLOCK_KIND_WRITE);
            free(v);
        }
    }
    json_decref(reply);
    dlock__etcd_keys_free(&k);
    if (rc != DLOCK_OK || !mine)
        return rc;
    if (req->kind == DLOCK_KIND_WRITE)
        return dlock__fail(DLOCK_EMISUSE,
                           "etcd: lock '%s': this owner id holds a read lock on it, and a "
                           "read-write upgrade would wait for itself: release the read lock "
                           "first",
                           req->name);
    return dlock__fail(DLOCK_EMISUSE,
                       "etcd: lock '%s': this owner id holds the write lock: take the read "
                       "lock with dlock_lock_downgrade",
                       req->name);
}
