/*
 * The one clock: CLOCK_MONOTONIC. Leases and deadlines never look at the wall
 * clock, so a clock jump (NTP, an operator, faketime) changes nothing.
 */
#ifndef DLOCK_CORE_CLOCK_H
#define DLOCK_CORE_CLOCK_H

#include <stdint.h>
#include <time.h>

int64_t dlock__now_ms(void);
int64_t dlock__now_us(void);

/* An absolute CLOCK_MONOTONIC time ms from now, for pthread_cond_timedwait on
 * a condition variable created with dlock__cond_init. */
struct timespec dlock__deadline_ts(int64_t ms_from_now);

#include <pthread.h>
/* A condition variable whose timed waits use CLOCK_MONOTONIC. */
int dlock__cond_init(pthread_cond_t *cond);

#endif
