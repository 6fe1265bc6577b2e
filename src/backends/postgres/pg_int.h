/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The PostgreSQL backend's shared state (docs/postgres.md). Private to
 * src/backends/postgres: what its files share is named dlock__pg_
 * (DLOCK__PG_ for macros); a file's own helpers are static.
 *
 * Connections, each a libpq connection in nonblocking mode driven by
 * poll() (pg_conn.c), so that every connect is bounded by the client's
 * connect_timeout_ms and every statement by its command_timeout_ms; a
 * connection that timed out or broke is closed and opened again on next use:
 *   cmd[]     up to DLOCK__PG_CMD_MAX for callers, one statement at a time each;
 *   wd        the watchdog's (renew), its thread's alone;
 *   listener  LISTENs on the table's channel for releases (pg_wait.c), read
 *             by one thread per client that wakes the watches;
 *   sessions  advisory mode: one per held lock (pg_advisory.c), because a
 *             session-level advisory lock lives and dies with its session;
 *   idle      advisory mode: sessions that hold nothing, kept for the next
 *             acquisition.
 */
#ifndef DLOCK_PG_INT_H
#define DLOCK_PG_INT_H

#include <pthread.h>
#include <stdint.h>

#include <libpq-fe.h>
#include <openssl/evp.h>

#include "dlock/sys/backend.h"

#define DLOCK__PG_CMD_MAX 4
#define DLOCK__PG_IDLE_MAX 4
/* Table name; the sequence adds "_fence", the family's function
 * "_family_acquire" (63 bytes then: PostgreSQL's longest name). */
#define DLOCK__PG_IDENT_MAX 48

typedef enum { DLOCK__PG_MODE_LEASE, DLOCK__PG_MODE_ADVISORY } dlock__pg_mode;

typedef struct dlock__pg_listener dlock__pg_listener;
typedef struct dlock__pg_session dlock__pg_session;

typedef struct {
    char where[160]; /* "postgres HOST:PORT", for messages */
    /* libpq's connection keywords and values, NULL-terminated, owned. */
    char **kw, **val;
    int64_t connect_ms, command_ms;
    dlock__pg_mode mode;
    char table[DLOCK__PG_IDENT_MAX + 1]; /* the lock table; also the NOTIFY channel */
    char seq[DLOCK__PG_IDENT_MAX + 8];   /* TABLE_fence */
    char *prefix;                        /* key_prefix, put before every name */
    size_t prefix_len;
    char *key_secret; /* key_secret=, or NULL; wiped when freed */
    size_t key_secret_len;
    EVP_MAC *hmac;    /* HMAC, fetched at open when key_secret is given */
    int tls_by_default, channel_binding_by_default; /* dlock chose them */
    int has_family; /* lease mode: TABLE_family exists (pg_family.c) */
    dlock_log_cb log;
    void *log_payload;

    pthread_mutex_t mu; /* guards cmd, cmd_busy, ever_connected */
    pthread_cond_t cv;
    PGconn *cmd[DLOCK__PG_CMD_MAX];
    int cmd_busy[DLOCK__PG_CMD_MAX];
    int ever_connected;
    PGconn *wd;

    dlock__pg_listener *listener;

    pthread_mutex_t smu; /* guards sessions, idle, nidle (advisory) */
    dlock__pg_session *sessions;
    PGconn *idle[DLOCK__PG_IDLE_MAX];
    int nidle;
} dlock__pg_be;

/* ---- pg_conn.c ---- */

/* Connect (bounded by connect_ms) into *out; DLOCK_ECONN/EAUTH/ESERVER. */
int dlock__pg_connect(dlock__pg_be *be, PGconn **out);
/* Run sql with nparams text parameters on *pc (connecting first when *pc
 * is NULL), bounded by command_ms; *res the last result (PQclear it).
 * A connection error or a timeout closes *pc (NULL after) and returns
 * DLOCK_ECONN; an error the server reports, DLOCK_ESERVER (or EAUTH). */
int dlock__pg_exec(dlock__pg_be *be, PGconn **pc, const char *sql, int nparams,
                   const char *const *params, PGresult **res);
/* dlock__pg_exec on one of the command connections. */
int dlock__pg_cmd(dlock__pg_be *be, const char *sql, int nparams, const char *const *params,
                  PGresult **res);
/* dlock__pg_exec as a prepared statement: prepared on the connection on
 * the text's first use there, executed by name after, so that the server
 * parses and plans it once per connection (pg_conn.c says where it falls
 * back to an unnamed one). */
int dlock__pg_exec_prepared(dlock__pg_be *be, PGconn **pc, const char *sql, int nparams,
                            const char *const *params, PGresult **res);
/* dlock__pg_exec_prepared on one of the command connections. */
int dlock__pg_cmd_prepared(dlock__pg_be *be, const char *sql, int nparams,
                           const char *const *params, PGresult **res);
/* Close every connection of the pool. */
void dlock__pg_conns_close(dlock__pg_be *be);
/* Hex of len bytes of s into out (2 * len + 1 bytes). */
void dlock__pg_hex(char *out, const void *s, size_t len);
/* prefix + name in hex, malloc'd; NULL when out of memory (message set). */
char *dlock__pg_key_hex(const dlock__pg_be *be, const char *name);
/* The integer in column col of row (0 when NULL). */
int64_t dlock__pg_num(const PGresult *r, int row, int col);

/* ---- pg_lease.c: the lease-mode calls (and the admin ones of both) ---- */
int dlock__pg_create(dlock__pg_be *be, int create);
int dlock__pg_lease_acquire(dlock__pg_be *be, const dlock_request *req, dlock_acquire_result *out);
int dlock__pg_lease_release(dlock__pg_be *be, const dlock_request *req);
int dlock__pg_lease_extend(dlock__pg_be *be, const dlock_request *req);
int dlock__pg_lease_check(dlock__pg_be *be, const dlock_request *req);
int dlock__pg_lease_renew(dlock__pg_be *be, dlock_renewal *items, size_t n);
int dlock__pg_lease_status(dlock__pg_be *be, const char *name, dlock_lock_info *out);
int dlock__pg_lease_force_release(dlock__pg_be *be, const char *name, dlock_lock_info *removed);
int dlock__pg_lease_list(dlock__pg_be *be, const char *prefix, dlock_list_cb cb, void *payload);
/* The rows dlock decodes (also fed from memory by tests/fuzz/fuzz_sql_rows.c).
 * fill_info: a lock's state from columns col.. of row: held ('t'), fence,
 * ms left, holder text. unhex: a listed name's hex (at most 2
 * DLOCK_NAME_MAX digits) into out (DLOCK_NAME_MAX + 1 bytes); -1 for a
 * name dlock did not make (a NUL byte, or not lower-case hex digits in
 * pairs, as encode(..., 'hex') writes). */
void dlock__pg_fill_info(dlock_lock_info *out, const PGresult *r, int row, int col);
int dlock__pg_unhex(char *out, const char *hex);

/* ---- pg_family.c: the lock family in lease mode (every kind but MUTEX) ---- */
/* Make TABLE_family and its function unless there (or create is 0: then
 * the family's calls say why they cannot run); sets be->has_family. */
int dlock__pg_fam_create(dlock__pg_be *be, int create);
/* wid: the waiter's id (its watch's), NULL for a try-once. */
int dlock__pg_fam_acquire(dlock__pg_be *be, const dlock_request *req, const char *wid,
                          dlock_acquire_result *out);
int dlock__pg_fam_release(dlock__pg_be *be, const dlock_request *req);
int dlock__pg_fam_extend(dlock__pg_be *be, const dlock_request *req);
int dlock__pg_fam_check(dlock__pg_be *be, const dlock_request *req);
int dlock__pg_fam_downgrade(dlock__pg_be *be, const dlock_request *req);
/* Drop waiter wid's place in name's queue (fair) or its writer's mark. */
int dlock__pg_fam_leave(dlock__pg_be *be, const char *name, const char *wid);
int dlock__pg_fam_set_permits(dlock__pg_be *be, const char *name, int permits);
int dlock__pg_fam_leader_get(dlock__pg_be *be, const char *name, dlock_leader_info *out);
/* status and force_release: the family's state merged into *out, which
 * holds the mutex's (the held one wins; the higher fence). */
int dlock__pg_fam_status(dlock__pg_be *be, const char *name, dlock_lock_info *out);
int dlock__pg_fam_force_release(dlock__pg_be *be, const char *name, dlock_lock_info *removed);
int dlock__pg_fam_holders(dlock__pg_be *be, const char *name, dlock_list_cb cb, void *payload);
int dlock__pg_fam_list(dlock__pg_be *be, const char *prefix, dlock_list_cb cb, void *payload);
/* dlock__pg_fill_info's columns, then how many hold it and what kind. */
void dlock__pg_fam_fill(dlock_lock_info *out, const PGresult *r, int row, int col);

/* ---- pg_advisory.c ---- */
/* The advisory key of name into *key; DLOCK_ENOMEM (message set) when the
 * HMAC of key_secret fails. */
int dlock__pg_advisory_key(const dlock__pg_be *be, const char *name, uint64_t *key);
int dlock__pg_adv_acquire(dlock__pg_be *be, const dlock_request *req, dlock_acquire_result *out);
int dlock__pg_adv_release(dlock__pg_be *be, const dlock_request *req);
int dlock__pg_adv_extend(dlock__pg_be *be, const dlock_request *req);
int dlock__pg_adv_check(dlock__pg_be *be, const dlock_request *req);
int dlock__pg_adv_renew(dlock__pg_be *be, dlock_renewal *items, size_t n);
int dlock__pg_adv_status(dlock__pg_be *be, const char *name, dlock_lock_info *out);
int dlock__pg_adv_force_release(dlock__pg_be *be, const char *name, dlock_lock_info *removed);
void dlock__pg_adv_close_all(dlock__pg_be *be);

/* ---- pg_wait.c ---- */
int dlock__pg_watch_begin(void *be, const dlock_request *req, void **watch);
int dlock__pg_watch_wait(void *be, void *watch, int64_t timeout_ms);
void dlock__pg_watch_end(void *be, void *watch);
void dlock__pg_watch_wake(void *be, void *watch);
void dlock__pg_watch_notify(void *be, void *watch, void (*fn)(void *), void *fn_arg);
void dlock__pg_listener_free(dlock__pg_be *be);
/* The outcome of watch's last try: token when unknown (a lost reply), NULL
 * when known. watch_end gives back a lock a lost reply may hold. */
void dlock__pg_watch_note(void *watch, const char *token);
/* The waiter id of watch (32 random hex digits), NULL for NULL. */
const char *dlock__pg_watch_id(void *watch);
/* The last try with watch left a place in a queue (a fair waiter's, a
 * waiting writer's): watch_end removes it. */
void dlock__pg_watch_queued(void *watch);

/* ---- pg.c ---- */
int dlock__pg_release(void *be, const dlock_request *req);

#endif
