/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Library threads and signals. The application owns its signals: dlock's
 * threads block them all, so no handler ever runs on a library thread (and
 * no EINTR fails a reconnect there), and a write to a dead server never kills
 * the process with SIGPIPE.
 */
#ifndef DLOCK_CORE_THREAD_H
#define DLOCK_CORE_THREAD_H

#include <pthread.h>
#include <signal.h>

/* pthread_create with every signal blocked in the new thread. */
int dlock__thread_create(pthread_t *thread, void *(*fn)(void *), void *arg);

/* Around I/O on a caller's thread: hold back SIGPIPE, and swallow one raised
 * meanwhile unless it was already pending before (then it is the
 * application's). */
typedef struct {
    sigset_t old;
    int was_pending;
} dlock__sigpipe_guard;

void dlock__sigpipe_block(dlock__sigpipe_guard *g);
void dlock__sigpipe_restore(dlock__sigpipe_guard *g);

#endif
