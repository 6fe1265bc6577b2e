/* SPDX-License-Identifier: BSD-3-Clause */
/* The resource side in PostgreSQL (pg_resource.h). */
#include "pg_resource.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One statement; the result if it succeeded, else NULL (cleared). */
static PGresult *exec(PGconn *conn, const char *sql, int n, const char *const *params)
{
    PGresult *res = PQexecParams(conn, sql, n, NULL, params, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(res);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        PQclear(res);
        return NULL;
    }
    return res;
}

const char *pg_resource_error(PGconn *conn)
{
    return PQerrorMessage(conn);
}

int pg_fence_setup(PGconn *conn)
{
    PGresult *res = exec(conn,
                         "CREATE TABLE IF NOT EXISTS dlock_fence("
                         "  resource text PRIMARY KEY, fence bigint NOT NULL)",
                         0, NULL);
    PQclear(res);
    return res ? 0 : -1;
}

int pg_fence_register(PGconn *conn, const char *resource, uint64_t fence)
{
    char f[24];
    snprintf(f, sizeof f, "%" PRIu64, fence);
    const char *p[] = {resource, f};
    /* One statement: the row lock the UPDATE takes orders it after every
     * write that holds the row FOR SHARE (pg_fence_check). */
    PGresult *res = exec(conn,
                         "INSERT INTO dlock_fence(resource, fence) VALUES ($1, $2) "
                         "ON CONFLICT (resource) DO UPDATE SET fence = EXCLUDED.fence "
                         "WHERE dlock_fence.fence < EXCLUDED.fence",
                         2, p);
    if (res == NULL)
        return -1;
    int stored = strcmp(PQcmdTuples(res), "1") == 0;
    PQclear(res);
    return stored;
}

int pg_fence_check(PGconn *conn, const char *resource, uint64_t fence)
{
    char f[24];
    snprintf(f, sizeof f, "%" PRIu64, fence);
    const char *p[] = {resource, f};
    PGresult *res = exec(conn,
                         "SELECT fence = $2::bigint FROM dlock_fence WHERE resource = $1 FOR SHARE",
                         2, p);
    if (res == NULL)
        return -1;
    int ok = PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
    PQclear(res);
    return ok;
}

int pg_queue_claim(PGconn *conn, const char *table, int64_t *id)
{
    char sql[256];
    if (snprintf(sql, sizeof sql,
                 "SELECT id FROM %s WHERE status = 'pending' ORDER BY id LIMIT 1 "
                 "FOR UPDATE SKIP LOCKED",
                 table) >= (int)sizeof sql)
        return -1;
    PGresult *res = exec(conn, sql, 0, NULL);
    if (res == NULL)
        return -1;
    int got = PQntuples(res) == 1;
    if (got)
        *id = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
    PQclear(res);
    return got;
}
