/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The `dlock` command: error reporting, exit codes, option values, client
 * opening. Shared by the subcommands.
 */
#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>

/* The one function that writes error text; detail may be NULL. Whatever
 * the message echoes (an argument, the library's detail, a server's text)
 * is redacted whole and its control bytes escaped (cli_printable), before
 * the line is cut to length. */
static void verror(const char *detail, const char *fmt, va_list ap)
{
    /* One buffer and one fputs, so that the line is not interleaved with
     * COMMAND's own stderr output, which shares the file. */
    char line[1024], cut[1024];
    char *text = NULL, *whole = NULL;
    size_t n;

    if (vasprintf(&text, fmt, ap) < 0) {
        text = NULL;
        snprintf(cut, sizeof cut, "(out of memory for a message)");
    }
    if (text && asprintf(&whole, "%s%s%s", text, detail && *detail ? ": " : "",
                         detail && *detail ? detail : "") < 0)
        whole = NULL;
    if (text && !whole)
        snprintf(cut, sizeof cut, "%s", text);
    n = (size_t)snprintf(line, sizeof line, "dlock: ");
    n += cli_printable(line + n, sizeof line - n, whole ? whole : cut);
    if (n >= sizeof line - 1)
        n = sizeof line - 2; /* truncated: still end the line */
    line[n] = '\n';
    line[n + 1] = '\0';
    fputs(line, stderr);
    free(whole);
    free(text);
}

void cli_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verror(NULL, fmt, ap);
    va_end(ap);
}

int cli_fail(int err, const char *fmt, ...)
{
    const char *detail = dlock_error_message();
    if (!*detail)
        detail = dlock_strerror(err);
    va_list ap;
    va_start(ap, fmt);
    verror(detail, fmt, ap);
    va_end(ap);
    return cli_exit_code(err);
}

int cli_exit_code(int err)
{
    switch (err) {
    case DLOCK_OK:
        return 0;
    case DLOCK_EBUSY:
    case DLOCK_ETIMEOUT:
        return CLI_EXIT_BUSY;
    case DLOCK_ELOST:
        return CLI_EXIT_LOST;
    case DLOCK_ECONN:
        return CLI_EXIT_UNAVAILABLE;
    case DLOCK_EAUTH:
        return CLI_EXIT_NOPERM;
    case DLOCK_EINVAL:
    case DLOCK_ENOTSUP:
        /* The command line is checked before any call, so what the library
         * still refuses came from the user too: a malformed or unsupported
         * URL (rediss://), a name too long. */
        return CLI_EXIT_USAGE;
    default:
        return CLI_EXIT_SOFTWARE;
    }
}

const char *cli_shown(char *buf, size_t size, const char *text)
{
    /* Too long: cut on a whole character or escape, and "..." after it. */
    if (cli_printable(buf, size, text) >= size && size > 3) {
        cli_printable(buf, size - 3, text);
        strcat(buf, "...");
    }
    return buf;
}

const char *cli_shown_name(char *buf, size_t size, const char *name)
{
    return cli_shown(buf, size < CLI_NAME_SHOWN ? size : CLI_NAME_SHOWN, name);
}

int cli_check_name(const char *command, const char *name)
{
    size_t n = strlen(name);
    char shown[CLI_NAME_SHOWN];

    if (n == 0) {
        cli_error("%s: NAME is empty", command);
        return CLI_EXIT_USAGE;
    }
    if (n > DLOCK_NAME_MAX) {
        cli_error("%s: NAME is %zu bytes long, at most %d: '%s'", command, n, DLOCK_NAME_MAX,
                  cli_shown_name(shown, sizeof shown, name));
        return CLI_EXIT_USAGE;
    }
    return 0;
}

int cli_option_value(int argc, char **argv, int *i, const char *name, const char **value)
{
    const char *arg = argv[*i];
    size_t len = strlen(name);
    if (strncmp(arg, name, len) != 0)
        return 0;
    if (arg[len] == '=' && name[1] == '-') {
        *value = arg + len + 1;
        return 1;
    }
    if (arg[len] != '\0') {
        if (name[1] != '-') { /* "-E9" */
            *value = arg + len;
            return 1;
        }
        return 0; /* "--ttlx": another (unknown) option */
    }
    if (*i + 1 >= argc) {
        cli_error("option %s needs a value", name);
        return -1;
    }
    *value = argv[++*i];
    return 1;
}

int cli_client_open(dlock_client **out, const char *url)
{
    dlock_client_options opts = DLOCK_CLIENT_OPTIONS_INIT;
    /* Lets an administrator tell the command's connections apart in CLIENT LIST. */
    opts.client_name = "dlock-cli";
    if (cli_verbose)
        opts.log = cli_log;
    /* -v -v: a line per call to the server as well. */
    if (cli_verbose >= 2)
        opts.log_level = DLOCK_LOG_DEBUG;
    *out = NULL;
    int err = dlock_client_open(out, url, &opts);
    if (err != DLOCK_OK) {
        *out = NULL;
        /* The detail names the server (without a password); the URL itself
         * is not repeated because it may hold one. */
        return cli_fail(err, "cannot open the lock server");
    }
    return 0;
}

void cli_ignore_sigpipe(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_IGN;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPIPE, &sa, NULL);
}

static struct rlimit found_core_limit;
static int core_limit_changed;

void cli_protect_secrets(void)
{
    struct rlimit none;

    if (getrlimit(RLIMIT_CORE, &found_core_limit) == 0) {
        none = found_core_limit;
        none.rlim_cur = 0;
        if (setrlimit(RLIMIT_CORE, &none) == 0)
            core_limit_changed = 1;
        else
            cli_error("setrlimit(RLIMIT_CORE): %s", strerror(errno));
    }
    if (prctl(PR_SET_DUMPABLE, 0L, 0L, 0L, 0L) != 0)
        cli_error("prctl(PR_SET_DUMPABLE): %s", strerror(errno));
}

void cli_restore_core_limit(void)
{
    if (core_limit_changed)
        (void)setrlimit(RLIMIT_CORE, &found_core_limit);
}

void cli_ensure_std_fds(void)
{
    for (int fd = 0; fd <= 2; fd++) {
        /* open() returns the lowest free number: this fd. */
        if (fcntl(fd, F_GETFD) == -1 && errno == EBADF)
            (void)open("/dev/null", O_RDWR);
    }
}

/* ---- -v, --stats, --json ------------------------------------------------ */

int cli_verbose;

void cli_log(int level, const char *message, void *payload)
{
    static const char *const names[] = {"debug", "info", "warning", "error"};

    (void)payload;
    cli_error("%s: %s", level >= 0 && level <= DLOCK_LOG_ERROR ? names[level] : "log", message);
}

/* One histogram as "RANGE: COUNT" for its non-empty buckets. */
static void print_histogram(const char *what, const uint64_t *h)
{
    char line[1024];
    size_t n = 0;

    n += (size_t)snprintf(line, sizeof line, "stats: %s:", what);
    for (int i = 0; i < DLOCK_STATS_BUCKETS && n < sizeof line - 64; i++) {
        if (h[i] == 0)
            continue;
        if (i == 0)
            n += (size_t)snprintf(line + n, sizeof line - n, " <1us %" PRIu64, h[i]);
        else if (i == DLOCK_STATS_BUCKETS - 1)
            n += (size_t)snprintf(line + n, sizeof line - n, " >=%" PRIu64 "us %" PRIu64,
                                  (uint64_t)1 << (i - 1), h[i]);
        else
            n += (size_t)snprintf(line + n, sizeof line - n, " %" PRIu64 "-%" PRIu64 "us %" PRIu64,
                                  (uint64_t)1 << (i - 1), ((uint64_t)1 << i) - 1, h[i]);
    }
    if (n == strlen(what) + 8)
        snprintf(line + n, sizeof line - n, " none");
    cli_error("%s", line);
}

void cli_print_stats(dlock_client *client)
{
    dlock_stats st = DLOCK_STATS_INIT;

    if (client == NULL || dlock_client_stats(&st, client) != DLOCK_OK)
        return;
    cli_error("stats: acquires %" PRIu64 ", busy %" PRIu64 ", waits %" PRIu64 ", hand-offs %"
              PRIu64 ", renewals %" PRIu64 ", renew failures %" PRIu64 ", losses %" PRIu64,
              st.acquires, st.busy, st.waits, st.handoffs, st.renewals, st.renew_failures,
              st.losses);
    print_histogram("round trips", st.round_trip_us);
    print_histogram("waits", st.wait_us);
}

void cli_json_string(FILE *out, const char *text)
{
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(out, "\\%c", *p);
        else if (*p < 0x20 || *p >= 0x7f)
            fprintf(out, "\\u%04x", *p);
        else
            fputc(*p, out);
    }
    fputc('"', out);
}
