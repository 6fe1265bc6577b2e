/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Backend modules: the backends that need a client library of their own
 * (ZooKeeper, PostgreSQL, MariaDB) live in loadable modules, found by URL
 * scheme the first time a client needs one (include/dlock/sys/backend.h has
 * the rules). Loaded once per process and never unloaded: clients and
 * their threads may still run the module's code at exit.
 */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <unistd.h>

#include "core/client.h"
#include "core/error.h"

#ifndef DLOCK_MODULE_LIBDIR
#define DLOCK_MODULE_LIBDIR "/usr/local/lib/dlock"
#endif

/* The modules dlock ships and the schemes each one's table serves, in the
 * order dlock_scheme lists them (test_module's schemes_match_tables checks
 * this list against the modules' tables). A scheme not here is looked for
 * in a module of its own name. */
static const struct {
    const char *scheme;
    const char *module;
} aliases[] = {
    {"zk", "zk"},
    {"postgres", "postgres"},
    {"postgresql", "postgres"},
    {"mysql", "mysql"},
    {"mariadb", "mysql"},
};

/* The static library each shipped module's code also comes in, and the
 * call that gives its table (docs/static.md), for the advice to a program
 * that cannot load modules. */
static const struct {
    const char *module;
    const char *library;
    const char *table;
} static_twins[] = {
    {"zk", "libdlock_zk.a (pkg-config dlock-zk, CMake dlock::zk_static)", "dlock_zk_backend()"},
    {"postgres", "libdlock_postgres.a (pkg-config dlock-postgres, CMake dlock::postgres_static)",
     "dlock_postgres_backend()"},
    {"mysql", "libdlock_mysql.a (pkg-config dlock-mysql, CMake dlock::mysql_static)",
     "dlock_mysql_backend()"},
};

/* One load at a time: two threads opening zk:// at once load it once. */
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;

static const char *module_name(const char *scheme)
{
    size_t n = strlen(scheme);

    for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++)
        if (strcmp(aliases[i].scheme, scheme) == 0)
            return aliases[i].module;
    /* Letters and digits only: the name becomes a file name. */
    if (n == 0 || n > 32 || strspn(scheme, "abcdefghijklmnopqrstuvwxyz0123456789") != n)
        return NULL;
    return scheme;
}

/* dlock/ beside the libdlock.so this code runs from, or "" when it runs
 * from a program linked with the static library. */
static void dir_beside_library(char *buf, size_t size)
{
    Dl_info info;
    const char *slash, *base;

    buf[0] = '\0';
    if (dladdr((void *)dlock_client_open, &info) == 0 || info.dli_fname == NULL)
        return;
    slash = strrchr(info.dli_fname, '/');
    base = slash != NULL ? slash + 1 : info.dli_fname;
    if (slash == NULL || strncmp(base, "libdlock", 8) != 0)
        return;
    if (snprintf(buf, size, "%.*s/dlock", (int)(slash - info.dli_fname), info.dli_fname) >=
        (int)size)
        buf[0] = '\0';
}

/* "unknown scheme" as dlock_client_open reports it: the message lists the
 * schemes dlock_scheme gives, so that it never lags behind the tables. */
static int unknown_scheme(const char *scheme, const char *where)
{
    char known[512];
    size_t n = 0;
    const char *s;

    known[0] = '\0';
    for (size_t i = 0; (s = dlock_scheme(i, NULL)) != NULL && n < sizeof(known); i++)
        n += (size_t)snprintf(known + n, sizeof(known) - n, "%s%s://", i > 0 ? ", " : "", s);
    return dlock__fail(DLOCK_EINVAL, "URL scheme '%.32s://' is not known (known: %s%s%s)",
                       scheme, known, where != NULL ? "; nor is there a backend module " : "",
                       where != NULL ? where : "");
}

/*
 * Whether a module loaded now would find dlock's calls. A module does not
 * link libdlock: it resolves the dlock_* calls it makes in the process's
 * global scope, which holds them when libdlock.so was loaded as a program's
 * dependency (or with RTLD_GLOBAL), or when a program linked with libdlock.a
 * exports them (-rdynamic). A static program without -rdynamic, or a
 * libdlock.so dlopen()ed with RTLD_LOCAL, has them in no such scope: the
 * load would end in "undefined symbol: dlock_holder_parse".
 */
static int modules_can_link(void)
{
    /* The program's handle searches the global scope alone; RTLD_DEFAULT
     * would search this library's own scope too, and find them there. */
    void *global = dlopen(NULL, RTLD_NOW);
    int found = global != NULL && dlsym(global, "dlock_backend_fail") != NULL;

    if (global != NULL)
        dlclose(global);
    return found;
}

/* The refusal when !modules_can_link(), with what to do instead. */
static int cannot_link(const char *scheme, const char *module)
{
    char lib[PATH_MAX];

    dir_beside_library(lib, sizeof(lib));
    if (lib[0] != '\0')
        return dlock__fail(DLOCK_EINVAL, "URL scheme '%s://' needs the backend module %s.so, "
                           "which cannot find dlock's calls: libdlock.so was loaded with "
                           "RTLD_LOCAL; load it with RTLD_GLOBAL, or link the backend's static "
                           "library and register its table (docs/static.md)", scheme, module);
    for (size_t i = 0; i < sizeof(static_twins) / sizeof(static_twins[0]); i++)
        if (strcmp(static_twins[i].module, module) == 0)
            return dlock__fail(DLOCK_EINVAL, "URL scheme '%s://' needs the backend module "
                               "%s.so, which a program linked with libdlock.a cannot load: link "
                               "%s and call dlock_backend_register_table(%s) before opening the "
                               "client (docs/static.md), or link the program with -rdynamic",
                               scheme, module, static_twins[i].library, static_twins[i].table);
    /* Not one dlock ships: a typo, most likely, as in a program that could
     * load modules. */
    return unknown_scheme(scheme, NULL);
}

/* One table's schemes at a time: two threads registering the same table
 * find each other's schemes served by it, not taken. */
static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;

int dlock_backend_register_table(const dlock_backend *backend)
{
    const dlock_backend *given;
    int rc = DLOCK_OK;

    dlock__clear_error();
    if (backend == NULL)
        return dlock__fail(DLOCK_EINVAL, "dlock_backend_register_table: backend is NULL");
    if (backend->schemes == NULL || backend->schemes[0] == NULL)
        return dlock__fail(DLOCK_EINVAL, "dlock_backend_register_table: backend '%s' lists no "
                           "schemes", backend->name != NULL ? backend->name : "?");
    pthread_mutex_lock(&table_mu);
    for (const char *const *s = backend->schemes; *s != NULL && rc == DLOCK_OK; s++) {
        given = NULL;
        if (dlock__find_backend(*s, &given) != NULL && given == backend)
            continue; /* this table's already: a second call */
        rc = dlock_backend_register(*s, backend);
    }
    pthread_mutex_unlock(&table_mu);
    return rc;
}

static int load_from(const char *dir, const char *module, const char *scheme,
                     const dlock_backend **out)
{
    char path[PATH_MAX];
    void *handle;
    const dlock_backend *(*entry)(void);
    const dlock_backend *b;
    const char *err;
    int rc;

    if (snprintf(path, sizeof(path), "%s/%s.so", dir, module) >= (int)sizeof(path))
        return dlock__fail(DLOCK_EINVAL, "URL scheme '%s://': module path too long", scheme);
    handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        err = dlerror();
        return dlock__fail(DLOCK_EINVAL, "URL scheme '%s://' needs the backend module %s, "
                           "which could not be loaded: %s", scheme, path,
                           err != NULL ? err : "unknown error");
    }
    *(void **)&entry = dlsym(handle, DLOCK_BACKEND_MODULE_SYMBOL);
    if (entry == NULL) {
        dlclose(handle);
        return dlock__fail(DLOCK_EINVAL, "%s is not a dlock backend module (no %s())", path,
                           DLOCK_BACKEND_MODULE_SYMBOL);
    }
    b = entry();
    if (b == NULL || b->schemes == NULL) {
        dlclose(handle);
        return dlock__fail(DLOCK_EINVAL, "%s: the module's table lists no schemes", path);
    }
    for (const char *const *s = b->schemes; *s != NULL; s++)
        if (strcmp(*s, scheme) == 0)
            goto serves;
    dlclose(handle);
    return dlock__fail(DLOCK_EINVAL, "%s does not serve scheme '%s://'", path, scheme);
serves:
    if ((rc = dlock_backend_register_table(b)) != DLOCK_OK) {
        char why[512];

        /* The message buffer is the one dlock__fail writes: copy it. The
         * module stays mapped: an earlier scheme may be served. */
        snprintf(why, sizeof(why), "%s", dlock_error_message());
        return dlock__fail(rc, "%s: %s", path, why);
    }
    /* The core's copy of the table, not the module's: that may be of an
     * older, smaller version. */
    *out = dlock__find_backend(scheme, NULL);
    return DLOCK_OK;
}

const char *dlock__module_scheme(size_t i, const char **module)
{
    if (i >= sizeof(aliases) / sizeof(aliases[0]))
        return NULL;
    if (module != NULL)
        *module = aliases[i].module;
    return aliases[i].scheme;
}

/* Where modules are looked for: DLOCK_MODULE_DIR alone, or beside
 * libdlock.so and then the configured LIBDIR/dlock; "" for none. */
static void module_dirs(char dirs[2][PATH_MAX])
{
    const char *env = secure_getenv("DLOCK_MODULE_DIR");

    if (env != NULL && env[0] != '\0') {
        snprintf(dirs[0], PATH_MAX, "%s", env);
        dirs[1][0] = '\0';
    } else {
        dir_beside_library(dirs[0], PATH_MAX);
        snprintf(dirs[1], PATH_MAX, "%s", DLOCK_MODULE_LIBDIR);
    }
}

/* The first of dirs that holds module.so, or NULL. */
static const char *module_dir(char dirs[2][PATH_MAX], const char *module)
{
    char probe[PATH_MAX];

    for (int i = 0; i < 2; i++)
        if (dirs[i][0] != '\0' &&
            snprintf(probe, sizeof(probe), "%s/%s.so", dirs[i], module) < (int)sizeof(probe) &&
            access(probe, F_OK) == 0)
            return dirs[i];
    return NULL;
}

int dlock__module_installed(const char *module)
{
    char dirs[2][PATH_MAX];

    /* Its code linked in and registered (docs/static.md) serves as well. */
    for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++)
        if (strcmp(aliases[i].module, module) == 0 &&
            dlock__find_backend(aliases[i].scheme, NULL) != NULL)
            return 1;
    if (!modules_can_link())
        return 0;
    module_dirs(dirs);
    return module_dir(dirs, module) != NULL;
}

int dlock__module_load(const char *scheme, const dlock_backend **out)
{
    char dirs[2][PATH_MAX], where[2 * PATH_MAX + 64];
    const char *module = module_name(scheme), *dir;
    int rc = DLOCK_OK, found = 0;

    *out = NULL;
    if (module == NULL)
        return unknown_scheme(scheme, NULL);
    if (!modules_can_link())
        return cannot_link(scheme, module);
    module_dirs(dirs);
    pthread_mutex_lock(&load_mu);
    /* Another thread may have loaded it meanwhile. */
    found = (*out = dlock__find_backend(scheme, NULL)) != NULL;
    if (!found && (dir = module_dir(dirs, module)) != NULL) {
        found = 1;
        rc = load_from(dir, module, scheme, out);
    }
    pthread_mutex_unlock(&load_mu);
    if (found)
        return rc;
    if (module == scheme) { /* no module of that name: a typo, most likely */
        snprintf(where, sizeof(where), "%s.so in %s%s%s", module,
                 dirs[0][0] != '\0' ? dirs[0] : dirs[1],
                 dirs[0][0] != '\0' && dirs[1][0] != '\0' ? " or " : "",
                 dirs[0][0] != '\0' ? dirs[1] : "");
        return unknown_scheme(scheme, where);
    }
    return dlock__fail(DLOCK_EINVAL, "URL scheme '%s://' needs the backend module %s.so, "
                       "found in neither %s nor %s (build dlock with it, or install its "
                       "package; DLOCK_MODULE_DIR names another directory)", scheme, module,
                       dirs[0][0] != '\0' ? dirs[0] : "(no libdlock.so)",
                       dirs[1][0] != '\0' ? dirs[1] : "(DLOCK_MODULE_DIR is set)");
}

/* ---- Set-user-id programs ------------------------------------------------ */

/*
 * The environment variables that a library dlock loads trusts, and that a
 * user who runs a set-user-id (or otherwise AT_SECURE) program could use
 * against it, as the program's owner:
 *   LIBMYSQL_*, MARIADB_*, MYSQL_*: libmariadb loads the plugins named in
 *     LIBMYSQL_PLUGINS from MARIADB_PLUGIN_DIR (code run as root), reads
 *     option files under MARIADB_HOME/MYSQL_HOME, and takes the server's
 *     socket and port from MYSQL_UNIX_PORT, MARIADB_UNIX_PORT and
 *     MYSQL_TCP_PORT (a server of the user's, asking for the password);
 *   PG*: libpq's PGSSLMODE, PGGSSENCMODE and PGCHANNELBINDING weaken TLS,
 *     PGHOST, PGHOSTADDR, PGPORT, PGSERVICEFILE and PGSYSCONFDIR (its
 *     pg_service.conf) point the connection elsewhere, PGPASSFILE,
 *     PGSSLROOTCERT, PGSSLCERT, PGSSLKEY, PGSSLCRL and PGSSLCRLDIR name files
 *     read as the owner, PGLOCALEDIR message catalogs; all PG* go, rather
 *     than a list that a new libpq outgrows;
 *   SSLKEYLOGFILE: libcurl (the etcd backend) writes every TLS session's
 *     keys to that file, created by the owner at the user's path.
 * OpenSSL's own (OPENSSL_CONF, SSL_CERT_FILE, SSL_CERT_DIR, ...) it already
 * ignores when AT_SECURE is set; glibc ignores LD_*; libcurl's proxy
 * variables dlock overrides on every handle; hiredis and the ZooKeeper C
 * client read none. tests/cli/setuid.sh checks the first and the last.
 */
static int trusted_by_a_library(const char *entry)
{
    static const char *const prefixes[] = {"LIBMYSQL_", "MARIADB_", "MYSQL_", "PG",
                                           "SSLKEYLOGFILE="};

    for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++)
        if (strncmp(entry, prefixes[i], strlen(prefixes[i])) == 0)
            return 1;
    return 0;
}

static pthread_mutex_t env_mu = PTHREAD_MUTEX_INITIALIZER;
static int env_cleared; /* under env_mu: done, in this process */

void dlock__clear_trusted_env(dlock_client *c)
{
    extern char **environ;

    if (getauxval(AT_SECURE) == 0)
        return;
    pthread_mutex_lock(&env_mu);
    /* Once: a program's later setenv is its own choice. Each removal moves
     * the entries after it, so look again from the start. */
    for (int again = !env_cleared; again;) {
        again = 0;
        for (char **e = environ; e != NULL && *e != NULL; e++) {
            size_t n = strcspn(*e, "=");
            char *name;
            if ((*e)[n] != '=' || !trusted_by_a_library(*e) || (name = strndup(*e, n)) == NULL)
                continue;
            if (unsetenv(name) == 0) {
                dlock__log(c, DLOCK_LOG_WARN, "set-user-id program: %s removed from the "
                           "environment (a library dlock loads would trust it)", name);
                again = 1;
            }
            free(name);
            if (again)
                break;
        }
    }
    env_cleared = 1;
    pthread_mutex_unlock(&env_mu);
}
