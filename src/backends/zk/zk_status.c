/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The operator view of the ZooKeeper backend: status, holders, force
 * release and list, read from the lock directories' children whatever the
 * kind (mutex, fair, read-write, semaphore, election).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zk_int.h"

/*
 * Who holds a name, in whichever of the layouts it has (zk_family.c; the
 * kind is read from the children's names, as a Curator process would):
 *   mutex, fair  "_c_<uuid>-lock-<S>": the lowest sequence S holds, with
 *                the owner's re-entries at S (zk_lock.c, reenter)
 *   read-write   "..-__WRIT__<S>" / "..-__READ__<S>": the first if a
 *                writer, else every reader before the first writer
 *   semaphore    NAME/leases "..-lease-<S>": every lease node, but the one
 *                of the acquirer that holds NAME/locks while it waits for
 *                a permit (its node is over N)
 *   election     "..-latch-<S>": the first (its data is the identity, not
 *                a holder record)
 * Each holder's fence is its node's czxid (or its "fence=", for a re-entry
 * or a downgraded read), its record and lease from its data.
 */
typedef struct {
    char *path;
    dlock_lock_info info;
} zk_holder;

typedef struct {
    int kind; /* DLOCK_KIND_*, -1 when free */
    int n;
    zk_holder *h;
} zk_holders;

#define RW_READ "__READ__"
#define RW_WRITE "__WRIT__"

static void holders_free(zk_holders *hs)
{
    for (int i = 0; i < hs->n; i++)
        free(hs->h[i].path);
    free(hs->h);
    hs->h = NULL;
    hs->n = 0;
    hs->kind = -1;
}

static int holders_add(zk_holders *hs, const char *dir, const char *child)
{
    zk_holder *h = realloc(hs->h, (size_t)(hs->n + 1) * sizeof(*h));

    if (h == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    hs->h = h;
    memset(&h[hs->n], 0, sizeof(h[0]));
    if ((h[hs->n].path = dlock__zk_join(dir, child)) == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    hs->n++;
    return DLOCK_OK;
}

/* The children of path, sorted by what follows sort_name; none when it is
 * missing. */
static int sorted_kids(dlock__zk_sess *s, const char *path, const char *sort_name,
                       struct String_vector *kids)
{
    int rc = dlock__zk_children(s, path, kids);

    if (rc == ZNONODE) {
        kids->count = 0;
        kids->data = NULL;
        return DLOCK_OK;
    }
    if (rc != ZOK)
        return dlock__zk_fail(s, rc, "list", path);
    dlock__zk_sort_children(kids, sort_name);
    return DLOCK_OK;
}

static int any_kid(const struct String_vector *kids, const char *part, int whole)
{
    for (int i = 0; i < kids->count; i++)
        if (whole ? strcmp(kids->data[i], part) == 0 : strstr(kids->data[i], part) != NULL)
            return 1;
    return 0;
}

/* A semaphore's permit holders: the lease nodes of dir/leases, less the
 * waiting acquirer's (the head of dir/locks) when they are over N. */
static int sem_holders(dlock__zk_sess *s, const char *dir, zk_holders *hs)
{
    struct String_vector leases = {0, NULL}, locks = {0, NULL};
    char *lpath = dlock__zk_join(dir, "leases"), *kpath = dlock__zk_join(dir, "locks");
    char *data = NULL;
    int len = 0, rc, skip = -1;
    long permits = -1;
    struct Stat st;

    if (lpath == NULL || kpath == NULL) {
        rc = dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = sorted_kids(s, lpath, "lease-", &leases)) != DLOCK_OK)
        goto out;
    rc = dlock__zk_get(s, lpath, &data, &len, &st);
    if (rc == ZOK && len == 4)
        permits = (long)((unsigned char)data[0] << 24 | (unsigned char)data[1] << 16 |
                         (unsigned char)data[2] << 8 | (unsigned char)data[3]);
    rc = DLOCK_OK;
    if (permits >= 0 && leases.count > permits) {
        if ((rc = sorted_kids(s, kpath, DLOCK__ZK_LOCK_NAME, &locks)) != DLOCK_OK)
            goto out;
        if (locks.count > 0 && strncmp(locks.data[0], DLOCK__ZK_PROTECT,
                                       strlen(DLOCK__ZK_PROTECT)) == 0 &&
            strlen(locks.data[0]) > strlen(DLOCK__ZK_PROTECT) + DLOCK__ZK_UUID_LEN) {
            char uuid[DLOCK__ZK_UUID_LEN + 1];
            memcpy(uuid, locks.data[0] + strlen(DLOCK__ZK_PROTECT), DLOCK__ZK_UUID_LEN);
            uuid[DLOCK__ZK_UUID_LEN] = '\0';
            skip = dlock__zk_find_protected(&leases, uuid);
        }
    }
    for (int i = 0; i < leases.count && rc == DLOCK_OK; i++)
        if (i != skip)
            rc = holders_add(hs, lpath, leases.data[i]);
    hs->kind = DLOCK_KIND_SEMAPHORE;
out:
    deallocate_String_vector(&leases);
    deallocate_String_vector(&locks);
    free(data);
    free(lpath);
    free(kpath);
    return rc;
}

/* The holders' nodes of dir, by layout (no data read yet). */
static int holder_nodes(dlock__zk_sess *s, const char *dir, zk_holders *hs)
{
    struct String_vector kids = {0, NULL};
    int rc = sorted_kids(s, dir, DLOCK__ZK_LOCK_NAME, &kids);

    if (rc != DLOCK_OK || kids.count == 0) {
        deallocate_String_vector(&kids);
        return rc;
    }
    if (any_kid(&kids, "leases", 1)) {
        rc = sem_holders(s, dir, hs);
    } else if (any_kid(&kids, RW_READ, 0) || any_kid(&kids, RW_WRITE, 0)) {
        /* Curator sorts by what follows the last "__READ__" / "__WRIT__". */
        dlock__zk_sort_children(&kids, "__");
        hs->kind = strstr(kids.data[0], RW_WRITE) != NULL ? DLOCK_KIND_WRITE : DLOCK_KIND_READ;
        for (int i = 0; i < kids.count && rc == DLOCK_OK; i++) {
            if (hs->kind == DLOCK_KIND_WRITE ? i > 0 : strstr(kids.data[i], RW_WRITE) != NULL)
                break;
            if (strstr(kids.data[i], RW_READ) != NULL || hs->kind == DLOCK_KIND_WRITE)
                rc = holders_add(hs, dir, kids.data[i]);
        }
    } else if (any_kid(&kids, "-latch-", 0)) {
        dlock__zk_sort_children(&kids, "latch-");
        hs->kind = DLOCK_KIND_LEADER;
        rc = holders_add(hs, dir, kids.data[0]);
    } else {
        const char *seq = dlock__zk_mutex_seq(kids.data[0]);
        hs->kind = DLOCK_KIND_MUTEX; /* FAIR: read from the data below */
        rc = holders_add(hs, dir, kids.data[0]);
        for (int i = 1; seq != NULL && i < kids.count && rc == DLOCK_OK; i++) {
            const char *q = dlock__zk_mutex_seq(kids.data[i]);
            if (q == NULL || strcmp(q, seq) != 0)
                break;
            rc = holders_add(hs, dir, kids.data[i]); /* the owner's re-entries */
        }
    }
    deallocate_String_vector(&kids);
    return rc;
}

/* Every holder of name with its record, in one consistent look (a node
 * gone between the listing and its read: look again). */
static int read_holders(dlock__zk_be *be, dlock__zk_sess *s, const char *name, zk_holders *hs)
{
    char *dir = dlock__zk_dir(be, name);
    int rc = DLOCK_OK;

    hs->kind = -1;
    hs->n = 0;
    hs->h = NULL;
    if (dir == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    for (int attempt = 0; attempt < 5; attempt++) {
        int gone = 0;

        holders_free(hs);
        if ((rc = holder_nodes(s, dir, hs)) != DLOCK_OK)
            break;
        for (int i = 0; i < hs->n && rc == DLOCK_OK && !gone; i++) {
            zk_holder *h = &hs->h[i];
            struct Stat st;
            char *data = NULL;
            int len = 0, zrc = dlock__zk_get(s, h->path, &data, &len, &st);

            if (zrc == ZNONODE) {
                gone = 1;
                break;
            }
            if (zrc != ZOK) {
                rc = dlock__zk_fail(s, zrc, "get", h->path);
                break;
            }
            h->info.held = 1;
            h->info.fence = (uint64_t)st.czxid;
            h->info.kind = -1;
            if (hs->kind == DLOCK_KIND_LEADER)
                h->info.ttl_ms = -1; /* the data is the identity */
            else
                dlock__zk_parse_data(data, len, &h->info);
            free(data);
            if (h->info.kind == DLOCK_KIND_FAIR && hs->kind == DLOCK_KIND_MUTEX)
                hs->kind = DLOCK_KIND_FAIR;
            /* Our own hold: the lease left, as the reaper counts it. */
            pthread_mutex_lock(&be->mu);
            for (dlock__zk_hold *o = be->holds; o != NULL; o = o->next)
                if (o->node != NULL && strcmp(o->node, h->path) == 0) {
                    int64_t left = o->expires_ms - dlock__zk_now_ms();
                    h->info.ttl_ms = left > 0 ? left : 1;
                }
            pthread_mutex_unlock(&be->mu);
        }
        if (rc != DLOCK_OK || !gone) {
            free(dir);
            if (rc != DLOCK_OK)
                holders_free(hs);
            return rc;
        }
    }
    free(dir);
    if (rc == DLOCK_OK)
        rc = dlock_backend_fail(DLOCK_ESERVER, "zk %s: '%s': the holders changed five times "
                                "while reading them", be->shown, name);
    holders_free(hs);
    return rc;
}

/* One holder's state as dlock_status_holders gives it. */
static void holder_info(const zk_holders *hs, int i, dlock_lock_info *out)
{
    *out = hs->h[i].info;
    out->held = 1;
    out->holders = hs->n;
    out->kind = hs->kind;
}

/* The name's state: the oldest holder's (the lowest fence), and how many. */
static void holders_status(const zk_holders *hs, dlock_lock_info *out)
{
    int oldest = 0;

    memset(out, 0, sizeof(*out));
    out->kind = -1;
    if (hs->n == 0)
        return;
    for (int i = 1; i < hs->n; i++)
        if (hs->h[i].info.fence < hs->h[oldest].info.fence)
            oldest = i;
    holder_info(hs, oldest, out);
}

int dlock__zk_status(void *arg, const char *name, dlock_lock_info *out)
{
    dlock__zk_be *be = arg;
    zk_holders hs;
    int rc;

    if ((rc = dlock__zk_sess_ready(&be->sess[0], NULL)) != DLOCK_OK)
        return rc;
    if ((rc = read_holders(be, &be->sess[0], name, &hs)) != DLOCK_OK)
        return rc;
    holders_status(&hs, out);
    holders_free(&hs);
    return DLOCK_OK;
}

int dlock__zk_holders_list(void *arg, const char *name, dlock_list_cb cb, void *payload)
{
    dlock__zk_be *be = arg;
    zk_holders hs;
    int rc;

    if ((rc = dlock__zk_sess_ready(&be->sess[0], NULL)) != DLOCK_OK)
        return rc;
    if ((rc = read_holders(be, &be->sess[0], name, &hs)) != DLOCK_OK)
        return rc;
    for (int i = 0; i < hs.n; i++) {
        dlock_lock_info info;
        holder_info(&hs, i, &info);
        if (cb(name, &info, payload))
            break;
    }
    holders_free(&hs);
    return DLOCK_OK;
}

/* Delete every holder's node (readers, permits, an owner's re-entries):
 * the waiters watching them go on. */
int dlock__zk_force_release(void *arg, const char *name, dlock_lock_info *removed)
{
    dlock__zk_be *be = arg;
    dlock__zk_sess *s = &be->sess[0];
    zk_holders hs;
    int rc, deleted = 0;

    if ((rc = dlock__zk_sess_ready(s, NULL)) != DLOCK_OK)
        return rc;
    if ((rc = read_holders(be, s, name, &hs)) != DLOCK_OK)
        return rc;
    holders_status(&hs, removed);
    for (int i = 0; i < hs.n && rc == DLOCK_OK; i++) {
        int zrc = dlock__zk_delete(s, hs.h[i].path, -1);
        if (zrc == ZOK)
            deleted++;
        else if (zrc != ZNONODE)
            rc = dlock__zk_fail(s, zrc, "delete", hs.h[i].path);
    }
    if (rc == DLOCK_OK && deleted == 0) {
        memset(removed, 0, sizeof(*removed)); /* its holders released it meanwhile */
        removed->kind = -1;
    }
    holders_free(&hs);
    return rc;
}

int dlock__zk_list(void *arg, const char *name_prefix, dlock_list_cb cb, void *payload)
{
    dlock__zk_be *be = arg;
    dlock__zk_sess *s = &be->sess[0];
    struct String_vector kids = {0, NULL};
    const char *slash = strrchr(be->prefix, '/');
    const char *part = slash + 1; /* the prefix's last component: a name prefix */
    size_t plen = strlen(part), nlen = strlen(name_prefix);
    char *parent;
    int rc, zrc;

    if ((rc = dlock__zk_sess_ready(s, NULL)) != DLOCK_OK)
        return rc;
    if ((parent = strndup(be->prefix, slash == be->prefix ? 1 : (size_t)(slash - be->prefix))) ==
        NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    zrc = dlock__zk_children(s, parent, &kids);
    if (zrc == ZNONODE) {
        free(parent);
        return DLOCK_OK;
    }
    if (zrc != ZOK) {
        rc = dlock__zk_fail(s, zrc, "list", parent);
        free(parent);
        return rc;
    }
    for (int i = 0; i < kids.count && rc == DLOCK_OK; i++) {
        dlock_lock_info info;
        char *name;

        if (strncmp(kids.data[i], part, plen) != 0 ||
            (name = dlock__zk_unescape(kids.data[i] + plen)) == NULL)
            continue;
        if (strncmp(name, name_prefix, nlen) == 0 && name[0] != '\0' &&
            (rc = dlock__zk_status(be, name, &info)) == DLOCK_OK && info.held &&
            cb(name, &info, payload))
            i = kids.count;
        free(name);
    }
    deallocate_String_vector(&kids);
    free(parent);
    return rc;
}
