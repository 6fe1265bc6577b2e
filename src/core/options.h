/* SPDX-License-Identifier: BSD-3-Clause */
/* Reading a caller's options struct of any version this library knows. */
#ifndef DLOCK_CORE_OPTIONS_H
#define DLOCK_CORE_OPTIONS_H

#include "dlock/dlock.h"

/* *o = the defaults, overlaid with what given's version has (given NULL:
 * the defaults). DLOCK_EINVAL for a version this library does not know.
 * Checks no field: the caller does. */
int dlock__client_options_copy(dlock_client_options *o, const dlock_client_options *given);
int dlock__acquire_options_copy(dlock_acquire_options *o, const dlock_acquire_options *given);

#endif
