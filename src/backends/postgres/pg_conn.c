/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Connections to PostgreSQL: libpq in nonblocking mode, every wait a poll()
 * on the connection's socket with the time left, so that a connect never
 * takes longer than connect_timeout_ms and a statement never longer than
 * command_timeout_ms, whatever the server or the network does. A statement
 * that timed out leaves its connection in an unknown state: it is closed
 * (the server ends the statement when it notices) and opened again on next
 * use. The pool of command connections for callers is here too.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-events.h>

#include "pg_int.h"

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* libpq prints NOTICEs (CREATE ... IF NOT EXISTS) to stderr by default. */
static void quiet(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

/* Wait until fd is ready for events or deadline (monotonic ms) passes:
 * 1 ready, 0 timed out, -1 error. */
static int wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - mono_ms();
        struct pollfd p = {fd, events, 0};
        int rc;

        if (left <= 0)
            return 0;
        rc = poll(&p, 1, left > 60000 ? 60000 : (int)left);
        if (rc > 0)
            return 1;
        if (rc < 0 && errno != EINTR)
            return -1;
    }
}

/* libpq's last message, one line, without its trailing newline. */
static void pq_text(PGconn *c, char *out, size_t size)
{
    const char *m = c != NULL ? PQerrorMessage(c) : "out of memory";
    size_t n;

    snprintf(out, size, "%s", m != NULL && *m ? m : "connection failed");
    n = strlen(out);
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == ' '))
        out[--n] = '\0';
    for (char *p = out; *p; p++)
        if (*p == '\n')
            *p = ' ';
}

static int connect_failed(dlock__pg_be *be, PGconn *c, const char *what)
{
    char text[400];
    const char *hint = "";
    int code = DLOCK_ECONN;

    pq_text(c, text, sizeof(text));
    /* As on rediss://, a certificate that fails verification is refused as
     * an authentication failure, a file that cannot be read is bad input. */
    if (strstr(text, "certificate file") != NULL || strstr(text, "private key file") != NULL ||
        strstr(text, "invalid connection option") != NULL ||
        strstr(text, "invalid sslmode") != NULL || strstr(text, "invalid integer") != NULL)
        code = DLOCK_EINVAL;
    else if (strstr(text, "authentication failed") != NULL ||
             strstr(text, "no password supplied") != NULL ||
             strstr(text, "no pg_hba.conf entry") != NULL || strstr(text, "role \"") != NULL ||
             strstr(text, "certificate") != NULL || strstr(text, "channel binding") != NULL)
        code = DLOCK_EAUTH;
    else if (strstr(text, "database \"") != NULL && strstr(text, "does not exist") != NULL)
        code = DLOCK_ESERVER;
    /* Say so when what failed is a choice of dlock's (pg.c, secure_transport). */
    if (be->channel_binding_by_default && strstr(text, "channel binding") != NULL)
        hint = " (dlock asks for channel_binding=require when a password goes over TLS: the "
               "server must use scram-sha-256; channel_binding=prefer in the URL allows md5 "
               "or a clear-text password over the verified TLS connection)";
    else if (be->tls_by_default &&
             (strstr(text, "SSL") != NULL || strstr(text, "certificate") != NULL))
        hint = " (dlock asks for sslmode=verify-full when a password or sslcert goes to a "
               "host that is not loopback; sslrootcert=FILE names the CA, sslmode= another "
               "mode)";
    PQfinish(c);
    return dlock_backend_fail(code, "%s: %s%s%s", be->where, what, text, hint);
}

/*
 * The statements prepared on a connection live and die with it, so what
 * was prepared is kept on the connection itself (libpq's instance data,
 * freed by its PGEVT_CONNDESTROY in PQfinish): a connection closed and
 * opened again starts with none, whichever slot holds it.
 */
#define PREPARED_MAX 8
typedef struct {
    uint64_t prepared[PREPARED_MAX]; /* the hashes of the texts prepared here */
    int nprepared;
    int unnamed; /* prepared statements do not work here: a pooler */
} conn_state;

static int conn_event(PGEventId id, void *info, void *arg)
{
    (void)arg;
    if (id == PGEVT_CONNDESTROY) {
        PGEventConnDestroy *d = info;
        free(PQinstanceData(d->conn, conn_event));
    } else if (id == PGEVT_CONNRESET) {
        PGEventConnReset *r = info;
        conn_state *st = PQinstanceData(r->conn, conn_event);
        if (st != NULL)
            st->nprepared = 0;
    }
    return 1;
}

int dlock__pg_connect(dlock__pg_be *be, PGconn **out)
{
    PGconn *c;
    int64_t deadline = mono_ms() + be->connect_ms;

    *out = NULL;
    c = PQconnectStartParams((const char *const *)be->kw, (const char *const *)be->val, 0);
    if (c == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "%s: out of memory", be->where);
    if (PQstatus(c) == CONNECTION_BAD)
        return connect_failed(be, c, "");
    for (;;) {
        PostgresPollingStatusType st = PQconnectPoll(c);
        int ready;

        if (st == PGRES_POLLING_OK)
            break;
        if (st == PGRES_POLLING_FAILED)
            return connect_failed(be, c, "");
        ready = wait_fd(PQsocket(c), st == PGRES_POLLING_WRITING ? POLLOUT : POLLIN, deadline);
        if (ready == 0) {
            PQfinish(c);
            return dlock_backend_fail(DLOCK_ECONN, "%s: connect timed out after %lld ms",
                                      be->where, (long long)be->connect_ms);
        }
        if (ready < 0)
            return connect_failed(be, c, "poll: ");
    }
    PQsetNoticeProcessor(c, quiet, NULL);
    if (PQsetnonblocking(c, 1) != 0)
        return connect_failed(be, c, "nonblocking: ");
    /* Without its state a connection still works, with unnamed statements. */
    {
        conn_state *st = calloc(1, sizeof(*st));
        if (st != NULL && (!PQregisterEventProc(c, conn_event, "dlock", NULL) ||
                           !PQsetInstanceData(c, conn_event, st)))
            free(st);
    }
    *out = c;
    return DLOCK_OK;
}

/* The code for a server's error: the SQLSTATE's class decides. The
 * SQLSTATE goes to sqlstate (6 bytes) when not NULL. */
static int server_error(dlock__pg_be *be, const PGresult *r, char *sqlstate)
{
    const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    const char *msg = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    int code = DLOCK_ESERVER;

    if (sqlstate != NULL)
        snprintf(sqlstate, 6, "%s", state != NULL ? state : "");

    if (state != NULL && strncmp(state, "28", 2) == 0)
        code = DLOCK_EAUTH;
    else if (state != NULL && strncmp(state, "08", 2) == 0)
        code = DLOCK_ECONN;
    return dlock_backend_fail(code, "%s: %s (SQLSTATE %s)", be->where, msg ? msg : "error",
                              state ? state : "?");
}

static int conn_broke(dlock__pg_be *be, PGconn **pc, const char *what)
{
    char text[400];

    pq_text(*pc, text, sizeof(text));
    PQfinish(*pc);
    *pc = NULL;
    return dlock_backend_fail(DLOCK_ECONN, "%s: %s%s", be->where, what, text);
}

/* How a statement goes out. SEND_PREPARE_RUN: prepared and run in one
 * round trip, in libpq's pipeline mode (libpq 14 and later). */
typedef enum { SEND_TEXT, SEND_PREPARE, SEND_PREPARED, SEND_PREPARE_RUN } send_kind;

/* The connection in *pc, opened when there is none or it broke. */
static int ensure_conn(dlock__pg_be *be, PGconn **pc)
{
    if (*pc != NULL && PQstatus(*pc) == CONNECTION_BAD) {
        PQfinish(*pc);
        *pc = NULL;
    }
    return *pc == NULL ? dlock__pg_connect(be, pc) : DLOCK_OK;
}

/* One statement on *pc (connected), its replies read: sql itself
 * (SEND_TEXT), sql prepared as stmt (SEND_PREPARE), the statement
 * prepared as stmt (SEND_PREPARED), or both (SEND_PREPARE_RUN). sqlstate
 * (6 bytes) gets the SQLSTATE of a server's error (the first one). The
 * rest as dlock__pg_exec. */
static int exec_on(dlock__pg_be *be, PGconn **pc, send_kind kind, const char *stmt,
                   const char *sql, int nparams, const char *const *params, PGresult **res,
                   char *sqlstate)
{
    int64_t deadline;
    PGresult *last = NULL, *r;
    int rc, sent, pipeline = kind == SEND_PREPARE_RUN;

    *res = NULL;
    sqlstate[0] = '\0';
    deadline = mono_ms() + be->command_ms;
    /* Without parameters, the simple protocol: it allows several
     * statements (the DDL's transaction) in one round trip. */
    if (kind == SEND_PREPARE)
        sent = PQsendPrepare(*pc, stmt, sql, nparams, NULL);
#ifdef LIBPQ_HAS_PIPELINING
    else if (pipeline)
        sent = PQenterPipelineMode(*pc) && PQsendPrepare(*pc, stmt, sql, nparams, NULL) &&
               PQsendQueryPrepared(*pc, stmt, nparams, params, NULL, NULL, 0) &&
               PQpipelineSync(*pc);
#endif
    else if (kind == SEND_PREPARED)
        sent = PQsendQueryPrepared(*pc, stmt, nparams, params, NULL, NULL, 0);
    else
        sent = nparams > 0 || params != NULL
                   ? PQsendQueryParams(*pc, sql, nparams, NULL, params, NULL, NULL, 0)
                   : PQsendQuery(*pc, sql);
    if (!sent)
        return conn_broke(be, pc, "send: ");
    for (;;) {
        int f = PQflush(*pc);
        if (f == 0)
            break;
        if (f < 0)
            return conn_broke(be, pc, "send: ");
        if (wait_fd(PQsocket(*pc), POLLOUT | POLLIN, deadline) <= 0)
            goto timeout;
        if (!PQconsumeInput(*pc))
            return conn_broke(be, pc, "");
    }
    for (;;) {
        while (PQisBusy(*pc)) {
            int ready = wait_fd(PQsocket(*pc), POLLIN, deadline);
            if (ready == 0)
                goto timeout;
            if (ready < 0 || !PQconsumeInput(*pc)) {
                PQclear(last);
                return conn_broke(be, pc, "");
            }
        }
        r = PQgetResult(*pc);
        if (r == NULL) {
            if (pipeline) /* the end of one statement's results */
                continue;
            break;
        }
#ifdef LIBPQ_HAS_PIPELINING
        if (pipeline && PQresultStatus(r) == PGRES_PIPELINE_SYNC) {
            PQclear(r);
            break;
        }
        if (PQresultStatus(r) == PGRES_PIPELINE_ABORTED) {
            PQclear(r); /* the prepare failed: its error is kept */
            continue;
        }
#endif
        /* Keep an error over any later result. */
        if (last != NULL && PQresultStatus(last) == PGRES_FATAL_ERROR)
            PQclear(r);
        else {
            PQclear(last);
            last = r;
        }
    }
#ifdef LIBPQ_HAS_PIPELINING
    if (pipeline && !PQexitPipelineMode(*pc)) {
        PQclear(last);
        return conn_broke(be, pc, "pipeline: ");
    }
#endif
    if (last == NULL)
        return conn_broke(be, pc, "no reply: ");
    switch (PQresultStatus(last)) {
    case PGRES_TUPLES_OK:
    case PGRES_COMMAND_OK:
        *res = last;
        return DLOCK_OK;
    default:
        rc = server_error(be, last, sqlstate);
        PQclear(last);
        if (PQstatus(*pc) == CONNECTION_BAD) {
            /* pg_terminate_backend, a shutdown: the session is gone. */
            PQfinish(*pc);
            *pc = NULL;
            if (rc == DLOCK_ESERVER)
                rc = DLOCK_ECONN;
        }
        return rc;
    }
timeout:
    PQclear(last);
    PQfinish(*pc);
    *pc = NULL;
    return dlock_backend_fail(DLOCK_ECONN, "%s: no reply within %lld ms", be->where,
                              (long long)be->command_ms);
}

int dlock__pg_exec(dlock__pg_be *be, PGconn **pc, const char *sql, int nparams,
                   const char *const *params, PGresult **res)
{
    char state[6];
    int rc;

    *res = NULL;
    if ((rc = ensure_conn(be, pc)) != DLOCK_OK)
        return rc;
    return exec_on(be, pc, SEND_TEXT, NULL, sql, nparams, params, res, state);
}

/*
 * Prepared on first use on each connection, under a name that is a hash of
 * the text (so that a name found prepared, through a pooler, is this
 * text); up to PREPARED_MAX texts a connection, unnamed beyond. Where
 * prepared statements do not work (a pooler in transaction mode says
 * "does not exist" to an execute), the connection goes back to unnamed
 * statements for good: the statement is never lost to it.
 */
int dlock__pg_exec_prepared(dlock__pg_be *be, PGconn **pc, const char *sql, int nparams,
                            const char *const *params, PGresult **res)
{
    char stmt[32], state[6];
    uint64_t h = 1469598103934665603ULL;
    conn_state *st;
    int rc, i;

    *res = NULL;
    if ((rc = ensure_conn(be, pc)) != DLOCK_OK)
        return rc;
    st = PQinstanceData(*pc, conn_event);
    if (st == NULL || st->unnamed)
        return exec_on(be, pc, SEND_TEXT, NULL, sql, nparams, params, res, state);
    for (const char *p = sql; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    for (i = 0; i < st->nprepared && st->prepared[i] != h; i++)
        ;
    if (i == st->nprepared && i == PREPARED_MAX)
        return exec_on(be, pc, SEND_TEXT, NULL, sql, nparams, params, res, state);
    snprintf(stmt, sizeof(stmt), "dlock_%016llx", (unsigned long long)h);
#ifdef LIBPQ_HAS_PIPELINING
    if (i == st->nprepared) {
        /* Prepared and run in one round trip. Failed, it is marked only
         * when prepared already ("already exists"): then it runs alone
         * below; else the next use prepares it again. */
        rc = exec_on(be, pc, SEND_PREPARE_RUN, stmt, sql, nparams, params, res, state);
        if (rc == DLOCK_OK)
            st->prepared[st->nprepared++] = h;
        if (rc == DLOCK_OK || strcmp(state, "42P05") != 0)
            return rc;
        st->prepared[st->nprepared++] = h;
    }
#else
    if (i == st->nprepared) {
        rc = exec_on(be, pc, SEND_PREPARE, stmt, sql, nparams, NULL, res, state);
        if (rc == DLOCK_OK)
            PQclear(*res);
        else if (strcmp(state, "42P05") != 0) /* not "already prepared" */
            return rc;
        *res = NULL;
        st->prepared[st->nprepared++] = h;
    }
#endif
    rc = exec_on(be, pc, SEND_PREPARED, stmt, NULL, nparams, params, res, state);
    if (rc == DLOCK_ESERVER && strcmp(state, "26000") == 0 && *pc != NULL) {
        /* "prepared statement does not exist": not run, so once more. */
        st->unnamed = 1;
        rc = exec_on(be, pc, SEND_TEXT, NULL, sql, nparams, params, res, state);
    }
    return rc;
}

/* A free command connection's slot (waiting for one), marked busy; *fresh
 * when it has no live connection. */
static int cmd_take(dlock__pg_be *be, int *fresh)
{
    int i;

    pthread_mutex_lock(&be->mu);
    for (;;) {
        for (i = 0; i < DLOCK__PG_CMD_MAX && be->cmd_busy[i]; i++)
            ;
        if (i < DLOCK__PG_CMD_MAX)
            break;
        pthread_cond_wait(&be->cv, &be->mu);
    }
    be->cmd_busy[i] = 1;
    *fresh = be->cmd[i] == NULL || PQstatus(be->cmd[i]) == CONNECTION_BAD;
    pthread_mutex_unlock(&be->mu);
    return i;
}

static void cmd_give(dlock__pg_be *be, int i, int fresh)
{
    pthread_mutex_lock(&be->mu);
    if (fresh && be->cmd[i] != NULL) {
        if (be->ever_connected && be->log != NULL)
            be->log(DLOCK_LOG_INFO, "postgres: connected again", be->log_payload);
        be->ever_connected = 1;
    }
    be->cmd_busy[i] = 0;
    pthread_cond_signal(&be->cv);
    pthread_mutex_unlock(&be->mu);
}

int dlock__pg_cmd_prepared(dlock__pg_be *be, const char *sql, int nparams,
                           const char *const *params, PGresult **res)
{
    int fresh, i = cmd_take(be, &fresh), rc;

    rc = dlock__pg_exec_prepared(be, &be->cmd[i], sql, nparams, params, res);
    /* As dlock__pg_cmd (below): a pooled connection closed while idle. */
    if (rc == DLOCK_ECONN && !fresh) {
        fresh = 1;
        rc = dlock__pg_exec_prepared(be, &be->cmd[i], sql, nparams, params, res);
    }
    cmd_give(be, i, fresh);
    return rc;
}

int dlock__pg_cmd(dlock__pg_be *be, const char *sql, int nparams, const char *const *params,
                  PGresult **res)
{
    int fresh, i = cmd_take(be, &fresh), rc;

    rc = dlock__pg_exec(be, &be->cmd[i], sql, nparams, params, res);
    /* A pooled connection the server closed while idle (a restart, an
     * idle timeout) fails on first use: every statement here is
     * idempotent by token, so try once more on a new one. */
    if (rc == DLOCK_ECONN && !fresh) {
        fresh = 1;
        rc = dlock__pg_exec(be, &be->cmd[i], sql, nparams, params, res);
    }
    cmd_give(be, i, fresh);
    return rc;
}

void dlock__pg_conns_close(dlock__pg_be *be)
{
    for (int i = 0; i < DLOCK__PG_CMD_MAX; i++) {
        PQfinish(be->cmd[i]);
        be->cmd[i] = NULL;
    }
    PQfinish(be->wd);
    be->wd = NULL;
}

void dlock__pg_hex(char *out, const void *s, size_t len)
{
    static const char digits[] = "0123456789abcdef";
    const unsigned char *p = s;

    for (size_t i = 0; i < len; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    out[2 * len] = '\0';
}

char *dlock__pg_key_hex(const dlock__pg_be *be, const char *name)
{
    size_t n = strlen(name);
    char *out = malloc(2 * (be->prefix_len + n) + 1);

    if (out == NULL) {
        dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
        return NULL;
    }
    dlock__pg_hex(out, be->prefix, be->prefix_len);
    dlock__pg_hex(out + 2 * be->prefix_len, name, n);
    return out;
}

int64_t dlock__pg_num(const PGresult *r, int row, int col)
{
    if (PQgetisnull(r, row, col))
        return 0;
    return strtoll(PQgetvalue(r, row, col), NULL, 10);
}
