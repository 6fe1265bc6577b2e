/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Throughput: threads calling one operation in a loop until told to stop,
 * counted in slices of time (bench.h, bench_throughput). The default table's
 * rows (main.c) and --redlock's (redlock.c) use it.
 */
#include "bench.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#define SLICE_MS 100
#define WARM_UP 50
#define MAX_THREADS 64

typedef struct {
    void (*op)(void *arg);
    void *arg;
    pthread_barrier_t *start;
    atomic_int *stop;
    _Alignas(64) atomic_ullong ops; /* read by the measuring thread as it runs */
} worker;

static void *worker_main(void *p)
{
    worker *w = p;

    /* A few untimed operations first, on the thread's own connection. */
    for (int i = 0; i < WARM_UP; i++)
        w->op(w->arg);
    pthread_barrier_wait(w->start);
    while (!atomic_load_explicit(w->stop, memory_order_relaxed)) {
        w->op(w->arg);
        atomic_fetch_add_explicit(&w->ops, 1, memory_order_relaxed);
    }
    return NULL;
}

static uint64_t total(worker *w, int n)
{
    uint64_t sum = 0;

    for (int i = 0; i < n; i++)
        sum += atomic_load_explicit(&w[i].ops, memory_order_relaxed);
    return sum;
}

double bench_throughput(int nthreads, double seconds, void (*op)(void *arg), void *const *args)
{
    worker w[MAX_THREADS];
    pthread_t t[MAX_THREADS];
    pthread_barrier_t start;
    atomic_int stop = 0;
    long slices = (long)(seconds * 1000 / SLICE_MS);

    if (nthreads < 1 || nthreads > MAX_THREADS)
        bench_die("bench_throughput: %d threads (1 to %d)", nthreads, MAX_THREADS);
    if (slices < 1)
        slices = 1;
    double *rate = calloc((size_t)slices, sizeof(*rate));
    if (rate == NULL)
        bench_die("out of memory");
    pthread_barrier_init(&start, NULL, (unsigned)nthreads + 1);
    for (int i = 0; i < nthreads; i++) {
        w[i].op = op;
        w[i].arg = args[i];
        w[i].start = &start;
        w[i].stop = &stop;
        atomic_init(&w[i].ops, 0);
        if (pthread_create(&t[i], NULL, worker_main, &w[i]) != 0)
            bench_die("pthread_create failed");
    }
    pthread_barrier_wait(&start);
    int64_t t0 = bench_now_ns();
    uint64_t ops0 = total(w, nthreads);
    for (long k = 0; k < slices; k++) {
        struct timespec ts = {0, (long)SLICE_MS * 1000000};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
        int64_t t1 = bench_now_ns();
        uint64_t ops1 = total(w, nthreads);
        rate[k] = (double)(ops1 - ops0) * 1e9 / (double)(t1 - t0);
        t0 = t1;
        ops0 = ops1;
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < nthreads; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&start);
    bench_sort_doubles(rate, (size_t)slices);
    double median = slices % 2 ? rate[slices / 2] : (rate[slices / 2 - 1] + rate[slices / 2]) / 2;
    free(rate);
    return median;
}
