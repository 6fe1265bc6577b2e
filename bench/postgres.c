/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock-bench --postgres: a dlock cycle (dlock_acquire, wait 0, no
 * watchdog, then dlock_release) in each mode, beside the same statements
 * sent raw through libpq on one connection, prepared, interleaved cycle by cycle
 * (src/backends/postgres/pg_sql.h has the text both send):
 *
 *   lease     the acquire and the release statement on the lock table,
 *             each its own transaction (autocommit), as dlock sends them;
 *   advisory  pg_try_advisory_lock with the fence and the session's lease,
 *             then pg_advisory_unlock with the NOTIFY; and the bare
 *             pg_try_advisory_lock + pg_advisory_unlock beside it;
 *   SELECT 1  the round trip itself, for scale.
 *
 * Issue 28's target: each mode's dlock cycle p50 <= 1.2 x its raw
 * statements' p50. It also counts what a cycle sends (bench/sql_count.c):
 * requests, and sessions opened. Without --url it starts a throwaway
 * PostgreSQL (initdb and postgres from Debian's postgresql package, as
 * nobody when run as root, as tests/support/test_pg.c does) on a free
 * loopback port, with its data in a mkdtemp directory removed at the end.
 */
#include "bench.h"

#include "backends/postgres/pg_sql.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <libpq-fe.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define TARGET 1.2
#define TABLE "dlock_locks" /* dlock's default table= */
#define SEQ TABLE "_fence"

static char dir[64];
static pid_t pg_pid;

/* ---- the throwaway PostgreSQL ----------------------------------------------- */

static const char *pg_bindir(void)
{
    static char bin[256];
    glob_t g;

    if (bin[0])
        return bin;
    if (glob("/usr/lib/postgresql/*/bin/initdb", 0, NULL, &g) != 0 || g.gl_pathc == 0)
        bench_die("no PostgreSQL server to start (apt-get install postgresql), or give --url");
    snprintf(bin, sizeof bin, "%s", g.gl_pathv[g.gl_pathc - 1]);
    *strrchr(bin, '/') = '\0';
    globfree(&g);
    return bin;
}

/* In a child: PostgreSQL refuses to run as root, so as nobody then. */
static void child_as_server_user(const char *log)
{
    sigset_t all;
    int fd;

    if (getuid() == 0) {
        struct passwd *pw = getpwnam("nobody");
        if (pw == NULL || setgid(pw->pw_gid) != 0 || setuid(pw->pw_uid) != 0)
            _exit(126);
    }
    sigfillset(&all);
    sigprocmask(SIG_UNBLOCK, &all, NULL);
    prctl(PR_SET_PDEATHSIG, SIGQUIT); /* after setuid, which clears it */
    if ((fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644)) >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
    }
}

static void pg_stop(void)
{
    pid_t pids[1] = {pg_pid};
    int n = pg_pid > 0;

    bench_stop_children(pids, &n, dir); /* SIGTERM: a smart shutdown */
    pg_pid = 0;
}

static void pg_start(char *url, size_t size)
{
    char data[96], log[96], port[16], ping[200], exe[300];
    int status;
    pid_t pid;

    snprintf(dir, sizeof dir, "/tmp/dlock-bench-pg-XXXXXX");
    if (mkdtemp(dir) == NULL)
        bench_die("mkdtemp: %s", strerror(errno));
    if (getuid() == 0) { /* the server's user (nobody) owns it, and only it */
        struct passwd *pw = getpwnam("nobody");
        if (pw == NULL || chown(dir, pw->pw_uid, pw->pw_gid) != 0)
            bench_die("chown %s to nobody: %s", dir, strerror(errno));
    }
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(log, sizeof log, "%s/log", dir);
    if ((pid = fork()) == 0) {
        child_as_server_user(log);
        snprintf(exe, sizeof exe, "%s/initdb", pg_bindir());
        execl(exe, "initdb", "-D", data, "-U", "dlock", "--auth=trust", "-E", "UTF8",
              "--no-sync", (char *)NULL);
        _exit(127);
    }
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0)
        bench_die("initdb in %s failed (its log: %s)", data, log);
    snprintf(port, sizeof port, "%d", bench_free_port());
    if ((pg_pid = fork()) == 0) {
        child_as_server_user(log);
        snprintf(exe, sizeof exe, "%s/postgres", pg_bindir());
        /* As the test suite runs it: no fsync (the disk is not what is
         * measured), commits otherwise as usual. */
        execl(exe, "postgres", "-D", data, "-p", port, "-k", dir, "-c",
              "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=100",
              (char *)NULL);
        _exit(127);
    }
    if (pg_pid < 0)
        bench_die("fork: %s", strerror(errno));
    snprintf(ping, sizeof ping, "host=%s port=%s user=dlock dbname=postgres", dir, port);
    for (int i = 0; PQping(ping) != PQPING_OK; i++) {
        if (waitpid(pg_pid, &status, WNOHANG) == pg_pid) {
            pg_pid = 0;
            bench_die("postgres exited at start (its log: %s)", log);
        }
        if (i == 3000)
            bench_die("postgres did not start in 60 s (its log: %s)", log);
        usleep(20000);
    }
    snprintf(url, size, "postgres://dlock@127.0.0.1:%s/postgres", port);
}

/* ---- the raw statements ----------------------------------------------------- */

/* The URL without dlock's own parameters (mode, create, table, ...), which
 * libpq would refuse; and without mode= for dlock's two clients. */
static void strip_params(char *out, size_t size, const char *url, int keep_dlock_params)
{
    static const char *const ours[] = {"mode=", "create=", "table=", "insecure_auth=",
                                       "key_secret=", NULL};
    const char *q = strchr(url, '?');
    size_t base = q ? (size_t)(q - url) : strlen(url);
    char sep = '?';

    snprintf(out, size, "%.*s", (int)base, url);
    if (q == NULL)
        return;
    char *params = strdup(q + 1), *save = NULL;
    if (params == NULL)
        bench_die("out of memory");
    for (char *p = strtok_r(params, "&", &save); p; p = strtok_r(NULL, "&", &save)) {
        int skip = strncmp(p, "mode=", 5) == 0;
        for (int i = 1; !keep_dlock_params && ours[i] != NULL; i++)
            skip |= strncmp(p, ours[i], strlen(ours[i])) == 0;
        if (skip)
            continue;
        size_t n = strlen(out);
        snprintf(out + n, size - n, "%c%s", sep, p);
        sep = '&';
    }
    free(params);
}

static void prepare(PGconn *pg, const char *name, const char *sql)
{
    PGresult *r = PQprepare(pg, name, sql, 0, NULL);

    if (PQresultStatus(r) != PGRES_COMMAND_OK)
        bench_die("prepare %s: %s", name, PQerrorMessage(pg));
    PQclear(r);
}

/* Execute prepared statement name; its first column of row 0 into first
 * (64 bytes) when not NULL. */
static void run(PGconn *pg, const char *name, int n, const char *const *params, char *first)
{
    PGresult *r = PQexecPrepared(pg, name, n, params, NULL, NULL, 0);

    if (PQresultStatus(r) != PGRES_TUPLES_OK && PQresultStatus(r) != PGRES_COMMAND_OK)
        bench_die("%s: %s", name, PQerrorMessage(pg));
    if (first != NULL)
        snprintf(first, 64, "%s", PQntuples(r) > 0 ? PQgetvalue(r, 0, 0) : "");
    PQclear(r);
}

typedef struct {
    PGconn *pg;
    char name_hex[128], holder[128], key[24];
    long n; /* cycles so far: the token */
} raw_ctx;

/* The lease-mode statements of dlock_acquire + dlock_release. */
static void raw_lease(raw_ctx *x)
{
    char token[40], fence[64];
    snprintf(token, sizeof token, "raw%029ld", x->n++);
    const char *acq[6] = {x->name_hex, token, NULL, "10000", x->holder, "f"};
    const char *rel[2] = {x->name_hex, token};

    run(x->pg, "lease_acquire", 6, acq, fence);
    if (fence[0] == '\0')
        bench_die("raw lease acquire: not taken");
    run(x->pg, "lease_release", 2, rel, NULL);
}

/* Advisory mode's statements. */
static void raw_advisory(raw_ctx *x)
{
    char fence[64];
    const char *acq[1] = {x->key};
    const char *rel[2] = {x->key, x->name_hex};

    run(x->pg, "adv_acquire", 1, acq, fence);
    if (fence[0] == '\0')
        bench_die("raw advisory acquire: not taken");
    run(x->pg, "adv_release", 2, rel, NULL);
}

/* The bare advisory lock and unlock. */
static void raw_bare(raw_ctx *x)
{
    char taken[64];
    const char *p[1] = {x->key};

    run(x->pg, "bare_lock", 1, p, taken);
    if (strcmp(taken, "t") != 0)
        bench_die("raw pg_try_advisory_lock: not taken");
    run(x->pg, "bare_unlock", 1, p, NULL);
}

static void raw_select1(raw_ctx *x)
{
    run(x->pg, "select1", 0, NULL, NULL);
}

/* ---- the table -------------------------------------------------------------- */

enum { S_LEASE_RAW, S_LEASE, S_ADV_RAW, S_ADV_BARE, S_ADV, S_SELECT1, S_N };

typedef struct {
    raw_ctx *raw;
    dlock_client *lease, *adv;
    char lease_name[64], adv_name[64];
} cycles;

static void one(void *ctx, int which, bench_series *s)
{
    cycles *c = ctx;
    int64_t t0 = bench_now_ns();

    switch (which) {
    case S_LEASE_RAW: raw_lease(c->raw); break;
    case S_ADV_RAW: raw_advisory(c->raw); break;
    case S_ADV_BARE: raw_bare(c->raw); break;
    case S_SELECT1: raw_select1(c->raw); break;
    case S_LEASE: bench_cycle(c->lease, c->lease_name, NULL); break;
    case S_ADV: bench_cycle(c->adv, c->adv_name, NULL); break;
    }
    if (s != NULL)
        bench_series_add(s, bench_now_ns() - t0);
}

int bench_postgres(const char *url_arg, long iterations)
{
    static const char *const labels[S_N] = {
        "lease: raw statements (libpq, prepared)", "lease: dlock cycle",
        "advisory: raw statements (prepared)",     "advisory: raw try_lock + unlock only",
        "advisory: dlock cycle",                   "raw SELECT 1 (prepared)"};
    char url[1024], base[1024], conninfo[1024], dl_url[1100], sql[4096], version[32];
    cycles c;
    raw_ctx raw = {0};
    bench_series s[S_N];
    int rc, own = url_arg == NULL;

    if (url_arg != NULL && strncmp(url_arg, "postgres://", 11) != 0 &&
        strncmp(url_arg, "postgresql://", 13) != 0)
        bench_die("--postgres takes --url postgres://USER@HOST:PORT/DB, or none");
    if (own)
        pg_start(url, sizeof url);
    else
        snprintf(url, sizeof url, "%s", url_arg);
    strip_params(base, sizeof base, url, 1);
    strip_params(conninfo, sizeof conninfo, url, 0);

    memset(&c, 0, sizeof c);
    c.raw = &raw;
    snprintf(dl_url, sizeof dl_url, "%s%cmode=lease", base, strchr(base, '?') ? '&' : '?');
    if ((rc = dlock_client_open(&c.lease, dl_url, NULL)) != DLOCK_OK)
        bench_die("dlock_client_open: %s (%s)", dlock_strerror(rc), dlock_error_message());
    snprintf(dl_url, sizeof dl_url, "%s%cmode=advisory", base, strchr(base, '?') ? '&' : '?');
    if ((rc = dlock_client_open(&c.adv, dl_url, NULL)) != DLOCK_OK)
        bench_die("dlock_client_open: %s (%s)", dlock_strerror(rc), dlock_error_message());
    snprintf(c.lease_name, sizeof c.lease_name, "dlock-bench:pg:lease:%d", (int)getpid());
    snprintf(c.adv_name, sizeof c.adv_name, "dlock-bench:pg:adv:%d", (int)getpid());

    /* The raw side: its own lock name and key, the same table (made by
     * dlock_client_open above), the same statements. */
    raw.pg = PQconnectdb(conninfo);
    if (PQstatus(raw.pg) != CONNECTION_OK)
        bench_die("postgres %s: %s", bench_redacted(url), PQerrorMessage(raw.pg));
    {
        char name[64];
        snprintf(name, sizeof name, "dlock:dlock-bench:pg:raw:%d", (int)getpid());
        for (size_t i = 0; name[i]; i++)
            snprintf(raw.name_hex + 2 * i, 3, "%02x", (unsigned char)name[i]);
        snprintf(raw.holder, sizeof raw.holder, "bench %d 0", (int)getpid());
        snprintf(raw.key, sizeof raw.key, "%lld", 0x5eed0000LL + getpid());
    }
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    snprintf(sql, sizeof sql, dlock__pg_acquire_tmpl, TABLE, SEQ);
    prepare(raw.pg, "lease_acquire", sql);
    snprintf(sql, sizeof sql, dlock__pg_release_tmpl, TABLE);
    prepare(raw.pg, "lease_release", sql);
    snprintf(sql, sizeof sql, dlock__pg_adv_acquire_tmpl, 10000LL, SEQ); /* bench_cycle's lease */
    prepare(raw.pg, "adv_acquire", sql);
    snprintf(sql, sizeof sql, dlock__pg_adv_release_tmpl, TABLE);
    prepare(raw.pg, "adv_release", sql);
#pragma GCC diagnostic pop
    prepare(raw.pg, "bare_lock", "SELECT pg_try_advisory_lock($1::bigint)");
    prepare(raw.pg, "bare_unlock", "SELECT pg_advisory_unlock($1::bigint)");
    prepare(raw.pg, "select1", "SELECT 1");
    snprintf(version, sizeof version, "%d.%d", PQserverVersion(raw.pg) / 10000,
             PQserverVersion(raw.pg) % 10000);

    printf("dlock-bench: dlock %s, PostgreSQL %s at %s%s\n", dlock_version(), version,
           bench_redacted(url), own ? " (started by this run)" : "");
    printf("  %ld cycles each, interleaved one by one; one connection for the raw "
           "statements\n\n",
           iterations);
    double p50[S_N], req[S_N], conn[S_N];
    bench_sql_measure(&c, one, S_N, iterations, s, p50, req, conn);
    bench_sql_print_header();
    for (int w = 0; w < S_N; w++) {
        char b[64] = "";
        int dl = w == S_LEASE || w == S_ADV;
        int vs = w == S_LEASE ? S_LEASE_RAW : S_ADV_RAW;
        if (dl)
            snprintf(b, sizeof b, "raw p50 %.1f", p50[vs]);
        bench_print_row(labels[w], p50[w], bench_series_us(&s[w], 99), -1, dl ? b : NULL,
                        dl ? p50[w] / p50[vs] : -1, dl ? TARGET : 0);
        if (w == S_ADV) {
            snprintf(b, sizeof b, "bare p50 %.1f", p50[S_ADV_BARE]);
            bench_print_row("  the same, against the bare lock+unlock", -1, -1, -1, b,
                            p50[w] / p50[S_ADV_BARE], TARGET);
        }
    }
    bench_sql_print_sends(labels, S_N, req, conn);
    printf("\nratio: dlock cycle p50 / the p50 of the same statements sent raw; requests\n"
           "without pipelining are round trips.\n");

    for (int w = 0; w < S_N; w++)
        free(s[w].v);
    PQfinish(raw.pg);
    dlock_client_free(c.lease);
    dlock_client_free(c.adv);
    if (own)
        pg_stop();
    return 0;
}
