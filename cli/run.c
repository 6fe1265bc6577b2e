/*
 * dlock run: hold a lock while a command runs. dlock elect: run a command
 * while this instance leads an election, and campaign again after.
 *
 * dlock takes the lock, starts COMMAND and from then on only supervises it,
 * from one poll() loop in the main thread. The loop wakes on a self-pipe to
 * which asynchronous code writes one byte and does nothing else:
 *   - the handlers of SIGINT, SIGTERM, SIGHUP (to forward) and SIGCHLD;
 *   - the lock's on_lost callback, which runs on the library's watchdog
 *     thread, where almost nothing else would be safe;
 * and on the SIGKILL deadline that follows a lost lock. Messages, kill(),
 * waitpid() and the release all happen in the loop.
 *
 * Until the lock is held (while --wait waits), signals keep their default
 * effect: ^C simply ends dlock.
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
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* ========================================================================
 * Options
 * ====================================================================== */

typedef struct {
    const char *name;
    int64_t ttl_ms;
    int64_t wait_ms;
    int64_t grace_ms; /* -1 until given: then 5 s, at most half the TTL */
    int busy_code; /* exit code when the lock is busy (-E) */
    char **command; /* NULL-terminated, points into argv */
    /* run: the lock kind (--shared, --exclusive, --permits N) */
    int kind;
    int permits;
    /* elect */
    int elect;
    const char *identity; /* --id; NULL: the library's HOSTNAME:PID */
    int once;             /* --once: one term, then exit */
} run_options;

static int parse_duration(int64_t *out_ms, const char *option, const char *text)
{
    int err = dlock_duration_parse(out_ms, text);
    if (err != DLOCK_OK)
        return cli_fail(err, "run: bad %s '%s' (a whole number and ms, s or m)", option, text);
    return 0;
}

static int parse_permits(int *out, const char *text)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < 1 || v > DLOCK_PERMITS_MAX) {
        cli_error("run: bad --permits '%s' (a number of permits, 1 to %d)", text,
                  DLOCK_PERMITS_MAX);
        return CLI_EXIT_USAGE;
    }
    *out = (int)v;
    return 0;
}

/* run: one of --shared, --exclusive, --permits N. */
static int set_kind(run_options *o, int kind, const char *option)
{
    if (o->kind != DLOCK_KIND_MUTEX && o->kind != kind) {
        cli_error("run: %s goes with none of --shared, --exclusive, --permits", option);
        return CLI_EXIT_USAGE;
    }
    o->kind = kind;
    return 0;
}

static int parse_exit_code(int *out, const char *text)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < 0 || v > 255) {
        cli_error("run: bad -E '%s' (an exit code, 0 to 255)", text);
        return CLI_EXIT_USAGE;
    }
    *out = (int)v;
    return 0;
}

/*
 * Parse "[options] NAME -- COMMAND [ARG...]" after "run" or "elect"; options
 * may come before or after NAME, and everything after "--" is COMMAND's.
 * Returns 0; -1 after printing --help (exit 0); or an exit code after a
 * usage error. Everything is checked here, before any connection, so that a
 * typo is reported as one even when the server is down.
 */
static int parse_args(run_options *o, int argc, char **argv)
{
    int i, rc;
    for (i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        const char *arg = argv[i], *value;
        int r;
        if (arg[0] != '-' || arg[1] == '\0') {
            if (o->name) {
                cli_error("%s: unexpected argument '%s' (COMMAND goes after '--')", argv[0],
                          arg);
                return CLI_EXIT_USAGE;
            }
            o->name = arg;
            continue;
        }
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            cli_usage(0);
            return -1;
        }
        if (!o->elect && !strcmp(arg, "--shared")) {
            if ((rc = set_kind(o, DLOCK_KIND_READ, arg)) != 0)
                return rc;
        } else if (!o->elect && !strcmp(arg, "--exclusive")) {
            if ((rc = set_kind(o, DLOCK_KIND_WRITE, arg)) != 0)
                return rc;
        } else if (!o->elect && (r = cli_option_value(argc, argv, &i, "--permits", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            if ((rc = set_kind(o, DLOCK_KIND_SEMAPHORE, "--permits")) != 0 ||
                (rc = parse_permits(&o->permits, value)) != 0)
                return rc;
        } else if (o->elect && !strcmp(arg, "--once")) {
            o->once = 1;
        } else if (o->elect && (r = cli_option_value(argc, argv, &i, "--id", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            if (!*value || strlen(value) > DLOCK_IDENTITY_MAX) {
                cli_error("elect: --id must be 1 to %d bytes", DLOCK_IDENTITY_MAX);
                return CLI_EXIT_USAGE;
            }
            o->identity = value;
        } else if ((r = cli_option_value(argc, argv, &i, "--ttl", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            if ((rc = parse_duration(&o->ttl_ms, "--ttl", value)) != 0)
                return rc;
        } else if (!o->elect && (r = cli_option_value(argc, argv, &i, "--wait", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            if (!strcmp(value, "forever"))
                o->wait_ms = DLOCK_WAIT_FOREVER;
            else if ((rc = parse_duration(&o->wait_ms, "--wait", value)) != 0)
                return rc;
        } else if ((r = cli_option_value(argc, argv, &i, "--grace", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            if ((rc = parse_duration(&o->grace_ms, "--grace", value)) != 0)
                return rc;
        } else if (!o->elect && (r = cli_option_value(argc, argv, &i, "-E", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            if ((rc = parse_exit_code(&o->busy_code, value)) != 0)
                return rc;
        } else {
            cli_error("%s: unknown option '%s'%s", argv[0], arg,
                      strncmp(arg, "--url", 5) ? " (try 'dlock --help')"
                      : o->elect               ? " (--url goes before 'elect')"
                                               : " (--url goes before 'run')");
            return CLI_EXIT_USAGE;
        }
    }

    if (!o->name) {
        cli_error("%s: missing NAME (try 'dlock --help')", argv[0]);
        return CLI_EXIT_USAGE;
    }
    if (i >= argc) {
        cli_error("%s: missing '--' between NAME and COMMAND", argv[0]);
        return CLI_EXIT_USAGE;
    }
    if (i + 1 >= argc) {
        cli_error("%s: missing COMMAND after '--'", argv[0]);
        return CLI_EXIT_USAGE;
    }
    o->command = argv + i + 1;

    if (o->ttl_ms <= 0) {
        cli_error("%s: --ttl must be more than 0", argv[0]);
        return CLI_EXIT_USAGE;
    }
    /* Once the lock is lost someone else may hold it, and COMMAND still runs
     * for up to the grace. A grace as long as a lease would let two holders
     * overlap for a whole lease: that is no lock any more. A short --ttl
     * alone is no mistake, though, so the default grace shrinks with it. */
    if (o->grace_ms < 0)
        o->grace_ms = o->ttl_ms / 2 < 5000 ? o->ttl_ms / 2 : 5000;
    if (o->grace_ms >= o->ttl_ms) {
        cli_error("%s: --grace (%" PRId64 " ms) must be shorter than --ttl (%" PRId64 " ms)",
                  argv[0], o->grace_ms, o->ttl_ms);
        return CLI_EXIT_USAGE;
    }
    return 0;
}

/* ========================================================================
 * Wake-ups: the self-pipe and what writes to it
 * ====================================================================== */

/*
 * Bytes on the self-pipe: a signal number to forward (below 64), WAKE_NOTED
 * + a signal number that went to COMMAND by itself (the terminal's), or
 * WAKE_LOST + the negated on_lost reason (DLOCK_ELOST, DLOCK_ECONN).
 */
#define WAKE_NOTED 64
#define WAKE_LOST 128

/* The self-pipe's write end. Set before the lock and the handlers exist;
 * reset to -1 only after the client (and so the watchdog thread) is gone,
 * when a late signal can only interrupt the main thread itself. */
static volatile sig_atomic_t wake_fd = -1;

/* Called from signal handlers and from the watchdog thread. */
static void wake(unsigned char byte)
{
    int saved = errno;
    /* Non-blocking, so a writer never waits. The loop drains the pipe on
     * every wake-up, so it cannot fill with the few bytes written to it. */
    while (write(wake_fd, &byte, 1) < 0 && errno == EINTR)
        ;
    errno = saved;
}

static void on_signal(int sig, siginfo_t *info, void *context)
{
    (void)context;
    /* ^C or a hangup from the terminal (si_code SI_KERNEL) already went to
     * the whole foreground process group, COMMAND included: forwarding it
     * would deliver it twice (a second ^C often means "abort cleanup").
     * It is only noted (elect stops campaigning). */
    if (sig != SIGCHLD && info && info->si_code == SI_KERNEL) {
        wake((unsigned char)(WAKE_NOTED + sig));
        return;
    }
    wake((unsigned char)sig);
}

static void on_lost(dlock_lock *lock, int reason, void *payload)
{
    (void)lock;
    (void)payload;
    wake((unsigned char)(WAKE_LOST - reason));
}

/* The signals dlock handles, and the ones COMMAND must get back as dlock
 * found them (SIGPIPE: cli_ignore_sigpipe). */
static const int forwarded_signals[] = {SIGINT, SIGTERM, SIGHUP};
static const int restored_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE};
#define NRESTORED (sizeof restored_signals / sizeof restored_signals[0])

static struct sigaction initial_actions[NRESTORED];

static void save_signal_actions(void)
{
    for (size_t k = 0; k < NRESTORED; k++)
        sigaction(restored_signals[k], NULL, &initial_actions[k]);
}

/* Put the dispositions back as dlock found them: elect, between terms, is
 * ended by a signal like run while it waits. */
static void restore_signal_actions(void)
{
    for (size_t k = 0; k < NRESTORED; k++)
        sigaction(restored_signals[k], &initial_actions[k], NULL);
}

static int install_handlers(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    for (size_t k = 0; k < sizeof forwarded_signals / sizeof forwarded_signals[0]; k++) {
        struct sigaction old;
        if (sigaction(forwarded_signals[k], NULL, &old) != 0)
            return -1;
        /* Ignored when dlock started (nohup, a background job of a script):
         * keep it ignored; COMMAND inherits that, as it would without dlock. */
        if (old.sa_handler == SIG_IGN)
            continue;
        if (sigaction(forwarded_signals[k], &sa, NULL) != 0)
            return -1;
    }
    sa.sa_flags |= SA_NOCLDSTOP;
    return sigaction(SIGCHLD, &sa, NULL);
}

/* ========================================================================
 * COMMAND's process: environment, file descriptors, fork and exec
 * ====================================================================== */

/*
 * File descriptors: COMMAND inherits 0-2 and whatever dlock itself was
 * started with (a `3>file` on the command line), but not the descriptors the
 * library opened: an authenticated server connection in COMMAND's hands
 * would be as bad as the password in its environment. The library's sockets
 * need not be close-on-exec, and the watchdog may reconnect at any moment,
 * so the child closes them itself, just before exec.
 */
typedef struct {
    int *keep;      /* fds above 2 to leave open, ascending */
    size_t nkeep;
    int known;      /* 0: /proc was unreadable, close nothing */
    unsigned limit; /* highest fd + 1 for the close() loop fallback */
} fd_plan;

static int compare_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Record the fds open now. Called before anything opens one. */
static int plan_fds(fd_plan *plan)
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
            /* One spare slot for the exec-error pipe (start_command). */
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

/* Take fd out of keep[0..nkeep], where start_command put it. */
static void forget_fd(fd_plan *plan, int fd)
{
    size_t k = 0;
    while (k < plan->nkeep && plan->keep[k] != fd)
        k++;
    memmove(plan->keep + k, plan->keep + k + 1, (plan->nkeep - k) * sizeof *plan->keep);
}

/* Close every fd above 2 but the first n of plan->keep (ascending). */
static void close_other_fds(const fd_plan *plan, size_t n)
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

/*
 * COMMAND's environment: dlock's own, without DLOCK_URL (it may hold a
 * password, and COMMAND has no business with the lock server), with
 * DLOCK_NAME and DLOCK_FENCE set. Built here rather than by setenv() in the
 * child, because after fork in a threaded process only async-signal-safe
 * calls are allowed, and setenv() allocates. Free with free_environment.
 */
static char **build_environment(const char *name, uint64_t fence)
{
    size_t n = 0;
    for (char **e = environ; *e; e++)
        n++;
    char **env = calloc(n + 3, sizeof *env);
    if (!env)
        return NULL;
    size_t k = 0;
    for (char **e = environ; *e; e++) {
        if (!env_is(*e, "DLOCK_URL") && !env_is(*e, "DLOCK_NAME") && !env_is(*e, "DLOCK_FENCE"))
            env[k++] = *e;
    }
    /* Ours go last; free_environment finds them there. */
    char fence_text[32];
    snprintf(fence_text, sizeof fence_text, "%" PRIu64, fence);
    size_t name_len = strlen(name);
    env[k] = malloc(sizeof "DLOCK_NAME=" + name_len);
    env[k + 1] = malloc(sizeof "DLOCK_FENCE=" + strlen(fence_text));
    if (!env[k] || !env[k + 1]) {
        free(env[k]);
        free(env[k + 1]);
        free(env);
        return NULL;
    }
    memcpy(env[k], "DLOCK_NAME=", sizeof "DLOCK_NAME=" - 1);
    memcpy(env[k] + sizeof "DLOCK_NAME=" - 1, name, name_len + 1);
    sprintf(env[k + 1], "DLOCK_FENCE=%s", fence_text);
    return env;
}

static void free_environment(char **env)
{
    if (!env)
        return;
    size_t n = 0;
    while (env[n])
        n++;
    free(env[n - 2]);
    free(env[n - 1]);
    free(env);
}

/*
 * Fork and exec COMMAND. Returns its pid; -1 with *exec_errno set when the
 * exec failed (the child is reaped); -2 after printing why no child could be
 * made.
 */
static pid_t start_command(char **command, char **env, fd_plan *fds, int *exec_errno)
{
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
        for (size_t k = 0; k < NRESTORED; k++)
            sigaction(restored_signals[k], &initial_actions[k], NULL);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        close_other_fds(fds, fds->nkeep + 1);
        execvpe(command[0], command, env);
        int e = errno;
        while (write(report[1], &e, sizeof e) < 0 && errno == EINTR)
            ;
        _exit(e == ENOENT ? CLI_EXIT_NOTFOUND : CLI_EXIT_NOEXEC);
    }
    int fork_errno = errno;
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
    return pid;
}

/* ========================================================================
 * Supervision
 * ====================================================================== */

typedef struct {
    const run_options *opts;
    int wake_read; /* the self-pipe's read end */
    pid_t pid;     /* COMMAND; 0 once reaped */
    int status;    /* its wait status, once reaped */
    int lost;      /* the lock was found lost while COMMAND ran */
    int64_t kill_at; /* 0, or when SIGKILL is due (now_ms) */
    int stop_signal; /* SIGINT, SIGTERM or SIGHUP reached dlock or COMMAND */
} supervisor;

/* Milliseconds on CLOCK_MONOTONIC (since boot: > 0). */
static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void on_wake_byte(supervisor *s, unsigned char byte)
{
    if (byte >= WAKE_LOST) {
        int reason = WAKE_LOST - (int)byte;
        if (s->lost)
            return;
        s->lost = 1;
        /* COMMAND no longer has the lock's protection and someone else may
         * hold it already: stop COMMAND now, firmly after the grace. */
        cli_error("lost the lock '%s': %s; sending SIGTERM to COMMAND (pid %ld), "
                  "SIGKILL after %" PRId64 " ms",
                  s->opts->name, dlock_strerror(reason), (long)s->pid, s->opts->grace_ms);
        kill(s->pid, SIGTERM);
        s->kill_at = now_ms() + s->opts->grace_ms;
    } else if (byte >= WAKE_NOTED) {
        s->stop_signal = byte - WAKE_NOTED;
    } else if (byte != SIGCHLD) {
        /* Until it is reaped, COMMAND's pid cannot be reused: safe to kill. */
        kill(s->pid, byte);
        s->stop_signal = byte;
    }
}

static void drain_wake_pipe(supervisor *s)
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

static void reap(supervisor *s, int options)
{
    pid_t r;
    while ((r = waitpid(s->pid, &s->status, options)) < 0 && errno == EINTR)
        ;
    if (r == s->pid) {
        s->pid = 0;
    } else if (r < 0) {
        /* Only if SIGCHLD were ignored, which install_handlers prevents. */
        cli_error("waitpid: %s", strerror(errno));
        s->status = W_EXITCODE(CLI_EXIT_SOFTWARE, 0);
        s->pid = 0;
    }
}

/*
 * Wait for COMMAND to end, forwarding signals and stopping it if the lock is
 * lost. On return s->status is COMMAND's wait status.
 */
static void supervise(supervisor *s)
{
    struct pollfd pfd = {.fd = s->wake_read, .events = POLLIN};
    /* A wake-up may have come before the child existed: look first. */
    drain_wake_pipe(s);
    reap(s, WNOHANG);
    while (s->pid > 0) {
        int timeout = -1;
        if (s->kill_at > 0) {
            int64_t left = s->kill_at - now_ms();
            timeout = left > 0 ? (int)(left < INT32_MAX ? left : INT32_MAX) : 0;
        }
        int n = poll(&pfd, 1, timeout);
        if (n < 0 && errno != EINTR) {
            /* Cannot happen short of a bug; without the loop COMMAND would
             * run unsupervised, so stop it and wait. */
            cli_error("poll: %s; stopping COMMAND", strerror(errno));
            kill(s->pid, SIGKILL);
            reap(s, 0);
            break;
        }
        if (n > 0)
            drain_wake_pipe(s);
        reap(s, WNOHANG);
        if (s->pid > 0 && s->kill_at > 0 && now_ms() >= s->kill_at) {
            s->kill_at = 0;
            cli_error("COMMAND (pid %ld) still running %" PRId64
                      " ms after SIGTERM; sending SIGKILL",
                      (long)s->pid, s->opts->grace_ms);
            kill(s->pid, SIGKILL);
        }
    }
}

/* The exit code for a wait status, as a shell gives it. */
static int status_code(int status)
{
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return CLI_EXIT_SOFTWARE;
}

/* ========================================================================
 * dlock run
 * ====================================================================== */

/*
 * What run and elect set up before they take a lock, and tear down after:
 * the saved signal actions, the plan of descriptors COMMAND inherits, the
 * wake-up pipe and the client. Opened before the library starts any thread;
 * the caller initialises it to {NULL, {-1, -1}, {NULL, 0, 0, 0}} so that
 * session_close is safe whatever session_open got to.
 */
typedef struct {
    dlock_client *client;
    int wake_pipe[2];
    fd_plan fds;
} session;

static int session_open(session *ss, const char *url)
{
    /* Before the library opens anything, and before our handlers exist. */
    save_signal_actions();
    cli_ignore_sigpipe();
    if (plan_fds(&ss->fds) != 0) {
        cli_error("out of memory");
        return CLI_EXIT_SOFTWARE;
    }
    if (pipe2(ss->wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        cli_error("pipe: %s", strerror(errno));
        return CLI_EXIT_SOFTWARE;
    }
    wake_fd = ss->wake_pipe[1];
    return cli_client_open(&ss->client, url);
}

static void session_close(session *ss)
{
    dlock_client_free(ss->client);
    free(ss->fds.keep);
    if (ss->wake_pipe[0] >= 0) {
        wake_fd = -1;
        close(ss->wake_pipe[0]);
        close(ss->wake_pipe[1]);
    }
}

int cli_run(const char *url, int argc, char **argv)
{
    run_options opts = {NULL, 30000, 0, -1, CLI_EXIT_BUSY, NULL, DLOCK_KIND_MUTEX, 0, 0, NULL, 0};
    int rc = parse_args(&opts, argc, argv);
    if (rc)
        return rc < 0 ? 0 : rc;

    dlock_lock *lock = NULL;
    char **env = NULL;
    session ss = {NULL, {-1, -1}, {NULL, 0, 0, 0}};
    supervisor s = {&opts, -1, 0, 0, 0, 0, 0};
    dlock_acquire_options ao = DLOCK_ACQUIRE_OPTIONS_INIT;
    int ran = 0; /* COMMAND was started and has ended */
    int exec_errno = 0;
    int err;

    if ((rc = session_open(&ss, url)) != 0)
        goto out;

    ao.wait_ms = opts.wait_ms;
    ao.lease_ms = opts.ttl_ms;
    ao.auto_renew = 1;
    ao.on_lost = on_lost;
    ao.kind = opts.kind;
    ao.permits = opts.permits;
    /* --permits N says how many may hold NAME at once: the latest run's N
     * wins, as if it were part of the command line's contract. */
    if (opts.kind == DLOCK_KIND_SEMAPHORE &&
        (err = dlock_semaphore_set_permits(ss.client, opts.name, opts.permits)) != DLOCK_OK) {
        rc = cli_fail(err, "cannot set the permits of '%s'", opts.name);
        goto out;
    }
    err = dlock_acquire(&lock, ss.client, opts.name, &ao);
    if (err != DLOCK_OK) {
        rc = cli_fail(err, "cannot take the lock '%s'", opts.name);
        if (err == DLOCK_EBUSY || err == DLOCK_ETIMEOUT)
            rc = opts.busy_code;
        lock = NULL;
        goto out;
    }

    if (!(env = build_environment(opts.name, dlock_lock_fence(lock)))) {
        cli_error("out of memory");
        rc = CLI_EXIT_SOFTWARE;
        goto out;
    }
    if (install_handlers() != 0) {
        cli_error("sigaction: %s", strerror(errno));
        rc = CLI_EXIT_SOFTWARE;
        goto out;
    }

    s.wake_read = ss.wake_pipe[0];
    s.pid = start_command(opts.command, env, &ss.fds, &exec_errno);
    if (s.pid == -1) {
        cli_error("cannot run '%s': %s", opts.command[0], strerror(exec_errno));
        rc = exec_errno == ENOENT ? CLI_EXIT_NOTFOUND : CLI_EXIT_NOEXEC;
        goto out;
    }
    if (s.pid < 0) {
        rc = CLI_EXIT_SOFTWARE;
        goto out;
    }
    supervise(&s);
    ran = 1;
    rc = s.lost ? CLI_EXIT_LOST : status_code(s.status);

out:
    if (lock) {
        err = dlock_release(lock);
        if (err == DLOCK_ELOST && ran && !s.lost) {
            /* Lost after the last renewal and not noticed before COMMAND
             * ended: it may have run for a while without the lock. */
            cli_error("the lock '%s' was found lost when COMMAND ended (broken, or its "
                      "lease ran out, since the last renewal)",
                      opts.name);
            rc = CLI_EXIT_LOST;
        } else if (err != DLOCK_OK && err != DLOCK_ELOST) {
            /* COMMAND ran under the lock: its status stands. */
            cli_fail(err, "warning: could not release '%s' (its lease runs out by itself)",
                     opts.name);
        }
    }
    free_environment(env);
    session_close(&ss);
    return rc;
}

/* ========================================================================
 * dlock elect
 * ====================================================================== */

/* A term lasts at least this long: a COMMAND that fails at once is not
 * started again in a tight loop. */
#define ELECT_MIN_TERM_MS 1000

static void sleep_ms(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/*
 * Campaign; while leader, run COMMAND as `run` does (DLOCK_NAME,
 * DLOCK_FENCE, signals forwarded, stopped if leadership is lost); when it
 * ends, resign and campaign again. Stops after a term in which a SIGINT,
 * SIGTERM or SIGHUP reached COMMAND, or after the first with --once, with
 * COMMAND's status (76 when leadership was lost). While campaigning, those
 * signals end dlock at once: it holds nothing then.
 */
int cli_elect(const char *url, int argc, char **argv)
{
    run_options opts = {NULL, 30000, DLOCK_WAIT_FOREVER, -1, CLI_EXIT_BUSY, NULL,
                        DLOCK_KIND_MUTEX, 0, 1, NULL, 0};
    int rc = parse_args(&opts, argc, argv);
    if (rc)
        return rc < 0 ? 0 : rc;

    session ss = {NULL, {-1, -1}, {NULL, 0, 0, 0}};
    dlock_acquire_options ao = DLOCK_ACQUIRE_OPTIONS_INIT;

    if ((rc = session_open(&ss, url)) != 0)
        goto out;

    ao.wait_ms = DLOCK_WAIT_FOREVER;
    ao.lease_ms = opts.ttl_ms;
    ao.auto_renew = 1;
    ao.on_lost = on_lost;
    for (int term = 0;; term++) {
        supervisor s = {&opts, ss.wake_pipe[0], 0, 0, 0, 0, 0};
    dlock_lock *lock = NULL;
        char **env = NULL;
        int exec_errno = 0, err;
        int64_t started;

        restore_signal_actions();
        cli_ignore_sigpipe();
        err = dlock_campaign(&lock, ss.client, opts.name, opts.identity, &ao);
        if (err != DLOCK_OK) {
            if (term == 0 || err != DLOCK_ECONN) {
                rc = cli_fail(err, "elect: cannot campaign for '%s'", opts.name);
                break;
            }
            /* The server went away between terms: keep trying, as a
             * service would. */
            cli_fail(err, "elect: cannot campaign for '%s'; trying again in 1 s", opts.name);
            sleep_ms(1000);
            continue;
        }
        started = now_ms();
        if (!(env = build_environment(opts.name, dlock_lock_fence(lock)))) {
            cli_error("out of memory");
            rc = CLI_EXIT_SOFTWARE;
        } else if (install_handlers() != 0) {
            cli_error("sigaction: %s", strerror(errno));
            rc = CLI_EXIT_SOFTWARE;
        } else if ((s.pid = start_command(opts.command, env, &ss.fds, &exec_errno)) == -1) {
            cli_error("cannot run '%s': %s", opts.command[0], strerror(exec_errno));
            rc = exec_errno == ENOENT ? CLI_EXIT_NOTFOUND : CLI_EXIT_NOEXEC;
        } else if (s.pid < 0) {
            rc = CLI_EXIT_SOFTWARE;
        } else {
            supervise(&s);
            rc = s.lost ? CLI_EXIT_LOST : status_code(s.status);
        }
        free_environment(env);
        err = dlock_resign(lock);
        if (err == DLOCK_ELOST && s.pid == 0 && !s.lost && rc != CLI_EXIT_SOFTWARE) {
            cli_error("elect: leadership of '%s' was found lost when COMMAND ended (broken, "
                      "or its lease ran out, since the last renewal)", opts.name);
            rc = CLI_EXIT_LOST;
        } else if (err != DLOCK_OK && err != DLOCK_ELOST) {
            cli_fail(err, "warning: could not resign '%s' (its lease runs out by itself)",
                     opts.name);
        }
        if (s.pid != 0 || rc == CLI_EXIT_SOFTWARE || exec_errno != 0 || opts.once ||
            s.stop_signal)
            break;
        cli_error("elect: COMMAND ended (exit %d) after leading '%s'; campaigning again", rc,
                  opts.name);
        restore_signal_actions();
        cli_ignore_sigpipe();
        if (now_ms() - started < ELECT_MIN_TERM_MS)
            sleep_ms(ELECT_MIN_TERM_MS - (now_ms() - started));
    }

out:
    session_close(&ss);
    return rc;
}
