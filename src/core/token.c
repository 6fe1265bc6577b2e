/* SPDX-License-Identifier: BSD-3-Clause */
#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "core/error.h"
#include "core/token.h"

/*
 * The owner token is what makes compare-and-delete safe: only the process
 * that generated it can release or extend the lock, so it must be unguessable
 * (not a thread id, not a counter) and fresh for every acquisition.
 */
int dlock__token_new(char *out)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[DLOCK__TOKEN_LEN / 2];
    size_t got = 0;

    while (got < sizeof(raw)) {
        ssize_t n = getrandom(raw + got, sizeof(raw) - got, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return dlock__fail(DLOCK_ENOTSUP, "getrandom: %s", strerror(errno));
        }
        got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof(raw); i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 15];
    }
    out[DLOCK__TOKEN_LEN] = '\0';
    return DLOCK_OK;
}
