/* SPDX-License-Identifier: BSD-3-Clause */
#include <time.h>

#include "core/thread.h"

int dlock__thread_create(pthread_t *thread, void *(*fn)(void *), void *arg)
{
    sigset_t all, old;
    int rc;

    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(thread, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

void dlock__sigpipe_block(dlock__sigpipe_guard *g)
{
    sigset_t pipe_only, pending;

    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    sigpending(&pending);
    g->was_pending = sigismember(&pending, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_only, &g->old);
}

void dlock__sigpipe_restore(dlock__sigpipe_guard *g)
{
    sigset_t pipe_only, pending;

    if (!g->was_pending && !sigismember(&g->old, SIGPIPE)) {
        sigemptyset(&pipe_only);
        sigaddset(&pipe_only, SIGPIPE);
        sigpending(&pending);
        if (sigismember(&pending, SIGPIPE)) {
            struct timespec zero = {0, 0};
            sigtimedwait(&pipe_only, NULL, &zero);
        }
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}
