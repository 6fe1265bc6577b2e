/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Lease mode: one row per lock name in the lock table, its lease ending at
 * `expires` by the server's clock (clock_timestamp()), its fence from a
 * NO CYCLE sequence. Every call is one statement, so one round trip; the
 * DDL is in docs/postgres.md and below (dlock__pg_create).
 *
 * A row outlives its holder: release clears tokens and expires but keeps
 * the row and its fence, so that every later acquisition of the name goes
 * through the UPDATE path, which draws its fence with nextval() only after
 * it holds the row lock: a fence drawn there is above every fence issued
 * before for the name. Only the first acquisition of a name inserts.
 *
 * Reentrancy by owner id: tokens is the array of the holds' tokens; a hold
 * of the same owner (reentrant) is appended and keeps the fence; the holds
 * share the lease (the longest asked for); the last release frees the row.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pg_int.h"
#include "pg_sql.h"

#define SQL_MAX 4096

/* The template with %1$s the table and %2$s the sequence. */
static const char *fill(const dlock__pg_be *be, char *buf, const char *tmpl)
{
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    snprintf(buf, SQL_MAX, tmpl, be->table, be->seq);
#pragma GCC diagnostic pop
    return buf;
}

/* ---- DDL ------------------------------------------------------------- */

static const char ddl_tmpl[] =
    "BEGIN;"
    "SELECT pg_advisory_xact_lock(7033184922370137);"
    "CREATE TABLE IF NOT EXISTS %1$s ("
    " name bytea PRIMARY KEY,"
    " tokens text[],"
    " owner bytea,"
    " fence bigint NOT NULL,"
    " expires timestamptz NOT NULL,"
    " holder text);"
    "CREATE SEQUENCE IF NOT EXISTS %2$s AS bigint MINVALUE 1 NO CYCLE;"
    "COMMIT";

static const char exists_tmpl[] =
    "SELECT to_regclass('%1$s') IS NOT NULL, to_regclass('%2$s') IS NOT NULL";

int dlock__pg_create(dlock__pg_be *be, int create)
{
    char sql[SQL_MAX];
    PGresult *r;
    int rc, table, seq;

    if ((rc = dlock__pg_cmd(be, fill(be, sql, exists_tmpl), 0, NULL, &r)) != DLOCK_OK)
        return rc;
    table = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
    seq = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 1), "t") == 0;
    PQclear(r);
    if (seq && be->mode == DLOCK__PG_MODE_ADVISORY)
        return DLOCK_OK;
    if (seq && table)
        return dlock__pg_fam_create(be, create);
    if (!create)
        return dlock_backend_fail(DLOCK_ESERVER,
                                  "%s: %s %s does not exist, and create=0 says not to create "
                                  "it (docs/postgres.md has the DDL)",
                                  be->where, seq ? "table" : "sequence", seq ? be->table : be->seq);
    if ((rc = dlock__pg_cmd(be, fill(be, sql, ddl_tmpl), 0, NULL, &r)) != DLOCK_OK)
        return rc;
    PQclear(r);
    return be->mode == DLOCK__PG_MODE_LEASE ? dlock__pg_fam_create(be, create) : DLOCK_OK;
}

/* ---- acquire --------------------------------------------------------- */

static int is_true(const PGresult *r, int col)
{
    return !PQgetisnull(r, 0, col) && strcmp(PQgetvalue(r, 0, col), "t") == 0;
}

int dlock__pg_lease_acquire(dlock__pg_be *be, const dlock_request *req, dlock_acquire_result *out)
{
    char sql[SQL_MAX], lease[24], *name, *owner = NULL;
    const char *p[6];
    PGresult *r;
    int rc;

    if ((name = dlock__pg_key_hex(be, req->name)) == NULL)
        return DLOCK_ENOMEM;
    if (req->owner != NULL) {
        owner = malloc(2 * strlen(req->owner) + 1);
        if (owner == NULL) {
            free(name);
            return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
        }
        dlock__pg_hex(owner, req->owner, strlen(req->owner));
    }
    snprintf(lease, sizeof(lease), "%lld", (long long)req->lease_ms);
    p[0] = name;
    p[1] = req->token;
    p[2] = owner;
    p[3] = lease;
    p[4] = req->holder;
    p[5] = req->reentrant ? "t" : "f";
    rc = dlock__pg_cmd_prepared(be, fill(be, sql, dlock__pg_acquire_tmpl), 6, p, &r);
    free(name);
    free(owner);
    if (rc != DLOCK_OK)
        return rc;
    if (PQntuples(r) != 1 || PQnfields(r) != 4) {
        PQclear(r);
        return dlock_backend_fail(DLOCK_EPROTO, "%s: acquire: unexpected reply", be->where);
    }
    if (!PQgetisnull(r, 0, 0)) {
        out->fence = (uint64_t)dlock__pg_num(r, 0, 0);
        PQclear(r);
        if (out->fence == 0)
            return dlock_backend_fail(DLOCK_EPROTO, "%s: acquire: fence 0", be->where);
        return DLOCK_OK;
    }
    if (is_true(r, 1) && is_true(r, 3)) {
        PQclear(r);
        return dlock_backend_fail(DLOCK_EMISUSE,
                                  "%s: lock '%s' is held by this owner already (not reentrant)",
                                  be->where, req->name);
    }
    out->retry_ms = is_true(r, 1) ? dlock__pg_num(r, 0, 2) : 0;
    if (out->retry_ms < 0)
        out->retry_ms = 0;
    PQclear(r);
    return dlock_backend_fail(DLOCK_EBUSY, "%s: lock '%s' is held by another owner", be->where,
                              req->name);
}

/* ---- release, extend, check ------------------------------------------ */

static int not_ours(dlock__pg_be *be, const dlock_request *req)
{
    return dlock_backend_fail(DLOCK_ELOST, "%s: lock '%s' is no longer held by this handle",
                              be->where, req->name);
}

/* Run a statement about req's hold: $1 name, $2 token, [$3 lease], as a
 * prepared statement. Returns the rows it touched or returned through
 * *rows. */
static int on_hold(dlock__pg_be *be, const dlock_request *req, const char *tmpl, int with_lease,
                   int *rows)
{
    char sql[SQL_MAX], lease[24], *name;
    const char *p[3];
    PGresult *r;
    int rc;

    if ((name = dlock__pg_key_hex(be, req->name)) == NULL)
        return DLOCK_ENOMEM;
    snprintf(lease, sizeof(lease), "%lld", (long long)req->lease_ms);
    p[0] = name;
    p[1] = req->token;
    p[2] = lease;
    rc = dlock__pg_cmd_prepared(be, fill(be, sql, tmpl), with_lease ? 3 : 2, p, &r);
    free(name);
    if (rc != DLOCK_OK)
        return rc;
    *rows = PQresultStatus(r) == PGRES_TUPLES_OK ? PQntuples(r) : atoi(PQcmdTuples(r));
    PQclear(r);
    return DLOCK_OK;
}

int dlock__pg_lease_release(dlock__pg_be *be, const dlock_request *req)
{
    int rows, rc = on_hold(be, req, dlock__pg_release_tmpl, 0, &rows);
    return rc != DLOCK_OK ? rc : rows == 1 ? DLOCK_OK : not_ours(be, req);
}

/* The holds share the lease: one hold's extend never shortens another's. */
#define NEW_EXPIRY(t, lease)                                                                       \
    "CASE WHEN cardinality(" t "tokens) > 1 THEN GREATEST(" t "expires, clock_timestamp() + " lease \
    " * interval '1 millisecond') ELSE clock_timestamp() + " lease " * interval '1 millisecond' END"

static const char extend_tmpl[] =
    "UPDATE %1$s SET expires = " NEW_EXPIRY("", "$3::bigint")
    " WHERE name = decode($1, 'hex') AND $2::text = ANY(tokens) AND expires > clock_timestamp()";

static const char check_tmpl[] =
    "SELECT 1 FROM %1$s"
    " WHERE name = decode($1, 'hex') AND $2::text = ANY(tokens) AND expires > clock_timestamp()";

int dlock__pg_lease_extend(dlock__pg_be *be, const dlock_request *req)
{
    int rows, rc = on_hold(be, req, extend_tmpl, 1, &rows);
    return rc != DLOCK_OK ? rc : rows == 1 ? DLOCK_OK : not_ours(be, req);
}

int dlock__pg_lease_check(dlock__pg_be *be, const dlock_request *req)
{
    int rows, rc = on_hold(be, req, check_tmpl, 0, &rows);
    return rc != DLOCK_OK ? rc : rows == 1 ? DLOCK_OK : not_ours(be, req);
}

/* ---- renew: one statement for the whole batch --------------------------- */

/* $1 names (hex), $2 tokens, $3 leases, $4 kinds, as arrays. Returns the
 * tokens of the renewed rows: an item whose token is among them was
 * renewed. The mutexes' rows (kind 0) and the family's holds (pg_family.c,
 * each hold its own lease) in one statement. */
static const char renew_tmpl[] =
    "WITH x AS (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::int[])"
    "  AS x(n, tk, l, k)),"
    " u AS (SELECT decode(n, 'hex') AS name, array_agg(tk) AS toks, max(l) AS lease"
    "  FROM x WHERE k = 0 GROUP BY n),"
    " up AS (UPDATE %1$s t SET expires = " NEW_EXPIRY("t.", "u.lease")
    "  FROM u WHERE t.name = u.name AND t.tokens && u.toks AND t.expires > clock_timestamp()"
    "  RETURNING t.tokens),"
    " f AS (SELECT decode(n, 'hex') AS name, tk, l FROM x WHERE k <> 0),"
    " fp AS (UPDATE %1$s_family h"
    "  SET expires = clock_timestamp() + f.l * interval '1 millisecond'"
    "  FROM f WHERE h.name = f.name AND h.id = f.tk AND h.fence IS NOT NULL"
    "  AND h.expires > clock_timestamp() RETURNING h.id)"
    " SELECT unnest(tokens) FROM up UNION ALL SELECT id FROM fp";

/* The same for a table without its family (create=0, no TABLE_family). */
static const char renew_mutex_tmpl[] =
    "WITH u AS (SELECT decode(n, 'hex') AS name, array_agg(tk) AS toks, max(l) AS lease"
    "  FROM unnest($1::text[], $2::text[], $3::bigint[]) AS x(n, tk, l) GROUP BY n),"
    " up AS (UPDATE %1$s t SET expires = " NEW_EXPIRY("t.", "u.lease")
    "  FROM u WHERE t.name = u.name AND t.tokens && u.toks AND t.expires > clock_timestamp()"
    "  RETURNING t.tokens)"
    " SELECT unnest(tokens) FROM up";

/* Append s to the array literal being built in *buf (quoted, with \ and "
 * escaped). Returns 0, or -1 when out of memory. */
static int append_elem(char **buf, size_t *len, size_t *cap, const char *s)
{
    size_t need = *len + 2 * strlen(s) + 4;

    if (need > *cap) {
        size_t cap2 = need * 2;
        char *b = realloc(*buf, cap2);
        if (b == NULL)
            return -1;
        *buf = b;
        *cap = cap2;
    }
    if (*len > 1)
        (*buf)[(*len)++] = ',';
    (*buf)[(*len)++] = '"';
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            (*buf)[(*len)++] = '\\';
        (*buf)[(*len)++] = *s;
    }
    (*buf)[(*len)++] = '"';
    (*buf)[*len] = '\0';
    return 0;
}

int dlock__pg_lease_renew(dlock__pg_be *be, dlock_renewal *items, size_t n)
{
    char sql[SQL_MAX], *arr[4] = {NULL, NULL, NULL, NULL};
    size_t len[4] = {1, 1, 1, 1}, cap[4] = {0, 0, 0, 0};
    const char *p[4];
    const char *tmpl = be->has_family ? renew_tmpl : renew_mutex_tmpl;
    int np = be->has_family ? 4 : 3;
    PGresult *r;
    int rc = DLOCK_ENOMEM;

    for (int k = 0; k < 4; k++) {
        cap[k] = 256;
        if ((arr[k] = malloc(cap[k])) == NULL)
            goto out;
        strcpy(arr[k], "{");
    }
    for (size_t i = 0; i < n; i++) {
        char lease[24], kind[8], *name = dlock__pg_key_hex(be, items[i].req->name);
        int bad;

        if (name == NULL)
            goto out;
        snprintf(lease, sizeof(lease), "%lld", (long long)items[i].req->lease_ms);
        snprintf(kind, sizeof(kind), "%d", items[i].req->kind);
        bad = append_elem(&arr[0], &len[0], &cap[0], name) ||
              append_elem(&arr[1], &len[1], &cap[1], items[i].req->token) ||
              append_elem(&arr[2], &len[2], &cap[2], lease) ||
              append_elem(&arr[3], &len[3], &cap[3], kind);
        free(name);
        if (bad)
            goto out;
    }
    for (int k = 0; k < 4; k++) {
        arr[k][len[k]++] = '}';
        arr[k][len[k]] = '\0';
        p[k] = arr[k];
    }
    /* The watchdog's own connection: renewals never queue behind callers. */
    {
        int reused = be->wd != NULL;
        rc = dlock__pg_exec(be, &be->wd, fill(be, sql, tmpl), np, p, &r);
        if (rc == DLOCK_ECONN && reused) /* closed while idle: once more */
            rc = dlock__pg_exec(be, &be->wd, fill(be, sql, tmpl), np, p, &r);
    }
    if (rc != DLOCK_OK)
        goto out;
    for (size_t i = 0; i < n; i++) {
        items[i].result = DLOCK_ELOST;
        for (int row = 0; row < PQntuples(r); row++)
            if (strcmp(PQgetvalue(r, row, 0), items[i].req->token) == 0)
                items[i].result = DLOCK_OK;
    }
    PQclear(r);
out:
    for (int k = 0; k < 4; k++)
        free(arr[k]);
    if (rc == DLOCK_ENOMEM)
        dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    return rc;
}

/* ---- status, force release, list ------------------------------------- */

void dlock__pg_fill_info(dlock_lock_info *out, const PGresult *r, int row, int col)
{
    memset(out, 0, sizeof(*out));
    out->held = !PQgetisnull(r, row, col) && strcmp(PQgetvalue(r, row, col), "t") == 0;
    out->fence = (uint64_t)dlock__pg_num(r, row, col + 1);
    if (out->held) {
        out->ttl_ms = dlock__pg_num(r, row, col + 2);
        if (out->ttl_ms < 1)
            out->ttl_ms = 1;
        if (!PQgetisnull(r, row, col + 3))
            dlock_holder_parse(out, PQgetvalue(r, row, col + 3),
                               (size_t)PQgetlength(r, row, col + 3));
    }
}

#define INFO_COLS                                                                                  \
    "o.tokens IS NOT NULL AND o.expires > clock_timestamp(), o.fence,"                             \
    " CASE WHEN o.expires > clock_timestamp()"                                                      \
    "  THEN ceil(extract(epoch FROM o.expires - clock_timestamp()) * 1000)::bigint END, o.holder"

static const char status_tmpl[] = "SELECT " INFO_COLS " FROM %1$s o WHERE o.name = decode($1, 'hex')";

/* Run tmpl ($1 the name) and read the lock's state from its one row. */
static int read_info(dlock__pg_be *be, const char *tmpl, const char *name, dlock_lock_info *out)
{
    char sql[SQL_MAX], *hex = dlock__pg_key_hex(be, name);
    const char *p[1] = {hex};
    PGresult *r;
    int rc;

    if (hex == NULL)
        return DLOCK_ENOMEM;
    rc = dlock__pg_cmd(be, fill(be, sql, tmpl), 1, p, &r);
    free(hex);
    if (rc != DLOCK_OK)
        return rc;
    memset(out, 0, sizeof(*out));
    if (PQntuples(r) == 1)
        dlock__pg_fill_info(out, r, 0, 0);
    PQclear(r);
    return DLOCK_OK;
}

int dlock__pg_lease_status(dlock__pg_be *be, const char *name, dlock_lock_info *out)
{
    return read_info(be, status_tmpl, name, out);
}

/* The state before (the statement's snapshot), then the row cleared. */
static const char force_tmpl[] =
    "WITH r AS (UPDATE %1$s SET tokens = NULL, owner = NULL, holder = NULL,"
    "  expires = '-infinity' WHERE name = decode($1, 'hex') AND tokens IS NOT NULL"
    "  RETURNING name)"
    " SELECT " INFO_COLS ", (SELECT count(*) FROM r), pg_notify('%1$s', $1)"
    " FROM %1$s o WHERE o.name = decode($1, 'hex')";

int dlock__pg_lease_force_release(dlock__pg_be *be, const char *name, dlock_lock_info *removed)
{
    return read_info(be, force_tmpl, name, removed);
}

/* $1 key_prefix + prefix (hex), $2 the key prefix's length. */
static const char list_tmpl[] =
    "SELECT encode(substr(o.name, $2::int + 1), 'hex'), " INFO_COLS " FROM %1$s o"
    " WHERE substr(o.name, 1, length(decode($1, 'hex'))) = decode($1, 'hex')"
    "  AND o.tokens IS NOT NULL AND o.expires > clock_timestamp() ORDER BY o.name";

static int hex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Digits only, as encode(..., 'hex') writes them: sscanf's %2x would also
 * take a sign, a space or a single digit, and spell another name. */
int dlock__pg_unhex(char *out, const char *hex)
{
    size_t len = strlen(hex), n = len / 2;

    if (len % 2 != 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
        if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
            return -1;
        out[i] = (char)(hi * 16 + lo);
    }
    out[n] = '\0';
    return 0;
}

int dlock__pg_lease_list(dlock__pg_be *be, const char *prefix, dlock_list_cb cb, void *payload)
{
    char sql[SQL_MAX], plen[24], *hex = dlock__pg_key_hex(be, prefix);
    const char *p[2] = {hex, plen};
    PGresult *r;
    int rc;

    if (hex == NULL)
        return DLOCK_ENOMEM;
    snprintf(plen, sizeof(plen), "%zu", be->prefix_len);
    rc = dlock__pg_cmd(be, fill(be, sql, list_tmpl), 2, p, &r);
    free(hex);
    if (rc != DLOCK_OK)
        return rc;
    for (int row = 0; row < PQntuples(r); row++) {
        char name[DLOCK_NAME_MAX + 1];
        dlock_lock_info info;

        if (PQgetlength(r, row, 0) > 2 * DLOCK_NAME_MAX ||
            dlock__pg_unhex(name, PQgetvalue(r, row, 0)))
            continue; /* not a lock name dlock made */
        dlock__pg_fill_info(&info, r, row, 1);
        if (cb(name, &info, payload) != 0)
            break;
    }
    PQclear(r);
    return DLOCK_OK;
}
