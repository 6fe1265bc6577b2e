/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the lock family's tests share (tests/support/test_family.c): processes
 * that contend for one lock and count, on a MAP_SHARED page of atomics, who
 * is inside when the lock says nobody else may be; an observer of an
 * election that keeps what it was told; and a wait for a waiter to queue,
 * read from the client's own counters (no look at the server, so it works
 * on every backend).
 */
#ifndef DLOCK_TEST_FAMILY_H
#define DLOCK_TEST_FAMILY_H

#include <pthread.h>
#include <stdint.h>

#include "test.h"

/* ---- N processes contend and count violations ---- */

#define TEST_CONTEND_MAX_PROCS 24
#define TEST_CONTEND_MAX_TURNS 512 /* procs * turns */

typedef struct {
    const char *url;       /* each process opens its own client on it */
    const char *name;      /* the lock (DLOCK_KIND_LEADER: the election) */
    const char *const *names; /* DLOCK_KIND_MULTI: two names, taken as given by
                               * even processes and reversed by odd ones */
    const int *kinds;      /* kinds[p]: process p's kind: DLOCK_KIND_MUTEX,
                            * _FAIR, _WRITE, _READ, _SEMAPHORE, _LEADER or
                            * _MULTI */
    int procs;             /* 1..TEST_CONTEND_MAX_PROCS */
    int turns;             /* acquisitions per process */
    int permits;           /* SEMAPHORE: N */
    const char *reader_owner; /* READ: the readers' owner id (NULL: none) */
    int64_t lease_ms;      /* 0: 5000 */
    int64_t wait_ms;       /* each acquisition's wait (0: 30000); running out
                            * fails the child, so a deadlock fails the test */
    int hold_us;           /* how long a holder stays inside (0: 1000) */
    int meet;              /* > 0: on its first turn, each holder stays inside
                            * until meet holders were inside at once (at most
                            * 20 s), so that a lock letting fewer in fails,
                            * then 200 ms more, while the others try to get
                            * in, so that one letting more in fails too */
} test_contend_opts;

typedef struct {
    int violations;  /* an exclusive holder with anyone, a reader with a
                      * writer, permit holders above N, an exclusive fence not
                      * above the one before it, a permit fence issued twice */
    int max_shared;  /* most readers or permit holders inside at once */
    int turns;       /* acquisitions that succeeded */
} test_contend_result;

typedef struct test_contend test_contend;

/* Fork the processes (before the caller has threads of the library's:
 * a forked child gets none of them). They wait for test_contend_go. */
test_contend *test_contend_start(const test_contend_opts *o);
/* Let them go. */
void test_contend_go(test_contend *t);
/* Reap them (at most 90 s; then kill them and fail), fill *out, free t.
 * Fails the test if a child failed (an acquisition's error is printed by
 * the child). */
void test_contend_finish(test_contend *t, test_contend_result *out);
/* start, go, finish; fails the test on a violation. */
void test_contend_run(const test_contend_opts *o, test_contend_result *out);

/* ---- waiting for a waiter ---- */

/* Tries of client c the server answered "held by another" so far
 * (dlock_client_stats' busy). A waiter is queued after its second: the
 * core's first try of a waiting acquisition is a try-once (it leaves
 * nothing), the second is made with the waiter's watch (its place). */
uint64_t test_busy_tries(const dlock_client *c);
/* The busy tries after which a waiting acquisition of c holds its place in
 * the queue: 2 (a try, then a try with its watch), or 1 on a backend that
 * queues at once (ZooKeeper: DLOCK_CAP_QUEUE_FIRST). */
uint64_t test_tries_to_queue(const dlock_client *c);
/* Wait (at most 30 s) until c's busy tries reach want; fail otherwise. */
void test_wait_busy(const dlock_client *c, uint64_t want, const char *what);
/* Wait (at most 30 s) until *v >= want; fail otherwise. */
void test_wait_atomic(atomic_int *v, int want, const char *what);

/* ---- observers of an election ---- */

#define TEST_LEADER_SEEN 64

typedef struct {
    pthread_mutex_t mu;
    dlock_observer *obs;
    int calls;
    dlock_leader_info last;
    /* The first TEST_LEADER_SEEN reports: identity ("" for none) and fence. */
    char seen[TEST_LEADER_SEEN][DLOCK_IDENTITY_MAX + 1];
    uint64_t fences[TEST_LEADER_SEEN];
} test_leader_watch;

/* dlock_observe name on c into w (w zeroed first). Fails the test on an
 * error. */
void test_leader_watch_start(test_leader_watch *w, dlock_client *c, const char *name);
/* Wait (at most 30 s) until the last report is identity ("" for none);
 * returns its fence. Fails the test otherwise. */
uint64_t test_leader_watch_wait(test_leader_watch *w, const char *identity);
/* How many reports so far. */
int test_leader_watch_calls(test_leader_watch *w);
void test_leader_watch_stop(test_leader_watch *w);

#endif
