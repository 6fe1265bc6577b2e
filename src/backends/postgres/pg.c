/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The PostgreSQL backend (module postgres.so; schemes postgres and
 * postgresql): the URL turned into libpq's connection parameters, the
 * table of calls, and the dispatch between the two modes (pg_lease.c,
 * pg_advisory.c). docs/postgres.md has the design.
 *
 *   postgres://USER:PASS@HOST:PORT/DB?mode=lease|advisory&create=1&table=T
 *       &insecure_auth=0|1&key_secret=S
 *
 * Every other query parameter is a libpq connection parameter (sslmode,
 * sslrootcert, connect_timeout, application_name, host=/unix/socket/dir
 * ...), passed through; an unknown one is refused at open. A password or
 * a client certificate to a host that is not this machine gets TLS with
 * the server's certificate and name verified unless the URL says otherwise
 * (secure_transport).
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pg_int.h"

#define KW_MAX 48

static int kw_add(dlock__pg_be *be, int *n, const char *k, const char *v)
{
    if (*n >= KW_MAX - 1)
        return dlock_backend_fail(DLOCK_EINVAL, "postgres URL: too many parameters");
    be->kw[*n] = strdup(k);
    be->val[*n] = strdup(v);
    if (be->kw[*n] == NULL || be->val[*n] == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    (*n)++;
    return DLOCK_OK;
}

/* 1 if key is a connection keyword libpq knows. */
static int libpq_knows(const char *key)
{
    PQconninfoOption *opts = PQconndefaults(), *o;
    int found = 0;

    for (o = opts; o != NULL && o->keyword != NULL; o++)
        if (strcmp(o->keyword, key) == 0)
            found = 1;
    PQconninfoFree(opts);
    return found;
}

static int valid_ident(const char *s)
{
    if (s == NULL || !*s || strlen(s) > DLOCK__PG_IDENT_MAX ||
        !(islower((unsigned char)*s) || *s == '_'))
        return 0;
    for (; *s; s++)
        if (!islower((unsigned char)*s) && !isdigit((unsigned char)*s) && *s != '_')
            return 0;
    return 1;
}

/* host and port lists as libpq takes them ("h1,h2", "p1,p2"). */
static int url_hosts(dlock__pg_be *be, int *n, const dlock_url *url)
{
    char hosts[1024] = "", ports[256] = "";
    size_t hl = 0, pl = 0;
    int any_port = 0, rc;

    for (size_t i = 0; i < url->nhosts; i++) {
        hl += (size_t)snprintf(hosts + hl, hl < sizeof(hosts) ? sizeof(hosts) - hl : 0, "%s%s",
                               i ? "," : "", url->hosts[i].host);
        if (url->hosts[i].port)
            any_port = 1;
        pl += (size_t)snprintf(ports + pl, pl < sizeof(ports) ? sizeof(ports) - pl : 0, "%s%d",
                               i ? "," : "", url->hosts[i].port ? url->hosts[i].port : 5432);
        if (hl >= sizeof(hosts) || pl >= sizeof(ports))
            return dlock_backend_fail(DLOCK_EINVAL, "postgres URL: host list too long");
    }
    if (url->nhosts > 0 && (rc = kw_add(be, n, "host", hosts)) != DLOCK_OK)
        return rc;
    if (any_port && (rc = kw_add(be, n, "port", ports)) != DLOCK_OK)
        return rc;
    snprintf(be->where, sizeof(be->where), "postgres %s%s%s", url->nhosts ? url->hosts[0].host : "",
             url->nhosts && url->hosts[0].port ? ":" : "", "");
    if (url->nhosts && url->hosts[0].port)
        snprintf(be->where + strlen(be->where), sizeof(be->where) - strlen(be->where), "%d",
                 url->hosts[0].port);
    return DLOCK_OK;
}

/* ---- TLS and passwords ------------------------------------------------- */

/* 1 if every entry of the comma-separated list is this machine. */
static int local_list(const char *list)
{
    for (;;) {
        size_t n = strcspn(list, ",");
        if (!dlock_url_host_is_local(list, n))
            return 0;
        if (list[n] == '\0')
            return 1;
        list += n + 1;
    }
}

/* The value libpq will use for keyword k: the last one given, else NULL. */
static const char *kw_get(const dlock__pg_be *be, int n, const char *k)
{
    for (int i = n - 1; i >= 0; i--)
        if (strcmp(be->kw[i], k) == 0)
            return be->val[i];
    return NULL;
}

/* A secret in the environment counts as one in the URL: libpq sends it. */
static int has_password(const dlock__pg_be *be, int n)
{
    const char *env = getenv("PGPASSWORD");
    return kw_get(be, n, "password") != NULL || (env != NULL && *env != '\0');
}

/*
 * libpq's default sslmode=prefer lets a man in the middle answer "no TLS"
 * and ask for the password in clear text, and sslmode=require takes any
 * certificate. So, to a server that is not this machine (by the URL's
 * host and hostaddr as written; a service counts as remote):
 *   - a password or a client certificate (sslcert) asks for
 *     sslmode=verify-full unless the URL names an sslmode;
 *   - a password with an sslmode below verify-ca is refused before any I/O
 *     unless insecure_auth=1 (etcd's name for the same choice);
 * and wherever TLS is required and a password goes, channel_binding=require
 * (unless the URL names one): the password is only ever answered to
 * SCRAM bound to the TLS channel, never sent as md5 or clear text. A
 * loopback or Unix-socket URL keeps libpq's defaults. PGSSLMODE and
 * PGCHANNELBINDING do not count as the URL naming one.
 */
static int secure_transport(dlock__pg_be *be, int *n, const dlock_url *url)
{
    static const char *const weak[] = {"disable", "allow", "prefer", "require"};
    const char *insecure = dlock_url_param_get(url, "insecure_auth");
    const char *host = kw_get(be, *n, "host"), *addr = kw_get(be, *n, "hostaddr");
    const char *mode = kw_get(be, *n, "sslmode"), *cert = kw_get(be, *n, "sslcert");
    int password = has_password(be, *n), local, rc;

    if (insecure != NULL && strcmp(insecure, "0") != 0 && strcmp(insecure, "1") != 0)
        return dlock_backend_fail(DLOCK_EINVAL, "postgres URL: insecure_auth= is 0 or 1");
    if (host == NULL)
        host = getenv("PGHOST");
    if (addr == NULL)
        addr = getenv("PGHOSTADDR");
    local = (host == NULL || local_list(host)) && (addr == NULL || local_list(addr)) &&
            kw_get(be, *n, "service") == NULL && getenv("PGSERVICE") == NULL;
    if (local)
        return DLOCK_OK;
    if (mode == NULL && (password || (cert != NULL && *cert != '\0'))) {
        if ((rc = kw_add(be, n, "sslmode", "verify-full")) != DLOCK_OK)
            return rc;
        be->tls_by_default = 1;
        mode = "verify-full";
    }
    if (!password)
        return DLOCK_OK;
    for (size_t i = 0; mode != NULL && i < sizeof(weak) / sizeof(weak[0]); i++)
        if (strcmp(mode, weak[i]) == 0) {
            if (insecure != NULL && strcmp(insecure, "1") == 0)
                return DLOCK_OK;
            return dlock_backend_fail(
                DLOCK_EINVAL,
                "postgres URL: a password with sslmode=%s to a host that is not loopback "
                "could go to a man in the middle (TLS turned off or not verified): use "
                "sslmode=verify-full (the default with a password) and sslrootcert=CA, or "
                "add insecure_auth=1 to allow it",
                mode);
        }
    if (kw_get(be, *n, "channel_binding") != NULL)
        return DLOCK_OK;
    be->channel_binding_by_default = 1;
    return kw_add(be, n, "channel_binding", "require");
}

/* Free s after overwriting it: no secret is left in freed heap memory. */
static void free_wiped(char *s)
{
    if (s != NULL) {
        volatile char *p = s;
        while (*p)
            *p++ = '\0';
    }
    free(s);
}

static void be_free(dlock__pg_be *be)
{
    if (be == NULL)
        return;
    dlock__pg_listener_free(be);
    dlock__pg_adv_close_all(be);
    dlock__pg_conns_close(be);
    for (int i = 0; be->kw != NULL && i < KW_MAX; i++) {
        free(be->kw[i]);
        free_wiped(be->val[i]);
    }
    free(be->kw);
    free(be->val);
    free(be->prefix);
    free_wiped(be->key_secret);
    EVP_MAC_free(be->hmac);
    pthread_mutex_destroy(&be->mu);
    pthread_cond_destroy(&be->cv);
    pthread_mutex_destroy(&be->smu);
    free(be);
}

/*
 * key_secret=S (advisory mode): the advisory key is HMAC-SHA256(S,
 * key_prefix + name) rather than a hash anyone can compute, so an account
 * without S cannot take or block a name's key before it is in use
 * (pg_advisory.c). In lease mode the table's grants decide who may write.
 */
static int key_secret(dlock__pg_be *be, const dlock_url *url)
{
    const char *v = dlock_url_param_get(url, "key_secret");

    if (v == NULL)
        return DLOCK_OK;
    if (be->mode != DLOCK__PG_MODE_ADVISORY)
        return dlock_backend_fail(DLOCK_EINVAL, "postgres URL: key_secret= is for "
                                  "mode=advisory (in lease mode the table's grants decide "
                                  "who may take a lock)");
    if (*v == '\0')
        return dlock_backend_fail(DLOCK_EINVAL, "postgres URL: key_secret= is empty");
    be->hmac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    be->key_secret = strdup(v);
    if (be->hmac == NULL || be->key_secret == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "postgres: HMAC-SHA256 for key_secret is not "
                                  "available (out of memory?)");
    be->key_secret_len = strlen(v);
    return DLOCK_OK;
}

static int pg_open(void **out, const dlock_url *url, const dlock_client_options *opts)
{
    dlock__pg_be *be;
    const char *mode = dlock_url_param_get(url, "mode");
    const char *create = dlock_url_param_get(url, "create");
    const char *table = dlock_url_param_get(url, "table");
    const char *prefix = opts->key_prefix != NULL ? opts->key_prefix : "dlock:";
    int n = 0, rc;

    *out = NULL;
    if ((be = calloc(1, sizeof(*be))) == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    pthread_mutex_init(&be->mu, NULL);
    pthread_cond_init(&be->cv, NULL);
    pthread_mutex_init(&be->smu, NULL);
    be->kw = calloc(KW_MAX, sizeof(char *));
    be->val = calloc(KW_MAX, sizeof(char *));
    be->prefix = strdup(prefix);
    if (be->kw == NULL || be->val == NULL || be->prefix == NULL) {
        be_free(be);
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    }
    be->prefix_len = strlen(prefix);
    be->connect_ms = opts->connect_timeout_ms;
    be->command_ms = opts->command_timeout_ms;
    be->log = opts->log;
    be->log_payload = opts->log_payload;

    if (mode == NULL || strcmp(mode, "lease") == 0)
        be->mode = DLOCK__PG_MODE_LEASE;
    else if (strcmp(mode, "advisory") == 0)
        be->mode = DLOCK__PG_MODE_ADVISORY;
    else {
        be_free(be);
        return dlock_backend_fail(DLOCK_EINVAL, "postgres URL: mode must be lease or advisory");
    }
    if (create != NULL && strcmp(create, "0") != 0 && strcmp(create, "1") != 0) {
        be_free(be);
        return dlock_backend_fail(DLOCK_EINVAL, "postgres URL: create must be 0 or 1");
    }
    if (table != NULL && !valid_ident(table)) {
        be_free(be);
        return dlock_backend_fail(DLOCK_EINVAL,
                                  "postgres URL: table must be 1..%d of a-z, 0-9 and _, "
                                  "not starting with a digit",
                                  DLOCK__PG_IDENT_MAX);
    }
    snprintf(be->table, sizeof(be->table), "%s", table ? table : "dlock_locks");
    snprintf(be->seq, sizeof(be->seq), "%s_fence", be->table);

    if ((rc = url_hosts(be, &n, url)) != DLOCK_OK)
        goto fail;
    if (url->user != NULL && (rc = kw_add(be, &n, "user", url->user)) != DLOCK_OK)
        goto fail;
    if (url->password != NULL && (rc = kw_add(be, &n, "password", url->password)) != DLOCK_OK)
        goto fail;
    if (url->path != NULL && url->path[0] == '/' && url->path[1] != '\0' &&
        (rc = kw_add(be, &n, "dbname", url->path + 1)) != DLOCK_OK)
        goto fail;
    if ((rc = kw_add(be, &n, "fallback_application_name",
                     opts->client_name != NULL ? opts->client_name : "dlock")) != DLOCK_OK)
        goto fail;
    for (size_t i = 0; i < url->nparams; i++) {
        const char *k = url->params[i].key;
        if (strcmp(k, "mode") == 0 || strcmp(k, "create") == 0 || strcmp(k, "table") == 0 ||
            strcmp(k, "insecure_auth") == 0 || strcmp(k, "key_secret") == 0)
            continue;
        if (strcmp(k, "password") == 0 || strcmp(k, "dbname") == 0 || !libpq_knows(k)) {
            rc = dlock_backend_fail(DLOCK_EINVAL,
                                    "postgres URL: unknown parameter '%s' (dlock's: mode, "
                                    "create, table, insecure_auth, key_secret; else libpq's "
                                    "connection parameters)",
                                    k);
            goto fail;
        }
        if ((rc = kw_add(be, &n, k, url->params[i].value ? url->params[i].value : "")) !=
            DLOCK_OK)
            goto fail;
    }
    if (url->nhosts == 0) {
        const char *h = dlock_url_param_get(url, "host");
        snprintf(be->where, sizeof(be->where), "postgres %s", h ? h : "(default socket)");
    }
    if ((rc = secure_transport(be, &n, url)) != DLOCK_OK ||
        (rc = key_secret(be, url)) != DLOCK_OK)
        goto fail;
    /* Connects and checks credentials and database; makes the table and
     * the sequence on first use unless create=0. */
    if ((rc = dlock__pg_create(be, create == NULL || strcmp(create, "1") == 0)) != DLOCK_OK)
        goto fail;
    *out = be;
    return DLOCK_OK;
fail:
    be_free(be);
    return rc;
}

static void pg_close(void *be)
{
    be_free(be);
}

/* Advisory mode serves the mutex only: a session-level advisory lock has
 * no lease, no queue and no room for readers or permits. The caps are the
 * backend's, not the mode's, so the refusal is here. */
static int advisory_refuses(dlock__pg_be *be, int kind, const char *what)
{
    static const char *const kinds[] = {"mutex", "fair lock", "read-write lock",
                                        "read-write lock", "semaphore", "leader election"};
    if (be->mode != DLOCK__PG_MODE_ADVISORY || kind == DLOCK_KIND_MUTEX)
        return DLOCK_OK;
    return dlock_backend_fail(DLOCK_ENOTSUP,
                              "%s: mode=advisory serves the plain mutex only, not %s%s (use "
                              "mode=lease, the default, for the lock family)",
                              be->where, what != NULL ? what : kinds[kind],
                              what != NULL ? "" : "s");
}

static int pg_acquire(void *vbe, const dlock_request *req, void *watch, dlock_acquire_result *out)
{
    dlock__pg_be *be = vbe;
    int rc;

    if ((rc = advisory_refuses(be, req->kind, NULL)) != DLOCK_OK)
        return rc;
    if (req->kind != DLOCK_KIND_MUTEX) {
        rc = dlock__pg_fam_acquire(be, req, dlock__pg_watch_id(watch), out);
        /* A busy try left a place in line; so may one whose reply was lost. */
        if ((rc == DLOCK_EBUSY || rc == DLOCK_ECONN) && watch != NULL &&
            (req->kind == DLOCK_KIND_FAIR || req->kind == DLOCK_KIND_WRITE))
            dlock__pg_watch_queued(watch);
    } else {
        rc = be->mode == DLOCK__PG_MODE_LEASE ? dlock__pg_lease_acquire(be, req, out)
                                              : dlock__pg_adv_acquire(be, req, out);
    }
    /* A lost reply may have taken the lock (lease mode; in advisory mode
     * the closed session gave it back). */
    dlock__pg_watch_note(watch,
                         rc == DLOCK_ECONN && be->mode == DLOCK__PG_MODE_LEASE ? req->token : NULL);
    return rc;
}

int dlock__pg_release(void *vbe, const dlock_request *req)
{
    dlock__pg_be *be = vbe;
    if (req->kind != DLOCK_KIND_MUTEX && be->mode == DLOCK__PG_MODE_LEASE)
        return dlock__pg_fam_release(be, req);
    return be->mode == DLOCK__PG_MODE_LEASE ? dlock__pg_lease_release(be, req)
                                            : dlock__pg_adv_release(be, req);
}

static int pg_extend(void *vbe, const dlock_request *req)
{
    dlock__pg_be *be = vbe;
    if (req->kind != DLOCK_KIND_MUTEX && be->mode == DLOCK__PG_MODE_LEASE)
        return dlock__pg_fam_extend(be, req);
    return be->mode == DLOCK__PG_MODE_LEASE ? dlock__pg_lease_extend(be, req)
                                            : dlock__pg_adv_extend(be, req);
}

static int pg_check(void *vbe, const dlock_request *req)
{
    dlock__pg_be *be = vbe;
    if (req->kind != DLOCK_KIND_MUTEX && be->mode == DLOCK__PG_MODE_LEASE)
        return dlock__pg_fam_check(be, req);
    return be->mode == DLOCK__PG_MODE_LEASE ? dlock__pg_lease_check(be, req)
                                            : dlock__pg_adv_check(be, req);
}

static int pg_renew(void *vbe, dlock_renewal *items, size_t n)
{
    dlock__pg_be *be = vbe;
    return be->mode == DLOCK__PG_MODE_LEASE ? dlock__pg_lease_renew(be, items, n)
                                            : dlock__pg_adv_renew(be, items, n);
}

static int pg_status(void *vbe, const char *name, dlock_lock_info *out)
{
    dlock__pg_be *be = vbe;
    int rc;

    if (be->mode != DLOCK__PG_MODE_LEASE)
        return dlock__pg_adv_status(be, name, out);
    if ((rc = dlock__pg_lease_status(be, name, out)) != DLOCK_OK)
        return rc;
    if (out->held) {
        out->kind = DLOCK_KIND_MUTEX;
        out->holders = 1;
        return DLOCK_OK;
    }
    out->kind = -1;
    return dlock__pg_fam_status(be, name, out);
}

static int pg_force_release(void *vbe, const char *name, dlock_lock_info *removed)
{
    dlock__pg_be *be = vbe;
    int rc;

    if (be->mode != DLOCK__PG_MODE_LEASE)
        return dlock__pg_adv_force_release(be, name, removed);
    if ((rc = dlock__pg_lease_force_release(be, name, removed)) != DLOCK_OK)
        return rc;
    removed->kind = removed->held ? DLOCK_KIND_MUTEX : -1;
    /* Both tables: a force release breaks whatever kind holds the name. */
    return dlock__pg_fam_force_release(be, name, removed);
}

/* dlock_list over both tables: cb's answer to stop is kept across them. */
typedef struct {
    dlock_list_cb cb;
    void *payload;
    int stopped;
} list_ctx;

static int list_mutex(const char *name, const dlock_lock_info *info, void *arg)
{
    list_ctx *x = arg;
    dlock_lock_info i = *info;

    i.kind = DLOCK_KIND_MUTEX;
    return x->stopped = x->cb(name, &i, x->payload);
}

static int list_family(const char *name, const dlock_lock_info *info, void *arg)
{
    list_ctx *x = arg;
    return x->stopped = x->cb(name, info, x->payload);
}

static int pg_list(void *vbe, const char *prefix, dlock_list_cb cb, void *payload)
{
    dlock__pg_be *be = vbe;
    list_ctx x = {cb, payload, 0};
    int rc;

    if (be->mode != DLOCK__PG_MODE_LEASE)
        return dlock_backend_fail(DLOCK_ENOTSUP,
                                  "%s: listing is not offered in advisory mode (pg_locks "
                                  "shows hashes, not names)",
                                  be->where);
    if ((rc = dlock__pg_lease_list(be, prefix, list_mutex, &x)) != DLOCK_OK || x.stopped)
        return rc;
    return dlock__pg_fam_list(be, prefix, list_family, &x);
}

/* Advisory mode, and a table without its family (create=0): the one
 * holder status reads. */
static int pg_holders(void *vbe, const char *name, dlock_list_cb cb, void *payload)
{
    dlock__pg_be *be = vbe;
    dlock_lock_info info;
    int rc;

    if (be->mode == DLOCK__PG_MODE_LEASE && be->has_family)
        return dlock__pg_fam_holders(be, name, cb, payload);
    memset(&info, 0, sizeof(info));
    if ((rc = pg_status(be, name, &info)) != DLOCK_OK || !info.held)
        return rc;
    info.holders = 1;
    info.kind = DLOCK_KIND_MUTEX;
    cb(name, &info, payload);
    return DLOCK_OK;
}

static int pg_downgrade(void *vbe, const dlock_request *req)
{
    dlock__pg_be *be = vbe;
    int rc = advisory_refuses(be, DLOCK_KIND_WRITE, NULL);
    return rc != DLOCK_OK ? rc : dlock__pg_fam_downgrade(be, req);
}

static int pg_set_permits(void *vbe, const char *name, int permits)
{
    dlock__pg_be *be = vbe;
    int rc = advisory_refuses(be, DLOCK_KIND_SEMAPHORE, NULL);
    return rc != DLOCK_OK ? rc : dlock__pg_fam_set_permits(be, name, permits);
}

static int pg_leader_get(void *vbe, const char *name, dlock_leader_info *out)
{
    dlock__pg_be *be = vbe;
    int rc = advisory_refuses(be, DLOCK_KIND_LEADER, NULL);
    return rc != DLOCK_OK ? rc : dlock__pg_fam_leader_get(be, name, out);
}

/* Observers wait on the name's NOTIFYs: a campaign won, a resignation. */
static int pg_observe_begin(void *vbe, const char *name, void **watch)
{
    dlock__pg_be *be = vbe;
    dlock_request req;
    int rc;

    *watch = NULL;
    if ((rc = advisory_refuses(be, DLOCK_KIND_LEADER, NULL)) != DLOCK_OK)
        return rc;
    memset(&req, 0, sizeof(req));
    req.kind = DLOCK_KIND_LEADER;
    req.name = name;
    return dlock__pg_watch_begin(be, &req, watch);
}

static const char *const pg_schemes[] = {"postgres", "postgresql", NULL};

static const dlock_backend pg_backend = {
    .version = DLOCK_BACKEND_VERSION,
    .size = sizeof(dlock_backend),
    .name = "postgres",
    .schemes = pg_schemes,
    /* Advisory mode refuses all but the mutex itself (advisory_refuses). */
    .caps = DLOCK_CAP_KIND(DLOCK_KIND_MUTEX) | DLOCK_CAP_KIND(DLOCK_KIND_FAIR) |
            DLOCK_CAP_KIND(DLOCK_KIND_READ) | DLOCK_CAP_KIND(DLOCK_KIND_WRITE) |
            DLOCK_CAP_KIND(DLOCK_KIND_SEMAPHORE) | DLOCK_CAP_KIND(DLOCK_KIND_LEADER) |
            DLOCK_CAP_OWNER_IDS,
    .open = pg_open,
    .close = pg_close,
    .acquire = pg_acquire,
    .release = dlock__pg_release,
    .extend = pg_extend,
    .check = pg_check,
    .renew = pg_renew,
    .watch_begin = dlock__pg_watch_begin,
    .watch_wait = dlock__pg_watch_wait,
    .watch_end = dlock__pg_watch_end,
    .watch_wake = dlock__pg_watch_wake,
    .watch_notify = dlock__pg_watch_notify,
    .status = pg_status,
    .force_release = pg_force_release,
    .downgrade = pg_downgrade,
    .set_permits = pg_set_permits,
    .leader_get = pg_leader_get,
    .observe_begin = pg_observe_begin,
    .list = pg_list,
    .holders = pg_holders,
};

DLOCK_BACKEND_MODULE(pg_backend)

/* For static programs and the tests: the table without loading a module
 * (dlock_backend_register("postgres", dlock_postgres_backend())). */
DLOCK_EXTERN const dlock_backend *dlock_postgres_backend(void);
const dlock_backend *dlock_postgres_backend(void)
{
    return &pg_backend;
}
