/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The `dlock` command: shared declarations of its parts.
 *
 * The command is built only on the public API (include/dlock/dlock.h), like
 * curl's tool on libcurl: anything it needs from the library, a user's
 * program can do too.
 */
#ifndef DLOCK_CLI_H
#define DLOCK_CLI_H

#include <dlock/dlock.h>

#include "redact.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

/*
 * Exit codes. Values from sysexits.h where one fits, so that scripts and
 * service managers already know what they mean; the command's own status
 * passes through unchanged otherwise (128+N when it died of signal N).
 */
enum {
    CLI_EXIT_USAGE = 64,       /* EX_USAGE: bad option, duration, URL, name */
    CLI_EXIT_UNAVAILABLE = 69, /* EX_UNAVAILABLE: the server cannot be reached */
    CLI_EXIT_SOFTWARE = 70,    /* EX_SOFTWARE: any other failure */
    CLI_EXIT_BUSY = 75,        /* EX_TEMPFAIL: lock not had within --wait (-E) */
    CLI_EXIT_LOST = 76,        /* the lock was lost while COMMAND ran */
    CLI_EXIT_NOPERM = 77,      /* EX_NOPERM: the server refused the credentials */
    CLI_EXIT_NOEXEC = 126,     /* COMMAND found but cannot be executed (as sh) */
    CLI_EXIT_NOTFOUND = 127    /* COMMAND not found (as sh) */
};

/* The lock server used when neither --url nor $DLOCK_URL says otherwise. */
#define CLI_DEFAULT_URL "redis://127.0.0.1:6379"

/*
 * Print "dlock: <message>" and a newline on stderr, with every URL's
 * password redacted (cli_redact). Every error and warning the command
 * prints goes through here or cli_fail.
 */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*
 * Report a failed library call: prints "dlock: <message>: <detail>", where
 * detail is dlock_error_message() (or dlock_strerror(err) when that is
 * empty), and returns the exit code for err (cli_exit_code). Call it right
 * after the failing call, before any other dlock call on this thread
 * replaces the detail.
 */
int cli_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The exit code for a library error code (ECONN 69, EAUTH 77, ...). */
int cli_exit_code(int err);

/* The shortest --ttl (run, elect) on any server: renewals every third of
 * it must get through. etcd's is longer (ttl_min in run.c). */
#define CLI_TTL_MIN_MS 100

/* Room for a NAME as messages show it (cli_shown_name), and for COMMAND. */
#define CLI_NAME_SHOWN 64
#define CLI_COMMAND_SHOWN 200

/*
 * An argument as messages (and status's output) show it: a URL's password
 * redacted and control bytes and invalid UTF-8 escaped (cli_printable), cut
 * with "..." to fit size. Returns buf.
 */
const char *cli_shown(char *buf, size_t size, const char *text);

/*
 * NAME as messages show it: cli_shown, at most CLI_NAME_SHOWN bytes, so
 * that a long NAME never crowds out what the message is about. Returns buf.
 */
const char *cli_shown_name(char *buf, size_t size, const char *name);

/*
 * Check NAME as the library will (1 to DLOCK_NAME_MAX bytes), before any
 * connection, so that a bad one is a usage error (64) even with the server
 * down. command is the subcommand, for the message. Returns 0, or
 * CLI_EXIT_USAGE after printing why.
 */
int cli_check_name(const char *command, const char *name);

/*
 * Open a client for url. On failure reports it (cli_fail) and returns the
 * exit code, with *out NULL; returns 0 on success.
 */
int cli_client_open(dlock_client **out, const char *url);

/*
 * Match argv[*i] against an option that takes a value, written "--ttl VALUE"
 * or "--ttl=VALUE" (a one-letter option also "-E9"). Returns 1 and sets
 * *value, moving *i onto a separate value; 0 when argv[*i] is not this
 * option; -1, after printing a usage error, when the value is missing.
 */
int cli_option_value(int argc, char **argv, int *i, const char *name, const char **value);

/*
 * Open /dev/null on whichever of stdin, stdout, stderr is closed. Otherwise
 * the next open() gets that number: a server connection on fd 2 would
 * receive our error messages, and COMMAND would inherit it as stderr.
 * Called first thing in main.
 */
void cli_ensure_std_fds(void);

/*
 * Keep secrets out of core dumps and debuggers: dlock's memory holds the URL
 * with its password (from --url or $DLOCK_URL) and its locks' owner tokens.
 * Sets RLIMIT_CORE's soft limit to 0 and PR_SET_DUMPABLE to 0, which also
 * covers a core_pattern that pipes cores to a helper (which may ignore the
 * limit), and keeps other processes of the same user from attaching with
 * ptrace or reading /proc/PID/mem and /proc/PID/environ. Always, whatever
 * the URL, so the rule is one and simple. Called first thing in main; a
 * failure is only reported.
 */
void cli_protect_secrets(void);

/*
 * Put RLIMIT_CORE back as dlock found it, in COMMAND's child before exec
 * (async-signal-safe). Dumpability needs no restoring: exec of a binary
 * that is not set-user-ID makes the process dumpable again.
 */
void cli_restore_core_limit(void);

/*
 * Ignore SIGPIPE. hiredis writes to its sockets with plain write(): a
 * server that closed the connection would kill dlock with SIGPIPE instead of
 * producing an error that dlock reports (and, in `run`, leave COMMAND
 * running unsupervised).
 */
void cli_ignore_sigpipe(void);

/* Print the usage text on stdout (--help) or stderr (usage errors). */
void cli_usage(int to_stderr);
/* Print one subcommand's usage on stdout (dlock SUBCOMMAND --help). */
void cli_command_usage(const char *command);

/*
 * The library's log (dlock_client_options.log) for -v: "dlock: warning:
 * MESSAGE" lines on stderr. Set cli_verbose before cli_client_open.
 */
extern int cli_verbose;
void cli_log(int level, const char *message, void *payload);

/* After a busy answer: who holds name now, as `dlock status` prints it,
 * as "dlock: NAME: held, fence F, ttl T ms, holder HOST pid PID since ...
 * (LABEL)" lines on stderr (one per holder for a lock several hold).
 * Nothing when the lock is free again or cannot be read. */
void cli_report_holders(dlock_client *client, const char *name);

/* The client's counters on stderr (--stats), "dlock: stats: ..." lines. */
void cli_print_stats(dlock_client *client);

/* Write text to out as a JSON string, quotes included: '"', '\\' and
 * bytes outside printable ASCII escaped (\u00XX). */
void cli_json_string(FILE *out, const char *text);

/* ========================================================================
 * run and elect (run.c), their signals (signals.c) and COMMAND's
 * supervision (supervise.c)
 * ====================================================================== */

/* The options of run and elect, as parse_args (run.c) leaves them. */
typedef struct {
    const char *name;
    char shown[CLI_NAME_SHOWN]; /* name as messages show it */
    int64_t ttl_ms;
    int64_t wait_ms;
    int64_t grace_ms; /* -1 until given: then 5 s, at most half the TTL */
    int busy_code; /* exit code when the lock is busy (-E) */
    int status_offset; /* --command-status-offset: added to COMMAND's non-zero status */
    char **command; /* NULL-terminated, points into argv or at shell_argv */
    char *shell_argv[4]; /* -c STRING: /bin/sh -c STRING */
    int kill_group;  /* --kill-group: COMMAND in a process group of its own */
    /* run: the lock kind (--shared, --exclusive, --permits N) */
    int kind;
    int permits;
    /* elect */
    int elect;
    const char *identity; /* --id; NULL: the library's HOSTNAME:PID */
    int once;             /* --once: one term, then exit */
    const char *label;    /* run --label */
    int stats;            /* --stats */
} cli_run_options;


/* ---- signals.c ---------------------------------------------------------- */

/*
 * Bytes on the self-pipe: a signal number to forward (below 64), CLI_WAKE_NOTED
 * + a signal number that went to COMMAND by itself (the terminal's), or
 * CLI_WAKE_LOST + the negated on_lost reason (DLOCK_ELOST, DLOCK_ECONN); and
 * CLI_WAKE_QUIT, which ends the interrupter's thread.
 */
#define CLI_WAKE_QUIT 0
#define CLI_WAKE_NOTED 64
#define CLI_WAKE_LOST 128

/* Make the self-pipe (non-blocking, close-on-exec) that wakes the loop,
 * and point the handlers and cli_on_lost at it. Returns 0, or
 * CLI_EXIT_SOFTWARE after printing why. */
int cli_wake_pipe_open(int wake_pipe[2]);
/* Close it (if open), after the client and so the watchdog thread are gone. */
void cli_wake_pipe_close(int wake_pipe[2]);

/* The lock's on_lost callback: a CLI_WAKE_LOST byte on the self-pipe. */
void cli_on_lost(dlock_lock *lock, int reason, void *payload);

/* Save the dispositions of the signals dlock handles as dlock found them
 * (first thing, before any handler); put them back (between elect's terms,
 * and in COMMAND's child before exec: async-signal-safe). */
void cli_save_signal_actions(void);
void cli_restore_signal_actions(void);
/* Handle SIGINT, SIGTERM, SIGHUP (unless ignored) and SIGCHLD by writing
 * to the self-pipe. -1 with errno when sigaction fails. */
int cli_install_handlers(void);

/*
 * While dlock_acquire or dlock_campaign waits in the main thread, the
 * interrupter's thread reads the self-pipe, one byte at a time (what follows CLI_WAKE_QUIT
 * stays for the supervisor). The first SIGINT, SIGTERM or SIGHUP, from a
 * terminal or not, interrupts the client's waiting calls: they leave the
 * queue and return DLOCK_EINTR, and dlock dies of the signal (cli_die_of).
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
} cli_interrupter;

/* Start the interrupter on the self-pipe's read end, blocking the stop
 * signals in the calling thread. Returns 0, or CLI_EXIT_SOFTWARE after
 * printing why. */
int cli_interrupter_start(cli_interrupter *it, dlock_client *client, int wake_read);
/* Stop it; returns the stop signal that came while waiting, 0 if none. */
int cli_interrupter_stop(cli_interrupter *it);

/* End dlock by sig, as the signal's default action would have. */
int cli_die_of(int sig);

/* ---- supervise.c -------------------------------------------------------- */

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
} cli_fd_plan;

typedef struct {
    const cli_run_options *opts;
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
    int64_t kill_at; /* 0, or when SIGKILL is due (cli_now_ms) */
    int stop_signal; /* SIGINT, SIGTERM or SIGHUP reached dlock or COMMAND */
} cli_supervisor;

#define CLI_SUPERVISOR_INIT(o, wake_read) {(o), (wake_read), 0, 0, 0, 0, -1, 0, 0, 0}


/* Record the fds open now, before anything opens one. -1 when out of
 * memory. */
int cli_plan_fds(cli_fd_plan *plan);

/* COMMAND's environment: dlock's own without DLOCK_URL, with DLOCK_NAME,
 * DLOCK_FENCE and DLOCK_HOLDER (holder, when not NULL). NULL when out of
 * memory; free with cli_free_environment. */
char **cli_build_environment(const char *name, uint64_t fence, const char *holder);
void cli_free_environment(char **env);

/* Fork and exec COMMAND (s->opts->command), with --kill-group in its own
 * process group under a guard. 0; -1 with *exec_errno when the exec failed;
 * -2 after printing why no child could be made. */
int cli_start_command(cli_supervisor *s, char **env, cli_fd_plan *fds, int *exec_errno);

/* Supervise COMMAND to its end (and with --kill-group its whole group);
 * s->status is then its wait status. */
void cli_supervise(cli_supervisor *s);

/* The exit code for a wait status, as a shell gives it. */
int cli_status_code(int status);

/* dlock's exit code for COMMAND's wait status: cli_status_code, a non-zero
 * one moved by --command-status-offset N (to at most 255). */
int cli_command_exit_code(const cli_run_options *o, int status);

/* Milliseconds on CLOCK_MONOTONIC (since boot: > 0). */
int64_t cli_now_ms(void);

/*
 * The subcommands. argv[0] is the subcommand's name ("run", ...); url is the
 * lock server, already chosen from --url, $DLOCK_URL or the default. Each
 * returns the process's exit code.
 */
int cli_run(const char *url, int argc, char **argv);
int cli_elect(const char *url, int argc, char **argv);
int cli_status(const char *url, int argc, char **argv);
int cli_release(const char *url, int argc, char **argv);
int cli_list(const char *url, int argc, char **argv);

/*
 * `dlock demo ...`: replaces this process with the program dlock-demo of
 * dlock's own folder, argv[0] ("demo") becoming its name. Returns only when
 * that fails: CLI_EXIT_UNAVAILABLE when the demo is not installed (built
 * with -DDLOCK_BUILD_DEMO=OFF, or its package is missing), else
 * CLI_EXIT_SOFTWARE, after printing why.
 */
int cli_demo(int argc, char **argv);

#endif /* DLOCK_CLI_H */
