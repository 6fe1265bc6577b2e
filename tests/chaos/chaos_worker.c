/*
 * One chaos worker: a process of a user's, on the public API only. Until its
 * end time it loops: acquire the lock, read the fenced register, think, write
 * the register + 1, release; and logs every step to its history file
 * (chaos.h) with CLOCK_MONOTONIC times.
 *
 * When it has reason to believe its lock is lost (dlock_lock_lost, or the
 * store refused its fence) it gives on_lost time to fire before it releases:
 * the checker requires on_lost for every holder that was overtaken, and the
 * contract only promises it while the handle is alive.
 *
 *   chaos_worker URL NAME STORE HISTORY STATE SLOT ID LEASE_MS UNTIL_US SEED
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

static void on_lost(dlock_lock *lock, int reason, void *payload)
{
    (void)payload;
    event("lost", (long long)dlock_lock_fence(lock), reason, 0);
    atomic_store(&lost_seen, 1);
}

/* Codes a worker may get from the library under faults. Anything else
 * (EINVAL, EMISUSE, ENOMEM ...) is a bug: the worker exits 3. */
static int expected(int rc)
{
    return rc == DLOCK_OK || rc == DLOCK_EBUSY || rc == DLOCK_ETIMEOUT || rc == DLOCK_ELOST ||
           rc == DLOCK_ECONN || rc == DLOCK_ESERVER || rc == DLOCK_EAUTH;
}

int main(int argc, char **argv)
{
    const char *url, *name, *store_path;
    chaos_slot *slots, *me;
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_client *client = NULL;
    chaos_store *store;
    int64_t lease_ms, until_us;
    unsigned seed;
    int state_fd, slot, rc, bad = 0;
    time_t last_wall = 0;

    if (argc != 11) {
        fprintf(stderr, "usage: chaos_worker URL NAME STORE HISTORY STATE SLOT ID LEASE_MS "
                        "UNTIL_US SEED\n");
        return 2;
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
        dlock_lock *lock;
        uint64_t fence;
        int64_t value = 0;
        int r, w = -2;

        if (time(NULL) != last_wall) {
            last_wall = time(NULL);
            event("wall", (long long)last_wall, 0, 0);
        }
        o.wait_ms = lease_ms * 3;
        o.lease_ms = lease_ms;
        o.on_lost = on_lost;
        atomic_store(&me->phase, PHASE_ACQUIRING);
        event("acq_start", 0, 0, 0);
        rc = dlock_acquire(&lock, client, name, &o);
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
        fence = dlock_lock_fence(lock);
        atomic_store(&lost_seen, 0);
        atomic_store(&me->fence, fence);
        atomic_store(&me->phase, PHASE_IN_STORE);
        event("acq_ok", (long long)fence, 0, 0);

        r = chaos_store_read(store, fence, &value);
        event("read", (long long)fence, value, r);
        if (r == 1) {
            atomic_store(&me->phase, PHASE_THINKING);
            /* Mostly short; one hold in twenty outlasts its lease, so that the
             * watchdog must renew it and a partition or a pause can catch
             * the holder inside. */
            if (rand_r(&seed) % 20 == 0)
                sleep_ms(lease_ms + rand_r(&seed) % lease_ms);
            else
                sleep_ms(1 + rand_r(&seed) % (lease_ms / 10 + 1));
            atomic_store(&me->phase, PHASE_IN_STORE);
            w = chaos_store_write(store, fence, value, worker_id);
            event("write", (long long)fence, value + 1, w);
        }
        atomic_store(&me->phase, PHASE_RELEASING);
        if (dlock_lock_lost(lock) || r == 0 || w == 0) {
            /* Lost, as far as we can tell: on_lost must come, within the
             * lease and a renewal's timeouts (the retry doubles them). */
            int64_t t0 = chaos_now_us();
            int64_t limit = (lease_ms + 3 * co.command_timeout_ms + co.connect_timeout_ms) * 1000;
            while (!atomic_load(&lost_seen) && chaos_now_us() - t0 < limit)
                sleep_ms(2);
            event("wait_lost", (long long)fence, (chaos_now_us() - t0) / 1000,
                  atomic_load(&lost_seen));
        }
        event("rel_start", (long long)fence, 0, 0);
        rc = dlock_release(lock);
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
    chaos_store_close(store);
    event("exit", bad ? 3 : 0, 0, 0);
    return bad ? 3 : 0;
}
