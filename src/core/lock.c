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

/* A holder's key with no expiry (set by hand) announces nothing: look again
 * this often rather than sleep forever. */
#define NO_TTL_RECHECK_MS 1000

static int check_acquire_options(dlock_acquire_options *o, const dlock_acquire_options *given)
{
    dlock_acquire_options defaults = DLOCK_ACQUIRE_OPTIONS_INIT;

    *o = defaults;
    if (given == NULL)
        return DLOCK_OK;
    if (given->version != DLOCK_ACQUIRE_OPTIONS_VERSION)
        return dlock__fail(DLOCK_EINVAL, "acquire options: version %u, this library knows %d "
                           "(initialise with DLOCK_ACQUIRE_OPTIONS_INIT)",
                           given->version, DLOCK_ACQUIRE_OPTIONS_VERSION);
    *o = *given;
    if (o->lease_ms <= 0 || o->lease_ms > DLOCK_LEASE_MAX_MS)
        return dlock__fail(DLOCK_EINVAL, "acquire options: lease_ms is %lld, must be 1..%lld",
                           (long long)o->lease_ms, (long long)DLOCK_LEASE_MAX_MS);
    if (o->wait_ms < DLOCK_WAIT_FOREVER || o->wait_ms > DLOCK_LEASE_MAX_MS)
        return dlock__fail(DLOCK_EINVAL, "acquire options: wait_ms is %lld, must be -1 "
                           "(forever), 0 (try once) or up to %lld",
                           (long long)o->wait_ms, (long long)DLOCK_LEASE_MAX_MS);
    if (o->auto_renew != 0 && o->auto_renew != 1)
        return dlock__fail(DLOCK_EINVAL, "acquire options: auto_renew must be 0 or 1");
    return DLOCK_OK;
}

static void lock_free(dlock_lock *l)
{
    free(l->name);
    free(l);
}

/*
 * Wait for the lock after a first try found it busy. The watch is set up
 * before the next try, so a release between that try and the sleep is
 * announced to us and not missed; each sleep is bounded by the holder's lease
 * so a lost announcement costs at most one lease.
 */
static int wait_for_lock(dlock_client *c, dlock_lock *l, const dlock_acquire_options *o,
                         int64_t start_ms, int64_t *sent_ms, int64_t retry_ms)
{
    const dlock_backend *b = c->backend;
    int64_t deadline = o->wait_ms == DLOCK_WAIT_FOREVER ? INT64_MAX : start_ms + o->wait_ms;
    void *watch = NULL;
    char shown[80];
    int rc;

    if ((rc = b->watch_begin(c->be, l->name, &watch)) != DLOCK_OK)
        return rc;
    for (;;) {
        int64_t now, sleep_ms;

        *sent_ms = dlock__now_ms();
        rc = b->acquire(c->be, l->name, l->owner, l->lease_ms, watch, &l->fence, &retry_ms);
        if (rc != DLOCK_EBUSY)
            break;
        now = dlock__now_ms();
        if (now >= deadline) {
            rc = dlock__fail(DLOCK_ETIMEOUT, "lock '%s' still held by another owner after "
                             "waiting %lld ms", dlock__printable(shown, sizeof(shown), l->name),
                             (long long)o->wait_ms);
            break;
        }
        sleep_ms = deadline - now;
        if (retry_ms < 0)
            retry_ms = NO_TTL_RECHECK_MS;
        /* +1: wake just after the holder's lease, not just before it. */
        if (retry_ms < INT64_MAX && retry_ms + 1 < sleep_ms)
            sleep_ms = retry_ms + 1;
        rc = b->watch_wait(c->be, watch, sleep_ms);
        if (rc != DLOCK_OK && rc != DLOCK_ETIMEOUT)
            break;
    }
    b->watch_end(c->be, watch);
    return rc;
}

int dlock_acquire(dlock_lock **out, dlock_client *c, const char *name,
                  const dlock_acquire_options *opts)
{
    dlock_acquire_options o;
    dlock_lock *l;
    int64_t start, sent, retry_ms = -1;
    char shown[80];
    int rc;

    dlock__clear_error();
    if (out == NULL || c == NULL)
        return dlock__fail(DLOCK_EINVAL, "dlock_acquire: %s is NULL", out == NULL ? "out" :
                           "client");
    *out = NULL;
    if ((rc = dlock__check_name(name, "dlock_acquire")) != DLOCK_OK)
        return rc;
    if ((rc = check_acquire_options(&o, opts)) != DLOCK_OK)
        return rc;

    l = calloc(1, sizeof(*l));
    if (l == NULL || (l->name = strdup(name)) == NULL) {
        free(l);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    l->client = c;
    l->lease_ms = o.lease_ms;
    l->auto_renew = o.auto_renew;
    l->on_lost = o.on_lost;
    l->payload = o.payload;
    if ((rc = dlock__owner_token(l->owner)) != DLOCK_OK)
        goto err;

    start = sent = dlock__now_ms();
    rc = c->backend->acquire(c->be, name, l->owner, o.lease_ms, NULL, &l->fence, &retry_ms);
    if (rc == DLOCK_EBUSY && o.wait_ms != 0)
        rc = wait_for_lock(c, l, &o, start, &sent, retry_ms);
    else if (rc == DLOCK_EBUSY)
        rc = dlock__fail(DLOCK_EBUSY, "lock '%s' is held by another owner (lease left %lld ms)",
                         dlock__printable(shown, sizeof(shown), name), (long long)retry_ms);
    if (rc != DLOCK_OK)
        goto err;

    /* The lease counts from when the winning request was sent, so the local
     * deadline can only be early, never late. */
    atomic_store(&l->deadline_ms, sent + o.lease_ms);
    l->next_event_ms = o.auto_renew ? sent + o.lease_ms / 3 : sent + o.lease_ms;
    if ((rc = dlock__client_register(c, l)) != DLOCK_OK) {
        c->backend->release(c->be, name, l->owner);
        goto err;
    }
    *out = l;
    return DLOCK_OK;

err:
    lock_free(l);
    return rc;
}

uint64_t dlock_lock_fence(const dlock_lock *l)
{
    return l != NULL ? l->fence : 0;
}

const char *dlock_lock_name(const dlock_lock *l)
{
    return l != NULL ? l->name : NULL;
}

int dlock_lock_lost(const dlock_lock *l)
{
    if (l == NULL)
        return 1;
    return atomic_load(&l->lost_reason) != 0 || dlock__now_ms() >= atomic_load(&l->deadline_ms);
}

int64_t dlock_lock_valid_ms(const dlock_lock *l)
{
    int64_t left;

    if (l == NULL || atomic_load(&l->lost_reason) != 0)
        return 0;
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

int dlock_lock_extend(dlock_lock *l, int64_t lease_ms)
{
    dlock_client *c;
    int64_t sent;
    int rc;

    dlock__clear_error();
    if ((rc = usable(l, "dlock_lock_extend")) != DLOCK_OK)
        return rc;
    if (lease_ms <= 0 || lease_ms > DLOCK_LEASE_MAX_MS)
        return dlock__fail(DLOCK_EINVAL, "dlock_lock_extend: lease_ms is %lld, must be 1..%lld",
                           (long long)lease_ms, (long long)DLOCK_LEASE_MAX_MS);
    c = l->client;
    sent = dlock__now_ms();
    rc = c->backend->extend(c->be, l->name, l->owner, lease_ms);
    if (rc == DLOCK_ELOST)
        return found_lost(l, "dlock_lock_extend");
    if (rc != DLOCK_OK)
        return rc;
    pthread_mutex_lock(&c->mu);
    l->lease_ms = lease_ms;
    atomic_store(&l->deadline_ms, sent + lease_ms);
    l->next_event_ms = l->auto_renew ? sent + lease_ms / 3 : sent + lease_ms;
    dlock__watchdog_poke(c, l);
    pthread_mutex_unlock(&c->mu);
    return DLOCK_OK;
}

int dlock_lock_check(dlock_lock *l)
{
    int rc;

    dlock__clear_error();
    if ((rc = usable(l, "dlock_lock_check")) != DLOCK_OK)
        return rc;
    rc = l->client->backend->check(l->client->be, l->name, l->owner);
    return rc == DLOCK_ELOST ? found_lost(l, "dlock_lock_check") : rc;
}

int dlock_release(dlock_lock *l)
{
    dlock_client *c;
    char shown[80];
    int rc;

    dlock__clear_error();
    if (l == NULL)
        return DLOCK_OK;
    c = l->client;
    if (c == NULL) {
        rc = dlock__fail(DLOCK_EMISUSE, "dlock_release: the client of lock '%s' was already "
                         "freed; its lease runs out on the server",
                         dlock__printable(shown, sizeof(shown), l->name));
        lock_free(l);
        return rc;
    }
    if ((rc = dlock__client_unregister(c, l)) != DLOCK_OK)
        return rc;
    /* From here on the watchdog cannot see the lock. */
    rc = c->backend->release(c->be, l->name, l->owner);
    if (rc == DLOCK_OK && atomic_load(&l->lost_reason) != 0) {
        /* on_lost already told the holder; stay consistent with it. */
        rc = dlock__fail(DLOCK_ELOST, "dlock_release: %s", l->lost_message);
    } else if (rc == DLOCK_ELOST) {
        rc = dlock__fail(DLOCK_ELOST, "dlock_release: lock '%s' was no longer ours; nothing "
                         "was deleted", dlock__printable(shown, sizeof(shown), l->name));
    }
    lock_free(l);
    return rc;
}
