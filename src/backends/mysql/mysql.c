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
    my_be *be = arg;

    if (be == NULL)
        return;
    my_drop(&be->cmd);
    my_drop(&be->wd);
    my_drop(&be->wake); /* lets go of every wake channel */
    my_named_close(be);
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
    my_be *be;
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
    if ((rc = my_parse_url(be, url, opts)) != DLOCK_OK)
        goto err;
    /* Connect now, so that a wrong address, credentials or database are
     * reported by open, and make the schema on first use. */
    if ((rc = my_connect(be, &be->cmd)) != DLOCK_OK || (rc = my_schema(be, &be->cmd)) != DLOCK_OK)
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

static int my_acquire(void *arg, const dlock_request *req, void *watch, dlock_acquire_result *out)
{
    my_be *be = arg;

    return be->named ? my_named_acquire(be, req, watch, out)
                     : my_lease_acquire(be, req, watch, out);
}

static int my_release(void *arg, const dlock_request *req)
{
    return ((my_be *)arg)->named ? my_named_release(arg, req) : my_lease_release(arg, req);
}

static int my_extend(void *arg, const dlock_request *req)
{
    return ((my_be *)arg)->named ? my_named_extend(arg, req) : my_lease_extend(arg, req);
}

static int my_check(void *arg, const dlock_request *req)
{
    return ((my_be *)arg)->named ? my_named_check(arg, req) : my_lease_check(arg, req);
}

static int my_renew(void *arg, dlock_renewal *items, size_t n)
{
    return ((my_be *)arg)->named ? my_named_renew(arg, items, n)
                                 : my_lease_renew(arg, items, n);
}

static int my_status(void *arg, const char *name, dlock_lock_info *out)
{
    my_be *be = arg;

    return be->named ? my_named_status(be, name, 0, out) : my_lease_status(be, name, 0, out);
}

static int my_force_release(void *arg, const char *name, dlock_lock_info *removed)
{
    my_be *be = arg;

    return be->named ? my_named_status(be, name, 1, removed)
                     : my_lease_status(be, name, 1, removed);
}

static int my_list(void *arg, const char *prefix, dlock_list_cb cb, void *payload)
{
    my_be *be = arg;

    return be->named ? my_named_list(be, prefix, cb, payload)
                     : my_lease_list(be, prefix, cb, payload);
}

static const char *const my_schemes[] = {"mysql", "mariadb", NULL};

/* The table: the module's entry returns it; a static user registers it
 * (dlock_backend_register("mysql", &dlock_mysql_backend)). */
extern const dlock_backend dlock_mysql_backend;
const dlock_backend dlock_mysql_backend = {
    .version = DLOCK_BACKEND_VERSION,
    .size = sizeof(dlock_backend),
    .name = "mysql",
    .schemes = my_schemes,
    .caps = DLOCK_CAP_KIND(DLOCK_KIND_MUTEX),
    .open = my_open,
    .close = my_close,
    .acquire = my_acquire,
    .release = my_release,
    .extend = my_extend,
    .check = my_check,
    .renew = my_renew,
    .watch_begin = my_watch_begin,
    .watch_wait = my_watch_wait,
    .watch_end = my_watch_end,
    .watch_wake = my_watch_wake,
    .status = my_status,
    .force_release = my_force_release,
    .list = my_list,
};

DLOCK_BACKEND_MODULE(dlock_mysql_backend)
