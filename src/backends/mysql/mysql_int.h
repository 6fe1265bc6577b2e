/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The MySQL / MariaDB backend's shared pieces (docs/mysql.md): the backend
 * state, one connection, and the helpers every part uses to talk SQL.
 * Private to src/backends/mysql: what its files share is named dlock__my_
 * (DLOCK__MY_ for macros); a file's own helpers are static.
 *
 * Two modes, chosen by the URL's mode= parameter:
 *   lease (default)  a row per lock in dlock_locks under its primary key,
 *                    with an expiry on the server's clock (mysql_lease.c);
 *   named            the server's user-level locks, GET_LOCK and friends,
 *                    held by one connection per held lock (mysql_named.c).
 * Both take the fence from the AUTO_INCREMENT counter table dlock_fence and
 * wait on a GET_LOCK channel (mysql_wait.c).
 *
 * Connections (each opened when first needed and, once broken, closed and
 * opened again on next use; every call bounded by the client library's
 * connect, read and write timeouts):
 *   cmd    callers, one statement at a time under mu;
 *   wd     renew, the watchdog thread's alone;
 *   wake   lease mode: holds the wake channel of each lease this client
 *          holds (GET_LOCK), under wake_mu;
 *   one per watch, and in named mode one per held lock (mysql_named.c).
 */
#ifndef DLOCK_MYSQL_INT_H
#define DLOCK_MYSQL_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <mysql.h>

#include "dlock/sys/backend.h"

/* Bytes of a stored lock name (key_prefix + name); dlock_locks.name is
 * VARBINARY of this size. */
#define DLOCK__MY_KEY_MAX 640
/* A lock name as a hex literal X'..' with its NUL. */
#define DLOCK__MY_HEX_MAX (2 * DLOCK__MY_KEY_MAX + 4)
/* The GET_LOCK name of a lock as an SQL expression. */
#define DLOCK__MY_LOCKEXPR_MAX (DLOCK__MY_HEX_MAX + 64)

typedef struct dlock__my_named dlock__my_named;

typedef struct dlock__my_be {
    /* Where and how to connect. */
    char *host, *user, *password, *db, *socket;
    unsigned port;
    char *ssl_key, *ssl_cert, *ssl_ca, *ssl_capath, *ssl_cipher;
    int tls;             /* TLS asked for (any ssl* parameter): required */
    int ssl_verify;      /* the server's certificate and name checked */
    int allow_cleartext; /* allow_cleartext=1: answer mysql_clear_password, dialog */
    char *key_secret;    /* key_secret=: GET_LOCK names are an HMAC under it */
    unsigned connect_s, read_s, write_s;
    int64_t command_ms;
    char where[192]; /* "mysql HOST:PORT/DB", for messages */

    int named;   /* mode=named */
    int create;  /* create tables and procedures on first use (create=1) */
    char *prefix; /* key_prefix */
    dlock_log_cb log;
    void *log_payload;

    pthread_mutex_t mu; /* cmd */
    MYSQL *cmd;
    MYSQL *wd;
    /* A transaction is open on cmd (under mu) / wd (the watchdog's): a
     * broken connection is not opened again in the middle of it. */
    int cmd_tx, wd_tx;
    unsigned cmd_errno; /* the server's error of the family's last statement on cmd */
    pthread_mutex_t wake_mu; /* wake */
    MYSQL *wake;

    /* Named mode: the locks held, each on its own connection, and idle
     * connections kept for the next acquisition. */
    pthread_mutex_t named_mu;
    dlock__my_named *held;
    MYSQL *spare[4];
    int nspare;
} dlock__my_be;

/* ---- mysql_conn.c ---- */

/* Parse url into be (everything but the connections). */
int dlock__my_parse_url(dlock__my_be *be, const dlock_url *url, const dlock_client_options *opts);
/* Open a connection (read committed, UTC, found rows). *out on DLOCK_OK. */
int dlock__my_connect(dlock__my_be *be, MYSQL **out);
/* Close *slot if open and set it NULL. */
void dlock__my_drop(MYSQL **slot);
/* Report the error of *slot as a DLOCK_E* code; a broken connection is
 * closed (the next use reconnects). *unknown (may be NULL) is set when the
 * statement may have run though no reply came. */
int dlock__my_fail(dlock__my_be *be, MYSQL **slot, const char *what, int *unknown);
/* Run sql on *slot (connected first if NULL): DLOCK_OK and *res (the first
 * result set, NULL for a statement without one; free with
 * mysql_free_result) with every further result of a CALL drained. res may
 * be NULL to discard. */
int dlock__my_query(dlock__my_be *be, MYSQL **slot, const char *sql, MYSQL_RES **res, int *unknown);
/* dlock__my_query, and the rows the (first) statement changed or matched into
 * *affected (may be NULL). */
int dlock__my_query_rows(dlock__my_be *be, MYSQL **slot, const char *sql, MYSQL_RES **res,
                         int *unknown, uint64_t *affected);
/* Send sql on *slot (connected first if NULL) without reading its reply,
 * so that a statement on another connection can go out beside it:
 * dlock__my_read reads it, before anything else is sent there. */
int dlock__my_send(dlock__my_be *be, MYSQL **slot, const char *sql);
/* The reply to the statement dlock__my_send sent: its first result set in
 * *res (NULL for none; free it), the others read and dropped. */
int dlock__my_read(dlock__my_be *be, MYSQL **slot, MYSQL_RES **res);
/* dlock__my_query on the callers' connection, under mu. */
int dlock__my_cmd(dlock__my_be *be, const char *sql, MYSQL_RES **res, int *unknown);
/* One row of res (freed), its n first columns as int64 (NULL -> def).
 * DLOCK_EPROTO when res has no row or fewer columns. 0 rows -> DLOCK_ENOENT
 * style: returns 1 in *found when there was a row. */
int dlock__my_row_ints(dlock__my_be *be, MYSQL_RES *res, int64_t *v, int n, int64_t def, int *found,
                       const char *what);

/* Run a listing's sql (the stored name in column 4 of ncols), and call cb
 * with each name under key_prefix and its state as fill reads the row,
 * until cb returns non-zero. */
typedef void (*dlock__my_fill_fn)(MYSQL_ROW row, unsigned long *lens, dlock_lock_info *out);
int dlock__my_list_query(dlock__my_be *be, const char *sql, unsigned ncols, dlock__my_fill_fn fill,
                         dlock_list_cb cb, void *payload);

/* s (len bytes) as X'hex' into out (2 len + 4 bytes). */
void dlock__my_hex(char *out, const char *s, size_t len);
/* The stored name of lock name: key_prefix + name, as a hex literal.
 * DLOCK_EINVAL when too long. */
int dlock__my_key_hex(dlock__my_be *be, const char *name, char *out);
/* The GET_LOCK name of lock name as an SQL expression (tag 'n' for named
 * mode, 'w' for a lease's wake channel): with key_secret, an HMAC-SHA256
 * of key_prefix + name under it, computed here; else key_prefix + name
 * itself when it is printable ASCII and fits the server's 64 characters
 * (named mode only), else a SHA-256 of it (docs/mysql.md). */
int dlock__my_lock_expr(dlock__my_be *be, const char *name, char tag, char *out);
/* A string column's bytes (NULL when SQL NULL) and length. */
int64_t dlock__my_now_ms(void);

/* ---- mysql_schema.c ---- */

/* Create the tables and procedures if create=1, else check that they are
 * there, on *slot. */
int dlock__my_schema(dlock__my_be *be, MYSQL **slot);

/* ---- mysql_lease.c ---- */

int dlock__my_lease_acquire(dlock__my_be *be, const dlock_request *req, void *watch,
                            dlock_acquire_result *out);
int dlock__my_lease_release_token(dlock__my_be *be, const char *name, const char *token);
int dlock__my_lease_release(void *be, const dlock_request *req);
int dlock__my_lease_extend(void *be, const dlock_request *req);
/* DLOCK_OK while req's token holds its lease unexpired: the plain row of
 * dlock_locks, or with family a hold (not a place in a queue) of
 * dlock_holds; else DLOCK_ELOST. */
int dlock__my_lease_check(dlock__my_be *be, const dlock_request *req, int family);
int dlock__my_lease_renew(void *be, dlock_renewal *items, size_t n);
int dlock__my_lease_status(dlock__my_be *be, const char *name, int force, dlock_lock_info *out);
int dlock__my_lease_list(dlock__my_be *be, const char *prefix, dlock_list_cb cb, void *payload);
/* Take the wake channel of name if free, before a family acquisition
 * commits, so that a waiter who sees the new hold finds its channel held:
 * 1 when this call took it (to give back if the commit fails), 2 when it
 * was ours already, else 0. Best effort. */
int dlock__my_wake_grab(dlock__my_be *be, const char *name);
/* Wake channel of a lease held: take it once the acquire won (when the
 * grab beside it did not), waiting a little for it (a tenth of lease_ms,
 * 200 ms at most); give it up on release. Best effort. */
void dlock__my_wake_take(dlock__my_be *be, const char *name, int64_t lease_ms);
void dlock__my_wake_give(dlock__my_be *be, const char *name);
/* A lease's state from a row of its status columns (held, fence, ms left,
 * holder, name); also fed from memory by tests/fuzz/fuzz_sql_rows.c. */
void dlock__my_lease_fill_info(MYSQL_ROW row, unsigned long *lens, dlock_lock_info *out);

/* ---- mysql_family.c (lease mode) ---- */

/* 1 when req goes to the family (another kind than the mutex, or an owner
 * id), else to the plain row of mysql_lease.c. */
int dlock__my_family_request(const dlock_request *req);
int dlock__my_fam_acquire(dlock__my_be *be, const dlock_request *req, void *watch,
                          dlock_acquire_result *out);
int dlock__my_fam_release(dlock__my_be *be, const dlock_request *req);
int dlock__my_fam_extend(dlock__my_be *be, const dlock_request *req);
int dlock__my_fam_renew(dlock__my_be *be, dlock_renewal *items, size_t n);
int dlock__my_fam_downgrade(dlock__my_be *be, const dlock_request *req);
int dlock__my_fam_set_permits(dlock__my_be *be, const char *name, int permits);
/* A waiter's leave: its place in a queue, and with unknown the hold a try
 * whose reply was lost may have taken. Best effort; keeps the message. */
void dlock__my_fam_leave(dlock__my_be *be, const char *name, const char *token, int unknown);

/* ---- mysql_family_view.c (lease mode) ---- */

int dlock__my_fam_leader_get(dlock__my_be *be, const char *name, dlock_leader_info *out);
int dlock__my_fam_holders(dlock__my_be *be, const char *name, dlock_list_cb cb, void *payload);
/* An observer's wait statement for election key (X'hex'), channel expr,
 * s seconds at most (mysql_wait.c). */
void dlock__my_observe_sql(char *out, size_t size, const char *key, const char *expr, int64_t s);
/* A new leader of name ends its observers' wait. Best effort; keeps the
 * message. */
void dlock__my_fam_notify_observers(dlock__my_be *be, const char *name);

/* ---- mysql_named.c ---- */

int dlock__my_named_acquire(dlock__my_be *be, const dlock_request *req, void *watch,
                            dlock_acquire_result *out);
int dlock__my_named_release(void *be, const dlock_request *req);
int dlock__my_named_check(void *be, const dlock_request *req);
int dlock__my_named_extend(void *be, const dlock_request *req);
int dlock__my_named_renew(void *be, dlock_renewal *items, size_t n);
int dlock__my_named_status(dlock__my_be *be, const char *name, int force, dlock_lock_info *out);
int dlock__my_named_list(dlock__my_be *be, const char *prefix, dlock_list_cb cb, void *payload);
void dlock__my_named_close(dlock__my_be *be);
/* A named lock's state from a row of its status columns (held, fence, ttl,
 * holder, name, holding connection, recorded connection); also fed from
 * memory by tests/fuzz/fuzz_sql_rows.c. */
void dlock__my_named_fill_info(MYSQL_ROW row, unsigned long *lens, dlock_lock_info *out);
/* A connection for a named acquisition (spare or new), and back. */
int dlock__my_named_take_conn(dlock__my_be *be, MYSQL **out);
void dlock__my_named_give_conn(dlock__my_be *be, MYSQL *c);

/* ---- mysql_wait.c ---- */

int dlock__my_watch_begin(void *be, const dlock_request *req, void **watch);
int dlock__my_watch_wait(void *be, void *watch, int64_t timeout_ms);
void dlock__my_watch_end(void *be, void *watch);
void dlock__my_watch_wake(void *be, void *watch);
/* A family acquisition's token, and whether it may queue a place (fair,
 * write): watch_end leaves that place, or the hold of a lost reply. */
void dlock__my_watch_note_family(void *watch, const char *token, int queues);
/* An election's observer: a watch on the leader's wake channel. */
int dlock__my_observe_begin(void *be, const char *name, void **watch);
/* The token of the watch's last try whose outcome is unknown. */
void dlock__my_watch_note_try(void *watch, const char *token, int unknown);
/* Named mode: the watch's connection when its GET_LOCK was granted (the
 * waiter holds the lock there): taken out of the watch, or NULL. */
MYSQL *dlock__my_watch_take_granted(void *watch);

/* Holder text (NULL-safe) into info. */
void dlock__my_holder_fill(dlock_lock_info *info, const char *text, unsigned long len);

#endif
