/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock status NAME, dlock release --force NAME: look at a lock and break it,
 * as an administrator, without taking it.
 */
#include "cli.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* Room for a whole NAME with every URL in it redacted: at worst each 5
 * bytes "a:" "//@" become 8, with "***" before the '@'. */
#define CLI_NAME_OUT (DLOCK_NAME_MAX / 5 * 8 + 8)

/* NAME as the output shows it: whole, as given (a script may read it), but
 * for a URL's password, which is redacted as in messages (cli_redact). */
static const char *shown_whole(char buf[CLI_NAME_OUT], const char *name)
{
    cli_redact(buf, CLI_NAME_OUT, name);
    return buf;
}

/*
 * Parse "[--force] [--] NAME" after the subcommand's name. force is NULL for
 * a subcommand without --force. Returns 0; -1 after printing --help (exit
 * 0); or an exit code, after printing a usage error.
 */
static int parse_args(int argc, char **argv, int *force, const char **name)
{
    int i = 1;
    for (; i < argc && argv[i][0] == '-' && argv[i][1] != '\0'; i++) {
        if (!strcmp(argv[i], "--")) {
            i++;
            break;
        }
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            cli_usage(0);
            return -1;
        }
        if (force && !strcmp(argv[i], "--force")) {
            *force = 1;
            continue;
        }
        cli_error("%s: unknown option '%s' (try 'dlock --help')", argv[0], argv[i]);
        return CLI_EXIT_USAGE;
    }
    if (i >= argc) {
        cli_error("%s: missing NAME (try 'dlock --help')", argv[0]);
        return CLI_EXIT_USAGE;
    }
    if (i + 1 < argc) {
        cli_error("%s: unexpected argument '%s' after NAME", argv[0], argv[i + 1]);
        return CLI_EXIT_USAGE;
    }
    *name = argv[i];
    return cli_check_name(argv[0], *name);
}

/* "held, fence 42, ttl 2931 ms" or "free, fence 42". */
static void describe(char *buf, size_t size, const dlock_lock_info *info)
{
    if (!info->held)
        snprintf(buf, size, "free, fence %" PRIu64, info->fence);
    else if (info->ttl_ms < 0)
        snprintf(buf, size, "held, fence %" PRIu64 ", no expiry", info->fence);
    else
        snprintf(buf, size, "held, fence %" PRIu64 ", ttl %" PRId64 " ms", info->fence,
                 info->ttl_ms);
}

int cli_status(const char *url, int argc, char **argv)
{
    const char *name = NULL;
    int rc = parse_args(argc, argv, NULL, &name);
    if (rc)
        return rc < 0 ? 0 : rc;

    dlock_client *client;
    cli_ignore_sigpipe();
    if ((rc = cli_client_open(&client, url)) != 0)
        return rc;
    dlock_lock_info info;
    char shown[CLI_NAME_SHOWN];
    int err = dlock_status(&info, client, name);
    if (err != DLOCK_OK) {
        rc = cli_fail(err, "status of '%s'", cli_shown_name(shown, sizeof shown, name));
    } else {
        char text[128], whole[CLI_NAME_OUT];
        describe(text, sizeof text, &info);
        printf("%s: %s\n", shown_whole(whole, name), text);
    }
    dlock_client_free(client);
    return rc;
}

int cli_release(const char *url, int argc, char **argv)
{
    const char *name = NULL;
    int force = 0;
    int rc = parse_args(argc, argv, &force, &name);
    if (rc)
        return rc < 0 ? 0 : rc;
    if (!force) {
        /* A release by someone who does not hold the lock breaks it for the
         * one who does; make that a deliberate act. */
        cli_error("release: only 'release --force NAME' exists: it breaks the lock "
                  "whoever holds it (a `run` releases its own lock when COMMAND exits)");
        return CLI_EXIT_USAGE;
    }

    dlock_client *client;
    cli_ignore_sigpipe();
    if ((rc = cli_client_open(&client, url)) != 0)
        return rc;
    dlock_lock_info removed;
    char shown[CLI_NAME_SHOWN];
    int err = dlock_force_release(&removed, client, name);
    if (err != DLOCK_OK) {
        rc = cli_fail(err, "release of '%s'", cli_shown_name(shown, sizeof shown, name));
    } else if (removed.held) {
        char text[128], whole[CLI_NAME_OUT];
        describe(text, sizeof text, &removed);
        printf("%s: released by force (was %s)\n", shown_whole(whole, name), text);
    } else {
        char whole[CLI_NAME_OUT];
        printf("%s: not held, nothing removed (fence %" PRIu64 ")\n", shown_whole(whole, name),
               removed.fence);
    }
    dlock_client_free(client);
    return rc;
}
