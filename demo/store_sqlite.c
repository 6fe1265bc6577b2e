/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The store in SQLite: one file that every instance process opens.
 *
 * WAL mode lets the scheduler read while an instance writes; writers take
 * turns through BEGIN IMMEDIATE and busy_timeout, so a payment's check and
 * its writes are one atomic step.
 */
#include "store_int.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    ST_BEGIN,
    ST_COMMIT,
    ST_ROLLBACK,
    ST_ADD_ORDER,
    ST_PENDING,
    ST_JOB_FENCE,
    ST_REGISTER,
    ST_LEDGER,
    ST_MARK_PAID,
    ST_MARK_PAID_FENCE,
    ST_ROW_FENCE,
    ST_COUNT_ORDERS,
    ST_COUNT_LEDGER,
    ST_COUNT_UNPAID,
    ST_DOUBLES,
    ST_COUNT
};

static const char *const sql_text[ST_COUNT] = {
    [ST_BEGIN] = "BEGIN IMMEDIATE",
    [ST_COMMIT] = "COMMIT",
    [ST_ROLLBACK] = "ROLLBACK",
    [ST_ADD_ORDER] = "INSERT INTO demo_payout(round, amount_cents) VALUES (?1, ?2)",
    [ST_PENDING] = "SELECT order_id FROM demo_payout WHERE status = 'pending' ORDER BY order_id",
    [ST_JOB_FENCE] = "SELECT fence FROM demo_job WHERE job = 'payout'",
    [ST_REGISTER] = "UPDATE demo_job SET fence = ?1 WHERE job = 'payout' AND fence < ?1",
    [ST_LEDGER] = "INSERT INTO demo_ledger(order_id, instance, fence, amount_cents) "
                  "SELECT order_id, ?2, ?3, amount_cents FROM demo_payout WHERE order_id = ?1",
    [ST_MARK_PAID] = "UPDATE demo_payout SET status = 'paid' WHERE order_id = ?1",
    [ST_MARK_PAID_FENCE] = "UPDATE demo_payout SET status = 'paid', fence = ?2 WHERE order_id = ?1",
    /* The seed's SQL: the fence is checked against this one row only. */
    [ST_ROW_FENCE] = "UPDATE demo_payout SET status = 'paid', fence = ?2 "
                     "WHERE order_id = ?1 AND fence < ?2",
    [ST_COUNT_ORDERS] = "SELECT count(*) FROM demo_payout",
    [ST_COUNT_LEDGER] = "SELECT count(*) FROM demo_ledger",
    [ST_COUNT_UNPAID] = "SELECT count(*) FROM demo_payout WHERE status = 'pending'",
    [ST_DOUBLES] = "SELECT order_id FROM demo_ledger GROUP BY order_id HAVING count(*) > 1 "
                   "ORDER BY order_id",
};

static const char schema_sql[] =
    "DROP TABLE IF EXISTS demo_ledger;"
    "DROP TABLE IF EXISTS demo_payout;"
    "DROP TABLE IF EXISTS demo_job;"
    "CREATE TABLE demo_payout("
    "  order_id INTEGER PRIMARY KEY,"
    "  round INTEGER NOT NULL,"
    "  amount_cents INTEGER NOT NULL,"
    "  status TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'paid')),"
    "  fence INTEGER NOT NULL DEFAULT 0);"
    "CREATE TABLE demo_ledger("
    "  id INTEGER PRIMARY KEY,"
    "  order_id INTEGER NOT NULL REFERENCES demo_payout(order_id),"
    "  instance INTEGER NOT NULL,"
    "  fence INTEGER NOT NULL,"
    "  amount_cents INTEGER NOT NULL);"
    "CREATE INDEX demo_ledger_order ON demo_ledger(order_id);"
    "CREATE TABLE demo_job(job TEXT PRIMARY KEY, fence INTEGER NOT NULL);"
    "INSERT INTO demo_job VALUES ('payout', 0);";

typedef struct {
    demo_store base;
    sqlite3 *db;
    sqlite3_stmt *st[ST_COUNT];
} sqlite_store;

/* The statement idx, prepared on first use, reset and unbound. */
static sqlite3_stmt *stmt(sqlite_store *s, int idx)
{
    if (s->st[idx] == NULL) {
        if (sqlite3_prepare_v2(s->db, sql_text[idx], -1, &s->st[idx], NULL) != SQLITE_OK) {
            demo_store_set_error(&s->base, "sqlite: %s", sqlite3_errmsg(s->db));
            return NULL;
        }
    } else {
        sqlite3_reset(s->st[idx]);
        sqlite3_clear_bindings(s->st[idx]);
    }
    return s->st[idx];
}

/* Step a statement that returns no rows. 0 or -1. */
static int run(sqlite_store *s, sqlite3_stmt *st)
{
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) {
        demo_store_set_error(&s->base, "sqlite: %s", sqlite3_errmsg(s->db));
        return -1;
    }
    return 0;
}

static int exec_idx(sqlite_store *s, int idx)
{
    sqlite3_stmt *st = stmt(s, idx);
    return st == NULL ? -1 : run(s, st);
}

/* A one-integer query. 0 or -1. */
static int query_int(sqlite_store *s, int idx, int64_t *out)
{
    sqlite3_stmt *st = stmt(s, idx);
    if (st == NULL)
        return -1;
    int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        demo_store_set_error(&s->base, "sqlite: %s",
                             rc == SQLITE_DONE ? "no row" : sqlite3_errmsg(s->db));
        sqlite3_reset(st);
        return -1;
    }
    *out = sqlite3_column_int64(st, 0);
    sqlite3_reset(st);
    return 0;
}

/* Collect the first column of every row. */
static int query_ids(sqlite_store *s, int idx, int64_t **ids, size_t *count)
{
    sqlite3_stmt *st = stmt(s, idx);
    if (st == NULL)
        return -1;
    size_t n = 0, cap = 0;
    int64_t *v = NULL;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 64;
            int64_t *nv = realloc(v, ncap * sizeof *nv);
            if (nv == NULL) {
                demo_store_set_error(&s->base, "out of memory");
                goto err;
            }
            v = nv;
            cap = ncap;
        }
        v[n++] = sqlite3_column_int64(st, 0);
    }
    if (rc != SQLITE_DONE) {
        demo_store_set_error(&s->base, "sqlite: %s", sqlite3_errmsg(s->db));
        goto err;
    }
    sqlite3_reset(st);
    *ids = v;
    *count = n;
    return 0;
err:
    sqlite3_reset(st);
    free(v);
    return -1;
}

static void finalize_all(sqlite_store *s)
{
    for (int i = 0; i < ST_COUNT; i++) {
        sqlite3_finalize(s->st[i]);
        s->st[i] = NULL;
    }
}

static void sqlite_close(demo_store *store)
{
    sqlite_store *s = (sqlite_store *)store;
    finalize_all(s);
    sqlite3_close(s->db);
    free(s);
}

static int sqlite_setup(demo_store *store)
{
    sqlite_store *s = (sqlite_store *)store;
    char *msg = NULL;
    finalize_all(s); /* the tables they were prepared against go away */
    if (sqlite3_exec(s->db, schema_sql, NULL, NULL, &msg) != SQLITE_OK) {
        demo_store_set_error(store, "sqlite: creating the tables: %s", msg ? msg : "?");
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

static int sqlite_teardown(demo_store *store)
{
    (void)store; /* the file is the user's to keep, or the temporary folder's to go */
    return 0;
}

static int sqlite_add_orders(demo_store *store, int round, int count, uint64_t *rng)
{
    sqlite_store *s = (sqlite_store *)store;
    if (exec_idx(s, ST_BEGIN) != 0)
        return -1;
    for (int i = 0; i < count; i++) {
        sqlite3_stmt *st = stmt(s, ST_ADD_ORDER);
        if (st == NULL)
            goto err;
        sqlite3_bind_int(st, 1, round);
        sqlite3_bind_int64(st, 2, demo_store_amount(rng));
        if (run(s, st) != 0)
            goto err;
    }
    if (exec_idx(s, ST_COMMIT) != 0)
        goto err;
    return 0;
err:
    exec_idx(s, ST_ROLLBACK);
    return -1;
}

static int sqlite_summary(demo_store *store, demo_store_summary *out)
{
    sqlite_store *s = (sqlite_store *)store;
    if (query_int(s, ST_COUNT_ORDERS, &out->orders) != 0 ||
        query_int(s, ST_COUNT_LEDGER, &out->payouts) != 0 ||
        query_int(s, ST_COUNT_UNPAID, &out->unpaid) != 0 ||
        query_ids(s, ST_DOUBLES, &out->doubles, &out->ndoubles) != 0)
        return -1;
    out->double_paid = (int64_t)out->ndoubles;
    return 0;
}

static int sqlite_pending(demo_store *store, int64_t **ids, size_t *count)
{
    return query_ids((sqlite_store *)store, ST_PENDING, ids, count);
}

static demo_store_result sqlite_register(demo_store *store, uint64_t fence)
{
    sqlite_store *s = (sqlite_store *)store;
    sqlite3_stmt *st = stmt(s, ST_REGISTER);
    if (st == NULL)
        return STORE_ERROR;
    sqlite3_bind_int64(st, 1, (sqlite3_int64)fence);
    if (run(s, st) != 0)
        return STORE_ERROR;
    return sqlite3_changes(s->db) == 1 ? STORE_OK : STORE_REFUSED;
}

static int ledger(sqlite_store *s, int64_t order, uint64_t fence, int instance)
{
    sqlite3_stmt *st = stmt(s, ST_LEDGER);
    if (st == NULL)
        return -1;
    sqlite3_bind_int64(st, 1, order);
    sqlite3_bind_int(st, 2, instance);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)fence);
    return run(s, st);
}

static int update_order(sqlite_store *s, int idx, int64_t order, uint64_t fence)
{
    sqlite3_stmt *st = stmt(s, idx);
    if (st == NULL)
        return -1;
    sqlite3_bind_int64(st, 1, order);
    if (idx != ST_MARK_PAID)
        sqlite3_bind_int64(st, 2, (sqlite3_int64)fence);
    return run(s, st);
}

/*
 * One transfer: a ledger row and the order marked paid, in one transaction,
 * under the mode's check. Nothing is written when the check refuses.
 */
static demo_store_result sqlite_pay(demo_store *store, demo_mode mode, int64_t order,
                                    uint64_t fence, int instance)
{
    sqlite_store *s = (sqlite_store *)store;
    demo_store_result result = STORE_OK;
    int64_t stored;

    if (exec_idx(s, ST_BEGIN) != 0)
        return STORE_ERROR;
    switch (mode) {
    case DEMO_NOLOCK:
    case DEMO_TTL:
        /* Trusts the lock: no check at the store. */
        if (update_order(s, ST_MARK_PAID, order, fence) != 0 || ledger(s, order, fence, instance) != 0)
            goto err;
        break;
    case DEMO_FENCE_ROW:
        if (update_order(s, ST_ROW_FENCE, order, fence) != 0)
            goto err;
        if (sqlite3_changes(s->db) == 0) {
            result = STORE_REFUSED;
            break;
        }
        if (ledger(s, order, fence, instance) != 0)
            goto err;
        break;
    case DEMO_FENCE:
        /* The job's highest fence must still be ours: a newer holder
         * registered a higher one before it read the orders. */
        if (query_int(s, ST_JOB_FENCE, &stored) != 0)
            goto err;
        if ((uint64_t)stored != fence) {
            result = STORE_REFUSED;
            break;
        }
        if (update_order(s, ST_MARK_PAID_FENCE, order, fence) != 0 ||
            ledger(s, order, fence, instance) != 0)
            goto err;
        break;
    default:
        demo_store_set_error(store, "unknown mode %d", (int)mode);
        goto err;
    }
    if (exec_idx(s, result == STORE_OK ? ST_COMMIT : ST_ROLLBACK) != 0)
        goto err;
    return result;
err:
    exec_idx(s, ST_ROLLBACK);
    return STORE_ERROR;
}

static const demo_store_ops sqlite_ops = {
    "sqlite",       sqlite_close,   sqlite_setup,   sqlite_teardown, sqlite_add_orders,
    sqlite_summary, sqlite_pending, sqlite_register, sqlite_pay,
};

demo_store *demo_store_sqlite_open(const char *path, char *err, size_t errlen)
{
    sqlite_store *s = calloc(1, sizeof *s);
    if (s == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->base.ops = &sqlite_ops;
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
    if (sqlite3_open_v2(path, &s->db, flags, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "sqlite %s: %s", path,
                 s->db ? sqlite3_errmsg(s->db) : "out of memory");
        goto err;
    }
    /* Six processes take turns on the write lock; wait for it, never fail. */
    sqlite3_busy_timeout(s->db, 10000);
    char *msg = NULL;
    if (sqlite3_exec(s->db, "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;", NULL,
                     NULL, &msg) != SQLITE_OK) {
        snprintf(err, errlen, "sqlite %s: %s", path, msg ? msg : sqlite3_errmsg(s->db));
        sqlite3_free(msg);
        goto err;
    }
    return &s->base;
err:
    sqlite3_close(s->db);
    free(s);
    return NULL;
}
