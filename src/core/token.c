/* SPDX-License-Identifier: BSD-3-Clause */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/random.h>

#include "core/error.h"
#include "core/token.h"

/*
 * The owner token is what makes compare-and-delete safe: only the process
 * that generated it can release or extend the lock, so it must be unguessable
 * (not a thread id, not a counter) and fresh for every acquisition.
 *
 * The kernel's bytes are read a pool at a time: a getrandom call costs as
 * much as the rest of making a token's command. A child of fork must not
 * hand out the tokens its parent will (the same bytes in both copies of the
 * pool), so fork empties the child's pool (pthread_atfork; glibc drops the
 * handlers when the library is unloaded).
 */
#define POOL_BYTES 512

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static unsigned char pool[POOL_BYTES];
static size_t pool_left; /* the unused bytes, at the pool's end */

static void pool_before_fork(void)
{
    pthread_mutex_lock(&pool_mu);
}

static void pool_after_fork(void)
{
    pthread_mutex_unlock(&pool_mu);
}

static void pool_in_child(void)
{
    pool_left = 0;
    memset(pool, 0, sizeof(pool));
    pthread_mutex_unlock(&pool_mu);
}

static void pool_init(void)
{
    pthread_atfork(pool_before_fork, pool_after_fork, pool_in_child);
}

/* Fills the pool; pool_mu held. */
static int pool_fill(void)
{
    size_t got = 0;

    while (got < sizeof(pool)) {
        ssize_t n = getrandom(pool + got, sizeof(pool) - got, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return dlock__fail(DLOCK_ENOTSUP, "getrandom: %s", strerror(errno));
        }
        got += (size_t)n;
    }
    pool_left = sizeof(pool);
    return DLOCK_OK;
}

int dlock__token_new(char *out)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[DLOCK__TOKEN_LEN / 2];
    int rc = DLOCK_OK;

    pthread_once(&pool_once, pool_init);
    pthread_mutex_lock(&pool_mu);
    if (pool_left < sizeof(raw))
        rc = pool_fill();
    if (rc == DLOCK_OK) {
        unsigned char *take = pool + sizeof(pool) - pool_left;

        memcpy(raw, take, sizeof(raw));
        /* A token handed out is not left behind in the pool. */
        memset(take, 0, sizeof(raw));
        pool_left -= sizeof(raw);
    }
    pthread_mutex_unlock(&pool_mu);
    if (rc != DLOCK_OK)
        return rc;
    for (size_t i = 0; i < sizeof(raw); i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 15];
    }
    out[DLOCK__TOKEN_LEN] = '\0';
    return DLOCK_OK;
}
