/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The etcd backend: etcd v3 over gRPC (etcd_http.h), with a queue of keys
 * per lock like etcd's own concurrency.Mutex, and the holder's create
 * revision as the fence. docs/etcd.md tells the whole design; in short:
 *
 * Keys, for lock NAME and the default prefix "dlock/":
 *   dlock/NAME/<id>   one per acquisition (holder or waiter), <id> 16 hex
 *                     digits: the id of a key of this client's known
 *                     gone, lent for reuse (etcd_keys.c), else the first
 *                     half of the owner token; attached to the
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
 * one lock on behalf of another whose holder stopped renewing it. An
 * uncontended acquire puts its key on a spare lease granted ahead of need
 * (etcd_spare.c), so its path makes one raft write, and a release is one
 * delete of its key, after which the spare lease goes back to the pool, or
 * one revoke of the lease the acquisition holds (the client keeps a table
 * of them). Other leases have IDs derived from the owner token and the TTL, so
 * a retried grant or put after a lost reply finds its own earlier work
 * ("lease already exists", "key exists") instead of doing it twice.
 *
 * Connections: callers take one from the pool; the watchdog has its own; the
 * watches of waiting acquisitions and observers share one Watch stream, kept
 * by a thread of its own (etcd_watch_hub.c).
 *
 * The files of the backend, one job each, are listed in etcd_int.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/etcd/etcd_int.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/wait.h"

/* Key reads per renewal txn (etcd's default --max-txn-ops is 128). */
#define TXN_CHUNK 64
/* Key compares per renewal txn (etcd counts them apart from the ops). */
#define COMPARE_CHUNK 128

/* ---- open / close ----------------------------------------------------- */

static void etcd_close(void *arg)
{
    dlock__etcd_be *be = arg;

    if (be == NULL)
        return;
    dlock__etcd_sessions_free(be); /* revoked: before the pool goes */
    dlock__etcd_spares_free(be); /* revokes the spares: before the pool goes */
    dlock__etcd_waiting_free(be); /* after the thread that keeps it alive */
    dlock__etcd_loop_free(be->loop);
    pthread_mutex_destroy(&be->ids_mu);
    free(be->lent);
    dlock__etcd_conn_free(be->wd);
    dlock__etcd_free(be->http);
    free(be->prefix);
    free(be->value);
    free(be);
}

/*
 * Which etcd answers (Maintenance Status's version), once at open: before
 * 3.4.25 and 3.5.8 a leader cut off from the others, or stuck on its disk,
 * could renew a lease in a keepalive while the real leader let it run out
 * (etcd-io/etcd#15247). For those, and for a server whose version cannot be
 * read (an ACL, a proxy), each renewal is confirmed by the lease's TTL
 * (etcd_renew); acquire and release are as they are on any server.
 */
static void server_version(dlock__etcd_be *be, dlock__etcd_conn *c,
                           const dlock_client_options *opts)
{
    json_t *reply = NULL;
    const char *v = NULL;
    char msg[400];

    if (dlock__etcd_be_call(be, c, "/v3/maintenance/status", json_object(), &reply) ==
        DLOCK_OK)
        v = json_string_value(json_object_get(reply, "version"));
    be->confirm_renewals = !dlock__etcd_version_fixed(v);
    if (be->confirm_renewals && opts->log != NULL) {
        snprintf(msg, sizeof(msg), "%s: etcd %.32s%s: each lease renewal is confirmed by the "
                 "lease's TTL (etcd before 3.4.25 and 3.5.8 can renew on a stale leader; "
                 "docs/etcd.md)", dlock__etcd_where(be->http, dlock__etcd_current(be->http)),
                 v != NULL && strspn(v, "0123456789.-+abcdefghijklmnopqrstuvwxyz") == strlen(v)
                     ? v : "of unknown version",
                 v != NULL ? "" : " (Maintenance Status not answered)");
        opts->log(DLOCK_LOG_INFO, msg, opts->log_payload);
    }
    json_decref(reply);
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
    pthread_mutex_init(&be->ids_mu, NULL);
    dlock__etcd_sessions_init(be);
    dlock__etcd_waiting_init(be);
    be->prefix = strdup(opts->key_prefix != NULL ? opts->key_prefix : "dlock/");
    be->value = strdup(opts->client_name != NULL ? opts->client_name : "dlock");
    if (be->prefix == NULL || be->value == NULL) {
        rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
        goto err;
    }
    if ((rc = dlock__etcd_new(&be->http, url, opts)) != DLOCK_OK ||
        (rc = dlock__etcd_conn_new(be->http, &be->wd)) != DLOCK_OK ||
        (rc = dlock__etcd_loop_new(be->http, &be->loop)) != DLOCK_OK ||
        (rc = dlock__etcd_spares_new(be)) != DLOCK_OK ||
        (rc = dlock__etcd_connect(be->http)) != DLOCK_OK ||
        (rc = dlock__etcd_conn_get(be->http, &c)) != DLOCK_OK)
        goto err;
    /* Check now that an endpoint answers and lets us read our keys. */
    rc = dlock__etcd_be_call(
        be, c, "/v3/kv/range",
        json_pack("{s:o, s:b}", "key", dlock__etcd_str(be->prefix), "count_only", 1), &reply);
    json_decref(reply);
    if (rc == DLOCK_OK)
        server_version(be, c, opts);
    dlock__etcd_conn_put(be->http, c);
    if (rc != DLOCK_OK)
        goto err;
    dlock__clear_error();
    *out = be;
    return DLOCK_OK;

err:
    etcd_close(be);
    return rc;
}

/* ---- acquire ------------------------------------------------------------ */

/* A lock the watchdog renews, of the plain queue (not a reader, a
 * semaphore or an owner id's, which end by revoking their leases), goes on
 * the client's session lease of its TTL (etcd_session.c). */
int dlock__etcd_on_session(const dlock_request *req)
{
    return req->auto_renew && !dlock__etcd_shared_kind(req->kind) &&
           !dlock__etcd_owner_mode(req);
}

/* Every kind etcd serves (caps) is a queue of keys: the plain mutex, the
 * fair lock (the same queue: first come, first served), an election, whose
 * keys hold the candidates' identities, and the read-write lock and the
 * semaphore, whose keys' values say their kind (etcd_family.c). */
int dlock__etcd_key_value(dlock__etcd_be *be, const dlock_request *req, char **value)
{
    /* A lock key holds "CLIENT-NAME HOLDER" (the client name has no space),
     * written by the put that queues it: the holder record costs no round
     * trip. A candidate's key holds its identity, for observers. */
    const char *mark = req->kind == DLOCK_KIND_READ        ? "=r "
                       : req->kind == DLOCK_KIND_WRITE     ? "=w "
                       : req->kind == DLOCK_KIND_SEMAPHORE ? "=s "
                                                           : "";
    /* A reader's owner id ends its value (nested reads, upgrades refused:
     * etcd_family.c). */
    int owned = req->kind == DLOCK_KIND_READ && req->owner != NULL;

    *value = NULL;
    if (req->kind != DLOCK_KIND_LEADER &&
        asprintf(value, "%s%s%s%s%s%s", mark, be->value, req->holder != NULL ? " " : "",
                 req->holder != NULL ? req->holder : "", owned ? "\n" : "",
                 owned ? req->owner : "") < 0) {
        *value = NULL;
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    return DLOCK_OK;
}

static int acquire_keys(dlock__etcd_be *be, const dlock_request *req, void *watch,
                        dlock_acquire_result *out)
{
    char *value = NULL;
    int rc;

    if ((rc = dlock__etcd_key_value(be, req, &value)) != DLOCK_OK)
        return rc;
    if ((rc = dlock__etcd_owner_conflict(be, req)) != DLOCK_OK) {
        free(value);
        return rc;
    }
    /* An owner that holds the lock re-enters it (etcd_owner.c). */
    if ((rc = dlock__etcd_reenter(be, req, &out->fence)) != 0) {
        free(value);
        return rc == 1 ? DLOCK_OK : rc;
    }
    rc = dlock__etcd_acquire_as(be, req->name, req->token, req->lease_ms,
                                req->kind == DLOCK_KIND_LEADER ? req->identity : value, req->kind,
                                req->permits, dlock__etcd_on_session(req), watch, &out->fence,
                                &out->retry_ms, &out->lease_from_ms);
    free(value);
    if (rc == DLOCK_OK)
        rc = dlock__etcd_hold_add(be, req, out->fence);
    return rc;
}

/*
 * The key id of an acquisition (etcd_keys.c): lent at its first try, or
 * at its first try through a watch (a busy first try gave its id back).
 * A try that will not wait and failed for sure ends the loan; one whose
 * outcome is not known keeps it, as the core then gives the lock back with
 * release, which ends it (as does a watch left without the lock).
 */
static int etcd_acquire(void *arg, const dlock_request *req, void *watch,
                        dlock_acquire_result *out)
{
    dlock__etcd_be *be = arg;
    dlock__etcd_watch *w = watch;
    int rc;

    if (w == NULL || w->token[0] == '\0') {
        if (w != NULL)
            snprintf(w->token, sizeof(w->token), "%s", req->token);
        dlock__etcd_key_id_lend(be, req->token);
    }
    rc = acquire_keys(be, req, watch, out);
    if (w != NULL)
        w->took = rc == DLOCK_OK;
    else
        dlock__etcd_try_loan_end(be, req->token, req->kind, rc);
    return rc;
}

void dlock__etcd_try_loan_end(dlock__etcd_be *be, const char *token, int kind, int rc)
{
    if (rc == DLOCK_EBUSY && !dlock__etcd_shared_kind(kind)) {
        /* The acquire txn's compare failed: nothing was put, the id is
         * still known gone. (A shared kind's try may have put its key and
         * deleted it again.) */
        dlock__etcd_key_id_give_back(be, token);
    } else if (rc != DLOCK_OK && rc != DLOCK_ENOTSUP && !dlock__outcome_unknown(rc)) {
        dlock__etcd_key_id_drop(be, token);
    }
}

/* ---- release, extend, check --------------------------------------------- */

/*
 * Release by a revoke of the lease the acquisition holds, which deletes its
 * key with it: one raft write. "Lease not found" means the lease ran out or
 * was revoked (a force release), and the key went with it, unless an extend
 * whose reply was lost moved it to another lease: the delete below finds
 * out. One answer differs from a delete's: a key deleted by hand while its
 * lease lived (etcdctl del) is released without DLOCK_ELOST, as the
 * revoke cannot tell; the watchdog reports such a key lost (on_lost) within
 * a renewal period, and dlock_release then says DLOCK_ELOST.
 */
static int release_by_revoke(dlock__etcd_be *be, dlock__etcd_conn *c, int64_t lease)
{
    int rc = dlock__etcd_lease_revoke(be, c, lease);

    /* lease_revoke takes a lease already gone for done; c says which. */
    if (rc == DLOCK_OK && c->grpc_code == DLOCK__GRPC_NOT_FOUND)
        return DLOCK_ELOST;
    return rc;
}

/* release_by_delete could not tell: release as if it had not run. */
#define UNCLEAR 1

/*
 * Release an acquisition that holds a spare lease (bit 62, confirmed alive
 * at ok_ms) by a delete of its key, which is its alone: when the reply
 * shows the key deleted and on this lease, the lease backs no key any more
 * and goes back to the spare pool, so the next acquire of this TTL needs
 * no grant (docs/etcd.md, "Spare leases"). A key on another lease (an
 * extend whose reply was lost moved it) is deleted all the same, and both
 * leases are revoked. UNCLEAR when the call failed or found no key (gone
 * with its lease, deleted by hand, or deleted by this very request before
 * a lost reply and a retry): the caller then revokes the lease, as before.
 */
static int release_by_delete(dlock__etcd_be *be, dlock__etcd_conn *c, const char *owner,
                             const char *key, int64_t lease, int64_t ttl, int64_t ok_ms)
{
    json_t *reply = NULL;
    int rc;

    rc = dlock__etcd_be_call(be, c, "/v3/kv/deleterange", dlock__etcd_delete_request(key),
                             &reply);
    return dlock__etcd_release_deleted(be, c, owner, rc, reply, lease, ttl, ok_ms) == DLOCK_OK
               ? DLOCK_OK
               : UNCLEAR;
}

json_t *dlock__etcd_delete_request(const char *key)
{
    return json_pack("{s:o, s:b}", "key", dlock__etcd_str(key), "prev_kv", 1);
}

/* A revoke on c; c NULL: by the spare thread, off the loop's thread. A
 * session lease is never revoked (lease_revoke leaves it). */
static void revoke_on(dlock__etcd_be *be, dlock__etcd_conn *c, int64_t lease)
{
    if (DLOCK__ETCD_IS_SESSION(lease))
        return;
    if (c != NULL)
        dlock__etcd_lease_revoke(be, c, lease);
    else
        dlock__etcd_revoke_later(be, NULL, lease);
}

int dlock__etcd_release_deleted(dlock__etcd_be *be, dlock__etcd_conn *c, const char *owner,
                                int rc, json_t *reply, int64_t lease, int64_t ttl,
                                int64_t ok_ms)
{
    dlock__etcd_kv prev = {0};
    int64_t deleted = 0;

    if (rc != DLOCK_OK || dlock__etcd_int(reply, "deleted", &deleted) != 0 || deleted != 1 ||
        dlock__etcd_kv_in(reply, "prev_kvs", 0, &prev) != 1) {
        json_decref(reply);
        free(prev.key);
        return DLOCK_ENOTSUP;
    }
    json_decref(reply);
    free(prev.key);
    dlock__etcd_key_id_free(be, owner); /* the key is gone */
    if (prev.lease == lease) {
        dlock__etcd_spare_reuse(be, c, ttl, lease, ok_ms);
    } else {
        if (prev.lease != 0)
            revoke_on(be, c, prev.lease);
        revoke_on(be, c, lease);
    }
    return DLOCK_OK;
}

static int release_keys(dlock__etcd_be *be, const dlock_request *req)
{
    const char *name = req->name, *owner = req->token;
    dlock__etcd_conn *c;
    dlock__etcd_keys k;
    json_t *reply = NULL;
    int64_t lease = 0, ttl = 0, ok_ms = 0;
    int rc;

    if (dlock__etcd_owner_mode(req))
        return dlock__etcd_hold_release(be, req);
    dlock__etcd_held_take(be, owner, &lease, &ttl, &ok_ms);
    if ((rc = dlock__etcd_keys_make(&k, be, name, owner, 1)) != DLOCK_OK)
        return rc;
    if ((rc = dlock__etcd_conn_get(be->http, &c)) != DLOCK_OK) {
        dlock__etcd_keys_free(&k);
        return rc;
    }
    if (ok_ms > 0 && DLOCK__ETCD_IS_SPARE(lease) &&
        (rc = release_by_delete(be, c, owner, k.key, lease, ttl, ok_ms)) != UNCLEAR) {
        dlock__etcd_conn_put(be->http, c);
        dlock__etcd_keys_free(&k);
        return rc;
    }
    /* A session lease backs other locks too: its key is deleted below. */
    if (lease != 0 && !DLOCK__ETCD_IS_SESSION(lease) &&
        (rc = release_by_revoke(be, c, lease)) != DLOCK_ELOST) {
        /* The key was on that lease (an extend whose outcome is not known
         * leaves no lease in the table), so it went with it. */
        if (rc == DLOCK_OK)
            dlock__etcd_key_id_free(be, owner);
        dlock__etcd_conn_put(be->http, c);
        dlock__etcd_keys_free(&k);
        return rc;
    }
    /* Our key exists only while it is ours: its name is this owner's alone,
     * and it goes when its lease does. */
    rc = dlock__etcd_be_call(be, c, "/v3/kv/deleterange", dlock__etcd_delete_request(k.key),
                             &reply);
    rc = dlock__etcd_key_deleted(be, c, owner, rc, reply);
    dlock__etcd_conn_put(be->http, c);
    dlock__etcd_keys_free(&k);
    return rc;
}

int dlock__etcd_key_deleted(dlock__etcd_be *be, dlock__etcd_conn *c, const char *owner, int rc,
                            json_t *reply)
{
    dlock__etcd_kv prev = {0};
    int64_t deleted = 0;

    if (rc == DLOCK_OK &&
        (dlock__etcd_int(reply, "deleted", &deleted) != 0 ||
         (deleted > 0 && dlock__etcd_kv_in(reply, "prev_kvs", 0, &prev) != 1)))
        rc = dlock__etcd_bad_reply(be, "deleterange");
    json_decref(reply);
    if (rc == DLOCK_OK)
        dlock__etcd_key_id_free(be, owner); /* deleted now, or gone before */
    if (rc == DLOCK_OK && deleted == 0)
        rc = DLOCK_ELOST;
    /* No lock of this acquisition remains: end its lease now rather than
     * let it run out (not a session lease: lease_revoke leaves it). */
    if (rc == DLOCK_OK && prev.lease != 0)
        revoke_on(be, c, prev.lease);
    free(prev.key);
    return rc;
}

/* The acquisition ends here, whatever the answer: its key id's loan with it
 * (release_keys gave the id back when its key was seen to go). */
static int etcd_release(void *arg, const dlock_request *req)
{
    dlock__etcd_be *be = arg;
    int rc = release_keys(be, req);

    dlock__etcd_key_id_drop(be, req->token);
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
    if ((rc = dlock__etcd_hold_key(&k, req)) == DLOCK_OK &&
        (rc = dlock__etcd_conn_get(be->http, &c)) == DLOCK_OK) {
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
/*
 * On an etcd before 3.4.25 / 3.5.8 (be->confirm_renewals): a keepalive may
 * have been answered by a stale leader, which renews the lease in its own
 * lessor while the real leader counts it down. After a linearizable read
 * that follows the keepalive (the member has since confirmed it leads a
 * quorum, or stepped down and forwards to the leader), the lease's TTL is
 * the real leader's. A keepalive sent at sent stands only when that TTL,
 * read from when it was asked, covers the deadline the core will set, sent
 * + lease_ms, within etcd's granularity (whole seconds, cut down, so one
 * second is added). DLOCK_OK; DLOCK_ELOST for a lease the leader no longer
 * has; DLOCK_ESERVER for a TTL that falls short (the deadline does not
 * move: the watchdog tries again). One TimeToLive, on renewals and extends
 * only.
 */
/* The leader's TTL of lease, in whole seconds (-1: no such lease), read
 * at *asked. */
static int leader_ttl(dlock__etcd_be *be, dlock__etcd_conn *c, int64_t lease, int64_t *asked,
                      int64_t *ttl)
{
    json_t *reply = NULL;
    int rc;

    *asked = dlock__now_ms();
    *ttl = -1;
    rc = dlock__etcd_be_call(be, c, "/v3/lease/timetolive",
                             json_pack("{s:I}", "ID", (json_int_t)lease), &reply);
    /* TTL -1 (or NOT_FOUND): no such lease; 0: under a second left. */
    if (rc == DLOCK_OK && (dlock__etcd_int(reply, "TTL", ttl) != 0 || *ttl < -1 ||
                           *ttl > INT64_MAX / 1000 - 1))
        rc = dlock__etcd_bad_reply(be, "lease timetolive");
    json_decref(reply);
    if (rc == DLOCK_ESERVER && c->grpc_code == DLOCK__GRPC_NOT_FOUND)
        rc = DLOCK_OK, *ttl = -1;
    return rc;
}

/* Does the leader's TTL (leader_ttl) cover req's renewal sent at sent? */
static int ttl_covers(dlock__etcd_be *be, int64_t ttl, int64_t asked, int64_t sent,
                      const dlock_request *req)
{
    if (ttl < 0)
        return DLOCK_ELOST;
    if (asked + ttl * 1000 + 1000 < sent + req->lease_ms)
        return dlock__fail(DLOCK_ESERVER, "%s: lock '%s': the keepalive was answered but the "
                           "leader's lease has %lld ms left, short of the %lld ms renewed: "
                           "not renewed (a stale leader may have answered; etcd before "
                           "3.4.25 and 3.5.8)",
                           dlock__etcd_where(be->http, dlock__etcd_current(be->http)),
                           req->name, (long long)(ttl * 1000),
                           (long long)(sent + req->lease_ms - asked));
    return DLOCK_OK;
}

static int confirm_lease(dlock__etcd_be *be, dlock__etcd_conn *c, int64_t lease, int64_t sent,
                         const dlock_request *req)
{
    int64_t asked, ttl;
    int rc = leader_ttl(be, c, lease, &asked, &ttl);

    return rc == DLOCK_OK ? ttl_covers(be, ttl, asked, sent, req) : rc;
}

static int etcd_extend(void *arg, const dlock_request *req)
{
    dlock__etcd_be *be = arg;
    const char *name = req->name, *owner = req->token;
    int64_t lease_ms = req->lease_ms;
    dlock__etcd_conn *c;
    dlock__etcd_kv kv = {0};
    dlock__etcd_keys k;
    int64_t held = 0, held_ttl = 0;
    int rc, alive = 0;

    if (dlock__etcd_owner_mode(req))
        return dlock__etcd_hold_extend(be, req);
    if ((rc = dlock__etcd_keys_make(&k, be, name, owner, lease_ms)) != DLOCK_OK)
        return rc;
    dlock__etcd_held_get(be, owner, &held, &held_ttl);
    if ((rc = dlock__etcd_conn_get(be->http, &c)) != DLOCK_OK) {
        dlock__etcd_keys_free(&k);
        return rc;
    }
    rc = read_own_key(be, c, k.key, &kv);
    if (rc == 0) {
        rc = DLOCK_ELOST;
    } else if (rc == 1 && (kv.lease == k.lease || (kv.lease == held && held_ttl == k.ttl))) {
        /* The same TTL (a spare's of this length included): a keepalive. */
        int64_t sent = dlock__now_ms();
        rc = dlock__etcd_keepalive(be, c, &kv.lease, 1, &alive);
        if (rc == DLOCK_OK && !alive)
            rc = DLOCK_ELOST;
        if (rc == DLOCK_OK && be->confirm_renewals) {
            /* A linearizable read after the keepalive, then the TTL. */
            dlock__etcd_kv again = {0};
            rc = read_own_key(be, c, k.key, &again);
            free(again.key);
            rc = rc == 1 ? confirm_lease(be, c, kv.lease, sent, req) : rc == 0 ? DLOCK_ELOST : rc;
        }
        if (rc == DLOCK_OK)
            rc = dlock__etcd_held_set(be, owner, kv.lease, k.ttl);
        if (rc == DLOCK_OK)
            dlock__etcd_held_alive(be, owner, kv.lease, sent);
    } else if (rc == 1) {
        rc = move_to_lease(be, c, &k, &kv);
        /* Where the key is after a failure is not known: a release then
         * deletes it by name. */
        if (dlock__etcd_held_set(be, owner, rc == DLOCK_OK ? k.lease : 0, k.ttl) != DLOCK_OK)
            rc = DLOCK_ENOMEM;
    }
    free(kv.key);
    dlock__etcd_conn_put(be->http, c);
    dlock__etcd_keys_free(&k);
    return rc;
}

/* The leases of a renewal batch, each once: the locks on a session lease
 * share it (etcd_session.c), so a batch of 128 locks is one keepalive and,
 * on an etcd before 3.4.25, one TimeToLive, not 128 of each. */
typedef struct {
    int64_t *ids;  /* distinct lease IDs: the locks' first, then the spares' */
    int *alive;    /* per ID, from the keepalive */
    size_t n;
    size_t *of;    /* per lock: the index of its lease in ids */
} batch_leases;

static size_t lease_index(batch_leases *b, int64_t id)
{
    /* Most locks of a batch are on one session lease: look at the last
     * one added first. */
    for (size_t j = b->n; j-- > 0;)
        if (b->ids[j] == id)
            return j;
    b->ids[b->n] = id;
    return b->n++;
}

/* confirm the renewals still DLOCK_OK by each lease's leader TTL, read once
 * per lease after the renewal's txn (the linearizable read): ELOST per
 * lock, any other failure for all. */
static int confirm_renewals(dlock__etcd_be *be, dlock_renewal *items, size_t n,
                            const batch_leases *b, int64_t sent)
{
    int64_t *ttl = malloc(b->n * sizeof(*ttl)), *asked = malloc(b->n * sizeof(*asked));
    int rc = DLOCK_OK;

    if (ttl == NULL || asked == NULL) {
        free(ttl);
        free(asked);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    for (size_t j = 0; j < b->n; j++)
        asked[j] = 0; /* not read yet */
    for (size_t i = 0; i < n && rc == DLOCK_OK; i++) {
        size_t j = b->of[i];
        int r;
        if (items[i].result != DLOCK_OK)
            continue;
        if (asked[j] == 0 && (rc = leader_ttl(be, be->wd, b->ids[j], &asked[j], &ttl[j])) !=
                                 DLOCK_OK)
            break;
        r = ttl_covers(be, ttl[j], asked[j], sent, items[i].req);
        if (r == DLOCK_ELOST)
            items[i].result = DLOCK_ELOST;
        else if (r != DLOCK_OK)
            rc = r;
    }
    free(ttl);
    free(asked);
    return rc;
}

/*
 * 1 when every key of items [from, to) is on the lease its lock renews (a
 * txn of compares alone, which etcd serves as a linearizable read and
 * answers with one flag, so a batch of locks costs no key's decoding), 0
 * when one is not (gone, or moved), or an error.
 */
static int keys_on_leases(dlock__etcd_be *be, size_t from, size_t to,
                          const dlock__etcd_keys *keys, const batch_leases *b)
{
    json_t *cmp = json_array(), *reply = NULL;
    int rc;

    for (size_t i = from; cmp != NULL && i < to; i++) {
        json_t *one = json_pack("{s:o, s:s, s:s, s:I}", "key", dlock__etcd_str(keys[i].key),
                                "target", "LEASE", "result", "EQUAL", "lease",
                                (json_int_t)b->ids[b->of[i]]);
        if (json_array_append_new(cmp, one) != 0) {
            json_decref(cmp);
            cmp = NULL;
        }
    }
    if (cmp == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    rc = dlock__etcd_be_call(be, be->wd, "/v3/kv/txn", json_pack("{s:o}", "compare", cmp), &reply);
    if (rc == DLOCK_OK)
        rc = json_is_true(json_object_get(reply, "succeeded"));
    json_decref(reply);
    return rc;
}

/* Read the keys of items [from, to), TXN_CHUNK to a txn, and set each
 * result: ours when the key exists on the lease just renewed, alive. A key
 * on another lease is moved back (etcd_renew). */
static int read_keys(dlock__etcd_be *be, dlock_renewal *items, size_t from0, size_t to0,
                     dlock__etcd_keys *keys, const batch_leases *b)
{
    int rc = DLOCK_OK;

    for (size_t from = from0; from < to0 && rc == DLOCK_OK; from += TXN_CHUNK) {
        size_t to = from + TXN_CHUNK < to0 ? from + TXN_CHUNK : to0;
        json_t *ops = json_array(), *reply = NULL;
        for (size_t i = from; ops != NULL && i < to; i++) {
            json_t *op = dlock__etcd_as_op(dlock__etcd_range_key(keys[i].key));
            if (json_array_append_new(ops, op) != 0) {
                json_decref(ops);
                ops = NULL;
            }
        }
        if (ops == NULL)
            return dlock__fail(DLOCK_ENOMEM, "out of memory");
        rc = dlock__etcd_be_call(be, be->wd, "/v3/kv/txn", json_pack("{s:o}", "success", ops),
                                 &reply);
        for (size_t i = from; rc == DLOCK_OK && i < to; i++) {
            dlock__etcd_kv kv;
            int64_t lease = b->ids[b->of[i]];
            int found = dlock__etcd_kv_at(dlock__etcd_txn_op(reply, i - from, "response_range"),
                                          0, &kv);
            if (found < 0) {
                rc = dlock__etcd_bad_reply(be, "the renewal txn");
                break;
            }
            if (found != 1 || !dlock__etcd_same_key(&kv, keys[i].key))
                items[i].result = DLOCK_ELOST;
            else if (kv.lease == lease)
                items[i].result = b->alive[b->of[i]] == 1 ? DLOCK_OK : DLOCK_ELOST;
            else {
                int moved = move_to_lease(be, be->wd, &keys[i], &kv);
                dlock__etcd_held_set(be, items[i].req->token, moved == DLOCK_OK ? keys[i].lease : 0,
                                     keys[i].ttl);
                if (moved == DLOCK_OK || moved == DLOCK_ELOST)
                    items[i].result = moved;
                else
                    rc = moved;
            }
            free(kv.key);
        }
        json_decref(reply);
    }
    return rc;
}

/* Check every renewed lock's key: COMPARE_CHUNK at a time by compares
 * alone (keys_on_leases), and the keys of a chunk that fails one by one
 * (read_keys), to tell which. */
static int renew_keys(dlock__etcd_be *be, dlock_renewal *items, size_t n, dlock__etcd_keys *keys,
                      const batch_leases *b)
{
    int rc = DLOCK_OK;

    for (size_t from = 0; from < n && rc == DLOCK_OK; from += COMPARE_CHUNK) {
        size_t to = from + COMPARE_CHUNK < n ? from + COMPARE_CHUNK : n;

        if ((rc = keys_on_leases(be, from, to, keys, b)) == 1) {
            for (size_t i = from; i < to; i++)
                items[i].result = b->alive[b->of[i]] == 1 ? DLOCK_OK : DLOCK_ELOST;
            rc = DLOCK_OK;
        } else if (rc == 0) {
            rc = read_keys(be, items, from, to, keys, b);
        }
    }
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
    batch_leases b = {0};
    int64_t sent = dlock__now_ms();
    size_t locks;
    int rc = DLOCK_OK;

    /* The locks' leases, then the spares' (etcd_spare.c), in one request. */
    b.ids = calloc(n + DLOCK__ETCD_SPARE_IDS, sizeof(*b.ids));
    b.alive = calloc(n + DLOCK__ETCD_SPARE_IDS, sizeof(*b.alive));
    b.of = calloc(n, sizeof(*b.of));
    if (keys == NULL || b.ids == NULL || b.alive == NULL || b.of == NULL) {
        rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n && rc == DLOCK_OK; i++) {
        int64_t held = 0, held_ttl = 0;
        rc = dlock__etcd_keys_make(&keys[i], be, items[i].req->name, items[i].req->token,
                                   items[i].req->lease_ms);
        if (rc == DLOCK_OK)
            rc = dlock__etcd_hold_key(&keys[i], items[i].req);
        /* A spare's or session's lease (of this TTL), else the one derived
         * from the token. */
        dlock__etcd_held_get(be, items[i].req->token, &held, &held_ttl);
        b.of[i] = lease_index(&b, held != 0 && held_ttl == keys[i].ttl ? held : keys[i].lease);
    }
    locks = b.n;
    if (rc == DLOCK_OK) {
        b.n += dlock__etcd_spares_alive(be, b.ids + b.n, DLOCK__ETCD_SPARE_IDS);
        rc = dlock__etcd_keepalive(be, be->wd, b.ids, b.n, b.alive);
    }
    /* (The last confirmation of a spare, for its release; a session
     * lease's release does not need it.) */
    for (size_t i = 0; rc == DLOCK_OK && i < n; i++)
        if (b.alive[b.of[i]] == 1 && !DLOCK__ETCD_IS_SESSION(b.ids[b.of[i]]))
            dlock__etcd_held_alive(be, items[i].req->token, b.ids[b.of[i]], sent);
    for (size_t j = 0; rc == DLOCK_OK && j < locks; j++)
        if (DLOCK__ETCD_IS_SESSION(b.ids[j]))
            dlock__etcd_session_seen(be, b.ids[j], b.alive[j] == 1, sent);
    for (size_t j = locks; rc == DLOCK_OK && j < b.n; j++)
        dlock__etcd_spare_renewed(be, b.ids[j], b.alive[j] == 1, sent);
    if (rc == DLOCK_OK)
        rc = renew_keys(be, items, n, keys, &b);
    if (rc == DLOCK_OK && be->confirm_renewals)
        rc = confirm_renewals(be, items, n, &b, sent);
done:
    for (size_t i = 0; keys != NULL && i < n; i++)
        dlock__etcd_keys_free(&keys[i]);
    free(keys);
    free(b.ids);
    free(b.alive);
    free(b.of);
    return rc;
}

static const char *const etcd_schemes[] = {"etcd", "etcds", NULL};

/* Designated: every optional call is served. */
const dlock_backend dlock__etcd_backend = {
    .version = DLOCK_BACKEND_VERSION,
    .size = sizeof(dlock_backend),
    .name = "etcd",
    .schemes = etcd_schemes,
    .caps = DLOCK_CAP_KIND(DLOCK_KIND_MUTEX) | DLOCK_CAP_KIND(DLOCK_KIND_FAIR) |
            DLOCK_CAP_KIND(DLOCK_KIND_LEADER) | DLOCK_CAP_KIND(DLOCK_KIND_READ) |
            DLOCK_CAP_KIND(DLOCK_KIND_WRITE) | DLOCK_CAP_KIND(DLOCK_KIND_SEMAPHORE) |
            DLOCK_CAP_OWNER_IDS,
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
    .status = dlock__etcd_status,
    .force_release = dlock__etcd_force_release,
    .list = dlock__etcd_list,
    .holders = dlock__etcd_holders,
    .downgrade = dlock__etcd_downgrade,
    .set_permits = dlock__etcd_set_permits,
    .multi_atomic = dlock__etcd_multi_atomic,
    .multi_acquire = dlock__etcd_multi_acquire,
    .leader_get = dlock__etcd_leader_get,
    .observe_begin = dlock__etcd_observe_begin,
    .watch_notify = dlock__etcd_watch_notify,
    .start = dlock__etcd_start,
    .async_fds = dlock__etcd_async_fds,
    .async_step = dlock__etcd_async_step,
};
