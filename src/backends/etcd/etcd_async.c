/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The asynchronous API's requests on the loop's thread (the backend's
 * start, async_fds and async_step; include/dlock/sys/backend.h): a try
 * that never waits, of a plain mutex, and the release of a lock held on a
 * spare lease or the session lease, each one request carried by
 * etcd_loop.c, with no thread of the engine's or the backend's between the
 * loop and etcd. They are the blocking calls' own fast paths, cut in two
 * (etcd_queue.c try_begin and try_end, etcd.c dlock__etcd_release_deleted
 * and dlock__etcd_key_deleted):
 *
 *   try      the lease taken without a request (a spare, or the session
 *            lease, confirmed within a twentieth of its TTL), the acquire
 *            txn; busy: then the holder's lease's time to live
 *   release  the delete of the key (which gives a spare lease back)
 *
 * Whatever needs more (a grant, a keepalive beside the txn, failover, a
 * login, a reply that does not show the key deleted) is answered
 * DLOCK_ENOTSUP, having changed nothing the blocking call would not redo:
 * the engine's workers then make the blocking call.
 */
#include <stdlib.h>
#include <string.h>

#include "backends/etcd/etcd_int.h"
#include "core/error.h"
#include "core/wait.h"

typedef struct {
    dlock__etcd_be *be;
    dlock__etcd_keys k;        /* try: its keys */
    char *value;               /* try: what its key holds */
    dlock__etcd_lease l;       /* try: the lease it put its key on */
    dlock_acquire_result *res; /* try */
    char token[DLOCK_BACKEND_TOKEN_LEN + 1];
    int64_t lease, ttl, ok_ms; /* release: the held lease, as the table had it */
    void (*done)(void *arg, int rc);
    void *arg;
} flight;

static void flight_free(flight *f)
{
    dlock__etcd_keys_free(&f->k);
    free(f->value);
    free(f);
}

static void finish(flight *f, int rc)
{
    void (*done)(void *, int) = f->done;
    void *arg = f->arg;

    flight_free(f);
    done(arg, rc);
}

/* ---- try ---------------------------------------------------------------- */

/* The busy try's second request: how long the holder's lease has left. */
static void holder_left(void *arg, int rc, json_t *reply, dlock__grpc_status grpc_code)
{
    flight *f = arg;
    int64_t left = -1;

    if (rc == DLOCK_OK || rc == DLOCK_ESERVER)
        dlock__etcd_ttl_reply(f->be, rc, grpc_code, reply, &left);
    else
        json_decref(reply);
    f->res->retry_ms = left;
    finish(f, DLOCK_EBUSY);
}

static void tried(void *arg, int rc, json_t *reply, dlock__grpc_status grpc_code)
{
    flight *f = arg;
    dlock__etcd_be *be = f->be;
    int64_t holder = 0;

    if (rc == DLOCK_OK) {
        rc = dlock__etcd_try_end(be, &f->k, &f->l, f->token, reply, &f->res->fence,
                                 &f->res->lease_from_ms, &holder);
    } else if (rc == DLOCK_ENOTSUP) {
        json_decref(reply);
        dlock__etcd_lease_give_back(be, NULL, &f->l); /* nothing was put */
    } else {
        json_decref(reply);
        if (dlock__etcd_lease_txn_failed(be, &f->l, rc, grpc_code) == DLOCK__ETCD_LEASE_GONE)
            rc = DLOCK_ENOTSUP; /* the lease ran out: the blocking try grants one */
    }
    dlock__etcd_try_loan_end(be, f->token, DLOCK_KIND_MUTEX, rc);
    if (rc == DLOCK_EBUSY) {
        f->res->retry_ms = -1;
        if (holder != 0 && dlock__etcd_loop_send(be->loop, "/v3/lease/timetolive",
                                                 dlock__etcd_ttl_request(holder), holder_left,
                                                 f) == DLOCK_OK)
            return;
    }
    finish(f, rc);
}

static int try_start(dlock__etcd_be *be, const dlock_request *req, flight *f)
{
    json_t *txn;
    int rc;

    if (req->kind != DLOCK_KIND_MUTEX || dlock__etcd_owner_mode(req))
        return DLOCK_ENOTSUP;
    dlock__etcd_key_id_lend(be, req->token);
    if ((rc = dlock__etcd_keys_make(&f->k, be, req->name, req->token, req->lease_ms)) !=
            DLOCK_OK ||
        (rc = dlock__etcd_key_value(be, req, &f->value)) != DLOCK_OK)
        return rc;
    f->k.value = f->value;
    if ((rc = dlock__etcd_try_begin(be, &f->k, dlock__etcd_on_session(req), &f->l, &txn)) !=
        DLOCK_OK)
        return rc;
    if ((rc = dlock__etcd_loop_send(be->loop, "/v3/kv/txn", txn, tried, f)) != DLOCK_OK)
        dlock__etcd_lease_give_back(be, NULL, &f->l); /* not sent */
    return rc;
}

/* ---- release ------------------------------------------------------------ */

/* The held table's entry again, for the blocking release. */
static void held_again(flight *f)
{
    if (dlock__etcd_held_set(f->be, f->token, f->lease, f->ttl) == DLOCK_OK)
        dlock__etcd_held_alive(f->be, f->token, f->lease, f->ok_ms);
    /* else the blocking release deletes the key by its name and revokes
     * the lease it finds the key on */
}

static void released(void *arg, int rc, json_t *reply, dlock__grpc_status grpc_code)
{
    flight *f = arg;

    (void)grpc_code;
    if (rc == DLOCK_ENOTSUP || dlock__outcome_unknown(rc)) {
        /* Not done, or not known: the blocking release tries again and
         * tells what became of the key. */
        json_decref(reply);
        rc = DLOCK_ENOTSUP;
    } else if (DLOCK__ETCD_IS_SPARE(f->lease)) {
        rc = dlock__etcd_release_deleted(f->be, NULL, f->token, rc, reply, f->lease, f->ttl,
                                         f->ok_ms);
    } else {
        rc = dlock__etcd_key_deleted(f->be, NULL, f->token, rc, reply);
    }
    if (rc == DLOCK_ENOTSUP)
        held_again(f);
    else
        dlock__etcd_key_id_drop(f->be, f->token); /* the acquisition ends (etcd_release) */
    finish(f, rc);
}

/* A lock on a spare lease (confirmed alive: its delete gives the lease
 * back) or on the session lease (its delete alone releases it), as
 * etcd.c's release_keys, which takes the rest. */
static int release_start(dlock__etcd_be *be, const dlock_request *req, flight *f)
{
    int rc;

    if (dlock__etcd_owner_mode(req) ||
        !dlock__etcd_held_get(be, req->token, &f->lease, &f->ttl) ||
        !(DLOCK__ETCD_IS_SPARE(f->lease) || DLOCK__ETCD_IS_SESSION(f->lease)))
        return DLOCK_ENOTSUP;
    /* Out of the table, as the blocking release takes it. */
    dlock__etcd_held_take(be, req->token, &f->lease, &f->ttl, &f->ok_ms);
    if (DLOCK__ETCD_IS_SPARE(f->lease) ? f->ok_ms <= 0 : !DLOCK__ETCD_IS_SESSION(f->lease))
        rc = DLOCK_ENOTSUP;
    else if ((rc = dlock__etcd_keys_make(&f->k, be, req->name, req->token, 1)) == DLOCK_OK)
        rc = dlock__etcd_loop_send(be->loop, "/v3/kv/deleterange",
                                   dlock__etcd_delete_request(f->k.key), released, f);
    if (rc != DLOCK_OK && f->lease != 0)
        held_again(f);
    return rc;
}

/* ---- the backend's calls ------------------------------------------------ */

int dlock__etcd_start(void *arg, int op, const dlock_request *req, dlock_acquire_result *res,
                      void (*done)(void *arg, int rc), void *done_arg)
{
    dlock__etcd_be *be = arg;
    flight *f;
    int rc;

    if ((f = calloc(1, sizeof(*f))) == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    if (strlen(req->token) >= sizeof(f->token)) {
        free(f);
        return DLOCK_ENOTSUP;
    }
    f->be = be;
    f->res = res;
    f->done = done;
    f->arg = done_arg;
    memcpy(f->token, req->token, strlen(req->token) + 1);
    rc = op == DLOCK_BACKEND_OP_ACQUIRE ? try_start(be, req, f) : release_start(be, req, f);
    if (rc != DLOCK_OK)
        flight_free(f);
    return rc;
}

int dlock__etcd_async_fds(void *arg, int *fds, unsigned *gens, int max)
{
    return dlock__etcd_loop_fds(((dlock__etcd_be *)arg)->loop, fds, gens, max);
}

int64_t dlock__etcd_async_step(void *arg)
{
    return dlock__etcd_loop_step(((dlock__etcd_be *)arg)->loop);
}
