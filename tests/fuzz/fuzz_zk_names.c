/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target, in process: what the ZooKeeper backend parses of what
 * it finds in the tree (zk_path.c, zk_lock.c): lock directory names
 * (dlock__zk_unescape), children's names (Curator's "_c_<uuid>-" protection
 * and "lock-" + 10-digit sequence: dlock__zk_find_protected,
 * dlock__zk_mutex_seq, dlock__zk_sort_children), a token as a protection
 * UUID (dlock__zk_uuid) and a node's data (holder record, lease_ms=,
 * owner=, fence=: dlock__zk_parse_data, dlock__zk_data_owner_is). No
 * server.
 *
 * Input: the whole input is a node's data; split on '\n' (up to 64 lines),
 * its lines are a directory's children, the first also a token and an
 * escaped lock name.
 *
 * Invariants: an unescaped name is one dlock could have written (it
 * escapes back the same); a UUID is 8-4-4-4-12 lower-case hex; a found
 * protection names a child with that prefix and none is missed; a sequence
 * is 10 digits ending the name after its last "lock-"; the children are
 * sorted by it; node data gives a lease > 0 or -1, a fence within 1 ..
 * INT64_MAX (a czxid) or none, and a holder whose texts are NUL-ended.
 * No crash, leak or undefined behaviour (ASan, UBSan, LSan).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/zk/zk_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_KIDS 64

static void die(const char *what)
{
    fprintf(stderr, "fuzz_zk_names: %s\n", what);
    abort();
}

static void check_data(const char *data, int len)
{
    dlock_lock_info info;

    memset(&info, 0, sizeof(info));
    dlock__zk_parse_data(data, len, &info);
    if (info.ttl_ms != -1 && info.ttl_ms <= 0)
        die("a lease of 0 or less taken from node data");
    if (info.fence > (uint64_t)INT64_MAX)
        die("a fence above INT64_MAX (no czxid) taken from node data");
    if (info.has_holder &&
        (memchr(info.host, '\0', sizeof(info.host)) == NULL ||
         memchr(info.label, '\0', sizeof(info.label)) == NULL))
        die("a holder text without its NUL");
    (void)dlock__zk_data_owner_is(data, len, "owner-1");
    (void)dlock__zk_data_owner_is(data, len, "");
}

static void check_name(const char *s)
{
    char *name = dlock__zk_unescape(s);

    if (name == NULL)
        return;
    if (strlen(name) > strlen(s))
        die("an unescaped name longer than its component");
    free(name);
}

static void check_kids(char **kids, int n, const char *token)
{
    struct String_vector v = {n, kids};
    char uuid[DLOCK__ZK_UUID_LEN + 1], want[DLOCK__ZK_UUID_LEN + 8];
    const char *last = NULL;
    int at;

    dlock__zk_uuid(token, uuid);
    if (strlen(uuid) != DLOCK__ZK_UUID_LEN)
        die("a UUID of another length");
    for (int i = 0; i < DLOCK__ZK_UUID_LEN; i++) {
        int dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? uuid[i] != '-' : strchr("0123456789abcdef", uuid[i]) == NULL || !uuid[i])
            die("a UUID not in 8-4-4-4-12 lower-case hex");
    }
    snprintf(want, sizeof(want), "_c_%s-", uuid);
    at = dlock__zk_find_protected(&v, uuid);
    for (int i = 0; i < n; i++)
        if (strncmp(kids[i], want, strlen(want)) == 0 && (at < 0 || at > i))
            die("a protected child missed");
    if (at >= n || (at >= 0 && strncmp(kids[at], want, strlen(want)) != 0))
        die("a protection found on a child without it");

    dlock__zk_sort_children(&v, DLOCK__ZK_LOCK_NAME);
    for (int i = 0; i < n; i++) {
        const char *seq = dlock__zk_mutex_seq(kids[i]), *p;
        if (seq == NULL)
            continue;
        if (strlen(seq) != 10 || strspn(seq, "0123456789") != 10 || seq < kids[i] + 5 ||
            strncmp(seq - 5, DLOCK__ZK_LOCK_NAME, 5) != 0)
            die("a sequence that is not 10 digits after \"lock-\"");
        if ((p = strstr(seq, DLOCK__ZK_LOCK_NAME)) != NULL)
            die("a sequence before the last \"lock-\"");
        if (last != NULL && strcmp(last, seq) > 0)
            die("children not sorted by sequence");
        last = seq;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf, *kids[MAX_KIDS];
    int n = 0;

    if (size > 4096)
        return 0;
    check_data((const char *)data, (int)size);
    check_data(NULL, 0);
    if ((buf = malloc(size + 1)) == NULL)
        return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    for (char *p = buf, *nl; p != NULL && n < MAX_KIDS; p = nl != NULL ? nl + 1 : NULL) {
        if ((nl = strchr(p, '\n')) != NULL)
            *nl = '\0';
        kids[n++] = p;
    }
    check_name(kids[0]);
    check_kids(kids, n, kids[0]);
    free(buf);
    return 0;
}
