/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * One chaos worker: a process of a user's, on the public API only. Until its
 * end time it loops: acquire the lock, read the fenced register, think, write
 * the register + 1, release; and logs every step to its history file
 * (chaos.h) with CLOCK_BOOTTIME times. Before each store step it logs what it
 * believes: the deadline until which the library says it holds the lock
 * (now + dlock_lock_valid_ms()). The checker fails a run where two holders
 * believed at the same time.
 *
 * When it has reason to believe its lock is lost (dlock_lock_lost, or the
 * store refused its fence) it gives on_lost time to fire before it releases:
 * the checker requires on_lost for every holder that was overtaken, and the
 * contract only promises it while the handle is alive.
 *
 * With CHAOS_KIND=rw in the environment (`chaos --kind rw`) it takes a
 * read-write lock: each hold is a write (the read-modify-write above, as
 * the mutex's) or, one in two, a read, which believes and thinks but does
 * not touch the register (readers holding together have no order among
 * their fences to check it by); its events say shared (chaos.h), so the
 * checker lets readers overlap each other and nothing else. A reader reads
 * as an owner id of its own, and one read in two takes a nested read at
 * once (wait 0) and, one time in two, releases the outer read before it
 * thinks: it then holds by the nested read alone, and believes by it.
 *
 * With CHAOS_KIND=sem every hold is a permit of a semaphore of
 * CHAOS_SEM_PERMITS (shared 2), which, as a read, does not touch the
 * register. With CHAOS_KIND=fair every hold is of a fair lock, exclusive
 * as the mutex's (the same steps).
 *
 * BROKEN (chaos.h, `chaos --self-test`) makes it one of the broken workers
 * the checker must catch; "ok" or absent, the correct one.
 *
 *   chaos_worker URL NAME STORE HISTORY STATE SLOT ID LEASE_MS UNTIL_US SEED [BROKEN]
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "chaos.h"
#include "dlock/dlock.h"

static int history_fd = -1;
static int worker_id;

/* The slow clock's worker sees a quarter of the time that passes. */
#define SLOW_FACTOR 4

static void event(const char *kind, long long a, long long b, long long c)
{
    char line[CHAOS_HISTORY_LINE];
    int n = snprintf(line, sizeof(line), "%lld %d %s %lld %lld %lld\n",
                     (long long)chaos_now_us(), worker_id, kind, a, b, c);

    /* One write per line, O_APPEND: lines from the watchdog thread and the
     * main thread never interleave, and a SIGKILL loses nothing written. */
    if (write(history_fd, line, (size_t)n) != n)
        _exit(5);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* on_lost: log it, and let the main thread know. */
static _Atomic int lost_seen;
/* A nested read's fence, and the fence of the hold it belongs to (the
 * outer's, which the hold's events carry): on Redis a nested read is a
 * reader of its own, with a fence of its own, and once the outer is
 * released first the hold is the nested read's; its loss is the hold's. */
static _Atomic long long nested_fence, hold_fence;

static void on_lost(dlock_lock *lock, int reason, void *payload)
{
    long long fence = (long long)dlock_lock_fence(lock);

    (void)payload;
    if (fence != 0 && fence == atomic_load(&nested_fence))
        fence = atomic_load(&hold_fence);
    event("lost", fence, reason, 0);
    atomic_store(&lost_seen, 1);
}

/* The suppress-lost worker's: a library whose on_lost never reaches the
 * holder (the callback is set, and nothing comes of it). */
static void on_lost_suppressed(dlock_lock *lock, int reason, void *payload)
{
    (void)lock;
    (void)reason;
    (void)payload;
}

/* The never-release worker's handles: its "release" leaves them held (and
 * renewed) until it exits. */
#define KEPT_MAX 64
static dlock_lock *kept[KEPT_MAX];
static int nkept;

/* Codes a worker may get from the library under faults. Anything else
 * (EINVAL, EMISUSE, ENOMEM ...) is a bug: the worker exits 3. */
static int expected(int rc)
{
    return rc == DLOCK_OK || rc == DLOCK_EBUSY || rc == DLOCK_ETIMEOUT || rc == DLOCK_ELOST ||
           rc == DLOCK_ECONN || rc == DLOCK_ESERVER || rc == DLOCK_EAUTH;
}

/* What the worker believes before a store step: the deadline (chaos_now_us
 * time) until which it holds the lock. */
static int64_t belief(int broken, dlock_lock *lock, int64_t lease_ms, int64_t renewed_us,
                      int renew_failed)
{
    switch (broken) {
    case CHAOS_NO_LOCK:
    case CHAOS_IGNORE_LOST:
        /* Nobody told it otherwise (it does not listen): a fresh lease. */
        return chaos_now_us() + lease_ms * 1000;
    case CHAOS_SLOW_CLOCK:
        /* Its clock has seen a quarter of the time since the last renewal. */
        return renew_failed ? chaos_now_us() : renewed_us + SLOW_FACTOR * lease_ms * 1000;
    default: {
        /* The clock first: the deadline can then only come out early. */
        int64_t now = chaos_now_us();
        return now + dlock_lock_valid_ms(lock) * 1000;
    }
    }
}

/* Think for ms; the slow clock's worker renews its lock itself on the way,
 * every lease/3 by its clock (4/3 of a lease in real time: too late). */
static void think(int broken, dlock_lock *lock, long ms, int64_t lease_ms, int64_t *renewed_us,
                  int *renew_failed)
{
    int64_t end = chaos_now_us() + (int64_t)ms * 1000;

    if (broken != CHAOS_SLOW_CLOCK) {
        sleep_ms(ms);
        return;
    }
    while (chaos_now_us() < end) {
        int64_t due = *renewed_us + SLOW_FACTOR * lease_ms / 3 * 1000;
        int64_t now = chaos_now_us();
        if (!*renew_failed && now >= due) {
            int rc = dlock_lock_extend(lock, lease_ms);
            if (rc == DLOCK_OK)
                *renewed_us = now;
            else
                *renew_failed = 1;
            event("extend", (long long)dlock_lock_fence(lock), rc, 0);
            continue;
        }
        now = chaos_now_us();
        sleep_ms((long)(((*renew_failed || due > end ? end : due) - now) / 1000) + 1);
    }
}

int main(int argc, char **argv)
{
    const char *url, *name, *store_path;
    chaos_slot *slots, *me;
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_client *client = NULL;
    chaos_store *store;
    int64_t lease_ms, until_us;
    uint64_t first_fence = 0;
    unsigned seed;
    int state_fd, slot, rc, bad = 0, broken = CHAOS_OK;
    time_t last_wall = 0;
    const char *kind_env = getenv("CHAOS_KIND");
    int rw = kind_env != NULL && strcmp(kind_env, "rw") == 0;
    int sem = kind_env != NULL && strcmp(kind_env, "sem") == 0;
    int fair = kind_env != NULL && strcmp(kind_env, "fair") == 0;
    char owner[32]; /* a reader's owner id (rw) */

    if (argc != 11 && argc != 12) {
        fprintf(stderr, "usage: chaos_worker URL NAME STORE HISTORY STATE SLOT ID LEASE_MS "
                        "UNTIL_US SEED [BROKEN]\n");
        return 2;
    }
    if (argc == 12) {
        broken = -1;
        for (int i = 0; i < CHAOS_BROKEN_COUNT; i++)
            if (strcmp(argv[11], chaos_broken_names[i]) == 0)
                broken = i;
        if (broken < 0) {
            fprintf(stderr, "chaos_worker: no broken worker called '%s'\n", argv[11]);
            return 2;
        }
    }
    signal(SIGPIPE, SIG_IGN);
    url = argv[1];
    name = argv[2];
    store_path = argv[3];
    history_fd = open(argv[4], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    state_fd = open(argv[5], O_RDWR | O_CLOEXEC);
    slot = atoi(argv[6]);
    worker_id = atoi(argv[7]);
    lease_ms = atoll(argv[8]);
    until_us = atoll(argv[9]);
    seed = (unsigned)strtoul(argv[10], NULL, 10);
    snprintf(owner, sizeof(owner), "chaos-%d", worker_id);
    if (history_fd < 0 || state_fd < 0 || slot < 0 || slot >= CHAOS_MAX_WORKERS) {
        perror("chaos_worker: history or state");
        return 2;
    }
    slots = mmap(NULL, sizeof(chaos_slot) * CHAOS_MAX_WORKERS, PROT_READ | PROT_WRITE,
                 MAP_SHARED, state_fd, 0);
    if (slots == MAP_FAILED) {
        perror("chaos_worker: mmap");
        return 2;
    }
    me = &slots[slot];
    atomic_store(&me->phase, PHASE_IDLE);
    atomic_store(&me->id, worker_id);
    atomic_store(&me->pid, (int)getpid());
    if (chaos_store_open(&store, store_path) != 0) {
        fprintf(stderr, "chaos_worker: cannot open the store %s\n", store_path);
        return 2;
    }

    /* Short timeouts: a partition is noticed within a lease. */
    co.connect_timeout_ms = lease_ms;
    co.command_timeout_ms = lease_ms * 3 / 4;
    co.client_name = "chaos";
    while (client == NULL && chaos_now_us() < until_us) {
        if ((rc = dlock_client_open(&client, url, &co)) != DLOCK_OK) {
            event("open_fail", rc, 0, 0);
            if (!expected(rc)) {
                fprintf(stderr, "worker %d: open: %s\n", worker_id, dlock_error_message());
                bad = 1;
                break;
            }
            sleep_ms(50);
        }
    }

    while (client != NULL && !bad && chaos_now_us() < until_us) {
        dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;
        dlock_lock *lock = NULL, *nested = NULL;
        uint64_t fence;
        int64_t value = 0, renewed_us = 0;
        int r, w = -2, renew_failed = 0;
        int shared = sem ? 2 : rw && rand_r(&seed) % 2 == 0; /* rand_r only in rw: mutex
                                                               * runs stay as they were */
        long think_ms;

        if (time(NULL) != last_wall) {
            last_wall = time(NULL);
            event("wall", (long long)last_wall, 0, 0);
        }
        o.wait_ms = lease_ms * 3;
        o.lease_ms = lease_ms;
        o.on_lost = on_lost;
        o.kind = sem    ? DLOCK_KIND_SEMAPHORE
                 : fair ? DLOCK_KIND_FAIR
                 : !rw  ? DLOCK_KIND_MUTEX
                 : shared ? DLOCK_KIND_READ
                          : DLOCK_KIND_WRITE;
        o.permits = sem ? CHAOS_SEM_PERMITS : 0;
        if (broken == CHAOS_IGNORE_LOST)
            o.on_lost = NULL;
        if (broken == CHAOS_SUPPRESS_LOST)
            o.on_lost = on_lost_suppressed;
        if (broken == CHAOS_SLOW_CLOCK) {
            /* It renews by its own clock, and its library's lease timer
             * (on_lost when the lease runs out) would run as slow. */
            o.auto_renew = 0;
            o.on_lost = NULL;
        }
        atomic_store(&me->phase, PHASE_ACQUIRING);
        event("acq_start", 0, 0, 0);
        if (broken == CHAOS_NO_LOCK) {
            int64_t highest = chaos_store_highest(store);
            rc = highest >= 0 ? DLOCK_OK : DLOCK_ESERVER;
            fence = highest >= 0 ? (uint64_t)highest : 0;
        } else {
            if (shared == 1)
                o.owner = owner;
            rc = dlock_acquire(&lock, client, name, &o);
            fence = rc == DLOCK_OK ? dlock_lock_fence(lock) : 0;
            renewed_us = chaos_now_us();
        }
        if (rc == DLOCK_OK && shared == 1 && rand_r(&seed) % 2 == 0) {
            /* A nested read: let in at once while the outer holds (past any
             * writer waiting); busy only when the outer was lost. */
            dlock_acquire_options n = o;
            n.wait_ms = 0;
            atomic_store(&hold_fence, (long long)fence);
            int nrc = dlock_acquire(&nested, client, name, &n);
            event("nested", nrc, 0, 0);
            if (nrc == DLOCK_OK)
                atomic_store(&nested_fence, (long long)dlock_lock_fence(nested));
            if (nrc != DLOCK_OK) {
                nested = NULL;
                if (!expected(nrc)) {
                    fprintf(stderr, "worker %d: nested read: %d %s\n", worker_id, nrc,
                            dlock_error_message());
                    bad = 1;
                }
            } else if (rand_r(&seed) % 2 == 0) {
                /* The outer goes first: the nested read holds alone. */
                nrc = dlock_release(lock);
                event("outer_rel", nrc, 0, 0);
                lock = nested;
                nested = NULL;
                if (!expected(nrc)) {
                    fprintf(stderr, "worker %d: outer release: %d %s\n", worker_id, nrc,
                            dlock_error_message());
                    bad = 1;
                }
            }
        }
        if (rc != DLOCK_OK) {
            atomic_store(&me->phase, PHASE_IDLE);
            event("acq_fail", rc, 0, 0);
            if (!expected(rc)) {
                fprintf(stderr, "worker %d: acquire: %d %s\n", worker_id, rc,
                        dlock_error_message());
                bad = 1;
            }
            sleep_ms(5 + rand_r(&seed) % 20);
            continue;
        }
        if (broken == CHAOS_REUSE_FENCE) {
            if (first_fence == 0)
                first_fence = fence;
            fence = first_fence;
        }
        atomic_store(&lost_seen, 0);
        atomic_store(&me->fence, fence);
        atomic_store(&me->phase, PHASE_IN_STORE);
        /* b: the handle has an on_lost, which must then tell it of every
         * lease that lapses (the checker's "missed"). */
        event("acq_ok", (long long)fence, o.on_lost != NULL, shared);

        event("valid", (long long)fence,
              (long long)belief(broken, lock, lease_ms, renewed_us, renew_failed), shared);
        if (shared) {
            r = 1; /* a reader or a permit: no store step, only the belief */
        } else {
            r = chaos_store_read(store, fence, &value);
            event("read", (long long)fence, value, r);
        }
        if (r == 1) {
            atomic_store(&me->phase, PHASE_THINKING);
            /* Mostly short; one hold in twenty outlasts its lease, so that the
             * watchdog must renew it and a partition or a pause can catch
             * the holder inside. The slow clock's worker holds a lease and a
             * half every time: under half a lease by its clock. */
            if (broken == CHAOS_SLOW_CLOCK)
                think_ms = (long)(lease_ms * 3 / 2);
            else if (rand_r(&seed) % 20 == 0)
                think_ms = (long)(lease_ms + rand_r(&seed) % lease_ms);
            else
                think_ms = (long)(1 + rand_r(&seed) % (lease_ms / 10 + 1));
            think(broken, lock, think_ms, lease_ms, &renewed_us, &renew_failed);
            atomic_store(&me->phase, PHASE_IN_STORE);
            event("valid", (long long)fence,
                  (long long)belief(broken, lock, lease_ms, renewed_us, renew_failed), shared);
            if (!shared) {
                w = broken == CHAOS_SKIP_FENCE
                        ? chaos_store_write_unfenced(store, fence, value, worker_id)
                        : chaos_store_write(store, fence, value, worker_id);
                event("write", (long long)fence, value + 1, w);
            }
        }
        atomic_store(&me->phase, PHASE_RELEASING);
        if (broken == CHAOS_NO_LOCK) {
            event("rel_start", (long long)fence, 0, 0);
            event("rel_end", (long long)fence, DLOCK_OK, 0);
            atomic_store(&me->phase, PHASE_IDLE);
            sleep_ms(rand_r(&seed) % 3);
            continue;
        }
        if (broken != CHAOS_IGNORE_LOST && broken != CHAOS_SLOW_CLOCK &&
            (dlock_lock_lost(lock) || r == 0 || w == 0)) {
            /* Lost, as far as we can tell: on_lost must come, within the
             * lease and a renewal's timeouts (the retry doubles them). The
             * limit counts the time this process ran: a pause (SIGSTOP)
             * stops the watchdog too, and uses none of it. */
            int64_t t0 = chaos_now_us(), waited = 0, last = t0;
            int64_t limit = (lease_ms + 3 * co.command_timeout_ms + co.connect_timeout_ms) * 1000;
            while (!atomic_load(&lost_seen) && waited < limit) {
                int64_t now;
                sleep_ms(2);
                now = chaos_now_us();
                waited += now - last < 50000 ? now - last : 2000;
                last = now;
            }
            /* c: 1 if on_lost came; the checker fails a handle with an
             * on_lost that saw its loss and was never told. */
            event("wait_lost", (long long)fence, (chaos_now_us() - t0) / 1000,
                  atomic_load(&lost_seen));
        }
        /* b, c: what the handle says just before the release: the deadline
         * it holds the lock until (for reading the history), and
         * dlock_lock_lost(): a release's DLOCK_ELOST tells the holder only
         * of a loss that reached the handle after this look. */
        event("rel_start", (long long)fence,
              (long long)(chaos_now_us() + dlock_lock_valid_ms(lock) * 1000),
              dlock_lock_lost(lock));
        if (broken == CHAOS_RAW_DEL) {
            /* Delete the lock key whoever holds it now, then free the handle. */
            rc = dlock_force_release(NULL, client, name);
            if (!expected(rc)) {
                fprintf(stderr, "worker %d: force release: %d %s\n", worker_id, rc,
                        dlock_error_message());
                bad = 1;
            }
        }
        if (nested != NULL) {
            /* The nested read goes first; the outer's release ends the hold. */
            int nrc = dlock_release(nested);
            event("nested_rel", nrc, 0, 0);
            nested = NULL;
            if (!expected(nrc)) {
                fprintf(stderr, "worker %d: nested release: %d %s\n", worker_id, nrc,
                        dlock_error_message());
                bad = 1;
            }
        }
        if (broken == CHAOS_NEVER_RELEASE && nkept < KEPT_MAX) {
            /* A release that does nothing: the handle stays held, renewed. */
            kept[nkept++] = lock;
            rc = DLOCK_OK;
        } else {
            rc = dlock_release(lock);
        }
        event("rel_end", (long long)fence, rc, 0);
        atomic_store(&me->phase, PHASE_IDLE);
        if (!expected(rc)) {
            fprintf(stderr, "worker %d: release: %d %s\n", worker_id, rc, dlock_error_message());
            bad = 1;
        }
        sleep_ms(rand_r(&seed) % 3);
    }
    atomic_store(&me->phase, PHASE_IDLE);
    dlock_client_free(client);
    for (int i = 0; i < nkept; i++)
        dlock_release(kept[i]); /* frees the handle (its client is gone) */
    chaos_store_close(store);
    event("exit", bad ? 3 : 0, 0, 0);
    return bad ? 3 : 0;
}
