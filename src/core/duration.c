/* SPDX-License-Identifier: BSD-3-Clause */
#include <string.h>

#include "core/error.h"

/* The units, longest first: a compound duration names each at most once,
 * in this order ("1h30m", not "30m1h"). */
static const struct {
    const char *name;
    int64_t ms;
} units[] = {{"d", 86400000}, {"h", 3600000}, {"m", 60000}, {"s", 1000}, {"ms", 1}};
#define NUNITS (sizeof(units) / sizeof(units[0]))
#define SECONDS 3 /* units[SECONDS] is "s" */
#define FRACTION_DIGITS_MAX 9

static int bad(const char *text, const char *why)
{
    return dlock__fail(DLOCK_EINVAL, "duration '%.64s': %s (e.g. 90s, 1.5s, 250ms, 1h30m; "
                       "units d, h, m, s, ms)", text, why);
}

static int too_long(const char *text)
{
    return dlock__fail(DLOCK_EINVAL, "duration '%.64s': longer than 30 days", text);
}

int dlock_duration_parse(int64_t *out_ms, const char *text)
{
    const char *p = text;
    int64_t total = 0;
    /* What the fractions add below a millisecond, in billionths of one: the
     * sum must come out whole ("9.00000001s9.99999ms" is 9010 ms), not each
     * part (libFuzzer's fuzz_duration found the difference). */
    int64_t below = 0;
    size_t next_unit = 0; /* units before this one are used up */

    dlock__clear_error();
    if (out_ms == NULL || text == NULL)
        return dlock__fail(DLOCK_EINVAL, "duration: NULL argument");
    if (*p == '\0')
        return bad(text, "empty");
    while (*p != '\0') {
        int64_t whole = 0, frac = 0, den = 1, part;
        size_t len, u;

        if (*p < '0' || *p > '9')
            return bad(text, "expected a number");
        for (; *p >= '0' && *p <= '9'; p++) {
            whole = whole * 10 + (*p - '0');
            if (whole > DLOCK_LEASE_MAX_MS)
                return too_long(text);
        }
        if (*p == '.') {
            if (p[1] < '0' || p[1] > '9')
                return bad(text, "expected digits after '.'");
            for (p++; *p >= '0' && *p <= '9'; p++) {
                if (den == 1000000000)
                    return bad(text, "more than 9 digits after '.'");
                frac = frac * 10 + (*p - '0');
                den *= 10;
            }
        }
        len = strspn(p, "abcdefghijklmnopqrstuvwxyz");
        if (len == 0) {
            /* A bare number is seconds ("30", "1.5"), alone only: in "1h30"
             * the 30 could be minutes as well. */
            if (*p != '\0')
                return bad(text, "expected a unit");
            if (next_unit != 0)
                return bad(text, "a number without a unit after another part (a bare "
                           "number is seconds, alone only)");
            u = SECONDS;
        } else {
            for (u = 0; u < NUNITS; u++)
                if (strlen(units[u].name) == len && strncmp(p, units[u].name, len) == 0)
                    break;
            if (u == NUNITS)
                return dlock__fail(DLOCK_EINVAL, "duration '%.64s': unknown unit '%.*s' (use "
                                   "d, h, m, s or ms)", text, (int)(len > 16 ? 16 : len), p);
            if (u < next_unit)
                return bad(text, "units must go from the longest to the shortest, each once");
            p += len;
        }
        next_unit = u + 1;
        /* whole <= 30 days in ms, frac < 10^9 and a unit <= 1 day in ms: no
         * overflow. den is a power of 10 up to 10^9. */
        part = whole * units[u].ms + frac * units[u].ms / den;
        below += frac * units[u].ms % den * (1000000000 / den);
        if (below >= 1000000000) {
            below -= 1000000000;
            part++;
        }
        if (part > DLOCK_LEASE_MAX_MS - total)
            return too_long(text);
        total += part;
    }
    if (below != 0)
        return bad(text, "finer than a millisecond");
    *out_ms = total;
    return DLOCK_OK;
}
