/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Acquiring an etcd lock: a try that will not wait (only into an empty
 * directory), and the tries of a waiting acquisition, whose key holds its
 * place in the queue on a short lease of its own and moves to the holder's
 * lease at the head of the queue (promote). Waiting between the tries is in
 * etcd_wait.c.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/etcd/etcd_int.h"
#include "core/clock.h"
#include "core/error.h"

/* A waiter's key lives on a lease of this many seconds (or the holder's, if
 * shorter), kept alive every third of it while the waiter waits, and moved
 * to the holder's lease when it reaches the head of the queue: a waiter that
 * dies (SIGKILL, a lost machine) blocks the queue for this long, not for the
 * lease it asked for. etcd may round it up to its minimum TTL (1.5 x its
 * election timeout). */
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
        /* Our own put, whose reply was lost before a retry. */
        *fence = (uint64_t)first->create_revision;
        free(first->key);
        first->key = NULL;
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

/* try_spare could not use the spare: grant a lease as before. */
#define SPARE_GONE 1

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

/* A spare confirmed alive this recently is taken without a keepalive:
 * a twentieth of its TTL, at most 500 ms. */
static int64_t fresh_ms(int64_t ttl)
{
    return ttl * 1000 / 20 < 500 ? ttl * 1000 / 20 : 500;
}

/*
 * The acquire on a spare lease (etcd_spare.c), granted ahead of need: one
 * round trip, one raft write (the put, in the acquire txn).
 *
 * Why the server cannot let the key go before the client's deadline,
 * however long ago the spare was granted. etcd's leader sets a lease's
 * expiry to the time it handles a grant or keepalive plus the lease's TTL
 * (and a new leader to its own start plus the TTL: only later). The spare
 * was granted with this acquisition's TTL, ceil(lease_ms / 1000) s (etcd
 * only ever raises a TTL, to its minimum). So:
 *
 * - Confirmed alive by a request sent at ok_ms within fresh_ms (a release
 *   gave it back after a cycle, or the thread or the watchdog renewed it):
 *   the put alone, and the core counts the lease from ok_ms
 *   (*lease_from_ms), not from this call: the server's expiry is at least
 *   ok_ms + lease_ms, the client's deadline. The lock then lasts up to
 *   fresh_ms (5%) less than asked on the client, never longer on the
 *   server. A put on a lease that ran out fails ("requested lease not
 *   found"): SPARE_GONE.
 * - Else the txn and a keepalive of the spare, sent at once on two
 *   connections (a keepalive is no raft write: etcd's leader renews a lease
 *   in memory). The core counts the lease from *lease_from_ms, noted before
 *   this call; the keepalive is sent after that. The put and the keepalive
 *   may be handled in either order, and success needs both: the put done
 *   and the lease found alive. A lease that ran out between the two took
 *   the key with it, so the acquire falls back to a lease of its own
 *   (SPARE_GONE), as it does when the put finds the lease gone.
 */
static int try_spare(dlock__etcd_be *be, dlock__etcd_conn *c, const dlock__etcd_keys *k,
                     int64_t lease, int64_t ok_ms, const char *owner, uint64_t *fence,
                     int64_t *retry_ms, int64_t *lease_from_ms)
{
    dlock__etcd_keys on_spare = *k;
    dlock__etcd_kv first;
    int64_t sent = dlock__now_ms();
    dlock__etcd_pair p;
    int rc, alive;

    on_spare.lease = lease;
    if (sent - ok_ms <= fresh_ms(k->ttl)) {
        json_t *reply = NULL;
        rc = dlock__etcd_be_call(be, c, "/v3/kv/txn", acquire_txn(&on_spare), &reply);
        if (rc == DLOCK_ESERVER && c->grpc_code == DLOCK__GRPC_NOT_FOUND)
            return SPARE_GONE;
        /* Not known whether the put was done: the core gives back by
         * token (a delete by the key's name); the spare, which nothing
         * keeps alive any more, runs out by its TTL. */
        if (rc != DLOCK_OK)
            return rc;
        rc = acquire_reply(be, &on_spare, reply, fence, &first);
        sent = ok_ms;
        if (rc == DLOCK_OK && ok_ms < *lease_from_ms)
            *lease_from_ms = ok_ms;
    } else {
        rc = txn_and_keepalive(be, c, acquire_txn(&on_spare), lease, &p, &alive);
        if (p.rc[1] == DLOCK_ESERVER && p.grpc_code[1] == DLOCK__GRPC_NOT_FOUND) {
            /* "requested lease not found": the spare ran out unused. */
            json_decref(p.out[1]);
            return SPARE_GONE;
        }
        if (rc != DLOCK_OK || p.rc[0] != DLOCK_OK) {
            /* The core, seeing the error, does not count the lock as held: a
             * key the txn put on the spare goes with it now (best effort; else
             * when it runs out, as nothing keeps it alive). */
            if (p.rc[1] == DLOCK_OK && json_is_true(json_object_get(p.out[1], "succeeded")))
                dlock__etcd_lease_revoke(be, c, lease);
            json_decref(p.out[1]);
            return rc != DLOCK_OK ? rc : p.rc[0];
        }
        rc = acquire_reply(be, &on_spare, p.out[1], fence, &first);
        if (alive != 1) {
            /* Ran out between the put and the keepalive, with our key if the
             * put was done. */
            free(first.key);
            return SPARE_GONE;
        }
    }
    if (rc == DLOCK_OK && (rc = dlock__etcd_held_set(be, owner, lease, k->ttl)) == DLOCK_OK)
        dlock__etcd_held_alive(be, owner, lease, sent); /* a release may reuse it */
    if (rc == DLOCK_EBUSY) {
        /* Unused, and alive as of sent: the next acquire's spare. */
        dlock__etcd_spare_return(be, c, k->ttl, lease, sent);
        return busy(be, c, &first, retry_ms);
    }
    return rc;
}

/*
 * Try once, for a caller that will not wait: take the lock only if the
 * directory is empty (no holder, nobody queued), so that a try never jumps
 * the queue and never leaves a key behind. On a spare lease when there is
 * one (try_spare); else the lease is granted first (the put needs it) and
 * revoked again when the lock is busy.
 */
static int try_once(dlock__etcd_be *be, dlock__etcd_conn *c, const dlock__etcd_keys *k,
                    const char *owner, uint64_t *fence, int64_t *retry_ms, int64_t *lease_from_ms)
{
    dlock__etcd_kv first;
    int64_t spare, ok_ms;
    int rc;

    if (dlock__etcd_spare_take(be, k->ttl, &spare, &ok_ms)) {
        rc = try_spare(be, c, k, spare, ok_ms, owner, fence, retry_ms, lease_from_ms);
        if (rc != DLOCK_EBUSY) /* EBUSY gave it back */
            dlock__etcd_spare_used(be, k->ttl);
        if (rc != SPARE_GONE)
            return rc;
    }
    if ((rc = dlock__etcd_grant(be, c, k->lease, k->ttl)) != DLOCK_OK)
        return rc;
    json_t *reply = NULL;
    rc = dlock__etcd_be_call(be, c, "/v3/kv/txn", acquire_txn(k), &reply);
    if (rc != DLOCK_OK)
        return rc;
    rc = acquire_reply(be, k, reply, fence, &first);
    if (rc == DLOCK_OK)
        return dlock__etcd_held_set(be, owner, k->lease, k->ttl);
    if (rc != DLOCK_EBUSY)
        return rc;
    dlock__etcd_lease_revoke(be, c, k->lease);
    return busy(be, c, &first, retry_ms);
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
             * looking (a stall); a new one with the same ID. */
            w->granted = 0;
            int64_t sent = dlock__now_ms();
            if ((rc = dlock__etcd_grant(be, c, k->lease, k->ttl)) != DLOCK_OK)
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

/* promote_on_spare with first set: our key was not first, or is gone. */
#define NOT_FIRST 2

/*
 * Promote onto a spare lease of the holder's TTL instead of a grant: the
 * move txn and a keepalive of the spare in one round trip, as try_spare
 * does, so the spare counts from now (after the core noted the time of
 * this try) and one raft write is saved. Only for the plain kinds, whose
 * release may give the lease back to the pool (the family's keys stay on
 * leases of their own). DLOCK_OK with w->hold_lease the spare; DLOCK_ELOST
 * when our key is gone; SPARE_GONE when there was no spare or it ran out
 * before the put (the key still waits on its short lease): grant as before.
 * With first, the move is also the check of a wake-up (try_queued): it is
 * done only if our key is the first of the directory, else NOT_FIRST.
 */
static int promote_on_spare(dlock__etcd_be *be, dlock__etcd_conn *c, dlock__etcd_watch *w,
                            int first)
{
    int64_t lease, ok_ms, sent = dlock__now_ms();
    dlock__etcd_pair p;
    int rc, alive, moved;

    if (dlock__etcd_shared_kind(w->kind) ||
        !dlock__etcd_spare_take(be, w->hold_ttl, &lease, &ok_ms))
        return SPARE_GONE;
    rc = txn_and_keepalive(be, c, move_txn(w, lease, first), lease, &p, &alive);
    moved = p.rc[1] == DLOCK_OK && json_is_true(json_object_get(p.out[1], "succeeded"));
    if (p.rc[1] == DLOCK_ESERVER && p.grpc_code[1] == DLOCK__GRPC_NOT_FOUND) {
        /* "requested lease not found": the spare ran out unused. */
        json_decref(p.out[1]);
        dlock__etcd_spare_used(be, w->hold_ttl);
        return SPARE_GONE;
    }
    json_decref(p.out[1]);
    if (rc != DLOCK_OK || p.rc[0] != DLOCK_OK) {
        /* Where our key is, and whether the spare lives, is not known:
         * hold it as the holder's lease, for the error path to revoke. */
        dlock__etcd_spare_used(be, w->hold_ttl);
        w->hold_lease = lease;
        w->hold_granted = 1;
        return rc != DLOCK_OK ? rc : p.rc[0];
    }
    if (!moved) {
        /* Our key is gone (or not first): the spare is unused and just
         * renewed. */
        if (alive == 1)
            dlock__etcd_spare_return(be, c, w->hold_ttl, lease, sent);
        else
            dlock__etcd_spare_used(be, w->hold_ttl);
        return first ? NOT_FIRST : DLOCK_ELOST;
    }
    dlock__etcd_spare_used(be, w->hold_ttl);
    if (alive != 1) {
        /* It ran out after the put took our key onto it, and the key went
         * with it; or no answer said so: revoke it (best effort), so that
         * a key of ours on it, which nobody keeps alive, goes now. */
        dlock__etcd_lease_revoke(be, c, lease);
        return DLOCK_ELOST;
    }
    w->hold_lease = lease;
    w->hold_ok_ms = sent;
    /* The short lease backs no key now: revoked off the hand-off's path. */
    dlock__etcd_revoke_later(be, c, w->k.lease);
    w->granted = 0;
    return DLOCK_OK;
}

/*
 * Our key reached the head of the queue on the short lease it waited on:
 * move it to the holder's lease, granted now at its full length (after the
 * core noted the time of this try, so the server's lease outlasts the core's
 * deadline), keeping its create revision, which is the fence; then revoke
 * the short lease, which has nothing left on it, so that a release leaves no
 * lease behind. DLOCK_ELOST when the key went meanwhile (its short lease ran
 * out in a stall). Three raft writes on the way to the lock, paid only when
 * the holder's lease is longer than WAIT_TTL_S.
 */
static int promote(dlock__etcd_be *be, dlock__etcd_conn *c, dlock__etcd_watch *w)
{
    const dlock__etcd_keys *k = &w->k;
    json_t *reply = NULL;
    int rc, alive = 0;

    if ((rc = promote_on_spare(be, c, w, 0)) != SPARE_GONE)
        return rc;
    w->hold_granted = 1;
    rc = dlock__etcd_be_call(
        be, c, "/v3/lease/grant",
        json_pack("{s:I, s:I}", "ID", (json_int_t)w->hold_lease, "TTL", (json_int_t)w->hold_ttl),
        &reply);
    json_decref(reply);
    reply = NULL;
    if (rc == DLOCK_ESERVER && c->grpc_code == DLOCK__GRPC_FAILED_PRECONDITION &&
        strstr(c->grpc_message, "exists") != NULL) {
        /* Ours from an earlier try whose reply was lost: refresh it to its
         * full length. */
        rc = dlock__etcd_keepalive(be, c, &w->hold_lease, 1, &alive);
        if (rc == DLOCK_OK && !alive)
            rc = dlock__etcd_bad_reply(be, "lease keepalive (the lease just granted is gone)");
    }
    if (rc != DLOCK_OK)
        return rc;
    rc = dlock__etcd_be_call(be, c, "/v3/kv/txn", move_txn(w, w->hold_lease, 0), &reply);
    if (rc == DLOCK_OK && !json_is_true(json_object_get(reply, "succeeded")))
        rc = DLOCK_ELOST;
    json_decref(reply);
    if (rc == DLOCK_ELOST) {
        dlock__etcd_lease_revoke(be, c, w->hold_lease); /* nothing is attached to it */
        w->hold_granted = 0;
    } else if (rc == DLOCK_OK && dlock__etcd_lease_revoke(be, c, k->lease) == DLOCK_OK) {
        w->granted = 0;
    }
    return rc;
}

/* Our key holds: at the holder's lease (promote), and the fence is its
 * create revision. */
static int won(dlock__etcd_be *be, dlock__etcd_conn *c, dlock__etcd_watch *w, uint64_t *fence,
               int64_t *retry_ms)
{
    int rc;

    if (w->hold_lease != w->k.lease && (rc = promote(be, c, w)) != DLOCK_OK) {
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

/* What dlock__etcd_look_decide said (decided) for a shared kind. */
static int shared_decided(dlock__etcd_be *be, dlock__etcd_conn *c, dlock__etcd_watch *w,
                          int decided, uint64_t *fence, int64_t *retry_ms)
{
    if (decided < 0)
        return decided;
    if (decided == 1)
        return won(be, c, w, fence, retry_ms);
    /* Asleep until the watch says something changed; without a key to
     * watch (it went between our reads), look again at once. */
    *retry_ms = w->ahead != NULL ? INT64_MAX : 0;
    return DLOCK_EBUSY;
}

/*
 * A try of a waiting acquisition. The lease is refreshed in it (granted on
 * the first try, kept alive on later ones), after the core noted the time it
 * sent this try: the server's lease then runs out no earlier than the
 * deadline the core computes. One txn reads, at one revision, that our key is
 * still there with the revision we queued at, which key holds the lock, and
 * which is just ahead of ours; on later tries it goes together with the
 * keepalive, and success needs both: the lease alive, and our key first. So
 * success is only reported while our key exists (etcd 3.4's own lock did not
 * check that after a wait).
 */
static int try_queued(dlock__etcd_be *be, dlock__etcd_conn *c, dlock__etcd_watch *w,
                      uint64_t *fence, int64_t *retry_ms)
{
    const dlock__etcd_keys *k = &w->k;
    dlock__etcd_kv first = {0}, ahead = {0};
    json_t *reply = NULL;
    int64_t sent = dlock__now_ms(), rev;
    int rc, found, shared = dlock__etcd_shared_kind(w->kind);

    if (w->granted && w->myrev > 0 && !shared && w->hold_lease != k->lease && !w->hold_granted) {
        /* The wake-up's check and the promote in one txn, when a spare is
         * ready: moved only if our key is first, beside the spare's
         * keepalive (promote_on_spare). Else the check below. */
        rc = promote_on_spare(be, c, w, 1);
        if (rc == DLOCK_OK) {
            w->won = 1;
            *fence = (uint64_t)w->myrev;
            return DLOCK_OK;
        }
        if (rc == DLOCK_ELOST) {
            /* The spare ran out with our key just moved onto it: queue
             * again, at once. */
            w->myrev = 0;
            *retry_ms = 0;
            return DLOCK_EBUSY;
        }
        if (rc != SPARE_GONE && rc != NOT_FIRST)
            return rc;
    }
    if (w->granted && w->myrev > 0) {
        /* The keepalive and a read-only txn (no raft write), at once: one
         * round trip after the wake-up, not two. */
        char ka[48];
        json_t *look = shared ? dlock__etcd_look_ops(k, w->myrev)
                              : json_pack("[o, o]", dlock__etcd_as_op(dlock__etcd_range_first(k)),
                                          dlock__etcd_as_op(dlock__etcd_range_ahead(k, w->myrev)));
        json_t *txn = json_pack("{s:[{s:o, s:s, s:s, s:I}], s:o}", "compare", "key",
                                dlock__etcd_str(k->key), "target", "CREATE", "result", "EQUAL",
                                "create_revision", (json_int_t)w->myrev, "success", look);
        char *body = txn != NULL ? json_dumps(txn, JSON_COMPACT) : NULL;
        dlock__etcd_pair p = {{"/v3/lease/keepalive", "/v3/kv/txn"}, {ka, body}, {1, 0},
                              {NULL, NULL}, {0, 0}, {0, 0}};
        int alive = -1;

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
        reply = p.out[1];
        if (rc != DLOCK_OK) {
            json_decref(reply);
            return rc;
        }
        if (alive)
            w->lease_ok_ms = sent;
        else
            w->granted = 0; /* the key went with the lease */
        w->keepalive_at = w->lease_ok_ms + k->ttl * 1000 / 3;
        if (!alive || !json_is_true(json_object_get(reply, "succeeded"))) {
            /* Our key is gone (lease ran out in a stall, or an
             * administrator broke it): queue again. */
            json_decref(reply);
            reply = NULL;
            w->myrev = 0;
        } else if (shared) {
            rc = dlock__etcd_look_decide(be, w, reply, 0, w->myrev);
            json_decref(reply);
            return shared_decided(be, c, w, rc, fence, retry_ms);
        } else {
            found = dlock__etcd_read_kv(be, dlock__etcd_txn_op(reply, 0, "response_range"), &first,
                                        "the acquire txn");
            if (found == 1)
                found = dlock__etcd_read_kv(be, dlock__etcd_txn_op(reply, 1, "response_range"),
                                            &ahead, "the acquire txn");
            rev = dlock__etcd_revision(reply);
            json_decref(reply);
            if (found < 0) {
                free(first.key);
                return found;
            }
            goto decide;
        }
    } else if (w->granted) {
        int alive = 0;
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

    if ((rc = enqueue(be, c, w, &first)) != DLOCK_OK)
        return rc;
    if (shared) {
        /* Who is ahead, and of which kind: one more read. */
        free(first.key);
        rc = dlock__etcd_be_call(be, c, "/v3/kv/txn",
                                 json_pack("{s:o}", "success", dlock__etcd_look_ops(k, w->myrev)),
                                 &reply);
        if (rc != DLOCK_OK)
            return rc;
        rc = dlock__etcd_look_decide(be, w, reply, 0, w->myrev);
        json_decref(reply);
        return shared_decided(be, c, w, rc, fence, retry_ms);
    }
    if (first.create_revision != w->myrev) {
        /* Not first: find the key just ahead, to watch it. */
        rc = dlock__etcd_be_call(be, c, "/v3/kv/range", dlock__etcd_range_ahead(k, w->myrev),
                                 &reply);
        if (rc != DLOCK_OK) {
            free(first.key);
            return rc;
        }
        found = dlock__etcd_read_kv(be, reply, &ahead, "the range of the key ahead");
        rev = dlock__etcd_revision(reply);
        json_decref(reply);
        if (found < 0) {
            free(first.key);
            return found;
        }
    } else {
        rev = 0;
    }

decide:
    if (first.create_revision == w->myrev && dlock__etcd_same_key(&first, k->key)) {
        free(first.key);
        free(ahead.key);
        return won(be, c, w, fence, retry_ms);
    }
    free(first.key);
    free(w->ahead);
    free(w->ahead_end);
    w->ahead = w->ahead_end = NULL;
    if (ahead.key != NULL && strlen(ahead.key) == ahead.key_len) {
        /* The watch from the next revision on cannot miss its deletion. */
        w->ahead = ahead.key;
        w->ahead_from = rev + 1;
        *retry_ms = INT64_MAX;
    } else {
        /* The key ahead left between our reads: look again at once. */
        free(ahead.key);
        *retry_ms = 0;
    }
    return DLOCK_EBUSY;
}

/* value: what the key holds (NULL: the client name). */
int dlock__etcd_acquire_as(dlock__etcd_be *be, const char *name, const char *owner,
                           int64_t lease_ms, const char *value, int kind, int permits,
                           dlock__etcd_watch *w, uint64_t *fence, int64_t *retry_ms,
                           int64_t *lease_from_ms)
{
    dlock__etcd_conn *c;
    dlock__etcd_keys k;
    int rc = DLOCK_OK;

    if ((rc = dlock__etcd_conn_get(be->http, &c)) != DLOCK_OK)
        return rc;
    if (w == NULL) {
        if ((rc = dlock__etcd_keys_make(&k, be, name, owner, lease_ms)) == DLOCK_OK) {
            if (value != NULL)
                k.value = value;
            if (kind == DLOCK_KIND_SEMAPHORE)
                rc = dlock__etcd_permits_ensure(be, c, &k, permits);
            if (rc == DLOCK_OK && dlock__etcd_shared_kind(kind))
                rc = dlock__etcd_try_shared(be, c, &k, kind, owner, fence, retry_ms);
            else if (rc == DLOCK_OK)
                rc = try_once(be, c, &k, owner, fence, retry_ms, lease_from_ms);
        }
        dlock__etcd_keys_free(&k);
    } else {
        if (w->k.key == NULL) {
            rc = dlock__etcd_keys_make(&w->k, be, name, owner, lease_ms);
            /* The key waits on a short lease of its own (WAIT_TTL_S). */
            w->hold_ttl = w->k.ttl;
            w->hold_lease = w->k.lease;
            if (rc == DLOCK_OK && w->k.ttl > WAIT_TTL_S) {
                w->k.ttl = WAIT_TTL_S;
                w->k.lease = dlock__etcd_lease_for(owner, WAIT_TTL_S);
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
            rc = dlock__etcd_held_set(be, owner, w->hold_lease, w->hold_ttl);
        if (rc == DLOCK_OK && w->hold_ok_ms > 0) /* a spare: a release may reuse it */
            dlock__etcd_held_alive(be, owner, w->hold_lease, w->hold_ok_ms);
    }
    dlock__etcd_conn_put(be->http, c);
    return rc;
}
