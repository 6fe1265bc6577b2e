/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Multi-locks on etcd: several plain mutexes taken in one txn, all or none
 * (the backend's multi_atomic and multi_acquire).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/etcd/etcd_int.h"
#include "core/error.h"

/* etcd's txn is atomic across keys: any plain mutexes, up to a txn's
 * operations (etcd's --max-txn-ops, 128 by default: a compare and a put
 * per name). */
int dlock__etcd_multi_atomic(void *arg, const dlock_request *reqs, size_t n)
{
    (void)arg;
    for (size_t i = 0; i < n; i++)
        if (reqs[i].kind != DLOCK_KIND_MUTEX || reqs[i].owner != NULL)
            return 0;
    return n <= 64;
}

/*
 * One txn for all names: if every directory is empty, put every key, each
 * on its part's own lease (the watchdog renews and the release revokes
 * them one by one, as separate locks), and each name's fence is the txn's
 * revision; else read every directory's first key, for which name was busy
 * (or, after a lost reply, to find our own keys). The leases are granted
 * first, one round trip each, and revoked again when the names are busy.
 */
int dlock__etcd_multi_acquire(void *arg, const dlock_request *reqs, size_t n, uint64_t *fences,
                              dlock_acquire_result *out)
{
    dlock__etcd_be *be = arg;
    dlock__etcd_keys *k = calloc(n, sizeof(*k));
    char **values = calloc(n, sizeof(*values));
    json_t *cmp = json_array(), *put = json_array(), *look = json_array(), *reply = NULL;
    dlock__etcd_conn *c = NULL;
    size_t mine = 0, busy = n;
    int rc = DLOCK_OK;

    out->retry_ms = -1;
    if (k == NULL || values == NULL || cmp == NULL || put == NULL || look == NULL) {
        rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n && rc == DLOCK_OK; i++) {
        if ((rc = dlock__etcd_keys_make(&k[i], be, reqs[i].name, reqs[i].token,
                                        reqs[i].lease_ms)) != DLOCK_OK)
            break;
        if (asprintf(&values[i], "%s%s%s", be->value, reqs[i].holder != NULL ? " " : "",
                     reqs[i].holder != NULL ? reqs[i].holder : "") < 0) {
            values[i] = NULL;
            rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
            break;
        }
        if (json_array_append_new(cmp, json_pack("{s:o, s:o, s:s, s:s, s:I}", "key",
                                                 dlock__etcd_str(k[i].dir), "range_end",
                                                 dlock__etcd_str(k[i].dir_end), "target",
                                                 "CREATE", "result", "EQUAL", "create_revision",
                                                 (json_int_t)0)) != 0 ||
            json_array_append_new(put, json_pack("{s:{s:o, s:o, s:I}}", "request_put", "key",
                                                 dlock__etcd_str(k[i].key), "value",
                                                 dlock__etcd_str(values[i]), "lease",
                                                 (json_int_t)k[i].lease)) != 0 ||
            json_array_append_new(look, dlock__etcd_as_op(dlock__etcd_range_first(&k[i]))) != 0)
            rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    if (rc != DLOCK_OK || (rc = dlock__etcd_conn_get(be->http, &c)) != DLOCK_OK) {
        c = NULL;
        goto out;
    }
    for (size_t i = 0; i < n && rc == DLOCK_OK; i++)
        rc = dlock__etcd_grant(be, c, k[i].lease, k[i].ttl);
    if (rc == DLOCK_OK) {
        rc = dlock__etcd_be_call(be, c, "/v3/kv/txn",
                                 json_pack("{s:O, s:O, s:O}", "compare", cmp, "success", put,
                                           "failure", look),
                                 &reply);
    }
    if (rc == DLOCK_OK && json_is_true(json_object_get(reply, "succeeded"))) {
        int64_t rev = dlock__etcd_revision(reply);
        if (rev <= 0)
            rc = dlock__etcd_bad_reply(be, "the multi-lock txn (no revision)");
        for (size_t i = 0; i < n && rc == DLOCK_OK; i++) {
            fences[i] = (uint64_t)rev;
            rc = dlock__etcd_held_set(be, reqs[i].token, k[i].lease, k[i].ttl);
        }
        goto out;
    }
    for (size_t i = 0; i < n && rc == DLOCK_OK; i++) {
        dlock__etcd_kv first = {0};
        int found = dlock__etcd_read_kv(be, dlock__etcd_txn_op(reply, i, "response_range"), &first,
                                        "the multi-lock txn");
        if (found < 0) {
            rc = found;
        } else if (found == 1 && dlock__etcd_same_key(&first, k[i].key)) {
            fences[i] = (uint64_t)first.create_revision; /* ours: a lost reply */
            mine++;
        } else if (found == 1 && busy == n) {
            /* The first name another holds (a free one is not what was
             * busy: the error names this one). */
            busy = i;
            dlock__etcd_lease_left(be, c, first.lease, &out->retry_ms);
        }
        free(first.key);
    }
    if (busy == n)
        out->retry_ms = 0; /* it went between the compare and the read */
    if (rc == DLOCK_OK && mine == n) {
        for (size_t i = 0; i < n && rc == DLOCK_OK; i++)
            rc = dlock__etcd_held_set(be, reqs[i].token, k[i].lease, k[i].ttl);
        goto out;
    }
    /* Busy (or failed): the leases go again, with any key of ours. */
    for (size_t i = 0; i < n; i++)
        dlock__etcd_lease_revoke(be, c, k[i].lease);
    if (rc == DLOCK_OK) {
        out->busy = busy < n ? busy : 0;
        rc = DLOCK_EBUSY;
    }
out:
    json_decref(reply);
    json_decref(cmp);
    json_decref(put);
    json_decref(look);
    if (c != NULL)
        dlock__etcd_conn_put(be->http, c);
    for (size_t i = 0; k != NULL && i < n; i++)
        dlock__etcd_keys_free(&k[i]);
    for (size_t i = 0; values != NULL && i < n; i++)
        free(values[i]);
    free(k);
    free(values);
    return rc;
}
