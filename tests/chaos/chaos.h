/*
 * The fault harness (after Jepsen): worker processes take a lock and do a
 * read-modify-write of a register in a separate store that checks fencing
 * tokens; nemeses pause, kill and partition them and the server; every event
 * goes into a history with CLOCK_MONOTONIC times, and a checker reads the
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
 * t_us is CLOCK_MONOTONIC in microseconds (one clock for every process of
 * the machine; a client clock jump under libfaketime does not move it).
 * worker is the worker id (-1 for the runner).
 *
 *   kind        a        b         c
 *   open_fail   rc
 *   acq_start
 *   acq_ok      fence
 *   acq_fail    rc
 *   read        fence    value     1 accepted, 0 refused (stale fence), -1 store error
 *   write       fence    new value 1 / 0 / -1 as read
 *   lost        fence    reason                       (on_lost, watchdog thread)
 *   wait_lost   fence    waited ms 1 if on_lost came
 *   rel_start   fence
 *   rel_end     fence    rc
 *   wall        unix s                                 (the worker's time(NULL))
 *   exit        code
 * Runner (worker -1, or the target's id in a):
 *   stop cont kill       worker   fence held or 0
 *   server_kill server_up
 *   proxy       mode     delay ms
 *   clock       offset s
 */
#define CHAOS_HISTORY_LINE 160

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

typedef struct {
    int64_t final_value;
    int64_t writes;   /* accepted writes */
    int64_t lost;     /* accepted writes not based on the value before them */
    int64_t dup;      /* new values written more than once */
} chaos_store_report;

int chaos_store_check(const char *path, chaos_store_report *out, char *err, size_t errsize);

int64_t chaos_now_us(void);

#endif
