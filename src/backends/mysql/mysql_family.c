/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The MySQL backend's lock family, lease mode only (docs/mysql.md, "The lock
 * family"): owner ids and reentrancy, the fair lock, the read-write lock,
 * the semaphore and leader election. The plain mutex without an owner id
 * stays the one-CALL row of dlock_locks (mysql_lease.c). Here the holds
 * are made, renewed and ended; who holds a name, who leads and the
 * election's observers are in mysql_family_view.c.
 *
 * Each hold is a row of dlock_holds with its own token, fence and lease;
 * each place in a queue (a fair waiter, a waiting writer's marker) is a row
 * with waiting = 1 and an expiry W = min(max(lease, 1 s), 30 s) that the
 * living waiter refreshes at every try. seq, an AUTO_INCREMENT, is the
 * arrival order.
 *
 * Isolation: every change of a name's holds is one transaction that first
 * locks the name's dlock_locks row (SELECT ... FOR UPDATE, the row made if
 * missing), so two clients' checks of one name run one after the other,
 * each seeing what the other committed (READ COMMITTED reads the latest
 * commit per statement). While a hold lives the row's token is '*' and its
 * expiry that of the longest hold: the plain mutex's procedure, which locks
 * the same row, finds the name taken; the family finds a plain holder's
 * token there and waits for it. Fences come from dlock_fence, as the
 * mutex's do, in the same transaction as the hold.
 *
 * Waking: a holder's client holds the name's wake channel (mysql_lease.c)
 * as for the mutex. Only one client can hold it, so a release by a reader
 * or permit holder whose client does not hold it wakes nobody: a waiter
 * behind shared holders, a fair waiter and a waiting writer look again at
 * least every W/3 (which also refreshes their places).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mysqld_error.h>

#include "mysql_int.h"

/* Room for a statement: the name, token, owner, holder and identity as
 * hex literals, and the words around them. */
#define FAM_SQL_MAX (DLOCK__MY_HEX_MAX + 2 * (64 + DLOCK_OWNER_MAX + DLOCK_HOLDER_MAX + \
                                              DLOCK_IDENTITY_MAX) + 1024)

#define NOW "UTC_TIMESTAMP(6)"

/* A row of dlock_holds, as the acquire reads them. */
typedef struct {
    char token[65];
    int kind, waiting, has_owner;
    char owner[DLOCK_OWNER_MAX + 1];
    unsigned long owner_len;
    uint64_t fence;
    int64_t left_ms;
} fam_row;

/* One transaction's view of a name. */
typedef struct {
    dlock__my_be *be;
    const char *name;
    char key[DLOCK__MY_HEX_MAX];
    int plain;          /* a plain mutex's token holds the row */
    int64_t plain_left; /* ... for this many ms */
    fam_row *rows;
    size_t nrows;
} fam_tx;

int dlock__my_family_request(const dlock_request *req)
{
    return req->kind != DLOCK_KIND_MUTEX || req->owner != NULL;
}

static int64_t lease_us(int64_t ms)
{
    return ms < 1 ? 1000 : ms > (int64_t)86400000 * 3650 ? (int64_t)86400000 * 3650000 : ms * 1000;
}

/* A waiter's place lasts W. */
static int64_t place_ms(int64_t lease_ms)
{
    return lease_ms < 1000 ? 1000 : lease_ms > 30000 ? 30000 : lease_ms;
}

static int exclusive(int kind)
{
    return kind != DLOCK_KIND_READ && kind != DLOCK_KIND_SEMAPHORE;
}

static int run(fam_tx *t, const char *sql, MYSQL_RES **res, uint64_t *affected, int *unknown)
{
    int rc = dlock__my_query_rows(t->be, &t->be->cmd, sql, res, unknown, affected);

    /* Kept for again(): the ROLLBACK after it resets the connection's. */
    t->be->cmd_errno = rc != DLOCK_OK && t->be->cmd != NULL ? mysql_errno(t->be->cmd) : 0;
    return rc;
}

static void rollback(fam_tx *t)
{
    if (t->be->cmd != NULL && mysql_query(t->be->cmd, "ROLLBACK") != 0)
        dlock__my_drop(&t->be->cmd); /* cannot tell what is left open: start afresh */
    t->be->cmd_tx = 0;
}

/* The marker on the name's dlock_locks row: '*' until the last hold's
 * lease, or free when none lives. */
static int marker_recompute(fam_tx *t)
{
    char sql[2 * DLOCK__MY_HEX_MAX + 512];

    snprintf(sql, sizeof(sql),
             "UPDATE dlock_locks SET expires = COALESCE((SELECT MAX(h.expires) FROM dlock_holds h"
             " WHERE h.name = %s AND h.waiting = 0 AND h.expires > " NOW "), " NOW "),"
             " token = IF(expires > " NOW ", '*', '') WHERE name = %s AND token = '*'",
             t->key, t->key);
    return run(t, sql, NULL, NULL, NULL);
}

/*
 * Begin: lock the name's row (made if missing), drop its expired holds and
 * places, and read what is left (with_rows) in arrival order. On failure
 * the transaction is rolled back.
 */
static int tx_begin(fam_tx *t, dlock__my_be *be, const char *name, int with_rows)
{
    char sql[2 * DLOCK__MY_HEX_MAX + 512];
    MYSQL_RES *res = NULL;
    MYSQL_ROW row;
    int rc;

    memset(t, 0, sizeof(*t));
    t->be = be;
    t->name = name;
    if ((rc = dlock__my_key_hex(be, name, t->key)) != DLOCK_OK)
        return rc;
    if ((rc = run(t, "START TRANSACTION", NULL, NULL, NULL)) != DLOCK_OK)
        return rc;
    be->cmd_tx = 1;
    snprintf(sql, sizeof(sql),
             "INSERT INTO dlock_locks (name, token, fence, expires) VALUES (%s, '', 0, " NOW ")"
             " ON DUPLICATE KEY UPDATE name = name",
             t->key);
    if ((rc = run(t, sql, NULL, NULL, NULL)) != DLOCK_OK)
        goto err;
    snprintf(sql, sizeof(sql),
             "SELECT token <> '' AND token <> '*' AND expires > " NOW ","
             " CEIL(TIMESTAMPDIFF(MICROSECOND, " NOW ", expires) / 1000)"
             " FROM dlock_locks WHERE name = %s FOR UPDATE",
             t->key);
    if ((rc = run(t, sql, &res, NULL, NULL)) != DLOCK_OK)
        goto err;
    if (res == NULL || mysql_num_fields(res) != 2 || (row = mysql_fetch_row(res)) == NULL) {
        rc = dlock_backend_fail(DLOCK_EPROTO, "%s: the lock's row was not read", be->where);
        goto err;
    }
    t->plain = row[0] != NULL && strcmp(row[0], "1") == 0;
    t->plain_left = row[1] != NULL ? strtoll(row[1], NULL, 10) : 0;
    mysql_free_result(res);
    res = NULL;
    snprintf(sql, sizeof(sql), "DELETE FROM dlock_holds WHERE name = %s AND expires <= " NOW,
             t->key);
    if ((rc = run(t, sql, NULL, NULL, NULL)) != DLOCK_OK)
        goto err;
    if (!with_rows)
        return DLOCK_OK;
    snprintf(sql, sizeof(sql),
             "SELECT token, kind, waiting, owner, fence,"
             " CEIL(TIMESTAMPDIFF(MICROSECOND, " NOW ", expires) / 1000)"
             " FROM dlock_holds WHERE name = %s ORDER BY seq",
             t->key);
    if ((rc = run(t, sql, &res, NULL, NULL)) != DLOCK_OK)
        goto err;
    if (res == NULL || mysql_num_fields(res) != 6) {
        rc = dlock_backend_fail(DLOCK_EPROTO, "%s: the holds were not read", be->where);
        goto err;
    }
    if (mysql_num_rows(res) > 0 &&
        (t->rows = calloc((size_t)mysql_num_rows(res), sizeof(*t->rows))) == NULL) {
        rc = dlock_backend_fail(DLOCK_ENOMEM, "%s: out of memory", be->where);
        goto err;
    }
    while ((row = mysql_fetch_row(res)) != NULL) {
        unsigned long *lens = mysql_fetch_lengths(res);
        fam_row *r = &t->rows[t->nrows];
        if (row[0] == NULL || lens[0] >= sizeof(r->token) || row[1] == NULL || row[2] == NULL ||
            (row[3] != NULL && lens[3] > DLOCK_OWNER_MAX))
            continue; /* not a row of ours */
        memcpy(r->token, row[0], lens[0]);
        r->kind = atoi(row[1]);
        r->waiting = atoi(row[2]);
        r->has_owner = row[3] != NULL;
        if (r->has_owner)
            memcpy(r->owner, row[3], lens[3]);
        r->owner_len = row[3] != NULL ? lens[3] : 0;
        r->fence = row[4] != NULL ? strtoull(row[4], NULL, 10) : 0;
        r->left_ms = row[5] != NULL ? strtoll(row[5], NULL, 10) : 0;
        t->nrows++;
    }
    mysql_free_result(res);
    return DLOCK_OK;
err:
    if (res != NULL)
        mysql_free_result(res);
    rollback(t);
    free(t->rows);
    t->rows = NULL;
    return rc;
}

static int tx_commit(fam_tx *t, int *unknown)
{
    int rc = run(t, "COMMIT", NULL, NULL, unknown);

    t->be->cmd_tx = 0;
    if (rc != DLOCK_OK)
        rollback(t);
    free(t->rows);
    t->rows = NULL;
    return rc;
}

static int tx_fail(fam_tx *t, int rc)
{
    rollback(t);
    free(t->rows);
    t->rows = NULL;
    return rc;
}

/* A deadlock or lock wait timeout rolled the transaction back: try again. */
static int again(dlock__my_be *be, int rc, int unknown)
{
    return rc == DLOCK_ECONN && !unknown &&
           (be->cmd_errno == ER_LOCK_DEADLOCK || be->cmd_errno == ER_LOCK_WAIT_TIMEOUT);
}

static int same_owner(const fam_row *r, const char *owner)
{
    return owner != NULL && r->has_owner && r->owner_len == strlen(owner) &&
           memcmp(r->owner, owner, r->owner_len) == 0;
}

static void hex_or_null(char *out, const char *s, size_t max)
{
    if (s != NULL && strlen(s) <= max)
        dlock__my_hex(out, s, strlen(s));
    else
        strcpy(out, "NULL");
}

/* ---- acquire ------------------------------------------------------------ */

/* Take or refresh a place in the queue (a fair waiter, a writer's marker). */
static int queue_place(fam_tx *t, const dlock_request *req, const char *tok)
{
    char sql[2 * DLOCK__MY_HEX_MAX + 512];

    snprintf(sql, sizeof(sql),
             "INSERT INTO dlock_holds (name, token, kind, waiting, fence, expires)"
             " VALUES (%s, %s, %d, 1, 0, " NOW " + INTERVAL %lld MICROSECOND)"
             " ON DUPLICATE KEY UPDATE expires = VALUES(expires)",
             t->key, tok, req->kind, (long long)place_ms(req->lease_ms) * 1000);
    return run(t, sql, NULL, NULL, NULL);
}

/* Take the lock for req with fence (0: issue the next), in t. */
static int take(fam_tx *t, const dlock_request *req, const char *tok, uint64_t fence,
                uint64_t *out)
{
    char *sql, owner[2 * DLOCK_OWNER_MAX + 8], holder[2 * DLOCK_HOLDER_MAX + 8];
    char identity[2 * DLOCK_IDENTITY_MAX + 8];
    long long us = (long long)lease_us(req->lease_ms);
    int rc;

    if (fence == 0) {
        if ((rc = run(t, "REPLACE INTO dlock_fence (stub) VALUES ('f')", NULL, NULL, NULL)) !=
            DLOCK_OK)
            return rc;
        fence = (uint64_t)mysql_insert_id(t->be->cmd);
        if (fence == 0)
            return dlock_backend_fail(DLOCK_EPROTO, "%s: no fence was issued", t->be->where);
    }
    if ((sql = malloc(FAM_SQL_MAX)) == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "%s: out of memory", t->be->where);
    hex_or_null(owner, req->owner, DLOCK_OWNER_MAX);
    hex_or_null(holder, req->holder, DLOCK_HOLDER_MAX);
    hex_or_null(identity, req->kind == DLOCK_KIND_LEADER ? req->identity : NULL,
                DLOCK_IDENTITY_MAX);
    snprintf(sql, FAM_SQL_MAX,
             "INSERT INTO dlock_holds (name, token, kind, waiting, owner, fence, expires, holder,"
             " identity) VALUES (%s, %s, %d, 0, %s, %llu, " NOW " + INTERVAL %lld MICROSECOND,"
             " %s, %s) ON DUPLICATE KEY UPDATE kind = VALUES(kind), waiting = 0,"
             " owner = VALUES(owner), fence = VALUES(fence), expires = VALUES(expires),"
             " holder = VALUES(holder), identity = VALUES(identity)",
             t->key, tok, req->kind, owner, (unsigned long long)fence, us, holder, identity);
    rc = run(t, sql, NULL, NULL, NULL);
    if (rc == DLOCK_OK) {
        /* expires first: later assignments see the new token. */
        snprintf(sql, FAM_SQL_MAX,
                 "UPDATE dlock_locks SET expires = GREATEST(IF(token = '*', expires, " NOW "),"
                 " " NOW " + INTERVAL %lld MICROSECOND), token = '*',"
                 " fence = GREATEST(fence, %llu) WHERE name = %s",
                 us, (unsigned long long)fence, t->key);
        rc = run(t, sql, NULL, NULL, NULL);
    }
    free(sql);
    *out = fence;
    return rc;
}

/* Cap a waiter's sleep at W/3 where no wake may come. */
static int64_t capped(int64_t retry, const dlock_request *req)
{
    int64_t cap = place_ms(req->lease_ms) / 3;

    return retry < 0 || retry > cap ? cap : retry;
}

/*
 * One try in one transaction. *verdict: DLOCK_OK (taken, *fence),
 * DLOCK_EBUSY (out->retry_ms), DLOCK_EMISUSE, DLOCK_EINVAL.
 */
static int try_once(dlock__my_be *be, const dlock_request *req, int waiting, int *verdict,
                    uint64_t *fence, int64_t *retry, int *unknown, int *grabbed)
{
    char tok[80], sql[2 * DLOCK__MY_HEX_MAX + 512], shown[80];
    const fam_row *own = NULL, *mine_excl = NULL, *mine_read = NULL, *head = NULL;
    int64_t excl_left = -1, shared_left = -1, shared_min = -1, marker_left = -1;
    int nexcl = 0, nsem = 0, nshared = 0, writer_waits = 0;
    fam_tx t;
    int rc;

    snprintf(shown, sizeof(shown), "%.60s", req->name);
    dlock__my_hex(tok, req->token, strlen(req->token));
    if ((rc = tx_begin(&t, be, req->name, 1)) != DLOCK_OK)
        return rc;
    for (size_t i = 0; i < t.nrows; i++) {
        const fam_row *r = &t.rows[i];
        if (r->waiting && r->kind == DLOCK_KIND_FAIR && head == NULL)
            head = r; /* the first in line, maybe this very waiter */
        if (strcmp(r->token, req->token) == 0) {
            own = r;
            continue;
        }
        if (r->waiting) {
            if (r->kind == DLOCK_KIND_WRITE) {
                writer_waits = 1;
                if (r->left_ms > marker_left)
                    marker_left = r->left_ms;
            }
            continue;
        }
        if (exclusive(r->kind)) {
            nexcl++;
            if (r->left_ms > excl_left)
                excl_left = r->left_ms;
            if (same_owner(r, req->owner))
                mine_excl = r;
        } else {
            nshared++;
            nsem += r->kind == DLOCK_KIND_SEMAPHORE;
            if (r->left_ms > shared_left)
                shared_left = r->left_ms;
            if (r->kind == DLOCK_KIND_SEMAPHORE && (shared_min < 0 || r->left_ms < shared_min))
                shared_min = r->left_ms;
            if (r->kind == DLOCK_KIND_READ && same_owner(r, req->owner))
                mine_read = r;
        }
    }
    *verdict = DLOCK_EBUSY;
    *retry = -1;
    if (own != NULL && !own->waiting) {
        /* A retry after a lost reply: the same hold, its lease set anew. */
        snprintf(sql, sizeof(sql),
                 "UPDATE dlock_holds SET expires = " NOW " + INTERVAL %lld MICROSECOND"
                 " WHERE name = %s AND token = %s",
                 (long long)lease_us(req->lease_ms), t.key, tok);
        if ((rc = run(&t, sql, NULL, NULL, NULL)) != DLOCK_OK)
            return tx_fail(&t, rc);
        snprintf(sql, sizeof(sql),
                 "UPDATE dlock_locks SET expires = GREATEST(expires, " NOW
                 " + INTERVAL %lld MICROSECOND) WHERE name = %s AND token = '*'",
                 (long long)lease_us(req->lease_ms), t.key);
        if ((rc = run(&t, sql, NULL, NULL, NULL)) != DLOCK_OK)
            return tx_fail(&t, rc);
        *verdict = DLOCK_OK;
        *fence = own->fence;
        return tx_commit(&t, unknown);
    }
    if (t.plain) {
        *retry = t.plain_left;
    } else if (req->kind == DLOCK_KIND_READ) {
        if (mine_excl != NULL && mine_excl->kind == DLOCK_KIND_WRITE) {
            *verdict = dlock_backend_fail(DLOCK_EMISUSE,
                                          "%s: lock '%s': this owner holds the write lock; a "
                                          "read lock by the same owner would wait for itself "
                                          "(dlock_lock_downgrade turns it into a read lock)",
                                          be->where, shown);
        } else if (nexcl > 0) {
            *retry = excl_left;
        } else if (writer_waits && mine_read == NULL) {
            *retry = capped(marker_left, req); /* writer preference */
        } else {
            *verdict = DLOCK_OK;
        }
    } else if (req->kind == DLOCK_KIND_SEMAPHORE) {
        int64_t v;
        int found;
        MYSQL_RES *res;
        snprintf(sql, sizeof(sql), "SELECT permits FROM dlock_permits WHERE name = %s", t.key);
        if ((rc = run(&t, sql, &res, NULL, NULL)) != DLOCK_OK ||
            (rc = dlock__my_row_ints(be, res, &v, 1, 0, &found, "the permits")) != DLOCK_OK)
            return tx_fail(&t, rc);
        if (!found) {
            if (req->permits < 1)
                return tx_fail(&t, dlock_backend_fail(DLOCK_EINVAL,
                                                      "%s: semaphore '%s' has no number of "
                                                      "permits yet: set permits",
                                                      be->where, shown));
            v = req->permits;
            snprintf(sql, sizeof(sql), "INSERT INTO dlock_permits (name, permits) VALUES (%s, %d)",
                     t.key, req->permits);
            if ((rc = run(&t, sql, NULL, NULL, NULL)) != DLOCK_OK)
                return tx_fail(&t, rc);
        }
        if (nexcl > 0)
            *retry = excl_left;
        else if (nsem >= v)
            *retry = capped(shared_min, req);
        else
            *verdict = DLOCK_OK;
    } else {
        /* MUTEX (with an owner id), FAIR, WRITE, LEADER: one holder. */
        if (mine_excl != NULL && !req->reentrant) {
            *verdict = dlock_backend_fail(DLOCK_EMISUSE,
                                          "%s: lock '%s' is held by this owner already (not "
                                          "reentrant)",
                                          be->where, shown);
        } else if (mine_excl != NULL) {
            *verdict = DLOCK_OK; /* a re-entry: the same tenure, the same fence */
        } else if (req->kind == DLOCK_KIND_WRITE && mine_read != NULL) {
            *verdict = dlock_backend_fail(DLOCK_EMISUSE,
                                          "%s: lock '%s': this owner holds a read lock; an "
                                          "upgrade to write is refused (release the read lock "
                                          "first)",
                                          be->where, shown);
        } else if (nexcl > 0 || nshared > 0) {
            *retry = nshared > 0 ? capped(shared_left, req) : excl_left;
            if (req->kind == DLOCK_KIND_FAIR)
                *retry = capped(*retry, req);
        } else if (req->kind == DLOCK_KIND_FAIR && head != NULL && head != own) {
            /* Not the head of the queue: no barging, also for a try-once. */
            *retry = capped(head->left_ms, req);
        } else {
            *verdict = DLOCK_OK;
        }
    }
    if (*verdict == DLOCK_OK) {
        uint64_t reentry = exclusive(req->kind) && mine_excl != NULL ? mine_excl->fence : 0;
        if ((rc = take(&t, req, tok, reentry, fence)) != DLOCK_OK)
            return tx_fail(&t, rc);
        /* The channel before the commit, for one holder: a waiter that
         * sees the hold then finds its channel held, and its release wakes
         * it. Taken after, a quick holder could come and go in between
         * while the waiter, finding the channel free twice, pauses
         * (mysql_wait.c). (Still under the row lock, so no other try sees
         * it yet.) */
        if (exclusive(req->kind))
            *grabbed = dlock__my_wake_grab(be, req->name);
        return tx_commit(&t, unknown);
    }
    if (*verdict == DLOCK_EBUSY && waiting &&
        (req->kind == DLOCK_KIND_FAIR || req->kind == DLOCK_KIND_WRITE)) {
        if ((rc = queue_place(&t, req, tok)) != DLOCK_OK)
            return tx_fail(&t, rc);
        *retry = capped(*retry, req);
    }
    return tx_commit(&t, unknown);
}

int dlock__my_fam_acquire(dlock__my_be *be, const dlock_request *req, void *watch,
                          dlock_acquire_result *out)
{
    uint64_t fence = 0;
    int64_t retry = -1;
    int verdict = DLOCK_EBUSY, rc, unknown = 0, grabbed = 0;

    if (strlen(req->token) > 32)
        return dlock_backend_fail(DLOCK_EINVAL, "%s: token longer than 32 bytes", be->where);
    if (watch != NULL)
        dlock__my_watch_note_family(watch, req->token,
                                    req->kind == DLOCK_KIND_FAIR || req->kind == DLOCK_KIND_WRITE);
    pthread_mutex_lock(&be->mu);
    for (int tries = 0;; tries++) {
        if (grabbed == 1)
            dlock__my_wake_give(be, req->name); /* a try rolled back */
        grabbed = 0;
        rc = try_once(be, req, watch != NULL, &verdict, &fence, &retry, &unknown, &grabbed);
        if (rc == DLOCK_OK || tries == 3 || !again(be, rc, unknown))
            break;
    }
    pthread_mutex_unlock(&be->mu);
    if (grabbed == 1 && rc != DLOCK_OK && !unknown)
        dlock__my_wake_give(be, req->name);
    if (watch != NULL)
        dlock__my_watch_note_try(watch, req->token, unknown);
    if (rc != DLOCK_OK)
        return rc;
    if (verdict == DLOCK_OK) {
        out->fence = fence;
        if (grabbed == 0)
            dlock__my_wake_take(be, req->name, req->lease_ms);
        if (req->kind == DLOCK_KIND_LEADER)
            dlock__my_fam_notify_observers(be, req->name);
        return DLOCK_OK;
    }
    if (verdict == DLOCK_EBUSY) {
        out->retry_ms = retry < 0 ? 0 : retry;
        return DLOCK_EBUSY;
    }
    return verdict;
}

/* ---- release, extend, downgrade, leave, permits ------------------------ */

/*
 * In one transaction: run change (a statement on the token's rows, "%s"
 * twice: the key, then the token) and refresh the marker; DLOCK_ELOST when
 * it matched no row (need_row).
 */
static int owned_change(dlock__my_be *be, const char *name, const char *token, const char *change,
                        int need_row)
{
    char tok[80], sql[3 * DLOCK__MY_HEX_MAX + 512];
    uint64_t affected = 0;
    fam_tx t;
    int rc = DLOCK_OK, unknown = 0;

    if (strlen(token) > 32)
        return dlock_backend_fail(DLOCK_ELOST, "%s: the lock is no longer this token's",
                                  be->where);
    dlock__my_hex(tok, token, strlen(token));
    pthread_mutex_lock(&be->mu);
    for (int tries = 0; tries < 4; tries++) {
        if ((rc = tx_begin(&t, be, name, 0)) != DLOCK_OK) {
            if (again(be, rc, 0))
                continue;
            break;
        }
        snprintf(sql, sizeof(sql), change, t.key, tok);
        if ((rc = run(&t, sql, NULL, &affected, NULL)) != DLOCK_OK ||
            (rc = marker_recompute(&t)) != DLOCK_OK) {
            tx_fail(&t, rc);
            if (again(be, rc, 0))
                continue;
            break;
        }
        rc = tx_commit(&t, &unknown);
        if (rc == DLOCK_OK || !again(be, rc, unknown))
            break;
    }
    pthread_mutex_unlock(&be->mu);
    if (rc == DLOCK_OK && need_row && affected == 0)
        rc = dlock_backend_fail(DLOCK_ELOST, "%s: the lease is no longer this token's (it ran "
                                "out, or was broken)", be->where);
    return rc;
}

int dlock__my_fam_release(dlock__my_be *be, const dlock_request *req)
{
    int rc = owned_change(be, req->name, req->token,
                          "DELETE FROM dlock_holds WHERE name = %s AND token = %s AND waiting = 0",
                          1);

    if (rc == DLOCK_OK || rc == DLOCK_ELOST)
        dlock__my_wake_give(be, req->name);
    return rc;
}

void dlock__my_fam_leave(dlock__my_be *be, const char *name, const char *token, int unknown)
{
    char saved[512];

    snprintf(saved, sizeof(saved), "%s", dlock_error_message());
    /* A place in the queue, and a hold a try whose reply was lost took. */
    owned_change(be, name, token,
                 unknown ? "DELETE FROM dlock_holds WHERE name = %s AND token = %s"
                         : "DELETE FROM dlock_holds WHERE name = %s AND token = %s"
                           " AND waiting = 1",
                 0);
    if (unknown)
        dlock__my_wake_give(be, name);
    dlock_backend_fail(DLOCK_OK, "%s", saved);
}

int dlock__my_fam_extend(dlock__my_be *be, const dlock_request *req)
{
    char change[256];

    snprintf(change, sizeof(change),
             "UPDATE dlock_holds SET expires = " NOW " + INTERVAL %lld MICROSECOND"
             " WHERE name = %%s AND token = %%s AND waiting = 0",
             (long long)lease_us(req->lease_ms));
    return owned_change(be, req->name, req->token, change, 1);
}

int dlock__my_fam_downgrade(dlock__my_be *be, const dlock_request *req)
{
    char change[256];
    int rc;

    snprintf(change, sizeof(change),
             "UPDATE dlock_holds SET kind = %d, expires = " NOW " + INTERVAL %lld MICROSECOND"
             " WHERE name = %%s AND token = %%s AND waiting = 0 AND kind = %d",
             DLOCK_KIND_READ, (long long)lease_us(req->lease_ms), DLOCK_KIND_WRITE);
    rc = owned_change(be, req->name, req->token, change, 1);
    if (rc == DLOCK_OK)
        dlock__my_wake_give(be, req->name); /* the waiting readers may come in */
    return rc;
}

int dlock__my_fam_set_permits(dlock__my_be *be, const char *name, int permits)
{
    char key[DLOCK__MY_HEX_MAX], sql[DLOCK__MY_HEX_MAX + 256];
    int rc;

    if ((rc = dlock__my_key_hex(be, name, key)) != DLOCK_OK)
        return rc;
    snprintf(sql, sizeof(sql),
             "INSERT INTO dlock_permits (name, permits) VALUES (%s, %d)"
             " ON DUPLICATE KEY UPDATE permits = VALUES(permits)",
             key, permits);
    /* Waiters look again within W/3 (no channel to wake them by). */
    return dlock__my_cmd(be, sql, NULL, NULL);
}

/* ---- renew -------------------------------------------------------------- */

/*
 * The watchdog's batch of family holds, on wd in one transaction that locks
 * the names' rows first (in key order, as one statement: no deadlock with
 * an acquire, which locks one name's row and then its holds), renews each
 * hold that is still its token's, finds which, and moves each marker to
 * its longest hold.
 */
int dlock__my_fam_renew(dlock__my_be *be, dlock_renewal *items, size_t n)
{
    size_t per = 3 * DLOCK__MY_HEX_MAX + 256, cap = 512 + n * per;
    char *sql = NULL, *where = NULL, *names = NULL, *cases = NULL, tok[80];
    char (*keys)[DLOCK__MY_HEX_MAX] = NULL;
    size_t wl = 0, nl = 0, cl = 0;
    MYSQL_RES *res = NULL;
    int rc = DLOCK_OK;

    if (n == 0)
        return DLOCK_OK;
    sql = malloc(3 * cap);
    where = malloc(cap);
    names = malloc(cap);
    cases = malloc(cap);
    keys = malloc(n * sizeof(*keys));
    if (sql == NULL || where == NULL || names == NULL || cases == NULL || keys == NULL) {
        rc = dlock_backend_fail(DLOCK_ENOMEM, "%s: out of memory", be->where);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        const dlock_request *r = items[i].req;
        items[i].result = DLOCK_ELOST;
        if ((rc = dlock__my_key_hex(be, r->name, keys[i])) != DLOCK_OK)
            goto done;
        dlock__my_hex(tok, r->token, strlen(r->token) > 32 ? 32 : strlen(r->token));
        wl += (size_t)snprintf(where + wl, cap - wl, "%s(name = %s AND token = %s)",
                               i ? " OR " : "", keys[i], tok);
        nl += (size_t)snprintf(names + nl, cap - nl, "%s%s", i ? ", " : "", keys[i]);
        cl += (size_t)snprintf(cases + cl, cap - cl, " WHEN name = %s AND token = %s THEN %lld",
                               keys[i], tok, (long long)lease_us(r->lease_ms));
    }
    if ((rc = dlock__my_query(be, &be->wd, "START TRANSACTION", NULL, NULL)) != DLOCK_OK)
        goto done;
    be->wd_tx = 1;
    snprintf(sql, 3 * cap, "SELECT name FROM dlock_locks WHERE name IN (%s) FOR UPDATE", names);
    if ((rc = dlock__my_query(be, &be->wd, sql, NULL, NULL)) != DLOCK_OK)
        goto fail;
    snprintf(sql, 3 * cap,
             "UPDATE dlock_holds SET expires = " NOW " + INTERVAL CASE%s ELSE 0 END MICROSECOND"
             " WHERE (%s) AND waiting = 0 AND expires > " NOW,
             cases, where);
    if ((rc = dlock__my_query(be, &be->wd, sql, NULL, NULL)) != DLOCK_OK)
        goto fail;
    snprintf(sql, 3 * cap,
             "SELECT name, token FROM dlock_holds WHERE (%s) AND waiting = 0 AND expires > " NOW,
             where);
    if ((rc = dlock__my_query(be, &be->wd, sql, &res, NULL)) != DLOCK_OK)
        goto fail;
    if (res == NULL || mysql_num_fields(res) != 2) {
        rc = dlock_backend_fail(DLOCK_EPROTO, "%s: the renewal check returned no rows",
                                be->where);
        goto fail;
    }
    snprintf(sql, 3 * cap,
             "UPDATE dlock_locks l SET l.expires = GREATEST(l.expires, COALESCE((SELECT"
             " MAX(h.expires) FROM dlock_holds h WHERE h.name = l.name AND h.waiting = 0), " NOW
             ")) WHERE l.name IN (%s) AND l.token = '*'",
             names);
    if ((rc = dlock__my_query(be, &be->wd, sql, NULL, NULL)) != DLOCK_OK)
        goto fail;
    rc = dlock__my_query(be, &be->wd, "COMMIT", NULL, NULL);
    be->wd_tx = 0;
    if (rc != DLOCK_OK)
        goto fail;
    for (MYSQL_ROW row; (row = mysql_fetch_row(res)) != NULL;) {
        unsigned long *lens = mysql_fetch_lengths(res);
        for (size_t i = 0; i < n; i++) {
            const dlock_request *r = items[i].req;
            size_t lp = strlen(be->prefix), ln = strlen(r->name), lt = strlen(r->token);
            if (lens[0] == lp + ln && memcmp(row[0], be->prefix, lp) == 0 &&
                memcmp(row[0] + lp, r->name, ln) == 0 && lens[1] == lt &&
                memcmp(row[1], r->token, lt) == 0)
                items[i].result = DLOCK_OK;
        }
    }
    goto done;
fail:
    if (be->wd != NULL && mysql_query(be->wd, "ROLLBACK") != 0)
        dlock__my_drop(&be->wd);
    be->wd_tx = 0;
done:
    if (res != NULL)
        mysql_free_result(res);
    free(sql);
    free(where);
    free(names);
    free(cases);
    free(keys);
    return rc;
}
