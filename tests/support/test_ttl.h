/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the server still grants a lock, read from the server itself
 * (tests/support/test_ttl.c): the other side of the rule that a lease is
 * counted from the request's send time, so the holder's belief
 * (dlock_lock_valid_ms) can only end before the server's.
 */
#ifndef DLOCK_TEST_TTL_H
#define DLOCK_TEST_TTL_H

#include <stdint.h>

#include "test.h"

/* An upper bound, in ms, of how long the server keeps lock name for its
 * holder from now on, or -1 when it keeps none:
 *   redis      PTTL of the lock's key
 *   redlock    PTTL on the nodes: the largest a majority of them reaches
 *   etcd       the TTL of the lease of the key under dlock/NAME/, which
 *              LeaseTimeToLive truncates to whole seconds: TTL*1000 + 999,
 *              read again until it steps down (up to a second), when what
 *              is left is just under that bound
 *   mysql, postgres (lease mode)  `expires` minus the server's clock, ceiled
 *   zk         the session the server heard from last: its last answer's
 *              time (cons: lresp) + its timeout (to) + one tick (the server
 *              rounds expiries up to a tick), minus the wall clock now
 * Exits the test for a backend or mode with no lease to read. */
int64_t test_server_ttl_ms(test_server *s, const char *name);

#endif
