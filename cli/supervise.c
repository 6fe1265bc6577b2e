/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock run and elect: COMMAND's process and its supervision. COMMAND gets
 * the environment and descriptors it should (not the library's), is forked
 * and exec'd with a death signal and, with --kill-group, a process group of
 * its own watched by a guard process; then one poll() loop on the self-pipe
 * (signals.c) forwards signals, stops COMMAND when the lock is lost, and
 * reaps it. See run.c for how the parts fit.
 */
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* ========================================================================
 * COMMAND's process: environment, file descriptors, fork and exec
 * ====================================================================== */

static int compare_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Record the fds open now. Called before anything opens one. */
int cli_plan_fds(cli_fd_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    struct rlimit rl;
    plan->limit = 65536;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        rl.rlim_cur < plan->limit)
        plan->limit = (unsigned)rl.rlim_cur;

    DIR *dir = opendir("/proc/self/fd");
    if (!dir)
        return 0; /* plan->known stays 0 */
    size_t cap = 0;
    struct dirent *de;
    while ((de = readdir(dir)) != NULL) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9')
            continue;
        int fd = atoi(de->d_name);
        if (fd <= 2 || fd == dirfd(dir))
            continue;
        if (plan->nkeep == cap) {
            /* One spare slot for the exec-error pipe (cli_start_command). */
            cap = cap ? 2 * cap : 8;
            int *grown = realloc(plan->keep, (cap + 1) * sizeof *grown);
            if (!grown) {
                closedir(dir);
                return -1;
            }
            plan->keep = grown;
        }
        plan->keep[plan->nkeep++] = fd;
    }
    closedir(dir);
    if (!plan->keep && !(plan->keep = malloc(sizeof *plan->keep)))
        return -1;
    plan->known = 1;
    return 0;
}

/* In the child: only async-signal-safe calls. */
static void close_fds_between(unsigned lo, unsigned hi, unsigned limit)
{
    if (lo > hi)
        return;
    if (close_range(lo, hi, 0) == 0)
        return;
    /* Linux before 5.9 has no close_range. */
    for (unsigned fd = lo; fd <= hi && fd < limit; fd++)
        close((int)fd);
}

/* Take fd out of keep[0..nkeep], where cli_start_command put it. */
static void forget_fd(cli_fd_plan *plan, int fd)
{
    size_t k = 0;
    while (k < plan->nkeep && plan->keep[k] != fd)
        k++;
    memmove(plan->keep + k, plan->keep + k + 1, (plan->nkeep - k) * sizeof *plan->keep);
}

/* Close every fd above 2 but the first n of plan->keep (ascending). */
static void close_other_fds(const cli_fd_plan *plan, size_t n)
{
    unsigned lo = 3;
    if (!plan->known)
        return;
    for (size_t k = 0; k < n; k++) {
        close_fds_between(lo, (unsigned)plan->keep[k] - 1, plan->limit);
        lo = (unsigned)plan->keep[k] + 1;
    }
    close_fds_between(lo, ~0U, plan->limit);
}

/* "NAME=" prefix test for an environment entry. */
static int env_is(const char *entry, const char *name)
{
    size_t n = strlen(name);
    return strncmp(entry, name, n) == 0 && entry[n] == '=';
}

/* The variables dlock sets for COMMAND, in this order, after dlock's own
 * environment (which loses any of them it had). */
static const char *const ours[] = {"DLOCK_NAME", "DLOCK_FENCE", "DLOCK_HOLDER"};
#define NOURS (sizeof ours / sizeof ours[0])

/*
 * COMMAND's environment: dlock's own, without DLOCK_URL (it may hold a
 * password, and COMMAND has no business with the lock server), with
 * DLOCK_NAME, DLOCK_FENCE and DLOCK_HOLDER (the holder record, when
 * there is one) set. Built here rather than by setenv() in the child,
 * because after fork in a threaded process only async-signal-safe calls
 * are allowed, and setenv() allocates. Free with cli_free_environment.
 */
char **cli_build_environment(const char *name, uint64_t fence, const char *holder)
{
    size_t n = 0, k = 0;
    char **env;

    for (char **e = environ; *e; e++)
        n++;
    if ((env = calloc(n + NOURS + 1, sizeof *env)) == NULL)
        return NULL;
    for (char **e = environ; *e; e++) {
        int skip = env_is(*e, "DLOCK_URL");
        for (size_t i = 0; i < NOURS; i++)
            skip |= env_is(*e, ours[i]);
        if (!skip)
            env[k++] = *e;
    }
    /* Ours go last; cli_free_environment finds them there. */
    if (asprintf(&env[k], "DLOCK_NAME=%s", name) < 0)
        env[k] = NULL;
    else if (asprintf(&env[k + 1], "DLOCK_FENCE=%" PRIu64, fence) < 0)
        env[k + 1] = NULL;
    else if (holder != NULL && asprintf(&env[k + 2], "DLOCK_HOLDER=%s", holder) < 0)
        env[k + 2] = NULL;
    else
        return env;
    cli_free_environment(env);
    return NULL;
}

void cli_free_environment(char **env)
{
    if (!env)
        return;
    for (char **e = env; *e; e++)
        for (size_t i = 0; i < NOURS; i++)
            if (env_is(*e, ours[i])) {
                free(*e);
                break;
            }
    free(env);
}

/* ========================================================================
 * Supervision: the state, and COMMAND's start
 * ====================================================================== */


/*
 * --kill-group: a process that outlives dlock just long enough to kill
 * COMMAND's process group if dlock dies without doing so itself (SIGKILL,
 * the OOM killer): the death signal of COMMAND's own process does not reach
 * the processes COMMAND started. It waits on a pipe whose only writer is
 * dlock: a byte means "the group is gone, exit"; end of file means dlock
 * died: SIGKILL to the group. It stays in dlock's process group with every
 * signal blocked (what a terminal or a service manager sends to dlock's
 * group does not end it; SIGKILL does, which the documentation states), and
 * it keeps no descriptor but the pipe's read end: not dlock's connections,
 * not a stdout whose reader waits for end of file.
 */
static pid_t start_guard(pid_t group, const cli_fd_plan *fds, int *disarm_fd)
{
    int p[2];
    sigset_t all, old;

    if (pipe2(p, O_CLOEXEC) != 0) {
        cli_error("pipe: %s", strerror(errno));
        return -1;
    }
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t pid = fork();
    if (pid == 0) {
        /* Only async-signal-safe calls, as in COMMAND's child. */
        char byte;
        ssize_t n;
        close_fds_between(0, (unsigned)p[0] - 1, fds->limit);
        close_fds_between((unsigned)p[0] + 1, ~0U, fds->limit);
        while ((n = read(p[0], &byte, 1)) < 0 && errno == EINTR)
            ;
        if (n == 0)
            kill(-group, SIGKILL);
        _exit(0);
    }
    int fork_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    close(p[0]);
    if (pid < 0) {
        close(p[1]);
        cli_error("fork: %s", strerror(fork_errno));
        return -1;
    }
    *disarm_fd = p[1];
    return pid;
}

/* Tell the guard that the group is gone, and reap it. */
static void stop_guard(cli_supervisor *s)
{
    if (s->guard_fd >= 0) {
        while (write(s->guard_fd, "x", 1) < 0 && errno == EINTR)
            ;
        close(s->guard_fd);
        s->guard_fd = -1;
    }
    if (s->guard > 0) {
        while (waitpid(s->guard, NULL, 0) < 0 && errno == EINTR)
            ;
        s->guard = 0;
    }
}

/*
 * Fork and exec COMMAND (s->opts->command), setting s->pid, and with
 * --kill-group s->group and the guard. Returns 0; -1 with *exec_errno set
 * when the exec failed (the child is reaped); -2 after printing why no child
 * could be made.
 *
 * The child asks the kernel for SIGKILL when dlock dies (PR_SET_PDEATHSIG):
 * SIGKILL, not SIGTERM, because once its supervisor is gone nobody renews
 * the lease and nobody would enforce a grace, so a COMMAND that trapped
 * SIGTERM could run on after the lease, beside the next holder. The death
 * signal is sent when the thread that forked exits: here the main thread,
 * which lives as long as dlock. If dlock died before the child asked, the
 * child has a new parent already, and ends instead of running unsupervised.
 */
int cli_start_command(cli_supervisor *s, char **env, cli_fd_plan *fds, int *exec_errno)
{
    char **command = s->opts->command;
    int kill_group = s->opts->kill_group;
    pid_t parent = getpid();

    /* COMMAND's orphans (what it started, once it is gone) become dlock's
     * children, so that dlock learns when its group has emptied. */
    if (kill_group && prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
        cli_error("prctl(PR_SET_CHILD_SUBREAPER): %s", strerror(errno));
        return -2;
    }
    /* exec reports failure through this close-on-exec pipe: EOF means the
     * exec succeeded, an int is the child's errno. */
    int report[2];
    if (pipe2(report, O_CLOEXEC) != 0) {
        cli_error("pipe: %s", strerror(errno));
        return -2;
    }
    /* The child keeps the pipe open: it goes into the spare slot of keep
     * for this fork only, and comes out again below. */
    if (fds->known) {
        fds->keep[fds->nkeep] = report[1];
        qsort(fds->keep, fds->nkeep + 1, sizeof *fds->keep, compare_int);
    }

    /* Block every signal across fork, so no handler of ours runs in the
     * child before it has put the dispositions back as dlock found them. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t pid = fork();
    if (pid == 0) {
        /* The child. Another thread (the watchdog) may have held a lock
         * (malloc's, stdio's) at fork: only async-signal-safe calls until
         * exec. execvpe is one in glibc: it searches PATH without malloc. */
        int e;
        if (kill_group)
            setpgid(0, 0);
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
            e = errno;
        } else if (getppid() != parent) {
            _exit(CLI_EXIT_SOFTWARE); /* dlock is gone already */
        } else {
            cli_restore_signal_actions();
            cli_restore_core_limit();
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            close_other_fds(fds, fds->nkeep + 1);
            execvpe(command[0], command, env);
            e = errno;
        }
        while (write(report[1], &e, sizeof e) < 0 && errno == EINTR)
            ;
        _exit(e == ENOENT ? CLI_EXIT_NOTFOUND : CLI_EXIT_NOEXEC);
    }
    int fork_errno = errno;
    /* Also here, so that no signal dlock sends the group can come before
     * the child has made it (EACCES: it has, and exec'd already). */
    if (pid > 0 && kill_group)
        setpgid(pid, pid);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (fds->known)
        forget_fd(fds, report[1]);
    close(report[1]);
    if (pid < 0) {
        close(report[0]);
        cli_error("fork: %s", strerror(fork_errno));
        return -2;
    }

    int e;
    ssize_t n;
    while ((n = read(report[0], &e, sizeof e)) < 0 && errno == EINTR)
        ;
    close(report[0]);
    if (n == (ssize_t)sizeof e) {
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
        *exec_errno = e;
        return -1;
    }
    s->pid = pid;
    if (kill_group) {
        s->group = pid;
        if ((s->guard = start_guard(pid, fds, &s->guard_fd)) < 0) {
            /* COMMAND runs already: stop it, it would run unguarded. */
            s->guard = 0;
            kill(-pid, SIGKILL);
            while (waitpid(pid, &s->status, 0) < 0 && errno == EINTR)
                ;
            s->pid = 0;
            return -2;
        }
    }
    return 0;
}

/* ========================================================================
 * Supervision
 * ====================================================================== */

/* Milliseconds on CLOCK_MONOTONIC (since boot: > 0). */
int64_t cli_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Send sig to COMMAND: its process, or with --kill-group its whole group.
 * Until it is reaped, COMMAND's pid cannot be reused: safe to kill. Nor can
 * the group's ID while any process is left in it. */
static void signal_command(const cli_supervisor *s, int sig)
{
    if (s->group > 0)
        kill(-s->group, sig);
    else if (s->pid > 0)
        kill(s->pid, sig);
}

/* --kill-group: is any process of COMMAND's group left (a zombie too)? */
static int group_left(const cli_supervisor *s)
{
    return s->group > 0 && kill(-s->group, 0) == 0;
}

static void on_wake_byte(cli_supervisor *s, unsigned char byte)
{
    if (byte >= CLI_WAKE_LOST) {
        int reason = CLI_WAKE_LOST - (int)byte;
        if (s->lost)
            return;
        s->lost = 1;
        /* COMMAND no longer has the lock's protection and someone else may
         * hold it already: stop COMMAND now, firmly after the grace. */
        cli_error("lost the lock '%s': %s; sending SIGTERM to COMMAND (%s %ld), "
                  "SIGKILL after %" PRId64 " ms",
                  s->opts->shown, dlock_strerror(reason),
                  s->group > 0 ? "process group" : "pid", (long)(s->group > 0 ? s->group : s->pid),
                  s->opts->grace_ms);
        signal_command(s, SIGTERM);
        s->kill_at = cli_now_ms() + s->opts->grace_ms;
    } else if (byte >= CLI_WAKE_NOTED) {
        s->stop_signal = byte - CLI_WAKE_NOTED;
        /* With --kill-group COMMAND is not in the terminal's foreground
         * process group: what the terminal sent went to dlock alone. */
        if (s->group > 0)
            signal_command(s, s->stop_signal);
    } else if (byte != SIGCHLD && byte != CLI_WAKE_QUIT) {
        signal_command(s, byte);
        s->stop_signal = byte;
    }
}

static void drain_wake_pipe(cli_supervisor *s)
{
    unsigned char buf[64];
    for (;;) {
        ssize_t n = read(s->wake_read, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return; /* EAGAIN: drained */
        for (ssize_t k = 0; k < n; k++)
            on_wake_byte(s, buf[k]);
    }
}

/*
 * Reap COMMAND if it has ended (options WNOHANG) or when it ends (0). With
 * --kill-group dlock is a subreaper, so it also reaps, without waiting, the
 * processes of COMMAND's that were left without a parent, and the guard
 * should it die.
 */
static void reap(cli_supervisor *s, int options)
{
    for (;;) {
        pid_t which = s->group > 0 && options == WNOHANG ? -1 : s->pid;
        int status;
        pid_t r;
        if (which == 0)
            return;
        while ((r = waitpid(which, &status, options)) < 0 && errno == EINTR)
            ;
        if (r < 0 && which == s->pid) {
            /* Only if SIGCHLD were ignored, which cli_install_handlers prevents. */
            cli_error("waitpid: %s", strerror(errno));
            s->status = W_EXITCODE(CLI_EXIT_SOFTWARE, 0);
            s->pid = 0;
        }
        if (r <= 0)
            return;
        if (r == s->pid) {
            s->status = status;
            s->pid = 0;
        } else if (r == s->guard) {
            s->guard = 0;
        }
        if (which != -1)
            return;
    }
}

/* Wait for a wake-up of the loop: a byte on the self-pipe, or until
 * kill_at, or at most max_ms (-1: no limit). Then handle what came. */
static void wait_and_handle(cli_supervisor *s, int max_ms)
{
    struct pollfd pfd = {.fd = s->wake_read, .events = POLLIN};
    int timeout = max_ms;
    if (s->kill_at > 0) {
        int64_t left = s->kill_at - cli_now_ms();
        left = left > 0 ? left : 0;
        if (timeout < 0 || left < timeout)
            timeout = (int)(left < INT32_MAX ? left : INT32_MAX);
    }
    int n = poll(&pfd, 1, timeout);
    if (n < 0 && errno != EINTR) {
        /* Cannot happen short of a bug; without the loop COMMAND would
         * run unsupervised, so stop it and wait. */
        cli_error("poll: %s; stopping COMMAND", strerror(errno));
        signal_command(s, SIGKILL);
        reap(s, 0);
        s->group = 0;
        return;
    }
    if (n > 0)
        drain_wake_pipe(s);
    reap(s, WNOHANG);
}

/*
 * Wait for COMMAND to end, forwarding signals and stopping it if the lock is
 * lost. On return s->status is COMMAND's wait status. With --kill-group,
 * whatever COMMAND left running in its process group is stopped too before
 * this returns (SIGTERM, SIGKILL after --grace): it must not run on after
 * the release, without the lock.
 */
void cli_supervise(cli_supervisor *s)
{
    /* A wake-up may have come before the child existed: look first. */
    drain_wake_pipe(s);
    reap(s, WNOHANG);
    while (s->pid > 0) {
        wait_and_handle(s, -1);
        if (s->pid > 0 && s->kill_at > 0 && cli_now_ms() >= s->kill_at) {
            s->kill_at = 0;
            cli_error("COMMAND (pid %ld) still running %" PRId64
                      " ms after SIGTERM; sending SIGKILL",
                      (long)s->pid, s->opts->grace_ms);
            signal_command(s, SIGKILL);
        }
    }
    if (group_left(s)) {
        if (s->kill_at == 0) {
            /* Ended by itself: the grace starts now. */
            signal_command(s, SIGTERM);
            s->kill_at = cli_now_ms() + s->opts->grace_ms;
        }
        /* The last process of the group to go is a child of dlock by then
         * (subreaper), so SIGCHLD says when; the 1 s bound is a safety net
         * only. */
        while (group_left(s)) {
            wait_and_handle(s, 1000);
            if (s->kill_at > 0 && cli_now_ms() >= s->kill_at && group_left(s)) {
                s->kill_at = 0;
                cli_error("COMMAND's process group %ld still has processes %" PRId64
                          " ms after SIGTERM; sending SIGKILL",
                          (long)s->group, s->opts->grace_ms);
                signal_command(s, SIGKILL);
            }
        }
    }
    stop_guard(s);
}

/* The exit code for a wait status, as a shell gives it. */
int cli_status_code(int status)
{
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return CLI_EXIT_SOFTWARE;
}

