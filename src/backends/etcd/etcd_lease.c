/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The etcd backend's requests: one call on a connection with its request
 * built in place, the check of a reply, and the lease calls every lock
 * operation makes (grant, revoke, time to live, keepalive in batches).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/etcd/etcd_int.h"
#include "core/error.h"

/* Lease IDs kept alive per keepalive stream; the request body stays small
 * enough to reach the gateway in one piece (it stops reading the body once it
 * answers), and a gRPC stream's replies come back in one read or two. */
#define KEEPALIVE_CHUNK 32

/* ---- requests ------------------------------------------------------------ */

int dlock__etcd_bad_reply(dlock__etcd_be *be, const char *what)
{
    return dlock__fail(DLOCK_EPROTO, "%s: unexpected reply to %s",
                       dlock__etcd_where(be->http, dlock__etcd_current(be->http)), what);
}

/* Run req (consumed) on path. */
int dlock__etcd_be_call(dlock__etcd_be *be, dlock__etcd_conn *c, const char *path, json_t *req,
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

/* The holder (first key) and our key's revision out of a txn reply. */
int dlock__etcd_read_kv(dlock__etcd_be *be, const json_t *range, dlock__etcd_kv *kv,
                        const char *what)
{
    int found = dlock__etcd_kv_at(range, 0, kv);

    if (found < 0)
        return dlock__etcd_bad_reply(be, what);
    return found;
}

/* Grant the lease; one that exists already is ours (a retry). */
int dlock__etcd_grant(dlock__etcd_be *be, dlock__etcd_conn *c, int64_t lease, int64_t ttl)
{
    json_t *reply;
    int rc;

    rc = dlock__etcd_be_call(
        be, c, "/v3/lease/grant",
        json_pack("{s:I, s:I}", "ID", (json_int_t)lease, "TTL", (json_int_t)ttl), &reply);
    json_decref(reply);
    if (rc == DLOCK_ESERVER && c->grpc_code == DLOCK__GRPC_FAILED_PRECONDITION &&
        strstr(c->grpc_message, "exists") != NULL)
        return DLOCK_OK;
    return rc;
}

/* Revoke the lease, deleting what is attached. A lease already gone is fine. */
int dlock__etcd_lease_revoke(dlock__etcd_be *be, dlock__etcd_conn *c, int64_t lease)
{
    json_t *reply;
    int rc;

    rc = dlock__etcd_be_call(be, c, "/v3/lease/revoke", json_pack("{s:I}", "ID", (json_int_t)lease),
                             &reply);
    json_decref(reply);
    if (rc == DLOCK_ESERVER && c->grpc_code == DLOCK__GRPC_NOT_FOUND)
        return DLOCK_OK;
    return rc;
}

/* Lease left in ms: -1 for no lease (a key set by hand), 0 when expired. */
int dlock__etcd_lease_left(dlock__etcd_be *be, dlock__etcd_conn *c, int64_t lease, int64_t *left_ms)
{
    json_t *reply;
    int64_t ttl = 0;
    int rc;

    *left_ms = -1;
    if (lease == 0)
        return DLOCK_OK;
    rc = dlock__etcd_be_call(be, c, "/v3/lease/timetolive",
                             json_pack("{s:I}", "ID", (json_int_t)lease), &reply);
    /* etcd's longest TTL is 9e9 s; one whose ms do not fit is not etcd's. */
    if (rc == DLOCK_OK && (dlock__etcd_int(reply, "TTL", &ttl) != 0 || ttl > INT64_MAX / 1000))
        rc = dlock__etcd_bad_reply(be, "lease timetolive");
    json_decref(reply);
    if (rc == DLOCK_ESERVER && c->grpc_code == DLOCK__GRPC_NOT_FOUND) {
        *left_ms = 0;
        return DLOCK_OK;
    }
    if (rc == DLOCK_OK)
        *left_ms = ttl > 0 ? ttl * 1000 : 0;
    return rc;
}

/* Read the answers of a keepalive stream: alive[i] 1 for a lease renewed,
 * 0 for one gone (no TTL, or TTL 0), left as it was (-1) when unanswered. */
int dlock__etcd_keepalive_results(dlock__etcd_be *be, const json_t *results, const int64_t *ids,
                                  size_t n, int *alive)
{
    for (size_t r = 0; r < json_array_size(results); r++) {
        const json_t *res = json_array_get(results, r);
        int64_t id = 0, ttl = 0;
        if (dlock__etcd_int(res, "ID", &id) != 0 || dlock__etcd_int(res, "TTL", &ttl) != 0)
            return dlock__etcd_bad_reply(be, "lease keepalive");
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
int dlock__etcd_keepalive(dlock__etcd_be *be, dlock__etcd_conn *c, const int64_t *ids, size_t n,
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
            rc = dlock__etcd_keepalive_results(be, results, ids + from, to - from, alive + from);
        json_decref(results);
        if (rc != DLOCK_OK)
            break;
        /* Unanswered IDs: again, alone. */
        for (size_t i = from; i < to && rc == DLOCK_OK; i++) {
            if (alive[i] >= 0)
                continue;
            if (to - from == 1) {
                rc = dlock__etcd_bad_reply(be, "lease keepalive (no answer for the lease)");
                break;
            }
            rc = dlock__etcd_keepalive(be, c, &ids[i], 1, &alive[i]);
        }
        from = to;
    }
    free(body);
    return rc;
}

