/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The store in MariaDB or MySQL (`--store mysql://user:pass@host:port/db`,
 * `?socket=PATH` for a unix socket), through libmariadb.
 *
 * Each run works in a database of its own, named by the run (made by
 * setup, dropped by teardown; the account needs CREATE and DROP), so runs
 * against a shared server do not meet.
 *
 * InnoDB under READ COMMITTED, as the PostgreSQL store: a fenced payment
 * reads the job's fence with LOCK IN SHARE MODE (FOR SHARE on MySQL 8), so
 * a newer holder's registration (an UPDATE of that row) waits for the
 * payment to commit, and the newer holder's read of the pending orders,
 * which follows its registration, sees the order paid. A locking read sees
 * the latest committed row whatever the isolation level.
 */
#include "store_int.h"

#include <inttypes.h>
#include <mysql.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    demo_store base;
    MYSQL *conn;
    char db[80]; /* quoted identifier */
} my_store;

static void my_error(my_store *s, const char *what)
{
    demo_store_set_error(&s->base, "mysql: %s: %s (error %u)", what, mysql_error(s->conn),
                         mysql_errno(s->conn));
}

/* Run a statement, its result (if any) dropped; *changed (may be NULL):
 * the rows it changed. */
static int run(my_store *s, const char *sql, long *changed)
{
    MYSQL_RES *res;

    if (mysql_query(s->conn, sql) != 0) {
        my_error(s, sql);
        return -1;
    }
    if (changed != NULL)
        *changed = (long)mysql_affected_rows(s->conn);
    if ((res = mysql_store_result(s->conn)) != NULL)
        mysql_free_result(res);
    else if (mysql_field_count(s->conn) != 0) {
        my_error(s, sql);
        return -1;
    }
    return 0;
}

static void rollback(my_store *s)
{
    mysql_query(s->conn, "ROLLBACK");
}

static void my_close(demo_store *store)
{
    my_store *s = (my_store *)store;
    mysql_close(s->conn);
    free(s);
}

static int my_setup(demo_store *store)
{
    my_store *s = (my_store *)store;
    char sql[256];
    static const char *const ddl[] = {
        "DROP TABLE IF EXISTS demo_ledger, demo_payout, demo_job",
        "CREATE TABLE demo_payout("
        "  order_id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,"
        "  round INTEGER NOT NULL,"
        "  amount_cents BIGINT NOT NULL,"
        "  status VARCHAR(8) NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'paid')),"
        "  fence BIGINT UNSIGNED NOT NULL DEFAULT 0) ENGINE=InnoDB",
        "CREATE TABLE demo_ledger("
        "  id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,"
        "  order_id BIGINT NOT NULL REFERENCES demo_payout(order_id),"
        "  instance INTEGER NOT NULL,"
        "  fence BIGINT UNSIGNED NOT NULL,"
        "  amount_cents BIGINT NOT NULL,"
        "  INDEX demo_ledger_order (order_id)) ENGINE=InnoDB",
        ("CREATE TABLE demo_job("
         "  job VARCHAR(16) PRIMARY KEY, fence BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB"),
        "INSERT INTO demo_job VALUES ('payout', 0)",
    };

    snprintf(sql, sizeof sql, "CREATE DATABASE IF NOT EXISTS %s", s->db);
    if (run(s, sql, NULL) != 0)
        return -1;
    snprintf(sql, sizeof sql, "USE %s", s->db);
    if (run(s, sql, NULL) != 0)
        return -1;
    for (size_t i = 0; i < sizeof ddl / sizeof ddl[0]; i++)
        if (run(s, ddl[i], NULL) != 0)
            return -1;
    return 0;
}

static int my_teardown(demo_store *store)
{
    my_store *s = (my_store *)store;
    char sql[160];
    snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS %s", s->db);
    return run(s, sql, NULL);
}

static int my_add_orders(demo_store *store, int round, int count, uint64_t *rng)
{
    my_store *s = (my_store *)store;
    if (run(s, "START TRANSACTION", NULL) != 0)
        return -1;
    for (int i = 0; i < count; i++) {
        char sql[160];
        snprintf(sql, sizeof sql,
                 "INSERT INTO demo_payout(round, amount_cents) VALUES (%d, %" PRId64 ")", round,
                 demo_store_amount(rng));
        if (run(s, sql, NULL) != 0)
            goto err;
    }
    if (run(s, "COMMIT", NULL) != 0)
        goto err;
    return 0;
err:
    rollback(s);
    return -1;
}

/* The first column of every row of sql. */
static int query_ids(my_store *s, const char *sql, int64_t **ids, size_t *count)
{
    MYSQL_RES *res;
    MYSQL_ROW row;
    size_t n = 0;
    int64_t *v = NULL;

    if (mysql_query(s->conn, sql) != 0 || (res = mysql_store_result(s->conn)) == NULL) {
        my_error(s, sql);
        return -1;
    }
    if (mysql_num_rows(res) > 0 &&
        (v = malloc((size_t)mysql_num_rows(res) * sizeof *v)) == NULL) {
        demo_store_set_error(&s->base, "out of memory");
        mysql_free_result(res);
        return -1;
    }
    while ((row = mysql_fetch_row(res)) != NULL)
        v[n++] = row[0] != NULL ? strtoll(row[0], NULL, 10) : 0;
    mysql_free_result(res);
    *ids = v;
    *count = n;
    return 0;
}

static int query_int(my_store *s, const char *sql, int64_t *out)
{
    int64_t *v;
    size_t n;

    if (query_ids(s, sql, &v, &n) != 0)
        return -1;
    if (n != 1) {
        free(v);
        demo_store_set_error(&s->base, "mysql: %s: no row", sql);
        return -1;
    }
    *out = v[0];
    free(v);
    return 0;
}

static int my_ids(demo_store *store, const char *sql, int64_t **ids, size_t *count)
{
    return query_ids((my_store *)store, sql, ids, count);
}

static int my_summary(demo_store *store, demo_store_summary *out)
{
    return demo_store_sql_summary(store, my_ids, out);
}

static int my_pending(demo_store *store, int64_t **ids, size_t *count)
{
    return my_ids(store, demo_store_pending_sql, ids, count);
}

static demo_store_result my_register(demo_store *store, uint64_t fence)
{
    my_store *s = (my_store *)store;
    char sql[160];
    long n;

    snprintf(sql, sizeof sql,
             "UPDATE demo_job SET fence = %" PRIu64 " WHERE job = 'payout' AND fence < %" PRIu64,
             fence, fence);
    if (run(s, sql, &n) != 0)
        return STORE_ERROR;
    return n == 1 ? STORE_OK : STORE_REFUSED;
}

static demo_store_result my_pay(demo_store *store, demo_mode mode, int64_t order, uint64_t fence,
                                int instance)
{
    my_store *s = (my_store *)store;
    demo_store_result result = STORE_OK;
    char sql[320];
    int64_t stored;
    long n;

    if (run(s, "START TRANSACTION", NULL) != 0)
        return STORE_ERROR;
    switch (mode) {
    case DEMO_NOLOCK:
    case DEMO_TTL:
        snprintf(sql, sizeof sql,
                 "UPDATE demo_payout SET status = 'paid' WHERE order_id = %" PRId64, order);
        if (run(s, sql, NULL) != 0)
            goto err;
        break;
    case DEMO_FENCE_ROW:
        snprintf(sql, sizeof sql,
                 "UPDATE demo_payout SET status = 'paid', fence = %" PRIu64
                 " WHERE order_id = %" PRId64 " AND fence < %" PRIu64,
                 fence, order, fence);
        if (run(s, sql, &n) != 0)
            goto err;
        if (n == 0)
            result = STORE_REFUSED;
        break;
    case DEMO_FENCE:
        if (query_int(s, "SELECT fence FROM demo_job WHERE job = 'payout' LOCK IN SHARE MODE",
                      &stored) != 0)
            goto err;
        if ((uint64_t)stored != fence) {
            result = STORE_REFUSED;
            break;
        }
        snprintf(sql, sizeof sql,
                 "UPDATE demo_payout SET status = 'paid', fence = %" PRIu64
                 " WHERE order_id = %" PRId64,
                 fence, order);
        if (run(s, sql, NULL) != 0)
            goto err;
        break;
    default:
        demo_store_set_error(store, "unknown mode %d", (int)mode);
        goto err;
    }
    if (result == STORE_OK) {
        snprintf(sql, sizeof sql,
                 "INSERT INTO demo_ledger(order_id, instance, fence, amount_cents) "
                 "SELECT order_id, %d, %" PRIu64 ", amount_cents FROM demo_payout "
                 "WHERE order_id = %" PRId64,
                 instance, fence, order);
        if (run(s, sql, NULL) != 0)
            goto err;
    }
    if (run(s, result == STORE_OK ? "COMMIT" : "ROLLBACK", NULL) != 0)
        goto err;
    return result;
err:
    rollback(s);
    return STORE_ERROR;
}

static const demo_store_ops my_ops = {
    "mysql",    my_close,   my_setup,    my_teardown, my_add_orders,
    my_summary, my_pending, my_register, my_pay,
};

/* mysql://[user[:password]@]host[:port]/db[?socket=PATH] into its parts
 * (copied into buf, percent-escapes not decoded: the demo's URLs have
 * none). */
typedef struct {
    char buf[512];
    const char *user, *password, *host, *db, *socket;
    unsigned port;
} my_url;

static int parse(const char *url, my_url *u)
{
    char *p, *at, *slash, *q, *colon;

    memset(u, 0, sizeof *u);
    p = strstr(url, "://");
    if (p == NULL || snprintf(u->buf, sizeof u->buf, "%s", p + 3) >= (int)sizeof u->buf)
        return -1;
    p = u->buf;
    if ((q = strchr(p, '?')) != NULL) {
        *q++ = '\0';
        if (strncmp(q, "socket=", 7) != 0 || strchr(q, '&') != NULL)
            return -1;
        u->socket = q + 7;
    }
    if ((slash = strchr(p, '/')) == NULL || slash[1] == '\0')
        return -1;
    *slash = '\0';
    u->db = slash + 1;
    if ((at = strrchr(p, '@')) != NULL) {
        *at = '\0';
        u->user = p;
        if ((colon = strchr(p, ':')) != NULL) {
            *colon = '\0';
            u->password = colon + 1;
        }
        p = at + 1;
    }
    u->host = p[0] != '\0' ? p : "localhost";
    if ((colon = strrchr(p, ':')) != NULL) {
        *colon = '\0';
        u->port = (unsigned)strtoul(colon + 1, NULL, 10);
    }
    return 0;
}

demo_store *demo_store_mysql_open(const char *url, const char *ns, char *err, size_t errlen)
{
    my_store *s = calloc(1, sizeof *s);
    unsigned timeout = 10;
    my_url u;

    if (s == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->base.ops = &my_ops;
    for (const char *c = ns; *c; c++) {
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_')) {
            snprintf(err, errlen, "bad database name %s", ns);
            free(s);
            return NULL;
        }
    }
    snprintf(s->db, sizeof s->db, "`%.70s`", ns);
    if (parse(url, &u) != 0) {
        snprintf(err, errlen, "mysql: expected mysql://USER:PASSWORD@HOST:PORT/DB[?socket=PATH]");
        free(s);
        return NULL;
    }
    if ((s->conn = mysql_init(NULL)) == NULL) {
        snprintf(err, errlen, "out of memory");
        free(s);
        return NULL;
    }
    mysql_options(s->conn, MYSQL_OPT_CONNECT_TIMEOUT, &timeout);
    mysql_options(s->conn, MYSQL_OPT_READ_TIMEOUT, &timeout);
    mysql_options(s->conn, MYSQL_OPT_WRITE_TIMEOUT, &timeout);
    if (mysql_real_connect(s->conn, u.socket != NULL ? "localhost" : u.host, u.user, u.password,
                           u.db, u.port, u.socket, 0) == NULL) {
        /* The client library's message never holds the password. */
        snprintf(err, errlen, "mysql: %s", mysql_error(s->conn));
        goto err;
    }
    memset(u.buf, 0, sizeof u.buf);
    if (run(s, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED", NULL) != 0) {
        snprintf(err, errlen, "%s", s->base.error);
        goto err;
    }
    /* The run's database, if setup made it already (instances). */
    {
        char sql[160];
        snprintf(sql, sizeof sql, "USE %s", s->db);
        mysql_query(s->conn, sql);
    }
    return &s->base;
err:
    memset(u.buf, 0, sizeof u.buf);
    mysql_close(s->conn);
    free(s);
    return NULL;
}
