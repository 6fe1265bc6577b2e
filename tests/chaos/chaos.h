/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The fault harness (after Jepsen): worker processes take a lock and do a
 * read-modify-write of a register in a separate store that checks fencing
 * tokens; nemeses pause, kill and partition them and the server; every event
 * goes into a history with CLOCK_BOOTTIME times, and a checker reads the
 * history and the store afterwards.
 *
 * This header is what the runner (chaos.c) and the worker (chaos_worker.c)
 * share: the history's line format, the live state each worker publishes
 * for the nemeses, and the store.
 */
#ifndef DLOCK_CHAOS_H
#define DLOCK_CHAOS_H

#include <stdatomic.h>
#include <stdint.h>

/* ---- the history --------------------------------------------------------
 * One text line per event, written with a single write(2) by the process
 * (and thread) that saw it, to a file of its own:
 *
 *     <t_us> <worker> <kind> <a> <b> <c>
 *
 * t_us is CLOCK_BOOTTIME in microseconds, the clock the library counts
 * leases on: one clock for every process of the machine, read with the raw
 * system call, so neither a wall clock jump nor anything preloaded
 * (libfaketime) moves it. worker is the worker id (-1 for the runner).
 *
 *   kind        a        b         c
 *   open_fail   rc
 *   acq_start
 *   acq_ok      fence    on_lost   shared: 1 for a read lock (chaos --kind rw), 2 for
 *                                 a semaphore's permit (--kind sem), else 0;
 *                                 on_lost: 1 if the handle has an on_lost
 *   acq_fail    rc
 *   valid       fence    deadline  shared; the holder's belief, logged before every
 *                                 store step: it holds the lock until t_us deadline
 *                                 (now + dlock_lock_valid_ms(), or what a broken
 *                                 worker of the self-test believes instead)
 *   read        fence    value     1 accepted, 0 refused (stale fence), -1 store error
 *   write       fence    new value 1 / 0 / -1 as read
 *   lost        fence    reason                       (on_lost, watchdog thread)
 *   wait_lost   fence    waited ms 1 if on_lost came (logged when the holder saw
 *                                 its loss: dlock_lock_lost, or the store refused it)
 *   nested      rc                 (--kind rw: a nested read taken, wait 0)
 *   outer_rel   rc                 (the outer read released first)
 *   nested_rel  rc                 (the nested read released before the hold ends)
 *   rel_start   fence    deadline  lost: just before the release, the deadline the
 *                                 handle gives (now + dlock_lock_valid_ms()) and
 *                                 dlock_lock_lost()
 *   rel_end     fence    rc
 *   wall        unix s                                 (the worker's time(NULL))
 *   exit        code
 * Runner (worker -1, or the target's id in a):
 *   stop cont kill       worker   fence held or 0
 *   server_kill server_up  node  nodes cut off meanwhile (a mask; leader-kill: 0)
 *   leader_kill node               (leader-kill: the member that led, killed)
 *   elected     node     ms        (the member that leads next, ms after the kill)
 *   proxy       mode     delay ms
 *   proxy_drop  connections closed
 *   clock       offset s
 */
#define CHAOS_HISTORY_LINE 160

/* --kind sem: the semaphore's N. */
#define CHAOS_SEM_PERMITS 3

/* ---- what each worker publishes for the nemeses -------------------------
 * A shared file mapped by the runner and every worker: slot i belongs to the
 * worker running in slot i. The runner reads it to pick a holder to pause or
 * kill, preferring one between its store transactions (so a pause does not
 * hold the store's write lock, which no real database would allow for long). */
enum {
    PHASE_IDLE = 0,
    PHASE_ACQUIRING,
    PHASE_IN_STORE, /* holding, inside a store transaction */
    PHASE_THINKING, /* holding, between the read and the write */
    PHASE_RELEASING,
};

typedef struct {
    _Atomic int pid;
    _Atomic int id;
    _Atomic int phase;
    _Atomic uint64_t fence;
} chaos_slot;

#define CHAOS_MAX_WORKERS 64

/* ---- the fenced store ---------------------------------------------------
 * An SQLite file: one register (value) and the highest fence it has seen,
 * checked in the same transaction as every read and write: a fence lower
 * than the highest is refused. Every accepted write is also appended to a
 * log, from which the checker finds lost or duplicated updates. */
typedef struct chaos_store chaos_store;

int chaos_store_create(const char *path, char *err, size_t errsize);
int chaos_store_open(chaos_store **out, const char *path);
void chaos_store_close(chaos_store *s);
/* 1 accepted (*value set), 0 refused, -1 error. Registers the fence. */
int chaos_store_read(chaos_store *s, uint64_t fence, int64_t *value);
/* Write read_value + 1 if fence is still the highest. 1 / 0 / -1. */
int chaos_store_write(chaos_store *s, uint64_t fence, int64_t read_value, int worker);
/* The self-test's skip-fence worker: the same write with no fence check
 * (logged like any other). 1 / -1. */
int chaos_store_write_unfenced(chaos_store *s, uint64_t fence, int64_t read_value, int worker);
/* The highest fence the store has seen, or -1 on error (the self-test's
 * worker that skips the lock passes it off as its own). */
int64_t chaos_store_highest(chaos_store *s);

typedef struct {
    int64_t final_value;
    int64_t writes;   /* accepted writes */
    int64_t lost;     /* accepted writes not based on the value before them */
    int64_t dup;      /* new values written more than once */
    int64_t fence_down; /* writes applied with a fence below an earlier write's */
} chaos_store_report;

int chaos_store_check(const char *path, chaos_store_report *out, char *err, size_t errsize);

/* CLOCK_BOOTTIME in microseconds, by the system call itself (never a
 * preloaded clock_gettime). */
int64_t chaos_now_us(void);

/* ---- broken workers, for `chaos --self-test` -----------------------------
 * Each must make its row FAIL; the checker is only worth its verdicts if it
 * sees every one of them. */
enum {
    CHAOS_OK = 0,       /* the correct worker */
    CHAOS_NO_LOCK,      /* never takes the lock; passes off the store's fence as its own */
    CHAOS_REUSE_FENCE,  /* gives every later hold its first hold's fence */
    CHAOS_IGNORE_LOST,  /* never looks at on_lost or the lease: believes it holds until it releases */
    CHAOS_RAW_DEL,      /* releases by deleting the lock key, whoever holds it (no owner check) */
    CHAOS_SLOW_CLOCK,   /* renews and believes by a clock that runs at a quarter of the speed */
    CHAOS_SUPPRESS_LOST, /* sets on_lost, which never tells it anything (a library whose
                          * on_lost never fires) */
    CHAOS_SKIP_FENCE,   /* writes the register without the store's fence check */
    CHAOS_NEVER_RELEASE, /* "releases" by doing nothing: the lock stays held and renewed */
    CHAOS_BROKEN_COUNT
};
/* Their names on the command line ("ok", "no-lock", ...). */
extern const char *const chaos_broken_names[CHAOS_BROKEN_COUNT];

#endif
