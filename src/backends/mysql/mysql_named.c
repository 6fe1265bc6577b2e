/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The MySQL backend's named mode: the server's user-level locks. GET_LOCK
 * belongs to a session, so each held lock has a connection of its own,
 * kept in be->held with the acquisition's token (the handle-to-connection
 * map); the lock ends with that connection, whether this process closes
 * it, dies, or the server kills it. The fence comes from dlock_fence in
 * the same CALL (dlock_named_acquire_v1), and dlock_named records the last
 * taker's fence, holder record and connection for status.
 *
 * The lease on the server is the lock connection's wait_timeout, set to
 * the lease in whole seconds (rounded up) by the acquiring CALL: the server
 * closes a connection idle that long, and the lock goes with it, so a
 * holder that stops renewing (paused, cut off) loses the lock on the
 * server too, never before the client counts it lost. Renewal is a
 * statement on each lock's own connection, which resets its idle clock
 * and asks whether it still holds the lock (IS_USED_LOCK(name) =
 * CONNECTION_ID()); the watchdog sends them all first, then reads the
 * replies, so n locks cost one round trip of time. be->named_mu is held
 * across it: release waits for a renewal running on its connection.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mysql_int.h"

struct dlock__my_named {
    dlock__my_named *next;
    char *token;
    char *name;
    char *key;          /* the stored name, as a hex literal */
    MYSQL *c;
    unsigned long conn; /* c's CONNECTION_ID() */
    uint64_t fence;
    int64_t lease_s;    /* c's wait_timeout */
    char expr[DLOCK__MY_LOCKEXPR_MAX];
};

/* The server's lease for lease_ms: whole seconds, rounded up. */
static int64_t lease_seconds(int64_t ms)
{
    int64_t s = (ms + 999) / 1000;

    return s < 1 ? 1 : s > 31536000 ? 31536000 : s;
}

int dlock__my_named_take_conn(dlock__my_be *be, MYSQL **out)
{
    pthread_mutex_lock(&be->named_mu);
    *out = be->nspare > 0 ? be->spare[--be->nspare] : NULL;
    pthread_mutex_unlock(&be->named_mu);
    return *out != NULL ? DLOCK_OK : dlock__my_connect(be, out);
}

void dlock__my_named_give_conn(dlock__my_be *be, MYSQL *c)
{
    pthread_mutex_lock(&be->named_mu);
    if (be->nspare < (int)(sizeof(be->spare) / sizeof(be->spare[0]))) {
        be->spare[be->nspare++] = c;
        c = NULL;
    }
    pthread_mutex_unlock(&be->named_mu);
    dlock__my_drop(&c);
}

static void free_named(dlock__my_named *h)
{
    dlock__my_drop(&h->c);
    free(h->token);
    free(h->name);
    free(h->key);
    free(h);
}

void dlock__my_named_close(dlock__my_be *be)
{
    while (be->held != NULL) {
        dlock__my_named *h = be->held;
        be->held = h->next;
        free_named(h);
    }
    while (be->nspare > 0)
        dlock__my_drop(&be->spare[--be->nspare]);
}

/* The entry of token, under named_mu. */
static dlock__my_named *find(dlock__my_be *be, const char *token, dlock__my_named ***link)
{
    dlock__my_named **p = &be->held;

    for (; *p != NULL; p = &(*p)->next)
        if (strcmp((*p)->token, token) == 0) {
            if (link != NULL)
                *link = p;
            return *p;
        }
    return NULL;
}

int dlock__my_named_acquire(dlock__my_be *be, const dlock_request *req, void *watch,
                            dlock_acquire_result *out)
{
    char key[DLOCK__MY_HEX_MAX], expr[DLOCK__MY_LOCKEXPR_MAX], holder[2 * DLOCK_HOLDER_MAX + 8];
    char sql[sizeof(key) + sizeof(expr) + sizeof(holder) + 96];
    MYSQL *c = NULL;
    MYSQL_RES *res;
    dlock__my_named *h;
    int64_t v[2];
    int found, rc;

    if ((rc = dlock__my_key_hex(be, req->name, key)) != DLOCK_OK ||
        (rc = dlock__my_lock_expr(be, req->name, 'n', expr)) != DLOCK_OK)
        return rc;
    pthread_mutex_lock(&be->named_mu);
    if ((h = find(be, req->token, NULL)) != NULL) {
        /* Taken by this token already (a retry): its fence. */
        out->fence = h->fence;
        pthread_mutex_unlock(&be->named_mu);
        return DLOCK_OK;
    }
    pthread_mutex_unlock(&be->named_mu);
    if (req->holder != NULL && strlen(req->holder) <= DLOCK_HOLDER_MAX)
        dlock__my_hex(holder, req->holder, strlen(req->holder));
    else
        snprintf(holder, sizeof(holder), "NULL");
    snprintf(sql, sizeof(sql), "CALL dlock_named_acquire_v1(%s, %s, %lld, %s)", key, expr,
             (long long)lease_seconds(req->lease_ms), holder);
    /* Granted to the waiter's connection already, or a fresh try; a spare
     * connection the server closed meanwhile is replaced once. A reply
     * lost is a connection closed: the lock, if taken, goes with it, so a
     * retry starts afresh. */
    for (int tries = 0;; tries++) {
        int spare = 0;
        if ((c = dlock__my_watch_take_granted(watch)) == NULL) {
            pthread_mutex_lock(&be->named_mu);
            spare = be->nspare > 0;
            pthread_mutex_unlock(&be->named_mu);
            if ((rc = dlock__my_named_take_conn(be, &c)) != DLOCK_OK)
                return rc;
        }
        if ((rc = dlock__my_query(be, &c, sql, &res, NULL)) == DLOCK_OK)
            break;
        dlock__my_drop(&c);
        if (!spare || tries > 0)
            return rc;
    }
    if ((rc = dlock__my_row_ints(be, res, v, 2, 0, &found, "dlock_named_acquire_v1")) != DLOCK_OK ||
        !found) {
        dlock__my_drop(&c);
        return rc != DLOCK_OK ? rc
                              : dlock_backend_fail(DLOCK_EPROTO,
                                                   "%s: dlock_named_acquire_v1 returned no row",
                                                   be->where);
    }
    if (v[0] != 1) {
        dlock__my_named_give_conn(be, c);
        out->retry_ms = INT64_MAX; /* GET_LOCK's queue announces the release */
        return DLOCK_EBUSY;
    }
    if (v[1] <= 0) {
        dlock__my_drop(&c);
        return dlock_backend_fail(DLOCK_EPROTO, "%s: fence %lld is not positive", be->where,
                                  (long long)v[1]);
    }
    if ((h = calloc(1, sizeof(*h))) == NULL || (h->token = strdup(req->token)) == NULL ||
        (h->name = strdup(req->name)) == NULL || (h->key = strdup(key)) == NULL) {
        if (h != NULL)
            free_named(h);
        dlock__my_drop(&c);
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    }
    h->c = c;
    h->conn = mysql_thread_id(c);
    h->fence = (uint64_t)v[1];
    h->lease_s = lease_seconds(req->lease_ms);
    snprintf(h->expr, sizeof(h->expr), "%s", expr);
    pthread_mutex_lock(&be->named_mu);
    h->next = be->held;
    be->held = h;
    pthread_mutex_unlock(&be->named_mu);
    out->fence = h->fence;
    return DLOCK_OK;
}

int dlock__my_named_release(void *arg, const dlock_request *req)
{
    dlock__my_be *be = arg;
    char sql[DLOCK__MY_LOCKEXPR_MAX + 96];
    dlock__my_named *h, **link = NULL;
    MYSQL_RES *res;
    int64_t v;
    int found, rc;

    pthread_mutex_lock(&be->named_mu); /* waits for a renewal on h->c */
    if ((h = find(be, req->token, &link)) != NULL)
        *link = h->next;
    pthread_mutex_unlock(&be->named_mu);
    if (h == NULL)
        return dlock_backend_fail(DLOCK_ELOST, "%s: this handle holds no named lock", be->where);
    /* One lock a connection: RELEASE_ALL_LOCKS also undoes a waiter's
     * grant taken again by the acquire (GET_LOCK counts). */
    snprintf(sql, sizeof(sql), "SELECT IS_USED_LOCK(%s) <=> CONNECTION_ID(), RELEASE_ALL_LOCKS()",
             h->expr);
    rc = dlock__my_query(be, &h->c, sql, &res, NULL);
    if (rc == DLOCK_OK)
        rc = dlock__my_row_ints(be, res, &v, 1, 0, &found, "the release");
    if (rc == DLOCK_OK && found && v == 1) {
        /* Kept for the next acquisition, which sets its wait_timeout
         * again: a new connection per lock cost a connect, its
         * authentication and set-up per cycle. One the server closed
         * meanwhile (idle past this lease's wait_timeout) is noticed
         * before use (dlock__my_query) and replaced. */
        dlock__my_named_give_conn(be, h->c);
        h->c = NULL;
    } else if (rc == DLOCK_OK || rc == DLOCK_ECONN) {
        /* Not held by our connection, or the connection is gone: lost. */
        rc = dlock_backend_fail(DLOCK_ELOST, "%s: the named lock's connection no longer held it",
                                be->where);
    }
    free_named(h);
    return rc;
}

/* Read the reply to a statement sent on h->c: DLOCK_OK if it says the lock
 * is still held there, else DLOCK_ELOST (and h->c closed if broken). */
static int read_held(dlock__my_named *h)
{
    MYSQL_RES *res;
    MYSQL_ROW row;
    int held = 0;

    if (mysql_read_query_result(h->c) != 0 || (res = mysql_store_result(h->c)) == NULL) {
        dlock__my_drop(&h->c);
        return DLOCK_ELOST;
    }
    if ((row = mysql_fetch_row(res)) != NULL && row[0] != NULL)
        held = strcmp(row[0], "1") == 0;
    mysql_free_result(res);
    return held ? DLOCK_OK : DLOCK_ELOST;
}

/* Set h's lease on the server (its connection's wait_timeout). */
static int set_lease(dlock__my_be *be, dlock__my_named *h, int64_t lease_s)
{
    char sql[DLOCK__MY_HEX_MAX + 160];

    if (h->c == NULL || lease_s == h->lease_s)
        return h->c == NULL ? DLOCK_ELOST : DLOCK_OK;
    snprintf(sql, sizeof(sql), "SET SESSION wait_timeout = %lld", (long long)lease_s);
    if (dlock__my_query(be, &h->c, sql, NULL, NULL) != DLOCK_OK)
        return DLOCK_ELOST;
    /* For status: the record's lease, while this connection is the holder. */
    snprintf(sql, sizeof(sql),
             "UPDATE dlock_named SET lease_s = %lld WHERE name = %s AND conn = CONNECTION_ID()",
             (long long)lease_s, h->key);
    if (dlock__my_query(be, &h->c, sql, NULL, NULL) != DLOCK_OK)
        return DLOCK_ELOST;
    h->lease_s = lease_s;
    return DLOCK_OK;
}

/*
 * Renew (or check, lease_ms < 0: no new lease) the locks of n requests on
 * their own connections: every statement sent first, then every reply
 * read. A connection that fails loses its lock (the server ends the lock
 * with it); no error is the batch's.
 */
static void renew_held(dlock__my_be *be, const dlock_request *const *reqs, int *results, size_t n)
{
    dlock__my_named **hs = calloc(n ? n : 1, sizeof(*hs));

    pthread_mutex_lock(&be->named_mu);
    for (size_t i = 0; i < n; i++) {
        char sql[DLOCK__MY_LOCKEXPR_MAX + 96];
        dlock__my_named *h = find(be, reqs[i]->token, NULL);
        results[i] = DLOCK_ELOST;
        if (h == NULL || hs == NULL)
            continue;
        if (reqs[i]->lease_ms >= 0 && set_lease(be, h, lease_seconds(reqs[i]->lease_ms)) != DLOCK_OK)
            continue;
        snprintf(sql, sizeof(sql), "SELECT IS_USED_LOCK(%s) <=> CONNECTION_ID()", h->expr);
        if (h->c == NULL || mysql_send_query(h->c, sql, (unsigned long)strlen(sql)) != 0) {
            dlock__my_drop(&h->c);
            continue;
        }
        hs[i] = h;
    }
    for (size_t i = 0; i < n; i++)
        if (hs != NULL && hs[i] != NULL)
            results[i] = read_held(hs[i]);
    pthread_mutex_unlock(&be->named_mu);
    free(hs);
}

int dlock__my_named_check(void *arg, const dlock_request *req)
{
    dlock_request r = *req;
    const dlock_request *p = &r;
    int result;

    r.lease_ms = -1;
    renew_held(arg, &p, &result, 1);
    return result == DLOCK_OK ? DLOCK_OK
                              : dlock_backend_fail(DLOCK_ELOST,
                                                   "%s: the named lock's connection "
                                                   "no longer holds it",
                                                   ((dlock__my_be *)arg)->where);
}

int dlock__my_named_extend(void *arg, const dlock_request *req)
{
    int result;

    renew_held(arg, &req, &result, 1);
    return result == DLOCK_OK ? DLOCK_OK
                              : dlock_backend_fail(DLOCK_ELOST,
                                                   "%s: the named lock's connection "
                                                   "no longer holds it",
                                                   ((dlock__my_be *)arg)->where);
}

int dlock__my_named_renew(void *arg, dlock_renewal *items, size_t n)
{
    dlock__my_be *be = arg;
    const dlock_request **reqs = calloc(n ? n : 1, sizeof(*reqs));
    int *results = malloc((n ? n : 1) * sizeof(*results));

    if (reqs == NULL || results == NULL) {
        free(reqs);
        free(results);
        return dlock_backend_fail(DLOCK_ENOMEM, "%s: out of memory", be->where);
    }
    for (size_t i = 0; i < n; i++)
        reqs[i] = items[i].req;
    renew_held(be, reqs, results, n);
    for (size_t i = 0; i < n; i++)
        items[i].result = results[i];
    free(reqs);
    free(results);
    return DLOCK_OK;
}

/* Columns: held, fence, ttl, holder, name, holding connection, recorded
 * connection. */
#define NAMED_COLS(lock)                                                                           \
    "IS_USED_LOCK(" lock ") IS NOT NULL, n.fence,"                                                 \
    " (SELECT GREATEST(1, n.lease_s - p.TIME) * 1000 FROM information_schema.PROCESSLIST AS p"     \
    "  WHERE p.ID = IS_USED_LOCK(" lock ")), n.holder, n.name, IS_USED_LOCK(" lock "), n.conn"

void dlock__my_named_fill_info(MYSQL_ROW row, unsigned long *lens, dlock_lock_info *out)
{
    memset(out, 0, sizeof(*out));
    out->held = row[0] != NULL && strcmp(row[0], "1") == 0;
    out->fence = row[1] != NULL ? strtoull(row[1], NULL, 10) : 0;
    /* The holder's idle limit less its idle time (whole seconds); -1 when
     * the lock is someone else's GET_LOCK. */
    out->ttl_ms = !out->held ? 0 : row[2] != NULL && row[5] != NULL && row[6] != NULL &&
                                           strcmp(row[5], row[6]) == 0
                                       ? strtoll(row[2], NULL, 10)
                                       : -1;
    /* The record is the holder's only if its connection still holds it. */
    if (out->held && row[5] != NULL && row[6] != NULL && strcmp(row[5], row[6]) == 0)
        dlock__my_holder_fill(out, row[3], lens[3]);
}

int dlock__my_named_status(dlock__my_be *be, const char *name, int force, dlock_lock_info *out)
{
    char key[DLOCK__MY_HEX_MAX], expr[DLOCK__MY_LOCKEXPR_MAX],
        sql[DLOCK__MY_HEX_MAX + 5 * DLOCK__MY_LOCKEXPR_MAX + 1024];
    MYSQL_RES *res = NULL;
    MYSQL_ROW row;
    unsigned long long conn = 0;
    int rc;

    memset(out, 0, sizeof(*out));
    if ((rc = dlock__my_key_hex(be, name, key)) != DLOCK_OK ||
        (rc = dlock__my_lock_expr(be, name, 'n', expr)) != DLOCK_OK)
        return rc;
    {
        /* NAMED_COLS with the lock's expression for n.lockname. */
        char cols[4 * DLOCK__MY_LOCKEXPR_MAX + 512];
        snprintf(cols, sizeof(cols),
                 "IS_USED_LOCK(%s) IS NOT NULL, n.fence,"
                 " (SELECT GREATEST(1, n.lease_s - p.TIME) * 1000"
                 " FROM information_schema.PROCESSLIST AS p WHERE p.ID = IS_USED_LOCK(%s)),"
                 " n.holder, n.name, IS_USED_LOCK(%s), n.conn",
                 expr, expr, expr);
        snprintf(sql, sizeof(sql),
                 "SELECT %s FROM (SELECT 1) AS d LEFT JOIN dlock_named AS n ON n.name = %s",
                 cols, key);
    }
    if ((rc = dlock__my_cmd(be, sql, &res, NULL)) != DLOCK_OK)
        return rc;
    if (res == NULL || mysql_num_fields(res) != 7 || (row = mysql_fetch_row(res)) == NULL) {
        if (res != NULL)
            mysql_free_result(res);
        return dlock_backend_fail(DLOCK_EPROTO, "%s: the status query returned no row",
                                  be->where);
    }
    dlock__my_named_fill_info(row, mysql_fetch_lengths(res), out);
    if (row[5] != NULL)
        conn = strtoull(row[5], NULL, 10);
    mysql_free_result(res);
    if (force && out->held && conn != 0) {
        /* Only its session can release a user-level lock: end it. */
        int64_t until = dlock__my_now_ms() + be->command_ms;
        snprintf(sql, sizeof(sql), "KILL CONNECTION %llu", conn);
        if ((rc = dlock__my_cmd(be, sql, NULL, NULL)) != DLOCK_OK)
            return rc;
        /* KILL returns before the killed session has let go of its locks:
         * confirm it did (it takes the server a moment), so that the lock
         * is free when this returns. */
        snprintf(sql, sizeof(sql), "SELECT IS_USED_LOCK(%s) <=> %llu", expr, conn);
        for (long pause_us = 1000;; pause_us = pause_us < 50000 ? pause_us * 2 : pause_us) {
            MYSQL_RES *r;
            int64_t v;
            int found;
            if ((rc = dlock__my_cmd(be, sql, &r, NULL)) != DLOCK_OK ||
                (rc = dlock__my_row_ints(be, r, &v, 1, 0, &found,
                                         "the check after KILL")) != DLOCK_OK)
                return rc;
            if (v != 1)
                break;
            if (dlock__my_now_ms() >= until)
                return dlock_backend_fail(DLOCK_ECONN, "%s: connection %llu still holds the lock "
                                          "%lld ms after KILL", be->where, conn,
                                          (long long)be->command_ms);
            usleep((useconds_t)pause_us);
        }
    }
    return DLOCK_OK;
}

int dlock__my_named_list(dlock__my_be *be, const char *prefix, dlock_list_cb cb, void *payload)
{
    char key[DLOCK__MY_HEX_MAX], sql[DLOCK__MY_HEX_MAX + 1024];
    size_t lp = strlen(be->prefix);
    int rc;

    if ((rc = dlock__my_key_hex(be, prefix, key)) != DLOCK_OK)
        return rc;
    snprintf(sql, sizeof(sql),
             "SELECT " NAMED_COLS("n.lockname") " FROM dlock_named AS n"
             " WHERE LEFT(n.name, %zu) = %s AND IS_USED_LOCK(n.lockname) IS NOT NULL"
             " ORDER BY n.name",
             lp + strlen(prefix), key);
    return dlock__my_list_query(be, sql, 7, dlock__my_named_fill_info, cb, payload);
}
