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
 * Print "dlock: <message>" and a newline on stderr. Every error and warning
 * the command prints goes through here or cli_fail.
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

/* The shortest --ttl (run, elect): renewals every third of it must get
 * through, and COMMAND must start well within it; etcd counts leases in
 * whole seconds anyway. */
#define CLI_TTL_MIN_MS 1000

/* Room for a NAME as messages show it (cli_shown_name). */
#define CLI_NAME_SHOWN 64

/*
 * NAME as messages show it: printable ASCII, other bytes as '?', cut with
 * "..." to fit size (at most CLI_NAME_SHOWN), so that a long NAME never
 * crowds out what the message is about. Returns buf.
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
 * Ignore SIGPIPE. hiredis writes to its sockets with plain write(): a
 * server that closed the connection would kill dlock with SIGPIPE instead of
 * producing an error that dlock reports (and, in `run`, leave COMMAND
 * running unsupervised).
 */
void cli_ignore_sigpipe(void);

/* Print the usage text on stdout (--help) or stderr (usage errors). */
void cli_usage(int to_stderr);

/*
 * The subcommands. argv[0] is the subcommand's name ("run", ...); url is the
 * lock server, already chosen from --url, $DLOCK_URL or the default. Each
 * returns the process's exit code.
 */
int cli_run(const char *url, int argc, char **argv);
int cli_elect(const char *url, int argc, char **argv);
int cli_status(const char *url, int argc, char **argv);
int cli_release(const char *url, int argc, char **argv);

#endif /* DLOCK_CLI_H */
