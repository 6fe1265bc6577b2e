/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A work queue in PostgreSQL with no distributed lock at all (the seeds'
 * pitfall list: "a lock so that only one worker takes each job" is a queue,
 * not a lock). Each worker claims the oldest pending job with
 * `SELECT ... FOR UPDATE SKIP LOCKED` inside its transaction
 * (pg_queue_claim, examples/pg_resource.c), marks it done and commits:
 * workers never wait for each other and never take the same job, and a
 * worker that dies mid-job leaves it pending (its transaction rolls back).
 *
 *   pg_queue CONNINFO [WORKERS [JOBS]]     defaults: 4 workers, 200 jobs
 *
 * It first shows the point on two connections: while A holds job 1 in an
 * open transaction, B's claim returns job 2 at once (lock_timeout 10 s: a
 * claim that waited for A would fail instead). Then WORKERS processes
 * drain JOBS jobs and it checks that every job was done exactly once.
 * Exit 0 if so, 1 otherwise. Works in a schema of its own, dropped at the end.
 */
#include "pg_resource.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *conninfo;
static char schema[64];

static PGconn *connect_db(void)
{
    PGconn *c = PQconnectdb(conninfo);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "pg_queue: connecting: %s", PQerrorMessage(c));
        PQfinish(c);
        return NULL;
    }
    char sql[160];
    snprintf(sql, sizeof sql, "SET search_path TO %s; SET lock_timeout = '10s'", schema);
    PQclear(PQexec(c, sql));
    return c;
}

static int run(PGconn *c, const char *sql)
{
    PGresult *res = PQexec(c, sql);
    int ok = PQresultStatus(res) == PGRES_COMMAND_OK || PQresultStatus(res) == PGRES_TUPLES_OK;
    if (!ok)
        fprintf(stderr, "pg_queue: %s: %s", sql, PQerrorMessage(c));
    PQclear(res);
    return ok ? 0 : -1;
}

/* One worker: claim, work, commit, until the queue is empty. */
static int worker(int n)
{
    PGconn *c = connect_db();
    if (c == NULL)
        return 1;
    for (;;) {
        int64_t id;
        if (run(c, "BEGIN") != 0)
            break;
        int got = pg_queue_claim(c, "job", &id);
        if (got <= 0) {
            if (got < 0)
                fprintf(stderr, "pg_queue: claim: %s", pg_resource_error(c));
            run(c, "ROLLBACK");
            PQfinish(c);
            return got < 0;
        }
        char sql[160];
        snprintf(sql, sizeof sql,
                 "UPDATE job SET status = 'done', worker = %d WHERE id = %lld;"
                 "INSERT INTO done(id, worker) VALUES (%lld, %d)",
                 n, (long long)id, (long long)id, n);
        if (run(c, sql) != 0 || run(c, "COMMIT") != 0)
            break;
    }
    PQfinish(c);
    return 1;
}

static long long query_num(PGconn *c, const char *sql)
{
    PGresult *res = PQexec(c, sql);
    long long v = -1;
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
        v = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
    else
        fprintf(stderr, "pg_queue: %s: %s", sql, PQerrorMessage(c));
    PQclear(res);
    return v;
}

/* While A holds one job in its transaction, B claims another without waiting. */
static int show_skip(void)
{
    PGconn *a = connect_db(), *b = connect_db();
    int rc = 1;
    int64_t ja = 0, jb = 0;
    if (a == NULL || b == NULL)
        goto out;
    if (run(a, "BEGIN") != 0 || pg_queue_claim(a, "job", &ja) != 1 || run(b, "BEGIN") != 0)
        goto out;
    int got = pg_queue_claim(b, "job", &jb);
    if (got != 1) {
        fprintf(stderr, "pg_queue: B claimed nothing while A held job %lld: %s", (long long)ja,
                got < 0 ? pg_resource_error(b) : "(no row)\n");
        goto out;
    }
    if (jb == ja) {
        fprintf(stderr, "pg_queue: A and B both claimed job %lld\n", (long long)ja);
        goto out;
    }
    printf("A holds job %lld; B claimed job %lld without waiting\n", (long long)ja,
           (long long)jb);
    rc = 0;
out:
    /* Both roll back: the jobs stay pending for the workers. */
    if (a)
        PQclear(PQexec(a, "ROLLBACK"));
    if (b)
        PQclear(PQexec(b, "ROLLBACK"));
    PQfinish(a);
    PQfinish(b);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: pg_queue CONNINFO [WORKERS [JOBS]]\n");
        return 2;
    }
    conninfo = argv[1];
    int workers = argc > 2 ? atoi(argv[2]) : 4;
    int jobs = argc > 3 ? atoi(argv[3]) : 200;
    if (workers < 1 || workers > 64 || jobs < 2 || jobs > 1000000) {
        fprintf(stderr, "pg_queue: WORKERS 1..64, JOBS 2..1000000\n");
        return 2;
    }
    snprintf(schema, sizeof schema, "work_queue_%d", (int)getpid());

    PGconn *c = PQconnectdb(conninfo);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "pg_queue: connecting: %s", PQerrorMessage(c));
        PQfinish(c);
        return 1;
    }
    char sql[512];
    snprintf(sql, sizeof sql,
             "CREATE SCHEMA %s; SET search_path TO %s;"
             "CREATE TABLE job(id bigint PRIMARY KEY, status text NOT NULL DEFAULT 'pending',"
             "  worker int);"
             "CREATE TABLE done(id bigint NOT NULL, worker int NOT NULL);"
             "INSERT INTO job(id) SELECT generate_series(1, %d)",
             schema, schema, jobs);
    int rc = 1;
    if (run(c, sql) != 0)
        goto out;
    if (show_skip() != 0)
        goto out;

    pid_t pids[64];
    for (int i = 0; i < workers; i++) {
        pids[i] = fork();
        if (pids[i] == 0)
            _exit(worker(i + 1));
    }
    int failed = 0;
    for (int i = 0; i < workers; i++) {
        int st;
        if (pids[i] < 0 || waitpid(pids[i], &st, 0) < 0 || !WIFEXITED(st) ||
            WEXITSTATUS(st) != 0)
            failed++;
    }
    long long done = query_num(c, "SELECT count(*) FROM done");
    long long distinct = query_num(c, "SELECT count(DISTINCT id) FROM done");
    long long pending = query_num(c, "SELECT count(*) FROM job WHERE status = 'pending'");
    long long busy = query_num(c, "SELECT count(DISTINCT worker) FROM done");
    printf("%d workers: %lld jobs done (%lld distinct), %lld pending, %lld workers did some, "
           "%d failed\n",
           workers, done, distinct, pending, busy, failed);
    if (failed == 0 && done == jobs && distinct == jobs && pending == 0) {
        printf("OK: every job done exactly once, no lock needed\n");
        rc = 0;
    }
out:
    snprintf(sql, sizeof sql, "DROP SCHEMA IF EXISTS %s CASCADE", schema);
    PQclear(PQexec(c, sql));
    PQfinish(c);
    return rc;
}
