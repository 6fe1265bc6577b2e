/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The test servers "mysql" (the lease table) and "mysql-named" (the URL's
 * mode=named: GET_LOCK on a connection per lock) on a private MariaDB
 * (test_mysql.c).
 */
#include "test_server.h"

/* The GET_LOCK name of lock name under "dlock:", as the backend makes it. */
static void lock_expr(char *out, size_t size, const char *name, char tag)
{
    char key[600];
    size_t len;
    int plain;

    snprintf(key, sizeof(key), "dlock:%s", name);
    len = strlen(key);
    plain = tag == 'n' && len <= 64 && strspn(key, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:-_./") == len;
    if (plain)
        snprintf(out, size, "'%s'", key);
    else
        snprintf(out, size, "CONCAT('%s', LEFT(SHA2('%s', 256), 58))",
                 tag == 'n' ? "dlock#" : "dlckw#", key);
}

static int mysql_held(test_server *s, const char *name)
{
    char expr[800];

    if (s->sql_named) {
        lock_expr(expr, sizeof(expr), name, 'n');
        return test_mariadb_query(&s->mariadb, "SELECT IS_USED_LOCK(%s) IS NOT NULL", expr) == 1;
    }
    return test_mariadb_query(&s->mariadb,
                              "SELECT COUNT(*) FROM dlock_locks WHERE name = 'dlock:%s'"
                              " AND token <> '' AND expires > UTC_TIMESTAMP(6)",
                              name) > 0;
}

static long long mysql_leftovers(test_server *s, const char *name)
{
    char expr[800];

    if (s->sql_named) {
        lock_expr(expr, sizeof(expr), name, 'n');
        return test_mariadb_query(&s->mariadb, "SELECT IS_USED_LOCK(%s) IS NOT NULL", expr);
    }
    /* A live row and its wake channel (an expired row left by a holder
     * that died is the fence's record, as Redis' counter is). */
    lock_expr(expr, sizeof(expr), name, 'w');
    return test_mariadb_query(&s->mariadb,
                              "SELECT (SELECT COUNT(*) FROM dlock_locks WHERE name = 'dlock:%s'"
                              " AND token <> '' AND expires > UTC_TIMESTAMP(6))"
                              " + (IS_USED_LOCK(%s) IS NOT NULL)",
                              name, expr);
}

static long long mysql_requests(test_server *s)
{
    return test_mariadb_query(&s->mariadb,
                              "SELECT SUM(VARIABLE_VALUE) FROM information_schema.GLOBAL_STATUS"
                              " WHERE VARIABLE_NAME IN ('COM_SELECT', 'COM_UPDATE',"
                              " 'COM_CALL_PROCEDURE')");
}

static void mysql_start(test_server *s)
{
    test_mariadb_start(&s->mariadb);
    snprintf(s->sql_url, sizeof(s->sql_url), "%s%s", s->mariadb.url,
             s->sql_named ? "?mode=named" : "");
    s->url = s->sql_url;
}

static void mysql_named_start(test_server *s)
{
    s->sql_named = 1;
    mysql_start(s);
}

static void mysql_stop(test_server *s)
{
    test_mariadb_stop(&s->mariadb);
}

static void mysql_pause(test_server *s, int paused)
{
    test__signal(s->mariadb.pid, paused);
}

const test_server_ops test_server_mysql = {
    .name = "mysql",
    .backend = "mysql",
    .short_lease_ms = 1000, /* a statement's round trip is slower than Redis' */
    .start = mysql_start,
    .stop = mysql_stop,
    .pause = mysql_pause,
    .held = mysql_held,
    .leftovers = mysql_leftovers,
    .requests = mysql_requests,
};

const test_server_ops test_server_mysql_named = {
    .name = "mysql-named",
    .backend = "mysql",
    .short_lease_ms = 1000,
    .conn_bound = 1, /* each lock on a connection of its own */
    .start = mysql_named_start,
    .stop = mysql_stop,
    .pause = mysql_pause,
    .held = mysql_held,
    .leftovers = mysql_leftovers,
    .requests = mysql_requests,
};
