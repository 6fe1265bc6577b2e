/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The one clock for leases: CLOCK_BOOTTIME. Leases and deadlines never look
 * at the wall clock, so a clock step (NTP, an operator, faketime) changes
 * nothing; and unlike CLOCK_MONOTONIC, CLOCK_BOOTTIME keeps counting while
 * the host is suspended, as the server's clock does, so a lock held across a
 * suspend is seen to have run out on resume instead of looking as fresh as
 * before it. Timed waits on condition variables stay on CLOCK_MONOTONIC
 * (pthread cannot wait on CLOCK_BOOTTIME); they take relative times, so
 * they only decide when a thread looks again, never whether a lease holds.
 */
#ifndef DLOCK_CORE_CLOCK_H
#define DLOCK_CORE_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Now on the lease clock. */
int64_t dlock__now_ms(void);
int64_t dlock__now_us(void);

/* Tests only: move the lease clock forward by ms, as a suspend of the host
 * for that long would (CLOCK_MONOTONIC does not move). Thread-safe. */
void dlock__clock_advance_ms(int64_t ms);

/* An absolute CLOCK_MONOTONIC time ms from now, for pthread_cond_timedwait on
 * a condition variable created with dlock__cond_init. */
struct timespec dlock__deadline_ts(int64_t ms_from_now);

#include <pthread.h>
/* A condition variable whose timed waits use CLOCK_MONOTONIC. */
int dlock__cond_init(pthread_cond_t *cond);

#endif
