/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock-bench --mysql: a dlock cycle (dlock_acquire, wait 0, no watchdog,
 * then dlock_release) in each mode, beside the same statements sent raw
 * through libmariadb on one connection, as server-side prepared statements
 * and as text (literals, as dlock sends them; the faster of the two is the
 * baseline), interleaved cycle by cycle (src/backends/mysql/mysql_schema.c has the
 * procedures):
 *
 *   lease  CALL dlock_acquire_v1 (its own transaction inside), then the
 *          release's UPDATE of the row (autocommit);
 *   named  CALL dlock_named_acquire_v1 (GET_LOCK, the fence, the record),
 *          then the release's RELEASE_ALL_LOCKS; and the bare GET_LOCK +
 *          RELEASE_LOCK beside it;
 *   SELECT 1  the round trip itself, for scale.
 *
 * Issue 28's target: each mode's dlock cycle p50 <= 1.2 x its raw
 * statements' p50. It also counts what a cycle sends (bench/sql_count.c):
 * requests, and sessions opened. Without --url it starts a throwaway
 * MariaDB (mariadb-install-db and mariadbd from Debian's mariadb-server,
 * as scripts/test.sh does) on a free loopback port and a socket in a
 * mkdtemp directory removed at the end.
 */
#include "bench.h"

#include <errno.h>
#include <math.h>
#include <mysql.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define TARGET 1.2
#define LEASE_MS 10000 /* bench_cycle's */

static char dir[64];
static pid_t my_pid;

/* ---- the throwaway MariaDB --------------------------------------------------- */

static void my_stop(void)
{
    pid_t pids[1] = {my_pid};
    int n = my_pid > 0;

    bench_stop_children(pids, &n, dir); /* SIGTERM: a clean shutdown */
    my_pid = 0;
}

static MYSQL *root_conn(const char *sock)
{
    MYSQL *c = mysql_init(NULL);
    unsigned t = 10;

    mysql_options(c, MYSQL_OPT_CONNECT_TIMEOUT, &t);
    if (mysql_real_connect(c, "localhost", "root", NULL, NULL, 0, sock, 0) == NULL) {
        mysql_close(c);
        return NULL;
    }
    return c;
}

static void my_start(char *url, size_t size)
{
    char cmd[600], data[96], sock[96], a_data[128], a_sock[128], a_port[32], a_pid[128],
        a_log[128], a_tmp[128], pw[33], sql[256];
    int port = bench_free_port();
    MYSQL *root = NULL;

    snprintf(dir, sizeof dir, "/tmp/dlock-bench-my-XXXXXX");
    if (mkdtemp(dir) == NULL)
        bench_die("mkdtemp: %s", strerror(errno));
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(sock, sizeof sock, "%s/sock", dir);
    snprintf(cmd, sizeof cmd,
             "mariadb-install-db --no-defaults --datadir=%s --auth-root-authentication-method=normal"
             " --skip-test-db %s >%s/install.log 2>&1",
             data, geteuid() == 0 ? "--user=root" : "", dir);
    if (system(cmd) != 0)
        bench_die("mariadb-install-db failed (apt-get install mariadb-server; its log: "
                  "%s/install.log), or give --url", dir);
    snprintf(a_data, sizeof a_data, "--datadir=%s", data);
    snprintf(a_sock, sizeof a_sock, "--socket=%s", sock);
    snprintf(a_port, sizeof a_port, "--port=%d", port);
    snprintf(a_pid, sizeof a_pid, "--pid-file=%s/mariadbd.pid", dir);
    snprintf(a_log, sizeof a_log, "--log-error=%s/err.log", dir);
    snprintf(a_tmp, sizeof a_tmp, "--tmpdir=%s", dir);
    char *argv[] = {"mariadbd", "--no-defaults", a_data, a_sock, a_port, a_pid, a_log, a_tmp,
                    "--bind-address=127.0.0.1", "--skip-name-resolve", "--skip-log-bin",
                    "--innodb-buffer-pool-size=32M", "--performance-schema=0",
                    /* As PostgreSQL's fsync=off in --postgres: the disk is
                     * not what is measured (commits are still written). */
                    "--innodb-flush-log-at-trx-commit=0",
                    geteuid() == 0 ? "--user=root" : NULL, NULL};
    if ((my_pid = fork()) < 0)
        bench_die("fork: %s", strerror(errno));
    if (my_pid == 0) {
        sigset_t all;
        sigfillset(&all);
        sigprocmask(SIG_UNBLOCK, &all, NULL);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execvp("mariadbd", argv);
        execv("/usr/sbin/mariadbd", argv);
        _exit(127);
    }
    for (int i = 0; (root = root_conn(sock)) == NULL; i++) {
        if (waitpid(my_pid, NULL, WNOHANG) == my_pid) {
            my_pid = 0;
            bench_die("mariadbd exited at start (its log: %s/err.log)", dir);
        }
        if (i == 3000)
            bench_die("mariadbd did not start in 60 s (its log: %s/err.log)", dir);
        usleep(20000);
    }
    bench_random_password(pw);
    snprintf(sql, sizeof sql, "CREATE USER 'dlock'@'%%' IDENTIFIED BY '%s'", pw);
    if (mysql_query(root, sql) != 0 || mysql_query(root, "GRANT ALL ON *.* TO 'dlock'@'%'") != 0 ||
        mysql_query(root, "CREATE DATABASE dlock_bench") != 0)
        bench_die("MariaDB set-up: %s", mysql_error(root));
    mysql_close(root);
    snprintf(url, size, "mysql://dlock:%s@127.0.0.1:%d/dlock_bench", pw, port);
}

/* ---- the raw statements ----------------------------------------------------- */

typedef struct {
    MYSQL *c;
    MYSQL_STMT *lease_acq, *lease_rel, *named_acq, *named_rel, *get, *rel, *select1;
    char name[96], lockname[64], holder[96];
    long n; /* cycles so far: the token */
} raw_ctx;

static MYSQL_STMT *prepare(MYSQL *c, const char *sql)
{
    MYSQL_STMT *s = mysql_stmt_init(c);

    if (s == NULL || mysql_stmt_prepare(s, sql, (unsigned long)strlen(sql)) != 0)
        bench_die("prepare %s: %s", sql, s ? mysql_stmt_error(s) : mysql_error(c));
    return s;
}

/* Execute s with n string parameters; the first column of its first row
 * into first (64 bytes) when not NULL; every result (a CALL's) read. */
static void run(MYSQL_STMT *s, int n, const char *const *vals, char *first)
{
    MYSQL_BIND in[8], out[8];
    unsigned long lens[8], outlen[8];
    char buf[8][64];
    my_bool isnull[8];

    memset(in, 0, sizeof in);
    for (int i = 0; i < n; i++) {
        lens[i] = (unsigned long)strlen(vals[i]);
        in[i].buffer_type = MYSQL_TYPE_STRING;
        in[i].buffer = (void *)vals[i];
        in[i].buffer_length = lens[i];
        in[i].length = &lens[i];
    }
    if ((n > 0 && mysql_stmt_bind_param(s, in) != 0) || mysql_stmt_execute(s) != 0)
        bench_die("raw statement: %s", mysql_stmt_error(s));
    if (first != NULL)
        first[0] = '\0';
    do {
        unsigned nf = mysql_stmt_field_count(s);
        if (nf > 8)
            bench_die("raw statement: %u columns", nf);
        if (nf > 0) {
            memset(out, 0, sizeof out);
            for (unsigned i = 0; i < nf; i++) {
                out[i].buffer_type = MYSQL_TYPE_STRING;
                out[i].buffer = buf[i];
                out[i].buffer_length = sizeof buf[i];
                out[i].length = &outlen[i];
                out[i].is_null = &isnull[i];
            }
            if (mysql_stmt_bind_result(s, out) != 0 || mysql_stmt_store_result(s) != 0)
                bench_die("raw statement's result: %s", mysql_stmt_error(s));
            if (mysql_stmt_fetch(s) == 0 && first != NULL && first[0] == '\0')
                snprintf(first, 64, "%.*s", isnull[0] ? 0 : (int)outlen[0], buf[0]);
            mysql_stmt_free_result(s);
        }
    } while (mysql_stmt_next_result(s) == 0);
}

static void raw_lease(raw_ctx *x)
{
    char token[40], lease[24], got[64];
    snprintf(token, sizeof token, "raw%029ld", x->n++);
    snprintf(lease, sizeof lease, "%d", LEASE_MS);
    const char *acq[4] = {x->name, token, lease, x->holder};
    const char *rel[2] = {x->name, token};

    run(x->lease_acq, 4, acq, got);
    if (strcmp(got, "1") != 0)
        bench_die("raw lease acquire: not taken");
    run(x->lease_rel, 2, rel, NULL);
}

static void raw_named(raw_ctx *x)
{
    char lease[24], got[64];
    snprintf(lease, sizeof lease, "%d", (LEASE_MS + 999) / 1000);
    const char *acq[4] = {x->name, x->lockname, lease, x->holder};
    const char *rel[1] = {x->lockname};

    run(x->named_acq, 4, acq, got);
    if (strcmp(got, "1") != 0)
        bench_die("raw named acquire: not taken");
    run(x->named_rel, 1, rel, NULL);
}

/* The same statements in the text protocol (literals, as dlock sends
 * them): the first column of the first row into first (64 bytes). */
static void run_text(MYSQL *c, const char *sql, char *first)
{
    int more;

    if (mysql_query(c, sql) != 0)
        bench_die("raw statement: %s", mysql_error(c));
    first[0] = '\0';
    do {
        MYSQL_RES *r = mysql_store_result(c);
        MYSQL_ROW row;
        if (r != NULL) {
            if ((row = mysql_fetch_row(r)) != NULL && first[0] == '\0' && row[0] != NULL)
                snprintf(first, 64, "%s", row[0]);
            mysql_free_result(r);
        } else if (mysql_field_count(c) != 0)
            bench_die("raw statement's result: %s", mysql_error(c));
        if ((more = mysql_next_result(c)) > 0)
            bench_die("raw statement: %s", mysql_error(c));
    } while (more == 0);
}

static void hex(char *out, const char *s)
{
    out += sprintf(out, "X'");
    for (; *s; s++)
        out += sprintf(out, "%02x", (unsigned char)*s);
    sprintf(out, "'");
}

static void raw_lease_text(raw_ctx *x)
{
    char token[40], name[200], tok[80], holder[200], sql[800], got[64];
    snprintf(token, sizeof token, "raw%029ld", x->n++);
    hex(name, x->name);
    hex(tok, token);
    hex(holder, x->holder);
    snprintf(sql, sizeof sql, "CALL dlock_acquire_v1(%s, %s, %d, %s)", name, tok, LEASE_MS,
             holder);
    run_text(x->c, sql, got);
    if (strcmp(got, "1") != 0)
        bench_die("raw lease acquire (text): not taken");
    snprintf(sql, sizeof sql,
             "UPDATE dlock_locks SET token = '', holder = NULL, expires = UTC_TIMESTAMP(6)"
             " WHERE name = %s AND token = %s AND expires > UTC_TIMESTAMP(6)",
             name, tok);
    run_text(x->c, sql, got);
}

static void raw_named_text(raw_ctx *x)
{
    char name[200], holder[200], sql[800], got[64];
    hex(name, x->name);
    hex(holder, x->holder);
    snprintf(sql, sizeof sql, "CALL dlock_named_acquire_v1(%s, '%s', %d, %s)", name,
             x->lockname, (LEASE_MS + 999) / 1000, holder);
    run_text(x->c, sql, got);
    if (strcmp(got, "1") != 0)
        bench_die("raw named acquire (text): not taken");
    snprintf(sql, sizeof sql, "SELECT IS_USED_LOCK('%s') <=> CONNECTION_ID(), RELEASE_ALL_LOCKS()",
             x->lockname);
    run_text(x->c, sql, got);
}

static void raw_bare(raw_ctx *x)
{
    char got[64];
    const char *p[1] = {x->lockname};

    run(x->get, 1, p, got);
    if (strcmp(got, "1") != 0)
        bench_die("raw GET_LOCK: not taken");
    run(x->rel, 1, p, NULL);
}

/* ---- the table -------------------------------------------------------------- */

enum {
    S_LEASE_RAW,
    S_LEASE_TEXT,
    S_LEASE,
    S_NAMED_RAW,
    S_NAMED_TEXT,
    S_NAMED_BARE,
    S_NAMED,
    S_SELECT1,
    S_N
};

typedef struct {
    raw_ctx *raw;
    dlock_client *lease, *named;
    char lease_name[64], named_name[64];
} cycles;

static void one(void *ctx, int which, bench_series *s)
{
    cycles *c = ctx;
    int64_t t0 = bench_now_ns();

    switch (which) {
    case S_LEASE_RAW: raw_lease(c->raw); break;
    case S_NAMED_RAW: raw_named(c->raw); break;
    case S_LEASE_TEXT: raw_lease_text(c->raw); break;
    case S_NAMED_TEXT: raw_named_text(c->raw); break;
    case S_NAMED_BARE: raw_bare(c->raw); break;
    case S_SELECT1: run(c->raw->select1, 0, NULL, NULL); break;
    case S_LEASE: bench_cycle(c->lease, c->lease_name, NULL); break;
    case S_NAMED: bench_cycle(c->named, c->named_name, NULL); break;
    }
    if (s != NULL)
        bench_series_add(s, bench_now_ns() - t0);
}

/* host, port, user, password, db of a mysql:// URL without parameters
 * other than socket= (the bench's own; enough for the raw connection). */
static MYSQL *raw_connect(const char *url)
{
    char u[1024], *user, *pass = NULL, *host, *db, *q, *sock = NULL, *colon;
    unsigned port = 3306;
    MYSQL *c = mysql_init(NULL);

    snprintf(u, sizeof u, "%s", url + strlen("mysql://"));
    if ((q = strchr(u, '?')) != NULL) {
        *q++ = '\0';
        char *s = strstr(q, "socket=");
        if (s != NULL) {
            sock = s + 7;
            sock[strcspn(sock, "&")] = '\0';
        }
    }
    if ((host = strrchr(u, '@')) == NULL)
        bench_die("--mysql wants --url mysql://USER:PASS@HOST:PORT/DB");
    *host++ = '\0';
    user = u;
    if ((pass = strchr(user, ':')) != NULL)
        *pass++ = '\0';
    if ((db = strchr(host, '/')) == NULL)
        bench_die("--mysql: the URL names no database");
    *db++ = '\0';
    if ((colon = strrchr(host, ':')) != NULL) {
        *colon = '\0';
        port = (unsigned)atoi(colon + 1);
    }
    if (mysql_real_connect(c, host, user, pass, db, port, sock, CLIENT_MULTI_RESULTS) == NULL)
        bench_die("mysql %s: %s", bench_redacted(url), mysql_error(c));
    return c;
}

int bench_mysql(const char *url_arg, long iterations)
{
    static const char *const labels[S_N] = {
        "lease: raw statements (prepared)", "lease: raw statements (text)",
        "lease: dlock cycle",               "named: raw statements (prepared)",
        "named: raw statements (text)",     "named: raw GET_LOCK + RELEASE_LOCK",
        "named: dlock cycle",               "raw SELECT 1 (prepared)"};
    char url[1024], base[1024], dl_url[1100];
    cycles c;
    raw_ctx raw;
    bench_series s[S_N];
    int rc, own = url_arg == NULL;

    if (url_arg != NULL && strncmp(url_arg, "mysql://", 8) != 0)
        bench_die("--mysql takes --url mysql://USER:PASS@HOST:PORT/DB, or none");
    if (own)
        my_start(url, sizeof url);
    else
        snprintf(url, sizeof url, "%s", url_arg);
    /* Without mode=: each client says its own. */
    {
        const char *m = strstr(url, "mode=");
        snprintf(base, sizeof base, "%s", url);
        if (m != NULL) {
            size_t at = (size_t)(m - url), end = at + strcspn(m, "&");
            snprintf(base + at, sizeof base - at, "%s", url[end] ? url + end + 1 : "");
            size_t n = strlen(base);
            if (n > 0 && (base[n - 1] == '&' || base[n - 1] == '?'))
                base[n - 1] = '\0';
        }
    }
    memset(&c, 0, sizeof c);
    memset(&raw, 0, sizeof raw);
    c.raw = &raw;
    snprintf(dl_url, sizeof dl_url, "%s%cmode=lease", base, strchr(base, '?') ? '&' : '?');
    if ((rc = dlock_client_open(&c.lease, dl_url, NULL)) != DLOCK_OK)
        bench_die("dlock_client_open: %s (%s)", dlock_strerror(rc), dlock_error_message());
    snprintf(dl_url, sizeof dl_url, "%s%cmode=named", base, strchr(base, '?') ? '&' : '?');
    if ((rc = dlock_client_open(&c.named, dl_url, NULL)) != DLOCK_OK)
        bench_die("dlock_client_open: %s (%s)", dlock_strerror(rc), dlock_error_message());
    snprintf(c.lease_name, sizeof c.lease_name, "dlock-bench:my:lease:%d", (int)getpid());
    snprintf(c.named_name, sizeof c.named_name, "dlock-bench:my:named:%d", (int)getpid());

    /* The raw side: a lock name and GET_LOCK name of its own, the tables and
     * procedures dlock_client_open made, the session set up as dlock's. */
    raw.c = raw_connect(base);
    if (mysql_query(raw.c, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED") != 0)
        bench_die("raw session: %s", mysql_error(raw.c));
    snprintf(raw.name, sizeof raw.name, "dlock:dlock-bench:my:raw:%d", (int)getpid());
    snprintf(raw.lockname, sizeof raw.lockname, "dlock:dlock-bench:my:rawn:%d", (int)getpid());
    snprintf(raw.holder, sizeof raw.holder, "bench %d 0", (int)getpid());
    raw.lease_acq = prepare(raw.c, "CALL dlock_acquire_v1(?, ?, ?, ?)");
    raw.lease_rel = prepare(raw.c, "UPDATE dlock_locks SET token = '', holder = NULL,"
                                   " expires = UTC_TIMESTAMP(6) WHERE name = ? AND token = ?"
                                   " AND expires > UTC_TIMESTAMP(6)");
    raw.named_acq = prepare(raw.c, "CALL dlock_named_acquire_v1(?, ?, ?, ?)");
    raw.named_rel = prepare(raw.c, "SELECT IS_USED_LOCK(?) <=> CONNECTION_ID(), "
                                   "RELEASE_ALL_LOCKS()");
    raw.get = prepare(raw.c, "SELECT GET_LOCK(?, 0)");
    raw.rel = prepare(raw.c, "SELECT RELEASE_LOCK(?)");
    raw.select1 = prepare(raw.c, "SELECT 1");

    printf("dlock-bench: dlock %s, %s %s at %s%s\n", dlock_version(),
           strstr(mysql_get_server_info(raw.c), "MariaDB") ? "MariaDB" : "MySQL",
           mysql_get_server_info(raw.c), bench_redacted(url), own ? " (started by this run)" : "");
    printf("  %ld cycles each, interleaved one by one; one connection for the raw "
           "statements\n\n",
           iterations);
    double p50[S_N], req[S_N], conn[S_N];
    bench_sql_measure(&c, one, S_N, iterations, s, p50, req, conn);
    bench_sql_print_header();
    for (int w = 0; w < S_N; w++) {
        char b[64] = "";
        int dl = w == S_LEASE || w == S_NAMED;
        /* The faster of the two raw forms is the floor. */
        double vs = w == S_LEASE ? fmin(p50[S_LEASE_RAW], p50[S_LEASE_TEXT])
                                 : fmin(p50[S_NAMED_RAW], p50[S_NAMED_TEXT]);
        if (dl)
            snprintf(b, sizeof b, "raw p50 %.1f", vs);
        bench_print_row(labels[w], p50[w], bench_series_us(&s[w], 99), -1, dl ? b : NULL,
                        dl ? p50[w] / vs : -1, dl ? TARGET : 0);
        if (w == S_NAMED) {
            snprintf(b, sizeof b, "bare p50 %.1f", p50[S_NAMED_BARE]);
            bench_print_row("  the same, against the bare lock+unlock", -1, -1, -1, b,
                            p50[w] / p50[S_NAMED_BARE], TARGET);
        }
    }
    bench_sql_print_sends(labels, S_N, req, conn);
    printf("\nratio: dlock cycle p50 / the p50 of the same statements sent raw (the faster of\n"
           "prepared and text); requests without pipelining are round trips.\n");

    for (int w = 0; w < S_N; w++)
        free(s[w].v);
    MYSQL_STMT *all[] = {raw.lease_acq, raw.lease_rel, raw.named_acq, raw.named_rel,
                         raw.get,       raw.rel,       raw.select1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        mysql_stmt_close(all[i]);
    mysql_close(raw.c);
    dlock_client_free(c.lease);
    dlock_client_free(c.named);
    if (own)
        my_stop();
    return 0;
}
