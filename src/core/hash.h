/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A string's hash for the tables that find a lock, a token or a channel by
 * name among thousands (FNV-1a: short keys, no adversary who gains by
 * collisions beyond a longer chain).
 */
#ifndef DLOCK_CORE_HASH_H
#define DLOCK_CORE_HASH_H

#include <stddef.h>

static inline size_t dlock__hash_str(const char *s)
{
    size_t h = 2166136261u;

    for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++)
        h = (h ^ *p) * 16777619u;
    return h;
}

#endif
