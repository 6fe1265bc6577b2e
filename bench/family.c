/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock-bench, the lock family: hand-off latency of the fair lock, the
 * read-write lock and the semaphore (one permit), measured like the mutex
 * hand-off in main.c and printed
 * as rows of the same table (docs/bench.md, docs/family.md).
 *
 * A takes the lock, lets B start waiting for it, holds it HOLD_MS (long
 * enough for B to be asleep in its wait: for the fair lock, queued), then
 * notes t0 and releases. B notes t1 as its acquire returns. The figure is
 * t1 - t0. A and B have clients of their own.
 */
#include "bench.h"

#include <dlock/dlock.h>

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define HOLD_MS 2

typedef struct {
    dlock_client *client;
    const char *name;
    int kind;
    long count;
    sem_t go, done;
    int64_t b_start, b_end; /* written by B before it posts done */
} family_handoff;

static void die_dlock(const char *what, int rc)
{
    bench_die("%s: %s (%s)", what, dlock_strerror(rc), dlock_error_message());
}

static void sem_wait_all(sem_t *s)
{
    while (sem_wait(s) != 0) {
    }
}

static void *waiter_b(void *arg)
{
    family_handoff *h = arg;
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;

    o.kind = h->kind;
    o.wait_ms = 30000;
    o.permits = h->kind == DLOCK_KIND_SEMAPHORE ? 1 : 0;
    for (long i = 0; i < h->count; i++) {
        dlock_lock *lock = NULL;
        int rc;
        sem_wait_all(&h->go);
        h->b_start = bench_now_ns();
        rc = dlock_acquire(&lock, h->client, h->name, &o);
        h->b_end = bench_now_ns();
        if (rc != DLOCK_OK)
            die_dlock("family hand-off: B's dlock_acquire", rc);
        if ((rc = dlock_release(lock)) != DLOCK_OK)
            die_dlock("family hand-off: B's dlock_release", rc);
        sem_post(&h->done);
    }
    return NULL;
}

/*
 * count timed hand-offs (after warm untimed ones) from A holding kind_a to
 * B waiting for kind_b. Fills p50 and p99 (us); returns how many times B
 * got the lock before A released it (must be 0).
 */
static long measure(const char *url, const char *name, int kind_a, int kind_b, long count,
                    long warm, double *p50, double *p99)
{
    dlock_client *ca = NULL, *cb = NULL;
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;
    family_handoff h;
    bench_series lat = {0};
    long early = 0;
    pthread_t tb;
    int rc;

    if ((rc = dlock_client_open(&ca, url, NULL)) != DLOCK_OK ||
        (rc = dlock_client_open(&cb, url, NULL)) != DLOCK_OK)
        die_dlock("dlock_client_open", rc);
    memset(&h, 0, sizeof(h));
    h.client = cb;
    h.name = name;
    h.kind = kind_b;
    h.count = count + warm;
    sem_init(&h.go, 0, 0);
    sem_init(&h.done, 0, 0);
    if (pthread_create(&tb, NULL, waiter_b, &h) != 0)
        bench_die("pthread_create failed");
    o.kind = kind_a;
    o.permits = kind_a == DLOCK_KIND_SEMAPHORE ? 1 : 0;
    for (long i = 0; i < count + warm; i++) {
        struct timespec hold = {0, HOLD_MS * 1000000L};
        dlock_lock *lock = NULL;
        int64_t t0;
        if ((rc = dlock_acquire(&lock, ca, name, &o)) != DLOCK_OK)
            die_dlock("family hand-off: A's dlock_acquire", rc);
        sem_post(&h.go);
        while (clock_nanosleep(CLOCK_MONOTONIC, 0, &hold, &hold) == EINTR) {
        }
        t0 = bench_now_ns();
        if ((rc = dlock_release(lock)) != DLOCK_OK)
            die_dlock("family hand-off: A's dlock_release", rc);
        sem_wait_all(&h.done);
        if (i < warm)
            continue;
        if (h.b_end < t0)
            early++;
        bench_series_add(&lat, h.b_end - t0);
    }
    pthread_join(tb, NULL);
    sem_destroy(&h.go);
    sem_destroy(&h.done);
    dlock_client_free(ca);
    dlock_client_free(cb);
    *p50 = bench_series_us(&lat, 50);
    *p99 = bench_series_us(&lat, 99);
    free(lat.v);
    return early;
}

long bench_family(const char *url, const char *key_base, long count, double ping50_us,
                  double mutex_handoff50_us)
{
    static const struct {
        const char *label, *suffix;
        int a, b;
    } rows[] = {
        {"fair hand-off release -> head's acquire", "fair", DLOCK_KIND_FAIR, DLOCK_KIND_FAIR},
        {"rw hand-off writer -> waiting reader", "rw-wr", DLOCK_KIND_WRITE, DLOCK_KIND_READ},
        {"rw hand-off last reader -> writer", "rw-rw", DLOCK_KIND_READ, DLOCK_KIND_WRITE},
        {"semaphore (1 permit) hand-off", "sem", DLOCK_KIND_SEMAPHORE, DLOCK_KIND_SEMAPHORE},
    };
    char ping[64], mutex[64];
    long early = 0;

    snprintf(ping, sizeof(ping), "PING p50 %.1f", ping50_us);
    snprintf(mutex, sizeof(mutex), "mutex hand-off %.1f", mutex_handoff50_us);
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        char name[160];
        double p50, p99;
        snprintf(name, sizeof(name), "%s:%s", key_base, rows[i].suffix);
        early += measure(url, name, rows[i].a, rows[i].b, count, 20, &p50, &p99);
        bench_print_row(rows[i].label, p50, p99, -1, ping, p50 / ping50_us, 0);
        bench_print_row("  the same, against the mutex hand-off", -1, -1, -1, mutex,
                        p50 / mutex_handoff50_us, 0);
    }
    return early;
}
