/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target: dlock_duration_parse against a reference written
 * straight from the header's words, in other arithmetic (exact, in
 * billionths of a millisecond, on 128 bits): one or more parts, each
 * digits, optionally '.' and 1 to 9 digits, then a unit d, h, m, s or ms,
 * the units in that order, each once; or one bare number alone (seconds);
 * the sum a whole number of ms, at most DLOCK_LEASE_MAX_MS; anything else
 * is DLOCK_EINVAL and leaves *out alone.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dlock/dlock.h"

/* libFuzzer's entry points. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define BILLION 1000000000

static int digit(char c)
{
    return c >= '0' && c <= '9';
}

static int reference(const char *t, int64_t *out)
{
    static const char *const names[] = {"d", "h", "m", "s", "ms"};
    static const int64_t unit_ms[] = {86400000, 3600000, 60000, 1000, 1};
    const __int128 cap = (__int128)DLOCK_LEASE_MAX_MS * BILLION + 1; /* over it anyway */
    __int128 sum = 0; /* billionths of a ms */
    int last = -1, parts = 0;
    size_t i = 0;

    while (t[i] != '\0') {
        __int128 scaled = 0; /* the number, in billionths */
        int fd = 0, u;
        size_t n;

        if (!digit(t[i]))
            return DLOCK_EINVAL;
        for (; digit(t[i]); i++) {
            scaled = scaled * 10 + (t[i] - '0');
            if (scaled > cap)
                scaled = cap;
        }
        scaled *= BILLION;
        if (t[i] == '.') {
            __int128 frac = 0, weight = BILLION;
            i++;
            for (; digit(t[i]); i++, fd++) {
                if (fd == 9)
                    return DLOCK_EINVAL;
                weight /= 10;
                frac += (t[i] - '0') * weight;
            }
            if (fd == 0)
                return DLOCK_EINVAL;
            scaled += frac;
        }
        for (n = 0; t[i + n] >= 'a' && t[i + n] <= 'z'; n++)
            ;
        if (n == 0) {
            if (t[i] != '\0' || parts != 0)
                return DLOCK_EINVAL;
            u = 3;
        } else {
            for (u = 0; u < 5; u++)
                if (strlen(names[u]) == n && memcmp(names[u], t + i, n) == 0)
                    break;
            if (u == 5 || u <= last)
                return DLOCK_EINVAL;
            i += n;
        }
        last = u;
        parts++;
        sum += scaled * unit_ms[u];
        if (sum > cap * BILLION)
            sum = cap * BILLION;
    }
    if (parts == 0 || sum % BILLION != 0 || sum / BILLION > DLOCK_LEASE_MAX_MS)
        return DLOCK_EINVAL;
    *out = (int64_t)(sum / BILLION);
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
