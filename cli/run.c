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
 * While --wait waits, the main thread is inside dlock_acquire (or
 * dlock_campaign) and a helper thread reads the self-pipe: SIGINT, SIGTERM
 * or SIGHUP make it call dlock_client_interrupt, so that the waiting call
 * leaves the queue, and dlock then dies of the signal, as it would have
 * without a handler. A waiter that died in the queue would be handed the
 * lock and keep it from the live ones for its whole lease.
 *
 * COMMAND dies with dlock: its process gets SIGKILL from the kernel when
 * dlock dies (PR_SET_PDEATHSIG), and with --kill-group COMMAND has a process
 * group of its own, which dlock stops on every way out, and which a guard
 * process kills if dlock is killed itself (start_guard).
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
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* ========================================================================
 * Options
 * ====================================================================== */

typedef struct {
    const char *name;
    char shown[CLI_NAME_SHOWN]; /* name as messages show it */
    int64_t ttl_ms;
    int64_t wait_ms;
    int64_t grace_ms; /* -1 until given: then 5 s, at most half the TTL */
    int busy_code; /* exit code when the lock is busy (-E) */
    char **command; /* NULL-terminated, points into argv */
    int kill_group;  /* --kill-group: COMMAND in a process group of its own */
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

/* 0 for an executable regular file, else ENOENT or EACCES, as exec would
 * fail on it. */
static int file_status(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return errno == EACCES ? EACCES : ENOENT;
    if (!S_ISREG(st.st_mode) || access(path, X_OK) != 0)
        return EACCES;
    return 0;
}

/*
 * Look COMMAND up as execvp will (a name with a '/' is a path, any other is
 * searched in $PATH), before the lock is taken: a typo is reported as 127
 * (not found) or 126 (found but not executable) at once, without waiting
 * for the lock or spending a fence, instead of hiding behind a busy lock's
 * 75. exec can still fail later (the file changed meanwhile, a missing
 * interpreter): that is reported as before. Returns 0, or the exit code
 * after printing why.
 */
static int find_command(const char *subcommand, const char *file)
{
    int e = ENOENT;

    if (*file != '\0' && strchr(file, '/')) {
        e = file_status(file);
    } else if (*file != '\0') {
        const char *path = getenv("PATH");
        if (!path)
            path = "/bin:/usr/bin"; /* glibc's execvp without PATH */
        for (const char *dir = path;; ) {
            const char *end = strchrnul(dir, ':');
            char candidate[4096];
            /* An empty entry is the current directory, as for execvp. */
            int n = end == dir ? snprintf(candidate, sizeof candidate, "%s", file)
                               : snprintf(candidate, sizeof candidate, "%.*s/%s",
                                          (int)(end - dir), dir, file);
            if (n > 0 && (size_t)n < sizeof candidate) {
                int f = file_status(candidate);
                if (f != ENOENT)
                    e = f;
                if (f == 0)
                    break;
            }
            if (*end == '\0')
                break;
            dir = end + 1;
        }
    }
    if (e == 0)
        return 0;
    if (e == ENOENT) {
        cli_error("%s: cannot run '%.200s': %s", subcommand, file,
                  strchr(file, '/') ? "no such file" : "command not found");
        return CLI_EXIT_NOTFOUND;
    }
    cli_error("%s: cannot run '%.200s': not an executable file (permission denied)", subcommand,
              file);
    return CLI_EXIT_NOEXEC;
}

/*
 * Parse "[options] NAME -- COMMAND [ARG...]" after "run" or "elect"; options
 * may come before or after NAME, and everything after "--" is COMMAND's.
 * Returns 0; -1 after printing --help (exit 0); or an exit code after a
 * usage error, or a COMMAND that cannot run (127, 126). Everything is
 * checked here, before any connection, so that a typo is reported as one
 * even when the server is down.
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
        } else if (!strcmp(arg, "--kill-group")) {
            o->kill_group = 1;
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
    if ((rc = cli_check_name(argv[0], o->name)) != 0)
        return rc;
    cli_shown_name(o->shown, sizeof o->shown, o->name);

    if (o->ttl_ms < CLI_TTL_MIN_MS) {
        cli_error("%s: --ttl must be at least 1s, got %" PRId64 " ms (the lease is renewed "
                  "every third of it, over the network)", argv[0], o->ttl_ms);
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
    return find_command(argv[0], o->command[0]);
}

/* ========================================================================
 * Wake-ups: the self-pipe and what writes to it
 * ====================================================================== */

/*
 * Bytes on the self-pipe: a signal number to forward (below 64), WAKE_NOTED
 * + a signal number that went to COMMAND by itself (the terminal's), or
 * WAKE_LOST + the negated on_lost reason (DLOCK_ELOST, DLOCK_ECONN); and
 * WAKE_QUIT, which ends the interrupter's thread.
 */
#define WAKE_QUIT 0
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
 * Waiting for the lock, interruptibly
 * ====================================================================== */

/*
 * While dlock_acquire or dlock_campaign waits in the main thread, this
 * thread reads the self-pipe, one byte at a time (what follows WAKE_QUIT
 * stays for the supervisor). The first SIGINT, SIGTERM or SIGHUP, from a
 * terminal or not, interrupts the client's waiting calls: they leave the
 * queue and return DLOCK_EINTR, and dlock dies of the signal (die_of).
 * The three signals are blocked in the main thread meanwhile, and so in
 * every thread the library starts from it, so that they reach the handler
 * in this thread and interrupt no system call of the library's.
 */
typedef struct {
    dlock_client *client;
    int wake_read;
    pthread_t thread;
    sigset_t saved_mask;
    int signal; /* the first stop signal, 0 if none; read after the join */
} interrupter;

static sigset_t stop_signals(void)
{
    sigset_t set;
    sigemptyset(&set);
    for (size_t k = 0; k < sizeof forwarded_signals / sizeof forwarded_signals[0]; k++)
        sigaddset(&set, forwarded_signals[k]);
    return set;
}

static void *interrupter_main(void *arg)
{
    interrupter *it = arg;
    sigset_t set = stop_signals();
    struct pollfd pfd = {.fd = it->wake_read, .events = POLLIN};

    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    for (;;) {
        unsigned char byte;
        ssize_t n = read(it->wake_read, &byte, 1);
        if (n < 0 && errno == EAGAIN) {
            poll(&pfd, 1, -1);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0 || byte == WAKE_QUIT)
            return NULL;
        int sig = byte >= WAKE_NOTED && byte < WAKE_LOST ? byte - WAKE_NOTED : byte;
        if (sig != SIGCHLD && byte < WAKE_LOST && it->signal == 0) {
            it->signal = sig;
            dlock_client_interrupt(it->client);
        }
    }
}

static int interrupter_start(interrupter *it, dlock_client *client, int wake_read)
{
    sigset_t set = stop_signals();

    it->client = client;
    it->wake_read = wake_read;
    it->signal = 0;
    pthread_sigmask(SIG_BLOCK, &set, &it->saved_mask);
    int e = pthread_create(&it->thread, NULL, interrupter_main, it);
    if (e != 0) {
        pthread_sigmask(SIG_SETMASK, &it->saved_mask, NULL);
        cli_error("cannot start a thread: %s", strerror(e));
        return CLI_EXIT_SOFTWARE;
    }
    return 0;
}

/* Returns the stop signal that came while waiting, 0 if none. */
static int interrupter_stop(interrupter *it)
{
    wake(WAKE_QUIT);
    pthread_join(it->thread, NULL);
    pthread_sigmask(SIG_SETMASK, &it->saved_mask, NULL);
    return it->signal;
}

/* End dlock by sig, as the signal's default action would have: a waiter
 * stopped by ^C dies of SIGINT, and the shell that ran it sees that. */
static int die_of(int sig)
{
    struct sigaction sa;
    sigset_t set;

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, NULL);
    sigemptyset(&set);
    sigaddset(&set, sig);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    raise(sig);
    return 128 + sig; /* not reached: the default action of the three ends dlock */
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

/* ========================================================================
 * Supervision: the state, and COMMAND's start
 * ====================================================================== */

typedef struct {
    const run_options *opts;
    int wake_read; /* the self-pipe's read end */
    pid_t pid;     /* COMMAND; 0 once reaped */
    int status;    /* its wait status, once reaped */
    /* --kill-group: COMMAND's process group (its pid; 0 without), and the
     * guard that kills it should dlock die (0 once reaped), with the write
     * end of the guard's pipe (-1 once closed). */
    pid_t group;
    pid_t guard;
    int guard_fd;
    int lost;        /* the lock was found lost while COMMAND ran */
    int64_t kill_at; /* 0, or when SIGKILL is due (now_ms) */
    int stop_signal; /* SIGINT, SIGTERM or SIGHUP reached dlock or COMMAND */
} supervisor;

#define SUPERVISOR_INIT(o, wake_read) {(o), (wake_read), 0, 0, 0, 0, -1, 0, 0, 0}

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
static pid_t start_guard(pid_t group, const fd_plan *fds, int *disarm_fd)
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
static void stop_guard(supervisor *s)
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
static int start_command(supervisor *s, char **env, fd_plan *fds, int *exec_errno)
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
            for (size_t k = 0; k < NRESTORED; k++)
                sigaction(restored_signals[k], &initial_actions[k], NULL);
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
static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Send sig to COMMAND: its process, or with --kill-group its whole group.
 * Until it is reaped, COMMAND's pid cannot be reused: safe to kill. Nor can
 * the group's ID while any process is left in it. */
static void signal_command(const supervisor *s, int sig)
{
    if (s->group > 0)
        kill(-s->group, sig);
    else if (s->pid > 0)
        kill(s->pid, sig);
}

/* --kill-group: is any process of COMMAND's group left (a zombie too)? */
static int group_left(const supervisor *s)
{
    return s->group > 0 && kill(-s->group, 0) == 0;
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
        cli_error("lost the lock '%s': %s; sending SIGTERM to COMMAND (%s %ld), "
                  "SIGKILL after %" PRId64 " ms",
                  s->opts->shown, dlock_strerror(reason),
                  s->group > 0 ? "process group" : "pid", (long)(s->group > 0 ? s->group : s->pid),
                  s->opts->grace_ms);
        signal_command(s, SIGTERM);
        s->kill_at = now_ms() + s->opts->grace_ms;
    } else if (byte >= WAKE_NOTED) {
        s->stop_signal = byte - WAKE_NOTED;
        /* With --kill-group COMMAND is not in the terminal's foreground
         * process group: what the terminal sent went to dlock alone. */
        if (s->group > 0)
            signal_command(s, s->stop_signal);
    } else if (byte != SIGCHLD && byte != WAKE_QUIT) {
        signal_command(s, byte);
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

/*
 * Reap COMMAND if it has ended (options WNOHANG) or when it ends (0). With
 * --kill-group dlock is a subreaper, so it also reaps, without waiting, the
 * processes of COMMAND's that were left without a parent, and the guard
 * should it die.
 */
static void reap(supervisor *s, int options)
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
            /* Only if SIGCHLD were ignored, which install_handlers prevents. */
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
static void wait_and_handle(supervisor *s, int max_ms)
{
    struct pollfd pfd = {.fd = s->wake_read, .events = POLLIN};
    int timeout = max_ms;
    if (s->kill_at > 0) {
        int64_t left = s->kill_at - now_ms();
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
static void supervise(supervisor *s)
{
    /* A wake-up may have come before the child existed: look first. */
    drain_wake_pipe(s);
    reap(s, WNOHANG);
    while (s->pid > 0) {
        wait_and_handle(s, -1);
        if (s->pid > 0 && s->kill_at > 0 && now_ms() >= s->kill_at) {
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
            s->kill_at = now_ms() + s->opts->grace_ms;
        }
        /* The last process of the group to go is a child of dlock by then
         * (subreaper), so SIGCHLD says when; the 1 s bound is a safety net
         * only. */
        while (group_left(s)) {
            wait_and_handle(s, 1000);
            if (s->kill_at > 0 && now_ms() >= s->kill_at && group_left(s)) {
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

/* Options as run and elect start from. */
static run_options default_options(int elect)
{
    run_options o;
    memset(&o, 0, sizeof o);
    o.ttl_ms = 30000;
    o.wait_ms = elect ? DLOCK_WAIT_FOREVER : 0;
    o.grace_ms = -1;
    o.busy_code = CLI_EXIT_BUSY;
    o.kind = DLOCK_KIND_MUTEX;
    o.elect = elect;
    return o;
}

/*
 * Start COMMAND under the lock and supervise it to its end; returns the exit
 * code (COMMAND's, 76 when the lock was lost). *started is set when COMMAND
 * was started (and so has ended).
 */
static int run_command(supervisor *s, session *ss, dlock_lock *lock, int *started)
{
    const run_options *o = s->opts;
    char **env = build_environment(o->name, dlock_lock_fence(lock));
    int exec_errno = 0, rc;

    *started = 0;
    if (!env) {
        cli_error("out of memory");
        return CLI_EXIT_SOFTWARE;
    }
    rc = start_command(s, env, &ss->fds, &exec_errno);
    if (rc == -1) {
        cli_error("%s: cannot run '%.200s': %s", o->elect ? "elect" : "run", o->command[0],
                  strerror(exec_errno));
        rc = exec_errno == ENOENT ? CLI_EXIT_NOTFOUND : CLI_EXIT_NOEXEC;
    } else if (rc < 0) {
        rc = CLI_EXIT_SOFTWARE;
    } else {
        *started = 1;
        supervise(s);
        rc = s->lost ? CLI_EXIT_LOST : status_code(s->status);
    }
    free_environment(env);
    return rc;
}

int cli_run(const char *url, int argc, char **argv)
{
    run_options opts = default_options(0);
    int rc = parse_args(&opts, argc, argv);
    if (rc)
        return rc < 0 ? 0 : rc;

    dlock_lock *lock = NULL;
    session ss = {NULL, {-1, -1}, {NULL, 0, 0, 0}};
    supervisor s = SUPERVISOR_INIT(&opts, -1);
    dlock_acquire_options ao = DLOCK_ACQUIRE_OPTIONS_INIT;
    interrupter it;
    int started = 0; /* COMMAND was started (and has ended) */
    int stop = 0;    /* a signal that came while waiting: dlock dies of it */
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
        rc = cli_fail(err, "cannot set the permits of '%s'", opts.shown);
        goto out;
    }
    if (install_handlers() != 0) {
        cli_error("sigaction: %s", strerror(errno));
        rc = CLI_EXIT_SOFTWARE;
        goto out;
    }
    if ((rc = interrupter_start(&it, ss.client, ss.wake_pipe[0])) != 0)
        goto out;
    err = dlock_acquire(&lock, ss.client, opts.name, &ao);
    stop = interrupter_stop(&it);
    if (err != DLOCK_OK) {
        lock = NULL;
        /* Interrupted: the waiter has left the queue; die of the signal. */
        if (err != DLOCK_EINTR || !stop)
            rc = cli_fail(err, "cannot take the lock '%s'", opts.shown);
        if (err == DLOCK_EBUSY || err == DLOCK_ETIMEOUT)
            rc = opts.busy_code;
        goto out;
    }
    if (stop) /* the lock came with the signal: give it back, run nothing */
        goto out;

    s.wake_read = ss.wake_pipe[0];
    rc = run_command(&s, &ss, lock, &started);

out:
    if (lock) {
        err = dlock_release(lock);
        if (err == DLOCK_ELOST && started && !s.lost) {
            /* Lost after the last renewal and not noticed before COMMAND
             * ended: it may have run for a while without the lock. */
            cli_error("the lock '%s' was found lost when COMMAND ended (broken, or its "
                      "lease ran out, since the last renewal)",
                      opts.shown);
            rc = CLI_EXIT_LOST;
        } else if (err != DLOCK_OK && err != DLOCK_ELOST) {
            /* COMMAND ran under the lock: its status stands. */
            cli_fail(err, "warning: could not release '%s' (its lease runs out by itself)",
                     opts.shown);
        }
    }
    session_close(&ss);
    return stop ? die_of(stop) : rc;
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
 * signals end dlock, as while `run` waits: it leaves the queue of
 * candidates first (etcd keeps one), then dies of the signal.
 */
int cli_elect(const char *url, int argc, char **argv)
{
    run_options opts = default_options(1);
    int rc = parse_args(&opts, argc, argv);
    if (rc)
        return rc < 0 ? 0 : rc;

    session ss = {NULL, {-1, -1}, {NULL, 0, 0, 0}};
    dlock_acquire_options ao = DLOCK_ACQUIRE_OPTIONS_INIT;
    int stop = 0;

    if ((rc = session_open(&ss, url)) != 0)
        goto out;

    ao.wait_ms = DLOCK_WAIT_FOREVER;
    ao.lease_ms = opts.ttl_ms;
    ao.auto_renew = 1;
    ao.on_lost = on_lost;
    for (int term = 0;; term++) {
        supervisor s = SUPERVISOR_INIT(&opts, ss.wake_pipe[0]);
        dlock_lock *lock = NULL;
        interrupter it;
        int started = 0, err;
        int64_t began;

        if (install_handlers() != 0) {
            cli_error("sigaction: %s", strerror(errno));
            rc = CLI_EXIT_SOFTWARE;
            break;
        }
        if ((rc = interrupter_start(&it, ss.client, ss.wake_pipe[0])) != 0)
            break;
        err = dlock_campaign(&lock, ss.client, opts.name, opts.identity, &ao);
        if ((stop = interrupter_stop(&it)) != 0) {
            if (err == DLOCK_OK)
                dlock_resign(lock);
            break;
        }
        if (err != DLOCK_OK) {
            if (term == 0 || err != DLOCK_ECONN) {
                rc = cli_fail(err, "elect: cannot campaign for '%s'", opts.shown);
                break;
            }
            /* The server went away between terms: keep trying, as a
             * service would. */
            cli_fail(err, "elect: cannot campaign for '%s'; trying again in 1 s", opts.shown);
            restore_signal_actions();
            cli_ignore_sigpipe();
            sleep_ms(1000);
            continue;
        }
        began = now_ms();
        rc = run_command(&s, &ss, lock, &started);
        err = dlock_resign(lock);
        if (err == DLOCK_ELOST && started && !s.lost) {
            cli_error("elect: leadership of '%s' was found lost when COMMAND ended (broken, "
                      "or its lease ran out, since the last renewal)", opts.shown);
            rc = CLI_EXIT_LOST;
        } else if (err != DLOCK_OK && err != DLOCK_ELOST) {
            cli_fail(err, "warning: could not resign '%s' (its lease runs out by itself)",
                     opts.shown);
        }
        if (!started || opts.once || s.stop_signal)
            break;
        cli_error("elect: COMMAND ended (exit %d) after leading '%s'; campaigning again", rc,
                  opts.shown);
        /* Between terms signals end dlock at once: it holds nothing. */
        restore_signal_actions();
        cli_ignore_sigpipe();
        if (now_ms() - began < ELECT_MIN_TERM_MS)
            sleep_ms(ELECT_MIN_TERM_MS - (now_ms() - began));
    }

out:
    session_close(&ss);
    return stop ? die_of(stop) : rc;
}
