/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Modules the library must refuse (test_module), one source built twice:
 * BAD_VERSION gives badver.so, a table of another interface version; without
 * it, noentry.so has no dlock_backend_module at all.
 */
#include <dlock/sys/backend.h>

#ifdef BAD_VERSION
static const char *const schemes[] = {"badver", NULL};
static const dlock_backend table = {
    .version = 999,
    .size = sizeof(dlock_backend),
    .name = "badver",
    .schemes = schemes,
    .caps = DLOCK_CAP_KIND(DLOCK_KIND_MUTEX),
};
DLOCK_BACKEND_MODULE(table)
#else
DLOCK_EXTERN int dlock_not_a_backend(void);
int dlock_not_a_backend(void)
{
    return 0;
}
#endif
