/* SPDX-License-Identifier: BSD-3-Clause */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "test_pg.h"
#include "test_server.h"

/* The folder of initdb and postgres: PATH's, else Debian's newest. */
static const char *bindir(void)
{
    static char dir[256];
    glob_t g;

    if (dir[0])
        return dir;
    if (glob("/usr/lib/postgresql/*/bin/initdb", 0, NULL, &g) == 0 && g.gl_pathc > 0) {
        snprintf(dir, sizeof(dir), "%s", g.gl_pathv[g.gl_pathc - 1]);
        *strrchr(dir, '/') = '\0';
        globfree(&g);
        return dir;
    }
    if (access("/usr/local/bin/initdb", X_OK) == 0)
        return strcpy(dir, "/usr/local/bin");
    fprintf(stderr, "the PostgreSQL server (initdb, postgres) is not installed; install it "
            "with: apt-get install postgresql\n");
    exit(1);
}

/* Run as nobody when root: PostgreSQL refuses to run as root. */
static void drop_root(void)
{
    if (getuid() == 0) {
        struct passwd *pw = getpwnam("nobody");
        if (pw == NULL || setgid(pw->pw_gid) != 0 || setuid(pw->pw_uid) != 0)
            _exit(126);
    }
}

static test_pg *running[8];
static pid_t starter;

static void stop_all(void)
{
    if (getpid() != starter)
        return; /* a forked child's exit leaves the server alone */
    for (int i = 0; i < 8; i++)
        if (running[i] != NULL && running[i]->pid > 0)
            test_pg_stop(running[i]);
}

/* Start postgres on p->port. 0 when it answers on its own socket, -1 when it
 * exited at start (another test took the port between test__port_free and the
 * bind: try another). Readiness is asked on the Unix socket in p->dir, which
 * only this server can have: over TCP another test's server on the same
 * port would answer, and this test would go on with that one. */
static int spawn(test_pg *p)
{
    char port[16], data[96], log[96], own[200];

    snprintf(port, sizeof(port), "%d", p->port);
    snprintf(data, sizeof(data), "%s/data", p->dir);
    snprintf(log, sizeof(log), "%s/log", p->dir);
    p->pid = fork();
    if (p->pid == 0) {
        char exe[300];
        int fd;

        drop_root();
        /* After setuid, which clears it: the server dies with the test. */
        prctl(PR_SET_PDEATHSIG, SIGQUIT);
        fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        snprintf(exe, sizeof(exe), "%s/postgres", bindir());
        execl(exe, "postgres", "-D", data, "-p", port, "-k", p->dir, "-c",
              "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=on",
              "-c", "shared_preload_libraries=pg_stat_statements", "-c", "max_connections=200",
              "-c", p->tls ? "ssl=on" : "ssl=off", "-c", "ssl_cert_file=../db.crt", "-c",
              "ssl_key_file=../db.key", (char *)NULL);
        _exit(127);
    }
    snprintf(own, sizeof(own), "host=%s port=%d user=dlock dbname=postgres", p->dir, p->port);
    for (int i = 0; i < 3000; i++) {
        int status;
        if (waitpid(p->pid, &status, WNOHANG) == p->pid) {
            char cmd[160];
            fprintf(stderr, "postgres exited at start on port %d (status %d); its log:\n",
                    p->port, status);
            snprintf(cmd, sizeof(cmd), "cat %s >&2", log);
            if (system(cmd) != 0)
                fprintf(stderr, "(no log)\n");
            p->pid = 0;
            return -1;
        }
        if (PQping(own) == PQPING_OK)
            return 0;
        test_sleep_ms(20);
    }
    fprintf(stderr, "postgres did not start on port %d in 60 s\n", p->port);
    exit(1);
}

/* A server certificate for db.example (and nothing else) from t's CA, as
 * DIR/db.crt and DIR/db.key, owned by the server's user. */
static void server_cert(test_pg *p, const test_tls *t)
{
    char cmd[1200];

    snprintf(cmd, sizeof(cmd),
             "cd %s && { [ -f db.crt ] || { openssl req -newkey rsa:2048 -nodes -keyout db.key "
             "-out db.csr -subj /CN=db.example && echo subjectAltName=DNS:db.example >db.ext && "
             "openssl x509 -req -in db.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 "
             "-extfile db.ext -out db.crt; }; } >>openssl.log 2>&1 && cp db.crt db.key %s/ && "
             "chmod 600 %s/db.key && { [ $(id -u) != 0 ] || chown nobody %s/db.crt %s/db.key; }",
             t->dir, p->dir, p->dir, p->dir, p->dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "making the certificate of db.example in %s failed (openssl.log)\n",
                t->dir);
        exit(1);
    }
}

static void start(test_pg *p, const test_tls *t)
{
    char data[96], cmd[600];
    int status, pid, i, tries;

    memset(p, 0, sizeof(*p));
    snprintf(p->dir, sizeof(p->dir), "/tmp/dlock-pg-XXXXXX");
    CHECK(mkdtemp(p->dir) != NULL);
    CHECK(chmod(p->dir, 0777) == 0);
    snprintf(data, sizeof(data), "%s/data", p->dir);
    pid = fork();
    if (pid == 0) {
        char exe[300], pw[96];
        int fd = open("/dev/null", O_WRONLY);
        FILE *f;

        drop_root();
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        snprintf(pw, sizeof(pw), "%s/pw", p->dir);
        if ((f = fopen(pw, "w")) == NULL)
            _exit(125);
        fputs("super\n", f);
        fclose(f);
        snprintf(exe, sizeof(exe), "%s/initdb", bindir());
        execl(exe, "initdb", "-D", data, "-U", "dlock", "--auth=trust", "-E", "UTF8",
              "--no-sync", (char *)NULL);
        _exit(127);
    }
    CHECK(waitpid(pid, &status, 0) == pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "initdb in %s failed (status %d)\n", data, status);
        exit(1);
    }
    /* Passwords over TCP for user secret (SCRAM) and user clear (in clear
     * text, as a man in the middle would ask); trust for the rest. */
    snprintf(cmd, sizeof(cmd),
             "sed -i -e '1i host all secret 127.0.0.1/32 scram-sha-256' -e '1i host all clear "
             "127.0.0.1/32 password' %s/pg_hba.conf",
             data);
    CHECK(system(cmd) == 0);
    if (t != NULL) {
        server_cert(p, t);
        p->tls = 1;
    }
    for (i = 0, tries = 0; i < 200; i++) {
        p->port = 47300 + (int)((getpid() + i * 7) % 100);
        if (!test__port_free(p->port))
            continue;
        snprintf(p->url, sizeof(p->url), "postgres://dlock@127.0.0.1:%d/postgres", p->port);
        if (spawn(p) == 0)
            break;
        CHECK(++tries < 5);
    }
    CHECK(i < 200);
    for (i = 0; i < 8 && running[i] != NULL && running[i] != p; i++)
        ;
    if (i < 8) {
        if (starter == 0) {
            starter = getpid();
            atexit(stop_all);
        }
        running[i] = p;
    }
    test_pg_query(p, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
    test_pg_query(p, "CREATE ROLE secret LOGIN SUPERUSER PASSWORD 's3cret';"
                     "CREATE ROLE clear LOGIN SUPERUSER PASSWORD 'c1ear'");
}

void test_pg_start(test_pg *p)
{
    start(p, NULL);
}

void test_pg_start_tls(test_pg *p, const test_tls *t)
{
    start(p, t);
}

static void stop_server(test_pg *p)
{
    if (p->pid <= 0)
        return;
    kill(p->pid, SIGCONT);
    kill(p->pid, SIGQUIT); /* immediate shutdown: backends go too */
    waitpid(p->pid, NULL, 0);
    p->pid = 0;
}

void test_pg_restart(test_pg *p)
{
    stop_server(p);
    CHECK(spawn(p) == 0); /* the same port: its clients reconnect there */
}

void test_pg_stop(test_pg *p)
{
    char cmd[128];

    stop_server(p);
    /* p may be on a stack that ends after this: stop_all must not see it. */
    for (int i = 0; i < 8; i++)
        if (running[i] == p)
            running[i] = NULL;
    if (p->dir[0]) {
        snprintf(cmd, sizeof(cmd), "rm -rf %s", p->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", p->dir);
        p->dir[0] = '\0';
    }
}

long long test_pg_query(test_pg *p, const char *fmt, ...)
{
    char sql[2048];
    va_list ap;
    PGconn *c;
    PGresult *r;
    long long v = 0;

    va_start(ap, fmt);
    vsnprintf(sql, sizeof(sql), fmt, ap);
    va_end(ap);
    c = PQconnectdb(p->url);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "test_pg_query: connect: %s", PQerrorMessage(c));
        exit(1);
    }
    r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK && PQresultStatus(r) != PGRES_COMMAND_OK) {
        fprintf(stderr, "test_pg_query: %s: %s", sql, PQerrorMessage(c));
        exit(1);
    }
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0 && !PQgetisnull(r, 0, 0))
        v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    PQfinish(c);
    return v;
}

/* Signal pid and its descendants (the postmaster's backends). */
static void signal_tree(int pid, int sig)
{
    char path[96], buf[4096];
    FILE *f;

    kill(pid, sig);
    snprintf(path, sizeof(path), "/proc/%d/task/%d/children", pid, pid);
    if ((f = fopen(path, "r")) == NULL)
        return;
    if (fgets(buf, sizeof(buf), f) != NULL)
        for (char *t = strtok(buf, " \n"); t != NULL; t = strtok(NULL, " \n"))
            kill(atoi(t), sig);
    fclose(f);
}

void test_pg_pause(test_pg *p, int paused)
{
    signal_tree(p->pid, paused ? SIGSTOP : SIGCONT);
}

unsigned long long test_pg_advisory_key(const char *name)
{
    unsigned long long h = 1469598103934665603ULL;
    const char *prefix = "dlock:";

    for (const char *q = prefix; *q; q++)
        h = (h ^ (unsigned char)*q) * 1099511628211ULL;
    for (const char *q = name; *q; q++)
        h = (h ^ (unsigned char)*q) * 1099511628211ULL;
    return h;
}
