/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Acquiring an etcd lock: a try that will not wait (only into an empty
 * directory), and the tries of a waiting acquisition, whose key holds its
 * place in the queue on a short lease (the client's waiting lease, shared
 * by its waiters: etcd_session.c; or, for a lock of WAIT_TTL_S or less, its
 * own) and moves to the holder's lease at the head of the queue (promote).
 * Waiting between the tries is in etcd_wait.c.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/etcd/etcd_int.h"
#include "core/clock.h"
#include "core/error.h"

/* A waiter's key lives on a lease of this many seconds, the client's
 * waiting lease (or the holder's own, if that is not longer), kept alive
 * every third of it while the waiter waits (the waiting lease by the spare
 * thread, for all the client's waiters at once), and moved to the holder's
 * lease when it reaches the head of the queue: a client that dies (SIGKILL,
 * a lost machine) blocks the queue for this long, not for the lease it
 * asked for. etcd may round it up to its minimum TTL (1.5 x its election
 * timeout). */
#define WAIT_TTL_S 3

/* ---- acquire ------------------------------------------------------------ */

/* The acquire txn: if the directory is empty (no holder, nobody queued),
 * put our key on k->lease; else read the first key. */
static json_t *acquire_txn(const dlock__etcd_keys *k)
{
    return json_pack("{s:[{s:o, s:o, s:s, s:s, s:I}], s:[{s:{s:o, s:o, s:I}}], s:[o]}", "compare",
                     "key", dlock__etcd_str(k->dir), "range_end", dlock__etcd_str(k->dir_end),
                     "target", "CREATE", "result", "EQUAL", "create_revision", (json_int_t)0,
                     "success", "request_put", "key", dlock__etcd_str(k->key), "value",
                     dlock__etcd_str(k->value), "lease", (json_int_t)k->lease, "failure",
                     dlock__etcd_as_op(dlock__etcd_range_first(k)));
}

/*
 * What the acquire txn's reply (consumed) says: DLOCK_OK and *fence, or
 * DLOCK_EBUSY with *first the holder (first->key NULL: the directory
 * emptied between the compare and the read).
 */
static int acquire_reply(dlock__etcd_be *be, const dlock__etcd_keys *k, json_t *reply,
                         uint64_t *fence, dlock__etcd_kv *first)
{
    int found;

    memset(first, 0, sizeof(*first));
    if (json_is_true(json_object_get(reply, "succeeded"))) {
        int64_t rev = dlock__etcd_revision(reply);
        json_decref(reply);
        if (rev <= 0)
            return dlock__etcd_bad_reply(be, "the acquire txn (no revision)");
        *fence = (uint64_t)rev;
        return DLOCK_OK;
    }
    found = dlock__etcd_read_kv(be, dlock__etcd_txn_op(reply, 0, "response_range"), first,
                                "the acquire txn");
    json_decref(reply);
    if (found < 0)
        return found;
    if (found == 1 && dlock__etcd_same_key(first, k->key) && first->create_revision > 0) {
        /* Our own put, whose reply was lost before a retry; on the lease
         * of this try, as a retry sends the same txn. On another (a try
         * without blocking, whose outcome was lost, on a lease nothing
         * renews): not known to be alive, given back by the core. */
        int64_t on = first->lease;
        free(first->key);
        first->key = NULL;
        if (on != k->lease)
            return dlock__fail(DLOCK_ECONN, "%s: the key of an earlier try whose reply was "
                               "lost is on another lease: not taken",
                               dlock__etcd_where(be->http, dlock__etcd_current(be->http)));
        *fence = (uint64_t)first->create_revision;
        return DLOCK_OK;
    }
    return DLOCK_EBUSY;
}

/* Busy: how long the holder's lease has left, for the core's sleep. */
static int busy(dlock__etcd_be *be, dlock__etcd_conn *c, dlock__etcd_kv *first, int64_t *retry_ms)
{
    *retry_ms = 0;
    if (first->key != NULL)
        dlock__etcd_lease_left(be, c, first->lease, retry_ms);
    free(first->key);
    first->key = NULL;
    return DLOCK_EBUSY;
}

/* A lease confirmed alive this recently is taken by a try without a
 * keepalive, counted from that confirmation: a twentieth of its TTL, at
 * most 500 ms. */
static int64_t fresh_ms(int64_t ttl)
{
    return ttl * 1000 / 20 < 500 ? ttl * 1000 / 20 : 500;
}

/*
 * Try once, for a caller that will not wait: take the lock only if the
 * directory is empty (no holder, nobody queued), so that a try never jumps
 * the queue and never leaves a key behind. The key goes on a lease of the
 * source (etcd_lease.c): a spare granted ahead of need makes this one round
 * trip and one raft write (the put, in the acquire txn). A lease confirmed
 * within fresh_ms is taken with the put alone, and the core counts the
 * lease from that confirmation (*lease_from_ms), not from this call: the
 * lock then lasts up to fresh_ms (5%) less than asked on the client, never
 * longer on the server. A lease that ran out before its put: another, by a
 * grant. A busy lock gives the lease back.
 */
static int try_once(dlock__etcd_be *be, dlock__etcd_conn *c, const dlock__etcd_keys *k,
                    const char *owner, int session, uint64_t *fence, int64_t *retry_ms,
                    int64_t *lease_from_ms)
{
    dlock__etcd_keys on = *k;
    dlock__etcd_lease l;
    dlock__etcd_kv first;
    json_t *reply = NULL;
    int64_t since = dlock__now_ms() - fresh_ms(k->ttl);
    int rc = DLOCK__ETCD_LEASE_GONE, how = DLOCK__ETCD_TAKE_ANY;

    dlock__etcd_lease_init(&l, k->lease, k->ttl);
    l.session = session;
    l.key = k->key;
    for (; rc == DLOCK__ETCD_LEASE_GONE; how = DLOCK__ETCD_TAKE_GRANT) {
        if ((rc = dlock__etcd_lease_take(be, c, &l, how)) != DLOCK_OK)
            return rc;
        on.lease = l.id;
        rc = dlock__etcd_lease_txn(be, c, &l, since, acquire_txn(&on), &reply);
    }
    if (rc == DLOCK_OK)
        rc = acquire_reply(be, &on, reply, fence, &first);
    if (rc == DLOCK_OK) {
        if (l.ok_ms < *lease_from_ms)
            *lease_from_ms = l.ok_ms;
        return dlock__etcd_lease_hold(be, owner, &l);
    }
    if (rc != DLOCK_EBUSY) {
        /* Not known whether the put was done: the core gives back by
         * token (a delete by the key's name). */
        dlock__etcd_lease_drop(be, &l);
        return rc;
    }
    dlock__etcd_lease_give_back(be, c, &l);
    return busy(be, c, &first, retry_ms);
}

int dlock__etcd_try_begin(dlock__etcd_be *be, const dlock__etcd_keys *k, int session,
                          dlock__etcd_lease *l, json_t **txn)
{
    dlock__etcd_keys on = *k;

    *txn = NULL;
    dlock__etcd_lease_init(l, k->lease, k->ttl);
    l->session = session;
    l->key = k->key;
    if (dlock__etcd_lease_take(be, NULL, l, DLOCK__ETCD_TAKE_READY) != DLOCK_OK)
        return DLOCK_ENOTSUP;
    if (l->ok_ms < dlock__now_ms() - fresh_ms(k->ttl)) {
        dlock__etcd_lease_give_back(be, NULL, l);
        return DLOCK_ENOTSUP;
    }
    on.lease = l->id;
    if ((*txn = acquire_txn(&on)) == NULL) {
        dlock__etcd_lease_give_back(be, NULL, l);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    return DLOCK_OK;
}

int dlock__etcd_try_end(dlock__etcd_be *be, const dlock__etcd_keys *k, dlock__etcd_lease *l,
                        const char *owner, json_t *reply, uint64_t *fence,
                        int64_t *lease_from_ms, int64_t *holder_lease)
{
    dlock__etcd_keys on = *k;
    dlock__etcd_kv first;
    int rc;

    on.lease = l->id;
    *holder_lease = 0;
    rc = acquire_reply(be, &on, reply, fence, &first);
    if (rc == DLOCK_OK) {
        if (l->ok_ms < *lease_from_ms)
            *lease_from_ms = l->ok_ms;
        return dlock__etcd_lease_hold(be, owner, l);
    }
    if (rc != DLOCK_EBUSY) {
        dlock__etcd_lease_drop(be, l);
        return rc;
    }
    dlock__etcd_lease_give_back(be, NULL, l);
    if (first.key != NULL)
        *holder_lease = first.lease;
    free(first.key);
    return DLOCK_EBUSY;
}

/* Put our key at the end of the queue (or find it there, after a lost
 * reply): sets w->myrev and *first to the holder. */
static int enqueue(dlock__etcd_be *be, dlock__etcd_conn *c, dlock__etcd_watch *w,
                   dlock__etcd_kv *first)
{
    const dlock__etcd_keys *k = &w->k;
    json_t *reply = NULL;
    dlock__etcd_kv mine;
    int rc, found;

    for (int attempt = 0;; attempt++) {
        rc = dlock__etcd_be_call(
            be, c, "/v3/kv/txn",
            json_pack("{s:[{s:o, s:s, s:s, s:I}], s:[{s:{s:o, s:o, s:I}}, o], s:[o, o]}", "compare",
                      "key", dlock__etcd_str(k->key), "target", "CREATE", "result", "EQUAL",
                      "create_revision", (json_int_t)0, "success", "request_put", "key",
                      dlock__etcd_str(k->key), "value", dlock__etcd_str(k->value), "lease",
                      (json_int_t)k->lease, dlock__etcd_as_op(dlock__etcd_range_first(k)),
                      "failure", dlock__etcd_as_op(dlock__etcd_range_key(k->key)),
                      dlock__etcd_as_op(dlock__etcd_range_first(k))),
            &reply);
        if (rc == DLOCK_ESERVER && c->grpc_code == DLOCK__GRPC_NOT_FOUND && attempt == 0) {
            /* "requested lease not found": it ran out while we were not
             * looking (a stall); a new one (the waiting lease: whichever
             * the client's waiters now share; else with the same ID). */
            w->granted = 0;
            int64_t sent = dlock__now_ms();
            if (w->shared_wait) {
                dlock__etcd_waiting_seen(be, k->lease, 0, 0);
                rc = dlock__etcd_waiting_get(be, c, w, k->ttl, &w->k.lease, &sent);
            } else {
                rc = dlock__etcd_grant(be, c, k->lease, k->ttl);
            }
            if (rc != DLOCK_OK)
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
        found = dlock__etcd_read_kv(be, dlock__etcd_txn_op(reply, 1, "response_range"), first,
                                    "the enqueue txn");
    } else {
        found = dlock__etcd_read_kv(be, dlock__etcd_txn_op(reply, 0, "response_range"), &mine,
                                    "the enqueue txn");
        if (found == 1)
            w->myrev = mine.create_revision;
        free(mine.key);
        if (found == 1)
            found = dlock__etcd_read_kv(be, dlock__etcd_txn_op(reply, 1, "response_range"), first,
                                        "the enqueue txn");
        else if (found == 0)
            found = dlock__etcd_bad_reply(be, "the enqueue txn (our key vanished)");
    }
    json_decref(reply);
    if (found < 0)
        return found;
    if (found == 0 || w->myrev <= 0) {
        free(first->key);
        first->key = NULL;
        return dlock__etcd_bad_reply(be, "the enqueue txn (empty queue after our put)");
    }
    return DLOCK_OK;
}

/* The guarded put that moves our key (create revision w->myrev) onto
 * lease, keeping its value and revision. first: only if our key is also the
 * first of the directory (a compare over its range: no key's create
 * revision is below ours). */
static json_t *move_txn(const dlock__etcd_watch *w, int64_t lease, int first)
{
    json_t *txn = json_pack(
        "{s:[{s:o, s:s, s:s, s:I}], s:[{s:{s:o, s:b, s:I}}]}", "compare", "key",
        dlock__etcd_str(w->k.key), "target", "CREATE", "result", "EQUAL", "create_revision",
        (json_int_t)w->myrev, "success", "request_put", "key", dlock__etcd_str(w->k.key),
        "ignore_value", 1, "lease", (json_int_t)lease);
    json_t *cmp = first ? json_pack("{s:o, s:o, s:s, s:s, s:I}", "key", dlock__etcd_str(w->k.dir),
                                    "range_end", dlock__etcd_str(w->k.dir_end), "target",
                                    "CREATE", "result", "GREATER", "create_revision",
                                    (json_int_t)(w->myrev - 1))
                        : NULL;

    if (first && (txn == NULL || cmp == NULL ||
                  json_array_append_new(json_object_get(txn, "compare"), cmp) != 0)) {
        json_decref(txn);
        return NULL;
    }
    return txn;
}

/* move with first set: our key was not first, or is gone. */
#define NOT_FIRST 3

/*
 * Move our key onto the holder's lease, taken from the source (how), in
 * the move txn, with the lease known alive from now on (after the core
 * noted the time of this try), so that the server's lease outlasts the
 * core's deadline: a spare gets a keepalive in the same round trip. Its
 * create revision, the fence, stays. Then the waiter leaves the waiting
 * lease (its other waiters keep it), or a short lease of its own, which
 * backs no key now, is revoked off the hand-off's path. DLOCK_OK;
 * DLOCK_ELOST when our key is gone (its short lease ran out in a stall);
 * DLOCK__ETCD_LEASE_NONE or _GONE when no lease was ready or it ran out
 * (the key still waits on its short lease, or went with it); or an error,
 * w->hold left for watch_end to give back. With first, the move is also
 * the check of a wake-up (try_queued): it is done only if our key is the
 * first of the directory, else NOT_FIRST.
 */
static int move(dlock__etcd_be *be, dlock__etcd_conn *c, dlock__etcd_watch *w, int how, int first)
{
    int64_t since = dlock__now_ms();
    json_t *reply = NULL;
    int rc, moved;

    if ((rc = dlock__etcd_lease_take(be, c, &w->hold, how)) != DLOCK_OK)
        return rc;
    rc = dlock__etcd_lease_txn(be, c, &w->hold, since, move_txn(w, w->hold.id, first), &reply);
    if (rc != DLOCK_OK)
        return rc;
    moved = json_is_true(json_object_get(reply, "succeeded"));
    json_decref(reply);
    if (!moved) {
        /* Our key is gone (or not first): the lease backs nothing. */
        dlock__etcd_lease_give_back(be, c, &w->hold);
        return first ? NOT_FIRST : DLOCK_ELOST;
    }
    if (w->shared_wait)
        dlock__etcd_waiting_leave(be, w); /* the others keep it */
    else
        dlock__etcd_revoke_later(be, c, w->k.lease);
    w->granted = 0;
    return DLOCK_OK;
}

/*
 * Our key reached the head of the queue on the short lease it waited on:
 * move it to the holder's lease (move), a spare when one is ready for the
 * plain kinds (the family's keys stay on leases of their own: their
 * release never gives one back), else granted now at its full length. A
 * spare that ran out before the move: a grant. Two or three raft writes on
 * the way to the lock, paid only when the holder's lease is longer than
 * WAIT_TTL_S.
 */
static int promote(dlock__etcd_be *be, dlock__etcd_conn *c, dlock__etcd_watch *w)
{
    int how = dlock__etcd_shared_kind(w->kind) ? DLOCK__ETCD_TAKE_GRANT : DLOCK__ETCD_TAKE_ANY;
    int rc = move(be, c, w, how, 0);

    if (rc == DLOCK__ETCD_LEASE_GONE)
        rc = move(be, c, w, DLOCK__ETCD_TAKE_GRANT, 0);
    return rc;
}

/* Our key holds: at the holder's lease (promote), and the fence is its
 * create revision. */
static int won(dlock__etcd_be *be, dlock__etcd_conn *c, dlock__etcd_watch *w, uint64_t *fence,
               int64_t *retry_ms)
{
    int rc;

    if (w->hold.own == w->k.lease) {
        /* The key waits on the holder's lease already. */
        w->hold.id = w->k.lease;
        w->hold.ok_ms = w->lease_ok_ms;
    } else if ((rc = promote(be, c, w)) != DLOCK_OK) {
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

/* A shared kind decides from reply (consumed), a txn reply of
 * dlock__etcd_look_ops. */
static int shared_decide(dlock__etcd_be *be, dlock__etcd_conn *c, dlock__etcd_watch *w,
                         json_t *reply, uint64_t *fence, int64_t *retry_ms)
{
    int decided = dlock__etcd_look_decide(be, w, reply, 0, w->myrev);

    json_decref(reply);
    if (decided < 0)
        return decided;
    if (decided == 1)
        return won(be, c, w, fence, retry_ms);
    /* Asleep until the watch says something changed; without a key to
     * watch (it went between our reads), look again at once. */
    *retry_ms = w->ahead != NULL ? INT64_MAX : 0;
    return DLOCK_EBUSY;
}

/* A plain kind decides from the first key of the directory, the key just
 * ahead of ours and the revision they were read at (first and ahead are
 * consumed). */
static int decide(dlock__etcd_be *be, dlock__etcd_conn *c, dlock__etcd_watch *w,
                  dlock__etcd_kv *first, dlock__etcd_kv *ahead, int64_t rev, uint64_t *fence,
                  int64_t *retry_ms)
{
    int mine = first->create_revision == w->myrev && dlock__etcd_same_key(first, w->k.key);

    free(first->key);
    free(w->ahead);
    free(w->ahead_end);
    w->ahead = w->ahead_end = NULL;
    if (mine) {
        free(ahead->key);
        return won(be, c, w, fence, retry_ms);
    }
    if (ahead->key != NULL && strlen(ahead->key) == ahead->key_len) {
        /* The watch from the next revision on cannot miss its deletion. */
        w->ahead = ahead->key;
        w->ahead_from = rev + 1;
        *retry_ms = INT64_MAX;
    } else {
        /* The key ahead left between our reads: look again at once. */
        free(ahead->key);
        *retry_ms = 0;
    }
    return DLOCK_EBUSY;
}

/*
 * The check of a key queued at w->myrev: the keepalive of its short lease
 * and a read-only txn (no raft write), at once: one round trip after the
 * wake-up, not two. The txn reads, at one revision, that our key is still
 * there with that revision, and what decides (the first key and the one
 * just ahead of ours, or for the shared kinds dlock__etcd_look_ops).
 * *reply: the txn's when the lease lives and our key is there; else NULL,
 * and w->myrev is 0 (it went: a stall, or an administrator broke it).
 */
static int check(dlock__etcd_be *be, dlock__etcd_conn *c, dlock__etcd_watch *w, int64_t sent,
                 json_t **reply)
{
    const dlock__etcd_keys *k = &w->k;
    char ka[48];
    json_t *look = dlock__etcd_shared_kind(w->kind)
                       ? dlock__etcd_look_ops(k, w->myrev)
                       : json_pack("[o, o]", dlock__etcd_as_op(dlock__etcd_range_first(k)),
                                   dlock__etcd_as_op(dlock__etcd_range_ahead(k, w->myrev)));
    json_t *txn = json_pack("{s:[{s:o, s:s, s:s, s:I}], s:o}", "compare", "key",
                            dlock__etcd_str(k->key), "target", "CREATE", "result", "EQUAL",
                            "create_revision", (json_int_t)w->myrev, "success", look);
    char *body = txn != NULL ? json_dumps(txn, JSON_COMPACT) : NULL;
    dlock__etcd_pair p = {{"/v3/lease/keepalive", "/v3/kv/txn"}, {ka, body}, {1, 0},
                          {NULL, NULL}, {0, 0}, {0, 0}};
    int rc, alive = -1;

    *reply = NULL;
    json_decref(txn);
    if (body == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    snprintf(ka, sizeof(ka), "{\"ID\":\"%" PRId64 "\"}", k->lease);
    rc = dlock__etcd_call_pair(be->http, c, &p);
    free(body);
    if (rc == DLOCK_OK)
        rc = dlock__etcd_keepalive_results(be, p.out[0], &k->lease, 1, &alive);
    if (rc == DLOCK_OK && alive < 0)
        rc = dlock__etcd_bad_reply(be, "lease keepalive (no answer for the lease)");
    json_decref(p.out[0]);
    if (rc != DLOCK_OK) {
        json_decref(p.out[1]);
        return rc;
    }
    if (w->shared_wait)
        dlock__etcd_waiting_seen(be, k->lease, alive, sent);
    if (alive)
        w->lease_ok_ms = sent;
    else
        w->granted = 0; /* the key went with the lease */
    w->keepalive_at = w->shared_wait ? INT64_MAX : w->lease_ok_ms + k->ttl * 1000 / 3;
    if (alive && json_is_true(json_object_get(p.out[1], "succeeded"))) {
        *reply = p.out[1];
    } else {
        json_decref(p.out[1]);
        w->myrev = 0;
    }
    return DLOCK_OK;
}

/*
 * Queue our key (again): on its short lease, kept alive when this try has
 * not (kept: check just did) and granted when it is not, then put at the
 * end of the queue (enqueue, *first the holder).
 */
static int join(dlock__etcd_be *be, dlock__etcd_conn *c, dlock__etcd_watch *w, int64_t sent,
                int kept, dlock__etcd_kv *first)
{
    const dlock__etcd_keys *k = &w->k;
    int rc, alive = 0;

    if (w->shared_wait) {
        /* The client's waiting lease, which the spare thread keeps alive
         * (none of the waiter's own, so no keepalive while it sleeps). A
         * lease other than the one our key was on: that one was found
         * gone, and our key with it. */
        int64_t lease = 0, ok = 0;
        if ((rc = dlock__etcd_waiting_get(be, c, w, k->ttl, &lease, &ok)) != DLOCK_OK)
            return rc;
        if (lease != k->lease)
            w->myrev = 0;
        w->k.lease = lease;
        w->granted = 1;
        w->lease_ok_ms = ok;
        w->keepalive_at = INT64_MAX;
        return enqueue(be, c, w, first);
    }
    if (w->granted && !kept) {
        if ((rc = dlock__etcd_keepalive(be, c, &k->lease, 1, &alive)) != DLOCK_OK)
            return rc;
        if (alive)
            w->lease_ok_ms = sent;
        else
            w->granted = 0;
    }
    if (!w->granted) {
        if ((rc = dlock__etcd_grant(be, c, k->lease, k->ttl)) != DLOCK_OK)
            return rc;
        w->granted = 1;
        w->lease_ok_ms = sent;
        w->myrev = 0;
    }
    w->keepalive_at = w->lease_ok_ms + k->ttl * 1000 / 3;
    return enqueue(be, c, w, first);
}

/*
 * A try of a waiting acquisition. The lease is refreshed in it (granted on
 * the first try, kept alive on later ones), after the core noted the time it
 * sent this try: the server's lease then runs out no earlier than the
 * deadline the core computes. On later tries the refresh goes together with
 * the read of the queue (check), and success needs both: the lease alive,
 * and our key first. So success is only reported while our key exists (etcd
 * 3.4's own lock did not check that after a wait). When a lease for the
 * holder is ready, the wake-up's check is the move itself: moved only if our
 * key is first (move with first).
 */
static int try_queued(dlock__etcd_be *be, dlock__etcd_conn *c, dlock__etcd_watch *w,
                      uint64_t *fence, int64_t *retry_ms)
{
    const dlock__etcd_keys *k = &w->k;
    dlock__etcd_kv first = {0}, ahead = {0};
    json_t *reply = NULL;
    int64_t sent = dlock__now_ms(), rev = 0;
    int rc, found, kept = 0, shared = dlock__etcd_shared_kind(w->kind);

    /* Woken by other than the watch (the waiting lease was found gone, an
     * interrupt, the engine's timer): the key to wait for is read again
     * below. */
    dlock__etcd_watch_settle(be, w);
    if (w->granted && w->myrev > 0 && !shared && w->hold.own != k->lease && w->hold.id == 0) {
        rc = move(be, c, w, DLOCK__ETCD_TAKE_READY, 1);
        if (rc == DLOCK_OK) {
            w->won = 1;
            *fence = (uint64_t)w->myrev;
            return DLOCK_OK;
        }
        if (rc != DLOCK__ETCD_LEASE_NONE && rc != DLOCK__ETCD_LEASE_GONE && rc != NOT_FIRST)
            return rc;
    }
    if (w->granted && w->myrev > 0) {
        if ((rc = check(be, c, w, sent, &reply)) != DLOCK_OK)
            return rc;
        kept = 1;
    }
    if (reply == NULL) {
        if ((rc = join(be, c, w, sent, kept, &first)) != DLOCK_OK)
            return rc;
        if (shared) {
            /* Who is ahead, and of which kind: one more read. */
            free(first.key);
            rc = dlock__etcd_be_call(
                be, c, "/v3/kv/txn",
                json_pack("{s:o}", "success", dlock__etcd_look_ops(k, w->myrev)), &reply);
            return rc != DLOCK_OK ? rc : shared_decide(be, c, w, reply, fence, retry_ms);
        }
        if (first.create_revision == w->myrev)
            return decide(be, c, w, &first, &ahead, 0, fence, retry_ms);
        /* Not first: find the key just ahead, to watch it. */
        rc = dlock__etcd_be_call(be, c, "/v3/kv/range", dlock__etcd_range_ahead(k, w->myrev),
                                 &reply);
        found = rc != DLOCK_OK ? rc
                               : dlock__etcd_read_kv(be, reply, &ahead,
                                                     "the range of the key ahead");
    } else if (shared) {
        return shared_decide(be, c, w, reply, fence, retry_ms);
    } else {
        found = dlock__etcd_read_kv(be, dlock__etcd_txn_op(reply, 0, "response_range"), &first,
                                    "the acquire txn");
        if (found == 1)
            found = dlock__etcd_read_kv(be, dlock__etcd_txn_op(reply, 1, "response_range"),
                                        &ahead, "the acquire txn");
    }
    rev = dlock__etcd_revision(reply);
    json_decref(reply);
    if (found < 0) {
        free(first.key);
        return found;
    }
    return decide(be, c, w, &first, &ahead, rev, fence, retry_ms);
}

/* value: what the key holds (NULL: the client name). */
int dlock__etcd_acquire_as(dlock__etcd_be *be, const char *name, const char *owner,
                           int64_t lease_ms, const char *value, int kind, int permits,
                           int session, dlock__etcd_watch *w, uint64_t *fence,
                           int64_t *retry_ms, int64_t *lease_from_ms)
{
    dlock__etcd_conn *c;
    dlock__etcd_keys k;
    int rc = DLOCK_OK;

    if (w != NULL && w->conn != NULL) {
        c = w->conn; /* taken at the end of the wait (etcd_wait.c) */
        w->conn = NULL;
    } else if ((rc = dlock__etcd_conn_get(be->http, &c)) != DLOCK_OK) {
        return rc;
    }
    if (w == NULL) {
        if ((rc = dlock__etcd_keys_make(&k, be, name, owner, lease_ms)) == DLOCK_OK) {
            if (value != NULL)
                k.value = value;
            if (kind == DLOCK_KIND_SEMAPHORE)
                rc = dlock__etcd_permits_ensure(be, c, &k, permits);
            if (rc == DLOCK_OK && dlock__etcd_shared_kind(kind))
                rc = dlock__etcd_try_shared(be, c, &k, kind, owner, fence, retry_ms);
            else if (rc == DLOCK_OK)
                rc = try_once(be, c, &k, owner, session, fence, retry_ms, lease_from_ms);
        }
        dlock__etcd_keys_free(&k);
    } else {
        if (w->k.key == NULL) {
            rc = dlock__etcd_keys_make(&w->k, be, name, owner, lease_ms);
            /* The key waits on the client's waiting lease (WAIT_TTL_S),
             * shared by its waiters (etcd_session.c), granted or found at
             * the first join. */
            dlock__etcd_lease_init(&w->hold, w->k.lease, w->k.ttl);
            if (rc == DLOCK_OK && w->k.ttl > WAIT_TTL_S) {
                w->k.ttl = WAIT_TTL_S;
                w->k.lease = 0;
                w->shared_wait = 1;
                /* The holder's lease, at the head: the session lease. */
                w->hold.session = session;
                w->hold.key = w->k.key;
            }
            if (rc == DLOCK_OK && value != NULL) {
                if ((w->value = strdup(value)) == NULL)
                    rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
                else
                    w->k.value = w->value;
            }
            w->kind = kind;
            w->permits = permits;
            if (rc == DLOCK_OK && kind == DLOCK_KIND_SEMAPHORE)
                rc = dlock__etcd_permits_ensure(be, c, &w->k, permits);
            if (rc != DLOCK_OK)
                dlock__etcd_keys_free(&w->k); /* the next try starts again */
        }
        if (rc == DLOCK_OK)
            rc = try_queued(be, c, w, fence, retry_ms);
        if (rc == DLOCK_OK)
            rc = dlock__etcd_lease_hold(be, owner, &w->hold);
        else if (rc == DLOCK_EBUSY && w->notify != NULL)
            dlock__etcd_watch_arm(be, w, retry_ms);
    }
    dlock__etcd_conn_put(be->http, c);
    return rc;
}
