/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A private PostgreSQL server for tests: initdb into a temporary folder and
 * postgres on a free loopback port of 47300-47399, run as nobody when the
 * test runs as root (PostgreSQL refuses root), trust authentication for
 * user dlock (over TCP, SCRAM for user secret, password "s3cret", and a
 * clear-text password for user clear, password "c1ear"),
 * pg_stat_statements loaded to count the backend's statements.
 */
#ifndef DLOCK_TEST_PG_H
#define DLOCK_TEST_PG_H

#include "test.h"

typedef struct test_pg {
    int port;
    int pid;        /* the postmaster; 0 while stopped */
    char dir[64];   /* data in dir/data, the log in dir/log */
    char url[160];  /* postgres://dlock@127.0.0.1:PORT/postgres */
    int tls;        /* ssl=on (test_pg_start_tls) */
} test_pg;

/* Start it; exits the test with a clear message when PostgreSQL is missing
 * or does not start. The server goes with the test process. */
void test_pg_start(test_pg *p);
/* The same with TLS on (ssl=on), its certificate for db.example alone,
 * signed by t's ca (made into t's folder as db.crt and db.key): reach it
 * as host=db.example with hostaddr=127.0.0.1. */
void test_pg_start_tls(test_pg *p, const test_tls *t);
/* Stop it (immediate) and start it again on the same port and data. */
void test_pg_restart(test_pg *p);
/* Stop it and remove its folder. */
void test_pg_stop(test_pg *p);
/* Run sql (printf-style) as the superuser; the first column of the first
 * row as a number (0 when none or NULL); the test fails on an error. */
long long test_pg_query(test_pg *p, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* SIGSTOP (paused 1) or SIGCONT the postmaster and every backend. */
void test_pg_pause(test_pg *p, int paused);

/* The advisory key of name under key prefix "dlock:" (as the backend
 * computes it: FNV-1a 64). */
unsigned long long test_pg_advisory_key(const char *name);

#endif
