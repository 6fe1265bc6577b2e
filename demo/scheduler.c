/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The scheduler: runs one mode of the payout demo.
 *
 * It forks the instances, fires the job on all of them at once each round,
 * and injects the pauses. A pause goes like this:
 *
 *   round r    the holder A reaches the chosen order and says so; the
 *              scheduler freezes it (SIGSTOP) and tells it to carry on, which
 *              it will do only once it is thawed.
 *              The scheduler asks the lock server how much of A's lease is
 *              left and waits it out: A's watchdog is frozen too, so nothing
 *              renews the lease.
 *   round r+1  fired on every other instance: one of them, B, takes the lock
 *              with a higher fence and reads the pending orders, including
 *              the one A was about to pay.
 *              Once B has read, A is thawed (SIGCONT). It commits the
 *              transfer it had prepared before the pause, as a real stalled
 *              process would, and only then finds its lock lost.
 *
 * The plan of pauses (which rounds, at which order) comes from the seed, so
 * every mode sees the same orders and the same pauses.
 */
#include "demo_int.h"

#include <dlock/dlock.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* Give up when nothing at all happens for this long. */
#define STALL_LIMIT_US ((int64_t)60 * 1000000)

typedef struct {
    pid_t pid;       /* 0 once reaped */
    int cmd_fd;      /* scheduler -> instance; -1 when closed */
    int ev_fd;       /* instance -> scheduler; -1 at EOF */
    int ready;
    int busy;        /* fired, no EV_DONE yet */
    int passed_read; /* past its acquire and read in the current round */
    int frozen;
    size_t buflen;
    unsigned char buf[sizeof(demo_event)];
} slot;

typedef struct {
    const demo_options *opts;
    demo_mode mode;
    const char *url;
    char lock_name[DLOCK_NAME_MAX + 1];
    slot *slots;
    int n;
    demo_store *store;
    dlock_client *observer;
    uint64_t order_rng;
    int *plan;          /* per round: index of the order to pause at, or -1 */
    int *paused_round;  /* per round: 1 once its pause happened */
    demo_event *events;
    size_t nevents, cap;
    int errors;
    char first_error[256];
    int64_t t0_us;
    int64_t last_progress_us;
} sched;

/* ------------------------------------------------------------------------
 * Events
 * ---------------------------------------------------------------------- */

static const char *event_name(int type)
{
    switch (type) {
    case EV_READY: return "ready";
    case EV_ACQUIRED: return "acquired";
    case EV_BUSY: return "busy";
    case EV_READ: return "read";
    case EV_PAID: return "paid";
    case EV_REFUSED: return "refused";
    case EV_REG_REFUSED: return "register refused";
    case EV_PAUSE_POINT: return "pause point";
    case EV_LOST: return "on_lost";
    case EV_DONE: return "done";
    case EV_ERROR: return "error";
    case EV_FIRE: return "fired";
    case EV_FROZEN: return "SIGSTOP";
    case EV_EXPIRED: return "lease gone";
    case EV_RESUMED: return "SIGCONT";
    default: return "?";
    }
}

static int record(sched *s, const demo_event *ev)
{
    if (s->nevents == s->cap) {
        size_t ncap = s->cap ? s->cap * 2 : 1024;
        demo_event *nv = realloc(s->events, ncap * sizeof *nv);
        if (nv == NULL) {
            demo_err("out of memory recording events");
            return -1;
        }
        s->events = nv;
        s->cap = ncap;
    }
    s->events[s->nevents++] = *ev;
    if (s->opts->verbose) {
        fprintf(stderr, "  %9.1f ms  %-13s i%-2d r%-3d %-16s", (ev->at_us - s->t0_us) / 1000.0,
                demo_mode_name(s->mode), ev->instance, ev->round + 1, event_name(ev->type));
        if (ev->fence)
            fprintf(stderr, " fence %llu", (unsigned long long)ev->fence);
        if (ev->type == EV_PAID || ev->type == EV_REFUSED || ev->type == EV_PAUSE_POINT)
            fprintf(stderr, " order %lld", (long long)ev->order);
        if (ev->type == EV_READ)
            fprintf(stderr, " %lld pending", (long long)ev->order);
        if (ev->type == EV_ACQUIRED || ev->type == EV_BUSY)
            fprintf(stderr, " %.3f ms", ev->latency_us / 1000.0);
        if (ev->type == EV_DONE || ev->type == EV_LOST)
            fprintf(stderr, " %s", dlock_strerror(ev->code));
        if (ev->text[0])
            fprintf(stderr, " %s", ev->text);
        fputc('\n', stderr);
    }
    return 0;
}

/* An event the scheduler itself witnessed. */
static int note(sched *s, demo_event_type type, int instance, int round)
{
    demo_event ev;
    memset(&ev, 0, sizeof ev);
    ev.type = type;
    ev.instance = instance;
    ev.round = round;
    ev.at_us = demo_now_us();
    return record(s, &ev);
}

static void set_error(sched *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void set_error(sched *s, const char *fmt, ...)
{
    s->errors++;
    if (s->first_error[0] != '\0')
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->first_error, sizeof s->first_error, fmt, ap);
    va_end(ap);
}

static int send_command(sched *s, int i, demo_command_type type, int round, int pause_at)
{
    demo_command cmd = {type, round, pause_at, 0};
    if (s->slots[i].cmd_fd < 0 || demo_write_all(s->slots[i].cmd_fd, &cmd, sizeof cmd) != 0) {
        demo_err("%s: instance %d stopped listening (%s)", demo_mode_name(s->mode), i,
                 strerror(errno));
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * Instance processes
 * ---------------------------------------------------------------------- */

static void child_main(sched *s, int i, int cmd_rd, int ev_wr, const char *store_spec,
                       const char *store_ns, pid_t parent)
{
    /* Die with the scheduler, whatever kills it; and let only the scheduler
     * see a Ctrl-C: it stops everyone in order. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(DEMO_EXIT_SOFTWARE);
    setpgid(0, 0);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    for (int j = 0; j < i; j++) {
        close(s->slots[j].cmd_fd);
        close(s->slots[j].ev_fd);
    }
    demo_instance_config cfg = {
        .index = i,
        .cmd_fd = cmd_rd,
        .ev_fd = ev_wr,
        .mode = s->mode,
        .url = s->url,
        .store_spec = store_spec,
        .store_ns = store_ns,
        .lock_name = s->lock_name,
        .ttl_ms = s->opts->ttl_ms,
        .pay_ms = s->opts->pay_ms,
    };
    /* exit, not _exit: under LeakSanitizer the instance's own allocations
     * are checked too (the scheduler's, inherited, stay reachable from this
     * stack). stdio was flushed before the fork, so nothing prints twice. */
    exit(demo_instance_run(&cfg));
}

static int spawn(sched *s, const char *store_spec, const char *store_ns)
{
    pid_t parent = getpid();
    for (int i = 0; i < s->n; i++) {
        int cmd[2], ev[2];
        if (pipe2(cmd, O_CLOEXEC) != 0)
            goto err_pipe;
        if (pipe2(ev, O_CLOEXEC) != 0) {
            close(cmd[0]);
            close(cmd[1]);
            goto err_pipe;
        }
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
            demo_err("fork: %s", strerror(errno));
            close(cmd[0]);
            close(cmd[1]);
            close(ev[0]);
            close(ev[1]);
            return -1;
        }
        if (pid == 0) {
            close(cmd[1]);
            close(ev[0]);
            child_main(s, i, cmd[0], ev[1], store_spec, store_ns, parent);
        }
        close(cmd[0]);
        close(ev[1]);
        s->slots[i].pid = pid;
        s->slots[i].cmd_fd = cmd[1];
        s->slots[i].ev_fd = ev[0];
    }
    return 0;
err_pipe:
    demo_err("pipe: %s", strerror(errno));
    return -1;
}

/* Stop every instance still there: thawed and killed when force, else told
 * to quit and given a few seconds. Reaps them all. */
static void stop_all(sched *s, int force)
{
    for (int i = 0; i < s->n; i++) {
        slot *sl = &s->slots[i];
        if (sl->pid <= 0)
            continue;
        if (force) {
            kill(sl->pid, SIGKILL);
        } else {
            if (sl->frozen)
                kill(sl->pid, SIGCONT);
            demo_command cmd = {CMD_QUIT, 0, -1, 0};
            if (sl->cmd_fd >= 0)
                (void)demo_write_all(sl->cmd_fd, &cmd, sizeof cmd);
        }
        if (sl->cmd_fd >= 0)
            close(sl->cmd_fd);
        sl->cmd_fd = -1;
    }
    int64_t deadline = demo_now_us() + 5 * 1000000;
    for (int i = 0; i < s->n; i++) {
        slot *sl = &s->slots[i];
        if (sl->pid <= 0)
            continue;
        int st;
        pid_t r;
        while ((r = waitpid(sl->pid, &st, WNOHANG)) == 0 && demo_now_us() < deadline)
            demo_sleep_us(2000);
        if (r == 0) {
            kill(sl->pid, SIGKILL);
            r = waitpid(sl->pid, &st, 0);
        }
        if (!force && r == sl->pid) {
            if (WIFSIGNALED(st))
                set_error(s, "instance %d died of signal %d", i, WTERMSIG(st));
            else if (WIFEXITED(st) && WEXITSTATUS(st) != 0 && s->errors == 0)
                set_error(s, "instance %d exited with status %d", i, WEXITSTATUS(st));
        }
        sl->pid = 0;
    }
    for (int i = 0; i < s->n; i++) {
        if (s->slots[i].ev_fd >= 0)
            close(s->slots[i].ev_fd);
        s->slots[i].ev_fd = -1;
    }
}

/* ------------------------------------------------------------------------
 * The round state machine
 * ---------------------------------------------------------------------- */

typedef struct {
    int next_round;
    int frozen;          /* index of the frozen instance, or -1 */
    int frozen_round;
    int64_t frozen_at;
    int expired;         /* its lease is gone */
    int64_t check_at;    /* when to look at the lease again */
    int takeover_fired;  /* the round after the pause has been fired */
    int takeover_round;
    unsigned char fired[DEMO_MAX_INSTANCES];
} state;

static int all_idle(const sched *s, int except)
{
    for (int i = 0; i < s->n; i++)
        if (i != except && s->slots[i].busy)
            return 0;
    return 1;
}

static int fire(sched *s, state *st, int except)
{
    int r = st->next_round;
    if (demo_store_add_orders(s->store, r, s->opts->orders, &s->order_rng) != 0) {
        demo_err("store: adding orders: %s", demo_store_error(s->store));
        return -1;
    }
    int pause_at = (s->opts->pause && except < 0) ? s->plan[r] : -1;
    for (int i = 0; i < s->n; i++) {
        st->fired[i] = 0;
        if (i == except)
            continue;
        if (send_command(s, i, CMD_ROUND, r, pause_at) != 0)
            return -1;
        s->slots[i].busy = 1;
        s->slots[i].passed_read = 0;
        st->fired[i] = 1;
        if (note(s, EV_FIRE, i, r) != 0)
            return -1;
    }
    st->next_round++;
    return 0;
}

static int freeze(sched *s, state *st, int i, int round)
{
    slot *sl = &s->slots[i];
    int wst;
    if (kill(sl->pid, SIGSTOP) != 0 || waitpid(sl->pid, &wst, WUNTRACED) != sl->pid ||
        !WIFSTOPPED(wst)) {
        demo_err("%s: could not freeze instance %d", demo_mode_name(s->mode), i);
        return -1;
    }
    sl->frozen = 1;
    st->frozen = i;
    st->frozen_round = round;
    st->frozen_at = demo_now_us();
    st->expired = 0;
    /* At least a whole lease, and then until the server has let it go. */
    st->check_at = st->frozen_at + s->opts->ttl_ms * 1000;
    st->takeover_fired = 0;
    s->paused_round[round] = 1;
    if (note(s, EV_FROZEN, i, round) != 0)
        return -1;
    /* Read by the instance once it is thawed. */
    return send_command(s, i, CMD_CONTINUE, round, -1);
}

static int thaw(sched *s, state *st)
{
    int i = st->frozen;
    kill(s->slots[i].pid, SIGCONT);
    s->slots[i].frozen = 0;
    st->frozen = -1;
    return note(s, EV_RESUMED, i, st->frozen_round);
}

/* Is the frozen holder's lease gone yet? Asks the lock server, which is the
 * only judge; without a lock (nolock) the pause just lasts a lease. */
static int check_lease(sched *s, state *st)
{
    int64_t now = demo_now_us();
    if (s->observer == NULL) {
        if (now - st->frozen_at >= s->opts->ttl_ms * 1000 + 5000)
            st->expired = 1;
        else
            st->check_at = st->frozen_at + s->opts->ttl_ms * 1000 + 5000;
    } else {
        dlock_lock_info info;
        int rc = dlock_status(&info, s->observer, s->lock_name);
        if (rc != DLOCK_OK) {
            demo_dlock_err("lock status", rc);
            return -1;
        }
        if (!info.held) {
            st->expired = 1;
        } else {
            if (info.ttl_ms < 0 || now - st->frozen_at > (10 * s->opts->ttl_ms + 5000) * 1000) {
                demo_err("%s: the frozen holder's lock never expired (ttl %lld ms)",
                         demo_mode_name(s->mode), (long long)info.ttl_ms);
                return -1;
            }
            st->check_at = now + (info.ttl_ms + 1) * 1000;
        }
    }
    if (st->expired)
        return note(s, EV_EXPIRED, st->frozen, st->frozen_round);
    return 0;
}

static int handle_event(sched *s, state *st, int i, const demo_event *ev)
{
    slot *sl = &s->slots[i];
    if (ev->instance != i) {
        demo_err("instance %d sent an event as %d", i, ev->instance);
        return -1;
    }
    if (record(s, ev) != 0)
        return -1;
    switch (ev->type) {
    case EV_READY:
        sl->ready = 1;
        break;
    case EV_BUSY:
    case EV_READ:
    case EV_REG_REFUSED:
        sl->passed_read = 1;
        break;
    case EV_ERROR:
        sl->passed_read = 1;
        set_error(s, "%s", ev->text);
        if (!sl->ready)
            return -1; /* could not even start */
        break;
    case EV_DONE:
        sl->busy = 0;
        sl->passed_read = 1;
        break;
    case EV_PAUSE_POINT:
        if (st->frozen < 0 && ev->round >= 0 && ev->round < s->opts->rounds &&
            !s->paused_round[ev->round])
            return freeze(s, st, i, ev->round);
        return send_command(s, i, CMD_CONTINUE, ev->round, -1);
    default:
        break;
    }
    return 0;
}

/* Read what instance i sent; -1 on a broken protocol or an instance that
 * died in the middle of the run. */
static int drain(sched *s, state *st, int i)
{
    slot *sl = &s->slots[i];
    for (;;) {
        ssize_t got = read(sl->ev_fd, sl->buf + sl->buflen, sizeof sl->buf - sl->buflen);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && errno == EAGAIN)
            return 0;
        if (got <= 0) {
            close(sl->ev_fd);
            sl->ev_fd = -1;
            /* EOF: every copy of the write end is closed, the process is
             * gone or going; say how it ended. */
            int wst;
            if (sl->pid > 0 && waitpid(sl->pid, &wst, 0) == sl->pid) {
                sl->pid = 0;
                if (WIFSIGNALED(wst))
                    set_error(s, "instance %d died in the middle of the run: %s", i,
                              strsignal(WTERMSIG(wst)));
                else
                    set_error(s, "instance %d exited in the middle of the run (status %d)", i,
                              WIFEXITED(wst) ? WEXITSTATUS(wst) : -1);
            } else {
                set_error(s, "instance %d exited in the middle of the run", i);
            }
            return -1;
        }
        sl->buflen += (size_t)got;
        if (sl->buflen == sizeof sl->buf) {
            demo_event ev;
            memcpy(&ev, sl->buf, sizeof ev);
            sl->buflen = 0;
            s->last_progress_us = demo_now_us();
            if (handle_event(s, st, i, &ev) != 0)
                return -1;
        }
        return 0;
    }
}

/* Wait for events (or the lease timer) once. */
static int step(sched *s, state *st)
{
    struct pollfd pfd[DEMO_MAX_INSTANCES];
    int idx[DEMO_MAX_INSTANCES];
    int np = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->slots[i].ev_fd < 0)
            continue;
        pfd[np].fd = s->slots[i].ev_fd;
        pfd[np].events = POLLIN;
        idx[np++] = i;
    }
    int64_t now = demo_now_us();
    int64_t wait_us = 200000;
    if (st->frozen >= 0 && !st->expired)
        wait_us = st->check_at > now ? st->check_at - now : 0;
    if (wait_us > 200000)
        wait_us = 200000;
    int rc = poll(pfd, (nfds_t)np, (int)((wait_us + 999) / 1000));
    if (rc < 0 && errno != EINTR) {
        demo_err("poll: %s", strerror(errno));
        return -1;
    }
    if (demo_interrupted())
        return -1;
    for (int k = 0; rc > 0 && k < np; k++)
        if (pfd[k].revents != 0 && drain(s, st, idx[k]) != 0)
            return -1;
    if (st->frozen >= 0 && !st->expired && demo_now_us() >= st->check_at &&
        check_lease(s, st) != 0)
        return -1;
    if (demo_now_us() - s->last_progress_us > STALL_LIMIT_US) {
        demo_err("%s: no instance reported anything for %lld s; giving up",
                 demo_mode_name(s->mode), (long long)(STALL_LIMIT_US / 1000000));
        return -1;
    }
    return 0;
}

static int run_rounds(sched *s)
{
    state st;
    memset(&st, 0, sizeof st);
    st.frozen = -1;
    for (;;) {
        if (st.next_round < s->opts->rounds) {
            if (st.frozen < 0) {
                if (all_idle(s, -1) && fire(s, &st, -1) != 0)
                    return -1;
            } else if (st.expired && !st.takeover_fired && all_idle(s, st.frozen)) {
                st.takeover_round = st.next_round;
                if (fire(s, &st, st.frozen) != 0)
                    return -1;
                st.takeover_fired = 1;
            }
        }
        if (st.frozen >= 0 && st.expired) {
            int ready = 1;
            if (st.takeover_fired) {
                for (int i = 0; i < s->n; i++)
                    if (st.fired[i] && !s->slots[i].passed_read)
                        ready = 0;
            } else if (st.next_round < s->opts->rounds) {
                ready = 0; /* the takeover round has yet to be fired */
            }
            if (ready && thaw(s, &st) != 0)
                return -1;
        }
        if (st.next_round >= s->opts->rounds && st.frozen < 0 && all_idle(s, -1))
            return 0;
        if (step(s, &st) != 0)
            return -1;
    }
}

static int wait_ready(sched *s)
{
    state st;
    memset(&st, 0, sizeof st);
    st.frozen = -1;
    for (;;) {
        int ready = 1;
        for (int i = 0; i < s->n; i++)
            ready &= s->slots[i].ready;
        if (ready)
            return 0;
        if (step(s, &st) != 0)
            return -1;
    }
}

/* A lock left held (by a demo that was killed, say) would make the first
 * round find it busy: wait out a short lease, refuse a long one. */
static int check_lock_free(sched *s)
{
    dlock_lock_info info;
    int rc = dlock_status(&info, s->observer, s->lock_name);
    if (rc != DLOCK_OK) {
        demo_dlock_err("lock status", rc);
        return -1;
    }
    if (!info.held)
        return 0;
    if (info.ttl_ms < 0 || info.ttl_ms > 2 * s->opts->ttl_ms + 2000) {
        demo_err("the lock %s is held by someone else (ttl %lld ms): is another demo running "
                 "against this server? Use --lock-name to pick another name",
                 s->lock_name, (long long)info.ttl_ms);
        return -1;
    }
    demo_sleep_us((info.ttl_ms + 5) * 1000);
    return 0;
}

/* ------------------------------------------------------------------------
 * Results
 * ---------------------------------------------------------------------- */

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static double percentile_ms(const int64_t *sorted, size_t n, double p)
{
    if (n == 0)
        return 0;
    size_t rank = (size_t)(p / 100.0 * (double)n + 0.999999);
    if (rank < 1)
        rank = 1;
    if (rank > n)
        rank = n;
    return (double)sorted[rank - 1] / 1000.0;
}

static int collect(sched *s, demo_result *out)
{
    int64_t *lat = malloc((s->nevents + 1) * sizeof *lat);
    if (lat == NULL) {
        demo_err("out of memory");
        return -1;
    }
    size_t nlat = 0;
    for (size_t k = 0; k < s->nevents; k++) {
        const demo_event *ev = &s->events[k];
        switch (ev->type) {
        case EV_ACQUIRED:
            if (ev->fence > out->highest_fence)
                out->highest_fence = ev->fence;
            lat[nlat++] = ev->latency_us;
            break;
        case EV_BUSY:
            lat[nlat++] = ev->latency_us;
            break;
        case EV_REFUSED:
        case EV_REG_REFUSED:
            out->refused++;
            break;
        case EV_FROZEN:
            out->pauses++;
            break;
        default:
            break;
        }
    }
    qsort(lat, nlat, sizeof *lat, cmp_i64);
    out->acquires = (int64_t)nlat;
    out->p50_ms = percentile_ms(lat, nlat, 50);
    out->p99_ms = percentile_ms(lat, nlat, 99);
    free(lat);

    demo_store_summary sum;
    if (demo_store_summary_get(s->store, &sum) != 0) {
        demo_err("store: %s", demo_store_error(s->store));
        return -1;
    }
    out->orders = sum.orders;
    out->payouts = sum.payouts;
    out->double_paid = sum.double_paid;
    out->unpaid = sum.unpaid;
    out->doubles = sum.doubles; /* moved */
    out->ndoubles = sum.ndoubles;
    return 0;
}

void demo_result_free(demo_result *result)
{
    if (result == NULL)
        return;
    free(result->events);
    free(result->doubles);
    result->events = NULL;
    result->doubles = NULL;
}

/* ------------------------------------------------------------------------
 * One mode
 * ---------------------------------------------------------------------- */

static int make_plan(sched *s)
{
    const demo_options *o = s->opts;
    s->plan = malloc((size_t)o->rounds * sizeof *s->plan);
    s->paused_round = calloc((size_t)o->rounds, sizeof *s->paused_round);
    if (s->plan == NULL || s->paused_round == NULL) {
        demo_err("out of memory");
        return -1;
    }
    /* Two draws a round whatever is decided, so the plan depends on the
     * seed and the sizes only. A pause needs a next round to be taken over
     * in, and that round is not paused itself. */
    uint64_t rng = o->seed ^ 0x5041555345ull; /* "PAUSE" */
    int any = 0;
    for (int r = 0; r < o->rounds; r++) {
        uint64_t coin = demo_rand_below(&rng, 2);
        int at = (int)demo_rand_below(&rng, (uint64_t)o->orders);
        int eligible = o->pause && r + 1 < o->rounds && !(r > 0 && s->plan[r - 1] >= 0);
        s->plan[r] = (eligible && coin) ? at : -1;
        any |= s->plan[r] >= 0;
    }
    if (o->pause && !any && o->rounds >= 2)
        s->plan[0] = (int)demo_rand_below(&rng, (uint64_t)o->orders);
    return 0;
}

int demo_run_mode(demo_result *out, const demo_options *opts, demo_mode mode, const char *url,
                  const char *store_spec, const char *store_ns)
{
    sched s;
    memset(&s, 0, sizeof s);
    memset(out, 0, sizeof *out);
    out->mode = mode;
    s.opts = opts;
    s.mode = mode;
    s.url = url;
    s.n = opts->instances;
    s.order_rng = opts->seed ^ 0x4F5244455253ull; /* "ORDERS" */
    snprintf(s.lock_name, sizeof s.lock_name, "%s:%s", opts->lock_name, demo_mode_name(mode));
    int status = DEMO_EXIT_SOFTWARE;
    char err[512];

    s.slots = calloc((size_t)s.n, sizeof *s.slots);
    if (s.slots == NULL) {
        demo_err("out of memory");
        goto out;
    }
    for (int i = 0; i < s.n; i++)
        s.slots[i].cmd_fd = s.slots[i].ev_fd = -1;
    if (make_plan(&s) != 0)
        goto out;

    s.store = demo_store_open(store_spec, store_ns, err, sizeof err);
    if (s.store == NULL) {
        demo_err("store: %s", err);
        status = DEMO_EXIT_UNAVAILABLE;
        goto out;
    }
    if (demo_store_setup(s.store) != 0) {
        demo_err("store: %s", demo_store_error(s.store));
        goto out;
    }

    /* Fork before this process opens a dlock client: a client has threads,
     * and a child forked from a threaded process may only exec or _exit. */
    s.t0_us = s.last_progress_us = demo_now_us();
    if (spawn(&s, store_spec, store_ns) != 0)
        goto out;
    if (wait_ready(&s) != 0) {
        status = demo_interrupted() ? DEMO_EXIT_INTERRUPTED : DEMO_EXIT_UNAVAILABLE;
        goto out;
    }
    if (mode != DEMO_NOLOCK) {
        int rc = dlock_client_open(&s.observer, url, NULL);
        if (rc != DLOCK_OK) {
            demo_dlock_err("lock server", rc);
            status = DEMO_EXIT_UNAVAILABLE;
            goto out;
        }
        if (check_lock_free(&s) != 0)
            goto out;
    }

    s.t0_us = s.last_progress_us = demo_now_us();
    out->t0_us = s.t0_us;
    if (run_rounds(&s) != 0) {
        if (demo_interrupted())
            status = DEMO_EXIT_INTERRUPTED;
        goto out;
    }
    out->t1_us = demo_now_us();
    stop_all(&s, 0);
    if (collect(&s, out) != 0)
        goto out;
    out->ran = 1;
    out->rounds = opts->rounds;
    status = DEMO_EXIT_OK;

out:
    stop_all(&s, 1); /* no-op after a clean stop */
    out->errors = s.errors;
    snprintf(out->first_error, sizeof out->first_error, "%s", s.first_error);
    out->events = s.events; /* moved, for the report */
    out->nevents = s.nevents;
    dlock_client_free(s.observer);
    demo_store_close(s.store);
    free(s.plan);
    free(s.paused_round);
    free(s.slots);
    return status;
}
