/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Redis Cluster (redis-cluster://, rediss-cluster://; docs/redis-cluster.md):
 * the slot map, one connection per master, and the routing of each command
 * by the hash slot of its first key, following MOVED and ASK within the
 * command's timeout. A routing state belongs to one dlock__redis_conn and
 * shares its thread rule (one user at a time), but the one the callers'
 * scripts share (dlock__redis_cluster_share), which has a mutex.
 */
#ifndef DLOCK_REDIS_CLUSTER_H
#define DLOCK_REDIS_CLUSTER_H

#include <hiredis/hiredis.h>
#include <stddef.h>

#define DLOCK__REDIS_SLOTS 16384

typedef struct dlock__redis_cluster dlock__redis_cluster;

/* The cluster hash slot of a key: CRC16 of the part inside the first
 * non-empty {...}, else of the whole key. */
unsigned dlock__redis_key_slot(const char *key, size_t len);

/*
 * The hash tag of the fence floor and registry of slot (a text T whose key
 * PREFIX{T}fence-floor lies in slot): "fence:N" with the smallest such N,
 * found once per process. Written to buf (at least 24 bytes).
 */
void dlock__redis_slot_tag(unsigned slot, char *buf, size_t size);

/* Free the routing state (its connections closed); NULL is a no-op. */
void dlock__redis_cluster_free(dlock__redis_cluster *c);

#endif
