/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What a SQL cycle sends: send() and connect() of this process counted on
 * their way to libc. libpq and MariaDB Connector/C write each request with
 * one send() (a statement, or a batch of them sent together), so the sends
 * of a cycle are its requests, and with nothing pipelined its round trips;
 * a connect() is a new session. Defined in the program, these take the
 * place of libc's for every library it loads (the symbols are looked up in
 * the program first); they only count.
 */
#include "bench.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <stdatomic.h>
#include <sys/socket.h>

static atomic_long sends, connects;

ssize_t send(int fd, const void *buf, size_t len, int flags)
{
    static ssize_t (*real)(int, const void *, size_t, int);

    if (real == NULL)
        *(void **)&real = dlsym(RTLD_NEXT, "send");
    atomic_fetch_add(&sends, 1);
    return real(fd, buf, len, flags);
}

int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
    static int (*real)(int, const struct sockaddr *, socklen_t);

    if (real == NULL)
        *(void **)&real = dlsym(RTLD_NEXT, "connect");
    atomic_fetch_add(&connects, 1);
    return real(fd, addr, len);
}

void bench_sql_count(long *out_sends, long *out_connects)
{
    *out_sends = atomic_load(&sends);
    *out_connects = atomic_load(&connects);
}

void bench_sql_measure(void *ctx, bench_sql_one_fn one, int n, long iterations, bench_series *s,
                       double *p50, double *req, double *conn)
{
    memset(s, 0, (size_t)n * sizeof(*s));
    for (int w = 0; w < n; w++) /* warm-up: connections, plans */
        for (long i = 0; i < iterations / 10 + 10; i++)
            one(ctx, w, NULL);
    for (long i = 0; i < iterations; i++)
        for (int w = 0; w < n; w++)
            one(ctx, w, &s[w]);
    for (int w = 0; w < n; w++) {
        long s0, c0, s1, c1;

        p50[w] = bench_series_us(&s[w], 50);
        bench_sql_count(&s0, &c0);
        for (long i = 0; i < 200; i++)
            one(ctx, w, NULL);
        bench_sql_count(&s1, &c1);
        req[w] = (double)(s1 - s0) / 200.0;
        conn[w] = (double)(c1 - c0) / 200.0;
    }
}

void bench_sql_print_header(void)
{
    printf("%-40s %8s %8s %9s  %-20s %6s  %-7s %s\n", "measurement", "p50 us", "p99 us",
           "ops/s", "baseline", "ratio", "target", "result");
}

void bench_sql_print_sends(const char *const *labels, int n, const double *req,
                           const double *conn)
{
    printf("\nwhat a cycle sends (200 cycles, counted at send() and connect()):\n");
    for (int w = 0; w < n; w++)
        printf("  %-40s %5.2f requests  %5.2f new sessions\n", labels[w], req[w], conn[w]);
}
