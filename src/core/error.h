/*
 * Error reporting inside the library: one function writes the thread-local
 * message (after curl's Curl_failf), every failure path returns through it.
 */
#ifndef DLOCK_CORE_ERROR_H
#define DLOCK_CORE_ERROR_H

#include "dlock/dlock.h"

#if defined(__GNUC__)
#define DLOCK_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DLOCK_PRINTF(a, b)
#endif

/* Set this thread's error message and return code, so that a failure path
 * reads `return dlock__fail(DLOCK_EINVAL, "lease_ms must be > 0");`. */
int dlock__fail(int code, const char *fmt, ...) DLOCK_PRINTF(2, 3);

/* Forget this thread's last message: called on entry to each public call. */
void dlock__clear_error(void);

#endif
