/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Backend modules (include/dlock/sys/backend.h): a client opened with a
 * scheme no backend serves loads the module of that name from
 * DLOCK_MODULE_DIR (CTest sets it to build/dlock) and uses it; a module that
 * is missing, not a dlock backend, or built for another interface version
 * is refused with a message naming the file.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "dlock/dlock.h"
#include "test.h"

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

TEST_MAIN({"module_serves_its_scheme", module_serves_its_scheme, NULL},
          {"missing_module_named", missing_module_named, NULL},
          {"module_without_entry_refused", module_without_entry_refused, NULL},
          {"module_of_other_version_refused", module_of_other_version_refused, NULL})
