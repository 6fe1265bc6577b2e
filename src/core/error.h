/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Error reporting inside the library: one function writes the thread-local
 * message (after curl's Curl_failf), every failure path returns through it.
 */
#ifndef DLOCK_CORE_ERROR_H
#define DLOCK_CORE_ERROR_H

#include "dlock/dlock.h"
#include "dlock/sys/backend.h"

/* Set this thread's error message and return code, so that a failure path
 * reads `return dlock__fail(DLOCK_EINVAL, "lease_ms must be > 0");`. The
 * library's own name for dlock_backend_fail (sys/backend.h), which built-in
 * and outside backends share. */
#define dlock__fail dlock_backend_fail

/* Forget this thread's last message: called on entry to each public call. */
void dlock__clear_error(void);

#endif
