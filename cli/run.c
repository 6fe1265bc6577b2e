/* SPDX-License-Identifier: BSD-3-Clause */
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
 * process kills if dlock is killed itself (start_guard in supervise.c).
 *
 * Here: the options of run and elect, and the two subcommands with the
 * set-up they share. The self-pipe, the handlers and the interrupter are in
 * signals.c; COMMAND's start and its supervision in supervise.c.
 */
#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ========================================================================
 * Options
 * ====================================================================== */

static int parse_duration(int64_t *out_ms, const char *command, const char *option,
                          const char *text)
{
    int err = dlock_duration_parse(out_ms, text);
    if (err != DLOCK_OK)
        return cli_fail(err, "%s: bad %s", command, option);
    return 0;
}

/*
 * The shortest --ttl on the server url names. Every lease is renewed every
 * third of it over the network, so none is shorter than CLI_TTL_MIN_MS;
 * etcd grants leases in whole seconds, so a shorter one would be held for
 * a second on the server while dlock counted less: refused rather than
 * pretended. ZooKeeper's bound is the server's maxSessionTimeout, which
 * only the server knows: the library names it when a lease exceeds it.
 * Keyed by scheme, so that the check is made before any connection.
 */
static int64_t ttl_min(const char *url, const char **why)
{
    static const struct {
        const char *scheme;
        int64_t ms;
        const char *why;
    } mins[] = {{"etcd://", 1000, "etcd grants leases in whole seconds"},
                {"etcds://", 1000, "etcd grants leases in whole seconds"}};

    for (size_t i = 0; i < sizeof mins / sizeof mins[0]; i++)
        if (strncasecmp(url, mins[i].scheme, strlen(mins[i].scheme)) == 0) {
            *why = mins[i].why;
            return mins[i].ms;
        }
    *why = "the lease is renewed every third of it, over the network";
    return CLI_TTL_MIN_MS;
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
static int set_kind(cli_run_options *o, int kind, const char *option)
{
    if (o->kind != DLOCK_KIND_MUTEX && o->kind != kind) {
        cli_error("run: %s goes with none of --shared, --exclusive, --permits", option);
        return CLI_EXIT_USAGE;
    }
    o->kind = kind;
    return 0;
}

/* A number from lo to 255 for option (-E, --command-status-offset). */
static int parse_exit_code(int *out, const char *command, const char *option, int lo,
                           const char *text)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > 255) {
        cli_error("%s: bad %s '%s' (a number, %d to 255)", command, option, text, lo);
        return CLI_EXIT_USAGE;
    }
    *out = (int)v;
    return 0;
}

int cli_command_exit_code(const cli_run_options *o, int status)
{
    int code = cli_status_code(status);
    if (code == 0 || o->status_offset == 0)
        return code;
    return code + o->status_offset > 255 ? 255 : code + o->status_offset;
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
 * interpreter): run_command then says why and gives 127 or 126 too, once
 * the lock was taken. Returns 0, or the exit code after printing why.
 */
static int find_command(const char *subcommand, const char *file)
{
    char shown[CLI_COMMAND_SHOWN];
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
        cli_error("%s: cannot run '%s': %s", subcommand, cli_shown(shown, sizeof shown, file),
                  strchr(file, '/') ? "no such file" : "command not found");
        return CLI_EXIT_NOTFOUND;
    }
    cli_error("%s: cannot run '%s': not an executable file (permission denied)", subcommand,
              cli_shown(shown, sizeof shown, file));
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
static int parse_args(cli_run_options *o, const char *url, int argc, char **argv)
{
    const char *why;
    int64_t min_ms = ttl_min(url, &why);
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
            cli_command_usage(argv[0]);
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
        } else if (!strcmp(arg, "-v") || !strcmp(arg, "--verbose")) {
            cli_verbose++;
        } else if (!strcmp(arg, "-vv")) {
            cli_verbose += 2;
        } else if (!strcmp(arg, "--stats") || !strcmp(arg, "--stats=text")) {
            o->stats = 1;
        } else if (!strcmp(arg, "--stats=json")) {
            o->stats = 1 + DLOCK_STATS_JSON;
        } else if (!strcmp(arg, "--stats=prometheus")) {
            o->stats = 1 + DLOCK_STATS_PROMETHEUS;
        } else if (!strncmp(arg, "--stats=", 8)) {
            char shown[64];
            cli_error("%s: --stats takes text, json or prometheus, not '%s'",
                      o->elect ? "elect" : "run", cli_shown(shown, sizeof shown, arg + 8));
            return CLI_EXIT_USAGE;
        } else if (!o->elect && (r = cli_option_value(argc, argv, &i, "--label", &value)) != 0) {
            size_t n;
            if (r < 0)
                return CLI_EXIT_USAGE;
            n = strlen(value);
            if (n == 0 || n > DLOCK_LABEL_MAX) {
                cli_error("run: --label must be 1 to %d bytes", DLOCK_LABEL_MAX);
                return CLI_EXIT_USAGE;
            }
            for (size_t k = 0; k < n; k++) {
                if (value[k] < 0x20 || value[k] > 0x7e) {
                    cli_error("run: --label must be printable ASCII");
                    return CLI_EXIT_USAGE;
                }
            }
            o->label = value;
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
            if ((rc = parse_duration(&o->ttl_ms, argv[0], "--ttl", value)) != 0)
                return rc;
        } else if (!o->elect && !strcmp(arg, "--wait")) {
            /* The value is optional, as with getopt's: "--wait" alone waits
             * forever. So the next argument is the value only when it reads
             * as one (a duration, "forever"); else it is NAME, "--" or an
             * option. --wait=DUR is never ambiguous. */
            int64_t ms;
            o->wait_ms = DLOCK_WAIT_FOREVER;
            if (i + 1 < argc && !strcmp(argv[i + 1], "forever"))
                i++;
            else if (i + 1 < argc && dlock_duration_parse(&ms, argv[i + 1]) == DLOCK_OK)
                o->wait_ms = ms, i++;
        } else if ((r = cli_option_value(argc, argv, &i, "-c", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            o->shell_argv[0] = "/bin/sh";
            o->shell_argv[1] = "-c";
            o->shell_argv[2] = (char *)value;
            o->shell_argv[3] = NULL;
        } else if (!o->elect && (r = cli_option_value(argc, argv, &i, "--wait", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            if (!strcmp(value, "forever"))
                o->wait_ms = DLOCK_WAIT_FOREVER;
            else if ((rc = parse_duration(&o->wait_ms, argv[0], "--wait", value)) != 0)
                return rc;
        } else if ((r = cli_option_value(argc, argv, &i, "--grace", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            if ((rc = parse_duration(&o->grace_ms, argv[0], "--grace", value)) != 0)
                return rc;
        } else if (!o->elect && (r = cli_option_value(argc, argv, &i, "-E", &value)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            if ((rc = parse_exit_code(&o->busy_code, argv[0], "-E", 0, value)) != 0)
                return rc;
        } else if ((r = cli_option_value(argc, argv, &i, "--command-status-offset", &value)) !=
                   0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            if ((rc = parse_exit_code(&o->status_offset, argv[0], "--command-status-offset", 1,
                                      value)) != 0)
                return rc;
        } else {
            cli_error("%s: unknown option '%s'%s", argv[0], arg,
                      strncmp(arg, "--url", 5) ? (o->elect ? " (try 'dlock elect --help')"
                                                           : " (try 'dlock run --help')")
                      : o->elect               ? " (--url goes before 'elect')"
                                               : " (--url goes before 'run')");
            return CLI_EXIT_USAGE;
        }
    }

    if (!o->name) {
        cli_error("%s: missing NAME (try 'dlock --help')", argv[0]);
        return CLI_EXIT_USAGE;
    }
    if (o->shell_argv[0] != NULL) {
        /* -c STRING: COMMAND is /bin/sh -c STRING, as with flock -c. */
        if (i < argc) {
            cli_error("%s: -c STRING and '-- COMMAND': give one of them", argv[0]);
            return CLI_EXIT_USAGE;
        }
        o->command = o->shell_argv;
    } else if (i >= argc) {
        cli_error("%s: missing '--' between NAME and COMMAND (or -c STRING)", argv[0]);
        return CLI_EXIT_USAGE;
    } else if (i + 1 >= argc) {
        cli_error("%s: missing COMMAND after '--'", argv[0]);
        return CLI_EXIT_USAGE;
    } else {
        o->command = argv + i + 1;
    }
    if ((rc = cli_check_name(argv[0], o->name)) != 0)
        return rc;
    cli_shown_name(o->shown, sizeof o->shown, o->name);

    if (o->ttl_ms < min_ms) {
        cli_error("%s: --ttl must be at least %" PRId64 " ms here, got %" PRId64 " ms (%s)",
                  argv[0], min_ms, o->ttl_ms, why);
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
    cli_fd_plan fds;
} session;

static int session_open(session *ss, const char *url)
{
    /* Before the library opens anything, and before our handlers exist. */
    cli_save_signal_actions();
    cli_ignore_sigpipe();
    if (cli_plan_fds(&ss->fds) != 0) {
        cli_error("out of memory");
        return CLI_EXIT_SOFTWARE;
    }
    if (cli_wake_pipe_open(ss->wake_pipe) != 0)
        return CLI_EXIT_SOFTWARE;
    return cli_client_open(&ss->client, url);
}

static void session_close(session *ss)
{
    dlock_client_free(ss->client);
    free(ss->fds.keep);
    cli_wake_pipe_close(ss->wake_pipe);
}

/* Options as run and elect start from. */
static cli_run_options default_options(int elect)
{
    cli_run_options o;
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
 * code (COMMAND's, moved by --command-status-offset; 76 when the lock was
 * lost). *started is set when COMMAND
 * was started (and so has ended).
 */
static int run_command(cli_supervisor *s, session *ss, dlock_lock *lock, int *started)
{
    const cli_run_options *o = s->opts;
    char **env = cli_build_environment(o->name, dlock_lock_fence(lock), dlock_lock_holder(lock));
    int exec_errno = 0, rc;

    *started = 0;
    if (!env) {
        cli_error("out of memory");
        return CLI_EXIT_SOFTWARE;
    }
    rc = cli_start_command(s, env, &ss->fds, &exec_errno);
    if (rc == -1) {
        char shown[CLI_COMMAND_SHOWN];
        cli_error("%s: cannot run '%s': %s", o->elect ? "elect" : "run",
                  cli_shown(shown, sizeof shown, o->command[0]), strerror(exec_errno));
        rc = exec_errno == ENOENT ? CLI_EXIT_NOTFOUND : CLI_EXIT_NOEXEC;
    } else if (rc < 0) {
        rc = CLI_EXIT_SOFTWARE;
    } else {
        *started = 1;
        cli_supervise(s);
        rc = s->lost ? CLI_EXIT_LOST : cli_command_exit_code(o, s->status);
    }
    cli_free_environment(env);
    return rc;
}

/* A span for -v: "500 ms", "30 s", "3.333 s". */
static const char *span(char *buf, size_t size, int64_t ms)
{
    if (ms < 1000)
        snprintf(buf, size, "%" PRId64 " ms", ms);
    else if (ms % 1000 == 0)
        snprintf(buf, size, "%" PRId64 " s", ms / 1000);
    else
        snprintf(buf, size, "%.*f s", ms % 100 == 0 ? 1 : 3, (double)ms / 1000);
    return buf;
}

/* A measured time for -v, from microseconds: "3.2 ms", "41.0 s". */
static const char *took(char *buf, size_t size, int64_t us)
{
    if (us < 1000000)
        snprintf(buf, size, "%.1f ms", (double)us / 1000);
    else
        snprintf(buf, size, "%.1f s", (double)us / 1000000);
    return buf;
}

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* The watchdog's renewals so far, for -v's last line. */
static uint64_t renewals(dlock_client *client)
{
    dlock_stats st = DLOCK_STATS_INIT;
    return dlock_client_stats(&st, client) == DLOCK_OK ? st.renewals : 0;
}

/* --stats at exit: the text lines (stats 1), else dlock_stats_format's
 * format stats - 1 on stderr as it is, without the "dlock: " prefix. */
static void print_stats(dlock_client *client, int stats)
{
    dlock_stats st = DLOCK_STATS_INIT;
    const char *backend;
    char *buf;
    int n;

    if (stats == 1) {
        cli_print_stats(client);
        return;
    }
    if (client == NULL || dlock_client_stats(&st, client) != DLOCK_OK)
        return;
    /* Measured first, then written into a buffer of that size. */
    backend = dlock_client_backend(client);
    n = dlock_stats_format(NULL, 0, &st, backend, stats - 1);
    if (n < 0 || (buf = malloc((size_t)n + 1)) == NULL) {
        cli_error("stats: cannot format the counters");
        return;
    }
    dlock_stats_format(buf, (size_t)n + 1, &st, backend, stats - 1);
    fputs(buf, stderr);
    fflush(stderr);
    free(buf);
}

int cli_run(const char *url, int argc, char **argv)
{
    cli_run_options opts = default_options(0);
    int rc = parse_args(&opts, url, argc, argv);
    if (rc)
        return rc < 0 ? 0 : rc;

    dlock_lock *lock = NULL;
    session ss = {NULL, {-1, -1}, {NULL, 0, 0, 0}};
    cli_supervisor s = CLI_SUPERVISOR_INIT(&opts, -1);
    dlock_acquire_options ao = DLOCK_ACQUIRE_OPTIONS_INIT;
    cli_interrupter it;
    int started = 0; /* COMMAND was started (and has ended) */
    int stop = 0;    /* a signal that came while waiting: dlock dies of it */
    int64_t asked_us, held_us = 0;
    uint64_t renewed_before = 0;
    int err;

    if ((rc = session_open(&ss, url)) != 0)
        goto out;

    ao.wait_ms = opts.wait_ms;
    ao.lease_ms = opts.ttl_ms;
    ao.auto_renew = 1;
    ao.on_lost = cli_on_lost;
    ao.kind = opts.kind;
    ao.permits = opts.permits;
    ao.label = opts.label;
    /* --permits N says how many may hold NAME at once: the latest run's N
     * wins, as if it were part of the command line's contract. */
    if (opts.kind == DLOCK_KIND_SEMAPHORE &&
        (err = dlock_semaphore_set_permits(ss.client, opts.name, opts.permits)) != DLOCK_OK) {
        rc = cli_fail(err, "cannot set the permits of '%s'", opts.shown);
        goto out;
    }
    if (cli_install_handlers() != 0) {
        cli_error("sigaction: %s", strerror(errno));
        rc = CLI_EXIT_SOFTWARE;
        goto out;
    }
    if ((rc = cli_interrupter_start(&it, ss.client, ss.wake_pipe[0])) != 0)
        goto out;
    asked_us = now_us();
    err = dlock_acquire(&lock, ss.client, opts.name, &ao);
    stop = cli_interrupter_stop(&it);
    if (err != DLOCK_OK) {
        lock = NULL;
        /* Interrupted: the waiter has left the queue; die of the signal. */
        if (err != DLOCK_EINTR || !stop)
            rc = cli_fail(err, "cannot take the lock '%s'", opts.shown);
        if (err == DLOCK_EBUSY || err == DLOCK_ETIMEOUT) {
            rc = opts.busy_code;
            cli_report_holders(ss.client, opts.name);
        }
        goto out;
    }
    if (stop) /* the lock came with the signal: give it back, run nothing */
        goto out;
    held_us = now_us();
    if (cli_verbose) {
        char t[32], lease[32], every[32];
        /* The watchdog renews every third of the lease (dlock.h). */
        renewed_before = renewals(ss.client);
        cli_error("acquired %s after %s, fence %" PRIu64 ", lease %s, renewed every %s",
                  opts.shown, took(t, sizeof t, held_us - asked_us), dlock_lock_fence(lock),
                  span(lease, sizeof lease, opts.ttl_ms),
                  span(every, sizeof every, opts.ttl_ms / 3));
    }

    s.wake_read = ss.wake_pipe[0];
    rc = run_command(&s, &ss, lock, &started);

out:
    if (lock) {
        err = dlock_release(lock);
        if (err == DLOCK_ELOST && started && !s.lost) {
            /* Lost and not noticed before COMMAND ended (broken since the
             * last renewal, or its lease ran out while a renewal was still
             * waiting for a silent server): it may have run for a while
             * without the lock. */
            rc = cli_fail(err, "the lock '%s' was lost by the time COMMAND ended", opts.shown);
        } else if (err != DLOCK_OK && err != DLOCK_ELOST) {
            /* COMMAND ran under the lock: its status stands. */
            cli_fail(err, "warning: could not release '%s' (its lease runs out by itself)",
                     opts.shown);
        } else if (err == DLOCK_OK && cli_verbose) {
            char t[32];
            uint64_t n = renewals(ss.client) - renewed_before;
            cli_error("released after %s (%" PRIu64 " renewal%s)",
                      took(t, sizeof t, now_us() - held_us), n, n == 1 ? "" : "s");
        }
    }
    if (opts.stats)
        print_stats(ss.client, opts.stats);
    session_close(&ss);
    return stop ? cli_die_of(stop) : rc;
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
    cli_run_options opts = default_options(1);
    int rc = parse_args(&opts, url, argc, argv);
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
    ao.on_lost = cli_on_lost;
    for (int term = 0;; term++) {
        cli_supervisor s = CLI_SUPERVISOR_INIT(&opts, ss.wake_pipe[0]);
        dlock_lock *lock = NULL;
        cli_interrupter it;
        int started = 0, err;
        int64_t began;

        if (cli_install_handlers() != 0) {
            cli_error("sigaction: %s", strerror(errno));
            rc = CLI_EXIT_SOFTWARE;
            break;
        }
        if ((rc = cli_interrupter_start(&it, ss.client, ss.wake_pipe[0])) != 0)
            break;
        err = dlock_campaign(&lock, ss.client, opts.name, opts.identity, &ao);
        if ((stop = cli_interrupter_stop(&it)) != 0) {
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
            cli_restore_signal_actions();
            cli_ignore_sigpipe();
            sleep_ms(1000);
            continue;
        }
        began = cli_now_ms();
        rc = run_command(&s, &ss, lock, &started);
        err = dlock_resign(lock);
        if (err == DLOCK_ELOST && started && !s.lost) {
            rc = cli_fail(err, "elect: leadership of '%s' was lost by the time COMMAND ended",
                          opts.shown);
        } else if (err != DLOCK_OK && err != DLOCK_ELOST) {
            cli_fail(err, "warning: could not resign '%s' (its lease runs out by itself)",
                     opts.shown);
        }
        if (!started || opts.once || s.stop_signal)
            break;
        cli_error("elect: COMMAND ended (exit %d) after leading '%s'; campaigning again",
                  cli_status_code(s.status), opts.shown);
        /* Between terms signals end dlock at once: it holds nothing. */
        cli_restore_signal_actions();
        cli_ignore_sigpipe();
        if (cli_now_ms() - began < ELECT_MIN_TERM_MS)
            sleep_ms(ELECT_MIN_TERM_MS - (cli_now_ms() - began));
    }

out:
    if (opts.stats)
        print_stats(ss.client, opts.stats);
    session_close(&ss);
    return stop ? cli_die_of(stop) : rc;
}

