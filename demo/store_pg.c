/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The store in PostgreSQL (`--store postgres://...`).
 *
 * Each run works in a schema of its own (made by setup, dropped by
 * teardown), so runs against a shared database do not meet.
 *
 * The job's fence lives in the fence row of examples/pg_resource.c
 * (dlock_fence, resource 'payout'), which says why it is read FOR SHARE.
 */
#include "store_int.h"

#include "pg_resource.h" /* examples/: the fence row and its check */

#include <inttypes.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    demo_store base;
    PGconn *conn;
    char schema[80]; /* quoted identifier */
} pg_store;

/* libpq prints NOTICEs (DROP ... IF EXISTS) on stderr by default. */
static void quiet(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

static void pg_error(pg_store *s, const char *what, const PGresult *res)
{
    const char *msg = res ? PQresultErrorMessage(res) : "";
    if (msg == NULL || msg[0] == '\0')
        msg = PQerrorMessage(s->conn);
    size_t n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == ' '))
        n--;
    demo_store_set_error(&s->base, "postgres: %s: %.*s", what, (int)n, msg);
}

/* Run a statement; NULL on failure (error set), else the result to clear. */
static PGresult *run(pg_store *s, const char *sql, int nparams, const char *const *params)
{
    PGresult *res = nparams > 0
                        ? PQexecParams(s->conn, sql, nparams, NULL, params, NULL, NULL, 0)
                        : PQexec(s->conn, sql);
    ExecStatusType st = PQresultStatus(res);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        pg_error(s, sql, res);
        PQclear(res);
        return NULL;
    }
    return res;
}

static int run_ok(pg_store *s, const char *sql, int nparams, const char *const *params)
{
    PGresult *res = run(s, sql, nparams, params);
    PQclear(res);
    return res ? 0 : -1;
}

/* Rows a command touched. */
static long affected(PGresult *res)
{
    return strtol(PQcmdTuples(res), NULL, 10);
}

static void rollback(pg_store *s)
{
    PQclear(PQexec(s->conn, "ROLLBACK"));
}

static void pg_close(demo_store *store)
{
    pg_store *s = (pg_store *)store;
    PQfinish(s->conn);
    free(s);
}

static int pg_setup(demo_store *store)
{
    pg_store *s = (pg_store *)store;
    char sql[2048];
    snprintf(sql, sizeof sql,
             "CREATE SCHEMA IF NOT EXISTS %s;"
             "SET search_path TO %s;"
             "DROP TABLE IF EXISTS demo_ledger, demo_payout, dlock_fence;"
             "CREATE TABLE demo_payout("
             "  order_id BIGSERIAL PRIMARY KEY,"
             "  round INTEGER NOT NULL,"
             "  amount_cents BIGINT NOT NULL,"
             "  status TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'paid')),"
             "  fence BIGINT NOT NULL DEFAULT 0);"
             "CREATE TABLE demo_ledger("
             "  id BIGSERIAL PRIMARY KEY,"
             "  order_id BIGINT NOT NULL REFERENCES demo_payout(order_id),"
             "  instance INTEGER NOT NULL,"
             "  fence BIGINT NOT NULL,"
             "  amount_cents BIGINT NOT NULL);"
             "CREATE INDEX demo_ledger_order ON demo_ledger(order_id);",
             s->schema, s->schema);
    if (run_ok(s, sql, 0, NULL) != 0)
        return -1;
    if (pg_fence_setup(s->conn) != 0) {
        pg_error(s, "creating dlock_fence", NULL);
        return -1;
    }
    return 0;
}

static int pg_teardown(demo_store *store)
{
    pg_store *s = (pg_store *)store;
    char sql[256];
    snprintf(sql, sizeof sql, "DROP SCHEMA IF EXISTS %s CASCADE", s->schema);
    return run_ok(s, sql, 0, NULL);
}

static int pg_add_orders(demo_store *store, int round, int count, uint64_t *rng)
{
    pg_store *s = (pg_store *)store;
    if (run_ok(s, "BEGIN", 0, NULL) != 0)
        return -1;
    for (int i = 0; i < count; i++) {
        char r[16], a[24];
        snprintf(r, sizeof r, "%d", round);
        snprintf(a, sizeof a, "%" PRId64, demo_store_amount(rng));
        const char *p[] = {r, a};
        if (run_ok(s, "INSERT INTO demo_payout(round, amount_cents) VALUES ($1, $2)", 2, p) != 0)
            goto err;
    }
    if (run_ok(s, "COMMIT", 0, NULL) != 0)
        goto err;
    return 0;
err:
    rollback(s);
    return -1;
}

static int query_ids(pg_store *s, const char *sql, int64_t **ids, size_t *count)
{
    PGresult *res = run(s, sql, 0, NULL);
    if (res == NULL)
        return -1;
    int n = PQntuples(res);
    int64_t *v = NULL;
    if (n > 0) {
        v = malloc((size_t)n * sizeof *v);
        if (v == NULL) {
            demo_store_set_error(&s->base, "out of memory");
            PQclear(res);
            return -1;
        }
        for (int i = 0; i < n; i++)
            v[i] = strtoll(PQgetvalue(res, i, 0), NULL, 10);
    }
    PQclear(res);
    *ids = v;
    *count = (size_t)n;
    return 0;
}

static int pg_ids(demo_store *store, const char *sql, int64_t **ids, size_t *count)
{
    return query_ids((pg_store *)store, sql, ids, count);
}

static int pg_summary(demo_store *store, demo_store_summary *out)
{
    return demo_store_sql_summary(store, pg_ids, out);
}

static int pg_pending(demo_store *store, int64_t **ids, size_t *count)
{
    return pg_ids(store, demo_store_pending_sql, ids, count);
}

static demo_store_result pg_register(demo_store *store, uint64_t fence)
{
    pg_store *s = (pg_store *)store;
    int rc = pg_fence_register(s->conn, "payout", fence);
    if (rc < 0) {
        pg_error(s, "registering the fence", NULL);
        return STORE_ERROR;
    }
    return rc == 1 ? STORE_OK : STORE_REFUSED;
}

static const char ledger_sql[] =
    "INSERT INTO demo_ledger(order_id, instance, fence, amount_cents) "
    "SELECT order_id, $2, $3, amount_cents FROM demo_payout WHERE order_id = $1";

static demo_store_result pg_pay(demo_store *store, demo_mode mode, int64_t order, uint64_t fence,
                                int instance)
{
    pg_store *s = (pg_store *)store;
    char o[24], f[24], in[16];
    snprintf(o, sizeof o, "%" PRId64, order);
    snprintf(f, sizeof f, "%" PRIu64, fence);
    snprintf(in, sizeof in, "%d", instance);
    const char *p_of[] = {o, f};
    const char *p_ledger[] = {o, in, f};
    demo_store_result result = STORE_OK;
    PGresult *res = NULL;

    if (run_ok(s, "BEGIN", 0, NULL) != 0)
        return STORE_ERROR;
    switch (mode) {
    case DEMO_NOLOCK:
    case DEMO_TTL:
        if (run_ok(s, "UPDATE demo_payout SET status = 'paid' WHERE order_id = $1", 1, p_of) != 0)
            goto err;
        break;
    case DEMO_FENCE_ROW:
        res = run(s,
                  "UPDATE demo_payout SET status = 'paid', fence = $2 "
                  "WHERE order_id = $1 AND fence < $2",
                  2, p_of);
        if (res == NULL)
            goto err;
        if (affected(res) == 0)
            result = STORE_REFUSED;
        PQclear(res);
        break;
    case DEMO_FENCE:
        switch (pg_fence_check(s->conn, "payout", fence)) {
        case 1:
            break;
        case 0:
            result = STORE_REFUSED;
            break;
        default:
            pg_error(s, "checking the fence", NULL);
            goto err;
        }
        if (result == STORE_REFUSED)
            break;
        if (run_ok(s, "UPDATE demo_payout SET status = 'paid', fence = $2 WHERE order_id = $1", 2,
                   p_of) != 0)
            goto err;
        break;
    default:
        demo_store_set_error(store, "unknown mode %d", (int)mode);
        goto err;
    }
    if (result == STORE_OK && run_ok(s, ledger_sql, 3, p_ledger) != 0)
        goto err;
    if (run_ok(s, result == STORE_OK ? "COMMIT" : "ROLLBACK", 0, NULL) != 0)
        goto err;
    return result;
err:
    rollback(s);
    return STORE_ERROR;
}

static const demo_store_ops pg_ops = {
    "postgres", pg_close,   pg_setup,    pg_teardown, pg_add_orders,
    pg_summary, pg_pending, pg_register, pg_pay,
};

demo_store *demo_store_pg_open(const char *url, const char *ns, char *err, size_t errlen)
{
    pg_store *s = calloc(1, sizeof *s);
    if (s == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->base.ops = &pg_ops;
    /* ns is made by the demo from digits, letters and '_'; quote it all the same. */
    for (const char *c = ns; *c; c++) {
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_')) {
            snprintf(err, errlen, "bad schema name %s", ns);
            free(s);
            return NULL;
        }
    }
    snprintf(s->schema, sizeof s->schema, "\"%.70s\"", ns);
    s->conn = PQconnectdb(url);
    if (s->conn == NULL || PQstatus(s->conn) != CONNECTION_OK) {
        const char *msg = s->conn ? PQerrorMessage(s->conn) : "out of memory";
        size_t n = strlen(msg);
        while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == ' '))
            n--;
        /* libpq's message never holds the password. */
        snprintf(err, errlen, "postgres: %.*s", (int)n, msg);
        goto err;
    }
    PQsetNoticeProcessor(s->conn, quiet, NULL);
    char sql[160];
    snprintf(sql, sizeof sql, "SET search_path TO %s", s->schema);
    if (run_ok(s, sql, 0, NULL) != 0) {
        snprintf(err, errlen, "%s", s->base.error);
        goto err;
    }
    return &s->base;
err:
    PQfinish(s->conn);
    free(s);
    return NULL;
}
