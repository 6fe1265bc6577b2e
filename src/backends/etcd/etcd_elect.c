/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Leader election on etcd: a LEADER is a mutex whose key holds the leader's
 * identity (acquired through etcd_queue.c); here are reading the leader and
 * starting an observer, which etcd_wait.c then runs.
 */
#include <stdlib.h>
#include <string.h>

#include "backends/etcd/etcd_int.h"
#include "core/error.h"

/* The leader is the first key of the election's directory; its value is the
 * identity. */
int dlock__etcd_leader_get(void *arg, const char *name, dlock_leader_info *out)
{
    dlock__etcd_be *be = arg;
    dlock__etcd_conn *c;
    dlock__etcd_kv first = {0};
    json_t *reply = NULL, *req;
    dlock__etcd_keys k;
    int rc, found = 0;

    memset(out, 0, sizeof(*out));
    if ((rc = dlock__etcd_keys_make(&k, be, name, NULL, 0)) != DLOCK_OK)
        return rc;
    if ((rc = dlock__etcd_conn_get(be->http, &c)) != DLOCK_OK) {
        dlock__etcd_keys_free(&k);
        return rc;
    }
    req = dlock__etcd_range_first(&k);
    if (req != NULL)
        json_object_del(req, "keys_only");
    rc = dlock__etcd_be_call(be, c, "/v3/kv/range", req, &reply);
    if (rc == DLOCK_OK && (found = dlock__etcd_read_kv(be, reply, &first, "range")) < 0)
        rc = found;
    if (rc == DLOCK_OK && found == 1) {
        char *value = NULL;
        size_t len = 0;
        out->held = 1;
        out->fence = (uint64_t)first.create_revision;
        if (dlock__etcd_kv_value_at(reply, 0, &value, &len) != 0) {
            rc = dlock__etcd_bad_reply(be, "range (value)");
        } else {
            if (len > DLOCK_IDENTITY_MAX)
                len = DLOCK_IDENTITY_MAX;
            memcpy(out->identity, value, len);
            out->identity[len] = '\0';
            rc = dlock__etcd_lease_left(be, c, first.lease, &out->ttl_ms);
        }
        free(value);
    }
    json_decref(reply);
    free(first.key);
    dlock__etcd_conn_put(be->http, c);
    dlock__etcd_keys_free(&k);
    if (rc != DLOCK_OK)
        memset(out, 0, sizeof(*out));
    return rc;
}

/* An observer watches the whole directory: every campaigner's key coming
 * and going, the leader's included, also when its lease runs out. From the
 * revision read here on, so no change after observe_begin returns is
 * missed. */
int dlock__etcd_observe_begin(void *arg, const char *name, void **watch)
{
    dlock__etcd_be *be = arg;
    dlock__etcd_conn *c;
    json_t *reply = NULL;
    dlock__etcd_watch *w;
    int rc;

    *watch = NULL;
    if ((rc = dlock__etcd_watch_new(name, &w)) != DLOCK_OK)
        return rc;
    w->observe = 1;
    if ((rc = dlock__etcd_keys_make(&w->k, be, name, NULL, 0)) != DLOCK_OK ||
        (rc = dlock__etcd_conn_get(be->http, &c)) != DLOCK_OK)
        goto err;
    rc = dlock__etcd_be_call(be, c, "/v3/kv/range",
                             json_pack("{s:o, s:o, s:b}", "key", dlock__etcd_str(w->k.dir),
                                       "range_end", dlock__etcd_str(w->k.dir_end), "count_only", 1),
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
    dlock__etcd_watch_end(be, w);
    return rc;
}

