/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bindings/python/bench/cycle.c with an on_lost set, as the Node binding
 * sets one on every lock (for lock.signal): N uncontended cycles
 * (dlock_acquire, try once, 30 s lease, no renewal, on_lost set; dlock_release)
 * on URL, each timed, after N/10 unrecorded; prints the p50 and p99 in
 * microseconds. With an on_lost, a lock that is not renewed is still
 * watched for its lease's end, so bench.js prints this beside the plain C
 * cycle to show what the watch costs. Built by bench.js with cc against the
 * tree's headers and libdlock.
 */
#include <dlock/dlock.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Never called in the bench (each lock is released long before its lease
 * ends); its presence is what is measured. */
static void on_lost(dlock_lock *lock, int reason, void *payload)
{
    (void)lock;
    (void)payload;
    fprintf(stderr, "cycle_watch: a lock was lost (%s)\n", dlock_strerror(reason));
}

int main(int argc, char **argv)
{
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;
    dlock_client *c = NULL;
    long n = argc == 4 ? strtol(argv[3], NULL, 10) : 0;
    int64_t *t;

    if (n <= 0) {
        fprintf(stderr, "usage: cycle_watch URL NAME N\n");
        return 2;
    }
    if ((t = calloc((size_t)n, sizeof(*t))) == NULL || dlock_client_open(&c, argv[1], NULL) != 0) {
        fprintf(stderr, "cycle_watch: %s\n", dlock_error_message());
        return 1;
    }
    o.auto_renew = 0;
    o.on_lost = on_lost;
    for (long i = -n / 10; i < n; i++) {
        dlock_lock *l;
        int64_t t0 = now_ns();
        if (dlock_acquire(&l, c, argv[2], &o) != 0 || dlock_release(l) != 0) {
            fprintf(stderr, "cycle_watch: %s\n", dlock_error_message());
            return 1;
        }
        if (i >= 0)
            t[i] = now_ns() - t0;
    }
    qsort(t, (size_t)n, sizeof(*t), cmp);
    printf("%.1f %.1f\n", t[n / 2] / 1000.0, t[n * 99 / 100] / 1000.0);
    dlock_client_free(c);
    free(t);
    return 0;
}
