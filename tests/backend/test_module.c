/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Backend modules (include/dlock/sys/backend.h): a client opened with a
 * scheme no backend serves loads the module of that name from
 * DLOCK_MODULE_DIR (CTest sets it to build/dlock) and uses it; a module that
 * is missing, not a dlock backend, or built for an interface version the
 * library does not serve is refused with a message naming the file. Tables
 * of every version from 2 on are served (v2_module.c); tables of other
 * versions or too small are refused, naming what is wrong.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dlock/dlock.h"
#include "dlock/sys/backend.h"
#include "plain_backend.h"
#include "test.h"

extern const dlock_backend dlock__redis_backend;
extern const dlock_backend dlock__etcd_backend;
extern const dlock_backend dlock__redlock_backend;

static void module_serves_its_scheme(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *l;
    char url[128];

    test_redis_start(&r, NULL);
    snprintf(url, sizeof(url), "plainmod://127.0.0.1:%d", r.port);
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_OK);
    CHECK(strcmp(dlock_client_backend(c), "plainredis") == 0);
    CHECK_RC(dlock_acquire(&l, c, "module-lock", NULL), DLOCK_OK);
    CHECK(dlock_lock_fence(l) > 0);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    /* Loaded once: a second client uses the same table. */
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_OK);
    dlock_client_free(c);
    test_redis_stop(&r);
}

static void missing_module_named(void)
{
    dlock_client *c = NULL;

    setenv("DLOCK_MODULE_DIR", "/nonexistent-dlock-modules", 1);
    CHECK_RC(dlock_client_open(&c, "zk://127.0.0.1:1/x", NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "needs the backend module zk.so");
    CHECK_CONTAINS(dlock_error_message(), "/nonexistent-dlock-modules");
    CHECK_RC(dlock_client_open(&c, "postgresql://127.0.0.1:1/x", NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "needs the backend module postgres.so");
    /* A typo is not known, whatever the directory holds. */
    CHECK_RC(dlock_client_open(&c, "reids://127.0.0.1:1", NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "URL scheme 'reids://' is not known");
    /* No file name made of a scheme with other characters. */
    CHECK_RC(dlock_client_open(&c, "x-y://127.0.0.1:1", NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "is not known");
    CHECK(c == NULL);
}

static void module_without_entry_refused(void)
{
    dlock_client *c = NULL;

    CHECK_RC(dlock_client_open(&c, "noentry://127.0.0.1:1", NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "noentry.so is not a dlock backend module");
    CHECK(c == NULL);
}

static void module_of_other_version_refused(void)
{
    dlock_client *c = NULL;

    CHECK_RC(dlock_client_open(&c, "badver://127.0.0.1:1", NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "badver.so");
    CHECK_CONTAINS(dlock_error_message(), "was built for version 999");
    CHECK(c == NULL);
}

static int count_one(const char *name, const dlock_lock_info *info, void *payload)
{
    (void)name, (void)info;
    ++*(int *)payload;
    return 0;
}

/*
 * A module built against version 2 of the interface (v2_module.c: the
 * version 2 layout, size and version number) loads and serves locks. The
 * calls appended since are absent from its table: dlock_list is not
 * supported, dlock_status_holders falls back to status; the library reads
 * nothing past the table's size (the module aborts if it does).
 */
static void module_of_version_2_serves(void)
{
    dlock_acquire_options o = test_opts(0, 5000, 1);
    test_redis r;
    dlock_client *c, *c2;
    dlock_lock *l, *b;
    char url[128];
    int n = 0;

    test_redis_start(&r, NULL);
    snprintf(url, sizeof(url), "v2mod://127.0.0.1:%d", r.port);
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_OK);
    CHECK(strcmp(dlock_client_backend(c), "plainredis-v2") == 0);
    CHECK_RC(dlock_acquire(&l, c, "v2-lock", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(l) > 0);
    CHECK_RC(dlock_lock_check(l), DLOCK_OK);
    CHECK_RC(dlock_lock_extend(l, 6000), DLOCK_OK);
    /* Still a lock: another client is refused while it is held. */
    CHECK_RC(dlock_client_open(&c2, url, NULL), DLOCK_OK);
    CHECK_RC(dlock_acquire(&b, c2, "v2-lock", &o), DLOCK_EBUSY);
    CHECK_RC(dlock_list(c, "", count_one, &n), DLOCK_ENOTSUP);
    CHECK_RC(dlock_status_holders(c, "v2-lock", count_one, &n), DLOCK_OK);
    CHECK(n == 1);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK_RC(dlock_acquire(&b, c2, "v2-lock", &o), DLOCK_OK);
    CHECK_RC(dlock_release(b), DLOCK_OK);
    dlock_client_free(c2);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* A version 5 table built while token_new followed holders (it was dropped
 * since: etcd maps its key ids itself) is larger than this header's: it is
 * served with the calls the library knows, and its token_new, past them,
 * is never called. */
static int old_token_new(void *be, char *out)
{
    (void)be, (void)out;
    fprintf(stderr, "test_module: the library called a version 5 table's token_new\n");
    abort();
}

static void table_of_old_version_5_serves(void)
{
    static struct {
        dlock_backend table;
        int (*token_new)(void *be, char *out);
    } old;
    dlock_acquire_options o = test_opts(0, 5000, 1);
    test_redis r;
    dlock_client *c;
    dlock_lock *l;
    char url[128];

    old.table = plain_backend;
    old.table.version = 5;
    old.table.size = sizeof(old);
    old.token_new = old_token_new;
    CHECK_RC(dlock_backend_register("oldfive", &old.table), DLOCK_OK);
    test_redis_start(&r, NULL);
    snprintf(url, sizeof(url), "oldfive://127.0.0.1:%d", r.port);
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "v5-lock", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(l) > 0);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* Tables the library cannot serve, each refused with a message that names
 * the backend and what is wrong, and nothing registered. */
static void bad_tables_refused(void)
{
    dlock_backend t = plain_backend;
    dlock_client *c = NULL;
    char want[160];

    t.version = 1; /* before the request-based calls */
    CHECK_RC(dlock_backend_register("badtable", &t), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "backend 'plainredis' was built for version 1 of the "
                                          "backend interface");
    snprintf(want, sizeof(want), "serves versions 2 to %d", DLOCK_BACKEND_VERSION);
    CHECK_CONTAINS(dlock_error_message(), want);
    t.version = 0;
    CHECK_RC(dlock_backend_register("badtable", &t), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "was built for version 0");
    t.version = DLOCK_BACKEND_VERSION + 1; /* a newer dlock's header */
    CHECK_RC(dlock_backend_register("badtable", &t), DLOCK_EINVAL);
    snprintf(want, sizeof(want), "was built for version %d of the backend interface, newer "
             "than this library's %d", DLOCK_BACKEND_VERSION + 1, DLOCK_BACKEND_VERSION);
    CHECK_CONTAINS(dlock_error_message(), want);
    /* Smaller than a version 2 table (which ends with multi_acquire). */
    t.version = 2;
    t.size = offsetof(dlock_backend, multi_acquire);
    CHECK_RC(dlock_backend_register("badtable", &t), DLOCK_EINVAL);
    snprintf(want, sizeof(want), "has a table of %zu bytes, smaller than the %zu of a version 2 "
             "table", offsetof(dlock_backend, multi_acquire), offsetof(dlock_backend, list));
    CHECK_CONTAINS(dlock_error_message(), want);
    t.size = 0;
    CHECK_RC(dlock_backend_register("badtable", &t), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "has a table of 0 bytes");
    /* None of them was registered; the least of the good ones is. */
    CHECK_RC(dlock_client_open(&c, "badtable://127.0.0.1:1", NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "is not known");
    t.size = offsetof(dlock_backend, list);
    CHECK_RC(dlock_backend_register("badtable", &t), DLOCK_OK);
    CHECK(c == NULL);
}

/*
 * dlock_scheme (what dlock --help, --list-schemes, the completions and the
 * unknown-scheme error show) against the backends' own tables: the
 * built-in ones, then each shipped module's, read from the module itself;
 * then a scheme registered at run time.
 */
static void schemes_match_tables(void)
{
    static const dlock_backend *const builtin[] = {&dlock__redis_backend, &dlock__etcd_backend,
                                                   &dlock__redlock_backend};
    static const char *const modules[] = {"zk", "postgres", "mysql"};
    const char *want[64], *dir = getenv("DLOCK_MODULE_DIR"), *s;
    size_t nwant = 0, i, first_module;
    dlock_client *c = NULL;
    unsigned flags;

    CHECK(dir != NULL);
    for (i = 0; i < sizeof(builtin) / sizeof(builtin[0]); i++)
        for (const char *const *p = builtin[i]->schemes; *p != NULL; p++)
            want[nwant++] = *p;
    first_module = nwant;
    for (i = 0; i < sizeof(modules) / sizeof(modules[0]); i++) {
        char path[4096];
        void *h;
        const dlock_backend *(*entry)(void);

        snprintf(path, sizeof(path), "%s/%s.so", dir, modules[i]);
        if ((h = dlopen(path, RTLD_NOW | RTLD_LOCAL)) == NULL) {
            /* Not built here: its schemes must say so. */
            fprintf(stderr, "# %s not built (%s)\n", modules[i], dlerror());
            continue;
        }
        *(void **)&entry = dlsym(h, DLOCK_BACKEND_MODULE_SYMBOL);
        CHECK(entry != NULL);
        for (const char *const *p = entry()->schemes; *p != NULL; p++)
            want[nwant++] = *p; /* the module stays mapped: the strings are its */
    }
    for (i = 0; (s = dlock_scheme(i, &flags)) != NULL; i++) {
        if (i < first_module) {
            CHECK(flags == 0);
        } else if (flags & DLOCK_SCHEME_NOT_INSTALLED) {
            CHECK(flags & DLOCK_SCHEME_MODULE);
            continue; /* not built: nothing to compare with */
        } else {
            CHECK(flags == DLOCK_SCHEME_MODULE);
        }
        if (i >= nwant || strcmp(s, want[i]) != 0) {
            fprintf(stderr, "dlock_scheme(%zu) = %s, the tables say %s\n", i, s,
                    i < nwant ? want[i] : "(none)");
            CHECK(0);
        }
    }
    CHECK(i == nwant);
    /* A scheme registered at run time comes last; it keeps its index. */
    CHECK_RC(dlock_backend_register("plainx", &plain_backend), DLOCK_OK);
    CHECK(dlock_scheme(i, &flags) != NULL && strcmp(dlock_scheme(i, &flags), "plainx") == 0);
    CHECK(flags == DLOCK_SCHEME_REGISTERED);
    CHECK(dlock_scheme(i + 1, NULL) == NULL);
    /* The unknown-scheme error lists them all. */
    CHECK_RC(dlock_client_open(&c, "reids://127.0.0.1:1", NULL), DLOCK_EINVAL);
    for (i = 0; (s = dlock_scheme(i, NULL)) != NULL; i++) {
        char shown[64];
        snprintf(shown, sizeof(shown), " %s://", s);
        CHECK_CONTAINS(dlock_error_message(), shown);
    }
}

TEST_MAIN({"module_serves_its_scheme", module_serves_its_scheme, NULL},
          {"missing_module_named", missing_module_named, NULL},
          {"module_without_entry_refused", module_without_entry_refused, NULL},
          {"module_of_other_version_refused", module_of_other_version_refused, NULL},
          {"module_of_version_2_serves", module_of_version_2_serves, NULL},
          {"table_of_old_version_5_serves", table_of_old_version_5_serves, NULL},
          {"bad_tables_refused", bad_tables_refused, NULL},
          {"schemes_match_tables", schemes_match_tables, NULL})
