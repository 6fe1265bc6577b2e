/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Owner ids and reentrancy on etcd (the mutex, the fair lock and the write
 * lock). The lock is held as before by the first key of the queue, the
 * tenure; every acquisition that gives an owner id also writes a hold key
 *
 *   NAME/x<id>   "FENCE TTL OWNER-ID", on the tenure's lease
 *
 * <id> derived from its own token as the queue key's is. Hold keys sort
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
           !dlock__etcd_shared_kind(req->kind);
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

/* Put our hold key on lease, if the key named guard (of create revision
 * guard_rev) still exists. 1 put, 0 the guard is gone, or an error. */
static int put_hold(dlock__etcd_be *be, dlock__etcd_conn *c, const char *key, const char *guard,
                    size_t guard_len, int64_t guard_rev, int64_t lease, uint64_t fence,
                    int64_t ttl, const char *owner)
{
    size_t len = 0;
    char *v = hold_value(fence, ttl, owner, &len);
    json_t *reply = NULL;
    int rc;

    if (v == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    rc = dlock__etcd_be_call(
        be, c, "/v3/kv/txn",
        json_pack("{s:[{s:o, s:s, s:s, s:I}], s:[{s:{s:o, s:o, s:I}}]}", "compare", "key",
                  dlock__etcd_bytes(guard, guard_len), "target", "CREATE", "result", "EQUAL",
                  "create_revision", (json_int_t)guard_rev, "success", "request_put", "key",
                  dlock__etcd_str(key), "value", dlock__etcd_bytes(v, len), "lease",
                  (json_int_t)lease),
        &reply);
    free(v);
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

int dlock__etcd_reenter(dlock__etcd_be *be, const dlock_request *req, uint64_t *fence)
{
    dlock__etcd_conn *c;
    dlock__etcd_keys k;
    int rc;

    if (!dlock__etcd_owner_mode(req))
        return 0;
    if ((rc = hold_open(be, req, req->lease_ms, &k, &c)) != DLOCK_OK)
        return rc;
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
        else if (found == 1 && (rc = put_hold(be, c, k.key, first.key, first.key_len,
                                              first.create_revision, first.lease, f, ttl,
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
        rc = put_hold(be, c, k.key, queue_key, strlen(queue_key), (int64_t)fence, lease, fence,
                      ttl, req->owner);
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
                if (parse_hold(v, len, &f, &ttl, &owner) == 0)
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
