/*
 * The client and lock handle as the core sees them. Not part of the public
 * API: the public header only has opaque typedefs.
 */
#ifndef DLOCK_CORE_CLIENT_H
#define DLOCK_CORE_CLIENT_H

#include <pthread.h>
#include <stdatomic.h>

#include "core/token.h"
#include "dlock/sys/backend.h"

struct dlock_client {
    const dlock_backend *backend;
    void *be;
    dlock_url url;

    /* Everything below is guarded by mu. The watchdog thread and the callers
     * meet here: the list of live locks, their renewal times and whether the
     * watchdog has one of them in its hands (busy). */
    pthread_mutex_t mu;
    pthread_cond_t wake; /* something for the watchdog to look at */
    pthread_cond_t idle; /* a lock left the watchdog's hands */
    pthread_t thread;
    int thread_running;
    int stopping;
    /* When the sleeping watchdog plans to wake (INT64_MAX: when told), or -1
     * while it is awake and will look at every lock again anyway. A caller
     * wakes it only for a lock due before then: waking it on every acquire
     * cost a context switch per lock cycle. */
    int64_t sleep_until_ms;
    dlock_lock *locks; /* doubly linked through prev/next */
};

struct dlock_lock {
    dlock_client *client; /* NULL once the client was freed under it */
    char *name;
    char owner[DLOCK_OWNER_LEN + 1];
    uint64_t fence;
    int auto_renew;
    dlock_lost_cb on_lost;
    void *payload;

    /* Guarded by client->mu. */
    int64_t lease_ms;
    int64_t next_event_ms; /* next renewal (auto_renew) or deadline check */
    int busy;              /* renewal in flight or on_lost running */
    int releasing;         /* dlock_release has taken it out of the watchdog's view */
    int callback_due;      /* lost, on_lost not yet called */
    int retry_count;       /* renewals in a row that could not reach the server */
    dlock_lock *prev, *next;

    /* Read by any thread without the mutex. lost_message is written once,
     * before lost_reason is set (release order). */
    _Atomic int64_t deadline_ms; /* CLOCK_MONOTONIC ms when the lease runs out */
    _Atomic int lost_reason;     /* 0, or DLOCK_ELOST / DLOCK_ECONN */
    char lost_message[256];
};

/* Put a new lock under the client's care (watchdog renewal and deadline
 * checks), starting the watchdog thread on first use. */
int dlock__client_register(dlock_client *c, dlock_lock *l);

/* Take the lock out of the watchdog's hands; waits while a renewal or its
 * on_lost is running. DLOCK_EMISUSE when called from inside its on_lost. */
int dlock__client_unregister(dlock_client *c, dlock_lock *l);

/* Record that the lock is lost (first reason wins) and have the watchdog call
 * on_lost. Caller holds c->mu. */
void dlock__lock_mark_lost(dlock_lock *l, int reason, const char *message);

/* Validate a lock name (non-empty, at most DLOCK_NAME_MAX bytes). */
int dlock__check_name(const char *name, const char *what);

/* Write a printable, bounded form of a lock name for messages. */
const char *dlock__printable(char *buf, size_t size, const char *name);

/* Wake the watchdog if l needs it before it planned to wake. Caller holds
 * c->mu. */
void dlock__watchdog_poke(dlock_client *c, const dlock_lock *l);

void dlock__watchdog_stop(dlock_client *c);

#endif
