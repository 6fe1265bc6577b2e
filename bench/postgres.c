/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock-bench --postgres: the lease-mode cycle (acquire + release, through
 * the postgres module) beside the raw round trip, `SELECT 1` on a libpq
 * connection to the same server (the connection type the module uses), and
 * their ratio. --url postgres://... is required (a PostgreSQL of the
 * caller's; no throwaway server).
 */
#include "bench.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The URL without dlock's own parameters (mode, create, table), which libpq
 * would refuse. */
static void libpq_url(char *out, size_t size, const char *url)
{
    const char *q = strchr(url, '?');
    size_t base = q ? (size_t)(q - url) : strlen(url);
    snprintf(out, size, "%.*s", (int)base, url);
    if (q == NULL)
        return;
    char *params = strdup(q + 1), *save = NULL;
    if (params == NULL)
        bench_die("out of memory");
    char sep = '?';
    for (char *p = strtok_r(params, "&", &save); p; p = strtok_r(NULL, "&", &save)) {
        if (strncmp(p, "mode=", 5) == 0 || strncmp(p, "create=", 7) == 0 ||
            strncmp(p, "table=", 6) == 0)
            continue;
        size_t n = strlen(out);
        snprintf(out + n, size - n, "%c%s", sep, p);
        sep = '&';
    }
    free(params);
}

int bench_postgres(const char *url, long iterations)
{
    if (url == NULL || (strncmp(url, "postgres://", 11) != 0 && strncmp(url, "postgresql://", 13) != 0))
        bench_die("--postgres needs --url postgres://USER@HOST:PORT/DB");
    char conninfo[1200];
    libpq_url(conninfo, sizeof conninfo, url);
    PGconn *pg = PQconnectdb(conninfo);
    if (PQstatus(pg) != CONNECTION_OK)
        bench_die("postgres %s: %s", bench_redacted(url), PQerrorMessage(pg));
    dlock_client *c = NULL;
    int rc = dlock_client_open(&c, url, NULL);
    if (rc != DLOCK_OK)
        bench_die("dlock_client_open: %s (%s)", dlock_strerror(rc), dlock_error_message());

    char name[64];
    snprintf(name, sizeof name, "dlock-bench:pg:%d", (int)getpid());
    bench_series raw = {0}, cyc = {0};
    long warm = iterations / 10 + 1;
    for (long i = 0; i < warm + iterations; i++) {
        /* Interleaved, so that both see the same load. */
        int64_t t0 = bench_now_ns();
        PGresult *res = PQexec(pg, "SELECT 1");
        if (PQresultStatus(res) != PGRES_TUPLES_OK)
            bench_die("SELECT 1: %s", PQerrorMessage(pg));
        PQclear(res);
        int64_t t1 = bench_now_ns();
        dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;
        o.auto_renew = 0;
        dlock_lock *l = NULL;
        if ((rc = dlock_acquire(&l, c, name, &o)) != DLOCK_OK)
            bench_die("dlock_acquire: %s (%s)", dlock_strerror(rc), dlock_error_message());
        if ((rc = dlock_release(l)) != DLOCK_OK)
            bench_die("dlock_release: %s (%s)", dlock_strerror(rc), dlock_error_message());
        int64_t t2 = bench_now_ns();
        if (i >= warm) {
            bench_series_add(&raw, t1 - t0);
            bench_series_add(&cyc, t2 - t1);
        }
    }
    double r50 = bench_series_us(&raw, 50), c50 = bench_series_us(&cyc, 50);
    printf("PostgreSQL %s, %ld iterations\n", bench_redacted(url), iterations);
    printf("%-38s %9s %9s  %6s\n", "", "p50 us", "p99 us", "ratio");
    printf("%-38s %9.1f %9.1f  %6.2f\n", "raw SELECT 1 (libpq)", r50, bench_series_us(&raw, 99), 1.0);
    printf("%-38s %9.1f %9.1f  %6.2f\n", "lease-mode cycle (acquire+release)", c50,
           bench_series_us(&cyc, 99), r50 > 0 ? c50 / r50 : -1);
    free(raw.v);
    free(cyc.v);
    dlock_client_free(c);
    PQfinish(pg);
    return 0;
}
