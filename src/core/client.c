/* SPDX-License-Identifier: BSD-3-Clause */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/client.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/options.h"
#include "core/url.h"

/* ---- backends ------------------------------------------------------------ */

/* The backends built in: a new one is one line here (and its folder). */
extern const dlock_backend dlock__redis_backend;
extern const dlock_backend dlock__etcd_backend;
extern const dlock_backend dlock__redlock_backend;
static const dlock_backend *const builtin[] = {&dlock__redis_backend, &dlock__etcd_backend,
                                               &dlock__redlock_backend};

/* Backends registered at run time (dlock_backend_register), each for one
 * scheme: a full-size copy of the table (check_backend), and the table as
 * given, which a module that serves several schemes registers once per
 * scheme; guarded by registry_mu, never removed. */
#define REGISTERED_MAX 32
static struct {
    char scheme[33];
    const dlock_backend *given;
    dlock_backend table;
} registered[REGISTERED_MAX];
static size_t nregistered;
static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;

/* Caller holds registry_mu. */
static const dlock_backend *find_backend_locked(const char *scheme, const dlock_backend **given)
{
    for (size_t i = 0; i < sizeof(builtin) / sizeof(builtin[0]); i++)
        for (const char *const *s = builtin[i]->schemes; *s != NULL; s++)
            if (strcmp(*s, scheme) == 0) {
                if (given != NULL)
                    *given = builtin[i];
                return builtin[i];
            }
    for (size_t i = 0; i < nregistered; i++)
        if (strcmp(registered[i].scheme, scheme) == 0) {
            if (given != NULL)
                *given = registered[i].given;
            return &registered[i].table;
        }
    return NULL;
}

const dlock_backend *dlock__find_backend(const char *scheme, const dlock_backend **given)
{
    const dlock_backend *b;

    pthread_mutex_lock(&registry_mu);
    b = find_backend_locked(scheme, given);
    pthread_mutex_unlock(&registry_mu);
    return b;
}

/*
 * The table versions served: 2, the first request-based table, to the
 * current one ("Versions" in include/dlock/sys/backend.h). A version 2
 * table ends with multi_acquire; the calls after it were appended since,
 * and a table has one only when its size reaches past it.
 */
#define OLDEST_VERSION 2
#define END_OF(call) (offsetof(dlock_backend, call) + sizeof(((dlock_backend *)0)->call))
#define OLDEST_SIZE END_OF(multi_acquire)
#define HAS(b, call) ((b)->size >= END_OF(call))

/*
 * Check the table b and copy it into *out, full size: the calls a table of
 * an older header lacks (beyond its size, never read) are NULL in the copy,
 * which is all the core ever reads. Then check what a backend must have for
 * the caps it claims.
 */
static int check_backend(const dlock_backend *b, dlock_backend *out)
{
    const char *missing = NULL;
    const char *name = HAS(b, name) && b->name != NULL ? b->name : "?";
    unsigned kinds = DLOCK_CAP_KIND(DLOCK_KIND_MUTEX) | DLOCK_CAP_KIND(DLOCK_KIND_FAIR) |
                     DLOCK_CAP_KIND(DLOCK_KIND_READ) | DLOCK_CAP_KIND(DLOCK_KIND_WRITE) |
                     DLOCK_CAP_KIND(DLOCK_KIND_SEMAPHORE) | DLOCK_CAP_KIND(DLOCK_KIND_LEADER);

    if (b->version > DLOCK_BACKEND_VERSION)
        return dlock__fail(DLOCK_EINVAL, "dlock_backend_register: backend '%s' was built for "
                           "version %u of the backend interface, newer than this library's "
                           "%d: rebuild it against this dlock's <dlock/sys/backend.h>",
                           name, b->version, DLOCK_BACKEND_VERSION);
    if (b->version < OLDEST_VERSION)
        return dlock__fail(DLOCK_EINVAL, "dlock_backend_register: backend '%s' was built for "
                           "version %u of the backend interface; this library serves versions "
                           "%d to %d: rebuild it against <dlock/sys/backend.h>",
                           name, b->version, OLDEST_VERSION, DLOCK_BACKEND_VERSION);
    if (b->size < OLDEST_SIZE)
        return dlock__fail(DLOCK_EINVAL, "dlock_backend_register: backend '%s' (version %u) "
                           "has a table of %zu bytes, smaller than the %zu of a version %d "
                           "table: size must be sizeof(dlock_backend)",
                           name, b->version, b->size, (size_t)OLDEST_SIZE, OLDEST_VERSION);
    memset(out, 0, sizeof(*out));
    memcpy(out, b, OLDEST_SIZE);
    out->size = sizeof(*out);
    if (HAS(b, list)) /* since v3 */
        out->list = b->list;
    if (HAS(b, holders)) /* since v4 */
        out->holders = b->holders;
    if (HAS(b, watch_notify)) /* appended to v5 */
        out->watch_notify = b->watch_notify;
    if (HAS(b, async_step) && b->start != NULL && b->async_fds != NULL && b->async_step != NULL) {
        out->start = b->start; /* appended to v5: all three or none */
        out->async_fds = b->async_fds;
        out->async_step = b->async_step;
        if (HAS(b, renew_start))
            out->renew_start = b->renew_start;
    }
    b = out;
    if (b->name == NULL)
        missing = "name";
    else if (!(b->caps & DLOCK_CAP_KIND(DLOCK_KIND_MUTEX)))
        missing = "DLOCK_CAP_KIND(DLOCK_KIND_MUTEX) in caps";
    else if (b->caps & ~(kinds | DLOCK_CAP_OWNER_IDS | DLOCK_CAP_QUEUE_FIRST))
        missing = "only known DLOCK_CAP_* bits in caps";
    else if (!b->open || !b->close || !b->acquire || !b->release || !b->extend || !b->check ||
             !b->renew || !b->watch_begin || !b->watch_wait || !b->watch_end ||
             !b->watch_wake || !b->status || !b->force_release)
        missing = "every call from open to force_release";
    else if ((b->caps & (DLOCK_CAP_KIND(DLOCK_KIND_READ) | DLOCK_CAP_KIND(DLOCK_KIND_WRITE))) &&
             !b->downgrade)
        missing = "downgrade (caps has READ or WRITE)";
    else if ((b->caps & DLOCK_CAP_KIND(DLOCK_KIND_SEMAPHORE)) && !b->set_permits)
        missing = "set_permits (caps has SEMAPHORE)";
    else if ((b->caps & DLOCK_CAP_KIND(DLOCK_KIND_LEADER)) && (!b->leader_get || !b->observe_begin))
        missing = "leader_get and observe_begin (caps has LEADER)";
    else if ((b->multi_atomic == NULL) != (b->multi_acquire == NULL))
        missing = "both multi_atomic and multi_acquire, or neither";
    if (missing != NULL)
        return dlock__fail(DLOCK_EINVAL, "dlock_backend_register: backend '%s' needs %s",
                           b->name != NULL ? b->name : "?", missing);
    return DLOCK_OK;
}

int dlock_backend_register(const char *scheme, const dlock_backend *backend)
{
    dlock_backend table;
    size_t n;
    int rc;

    dlock__clear_error();
    if (scheme == NULL || backend == NULL)
        return dlock__fail(DLOCK_EINVAL, "dlock_backend_register: %s is NULL",
                           scheme == NULL ? "scheme" : "backend");
    n = strlen(scheme);
    if (n == 0 || n >= sizeof(registered[0].scheme) ||
        strspn(scheme, "abcdefghijklmnopqrstuvwxyz0123456789+-.") != n)
        return dlock__fail(DLOCK_EINVAL, "dlock_backend_register: scheme must be 1..32 lower "
                           "case letters, digits, '+', '-' or '.'");
    if ((rc = check_backend(backend, &table)) != DLOCK_OK)
        return rc;
    pthread_mutex_lock(&registry_mu);
    if (find_backend_locked(scheme, NULL) != NULL)
        rc = dlock__fail(DLOCK_EINVAL, "dlock_backend_register: scheme '%s://' is already "
                         "served", scheme);
    else if (nregistered == REGISTERED_MAX)
        rc = dlock__fail(DLOCK_EINVAL, "dlock_backend_register: %d schemes registered "
                         "already", REGISTERED_MAX);
    else {
        memcpy(registered[nregistered].scheme, scheme, n + 1);
        registered[nregistered].given = backend;
        registered[nregistered].table = table;
        nregistered++;
    }
    pthread_mutex_unlock(&registry_mu);
    return rc;
}

const char *dlock_scheme(size_t i, unsigned *flags)
{
    const char *s = NULL, *module = NULL;
    size_t n;
    unsigned f = 0;

    /* The built-in tables' schemes, in the order of builtin[]. */
    for (size_t b = 0; b < sizeof(builtin) / sizeof(builtin[0]); b++)
        for (const char *const *p = builtin[b]->schemes; *p != NULL; p++)
            if (i-- == 0) {
                s = *p;
                goto found;
            }
    /* The modules'. */
    for (n = 0; dlock__module_scheme(n, NULL) != NULL; n++)
        ;
    if (i < n) {
        s = dlock__module_scheme(i, &module);
        f = DLOCK_SCHEME_MODULE;
        if (!dlock__module_installed(module))
            f |= DLOCK_SCHEME_NOT_INSTALLED;
        goto found;
    }
    i -= n;
    /* Then those registered that no module above serves (a loaded module
     * registers its schemes too). Append-only: an index keeps its scheme. */
    pthread_mutex_lock(&registry_mu);
    for (size_t r = 0; r < nregistered && s == NULL; r++) {
        const char *m;
        int listed = 0;
        for (size_t k = 0; (m = dlock__module_scheme(k, NULL)) != NULL && !listed; k++)
            listed = strcmp(m, registered[r].scheme) == 0;
        if (!listed && i-- == 0)
            s = registered[r].scheme;
    }
    pthread_mutex_unlock(&registry_mu);
    f = DLOCK_SCHEME_REGISTERED;
found:
    if (flags != NULL && s != NULL)
        *flags = f;
    return s;
}

static int check_options(dlock_client_options *o, const dlock_client_options *given)
{
    int rc;

    if ((rc = dlock__client_options_copy(o, given)) != DLOCK_OK || given == NULL)
        return rc;
    if (o->connect_timeout_ms <= 0 || o->connect_timeout_ms > 3600000)
        return dlock__fail(DLOCK_EINVAL, "client options: connect_timeout_ms must be 1..3600000");
    if (o->command_timeout_ms <= 0 || o->command_timeout_ms > 3600000)
        return dlock__fail(DLOCK_EINVAL, "client options: command_timeout_ms must be 1..3600000");
    if (o->log_level < DLOCK_LOG_DEBUG || o->log_level > DLOCK_LOG_ERROR)
        return dlock__fail(DLOCK_EINVAL, "client options: log_level must be DLOCK_LOG_DEBUG.."
                           "DLOCK_LOG_ERROR (0..3), not %d", o->log_level);
    if ((o->flags & ~DLOCK_CLIENT_NO_THREADS) != 0)
        return dlock__fail(DLOCK_EINVAL, "client options: flags has unknown bits 0x%x (known: "
                           "DLOCK_CLIENT_NO_THREADS)", o->flags & ~DLOCK_CLIENT_NO_THREADS);
    if (o->key_prefix != NULL && strlen(o->key_prefix) > 128)
        return dlock__fail(DLOCK_EINVAL, "client options: key_prefix longer than 128 bytes");
    if (o->client_name != NULL) {
        size_t n = strlen(o->client_name);
        if (n == 0 || n > 64 || strspn(o->client_name, "abcdefghijklmnopqrstuvwxyz"
                                                       "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                       "0123456789-_.:") != n)
            return dlock__fail(DLOCK_EINVAL, "client options: client_name must be 1..64 of "
                               "letters, digits and -_.:");
    }
    return DLOCK_OK;
}

int dlock_client_open(dlock_client **out, const char *url, const dlock_client_options *opts)
{
    dlock_client_options o;
    dlock_client *c;
    int rc;

    dlock__clear_error();
    if (out == NULL)
        return dlock__fail(DLOCK_EINVAL, "dlock_client_open: out is NULL");
    *out = NULL;
    if (url == NULL)
        return dlock__fail(DLOCK_EINVAL, "dlock_client_open: url is NULL");
    if ((rc = check_options(&o, opts)) != DLOCK_OK)
        return rc;

    c = calloc(1, sizeof(*c));
    if (c == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    c->sleep_until_ms = -1;
    atomic_store(&c->interrupt_fd, -1);
    c->log = o.log;
    c->log_payload = o.log_payload;
    c->log_level = o.log_level;
    c->trace = o.trace;
    c->trace_payload = o.trace_payload;
    dlock__clear_trusted_env(c);
    if (pthread_mutex_init(&c->mu, NULL) != 0 || dlock__cond_init(&c->wake) != 0 ||
        dlock__cond_init(&c->idle) != 0) {
        free(c);
        return dlock__fail(DLOCK_ENOMEM, "cannot create client mutex");
    }
    if ((rc = dlock__url_parse(&c->url, url)) != DLOCK_OK)
        goto err;
    c->backend = dlock__find_backend(c->url.scheme, NULL);
    if (c->backend == NULL && (rc = dlock__module_load(c->url.scheme, &c->backend)) != DLOCK_OK)
        goto err;
    c->no_threads = (o.flags & DLOCK_CLIENT_NO_THREADS) != 0;
    if (c->no_threads && (c->backend->start == NULL || c->backend->renew_start == NULL)) {
        rc = dlock__fail(DLOCK_ENOTSUP, "dlock_client_open: DLOCK_CLIENT_NO_THREADS: the %s "
                         "backend ('%s://') needs threads of its own; a client without them "
                         "is served on redis://, unix://, rediss:// and Sentinel URLs",
                         c->backend->name, c->url.scheme);
        goto err;
    }
    if ((rc = c->backend->open(&c->be, &c->url, &o)) != DLOCK_OK)
        goto err;
    *out = c;
    return DLOCK_OK;

err:
    dlock__url_free(&c->url);
    pthread_cond_destroy(&c->wake);
    pthread_cond_destroy(&c->idle);
    pthread_mutex_destroy(&c->mu);
    free(c);
    return rc;
}

void dlock_client_free(dlock_client *c)
{
    if (c == NULL || dlock__async_free_begin(c))
        return;
    dlock__watchdog_stop(c);
    dlock__async_free_end(c);
    dlock__interrupt_stop(c);
    /* Locks still held keep valid handles; dlock_release frees them later. */
    for (dlock_lock *l = c->locks; l != NULL; l = l->next)
        l->client = NULL;
    c->backend->close(c->be);
    dlock__url_free(&c->url);
    pthread_cond_destroy(&c->wake);
    pthread_cond_destroy(&c->idle);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* ---- interrupting waiters ------------------------------------------------ */

int dlock__check_interrupt(dlock_client *c, const char *name)
{
    char shown[80];

    if (!atomic_load(&c->interrupted))
        return DLOCK_OK;
    return dlock__fail(DLOCK_EINTR, "waiting for lock '%s' was interrupted "
                       "(dlock_client_interrupt); left the queue",
                       dlock__printable(shown, sizeof(shown), name));
}

void dlock__waiting_add(dlock_client *c, dlock__waiter *w, void *watch)
{
    w->watch = watch;
    pthread_mutex_lock(&c->mu);
    w->next = c->waiting;
    if (w->next != NULL)
        w->next->prev = &w->next;
    w->prev = &c->waiting;
    c->waiting = w;
    pthread_mutex_unlock(&c->mu);
}

/* In constant time: 10,000 waiters on a client leave their list without a
 * walk of it each (issue 33). */
void dlock__waiting_remove(dlock_client *c, dlock__waiter *w)
{
    pthread_mutex_lock(&c->mu);
    if (w->prev != NULL) {
        *w->prev = w->next;
        if (w->next != NULL)
            w->next->prev = w->prev;
        w->prev = NULL;
        w->next = NULL;
    }
    pthread_mutex_unlock(&c->mu);
}

const char *dlock_client_backend(const dlock_client *c)
{
    return c != NULL ? c->backend->name : NULL;
}

static int check_name(const char *name, const char *what)
{
    size_t n;

    if (name == NULL)
        return dlock__fail(DLOCK_EINVAL, "%s: name is NULL", what);
    n = strnlen(name, DLOCK_NAME_MAX + 1);
    if (n == 0)
        return dlock__fail(DLOCK_EINVAL, "%s: name is empty", what);
    if (n > DLOCK_NAME_MAX)
        return dlock__fail(DLOCK_EINVAL, "%s: name is longer than %d bytes", what,
                           DLOCK_NAME_MAX);
    return DLOCK_OK;
}

int dlock__check_name(const char *name, const char *what)
{
    return check_name(name, what);
}

int dlock_status(dlock_lock_info *out, dlock_client *c, const char *name)
{
    dlock__call k;
    int rc;

    dlock__clear_error();
    if (out == NULL || c == NULL)
        return dlock__fail(DLOCK_EINVAL, "dlock_status: NULL argument");
    memset(out, 0, sizeof(*out));
    if ((rc = check_name(name, "dlock_status")) != DLOCK_OK)
        return rc;
    dlock__call_begin(c, &k, "status", name, 1, 0);
    rc = dlock__call_end(c, &k, c->backend->status(c->be, name, out));
    dlock__info_settle(out);
    return rc;
}

int dlock_force_release(dlock_lock_info *removed, dlock_client *c, const char *name)
{
    dlock_lock_info ignored;
    dlock__call k;
    int rc;

    dlock__clear_error();
    if (c == NULL)
        return dlock__fail(DLOCK_EINVAL, "dlock_force_release: client is NULL");
    if (removed == NULL)
        removed = &ignored;
    memset(removed, 0, sizeof(*removed));
    if ((rc = check_name(name, "dlock_force_release")) != DLOCK_OK)
        return rc;
    dlock__call_begin(c, &k, "force_release", name, 1, 0);
    rc = dlock__call_end(c, &k, c->backend->force_release(c->be, name, removed));
    dlock__info_settle(removed);
    return rc;
}

const char *dlock__printable(char *buf, size_t size, const char *name)
{
    size_t i = 0;

    for (; name[i] != '\0' && i + 4 < size; i++) {
        unsigned char ch = (unsigned char)name[i];
        buf[i] = (ch >= 32 && ch < 127) ? (char)ch : '?';
    }
    if (name[i] != '\0' && i >= 3)
        memcpy(buf + i - 3, "...", 3);
    buf[i] = '\0';
    return buf;
}
