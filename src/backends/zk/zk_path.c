/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Paths and node names. A lock NAME lives in the directory prefix + NAME
 * ("/dlock/NAME" by default, where Curator's InterProcessMutex(client,
 * "/dlock/NAME") puts its nodes too); each acquisition is one child named as
 * Curator names a protected EPHEMERAL_SEQUENTIAL node:
 * "_c_<uuid>-lock-<10-digit sequence>". The uuid (the protection id) is the
 * acquisition's token written as a UUID, so a create whose reply was lost is
 * found again by listing the directory.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zk_int.h"

static int plain_byte(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           strchr("._:@+=,~-", c) != NULL;
}

char *dlock__zk_dir(const dlock__zk_be *be, const char *name)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t plen = strlen(be->prefix), nlen = strlen(name);
    int dots = strcmp(name, ".") == 0 || strcmp(name, "..") == 0;
    char *out = malloc(plen + 3 * nlen + 1), *o;

    if (out == NULL)
        return NULL;
    memcpy(out, be->prefix, plen);
    o = out + plen;
    for (size_t i = 0; i < nlen; i++) {
        unsigned char c = (unsigned char)name[i];
        if (plain_byte(c) && !(dots && c == '.')) {
            *o++ = (char)c;
        } else {
            *o++ = '%';
            *o++ = hex[c >> 4];
            *o++ = hex[c & 15];
        }
    }
    *o = '\0';
    return out;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

char *dlock__zk_unescape(const char *component)
{
    size_t n = strlen(component);
    char *out = malloc(n + 1), *o = out;

    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)component[i];
        if (c == '%') {
            int hi = i + 2 < n ? hexval(component[i + 1]) : -1;
            int lo = hi >= 0 ? hexval(component[i + 2]) : -1;
            if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
                free(out);
                return NULL;
            }
            *o++ = (char)(hi * 16 + lo);
            i += 2;
        } else if (plain_byte(c)) {
            *o++ = (char)c;
        } else {
            free(out);
            return NULL; /* not a name dlock wrote */
        }
    }
    *o = '\0';
    return out;
}

void dlock__zk_uuid(const char *token, char *out)
{
    /* 32 hex digits as 8-4-4-4-12; a shorter token is padded with '0'. */
    static const int groups[] = {8, 4, 4, 4, 12};
    size_t t = 0, tlen = strlen(token);
    char *o = out;

    for (int g = 0; g < 5; g++) {
        if (g > 0)
            *o++ = '-';
        for (int i = 0; i < groups[g]; i++) {
            char c = t < tlen ? token[t++] : '0';
            *o++ = hexval(c) >= 0 ? (char)(c >= 'A' && c <= 'F' ? c - 'A' + 'a' : c) : '0';
        }
    }
    *o = '\0';
}

int dlock__zk_find_protected(const struct String_vector *kids, const char *uuid)
{
    char want[DLOCK__ZK_UUID_LEN + sizeof(DLOCK__ZK_PROTECT) + 2];
    size_t len = (size_t)snprintf(want, sizeof(want), DLOCK__ZK_PROTECT "%s-", uuid);

    for (int i = 0; i < kids->count; i++)
        if (strncmp(kids->data[i], want, len) == 0)
            return i;
    return -1;
}

static const char *sort_lock_name;

/* Curator's fixForSorting: what follows the last lock_name, else the
 * whole name. */
static const char *sort_key(const char *child)
{
    const char *at = NULL, *p = child;
    size_t n = strlen(sort_lock_name);

    while ((p = strstr(p, sort_lock_name)) != NULL)
        at = p, p += n;
    return at != NULL ? at + n : child;
}

const char *dlock__zk_mutex_seq(const char *child)
{
    const char *p = strstr(child, DLOCK__ZK_LOCK_NAME), *q;

    while (p != NULL && (q = strstr(p + 1, DLOCK__ZK_LOCK_NAME)) != NULL)
        p = q; /* the last, as fixForSorting takes it */
    if (p == NULL)
        return NULL;
    p += strlen(DLOCK__ZK_LOCK_NAME);
    return strlen(p) == 10 && strspn(p, "0123456789") == 10 ? p : NULL;
}

static int by_sequence(const void *a, const void *b)
{
    return strcmp(sort_key(*(char *const *)a), sort_key(*(char *const *)b));
}

void dlock__zk_sort_children(struct String_vector *kids, const char *lock_name)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

    if (kids->count < 2)
        return;
    /* qsort has no context argument in C11: one sort at a time. */
    pthread_mutex_lock(&mu);
    sort_lock_name = lock_name;
    qsort(kids->data, (size_t)kids->count, sizeof(char *), by_sequence);
    pthread_mutex_unlock(&mu);
}

char *dlock__zk_join(const char *dir, const char *child)
{
    char *out = NULL;
    if (asprintf(&out, "%s/%s", dir, child) < 0)
        return NULL;
    return out;
}

int dlock__zk_create_protected(dlock__zk_sess *s, const char *dir, const char *uuid,
                               const char *name_part, const char *data, int len, int flags,
                               int *maybe, char **node, struct Stat *stat)
{
    return dlock__zk_create_protected_list(s, dir, uuid, name_part, data, len, flags, maybe, node,
                                           stat, NULL, NULL);
}

int dlock__zk_create_protected_list(dlock__zk_sess *s, const char *dir, const char *uuid,
                                    const char *name_part, const char *data, int len, int flags,
                                    int *maybe, char **node, struct Stat *stat,
                                    struct String_vector *kids, int *listed)
{
    char *path = NULL;
    int rc, parents = 0;

    if (listed != NULL)
        *listed = 0;

    for (int attempt = 0; attempt < 3; attempt++) {
        if (*maybe) {
            /* An earlier create may have made it: look for it first. */
            struct String_vector found = {0, NULL};
            int i;
            rc = dlock__zk_children(s, dir, &found);
            if (rc == ZNONODE) {
                rc = ZOK; /* no directory: no node of ours either */
            } else if (rc != ZOK) {
                return dlock__zk_fail(s, rc, "list", dir);
            } else if ((i = dlock__zk_find_protected(&found, uuid)) >= 0) {
                *node = dlock__zk_join(dir, found.data[i]);
                deallocate_String_vector(&found);
                if (*node == NULL)
                    return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
                rc = dlock__zk_exists(s, *node, 0, stat);
                if (rc == ZOK) {
                    *maybe = 0;
                    return DLOCK_OK;
                }
                free(*node);
                *node = NULL;
                if (rc != ZNONODE)
                    return dlock__zk_fail(s, rc, "stat", dir);
                /* deleted meanwhile: create anew */
            } else {
                deallocate_String_vector(&found);
            }
            *maybe = 0;
        }
        free(path);
        if (asprintf(&path, "%s/" DLOCK__ZK_PROTECT "%s-%s", dir, uuid, name_part) < 0)
            return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
        *maybe = 1;
        rc = kids != NULL ? dlock__zk_create_list(s, path, data, len, flags, node, stat, dir, kids,
                                                  listed)
                          : dlock__zk_create(s, path, data, len, flags, node, stat);
        if (rc == ZOK) {
            *maybe = 0;
            free(path);
            return *node != NULL ? DLOCK_OK : dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
        }
        if (rc == ZNONODE && !parents) {
            /* The directory is missing: no node was made. */
            *maybe = 0;
            parents = 1;
            if ((rc = dlock__zk_make_parents(s, path)) != ZOK)
                break;
            continue;
        }
        if (rc != ZCONNECTIONLOSS && rc != ZOPERATIONTIMEOUT) {
            /* The server refused: nothing was made. */
            *maybe = 0;
            break;
        }
        /* The reply was lost: the node may exist. The next call looks for
         * it (*maybe stays set). */
        break;
    }
    {
        int err = dlock__zk_fail(s, rc, "create", path != NULL ? path : dir);
        free(path);
        return err;
    }
}
