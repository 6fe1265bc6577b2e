/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The store seam: each database the demo can use as its protected resource
 * is a table of function pointers behind demo_store (store.c dispatches).
 */
#ifndef DLOCK_DEMO_STORE_INT_H
#define DLOCK_DEMO_STORE_INT_H

#include "demo_int.h"

#include <stdarg.h>

typedef struct {
    const char *kind;
    void (*close)(demo_store *store);
    int (*setup)(demo_store *store);
    int (*teardown)(demo_store *store);
    int (*add_orders)(demo_store *store, int round, int count, uint64_t *rng);
    int (*summary)(demo_store *store, demo_store_summary *out);
    int (*pending)(demo_store *store, int64_t **ids, size_t *count);
    demo_store_result (*reg)(demo_store *store, uint64_t fence);
    demo_store_result (*pay)(demo_store *store, demo_mode mode, int64_t order, uint64_t fence,
                             int instance);
} demo_store_ops;

/* Every backend's connection struct starts with this. */
struct demo_store {
    const demo_store_ops *ops;
    char error[512];
};

void demo_store_set_error(demo_store *store, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The summary and the pending orders of a SQL store (PostgreSQL, MariaDB):
 * the same statements, read through the store's own query, which gives the
 * first column of every row (malloc'd, NULL for none). */
typedef int (*demo_store_query_ids)(demo_store *store, const char *sql, int64_t **ids,
                                    size_t *count);
int demo_store_sql_summary(demo_store *store, demo_store_query_ids query, demo_store_summary *out);
extern const char demo_store_pending_sql[];

/* Amount of the next order, in cents, from the run's random sequence. */
int64_t demo_store_amount(uint64_t *rng);

demo_store *demo_store_sqlite_open(const char *path, char *err, size_t errlen);
#ifdef DLOCK_DEMO_HAVE_PG
demo_store *demo_store_pg_open(const char *url, const char *ns, char *err, size_t errlen);
#endif
#ifdef DLOCK_DEMO_HAVE_MYSQL
demo_store *demo_store_mysql_open(const char *url, const char *ns, char *err, size_t errlen);
#endif

/* The tables, the same in both databases:
 *   demo_payout(order_id, round, amount_cents, status 'pending'|'paid', fence)
 *   demo_ledger(id, order_id, instance, fence, amount_cents)  one row a transfer
 *   demo_job(job, fence)   the highest fence registered for the payout job
 *                          (PostgreSQL: dlock_fence, examples/pg_resource.h) */

#endif /* DLOCK_DEMO_STORE_INT_H */
