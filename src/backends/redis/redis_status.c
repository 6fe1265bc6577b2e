/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Redis: what the operator view reads (docs/cli.md): a lock's status and
 * holders (status.lua, one script for every kind), a forced release, and
 * the listing of held locks by SCAN over the key space (every master's on
 * a cluster).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/redis/redis_int.h"
#include "core/error.h"

/* status.lua's kind words, as DLOCK_KIND_*; -1 for '' (free, or a hold of
 * an older dlock). */
static int kind_of(const redisReply *r)
{
    static const struct {
        const char *word;
        int kind;
    } kinds[] = {{"mutex", DLOCK_KIND_MUTEX},   {"fair", DLOCK_KIND_FAIR},
                 {"write", DLOCK_KIND_WRITE},   {"leader", DLOCK_KIND_LEADER},
                 {"read", DLOCK_KIND_READ},     {"sem", DLOCK_KIND_SEMAPHORE}};

    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
        if (r->len == strlen(kinds[i].word) && memcmp(r->str, kinds[i].word, r->len) == 0)
            return kinds[i].kind;
    return -1;
}

/* status.lua's reply: {held, pttl, fence, kind, then fence, ttl, record
 * for each holder}. */
static int status_reply_ok(const redisReply *r)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 4 || (r->elements - 4) % 3 != 0 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_INTEGER ||
        r->element[2]->type != REDIS_REPLY_INTEGER || r->element[3]->type != REDIS_REPLY_STRING)
        return 0;
    for (size_t i = 4; i < r->elements; i += 3)
        if (r->element[i]->type != REDIS_REPLY_INTEGER ||
            r->element[i + 1]->type != REDIS_REPLY_INTEGER ||
            r->element[i + 2]->type != REDIS_REPLY_STRING)
            return 0;
    return 1;
}

/*
 * Read name's state with status.lua (force: and break it). *out gets the
 * lock's state, its holder fields those of the oldest holder (the lowest
 * fence) when several hold it (readers, permits, a reentrant owner's
 * handles); each, when not NULL, is called for every holder with *out as
 * that holder sees it (its fence, its lease left, its record), until it
 * returns non-zero. A record that is not one (a key set by hand) shows no
 * holder.
 */
static int read_status(dlock__redis_be *be, const char *name, int force, dlock_lock_info *out,
                       dlock_list_cb each, void *payload)
{
    dlock__redis_key_buf lock, counter, chan;
    uint64_t oldest = UINT64_MAX;
    dlock__redis_args a = {0};
    redisReply *r;
    int rc;

    dlock__redis_key(&lock, be, name, "");
    dlock__redis_key(&counter, be, name, ":fence");
    dlock__redis_key(&chan, be, name, ":release");
    dlock__redis_arg_key(&a, &lock);
    dlock__redis_arg_key(&a, &counter);
    dlock__redis_arg_str(&a, force ? "force" : "read");
    dlock__redis_arg_key(&a, &chan);
    if ((rc = dlock__redis_cmd_script(be, &dlock__redis_script_status, &r, 2, a.argc, a.argv, a.lens)) !=
        DLOCK_OK)
        return rc;
    if (!status_reply_ok(r)) {
        freeReplyObject(r);
        return dlock__redis_bad_reply(be->cmd, "the status script");
    }
    out->held = r->element[0]->integer == 1;
    out->ttl_ms = out->held ? r->element[1]->integer : 0;
    out->fence = r->element[2]->integer > 0 ? (uint64_t)r->element[2]->integer : 0;
    out->kind = out->held ? kind_of(r->element[3]) : -1;
    out->holders = out->held ? (int)((r->elements - 4) / 3) : 0;
    for (size_t i = 4; out->held && i < r->elements; i += 3) {
        uint64_t fence = (uint64_t)r->element[i]->integer;
        dlock_lock_info one = *out;

        if (fence < oldest && r->element[i + 2]->len > 0 &&
            dlock_holder_parse(&one, r->element[i + 2]->str, r->element[i + 2]->len) ==
                DLOCK_OK) {
            oldest = fence;
            *out = one;
        }
    }
    for (size_t i = 4; each != NULL && out->held && i < r->elements; i += 3) {
        dlock_lock_info one = *out;

        one.fence = r->element[i]->integer > 0 ? (uint64_t)r->element[i]->integer : 0;
        one.ttl_ms = r->element[i + 1]->integer;
        if (r->element[i + 2]->len == 0 ||
            dlock_holder_parse(&one, r->element[i + 2]->str, r->element[i + 2]->len) != DLOCK_OK)
            dlock_holder_parse(&one, NULL, 0); /* clears the fields: no record */
        if (each(name, &one, payload) != 0)
            break;
    }
    freeReplyObject(r);
    return DLOCK_OK;
}

int dlock__redis_status(void *arg, const char *name, dlock_lock_info *out)
{
    return read_status(arg, name, 0, out, NULL, NULL);
}

int dlock__redis_holders(void *arg, const char *name, dlock_list_cb cb, void *payload)
{
    dlock_lock_info info;

    memset(&info, 0, sizeof(info));
    return read_status(arg, name, 0, &info, cb, payload);
}

int dlock__redis_force_release(void *arg, const char *name, dlock_lock_info *removed)
{
    return read_status(arg, name, 1, removed, NULL, NULL);
}

/* ---- listing ----------------------------------------------------------- */

/* Append text to a SCAN pattern, with Redis' glob characters escaped. */
static size_t glob_escape(char *out, size_t at, const char *text)
{
    for (; *text != '\0'; text++) {
        if (strchr("*?[]\\", *text) != NULL)
            out[at++] = '\\';
        out[at++] = *text;
    }
    out[at] = '\0';
    return at;
}

/* The keys a lock is listed by, as status.lua reads them: "PREFIX{NAME}"
 * (the exclusive kinds), "...}:readers" and "...}:sem" (shared holds), with
 * the kinds status then reports for it. */
static const struct {
    const char *suffix;
    int shared; /* 0: any kind but READ and SEMAPHORE; else that kind */
} list_keys[] = {{"}", 0}, {"}:readers", DLOCK_KIND_READ}, {"}:sem", DLOCK_KIND_SEMAPHORE}};

/* The name in a key of list_keys, into name (DLOCK_NAME_MAX + 1 bytes);
 * the entry's index, or -1 for another key. */
static int list_key_name(const dlock__redis_be *be, const redisReply *k, char *name)
{
    size_t plen = strlen(be->prefix);

    if (k->type != REDIS_REPLY_STRING || k->len < plen + 3)
        return -1;
    if (k->str[plen] == '}' && k->str[plen + 1] == '{') {
        /* PREFIX}{TAG}{NAME}...: a cluster's key for a name starting with
         * '}' (dlock__redis_key); the rest is read as PREFIX{NAME}... */
        const char *close = memchr(k->str + plen + 2, '}', k->len - plen - 2);
        if (close == NULL || close + 1 >= k->str + k->len || close[1] != '{')
            return -1;
        plen = (size_t)(close + 1 - k->str);
        if (k->len < plen + 3)
            return -1;
    }
    for (int i = 0; i < (int)(sizeof(list_keys) / sizeof(list_keys[0])); i++) {
        size_t slen = strlen(list_keys[i].suffix), n;

        if (k->len < plen + 1 + slen + 1 ||
            memcmp(k->str + k->len - slen, list_keys[i].suffix, slen) != 0)
            continue;
        n = k->len - plen - 1 - slen;
        if (n > DLOCK_NAME_MAX || memchr(k->str + plen + 1, '\0', n) != NULL)
            return -1;
        memcpy(name, k->str + plen + 1, n);
        name[n] = '\0';
        return i;
    }
    return -1;
}

/*
 * SCAN for the keys a lock is listed by (list_keys) whose NAME starts with
 * name_prefix (the prefix's own keys have no brace), then read each one's
 * state as status does: one round trip per lock, for an operator's
 * listing. A name is listed by the key its state was read from, so once
 * (a read-write lock whose writer holds it now, and whose readers' keys
 * are not gone yet, is listed by its writer's key).
 */
static int list_on(dlock__redis_be *be, const char *pattern, int slot, dlock_list_cb cb,
                   void *payload, int *stopped)
{
    char cursor[32] = "0";
    int rc = DLOCK_OK, stop = 0;

    do {
        const char *argv[6] = {"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"};
        size_t lens[6] = {4, strlen(cursor), 5, strlen(pattern), 5, 4};
        dlock__redis_conn *conn = dlock__redis_cmd_take(be);
        redisReply *r;

        rc = dlock__redis_conn_command_slot(conn, &r, 6, argv, lens, slot);
        dlock__redis_cmd_give(be, conn);
        if (rc != DLOCK_OK)
            break;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING || r->element[0]->len >= sizeof(cursor) ||
            r->element[1]->type != REDIS_REPLY_ARRAY) {
            freeReplyObject(r);
            rc = dlock__redis_bad_reply(be->cmd, "SCAN");
            break;
        }
        memcpy(cursor, r->element[0]->str, r->element[0]->len);
        cursor[r->element[0]->len] = '\0';
        for (size_t i = 0; i < r->element[1]->elements && !stop && rc == DLOCK_OK; i++) {
            char name[DLOCK_NAME_MAX + 1];
            int key = list_key_name(be, r->element[1]->element[i], name);
            dlock_lock_info info;
            int shared;

            if (key < 0)
                continue;
            memset(&info, 0, sizeof(info));
            rc = read_status(be, name, 0, &info, NULL, NULL);
            shared = info.kind == DLOCK_KIND_READ || info.kind == DLOCK_KIND_SEMAPHORE;
            if (rc == DLOCK_OK && info.held &&
                (list_keys[key].shared ? info.kind == list_keys[key].shared : !shared))
                stop = cb(name, &info, payload) != 0;
        }
        freeReplyObject(r);
    } while (rc == DLOCK_OK && !stop && strcmp(cursor, "0") != 0);
    *stopped = stop;
    return rc;
}

/* A single server is scanned once; a cluster, master by master (each
 * reached by a slot it serves). */
int dlock__redis_list(void *arg, const char *name_prefix, dlock_list_cb cb, void *payload)
{
    dlock__redis_be *be = arg;
    size_t plen = strlen(be->prefix);
    char *pattern = malloc(2 * (plen + strlen(name_prefix)) + 8);
    char *alt = malloc(2 * (plen + strlen(name_prefix)) + 12);
    int slots[DLOCK__REDIS_LIST_MASTERS], n = 1, rc = DLOCK_OK, stop = 0;

    if (pattern == NULL || alt == NULL) {
        free(pattern);
        free(alt);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    size_t at = glob_escape(pattern, 0, be->prefix);
    pattern[at++] = '{';
    at = glob_escape(pattern, at, name_prefix);
    memcpy(pattern + at, "*}*", 4);
    /* A cluster's names that start with '}' (dlock__redis_key). */
    at = glob_escape(alt, 0, be->prefix);
    memcpy(alt + at, "}{*}{", 5);
    at = glob_escape(alt, at + 5, name_prefix);
    memcpy(alt + at, "*}*", 4);
    slots[0] = -1;
    if (be->cmd[0].is_cluster) {
        dlock__redis_conn *conn = dlock__redis_cmd_take(be);
        n = dlock__redis_cluster_masters(conn, slots, DLOCK__REDIS_LIST_MASTERS);
        dlock__redis_cmd_give(be, conn);
        if (n < 0)
            rc = n;
    }
    for (int i = 0; i < n && rc == DLOCK_OK && !stop; i++) {
        rc = list_on(be, pattern, slots[i], cb, payload, &stop);
        if (rc == DLOCK_OK && !stop && be->cmd[0].is_cluster &&
            (name_prefix[0] == '\0' || name_prefix[0] == '}') &&
            strchr(be->prefix, '{') == NULL)
            rc = list_on(be, alt, slots[i], cb, payload, &stop);
    }
    free(pattern);
    free(alt);
    return rc;
}
