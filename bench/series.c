/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock-bench: latency samples and their percentiles (bench.h,
 * bench_series), and the sort of throughput's rates. Every section of the
 * benchmark keeps its samples and reads its figures through these, so that
 * all of them mean the same thing.
 */
#include "bench.h"

#include <stdlib.h>

void bench_series_add(bench_series *s, int64_t ns)
{
    if (s->n == s->cap) {
        /* Doubling keeps a series of n samples to about log2(n) reallocs. */
        size_t cap = s->cap ? s->cap * 2 : 64;
        int64_t *v = realloc(s->v, cap * sizeof *v);
        if (v == NULL)
            bench_die("out of memory");
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = ns;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return (x > y) - (x < y);
}

double bench_series_us(bench_series *s, double p)
{
    size_t rank;

    if (s->n == 0)
        return 0;
    qsort(s->v, s->n, sizeof *s->v, cmp_i64);
    rank = (size_t)(p / 100.0 * (double)s->n + 0.999999);
    rank = rank < 1 ? 1 : rank > s->n ? s->n : rank;
    return (double)s->v[rank - 1] / 1000.0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

void bench_sort_doubles(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
}
