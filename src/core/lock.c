/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The lock handle: acquire (try, then wait for a release without polling),
 * extend, check, release, and the accessors.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/options.h"
#include "core/wait.h"

int dlock__check_acquire_options(dlock_acquire_options *o, const dlock_acquire_options *given)
{
    int rc;

    if ((rc = dlock__acquire_options_copy(o, given)) != DLOCK_OK || given == NULL)
        return rc;
    if (o->lease_ms <= 0 || o->lease_ms > DLOCK_LEASE_MAX_MS)
        return dlock__fail(DLOCK_EINVAL, "acquire options: lease_ms is %lld, must be 1..%lld",
                           (long long)o->lease_ms, (long long)DLOCK_LEASE_MAX_MS);
    if (o->wait_ms < DLOCK_WAIT_FOREVER || o->wait_ms > DLOCK_LEASE_MAX_MS)
        return dlock__fail(DLOCK_EINVAL, "acquire options: wait_ms is %lld, must be -1 "
                           "(forever), 0 (try once) or up to %lld",
                           (long long)o->wait_ms, (long long)DLOCK_LEASE_MAX_MS);
    if (o->auto_renew != 0 && o->auto_renew != 1)
        return dlock__fail(DLOCK_EINVAL, "acquire options: auto_renew must be 0 or 1");
    /* The family (LEADER is let through for dlock_campaign, which checks). */
    if (o->kind < DLOCK_KIND_MUTEX || o->kind > DLOCK_KIND_LEADER)
        return dlock__fail(DLOCK_EINVAL, "acquire options: kind %d is not one of "
                           "DLOCK_KIND_MUTEX, _FAIR, _READ, _WRITE, _SEMAPHORE", o->kind);
    if (o->owner != NULL) {
        size_t n = strnlen(o->owner, DLOCK_OWNER_MAX + 1);
        if (n == 0 || n > DLOCK_OWNER_MAX)
            return dlock__fail(DLOCK_EINVAL, "acquire options: owner id must be 1..%d bytes",
                               DLOCK_OWNER_MAX);
        if (o->kind == DLOCK_KIND_SEMAPHORE || o->kind == DLOCK_KIND_LEADER)
            return dlock__fail(DLOCK_EINVAL, "acquire options: %s takes no owner id",
                               o->kind == DLOCK_KIND_SEMAPHORE ? "a semaphore" : "a campaign");
    }
    if (o->label != NULL) {
        size_t n = strnlen(o->label, DLOCK_LABEL_MAX + 1);
        if (n == 0 || n > DLOCK_LABEL_MAX)
            return dlock__fail(DLOCK_EINVAL, "acquire options: label must be 1..%d bytes",
                               DLOCK_LABEL_MAX);
        for (size_t i = 0; i < n; i++)
            if (o->label[i] < 0x20 || o->label[i] > 0x7e)
                return dlock__fail(DLOCK_EINVAL, "acquire options: label must be printable "
                                   "ASCII (byte %zu is 0x%02x)", i, (unsigned char)o->label[i]);
    }
    if (o->reentrant != 0 && o->reentrant != 1)
        return dlock__fail(DLOCK_EINVAL, "acquire options: reentrant must be 0 or 1");
    if (o->reentrant && o->owner == NULL)
        return dlock__fail(DLOCK_EINVAL, "acquire options: reentrant needs an owner id "
                           "(options.owner): it is the owner that re-enters");
    if (o->reentrant && o->kind != DLOCK_KIND_MUTEX && o->kind != DLOCK_KIND_FAIR)
        return dlock__fail(DLOCK_EINVAL, "acquire options: only DLOCK_KIND_MUTEX and "
                           "DLOCK_KIND_FAIR are reentrant");
    if (o->kind == DLOCK_KIND_SEMAPHORE ? (o->permits < 0 || o->permits > DLOCK_PERMITS_MAX)
                                        : o->permits != 0)
        return dlock__fail(DLOCK_EINVAL, o->kind == DLOCK_KIND_SEMAPHORE
                           ? "acquire options: permits is %d, must be 0..%d"
                           : "acquire options: permits is %d, but only a semaphore has "
                             "permits (%d at most)", o->permits, DLOCK_PERMITS_MAX);
    return DLOCK_OK;
}

void dlock__lock_free(dlock_lock *l)
{
    dlock__async_relay_free(l);
    free(l->name);
    free(l->owner);
    free(l->identity);
    free(l->holder);
    free(l->parts);
    free(l);
}

void dlock__lock_request(dlock_request *req, const dlock_lock *l)
{
    req->kind = l->kind;
    req->name = l->name;
    req->token = l->token;
    req->owner = l->owner;
    req->reentrant = l->reentrant;
    req->lease_ms = l->lease_ms;
    req->permits = l->permits;
    req->identity = l->identity;
    req->holder = l->holder;
    req->auto_renew = l->auto_renew;
}

int dlock__not_supported(const dlock_client *c, const char *what)
{
    return dlock__fail(DLOCK_ENOTSUP, "the %s backend does not implement %s", c->backend->name,
                       what);
}

static const char *kind_text(int kind)
{
    static const char *const text[] = {"a plain mutex", "fair locks", "read-write locks",
                                       "read-write locks", "semaphores", "leader election"};
    return kind >= 0 && kind <= DLOCK_KIND_LEADER ? text[kind] : "this kind";
}

/* The loop's view of one lock (core/wait.h). */
typedef struct {
    dlock_client *c;
    dlock_request req;
} single;

static int single_try(void *ctx, void *watch, dlock_acquire_result *res)
{
    single *s = ctx;
    dlock__call k;

    dlock__call_begin(s->c, &k, "acquire", s->req.name, 1, DLOCK__CALL_TIMED);
    return dlock__call_end(s->c, &k, s->c->backend->acquire(s->c->be, &s->req, watch, res));
}

static const dlock_request *single_busy(void *ctx, const dlock_acquire_result *res)
{
    (void)res;
    return &((single *)ctx)->req;
}

void dlock__give_back(dlock_client *c, const dlock_request *reqs, size_t n)
{
    char saved[512];

    snprintf(saved, sizeof(saved), "%s", dlock_error_message());
    for (size_t i = 0; i < n; i++) {
        dlock__call k;
        dlock__call_begin(c, &k, "release", reqs[i].name, 1, 0);
        dlock__call_end(c, &k, c->backend->release(c->be, &reqs[i]));
    }
    dlock__fail(DLOCK_OK, "%s", saved);
}

static void single_give_back(void *ctx)
{
    single *s = ctx;

    dlock__give_back(s->c, &s->req, 1);
}

int dlock__lock_supported(dlock_client *c, const dlock_lock *l)
{
    if (!(c->backend->caps & DLOCK_CAP_KIND(l->kind)))
        return dlock__not_supported(c, kind_text(l->kind));
    if (l->owner != NULL && !(c->backend->caps & DLOCK_CAP_OWNER_IDS))
        return dlock__not_supported(c, "owner ids (reentrant locks)");
    return DLOCK_OK;
}

/* Start l's lease bookkeeping at from_ms, when the winning request was sent:
 * the local deadline can then only be early, never late. */
void dlock__lock_start(dlock_lock *l, int64_t from_ms)
{
    atomic_store(&l->deadline_ms, from_ms + l->lease_ms);
    l->next_event_ms = l->auto_renew ? from_ms + dlock__renew_period(l->lease_ms)
                                     : from_ms + l->lease_ms;
    l->retry_count = 0;
}

_Static_assert(DLOCK_BACKEND_TOKEN_LEN == DLOCK__TOKEN_LEN, "the backend's token length");

int dlock__lock_new(dlock_lock **out, dlock_client *c, const char *name,
                    const dlock_acquire_options *o, const char *identity)
{
    dlock_lock *l;
    int rc;

    *out = NULL;
    l = calloc(1, sizeof(*l));
    if (l == NULL || (l->name = strdup(name)) == NULL ||
        (o->owner != NULL && (l->owner = strdup(o->owner)) == NULL) ||
        (identity != NULL && (l->identity = strdup(identity)) == NULL) ||
        (l->holder = dlock__holder_new(o->label)) == NULL) {
        if (l != NULL)
            dlock__lock_free(l);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    l->client = c;
    l->lease_ms = o->lease_ms;
    l->auto_renew = o->auto_renew;
    l->on_lost = o->on_lost;
    l->payload = o->payload;
    l->kind = o->kind;
    l->reentrant = o->reentrant;
    l->permits = o->permits;
    if ((rc = dlock__token_new(l->token)) != DLOCK_OK) {
        dlock__lock_free(l);
        return rc;
    }
    *out = l;
    return DLOCK_OK;
}

int dlock__acquire(dlock_lock **out, dlock_client *c, const char *name,
                   const dlock_acquire_options *o, const char *identity)
{
    dlock__attempt a = {single_try, single_busy, single_give_back, NULL, NULL};
    dlock_acquire_result res = {0};
    single s;
    dlock_lock *l;
    int rc;

    *out = NULL;
    if ((rc = dlock__lock_new(&l, c, name, o, identity)) != DLOCK_OK)
        return rc;
    if ((rc = dlock__lock_supported(c, l)) != DLOCK_OK)
        goto err;
    s.c = c;
    dlock__lock_request(&s.req, l);
    a.ctx = &s;
    a.queue_first = &s.req;
    if ((rc = dlock__acquire_loop(c, &a, o->wait_ms, &res)) != DLOCK_OK)
        goto err;
    l->fence = res.fence;
    dlock__lock_start(l, res.lease_from_ms);
    if ((rc = dlock__client_register(c, l)) != DLOCK_OK) {
        dlock__give_back(c, &s.req, 1);
        goto err;
    }
    *out = l;
    return DLOCK_OK;

err:
    dlock__lock_free(l);
    return rc;
}

int dlock_acquire(dlock_lock **out, dlock_client *c, const char *name,
                  const dlock_acquire_options *opts)
{
    dlock_acquire_options o;
    int rc;

    dlock__clear_error();
    if (out == NULL || c == NULL)
        return dlock__fail(DLOCK_EINVAL, "dlock_acquire: %s is NULL", out == NULL ? "out" :
                           "client");
    *out = NULL;
    if ((rc = dlock__check_name(name, "dlock_acquire")) != DLOCK_OK)
        return rc;
    if ((rc = dlock__check_acquire_options(&o, opts)) != DLOCK_OK)
        return rc;
    if (o.kind == DLOCK_KIND_LEADER)
        return dlock__fail(DLOCK_EINVAL, "dlock_acquire: DLOCK_KIND_LEADER is for "
                           "dlock_campaign, which publishes the leader's identity");
    return dlock__acquire(out, c, name, &o, NULL);
}

uint64_t dlock_lock_fence(const dlock_lock *l)
{
    if (l != NULL && l->parts != NULL)
        return l->parts[0]->fence;
    return l != NULL ? l->fence : 0;
}

const char *dlock_lock_name(const dlock_lock *l)
{
    return l != NULL ? l->name : NULL;
}

const char *dlock_lock_holder(const dlock_lock *l)
{
    return l != NULL ? l->holder : NULL;
}

int dlock_lock_lost(const dlock_lock *l)
{
    if (l == NULL)
        return 1;
    for (size_t i = 0; i < l->nparts; i++)
        if (dlock_lock_lost(l->parts[i]))
            return 1;
    if (l->parts != NULL)
        return atomic_load(&l->lost_reason) != 0;
    return atomic_load(&l->lost_reason) != 0 || dlock__now_ms() >= atomic_load(&l->deadline_ms);
}

int64_t dlock_lock_valid_ms(const dlock_lock *l)
{
    int64_t left;

    if (l == NULL || atomic_load(&l->lost_reason) != 0)
        return 0;
    if (l->parts != NULL) {
        left = INT64_MAX;
        for (size_t i = 0; i < l->nparts; i++) {
            int64_t v = dlock_lock_valid_ms(l->parts[i]);
            left = v < left ? v : left;
        }
        return left;
    }
    left = atomic_load(&l->deadline_ms) - dlock__now_ms();
    return left > 0 ? left : 0;
}

/* A call found the lock gone on the server: record it and let the watchdog
 * fire on_lost. */
static int found_lost(dlock_lock *l, const char *what)
{
    dlock_client *c = l->client;
    char shown[80], msg[200];

    snprintf(msg, sizeof(msg), "%s: lock '%s' is no longer ours (lease expired or taken over)",
             what, dlock__printable(shown, sizeof(shown), l->name));
    pthread_mutex_lock(&c->mu);
    dlock__lock_mark_lost(l, DLOCK_ELOST, msg);
    dlock__watchdog_poke(c, l);
    pthread_mutex_unlock(&c->mu);
    return dlock__fail(DLOCK_ELOST, "%s", msg);
}

static int usable(dlock_lock *l, const char *what)
{
    if (l == NULL)
        return dlock__fail(DLOCK_EINVAL, "%s: lock is NULL", what);
    if (l->client == NULL)
        return dlock__fail(DLOCK_EMISUSE, "%s: the lock's client was already freed", what);
    if (atomic_load(&l->lost_reason) != 0)
        return dlock__fail(DLOCK_ELOST, "%s: %s", what, l->lost_message);
    return DLOCK_OK;
}

/* Run call on every part of a multi-lock; the first failure wins, and its
 * message is the one left. */
static int each_part(dlock_lock *l, int (*call)(dlock_lock *, int64_t), int64_t arg)
{
    int first = DLOCK_OK;
    char msg[512] = "";

    for (size_t i = 0; i < l->nparts; i++) {
        int rc = call(l->parts[i], arg);
        if (rc != DLOCK_OK && first == DLOCK_OK) {
            first = rc;
            snprintf(msg, sizeof(msg), "%s", dlock_error_message());
        }
    }
    return first == DLOCK_OK ? DLOCK_OK : dlock__fail(first, "%s", msg);
}

/*
 * The lock is claimed from the watchdog for the call: a renewal it had sent
 * with the old lease could otherwise reach the server after ours and cut the
 * new lease short while the handle believes the long one. A shorter lease
 * is believed from before the request is sent, since the server may apply
 * it at any moment from then on; and if the call fails, whatever its
 * outcome, the handle keeps believing the shorter of the two.
 */
int dlock__extend_begin(dlock_lock *l, int64_t lease_ms, int64_t *sent)
{
    dlock_client *c;
    int rc;

    if ((rc = usable(l, "dlock_lock_extend")) != DLOCK_OK)
        return rc;
    c = l->client;
    if ((rc = dlock__client_claim(c, l)) != DLOCK_OK)
        return rc;
    *sent = dlock__now_ms();
    pthread_mutex_lock(&c->mu);
    if (*sent + lease_ms < atomic_load(&l->deadline_ms)) {
        /* Renew (with the old lease, should this call fail) before the
         * shorter one runs out. */
        int64_t next = l->auto_renew ? *sent + dlock__renew_period(lease_ms) : *sent + lease_ms;
        atomic_store(&l->deadline_ms, *sent + lease_ms);
        if (next < l->next_event_ms)
            l->next_event_ms = next;
    }
    pthread_mutex_unlock(&c->mu);
    return DLOCK_OK;
}

int dlock__extend_end(dlock_lock *l, int64_t lease_ms, int64_t sent, int rc)
{
    dlock_client *c = l->client;

    if (rc == DLOCK_OK) {
        pthread_mutex_lock(&c->mu);
        l->lease_ms = lease_ms;
        dlock__lock_start(l, sent);
        pthread_mutex_unlock(&c->mu);
    }
    dlock__client_unclaim(c, l);
    if (rc == DLOCK_ELOST)
        return found_lost(l, "dlock_lock_extend");
    return rc;
}

static int extend_one(dlock_lock *l, int64_t lease_ms)
{
    dlock_client *c;
    dlock_request req;
    dlock__call k;
    int64_t sent;
    int rc;

    if ((rc = dlock__extend_begin(l, lease_ms, &sent)) != DLOCK_OK)
        return rc;
    c = l->client;
    dlock__lock_request(&req, l);
    req.lease_ms = lease_ms;
    dlock__call_begin(c, &k, "extend", req.name, 1, DLOCK__CALL_TIMED);
    rc = dlock__call_end(c, &k, c->backend->extend(c->be, &req));
    return dlock__extend_end(l, lease_ms, sent, rc);
}

int dlock_lock_extend(dlock_lock *l, int64_t lease_ms)
{
    int rc;

    dlock__clear_error();
    if ((rc = usable(l, "dlock_lock_extend")) != DLOCK_OK)
        return rc;
    if (lease_ms <= 0 || lease_ms > DLOCK_LEASE_MAX_MS)
        return dlock__fail(DLOCK_EINVAL, "dlock_lock_extend: lease_ms is %lld, must be 1..%lld",
                           (long long)lease_ms, (long long)DLOCK_LEASE_MAX_MS);
    if (l->parts != NULL)
        return each_part(l, extend_one, lease_ms);
    return extend_one(l, lease_ms);
}

static int check_one(dlock_lock *l, int64_t unused)
{
    dlock_client *c;
    dlock_request req;
    dlock__call k;
    int rc;

    (void)unused;
    if ((rc = usable(l, "dlock_lock_check")) != DLOCK_OK)
        return rc;
    c = l->client;
    dlock__lock_request(&req, l);
    dlock__call_begin(c, &k, "check", req.name, 1, DLOCK__CALL_TIMED);
    rc = dlock__call_end(c, &k, c->backend->check(c->be, &req));
    return rc == DLOCK_ELOST ? found_lost(l, "dlock_lock_check") : rc;
}

int dlock_lock_check(dlock_lock *l)
{
    int rc;

    dlock__clear_error();
    if ((rc = usable(l, "dlock_lock_check")) != DLOCK_OK)
        return rc;
    if (l->parts != NULL)
        return each_part(l, check_one, 0);
    return check_one(l, 0);
}

int dlock__release_begin(dlock_lock *l, int64_t *called)
{
    dlock_client *c = l->client;
    char shown[80];
    int rc;

    *called = dlock__now_ms();
    if (c == NULL) {
        rc = dlock__fail(DLOCK_EMISUSE, "dlock_release: the client of lock '%s' was already "
                         "freed; its lease runs out on the server",
                         dlock__printable(shown, sizeof(shown), l->name));
        dlock__lock_free(l);
        return rc;
    }
    if ((rc = dlock__client_unregister(c, l)) != DLOCK_OK)
        return rc;
    dlock__async_forget(l);
    /* From here on the watchdog cannot see the lock. */
    return DLOCK_OK;
}

int dlock__release_end(dlock_lock *l, int64_t called, int rc)
{
    int64_t late = called - atomic_load(&l->deadline_ms);
    char shown[80], why[256];

    dlock__printable(shown, sizeof(shown), l->name);
    if (atomic_load(&l->lost_reason) != 0) {
        /* on_lost already told the holder; stay consistent with it. */
        rc = dlock__fail(DLOCK_ELOST, "dlock_release: %s", l->lost_message);
    } else if (late >= 0) {
        snprintf(why, sizeof(why), "%s", rc == DLOCK_OK    ? "released on the server all the same"
                                         : rc == DLOCK_ELOST ? "it was no longer ours on the server"
                                                             : dlock_error_message());
        rc = dlock__fail(DLOCK_ELOST, "dlock_release: the lease of lock '%s' ran out %lld ms "
                         "before the release, with no renewal confirmed in time (%s)", shown,
                         (long long)late, why);
    } else if (rc == DLOCK_ELOST) {
        rc = dlock__fail(DLOCK_ELOST, "dlock_release: lock '%s' was no longer ours; nothing "
                         "was deleted", shown);
    }
    dlock__lock_free(l);
    return rc;
}

/*
 * Release one registered lock (not a multi-lock) and free it. The release
 * is sent whatever the handle knows, so that nothing stays locked on a
 * server that can be reached; but the result reports the loss, whatever the
 * server answered, once it is known (on_lost) or once the lease has run out
 * by the handle's own deadline: the holder may then have worked while
 * another held the lock, and a release that found the key still ours (the
 * server's clock ran slow) or no server at all says nothing against that.
 * The deadline is the one the watchdog leaves (a renewal in flight is
 * waited for), compared with the moment the holder called: the work it did
 * ended then, not when the server answered.
 */
static int release_one(dlock_lock *l)
{
    dlock_client *c = l->client;
    dlock_request req;
    dlock__call k;
    int64_t called;
    int rc;

    if ((rc = dlock__release_begin(l, &called)) != DLOCK_OK)
        return rc;
    dlock__lock_request(&req, l);
    dlock__call_begin(c, &k, "release", req.name, 1, DLOCK__CALL_TIMED);
    rc = dlock__call_end(c, &k, c->backend->release(c->be, &req));
    return dlock__release_end(l, called, rc);
}

/* A multi-lock: every part, then the parent. */
static int release_multi(dlock_lock *l)
{
    int first = DLOCK_OK;
    char msg[512] = "";

    /* Refuse before touching anything if this is the parent's on_lost. */
    for (size_t i = 0; i < l->nparts; i++)
        if (l->parts[i]->client != NULL && dlock__client_in_callback(l->parts[i]->client,
                                                                     l->parts[i]))
            return dlock__fail(DLOCK_EMISUSE, "dlock_release: called from inside the lock's "
                               "on_lost callback; release it after the callback returns");
    for (size_t i = 0; i < l->nparts; i++) {
        int rc = release_one(l->parts[i]);
        if (rc != DLOCK_OK && first == DLOCK_OK) {
            first = rc;
            snprintf(msg, sizeof(msg), "%s", dlock_error_message());
        }
    }
    if (first == DLOCK_OK && atomic_load(&l->lost_reason) != 0) {
        first = DLOCK_ELOST;
        snprintf(msg, sizeof(msg), "dlock_release: %s", l->lost_message);
    }
    l->nparts = 0;
    dlock__lock_free(l);
    return first == DLOCK_OK ? DLOCK_OK : dlock__fail(first, "%s", msg);
}

int dlock_release(dlock_lock *l)
{
    dlock__clear_error();
    if (l == NULL)
        return DLOCK_OK;
    if (l->parts != NULL)
        return release_multi(l);
    return release_one(l);
}
