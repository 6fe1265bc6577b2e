/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The client and lock handle as the core sees them. Not part of the public
 * API: the public header only has opaque typedefs.
 */
#ifndef DLOCK_CORE_CLIENT_H
#define DLOCK_CORE_CLIENT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "core/token.h"
#include "dlock/sys/backend.h"

/* A client's counters (dlock_stats), each updated atomically. */
typedef struct {
    _Atomic uint64_t acquires, busy, waits, handoffs, renewals, renew_failures, losses;
    _Atomic uint64_t round_trip_us[DLOCK_STATS_BUCKETS];
    _Atomic uint64_t wait_us[DLOCK_STATS_BUCKETS];
    _Atomic uint64_t round_trip_us_sum, wait_us_sum;
} dlock__counters;

/* A waiting acquisition's watch, listed on its client so that
 * dlock_client_interrupt can wake it. Lives on the waiter's stack. */
typedef struct dlock__waiter {
    void *watch;
    struct dlock__waiter *next, **prev; /* prev: the pointer to this one */
} dlock__waiter;

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
    /* A lock may have on_lost due (watchdog.c): set by lock_mark_lost,
     * cleared by a look at every lock that found none. */
    int callbacks_pending;
    /* The shortest time from registration to a lock's first event seen so
     * far (0: none yet). With no lock to watch, the watchdog still wakes
     * this often, so that a new lock whose first event comes no sooner
     * needs no wake-up: its acquisition costs no context switch. */
    int64_t idle_period_ms;
    dlock_lock *locks; /* doubly linked through prev/next */
    /* DLOCK_CLIENT_NO_THREADS: no watchdog thread; dlock_async_process runs
     * its steps (dlock__watchdog_step), on step_thread while stepping, with
     * at most one renewal batch in flight (wd_batch, wd_inflight). */
    int no_threads;
    int stepping;
    pthread_t step_thread;
    int wd_inflight;
    struct dlock__wd_batch *wd_batch;
    /* The watches of the acquisitions waiting now, for dlock_client_interrupt
     * to wake. */
    dlock__waiter *waiting;

    /* dlock_client_interrupt was called: no call waits any more. Read
     * without the mutex. */
    _Atomic int interrupted;
    /* The write end of the pipe dlock_client_interrupt writes to (-1 until
     * a call first waits), and the thread that reads it and wakes the
     * waiters (operator.c). */
    _Atomic int interrupt_fd;
    int interrupt_read;
    pthread_t interrupt_thread;

    /* The log and the trace hook (client options), the ids of the traced
     * calls, and the counters (dlock_client_stats). */
    dlock_log_cb log;
    void *log_payload;
    int log_level;
    dlock_trace_cb trace;
    void *trace_payload;
    _Atomic uint64_t last_call_id;
    dlock__counters stats;

    /* The asynchronous API's engine (async.c), made by its first call. */
    struct dlock__async *async;
};

struct dlock_lock {
    dlock_client *client; /* NULL once the client was freed under it */
    char *name;
    char token[DLOCK__TOKEN_LEN + 1]; /* this acquisition's own token */
    uint64_t fence;
    int auto_renew;
    dlock_lost_cb on_lost;
    void *payload;

    /* The lock family (family.c). kind changes only by downgrade, under
     * client->mu. owner is the caller's owner id (NULL: the token owns). */
    _Atomic int kind;
    char *owner;
    int reentrant;
    int permits;
    char *identity;
    char *holder; /* the record of who holds it (dlock_request.holder) */
    /* A multi-lock holds its locks as parts, each a plain lock under the
     * watchdog whose on_lost reports to the parent; the parent itself is
     * never registered. parts are in the caller's order. */
    dlock_lock **parts;
    size_t nparts;
    dlock_lock *parent;
    _Atomic int parent_fired; /* the parent's on_lost was called */

    /* Guarded by client->mu. */
    int64_t lease_ms;
    int64_t next_event_ms; /* next renewal (auto_renew) or deadline check */
    int busy;              /* renewal in flight or on_lost running */
    int claimers;          /* callers waiting in dlock__client_claim */
    int releasing;         /* dlock_release has taken it out of the watchdog's view */
    int callback_due;      /* lost, on_lost not yet called */
    int retry_count;       /* renewals in a row that could not reach the server */
    dlock_lock *prev, *next;

    /* Read by any thread without the mutex. lost_message is written once,
     * before lost_reason is set (release order). */
    _Atomic int64_t deadline_ms; /* lease clock (core/clock.h) ms when the lease runs out */
    _Atomic int lost_reason;     /* 0, or DLOCK_ELOST / DLOCK_ECONN */
    char lost_message[256];

    /* Acquired by dlock_acquire_async with an on_lost: what carries it to
     * the loop's thread (async.c; on_lost is then the relay's). */
    struct dlock__relay *relay;
};

/* How long after a confirmed renewal the next one is due: a third of the
 * lease (Redisson's rule), at least 1 ms so that tiny leases do not renew
 * back to back. */
static inline int64_t dlock__renew_period(int64_t lease_ms)
{
    return lease_ms >= 3 ? lease_ms / 3 : 1;
}

/* Put a new lock under the client's care (watchdog renewal and deadline
 * checks), starting the watchdog thread on first use. */
/* The backend serving scheme (built in or registered), or NULL: a table
 * of the current size, whatever the size of the one registered, which
 * *given (when not NULL) is set to. */
const dlock_backend *dlock__find_backend(const char *scheme, const dlock_backend **given);
/* Load the backend module for scheme and serve its schemes (module.c). */
int dlock__module_load(const char *scheme, const dlock_backend **out);
/* The i-th scheme of the modules dlock ships (module.c's list), with its
 * module's name in *module; NULL past the end. */
const char *dlock__module_scheme(size_t i, const char **module);
/* Whether module.so is where dlock__module_load would look for it. */
int dlock__module_installed(const char *module);

/* In a set-user-id (AT_SECURE) process, remove once from the environment
 * the variables that a library dlock loads would trust (module.c has the
 * list and why), each named in a warning on c's log. Called by
 * dlock_client_open before any backend or library is set up. */
void dlock__clear_trusted_env(dlock_client *c);

int dlock__client_register(dlock_client *c, dlock_lock *l);

/* Take the lock out of the watchdog's hands; waits while a renewal or its
 * on_lost is running. DLOCK_EMISUSE when called from inside its on_lost. */
int dlock__client_unregister(dlock_client *c, dlock_lock *l);

/* Record that the lock is lost (first reason wins) and have the watchdog call
 * on_lost. Caller holds c->mu. */
void dlock__lock_mark_lost(dlock_lock *l, int reason, const char *message);

/* The family request for l (borrowing its strings). */
void dlock__lock_request(dlock_request *req, const dlock_lock *l);
/* Give back, by token, whatever reqs[0..n) may hold on the server (an
 * acquire whose outcome is not known); best effort, each release traced,
 * and the caller's error message stays. */
void dlock__give_back(dlock_client *c, const dlock_request *reqs, size_t n);

/* DLOCK_ENOTSUP with a message naming the backend and what it lacks. */
int dlock__not_supported(const dlock_client *c, const char *what);

/* A new handle for an acquisition of name as o (checked) describes, with a
 * fresh token; not yet held or registered. */
int dlock__lock_new(dlock_lock **out, dlock_client *c, const char *name,
                    const dlock_acquire_options *o, const char *identity);

/* Start a held lock's lease bookkeeping from from_ms (the lease clock time
 * the winning request was sent). Before it is registered. */
void dlock__lock_start(dlock_lock *l, int64_t from_ms);

/*
 * Acquire one lock as described by o (already checked), for dlock_acquire,
 * dlock_campaign (o->kind LEADER, identity) and the parts of a multi-lock.
 * Clears nothing and takes ownership of nothing on failure.
 */
int dlock__acquire(dlock_lock **out, dlock_client *c, const char *name,
                   const dlock_acquire_options *o, const char *identity);

/* Check acquire options (version, ranges, family fields); NULL = defaults. */
int dlock__check_acquire_options(dlock_acquire_options *o, const dlock_acquire_options *given);

/* Free a handle's memory (not its parts). */
void dlock__lock_free(dlock_lock *l);

/* 1 if the caller is the watchdog thread running l's on_lost. Caller does
 * not hold c->mu. */
int dlock__client_in_callback(dlock_client *c, const dlock_lock *l);

/* Take l out of the watchdog's hands (busy) for a call that changes what
 * the server holds for it, so that no renewal of the old state runs
 * meanwhile; waits while a renewal or its on_lost runs. DLOCK_EMISUSE from
 * inside its on_lost. dlock__client_unclaim gives it back. */
int dlock__client_claim(dlock_client *c, dlock_lock *l);
void dlock__client_unclaim(dlock_client *c, dlock_lock *l);

/* DLOCK_EINTR with its message once dlock_client_interrupt was called, else
 * DLOCK_OK. name is the lock waited for. */
int dlock__check_interrupt(dlock_client *c, const char *name);

/* List a waiting call's watch on the client (w is the caller's), so that
 * dlock_client_interrupt wakes it; take it off before watch_end. */
void dlock__waiting_add(dlock_client *c, dlock__waiter *w, void *watch);
void dlock__waiting_remove(dlock_client *c, dlock__waiter *w);
/* watch_wake every waiting call's watch (c->mu keeps them alive meanwhile):
 * dlock_client_interrupt's thread, and the async engine's cancel and free
 * for acquisitions blocked in watch_wait on threads of their own. */
void dlock__waiting_wake_all(dlock_client *c);

/* Validate a lock name (non-empty, at most DLOCK_NAME_MAX bytes). */
int dlock__check_name(const char *name, const char *what);

/* Write a printable, bounded form of a lock name for messages. */
const char *dlock__printable(char *buf, size_t size, const char *name);

/* Wake the watchdog if l needs it before it planned to wake. Caller holds
 * c->mu. */
void dlock__watchdog_poke(dlock_client *c, const dlock_lock *l);

void dlock__watchdog_stop(dlock_client *c);

/* DLOCK_CLIENT_NO_THREADS: one step of the watchdog on this thread (from
 * dlock_async_process): the on_lost due, and the renewals due sent without
 * waiting. Returns when it must run again (lease-clock ms), -1: when told
 * (dlock__async_wake). */
int64_t dlock__watchdog_step(dlock_client *c);

/* Have the loop call dlock_async_process (without threads: the watchdog's
 * plan changed). Any thread; c->mu may be held. */
void dlock__async_wake(dlock_client *c);

/* ---- async.c: the asynchronous API's engine ---- */

/* dlock_client_free's first step: cancel the client's requests, run their
 * callbacks, stop the engine's threads. 1 when called from inside one of
 * its callbacks: the free is finished by dlock_async_process, and the
 * caller returns at once. */
int dlock__async_free_begin(dlock_client *c);
/* Its last, after the watchdog stopped: free the engine. */
void dlock__async_free_end(dlock_client *c);
/* A release of l began: its on_lost is no longer carried to the loop. */
void dlock__async_forget(dlock_lock *l);
/* Free l's relay (dlock__lock_free). */
void dlock__async_relay_free(dlock_lock *l);

/* dlock_release of one lock in two halves, around the backend's release
 * call: begin takes it out of the watchdog's hands (DLOCK_OK), or fails
 * (DLOCK_EMISUSE: its client is gone, and it is freed; or from inside its
 * on_lost); end makes the result of the call rc what dlock_release returns
 * (a loss known or a lease that ran out before *called) and frees l. */
int dlock__release_begin(dlock_lock *l, int64_t *called);
int dlock__release_end(dlock_lock *l, int64_t called, int rc);

/* dlock_lock_extend of a single lock in two halves, for the asynchronous
 * API without threads: _begin claims l from the watchdog and believes the
 * shorter lease from *sent on; _end (rc: the server's answer) counts
 * lease_ms from sent, or marks the lock lost, and lets it go. */
int dlock__extend_begin(dlock_lock *l, int64_t lease_ms, int64_t *sent);
int dlock__extend_end(dlock_lock *l, int64_t lease_ms, int64_t sent, int rc);

/* Is the client's backend able to serve l (kind, owner ids)? DLOCK_ENOTSUP
 * with a message naming what it lacks. */
int dlock__lock_supported(dlock_client *c, const dlock_lock *l);

/* ---- operator.c: holder records, log, counters, interruption ---- */

/* A new holder record for an acquisition with label (may be NULL):
 * "HOST PID START_MS[ LABEL]". NULL when out of memory. */
char *dlock__holder_new(const char *label);

/* Complete a backend's dlock_lock_info: one that did not count its holders
 * (holders 0) gets holders 1 when held, and kind -1 (not known). */
void dlock__info_settle(dlock_lock_info *info);

/* Call the client's log, if any, with a printf-style message; the error
 * message of the thread is left as it was. */
void dlock__log(dlock_client *c, int level, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Add one to a counter; add a time of us microseconds to a histogram and
 * its sum. */
#define dlock__count(c, field) atomic_fetch_add(&(c)->stats.field, 1)
void dlock__histogram_add(_Atomic uint64_t *hist, _Atomic uint64_t *sum_us, int64_t us);

/*
 * One call to the server: dlock__call_begin just before it is sent,
 * dlock__call_end with its result when it returns, never with the client's
 * mutex held. They trace it (the client's trace hook), log it at
 * DLOCK_LOG_DEBUG and, for a call of DLOCK__CALL_TIMED, add its time to the
 * round-trip histogram (the calls for a held or wanted lock: tries,
 * release, extend, check, renewal batches).
 */
#define DLOCK__CALL_TIMED 1
typedef struct {
    const char *call; /* static: "acquire", "renew", ... */
    const char *name; /* borrowed, or NULL for a call on many locks */
    size_t count;
    int flags;
    uint64_t id;
    int64_t start_us;
} dlock__call;

void dlock__call_begin(dlock_client *c, dlock__call *k, const char *call, const char *name,
                       size_t count, int flags);
/* Returns rc, and leaves the thread's error message as it was. */
int dlock__call_end(dlock_client *c, const dlock__call *k, int rc);

/* Start the thread that wakes the waiters on dlock_client_interrupt, if it
 * is not running (before a call first waits). DLOCK_OK, or an error with
 * its message when no pipe or thread can be made. */
int dlock__interrupt_ready(dlock_client *c);
/* Stop it (dlock_client_free). */
void dlock__interrupt_stop(dlock_client *c);

#endif
