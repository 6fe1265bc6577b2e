/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock status NAME, dlock list [PREFIX], dlock release --force NAME: look at
 * locks and break one, as an administrator, without taking it.
 */
#include "cli.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Room for a whole NAME with every URL in it redacted and every byte
 * escaped: at worst each 5 bytes "a:" "//@" become 8, with "***" before the
 * '@', and each byte "\xNN". */
#define CLI_NAME_OUT ((DLOCK_NAME_MAX / 5 * 8 + 8) * 4)

/* NAME as the output shows it: whole, as given (a script may read it), but
 * for a URL's password, which is redacted as in messages, and its control
 * bytes and invalid UTF-8, shown as "\xNN" (cli_printable). */
static const char *shown_whole(char buf[CLI_NAME_OUT], const char *name)
{
    cli_printable(buf, CLI_NAME_OUT, name);
    return buf;
}

/*
 * Parse "[--force] [--json] [--] NAME" after the subcommand's name. force
 * and json are NULL for a subcommand without that option; with
 * name_optional (list), NAME may be left out (*name stays NULL). Returns 0;
 * -1 after printing --help (exit 0); or an exit code, after printing a
 * usage error.
 */
static int parse_args(int argc, char **argv, int *force, int *json, int name_optional,
                      const char **name)
{
    int i = 1;
    for (; i < argc && argv[i][0] == '-' && argv[i][1] != '\0'; i++) {
        if (!strcmp(argv[i], "--")) {
            i++;
            break;
        }
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            cli_command_usage(argv[0]);
            return -1;
        }
        if (force && !strcmp(argv[i], "--force")) {
            *force = 1;
            continue;
        }
        if (json && !strcmp(argv[i], "--json")) {
            *json = 1;
            continue;
        }
        cli_error("%s: unknown option '%s' (try 'dlock %s --help')", argv[0], argv[i], argv[0]);
        return CLI_EXIT_USAGE;
    }
    if (i >= argc && name_optional)
        return 0;
    if (i >= argc) {
        cli_error("%s: missing NAME (try 'dlock %s --help')", argv[0], argv[0]);
        return CLI_EXIT_USAGE;
    }
    if (i + 1 < argc) {
        cli_error("%s: unexpected argument '%s' after %s", argv[0], argv[i + 1],
                  name_optional ? "PREFIX" : "NAME");
        return CLI_EXIT_USAGE;
    }
    *name = argv[i];
    if (name_optional && **name == '\0')
        return 0;
    return cli_check_name(argv[0], *name);
}

/* The client of status, list and release (they take no lock: no signal
 * handling beyond SIGPIPE). 0, or the exit code after reporting why. */
static int admin_open(dlock_client **client, const char *url)
{
    cli_ignore_sigpipe();
    return cli_client_open(client, url);
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

/* ", holder HOST pid PID since 2024-05-01T10:00:00.123Z (LABEL)", or "". */
static void describe_holder(char *buf, size_t size, const dlock_lock_info *info)
{
    char since[40] = "?", host[4 * DLOCK_HOST_MAX + 1], label[4 * DLOCK_LABEL_MAX + 1];
    time_t t = (time_t)(info->start_ms / 1000);
    struct tm tm;

    buf[0] = '\0';
    if (!info->held || !info->has_holder)
        return;
    if (gmtime_r(&t, &tm) != NULL) {
        size_t n = strftime(since, sizeof since, "%Y-%m-%dT%H:%M:%S", &tm);
        snprintf(since + n, sizeof since - n, ".%03dZ", (int)(info->start_ms % 1000));
    }
    cli_shown(host, sizeof host, info->host);
    cli_shown(label, sizeof label, info->label);
    snprintf(buf, size, ", holder %s pid %" PRId64 " since %s%s%s%s", host, info->pid, since,
             *label ? " (" : "", label, *label ? ")" : "");
}

/* The holders of one lock, as dlock_status_holders gives them. */
typedef struct {
    dlock_lock_info *each;
    size_t n, cap;
} holder_list;

static int add_holder(const char *name, const dlock_lock_info *info, void *payload)
{
    holder_list *hl = payload;

    (void)name;
    if (hl->n == hl->cap) {
        size_t cap = hl->cap ? 2 * hl->cap : 8;
        dlock_lock_info *more = realloc(hl->each, cap * sizeof(*more));
        if (more == NULL)
            return 1; /* show those we have */
        hl->each = more, hl->cap = cap;
    }
    hl->each[hl->n++] = *info;
    return 0;
}

/* Readers, permit holders, a reentrant owner's handles: shown one a line
 * (text) or each in "holders" (JSON), read with dlock_status_holders. */
static int several(const dlock_lock_info *info)
{
    return info->held && (info->holders > 1 || info->kind == DLOCK_KIND_READ ||
                          info->kind == DLOCK_KIND_SEMAPHORE);
}

/* The holders of name into *hl: a second round trip for a lock several
 * hold, else the one info shows. 0, or the exit code after reporting. */
static int read_holders(dlock_client *client, const char *name, const dlock_lock_info *info,
                        holder_list *hl)
{
    char shown[CLI_NAME_SHOWN];
    int err;

    if (!info->held)
        return 0;
    if (!several(info))
        return add_holder(name, info, hl) ? cli_fail(DLOCK_ENOMEM, "out of memory") : 0;
    if ((err = dlock_status_holders(client, name, add_holder, hl)) != DLOCK_OK)
        return cli_fail(err, "holders of '%s'", cli_shown_name(shown, sizeof shown, name));
    return 0;
}

static const char *holder_word(int kind, size_t n)
{
    if (kind == DLOCK_KIND_READ)
        return n == 1 ? "reader" : "readers";
    if (kind == DLOCK_KIND_SEMAPHORE)
        return n == 1 ? "permit holder" : "permit holders";
    return n == 1 ? "holder" : "holders";
}

/* One line for a lock with one holder; with several, "NAME: held by 3
 * readers, fence 42, ttl 2931 ms" and a line for each. */
static void print_text(FILE *out, const char *name, const dlock_lock_info *info,
                       const holder_list *hl)
{
    char text[128], holder[4 * (DLOCK_HOST_MAX + DLOCK_LABEL_MAX) + 128], whole[CLI_NAME_OUT];

    describe(text, sizeof text, info);
    if (!several(info)) {
        describe_holder(holder, sizeof holder, info);
        fprintf(out, "%s: %s%s\n", shown_whole(whole, name), text, holder);
        return;
    }
    fprintf(out, "%s: held by %d %s, %s\n", shown_whole(whole, name), info->holders,
            holder_word(info->kind, (size_t)info->holders), text + strlen("held, "));
    for (size_t i = 0; i < hl->n; i++) {
        describe(text, sizeof text, &hl->each[i]);
        describe_holder(holder, sizeof holder, &hl->each[i]);
        fprintf(out, "  %s %s%s\n", holder_word(info->kind, 1), text + strlen("held, "),
                holder);
    }
}

static void print_json_holder(const dlock_lock_info *info)
{
    if (!info->held || !info->has_holder) {
        fputs("null", stdout);
        return;
    }
    fputs("{\"host\": ", stdout);
    cli_json_string(stdout, info->host);
    printf(", \"pid\": %" PRId64 ", \"start_ms\": %" PRId64 ", \"label\": ", info->pid,
           info->start_ms);
    if (info->label[0] != '\0')
        cli_json_string(stdout, info->label);
    else
        fputs("null", stdout);
    fputs("}", stdout);
}

static const char *kind_name(int kind)
{
    static const char *const names[] = {"mutex", "fair", "read", "write", "semaphore", "leader"};
    return kind >= DLOCK_KIND_MUTEX && kind <= DLOCK_KIND_LEADER ? names[kind] : NULL;
}

/* {"name": ..., "held": ..., "fence": ..., "ttl_ms": ..., "holder": ...,
 * "kind": ..., "holders": [{"fence": ..., "ttl_ms": ..., "holder": ...}]}:
 * the name whole but for a URL's password, as the text shows it. */
static void print_json(const char *name, const dlock_lock_info *info, const holder_list *hl)
{
    char whole[CLI_NAME_OUT];

    fputs("{\"name\": ", stdout);
    cli_redact(whole, sizeof whole, name); /* JSON escapes by its own rules */
    cli_json_string(stdout, whole);
    printf(", \"held\": %s, \"fence\": %" PRIu64 ", \"ttl_ms\": %" PRId64 ", \"holder\": ",
           info->held ? "true" : "false", info->fence, info->ttl_ms);
    print_json_holder(info);
    fputs(", \"kind\": ", stdout);
    if (kind_name(info->kind) != NULL)
        printf("\"%s\"", kind_name(info->kind));
    else
        fputs("null", stdout);
    fputs(", \"holders\": [", stdout);
    for (size_t i = 0; i < hl->n; i++) {
        printf("%s{\"fence\": %" PRIu64 ", \"ttl_ms\": %" PRId64 ", \"holder\": ",
               i ? ", " : "", hl->each[i].fence, hl->each[i].ttl_ms);
        print_json_holder(&hl->each[i]);
        fputs("}", stdout);
    }
    fputs("]}", stdout);
}

void cli_report_holders(dlock_client *client, const char *name)
{
    dlock_lock_info info;
    holder_list hl = {NULL, 0, 0};
    char *text = NULL, *line, *save = NULL;
    size_t len = 0;
    FILE *out;

    /* Free again already (or unreadable): the busy message stands alone. */
    if (dlock_status(&info, client, name) != DLOCK_OK || !info.held ||
        read_holders(client, name, &info, &hl) != 0 || (out = open_memstream(&text, &len)) == NULL) {
        free(hl.each);
        return;
    }
    print_text(out, name, &info, &hl);
    fclose(out);
    for (line = strtok_r(text, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save))
        cli_error("%s", line);
    free(text);
    free(hl.each);
}

int cli_status(const char *url, int argc, char **argv)
{
    const char *name = NULL;
    int json = 0;
    int rc = parse_args(argc, argv, NULL, &json, 0, &name);
    if (rc)
        return rc < 0 ? 0 : rc;

    dlock_client *client;
    if ((rc = admin_open(&client, url)) != 0)
        return rc;
    dlock_lock_info info;
    holder_list hl = {NULL, 0, 0};
    char shown[CLI_NAME_SHOWN];
    int err = dlock_status(&info, client, name);
    if (err != DLOCK_OK) {
        rc = cli_fail(err, "status of '%s'", cli_shown_name(shown, sizeof shown, name));
    } else if ((rc = read_holders(client, name, &info, &hl)) != 0) {
        /* reported */
    } else if (json) {
        print_json(name, &info, &hl);
        putchar('\n');
    } else {
        print_text(stdout, name, &info, &hl);
    }
    free(hl.each);
    dlock_client_free(client);
    return rc;
}

/* dlock list: each lock as status prints it; --json: one array. The
 * listing is gathered first: the holders of a lock several hold are read
 * after it, not from inside dlock_list's callback. */
typedef struct {
    char *name;
    dlock_lock_info info;
} listed;

typedef struct {
    listed *each;
    size_t n, cap;
    int failed;
} list_state;

static int list_one(const char *name, const dlock_lock_info *info, void *payload)
{
    list_state *ls = payload;

    if (ls->n == ls->cap) {
        size_t cap = ls->cap ? 2 * ls->cap : 16;
        listed *more = realloc(ls->each, cap * sizeof(*more));
        if (more == NULL)
            return ls->failed = 1;
        ls->each = more, ls->cap = cap;
    }
    if ((ls->each[ls->n].name = strdup(name)) == NULL)
        return ls->failed = 1;
    ls->each[ls->n++].info = *info;
    return 0;
}

int cli_list(const char *url, int argc, char **argv)
{
    const char *prefix = NULL;
    list_state ls = {NULL, 0, 0, 0};
    int json = 0;
    int rc = parse_args(argc, argv, NULL, &json, 1, &prefix);
    if (rc)
        return rc < 0 ? 0 : rc;

    dlock_client *client;
    if ((rc = admin_open(&client, url)) != 0)
        return rc;
    int err = dlock_list(client, prefix, list_one, &ls);
    if (err == DLOCK_OK && ls.failed)
        err = DLOCK_ENOMEM;
    for (size_t i = 0; i < ls.n; i++) {
        holder_list hl = {NULL, 0, 0};
        int r = read_holders(client, ls.each[i].name, &ls.each[i].info, &hl);

        if (r != 0) {
            rc = r;
        } else if (json) {
            fputs(i == 0 ? "[\n  " : ",\n  ", stdout);
            print_json(ls.each[i].name, &ls.each[i].info, &hl);
        } else {
            print_text(stdout, ls.each[i].name, &ls.each[i].info, &hl);
        }
        free(hl.each);
        free(ls.each[i].name);
    }
    if (json)
        fputs(ls.n == 0 ? "[]\n" : "\n]\n", stdout);
    if (err != DLOCK_OK)
        rc = cli_fail(err, "cannot list the locks");
    free(ls.each);
    dlock_client_free(client);
    return rc;
}

int cli_release(const char *url, int argc, char **argv)
{
    const char *name = NULL;
    int force = 0;
    int rc = parse_args(argc, argv, &force, NULL, 0, &name);
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
    if ((rc = admin_open(&client, url)) != 0)
        return rc;
    dlock_lock_info removed;
    char shown[CLI_NAME_SHOWN];
    int err = dlock_force_release(&removed, client, name);
    if (err != DLOCK_OK) {
        rc = cli_fail(err, "release of '%s'", cli_shown_name(shown, sizeof shown, name));
    } else if (removed.held) {
        char text[128], holder[4 * (DLOCK_HOST_MAX + DLOCK_LABEL_MAX) + 128], whole[CLI_NAME_OUT];
        describe(text, sizeof text, &removed);
        describe_holder(holder, sizeof holder, &removed);
        printf("%s: released by force (was %s%s)\n", shown_whole(whole, name), text, holder);
    } else {
        char whole[CLI_NAME_OUT];
        printf("%s: not held, nothing removed (fence %" PRIu64 ")\n", shown_whole(whole, name),
               removed.fence);
    }
    dlock_client_free(client);
    return rc;
}
