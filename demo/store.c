/* SPDX-License-Identifier: BSD-3-Clause */
/* The store: dispatch to the backend named by the spec. */
#include "store_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int is_postgres(const char *spec)
{
    return strncmp(spec, "postgres://", 11) == 0 || strncmp(spec, "postgresql://", 13) == 0;
}

int demo_store_unsupported(const char *spec, char *err, size_t errlen)
{
#ifdef DLOCK_DEMO_HAVE_PG
    (void)spec;
    (void)err;
    (void)errlen;
    return 0;
#else
    if (!is_postgres(spec))
        return 0;
    snprintf(err, errlen,
             "--store %.*s: PostgreSQL is not supported in this build (libpq was not found "
             "when it was configured; install libpq-dev and rebuild)",
             20, spec);
    return 1;
#endif
}

static int is_mysql(const char *spec)
{
    return strncmp(spec, "mysql://", 8) == 0 || strncmp(spec, "mariadb://", 10) == 0;
}

demo_store *demo_store_open(const char *spec, const char *ns, char *err, size_t errlen)
{
    if (is_mysql(spec)) {
#ifdef DLOCK_DEMO_HAVE_MYSQL
        return demo_store_mysql_open(spec, ns, err, errlen);
#else
        snprintf(err, errlen, "--store mysql://: MariaDB is not supported in this build "
                 "(libmariadb was not found when it was configured; install libmariadb-dev "
                 "and rebuild)");
        return NULL;
#endif
    }
    if (is_postgres(spec)) {
#ifdef DLOCK_DEMO_HAVE_PG
        return demo_store_pg_open(spec, ns, err, errlen);
#else
        (void)ns;
        demo_store_unsupported(spec, err, errlen);
        return NULL;
#endif
    }
    (void)ns;
    if (strncmp(spec, "sqlite:", 7) == 0)
        spec += 7;
    return demo_store_sqlite_open(spec, err, errlen);
}

void demo_store_close(demo_store *store)
{
    if (store != NULL)
        store->ops->close(store);
}

const char *demo_store_kind(const demo_store *store)
{
    return store->ops->kind;
}

const char *demo_store_error(const demo_store *store)
{
    return store->error[0] != '\0' ? store->error : "no error";
}

void demo_store_set_error(demo_store *store, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(store->error, sizeof store->error, fmt, ap);
    va_end(ap);
}

const char demo_store_pending_sql[] =
    "SELECT order_id FROM demo_payout WHERE status = 'pending' ORDER BY order_id";

int demo_store_sql_summary(demo_store *store, demo_store_query_ids query, demo_store_summary *out)
{
    static const char *const counts[] = {
        "SELECT count(*) FROM demo_payout",
        "SELECT count(*) FROM demo_ledger",
        "SELECT count(*) FROM demo_payout WHERE status = 'pending'",
    };
    int64_t *dst[] = {&out->orders, &out->payouts, &out->unpaid};

    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        int64_t *v;
        size_t n;
        if (query(store, counts[i], &v, &n) != 0)
            return -1;
        if (n != 1) {
            free(v);
            demo_store_set_error(store, "%s: %s: no row", store->ops->kind, counts[i]);
            return -1;
        }
        *dst[i] = v[0];
        free(v);
    }
    if (query(store,
              "SELECT order_id FROM demo_ledger GROUP BY order_id HAVING count(*) > 1 "
              "ORDER BY order_id",
              &out->doubles, &out->ndoubles) != 0)
        return -1;
    out->double_paid = (int64_t)out->ndoubles;
    return 0;
}

int64_t demo_store_amount(uint64_t *rng)
{
    /* 1.00 to 500.00 in the store's currency. */
    return 100 + (int64_t)demo_rand_below(rng, 49901);
}

int demo_store_setup(demo_store *store)
{
    return store->ops->setup(store);
}

int demo_store_teardown(demo_store *store)
{
    return store->ops->teardown(store);
}

int demo_store_add_orders(demo_store *store, int round, int count, uint64_t *rng)
{
    return store->ops->add_orders(store, round, count, rng);
}

int demo_store_summary_get(demo_store *store, demo_store_summary *out)
{
    memset(out, 0, sizeof *out);
    int rc = store->ops->summary(store, out);
    if (rc != 0)
        demo_store_summary_free(out);
    return rc;
}

void demo_store_summary_free(demo_store_summary *summary)
{
    free(summary->doubles);
    summary->doubles = NULL;
    summary->ndoubles = 0;
}

int demo_store_pending(demo_store *store, int64_t **ids, size_t *count)
{
    *ids = NULL;
    *count = 0;
    return store->ops->pending(store, ids, count);
}

demo_store_result demo_store_register(demo_store *store, uint64_t fence)
{
    return store->ops->reg(store, fence);
}

demo_store_result demo_store_pay(demo_store *store, demo_mode mode, int64_t order, uint64_t fence,
                                 int instance)
{
    return store->ops->pay(store, mode, order, fence, instance);
}
