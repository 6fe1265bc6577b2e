/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The MySQL backend's lock family seen from outside (docs/mysql.md, "The
 * lock family"): who holds a name, who leads an election, and an
 * election's observers, who wait on the leader's wake channel or, with no
 * leader, in a SLEEP that a new leader cuts short. The holds themselves
 * are made and ended in mysql_family.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mysql_int.h"

#define NOW "UTC_TIMESTAMP(6)"

/* ---- who holds it ------------------------------------------------------- */

int dlock__my_fam_holders(dlock__my_be *be, const char *name, dlock_list_cb cb, void *payload)
{
    char key[DLOCK__MY_HEX_MAX], sql[DLOCK__MY_HEX_MAX + 512];
    MYSQL_RES *res = NULL;
    MYSQL_ROW row;
    dlock_lock_info all;
    int rc, n;

    /* The lock's state, then its holds: a plain holder is the one. */
    if ((rc = dlock__my_lease_status(be, name, 0, &all)) != DLOCK_OK)
        return rc;
    if (!all.held)
        return DLOCK_OK;
    if ((rc = dlock__my_key_hex(be, name, key)) != DLOCK_OK)
        return rc;
    snprintf(sql, sizeof(sql),
             "SELECT l.token = '*', h.fence,"
             " GREATEST(0, CEIL(TIMESTAMPDIFF(MICROSECOND, " NOW ", h.expires) / 1000)),"
             " h.holder, h.kind FROM dlock_locks l LEFT JOIN dlock_holds h ON h.name = l.name"
             " AND h.waiting = 0 AND h.expires > " NOW " WHERE l.name = %s ORDER BY h.fence, h.seq",
             key);
    if ((rc = dlock__my_cmd(be, sql, &res, NULL)) != DLOCK_OK)
        return rc;
    if (res == NULL || mysql_num_fields(res) != 5) {
        if (res != NULL)
            mysql_free_result(res);
        return dlock_backend_fail(DLOCK_EPROTO, "%s: the holders query returned no rows",
                                  be->where);
    }
    n = (int)mysql_num_rows(res);
    row = mysql_fetch_row(res);
    if (row != NULL && (row[0] == NULL || strcmp(row[0], "1") != 0)) {
        cb(name, &all, payload); /* a plain mutex: its one holder */
        row = NULL;
    }
    for (; row != NULL && row[1] != NULL; row = mysql_fetch_row(res)) {
        unsigned long *lens = mysql_fetch_lengths(res);
        dlock_lock_info info;
        memset(&info, 0, sizeof(info));
        info.held = 1;
        info.holders = n;
        info.fence = strtoull(row[1], NULL, 10);
        info.ttl_ms = row[2] != NULL ? strtoll(row[2], NULL, 10) : 0;
        info.kind = row[4] != NULL ? atoi(row[4]) : -1;
        dlock__my_holder_fill(&info, row[3], lens[3]);
        if (cb(name, &info, payload) != 0)
            break;
    }
    mysql_free_result(res);
    return DLOCK_OK;
}

/* ---- leader ------------------------------------------------------------- */

/* The tag of an election's observers in the server's process list: the
 * stored name's hex digits between "dlckobs:" and ":". */
static void observer_tag(char *out, size_t size, const char *key)
{
    size_t len = strlen(key);

    snprintf(out, size, "dlckobs:%.*s:", len >= 3 ? (int)(len - 3) : 0, key + 2);
}

void dlock__my_observe_sql(char *out, size_t size, const char *key, const char *expr, int64_t s)
{
    char tag[DLOCK__MY_HEX_MAX + 16];

    observer_tag(tag, sizeof(tag), key);
    /* A leader: block on its channel (a leader whose client holds none
     * answers at once, free and got). None: SLEEP, which a new leader's
     * KILL QUERY ends (2 slept out, 3 cut short). */
    snprintf(out, size,
             "SELECT IS_FREE_LOCK(%s), IF(EXISTS(SELECT 1 FROM dlock_holds WHERE name = %s"
             " AND kind = %d AND waiting = 0 AND expires > " NOW "), GET_LOCK(%s, %lld),"
             " SLEEP(%lld) + 2), RELEASE_LOCK(%s), '%s'",
             expr, key, DLOCK_KIND_LEADER, expr, (long long)s, (long long)s, expr, tag);
}

/* A new leader ends its observers' SLEEP: the statements tagged with the
 * election that this account can see (its own sessions; all with the
 * PROCESS privilege), each cut short with KILL QUERY. Best effort: an
 * observer not reached sees the leader at its SLEEP's end (5 s at most). */
void dlock__my_fam_notify_observers(dlock__my_be *be, const char *name)
{
    char key[DLOCK__MY_HEX_MAX], tag[DLOCK__MY_HEX_MAX + 16], sql[DLOCK__MY_HEX_MAX + 256],
        saved[512];
    MYSQL_RES *res = NULL;
    MYSQL_ROW row;

    if (dlock__my_key_hex(be, name, key) != DLOCK_OK)
        return;
    snprintf(saved, sizeof(saved), "%s", dlock_error_message());
    observer_tag(tag, sizeof(tag), key);
    snprintf(sql, sizeof(sql),
             "SELECT ID FROM information_schema.PROCESSLIST WHERE INFO LIKE '%%%s%%'"
             " AND ID <> CONNECTION_ID()",
             tag);
    pthread_mutex_lock(&be->mu);
    if (dlock__my_query(be, &be->cmd, sql, &res, NULL) == DLOCK_OK && res != NULL) {
        while ((row = mysql_fetch_row(res)) != NULL)
            if (row[0] != NULL) {
                snprintf(sql, sizeof(sql), "KILL QUERY %llu", strtoull(row[0], NULL, 10));
                dlock__my_query(be, &be->cmd, sql, NULL, NULL);
            }
    }
    pthread_mutex_unlock(&be->mu);
    if (res != NULL)
        mysql_free_result(res);
    dlock_backend_fail(DLOCK_OK, "%s", saved);
}

int dlock__my_fam_leader_get(dlock__my_be *be, const char *name, dlock_leader_info *out)
{
    char key[DLOCK__MY_HEX_MAX], sql[DLOCK__MY_HEX_MAX + 512];
    MYSQL_RES *res = NULL;
    MYSQL_ROW row;
    int rc;

    memset(out, 0, sizeof(*out));
    if ((rc = dlock__my_key_hex(be, name, key)) != DLOCK_OK)
        return rc;
    snprintf(sql, sizeof(sql),
             "SELECT fence, GREATEST(0, CEIL(TIMESTAMPDIFF(MICROSECOND, " NOW ", expires) / 1000)),"
             " identity FROM dlock_holds WHERE name = %s AND kind = %d AND waiting = 0"
             " AND expires > " NOW " ORDER BY seq LIMIT 1",
             key, DLOCK_KIND_LEADER);
    if ((rc = dlock__my_cmd(be, sql, &res, NULL)) != DLOCK_OK)
        return rc;
    if (res == NULL || mysql_num_fields(res) != 3) {
        if (res != NULL)
            mysql_free_result(res);
        return dlock_backend_fail(DLOCK_EPROTO, "%s: the leader query returned no rows",
                                  be->where);
    }
    if ((row = mysql_fetch_row(res)) != NULL) {
        unsigned long *lens = mysql_fetch_lengths(res);
        out->held = 1;
        out->fence = row[0] != NULL ? strtoull(row[0], NULL, 10) : 0;
        out->ttl_ms = row[1] != NULL ? strtoll(row[1], NULL, 10) : 0;
        if (row[2] != NULL) {
            size_t len = lens[2] > DLOCK_IDENTITY_MAX ? DLOCK_IDENTITY_MAX : lens[2];
            memcpy(out->identity, row[2], len);
            out->identity[len] = '\0';
        }
    }
    mysql_free_result(res);
    return DLOCK_OK;
}
