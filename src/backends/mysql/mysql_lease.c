/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The MySQL backend's lease mode: one row per lock in dlock_locks, taken
 * by the procedure dlock_acquire_v1 (mysql_schema.c) in one round trip,
 * kept, renewed and given up by statements conditional on the token and on
 * the expiry by the server's clock (UTC_TIMESTAMP(6)). A lease that ran
 * out on the server's clock is lost even when nobody took it since.
 *
 * The wake channel: while this client holds a lease it holds the GET_LOCK
 * "dlckw#<hash of the name>" on its wake connection; waiters block on that
 * (mysql_wait.c), so a release, or the death of the holder's process,
 * wakes them. It decides nothing: a lost channel only delays a waiter to
 * the holder's expiry. The acquire takes it in the same round trip as the
 * row: its GET_LOCK goes out on the wake connection beside the CALL on
 * cmd, and both replies are read before the acquire returns (taken before
 * the commit, mostly: a waiter that sees the new holder finds the channel
 * held, as the family's acquire has it, mysql_family.c); the release sends
 * the row's UPDATE and the channel's RELEASE_LOCK in one request on the
 * wake connection, the channel given up only once the row is free, so that
 * nobody is woken before the lock is. Two round trips a cycle, as the
 * row's statements alone take.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mysqld_error.h>

#include "mysql_int.h"

/* "UTC_TIMESTAMP(6) + INTERVAL ms * 1000 MICROSECOND" needs ms in range. */
static int64_t lease_us(int64_t ms)
{
    return ms < 1 ? 1000 : ms > (int64_t)86400000 * 3650 ? (int64_t)86400000 * 3650000 : ms * 1000;
}

/* take_ms < 0: give the channel up; else take it, waiting at most that. */
static void wake_hold(dlock__my_be *be, const char *name, int64_t take_ms)
{
    char expr[DLOCK__MY_LOCKEXPR_MAX], sql[DLOCK__MY_LOCKEXPR_MAX * 2 + 128];
    char saved[512];

    if (dlock__my_lock_expr(be, name, 'w', expr) != DLOCK_OK)
        return;
    /* Held once per lease: GET_LOCK counts, so only when not held yet.
     * MariaDB takes a fraction of a second (10.1.2 on); MySQL rounds it. */
    if (take_ms >= 0)
        snprintf(sql, sizeof(sql),
                 "SELECT IF(IS_USED_LOCK(%s) <=> CONNECTION_ID(), 1, GET_LOCK(%s, %lld.%03lld))",
                 expr, expr, (long long)(take_ms / 1000), (long long)(take_ms % 1000));
    else
        snprintf(sql, sizeof(sql), "SELECT RELEASE_LOCK(%s)", expr);
    /* Best effort, and the caller's message is kept. */
    snprintf(saved, sizeof(saved), "%s", dlock_error_message());
    pthread_mutex_lock(&be->wake_mu);
    if (dlock__my_query(be, &be->wake, sql, NULL, NULL) != DLOCK_OK)
        dlock_backend_fail(DLOCK_OK, "%s", saved);
    pthread_mutex_unlock(&be->wake_mu);
    dlock_backend_fail(DLOCK_OK, "%s", saved);
}

/*
 * The grab beside a winning acquire finds the channel held for a moment
 * when it comes just before the last holder's RELEASE_LOCK, or while a
 * waiter's look at it (mysql_wait.c: GET_LOCK, then RELEASE_LOCK) holds
 * it: GET_LOCK(w, 0) then fails, the new holder's release would wake
 * nobody, and its waiters would sleep to its lease's end (5 s steps in the
 * family's tests). So the take after the acquire waits for it a little.
 */
void dlock__my_wake_take(dlock__my_be *be, const char *name, int64_t lease_ms)
{
    int64_t wait_ms = lease_ms / 10;

    wake_hold(be, name, wait_ms < 0 ? 0 : wait_ms > 200 ? 200 : wait_ms);
}

void dlock__my_wake_give(dlock__my_be *be, const char *name)
{
    wake_hold(be, name, -1);
}

/* The statement that takes name's channel unless held here already; 0 if
 * the name has none. Its reply is read by grab_read. */
static int grab_sql(dlock__my_be *be, const char *name, char *sql, size_t size)
{
    char expr[DLOCK__MY_LOCKEXPR_MAX];

    if (dlock__my_lock_expr(be, name, 'w', expr) != DLOCK_OK)
        return 0;
    snprintf(sql, size,
             "SELECT IS_USED_LOCK(%s) <=> CONNECTION_ID(),"
             " IF(IS_USED_LOCK(%s) <=> CONNECTION_ID(), 0, GET_LOCK(%s, 0))",
             expr, expr, expr);
    return 1;
}

/* What the grab's reply says (dlock__my_wake_grab's answer); res freed. */
static int grab_read(MYSQL_RES *res)
{
    MYSQL_ROW row;
    int taken = 0;

    if (res != NULL && (row = mysql_fetch_row(res)) != NULL && mysql_num_fields(res) == 2)
        taken = row[0] != NULL && strcmp(row[0], "1") == 0 ? 2
                : row[1] != NULL && strcmp(row[1], "1") == 0 ? 1 : 0;
    if (res != NULL)
        mysql_free_result(res);
    return taken;
}

int dlock__my_wake_grab(dlock__my_be *be, const char *name)
{
    char sql[DLOCK__MY_LOCKEXPR_MAX * 3 + 128], saved[512];
    MYSQL_RES *res = NULL;
    int taken = 0;

    if (!grab_sql(be, name, sql, sizeof(sql)))
        return 0;
    snprintf(saved, sizeof(saved), "%s", dlock_error_message());
    pthread_mutex_lock(&be->wake_mu);
    if (dlock__my_query(be, &be->wake, sql, &res, NULL) == DLOCK_OK)
        taken = grab_read(res);
    pthread_mutex_unlock(&be->wake_mu);
    dlock_backend_fail(DLOCK_OK, "%s", saved);
    return taken;
}

int dlock__my_lease_acquire(dlock__my_be *be, const dlock_request *req, void *watch,
                            dlock_acquire_result *out)
{
    char key[DLOCK__MY_HEX_MAX], tok[80], holder[2 * DLOCK_HOLDER_MAX + 8];
    char sql[sizeof(key) + sizeof(tok) + sizeof(holder) + 96];
    char grab[DLOCK__MY_LOCKEXPR_MAX * 3 + 128], saved[512];
    MYSQL_RES *res = NULL, *gres = NULL;
    int64_t v[3] = {0, 0, 0};
    int found = 0, rc, unknown = 0, have_grab, sent, grabbed = 0;

    if ((rc = dlock__my_key_hex(be, req->name, key)) != DLOCK_OK)
        return rc;
    if (strlen(req->token) > 32)
        return dlock_backend_fail(DLOCK_EINVAL, "%s: token longer than 32 bytes", be->where);
    dlock__my_hex(tok, req->token, strlen(req->token));
    if (req->holder != NULL && strlen(req->holder) <= DLOCK_HOLDER_MAX)
        dlock__my_hex(holder, req->holder, strlen(req->holder));
    else
        snprintf(holder, sizeof(holder), "NULL");
    snprintf(sql, sizeof(sql), "CALL dlock_acquire_v1(%s, %s, %lld, %s)", key, tok,
             (long long)(lease_us(req->lease_ms) / 1000), holder);
    have_grab = grab_sql(be, req->name, grab, sizeof(grab));
    /* mu, then wake_mu: the family's order (it grabs inside its transaction). */
    pthread_mutex_lock(&be->mu);
    pthread_mutex_lock(&be->wake_mu);
    /* The channel's statement out first, the row's beside it; a failure on
     * the wake connection only leaves the channel to dlock__my_wake_take below. */
    sent = have_grab && dlock__my_send(be, &be->wake, grab) == DLOCK_OK;
    /* A deadlock or a lock wait that timed out rolled everything back:
     * try again, a few times. */
    for (int tries = 0;; tries++) {
        rc = dlock__my_query(be, &be->cmd, sql, &res, &unknown);
        if (rc == DLOCK_OK || tries == 3 || unknown || be->cmd == NULL ||
            (mysql_errno(be->cmd) != ER_LOCK_DEADLOCK &&
             mysql_errno(be->cmd) != ER_LOCK_WAIT_TIMEOUT))
            break;
    }
    /* The channel is best effort: the row's outcome keeps its message. */
    snprintf(saved, sizeof(saved), "%s", dlock_error_message());
    if (sent && dlock__my_read(be, &be->wake, &gres) == DLOCK_OK)
        grabbed = grab_read(gres);
    dlock_backend_fail(DLOCK_OK, "%s", saved);
    pthread_mutex_unlock(&be->wake_mu);
    pthread_mutex_unlock(&be->mu);
    if (watch != NULL)
        dlock__my_watch_note_try(watch, req->token, unknown);
    if (rc == DLOCK_OK)
        rc = dlock__my_row_ints(be, res, v, 3, 0, &found, "dlock_acquire_v1");
    if (rc == DLOCK_OK && !found)
        rc = dlock_backend_fail(DLOCK_EPROTO, "%s: dlock_acquire_v1 returned no row", be->where);
    if (rc == DLOCK_OK && v[0] == 1 && v[1] <= 0)
        rc = dlock_backend_fail(DLOCK_EPROTO, "%s: fence %lld is not positive", be->where,
                                (long long)v[1]);
    if (rc == DLOCK_OK && v[0] == 1) {
        out->fence = (uint64_t)v[1];
        if (grabbed == 0) /* not taken, not ours before: once more */
            dlock__my_wake_take(be, req->name, req->lease_ms);
        return DLOCK_OK;
    }
    /* Not ours (or not known to be): a channel this call took goes back,
     * unless a lost reply may have taken the lease with it. */
    if (grabbed == 1 && !unknown)
        dlock__my_wake_give(be, req->name);
    if (rc != DLOCK_OK)
        return rc;
    out->retry_ms = v[2] < 0 ? 0 : v[2];
    return DLOCK_EBUSY;
}

/* The release's SET clause. */
#define RELEASED "token = '', holder = NULL, expires = UTC_TIMESTAMP(6)"

/* An UPDATE of the row of name if token holds it unexpired: DLOCK_OK when
 * it matched, DLOCK_ELOST when not. set: the SET clause; then, when after
 * is not NULL, that statement in the same request (the UPDATE commits,
 * autocommit, before it runs; a failed UPDATE ends the request there).
 * Sent on conn, under mu. */
static int owned_update_on(dlock__my_be *be, MYSQL **conn, pthread_mutex_t *mu,
                           const char *name, const char *token, const char *set,
                           const char *after)
{
    char key[DLOCK__MY_HEX_MAX], tok[80], sql[DLOCK__MY_HEX_MAX + DLOCK__MY_LOCKEXPR_MAX + 512];
    uint64_t affected = 0;
    int rc;

    if ((rc = dlock__my_key_hex(be, name, key)) != DLOCK_OK)
        return rc;
    if (strlen(token) > 32)
        return DLOCK_ELOST;
    dlock__my_hex(tok, token, strlen(token));
    snprintf(sql, sizeof(sql),
             "UPDATE dlock_locks SET %s WHERE name = %s AND token = %s"
             " AND expires > UTC_TIMESTAMP(6)%s%s",
             set, key, tok, after != NULL ? ";" : "", after != NULL ? after : "");
    pthread_mutex_lock(mu);
    rc = dlock__my_query_rows(be, conn, sql, NULL, NULL, &affected);
    pthread_mutex_unlock(mu);
    if (rc == DLOCK_OK && affected != 1)
        rc = dlock_backend_fail(DLOCK_ELOST, "%s: the lease is no longer this token's",
                                be->where);
    return rc;
}

static int owned_update(dlock__my_be *be, const char *name, const char *token, const char *set)
{
    return owned_update_on(be, &be->cmd, &be->mu, name, token, set, NULL);
}

/*
 * The row given up and then the channel, in one request on the wake
 * connection: the UPDATE commits before the RELEASE_LOCK runs, so no
 * waiter wakes to a lock not yet free, and both are done when this
 * returns. A failed UPDATE ends the request there: the channel stays, as
 * it did when the UPDATE failed on cmd.
 */
static int release_row_and_channel(dlock__my_be *be, const char *name, const char *token)
{
    char expr[DLOCK__MY_LOCKEXPR_MAX], after[DLOCK__MY_LOCKEXPR_MAX + 32];
    int rc;

    if (dlock__my_lock_expr(be, name, 'w', expr) != DLOCK_OK) {
        rc = owned_update(be, name, token, RELEASED);
        if (rc == DLOCK_OK || rc == DLOCK_ELOST)
            dlock__my_wake_give(be, name);
        return rc;
    }
    snprintf(after, sizeof(after), "SELECT RELEASE_LOCK(%s)", expr);
    return owned_update_on(be, &be->wake, &be->wake_mu, name, token, RELEASED, after);
}

int dlock__my_lease_release_token(dlock__my_be *be, const char *name, const char *token)
{
    char key[DLOCK__MY_HEX_MAX], tok[80], sql[DLOCK__MY_HEX_MAX + 256];
    int rc = release_row_and_channel(be, name, token);

    if (rc == DLOCK_ELOST && dlock__my_key_hex(be, name, key) == DLOCK_OK && strlen(token) <= 32) {
        /* Ran out but nobody took it: tidy up, and still not ours. */
        dlock__my_hex(tok, token, strlen(token));
        snprintf(sql, sizeof(sql),
                 "UPDATE dlock_locks SET token = '', holder = NULL WHERE name = %s AND token = %s",
                 key, tok);
        dlock__my_cmd(be, sql, NULL, NULL);
        dlock_backend_fail(DLOCK_ELOST, "%s: the lease had run out", be->where);
    }
    return rc;
}

int dlock__my_lease_release(void *arg, const dlock_request *req)
{
    return dlock__my_lease_release_token(arg, req->name, req->token);
}

int dlock__my_lease_extend(void *arg, const dlock_request *req)
{
    char set[128];

    snprintf(set, sizeof(set), "expires = UTC_TIMESTAMP(6) + INTERVAL %lld MICROSECOND",
             (long long)lease_us(req->lease_ms));
    return owned_update(arg, req->name, req->token, set);
}

int dlock__my_lease_check(dlock__my_be *be, const dlock_request *req, int family)
{
    char key[DLOCK__MY_HEX_MAX], tok[80], sql[DLOCK__MY_HEX_MAX + 256];
    MYSQL_RES *res;
    int64_t v;
    int found, rc;

    if ((rc = dlock__my_key_hex(be, req->name, key)) != DLOCK_OK)
        return rc;
    if (strlen(req->token) > 32)
        return DLOCK_ELOST;
    dlock__my_hex(tok, req->token, strlen(req->token));
    snprintf(sql, sizeof(sql),
             "SELECT 1 FROM %s WHERE name = %s AND token = %s%s AND expires > UTC_TIMESTAMP(6)",
             family ? "dlock_holds" : "dlock_locks", key, tok, family ? " AND waiting = 0" : "");
    if ((rc = dlock__my_cmd(be, sql, &res, NULL)) != DLOCK_OK ||
        (rc = dlock__my_row_ints(be, res, &v, 1, 0, &found, "the check")) != DLOCK_OK)
        return rc;
    return found ? DLOCK_OK : DLOCK_ELOST;
}

/*
 * The watchdog's batch: one UPDATE for every lease whose token still holds
 * it unexpired; when fewer rows matched than were asked, one SELECT finds
 * which (a renewed row is unexpired and still has our token, one not
 * renewed is not both). On the wd connection, without mu.
 */
int dlock__my_lease_renew(void *arg, dlock_renewal *items, size_t n)
{
    dlock__my_be *be = arg;
    /* Sized by the names at hand, not the longest a name may be: 128 such
     * slots were 1.5 MB a batch, mapped and unmapped each time, whose page
     * faults cost the renewal most of its CPU (issue 33). Per lock: its key
     * in hex (X'..', twice the bytes and 3) twice in the statement and
     * once in the check, and the rest of the text about each. */
    size_t keys_len = 0, cap = 256, lp = strlen(be->prefix);
    char *sql = NULL, *where = NULL, *hexes = NULL, **keys = NULL;
    char tok[80];
    size_t len = 0, wlen = 0;
    uint64_t affected = 0;
    MYSQL_RES *res = NULL;
    int rc;

    if (n == 0)
        return DLOCK_OK;
    for (size_t i = 0; i < n; i++)
        keys_len += 2 * (lp + strlen(items[i].req->name)) + 4;
    cap += 2 * keys_len + n * 160;
    sql = malloc(cap);
    where = malloc(cap);
    /* Each key written in place, where the longest still fits. */
    hexes = malloc(keys_len + DLOCK__MY_HEX_MAX);
    keys = malloc(n * sizeof(*keys));
    if (sql == NULL || where == NULL || hexes == NULL || keys == NULL) {
        rc = dlock_backend_fail(DLOCK_ENOMEM, "%s: out of memory", be->where);
        goto done;
    }
    len = (size_t)snprintf(sql, cap,
                           "UPDATE dlock_locks SET expires = UTC_TIMESTAMP(6) + INTERVAL"
                           " CASE name");
    for (size_t i = 0, at = 0; i < n; i++) {
        const dlock_request *r = items[i].req;
        keys[i] = hexes + at;
        if ((rc = dlock__my_key_hex(be, r->name, keys[i])) != DLOCK_OK)
            goto done;
        at += strlen(keys[i]) + 1;
        dlock__my_hex(tok, r->token, strlen(r->token) > 32 ? 32 : strlen(r->token));
        len += (size_t)snprintf(sql + len, cap - len, " WHEN %s THEN %lld", keys[i],
                                (long long)lease_us(r->lease_ms));
        wlen += (size_t)snprintf(where + wlen, cap - wlen, "%s(name = %s AND token = %s)",
                                 i ? " OR " : "", keys[i], tok);
        items[i].result = DLOCK_ELOST;
    }
    snprintf(sql + len, cap - len,
             " ELSE 0 END MICROSECOND WHERE (%s) AND expires > UTC_TIMESTAMP(6)", where);
    if ((rc = dlock__my_query_rows(be, &be->wd, sql, NULL, NULL, &affected)) != DLOCK_OK)
        goto done;
    if (affected == n) {
        for (size_t i = 0; i < n; i++)
            items[i].result = DLOCK_OK;
        goto done;
    }
    snprintf(sql, cap,
             "SELECT name, token FROM dlock_locks WHERE (%s) AND expires > UTC_TIMESTAMP(6)",
             where);
    if ((rc = dlock__my_query(be, &be->wd, sql, &res, NULL)) != DLOCK_OK)
        goto done;
    if (res == NULL || mysql_num_fields(res) != 2) {
        rc = dlock_backend_fail(DLOCK_EPROTO, "%s: the renewal check returned no rows",
                                be->where);
        goto done;
    }
    for (MYSQL_ROW row; (row = mysql_fetch_row(res)) != NULL;) {
        unsigned long *lens = mysql_fetch_lengths(res);
        for (size_t i = 0; i < n; i++) {
            const dlock_request *r = items[i].req;
            size_t ln = strlen(r->name), lt = strlen(r->token);
            if (lens[0] == lp + ln && memcmp(row[0], be->prefix, lp) == 0 &&
                memcmp(row[0] + lp, r->name, ln) == 0 && lens[1] == lt &&
                memcmp(row[1], r->token, lt) == 0)
                items[i].result = DLOCK_OK;
        }
    }
    /* Leases lost: their wake channels wake nobody any more. */
    for (size_t i = 0; i < n; i++)
        if (items[i].result == DLOCK_ELOST)
            dlock__my_wake_give(be, items[i].req->name);
done:
    if (res != NULL)
        mysql_free_result(res);
    free(sql);
    free(where);
    free(hexes);
    free(keys);
    return rc;
}

/* A name's live family holds (mysql_family.c), in a subquery. */
#define LIVE_HOLDS                                                                                 \
    " FROM dlock_holds h WHERE h.name = dlock_locks.name AND h.waiting = 0"                      \
    " AND h.expires > UTC_TIMESTAMP(6)"

/* The columns read for a lock: held, fence, ms left, holder, name (what
 * dlock__my_lease_fill_info reads), then the family's count of holds and the
 * oldest's kind (NULL for a plain mutex). A family row (token '*') takes
 * them from its holds: the oldest's record, the longest lease. */
#define STATUS_COLS                                                                                \
    "IF(token = '*', EXISTS(SELECT 1" LIVE_HOLDS "),"                                            \
    " token <> '' AND expires > UTC_TIMESTAMP(6)), fence,"                                      \
    " GREATEST(0, CEIL(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6),"                             \
    " IF(token = '*', (SELECT MAX(h.expires)" LIVE_HOLDS "), expires)) / 1000)),"                \
    " IF(token = '*', (SELECT h.holder" LIVE_HOLDS " ORDER BY h.fence, h.seq LIMIT 1), holder),"  \
    " name, IF(token = '*', (SELECT COUNT(*)" LIVE_HOLDS "), NULL),"                             \
    " IF(token = '*', (SELECT h.kind" LIVE_HOLDS " ORDER BY h.fence, h.seq LIMIT 1), NULL)"
#define STATUS_NCOLS 7

void dlock__my_lease_fill_info(MYSQL_ROW row, unsigned long *lens, dlock_lock_info *out)
{
    memset(out, 0, sizeof(*out));
    out->held = row[0] != NULL && strcmp(row[0], "1") == 0;
    out->fence = row[1] != NULL ? strtoull(row[1], NULL, 10) : 0;
    out->ttl_ms = out->held && row[2] != NULL ? strtoll(row[2], NULL, 10) : 0;
    if (out->held)
        dlock__my_holder_fill(out, row[3], lens[3]);
}

/* dlock__my_lease_fill_info, and the holds' count and kind. */
static void fill_all(MYSQL_ROW row, unsigned long *lens, dlock_lock_info *out)
{
    dlock__my_lease_fill_info(row, lens, out);
    if (!out->held) {
        out->holders = 0;
        out->kind = -1;
    } else if (row[5] != NULL) {
        out->holders = atoi(row[5]);
        out->kind = row[6] != NULL ? atoi(row[6]) : -1;
    } else {
        out->holders = 1;
        out->kind = DLOCK_KIND_MUTEX;
    }
}

int dlock__my_lease_status(dlock__my_be *be, const char *name, int force, dlock_lock_info *out)
{
    char key[DLOCK__MY_HEX_MAX], sql[DLOCK__MY_HEX_MAX + 2048];
    MYSQL_RES *res = NULL;
    MYSQL_ROW row;
    int rc;

    memset(out, 0, sizeof(*out));
    if ((rc = dlock__my_key_hex(be, name, key)) != DLOCK_OK)
        return rc;
    pthread_mutex_lock(&be->mu);
    if (force && (rc = dlock__my_query(be, &be->cmd, "START TRANSACTION", NULL, NULL)) != DLOCK_OK)
        goto out;
    snprintf(sql, sizeof(sql), "SELECT " STATUS_COLS " FROM dlock_locks WHERE name = %s%s", key,
             force ? " FOR UPDATE" : "");
    if ((rc = dlock__my_query(be, &be->cmd, sql, &res, NULL)) != DLOCK_OK)
        goto out;
    if (res == NULL || mysql_num_fields(res) != STATUS_NCOLS) {
        rc = dlock_backend_fail(DLOCK_EPROTO, "%s: the status query returned no rows", be->where);
        goto out;
    }
    if ((row = mysql_fetch_row(res)) != NULL)
        fill_all(row, mysql_fetch_lengths(res), out);
    else
        out->kind = -1;
    if (force) {
        /* Every kind's holds go with the row's holder; places stay. */
        snprintf(sql, sizeof(sql), "DELETE FROM dlock_holds WHERE name = %s AND waiting = 0", key);
        if ((rc = dlock__my_query(be, &be->cmd, sql, NULL, NULL)) != DLOCK_OK)
            goto out;
        snprintf(sql, sizeof(sql),
                 "UPDATE dlock_locks SET token = '', holder = NULL, expires = UTC_TIMESTAMP(6)"
                 " WHERE name = %s",
                 key);
        if ((rc = dlock__my_query(be, &be->cmd, sql, NULL, NULL)) != DLOCK_OK)
            goto out;
        rc = dlock__my_query(be, &be->cmd, "COMMIT", NULL, NULL);
    }
out:
    if (rc != DLOCK_OK && force && be->cmd != NULL)
        mysql_query(be->cmd, "ROLLBACK");
    pthread_mutex_unlock(&be->mu);
    if (res != NULL)
        mysql_free_result(res);
    return rc;
}

int dlock__my_lease_list(dlock__my_be *be, const char *prefix, dlock_list_cb cb, void *payload)
{
    char key[DLOCK__MY_HEX_MAX], sql[DLOCK__MY_HEX_MAX + 2048];
    size_t lp = strlen(be->prefix);
    int rc;

    if ((rc = dlock__my_key_hex(be, prefix, key)) != DLOCK_OK)
        return rc;
    snprintf(sql, sizeof(sql),
             "SELECT " STATUS_COLS " FROM dlock_locks WHERE LEFT(name, %zu) = %s"
             " AND token <> '' AND expires > UTC_TIMESTAMP(6) ORDER BY name",
             lp + strlen(prefix), key);
    return dlock__my_list_query(be, sql, STATUS_NCOLS, fill_all, cb, payload);
}
