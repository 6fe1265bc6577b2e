/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The Redlock nodes' settings, checked at open: the proved fence holds only
 * on nodes that persist every write before replying and never evict
 * (docs/redlock.md, "Nodes keep their marks").
 */
#include <stdio.h>
#include <string.h>

#include "backends/redlock/redlock_int.h"
#include "core/error.h"

/* A setting's value as the server gave it, in buf, for a message: a word of
 * letters, digits and '-', else "?" (a message never carries a control
 * character, whatever the server sends). */
static const char *setting_text(const redisReply *v, char *buf, size_t size)
{
    size_t n = v != NULL && v->type == REDIS_REPLY_STRING ? v->len : 0;

    if (n == 0 || n >= size || strspn(v->str, "abcdefghijklmnopqrstuvwxyz0123456789-") != n)
        return "?";
    memcpy(buf, v->str, n);
    buf[n] = '\0';
    return buf;
}

/* What is wrong with a node's (setting, value) for the fence, or NULL. */
static const char *setting_flaw(const char *key, const char *value)
{
    if (strcmp(key, "appendonly") == 0 && strcmp(value, "yes") != 0)
        return "a restart loses the fence marks; the fence needs appendonly yes";
    if (strcmp(key, "appendfsync") == 0 && strcmp(value, "always") != 0)
        return "a crash of the machine can lose a fence mark; the fence needs appendfsync "
               "always";
    if (strcmp(key, "maxmemory-policy") == 0 && strncmp(value, "allkeys-", 8) == 0)
        return "the fence marks may be evicted; the fence needs noeviction or a volatile-* "
               "policy";
    return NULL;
}

/* CONFIG GET of the settings the fence needs (one request: Redis 7 takes
 * several names; older servers answer "wrong number of arguments", and are
 * asked one name at a time). */
static const char *const settings[] = {"appendonly", "appendfsync", "maxmemory-policy"};

static void settings_argv(const char **argv, size_t *lens, size_t from, size_t n)
{
    argv[0] = "CONFIG";
    argv[1] = "GET";
    for (size_t j = 0; j < n; j++)
        argv[2 + j] = settings[from + j];
    for (size_t j = 0; j < 2 + n; j++)
        lens[j] = strlen(argv[j]);
}

/* Log that node's settings could not be read, with the thread's message. */
static void settings_unknown(const dlock__redlock_node *node, const dlock_client_options *opts)
{
    char msg[512];

    if (opts->log == NULL)
        return;
    snprintf(msg, sizeof(msg), "redlock: cannot check that %s keeps its fence marks (CONFIG "
             "GET appendonly appendfsync maxmemory-policy): %s", node->link[0].conn.where,
             dlock_error_message());
    opts->log(DLOCK_LOG_WARN, msg, opts->log_payload);
}

/* Judge one CONFIG GET reply (name, value pairs) of node: DLOCK_OK, the
 * flaws logged; with strict, the first flaw as DLOCK_ESERVER. */
static int settings_judge(const dlock__redlock_node *node, const redisReply *r, int strict,
                          const dlock_client_options *opts)
{
    if (r == NULL || r->type != REDIS_REPLY_ARRAY)
        return DLOCK_OK;
    for (size_t e = 0; e + 1 < r->elements; e += 2) {
        char kb[32], vb[32], msg[512];
        const char *key = setting_text(r->element[e], kb, sizeof(kb));
        const char *value = setting_text(r->element[e + 1], vb, sizeof(vb));
        const char *flaw;
        if ((flaw = setting_flaw(key, value)) == NULL)
            continue;
        if (strict)
            return dlock__fail(DLOCK_ESERVER, "redlock: %s has %s %s: %s (strict=1)",
                               node->link[0].conn.where, key, value, flaw);
        if (opts->log != NULL) {
            snprintf(msg, sizeof(msg), "redlock: %s has %s %s: %s (docs/redlock.md)",
                     node->link[0].conn.where, key, value, flaw);
            opts->log(DLOCK_LOG_WARN, msg, opts->log_payload);
        }
    }
    return DLOCK_OK;
}

/*
 * The fence's order holds while every node keeps its marks (docs/redlock.md,
 * "Nodes keep their marks"): its AOF on, written to disk before each reply,
 * and never evicted. Each node of up (connected by open) is asked once, all
 * at once: CONFIG GET goes out behind the SCRIPT LOADs a new connection
 * owes, whose replies are skipped here. A setting that breaks the rule is a
 * DLOCK_LOG_WARN naming the node and the setting, or with strict the open's
 * DLOCK_ESERVER. A node that cannot be asked (an ACL without CONFIG answers
 * NOPERM; CONFIG renamed away; the connection lost) is logged and not
 * refused: nothing is known against it. Nodes down at open are not asked.
 */
int dlock__redlock_check_settings(dlock__redlock_be *be, unsigned up, int strict,
                                  const dlock_client_options *opts)
{
    const char *argv[5];
    size_t lens[5];
    int sent[DLOCK__REDLOCK_NODES_MAX] = {0};
    int rc = DLOCK_OK;

    settings_argv(argv, lens, 0, 3);
    for (size_t i = 0; i < be->n; i++)
        sent[i] = (up & (1u << i)) &&
                  dlock__redis_tp_append_argv(&be->nodes[i].link[0].conn.tp, 5, argv, lens) ==
                      REDIS_OK;
    for (size_t i = 0; i < be->n; i++) {
        dlock__redlock_link *l = &be->nodes[i].link[0];
        redisReply *r = NULL;
        int got = DLOCK_OK;
        if (!(up & (1u << i)))
            continue;
        if (!sent[i]) {
            settings_unknown(&be->nodes[i], opts);
            continue;
        }
        /* The owed SCRIPT LOAD replies, then ours (always read, also after
         * a refusal, so that no node is left owing one). */
        for (int k = 0; k <= l->owed && got == DLOCK_OK; k++) {
            if (r != NULL)
                freeReplyObject(r);
            r = NULL;
            if (dlock__redis_conn_get_reply(&l->conn, &r) != REDIS_OK)
                got = dlock__redis_conn_io_error(&l->conn);
        }
        l->owed = 0;
        l->first = 0;
        if (got == DLOCK_OK && r->type == REDIS_REPLY_ERROR) {
            got = dlock__redis_conn_reply_error(&l->conn, r);
            freeReplyObject(r);
            r = NULL;
        }
        if (got == DLOCK_ESERVER && strstr(dlock_error_message(), "wrong number of arguments")) {
            got = DLOCK_OK;
            for (size_t j = 0; j < 3 && got == DLOCK_OK && rc == DLOCK_OK; j++) {
                settings_argv(argv, lens, j, 1);
                if ((got = dlock__redis_conn_command_slot(&l->conn, &r, 3, argv, lens, -1)) ==
                    DLOCK_OK)
                    rc = settings_judge(&be->nodes[i], r, strict, opts);
                if (r != NULL)
                    freeReplyObject(r);
                r = NULL;
            }
            settings_argv(argv, lens, 0, 3);
        } else if (got == DLOCK_OK && rc == DLOCK_OK) {
            rc = settings_judge(&be->nodes[i], r, strict, opts);
        }
        if (r != NULL)
            freeReplyObject(r);
        if (got != DLOCK_OK)
            settings_unknown(&be->nodes[i], opts);
    }
    return rc;
}
