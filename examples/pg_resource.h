/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The resource side in PostgreSQL: what the store does with a lock's fence
 * (docs/fencing.md), and the work queue that needs no lock at all.
 * Used by the demo's PostgreSQL store (demo/store_pg.c) and by
 * examples/pg_queue.c. libpq, blocking calls; one connection per caller.
 *
 * The fence row: one row per protected resource in dlock_fence(resource,
 * fence), the highest fence the store has seen for it.
 *   1. The new holder registers its fence (pg_fence_register) before it
 *      reads the resource: a stale holder's fence is refused from then on.
 *   2. Each write runs in a transaction that first checks the fence
 *      (pg_fence_check): the row is read FOR SHARE, so that a newer
 *      holder's registration (an UPDATE of the row) waits until the write
 *      commits, and the newer holder reads the resource after it. Under
 *      READ COMMITTED a check in one statement and a write in another are
 *      safe only with that row lock between them.
 */
#ifndef DLOCK_EXAMPLES_PG_RESOURCE_H
#define DLOCK_EXAMPLES_PG_RESOURCE_H

#include <libpq-fe.h>
#include <stdint.h>

/* Create dlock_fence in the connection's search_path if it is missing.
 * 0, or -1 (message in PQerrorMessage or printed). */
int pg_fence_setup(PGconn *conn);

/* Register FENCE for RESOURCE: 1 if it is above every fence registered
 * before (stored), 0 if not (a stale holder: refused), -1 on an error. */
int pg_fence_register(PGconn *conn, const char *resource, uint64_t fence);

/* Inside the caller's transaction (BEGIN before, COMMIT or ROLLBACK after):
 * 1 if FENCE is still RESOURCE's registered fence (the row now locked FOR
 * SHARE until the transaction ends: write, then commit), 0 if a newer
 * holder registered (roll back), -1 on an error. */
int pg_fence_check(PGconn *conn, const char *resource, uint64_t fence);

/* The work queue (the seeds' pitfall list: jobs that each need one worker
 * need no distributed lock). Inside the caller's transaction: claim the
 * oldest pending row of TABLE(id bigint, status text) that no other
 * transaction has claimed, FOR UPDATE SKIP LOCKED, so that concurrent
 * workers never wait for each other nor take the same row. *id gets it.
 * 1 claimed, 0 none left (or all claimed by others), -1 on an error.
 * TABLE is an identifier of the caller's, not user input. */
int pg_queue_claim(PGconn *conn, const char *table, int64_t *id);

/* Last error text of these helpers, for messages. */
const char *pg_resource_error(PGconn *conn);

#endif
