/* SPDX-License-Identifier: BSD-3-Clause */
#ifndef DLOCK_CORE_URL_H
#define DLOCK_CORE_URL_H

#include "dlock/sys/backend.h"

/*
 * Parse text into *out (the one URL parser of the library):
 *
 *   scheme "://" [user [":" password] "@"] [host[":"port] {"," host[":"port]}] [path] ["?" k=v {"&" k=v}]
 *
 * Hosts may be IPv6 in brackets. User, password and query values are
 * percent-decoded. Returns DLOCK_OK, DLOCK_EINVAL with a message that never
 * quotes the password, or DLOCK_ENOMEM. On failure *out is left empty.
 */
int dlock__url_parse(dlock_url *out, const char *text);
void dlock__url_free(dlock_url *url);

/* The value of a hex digit (either case), -1 for another character: for
 * the percent-decoding of URLs and of gRPC's grpc-message. */
int dlock__hexval(int c);

#endif
