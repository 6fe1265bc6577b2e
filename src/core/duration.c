/* SPDX-License-Identifier: BSD-3-Clause */
#include <string.h>

#include "core/error.h"

int dlock_duration_parse(int64_t *out_ms, const char *text)
{
    int64_t value = 0, unit;
    const char *p = text;

    dlock__clear_error();
    if (out_ms == NULL || text == NULL)
        return dlock__fail(DLOCK_EINVAL, "duration: NULL argument");
    if (*p < '0' || *p > '9')
        return dlock__fail(DLOCK_EINVAL, "duration '%.64s': expected digits then ms, s, m, h or d", text);
    for (; *p >= '0' && *p <= '9'; p++) {
        value = value * 10 + (*p - '0');
        if (value > DLOCK_LEASE_MAX_MS)
            return dlock__fail(DLOCK_EINVAL, "duration '%.64s': longer than 30 days", text);
    }
    if (*p == '\0' || strcmp(p, "s") == 0)
        unit = 1000;
    else if (strcmp(p, "ms") == 0)
        unit = 1;
    else if (strcmp(p, "m") == 0)
        unit = 60000;
    else if (strcmp(p, "h") == 0)
        unit = 3600000;
    else if (strcmp(p, "d") == 0)
        unit = 86400000;
    else
        return dlock__fail(DLOCK_EINVAL, "duration '%.64s': unknown unit '%.16s' (use ms, s, m, "
                           "h or d)", text, p);
    if (value > DLOCK_LEASE_MAX_MS / unit)
        return dlock__fail(DLOCK_EINVAL, "duration '%.64s': longer than 30 days", text);
    *out_ms = value * unit;
    return DLOCK_OK;
}
