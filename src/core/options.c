/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Options structs that evolve (after libgit2): a caller built against an
 * older header passes an older version, which is read as far as that
 * version's struct goes; what later versions added keeps its default. The
 * _init calls serve callers that cannot use the C macros (other languages'
 * FFIs).
 */
#include <stddef.h>
#include <string.h>

#include "core/error.h"
#include "core/options.h"

/* sizeof each version's struct, index = version; [0] unused. A new version
 * appends its fields and its size here. */
static const size_t client_sizes[DLOCK_CLIENT_OPTIONS_VERSION + 1] = {
    0, offsetof(dlock_client_options, log), offsetof(dlock_client_options, log_level),
    offsetof(dlock_client_options, flags), sizeof(dlock_client_options)};
static const size_t acquire_sizes[DLOCK_ACQUIRE_OPTIONS_VERSION + 1] = {
    0, offsetof(dlock_acquire_options, label), sizeof(dlock_acquire_options)};

/* Defaults into dst, then the fields version had of given on top. */
static int copy_versioned(void *dst, const void *defaults, const void *given, unsigned version,
                          const size_t *sizes, unsigned current, const char *what,
                          const char *macro)
{
    memcpy(dst, defaults, sizes[current]);
    if (given == NULL)
        return DLOCK_OK;
    if (version < 1 || version > current)
        return dlock__fail(DLOCK_EINVAL, "%s options: version %u, this library knows 1..%u "
                           "(initialise with %s or dlock_%s_options_init)",
                           what, version, current, macro, what);
    memcpy(dst, given, sizes[version]);
    *(unsigned *)dst = current; /* version is every options struct's first field */
    return DLOCK_OK;
}

int dlock__client_options_copy(dlock_client_options *o, const dlock_client_options *given)
{
    const dlock_client_options defaults = DLOCK_CLIENT_OPTIONS_INIT;

    return copy_versioned(o, &defaults, given, given != NULL ? given->version : 0, client_sizes,
                          DLOCK_CLIENT_OPTIONS_VERSION, "client", "DLOCK_CLIENT_OPTIONS_INIT");
}

int dlock__acquire_options_copy(dlock_acquire_options *o, const dlock_acquire_options *given)
{
    const dlock_acquire_options defaults = DLOCK_ACQUIRE_OPTIONS_INIT;

    return copy_versioned(o, &defaults, given, given != NULL ? given->version : 0, acquire_sizes,
                          DLOCK_ACQUIRE_OPTIONS_VERSION, "acquire", "DLOCK_ACQUIRE_OPTIONS_INIT");
}

/* The defaults of version, as far as that version's struct goes. */
static int init_versioned(void *opts, const void *defaults, unsigned version,
                          const size_t *sizes, unsigned current, const char *what)
{
    dlock__clear_error();
    if (opts == NULL)
        return dlock__fail(DLOCK_EINVAL, "dlock_%s_options_init: opts is NULL", what);
    if (version < 1 || version > current)
        return dlock__fail(DLOCK_EINVAL, "dlock_%s_options_init: version %u, this library "
                           "knows 1..%u", what, version, current);
    memcpy(opts, defaults, sizes[version]);
    *(unsigned *)opts = version;
    return DLOCK_OK;
}

int dlock_client_options_init(dlock_client_options *opts, unsigned version)
{
    const dlock_client_options defaults = DLOCK_CLIENT_OPTIONS_INIT;

    return init_versioned(opts, &defaults, version, client_sizes, DLOCK_CLIENT_OPTIONS_VERSION,
                          "client");
}

int dlock_acquire_options_init(dlock_acquire_options *opts, unsigned version)
{
    const dlock_acquire_options defaults = DLOCK_ACQUIRE_OPTIONS_INIT;

    return init_versioned(opts, &defaults, version, acquire_sizes,
                          DLOCK_ACQUIRE_OPTIONS_VERSION, "acquire");
}
