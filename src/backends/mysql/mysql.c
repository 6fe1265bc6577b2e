/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The MySQL / MariaDB backend (module mysql.so; schemes mysql and mariadb):
 * open and close, and the table that sends each call to the mode the URL
 * chose (mysql_int.h has the map of the files; docs/mysql.md the design).
 */
#include <stdlib.h>
#include <string.h>

#include "mysql_int.h"

static void free_str(char **s)
{
    if (*s != NULL) {
        /* The password, and the rest alike: wiped before it is freed. */
        explicit_bzero(*s, strlen(*s)); /* a memset before free may be dropped */
        free(*s);
        *s = NULL;
    }
}

static void my_close(void *arg)
{
    dlock__my_be *be = arg;

    if (be == NULL)
        return;
    dlock__my_drop(&be->cmd);
    dlock__my_drop(&be->wd);
    dlock__my_drop(&be->wake); /* lets go of every wake channel */
    dlock__my_named_close(be);
    pthread_mutex_destroy(&be->mu);
    pthread_mutex_destroy(&be->wake_mu);
    pthread_mutex_destroy(&be->named_mu);
    free_str(&be->host);
    free_str(&be->user);
    free_str(&be->password);
    free_str(&be->db);
    free_str(&be->socket);
    free_str(&be->prefix);
    free_str(&be->ssl_key);
    free_str(&be->ssl_cert);
    free_str(&be->ssl_ca);
    free_str(&be->ssl_capath);
    free_str(&be->ssl_cipher);
    free_str(&be->key_secret);
    free(be);
}

static pthread_once_t library_once = PTHREAD_ONCE_INIT;
static int library_rc;

static void library_init(void)
{
    library_rc = mysql_library_init(0, NULL, NULL);
}

static int my_open(void **out, const dlock_url *url, const dlock_client_options *opts)
{
    dlock__my_be *be;
    int rc;

    *out = NULL;
    pthread_once(&library_once, library_init);
    if (library_rc != 0)
        return dlock_backend_fail(DLOCK_ENOMEM, "mysql: the client library failed to start");
    if ((be = calloc(1, sizeof(*be))) == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    pthread_mutex_init(&be->mu, NULL);
    pthread_mutex_init(&be->wake_mu, NULL);
    pthread_mutex_init(&be->named_mu, NULL);
    if ((rc = dlock__my_parse_url(be, url, opts)) != DLOCK_OK)
        goto err;
    /* Connect now, so that a wrong address, credentials or database are
     * reported by open, and make the schema on first use. */
    if ((rc = dlock__my_connect(be, &be->cmd)) != DLOCK_OK ||
        (rc = dlock__my_schema(be, &be->cmd)) != DLOCK_OK)
        goto err;
    be->log = opts != NULL && opts->version >= 2 ? opts->log : NULL;
    be->log_payload = opts != NULL && opts->version >= 2 ? opts->log_payload : NULL;
    *out = be;
    return DLOCK_OK;
err:
    my_close(be);
    return rc;
}

/* ---- dispatch by mode --------------------------------------------------- */

/* Named mode serves the plain mutex alone: caps are the table's, so the
 * rest is refused here. */
static int named_refuses(dlock__my_be *be, const char *what)
{
    return dlock_backend_fail(DLOCK_ENOTSUP,
                              "%s: mode=named serves the plain mutex only, not %s (owner ids and "
                              "the lock family need the lease mode: drop mode=named)",
                              be->where, what);
}

static const char *kind_text(const dlock_request *req)
{
    static const char *const kinds[] = {"owner ids", "fair locks", "read-write locks",
                                        "read-write locks", "semaphores", "leader election"};

    return req->kind >= 0 && req->kind <= DLOCK_KIND_LEADER ? kinds[req->kind] : "this kind";
}

static int my_acquire(void *arg, const dlock_request *req, void *watch, dlock_acquire_result *out)
{
    dlock__my_be *be = arg;

    if (be->named)
        return dlock__my_family_request(req) ? named_refuses(be, kind_text(req))
                                             : dlock__my_named_acquire(be, req, watch, out);
    return dlock__my_family_request(req) ? dlock__my_fam_acquire(be, req, watch, out)
                                         : dlock__my_lease_acquire(be, req, watch, out);
}

static int my_release(void *arg, const dlock_request *req)
{
    dlock__my_be *be = arg;

    if (be->named)
        return dlock__my_named_release(be, req);
    return dlock__my_family_request(req) ? dlock__my_fam_release(be, req)
                                         : dlock__my_lease_release(be, req);
}

static int my_extend(void *arg, const dlock_request *req)
{
    dlock__my_be *be = arg;

    if (be->named)
        return dlock__my_named_extend(be, req);
    return dlock__my_family_request(req) ? dlock__my_fam_extend(be, req)
                                         : dlock__my_lease_extend(be, req);
}

static int my_check(void *arg, const dlock_request *req)
{
    dlock__my_be *be = arg;

    if (be->named)
        return dlock__my_named_check(be, req);
    return dlock__my_lease_check(be, req, dlock__my_family_request(req));
}

/* Lease mode: the plain leases in one batch, the family's holds in another. */
static int my_renew(void *arg, dlock_renewal *items, size_t n)
{
    dlock__my_be *be = arg;
    dlock_renewal *part[2] = {NULL, NULL};
    size_t np[2] = {0, 0};
    int rc = DLOCK_OK;

    if (be->named)
        return dlock__my_named_renew(be, items, n);
    for (int k = 0; k < 2; k++)
        if ((part[k] = malloc((n ? n : 1) * sizeof(**part))) == NULL) {
            rc = dlock_backend_fail(DLOCK_ENOMEM, "%s: out of memory", be->where);
            goto done;
        }
    for (size_t i = 0; i < n; i++) {
        int k = dlock__my_family_request(items[i].req);
        part[k][np[k]++] = items[i];
    }
    if ((rc = dlock__my_lease_renew(be, part[0], np[0])) != DLOCK_OK ||
        (rc = dlock__my_fam_renew(be, part[1], np[1])) != DLOCK_OK)
        goto done;
    np[0] = np[1] = 0;
    for (size_t i = 0; i < n; i++) {
        int k = dlock__my_family_request(items[i].req);
        items[i].result = part[k][np[k]++].result;
    }
done:
    free(part[0]);
    free(part[1]);
    return rc;
}

static int my_status(void *arg, const char *name, dlock_lock_info *out)
{
    dlock__my_be *be = arg;

    return be->named ? dlock__my_named_status(be, name, 0, out)
                     : dlock__my_lease_status(be, name, 0, out);
}

static int my_force_release(void *arg, const char *name, dlock_lock_info *removed)
{
    dlock__my_be *be = arg;

    return be->named ? dlock__my_named_status(be, name, 1, removed)
                     : dlock__my_lease_status(be, name, 1, removed);
}

static int my_list(void *arg, const char *prefix, dlock_list_cb cb, void *payload)
{
    dlock__my_be *be = arg;

    return be->named ? dlock__my_named_list(be, prefix, cb, payload)
                     : dlock__my_lease_list(be, prefix, cb, payload);
}

static int my_holders(void *arg, const char *name, dlock_list_cb cb, void *payload)
{
    dlock__my_be *be = arg;
    dlock_lock_info info;
    int rc;

    if (!be->named)
        return dlock__my_fam_holders(be, name, cb, payload);
    if ((rc = dlock__my_named_status(be, name, 0, &info)) == DLOCK_OK && info.held)
        cb(name, &info, payload);
    return rc;
}

static int my_downgrade(void *arg, const dlock_request *req)
{
    dlock__my_be *be = arg;

    return be->named ? named_refuses(be, "read-write locks") : dlock__my_fam_downgrade(be, req);
}

static int my_set_permits(void *arg, const char *name, int permits)
{
    dlock__my_be *be = arg;

    return be->named ? named_refuses(be, "semaphores")
                     : dlock__my_fam_set_permits(be, name, permits);
}

static int my_leader_get(void *arg, const char *name, dlock_leader_info *out)
{
    dlock__my_be *be = arg;

    memset(out, 0, sizeof(*out));
    return be->named ? named_refuses(be, "leader election")
                     : dlock__my_fam_leader_get(be, name, out);
}

static int my_observe(void *arg, const char *name, void **watch)
{
    dlock__my_be *be = arg;

    *watch = NULL;
    return be->named ? named_refuses(be, "leader election")
                     : dlock__my_observe_begin(be, name, watch);
}

static const char *const my_schemes[] = {"mysql", "mariadb", NULL};

static const dlock_backend my_backend = {
    .version = DLOCK_BACKEND_VERSION,
    .size = sizeof(dlock_backend),
    .name = "mysql",
    .schemes = my_schemes,
    /* Lease mode; named mode refuses all but the plain mutex (named_refuses). */
    .caps = DLOCK_CAP_KIND(DLOCK_KIND_MUTEX) | DLOCK_CAP_KIND(DLOCK_KIND_FAIR) |
            DLOCK_CAP_KIND(DLOCK_KIND_READ) | DLOCK_CAP_KIND(DLOCK_KIND_WRITE) |
            DLOCK_CAP_KIND(DLOCK_KIND_SEMAPHORE) | DLOCK_CAP_KIND(DLOCK_KIND_LEADER) |
            DLOCK_CAP_OWNER_IDS,
    .open = my_open,
    .close = my_close,
    .acquire = my_acquire,
    .release = my_release,
    .extend = my_extend,
    .check = my_check,
    .renew = my_renew,
    .watch_begin = dlock__my_watch_begin,
    .watch_wait = dlock__my_watch_wait,
    .watch_end = dlock__my_watch_end,
    .watch_wake = dlock__my_watch_wake,
    .status = my_status,
    .force_release = my_force_release,
    .downgrade = my_downgrade,
    .set_permits = my_set_permits,
    .leader_get = my_leader_get,
    .observe_begin = my_observe,
    .list = my_list,
    .holders = my_holders,
};

DLOCK_BACKEND_MODULE(my_backend)

/* For static programs and the tests: the table without loading a module
 * (dlock_backend_register("mysql", dlock_mysql_backend())). */
DLOCK_EXTERN const dlock_backend *dlock_mysql_backend(void);
const dlock_backend *dlock_mysql_backend(void)
{
    return &my_backend;
}
