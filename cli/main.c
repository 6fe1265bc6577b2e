/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock: the command-line tool. Global options and dispatch to the
 * subcommands (run.c, admin.c) and to the demo program (demo.c).
 */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The synopsis of each subcommand, and what it does: `dlock --help` prints
 * them all, `dlock SUBCOMMAND --help` its own with its options. */
static const char run_synopsis[] =
    "usage: dlock [--url URL] run [--ttl DUR] [--wait DUR] [--grace DUR] [-E CODE]\n"
    "                             [--shared | --exclusive | --permits N] [--kill-group]\n"
    "                             [--command-status-offset N] [--label TEXT] [-v]\n"
    "                             [--stats] NAME (-- COMMAND [ARG...] | -c STRING)\n";
static const char elect_synopsis[] =
    "       dlock [--url URL] elect [--ttl DUR] [--grace DUR] [--id ID] [--once]\n"
    "                               [--kill-group] [--command-status-offset N] [-v]\n"
    "                               [--stats] NAME (-- COMMAND [ARG...] | -c STRING)\n";
static const char admin_synopsis[] =
    "       dlock [--url URL] status [--json] NAME\n"
    "       dlock [--url URL] list [--json] [PREFIX]\n"
    "       dlock [--url URL] release --force NAME\n";
static const char tail_synopsis[] =
    "       dlock demo [ARG...]\n"
    "       dlock --version | --help | --list-schemes | SUBCOMMAND --help\n";

static const char commands_text[] =
    "\n"
    "run       hold the lock NAME while COMMAND runs (no shell; -c: sh -c),\n"
    "          renewing it; COMMAND gets DLOCK_NAME, DLOCK_FENCE and\n"
    "          DLOCK_HOLDER in its environment\n"
    "elect     campaign to lead the election NAME; while leader, run COMMAND (as\n"
    "          run does); when it ends, resign and campaign again\n"
    "status    print whether NAME is held, its fencing token, its lease left and\n"
    "          who holds it (host, pid, since when, label)\n"
    "list      print the locks held now whose names start with PREFIX, with\n"
    "          their holders\n"
    "release   --force: break the lock NAME whoever holds it (administrators)\n"
    "demo      run the demonstration (see `dlock demo --help`)\n";

/*
 * --url's help. The schemes come from the library (dlock_scheme), the one
 * list the backends' tables make, so that a new backend shows up here, in
 * --list-schemes (the shell completions' source) and in the unknown-scheme
 * error at once; man dlock (URLS) has each one's form.
 */
static void print_url_help(FILE *out)
{
    const char *s;
    unsigned flags;
    int col = 17, missing = 0;

    fputs("\n"
          "  --url URL    lock server; default $DLOCK_URL, else " CLI_DEFAULT_URL "\n"
          "               (prefer $DLOCK_URL for a password: other users can read\n"
          "               command lines). The schemes this build knows (the forms:\n"
          "               `man dlock`, URLS; `dlock --list-schemes` lists them):\n"
          "                ", out);
    for (size_t i = 0; (s = dlock_scheme(i, &flags)) != NULL; i++) {
        int n = (int)strlen(s) + 4 + ((flags & DLOCK_SCHEME_NOT_INSTALLED) ? 1 : 0);
        if (col + n > 78) {
            fputs("\n                ", out);
            col = 17;
        }
        fprintf(out, " %s://%s", s, (flags & DLOCK_SCHEME_NOT_INSTALLED) ? "*" : "");
        col += n;
        missing |= (flags & DLOCK_SCHEME_NOT_INSTALLED) != 0;
    }
    fputs("\n", out);
    if (missing)
        fputs("               (*: its backend module is not installed)\n", out);
    fputs("               e.g. redis://[user:password@]host[:port][/db],\n"
          "               etcd://host[:port][,host[:port]...], zk://h1:2181,h2:2181\n", out);
}

/* --list-schemes: one scheme a line, for scripts and the completions. */
static void list_schemes(void)
{
    const char *s;

    for (size_t i = 0; (s = dlock_scheme(i, NULL)) != NULL; i++)
        puts(s);
}

static const char run_options_text[] =
    "  --ttl DUR    the lease, renewed every DUR/3 while COMMAND runs (30s;\n"
    "               at least 100ms, on etcd 1s; on ZooKeeper at most the\n"
    "               server's maxSessionTimeout)\n"
    "  --wait [DUR] run: how long to wait for a busy lock; 0 tries once (the\n"
    "               default, unlike flock); 'forever', or --wait alone, waits\n"
    "               as long as it takes\n"
    "  -c STRING    run STRING with /bin/sh -c instead of '-- COMMAND'\n"
    "  --grace DUR  when the lock is lost: SIGTERM to COMMAND, then SIGKILL\n"
    "               after DUR (5s, at most half of --ttl); must be shorter\n"
    "               than --ttl\n"
    "  -E CODE      run: exit code when the lock is busy (75); the holder is\n"
    "               printed as status prints it\n"
    "  --command-status-offset N\n"
    "               exit with COMMAND's non-zero status plus N (at most 255),\n"
    "               so that it cannot be taken for one of dlock's codes (N: 1\n"
    "               to 255; 128 puts COMMAND's 1..126 at 129..254)\n"
    "  --kill-group run COMMAND in a process group of its own, and stop the\n"
    "               whole group: signals, a lost lock, COMMAND's end, and\n"
    "               dlock's own death (not for COMMANDs that read the terminal)\n"
    "  --shared     run: take NAME as a reader of a read-write lock (many at once)\n"
    "  --exclusive  run: take NAME as its writer (alone; waiting writers go first)\n"
    "  --permits N  run: take one of N permits of the semaphore NAME (N: the\n"
    "               latest run's wins)\n"
    "  --label TEXT run: what `dlock status` and `dlock list` show beside the\n"
    "               holder's host and pid (1 to 128 printable ASCII bytes)\n"
    "  --id ID      elect: what observers see as the leader (HOSTNAME:PID)\n"
    "  --once       elect: exit after the first term, with COMMAND's status\n"
    "  -v           run: print when the lock was had (fence, lease, renewal\n"
    "               period) and released (held how long, renewals); and the\n"
    "               library's log on stderr: renew failures, reconnections,\n"
    "               hand-offs, losses\n"
    "  -vv          run: as -v, and a debug line per call to the server\n"
    "  --stats      print the client's counters and round-trip and wait\n"
    "               histograms on stderr at exit; --stats=json as one JSON\n"
    "               object, --stats=prometheus in Prometheus' text format\n";

static const char admin_options_text[] =
    "  --json       status, list: print JSON (an object; list: an array of\n"
    "               them) with name, held, fence, ttl_ms and holder (null, or\n"
    "               host, pid, start_ms, label)\n"
    "  --force      release: required; the holder finds its lock lost\n";

static const char footer_text[] =
    "DUR is a number with a unit d, h, m, s or ms, or several from the longest\n"
    "unit down: 90s, 1.5s, 250ms, 1h30m; a bare number is seconds (1.5).\n"
    "NAME is 1 to 512 bytes. COMMAND dies with dlock, even of SIGKILL.\n"
    "\n"
    "Exit codes: COMMAND's own (128+N if it died of signal N; plus the\n"
    "--command-status-offset); 64 usage error; 69 server unreachable; 70 internal\n"
    "error; 75 busy (-E); 76 lock lost; 77 authentication refused; 126 COMMAND\n"
    "not executable; 127 not found. COMMAND's own 64..77, 126, 127 look the same\n"
    "without --command-status-offset.\n";

void cli_usage(int to_stderr)
{
    FILE *out = to_stderr ? stderr : stdout;

    fputs(run_synopsis, out);
    fputs(elect_synopsis, out);
    fputs(admin_synopsis, out);
    fputs(tail_synopsis, out);
    fputs(commands_text, out);
    print_url_help(out);
    fputs(run_options_text, out);
    fputs(admin_options_text, out);
    fputs(footer_text, out);
}

void cli_command_usage(const char *command)
{
    /* The synopsis lines after the first start with "       dlock". */
    if (!strcmp(command, "run")) {
        fputs(run_synopsis, stdout);
        fputs("\nHold the lock NAME while COMMAND runs (no shell; -c STRING: /bin/sh -c\n"
              "STRING), renewing it; COMMAND gets DLOCK_NAME, DLOCK_FENCE and DLOCK_HOLDER\n"
              "in its environment.\n", stdout);
        print_url_help(stdout);
        fputs(run_options_text, stdout);
    } else if (!strcmp(command, "elect")) {
        printf("usage:%s", elect_synopsis + strlen("      "));
        fputs("\nCampaign to lead the election NAME; while leader, run COMMAND (as run\n"
              "does); when it ends, resign and campaign again.\n", stdout);
        print_url_help(stdout);
        fputs(run_options_text, stdout);
    } else {
        const char *line = strstr(admin_synopsis, command);
        const char *end = line != NULL ? strchr(line, '\n') : NULL;
        if (line == NULL || end == NULL) {
            cli_usage(0);
            return;
        }
        printf("usage: dlock [--url URL] %.*s\n", (int)(end - line), line);
        if (!strcmp(command, "status"))
            fputs("\nPrint whether NAME is held, its fencing token, its lease left and who\n"
                  "holds it: host, pid, since when (UTC), label.\n", stdout);
        else if (!strcmp(command, "list"))
            fputs("\nPrint the locks held now whose names start with PREFIX (all when\n"
                  "none), one a line as status prints them. It scans the server.\n", stdout);
        else
            fputs("\nBreak the lock NAME whoever holds it, and wake its waiters. The fence\n"
                  "counter is kept.\n", stdout);
        print_url_help(stdout);
        fputs(admin_options_text, stdout);
    }
    fputs(footer_text, stdout);
}

/*
 * A URL may hold a password, and the command line of a running process is
 * readable by every user (ps, /proc/PID/cmdline) for as long as it runs,
 * which for `run` is as long as COMMAND. So keep a copy and blank the
 * argument, as curl does with -u. $DLOCK_URL stays the safer way: the
 * argument is visible until this runs. Free the copy with drop_secret.
 */
static char *take_secret(const char *value)
{
    char *copy = strdup(value);
    if (copy)
        memset((char *)value, '*', strlen(value));
    return copy;
}

/* Wipe and free what take_secret gave. NULL is a no-op. */
static void drop_secret(char *copy)
{
    if (copy == NULL)
        return;
    explicit_bzero(copy, strlen(copy)); /* a memset before free may be optimised away */
    free(copy);
}

static int dispatch(const char *url, int argc, char **argv)
{
    const char *command = argv[0];
    if (!url) {
        const char *env = getenv("DLOCK_URL");
        url = env && *env ? env : CLI_DEFAULT_URL;
    }
    if (!strcmp(command, "run"))
        return cli_run(url, argc, argv);
    if (!strcmp(command, "elect"))
        return cli_elect(url, argc, argv);
    if (!strcmp(command, "status"))
        return cli_status(url, argc, argv);
    if (!strcmp(command, "release"))
        return cli_release(url, argc, argv);
    if (!strcmp(command, "list"))
        return cli_list(url, argc, argv);
    cli_error("unknown command '%s' (try 'dlock --help')", command);
    return CLI_EXIT_USAGE;
}

int main(int argc, char **argv)
{
    char *url = NULL; /* from --url; NULL: $DLOCK_URL or the default */
    int rc = CLI_EXIT_USAGE;
    int i = 1;

    cli_ensure_std_fds();
    cli_protect_secrets();
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *value;
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            cli_usage(0);
            rc = 0;
            goto out;
        }
        if (!strcmp(argv[i], "--list-schemes")) {
            list_schemes();
            rc = 0;
            goto out;
        }
        if (!strcmp(argv[i], "--version") || !strcmp(argv[i], "-V")) {
            printf("dlock %s\n", dlock_version());
            rc = 0;
            goto out;
        }
        if ((r = cli_option_value(argc, argv, &i, "--url", &value)) != 0) {
            if (r < 0)
                goto out;
            drop_secret(url); /* the last --url wins */
            if (!(url = take_secret(value))) {
                cli_error("out of memory");
                rc = CLI_EXIT_SOFTWARE;
                goto out;
            }
            continue;
        }
        cli_error("unknown option '%s' (try 'dlock --help')", argv[i]);
        goto out;
    }

    if (i >= argc) {
        cli_usage(1);
    } else if (!strcmp(argv[i], "demo")) {
        /* The demo has its own options and server set-up. */
        if (url)
            cli_error("--url before 'demo' is not used: the demo takes its own options "
                      "after 'demo' (see 'dlock demo --help')");
        else
            rc = cli_demo(argc - i, argv + i);
    } else {
        rc = dispatch(url, argc - i, argv + i);
    }
out:
    drop_secret(url);
    return rc;
}
