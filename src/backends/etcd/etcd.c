/* SPDX-License-Identifier: BSD-3-Clause */
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
 *
 * The files of the backend, one job each, are listed in etcd_int.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/etcd/etcd_int.h"
#include "core/error.h"

/* Key reads per renewal txn (etcd's default --max-txn-ops is 128). */
#define TXN_CHUNK 64

/* ---- open / close ----------------------------------------------------- */

static void etcd_close(void *arg)
{
    dlock__etcd_be *be = arg;

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
    dlock__etcd_be *be;
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
    rc = dlock__etcd_be_call(
        be, c, "/v3/kv/range",
        json_pack("{s:o, s:b}", "key", dlock__etcd_str(be->prefix), "count_only", 1), &reply);
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

/* Every kind etcd serves (caps) is a queue of keys: the plain mutex, the
 * fair lock (the same queue: first come, first served), and an election,
 * whose keys hold the candidates' identities. */
static int etcd_acquire(void *be, const dlock_request *req, void *watch,
                        dlock_acquire_result *out)
{
    return dlock__etcd_acquire_as(be, req->name, req->token, req->lease_ms,
                                  req->kind == DLOCK_KIND_LEADER ? req->identity : NULL, watch,
                                  &out->fence, &out->retry_ms);
}

/* ---- release, extend, check --------------------------------------------- */

static int etcd_release(void *arg, const dlock_request *req)
{
    dlock__etcd_be *be = arg;
    const char *name = req->name, *owner = req->token;
    dlock__etcd_conn *c;
    dlock__etcd_keys k;
    json_t *reply = NULL;
    dlock__etcd_kv prev = {0};
    int64_t deleted = 0;
    int rc, found = 0;

    if ((rc = dlock__etcd_keys_make(&k, be, name, owner, 1)) != DLOCK_OK)
        return rc;
    if ((rc = dlock__etcd_conn_get(be->http, &c)) != DLOCK_OK) {
        dlock__etcd_keys_free(&k);
        return rc;
    }
    /* Our key exists only while it is ours: its name is this owner's alone,
     * and it goes when its lease does. */
    rc = dlock__etcd_be_call(be, c, "/v3/kv/deleterange",
                             json_pack("{s:o, s:b}", "key", dlock__etcd_str(k.key), "prev_kv", 1),
                             &reply);
    if (rc == DLOCK_OK &&
        (dlock__etcd_int(reply, "deleted", &deleted) != 0 ||
         (deleted > 0 && (found = dlock__etcd_kv_in(reply, "prev_kvs", 0, &prev)) != 1)))
        rc = dlock__etcd_bad_reply(be, "deleterange");
    json_decref(reply);
    if (rc == DLOCK_OK && deleted == 0)
        rc = DLOCK_ELOST;
    /* No lock of this acquisition remains: end its lease now rather than
     * let it run out. */
    if (rc == DLOCK_OK && prev.lease != 0)
        dlock__etcd_lease_revoke(be, c, prev.lease);
    free(prev.key);
    dlock__etcd_conn_put(be->http, c);
    dlock__etcd_keys_free(&k);
    return rc;
}

/* Our key, read: 1 present (*kv filled), 0 gone. */
static int read_own_key(dlock__etcd_be *be, dlock__etcd_conn *c, const char *key,
                        dlock__etcd_kv *kv)
{
    json_t *reply;
    int rc;

    rc = dlock__etcd_be_call(be, c, "/v3/kv/range", dlock__etcd_range_key(key), &reply);
    if (rc != DLOCK_OK)
        return rc;
    rc = dlock__etcd_read_kv(be, reply, kv, "range");
    json_decref(reply);
    return rc;
}

static int etcd_check(void *arg, const dlock_request *req)
{
    dlock__etcd_be *be = arg;
    const char *name = req->name, *owner = req->token;
    dlock__etcd_conn *c;
    dlock__etcd_kv kv = {0};
    dlock__etcd_keys k;
    int rc;

    if ((rc = dlock__etcd_keys_make(&k, be, name, owner, 1)) != DLOCK_OK)
        return rc;
    if ((rc = dlock__etcd_conn_get(be->http, &c)) == DLOCK_OK) {
        rc = read_own_key(be, c, k.key, &kv);
        rc = rc == 1 ? DLOCK_OK : rc == 0 ? DLOCK_ELOST : rc;
        dlock__etcd_conn_put(be->http, c);
    }
    free(kv.key);
    dlock__etcd_keys_free(&k);
    return rc;
}

/*
 * Move our key kv onto the lease k->lease, granted now for k->ttl: a put
 * keeps the key's create revision, so the fence and the place in the queue
 * stay. The old lease is revoked. DLOCK_ELOST if the key is no longer the
 * one we read.
 */
static int move_to_lease(dlock__etcd_be *be, dlock__etcd_conn *c, const dlock__etcd_keys *k,
                         const dlock__etcd_kv *kv)
{
    json_t *reply = NULL;
    int rc;

    rc = dlock__etcd_grant(be, c, k->lease, k->ttl);
    if (rc == DLOCK_OK)
        rc = dlock__etcd_be_call(be, c, "/v3/kv/txn",
                                 json_pack("{s:[{s:o, s:s, s:s, s:I}], s:[{s:{s:o, s:b, s:I}}]}",
                                           "compare", "key", dlock__etcd_str(k->key), "target",
                                           "CREATE", "result", "EQUAL", "create_revision",
                                           (json_int_t)kv->create_revision, "success",
                                           "request_put", "key", dlock__etcd_str(k->key),
                                           "ignore_value", 1, "lease", (json_int_t)k->lease),
                                 &reply);
    if (rc == DLOCK_OK && !json_is_true(json_object_get(reply, "succeeded"))) {
        rc = DLOCK_ELOST;
        dlock__etcd_lease_revoke(be, c, k->lease);
    } else if (rc == DLOCK_OK && kv->lease != 0) {
        dlock__etcd_lease_revoke(be, c, kv->lease);
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
    dlock__etcd_be *be = arg;
    const char *name = req->name, *owner = req->token;
    int64_t lease_ms = req->lease_ms;
    dlock__etcd_conn *c;
    dlock__etcd_kv kv = {0};
    dlock__etcd_keys k;
    int rc, alive = 0;

    if ((rc = dlock__etcd_keys_make(&k, be, name, owner, lease_ms)) != DLOCK_OK)
        return rc;
    if ((rc = dlock__etcd_conn_get(be->http, &c)) != DLOCK_OK) {
        dlock__etcd_keys_free(&k);
        return rc;
    }
    rc = read_own_key(be, c, k.key, &kv);
    if (rc == 0) {
        rc = DLOCK_ELOST;
    } else if (rc == 1 && kv.lease == k.lease) {
        rc = dlock__etcd_keepalive(be, c, &k.lease, 1, &alive);
        if (rc == DLOCK_OK && !alive)
            rc = DLOCK_ELOST;
    } else if (rc == 1) {
        rc = move_to_lease(be, c, &k, &kv);
    }
    free(kv.key);
    dlock__etcd_conn_put(be->http, c);
    dlock__etcd_keys_free(&k);
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
    dlock__etcd_be *be = arg;
    dlock__etcd_keys *keys = calloc(n, sizeof(*keys));
    int64_t *ids = calloc(n, sizeof(*ids));
    int *alive = calloc(n, sizeof(*alive));
    int rc = DLOCK_OK;

    if (keys == NULL || ids == NULL || alive == NULL) {
        rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n && rc == DLOCK_OK; i++) {
        rc = dlock__etcd_keys_make(&keys[i], be, items[i].req->name, items[i].req->token,
                                   items[i].req->lease_ms);
        ids[i] = keys[i].lease;
    }
    if (rc == DLOCK_OK)
        rc = dlock__etcd_keepalive(be, be->wd, ids, n, alive);
    for (size_t from = 0; from < n && rc == DLOCK_OK; from += TXN_CHUNK) {
        size_t to = from + TXN_CHUNK < n ? from + TXN_CHUNK : n;
        json_t *ops = json_array(), *reply = NULL;

        for (size_t i = from; ops != NULL && i < to; i++) {
            json_t *op = dlock__etcd_as_op(dlock__etcd_range_key(keys[i].key));
            if (json_array_append_new(ops, op) != 0) {
                json_decref(ops);
                ops = NULL;
            }
        }
        if (ops == NULL) {
            rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
            break;
        }
        rc = dlock__etcd_be_call(be, be->wd, "/v3/kv/txn", json_pack("{s:o}", "success", ops),
                                 &reply);
        for (size_t i = from; rc == DLOCK_OK && i < to; i++) {
            dlock__etcd_kv kv;
            int found = dlock__etcd_kv_at(dlock__etcd_txn_op(reply, i - from, "response_range"),
                                          0, &kv);
            if (found < 0) {
                rc = dlock__etcd_bad_reply(be, "the renewal txn");
                break;
            }
            if (found != 1 || !dlock__etcd_same_key(&kv, keys[i].key))
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
        dlock__etcd_keys_free(&keys[i]);
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
static int read_holder(dlock__etcd_be *be, dlock__etcd_conn *c, const dlock__etcd_keys *k,
                       dlock_lock_info *out, dlock__etcd_kv *holder)
{
    json_t *reply;
    int rc, found;

    memset(out, 0, sizeof(*out));
    rc = dlock__etcd_be_call(be, c, "/v3/kv/range", dlock__etcd_range_first(k), &reply);
    if (rc != DLOCK_OK)
        return rc;
    found = dlock__etcd_read_kv(be, reply, holder, "range");
    json_decref(reply);
    if (found <= 0)
        return found;
    out->held = 1;
    out->fence = (uint64_t)holder->create_revision;
    if ((rc = dlock__etcd_lease_left(be, c, holder->lease, &out->ttl_ms)) != DLOCK_OK)
        return rc;
    return DLOCK_OK;
}

static int etcd_status(void *arg, const char *name, dlock_lock_info *out)
{
    dlock__etcd_be *be = arg;
    dlock__etcd_conn *c;
    dlock__etcd_kv holder = {0};
    dlock__etcd_keys k;
    int rc;

    if ((rc = dlock__etcd_keys_make(&k, be, name, NULL, 0)) != DLOCK_OK)
        return rc;
    if ((rc = dlock__etcd_conn_get(be->http, &c)) == DLOCK_OK) {
        rc = read_holder(be, c, &k, out, &holder);
        dlock__etcd_conn_put(be->http, c);
    }
    free(holder.key);
    dlock__etcd_keys_free(&k);
    return rc;
}

/* Delete the holder's key (if it is still the same key) and its lease. The
 * next in the queue, watching it, then holds the lock. */
static int etcd_force_release(void *arg, const char *name, dlock_lock_info *removed)
{
    dlock__etcd_be *be = arg;
    dlock__etcd_conn *c;
    dlock__etcd_kv holder = {0};
    json_t *reply = NULL;
    dlock__etcd_keys k;
    int rc;

    if ((rc = dlock__etcd_keys_make(&k, be, name, NULL, 0)) != DLOCK_OK)
        return rc;
    if ((rc = dlock__etcd_conn_get(be->http, &c)) != DLOCK_OK) {
        dlock__etcd_keys_free(&k);
        return rc;
    }
    rc = read_holder(be, c, &k, removed, &holder);
    if (rc == DLOCK_OK && removed->held) {
        rc = dlock__etcd_be_call(
            be, c, "/v3/kv/txn",
            json_pack("{s:[{s:o, s:s, s:s, s:I}], s:[{s:{s:o}}]}", "compare", "key",
                      dlock__etcd_bytes(holder.key, holder.key_len), "target", "CREATE", "result",
                      "EQUAL", "create_revision", (json_int_t)holder.create_revision, "success",
                      "request_delete_range", "key", dlock__etcd_bytes(holder.key, holder.key_len)),
            &reply);
        json_decref(reply);
        if (rc == DLOCK_OK && holder.lease != 0)
            dlock__etcd_lease_revoke(be, c, holder.lease);
    }
    dlock__etcd_conn_put(be->http, c);
    free(holder.key);
    dlock__etcd_keys_free(&k);
    return rc;
}

static const char *const etcd_schemes[] = {"etcd", "etcds", NULL};

/* Designated: the calls this backend leaves out (downgrade, permits, atomic
 * multi-locks) stay NULL, and its caps keep the core from asking. */
const dlock_backend dlock__etcd_backend = {
    .version = DLOCK_BACKEND_VERSION,
    .size = sizeof(dlock_backend),
    .name = "etcd",
    .schemes = etcd_schemes,
    /* Owner ids, read-write locks and semaphores are not implemented on
     * etcd (docs/etcd.md). */
    .caps = DLOCK_CAP_KIND(DLOCK_KIND_MUTEX) | DLOCK_CAP_KIND(DLOCK_KIND_FAIR) |
            DLOCK_CAP_KIND(DLOCK_KIND_LEADER),
    .open = etcd_open,
    .close = etcd_close,
    .acquire = etcd_acquire,
    .release = etcd_release,
    .extend = etcd_extend,
    .check = etcd_check,
    .renew = etcd_renew,
    .watch_begin = dlock__etcd_watch_begin,
    .watch_wait = dlock__etcd_watch_wait,
    .watch_end = dlock__etcd_watch_end,
    .watch_wake = dlock__etcd_watch_wake,
    .status = etcd_status,
    .force_release = etcd_force_release,
    .leader_get = dlock__etcd_leader_get,
    .observe_begin = dlock__etcd_observe_begin,
};
