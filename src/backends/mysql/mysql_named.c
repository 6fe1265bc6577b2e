/*
 * The MySQL backend's named mode: the server's user-level locks. GET_LOCK
 * belongs to a session, so each held lock has a connection of its own,
 * kept in be->held with the acquisition's token (the handle-to-connection
 * map); the lock ends with that connection, whether this process closes
 * it, dies, or the server kills it. The fence comes from dlock_fence in
 * the same CALL (dlock_named_acquire_v1), and dlock_named records the last
 * taker's fence, holder record and connection for status.
 *
 * There is no lease on the server: renew, extend and check ask whether the
 * lock's connection still holds it (IS_USED_LOCK(name) = its
 * CONNECTION_ID()), from the watchdog's connection, every held lock in one
 * statement; the client's lease is only how often that is asked.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mysql_int.h"

struct my_named {
    my_named *next;
    char *token;
    char *name;
    MYSQL *c;
    unsigned long conn; /* c's CONNECTION_ID() */
    uint64_t fence;
    char expr[MY_LOCKEXPR_MAX];
};

int my_named_take_conn(my_be *be, MYSQL **out)
{
    pthread_mutex_lock(&be->named_mu);
    *out = be->nspare > 0 ? be->spare[--be->nspare] : NULL;
    pthread_mutex_unlock(&be->named_mu);
    return *out != NULL ? DLOCK_OK : my_connect(be, out);
}

void my_named_give_conn(my_be *be, MYSQL *c)
{
    pthread_mutex_lock(&be->named_mu);
    if (be->nspare < (int)(sizeof(be->spare) / sizeof(be->spare[0]))) {
        be->spare[be->nspare++] = c;
        c = NULL;
    }
    pthread_mutex_unlock(&be->named_mu);
    my_drop(&c);
}

static void free_named(my_named *h)
{
    my_drop(&h->c);
    free(h->token);
    free(h->name);
    free(h);
}

void my_named_close(my_be *be)
{
    while (be->held != NULL) {
        my_named *h = be->held;
        be->held = h->next;
        free_named(h);
    }
    while (be->nspare > 0)
        my_drop(&be->spare[--be->nspare]);
}

/* The entry of token, under named_mu. */
static my_named *find(my_be *be, const char *token, my_named ***link)
{
    my_named **p = &be->held;

    for (; *p != NULL; p = &(*p)->next)
        if (strcmp((*p)->token, token) == 0) {
            if (link != NULL)
                *link = p;
            return *p;
        }
    return NULL;
}

int my_named_acquire(my_be *be, const dlock_request *req, void *watch, dlock_acquire_result *out)
{
    char key[MY_HEX_MAX], expr[MY_LOCKEXPR_MAX], holder[2 * DLOCK_HOLDER_MAX + 8];
    char sql[sizeof(key) + sizeof(expr) + sizeof(holder) + 96];
    MYSQL *c = NULL;
    MYSQL_RES *res;
    my_named *h;
    int64_t v[2];
    int found, rc;

    if ((rc = my_key_hex(be, req->name, key)) != DLOCK_OK ||
        (rc = my_lock_expr(be, req->name, 'n', expr)) != DLOCK_OK)
        return rc;
    pthread_mutex_lock(&be->named_mu);
    if ((h = find(be, req->token, NULL)) != NULL) {
        /* Taken by this token already (a retry): its fence. */
        out->fence = h->fence;
        pthread_mutex_unlock(&be->named_mu);
        return DLOCK_OK;
    }
    pthread_mutex_unlock(&be->named_mu);
    /* Granted to the waiter's connection already, or a fresh try. */
    if ((c = my_watch_take_granted(watch)) == NULL &&
        (rc = my_named_take_conn(be, &c)) != DLOCK_OK)
        return rc;
    if (req->holder != NULL && strlen(req->holder) <= DLOCK_HOLDER_MAX)
        my_hex(holder, req->holder, strlen(req->holder));
    else
        snprintf(holder, sizeof(holder), "NULL");
    snprintf(sql, sizeof(sql), "CALL dlock_named_acquire_v1(%s, %s, %s)", key, expr, holder);
    /* A reply lost is a connection closed: the lock, if taken, goes with
     * it, so a retry starts afresh. */
    if ((rc = my_query(be, &c, sql, &res, NULL)) != DLOCK_OK) {
        my_drop(&c);
        return rc;
    }
    if ((rc = my_row_ints(be, res, v, 2, 0, &found, "dlock_named_acquire_v1")) != DLOCK_OK ||
        !found) {
        my_drop(&c);
        return rc != DLOCK_OK ? rc
                              : dlock_backend_fail(DLOCK_EPROTO,
                                                   "%s: dlock_named_acquire_v1 returned no row",
                                                   be->where);
    }
    if (v[0] != 1) {
        my_named_give_conn(be, c);
        out->retry_ms = INT64_MAX; /* GET_LOCK's queue announces the release */
        return DLOCK_EBUSY;
    }
    if (v[1] <= 0) {
        my_drop(&c);
        return dlock_backend_fail(DLOCK_EPROTO, "%s: fence %lld is not positive", be->where,
                                  (long long)v[1]);
    }
    if ((h = calloc(1, sizeof(*h))) == NULL || (h->token = strdup(req->token)) == NULL ||
        (h->name = strdup(req->name)) == NULL) {
        if (h != NULL)
            free_named(h);
        my_drop(&c);
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    }
    h->c = c;
    h->conn = mysql_thread_id(c);
    h->fence = (uint64_t)v[1];
    snprintf(h->expr, sizeof(h->expr), "%s", expr);
    pthread_mutex_lock(&be->named_mu);
    h->next = be->held;
    be->held = h;
    pthread_mutex_unlock(&be->named_mu);
    out->fence = h->fence;
    return DLOCK_OK;
}

int my_named_release(void *arg, const dlock_request *req)
{
    my_be *be = arg;
    char sql[MY_LOCKEXPR_MAX + 96];
    my_named *h, **link = NULL;
    MYSQL_RES *res;
    int64_t v;
    int found, rc;

    pthread_mutex_lock(&be->named_mu);
    if ((h = find(be, req->token, &link)) != NULL)
        *link = h->next;
    pthread_mutex_unlock(&be->named_mu);
    if (h == NULL)
        return dlock_backend_fail(DLOCK_ELOST, "%s: this handle holds no named lock", be->where);
    /* One lock a connection: RELEASE_ALL_LOCKS also undoes a waiter's
     * grant taken again by the acquire (GET_LOCK counts). */
    snprintf(sql, sizeof(sql), "SELECT IS_USED_LOCK(%s) <=> CONNECTION_ID(), RELEASE_ALL_LOCKS()",
             h->expr);
    rc = my_query(be, &h->c, sql, &res, NULL);
    if (rc == DLOCK_OK)
        rc = my_row_ints(be, res, &v, 1, 0, &found, "the release");
    if (rc == DLOCK_OK && found && v == 1) {
        my_named_give_conn(be, h->c);
        h->c = NULL;
    } else if (rc == DLOCK_OK || rc == DLOCK_ECONN) {
        /* Not held by our connection, or the connection is gone: lost. */
        rc = dlock_backend_fail(DLOCK_ELOST, "%s: the named lock's connection no longer held it",
                                be->where);
    }
    free_named(h);
    return rc;
}

/* Is each of n tokens' lock still held by its connection? One statement on
 * *slot; results[i] DLOCK_OK or DLOCK_ELOST. */
static int still_held(my_be *be, MYSQL **slot, const char *const *tokens, int *results, size_t n)
{
    size_t cap = 64 + n * (MY_LOCKEXPR_MAX + 48), len;
    char *sql = malloc(cap);
    MYSQL_RES *res = NULL;
    MYSQL_ROW row;
    int rc = DLOCK_OK;

    if (sql == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "%s: out of memory", be->where);
    len = (size_t)snprintf(sql, cap, "SELECT 0");
    pthread_mutex_lock(&be->named_mu);
    for (size_t i = 0; i < n; i++) {
        my_named *h = find(be, tokens[i], NULL);
        if (h == NULL)
            len += (size_t)snprintf(sql + len, cap - len, ", 0");
        else
            len += (size_t)snprintf(sql + len, cap - len, ", IS_USED_LOCK(%s) <=> %lu", h->expr,
                                    h->conn);
    }
    pthread_mutex_unlock(&be->named_mu);
    if ((rc = my_query(be, slot, sql, &res, NULL)) != DLOCK_OK)
        goto done;
    if (res == NULL || mysql_num_fields(res) != n + 1 || (row = mysql_fetch_row(res)) == NULL) {
        rc = dlock_backend_fail(DLOCK_EPROTO, "%s: the lock check returned no row", be->where);
        goto done;
    }
    for (size_t i = 0; i < n; i++)
        results[i] = row[i + 1] != NULL && strcmp(row[i + 1], "1") == 0 ? DLOCK_OK : DLOCK_ELOST;
done:
    if (res != NULL)
        mysql_free_result(res);
    free(sql);
    return rc;
}

int my_named_check(void *arg, const dlock_request *req)
{
    my_be *be = arg;
    const char *tokens[1] = {req->token};
    int result, rc;

    pthread_mutex_lock(&be->mu);
    rc = still_held(be, &be->cmd, tokens, &result, 1);
    pthread_mutex_unlock(&be->mu);
    return rc != DLOCK_OK ? rc : result;
}

int my_named_renew(void *arg, dlock_renewal *items, size_t n)
{
    my_be *be = arg;
    const char **tokens = malloc((n ? n : 1) * sizeof(*tokens));
    int *results = malloc((n ? n : 1) * sizeof(*results));
    int rc;

    if (tokens == NULL || results == NULL) {
        free(tokens);
        free(results);
        return dlock_backend_fail(DLOCK_ENOMEM, "%s: out of memory", be->where);
    }
    for (size_t i = 0; i < n; i++)
        tokens[i] = items[i].req->token;
    rc = n == 0 ? DLOCK_OK : still_held(be, &be->wd, tokens, results, n);
    for (size_t i = 0; rc == DLOCK_OK && i < n; i++)
        items[i].result = results[i];
    free(tokens);
    free(results);
    return rc;
}

/* Columns: held, fence, ttl, holder, name, holding connection, recorded
 * connection. */
#define NAMED_COLS(lock)                                                                           \
    "IS_USED_LOCK(" lock ") IS NOT NULL, n.fence, -1, n.holder, n.name, IS_USED_LOCK(" lock "),"  \
    " n.conn"

static void fill_named(MYSQL_ROW row, unsigned long *lens, dlock_lock_info *out)
{
    memset(out, 0, sizeof(*out));
    out->held = row[0] != NULL && strcmp(row[0], "1") == 0;
    out->fence = row[1] != NULL ? strtoull(row[1], NULL, 10) : 0;
    out->ttl_ms = out->held ? -1 : 0;
    /* The record is the holder's only if its connection still holds it. */
    if (out->held && row[5] != NULL && row[6] != NULL && strcmp(row[5], row[6]) == 0)
        my_holder_fill(out, row[3], lens[3]);
}

int my_named_status(my_be *be, const char *name, int force, dlock_lock_info *out)
{
    char key[MY_HEX_MAX], expr[MY_LOCKEXPR_MAX], sql[MY_HEX_MAX + 3 * MY_LOCKEXPR_MAX + 256];
    MYSQL_RES *res = NULL;
    MYSQL_ROW row;
    unsigned long long conn = 0;
    int rc;

    memset(out, 0, sizeof(*out));
    if ((rc = my_key_hex(be, name, key)) != DLOCK_OK ||
        (rc = my_lock_expr(be, name, 'n', expr)) != DLOCK_OK)
        return rc;
    snprintf(sql, sizeof(sql),
             "SELECT IS_USED_LOCK(%s) IS NOT NULL, n.fence, -1, n.holder, n.name,"
             " IS_USED_LOCK(%s), n.conn FROM (SELECT 1) AS d LEFT JOIN dlock_named AS n"
             " ON n.name = %s",
             expr, expr, key);
    if ((rc = my_cmd(be, sql, &res, NULL)) != DLOCK_OK)
        return rc;
    if (res == NULL || mysql_num_fields(res) != 7 || (row = mysql_fetch_row(res)) == NULL) {
        if (res != NULL)
            mysql_free_result(res);
        return dlock_backend_fail(DLOCK_EPROTO, "%s: the status query returned no row",
                                  be->where);
    }
    fill_named(row, mysql_fetch_lengths(res), out);
    if (row[5] != NULL)
        conn = strtoull(row[5], NULL, 10);
    mysql_free_result(res);
    if (force && out->held && conn != 0) {
        /* Only its session can release a user-level lock: end it. */
        snprintf(sql, sizeof(sql), "KILL CONNECTION %llu", conn);
        if ((rc = my_cmd(be, sql, NULL, NULL)) != DLOCK_OK)
            return rc;
    }
    return DLOCK_OK;
}

int my_named_list(my_be *be, const char *prefix, dlock_list_cb cb, void *payload)
{
    char key[MY_HEX_MAX], sql[MY_HEX_MAX + 512], name[DLOCK_NAME_MAX + 1];
    size_t lp = strlen(be->prefix);
    MYSQL_RES *res = NULL;
    MYSQL_ROW row;
    int rc;

    if ((rc = my_key_hex(be, prefix, key)) != DLOCK_OK)
        return rc;
    snprintf(sql, sizeof(sql),
             "SELECT " NAMED_COLS("n.lockname") " FROM dlock_named AS n"
             " WHERE LEFT(n.name, %zu) = %s AND IS_USED_LOCK(n.lockname) IS NOT NULL"
             " ORDER BY n.name",
             lp + strlen(prefix), key);
    if ((rc = my_cmd(be, sql, &res, NULL)) != DLOCK_OK)
        return rc;
    if (res == NULL || mysql_num_fields(res) != 7) {
        if (res != NULL)
            mysql_free_result(res);
        return dlock_backend_fail(DLOCK_EPROTO, "%s: the list query returned no rows", be->where);
    }
    while ((row = mysql_fetch_row(res)) != NULL) {
        unsigned long *lens = mysql_fetch_lengths(res);
        dlock_lock_info info;
        if (lens[4] < lp || lens[4] - lp > DLOCK_NAME_MAX ||
            memchr(row[4] + lp, '\0', lens[4] - lp) != NULL)
            continue;
        memcpy(name, row[4] + lp, lens[4] - lp);
        name[lens[4] - lp] = '\0';
        fill_named(row, lens, &info);
        if (cb(name, &info, payload) != 0)
            break;
    }
    mysql_free_result(res);
    return DLOCK_OK;
}
