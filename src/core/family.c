/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The lock family's calls beside dlock_acquire (docs/family.md): owner ids,
 * downgrade, semaphore permits, multi-locks, and leader election. The kinds
 * themselves go through dlock_acquire (lock.c) and the backend's family_*
 * calls; what is here is what does not fit one name and one handle.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/client.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/wait.h"
#include "core/thread.h"

_Static_assert(DLOCK_OWNER_GENERATED_LEN == DLOCK__TOKEN_LEN, "owner ids are owner tokens");

/* An observer with no leader to time out on looks again this often, in
 * case an announcement was lost while its connection stayed up. */
#define OBSERVE_RECHECK_MS 60000
/* ... and this often while the server cannot be reached. */
#define OBSERVE_RETRY_MS 1000

int dlock_owner_generate(char *out, size_t size)
{
    dlock__clear_error();
    if (out == NULL || size < DLOCK_OWNER_GENERATED_LEN + 1)
        return dlock__fail(DLOCK_EINVAL, "dlock_owner_generate: the buffer must hold %d bytes",
                           DLOCK_OWNER_GENERATED_LEN + 1);
    return dlock__token_new(out);
}

int dlock_lock_kind(const dlock_lock *l)
{
    if (l == NULL)
        return -1;
    return l->parts != NULL ? DLOCK_KIND_MULTI : atomic_load(&l->kind);
}

size_t dlock_lock_count(const dlock_lock *l)
{
    if (l == NULL)
        return 0;
    return l->parts != NULL ? l->nparts : 1;
}

const char *dlock_lock_name_at(const dlock_lock *l, size_t i)
{
    if (l == NULL || i >= dlock_lock_count(l))
        return NULL;
    return l->parts != NULL ? l->parts[i]->name : l->name;
}

uint64_t dlock_lock_fence_at(const dlock_lock *l, size_t i)
{
    if (l == NULL || i >= dlock_lock_count(l))
        return 0;
    return l->parts != NULL ? l->parts[i]->fence : l->fence;
}

/* ---- downgrade, permits ----------------------------------------------- */

int dlock_lock_downgrade(dlock_lock *l)
{
    dlock_client *c;
    dlock_request req;
    dlock__call k;
    char shown[80], msg[200];
    int64_t sent;
    int rc;

    dlock__clear_error();
    if (l == NULL)
        return dlock__fail(DLOCK_EINVAL, "dlock_lock_downgrade: lock is NULL");
    if ((c = l->client) == NULL)
        return dlock__fail(DLOCK_EMISUSE, "dlock_lock_downgrade: the lock's client was "
                           "already freed");
    if (dlock_lock_kind(l) != DLOCK_KIND_WRITE)
        return dlock__fail(DLOCK_EMISUSE, "dlock_lock_downgrade: lock '%s' is not a write lock",
                           dlock__printable(shown, sizeof(shown), l->name));
    if (atomic_load(&l->lost_reason) != 0)
        return dlock__fail(DLOCK_ELOST, "dlock_lock_downgrade: %s", l->lost_message);
    if (!(c->backend->caps & DLOCK_CAP_KIND(DLOCK_KIND_WRITE)))
        return dlock__not_supported(c, "downgrade of a write lock");
    /* No renewal of the write lock may run while the server swaps it for a
     * read lock: it would find the write lock gone and call it lost. */
    if ((rc = dlock__client_claim(c, l)) != DLOCK_OK)
        return rc;
    dlock__lock_request(&req, l);
    sent = dlock__now_ms();
    dlock__call_begin(c, &k, "downgrade", req.name, 1, 0);
    rc = dlock__call_end(c, &k, c->backend->downgrade(c->be, &req));
    pthread_mutex_lock(&c->mu);
    if (rc == DLOCK_OK) {
        atomic_store(&l->kind, DLOCK_KIND_READ);
        /* The read lease was set from when the request was sent. */
        dlock__lock_start(l, sent);
    } else if (rc == DLOCK_ELOST) {
        snprintf(msg, sizeof(msg), "dlock_lock_downgrade: lock '%s' is no longer ours (lease "
                 "expired or taken over)", dlock__printable(shown, sizeof(shown), l->name));
        dlock__lock_mark_lost(l, DLOCK_ELOST, msg);
    }
    pthread_mutex_unlock(&c->mu);
    dlock__client_unclaim(c, l);
    if (rc == DLOCK_ELOST)
        return dlock__fail(DLOCK_ELOST, "%s", msg);
    return rc;
}

int dlock_semaphore_set_permits(dlock_client *c, const char *name, int permits)
{
    dlock__call k;
    int rc;

    dlock__clear_error();
    if (c == NULL)
        return dlock__fail(DLOCK_EINVAL, "dlock_semaphore_set_permits: client is NULL");
    if ((rc = dlock__check_name(name, "dlock_semaphore_set_permits")) != DLOCK_OK)
        return rc;
    if (permits < 1 || permits > DLOCK_PERMITS_MAX)
        return dlock__fail(DLOCK_EINVAL, "dlock_semaphore_set_permits: permits is %d, must be "
                           "1..%d", permits, DLOCK_PERMITS_MAX);
    if (!(c->backend->caps & DLOCK_CAP_KIND(DLOCK_KIND_SEMAPHORE)))
        return dlock__not_supported(c, "semaphores");
    dlock__call_begin(c, &k, "set_permits", name, 1, 0);
    return dlock__call_end(c, &k, c->backend->set_permits(c->be, name, permits));
}

/* ---- multi-lock --------------------------------------------------------- */

/* A part's on_lost (watchdog thread): the parent is lost, and its on_lost
 * is called once, whichever part was lost first. */
static void part_lost(dlock_lock *part, int reason, void *arg)
{
    dlock_lock *parent = arg;

    if (atomic_exchange(&parent->parent_fired, 1))
        return;
    snprintf(parent->lost_message, sizeof(parent->lost_message), "%s", part->lost_message);
    atomic_store(&parent->lost_reason, reason);
    parent->on_lost(parent, reason, parent->payload);
}

static int multi_fail(int rc, const char *name)
{
    char shown[80], msg[512];

    snprintf(msg, sizeof(msg), "%s", dlock_error_message());
    return dlock__fail(rc, "dlock_acquire_multi: '%s': %s",
                       dlock__printable(shown, sizeof(shown), name), msg);
}

static const char *const *sort_names;

static int by_name(const void *a, const void *b)
{
    return strcmp(sort_names[*(const size_t *)a], sort_names[*(const size_t *)b]);
}

/* One name at a time, in the global order; roll back on failure. */
static int multi_ordered(dlock_lock *parent, dlock_client *c, const char *const *names, size_t n,
                         const dlock_acquire_options *o)
{
    static pthread_mutex_t sort_mu = PTHREAD_MUTEX_INITIALIZER;
    size_t order[DLOCK_MULTI_MAX];
    int64_t deadline = o->wait_ms > 0 ? dlock__now_ms() + o->wait_ms : 0;
    int rc = DLOCK_OK;
    size_t k;

    for (size_t i = 0; i < n; i++)
        order[i] = i;
    pthread_mutex_lock(&sort_mu); /* qsort has no context argument in C11 */
    sort_names = names;
    qsort(order, n, sizeof(order[0]), by_name);
    pthread_mutex_unlock(&sort_mu);

    for (k = 0; k < n; k++) {
        size_t i = order[k];
        dlock_acquire_options part = *o;

        if (o->wait_ms > 0) {
            int64_t left = deadline - dlock__now_ms();
            part.wait_ms = left > 0 ? left : 0;
        }
        if ((rc = dlock__acquire(&parent->parts[i], c, names[i], &part, NULL)) != DLOCK_OK) {
            if (rc == DLOCK_EBUSY && o->wait_ms > 0)
                rc = dlock__fail(DLOCK_ETIMEOUT, "lock '%s' still held by another owner when "
                                 "the wait of %lld ms ran out", names[i],
                                 (long long)o->wait_ms);
            rc = multi_fail(rc, names[i]);
            break;
        }
        parent->parts[i]->parent = parent;
    }
    if (rc != DLOCK_OK) {
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", dlock_error_message());
        while (k-- > 0) {
            dlock_release(parent->parts[order[k]]);
            parent->parts[order[k]] = NULL;
        }
        dlock__fail(rc, "%s", msg);
    }
    return rc;
}

/* The loop's view of an atomic multi-lock (core/wait.h). */
typedef struct {
    dlock_client *c;
    dlock_request reqs[DLOCK_MULTI_MAX];
    uint64_t fences[DLOCK_MULTI_MAX];
    size_t n;
} multi;

static int multi_try(void *ctx, void *watch, dlock_acquire_result *res)
{
    multi *m = ctx;
    dlock__call k;

    (void)watch; /* nothing queued: the watch only wakes us */
    dlock__call_begin(m->c, &k, "multi_acquire", NULL, m->n, DLOCK__CALL_TIMED);
    return dlock__call_end(m->c, &k, m->c->backend->multi_acquire(m->c->be, m->reqs, m->n,
                                                                  m->fences, res));
}

static const dlock_request *multi_busy(void *ctx, const dlock_acquire_result *res)
{
    multi *m = ctx;

    return &m->reqs[res->busy < m->n ? res->busy : 0];
}

static void multi_give_back(void *ctx)
{
    multi *m = ctx;

    dlock__give_back(m->c, m->reqs, m->n);
}

/* Can the backend take names (plain mutexes as o asks) in one atomic step? */
static int same_step(dlock_client *c, const char *const *names, size_t n,
                     const dlock_acquire_options *o)
{
    dlock_request reqs[DLOCK_MULTI_MAX];

    memset(reqs, 0, sizeof(reqs));
    for (size_t i = 0; i < n; i++) {
        reqs[i].kind = DLOCK_KIND_MUTEX;
        reqs[i].name = names[i];
        reqs[i].lease_ms = o->lease_ms;
    }
    return c->backend->multi_atomic(c->be, reqs, n);
}

/* Names the backend takes in one atomic step (multi_atomic): one try for
 * all, retried after a release of the name that was busy. */
static int multi_atomic(dlock_lock *parent, dlock_client *c, const char *const *names, size_t n,
                        const dlock_acquire_options *o)
{
    dlock__attempt a = {multi_try, multi_busy, multi_give_back, NULL, NULL};
    dlock_acquire_result res = {0};
    multi *m = calloc(1, sizeof(*m));
    int rc = DLOCK_OK;

    if (m == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    m->c = c;
    m->n = n;
    a.ctx = m;
    for (size_t i = 0; i < n && rc == DLOCK_OK; i++) {
        if ((rc = dlock__lock_new(&parent->parts[i], c, names[i], o, NULL)) != DLOCK_OK)
            break;
        parent->parts[i]->parent = parent;
        dlock__lock_request(&m->reqs[i], parent->parts[i]);
    }
    if (rc == DLOCK_OK && (rc = dlock__acquire_loop(c, &a, o->wait_ms, &res)) != DLOCK_OK)
        rc = multi_fail(rc, m->reqs[res.busy < n ? res.busy : 0].name);
    for (size_t i = 0; i < n && rc == DLOCK_OK; i++) {
        parent->parts[i]->fence = m->fences[i];
        dlock__lock_start(parent->parts[i], res.lease_from_ms);
    }
    for (size_t i = 0; i < n && rc == DLOCK_OK; i++) {
        if ((rc = dlock__client_register(c, parent->parts[i])) != DLOCK_OK) {
            /* Only the first can fail (starting the watchdog thread). */
            multi_give_back(m);
            for (size_t j = 0; j < i; j++) {
                dlock_release(parent->parts[j]);
                parent->parts[j] = NULL;
            }
        }
    }
    if (rc != DLOCK_OK) {
        for (size_t i = 0; i < n; i++) {
            if (parent->parts[i] != NULL)
                dlock__lock_free(parent->parts[i]);
            parent->parts[i] = NULL;
        }
    }
    free(m);
    return rc;
}

int dlock_acquire_multi(dlock_lock **out, dlock_client *c, const char *const *names, size_t n,
                        const dlock_acquire_options *opts)
{
    dlock_acquire_options o;
    dlock_lock *parent;
    int atomic, rc;

    dlock__clear_error();
    if (out == NULL || c == NULL || names == NULL)
        return dlock__fail(DLOCK_EINVAL, "dlock_acquire_multi: %s is NULL",
                           out == NULL ? "out" : c == NULL ? "client" : "names");
    *out = NULL;
    if (n == 0 || n > DLOCK_MULTI_MAX)
        return dlock__fail(DLOCK_EINVAL, "dlock_acquire_multi: n is %zu, must be 1..%d", n,
                           DLOCK_MULTI_MAX);
    for (size_t i = 0; i < n; i++) {
        if ((rc = dlock__check_name(names[i], "dlock_acquire_multi")) != DLOCK_OK)
            return rc;
        for (size_t j = 0; j < i; j++)
            if (strcmp(names[i], names[j]) == 0)
                return dlock__fail(DLOCK_EINVAL, "dlock_acquire_multi: names[%zu] and "
                                   "names[%zu] are the same", j, i);
    }
    if ((rc = dlock__check_acquire_options(&o, opts)) != DLOCK_OK)
        return rc;
    if (o.kind != DLOCK_KIND_MUTEX || o.owner != NULL || o.permits != 0)
        return dlock__fail(DLOCK_EINVAL, "dlock_acquire_multi: takes plain mutexes; leave "
                           "kind, owner and permits unset");

    parent = calloc(1, sizeof(*parent));
    if (parent == NULL || (parent->name = strdup(names[0])) == NULL ||
        (parent->parts = calloc(n, sizeof(*parent->parts))) == NULL) {
        if (parent != NULL)
            dlock__lock_free(parent);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    parent->client = c;
    parent->nparts = n;
    parent->lease_ms = o.lease_ms;
    parent->auto_renew = o.auto_renew;
    parent->on_lost = o.on_lost;
    parent->payload = o.payload;
    atomic_store(&parent->kind, DLOCK_KIND_MULTI);
    /* The parts report to the parent, which reports to the caller. */
    o.on_lost = parent->on_lost != NULL ? part_lost : NULL;
    o.payload = parent;

    atomic = n > 1 && c->backend->multi_atomic != NULL && same_step(c, names, n, &o);
    rc = atomic ? multi_atomic(parent, c, names, n, &o) : multi_ordered(parent, c, names, n, &o);
    if (rc != DLOCK_OK) {
        parent->nparts = 0;
        dlock__lock_free(parent);
        return rc;
    }
    *out = parent;
    return DLOCK_OK;
}

/* ---- leader election ------------------------------------------------------ */

int dlock_campaign(dlock_lock **out, dlock_client *c, const char *name, const char *identity,
                   const dlock_acquire_options *opts)
{
    dlock_acquire_options o;
    char own[DLOCK_IDENTITY_MAX + 1];
    size_t len;
    int rc;

    dlock__clear_error();
    if (out == NULL || c == NULL)
        return dlock__fail(DLOCK_EINVAL, "dlock_campaign: %s is NULL",
                           out == NULL ? "out" : "client");
    *out = NULL;
    if ((rc = dlock__check_name(name, "dlock_campaign")) != DLOCK_OK)
        return rc;
    if ((rc = dlock__check_acquire_options(&o, opts)) != DLOCK_OK)
        return rc;
    if (opts == NULL)
        o.wait_ms = DLOCK_WAIT_FOREVER;
    if (o.kind != DLOCK_KIND_MUTEX || o.owner != NULL || o.reentrant || o.permits != 0)
        return dlock__fail(DLOCK_EINVAL, "dlock_campaign: leave kind, owner, reentrant and "
                           "permits unset");
    if (identity == NULL) {
        char host[128];
        if (gethostname(host, sizeof(host)) != 0)
            snprintf(host, sizeof(host), "unknown");
        host[sizeof(host) - 1] = '\0';
        snprintf(own, sizeof(own), "%s:%ld", host, (long)getpid());
        identity = own;
    }
    len = strnlen(identity, DLOCK_IDENTITY_MAX + 1);
    if (len == 0 || len > DLOCK_IDENTITY_MAX)
        return dlock__fail(DLOCK_EINVAL, "dlock_campaign: identity must be 1..%d bytes",
                           DLOCK_IDENTITY_MAX);
    o.kind = DLOCK_KIND_LEADER;
    return dlock__acquire(out, c, name, &o, identity);
}

int dlock_resign(dlock_lock *leader)
{
    return dlock_release(leader);
}

int dlock_leader(dlock_leader_info *out, dlock_client *c, const char *name)
{
    dlock__call k;
    int rc;

    dlock__clear_error();
    if (out == NULL || c == NULL)
        return dlock__fail(DLOCK_EINVAL, "dlock_leader: NULL argument");
    memset(out, 0, sizeof(*out));
    if ((rc = dlock__check_name(name, "dlock_leader")) != DLOCK_OK)
        return rc;
    if (!(c->backend->caps & DLOCK_CAP_KIND(DLOCK_KIND_LEADER)))
        return dlock__not_supported(c, "leader election");
    dlock__call_begin(c, &k, "leader_get", name, 1, 0);
    return dlock__call_end(c, &k, c->backend->leader_get(c->be, name, out));
}

struct dlock_observer {
    dlock_client *client;
    char *name;
    dlock_observe_cb cb;
    void *payload;
    void *watch;
    pthread_t thread;
    atomic_int stopping;
};

static int same_leader(const dlock_leader_info *a, const dlock_leader_info *b)
{
    return a->held == b->held && a->fence == b->fence && strcmp(a->identity, b->identity) == 0;
}

/*
 * Read the leader, report a change, sleep until the server announces the
 * next one, or until the leader's lease runs out (a leader that died does
 * not announce its end), then again.
 */
static void *observer_main(void *arg)
{
    dlock_observer *ob = arg;
    const dlock_backend *b = ob->client->backend;
    dlock_leader_info last, now;
    int have_last = 0;

    memset(&last, 0, sizeof(last));
    while (!atomic_load(&ob->stopping)) {
        int64_t sleep_ms = OBSERVE_RETRY_MS;

        if (b->leader_get(ob->client->be, ob->name, &now) == DLOCK_OK) {
            if (!have_last || !same_leader(&now, &last)) {
                last = now;
                have_last = 1;
                if (!atomic_load(&ob->stopping))
                    ob->cb(&now, ob->payload);
            }
            sleep_ms = OBSERVE_RECHECK_MS;
            if (now.held && now.ttl_ms >= 0 && now.ttl_ms + 1 < sleep_ms)
                sleep_ms = now.ttl_ms + 1;
        }
        if (atomic_load(&ob->stopping))
            break;
        b->watch_wait(ob->client->be, ob->watch, sleep_ms);
    }
    return NULL;
}

int dlock_observe(dlock_observer **out, dlock_client *c, const char *name, dlock_observe_cb cb,
                  void *payload)
{
    dlock_observer *ob;
    int rc;

    dlock__clear_error();
    if (out == NULL || c == NULL || cb == NULL)
        return dlock__fail(DLOCK_EINVAL, "dlock_observe: NULL argument");
    *out = NULL;
    if ((rc = dlock__check_name(name, "dlock_observe")) != DLOCK_OK)
        return rc;
    if (!(c->backend->caps & DLOCK_CAP_KIND(DLOCK_KIND_LEADER)))
        return dlock__not_supported(c, "leader election");
    ob = calloc(1, sizeof(*ob));
    if (ob == NULL || (ob->name = strdup(name)) == NULL) {
        free(ob);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    ob->client = c;
    ob->cb = cb;
    ob->payload = payload;
    /* Subscribed before the first read, so no change after it is missed. */
    if ((rc = c->backend->observe_begin(c->be, name, &ob->watch)) != DLOCK_OK)
        goto err;
    if (dlock__thread_create(&ob->thread, observer_main, ob) != 0) {
        c->backend->watch_end(c->be, ob->watch);
        rc = dlock__fail(DLOCK_ENOMEM, "dlock_observe: cannot start the observer thread");
        goto err;
    }
    *out = ob;
    return DLOCK_OK;
err:
    free(ob->name);
    free(ob);
    return rc;
}

void dlock_observer_free(dlock_observer *ob)
{
    if (ob == NULL)
        return;
    atomic_store(&ob->stopping, 1);
    ob->client->backend->watch_wake(ob->client->be, ob->watch);
    pthread_join(ob->thread, NULL);
    ob->client->backend->watch_end(ob->client->be, ob->watch);
    free(ob->name);
    free(ob);
}
