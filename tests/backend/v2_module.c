/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A module built against version 2 of the backend interface, as one built
 * out of the tree before versions 3 to 5 appended their calls would be:
 * build/dlock/v2mod.so serves v2mod:// (test_module) with plain_backend.c's
 * calls, in a table of the version 2 layout and size. The library must load
 * it, serve locks with it, and read nothing past its size: what follows the
 * table in memory here are calls that abort the test, where a core that
 * took the table for a current one would find list, holders and the calls
 * after them.
 */
#include <stdio.h>
#include <stdlib.h>

#include <dlock/sys/backend.h>

#include "plain_backend.h"

/* struct dlock_backend as <dlock/sys/backend.h> declared it at version 2
 * (commit 93f6f95), field for field. */
typedef struct {
    unsigned version;
    size_t size;
    const char *name;
    const char *const *schemes;
    unsigned caps;
    int (*open)(void **out, const dlock_url *url, const dlock_client_options *opts);
    void (*close)(void *be);
    int (*acquire)(void *be, const dlock_request *req, void *watch, dlock_acquire_result *out);
    int (*release)(void *be, const dlock_request *req);
    int (*extend)(void *be, const dlock_request *req);
    int (*check)(void *be, const dlock_request *req);
    int (*renew)(void *be, dlock_renewal *items, size_t n);
    int (*watch_begin)(void *be, const dlock_request *req, void **watch);
    int (*watch_wait)(void *be, void *watch, int64_t timeout_ms);
    void (*watch_end)(void *be, void *watch);
    void (*watch_wake)(void *be, void *watch);
    int (*status)(void *be, const char *name, dlock_lock_info *out);
    int (*force_release)(void *be, const char *name, dlock_lock_info *removed);
    int (*downgrade)(void *be, const dlock_request *req);
    int (*set_permits)(void *be, const char *name, int permits);
    int (*leader_get)(void *be, const char *name, dlock_leader_info *out);
    int (*observe_begin)(void *be, const char *name, void **watch);
    int (*multi_atomic)(void *be, const dlock_request *reqs, size_t n);
    int (*multi_acquire)(void *be, const dlock_request *reqs, size_t n, uint64_t *fences,
                         dlock_acquire_result *out);
} backend_v2;

/* Where a v3 table has list: the version 2 layout is the current one's
 * head (checked here, so that the test proves what it means to). */
_Static_assert(sizeof(backend_v2) == offsetof(dlock_backend, list), "the version 2 layout");

static int read_past_the_table(void *be, const char *name, dlock_list_cb cb, void *payload)
{
    (void)be, (void)name, (void)cb, (void)payload;
    fprintf(stderr, "v2mod: the library called a pointer beyond the version 2 table's size\n");
    abort();
}

static const char *const schemes[] = {"v2mod", NULL};

/* The table, and what lies after it in this module's memory. */
static struct {
    backend_v2 table;
    int (*beyond[8])(void *be, const char *name, dlock_list_cb cb, void *payload);
} module;

DLOCK_EXTERN const dlock_backend *dlock_backend_module(void);
const dlock_backend *dlock_backend_module(void)
{
    backend_v2 *t = &module.table;

    t->version = 2;
    t->size = sizeof(backend_v2);
    t->name = "plainredis-v2";
    t->schemes = schemes;
    t->caps = plain_backend.caps;
    t->open = plain_backend.open;
    t->close = plain_backend.close;
    t->acquire = plain_backend.acquire;
    t->release = plain_backend.release;
    t->extend = plain_backend.extend;
    t->check = plain_backend.check;
    t->renew = plain_backend.renew;
    t->watch_begin = plain_backend.watch_begin;
    t->watch_wait = plain_backend.watch_wait;
    t->watch_end = plain_backend.watch_end;
    t->watch_wake = plain_backend.watch_wake;
    t->status = plain_backend.status;
    t->force_release = plain_backend.force_release;
    for (size_t i = 0; i < sizeof(module.beyond) / sizeof(module.beyond[0]); i++)
        module.beyond[i] = read_past_the_table;
    /* An old module's table is its own type: the library reads version and
     * size first. */
    return (const dlock_backend *)(const void *)t;
}
