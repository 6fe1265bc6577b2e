/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Throwaway MariaDB servers for the tests (test.h, "private MariaDB
 * servers"). mariadb-install-db takes seconds, so one data directory is
 * made once per user and server binary (under a file lock), with the test
 * account and database in it, and each server starts on a copy of it:
 * mariadbd --no-defaults on a port of 47400..47499 and a socket in the
 * test's own directory. As root, mariadbd needs --user=root.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <mysql.h>

#include "test.h"

static const char *mariadbd_path(void)
{
    static const char *const paths[] = {"/usr/sbin/mariadbd", "/usr/sbin/mysqld",
                                        "/usr/bin/mariadbd", NULL};

    for (int i = 0; paths[i] != NULL; i++)
        if (access(paths[i], X_OK) == 0)
            return paths[i];
    fprintf(stderr, "no mariadbd: install it (apt-get install mariadb-server)\n");
    exit(1);
}

/* A port of 47400..47499 nobody listens on. */
static int mariadb_port(void)
{
    int start = (int)(getpid() % 100);

    for (int i = 0; i < 100; i++) {
        int port = 47400 + (start + i) % 100, fd = socket(AF_INET, SOCK_STREAM, 0), ok;
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
        if (fd >= 0)
            close(fd);
        if (ok)
            return port;
    }
    fprintf(stderr, "no free port in 47400..47499\n");
    exit(1);
}

static void run(const char *cmd)
{
    if (system(cmd) != 0) {
        fprintf(stderr, "failed: %s\n", cmd);
        exit(1);
    }
}

static void spawn_on(test_mariadb *m, const char *datadir, int port)
{
    char a_datadir[160], a_socket[160], a_port[32], a_pid[160], a_log[160], a_tmp[160];
    char a_cert[160], a_key[160], a_ca[160];
    char *args[28];
    int n = 0;

    snprintf(a_datadir, sizeof(a_datadir), "--datadir=%s", datadir);
    snprintf(a_socket, sizeof(a_socket), "--socket=%s", m->sock);
    snprintf(a_port, sizeof(a_port), "--port=%d", port);
    snprintf(a_pid, sizeof(a_pid), "--pid-file=%s/mariadbd.pid", m->dir);
    snprintf(a_log, sizeof(a_log), "--log-error=%s/err.log", m->dir);
    /* Its own: temporary tables are named by the server's pid, and servers
     * in other pid namespaces share /tmp. */
    snprintf(a_tmp, sizeof(a_tmp), "--tmpdir=%s", m->dir);
    args[n++] = "mariadbd";
    args[n++] = "--no-defaults";
    args[n++] = a_datadir;
    args[n++] = a_socket;
    args[n++] = a_port;
    args[n++] = a_pid;
    args[n++] = a_log;
    args[n++] = a_tmp;
    args[n++] = "--bind-address=127.0.0.1";
    args[n++] = "--skip-name-resolve";
    args[n++] = "--skip-log-bin";
    args[n++] = "--innodb-buffer-pool-size=16M";
    args[n++] = "--innodb-log-file-size=8M";
    args[n++] = "--innodb-use-native-aio=0";
    args[n++] = "--performance-schema=0";
    args[n++] = "--max-connections=400";
    args[n++] = "--open-files-limit=4096";
    if (geteuid() == 0)
        args[n++] = "--user=root"; /* mariadbd refuses root without it */
    if (m->tls_dir[0] != '\0') {
        snprintf(a_cert, sizeof(a_cert), "--ssl-cert=%s/%s.crt", m->tls_dir, m->tls_cert);
        snprintf(a_key, sizeof(a_key), "--ssl-key=%s/%s.key", m->tls_dir, m->tls_cert);
        snprintf(a_ca, sizeof(a_ca), "--ssl-ca=%s/ca.crt", m->tls_dir);
        args[n++] = a_cert;
        args[n++] = a_key;
        args[n++] = a_ca;
    }
    args[n] = NULL;
    m->pid = fork();
    if (m->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execv(mariadbd_path(), args);
        fprintf(stderr, "cannot run mariadbd: %s\n", strerror(errno));
        _exit(127);
    }
}

static MYSQL *root_conn(const test_mariadb *m)
{
    MYSQL *c = mysql_init(NULL);
    unsigned t = 10;

    mysql_options(c, MYSQL_OPT_CONNECT_TIMEOUT, &t);
    mysql_options(c, MYSQL_OPT_READ_TIMEOUT, &t);
    if (mysql_real_connect(c, "localhost", "root", NULL, NULL, 0, m->sock, 0) == NULL) {
        mysql_close(c);
        return NULL;
    }
    return c;
}

/* 1 if the server's log says its port was taken (by a server another test
 * started between our check and its bind). */
static int port_taken(const test_mariadb *m)
{
    char cmd[200];

    snprintf(cmd, sizeof(cmd), "grep -q 'Address already in use' %s/err.log", m->dir);
    return system(cmd) == 0;
}

/* Wait until the server answers; 1 if it exited because its port was
 * taken (try another), else the test ends with its log. */
static int wait_up(test_mariadb *m)
{
    for (int i = 0; i < 6000; i++) {
        int status;
        MYSQL *c;
        if (waitpid(m->pid, &status, WNOHANG) == m->pid) {
            char cmd[200];
            m->pid = 0;
            if (port_taken(m))
                return 1;
            fprintf(stderr, "mariadbd exited at start (status %d); its log:\n", status);
            snprintf(cmd, sizeof(cmd), "tail -20 %s/err.log >&2", m->dir);
            if (system(cmd) != 0) {
            }
            exit(1);
        }
        if ((c = root_conn(m)) != NULL) {
            mysql_close(c);
            return 0;
        }
        test_sleep_ms(20);
    }
    fprintf(stderr, "mariadbd did not start in %s\n", m->dir);
    exit(1);
}

/* The data directory every test server copies, made once. */
static const char *template_dir(void)
{
    static char dir[128];
    char lock[160], data[200], cmd[700];
    struct stat st;
    int fd;

    if (stat(mariadbd_path(), &st) != 0) {
        perror("stat mariadbd");
        exit(1);
    }
    snprintf(dir, sizeof(dir), "/tmp/dlock-mariadb-template-%u-%lld", (unsigned)geteuid(),
             (long long)st.st_mtime);
    snprintf(data, sizeof(data), "%s/data", dir);
    if (stat(data, &st) == 0)
        return dir;
    snprintf(lock, sizeof(lock), "%s.lock", dir);
    if ((fd = open(lock, O_CREAT | O_RDWR | O_CLOEXEC, 0600)) < 0 || flock(fd, LOCK_EX) != 0) {
        perror(lock);
        exit(1);
    }
    if (stat(data, &st) != 0) {
        test_mariadb m;
        MYSQL *c;
        static const char *const setup[] = {
            "CREATE USER 'dlock'@'%' IDENTIFIED BY 'dlockpw'",
            "GRANT ALL ON *.* TO 'dlock'@'%'",
            "CREATE DATABASE dlock_test",
            "SHUTDOWN",
        };

        snprintf(cmd, sizeof(cmd), "rm -rf %s/tmp && mkdir -p %s/tmp", dir, dir);
        run(cmd);
        snprintf(cmd, sizeof(cmd),
                 "mariadb-install-db --no-defaults --datadir=%s/tmp/data --skip-test-db"
                 " --auth-root-authentication-method=normal --innodb-log-file-size=8M %s"
                 " > %s/tmp/install.log 2>&1 || { tail -20 %s/tmp/install.log >&2; exit 1; }",
                 dir, geteuid() == 0 ? "--user=root" : "", dir, dir);
        run(cmd);
        memset(&m, 0, sizeof(m));
        snprintf(m.dir, sizeof(m.dir), "%s/tmp", dir);
        snprintf(m.sock, sizeof(m.sock), "%s/tmp/sock", dir);
        snprintf(cmd, sizeof(cmd), "%s/tmp/data", dir);
        for (;;) {
            char log[160];
            snprintf(log, sizeof(log), "%s/err.log", m.dir);
            unlink(log); /* a taken port is read from this attempt's log */
            spawn_on(&m, cmd, mariadb_port());
            if (wait_up(&m) == 0)
                break;
        }
        if ((c = root_conn(&m)) == NULL) {
            fprintf(stderr, "cannot connect to the template server\n");
            exit(1);
        }
        for (size_t i = 0; i < sizeof(setup) / sizeof(setup[0]); i++)
            if (mysql_query(c, setup[i]) != 0) {
                fprintf(stderr, "%s: %s\n", setup[i], mysql_error(c));
                exit(1);
            }
        mysql_close(c);
        waitpid(m.pid, NULL, 0);
        snprintf(cmd, sizeof(cmd), "rm -f %s/tmp/data/ibtmp1 && mv %s/tmp/data %s/data", dir,
                 dir, dir);
        run(cmd);
    }
    flock(fd, LOCK_UN);
    close(fd);
    return dir;
}

/* Servers of this process, killed at exit even when a check failed. */
static test_mariadb *my_started[4];
static pid_t my_owner;

static void mariadb_cleanup(void)
{
    if (getpid() != my_owner)
        return;
    for (int i = 0; i < 4; i++)
        if (my_started[i] != NULL)
            test_mariadb_stop(my_started[i]);
}

static void start_with(test_mariadb *m, const test_tls *t, const char *cert)
{
    char cmd[400], data[120];
    const char *tpl = template_dir();

    if (my_owner == 0) {
        my_owner = getpid();
        atexit(mariadb_cleanup);
    }
    for (int i = 0; i < 4; i++)
        if (my_started[i] == NULL || my_started[i] == m) {
            my_started[i] = m;
            break;
        }
    memset(m, 0, sizeof(*m));
    if (t != NULL) {
        snprintf(m->tls_dir, sizeof(m->tls_dir), "%s", t->dir);
        snprintf(m->tls_cert, sizeof(m->tls_cert), "%s", cert);
    }
    snprintf(m->dir, sizeof(m->dir), "/tmp/dlock-my-XXXXXX");
    if (mkdtemp(m->dir) == NULL) {
        perror("mkdtemp");
        exit(1);
    }
    snprintf(m->sock, sizeof(m->sock), "%s/sock", m->dir);
    snprintf(cmd, sizeof(cmd), "cp -a %s/data %s/data", tpl, m->dir);
    run(cmd);
    snprintf(data, sizeof(data), "%s/data", m->dir);
    for (int tries = 0;; tries++) {
        m->port = mariadb_port();
        spawn_on(m, data, m->port);
        if (wait_up(m) == 0)
            break;
        if (tries == 20) {
            fprintf(stderr, "no port of 47400..47499 stayed free for mariadbd\n");
            exit(1);
        }
        snprintf(cmd, sizeof(cmd), "rm -f %s/err.log", m->dir);
        run(cmd);
    }
    snprintf(m->url, sizeof(m->url), "mysql://dlock:dlockpw@127.0.0.1:%d/dlock_test", m->port);
}

void test_mariadb_start(test_mariadb *m)
{
    start_with(m, NULL, NULL);
}

void test_mariadb_start_tls(test_mariadb *m, const test_tls *t, const char *cert)
{
    start_with(m, t, cert);
}

void test_mariadb_restart(test_mariadb *m)
{
    char data[120];

    snprintf(data, sizeof(data), "%s/data", m->dir);
    spawn_on(m, data, m->port);
    if (wait_up(m) != 0) {
        fprintf(stderr, "mariadbd could not have its port %d again\n", m->port);
        exit(1);
    }
}

void test_mariadb_kill(test_mariadb *m)
{
    if (m->pid > 0) {
        kill(m->pid, SIGKILL);
        waitpid(m->pid, NULL, 0);
        m->pid = 0;
    }
}

void test_mariadb_stop(test_mariadb *m)
{
    char cmd[128];

    for (int i = 0; i < 4; i++)
        if (my_started[i] == m)
            my_started[i] = NULL;
    if (m->dir[0] == '\0')
        return;
    test_mariadb_kill(m);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", m->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", m->dir);
    m->dir[0] = '\0';
}

long long test_mariadb_query(test_mariadb *m, const char *fmt, ...)
{
    char sql[2048];
    va_list ap;
    MYSQL *c = root_conn(m);
    MYSQL_RES *res;
    MYSQL_ROW row;
    long long v = -1;

    if (c == NULL) {
        fprintf(stderr, "test_mariadb_query: cannot connect to %s\n", m->sock);
        exit(1);
    }
    va_start(ap, fmt);
    vsnprintf(sql, sizeof(sql), fmt, ap);
    va_end(ap);
    if (mysql_select_db(c, "dlock_test") != 0 || mysql_query(c, sql) != 0) {
        fprintf(stderr, "test_mariadb_query: %s: %s\n", sql, mysql_error(c));
        mysql_close(c);
        exit(1);
    }
    if ((res = mysql_store_result(c)) != NULL) {
        if ((row = mysql_fetch_row(res)) != NULL && row[0] != NULL)
            v = strtoll(row[0], NULL, 10);
        mysql_free_result(res);
    } else {
        v = (long long)mysql_affected_rows(c);
    }
    mysql_close(c);
    return v;
}
