/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The etcd backend's requests: one call on a connection with its request
 * built in place, the check of a reply, and the lease calls every lock
 * operation makes (grant, revoke, time to live, keepalive in batches).
 * And the lease source the acquisitions take their leases from: a spare
 * when one is ready, else a grant (see the end of the file).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/etcd/etcd_int.h"
#include "core/clock.h"
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

    if (DLOCK__ETCD_IS_SESSION(lease))
        return DLOCK_OK;
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
    int rc;

    *left_ms = -1;
    if (lease == 0)
        return DLOCK_OK;
    rc = dlock__etcd_be_call(be, c, "/v3/lease/timetolive", dlock__etcd_ttl_request(lease),
                             &reply);
    return dlock__etcd_ttl_reply(be, rc, c->grpc_code, reply, left_ms);
}

json_t *dlock__etcd_ttl_request(int64_t lease)
{
    return json_pack("{s:I}", "ID", (json_int_t)lease);
}

int dlock__etcd_ttl_reply(dlock__etcd_be *be, int rc, dlock__grpc_status grpc_code,
                          json_t *reply, int64_t *left_ms)
{
    int64_t ttl = 0;

    /* etcd's longest TTL is 9e9 s; one whose ms do not fit is not etcd's. */
    if (rc == DLOCK_OK && (dlock__etcd_int(reply, "TTL", &ttl) != 0 || ttl > INT64_MAX / 1000))
        rc = dlock__etcd_bad_reply(be, "lease timetolive");
    json_decref(reply);
    if (rc == DLOCK_ESERVER && grpc_code == DLOCK__GRPC_NOT_FOUND) {
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


/* ---- the lease source ---------------------------------------------------- */

/*
 * Why a lease from this source is safe for an acquisition, however long ago
 * a spare was granted (etcd_spare.c grants it ahead of need, with the TTL of
 * the acquisitions that take it: etcd only ever raises a TTL, to its
 * minimum). etcd's leader sets a lease's expiry to the time it handles a
 * grant or keepalive plus the TTL (a new leader: its own start plus the
 * TTL, only later). So a lease found alive by a request sent at ok_ms runs
 * out on the server no earlier than ok_ms + TTL, and the caller counts it
 * from a time no later than ok_ms:
 *
 * - a grant made by lease_take: ok_ms is its send time, after the time the
 *   caller counts from;
 * - a spare confirmed at or after since_ms (the caller counts from
 *   since_ms, or from ok_ms itself, as a try that will not wait does): the
 *   txn alone. A put on a lease that ran out meanwhile fails ("requested
 *   lease not found"): LEASE_GONE;
 * - else the txn and a keepalive of the spare, sent at once on two
 *   connections (a keepalive is no raft write: etcd's leader renews a lease
 *   in memory), ok_ms the keepalive's send time. The put and the keepalive
 *   may be handled in either order, and success needs both: the put done
 *   and the lease found alive. A lease that ran out between the two took
 *   the key with it: LEASE_GONE.
 *
 * A spare backs one key at most: it leaves the pool when taken
 * (dlock__etcd_spare_take), and goes back only when a txn said it backs
 * nothing (lease_give_back) or a release deleted the key on it
 * (dlock__etcd_spare_reuse, etcd.c).
 */

void dlock__etcd_lease_init(dlock__etcd_lease *l, int64_t own, int64_t ttl)
{
    memset(l, 0, sizeof(*l));
    l->own = own;
    l->ttl = ttl;
}

/* l is no longer the pool's: it is used, or in doubt. */
static void unpool(dlock__etcd_be *be, dlock__etcd_lease *l)
{
    if (l->pooled)
        dlock__etcd_spare_used(be, l->ttl);
    l->pooled = 0;
}

int dlock__etcd_lease_take(dlock__etcd_be *be, dlock__etcd_conn *c, dlock__etcd_lease *l,
                           int how)
{
    json_t *reply = NULL;
    int64_t sent;
    int rc, alive = 0;

    if (l->session) {
        l->pooled = 0;
        if (how != DLOCK__ETCD_TAKE_GRANT && dlock__etcd_session_get(be, l->ttl, &l->id, &l->ok_ms))
            return DLOCK_OK;
        if (how == DLOCK__ETCD_TAKE_READY)
            return DLOCK__ETCD_LEASE_NONE;
        return dlock__etcd_session_grant(be, c, l->ttl, &l->id, &l->ok_ms);
    }
    if (how != DLOCK__ETCD_TAKE_GRANT && dlock__etcd_spare_take(be, l->ttl, &l->id, &l->ok_ms)) {
        l->pooled = 1;
        return DLOCK_OK;
    }
    if (how == DLOCK__ETCD_TAKE_READY)
        return DLOCK__ETCD_LEASE_NONE;
    l->id = l->own;
    l->ok_ms = 0;
    l->pooled = 0;
    sent = dlock__now_ms();
    rc = dlock__etcd_be_call(
        be, c, "/v3/lease/grant",
        json_pack("{s:I, s:I}", "ID", (json_int_t)l->own, "TTL", (json_int_t)l->ttl), &reply);
    json_decref(reply);
    if (rc == DLOCK_ESERVER && c->grpc_code == DLOCK__GRPC_FAILED_PRECONDITION &&
        strstr(c->grpc_message, "exists") != NULL) {
        /* Ours from an earlier try whose reply was lost: refresh it to its
         * full length, counted from the refresh. */
        sent = dlock__now_ms();
        rc = dlock__etcd_keepalive(be, c, &l->own, 1, &alive);
        if (rc == DLOCK_OK && !alive)
            rc = dlock__etcd_bad_reply(be, "lease keepalive (the lease just granted is gone)");
    }
    if (rc == DLOCK_OK)
        l->ok_ms = sent;
    return rc;
}

/*
 * Send txn (consumed) and a keepalive of lease at once, on two connections
 * (dlock__etcd_call_pair). *alive: 1 the keepalive found the lease alive, 0
 * gone, -1 no answer. Of *p, the txn's rc[1], grpc_code[1] and out[1] (the
 * caller's to free) and the keepalive's rc[0] are left to read.
 */
static int txn_and_keepalive(dlock__etcd_be *be, dlock__etcd_conn *c, json_t *txn, int64_t lease,
                             dlock__etcd_pair *p, int *alive)
{
    char ka[48], *body = txn != NULL ? json_dumps(txn, JSON_COMPACT) : NULL;
    int rc;

    json_decref(txn);
    memset(p, 0, sizeof(*p));
    *alive = -1;
    if (body == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    snprintf(ka, sizeof(ka), "{\"ID\":\"%" PRId64 "\"}", lease);
    p->path[0] = "/v3/lease/keepalive";
    p->path[1] = "/v3/kv/txn";
    p->body[0] = ka;
    p->body[1] = body;
    p->stream[0] = 1;
    rc = dlock__etcd_call_pair(be->http, c, p);
    free(body);
    p->body[0] = p->body[1] = NULL;
    if (p->rc[0] == DLOCK_OK)
        p->rc[0] = dlock__etcd_keepalive_results(be, p->out[0], &lease, 1, alive);
    json_decref(p->out[0]);
    p->out[0] = NULL;
    return rc;
}

int dlock__etcd_lease_txn_failed(dlock__etcd_be *be, dlock__etcd_lease *l, int rc,
                                 dlock__grpc_status grpc_code)
{
    if (rc == DLOCK_ESERVER && grpc_code == DLOCK__GRPC_NOT_FOUND && (l->pooled || l->session))
        rc = DLOCK__ETCD_LEASE_GONE; /* the spare (session lease) ran out */
    if (rc == DLOCK__ETCD_LEASE_GONE && l->session)
        dlock__etcd_session_seen(be, l->id, 0, l->ok_ms);
    /* Else not known whether the put was done: the spare, which nothing
     * keeps alive any more, runs out by its TTL. */
    unpool(be, l);
    l->ok_ms = 0;
    if (rc == DLOCK__ETCD_LEASE_GONE)
        l->id = 0;
    return rc;
}

int dlock__etcd_lease_txn(dlock__etcd_be *be, dlock__etcd_conn *c, dlock__etcd_lease *l,
                          int64_t since_ms, json_t *txn, json_t **reply)
{
    int64_t sent = dlock__now_ms();
    dlock__etcd_pair p;
    int rc, alive, put;

    *reply = NULL;
    if (l->ok_ms >= since_ms) {
        rc = dlock__etcd_be_call(be, c, "/v3/kv/txn", txn, reply);
        return rc == DLOCK_OK ? DLOCK_OK : dlock__etcd_lease_txn_failed(be, l, rc, c->grpc_code);
    }
    rc = txn_and_keepalive(be, c, txn, l->id, &p, &alive);
    put = p.rc[1] == DLOCK_OK && json_is_true(json_object_get(p.out[1], "succeeded"));
    if (p.rc[1] == DLOCK_ESERVER && p.grpc_code[1] == DLOCK__GRPC_NOT_FOUND) {
        /* "requested lease not found": the spare ran out unused. */
        json_decref(p.out[1]);
        if (l->session)
            dlock__etcd_session_seen(be, l->id, 0, sent);
        unpool(be, l);
        l->id = l->ok_ms = 0;
        return DLOCK__ETCD_LEASE_GONE;
    }
    if (rc != DLOCK_OK || p.rc[0] != DLOCK_OK || alive != 1) {
        /* Whether the lease lives is not known, or it ran out after the
         * put: a key the txn put on it goes now (best effort; else when it
         * runs out, as nothing keeps it alive). */
        if (put && l->session)
            dlock__etcd_session_key_drop(be, c, l->key);
        else if (put)
            dlock__etcd_lease_revoke(be, c, l->id);
        if (l->session && alive == 0)
            dlock__etcd_session_seen(be, l->id, 0, sent);
        json_decref(p.out[1]);
        unpool(be, l);
        l->ok_ms = 0;
        if (rc != DLOCK_OK || p.rc[0] != DLOCK_OK)
            return rc != DLOCK_OK ? rc : p.rc[0];
        l->id = 0;
        return DLOCK__ETCD_LEASE_GONE;
    }
    l->ok_ms = sent;
    if (l->session)
        dlock__etcd_session_seen(be, l->id, 1, sent);
    *reply = p.out[1];
    return DLOCK_OK;
}

int dlock__etcd_lease_hold(dlock__etcd_be *be, const char *token, dlock__etcd_lease *l)
{
    int pooled = l->pooled, rc;

    unpool(be, l);
    rc = dlock__etcd_held_set(be, token, l->id, l->ttl);
    if (rc == DLOCK_OK && pooled) /* a release may give it back to the pool */
        dlock__etcd_held_alive(be, token, l->id, l->ok_ms);
    return rc;
}

void dlock__etcd_lease_give_back(dlock__etcd_be *be, dlock__etcd_conn *c, dlock__etcd_lease *l)
{
    /* (A session lease is not revoked: lease_revoke leaves it.) */
    if (l->id != 0 && l->pooled) /* the pool keeps it, or revokes it */
        dlock__etcd_spare_return(be, c, l->ttl, l->id, l->ok_ms);
    else if (l->id != 0 && c != NULL)
        dlock__etcd_lease_revoke(be, c, l->id);
    else if (l->id != 0 && !DLOCK__ETCD_IS_SESSION(l->id))
        dlock__etcd_revoke_later(be, NULL, l->id);
    l->id = l->ok_ms = 0;
    l->pooled = 0;
}

void dlock__etcd_lease_drop(dlock__etcd_be *be, dlock__etcd_lease *l)
{
    unpool(be, l);
    l->id = l->ok_ms = 0;
}
