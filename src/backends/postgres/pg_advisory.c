/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Advisory mode (?mode=advisory): a session-level pg_try_advisory_lock on a
 * 64-bit hash of key_prefix + name (FNV-1a; two names with one hash are one
 * lock: docs/postgres.md), the fence from the same sequence in the same
 * statement. The lock lives as long as its session, so every held lock has
 * a connection of its own (dlock__pg_session), closed by release. The lease is
 * the session's idle_session_timeout, set to lease_ms in the acquiring
 * round trip: a holder that stops talking (SIGSTOP, a dead network) has its
 * session ended by the server after its lease, by the server's clock, and
 * the lock with it. The watchdog's renew is the keepalive: a statement on
 * the session that asks pg_locks whether the session still holds the lock.
 * With key_secret, the key is an HMAC instead (dlock__pg_advisory_key).
 *
 * Once a session's connection broke or timed out it is closed, and its lock
 * is gone (or goes when the server sees the close): every later call on the
 * handle answers DLOCK_ELOST.
 *
 * A session that holds nothing (its lock given back, or a try that found
 * the lock taken) is kept, up to DLOCK__PG_IDLE_MAX of them, for the next
 * acquisition: a new session per lock cost a connection (and its
 * authentication) per cycle, 45 times the cycle's two statements. Its
 * idle_session_timeout stays the last lease: an idle session the server
 * ended meanwhile has said so on its socket, and is closed, not used.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/params.h>

#include <poll.h>

#include "pg_int.h"
#include "pg_sql.h"

struct dlock__pg_session {
    dlock__pg_session *next;
    pthread_mutex_t mu; /* guards c: the watchdog and the caller share it */
    PGconn *c;          /* NULL once broken: the lock is gone */
    char *token;
    uint64_t key, fence;
    int64_t lease_ms;   /* the idle_session_timeout the session has */
};

/* FNV-1a 64 of key_prefix + name; with key_secret, the first 8 bytes of
 * HMAC-SHA256(key_secret, key_prefix + name), which only holders of the
 * secret can compute. */
int dlock__pg_advisory_key(const dlock__pg_be *be, const char *name, uint64_t *key)
{
    uint64_t h = 1469598103934665603ULL;
    unsigned char mac[EVP_MAX_MD_SIZE];
    size_t len = 0;
    EVP_MAC_CTX *ctx;
    OSSL_PARAM params[2];
    int ok;

    if (be->key_secret == NULL) {
        for (size_t i = 0; i < be->prefix_len; i++)
            h = (h ^ (unsigned char)be->prefix[i]) * 1099511628211ULL;
        for (const char *p = name; *p; p++)
            h = (h ^ (unsigned char)*p) * 1099511628211ULL;
        *key = h;
        return DLOCK_OK;
    }
    params[0] = OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0);
    params[1] = OSSL_PARAM_construct_end();
    ctx = EVP_MAC_CTX_new(be->hmac);
    ok = ctx != NULL &&
         EVP_MAC_init(ctx, (const unsigned char *)be->key_secret, be->key_secret_len, params) &&
         EVP_MAC_update(ctx, (const unsigned char *)be->prefix, be->prefix_len) &&
         EVP_MAC_update(ctx, (const unsigned char *)name, strlen(name)) &&
         EVP_MAC_final(ctx, mac, &len, sizeof(mac)) && len >= 8;
    EVP_MAC_CTX_free(ctx);
    if (!ok)
        return dlock_backend_fail(DLOCK_ENOMEM, "%s: HMAC-SHA256 of key_secret failed",
                                  be->where);
    h = 0;
    for (int i = 0; i < 8; i++)
        h = h << 8 | mac[i];
    *key = h;
    return DLOCK_OK;
}

/*
 * The lease is the session's idle_session_timeout, an int of ms on the
 * server: 2^31-1 ms (24.8 days) at most. A longer lease cannot be given to
 * the server, and a shorter one in its place would end the session (and
 * the lock) while the handle still believed it: refused, before any I/O.
 */
static int lease_fits(const dlock__pg_be *be, int64_t lease_ms)
{
    if (lease_ms <= INT_MAX)
        return DLOCK_OK;
    return dlock_backend_fail(DLOCK_EINVAL, "%s: lease_ms is %lld, over %d, the longest "
                              "idle_session_timeout PostgreSQL takes (advisory mode; "
                              "mode=lease takes leases up to 30 days)",
                              be->where, (long long)lease_ms, INT_MAX);
}

/* A kept session for an acquisition, or NULL (then a new one). One with
 * something to read is one the server ended (idle_session_timeout, a
 * shutdown): closed. */
static PGconn *idle_take(dlock__pg_be *be)
{
    PGconn *c = NULL;

    pthread_mutex_lock(&be->smu);
    while (c == NULL && be->nidle > 0) {
        struct pollfd p = {0, POLLIN, 0};
        c = be->idle[--be->nidle];
        p.fd = PQsocket(c);
        if (PQstatus(c) != CONNECTION_OK || p.fd < 0 || poll(&p, 1, 0) != 0) {
            PQfinish(c);
            c = NULL;
        }
    }
    pthread_mutex_unlock(&be->smu);
    return c;
}

/* Keep *pc, a session that holds no lock, for the next acquisition (or
 * close it when enough are kept); *pc is NULL after. */
static void idle_give(dlock__pg_be *be, PGconn **pc)
{
    if (*pc != NULL && PQstatus(*pc) == CONNECTION_OK &&
        PQtransactionStatus(*pc) == PQTRANS_IDLE) {
        pthread_mutex_lock(&be->smu);
        if (be->nidle < DLOCK__PG_IDLE_MAX) {
            be->idle[be->nidle++] = *pc;
            *pc = NULL;
        }
        pthread_mutex_unlock(&be->smu);
    }
    PQfinish(*pc);
    *pc = NULL;
}

static void session_free(dlock__pg_session *s)
{
    if (s == NULL)
        return;
    PQfinish(s->c);
    pthread_mutex_destroy(&s->mu);
    free(s->token);
    free(s);
}

/* The session holding req's lock, taken out of the list when take. */
static dlock__pg_session *find(dlock__pg_be *be, const char *token, int take)
{
    dlock__pg_session **pp, *s = NULL;

    pthread_mutex_lock(&be->smu);
    for (pp = &be->sessions; *pp != NULL; pp = &(*pp)->next)
        if (strcmp((*pp)->token, token) == 0) {
            s = *pp;
            if (take)
                *pp = s->next;
            break;
        }
    pthread_mutex_unlock(&be->smu);
    return s;
}

static int gone(dlock__pg_be *be, const dlock_request *req)
{
    return dlock_backend_fail(DLOCK_ELOST, "%s: lock '%s': its session ended (advisory mode)",
                              be->where, req->name);
}

int dlock__pg_adv_acquire(dlock__pg_be *be, const dlock_request *req, dlock_acquire_result *out)
{
    char sql[512], key[24];
    const char *p[1] = {key};
    dlock__pg_session *s;
    PGresult *r;
    int rc, reused;

    if (req->owner != NULL)
        return dlock_backend_fail(DLOCK_ENOTSUP,
                                  "%s: owner ids and reentrancy are not offered in advisory "
                                  "mode (use mode=lease)",
                                  be->where);
    if ((rc = lease_fits(be, req->lease_ms)) != DLOCK_OK)
        return rc;
    if ((s = find(be, req->token, 0)) != NULL) {
        /* The same token again: the fence already issued. */
        out->fence = s->fence;
        return DLOCK_OK;
    }
    if ((s = calloc(1, sizeof(*s))) == NULL || (s->token = strdup(req->token)) == NULL) {
        free(s);
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    }
    pthread_mutex_init(&s->mu, NULL);
    if ((rc = dlock__pg_advisory_key(be, req->name, &s->key)) != DLOCK_OK) {
        session_free(s);
        return rc;
    }
    s->lease_ms = req->lease_ms;
    /* One round trip: the lock, the fence drawn and the session's lease
     * set only when the lock was taken (pg_sql.h). */
    snprintf(key, sizeof(key), "%lld", (long long)s->key);
    snprintf(sql, sizeof(sql), dlock__pg_adv_acquire_tmpl, (long long)req->lease_ms, be->seq);
    s->c = idle_take(be);
    reused = s->c != NULL;
    rc = dlock__pg_exec_prepared(be, &s->c, sql, 1, p, &r);
    /* A kept session that broke took no lock with it: a new one, once. */
    if (rc == DLOCK_ECONN && reused)
        rc = dlock__pg_exec_prepared(be, &s->c, sql, 1, p, &r);
    if (rc != DLOCK_OK) {
        session_free(s);
        return rc;
    }
    if (PQntuples(r) != 1) {
        PQclear(r);
        session_free(s);
        return dlock_backend_fail(DLOCK_EPROTO, "%s: acquire: unexpected reply", be->where);
    }
    if (PQgetisnull(r, 0, 0)) {
        PQclear(r);
        idle_give(be, &s->c); /* the try took nothing */
        session_free(s);
        out->retry_ms = -1; /* a session has no expiry we can read */
        return dlock_backend_fail(DLOCK_EBUSY, "%s: lock '%s' is held by another owner",
                                  be->where, req->name);
    }
    s->fence = (uint64_t)dlock__pg_num(r, 0, 0);
    PQclear(r);
    pthread_mutex_lock(&be->smu);
    s->next = be->sessions;
    be->sessions = s;
    pthread_mutex_unlock(&be->smu);
    out->fence = s->fence;
    return DLOCK_OK;
}

/* Ask the session whether it still holds its lock, after setting its
 * lease to lease_ms (when > 0 and changed). s->mu held. */
static int keepalive(dlock__pg_be *be, dlock__pg_session *s, int64_t lease_ms)
{
    char sql[320], set[64] = "";
    PGresult *r;
    int rc, held;

    if (s->c == NULL)
        return DLOCK_ELOST;
    if (lease_ms > 0 && lease_ms != s->lease_ms)
        snprintf(set, sizeof(set), "SET idle_session_timeout = %lld;", (long long)lease_ms);
    snprintf(sql, sizeof(sql),
             "%sSELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
             " AND pid = pg_backend_pid() AND classid = %u AND objid = %u AND objsubid = 1",
             set, (unsigned)(s->key >> 32), (unsigned)(s->key & 0xffffffffu));
    rc = dlock__pg_exec(be, &s->c, sql, 0, NULL, &r);
    if (rc != DLOCK_OK) {
        /* Closed by dlock__pg_exec or refused: either way the session is done. */
        PQfinish(s->c);
        s->c = NULL;
        return DLOCK_ELOST;
    }
    held = PQntuples(r) == 1 && dlock__pg_num(r, 0, 0) > 0;
    PQclear(r);
    if (held && lease_ms > 0)
        s->lease_ms = lease_ms;
    return held ? DLOCK_OK : DLOCK_ELOST;
}

static int on_session(dlock__pg_be *be, const dlock_request *req, int64_t lease_ms)
{
    dlock__pg_session *s = find(be, req->token, 0);
    int rc;

    if (s == NULL)
        return gone(be, req);
    pthread_mutex_lock(&s->mu);
    rc = keepalive(be, s, lease_ms);
    pthread_mutex_unlock(&s->mu);
    return rc == DLOCK_OK ? rc : gone(be, req);
}

int dlock__pg_adv_extend(dlock__pg_be *be, const dlock_request *req)
{
    int rc = lease_fits(be, req->lease_ms);

    return rc != DLOCK_OK ? rc : on_session(be, req, req->lease_ms);
}

int dlock__pg_adv_check(dlock__pg_be *be, const dlock_request *req)
{
    return on_session(be, req, 0);
}

int dlock__pg_adv_renew(dlock__pg_be *be, dlock_renewal *items, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        dlock__pg_session *s = find(be, items[i].req->token, 0);
        if (s == NULL) {
            items[i].result = DLOCK_ELOST;
            continue;
        }
        pthread_mutex_lock(&s->mu);
        items[i].result = keepalive(be, s, items[i].req->lease_ms);
        pthread_mutex_unlock(&s->mu);
    }
    return DLOCK_OK;
}

int dlock__pg_adv_release(dlock__pg_be *be, const dlock_request *req)
{
    dlock__pg_session *s = find(be, req->token, 1);
    char sql[256], *hex;
    PGresult *r;
    int rc, ours = 0;

    if (s == NULL)
        return gone(be, req);
    if ((hex = dlock__pg_key_hex(be, req->name)) == NULL) {
        session_free(s);
        return DLOCK_ENOMEM;
    }
    pthread_mutex_lock(&s->mu);
    if (s->c != NULL) {
        char key[24];
        const char *p[2] = {key, hex};
        snprintf(key, sizeof(key), "%lld", (long long)s->key);
        snprintf(sql, sizeof(sql), dlock__pg_adv_release_tmpl, be->table);
        rc = dlock__pg_exec_prepared(be, &s->c, sql, 2, p, &r);
        if (rc == DLOCK_OK) {
            ours = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
            PQclear(r);
        }
    }
    /* Unlocked, the session holds nothing (one lock a session): kept.
     * Otherwise closing it gives up anything it held. */
    if (ours)
        idle_give(be, &s->c);
    pthread_mutex_unlock(&s->mu);
    free(hex);
    session_free(s);
    return ours ? DLOCK_OK : gone(be, req);
}

/* The sessions holding name's key now, from any client. */
#define HOLDERS                                                                                    \
    "FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = %u AND objid = %u"     \
    " AND objsubid = 1 AND database = (SELECT oid FROM pg_database"                              \
    " WHERE datname = current_database())"

int dlock__pg_adv_status(dlock__pg_be *be, const char *name, dlock_lock_info *out)
{
    uint64_t key;
    char sql[512];
    PGresult *r;
    int rc;

    if ((rc = dlock__pg_advisory_key(be, name, &key)) != DLOCK_OK)
        return rc;

    snprintf(sql, sizeof(sql), "SELECT count(*) " HOLDERS, (unsigned)(key >> 32),
             (unsigned)(key & 0xffffffffu));
    if ((rc = dlock__pg_cmd(be, sql, 0, NULL, &r)) != DLOCK_OK)
        return rc;
    memset(out, 0, sizeof(*out));
    out->held = PQntuples(r) == 1 && dlock__pg_num(r, 0, 0) > 0;
    out->ttl_ms = out->held ? -1 : 0; /* a session has no expiry to read */
    PQclear(r);
    return DLOCK_OK;
}

int dlock__pg_adv_force_release(dlock__pg_be *be, const char *name, dlock_lock_info *removed)
{
    uint64_t key;
    char sql[640], *hex;
    PGresult *r;
    int rc;

    if ((rc = dlock__pg_advisory_key(be, name, &key)) != DLOCK_OK ||
        (rc = dlock__pg_adv_status(be, name, removed)) != DLOCK_OK)
        return rc;
    if ((hex = dlock__pg_key_hex(be, name)) == NULL)
        return DLOCK_ENOMEM;
    /* The only way to take a session's lock: end the session. */
    snprintf(sql, sizeof(sql),
             "SELECT count(pg_terminate_backend(pid)), pg_notify('%s', $1) " HOLDERS, be->table,
             (unsigned)(key >> 32), (unsigned)(key & 0xffffffffu));
    {
        const char *p[1] = {hex};
        rc = dlock__pg_cmd(be, sql, 1, p, &r);
    }
    free(hex);
    if (rc != DLOCK_OK)
        return rc;
    PQclear(r);
    return DLOCK_OK;
}

void dlock__pg_adv_close_all(dlock__pg_be *be)
{
    while (be->nidle > 0)
        PQfinish(be->idle[--be->nidle]);
    while (be->sessions != NULL) {
        dlock__pg_session *s = be->sessions;
        be->sessions = s->next;
        session_free(s);
    }
}
