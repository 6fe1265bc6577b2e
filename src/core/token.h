/* SPDX-License-Identifier: BSD-3-Clause */
#ifndef DLOCK_CORE_TOKEN_H
#define DLOCK_CORE_TOKEN_H

/* 128 bits from the kernel CSPRNG, as 32 lowercase hex digits. */
#define DLOCK__TOKEN_LEN 32 /* DLOCK_BACKEND_TOKEN_LEN */

/* Fill out (DLOCK__TOKEN_LEN + 1 bytes) with a fresh token. Returns
 * DLOCK_OK or DLOCK_EINVAL-free failure code with a message. */
int dlock__token_new(char *out);

#endif
