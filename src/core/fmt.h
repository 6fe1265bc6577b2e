/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Decimal numbers written without printf, for the strings every
 * acquisition and release builds (script arguments, holder records):
 * snprintf("%lld") costs more than the rest of building a command.
 */
#ifndef DLOCK_CORE_FMT_H
#define DLOCK_CORE_FMT_H

#include <stddef.h>
#include <stdint.h>

/* The longest text of a long long, its '-' included, without the NUL. */
#define DLOCK__FMT_LL_MAX 20

/* Writes v in decimal at out (DLOCK__FMT_LL_MAX + 1 bytes at least), with
 * a NUL; returns the number of digits and sign written. */
static inline size_t dlock__fmt_ll(char *out, long long v)
{
    char tmp[DLOCK__FMT_LL_MAX];
    /* Through the unsigned type: -LLONG_MIN does not fit a long long. */
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    size_t n = 0, len = 0;

    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u != 0);
    if (v < 0)
        out[len++] = '-';
    while (n > 0)
        out[len++] = tmp[--n];
    out[len] = '\0';
    return len;
}

#endif
