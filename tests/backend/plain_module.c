/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The out-of-tree backend of plain_backend.c again, as a loadable module:
 * build/dlock/plainmod.so serves plainmod:// (test_module). The same table,
 * under a scheme of its own, so that the library finds it by scheme.
 */
#include <dlock/sys/backend.h>

#include "plain_backend.h"

static const char *const schemes[] = {"plainmod", NULL};
static dlock_backend table;

DLOCK_EXTERN const dlock_backend *dlock_backend_module(void);
const dlock_backend *dlock_backend_module(void)
{
    table = plain_backend;
    table.schemes = schemes;
    return &table;
}
