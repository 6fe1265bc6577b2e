/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The C side of bench.py: N uncontended cycles (dlock_acquire, try once,
 * 30 s lease, no watchdog; dlock_release) on URL, each timed, after N/10
 * unrecorded; prints the p50 and p99 in microseconds. Built by bench.py
 * (and by the Node binding's bench.js) with cc against the tree's headers
 * and libdlock.
 *
 *   cycle URL NAME N [watch]
 *
 * watch: each lock with an on_lost, as the Node binding sets one on every
 * lock (for lock.signal): a lock that is not renewed is then still watched
 * for its lease's end, and bench.js prints that cycle beside the plain one
 * to show what the watch costs.
 */
#include <dlock/dlock.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    fprintf(stderr, "cycle: a lock was lost (%s)\n", dlock_strerror(reason));
}

int main(int argc, char **argv)
{
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;
    dlock_client *c = NULL;
    long n = argc == 4 || argc == 5 ? strtol(argv[3], NULL, 10) : 0;
    int64_t *t;

    if (n <= 0 || (argc == 5 && strcmp(argv[4], "watch") != 0)) {
        fprintf(stderr, "usage: cycle URL NAME N [watch]\n");
        return 2;
    }
    if (argc == 5)
        o.on_lost = on_lost;
    if ((t = calloc((size_t)n, sizeof(*t))) == NULL || dlock_client_open(&c, argv[1], NULL) != 0) {
        fprintf(stderr, "cycle: %s\n", dlock_error_message());
        return 1;
    }
    o.auto_renew = 0;
    for (long i = -n / 10; i < n; i++) {
        dlock_lock *l;
        int64_t t0 = now_ns();
        if (dlock_acquire(&l, c, argv[2], &o) != 0 || dlock_release(l) != 0) {
            fprintf(stderr, "cycle: %s\n", dlock_error_message());
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
