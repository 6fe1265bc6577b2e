/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * plainredis: a lock backend that lives outside the library, built on the
 * public headers only, to prove that backends can be added from outside.
 *
 * Contract: after dlock_backend_register("plainredis", &plain_backend), a
 * client opened on plainredis://host[:port] (default port 6379) serves plain
 * mutexes (DLOCK_KIND_MUTEX, no owner ids) from that Redis server.
 */
#ifndef PLAIN_BACKEND_H
#define PLAIN_BACKEND_H

#include <dlock/sys/backend.h>

extern const dlock_backend plain_backend;

#endif /* PLAIN_BACKEND_H */
