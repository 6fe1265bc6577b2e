/* SPDX-License-Identifier: BSD-3-Clause */
#include <stdatomic.h>

#include "core/clock.h"

/* What dlock__clock_advance_ms added, in us. */
static _Atomic int64_t advanced_us;

int64_t dlock__now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000 + atomic_load(&advanced_us);
}

void dlock__clock_advance_ms(int64_t ms)
{
    atomic_fetch_add(&advanced_us, ms * 1000);
}

int64_t dlock__now_ms(void)
{
    return dlock__now_us() / 1000;
}

struct timespec dlock__deadline_ts(int64_t ms_from_now)
{
    struct timespec ts;

    if (ms_from_now < 0)
        ms_from_now = 0;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms_from_now / 1000;
    ts.tv_nsec += (ms_from_now % 1000) * 1000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    return ts;
}

int dlock__cond_init(pthread_cond_t *cond)
{
    pthread_condattr_t attr;
    int rc;

    if (pthread_condattr_init(&attr) != 0)
        return -1;
    rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(cond, &attr);
    pthread_condattr_destroy(&attr);
    return rc == 0 ? 0 : -1;
}
