/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target: dlock_duration_parse against a reference written
 * straight from the header's words: a non-negative integer, then nothing
 * (seconds), "ms", "s", "m", "h" or "d"; at most DLOCK_LEASE_MAX_MS; anything else is
 * DLOCK_EINVAL and leaves *out alone.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dlock/dlock.h"

/* libFuzzer's entry points. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int reference(const char *t, int64_t *out)
{
    __int128 v = 0;
    size_t i = 0;
    int64_t unit;

    if (t[0] < '0' || t[0] > '9')
        return DLOCK_EINVAL;
    for (; t[i] >= '0' && t[i] <= '9'; i++) {
        v = v * 10 + (t[i] - '0');
        if (v > (__int128)DLOCK_LEASE_MAX_MS * 1000)
            v = (__int128)DLOCK_LEASE_MAX_MS * 1000; /* clamp: over the limit anyway */
    }
    if (strcmp(t + i, "") == 0 || strcmp(t + i, "s") == 0)
        unit = 1000;
    else if (strcmp(t + i, "ms") == 0)
        unit = 1;
    else if (strcmp(t + i, "m") == 0)
        unit = 60000;
    else if (strcmp(t + i, "h") == 0)
        unit = 3600000;
    else if (strcmp(t + i, "d") == 0)
        unit = 86400000;
    else
        return DLOCK_EINVAL;
    if (v * unit > DLOCK_LEASE_MAX_MS)
        return DLOCK_EINVAL;
    *out = (int64_t)(v * unit);
    return DLOCK_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    int64_t got = -42, want = -42;
    int rc, ref;

    if (text == NULL)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    rc = dlock_duration_parse(&got, text);
    ref = reference(text, &want);
    if (rc != ref || got != want)
        abort();
    if (rc != DLOCK_OK && dlock_error_message()[0] == '\0')
        abort();
    free(text);
    return 0;
}
