/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The operator view of the etcd backend: status, holders and force release
 * of a name (its holders' keys, read as etcd_family.c reads them), and the
 * listing of every name under the prefix.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/etcd/etcd_int.h"
#include "core/error.h"

/* ---- status -------------------------------------------------------------- */

/*
 * The holders are the first key of the directory, or each reader or permit
 * holder (etcd_family.c); each one's create revision is its fence. etcd
 * keeps no counter per name: when nobody holds the lock, the fence of the
 * last holder is not known and 0 is reported (docs/etcd.md).
 */
static void info_of(const dlock__etcd_holder *h, size_t n, dlock_lock_info *out)
{
    memset(out, 0, sizeof(*out));
    if (n == 0)
        return;
    /* The oldest holder's record, the longest lease left among them. */
    *out = h[0].info;
    for (size_t i = 1; i < n; i++)
        if (h[i].info.ttl_ms > out->ttl_ms)
            out->ttl_ms = h[i].info.ttl_ms;
    if (h[0].info.kind == DLOCK_KIND_MUTEX) {
        /* A mutex, fair lock or election: the core counts the one holder. */
        out->holders = 0;
        out->kind = -1;
    } else {
        out->holders = (int)n;
    }
}

static int read_holders(dlock__etcd_be *be, const char *name, int ttl, dlock__etcd_keys *k,
                        dlock__etcd_conn **c, dlock__etcd_holder **h, size_t *n)
{
    int rc;

    *h = NULL;
    *n = 0;
    *c = NULL;
    if ((rc = dlock__etcd_keys_make(k, be, name, NULL, 0)) != DLOCK_OK)
        return rc;
    if ((rc = dlock__etcd_conn_get(be->http, c)) != DLOCK_OK) {
        *c = NULL;
        return rc;
    }
    return dlock__etcd_holders_read(be, *c, k, ttl, h, n);
}

static void read_done(dlock__etcd_be *be, dlock__etcd_keys *k, dlock__etcd_conn *c,
                      dlock__etcd_holder *h, size_t n)
{
    dlock__etcd_holders_free(h, n);
    if (c != NULL)
        dlock__etcd_conn_put(be->http, c);
    dlock__etcd_keys_free(k);
}

int dlock__etcd_status(void *arg, const char *name, dlock_lock_info *out)
{
    dlock__etcd_be *be = arg;
    dlock__etcd_conn *c;
    dlock__etcd_holder *h;
    dlock__etcd_keys k;
    size_t n;
    int rc = read_holders(be, name, 1, &k, &c, &h, &n);

    if (rc == DLOCK_OK)
        info_of(h, n, out);
    read_done(be, &k, c, h, n);
    return rc;
}

int dlock__etcd_holders(void *arg, const char *name, dlock_list_cb cb, void *payload)
{
    dlock__etcd_be *be = arg;
    dlock__etcd_conn *c;
    dlock__etcd_holder *h;
    dlock__etcd_keys k;
    dlock_lock_info all;
    size_t n;
    int rc = read_holders(be, name, 1, &k, &c, &h, &n);

    if (rc == DLOCK_OK) {
        info_of(h, n, &all);
        for (size_t i = 0; i < n; i++) {
            dlock_lock_info one = h[i].info;
            one.holders = all.holders;
            one.kind = all.kind;
            if (cb(name, &one, payload) != 0)
                break;
        }
    }
    read_done(be, &k, c, h, n);
    return rc;
}

/* Delete every holder's key (if it is still the same key) and its lease.
 * The waiters, watching those keys, then look again. */
int dlock__etcd_force_release(void *arg, const char *name, dlock_lock_info *removed)
{
    dlock__etcd_be *be = arg;
    dlock__etcd_conn *c;
    dlock__etcd_holder *h;
    dlock__etcd_keys k;
    size_t n;
    int rc = read_holders(be, name, 1, &k, &c, &h, &n);

    if (rc == DLOCK_OK)
        info_of(h, n, removed);
    for (size_t i = 0; rc == DLOCK_OK && i < n; i++) {
        const dlock__etcd_kv *kv = &h[i].kv;
        json_t *reply = NULL;
        rc = dlock__etcd_be_call(
            be, c, "/v3/kv/txn",
            json_pack("{s:[{s:o, s:s, s:s, s:I}], s:[{s:{s:o}}]}", "compare", "key",
                      dlock__etcd_bytes(kv->key, kv->key_len), "target", "CREATE", "result",
                      "EQUAL", "create_revision", (json_int_t)kv->create_revision, "success",
                      "request_delete_range", "key", dlock__etcd_bytes(kv->key, kv->key_len)),
            &reply);
        json_decref(reply);
        if (rc == DLOCK_OK && kv->lease != 0)
            dlock__etcd_lease_revoke(be, c, kv->lease);
    }
    read_done(be, &k, c, h, n);
    return rc;
}

/* ---- listing ------------------------------------------------------------- */

/* The lock name of key "PREFIX" + escaped name + "/" + 16 hex digits
 * (etcd_keys.c) into name; -1 for a key of another shape. */
static int name_of_key(const dlock__etcd_kv *kv, size_t plen, char name[DLOCK_NAME_MAX + 1])
{
    const char *k = kv->key, *slash;
    size_t n = 0;

    if (kv->key_len < plen + 18 || memchr(k, '\0', kv->key_len) != NULL)
        return -1;
    slash = k + kv->key_len - 17;
    if (*slash != '/' || strspn(slash + 1, "0123456789abcdef") != 16)
        return -1;
    for (const char *p = k + plen; p < slash; p++) {
        unsigned v;
        if (n == DLOCK_NAME_MAX || *p == '/')
            return -1;
        if (*p == '%') {
            if (slash - p < 3 || sscanf(p + 1, "%2x", &v) != 1)
                return -1;
            name[n++] = (char)v;
            p += 2;
        } else {
            name[n++] = *p;
        }
    }
    name[n] = '\0';
    return n > 0 && strlen(name) == n ? 0 : -1;
}

/* Tell cb about name as status reads it (all its holders), if held. */
static int list_one(dlock__etcd_be *be, const char *name, dlock_list_cb cb, void *payload,
                    int *stop)
{
    dlock_lock_info info;
    int rc = dlock__etcd_status(be, name, &info);

    if (rc == DLOCK_OK && info.held)
        *stop = cb(name, &info, payload) != 0;
    return rc;
}

/*
 * One keys-only range read of every key under the prefix, in key order, so
 * that each lock's keys come together; then each lock's status (its
 * holders and their leases left), a read and a round trip per holder each.
 */
int dlock__etcd_list(void *arg, const char *name_prefix, dlock_list_cb cb, void *payload)
{
    dlock__etcd_be *be = arg;
    char *dir = dlock__etcd_dir(be->prefix, name_prefix), *end = NULL;
    char name[DLOCK_NAME_MAX + 1], seen[DLOCK_NAME_MAX + 1] = "";
    dlock__etcd_conn *c = NULL;
    json_t *reply = NULL;
    size_t plen = strlen(be->prefix);
    int rc, stop = 0;

    if (dir != NULL) {
        dir[strlen(dir) - 1] = '\0'; /* the directory's '/' */
        end = dlock__etcd_prefix_end(dir);
    }
    if (end == NULL) {
        free(dir);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    if ((rc = dlock__etcd_conn_get(be->http, &c)) != DLOCK_OK)
        goto out;
    rc = dlock__etcd_be_call(be, c, "/v3/kv/range",
                             json_pack("{s:o, s:o, s:b}", "key", dlock__etcd_str(dir), "range_end",
                                       dlock__etcd_str(end), "keys_only", 1),
                             &reply);
    dlock__etcd_conn_put(be->http, c);
    c = NULL;
    for (size_t i = 0; rc == DLOCK_OK && !stop; i++) {
        dlock__etcd_kv kv;
        int found = dlock__etcd_kv_at(reply, i, &kv);

        if (found < 0)
            rc = dlock__etcd_bad_reply(be, "range");
        if (found <= 0)
            break;
        if (name_of_key(&kv, plen, name) == 0 && strcmp(name, seen) != 0) {
            snprintf(seen, sizeof(seen), "%s", name);
            rc = list_one(be, name, cb, payload, &stop);
        }
        free(kv.key);
    }
out:
    json_decref(reply);
    if (c != NULL)
        dlock__etcd_conn_put(be->http, c);
    free(dir);
    free(end);
    return rc;
}
